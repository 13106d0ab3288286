# session 75 call 1: main (6143cb6's refactor, verified only by PTX) whole suite; exp/wss (ws stream-K on 16/32/64-token
# blocks, shapes 24-26) against the register kernel 12-19 and the GEMV at 1-64 tokens; exp/wsst's shapes 20-22 at 256-2048.
source .gpu/common.sh
body() {
stamp start
unpack m; unpack wss; unpack wsst
for n in m wss wsst; do (cd /tmp/$n && make -j5 CRITERION=.crit DATA=/tmp/shared all build/run_tests build/bin/qgemm_bench build/bin/ceilings > $R/build_$n.log 2>&1; echo rc=$? >> $R/build_$n.log) & done
wait; tail -qn1 $R/build_*.log
stamp built
(cd /tmp/m && QUANT_ONLY=1 timeout 60 build/bin/ceilings > $R/ceilings.txt 2>&1); grep -E "D2D|GEMM 8192|read us" $R/ceilings.txt | head -4
tests /tmp/m $R/suite.txt '*'
grep -B3 -A8 "Assertion\|^\[FAIL" $R/suite.txt | head -40
stamp suite
for n in wss wsst; do (cd /tmp/$n && DJINN_DATA=/tmp/shared DJINN_BIN=/tmp/$n/build/bin DJINN_TESTS=/tmp/$n/tests timeout 150 build/run_tests -j4 --filter 'kernels/qgemm*' > $R/tests_$n.txt 2>&1; echo "rc=$?" >> $R/tests_$n.txt); grep -E "Synthesis|rc=" $R/tests_$n.txt | sed "s/^/$n /"; grep -B2 -A5 "Assertion" $R/tests_$n.txt | head -20; done
stamp tests
cd /tmp/wss
for dt in q4 q8; do QGEMM_ONLY=12,13,14,15,16,17,18,19,22,24,25,26 QGEMM_MATRIX=8b QGEMM_DTYPE=$dt timeout 100 build/bin/qgemm_bench $R/qg_$dt.json 1 2 4 8 9 16 32 64 > $R/qg_$dt.txt 2>&1; done
awk '$1 == "8b" {print $1,$2,$3,$4,$7,$9,$10,$35,$37,$38,$39}' $R/qg_q4.txt $R/qg_q8.txt
grep MISMATCH $R/qg_*.txt | head
stamp qgemm
for r in 1 2; do for n in m wsst; do (cd /tmp/$n && QGEMM_ONLY=20,21,22 QGEMM_MATRIX=8b QGEMM_DTYPE=q4 timeout 50 build/bin/qgemm_bench $R/qgst_${n}_$r.json 256 512 1024 2048 > $R/qgst_${n}_$r.txt 2>&1); awk -v n=$n '$1 == "8b" {print n,$2,$4,$5,$8,$33,$34,$35}' $R/qgst_${n}_$r.txt; done; done
(cd /tmp/m && QUANT_ONLY=1 timeout 60 build/bin/ceilings > $R/ceilings2.txt 2>&1); grep -E "D2D|GEMM 8192" $R/ceilings2.txt
stamp wsst
}
export -f body stamp unpack tests build
timeout 560 bash -c "R=$R ROOT=$ROOT; body"
finish
