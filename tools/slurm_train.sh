#!/usr/bin/env bash
# Training on a Slurm cluster, one task per GPU (or per CPU process).
#   bash tools/slurm_train.sh PARTITION JOB_NAME CONFIG WORK_DIR [options]
# GPUS (tasks in all, default 8), GPUS_PER_NODE (tasks per node, default 8),
# CPUS_PER_TASK (default 5), SRUN_ARGS, PORT (MASTER_PORT, default 29500) and
# PYTHON may be set. --gres=gpu:GPUS_PER_NODE is asked for only when
# GPUS_PER_NODE > 0. On a CPU partition: GPUS_PER_NODE=0 (Slurm places the
# GPUS tasks) or GRES_GPUS=0 with GPUS_PER_NODE=tasks per node; the tasks
# then train with gloo.
set -x
PARTITION=$1
JOB_NAME=$2
CONFIG=$3
WORK_DIR=$4
GPUS=${GPUS:-8}
GPUS_PER_NODE=${GPUS_PER_NODE:-8}
CPUS_PER_TASK=${CPUS_PER_TASK:-5}
SRUN_ARGS=${SRUN_ARGS:-""}
GRES_GPUS=${GRES_GPUS:-$GPUS_PER_NODE}
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
if [ -z "${PYTHON:-}" ]; then
    if [ -x "$ROOT/.venv/bin/python" ]; then PYTHON="$ROOT/.venv/bin/python"; else PYTHON=python; fi
fi
GRES=""
if [ "$GRES_GPUS" -gt 0 ]; then GRES="--gres=gpu:${GRES_GPUS}"; fi
TASKS_PER_NODE=""
if [ "$GPUS_PER_NODE" -gt 0 ]; then TASKS_PER_NODE="--ntasks-per-node=${GPUS_PER_NODE}"; fi
PY_ARGS=${@:5}

export MASTER_PORT=${PORT:-29500}
PYTHONPATH="$ROOT":${PYTHONPATH:-} \
srun -p "${PARTITION}" \
    --job-name="${JOB_NAME}" \
    ${GRES} \
    --ntasks="${GPUS}" \
    ${TASKS_PER_NODE} \
    --cpus-per-task="${CPUS_PER_TASK}" \
    --kill-on-bad-exit=1 \
    ${SRUN_ARGS} \
    "$PYTHON" -u "$(dirname "$0")/train.py" "${CONFIG}" \
    --work-dir="${WORK_DIR}" --launcher="slurm" ${PY_ARGS}
