// batch.c: continuous batching over the engine's KV slots, sessions and parking (batch.h).
#include "batch.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "probe.h"

enum { JOB_QUEUED, JOB_PREFILL, JOB_DECODE };

typedef struct bt_session {
    char *name;          // NULL: a breakpoint's hidden session (no name finds it; forgotten once it has no use)
    int32_t tenant;      // the only tenant whose requests find it by name
    int32_t slot;        // the slot its cache is in, or -1
    dj_parked *parked;   // or its cache parked in host memory (slot -1), or neither (nothing kept)
    int32_t *ids;        // parked: the tokens of the parked positions
    int64_t n;
    int32_t jobs;        // its jobs queued or running (they run one at a time, in order)
    uint64_t paused;     // the paused state that holds it (no other job runs in it), or 0
    double t_used;
} bt_session;

// A breakpoint's paused state: its session keeps the cache of the prompt, whose positions [pos0, n_ids) a resume
// runs again with the rows it sends.
typedef struct {
    uint64_t id;         // brk-<id>
    bt_session *sess;
    int32_t *ids;        // the prompt
    size_t n_ids;
    int64_t pos0;
    uint32_t layer;
    int kind;
} bt_paused;

// Why a paused state is no longer held: kept for the last BT_GONE, so that a late resume hears the reason.
enum { GONE_RESUMED = 1, GONE_EVICTED, GONE_DELETED, GONE_CACHE };
#define BT_GONE 256
typedef struct {
    uint64_t id;
    int32_t tenant;
    int why;
} bt_gone;

typedef struct {
    int32_t *ids;        // (max_seq) the tokens whose keys and values the slot holds, positions 0..n-1
    int64_t n;
    int32_t tenant;      // whose tokens these are: another tenant's job reuses none of them
    bt_session *sess;    // the session whose cache this is, or NULL (free: a job may take it and its prefix)
    bt_job *job;         // the sequence running in it
    double t_used;
} bt_slot;

struct bt_sched {
    dj_engine *eng;
    const dj_tokenizer *tok;
    bt_opts o;
    bt_callbacks cb;
    int64_t ctx, vocab;
    uint64_t pos_bytes;  // one position's keys and values: what parking moves per position
    bt_slot *slots;
    bt_job **active;     // (parallel) in the order they joined
    int32_t n_active;
    bt_job *q_head, *q_tail;
    bt_session **sessions;
    int32_t n_sessions;
    // one turn's pass: its rows (parallel + prefill_chunk at most), the rows whose logits it wants (a decoding
    // sequence's token, a prompt's last) and their jobs, the jobs prefilling and how many tokens each
    int32_t *row_slot, *row_tok, *want;
    int64_t *row_pos, *pf_take;
    bt_job **want_job, **pf_job;
    float *logits;       // (parallel, vocab)
    dj_pick_args *args;  // (parallel) the wanted rows' draws, where the engine picks (engine.h's step_rows_pick)
    int32_t *picked;     // (parallel) its ids
    // breakpoints: the engine's probe (set at the first tap), the paused states (oldest first), the ended ones
    uint32_t dim;
    dj_probe *probe;
    int probe_set;
    bt_paused *paused;   // (max_paused)
    int32_t n_paused;
    bt_gone gone[BT_GONE];
    uint64_t n_gone, last_brk;
    bt_stats st;
};

// ---- set-up
bt_sched *bt_new(dj_engine *eng, const dj_tokenizer *tok, const dj_config *c, const bt_opts *o, const bt_callbacks *cb,
                 dj_err *e) {
    if (!eng->step_rows || !eng->park || !eng->restore || !eng->drop) {
        dj_fail(e, "the %s engine has no %s: the server needs KV slots with a batched step and parking", eng->name,
                !eng->step_rows ? "step_rows (batched passes)" : "park/restore");
        return NULL;
    }
    if (o->max_paused > 0 && !eng->set_probe) {
        dj_fail(e, "the %s engine has no probes: breakpoints need them", eng->name);
        return NULL;
    }
    if (o->parallel < 1 || o->parallel > eng->n_slots || o->prefill_chunk < 1 || o->max_sessions < 1 ||
        o->max_paused < 0) {
        dj_fail(e, "batch: parallel %d of %d slots, prefill chunk %" PRId64 ", %d sessions: out of range", o->parallel,
                eng->n_slots, o->prefill_chunk, o->max_sessions);
        return NULL;
    }
    bt_sched *s = calloc(1, sizeof *s);
    if (!s) {
        dj_fail(e, "out of memory");
        return NULL;
    }
    s->eng = eng, s->tok = tok, s->o = *o, s->cb = *cb;
    s->ctx = eng->max_seq;
    s->vocab = c->vocab_size;
    s->pos_bytes = engine_kv_pos_bytes(c, eng->kv_type);
    size_t P = (size_t)o->parallel;
    s->slots = calloc((size_t)eng->n_slots, sizeof *s->slots);
    s->active = calloc(P, sizeof *s->active);
    s->sessions = calloc((size_t)o->max_sessions, sizeof *s->sessions);
    size_t R = P + (size_t)(o->prefill_chunk < s->ctx ? o->prefill_chunk : s->ctx);
    s->row_slot = calloc(R, sizeof *s->row_slot);
    s->row_tok = calloc(R, sizeof *s->row_tok);
    s->row_pos = calloc(R, sizeof *s->row_pos);
    s->want = calloc(P, sizeof *s->want);
    s->want_job = calloc(P, sizeof *s->want_job);
    s->pf_job = calloc(P, sizeof *s->pf_job);
    s->pf_take = calloc(P, sizeof *s->pf_take);
    s->logits = malloc(P * (size_t)s->vocab * sizeof(float));
    s->args = calloc(P, sizeof *s->args);
    s->picked = calloc(P, sizeof *s->picked);
    s->dim = c->dim;
    if (o->max_paused > 0) {
        s->paused = calloc((size_t)o->max_paused, sizeof *s->paused);
        s->probe = probe_new(c, e);
    }
    int ok = s->slots && s->active && s->sessions && s->row_slot && s->row_tok && s->row_pos && s->want &&
             s->want_job && s->pf_job && s->pf_take && s->logits && s->args && s->picked &&
             (!o->max_paused || (s->paused && s->probe));
    for (int32_t i = 0; ok && i < eng->n_slots; i++) ok = (s->slots[i].ids = malloc((size_t)s->ctx * 4)) != NULL;
    if (!ok) {
        bt_free(s);
        dj_fail(e, "out of memory");
        return NULL;
    }
    s->st.slots = eng->n_slots, s->st.parallel = o->parallel;
    return s;
}

