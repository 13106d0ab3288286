#!/usr/bin/env bash
# The GPU benchmark (issues 5 and 6), in stages that each finish well under 10 minutes and can be re-run: a
# stage, and each case within it, is skipped when its result already exists (to measure a case again, delete its
# JSON from bench/results/raw and from $BENCH_WORK/raw, the mirror below).
#
#   bench/run_gpu_bench.sh STAGE [STAGE...]     stages run in the order given; 'all' = every stage below
#
#   ceilings    build; machine info; make bench-ceilings: D2D copy, pinned H2D, host memory read (alone and beside
#               the copies), cuBLAS GEMM (the ceilings)
#   make7b      random Llama-2-7B-shaped f16 HF checkpoint (tools/make_random_llama.py), ./convert it
#   resident7b  djinn all resident: 512-token prompt (prefill, TTFT, decode) and a short prompt (decode); the long
#               one again with prefill attention on the FMA kernel (--fma-attn: fits_fma)
#   profile7b   DJINN_PROFILE=1 runs, default and --fma-attn: per-phase GPU time of prefill and decode
#   stream7b    djinn --ring-gb min (all streamed), 4, 8; --stream-all and --sync-copy at 8,
#               all with --cpu-share 0 (the link alone); then the default --cpu-share auto at min, 4, 8 (share_*)
#   sweep7b     --cpu-share 0.3, 0.45, 0.6 at the minimum ring: how near the automatic share is to the best
#   hf7b        HF transformers on the same weights: on the GPU, device_map=auto at 8 GB, cpu_offload
#   clean7b     delete the 7B model (the disk is 64 GiB)
#   make13b, stream13b (--ring-gb 16, with and without the CPU share), hf13b (auto at 16 GB, cpu_offload capped at 4 tokens), clean13b
#   load        bench/load_speed.sh 12 with page-locking: cold and warm load of a 12 GB model against the disk
#               read speed measured in the same run -> $RAW/load_speed.json
#   report      bench/report.py: bench/results/gpu_bench.json, gpu_bench.md, *.png; prints the tables
#   smoke       the whole pipeline on a tiny random model (~90 MB) into bench/results/raw_smoke and
#               bench/results/smoke: a dry run of every script and flag in about a minute (runs ceilings too)
#
# Every stage ends with a table of all results so far. Models live in $BENCH_WORK (default /tmp/djinn_bench);
# raw results in bench/results/raw (mirrored to $BENCH_WORK/raw, restored from there at start, so a warm
# machine keeps them between calls even if the tree is laid anew); when $OUT is set, raw results, logs and
# the report are copied under it after every case. DATA (default .shared) holds tokenizers/llama2.
# Knobs (env): N_RESIDENT (128) and N_STREAM (32) decode tokens, PROMPT_TOKENS (512), CTX (1024, the KV cache
# length), CASE_TIMEOUT (420 s per case), SKIP_BUILD=1 (use ./djinn and ./convert/convert as they are).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1

export DATA=${DATA:-.shared}
WORK=${BENCH_WORK:-/tmp/djinn_bench}
N_RESIDENT=${N_RESIDENT:-128}
N_STREAM=${N_STREAM:-32}
PROMPT_TOKENS=${PROMPT_TOKENS:-512}
CTX=${CTX:-1024}
CASE_TIMEOUT=${CASE_TIMEOUT:-420}
RAW=bench/results/raw
REPORT_DIR=bench/results
LOGS=$WORK/logs
MIRROR=$WORK/raw
BUILT=
PROMPT=
FAILED=0

say() { echo "== $* ($(date +%T))"; }
die() { echo "run_gpu_bench: $*" >&2; sync_out; exit 1; }

# Results in the tree, a mirror on the machine, a copy under $OUT.
set_raw() {
    RAW=$1
    MIRROR=$WORK/$(basename "$RAW")
    mkdir -p "$RAW" "$MIRROR" "$LOGS" || exit 1
    cp -rn "$MIRROR/." "$RAW/" 2>/dev/null
}
sync_out() {
    [ -d "$RAW" ] && [ -d "$MIRROR" ] && cp -r "$RAW/." "$MIRROR/" 2>/dev/null
    if [ -n "${OUT:-}" ]; then
        mkdir -p "$OUT/$(basename "$RAW")" "$OUT/logs"
        cp -r "$RAW/." "$OUT/$(basename "$RAW")/" 2>/dev/null
        cp -r "$LOGS/." "$OUT/logs/" 2>/dev/null
    fi
    return 0
}
trap sync_out EXIT

