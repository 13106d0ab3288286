// test_batch.c: the server's scheduler (batch.c) driven directly over the CPU engine on stories260K: how many tokens
// a job gets when the context fills (the command line's count), and which parked cache goes when the parking budget
// is full (the least recently used).
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../batch.h"
#include "../engine.h"
#include "common.h"

// ---- a scheduler over the CPU engine
typedef struct {
    char *dir, model[4200];
    dj_model m;
    dj_tokenizer *tok;
    dj_engine eng;
    bt_sched *s;
} tb_ctx;

// What the callbacks saw of one job.
typedef struct {
    int started, ended;
    int64_t n_gen, n_reused;
    char finish[32], err[300];
} tb_owner;

static void tb_started(void *owner, bt_job *j) { ((tb_owner *)owner)->started++; }
static void tb_text(void *owner, bt_job *j, const char *text, size_t n) {}
static void tb_ended(void *owner, bt_job *j, const char *finish, const char *err) {
    tb_owner *o = owner;
    o->ended++, o->n_gen = j->n_gen, o->n_reused = j->n_reused;
    snprintf(o->finish, sizeof o->finish, "%s", finish ? finish : "");
    snprintf(o->err, sizeof o->err, "%s", err ? err : "");
}

static void tb_load(tb_ctx *c) {
    memset(c, 0, sizeof *c);
    c->dir = tc_tmpdir("batch");
    tc_stories_model(c->dir, "s.bin", DJ_F32, &c->m, c->model, sizeof c->model);
    dj_err e = {{0}};
    c->tok = tok_load(c->m.data + c->m.info.tok_off, (size_t)c->m.info.tok_size, &e);
    cr_assert(c->tok, "%s", e.msg);
}

// The KV type of the engines here: the server's default, whose bytes the parking budgets below count.
#define TB_KV DJ_KV_DEFAULT

// An engine of `slots` KV slots of ctx positions, and a scheduler over it (one sequence at a time).
static void tb_open(tb_ctx *c, int64_t ctx, int32_t slots, uint64_t park_bytes) {
    dj_gpu_opts go = {.max_seq = ctx, .quiet = 1, .kv_type = TB_KV};
    dj_err e = {{0}};
    cr_assert_eq(engine_open(&c->eng, &c->m, &go, slots, &e), 0, "%s", e.msg);
    cr_assert(!c->eng.is_gpu);
    bt_opts o = {.parallel = 1, .prefill_chunk = 64, .max_sessions = 8, .park_bytes = park_bytes};
    bt_callbacks cb = {tb_started, tb_text, tb_ended};
    c->s = bt_new(&c->eng, c->tok, &c->m.info.config, &o, &cb, &e);
    cr_assert(c->s, "%s", e.msg);
}

static void tb_close(tb_ctx *c) {
    bt_free(c->s), c->s = NULL;
    engine_close(&c->eng);
    memset(&c->eng, 0, sizeof c->eng);
}

static void tb_free(tb_ctx *c) {
    if (c->s) tb_close(c);
    tok_free(c->tok);
    model_free(&c->m);
    tc_rm_rf(c->dir);
    free(c->dir);
}

// The ids of text with BOS, as a completion's prompt.
static int32_t *tb_ids(tb_ctx *c, const char *text, size_t *n) {
    int32_t *ids;
    dj_err e = {{0}};
    cr_assert_eq(tok_encode(c->tok, text, strlen(text), 1, &ids, n, &e), 0, "%s", e.msg);
    return ids;
}

// One greedy job of `text` under `session` (NULL: none), run to its end; what its owner saw.
static tb_owner tb_run(tb_ctx *c, const char *text, int64_t max_tokens, const char *session) {
    tb_owner o = {0};
    bt_job *j = calloc(1, sizeof *j);
    dj_err e = {{0}};
    j->ids = tb_ids(c, text, &j->n_ids);
    j->max_tokens = max_tokens;
    j->smp = sampler_new(c->m.info.config.vocab_size, 0, 1.0, 1, &e);
    cr_assert(j->smp, "%s", e.msg);
    j->owner = &o;
    cr_assert_eq(bt_submit(c->s, j, session, &e), 0, "%s", e.msg);
    for (int steps = 0; bt_has_work(c->s); steps++) {
        cr_assert_lt(steps, 10000, "the job never ended");
        bt_step(c->s);
    }
    cr_assert_eq(o.ended, 1, "'%s': ended %d times", text, o.ended);
    cr_assert_eq(o.err[0], 0, "'%s': %s", text, o.err);
    return o;
}