static void job_free(bt_job *j) {
    free(j->ids), free(j->rows);
    for (int i = 0; i < j->n_stops; i++) free(j->stops[i]);
    sampler_free(j->smp);
    if (j->ts) tok_stream_free(j->ts);
    held_free(&j->held);
    free(j);
}

static void session_free(bt_sched *s, bt_session *x) {
    if (x->parked) s->eng->drop(s->eng->ctx, x->parked);
    free(x->ids), free(x->name), free(x);
}

void bt_free(bt_sched *s) {
    if (!s) return;
    for (int32_t i = 0; i < s->n_active; i++) job_free(s->active[i]);
    while (s->q_head) {
        bt_job *j = s->q_head;
        s->q_head = j->next_queued;
        job_free(j);
    }
    for (int32_t i = 0; i < s->n_sessions; i++) session_free(s, s->sessions[i]);
    for (int32_t i = 0; i < s->n_paused; i++) free(s->paused[i].ids);
    if (s->probe_set) {
        dj_err e;
        s->eng->set_probe(s->eng->ctx, NULL, &e);
    }
    probe_free(s->probe);
    free(s->paused);
    for (int32_t i = 0; s->slots && i < s->eng->n_slots; i++) free(s->slots[i].ids);
    free(s->slots), free(s->active), free(s->sessions), free(s->row_slot), free(s->row_tok), free(s->row_pos);
    free(s->want), free(s->want_job), free(s->pf_job), free(s->pf_take), free(s->logits), free(s->args);
    free(s->picked);
    free(s);
}

// ---- paused states
static int32_t paused_index(const bt_sched *s, uint64_t id) {
    for (int32_t k = 0; k < s->n_paused; k++)
        if (s->paused[k].id == id) return k;
    return -1;
}

// Paused state k is no longer held (its session is free again); a later resume of it hears why.
static void paused_end(bt_sched *s, int32_t k, int why) {
    bt_paused *pz = &s->paused[k];
    s->gone[s->n_gone++ % BT_GONE] = (bt_gone){pz->id, pz->sess->tenant, why};
    pz->sess->paused = 0;
    free(pz->ids);
    memmove(pz, pz + 1, (size_t)(s->n_paused - k - 1) * sizeof *pz);
    s->n_paused--;
}

static void session_unpause(bt_sched *s, bt_session *x, int why) {
    if (x->paused) paused_end(s, paused_index(s, x->paused), why);
}

// The answer to a resume of a paused state not held: 410 with the reason it ended, or 404 (another tenant's is
// not found, whatever became of it).
static int paused_gone(const bt_sched *s, int32_t tenant, uint64_t id, dj_err *e) {
    unsigned long long n = (unsigned long long)id;
    for (uint64_t i = 0; i < s->n_gone && i < BT_GONE; i++) {
        const bt_gone *g = &s->gone[i];
        if (g->id != id) continue;
        if (g->tenant != tenant) return dj_fail(e, "no paused state brk-%llu", n), 404;
        if (g->why == GONE_RESUMED) dj_fail(e, "brk-%llu was resumed already: a paused state resumes once", n);
        else if (g->why == GONE_EVICTED)
            dj_fail(e, "brk-%llu was dropped: the server holds %d paused states, the oldest going first", n,
                    s->o.max_paused);
        else if (g->why == GONE_DELETED) dj_fail(e, "brk-%llu ended with its session, which was deleted", n);
        else dj_fail(e, "brk-%llu ended with its session's KV cache, dropped (parked beyond the parking budget)", n);
        return 410;
    }
    if (id && id <= s->last_brk) return dj_fail(e, "brk-%llu is no longer held: it ended long ago", n), 410;
    return dj_fail(e, "no paused state brk-%llu", n), 404;
}

