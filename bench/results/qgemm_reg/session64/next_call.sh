#!/usr/bin/env bash
# Written after the session's last device call (not yet run): the eight-warp register shapes with 3 and 4 stages
# (qst.patch: QREG_ST12 / QREG_ST13, default 2). Shape 13 holds one CTA a multiprocessor by its registers (148 in q4),
# so deeper rings cost it no occupancy; a small matrix's CTA runs two units, the second's copy issued only after the
# first lands, and ST 4 puts a run's first three units in flight before pdl_wait. On the GPU machine, from a checkout
# of main with the patch applied (git apply bench/results/qgemm_reg/session64/qst.patch):
#   bash bench/results/qgemm_reg/session64/next_call.sh OUT_DIR
set -u
out=${1:?out dir}; mkdir -p "$out"
make -j14 build/bin/qgemm_bench build/bin/qreg_read > "$out/build.log" 2>&1 || exit 1
for st in 3 4; do
    rm -rf "/tmp/st$st" && cp -a . "/tmp/st$st" && touch "/tmp/st$st/qgemm.cu" &&
        (cd "/tmp/st$st" && make -j7 NVEXTRA="-DQREG_ST12=$st -DQREG_ST13=$st" build/bin/qgemm_bench > "$out/build_st$st.log" 2>&1) &
done
wait
build/bin/qreg_read > "$out/qreg_read.txt" 2>&1
for r in 1 2; do
    for t in . /tmp/st3 /tmp/st4; do
        n=$(basename "$t"); [ "$n" = . ] && n=st2
        (cd "$t" && QGEMM_MATRIX=8b QGEMM_ONLY=12,13,17 build/bin/qgemm_bench /tmp/q.json 4 8 9 12 16 > "$out/q_${n}_$r.txt" 2>&1)
    done
done
grep -h -E '^8b' "$out"/q_st*_1.txt | cut -c1-100
