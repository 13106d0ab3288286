// convert.c: HuggingFace Llama checkpoint -> model.bin. Tensors are read (pread, not mapped: a file truncated
// under a mapping would kill the process with SIGBUS) and written in output order through small staging buffers, so
// memory stays bounded whatever the checkpoint size (a piece being quantized is read, quantized and written by
// every thread, each its own rows). Inputs and the output go through fileio.h.
#include "convert.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../fileio.h"
#include "../model.h"
#include "../pool.h"
#include "../quant.h"
#include "../tokenizer.h"
#include "hfconfig.h"
#include "../json.h"
#include "safetensors.h"
#include "tokjson.h"

#define MAX_CONFIG (16u << 20)  // config.json
#define MAX_INDEX (64u << 20)   // model.safetensors.index.json
#define STAGE_BYTES (16u << 20)

static void path_join(char *out, size_t n, const char *dir, const char *name) { snprintf(out, n, "%s/%s", dir, name); }

// ---- safetensors shards
typedef struct {
    char path[4096];
    int fd;          // -1: not open
    struct stat at;  // as opened: the file must not change before the conversion ends
    st_file st;
} shard;

typedef struct {
    shard *shards;
    int n;
} weights;

// Opens a shard and parses its header (read alone: the tensors are read as they are written).
static int shard_open(shard *s, dj_err *e) {
    s->fd = in_open(s->path, "safetensors file", &s->at, e);
    if (s->fd < 0) return -1;
    uint64_t size = (uint64_t)s->at.st_size, head;
    uint8_t first[8] = {0};
    dj_err pe;
    if (size >= 8 && in_pread(s->fd, first, 8, 0, s->path, e)) return -1;
    if (st_header_size(first, size, &head, &pe)) return dj_fail(e, "%s: %s", s->path, pe.msg);
    uint8_t *h = malloc((size_t)head);
    if (!h) return dj_fail(e, "out of memory for the header of %s", s->path);
    int rc = in_pread(s->fd, h, (size_t)head, 0, s->path, e);
    if (!rc && st_parse_head(h, (size_t)head, size, &s->st, &pe)) rc = dj_fail(e, "%s: %s", s->path, pe.msg);
    free(h);
    return rc;
}

static void weights_close(weights *w) {
    for (int i = 0; i < w->n; i++) {
        st_free(&w->shards[i].st);
        if (w->shards[i].fd >= 0) close(w->shards[i].fd);
    }
    free(w->shards);
    w->shards = NULL, w->n = 0;
}

// Single model.safetensors, or the shards named by model.safetensors.index.json's weight_map.
static int weights_open(const char *dir, weights *w, dj_err *e) {
    memset(w, 0, sizeof *w);
    char path[4096];
    path_join(path, sizeof path, dir, "model.safetensors.index.json");
    if (access(path, F_OK)) {
        path_join(path, sizeof path, dir, "model.safetensors");
        if (access(path, F_OK))
            return dj_fail(e, "%s has neither model.safetensors nor model.safetensors.index.json", dir);
        w->shards = calloc(1, sizeof *w->shards);
        if (!w->shards) return dj_fail(e, "out of memory");
        w->n = 1;
        w->shards[0].fd = -1;
        snprintf(w->shards[0].path, sizeof w->shards[0].path, "%s", path);
        return shard_open(&w->shards[0], e);
    }
    char *text;
    size_t n;
    if (in_read_all(path, "shard index", MAX_INDEX, &text, &n, e)) return -1;
    dj_err je;
    json_doc *doc = json_parse(text, n, &je);
    free(text);
    if (!doc) return dj_fail(e, "%s: %s", path, je.msg);
    const json_value *map = json_get(json_root(doc), "weight_map");
    int rc = -1;
    if (!map || map->type != JSON_OBJECT || map->u.obj.n == 0) {
        dj_fail(e, "%s: missing or empty \"weight_map\" object", path);
        goto out;
    }
    w->shards = calloc(map->u.obj.n, sizeof *w->shards);
    if (!w->shards) {
        dj_fail(e, "out of memory");
        goto out;
    }
    for (size_t i = 0; i < map->u.obj.n; i++) w->shards[i].fd = -1;
    for (size_t i = 0; i < map->u.obj.n; i++) {
        const char *file = json_str(&map->u.obj.members[i].value);
        if (!file || strchr(file, '/') || !strcmp(file, "..") || !*file) {
            dj_fail(e, "%s: weight_map entry \"%.120s\" must name a file in the same folder", path,
                    map->u.obj.members[i].key);
            goto out;
        }
        char full[4096];
        path_join(full, sizeof full, dir, file);
        int k = 0;
        while (k < w->n && strcmp(w->shards[k].path, full)) k++;
        if (k < w->n) continue;
        snprintf(w->shards[w->n].path, sizeof w->shards[w->n].path, "%s", full);
        if (shard_open(&w->shards[w->n++], e)) goto out;
    }
    // Every tensor the index names must be in the shard it names.
    for (size_t i = 0; i < map->u.obj.n; i++) {
        char full[4096];
        path_join(full, sizeof full, dir, json_str(&map->u.obj.members[i].value));
        for (int k = 0; k < w->n; k++)
            if (!strcmp(w->shards[k].path, full) && !st_find(&w->shards[k].st, map->u.obj.members[i].key)) {
                dj_fail(e, "%s: tensor '%.120s' is not in %s", path, map->u.obj.members[i].key, full);
                goto out;
            }
    }
    rc = 0;
out:
    json_free(doc);
    return rc;
}

