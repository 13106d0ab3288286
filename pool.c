// pool.c: the CPU's worker threads (pool.h). A fixed set of workers, started on first use, that split a range
// [0, n) into equal contiguous parts; the caller takes part 0. Calls are serialised, so the pool is safe to use
// from several threads. Between calls a worker spins for POOL_SPIN_S before it sleeps, and the caller spins for
// the last parts: the GPU engine's CPU share makes ~130 calls per token, a few tens of microseconds apart, where a
// sleep and wake-up per call would cost about as much as the work. The workers are named "djinn-pool" (top -H shows
// them; tests/test_pool.c finds them by that name).
#include "pool.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <unistd.h>

#include "util.h"

#define POOL_SPIN_S 5e-4

static struct {
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
} cpu_pool = {.life_mu = PTHREAD_MUTEX_INITIALIZER, .call_mu = PTHREAD_MUTEX_INITIALIZER,
              .mu = PTHREAD_MUTEX_INITIALIZER, .start = PTHREAD_COND_INITIALIZER};
static int cpu_threads_wanted;  // 0: one per online core

static void cpu_pool_range(int part, int parts, int64_t n, int64_t *b, int64_t *e) {
    *b = n * part / parts;
    *e = n * (part + 1) / parts;
}

static void *cpu_pool_worker(void *arg) {
    int part = (int)(intptr_t)arg;
    uint64_t seen = cpu_pool.base;
    for (;;) {
        uint64_t g = atomic_load(&cpu_pool.generation);
        for (double t0 = dj_now(); g == seen; g = atomic_load(&cpu_pool.generation)) {
            for (int i = 0; i < 64 && g == seen; i++, g = atomic_load(&cpu_pool.generation)) dj_cpu_relax();
            if (g != seen || dj_now() - t0 < POOL_SPIN_S) continue;
            pthread_mutex_lock(&cpu_pool.mu);  // the caller bumps the generation under mu: no lost wake-up
            cpu_pool.asleep++;
            while ((g = atomic_load(&cpu_pool.generation)) == seen) pthread_cond_wait(&cpu_pool.start, &cpu_pool.mu);
            cpu_pool.asleep--;
            pthread_mutex_unlock(&cpu_pool.mu);
        }
        seen = g;
        if (cpu_pool.stop) return NULL;
        int64_t b, e;
        cpu_pool_range(part, cpu_pool.n_threads, cpu_pool.n, &b, &e);
        if (b < e) cpu_pool.fn(cpu_pool.ctx, b, e);
        atomic_fetch_sub(&cpu_pool.pending, 1);
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

static void cpu_pool_start(void) {
    pthread_mutex_lock(&cpu_pool.life_mu);
    if (!atomic_load(&cpu_pool.started)) {
        int n = cpu_threads_planned();
        cpu_pool.stop = 0;
        cpu_pool.base = atomic_load(&cpu_pool.generation);  // no call bumps it before `started` is set
        cpu_pool.n_threads = 1;
        for (int i = 1; i < n; i++) {
            if (pthread_create(&cpu_pool.th[i], NULL, cpu_pool_worker, (void *)(intptr_t)i)) break;  // fewer: slower
            (void)pthread_setname_np(cpu_pool.th[i], "djinn-pool");  // a name is a convenience: its failure changes nothing
            cpu_pool.n_threads++;
        }
        atomic_store(&cpu_pool.started, 1);
    }
    pthread_mutex_unlock(&cpu_pool.life_mu);
}

void cpu_pool_stop(void) {
    pthread_mutex_lock(&cpu_pool.life_mu);
    if (atomic_load(&cpu_pool.started)) {
        pthread_mutex_lock(&cpu_pool.call_mu);  // no call in flight
        pthread_mutex_lock(&cpu_pool.mu);
        cpu_pool.stop = 1;
        atomic_fetch_add(&cpu_pool.generation, 1);
        pthread_cond_broadcast(&cpu_pool.start);
        pthread_mutex_unlock(&cpu_pool.mu);
        for (int i = 1; i < cpu_pool.n_threads; i++) pthread_join(cpu_pool.th[i], NULL);
        cpu_pool.n_threads = 0;
        atomic_store(&cpu_pool.started, 0);
        pthread_mutex_unlock(&cpu_pool.call_mu);
    }
    pthread_mutex_unlock(&cpu_pool.life_mu);
}

void cpu_set_threads(int n) { cpu_threads_wanted = n; }

int cpu_pool_asleep(void) {
    pthread_mutex_lock(&cpu_pool.mu);
    int n = cpu_pool.asleep;
    pthread_mutex_unlock(&cpu_pool.mu);
    return n;
}

int cpu_threads(void) {
    if (!atomic_load(&cpu_pool.started)) cpu_pool_start();
    return cpu_pool.n_threads;
}

void cpu_parallel_start(int64_t n, cpu_task_fn fn, void *ctx) {
    cpu_threads();
    pthread_mutex_lock(&cpu_pool.call_mu);
    cpu_pool.fn = fn;
    cpu_pool.ctx = ctx;
    cpu_pool.n = n;
    atomic_store(&cpu_pool.pending, cpu_pool.n_threads - 1);
    pthread_mutex_lock(&cpu_pool.mu);
    atomic_fetch_add(&cpu_pool.generation, 1);
    pthread_cond_broadcast(&cpu_pool.start);
    pthread_mutex_unlock(&cpu_pool.mu);
}

void cpu_parallel_join(void) {
    int64_t b, e;
    cpu_pool_range(0, cpu_pool.n_threads, cpu_pool.n, &b, &e);
    if (b < e) cpu_pool.fn(cpu_pool.ctx, b, e);
    while (atomic_load(&cpu_pool.pending) > 0) dj_cpu_relax();
    pthread_mutex_unlock(&cpu_pool.call_mu);
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
