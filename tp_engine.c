// tp_engine.c: the engine on several GPUs (engine.h; issue 48, docs/multigpu.md). Each GPU runs its part of the
// model (tp_shard_model: its heads, its FFN rows) as a GPU engine of its own (gpu.h) in a thread of its own, the
// parts meeting twice a layer on a tp_link to add their partial outputs. Every call runs on every GPU with the same
// arguments (the same passes, rows in the same order, the same output wanted); each computes the logits of its vocab
// rows, gathered on the first GPU (or, where the head does not split, the first computes it whole: tp_head_agree),
// and the first gives the output.
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine.h"
#include "kernels.h"
#include "pool.h"
#include "tp_link.h"

typedef struct tp_engine tp_engine;
typedef int (*tp_job)(tp_engine *t, int rank, const void *args, dj_err *e);

struct tp_engine {
    int n;
    tp_split split[TP_MAX_GPUS];
    dj_model part[TP_MAX_GPUS];
    dj_gpu_state *gpu[TP_MAX_GPUS];
    dj_gpu_opts opts[TP_MAX_GPUS];
    cpu_pool *pool[TP_MAX_GPUS];  // each GPU's CPU share's threads (the host's cores divided among the GPUs)
    dj_config config;  // the whole model's (its heads over every GPU)
    int built;  // part[] holds every GPU's part
    tp_link *link;
    pthread_t th[TP_MAX_GPUS];
    int started;
    // the call the threads run: job(rank, args) on each, gen counting the calls; `left` still running
    pthread_mutex_t mu;
    pthread_cond_t go, done;
    int gen, left, quit;
    tp_job job;
    const void *args;
    int rc[TP_MAX_GPUS];
    dj_err err[TP_MAX_GPUS];
};

typedef struct {
    tp_engine *t;
    int rank;
} tp_worker_arg;

static void *tp_worker(void *p) {
    tp_worker_arg a = *(tp_worker_arg *)p;
    free(p);
    tp_engine *t = a.t;
    int seen = 0;
    dj_err e = {{0}};
    int dev_rc = gpu_set_device(t->opts[a.rank].gpus[0], &e);
    cpu_pool_use(t->pool[a.rank]);  // its CPU share's jobs run beside the other GPUs' on threads of their own
    for (;;) {
        pthread_mutex_lock(&t->mu);
        while (!t->quit && t->gen == seen) pthread_cond_wait(&t->go, &t->mu);
        if (t->quit) {
            pthread_mutex_unlock(&t->mu);
            return NULL;
        }
        seen = t->gen;
        tp_job job = t->job;
        const void *args = t->args;
        pthread_mutex_unlock(&t->mu);
        dj_err je = {{0}};
        int rc = dev_rc ? (je = e, -1) : job(t, a.rank, args, &je);
        if (rc) tp_fail(t->link);
        pthread_mutex_lock(&t->mu);
        t->rc[a.rank] = rc, t->err[a.rank] = je;
        if (--t->left == 0) pthread_cond_signal(&t->done);
        pthread_mutex_unlock(&t->mu);
    }
}

// job on every GPU at once, each in its thread.
static void tp_each(tp_engine *t, tp_job job, const void *args) {
    pthread_mutex_lock(&t->mu);
    t->job = job, t->args = args, t->left = t->n, t->gen++;
    pthread_cond_broadcast(&t->go);
    while (t->left) pthread_cond_wait(&t->done, &t->mu);
    pthread_mutex_unlock(&t->mu);
}
static int job_drain(tp_engine *t, int r, const void *args, dj_err *e) { return gpu_device_sync(e); }
static int job_rejoin(tp_engine *t, int r, const void *args, dj_err *e) { return tp_rejoin(t->link, r, e); }

