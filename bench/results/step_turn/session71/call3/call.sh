# session 71 call 3: main (m71) against exp/zsplit (decode grids with the splits slowest) and exp/occ3 (zsplit + the
# tensor-core decode kernel capped for three blocks a multiprocessor): attn_bench, step_bench (q4 16 / 64 rows, f16
# 16), the attention tests on both variants.
source .gpu/common.sh
body() {
stamp start
for n in m71 zs o3; do unpack $n; done
for n in m71 zs o3; do (cd /tmp/$n && make -j6 CRITERION=.crit DATA=/tmp/shared all build/bin/attn_bench build/bin/step_bench build/run_tests > $R/build_$n.log 2>&1; echo rc=$? >> $R/build_$n.log) & done; wait
tail -qn1 $R/build_*.log
stamp built
W=/tmp/djinn_qbench; mkdir -p $W
(cd /tmp/m71 && source bench/lib.sh && WORK=$W DATA=/tmp/shared && make_hf 8b $W/hf_8b $W/make.log && convert_once $W/hf_8b $W/q4.bin q4 && convert_once $W/hf_8b $W/f16.bin f16) > $R/make.txt 2>&1 &
for n in m71 zs o3; do
  (cd /tmp/$n && ATTN_ROWS="1 16 64" ATTN_DEPTHS="96 256 480" timeout 60 build/bin/attn_bench $R/attn_$n.json > $R/attn_$n.txt 2>&1)
  (cd /tmp/$n && ATTN_ROWS="1 16" ATTN_DEPTHS="8000" ATTN_CTX=8192 timeout 60 build/bin/attn_bench $R/attnd_$n.json >> $R/attn_$n.txt 2>&1)
done
wait; stamp models
for r in 1 2; do for n in m71 zs o3; do
  (cd /tmp/$n && timeout 60 build/bin/step_bench $W/q4.bin 512 16 128,256,400 50 2>&1 >/dev/null | sed "s/^/$n r$r q4 /" >> $R/steps.txt)
done; done
for n in m71 zs o3; do (cd /tmp/$n && timeout 60 build/bin/step_bench $W/q4.bin 512 64 128,256,400 50 2>&1 >/dev/null | sed "s/^/$n q4 /" >> $R/steps.txt); done
for n in m71 zs o3; do (cd /tmp/$n && timeout 60 build/bin/step_bench $W/f16.bin 512 16 128,256,400 50 2>&1 >/dev/null | sed "s/^/$n f16 /" >> $R/steps.txt); done
cat $R/steps.txt
stamp steps
tests /tmp/o3 $R/tests_o3.txt 'kernels/attention*' 'kernels/decode*' 'gpu_forward/*'
stamp tests
}
export -f body stamp unpack tests
timeout 570 bash -c "R=$R ROOT=$ROOT; body"
finish
