// test_session.c: session files (session.c) read back by session_open, directly: a file saved from the CPU engine on
// stories260K, then loaded into another model of the same size and shape (refused by its fingerprint), into models
// that differ in one header field each, and edited in one count at a time with its header checksum made right, so
// that each check of the counts answers alone (at its limit taken, past it refused).
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../engine.h"
#include "../session.h"
#include "common.h"

#define TS_CTX 64

// Header offsets (session.h's layout).
enum { TS_FSIZE = 16, TS_HCRC = 24, TS_CTXO = 64, TS_NTOK = 72, TS_NPROMPT = 80, TS_NKV = 88, TS_NEXT = 96,
       TS_KVTYPE = 100, TS_RNG = 104, TS_TOKOFF = 176, TS_KVOFF = 184, TS_KVBYTES = 192 };

static const int32_t ts_ids[] = {1, 403, 39, 261, 378, 7, 90};
#define TS_N ((int64_t)(sizeof ts_ids / sizeof *ts_ids))

typedef struct {
    char *dir, model[4200], path[4200], bad[4200];
    dj_model m;
    uint8_t *file;  // the saved session
    size_t size;
    uint64_t pos_bytes;
} ts_ctx;

// stories260K in f32, its first TS_N tokens run on the CPU engine, saved with the pick after them.
static void ts_setup(ts_ctx *c) {
    memset(c, 0, sizeof *c);
    c->dir = tc_tmpdir("session");
    tc_stories_model(c->dir, "a.bin", DJ_F32, &c->m, c->model, sizeof c->model);
    snprintf(c->path, sizeof c->path, "%s/a.ses", c->dir);
    snprintf(c->bad, sizeof c->bad, "%s/bad.ses", c->dir);
    dj_engine eng = {0};
    dj_gpu_opts go = {.max_seq = TS_CTX, .quiet = 1};
    dj_err e = {{0}};
    cr_assert_eq(engine_open(&eng, &c->m, &go, 1, &e), 0, "%s", e.msg);
    const uint32_t vocab = c->m.info.config.vocab_size;
    dj_sampler *smp = sampler_new(vocab, 0, 1.0, 1, &e);
    float *logits = malloc(vocab * sizeof *logits);
    int32_t next;
    cr_assert_eq(engine_next(&eng, smp, 0, ts_ids, TS_N, 0, logits, &next, &e), 0, "%s", e.msg);
    cr_assert_geq(next, 0);
    dj_session s = {.ids = (int32_t *)ts_ids, .n_tokens = TS_N, .n_prompt = TS_N, .n_kv = TS_N, .next = next,
                    .rng = sampler_rng_state(smp), .smp = DJ_SAMPLING_DEFAULT, .ctx = TS_CTX};
    dj_out out = {0};
    cr_assert_eq(out_open(&out, c->path, "--save-session", NULL, 0, &e), 0, "%s", e.msg);
    cr_assert_eq(session_save(&out, &c->m, &eng, 0, &s, &e), 0, "%s", e.msg);
    free(logits), sampler_free(smp), engine_close(&eng);
    c->file = (uint8_t *)tc_must_read(c->path, &c->size);
    c->pos_bytes = engine_kv_pos_bytes(&c->m.info.config, DJ_KV_F32);
    cr_assert_eq(c->size, SESSION_HEADER + 4 * TS_N + TS_N * c->pos_bytes);
}

static void ts_teardown(ts_ctx *c) {
    model_free(&c->m);
    free(c->file);
    tc_rm_rf(c->dir);
    free(c->dir);
}

// session_open of `path` into m at context ctx: 0, or -1 with the message in msg.
static int ts_open(const char *path, const dj_model *m, int64_t ctx, char *msg, size_t n) {
    dj_session s;
    dj_err e = {{0}};
    int rc = session_open(&s, path, m, "the model", ctx, &e);
    if (!rc) session_close(&s);
    snprintf(msg, n, "%s", e.msg);
    if (rc) cr_assert(e.msg[0] && !strchr(e.msg, '\n'), "message '%s'", e.msg);
    return rc;
}

