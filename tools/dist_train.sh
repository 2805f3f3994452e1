#!/usr/bin/env bash
# Multi-process training with torchrun, on one node or several.
#   bash tools/dist_train.sh CONFIG NPROC [train.py options]
# Several nodes: run it on every node with NNODES, NODE_RANK, MASTER_ADDR set
# (and the same PORT). PYTHON selects the interpreter (default: the repo's
# .venv/bin/python when it exists, as after `make demo`; else python).
# On CPU-only machines train.py uses gloo; with CUDA, NCCL.
# A preempted run (SIGTERM/SIGUSR1: every rank saved a checkpoint) exits 75,
# whatever torchrun's own status (docs/checkpoints.md, "When a run stops").
set -e
CONFIG=$1
NPROC=$2
NNODES=${NNODES:-1}
NODE_RANK=${NODE_RANK:-0}
PORT=${PORT:-29500}
MASTER_ADDR=${MASTER_ADDR:-"127.0.0.1"}
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
if [ -z "${PYTHON:-}" ]; then
    if [ -x "$ROOT/.venv/bin/python" ]; then PYTHON="$ROOT/.venv/bin/python"; else PYTHON=python; fi
fi

# the launch's verdict (a refusal, a preemption: exit 75), written by rank 0
export MMSTATS_EXIT_NOTE="$(mktemp)"
trap 'rm -f "$MMSTATS_EXIT_NOTE"' EXIT
status=0
PYTHONPATH="$ROOT":${PYTHONPATH:-} \
"$PYTHON" -m torch.distributed.run \
    --nnodes="$NNODES" \
    --node_rank="$NODE_RANK" \
    --master_addr="$MASTER_ADDR" \
    --nproc_per_node="$NPROC" \
    --master_port="$PORT" \
    "$(dirname "$0")/train.py" \
    "$CONFIG" \
    --launcher pytorch "${@:3}" || status=$?
if [ -s "$MMSTATS_EXIT_NOTE" ]; then  # said last, after torchrun's summary
    read -r status line <"$MMSTATS_EXIT_NOTE"
    echo "$line" >&2
fi
exit "$status"
