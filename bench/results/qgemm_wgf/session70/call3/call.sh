# session 70 call 3: exp/wgf correctness (kernels/qgemm*) and the 8B matrices at 8, 9, 16 tokens against the
# register kernel's shapes 12, 13 (qgemm_bench; the engine's choice is 'matmul us')
source .gpu/common.sh
stamp start
unpack wgf
D=/tmp/wgf
(cd $D && make -j16 CRITERION=.crit DATA=/tmp/shared build/run_tests build/bin/qgemm_bench build/bin/ceilings > $R/build.log 2>&1; echo rc=$? >> $R/build.log); tail -3 $R/build.log
stamp built
tests $D $R/tests.log 'kernels/qgemm*'
grep -E "FAIL|Assert|differs|far" $R/tests.log | head -20
stamp tests
(cd $D && QGEMM_MATRIX=8b QGEMM_DTYPE=q4 QGEMM_ONLY=12,13,20,21 timeout 150 build/bin/qgemm_bench $R/q4.json 8 9 16 > $R/q4.txt 2>&1); cat $R/q4.txt | cut -c1-250
stamp q4
(cd $D && QGEMM_MATRIX=8b QGEMM_DTYPE=q8 QGEMM_ONLY=12,13,20,21 timeout 100 build/bin/qgemm_bench $R/q8.json 8 16 > $R/q8.txt 2>&1); grep -E "^ *8b" $R/q8.txt | cut -c1-250
stamp q8
(cd $D && QUANT_ONLY=1 timeout 100 build/bin/ceilings > $R/ceilings.txt 2>&1); grep -iE "d2d|layer" $R/ceilings.txt | head -8
stamp ceil
finish