ensure_built() {
    [ -n "$BUILT" ] && return 0
    if [ "${SKIP_BUILD:-0}" = 1 ] && [ -x ./djinn ] && [ -x ./convert/convert ]; then BUILT=1; return 0; fi
    say "build (make -j16 all)"
    if ! make -j16 DATA="$DATA" all > "$LOGS/build.log" 2>&1; then
        tail -30 "$LOGS/build.log"
        die "the build failed (log: $LOGS/build.log)"
    fi
    BUILT=1
}

# Free bytes where the models go must cover what is about to be written.
need_disk() {  # GB
    local avail
    avail=$(df -B1 --output=avail "$WORK" | tail -1 | tr -d ' ')
    if [ "$avail" -lt $(($1 * 1000000000)) ]; then
        df -h "$WORK"
        du -sh "$WORK"/* 2>/dev/null
        die "need $1 GB free in $WORK, have $((avail / 1000000000)) GB: run the clean stage of the other model first"
    fi
}

# Model tag -> HF folder, model.bin, GB on disk of one copy (f16: 13.5 GB for 7B, 26.03 GB for 13B).
hf_dir() { echo "$WORK/hf$1"; }
bin_of() { echo "$WORK/llama$1.bin"; }
disk_gb() { case $1 in 7b) echo 14 ;; 13b) echo 27 ;; *) echo 1 ;; esac; }

stage_make() {
    local tag=$1 hf bin t0 need
    hf=$(hf_dir "$tag") bin=$(bin_of "$tag")
    if [ -f "$bin" ] && [ -f "$hf/.complete" ] && [ -f "$RAW/config_$tag.json" ]; then
        echo "make$tag: done before ($bin)"
        return 0
    fi
    ensure_built
    need=$(disk_gb "$tag")
    if [ ! -f "$hf/.complete" ]; then
        [ -f "$bin" ] && rm -f "$bin"  # a model.bin without its HF folder: from another run, remake both
        rm -rf "$hf"
        need_disk $((2 * need))  # the HF folder, then model.bin beside it
        say "make$tag: random HF checkpoint -> $hf"
        python3 tools/make_random_llama.py --shape "$tag" --out "$hf" --dtype float16 --seed 1234 \
            > "$LOGS/make$tag.log" 2>&1
        local rc=$?
        grep '^make_random_llama' "$LOGS/make$tag.log"
        if [ $rc -ne 0 ]; then tail -20 "$LOGS/make$tag.log"; die "make_random_llama failed (rc $rc)"; fi
        touch "$hf/.complete"
    fi
    cp "$hf/config.json" "$RAW/config_$tag.json"
    if [ ! -f "$bin" ]; then
        need_disk "$need"
        say "make$tag: convert -> $bin"
        t0=$(date +%s.%N)
        if ! timeout 540 ./convert/convert "$hf" "$bin" --tokenizer "$DATA/tokenizers/llama2" \
                > "$LOGS/convert$tag.log" 2>&1; then
            tail -5 "$LOGS/convert$tag.log"
            rm -f "$bin" "$bin.tmp"
            die "convert failed"
        fi
        python3 -c 'import json, os, sys; t = float(sys.argv[3]) - float(sys.argv[2]); b = os.path.getsize(sys.argv[1]) / 1e9
json.dump({"convert_s": t, "bin_gb": b, "convert_gb_s": b / max(t, 1e-9)}, open(sys.argv[4], "w"))
print(f"make: converted {b:.2f} GB in {t:.1f} s ({b / max(t, 1e-9):.2f} GB/s)")' \
            "$bin" "$t0" "$(date +%s.%N)" "$RAW/convert_$tag.json"
    fi
    sync_out
}

stage_clean() {
    say "clean$1"
    rm -rf "$(hf_dir "$1")" "$(bin_of "$1")" "$(bin_of "$1").tmp"
    df -h "$WORK" | tail -1
}

# The long prompt: common one-token words, grown or shrunk until djinn's tokenizer gives PROMPT_TOKENS ids
# (BOS included). Its text and ids are kept in $RAW so every model and HF see the same prompt.
words_text() {  # N
    local w=(once upon a time there was a little girl who lived in the old house by the river and she had a dog
             that liked to run with her every day after school when the sun was high over the water they would
             walk down to the big tree and sit in its shade for a long time to talk about what they had seen)
    local s="" i
    for ((i = 0; i < $1; i++)); do s+="${w[i % ${#w[@]}]} "; done
    echo "${s% }"
}
ensure_prompt() {  # model.bin
    if [ -s "$RAW/prompt.txt" ] && [ -s "$RAW/prompt_ids.txt" ]; then
        PROMPT=$(cat "$RAW/prompt.txt")
        return 0
    fi
    local k=$((PROMPT_TOKENS - 1)) n best=-1 text ids i
    for i in 1 2 3 4 5 6 7 8 9 10; do
        text=$(words_text "$k")
        ids=$(./djinn "$1" --tokenize -p "$text" 2>> "$LOGS/tokenize.log") || die "djinn --tokenize failed: $(tail -2 "$LOGS/tokenize.log")"
        n=$(wc -w <<< "$ids")
        if [ "$best" -lt 0 ] || [ $(( (n - PROMPT_TOKENS) ** 2 )) -lt $(( (best - PROMPT_TOKENS) ** 2 )) ]; then
            best=$n
            printf '%s' "$text" > "$RAW/prompt.txt"
            echo "$ids" > "$RAW/prompt_ids.txt"
        fi
        [ "$n" -eq "$PROMPT_TOKENS" ] && break
        k=$((k + PROMPT_TOKENS - n))
        [ "$k" -lt 1 ] && k=1
    done
    echo "prompt: $best tokens (BOS included), $(wc -c < "$RAW/prompt.txt") characters"
    PROMPT=$(cat "$RAW/prompt.txt")
}

# The smallest --ring-gb djinn accepts, from its own error line for a budget far too small.
ring_min() {  # tag -> prints GB
    local f="$RAW/min_ring_$1.txt" msg x
    if [ -s "$f" ]; then cat "$f"; return 0; fi
    msg=$(timeout "$CASE_TIMEOUT" ./djinn "$(bin_of "$1")" -p x -n 1 -t 0 -c "$CTX" --ring-gb 0.001 2>&1 > /dev/null)
    echo "$msg" > "$LOGS/min_ring_$1.log"
    x=$(sed -n 's/.*needs at least \([0-9][0-9.]*\) GB.*/\1/p' <<< "$msg" | head -1)
    if [ -z "$x" ]; then
        echo "ring_min: no 'needs at least X GB' in djinn's output: $(tail -3 <<< "$msg")" >&2
        return 1
    fi
    echo "$x" > "$f"
    echo "$x"
}

