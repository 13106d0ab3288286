// tp_link.c: the tensor-parallel GPUs' all-reduce, barrier and set-up turns (tp_link.h).
#include "tp_link.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "kernels.h"

struct tp_link {
    int n, devices[TP_MAX_GPUS];
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int arrived, turn;     // (under mu)
    _Atomic int gen, failed;  // barriers passed; a GPU failed (set under mu, polled without it)
    // GPU r's partials (two, by the parity of its all-reduces) and the events recorded after each was written
    float *part[TP_MAX_GPUS][2];
    cudaEvent_t ready[TP_MAX_GPUS][2];
    int par[TP_MAX_GPUS];
};

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
    pthread_mutex_init(&l->mu, NULL);
    pthread_cond_init(&l->cv, NULL);
    return l;
}

void tp_link_free(tp_link *l) {
    if (!l) return;
    for (int r = 0; r < l->n; r++)
        for (int p = 0; p < 2; p++) {
            if (l->part[r][p]) gpu_set_device(l->devices[r], NULL), gpu_free(l->part[r][p]);
            if (l->ready[r][p]) gpu_event_destroy(l->ready[r][p]);
        }
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
    pthread_cond_broadcast(&l->cv);
    pthread_mutex_unlock(&l->mu);
}

void tp_reset(tp_link *l) {
    atomic_store(&l->failed, 0), l->arrived = 0;
    for (int r = 0; r < l->n; r++) l->par[r] = 0;
}

int tp_link_join(tp_link *l, int rank, int64_t max_rows, int64_t dim, dj_err *e) {
    for (int p = 0; p < 2; p++)
        if (gpu_malloc((void **)&l->part[rank][p], (size_t)(max_rows * dim) * 4, "tensor-parallel partial sums", e) ||
            gpu_event_create(&l->ready[rank][p], 0, e))
            return -1;
    if (tp_barrier(l, e)) return -1;  // every GPU's buffers exist
    for (int r = 0; r < l->n; r++)
        if (gpu_peer_enable(l->devices[r], e)) return -1;
    return 0;
}

float *tp_part(tp_link *l, int rank) { return l->part[rank][l->par[rank]]; }

// GPU r writes part[r][p] again only two all-reduces later, after waiting at the one between for every GPU's event
// recorded after its sum of part[.][p]: no GPU overwrites a partial another is still reading. A wait takes the
// event's latest record, which the barrier makes the one of this all-reduce.
int tp_allreduce(tp_link *l, int rank, float *out, int64_t n, cudaStream_t s, dj_err *e) {
    const int p = l->par[rank];
    l->par[rank] ^= 1;
    if (gpu_event_record(l->ready[rank][p], s, e) || tp_barrier(l, e)) return -1;
    const float *parts[TP_MAX_GPUS];
    for (int r = 0; r < l->n; r++) {
        parts[r] = l->part[r][p];
        if (r != rank && gpu_stream_wait(s, l->ready[r][p], e)) return -1;
    }
    return gpu_sum_parts(out, parts, l->n, n, s, e);
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
