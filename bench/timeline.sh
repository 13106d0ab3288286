#!/usr/bin/env bash
# bench/timeline.sh: where each millisecond of a streamed decode step goes, on the GPU machine: the Llama-3-8B shape
# (random weights, tools/make_random_llama.py) in f16 and q4, each at its minimum ring with the CPU share automatic,
# traced by djinn --trace and drawn by bench/timeline.py.
#
#   bench/timeline.sh OUT_DIR
#
# 1. build; build/bin/ceilings with LINK_ONLY=1: pinned H2D and D2H, host memory read alone and while H2D copies
#    run, and the two together -> OUT_DIR/ceilings.json
# 2. the checkpoint ($BENCH_WORK/hf_8b, bench/lib.sh's make_hf) converted to f16 and q4 ($BENCH_WORK/spec_8b_<dt>.bin,
#    the files bench/spec_bench.sh uses)
# 3. per dtype: the minimum ring (djinn's 'needs at least X GB'), then djinn -n $N_NEW (16) greedy at it with
#    --trace OUT_DIR/<dt>.json --trace-steps $STEPS (4; its stderr in $BENCH_WORK/timeline_<dt>.log), drawn into
#    OUT_DIR/<dt>.png
# 4. djinn's CPU share and trace lines, and every step's figures against the ceilings -> OUT_DIR/summary.md (printed)
# OUT_DIR ends with six files: ceilings.json, f16.json, f16.png, q4.json, q4.png, summary.md.
# Models live in $BENCH_WORK (default /tmp/djinn_qbench, shared with the other benchmarks); SKIP_MAKE=1 uses them as
# they are. matplotlib draws the pictures; without it the figures are still printed.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
OUT_DIR=${1:?out dir}
WORK=${BENCH_WORK:-/tmp/djinn_qbench}
DATA=${DATA:-.shared}
N_NEW=${N_NEW:-16}
STEPS=${STEPS:-4}
PROMPT=${PROMPT:-"The history of the city begins in the year"}
mkdir -p "$OUT_DIR" "$WORK" || exit 1
. bench/lib.sh

build_and_link "$WORK" "$OUT_DIR/ceilings.json" || exit 1

HF=$WORK/hf_8b
make_hf 8b "$HF" "$WORK/make.log" || exit 1
rc=0
: > "$OUT_DIR/summary.md"
for dt in f16 q4; do
    bin=$WORK/spec_8b_$dt.bin
    convert_once "$HF" "$bin" $dt || exit 1
    min=$(min_ring "$bin")
    say "$dt: minimum ring ${min:?could not read the minimum ring} GB, traced"
    log=$WORK/timeline_$dt.log
    if ! timeout 300 ./djinn "$bin" -p "$PROMPT" -n "$N_NEW" -t 0 -c 1024 --ring-gb "$min" \
            --trace "$OUT_DIR/$dt.json" --trace-steps "$STEPS" > /dev/null 2> "$log"; then
        echo "  $dt FAILED:"; tail -3 "$log"; rc=1; continue
    fi
    png=$OUT_DIR/$dt.png
    python3 -c "import matplotlib" 2> /dev/null || png=
    { echo "## Llama-3-8B shape, $dt, --ring-gb $min (the minimum), CPU share automatic"; echo
      grep -E '^(gpu: weight budget|gpu: CPU share|trace:)' "$log" | sed 's/^/    /'; echo; } >> "$OUT_DIR/summary.md"
    python3 bench/timeline.py "$OUT_DIR/$dt.json" $png --ceilings "$OUT_DIR/ceilings.json" \
        --title "djinn decode step, Llama-3-8B shape (random weights), $dt at the minimum ring ($min GB)" |
        sed 's/^/    /' >> "$OUT_DIR/summary.md" || rc=1
    echo >> "$OUT_DIR/summary.md"
done
[ -n "$(python3 -c 'import matplotlib' 2>&1)" ] && echo "timeline: no matplotlib here: no pictures (the figures are in summary.md)"
cat "$OUT_DIR/summary.md"
exit $rc
