// test_pool.c: the CPU's worker threads (pool.c): every index of a range computed exactly once whatever the split,
// the workers started on first use only (a call too small to share starts none) and joined by cpu_pool_stop, and
// idle workers asleep: a pool left spinning between calls would hold every core while nothing is shared. The
// workers are found by their name, "djinn-pool" (tests/common.c reads /proc/self/task). The GPU engine's side, no
// pool at all when its CPU share is off, is gpu_forward::no_pool_threads_without_a_share.
#include <criterion/criterion.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <unistd.h>

#include "../pool.h"
#include "common.h"

#define TP_THREADS 4  // the caller and three workers
#define TP_MAX 4096

static _Atomic int tp_hits[TP_MAX];

static void tp_count(void *ctx, int64_t b, int64_t e) {
    for (int64_t i = b; i < e; i++) atomic_fetch_add(&tp_hits[i], 1);
}

// A pool of TP_THREADS not started yet, whatever ran in this process before.
static void tp_fresh(void) {
    cpu_pool_stop();
    cpu_set_threads(TP_THREADS);
}

static int tp_workers(int *awake) { return tc_threads_named("djinn-pool", awake); }

// The workers left once a pool was stopped or freed. A joined thread can still be listed in /proc/self/task for a
// moment after pthread_join returns (the kernel reaps it after waking the joiner), so this waits up to 5 s for the
// count to reach 0; a worker never joined stays, and the count it returns is then not 0.
static int tp_workers_left(void) {
    int n = tp_workers(NULL);
    for (int i = 0; n && i < 5000; i++) {
        usleep(1000);
        n = tp_workers(NULL);
    }
    return n;
}

Test(pool, every_index_once) {
    tp_fresh();
    static const int64_t ns[] = {2, 3, 4, 5, 7, 64, 1000, TP_MAX - 1};
    for (size_t k = 0; k < sizeof ns / sizeof *ns; k++)
        for (int big = 0; big < 2; big++) {  // big: worth sharing; else computed by the caller alone
            for (int i = 0; i < TP_MAX; i++) tp_hits[i] = 0;
            cpu_parallel_for(ns[k], big ? 1e12 : 1, tp_count, NULL);
            for (int64_t i = 0; i < TP_MAX; i++)
                cr_assert_eq(tp_hits[i], i < ns[k], "n %lld (%s): index %lld computed %d times", (long long)ns[k],
                             big ? "shared" : "inline", (long long)i, tp_hits[i]);
        }
    cr_assert_eq(cpu_threads(), TP_THREADS);
    cpu_pool_stop();
}

Test(pool, started_on_first_use_and_joined_by_stop) {
    tp_fresh();
    cr_assert_eq(tp_workers(NULL), 0, "pool threads before any call");
    cr_assert_eq(cpu_threads_planned(), TP_THREADS);
    cr_assert_eq(tp_workers(NULL), 0, "cpu_threads_planned started the pool");
    cpu_parallel_for(100, 1, tp_count, NULL);  // too small to share: computed inline
    cr_assert_eq(tp_workers(NULL), 0, "a call too small to share started the pool");
    for (int round = 0; round < 2; round++) {  // a stopped pool starts again on the next call
        cpu_parallel_for(100, 1e12, tp_count, NULL);
        cr_assert_eq(tp_workers(NULL), TP_THREADS - 1, "round %d: %d workers, want %d", round, tp_workers(NULL),
                     TP_THREADS - 1);
        cpu_pool_stop();
        cr_assert_eq(tp_workers_left(), 0, "round %d: workers left after cpu_pool_stop", round);
    }
}

// Workers spin a short while after a call (POOL_SPIN_S) and then sleep: the pool's own count of sleeping workers
// reaches all of them, and /proc then finds every one of them asleep. Both are waited for, not timed: a worker that
// spins forever never gets there, and the test's timeout ends it as a failure.
Test(pool, idle_workers_sleep, .timeout = 60) {
    tp_fresh();
    cpu_parallel_for(1000, 1e12, tp_count, NULL);
    while (cpu_pool_asleep() < TP_THREADS - 1) sched_yield();
    int n, awake;
    while ((n = tp_workers(&awake)), awake) sched_yield();  // counted before the wait: now in it
    cr_assert_eq(n, TP_THREADS - 1, "%d workers, want %d", n, TP_THREADS - 1);
    cr_assert_eq(cpu_pool_asleep(), TP_THREADS - 1, "a worker woke with no call");
    cpu_pool_stop();
}

// Pools of their own (the GPU engines of a tensor-parallel run, each with its CPU share): a call on one pool runs
// while another pool's call is in flight, and so does a held job. Thread A starts a call on its pool whose parts
// wait until the main thread's call on another pool has finished; one pool for both would serialise the calls and
// never finish (alarm: the test fails rather than hangs). Each pool starts its own workers, freed with it.
static _Atomic int tp_other_done, tp_a_in;
static void tp_wait_other(void *ctx, int64_t b, int64_t e) {
    (void)ctx;
    atomic_store(&tp_a_in, 1);
    while (!atomic_load(&tp_other_done)) sched_yield();
    tp_count(NULL, b, e);
}
static void *tp_pool_a(void *p) {
    cpu_pool_use(p);
    cpu_pool_hold();  // cpu.c's job on this pool held meanwhile
    cpu_parallel_start(64, tp_wait_other, NULL);
    cpu_parallel_join();
    cpu_pool_unhold();
    cpu_pool_use(NULL);
    return NULL;
}
Test(pool, own_pools_run_at_once) {
    tp_fresh();
    alarm(20);
    for (int i = 0; i < TP_MAX; i++) tp_hits[i] = 0;
    atomic_store(&tp_other_done, 0), atomic_store(&tp_a_in, 0);
    cpu_pool *a = cpu_pool_new(2), *b = cpu_pool_new(3);
    cr_assert(a && b);
    pthread_t th;
    cr_assert_eq(pthread_create(&th, NULL, tp_pool_a, a), 0);
    cpu_pool_use(b);
    while (!atomic_load(&tp_a_in)) sched_yield();  // A's call in flight
    cpu_pool_hold();
    cpu_parallel_for(1000, 1e12, tp_count, NULL);
    cpu_pool_unhold();
    cr_assert_eq(cpu_threads(), 3);
    atomic_store(&tp_other_done, 1);
    pthread_join(th, NULL);
    cpu_pool_use(NULL);
    for (int64_t i = 0; i < TP_MAX; i++)
        cr_assert_eq(tp_hits[i], (i < 64) + (i < 1000), "index %lld computed %d times", (long long)i, tp_hits[i]);
    cr_assert_eq(tp_workers(NULL), 1 + 2, "workers of the two pools: %d, want 3", tp_workers(NULL));
    cpu_pool_free(a), cpu_pool_free(b);
    cr_assert_eq(tp_workers_left(), 0, "workers left after cpu_pool_free");
    alarm(0);
}
