# session 70 call 1 (bare): the whole suite on tidy69; exp/nogroup (=17, =10) against main: attn one-slot, spec_bench
source .gpu/common.sh
stamp start
W=/tmp/djinn_qbench; mkdir -p $W
unpack m70; unpack ng; unpack tidy
cp -a /tmp/ng /tmp/ng10
(cd /tmp/tidy && make -j4 CRITERION=.crit DATA=/tmp/shared all build/run_tests > $R/build_tidy.log 2>&1; echo rc=$? >> $R/build_tidy.log) &
(cd /tmp/m70 && make -j4 CRITERION=.crit DATA=/tmp/shared all build/bin/spec_bench build/bin/attn_bench > $R/build_m70.log 2>&1; echo rc=$? >> $R/build_m70.log) &
(cd /tmp/ng && make -j4 CRITERION=.crit NVEXTRA=-DDEC_GROUP_FROM=17 all build/run_tests build/bin/spec_bench build/bin/attn_bench > $R/build_ng.log 2>&1; echo rc=$? >> $R/build_ng.log) &
(cd /tmp/ng10 && make -j4 CRITERION=.crit NVEXTRA=-DDEC_GROUP_FROM=10 build/bin/spec_bench build/bin/attn_bench > $R/build_ng10.log 2>&1; echo rc=$? >> $R/build_ng10.log) &
wait; tail -qn1 $R/build_*.log
stamp built
(cd /tmp/m70 && source bench/lib.sh && WORK=$W DATA=/tmp/shared && make_hf 8b $W/hf_8b $W/make.log && convert_once $W/hf_8b $W/q4.bin q4) > $R/model.log 2>&1 &
MP=$!
(cd /tmp/tidy && DJINN_DATA=/tmp/shared DJINN_BIN=/tmp/tidy/build/bin DJINN_TESTS=/tmp/tidy/tests timeout 300 build/run_tests -j6 > $R/suite.txt 2>&1; echo "suite rc=$?" >> $R/suite.txt)
tail -3 $R/suite.txt; grep -E "^\[FAIL\]|CRASH" $R/suite.txt | head
stamp suite
tests /tmp/ng $R/tests.log 'kernels/attention*' 'spec*/*'
wait $MP; stamp model
for v in m70 ng ng10; do
  (cd /tmp/$v && ATTN_ONE_SLOT=1 ATTN_CTX=4096 ATTN_ROWS="2 3 5 9 16" ATTN_DEPTHS="96 256 1000 4000" timeout 90 build/bin/attn_bench $R/attn1_$v.json > $R/attn1_${v}.txt 2>&1)
  echo "== one slot $v $(head -1 $R/attn1_${v}.txt | grep -o 'D2D.*')"; tail -n +3 $R/attn1_${v}.txt | awk '{print $1, $2, $5}' | tr '\n' ';'; echo
done
stamp attn
for p in 256 2000; do for r in 1 2; do for v in m70 ng ng10; do
  (cd /tmp/$v && SPEC_POS=$p timeout 60 build/bin/spec_bench $W/q4.bin $W/q4.bin 100 0 9 7 > $R/spec_${v}_${p}_$r.json 2> $R/spec_${v}_${p}_$r.err); echo "$v $p $r $(grep -o '"decode_step_ms": [0-9.]*' $R/spec_${v}_${p}_$r.json) $(grep -o '"verify[^]]*' $R/spec_${v}_${p}_$r.json | cut -c1-120)"
done; done; done
stamp spec
finish
