// test_tokenizer.c: the tokenizer against HF `tokenizers` (the *_cases.json dumps), loaded the way the engine
// loads it: tokjson on the real HF folder, then tok_load on the section.
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../json.h"
#include "../convert/tokjson.h"
#include "../chat.h"
#include "../tokenizer.h"
#include "../unicode_tables.h"
#include "common.h"

// ---- helpers
static char *tt_stream_all(const dj_tokenizer *t, const int32_t *ids, size_t n, size_t *len) {
    dj_tok_stream *s = tok_stream_new(t);
    cr_assert(s);
    size_t cap = 64, at = 0;
    char *out = malloc(cap);
    for (size_t i = 0; i <= n; i++) {
        size_t k;
        const char *p = i < n ? tok_stream_push(s, ids[i], &k) : tok_stream_flush(s, &k);
        // never part of a character: every chunk is valid UTF-8 on its own
        for (size_t j = 0; j < k;) {
            unsigned char c = (unsigned char)p[j];
            size_t w = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
            cr_assert(c < 0x80 || (c >= 0xC2 && c <= 0xF4), "stream chunk starts inside a character");
            cr_assert(j + w <= k, "stream chunk ends inside a character (id %zu)", i);
            for (size_t q = 1; q < w; q++) cr_assert(((unsigned char)p[j + q] & 0xC0) == 0x80);
            j += w;
        }
        while (at + k + 1 > cap) cap *= 2, out = realloc(out, cap);
        memcpy(out + at, p, k);
        at += k;
    }
    out[at] = 0;
    tok_stream_free(s);
    *len = at;
    return out;
}

// Every case of a cases file (DATA/tokenizers/<cases>, or a path under tests/): ids exactly, decode exactly,
// stream == decode. Frees t.
static void tt_run_cases_tok(dj_tokenizer *t, const char *cases) {
    char path[4096];
    if (!strncmp(cases, "tests/", 6)) snprintf(path, sizeof path, "%s", cases);
    else snprintf(path, sizeof path, "%s/tokenizers/%s", tc_data(), cases);
    size_t n;
    char *text = tc_read(path, &n);
    if (!text) cr_skip_test("%s is missing", path);
    dj_err e = {{0}};
    json_doc *d = json_parse(text, n, &e);
    cr_assert(d, "%s: %s", path, e.msg);
    const json_value *root = json_root(d);
    cr_assert(root->type == JSON_ARRAY && root->u.arr.n > 0);
    for (size_t c = 0; c < root->u.arr.n; c++) {
        const json_value *cs = &root->u.arr.items[c], *want = json_get(cs, "ids"), *in = json_get(cs, "text");
        const char *dec_want = json_str(json_get(cs, "decoded"));
        cr_assert(want && in && dec_want);
        int32_t *ids;
        size_t k;
        cr_assert_eq(tok_encode(t, in->u.str.s, in->u.str.len, 1, &ids, &k, &e), 0, "%s", e.msg);
        cr_expect_eq(k, want->u.arr.n, "%s case %zu \"%s\": %zu ids, HF gives %zu", cases, c, in->u.str.s, k, want->u.arr.n);
        for (size_t i = 0; i < k && i < want->u.arr.n; i++) {
            int64_t w;
            json_int(&want->u.arr.items[i], &w);
            cr_expect_eq(ids[i], w, "%s case %zu \"%s\": id %zu is %d, HF gives %lld", cases, c, in->u.str.s, i, ids[i], (long long)w);
        }
        // decode HF's ids, so a decode bug is not masked by an encode bug
        int32_t *hf = malloc(sizeof(int32_t) * (want->u.arr.n + 1));
        for (size_t i = 0; i < want->u.arr.n; i++) {
            int64_t w;
            json_int(&want->u.arr.items[i], &w);
            hf[i] = (int32_t)w;
        }
        size_t dl, sl;
        char *dec = tok_decode(t, hf, want->u.arr.n, &dl);
        cr_assert(dec);
        cr_expect_str_eq(dec, dec_want, "%s case %zu: decode", cases, c);
        char *st = tt_stream_all(t, hf, want->u.arr.n, &sl);
        cr_expect(sl == dl && memcmp(st, dec, dl) == 0, "%s case %zu: stream \"%s\" != decode \"%s\"", cases, c, st, dec);
        free(dec), free(st), free(hf), free(ids);
    }
    json_free(d);
    free(text);
    tok_free(t);
}
static void tt_run_cases(const char *rel_dir, const char *cases) { tt_run_cases_tok(tc_load_tokenizer(rel_dir), cases); }

// A variant of Llama 2's tokenizer.json built here from DATA's copy: no normalizer, and the pre-tokenizer in the
// committed fragment tests/tok/<name>.pretok.json (written with the cases by tools/tok_cases.mjs). The edit is
// textual, so the variant costs 80 bytes in the repository instead of 1.8 MB.
static dj_tokenizer *tt_load_llama2_variant(const char *name) {
    char path[4096], frag_path[4096];
    snprintf(path, sizeof path, "%s/tokenizers/llama2/tokenizer.json", tc_data());
    snprintf(frag_path, sizeof frag_path, "tests/tok/%s.pretok.json", name);
    size_t n, fn;
    char *s = tc_read(path, &n), *frag = tc_read(frag_path, &fn);
    if (!s) cr_skip_test("%s is missing", path);
    cr_assert(frag, "%s is missing", frag_path);
    // HF writes the normalizer right before the pre-tokenizer: replace both values in one splice
    const char *from = strstr(s, "\"normalizer\":"), *to = strstr(s, "\"pre_tokenizer\": null");
    cr_assert(from && to && from < to, "%s: no normalizer followed by \"pre_tokenizer\": null", path);
    static const char head[] = "\"normalizer\": null, \"pre_tokenizer\": ";
    size_t a = (size_t)(from - s), b = (size_t)(to - s) + strlen("\"pre_tokenizer\": null");
    char *m = malloc(n + fn + sizeof head);
    size_t mn = a;
    memcpy(m, s, a);
    memcpy(m + mn, head, sizeof head - 1), mn += sizeof head - 1;
    memcpy(m + mn, frag, fn), mn += fn;
    memcpy(m + mn, s + b, n - b), mn += n - b;
    uint8_t *blob;
    size_t bn;
    dj_err e = {{0}};
    cr_assert_eq(tokjson_build(m, mn, NULL, 0, NULL, 0, NULL, 0, &blob, &bn, &e), 0, "%s: %s", name, e.msg);
    dj_tokenizer *t = tok_load(blob, bn, &e);
    cr_assert(t, "tok_load: %s", e.msg);
    free(blob), free(m), free(frag), free(s);
    return t;
}
static void tt_run_variant_cases(const char *name) {
    char cases[256];
    snprintf(cases, sizeof cases, "tests/tok/%s.json", name);
    tt_run_cases_tok(tt_load_llama2_variant(name), cases);
}