// Finds a tensor in any shard (*in: which); a tensor present in two shards is an error.
static int find_tensor(const weights *w, const char *name, const st_tensor **out, const shard **in, dj_err *e) {
    *out = NULL;
    int first = -1;
    for (int k = 0; k < w->n; k++) {
        const st_tensor *t = st_find(&w->shards[k].st, name);
        if (t && *out)
            return dj_fail(e, "tensor '%.120s' appears in two shards: %s and %s", name, w->shards[first].path,
                           w->shards[k].path);
        if (t) *out = t, first = k, *in = &w->shards[k];
    }
    return 0;
}

// ---- expected tensors
typedef struct {
    char name[128];
    int64_t rows, cols;  // cols == 0: a vector of `rows`
    int is_norm;         // stored as f32
    uint32_t kind;       // dj_tensor_kind (the quantization report's rows)
    const st_tensor *t;
    const shard *src;    // the shard holding it
    uint64_t dst;        // absolute offset in model.bin
} want;

static int check_tensor(const weights *w, want *x, dj_err *e) {
    if (find_tensor(w, x->name, &x->t, &x->src, e)) return -1;
    if (!x->t) return dj_fail(e, "missing tensor '%s'", x->name);
    const st_tensor *t = x->t;
    if (t->dtype != ST_F32 && t->dtype != ST_F16 && t->dtype != ST_BF16)
        return dj_fail(e, "tensor '%s' has dtype %s; supported: F32, F16, BF16", x->name, st_dtype_name(t->dtype));
    int ok = x->cols ? (t->ndim == 2 && t->shape[0] == x->rows && t->shape[1] == x->cols)
                     : (t->ndim == 1 && t->shape[0] == x->rows);
    if (!ok) {
        char got[128] = "", tmp[32];
        for (int i = 0; i < t->ndim; i++) {
            snprintf(tmp, sizeof tmp, "%s%lld", i ? ", " : "", (long long)t->shape[i]);
            strncat(got, tmp, sizeof got - strlen(got) - 1);
        }
        if (x->cols)
            return dj_fail(e, "tensor '%s' has shape [%s], expected [%lld, %lld]", x->name, got, (long long)x->rows,
                           (long long)x->cols);
        return dj_fail(e, "tensor '%s' has shape [%s], expected [%lld]", x->name, got, (long long)x->rows);
    }
    return 0;
}

// Tensors a Llama checkpoint may carry that the engine recomputes itself.
static int ignorable(const char *name) {
    const char *s = strstr(name, "rotary_emb.inv_freq");
    return s && !s[strlen("rotary_emb.inv_freq")];
}

// ---- output
typedef struct {
    dj_out out;
    uint64_t pos;
    uint8_t *in, *stage;  // STAGE_BYTES each: source bytes, converted bytes
    dj_progress prog;
    uint64_t test_progress_at;  // test-only (DJINN_TEST_PROGRESS_AT; 0 in every real run): see w_progress
    double sq_err[DJ_N_TENSOR_KINDS], sq_ref[DJ_N_TENSOR_KINDS];  // quantization error, per tensor kind
} writer;

