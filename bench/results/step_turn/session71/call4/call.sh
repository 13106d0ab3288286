# session 71 call 4: main with the decode grids' splits slowest (zs): the whole GPU suite, the q4 and f16 servers at
# 16 / 64 concurrent; zs against two aims for rows in blocks of their own (DEC_ROW_BLOCKS 512: more, shorter splits;
# 96: fewer, longer) in step_bench and attn_bench.
source .gpu/common.sh
body() {
stamp start
unpack zs; cp -a /tmp/zs /tmp/rb512; cp -a /tmp/zs /tmp/rb96
(cd /tmp/zs && make -j8 CRITERION=.crit DATA=/tmp/shared all build/run_tests build/bin/repeat_layers build/bin/attn_bench build/bin/step_bench > $R/build_zs.log 2>&1; echo rc=$? >> $R/build_zs.log) &
for v in 512 96; do (cd /tmp/rb$v && make -j4 CRITERION=.crit NVEXTRA=-DDEC_ROW_BLOCKS=$v build/bin/attn_bench build/bin/step_bench > $R/build_rb$v.log 2>&1; echo rc=$? >> $R/build_rb$v.log) & done
wait; tail -qn1 $R/build_*.log
stamp built
W=/tmp/djinn_qbench; mkdir -p $W
(cd /tmp/zs && source bench/lib.sh && WORK=$W DATA=/tmp/shared && make_hf 8b $W/hf_8b $W/make.log && convert_once $W/hf_8b $W/q4.bin q4) > $R/make.txt 2>&1 &
MP=$!
(cd /tmp/zs && DJINN_DATA=/tmp/shared DJINN_BIN=/tmp/zs/build/bin DJINN_TESTS=/tmp/zs/tests timeout 300 build/run_tests -j6 > $R/suite.txt 2>&1; echo "suite rc=$?" >> $R/suite.txt)
tail -3 $R/suite.txt; grep -E "^\[FAIL\]|CRASH" $R/suite.txt | head
stamp suite
wait $MP
for v in zs rb512 rb96; do
  (cd /tmp/$v && ATTN_ROWS="16 64" ATTN_DEPTHS="96 256 480" timeout 60 build/bin/attn_bench $R/attn_$v.json > $R/attn_$v.txt 2>&1)
done
for r in 1 2; do for v in zs rb512 rb96; do
  (cd /tmp/$v && timeout 60 build/bin/step_bench $W/q4.bin 512 16 128,256,400 50 2>&1 >/dev/null | sed "s/^/$v r$r q4 /" >> $R/steps.txt)
done; done
cat $R/steps.txt
stamp steps
for t in q4 f16; do
  (cd /tmp/zs && DATA=/tmp/shared DTYPE=$t CASES=resident_link CONCURRENCY="16 64" MAX_TOKENS=160 AGENTS=0 timeout 150 bash bench/serve_bench.sh $R/serve_$t > $R/serve_$t.log 2>&1)
  stamp serve $t; grep -h 'resident_link |' $R/serve_$t.log
done
}
export -f body stamp unpack tests
timeout 540 bash -c "R=$R ROOT=$ROOT; body"
finish
