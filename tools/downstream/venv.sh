#!/usr/bin/env bash
# The downstream checks' environment: mmcv 2.1.0 with its CPU ops (the
# wheel of tools/downstream/build_mmcv.sh), mmdet 3.3.0, mmsegmentation
# 1.2.2 and mmstats, beside the pinned torch and mmengine. A venv of its
# own (DOWNSTREAM_VENV, default .venv-downstream): mmcv and mmcv-lite (the
# main .venv's) both install the `mmcv` module.
#
# Installs once; a second run finds the stamp and returns at once (a new
# wheel or an edit of this script or of requirements/*.txt installs again).
#
#   bash tools/downstream/venv.sh          # prints the venv's python
set -euo pipefail
cd "$(dirname "$0")/../.."
VENV=${DOWNSTREAM_VENV:-.venv-downstream}
PY=$VENV/bin/python
wheel=$(bash tools/downstream/build_mmcv.sh)
stamp=$VENV/.installed-$(cat "$0" requirements/*.txt <(echo "$wheel") |
    md5sum | cut -c1-12)
if [ -f "$stamp" ]; then
    echo "$PY"
    exit 0
fi

start=$(date +%s)
test -x "$PY" || python3 -m venv "$VENV"
PIP="$PY -m pip install --quiet --no-compile -c requirements/constraints.txt"
# torch first: mmcv's wheel was built against the pinned one. mmcv's wheel
# brings mmengine's requirements (opencv-python, addict, yapf...); mmdet's
# and mmsegmentation's metadata name only pure-Python packages (pycocotools,
# shapely, scipy, terminaltables, prettytable...), never mmcv; ftfy and
# regex are imported by mmseg's register_all_modules() (its CLIP tokenizer).
$PIP -r requirements/runtime.txt >&2
$PIP "$wheel" mmdet==3.3.0 mmsegmentation==1.2.2 ftfy regex pytest \
    pytest-timeout >&2
$PIP --no-deps --no-build-isolation -e . >&2
# a smoke test of what the checks need: mmcv's compiled ops, both scopes
OMP_NUM_THREADS=1 "$PY" - >&2 <<'EOF'
import mmcv.ops  # noqa: F401  (mmcv._ext: the compiled ops)
import mmdet.utils
import mmseg.utils
mmdet.utils.register_all_modules(init_default_scope=False)
mmseg.utils.register_all_modules(init_default_scope=False)
EOF
rm -f "$VENV"/.installed-*
touch "$stamp"
echo "installed $VENV in $(( $(date +%s) - start )) s" >&2
echo "$PY"