// ---- HF parity
Test(tokenizer, llama2_cases) { tt_run_cases("tokenizers/llama2", "llama2_cases.json"); }
Test(tokenizer, llama3_cases) { tt_run_cases("tokenizers/llama3", "llama3_cases.json"); }
Test(tokenizer, tok512_cases) { tt_run_cases("models/stories260K", "tok512_cases.json"); }
// Random texts (many scripts, emoji, whitespace runs, digits, special-token strings) encoded by HF
// `tokenizers` 0.23 on the GPU machine with tools/tok_cases.py and committed.
Test(tokenizer, llama2_random_cases) { tt_run_cases("tokenizers/llama2", "tests/tok/llama2_random.json"); }
Test(tokenizer, llama3_random_cases) { tt_run_cases("tokenizers/llama3", "tests/tok/llama3_random.json"); }
Test(tokenizer, tok512_random_cases) { tt_run_cases("models/stories260K", "tests/tok/tok512_random.json"); }
// Letters and digits of Unicode 15.0-16.0 (and 17.0, which HF 0.23 does not class), hand-picked (the audit's
// examples first) and random, and Llama 2 with the Metaspace pre-tokenizer in every form the engine supports
// (prepend_scheme first/always/never, split false/true): from HF `tokenizers` 0.23.2 (npm) with tools/tok_cases.mjs.
Test(tokenizer, llama3_unicode16_cases) { tt_run_cases("tokenizers/llama3", "tests/tok/llama3_unicode16.json"); }
Test(tokenizer, llama3_unicode16_random_cases) { tt_run_cases("tokenizers/llama3", "tests/tok/llama3_unicode16_random.json"); }
Test(tokenizer, llama2_metaspace_first) { tt_run_variant_cases("llama2_metaspace_first"); }
Test(tokenizer, llama2_metaspace_first_split) { tt_run_variant_cases("llama2_metaspace_first_split"); }
Test(tokenizer, llama2_metaspace_always) { tt_run_variant_cases("llama2_metaspace_always"); }
Test(tokenizer, llama2_metaspace_always_split) { tt_run_variant_cases("llama2_metaspace_always_split"); }
Test(tokenizer, llama2_metaspace_never) { tt_run_variant_cases("llama2_metaspace_never"); }
Test(tokenizer, llama2_metaspace_never_split) { tt_run_variant_cases("llama2_metaspace_never_split"); }

// ---- the generated Unicode tables: the version HF `tokenizers` 0.23 uses, as tools/gen_unicode.mjs made them (it
// also checks every code point against HF's own regex engine), and not edited since
static int tt_uc_class(uint32_t cp) {  // a linear scan: the obvious reference for tokenizer.c's binary search
    for (size_t i = 0; i < UC_N_RANGES; i++)
        if (cp >= uc_ranges[i].lo && cp <= uc_ranges[i].hi) return uc_ranges[i].cls;
    return 0;
}
Test(tokenizer, unicode_tables) {
    cr_assert_str_eq(UNICODE_TABLES_VERSION, "16.0.0");
    uint64_t count[UC_S + 1] = {0};
    for (size_t i = 0; i < UC_N_RANGES; i++) {
        const uc_range *r = &uc_ranges[i];
        cr_assert(r->lo <= r->hi && r->hi < 0x110000 && r->cls >= UC_L && r->cls <= UC_S, "range %zu", i);
        cr_assert(i == 0 || r->lo > uc_ranges[i - 1].hi, "range %zu is out of order", i);
        count[r->cls] += r->hi - r->lo + 1;
    }
    // the figures gen_unicode.mjs prints for the Unicode 16.0.0 data
    cr_expect_eq(UC_N_RANGES, 831);
    cr_expect_eq(count[UC_L], 141028);
    cr_expect_eq(count[UC_N], 1911);
    cr_expect_eq(count[UC_S], 25);
    static const struct { uint32_t cp; int cls; } probe[] = {
        {'A', UC_L}, {'7', UC_N}, {' ', UC_S}, {0x3000, UC_S}, {0x4E00, UC_L}, {0x0301, 0},
        {0x1C89, UC_L},   // Cyrillic capital TJE (16.0)
        {0xA7DC, UC_L},   // Latin capital lambda with stroke (16.0)
        {0x1E4D0, UC_L},  // Nag Mundari letter (15.0)
        {0x1E4F0, UC_N},  // Nag Mundari digit zero (15.0)
        {0x31350, UC_L},  // CJK Extension H (15.0)
        {0x2EBF0, UC_L},  // CJK Extension I (15.1)
        {0x11F04, UC_L},  // Kawi letter (15.0)
        {0x11F50, UC_N},  // Kawi digit zero (15.0)
        {0x1D2C0, UC_N},  // Kaktovik numeral zero (15.0, No)
        {0x10D40, UC_N},  // Garay digit zero (16.0)
        {0x10D50, UC_L},  // Garay capital letter (16.0)
        {0x1CCF0, UC_N},  // outlined digit zero (16.0)
        {0x13460, UC_L},  // Egyptian hieroglyph, Extension A (16.0)
        {0x11B00, 0},     // Devanagari Extended-A punctuation (15.0)
        {0x11241, 0},     // Khojki vowel sign (15.0, a mark)
        {0x2FFC, 0},      // ideographic description character (15.1, a symbol)
        {0x323B0, 0},     // CJK Extension J (17.0): unassigned in 16.0, no class for HF 0.23 either
        {0x10940, 0},     // Sidetic (17.0)
    };
    for (size_t i = 0; i < sizeof probe / sizeof *probe; i++)
        cr_expect_eq(tt_uc_class(probe[i].cp), probe[i].cls, "U+%04X: class %d, expected %d", probe[i].cp,
                     tt_uc_class(probe[i].cp), probe[i].cls);
}

Test(tokenizer, llama3_meta_vector_and_specials) {
    dj_tokenizer *t = tc_load_tokenizer("tokenizers/llama3");
    const int32_t want[] = {128000, 2028, 374, 264, 1296, 11914, 13};
    int32_t *ids;
    size_t k;
    dj_err e;
    const char *s = "This is a test sentence.";
    cr_assert_eq(tok_encode(t, s, strlen(s), 1, &ids, &k, &e), 0);
    cr_assert_eq(k, 7);
    for (size_t i = 0; i < k; i++) cr_expect_eq(ids[i], want[i]);
    free(ids);
    // special tokens written in the text are matched; add_special 0 adds no BOS
    s = "<|start_header_id|>user<|end_header_id|>";
    cr_assert_eq(tok_encode(t, s, strlen(s), 0, &ids, &k, &e), 0);
    cr_assert_eq(k, 3);
    cr_expect_eq(ids[0], 128006);
    cr_expect_eq(ids[2], 128007);
    free(ids);
    cr_expect_eq(tok_bos(t), 128000);
    cr_expect(tok_is_eos(t, 128009), "<|eot_id|> (tokenizer_config eos_token) is an eos");
    cr_expect(!tok_is_eos(t, 128000));
    cr_expect_eq(tok_vocab_size(t), 128256);
    tok_free(t);
}

Test(tokenizer, stories_eos_bos) {
    dj_tokenizer *t = tc_load_tokenizer("models/stories260K");
    cr_expect_eq(tok_bos(t), 1);
    cr_expect(tok_is_eos(t, 2));
    cr_expect(!tok_is_eos(t, 1));
    cr_expect_str_eq(tok_chat_template(t), "");
    tok_free(t);
}