// ---- sessions and parking
static bt_session *session_find(bt_sched *s, int32_t tenant, const char *name) {
    for (int32_t i = 0; i < s->n_sessions; i++)
        if (s->sessions[i]->name && s->sessions[i]->tenant == tenant && !strcmp(s->sessions[i]->name, name))
            return s->sessions[i];
    return NULL;
}

static const char *session_name(const bt_session *x) { return x->name ? x->name : "(a breakpoint's, hidden)"; }

// A parked cache dropped: the session keeps its name, its next turn prefills everything (a paused state ends).
static void unpark_drop(bt_sched *s, bt_session *x) {
    session_unpause(s, x, GONE_CACHE);
    s->st.parked_bytes -= (uint64_t)x->n * s->pos_bytes;
    s->eng->drop(s->eng->ctx, x->parked);
    free(x->ids);
    x->parked = NULL, x->ids = NULL, x->n = 0;
    s->st.drops++;
}

// The cache in slot i (an idle session's) moves to host memory; the slot becomes free and empty. Past the parking
// budget the least recently used parked caches are dropped first; a cache alone over the budget, or one the engine
// fails to park, is dropped itself. Returns -1 only when the engine failed.
static int park_slot(bt_sched *s, int32_t i, dj_err *e) {
    bt_slot *sl = &s->slots[i];
    bt_session *x = sl->sess;
    uint64_t bytes = (uint64_t)sl->n * s->pos_bytes;
    sl->sess = NULL, x->slot = -1;
    int rc = 0;
    if (sl->n > 0 && bytes <= s->o.park_bytes) {
        while (s->st.parked_bytes + bytes > s->o.park_bytes) {
            bt_session *lru = NULL;
            for (int32_t k = 0; k < s->n_sessions; k++)
                if (s->sessions[k]->parked && (!lru || s->sessions[k]->t_used < lru->t_used)) lru = s->sessions[k];
            unpark_drop(s, lru);
        }
        double t0 = dj_now();
        x->ids = malloc((size_t)sl->n * sizeof *x->ids);
        x->parked = x->ids ? s->eng->park(s->eng->ctx, i, sl->n, e) : NULL;
        if (x->parked) {
            memcpy(x->ids, sl->ids, (size_t)sl->n * sizeof *x->ids);
            x->n = sl->n;
            s->st.parked_bytes += bytes;
            s->st.parks++, s->st.park_bytes_total += bytes, s->st.park_s += dj_now() - t0;
        } else {
            rc = x->ids ? -1 : dj_fail(e, "out of memory");
            free(x->ids), x->ids = NULL;
        }
    } else if (sl->n > 0) {
        s->st.drops++;
    }
    if (!x->parked) x->n = 0, session_unpause(s, x, GONE_CACHE);
    sl->n = 0;
    return rc;
}

static void session_forget(bt_sched *s, bt_session *x) {
    session_unpause(s, x, GONE_DELETED);
    if (x->slot >= 0) s->slots[x->slot].sess = NULL, s->slots[x->slot].n = 0;
    if (x->parked) unpark_drop(s, x), s->st.drops--;  // forgotten on request: not a drop for lack of room
    for (int32_t i = 0; i < s->n_sessions; i++)
        if (s->sessions[i] == x) {
            s->sessions[i] = s->sessions[--s->n_sessions];
            break;
        }
    session_free(s, x);
}

// The tenant's session named, created when new (name NULL: a new hidden one); past max_sessions the least recently
// used idle one is forgotten. NULL with the HTTP status in *status.
static bt_session *session_get(bt_sched *s, int32_t tenant, const char *name, int *status, dj_err *e) {
    bt_session *x = name ? session_find(s, tenant, name) : NULL;
    if (x) return x;
    if (s->n_sessions == s->o.max_sessions) {
        bt_session *lru = NULL;
        for (int32_t i = 0; i < s->n_sessions; i++) {
            bt_session *y = s->sessions[i];
            if (!y->jobs && !y->paused && (!lru || y->t_used < lru->t_used)) lru = y;
        }
        if (!lru) {
            *status = 503;
            dj_fail(e, "all %d sessions have a request under way or are paused at a breakpoint", s->o.max_sessions);
            return NULL;
        }
        session_forget(s, lru);
    }
    x = calloc(1, sizeof *x);
    if (!x || (name && !(x->name = strdup(name)))) {
        free(x);
        *status = 500;
        dj_fail(e, "out of memory");
        return NULL;
    }
    x->slot = -1, x->t_used = dj_now(), x->tenant = tenant;
    s->sessions[s->n_sessions++] = x;
    return x;
}

