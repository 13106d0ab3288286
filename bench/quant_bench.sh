#!/usr/bin/env bash
# bench/quant_bench.sh: f16, q8 and q4 on one random Llama-shaped checkpoint, on the GPU machine, with the ceilings
# measured in the same run (bench/ceilings.cu: D2D, pinned H2D, GEMM, host memory read alone and beside the copies;
# bench/cpu_matvec.c: host memory read by every core, and the CPU share's matvec against it).
#
#   bench/quant_bench.sh SHAPE OUT_DIR      SHAPE: 8b (Llama-3-8B), 13b, 7b, 70b, tiny (tools/make_random_llama.py)
#
# Cases, each model, greedy, context 1024 (djinn --stats-json into OUT_DIR/<dtype>_<case>.json):
#   resident      all resident, a short prompt, 128 new tokens (decode ms/token)
#   prefill       all resident, a 512-token prompt, 4 new tokens (prefill tokens/s)
#   prefill1k     the same with a 1024-token prompt (context 2048; not in the default CASES)
#   prefill2k     the same with a 2048-token prompt (context 4096; not in the default CASES)
#   prefillN      the same with an N-token prompt, N any count (e.g. prefill513: one token past two blocks of 256 of
#                 the quantized tensor-core kernel; context the power of two from 1024 that holds it)
#   min_link      the smallest ring djinn accepts, --cpu-share 0 (the link alone), 16 tokens
#   min_share     the smallest ring, --cpu-share auto (the default), 16 tokens
#   ringG_link, ringG_share   --ring-gb G for each G in $RINGS (default none), link only and with the CPU share
# Conversion times go to OUT_DIR/convert_<dtype>.json; the chart (bench/quant_chart.py, where matplotlib is) to
# OUT_DIR/<shape>.png. Models live in $BENCH_WORK (default /tmp/djinn_qbench).
# Knobs: SKIP_MAKE=1 (use the HF folder and .bin files already there), DTYPES ("f16 q8 q4"), LAYERS (a shape
# with fewer layers: 70b needs it, its 80 f16 layers do not fit the GPU machine's disk), RINGS (ring sizes in GB,
# e.g. "4 8"; default none), CASES (default "resident prefill min_link min_share"; prefill2k may be added).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
SHAPE=${1:?shape}
OUT_DIR=${2:?out dir}
WORK=${BENCH_WORK:-/tmp/djinn_qbench}
DTYPES=${DTYPES:-f16 q8 q4}
DATA=${DATA:-.shared}
mkdir -p "$OUT_DIR" "$WORK" || exit 1
TOK=$DATA/tokenizers/llama2
case $SHAPE in 8b | 70b) TOK=$DATA/tokenizers/llama3 ;; esac
LAYERS=${LAYERS:-}
RINGS=${RINGS:-}
CASES=${CASES:-resident prefill min_link min_share}
NAME=$SHAPE${LAYERS:+_${LAYERS}l}
say() { echo "== $* ($(date +%T))"; }

say build
make -j16 all build/bin/ceilings build/bin/cpu_matvec > "$WORK/build.log" 2>&1 || { tail -20 "$WORK/build.log"; exit 1; }

say "ceilings (GPU)"
build/bin/ceilings "$OUT_DIR/ceilings.json" 2>&1 | grep -E 'device|HBM|PCIe|host|while|combined|GEMM 8192' | head -10
say "ceilings (host memory) and the CPU share's matvec"
build/bin/cpu_matvec "$OUT_DIR/cpu_matvec.json" 8

HF=$WORK/hf_$NAME
if [ ! -f "$HF/.complete" ] && [ "${SKIP_MAKE:-0}" != 1 ]; then
    say "make $SHAPE"
    rm -rf "$HF"
    python3 tools/make_random_llama.py --shape "$SHAPE" ${LAYERS:+--layers $LAYERS} --out "$HF" --dtype float16 > "$WORK/make.log" 2>&1 ||
        { tail -5 "$WORK/make.log"; exit 1; }
    grep '^make_random_llama' "$WORK/make.log"
    touch "$HF/.complete"
fi

