# written at stop 72: exp/combfold (combfold.patch: the combine folded into the tensor-core decode kernel in launches
# of 512 (row block, kv head) pairs or more with at most 16 splits a kv head) against main: its GPU tests
# (attention, decode, gpu_forward, the GPU server tests: graph replays reuse the tickets), attn_bench (1 / 16 / 64
# rows at 96-480 keys; 1 and 16 rows at 8000 keys of 8192, neither folded), step_bench q4 / f16 16 rows and q4 64
# (two rounds): the 64-row turn is where it should show. Put the patch at .gpu/cf.patch; main's tree is carried.
source .gpu/common.sh
body() {
stamp start
unpack m; unpack cf
W=/tmp/djinn_qbench; mkdir -p $W
(cd /tmp/m && source bench/lib.sh && WORK=$W DATA=/tmp/shared && make_hf 8b $W/hf_8b $W/make.log) > $R/make.txt 2>&1 &
for n in m cf; do (cd /tmp/$n && make -j7 CRITERION=.crit DATA=/tmp/shared all build/run_tests build/bin/attn_bench build/bin/step_bench > $R/build_$n.log 2>&1; echo rc=$? >> $R/build_$n.log) & done
wait; tail -qn1 $R/build_*.log
stamp built
(cd /tmp/m && source bench/lib.sh && WORK=$W DATA=/tmp/shared && convert_once $W/hf_8b $W/q4.bin q4 && convert_once $W/hf_8b $W/f16.bin f16) >> $R/make.txt 2>&1 &
MP=$!
tests /tmp/cf $R/tests_cf.txt 'kernels/attention*' 'kernels/decode*' 'gpu_forward/*' 'server/gpu_*'
stamp tests
wait $MP
for n in m cf; do
  (cd /tmp/$n && ATTN_ROWS="1 16 64" ATTN_DEPTHS="96 256 480" timeout 60 build/bin/attn_bench $R/attn_$n.json > $R/attn_$n.txt 2>&1)
  (cd /tmp/$n && ATTN_ROWS="1 16" ATTN_DEPTHS="8000" ATTN_CTX=8192 timeout 60 build/bin/attn_bench $R/attnd_$n.json >> $R/attn_$n.txt 2>&1)
done
paste <(awk '{print $1,$2,$5}' $R/attn_m.txt) <(awk '{print $5}' $R/attn_cf.txt)
stamp attn
for r in 1 2; do for n in m cf; do for t in q4 f16; do
  (cd /tmp/$n && timeout 60 build/bin/step_bench $W/$t.bin 512 16 128,256,400 50 2>&1 >/dev/null | sed "s/^/$n r$r $t /" >> $R/steps.txt)
done; done; done
for n in m cf; do (cd /tmp/$n && timeout 60 build/bin/step_bench $W/q4.bin 512 64 128,256,400 50 2>&1 >/dev/null | sed "s/^/$n q4 /" >> $R/steps.txt); done
cat $R/steps.txt
stamp steps
}
export -f body stamp unpack tests
timeout 560 bash -c "R=$R ROOT=$ROOT; body"
finish
