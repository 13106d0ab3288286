#!/usr/bin/env python3
"""HF transformers baselines for the GPU benchmark (bench/run_gpu_bench.sh): one mode per process.

usage: python3 bench/hf_baseline.py HF_DIR --mode gpu|cpu_offload|auto --out OUT.json
                                    [--ids FILE | --prompt-len 512] [-n 32] [--budget-gb G] [--attn eager]

Modes (all f16, greedy, KV cache on):
  gpu          the whole model on the GPU
  cpu_offload  accelerate.cpu_offload: weights in CPU memory, every module's weights copied to the GPU at each
               forward (everything streamed, pageable memory)
  auto         device_map="auto", max_memory={0: G GB (1e9 bytes, the same budget as djinn --ring-gb G),
               'cpu': 120 GiB}: what does not fit is offloaded to the CPU and streamed each forward

Measured, in this order:
  load_s       from_pretrained (+ cpu_offload), from whatever the page cache holds
  warmup_s     one 16-token forward (CUDA/cuBLAS init, first weight copies), not counted anywhere else
  prefill_s    the prompt's forward with use_cache=True (logits for the last position only, as djinn does)
  ttft_ms      prefill + argmax of the first token, synchronised
  decode       n+1 greedy steps of one token each; the first is a warm-up (new GEMV shapes), the next n are
               timed one by one: decode_ms_per_token is their mean (decode_ms_median also given)
The prompt ids come from --ids (a line of space-separated ids written by ./djinn MODEL --tokenize, BOS
included, so both engines see the same tokens), else a fixed pseudo-random list of --prompt-len ids.
"""
import argparse
import json
import os
import random
import statistics
import sys
import time


def read_ids(path):
    with open(path) as f:
        ids = [int(x) for x in f.read().split()]
    if not ids:
        sys.exit(f"hf_baseline: no token ids in {path}")
    return ids


def param_bytes(model, device_type=None):
    # parameters() yields a tied tensor once; offloaded modules keep meta params of the right numel.
    return sum(p.numel() * p.element_size() for p in model.parameters()
               if device_type is None or p.device.type == device_type)


