#!/usr/bin/env python3
"""Random-weight Llama-shaped HF checkpoints for the GPU benchmarks (bench/run_gpu_bench.sh, bench/ab.sh).

usage: python3 tools/make_random_llama.py --shape 7b|13b|8b|70b|tiny --out DIR [--dtype float16] [--seed N]
                                          [--layers N]

Writes DIR/{config.json, model-0000N-of-0000M.safetensors, model.safetensors.index.json} (5 GB shards) with the
real shapes: 7b and 13b as Llama 2 (untied head, MHA, vocab 32000 so $DATA/tokenizers/llama2 fits, RoPE theta
10000), 8b as Llama 3 (GQA 32/8 heads, FFN 14336, vocab 128256 so $DATA/tokenizers/llama3 fits, RoPE theta
500000), 70b as Llama 3 70B (see SHAPES); RMSNorm eps 1e-5; 'tiny' is a small Llama-2 shape, for a dry run of the whole pipeline. --layers keeps
the layer shape with fewer (or more) layers.

Fast: the model is built on the meta device (no CPU init), materialised on the GPU in the target dtype, and
every matrix drawn there with normal_(0, 0.02) from one seeded CUDA generator; norm weights are 1. A 7B model
takes seconds to make; saving is disk-bound. Needs torch + transformers and a GPU.
Weights of std 0.02 keep activations O(1) through every layer in f16 (no overflow in HF's f16 eager path).
"""
import argparse
import inspect
import os
import sys
import time

L2 = dict(vocab_size=32000, rope_theta=10000.0)
SHAPES = {
    # hidden, layers, heads, ffn as published; context 4096.
    "7b": dict(hidden_size=4096, num_hidden_layers=32, num_attention_heads=32, intermediate_size=11008, **L2),
    "13b": dict(hidden_size=5120, num_hidden_layers=40, num_attention_heads=40, intermediate_size=13824, **L2),
    "8b": dict(hidden_size=4096, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
               intermediate_size=14336, vocab_size=128256, rope_theta=500000.0),
    # Llama-3-70B's layer shape (GQA 64/8 heads, FFN 28672); 80 layers in f16 are 141 GB, more than the GPU
    # machine's disk: benchmarks take --layers N and scale the ring to the same fraction of the model.
    "70b": dict(hidden_size=8192, num_hidden_layers=80, num_attention_heads=64, num_key_value_heads=8,
                intermediate_size=28672, vocab_size=128256, rope_theta=500000.0),
    "tiny": dict(hidden_size=512, num_hidden_layers=4, num_attention_heads=8, intermediate_size=1376, **L2),
}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", required=True, choices=sorted(SHAPES))
    ap.add_argument("--out", required=True, help="output folder (created)")
    ap.add_argument("--dtype", default="float16", choices=["float16", "bfloat16", "float32"])
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--layers", type=int, default=0, help="number of layers (default: the shape's)")
    a = ap.parse_args()

    t0 = time.time()
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    if not torch.cuda.is_available():
        sys.exit("make_random_llama: no CUDA device (this script materialises the weights on the GPU)")
    dtype = getattr(torch, a.dtype)
    torch.set_grad_enabled(False)
    print(f"make_random_llama: imports {time.time() - t0:.1f} s", flush=True)

    s = dict(SHAPES[a.shape])
    s.setdefault("num_key_value_heads", s["num_attention_heads"])
    if a.layers > 0:
        s["num_hidden_layers"] = a.layers
    ids = dict(bos_token_id=128000, eos_token_id=128001) if s["vocab_size"] == 128256 else dict(bos_token_id=1,
                                                                                                eos_token_id=2)
    cfg = LlamaConfig(max_position_embeddings=4096, rms_norm_eps=1e-5, hidden_act="silu", tie_word_embeddings=False,
                      attention_bias=False, mlp_bias=False, initializer_range=0.02, **ids, **s)

    # Meta first: no allocation, no default init; then storage on the GPU, filled below (to_empty leaves it
    # uninitialised). Non-persistent buffers (RoPE inv_freq) are not saved, so their garbage never matters.
    t1 = time.time()
    try:
        with torch.device("meta"):
            model = LlamaForCausalLM(cfg)
        model = model.to(dtype).to_empty(device="cuda")
    except Exception as ex:  # a transformers that cannot build on meta: build on the GPU (f32 init, then cast)
        print(f"make_random_llama: meta init failed ({ex}); building on the GPU instead", flush=True)
        model = None
        torch.cuda.empty_cache()
        with torch.device("cuda"):
            model = LlamaForCausalLM(cfg)
        model = model.to(dtype)
    gen = torch.Generator(device="cuda").manual_seed(a.seed)
    n_params = n_bytes = 0
    for name, p in model.named_parameters():
        if p.dim() == 1:
            p.fill_(1.0)  # RMSNorm weights
        else:
            p.normal_(0.0, 0.02, generator=gen)
        n_params += p.numel()
        n_bytes += p.numel() * p.element_size()
        assert p.dtype == dtype and p.device.type == "cuda", name
    torch.cuda.synchronize()
    t2 = time.time()
    print(f"make_random_llama: {a.shape}: {n_params / 1e9:.3f} B parameters, {n_bytes / 1e9:.3f} GB {a.dtype}, "
          f"made on the GPU in {t2 - t1:.1f} s", flush=True)

    os.makedirs(a.out, exist_ok=True)
    kw = dict(max_shard_size="5GB")
    if "safe_serialization" in inspect.signature(model.save_pretrained).parameters:
        kw["safe_serialization"] = True  # transformers < 5; in 5 safetensors is the only format
    model.save_pretrained(a.out, **kw)
    t3 = time.time()
    files = sorted(os.listdir(a.out))
    on_disk = sum(os.path.getsize(os.path.join(a.out, f)) for f in files)
    if not any(f.endswith(".safetensors") for f in files):
        sys.exit(f"make_random_llama: no .safetensors written in {a.out}: {files}")
    print(f"make_random_llama: saved {len(files)} files, {on_disk / 1e9:.3f} GB in {t3 - t2:.1f} s "
          f"({on_disk / 1e9 / max(t3 - t2, 1e-9):.2f} GB/s) to {a.out}; total {t3 - t0:.1f} s", flush=True)


if __name__ == "__main__":
    main()
