// tokenizer.c: the engine's tokenizer (format of its section: tokenizer.h). Reproduces HF `tokenizers` for the two
// families the converter accepts:
//   TOK_TYPE_SPM (Llama 2): added tokens split first; each remaining segment normalized (legacy Prepend "▁" +
//     Replace " " -> "▁", or the Metaspace pre-tokenizer); BPE over characters with <0xNN> byte fallback.
//     Decoder: Replace "▁" -> " ", ByteFallback, Fuse, Strip(" ", start, 0).
//   TOK_TYPE_BYTELEVEL (Llama 3): added tokens split first; the Llama 3 split regex (by hand, below); BPE
//     over bytes with ignore_merges. Decoder: concatenate bytes, invalid UTF-8 -> U+FFFD (from_utf8_lossy).
// BPE merges with a binary heap over a linked list of symbols, as HF's Word::merge_all does (O(n log n)),
// so a long segment without pre-tokenizer (Llama 2) stays fast.
#include "tokenizer.h"

#include <stdlib.h>
#include <string.h>

#include "unicode_tables.h"

struct dj_tokenizer {
    uint32_t type, flags, pretok, prepend_scheme, strip_start;
    int32_t unk_id, bos_id, eos_append_id;
    int32_t n_vocab;
    char *pool;            // (pool_size) piece bytes
    uint64_t *piece_off;   // (n_vocab + 1)
    uint8_t *attr;         // (n_vocab) TOK_A_*
    int16_t *byte_val;     // (n_vocab) SPM: the byte of a "<0xNN>" piece, else -1
    int32_t byte_id[256];  // BYTELEVEL: id of the one-byte piece; SPM: id of "<0xNN>"; -1 when absent
    int32_t *vhash;        // (vmask + 1) piece -> id over model-vocabulary pieces, -1 empty
    uint64_t vmask;
    uint64_t *mkey;        // (mmask + 1) merge hash: key (left << 32 | right), UINT64_MAX empty
    uint32_t *mrank;       // (mmask + 1)
    int32_t *mnew;         // (mmask + 1) merged id
    uint64_t mmask;
    struct tok_added { int32_t id; const char *s; size_t len; } *added;  // (n_added) by first byte, longest first
    size_t n_added;
    uint32_t added_lo[257];  // added[added_lo[b] .. added_lo[b+1]) start with byte b
    uint64_t added_2nd[256][4];  // bit c of row b: some added token starts with bytes b, c (or is just b)
    int split_at_mark;     // SPM: no model piece has "▁" after another character, so merges never cross the start
                           // of a "▁" run and a long segment may be cut there (exact, and keeps the heap small)
    int32_t *eos;          // (n_eos)
    size_t n_eos;
    char *tmpl;            // NUL-terminated
};

// ---- little helpers
static uint32_t rd32(const uint8_t *p) { uint32_t v; memcpy(&v, p, 4); return v; }  // little-endian hosts only
static uint64_t rd64(const uint8_t *p) { uint64_t v; memcpy(&v, p, 8); return v; }

static uint64_t hash_bytes(const void *p, size_t n) {  // FNV-1a, then a final mix
    const uint8_t *s = p;
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ s[i]) * 1099511628211ull;
    return h ^ (h >> 29);
}
static uint64_t hash_u64(uint64_t x) {  // splitmix64 finalizer
    x ^= x >> 30; x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27; x *= 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}
static uint64_t table_size(uint64_t n) {  // power of two >= 2n
    uint64_t s = 16;
    while (s < 2 * n) s <<= 1;
    return s;
}

typedef struct { char *p; size_t n, cap; } tbuf;
static int tb_reserve(tbuf *b, size_t more) {
    if (b->n + more + 1 <= b->cap) return 0;
    size_t cap = b->cap ? b->cap : 64;
    while (cap < b->n + more + 1) cap *= 2;
    char *p = realloc(b->p, cap);
    if (!p) return -1;
    b->p = p, b->cap = cap;
    return 0;
}
static int tb_put(tbuf *b, const void *s, size_t n) {
    if (tb_reserve(b, n)) return -1;
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
    return 0;
}

