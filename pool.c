// pool.c: the CPU's worker threads (pool.h). A fixed set of workers, started on first use, that split a range
// [0, n) into equal contiguous parts; the caller takes part 0. Calls are serialised, so the pool is safe to use
// from several threads. Between calls a worker spins for POOL_SPIN_S before it sleeps, and the caller spins for
// the last parts: the GPU engine's CPU share makes ~130 calls per token, a few tens of microseconds apart, where a
// sleep and wake-up per call would cost about as much as the work. The workers are named "djinn-pool" (top -H shows
// them; tests/test_pool.c finds them by that name). Beside the process's pool, pools of their own (cpu_pool_new) for
// the GPU engines of a tensor-parallel run, whose CPU shares run at once: a thread works with the pool it chose
// (cpu_pool_use), else the process's.
#include "pool.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <unistd.h>

#include "util.h"

#define POOL_SPIN_S 5e-4

struct cpu_pool {
    pthread_mutex_t life_mu;  // starting and stopping the workers
    _Atomic int started;
    pthread_t th[256];
    int stop;                 // set (with a new generation) to make the workers return
    uint64_t base;            // the generation when the workers started: the next one is their first call
    pthread_mutex_t call_mu;  // one parallel_for at a time
    pthread_mutex_t mu;       // with `start`: sleeping workers
    pthread_cond_t start;
    int n_threads;            // workers + the caller
    _Atomic uint64_t generation;  // bumped per call (after fn, ctx, n are set): workers wait for a new value
    _Atomic int pending;          // workers still running the current call
    int asleep;                   // workers waiting on `start` (under mu; cpu_pool_asleep)
    cpu_task_fn fn;
    void *ctx;
    int64_t n;
    pthread_mutex_t job_mu;  // cpu.c's asynchronous job, one at a time (cpu_pool_hold)
    int size;                // a pool of its own: its threads; 0: the process's (cpu_threads_planned)
    struct cpu_pool_arg {
        struct cpu_pool *p;
        int part;
    } arg[256];
};
static cpu_pool process_pool = {.life_mu = PTHREAD_MUTEX_INITIALIZER, .call_mu = PTHREAD_MUTEX_INITIALIZER,
                                .mu = PTHREAD_MUTEX_INITIALIZER, .start = PTHREAD_COND_INITIALIZER,
                                .job_mu = PTHREAD_MUTEX_INITIALIZER};
static _Thread_local cpu_pool *thread_pool;  // cpu_pool_use's; NULL: the process's
static int cpu_threads_wanted;               // 0: one per online core

static cpu_pool *current(void) { return thread_pool ? thread_pool : &process_pool; }

static void cpu_pool_range(int part, int parts, int64_t n, int64_t *b, int64_t *e) {
    *b = n * part / parts;
    *e = n * (part + 1) / parts;
}

static void *cpu_pool_worker(void *arg) {
    cpu_pool *pl = ((struct cpu_pool_arg *)arg)->p;
    int part = ((struct cpu_pool_arg *)arg)->part;
    uint64_t seen = pl->base;
    for (;;) {
        uint64_t g = atomic_load(&pl->generation);
        for (double t0 = dj_now(); g == seen; g = atomic_load(&pl->generation)) {
            for (int i = 0; i < 64 && g == seen; i++, g = atomic_load(&pl->generation)) dj_cpu_relax();
            if (g != seen || dj_now() - t0 < POOL_SPIN_S) continue;
            pthread_mutex_lock(&pl->mu);  // the caller bumps the generation under mu: no lost wake-up
            pl->asleep++;
            while ((g = atomic_load(&pl->generation)) == seen) pthread_cond_wait(&pl->start, &pl->mu);
            pl->asleep--;
            pthread_mutex_unlock(&pl->mu);
        }
        seen = g;
        if (pl->stop) return NULL;
        int64_t b, e;
        cpu_pool_range(part, pl->n_threads, pl->n, &b, &e);
        if (b < e) pl->fn(pl->ctx, b, e);
        atomic_fetch_sub(&pl->pending, 1);
    }
}

// One per CPU the process may run on (its affinity mask: taskset, cgroups' cpusets), else per online core.
static long cpu_affinity_count(void) {
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0) return CPU_COUNT(&set);
    return sysconf(_SC_NPROCESSORS_ONLN);
}

int cpu_threads_planned(void) {
    long n = cpu_threads_wanted > 0 ? cpu_threads_wanted : cpu_affinity_count();
    return n < 1 ? 1 : n > 256 ? 256 : (int)n;
}

