// session.c: session files (session.h): the header, the model's identity in it, saving a slot's KV cache through the
// engine's parking, and reading one back with every refusal named.
#include "session.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

// ---- the header
// Byte offsets in the header.
enum {
    H_VERSION = 8, H_HSIZE = 12, H_FSIZE = 16, H_HCRC = 24, H_DCRC = 28, H_MBYTES = 32, H_MID = 40, H_LAYERS = 44,
    H_DIM = 48, H_KVH = 52, H_HD = 56, H_VOCAB = 60, H_CTX = 64, H_NTOK = 72, H_NPROMPT = 80, H_NKV = 88, H_NEXT = 96,
    H_KVTYPE = 100, H_RNG = 104, H_SMP = 112, H_TOKOFF = 176, H_KVOFF = 184, H_KVBYTES = 192
};

static void put32(uint8_t *h, int at, uint32_t v) { memcpy(h + at, &v, 4); }
static void put64(uint8_t *h, int at, uint64_t v) { memcpy(h + at, &v, 8); }
static uint32_t get32(const uint8_t *h, int at) {
    uint32_t v;
    memcpy(&v, h + at, 4);
    return v;
}
static uint64_t get64(const uint8_t *h, int at) {
    uint64_t v;
    memcpy(&v, h + at, 8);
    return v;
}

// The settings as 8 values of 8 bytes.
static void put_smp(uint8_t *h, const dj_sampling *p) {
    const double d[] = {p->temp, p->top_p, p->min_p};
    const double f[] = {p->repeat_penalty, p->presence_penalty, p->frequency_penalty};
    memcpy(h + H_SMP, d, 24);
    put64(h, H_SMP + 24, (uint64_t)p->top_k);
    memcpy(h + H_SMP + 32, f, 24);
    put64(h, H_SMP + 56, (uint64_t)p->repeat_last_n);
}
static void get_smp(const uint8_t *h, dj_sampling *p) {
    double d[3], f[3];
    memcpy(d, h + H_SMP, 24);
    memcpy(f, h + H_SMP + 32, 24);
    *p = (dj_sampling){.temp = d[0], .top_p = d[1], .min_p = d[2], .top_k = (int64_t)get64(h, H_SMP + 24),
                       .repeat_penalty = f[0], .presence_penalty = f[1], .frequency_penalty = f[2],
                       .repeat_last_n = (int64_t)get64(h, H_SMP + 56)};
}

static uint32_t header_crc(uint8_t h[SESSION_HEADER]) {
    uint32_t keep = get32(h, H_HCRC);
    put32(h, H_HCRC, 0);
    uint32_t crc = dj_crc32(0, h, SESSION_HEADER);
    put32(h, H_HCRC, keep);
    return crc;
}

// ---- the model's identity
static void model_fields(uint8_t *h, const dj_model *m) {
    const dj_config *c = &m->info.config;
    put64(h, H_MBYTES, m->info.file_size), put32(h, H_MID, model_fingerprint(m));
    put32(h, H_LAYERS, c->n_layers), put32(h, H_DIM, c->dim), put32(h, H_KVH, c->n_kv_heads);
    put32(h, H_HD, c->head_dim), put32(h, H_VOCAB, c->vocab_size);
}