// ---- UTF-8
// Length of the next unit of s[0..n) (n >= 1): *ok = 1 a whole valid character, 0 an ill-formed maximal subpart
// (one U+FFFD, as Rust's from_utf8_lossy), -1 a valid prefix cut by the end of s.
static size_t u8_next(const uint8_t *s, size_t n, int *ok) {
    uint8_t b = s[0], lo = 0x80, hi = 0xBF;
    size_t need;
    if (b < 0x80) { *ok = 1; return 1; }
    if (b >= 0xC2 && b <= 0xDF) need = 1;
    else if (b == 0xE0) need = 2, lo = 0xA0;
    else if ((b >= 0xE1 && b <= 0xEC) || b == 0xEE || b == 0xEF) need = 2;
    else if (b == 0xED) need = 2, hi = 0x9F;
    else if (b == 0xF0) need = 3, lo = 0x90;
    else if (b >= 0xF1 && b <= 0xF3) need = 3;
    else if (b == 0xF4) need = 3, hi = 0x8F;
    else { *ok = 0; return 1; }
    for (size_t k = 1; k <= need; k++) {
        if (k >= n) { *ok = -1; return k; }
        uint8_t c = s[k], l = k == 1 ? lo : 0x80, h = k == 1 ? hi : 0xBF;
        if (c < l || c > h) { *ok = 0; return k; }
    }
    *ok = 1;
    return need + 1;
}
static int u8_valid(const uint8_t *s, size_t n) {
    for (size_t i = 0; i < n;) {
        int ok;
        i += u8_next(s + i, n - i, &ok);
        if (ok != 1) return 0;
    }
    return 1;
}
// Appends s[0..n) with ill-formed parts replaced by U+FFFD; when !final, stops before a cut-off character at the
// end. Returns the bytes consumed, or SIZE_MAX when out of memory.
static size_t u8_lossy(tbuf *out, const uint8_t *s, size_t n, int final) {
    size_t i = 0;
    while (i < n) {
        int ok;
        size_t k = u8_next(s + i, n - i, &ok);
        if (ok == -1 && !final) break;
        if (ok == 1 ? tb_put(out, s + i, k) : tb_put(out, "\xEF\xBF\xBD", 3)) return SIZE_MAX;
        i += k;
    }
    return i;
}
// Decodes the valid character at s[0..n) (the text was validated).
static size_t u8_dec(const uint8_t *s, size_t n, uint32_t *cp) {
    uint8_t b = s[0];
    if (b < 0x80 || n < 2) { *cp = b; return 1; }
    if (b < 0xE0) { *cp = (uint32_t)(b & 0x1F) << 6 | (s[1] & 0x3F); return 2; }
    if (b < 0xF0 || n < 4) { *cp = (uint32_t)(b & 0x0F) << 12 | (uint32_t)(s[1] & 0x3F) << 6 | (s[2] & 0x3F); return 3; }
    *cp = (uint32_t)(b & 0x07) << 18 | (uint32_t)(s[1] & 0x3F) << 12 | (uint32_t)(s[2] & 0x3F) << 6 | (s[3] & 0x3F);
    return 4;
}

// ---- load
static int32_t vocab_find(const dj_tokenizer *t, const void *s, size_t n) {
    for (uint64_t h = hash_bytes(s, n) & t->vmask;; h = (h + 1) & t->vmask) {
        int32_t id = t->vhash[h];
        if (id < 0) return -1;
        if (t->piece_off[id + 1] - t->piece_off[id] == n && memcmp(t->pool + t->piece_off[id], s, n) == 0) return id;
    }
}
static int merge_find(const dj_tokenizer *t, int32_t a, int32_t b, uint32_t *rank, int32_t *new_id) {
    uint64_t key = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
    for (uint64_t h = hash_u64(key) & t->mmask;; h = (h + 1) & t->mmask) {
        if (t->mkey[h] == UINT64_MAX) return 0;
        if (t->mkey[h] == key) { *rank = t->mrank[h]; *new_id = t->mnew[h]; return 1; }
    }
}

static int cmp_added(const void *a, const void *b) {
    const struct tok_added *x = a, *y = b;
    uint8_t fx = (uint8_t)x->s[0], fy = (uint8_t)y->s[0];
    if (fx != fy) return fx < fy ? -1 : 1;
    if (x->len != y->len) return x->len > y->len ? -1 : 1;  // longest first: leftmost-longest matching
    return x->id < y->id ? -1 : x->id > y->id;
}

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

