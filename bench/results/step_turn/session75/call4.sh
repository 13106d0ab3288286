# session 75 call 4: dense_rows.cu (f16 / bf16 products of 2-32 tokens, W read once) in the working tree: its test,
# the kernels and the GPU model paths' tests; drow_bench (cuBLAS against the kernel at its slices and at 1-16) on the
# 8B's and 70B's matrices beside the ceilings (the fastest read of f16 bytes).
source .gpu/common.sh
body() {
stamp start
unpack r
(cd /tmp/r && make -j14 CRITERION=.crit DATA=/tmp/shared all build/run_tests build/bin/ceilings build/bin/drow_bench > $R/build.log 2>&1; echo rc=$? >> $R/build.log); tail -1 $R/build.log
stamp built
tests /tmp/r $R/tests.txt 'kernels/matmul*'
grep -B2 -A6 "Assertion" $R/tests.txt | head -30
stamp tests1
(cd /tmp/r && QUANT_ONLY=1 timeout 60 build/bin/ceilings > $R/ceilings.txt 2>&1); grep -E "D2D|GEMM|^f16" $R/ceilings.txt | head -8
(cd /tmp/r && timeout 200 build/bin/drow_bench 2 4 8 9 16 32 > $R/drow.txt 2>&1; echo rc=$? >> $R/drow.txt); cat $R/drow.txt
stamp bench
tests /tmp/r $R/tests2.txt 'kernels/*' 'gpu_forward/*' 'spec*/*' 'server/gpu_*' 'tp*/*' 'batch*/*'
grep -B2 -A6 "Assertion" $R/tests2.txt | head -30
stamp tests2
}
export -f body stamp unpack tests build
timeout 560 bash -c "R=$R ROOT=$ROOT; body"
finish
