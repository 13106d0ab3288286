#!/usr/bin/env bash
# bench/tp_bench.sh: the engine on several GPUs against one, on the two-GPU machine (issue 48), every figure beside
# the ceilings of the same run.
#
#   bench/tp_bench.sh OUT_DIR
#
# 1. build/bin/peer_ceilings: each link's pinned H2D alone and all at once, the host's reads beside them, peer copies
#    and the all-reduce's sum -> OUT_DIR/peer.json, peer.txt
# 2. ($CASES: any of resident min_link min_share, default all) Llama-3-8B shape in q4 (random weights, tools/make_random_llama.py): a greedy run of $N_NEW (64) tokens on
#    --gpus 1 and --gpus $GPUS (default 2), all resident and streamed at each one's minimum ring with --cpu-share 0
#    -> OUT_DIR/<case>_g<N>.json (djinn's --stats-json); and at the minimum ring with the automatic CPU share
#    (min_share: each GPU's share computed on its own threads, the host's cores divided among the GPUs)
# 3. the server at $CONCURRENCY (default "1 64") concurrent 160-token completions, all resident, on each
#    -> OUT_DIR/serve_g<N>_n<C>.json (bench/serve_client.py)
# PROFILE=1: DJINN_PROFILE's lines (every GPU's) for one sequence and for the server at 64, on 1 and $GPUS GPUs
#    -> OUT_DIR/profile.txt
# 4. LARGE=1: Llama-3-70B's 80 layers in q4 (bench/repeat_layers from a two-layer donor) streamed through --ring-gb
#    16 on each GPU, on 1 and $GPUS GPUs -> OUT_DIR/70b_g<N>.json; and at each one's smallest ring, link only
#    (--cpu-share 0, 8 tokens) -> OUT_DIR/70b_min_g<N>.json; LARGE_CASES="70b_min" runs the second alone
# 5. LARGE_F16=1: Llama-3-70B's 80 layers in f16, 141 GB, more than one GPU holds, all resident on $GPUS GPUs
#    (bench/repeat_layers --sparse: the donor's two layers, then 78 of zeros, which cost the matmuls what real ones do;
#    the disk holds 8 GB of it) -> OUT_DIR/70b_f16_g<GPUS>.json
# An empty CONCURRENCY skips the server.
# OUT_DIR/report.md: decode ms/token, the speed-up over one GPU, and the streamed rate against the links' ceiling.
# Models in $BENCH_WORK (default /tmp/djinn_qbench, shared with the other benchmarks).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
OUT_DIR=${1:?out dir}
WORK=${BENCH_WORK:-/tmp/djinn_qbench}
DATA=${DATA:-.shared}
GPUS=${GPUS:-2}
N_NEW=${N_NEW:-64}
CONCURRENCY=${CONCURRENCY-1 64}
PORT=${PORT:-18093}
CASES=${CASES-resident min_link min_share}
in_list() { case " $2 " in *" $1 "*) return 0 ;; esac; return 1; }  # WORD LIST
has_case() { in_list "$1" "$CASES"; }
mkdir -p "$OUT_DIR" "$WORK" || exit 1
. bench/lib.sh
trap stop_server EXIT

build_bench "$WORK" build/bin/peer_ceilings build/bin/repeat_layers || exit 1
say "peer ceilings"
build/bin/peer_ceilings "$OUT_DIR/peer.json" | tee "$OUT_DIR/peer.txt"
bin=$WORK/spec_8b_q4.bin
if [ -n "$CASES" ] || [ -n "$CONCURRENCY" ] || [ "${PROFILE:-0}" = 1 ]; then  # the 8B only where a case runs it
    make_hf 8b "$WORK/hf_8b" "$WORK/make.log" || exit 1
    convert_once "$WORK/hf_8b" "$bin" q4 || exit 1
fi

# the smallest --ring-gb (per GPU) that N GPUs take for BIN at context 1024, with 2% to spare
min_ring_n() {
    ./djinn "$1" -p x -n 1 -t 0 -c 1024 --ring-gb 0.001 --gpus "$2" 2>&1 >/dev/null |
        sed -n 's/.*needs at least \([0-9][0-9.]*\) GB.*/\1/p' | head -1 | awk '{printf "%.3f", $1 * 1.02}'
}

