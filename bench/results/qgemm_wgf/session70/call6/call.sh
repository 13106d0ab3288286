# session 70 call 6: exp/wgf again (q4 widening as qreg's): tests, qgemm_bench 8B q4 / q8, ncu instruction counts
source .gpu/common.sh
stamp start
unpack wgf
D=/tmp/wgf
(cd $D && make -j16 CRITERION=.crit DATA=/tmp/shared build/run_tests build/bin/qgemm_bench > $R/build.log 2>&1; echo rc=$? >> $R/build.log); tail -1 $R/build.log
stamp built
tests $D $R/tests.log 'kernels/qgemm*'
grep -E "FAIL|Assert|differs|far" $R/tests.log | head -20
(cd $D && QGEMM_MATRIX=8b QGEMM_DTYPE=q4 QGEMM_ONLY=12,13,20,21 timeout 150 build/bin/qgemm_bench $R/q4.json 8 9 16 > $R/q4.txt 2>&1)
awk '/^8b/ {printf "%s %s T=%s matmul=%s | v12=%s v13=%s v20=%s v21=%s\n",$2,$3,$4,$9,$(13+12),$(13+13),$(13+20),$(13+21)}' $R/q4.txt
stamp q4
for m in gate_up wo; do
  (cd $D && QGEMM_MATRIX=8b:$m QGEMM_DTYPE=q4 QGEMM_ONLY=21 timeout 120 ncu --kernel-name regex:"qwf_kernel" --launch-skip 20 --launch-count 1 \
     --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section InstructionStats --section Occupancy \
     build/bin/qgemm_bench /tmp/q.json 16 > $R/ncu_${m}_21.txt 2>&1)
  grep -E "Duration|Issued Warp|Eligible Warps|Active Warps Per S|Executed Instructions  |Warp Cycles Per Issued" $R/ncu_${m}_21.txt | head
done
stamp ncu
cuobjdump -sass $D/build/qgemm.o > $R/qgemm.sass 2>&1; gzip -f $R/qgemm.sass
finish
