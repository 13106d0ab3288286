# session 74 call 6: exp/sk128: stream-K with 128-token tiles (shape 23: two CTAs a multiprocessor, four stages;
# 24: one, six) beside shapes 10, 11, 20, 22 at 65-256 tokens; the qgemm tests.
source .gpu/common.sh
body() {
stamp start
unpack sk
(cd /tmp/sk && make -j14 CRITERION=.crit DATA=/tmp/shared all build/run_tests build/bin/qgemm_bench build/bin/ceilings > $R/build_sk.log 2>&1; echo rc=$? >> $R/build_sk.log)
tail -qn1 $R/build_*.log; grep -B2 -A6 "error" $R/build_sk.log | head -20
stamp built
(cd /tmp/sk && QUANT_ONLY=1 timeout 60 build/bin/ceilings > $R/ceilings.txt 2>&1); grep -E "D2D|GEMM 8192" $R/ceilings.txt
(cd /tmp/sk && DJINN_DATA=/tmp/shared DJINN_BIN=/tmp/sk/build/bin DJINN_TESTS=/tmp/sk/tests timeout 150 build/run_tests -j4 --filter 'kernels/qgemm*' > $R/tests_sk.txt 2>&1; echo "rc=$?" >> $R/tests_sk.txt)
grep -E "Synthesis|rc=" $R/tests_sk.txt; grep -B2 -A5 "Assertion" $R/tests_sk.txt | head -20
stamp tests
cd /tmp/sk
for dt in q4 q8; do
  QGEMM_ONLY=10,11,20,22,23,24 QGEMM_MATRIX=8b QGEMM_DTYPE=$dt timeout 60 build/bin/qgemm_bench $R/qg8_$dt.json 65 96 128 192 256 384 > $R/qg_$dt.txt 2>&1
  QGEMM_ONLY=10,11,20,22,23,24 QGEMM_MATRIX=70b QGEMM_DTYPE=$dt timeout 60 build/bin/qgemm_bench $R/qg70_$dt.json 65 128 256 >> $R/qg_$dt.txt 2>&1
done
awk '$1 ~ /^(8b|70b)$/ {print $1,$2,$3,$4,$5,$8,$10,$23,$24,$33,$35,$36,$37}' $R/qg_q4.txt $R/qg_q8.txt
grep MISMATCH $R/qg_*.txt | head
stamp qgemm
}
export -f body stamp unpack tests build
timeout 400 bash -c "R=$R ROOT=$ROOT; body"
finish