// ---- saving
int session_save(dj_out *out, const dj_model *m, dj_engine *eng, int32_t slot, const dj_session *s, dj_err *e) {
    const uint64_t kv_bytes = (uint64_t)s->n_kv * engine_kv_pos_bytes(&m->info.config, eng->kv_type),
                   tok_bytes = (uint64_t)s->n_tokens * 4;
    if (s->n_kv < 0 || s->n_kv > s->n_tokens || s->n_tokens > s->ctx)
        return dj_fail(e, "internal error: a session of %" PRId64 " tokens, %" PRId64 " cached, context %" PRId64,
                       s->n_tokens, s->n_kv, s->ctx);
    dj_parked *p = eng->park(eng->ctx, slot, s->n_kv, e);
    if (!p) return -1;
    int rc = -1;
    const uint8_t *kv = eng->parked_kv(eng->ctx, p, e);
    if (!kv) goto out;
    uint8_t h[SESSION_HEADER] = {0};
    memcpy(h, SESSION_MAGIC, 8);
    put32(h, H_VERSION, SESSION_VERSION), put32(h, H_HSIZE, SESSION_HEADER);
    put64(h, H_FSIZE, SESSION_HEADER + tok_bytes + kv_bytes);
    put32(h, H_DCRC, dj_crc32(dj_crc32(0, s->ids, (size_t)tok_bytes), kv, (size_t)kv_bytes));
    model_fields(h, m);
    put64(h, H_CTX, (uint64_t)s->ctx), put64(h, H_NTOK, (uint64_t)s->n_tokens);
    put64(h, H_NPROMPT, (uint64_t)s->n_prompt), put64(h, H_NKV, (uint64_t)s->n_kv);
    put32(h, H_NEXT, (uint32_t)s->next), put32(h, H_KVTYPE, (uint32_t)eng->kv_type), put64(h, H_RNG, s->rng);
    put_smp(h, &s->smp);
    put64(h, H_TOKOFF, SESSION_HEADER), put64(h, H_KVOFF, SESSION_HEADER + tok_bytes), put64(h, H_KVBYTES, kv_bytes);
    put32(h, H_HCRC, header_crc(h));
    rc = out_write(out, h, sizeof h, e) || out_write(out, s->ids, (size_t)tok_bytes, e) ||
                 out_write(out, kv, (size_t)kv_bytes, e) || out_commit(out, 1, e)
             ? -1
             : 0;
out:
    eng->drop(eng->ctx, p);
    return rc;
}

// ---- loading
void session_close(dj_session *s) {
    if (s->fd > 0) close(s->fd);
    free(s->ids);
    memset(s, 0, sizeof *s);
}

// The header against the file's size, the model and the context: each refusal names the file and what differs.
static int check_header(const uint8_t *h, uint64_t size, const char *path, const dj_model *m, const char *model_name,
                        int64_t ctx, dj_err *e) {
    const dj_config *c = &m->info.config;
    if (memcmp(h, SESSION_MAGIC, 8)) return dj_fail(e, "%s is not a djinn session file (no DJINNSES header)", path);
    if (get32(h, H_VERSION) != SESSION_VERSION)
        return dj_fail(e, "%s is a session file of version %u; this djinn reads version %u%s", path,
                       get32(h, H_VERSION), SESSION_VERSION, get32(h, H_VERSION) > SESSION_VERSION ? ": update djinn" : "");
    uint8_t copy[SESSION_HEADER];
    memcpy(copy, h, sizeof copy);
    if (get32(h, H_HSIZE) != SESSION_HEADER || header_crc(copy) != get32(h, H_HCRC))
        return dj_fail(e, "%s is corrupt: its header does not match its checksum", path);
    if (get64(h, H_FSIZE) != size)
        return dj_fail(e, "%s is %s: %" PRIu64 " bytes, its header says %" PRIu64, path,
                       size < get64(h, H_FSIZE) ? "truncated" : "longer than it should be", size, get64(h, H_FSIZE));
    uint8_t mine[SESSION_HEADER] = {0};
    model_fields(mine, m);
    if (memcmp(mine + H_MBYTES, h + H_MBYTES, H_CTX - H_MBYTES))
        return dj_fail(e, "%s was saved with another model (%u layers, dim %u, vocabulary %u, a model.bin of %" PRIu64
                          " bytes, fingerprint %08x), not %s (%u layers, dim %u, vocabulary %u, %" PRIu64
                          " bytes, fingerprint %08x)", path, get32(h, H_LAYERS), get32(h, H_DIM), get32(h, H_VOCAB),
                       get64(h, H_MBYTES), get32(h, H_MID), model_name, c->n_layers, c->dim, c->vocab_size,
                       get64(mine, H_MBYTES), get32(mine, H_MID));
    if ((int64_t)get64(h, H_CTX) != ctx)
        return dj_fail(e, "%s was saved with a context of %" PRIu64 " tokens, this run's is %" PRId64 ": give -c %" PRIu64,
                       path, get64(h, H_CTX), ctx, get64(h, H_CTX));
    const uint32_t kv_type = get32(h, H_KVTYPE);
    if (kv_type >= DJ_KV_TYPES)
        return dj_fail(e, "%s holds a KV cache of type %u, which this djinn does not know: update djinn", path,
                       kv_type);
    uint64_t n = get64(h, H_NTOK), n_kv = get64(h, H_NKV), np = get64(h, H_NPROMPT);
    int32_t next = (int32_t)get32(h, H_NEXT);
    if (n < 1 || n > (uint64_t)ctx || n_kv > n || (n_kv < n - 1) || np > n || np < 1 ||
        (next >= 0 && (n_kv != n || (uint32_t)next >= c->vocab_size)) || next < -1 || !get64(h, H_RNG) ||
        get64(h, H_TOKOFF) != SESSION_HEADER || get64(h, H_KVOFF) != SESSION_HEADER + 4 * n ||
        get64(h, H_KVBYTES) != n_kv * engine_kv_pos_bytes(c, (int)kv_type) ||
        get64(h, H_KVOFF) + get64(h, H_KVBYTES) != size)
        return dj_fail(e, "%s is corrupt: its counts do not agree (%" PRIu64 " tokens, %" PRIu64 " cached, next %d)",
                       path, n, n_kv, next);
    return 0;
}

