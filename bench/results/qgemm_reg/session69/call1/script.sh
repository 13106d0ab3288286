# session 69 call 1 (one H200): main (9b68e44) against xd2 (QREG_XD: wo/down lay their x out in the product);
# builds side by side, the XD build's kernel tests, qgemm_bench 8b q4 4-16 tokens and spec_bench, interleaved
source .gpu/common.sh
stamp start
unpack m69; unpack xd2
W=/tmp/djinn_qbench; mkdir -p $W
(cd /tmp/m69 && make -j8 CRITERION=.crit DATA=/tmp/shared all build/run_tests build/bin/repeat_layers build/bin/qgemm_bench build/bin/spec_bench build/bin/attn_bench > $R/build_m69.log 2>&1; echo rc=$? >> $R/build_m69.log) &
(cd /tmp/xd2 && make -j8 CRITERION=.crit DATA=/tmp/shared NVEXTRA=-DQREG_XD all build/run_tests build/bin/qgemm_bench build/bin/spec_bench > $R/build_xd2.log 2>&1; echo rc=$? >> $R/build_xd2.log) &
wait; tail -qn1 $R/build_*.log
stamp built
(cd /tmp/m69 && source bench/lib.sh && WORK=$W DATA=/tmp/shared && make_hf 8b $W/hf_8b $W/make.log && convert_once $W/hf_8b $W/q4.bin q4) > $R/model.log 2>&1 &
MP=$!
tests /tmp/xd2 $R/tests_xd.log 'kernels/qgemm*' 'kernels/swiglu_qgemm' 'kernels/norm_qgemm'
stamp xdtests
for r in 1 2; do for v in m69 xd2; do
  (cd /tmp/$v && QGEMM_MATRIX=8b QGEMM_DTYPE=q4 timeout 60 build/bin/qgemm_bench /tmp/q.json 2 4 8 9 12 16 > $R/q_${v}_$r.txt 2>&1)
done; done
stamp qbench
for v in m69 xd2; do echo "== $v"; grep -h -E '^8b|MISMATCH' $R/q_${v}_1.txt $R/q_${v}_2.txt | awk '{printf "%s %s %s mm=%s\n", $2,$3,$4,$9}' | sort -k2,2 -k1,1 -k3n -s | awk '{k=$1" "$2" "$3; v[k]=v[k]" "$4} END{for(k in v) print k, v[k]}' | sort -k2,2 -k1,1 -k3n; done
wait $MP; tail -2 $R/model.log
stamp model
for r in 1 2 3; do for v in m69 xd2; do
  (cd /tmp/$v && SPEC_POS=256 timeout 60 build/bin/spec_bench $W/q4.bin $W/q4.bin 100 0 9 7 > $R/spec_${v}_$r.json 2> $R/spec_${v}_$r.err); echo "$v $r $(grep -o '"decode_step_ms": [0-9.]*' $R/spec_${v}_$r.json) $(grep -o '"verify[^]]*' $R/spec_${v}_$r.json | cut -c1-120)"
done; done
stamp spec
finish
