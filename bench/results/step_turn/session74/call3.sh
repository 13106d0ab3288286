# session 74 call 3 (n74c: as call 2 with nx3: shape 21 without setmaxnreg, 22 stream-K with it, 23 whole tiles with it; the producer's cursor)
# session 74 call 2: nx3 = nx (stream-K shape 20, norms in the x layout, warp-specialized 21) + warp-specialized
# stream-K (shape 22), setmaxnreg between producer and consumers, the picker taking 21/22 for q4. Tests (each under
# 120 s), every Hopper shape on 8B / 70B q4 and q8, prefill main/nx3 beside f16 (three rounds), the suites.
source .gpu/common.sh
body() {
stamp start
unpack m; unpack nx3
W=/tmp/djinn_qbench; mkdir -p $W
(cd /tmp/m && source bench/lib.sh && WORK=$W DATA=/tmp/shared && make_hf 8b $W/hf_8b $W/make.log) > $R/make.txt 2>&1 &
(cd /tmp/m && make -j6 CRITERION=.crit DATA=/tmp/shared all build/run_tests build/bin/ceilings > $R/build_m.log 2>&1; echo rc=$? >> $R/build_m.log) &
(cd /tmp/nx3 && make -j10 CRITERION=.crit DATA=/tmp/shared all build/run_tests build/bin/qgemm_bench build/bin/repeat_layers > $R/build_nx3.log 2>&1; echo rc=$? >> $R/build_nx3.log) &
wait; tail -qn1 $R/build_*.log; grep -B2 -A6 "error" $R/build_nx3.log | head -30
stamp built
(cd /tmp/m && source bench/lib.sh && WORK=$W DATA=/tmp/shared && convert_once $W/hf_8b $W/q4.bin q4 && convert_once $W/hf_8b $W/f16.bin f16) >> $R/make.txt 2>&1 &
MP=$!
(cd /tmp/m && QUANT_ONLY=1 timeout 60 build/bin/ceilings > $R/ceilings.txt 2>&1); grep -E "D2D|GEMM 8192" $R/ceilings.txt
stamp ceilings
for f in 'kernels/qgemm*' 'kernels/matmul*' 'kernels/swiglu_qgemm' 'kernels/norm_qgemm'; do
  (cd /tmp/nx3 && DJINN_DATA=/tmp/shared DJINN_BIN=/tmp/nx3/build/bin DJINN_TESTS=/tmp/nx3/tests timeout 120 build/run_tests -j4 --filter "$f" >> $R/tests_nx3.txt 2>&1; echo "tests $f rc=$?" >> $R/tests_nx3.txt)
done
grep -E "Synthesis|rc=|FAIL" $R/tests_nx3.txt | head -20; grep -B2 -A5 "Assertion" $R/tests_nx3.txt | head -30
stamp tests
cd /tmp/nx3
for dt in q4 q8; do [ $dt = q8 ] && QM=8b || QM="8b 70b"
  QGEMM_ONLY=8,9,10,11,20,21,22,23 QGEMM_MATRIX=8b QGEMM_DTYPE=$dt timeout 90 build/bin/qgemm_bench $R/qg8_$dt.json 128 256 512 1024 2048 > $R/qg_$dt.txt 2>&1
  [ $dt = q4 ] && QGEMM_ONLY=8,9,10,11,20,21,22,23 QGEMM_MATRIX=70b QGEMM_DTYPE=$dt timeout 90 build/bin/qgemm_bench $R/qg70_$dt.json 128 512 2048 >> $R/qg_$dt.txt 2>&1
done
awk '$1 ~ /^(8b|70b)$/ {print $1,$2,$3,$4,$5,$9,$10,$21,$22,$23,$24,$33,$34,$35,$36}' $R/qg_q4.txt $R/qg_q8.txt
grep MISMATCH $R/qg_*.txt | head
stamp qgemm
wait $MP
LONG=$(printf 'the %.0s' $(seq 511)); LONG=${LONG% }
for r in 1 2 3; do
  (cd /tmp/m && timeout 60 ./djinn $W/f16.bin -t 0 -c 1024 -p "$LONG" -n 4 2>&1 >/dev/null | grep "prefill " | sed "s/^/r$r m f16 /" | tee -a $R/prefill.txt)
  (cd /tmp/m && timeout 60 ./djinn $W/q4.bin -t 0 -c 1024 -p "$LONG" -n 4 2>&1 >/dev/null | grep "prefill " | sed "s/^/r$r m q4 /" | tee -a $R/prefill.txt)
  (cd /tmp/nx3 && timeout 60 ./djinn $W/q4.bin -t 0 -c 1024 -p "$LONG" -n 4 2>&1 >/dev/null | grep "prefill " | sed "s/^/r$r nx3 q4 /" | tee -a $R/prefill.txt)
done
(cd /tmp/nx3 && DJINN_PROFILE=1 timeout 60 ./djinn $W/q4.bin -t 0 -c 1024 -p "$LONG" -n 4 2>&1 >/dev/null | grep "profile (prefill" | sed "s/^/nx3 /" | tee -a $R/prefill.txt)
stamp prefill
tests /tmp/nx3 $R/suite_nx3.txt 'gpu_forward/*' 'kernels/*'
stamp suite
for n in m nx3; do (cd /tmp/$n && DJINN_SEED=1803984614745467 DJINN_DATA=/tmp/shared DJINN_BIN=/tmp/$n/build/bin DJINN_TESTS=/tmp/$n/tests timeout 60 build/run_tests --filter 'gpu_forward/matches_cpu_at_each_kv_type' 2>&1 | grep -E "Synthesis|rel L2 .* >" | sed "s/^/$n seed: /"); done
}
export -f body stamp unpack tests build
timeout 560 bash -c "R=$R ROOT=$ROOT; body"
finish
