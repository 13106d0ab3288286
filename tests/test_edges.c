// test_edges.c: the limits of the checks that validate input, each at the value where the answer turns, so that a
// check off by one or missing a condition fails here (the survivors of `make mutate`, tests/mutations.tsv).
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../api.h"
#include "../batch.h"
#include "../engine.h"
#include "../loader.h"
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
} tb_ctx;

static void tb_ended(void *owner, bt_job *j, const char *finish, const char *err) {
    cr_expect(!err, "a job failed: %s", err ? err : "");
}
static void tb_nothing(void *owner, bt_job *j) {}
static void tb_text(void *owner, bt_job *j, const char *text, size_t n) {}

// stories260K on the engine (one KV slot) under a scheduler with that parking budget and sessions' limit.
static void tb_open(tb_ctx *c, uint64_t park_bytes, int32_t max_sessions) {
    tc_load_stories(&c->m, DJ_F32, 0);
    dj_err e = {{0}};
    dj_gpu_opts go = {.max_seq = 64, .quiet = 1};
    cr_assert_eq(engine_open(&c->eng, &c->m, &go, 1, &e), 0, "%s", e.msg);
    bt_opts o = {.parallel = 1, .prefill_chunk = 64, .max_sessions = max_sessions, .park_bytes = park_bytes};
    static const bt_callbacks cb = {tb_nothing, tb_text, tb_ended};
    c->tok = tc_load_tokenizer("models/stories260K");
    c->s = bt_new(&c->eng, c->tok, &c->m.info.config, &o, &cb, &e);
    cr_assert(c->s, "%s", e.msg);
}

static void tb_close(tb_ctx *c) {
    bt_free(c->s);
    tok_free(c->tok);
    engine_close(&c->eng);
    model_free(&c->m);
}

// A greedy answer of 3 tokens to a 4-token prompt in `session`, run to its end.
static void tb_turn(tb_ctx *c, const char *session) {
    bt_job *j = calloc(1, sizeof *j);
    j->n_ids = 4, j->ids = malloc(4 * sizeof *j->ids);
    for (int i = 0; i < 4; i++) j->ids[i] = i ? 20 + i : 1;
    j->max_tokens = 3, j->owner = c;
    dj_sampling sp = DJ_SAMPLING_DEFAULT;
    sp.temp = 0;
    dj_err e = {{0}};
    cr_assert(j->smp = sampler_new_with(c->m.info.config.vocab_size, &sp, 1, &e), "%s", e.msg);
    cr_assert_eq(bt_submit(c->s, j, session, &e), 0, "%s", e.msg);
    for (int k = 0; k < 100 && bt_has_work(c->s); k++) bt_step(c->s);
    cr_assert_not(bt_has_work(c->s), "the turn did not end");
}

Test(edges, batch_parking_budget_holds_a_cache_of_its_size) {
    tb_ctx c;
    tb_open(&c, 1ull << 30, 4);
    tb_turn(&c, "a");
    int64_t tokens = 0;
    dj_err e = {{0}};
    cr_assert_eq(bt_park(c.s, "a", &tokens, &e), 0, "%s", e.msg);
    cr_assert_gt(tokens, 0);
    const uint64_t bytes = (uint64_t)tokens * engine_kv_pos_bytes(&c.m.info.config);
    tb_close(&c);
    for (int less = 0; less < 2; less++) {  // a budget of exactly the cache parks it; one byte less drops it
        tb_open(&c, bytes - (uint64_t)less, 4);
        tb_turn(&c, "a");
        int64_t t = -1;
        cr_assert_eq(bt_park(c.s, "a", &t, &e), 0, "%s", e.msg);
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
    cr_expect_eq(bt_park(c.s, "b", &t, &e), 404, "b, the least recently used, should be forgotten");
    cr_expect_eq(bt_park(c.s, "a", &t, &e), 0, "a was used after b: %s", e.msg);
    tb_close(&c);
}
