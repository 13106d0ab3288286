# bench/lib.sh: what the GPU benchmark scripts share (sourced, from the repository root).

say() { echo "== $* ($(date +%T))"; }

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