// ---- round trips and bad input
static uint32_t tt_rand(void) { return (uint32_t)(tc_next() >> 32); }  // the fixed seed unless DJINN_SEED
static size_t tt_put_cp(char *o, uint32_t cp) {
    if (cp < 0x80) { o[0] = (char)cp; return 1; }
    if (cp < 0x800) { o[0] = (char)(0xC0 | cp >> 6), o[1] = (char)(0x80 | (cp & 63)); return 2; }
    if (cp < 0x10000) {
        o[0] = (char)(0xE0 | cp >> 12), o[1] = (char)(0x80 | (cp >> 6 & 63)), o[2] = (char)(0x80 | (cp & 63));
        return 3;
    }
    o[0] = (char)(0xF0 | cp >> 18), o[1] = (char)(0x80 | (cp >> 12 & 63)), o[2] = (char)(0x80 | (cp >> 6 & 63));
    o[3] = (char)(0x80 | (cp & 63));
    return 4;
}
// Random valid UTF-8 mixing ASCII (no '<', so no special token appears), spaces/newlines, and any code point
// except U+2581 "▁", which SentencePiece-style tokenizers decode as a space (HF does the same).
static size_t tt_random_utf8(char *o, size_t max_chars) {
    size_t n = 0, chars = tt_rand() % max_chars;
    static const char ws[] = " \t\n\r  ";
    for (size_t i = 0; i < chars; i++) {
        uint32_t r = tt_rand() % 10, cp;
        if (r < 4) { do cp = 0x20 + tt_rand() % 95; while (cp == '<'); }
        else if (r < 6) cp = (uint32_t)ws[tt_rand() % 6];
        else if (r < 8) { do cp = 0x80 + tt_rand() % 0x3000; while (cp == 0x2581); }
        else { do cp = 1 + tt_rand() % 0x10FFFF; while ((cp >= 0xD800 && cp <= 0xDFFF) || cp == 0x2581); }
        n += tt_put_cp(o + n, cp);
    }
    o[n] = 0;
    return n;
}

static void tt_roundtrip(const char *rel, int iters) {
    dj_tokenizer *t = tc_load_tokenizer(rel);
    char buf[64 * 4 + 1];
    for (int it = 0; it < iters; it++) {
        size_t n = tt_random_utf8(buf, 64), k, dl, sl;
        int32_t *ids;
        dj_err e;
        cr_assert_eq(tok_encode(t, buf, n, 1, &ids, &k, &e), 0, "%s", e.msg);
        char *dec = tok_decode(t, ids, k, &dl);
        cr_assert(dl == n && memcmp(dec, buf, n) == 0, "%s: round trip of \"%s\" gave \"%s\"", rel, buf, dec);
        char *st = tt_stream_all(t, ids, k, &sl);
        cr_assert(sl == dl && memcmp(st, dec, dl) == 0, "stream differs from decode for \"%s\"", buf);
        free(dec), free(st), free(ids);
    }
    tok_free(t);
}
Test(tokenizer, llama3_random_roundtrip) { tt_roundtrip("tokenizers/llama3", 3000); }
Test(tokenizer, llama2_random_roundtrip) { tt_roundtrip("tokenizers/llama2", 1000); }
Test(tokenizer, tok512_random_roundtrip) { tt_roundtrip("models/stories260K", 1000); }

Test(tokenizer, malformed_utf8_is_an_error) {
    dj_tokenizer *t = tc_load_tokenizer("tokenizers/llama3");
    static const char *const bad[] = {"\xff", "ab\xc3", "a\xed\xa0\x80" "b", "\xc0\xaf", "\xf4\x90\x80\x80", "x\x80y",
                                      "\xe2\x82"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        int32_t *ids = (int32_t *)1;
        size_t k;
        dj_err e = {{0}};
        cr_expect_eq(tok_encode(t, bad[i], strlen(bad[i]), 1, &ids, &k, &e), -1, "case %zu accepted", i);
        cr_expect(strstr(e.msg, "UTF-8"), "message: %s", e.msg);
        cr_expect_null(ids);
    }
    tok_free(t);
}

// Decoding token sequences that split or break characters, as HF does.
Test(tokenizer, decode_partial_characters) {
    dj_tokenizer *t = tc_load_tokenizer("tokenizers/llama3");
    size_t l;
    int32_t half[] = {9468, 236};  // "😀" minus its last byte: one maximal subpart -> one U+FFFD
    char *s = tok_decode(t, half, 2, &l);
    cr_expect_str_eq(s, "\xEF\xBF\xBD");
    free(s);
    int32_t whole[] = {128000, 9468, 128009, 236, 231};  // specials skipped, the bytes around them joined
    s = tok_decode(t, whole, 5, &l);
    cr_expect_str_eq(s, "\xF0\x9F\x8E\x89");  // 🎉
    free(s);
    tok_free(t);
    t = tc_load_tokenizer("tokenizers/llama2");
    int32_t run[] = {68, 230, 13};  // <0x41> <0xE3> <0x0A>: an invalid run -> one U+FFFD per byte
    s = tok_decode(t, run, 3, &l);
    cr_expect_str_eq(s, "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");
    free(s);
    int32_t ok[] = {1, 243, 162, 155, 131, 2};  // <s> 😀 </s>
    s = tok_decode(t, ok, 6, &l);
    cr_expect_str_eq(s, "\xF0\x9F\x98\x80");
    free(s);
    size_t sl;
    s = tt_stream_all(t, run, 3, &sl);
    cr_expect_str_eq(s, "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");
    free(s);
    tok_free(t);
}

