#!/usr/bin/env python3
"""Shapes the test fixtures do not have, checked end to end against HF transformers on the GPU machine.

usage: python3 tools/shape_check.py WORK_DIR [--data DIR] [--only NAME,...]

For each shape below: a random-weight HF Llama checkpoint (tools/make_fixtures.py's weight scales, so that
attention is far from uniform), its reference logits from tools/reference.py (float64; a prompt and 24 greedy
tokens, tokenized with stories260K's tokenizer from --data, default .shared), the checkpoint converted in its own
dtype and in q8 and q4, and ./djinn --check on every engine: the GPU all resident, at its minimum ring with the
CPU share off, automatic and fixed at 0.5, everything streamed with the share at 0.95, and the CPU. The shapes:
head_dim 40, 64, 80, 96, 128 and 256; GQA 3:1 and 4:1, MQA and none; hidden sizes and FFNs that are not multiples
of 32 (partial quantization groups); padded vocabularies larger than the tokenizer (49152, 32001, 777); tied and
untied heads; llama3 RoPE; f16, bf16 and f32 checkpoints. Prints one line per check and a count of failures;
exits 1 if any check failed (djinn's own tolerance: --check's exit status). Needs torch + transformers and a GPU.
"""
import argparse
import os
import re
import subprocess
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_fixtures import make_config, randomize  # noqa: E402
from transformers import LlamaForCausalLM  # noqa: E402

DEF = dict(rope_type="default", rope_theta=10000.0)
L3 = dict(rope_type="llama3", rope_theta=500000.0, factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
          original_max_position_embeddings=32)
# name: checkpoint dtype, hidden size, FFN, layers, heads, KV heads, head_dim, vocabulary, tied head, RoPE
ROWS = [
    ("hd64_gqa3_tied", torch.float16, 576, 1536, 3, 9, 3, 64, 49152, True, DEF),  # SmolLM-like
    ("hd80_gqa4", torch.bfloat16, 1280, 3456, 2, 16, 4, 80, 32000, False, DEF),  # Phi-like head_dim, Llama 2 vocab
    ("hd96_ffn2000_llama3", torch.float16, 768, 2000, 2, 8, 2, 96, 1000, False, L3),  # down: a partial group of 16
    ("hd256_mqa_tied", torch.float16, 1024, 2816, 2, 4, 1, 256, 32001, True, DEF),  # one KV head, an odd vocabulary
    ("dim200_hd40", torch.float32, 200, 520, 3, 5, 5, 40, 777, False, DEF),  # every row ends in a partial group
    ("hd128_gqa4_llama3", torch.bfloat16, 1024, 3584, 2, 8, 2, 128, 2048, False, L3),  # Llama-3-8B's proportions
]
SHAPES = {r[0]: (r[1], dict(hidden_size=r[2], intermediate_size=r[3], num_hidden_layers=r[4], num_attention_heads=r[5],
                            num_key_value_heads=r[6], head_dim=r[7], vocab_size=r[8], tie_word_embeddings=r[9],
                            rope=r[10])) for r in ROWS}
PROMPT = "Once upon a time, there was a little girl who loved to play in the park with her friends."
DTYPE_ARG = {torch.float16: "f16", torch.bfloat16: "bf16", torch.float32: "f32"}


def run(cmd, **kw):
    return subprocess.run(cmd, capture_output=True, text=True, **kw)


@torch.no_grad()
def make_model(dtype, spec, out, seed):
    cfg = make_config(dict(spec, max_position_embeddings=512, rms_norm_eps=1e-5))
    torch.manual_seed(seed)
    model = LlamaForCausalLM(cfg).to(torch.float64).eval()
    randomize(model, seed)
    if cfg.tie_word_embeddings and model.lm_head.weight.data_ptr() != model.model.embed_tokens.weight.data_ptr():
        model.lm_head.weight = model.model.embed_tokens.weight
    model.to(dtype).save_pretrained(out)


def min_ring(djinn, model):
    r = run([djinn, model, "-p", "x", "-n", "1", "-t", "0", "-c", "512", "--ring-gb", "0.0001"])
    m = re.search(r"needs at least ([0-9.]+) GB", r.stderr)
    return m.group(1) if m else None


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("work")
    ap.add_argument("--data", default=".shared")
    ap.add_argument("--only", default="")
    a = ap.parse_args()
    tok = os.path.join(a.data, "models", "stories260K")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    djinn, convert = os.path.join(root, "djinn"), os.path.join(root, "convert", "convert")
    os.makedirs(a.work, exist_ok=True)
    failed = total = 0
    for i, (name, (dtype, spec)) in enumerate(SHAPES.items()):
        if a.only and name not in a.only.split(","):
            continue
        hf, ref = os.path.join(a.work, name), os.path.join(a.work, name + ".ref")
        make_model(dtype, spec, hf, 2000 + i)
        r = run([sys.executable, os.path.join(root, "tools", "reference.py"), hf, "-p", PROMPT, "-o", ref, "-n", "24",
                 "--tokenizer", tok])
        if r.returncode:
            print(f"{name}: reference failed: {r.stderr.strip()[-300:]}", flush=True)
            failed += 1
            continue
        for dt in (DTYPE_ARG[dtype], "q8", "q4"):
            model = os.path.join(a.work, f"{name}_{dt}.bin")
            r = run([convert, hf, model, "--dtype", dt, "--tokenizer", tok, "-q"])
            if r.returncode:
                print(f"{name} {dt}: convert failed: {r.stderr.strip()[-300:]}", flush=True)
                failed += 1
                continue
            ring = min_ring(djinn, model)
            engines = [("gpu", []), ("cpu", ["--cpu"])]
            if ring:
                engines[1:1] = [("min ring, share off", ["--ring-gb", ring, "--cpu-share", "0"]),
                                ("min ring, share auto", ["--ring-gb", ring]),
                                ("min ring, share 0.5", ["--ring-gb", ring, "--cpu-share", "0.5"]),
                                ("stream all, share 0.95", ["--stream-all", "--cpu-share", "0.95"])]
            else:
                print(f"{name} {dt}: no minimum ring found (the streamed engines are not checked)", flush=True)
                failed += 1
            for label, extra in engines:
                total += 1
                r = run([djinn, model, "--check", ref, "-c", "512"] + extra)
                last = [ln for ln in r.stdout.splitlines() if ln.strip()][-2:]
                ok = r.returncode == 0
                failed += not ok
                print(f"{'ok  ' if ok else 'FAIL'} {name} {dt} {label}: rc {r.returncode}: {' | '.join(last)}"
                      + ("" if ok else f" | {r.stderr.strip()[-300:]}"), flush=True)
    print(f"shape_check: {total} checks, {failed} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
