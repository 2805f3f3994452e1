#!/usr/bin/env bash
# Build mmcv 2.1.0 with its CPU ops into a wheel, once, against the pinned
# torch. mmdet 3.3.0 and mmsegmentation 1.2.2 need mmcv's compiled ops
# (mmcv-lite has none) and refuse mmcv >= 2.2.0.
#
# The wheel is kept outside the repository (MMCV_WHEEL_DIR, default
# ~/.cache/mmstats/wheels); a second run finds it and returns at once.
# MAX_JOBS defaults to the machine's cores. Measured on the shared 2-core
# machine under other load: 2296 s (38 min) with MAX_JOBS=1, ~27 min of
# CPU in all (77 C++ sources); the wheel is 32 MB.
#
#   bash tools/downstream/build_mmcv.sh          # prints the wheel's path
set -euo pipefail
cd "$(dirname "$0")/../.."
WHEEL_DIR=${MMCV_WHEEL_DIR:-$HOME/.cache/mmstats/wheels}
BUILD_VENV=$WHEEL_DIR/build-venv
CONSTRAINTS=$PWD/requirements/constraints.txt
mkdir -p "$WHEEL_DIR"

wheel=$(ls "$WHEEL_DIR"/mmcv-2.1.0-*.whl 2>/dev/null | head -n 1 || true)
if [ -n "$wheel" ]; then
    echo "$wheel"
    exit 0
fi

# mmcv's setup.py imports torch: build without isolation, in a venv that
# holds the pinned torch.
test -x "$BUILD_VENV/bin/python" || python3 -m venv "$BUILD_VENV"
"$BUILD_VENV/bin/python" -m pip install --quiet -c "$CONSTRAINTS" \
    torch numpy 'setuptools<81' wheel ninja packaging
export MMCV_WITH_OPS=1 FORCE_CUDA=0
export MAX_JOBS=${MAX_JOBS:-$(nproc)}
start=$(date +%s)
"$BUILD_VENV/bin/python" -m pip wheel --no-build-isolation --no-deps \
    mmcv==2.1.0 -w "$WHEEL_DIR" >&2
took=$(( $(date +%s) - start ))
wheel=$(ls "$WHEEL_DIR"/mmcv-2.1.0-*.whl | head -n 1)
echo "built mmcv 2.1.0 with CPU ops in ${took} s (MAX_JOBS=$MAX_JOBS): $wheel" >&2
echo "$wheel"