# One djinn run -> $RAW/djinn_<tag>_<name>.json (its --stats-json plus the case). Prompt: long | short.
# A ring of '@min' is resolved by ring_min (only when the case is not done yet).
djinn_case() {  # tag name long|short djinn-args...
    local tag=$1 name=$2 kind=$3
    shift 3
    local out="$RAW/djinn_${tag}_${name}.json" log="$LOGS/djinn_${tag}_${name}.log" bin a args=() p
    if [ -f "$out" ]; then echo "  djinn $tag $name: done before"; return 0; fi
    bin=$(bin_of "$tag")
    [ -f "$bin" ] || { echo "  djinn $tag $name: SKIPPED, no $bin (run make$tag)"; FAILED=1; return 1; }
    for a in "$@"; do
        if [ "$a" = @min ]; then
            a=$(ring_min "$tag") || { echo "  djinn $tag $name: SKIPPED, no minimum ring"; FAILED=1; return 1; }
        fi
        args+=("$a")
    done
    if [ "$kind" = long ]; then p=$PROMPT; else p="Once upon a time"; fi
    echo "  djinn $tag $name: ${args[*]}"
    local t0=$SECONDS rc
    timeout "$CASE_TIMEOUT" ./djinn "$bin" -p "$p" -t 0 -c "$CTX" --stats-json "$out.tmp" "${args[@]}" \
        > "$log.stdout" 2> "$log"
    rc=$?
    if [ $rc -ne 0 ] || [ ! -s "$out.tmp" ]; then
        echo "  djinn $tag $name: FAILED (exit $rc$([ $rc = 124 ] && echo ", timed out after $CASE_TIMEOUT s")):"
        tail -4 "$log" | sed 's/^/    /'
        rm -f "$out.tmp"
        FAILED=1
        sync_out
        return 1
    fi
    python3 -c 'import json, sys
d = json.load(open(sys.argv[1]))
d.update(case=sys.argv[2], tag=sys.argv[3], args=sys.argv[4:-1], wall_s=float(sys.argv[-1]))
json.dump(d, open(sys.argv[1], "w"), indent=1)' "$out.tmp" "$name" "$tag" "${args[@]}" "$((SECONDS - t0))" &&
        mv "$out.tmp" "$out"
    grep -E 'plan|resident|decode|prefill|first token|streamed' "$log" | head -8 | sed 's/^/    /'
    sync_out
}

