#!/usr/bin/env bash
# `make test-downstream`: mmdet 3.3.0 and mmsegmentation 1.2.2 trained with
# their own configs and tools/train.py, mmstats' four hooks on, 1 and 2 CPU
# gloo processes; every published number recomputed (tools/downstream/
# checks). Opt-in, never in CI: the first run builds mmcv 2.1.0's CPU ops
# (tools/downstream/build_mmcv.sh, ~40 min on a busy 2-core machine, once)
# and the environment (tools/downstream/venv.sh, ~1.5 min, once).
#
#   bash tools/downstream/run.sh [PYTEST ARGS]
#   DOWNSTREAM_CELLS=retinanet-2,pspnet-1 bash tools/downstream/run.sh
#
# The runs (logs, scalars.json, each rank's recording, each cell's warning
# lines in work/<cell>.warnings) stay in DOWNSTREAM_WORK_DIR (default
# work_dirs/downstream, replaced at every run).
set -euo pipefail
cd "$(dirname "$0")/../.."
start=$(date +%s)
PY=$(bash tools/downstream/venv.sh)
export DOWNSTREAM_WORK_DIR=${DOWNSTREAM_WORK_DIR:-$PWD/work_dirs/downstream}
rm -rf "$DOWNSTREAM_WORK_DIR/work"
# one torch thread per process: 2 processes share the machine's cores
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
status=0
"$PY" -m pytest -q -p no:cacheprovider -o addopts= tools/downstream/checks \
    "$@" || status=$?
cat "$DOWNSTREAM_WORK_DIR"/work/*.warnings 2>/dev/null || true
echo "make test-downstream: $(( $(date +%s) - start )) s"
exit $status