dj_tokenizer *tok_load(const void *blob, size_t n, dj_err *e) {
    const uint8_t *b = blob;
    if (!b || n < TOK_HEADER_SIZE || memcmp(b, TOK_MAGIC, 8) != 0) {
        dj_fail(e, "tokenizer section: bad magic or size %zu (expected a %s section): re-run ./convert", n, TOK_MAGIC);
        return NULL;
    }
    if (rd32(b + 8) != TOK_VERSION) {
        dj_fail(e, "tokenizer section: version %u, this build reads version %u: re-run ./convert with this version",
                rd32(b + 8), TOK_VERSION);
        return NULL;
    }
    dj_tokenizer *t = calloc(1, sizeof *t);
    if (!t) { dj_fail(e, "tokenizer: out of memory"); return NULL; }
    t->type = rd32(b + 12), t->flags = rd32(b + 16);
    t->unk_id = (int32_t)rd32(b + 20), t->bos_id = (int32_t)rd32(b + 24), t->eos_append_id = (int32_t)rd32(b + 28);
    uint32_t n_vocab = rd32(b + 32), n_merges = rd32(b + 36), n_added = rd32(b + 40), n_eos = rd32(b + 44);
    t->pretok = rd32(b + 48), t->prepend_scheme = rd32(b + 52), t->strip_start = rd32(b + 56);
    uint64_t off[TOK_N_SEC], sz[TOK_N_SEC];
    for (int i = 0; i < TOK_N_SEC; i++) {
        off[i] = rd64(b + 64 + 16 * i), sz[i] = rd64(b + 72 + 16 * i);
        if (off[i] > n || sz[i] > n - off[i]) {
            dj_fail(e, "tokenizer section: part %d at %llu+%llu lies outside the %zu-byte section: re-run ./convert", i,
                    (unsigned long long)off[i], (unsigned long long)sz[i], n);
            goto fail;
        }
    }
    if (t->type != TOK_TYPE_SPM && t->type != TOK_TYPE_BYTELEVEL) { dj_fail(e, "tokenizer section: unknown type %u", t->type); goto fail; }
    if (t->flags & ~(uint32_t)TOK_F_ALL) { dj_fail(e, "tokenizer section: unknown flags 0x%x", t->flags); goto fail; }
    if (t->pretok > TOK_PRE_LLAMA3 || t->prepend_scheme > TOK_PREPEND_NEVER || t->strip_start > 64) {
        dj_fail(e, "tokenizer section: bad pre-tokenizer %u / prepend scheme %u / strip %u", t->pretok,
                t->prepend_scheme, t->strip_start);
        goto fail;
    }
    if (n_vocab == 0 || n_vocab > (1u << 30) || n_eos > TOK_MAX_EOS || n_added > n_vocab) {
        dj_fail(e, "tokenizer section: bad counts (vocab %u, added %u, eos %u)", n_vocab, n_added, n_eos);
        goto fail;
    }
    t->n_vocab = (int32_t)n_vocab;
    if (sz[TOK_SEC_PIECE_OFF] != 8ull * (n_vocab + 1ull) || sz[TOK_SEC_ATTR] != n_vocab ||
        sz[TOK_SEC_MERGES] != 12ull * n_merges || sz[TOK_SEC_ADDED] != 24ull * n_added || sz[TOK_SEC_EOS] != 4ull * n_eos) {
        dj_fail(e, "tokenizer section: part sizes do not match the counts: re-run ./convert");
        goto fail;
    }
#define BAD_ID(x) ((x) < -1 || (x) >= t->n_vocab)
    if (BAD_ID(t->unk_id) || BAD_ID(t->bos_id) || BAD_ID(t->eos_append_id) ||
        ((t->flags & TOK_F_ADD_BOS) && t->bos_id < 0) || ((t->flags & TOK_F_ADD_EOS) && t->eos_append_id < 0)) {
        dj_fail(e, "tokenizer section: unk/bos/eos id out of range");
        goto fail;
    }
    // pieces
    uint64_t pool_size = sz[TOK_SEC_POOL];
    t->pool = malloc(pool_size + 1);
    t->piece_off = malloc(8 * (n_vocab + 1ull));
    t->attr = malloc(n_vocab);
    t->byte_val = malloc(2ull * n_vocab);
    if (!t->pool || !t->piece_off || !t->attr || !t->byte_val) { dj_fail(e, "tokenizer: out of memory"); goto fail; }
    memcpy(t->pool, b + off[TOK_SEC_POOL], pool_size);
    memcpy(t->attr, b + off[TOK_SEC_ATTR], n_vocab);
    for (uint32_t i = 0; i <= n_vocab; i++) {
        t->piece_off[i] = rd64(b + off[TOK_SEC_PIECE_OFF] + 8ull * i);
        if ((i == 0 && t->piece_off[0] != 0) || (i > 0 && t->piece_off[i] < t->piece_off[i - 1]) || t->piece_off[i] > pool_size) {
            dj_fail(e, "tokenizer section: piece %u has a bad offset", i);
            goto fail;
        }
    }
    // piece -> id over the model vocabulary; the first id wins on a duplicate
    t->vmask = table_size(n_vocab) - 1;
    t->vhash = malloc(sizeof(int32_t) * (t->vmask + 1));
    if (!t->vhash) { dj_fail(e, "tokenizer: out of memory"); goto fail; }
    memset(t->vhash, 0xff, sizeof(int32_t) * (t->vmask + 1));
    for (int32_t id = 0; id < t->n_vocab; id++) {
        const char *p = t->pool + t->piece_off[id];
        size_t len = t->piece_off[id + 1] - t->piece_off[id];
        t->byte_val[id] = -1;
        // HF's test: 6 bytes "<0x??>" with ?? parsed by u8::from_str_radix(_, 16), which also takes "+F"
        if (t->type == TOK_TYPE_SPM && len == 6 && memcmp(p, "<0x", 3) == 0 && p[5] == '>' && hexval(p[4]) >= 0 &&
            (hexval(p[3]) >= 0 || p[3] == '+'))
            t->byte_val[id] = (int16_t)((p[3] == '+' ? 0 : hexval(p[3]) * 16) + hexval(p[4]));
        if (!(t->attr[id] & TOK_A_MODEL)) continue;
        if (vocab_find(t, p, len) >= 0) continue;
        uint64_t h = hash_bytes(p, len) & t->vmask;
        while (t->vhash[h] >= 0) h = (h + 1) & t->vmask;
        t->vhash[h] = id;
    }
    for (int c = 0; c < 256; c++) {
        char s[8];
        if (t->type == TOK_TYPE_SPM) {
            static const char hx[] = "0123456789ABCDEF";
            s[0] = '<', s[1] = '0', s[2] = 'x', s[3] = hx[c >> 4], s[4] = hx[c & 15], s[5] = '>';
            t->byte_id[c] = vocab_find(t, s, 6);
        } else {
            s[0] = (char)c;
            t->byte_id[c] = vocab_find(t, s, 1);
        }
    }
    if (t->type == TOK_TYPE_SPM) {
        t->split_at_mark = vocab_find(t, "\xE2\x96\x81", 3) >= 0;
        for (int32_t id = 0; id < t->n_vocab && t->split_at_mark; id++) {
            const char *p = t->pool + t->piece_off[id];
            size_t len = t->piece_off[id + 1] - t->piece_off[id];
            if (!(t->attr[id] & TOK_A_MODEL)) continue;
            for (size_t i = 1; i + 3 <= len; i++)
                if (memcmp(p + i, "\xE2\x96\x81", 3) == 0 && (i < 3 || memcmp(p + i - 3, "\xE2\x96\x81", 3) != 0))
                    t->split_at_mark = 0;
        }
    }
    // merges; a later duplicate pair overwrites an earlier one, as HF's HashMap collect does
    t->mmask = table_size(n_merges) - 1;
    t->mkey = malloc(8 * (t->mmask + 1));
    t->mrank = malloc(4 * (t->mmask + 1));
    t->mnew = malloc(4 * (t->mmask + 1));
    if (!t->mkey || !t->mrank || !t->mnew) { dj_fail(e, "tokenizer: out of memory"); goto fail; }
    memset(t->mkey, 0xff, 8 * (t->mmask + 1));
    for (uint32_t r = 0; r < n_merges; r++) {
        const uint8_t *m = b + off[TOK_SEC_MERGES] + 12ull * r;
        uint32_t l = rd32(m), rr = rd32(m + 4), nw = rd32(m + 8);
        if (l >= n_vocab || rr >= n_vocab || nw >= n_vocab) { dj_fail(e, "tokenizer section: merge %u has an id out of range", r); goto fail; }
        uint64_t key = (uint64_t)l << 32 | rr, h = hash_u64(key) & t->mmask;
        while (t->mkey[h] != UINT64_MAX && t->mkey[h] != key) h = (h + 1) & t->mmask;
        t->mkey[h] = key, t->mrank[h] = r, t->mnew[h] = (int32_t)nw;
    }
    // added tokens
    t->n_added = n_added;
    t->added = calloc(n_added ? n_added : 1, sizeof *t->added);
    if (!t->added) { dj_fail(e, "tokenizer: out of memory"); goto fail; }
    for (uint32_t i = 0; i < n_added; i++) {
        const uint8_t *a = b + off[TOK_SEC_ADDED] + 24ull * i;
        uint32_t id = rd32(a);
        uint64_t o = rd64(a + 8), l = rd64(a + 16);
        if (id >= n_vocab || l == 0 || o > pool_size || l > pool_size - o) {
            dj_fail(e, "tokenizer section: added token %u is out of range", i);
            goto fail;
        }
        t->added[i] = (struct tok_added){(int32_t)id, t->pool + o, l};
    }
    qsort(t->added, n_added, sizeof *t->added, cmp_added);
    for (int c = 0, j = 0; c <= 256; c++) {
        while ((size_t)j < n_added && (uint8_t)t->added[j].s[0] < c) j++;
        t->added_lo[c] = (uint32_t)j;
    }
    t->added_lo[256] = (uint32_t)n_added;
    for (size_t j = 0; j < n_added; j++) {  // a one-byte token matches whatever follows: all bits of its row
        const uint8_t b0 = (uint8_t)t->added[j].s[0];
        if (t->added[j].len == 1) memset(t->added_2nd[b0], 0xff, sizeof t->added_2nd[b0]);
        else t->added_2nd[b0][(uint8_t)t->added[j].s[1] >> 6] |= 1ull << ((uint8_t)t->added[j].s[1] & 63);
    }
    // eos ids, chat template
    t->n_eos = n_eos;
    t->eos = malloc(4ull * (n_eos ? n_eos : 1));
    t->tmpl = malloc(sz[TOK_SEC_TEMPLATE] + 1);
    if (!t->eos || !t->tmpl) { dj_fail(e, "tokenizer: out of memory"); goto fail; }
    for (uint32_t i = 0; i < n_eos; i++) {
        t->eos[i] = (int32_t)rd32(b + off[TOK_SEC_EOS] + 4ull * i);
        if (t->eos[i] < 0 || t->eos[i] >= t->n_vocab) { dj_fail(e, "tokenizer section: eos id %d out of range", t->eos[i]); goto fail; }
    }
    memcpy(t->tmpl, b + off[TOK_SEC_TEMPLATE], sz[TOK_SEC_TEMPLATE]);
    t->tmpl[sz[TOK_SEC_TEMPLATE]] = 0;
    return t;
fail:
    tok_free(t);
    return NULL;
#undef BAD_ID
}

