#!/usr/bin/env bash
# bench/share_bench.sh: the CPU share at the hardware's ceiling, on the GPU machine: for one model shape in q4 and
# f16, a decode step (passes of one row) at the minimum ring, 4 GB and 8 GB with the link alone, a sweep of fixed
# shares and the automatic one, the engines interleaved (bench/share_sweep.c), beside the ceilings of the same call.
#
#   bench/share_bench.sh SHAPE OUT_DIR       SHAPE: 8b, 13b, 70b (LAYERS=10: Llama-3-70B's layer shape, 10 layers)
#
# 1. build
# 2. a random checkpoint of SHAPE (tools/make_random_llama.py) in $BENCH_WORK (default /tmp/djinn_share), converted to
#    the DTYPES (the checkpoint is deleted after: 13B's three files would not fit the machine's 64 GB disk beside it);
#    sync; build/bin/ceilings with LINK_ONLY=1 -> OUT_DIR/ceilings_SHAPE.json
# 3. the sweeps (REPS rounds, default 4; then DUEL rounds, default 6, of the automatic share against the best fixed
#    one: bench/share_sweep.c) -> OUT_DIR/sweeps_SHAPE.jsonl; a ring below the model's minimum, or one that holds the
#    whole file, is skipped; and each dtype all resident (the link unused: label DTYPE_res), whose step the report
#    counts for the layers a ring keeps resident
# 4. the table (bench/share_report.py), printed
# Shares tried: q4 0.5-0.7, q8 0.55-0.7, f16 0.6-0.75 (SHARES_Q4, SHARES_Q8, SHARES_F16 to change them; -1 the
# automatic one, 0 the link). DTYPES (default "q4 f16"; q8 too where named): the dtypes made and swept, e.g. DTYPES=q4.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
SHAPE=${1:?shape} OUT_DIR=${2:?out dir}
WORK=${BENCH_WORK:-/tmp/djinn_share}
DATA=${DATA:-.shared}
REPS=${REPS:-4}
DUEL=${DUEL:-6}
SHARES_Q4=${SHARES_Q4:--1,0,0.5,0.55,0.6,0.65,0.7}
SHARES_Q8=${SHARES_Q8:--1,0,0.55,0.6,0.65,0.7}
SHARES_F16=${SHARES_F16:--1,0,0.6,0.65,0.7,0.75}
DTYPES=${DTYPES:-q4 f16}
case $SHAPE in 7b|13b) TOK=llama2 ;; *) TOK=llama3 ;; esac
mkdir -p "$OUT_DIR" "$WORK" || exit 1
. bench/lib.sh

build_bench "$WORK" build/bin/share_sweep || exit 1
HF=$WORK/hf_$SHAPE
missing=
for dt in $DTYPES; do [ -f "$WORK/${SHAPE}_$dt.bin" ] || missing="$missing $dt"; done
if [ -n "$missing" ]; then
    say "make $SHAPE${LAYERS:+ ($LAYERS layers)}"
    rm -rf "$HF"
    python3 tools/make_random_llama.py --shape "$SHAPE" ${LAYERS:+--layers "$LAYERS"} --out "$HF" --dtype float16 \
        > "$WORK/make.log" 2>&1 || { tail -5 "$WORK/make.log"; exit 1; }
    for dt in $missing; do convert_once "$HF" "$WORK/${SHAPE}_$dt.bin" $dt $TOK || exit 1; done
    rm -rf "$HF"
fi
# The files just written go to disk first: their writeback ran beside the first sweeps of a call (2026-11-27: the
# build that ran first in a call 3-8% slower at 8B q4, ring 4 GB; in alternating order, no difference).
say sync
sync
say "link ceilings"
LINK_ONLY=1 build/bin/ceilings "$OUT_DIR/ceilings_$SHAPE.json" || exit 1
S=$OUT_DIR/sweeps_$SHAPE.jsonl
: > "$S"
for dt in $DTYPES; do
    bin=$WORK/${SHAPE}_$dt.bin
    min=$(min_ring "$bin")
    shares=SHARES_${dt^^}
    for ring in "${min:?could not read the minimum ring}" 4 8; do
        label=${dt}_$ring
        [ "$ring" = "$min" ] && label=${dt}_min
        gb=$(stat -c %s "$bin" | awk '{print $1 / 1e9}')
        # below the minimum, or the whole model fits (nothing streams): no case
        if python3 -c "import sys; sys.exit(float('$min') <= float('$ring') < float('$gb'))"; then continue; fi
        say "$label: rings of $ring GB, shares ${!shares}"
        if ! out=$(build/bin/share_sweep "$bin" "$ring" 1 "${!shares}" "$REPS" "$DUEL" 2> "$WORK/sweep.log"); then
            echo "  $label FAILED:"; tail -3 "$WORK/sweep.log"; continue
        fi
        echo "{\"label\": \"$label\", \"result\": $out}" >> "$S"
    done
    all=$(stat -c %s "$bin" | awk '{printf "%d", $1 / 1e9 + 2}')
    say "${dt}_res: all resident (ring $all GB)"
    if out=$(build/bin/share_sweep "$bin" "$all" 1 0 2 2> "$WORK/sweep.log"); then
        echo "{\"label\": \"${dt}_res\", \"result\": $out}" >> "$S"
    else
        echo "  ${dt}_res FAILED:"; tail -3 "$WORK/sweep.log"
    fi
done
python3 bench/share_report.py "$SHAPE" "$S" "$OUT_DIR/ceilings_$SHAPE.json"