# One HF baseline run -> $RAW/hf_<tag>_<mode>.json.
hf_case() {  # tag mode hf_baseline-args...
    local tag=$1 mode=$2
    shift 2
    local out="$RAW/hf_${tag}_${mode}.json" log="$LOGS/hf_${tag}_${mode}.log" rc
    if [ -f "$out" ]; then echo "  hf $tag $mode: done before"; return 0; fi
    [ -f "$(hf_dir "$tag")/.complete" ] || { echo "  hf $tag $mode: SKIPPED, no $(hf_dir "$tag") (run make$tag)"; FAILED=1; return 1; }
    echo "  hf $tag $mode: $*"
    timeout "$CASE_TIMEOUT" python3 bench/hf_baseline.py "$(hf_dir "$tag")" --mode "$mode" --out "$out" \
        --ids "$RAW/prompt_ids.txt" "$@" > "$log" 2>&1
    rc=$?
    grep '^hf_baseline' "$log" | tail -4 | sed 's/^/    /'
    if [ $rc -ne 0 ]; then
        echo "  hf $tag $mode: FAILED (exit $rc$([ $rc = 124 ] && echo ", timed out after $CASE_TIMEOUT s")):"
        grep -v '^hf_baseline' "$log" | tail -6 | sed 's/^/    /'
        rm -f "$out"
        FAILED=1
    fi
    sync_out
}

stage_ceilings() {
    if [ -f "$RAW/ceilings.json" ] && [ -f "$RAW/machine.json" ]; then echo "ceilings: done before"; return 0; fi
    ensure_built
    say "machine"
    python3 - "$RAW/machine.json" << 'EOF'
import datetime, json, platform, subprocess, sys
def sh(cmd):
    try:
        return subprocess.run(cmd, shell=True, capture_output=True, text=True, timeout=60).stdout.strip()
    except Exception as ex:
        return f"error: {ex}"
q = "name,memory.total,pcie.link.gen.max,pcie.link.width.max,pcie.link.gen.current,pcie.link.width.current," \
    "driver_version,clocks.max.sm,clocks.max.memory,power.limit"
lines = sh(f"nvidia-smi --query-gpu={q} --format=csv").splitlines()
gpu = dict(zip([k.strip() for k in lines[0].split(",")], [v.strip() for v in lines[1].split(",")])) \
    if len(lines) >= 2 else {"nvidia-smi": "\n".join(lines)}
info = dict(date=datetime.datetime.now().isoformat(timespec="seconds"), gpu=gpu,
            cpu=sh("lscpu | grep -E '^Model name|^CPU\\(s\\)' | tr -s ' '").splitlines(),
            cores=int(sh("nproc") or 0), mem=sh("free -g | head -2").splitlines(), disk=sh("df -h /tmp | tail -1"),
            kernel=platform.release(), python=platform.python_version(),
            nvcc=sh("nvcc --version 2>/dev/null || /usr/local/cuda/bin/nvcc --version").splitlines()[-1:])
for mod in ("torch", "transformers", "accelerate"):
    try:
        info[mod] = __import__(mod).__version__
    except Exception as ex:
        info[mod] = f"missing: {ex}"
json.dump(info, open(sys.argv[1], "w"), indent=1)
print(f"machine: {gpu.get('name', gpu)}, {info['cores']} cores, torch {info['torch']}, "
      f"transformers {info['transformers']}, accelerate {info['accelerate']}")
EOF
    say "ceilings (make bench-ceilings)"
    rm -f "$RAW/ceilings.json.tmp"
    timeout "$CASE_TIMEOUT" make DATA="$DATA" bench-ceilings CEILINGS_JSON="$PWD/$RAW/ceilings.json.tmp" \
        > "$LOGS/ceilings.log" 2>&1
    local rc=$?
    grep -vE '^(nvcc|cc|/usr|mkdir|make)' "$LOGS/ceilings.log" | tail -25
    if [ $rc -ne 0 ] || [ ! -s "$RAW/ceilings.json.tmp" ]; then die "bench-ceilings failed (exit $rc)"; fi
    mv "$RAW/ceilings.json.tmp" "$RAW/ceilings.json"
    sync_out
}