static void ts_put64(uint8_t *h, int at, uint64_t v) { memcpy(h + at, &v, 8); }
static uint64_t ts_get64(const uint8_t *h, int at) {
    uint64_t v;
    memcpy(&v, h + at, 8);
    return v;
}

// ---- another model
// A copy of the model with the float at byte `at` changed, of the same file size and shape: a session saved with the
// model is refused by it (its fingerprint differs).
static void ts_refused_by_a_copy_changed_at(ts_ctx *c, uint64_t at) {
    char msg[600], other[4300];
    size_t n;
    uint8_t *b = (uint8_t *)tc_must_read(c->model, &n);
    cr_assert(at + 4 <= n);
    float v;
    memcpy(&v, b + at, 4);
    v += 0.25f;
    memcpy(b + at, &v, 4);
    snprintf(other, sizeof other, "%s/b.bin", c->dir);
    tc_write(other, b, n);
    free(b);
    dj_model mb;
    dj_load_opts lo = {.quiet = 1};
    dj_err e = {{0}};
    cr_assert_eq(model_load(other, &lo, &mb, &e), 0, "%s", e.msg);
    cr_assert_eq(mb.info.file_size, c->m.info.file_size);
    cr_assert_eq(memcmp(&mb.info.config, &c->m.info.config, sizeof mb.info.config), 0);
    cr_assert_eq(ts_open(c->path, &mb, TS_CTX, msg, sizeof msg), -1, "loaded into a model changed at byte %llu",
                 (unsigned long long)at);
    cr_assert(strstr(msg, "was saved with another model"), "%s", msg);
    model_free(&mb);
}

// A model of the same file size and shape whose weights differ is another model: a value at the start of its
// embeddings, and one in the middle of its last layer (past the first 4 KB of every section: the fingerprint reads
// each section at its start and at its middle).
Test(session, another_model_of_the_same_size) {
    ts_ctx c;
    ts_setup(&c);
    char msg[600];
    cr_assert_eq(ts_open(c.path, &c.m, TS_CTX, msg, sizeof msg), 0, "its own model: %s", msg);
    ts_refused_by_a_copy_changed_at(&c, c.m.info.embed_off);
    const dj_model_info *in = &c.m.info;
    uint64_t mid = in->layer_off[in->config.n_layers - 1] + in->layer.size / 2;
    cr_assert_gt(in->layer.size / 2, 4096, "the layer is too small for its middle to lie past its first 4 KB");
    ts_refused_by_a_copy_changed_at(&c, mid / 4 * 4);
    ts_teardown(&c);
}

// Each field of the model the header records, alone: the model.bin's size, and the shape (a copy of the model's
// description with one field changed; its bytes are the same).
Test(session, another_model_in_one_field) {
    ts_ctx c;
    ts_setup(&c);
    char msg[600];
    for (int k = 0; k < 6; k++) {
        dj_model x = c.m;
        dj_config *cf = &x.info.config;
        switch (k) {
        case 0: x.info.file_size += 4096; break;
        case 1: cf->n_layers -= 1; break;
        case 2: cf->dim += 2; break;
        case 3: cf->n_kv_heads ^= 1; break;
        case 4: cf->head_dim += 2; break;
        case 5: cf->vocab_size += 1; break;
        }
        cr_assert_eq(ts_open(c.path, &x, TS_CTX, msg, sizeof msg), -1, "field %d changed: accepted", k);
        cr_assert(strstr(msg, "was saved with another model"), "field %d: %s", k, msg);
    }
    ts_teardown(&c);
}

// ---- the counts
// The saved file with header edits, `extra` bytes more or fewer (the KV cache's end), its size and checksum made
// right; session_open's answer.
typedef void (*ts_edit_fn)(uint8_t *h, int64_t n, uint64_t pos_bytes, int64_t *extra);

