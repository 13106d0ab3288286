// test_tp_link.c: the host side of the GPUs' meeting point (tp_link.h), with threads and no device: the barrier
// holds every thread until all arrived, phase after phase (polling, then sleeping); one failure lets every waiter go
// with one line, and after tp_reset the barrier works again; the set-up's turns come in rank order, and a failure
// ends the wait for them too; how many GPUs share a device.
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "../kernels.h"
#include "../tp_link.h"
#include "common.h"

#define TL_THREADS 4
#define TL_PHASES 1000
// A broken barrier or turn may hang a test: SIGALRM ends its process after this long, a crash Criterion reports
// (its own .timeout leaks a block that the sanitized run's leak check counts).
#define TL_LIMIT_S 60

typedef struct {
    tp_link *l;
    int rank;
    _Atomic int *count;  // arrivals so far
    int *order;          // turns: the ranks in the order they began
    _Atomic int *n_order;
    int rc, bad_phase;
    int can;  // the head split: this GPU's word (tp_head_agree)
    char msg[sizeof(dj_err)];
} tl_arg;

// Each phase: count one, meet, check that every thread counted, meet again (so none counts the next phase early).
static void *tl_phases(void *p) {
    tl_arg *a = p;
    a->bad_phase = -1;
    for (int ph = 0; ph < TL_PHASES; ph++) {
        atomic_fetch_add(a->count, 1);
        dj_err e = {{0}};
        if (tp_barrier(a->l, &e)) {
            a->rc = -1, snprintf(a->msg, sizeof a->msg, "%s", e.msg);
            return NULL;
        }
        if (atomic_load(a->count) != TL_THREADS * (ph + 1) && a->bad_phase < 0) a->bad_phase = ph;
        if (tp_barrier(a->l, &e)) {
            a->rc = -1, snprintf(a->msg, sizeof a->msg, "%s", e.msg);
            return NULL;
        }
        if (ph % 200 == 0 && a->rank == ph / 200 % TL_THREADS) usleep(2000);  // one late: the others sleep past polling
    }
    return NULL;
}

static tp_link *tl_link(int n, const int *devices) {
    dj_err e = {{0}};
    tp_link *l = tp_link_new(n, devices, &e);
    cr_assert(l, "%s", e.msg);
    return l;
}

Test(tp_link, barrier_holds_every_thread) {
    alarm(TL_LIMIT_S);
    const int dev[TL_THREADS] = {0, 0, 0, 0};
    tp_link *l = tl_link(TL_THREADS, dev);
    _Atomic int count = 0;
    pthread_t th[TL_THREADS];
    tl_arg a[TL_THREADS];
    for (int r = 0; r < TL_THREADS; r++) {
        a[r] = (tl_arg){.l = l, .rank = r, .count = &count};
        cr_assert_eq(pthread_create(&th[r], NULL, tl_phases, &a[r]), 0);
    }
    for (int r = 0; r < TL_THREADS; r++) pthread_join(th[r], NULL);
    for (int r = 0; r < TL_THREADS; r++) {
        cr_assert_eq(a[r].rc, 0, "thread %d: %s", r, a[r].msg);
        cr_assert_eq(a[r].bad_phase, -1, "thread %d passed the barrier of phase %d before every thread counted", r,
                     a[r].bad_phase);
    }
    cr_assert_eq(atomic_load(&count), TL_THREADS * TL_PHASES);
    tp_link_free(l);
}

static void *tl_wait_once(void *p) {
    tl_arg *a = p;
    dj_err e = {{0}};
    a->rc = tp_barrier(a->l, &e);
    snprintf(a->msg, sizeof a->msg, "%s", e.msg);
    return NULL;
}

static double tl_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

// Three of four threads wait (one never comes: its GPU failed); tp_fail lets them go at once with one line. After
// tp_reset all four meet again.
Test(tp_link, a_failure_lets_every_waiter_go) {
    alarm(TL_LIMIT_S);
    const int dev[TL_THREADS] = {0, 1, 2, 3};
    tp_link *l = tl_link(TL_THREADS, dev);
    pthread_t th[TL_THREADS];
    tl_arg a[TL_THREADS];
    for (int r = 0; r < 3; r++) {
        a[r] = (tl_arg){.l = l, .rank = r, .rc = 1};
        cr_assert_eq(pthread_create(&th[r], NULL, tl_wait_once, &a[r]), 0);
    }
    usleep(100000);  // past the polling: they sleep
    for (int r = 0; r < 3; r++) cr_assert_eq(a[r].rc, 1, "thread %d left the barrier before anyone failed", r);
    const double t0 = tl_now();
    tp_fail(l);
    for (int r = 0; r < 3; r++) pthread_join(th[r], NULL);
    cr_assert_lt(tl_now() - t0, 1.0, "the waiters took over a second to leave after the failure");
    for (int r = 0; r < 3; r++) {
        cr_assert_eq(a[r].rc, -1, "thread %d: the barrier passed though a GPU failed", r);
        cr_assert(strstr(a[r].msg, "another GPU") && !strchr(a[r].msg, '\n'), "thread %d: '%s'", r, a[r].msg);
    }
    tp_reset(l);
    for (int r = 0; r < TL_THREADS; r++) {
        a[r] = (tl_arg){.l = l, .rank = r, .rc = 1};
        cr_assert_eq(pthread_create(&th[r], NULL, tl_wait_once, &a[r]), 0);
    }
    for (int r = 0; r < TL_THREADS; r++) pthread_join(th[r], NULL);
    for (int r = 0; r < TL_THREADS; r++) cr_assert_eq(a[r].rc, 0, "after tp_reset, thread %d: %s", r, a[r].msg);
    tp_link_free(l);
}

