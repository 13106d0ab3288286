# session 74 call 5: main as landed (stream-K 20, norms in the x layout, warp-specialized 21 / 22, the picker, the q8
# KV test's tolerance): the whole suite; the 512-token prefill q4 / f16 (five rounds) beside the ceilings.
source .gpu/common.sh
body() {
stamp start
unpack m
W=/tmp/djinn_qbench; mkdir -p $W
(cd /tmp/m && source bench/lib.sh && WORK=$W DATA=/tmp/shared && make_hf 8b $W/hf_8b $W/make.log) > $R/make.txt 2>&1 &
(cd /tmp/m && make -j14 CRITERION=.crit DATA=/tmp/shared all build/run_tests build/bin/ceilings build/bin/repeat_layers > $R/build_m.log 2>&1; echo rc=$? >> $R/build_m.log)
wait; tail -qn1 $R/build_*.log
stamp built
(cd /tmp/m && source bench/lib.sh && WORK=$W DATA=/tmp/shared && convert_once $W/hf_8b $W/q4.bin q4 && convert_once $W/hf_8b $W/f16.bin f16) >> $R/make.txt 2>&1 &
MP=$!
tests /tmp/m $R/suite.txt '*'
grep -B3 -A8 "Assertion\|^\[FAIL" $R/suite.txt | head -40
stamp suite
wait $MP
(cd /tmp/m && QUANT_ONLY=1 timeout 60 build/bin/ceilings > $R/ceilings.txt 2>&1); grep -E "D2D|GEMM 8192" $R/ceilings.txt
LONG=$(printf 'the %.0s' $(seq 511)); LONG=${LONG% }
for r in 1 2 3 4 5; do
  (cd /tmp/m && timeout 60 ./djinn $W/f16.bin -t 0 -c 1024 -p "$LONG" -n 4 2>&1 >/dev/null | grep "prefill " | sed "s/^/r$r m f16 /" | tee -a $R/prefill.txt)
  (cd /tmp/m && timeout 60 ./djinn $W/q4.bin -t 0 -c 1024 -p "$LONG" -n 4 2>&1 >/dev/null | grep "prefill " | sed "s/^/r$r m q4 /" | tee -a $R/prefill.txt)
done
(cd /tmp/m && DJINN_PROFILE=1 timeout 60 ./djinn $W/q4.bin -t 0 -c 1024 -p "$LONG" -n 4 2>&1 >/dev/null | grep "profile (prefill" | tee -a $R/prefill.txt)
(cd /tmp/m && QUANT_ONLY=1 timeout 60 build/bin/ceilings > $R/ceilings2.txt 2>&1); grep -E "D2D|GEMM 8192" $R/ceilings2.txt
stamp prefill
}
export -f body stamp unpack tests build
timeout 560 bash -c "R=$R ROOT=$ROOT; body"
finish