def load(a, torch):
    from transformers import AutoModelForCausalLM
    common = dict(dtype=torch.float16, attn_implementation=a.attn)
    info = {}
    if a.mode == "gpu":
        model = AutoModelForCausalLM.from_pretrained(a.hf_dir, device_map={"": 0}, **common)
    elif a.mode == "auto":
        budget = int(round(a.budget_gb * 1e9))
        info["max_memory_gpu_bytes"] = budget
        model = AutoModelForCausalLM.from_pretrained(
            a.hf_dir, device_map="auto", max_memory={0: budget, "cpu": 120 * 2**30}, **common)
        placement = getattr(model, "hf_device_map", {}) or {}
        info["device_map_devices"] = sorted({str(v) for v in placement.values()})
    else:  # cpu_offload
        from accelerate import cpu_offload
        model = AutoModelForCausalLM.from_pretrained(a.hf_dir, **common)  # on the CPU
        info["model_gb_cpu"] = param_bytes(model) / 1e9
        cpu_offload(model, execution_device=torch.device("cuda:0"))
    return model.eval(), info


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("hf_dir")
    ap.add_argument("--mode", required=True, choices=["gpu", "cpu_offload", "auto"])
    ap.add_argument("--out", required=True, help="JSON output path")
    ap.add_argument("--ids", help="file with the prompt's token ids (./djinn MODEL --tokenize -p TEXT)")
    ap.add_argument("--prompt-len", type=int, default=512, help="length of the fallback random prompt")
    ap.add_argument("-n", type=int, default=32, help="timed decode tokens (after one warm-up step)")
    ap.add_argument("--budget-gb", type=float, default=16.0, help="auto: GPU max_memory in GB (1e9 bytes)")
    ap.add_argument("--attn", default="eager", help="attn_implementation (default eager)")
    ap.add_argument("--note", default="", help="free text stored in the JSON")
    a = ap.parse_args()
    if a.n < 1:
        sys.exit("hf_baseline: -n must be >= 1")

    t_imp = time.time()
    import torch
    import transformers
    import accelerate
    if not torch.cuda.is_available():
        sys.exit("hf_baseline: no CUDA device")
    torch.set_grad_enabled(False)
    print(f"hf_baseline: {a.mode}: imports {time.time() - t_imp:.1f} s", flush=True)

    if a.ids:
        ids = read_ids(a.ids)
        ids_from = a.ids
    else:
        rng = random.Random(512)
        ids = [1] + [rng.randrange(3, 32000) for _ in range(a.prompt_len - 1)]
        ids_from = f"pseudo-random, seed 512, {a.prompt_len} ids"

    torch.cuda.synchronize()
    t0 = time.time()
    model, info = load(a, torch)
    torch.cuda.synchronize()
    load_s = time.time() - t0
    # Inputs go where the embedding is; cpu_offload leaves it on the meta device and computes on cuda:0.
    emb = model.get_input_embeddings().weight.device
    dev = emb if emb.type in ("cuda", "cpu") else torch.device("cuda:0")
    model_bytes = param_bytes(model)
    gpu_bytes = param_bytes(model, "cuda")
    vocab = model.config.vocab_size
    if max(ids) >= vocab:
        sys.exit(f"hf_baseline: prompt id {max(ids)} is outside the model's vocabulary of {vocab}")
    print(f"hf_baseline: {a.mode}: loaded {model_bytes / 1e9:.3f} GB ({gpu_bytes / 1e9:.3f} GB on the GPU) in "
          f"{load_s:.1f} s", flush=True)

    def forward(x, past=None):
        kw = dict(input_ids=x, use_cache=True)
        if past is not None:
            kw["past_key_values"] = past
        try:
            return model(**kw, logits_to_keep=1)
        except TypeError:  # transformers without logits_to_keep: all rows (slower prefill, same decode)
            return model(**kw)

    # Warm-up: kernels, cuBLAS handles, allocator; its cache is dropped.
    torch.cuda.synchronize()
    t = time.time()
    forward(torch.tensor([ids[:16]], device=dev))
    torch.cuda.synchronize()
    warmup_s = time.time() - t
    torch.cuda.reset_peak_memory_stats()

    x = torch.tensor([ids], device=dev)
    torch.cuda.synchronize()
    t = time.time()
    out = forward(x)
    torch.cuda.synchronize()
    prefill_s = time.time() - t
    logits = out.logits[0, -1].float()
    finite = bool(torch.isfinite(logits).all())
    nxt = int(torch.argmax(logits))
    ttft_ms = (time.time() - t) * 1e3
    past = out.past_key_values
    print(f"hf_baseline: {a.mode}: prompt {len(ids)} tokens, prefill {prefill_s:.3f} s, ttft {ttft_ms:.1f} ms",
          flush=True)

    steps, gen = [], [nxt]
    for i in range(a.n + 1):
        torch.cuda.synchronize()
        t = time.time()
        out = forward(torch.tensor([[nxt]], device=dev), past)
        nxt = int(torch.argmax(out.logits[0, -1]))  # .item() syncs
        dt = time.time() - t
        past = out.past_key_values
        gen.append(nxt)
        if i > 0:
            steps.append(dt)
        if i == 0 or (i % 8 == 0):
            print(f"hf_baseline: {a.mode}: decode step {i}: {dt * 1e3:.1f} ms", flush=True)
    ms = statistics.mean(steps) * 1e3

    res = dict(engine="hf", mode=a.mode, hf_dir=os.path.abspath(a.hf_dir), attn=a.attn, dtype="float16",
               torch=torch.__version__, transformers=transformers.__version__, accelerate=accelerate.__version__,
               model_gb=model_bytes / 1e9, weight_gb_on_gpu=gpu_bytes / 1e9,
               weight_gb_streamed=(model_bytes if a.mode == "cpu_offload" else model_bytes - gpu_bytes) / 1e9,
               load_s=load_s, load_gb_s=model_bytes / 1e9 / max(load_s, 1e-9), warmup_s=warmup_s,
               prompt_ids_from=ids_from, prompt_tokens=len(ids), prefill_s=prefill_s,
               prefill_tok_s=len(ids) / max(prefill_s, 1e-9), ttft_ms=ttft_ms, logits_finite=finite,
               decode_tokens=len(steps), decode_ms_per_token=ms, decode_ms_median=statistics.median(steps) * 1e3,
               decode_tok_s=1e3 / ms, decode_step_ms=[round(s * 1e3, 3) for s in steps],
               peak_gpu_mem_gb=torch.cuda.max_memory_allocated() / 1e9, generated_ids=gen, note=a.note, **info)
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    with open(a.out + ".tmp", "w") as f:
        json.dump(res, f, indent=1)
    os.replace(a.out + ".tmp", a.out)
    print(f"hf_baseline: {a.mode}: decode {len(steps)} tokens, {ms:.2f} ms/token ({1e3 / ms:.2f} tokens/s); "
          f"wrote {a.out}", flush=True)


if __name__ == "__main__":
    main()
