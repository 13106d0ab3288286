# session 72 call 2: exp/land72 (L = main + normheld + occrows): the whole GPU suite, a sweep of 30 seeds of the
# quantized fixtures test (the worst relative L2 of each case), attn_bench main against L, step_bench L, and ncu's
# source-level view of the tensor-core decode attention in a no-graph 16-row turn.
source .gpu/common.sh
body() {
stamp start
unpack m; unpack L
(cd /tmp/L && make -j10 CRITERION=.crit DATA=/tmp/shared all build/run_tests build/bin/repeat_layers build/bin/attn_bench build/bin/step_bench > $R/build_L.log 2>&1; echo rc=$? >> $R/build_L.log) &
(cd /tmp/m && make -j5 CRITERION=.crit DATA=/tmp/shared build/bin/attn_bench > $R/build_m.log 2>&1; echo rc=$? >> $R/build_m.log) &
wait; tail -qn1 $R/build_*.log
stamp built
W=/tmp/djinn_qbench; mkdir -p $W
(cd /tmp/m && source bench/lib.sh && WORK=$W DATA=/tmp/shared && make_hf 8b $W/hf_8b $W/make.log && convert_once $W/hf_8b $W/q4.bin q4 && convert_once $W/hf_8b $W/f16.bin f16) > $R/make.txt 2>&1 &
MP=$!
(for s in $(seq 1 30); do seed=$((1812000000000000 + s * 7919)); echo "seed $seed"; (cd /tmp/L && DJINN_SEED=$seed DJINN_DATA=/tmp/shared DJINN_BIN=/tmp/L/build/bin DJINN_TESTS=/tmp/L/tests timeout 60 build/run_tests --filter 'gpu_forward/quantized_fixtures_match_cpu' 2>&1 | grep -E 'worst relative|rel L2') ; done > $R/sweep.txt 2>&1) &
SW=$!
(cd /tmp/L && DJINN_DATA=/tmp/shared DJINN_BIN=/tmp/L/build/bin DJINN_TESTS=/tmp/L/tests timeout 300 build/run_tests -j6 > $R/suite.txt 2>&1; echo "suite rc=$?" >> $R/suite.txt)
tail -3 $R/suite.txt; grep -E "^\[FAIL\]|CRASH" $R/suite.txt | head
stamp suite
wait $SW; grep -c worst $R/sweep.txt; grep "rel L2" $R/sweep.txt
stamp sweep
for n in m L; do
  (cd /tmp/$n && ATTN_ROWS="1 16 64" ATTN_DEPTHS="96 256 480" timeout 60 build/bin/attn_bench $R/attn_$n.json > $R/attn_$n.txt 2>&1)
  (cd /tmp/$n && ATTN_ROWS="1 16" ATTN_DEPTHS="8000" ATTN_CTX=8192 timeout 60 build/bin/attn_bench $R/attnd_$n.json >> $R/attn_$n.txt 2>&1)
done
grep -h "rows" $R/attn_*.txt | head -40
stamp attn
wait $MP
for t in q4 f16; do (cd /tmp/L && timeout 60 build/bin/step_bench $W/$t.bin 512 16 128,256,400 50 2>&1 >/dev/null | sed "s/^/L $t /" >> $R/steps.txt); done
(cd /tmp/L && timeout 60 build/bin/step_bench $W/q4.bin 512 64 128,256,400 50 2>&1 >/dev/null | sed "s/^/L q4 /" >> $R/steps.txt)
cat $R/steps.txt
stamp steps
(cd /tmp/L && STEP_NO_GRAPH=1 STEP_PROFILE=1 timeout 120 ncu --profile-from-start off -k regex:attn_decode_tc --launch-count 1 --set full --import-source yes -o $R/attn_tc build/bin/step_bench $W/q4.bin 512 16 256 3 > $R/ncu.log 2>&1)
tail -3 $R/ncu.log
(ncu -i $R/attn_tc.ncu-rep --page source --csv --print-source sass > $R/attn_sass.csv 2> $R/attn_sass.err) ; wc -l $R/attn_sass.csv; head -3 $R/attn_sass.err
(ncu -i $R/attn_tc.ncu-rep --page details --csv > $R/attn_details.csv 2>&1); wc -l $R/attn_details.csv
stamp ncu
}
export -f body stamp unpack tests
timeout 550 bash -c "R=$R ROOT=$ROOT; body"
finish
