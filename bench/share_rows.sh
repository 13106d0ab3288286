#!/usr/bin/env bash
# bench/share_rows.sh: the CPU share over passes of several rows on the GPU machine, in two stages that each fit in
# one call (the second reuses the first's build and model on the same machine).
#
#   bench/share_rows.sh OUT_DIR prepare   the host (lscpu), the build, cpu_matvec_multi on each vector path
#                                         (build/bin/cpu_matvec: AVX-512 tiles, then AVX2 ones, T = 1..32, against
#                                         the host read ceiling of the same run) -> OUT_DIR/cpu_matvec.{txt,json};
#                                         then the Llama-3-8B-shape checkpoint and its f16 model.bin
#                                         (bench/serve_bench.sh with no case)
#   bench/share_rows.sh OUT_DIR serve     bench/serve_bench.sh at the minimum ring, the link alone and the
#                                         automatic share, CONCURRENCY (default "1 8 32") greedy requests of
#                                         MAX_TOKENS (default 32) -> OUT_DIR/serve/
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
OUT_DIR=${1:?out dir}
STAGE=${2:?prepare or serve}
export DATA=${DATA:-.shared} BENCH_WORK=${BENCH_WORK:-/tmp/djinn_qbench}
mkdir -p "$OUT_DIR" "$BENCH_WORK" || exit 1
. bench/lib.sh

case $STAGE in
prepare)
    { lscpu; nvidia-smi --query-gpu=name,pcie.link.gen.current,pcie.link.width.current --format=csv; } > "$OUT_DIR/host.txt" 2>&1
    grep -E "Model name|^CPU\(s\)|Thread|Core|Socket|Flags" "$OUT_DIR/host.txt" | cut -c1-160
    say build
    make -j16 all build/bin/cpu_matvec build/bin/ceilings > "$BENCH_WORK/build.log" 2>&1 ||
        { tail -20 "$BENCH_WORK/build.log"; exit 1; }
    say "cpu_matvec (AVX-512 tiles, then AVX2)"
    build/bin/cpu_matvec "$OUT_DIR/cpu_matvec.json" 2 1,2,4,8,16,32 2,1 | tee "$OUT_DIR/cpu_matvec.txt"
    CASES=none AGENTS=0 bash bench/serve_bench.sh "$OUT_DIR/prep" 2>&1 | grep -v "unknown case"
    ;;
serve)
    CASES=${CASES:-min_share min_link} CONCURRENCY=${CONCURRENCY:-1 8 32} MAX_TOKENS=${MAX_TOKENS:-32} AGENTS=0 \
        SKIP_MAKE=1 bash bench/serve_bench.sh "$OUT_DIR/serve"
    ;;
*)
    echo "unknown stage $STAGE (prepare or serve)"
    exit 2
    ;;
esac
