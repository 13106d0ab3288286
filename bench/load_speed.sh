#!/usr/bin/env bash
# Load speed against the disk, in one run (issue 2: "a big model loads at the disk's read speed").
#   bench/load_speed.sh [GB] [DIR]    (default 6 GB of f16 weights, in /tmp/djinn_load; needs root to drop caches)
# Env: LOAD_ARGS (default --cpu; empty on the GPU machine to time the page-locked load), OUT_JSON (default
# bench/results/load_speed.json).
# Makes a Llama-2-7B-shaped checkpoint of about GB gigabytes (fewer layers; F32, sparse, so it costs no disk
# until converted), converts it to f16, then with the page cache dropped before each: the disk's sequential read
# speed (dd, O_DIRECT, 64 MiB blocks, one stream and eight), and djinn's load (--cpu: no page-locking here, so what is timed is the
# parallel read into memory). Then a load from the page cache. Prints one table and writes $OUT_JSON.
set -euo pipefail
cd "$(dirname "$0")/.."
GB=${1:-6}
DIR=${2:-/tmp/djinn_load}
DATA=${DATA:-../shared}
LOAD_ARGS=${LOAD_ARGS---cpu}
OUT_JSON=${OUT_JSON:-bench/results/load_speed.json}
[ "$(id -u)" = 0 ] || { echo "load_speed: must run as root (drops the page cache)" >&2; exit 1; }
mkdir -p "$DIR/hf"
make -s all
python3 - "$DIR/hf" "$GB" <<'PY'
import json, os, struct, sys
out, gb = sys.argv[1], float(sys.argv[2])
dim, hid, heads, vocab = 4096, 11008, 32, 32000
per_layer = 4 * dim * dim + 3 * dim * hid          # matrices of one layer
layers = max(1, round((gb * 1e9 / 2 - 2 * vocab * dim) / per_layer))
cfg = dict(architectures=["LlamaForCausalLM"], model_type="llama", hidden_size=dim, intermediate_size=hid,
           num_attention_heads=heads, num_key_value_heads=heads, num_hidden_layers=layers, vocab_size=vocab,
           max_position_embeddings=4096, rms_norm_eps=1e-5, rope_theta=10000.0, hidden_act="silu",
           tie_word_embeddings=False, bos_token_id=1, eos_token_id=2)
json.dump(cfg, open(os.path.join(out, "config.json"), "w"))
shapes = {"model.embed_tokens.weight": [vocab, dim], "model.norm.weight": [dim], "lm_head.weight": [vocab, dim]}
for l in range(layers):
    p = f"model.layers.{l}."
    for n, s in (("self_attn.q_proj", [dim, dim]), ("self_attn.k_proj", [dim, dim]), ("self_attn.v_proj", [dim, dim]),
                 ("self_attn.o_proj", [dim, dim]), ("mlp.gate_proj", [hid, dim]), ("mlp.up_proj", [hid, dim]),
                 ("mlp.down_proj", [dim, hid]), ("input_layernorm", [dim]), ("post_attention_layernorm", [dim])):
        shapes[p + n + ".weight"] = s
hdr, off = {}, 0
for name, s in shapes.items():
    n = 4
    for d in s: n *= d
    hdr[name] = dict(dtype="F32", shape=s, data_offsets=[off, off + n])
    off += n
h = json.dumps(hdr).encode()
h += b" " * (-len(h) % 8)
with open(os.path.join(out, "model.safetensors"), "wb") as f:
    f.write(struct.pack("<Q", len(h)) + h)
    f.truncate(8 + len(h) + off)            # zeros, stored sparse
print(f"checkpoint: {layers} layers, {off / 1e9:.1f} GB F32 (sparse)")
PY
rm -f "$DIR/model.bin"
./convert/convert "$DIR/hf" "$DIR/model.bin" --dtype f16 --tokenizer "$DATA/models/stories260K" -q
rm -rf "$DIR/hf"
size=$(stat -c %s "$DIR/model.bin")
drop() { sync; echo 3 > /proc/sys/vm/drop_caches; }
# The disk's read speed: the best of one sequential stream and 8 streams on disjoint eighths (as djinn's loader
# reads), O_DIRECT so that no cache helps.
read_with() {  # streams
    local n=$1 blocks=$(((size + (64 << 20) - 1) >> 26)) i t0 t1
    drop
    t0=$(date +%s.%N)
    for ((i = 0; i < n; i++)); do
        dd if="$DIR/model.bin" of=/dev/null bs=64M iflag=direct status=none skip=$((blocks * i / n)) \
            count=$((blocks * (i + 1) / n - blocks * i / n)) &
    done
    wait
    t1=$(date +%s.%N)
    python3 -c "print(f'{$t1 - $t0:.3f} {$size / ($t1 - $t0) / 1e9:.3f}')"
}
read -r d1_s d1 <<< "$(read_with 1)"
read -r d8_s d8 <<< "$(read_with 8)"
if python3 -c "import sys; sys.exit(not $d8 > $d1)"; then disk=$d8 disk_s=$d8_s; else disk=$d1 disk_s=$d1_s; fi
load() { ./djinn "$DIR/model.bin" $LOAD_ARGS -p x -n 0 2>&1 >/dev/null | sed -n 's/.*loaded .* in \([0-9.]*\) s (\([0-9.]*\) GB\/s).*/\1 \2/p'; }
drop
read -r cold_s cold_gbs <<< "$(load)"
read -r warm_s warm_gbs <<< "$(load)"
ratio=$(python3 -c "print(f'{$cold_gbs / $disk:.3f}')")
cpu=$(lscpu | sed -n 's/^Model name: *//p' | head -1)
printf '| what | GB | s | GB/s | of disk read |\n|---|---|---|---|---|\n'
gb=$(python3 -c "print(f'{$size / 1e9:.2f}')")
printf '| disk read, 1 stream (dd, O_DIRECT) | %s | %s | %s | %s |\n' "$gb" "$d1_s" "$d1" \
    "$(python3 -c "print(f'{$d1 / $disk:.2f}')")"
printf '| disk read, 8 streams (dd, O_DIRECT) | %s | %s | %s | %s |\n' "$gb" "$d8_s" "$d8" \
    "$(python3 -c "print(f'{$d8 / $disk:.2f}')")"
printf '| djinn load, cold page cache | %s | %s | %s | %s |\n' "$gb" "$cold_s" "$cold_gbs" "$ratio"
printf '| djinn load, warm page cache | %s | %s | %s | - |\n' "$gb" "$warm_s" "$warm_gbs"
echo "machine: $cpu, $(nproc) cores; disk: $(df -h "$DIR" | tail -1 | awk '{print $1}')"
cat > "$OUT_JSON" <<JSON
{"date": "$(date +%F)", "machine": "$cpu, $(nproc) cores, $(free -g | awk '/Mem:/ {print $2}') GiB", "load_args": "$LOAD_ARGS", "model_bytes": $size, "disk_read_1_stream_gb_s": $d1,
 "disk_read_8_streams_gb_s": $d8, "disk_read_gb_s": $disk,
 "load_cold_s": $cold_s, "load_cold_gb_s": $cold_gbs, "load_warm_s": $warm_s, "load_warm_gb_s": $warm_gbs,
 "cold_load_of_disk": $ratio}
JSON
rm -f "$DIR/model.bin"
