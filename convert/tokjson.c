// tokjson.c: HF tokenizer.json (+ tokenizer_config.json, generation_config.json, config.json) -> the engine's
// tokenizer section (format: tokenizer.h). Accepts exactly the configurations tokenizer.c implements and refuses
// everything else by name, so a converted model never tokenizes differently from HF `tokenizers`.
#include "tokjson.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../fileio.h"
#include "../tokenizer.h"
#include "../json.h"

#define SPACE_MARK "\xE2\x96\x81"  // "▁"
// The Llama 3 pre-tokenizer regex, the only Split pattern tokenizer.c implements.
static const char LLAMA3_REGEX[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|"
    "\\s+(?!\\S)|\\s+";

typedef struct {
    // the vocabulary as tokenizer.json names it: per id the token string (added-token content wins)
    int32_t n_vocab;
    const char **str;   // (n_vocab) NULL for a hole
    size_t *len;        // (n_vocab)
    uint8_t *attr;      // (n_vocab) TOK_A_*
    int32_t *h;         // (mask + 1) model-vocabulary string -> id, -1 empty
    uint64_t mask;
    const json_value *added;  // the added_tokens array (may be NULL)
    uint32_t type, flags, pretok, prepend_scheme, strip_start;
    int32_t unk_id, bos_id, eos_append_id;
    int32_t *eos; size_t n_eos;
    uint32_t *merges; size_t n_merges;  // (n_merges, 3)
    const char *tmpl; size_t tmpl_len;
} tj;

static uint64_t tj_hash(const char *s, size_t n) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ (uint8_t)s[i]) * 1099511628211ull;
    return h ^ (h >> 29);
}
static int32_t tj_model_id(const tj *t, const char *s, size_t n) {
    for (uint64_t i = tj_hash(s, n) & t->mask;; i = (i + 1) & t->mask) {
        int32_t id = t->h[i];
        if (id < 0) return -1;
        if (t->len[id] == n && memcmp(t->str[id], s, n) == 0) return id;
    }
}
// A token named in a config (bos/eos): added tokens first, then the model vocabulary.
static int32_t tj_token_id(const tj *t, const char *s) {
    size_t n = strlen(s);
    for (size_t i = 0; t->added && i < t->added->u.arr.n; i++) {
        const json_value *a = &t->added->u.arr.items[i];
        const json_value *c = json_get(a, "content");
        int64_t id;
        if (c && c->type == JSON_STRING && c->u.str.len == n && memcmp(c->u.str.s, s, n) == 0 &&
            json_int(json_get(a, "id"), &id) == 0)
            return (int32_t)id;
    }
    return tj_model_id(t, s, n);
}
static int is_str(const json_value *v, const char *s) {
    return v && v->type == JSON_STRING && v->u.str.len == strlen(s) && memcmp(v->u.str.s, s, v->u.str.len) == 0;
}
static const char *type_of(const json_value *v) {  // the "type" of a component, "" when missing
    const char *s = json_str(json_get(v, "type"));
    return s ? s : "";
}
static int is_null(const json_value *v) { return !v || v->type == JSON_NULL; }

// ---- GPT-2 byte-level mapping: bytes 33..126, 161..172, 174..255 are their own code points, the other 68 bytes
// are U+0100.. in byte order. Returns the byte of code point cp, or -1.
static int gpt2_byte(uint32_t cp) {
    if ((cp >= 33 && cp <= 126) || (cp >= 161 && cp <= 172) || (cp >= 174 && cp <= 255)) return (int)cp;
    if (cp < 256 || cp >= 256 + 68) return -1;
    int k = (int)cp - 256;
    for (int b = 0; b < 256; b++) {
        if ((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255)) continue;
        if (k-- == 0) return b;
    }
    return -1;
}
// The bytes HF's ByteLevel decoder makes of a token: every character mapped back, or, when any is outside the
// mapping, the token's own UTF-8. out has room for n bytes. Returns the length written; *mapped says which.
static size_t bytelevel_bytes(const char *s, size_t n, uint8_t *out, int *mapped) {
    size_t m = 0;
    for (size_t i = 0; i < n;) {
        uint8_t c = (uint8_t)s[i];
        uint32_t cp;
        size_t k;
        if (c < 0x80) cp = c, k = 1;
        else if (c >= 0xC0 && c < 0xE0 && i + 1 < n) cp = (uint32_t)(c & 0x1F) << 6 | ((uint8_t)s[i + 1] & 0x3F), k = 2;
        else cp = UINT32_MAX, k = 1;
        int b = cp == UINT32_MAX ? -1 : gpt2_byte(cp);
        if (b < 0) {
            memcpy(out, s, n);
            *mapped = 0;
            return n;
        }
        out[m++] = (uint8_t)b;
        i += k;
    }
    *mapped = 1;
    return m;
}

