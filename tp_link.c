// tp_link.c: the tensor-parallel GPUs' all-reduce, barrier and set-up turns (tp_link.h).
#include "tp_link.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"

struct tp_link {
    int n, devices[TP_MAX_GPUS];
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int arrived, turn;     // (under mu)
    _Atomic int gen, failed;  // barriers passed; a GPU failed (set under mu, polled without it)
    // GPU r's partials (two, by the parity of its all-reduces within a pass), written by its matmuls; in its memory,
    // the inboxes the others push their partials into (inbox[r][p] + k * max_len: GPU k's), the flags they raise
    // there (flag[r] + k * GPU_TP_XCHG_BLOCKS) and its own counts of exchanges, a block each (gpu_tp_exchange); the
    // host-mapped words: abort (raised by tp_fail) and each GPU's err (its exchange gave up)
    // (and the same inboxes as flagged words, 8 bytes a float, for the short exchanges: gpu_tp_exchange_ll)
    float *part[TP_MAX_GPUS][2], *inbox[TP_MAX_GPUS][2];
    unsigned long long *ll[TP_MAX_GPUS][2];
    int64_t ll_len;  // an inbox's words for one other GPU: max_len, at most gpu_tp_exchange_ll_max()
    int64_t max_len;
    int par[TP_MAX_GPUS];
    unsigned long long *count[TP_MAX_GPUS], *flag[TP_MAX_GPUS];
    int clock_khz[TP_MAX_GPUS];
    int *abort_word, *err;  // (1 + TP_MAX_GPUS ints, page-locked and mapped: abort_word then err)
    int *d_abort[TP_MAX_GPUS], *d_err[TP_MAX_GPUS];  // their addresses on GPU r
    // parts sharing a device (tests' stand-in for GPUs): an exchange spinning on the device could block, in a
    // hardware queue the device's streams share, the kernel of the part it waits for; they meet on the host instead
    // (events recorded after each partial, a barrier, waits, the partials summed where they lie)
    int shared;
    cudaEvent_t ready[TP_MAX_GPUS][2];
    // the head split (tp_head_agree): each GPU's vocab rows, each one's word and the verdict, GPU 0's logits; the
    // gather's counts and flags are the second halves of count[r] and flag[r] (gather_words)
    tp_range vocab[TP_MAX_GPUS];
    int head_can[TP_MAX_GPUS], head_split;
    float *logits0;
};

// GPU r's inbox of flagged words (one parity): ll_len words for each GPU
static size_t ll_bytes(const tp_link *l) { return (size_t)l->ll_len * (size_t)l->n * sizeof(unsigned long long); }

// count[r] and flag[r]: the exchange's words, then the gather's as many (GPU_TP_XCHG_BLOCKS a GPU each)
#define TP_WORDS (2 * GPU_TP_XCHG_BLOCKS)
static unsigned long long *gather_words(unsigned long long *w, int n) { return w + (size_t)n * GPU_TP_XCHG_BLOCKS; }

tp_link *tp_link_new(int n, const int *devices, dj_err *e) {
    if (n < 2 || n > TP_MAX_GPUS) {
        dj_fail(e, "tensor parallel: %d GPUs (2 to %d)", n, TP_MAX_GPUS);
        return NULL;
    }
    tp_link *l = calloc(1, sizeof *l);
    if (!l) {
        dj_fail(e, "out of memory");
        return NULL;
    }
    l->n = n;
    for (int r = 0; r < n; r++) l->devices[r] = devices[r];
    for (int r = 0; r < n; r++)
        for (int q = 0; q < r; q++) l->shared |= devices[q] == devices[r];
    pthread_mutex_init(&l->mu, NULL);
    pthread_cond_init(&l->cv, NULL);
    return l;
}

void tp_link_free(tp_link *l) {
    if (!l) return;
    for (int r = 0; r < l->n; r++)
        if (l->part[r][0] || l->count[r]) {
            gpu_set_device(l->devices[r], NULL);
            gpu_free(l->count[r]), gpu_free(l->flag[r]);
            for (int p = 0; p < 2; p++) {
                gpu_free(l->part[r][p]), gpu_free(l->inbox[r][p]), gpu_free(l->ll[r][p]);
                if (l->ready[r][p]) gpu_event_destroy(l->ready[r][p]);
            }
        }
    gpu_host_free(l->abort_word);
    pthread_mutex_destroy(&l->mu);
    pthread_cond_destroy(&l->cv);
    free(l);
}

// A waiter polls before it sleeps: the GPUs' threads meet twice a layer, a few microseconds apart when the GPUs keep
// pace, where a sleep and its wake-up cost tens of microseconds each (64 of them a Llama-3-8B token).
#define TP_SPINS 20000  // polls, some tens of microseconds