int session_open(dj_session *s, const char *path, const dj_model *m, const char *model_name, int64_t ctx, dj_err *e) {
    memset(s, 0, sizeof *s);
    struct stat st;
    int fd = in_open(path, "session", &st, e);
    if (fd < 0) return -1;
    s->fd = fd, s->path = path;
    uint8_t h[SESSION_HEADER];
    if ((uint64_t)st.st_size < SESSION_HEADER) {
        dj_fail(e, "%s is truncated: %lld bytes, less than a session header", path, (long long)st.st_size);
        goto fail;
    }
    if (in_pread(fd, h, sizeof h, 0, path, e) || check_header(h, (uint64_t)st.st_size, path, m, model_name, ctx, e))
        goto fail;
    s->n_tokens = (int64_t)get64(h, H_NTOK), s->n_prompt = (int64_t)get64(h, H_NPROMPT);
    s->n_kv = (int64_t)get64(h, H_NKV), s->ctx = ctx, s->next = (int32_t)get32(h, H_NEXT), s->rng = get64(h, H_RNG);
    s->kv_type = (int)get32(h, H_KVTYPE);
    get_smp(h, &s->smp);
    s->kv_off = get64(h, H_KVOFF), s->kv_bytes = get64(h, H_KVBYTES), s->data_crc = get32(h, H_DCRC);
    if (!(s->ids = malloc((size_t)s->n_tokens * sizeof *s->ids))) {
        dj_fail(e, "out of memory for a session of %" PRId64 " tokens", s->n_tokens);
        goto fail;
    }
    if (in_pread(fd, s->ids, (size_t)s->n_tokens * 4, SESSION_HEADER, path, e)) goto fail;
    for (int64_t i = 0; i < s->n_tokens; i++)
        if (s->ids[i] < 0 || (uint32_t)s->ids[i] >= m->info.config.vocab_size) {
            dj_fail(e, "%s is corrupt: token %" PRId64 " is %d, outside the vocabulary", path, i, s->ids[i]);
            goto fail;
        }
    return 0;
fail:
    session_close(s);
    return -1;
}

int session_resume(dj_session *s, dj_engine *eng, int32_t slot, dj_sampler *smp, float *logits, int32_t *next,
                   dj_err *e) {
    if (eng->kv_type != s->kv_type)
        return dj_fail(e, "%s holds its KV cache in %s; this run's is in %s: give --kv-type %s", s->path,
                       dj_kv_name(s->kv_type), dj_kv_name(eng->kv_type), dj_kv_name(s->kv_type));
    dj_parked *p = eng->park(eng->ctx, slot, s->n_kv, e);  // a host buffer of n_kv positions, to fill
    if (!p) return -1;
    uint8_t *kv = eng->parked_kv(eng->ctx, p, e);
    if (!kv || in_pread(s->fd, kv, (size_t)s->kv_bytes, s->kv_off, s->path, e)) goto fail;
    if (dj_crc32(dj_crc32(0, s->ids, (size_t)s->n_tokens * 4), kv, (size_t)s->kv_bytes) != s->data_crc) {
        dj_fail(e, "%s is corrupt: its tokens and KV cache do not match their checksum", s->path);
        goto fail;
    }
    if (eng->restore(eng->ctx, p, slot, e)) goto fail;
    if (s->next >= 0) {
        *next = s->next;
        return 0;
    }
    // The tokens the cache lacks (the last one, not fed before the run ended), and the pick after them.
    int64_t from = s->n_kv < s->n_tokens ? s->n_kv : s->n_tokens - 1;
    return engine_next(eng, smp, slot, s->ids + from, s->n_tokens - from, from, logits, next, e);
fail:
    eng->drop(eng->ctx, p);
    return -1;
}
