# bench/lib.sh: what the GPU benchmark scripts share (sourced, from the repository root).

say() { echo "== $* ($(date +%T))"; }

# start_server LOG ARGS...: `djinn serve $bin --port $PORT -q --client-share 1 ARGS` in the background (stderr into
# LOG, its pid in SRV_PID; every benchmark client is one loopback address, as behind a proxy), waiting until /health
# answers (the model loads and page-locks first); stop_server ends it.
SRV_PID=
stop_server() {
    [ -n "$SRV_PID" ] && kill "$SRV_PID" 2> /dev/null && wait "$SRV_PID" 2> /dev/null
    SRV_PID=
}
start_server() {
    local log=$1
    shift
    ./djinn serve "$bin" --port $PORT -q --client-share 1 "$@" 2> "$log" &
    SRV_PID=$!
    for _ in $(seq 600); do
        curl -sf "http://127.0.0.1:$PORT/health" > /dev/null 2>&1 && return 0
        kill -0 "$SRV_PID" 2> /dev/null || { echo "  server died:"; tail -5 "$log"; SRV_PID=; return 1; }
        sleep 0.5
    done
    echo "  server did not come up"; tail -5 "$log"; stop_server; return 1
}

# make_hf SHAPE DIR LOG: a random-weight f16 HF checkpoint of SHAPE (tools/make_random_llama.py) in DIR, made once:
# DIR/.complete marks it done; SKIP_MAKE=1 takes DIR as it is.
make_hf() {
    local shape=$1 dir=$2 log=$3
    [ -f "$dir/.complete" ] || [ "${SKIP_MAKE:-0}" = 1 ] && return 0
    say "make $shape"
    rm -rf "$dir"
    python3 tools/make_random_llama.py --shape "$shape" --out "$dir" --dtype float16 > "$log" 2>&1 ||
        { tail -5 "$log"; return 1; }
    touch "$dir/.complete"
}

# build_and_link WORK OUT TARGET...: make all, build/bin/ceilings and the TARGETs (the log: WORK/build.log), then this
# run's link ceilings (LINK_ONLY=1: pinned H2D and D2H, host memory read alone and beside the copies) into OUT.
build_and_link() {
    local work=$1 out=$2
    shift 2
    build_bench "$work" "$@" || return 1
    say "link ceilings"
    LINK_ONLY=1 build/bin/ceilings "$out"
}

# build_bench WORK TARGET...: make all, build/bin/ceilings and the TARGETs (the log: WORK/build.log).
build_bench() {
    local work=$1
    shift
    say build
    make -j16 all build/bin/ceilings "$@" > "$work/build.log" 2>&1 || { tail -20 "$work/build.log"; return 1; }
}

# convert_once HF BIN DTYPE [TOKENIZER]: the checkpoint in HF converted to BIN in DTYPE with $DATA/tokenizers/TOKENIZER
# (default llama3; the log: $WORK/convert.log), unless BIN exists.
convert_once() {
    [ -f "$2" ] && return 0
    say "convert $3"
    ./convert/convert "$1" "$2" --dtype "$3" --tokenizer "$DATA/tokenizers/${4:-llama3}" -q 2> "$WORK/convert.log" ||
        { tail -3 "$WORK/convert.log"; return 1; }
}

# min_ring BIN: the smallest --ring-gb djinn takes for BIN at context 1024 (its 'needs at least X GB'), printed.
min_ring() {
    ./djinn "$1" -p x -n 1 -t 0 -c 1024 --ring-gb 0.001 2>&1 >/dev/null |
        sed -n 's/.*needs at least \([0-9][0-9.]*\) GB.*/\1/p' | head -1
}
