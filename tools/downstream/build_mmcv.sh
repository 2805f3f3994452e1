#!/usr/bin/env bash
# Build an mmcv with its CPU ops into a wheel, once, against the pinned
# torch: upstream mmcv 2.1.0 (the default; mmdet 3.3.0 and mmsegmentation
# 1.2.2 need its compiled ops, mmcv-lite has none, and they refuse
# mmcv >= 2.2.0) or the maintained fork's onedl-mmcv 2.3.6 (an sdist only).
#
# The wheel is kept outside the repository, by torch version (its ops link
# against that torch): MMCV_WHEEL_DIR, default ~/.cache/mmstats/wheels/
# torch<version>; a second run finds it and returns at once. MAX_JOBS
# defaults to the machine's cores. Measured on the shared 2-core machine,
# niced beside other work, MAX_JOBS=1: mmcv 2.1.0 2296 s (38 min, torch
# 2.13.0, 77 C++ sources, a 32 MB wheel); onedl-mmcv 2.3.6: see
# docs/integrations.md.
#
#   bash tools/downstream/build_mmcv.sh                     # mmcv==2.1.0
#   bash tools/downstream/build_mmcv.sh onedl-mmcv==2.3.6   # prints the wheel
set -euo pipefail
cd "$(dirname "$0")/../.."
REQ=${1:-mmcv==2.1.0}
DIST=${REQ%%==*}
VERSION=${REQ##*==}
CONSTRAINTS=$PWD/requirements/constraints.txt
TORCH=$(sed -n 's/^torch==//p' "$CONSTRAINTS")
WHEEL_DIR=${MMCV_WHEEL_DIR:-$HOME/.cache/mmstats/wheels/torch$TORCH}
BUILD_VENV=$WHEEL_DIR/build-venv
mkdir -p "$WHEEL_DIR"
# a wheel's file name spells the distribution with underscores
pattern="$WHEEL_DIR/${DIST//-/_}-$VERSION-*.whl"

wheel=$(ls $pattern 2>/dev/null | head -n 1 || true)
if [ -n "$wheel" ]; then
    echo "$wheel"
    exit 0
fi

# mmcv's setup.py imports torch: build without isolation, in a venv that
# holds the pinned torch (and a setuptools both setup.py files accept:
# mmcv 2.1.0 needs < 81, onedl-mmcv >= 80).
test -x "$BUILD_VENV/bin/python" || python3 -m venv "$BUILD_VENV"
"$BUILD_VENV/bin/python" -m pip install --quiet -c "$CONSTRAINTS" \
    torch numpy 'setuptools>=80,<81' wheel ninja packaging
export MMCV_WITH_OPS=1 FORCE_CUDA=0
export MAX_JOBS=${MAX_JOBS:-$(nproc)}
start=$(date +%s)
# torch >= 2.14's headers need C++20 ("#error C++20 or later compatible
# compiler is required to use ATen"); both setup.py files ask for C++17 for
# any torch > 1.12. Against such a torch the sdist is built with that one
# flag raised to C++20, nothing else changed.
src=$REQ
if "$BUILD_VENV/bin/python" -c "import sys, torch
from packaging.version import parse
sys.exit(parse(torch.__version__).release < (2, 14))"; then
    tmp=$(mktemp -d)
    trap 'rm -rf "$tmp"' EXIT
    "$BUILD_VENV/bin/python" -m pip download --quiet --no-deps \
        --no-binary :all: "$REQ" -d "$tmp" >&2
    tar xzf "$tmp"/*.tar.gz -C "$tmp"
    src=$(ls -d "$tmp"/*/)
    sed -i "s/'-std=c++17'/'-std=c++20'/" "$src/setup.py"
    echo "building $REQ with -std=c++20 (torch $TORCH)" >&2
fi
"$BUILD_VENV/bin/python" -m pip wheel --no-build-isolation --no-deps \
    "$src" -w "$WHEEL_DIR" >&2
took=$(( $(date +%s) - start ))
wheel=$(ls $pattern | head -n 1)
echo "built $REQ with CPU ops against torch $TORCH in ${took} s" \
    "(MAX_JOBS=$MAX_JOBS): $wheel" >&2
echo "$wheel"
