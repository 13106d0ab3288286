# session 72 call 5: issue 47's serving targets on main's head in one call beside the ceilings: ceilings (QUANT_ONLY:
# D2D, the GEMM peak, the quantized GEMVs and T = 512 products), the q4 server resident at 1 / 16 / 32 / 64 and
# streamed at the minimum ring (link only) at the same counts, 160-token answers, and its 96 agents; f16 resident at
# 16 / 64.
source .gpu/common.sh
body() {
stamp start
unpack m
W=/tmp/djinn_qbench; mkdir -p $W
(cd /tmp/m && source bench/lib.sh && WORK=$W DATA=/tmp/shared && make_hf 8b $W/hf_8b $W/make.log) > $R/make.txt 2>&1 &
(cd /tmp/m && make -j14 CRITERION=.crit DATA=/tmp/shared all build/bin/ceilings > $R/build_m.log 2>&1; echo rc=$? >> $R/build_m.log)
wait; tail -qn1 $R/build_*.log
stamp built
(cd /tmp/m && QUANT_ONLY=1 timeout 120 build/bin/ceilings > $R/ceilings.txt 2>&1); grep -E "D2D|GEMM|TFLOP" $R/ceilings.txt | head -5
stamp ceilings
(cd /tmp/m && DATA=/tmp/shared DTYPE=q4 CASES="resident_link min_link" CONCURRENCY="1 16 32 64" MAX_TOKENS=160 AGENTS=96 timeout 300 bash bench/serve_bench.sh $R/serve_q4 > $R/serve_q4.log 2>&1)
stamp serve q4; tail -8 $R/serve_q4.log
(cd /tmp/m && DATA=/tmp/shared DTYPE=f16 CASES=resident_link CONCURRENCY="16 64" MAX_TOKENS=160 AGENTS=0 timeout 120 bash bench/serve_bench.sh $R/serve_f16 > $R/serve_f16.log 2>&1)
stamp serve f16; grep -h 'resident_link |' $R/serve_f16.log
}
export -f body stamp unpack tests
timeout 545 bash -c "R=$R ROOT=$ROOT; body"
finish