// ---- model, normalizer, pre-tokenizer, decoder, post-processor: accept what tokenizer.c implements
static int check_model(tj *t, const json_value *model, dj_err *e) {
    const char *type = json_str(json_get(model, "type"));
    if (!type) type = "BPE";  // older files omit it
    if (strcmp(type, "BPE") != 0) return dj_fail(e, "tokenizer.json: model type %.60s is not supported (only BPE)", type);
    double drop;
    if (!is_null(json_get(model, "dropout")) && !(json_num(json_get(model, "dropout"), &drop) == 0 && drop == 0))
        return dj_fail(e, "tokenizer.json: BPE dropout is not supported");
    const char *pre = json_str(json_get(model, "continuing_subword_prefix"));
    const char *suf = json_str(json_get(model, "end_of_word_suffix"));
    if (pre && *pre) return dj_fail(e, "tokenizer.json: BPE continuing_subword_prefix \"%.120s\" is not supported", pre);
    if (suf && *suf) return dj_fail(e, "tokenizer.json: BPE end_of_word_suffix \"%.120s\" is not supported", suf);
    static const char *const keys[3] = {"byte_fallback", "fuse_unk", "ignore_merges"};
    static const uint32_t flags[3] = {TOK_F_BYTE_FALLBACK, TOK_F_FUSE_UNK, TOK_F_IGNORE_MERGES};
    for (int i = 0; i < 3; i++) {
        int v;
        if (json_opt_bool(model, keys[i], "tokenizer.json: model", 0, &v, e)) return -1;
        if (v) t->flags |= flags[i];
    }
    return 0;
}

static int check_normalizer_one(tj *t, const json_value *n, dj_err *e) {
    const char *type = type_of(n);
    if (strcmp(type, "Prepend") == 0 && is_str(json_get(n, "prepend"), SPACE_MARK)) {
        t->flags |= TOK_F_NORM_PREPEND;
        return 0;
    }
    const json_value *pat = json_get(n, "pattern");
    if (strcmp(type, "Replace") == 0 && is_str(json_get(pat, "String"), " ") && is_str(json_get(n, "content"), SPACE_MARK)) {
        t->flags |= TOK_F_NORM_REPLACE;
        return 0;
    }
    return dj_fail(e, "tokenizer.json: normalizer %.60s is not supported (only Prepend(\"▁\") and Replace(\" \", \"▁\"))",
                   *type ? type : "(untyped)");
}
static int check_normalizer(tj *t, const json_value *n, dj_err *e) {
    if (is_null(n)) return 0;
    if (t->type == TOK_TYPE_BYTELEVEL)
        return dj_fail(e, "tokenizer.json: a normalizer (%.60s) with a ByteLevel decoder is not supported", type_of(n));
    if (strcmp(type_of(n), "Sequence") != 0) return check_normalizer_one(t, n, e);
    const json_value *list = json_get(n, "normalizers");
    if (!list || list->type != JSON_ARRAY) return dj_fail(e, "tokenizer.json: normalizer Sequence without a list");
    for (size_t i = 0; i < list->u.arr.n; i++)
        if (check_normalizer_one(t, &list->u.arr.items[i], e)) return -1;
    return 0;
}

