# written at stop 72 for the next session: issue 47's figures that session 72's call 5 (the servers, streamed, q4
# agents, beside D2D and the link) left out, in one call beside the ceilings: depth 0 / 8k / 32k (depth_bench.sh,
# which runs the full ceilings: D2D and the GEMM peak), the 9-row verification against one row on resident q4
# (spec_bench at 256 positions), the layer's products at T = 2..64 (qgemm_bench, the 8B's four matrices in q4), the
# 512-token prefill in q4 against f16 (quant_bench.sh's prefill case), and f16's agents. Stamps give each step's
# time (none measured yet but the ceilings' quantized section, 7 s). .gpu/common.sh as this session's; main's tree.
source .gpu/common.sh
body() {
stamp start
unpack m
W=/tmp/djinn_qbench; mkdir -p $W
(cd /tmp/m && source bench/lib.sh && WORK=$W DATA=/tmp/shared && make_hf 8b $W/hf_8b $W/make.log) > $R/make.txt 2>&1 &
(cd /tmp/m && make -j14 CRITERION=.crit DATA=/tmp/shared all build/bin/ceilings build/bin/spec_bench build/bin/depth_bench build/bin/qgemm_bench > $R/build_m.log 2>&1; echo rc=$? >> $R/build_m.log)
wait; tail -qn1 $R/build_*.log
stamp built
(cd /tmp/m && source bench/lib.sh && WORK=$W DATA=/tmp/shared && convert_once $W/hf_8b $W/8b_q4.bin q4 && convert_once $W/hf_8b $W/8b_f16.bin f16) >> $R/make.txt 2>&1
ln -sf $W/8b_q4.bin $W/depth_8b_q4.bin
stamp models
(cd /tmp/m && DATA=/tmp/shared TYPES=f16 timeout 200 bash bench/depth_bench.sh $R/depth > $R/depth.log 2>&1); tail -6 $R/depth.log; grep -E "D2D|GEMM" $R/depth/ceilings.txt | head -4
stamp depth
(cd /tmp/m && SPEC_POS=256 timeout 60 build/bin/spec_bench $W/8b_q4.bin $W/8b_q4.bin 100 0 9 7 > $R/spec.json 2> $R/spec.err); grep -o '"decode_step_ms": [0-9.]*' $R/spec.json; grep -o '"verify[^]]*' $R/spec.json | cut -c1-200
stamp spec
(cd /tmp/m && QGEMM_MATRIX=8b QGEMM_DTYPE=q4 timeout 120 build/bin/qgemm_bench $R/qgemm.json 2 4 8 9 16 32 64 > $R/qgemm.txt 2>&1); tail -12 $R/qgemm.txt
stamp qgemm
(cd /tmp/m && DATA=/tmp/shared DTYPES="f16 q4" CASES=prefill SKIP_MAKE=1 timeout 150 bash bench/quant_bench.sh 8b $R/quant > $R/quant.log 2>&1); tail -8 $R/quant.log
stamp prefill
(cd /tmp/m && DATA=/tmp/shared DTYPE=f16 CASES=none AGENTS=96 timeout 150 bash bench/serve_bench.sh $R/serve_f16 > $R/serve_f16.log 2>&1); grep agents $R/serve_f16.log | tail -2
stamp agents
}
export -f body stamp unpack tests
timeout 560 bash -c "R=$R ROOT=$ROOT; body"
finish
