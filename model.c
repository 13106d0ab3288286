// model.c: the model.bin format (layout, pure parser, header writer), the loader, and the CPU reference
// forward pass.
#include "model.h"

#include <stdlib.h>
#include <string.h>

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cuda_runtime_api.h>

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
    }
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
    for (size_t i = sizeof h; i < DJ_HEADER_SIZE; i++)
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
// CPU path: the file is mapped read-only; pages come in as the forward pass touches them.
// GPU path: the sections that travel to the GPU (layers, head, and the embeddings when they are the tied
// head) are read by several threads into anonymous memory and page-locked section by section with
// cudaHostRegister, so every H2D copy of a slab runs at full PCIe speed. A slab never spans two
// registrations, so each copy stays on the pinned path.
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
    dj_err err;
    pthread_mutex_t err_lock;
} load_ctx;

// Job j: section j of the canonical order tokenizer, embed, layers..., head.
static void job_span(const dj_model_info *m, uint32_t j, uint64_t *off, uint64_t *size, int *pin) {
    uint32_t nl = m->config.n_layers;
    if (j == 0) *off = m->tok_off, *size = m->tok_size, *pin = 0;
    else if (j == 1) *off = m->embed_off, *size = m->embed_size, *pin = m->config.tied;
    else if (j < 2 + nl) *off = m->layer_off[j - 2], *size = m->layer.size, *pin = 1;
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
        uint64_t off, size;
        int pin;
        job_span(c->info, j, &off, &size, &pin);
        for (uint64_t done = 0; done < size && !c->failed;) {
            size_t want = (size_t)(size - done < LOAD_CHUNK ? size - done : LOAD_CHUNK);
            ssize_t got = pread(c->fd, c->base + off + done, want, (off_t)(off + done));
            if (got <= 0) {
                char msg[256];
                if (got < 0) snprintf(msg, sizeof msg, "read error at byte %llu: %s", (unsigned long long)(off + done),
                                      strerror(errno));
                else snprintf(msg, sizeof msg, "the file shrank to %llu bytes while loading (changed on disk?)",
                              (unsigned long long)(off + done));
                load_fail(c, msg);
                return NULL;
            }
            done += (uint64_t)got;
            c->done_bytes += (uint64_t)got;
        }
        cudaError_t ce;
        if (c->pin && pin && (ce = cudaHostRegister(c->base + off, size, cudaHostRegisterPortable)) != cudaSuccess) {
            char msg[256];
            snprintf(msg, sizeof msg, "cannot page-lock %.2f GB at offset %llu: cudaHostRegister: %s",
                     (double)size / 1e9, (unsigned long long)off, cudaGetErrorName(ce));
            load_fail(c, msg);
            return NULL;
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
    if (!o->want_pinned) {
        void *p = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
        close(fd);
        if (p == MAP_FAILED) {
            dj_info_free(&m->info);
            return dj_fail(e, "cannot map %s: %s", path, strerror(errno));
        }
        madvise(p, size, MADV_WILLNEED);
        m->data = p, m->data_size = size, m->mapped = 1;
        return 0;
    }

    // GPU path: anonymous memory, read in parallel, each travelling section registered as it lands.
    void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
        close(fd);
        dj_info_free(&m->info);
        return dj_fail(e, "cannot allocate %.2f GB of host memory for %s", (double)size / 1e9, path);
    }
    madvise(p, size, MADV_HUGEPAGE);
    load_ctx c = {.fd = fd, .base = p, .info = &m->info, .pin = 1, .n_jobs = m->info.config.n_layers + 3};
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
    close(fd);
    pthread_mutex_destroy(&c.err_lock);
    m->data = p, m->data_size = size, m->pinned = 1;
    if (c.failed) {
        model_free(m);
        return dj_fail(e, "%s: %s", path, c.err.msg);
    }
    dj_progress_end(&pr, c.done_bytes);
    return 0;
}

