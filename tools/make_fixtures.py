#!/usr/bin/env python3
"""Creates the small random-weight HF Llama checkpoints that the logit-parity tests use.

usage: python3 tools/make_fixtures.py OUTDIR

Writes OUTDIR/<name>/{config.json, model.safetensors} for each fixture below. All use vocab 512 so that they
share the stories260K tokenizer (./convert/convert ... --tokenizer $DATA/models/stories260K). Together with
stories260K (f32, tied, GQA 2:1, default RoPE) they cover: GQA, tied and untied heads, bf16 and f16 weights,
head_dim != hidden_size / num_attention_heads, and llama3 RoPE scaling at positions where it changes the result.

Weights are drawn with a fixed seed at scales that keep activations O(1) (attention far from uniform, so a RoPE
or GQA mistake shows up in the logits), rather than transformers' tiny default init. Needs torch + transformers.
"""
import json
import math
import os
import sys

import torch
from transformers import LlamaConfig, LlamaForCausalLM

FIXTURES = {
    # GQA 2:1, untied head, head_dim 48 != 128 / 4, llama3 RoPE with a tiny original context (32) so that the
    # scaling bands matter within the reference's >= 128 positions.
    "llama3_gqa_bf16": dict(
        dtype=torch.bfloat16,
        config=dict(hidden_size=128, intermediate_size=192, num_hidden_layers=3, num_attention_heads=4,
                    num_key_value_heads=2, head_dim=48, max_position_embeddings=256, tie_word_embeddings=False,
                    rms_norm_eps=1e-5,
                    rope=dict(rope_type="llama3", rope_theta=500000.0, factor=8.0, low_freq_factor=1.0,
                              high_freq_factor=4.0, original_max_position_embeddings=32)),
    ),
    # GQA 3:1, tied head, default RoPE, f16.
    "tied_gqa_f16": dict(
        dtype=torch.float16,
        config=dict(hidden_size=96, intermediate_size=160, num_hidden_layers=4, num_attention_heads=6,
                    num_key_value_heads=2, head_dim=16, max_position_embeddings=256, tie_word_embeddings=True,
                    rms_norm_eps=1e-6, rope=dict(rope_type="default", rope_theta=10000.0)),
    ),
    # Multi-head (no GQA), untied, head_dim 32 != 64 / 4, default RoPE with another theta, f16.
    "mha_untied_f16": dict(
        dtype=torch.float16,
        config=dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                    num_key_value_heads=4, head_dim=32, max_position_embeddings=256, tie_word_embeddings=False,
                    rms_norm_eps=1e-5, rope=dict(rope_type="default", rope_theta=50000.0)),
    ),
}

MAX_BYTES = 1_500_000


def make_config(spec):
    c = dict(spec)
    rope = c.pop("rope")
    common = {**dict(vocab_size=512, bos_token_id=1, eos_token_id=2, hidden_act="silu", attention_bias=False,
                     mlp_bias=False), **c}  # tools/shape_check.py gives vocab_size
    # transformers 5 reads rope_parameters; older versions rope_theta + rope_scaling. Try the new form first.
    try:
        cfg = LlamaConfig(rope_parameters=dict(rope), **common)
        got = getattr(cfg, "rope_parameters", None) or {}
        if got.get("rope_type") != rope["rope_type"] or float(got.get("rope_theta", -1)) != rope["rope_theta"]:
            raise TypeError("rope_parameters not taken")
    except TypeError:
        scaling = {k: v for k, v in rope.items() if k != "rope_theta"}
        cfg = LlamaConfig(rope_theta=rope["rope_theta"],
                          rope_scaling=None if rope["rope_type"] == "default" else scaling, **common)
    return cfg


@torch.no_grad()
def randomize(model, seed):
    g = torch.Generator().manual_seed(seed)
    for name, p in sorted(model.named_parameters()):
        if p.dim() == 1:  # RMSNorm weights around 1
            p.copy_(0.5 + torch.rand(p.shape, generator=g, dtype=torch.float64))
        elif "embed_tokens" in name:
            p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float64))
        else:
            fan_in = p.shape[1]
            gain = 2.0 if ("q_proj" in name or "k_proj" in name) else 1.0  # sharper attention
            p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float64) * gain / math.sqrt(fan_in))


@torch.no_grad()
def logits_of(model, ids):
    return model(torch.tensor([ids]), use_cache=False).logits[0].double()


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: make_fixtures.py OUTDIR")
    out = sys.argv[1]
    for i, (name, spec) in enumerate(FIXTURES.items()):
        cfg = make_config(spec["config"])
        torch.manual_seed(1000 + i)
        model = LlamaForCausalLM(cfg).to(torch.float64).eval()
        randomize(model, 1000 + i)
        if cfg.tie_word_embeddings and model.lm_head.weight.data_ptr() != model.model.embed_tokens.weight.data_ptr():
            model.lm_head.weight = model.model.embed_tokens.weight  # randomize() saw one of them only
        model = model.to(spec["dtype"])
        d = os.path.join(out, name)
        os.makedirs(d, exist_ok=True)
        model.save_pretrained(d)  # safetensors (the only format in transformers 5)
        for f in os.listdir(d):  # only config.json and model.safetensors are wanted
            if f not in ("config.json", "model.safetensors"):
                os.remove(os.path.join(d, f))
        size = os.path.getsize(os.path.join(d, "model.safetensors"))
        assert size <= MAX_BYTES, f"{name}: {size} bytes > {MAX_BYTES}"

        # Reload from disk exactly as tools/reference.py will, and check that llama3 scaling matters.
        saved = json.load(open(os.path.join(d, "config.json")))
        m64 = LlamaForCausalLM.from_pretrained(d, dtype=torch.float64, attn_implementation="eager").eval()
        rope = spec["config"]["rope"]
        if rope["rope_type"] == "llama3":
            ids = [1] + [(7 * t) % 500 + 3 for t in range(159)]
            scaled = logits_of(m64, ids)
            plain_cfg = make_config({**spec["config"], "rope": dict(rope_type="default", rope_theta=rope["rope_theta"])})
            plain = LlamaForCausalLM(plain_cfg).to(torch.float64).eval()
            plain.load_state_dict(m64.state_dict())
            base = logits_of(plain, ids)
            rel = ((scaled - base).norm(dim=-1) / base.norm(dim=-1))
            print(f"{name}: llama3 vs default RoPE, rel L2 at position 0 {rel[0]:.2e}, 31 {rel[31]:.2e}, "
                  f"159 {rel[-1]:.2e}")
            assert rel[-1] > 1e-2, "llama3 scaling does not change the logits: the fixture would test nothing"
        print(f"{name}: {size} bytes, dtype {spec['dtype']}, rope {saved.get('rope_parameters') or saved.get('rope_scaling')}, "
              f"tied {saved.get('tie_word_embeddings')}, heads {cfg.num_attention_heads}/{cfg.num_key_value_heads}, "
              f"head_dim {cfg.head_dim}")


if __name__ == "__main__":
    main()