static int ts_edited(ts_ctx *c, ts_edit_fn edit, int64_t ctx, char *msg, size_t n) {
    int64_t extra = 0;
    uint8_t *b = malloc(c->size + 8 * c->pos_bytes);
    memcpy(b, c->file, c->size);
    edit(b, TS_N, c->pos_bytes, &extra);
    size_t len = (size_t)((int64_t)c->size + extra);
    if (extra > 0) memset(b + c->size, 0, (size_t)extra);
    ts_put64(b, TS_FSIZE, len);
    uint32_t zero = 0, crc;
    memcpy(b + TS_HCRC, &zero, 4);
    crc = dj_crc32(0, b, SESSION_HEADER);
    memcpy(b + TS_HCRC, &crc, 4);
    tc_write(c->bad, b, len);
    free(b);
    return ts_open(c->bad, &c->m, ctx, msg, n);
}

static void ts_set_next(uint8_t *h, int32_t next) { memcpy(h + TS_NEXT, &next, 4); }
// n_kv positions cached, the KV bytes and the file's length to match, the pick dropped (next -1)
static void ts_cached(uint8_t *h, int64_t n_kv, int64_t n, uint64_t pb, int64_t *extra) {
    ts_put64(h, TS_NKV, (uint64_t)n_kv), ts_put64(h, TS_KVBYTES, (uint64_t)n_kv * pb);
    ts_set_next(h, -1);
    *extra = (n_kv - n) * (int64_t)pb;
}

static void e_none(uint8_t *h, int64_t n, uint64_t pb, int64_t *x) {}
static void e_kv_over(uint8_t *h, int64_t n, uint64_t pb, int64_t *x) { ts_cached(h, n + 1, n, pb, x); }
static void e_kv_all(uint8_t *h, int64_t n, uint64_t pb, int64_t *x) { ts_cached(h, n, n, pb, x); }
static void e_kv_one_short(uint8_t *h, int64_t n, uint64_t pb, int64_t *x) { ts_cached(h, n - 1, n, pb, x); }
static void e_kv_two_short(uint8_t *h, int64_t n, uint64_t pb, int64_t *x) { ts_cached(h, n - 2, n, pb, x); }
static void e_next_one_short(uint8_t *h, int64_t n, uint64_t pb, int64_t *x) {
    e_kv_one_short(h, n, pb, x);
    ts_set_next(h, 5);  // a pick needs every token cached
}
static void e_next_vocab(uint8_t *h, int64_t n, uint64_t pb, int64_t *x) { ts_set_next(h, 512); }
static void e_next_last(uint8_t *h, int64_t n, uint64_t pb, int64_t *x) { ts_set_next(h, 511); }
static void e_next_minus2(uint8_t *h, int64_t n, uint64_t pb, int64_t *x) { ts_set_next(h, -2); }
static void e_prompt_over(uint8_t *h, int64_t n, uint64_t pb, int64_t *x) { ts_put64(h, TS_NPROMPT, (uint64_t)n + 1); }
static void e_prompt_1(uint8_t *h, int64_t n, uint64_t pb, int64_t *x) { ts_put64(h, TS_NPROMPT, 1); }
static void e_prompt_0(uint8_t *h, int64_t n, uint64_t pb, int64_t *x) { ts_put64(h, TS_NPROMPT, 0); }
static void e_rng_0(uint8_t *h, int64_t n, uint64_t pb, int64_t *x) { ts_put64(h, TS_RNG, 0); }
static void e_tokoff(uint8_t *h, int64_t n, uint64_t pb, int64_t *x) { ts_put64(h, TS_TOKOFF, SESSION_HEADER + 4); }
static void e_kvoff(uint8_t *h, int64_t n, uint64_t pb, int64_t *x) { ts_put64(h, TS_KVOFF, ts_get64(h, TS_KVOFF) + 4); }
static void e_kvbytes(uint8_t *h, int64_t n, uint64_t pb, int64_t *x) {
    ts_put64(h, TS_KVBYTES, ts_get64(h, TS_KVBYTES) + 4);
    *x = 4;  // the file as long as the header's KV end: only the KV count disagrees
}
static void e_tail(uint8_t *h, int64_t n, uint64_t pb, int64_t *x) { *x = 4; }  // 4 bytes past the KV cache
static void e_ctx_n(uint8_t *h, int64_t n, uint64_t pb, int64_t *x) { ts_put64(h, TS_CTXO, (uint64_t)n); }
static void e_ctx_under(uint8_t *h, int64_t n, uint64_t pb, int64_t *x) { ts_put64(h, TS_CTXO, (uint64_t)n - 1); }
static void ts_set_kv(uint8_t *h, uint32_t kv) { memcpy(h + TS_KVTYPE, &kv, 4); }
static void e_kv_unknown(uint8_t *h, int64_t n, uint64_t pb, int64_t *x) { ts_set_kv(h, DJ_KV_TYPES); }
static void e_kv_f16_named(uint8_t *h, int64_t n, uint64_t pb, int64_t *x) { ts_set_kv(h, DJ_KV_F16); }
static void e_kv_f16_bytes(uint8_t *h, int64_t n, uint64_t pb, int64_t *x) {  // f16: half of f32's bytes
    ts_set_kv(h, DJ_KV_F16);
    ts_put64(h, TS_KVBYTES, (uint64_t)n * pb / 2);
    *x = -n * (int64_t)pb / 2;
}

