#!/usr/bin/env bash
# bench/sampling_bench.sh: what sampling costs per decode step against greedy, on the GPU machine.
#
#   bench/sampling_bench.sh SHAPE OUT_DIR      SHAPE: 8b (Llama-3-8B, vocabulary 128256), 13b, 7b, tiny
#
# 1. build/bin/pick_bench: gpu_pick alone and the host sampler on the same 128k rows (flat, near-flat, spread), per
#    settings -> OUT_DIR/pick.json
# 2. djinn, all resident, 128 new tokens, per dtype in $DTYPES (default "f16 q4"): greedy (twice: before and after,
#    the run-to-run noise), then every sampler setting below at temperature 1e9, where every logit weighs the same
#    (the worst case: the nucleus is nearly the whole vocabulary, every radix pass meets all of it), and at 1e4
#    (near-flat, distinct weights) -> OUT_DIR/<dtype>_<case>.json (--stats-json)
# Models live in $BENCH_WORK (default /tmp/djinn_qbench, shared with quant_bench.sh); SKIP_MAKE=1 uses them.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
SHAPE=${1:?shape}
OUT_DIR=${2:?out dir}
WORK=${BENCH_WORK:-/tmp/djinn_qbench}
DTYPES=${DTYPES:-f16 q4}
DATA=${DATA:-.shared}
mkdir -p "$OUT_DIR" "$WORK" || exit 1
TOK=$DATA/tokenizers/llama2
case $SHAPE in 8b | 70b) TOK=$DATA/tokenizers/llama3 ;; esac
say() { echo "== $* ($(date +%T))"; }

say build
make -j16 all build/bin/pick_bench > "$WORK/build.log" 2>&1 || { tail -20 "$WORK/build.log"; exit 1; }
say "pick_bench: gpu_pick and the host sampler on 128k rows"
build/bin/pick_bench "$OUT_DIR/pick.json" || exit 1

HF=$WORK/hf_$SHAPE
if [ ! -f "$HF/.complete" ] && [ "${SKIP_MAKE:-0}" != 1 ]; then
    say "make $SHAPE"
    rm -rf "$HF"
    python3 tools/make_random_llama.py --shape "$SHAPE" --out "$HF" --dtype float16 > "$WORK/make.log" 2>&1 ||
        { tail -5 "$WORK/make.log"; exit 1; }
    touch "$HF/.complete"
fi

CASES=(greedy0 "-t 0"
       default "-t 1 --top-p 0.9"
       flat_p09 "-t 1e9 --top-p 0.9"
       flat_p1 "-t 1e9 --top-p 1"
       flat_chain "-t 1e9 --top-k 40 --top-p 0.95 --min-p 0.05"
       flat_minp "-t 1e9 --top-p 1 --min-p 0.05"
       flat_pen "-t 1e9 --top-p 0.9 --repeat-penalty 1.1 --frequency-penalty 0.1 --presence-penalty 0.1"
       near_p09 "-t 1e4 --top-p 0.9"
       near_k "-t 1e4 --top-k 1000 --top-p 0.5"
       greedy1 "-t 0")
for dt in $DTYPES; do
    bin=$WORK/${SHAPE}_$dt.bin
    if [ ! -f "$bin" ]; then
        say "convert $dt"
        ./convert/convert "$HF" "$bin" --dtype "$dt" --tokenizer "$TOK" 2> "$WORK/convert_$dt.log" ||
            { tail -3 "$WORK/convert_$dt.log"; exit 1; }
    fi
    say "$dt"
    for ((i = 0; i < ${#CASES[@]}; i += 2)); do
        case=${CASES[i]}
        read -r -a args <<< "${CASES[i + 1]}"
        out=$OUT_DIR/${dt}_$case.json
        if ! timeout 300 ./djinn "$bin" -p "Once upon a time" -n 128 -s 1 -c 1024 --stats-json "$out" "${args[@]}" \
                > /dev/null 2> "$WORK/run.log"; then
            echo "  $dt $case FAILED:"; tail -3 "$WORK/run.log"; continue
        fi
        grep -E 'decode' "$WORK/run.log" | tail -1 | sed "s/^/  $dt $case (${CASES[i + 1]}): /"
    done
done

say report
python3 - "$OUT_DIR" $DTYPES << 'PY'
import json, os, sys
d = sys.argv[1]
def load(name):
    p = os.path.join(d, name)
    return json.load(open(p)) if os.path.exists(p) else None
pick = load("pick.json")
if pick:
    print(f"gpu_pick on {pick['device']}, vocabulary {pick['vocab']}:")
    print("| settings | row | GPU us | host us |\n|---|---|---|---|")
    for c in pick["cases"]:
        print(f"| {c['settings']} | {c['row']} | {c['gpu_us']:.1f} | {c['host_us']:.0f} |")
for dt in sys.argv[2:]:
    g = [load(f"{dt}_greedy{i}.json") for i in (0, 1)]
    g = [x["decode_ms_per_token"] for x in g if x]
    if not g:
        continue
    base = sum(g) / len(g)
    print(f"\n{dt}: greedy {' and '.join(f'{x:.3f}' for x in g)} ms/token (base {base:.3f})")
    print("| case | ms/token | over greedy |\n|---|---|---|")
    for f in sorted(os.listdir(d)):
        if f.startswith(dt + "_") and f.endswith(".json") and "greedy" not in f:
            r = load(f)
            ms = r["decode_ms_per_token"]
            print(f"| {f[len(dt) + 1:-5]} | {ms:.3f} | {(ms / base - 1) * 100:+.1f}% |")
PY