LONG=$(printf 'the %.0s' $(seq 511))
LONG=${LONG% }
LONG1K=$(printf 'the %.0s' $(seq 1023))
LONG1K=${LONG1K% }
LONG2K=$(printf 'the %.0s' $(seq 2047))
LONG2K=${LONG2K% }
for dt in $DTYPES; do
    bin=$WORK/${NAME}_$dt.bin
    if [ ! -f "$bin" ]; then
        say "convert $dt"
        t0=$(date +%s.%N)
        ./convert/convert "$HF" "$bin" --dtype "$dt" --tokenizer "$TOK" 2> "$WORK/convert_$dt.log" ||
            { tail -3 "$WORK/convert_$dt.log"; exit 1; }
        t1=$(date +%s.%N)
        grep -E 'quantization error|GB in' "$WORK/convert_$dt.log" | tr '\r' '\n' | tail -2
        python3 -c 'import json, os, sys
b = os.path.getsize(sys.argv[1]) / 1e9; t = float(sys.argv[3]) - float(sys.argv[2])
json.dump({"dtype": sys.argv[4], "bin_gb": b, "convert_s": t}, open(sys.argv[5], "w"))
print(f"{sys.argv[4]}: {b:.3f} GB in {t:.1f} s")' "$bin" "$t0" "$t1" "$dt" "$OUT_DIR/convert_$dt.json"
    fi
    min=$(./djinn "$bin" -p x -n 1 -t 0 -c 1024 --ring-gb 0.001 2>&1 >/dev/null |
          sed -n 's/.*needs at least \([0-9][0-9.]*\) GB.*/\1/p' | head -1)
    say "$dt: minimum ring $min GB"
    for case in $CASES $(for r in $RINGS; do echo "ring${r}_link ring${r}_share"; done); do
        case $case in
            ring*_link) args=(-p "Once upon a time" -n 16 --ring-gb "${case//[^0-9.]/}" --cpu-share 0) ;;
            ring*_share) args=(-p "Once upon a time" -n 16 --ring-gb "${case//[^0-9.]/}") ;;
            resident) args=(-p "Once upon a time" -n 128) ;;
            prefill) args=(-p "$LONG" -n 4) ;;
            prefill1k) args=(-p "$LONG1K" -n 4) ;;
            prefill2k) args=(-p "$LONG2K" -n 4) ;;
            prefill[0-9]*)  # N tokens: BOS and N - 1 words of one token each
                words=$(printf 'the %.0s' $(seq $((${case#prefill} - 1))))
                args=(-p "${words% }" -n 4) ;;
            min_link) args=(-p "Once upon a time" -n 16 --ring-gb "$min" --cpu-share 0) ;;
            min_share) args=(-p "Once upon a time" -n 16 --ring-gb "$min") ;;
        esac
        out=$OUT_DIR/${dt}_$case.json
        ctx=1024
        [ "$case" = prefill1k ] && ctx=2048
        [ "$case" = prefill2k ] && ctx=4096
        if [[ $case =~ ^prefill[0-9]+$ ]]; then while [ "$ctx" -lt $((${case#prefill} + 4)) ]; do ctx=$((ctx * 2)); done; fi
        if ! timeout 300 ./djinn "$bin" -t 0 -c $ctx --stats-json "$out" "${args[@]}" > /dev/null 2> "$WORK/run.log"; then
            echo "  $dt $case FAILED:"; tail -3 "$WORK/run.log"; continue
        fi
        grep -E 'CPU share|decode|prefill' "$WORK/run.log" | tail -3 | sed "s/^/  $dt $case: /"
    done
done

say report
python3 - "$OUT_DIR" $DTYPES << 'EOF'
import json, os, sys
d = sys.argv[1]
def load(name):
    p = os.path.join(d, name)
    return json.load(open(p)) if os.path.exists(p) else None
ceil, cpu = load("ceilings.json") or {}, load("cpu_matvec.json") or {}
d2d, h2d, host = ceil.get("hbm_d2d_gbs"), ceil.get("pcie_h2d_pinned_64mib_gbs"), cpu.get("host_read_gb_s")
both = ceil.get("host_plus_h2d_gbs")  # host memory read while H2D copies run, plus those copies: the share's ceiling
print(f"ceilings: D2D {d2d} GB/s, pinned H2D {h2d} GB/s, host read {host} GB/s ({cpu.get('threads')} threads), "
      f"host read + H2D together {both} GB/s")
def shared(s):  # a CPU-share run: ms/token (share; weights GB/s of host read + H2D together)
    gbs = (s["streamed_gb_per_token"] + s["cpu_gb_per_token"]) / s["decode_ms_per_token"] * 1e3
    return f"{s['decode_ms_per_token']:.1f} ({s['cpu_share']:.2f}" + (f"; {gbs:.0f} GB/s, {gbs / both:.0%})" if both else ")")
print("| dtype | file GB | resident ms/token (tok/s; weight GB/s of D2D) | prefill 512 tok/s | min ring link only ms/token (H2D GB/s) | min ring with CPU share ms/token (share; weights GB/s, of host read + H2D) | prefill 1024 tok/s | prefill 2048 tok/s |")
print("|---|---|---|---|---|---|---|---|")
rows = {}
for dt in sys.argv[2:]:
    r, p, l, s = (load(f"{dt}_{k}.json") for k in ("resident", "prefill", "min_link", "min_share"))
    c = load(f"convert_{dt}.json")
    gb = (c or {}).get("bin_gb") or (r or {}).get("model_gb") or 0
    cells = [dt, f"{gb:.2f}"]
    if r:
        ms = r["decode_ms_per_token"]
        cells.append(f"{ms:.2f} ({1e3 / ms:.0f}; {r['resident_gb'] / ms * 1e3:.0f} of {d2d:.0f})" if d2d else f"{ms:.2f}")
    else:
        cells.append("-")
    cells.append(f"{p['prefill_tok_s']:.0f}" if p else "-")
    cells.append(f"{l['decode_ms_per_token']:.1f} ({l['h2d_gb_s']:.1f} of {h2d:.1f})" if l and h2d else "-")
    cells.append(shared(s) if s else "-")
    for k in ("prefill1k", "prefill2k"):
        p2 = load(f"{dt}_{k}.json")
        cells.append(f"{p2['prefill_tok_s']:.0f}" if p2 else "-")
    print("| " + " | ".join(cells) + " |")
rings = sorted({f.split("_")[1] for f in os.listdir(d) if f.split("_")[1:2] and f.split("_")[1].startswith("ring")})
if rings:
    print("\n| dtype | --ring-gb | link only ms/token (H2D GB/s; of pinned H2D) | with CPU share ms/token (share; streamed weights GB/s, of host read + H2D) |")
    print("|---|---|---|---|")
    for dt in sys.argv[2:]:
        for rg in rings:
            l, s = load(f"{dt}_{rg}_link.json"), load(f"{dt}_{rg}_share.json")
            lc = f"{l['decode_ms_per_token']:.1f} ({l['h2d_gb_s']:.1f}; {l['h2d_gb_s'] / h2d:.0%})" if l and h2d else "-"
            sc = shared(s) if s else "-"
            print(f"| {dt} | {rg[4:]} | {lc} | {sc} |")
lens = sorted({int(f.split("_")[1][7:-5]) for f in os.listdir(d)
               if f.split("_")[1:2] and f.split("_")[1][7:-5].isdigit() and f.split("_")[1].startswith("prefill")})
if lens:
    print("\n| prompt tokens | " + " | ".join(f"{dt} prefill tok/s" for dt in sys.argv[2:]) + " |")
    print("|---" * (len(sys.argv[2:]) + 1) + "|")
    for n in lens:
        runs = {dt: load(f"{dt}_prefill{n}.json") for dt in sys.argv[2:]}
        ref = runs.get("f16")
        cells = []
        for dt, r in runs.items():
            c = f"{r['prefill_tok_s']:.0f}" if r else "-"
            if r and ref and dt != "f16":
                c += f" ({r['prefill_tok_s'] / ref['prefill_tok_s']:.0%})"
            cells.append(c)
        print(f"| {n} | " + " | ".join(cells) + " |")
EOF

if python3 -c "import matplotlib" 2> /dev/null; then
    python3 bench/quant_chart.py "$OUT_DIR" "$NAME"
else
    echo "quant_bench: no matplotlib here: no chart (bench/quant_chart.py)"
fi