// ---- the context's end
// The command line (djinn.c's decode loop) appends a generated token while the text holds fewer than ctx tokens,
// then stops ("context full"): its text ends with exactly ctx tokens, ctx - n_prompt of them new. The last one is
// never fed, so every position a pass runs is below ctx. A job must get the same count: finish "length" with
// n_gen = ctx - n_prompt, at a context one token over the prompt, two over, and a few more.
Test(batch, context_full_gives_the_command_lines_count) {
    tb_ctx c;
    tb_load(&c);
    const char *text = "Once upon a time";
    size_t n_prompt;
    free(tb_ids(&c, text, &n_prompt));
    const int64_t ctxs[] = {(int64_t)n_prompt + 1, (int64_t)n_prompt + 2, 16, 24};
    for (size_t k = 0; k < sizeof ctxs / sizeof *ctxs; k++) {
        tb_open(&c, ctxs[k], 1, 0);
        tb_owner o = tb_run(&c, text, -1, NULL);
        cr_assert_str_eq(o.finish, "length", "context %lld: finish '%s' (an end token before the context's end would "
                         "need another prompt)", (long long)ctxs[k], o.finish);
        cr_assert_eq(o.n_gen, ctxs[k] - (int64_t)n_prompt, "context %lld, a prompt of %zu tokens: %lld generated, "
                     "the command line gives %lld", (long long)ctxs[k], n_prompt, (long long)o.n_gen,
                     (long long)(ctxs[k] - (int64_t)n_prompt));
        // max_tokens at the same count ends the same way; one more is cut by the context
        tb_owner a = tb_run(&c, text, ctxs[k] - (int64_t)n_prompt, NULL);
        tb_owner b = tb_run(&c, text, ctxs[k] - (int64_t)n_prompt + 1, NULL);
        cr_assert(a.n_gen == o.n_gen && b.n_gen == o.n_gen, "max_tokens: %lld and %lld generated", (long long)a.n_gen,
                  (long long)b.n_gen);
        tb_close(&c);
    }
    // and the command line itself, where the binaries are at hand: "stopped after N of 100 new tokens"
    const char *bin = getenv("DJINN_BIN");
    if (bin && *bin) {
        char djinn[4200], out[4300], err[4300], want[200];
        snprintf(djinn, sizeof djinn, "%s/djinn", bin);
        snprintf(out, sizeof out, "%s/out", c.dir), snprintf(err, sizeof err, "%s/err", c.dir);
        char *argv[] = {djinn, c.model, "-p", (char *)text, "-n", "100", "-t", "0", "-c", "16", "--cpu", NULL};
        cr_assert_eq(tc_run(argv, "/dev/null", out, 0, err, 60), 0);
        char *log = tc_must_read(err, NULL);
        snprintf(want, sizeof want, "stopped after %lld of 100 new tokens", (long long)(16 - (int64_t)n_prompt));
        cr_assert(strstr(log, want), "the command line at -c 16 does not say '%s': %s", want, log);
        free(log);
    }
    tb_free(&c);
}

// ---- parking beyond the budget
// Whether each session keeps a cache (in a slot or parked): bt_park of a session whose cache is parked or gone
// changes nothing and says how many positions it holds.
static int64_t tb_held(tb_ctx *c, const char *session) {
    int64_t n = -1;
    dj_err e = {{0}};
    cr_assert_eq(bt_park(c->s, 0, session, &n, &e), 0, "%s", e.msg);
    return n;
}