void tok_free(dj_tokenizer *t) {
    if (!t) return;
    free(t->pool), free(t->piece_off), free(t->attr), free(t->byte_val), free(t->vhash);
    free(t->mkey), free(t->mrank), free(t->mnew), free(t->added), free(t->eos), free(t->tmpl);
    free(t);
}

int32_t tok_vocab_size(const dj_tokenizer *t) { return t->n_vocab; }
int32_t tok_bos(const dj_tokenizer *t) { return t->bos_id; }
int tok_is_eos(const dj_tokenizer *t, int32_t id) {
    for (size_t i = 0; i < t->n_eos; i++)
        if (t->eos[i] == id) return 1;
    return 0;
}
const char *tok_chat_template(const dj_tokenizer *t) { return t->tmpl; }
const int32_t *tok_eos_ids(const dj_tokenizer *t, size_t *n) {
    *n = t->n_eos;
    return t->eos;
}
const char *tok_piece(const dj_tokenizer *t, int32_t id, size_t *len) {
    if (id < 0 || id >= t->n_vocab) return NULL;
    *len = t->piece_off[id + 1] - t->piece_off[id];
    return t->pool + t->piece_off[id];
}

// ---- BPE over one word
typedef struct { int32_t id, prev, next; uint32_t len; } bpe_sym;  // len 0: merged away
typedef struct { uint32_t rank, pos; int32_t new_id; } bpe_merge;
typedef struct {
    const dj_tokenizer *t;
    bpe_sym *sym; size_t nsym, csym;
    bpe_merge *heap; size_t nheap, cheap;
    int32_t *ids; size_t nids, cids;   // the encode output
    tbuf norm;                          // normalized segment
    int oom;
} bpe_ws;