static void pool_start(cpu_pool *pl) {
    pthread_mutex_lock(&pl->life_mu);
    if (!atomic_load(&pl->started)) {
        int n = pl->size ? pl->size : cpu_threads_planned();
        pl->stop = 0;
        pl->base = atomic_load(&pl->generation);  // no call bumps it before `started` is set
        pl->n_threads = 1;
        for (int i = 1; i < n; i++) {
            pl->arg[i] = (struct cpu_pool_arg){pl, i};
            if (pthread_create(&pl->th[i], NULL, cpu_pool_worker, &pl->arg[i])) break;  // fewer: slower
            (void)pthread_setname_np(pl->th[i], "djinn-pool");  // a name is a convenience: its failure changes nothing
            pl->n_threads++;
        }
        atomic_store(&pl->started, 1);
    }
    pthread_mutex_unlock(&pl->life_mu);
}

static void pool_stop(cpu_pool *pl) {
    pthread_mutex_lock(&pl->life_mu);
    if (atomic_load(&pl->started)) {
        pthread_mutex_lock(&pl->call_mu);  // no call in flight
        pthread_mutex_lock(&pl->mu);
        pl->stop = 1;
        atomic_fetch_add(&pl->generation, 1);
        pthread_cond_broadcast(&pl->start);
        pthread_mutex_unlock(&pl->mu);
        for (int i = 1; i < pl->n_threads; i++) pthread_join(pl->th[i], NULL);
        pl->n_threads = 0;
        atomic_store(&pl->started, 0);
        pthread_mutex_unlock(&pl->call_mu);
    }
    pthread_mutex_unlock(&pl->life_mu);
}

void cpu_pool_stop(void) { pool_stop(current()); }

cpu_pool *cpu_pool_new(int threads) {
    cpu_pool *pl = calloc(1, sizeof *pl);
    if (!pl) return NULL;
    pthread_mutex_init(&pl->life_mu, NULL), pthread_mutex_init(&pl->call_mu, NULL);
    pthread_mutex_init(&pl->mu, NULL), pthread_mutex_init(&pl->job_mu, NULL);
    pthread_cond_init(&pl->start, NULL);
    pl->size = threads < 1 ? 1 : threads > 256 ? 256 : threads;
    return pl;
}

void cpu_pool_free(cpu_pool *pl) {
    if (!pl) return;
    pool_stop(pl);
    pthread_mutex_destroy(&pl->life_mu), pthread_mutex_destroy(&pl->call_mu);
    pthread_mutex_destroy(&pl->mu), pthread_mutex_destroy(&pl->job_mu);
    pthread_cond_destroy(&pl->start);
    free(pl);
}

void cpu_pool_use(cpu_pool *pl) { thread_pool = pl; }

void cpu_set_threads(int n) { cpu_threads_wanted = n; }

int cpu_pool_asleep(void) {
    cpu_pool *pl = current();
    pthread_mutex_lock(&pl->mu);
    int n = pl->asleep;
    pthread_mutex_unlock(&pl->mu);
    return n;
}

int cpu_threads(void) {
    cpu_pool *pl = current();
    if (!atomic_load(&pl->started)) pool_start(pl);
    return pl->n_threads;
}

void cpu_pool_hold(void) { pthread_mutex_lock(&current()->job_mu); }
void cpu_pool_unhold(void) { pthread_mutex_unlock(&current()->job_mu); }

void cpu_parallel_start(int64_t n, cpu_task_fn fn, void *ctx) {
    cpu_pool *pl = current();
    cpu_threads();
    pthread_mutex_lock(&pl->call_mu);
    pl->fn = fn;
    pl->ctx = ctx;
    pl->n = n;
    atomic_store(&pl->pending, pl->n_threads - 1);
    pthread_mutex_lock(&pl->mu);
    atomic_fetch_add(&pl->generation, 1);
    pthread_cond_broadcast(&pl->start);
    pthread_mutex_unlock(&pl->mu);
}

void cpu_parallel_join(void) {
    cpu_pool *pl = current();
    int64_t b, e;
    cpu_pool_range(0, pl->n_threads, pl->n, &b, &e);
    if (b < e) pl->fn(pl->ctx, b, e);
    while (atomic_load(&pl->pending) > 0) dj_cpu_relax();
    pthread_mutex_unlock(&pl->call_mu);
}

void cpu_parallel_for(int64_t n, double cost, cpu_task_fn fn, void *ctx) {
    if (n <= 0) return;
    if (n == 1 || cost < 65536.0 || cpu_threads() == 1) {
        fn(ctx, 0, n);
        return;
    }
    cpu_parallel_start(n, fn, ctx);
    cpu_parallel_join();
}