// job on every GPU at once; 0, or -1 with the first GPU's own error (not the "another GPU's pass failed" it caused),
// or where a GPU's meeting gave up (its sums not to be trusted). After a failure every GPU's device is drained (the
// exchanges waiting given up on tp_fail's abort), then the exchanges' counts and flags zeroed, so the next call
// starts clean.
static int tp_run(tp_engine *t, tp_job job, const void *args, dj_err *e) {
    tp_each(t, job, args);
    if (tp_gave_up(t->link)) {
        int r = 0;
        while (r < t->n && !t->rc[r]) r++;
        if (r == t->n) {  // no GPU failed, yet one waited in vain: the GPUs' passes did not match
            tp_fail(t->link);
            t->rc[0] = -1;
            dj_fail(&t->err[0], "the GPUs' meeting gave up: a GPU did not come within 30 s (internal error)");
        }
    }
    int bad = -1;
    for (int r = 0; r < t->n; r++)
        if (t->rc[r] && (bad < 0 || (strstr(t->err[bad].msg, "another GPU") && !strstr(t->err[r].msg, "another GPU"))))
            bad = r;
    if (bad < 0) return 0;
    *e = t->err[bad];
    if (t->n > 1 && !strstr(e->msg, "GPU ")) {
        char m[sizeof e->msg - 24];
        memcpy(m, e->msg, sizeof m - 1), m[sizeof m - 1] = 0;
        snprintf(e->msg, sizeof e->msg, "GPU %d: %s", t->opts[bad].gpus[0], m);
    }
    tp_each(t, job_drain, NULL);  // (every GPU drained before any zeroes its flags: the others write them)
    tp_each(t, job_rejoin, NULL);
    tp_reset(t->link);
    return -1;
}

// ---- the calls, each run by every GPU
static int job_open(tp_engine *t, int r, const void *args, dj_err *e) {
    const dj_gpu_opts *o = &t->opts[r];
    if (tp_link_join(t->link, r, gpu_pass_rows(o), t->config.dim, t->split[r].vocab_rows, e)) return -1;
    return (t->gpu[r] = gpu_state_new(&t->part[r], o, e)) ? 0 : -1;
}

typedef struct {
    int32_t slot;
    const int32_t *tokens;
    int64_t T, pos;
    float *logits;
    int all;
    const dj_pick_args *a;
    const int32_t *counts;
    int32_t *next;
} fwd_args;
// (every GPU the same output wanted, so that each runs the head's chunks alike; only the first writes the output)
static int job_forward(tp_engine *t, int r, const void *p, dj_err *e) {
    const fwd_args *a = p;
    if (a->a) return gpu_forward_pick(t->gpu[r], a->slot, a->tokens, a->T, a->pos, a->a, a->counts, a->next, e);
    return gpu_forward(t->gpu[r], a->slot, a->tokens, a->T, a->pos, a->logits, a->all, e);
}
static int tp_forward(void *ctx, int32_t slot, const int32_t *tokens, int64_t T, int64_t pos, float *logits, int all,
                      dj_err *e) {
    fwd_args a = {.slot = slot, .tokens = tokens, .T = T, .pos = pos, .logits = logits, .all = all};
    return tp_run(ctx, job_forward, &a, e);
}
static int tp_pick(void *ctx, int32_t slot, const int32_t *tokens, int64_t T, int64_t pos, const dj_pick_args *pa,
                   const int32_t *counts, int32_t *next, dj_err *e) {
    fwd_args a = {.slot = slot, .tokens = tokens, .T = T, .pos = pos, .a = pa, .counts = counts, .next = next};
    return tp_run(ctx, job_forward, &a, e);
}

typedef struct {
    int64_t n;
    const int32_t *slots;
    const int64_t *pos;
    const int32_t *tokens;
    int64_t n_want;
    const int32_t *want;
    float *logits;
    const dj_pick_args *args;
    int32_t *next;
} rows_args;
// (every GPU the same rows and output wanted, so that each orders the pass's rows and runs the head alike; only the
// first writes the output)
static int job_rows(tp_engine *t, int r, const void *p, dj_err *e) {
    const rows_args *a = p;
    return a->args ? gpu_step_rows_pick(t->gpu[r], a->n, a->slots, a->pos, a->tokens, a->n_want, a->want, a->args,
                                        a->next, e)
                   : gpu_step_rows(t->gpu[r], a->n, a->slots, a->pos, a->tokens, a->n_want, a->want, a->logits, e);
}
static int tp_rows(void *ctx, int64_t n, const int32_t *slots, const int64_t *pos, const int32_t *tokens,
                   int64_t n_want, const int32_t *want, float *logits, dj_err *e) {
    rows_args a = {n, slots, pos, tokens, n_want, want, logits, NULL, NULL};
    return tp_run(ctx, job_rows, &a, e);
}
static int tp_rows_pick(void *ctx, int64_t n, const int32_t *slots, const int64_t *pos, const int32_t *tokens,
                        int64_t n_want, const int32_t *want, const dj_pick_args *args, int32_t *next, dj_err *e) {
    rows_args a = {n, slots, pos, tokens, n_want, want, NULL, args, next};
    return tp_run(ctx, job_rows, &a, e);
}