static void *grow(void *p, size_t *cap, size_t need, size_t elem, int *oom) {
    if (need <= *cap) return p;
    size_t c = *cap ? *cap : 64;
    while (c < need) c *= 2;
    void *q = realloc(p, c * elem);
    if (!q) { *oom = 1; return p; }
    *cap = c;
    return q;
}
static void out_id(bpe_ws *w, int32_t id) {
    w->ids = grow(w->ids, &w->cids, w->nids + 1, sizeof *w->ids, &w->oom);
    if (!w->oom) w->ids[w->nids++] = id;
}
static void sym_add(bpe_ws *w, int32_t id, uint32_t len) {
    w->sym = grow(w->sym, &w->csym, w->nsym + 1, sizeof *w->sym, &w->oom);
    if (w->oom) return;
    int32_t i = (int32_t)w->nsym++;
    w->sym[i] = (bpe_sym){id, i - 1, i + 1, len};
}
static int merge_less(const bpe_merge *a, const bpe_merge *b) {
    return a->rank != b->rank ? a->rank < b->rank : a->pos < b->pos;
}
static void heap_push(bpe_ws *w, bpe_merge m) {
    w->heap = grow(w->heap, &w->cheap, w->nheap + 1, sizeof *w->heap, &w->oom);
    if (w->oom) return;
    size_t i = w->nheap++;
    while (i > 0 && merge_less(&m, &w->heap[(i - 1) / 2])) { w->heap[i] = w->heap[(i - 1) / 2]; i = (i - 1) / 2; }
    w->heap[i] = m;
}
static bpe_merge heap_pop(bpe_ws *w) {
    bpe_merge top = w->heap[0], last = w->heap[--w->nheap];
    size_t i = 0, n = w->nheap;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && merge_less(&w->heap[c + 1], &w->heap[c])) c++;
        if (!merge_less(&w->heap[c], &last)) break;
        w->heap[i] = w->heap[c];
        i = c;
    }
    if (n) w->heap[i] = last;
    return top;
}
static void push_pair(bpe_ws *w, int32_t pos) {
    uint32_t rank;
    int32_t nw;
    bpe_sym *s = &w->sym[pos];
    if (s->next >= (int32_t)w->nsym) return;
    if (merge_find(w->t, s->id, w->sym[s->next].id, &rank, &nw)) heap_push(w, (bpe_merge){rank, (uint32_t)pos, nw});
}
// HF Word::merge_all: lowest rank first, leftmost on ties; stale heap entries are recognised and dropped.
static void bpe_merge_all(bpe_ws *w) {
    w->nheap = 0;
    for (size_t i = 0; i + 1 < w->nsym; i++) push_pair(w, (int32_t)i);
    while (w->nheap && !w->oom) {
        bpe_merge m = heap_pop(w);
        bpe_sym *s = &w->sym[m.pos];
        if (s->len == 0 || s->next >= (int32_t)w->nsym) continue;
        bpe_sym *r = &w->sym[s->next];
        uint32_t rank;
        int32_t nw;
        if (!merge_find(w->t, s->id, r->id, &rank, &nw) || nw != m.new_id) continue;
        s->id = nw, s->len += r->len, s->next = r->next;
        r->len = 0;
        if (s->next < (int32_t)w->nsym) w->sym[s->next].prev = (int32_t)m.pos;
        if (s->prev >= 0) push_pair(w, s->prev);
        push_pair(w, (int32_t)m.pos);
    }
    for (size_t i = 0; i < w->nsym; i++)
        if (w->sym[i].len) out_id(w, w->sym[i].id);
}