static int check_metaspace(tj *t, const json_value *p, dj_err *e) {
    if (!is_str(json_get(p, "replacement"), SPACE_MARK))
        return dj_fail(e, "tokenizer.json: Metaspace with a replacement other than \"▁\" is not supported");
    t->pretok = TOK_PRE_METASPACE;
    const char *scheme = json_str(json_get(p, "prepend_scheme"));
    int v;
    if (scheme) {
        if (strcmp(scheme, "always") == 0) t->prepend_scheme = TOK_PREPEND_ALWAYS;
        else if (strcmp(scheme, "first") == 0) t->prepend_scheme = TOK_PREPEND_FIRST;
        else if (strcmp(scheme, "never") == 0) t->prepend_scheme = TOK_PREPEND_NEVER;
        else return dj_fail(e, "tokenizer.json: Metaspace prepend_scheme \"%.120s\" is not supported", scheme);
    } else {  // older files: add_prefix_space
        if (json_opt_bool(p, "add_prefix_space", "tokenizer.json: Metaspace", 1, &v, e)) return -1;
        t->prepend_scheme = v ? TOK_PREPEND_ALWAYS : TOK_PREPEND_NEVER;
    }
    if (json_opt_bool(p, "split", "tokenizer.json: Metaspace", 1, &v, e)) return -1;  // HF's default: true
    if (v) t->flags |= TOK_F_METASPACE_SPLIT;
    return 0;
}
static int check_pretokenizer(tj *t, const json_value *p, dj_err *e) {
    if (is_null(p)) {
        if (t->type == TOK_TYPE_BYTELEVEL) return dj_fail(e, "tokenizer.json: a ByteLevel decoder without a pre-tokenizer is not supported");
        return 0;
    }
    const char *type = type_of(p);
    if (t->type == TOK_TYPE_SPM) {
        if (strcmp(type, "Metaspace") == 0) return check_metaspace(t, p, e);
        return dj_fail(e, "tokenizer.json: pre-tokenizer %.60s is not supported with this decoder (only Metaspace)", type);
    }
    // byte-level: exactly Sequence[Split(Llama 3 regex, Isolated), ByteLevel(no prefix space, no regex)]
    const json_value *list = json_get(p, "pretokenizers");
    if (strcmp(type, "Sequence") != 0 || !list || list->type != JSON_ARRAY || list->u.arr.n != 2)
        return dj_fail(e, "tokenizer.json: pre-tokenizer %.60s is not supported (only Split(Llama 3 regex) + ByteLevel)", type);
    const json_value *split = &list->u.arr.items[0], *bl = &list->u.arr.items[1];
    const json_value *re = json_get(json_get(split, "pattern"), "Regex");
    int v;
    if (strcmp(type_of(split), "Split") != 0 || !is_str(re, LLAMA3_REGEX))
        return dj_fail(e, "tokenizer.json: pre-tokenizer %.60s is not supported (only Split with the Llama 3 regex)", type_of(split));
    if (json_opt_bool(split, "invert", "tokenizer.json: Split", 0, &v, e)) return -1;
    if (!is_str(json_get(split, "behavior"), "Isolated") || v)
        return dj_fail(e, "tokenizer.json: Split behavior other than Isolated (or invert) is not supported");
    if (strcmp(type_of(bl), "ByteLevel") != 0)
        return dj_fail(e, "tokenizer.json: pre-tokenizer %.60s after Split is not supported (only ByteLevel)", type_of(bl));
    if (json_opt_bool(bl, "add_prefix_space", "tokenizer.json: ByteLevel", 0, &v, e)) return -1;
    if (v)
        return dj_fail(e, "tokenizer.json: ByteLevel add_prefix_space: true is not supported");
    if (json_opt_bool(bl, "use_regex", "tokenizer.json: ByteLevel", 0, &v, e)) return -1;
    if (v)
        return dj_fail(e, "tokenizer.json: ByteLevel use_regex: true (the GPT-2 regex) is not supported");
    t->pretok = TOK_PRE_LLAMA3;
    return 0;
}

// SentencePiece-style decoder: Sequence[Replace("▁", " "), ByteFallback, Fuse, Strip(" ", start, 0)].
static int check_decoder(tj *t, const json_value *d, dj_err *e) {
    const char *type = type_of(d);
    if (strcmp(type, "ByteLevel") == 0) {
        t->type = TOK_TYPE_BYTELEVEL;
        return 0;
    }
    t->type = TOK_TYPE_SPM;
    const json_value *list = json_get(d, "decoders");
    if (strcmp(type, "Sequence") != 0 || !list || list->type != JSON_ARRAY || list->u.arr.n < 3 || list->u.arr.n > 4)
        return dj_fail(e, "tokenizer.json: decoder %.60s is not supported (only ByteLevel, or Replace+ByteFallback+Fuse+Strip)",
                       is_null(d) ? "null" : type);
    const json_value *it = list->u.arr.items;
    if (strcmp(type_of(&it[0]), "Replace") != 0 || !is_str(json_get(json_get(&it[0], "pattern"), "String"), SPACE_MARK) ||
        !is_str(json_get(&it[0], "content"), " "))
        return dj_fail(e, "tokenizer.json: decoder step 1 %.60s is not supported (only Replace(\"▁\", \" \"))", type_of(&it[0]));
    if (strcmp(type_of(&it[1]), "ByteFallback") != 0)
        return dj_fail(e, "tokenizer.json: decoder step 2 %.60s is not supported (only ByteFallback)", type_of(&it[1]));
    if (strcmp(type_of(&it[2]), "Fuse") != 0)
        return dj_fail(e, "tokenizer.json: decoder step 3 %.60s is not supported (only Fuse)", type_of(&it[2]));
    if (list->u.arr.n == 4) {
        int64_t start, stop;
        if (strcmp(type_of(&it[3]), "Strip") != 0 || !is_str(json_get(&it[3], "content"), " ") ||
            json_int(json_get(&it[3], "start"), &start) || json_int(json_get(&it[3], "stop"), &stop) || start < 0 ||
            start > 64 || stop != 0)
            return dj_fail(e, "tokenizer.json: decoder step 4 %.60s is not supported (only Strip(\" \", start, 0))", type_of(&it[3]));
        t->strip_start = (uint32_t)start;
    }
    return 0;
}