// ---- parking: each GPU parks its kv heads; parked_kv gathers them into engine.h's layout (every kv head), and a
// restore after it scatters that layout back (a session file's cache, filled in by the caller)
struct dj_parked {
    dj_gpu_parked *p[TP_MAX_GPUS];
    int64_t n;
    uint8_t *host;  // engine.h's layout, once parked_kv was asked for (NULL: never)
};
typedef struct {
    struct dj_parked *pk;
    int32_t slot;
} park_args;
static int job_park(tp_engine *t, int r, const void *p, dj_err *e) {
    const park_args *a = p;
    return (a->pk->p[r] = gpu_park(t->gpu[r], a->slot, a->pk->n, e)) ? 0 : -1;
}
static int job_restore(tp_engine *t, int r, const void *p, dj_err *e) {
    const park_args *a = p;
    if (!a->pk->p[r]) return dj_fail(e, "this parked cache lost GPU %d's part in a restore that failed", r);
    if (gpu_restore(t->gpu[r], a->pk->p[r], a->slot, e)) return -1;
    a->pk->p[r] = NULL;  // released by the restore
    return 0;
}
static int job_drop(tp_engine *t, int r, const void *p, dj_err *e) {
    const park_args *a = p;
    if (a->pk->p[r]) gpu_drop(t->gpu[r], a->pk->p[r]);
    a->pk->p[r] = NULL;
    return 0;
}
static int job_host(tp_engine *t, int r, const void *p, dj_err *e) {  // each GPU's copies done
    const park_args *a = p;
    return gpu_parked_host(t->gpu[r], a->pk->p[r], e) ? 0 : -1;
}
static void tp_drop(void *ctx, dj_parked *pk) {
    park_args a = {pk, 0};
    tp_each(ctx, job_drop, &a);
    free(pk->host);
    free(pk);
}
static dj_parked *tp_park(void *ctx, int32_t slot, int64_t n, dj_err *e) {
    tp_engine *t = ctx;
    dj_parked *pk = calloc(1, sizeof *pk);
    if (!pk) {
        dj_fail(e, "out of memory");
        return NULL;
    }
    pk->n = n;
    park_args a = {pk, slot};
    if (tp_run(t, job_park, &a, e)) {
        tp_drop(t, pk);
        return NULL;
    }
    return pk;
}
// Between engine.h's layout of n positions (every kv head) and GPU r's (its kv heads), in the direction `gather`.
static void tp_kv_move(tp_engine *t, int r, uint8_t *all, uint8_t *mine, int64_t n, int gather) {
    const dj_config *c = &t->config;
    const int kt = t->opts[0].kv_type;
    const uint64_t L = c->n_layers, es = dj_kv_elem_bytes(kt), vb = c->head_dim * es,
                   sb = dj_kv_row_bytes(kt, c->head_dim) - vb, kv_all = c->n_kv_heads;
    const uint64_t k0 = (uint64_t)t->split[r].kv_heads.lo, kl = (uint64_t)(t->split[r].kv_heads.hi - k0);
    // keys, values (rows of vb bytes), then for q8 the keys' and values' scales (rows of sb bytes)
    const uint64_t row[4] = {vb, vb, sb, sb};
    uint64_t off_all = 0, off_mine = 0;
    for (int part = 0; part < 4; part++) {
        const uint64_t b = row[part] * (uint64_t)n;  // one head's n positions
        if (!b) continue;
        for (uint64_t l = 0; l < L; l++)
            for (uint64_t j = 0; j < kl; j++) {
                uint8_t *a = all + off_all + (l * kv_all + k0 + j) * b, *m = mine + off_mine + (l * kl + j) * b;
                gather ? memcpy(a, m, b) : memcpy(m, a, b);
            }
        off_all += L * kv_all * b, off_mine += L * kl * b;
    }
}
static void *tp_parked_kv(void *ctx, dj_parked *pk, dj_err *e) {
    tp_engine *t = ctx;
    park_args a = {pk, 0};
    if (tp_run(t, job_host, &a, e)) return NULL;
    if (!pk->host) {
        const uint64_t bytes = (uint64_t)pk->n * engine_kv_pos_bytes(&t->config, t->opts[0].kv_type);
        if (!(pk->host = malloc(bytes ? bytes : 1))) {
            dj_fail(e, "out of memory for a parked cache of %.2f GB", (double)bytes / 1e9);
            return NULL;
        }
    }
    for (int r = 0; r < t->n; r++) {
        uint8_t *mine = gpu_parked_host(t->gpu[r], pk->p[r], e);  // (its copies done: at once)
        if (!mine) return NULL;
        tp_kv_move(t, r, pk->host, mine, pk->n, 1);
    }
    return pk->host;
}
static int tp_restore(void *ctx, dj_parked *pk, int32_t slot, dj_err *e) {
    tp_engine *t = ctx;
    park_args a = {pk, slot};
    if (pk->host)  // what the caller may have written there, into each GPU's parked copy
        for (int r = 0; r < t->n; r++) {
            uint8_t *mine = pk->p[r] ? gpu_parked_host(t->gpu[r], pk->p[r], e) : NULL;
            if (!mine) return pk->p[r] ? -1 : dj_fail(e, "this parked cache lost GPU %d's part", r);
            tp_kv_move(t, r, pk->host, mine, pk->n, 0);
        }
    if (tp_run(t, job_restore, &a, e)) return -1;  // (kept, less the parts restored)
    free(pk->host);
    free(pk);
    return 0;
}