// ---- the converter refuses what the engine does not implement, by name
static char *tt_replace(const char *s, const char *from, const char *to) {
    const char *p = strstr(s, from);
    cr_assert(p, "pattern %s not found", from);
    size_t a = (size_t)(p - s), lf = strlen(from), lt = strlen(to), n = strlen(s);
    char *o = malloc(n - lf + lt + 1);
    memcpy(o, s, a), memcpy(o + a, to, lt), memcpy(o + a + lt, p + lf, n - a - lf + 1);
    return o;
}
static char *tt_stories_json(size_t *n) {
    char path[4096];
    snprintf(path, sizeof path, "%s/models/stories260K/tokenizer.json", tc_data());
    char *s = tc_read(path, n);
    if (!s) cr_skip_test("%s is missing", path);
    return s;
}
static void tt_expect_refused(const char *from, const char *to, const char *name) {
    size_t n;
    char *s = tt_stories_json(&n), *m = tt_replace(s, from, to);
    uint8_t *blob;
    size_t bn;
    dj_err e = {{0}};
    cr_expect_eq(tokjson_build(m, strlen(m), NULL, 0, NULL, 0, NULL, 0, &blob, &bn, &e), -1, "accepted %s", to);
    cr_expect(strstr(e.msg, name), "message \"%s\" does not name %s", e.msg, name);
    free(s), free(m);
}
Test(tokjson, refuses_by_name) {
    tt_expect_refused("\"type\": \"BPE\"", "\"type\": \"Unigram\"", "Unigram");
    tt_expect_refused("\"lstrip\": false", "\"lstrip\": true", "lstrip");
    tt_expect_refused("\"single_word\": false", "\"single_word\": true", "single_word");
    tt_expect_refused("\"normalized\": false", "\"normalized\": true", "normalized");
    tt_expect_refused("{\"type\": \"Fuse\"}", "{\"type\": \"Strip\", \"content\": \"x\", \"start\": 1, \"stop\": 0}", "Strip");
    tt_expect_refused("\"pre_tokenizer\": null", "\"pre_tokenizer\": {\"type\": \"Whitespace\"}", "Whitespace");
    tt_expect_refused("{\"type\": \"Prepend\", \"prepend\": \"\xE2\x96\x81\"}", "{\"type\": \"NFKC\"}", "NFKC");
    tt_expect_refused("\"post_processor\": {\"type\": \"TemplateProcessing\"", "\"post_processor\": {\"type\": \"RobertaProcessing\"",
                      "RobertaProcessing");
    tt_expect_refused("\"dropout\": null", "\"dropout\": 0.1", "dropout");
    // one id near 2^26 in a 512-token vocabulary: refused before anything is sized by it
    tt_expect_refused("\"<unk>\": 0", "\"<unk>\": 67108000", "dense");
    // a flag that is not true, false or null is refused by name, not taken as absent (HF's loader refuses it too):
    // "true" as a string must not slip past the refusal of lstrip: true, nor "yes" turn byte fallback off
    tt_expect_refused("\"lstrip\": false", "\"lstrip\": \"true\"", "\"lstrip\" must be true or false");
    tt_expect_refused("\"byte_fallback\": true", "\"byte_fallback\": \"yes\"", "\"byte_fallback\" must be true or false");
    tt_expect_refused("\"fuse_unk\": true", "\"fuse_unk\": 1", "\"fuse_unk\" must be true or false");
    // a long name from the file is cut in the message, so the reason stays on its 512-byte line
    char longkey[700];
    memset(longkey, 'a', 600);
    snprintf(longkey + 600, sizeof longkey - 600, "\": -1, \"<unk>\": 0");
    char to[720];
    snprintf(to, sizeof to, "\"%s", longkey);
    tt_expect_refused("\"<unk>\": 0", to, "has a bad id");
}

// More eos ids than the section holds: named, not an internal error at load. Llama 3's vocabulary has room for them.
Test(tokjson, too_many_eos_ids) {
    char path[4096];
    tc_data_path(path, sizeof path, "tokenizers/llama3/tokenizer.json");
    size_t n;
    char *s = tc_must_read(path, &n);
    size_t cap = 16 << 10, len = 0;
    char *gc = malloc(cap);
    len += (size_t)snprintf(gc + len, cap - len, "{\"eos_token_id\": [");
    for (int i = 0; i < 1100; i++) len += (size_t)snprintf(gc + len, cap - len, "%s%d", i ? ", " : "", 1000 + i);
    len += (size_t)snprintf(gc + len, cap - len, "]}");
    uint8_t *blob = NULL;
    size_t bn;
    dj_err e = {{0}};
    cr_assert_eq(tokjson_build(s, n, NULL, 0, gc, len, NULL, 0, &blob, &bn, &e), -1, "1100 eos ids accepted");
    cr_assert(strstr(e.msg, "more than 1024 eos ids") && strstr(e.msg, "generation_config.json"), "%s", e.msg);
    free(s), free(gc);
}

// generation_config eos lists, config ids, tokenizer_config chat templates and add_bos_token
Test(tokjson, side_configs) {
    size_t n;
    char *s = tt_stories_json(&n);
    const char *tc = "{\"eos_token\": {\"content\": \"</s>\"}, \"add_bos_token\": false, "
                     "\"chat_template\": [{\"name\": \"tool\", \"template\": \"T\"}, {\"name\": \"default\", \"template\": \"{{ x }}\"}]}";
    const char *gc = "{\"eos_token_id\": [0, 2]}";
    const char *cc = "{\"bos_token_id\": 1, \"eos_token_id\": 3}";
    uint8_t *blob;
    size_t bn;
    dj_err e = {{0}};
    cr_assert_eq(tokjson_build(s, n, tc, strlen(tc), gc, strlen(gc), cc, strlen(cc), &blob, &bn, &e), 0, "%s", e.msg);
    dj_tokenizer *t = tok_load(blob, bn, &e);
    cr_assert(t, "%s", e.msg);
    size_t ne;
    const int32_t *eos = tok_eos_ids(t, &ne);
    cr_expect_eq(ne, 3);
    cr_expect(tok_is_eos(t, 0) && tok_is_eos(t, 2) && tok_is_eos(t, 3) && !tok_is_eos(t, 1), "eos %d", eos[0]);
    cr_expect_str_eq(tok_chat_template(t), "{{ x }}");
    int32_t *ids;
    size_t k;
    cr_assert_eq(tok_encode(t, "a", 1, 1, &ids, &k, &e), 0);
    cr_expect_eq(k, 1, "add_bos_token false: no BOS");
    free(ids);
    tok_free(t);
    free(blob);
    const char *bad = "{\"eos_token_id\": \"x\"}";
    cr_expect_eq(tokjson_build(s, n, NULL, 0, bad, strlen(bad), NULL, 0, &blob, &bn, &e), -1);
    // add_bos_token as a string ("false" is true to Python, absent to a lax reader): refused by name
    const char *bos_str = "{\"add_bos_token\": \"false\"}";
    cr_expect_eq(tokjson_build(s, n, bos_str, strlen(bos_str), NULL, 0, NULL, 0, &blob, &bn, &e), -1);
    cr_expect(strstr(e.msg, "add_bos_token") && strstr(e.msg, "true or false"), "%s", e.msg);
    free(s);
}

// The Metaspace pre-tokenizer (newer conversions): prepend_scheme "first" adds "▁" only at the very start of the
// text and not where the text already starts with a space, so " x" encodes as the legacy form of "x".
Test(tokjson, metaspace_variant) {
    size_t n;
    char *s = tt_stories_json(&n);
    char *a = tt_replace(s, "{\"type\": \"Sequence\", \"normalizers\": [{\"type\": \"Prepend\", \"prepend\": \"\xE2\x96\x81\"}, "
                            "{\"type\": \"Replace\", \"pattern\": {\"String\": \" \"}, \"content\": \"\xE2\x96\x81\"}]}", "null");
    char *m = tt_replace(a, "\"pre_tokenizer\": null",
                         "\"pre_tokenizer\": {\"type\": \"Metaspace\", \"replacement\": \"\xE2\x96\x81\", "
                         "\"prepend_scheme\": \"first\", \"split\": false}");
    uint8_t *b1, *b2;
    size_t n1, n2;
    dj_err e = {{0}};
    cr_assert_eq(tokjson_build(m, strlen(m), NULL, 0, NULL, 0, NULL, 0, &b1, &n1, &e), 0, "%s", e.msg);
    cr_assert_eq(tokjson_build(s, n, NULL, 0, NULL, 0, NULL, 0, &b2, &n2, &e), 0, "%s", e.msg);
    dj_tokenizer *meta = tok_load(b1, n1, &e), *legacy = tok_load(b2, n2, &e);
    cr_assert(meta && legacy);
    int32_t *x, *y;
    size_t nx, ny;
    cr_assert_eq(tok_encode(meta, " Once upon a time", 17, 1, &x, &nx, &e), 0);
    cr_assert_eq(tok_encode(legacy, "Once upon a time", 16, 1, &y, &ny, &e), 0);
    cr_assert_eq(nx, ny);
    for (size_t i = 0; i < nx; i++) cr_expect_eq(x[i], y[i]);
    free(x), free(y);
    // after a special token the segment does not start the text: no "▁" (legacy Prepend adds one)
    cr_assert_eq(tok_encode(meta, "<s>a", 4, 0, &x, &nx, &e), 0);
    cr_assert_eq(tok_encode(legacy, "<s>a", 4, 0, &y, &ny, &e), 0);
    cr_expect_eq(nx, 2);
    cr_expect_eq(ny, 2);
    size_t pl = 0;
    const char *px = tok_piece(meta, x[1], &pl);
    cr_expect(pl == 1 && px[0] == 'a', "Metaspace first: \"a\" after <s> has no ▁");
    px = tok_piece(legacy, y[1], &pl);
    cr_expect(pl == 4 && memcmp(px, "\xE2\x96\x81" "a", 4) == 0, "legacy Prepend: \"▁a\" after <s>");
    free(x), free(y);
    tok_free(meta), tok_free(legacy);
    free(b1), free(b2), free(a), free(m), free(s);
}