Test(session, each_count_at_its_limit) {
    ts_ctx c;
    ts_setup(&c);
    cr_assert_eq(c.m.info.config.vocab_size, 512, "the cases below name stories260K's vocabulary");
    static const struct {
        const char *what;
        ts_edit_fn edit;
        int64_t ctx;        // the run's context (0: TS_CTX)
        const char *needle; // NULL: taken
    } cases[] = {
        {"as saved (its checksum remade)", e_none, 0, NULL},
        {"more positions cached than tokens", e_kv_over, 0, "counts do not agree"},
        {"every token cached, no pick", e_kv_all, 0, NULL},
        {"all but the last token cached", e_kv_one_short, 0, NULL},
        {"two tokens not cached", e_kv_two_short, 0, "counts do not agree"},
        {"a pick with a token not cached", e_next_one_short, 0, "counts do not agree"},
        {"a pick of the vocabulary's size", e_next_vocab, 0, "counts do not agree"},
        {"a pick of the vocabulary's last id", e_next_last, 0, NULL},
        {"a pick of -2", e_next_minus2, 0, "counts do not agree"},
        {"a prompt longer than the tokens", e_prompt_over, 0, "counts do not agree"},
        {"a prompt of 1 token", e_prompt_1, 0, NULL},
        {"a prompt of 0 tokens", e_prompt_0, 0, "counts do not agree"},
        {"the generator's fixed point", e_rng_0, 0, "counts do not agree"},
        {"the tokens elsewhere", e_tokoff, 0, "counts do not agree"},
        {"the KV cache elsewhere", e_kvoff, 0, "counts do not agree"},
        {"a KV cache of other bytes", e_kvbytes, 0, "counts do not agree"},
        {"bytes after the KV cache", e_tail, 0, "counts do not agree"},
        {"as many tokens as the context", e_ctx_n, TS_N, NULL},
        {"more tokens than the context", e_ctx_under, TS_N - 1, "counts do not agree"},
        {"a KV type past the last", e_kv_unknown, 0, "holds a KV cache of type 3, which this djinn does not know"},
        {"f16 named over f32's bytes", e_kv_f16_named, 0, "counts do not agree"},
        {"f16 named over f16's bytes", e_kv_f16_bytes, 0, NULL},
    };
    char msg[600];
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        int rc = ts_edited(&c, cases[k].edit, cases[k].ctx ? cases[k].ctx : TS_CTX, msg, sizeof msg);
        if (!cases[k].needle) {
            cr_assert_eq(rc, 0, "%s: refused: %s", cases[k].what, msg);
        } else {
            cr_assert_eq(rc, -1, "%s: accepted", cases[k].what);
            cr_assert(strstr(msg, cases[k].needle), "%s: '%s' lacks '%s'", cases[k].what, msg, cases[k].needle);
        }
    }
    // a token outside the vocabulary (the tokens are not in the header's checksum)
    uint8_t *b = malloc(c.size);
    memcpy(b, c.file, c.size);
    const int32_t big = 512;
    memcpy(b + SESSION_HEADER + 4 * 3, &big, 4);
    tc_write(c.bad, b, c.size);
    cr_assert_eq(ts_open(c.bad, &c.m, TS_CTX, msg, sizeof msg), -1);
    cr_assert(strstr(msg, "token 3 is 512, outside the vocabulary"), "%s", msg);
    free(b);
    ts_teardown(&c);
}

