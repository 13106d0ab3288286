#!/bin/sh
# tests/failures.sh LOG: after a failed run, the failed and crashed tests of a Criterion log again, with their
# messages and the seeds that replay them, so that the end of a long log (all a CI summary may keep) says what failed.
log=$1
[ -r "$log" ] || { echo "failures.sh: cannot read '$log'" >&2; exit 2; }
echo "---- the run's failures (DJINN_SEED=N replays a test's random inputs):"
grep -E '^\[(----|FAIL|CRASH)\]|^\[ERR \]|^\[WARN\].*(timed out|crash)' "$log" | grep -v -E '^\[----\] *$|Criterion v'
for t in $(sed -n 's/^\[\(FAIL\|CRASH\)\] \([A-Za-z0-9_]*\)::\([A-Za-z0-9_]*\).*/\2.\3/p' "$log"); do
    grep -F "[$t] seed" "$log"
done
