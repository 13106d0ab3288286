#!/usr/bin/env bash
# bench/depth_bench.sh: decode deep into the context on the GPU machine, Llama-3-8B shape (random weights) in q4, all
# resident, for each KV cache type (f32, f16, q8): a step at depth 0, 8k and 32k (build/bin/depth_bench), beside this
# run's HBM ceiling (build/bin/ceilings' D2D copy).
#
#   bench/depth_bench.sh OUT_DIR          (DEPTHS, CTX, DTYPE, TYPES change the case)
#
# OUT_DIR/ceilings.txt, OUT_DIR/depth.json, OUT_DIR/report.md (printed): ms a step, its ratio to depth 0, and the
# bytes it reads (the weights once, the KV cache up to the depth) over its time as a fraction of the D2D rate.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
OUT_DIR=${1:?out dir}
WORK=${BENCH_WORK:-/tmp/djinn_qbench}
DATA=${DATA:-.shared}
DEPTHS=${DEPTHS:-0,8192,32767}
CTX=${CTX:-32768}
DTYPE=${DTYPE:-q4}
TYPES=${TYPES:-f32,f16,q8}
mkdir -p "$OUT_DIR" "$WORK" || exit 1
. bench/lib.sh

build_bench "$WORK" build/bin/depth_bench || exit 1
say "ceilings"
timeout 300 build/bin/ceilings > "$OUT_DIR/ceilings.txt" 2>&1
HF=$WORK/hf_8b
make_hf 8b "$HF" "$WORK/make.log" || exit 1
model=$WORK/depth_8b_$DTYPE.bin
convert_once "$HF" "$model" "$DTYPE" || exit 1
say "depth_bench"
build/bin/depth_bench "$model" "$CTX" "$DEPTHS" 20 "$TYPES" > "$OUT_DIR/depth.json" || exit 1
python3 - "$OUT_DIR" <<'PY'
import json, re, sys
out = sys.argv[1]
d2d = None
for line in open(f"{out}/ceilings.txt"):
    m = re.match(r"HBM D2D copy.*?([0-9.]+) GB/s", line)
    if m: d2d = float(m.group(1))
r = json.load(open(f"{out}/depth.json"))
lines = [f"# Decode deep into the context ({r['model']}, context {r['ctx']}, median of {r['reps']} steps)", "",
         f"HBM D2D copy this run: {d2d} GB/s", "",
         "| KV type | depth | ms/step | vs depth 0 | GB read | GB/s | of D2D |", "|---|---|---|---|---|---|---|"]
for t in r["types"]:
    base = t["steps"][0]["ms"]
    for s in t["steps"]:
        gbs = s["bytes"] / 1e9 / (s["ms"] / 1e3)
        frac = f"{gbs / d2d:.2f}" if d2d else "?"
        lines.append(f"| {t['kv_type']} | {s['depth']} | {s['ms']:.3f} | {s['ms'] / base:.2f}x | {s['bytes'] / 1e9:.2f}"
                     f" | {gbs:.0f} | {frac} |")
open(f"{out}/report.md", "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
PY
