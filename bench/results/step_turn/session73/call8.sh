# session 73 call 8: exp/wgsk, the finisher 16 sums at a time, as call 7 (q4 only, two rounds)
# multiprocessor): its kernel tests, then every wgmma shape on the 8B's matrices at 128-2048 tokens (q4, q8), then
# the 512-token prefill: main f16, main q4, exp q4 with QGEMM_SK=10 (three rounds each).
source .gpu/common.sh
body() {
stamp start
unpack m; unpack sk
W=/tmp/djinn_qbench; mkdir -p $W
(cd /tmp/m && source bench/lib.sh && WORK=$W DATA=/tmp/shared && make_hf 8b $W/hf_8b $W/make.log) > $R/make.txt 2>&1 &
for n in m sk; do (cd /tmp/$n && make -j8 CRITERION=.crit DATA=/tmp/shared all build/run_tests build/bin/qgemm_bench > $R/build_$n.log 2>&1; echo rc=$? >> $R/build_$n.log) & done
wait; tail -qn1 $R/build_*.log
stamp built
(cd /tmp/m && source bench/lib.sh && WORK=$W DATA=/tmp/shared && convert_once $W/hf_8b $W/q4.bin q4 && convert_once $W/hf_8b $W/f16.bin f16) >> $R/make.txt 2>&1 &
MP=$!
tests /tmp/sk $R/tests_sk.txt 'kernels/qgemm*' 'kernels/matmul*' 'kernels/swiglu_qgemm'
grep -B3 -A8 "Assertion\|FAIL\|MISMATCH" $R/tests_sk.txt | head -40
stamp tests
cd /tmp/sk
for dt in q4; do QGEMM_ONLY=8,9,10,11 QGEMM_MATRIX=8b QGEMM_DTYPE=$dt timeout 100 build/bin/qgemm_bench $R/qg_$dt.json 128 256 512 1024 2048 > $R/qg_$dt.txt 2>&1; done
awk "{print \$1,\$2,\$3,\$4,\$5,\$21,\$22,\$23,\$24}" $R/qg_q4.txt $R/qg_q8.txt
grep MISMATCH $R/qg_*.txt | head
stamp qgemm
wait $MP
LONG=$(printf 'the %.0s' $(seq 511)); LONG=${LONG% }
for r in 1 2; do
  (cd /tmp/m && timeout 60 ./djinn $W/f16.bin -t 0 -c 1024 -p "$LONG" -n 4 2>&1 >/dev/null | grep "prefill " | sed "s/^/r$r m f16 /" | tee -a $R/prefill.txt)
  (cd /tmp/m && timeout 60 ./djinn $W/q4.bin -t 0 -c 1024 -p "$LONG" -n 4 2>&1 >/dev/null | grep "prefill " | sed "s/^/r$r m q4 /" | tee -a $R/prefill.txt)
  (cd /tmp/sk && QGEMM_SK=10 timeout 60 ./djinn $W/q4.bin -t 0 -c 1024 -p "$LONG" -n 4 2>&1 >/dev/null | grep "prefill " | sed "s/^/r$r sk q4 /" | tee -a $R/prefill.txt)
  (cd /tmp/sk && QGEMM_SK=11 timeout 60 ./djinn $W/q4.bin -t 0 -c 1024 -p "$LONG" -n 4 2>&1 >/dev/null | grep "prefill " | sed "s/^/r$r sk11 q4 /" | tee -a $R/prefill.txt)
done
(cd /tmp/sk && QGEMM_SK=11 DJINN_PROFILE=1 timeout 60 ./djinn $W/q4.bin -t 0 -c 1024 -p "$LONG" -n 4 2>&1 >/dev/null | grep "profile (prefill")
stamp prefill
}
export -f body stamp unpack tests build
timeout 560 bash -c "R=$R ROOT=$ROOT; body"
finish