// Probes (probe.h) on every GPU: each holds the whole residual stream, adds the vectors and writes replacing rows
// into its own; GPU 0 records the dump and fills the breakpoints' rows (probe_gpu.c).
static int job_probe(tp_engine *t, int r, const void *p, dj_err *e) {
    return gpu_set_probe(t->gpu[r], (dj_probe *)p, e);
}
static int tp_set_probe(void *ctx, dj_probe *p, dj_err *e) { return tp_run(ctx, job_probe, p, e); }

// The GPUs' figures as one engine's: the bytes each moved or holds added up (a token's streamed bytes cross every
// link at once), the times the longest GPU's, the plan and the passes GPU 0's.
static int job_stats(tp_engine *t, int r, const void *p, dj_err *e) {
    gpu_state_stats(t->gpu[r], &((dj_gpu_stats *)p)[r]);
    return 0;
}
static void tp_stats(void *ctx, dj_gpu_stats *out) {
    tp_engine *t = ctx;
    dj_gpu_stats st[TP_MAX_GPUS];
    tp_each(t, job_stats, st);
    *out = st[0];
    for (int r = 1; r < t->n; r++) {
        out->bytes_per_token += st[r].bytes_per_token, out->resident_bytes += st[r].resident_bytes;
        out->copied_bytes += st[r].copied_bytes, out->park_bytes += st[r].park_bytes;
        out->restore_bytes += st[r].restore_bytes;
        out->copy_ms = fmax(out->copy_ms, st[r].copy_ms), out->wait_ms = fmax(out->wait_ms, st[r].wait_ms);
        out->park_ms = fmax(out->park_ms, st[r].park_ms), out->restore_ms = fmax(out->restore_ms, st[r].restore_ms);
        out->cpu_bytes_per_token += st[r].cpu_bytes_per_token, out->cpu_bytes += st[r].cpu_bytes;
        out->cpu_ms = fmax(out->cpu_ms, st[r].cpu_ms), out->cpu_wait_ms = fmax(out->cpu_wait_ms, st[r].cpu_wait_ms);
        out->cpu_chains += st[r].cpu_chains, out->share_moves += st[r].share_moves;
        out->outside_ms = fmax(out->outside_ms, st[r].outside_ms);
    }
    // the share in effect: the fraction of every GPU's streamed matrices the CPU computes
    const double all = (double)(out->bytes_per_token + out->cpu_bytes_per_token);
    out->cpu_share = all > 0 ? (double)out->cpu_bytes_per_token / all : 0;
}

