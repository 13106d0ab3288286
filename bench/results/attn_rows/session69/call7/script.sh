# session 69 call 7: the whole suite on main 582a1dc (the decode attention's new aim)
source .gpu/common.sh
stamp start
unpack fin69
(cd /tmp/fin69 && make -j14 CRITERION=.crit DATA=/tmp/shared all build/run_tests build/bin/repeat_layers > $R/build.log 2>&1; echo rc=$? >> $R/build.log); tail -1 $R/build.log
stamp built
(cd /tmp/fin69 && DJINN_DATA=/tmp/shared DJINN_BIN=/tmp/fin69/build/bin DJINN_TESTS=/tmp/fin69/tests timeout 250 build/run_tests -j6 > $R/suite.txt 2>&1; echo "suite rc=$?" >> $R/suite.txt)
tail -3 $R/suite.txt; grep -E "^\[FAIL\]|CRASH" $R/suite.txt | head
stamp done
finish