// ---- jobs
// The tokens of the cache a session holds (in its slot, or parked), or 0.
static int64_t session_held(const bt_sched *s, const bt_session *x, const int32_t **ids) {
    if (x->slot >= 0) return *ids = s->slots[x->slot].ids, s->slots[x->slot].n;
    return *ids = x->ids, x->parked ? x->n : 0;
}

// A resume's checks against its paused state, which it then takes over (its session, prompt and layer).
static int take_paused(bt_sched *s, bt_job *j, const char *session, dj_err *e) {
    int32_t k = paused_index(s, j->resume);
    if (k >= 0 && s->paused[k].sess->tenant != j->tenant)
        return dj_fail(e, "no paused state brk-%llu", (unsigned long long)j->resume), 404;
    if (k < 0) return paused_gone(s, j->tenant, j->resume, e);
    bt_paused *pz = &s->paused[k];
    unsigned long long id = (unsigned long long)pz->id;
    int64_t n = (int64_t)pz->n_ids - pz->pos0;
    if (session && !pz->sess->name)
        return dj_fail(e, "brk-%llu was made without a session: resume it without one, not in '%s'", id, session), 400;
    if (session && strcmp(session, pz->sess->name))
        return dj_fail(e, "brk-%llu is paused in session '%s', not in '%s'", id, pz->sess->name, session), 400;
    if (j->kind != pz->kind)
        return dj_fail(e, "brk-%llu was made through the other endpoint: resume it through the one that made it", id),
               400;
    if (j->ids && (j->n_ids != pz->n_ids || memcmp(j->ids, pz->ids, pz->n_ids * sizeof *j->ids)))
        return dj_fail(e, "the prompt differs from the one brk-%llu paused: send the same one, or none", id), 400;
    if (j->n_rows != n * (int64_t)s->dim)
        return dj_fail(e, "the residual holds %" PRId64 " floats: brk-%llu's is %" PRId64 " positions x %u (%" PRId64
                          " bytes)", j->n_rows, id, n, s->dim, n * (int64_t)s->dim * 4), 400;
    const int32_t *held;
    if (session_held(s, pz->sess, &held) < pz->pos0 || memcmp(held, pz->ids, (size_t)pz->pos0 * sizeof *held)) {
        paused_end(s, k, GONE_CACHE);  // (unpark_drop ends it first: a safeguard)
        return paused_gone(s, j->tenant, j->resume, e);
    }
    if (!j->ids) j->ids = pz->ids, j->n_ids = pz->n_ids, pz->ids = NULL;
    j->sess = pz->sess, j->layer = pz->layer, j->brk_pos = pz->pos0;
    paused_end(s, k, GONE_RESUMED);
    s->st.resumes++;
    return 0;
}

// Whether job j takes its session only as a hint (bt_job.by_user): a plain request that named it by "user".
static int session_hint(const bt_job *j) { return j->by_user && !j->park_after && !j->brk && !j->resume; }

int bt_submit(bt_sched *s, bt_job *j, const char *session, dj_err *e) {
    int status = 0;
    j->state = JOB_QUEUED, j->slot = -1, j->sess = NULL, j->next_queued = NULL, j->n_gen = 0, j->n_reused = 0;
    if ((j->brk || j->resume) && !s->o.max_paused) return dj_fail(e, "breakpoints are off on this server"), 400;
    if (j->resume) {
        if ((status = take_paused(s, j, session, e))) return status;
    } else if ((session || j->brk) && !(j->sess = session_get(s, j->tenant, session, &status, e))) {
        if (!session_hint(j)) return status;
        status = 0;  // every session busy: the hint is dropped
    } else if (j->sess && j->sess->paused) {
        if (!session_hint(j))
            return dj_fail(e, "session '%s' is paused at breakpoint brk-%llu: resume it, or delete the session",
                           session_name(j->sess), (unsigned long long)j->sess->paused), 409;
        j->sess = NULL;
    } else if (j->sess && j->sess->jobs && session_hint(j)) {
        j->sess = NULL;  // it would wait for the session's earlier jobs
    }
    if (j->sess) j->sess->jobs++;
    if (s->q_tail) s->q_tail->next_queued = j;
    else s->q_head = j;
    s->q_tail = j;
    return 0;
}

void bt_detach(bt_sched *s, bt_job *j) { j->owner = NULL; }

int bt_has_work(const bt_sched *s) { return s->n_active > 0 || s->q_head; }

static int64_t common_prefix(const int32_t *a, int64_t na, const int32_t *b, int64_t nb) {
    int64_t p = 0;
    while (p < na && p < nb && a[p] == b[p]) p++;
    return p;
}