// ---- tok_load never crashes on a corrupt section
Test(tokenizer, corrupt_sections) {
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/models/stories260K", tc_data());
    uint8_t *blob;
    size_t n;
    dj_err e;
    if (tokjson_build_dir(dir, &blob, &n, &e)) cr_skip_test("stories260K: %s", e.msg);
    cr_expect_null(tok_load(blob, TOK_HEADER_SIZE - 1, &e));
    for (size_t cut = 0; cut < n; cut += 97) {  // truncations
        dj_tokenizer *t = tok_load(blob, cut, &e);
        cr_expect_null(t, "a section cut at %zu of %zu loaded", cut, n);
        tok_free(t);
    }
    uint8_t *c = malloc(n);
    for (int it = 0; it < 3000; it++) {  // random corruption, mostly in the header and the tables
        memcpy(c, blob, n);
        for (int f = 0; f < 1 + (int)(tt_rand() % 4); f++) {
            size_t at = tt_rand() % 2 ? tt_rand() % TOK_HEADER_SIZE : tt_rand() % n;
            c[at] = (uint8_t)(tt_rand() % 3 ? c[at] ^ (1u << (tt_rand() % 8)) : tt_rand());
        }
        dj_tokenizer *t = tok_load(c, n, &e);
        if (!t) continue;
        int32_t *ids, junk[] = {0, 1, 5, 300, 511, -3, 100000};
        size_t k, l;
        if (tok_encode(t, "Once upon a time, <s>x 😀", 28, 1, &ids, &k, &e) == 0) free(ids);
        free(tok_decode(t, junk, 7, &l));
        tok_free(t);
    }
    free(c);
    free(blob);
}

// Whatever the converter accepts, tok_load accepts; mangled JSON never crashes either.
Test(tokjson, mangled_json) {
    size_t n;
    char *s = tt_stories_json(&n), *m = malloc(n);
    int built = 0;
    for (int it = 0; it < 400; it++) {
        memcpy(m, s, n);
        for (int f = 0; f < 1 + (int)(tt_rand() % 3); f++) {
            size_t at = tt_rand() % n;
            m[at] = (char)(tt_rand() % 2 ? "{}[]\",:0123456789 ntfa<>\\"[tt_rand() % 25] : (char)tt_rand());
        }
        uint8_t *blob;
        size_t bn;
        dj_err e;
        if (tokjson_build(m, n, NULL, 0, NULL, 0, NULL, 0, &blob, &bn, &e)) continue;
        built++;
        dj_tokenizer *t = tok_load(blob, bn, &e);
        cr_expect(t, "tok_load refused a section tokjson built: %s", e.msg);
        int32_t *ids;
        size_t k;
        if (t && tok_encode(t, "Once upon a time", 16, 1, &ids, &k, &e) == 0) free(ids);
        tok_free(t);
        free(blob);
    }
    cr_log_info("tokjson built %d of 400 mangled files", built);
    free(m), free(s);
}

// The tiny model's reference generation: prompt ids, and the decoded text (HF printed it with "<s> " in front,
// i.e. without skipping special tokens; skipping it drops exactly that prefix).
Test(tokenizer, stories_reference_greedy) {
    dj_tokenizer *t = tc_load_tokenizer("models/stories260K");
    char path[4096];
    snprintf(path, sizeof path, "%s/models/stories260K/reference_greedy.json", tc_data());
    size_t n;
    char *text = tc_read(path, &n);
    if (!text) cr_skip_test("%s is missing", path);
    dj_err e;
    json_doc *d = json_parse(text, n, &e);
    cr_assert(d, "%s", e.msg);
    const json_value *r = json_root(d), *pids = json_get(r, "prompt_ids"), *gids = json_get(r, "greedy_ids");
    const char *prompt = json_str(json_get(r, "prompt")), *want = json_str(json_get(r, "greedy_text"));
    cr_assert(prompt && want && pids && gids && strncmp(want, "<s> ", 4) == 0);
    int32_t *ids;
    size_t k;
    cr_assert_eq(tok_encode(t, prompt, strlen(prompt), 1, &ids, &k, &e), 0);
    cr_assert_eq(k, pids->u.arr.n);
    for (size_t i = 0; i < k; i++) cr_expect_eq(ids[i], pids->u.arr.items[i].u.number.i);
    free(ids);
    int32_t *g = malloc(sizeof(int32_t) * gids->u.arr.n);
    for (size_t i = 0; i < gids->u.arr.n; i++) g[i] = (int32_t)gids->u.arr.items[i].u.number.i;
    size_t dl, sl;
    char *dec = tok_decode(t, g, gids->u.arr.n, &dl), *st = tt_stream_all(t, g, gids->u.arr.n, &sl);
    cr_expect_str_eq(dec, want + 4);
    cr_expect_str_eq(st, want + 4);
    free(dec), free(st), free(g);
    json_free(d);
    free(text);
    tok_free(t);
}

// ---- chat templates (chat.c): the stored templates of the shared chat tokenizers are recognised, and a turn's ids
// are the template's text tokenized with its special tokens (Llama 3: BOS, the headers, <|eot_id|>).
// The shared chat folders hold tokenizer_config.json (with the template) and point at the base tokenizer.json.
static dj_tokenizer *tt_load_chat(const char *base, const char *chat) {
    char tj[4096], cfg[4096];
    snprintf(tj, sizeof tj, "%s/tokenizers/%s/tokenizer.json", tc_data(), base);
    snprintf(cfg, sizeof cfg, "%s/tokenizers/%s/tokenizer_config.json", tc_data(), chat);
    size_t n, cn;
    char *s = tc_read(tj, &n), *c = tc_read(cfg, &cn);
    if (!s || !c) cr_skip_test("%s or %s is missing", tj, cfg);
    uint8_t *blob;
    size_t bn;
    dj_err e = {{0}};
    cr_assert_eq(tokjson_build(s, n, c, cn, NULL, 0, NULL, 0, &blob, &bn, &e), 0, "%s: %s", chat, e.msg);
    dj_tokenizer *t = tok_load(blob, bn, &e);
    cr_assert(t, "tok_load: %s", e.msg);
    free(blob), free(s), free(c);
    return t;
}

