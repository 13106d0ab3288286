# session 75 call 3: issue 47's targets, part 2 (right after call 2 on the same machine; rebuilds and remakes what
# is missing if the machine came back bare): depth 0 / 8k / 32k (depth_bench.sh: full ceilings, D2D and the GEMM
# peak), the 9-row verification on resident q4 (spec_bench, 256 positions), the layer's q4 products at T = 1..64
# (qgemm_bench) beside the fastest read of their bytes (ceilings QUANT_ONLY), the register kernel's body alone on
# staged bytes (qreg_read), the 512-token prefill q4 / f16 (five rounds), f16's 96 agents.
source .gpu/common.sh
body() {
stamp start
unpack m
W=/tmp/djinn_qbench; mkdir -p $W
(cd /tmp/m && source bench/lib.sh && WORK=$W DATA=/tmp/shared && make_hf 8b $W/hf_8b $W/make.log) > $R/make.txt 2>&1 &
(cd /tmp/m && make -j14 CRITERION=.crit DATA=/tmp/shared all build/bin/ceilings build/bin/spec_bench build/bin/depth_bench build/bin/qgemm_bench build/bin/qreg_read > $R/build_m.log 2>&1; echo rc=$? >> $R/build_m.log)
wait; tail -qn1 $R/build_*.log
(cd /tmp/m && source bench/lib.sh && WORK=$W DATA=/tmp/shared && convert_once $W/hf_8b $W/serve_8b_q4.bin q4 && convert_once $W/hf_8b $W/serve_8b_f16.bin f16) >> $R/make.txt 2>&1
ln -sf $W/serve_8b_q4.bin $W/depth_8b_q4.bin
stamp built
(cd /tmp/m && QUANT_ONLY=1 timeout 120 build/bin/ceilings > $R/ceilings.txt 2>&1); grep -E "D2D|GEMM|together" $R/ceilings.txt | head -5
(cd /tmp/m && DATA=/tmp/shared TYPES=f16 SKIP_MAKE=1 timeout 200 bash bench/depth_bench.sh $R/depth > $R/depth.log 2>&1); tail -6 $R/depth.log; grep -E "D2D|GEMM" $R/depth/ceilings.txt | head -4
stamp depth
(cd /tmp/m && SPEC_POS=256 timeout 60 build/bin/spec_bench $W/serve_8b_q4.bin $W/serve_8b_q4.bin 100 0 9 7 > $R/spec.json 2> $R/spec.err); grep -o '"decode_step_ms": [0-9.]*' $R/spec.json; grep -o '"verify[^]]*' $R/spec.json | cut -c1-200
stamp spec
(cd /tmp/m && QGEMM_ONLY=12,13,17,18 QGEMM_MATRIX=8b QGEMM_DTYPE=q4 timeout 120 build/bin/qgemm_bench $R/qgemm.json 1 2 4 8 9 16 32 64 > $R/qgemm.txt 2>&1); awk '$1 == "8b" {print $2,$4,$5,$9}' $R/qgemm.txt
(cd /tmp/m && timeout 90 build/bin/qreg_read > $R/qreg_read.txt 2>&1); grep -E "sequential|WD [12]" $R/qreg_read.txt
stamp qgemm
LONG=$(printf 'the %.0s' $(seq 511)); LONG=${LONG% }
for r in 1 2 3 4 5; do for t in f16 q4; do
  (cd /tmp/m && timeout 60 ./djinn $W/serve_8b_$t.bin -t 0 -c 1024 -p "$LONG" -n 4 2>&1 >/dev/null | grep "prefill " | sed "s/^/r$r $t /" | tee -a $R/prefill.txt)
done; done
stamp prefill
(cd /tmp/m && DATA=/tmp/shared DTYPE=f16 CASES=none AGENTS=96 SKIP_MAKE=1 timeout 150 bash bench/serve_bench.sh $R/serve_f16 > $R/serve_f16.log 2>&1); grep agents $R/serve_f16.log | tail -2
(cd /tmp/m && QUANT_ONLY=1 timeout 120 build/bin/ceilings > $R/ceilings2.txt 2>&1); grep -E "D2D|GEMM" $R/ceilings2.txt | head -3
stamp agents
}
export -f body stamp unpack tests build
timeout 560 bash -c "R=$R ROOT=$ROOT; body"
finish