// A slot for job j: its session's own; else a free one: the one whose tokens share the longest prefix with j's
// prompt when that prefix is at least half the prompt, else the least recently used (one never used first), so that
// a cache another prompt may reuse is not overwritten to save a few tokens (a shared BOS; a breakpoint's hidden
// session reuses none); else the least recently used idle session's, parked. The session's parked cache is
// restored into it. -1 when every slot runs a job; -2 when j's session runs an earlier job.
static int32_t take_slot(bt_sched *s, bt_job *j, dj_err *e) {
    bt_session *x = j->sess;
    if (x && x->slot >= 0) return s->slots[x->slot].job ? -2 : x->slot;
    int32_t best = -1, lru = -1;
    int64_t best_p = 0;
    for (int32_t i = 0; i < s->eng->n_slots; i++) {
        bt_slot *sl = &s->slots[i];
        if (sl->job) continue;
        if (!sl->sess) {
            int64_t p = (x && (x->parked || !x->name)) || sl->tenant != j->tenant
                            ? 0 : common_prefix(sl->ids, sl->n, j->ids, (int64_t)j->n_ids);
            if (2 * p < (int64_t)j->n_ids) p = 0;
            if (best < 0 || p > best_p || (p == best_p && sl->t_used < s->slots[best].t_used)) best = i, best_p = p;
        } else if (lru < 0 || sl->t_used < s->slots[lru].t_used) {
            lru = i;
        }
    }
    if (best < 0 && lru >= 0) {
        if (park_slot(s, lru, e)) fprintf(stderr, "djinn serve: parking a cache failed (%s): it is dropped\n", e->msg);
        best = lru;
    }
    if (best < 0) return best;
    bt_slot *sl = &s->slots[best];
    if (sl->tenant != j->tenant) sl->n = 0, sl->tenant = j->tenant;  // another tenant's tokens: none reused
    if (!x) return best;
    if (x->parked) {
        sl->n = 0;
        double t0 = dj_now();
        uint64_t bytes = (uint64_t)x->n * s->pos_bytes;
        if (s->eng->restore(s->eng->ctx, x->parked, best, e)) {
            fprintf(stderr, "djinn serve: restoring session '%s' failed (%s): its cache is dropped\n", session_name(x),
                    e->msg);
            unpark_drop(s, x);
        } else {
            s->st.parked_bytes -= bytes;
            s->st.restores++, s->st.restore_bytes_total += bytes, s->st.restore_s += dj_now() - t0;
            memcpy(sl->ids, x->ids, (size_t)x->n * sizeof *x->ids);
            sl->n = x->n;
            free(x->ids);
            x->parked = NULL, x->ids = NULL;
        }
    }
    x->n = 0, x->slot = best, sl->sess = x;
    return best;
}

static void job_end(bt_sched *s, bt_job *j, const char *finish, const char *err);

// A breakpoint's or resume's positions tapped after its layer (the probe set on the engine at the first tap);
// a breakpoint's rows allocated. 0, or an HTTP status with e set.
static int tap_job(bt_sched *s, bt_job *j, dj_err *e) {
    int64_t n = (int64_t)j->n_ids - j->done;
    if (j->brk) {
        if (n > s->o.brk_rows)
            return dj_fail(e, "the breakpoint would return %" PRId64 " positions: at most %" PRId64 " fit the resume "
                              "that sends them back; break on a shorter prompt, or in a session whose cache holds its "
                              "start", n, s->o.brk_rows), 400;
        j->brk_pos = j->done;
        if (!(j->rows = malloc((size_t)n * s->dim * sizeof *j->rows))) return dj_fail(e, "out of memory"), 500;
    }
    if (!s->probe_set && s->eng->set_probe(s->eng->ctx, s->probe, e)) return 500;
    s->probe_set = 1;
    return probe_tap(s->probe, j->slot, j->layer, j->done, n, j->resume != 0, j->rows, e) ? 500 : 0;
}

// Queued jobs join while fewer than `parallel` run and a slot can be had, first come first served; a job whose
// session runs an earlier one waits for it (one by_user took its session only if it had none: bt_submit). A resume
// starts at its paused positions, the cache before them kept.
static void admit(bt_sched *s) {
    dj_err e = {{0}};
    for (bt_job **q = &s->q_head, *prev = NULL; *q && s->n_active < s->o.parallel;) {
        bt_job *j = *q;
        if (j->sess && j->sess->paused) {  // paused by a breakpoint queued before it
            *q = j->next_queued;
            if (s->q_tail == j) s->q_tail = prev;
            j->status = 409;
            dj_fail(&e, "session '%s' was paused at breakpoint brk-%llu by an earlier request: resume it first",
                    session_name(j->sess), (unsigned long long)j->sess->paused);
            job_end(s, j, NULL, e.msg);
            continue;
        }
        int32_t i = take_slot(s, j, &e);
        if (i == -2) {
            prev = j, q = &j->next_queued;
            continue;
        }
        if (i < 0) return;
        *q = j->next_queued;
        if (s->q_tail == j) s->q_tail = prev;
        bt_slot *sl = &s->slots[i];
        sl->job = j, sl->t_used = dj_now();
        int64_t p = common_prefix(sl->ids, sl->n, j->ids, (int64_t)j->n_ids);
        if (p == (int64_t)j->n_ids) p--;  // the last prompt token runs again: its pass gives the first pick
        if (j->brk && !j->sess->name) p = 0;  // a breakpoint outside a session returns its whole prompt's rows
        int status = 0;
        if (j->resume && p < j->brk_pos) {
            status = 410;
            dj_fail(&e, "brk-%llu: its session's KV cache was dropped while the resume waited (parked beyond the "
                        "parking budget)", (unsigned long long)j->resume);
        }
        if (j->resume) p = j->brk_pos;
        sl->n = p;                        // what follows is overwritten
        j->slot = i, j->done = p, j->n_reused = p, j->state = JOB_PREFILL;
        s->active[s->n_active++] = j;
        s->st.prompt_tokens += j->n_ids, s->st.reused_tokens += (uint64_t)p;
        if (!status && (j->brk || j->resume)) status = tap_job(s, j, &e);
        if (status) j->status = status, job_end(s, j, NULL, e.msg);
    }
}