// Whole conversations (chat_prompt_ids) against the text HF's templates write for them, tokenized: Llama 3 any order
// of roles (two user messages in a row, a system message later, "developer" as "system", a system message of spaces
// left out as chat_turn_ids leaves it), the last the user's; Llama 2 alternating only.
typedef struct {
    const char *roles[5], *contents[5];
    size_t n;
    const char *text;  // Llama 3's template text after BOS; NULL: refused, the error holding `why`
    const char *why;
} tt_conv;

static void tt_conversations(const dj_tokenizer *l3, const dj_tokenizer *l2) {
#define H(r) "<|start_header_id|>" r "<|end_header_id|>\n\n"
    static const tt_conv cases[] = {
        {{"system", "user", "assistant", "user"}, {"Be brief.", " Hi ", "Hello.", "More"}, 4,
         H("system") "Be brief.<|eot_id|>" H("user") "Hi<|eot_id|>" H("assistant") "Hello.<|eot_id|>" H("user")
             "More<|eot_id|>" H("assistant"), NULL},
        {{"system", "user", "user"}, {"Be brief.", "One", "Two"}, 3,
         H("system") "Be brief.<|eot_id|>" H("user") "One<|eot_id|>" H("user") "Two<|eot_id|>" H("assistant"), NULL},
        {{"user", "developer", "assistant", "assistant", "user"}, {"A", "Rule", "B", "C", "D"}, 5,
         H("user") "A<|eot_id|>" H("system") "Rule<|eot_id|>" H("assistant") "B<|eot_id|>" H("assistant")
             "C<|eot_id|>" H("user") "D<|eot_id|>" H("assistant"), NULL},
        {{"system", "user"}, {" \n ", "Hi"}, 2, H("user") "Hi<|eot_id|>" H("assistant"), NULL},
        {{"user", "assistant"}, {"Hi", "Hello."}, 2, NULL, "the last message is not the user's"},
        {{"tool", "user"}, {"{}", "Hi"}, 2, NULL, "role 'tool'"},
        {{0}, {0}, 0, NULL, "the last message is not the user's"},
    };
#undef H
    dj_err e;
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        const tt_conv *v = &cases[c];
        int32_t *ids = NULL, *want = NULL;
        size_t n = 0, nw = 0;
        int rc = chat_prompt_ids(l3, CHAT_LLAMA3, v->roles, v->contents, v->n, &ids, &n, &e);
        if (!v->text) {
            cr_assert(rc != 0 && strstr(e.msg, v->why), "conversation %zu taken, or refused without '%s': %s", c,
                      v->why, rc ? e.msg : "");
            continue;
        }
        cr_assert_eq(rc, 0, "conversation %zu: %s", c, e.msg);
        cr_assert_eq(tok_encode(l3, v->text, strlen(v->text), 0, &want, &nw, &e), 0, "%s", e.msg);
        cr_assert(n == nw + 1 && ids[0] == tok_bos(l3) && !memcmp(ids + 1, want, nw * sizeof *ids),
                  "conversation %zu: %zu ids against BOS and %zu", c, n, nw);
        free(ids), free(want);
    }
    // Llama 2's template demands alternation: two user messages in a row are refused
    const char *roles[] = {"system", "user", "user"}, *contents[] = {"Be brief.", "One", "Two"};
    int32_t *ids = NULL;
    size_t n = 0;
    cr_assert_neq(chat_prompt_ids(l2, CHAT_LLAMA2, roles, contents, 3, &ids, &n, &e), 0);
    cr_assert(strstr(e.msg, "alternate"), "%s", e.msg);
}

Test(tokenizer, chat_templates) {
    dj_tokenizer *l3 = tt_load_chat("llama3", "llama3-instruct"), *l2 = tt_load_chat("llama2", "llama2-chat");
    cr_assert_eq(chat_recognise(tok_chat_template(l3)), CHAT_LLAMA3, "%.200s", tok_chat_template(l3));
    cr_assert_eq(chat_recognise(tok_chat_template(l2)), CHAT_LLAMA2, "%.200s", tok_chat_template(l2));
    cr_assert_eq(chat_recognise(""), CHAT_NONE);
    cr_assert_eq(chat_recognise("{{ messages[0]['content'] }}"), CHAT_UNKNOWN);
    dj_err e;
    int32_t *ids, *want;
    size_t n, nw;
    // Llama 3, first turn with a system message: the whole text, spaces around the user's words stripped
    cr_assert_eq(chat_turn_ids(l3, CHAT_LLAMA3, "Be brief.", "  Hi there \n", 1, -1, &ids, &n, &e), 0, "%s", e.msg);
    const char *t3 = "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
                     "<|start_header_id|>user<|end_header_id|>\n\nHi there<|eot_id|><|start_header_id|>assistant"
                     "<|end_header_id|>\n\n";
    cr_assert_eq(tok_encode(l3, t3, strlen(t3), 0, &want, &nw, &e), 0, "%s", e.msg);
    cr_assert(n == nw && !memcmp(ids, want, n * sizeof *ids), "llama 3 first turn: %zu ids against %zu", n, nw);
    cr_assert_eq(ids[0], tok_bos(l3));
    free(ids), free(want);
    // a later turn after an answer cut short: <|eot_id|> first, no BOS, no system
    cr_assert_eq(chat_turn_ids(l3, CHAT_LLAMA3, "Be brief.", "More", 0, -1, &ids, &n, &e), 0, "%s", e.msg);
    const char *t3b = "<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nMore<|eot_id|><|start_header_id|>"
                      "assistant<|end_header_id|>\n\n";
    cr_assert_eq(tok_encode(l3, t3b, strlen(t3b), 0, &want, &nw, &e), 0, "%s", e.msg);
    cr_assert(n == nw && !memcmp(ids, want, n * sizeof *ids), "llama 3 later turn");
    cr_assert(tok_is_eos(l3, ids[0]), "the closing <|eot_id|> is an end token of the model");
    free(ids);
    // after an answer that ended with its end token (given back as prev_end): that token, then the same turn
    cr_assert_eq(chat_turn_ids(l3, CHAT_LLAMA3, "Be brief.", "More", 0, want[0], &ids, &n, &e), 0, "%s", e.msg);
    cr_assert(n == nw && !memcmp(ids, want, n * sizeof *ids), "llama 3 turn after an ended answer");
    free(ids), free(want);
    // Llama 2: every user turn opens with BOS, the system text inside the first [INST]
    cr_assert_eq(chat_turn_ids(l2, CHAT_LLAMA2, "Be brief.", "Hi", 1, -1, &ids, &n, &e), 0, "%s", e.msg);
    const char *t2 = "[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\nHi [/INST]";
    cr_assert_eq(tok_encode(l2, t2, strlen(t2), 0, &want, &nw, &e), 0, "%s", e.msg);
    cr_assert(n == nw + 1 && ids[0] == tok_bos(l2) && !memcmp(ids + 1, want, nw * sizeof *ids), "llama 2 first turn");
    free(ids), free(want);
    cr_assert_eq(chat_turn_ids(l2, CHAT_LLAMA2, NULL, "Again", 0, -1, &ids, &n, &e), 0, "%s", e.msg);
    int bos_at = -1;
    for (size_t i = 0; i < n; i++)
        if (ids[i] == tok_bos(l2)) bos_at = (int)i;
    cr_assert(bos_at > 0 && tok_is_eos(l2, ids[bos_at - 1]), "a cut answer's </s>, then the new turn's BOS");
    free(ids);
    cr_assert_neq(chat_turn_ids(l2, CHAT_UNKNOWN, NULL, "x", 1, -1, &ids, &n, &e), 0);
    tt_conversations(l3, l2);
    tok_free(l2), tok_free(l3);
}

