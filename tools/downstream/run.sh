#!/usr/bin/env bash
# `make test-downstream [STACK=onedl]`: OpenMMLab's detection, segmentation
# (and, where installed, classification) packages trained with their own
# configs and tools/train.py, mmstats' four hooks on, 1 and 2 CPU gloo
# processes; every published number recomputed (tools/downstream/checks).
# DOWNSTREAM_STACK picks the packages (tools/downstream/venv.sh): upstream
# (mmdet 3.3.0, mmsegmentation 1.2.2; the default) or onedl (the maintained
# fork: onedl-mmdetection 3.5.1, onedl-mmsegmentation 1.4.2,
# onedl-mmpretrain 1.3.6 on onedl-mmengine 0.10.12). Opt-in, never in CI:
# the first run builds the mmcv's CPU ops (tools/downstream/build_mmcv.sh,
# ~40 min on a busy 2-core machine, once) and the environment (~1.5 min,
# once).
#
#   bash tools/downstream/run.sh [PYTEST ARGS]
#   DOWNSTREAM_STACK=onedl bash tools/downstream/run.sh
#   DOWNSTREAM_CELLS=retinanet-2,pspnet-1 bash tools/downstream/run.sh
#
# The runs (logs, scalars.json, each rank's recording, each cell's warning
# lines in work/<cell>.warnings) stay in DOWNSTREAM_WORK_DIR (default
# work_dirs/downstream/<stack>, replaced at every run).
set -euo pipefail
cd "$(dirname "$0")/../.."
start=$(date +%s)
PY=$(bash tools/downstream/venv.sh)
export DOWNSTREAM_STACK=${DOWNSTREAM_STACK:-upstream}
export DOWNSTREAM_WORK_DIR=${DOWNSTREAM_WORK_DIR:-$PWD/work_dirs/downstream/$DOWNSTREAM_STACK}
rm -rf "$DOWNSTREAM_WORK_DIR/work"
# one torch thread per process: 2 processes share the machine's cores
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
status=0
"$PY" -m pytest -q -p no:cacheprovider -o addopts= tools/downstream/checks \
    "$@" || status=$?
cat "$DOWNSTREAM_WORK_DIR"/work/*.warnings 2>/dev/null || true
echo "make test-downstream ($DOWNSTREAM_STACK): $(( $(date +%s) - start )) s"
exit $status
