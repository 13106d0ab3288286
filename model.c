// model.c: the model.bin format (layout, pure parser, header writer), the loader, the GPU forward pass
// (resident units and the streaming schedule) and the CPU reference forward pass.
#include "model.h"

#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kernels.h"
#include "ringbuf.h"

_Static_assert(sizeof(dj_config) == 80, "dj_config is 80 bytes on disk");
_Static_assert(sizeof(dj_disk_header) == 128, "dj_disk_header is 128 bytes on disk");
_Static_assert(sizeof(dj_disk_section) == 32, "dj_disk_section is 32 bytes on disk");

#define FIX_HINT "re-run ./convert/convert to rewrite the file"

// ---- dtypes
size_t dj_dtype_size(uint32_t dtype) {
    switch (dtype) {
    case DJ_F32: return 4;
    case DJ_F16: return 2;
    case DJ_BF16: return 2;
    default: return 0;
    }
}

const char *dj_dtype_name(uint32_t dtype) {
    switch (dtype) {
    case DJ_F32: return "f32";
    case DJ_F16: return "f16";
    case DJ_BF16: return "bf16";
    default: return "?";
    }
}

// ---- config and layout
int dj_config_validate(const dj_config *c, dj_err *e) {
    // Limits are generous (Llama 3.1 405B: dim 16384, 126 layers, hidden 53248, vocab 128256) but keep
    // every product far from overflow.
    if (c->dim == 0 || c->dim > 65536) return dj_fail(e, "dim %u out of range (1..65536)", c->dim);
    if (c->n_layers == 0 || c->n_layers > DJ_MAX_LAYERS)
        return dj_fail(e, "n_layers %u out of range (1..%u)", c->n_layers, DJ_MAX_LAYERS);
    if (c->n_heads == 0 || c->n_heads > 1024) return dj_fail(e, "n_heads %u out of range (1..1024)", c->n_heads);
    if (c->n_kv_heads == 0 || c->n_kv_heads > c->n_heads || c->n_heads % c->n_kv_heads)
        return dj_fail(e, "n_kv_heads %u must divide n_heads %u", c->n_kv_heads, c->n_heads);
    if (c->head_dim == 0 || c->head_dim > 1024 || c->head_dim % 2)
        return dj_fail(e, "head_dim %u must be even and in 2..1024", c->head_dim);
    if (c->hidden_dim == 0 || c->hidden_dim > 1u << 20)
        return dj_fail(e, "hidden_dim %u out of range (1..%u)", c->hidden_dim, 1u << 20);
    if (c->vocab_size == 0 || c->vocab_size > 1u << 22)
        return dj_fail(e, "vocab_size %u out of range (1..%u)", c->vocab_size, 1u << 22);
    if (c->max_seq_len == 0 || c->max_seq_len > 1u << 24)
        return dj_fail(e, "max_seq_len %u out of range (1..%u)", c->max_seq_len, 1u << 24);
    if (!dj_dtype_size(c->wtype)) return dj_fail(e, "unknown weight dtype %u", c->wtype);
    if (c->tied > 1) return dj_fail(e, "tied flag %u is not 0 or 1", c->tied);
    if (!(c->norm_eps > 0 && c->norm_eps < 1)) return dj_fail(e, "norm_eps %g out of range (0..1)", c->norm_eps);
    if (!(c->rope_theta > 0 && c->rope_theta < 1e12f))
        return dj_fail(e, "rope_theta %g out of range", c->rope_theta);
    if (c->rope_type == DJ_ROPE_LLAMA3) {
        if (!(c->rope_factor >= 1 && c->rope_factor < 1e6f)) return dj_fail(e, "llama3 rope factor %g out of range", c->rope_factor);
        if (!(c->rope_low_freq > 0 && c->rope_high_freq > c->rope_low_freq && c->rope_high_freq < 1e6f))
            return dj_fail(e, "llama3 rope needs 0 < low_freq_factor (%g) < high_freq_factor (%g)", c->rope_low_freq,
                           c->rope_high_freq);
        if (c->rope_orig_max == 0) return dj_fail(e, "llama3 rope needs original_max_position_embeddings > 0");
    } else if (c->rope_type != DJ_ROPE_DEFAULT) {
        return dj_fail(e, "unknown rope type %u", c->rope_type);
    } else if (c->rope_factor != 0 || c->rope_low_freq != 0 || c->rope_high_freq != 0 || c->rope_orig_max != 0) {
        // Fields a reader of this version ignores must be zero, so that a later version can give them meaning.
        return dj_fail(e, "llama3 rope fields are set but the rope type is default");
    }
    for (int i = 0; i < 3; i++)
        if (c->reserved[i]) return dj_fail(e, "reserved config word %d is %u, not zero", i, c->reserved[i]);
    return 0;
}

int dj_layout(const dj_config *c, dj_layer_layout *L, dj_head_layout *H, dj_err *e) {
    if (dj_config_validate(c, e)) return -1;
    // With the limits above every product below fits easily in 64 bits (< 2^60); no overflow checks needed.
    uint64_t ws = dj_dtype_size(c->wtype), dim = c->dim, q = (uint64_t)c->n_heads * c->head_dim,
             kv = (uint64_t)c->n_kv_heads * c->head_dim, hid = c->hidden_dim, a = DJ_TENSOR_ALIGN, off = 0;
#define PLACE(field, bytes) (L->field = off, off = dj_align_up(off + (bytes), a))
    PLACE(attn_norm, dim * 4);
    PLACE(ffn_norm, dim * 4);
    PLACE(wq, q * dim * ws);
    PLACE(wk, kv * dim * ws);
    PLACE(wv, kv * dim * ws);
    PLACE(wo, dim * q * ws);
    PLACE(w_gate, hid * dim * ws);
    PLACE(w_up, hid * dim * ws);
    PLACE(w_down, dim * hid * ws);
#undef PLACE
    L->size = dj_align_up(off, DJ_SECTION_ALIGN);
    H->norm = 0;
    H->lm_head = dj_align_up(dim * 4, a);
    H->size = dj_align_up(c->tied ? dim * 4 : H->lm_head + (uint64_t)c->vocab_size * dim * ws, DJ_SECTION_ALIGN);
    return 0;
}

// ---- file plan and header
uint64_t model_header_bytes(uint32_t n_layers) {
    return dj_align_up(DJ_HEADER_SIZE + (uint64_t)(n_layers + 3) * sizeof(dj_disk_section), DJ_SECTION_ALIGN);
}

int model_plan(const dj_config *c, uint64_t tok_size, dj_model_info *m, dj_err *e) {
    memset(m, 0, sizeof *m);
    m->config = *c;
    if (dj_layout(c, &m->layer, &m->head, e)) return -1;
    if (tok_size == 0 || tok_size > (1ull << 32)) return dj_fail(e, "tokenizer section of %llu bytes out of range",
                                                                 (unsigned long long)tok_size);
    m->layer_off = malloc(c->n_layers * sizeof *m->layer_off);
    if (!m->layer_off) return dj_fail(e, "out of memory");
    uint64_t off = model_header_bytes(c->n_layers);
    m->tok_off = off, m->tok_size = tok_size;
    off = dj_align_up(off + tok_size, DJ_SECTION_ALIGN);
    m->embed_off = off, m->embed_size = (uint64_t)c->vocab_size * c->dim * dj_dtype_size(c->wtype);
    off = dj_align_up(off + m->embed_size, DJ_SECTION_ALIGN);
    for (uint32_t l = 0; l < c->n_layers; l++) m->layer_off[l] = off, off += m->layer.size;
    m->head_off = off, m->head_size = m->head.size;
    m->file_size = off + m->head.size;
    return 0;
}

void dj_info_free(dj_model_info *m) {
    free(m->layer_off);
    m->layer_off = NULL;
}

// Header + table bytes covered by the CRC, in file order.
static uint32_t header_crc(const uint8_t *hdr, const uint8_t *table, size_t table_bytes) {
    uint8_t copy[sizeof(dj_disk_header)];
    memcpy(copy, hdr, sizeof copy);
    memset(copy + offsetof(dj_disk_header, crc), 0, 4);
    uint32_t crc = dj_crc32(0, copy, sizeof copy);
    crc = dj_crc32(crc, hdr + sizeof copy, DJ_HEADER_SIZE - sizeof copy);
    return dj_crc32(crc, table, table_bytes);
}

int model_write_header(const dj_model_info *m, void *buf, size_t n, dj_err *e) {
    uint32_t nl = m->config.n_layers, ns = nl + 3;
    if (n < model_header_bytes(nl)) return dj_fail(e, "header buffer too small");
    memset(buf, 0, n);
    dj_disk_header h = {0};
    memcpy(h.magic, DJ_MAGIC, 8);
    h.version = DJ_VERSION;
    h.header_size = DJ_HEADER_SIZE;
    h.file_size = m->file_size;
    h.n_sections = ns;
    h.config = m->config;
    dj_disk_section *t = (dj_disk_section *)((uint8_t *)buf + DJ_HEADER_SIZE);
    t[0] = (dj_disk_section){DJ_SEC_TOKENIZER, 0, m->tok_off, m->tok_size, 0};
    t[1] = (dj_disk_section){DJ_SEC_EMBED, 0, m->embed_off, m->embed_size, 0};
    for (uint32_t l = 0; l < nl; l++) t[2 + l] = (dj_disk_section){DJ_SEC_LAYER, l, m->layer_off[l], m->layer.size, 0};
    t[2 + nl] = (dj_disk_section){DJ_SEC_HEAD, 0, m->head_off, m->head_size, 0};
    memcpy(buf, &h, sizeof h);
    h.crc = header_crc(buf, (const uint8_t *)t, ns * sizeof *t);
    memcpy(buf, &h, sizeof h);
    return 0;
}

// ---- parsing
static const char *section_name(uint32_t kind) {
    switch (kind) {
    case DJ_SEC_TOKENIZER: return "tokenizer";
    case DJ_SEC_EMBED: return "embedding";
    case DJ_SEC_LAYER: return "layer";
    case DJ_SEC_HEAD: return "head";
    default: return "unknown";
    }
}

typedef struct {
    uint64_t off, size;
    uint32_t kind, index;
} span;

static int span_cmp(const void *a, const void *b) {
    const span *x = a, *y = b;
    return x->off < y->off ? -1 : x->off > y->off;
}