// Job j leaves: its owner hears how it ended (unless it left), its slot is released (a session keeps the cache;
// with park_after it is parked now), and it is freed.
static void job_end(bt_sched *s, bt_job *j, const char *finish, const char *err) {
    if (j->owner) s->cb.ended(j->owner, j, finish, err);
    if (j->state != JOB_QUEUED) {
        for (int32_t i = 0; i < s->n_active; i++)
            if (s->active[i] == j) {
                memmove(s->active + i, s->active + i + 1, (size_t)(s->n_active - i - 1) * sizeof *s->active);
                s->n_active--;
                break;
            }
        bt_slot *sl = &s->slots[j->slot];
        sl->job = NULL, sl->t_used = dj_now();
        if (err) sl->n = 0;  // what the failed pass left in the cache is unknown
        if (s->probe) probe_untap(s->probe, j->slot);
    }
    bt_session *x = j->sess;
    if (x) {
        x->jobs--, x->t_used = dj_now();
        dj_err e = {{0}};
        if (j->park_after && x->slot >= 0 && park_slot(s, x->slot, &e))
            fprintf(stderr, "djinn serve: parking session '%s' failed (%s): its cache is dropped\n", session_name(x),
                    e.msg);
    }
    job_free(j);
}

// Jobs whose owner left end now: queued ones leave the queue, running ones free their slot. Hidden sessions no job
// or paused state needs are forgotten (their caches, a resume's changed one among them, serve no one else).
static void reap(bt_sched *s) {
    for (bt_job **p = &s->q_head, *prev = NULL; *p;) {
        bt_job *j = *p;
        if (j->owner) {
            prev = j, p = &j->next_queued;
            continue;
        }
        *p = j->next_queued;
        if (s->q_tail == j) s->q_tail = prev;
        job_end(s, j, NULL, NULL);
    }
    for (int32_t i = s->n_active - 1; i >= 0; i--)
        if (!s->active[i]->owner) job_end(s, s->active[i], NULL, NULL);
    for (int32_t i = s->n_sessions - 1; i >= 0; i--) {
        bt_session *x = s->sessions[i];
        if (!x->name && !x->jobs && !x->paused) session_forget(s, x);
    }
}

// ---- decode
static void emit_text(void *ctx, const char *text, size_t n);
static int emit_held(void *ctx, const char *text, size_t n, dj_err *e) {
    emit_text(ctx, text, n);
    return 0;
}
typedef struct {
    bt_sched *s;
    bt_job *j;
} bt_emit;
static void emit_text(void *ctx, const char *text, size_t n) {
    bt_emit *x = ctx;
    if (n && x->j->owner) x->s->cb.text(x->j->owner, x->j, text, n);
}

// The token the last pass picked for j: into the penalties' window and the text. Returns the finish reason when
// the answer ends with it ("stop", "length"), NULL when it goes on; *err on an error.
static const char *take_token(bt_sched *s, bt_job *j, const char **err, dj_err *e) {
    int32_t t = j->next;
    if (t < 0) {
        *err = "the logits hold NaN or infinity: the model's arithmetic overflowed";
        return NULL;
    }
    sampler_accept(j->smp, t);
    j->n_gen++, s->st.gen_tokens++;
    bt_emit em = {s, j};
    const char *finish = NULL;
    int hit = -1;
    if (tok_is_eos(s->tok, t)) {
        if (!j->ignore_eos) finish = "stop";
    } else {
        size_t len;
        const char *piece = tok_stream_push(j->ts, t, &len);
        hit = held_feed(&j->held, piece, len, (const char *const *)j->stops, j->n_stops, emit_held, &em, e);
        if (hit >= 0) finish = "stop";
    }
    if (hit == -2) {
        *err = e->msg;
        return NULL;
    }
    if (!finish && (j->n_gen == j->max_tokens || (int64_t)j->n_ids + j->n_gen >= s->ctx)) finish = "length";
    if (!finish) return NULL;
    if (hit < 0) {  // the text still held back: all of it, unless it ends in a stop string
        size_t len;
        const char *tail = tok_stream_flush(j->ts, &len);
        hit = held_feed(&j->held, tail, len, (const char *const *)j->stops, j->n_stops, emit_held, &em, e);
        if (hit == -2) {
            *err = e->msg;
            return NULL;
        }
        if (hit >= 0) finish = "stop";
    }
    emit_text(&em, j->held.buf, j->held.len);  // up to the stop string found, or all of it
    return finish;
}

