# session 73 call 4: the Hopper (wgmma) tile shapes on the 8B's four matrices at 128-2048 tokens, q4 and q8, each
# shape timed (is the pick, fitted on an H100, the fastest on the H200?); Nsight Compute on gate|up q4 at 512
# (shape 8); repeat_layers' two tests with the tool built (call 3 left it out).
source .gpu/common.sh
body() {
stamp start
unpack m
build /tmp/m $R/build.log build/bin/qgemm_bench build/bin/repeat_layers build/bin/ceilings
stamp built
tests /tmp/m $R/rl.txt 'repeat_layers/*'
cd /tmp/m
for dt in q4 q8; do QGEMM_MATRIX=8b QGEMM_DTYPE=$dt timeout 150 build/bin/qgemm_bench $R/qg_$dt.json 128 256 512 1024 2048 > $R/qg_$dt.txt 2>&1; done
awk "{print \$1,\$2,\$3,\$4,\$5,\$9,\$10,\$21,\$22,\$23,\$24}" $R/qg_q4.txt $R/qg_q8.txt
stamp qgemm
NCU="ncu --cache-control none --clock-control none"
QGEMM_MATRIX=8b:gate_up QGEMM_DTYPE=q4 QGEMM_ONLY=8 timeout 150 $NCU -k regex:wg --launch-skip 3 --launch-count 1 --section SpeedOfLight --section Occupancy --section WarpStateStats --section SchedulerStats --section ComputeWorkloadAnalysis --section LaunchStats build/bin/qgemm_bench $R/ncu_qg.json 512 > $R/ncu_wg.txt 2>&1
grep -E "Duration|Throughput|Issue|Eligible|Active Warps|Stall|Registers|Block Limit|Theoretical Occ|Achieved Occ|Pipe" $R/ncu_wg.txt | head -40
stamp ncu
QUANT_ONLY=1 timeout 60 build/bin/ceilings $R/ceil.json 2>&1 | grep -E "HBM|q4 .*28672x4096|f16 .*28672x4096" | head -4
}
export -f body stamp unpack tests build
timeout 560 bash -c "R=$R ROOT=$ROOT; body"
finish
