# session 69 call 3 (warm): DEC_ROW_BLOCKS 256 / 384 / 768 against main's 512: attn_bench (rows of their own slots,
# and of one slot), spec_bench, interleaved
source .gpu/common.sh
stamp start
W=/tmp/djinn_qbench
for b in 256 384 768; do rm -rf /tmp/rb$b; cp -a /tmp/m69 /tmp/rb$b; rm -f /tmp/rb$b/build/obj/attention.o; done
ls /tmp/m69/build/ | head
for b in 256 384 768; do (cd /tmp/rb$b && find build -name 'attention*.o' -delete; make -j5 CRITERION=.crit NVEXTRA=-DDEC_ROW_BLOCKS=$b build/bin/spec_bench build/bin/attn_bench > $R/build_$b.log 2>&1; echo rc=$? >> $R/build_$b.log) & done
wait; tail -qn1 $R/build_*.log
stamp built
for r in 1 2; do for v in m69 rb256 rb384 rb768; do
  (cd /tmp/$v && ATTN_ROWS="1 4 9 16 64" ATTN_DEPTHS="96 256 480 2000" timeout 60 build/bin/attn_bench $R/attn_$v.json > $R/attn_${v}_$r.txt 2>&1)
  echo "== $v $r $(head -1 $R/attn_${v}_$r.txt)"; tail -n +3 $R/attn_${v}_$r.txt | awk '{print $1, $2, $5}' | tr '\n' ';'; echo
done; done
stamp attn
for r in 1 2; do for v in m69 rb256 rb384 rb768; do
  (cd /tmp/$v && SPEC_POS=256 timeout 60 build/bin/spec_bench $W/q4.bin $W/q4.bin 100 0 9 7 > $R/spec_${v}_$r.json 2> $R/spec_${v}_$r.err); echo "$v $r $(grep -o '"decode_step_ms": [0-9.]*' $R/spec_${v}_$r.json) $(grep -o '"verify[^]]*' $R/spec_${v}_$r.json | cut -c1-120)"
done; done
stamp spec
finish