int tp_barrier(tp_link *l, dj_err *e) {
    pthread_mutex_lock(&l->mu);
    const int gen = atomic_load(&l->gen);
    if (!atomic_load(&l->failed) && ++l->arrived == l->n) {  // the last to arrive lets every one go
        l->arrived = 0;
        atomic_fetch_add(&l->gen, 1);
        pthread_cond_broadcast(&l->cv);
        pthread_mutex_unlock(&l->mu);
        return 0;
    }
    pthread_mutex_unlock(&l->mu);
    for (int i = 0; i < TP_SPINS && atomic_load(&l->gen) == gen && !atomic_load(&l->failed); i++) dj_cpu_relax();
    pthread_mutex_lock(&l->mu);  // (the last arrival changes gen under mu: no wake-up is lost)
    while (!atomic_load(&l->failed) && atomic_load(&l->gen) == gen) pthread_cond_wait(&l->cv, &l->mu);
    const int failed = atomic_load(&l->gen) == gen;  // let go by a failure, not by every GPU arriving
    pthread_mutex_unlock(&l->mu);
    return failed ? dj_fail(e, "another GPU's pass failed") : 0;
}

void tp_fail(tp_link *l) {
    pthread_mutex_lock(&l->mu);
    atomic_store(&l->failed, 1);
    if (l->abort_word) *(volatile int *)l->abort_word = 1;  // the GPUs waiting in a meeting give up
    pthread_cond_broadcast(&l->cv);
    pthread_mutex_unlock(&l->mu);
}

void tp_reset(tp_link *l) {
    atomic_store(&l->failed, 0), l->arrived = 0;
    if (l->abort_word) *(volatile int *)l->abort_word = 0;
    for (int r = 0; r < l->n; r++) l->par[r] = 0;
    if (l->err) memset(l->err, 0, (size_t)l->n * sizeof(int));
}

// (the flagged words too: counts restart at 1, and a word of the pass that failed could carry a count to come)
int tp_rejoin(tp_link *l, int rank, dj_err *e) {
    if (l->shared) return 0;
    for (int p = 0; p < 2; p++)
        if (gpu_memset(l->ll[rank][p], 0, ll_bytes(l), NULL, e)) return -1;
    return gpu_memset(l->count[rank], 0, TP_WORDS * sizeof(unsigned long long), NULL, e) ||
           gpu_memset(l->flag[rank], 0, (size_t)l->n * TP_WORDS * sizeof(unsigned long long), NULL, e) ||
           gpu_device_sync(e);
}

int tp_gave_up(const tp_link *l) {
    for (int r = 0; l->err && r < l->n; r++)
        if (((volatile int *)l->err)[r]) return 1;
    return 0;
}

void tp_pass_begin(tp_link *l, int rank) { l->par[rank] = 0; }

int tp_link_join(tp_link *l, int rank, int64_t max_rows, int64_t dim, tp_range vocab_rows, dj_err *e) {
    const size_t part = (size_t)(max_rows * dim) * 4, words = TP_WORDS * sizeof(unsigned long long);
    l->max_len = max_rows * dim;  // (every GPU's the same)
    l->ll_len = l->max_len < gpu_tp_exchange_ll_max() ? l->max_len : gpu_tp_exchange_ll_max();
    l->vocab[rank] = vocab_rows;
    for (int p = 0; p < 2; p++)
        if (gpu_malloc((void **)&l->part[rank][p], part, "tensor-parallel partial sums", e) ||
            (l->shared && gpu_event_create(&l->ready[rank][p], 0, e)) ||
            (!l->shared && (gpu_malloc((void **)&l->inbox[rank][p], part * l->n, "tensor-parallel partial sums", e) ||
                            gpu_malloc((void **)&l->ll[rank][p], ll_bytes(l), "tensor-parallel partial sums", e) ||
                            gpu_memset(l->ll[rank][p], 0, ll_bytes(l), NULL, e))))
            return -1;
    // the host-mapped words, GPU 0's to make (portable: every device maps them)
    if (rank == 0) {
        if (gpu_host_alloc((void **)&l->abort_word, (1 + TP_MAX_GPUS) * sizeof(int), "the GPUs' meeting words", e))
            return -1;
        memset(l->abort_word, 0, (1 + TP_MAX_GPUS) * sizeof(int));
        l->err = l->abort_word + 1;
    }
    if (gpu_malloc((void **)&l->count[rank], words, "the GPUs' meeting words", e) ||
        gpu_malloc((void **)&l->flag[rank], words * l->n, "the GPUs' meeting words", e) ||
        gpu_memset(l->count[rank], 0, words, NULL, e) || gpu_memset(l->flag[rank], 0, words * l->n, NULL, e) ||
        gpu_device_sync(e) || gpu_clock_khz(&l->clock_khz[rank], e))
        return -1;
    if (tp_barrier(l, e)) return -1;  // every GPU's buffers exist
    if (gpu_host_device_ptr((void **)&l->d_abort[rank], l->abort_word, e) ||
        gpu_host_device_ptr((void **)&l->d_err[rank], l->err + rank, e))
        return -1;
    for (int r = 0; r < l->n; r++)
        if (gpu_peer_enable(l->devices[r], e)) return -1;
    return 0;
}

float *tp_part(tp_link *l, int rank) { return l->part[rank][l->par[rank]]; }

