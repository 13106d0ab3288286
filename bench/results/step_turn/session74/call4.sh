# session 74 call 4: nx4 (what would land: stream-K 20, norms in the x layout, warp-specialized 21 / 22 with setmaxnreg
# and the producer's cursor, the picker refitted: q4 takes 21 / 22, stream-K charged 5% where x passes half the L2)
# beside main: kernel tests, every Hopper shape, the 512-token prefill (and 2000) beside f16 and the ceilings; the q8
# KV test's tail over 40 fresh seeds; the kernels and gpu_forward suites.
source .gpu/common.sh
body() {
stamp start
unpack m; unpack nx4
W=/tmp/djinn_qbench; mkdir -p $W
(cd /tmp/m && source bench/lib.sh && WORK=$W DATA=/tmp/shared && make_hf 8b $W/hf_8b $W/make.log) > $R/make.txt 2>&1 &
(cd /tmp/m && make -j6 CRITERION=.crit DATA=/tmp/shared all build/bin/ceilings > $R/build_m.log 2>&1; echo rc=$? >> $R/build_m.log) &
(cd /tmp/nx4 && make -j10 CRITERION=.crit DATA=/tmp/shared all build/run_tests build/bin/qgemm_bench build/bin/repeat_layers > $R/build_nx4.log 2>&1; echo rc=$? >> $R/build_nx4.log) &
wait; tail -qn1 $R/build_*.log; grep -B2 -A6 "error" $R/build_nx4.log | head -30
stamp built
(cd /tmp/m && source bench/lib.sh && WORK=$W DATA=/tmp/shared && convert_once $W/hf_8b $W/q4.bin q4 && convert_once $W/hf_8b $W/f16.bin f16) >> $R/make.txt 2>&1 &
MP=$!
(cd /tmp/m && QUANT_ONLY=1 timeout 60 build/bin/ceilings > $R/ceilings.txt 2>&1); grep -E "D2D|GEMM 8192" $R/ceilings.txt
stamp ceilings
for f in 'kernels/qgemm*' 'kernels/matmul*' 'kernels/swiglu_qgemm' 'kernels/norm_qgemm'; do
  (cd /tmp/nx4 && DJINN_DATA=/tmp/shared DJINN_BIN=/tmp/nx4/build/bin DJINN_TESTS=/tmp/nx4/tests timeout 120 build/run_tests -j4 --filter "$f" >> $R/tests_nx4.txt 2>&1; echo "tests $f rc=$?" >> $R/tests_nx4.txt)
done
grep -E "Synthesis|rc=|FAIL" $R/tests_nx4.txt | head -20; grep -B2 -A5 "Assertion" $R/tests_nx4.txt | head -30
stamp tests
cd /tmp/nx4
QGEMM_ONLY=8,9,10,11,20,21,22 QGEMM_MATRIX=8b QGEMM_DTYPE=q4 timeout 90 build/bin/qgemm_bench $R/qg8_q4.json 128 256 384 512 768 1024 1536 2048 > $R/qg_q4.txt 2>&1
QGEMM_ONLY=8,9,10,11,20,21,22 QGEMM_MATRIX=70b QGEMM_DTYPE=q4 timeout 90 build/bin/qgemm_bench $R/qg70_q4.json 128 512 2048 >> $R/qg_q4.txt 2>&1
QGEMM_ONLY=8,9,10,11,20,21,22 QGEMM_MATRIX=8b QGEMM_DTYPE=q8 timeout 90 build/bin/qgemm_bench $R/qg8_q8.json 128 512 1024 > $R/qg_q8.txt 2>&1
awk '$1 ~ /^(8b|70b)$/ {print $1,$2,$3,$4,$5,$9,$10,$21,$22,$23,$24,$33,$34,$35}' $R/qg_q4.txt $R/qg_q8.txt
grep MISMATCH $R/qg_*.txt | head
stamp qgemm
wait $MP
LONG=$(printf 'the %.0s' $(seq 511)); LONG=${LONG% }
for r in 1 2 3; do
  (cd /tmp/m && timeout 60 ./djinn $W/f16.bin -t 0 -c 1024 -p "$LONG" -n 4 2>&1 >/dev/null | grep "prefill " | sed "s/^/r$r m f16 /" | tee -a $R/prefill.txt)
  (cd /tmp/m && timeout 60 ./djinn $W/q4.bin -t 0 -c 1024 -p "$LONG" -n 4 2>&1 >/dev/null | grep "prefill " | sed "s/^/r$r m q4 /" | tee -a $R/prefill.txt)
  (cd /tmp/nx4 && timeout 60 ./djinn $W/q4.bin -t 0 -c 1024 -p "$LONG" -n 4 2>&1 >/dev/null | grep "prefill " | sed "s/^/r$r nx4 q4 /" | tee -a $R/prefill.txt)
done
(cd /tmp/nx4 && DJINN_PROFILE=1 timeout 60 ./djinn $W/q4.bin -t 0 -c 1024 -p "$LONG" -n 4 2>&1 >/dev/null | grep "profile (prefill" | sed "s/^/nx4 /" | tee -a $R/prefill.txt)
L2K=$(printf 'the %.0s' $(seq 1999)); L2K=${L2K% }
for n in m nx4; do (cd /tmp/$n && timeout 60 ./djinn $W/q4.bin -t 0 -c 4096 -p "$L2K" -n 4 2>&1 >/dev/null | grep "prefill " | sed "s/^/2000 $n q4 /" | tee -a $R/prefill.txt); done
(cd /tmp/m && timeout 60 ./djinn $W/f16.bin -t 0 -c 4096 -p "$L2K" -n 4 2>&1 >/dev/null | grep "prefill " | sed "s/^/2000 m f16 /" | tee -a $R/prefill.txt)
stamp prefill
for i in $(seq 40); do (cd /tmp/nx4 && DJINN_DATA=/tmp/shared DJINN_BIN=/tmp/nx4/build/bin DJINN_TESTS=/tmp/nx4/tests timeout 30 build/run_tests --filter 'gpu_forward/matches_cpu_at_each_kv_type' 2>&1 | grep -E "q8 KV|seed" >> $R/kvq8_seeds.txt); done
grep -c "q8 KV" $R/kvq8_seeds.txt; grep "q8 KV" $R/kvq8_seeds.txt | grep -oE "(L2|L2 [0-9.e+-]+) [0-9.e+-]+" | sort -k2 -g | tail -5
stamp kvseeds
tests /tmp/nx4 $R/suite_nx4.txt 'gpu_forward/*' 'kernels/*'
stamp suite
}
export -f body stamp unpack tests build
timeout 560 bash -c "R=$R ROOT=$ROOT; body"
finish
