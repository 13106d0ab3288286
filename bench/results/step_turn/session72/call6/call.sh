# session 72 call 6 (the budget's last minutes): exp/combfold's attention tests and attn_bench against main; no model.
source .gpu/common.sh
body() {
stamp start
unpack m; unpack cf
for n in m cf; do (cd /tmp/$n && make -j8 CRITERION=.crit DATA=/tmp/shared build/run_tests build/bin/attn_bench build/bin/djinn build/bin/convert > $R/build_$n.log 2>&1; echo rc=$? >> $R/build_$n.log) & done
wait; tail -qn1 $R/build_*.log
stamp built
tests /tmp/cf $R/tests_cf.txt 'kernels/attention*' 'kernels/decode*'
stamp tests
for n in m cf; do
  (cd /tmp/$n && ATTN_ROWS="1 16 64" ATTN_DEPTHS="96 256 480" timeout 40 build/bin/attn_bench $R/attn_$n.json > $R/attn_$n.txt 2>&1)
done
paste <(awk '{print $1,$2,$5}' $R/attn_m.txt) <(awk '{print $5}' $R/attn_cf.txt)
stamp attn
tests /tmp/cf $R/tests_cf.txt 'gpu_forward/*'
stamp fwd
}
export -f body stamp unpack tests
timeout 185 bash -c "R=$R ROOT=$ROOT; body"
finish
