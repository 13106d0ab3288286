# session 71 call 2: step_bench (q4, f16; graphs, and q4 without) at 16 / 64 rows; ncu without graphs: every kernel
# of a 16-row f16 turn, the decode attention's sections in a q4 turn. Every step under its own timeout.
source .gpu/common.sh
body() {
stamp start
unpack m71
D=/tmp/m71
(cd $D && make -j16 CRITERION=.crit DATA=/tmp/shared all build/bin/attn_bench build/bin/step_bench > $R/build.log 2>&1; echo rc=$? >> $R/build.log); tail -1 $R/build.log
stamp built
(cd $D && ATTN_ROWS="16" ATTN_DEPTHS="96 256 480" timeout 60 build/bin/attn_bench $R/attn.json > $R/attn.txt 2>&1); cat $R/attn.txt
W=/tmp/djinn_qbench; mkdir -p $W
(cd $D && source bench/lib.sh && WORK=$W DATA=/tmp/shared && make_hf 8b $W/hf_8b $W/make.log && convert_once $W/hf_8b $W/q4.bin q4 && convert_once $W/hf_8b $W/f16.bin f16) > $R/make.txt 2>&1
stamp models; ls -la $W
for t in q4 f16; do for n in 16 64; do
  (cd $D && timeout 100 build/bin/step_bench $W/$t.bin 512 $n 128,256,400 50 >> $R/steps.txt 2>> $R/steps.err)
done; done
(cd $D && STEP_NO_GRAPH=1 timeout 100 build/bin/step_bench $W/q4.bin 512 16 256 50 >> $R/steps.txt 2>> $R/steps.err)
grep ms $R/steps.err
stamp steps
NCU="ncu --profile-from-start off --cache-control none --clock-control none"
(cd $D && STEP_NO_GRAPH=1 STEP_PROFILE=1 timeout 150 $NCU --metrics gpu__time_duration.sum,dram__bytes_read.sum --csv --page raw build/bin/step_bench $W/f16.bin 512 16 256 3 > $R/ncu_turn_f16.csv 2>&1)
stamp ncu f16
(cd $D && STEP_NO_GRAPH=1 STEP_PROFILE=1 timeout 120 $NCU -k regex:attn_decode --launch-count 2 --section SpeedOfLight --section Occupancy --section WarpStateStats --section MemoryWorkloadAnalysis --section LaunchStats --section SchedulerStats --page details build/bin/step_bench $W/q4.bin 512 16 256 3 > $R/ncu_attn.txt 2>&1)
stamp ncu attn
}
timeout 560 bash -c "$(declare -f body stamp unpack); R=$R ROOT=$ROOT; body"
finish
