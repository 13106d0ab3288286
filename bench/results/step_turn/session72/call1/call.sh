# written at stop 71 for the next session's first call: the seed that failed on exp/ropeheld replayed on main and on
# both branches (normheld, ropeheld), then the GPU tests each branch touches and the 16 / 64-row turns in q4 and
# f16 (the whole suite on what lands, in a later call), beside
# exp/occrows and exp/combpre. .gpu/{m,nh,rh,or,cp}.tgz: `git archive` of main, exp/normheld, exp/ropeheld,
# exp/occrows, exp/combpre.
source .gpu/common.sh
body() {
stamp start
W=/tmp/djinn_qbench; mkdir -p $W
for n in m nh rh or cp; do unpack $n; done
(cd /tmp/m && source bench/lib.sh && WORK=$W DATA=/tmp/shared && make_hf 8b $W/hf_8b $W/make.log) > $R/make.txt 2>&1 &
for n in m nh rh or cp; do (cd /tmp/$n && make -j3 CRITERION=.crit DATA=/tmp/shared all build/run_tests build/bin/step_bench > $R/build_$n.log 2>&1; echo rc=$? >> $R/build_$n.log) & done
wait; tail -qn1 $R/build_*.log
stamp built
(cd /tmp/m && source bench/lib.sh && WORK=$W DATA=/tmp/shared && convert_once $W/hf_8b $W/q4.bin q4 && convert_once $W/hf_8b $W/f16.bin f16) >> $R/make.txt 2>&1 &
MP=$!
for n in m nh rh; do
  (cd /tmp/$n && DJINN_SEED=1803504277769590 DJINN_DATA=/tmp/shared DJINN_BIN=/tmp/$n/build/bin DJINN_TESTS=/tmp/$n/tests timeout 60 build/run_tests --filter 'gpu_forward/quantized_fixtures_match_cpu' --verbose > $R/seed_$n.txt 2>&1); echo "$n: $(grep -E 'Synthesis|rel L2' $R/seed_$n.txt | tr '\n' ' ')"
done
stamp seed
for n in nh rh; do tests /tmp/$n $R/tests_$n.txt 'kernels/rmsnorm' 'kernels/norm*' 'kernels/kv_types*' 'kernels/rope*' 'gpu_forward/*'; done
for n in or cp; do tests /tmp/$n $R/tests_$n.txt 'kernels/attention*' 'kernels/decode*' 'gpu_forward/*'; done
stamp tests
wait $MP
for r in 1 2; do for n in m nh rh or cp; do for t in q4 f16; do
  (cd /tmp/$n && timeout 60 build/bin/step_bench $W/$t.bin 512 16 128,256,400 50 2>&1 >/dev/null | sed "s/^/$n r$r $t /" >> $R/steps.txt)
done; done; done
for n in m nh rh or cp; do (cd /tmp/$n && timeout 60 build/bin/step_bench $W/q4.bin 512 64 128,256,400 50 2>&1 >/dev/null | sed "s/^/$n q4 /" >> $R/steps.txt); done
cat $R/steps.txt
stamp steps
}
export -f body stamp unpack tests
timeout 570 bash -c "R=$R ROOT=$ROOT; body"
finish
