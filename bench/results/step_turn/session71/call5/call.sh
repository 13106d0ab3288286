# session 71 call 5 (the session's last 320 s of device time): main (e02660c + results) against exp/normheld (a norm's
# loads before its stores, held in registers) and exp/ropeheld (normheld + rope_kv and the KV writes from registers):
# the tests those touch on ropeheld, step_bench q4 at 16 rows, two rounds.
source .gpu/common.sh
body() {
stamp start
W=/tmp/djinn_qbench; mkdir -p $W
unpack m; unpack nh; unpack rh
(cd /tmp/rh && source bench/lib.sh && WORK=$W DATA=/tmp/shared && make_hf 8b $W/hf_8b $W/make.log) > $R/make.txt 2>&1 &
for n in m nh; do (cd /tmp/$n && make -j4 CRITERION=.crit DATA=/tmp/shared build/bin/step_bench > $R/build_$n.log 2>&1; echo rc=$? >> $R/build_$n.log) & done
(cd /tmp/rh && make -j6 CRITERION=.crit DATA=/tmp/shared all build/run_tests build/bin/step_bench > $R/build_rh.log 2>&1; echo rc=$? >> $R/build_rh.log) &
wait; tail -qn1 $R/build_*.log
stamp built
(cd /tmp/rh && source bench/lib.sh && WORK=$W DATA=/tmp/shared && convert_once $W/hf_8b $W/q4.bin q4) >> $R/make.txt 2>&1 &
MP=$!
tests /tmp/rh $R/tests_rh.txt 'kernels/rmsnorm' 'kernels/norm*' 'kernels/kv_types*' 'kernels/rope*' 'kernels/attention_decode*' 'gpu_forward/*'
stamp tests
wait $MP
for r in 1 2; do for n in m nh rh; do
  (cd /tmp/$n && timeout 40 build/bin/step_bench $W/q4.bin 512 16 128,256,400 50 2>&1 >/dev/null | sed "s/^/$n r$r q4 /" >> $R/steps.txt)
done; done
cat $R/steps.txt
stamp steps
}
export -f body stamp unpack tests
timeout 215 bash -c "R=$R ROOT=$ROOT; body"
finish
