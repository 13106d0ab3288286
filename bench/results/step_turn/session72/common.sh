# sourced by .gpu scripts on the device: $OUT set; run from the repo root copy
set -u
ROOT=$(pwd)
R=$OUT/r; mkdir -p $R
stamp() { echo "== $* $(date +%T)" | tee -a $R/stamps.txt; }
unpack() { # NAME: .gpu/NAME.tgz -> /tmp/NAME with .crit .shared
  local n=$1
  if [ ! -d /tmp/$n ]; then
    mkdir -p /tmp/$n
    if [ -f $ROOT/.gpu/$n.tgz ]; then tar xzf $ROOT/.gpu/$n.tgz -C /tmp/$n
    else # the carried tree (main) plus .gpu/NAME.patch when there is one
      (cd $ROOT && tar cf - --exclude=./bench/results --exclude=./.gpu --exclude=./.crit --exclude=./.shared --exclude=./build .) | tar xf - -C /tmp/$n
      if [ -f $ROOT/.gpu/$n.patch ]; then (cd /tmp/$n && git apply $ROOT/.gpu/$n.patch) || echo "PATCH $n FAILED"; fi
    fi
  fi
  rm -rf /tmp/$n/.crit; cp -r $ROOT/.crit /tmp/$n/.crit
  [ -d /tmp/shared ] || cp -r $ROOT/.shared /tmp/shared
}
build() { # DIR LOG TARGETS...
  local d=$1 log=$2; shift 2
  (cd $d && make -j14 CRITERION=.crit DATA=/tmp/shared all build/run_tests "$@" > $log 2>&1; echo "build rc=$?" >> $log); tail -2 $log
}
tests() { # DIR LOG FILTERS...
  local d=$1 log=$2; shift 2
  for f in "$@"; do (cd $d && DJINN_DATA=/tmp/shared DJINN_BIN=$d/build/bin DJINN_TESTS=$d/tests timeout 500 build/run_tests -j4 --filter "$f" >> $log 2>&1; echo "tests $f rc=$?" >> $log); done
  grep -E "Synthesis|rc=" $log | tail -20
}
finish() { (cd $OUT && tar czf r.tgz r && rm -rf r); }