// The progress line, at most ~4 a second. Test-only: DJINN_TEST_PROGRESS_AT=BYTES forces one out as the output
// reaches that size, whatever the clock says, so a test knows where a line is on screen.
static void w_progress(writer *w) {
    if (w->test_progress_at && w->pos >= w->test_progress_at) w->test_progress_at = 0, w->prog.last = -1e30;
    dj_progress_update(&w->prog, w->pos);
}

static int w_write(writer *w, const void *p, size_t n, dj_err *e) {
    if (out_write(&w->out, p, n, e)) return -1;
    w->pos += n;
    w_progress(w);
    return 0;
}

static int w_pad_to(writer *w, uint64_t off, dj_err *e) {
    static const uint8_t zeros[4096];
    if (off < w->pos) return dj_fail(e, "internal error: writer at %llu past %llu", (unsigned long long)w->pos,
                                     (unsigned long long)off);
    while (w->pos < off) {
        uint64_t k = off - w->pos < sizeof zeros ? off - w->pos : sizeof zeros;
        if (w_write(w, zeros, (size_t)k, e)) return -1;
    }
    return 0;
}

static float load_elem(const uint8_t *p, st_dtype t, uint64_t i) {
    uint16_t h;
    float f;
    switch (t) {
    case ST_F32: memcpy(&f, p + 4 * i, 4); return f;
    case ST_F16: memcpy(&h, p + 2 * i, 2); return dj_f16_to_f32(h);
    default: memcpy(&h, p + 2 * i, 2); return dj_bf16_to_f32(h);
    }
}

// The first of n elements (f32, f16 or bf16) that is NaN or infinite, or -1: its exponent bits are all ones.
static int64_t first_nonfinite(const uint8_t *p, st_dtype t, size_t n) {
    for (size_t i = 0; i < n; i++) {
        uint32_t x;
        uint16_t h;
        if (t == ST_F32) memcpy(&x, p + 4 * i, 4);
        else memcpy(&h, p + 2 * i, 2);
        if (t == ST_F32 ? (x & 0x7f800000u) == 0x7f800000u : t == ST_F16 ? (h & 0x7c00) == 0x7c00 : (h & 0x7f80) == 0x7f80)
            return (int64_t)i;
    }
    return -1;
}

// Quantizing a piece of a matrix in parallel: each thread reads its rows of the piece (rows r0.. of the tensor,
// src_row bytes each at src_off) into src, checks them for NaN and infinities, quantizes them into dst (rb bytes a
// row; each row's squared error and squared values into err and ref) and writes them at dst_off of the output. The
// first problem by row is kept: reading, a non-finite value, a group no scale holds, memory, writing.
enum { QF_NONE, QF_READ, QF_NONFINITE, QF_RANGE, QF_MEMORY, QF_WRITE };
typedef struct {
    const shard *file;  // the tensor's shard
    const dj_out *outf;
    uint8_t *src, *dst;
    uint64_t src_off, dst_off;
    st_dtype st;
    size_t is, rb;
    int64_t cols;
    uint32_t out;
    double *err, *ref;
    pthread_mutex_t lock;
    int64_t fail_row;  // the first failing row (INT64_MAX: none), its kind, its error or its non-finite element
    int fail;
    dj_err fail_e;
    int64_t fail_elem;
} quant_job;

static void quant_fail(quant_job *j, int64_t row, int kind, const dj_err *e, int64_t elem) {
    pthread_mutex_lock(&j->lock);
    if (row < j->fail_row) {
        j->fail_row = row, j->fail = kind, j->fail_elem = elem;
        if (e) j->fail_e = *e;
    }
    pthread_mutex_unlock(&j->lock);
}

static void quant_task(void *ctx, int64_t begin, int64_t end) {
    quant_job *j = ctx;
    const size_t src_row = (size_t)j->cols * j->is, n = (size_t)(end - begin);
    uint8_t *src = j->src + (size_t)begin * src_row;
    dj_err e;
    if (in_pread(j->file->fd, src, n * src_row, j->src_off + (uint64_t)begin * src_row, j->file->path, &e))
        return quant_fail(j, begin, QF_READ, &e, 0);
    int64_t bad = first_nonfinite(src, j->st, n * (size_t)j->cols);
    if (bad >= 0) return quant_fail(j, begin + bad / j->cols, QF_NONFINITE, NULL, begin * j->cols + bad);
    float *row = malloc((size_t)j->cols * sizeof *row);
    if (!row) return quant_fail(j, begin, QF_MEMORY, NULL, 0);
    for (int64_t r = begin; r < end; r++) {
        const uint8_t *p = j->src + (size_t)r * src_row;
        for (int64_t i = 0; i < j->cols; i++) row[i] = load_elem(p, j->st, (uint64_t)i);
        j->err[r] = j->ref[r] = 0;
        if (quant_row(j->out, row, j->cols, j->dst + (size_t)r * j->rb, &j->err[r], &j->ref[r])) {
            free(row);
            return quant_fail(j, r, QF_RANGE, NULL, 0);
        }
    }
    free(row);
    if (out_pwrite(j->outf, j->dst + (size_t)begin * j->rb, n * j->rb, j->dst_off + (uint64_t)begin * j->rb, &e))
        quant_fail(j, begin, QF_WRITE, &e, 0);
}