run_case() {  # NAME N ARGS...
    local name=$1 n=$2
    shift 2
    say "$name on $n GPU(s): $*"
    timeout 600 ./djinn "$bin" -p "The history of the city begins in the year" -n "$N_NEW" -t 0 -c 1024 \
        --gpus "$n" --cpu-share 0 "$@" --stats-json "$OUT_DIR/${name}_g$n.json" > "$OUT_DIR/${name}_g$n.txt" \
        2> "$WORK/run.log" || { echo "  FAILED"; tail -3 "$WORK/run.log"; }
}
for n in 1 "$GPUS"; do
    has_case resident && run_case resident "$n"
    has_case min_link || has_case min_share || continue
    r=$(min_ring_n "$bin" "$n")
    has_case min_link && run_case min_link "$n" --ring-gb "${r:?no minimum ring}"
    has_case min_share && run_case min_share "$n" --ring-gb "${r:?no minimum ring}" --cpu-share auto
done
if has_case resident; then
    cmp -s "$OUT_DIR/resident_g1.txt" "$OUT_DIR/resident_g$GPUS.txt" && echo "  greedy text: the same on 1 and $GPUS GPUs" ||
        echo "  greedy text: DIFFERS between 1 and $GPUS GPUs"
fi

for n in 1 "$GPUS"; do
    [ -n "$CONCURRENCY" ] || break
    say "djinn serve --gpus $n -c 512 --parallel 64"
    start_server "$OUT_DIR/serve_g$n.log" --gpus "$n" -c 512 --parallel 64 --cpu-share 0 || continue
    for c in $CONCURRENCY; do
        timeout 600 python3 bench/serve_client.py load "$PORT" "$c" 160 "$OUT_DIR/serve_g${n}_n$c.json" ||
            echo "  n=$c FAILED"
    done
    stop_server
done

# PROFILE=1: where a step's time goes on 1 and N GPUs (DJINN_PROFILE: events between kernel groups, which slow the
# step; each GPU prints its own line at exit): one sequence all resident, then the server's steps of 64 rows
if [ "${PROFILE:-0}" = 1 ]; then
    for n in 1 "$GPUS"; do
        say "profile, one sequence, $n GPU(s)"
        { echo "== one sequence, $n GPU(s)"; DJINN_PROFILE=1 ./djinn "$bin" -p "The history of the city" -n 32 -t 0 \
            -c 1024 --gpus "$n" --cpu-share 0 2>&1 > /dev/null | grep profile; } >> "$OUT_DIR/profile.txt"
        say "profile, the server at 64 concurrent, $n GPU(s)"
        export DJINN_PROFILE=1
        start_server "$WORK/serve_prof.log" --gpus "$n" -c 512 --parallel 64 --cpu-share 0 &&
            timeout 600 python3 bench/serve_client.py load "$PORT" 64 160 "$WORK/serve_prof.json" > /dev/null
        unset DJINN_PROFILE
        stop_server
        { echo "== server, 64 concurrent, $n GPU(s)"; grep profile "$WORK/serve_prof.log"; } >> "$OUT_DIR/profile.txt"
    done
    cat "$OUT_DIR/profile.txt"
fi

make_70b2() {  # the 70B shape with two layers, the donor of both large cases
    [ -f "$WORK/hf_70b2/.complete" ] && return 0
    say "make 70b, 2 layers"
    python3 tools/make_random_llama.py --shape 70b --layers 2 --out "$WORK/hf_70b2" --dtype float16 \
        > "$WORK/make70.log" 2>&1 && touch "$WORK/hf_70b2/.complete" || { tail -5 "$WORK/make70.log"; return 1; }
}
if [ "${LARGE:-0}" = 1 ]; then
    make_70b2 || exit 1
    convert_once "$WORK/hf_70b2" "$WORK/donor_70b_q4.bin" q4 || exit 1
    [ -f "$WORK/70b_q4.bin" ] || build/bin/repeat_layers "$WORK/donor_70b_q4.bin" "$WORK/70b_q4.bin" 80 || exit 1
    bin=$WORK/70b_q4.bin
    large=${LARGE_CASES:-70b 70b_min}
    for n in 1 "$GPUS"; do in_list 70b "$large" && N_NEW=16 run_case 70b "$n" --ring-gb 16; done
    for n in 1 "$GPUS"; do  # the 70B layer shape at each one's smallest ring, link only (every layer streamed)
        in_list 70b_min "$large" || break
        r=$(min_ring_n "$bin" "$n")
        N_NEW=8 run_case 70b_min "$n" --ring-gb "${r:?no minimum ring}"
    done
