// convert.c: HuggingFace Llama checkpoint -> model.bin. Inputs are mmap'd and tensors are written in output
// order through a small staging buffer, so memory stays bounded whatever the checkpoint size.
#include "convert.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../model.h"
#include "../tokenizer.h"
#include "hfconfig.h"
#include "json.h"
#include "safetensors.h"
#include "tokjson.h"

#define MAX_SMALL_FILE (64u << 20)  // config / index JSON
#define STAGE_BYTES (16u << 20)

// ---- small files
// Allocates what the file holds, not the limit: the buffer counts against a process's memory limit even
// where its pages are never touched.
static int read_small(const char *path, char **buf, size_t *n, dj_err *e) {
    FILE *f = fopen(path, "rb");
    if (!f) return dj_fail(e, "cannot open %s: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fileno(f), &st) || st.st_size < 0 || st.st_size >= (off_t)MAX_SMALL_FILE) {
        fclose(f);
        return dj_fail(e, "cannot read %s (unreadable or larger than %u MB)", path, MAX_SMALL_FILE >> 20);
    }
    size_t size = (size_t)st.st_size;
    char *b = malloc(size + 1);
    size_t got = b ? fread(b, 1, size + 1, f) : 0;
    int bad = !b || ferror(f) || got != size;  // size + 1 asked: a file that grew is caught too
    fclose(f);
    if (bad) {
        free(b);
        return dj_fail(e, "cannot read %s (unreadable, out of memory, or changed while read)", path);
    }
    *buf = b, *n = got;
    return 0;
}

static void path_join(char *out, size_t n, const char *dir, const char *name) { snprintf(out, n, "%s/%s", dir, name); }

// ---- safetensors shards
typedef struct {
    char path[4096];
    void *map;
    size_t size;
    st_file st;
} shard;

typedef struct {
    shard *shards;
    int n;
} weights;