static void *tl_agree(void *p) {
    tl_arg *a = p;
    dj_err e = {{0}};
    usleep((useconds_t)(1000 * a->rank));  // the first rank says first: the others' words must still count
    a->rc = tp_head_agree(a->l, a->rank, a->can, NULL, &e);
    snprintf(a->msg, sizeof a->msg, "%s", e.msg);
    return NULL;
}

// The head splits by vocab rows where every GPU can and the GPUs are devices of their own, and every GPU hears the
// same verdict: one GPU that cannot (the last to say), or two parts sharing a device, keep the whole head on GPU 0.
Test(tp_link, head_split_agreed_by_every_gpu) {
    alarm(TL_LIMIT_S);
    static const struct {
        int dev[TL_THREADS], cannot, split;  // cannot: the rank that cannot split (-1: none)
    } cases[] = {{{0, 1, 2, 3}, -1, 1}, {{0, 1, 2, 3}, 3, 0}, {{0, 1, 2, 3}, 0, 0}, {{0, 1, 1, 3}, -1, 0}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        tp_link *l = tl_link(TL_THREADS, cases[i].dev);
        pthread_t th[TL_THREADS];
        tl_arg a[TL_THREADS];
        for (int r = 0; r < TL_THREADS; r++) {
            a[r] = (tl_arg){.l = l, .rank = r, .rc = -2, .can = r != cases[i].cannot};
            cr_assert_eq(pthread_create(&th[r], NULL, tl_agree, &a[r]), 0);
        }
        for (int r = 0; r < TL_THREADS; r++) pthread_join(th[r], NULL);
        for (int r = 0; r < TL_THREADS; r++)
            cr_assert_eq(a[r].rc, cases[i].split, "case %zu, rank %d: verdict %d (%s), %d expected", i, r, a[r].rc,
                         a[r].msg, cases[i].split);
        cr_assert_eq(tp_head_split(l), cases[i].split, "case %zu: tp_head_split says otherwise", i);
        tp_link_free(l);
    }
}

static void *tl_turn(void *p) {
    tl_arg *a = p;
    dj_err e = {{0}};
    usleep((useconds_t)(1000 * (TL_THREADS - a->rank)));  // the last ranks ask first
    a->rc = tp_turn_begin(a->l, a->rank, &e);
    snprintf(a->msg, sizeof a->msg, "%s", e.msg);
    if (a->rc) return NULL;
    a->order[atomic_fetch_add(a->n_order, 1)] = a->rank;
    usleep(1000);
    tp_turn_end(a->l, a->rank);
    return NULL;
}

// The set-up's turns come in rank order, whoever asks first; a failure ends the wait of the later ranks.
Test(tp_link, turns_in_rank_order) {
    alarm(TL_LIMIT_S);
    const int dev[TL_THREADS] = {0, 0, 1, 0};
    tp_link *l = tl_link(TL_THREADS, dev);
    cr_assert_eq(tp_turn_sharers(l, 0), 3);
    cr_assert_eq(tp_turn_sharers(l, 1), 2);
    cr_assert_eq(tp_turn_sharers(l, 2), 1);
    cr_assert_eq(tp_turn_sharers(l, 3), 1);
    pthread_t th[TL_THREADS];
    tl_arg a[TL_THREADS];
    int order[TL_THREADS];
    _Atomic int n_order = 0;
    for (int r = 0; r < TL_THREADS; r++) {
        a[r] = (tl_arg){.l = l, .rank = r, .order = order, .n_order = &n_order};
        cr_assert_eq(pthread_create(&th[r], NULL, tl_turn, &a[r]), 0);
    }
    for (int r = 0; r < TL_THREADS; r++) pthread_join(th[r], NULL);
    cr_assert_eq(atomic_load(&n_order), TL_THREADS);
    for (int r = 0; r < TL_THREADS; r++) cr_assert_eq(order[r], r, "turn %d went to rank %d", r, order[r]);
    tp_link_free(l);
    // rank 0 never ends its turn (its set-up failed): the others' waits end with one line
    l = tl_link(TL_THREADS, dev);
    dj_err e = {{0}};
    cr_assert_eq(tp_turn_begin(l, 0, &e), 0, "%s", e.msg);
    atomic_store(&n_order, 0);
    for (int r = 1; r < TL_THREADS; r++) {
        a[r] = (tl_arg){.l = l, .rank = r, .order = order, .n_order = &n_order};
        cr_assert_eq(pthread_create(&th[r], NULL, tl_turn, &a[r]), 0);
    }
    usleep(50000);
    cr_assert_eq(atomic_load(&n_order), 0, "a later rank began its turn before rank 0 ended its own");
    tp_fail(l);
    for (int r = 1; r < TL_THREADS; r++) pthread_join(th[r], NULL);
    for (int r = 1; r < TL_THREADS; r++)
        cr_assert(a[r].rc == -1 && strstr(a[r].msg, "another GPU"), "rank %d: rc %d, '%s'", r, a[r].rc, a[r].msg);
    tp_link_free(l);
}
