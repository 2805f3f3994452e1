#!/usr/bin/env bash
# Training on a Slurm cluster, one task per GPU (or per CPU process).
#   bash tools/slurm_train.sh PARTITION JOB_NAME CONFIG WORK_DIR [options]
# GPUS (default 8), GPUS_PER_NODE (default 8), CPUS_PER_TASK (default 5),
# SRUN_ARGS and PORT (MASTER_PORT, default 29500) may be set.
set -x
PARTITION=$1
JOB_NAME=$2
CONFIG=$3
WORK_DIR=$4
GPUS=${GPUS:-8}
GPUS_PER_NODE=${GPUS_PER_NODE:-8}
CPUS_PER_TASK=${CPUS_PER_TASK:-5}
SRUN_ARGS=${SRUN_ARGS:-""}
PYTHON=${PYTHON:-python}
PY_ARGS=${@:5}

export MASTER_PORT=${PORT:-29500}
PYTHONPATH="$(dirname "$0")/..":$PYTHONPATH \
srun -p "${PARTITION}" \
    --job-name="${JOB_NAME}" \
    --gres=gpu:"${GPUS_PER_NODE}" \
    --ntasks="${GPUS}" \
    --ntasks-per-node="${GPUS_PER_NODE}" \
    --cpus-per-task="${CPUS_PER_TASK}" \
    --kill-on-bad-exit=1 \
    ${SRUN_ARGS} \
    "$PYTHON" -u "$(dirname "$0")/train.py" "${CONFIG}" \
    --work-dir="${WORK_DIR}" --launcher="slurm" ${PY_ARGS}