static int shard_open(shard *s, dj_err *e) {
    int fd = open(s->path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return dj_fail(e, "cannot open %s: %s", s->path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) || st.st_size <= 0) {
        close(fd);
        return dj_fail(e, "%s is empty or unreadable", s->path);
    }
    s->size = (size_t)st.st_size;
    s->map = mmap(NULL, s->size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (s->map == MAP_FAILED) {
        s->map = NULL;
        return dj_fail(e, "cannot map %s: %s", s->path, strerror(errno));
    }
    dj_err pe;
    if (st_parse(s->map, s->size, &s->st, &pe)) return dj_fail(e, "%s: %s", s->path, pe.msg);
    return 0;
}

static void weights_close(weights *w) {
    for (int i = 0; i < w->n; i++) {
        st_free(&w->shards[i].st);
        if (w->shards[i].map) munmap(w->shards[i].map, w->shards[i].size);
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
        snprintf(w->shards[0].path, sizeof w->shards[0].path, "%s", path);
        return shard_open(&w->shards[0], e);
    }
    char *text;
    size_t n;
    if (read_small(path, &text, &n, e)) return -1;
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
    for (size_t i = 0; i < map->u.obj.n; i++) {
        const char *file = json_str(&map->u.obj.members[i].value);
        if (!file || strchr(file, '/') || !strcmp(file, "..") || !*file) {
            dj_fail(e, "%s: weight_map entry \"%s\" must name a file in the same folder", path,
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
                dj_fail(e, "%s: tensor '%s' is not in %s", path, map->u.obj.members[i].key, full);
                goto out;
            }
    }
    rc = 0;
out:
    json_free(doc);
    return rc;
}

// Finds a tensor in any shard; a tensor present in two shards is an error.
static int find_tensor(const weights *w, const char *name, const st_tensor **out, dj_err *e) {
    *out = NULL;
    int first = -1;
    for (int k = 0; k < w->n; k++) {
        const st_tensor *t = st_find(&w->shards[k].st, name);
        if (t && *out)
            return dj_fail(e, "tensor '%s' appears in two shards: %s and %s", name, w->shards[first].path,
                           w->shards[k].path);
        if (t) *out = t, first = k;
    }
    return 0;
}

// ---- expected tensors
typedef struct {
    char name[128];
    int64_t rows, cols;  // cols == 0: a vector of `rows`
    int is_norm;         // stored as f32
    const st_tensor *t;
    uint64_t dst;        // absolute offset in model.bin
} want;

static int check_tensor(const weights *w, want *x, dj_err *e) {
    if (find_tensor(w, x->name, &x->t, e)) return -1;
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
    int fd;
    uint64_t pos;
    uint8_t *stage;  // STAGE_BYTES
    dj_progress prog;
    const char *path;
} writer;

static int w_write(writer *w, const void *p, size_t n, dj_err *e) {
    const uint8_t *b = p;
    while (n) {
        ssize_t k = write(w->fd, b, n);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) return dj_fail(e, "writing %s: %s", w->path, k < 0 ? strerror(errno) : "no space");
        b += k, n -= (size_t)k, w->pos += (uint64_t)k;
        dj_progress_update(&w->prog, w->pos);
    }
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

// Converts a tensor element by element to `out` dtype, staged in STAGE_BYTES pieces.
static int write_tensor(writer *w, const want *x, uint32_t out, dj_err *e) {
    const st_tensor *t = x->t;
    if (w_pad_to(w, x->dst, e)) return -1;
    uint64_t count = t->nbytes / st_dtype_size(t->dtype);
    int same = (t->dtype == ST_F32 && out == DJ_F32) || (t->dtype == ST_F16 && out == DJ_F16) ||
               (t->dtype == ST_BF16 && out == DJ_BF16);
    if (same) return w_write(w, t->data, (size_t)t->nbytes, e);
    size_t os = dj_dtype_size(out), per = STAGE_BYTES / os;
    for (uint64_t i0 = 0; i0 < count; i0 += per) {
        size_t k = (size_t)(count - i0 < per ? count - i0 : per);
        for (size_t i = 0; i < k; i++) {
            float f = load_elem(t->data, t->dtype, i0 + i);
            if (out == DJ_F32) {
                memcpy(w->stage + 4 * i, &f, 4);
            } else if (out == DJ_BF16) {
                uint16_t h = dj_f32_to_bf16(f);
                memcpy(w->stage + 2 * i, &h, 2);
            } else {
                uint16_t h = dj_f32_to_f16(f);
                if ((h & 0x7c00) == 0x7c00 && isfinite(f))
                    return dj_fail(e, "tensor '%s' holds %g, beyond f16's range: use --dtype bf16 or f32", x->name, f);
                memcpy(w->stage + 2 * i, &h, 2);
            }
        }
        if (w_write(w, w->stage, k * os, e)) return -1;
    }
    return 0;
}

// The signals whose handler (main.c) removes OUT.bin.tmp are held while the file and the flag that says this
// run made it change together, so the handler never sees one without the other.
static void hold_signals(sigset_t *old) {
    sigset_t s;
    sigemptyset(&s);
    sigaddset(&s, SIGINT), sigaddset(&s, SIGTERM), sigaddset(&s, SIGHUP);
    pthread_sigmask(SIG_BLOCK, &s, old);
}

static void release_signals(const sigset_t *old) { pthread_sigmask(SIG_SETMASK, old, NULL); }

// ---- the conversion
// BF16 stays BF16; F16 stays F16; F32 becomes F16 (half the bytes to stream; --dtype f32 keeps it).
static uint32_t auto_dtype(st_dtype t) { return t == ST_BF16 ? DJ_BF16 : DJ_F16; }

int convert_run(const convert_opts *o, dj_err *e) {
    char path[4096], tmp[4200];
    char *text = NULL;
    size_t n;
    dj_config c;
    weights w = {0};
    want *ws = NULL;
    uint8_t *blob = NULL, *hdr = NULL;
    size_t blob_size = 0;
    dj_model_info info = {0};
    writer wr = {.fd = -1, .path = tmp};
    int rc = -1, made = 0;  // made: this run created tmp
    snprintf(tmp, sizeof tmp, "%s.tmp", o->out_path);

    path_join(path, sizeof path, o->hf_dir, "config.json");
    if (read_small(path, &text, &n, e)) goto out;
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
#define WANT(r, cc, norm, ...) (snprintf(ws[k].name, sizeof ws[k].name, __VA_ARGS__), ws[k].rows = (r), \
                                ws[k].cols = (cc), ws[k].is_norm = (norm), k++)
    WANT(vocab, dim, 0, "model.embed_tokens.weight");
    for (uint32_t l = 0; l < c.n_layers; l++) {
        WANT(dim, 0, 1, "model.layers.%u.input_layernorm.weight", l);
        WANT(dim, 0, 1, "model.layers.%u.post_attention_layernorm.weight", l);
        WANT(q, dim, 0, "model.layers.%u.self_attn.q_proj.weight", l);
        WANT(kv, dim, 0, "model.layers.%u.self_attn.k_proj.weight", l);
        WANT(kv, dim, 0, "model.layers.%u.self_attn.v_proj.weight", l);
        WANT(dim, q, 0, "model.layers.%u.self_attn.o_proj.weight", l);
        WANT(hid, dim, 0, "model.layers.%u.mlp.gate_proj.weight", l);
        WANT(hid, dim, 0, "model.layers.%u.mlp.up_proj.weight", l);
        WANT(dim, hid, 0, "model.layers.%u.mlp.down_proj.weight", l);
    }
    WANT(dim, 0, 1, "model.norm.weight");
    if (!c.tied) WANT(vocab, dim, 0, "lm_head.weight");
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
                dj_fail(e, "unexpected tensor '%s': %s", name,
                        strstr(name, "bias") ? "biases are not supported" : "not part of a Llama checkpoint");
                goto out;
            }
        }
    c.wtype = o->dtype >= 0 ? (uint32_t)o->dtype : auto_dtype(ws[0].t->dtype);

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
    wr.stage = malloc(STAGE_BYTES);
    if (!hdr || !wr.stage) {
        dj_fail(e, "out of memory");
        goto out;
    }
    if (model_write_header(&info, hdr, hb, e)) goto out;
    // O_EXCL: an existing OUT.bin.tmp belongs to another conversion still writing it, or to one that was
    // killed; either way it is not ours to overwrite or delete.
    sigset_t held;
    hold_signals(&held);
    wr.fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    int err = errno;
    made = wr.fd >= 0;
    if (made && o->tmp_made) *o->tmp_made = 1;
    release_signals(&held);
    if (!made) {
        if (err == EEXIST)
            dj_fail(e, "%s already exists (a conversion still running, or one that was killed): remove it and run "
                    "again", tmp);
        else
            dj_fail(e, "cannot create %s: %s", tmp, strerror(err));
        goto out;
    }
    if (!o->quiet)
        fprintf(stderr, "convert: %u layers, dim %u, %u heads (%u kv, head_dim %u), ffn %u, vocab %u, %s%s -> %s, %.2f GB\n",
                c.n_layers, c.dim, c.n_heads, c.n_kv_heads, c.head_dim, c.hidden_dim, c.vocab_size,
                st_dtype_name(ws[0].t->dtype), c.tied ? " (tied head)" : "", dj_dtype_name(c.wtype),
                (double)info.file_size / 1e9);
    dj_progress_start(&wr.prog, "convert", info.file_size, !o->quiet);
    if (w_write(&wr, hdr, hb, e) || w_pad_to(&wr, info.tok_off, e) || w_write(&wr, blob, blob_size, e)) goto out;
    for (size_t i = 0; i < nw; i++)
        if (write_tensor(&wr, &ws[i], ws[i].is_norm ? DJ_F32 : c.wtype, e)) goto out;
    if (w_pad_to(&wr, info.file_size, e)) goto out;
    if (fsync(wr.fd)) {
        dj_fail(e, "writing %s: %s", tmp, strerror(errno));
        goto out;
    }
    int fd = wr.fd;
    wr.fd = -1;
    if (close(fd)) {
        dj_fail(e, "writing %s: %s", tmp, strerror(errno));
        goto out;
    }
    hold_signals(&held);
    if (rename(tmp, o->out_path)) {
        err = errno;
        release_signals(&held);
        dj_fail(e, "cannot rename %s to %s: %s", tmp, o->out_path, strerror(err));
        goto out;
    }
    made = 0;
    if (o->tmp_made) *o->tmp_made = 0;
    release_signals(&held);
    dj_progress_end(&wr.prog, wr.pos);
    rc = 0;
out:
    if (rc) dj_progress_abort(&wr.prog);  // the caller's error line must not land on the progress line
    if (wr.fd >= 0) close(wr.fd);
    if (made) {  // a failed conversion leaves nothing behind, and removes only what it made
        unlink(tmp);
        if (o->tmp_made) *o->tmp_made = 0;
    }
    free(text);
    free(ws);
    free(blob);
    free(hdr);
    free(wr.stage);
    dj_info_free(&info);
    weights_close(&w);
    return rc;
}
