# session 73 call 5: the wgmma kernel's stage depth (exp/wgst: shapes 10 / 11 = 256 tokens at 6 / 3 stages against
# shape 8's 5), q4 on the 8B's four matrices at 256-2048 tokens; Nsight Compute's stall reasons of shape 8 on gate|up
# q4 at 512.
source .gpu/common.sh
body() {
stamp start
unpack wgst
(cd /tmp/wgst && make -j16 CRITERION=.crit DATA=/tmp/shared build/bin/qgemm_bench > $R/build.log 2>&1; echo rc=$? >> $R/build.log); tail -1 $R/build.log
stamp built
cd /tmp/wgst
for r in 1 2; do QGEMM_ONLY=8,10,11 QGEMM_MATRIX=8b QGEMM_DTYPE=q4 timeout 100 build/bin/qgemm_bench $R/qg$r.json 256 512 1024 2048 > $R/qg$r.txt 2>&1; done
awk "{print \$1,\$2,\$3,\$4,\$5,\$21,\$23,\$24}" $R/qg1.txt $R/qg2.txt
stamp qgemm
QGEMM_MATRIX=8b:gate_up QGEMM_DTYPE=q4 QGEMM_ONLY=8 timeout 200 ncu --cache-control none --clock-control none -k regex:wg --launch-skip 3 --launch-count 1 --set full --page raw build/bin/qgemm_bench $R/ncu_qg.json 512 > $R/ncu_raw.txt 2>&1
grep -E "issue_stalled.*per_warp_active.pct|pipe_tensor.*pct|smsp__inst_executed.sum |sm__throughput|l1tex__data_bank_conflicts_pipe_lsu_mem_shared|smem" $R/ncu_raw.txt | awk '$NF+0 > 0.5' | head -60
stamp ncu
}
export -f body stamp unpack tests build
timeout 560 bash -c "R=$R ROOT=$ROOT; body"
finish
