#!/usr/bin/env bash
# Written after the session's last device call (not yet run): the persistent GEMV for 2-8 tokens with two rows a warp
# (qpnr.patch: QP_NR_MULTI=2; before, NT > 1 took one row a warp, so every lane read each token's x record from shared
# memory for a single row: 2.5 bytes of shared memory a weight a token, about 18 us of the H200's shared-memory rate for
# gate|up at 2 tokens, where the pass takes 30 against 15.6 at one token). ptxas: 112-128 registers for NT 2-8 (one
# variant spills 40 bytes); four rows a warp spill kilobytes. On the GPU machine, from a checkout of main with the patch
# applied (git apply bench/results/qgemm_reg/session65/qpnr.patch):
#   CRITERION=DIR DJINN_DATA=SHARED bash bench/results/qgemm_reg/session65/next_call.sh OUT_DIR   (CRITERION: a
# Criterion unpacked in DIR where the machine has none; DJINN_DATA: the shared folder)
set -u
out=${1:?out dir}; mkdir -p "$out"
rm -rf /tmp/nr2 && cp -a . /tmp/nr2
make -j7 build/bin/qgemm_bench > "$out/build.log" 2>&1 &
(cd /tmp/nr2 && make -j7 NVEXTRA=-DQP_NR_MULTI=2 all build/run_tests build/bin/qgemm_bench > "$out/build_nr2.log" 2>&1) &
wait
for r in 1 2; do
    for t in . /tmp/nr2; do
        n=$(basename "$t"); [ "$n" = . ] && n=nr1
        (cd "$t" && QGEMM_MATRIX=8b QGEMM_ONLY=12,13 build/bin/qgemm_bench /tmp/q.json 2 3 4 8 > "$out/q_${n}_$r.txt" 2>&1)
    done
done
grep -h -E '^8b' "$out"/q_nr*_1.txt | awk '{print $1, $2, $3, $4, "gemv", $7, "matmul", $9}'
(cd /tmp/nr2 && DJINN_DATA=${DJINN_DATA:-/tmp/shared} DJINN_BIN=/tmp/nr2/build/bin DJINN_TESTS=/tmp/nr2/tests \
    build/run_tests --filter 'kernels/matmul_few_tokens' > "$out/tests.log" 2>&1;
 build/run_tests --filter 'kernels/gemv_rows_a_warp' >> "$out/tests.log" 2>&1; grep Synthesis "$out/tests.log")