// The special token of a TemplateProcessing item, as one id.
static int template_token(const json_value *specials, const json_value *item, int32_t *id, dj_err *e) {
    const char *name = json_str(json_get(json_get(item, "SpecialToken"), "id"));
    const json_value *ids = json_get(json_get(specials, name ? name : ""), "ids");
    int64_t v;
    if (!name || !ids || ids->type != JSON_ARRAY || ids->u.arr.n != 1 || json_int(&ids->u.arr.items[0], &v) || v < 0 || v > INT32_MAX)
        return dj_fail(e, "tokenizer.json: TemplateProcessing special token %.60s is not one id", name ? name : "(unnamed)");
    *id = (int32_t)v;
    return 0;
}
static int check_postprocessor(tj *t, const json_value *p, dj_err *e) {
    if (is_null(p)) return 0;
    const char *type = type_of(p);
    if (strcmp(type, "ByteLevel") == 0) return 0;  // only adjusts offsets
    if (strcmp(type, "Sequence") == 0) {
        const json_value *list = json_get(p, "processors");
        if (!list || list->type != JSON_ARRAY) return dj_fail(e, "tokenizer.json: post-processor Sequence without a list");
        for (size_t i = 0; i < list->u.arr.n; i++)
            if (check_postprocessor(t, &list->u.arr.items[i], e)) return -1;
        return 0;
    }
    if (strcmp(type, "TemplateProcessing") != 0)
        return dj_fail(e, "tokenizer.json: post-processor %.60s is not supported (only TemplateProcessing, ByteLevel)", type);
    const json_value *single = json_get(p, "single"), *specials = json_get(p, "special_tokens");
    if (!single || single->type != JSON_ARRAY) return dj_fail(e, "tokenizer.json: TemplateProcessing without \"single\"");
    size_t a = SIZE_MAX;  // the position of the sequence
    for (size_t i = 0; i < single->u.arr.n; i++)
        if (json_get(&single->u.arr.items[i], "Sequence")) a = i;
    if (a == SIZE_MAX || a > 1 || single->u.arr.n - a > 2)
        return dj_fail(e, "tokenizer.json: TemplateProcessing \"single\" other than [bos] $A [eos] is not supported");
    if (a == 1) {
        if (template_token(specials, &single->u.arr.items[0], &t->bos_id, e)) return -1;
        t->flags |= TOK_F_ADD_BOS;
    }
    if (single->u.arr.n - a == 2) {
        if (template_token(specials, &single->u.arr.items[a + 1], &t->eos_append_id, e)) return -1;
        t->flags |= TOK_F_ADD_EOS;
    }
    return 0;
}

// ---- vocabulary, added tokens, merges
static int read_vocab(tj *t, const json_value *model, const json_value *added, dj_err *e) {
    const json_value *vocab = json_get(model, "vocab");
    if (!vocab || vocab->type != JSON_OBJECT) return dj_fail(e, "tokenizer.json: model.vocab is not an object");
    if (added && added->type != JSON_ARRAY) return dj_fail(e, "tokenizer.json: added_tokens is not an array");
    t->added = added;
    int64_t max_id = -1, id;
    for (size_t i = 0; i < vocab->u.obj.n; i++) {
        if (json_int(&vocab->u.obj.members[i].value, &id) || id < 0 || id >= (1 << 30))
            return dj_fail(e, "tokenizer.json: vocab entry \"%.120s\" has a bad id", vocab->u.obj.members[i].key);
        if (id > max_id) max_id = id;
    }
    for (size_t i = 0; added && i < added->u.arr.n; i++) {
        if (json_int(json_get(&added->u.arr.items[i], "id"), &id) || id < 0 || id >= (1 << 30))
            return dj_fail(e, "tokenizer.json: added token %zu has a bad id", i);
        if (id > max_id) max_id = id;
    }
    if (max_id < 0) return dj_fail(e, "tokenizer.json: empty vocabulary");
    // Memory follows the largest id: an id far beyond the tokens the file defines would allocate for nothing.
    uint64_t defined = vocab->u.obj.n + (added ? added->u.arr.n : 0);
    if ((uint64_t)max_id >= 2 * defined + 1024)
        return dj_fail(e, "tokenizer.json: token id %lld, but the file defines only %llu tokens (ids must be dense)",
                       (long long)max_id, (unsigned long long)defined);
    t->n_vocab = (int32_t)max_id + 1;
    t->str = calloc((size_t)t->n_vocab, sizeof *t->str);
    t->len = calloc((size_t)t->n_vocab, sizeof *t->len);
    t->attr = calloc((size_t)t->n_vocab, 1);
    t->mask = 15;
    while (t->mask + 1 < 2 * (uint64_t)vocab->u.obj.n) t->mask = t->mask * 2 + 1;
    t->h = malloc(sizeof(int32_t) * (t->mask + 1));
    if (!t->str || !t->len || !t->attr || !t->h) return dj_fail(e, "tokenizer.json: out of memory");
    memset(t->h, 0xff, sizeof(int32_t) * (t->mask + 1));
    for (size_t i = 0; i < vocab->u.obj.n; i++) {
        const json_member *m = &vocab->u.obj.members[i];
        json_int(&m->value, &id);
        if (t->str[id]) return dj_fail(e, "tokenizer.json: id %lld is given to two vocab entries", (long long)id);
        if (tj_model_id(t, m->key, m->key_len) >= 0) return dj_fail(e, "tokenizer.json: vocab entry \"%.120s\" appears twice", m->key);
        t->str[id] = m->key, t->len[id] = m->key_len, t->attr[id] = TOK_A_EXISTS | TOK_A_MODEL;
        uint64_t h = tj_hash(m->key, m->key_len) & t->mask;
        while (t->h[h] >= 0) h = (h + 1) & t->mask;
        t->h[h] = (int32_t)id;
    }
    for (size_t i = 0; added && i < added->u.arr.n; i++) {
        const json_value *a = &added->u.arr.items[i];
        const json_value *c = json_get(a, "content");
        json_int(json_get(a, "id"), &id);
        if (!c || c->type != JSON_STRING || c->u.str.len == 0)
            return dj_fail(e, "tokenizer.json: added token %lld has no content", (long long)id);
        static const char *const unsupported[] = {"single_word", "lstrip", "rstrip", "normalized"};
        for (int k = 0; k < 4; k++) {
            int v;
            if (json_opt_bool(a, unsupported[k], "tokenizer.json: added token", 0, &v, e)) return -1;
            if (v)
                return dj_fail(e, "tokenizer.json: added token \"%.120s\" has %s: true, which is not supported", c->u.str.s,
                               unsupported[k]);
        }
        if ((t->attr[id] & TOK_A_MODEL) && (t->len[id] != c->u.str.len || memcmp(t->str[id], c->u.str.s, c->u.str.len)))
            return dj_fail(e, "tokenizer.json: added token \"%.120s\" has id %lld, which the vocab names \"%.120s\"", c->u.str.s,
                           (long long)id, t->str[id]);
        int special;
        if (json_opt_bool(a, "special", "tokenizer.json: added token", 0, &special, e)) return -1;
        t->str[id] = c->u.str.s, t->len[id] = c->u.str.len;
        t->attr[id] |= TOK_A_EXISTS | TOK_A_ADDED | (special ? TOK_A_SPECIAL : 0);
    }
    const char *unk = json_str(json_get(model, "unk_token"));
    t->unk_id = unk ? tj_model_id(t, unk, strlen(unk)) : -1;
    if (unk && t->unk_id < 0) return dj_fail(e, "tokenizer.json: unk_token \"%.120s\" is not in the vocab", unk);
    return 0;
}

