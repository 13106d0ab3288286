#!/usr/bin/env python3
"""json_seeds.py DATA CORPUS: the generated seeds of fuzz_hfconfig and fuzz_tokjson (`make fuzz-seeds`).

fuzz_hfconfig: the committed fixtures' and stories260K's config.json, and a Llama 3 config with llama3 RoPE in the
transformers-5 form, alone and beside the classic one. fuzz_tokjson (tokenizer.json, tokenizer_config.json, generation_config.json, config.json,
0xFF between them): stories260K's four files (SentencePiece-style BPE, byte fallback); its tokenizer.json behind a
Metaspace pre-tokenizer (both forms), with a chat template list and an eos list; and Llama 3's tokenizer.json cut
to its first 400 tokens (the 256 bytes among them), the merges among those and three special tokens (byte-level
BPE), with its tokenizer_config.json, and again with its merges as strings.
"""
import json
import os
import sys


def put(corpus, target, name, data):
    os.makedirs(os.path.join(corpus, target), exist_ok=True)
    with open(os.path.join(corpus, target, "seed_" + name), "wb") as f:
        f.write(data)


def read(path):
    with open(path, "rb") as f:
        return f.read()


def main():
    data, corpus = sys.argv[1], sys.argv[2]
    here = os.path.dirname(os.path.abspath(__file__))
    fixtures = os.path.join(here, "..", "fixtures")
    for name in sorted(os.listdir(fixtures)):
        put(corpus, "fuzz_hfconfig", "config_" + name, read(os.path.join(fixtures, name, "config.json")))
    stories = os.path.join(data, "models", "stories260K")
    put(corpus, "fuzz_hfconfig", "config_stories260K", read(os.path.join(stories, "config.json")))
    l3 = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2,
          "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 16, "intermediate_size": 160,
          "vocab_size": 300, "rms_norm_eps": 1e-5, "tie_word_embeddings": True, "max_position_embeddings": 8192,
          "rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
                              "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}}
    put(corpus, "fuzz_hfconfig", "config_llama3_rope_parameters", json.dumps(l3).encode())
    both = dict(l3, rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                  "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
                rope_theta=500000.0)
    put(corpus, "fuzz_hfconfig", "config_llama3_both_forms", json.dumps(both).encode())

    sep = b"\xff"
    files = [read(os.path.join(stories, f)) for f in
             ("tokenizer.json", "tokenizer_config.json", "generation_config.json", "config.json")]
    put(corpus, "fuzz_tokjson", "stories260K", sep.join(files))
    # the same vocabulary behind a Metaspace pre-tokenizer (no normalizer), in the newer and the older form, with a
    # chat template list and an eos list beside it
    st = json.loads(files[0])
    st["normalizer"] = None
    st["pre_tokenizer"] = {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "first", "split": False}
    side = [json.dumps({"add_bos_token": True, "chat_template": [{"name": "tool", "template": "T"},
                                                                 {"name": "default", "template": "{{ x }}"}]}),
            json.dumps({"eos_token_id": [2, 0]}), json.dumps({"bos_token_id": 1, "eos_token_id": 2})]
    put(corpus, "fuzz_tokjson", "stories260K_metaspace",
        sep.join([json.dumps(st, ensure_ascii=False).encode()] + [x.encode() for x in side]))
    st["pre_tokenizer"] = {"type": "Metaspace", "replacement": "\u2581", "add_prefix_space": True}
    put(corpus, "fuzz_tokjson", "stories260K_metaspace_old", json.dumps(st, ensure_ascii=False).encode())

    tok = json.loads(read(os.path.join(data, "tokenizers", "llama3", "tokenizer.json")))
    vocab = tok["model"]["vocab"]
    keep = {p: i for p, i in vocab.items() if i < 400}
    merges = []
    for m in tok["model"]["merges"]:
        a, b = m.split(" ") if isinstance(m, str) else m
        if a in keep and b in keep and a + b in keep:
            merges.append(m)
    tok["model"]["vocab"] = keep
    tok["model"]["merges"] = merges
    names = ("<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>")
    tok["added_tokens"] = [dict(t, id=400 + names.index(t["content"])) for t in tok["added_tokens"]
                           if t["content"] in names]
    # the post-processor names the BOS token by its id: 128000 becomes 400
    text = json.dumps(tok, ensure_ascii=False).replace('"ids": [128000]', '"ids": [400]')
    cfg = read(os.path.join(data, "tokenizers", "llama3", "tokenizer_config.json"))
    put(corpus, "fuzz_tokjson", "llama3_400", text.encode() + sep + cfg)
    tok["model"]["merges"] = [" ".join(m) if not isinstance(m, str) else m for m in merges]  # the older form
    text = json.dumps(tok, ensure_ascii=False).replace('"ids": [128000]', '"ids": [400]')
    put(corpus, "fuzz_tokjson", "llama3_string_merges", text.encode())


if __name__ == "__main__":
    main()
