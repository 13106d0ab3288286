# written at stop 73 for the next session: exp/wgws (wgws.patch; on exp/normxt, on exp/wgsk2): stream-K Hopper shape
# 20 picked by its estimate and shape 8 at six stages in q4; the prefill's norms inside the Hopper kernel's x layout;
# a warp-specialized Hopper kernel, shape 21, not picked) against main. Its tests (the tile shapes, stream-K runs,
# matmul, swiglu_qgemm, norm_qgemm), then every Hopper shape on the 8B's matrices at 65-2048 tokens and the 70B's at
# 128 / 512 / 2048 in q4 and q8 (does the picker's estimate, fitted on the 8B q4 only, pick the fastest elsewhere? is
# shape 21 the fastest?), then the 512-token prefill main / branch beside f16 (three rounds; DJINN_PROFILE once
# each), then the kernels and gpu_forward suites on the branch. Put wgws.patch at .gpu/nx.patch; main's tree carried.
source .gpu/common.sh
body() {
stamp start
unpack m; unpack nx
W=/tmp/djinn_qbench; mkdir -p $W
(cd /tmp/m && source bench/lib.sh && WORK=$W DATA=/tmp/shared && make_hf 8b $W/hf_8b $W/make.log) > $R/make.txt 2>&1 &
for n in m nx; do (cd /tmp/$n && make -j8 CRITERION=.crit DATA=/tmp/shared all build/run_tests build/bin/qgemm_bench build/bin/repeat_layers build/bin/ceilings > $R/build_$n.log 2>&1; echo rc=$? >> $R/build_$n.log) & done
wait; tail -qn1 $R/build_*.log
stamp built
(cd /tmp/m && QUANT_ONLY=1 timeout 60 build/bin/ceilings > $R/ceilings.txt 2>&1); grep -E "D2D|GEMM 8192" $R/ceilings.txt
stamp ceilings
(cd /tmp/m && source bench/lib.sh && WORK=$W DATA=/tmp/shared && convert_once $W/hf_8b $W/q4.bin q4 && convert_once $W/hf_8b $W/f16.bin f16) >> $R/make.txt 2>&1 &
MP=$!
# a new kernel that waits on barriers could hang: each filter under 120 s here, not tests()'s 500
for f in 'kernels/qgemm*' 'kernels/matmul*' 'kernels/swiglu_qgemm' 'kernels/norm_qgemm'; do
  (cd /tmp/nx && DJINN_DATA=/tmp/shared DJINN_BIN=/tmp/nx/build/bin DJINN_TESTS=/tmp/nx/tests timeout 120 build/run_tests -j4 --filter "$f" >> $R/tests_nx.txt 2>&1; echo "tests $f rc=$?" >> $R/tests_nx.txt)
done
grep -E "Synthesis|rc=|FAIL" $R/tests_nx.txt | head -20
stamp tests
cd /tmp/nx
for dt in q4 q8; do
  QGEMM_ONLY=8,9,10,11,20,21 QGEMM_MATRIX=8b QGEMM_DTYPE=$dt timeout 90 build/bin/qgemm_bench $R/qg8_$dt.json 65 128 192 256 384 512 768 1024 1536 2048 > $R/qg_$dt.txt 2>&1
  QGEMM_ONLY=8,9,10,11,20,21 QGEMM_MATRIX=70b QGEMM_DTYPE=$dt timeout 90 build/bin/qgemm_bench $R/qg70_$dt.json 128 512 2048 >> $R/qg_$dt.txt 2>&1
done
awk '$1 ~ /^(8b|13b|70b|8b_tp2)$/ {print $1,$2,$3,$4,$5,$9,$10,$21,$22,$23,$24,$33,$34}' $R/qg_q4.txt $R/qg_q8.txt
grep MISMATCH $R/qg_*.txt | head
stamp qgemm
wait $MP
LONG=$(printf 'the %.0s' $(seq 511)); LONG=${LONG% }
for r in 1 2 3; do
  (cd /tmp/m && timeout 60 ./djinn $W/f16.bin -t 0 -c 1024 -p "$LONG" -n 4 2>&1 >/dev/null | grep "prefill " | sed "s/^/r$r m f16 /" | tee -a $R/prefill.txt)
  (cd /tmp/m && timeout 60 ./djinn $W/q4.bin -t 0 -c 1024 -p "$LONG" -n 4 2>&1 >/dev/null | grep "prefill " | sed "s/^/r$r m q4 /" | tee -a $R/prefill.txt)
  (cd /tmp/nx && timeout 60 ./djinn $W/q4.bin -t 0 -c 1024 -p "$LONG" -n 4 2>&1 >/dev/null | grep "prefill " | sed "s/^/r$r nx q4 /" | tee -a $R/prefill.txt)
done
for n in m nx; do (cd /tmp/$n && DJINN_PROFILE=1 timeout 60 ./djinn $W/q4.bin -t 0 -c 1024 -p "$LONG" -n 4 2>&1 >/dev/null | grep "profile (prefill" | sed "s/^/$n /" | tee -a $R/prefill.txt); done
stamp prefill
tests /tmp/nx $R/suite_nx.txt 'gpu_forward/*' 'kernels/*'
stamp suite
}
export -f body stamp unpack tests build
timeout 560 bash -c "R=$R ROOT=$ROOT; body"
finish