// ---- the KV types (kvtype.h)
#define TS_GEN 24
#define TS_AT 5

// The file's KV cache replaced by a fresh engine of KV type kv resuming it: *eng closed and opened anew,
// session_resume's pick in *next and (when it fed a token) its logits in row.
static void ts_resume(ts_ctx *c, dj_engine *eng, int kv, dj_sampler *smp, float *row, int32_t *next) {
    engine_close(eng);
    dj_gpu_opts go = {.max_seq = TS_CTX, .quiet = 1, .kv_type = kv};
    dj_err e = {{0}};
    cr_assert_eq(engine_open(eng, &c->m, &go, 1, &e), 0, "%s", e.msg);
    dj_session s;
    cr_assert_eq(session_open(&s, c->path, &c->m, "the model", TS_CTX, &e), 0, "%s", e.msg);
    cr_assert_eq(s.kv_type, kv);
    cr_assert_eq(session_resume(&s, eng, 0, smp, row, next, &e), 0, "%s", e.msg);
    session_close(&s);
}

// stories260K's greedy continuation of ts_ids on a CPU engine of KV type kv: gen (TS_GEN) the tokens picked, lg
// (TS_GEN, vocab) the logits each was picked from. save: the run is saved to c->path after TS_AT picks (cut: its
// last pick among the tokens, not fed yet, else held as the next token) and goes on in a fresh engine resuming it.
static void ts_greedy(ts_ctx *c, int kv, int save, int cut, int32_t *gen, float *lg) {
    const int64_t V = c->m.info.config.vocab_size;
    dj_engine eng = {0};
    dj_gpu_opts go = {.max_seq = TS_CTX, .quiet = 1, .kv_type = kv};
    dj_err e = {{0}};
    cr_assert_eq(engine_open(&eng, &c->m, &go, 1, &e), 0, "%s", e.msg);
    dj_sampler *smp = sampler_new(V, 0, 1.0, 1, &e);
    int32_t ids[TS_N + TS_GEN], next;
    memcpy(ids, ts_ids, sizeof ts_ids);
    cr_assert_eq(engine_next(&eng, smp, 0, ids, TS_N, 0, lg, &next, &e), 0, "%s", e.msg);
    for (int g = 0; g < TS_GEN - 1; g++) {  // at g: the prompt and gen[0..g-1] fed, gen[g] picked
        gen[g] = ids[TS_N + g] = next;
        float *row = lg + (g + 1) * V;
        if (save && g == TS_AT) {
            dj_session s = {.ids = ids, .n_tokens = TS_N + g + cut, .n_prompt = TS_N, .n_kv = TS_N + g,
                            .next = cut ? -1 : next, .rng = sampler_rng_state(smp), .smp = DJ_SAMPLING_DEFAULT,
                            .ctx = TS_CTX};
            dj_out out = {0};
            cr_assert_eq(out_open(&out, c->path, "--save-session", NULL, 0, &e), 0, "%s", e.msg);
            cr_assert_eq(session_save(&out, &c->m, &eng, 0, &s, &e), 0, "%s", e.msg);
            ts_resume(c, &eng, kv, smp, row, &next);
            if (cut) continue;  // the resume fed gen[g] and picked the next
            cr_assert_eq(next, gen[g], "the pick held in the file");
        }
        cr_assert_eq(engine_next(&eng, smp, 0, &gen[g], 1, TS_N + g, row, &next, &e), 0, "%s", e.msg);
    }
    gen[TS_GEN - 1] = next;
    sampler_free(smp);
    engine_close(&eng);
}

