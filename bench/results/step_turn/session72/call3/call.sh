# session 72 call 3: main with normheld + occrows landed: step_bench q4 / f16 16 rows and q4 64 (two rounds), a whole
# no-graph 16-row q4 turn under ncu (every kernel, the head's included), ncu's source view of the tensor-core decode
# attention, the q4 and f16 servers at 16 / 64 concurrent.
source .gpu/common.sh
body() {
stamp start
unpack m
W=/tmp/djinn_qbench; mkdir -p $W
(cd /tmp/m && source bench/lib.sh && WORK=$W DATA=/tmp/shared && make_hf 8b $W/hf_8b $W/make.log) > $R/make.txt 2>&1 &
(cd /tmp/m && make -j14 CRITERION=.crit DATA=/tmp/shared all build/bin/attn_bench build/bin/step_bench > $R/build_m.log 2>&1; echo rc=$? >> $R/build_m.log)
wait; tail -qn1 $R/build_*.log
stamp built
(cd /tmp/m && source bench/lib.sh && WORK=$W DATA=/tmp/shared && convert_once $W/hf_8b $W/q4.bin q4 && convert_once $W/hf_8b $W/f16.bin f16) >> $R/make.txt 2>&1
ls -la $W/*.bin
stamp models
for r in 1 2; do for t in q4 f16; do (cd /tmp/m && timeout 60 build/bin/step_bench $W/$t.bin 512 16 128,256,400 50 2>&1 >/dev/null | sed "s/^/m r$r $t /" >> $R/steps.txt); done; done
(cd /tmp/m && timeout 60 build/bin/step_bench $W/q4.bin 512 64 128,256,400 50 2>&1 >/dev/null | sed "s/^/m q4 /" >> $R/steps.txt)
cat $R/steps.txt
stamp steps
(cd /tmp/m && STEP_NO_GRAPH=1 STEP_PROFILE=1 timeout 150 ncu --profile-from-start off --cache-control none --clock-control none --metrics gpu__time_duration.sum --csv --page raw build/bin/step_bench $W/q4.bin 512 16 256 3 > $R/ncu_turn_q4.csv 2> $R/ncu_turn_q4.err)
(cd /tmp/m && python3 bench/ncu_turn.py $R/ncu_turn_q4.csv > $R/ncu_turn_q4.txt 2>&1); cat $R/ncu_turn_q4.txt
stamp ncu_turn
(cd /tmp/m && STEP_NO_GRAPH=1 STEP_PROFILE=1 timeout 100 ncu --profile-from-start off -k regex:attn_decode_tc --launch-count 1 --set full --import-source yes -o $R/attn_tc build/bin/step_bench $W/q4.bin 512 16 256 3 > $R/ncu.log 2>&1)
tail -2 $R/ncu.log
(ncu -i $R/attn_tc.ncu-rep --page source --csv --print-source sass > $R/attn_sass.csv 2> $R/attn_sass.err); wc -l $R/attn_sass.csv; head -3 $R/attn_sass.err
(ncu -i $R/attn_tc.ncu-rep --page details --csv > $R/attn_details.csv 2>&1); wc -l $R/attn_details.csv
stamp ncu_attn
for t in q4 f16; do
  (cd /tmp/m && DATA=/tmp/shared DTYPE=$t CASES=resident_link CONCURRENCY="16 64" MAX_TOKENS=160 AGENTS=0 timeout 120 bash bench/serve_bench.sh $R/serve_$t > $R/serve_$t.log 2>&1)
  stamp serve $t; grep -h 'resident_link |' $R/serve_$t.log
done
}
export -f body stamp unpack tests
timeout 560 bash -c "R=$R ROOT=$ROOT; body"
finish