int model_parse(const void *data, size_t n, uint64_t file_size, dj_model_info *m, dj_err *e) {
    memset(m, 0, sizeof *m);
    const uint8_t *p = data;
    if (file_size < DJ_HEADER_SIZE || n < DJ_HEADER_SIZE)
        return dj_fail(e, "not a Djinn model: %llu bytes is shorter than the %u-byte header",
                       (unsigned long long)file_size, DJ_HEADER_SIZE);
    dj_disk_header h;
    memcpy(&h, p, sizeof h);
    if (memcmp(h.magic, DJ_MAGIC, 8))
        return dj_fail(e, "not a Djinn model (bad magic): convert a HuggingFace checkpoint with ./convert/convert");
    if (h.version != DJ_VERSION)
        return dj_fail(e, "model.bin version %u, this build reads version %u: " FIX_HINT, h.version, DJ_VERSION);
    if (h.header_size != DJ_HEADER_SIZE)
        return dj_fail(e, "header size %u, expected %u: " FIX_HINT, h.header_size, DJ_HEADER_SIZE);
    if (h.file_size != file_size)
        return dj_fail(e, "file is %llu bytes but its header says %llu: truncated or damaged, " FIX_HINT,
                       (unsigned long long)file_size, (unsigned long long)h.file_size);
    for (size_t i = offsetof(dj_disk_header, pad); i < DJ_HEADER_SIZE; i++)
        if (p[i]) return dj_fail(e, "header padding byte %zu is not zero: damaged file, " FIX_HINT, i);
    const dj_config *c = &h.config;
    dj_err ce;
    if (dj_config_validate(c, &ce)) return dj_fail(e, "bad config in header: %s", ce.msg);
    if (h.n_sections != c->n_layers + 3)
        return dj_fail(e, "%u sections for %u layers, expected %u: " FIX_HINT, h.n_sections, c->n_layers,
                       c->n_layers + 3);
    uint64_t table_bytes = (uint64_t)h.n_sections * sizeof(dj_disk_section);
    if (DJ_HEADER_SIZE + table_bytes > file_size || DJ_HEADER_SIZE + table_bytes > n)
        return dj_fail(e, "section table runs past the end of the file: truncated, " FIX_HINT);

    m->config = *c;
    m->file_size = file_size;
    if (dj_layout(c, &m->layer, &m->head, e)) return -1;
    m->layer_off = calloc(c->n_layers, sizeof *m->layer_off);
    span *spans = calloc(h.n_sections, sizeof *spans);
    uint8_t *seen = calloc(c->n_layers, 1);
    int have_tok = 0, have_embed = 0, have_head = 0, rc = -1;
    if (!m->layer_off || !spans || !seen) {
        dj_fail(e, "out of memory");
        goto out;
    }
    const uint8_t *tp = p + DJ_HEADER_SIZE;
    uint64_t embed_size = (uint64_t)c->vocab_size * c->dim * dj_dtype_size(c->wtype);
    for (uint32_t i = 0; i < h.n_sections; i++) {
        dj_disk_section s;
        memcpy(&s, tp + (size_t)i * sizeof s, sizeof s);
        uint64_t end;
        if (s.reserved) {
            dj_fail(e, "%s section %u: reserved field is %llu, not zero: damaged file, " FIX_HINT, section_name(s.kind),
                    s.index, (unsigned long long)s.reserved);
            goto out;
        }
        if (s.offset % DJ_SECTION_ALIGN || s.offset < DJ_HEADER_SIZE + table_bytes ||
            dj_add_u64(s.offset, s.size, &end) || end > file_size) {
            dj_fail(e, "%s section %u: offset %llu size %llu is outside the file (%llu bytes) or misaligned: " FIX_HINT,
                    section_name(s.kind), s.index, (unsigned long long)s.offset, (unsigned long long)s.size,
                    (unsigned long long)file_size);
            goto out;
        }
        uint64_t want = 0;
        switch (s.kind) {
        case DJ_SEC_TOKENIZER:
            if (have_tok++) break;
            m->tok_off = s.offset, m->tok_size = want = s.size;
            if (!s.size) {
                dj_fail(e, "tokenizer section is empty: " FIX_HINT);
                goto out;
            }
            break;
        case DJ_SEC_EMBED:
            if (have_embed++) break;
            m->embed_off = s.offset, m->embed_size = s.size, want = embed_size;
            break;
        case DJ_SEC_HEAD:
            if (have_head++) break;
            m->head_off = s.offset, m->head_size = s.size, want = m->head.size;
            break;
        case DJ_SEC_LAYER:
            if (s.index >= c->n_layers) {
                dj_fail(e, "layer section index %u, model has %u layers: " FIX_HINT, s.index, c->n_layers);
                goto out;
            }
            if (seen[s.index]++) break;
            m->layer_off[s.index] = s.offset, want = m->layer.size;
            break;
        default:
            dj_fail(e, "section %u has unknown kind %u: " FIX_HINT, i, s.kind);
            goto out;
        }
        if (s.kind != DJ_SEC_LAYER && s.index) {
            dj_fail(e, "%s section has index %u, expected 0: damaged file, " FIX_HINT, section_name(s.kind), s.index);
            goto out;
        }
        if ((s.kind == DJ_SEC_TOKENIZER && have_tok > 1) || (s.kind == DJ_SEC_EMBED && have_embed > 1) ||
            (s.kind == DJ_SEC_HEAD && have_head > 1) || (s.kind == DJ_SEC_LAYER && seen[s.index] > 1)) {
            dj_fail(e, "duplicate %s section %u: " FIX_HINT, section_name(s.kind), s.index);
            goto out;
        }
        if (s.size != want) {
            dj_fail(e, "%s section %u is %llu bytes, expected %llu for this config: " FIX_HINT, section_name(s.kind),
                    s.index, (unsigned long long)s.size, (unsigned long long)want);
            goto out;
        }
        spans[i] = (span){s.offset, s.size, s.kind, s.index};
    }
    // n_layers + 3 sections without duplicates means each kind is present exactly once.
    qsort(spans, h.n_sections, sizeof *spans, span_cmp);
    for (uint32_t i = 1; i < h.n_sections; i++)
        if (spans[i - 1].off + spans[i - 1].size > spans[i].off) {
            dj_fail(e, "%s section %u overlaps %s section %u: " FIX_HINT, section_name(spans[i - 1].kind),
                    spans[i - 1].index, section_name(spans[i].kind), spans[i].index);
            goto out;
        }
    // Structure checked; the CRC last, so that fuzzers exercise the checks above.
    if (header_crc(p, tp, table_bytes) != h.crc) {
        dj_fail(e, "header checksum mismatch: damaged file, " FIX_HINT);
        goto out;
    }
    rc = 0;
out:
    free(spans);
    free(seen);
    if (rc) dj_info_free(m);
    return rc;
}

// ---- loading
// Every section is read by several threads into anonymous memory. For the GPU the sections that travel
// (layers, head, and the embeddings when they are the tied head) are page-locked one by one with
// cudaHostRegister as they land, so every H2D copy of a slab runs at full PCIe speed; a slab never spans
// two registrations, so each copy stays on the pinned path.
#define LOAD_CHUNK (64ull << 20)

typedef struct {
    int fd;
    uint8_t *base;
    const dj_model_info *info;
    int pin;
    uint32_t n_jobs;
    _Atomic uint32_t next_job;
    _Atomic uint64_t done_bytes;
    _Atomic int failed;
    _Atomic int pin_failed;          // sections left pageable because page-locking was refused
    _Atomic uint64_t pin_failed_bytes;
    dj_err pin_err;                  // the first refusal
    dj_err err;
    pthread_mutex_t err_lock;
} load_ctx;

// Job j of LOAD_JOBS: the header and section table, then the sections: tokenizer, embed, layers..., head.
#define LOAD_JOBS(m) ((m)->config.n_layers + 4)
static void job_span(const dj_model_info *m, uint32_t j, uint64_t *off, uint64_t *size, int *pin) {
    uint32_t nl = m->config.n_layers;
    if (j == 0) *off = 0, *size = model_header_bytes(nl), *pin = 0;
    else if (j == 1) *off = m->tok_off, *size = m->tok_size, *pin = 0;
    else if (j == 2) *off = m->embed_off, *size = m->embed_size, *pin = m->config.tied;
    else if (j < 3 + nl) *off = m->layer_off[j - 3], *size = m->layer.size, *pin = 1;
    else *off = m->head_off, *size = m->head_size, *pin = 1;
}

static void load_fail(load_ctx *c, const char *msg) {
    pthread_mutex_lock(&c->err_lock);
    if (!c->failed) dj_fail(&c->err, "%s", msg);
    c->failed = 1;
    pthread_mutex_unlock(&c->err_lock);
}

static void *load_worker(void *arg) {
    load_ctx *c = arg;
    for (;;) {
        uint32_t j = c->next_job++;
        if (j >= c->n_jobs || c->failed) return NULL;
        uint64_t off, size, prev_off, prev_size;
        int pin, prev_pin;
        job_span(c->info, j, &off, &size, &pin);
        // The read also takes the padding before the section, so the buffer is the whole file.
        uint64_t from = 0;
        if (j > 0) job_span(c->info, j - 1, &prev_off, &prev_size, &prev_pin), from = prev_off + prev_size;
        for (uint64_t at = from; at < off + size && !c->failed;) {
            size_t want = (size_t)(off + size - at < LOAD_CHUNK ? off + size - at : LOAD_CHUNK);
            ssize_t got = pread(c->fd, c->base + at, want, (off_t)at);
            if (got <= 0) {
                char msg[256];
                if (got < 0) snprintf(msg, sizeof msg, "read error at byte %llu: %s", (unsigned long long)at,
                                      strerror(errno));
                else snprintf(msg, sizeof msg, "the file shrank to %llu bytes while loading (changed on disk?)",
                              (unsigned long long)at);
                load_fail(c, msg);
                return NULL;
            }
            at += (uint64_t)got;
            c->done_bytes += (uint64_t)got;
        }
        // Page-locking refused (a locked-memory limit, a busy system): the section stays pageable; the
        // caller warns with the cost.
        dj_err ge;
        if (c->pin && pin && gpu_host_register(c->base + off, size, 0, &ge)) {
            pthread_mutex_lock(&c->err_lock);
            if (!c->pin_failed) c->pin_err = ge;
            c->pin_failed++;
            c->pin_failed_bytes += size;
            pthread_mutex_unlock(&c->err_lock);
        }
    }
}

static int read_header(int fd, uint64_t file_size, dj_model_info *info, dj_err *e) {
    size_t n = (size_t)(DJ_HEADER_SIZE + (DJ_MAX_LAYERS + 3) * sizeof(dj_disk_section));
    if (n > file_size) n = (size_t)file_size;
    uint8_t *buf = malloc(n ? n : 1);
    if (!buf) return dj_fail(e, "out of memory");
    ssize_t got = pread(fd, buf, n, 0);
    int rc = got != (ssize_t)n ? dj_fail(e, "cannot read the header: %s", got < 0 ? strerror(errno) : "short read")
                               : model_parse(buf, n, file_size, info, e);
    free(buf);
    return rc;
}

int model_load(const char *path, const dj_load_opts *o, dj_model *m, dj_err *e) {
    memset(m, 0, sizeof *m);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return dj_fail(e, "cannot open %s: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) || !S_ISREG(st.st_mode)) {
        close(fd);
        return dj_fail(e, "%s is not a regular file", path);
    }
    uint64_t size = (uint64_t)st.st_size;
    dj_err pe;
    if (read_header(fd, size, &m->info, &pe)) {
        close(fd);
        return dj_fail(e, "%s: %s", path, pe.msg);
    }
    // Anonymous memory, read in parallel; for the GPU each travelling section is registered as it lands. (Not
    // an mmap of the file: a file truncated under a mapping kills the process with SIGBUS mid-generation,
    // where a read reports it.)
    void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
        close(fd);
        dj_info_free(&m->info);
        return dj_fail(e, "cannot allocate %.2f GB of host memory for %s", (double)size / 1e9, path);
    }
    madvise(p, size, MADV_HUGEPAGE);
    load_ctx c = {.fd = fd, .base = p, .info = &m->info, .pin = o->want_pinned && !o->no_pin,
                  .n_jobs = LOAD_JOBS(&m->info)};
    pthread_mutex_init(&c.err_lock, NULL);
    int nt = o->threads > 0 ? o->threads : 8;
    pthread_t th[64];
    if (nt > 64) nt = 64;
    dj_progress pr;
    dj_progress_start(&pr, "loading", size, !o->quiet);
    int started = 0;
    for (; started < nt; started++)
        if (pthread_create(&th[started], NULL, load_worker, &c)) break;
    if (!started) load_worker(&c);
    while (started && c.next_job < c.n_jobs + (uint32_t)started && !c.failed) {
        dj_progress_update(&pr, c.done_bytes);
        usleep(50000);
    }
    for (int i = 0; i < started; i++) pthread_join(th[i], NULL);
    struct stat st2;  // a file rewritten or resized while it was read is not the file that was validated
    if (!c.failed && (fstat(fd, &st2) || (uint64_t)st2.st_size != size || st2.st_mtim.tv_sec != st.st_mtim.tv_sec ||
                      st2.st_mtim.tv_nsec != st.st_mtim.tv_nsec))
        load_fail(&c, "the file changed on disk while it was loading: load it again once it is complete");
    close(fd);
    pthread_mutex_destroy(&c.err_lock);
    m->data = p, m->data_size = size, m->for_gpu = o->want_pinned, m->pinned = c.pin && !c.pin_failed;
    m->pin_tried = c.pin;
    if (c.failed) {
        dj_progress_abort(&pr);
        model_free(m);
        return dj_fail(e, "%s: %s", path, c.err.msg);
    }
    dj_progress_end(&pr, c.done_bytes);
    if (c.pin_failed)
        fprintf(stderr, "djinn: warning: could not page-lock %.2f GB of weights (%s): those layers are copied from "
                        "pageable memory, about 7 GB/s instead of ~50 GB/s, and without overlap\n",
                (double)c.pin_failed_bytes / 1e9, c.pin_err.msg);
    else if (o->want_pinned && !c.pin)
        fprintf(stderr, "djinn: warning: --no-pin: weights are copied from pageable memory, about 7 GB/s instead "
                        "of ~50 GB/s, and without overlap\n");
    return 0;
}

void model_free(dj_model *m) {
    if (m->data) {
        if (m->pin_tried) {
            for (uint32_t j = 0; j < LOAD_JOBS(&m->info); j++) {
                uint64_t off, size;
                int pin;
                job_span(&m->info, j, &off, &size, &pin);
                if (pin) gpu_host_unregister(m->data + off, NULL);  // fails harmlessly where it never registered
            }
        }
        munmap(m->data, m->data_size);
    }
    dj_info_free(&m->info);
    memset(m, 0, sizeof *m);
}

// ---- GPU forward: resident units and the streaming ring
// Units are layer 0..n_layers-1 and the head (n_layers). The plan (ringbuf.h) keeps as many resident as
// the budget allows; the rest stream through the skip-end ring every forward pass: H2D copies on the copy
// stream, kernels on the compute stream, per-slot events copied[] (copy done) and freed[] (slot's
// compute done). Streamed copies form one endless sequence (seq s -> unit stream_order[s % n_streamed]),
// so the next pass's first streamed layers are already copying while this pass's resident layers, the
// head and sampling run. A copy may be issued only once the freed[] record it waits on has been enqueued
// (cudaStreamWaitEvent binds to the latest record at call time), which the ring's live >= 2 guarantees
// for the copy ahead of the unit computing now.
#define GPU_ALIGN 4096u
#define GPU_MAX_BATCH 4096  // most tokens one pass processes (prefill of a longer prompt takes several)
#define GPU_LOGIT_ROWS 64   // head rows computed per chunk when every position's logits are wanted
#define PROF_CATS 10
#define PROF_EVENTS 1024