void model_free(dj_model *m) {
    if (m->data) {
        if (m->pinned) {
            uint32_t nl = m->info.config.n_layers;
            for (uint32_t j = 0; j < nl + 3; j++) {
                uint64_t off, size;
                int pin;
                job_span(&m->info, j, &off, &size, &pin);
                if (pin && cudaHostUnregister(m->data + off) != cudaSuccess)
                    cudaGetLastError();  // a section whose registration never happened (failed load)
            }
        }
        munmap(m->data, m->data_size);
    }
    dj_info_free(&m->info);
    memset(m, 0, sizeof *m);
}

// ---- CPU reference
// (everything below this banner belongs to the CPU forward pass)

#include <assert.h>
#include <inttypes.h>
#include <math.h>

// ---- CPU reference: thread pool
// A fixed set of workers, started on first use, that split a range [0, n) into equal contiguous parts; the
// caller takes part 0. Calls are serialised, so the pool is safe to use from several threads.
typedef void (*cpu_task_fn)(void *ctx, int64_t begin, int64_t end);

static struct {
    pthread_once_t once;
    pthread_mutex_t call_mu;  // one parallel_for at a time
    pthread_mutex_t mu;
    pthread_cond_t start, done;
    int n_threads;            // workers + the caller
    uint64_t generation;      // bumped per call: workers wait for a new value
    int pending;              // workers still running the current call
    cpu_task_fn fn;
    void *ctx;
    int64_t n;
} cpu_pool = {.once = PTHREAD_ONCE_INIT, .call_mu = PTHREAD_MUTEX_INITIALIZER, .mu = PTHREAD_MUTEX_INITIALIZER,
              .start = PTHREAD_COND_INITIALIZER, .done = PTHREAD_COND_INITIALIZER};
static int cpu_threads_wanted;  // 0: one per online core

static void cpu_pool_range(int part, int parts, int64_t n, int64_t *b, int64_t *e) {
    *b = n * part / parts;
    *e = n * (part + 1) / parts;
}

static void *cpu_pool_worker(void *arg) {
    int part = (int)(intptr_t)arg;
    uint64_t seen = 0;
    pthread_mutex_lock(&cpu_pool.mu);
    for (;;) {
        while (cpu_pool.generation == seen) pthread_cond_wait(&cpu_pool.start, &cpu_pool.mu);
        seen = cpu_pool.generation;
        cpu_task_fn fn = cpu_pool.fn;
        void *ctx = cpu_pool.ctx;
        int64_t b, e;
        cpu_pool_range(part, cpu_pool.n_threads, cpu_pool.n, &b, &e);
        pthread_mutex_unlock(&cpu_pool.mu);
        if (b < e) fn(ctx, b, e);
        pthread_mutex_lock(&cpu_pool.mu);
        if (--cpu_pool.pending == 0) pthread_cond_signal(&cpu_pool.done);
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
    pthread_mutex_lock(&cpu_pool.mu);
    cpu_pool.fn = fn;
    cpu_pool.ctx = ctx;
    cpu_pool.n = n;
    cpu_pool.pending = cpu_pool.n_threads - 1;
    cpu_pool.generation++;
    pthread_cond_broadcast(&cpu_pool.start);
    pthread_mutex_unlock(&cpu_pool.mu);
    int64_t b, e;
    cpu_pool_range(0, cpu_pool.n_threads, n, &b, &e);
    if (b < e) fn(ctx, b, e);
    pthread_mutex_lock(&cpu_pool.mu);
    while (cpu_pool.pending > 0) pthread_cond_wait(&cpu_pool.done, &cpu_pool.mu);
    pthread_mutex_unlock(&cpu_pool.mu);
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
    float *tmp = out;
    const float *row = cpu_widen_row(tmp, dj_embed_ptr(m), c->wtype, token, c->dim);
    if (row != out) memcpy(out, row, (size_t)c->dim * sizeof(float));
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
