# session 70 call 5: exp/wgf profiled: ncu on shape 21 and the register kernel's 13 (8B gate_up and wo, q4, 16 tokens),
# and the SASS instruction mix of both kernels
source .gpu/common.sh
stamp start
unpack wgf
D=/tmp/wgf
(cd $D && make -j16 CRITERION=.crit DATA=/tmp/shared build/bin/qgemm_bench > $R/build.log 2>&1; echo rc=$? >> $R/build.log); tail -1 $R/build.log
stamp built
which ncu cuobjdump nvdisasm > $R/tools.txt 2>&1; cat $R/tools.txt
cuobjdump -sass $D/build/qgemm.o > $R/qgemm.sass 2>&1; gzip -f $R/qgemm.sass
for m in gate_up wo; do for v in 21 13; do
  (cd $D && QGEMM_MATRIX=8b:$m QGEMM_DTYPE=q4 QGEMM_ONLY=$v timeout 120 ncu --kernel-name regex:"qwf_kernel|qreg_kernel" --launch-skip 20 --launch-count 1 \
     --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section InstructionStats --section LaunchStats --section Occupancy --section MemoryWorkloadAnalysis \
     build/bin/qgemm_bench /tmp/q.json 16 > $R/ncu_${m}_$v.txt 2>&1)
  grep -E "Duration|Issue Slots Busy|Eligible Warps|Active Warps Per|Issued Warp|Executed Ipc A|No Eligible|Memory Throughput|DRAM Throughput|Registers|Achieved Occ|Stall" $R/ncu_${m}_$v.txt | head -30
  stamp ncu $m $v
done; done
finish
