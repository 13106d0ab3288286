// test_edges.c: the limits of the checks that validate input, each at the value where the answer turns, so that a
// check off by one or missing a condition fails here (the survivors of `make mutate`, tests/mutations.tsv).
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../api.h"
#include "../batch.h"
#include "../convert/hfconfig.h"
#include "../cpu.h"
#include "../engine.h"
#include "../loader.h"
#include "../model.h"
#include "../quant.h"
#include "../sampler.h"
#include "../session.h"
#include "../convert/convert.h"
#include "../util.h"
#include "../http.h"
#include "../stops.h"
#include "common.h"

// ---- http.c: a request head at each limit

// A head of exactly n bytes: request line, then "X: aaa..." filling it, then the blank line when whole.
static char *head_of(size_t n, int whole) {
    char *b = malloc(n + 1);
    const char *start = "GET / HTTP/1.1\r\nX: ";
    size_t k = strlen(start), end = whole ? n - 4 : n;
    memcpy(b, start, k);
    memset(b + k, 'a', end - k);
    if (whole) memcpy(b + end, "\r\n\r\n", 4);
    b[n] = 0;
    return b;
}

static int parse(const char *head, int *status) {
    http_req r;
    const char *why = NULL;
    *status = 0;
    return http_parse_head(head, strlen(head), 100, &r, status, &why);
}

Test(edges, http_head_at_its_16_kb_limit) {
    http_req r;
    int st = 0;
    const char *why = NULL;
    char *h = head_of(HTTP_HEAD_MAX, 1);  // a whole head of the limit's size is taken
    cr_expect_eq(http_parse_head(h, HTTP_HEAD_MAX, 100, &r, &st, &why), 1, "%s", why ? why : "");
    cr_expect_eq(r.head_len, HTTP_HEAD_MAX);
    free(h);
    h = head_of(HTTP_HEAD_MAX, 0);  // the limit's bytes without the blank line: refused, not "wait for more"
    cr_expect_eq(http_parse_head(h, HTTP_HEAD_MAX, 100, &r, &st, &why), -1);
    cr_expect_eq(st, 431);
    cr_expect_eq(http_parse_head(h, HTTP_HEAD_MAX - 1, 100, &r, &st, &why), 0, "one byte short of the limit: not yet");
    free(h);
}

Test(edges, http_method_and_target_lengths) {
    int st;
    char line[2048];
    // method: 15 letters fit method[16], 16 do not
    snprintf(line, sizeof line, "%.*s / HTTP/1.1\r\n\r\n", 15, "ABCDEFGHIJKLMNOPQ");
    cr_expect_eq(parse(line, &st), 1, "a 15-letter method");
    snprintf(line, sizeof line, "%.*s / HTTP/1.1\r\n\r\n", 16, "ABCDEFGHIJKLMNOPQ");
    cr_expect(parse(line, &st) == -1 && st == 400, "a 16-letter method: status %d", st);
    // path: 1023 bytes fit path[1024], 1024 do not (the query does not count)
    char path[1100];
    path[0] = '/';
    memset(path + 1, 'p', sizeof path - 1);
    snprintf(line, sizeof line, "GET %.*s?q=1 HTTP/1.1\r\n\r\n", 1023, path);
    cr_expect_eq(parse(line, &st), 1, "a 1023-byte path");
    snprintf(line, sizeof line, "GET %.*s HTTP/1.1\r\n\r\n", 1024, path);
    cr_expect(parse(line, &st) == -1 && st == 400, "a 1024-byte path: status %d", st);
}

Test(edges, http_version_and_keep_alive) {
    int st;
    http_req r;
    const char *why;
    static const char *const bad[] = {"GET / HTTP/1.x\r\n\r\n", "GET / HTTP/1.:\r\n\r\n", "GET / HTTP/1.10\r\n\r\n",
                                      "GET / HTTP/1.\r\n\r\n"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        cr_expect_eq(parse(bad[i], &st), -1, "%s", bad[i]);
        cr_expect(st == 400 || st == 505, "%s: status %d", bad[i], st);
    }
    // HTTP/1.0 closes unless asked to keep the connection; 1.1 keeps it unless asked to close
    static const struct { const char *head; int keep; } ka[] = {
        {"GET / HTTP/1.0\r\n\r\n", 0},
        {"GET / HTTP/1.0\r\nConnection: close\r\n\r\n", 0},
        {"GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n", 1},
        {"GET / HTTP/1.1\r\n\r\n", 1},
        {"GET / HTTP/1.1\r\nConnection: Close\r\n\r\n", 0},
    };
    for (size_t i = 0; i < sizeof ka / sizeof *ka; i++) {
        cr_assert_eq(http_parse_head(ka[i].head, strlen(ka[i].head), 100, &r, &st, &why), 1, "%s", ka[i].head);
        cr_expect_eq(r.keep_alive, ka[i].keep, "%s", ka[i].head);
    }
}