// ---- tok_load's checks, each at the value where the answer turns, on a section built by hand: five pieces
// ("<unk>" and "<s>" special added tokens, "a", "b", "ab"), the merge a + b = ab, eos "<s>".
enum { TINY_VOCAB = 5, TINY_POOL = 12 };
typedef struct {
    uint8_t b[1024];
    size_t n;
    uint64_t off[TOK_N_SEC];  // where each part starts, to patch it
} tiny_tok;

static void tt_put32(uint8_t *p, uint32_t v) { memcpy(p, &v, 4); }
static void tt_put64(uint8_t *p, uint64_t v) { memcpy(p, &v, 8); }

// n_added: how many added-token entries (the first two real, the rest repeat "<s>").
static void tiny_build(tiny_tok *t, uint32_t n_added) {
    static const uint64_t piece_off[TINY_VOCAB + 1] = {0, 5, 8, 9, 10, 12};
    static const uint8_t attr[TINY_VOCAB] = {TOK_A_EXISTS | TOK_A_ADDED | TOK_A_SPECIAL,
                                             TOK_A_EXISTS | TOK_A_ADDED | TOK_A_SPECIAL, TOK_A_EXISTS | TOK_A_MODEL,
                                             TOK_A_EXISTS | TOK_A_MODEL, TOK_A_EXISTS | TOK_A_MODEL};
    uint8_t *b = t->b;
    memset(t, 0, sizeof *t);
    memcpy(b, TOK_MAGIC, 8);
    tt_put32(b + 8, TOK_VERSION), tt_put32(b + 12, TOK_TYPE_SPM);
    tt_put32(b + 20, 0), tt_put32(b + 24, 1), tt_put32(b + 28, (uint32_t)-1);  // unk, bos, no eos appended
    tt_put32(b + 32, TINY_VOCAB), tt_put32(b + 36, 1), tt_put32(b + 40, n_added), tt_put32(b + 44, 1);
    size_t at = TOK_HEADER_SIZE;
    const uint64_t size[TOK_N_SEC] = {8 * (TINY_VOCAB + 1), TINY_VOCAB, TINY_POOL, 12, 24ull * n_added, 4, 0};
    for (int i = 0; i < TOK_N_SEC; i++) {
        tt_put64(b + 64 + 16 * i, at), tt_put64(b + 72 + 16 * i, size[i]);
        t->off[i] = at, at += size[i];
    }
    cr_assert_leq(at, sizeof t->b);
    t->n = at;
    for (int i = 0; i <= TINY_VOCAB; i++) tt_put64(b + t->off[TOK_SEC_PIECE_OFF] + 8 * i, piece_off[i]);
    memcpy(b + t->off[TOK_SEC_ATTR], attr, TINY_VOCAB);
    memcpy(b + t->off[TOK_SEC_POOL], "<unk><s>abab", TINY_POOL);
    uint8_t *m = b + t->off[TOK_SEC_MERGES];
    tt_put32(m, 2), tt_put32(m + 4, 3), tt_put32(m + 8, 4);
    for (uint32_t i = 0; i < n_added; i++) {
        uint8_t *a = b + t->off[TOK_SEC_ADDED] + 24 * i;
        tt_put32(a, i == 0 ? 0 : 1), tt_put64(a + 8, i == 0 ? 0 : 5), tt_put64(a + 16, i == 0 ? 5 : 3);
    }
    tt_put32(b + t->off[TOK_SEC_EOS], 1);
}

// Loads the section; 1 when it loads.
static int tiny_loads(const tiny_tok *t, const char *what) {
    dj_err e = {{0}};
    dj_tokenizer *k = tok_load(t->b, t->n, &e);
    cr_expect(k || e.msg[0], "%s: refused without a message", what);
    tok_free(k);
    return k != NULL;
}

Test(tokenizer, tiny_section_loads_and_works) {
    tiny_tok t;
    tiny_build(&t, 2);
    dj_err e = {{0}};
    dj_tokenizer *k = tok_load(t.b, t.n, &e);
    cr_assert(k, "%s", e.msg);
    int32_t *ids;
    size_t n;
    cr_assert_eq(tok_encode(k, "ab<s>", 5, 0, &ids, &n, &e), 0, "%s", e.msg);
    cr_expect(n == 2 && ids[0] == 4 && ids[1] == 1, "\"ab<s>\": %zu ids", n);  // the added token at the text's end
    free(ids);
    size_t len;
    cr_expect_null(tok_piece(k, TINY_VOCAB, &len), "an id past the vocabulary has no piece");
    cr_expect(tok_piece(k, TINY_VOCAB - 1, &len) && len == 2);
    char *s = tok_decode(k, (const int32_t[]){4, TINY_VOCAB, 2}, 3, &len);
    cr_expect_str_eq(s, "aba", "an id past the vocabulary decodes to nothing");
    free(s);
    tok_free(k);
}