// A matrix quantized to q8 or q4 (rows at a time), its error added to the writer's figures.
static int write_quantized(writer *w, const want *x, uint32_t out, dj_err *e) {
    const st_tensor *t = x->t;
    size_t is = st_dtype_size(t->dtype), rb = (size_t)dj_row_bytes(out, (uint64_t)x->cols);
    size_t src_row = (size_t)x->cols * is, per = STAGE_BYTES / (src_row > rb ? src_row : rb);
    if (per < 1) return dj_fail(e, "tensor '%s': rows of %lld values do not fit the staging buffer", x->name,
                                (long long)x->cols);
    double *err = malloc(per * sizeof *err), *ref = malloc(per * sizeof *ref);
    int rc = err && ref ? 0 : dj_fail(e, "out of memory");
    for (int64_t r0 = 0; !rc && r0 < x->rows; r0 += (int64_t)per) {
        size_t k = (size_t)(x->rows - r0 < (int64_t)per ? x->rows - r0 : (int64_t)per);
        quant_job j = {.file = x->src, .outf = &w->out, .src = w->in, .dst = w->stage,
                       .src_off = t->offset + (uint64_t)r0 * src_row, .dst_off = w->pos, .st = t->dtype, .is = is,
                       .rb = rb, .cols = x->cols, .out = out, .err = err, .ref = ref, .fail_row = INT64_MAX};
        pthread_mutex_init(&j.lock, NULL);
        cpu_parallel_for((int64_t)k, (double)k * (double)x->cols * 600, quant_task, &j);
        pthread_mutex_destroy(&j.lock);
        switch (j.fail) {
        case QF_READ:
        case QF_WRITE: *e = j.fail_e, rc = -1; break;
        case QF_NONFINITE: {
            const uint8_t *v = w->in + (size_t)j.fail_elem * is;
            rc = dj_fail(e, "tensor '%s' holds %s at element %llu: the checkpoint is damaged, refusing to convert it",
                         x->name, isnan(load_elem(v, t->dtype, 0)) ? "NaN" : "an infinity",
                         (unsigned long long)((uint64_t)r0 * (uint64_t)x->cols + (uint64_t)j.fail_elem));
            break;
        }
        case QF_RANGE:
            rc = dj_fail(e, "tensor '%s' holds values beyond what %s's scales can hold (%s)", x->name,
                         dj_dtype_name(out), out == DJ_Q8 ? "a group of 32 spanning more than 1.6e7"
                                                          : "a group of 32 spanning more than 9.6e5");
            break;
        case QF_MEMORY: rc = dj_fail(e, "out of memory"); break;
        default: break;
        }
        for (size_t i = 0; !rc && i < k; i++) w->sq_err[x->kind] += err[i], w->sq_ref[x->kind] += ref[i];
        if (!rc) rc = out_seek(&w->out, w->pos + k * rb, e);
        if (!rc) w->pos += k * rb, w_progress(w);
    }
    free(err), free(ref);
    return rc;
}