// At each KV type: a greedy run saved and resumed (its last pick fed or held) is the uninterrupted run, bitwise in
// every logit; the file records the type and holds n_kv positions of that type's bytes.
Test(session, resume_at_each_kv_type) {
    ts_ctx c;
    ts_setup(&c);
    const int64_t V = c.m.info.config.vocab_size;
    int32_t want[TS_GEN], got[TS_GEN];
    float *lw = malloc((size_t)(TS_GEN * V) * sizeof(float)), *lg = malloc((size_t)(TS_GEN * V) * sizeof(float));
    for (int kv = 0; kv < DJ_KV_TYPES; kv++) {
        ts_greedy(&c, kv, 0, 0, want, lw);
        for (int cut = 0; cut < 2; cut++) {
            ts_greedy(&c, kv, 1, cut, got, lg);
            for (int g = 0; g < TS_GEN; g++)
                cr_assert_eq(got[g], want[g], "%s KV, cut %d: token %d is %d, uninterrupted %d", dj_kv_name(kv), cut,
                             g, got[g], want[g]);
            cr_assert_eq(memcmp(lg, lw, (size_t)(TS_GEN * V) * sizeof(float)), 0,
                         "%s KV, cut %d: the resumed run's logits differ from the uninterrupted run's", dj_kv_name(kv),
                         cut);
            size_t n;
            uint8_t *f = (uint8_t *)tc_must_read(c.path, &n);
            uint32_t type;
            memcpy(&type, f + TS_KVTYPE, 4);
            cr_assert_eq(type, (uint32_t)kv, "%s KV: the header says %u", dj_kv_name(kv), type);
            cr_assert_eq(n, SESSION_HEADER + 4 * (TS_N + TS_AT + cut) +
                                (TS_N + TS_AT) * engine_kv_pos_bytes(&c.m.info.config, kv),
                         "%s KV: a file of %zu bytes", dj_kv_name(kv), n);
            free(f);
        }
    }
    free(lw), free(lg);
    ts_teardown(&c);
}

// A file resumed into an engine of another KV type is refused, naming both and the flag to give, the engine's slot
// untouched; a file of the layout before the types (0 where the type is: ts_setup's f32 file) reads as f32.
Test(session, another_kv_type_refused_by_name) {
    ts_ctx c;
    ts_setup(&c);
    uint32_t zero;
    memcpy(&zero, c.file + TS_KVTYPE, 4);
    cr_assert_eq(zero, 0, "an f32 session's type field is not the old layout's zero");
    const int64_t V = c.m.info.config.vocab_size;
    int32_t gen[TS_GEN];
    float *lg = malloc((size_t)(TS_GEN * V) * sizeof(float));
    for (int saved = 0; saved < DJ_KV_TYPES; saved++) {
        if (saved) ts_greedy(&c, saved, 1, 1, gen, lg);  // c.path: a file of that type
        for (int kv = 0; kv < DJ_KV_TYPES; kv++) {
            dj_engine eng;
            dj_gpu_opts go = {.max_seq = TS_CTX, .quiet = 1, .kv_type = kv};
            dj_err e = {{0}};
            cr_assert_eq(engine_open(&eng, &c.m, &go, 1, &e), 0, "%s", e.msg);
            dj_session s;
            cr_assert_eq(session_open(&s, c.path, &c.m, "the model", TS_CTX, &e), 0, "%s", e.msg);
            cr_assert_eq(s.kv_type, saved);
            dj_sampler *smp = sampler_new(V, 0, 1.0, 1, &e);
            int32_t next = -7;
            int rc = session_resume(&s, &eng, 0, smp, lg, &next, &e);
            if (kv == saved) {
                cr_assert_eq(rc, 0, "%s into %s: %s", dj_kv_name(saved), dj_kv_name(kv), e.msg);
            } else {
                char want[4400];
                snprintf(want, sizeof want, "%s holds its KV cache in %s; this run's is in %s: give --kv-type %s",
                         c.path, dj_kv_name(saved), dj_kv_name(kv), dj_kv_name(saved));
                cr_assert_eq(rc, -1, "%s resumed into %s", dj_kv_name(saved), dj_kv_name(kv));
                cr_assert_str_eq(e.msg, want);
                cr_assert_eq(next, -7, "a refused resume picked a token");
            }
            sampler_free(smp);
            session_close(&s);
            engine_close(&eng);
        }
    }
    free(lg);
    ts_teardown(&c);
}