// A matrix of a unit, for the CPU share: at byte offset `off` of its region, (n_out, n_in) in wtype; rows
// [0, gpu_rows) are the GPU's, the rest the CPU's in decode passes.
typedef struct {
    uint64_t off;
    int64_t n_in, n_out, gpu_rows;
} sp_mat;

struct dj_gpu_state {
    const dj_model *m;
    dj_gpu_opts opts;
    dj_gpu *g;
    cudaStream_t compute, copy;
    rb_plan *plan;
    rb_ring ring;
    uint8_t *d_w;                    // (plan->weight_bytes): resident units, then the ring
    uint64_t head_lm_off;            // lm_head offset inside the head unit on the device
    int fused_qkv, fused_gate_up;    // wq|wk|wv and w_gate|w_up adjacent in the slab: one matmul each
    int tc_attn;                     // prefill attention on the tensor cores (head_dim allows, no fma_attn)
    int64_t max_seq, max_batch;
    float *d_inv_freq;               // (head_dim/2)
    float *d_k, *d_v;                // (n_layers, n_kv_heads, max_seq, head_dim) each
    float *d_x, *d_xb, *d_delta;     // (max_batch, dim)
    float *d_qkv;                    // (max_batch, q_dim + 2 kv_dim)
    float *d_att;                    // (max_batch, q_dim)
    float *d_ffn;                    // (max_batch, 2 hidden)
    float *d_hb;                     // (max_batch, hidden)
    float *d_logits;                 // (GPU_LOGIT_ROWS, vocab)
    int32_t *d_pos;                  // (1) position of the pass's first token
    float *h_x;                      // pinned (max_batch, dim): gathered embedding rows
    float *h_logits;                 // pinned (GPU_LOGIT_ROWS, vocab)
    int32_t *h_pos;                  // pinned (1)
    // streaming state
    cudaEvent_t copied[RB_MAX_SLOTS], freed[RB_MAX_SLOTS], prev_done;
    int n_tev;                       // timing event pairs, indexed by seq % n_tev
    cudaEvent_t *c0, *c1, *w0, *w1;  // copy start/end (copy stream), wait start/end (compute stream)
    rb_alloc pend;                   // allocated in the ring, copy not issued yet (have_pend)
    int have_pend;
    int64_t issued, computed, harvested;  // streamed seqs: copies issued; computes enqueued; stats taken
    uint64_t *seq_off;               // (n_tev) ring offset of seq s at [s % n_tev]
    int *seq_slot;                   // (n_tev)
    cudaGraphExec_t graph;           // the all-resident decode step, captured on first use
    // CPU share (dj_gpu_opts.cpu_share): in a decode pass the CPU computes the last rows of every streamed
    // matrix from host memory (cpu_matvec) while the GPU computes the others; those rows never cross PCIe.
    double share;                    // fraction in effect; 0: off
    sp_mat lmats[7];                 // a layer's matrices in slab order (fused q|k|v and gate|up: one each)
    int n_lmats;
    sp_mat hmat;                     // the lm_head, in its region (the head slab; tied: the embedding table)
    uint64_t part_bytes[2], cpu_bytes[2];  // a layer [0], the head [1]: bytes a decode copy moves; the CPU's
    float *h_cx, *h_cy, *d_cy;       // pinned: x for the CPU; its rows' results (d_cy: the GPU's mapped view)
    cudaEvent_t x_ready;             // h_cx has landed
    uint8_t *seq_part;               // (n_tev) seq s's copy left out the CPU's rows
    uint64_t *seq_bytes;             // (n_tev) bytes seq s's copy moved
    int64_t pass_T, pass_end;        // the pass running: its tokens; streamed seqs below pass_end are its units
    int warming;                     // in gpu_warm_up: the copies issued ahead for the next pass are whole
    double warm_h2d;                 // GB/s of the warm-up's copies (the automatic share's H2D rate)
    const uint8_t *cur_host;         // the unit computing now is split: its host slab; NULL: all on the GPU
    dj_gpu_stats st;
    // DJINN_PROFILE=1: events between the kernels of each layer, summed per phase (prefill and decode apart)
    // and printed when the state is freed. Off by default: the events cost a little and block graphs.
    int prof, prof_n, prof_last;
    cudaEvent_t prof_ev[PROF_EVENTS];
    int prof_cat[PROF_EVENTS];
    double prof_ms[2][PROF_CATS];
    int64_t prof_passes[2];
};

static const char *prof_names[PROF_CATS] = {"norms", "qkv matmul", "rope+kv write", "attention", "wo matmul",
                                            "gate/up matmul", "swiglu", "down matmul", "head", "other"};

static int gpu_warm_up(dj_gpu_state *s, dj_err *e);
static void share_auto(dj_gpu_state *s);
static void share_stats(dj_gpu_state *s);

// ---- profiling (DJINN_PROFILE=1)
// Marks the end of a kernel group of category cat on the compute stream.
static void prof_mark(dj_gpu_state *s, int cat) {
    if (!s->prof || s->prof_n >= PROF_EVENTS) return;
    if (gpu_event_record(s->prof_ev[s->prof_n], s->compute, NULL) == 0) s->prof_cat[s->prof_n++] = cat;
}

// After the pass's synchronisation: time between consecutive marks goes to the later mark's category.
static void prof_collect(dj_gpu_state *s, int decode) {
    if (!s->prof) return;
    for (int i = 1; i < s->prof_n; i++) {
        float ms;
        if (gpu_event_ms(&ms, s->prof_ev[i - 1], s->prof_ev[i], NULL) == 0) s->prof_ms[decode][s->prof_cat[i]] += ms;
    }
    s->prof_passes[decode]++;
    s->prof_n = 0;
}

static void prof_print(const dj_gpu_state *s) {
    for (int d = 0; d < 2; d++) {
        if (!s->prof_passes[d]) continue;
        double tot = 0;
        for (int c = 0; c < PROF_CATS; c++) tot += s->prof_ms[d][c];
        fprintf(stderr, "profile (%s, %lld passes, %.3f ms per pass):", d ? "decode" : "prefill",
                (long long)s->prof_passes[d], tot / (double)s->prof_passes[d]);
        for (int c = 0; c < PROF_CATS; c++)
            if (s->prof_ms[d][c] > 0)
                fprintf(stderr, " %s %.3f ms (%.0f%%);", prof_names[c], s->prof_ms[d][c] / (double)s->prof_passes[d],
                        100 * s->prof_ms[d][c] / tot);
        fputc('\n', stderr);
    }
}

static uint64_t unit_bytes(const dj_model *m, int u, uint64_t *lm_off) {
    const dj_model_info *in = &m->info;
    if (u < (int)in->config.n_layers) return in->layer.size;
    // Head: its slab, then (tied) the embedding table copied in as the lm_head.
    *lm_off = in->config.tied ? in->head.size : in->head.lm_head;
    return in->config.tied ? in->head.size + dj_align_up(in->embed_size, GPU_ALIGN) : in->head.size;
}

// Copies a region of `size` bytes holding the matrices `mats` (slab order) from src to dst: whole (part 0);
// everything but the CPU's rows of each matrix (part 1: what a decode pass needs on the GPU); only those rows
// (part 2: what completes a part-1 copy). *bytes += the bytes moved.
static int region_copy(uint8_t *dst, const uint8_t *src, uint64_t size, const sp_mat *mats, int n, size_t ws,
                       int part, uint64_t *bytes, cudaStream_t st, dj_err *e) {
    if (part == 0) {
        *bytes += size;
        return gpu_h2d_async(dst, src, size, st, e);
    }
    uint64_t start = 0;
    for (int i = 0; i <= n; i++) {
        uint64_t cut = size, end = size;
        if (i < n) {
            uint64_t rb = (uint64_t)mats[i].n_in * ws;
            cut = mats[i].off + (uint64_t)mats[i].gpu_rows * rb, end = mats[i].off + (uint64_t)mats[i].n_out * rb;
        }
        uint64_t b = part == 1 ? start : cut, x = part == 1 ? cut : end;
        if (x > b) {
            if (gpu_h2d_async(dst + b, src + b, x - b, st, e)) return -1;
            *bytes += x - b;
        }
        start = end;
    }
    return 0;
}

// One unit host -> device (part: as region_copy): a layer's slab; the head's slab, and for a tied head the
// embedding table after it as the lm_head.
static int unit_copy(dj_gpu_state *s, int u, uint8_t *dst, cudaStream_t st, int part, uint64_t *bytes, dj_err *e) {
    const dj_model *m = s->m;
    size_t ws = dj_dtype_size(m->info.config.wtype);
    if (u < (int)m->info.config.n_layers)
        return region_copy(dst, dj_layer_ptr(m, (uint32_t)u), m->info.layer.size, s->lmats, s->n_lmats, ws, part,
                           bytes, st, e);
    if (!m->info.config.tied)
        return region_copy(dst, dj_head_ptr(m), m->info.head.size, &s->hmat, 1, ws, part, bytes, st, e);
    if (part != 2 && region_copy(dst, dj_head_ptr(m), m->info.head.size, NULL, 0, ws, 0, bytes, st, e)) return -1;
    return region_copy(dst + s->head_lm_off, dj_embed_ptr(m), m->info.embed_size, &s->hmat, 1, ws, part, bytes, st, e);
}

// A matrix at `off`, (n_out, n_in), with `share` of its rows (rounded down) on the CPU.
static sp_mat sp_split(uint64_t off, int64_t n_in, int64_t n_out, double share) {
    return (sp_mat){off, n_in, n_out, n_out - (int64_t)((double)n_out * share)};
}

// Bytes of the matrices' rows: all of them, or (cpu_only) the CPU's.
static uint64_t sp_bytes(const sp_mat *mats, int n, size_t ws, int cpu_only) {
    uint64_t b = 0;
    for (int i = 0; i < n; i++)
        b += (uint64_t)(mats[i].n_out - (cpu_only ? mats[i].gpu_rows : 0)) * (uint64_t)mats[i].n_in * ws;
    return b;
}

// The matrices as split with `share` of each one's rows on the CPU (0: none), and the bytes each kind of unit
// moves in a decode pass.
static void split_setup(dj_gpu_state *s, double share) {
    const dj_config *c = &s->m->info.config;
    const dj_layer_layout *L = &s->m->info.layer;
    int64_t dim = c->dim, q = (int64_t)c->n_heads * c->head_dim, kv = (int64_t)c->n_kv_heads * c->head_dim,
            hid = c->hidden_dim;
    uint64_t ws = dj_dtype_size(c->wtype);
    int n = 0;
    s->share = share;
#define MAT(o, ni, no) (s->lmats[n++] = sp_split((o), (ni), (no), share))
    if (s->fused_qkv) {
        MAT(L->wq, dim, q + 2 * kv);
    } else {
        MAT(L->wq, dim, q), MAT(L->wk, dim, kv), MAT(L->wv, dim, kv);
    }
    MAT(L->wo, q, dim);
    if (s->fused_gate_up) {
        MAT(L->w_gate, dim, 2 * hid);
    } else {
        MAT(L->w_gate, dim, hid), MAT(L->w_up, dim, hid);
    }
    MAT(L->w_down, hid, dim);
#undef MAT
    s->n_lmats = n;
    int64_t vocab = c->vocab_size;
    s->hmat = sp_split(c->tied ? 0 : s->m->info.head.lm_head, dim, vocab, share);
    uint64_t tot[2] = {s->m->info.layer.size, s->m->info.head.size + (c->tied ? s->m->info.embed_size : 0)};
    s->cpu_bytes[0] = sp_bytes(s->lmats, n, ws, 1), s->cpu_bytes[1] = sp_bytes(&s->hmat, 1, ws, 1);
    for (int k = 0; k < 2; k++) s->part_bytes[k] = tot[k] - s->cpu_bytes[k];
}

void gpu_state_free(dj_gpu_state *s) {
    if (!s) return;
    if (s->compute) gpu_stream_sync(s->compute, NULL);
    if (s->copy) gpu_stream_sync(s->copy, NULL);
    for (int i = 0; i < RB_MAX_SLOTS; i++) {
        if (s->copied[i]) gpu_event_destroy(s->copied[i]);
        if (s->freed[i]) gpu_event_destroy(s->freed[i]);
    }
    if (s->prev_done) gpu_event_destroy(s->prev_done);
    if (s->x_ready) gpu_event_destroy(s->x_ready);
    if (s->graph) gpu_graph_destroy(s->graph);
    if (s->prof) prof_print(s);
    for (int i = 0; i < PROF_EVENTS; i++)
        if (s->prof_ev[i]) gpu_event_destroy(s->prof_ev[i]);
    for (int i = 0; i < s->n_tev; i++) {
        cudaEvent_t *evs[] = {s->c0, s->c1, s->w0, s->w1};
        for (int k = 0; k < 4; k++)
            if (evs[k] && evs[k][i]) gpu_event_destroy(evs[k][i]);
    }
    free(s->c0), free(s->c1), free(s->w0), free(s->w1), free(s->seq_off), free(s->seq_slot), free(s->seq_part);
    free(s->seq_bytes);
    void *dev[] = {s->d_w, s->d_inv_freq, s->d_k, s->d_v, s->d_x, s->d_xb, s->d_delta, s->d_qkv,
                   s->d_att, s->d_ffn, s->d_hb, s->d_logits, s->d_pos};
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++) gpu_free(dev[i]);
    gpu_host_free(s->h_x), gpu_host_free(s->h_logits), gpu_host_free(s->h_pos), gpu_host_free(s->h_cx);
    gpu_host_free(s->h_cy);
    if (s->compute) gpu_stream_destroy(s->compute);
    if (s->copy) gpu_stream_destroy(s->copy);
    gpu_close(s->g);
    free(s->plan);
    free(s);
}

