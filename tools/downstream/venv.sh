#!/usr/bin/env bash
# The downstream checks' environment, by stack (DOWNSTREAM_STACK):
#   upstream (default): mmcv 2.1.0 with its CPU ops (the wheel of
#     tools/downstream/build_mmcv.sh), mmdet 3.3.0, mmsegmentation 1.2.2,
#     upstream mmengine 0.10.7, in .venv-downstream;
#   onedl: the maintained fork, onedl-mmcv 2.3.6 (its sdist built by the
#     same script), onedl-mmengine 0.10.12, onedl-mmdetection 3.5.1,
#     onedl-mmsegmentation 1.4.2, onedl-mmpretrain 1.3.6, in
#     .venv-downstream-onedl.
# Both with the pinned torch and mmstats (editable). A venv of its own
# (DOWNSTREAM_VENV overrides): mmcv and mmcv-lite (the main .venv's) both
# install the `mmcv` module.
#
# Installs once; a second run finds the stamp and returns at once (a new
# wheel or an edit of this script or of requirements/*.txt installs again).
#
#   DOWNSTREAM_STACK=onedl bash tools/downstream/venv.sh   # prints the python
set -euo pipefail
cd "$(dirname "$0")/../.."
STACK=${DOWNSTREAM_STACK:-upstream}
case $STACK in
upstream)
    VENV=${DOWNSTREAM_VENV:-.venv-downstream}
    MMCV=mmcv==2.1.0
    PACKAGES="mmengine mmdet==3.3.0 mmsegmentation==1.2.2"
    ;;
onedl)
    VENV=${DOWNSTREAM_VENV:-.venv-downstream-onedl}
    MMCV=onedl-mmcv==2.3.6
    # their engine and mmcv are an extra (mminstall) of theirs: named here;
    # onedl-mmpretrain imports torchvision without requiring it (0.29.1:
    # the one made for the pinned torch 2.14)
    PACKAGES="onedl-mmengine==0.10.12 onedl-mmdetection==3.5.1
        onedl-mmsegmentation==1.4.2 onedl-mmpretrain==1.3.6
        torchvision==0.29.1"
    ;;
*)
    echo "DOWNSTREAM_STACK must be upstream or onedl, not $STACK" >&2
    exit 2
    ;;
esac
PY=$VENV/bin/python
wheel=$(bash tools/downstream/build_mmcv.sh "$MMCV")
stamp=$VENV/.installed-$(cat "$0" requirements/*.txt <(echo "$wheel") |
    md5sum | cut -c1-12)
if [ -f "$stamp" ]; then
    echo "$PY"
    exit 0
fi

start=$(date +%s)
test -x "$PY" || python3 -m venv "$VENV"
PIP="$PY -m pip install --quiet --no-compile -c requirements/constraints.txt"
# torch first (pinned: the mmcv wheel was built against it); mmcv without
# its dependencies: its metadata names the distribution `mmengine`, which
# would put upstream's files over the fork's engine; the engine brings what
# mmcv imports (opencv-python, addict, yapf...). The packages' metadata
# name only pure-Python packages (pycocotools, shapely, scipy,
# terminaltables, prettytable; the fork's imaug, modelindex,
# importlib-metadata), never mmcv; ftfy and regex are imported by mmseg's
# register_all_modules() (its CLIP tokenizer).
$PIP -r requirements/runtime.txt -r requirements/torch.txt >&2
# shellcheck disable=SC2086  # PACKAGES: a list of requirements
$PIP $PACKAGES ftfy regex pytest pytest-timeout >&2
$PIP --no-deps "$wheel" >&2
$PIP --no-deps --no-build-isolation -e . >&2
# a smoke test of what the checks need: mmcv's compiled ops, both scopes
OMP_NUM_THREADS=1 "$PY" - >&2 <<'EOF'
import importlib.util
import mmcv.ops  # noqa: F401  (mmcv._ext: the compiled ops)
import mmdet.utils
import mmseg.utils
mmdet.utils.register_all_modules(init_default_scope=False)
mmseg.utils.register_all_modules(init_default_scope=False)
if importlib.util.find_spec('mmpretrain'):
    import mmpretrain.utils
    mmpretrain.utils.register_all_modules(init_default_scope=False)
EOF
rm -f "$VENV"/.installed-*
touch "$stamp"
echo "installed $VENV in $(( $(date +%s) - start )) s" >&2
echo "$PY"
