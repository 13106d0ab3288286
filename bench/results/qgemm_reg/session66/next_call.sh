#!/usr/bin/env bash
# Written in session 66 (no device time left to run it): the Hopper kernel (wgmma, A = the weights widened in
# registers, B = x read by descriptor from the 128-byte-swizzled stage) on 8-32 tokens, as shapes 20-24 of
# wg16.patch: (id, BN, ST, KS, XB, MINB) = (20, 8, 4, 4, bulk x, 3), (21, 16, 4, 4, ., 2), (22, 16, 4, 8, ., 2),
# (23, 16, 4, 4, ., 3), (24, 32, 4, 4, ., 2). ptxas: 64-72 registers at BN 8-16, 80 at 32, no spills: up to three
# CTAs (24 warps) a multiprocessor where the register kernel holds 8. The question: does an asynchronous product (the
# warp widens the next stage while the tensor cores work, no x loads, one instruction a 64 x BN x 16 product) and
# three times the warps move the 8-16 token products toward their bytes? The inputs are split KS ways and summed by
# atomics (not deterministic: an experiment; tests/test_kernels.c's twice-the-same-bits check will flag 20-24).
# On the GPU machine, from a checkout of main: git apply bench/results/qgemm_reg/session66/wg16.patch, then
#   CRITERION=DIR bash bench/results/qgemm_reg/session66/next_call.sh OUT_DIR
set -u
out=${1:?out dir}; mkdir -p "$out"
make -j15 ${CRITERION:+CRITERION=$CRITERION} build/bin/qgemm_bench build/bin/ceilings > "$out/build.log" 2>&1 || { tail -5 "$out/build.log"; exit 1; }
build/bin/ceilings > "$out/ceilings.txt" 2>&1
for r in 1 2; do
    for dt in q4 q8; do
        QGEMM_MATRIX=8b QGEMM_DTYPE=$dt QGEMM_ONLY=12,13,17,20,21,22,23,24 timeout 120 build/bin/qgemm_bench /tmp/q.json 4 8 9 12 16 32 \
            > "$out/q_${dt}_$r.txt" 2>&1
    done
done
# the variant columns: v is awk field 13 + v
grep -h -E '^8b|MISMATCH|err' "$out"/q_q4_1.txt | awk '{printf "%s %s T=%s v12=%s v13=%s v17=%s v20=%s v21=%s v22=%s v23=%s v24=%s\n", $2,$3,$4,$25,$26,$30,$33,$34,$35,$36,$37}'
