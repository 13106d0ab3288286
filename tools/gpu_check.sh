#!/usr/bin/env bash
# On the GPU machine, in one call: build for sm_90, run the whole suite (GPU tests included), make the HF
# reference logits if they are missing (tools/make_refs.sh), check both engines against every reference,
# and measure the hardware ceilings. Logs go to $OUT (default ./out). DATA defaults to .shared, a copy of
# ../shared carried along with the working tree.
set -uo pipefail
export DATA=${DATA:-.shared}
CRIT=${CRIT:-$([ -d .crit ] && echo .crit)}
OUT=${OUT:-out}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total,pcie.link.gen.current,pcie.link.width.current,driver_version \
    --format=csv > "$OUT/gpu.txt" 2>&1
cat "$OUT/gpu.txt"
step() { echo "== $* ($(date +%T))"; }
FAILED=0  # any failing test, --check over tolerance or sanitizer error: the script exits 1 at the end

step build
make -j16 DATA="$DATA" all > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }

step "make test"
make test DATA="$DATA" ${CRIT:+CRITERION=$CRIT} TESTFLAGS="-j8" > "$OUT/test.log" 2>&1 || FAILED=1
grep -E "^\[(FAIL|SKIP)\]|Synthesis|Assertion|^\[----\]" "$OUT/test.log" | head -60

if [ ! -f tests/ref/stories260K.bin ] && [ "${REFS:-1}" = 1 ]; then
    step "references"
    PYTHONUNBUFFERED=1 sh tools/make_refs.sh tests > "$OUT/refs.log" 2>&1 || tail -20 "$OUT/refs.log"
    tail -5 "$OUT/refs.log"
    tar cf "$OUT/refs.tar" tests/fixtures tests/ref 2>/dev/null
fi

if [ "${TOKCASES:-0}" = 1 ]; then
    step "tokenizer cases from HF tokenizers"
    mkdir -p tests/tok && python3 tools/tok_cases.py "$DATA" tests/tok 400 && tar cf "$OUT/tok.tar" tests/tok
    # and run the new cases right away
    make test DATA="$DATA" ${CRIT:+CRITERION=$CRIT} TESTFLAGS="--filter tokenizer/*_random_cases" 2>&1 \
        | grep -E "^\[(FAIL|PASS)\]|Synthesis|Assertion" | head -20
fi

step "--check against the references"
mkdir -p /tmp/djinn_check
for ref in tests/ref/*.bin; do
    [ -f "$ref" ] || continue
    name=$(basename "$ref" .bin)
    if [ "$name" = stories260K ]; then src="$DATA/models/stories260K"; tok=""; dt="--dtype f32"
    else src="tests/fixtures/$name"; tok="--tokenizer $DATA/models/stories260K"; dt=""; fi
    ./convert/convert -q "$src" "/tmp/djinn_check/$name.bin" $tok $dt || continue
    for eng in "" "--fma-attn" "--cpu"; do  # the GPU engine, again with prefill attention on the FMA kernel, the CPU
        ./djinn "/tmp/djinn_check/$name.bin" --check "$ref" $eng 2>>"$OUT/check.log" > /tmp/djinn_check/out.txt \
            || FAILED=1
        { echo "=== $name ${eng:-gpu}"; cat /tmp/djinn_check/out.txt; } >> "$OUT/checks.txt"
        tail -1 /tmp/djinn_check/out.txt | sed "s/^/$name ${eng:-gpu}: /"
    done
    for dt in q8 q4; do  # quantized: held to the mean KL against the same (unquantized) reference
        ./convert/convert -q "$src" "/tmp/djinn_check/${name}_$dt.bin" $tok --dtype $dt || { FAILED=1; continue; }
        for eng in "" "--cpu"; do
            ./djinn "/tmp/djinn_check/${name}_$dt.bin" --check "$ref" $eng 2>>"$OUT/check.log" > /tmp/djinn_check/out.txt \
                || FAILED=1
            { echo "=== $name $dt ${eng:-gpu}"; cat /tmp/djinn_check/out.txt; } >> "$OUT/checks.txt"
            tail -2 /tmp/djinn_check/out.txt | tr '\n' ' ' | sed "s/^/$name $dt ${eng:-gpu}: /"; echo
        done
    done
done

if [ "${SHAPES:-1}" = 1 ]; then  # shapes the fixtures do not have, against HF on every engine
    step "shapes (tools/shape_check.py)"
    python3 tools/shape_check.py /tmp/djinn_check/shapes --data "$DATA" > "$OUT/shape_check.txt" 2>&1 || FAILED=1
    grep -E "^FAIL|shape_check:" "$OUT/shape_check.txt"
fi

if [ "${SANITIZE:-0}" = 1 ]; then
    # compute-sanitizer on every GPU test (kernels, engine, CLI) and on a short streamed generation; each
    # tool's summary line. Any error, or a tool that did not finish, makes the script fail.
    step compute-sanitizer
    CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
    ./convert/convert -q "$DATA/models/stories260K" /tmp/djinn_check/s16.bin --dtype f16
    # SAN_TOOLS, SAN_FILTERS (Criterion filters) and SAN_TIMEOUT (seconds per run) narrow it to fit a call.
    for tool in ${SAN_TOOLS:-memcheck racecheck synccheck}; do
        for filter in ${SAN_FILTERS:-"kernels/*" "gpu_forward/*" "cli/*gpu*"}; do
            log=/tmp/djinn_check/cs_${tool}_$(echo "$filter" | tr -c 'a-z' _).log
            # memcheck: --report-api-errors no, because kernels/oom_names_what makes cudaMalloc fail on purpose
            # (every API call's status is checked by the code itself; a failure fails its test)
            DJINN_DATA=$PWD/$DATA DJINN_BIN=$PWD/build/bin timeout "${SAN_TIMEOUT:-400}" "$CS" --tool $tool \
                $([ $tool = memcheck ] && echo --report-api-errors no) --error-exitcode 9 \
                build/run_tests -j1 --filter "$filter" > "$log" 2>&1
            rc=$?
            echo "$tool $filter: exit $rc $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|Synthesis' "$log" | tr '\n' ' ')"
            [ $rc = 0 ] || FAILED=1
        done
        timeout "${SAN_TIMEOUT:-300}" "$CS" --tool $tool --error-exitcode 9 ./djinn /tmp/djinn_check/s16.bin -p "Once upon a time" \
            -n 20 -t 0 --stream-all > "/tmp/djinn_check/cs_gen_$tool.log" 2>&1
        rc=$?
        echo "$tool streamed generation: exit $rc $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' /tmp/djinn_check/cs_gen_$tool.log | tr '\n' ' ')"
        [ $rc = 0 ] || FAILED=1
    done
    cat /tmp/djinn_check/cs_*.log > "$OUT/sanitizer.log"
    echo "commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)" >> "$OUT/sanitizer.log"
fi

if [ "${CEILINGS:-1}" = 1 ]; then
    step ceilings
    make bench-ceilings DATA="$DATA" CEILINGS_JSON="$OUT/ceilings.json" 2>&1 | tail -25
fi
step "done ($([ $FAILED = 0 ] && echo all passed || echo FAILURES above))"
exit $FAILED