static int read_merges(tj *t, const json_value *model, dj_err *e) {
    const json_value *merges = json_get(model, "merges");
    if (!merges) return 0;
    if (merges->type != JSON_ARRAY) return dj_fail(e, "tokenizer.json: model.merges is not an array");
    size_t n = merges->u.arr.n;
    t->merges = malloc(12 * (n ? n : 1));
    if (!t->merges) return dj_fail(e, "tokenizer.json: out of memory");
    char *buf = NULL;
    size_t cap = 0;
    int rc = 0;
    for (size_t i = 0; i < n && !rc; i++) {
        const json_value *m = &merges->u.arr.items[i];
        const char *a, *b;
        size_t la, lb;
        if (m->type == JSON_STRING) {  // "left right"
            const char *sp = memchr(m->u.str.s, ' ', m->u.str.len);
            if (!sp || memchr(sp + 1, ' ', m->u.str.len - (size_t)(sp + 1 - m->u.str.s))) {
                rc = dj_fail(e, "tokenizer.json: merge %zu \"%.120s\" is not two tokens", i, m->u.str.s);
                break;
            }
            a = m->u.str.s, la = (size_t)(sp - a), b = sp + 1, lb = m->u.str.len - la - 1;
        } else if (m->type == JSON_ARRAY && m->u.arr.n == 2 && m->u.arr.items[0].type == JSON_STRING &&
                   m->u.arr.items[1].type == JSON_STRING) {
            a = m->u.arr.items[0].u.str.s, la = m->u.arr.items[0].u.str.len;
            b = m->u.arr.items[1].u.str.s, lb = m->u.arr.items[1].u.str.len;
        } else {
            rc = dj_fail(e, "tokenizer.json: merge %zu is neither \"a b\" nor [a, b]", i);
            break;
        }
        if (la + lb + 1 > cap) {
            cap = 2 * (la + lb + 1);
            char *nb = realloc(buf, cap);
            if (!nb) { rc = dj_fail(e, "tokenizer.json: out of memory"); break; }
            buf = nb;
        }
        memcpy(buf, a, la), memcpy(buf + la, b, lb);
        int32_t ia = tj_model_id(t, a, la), ib = tj_model_id(t, b, lb), im = tj_model_id(t, buf, la + lb);
        if (ia < 0 || ib < 0 || im < 0) {
            buf[la + lb] = 0;
            rc = dj_fail(e, "tokenizer.json: merge %zu: \"%.120s\" (or one of its halves) is not in the vocab", i, buf);
            break;
        }
        uint32_t *o = t->merges + 3 * t->n_merges++;
        o[0] = (uint32_t)ia, o[1] = (uint32_t)ib, o[2] = (uint32_t)im;
    }
    free(buf);
    return rc;
}

