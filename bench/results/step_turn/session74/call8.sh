# session 74 call 8: Nsight Compute on shape 21 (warp-specialized, whole tiles) at 512 tokens, gate|up q4: where the
# consumers' and the producer's warps stall, the tensor pipe's share (for the next session).
source .gpu/common.sh
body() {
stamp start
unpack m
(cd /tmp/m && make -j16 CRITERION=.crit DATA=/tmp/shared build/bin/qgemm_bench > $R/build.log 2>&1; echo rc=$? >> $R/build.log); tail -1 $R/build.log
stamp built
cd /tmp/m
QGEMM_MATRIX=8b:gate_up QGEMM_DTYPE=q4 QGEMM_ONLY=21 timeout 90 ncu --cache-control none --clock-control none -k regex:ws --launch-skip 3 --launch-count 1 --set full --page raw build/bin/qgemm_bench $R/ncu_qg.json 512 > $R/ncu_raw.txt 2>&1
grep -E "issue_stalled.*per_warp_active.pct|pipe_tensor.*pct|smsp__inst_executed.sum |sm__throughput|l1tex__data_bank_conflicts_pipe_lsu_mem_shared|smem|dram__throughput" $R/ncu_raw.txt | awk '$NF+0 > 0.5' | head -60
stamp ncu
}
export -f body stamp unpack tests build
timeout 165 bash -c "R=$R ROOT=$ROOT; body"
finish
