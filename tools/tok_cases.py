#!/usr/bin/env python3
"""Random tokenizer parity cases from HF `tokenizers` (run where it is installed: the GPU machine).

usage: tools/tok_cases.py DATA OUTDIR [N]
Writes OUTDIR/{llama2,llama3,tok512}_random.json in the format of DATA/tokenizers/*_cases.json:
[{text, ids, decoded}], ids = Tokenizer.from_file(...).encode(text).ids (BOS by the post-processor, special
tokens in the text matched as special), decoded = decode(ids, skip_special_tokens=True). The texts mix
English, whitespace runs, digits, punctuation, contractions, many scripts, emoji, combining marks and
special-token strings, so that tests/test_tokenizer.c checks far more than the hand-written cases.
"""
import json
import random
import sys

from tokenizers import Tokenizer

WORDS = ("the a of and to in is you that it he was for on are as with his they I at be this have from or one "
         "had by word but not what all were we when your can said there use an each which she do how their if "
         "will up other about out many then them these so some her would make like him into time has look two "
         "more write go see number no way could people my than first water been call who oil its now find long "
         "down day did get come made may part Hello WORLD Don't can't it's we're I'll they've she'd").split()
SCRIPTS = ["Привет мир", "日本語のテキスト", "中文字符测试", "한국어 문장", "مرحبا بالعالم", "שלום עולם",
           "Ελληνικά γράμματα", "हिन्दी पाठ", "ภาษาไทย", "Tiếng Việt có dấu", "naïve café résumé", "straße ſ",
           "😀🚀🎉👍🏽", "e\u0301 a\u0308 n\u0303", "\u200b\u00a0\u2003", "ℕ ℤ ∑ ∞ ≠", "①②③ ½ ¾", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢"]
PUNCT = list(".,;:!?'\"()[]{}<>-_=+*/\\|@#$%^&~`") + ["...", "--", "’", "“", "”", "«", "»"]
SPACES = [" ", "  ", "   ", "\t", "\n", "\n\n", " \n ", "\r\n", "\u3000"]


def rand_text(rng, specials):
    parts = []
    for _ in range(rng.randint(1, 24)):
        r = rng.random()
        if r < 0.45:
            w = rng.choice(WORDS)
            parts.append(w.upper() if rng.random() < 0.05 else w)
        elif r < 0.55:
            parts.append(str(rng.randint(0, 10 ** rng.randint(1, 9))))
        elif r < 0.65:
            parts.append(rng.choice(PUNCT))
        elif r < 0.75:
            s = rng.choice(SCRIPTS)
            i = rng.randint(0, len(s) - 1)
            parts.append(s[i:i + rng.randint(1, 8)])
        elif r < 0.80 and specials:
            parts.append(rng.choice(specials))
        elif r < 0.85:
            parts.append(chr(rng.choice([rng.randint(0x20, 0x7e), rng.randint(0xa0, 0x2fff), rng.randint(0x1f300, 0x1faff)])))
        parts.append(rng.choice(SPACES) if rng.random() < 0.3 else " ")
    t = "".join(parts)
    if rng.random() < 0.3:
        t = t.strip()
    if rng.random() < 0.1:
        t = rng.choice(SPACES) + t
    return t


def main():
    data, out = sys.argv[1], sys.argv[2]
    n = int(sys.argv[3]) if len(sys.argv) > 3 else 400
    sets = [("llama2", f"{data}/tokenizers/llama2/tokenizer.json", ["<s>", "</s>", "<unk>"]),
            ("llama3", f"{data}/tokenizers/llama3/tokenizer.json",
             ["<|begin_of_text|>", "<|eot_id|>", "<|start_header_id|>", "<|end_header_id|>"]),
            ("tok512", f"{data}/models/stories260K/tokenizer.json", ["<s>", "</s>"])]
    for name, path, specials in sets:
        tok = Tokenizer.from_file(path)
        rng = random.Random(1234 + len(name))
        cases = []
        for _ in range(n):
            text = rand_text(rng, specials)
            ids = tok.encode(text).ids
            cases.append({"text": text, "ids": ids, "decoded": tok.decode(ids, skip_special_tokens=True)})
        with open(f"{out}/{name}_random.json", "w", encoding="utf-8") as f:
            json.dump(cases, f, ensure_ascii=False, indent=0)
        print(f"{name}: {n} cases", file=sys.stderr)


if __name__ == "__main__":
    main()
