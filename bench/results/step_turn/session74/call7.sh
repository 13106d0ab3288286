# session 74 call 7: main + stream-K over 128-token tiles (shape 23) picked up to 128 tokens: the kernels and
# gpu_forward suites; the 8B's and 70B's q4 / q8 products at 65-192 tokens as picked beside every shape.
source .gpu/common.sh
body() {
stamp start
unpack m
(cd /tmp/m && make -j14 CRITERION=.crit DATA=/tmp/shared all build/run_tests build/bin/qgemm_bench build/bin/ceilings build/bin/repeat_layers > $R/build_m.log 2>&1; echo rc=$? >> $R/build_m.log)
tail -qn1 $R/build_*.log; grep -B2 -A6 "error" $R/build_m.log | head -20
stamp built
(cd /tmp/m && QUANT_ONLY=1 timeout 60 build/bin/ceilings > $R/ceilings.txt 2>&1); grep -E "D2D|GEMM 8192" $R/ceilings.txt
tests /tmp/m $R/suite.txt 'kernels/*' 'gpu_forward/*' 'spec*/*'
grep -B2 -A6 "Assertion" $R/suite.txt | head -20
stamp tests
cd /tmp/m
for dt in q4 q8; do
  QGEMM_ONLY=9,10,11,20,21,22,23 QGEMM_MATRIX=8b QGEMM_DTYPE=$dt timeout 60 build/bin/qgemm_bench $R/qg8_$dt.json 65 100 128 160 192 > $R/qg_$dt.txt 2>&1
  QGEMM_ONLY=9,10,11,20,21,22,23 QGEMM_MATRIX=70b QGEMM_DTYPE=$dt timeout 60 build/bin/qgemm_bench $R/qg70_$dt.json 65 128 >> $R/qg_$dt.txt 2>&1
done
awk '$1 ~ /^(8b|70b)$/ {print $1,$2,$3,$4,$5,$8,$9,$10,$22,$23,$24,$33,$34,$35,$36}' $R/qg_q4.txt $R/qg_q8.txt
grep MISMATCH $R/qg_*.txt | head
stamp qgemm
}
export -f body stamp unpack tests build
timeout 400 bash -c "R=$R ROOT=$ROOT; body"
finish
