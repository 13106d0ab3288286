# session 71 call 1: a 16-row server turn taken apart. step_bench (q4, f16) at 1 / 16 / 64 rows, depths 128 / 256 /
# 400; ncu: every kernel of one 16-row turn at depth 256 (q4 and f16), and the decode attention's sections
source .gpu/common.sh
stamp start
unpack m71
D=/tmp/m71
(cd $D && make -j16 CRITERION=.crit DATA=/tmp/shared all build/bin/attn_bench build/bin/step_bench > $R/build.log 2>&1; echo rc=$? >> $R/build.log); tail -1 $R/build.log
stamp built
(cd $D && ATTN_ROWS="1 16" ATTN_DEPTHS="256" timeout 60 build/bin/attn_bench $R/attn.json > $R/attn.txt 2>&1); head -3 $R/attn.txt
W=/tmp/djinn_qbench
for t in q4 f16; do
  (cd $D && DATA=/tmp/shared DTYPE=$t CASES=resident_link CONCURRENCY="16" MAX_TOKENS=160 AGENTS=0 timeout 200 bash bench/serve_bench.sh $R/serve_$t > $R/serve_$t.log 2>&1)
  stamp serve $t; grep -h 'resident_link |' $R/serve_$t.log
done
for t in q4 f16; do for n in 1 16 64; do
  (cd $D && timeout 120 build/bin/step_bench $W/serve_8b_$t.bin 512 $n 128,256,400 50 > $R/step_${t}_$n.json 2> $R/step_${t}_$n.err); cat $R/step_${t}_$n.err | grep ms
done; done
stamp steps
NCU="ncu --profile-from-start off --cache-control none --clock-control none"
for t in q4 f16; do
  (cd $D && STEP_PROFILE=1 timeout 200 $NCU --metrics gpu__time_duration.sum,dram__bytes_read.sum,sm__throughput.avg.pct_of_peak_sustained_elapsed --csv --page raw build/bin/step_bench $W/serve_8b_$t.bin 512 16 256 5 > $R/ncu_turn_$t.csv 2> $R/ncu_turn_$t.err)
  stamp ncu $t; tail -2 $R/ncu_turn_$t.err
done
(cd $D && STEP_PROFILE=1 timeout 200 $NCU -k regex:attn_decode --launch-count 4 --section SpeedOfLight --section Occupancy --section WarpStateStats --section MemoryWorkloadAnalysis --section LaunchStats --section SchedulerStats --page details build/bin/step_bench $W/serve_8b_q4.bin 512 16 256 5 > $R/ncu_attn.txt 2>&1)
stamp ncu attn
finish
