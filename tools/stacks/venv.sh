#!/usr/bin/env bash
# One stack of the version matrix as a cached virtual environment: the
# stack's constraints (requirements/stacks/NAME.txt) over the pinned ones
# (requirements/constraints.txt), then everything `make test` installs.
# `pinned` is the pinned stack itself. The venvs live outside the checkout
# (MMSTATS_STACKS, default ~/.cache/mmstats/stacks/NAME) so that every
# clone shares them; mmstats and the demo are installed editable from the
# calling checkout at each call (a second or two).
#
# A stack file is a pip constraints file with two optional directives:
#   # engine: onedl-mmengine==0.10.12   the engine instead of mminstall.txt
#   # without: deepspeed                 requirements left out
#
#   bash tools/stacks/venv.sh torch2.1     # prints the venv's python
set -euo pipefail
cd "$(dirname "$0")/../.."
NAME=${1:?usage: tools/stacks/venv.sh NAME (requirements/stacks/NAME.txt or pinned)}
ROOT=${MMSTATS_STACKS:-$HOME/.cache/mmstats/stacks}
VENV=$ROOT/$NAME
PY=$VENV/bin/python
STACK=requirements/stacks/$NAME.txt
[ "$NAME" = pinned ] && STACK=/dev/null
[ -f "$STACK" ] || { echo "no stack $STACK" >&2; exit 2; }
stamp=$VENV/.installed-$(cat "$0" requirements/*.txt "$STACK" | md5sum |
    cut -c1-12)
if [ ! -f "$stamp" ]; then
    start=$(date +%s)
    rm -rf "$VENV"
    mkdir -p "$ROOT"
    python3 -m venv "$VENV"
    directive() { sed -n "s/^# $1: *//p" "$STACK"; }
    engine=$(directive engine)
    without=$(directive without)
    # the stack's pins replace the pinned ones of the same packages
    name_of() { sed -E 's/[ ;<>=!~\[].*//' | tr 'A-Z_' 'a-z-'; }
    overridden=$( (grep -v '^\s*#' "$STACK" | grep . | name_of || true
        if [ -n "$engine" ]; then echo mmengine; fi) | sort -u)
    while IFS= read -r line; do
        name=$(echo "$line" | name_of)
        if [ -n "$name" ] && [[ ! "$line" =~ ^# ]] &&
            grep -qx -- "$name" <<<"$overridden"; then continue; fi
        echo "$line"
    done <requirements/constraints.txt >"$VENV/constraints.txt"
    grep -v '^\s*#' "$STACK" | grep . >>"$VENV/constraints.txt" || true
    # every requirement `make install` installs, flat; mmcv-lite without
    # its dependencies (it requires the distribution `mmengine`, which the
    # fork's engine is not; the engine brings what mmcv-lite imports)
    grep -hv '^\s*#\|^-r\|^\s*$' requirements/runtime.txt \
        requirements/torch.txt requirements/demo.txt requirements/lint.txt \
        requirements/docs.txt requirements/tests.txt \
        requirements/deepspeed.txt | grep -v '^mmcv-lite' |
        { if [ -n "$without" ]; then grep -vE "^($without)\b"; else cat; fi; } \
        >"$VENV/requirements.txt"
    if [ -n "$engine" ]; then echo "$engine"; else
        grep -hv '^\s*#\|^\s*$' requirements/mminstall.txt; fi \
        >>"$VENV/requirements.txt"
    PIP="$PY -m pip install --quiet --no-compile -c $VENV/constraints.txt"
    $PIP -r "$VENV/requirements.txt" >&2
    $PIP --no-deps mmcv-lite >&2
    $PIP $("$PY" -c "from importlib.metadata import requires
print(' '.join(r.replace(' ', '') for r in requires('mmcv-lite')
               if ';' not in r and not r.startswith('mmengine')))") >&2
    "$PY" -m compileall -qq -j 0 "$("$PY" -c \
        'import sysconfig; print(sysconfig.get_path("purelib"))')" || true
    touch "$stamp"
    echo "installed $VENV in $(( $(date +%s) - start )) s" >&2
fi
"$PY" -m pip install --quiet --no-compile --no-deps --no-build-isolation \
    -e . -e projects/digits_demo >&2
echo "$PY"
