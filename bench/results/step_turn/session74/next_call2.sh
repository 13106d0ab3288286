# written at stop 74 for the next session: exp/wssmall (next_wssmall.patch at .gpu/wss.patch): the warp-specialized
# stream-K kernel on small token blocks (shapes 24 / 25 / 26: 16 / 32 / 64 tokens, m64nBNk16, eight stages): the
# producer warpgroup streams and widens the weights, the product itself is small, so a few-row pass could run at the
# rate the producer widens and the bytes arrive. Against the register kernel's shapes (12-19, what gpu_matmul runs)
# and the one-token GEMV on the 8B's q4 / q8 matrices at 2-64 tokens; its tests first (each under 150 s).
source .gpu/common.sh
body() {
stamp start
unpack wss
(cd /tmp/wss && make -j16 CRITERION=.crit DATA=/tmp/shared all build/run_tests build/bin/qgemm_bench build/bin/ceilings > $R/build.log 2>&1; echo rc=$? >> $R/build.log); tail -1 $R/build.log
stamp built
(cd /tmp/wss && QUANT_ONLY=1 timeout 60 build/bin/ceilings > $R/ceilings.txt 2>&1); grep -E "D2D|GEMM 8192|read us" $R/ceilings.txt | head -4
(cd /tmp/wss && DJINN_DATA=/tmp/shared DJINN_BIN=/tmp/wss/build/bin DJINN_TESTS=/tmp/wss/tests timeout 150 build/run_tests -j4 --filter 'kernels/qgemm*' > $R/tests.txt 2>&1; echo "rc=$?" >> $R/tests.txt); grep -E "Synthesis|rc=" $R/tests.txt; grep -B2 -A5 "Assertion" $R/tests.txt | head -20
stamp tests
cd /tmp/wss
for dt in q4 q8; do QGEMM_ONLY=12,13,14,15,16,17,18,19,22,24,25,26 QGEMM_MATRIX=8b QGEMM_DTYPE=$dt timeout 120 build/bin/qgemm_bench $R/qg_$dt.json 1 2 4 8 9 16 32 64 > $R/qg_$dt.txt 2>&1; done
# model matrix dt T | gemv, matmul (the engine's), best | 22, 24, 25, 26
awk '$1 == "8b" {print $1,$2,$3,$4,$7,$9,$10,$35,$37,$38,$39}' $R/qg_q4.txt $R/qg_q8.txt
grep MISMATCH $R/qg_*.txt | head
stamp qgemm
}
export -f body stamp unpack tests build
timeout 560 bash -c "R=$R ROOT=$ROOT; body"
finish