dj_gpu_state *gpu_state_new(const dj_model *m, const dj_gpu_opts *o, dj_err *e) {
    const dj_config *c = &m->info.config;
    if (!m->for_gpu) {
        dj_fail(e, "internal error: the model was not loaded for the GPU (model_load with want_pinned)");
        return NULL;
    }
    dj_gpu_state *s = calloc(1, sizeof *s);
    if (!s || !(s->plan = calloc(1, sizeof *s->plan))) {
        free(s);
        dj_fail(e, "out of memory");
        return NULL;
    }
    s->m = m;
    s->opts = *o;
    if (gpu_open(&s->g, 0, e) || gpu_stream_create(&s->compute, e) || gpu_stream_create(&s->copy, e)) goto fail;

    int64_t dim = c->dim, hd = c->head_dim, q = (int64_t)c->n_heads * hd, kv = (int64_t)c->n_kv_heads * hd,
            hid = c->hidden_dim, vocab = c->vocab_size, nl = c->n_layers, ws = (int64_t)dj_dtype_size(c->wtype);
    const dj_layer_layout *L = &m->info.layer;
    s->fused_qkv = L->wk == L->wq + (uint64_t)(q * dim * ws) && L->wv == L->wk + (uint64_t)(kv * dim * ws);
    s->fused_gate_up = L->w_up == L->w_gate + (uint64_t)(hid * dim * ws);
    s->tc_attn = !o->fma_attn && gpu_tc_attn_supported(s->g, hd);
    gpu_set_tc_attn(s->g, s->tc_attn);
    if (!o->quiet)
        fprintf(stderr, "gpu: prefill attention: %s\n",
                s->tc_attn ? "tensor cores (bf16x3)"
                           : o->fma_attn ? "fp32 FMA kernel (--fma-attn)"
                                         : "fp32 FMA kernel (the tensor-core kernel needs head_dim a multiple of 16 "
                                           "up to 256)");
    s->max_seq = o->max_seq;
    s->max_batch = o->max_batch > 0 ? o->max_batch : GPU_MAX_BATCH;
    if (s->max_batch > s->max_seq) s->max_batch = s->max_seq;

    // Everything outside the weight budget, so that the automatic budget and the free-memory check see it.
    uint64_t kv_bytes = 2ull * (uint64_t)nl * (uint64_t)c->n_kv_heads * (uint64_t)s->max_seq * (uint64_t)hd * 4;
    uint64_t mb = (uint64_t)s->max_batch;
    uint64_t act_bytes = 4 * (mb * (uint64_t)(3 * dim + q + 2 * kv + q + 3 * hid) + GPU_LOGIT_ROWS * (uint64_t)vocab);
    uint64_t scratch = gpu_matmul_scratch(c->wtype, s->max_batch, hid > dim ? hid : (q > dim ? q : dim));
    uint64_t att_scratch = gpu_attention_scratch(c->n_heads, hd, s->max_seq);
    if (att_scratch > scratch) scratch = att_scratch;
    uint64_t other = kv_bytes + act_bytes + scratch + (64ull << 20);  // + cuBLAS workspace and slack
    size_t free_b, total_b;
    if (gpu_mem_info(&free_b, &total_b, e)) goto fail;
    uint64_t margin = 512ull << 20;
    uint64_t budget;
    if (free_b < other + margin) {
        dj_fail(e, "GPU has %.2f GB free, not enough for the KV cache (%.2f GB for -c %lld) and activations "
                   "(%.2f GB): lower -c", (double)free_b / 1e9, (double)kv_bytes / 1e9, (long long)s->max_seq,
                (double)(act_bytes + scratch) / 1e9);
        goto fail;
    }
    if (o->ring_gb > 0) {
        budget = rb_gb_bytes(o->ring_gb);
        if (budget + other > free_b) {
            dj_fail(e, "--ring-gb %.2f is more than the GPU can give: %.2f GB free, of which %.2f GB go to the KV "
                       "cache (-c %lld) and activations; use --ring-gb %.2f or less", o->ring_gb, (double)free_b / 1e9,
                    (double)other / 1e9, (long long)s->max_seq, (double)(free_b - other - margin) / 1e9);
            goto fail;
        }
    } else {
        budget = free_b - other - margin;
    }

    // The plan: units in forward order, the head last.
    uint64_t sizes[RB_MAX_UNITS];
    for (int u = 0; u <= nl; u++) sizes[u] = unit_bytes(m, u, &s->head_lm_off);
    if (rb_plan_make(s->plan, sizes, (int)nl + 1, budget, 0, GPU_ALIGN, o->stream_all, e)) goto fail;
    rb_plan *p = s->plan;
    if (p->weight_bytes + other > free_b) {
        dj_fail(e, "--ring-gb %.2f needs %.2f GB of GPU memory for weights plus %.2f GB for the KV cache (-c %lld) "
                   "and activations, but only %.2f GB are free", (double)budget / 1e9, (double)p->weight_bytes / 1e9,
                (double)other / 1e9, (long long)s->max_seq, (double)free_b / 1e9);
        goto fail;
    }
    if (!o->quiet) {
        fprintf(stderr, "gpu: %s\n", gpu_name(s->g));
        fprintf(stderr, "gpu: weight budget %.2f GB%s: %d of %d layers + head resident (%.2f GB), %d units streamed "
                        "(%.2f GB per token over PCIe, ring %.2f GB, %d slots)%s%s\n",
                (double)budget / 1e9, o->ring_gb > 0 ? " (--ring-gb)" : " (free memory minus KV cache and activations)",
                p->n_resident - (p->resident[nl] ? 1 : 0), (int)nl, (double)p->resident_bytes / 1e9, p->n_streamed,
                (double)p->streamed_bytes / 1e9, (double)p->ring_size / 1e9, p->slots,
                o->stream_all ? ", --stream-all" : "", o->sync_copy ? ", --sync-copy" : "");
        fprintf(stderr, "gpu: KV cache %.2f GB (context %lld, f32), activations %.2f GB\n", (double)kv_bytes / 1e9,
                (long long)s->max_seq, (double)(act_bytes + scratch) / 1e9);
    }
    s->st.bytes_per_token = p->streamed_bytes;
    s->st.n_resident = p->n_resident;
    s->st.n_streamed = p->n_streamed;
    split_setup(s, 0);
    int want_share = o->cpu_share != 0 && p->n_streamed;
    if (o->cpu_share != 0 && !p->n_streamed && !o->quiet)
        fprintf(stderr, "gpu: --cpu-share: every layer is resident, so the GPU computes everything\n");

    // Device memory, each allocation named so that an out-of-memory error says what did not fit.
    if (gpu_malloc((void **)&s->d_w, p->weight_bytes, "weights (resident layers and the ring)", e) ||
        gpu_malloc((void **)&s->d_k, kv_bytes / 2, "KV cache (keys)", e) ||
        gpu_malloc((void **)&s->d_v, kv_bytes / 2, "KV cache (values)", e) ||
        gpu_malloc((void **)&s->d_inv_freq, (size_t)hd / 2 * 4, "rope table", e) ||
        gpu_malloc((void **)&s->d_x, mb * (uint64_t)dim * 4, "activations", e) ||
        gpu_malloc((void **)&s->d_xb, mb * (uint64_t)dim * 4, "activations", e) ||
        gpu_malloc((void **)&s->d_delta, mb * (uint64_t)dim * 4, "activations", e) ||
        gpu_malloc((void **)&s->d_qkv, mb * (uint64_t)(q + 2 * kv) * 4, "activations", e) ||
        gpu_malloc((void **)&s->d_att, mb * (uint64_t)q * 4, "activations", e) ||
        gpu_malloc((void **)&s->d_ffn, mb * (uint64_t)(2 * hid) * 4, "activations", e) ||
        gpu_malloc((void **)&s->d_hb, mb * (uint64_t)hid * 4, "activations", e) ||
        gpu_malloc((void **)&s->d_logits, GPU_LOGIT_ROWS * (uint64_t)vocab * 4, "logits", e) ||
        gpu_malloc((void **)&s->d_pos, 4, "position", e) || gpu_reserve(s->g, scratch, e) ||
        gpu_host_alloc((void **)&s->h_x, mb * (uint64_t)dim * 4, "embedding staging", e) ||
        gpu_host_alloc((void **)&s->h_logits, GPU_LOGIT_ROWS * (uint64_t)vocab * 4, "logits staging", e) ||
        gpu_host_alloc((void **)&s->h_pos, 4, "position staging", e))
        goto fail;
    if (want_share) {
        int64_t most_in = hid > dim ? hid : dim, most_out = 2 * hid;
        if (q > most_in) most_in = q;
        if (q + 2 * kv > most_out) most_out = q + 2 * kv;
        if (vocab > most_out) most_out = vocab;
        if (gpu_host_alloc((void **)&s->h_cx, (size_t)most_in * 4, "the CPU share's input", e) ||
            gpu_host_alloc((void **)&s->h_cy, (size_t)most_out * 4, "the CPU share's output", e) ||
            gpu_host_device_ptr((void **)&s->d_cy, s->h_cy, e) || gpu_event_create(&s->x_ready, 0, e))
            goto fail;
    }
    float *inv = malloc((size_t)hd / 2 * 4);
    if (!inv) {
        dj_fail(e, "out of memory");
        goto fail;
    }
    cpu_rope_freqs(c, inv);
    int rc = gpu_h2d(s->d_inv_freq, inv, (size_t)hd / 2 * 4, e);
    free(inv);
    if (rc) goto fail;

    // Resident units: copied once.
    for (int u = 0; u <= nl; u++)
        if (p->resident[u] && unit_copy(s, u, s->d_w + p->offset[u], s->copy, 0, &(uint64_t){0}, e)) goto fail;
    if (gpu_stream_sync(s->copy, e)) goto fail;

    // Streaming: events and the ring.
    if (p->n_streamed) {
        if (rb_ring_init(&s->ring, p->ring_size, GPU_ALIGN, p->slots, e)) goto fail;
        for (int i = 0; i < p->slots; i++)
            if (gpu_event_create(&s->copied[i], 0, e) || gpu_event_create(&s->freed[i], 0, e)) goto fail;
        if (gpu_event_create(&s->prev_done, 0, e)) goto fail;
        s->n_tev = p->n_streamed + RB_MAX_SLOTS + 1;
        s->c0 = calloc((size_t)s->n_tev, sizeof(cudaEvent_t)), s->c1 = calloc((size_t)s->n_tev, sizeof(cudaEvent_t));
        s->w0 = calloc((size_t)s->n_tev, sizeof(cudaEvent_t)), s->w1 = calloc((size_t)s->n_tev, sizeof(cudaEvent_t));
        s->seq_off = calloc((size_t)s->n_tev, sizeof *s->seq_off);
        s->seq_slot = calloc((size_t)s->n_tev, sizeof *s->seq_slot);
        s->seq_part = calloc((size_t)s->n_tev, sizeof *s->seq_part);
        s->seq_bytes = calloc((size_t)s->n_tev, sizeof *s->seq_bytes);
        if (!s->c0 || !s->c1 || !s->w0 || !s->w1 || !s->seq_off || !s->seq_slot || !s->seq_part || !s->seq_bytes) {
            dj_fail(e, "out of memory");
            goto fail;
        }
        for (int i = 0; i < s->n_tev; i++)
            if (gpu_event_create(&s->c0[i], 1, e) || gpu_event_create(&s->c1[i], 1, e) ||
                gpu_event_create(&s->w0[i], 1, e) || gpu_event_create(&s->w1[i], 1, e))
                goto fail;
    }
    const char *pe = getenv("DJINN_PROFILE");
    if (pe && *pe == '1') {
        for (int i = 0; i < PROF_EVENTS; i++)
            if (gpu_event_create(&s->prof_ev[i], 1, e)) goto fail;
        s->prof = 1;
    }
    if (want_share && o->cpu_share > 0) split_setup(s, o->cpu_share < 0.95 ? o->cpu_share : 0.95);
    if (gpu_warm_up(s, e)) goto fail;
    if (want_share && o->cpu_share < 0) share_auto(s);
    share_stats(s);
    if (s->share > 0 && !o->quiet)
        fprintf(stderr, "gpu: CPU share %.2f%s: in decode the CPU computes that part of every streamed matrix from "
                        "host memory: %.2f GB per token over PCIe, %.2f GB read by the CPU (%d threads)\n",
                s->share, o->cpu_share < 0 ? " (automatic)" : "", (double)s->st.bytes_per_token / 1e9,
                (double)s->st.cpu_bytes_per_token / 1e9, cpu_threads());
    return s;
fail:
    gpu_state_free(s);
    return NULL;
}