# Build, and the prompt. Without the model, cases already measured are still reported as done, the rest SKIPPED.
prepare() {  # tag
    ensure_built
    if [ -f "$(bin_of "$1")" ]; then
        ensure_prompt "$(bin_of "$1")"
    elif [ -s "$RAW/prompt.txt" ]; then
        PROMPT=$(cat "$RAW/prompt.txt")
    fi
}

stage_resident() {  # tag
    local tag=$1
    say "resident$tag"
    prepare "$tag"
    djinn_case "$tag" fits long -n "$N_RESIDENT"
    djinn_case "$tag" fits_short short -n "$N_RESIDENT"
    djinn_case "$tag" fits_fma long -n "$N_RESIDENT" --fma-attn
}

# Where the time of a prefill pass and of a decode step goes (DJINN_PROFILE=1: events between the kernels of
# each layer, per phase), resident, default and with --fma-attn: $RAW/profile_<tag>_<case>.txt. Profiled passes run
# without the decode graph, so their decode times are not the benchmark's.
stage_profile() {  # tag
    local tag=$1 bin c out
    say "profile$tag"
    prepare "$tag"
    bin=$(bin_of "$tag")
    [ -f "$bin" ] || { echo "  profile $tag: SKIPPED, no $bin (run make$tag)"; FAILED=1; return 1; }
    for c in default fma; do
        out="$RAW/profile_${tag}_$c.txt"
        [ -f "$out" ] && { echo "  profile $tag $c: done before"; continue; }
        DJINN_PROFILE=1 timeout "$CASE_TIMEOUT" ./djinn "$bin" -p "$PROMPT" -t 0 -c "$CTX" -n 16 \
            $([ $c = fma ] && echo --fma-attn) > /dev/null 2> "$LOGS/profile_${tag}_$c.log" ||
            { echo "  profile $tag $c: FAILED"; tail -3 "$LOGS/profile_${tag}_$c.log"; FAILED=1; continue; }
        grep -E '^(profile|gpu:|prefill|decode|time to first)' "$LOGS/profile_${tag}_$c.log" | tee "$out" | sed 's/^/    /'
    done
    sync_out
}

# ring: G | min (the smallest) | stream_all=G | sync_copy=G | share=G (the default, automatic CPU share) |
# share=F,G (--cpu-share F); G may be @min. All but share* run with --cpu-share 0: the link alone.
stage_stream() {  # tag ring...
    local tag=$1 r
    shift
    say "stream$tag"
    prepare "$tag"
    for r in "$@"; do
        local v=${r#*=}
        local nm=${v#@}  # '@min' (resolved by djinn_case) is named 'min'
        case $r in
            min) djinn_case "$tag" ring_min long -n "$N_STREAM" --ring-gb @min --cpu-share 0 ;;
            stream_all=*) djinn_case "$tag" "stream_all_$nm" long -n "$N_STREAM" --ring-gb "$v" --stream-all --cpu-share 0 ;;
            sync_copy=*) djinn_case "$tag" "sync_copy_$nm" long -n "$N_STREAM" --ring-gb "$v" --sync-copy --cpu-share 0 ;;
            share=*,*) local g=${v#*,}
                djinn_case "$tag" "share${v%%,*}_${g#@}" long -n "$N_STREAM" --ring-gb "$g" --cpu-share "${v%%,*}" ;;
            share=*) djinn_case "$tag" "share_$nm" long -n "$N_STREAM" --ring-gb "$v" ;;
            *) djinn_case "$tag" "ring_$r" long -n "$N_STREAM" --ring-gb "$r" --cpu-share 0 ;;
        esac
    done
}