// Reads a tensor in STAGE_BYTES pieces and writes it in `out` dtype; refuses a NaN or infinity by the tensor's name
// (a damaged checkpoint: its logits would be NaN).
static int write_tensor(writer *w, const want *x, uint32_t out, dj_err *e) {
    const st_tensor *t = x->t;
    if (w_pad_to(w, x->dst, e)) return -1;
    if (dj_is_quant(out)) return write_quantized(w, x, out, e);
    size_t is = st_dtype_size(t->dtype), os = dj_dtype_size(out), per = STAGE_BYTES / (is > os ? is : os);
    uint64_t count = t->nbytes / is;
    int same = (t->dtype == ST_F32 && out == DJ_F32) || (t->dtype == ST_F16 && out == DJ_F16) ||
               (t->dtype == ST_BF16 && out == DJ_BF16);
    for (uint64_t i0 = 0; i0 < count; i0 += per) {
        size_t k = (size_t)(count - i0 < per ? count - i0 : per);
        if (in_pread(x->src->fd, w->in, k * is, t->offset + i0 * is, x->src->path, e)) return -1;
        int64_t bad = first_nonfinite(w->in, t->dtype, k);
        if (bad >= 0)
            return dj_fail(e, "tensor '%s' holds %s at element %llu: the checkpoint is damaged, refusing to convert it",
                           x->name, isnan(load_elem(w->in, t->dtype, (uint64_t)bad)) ? "NaN" : "an infinity",
                           (unsigned long long)(i0 + (uint64_t)bad));
        if (same) {
            if (w_write(w, w->in, k * is, e)) return -1;
            continue;
        }
        for (size_t i = 0; i < k; i++) {
            float f = load_elem(w->in, t->dtype, i);
            if (out == DJ_F32) {
                memcpy(w->stage + 4 * i, &f, 4);
            } else if (out == DJ_BF16) {
                uint16_t h = dj_f32_to_bf16(f);
                memcpy(w->stage + 2 * i, &h, 2);
            } else {
                uint16_t h = dj_f32_to_f16(f);
                if ((h & 0x7c00) == 0x7c00)
                    return dj_fail(e, "tensor '%s' holds %g, beyond f16's range: use --dtype bf16 or f32", x->name, f);
                memcpy(w->stage + 2 * i, &h, 2);
            }
        }
        if (w_write(w, w->stage, k * os, e)) return -1;
    }
    return 0;
}

// Every file the conversion reads: the output may be none of them. The list grows with the shards: an input left
// off it could be overwritten by the output.
typedef struct {
    char **path;
    int n, cap;
} inputs;

static int inputs_add(inputs *in, const char *dir, const char *name) {
    if (in->n == in->cap) {
        int cap = in->cap ? 2 * in->cap : 16;
        char **p = realloc(in->path, (size_t)cap * sizeof *p);
        if (!p) return -1;
        in->path = p, in->cap = cap;
    }
    char p[4200];
    if (name) snprintf(p, sizeof p, "%s/%s", dir, name);
    else snprintf(p, sizeof p, "%s", dir);
    if (!(in->path[in->n] = strdup(p))) return -1;
    in->n++;
    return 0;
}

static void inputs_free(inputs *in) {
    for (int i = 0; i < in->n; i++) free(in->path[i]);
    free(in->path);
    in->path = NULL, in->n = in->cap = 0;
}

// ---- the conversion
// BF16 stays BF16; F16 stays F16; F32 becomes F16 (half the bytes to stream; --dtype f32 keeps it).
static uint32_t auto_dtype(st_dtype t) { return t == ST_BF16 ? DJ_BF16 : DJ_F16; }