static int stream_unit(const dj_gpu_state *s, int64_t seq) { return s->plan->stream_order[seq % s->plan->n_streamed]; }

// Issues every streamed copy whose slot is known to be free once the compute stream gets there: its wait
// (the freed[] record of the slab it displaces) must already be enqueued. --sync-copy issues only the copy
// the compute stream needs next, after everything enqueued so far (no overlap).
static int issue_copies(dj_gpu_state *s, dj_err *e) {
    rb_plan *p = s->plan;
    if (!p->n_streamed) return 0;
    for (;;) {
        if (s->opts.sync_copy && s->issued > s->computed) return 0;
        if (s->issued - s->harvested >= s->n_tev - 1) return 0;  // timing records still unread
        if (!s->have_pend) {
            int u = stream_unit(s, s->issued);
            if (rb_ring_alloc(&s->ring, p->footprint[u], &s->pend, e)) return -1;
            s->have_pend = 1;
        }
        if (s->pend.wait_seq >= s->computed) return 0;  // the slab it displaces is not computed yet
        int64_t seq = s->issued, i = seq % s->n_tev;
        int u = stream_unit(s, seq);
        if (s->opts.sync_copy &&
            (gpu_event_record(s->prev_done, s->compute, e) || gpu_stream_wait(s->copy, s->prev_done, e)))
            return -1;
        if (s->pend.wait_slot >= 0 && gpu_stream_wait(s->copy, s->freed[s->pend.wait_slot], e)) return -1;
        uint8_t *dst = s->d_w + p->ring_off + s->pend.off;
        // With a CPU share, a decode pass's copies leave out the CPU's rows; so do the ones issued ahead for the
        // next pass (a decode step, most likely), except during the warm-up (the prompt's prefill follows).
        int part = s->share > 0 && (seq < s->pass_end ? s->pass_T == 1 : !s->warming);
        s->seq_bytes[i] = 0;
        if (gpu_event_record(s->c0[i], s->copy, e) || unit_copy(s, u, dst, s->copy, part, &s->seq_bytes[i], e) ||
            gpu_event_record(s->c1[i], s->copy, e) || gpu_event_record(s->copied[s->pend.slot], s->copy, e))
            return -1;
        s->seq_part[i] = (uint8_t)part;
        s->seq_off[i] = s->pend.off;
        s->seq_slot[i] = s->pend.slot;
        s->issued++;
        s->have_pend = 0;
    }
}

// Device pointer to unit u's weights for this pass; for a streamed unit, the compute stream waits for its copy.
static int unit_begin(dj_gpu_state *s, int u, const uint8_t **w, dj_err *e) {
    rb_plan *p = s->plan;
    s->cur_host = NULL;
    if (p->resident[u]) {
        *w = s->d_w + p->offset[u];
        return 0;
    }
    if (issue_copies(s, e)) return -1;
    int64_t seq = s->computed, i = seq % s->n_tev;
    if (stream_unit(s, seq) != u || s->issued <= seq)
        return dj_fail(e, "internal error: streaming schedule out of step at unit %d", u);
    uint8_t *slot = s->d_w + p->ring_off + s->seq_off[i];
    *w = slot;
    if (s->seq_part[i] && s->pass_T == 1) {
        s->cur_host = u < (int)s->m->info.config.n_layers ? dj_layer_ptr(s->m, (uint32_t)u) : dj_head_ptr(s->m);
    } else if (s->seq_part[i]) {  // a prefill where a decode step was expected: the CPU's rows follow
        uint64_t extra = 0;
        if (unit_copy(s, u, slot, s->copy, 2, &extra, e) ||
            gpu_event_record(s->copied[s->seq_slot[i]], s->copy, e))
            return -1;
        s->seq_part[i] = 0;
    }
    return gpu_event_record(s->w0[i], s->compute, e) || gpu_stream_wait(s->compute, s->copied[s->seq_slot[i]], e) ||
                   gpu_event_record(s->w1[i], s->compute, e)
               ? -1
               : 0;
}

// After unit u's kernels: a streamed unit's slot is free once they finish.
static int unit_end(dj_gpu_state *s, int u, dj_err *e) {
    if (s->plan->resident[u]) return 0;
    int64_t i = s->computed % s->n_tev;
    if (gpu_event_record(s->freed[s->seq_slot[i]], s->compute, e)) return -1;
    s->computed++;
    return issue_copies(s, e);
}

// Reads the timing of every streamed unit computed so far (their copies and waits are complete after the
// pass's final synchronisation).
static int harvest(dj_gpu_state *s, dj_err *e) {
    for (; s->harvested < s->computed; s->harvested++) {
        int64_t i = s->harvested % s->n_tev;
        float cm, wm;
        if (gpu_event_ms(&cm, s->c0[i], s->c1[i], e) || gpu_event_ms(&wm, s->w0[i], s->w1[i], e)) return -1;
        s->st.copy_ms += cm;
        s->st.wait_ms += wm;
        s->st.copied_bytes += s->seq_bytes[i];
    }
    return 0;
}

// y (n_out) = W x for one token, split: rows [0, gpu_rows) by the GPU from the slot (w), the rest by the CPU from
// host memory (hw) while the GPU works, landing in y through mapped memory. The host waits for x, so the
// compute stream runs dry meanwhile; the copy stream does not (its next copy is already issued).
static int split_matvec(dj_gpu_state *s, float *y, const float *x, const uint8_t *w, const uint8_t *hw,
                        const sp_mat *mt, dj_err *e) {
    uint32_t wt = s->m->info.config.wtype;
    int64_t nc = mt->n_out - mt->gpu_rows;
    if (nc && (gpu_d2h_async(s->h_cx, x, (size_t)mt->n_in * 4, s->compute, e) ||
               gpu_event_record(s->x_ready, s->compute, e)))
        return -1;
    if (mt->gpu_rows && gpu_matmul(s->g, y, x, w, wt, 1, mt->n_in, mt->gpu_rows, s->compute, e)) return -1;
    if (!nc) return 0;
    // h_cy is free: the previous split's read of it precedes x_ready on the stream.
    if (gpu_event_sync(s->x_ready, e)) return -1;
    cpu_matvec(s->h_cy, s->h_cx, hw + (size_t)mt->gpu_rows * (size_t)mt->n_in * dj_dtype_size(wt), wt, mt->n_in, nc);
    return gpu_widen(y + mt->gpu_rows, s->d_cy, DJ_F32, nc, s->compute, e);
}

// The k-th of the layer's matmuls (s->lmats) on T rows: on the GPU, or split with the CPU when the layer is
// (hw: its host slab).
static int layer_mm(dj_gpu_state *s, const uint8_t *w, const uint8_t *hw, int k, float *y, const float *x, int64_t T,
                    dj_err *e) {
    const sp_mat *mt = &s->lmats[k];
    if (hw && T == 1) return split_matvec(s, y, x, w + mt->off, hw + mt->off, mt, e);
    return gpu_matmul(s->g, y, x, w + mt->off, s->m->info.config.wtype, T, mt->n_in, mt->n_out, s->compute, e);
}

// One transformer layer on T rows of s->d_x (the residual stream). `pending`: the previous layer's output
// delta (in d_delta) still has to be added, fused with this layer's first norm.
static int gpu_layer(dj_gpu_state *s, const uint8_t *w, int l, int64_t T, int pending, dj_err *e) {
    const dj_config *c = &s->m->info.config;
    const dj_layer_layout *L = &s->m->info.layer;
    cudaStream_t st = s->compute;
    dj_gpu *g = s->g;
    int64_t dim = c->dim, hd = c->head_dim, q = (int64_t)c->n_heads * hd, kv = (int64_t)c->n_kv_heads * hd,
            hid = c->hidden_dim;
    const uint8_t *hw = s->cur_host;  // split with the CPU (decode, CPU share)
    int k = 0;                        // the next of s->lmats
    const float *attn_norm = (const float *)(w + L->attn_norm), *ffn_norm = (const float *)(w + L->ffn_norm);
    float *kc = s->d_k + (size_t)l * c->n_kv_heads * s->max_seq * hd;
    float *vc = s->d_v + (size_t)l * c->n_kv_heads * s->max_seq * hd;

    prof_mark(s, 9);  // streaming waits, embeddings: "other"
    if (pending ? gpu_add_rmsnorm(s->d_x, s->d_delta, s->d_xb, attn_norm, T, dim, c->norm_eps, st, e)
                : gpu_rmsnorm(s->d_xb, s->d_x, attn_norm, T, dim, c->norm_eps, st, e))
        return -1;
    prof_mark(s, 0);
    // q, k, v: one fused matmul into rows [q | k | v], or three into separate (T, n) blocks of d_qkv.
    float *qp, *kp, *vp;
    int64_t ldq, ldkv;
    if (s->fused_qkv) {
        qp = s->d_qkv, kp = qp + q, vp = kp + kv, ldq = ldkv = q + 2 * kv;
        if (layer_mm(s, w, hw, k++, s->d_qkv, s->d_xb, T, e)) return -1;
    } else {
        qp = s->d_qkv, kp = qp + T * q, vp = kp + T * kv, ldq = q, ldkv = kv;
        if (layer_mm(s, w, hw, k++, qp, s->d_xb, T, e) || layer_mm(s, w, hw, k++, kp, s->d_xb, T, e) ||
            layer_mm(s, w, hw, k++, vp, s->d_xb, T, e))
            return -1;
    }
    prof_mark(s, 1);
    // RoPE and the KV write in one launch instead of three where each row is [q | k | v]: the fused layout, or
    // one token (its q, k, v are adjacent in either layout).
    if (T == 1 || s->fused_qkv
            ? gpu_rope_kv(g, qp, ldq, T, kc, vc, c->n_heads, c->n_kv_heads, hd, s->max_seq, s->d_inv_freq, s->d_pos,
                          st, e)
               : gpu_rope(qp, T, c->n_heads, hd, ldq, s->d_inv_freq, s->d_pos, st, e) ||
                     gpu_rope(kp, T, c->n_kv_heads, hd, ldkv, s->d_inv_freq, s->d_pos, st, e) ||
                     gpu_kv_write(kc, vc, kp, vp, ldkv, T, c->n_kv_heads, hd, s->max_seq, s->d_pos, st, e))
        return -1;
    prof_mark(s, 2);
    if (T == 1 ? gpu_attention_decode(g, s->d_att, qp, kc, vc, c->n_heads, c->n_kv_heads, hd, s->max_seq, s->d_pos,
                                      st, e)
               : gpu_attention_prefill(g, s->d_att, q, qp, ldq, kc, vc, T, c->n_heads, c->n_kv_heads, hd,
                                       s->max_seq, s->d_pos, st, e))
        return -1;
    prof_mark(s, 3);
    if (layer_mm(s, w, hw, k++, s->d_delta, s->d_att, T, e)) return -1;
    prof_mark(s, 4);
    if (gpu_add_rmsnorm(s->d_x, s->d_delta, s->d_xb, ffn_norm, T, dim, c->norm_eps, st, e)) return -1;
    prof_mark(s, 0);
    // MLP: silu(gate) * up, then down.
    if (s->fused_gate_up) {
        if (layer_mm(s, w, hw, k++, s->d_ffn, s->d_xb, T, e)) return -1;
        prof_mark(s, 5);
        if (gpu_swiglu(s->d_hb, s->d_ffn, s->d_ffn + hid, T, hid, 2 * hid, st, e)) return -1;
    } else {
        float *gate = s->d_ffn, *up = s->d_ffn + T * hid;
        if (layer_mm(s, w, hw, k++, gate, s->d_xb, T, e) || layer_mm(s, w, hw, k++, up, s->d_xb, T, e) ||
            gpu_swiglu(s->d_hb, gate, up, T, hid, hid, st, e))
            return -1;
    }
    prof_mark(s, 6);
    if (layer_mm(s, w, hw, k++, s->d_delta, s->d_hb, T, e)) return -1;
    prof_mark(s, 7);
    return 0;
}

