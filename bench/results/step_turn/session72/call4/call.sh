# session 72 call 4: main's head (normheld, occrows, ignore_eos, the bench client's ignore_eos): the whole GPU suite,
# the q4 and f16 servers at 16 / 64 concurrent (every answer 160 tokens), step_bench q4 / f16 16 rows (the record).
source .gpu/common.sh
body() {
stamp start
unpack m
W=/tmp/djinn_qbench; mkdir -p $W
(cd /tmp/m && source bench/lib.sh && WORK=$W DATA=/tmp/shared && make_hf 8b $W/hf_8b $W/make.log) > $R/make.txt 2>&1 &
(cd /tmp/m && make -j14 CRITERION=.crit DATA=/tmp/shared all build/run_tests build/bin/repeat_layers build/bin/step_bench > $R/build_m.log 2>&1; echo rc=$? >> $R/build_m.log)
wait; tail -qn1 $R/build_*.log
stamp built
(cd /tmp/m && source bench/lib.sh && WORK=$W DATA=/tmp/shared && convert_once $W/hf_8b $W/q4.bin q4 && convert_once $W/hf_8b $W/f16.bin f16) >> $R/make.txt 2>&1 &
MP=$!
(cd /tmp/m && DJINN_DATA=/tmp/shared DJINN_BIN=/tmp/m/build/bin DJINN_TESTS=/tmp/m/tests timeout 300 build/run_tests -j6 > $R/suite.txt 2>&1; echo "suite rc=$?" >> $R/suite.txt)
tail -3 $R/suite.txt; grep -E "^\[FAIL\]|CRASH" $R/suite.txt | head
stamp suite
wait $MP
for t in q4 f16; do
  (cd /tmp/m && DATA=/tmp/shared DTYPE=$t CASES=resident_link CONCURRENCY="16 64" MAX_TOKENS=160 AGENTS=0 timeout 120 bash bench/serve_bench.sh $R/serve_$t > $R/serve_$t.log 2>&1)
  stamp serve $t; grep -h 'resident_link |' $R/serve_$t.log
done
for t in q4 f16; do (cd /tmp/m && timeout 60 build/bin/step_bench $W/$t.bin 512 16 128,256,400 50 2>&1 >/dev/null | sed "s/^/m $t /" >> $R/steps.txt); done
cat $R/steps.txt
stamp steps
}
export -f body stamp unpack tests
timeout 560 bash -c "R=$R ROOT=$ROOT; body"
finish