// The GPUs exchange their partials on the device (gpu_tp_exchange), so the host threads never wait for each other
// within a pass and a pass can be one CUDA graph. GPU k pushes into GPU r's inbox of parity p (floats, or flagged
// words for a short exchange) again only two all-reduces later, once its exchange between has seen r's flags or
// words for it, which r sends only after its sum of inbox p (stream order): no GPU overwrites a partial another is
// still reading. A pass has an even number of
// all-reduces and each starts at parity 0 (tp_pass_begin), so a captured pass's pointers are those of every replay.
// Parts sharing a device meet on the host: each waits for every other's event, whose latest record the barrier
// makes this all-reduce's, and sums the partials where they lie.
int tp_allreduce(tp_link *l, int rank, float *out, int64_t n, cudaStream_t s, dj_err *e) {
    const int p = l->par[rank];
    l->par[rank] ^= 1;
    if (n > l->max_len) return dj_fail(e, "tensor parallel: an all-reduce of %lld floats (at most %lld)", (long long)n,
                                       (long long)l->max_len);
    if (l->shared) {
        const float *parts[TP_MAX_GPUS];
        for (int r = 0; r < l->n; r++) parts[r] = l->part[r][p];
        if (gpu_event_record(l->ready[rank][p], s, e) || tp_barrier(l, e)) return -1;
        for (int r = 0; r < l->n; r++)
            if (r != rank && gpu_stream_wait(s, l->ready[r][p], e)) return -1;
        return gpu_sum_parts(out, parts, l->n, n, s, e);
    }
    gpu_tp_xchg x;
    memset(&x, 0, sizeof x);
    for (int k = 0; k < l->n; k++) {
        if (k == rank) continue;
        x.out[k] = l->inbox[k][p] + rank * l->max_len;
        x.flag_out[k] = l->flag[k] + rank * GPU_TP_XCHG_BLOCKS;
        x.in[k] = l->inbox[rank][p] + k * l->max_len;
        x.flag_in[k] = l->flag[rank] + k * GPU_TP_XCHG_BLOCKS;
        x.ll_out[k] = l->ll[k][p] + rank * l->ll_len;
        x.ll_in[k] = l->ll[rank][p] + k * l->ll_len;
    }
    return gpu_tp_exchange(out, l->part[rank][p], n, &x, l->n, rank, l->count[rank], l->d_abort[rank], l->d_err[rank],
                           l->clock_khz[rank], s, e);
}

int tp_graphable(const tp_link *l) { return !l->shared; }

// ---- the head split by vocab rows
tp_range tp_vocab_rows(const tp_link *l, int rank) { return l->vocab[rank]; }

int tp_head_agree(tp_link *l, int rank, int can, float *logits, dj_err *e) {
    l->head_can[rank] = can;
    if (rank == 0) l->logits0 = logits;
    if (tp_barrier(l, e)) return -1;  // every GPU's word is in
    int all = !l->shared;
    for (int r = 0; r < l->n; r++) all &= l->head_can[r];
    if (rank == 0) l->head_split = all;
    return all;
}

int tp_head_split(const tp_link *l) { return l->head_split; }

// GPU r's flags are the exchange's layout in the gather's half of the words: GPU k's in GPU r's memory at
// gather_words(flag[r]) + k * GPU_TP_XCHG_BLOCKS. The blocks are cut for the widest GPU's rows (the first's), so
// every GPU launches as many.
int tp_head_gather(tp_link *l, int rank, const float *mine, int64_t rows, cudaStream_t s, dj_err *e) {
    const tp_range v = l->vocab[rank];
    const int64_t vocab = l->vocab[l->n - 1].hi;
    gpu_tp_flags f;
    memset(&f, 0, sizeof f);
    for (int k = 0; k < l->n; k++) {
        if (k == rank) continue;
        f.flag_out[k] = gather_words(l->flag[k], l->n) + rank * GPU_TP_XCHG_BLOCKS;
        f.flag_in[k] = gather_words(l->flag[rank], l->n) + k * GPU_TP_XCHG_BLOCKS;
    }
    const int blocks = gpu_tp_exchange_blocks(rows * (l->vocab[0].hi - l->vocab[0].lo));
    return gpu_tp_gather(l->logits0, vocab, v.lo, mine, rows, v.hi - v.lo, blocks, &f, l->n, rank,
                         gather_words(l->count[rank], 1), l->d_abort[rank], l->d_err[rank], l->clock_khz[rank], s, e);
}

int tp_turn_begin(tp_link *l, int rank, dj_err *e) {
    pthread_mutex_lock(&l->mu);
    while (!l->failed && l->turn != rank) pthread_cond_wait(&l->cv, &l->mu);
    int failed = l->failed;
    pthread_mutex_unlock(&l->mu);
    return failed ? dj_fail(e, "another GPU's set-up failed") : 0;
}

void tp_turn_end(tp_link *l, int rank) {
    pthread_mutex_lock(&l->mu);
    if (l->turn == rank) l->turn++;
    pthread_cond_broadcast(&l->cv);
    pthread_mutex_unlock(&l->mu);
}

int tp_turn_sharers(const tp_link *l, int rank) {
    int k = 0;
    for (int r = rank; r < l->n; r++) k += l->devices[r] == l->devices[rank];
    return k;
}
