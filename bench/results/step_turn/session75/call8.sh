# session 75 call 8: after the review (store_frag and the warp's ticket shared by qgemm.cu and dense_rows.cu):
# ceilings and drow_bench on the 8B's matrices in one run; the register kernel's and dense rows' tests.
source .gpu/common.sh
body() {
stamp start
unpack v
(cd /tmp/v && make -j16 CRITERION=.crit DATA=/tmp/shared build/run_tests build/bin/ceilings build/bin/drow_bench > $R/build.log 2>&1; echo rc=$? >> $R/build.log); tail -1 $R/build.log
stamp built
(cd /tmp/v && QUANT_ONLY=1 timeout 30 build/bin/ceilings > $R/ceilings.txt 2>&1); grep -E "D2D|GEMM|^f16" $R/ceilings.txt | head -6
(cd /tmp/v && DROW_MATRIX=8b timeout 40 build/bin/drow_bench 2 8 16 > $R/drow.txt 2>&1; echo rc=$? >> $R/drow.txt); cat $R/drow.txt
stamp bench
tests /tmp/v $R/tests.txt 'kernels/matmul_rows' 'kernels/qgemm_register_runs'
}
export -f body stamp unpack tests build
timeout 165 bash -c "R=$R ROOT=$ROOT; body"
finish