// ---- breakpoints
// A tapped job's prompt is complete: its tap goes, having seen every one of its rows (-1 with e set if not).
static int untap_check(bt_sched *s, bt_job *j, dj_err *e) {
    int64_t n = (int64_t)j->n_ids - j->brk_pos, seen = probe_untap(s->probe, j->slot);
    if (seen == n) return 0;
    return dj_fail(e, "the engine passed %" PRId64 " of the %" PRId64 " rows tapped after layer %u", seen, n, j->layer);
}

// A breakpoint's prompt is complete, its rows copied out: its session is paused (the oldest paused state dropped
// when max_paused are held), and the job ends with finish "breakpoint". A job whose owner left pauses nothing.
static void brk_reached(bt_sched *s, bt_job *j) {
    dj_err e = {{0}};
    int32_t *ids = NULL;
    if (untap_check(s, j, &e) || (j->owner && !(ids = malloc(j->n_ids * sizeof *ids)))) {
        job_end(s, j, NULL, e.msg[0] ? e.msg : "out of memory");
        return;
    }
    if (j->owner) {
        if (s->n_paused == s->o.max_paused) paused_end(s, 0, GONE_EVICTED);
        memcpy(ids, j->ids, j->n_ids * sizeof *ids);
        j->brk_id = ++s->last_brk;
        s->paused[s->n_paused++] = (bt_paused){j->brk_id, j->sess, ids, j->n_ids, j->brk_pos, j->layer, j->kind};
        j->sess->paused = j->brk_id;
        s->st.breaks++;
    }
    job_end(s, j, "breakpoint", NULL);
}

// ---- a turn
// The prompt of j is complete after this turn's chunk: its whole prompt goes into the penalties' window (the first
// token is picked with it) and its text through the stream the answer continues. The answer's text continues the
// prompt's (a completion: the prompt goes through the stream, its text not the answer's), unless the owner gave the
// job a stream of its own: a chat answer is a message, decoded alone as djinn --chat and tokenizer.decode do
// (SentencePiece drops its leading space). -1: out of memory.
static int prompt_done(bt_sched *s, bt_job *j) {
    int own = j->ts != NULL;
    if (!own && !(j->ts = tok_stream_new(s->tok))) return -1;
    for (size_t k = 0; k < j->n_ids; k++) {
        size_t len;
        sampler_accept(j->smp, j->ids[k]);
        if (!own) tok_stream_push(j->ts, j->ids[k], &len);
    }
    return 0;
}

// Adds row (slot, pos, token) to the turn's pass.
static void add_row(bt_sched *s, int64_t *n, int32_t slot, int64_t pos, int32_t tok) {
    s->row_slot[*n] = slot, s->row_pos[*n] = pos, s->row_tok[*n] = tok, (*n)++;
}