static int job_close(tp_engine *t, int r, const void *args, dj_err *e) {
    gpu_state_free(t->gpu[r]);
    t->gpu[r] = NULL;
    return 0;
}
static void tp_free(void *ctx) {
    tp_engine *t = ctx;
    if (!t) return;
    if (t->started == t->n) {
        tp_each(t, job_close, NULL);  // each GPU's state freed in its own thread, its device current
    }
    pthread_mutex_lock(&t->mu);
    t->quit = 1;
    pthread_cond_broadcast(&t->go);
    pthread_mutex_unlock(&t->mu);
    for (int r = 0; r < t->started; r++) pthread_join(t->th[r], NULL);
    tp_link_free(t->link);
    for (int r = 0; t->built && r < t->n; r++) model_free(&t->part[r]);
    for (int r = 0; r < t->n; r++) cpu_pool_free(t->pool[r]);
    pthread_mutex_destroy(&t->mu);
    pthread_cond_destroy(&t->go), pthread_cond_destroy(&t->done);
    free(t);
}

int tp_engine_open(dj_engine *eng, const dj_model *m, const dj_gpu_opts *go, int32_t n_slots, dj_err *e) {
    const int n = go->n_gpus;
    tp_engine *t = calloc(1, sizeof *t);
    if (!t) return dj_fail(e, "out of memory");
    t->n = n, t->config = m->info.config;
    pthread_mutex_init(&t->mu, NULL);
    pthread_cond_init(&t->go, NULL), pthread_cond_init(&t->done, NULL);
    for (int r = 0; r < n; r++)
        if (go->gpus[r] < 0 || go->gpus[r] >= gpu_count()) {
            dj_fail(e, "--gpus: device %d does not exist (%d visible: 0 to %d)", go->gpus[r], gpu_count(),
                    gpu_count() - 1);
            goto fail;
        }
    if (tp_plan(&m->info.config, n, t->split, e) || !(t->link = tp_link_new(n, go->gpus, e))) goto fail;
    const int cores = cpu_threads_planned();
    for (int r = 0; r < n; r++)
        if (!(t->pool[r] = cpu_pool_new(cores / n > 1 ? cores / n : 1))) {
            dj_fail(e, "out of memory");
            goto fail;
        }
    int repeats = 0;
    for (int r = 0; r < n; r++)
        for (int q = 0; q < r; q++) repeats |= go->gpus[q] == go->gpus[r];
    if (repeats && !go->quiet)
        fprintf(stderr, "gpu: --gpus names a device more than once: its parts share it (a stand-in for several GPUs "
                        "in tests, no faster than one)\n");
    if (tp_shard_models(m, go->consume == m ? go->consume : NULL, t->split, n, m->pinned, t->part, e)) goto fail;
    t->built = 1;
    for (int r = 0; r < n; r++) {
        dj_gpu_opts *o = &t->opts[r];
        *o = *go;
        o->n_slots = n_slots, o->gpus[0] = go->gpus[r], o->tp = t->link, o->tp_rank = r;
        o->quiet = go->quiet || r > 0, o->trace = r > 0 ? NULL : go->trace;
        o->consume = NULL;
    }
    for (; t->started < n; t->started++) {
        tp_worker_arg *a = malloc(sizeof *a);
        if (!a) goto fail;
        *a = (tp_worker_arg){t, t->started};
        if (pthread_create(&t->th[t->started], NULL, tp_worker, a)) {
            free(a);
            dj_fail(e, "cannot start a thread for GPU %d", t->started);
            goto fail;
        }
    }
    if (tp_run(t, job_open, NULL, e)) goto fail;
    if (!go->quiet)
        fprintf(stderr, "gpu: %d GPUs, tensor parallel: each holds %lld of %u kv heads and %lld of %u FFN rows a layer "
                        "(GPU 0's share), adding their partial sums twice a layer; %s\n", n,
                (long long)(t->split[0].kv_heads.hi - t->split[0].kv_heads.lo), m->info.config.n_kv_heads,
                (long long)(t->split[0].ffn_rows.hi - t->split[0].ffn_rows.lo), m->info.config.hidden_dim,
                tp_head_split(t->link) ? "the head split by vocab rows" : "GPU 0 computes the whole head");
    *eng = (dj_engine){.name = "gpu", .is_gpu = 1, .ctx = t, .n_slots = n_slots, .kv_type = go->kv_type,
                       .max_seq = go->max_seq, .forward = tp_forward, .pick = tp_pick, .step_rows = tp_rows,
                       .step_rows_pick = tp_rows_pick, .park = tp_park, .restore = tp_restore, .drop = tp_drop,
                       .parked_kv = tp_parked_kv, .free = tp_free, .set_probe = tp_set_probe,
                       .gpu_stats = tp_stats};
    return 0;
fail:
    tp_free(t);
    return -1;
}
