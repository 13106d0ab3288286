# written at stop 74 for the next session: exp/wsst (next_wsst.patch at .gpu/wsst.patch): the warp-specialized
# producer's widened tile stored by st.shared.v4 where the compiler emitted generic st.v4 (its pointer comes from an
# aligned cast of the dynamic shared memory; call 8 counted 11.4M shared-store wavefronts, about 3x the 3.7M its
# 16-byte stores need, 2.1M of them bank conflicts). Shapes 21 / 22 main against wsst on the 8B q4 matrices at
# 256-2048 tokens, Nsight Compute's store wavefronts and stalls on both, then the 512-token prefill beside f16.
source .gpu/common.sh
body() {
stamp start
unpack m; unpack wsst
W=/tmp/djinn_qbench; mkdir -p $W
(cd /tmp/m && source bench/lib.sh && WORK=$W DATA=/tmp/shared && make_hf 8b $W/hf_8b $W/make.log) > $R/make.txt 2>&1 &
for n in m wsst; do (cd /tmp/$n && make -j8 CRITERION=.crit DATA=/tmp/shared all build/run_tests build/bin/qgemm_bench build/bin/ceilings > $R/build_$n.log 2>&1; echo rc=$? >> $R/build_$n.log) & done
wait; tail -qn1 $R/build_*.log
stamp built
(cd /tmp/m && source bench/lib.sh && WORK=$W DATA=/tmp/shared && convert_once $W/hf_8b $W/q4.bin q4 && convert_once $W/hf_8b $W/f16.bin f16) >> $R/make.txt 2>&1 &
MP=$!
(cd /tmp/m && QUANT_ONLY=1 timeout 60 build/bin/ceilings > $R/ceilings.txt 2>&1); grep -E "D2D|GEMM 8192" $R/ceilings.txt
(cd /tmp/wsst && DJINN_DATA=/tmp/shared DJINN_BIN=/tmp/wsst/build/bin DJINN_TESTS=/tmp/wsst/tests timeout 150 build/run_tests -j4 --filter 'kernels/qgemm*' > $R/tests_wsst.txt 2>&1; echo "rc=$?" >> $R/tests_wsst.txt); grep -E "Synthesis|rc=" $R/tests_wsst.txt
stamp tests
for r in 1 2; do for n in m wsst; do (cd /tmp/$n && QGEMM_ONLY=20,21,22 QGEMM_MATRIX=8b QGEMM_DTYPE=q4 timeout 60 build/bin/qgemm_bench $R/qg_${n}_$r.json 256 512 1024 2048 > $R/qg_${n}_$r.txt 2>&1); awk -v n=$n '$1 == "8b" {print n,$2,$4,$5,$8,$33,$34,$35}' $R/qg_${n}_$r.txt; done; done
stamp qgemm
for n in m wsst; do (cd /tmp/$n && QGEMM_MATRIX=8b:gate_up QGEMM_DTYPE=q4 QGEMM_ONLY=21 timeout 90 ncu --cache-control none --clock-control none -k regex:ws --launch-skip 3 --launch-count 1 --set full --page raw build/bin/qgemm_bench $R/ncu_$n.json 512 > $R/ncu_$n.txt 2>&1); grep -E "gpu__time_duration.sum|pipe_tensor_cycles_active.avg.pct|mem_shared_op_st.sum" $R/ncu_$n.txt | sed "s/^/$n /"; done
stamp ncu
wait $MP
LONG=$(printf 'the %.0s' $(seq 511)); LONG=${LONG% }
for r in 1 2 3; do
  (cd /tmp/m && timeout 60 ./djinn $W/f16.bin -t 0 -c 1024 -p "$LONG" -n 4 2>&1 >/dev/null | grep "prefill " | sed "s/^/r$r m f16 /" | tee -a $R/prefill.txt)
  for n in m wsst; do (cd /tmp/$n && timeout 60 ./djinn $W/q4.bin -t 0 -c 1024 -p "$LONG" -n 4 2>&1 >/dev/null | grep "prefill " | sed "s/^/r$r $n q4 /" | tee -a $R/prefill.txt); done
done
stamp prefill
}
export -f body stamp unpack tests build
timeout 560 bash -c "R=$R ROOT=$ROOT; body"
finish