// ---- the other config files
static int add_eos(tj *t, int64_t id, const char *where, dj_err *e) {
    if (id < 0 || id >= t->n_vocab) return dj_fail(e, "%s: eos_token_id %lld is outside the vocabulary", where, (long long)id);
    for (size_t i = 0; i < t->n_eos; i++)
        if (t->eos[i] == id) return 0;
    if (t->n_eos >= TOK_MAX_EOS) return dj_fail(e, "%s: more than %d eos ids", where, TOK_MAX_EOS);
    int32_t *p = realloc(t->eos, sizeof *p * (t->n_eos + 1));
    if (!p) return dj_fail(e, "%s: out of memory", where);
    t->eos = p;
    t->eos[t->n_eos++] = (int32_t)id;
    return 0;
}
static int add_eos_ids(tj *t, const json_value *v, const char *where, dj_err *e) {  // an int or a list of ints
    int64_t id;
    if (is_null(v)) return 0;
    if (v->type == JSON_ARRAY) {
        for (size_t i = 0; i < v->u.arr.n; i++) {
            if (json_int(&v->u.arr.items[i], &id)) return dj_fail(e, "%s: eos_token_id list holds a non-integer", where);
            if (add_eos(t, id, where, e)) return -1;
        }
        return 0;
    }
    if (json_int(v, &id)) return dj_fail(e, "%s: eos_token_id is neither an integer nor a list", where);
    return add_eos(t, id, where, e);
}
static const char *token_name(const json_value *v) {  // "name" or {"content": "name"}
    const char *s = json_str(v);
    return s ? s : json_str(json_get(v, "content"));
}

static int read_configs(tj *t, const json_doc *tc, const json_doc *gc, const json_doc *cc, dj_err *e) {
    const json_value *tcr = tc ? json_root(tc) : NULL, *gcr = gc ? json_root(gc) : NULL, *ccr = cc ? json_root(cc) : NULL;
    if (add_eos_ids(t, json_get(gcr, "eos_token_id"), "generation_config.json", e) ||
        add_eos_ids(t, json_get(ccr, "eos_token_id"), "config.json", e))
        return -1;
    const char *eos = token_name(json_get(tcr, "eos_token"));
    if (eos) {
        int32_t id = tj_token_id(t, eos);
        if (id < 0) return dj_fail(e, "tokenizer_config.json: eos_token \"%.120s\" is not in the vocabulary", eos);
        if (add_eos(t, id, "tokenizer_config.json", e)) return -1;
    }
    if (t->bos_id < 0) {  // the post-processor adds none; still report the model's BOS
        int64_t id;
        const char *bos = token_name(json_get(tcr, "bos_token"));
        if (json_int(json_get(ccr, "bos_token_id"), &id) == 0 && id >= 0 && id < t->n_vocab) t->bos_id = (int32_t)id;
        else if (bos) t->bos_id = tj_token_id(t, bos);
    }
    // transformers' Llama tokenizers rebuild the post-processor from add_bos_token/add_eos_token; follow explicit values
    int add_bos;
    if (json_opt_bool(tcr, "add_bos_token", "tokenizer_config.json", -1, &add_bos, e)) return -1;
    if (add_bos >= 0) {
        if (add_bos && t->bos_id < 0) return dj_fail(e, "tokenizer_config.json: add_bos_token is true but there is no bos token");
        t->flags = add_bos ? t->flags | TOK_F_ADD_BOS : t->flags & ~(uint32_t)TOK_F_ADD_BOS;
    }
    int add_eos;
    if (json_opt_bool(tcr, "add_eos_token", "tokenizer_config.json", -1, &add_eos, e)) return -1;
    if (add_eos >= 0) {
        if (add_eos && t->eos_append_id < 0) t->eos_append_id = eos ? tj_token_id(t, eos) : -1;
        if (add_eos && t->eos_append_id < 0) return dj_fail(e, "tokenizer_config.json: add_eos_token is true but there is no eos token");
        t->flags = add_eos ? t->flags | TOK_F_ADD_EOS : t->flags & ~(uint32_t)TOK_F_ADD_EOS;
    }
    const json_value *tmpl = json_get(tcr, "chat_template");
    if (tmpl && tmpl->type == JSON_STRING) {
        t->tmpl = tmpl->u.str.s, t->tmpl_len = tmpl->u.str.len;
    } else if (tmpl && tmpl->type == JSON_ARRAY) {  // [{name, template}]: "default", else the first
        for (size_t i = 0; i < tmpl->u.arr.n; i++) {
            const json_value *x = json_get(&tmpl->u.arr.items[i], "template");
            if (!x || x->type != JSON_STRING) continue;
            if (!t->tmpl || is_str(json_get(&tmpl->u.arr.items[i], "name"), "default"))
                t->tmpl = x->u.str.s, t->tmpl_len = x->u.str.len;
        }
    }
    return 0;
}

