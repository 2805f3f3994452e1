#!/usr/bin/env bash
# Multi-process evaluation of a checkpoint with torchrun, on one node or several.
#   bash tools/dist_test.sh CONFIG CHECKPOINT NPROC [test.py options]
# Several nodes: run it on every node with NNODES, NODE_RANK, MASTER_ADDR set
# (and the same PORT). PYTHON selects the interpreter (default: the repo's
# .venv/bin/python when it exists, as after `make demo`; else python).
# On CPU-only machines test.py uses gloo; with CUDA, NCCL.
set -e
CONFIG=$1
CHECKPOINT=$2
NPROC=$3
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
    "$(dirname "$0")/test.py" \
    "$CONFIG" "$CHECKPOINT" \
    --launcher pytorch "${@:4}" || status=$?
if [ -s "$MMSTATS_EXIT_NOTE" ]; then  # said last, after torchrun's summary
    read -r status line <"$MMSTATS_EXIT_NOTE"
    echo "$line" >&2
fi
exit "$status"
