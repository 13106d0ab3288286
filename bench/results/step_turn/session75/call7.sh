# session 75 call 7: dense_rows.cu's slices at most one wave (the 8B's q|k|v: 5 where 6 made a part second wave):
# kernels/matmul*, drow_bench on the 8B's matrices.
source .gpu/common.sh
body() {
stamp start
rm -rf /tmp/r4; unpack r4
(cd /tmp/r4 && make -j14 CRITERION=.crit DATA=/tmp/shared all build/run_tests build/bin/drow_bench > $R/build.log 2>&1; echo rc=$? >> $R/build.log); tail -1 $R/build.log
stamp built
tests /tmp/r4 $R/tests.txt 'kernels/matmul*'
(cd /tmp/r4 && DROW_MATRIX=8b timeout 100 build/bin/drow_bench > $R/drow.txt 2>&1; echo rc=$? >> $R/drow.txt); cat $R/drow.txt
stamp bench
}
export -f body stamp unpack tests build
timeout 300 bash -c "R=$R ROOT=$ROOT; body"
finish