stage_hf() {  # tag: the baselines for that model
    local tag=$1
    say "hf$tag"
    prepare "$tag"
    [ -s "$RAW/prompt_ids.txt" ] || die "no $RAW/prompt_ids.txt: run make$tag first (the prompt is tokenized by djinn)"
    case $tag in
        7b)
            hf_case 7b gpu -n 32
            hf_case 7b auto -n 16 --budget-gb 8
            hf_case 7b cpu_offload -n 8
            ;;
        13b)
            hf_case 13b auto -n 8 --budget-gb 16
            hf_case 13b cpu_offload -n 4 --note "decode capped at 4 timed tokens (~4 s each)"
            ;;
        tiny)
            hf_case tiny gpu -n 8
            hf_case tiny auto -n 4 --budget-gb 0.05
            hf_case tiny cpu_offload -n 4
            ;;
    esac
}

stage_report() {
    say "report"
    python3 bench/report.py "$RAW" "$1" || die "report.py failed"
    if [ -n "${OUT:-}" ]; then mkdir -p "$OUT/$(basename "$1")" && cp "$1"/gpu_bench.* "$1"/*.png "$OUT/$(basename "$1")/" 2>/dev/null; fi
    return 0
}

summary() {
    echo
    say "results so far ($RAW)"
    python3 bench/report.py --summary "$RAW" || echo "(report.py --summary failed)"
}

run_stage() {
    case $1 in
        ceilings) stage_ceilings ;;
        make7b) stage_make 7b ;;
        resident7b) stage_resident 7b ;;
        profile7b) stage_profile 7b ;;
        stream7b) stage_stream 7b min 4 8 stream_all=8 sync_copy=8 share=@min share=4 share=8 ;;
        sweep7b) stage_stream 7b share=0.3,@min share=0.45,@min share=0.6,@min ;;
        hf7b) stage_hf 7b ;;
        clean7b) stage_clean 7b ;;
        make13b) stage_make 13b ;;
        stream13b) stage_stream 13b 16 share=16 ;;
        hf13b) stage_hf 13b ;;
        clean13b) stage_clean 13b ;;
        load)
            say load
            if [ -f "$RAW/load_speed.json" ]; then echo "  load: done before"
            else need_disk 32 && LOAD_ARGS= OUT_JSON="$RAW/load_speed.json" bench/load_speed.sh 12 "$WORK/load" || FAILED=1
            fi
            sync_out ;;
        report) stage_report "$REPORT_DIR" ;;
        smoke)
            stage_ceilings
            local real=$RAW
            set_raw bench/results/raw_smoke
            [ -f "$RAW/ceilings.json" ] || cp "$real/ceilings.json" "$real/machine.json" "$RAW/"
            stage_make tiny
            stage_resident tiny
            stage_profile tiny
            stage_stream tiny min stream_all=0.2 sync_copy=@min share=@min share=0.5,@min
            stage_hf tiny
            stage_report bench/results/smoke
            set_raw "$real"
            ;;
        *) die "unknown stage '$1' (see the top of $0)" ;;
    esac
}

[ $# -gt 0 ] || { awk 'NR > 1 && /^#/ { print; next } NR > 1 { exit }' "$0"; exit 2; }
set_raw "$RAW"
for s in "$@"; do
    if [ "$s" = all ]; then
        for t in ceilings make7b resident7b profile7b stream7b hf7b clean7b make13b stream13b hf13b clean13b report; do
            run_stage "$t"
        done
    else
        run_stage "$s"
    fi
done
case ${!#} in report | smoke | all) ;; *) summary ;; esac  # those two print the tables already
sync_out
[ "$FAILED" = 0 ] || echo "run_gpu_bench: some cases FAILED or were skipped (logs: $LOGS${OUT:+, $OUT/logs})"
exit "$FAILED"
