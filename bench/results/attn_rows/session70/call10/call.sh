# session 70 call 10: graph_now (graph_fits split in two) on the GPU: the graph-replaying tests and the rest of gpu*
source .gpu/common.sh
stamp start
unpack m72
D=/tmp/m72
(cd $D && make -j16 CRITERION=.crit DATA=/tmp/shared all build/run_tests > $R/build.log 2>&1; echo rc=$? >> $R/build.log); tail -1 $R/build.log
stamp built
tests $D $R/tests.log 'gpu*/*' 'spec*/*'
grep -E "^\[FAIL\]|CRASH" $R/tests.log | head
stamp tests
finish