fi
if [ "${LARGE_F16:-0}" = 1 ]; then
    make_70b2 || exit 1
    convert_once "$WORK/hf_70b2" "$WORK/donor_70b_f16.bin" f16 || exit 1
    [ -f "$WORK/70b_f16.bin" ] || build/bin/repeat_layers "$WORK/donor_70b_f16.bin" "$WORK/70b_f16.bin" 80 --sparse ||
        exit 1
    bin=$WORK/70b_f16.bin
    N_NEW=16 run_case 70b_f16 "$GPUS"
fi

say report
python3 - "$OUT_DIR" "$GPUS" <<'PY' | tee "$OUT_DIR/report.md"
import json, os, sys
d, g = sys.argv[1], sys.argv[2]
def load(name):
    p = os.path.join(d, name)
    return json.load(open(p)) if os.path.exists(p) else None
peer = load("peer.json")
if peer:
    links = sum(peer["h2d_together_gbs"])
    print(f"links: alone {peer['h2d_alone_gbs']} GB/s, together {links:.2f}; host reads beside them "
          f"{peer['host_read_beside_links_gbs']:.2f} (combined {peer['links_beside_reads_gbs'] + peer['host_read_beside_links_gbs']:.2f})")
    if peer.get("exchange_1row_us"):
        print(f"all-reduce on GPUs 0 and 1 (gpu_tp_exchange in graphs): 1 row {peer['exchange_1row_us']:.1f} us, 64 rows {peer['exchange_64rows_us']:.1f} us")
    for p in peer["peer"]:
        print(f"peer {p['from']} -> {p['to']}: {p['copy_gbs']:.1f} GB/s; all-reduce sum 1 row {p['sum_1row_us']:.1f} us, 64 rows {p['sum_64rows_us']:.1f} us")
print()
print("| case | 1 GPU ms/token | %s GPUs ms/token | speed-up | streamed GB/s, every link (%s GPUs) |" % (g, g))
print("|---|---|---|---|---|")
for case in ("resident", "min_link", "min_share", "70b", "70b_min"):
    a, b = load(f"{case}_g1.json"), load(f"{case}_g{g}.json")
    if not a or not b:
        continue
    ma, mb = a["decode_ms_per_token"], b["decode_ms_per_token"]
    rate = b.get("streamed_gb_per_token", 0) / (mb * 1e-3) if mb else 0  # every GPU's part
    print(f"| {case} | {ma:.2f} | {mb:.2f} | {ma / mb:.2f}x | {rate:.1f} |")
b = load(f"70b_f16_g{g}.json")
if b:
    print(f"70B f16 (80 layers, {b['model_gb']:.1f} GB) on {g} GPUs: {b['decode_ms_per_token']:.2f} ms/token, "
          f"{b['resident_units']} units resident ({b['resident_gb']:.1f} GB over the GPUs), {b['streamed_units']} streamed")
for n in ("1", g):  # the CPU share: links and the host's reads together, against what they reach together
    b = load(f"min_share_g{n}.json")
    if b and peer and b["decode_ms_per_token"] > 0:
        gb = b["streamed_gb_per_token"] + b["cpu_gb_per_token"]
        both = gb / (b["decode_ms_per_token"] * 1e-3)
        line = (f"CPU share on {n} GPU(s): share {b['cpu_share']:.2f}, {gb:.2f} GB a token "
                f"({b['cpu_gb_per_token']:.2f} by the CPU) at {both:.1f} GB/s, {b['decode_ms_per_token']:.2f} ms a token")
        if n == g:  # peer_ceilings measures every link with the host's reads beside them
            ceil = peer["links_beside_reads_gbs"] + peer["host_read_beside_links_gbs"]
            line += f": {both / ceil:.2f} of the links and host reads together ({ceil:.1f} GB/s)"
        print(line)
for c in os.environ.get("CONCURRENCY", "1 64").split():
    a, b = load(f"serve_g1_n{c}.json"), load(f"serve_g{g}_n{c}.json")
    if a and b:
        print(f"server, {c} concurrent: {a['tokens_per_s']:.1f} tok/s on 1 GPU, {b['tokens_per_s']:.1f} on {g} "
              f"({b['tokens_per_s'] / a['tokens_per_s']:.2f}x)")
PY
