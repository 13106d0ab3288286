#!/usr/bin/env bash
# bench/link_bench.sh: decode over the link alone (--cpu-share 0) against the pinned H2D ceiling measured in the
# same run, on the GPU machine: Llama-3-8B shape (random weights, tools/make_random_llama.py) in f16, q8 and q4, at
# the minimum ring and at --ring-gb 4 and 8 (issue 20's "at least 0.97 of the pinned peak at every ring size").
#
#   bench/link_bench.sh OUT_DIR
#
# OUT_DIR/link.json: the ceilings (build/bin/ceilings, LINK_ONLY=1); OUT_DIR/<dtype>_<ring>.json: djinn's
# --stats-json of a greedy run of $N_NEW (48) tokens; OUT_DIR/report.md: per case ms/token, GB streamed per token,
# the weights' rate (streamed GB / decode time per token) and its fraction of the H2D ceiling, and the copies'
# own rate (djinn's h2d_gb_s: bytes over the time the copy engine was busy). DTYPES and RINGS ("min 4 8") narrow
# it. Models in $BENCH_WORK (default /tmp/djinn_qbench, shared with the other benchmarks).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
OUT_DIR=${1:?out dir}
WORK=${BENCH_WORK:-/tmp/djinn_qbench}
DATA=${DATA:-.shared}
DTYPES=${DTYPES:-f16 q8 q4}
RINGS=${RINGS:-min 4 8}
N_NEW=${N_NEW:-48}
mkdir -p "$OUT_DIR" "$WORK" || exit 1
. bench/lib.sh

build_and_link "$WORK" "$OUT_DIR/link.json" || exit 1
make_hf 8b "$WORK/hf_8b" "$WORK/make.log" || exit 1
for dt in $DTYPES; do convert_once "$WORK/hf_8b" "$WORK/spec_8b_$dt.bin" "$dt" || exit 1; done  # spec_bench.sh's names
for dt in $DTYPES; do
    bin=$WORK/spec_8b_$dt.bin
    for ring in $RINGS; do
        r=$ring
        [ "$ring" = min ] && r=$(min_ring "$bin")
        say "$dt --ring-gb ${r:?no minimum ring} ($ring)"
        timeout 300 ./djinn "$bin" -p "The history of the city begins in the year" -n "$N_NEW" -t 0 -c 1024 \
            --ring-gb "$r" --cpu-share 0 --stats-json "$OUT_DIR/${dt}_$ring.json" > /dev/null 2> "$WORK/run.log" ||
            { echo "  FAILED"; tail -3 "$WORK/run.log"; }
    done
done
say report
python3 - "$OUT_DIR" "$DTYPES" "$RINGS" <<'PY' | tee "$OUT_DIR/report.md"
import json, os, sys
d, dtypes, rings = sys.argv[1], sys.argv[2].split(), sys.argv[3].split()
link = json.load(open(os.path.join(d, "link.json")))
h2d = link["pcie_h2d_pinned_64mib_gbs"]
print(f"# Decode over the link alone (--cpu-share 0), Llama-3-8B shape\n\n{link['device']}: pinned H2D {h2d:.2f} GB/s "
      f"(64 MiB copies, measured in this run)\n")
print("| dtype | --ring-gb | ms/token | GB streamed a token | weights GB/s (of H2D) | copies' own GB/s (of H2D) |")
print("|---|---|---|---|---|---|")
for dt in dtypes:
    for ring in rings:
        p = os.path.join(d, f"{dt}_{ring}.json")
        if not os.path.exists(p):
            print(f"| {dt} | {ring} | failed | | | |")
            continue
        r = json.load(open(p))
        ms, gb = r["decode_ms_per_token"], r["streamed_gb_per_token"]
        if gb == 0:
            print(f"| {dt} | {r['ring_gb']:g} | {ms:.1f} | all resident | | |")
            continue
        eff = gb / (ms / 1e3)
        name = f"{r['ring_gb']:g}" + (" (min)" if ring == "min" else "")
        print(f"| {dt} | {name} | {ms:.1f} | {gb:.2f} | {eff:.1f} ({eff / h2d:.1%}) | {r['h2d_gb_s']:.1f} "
              f"({r['h2d_gb_s'] / h2d:.1%}) |")
PY