// One pre-token: initial symbols (HF BPE::merge_word), then merges. SPM units are characters, byte-level units
// are bytes.
static int bpe_word(bpe_ws *w, const uint8_t *s, size_t n, dj_err *e) {
    const dj_tokenizer *t = w->t;
    if (n == 0) return 0;
    if (t->flags & TOK_F_IGNORE_MERGES) {
        int32_t id = vocab_find(t, s, n);
        if (id >= 0) { out_id(w, id); return 0; }
    }
    w->nsym = 0;
    int32_t unk = -1;
    uint32_t unk_len = 0;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        size_t k = t->type == TOK_TYPE_SPM ? u8_dec(s + i, n - i, &cp) : 1;
        int32_t id = k == 1 && t->type == TOK_TYPE_BYTELEVEL ? t->byte_id[s[i]] : vocab_find(t, s + i, k);
        if (id >= 0) {
            if (unk >= 0) sym_add(w, unk, unk_len), unk = -1;
            sym_add(w, id, (uint32_t)k);
        } else {
            int fell_back = 0;
            if (t->flags & TOK_F_BYTE_FALLBACK) {
                fell_back = 1;
                for (size_t j = 0; j < k; j++) fell_back &= t->byte_id[s[i + j]] >= 0;
                if (fell_back)  // HF adds these before a pending unk; kept for exactness
                    for (size_t j = 0; j < k; j++) sym_add(w, t->byte_id[s[i + j]], 1);
            }
            if (!fell_back) {
                if (t->unk_id < 0) return dj_fail(e, "tokenizer: text has a character outside the vocabulary and no unk token");
                if (unk >= 0 && (t->flags & TOK_F_FUSE_UNK)) unk_len += (uint32_t)k;
                else {
                    if (unk >= 0) sym_add(w, unk, unk_len);
                    unk = t->unk_id, unk_len = (uint32_t)k;
                }
            }
        }
        i += k;
    }
    if (unk >= 0) sym_add(w, unk, unk_len);
    if (w->oom) return dj_fail(e, "tokenizer: out of memory");
    if (w->nsym) w->sym[w->nsym - 1].next = (int32_t)w->nsym;
    bpe_merge_all(w);
    return w->oom ? dj_fail(e, "tokenizer: out of memory") : 0;
}