// One pass of the engine over every sequence past its prefill (its last token, after the token takes its place in
// the text) and up to prefill_chunk prompt tokens of those still prefilling, in the order they joined: each
// streamed weight crosses the link once a turn whatever the mix. The decoding sequences and each prompt completed
// get their next tokens: picked by the engine where the logits are when it can and no such row's sampler has a
// penalty on (its counts live here), only the ids coming back; else from their logits, sampled here. Returns the
// seconds the pass took, or -1 when the turn had nothing to run.
static double turn(bt_sched *s) {
    int64_t n = 0, budget = s->o.prefill_chunk;
    int32_t nw = 0, n_dec = 0, n_pf = 0;
    for (int32_t i = 0; i < s->n_active; i++) {
        bt_job *j = s->active[i];
        if (j->state != JOB_DECODE) continue;
        dj_err e = {{0}};
        const char *err = NULL, *finish = take_token(s, j, &err, &e);
        if (finish || err) {
            job_end(s, j, finish, err);
            i--;
            continue;
        }
        s->want[nw] = (int32_t)n, s->want_job[nw++] = j, n_dec++;
        add_row(s, &n, j->slot, s->slots[j->slot].n, j->next);
    }
    for (int32_t i = 0; i < s->n_active && budget > 0; i++) {
        bt_job *j = s->active[i];
        if (j->state != JOB_PREFILL) continue;
        int64_t left = (int64_t)j->n_ids - j->done, take = left < budget ? left : budget;
        if (take == left && !j->brk && prompt_done(s, j)) {
            job_end(s, j, NULL, "out of memory");
            i--;
            continue;
        }
        for (int64_t k = 0; k < take; k++) add_row(s, &n, j->slot, j->done + k, j->ids[j->done + k]);
        if (take == left && !j->brk) s->want[nw] = (int32_t)(n - 1), s->want_job[nw++] = j;  // a breakpoint: none
        s->pf_job[n_pf] = j, s->pf_take[n_pf++] = take;
        budget -= take;
    }
    if (!n) return -1;
    int on_device = s->eng->step_rows_pick != NULL;
    for (int32_t w = 0; w < nw && on_device; w++) on_device = sampler_counts(s->want_job[w]->smp) == NULL;
    for (int32_t w = 0; w < nw && on_device; w++) sampler_step_args(s->want_job[w]->smp, &s->args[w]);
    dj_err e = {{0}};
    double t0 = dj_now();
    int rc = on_device ? s->eng->step_rows_pick(s->eng->ctx, n, s->row_slot, s->row_pos, s->row_tok, nw, s->want,
                                                s->args, s->picked, &e)
                       : s->eng->step_rows(s->eng->ctx, n, s->row_slot, s->row_pos, s->row_tok, nw, s->want,
                                           s->logits, &e);
    const double pass_s = dj_now() - t0;
    *(n_dec ? &s->st.decode_s : &s->st.prefill_s) += pass_s;
    if (n_dec) {
        s->st.steps++, s->st.step_rows += (uint64_t)n_dec;
        if (n_dec > s->st.max_rows) s->st.max_rows = n_dec;
    }
    if (rc) {  // every sequence in the pass ends with the error: those wanting no logits first
        for (int32_t k = 0; k < n_pf; k++)
            if (s->pf_take[k] < (int64_t)s->pf_job[k]->n_ids - s->pf_job[k]->done || s->pf_job[k]->brk)
                job_end(s, s->pf_job[k], NULL, e.msg);
        for (int32_t w = 0; w < nw; w++) job_end(s, s->want_job[w], NULL, e.msg);
        return pass_s;
    }
    for (int32_t k = 0; k < n_pf; k++) {  // the prompts' chunks are in their slots
        bt_job *j = s->pf_job[k];
        bt_slot *sl = &s->slots[j->slot];
        memcpy(sl->ids + j->done, j->ids + j->done, (size_t)s->pf_take[k] * sizeof *sl->ids);
        j->done += s->pf_take[k], sl->n = j->done;
        s->st.prefill_tokens += (uint64_t)s->pf_take[k];
    }
    for (int32_t k = 0; k < n_pf; k++)
        if (s->pf_job[k]->brk && s->pf_job[k]->done == (int64_t)s->pf_job[k]->n_ids) brk_reached(s, s->pf_job[k]);
    for (int32_t w = 0; w < nw; w++) {
        bt_job *j = s->want_job[w];
        if (j->state == JOB_DECODE) {
            bt_slot *sl = &s->slots[j->slot];
            sl->ids[sl->n++] = j->next;
        } else {
            if (j->resume && untap_check(s, j, &e)) {
                job_end(s, j, NULL, e.msg);
                continue;
            }
            j->state = JOB_DECODE;
            if (j->owner) s->cb.started(j->owner, j);
        }
        j->next = on_device ? s->picked[w] : sampler_next(j->smp, s->logits + (size_t)w * (size_t)s->vocab);
    }
    return pass_s;
}

void bt_step(bt_sched *s) {
    const double t0 = dj_now();
    reap(s);
    admit(s);
    const double pass_s = turn(s);
    if (pass_s < 0) return;  // nothing ran: no turn to count
    const double all = dj_now() - t0;
    s->st.turns++, s->st.turn_s += all, s->st.turn_host_s += all > pass_s ? all - pass_s : 0;
}

// ---- sessions on request, statistics
int bt_park(bt_sched *s, int32_t tenant, const char *session, int64_t *tokens, dj_err *e) {
    bt_session *x = session_find(s, tenant, session);
    *tokens = 0;
    if (!x) return dj_fail(e, "no session '%s'", session), 404;
    if (x->jobs)
        return dj_fail(e, "session '%s' has a request under way: park it when its answer has ended", session), 409;
    if (x->slot >= 0) {
        x->t_used = dj_now();
        if (park_slot(s, x->slot, e)) return 500;
    }
    *tokens = x->n;
    return 0;
}

int bt_forget(bt_sched *s, int32_t tenant, const char *session, dj_err *e) {
    bt_session *x = session_find(s, tenant, session);
    if (!x) return dj_fail(e, "no session '%s'", session), 404;
    if (x->jobs) return dj_fail(e, "session '%s' has a request under way", session), 409;
    session_forget(s, x);
    return 0;
}

uint64_t bt_generated(const bt_sched *s) { return s->st.gen_tokens; }

void bt_get_stats(const bt_sched *s, bt_stats *out) {
    *out = s->st;
    out->active = s->n_active, out->queued = 0;
    for (const bt_job *j = s->q_head; j; j = j->next_queued) out->queued++;
    out->paused = s->n_paused;
    out->sessions = s->n_sessions, out->sessions_resident = 0, out->sessions_parked = 0;
    for (int32_t i = 0; i < s->n_sessions; i++) {
        out->sessions_resident += s->sessions[i]->slot >= 0;
        out->sessions_parked += s->sessions[i]->parked != NULL;
    }
}
