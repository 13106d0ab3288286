# next session: exp/laypdl (rebased on main) against main: the layouts as dependent launches (lp), and with the
# product's trigger before its sums (lpt, -DQREG_TRIGGER=1): kernel and gpu tests, qgemm_bench (the layer at 8-16),
# spec_bench 3 rounds, the q4 server at 16 / 64 two rounds, interleaved
source .gpu/common.sh
stamp start
W=/tmp/djinn_qbench; mkdir -p $W
unpack m70; unpack lp
cp -a /tmp/lp /tmp/lpt
(cd /tmp/m70 && make -j5 CRITERION=.crit DATA=/tmp/shared all build/bin/ceilings build/bin/spec_bench build/bin/qgemm_bench > $R/build_m70.log 2>&1; echo rc=$? >> $R/build_m70.log) &
(cd /tmp/lp && make -j6 CRITERION=.crit DATA=/tmp/shared all build/run_tests build/bin/ceilings build/bin/spec_bench build/bin/qgemm_bench > $R/build_lp.log 2>&1; echo rc=$? >> $R/build_lp.log) &
(cd /tmp/lpt && make -j5 CRITERION=.crit DATA=/tmp/shared NVEXTRA=-DQREG_TRIGGER=1 all build/run_tests build/bin/ceilings build/bin/spec_bench build/bin/qgemm_bench > $R/build_lpt.log 2>&1; echo rc=$? >> $R/build_lpt.log) &
wait; tail -qn1 $R/build_*.log
stamp built
(cd /tmp/m70 && source bench/lib.sh && WORK=$W DATA=/tmp/shared && make_hf 8b $W/hf_8b $W/make.log && convert_once $W/hf_8b $W/q4.bin q4) > $R/model.log 2>&1 &
MP=$!
tests /tmp/lp $R/tests_lp.log 'kernels/qgemm*' 'kernels/norm_qgemm' 'kernels/swiglu_qgemm' 'gpu*/*'
tests /tmp/lpt $R/tests_lpt.log 'kernels/qgemm*' 'kernels/norm_qgemm' 'gpu_forward/*'
wait $MP; stamp model
for r in 1 2 3; do for v in m70 lp lpt; do
  (cd /tmp/$v && SPEC_POS=256 timeout 60 build/bin/spec_bench $W/q4.bin $W/q4.bin 100 0 9 7 > $R/spec_${v}_$r.json 2> $R/spec_${v}_$r.err); echo "$v $r $(grep -o '"decode_step_ms": [0-9.]*' $R/spec_${v}_$r.json) $(grep -o '"verify[^]]*' $R/spec_${v}_$r.json | cut -c1-120)"
done; done
stamp spec
for r in 1 2; do for t in lp m70 lpt; do
  (cd /tmp/$t && DATA=/tmp/shared DTYPE=q4 CASES=resident_link CONCURRENCY="16 64" MAX_TOKENS=160 AGENTS=0 timeout 120 bash bench/serve_bench.sh $R/serve_q4_${t}_$r > $R/serve_q4_${t}_$r.log 2>&1)
  stamp serve q4 $t $r; grep -h 'resident_link |' $R/serve_q4_${t}_$r.log
done; done
finish
