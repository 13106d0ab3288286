// loader.c: model.bin from disk into host memory. Every section is read by several threads into anonymous memory
// (not an mmap of the file: a file truncated under a mapping kills the process with SIGBUS mid-generation, where a
// read reports it); for the GPU engine the sections that travel are page-locked one by one as they land.
#include "loader.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fileio.h"
#include "gpu_host.h"

// ---- reading in parallel
// Every section is read by several threads into anonymous memory. For the GPU the sections that travel
// (layers, head, and the embeddings when they are the tied head) are page-locked one by one with
// cudaHostRegister as they land, so every H2D copy of a slab runs at full PCIe speed; a slab never spans
// two registrations, so each copy stays on the pinned path.
#define LOAD_CHUNK (64ull << 20)

volatile sig_atomic_t dj_load_cancel;
#define INTERRUPTED "interrupted"

typedef struct {
    int fd;
    uint8_t *base;
    const dj_model_info *info;
    int pin;
    uint32_t n_jobs;
    _Atomic uint32_t next_job;
    _Atomic uint64_t done_bytes;
    uint64_t test_bps;               // test-only (DJINN_TEST_LOAD_BPS; 0 in every real load): see load_worker
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
    if (j == 0) *off = 0, *size = m->header_bytes, *pin = 0;
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
            if (dj_load_cancel) {  // Ctrl-C: a chunk is the longest wait (64 MiB: tens of ms at disk speed)
                load_fail(c, INTERRUPTED);
                return NULL;
            }
            size_t want = (size_t)(off + size - at < LOAD_CHUNK ? off + size - at : LOAD_CHUNK);
            // Test-only: DJINN_TEST_LOAD_BPS=N reads at most N bytes a second a thread, a disk slow enough that a
            // test can interrupt a load of the tiny model while it runs.
            if (c->test_bps) want = want < c->test_bps / 20 + 1 ? want : (size_t)(c->test_bps / 20 + 1);
            ssize_t got = pread(c->fd, c->base + at, want, (off_t)at);
            if (c->test_bps) usleep(50000);
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
        if (dj_load_cancel) {  // page-locking a section takes as long as reading it: not after Ctrl-C
            load_fail(c, INTERRUPTED);
            return NULL;
        }
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
    size_t n = DJ_MAX_HEADER_BYTES;
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
    struct stat st;
    int fd = in_open(path, "model", &st, e);
    if (fd < 0) return -1;
    uint64_t size = (uint64_t)st.st_size;
    dj_err pe;
    if (read_header(fd, size, &m->info, &pe)) {
        close(fd);
        return dj_fail(e, "%s: %s", path, pe.msg);
    }
    if (o->test_hook_after_header) o->test_hook_after_header(o->test_hook_arg);
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
    const char *bps = getenv("DJINN_TEST_LOAD_BPS");
    c.test_bps = bps ? strtoull(bps, NULL, 10) : 0;
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
    dj_err ce;  // a file rewritten or resized while it was read is not the file that was validated
    if (!c.failed && in_unchanged(fd, &st, "the file", &ce))
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

int model_pin(dj_model *m, dj_err *e) {
    m->pin_tried = 1;
    for (uint32_t j = 0; j < LOAD_JOBS(&m->info); j++) {
        uint64_t off, size;
        int pin;
        job_span(&m->info, j, &off, &size, &pin);
        if (pin && gpu_host_register(m->data + off, size, 0, e)) return -1;
    }
    m->pinned = 1;
    return 0;
}

uint32_t model_fingerprint(const dj_model *m) {
    if (m->released) return m->fingerprint;
    const dj_model_info *in = &m->info;
    uint32_t crc = dj_crc32(0, m->data, in->header_bytes < m->data_size ? (size_t)in->header_bytes : m->data_size);
    uint64_t off[DJ_MAX_LAYERS + 3], size[DJ_MAX_LAYERS + 3];
    int n = 0;
    off[n] = in->tok_off, size[n++] = in->tok_size;
    off[n] = in->embed_off, size[n++] = in->embed_size;
    for (uint32_t l = 0; l < in->config.n_layers; l++) off[n] = in->layer_off[l], size[n++] = in->layer.size;
    off[n] = in->head_off, size[n++] = in->head_size;
    for (int i = 0; i < n; i++) {
        uint64_t at[2] = {off[i], off[i] + size[i] / 2}, len = size[i] < 4096 ? size[i] : 4096;
        for (int k = 0; k < 2; k++)
            if (at[k] + len <= m->data_size) crc = dj_crc32(crc, m->data + at[k], (size_t)len);
    }
    return crc;
}

void model_release(dj_model *m, uint64_t off, uint64_t size) {
    if (!m->released) m->fingerprint = model_fingerprint(m), m->released = 1;
    if (m->pin_tried) gpu_host_unregister(m->data + off, NULL);  // (fails harmlessly where it never registered)
    madvise(m->data + off, size, MADV_DONTNEED);                // the pages go back; reads now give zeros
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