Test(edges, http_header_names_and_values) {
    int st;
    static const char *const bad[] = {
        "GET / HTTP/1.1\r\n: b\r\n\r\n",                  // an empty header name
        "GET / HTTP/1.1\r\nA b: c\r\n\r\n",               // a space inside the name
        "GET / HTTP/1.1\r\nContent-Length:  \r\n\r\n",    // an empty length
        "GET / HTTP/1.1\r\nContent-Length: 1x\r\n\r\n",
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        cr_expect(parse(bad[i], &st) == -1 && st == 400, "%s: status %d", bad[i], st);
    // Authorization: 511 bytes fit authorization[512], 512 do not
    char head[700], val[600];
    memset(val, 'k', sizeof val);
    http_req r;
    const char *why;
    snprintf(head, sizeof head, "GET / HTTP/1.1\r\nAuthorization: %.*s\r\n\r\n", 511, val);
    cr_assert_eq(http_parse_head(head, strlen(head), 100, &r, &st, &why), 1, "a 511-byte Authorization");
    cr_expect_eq(strlen(r.authorization), 511);
    snprintf(head, sizeof head, "GET / HTTP/1.1\r\nAuthorization: %.*s\r\n\r\n", 512, val);
    cr_expect(parse(head, &st) == -1 && st == 431, "a 512-byte Authorization: status %d", st);
}

// ---- stops.c: held text over pieces

typedef struct { char text[256]; size_t n; } sink;
static int to_sink(void *ctx, const char *text, size_t n, dj_err *e) {
    sink *s = ctx;
    memcpy(s->text + s->n, text, n);
    s->n += n;
    s->text[s->n] = 0;
    return 0;
}

// Feeds the pieces in turn; returns held_feed's last answer, the text emitted in *out.
static int feed(const char *const *pieces, int n_pieces, const char *const *stops, int n_stops, sink *out) {
    dj_held h = {0};
    dj_err e = {{0}};
    int hit = -1;
    memset(out, 0, sizeof *out);
    for (int i = 0; i < n_pieces && hit == -1; i++)
        hit = held_feed(&h, pieces[i], strlen(pieces[i]), stops, n_stops, to_sink, out, &e);
    held_free(&h);
    return hit;
}

Test(edges, stop_strings_over_pieces) {
    sink s;
    const char *ab[] = {"ab"};
    // the first stop string found, even the first in the list
    cr_expect_eq(feed((const char *[]){"xaby"}, 1, ab, 1, &s), 0);
    cr_expect_str_eq(s.text, "");  // nothing before the stop is emitted by the call that finds it
    // a stop split over two pieces: its first byte is held back, never emitted
    cr_expect_eq(feed((const char *[]){"xa", "by"}, 2, ab, 1, &s), 0);
    cr_expect_str_eq(s.text, "x");
    // a held prefix that turns out not to be a stop is emitted after all
    cr_expect_eq(feed((const char *[]){"xa", "c"}, 2, ab, 1, &s), -1);
    cr_expect_str_eq(s.text, "xac");
    // two stops at the same place: the index of the one listed first
    const char *two[] = {"ab", "a"};
    cr_expect_eq(feed((const char *[]){"xab"}, 1, two, 2, &s), 0);
    const char *two_r[] = {"a", "ab"};
    cr_expect_eq(feed((const char *[]){"xab"}, 1, two_r, 2, &s), 0);
    // the earliest stop wins over one listed before it
    const char *late[] = {"cd", "b"};
    cr_expect_eq(feed((const char *[]){"abcd"}, 1, late, 2, &s), 1);
}

// ---- api.c: a request body at each limit, refused by the field at fault

// Parses body as a completion (chat 0) or chat completion (chat 1) for a model of 4 layers and dim 3 with
// breakpoints on; 0 or -1, the request freed either way.
static int api_try(const char *body, int chat, api_error *err) {
    static dj_tokenizer *t;
    if (!t) t = tc_load_tokenizer("tokenizers/llama3");  // once: the process ends the tests
    const api_model m = {.tok = t, .chat = CHAT_LLAMA3, .ctx = 64, .vocab = tok_vocab_size(t), .n_layers = 4,
                         .dim = 3, .breakpoints = 1};
    api_req r;
    memset(err, 0, sizeof *err);
    int rc = api_parse(&m, body, strlen(body), chat, 7, &r, err);
    if (!rc) api_req_free(&r);
    return rc;
}

// body is refused with 400 and param names the field.
static void api_refused(const char *body, int chat, const char *param) {
    api_error err;
    cr_expect_eq(api_try(body, chat, &err), -1, "accepted: %s", body);
    cr_expect(err.status == 400 && err.param && !strcmp(err.param, param), "%s: status %d, param %s (want %s): %s",
              body, err.status, err.param ? err.param : "NULL", param, err.msg);
}

static void api_accepted(const char *body, int chat) {
    api_error err;
    cr_expect_eq(api_try(body, chat, &err), 0, "refused: %s: %s", body, err.msg);
}

Test(edges, api_fields_at_their_limits) {
    api_accepted("{\"prompt\": \"x\", \"top_p\": 1, \"min_p\": 1}", 0);
    api_refused("{\"prompt\": \"x\", \"top_p\": 1.5}", 0, "top_p");  // the API says which field, not the sampler
    api_refused("{\"prompt\": \"x\", \"min_p\": 1.01}", 0, "min_p");
    api_refused("{\"prompt\": \"x\", \"top_k\": 1.5}", 0, "top_k");
    api_refused("{\"prompt\": \"x\", \"stop\": \"\"}", 0, "stop");
    api_refused("{\"prompt\": \"x\", \"stop\": [\"a\", \"\"]}", 0, "stop");
    api_refused("{\"prompt\": \"x\", \"logit_bias\": {\"1\": 2}}", 0, "logit_bias");
    api_accepted("{\"prompt\": \"x\", \"logit_bias\": {}}", 0);
    char body[600], name[300];
    memset(name, 's', sizeof name);
    snprintf(body, sizeof body, "{\"prompt\": \"x\", \"session\": \"%.*s\"}", API_SESSION_MAX, name);
    api_accepted(body, 0);
    snprintf(body, sizeof body, "{\"prompt\": \"x\", \"session\": \"%.*s\"}", API_SESSION_MAX + 1, name);
    api_refused(body, 0, "session");
    api_refused("{\"messages\": [{\"role\": \"user\", \"content\": \"a\\u0000b\"}]}", 1, "messages");
    api_refused("{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": \"\\u0000\"}]}]}", 1,
                "messages");
}

Test(edges, api_breakpoints_and_resumes) {
    api_accepted("{\"prompt\": \"x\", \"break_after_layer\": 3}", 0);
    api_refused("{\"prompt\": \"x\", \"break_after_layer\": 4}", 0, "break_after_layer");  // 4 layers: 0..3
    api_refused("{\"prompt\": \"x\", \"break_after_layer\": 1, \"stream\": true}", 0, "stream");
    api_refused("{\"prompt\": \"x\", \"break_after_layer\": 1, \"resume\": {\"id\": \"brk-1\", \"residual\": "
                "\"AAAAAAAAAAAAAAAA\"}}", 0, "resume");
    // dim 3: a row is 12 bytes, 16 base64 characters
    api_accepted("{\"resume\": {\"id\": \"brk-1\", \"residual\": \"AAAAAAAAAAAAAAAA\"}}", 0);
    api_refused("{\"resume\": {\"id\": \"brk-1\", \"residual\": \"\"}}", 0, "resume");          // no row at all
    api_refused("{\"resume\": {\"id\": \"brk-1\", \"residual\": \"AAAAAAAA\"}}", 0, "resume");   // half a row
    api_refused("{\"resume\": {\"id\": \"brk-1\", \"residual\": \"AAAAAAAAAAAAAA=A\"}}", 0, "resume");  // '=' inside
    // +infinity (0x7f800000, little-endian) and NaN (0x7fc00000) as the third float
    api_refused("{\"resume\": {\"id\": \"brk-1\", \"residual\": \"AAAAAAAAAAAAAIB/\"}}", 0, "resume");
    api_refused("{\"resume\": {\"id\": \"brk-1\", \"residual\": \"AAAAAAAAAAAAAMB/\"}}", 0, "resume");
}

// ---- batch.c: the parking budget and the sessions' limit, on the CPU engine over stories260K

typedef struct {
    dj_model m;
    dj_engine eng;
    dj_tokenizer *tok;
    bt_sched *s;
    int status;        // the last job's: its HTTP status when it failed, else 0
    int64_t n_reused;  //   prompt tokens whose cache it reused
} tb_ctx;

static void tb_ended(void *owner, bt_job *j, const char *finish, const char *err) {
    tb_ctx *c = owner;
    c->status = err ? (j->status ? j->status : 500) : 0, c->n_reused = j->n_reused;
}
static void tb_nothing(void *owner, bt_job *j) {}
static void tb_text(void *owner, bt_job *j, const char *text, size_t n) {}

// Scheduler options: that parking budget and sessions' limit, breakpoints of at most 3 positions, one paused state.
static bt_opts tb_opts(uint64_t park_bytes, int32_t max_sessions) {
    return (bt_opts){.parallel = 1, .prefill_chunk = 64, .max_sessions = max_sessions, .park_bytes = park_bytes,
                     .max_paused = 1, .brk_rows = 3};
}

// stories260K on the engine (`slots` KV slots) under a scheduler with options o.
static void tb_open_slots(tb_ctx *c, const bt_opts *o, int32_t slots) {
    tc_load_stories(&c->m, DJ_F32, 0);
    dj_err e = {{0}};
    dj_gpu_opts go = {.max_seq = 64, .quiet = 1};
    cr_assert_eq(engine_open(&c->eng, &c->m, &go, slots, &e), 0, "%s", e.msg);
    static const bt_callbacks cb = {tb_nothing, tb_text, tb_ended};
    c->tok = tc_load_tokenizer("models/stories260K");
    c->s = bt_new(&c->eng, c->tok, &c->m.info.config, o, &cb, &e);
    cr_assert(c->s, "%s", e.msg);
}
static void tb_open_with(tb_ctx *c, const bt_opts *o) { tb_open_slots(c, o, 1); }
static void tb_open(tb_ctx *c, uint64_t park_bytes, int32_t max_sessions) {
    bt_opts o = tb_opts(park_bytes, max_sessions);
    tb_open_with(c, &o);
}

static void tb_close(tb_ctx *c) {
    bt_free(c->s);
    tok_free(c->tok);
    engine_close(&c->eng);
    model_free(&c->m);
}

// A greedy answer of 3 tokens to the prompt (n ids; NULL: 4 fixed ones) in `session` (NULL: none), run to its end
// (brk >= 0: a breakpoint after that layer instead); 0 or the HTTP status it failed with.
static int tb_job(tb_ctx *c, const char *session, const int32_t *prompt, size_t n, int brk) {
    static const int32_t four[] = {1, 21, 22, 23};
    if (!prompt) prompt = four, n = 4;
    bt_job *j = calloc(1, sizeof *j);
    j->n_ids = n, j->ids = malloc(n * sizeof *j->ids);
    memcpy(j->ids, prompt, n * sizeof *j->ids);
    j->max_tokens = 3, j->owner = c, j->brk = brk >= 0, j->layer = brk >= 0 ? (uint32_t)brk : 0;
    dj_sampling sp = DJ_SAMPLING_DEFAULT;
    sp.temp = 0;
    dj_err e = {{0}};
    cr_assert(j->smp = sampler_new_with(c->m.info.config.vocab_size, &sp, 1, &e), "%s", e.msg);
    c->status = -1;
    cr_assert_eq(bt_submit(c->s, j, session, &e), 0, "%s", e.msg);
    for (int k = 0; k < 100 && bt_has_work(c->s); k++) bt_step(c->s);
    cr_assert(!bt_has_work(c->s) && c->status >= 0, "the job did not end");
    return c->status;
}
static void tb_turn(tb_ctx *c, const char *session) { cr_assert_eq(tb_job(c, session, NULL, 0, -1), 0); }

Test(edges, batch_parking_budget_holds_a_cache_of_its_size) {
    tb_ctx c;
    tb_open(&c, 1ull << 30, 4);
    tb_turn(&c, "a");
    int64_t tokens = 0;
    dj_err e = {{0}};
    cr_assert_eq(bt_park(c.s, 0, "a", &tokens, &e), 0, "%s", e.msg);
    cr_assert_gt(tokens, 0);
    const uint64_t bytes = (uint64_t)tokens * engine_kv_pos_bytes(&c.m.info.config, DJ_KV_F32);
    tb_close(&c);
    for (int less = 0; less < 2; less++) {  // a budget of exactly the cache parks it; one byte less drops it
        tb_open(&c, bytes - (uint64_t)less, 4);
        tb_turn(&c, "a");
        int64_t t = -1;
        cr_assert_eq(bt_park(c.s, 0, "a", &t, &e), 0, "%s", e.msg);
        bt_stats st;
        bt_get_stats(c.s, &st);
        if (less) cr_expect(t == 0 && st.parks == 0 && st.drops == 1, "budget one byte short: %lld tokens parked",
                            (long long)t);
        else cr_expect(t == tokens && st.parks == 1 && st.parked_bytes == bytes && st.drops == 0,
                       "budget of the cache's %llu bytes: %lld tokens parked, %llu parks, %llu drops",
                       (unsigned long long)bytes, (long long)t, (unsigned long long)st.parks,
                       (unsigned long long)st.drops);
        tb_close(&c);
    }
}

Test(edges, batch_sessions_beyond_the_limit_forget_the_least_recent) {
    tb_ctx c;
    tb_open(&c, 1ull << 30, 2);
    tb_turn(&c, "a");
    tb_turn(&c, "b");
    tb_turn(&c, "a");  // b is now the least recently used
    tb_turn(&c, "c");  // a third session: b is forgotten
    bt_stats st;
    bt_get_stats(c.s, &st);
    cr_expect_eq(st.sessions, 2);
    int64_t t;
    dj_err e = {{0}};
    cr_expect_eq(bt_park(c.s, 0, "b", &t, &e), 404, "b, the least recently used, should be forgotten");
    cr_expect_eq(bt_park(c.s, 0, "a", &t, &e), 0, "a was used after b: %s", e.msg);
    tb_close(&c);
}

Test(edges, batch_prefix_reuse_and_limits) {
    tb_ctx c;
    tb_open(&c, 1ull << 30, 4);
    // a prompt sharing 3 of its 5 tokens with the slot's cache (at least half) prefills only the other 2
    static const int32_t p5[] = {1, 21, 22, 30, 31};
    tb_turn(&c, NULL);
    cr_assert_eq(tb_job(&c, NULL, p5, 5, -1), 0);
    cr_expect_eq(c.n_reused, 3, "%lld tokens reused", (long long)c.n_reused);
    tb_close(&c);
    // two slots: a prompt sharing at least half with one slot's cache goes there, though the other is older
    bt_opts two = tb_opts(1ull << 30, 4);
    tb_open_slots(&c, &two, 2);
    static const int32_t q4[] = {1, 40, 41, 42}, q5[] = {1, 40, 41, 50, 51};
    tb_turn(&c, NULL);  // slot 0: {1, 21, 22, 23} and its answer
    cr_assert_eq(tb_job(&c, NULL, q4, 4, -1), 0);  // slot 1
    cr_assert_eq(tb_job(&c, NULL, q5, 5, -1), 0);
    cr_expect_eq(c.n_reused, 3, "%lld tokens reused: the slot holding {1, 40, 41} should be taken", (long long)c.n_reused);
    tb_close(&c);
    tb_open(&c, 1ull << 30, 4);
    // a breakpoint returns at most brk_rows (3) positions: 3 new ones are fine, 4 are refused
    static const int32_t p3[] = {1, 40, 41}, p4[] = {1, 50, 51, 52};
    cr_expect_eq(tb_job(&c, NULL, p3, 3, 0), 0, "a breakpoint of 3 positions");
    tb_close(&c);
    tb_open(&c, 1ull << 30, 4);
    cr_expect_eq(tb_job(&c, NULL, p4, 4, 0), 400, "a breakpoint of 4 positions");
    tb_close(&c);
    // more parallel sequences than the engine has slots
    tc_load_stories(&c.m, DJ_F32, 0);
    dj_err e = {{0}};
    dj_gpu_opts go = {.max_seq = 64, .quiet = 1};
    cr_assert_eq(engine_open(&c.eng, &c.m, &go, 1, &e), 0, "%s", e.msg);
    bt_opts o = tb_opts(1 << 20, 4);
    o.parallel = 2;
    static const bt_callbacks cb = {tb_nothing, tb_text, tb_ended};
    cr_expect_null(bt_new(&c.eng, NULL, &c.m.info.config, &o, &cb, &e), "parallel 2 over 1 slot");
    cr_expect(e.msg[0], "no message");
    engine_close(&c.eng);
    model_free(&c.m);
}

// ---- djinn.c: each flag's value at the limit of its range. Flags are checked before the model is opened: a usage
// error exits 2, a run that got past them exits 1 on the model that does not exist.
static int flags_rc(const char *const *args, int n) {
    char djinn[4200];
    snprintf(djinn, sizeof djinn, "%s/djinn", tc_bin_dir());
    char *argv[200] = {djinn, "/nonexistent/model.bin"};
    cr_assert_lt(n + 3, 200);
    for (int i = 0; i < n; i++) argv[2 + i] = (char *)args[i];
    argv[2 + n] = NULL;
    return tc_run(argv, "/dev/null", "/dev/null", 0, "/dev/null", 30);
}

Test(edges, djinn_flag_values_at_their_limits) {
    static const struct { const char *a[4]; int usage; } cases[] = {
        {{"-n", "99999999999999999999"}, 1},  // past int64: not a count
        {{"-t", "-0.5"}, 1},              {{"-t", "0"}, 0},
        {{"--top-p", "1"}, 0},            {{"--top-p", "1.01"}, 1},
        {{"--min-p", "1"}, 0},            {{"--min-p", "1.01"}, 1},
        {{"--top-k", "0"}, 0},            {{"--repeat-penalty", "1e-9"}, 0},
        {{"--repeat-last-n", "16777216"}, 0}, {{"--repeat-last-n", "16777217"}, 1},
        {{"-s", "0"}, 0},                 {{"-s", "-1"}, 1},
        {{"-c", "1"}, 0},
        {{"--threads", "256"}, 0},        {{"--threads", "257"}, 1},
        {{"--ring-gb", "1e-9"}, 0},
        {{"--cpu-share", "0.95"}, 0},     {{"--cpu-share", "0.951"}, 1},
        {{"--check", "r", "--tol", "0"}, 0}, {{"--check", "r", "--tol", "-0.5"}, 1},
        {{"--tol", "0"}, 1},              // --check's
        {{"--chat-template", "llama2"}, 1},  // --chat's
        {{"--check", "r", "-p", "x"}, 1}, {{"--perplexity", "t", "-f", "p"}, 1},  // their own tokens
        {{"--check", "r", "--tokenize"}, 1},
        {{"--stop", ""}, 1},
        {{"--system", "x"}, 1},           // --chat's
        {{"--check", "a", "--perplexity", "b"}, 1},
        {{"--trace-steps", "5"}, 1},      // needs --trace
        {{"--draft", "d", "--draft-max", "32"}, 0}, {{"--draft", "d", "--draft-max", "0"}, 1},
        {{"--draft", "d", "--draft-max", "33"}, 1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        int n = 0;
        while (n < 4 && cases[i].a[n]) n++;
        int rc = flags_rc(cases[i].a, n);
        cr_expect_eq(rc, cases[i].usage ? 2 : 1, "%s %s %s %s: exit %d, want %s", cases[i].a[0], cases[i].a[1],
                     n > 2 ? cases[i].a[2] : "", n > 3 ? cases[i].a[3] : "", rc,
                     cases[i].usage ? "2 (a usage error)" : "1 (past the flags, no model)");
    }
}

Test(edges, djinn_repeated_flags_up_to_their_count) {
    const char *a[140];
    for (int k = 0; k < 2; k++) {  // 16 --stop strings are fine, 17 are not
        int n = 0;
        for (int i = 0; i < 16 + k; i++) a[n++] = "--stop", a[n++] = "x";
        cr_expect_eq(flags_rc(a, n), k ? 2 : 1, "%d --stop", 16 + k);
    }
    for (int k = 0; k < 2; k++) {  // 64 --steer vectors are fine, 65 are not
        int n = 0;
        for (int i = 0; i < 64 + k; i++) a[n++] = "--steer", a[n++] = "0:/nonexistent/v.bin";
        cr_expect_eq(flags_rc(a, n), k ? 2 : 1, "%d --steer", 64 + k);
    }
}

// A resume of the newest breakpoint after 256 others ended since it did (its record of why pushed out): still "gone"
// (410), not "no such state" (404), since no later id was ever given.
Test(edges, batch_resume_of_a_state_ended_long_ago) {
    tb_ctx c;
    bt_opts o = tb_opts(1ull << 30, 300);
    o.max_paused = 300;
    tb_open_with(&c, &o);
    static const int32_t p2[] = {1, 60};
    char name[16];
    for (int i = 1; i <= 257; i++) {  // brk-1 .. brk-257, each pausing its session s1 .. s257
        snprintf(name, sizeof name, "s%d", i);
        cr_assert_eq(tb_job(&c, name, p2, 2, 0), 0, "breakpoint %d", i);
    }
    dj_err e = {{0}};
    for (int i = 257; i >= 1; i--) {  // brk-257 ends first, then 256 others after it
        snprintf(name, sizeof name, "s%d", i);
        cr_assert_eq(bt_forget(c.s, 0, name, &e), 0, "%s", e.msg);
    }
    bt_job j = {.resume = 257};
    cr_expect_eq(bt_submit(c.s, &j, NULL, &e), 410, "a resume of brk-257: %s", e.msg);
    bt_job later = {.resume = 258};
    cr_expect_eq(bt_submit(c.s, &later, NULL, &e), 404, "brk-258 was never given: %s", e.msg);
    tb_close(&c);
}

// ---- convert/hfconfig.c: refusals that a later check would otherwise turn into another error, or into a crash
Test(edges, hfconfig_refusals_by_their_own_check) {
    static const char *base = "{\"architectures\": [\"LlamaForCausalLM\"], \"hidden_size\": 64, "
                              "\"num_hidden_layers\": 2, \"intermediate_size\": 172, \"vocab_size\": 512, "
                              "\"max_position_embeddings\": 512, %s}";
    static const struct { const char *keys, *error; } cases[] = {
        {"\"num_attention_heads\": 8", NULL},
        {"\"num_attention_heads\": 0", "num_attention_heads is 0"},  // before dim / n_heads divides by it
        // -(2^32 - 4) is 4 modulo 2^32: a negative count must not wrap into a valid one
        {"\"num_attention_heads\": 8, \"num_key_value_heads\": -4294967292", "non-negative integer"},
        {"\"num_attention_heads\": 8, \"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 8, "
         "\"low_freq_factor\": 1, \"high_freq_factor\": 4}", "needs \"original_max_position_embeddings\""},
        {"\"num_attention_heads\": 8, \"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 8, "
         "\"low_freq_factor\": 1, \"high_freq_factor\": 4, \"original_max_position_embeddings\": 0}",
         "\"original_max_position_embeddings\" must be a positive integer"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char text[1024];
        snprintf(text, sizeof text, base, cases[i].keys);
        dj_config c;
        dj_err e = {{0}};
        int rc = hf_config_parse(text, strlen(text), &c, &e);
        if (!cases[i].error) {
            cr_expect_eq(rc, 0, "%s: %s", cases[i].keys, e.msg);
            continue;
        }
        cr_expect_eq(rc, -1, "%s: accepted", cases[i].keys);
        cr_expect(strstr(e.msg, cases[i].error), "%s: '%s' should say '%s'", cases[i].keys, e.msg, cases[i].error);
    }
}

// ---- cpu.c: a parked cache fits the slot it is restored into, up to the slot's whole context; a state has slots and
// a context
Test(edges, cpu_restore_up_to_the_context) {
    dj_model m;
    tc_load_stories(&m, DJ_F32, 0);
    dj_err e = {{0}};
    dj_cpu_state *big = cpu_state_new_slots(&m, 64, 1, DJ_KV_F32, &e),
                 *fits = cpu_state_new_slots(&m, 64, 1, DJ_KV_F32, &e),
                 *small = cpu_state_new_slots(&m, 63, 1, DJ_KV_F32, &e);
    cr_assert(big && fits && small, "%s", e.msg);
    dj_cpu_parked *p = cpu_park(big, 0, 64, &e);
    cr_assert(p, "%s", e.msg);
    cr_assert_eq(cpu_restore(small, p, 0, &e), -1, "64 positions restored into a context of 63");  // p kept
    cr_expect(e.msg[0], "no message");
    cr_expect_eq(cpu_restore(fits, p, 0, &e), 0, "64 positions into a context of 64: %s", e.msg);  // p freed
    cr_expect_null(cpu_park(big, 0, 65, &e), "65 positions parked from a context of 64");
    cr_expect_null(cpu_state_new_slots(&m, 64, 0, DJ_KV_F32, &e), "a CPU state of 0 KV slots");
    cr_expect_null(cpu_state_new_slots(&m, 0, 1, DJ_KV_F32, &e), "a CPU state of context 0");
    cpu_state_free(big), cpu_state_free(fits), cpu_state_free(small);
    model_free(&m);
}

// ---- engine.c: the rows a step wants are ascending rows of the step; an engine has slots
Test(edges, engine_rows_wanted_and_slots) {
    dj_model m;
    tc_load_stories(&m, DJ_F32, 0);
    dj_engine eng = {0};
    dj_err e = {{0}};
    dj_gpu_opts go = {.max_seq = 64, .quiet = 1};
    cr_expect_neq(engine_open(&eng, &m, &go, 0, &e), 0, "an engine of 0 slots");
    cr_expect(strstr(e.msg, "KV slots"), "%s", e.msg);
    engine_close(&eng);
    memset(&eng, 0, sizeof eng);
    cr_assert_eq(engine_open(&eng, &m, &go, 1, &e), 0, "%s", e.msg);
    const int32_t slots[2] = {0, 0}, tokens[2] = {1, 20};
    const int64_t pos[2] = {0, 1};
    float *logits = malloc(2 * sizeof(float) * m.info.config.vocab_size);
    static const struct { int32_t want[2]; int64_t n_want; int ok; } cases[] = {
        {{0, 1}, 2, 1}, {{1}, 1, 1},
        {{2}, 1, 0},     // past the step's 2 rows
        {{1, 1}, 2, 0},  // a row twice
        {{1, 0}, 2, 0},  // descending
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        e.msg[0] = 0;
        int rc = eng.step_rows(eng.ctx, 2, slots, pos, tokens, cases[i].n_want, cases[i].want, logits, &e);
        cr_expect_eq(rc == 0, cases[i].ok, "want {%d, %d} (%lld of them): rc %d %s", cases[i].want[0],
                     cases[i].want[1], (long long)cases[i].n_want, rc, e.msg);
    }
    free(logits);
    engine_close(&eng);
    model_free(&m);
}

// ---- model.c: a configuration at each limit of dj_config_validate, and a model.bin header at each limit of
// model_parse (the rest: test_model.c)

// A small llama3-RoPE config (2 layers, dim 64, f32).
static dj_config edge_config(void) {
    static const char *json = "{\"architectures\": [\"LlamaForCausalLM\"], \"hidden_size\": 64, \"num_hidden_layers\": 2, "
                              "\"num_attention_heads\": 8, \"intermediate_size\": 172, \"vocab_size\": 512, "
                              "\"max_position_embeddings\": 512, \"rope_scaling\": {\"rope_type\": \"llama3\", "
                              "\"factor\": 8, \"low_freq_factor\": 1, \"high_freq_factor\": 4, "
                              "\"original_max_position_embeddings\": 64}}";
    dj_config c;
    dj_err e = {{0}};
    cr_assert_eq(hf_config_parse(json, strlen(json), &c, &e), 0, "%s", e.msg);
    dj_config_set_wtype(&c, DJ_F32);
    return c;
}
Test(edges, model_config_limits) {
    dj_config base = edge_config(), c;
    dj_err e = {{0}};
    cr_assert_eq(dj_config_validate(&base, &e), 0, "%s", e.msg);
#define LIMIT(edit, ok)                                                                                    \
    do {                                                                                                   \
        c = base;                                                                                          \
        edit;                                                                                              \
        e.msg[0] = 0;                                                                                      \
        int rc_ = dj_config_validate(&c, &e);                                                              \
        cr_expect_eq(rc_ == 0, ok, "%s: %s", #edit, rc_ ? e.msg : "accepted");                              \
    } while (0)
    LIMIT(c.dim = 65536, 1);
    LIMIT(c.dim = 65537, 0);
    LIMIT(c.rope_factor = 1, 1);
    LIMIT(c.rope_factor = 0.5f, 0);
    LIMIT(c.rope_high_freq = c.rope_low_freq, 0);
    LIMIT(c.tied = 1, 1);
    LIMIT(c.tied = 2, 0);
    LIMIT(c.norm_eps = 1e-30f, 1);
    LIMIT(c.norm_eps = 0, 0);
    LIMIT(c.head_dim = 7, 0);
#undef LIMIT
}

// The header of a model.bin of edge_config() with a 100-byte tokenizer section, in a zeroed buffer of the whole
// file's size; the edit, then its CRC made right again (so that each check, not the CRC, must refuse it).
typedef struct {
    uint8_t *img;
    uint64_t size;
    dj_disk_header h;
    dj_disk_section *sec;  // (n_layers + 3) in img
} edge_bin;

static void bin_make(edge_bin *b) {
    dj_config c = edge_config();
    dj_model_info plan;
    dj_err e = {{0}};
    cr_assert_eq(model_plan(&c, 100, &plan, &e), 0, "%s", e.msg);
    b->size = plan.file_size;
    b->img = calloc(1, b->size);
    cr_assert_eq(model_write_header(&plan, b->img, model_header_bytes(c.n_layers), &e), 0, "%s", e.msg);
    dj_info_free(&plan);
    memcpy(&b->h, b->img, sizeof b->h);
    b->sec = (dj_disk_section *)(void *)(b->img + DJ_HEADER_SIZE);
}

static void bin_fix(edge_bin *b) {
    memcpy(b->img, &b->h, sizeof b->h);
    const size_t tables = (size_t)b->h.n_sections * sizeof(dj_disk_section) +
                          (size_t)(DJ_N_TENSOR_KINDS - b->h.config.tied) * sizeof(dj_disk_tensor);
    uint8_t copy[sizeof(dj_disk_header)];
    memcpy(copy, b->img, sizeof copy);
    memset(copy + offsetof(dj_disk_header, crc), 0, 4);
    uint32_t crc = dj_crc32(0, copy, sizeof copy);
    crc = dj_crc32(crc, b->img + sizeof copy, DJ_HEADER_SIZE - sizeof copy);
    b->h.crc = dj_crc32(crc, b->img + DJ_HEADER_SIZE, tables);
    memcpy(b->img, &b->h, sizeof b->h);
}

// model_parse of the first n bytes of a file of file_size; expects a refusal whose message holds `want`, or
// (want NULL) success.
static void bin_expect(const edge_bin *b, size_t n, uint64_t file_size, const char *want, const char *what) {
    dj_model_info info;
    dj_err e = {{0}};
    int rc = model_parse(b->img, n, file_size, &info, &e);
    if (!rc) dj_info_free(&info);
    if (!want) cr_expect_eq(rc, 0, "%s: %s", what, e.msg);
    else cr_expect(rc == -1 && strstr(e.msg, want), "%s: %s (want '%s')", what, rc ? e.msg : "accepted", want);
}

Test(edges, model_header_limits) {
    edge_bin b;
    bin_make(&b);
    const size_t hb = (size_t)model_header_bytes(b.h.config.n_layers);
    bin_fix(&b);
    bin_expect(&b, hb, b.size, NULL, "as written");
    bin_expect(&b, DJ_HEADER_SIZE - 1, b.size, "shorter than", "the header cut by one byte in memory");
    bin_expect(&b, DJ_HEADER_SIZE + 8, b.size, "run past the end", "the tables cut in memory");
    b.h.header_size = DJ_HEADER_SIZE - 8, bin_fix(&b);
    bin_expect(&b, hb, b.size, "header size", "a smaller header_size");
    b.h.header_size = DJ_HEADER_SIZE, b.img[DJ_HEADER_SIZE - 1] = 1, bin_fix(&b);
    bin_expect(&b, hb, b.size, "padding byte 4095", "the header's last padding byte set");
    b.img[DJ_HEADER_SIZE - 1] = 0;
    b.h.version = 2, b.h.n_tensors++, bin_fix(&b);  // version 2 files have the tensor table too
    bin_expect(&b, hb, b.size, "entries in the tensor table", "a version 2 file with one tensor entry too many");
    b.h.version = DJ_VERSION, b.h.n_tensors--, bin_fix(&b);
    uint64_t end = 0;  // where the last section ends: the file one byte shorter than that
    for (uint32_t i = 0; i < b.h.n_sections; i++)
        if (b.sec[i].offset + b.sec[i].size > end) end = b.sec[i].offset + b.sec[i].size;
    b.h.file_size = end - 1, bin_fix(&b);
    bin_expect(&b, hb, end - 1, "outside the file", "a section ending one byte past the file");
    free(b.img);
}

// ---- quant.c: groups at the ends of the zero point's range: all zeros (parameter 0, every byte 0), all equal and
// negative (the zero point at the top of its range: u = 255 is z + x / s)
Test(edges, quant_groups_at_the_zero_points_ends) {
    float x[DJ_QGROUP], back[DJ_QGROUP];
    uint8_t row[256];
    const uint32_t dtypes[] = {DJ_Q8, DJ_Q4};
    for (int d = 0; d < 2; d++) {
        const uint64_t rb = dj_row_bytes(dtypes[d], DJ_QGROUP);
        cr_assert_leq(rb, sizeof row);
        memset(x, 0, sizeof x);
        memset(row, 0xAB, sizeof row);
        cr_assert_eq(quant_row(dtypes[d], x, DJ_QGROUP, row, NULL, NULL), 0);
        for (uint64_t i = 0; i < rb; i++) cr_expect_eq(row[i], 0, "dtype %u: all zeros gives byte %llu = %u", dtypes[d],
                                                       (unsigned long long)i, row[i]);
        for (int v = 0; v < 3; v++) {
            const float val = v == 0 ? -1.0f : v == 1 ? -0.37f : -1000.0f;
            for (int i = 0; i < DJ_QGROUP; i++) x[i] = val;
            cr_assert_eq(quant_row(dtypes[d], x, DJ_QGROUP, row, NULL, NULL), 0);
            dequant_row(dtypes[d], row, DJ_QGROUP, back);
            for (int i = 0; i < DJ_QGROUP; i++)
                cr_expect(fabsf(back[i] - val) <= 0.07f * fabsf(val), "dtype %u: %g came back as %g", dtypes[d], val,
                          back[i]);
        }
    }
}

// ---- sampler.c: settings at their limits; an id outside the vocabulary never enters the penalties' window
Test(edges, sampler_limits_and_window) {
    dj_err e = {{0}};
    dj_sampling sp = DJ_SAMPLING_DEFAULT;
    dj_sampler *s;
    sp.top_p = 1;
    cr_assert(s = sampler_new_with(4, &sp, 1, &e), "top_p 1: %s", e.msg);
    sampler_free(s);
    sp.top_p = 1.5;
    cr_expect_null(sampler_new_with(4, &sp, 1, &e), "top_p 1.5");
    sp = DJ_SAMPLING_DEFAULT;
    cr_expect_null(sampler_new_with(0, &sp, 1, &e), "a vocabulary of 0");
    sp.repeat_last_n = 1 << 24, sp.repeat_penalty = 2;
    cr_assert(s = sampler_new_with(4, &sp, 1, &e), "repeat_last_n 2^24: %s", e.msg);
    // the changes to the counts since the last step: up to DJ_PICK_SETS of them listed, past that "take them whole"
    dj_pick_args a;
    sampler_step_args(s, &a);
    for (int k = 0; k < 2; k++) {
        for (int i = 0; i < DJ_PICK_SETS + k; i++) sampler_accept(s, i % 4);
        sampler_step_args(s, &a);
        cr_expect_eq(a.n_set, k ? -1 : DJ_PICK_SETS, "%d changes: n_set %d", DJ_PICK_SETS + k, a.n_set);
    }
    sampler_free(s);
    sp.repeat_last_n = (1 << 24) + 1;
    cr_expect_null(sampler_new_with(4, &sp, 1, &e), "repeat_last_n 2^24 + 1");
    sp = DJ_SAMPLING_DEFAULT;
    // a window of 3: the id 4 (one past a vocabulary of 4) is skipped, so accepting 3 still keeps 1 and 2
    sp.repeat_last_n = 3, sp.repeat_penalty = 2;
    for (int way = 0; way < 2; way++) {
        cr_assert(s = sampler_new_with(4, &sp, 1, &e), "%s", e.msg);
        if (way == 0) {
            sampler_accept(s, 1), sampler_accept(s, 4), sampler_accept(s, 2);
        } else {
            sampler_history(s, (const int32_t[]){1, 4, 2}, 3);
        }
        sampler_accept(s, 3);
        const int32_t *c = sampler_counts(s);
        cr_expect(c[0] == 0 && c[1] == 1 && c[2] == 1 && c[3] == 1, "%s: counts %d %d %d %d",
                  way ? "history" : "accept", c[0], c[1], c[2], c[3]);
        sampler_free(s);
    }
}

// ---- session.c: a session file's counts and tokens, each edited with its header's CRC made right again
static char ses_msg[512];  // the last refusal's message

// The saved session x.ses with `width` bytes at `at` set to v (at < 0: none), token tok_at set to vocab_size (< 0:
// none) and `extra` zero bytes appended (the header's file size grown by as much when grow), opened with context ctx.
static int ses_open_edited(const char *dir, const dj_model *m, int at, uint64_t v, int width, int tok_at, int extra,
                           int grow, int64_t ctx) {
    char src[4300], dst[4300];
    snprintf(src, sizeof src, "%s/x.ses", dir), snprintf(dst, sizeof dst, "%s/y.ses", dir);
    size_t n;
    uint8_t *f = (uint8_t *)tc_must_read(src, &n);
    f = realloc(f, n + (size_t)extra);
    memset(f + n, 0, (size_t)extra);
    n += (size_t)extra;
    if (grow) {
        uint64_t fs;
        memcpy(&fs, f + 16, 8), fs += (uint64_t)extra, memcpy(f + 16, &fs, 8);  // H_FSIZE
    }
    if (at >= 0) memcpy(f + at, &v, (size_t)width);  // little-endian: the low bytes
    if (tok_at >= 0) {
        int32_t id = (int32_t)m->info.config.vocab_size;  // one past the last token
        memcpy(f + SESSION_HEADER + 4 * tok_at, &id, 4);
    }
    memset(f + 24, 0, 4);  // H_HCRC: the CRC of the header with this field zero
    uint32_t crc = dj_crc32(0, f, SESSION_HEADER);
    memcpy(f + 24, &crc, 4);
    tc_write(dst, f, n);
    free(f);
    dj_session s;
    dj_err e = {{0}};
    int rc = session_open(&s, dst, m, "s.bin", ctx, &e);
    if (!rc) session_close(&s);
    snprintf(ses_msg, sizeof ses_msg, "%s", rc ? e.msg : "");
    return rc;
}

Test(edges, session_header_counts_and_tokens) {
    char stories[4096], bin[4200], ses[4200];
    tc_data_path(stories, sizeof stories, "models/stories260K");
    char *dir = tc_tmpdir("edges_session");
    snprintf(bin, sizeof bin, "%s/s.bin", dir), snprintf(ses, sizeof ses, "%s/x.ses", dir);
    convert_opts co = {.hf_dir = stories, .out_path = bin, .dtype = DJ_F32, .quiet = 1};
    dj_err e = {{0}};
    cr_assert_eq(convert_run(&co, &e), 0, "%s", e.msg);
    char djinn[4200];
    snprintf(djinn, sizeof djinn, "%s/djinn", tc_bin_dir());
    char *argv[] = {djinn, bin, "-p", "Once upon", "-n", "3", "-t", "0", "-c", "64", "--cpu", "--save-session", ses, NULL};
    cr_assert_eq(tc_run(argv, "/dev/null", "/dev/null", 0, "/dev/null", 60), 0, "djinn --save-session failed");
    dj_model m;
    dj_load_opts lo = {.quiet = 1};
    cr_assert_eq(model_load(bin, &lo, &m, &e), 0, "%s", e.msg);
    cr_expect_eq(ses_open_edited(dir, &m, -1, 0, 0, -1, 0, 0, 64), 0, "the file as saved");
    cr_expect_eq(ses_open_edited(dir, &m, 80, 0, 8, -1, 0, 0, 64), -1, "a prompt of 0 tokens (H_NPROMPT)");
    cr_expect_eq(ses_open_edited(dir, &m, 96, (uint32_t)-2, 4, -1, 0, 0, 64), -1, "next token -2 (H_NEXT)");
    cr_expect_eq(ses_open_edited(dir, &m, -1, 0, 0, 1, 0, 0, 64), -1, "a token of id vocab_size");
    cr_expect_eq(ses_open_edited(dir, &m, -1, 0, 0, -1, 0, 0, 65), -1, "saved with a context of 64, opened with 65");
    cr_expect_eq(ses_open_edited(dir, &m, -1, 0, 0, -1, 4, 1, 64), -1, "4 bytes after the KV cache, the header's size "
                                                                        "saying so");
    cr_expect_eq(ses_open_edited(dir, &m, -1, 0, 0, -1, 4, 0, 64), -1, "4 bytes more than the header's size");
    cr_expect(strstr(ses_msg, "longer than it should be"), "%s", ses_msg);
    model_free(&m);
    tc_rm_rf(dir);
    free(dir);
}
