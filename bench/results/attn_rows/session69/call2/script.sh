# session 69 call 2 (warm): the whole suite on main (9b68e44: stop 68's review mends had run on no GPU), then the
# XD build's gpu and spec tests
source .gpu/common.sh
stamp start
(cd /tmp/m69 && DJINN_DATA=/tmp/shared DJINN_BIN=/tmp/m69/build/bin DJINN_TESTS=/tmp/m69/tests timeout 300 build/run_tests -j6 > $R/suite.txt 2>&1; echo "suite rc=$?" >> $R/suite.txt)
tail -3 $R/suite.txt; grep -E "^\[FAIL\]|CRASH" $R/suite.txt | head
stamp suite
tests /tmp/xd2 $R/tests_xd.log 'gpu*/*' 'spec*/*'
stamp done
finish