// The embedding rows (in d_delta unless f32) widened into d_x, every layer, then the head's final norm (fused
// with the last residual add) into d_xb; *head: the head unit
// (the final norm at its start), *lm: the lm_head. Fused decode: the norm is left to head_logits.
static int gpu_body(dj_gpu_state *s, int64_t T, const uint8_t **head, const uint8_t **lm, dj_err *e) {
    const dj_config *c = &s->m->info.config;
    int nl = (int)c->n_layers;
    if (c->wtype != DJ_F32 && gpu_widen(s->d_x, s->d_delta, c->wtype, T * (int64_t)c->dim, s->compute, e)) return -1;
    for (int l = 0; l < nl; l++) {
        const uint8_t *w;
        if (unit_begin(s, l, &w, e) || gpu_layer(s, w, l, T, l > 0, e) || unit_end(s, l, e)) return -1;
    }
    if (unit_begin(s, nl, head, e)) return -1;
    *lm = *head + s->head_lm_off;
    return gpu_add_rmsnorm(s->d_x, s->d_delta, s->d_xb, (const float *)*head, T, c->dim, c->norm_eps, s->compute, e);
}

// Logits (rows, vocab) into d_logits for rows r0.. of the pass, from the head gpu_body left ready.
static int head_logits(dj_gpu_state *s, int64_t T, int64_t r0, int64_t rows, const uint8_t *head, const uint8_t *lm,
                       dj_err *e) {
    const dj_config *c = &s->m->info.config;
    if (T == 1 && s->cur_host)
        return split_matvec(s, s->d_logits, s->d_xb + r0 * c->dim, lm, dj_lm_head_ptr(s->m), &s->hmat, e);
    return gpu_matmul(s->g, s->d_logits, s->d_xb + r0 * c->dim, lm, c->wtype, rows, c->dim, c->vocab_size, s->compute,
                      e);
}

// One pass over T <= max_batch tokens. logits: (T, vocab) when all, else (vocab) for the last token.
static int gpu_pass(dj_gpu_state *s, const int32_t *tokens, int64_t T, int64_t pos, float *logits, int all,
                    dj_err *e) {
    const dj_model *m = s->m;
    const dj_config *c = &m->info.config;
    int64_t dim = c->dim, vocab = c->vocab_size;
    int nl = (int)c->n_layers;
    size_t row_bytes = (size_t)dim * dj_dtype_size(c->wtype);
    s->pass_T = T, s->pass_end = s->computed + s->plan->n_streamed;
    // Embedding rows gathered on the host as stored (a copy per row; h_x holds them as bytes), uploaded to d_x
    // for f32, else to d_delta, free at the start of a pass, which gpu_body widens into d_x.
    uint8_t *stage = (uint8_t *)s->h_x;
    for (int64_t t = 0; t < T; t++)
        memcpy(stage + (size_t)t * row_bytes, dj_embed_ptr(m) + (size_t)tokens[t] * row_bytes, row_bytes);
    *s->h_pos = (int32_t)pos;
    if (gpu_h2d_async(c->wtype == DJ_F32 ? (void *)s->d_x : (void *)s->d_delta, stage, (size_t)T * row_bytes,
                      s->compute, e) ||
        gpu_h2d_async(s->d_pos, s->h_pos, 4, s->compute, e))
        return -1;
    // All resident and one token: the whole step is one CUDA graph, captured on first use (the position
    // is read from d_pos, so every step replays the same graph).
    const uint8_t *head, *lm;
    int graphed = T == 1 && !s->plan->n_streamed && logits && !s->opts.no_graph && !s->prof;
    if (graphed) {
        if (!s->graph) {
            if (gpu_graph_begin(s->compute, e)) return -1;
            int rc = gpu_body(s, T, &head, &lm, e) || head_logits(s, T, 0, 1, head, lm, e);
            dj_err ge;
            if (gpu_graph_end(s->compute, &s->graph, rc ? &ge : e) || rc) return -1;
        }
        if (gpu_graph_launch(s->graph, s->compute, e) ||
            gpu_d2h_async(s->h_logits, s->d_logits, (size_t)vocab * 4, s->compute, e) ||
            gpu_stream_sync(s->compute, e))
            return -1;
        memcpy(logits, s->h_logits, (size_t)vocab * 4);
        s->st.passes++;
        return 0;
    }
    if (gpu_body(s, T, &head, &lm, e)) return -1;
    // The head's slot is released (and the next pass's first copies issued) before the final wait.
    int64_t first = all ? 0 : T - 1;
    for (int64_t r0 = first; r0 < T; r0 += GPU_LOGIT_ROWS) {
        int64_t rows = T - r0 < GPU_LOGIT_ROWS ? T - r0 : GPU_LOGIT_ROWS, last = r0 + rows >= T;
        if (logits && (head_logits(s, T, r0, rows, head, lm, e) ||
                       gpu_d2h_async(s->h_logits, s->d_logits, (size_t)(rows * vocab) * 4, s->compute, e)))
            return -1;
        prof_mark(s, 8);
        if (last && unit_end(s, nl, e)) return -1;
        if (gpu_stream_sync(s->compute, e)) return -1;
        if (logits) memcpy(logits + (r0 - first) * vocab, s->h_logits, (size_t)(rows * vocab) * 4);
    }
    if (harvest(s, e)) return -1;
    prof_collect(s, T == 1);
    s->st.passes++;
    return 0;
}

// One prefill pass of opts.warm_rows tokens (2 when not given; at most a pass and the context) and, all
// resident, one decode step, which captures the graph: module loading (CUDA loads each kernel at its first
// launch, and cuBLAS picks its kernels by shape: on the H100 the 7B's first 512-token pass took 32 ms, the
// next ones 17), cuBLAS's first-call set-up and the graph capture happen here, not in the user's time to first
// token. The KV cache rows it writes are overwritten by the real prompt.
static int gpu_warm_up(dj_gpu_state *s, dj_err *e) {
    s->warming = 1;
    int64_t T = s->opts.warm_rows > 0 ? s->opts.warm_rows : 2;
    if (T > s->max_batch) T = s->max_batch;
    if (T > s->max_seq) T = s->max_seq;
    int32_t *toks = calloc((size_t)T, sizeof *toks);
    float *lg = malloc((size_t)s->m->info.config.vocab_size * 4);
    if (!lg || !toks) {
        free(toks), free(lg);
        return dj_fail(e, "out of memory");
    }
    int rc = gpu_forward(s, toks, T, 0, lg, 0, e);
    if (!rc && !s->plan->n_streamed && s->max_seq > T) rc = gpu_forward(s, toks, 1, T, lg, 0, e);
    free(toks), free(lg);
    memset(s->prof_ms, 0, sizeof s->prof_ms);
    memset(s->prof_passes, 0, sizeof s->prof_passes);
    dj_gpu_stats keep = s->st;
    s->warm_h2d = keep.copy_ms > 0 ? (double)keep.copied_bytes / 1e6 / keep.copy_ms : 0;
    s->warming = 0;
    memset(&s->st, 0, sizeof s->st);
    s->st.bytes_per_token = keep.bytes_per_token, s->st.n_resident = keep.n_resident;
    s->st.n_streamed = keep.n_streamed;
    s->st.tc_attn = s->tc_attn;
    return rc;
}

// --cpu-share auto: the fraction that makes the CPU's rows take as long as the GPU's copies, from the warm-up's
// H2D rate and the CPU's matvec rate over one streamed unit's matrices (best of three; its first touch warms).
// Each split matmul also costs a round trip (x to the host, the result back: ~SPLIT_COST_S); where those would
// eat most of the gain (small models), the share stays off.
#define SPLIT_COST_S 50e-6
static void share_auto(dj_gpu_state *s) {
    const rb_plan *p = s->plan;
    int u = p->stream_order[0], nl = (int)s->m->info.config.n_layers;
    uint32_t wt = s->m->info.config.wtype;
    const sp_mat *mats = u < nl ? s->lmats : &s->hmat;
    const uint8_t *base = u < nl ? dj_layer_ptr(s->m, (uint32_t)u)
                                 : s->m->info.config.tied ? dj_embed_ptr(s->m) : dj_head_ptr(s->m);
    int n = u < nl ? s->n_lmats : 1;
    double best = 0;
    uint64_t bytes = sp_bytes(mats, n, dj_dtype_size(wt), 0);
    for (int r = 0; r < 3; r++) {
        double t0 = dj_now();
        for (int i = 0; i < n; i++) {
            memset(s->h_cx, 0, (size_t)mats[i].n_in * 4);
            cpu_matvec(s->h_cy, s->h_cx, base + mats[i].off, wt, mats[i].n_in, mats[i].n_out);
        }
        double t = dj_now() - t0;
        if (t > 0 && (best == 0 || t < best)) best = t;
    }
    double cpu = best > 0 ? (double)bytes / best / 1e9 : 0, h2d = s->warm_h2d;
    double share = cpu > 0 && h2d > 0 ? cpu / (cpu + h2d) : 0;
    if (share > 0.95) share = 0.95;
    double streamed = (double)p->streamed_bytes, splits = 0;
    for (int k = 0; k < p->n_streamed; k++) splits += p->stream_order[k] == nl ? 1 : s->n_lmats;
    double t_pure = h2d > 0 ? streamed / (h2d * 1e9) : 0, t_split = t_pure * (1 - share) + splits * SPLIT_COST_S;
    int worth = share > 0 && t_split < 0.9 * t_pure;
    if (!s->opts.quiet)
        fprintf(stderr, "gpu: CPU share, automatic: the CPU's matvec reads %.1f GB/s, the copies ran at %.1f GB/s: "
                        "%s\n", cpu, h2d, worth ? "sharing" : "not worth the round trips for this model: off");
    split_setup(s, worth ? share : 0);
}

// The statistics' share figures: bytes per decode token over PCIe and read by the CPU.
static void share_stats(dj_gpu_state *s) {
    const rb_plan *p = s->plan;
    int nl = (int)s->m->info.config.n_layers;
    if (s->share <= 0) return;
    uint64_t pcie = 0, cpu = 0;
    for (int k = 0; k < p->n_streamed; k++) {
        int h = p->stream_order[k] == nl;
        pcie += s->part_bytes[h], cpu += s->cpu_bytes[h];
    }
    s->st.bytes_per_token = pcie, s->st.cpu_bytes_per_token = cpu, s->st.cpu_share = s->share;
}

int gpu_forward(dj_gpu_state *s, const int32_t *tokens, int64_t T, int64_t pos, float *logits, int all,
                dj_err *e) {
    const dj_config *c = &s->m->info.config;
    if (T < 1 || pos < 0 || pos + T > s->max_seq)
        return dj_fail(e, "positions %lld..%lld outside the context of %lld", (long long)pos, (long long)(pos + T - 1),
                       (long long)s->max_seq);
    for (int64_t t = 0; t < T; t++)
        if (tokens[t] < 0 || (uint32_t)tokens[t] >= c->vocab_size)
            return dj_fail(e, "token id %d outside the vocabulary (%u)", tokens[t], c->vocab_size);
    // A prompt longer than one pass takes several; each streams the weights once.
    for (int64_t t0 = 0; t0 < T; t0 += s->max_batch) {
        int64_t n = T - t0 < s->max_batch ? T - t0 : s->max_batch, last = t0 + n == T;
        float *out = !logits ? NULL : all ? logits + t0 * (int64_t)c->vocab_size : last ? logits : NULL;
        if (gpu_pass(s, tokens + t0, n, pos + t0, out, all, e)) return -1;
    }
    return 0;
}

void gpu_state_stats(const dj_gpu_state *s, dj_gpu_stats *out) { *out = s->st; }

// ---- CPU reference: thread pool
// A fixed set of workers, started on first use, that split a range [0, n) into equal contiguous parts; the
// caller takes part 0. Calls are serialised, so the pool is safe to use from several threads. Between calls a
// worker spins for POOL_SPIN_S before it sleeps, and the caller spins for the last parts: the GPU engine's CPU
// share makes ~130 calls per token, a few tens of microseconds apart, where a sleep and wake-up per call would
// cost about as much as the work.
typedef void (*cpu_task_fn)(void *ctx, int64_t begin, int64_t end);
#define POOL_SPIN_S 5e-4

static struct {
    pthread_once_t once;
    pthread_mutex_t call_mu;  // one parallel_for at a time
    pthread_mutex_t mu;       // with `start`: sleeping workers
    pthread_cond_t start;
    int n_threads;            // workers + the caller
    _Atomic uint64_t generation;  // bumped per call (after fn, ctx, n are set): workers wait for a new value
    _Atomic int pending;          // workers still running the current call
    cpu_task_fn fn;
    void *ctx;
    int64_t n;
} cpu_pool = {.once = PTHREAD_ONCE_INIT, .call_mu = PTHREAD_MUTEX_INITIALIZER, .mu = PTHREAD_MUTEX_INITIALIZER,
              .start = PTHREAD_COND_INITIALIZER};
static int cpu_threads_wanted;  // 0: one per online core

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

static void cpu_pool_range(int part, int parts, int64_t n, int64_t *b, int64_t *e) {
    *b = n * part / parts;
    *e = n * (part + 1) / parts;
}

