# session 70 call 9: the q4 and f16 servers at 16 / 64 concurrent, two rounds interleaved, on main (tidy69 landed);
# D2D from attn_bench in the same call
source .gpu/common.sh
stamp start
unpack m71
D=/tmp/m71
(cd $D && make -j16 CRITERION=.crit DATA=/tmp/shared all build/bin/attn_bench > $R/build.log 2>&1; echo rc=$? >> $R/build.log); tail -1 $R/build.log
stamp built
(cd $D && ATTN_ROWS="1" ATTN_DEPTHS="256" timeout 60 build/bin/attn_bench $R/attn.json > $R/attn.txt 2>&1); head -1 $R/attn.txt
for r in 1 2; do for t in f16 q4; do
  (cd $D && DATA=/tmp/shared DTYPE=$t CASES=resident_link CONCURRENCY="16 64" MAX_TOKENS=160 AGENTS=0 timeout 200 bash bench/serve_bench.sh $R/serve_${t}_$r > $R/serve_${t}_$r.log 2>&1)
  stamp serve $t $r; grep -h 'resident_link |' $R/serve_${t}_$r.log
done; done
finish