// Three sessions' caches of one size, a budget of two: parked on request in the order B, A, C, the third park drops
// B, the least recently used (not A, the first made; not the most recent); one byte less of budget drops one at the
// second park already, and the budget exactly full drops none.
Test(batch, parking_drops_the_least_recently_used) {
    tb_ctx c;
    tb_load(&c);
    const char *names[] = {"A", "B", "C"}, *texts[] = {"Once upon a time", "Lily and Ben", "One day, a"};
    size_t n_ids[3];
    for (int i = 0; i < 3; i++) free(tb_ids(&c, texts[i], &n_ids[i]));
    cr_assert(n_ids[0] == n_ids[1] && n_ids[1] == n_ids[2], "the prompts must be of one length: %zu %zu %zu",
              n_ids[0], n_ids[1], n_ids[2]);
    const int64_t cache = (int64_t)n_ids[0] + 1;  // the prompt and the first token fed (max_tokens 2)
    const uint64_t bytes = (uint64_t)cache * engine_kv_pos_bytes(&c.m.info.config, TB_KV);
    for (int budget = 0; budget < 2; budget++) {
        tb_open(&c, 64, 3, budget ? 2 * bytes : 2 * bytes - 1);
        for (int i = 0; i < 3; i++) tb_run(&c, texts[i], 2, names[i]);  // one slot each
        bt_stats st;
        bt_get_stats(c.s, &st);
        cr_assert(st.sessions == 3 && st.sessions_resident == 3 && st.parks == 0, "%d sessions, %d resident",
                  st.sessions, st.sessions_resident);
        cr_assert_eq(tb_held(&c, "B"), cache);
        cr_assert_eq(tb_held(&c, "A"), cache);
        bt_get_stats(c.s, &st);
        cr_assert_eq(st.drops, budget ? 0u : 1u, "budget %s: two parked caches, %llu dropped", budget ? "2" : "2 - 1",
                     (unsigned long long)st.drops);
        if (budget) {
            cr_assert_eq(tb_held(&c, "C"), cache);
            bt_get_stats(c.s, &st);
            cr_assert_eq(st.drops, 1u);
            cr_assert_eq(st.sessions_parked, 2);
            cr_assert_eq(tb_held(&c, "B"), 0, "B, parked first, is the least recently used: its cache goes");
            cr_assert_eq(tb_held(&c, "A"), cache, "A, parked after B, keeps its cache");
            cr_assert_eq(tb_held(&c, "C"), cache);
            // their next turns: B prefills everything, A takes its cache back (all but its last prompt token)
            cr_assert_eq(tb_run(&c, texts[1], 2, "B").n_reused, 0);
            cr_assert_eq(tb_run(&c, texts[0], 2, "A").n_reused, (int64_t)n_ids[0] - 1);
        } else {
            cr_assert_eq(tb_held(&c, "B"), 0, "one byte under two caches: B, parked first, goes at A's park");
            cr_assert_eq(tb_held(&c, "A"), cache);
        }
        tb_close(&c);
    }
    tb_free(&c);
}

// The same order when jobs do the parking: one slot, sessions A, B, C, D one after the other; each job parks the
// cache before it, and D's parks C's beside A's and B's, two caches over the budget of two: A's goes (the least
// recently used), B's stays.
Test(batch, jobs_park_and_drop_the_least_recently_used) {
    tb_ctx c;
    tb_load(&c);
    const char *names[] = {"A", "B", "C", "D"};
    const char *texts[] = {"Once upon a time", "Lily and Ben", "One day, a", "Once upon a day"};
    size_t n_ids[4];
    for (int i = 0; i < 4; i++) free(tb_ids(&c, texts[i], &n_ids[i]));
    for (int i = 1; i < 4; i++) cr_assert_eq(n_ids[i], n_ids[0], "the prompts must be of one length");
    const int64_t cache = (int64_t)n_ids[0] + 1;
    tb_open(&c, 64, 1, 2 * (uint64_t)cache * engine_kv_pos_bytes(&c.m.info.config, TB_KV));
    for (int i = 0; i < 4; i++) tb_run(&c, texts[i], 2, names[i]);
    bt_stats st;
    bt_get_stats(c.s, &st);
    cr_assert(st.parks == 3 && st.drops == 1 && st.sessions_parked == 2, "%llu parks, %llu drops, %d parked",
              (unsigned long long)st.parks, (unsigned long long)st.drops, st.sessions_parked);
    cr_assert_eq(tb_held(&c, "A"), 0, "A, the least recently used, is dropped");
    cr_assert_eq(tb_held(&c, "B"), cache, "B keeps its cache");
    cr_assert_eq(tb_held(&c, "C"), cache);
    tb_free(&c);
}

// A cache exactly the size of the budget is parked; with one byte less of budget it is dropped at once.
Test(batch, a_cache_the_size_of_the_budget) {
    tb_ctx c;
    tb_load(&c);
    size_t n_ids;
    free(tb_ids(&c, "Once upon a time", &n_ids));
    const int64_t cache = (int64_t)n_ids + 1;
    const uint64_t bytes = (uint64_t)cache * engine_kv_pos_bytes(&c.m.info.config, TB_KV);
    for (int fits = 0; fits < 2; fits++) {
        tb_open(&c, 64, 1, fits ? bytes : bytes - 1);
        tb_run(&c, "Once upon a time", 2, "A");
        cr_assert_eq(tb_held(&c, "A"), fits ? cache : 0, "a budget of the cache's size%s", fits ? "" : " - 1");
        bt_stats st;
        bt_get_stats(c.s, &st);
        cr_assert(st.parks == (uint64_t)fits && st.drops == (uint64_t)!fits, "%llu parks, %llu drops",
                  (unsigned long long)st.parks, (unsigned long long)st.drops);
        tb_close(&c);
    }
    tb_free(&c);
}