int convert_run(const convert_opts *o, dj_err *e) {
    char path[4096];
    char *text = NULL;
    size_t n;
    dj_config c;
    weights w = {0};
    want *ws = NULL;
    uint8_t *blob = NULL, *hdr = NULL;
    size_t blob_size = 0;
    dj_model_info info = {0};
    writer wr = {.out = {.fd = -1}};
    inputs in = {0};
    int rc = -1;

    path_join(path, sizeof path, o->hf_dir, "config.json");
    if (in_read_all(path, "config.json", MAX_CONFIG, &text, &n, e)) goto out;
    if (hf_config_parse(text, n, &c, e)) goto out;
    free(text);
    text = NULL;
    if (weights_open(o->hf_dir, &w, e)) goto out;

    // Every tensor the engine needs, with its expected shape, in output order.
    int64_t dim = c.dim, q = (int64_t)c.n_heads * c.head_dim, kv = (int64_t)c.n_kv_heads * c.head_dim,
            hid = c.hidden_dim, vocab = c.vocab_size;
    size_t nw = 1 + 9 * (size_t)c.n_layers + 2, k = 0;
    ws = calloc(nw, sizeof *ws);
    if (!ws) {
        dj_fail(e, "out of memory");
        goto out;
    }
#define WANT(kd, r, cc, norm, ...) (snprintf(ws[k].name, sizeof ws[k].name, __VA_ARGS__), ws[k].rows = (r), \
                                    ws[k].cols = (cc), ws[k].is_norm = (norm), ws[k].kind = (kd), k++)
    WANT(DJ_T_EMBED, vocab, dim, 0, "model.embed_tokens.weight");
    for (uint32_t l = 0; l < c.n_layers; l++) {
        WANT(DJ_T_ATTN_NORM, dim, 0, 1, "model.layers.%u.input_layernorm.weight", l);
        WANT(DJ_T_FFN_NORM, dim, 0, 1, "model.layers.%u.post_attention_layernorm.weight", l);
        WANT(DJ_T_WQ, q, dim, 0, "model.layers.%u.self_attn.q_proj.weight", l);
        WANT(DJ_T_WK, kv, dim, 0, "model.layers.%u.self_attn.k_proj.weight", l);
        WANT(DJ_T_WV, kv, dim, 0, "model.layers.%u.self_attn.v_proj.weight", l);
        WANT(DJ_T_WO, dim, q, 0, "model.layers.%u.self_attn.o_proj.weight", l);
        WANT(DJ_T_W_GATE, hid, dim, 0, "model.layers.%u.mlp.gate_proj.weight", l);
        WANT(DJ_T_W_UP, hid, dim, 0, "model.layers.%u.mlp.up_proj.weight", l);
        WANT(DJ_T_W_DOWN, dim, hid, 0, "model.layers.%u.mlp.down_proj.weight", l);
    }
    WANT(DJ_T_FINAL_NORM, dim, 0, 1, "model.norm.weight");
    if (!c.tied) WANT(DJ_T_LM_HEAD, vocab, dim, 0, "lm_head.weight");
