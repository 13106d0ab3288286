#!/usr/bin/env python3
"""Reference logits from HF transformers, for ./djinn MODEL --check REF.bin.

usage: python3 tools/reference.py HF_DIR -p PROMPT -o REF.bin [-n N] [--tokenizer DIR]

Runs the HF model in float64 on the checkpoint's own weights (bf16/f16/f32 widen exactly), tokenizes PROMPT with
tokenizer.json from DIR (default HF_DIR; BOS added by its post-processor, as the engine does), greedy-continues
N tokens (default 0), and writes, little-endian:
    char magic[8] "DJINNREF"; u32 version = 1; u32 n_tokens; u32 n_prompt; u32 vocab;
    i32 ids[n_tokens]; f32 logits[n_tokens][vocab]
where logits row t is the model's output at position t (predicting token t+1) over the whole sequence.
Needs torch + transformers (+ tokenizers).
"""
import argparse
import os
import struct
import sys

import torch
from transformers import AutoModelForCausalLM


def encode(tok_dir, text):
    path = os.path.join(tok_dir, "tokenizer.json")
    try:
        from tokenizers import Tokenizer
        return Tokenizer.from_file(path).encode(text).ids
    except ImportError:
        from transformers import AutoTokenizer
        return AutoTokenizer.from_pretrained(tok_dir)(text)["input_ids"]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("hf_dir")
    ap.add_argument("-p", "--prompt", required=True)
    ap.add_argument("-o", "--out", required=True)
    ap.add_argument("-n", type=int, default=0, help="greedy tokens to append (default 0)")
    ap.add_argument("--tokenizer", help="folder with tokenizer.json (default: HF_DIR)")
    a = ap.parse_args()

    torch.set_grad_enabled(False)
    ids = encode(a.tokenizer or a.hf_dir, a.prompt)
    if not ids:
        sys.exit("reference.py: the prompt encodes to no tokens")
    n_prompt = len(ids)
    model = AutoModelForCausalLM.from_pretrained(a.hf_dir, dtype=torch.float64, attn_implementation="eager").eval()
    assert next(model.parameters()).dtype == torch.float64

    # Greedy continuation by full recomputation: no KV-cache code path between the reference and its logits.
    for _ in range(a.n):
        logits = model(torch.tensor([ids]), use_cache=False).logits[0, -1]
        ids.append(int(torch.argmax(logits)))
    logits = model(torch.tensor([ids]), use_cache=False).logits[0].to(torch.float64)  # (T, vocab)
    T, vocab = logits.shape
    assert T == len(ids)
    if not torch.isfinite(logits).all():
        sys.exit("reference.py: non-finite logits")

    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    with open(a.out, "wb") as f:
        f.write(b"DJINNREF" + struct.pack("<4I", 1, T, n_prompt, vocab))
        f.write(struct.pack(f"<{T}i", *ids))
        flat = logits.reshape(-1).tolist()
        f.write(struct.pack(f"<{len(flat)}f", *flat))  # rounds each float64 to the nearest float32
    print(f"{a.out}: {T} positions ({n_prompt} prompt), vocab {vocab}, ids {ids[:8]}{'...' if T > 8 else ''}",
          file=sys.stderr)


if __name__ == "__main__":
    main()