Test(tokenizer, tiny_section_limits) {
    tiny_tok t;
    // the whole magic
    tiny_build(&t, 2), t.b[7] = 'X';
    cr_expect_not(tiny_loads(&t, "magic DJINNTOX"), "magic DJINNTOX loaded");
    // unk/bos/eos-appended ids: n_vocab - 1 is the last
    tiny_build(&t, 2), tt_put32(t.b + 24, TINY_VOCAB - 1);
    cr_expect(tiny_loads(&t, "bos id n_vocab - 1"));
    tiny_build(&t, 2), tt_put32(t.b + 24, TINY_VOCAB);
    cr_expect_not(tiny_loads(&t, "bos id n_vocab"), "bos id n_vocab loaded");
    tiny_build(&t, 2), tt_put32(t.b + 20, TINY_VOCAB);
    cr_expect_not(tiny_loads(&t, "unk id n_vocab"), "unk id n_vocab loaded");
    // the post-processor's BOS needs a BOS
    tiny_build(&t, 2), tt_put32(t.b + 16, TOK_F_ADD_BOS);
    cr_expect(tiny_loads(&t, "ADD_BOS with a bos id"));
    tiny_build(&t, 2), tt_put32(t.b + 16, TOK_F_ADD_BOS), tt_put32(t.b + 24, (uint32_t)-1);
    cr_expect_not(tiny_loads(&t, "ADD_BOS without"), "ADD_BOS without a bos id loaded");
    // strip_start: at most 64
    tiny_build(&t, 2), tt_put32(t.b + 56, 64);
    cr_expect(tiny_loads(&t, "strip 64"));
    tiny_build(&t, 2), tt_put32(t.b + 56, 65);
    cr_expect_not(tiny_loads(&t, "strip 65"), "strip_start 65 loaded");
    // the last piece may end at the pool's end, not past it
    tiny_build(&t, 2), tt_put64(t.b + t.off[TOK_SEC_PIECE_OFF] + 8 * TINY_VOCAB, TINY_POOL + 1);
    cr_expect_not(tiny_loads(&t, "piece past the pool"), "a piece ending past the pool loaded");
    // a merge's ids: each below n_vocab, the merged one too
    tiny_build(&t, 2), tt_put32(t.b + t.off[TOK_SEC_MERGES] + 8, TINY_VOCAB);
    cr_expect_not(tiny_loads(&t, "merged id n_vocab"), "a merge into id n_vocab loaded");
    // an added token is never empty
    tiny_build(&t, 2), tt_put64(t.b + t.off[TOK_SEC_ADDED] + 16, 0);
    cr_expect_not(tiny_loads(&t, "empty added token"), "an empty added token loaded");
    // eos ids below n_vocab
    tiny_build(&t, 2), tt_put32(t.b + t.off[TOK_SEC_EOS], TINY_VOCAB - 1);
    cr_expect(tiny_loads(&t, "eos n_vocab - 1"));
    tiny_build(&t, 2), tt_put32(t.b + t.off[TOK_SEC_EOS], TINY_VOCAB);
    cr_expect_not(tiny_loads(&t, "eos n_vocab"), "eos id n_vocab loaded");
    // at most as many added tokens as the vocabulary has ids
    tiny_build(&t, TINY_VOCAB);
    cr_expect(tiny_loads(&t, "n_added n_vocab"));
    tiny_build(&t, TINY_VOCAB + 1);
    cr_expect_not(tiny_loads(&t, "n_added n_vocab + 1"), "more added tokens than ids loaded");
}

// tokjson's refusals where a looser check would take the file: each a one-token edit of stories260K's tokenizer.json.
Test(tokjson, refuses_at_the_limits) {
    tt_expect_refused("\"continuing_subword_prefix\": null", "\"continuing_subword_prefix\": \"##\"",
                      "continuing_subword_prefix");
    tt_expect_refused("\"ids\": [1]", "\"ids\": [-1]", "TemplateProcessing special token <s>");
    tt_expect_refused("\"single\": [{\"SpecialToken\": {\"id\": \"<s>\", \"type_id\": 0}}, ",
                      "\"single\": [{\"SpecialToken\": {\"id\": \"<s>\", \"type_id\": 0}}, "
                      "{\"SpecialToken\": {\"id\": \"<s>\", \"type_id\": 0}}, ", "[bos] $A [eos]");
    tt_expect_refused("\"<unk>\": 0", "\"<unk>\": -1", "vocab entry \"<unk>\" has a bad id");
    tt_expect_refused("\"<s>\": 1", "\"<s>\": 0", "id 0 is given to two vocab entries");
    tt_expect_refused("\"<0x00>\": 3", "\"<unk>\": 3", "vocab entry \"<unk>\" appears twice");  // the one of id 0
    tt_expect_refused("\"content\": \"<unk>\"", "\"content\": \"\"", "added token 0 has no content");
    tt_expect_refused("\"unk_token\": \"<unk>\"", "\"unk_token\": \"<nope>\"", "unk_token \"<nope>\"");
    tt_expect_refused("[\"\xE2\x96\x81\", \"t\"]", "[\"<s>\", \"t\"]", "merge 0: \"<s>t\"");  // both halves known
    tt_expect_refused("{\"type\": \"ByteFallback\"}, {\"type\": \"Fuse\"}, {\"type\": \"Strip\", \"content\": \" \", "
                      "\"start\": 1, \"stop\": 0}", "{\"type\": \"ByteFallback\"}", "decoder Sequence is not supported");
    // an eos id of the vocabulary's size (512): one past its last
    size_t n;
    char *s = tt_stories_json(&n);
    uint8_t *blob = NULL;
    size_t bn;
    dj_err e = {{0}};
    const char *gc = "{\"eos_token_id\": 511}";
    cr_expect_eq(tokjson_build(s, n, NULL, 0, gc, strlen(gc), NULL, 0, &blob, &bn, &e), 0, "%s", e.msg);
    free(blob);
    gc = "{\"eos_token_id\": 512}";
    cr_expect_eq(tokjson_build(s, n, NULL, 0, gc, strlen(gc), NULL, 0, &blob, &bn, &e), -1, "eos id 512 accepted");
    cr_expect(strstr(e.msg, "outside the vocabulary"), "%s", e.msg);
    free(s);
    // 1024 eos ids fit the section, 1025 do not (Llama 3's vocabulary has room for them)
    char path[4096];
    tc_data_path(path, sizeof path, "tokenizers/llama3/tokenizer.json");
    s = tc_must_read(path, &n);
    for (int k = 0; k < 2; k++) {
        size_t cap = 16 << 10, len = 0;
        char *ids = malloc(cap);
        len += (size_t)snprintf(ids + len, cap - len, "{\"eos_token_id\": [");
        for (int i = 0; i < TOK_MAX_EOS + k; i++) len += (size_t)snprintf(ids + len, cap - len, "%s%d", i ? ", " : "", 1000 + i);
        len += (size_t)snprintf(ids + len, cap - len, "]}");
        blob = NULL;
        cr_expect_eq(tokjson_build(s, n, NULL, 0, ids, len, NULL, 0, &blob, &bn, &e), k ? -1 : 0, "%d eos ids: %s",
                     TOK_MAX_EOS + k, e.msg);
        free(blob), free(ids);
    }
    free(s);
}

// Every ill-formed sequence at the edge of each lead byte's second-byte range (the overlong forms, the surrogates,
// past U+10FFFF, a continuation byte past 0xBF) is an error; the valid sequences at the same edges encode.
Test(tokenizer, utf8_second_byte_ranges) {
    dj_tokenizer *t = tc_load_tokenizer("tokenizers/llama3");
    static const char *const bad[] = {"\xe0\x9f\xbf", "\xe0\x80\x80", "\xed\xa0\x80", "\xf0\x8f\xbf\xbf",
                                      "\xf0\x80\x80\x80", "\xf4\x90\x80\x80", "\xc2\xc0", "\xe1\x80\xc0",
                                      "\xf1\x80\x80\xc0"};
    static const char *const good[] = {"\xe0\xa0\x80", "\xed\x9f\xbf", "\xf0\x90\x80\x80", "\xf4\x8f\xbf\xbf",
                                       "\xc2\xbf", "\xe1\xbf\xbf", "\xf1\xbf\xbf\xbf"};
    int32_t *ids;
    size_t k;
    dj_err e = {{0}};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        cr_expect_eq(tok_encode(t, bad[i], strlen(bad[i]), 0, &ids, &k, &e), -1, "bad case %zu accepted", i);
    for (size_t i = 0; i < sizeof good / sizeof *good; i++) {
        cr_expect_eq(tok_encode(t, good[i], strlen(good[i]), 0, &ids, &k, &e), 0, "good case %zu: %s", i, e.msg);
        free(ids);
    }
    tok_free(t);
}