#undef WANT
    nw = k;
    for (size_t i = 0; i < nw; i++)
        if (check_tensor(&w, &ws[i], e)) goto out;
    // Anything else in the checkpoint (biases, other architectures' tensors) is refused by name.
    for (int s = 0; s < w.n; s++)
        for (size_t i = 0; i < w.shards[s].st.n; i++) {
            const char *name = w.shards[s].st.tensors[i].name;
            int known = ignorable(name) || (c.tied && !strcmp(name, "lm_head.weight"));
            for (size_t j = 0; j < nw && !known; j++) known = !strcmp(ws[j].name, name);
            if (!known) {
                dj_fail(e, "unexpected tensor '%.120s': %s", name,
                        strstr(name, "bias") ? "biases are not supported" : "not part of a Llama checkpoint");
                goto out;
            }
        }
    dj_config_set_wtype(&c, o->dtype >= 0 ? (uint32_t)o->dtype : auto_dtype(ws[0].t->dtype));
    if (dj_is_quant(c.wtype)) c.embed_type = c.head_type = DJ_Q8;  // the embeddings and the lm_head: q8 (README)

    // --tokenizer DIR lends the tokenizer only; the bos/eos ids of config.json and generation_config.json are
    // the model's own (precedence in tokjson.c).
    if (tokjson_build_dirs(o->tok_dir ? o->tok_dir : o->hf_dir, o->hf_dir, &blob, &blob_size, e)) goto out;
    {  // The section must load, and every id it can produce must have an embedding row.
        dj_err te;
        dj_tokenizer *t = tok_load(blob, blob_size, &te);
        if (!t) {
            dj_fail(e, "internal error: the tokenizer section does not load: %s", te.msg);
            goto out;
        }
        int32_t tv = tok_vocab_size(t);
        tok_free(t);
        if (tv > (int32_t)c.vocab_size) {
            dj_fail(e, "the tokenizer has %d tokens but the model's vocab_size is %u: wrong tokenizer for this model",
                    tv, c.vocab_size);
            goto out;
        }
    }
    if (model_plan(&c, blob_size, &info, e)) goto out;
    // Destination offsets, from the one layout the loader also uses.
    k = 0;
    ws[k++].dst = info.embed_off;
    for (uint32_t l = 0; l < c.n_layers; l++) {
        uint64_t b = info.layer_off[l];
        const dj_layer_layout *L = &info.layer;
        uint64_t offs[9] = {L->attn_norm, L->ffn_norm, L->wq, L->wk, L->wv, L->wo, L->w_gate, L->w_up, L->w_down};
        for (int i = 0; i < 9; i++) ws[k++].dst = b + offs[i];
    }
    ws[k++].dst = info.head_off + info.head.norm;
    if (!c.tied) ws[k++].dst = info.head_off + info.head.lm_head;

    uint64_t hb = model_header_bytes(c.n_layers);
    hdr = malloc(hb);
    wr.in = malloc(STAGE_BYTES), wr.stage = malloc(STAGE_BYTES);
    if (!hdr || !wr.in || !wr.stage) {
        dj_fail(e, "out of memory");
        goto out;
    }
    if (model_write_header(&info, hdr, hb, e)) goto out;
    // The output may be none of the inputs; OUT.bin.tmp is this run's, locked, until renamed (fileio.h).
    path_join(path, sizeof path, o->hf_dir, "model.safetensors.index.json");
    const char *td = o->tok_dir ? o->tok_dir : o->hf_dir;
    int add_rc = inputs_add(&in, path, NULL) || inputs_add(&in, o->hf_dir, "config.json") ||
                 inputs_add(&in, o->hf_dir, "generation_config.json") || inputs_add(&in, td, "tokenizer.json") ||
                 inputs_add(&in, td, "tokenizer_config.json");
    for (int i = 0; i < w.n && !add_rc; i++) add_rc = inputs_add(&in, w.shards[i].path, NULL);
    if (add_rc) {
        dj_fail(e, "out of memory");
        goto out;
    }
    if (out_open(&wr.out, o->out_path, "output", (const char *const *)in.path, in.n, e)) goto out;
    if (!o->quiet)
        fprintf(stderr, "convert: %u layers, dim %u, %u heads (%u kv, head_dim %u), ffn %u, vocab %u, %s%s -> %s, %.2f GB\n",
                c.n_layers, c.dim, c.n_heads, c.n_kv_heads, c.head_dim, c.hidden_dim, c.vocab_size,
                st_dtype_name(ws[0].t->dtype), c.tied ? " (tied head)" : "", dj_dtype_name(c.wtype),
                (double)info.file_size / 1e9);
    dj_progress_start(&wr.prog, "convert", info.file_size, !o->quiet);
    const char *tp = getenv("DJINN_TEST_PROGRESS_AT");
    wr.test_progress_at = tp ? strtoull(tp, NULL, 10) : 0;
    if (w_write(&wr, hdr, hb, e) || w_pad_to(&wr, info.tok_off, e) || w_write(&wr, blob, blob_size, e)) goto out;
    for (size_t i = 0; i < nw; i++) {
        uint32_t dt = ws[i].is_norm ? DJ_F32 : ws[i].kind == DJ_T_EMBED ? c.embed_type
                    : ws[i].kind == DJ_T_LM_HEAD ? c.head_type : c.wtype;
        if (write_tensor(&wr, &ws[i], dt, e)) goto out;
    }
    if (w_pad_to(&wr, info.file_size, e)) goto out;
    for (int i = 0; i < w.n; i++)  // what was read is what was checked
        if (in_unchanged(w.shards[i].fd, &w.shards[i].at, w.shards[i].path, e)) goto out;
    if (out_commit(&wr.out, 1, e)) goto out;
    dj_progress_end(&wr.prog, wr.pos);
    if (dj_is_quant(c.wtype) && !o->quiet) {
        fprintf(stderr, "convert: %s quantization error, relative RMS per tensor kind:", dj_dtype_name(c.wtype));
        for (int kd = 0; kd < DJ_N_TENSOR_KINDS; kd++)
            if (wr.sq_ref[kd] > 0)
                fprintf(stderr, " %s %.2e", dj_tensor_name((uint32_t)kd), sqrt(wr.sq_err[kd] / wr.sq_ref[kd]));
        fputc('\n', stderr);
    }
    if (o->report)
        for (int kd = 0; kd < DJ_N_TENSOR_KINDS; kd++)
            o->report[kd] = wr.sq_ref[kd] > 0 ? sqrt(wr.sq_err[kd] / wr.sq_ref[kd]) : 0;
    rc = 0;
out:
    if (rc) dj_progress_abort(&wr.prog);  // the caller's error line must not land on the progress line
    out_abort(&wr.out);                   // a failed conversion leaves nothing behind
    inputs_free(&in);
    free(text);
    free(ws);
    free(blob);
    free(hdr);
    free(wr.in), free(wr.stage);
    dj_info_free(&info);
    weights_close(&w);
    return rc;
}