// ---- the Llama 3 split regex, by hand
// (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
// tried alternative by alternative at each position as Oniguruma does; every character is covered, so the
// matches tile the text.
static int uc_class(uint32_t cp) {
    if (cp < 0x80) {
        if ((cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z')) return UC_L;
        if (cp >= '0' && cp <= '9') return UC_N;
        if (cp == ' ' || (cp >= 9 && cp <= 13)) return UC_S;
        return 0;
    }
    size_t lo = 0, hi = UC_N_RANGES;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (cp < uc_ranges[mid].lo) hi = mid;
        else if (cp > uc_ranges[mid].hi) lo = mid + 1;
        else return uc_ranges[mid].cls;
    }
    return 0;
}
static int cls_at(const uint8_t *s, size_t n, size_t i, size_t *k, uint32_t *cp) {
    uint32_t c;
    *k = u8_dec(s + i, n - i, &c);
    if (cp) *cp = c;
    return uc_class(c);
}
static size_t skip_class(const uint8_t *s, size_t n, size_t i, int cls, size_t max) {
    size_t k;
    for (size_t m = 0; i < n && m < max && cls_at(s, n, i, &k, NULL) == cls; m++) i += k;
    return i;
}
static size_t llama3_match(const uint8_t *s, size_t n, size_t i) {
    size_t k0, k;
    uint32_t c0, c;
    if (s[i] == '\'' && i + 1 < n) {
        // (?i): ASCII case, plus U+017F LONG S, whose case fold is 's' (no other character folds to these letters)
        char a = s[i + 1] < 0x80 ? (char)(s[i + 1] | 0x20) : 0, b = i + 2 < n && s[i + 2] < 0x80 ? (char)(s[i + 2] | 0x20) : 0;
        if (a == 's' || a == 't' || a == 'm' || a == 'd') return i + 2;
        if (s[i + 1] == 0xC5 && i + 2 < n && s[i + 2] == 0xBF) return i + 3;
        if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return i + 3;
    }
    int k0cls = cls_at(s, n, i, &k0, &c0);
    if (k0cls == UC_L) return skip_class(s, n, i, UC_L, SIZE_MAX);
    if (k0cls != UC_N && c0 != '\r' && c0 != '\n' && i + k0 < n && cls_at(s, n, i + k0, &k, NULL) == UC_L)
        return skip_class(s, n, i + k0, UC_L, SIZE_MAX);
    if (k0cls == UC_N) return skip_class(s, n, i, UC_N, 3);
    size_t j = i;
    if (c0 == ' ' && i + 1 < n && cls_at(s, n, i + 1, &k, NULL) == 0) j = i + 1;
    if (j > i || k0cls == 0) {
        j = skip_class(s, n, j, 0, SIZE_MAX);
        while (j < n && (s[j] == '\r' || s[j] == '\n')) j++;
        return j;
    }
    // whitespace run [i, j); last_nl: end of its last \r or \n; last: start of its last character
    size_t last_nl = 0, last = i;
    for (j = i; j < n && cls_at(s, n, j, &k, &c) == UC_S; j += k) {
        last = j;
        if (c == '\r' || c == '\n') last_nl = j + 1;
    }
    if (last_nl) return last_nl;  // \s*[\r\n]+
    if (j == n) return j;         // \s+(?!\S) at the end
    if (last > i) return last;    // \s+(?!\S): leave the last space to the next word
    return j;                     // \s+
}

// ---- encode
static const char SPACE_MARK[] = "\xE2\x96\x81";  // "▁"

static int encode_segment(bpe_ws *w, const uint8_t *s, size_t n, int at_start, dj_err *e) {
    const dj_tokenizer *t = w->t;
    if (n == 0) return 0;
    if (t->type == TOK_TYPE_BYTELEVEL) {
        if (t->pretok != TOK_PRE_LLAMA3) return bpe_word(w, s, n, e);
        for (size_t i = 0; i < n;) {
            size_t j = llama3_match(s, n, i);
            if (bpe_word(w, s + i, j - i, e)) return -1;
            i = j;
        }
        return 0;
    }
    tbuf *b = &w->norm;
    b->n = 0;
    int replace = (t->flags & TOK_F_NORM_REPLACE) || t->pretok == TOK_PRE_METASPACE;
    if (n > (SIZE_MAX - 8) / 3 || tb_reserve(b, 3 * n + 3)) return dj_fail(e, "tokenizer: out of memory");
    if (t->flags & TOK_F_NORM_PREPEND) memcpy(b->p, SPACE_MARK, 3), b->n = 3;
    for (size_t i = 0; i < n; i++) {
        if (replace && s[i] == ' ') memcpy(b->p + b->n, SPACE_MARK, 3), b->n += 3;
        else b->p[b->n++] = (char)s[i];
    }
    const uint8_t *p = (const uint8_t *)b->p;
    size_t m = b->n;
    if (t->pretok == TOK_PRE_METASPACE) {
        int starts = m >= 3 && memcmp(p, SPACE_MARK, 3) == 0;
        if (!starts && (t->prepend_scheme == TOK_PREPEND_ALWAYS || (t->prepend_scheme == TOK_PREPEND_FIRST && at_start))) {
            if (tb_reserve(b, 3)) return dj_fail(e, "tokenizer: out of memory");
            memmove(b->p + 3, b->p, b->n);
            memcpy(b->p, SPACE_MARK, 3);
            b->n += 3;
            p = (const uint8_t *)b->p, m = b->n;
        }
        if (t->flags & TOK_F_METASPACE_SPLIT) {  // split before every "▁" (MergedWithNext)
            size_t start = 0;
            for (size_t i = 1; i + 3 <= m; i++)
                if (memcmp(p + i, SPACE_MARK, 3) == 0) {
                    if (bpe_word(w, p + start, i - start, e)) return -1;
                    start = i;
                }
            return bpe_word(w, p + start, m - start, e);
        }
    }
    if (!t->split_at_mark) return bpe_word(w, p, m, e);
    size_t start = 0;
    for (size_t i = 1; i + 3 <= m; i++)
        if (memcmp(p + i, SPACE_MARK, 3) == 0 && (i < 3 || memcmp(p + i - 3, SPACE_MARK, 3) != 0)) {
            if (bpe_word(w, p + start, i - start, e)) return -1;
            start = i;
        }
    return bpe_word(w, p + start, m - start, e);
}

int tok_encode(const dj_tokenizer *t, const char *text, size_t len, int add_special, int32_t **ids, size_t *n_ids,
               dj_err *e) {
    const uint8_t *s = (const uint8_t *)text;
    *ids = NULL, *n_ids = 0;
    for (size_t i = 0; i < len;) {
        int ok;
        size_t k = u8_next(s + i, len - i, &ok);
        if (ok != 1) return dj_fail(e, "tokenizer: the text is not valid UTF-8 (bad byte 0x%02x at offset %zu)", s[i], i);
        i += k;
    }
    bpe_ws w = {.t = t};
    int rc = 0;
    if (add_special && (t->flags & TOK_F_ADD_BOS)) out_id(&w, t->bos_id);
    size_t seg = 0;
    for (size_t i = 0; i < len && rc == 0;) {
        const struct tok_added *hit = NULL;
        // Two bytes rule out most positions at once (1 MB of '<' against Llama 3's 256 "<|...|>" tokens).
        if (i + 1 < len && !(t->added_2nd[s[i]][s[i + 1] >> 6] >> (s[i + 1] & 63) & 1)) {
            i++;
            continue;
        }
        for (uint32_t a = t->added_lo[s[i]]; a < t->added_lo[s[i] + 1]; a++) {
            const struct tok_added *x = &t->added[a];
            if (x->len <= len - i && memcmp(s + i, x->s, x->len) == 0) { hit = x; break; }
        }
        if (!hit) { i++; continue; }
        rc = encode_segment(&w, s + seg, i - seg, seg == 0, e);
        out_id(&w, hit->id);
        i += hit->len, seg = i;
    }
    if (rc == 0) rc = encode_segment(&w, s + seg, len - seg, seg == 0, e);
    if (rc == 0 && add_special && (t->flags & TOK_F_ADD_EOS)) out_id(&w, t->eos_append_id);
    if (rc == 0 && w.oom) rc = dj_fail(e, "tokenizer: out of memory");
    free(w.sym), free(w.heap), free(w.norm.p);
    if (rc) { free(w.ids); return -1; }
    *ids = w.ids ? w.ids : malloc(sizeof(int32_t));
    *n_ids = w.nids;
    return *ids ? 0 : dj_fail(e, "tokenizer: out of memory");
}

// ---- decode
// SPM: Replace("▁", " ") then ByteFallback per token: a run of <0xNN> pieces becomes its bytes when they are valid
// UTF-8 as a whole, else one U+FFFD per byte (HF's rule, not from_utf8_lossy). Then Fuse and Strip at the start.
struct dj_tok_stream {
    const dj_tokenizer *t;
    tbuf pend;            // SPM: the current run of fallback bytes; byte-level: bytes not yet a whole character
    tbuf out;             // the text returned by the last push/flush
    uint32_t strip_left;  // leading spaces still to strip (SPM)
};

static int decodable(const dj_tokenizer *t, int32_t id) {
    return id >= 0 && id < t->n_vocab && (t->attr[id] & TOK_A_EXISTS) && !(t->attr[id] & TOK_A_SPECIAL);
}
static int flush_run(tbuf *out, tbuf *run) {
    int rc = 0;
    if (u8_valid((const uint8_t *)run->p, run->n)) rc = run->n ? tb_put(out, run->p, run->n) : 0;
    else
        for (size_t i = 0; i < run->n && !rc; i++) rc = tb_put(out, "\xEF\xBF\xBD", 3);
    run->n = 0;
    return rc;
}
static int put_spm_piece(tbuf *out, const char *p, size_t len) {
    for (size_t i = 0; i < len;) {
        if (i + 3 <= len && memcmp(p + i, SPACE_MARK, 3) == 0) {
            if (tb_put(out, " ", 1)) return -1;
            i += 3;
        } else {
            size_t j = i + 1;
            while (j < len && (uint8_t)p[j] != 0xE2) j++;
            if (tb_put(out, p + i, j - i)) return -1;
            i = j;
        }
    }
    return 0;
}
// Appends the text one id makes final; SPM strips leading spaces from [from, out->n) while strip_left lasts.
static int stream_step(dj_tok_stream *st, int32_t id, int final) {
    const dj_tokenizer *t = st->t;
    tbuf *out = &st->out;
    size_t from = out->n;
    int rc = 0;
    if (t->type == TOK_TYPE_BYTELEVEL) {
        if (!final) {
            size_t len = 0;
            const char *p = tok_piece(t, id, &len);
            if (tb_put(&st->pend, p, len)) return -1;
        }
        size_t used = u8_lossy(out, (const uint8_t *)st->pend.p, st->pend.n, final);
        if (used == SIZE_MAX) return -1;
        if (used) memmove(st->pend.p, st->pend.p + used, st->pend.n - used);
        st->pend.n -= used;
        return 0;
    }
    if (!final && t->byte_val[id] >= 0) {
        uint8_t c = (uint8_t)t->byte_val[id];
        return tb_put(&st->pend, &c, 1);
    }
    rc = flush_run(out, &st->pend);
    if (!final && !rc) {
        size_t len = 0;
        const char *p = tok_piece(t, id, &len);
        rc = put_spm_piece(out, p, len);
    }
    if (rc) return -1;
    size_t k = from;
    while (st->strip_left && k < out->n) {
        if (out->p[k] != ' ') { st->strip_left = 0; break; }
        k++, st->strip_left--;
    }
    if (k > from) memmove(out->p + from, out->p + k, out->n - k);
    out->n -= k - from;
    if (out->p) out->p[out->n] = 0;
    return 0;
}

dj_tok_stream *tok_stream_new(const dj_tokenizer *t) {
    dj_tok_stream *s = calloc(1, sizeof *s);
    if (s) s->t = t, s->strip_left = t->strip_start;
    return s;
}
void tok_stream_free(dj_tok_stream *s) {
    if (!s) return;
    free(s->pend.p), free(s->out.p), free(s);
}
const char *tok_stream_push(dj_tok_stream *s, int32_t id, size_t *len) {
    s->out.n = 0;
    if (decodable(s->t, id) && stream_step(s, id, 0)) s->out.n = 0;  // out of memory: drop the text
    *len = s->out.n;
    return s->out.p ? s->out.p : "";
}
const char *tok_stream_flush(dj_tok_stream *s, size_t *len) {
    s->out.n = 0;
    if (stream_step(s, -1, 1)) s->out.n = 0;
    *len = s->out.n;
    return s->out.p ? s->out.p : "";
}

char *tok_decode(const dj_tokenizer *t, const int32_t *ids, size_t n, size_t *len) {
    dj_tok_stream st = {.t = t, .strip_left = t->strip_start};
    tbuf all = {0};
    int rc = 0;
    for (size_t i = 0; i < n && !rc; i++) {
        if (!decodable(t, ids[i])) continue;
        st.out.n = 0;
        rc = stream_step(&st, ids[i], 0) || (st.out.n && tb_put(&all, st.out.p, st.out.n));
    }
    st.out.n = 0;
    if (!rc) rc = stream_step(&st, -1, 1) || (st.out.n && tb_put(&all, st.out.p, st.out.n));
    free(st.pend.p), free(st.out.p);
    if (rc || tb_reserve(&all, 0)) {
        free(all.p);
        return NULL;
    }
    all.p[all.n] = 0;
    if (len) *len = all.n;
    return all.p;
}
