#!/usr/bin/env bash
# bench/spec_bench.sh: speculative decoding on the GPU machine, Llama-3-8B shape (random weights,
# tools/make_random_llama.py): the f16 target streamed at the minimum ring, drafted by its own q4 copy.
# SHAPE=13b (any of make_random_llama.py's) and RING=GB (--ring-gb; default: the minimum) change the case; DROP_HF=1
# deletes the HF checkpoint once both files are converted (a 13B one and its two conversions fill most of a 64 GB disk).
#
#   bench/spec_bench.sh OUT_DIR
#
# 1. build/bin/ceilings with LINK_ONLY=1: the pinned H2D and D2H rates and the host memory's (alone, and beside
#    the copies) of this run -> OUT_DIR/link.json
# 2. build/bin/spec_bench: a verification pass of T = 1..17 rows, a plain decode step and the draft's step, at the
#    minimum ring, with the CPU share automatic and off -> OUT_DIR/costs_share.json, costs_link.json
# 3. djinn -n $N_NEW (64) greedy from one prompt: plain, and --draft q4 with --draft-max K for K in $KS
#    (default "1 2 4 8 16"), CPU share automatic; plain and K 4 with --cpu-share 0 -> OUT_DIR/run_*.json
# 4. the report: measured ms/token, tokens per pass, acceptance; and from the measured costs, the speed at 70, 80
#    and 90% acceptance for each K (tokens a pass (1 - a^(K+1)) / (1 - a), each accepted independently) ->
#    OUT_DIR/report.md (printed)
# Models live in $BENCH_WORK (default /tmp/djinn_qbench, shared with the other benchmarks); SKIP_MAKE=1 uses them as
# they are.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
OUT_DIR=${1:?out dir}
WORK=${BENCH_WORK:-/tmp/djinn_qbench}
DATA=${DATA:-.shared}
KS=${KS:-1 2 4 8 16}
SHAPE=${SHAPE:-8b}
RING=${RING:-}
N_NEW=${N_NEW:-64}
PROMPT=${PROMPT:-"The history of the city begins in the year"}
mkdir -p "$OUT_DIR" "$WORK" || exit 1
. bench/lib.sh

build_and_link "$WORK" "$OUT_DIR/link.json" build/bin/spec_bench || exit 1

HF=$WORK/hf_$SHAPE
make_hf "$SHAPE" "$HF" "$WORK/make.log" || exit 1
case $SHAPE in 7b | 13b) tok=llama2 ;; *) tok=llama3 ;; esac
target=$WORK/spec_${SHAPE}_f16.bin draft=$WORK/spec_${SHAPE}_q4.bin
for dt in f16 q4; do convert_once "$HF" "$WORK/spec_${SHAPE}_$dt.bin" $dt $tok || exit 1; done
[ "${DROP_HF:-0}" = 1 ] && rm -rf "$HF"  # DROP_HF=1: the checkpoint goes once converted (disk)
min=$(min_ring "$target")
say "minimum ring ${min:?could not read the minimum ring} GB"
min=${RING:-$min}

say "pass costs (spec_bench)"
build/bin/spec_bench "$target" "$draft" "$min" -1 17 5 > "$OUT_DIR/costs_share.json" 2> "$OUT_DIR/costs_share.log" ||
    { tail -3 "$OUT_DIR/costs_share.log"; exit 1; }
build/bin/spec_bench "$target" "$draft" "$min" 0 17 3 > "$OUT_DIR/costs_link.json" 2> "$OUT_DIR/costs_link.log" ||
    tail -3 "$OUT_DIR/costs_link.log"

# run NAME ARGS...: one generation, its statistics in run_NAME.json, its text in run_NAME.txt
run() {
    local name=$1
    shift
    say "djinn $name: $*"
    timeout 300 ./djinn "$target" -p "$PROMPT" -n "$N_NEW" -t 0 -c 1024 --ring-gb "$min" \
        --stats-json "$OUT_DIR/run_$name.json" "$@" > "$OUT_DIR/run_$name.txt" 2> "$OUT_DIR/run_$name.log" ||
        { echo "  $name FAILED"; tail -3 "$OUT_DIR/run_$name.log"; }
}
run plain
for k in $KS; do run "k$k" --draft "$draft" --draft-max "$k"; done
run plain_link --cpu-share 0
run k4_link --cpu-share 0 --draft "$draft" --draft-max 4
for f in "$OUT_DIR"/run_k*.txt; do
    cmp -s "$f" "$OUT_DIR/run_plain.txt" || echo "  note: $(basename "$f") differs from the plain text (a near tie?)"
done

say report
case_name="$SHAPE shape (random weights), f16 target at --ring-gb $min"
[ -z "$RING" ] && case_name="$case_name (the minimum)"
N_NEW=$N_NEW python3 bench/spec_report.py "$OUT_DIR" "$min" "$case_name" | tee "$OUT_DIR/report.md"
