#!/usr/bin/env node
// tok_cases.mjs: tokenizer parity cases from HF `tokenizers` through its Node binding (the npm package `tokenizers`,
// native code built from the same Rust crate as the Python wheel). The committed files under tests/tok/ that this
// script writes were made with tokenizers 0.23.2 (npm), which also reproduces every case tools/tok_cases.py made
// with the Python 0.23 wheel.
//
//   npm install --prefix /tmp/hf tokenizers@0.23.2
//   node tools/tok_cases.mjs /tmp/hf/node_modules/tokenizers ../shared tests/tok
//
// Writes, in the format of DATA/tokenizers/*_cases.json ([{text, ids, decoded}], ids = encode(text) with BOS by
// the post-processor and special tokens in the text matched, decoded = decode(ids, skip_special_tokens=True)):
//   llama3_unicode16.json         hand-picked texts with letters and digits added in Unicode 15.0-16.0 (which
//                                 HF's regex engine classes as \p{L}/\p{N}) and 17.0 (which it does not)
//   llama3_unicode16_random.json  random texts drawing on the same blocks, mixed with English and punctuation
//   llama2_metaspace_<v>.json     Llama 2's tokenizer.json with the normalizer removed and the pre-tokenizer
//                                 llama2_metaspace_<v>.pretok.json (Metaspace, as transformers' non-legacy Llama
//                                 conversion writes it), for every prepend_scheme and split the engine supports
import { readFileSync, writeFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { resolve } from 'node:path';

// Blocks new in Unicode 15.0-16.0, and some of 17.0 (unassigned in 16.0: no class in HF 0.23).
const NEW_BLOCKS = [
    [0x10ec0, 0x10eff], [0x11b00, 0x11b5f], [0x11f00, 0x11f5f], [0x1d2c0, 0x1d2df], [0x1e030, 0x1e08f],  // 15.0
    [0x1e4d0, 0x1e4ff], [0x31350, 0x323af], [0x1df25, 0x1df2a],
    [0x2ebf0, 0x2ee5f], [0x2ffc, 0x2fff],                                                                // 15.1
    [0x105c0, 0x105ff], [0x10d40, 0x10d8f], [0x11380, 0x113ff], [0x116d0, 0x116ff], [0x11bc0, 0x11bff],  // 16.0
    [0x16100, 0x1613f], [0x16d40, 0x16d7f], [0x1cc00, 0x1ceaf], [0x1e5d0, 0x1e5ff], [0x13460, 0x143ff],
    [0x1c89, 0x1c8a], [0xa7cb, 0xa7cd], [0xa7da, 0xa7dc],
    [0x323b0, 0x3347f], [0x10940, 0x1095f], [0x1e6c0, 0x1e6ff], [0x16ea0, 0x16edf], [0x11db0, 0x11def],  // 17.0
];
const cp = (...cps) => String.fromCodePoint(...cps);
const HAND = [
    // the audit's examples (issue 3)
    `${cp(0x1c89)}'S`, `${cp(0x1e4f0)}'T`, ` ${cp(0x1e4f0)}`,
    // Cyrillic TJE and Latin letters of 16.0 inside words; contractions after them
    `x${cp(0x1c8a)}y ${cp(0x1c89)}${cp(0x1c8a)}'ll go`, `${cp(0xa7cb)}${cp(0xa7dc)}ab 'd${cp(0xa7da)}'re`,
    `${cp(0x1df25, 0x1df26)}'ve ${cp(0x1df2a)}`,
    // CJK Extension H (15.0) and I (15.1)
    `${cp(0x31350, 0x31351, 0x31352)}'s ${cp(0x323af)}.`, `(${cp(0x2ebf0, 0x2ebf1)}) ${cp(0x2ee5d)}?`,
    // Kawi letters and digits (15.0)
    `${cp(0x11f04, 0x11f05, 0x11f12)} ${cp(0x11f50, 0x11f51, 0x11f52, 0x11f53, 0x11f54)}`,
    // Garay (16.0): digits, letters of both cases, a modifier letter, a dash
    `${cp(0x10d40, 0x10d41, 0x10d42, 0x10d43)} ${cp(0x10d50, 0x10d70, 0x10d4e)}${cp(0x10d6e)}x`,
    // Nag Mundari (15.0): letters, a modifier letter, digits
    `${cp(0x1e4d0, 0x1e4d1, 0x1e4eb)} ${cp(0x1e4f0, 0x1e4f1, 0x1e4f2, 0x1e4f3, 0x1e4f4, 0x1e4f5, 0x1e4f6)}`,
    // digits of other new scripts, in runs longer than \p{N}{1,3}
    `${cp(0x11bf0, 0x11bf1, 0x11bf2, 0x11bf3)}a${cp(0x16d70, 0x16d71)} ${cp(0x1e5f1, 0x1e5f2, 0x1e5f3, 0x1e5f4)}`,
    `${cp(0x16130, 0x16131, 0x16132)}7${cp(0x116d0, 0x116d1)} ${cp(0x1ccf0, 0x1ccf1, 0x1ccf2, 0x1ccf3)}!`,
    `Kaktovik ${cp(0x1d2c0, 0x1d2c1, 0x1d2c2, 0x1d2c3)} 2024`,
    // letters of new scripts after punctuation and spaces
    `"${cp(0x11380, 0x11381)}" .${cp(0x11bc0)} -${cp(0x16100)} ${cp(0x105c0)}`, `\t${cp(0x1e5d0)}\n${cp(0x13460)}`,
    `${cp(0x1e030, 0x1e031)}a ${cp(0x10ec2, 0x10ec3)} ${cp(0x16d40)}x`,
    // new characters that are not letters or digits: punctuation, marks, symbols
    `a${cp(0x11b00)}b ${cp(0x11241)}c ${cp(0x2ffc)}${cp(0x31350)}`,
    // Unicode 17.0 additions: unassigned for HF 0.23, so not letters
    `${cp(0x323b0)}x ${cp(0x10940)}'s ${cp(0x1e6c0)}${cp(0x16ea0)} ${cp(0x11db0)}1`,
];
const WORDS = ('the a of and to in is you that it he was for on are as with his they I at be this have from or one ' +
               "had by word but not what all were we when your can said there use Hello WORLD Don't can't it's").split(' ');
const PUNCT = [...'.,;:!?\'"()[]{}<>-_=+*/\\|@#$%^&~`', '...', '--', '’', '“', '”', "'s", "'T", "'ll", "'RE"];
const SPACES = [' ', '  ', '   ', '\t', '\n', '\n\n', ' \n ', '\r\n', '\u3000'];
const LLAMA3_SPECIALS = ['<|begin_of_text|>', '<|eot_id|>', '<|start_header_id|>', '<|end_header_id|>'];
const LLAMA2_SPECIALS = ['<s>', '</s>', '<unk>'];

let seed = 0;
function rand() {  // mulberry32
    seed = (seed + 0x6d2b79f5) | 0;
    let t = Math.imul(seed ^ (seed >>> 15), 1 | seed);
    t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
}
const randint = (lo, hi) => lo + Math.floor(rand() * (hi - lo + 1));
const choice = (a) => a[Math.floor(rand() * a.length)];

function newChars(n) {
    let s = '';
    for (let i = 0; i < n; i++) {
        const [lo, hi] = choice(NEW_BLOCKS);
        s += cp(randint(lo, hi));
    }
    return s;
}

// pNew: the share of parts drawn from NEW_BLOCKS
function randText(specials, pNew) {
    const parts = [];
    for (let n = randint(1, 20); n > 0; n--) {
        const r = rand();
        if (r < pNew) parts.push(newChars(randint(1, 6)));
        else if (r < pNew + 0.35) parts.push(rand() < 0.05 ? choice(WORDS).toUpperCase() : choice(WORDS));
        else if (r < pNew + 0.45) parts.push(String(randint(0, 10 ** randint(1, 6))));
        else if (r < pNew + 0.6) parts.push(choice(PUNCT));
        else if (r < pNew + 0.65) parts.push(choice(specials));
        else parts.push(cp(choice([randint(0x21, 0x7e), randint(0xa0, 0x2fff), randint(0x1f300, 0x1faff)])));
        // glue the next part on directly often: "x𞓰'T", "(𱍐", "12𐵀"
        parts.push(rand() < 0.4 ? '' : rand() < 0.3 ? choice(SPACES) : ' ');
    }
    let t = parts.join('');
    if (rand() < 0.3) t = t.trim();
    if (rand() < 0.15) t = choice(SPACES) + t;
    return t;
}

async function writeCases(tok, texts, path) {
    const cases = [];
    for (const text of texts) {
        const ids = (await tok.encode(text)).getIds();
        cases.push({ text, ids, decoded: await tok.decode(ids, true) });
    }
    writeFileSync(path, '[\n' + cases.map((c) => JSON.stringify(c)).join(',\n') + '\n]\n');
    process.stderr.write(`${path}: ${cases.length} cases\n`);
}

const [tokDir, data, out] = process.argv.slice(2);
if (!out) {
    process.stderr.write('usage: node tools/tok_cases.mjs TOKENIZERS_DIR DATA OUTDIR\n');
    process.exit(2);
}
const { Tokenizer } = createRequire(import.meta.url)(resolve(tokDir));

const llama3 = Tokenizer.fromFile(`${data}/tokenizers/llama3/tokenizer.json`);
await writeCases(llama3, HAND, `${out}/llama3_unicode16.json`);
seed = 16;
await writeCases(llama3, Array.from({ length: 400 }, () => randText(LLAMA3_SPECIALS, 0.3)), `${out}/llama3_unicode16_random.json`);

// Metaspace variants: edge cases of the prepend scheme (leading spaces, special tokens first or in the middle, a
// literal "▁" in the text), then random texts.
const EDGES = ['', ' ', 'a', ' a', '  a', 'a ', 'a  b', '<s>', '<s>a', '<s> a', 'a<s>b', 'a <s> b', ' <s>', '</s>x',
               '\n', 'x\ny', '\u2581', '\u2581a', 'a\u2581b', '\u2581 a', 'Hello world', ' Hello world', 'é ü 😀'];
const base = JSON.parse(readFileSync(`${data}/tokenizers/llama2/tokenizer.json`, 'utf8'));
for (const scheme of ['first', 'always', 'never']) {
    for (const split of [false, true]) {
        const name = `llama2_metaspace_${scheme}${split ? '_split' : ''}`;
        const pretok = { type: 'Metaspace', replacement: '\u2581', prepend_scheme: scheme, split };
        writeFileSync(`${out}/${name}.pretok.json`, JSON.stringify(pretok) + '\n');
        const tok = Tokenizer.fromString(JSON.stringify({ ...base, normalizer: null, pre_tokenizer: pretok }));
        seed = 2;
        const texts = EDGES.concat(Array.from({ length: 150 }, () => randText(LLAMA2_SPECIALS, 0.05)));
        await writeCases(tok, texts, `${out}/${name}.json`);
    }
}