static void *cpu_pool_worker(void *arg) {
    int part = (int)(intptr_t)arg;
    uint64_t seen = 0;
    for (;;) {
        uint64_t g = atomic_load(&cpu_pool.generation);
        for (double t0 = dj_now(); g == seen; g = atomic_load(&cpu_pool.generation)) {
            for (int i = 0; i < 64 && g == seen; i++, g = atomic_load(&cpu_pool.generation)) cpu_relax();
            if (g != seen || dj_now() - t0 < POOL_SPIN_S) continue;
            pthread_mutex_lock(&cpu_pool.mu);  // the caller bumps the generation under mu: no lost wake-up
            while ((g = atomic_load(&cpu_pool.generation)) == seen) pthread_cond_wait(&cpu_pool.start, &cpu_pool.mu);
            pthread_mutex_unlock(&cpu_pool.mu);
        }
        seen = g;
        int64_t b, e;
        cpu_pool_range(part, cpu_pool.n_threads, cpu_pool.n, &b, &e);
        if (b < e) cpu_pool.fn(cpu_pool.ctx, b, e);
        atomic_fetch_sub(&cpu_pool.pending, 1);
    }
    return NULL;
}

static void cpu_pool_init(void) {
    long n = cpu_threads_wanted > 0 ? cpu_threads_wanted : sysconf(_SC_NPROCESSORS_ONLN);
    if (n < 1) n = 1;
    if (n > 256) n = 256;
    cpu_pool.n_threads = 1;
    for (long i = 1; i < n; i++) {
        pthread_t th;
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        int rc = pthread_create(&th, &attr, cpu_pool_worker, (void *)(intptr_t)i);
        pthread_attr_destroy(&attr);
        if (rc != 0) break;  // fewer threads: slower, still correct
        cpu_pool.n_threads++;
    }
}

void cpu_set_threads(int n) { cpu_threads_wanted = n; }

int cpu_threads(void) {
    pthread_once(&cpu_pool.once, cpu_pool_init);
    return cpu_pool.n_threads;
}

// Runs fn over [0, n) split across the pool; inline when the work (`cost`, roughly flops) is too small to be
// worth waking threads.
static void cpu_parallel_for(int64_t n, double cost, cpu_task_fn fn, void *ctx) {
    if (n <= 0) return;
    if (n == 1 || cost < 65536.0 || cpu_threads() == 1) {
        fn(ctx, 0, n);
        return;
    }
    pthread_mutex_lock(&cpu_pool.call_mu);
    cpu_pool.fn = fn;
    cpu_pool.ctx = ctx;
    cpu_pool.n = n;
    atomic_store(&cpu_pool.pending, cpu_pool.n_threads - 1);
    pthread_mutex_lock(&cpu_pool.mu);
    atomic_fetch_add(&cpu_pool.generation, 1);
    pthread_cond_broadcast(&cpu_pool.start);
    pthread_mutex_unlock(&cpu_pool.mu);
    int64_t b, e;
    cpu_pool_range(0, cpu_pool.n_threads, n, &b, &e);
    if (b < e) fn(ctx, b, e);
    while (atomic_load(&cpu_pool.pending) > 0) cpu_relax();
    pthread_mutex_unlock(&cpu_pool.call_mu);
}

// ---- CPU reference: widening and matmul
// f16 -> f32 through a 64K-entry table: the conversion's branches would otherwise dominate the inner loop.
static float cpu_f16_table[65536];
static pthread_once_t cpu_f16_once = PTHREAD_ONCE_INIT;
static void cpu_f16_table_init(void) {
    for (uint32_t i = 0; i < 65536; i++) cpu_f16_table[i] = dj_f16_to_f32((uint16_t)i);
}

// dst (n) = row `r` of w (rows of n elements in wtype), widened to f32. Returns dst, or w's own row for f32.
static const float *cpu_widen_row(float *dst, const void *w, uint32_t wtype, int64_t r, int64_t n) {
    if (wtype == DJ_F32) return (const float *)w + r * n;
    const uint16_t *src = (const uint16_t *)w + r * n;
    if (wtype == DJ_F16) {
        for (int64_t i = 0; i < n; i++) dst[i] = cpu_f16_table[src[i]];
    } else {
        for (int64_t i = 0; i < n; i++) dst[i] = dj_bf16_to_f32(src[i]);
    }
    return dst;
}

// Eight independent partial sums: lets the compiler vectorise without reassociating (no -ffast-math).
static float cpu_dot(const float *a, const float *b, int64_t n) {
    float s[8] = {0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; k++) s[k] += a[i + k] * b[i + k];
    float r = ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
    for (; i < n; i++) r += a[i] * b[i];
    return r;
}

typedef struct {
    float *y;        // (T, n_out)
    const float *x;  // (T, n_in)
    const void *w;   // (n_out, n_in) wtype
    uint32_t wtype;
    int64_t T, n_in, n_out;
} cpu_matmul_job;

static void cpu_matmul_task(void *ctx, int64_t begin, int64_t end) {
    const cpu_matmul_job *j = ctx;
    float *row = NULL;
    if (j->wtype != DJ_F32) {
        row = malloc((size_t)j->n_in * sizeof(float));
        assert(row && "out of memory in cpu_matmul");
    }
    for (int64_t o = begin; o < end; o++) {
        const float *wr = cpu_widen_row(row, j->w, j->wtype, o, j->n_in);
        for (int64_t t = 0; t < j->T; t++) j->y[t * j->n_out + o] = cpu_dot(j->x + t * j->n_in, wr, j->n_in);
    }
    free(row);
}

void cpu_matmul(float *y, const float *x, const void *w, uint32_t wtype, int64_t T, int64_t n_in, int64_t n_out) {
    assert(wtype == DJ_F32 || wtype == DJ_F16 || wtype == DJ_BF16);
    if (wtype == DJ_F16) pthread_once(&cpu_f16_once, cpu_f16_table_init);
    cpu_matmul_job j = {y, x, w, wtype, T, n_in, n_out};
    cpu_parallel_for(n_out, (double)T * (double)n_in * (double)n_out, cpu_matmul_task, &j);
}

// ---- CPU matvec for the GPU engine's CPU share (dj_gpu_opts.cpu_share)
// y (n_out) = W x, for one token, at the host's memory bandwidth: on x86 with AVX2, FMA and F16C, eight f16, bf16
// or f32 weights are widened per instruction and summed in four fused multiply-add accumulators; elsewhere, the
// portable loop of cpu_dot. Rows are split over the thread pool.
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>
#include <immintrin.h>
#define CPU_SIMD 1
#define SIMD_FN __attribute__((target("avx2,fma,f16c")))
SIMD_FN static inline __m256 simd_load8(const void *w, uint32_t wtype, int64_t i) {
    if (wtype == DJ_F16) return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)w + i)));
    if (wtype == DJ_BF16) {
        __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)((const uint16_t *)w + i)));
        return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
    }
    return _mm256_loadu_ps((const float *)w + i);
}

SIMD_FN static float simd_dot_row(const float *x, const void *w, uint32_t wtype, int64_t n) {
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        a0 = _mm256_fmadd_ps(simd_load8(w, wtype, i), _mm256_loadu_ps(x + i), a0);
        a1 = _mm256_fmadd_ps(simd_load8(w, wtype, i + 8), _mm256_loadu_ps(x + i + 8), a1);
        a2 = _mm256_fmadd_ps(simd_load8(w, wtype, i + 16), _mm256_loadu_ps(x + i + 16), a2);
        a3 = _mm256_fmadd_ps(simd_load8(w, wtype, i + 24), _mm256_loadu_ps(x + i + 24), a3);
    }
    for (; i + 8 <= n; i += 8) a0 = _mm256_fmadd_ps(simd_load8(w, wtype, i), _mm256_loadu_ps(x + i), a0);
    __m256 a = _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3));
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    h = _mm_add_ss(h, _mm_movehdup_ps(h));
    float r = _mm_cvtss_f32(h);
    const uint16_t *w16 = (const uint16_t *)w;
    for (; i < n; i++)
        r += x[i] * (wtype == DJ_F32   ? ((const float *)w)[i]
                     : wtype == DJ_F16 ? dj_f16_to_f32(w16[i])
                                       : dj_bf16_to_f32(w16[i]));
    return r;
}

// AVX2 and FMA through the compiler's builtin (which also checks that the OS saves the AVX state); F16C
// through CPUID leaf 1 (ECX bit 29), which not every compiler's builtin knows.
static int cpu_simd_ok(void) {
    static int ok = -1;
    if (ok < 0) {
        unsigned a, b, c, d;
        int f16c = __get_cpuid(1, &a, &b, &c, &d) && (c >> 29 & 1u);
        ok = f16c && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    }
    return ok;
}
#endif
static int cpu_simd_off;  // cpu_set_simd(0): the portable loop even where the vector one runs

int cpu_set_simd(int on) {
    cpu_simd_off = !on;
#ifdef CPU_SIMD
    return on && cpu_simd_ok();
#else
    return 0;
#endif
}

typedef struct {
    float *y;
    const float *x;
    const void *w;
    uint32_t wtype;
    int64_t n_in, n_out, chunk;
    _Atomic int64_t next;  // the next chunk of rows to claim: a thread the OS delays takes fewer
} cpu_matvec_job;

static void cpu_matvec_rows(const cpu_matvec_job *j, int64_t begin, int64_t end) {
    size_t ws = dj_dtype_size(j->wtype);
#ifdef CPU_SIMD
    if (!cpu_simd_off && cpu_simd_ok()) {
        for (int64_t o = begin; o < end; o++)
            j->y[o] = simd_dot_row(j->x, (const uint8_t *)j->w + (size_t)o * (size_t)j->n_in * ws, j->wtype, j->n_in);
        return;
    }
#endif
    float row[1024];  // widened in chunks: cpu_dot on each
    for (int64_t o = begin; o < end; o++) {
        float acc = 0.0f;
        for (int64_t c = 0; c < j->n_in; c += 1024) {
            int64_t n = j->n_in - c < 1024 ? j->n_in - c : 1024;
            const void *wr = (const uint8_t *)j->w + ((size_t)o * (size_t)j->n_in + (size_t)c) * ws;
            const float *wf = j->wtype == DJ_F32 ? (const float *)wr : cpu_widen_row(row, wr, j->wtype, 0, n);
            acc += cpu_dot(j->x + c, wf, n);
        }
        j->y[o] = acc;
    }
}

static void cpu_matvec_task(void *ctx, int64_t part, int64_t parts_end) {
    cpu_matvec_job *j = ctx;
    (void)part, (void)parts_end;
    for (int64_t b; (b = atomic_fetch_add(&j->next, j->chunk)) < j->n_out;)
        cpu_matvec_rows(j, b, b + j->chunk < j->n_out ? b + j->chunk : j->n_out);
}

void cpu_matvec(float *y, const float *x, const void *w, uint32_t wtype, int64_t n_in, int64_t n_out) {
    assert(wtype == DJ_F32 || wtype == DJ_F16 || wtype == DJ_BF16);
    if (wtype == DJ_F16) pthread_once(&cpu_f16_once, cpu_f16_table_init);
    int64_t parts = cpu_threads(), chunk = n_out / (8 * parts);
    if (chunk < 16) chunk = 16;
    cpu_matvec_job j = {y, x, w, wtype, n_in, n_out, chunk, 0};
    cpu_parallel_for(parts, (double)n_in * (double)n_out, cpu_matvec_task, &j);
}

// ---- CPU reference: norm, RoPE, attention, SwiGLU
void cpu_rmsnorm(float *out, const float *x, const float *w, int64_t n, float eps) {
    float ss = 0.0f;
    for (int64_t i = 0; i < n; i++) ss += x[i] * x[i];
    float scale = 1.0f / sqrtf(ss / (float)n + eps);
    for (int64_t i = 0; i < n; i++) out[i] = x[i] * scale * w[i];
}

void cpu_rope_freqs(const dj_config *c, float *inv_freq) {
    int64_t hd = c->head_dim;
    for (int64_t i = 0; i < hd / 2; i++) {
        // HF: 1.0 / (base ** (arange(0, hd, 2).float() / hd)), every step in f32
        float expo = (float)(2 * i) / (float)hd;
        inv_freq[i] = 1.0f / powf(c->rope_theta, expo);
    }
    if (c->rope_type != DJ_ROPE_LLAMA3) return;
    // transformers' _compute_llama3_parameters: keep high frequencies, divide low ones by `factor`, and blend
    // smoothly in between, with wavelength thresholds taken from the original context length.
    float factor = c->rope_factor, lf = c->rope_low_freq, hf = c->rope_high_freq;
    float old_len = (float)c->rope_orig_max;
    float low_wavelen = old_len / lf, high_wavelen = old_len / hf;
    for (int64_t i = 0; i < hd / 2; i++) {
        float f = inv_freq[i];
        float wavelen = (float)(2.0 * M_PI) / f;
        float scaled = wavelen > low_wavelen ? f / factor : f;
        if (!(wavelen < high_wavelen) && !(wavelen > low_wavelen)) {
            float smooth = (old_len / wavelen - lf) / (hf - lf);
            scaled = (1.0f - smooth) * scaled / factor + smooth * scaled;
        }
        inv_freq[i] = scaled;
    }
}

