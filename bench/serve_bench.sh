#!/usr/bin/env bash
# bench/serve_bench.sh: `djinn serve` on the GPU machine, Llama-3-8B shape (random weights, tools/make_random_llama.py).
#
#   bench/serve_bench.sh OUT_DIR
#
# 1. build/bin/ceilings with LINK_ONLY=1: the pinned H2D and D2H rates and the host memory's (alone, and beside
#    the copies) of this run -> OUT_DIR/link.json
# 2. concurrency: N = $CONCURRENCY (default "1 8 32 64") simultaneous greedy completions of $MAX_TOKENS (64) tokens,
#    all resident and streamed at the minimum ring (-c 512, --parallel 64), each with --cpu-share 0 (the link
#    alone) and, streamed, auto -> OUT_DIR/<case>_n<N>.json
# 3. agents: --kv-gb sized for 32 sessions of 2048 positions at f32 (64 at the f16 default), --parallel 32,
#    $AGENTS (96) agents of $TURNS (4)
#    chat turns of 200-token answers and 2-second tool waits (each parks its session while it waits); all resident
#    -> OUT_DIR/agents.json
# DTYPE (default f16) picks the weights; models live in $BENCH_WORK (default /tmp/djinn_qbench, shared with
# quant_bench.sh); SKIP_MAKE=1 uses them as they are.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
OUT_DIR=${1:?out dir}
WORK=${BENCH_WORK:-/tmp/djinn_qbench}
DTYPE=${DTYPE:-f16}
DATA=${DATA:-.shared}
CONCURRENCY=${CONCURRENCY:-1 8 32 64}
MAX_TOKENS=${MAX_TOKENS:-64}
AGENTS=${AGENTS:-96}
TURNS=${TURNS:-4}
CASES=${CASES:-resident_link min_link min_share}
mkdir -p "$OUT_DIR" "$WORK" || exit 1
. bench/lib.sh

build_and_link "$WORK" "$OUT_DIR/link.json" || exit 1

HF=$WORK/hf_8b
make_hf 8b "$HF" "$WORK/make.log" || exit 1
bin=$WORK/serve_8b_$DTYPE.bin  # with Llama 3 Instruct's tokenizer and chat template (the agents chat)
if [ ! -f "$bin" ]; then
    say "convert $DTYPE"
    tok=$WORK/tok_llama3_instruct  # the shared folder's tokenizer.json there is a link to llama3's, as text
    mkdir -p "$tok" && cp "$DATA/tokenizers/llama3/tokenizer.json" "$DATA/tokenizers/llama3-instruct/tokenizer_config.json" "$tok" ||
        exit 1
    ./convert/convert "$HF" "$bin" --dtype "$DTYPE" --tokenizer "$tok" \
        2> "$WORK/convert.log" || { tail -3 "$WORK/convert.log"; exit 1; }
fi
min=$(./djinn "$bin" -p x -n 1 -t 0 -c 512 --ring-gb 0.001 2>&1 >/dev/null |
      sed -n 's/.*needs at least \([0-9][0-9.]*\) GB.*/\1/p' | head -1)
say "minimum ring ${min:-?} GB"

PORT=18080
trap stop_server EXIT

for case in $CASES; do
    case $case in
        resident_link) args=(--cpu-share 0) ;;
        min_link) args=(--ring-gb "$min" --cpu-share 0) ;;
        min_share) args=(--ring-gb "$min") ;;
        *) echo "unknown case $case"; continue ;;
    esac
    say "$case: djinn serve -c 512 --parallel 64 ${args[*]}"
    start_server "$OUT_DIR/${case}_server.log" -c 512 --parallel 64 "${args[@]}" || continue
    for n in $CONCURRENCY; do
        timeout 900 python3 bench/serve_client.py load $PORT "$n" "$MAX_TOKENS" "$OUT_DIR/${case}_n$n.json" ||
            echo "  $case n=$n FAILED"
    done
    curl -s "http://127.0.0.1:$PORT/metrics" > "$OUT_DIR/${case}_metrics.txt"
    stop_server
done

if [ "$AGENTS" -gt 0 ]; then
    # the --kv-gb of the f32 cache's days (32 slots): issue 47's comparison, the same memory holding twice the slots
    # at the f16 default (KV_TYPE=f32 gives the old case)
    pos_bytes=$(python3 -c 'print(2 * 32 * 8 * 128 * 4)')  # Llama-3-8B: a position's K and V over every layer, f32
    kv_gb=$(python3 -c "print(32 * 2048 * $pos_bytes / 1e9)")
    say "agents: djinn serve -c 2048 --kv-gb $kv_gb (32 slots at f32, 64 at f16) --parallel 32, $AGENTS agents"
    if start_server "$OUT_DIR/agents_server.log" -c 2048 --kv-gb "$kv_gb" --kv-type "${KV_TYPE:-f16}" --parallel 32 \
        --park-gb 64 --cpu-share 0; then
        timeout 1200 python3 bench/serve_client.py agents $PORT "$AGENTS" "$TURNS" 200 2 "$OUT_DIR/agents.json" ||
            echo "  agents FAILED"
        curl -s "http://127.0.0.1:$PORT/metrics" > "$OUT_DIR/agents_metrics.txt"
        stop_server
    fi
fi

say report
python3 - "$OUT_DIR" << 'PY'
import glob, json, os, sys
d = sys.argv[1]
link = json.load(open(os.path.join(d, "link.json")))
print(f"{link['device']}: pinned H2D {link['pcie_h2d_pinned_64mib_gbs']:.2f} GB/s, D2H {link['pcie_d2h_pinned_64mib_gbs']:.2f} GB/s")
print("| case | concurrent | tokens/s | x one request | rows a step | ms a step | p50 s | p99 s |\n|---|---|---|---|---|---|---|---|")
for case in ("resident_link", "min_link", "min_share"):
    rows = sorted((json.load(open(p)) for p in glob.glob(os.path.join(d, f"{case}_n*.json"))), key=lambda r: r["concurrency"])
    one = next((r["tokens_per_s"] for r in rows if r["concurrency"] == 1), 0)
    for r in rows:
        x = r["tokens_per_s"] / one if one else 0
        print(f"| {case} | {r['concurrency']} | {r['tokens_per_s']:.1f} | {x:.1f} | {r['rows_per_step']:.1f} | "
              f"{r['decode_step_ms']:.1f} | {r['latency_p50_s']:.2f} | {r['latency_p99_s']:.2f} |")
p = os.path.join(d, "agents.json")
if os.path.exists(p):
    a = json.load(open(p))
    print(f"agents: {a['agents']} x {a['turns']} turns, {a['turns_ok']} ok, errors {a['errors']}, drops {a['cache_drops']:.0f}, "
          f"latency p50 {a['latency_p50_s']:.2f} s p99 {a['latency_p99_s']:.2f} s; "
          f"park {a['park_gb_per_s']:.1f} GB/s ({a['park_gb_per_s'] / link['pcie_d2h_pinned_64mib_gbs']:.2f} of D2H), "
          f"restore {a['restore_gb_per_s']:.1f} GB/s ({a['restore_gb_per_s'] / link['pcie_h2d_pinned_64mib_gbs']:.2f} of H2D)")
PY
