# session 69 call 5 (bare): rowspan (DEC_ROW_BLOCKS 192, splits of a filled launch at most 256 keys) against main:
# tests on rowspan beside the model's making, attn_bench (rows of their own slots; rows of one slot), spec_bench and
# the server (q4, 16 and 64), interleaved
source .gpu/common.sh
stamp start
W=/tmp/djinn_qbench; mkdir -p $W
unpack m69; unpack rowspan
(cd /tmp/m69 && make -j6 CRITERION=.crit DATA=/tmp/shared all build/bin/ceilings build/bin/spec_bench build/bin/attn_bench > $R/build_m69.log 2>&1; echo rc=$? >> $R/build_m69.log) &
(cd /tmp/rowspan && make -j9 CRITERION=.crit DATA=/tmp/shared all build/run_tests build/bin/ceilings build/bin/spec_bench build/bin/attn_bench > $R/build_rs.log 2>&1; echo rc=$? >> $R/build_rs.log) &
wait; tail -qn1 $R/build_*.log
stamp built
(cd /tmp/m69 && source bench/lib.sh && WORK=$W DATA=/tmp/shared && make_hf 8b $W/hf_8b $W/make.log && convert_once $W/hf_8b $W/q4.bin q4) > $R/model.log 2>&1 &
MP=$!
tests /tmp/rowspan $R/tests.log 'kernels/*' 'gpu*/*' 'spec*/*'
stamp tests
wait $MP; stamp model
for v in rowspan m69; do
  (cd /tmp/$v && ATTN_ROWS="1 2 4 9 16 32 64" ATTN_DEPTHS="96 256 480 1000 2000" timeout 90 build/bin/attn_bench $R/attn_$v.json > $R/attn_${v}.txt 2>&1)
  echo "== $v $(head -1 $R/attn_${v}.txt)"; tail -n +3 $R/attn_${v}.txt | awk '{print $1, $2, $5}' | tr '\n' ';'; echo
  (cd /tmp/$v && ATTN_ONE_SLOT=1 ATTN_CTX=1024 ATTN_ROWS="2 5 9 16 64" ATTN_DEPTHS="256 1000" timeout 60 build/bin/attn_bench $R/attn1_$v.json > $R/attn1_${v}.txt 2>&1)
  echo "== one slot $v"; tail -n +3 $R/attn1_${v}.txt | awk '{print $1, $2, $5}' | tr '\n' ';'; echo
done
stamp attn
for r in 1 2 3; do for v in m69 rowspan; do
  (cd /tmp/$v && SPEC_POS=256 timeout 60 build/bin/spec_bench $W/q4.bin $W/q4.bin 100 0 9 7 > $R/spec_${v}_$r.json 2> $R/spec_${v}_$r.err); echo "$v $r $(grep -o '"decode_step_ms": [0-9.]*' $R/spec_${v}_$r.json) $(grep -o '"verify[^]]*' $R/spec_${v}_$r.json | cut -c1-120)"
done; done
stamp spec
for r in 1 2; do for t in rowspan m69; do
  (cd /tmp/$t && DATA=/tmp/shared DTYPE=q4 CASES=resident_link CONCURRENCY="16 64" MAX_TOKENS=160 AGENTS=0 timeout 120 bash bench/serve_bench.sh $R/serve_q4_${t}_$r > $R/serve_q4_${t}_$r.log 2>&1)
  stamp serve q4 $t $r; grep -h 'resident_link |' $R/serve_q4_${t}_$r.log
done; done
finish
