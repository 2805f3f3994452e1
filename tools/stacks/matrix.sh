#!/usr/bin/env bash
# `make test-matrix`: the test suite on every stack of requirements/stacks/
# (and the pinned one), each in its cached venv (tools/stacks/venv.sh), then
# one table: stack x torch / engine / DeepSpeed x passed / skipped / failed
# with every skip's reason (MATRIX_DIR, default work_dirs/matrix:
# table.md, and each stack's pytest output in NAME.log).
#
#   bash tools/stacks/matrix.sh                      # every stack, whole suite
#   STACKS="torch2.1" bash tools/stacks/matrix.sh -m "not dist and not runner and not slow"
#
# Extra arguments go to pytest. Exit status: 1 if any stack failed.
set -uo pipefail
cd "$(dirname "$0")/../.."
STACKS=${STACKS:-"torch2.1 torch2.4 torch2.8 pinned onedl"}
OUT=${MATRIX_DIR:-work_dirs/matrix}
mkdir -p "$OUT"
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
status=0
rows=()
for stack in $STACKS; do
    start=$(date +%s)
    if ! PY=$(bash tools/stacks/venv.sh "$stack"); then
        rows+=("| $stack | venv failed | | | | | | |")
        status=1
        continue
    fi
    "$PY" -m pytest -q -p no:cacheprovider -rfEs -n "${TEST_WORKERS:-2}" \
        --dist loadgroup "$@" tests projects/digits_demo/tests \
        >"$OUT/$stack.log" 2>&1
    code=$?
    [ $code -eq 0 ] || status=1
    versions=$("$PY" - <<'PY'
import importlib.metadata as m
import torch
import mmengine
def v(name):
    try:
        return m.version(name)
    except m.PackageNotFoundError:
        return None
engine = 'onedl-mmengine ' + v('onedl-mmengine') if v('onedl-mmengine') \
    else 'mmengine ' + mmengine.__version__
print(f"{torch.__version__} | {engine} | {v('deepspeed') or '-'}")
PY
)
    # pytest's closing line (a DeepSpeed op build may print after it)
    summary=$(grep -E '[0-9]+ (passed|failed)' "$OUT/$stack.log" | tail -n 1)
    count() {
        local n
        n=$(grep -oE "[0-9]+ $1" <<<"$summary" | cut -d' ' -f1)
        echo "${n:-0}"
    }
    rows+=("| $stack | $versions | $(count passed) | $(count skipped) | \
$(count failed) (errors: $(count error)) | $(( $(date +%s) - start )) s |")
done
{
    echo "| stack | torch | engine | DeepSpeed | passed | skipped | failed | time |"
    echo "| --- | --- | --- | --- | --- | --- | --- | --- |"
    printf '%s\n' "${rows[@]}"
    echo
    for stack in $STACKS; do
        [ -f "$OUT/$stack.log" ] || continue
        # pytest -rs: "SKIPPED [N] path:line: reason"
        reasons=$(grep -E '^SKIPPED \[' "$OUT/$stack.log" |
            sed -E 's/^SKIPPED \[([0-9]+)\] [^ ]+: /\1 /' |
            awk '{n=$1; $1=""; r[substr($0,2)]+=n} END {for (k in r) printf "- %d: %s\n", r[k], k}' |
            sort -t: -k2)
        [ -n "$reasons" ] && printf '%s skips:\n%s\n\n' "$stack" "$reasons"
    done
} >"$OUT/table.md"
cat "$OUT/table.md"
# What failed, where CI's output shows it (each stack's whole log stays
# in $OUT): pytest's short summary lines and the tracebacks' last lines.
for stack in $STACKS; do
    [ -f "$OUT/$stack.log" ] || continue
    if grep -qE '^(FAILED|ERROR) ' "$OUT/$stack.log"; then
        printf '\n%s failures:\n' "$stack"
        sed -n '/^=\+ FAILURES =\+$/,/^=\+ short test summary/p' \
            "$OUT/$stack.log" | grep -E '^(E |_{3,} |[^ ].*:[0-9]+: )' | head -n 80
        grep -E '^(FAILED|ERROR) ' "$OUT/$stack.log"
    fi
done
exit $status
