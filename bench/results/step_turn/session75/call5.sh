# session 75 call 5: dense_rows.cu with the group's x loaded before its products and the loads kept in order
# (volatile, selects in place of branches): kernels/matmul*, drow_bench on the 8B; the flaky kv_types seed on main
# (call 1's tree at /tmp/m if the machine is warm, else rebuilt) and here.
source .gpu/common.sh
body() {
stamp start
rm -rf /tmp/r2; unpack r2
(cd /tmp/r2 && make -j14 CRITERION=.crit DATA=/tmp/shared all build/run_tests build/bin/ceilings build/bin/drow_bench > $R/build.log 2>&1; echo rc=$? >> $R/build.log); tail -1 $R/build.log
stamp built
tests /tmp/r2 $R/tests.txt 'kernels/matmul*'
grep -B2 -A6 "Assertion" $R/tests.txt | head -30
(cd /tmp/r2 && DROW_MATRIX=8b timeout 120 build/bin/drow_bench 2 4 8 9 16 32 > $R/drow.txt 2>&1; echo rc=$? >> $R/drow.txt); cat $R/drow.txt
stamp bench
for d in /tmp/r2 /tmp/r; do (cd $d && DJINN_SEED=1801702392839478 DJINN_DATA=/tmp/shared DJINN_BIN=$d/build/bin DJINN_TESTS=$d/tests timeout 100 build/run_tests --filter 'gpu_forward/kv_types_near_the_f32_cache' 2>&1 | grep -E "worst|Synthesis" | sed "s|^|$d |"); done
stamp seed
}
export -f body stamp unpack tests build
timeout 560 bash -c "R=$R ROOT=$ROOT; body"
finish