// ---- the section
static void wr32(uint8_t *p, uint32_t v) { memcpy(p, &v, 4); }  // little-endian hosts only
static void wr64(uint8_t *p, uint64_t v) { memcpy(p, &v, 8); }

static int write_blob(const tj *t, uint8_t **blob, size_t *blob_size, dj_err *e) {
    size_t nv = (size_t)t->n_vocab, n_added = 0, pool = 0;
    for (size_t i = 0; i < nv; i++) {
        pool += t->len[i];
        if (t->attr[i] & TOK_A_ADDED) pool += t->len[i], n_added++;
    }
    uint64_t sz[TOK_N_SEC] = {8 * (nv + 1), nv, pool, 12 * t->n_merges, 24 * n_added, 4 * t->n_eos, t->tmpl_len};
    uint64_t off[TOK_N_SEC], at = TOK_HEADER_SIZE;
    for (int i = 0; i < TOK_N_SEC; i++) off[i] = at, at = dj_align_up(at + sz[i], 8);
    uint8_t *b = calloc(1, at);
    if (!b) return dj_fail(e, "tokenizer.json: out of memory");
    memcpy(b, TOK_MAGIC, 8);
    wr32(b + 8, TOK_VERSION), wr32(b + 12, t->type), wr32(b + 16, t->flags);
    wr32(b + 20, (uint32_t)t->unk_id), wr32(b + 24, (uint32_t)t->bos_id), wr32(b + 28, (uint32_t)t->eos_append_id);
    wr32(b + 32, (uint32_t)nv), wr32(b + 36, (uint32_t)t->n_merges), wr32(b + 40, (uint32_t)n_added);
    wr32(b + 44, (uint32_t)t->n_eos), wr32(b + 48, t->pretok), wr32(b + 52, t->prepend_scheme), wr32(b + 56, t->strip_start);
    for (int i = 0; i < TOK_N_SEC; i++) wr64(b + 64 + 16 * i, off[i]), wr64(b + 72 + 16 * i, sz[i]);
    // pieces as the decoder consumes them, then the added-token contents as matched in the text
    uint8_t *pool_p = b + off[TOK_SEC_POOL];
    uint64_t p = 0;
    for (size_t i = 0; i < nv; i++) {
        wr64(b + off[TOK_SEC_PIECE_OFF] + 8 * i, p);
        uint8_t attr = t->attr[i];
        if (t->type == TOK_TYPE_BYTELEVEL && t->str[i]) {
            int mapped;
            p += bytelevel_bytes(t->str[i], t->len[i], pool_p + p, &mapped);
            if (!mapped) attr &= (uint8_t)~TOK_A_MODEL;  // cannot come out of a byte-level word
        } else if (t->str[i]) {
            memcpy(pool_p + p, t->str[i], t->len[i]);
            p += t->len[i];
        }
        b[off[TOK_SEC_ATTR] + i] = attr;
    }
    wr64(b + off[TOK_SEC_PIECE_OFF] + 8 * nv, p);
    for (size_t i = 0, k = 0; i < nv; i++) {
        if (!(t->attr[i] & TOK_A_ADDED)) continue;
        uint8_t *a = b + off[TOK_SEC_ADDED] + 24 * k++;
        wr32(a, (uint32_t)i), wr64(a + 8, p), wr64(a + 16, t->len[i]);
        memcpy(pool_p + p, t->str[i], t->len[i]);
        p += t->len[i];
    }
    sz[TOK_SEC_POOL] = p;  // byte-level pieces shrink when mapped back
    wr64(b + 72 + 16 * TOK_SEC_POOL, p);
    if (t->n_merges) memcpy(b + off[TOK_SEC_MERGES], t->merges, 12 * t->n_merges);  // none: merges may be NULL
    for (size_t i = 0; i < t->n_eos; i++) wr32(b + off[TOK_SEC_EOS] + 4 * i, (uint32_t)t->eos[i]);
    if (t->tmpl_len) memcpy(b + off[TOK_SEC_TEMPLATE], t->tmpl, t->tmpl_len);
    *blob = b, *blob_size = at;
    return 0;
}

