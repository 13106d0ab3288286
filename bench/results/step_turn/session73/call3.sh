# session 73 call 3: the whole test suite on main (75fcef0); the 512-token prefill f16 / q4, three runs each and one
# under DJINN_PROFILE (where a pass's time goes), beside the ceilings' D2D and GEMM peak.
source .gpu/common.sh
body() {
stamp start
unpack m
W=/tmp/djinn_qbench; mkdir -p $W
(cd /tmp/m && source bench/lib.sh && WORK=$W DATA=/tmp/shared && make_hf 8b $W/hf_8b $W/make.log) > $R/make.txt 2>&1 &
build /tmp/m $R/build.log build/bin/ceilings
wait
stamp built
(cd /tmp/m && source bench/lib.sh && WORK=$W DATA=/tmp/shared && convert_once $W/hf_8b $W/q4.bin q4 && convert_once $W/hf_8b $W/f16.bin f16) >> $R/make.txt 2>&1 &
MP=$!
tests /tmp/m $R/suite.txt '*'
stamp suite
wait $MP; ls -la $W >> $R/make.txt
LONG=$(printf 'the %.0s' $(seq 511)); LONG=${LONG% }
cd /tmp/m
for r in 1 2 3; do for t in f16 q4; do
  timeout 60 ./djinn $W/$t.bin -t 0 -c 1024 -p "$LONG" -n 4 2>&1 >/dev/null | grep -E "prefill" | sed "s/^/r$r $t /" | tee -a $R/prefill.txt
done; done
for t in f16 q4; do DJINN_PROFILE=1 timeout 60 ./djinn $W/$t.bin -t 0 -c 1024 -p "$LONG" -n 4 > /dev/null 2> $R/profile_$t.txt; done
tail -30 $R/profile_q4.txt
timeout 60 build/bin/ceilings $R/ceil.json 2>&1 | grep -E "HBM|GEMM 8192" | head -3
stamp prefill
}
export -f body stamp unpack tests build
timeout 560 bash -c "R=$R ROOT=$ROOT; body"
finish