void cpu_rope(float *x, int64_t n_heads, int64_t head_dim, int64_t pos, const float *inv_freq) {
    int64_t half = head_dim / 2;
    for (int64_t i = 0; i < half; i++) {
        float angle = (float)pos * inv_freq[i];
        float c = cosf(angle), s = sinf(angle);
        for (int64_t h = 0; h < n_heads; h++) {
            float *v = x + h * head_dim;
            float a = v[i], b = v[i + half];
            v[i] = a * c - b * s;
            v[i + half] = b * c + a * s;
        }
    }
}

// One query head over keys 0..pos; scores (pos+1) is scratch.
static void cpu_attention_head(float *out, const float *q, const float *k, const float *v, int64_t head_dim,
                               int64_t pos, float *scores) {
    float scale = 1.0f / sqrtf((float)head_dim), mx = -INFINITY;
    for (int64_t t = 0; t <= pos; t++) {
        scores[t] = cpu_dot(q, k + t * head_dim, head_dim) * scale;
        if (scores[t] > mx) mx = scores[t];
    }
    float sum = 0.0f;
    for (int64_t t = 0; t <= pos; t++) {
        scores[t] = expf(scores[t] - mx);
        sum += scores[t];
    }
    float inv = 1.0f / sum;
    for (int64_t i = 0; i < head_dim; i++) out[i] = 0.0f;
    for (int64_t t = 0; t <= pos; t++) {
        float p = scores[t] * inv;
        const float *vt = v + t * head_dim;
        for (int64_t i = 0; i < head_dim; i++) out[i] += p * vt[i];
    }
}

void cpu_attention(float *out, const float *q, const float *k_cache, const float *v_cache, int64_t n_heads,
                   int64_t n_kv_heads, int64_t head_dim, int64_t pos, int64_t max_seq) {
    assert(n_kv_heads > 0 && n_heads % n_kv_heads == 0 && pos < max_seq);
    float *scores = malloc((size_t)(pos + 1) * sizeof(float));
    assert(scores && "out of memory in cpu_attention");
    int64_t group = n_heads / n_kv_heads;
    for (int64_t h = 0; h < n_heads; h++) {
        int64_t kvh = h / group;
        cpu_attention_head(out + h * head_dim, q + h * head_dim, k_cache + kvh * max_seq * head_dim,
                           v_cache + kvh * max_seq * head_dim, head_dim, pos, scores);
    }
    free(scores);
}

void cpu_swiglu(float *out, const float *gate, const float *up, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        float g = gate[i];
        out[i] = g / (1.0f + expf(-g)) * up[i];
    }
}

// ---- CPU reference: forward pass
#define CPU_CHUNK 32  // tokens per pass through the layers: bounds the activation buffers

struct dj_cpu_state {
    const dj_model *m;
    dj_config c;
    int64_t max_seq;
    int64_t q_dim, kv_dim;
    float *inv_freq;   // (head_dim/2)
    float *x;          // (CPU_CHUNK, dim) residual stream
    float *xb;         // (CPU_CHUNK, dim) normed input / block output
    float *q;          // (CPU_CHUNK, q_dim)
    float *k, *v;      // (CPU_CHUNK, kv_dim)
    float *att;        // (CPU_CHUNK, q_dim)
    float *hb, *hb2;   // (CPU_CHUNK, hidden_dim)
    float *k_cache;    // (n_layers, n_kv_heads, max_seq, head_dim)
    float *v_cache;    // (n_layers, n_kv_heads, max_seq, head_dim)
};

void cpu_state_free(dj_cpu_state *s) {
    if (!s) return;
    free(s->inv_freq);
    free(s->x);
    free(s->xb);
    free(s->q);
    free(s->k);
    free(s->v);
    free(s->att);
    free(s->hb);
    free(s->hb2);
    free(s->k_cache);
    free(s->v_cache);
    free(s);
}

static float *cpu_alloc_floats(uint64_t n, const char *what, dj_err *e) {
    uint64_t bytes;
    if (dj_mul_u64(n, sizeof(float), &bytes) || bytes > SIZE_MAX) {
        dj_fail(e, "cpu: %s of %" PRIu64 " floats is too large", what, n);
        return NULL;
    }
    float *p = calloc(1, bytes ? (size_t)bytes : 1);
    if (!p) dj_fail(e, "cpu: cannot allocate %.2f GB for the %s", (double)bytes / 1e9, what);
    return p;
}

dj_cpu_state *cpu_state_new(const dj_model *m, int64_t max_seq, dj_err *e) {
    const dj_config *c = &m->info.config;
    if (max_seq <= 0) {
        dj_fail(e, "cpu: context size must be positive (got %" PRId64 ")", max_seq);
        return NULL;
    }
    dj_cpu_state *s = calloc(1, sizeof *s);
    if (!s) {
        dj_fail(e, "cpu: out of memory");
        return NULL;
    }
    s->m = m;
    s->c = *c;
    s->max_seq = max_seq;
    s->q_dim = (int64_t)c->n_heads * c->head_dim;
    s->kv_dim = (int64_t)c->n_kv_heads * c->head_dim;
    uint64_t cache;
    if (dj_mul_u64((uint64_t)c->n_layers * (uint64_t)s->kv_dim, (uint64_t)max_seq, &cache)) {
        dj_fail(e, "cpu: KV cache size overflows");
        cpu_state_free(s);
        return NULL;
    }
    if (!(s->inv_freq = cpu_alloc_floats(c->head_dim / 2 + 1, "rope table", e)) ||
        !(s->x = cpu_alloc_floats((uint64_t)CPU_CHUNK * c->dim, "activations", e)) ||
        !(s->xb = cpu_alloc_floats((uint64_t)CPU_CHUNK * c->dim, "activations", e)) ||
        !(s->q = cpu_alloc_floats((uint64_t)CPU_CHUNK * s->q_dim, "activations", e)) ||
        !(s->k = cpu_alloc_floats((uint64_t)CPU_CHUNK * s->kv_dim, "activations", e)) ||
        !(s->v = cpu_alloc_floats((uint64_t)CPU_CHUNK * s->kv_dim, "activations", e)) ||
        !(s->att = cpu_alloc_floats((uint64_t)CPU_CHUNK * s->q_dim, "activations", e)) ||
        !(s->hb = cpu_alloc_floats((uint64_t)CPU_CHUNK * c->hidden_dim, "activations", e)) ||
        !(s->hb2 = cpu_alloc_floats((uint64_t)CPU_CHUNK * c->hidden_dim, "activations", e)) ||
        !(s->k_cache = cpu_alloc_floats(cache, "KV cache", e)) ||
        !(s->v_cache = cpu_alloc_floats(cache, "KV cache", e))) {
        cpu_state_free(s);
        return NULL;
    }
    cpu_rope_freqs(c, s->inv_freq);
    return s;
}

typedef struct {
    dj_cpu_state *s;
    int64_t layer, pos, T;  // queries pos .. pos+T-1
} cpu_attn_job;

// Parallel over (token, head) pairs; each task has its own scores scratch.
static void cpu_attn_task(void *ctx, int64_t begin, int64_t end) {
    const cpu_attn_job *j = ctx;
    const dj_cpu_state *s = j->s;
    int64_t nh = s->c.n_heads, hd = s->c.head_dim, group = nh / s->c.n_kv_heads;
    size_t layer_off = (size_t)j->layer * (size_t)s->kv_dim * (size_t)s->max_seq;
    float *scores = malloc((size_t)(j->pos + j->T) * sizeof(float));
    assert(scores && "out of memory in cpu attention");
    for (int64_t i = begin; i < end; i++) {
        int64_t t = i / nh, h = i % nh, kvh = h / group;
        size_t kv_off = layer_off + (size_t)kvh * (size_t)s->max_seq * (size_t)hd;
        cpu_attention_head(s->att + t * s->q_dim + h * hd, s->q + t * s->q_dim + h * hd, s->k_cache + kv_off,
                           s->v_cache + kv_off, hd, j->pos + t, scores);
    }
    free(scores);
}

// The embedding row of `token`, widened: out (dim).
static void cpu_embed(const dj_model *m, int32_t token, float *out) {
    const dj_config *c = &m->info.config;
    const float *row = cpu_widen_row(out, dj_embed_ptr(m), c->wtype, token, c->dim);
    if (row != out) memcpy(out, row, (size_t)c->dim * sizeof(float));  // f32: widen_row returned the table's row
}

// Runs one chunk of T <= CPU_CHUNK tokens through every layer; logits (T, vocab) if not NULL.
static void cpu_forward_chunk(dj_cpu_state *s, const int32_t *tokens, int64_t T, int64_t pos, float *logits) {
    const dj_model *m = s->m;
    const dj_config *c = &s->c;
    const dj_layer_layout *L = &m->info.layer;
    int64_t dim = c->dim, hd = c->head_dim, hidden = c->hidden_dim, qd = s->q_dim, kvd = s->kv_dim;
    uint32_t wt = c->wtype;
    if (wt == DJ_F16) pthread_once(&cpu_f16_once, cpu_f16_table_init);
    for (int64_t t = 0; t < T; t++) cpu_embed(m, tokens[t], s->x + t * dim);

    for (uint32_t l = 0; l < c->n_layers; l++) {
        const uint8_t *slab = dj_layer_ptr(m, l);
        // attention block
        for (int64_t t = 0; t < T; t++)
            cpu_rmsnorm(s->xb + t * dim, s->x + t * dim, (const float *)(slab + L->attn_norm), dim, c->norm_eps);
        cpu_matmul(s->q, s->xb, slab + L->wq, wt, T, dim, qd);
        cpu_matmul(s->k, s->xb, slab + L->wk, wt, T, dim, kvd);
        cpu_matmul(s->v, s->xb, slab + L->wv, wt, T, dim, kvd);
        size_t layer_off = (size_t)l * (size_t)kvd * (size_t)s->max_seq;
        for (int64_t t = 0; t < T; t++) {
            cpu_rope(s->q + t * qd, c->n_heads, hd, pos + t, s->inv_freq);
            cpu_rope(s->k + t * kvd, c->n_kv_heads, hd, pos + t, s->inv_freq);
            // k, v stored (head, pos, head_dim): each head's keys are contiguous for the attention loop
            for (int64_t h = 0; h < c->n_kv_heads; h++) {
                size_t off = layer_off + ((size_t)h * (size_t)s->max_seq + (size_t)(pos + t)) * (size_t)hd;
                memcpy(s->k_cache + off, s->k + t * kvd + h * hd, (size_t)hd * sizeof(float));
                memcpy(s->v_cache + off, s->v + t * kvd + h * hd, (size_t)hd * sizeof(float));
            }
        }
        cpu_attn_job aj = {s, l, pos, T};
        cpu_parallel_for(T * c->n_heads, (double)T * (double)qd * (double)(pos + T) * 2.0, cpu_attn_task, &aj);
        cpu_matmul(s->xb, s->att, slab + L->wo, wt, T, qd, dim);
        for (int64_t i = 0; i < T * dim; i++) s->x[i] += s->xb[i];

        // feed-forward block
        for (int64_t t = 0; t < T; t++)
            cpu_rmsnorm(s->xb + t * dim, s->x + t * dim, (const float *)(slab + L->ffn_norm), dim, c->norm_eps);
        cpu_matmul(s->hb, s->xb, slab + L->w_gate, wt, T, dim, hidden);
        cpu_matmul(s->hb2, s->xb, slab + L->w_up, wt, T, dim, hidden);
        cpu_swiglu(s->hb, s->hb, s->hb2, T * hidden);
        cpu_matmul(s->xb, s->hb, slab + L->w_down, wt, T, hidden, dim);
        for (int64_t i = 0; i < T * dim; i++) s->x[i] += s->xb[i];
    }

    if (!logits) return;
    const float *norm = (const float *)(dj_head_ptr(m) + m->info.head.norm);
    for (int64_t t = 0; t < T; t++) cpu_rmsnorm(s->xb + t * dim, s->x + t * dim, norm, dim, c->norm_eps);
    cpu_matmul(logits, s->xb, dj_lm_head_ptr(m), wt, T, dim, c->vocab_size);
}

int cpu_forward(dj_cpu_state *s, const int32_t *tokens, int64_t T, int64_t pos, float *logits, dj_err *e) {
    if (T < 0 || pos < 0 || pos > s->max_seq - T)
        return dj_fail(e, "cpu: positions %" PRId64 "..%" PRId64 " exceed the context of %" PRId64 " tokens", pos,
                       pos + T - 1, s->max_seq);
    for (int64_t t = 0; t < T; t++)
        if (tokens[t] < 0 || (uint32_t)tokens[t] >= s->c.vocab_size)
            return dj_fail(e, "cpu: token id %d out of range (vocab %u)", tokens[t], s->c.vocab_size);
    for (int64_t t0 = 0; t0 < T; t0 += CPU_CHUNK) {
        int64_t n = T - t0 < CPU_CHUNK ? T - t0 : CPU_CHUNK;
        cpu_forward_chunk(s, tokens + t0, n, pos + t0, logits ? logits + t0 * (int64_t)s->c.vocab_size : NULL);
    }
    return 0;
}