// ---- entry points
int tokjson_build(const char *tokenizer_json, size_t tokenizer_json_len, const char *tokenizer_config,
                  size_t tokenizer_config_len, const char *generation_config, size_t generation_config_len,
                  const char *config, size_t config_len, uint8_t **blob, size_t *blob_size, dj_err *e) {
    *blob = NULL, *blob_size = 0;
    tj t = {.unk_id = -1, .bos_id = -1, .eos_append_id = -1};
    json_doc *tj_doc = NULL, *tc = NULL, *gc = NULL, *cc = NULL;
    int rc = -1;
    dj_err je;
    if (!(tj_doc = json_parse(tokenizer_json, tokenizer_json_len, &je))) { dj_fail(e, "tokenizer.json: %s", je.msg); goto done; }
    if (tokenizer_config && !(tc = json_parse(tokenizer_config, tokenizer_config_len, &je))) { dj_fail(e, "tokenizer_config.json: %s", je.msg); goto done; }
    if (generation_config && !(gc = json_parse(generation_config, generation_config_len, &je))) { dj_fail(e, "generation_config.json: %s", je.msg); goto done; }
    if (config && !(cc = json_parse(config, config_len, &je))) { dj_fail(e, "config.json: %s", je.msg); goto done; }
    const json_value *root = json_root(tj_doc), *model = json_get(root, "model");
    if (!root || root->type != JSON_OBJECT || !model || model->type != JSON_OBJECT) {
        dj_fail(e, "tokenizer.json: no \"model\" object");
        goto done;
    }
    if (!is_null(json_get(root, "truncation")) || !is_null(json_get(root, "padding"))) {
        dj_fail(e, "tokenizer.json: truncation/padding settings are not supported (set them to null)");
        goto done;
    }
    if (check_model(&t, model, e) || check_decoder(&t, json_get(root, "decoder"), e) ||
        check_normalizer(&t, json_get(root, "normalizer"), e) || check_pretokenizer(&t, json_get(root, "pre_tokenizer"), e) ||
        read_vocab(&t, model, json_get(root, "added_tokens"), e) || read_merges(&t, model, e) ||
        check_postprocessor(&t, json_get(root, "post_processor"), e))
        goto done;
    if (t.type == TOK_TYPE_BYTELEVEL && (t.flags & TOK_F_BYTE_FALLBACK)) {
        dj_fail(e, "tokenizer.json: byte_fallback with a ByteLevel decoder is not supported");
        goto done;
    }
    if ((t.bos_id >= t.n_vocab) || (t.eos_append_id >= t.n_vocab)) {
        dj_fail(e, "tokenizer.json: post-processor token id outside the vocabulary");
        goto done;
    }
    if (read_configs(&t, tc, gc, cc, e) || write_blob(&t, blob, blob_size, e)) goto done;
    rc = 0;
done:
    free(t.str), free(t.len), free(t.attr), free(t.h), free(t.eos), free(t.merges);
    json_free(tj_doc), json_free(tc), json_free(gc), json_free(cc);
    return rc;
}

// The largest each file may be: the limit fits its kind (Llama 3's tokenizer.json is 9 MB, a config a few KB), and
// the parse's memory stays a small multiple of it.
static const size_t max_bytes[4] = {256u << 20, 16u << 20, 1u << 20, 16u << 20};

// Reads dir/name into a malloc'd buffer; *data = NULL when the file does not exist and !required.
static int read_file(const char *dir, const char *name, int required, size_t max, char **data, size_t *n, dj_err *e) {
    char path[4096];
    *data = NULL, *n = 0;
    if ((size_t)snprintf(path, sizeof path, "%s/%s", dir, name) >= sizeof path) return dj_fail(e, "%s/%s: path too long", dir, name);
    return required ? in_read_all(path, name, max, data, n, e) : in_read_optional(path, name, max, data, n, e);
}

// Which folder each file comes from. tokenizer.json and tokenizer_config.json describe the tokenizer (vocabulary,
// the bos/eos strings, add_bos_token, the chat template): from tok_dir. config.json and generation_config.json
// describe the model (the ids it was trained to start with and to stop on): from model_dir, so a tokenizer
// borrowed from another folder never replaces the model's own ids. read_configs then combines them: the eos
// ids are the union of generation_config's, config.json's and tokenizer_config's eos_token; bos is the
// post-processor's, else config.json's bos_token_id, else tokenizer_config's bos_token.
int tokjson_build_dirs(const char *tok_dir, const char *model_dir, uint8_t **blob, size_t *blob_size, dj_err *e) {
    static const char *const names[4] = {"tokenizer.json", "tokenizer_config.json", "generation_config.json", "config.json"};
    const char *dirs[4] = {tok_dir, tok_dir, model_dir, model_dir};
    char *d[4] = {0};
    size_t n[4] = {0};
    int rc = 0;
    for (int i = 0; i < 4 && !rc; i++) rc = read_file(dirs[i], names[i], i == 0, max_bytes[i], &d[i], &n[i], e);
    if (!rc) rc = tokjson_build(d[0], n[0], d[1], n[1], d[2], n[2], d[3], n[3], blob, blob_size, e);
    for (int i = 0; i < 4; i++) free(d[i]);
    return rc;
}

int tokjson_build_dir(const char *hf_dir, uint8_t **blob, size_t *blob_size, dj_err *e) {
    return tokjson_build_dirs(hf_dir, hf_dir, blob, blob_size, e);
}
