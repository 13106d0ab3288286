#!/usr/bin/env bash
# bench/ab.sh: two builds of djinn on the same model, cases interleaved run by run (A, B, A, B, ...), so that a
# change that must not move the figures (a refactor) can be shown not to, within the noise the repeats show.
#
#   bench/ab.sh A_SRC B_SRC MODEL.bin OUT.json [REPS]
#
# A_SRC and B_SRC are source trees (each built with its own Makefile: `make -j16 all`). Cases, greedy, context
# 1024, each REPS times (default 3) per build:
#   resident_decode  all resident, a short prompt, 128 new tokens: decode ms/token
#   prefill_512      all resident, a 512-token prompt: prefill tokens/s
#   prefill_N        the same with an N-token prompt (BOS and N - 1 one-token words; context the power of two from
#                    1024 that holds it), e.g. prefill_513; not in the default CASES
#   decode_N         all resident, an N-token prompt (as prefill_N), then 64 new tokens: decode ms/token at that
#                    context (attention's share grows with it), e.g. decode_2000; not in the default CASES
#   min_link         the smallest ring djinn accepts, --cpu-share 0 (the link alone), NEW tokens: decode ms/token
#   min_share        the smallest ring, --cpu-share auto (the default), NEW tokens: decode ms/token
#   min_share_F      the same at the fixed share F, e.g. min_share_0.5; not in the default CASES
#   ring_G_share     a ring of G GB, --cpu-share auto, NEW tokens: decode ms/token, e.g. ring_4_share; not in the
#                    default CASES (ring_G_share_F: at the fixed share F)
# CASES (default all four) picks some; NEW (default 16) the tokens of the min_* and ring_* cases. B_MODEL (default
# MODEL) gives B a model of its own: the same checkpoint converted by B's converter where the two builds' formats
# differ. Prints a table (median, min, max per build and case; B's median against A's; each rep's B against the A run
# beside it) and writes every run to OUT.json.
set -uo pipefail
[ $# -ge 4 ] || { sed -n '2,23p' "$0"; exit 2; }
A=$1 B=$2 MODEL=$3 OUT_JSON=$4 REPS=${5:-3}
B_MODEL=${B_MODEL:-$MODEL}
NEW=${NEW:-16}
model_of() { [ "$1" = "$B" ] && echo "$B_MODEL" || echo "$MODEL"; }
LOGS=$(mktemp -d /tmp/djinn_ab.XXXXXX)

for src in "$A" "$B"; do
    echo "== build $src ($(date +%T))"
    make -C "$src" -j16 all > "$LOGS/build_$(basename "$src").log" 2>&1 ||
        { tail -20 "$LOGS/build_$(basename "$src").log"; echo "ab: build of $src failed" >&2; exit 1; }
done

# 511 one-token words after BOS: a 512-token prompt for any Llama tokenizer that has " the" as one token.
LONG=$(printf 'the %.0s' $(seq 511))
LONG=${LONG% }
n=$("$B/djinn" "$B_MODEL" --tokenize -p "$LONG" | wc -w)
echo "long prompt: $n tokens"

min=$("$B/djinn" "$B_MODEL" -p x -n 1 -t 0 -c 1024 --ring-gb 0.001 2>&1 >/dev/null |
      sed -n 's/.*needs at least \([0-9][0-9.]*\) GB.*/\1/p' | head -1)
[ -n "$min" ] || { echo "ab: no minimum ring in djinn's error line" >&2; exit 1; }
echo "minimum ring: $min GB"

run() {  # build case rep -> one JSON line
    local src=$1 case=$2 rep=$3 args g stats="$LOGS/stats.json" ctx=1024
    case $case in
        resident_decode) args=(-p "Once upon a time" -n 128) ;;
        prefill_512) args=(-p "$LONG" -n 4) ;;
        prefill_[0-9]*)
            args=(-p "$(printf 'the %.0s' $(seq $((${case#prefill_} - 1))) | sed 's/ $//')" -n 4)
            while [ "$ctx" -lt $((${case#prefill_} + 4)) ]; do ctx=$((ctx * 2)); done ;;
        decode_[0-9]*)
            args=(-p "$(printf 'the %.0s' $(seq $((${case#decode_} - 1))) | sed 's/ $//')" -n 64)
            while [ "$ctx" -lt $((${case#decode_} + 64)) ]; do ctx=$((ctx * 2)); done ;;
        min_link) args=(-p "Once upon a time" -n "$NEW" --ring-gb "$min" --cpu-share 0) ;;
        min_share) args=(-p "Once upon a time" -n "$NEW" --ring-gb "$min") ;;
        min_share_[0-9]*) args=(-p "Once upon a time" -n "$NEW" --ring-gb "$min" --cpu-share "${case#min_share_}") ;;
        ring_*_share) g=${case#ring_}; args=(-p "Once upon a time" -n "$NEW" --ring-gb "${g%_share}") ;;
        ring_*_share_*) g=${case#ring_}
            args=(-p "Once upon a time" -n "$NEW" --ring-gb "${g%%_*}" --cpu-share "${case##*_share_}") ;;
    esac
    rm -f "$stats"
    if ! timeout 300 "$src/djinn" "$(model_of "$src")" -t 0 -c "$ctx" --stats-json "$stats" "${args[@]}" \
            > /dev/null 2> "$LOGS/run.log" || [ ! -s "$stats" ]; then
        echo "ab: $src $case failed:" >&2
        tail -3 "$LOGS/run.log" >&2
        return 1
    fi
    python3 -c 'import json, sys
d = json.load(open(sys.argv[1])); d.update(build=sys.argv[2], case=sys.argv[3], rep=int(sys.argv[4]))
print(json.dumps(d))' "$stats" "$src" "$case" "$rep"
}

: > "$LOGS/runs.jsonl"
for case in ${CASES:-resident_decode prefill_512 min_link min_share}; do
    echo "== $case ($(date +%T))"
    for ((r = 0; r < REPS; r++)); do
        for src in "$A" "$B"; do run "$src" "$case" "$r" >> "$LOGS/runs.jsonl" || exit 1; done
    done
done

python3 - "$LOGS/runs.jsonl" "$OUT_JSON" "$A" "$B" << 'EOF'
import json, statistics, sys
runs = [json.loads(l) for l in open(sys.argv[1])]
a, b = sys.argv[3], sys.argv[4]
json.dump({"runs": runs, "a": a, "b": b}, open(sys.argv[2], "w"), indent=1)
metric = {"resident_decode": ("decode_ms_per_token", "ms/token"), "min_link": ("decode_ms_per_token", "ms/token"),
          "min_share": ("decode_ms_per_token", "ms/token")}
for case in sorted({r["case"] for r in runs if r["case"].startswith(("min_share_", "decode_", "ring_"))}):
    metric[case] = ("decode_ms_per_token", "ms/token")
for case in sorted({r["case"] for r in runs if r["case"].startswith("prefill_")}, key=lambda c: int(c[8:])):
    metric[case] = ("prefill_tok_s", "tok/s")
# Paired: each rep's B over the A run just before it, which shares most of the host's drift (runs a few seconds apart
# drift by up to 5% on the GPU machine); "B better" counts the pairs where B won.
print(f"| case | unit | A median (min-max) | B median (min-max) | B / A | paired B / A median (min-max) | B better |")
print("|---|---|---|---|---|---|---|")
for case, (key, unit) in metric.items():
    va = [r[key] for r in runs if r["case"] == case and r["build"] == a]
    vb = [r[key] for r in runs if r["case"] == case and r["build"] == b]
    if not va or not vb:
        continue
    ma, mb = statistics.median(va), statistics.median(vb)
    ra = {r["rep"]: r[key] for r in runs if r["case"] == case and r["build"] == a}
    rb = {r["rep"]: r[key] for r in runs if r["case"] == case and r["build"] == b}
    pr = [rb[k] / ra[k] for k in sorted(ra) if k in rb and ra[k] > 0]
    better = sum(p < 1 if unit == "ms/token" else p > 1 for p in pr)
    paired = f"{statistics.median(pr):.3f} ({min(pr):.3f}-{max(pr):.3f})" if pr else "-"
    print(f"| {case} | {unit} | {ma:.2f} ({min(va):.2f}-{max(va):.2f}) | {mb:.2f} ({min(vb):.2f}-{max(vb):.2f}) "
          f"| {mb / ma:.3f} | {paired} | {better} of {len(pr)} |")
EOF
