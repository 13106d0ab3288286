# session 75 call 2: issue 47's targets, part 1 of two back-to-back calls on one machine (main 7588b2a): ceilings
# (QUANT_ONLY: D2D, GEMM peak, the q4 step's GEMVs), the q4 server resident and streamed (minimum ring, link only) at
# 1 / 16 / 32 / 64 concurrent, 160-token completions, its 96 agents; f16 resident at 16 / 64. Builds every bench
# part 2 runs, and repeat_layers (call 1's two failures: its tool was not built).
source .gpu/common.sh
body() {
stamp start
unpack m
W=/tmp/djinn_qbench; mkdir -p $W
(cd /tmp/m && source bench/lib.sh && WORK=$W DATA=/tmp/shared && make_hf 8b $W/hf_8b $W/make.log) > $R/make.txt 2>&1 &
(cd /tmp/m && make -j14 CRITERION=.crit DATA=/tmp/shared all build/run_tests build/bin/ceilings build/bin/spec_bench build/bin/depth_bench build/bin/qgemm_bench build/bin/qreg_read build/bin/repeat_layers > $R/build_m.log 2>&1; echo rc=$? >> $R/build_m.log)
wait; tail -qn1 $R/build_*.log
stamp built
tests /tmp/m $R/tests.txt 'repeat_layers/*'
(cd /tmp/m && QUANT_ONLY=1 timeout 120 build/bin/ceilings > $R/ceilings.txt 2>&1); grep -E "D2D|GEMM|together" $R/ceilings.txt | head -5
stamp ceilings
(cd /tmp/m && DATA=/tmp/shared DTYPE=q4 CASES="resident_link min_link" CONCURRENCY="1 16 32 64" MAX_TOKENS=160 AGENTS=96 timeout 300 bash bench/serve_bench.sh $R/serve_q4 > $R/serve_q4.log 2>&1)
stamp serve q4; tail -8 $R/serve_q4.log
(cd /tmp/m && DATA=/tmp/shared DTYPE=f16 CASES=resident_link CONCURRENCY="16 64" MAX_TOKENS=160 AGENTS=0 timeout 120 bash bench/serve_bench.sh $R/serve_f16 > $R/serve_f16.log 2>&1)
stamp serve f16; grep -h 'resident_link |' $R/serve_f16.log
df -h /tmp | tail -1
}
export -f body stamp unpack tests build
timeout 560 bash -c "R=$R ROOT=$ROOT; body"
finish
