# session 75 call 6: dense_rows.cu as it lands (bf16 at 2-16 tokens in gpu_matmul; slices about one wave): the whole
# suite; drow_bench on the 8B's and 70B's matrices beside the ceilings (the fastest read of the f16 bytes).
source .gpu/common.sh
body() {
stamp start
rm -rf /tmp/r3; unpack r3
(cd /tmp/r3 && make -j14 CRITERION=.crit DATA=/tmp/shared all build/run_tests build/bin/ceilings build/bin/drow_bench build/bin/repeat_layers > $R/build.log 2>&1; echo rc=$? >> $R/build.log); tail -1 $R/build.log
stamp built
(cd /tmp/r3 && QUANT_ONLY=1 timeout 60 build/bin/ceilings > $R/ceilings.txt 2>&1); grep -E "D2D|GEMM|^f16" $R/ceilings.txt | head -8
(cd /tmp/r3 && timeout 150 build/bin/drow_bench > $R/drow.txt 2>&1; echo rc=$? >> $R/drow.txt); cat $R/drow.txt
stamp bench
tests /tmp/r3 $R/suite.txt '*'
grep -B3 -A8 "Assertion\|^\[FAIL" $R/suite.txt | head -40
stamp suite
}
export -f body stamp unpack tests build
timeout 560 bash -c "R=$R ROOT=$ROOT; body"
finish
