# session 70 call 8: exp/wgf shapes 20-24 against 12/13 (8B q4 at 8, 16), stall reasons of 21 and 13 on gate_up
source .gpu/common.sh
stamp start
unpack wgf
D=/tmp/wgf
(cd $D && make -j16 CRITERION=.crit DATA=/tmp/shared build/run_tests build/bin/qgemm_bench > $R/build.log 2>&1; echo rc=$? >> $R/build.log); tail -1 $R/build.log
stamp built
tests $D $R/tests.log 'kernels/qgemm*'
grep -E "FAIL|Assert|differs|far" $R/tests.log | head -20
(cd $D && QGEMM_MATRIX=8b QGEMM_DTYPE=q4 QGEMM_ONLY=12,13,20,21,22,23,24 timeout 150 build/bin/qgemm_bench $R/q4.json 8 16 > $R/q4.txt 2>&1)
awk '/^8b/ {printf "%s %s T=%s matmul=%s | v12=%s v13=%s v20=%s v21=%s v22=%s v23=%s v24=%s\n",$2,$3,$4,$9,$(13+12),$(13+13),$(13+20),$(13+21),$(13+22),$(13+23),$(13+24)}' $R/q4.txt
stamp q4
for v in 21 13; do
  (cd $D && QGEMM_MATRIX=8b:gate_up QGEMM_DTYPE=q4 QGEMM_ONLY=$v timeout 120 ncu --kernel-name regex:"qwf_kernel|qreg_kernel" --launch-skip 20 --launch-count 1 \
     --metrics regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio,smsp__inst_executed.sum,gpu__time_duration.sum \
     build/bin/qgemm_bench /tmp/q.json 16 > $R/stall_$v.txt 2>&1)
  grep -E "stalled|inst_executed|duration" $R/stall_$v.txt | awk '$NF+0 > 0.05' | head -30
done
stamp ncu
finish
