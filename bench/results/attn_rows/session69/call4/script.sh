# session 69 call 4 (bare machine): DEC_ROW_BLOCKS 128 / 192 in attn_bench beside 256 and 512; spec_bench and the
# server (q4, 16 and 64 concurrent) on 256 against main's 512, interleaved
source .gpu/common.sh
stamp start
W=/tmp/djinn_qbench; mkdir -p $W
unpack m69
for b in 128 192 256; do rm -rf /tmp/rb$b; cp -a /tmp/m69 /tmp/rb$b; done
(cd /tmp/m69 && make -j6 CRITERION=.crit DATA=/tmp/shared all build/bin/ceilings build/bin/spec_bench build/bin/attn_bench > $R/build_m69.log 2>&1; echo rc=$? >> $R/build_m69.log) &
(cd /tmp/rb256 && make -j6 CRITERION=.crit DATA=/tmp/shared NVEXTRA=-DDEC_ROW_BLOCKS=256 all build/bin/ceilings build/bin/spec_bench build/bin/attn_bench > $R/build_256.log 2>&1; echo rc=$? >> $R/build_256.log) &
for b in 128 192; do (cd /tmp/rb$b && make -j2 CRITERION=.crit NVEXTRA=-DDEC_ROW_BLOCKS=$b build/bin/attn_bench > $R/build_$b.log 2>&1; echo rc=$? >> $R/build_$b.log) & done
wait; tail -qn1 $R/build_*.log
stamp built
(cd /tmp/m69 && source bench/lib.sh && WORK=$W DATA=/tmp/shared && make_hf 8b $W/hf_8b $W/make.log && convert_once $W/hf_8b $W/q4.bin q4) > $R/model.log 2>&1 &
MP=$!
for v in rb128 rb192 rb256 m69; do
  (cd /tmp/$v && ATTN_ROWS="4 9 16 32" ATTN_DEPTHS="96 256 480 1000" timeout 60 build/bin/attn_bench $R/attn_$v.json > $R/attn_${v}.txt 2>&1)
  echo "== $v $(head -1 $R/attn_${v}.txt)"; tail -n +3 $R/attn_${v}.txt | awk '{print $1, $2, $5}' | tr '\n' ';'; echo
done
stamp attn
wait $MP; stamp model
for r in 1 2 3; do for v in m69 rb256; do
  (cd /tmp/$v && SPEC_POS=256 timeout 60 build/bin/spec_bench $W/q4.bin $W/q4.bin 100 0 9 7 > $R/spec_${v}_$r.json 2> $R/spec_${v}_$r.err); echo "$v $r $(grep -o '"decode_step_ms": [0-9.]*' $R/spec_${v}_$r.json) $(grep -o '"verify[^]]*' $R/spec_${v}_$r.json | cut -c1-120)"
done; done
stamp spec
for r in 1 2; do for t in rb256 m69; do
  (cd /tmp/$t && DATA=/tmp/shared DTYPE=q4 CASES=resident_link CONCURRENCY="16 64" MAX_TOKENS=160 AGENTS=0 timeout 120 bash bench/serve_bench.sh $R/serve_q4_${t}_$r > $R/serve_q4_${t}_$r.log 2>&1)
  stamp serve q4 $t $r; grep -h 'resident_link |' $R/serve_q4_${t}_$r.log
done; done
finish
