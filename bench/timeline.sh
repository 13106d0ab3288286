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
#    --trace OUT_DIR/<dt>.json --trace-steps $STEPS (4; its stderr in OUT_DIR/<dt>.log), drawn into OUT_DIR/<dt>.png
# 4. every step's figures against the ceilings -> OUT_DIR/summary.md (printed)
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

say build
make -j16 all build/bin/ceilings > "$WORK/build.log" 2>&1 || { tail -20 "$WORK/build.log"; exit 1; }
say "ceilings (LINK_ONLY=1)"
LINK_ONLY=1 build/bin/ceilings "$OUT_DIR/ceilings.json" || exit 1

HF=$WORK/hf_8b
make_hf 8b "$HF" "$WORK/make.log" || exit 1
rc=0
: > "$OUT_DIR/summary.md"
for dt in f16 q4; do
    bin=$WORK/spec_8b_$dt.bin
    if [ ! -f "$bin" ]; then
        say "convert $dt"
        ./convert/convert "$HF" "$bin" --dtype $dt --tokenizer "$DATA/tokenizers/llama3" -q 2> "$WORK/convert.log" ||
            { tail -3 "$WORK/convert.log"; exit 1; }
    fi
    min=$(./djinn "$bin" -p x -n 1 -t 0 -c 1024 --ring-gb 0.001 2>&1 >/dev/null |
          sed -n 's/.*needs at least \([0-9][0-9.]*\) GB.*/\1/p' | head -1)
    say "$dt: minimum ring ${min:?could not read the minimum ring} GB, traced"
    if ! timeout 300 ./djinn "$bin" -p "$PROMPT" -n "$N_NEW" -t 0 -c 1024 --ring-gb "$min" \
            --trace "$OUT_DIR/$dt.json" --trace-steps "$STEPS" > /dev/null 2> "$OUT_DIR/$dt.log"; then
        echo "  $dt FAILED:"; tail -3 "$OUT_DIR/$dt.log"; rc=1; continue
    fi
    grep -E '^(gpu: CPU share|trace:)' "$OUT_DIR/$dt.log" | sed "s/^/  /"
    png=$OUT_DIR/$dt.png
    python3 -c "import matplotlib" 2> /dev/null || png=
    { echo "## Llama-3-8B shape, $dt, --ring-gb $min (the minimum), CPU share automatic"; echo
      python3 bench/timeline.py "$OUT_DIR/$dt.json" $png --ceilings "$OUT_DIR/ceilings.json" \
          --title "djinn decode step, Llama-3-8B shape (random weights), $dt at the minimum ring ($min GB)" |
          sed 's/^/    /'; echo; } >> "$OUT_DIR/summary.md" || rc=1
done
[ -n "$(python3 -c 'import matplotlib' 2>&1)" ] && echo "timeline: no matplotlib here: no pictures (the figures are in summary.md)"
cat "$OUT_DIR/summary.md"
exit $rc
