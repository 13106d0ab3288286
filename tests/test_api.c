// test_api.c: api_parse (api.c), the server's request checks, directly, with stories260K's tokenizer: every bound
// it has at its limit (taken), just inside it and just past it (refused, naming the field), each refusal by a case
// of its own; the prompt against the context; the stop strings' count; one BOS for a prompt that writes its text.
#include <criterion/criterion.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../api.h"
#include "common.h"

// ---- helpers
static dj_tokenizer *ta_tok;
static api_model ta_m;

// stories260K's tokenizer; a model of 4 layers of dim 8, a context of 64, breakpoints on (the tests change them).
static void ta_setup(void) {
    ta_tok = tc_load_tokenizer("models/stories260K");
    ta_m = (api_model){.tok = ta_tok, .chat = CHAT_LLAMA2, .ctx = 64, .vocab = tok_vocab_size(ta_tok), .n_layers = 4,
                       .dim = 8, .breakpoints = 1};
}

static void ta_teardown(void) {
    if (ta_tok) tok_free(ta_tok);
    ta_tok = NULL;
}

TestSuite(api, .init = ta_setup, .fini = ta_teardown);

// The body printf'd, parsed from an exact-size heap copy as a completion (chat 0) or a chat completion (chat 1).
static int ta_parse(int chat, api_req *r, api_error *err, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static int ta_parse(int chat, api_req *r, api_error *err, const char *fmt, ...) {
    char *body;
    va_list ap;
    va_start(ap, fmt);
    int n = vasprintf(&body, fmt, ap);
    va_end(ap);
    cr_assert(n >= 0);
    char *copy = malloc((size_t)n + 1);
    memcpy(copy, body, (size_t)n);
    int rc = api_parse(&ta_m, copy, (size_t)n, chat, 7, r, err);
    free(copy), free(body);
    return rc;
}

// A completion with `fields` (", \"key\": value ...") after its prompt: taken.
#define TA_OK(fields)                                                                                     \
    do {                                                                                                  \
        api_req r_;                                                                                       \
        api_error e_;                                                                                     \
        int rc_ = ta_parse(0, &r_, &e_, "{\"prompt\": \"Once\"%s}", fields);                             \
        cr_assert_eq(rc_, 0, "refused: %s (%d %s: %s)", fields, e_.status, e_.param ? e_.param : "-", e_.msg); \
        api_req_free(&r_);                                                                                \
    } while (0)

// The same, refused with 400 naming `param` (NULL: none).
static void ta_refused_body(int chat, const char *body, int status, const char *param) {
    api_req r;
    api_error e;
    int rc = ta_parse(chat, &r, &e, "%s", body);
    cr_assert_eq(rc, -1, "accepted: %s", body);
    cr_assert_eq(e.status, status, "status %d, want %d: %s (%s)", e.status, status, body, e.msg);
    if (param) cr_assert(e.param && !strcmp(e.param, param), "param '%s', want '%s': %s (%s)", e.param ? e.param : "-",
                         param, body, e.msg);
    else cr_assert_null(e.param, "param '%s': %s", e.param, body);
    cr_assert(e.msg[0] && !strchr(e.msg, '\n'), "message '%s'", e.msg);
}

static void ta_refused(const char *fields, const char *param) {
    char *body;
    cr_assert(asprintf(&body, "{\"prompt\": \"Once\"%s}", fields) >= 0);
    ta_refused_body(0, body, 400, param);
    free(body);
}

// ---- the prompt against the context: it must leave room for one new token
Test(api, prompt_against_the_context) {
    const char *text = "Once upon a time there was a little girl";
    int32_t *ids;
    size_t n;
    dj_err de;
    cr_assert_eq(tok_encode(ta_tok, text, strlen(text), 1, &ids, &n, &de), 0, "%s", de.msg);
    free(ids);
    cr_assert_gt(n, 3);
    const int64_t ctxs[] = {(int64_t)n + 1, (int64_t)n + 2, 4096};
    for (size_t k = 0; k < 3; k++) {
        ta_m.ctx = ctxs[k];
        api_req r;
        api_error e;
        cr_assert_eq(ta_parse(0, &r, &e, "{\"prompt\": \"%s\"}", text), 0, "%zu tokens, context %lld: %s", n,
                     (long long)ta_m.ctx, e.msg);
        cr_assert_eq(r.n_ids, n);
        api_req_free(&r);
    }
    const int64_t full[] = {(int64_t)n, (int64_t)n - 1, 1};
    for (size_t k = 0; k < 3; k++) {
        ta_m.ctx = full[k];
        char *body;
        cr_assert(asprintf(&body, "{\"prompt\": \"%s\"}", text) >= 0);
        ta_refused_body(0, body, 400, "prompt");
        free(body);
    }
    // a chat's messages the same way, its template's tokens counted
    ta_m.ctx = 4096;
    api_req r;
    api_error e;
    cr_assert_eq(ta_parse(1, &r, &e, "{\"messages\": [{\"role\": \"user\", \"content\": \"%s\"}]}", text), 0, "%s", e.msg);
    size_t nc = r.n_ids;
    api_req_free(&r);
    ta_m.ctx = (int64_t)nc + 1;
    cr_assert_eq(ta_parse(1, &r, &e, "{\"messages\": [{\"role\": \"user\", \"content\": \"%s\"}]}", text), 0, "%s", e.msg);
    api_req_free(&r);
    ta_m.ctx = (int64_t)nc;
    cr_assert_eq(ta_parse(1, &r, &e, "{\"messages\": [{\"role\": \"user\", \"content\": \"%s\"}]}", text), -1);
    cr_assert(e.status == 400 && e.param && !strcmp(e.param, "messages"), "%d %s", e.status, e.msg);
    cr_assert(e.code && !strcmp(e.code, "context_length_exceeded"), "OpenAI's code: %s", e.code ? e.code : "null");
    // another refusal has no code; the JSON writes the code, or null, and 401's own
    cr_assert_eq(ta_parse(0, &r, &e, "{\"prompt\": \"x\", \"n\": 2}"), -1);
    cr_assert_null(e.code, "%s", e.code);
    dj_buf b = {0};
    api_error_json(&b, 400, "prompt", "context_length_exceeded", "the prompt is long");
    api_error_json(&b, 400, NULL, NULL, "no");
    api_error_json(&b, 401, NULL, NULL, "key");
    cr_assert(!b.oom && b.p, "out of memory");
    cr_assert_str_eq(b.p, "{\"error\":{\"message\":\"the prompt is long\",\"type\":\"invalid_request_error\","
                          "\"param\":\"prompt\",\"code\":\"context_length_exceeded\"}}\n"
                          "{\"error\":{\"message\":\"no\",\"type\":\"invalid_request_error\",\"param\":null,"
                          "\"code\":null}}\n"
                          "{\"error\":{\"message\":\"key\",\"type\":\"authentication_error\",\"param\":null,"
                          "\"code\":\"invalid_api_key\"}}\n");
    buf_free(&b);
}

// A prompt of token ids (OpenAI's other form, which evaluation harnesses send) is taken as it is: no BOS added, the
// ids of the vocabulary only, one prompt; it answers as its text does where the ids are the text's.
Test(api, token_id_prompts) {
    api_req r;
    api_error e;
    cr_assert_eq(ta_parse(0, &r, &e, "{\"prompt\": [5, 0, 17.0]}"), 0, "%s", e.msg);
    cr_assert(r.n_ids == 3 && r.ids[0] == 5 && r.ids[1] == 0 && r.ids[2] == 17, "%zu ids", r.n_ids);
    api_req_free(&r);
    cr_assert_eq(ta_parse(0, &r, &e, "{\"prompt\": [[9, 8]]}"), 0, "%s", e.msg);
    cr_assert(r.n_ids == 2 && r.ids[0] == 9 && r.ids[1] == 8, "%zu ids", r.n_ids);
    api_req_free(&r);
    cr_assert_eq(ta_parse(0, &r, &e, "{\"prompt\": [7]}"), 0, "%s", e.msg);  // one id, not an array of one prompt
    cr_assert(r.n_ids == 1 && r.ids[0] == 7, "%zu ids", r.n_ids);
    api_req_free(&r);
    // the text's ids give the same request as the text
    const char *text = "Once upon a time";
    int32_t *ids;
    size_t n;
    dj_err de;
    cr_assert_eq(tok_encode(ta_tok, text, strlen(text), 1, &ids, &n, &de), 0, "%s", de.msg);
    char body[4096];
    size_t at = (size_t)snprintf(body, sizeof body, "{\"prompt\": [");
    for (size_t i = 0; i < n; i++) at += (size_t)snprintf(body + at, sizeof body - at, "%s%d", i ? ", " : "", ids[i]);
    snprintf(body + at, sizeof body - at, "]}");
    cr_assert_eq(ta_parse(0, &r, &e, "%s", body), 0, "%s", e.msg);
    cr_assert(r.n_ids == n && !memcmp(r.ids, ids, n * sizeof *ids), "the ids as sent");
    api_req_free(&r);
    free(ids);
    char big[64];
    snprintf(big, sizeof big, "[%lld]", (long long)ta_m.vocab);
    const char *bad[] = {"[]", "[[]]", "[-1]", "[1.5]", big, "[1, \"a\"]", "[1, [2]]", "[true]", "[[1], [2]]",
                         "[\"a\", \"b\"]", "[[\"a\"]]", "{}"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        char f[128];
        snprintf(f, sizeof f, "{\"prompt\": %s}", bad[i]);
        ta_refused_body(0, f, 400, "prompt");
    }
    // several prompts: refused as such (a request answers one)
    cr_assert_eq(ta_parse(0, &r, &e, "{\"prompt\": [[1], [2]]}"), -1);
    cr_assert(strstr(e.msg, "holds 2 prompts"), "%s", e.msg);
    cr_assert_eq(ta_parse(0, &r, &e, "{\"prompt\": [\"a\", \"b\", \"c\"]}"), -1);
    cr_assert(strstr(e.msg, "holds 3 prompts"), "%s", e.msg);
    // as long as the context allows, as a text prompt
    at = (size_t)snprintf(body, sizeof body, "{\"prompt\": [");
    for (int i = 0; i < 64; i++) at += (size_t)snprintf(body + at, sizeof body - at, "%s1", i ? ", " : "");
    snprintf(body + at, sizeof body - at, "]}");
    ta_refused_body(0, body, 400, "prompt");
}

// A prompt that writes the BOS token's text gets one BOS, as `djinn -p` gives it: the same ids as without it.
Test(api, one_bos_for_a_prompt_that_writes_it) {
    api_req a, b;
    api_error e;
    cr_assert_eq(ta_parse(0, &a, &e, "{\"prompt\": \"Once upon a time\"}"), 0, "%s", e.msg);
    cr_assert_eq(ta_parse(0, &b, &e, "{\"prompt\": \"<s>Once upon a time\"}"), 0, "%s", e.msg);
    int32_t bos = tok_bos(ta_tok);
    cr_assert_geq(bos, 0, "stories260K has a BOS token");
    cr_assert_eq(a.ids[0], bos);
    cr_assert_eq(b.n_ids, a.n_ids, "'<s>Once upon a time': %zu ids, without the <s> %zu", b.n_ids, a.n_ids);
    cr_assert_eq(memcmp(a.ids, b.ids, a.n_ids * sizeof *a.ids), 0);
    api_req_free(&b);
    // the BOS alone: one id, and the prompt array of one string reads the same
    cr_assert_eq(ta_parse(0, &b, &e, "{\"prompt\": [\"<s>\"]}"), 0, "%s", e.msg);
    cr_assert(b.n_ids == 1 && b.ids[0] == bos, "%zu ids", b.n_ids);
    api_req_free(&b);
    // only the leading pair collapses: a BOS written later stays where it is
    cr_assert_eq(ta_parse(0, &b, &e, "{\"prompt\": \"Once upon a time<s>\"}"), 0, "%s", e.msg);
    cr_assert_eq(b.n_ids, a.n_ids + 1);
    cr_assert_eq(b.ids[0], bos);
    cr_assert_eq(b.ids[b.n_ids - 1], bos);
    api_req_free(&a), api_req_free(&b);
}

// ---- stop: a string, or an array of up to BT_STOPS non-empty strings without NUL
Test(api, stop_strings) {
    api_req r;
    api_error e;
    const char *ok[] = {"[]", "null", "\"a\"", "[\"a\"]", "[\"a\", \"bb\", \"ccc\"]", "[\"a\", \"bb\", \"ccc\", \"dddd\"]"};
    const int count[] = {0, 0, 1, 1, 3, 4};
    for (size_t k = 0; k < sizeof ok / sizeof *ok; k++) {
        cr_assert_eq(ta_parse(0, &r, &e, "{\"prompt\": \"Once\", \"stop\": %s}", ok[k]), 0, "stop %s: %s", ok[k], e.msg);
        cr_assert_eq(r.n_stops, count[k], "stop %s", ok[k]);
        for (int i = 0; i < r.n_stops; i++) cr_assert_eq(strlen(r.stops[i]), k == 2 ? 1 : (size_t)i + 1);
        api_req_free(&r);
    }
    cr_assert_eq(BT_STOPS, 4);
    ta_refused(", \"stop\": [\"a\", \"bb\", \"ccc\", \"dddd\", \"e\"]", "stop");  // 5
    ta_refused(", \"stop\": [\"a\", \"b\", \"c\", \"d\", \"e\", \"f\", \"g\", \"h\"]", "stop");
    ta_refused(", \"stop\": \"\"", "stop");
    ta_refused(", \"stop\": [\"a\", \"\"]", "stop");
    ta_refused(", \"stop\": [\"a\", 1]", "stop");
    ta_refused(", \"stop\": [null]", "stop");
    ta_refused(", \"stop\": \"a\\u0000b\"", "stop");
    ta_refused(", \"stop\": 1", "stop");
    ta_refused(", \"stop\": {}", "stop");
    ta_refused(", \"stop\": true", "stop");
}

// ---- numbers: each at both ends of its range (taken), then just past them (refused, naming it)
Test(api, number_ranges) {
    static const struct {
        const char *field;
        const char *ok[4];
        const char *bad[5];
    } t[] = {
        {"max_tokens", {"1", "2147483647", "16"}, {"0", "-1", "2147483648", "1.5", "\"3\""}},
        {"temperature", {"0", "1000000", "0.5", "1e6"}, {"-1e-9", "1000000.0001", "-1", "\"1\""}},
        {"top_p", {"0", "1", "0.999"}, {"-1e-9", "1.000001", "2", "true"}},
        {"min_p", {"0", "1", "0.05"}, {"-1e-9", "1.000001", "-0.5"}},
        {"top_k", {"0", "2147483647", "40"}, {"-1", "2147483648", "1.5"}},
        {"presence_penalty", {"-2", "2", "0"}, {"-2.000001", "2.000001", "1e300"}},
        {"frequency_penalty", {"-2", "2", "0"}, {"-2.000001", "2.000001", "-1e300"}},
        {"repeat_penalty", {"0.001", "1000", "1"}, {"0.000999", "1000.001", "0", "-1"}},
        {"repeat_last_n", {"0", "16777216", "64"}, {"-1", "16777217", "2.5"}},
        {"seed", {"-9223372036854775808", "9223372036854775807", "0"}, {"9223372036854775808", "1.5", "-9.3e18"}},
        {"n", {"1"}, {"0", "2", "1.5"}},
        {"best_of", {"1"}, {"0", "2"}},
        {"break_after_layer", {"0", "3"}, {"-1", "4", "0.5"}},
    };
    char f[256];
    for (size_t k = 0; k < sizeof t / sizeof *t; k++) {
        for (int i = 0; i < 4 && t[k].ok[i]; i++) {
            snprintf(f, sizeof f, ", \"%s\": %s", t[k].field, t[k].ok[i]);
            TA_OK(f);
        }
        for (int i = 0; i < 5 && t[k].bad[i]; i++) {
            snprintf(f, sizeof f, ", \"%s\": %s", t[k].field, t[k].bad[i]);
            ta_refused(f, t[k].field);
        }
        snprintf(f, sizeof f, ", \"%s\": null", t[k].field);  // null: the default
        TA_OK(f);
    }
    // the values taken reach the request
    api_req r;
    api_error e;
    cr_assert_eq(ta_parse(0, &r, &e, "{\"prompt\": \"Once\", \"max_tokens\": 2147483647, \"break_after_layer\": 3}"), 0,
                 "%s", e.msg);
    cr_assert(r.max_tokens == 2147483647 && r.brk && r.layer == 3);
    api_req_free(&r);
    cr_assert_eq(ta_parse(0, &r, &e, "{\"prompt\": \"Once\"}"), 0, "%s", e.msg);
    cr_assert(r.max_tokens == 16 && !r.brk, "a completion's default: 16 tokens");
    api_req_free(&r);
    // a chat's max_tokens: until the end by default; max_completion_tokens, OpenAI's newer name, in its place
    const char *msgs = "\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]";
    cr_assert_eq(ta_parse(1, &r, &e, "{%s}", msgs), 0, "%s", e.msg);
    cr_assert_eq(r.max_tokens, -1);
    api_req_free(&r);
    cr_assert_eq(ta_parse(1, &r, &e, "{%s, \"max_completion_tokens\": 1, \"max_tokens\": 0}", msgs), 0, "%s", e.msg);
    cr_assert_eq(r.max_tokens, 1);
    api_req_free(&r);
    cr_assert_eq(ta_parse(1, &r, &e, "{%s, \"max_completion_tokens\": 0}", msgs), -1);
    cr_assert(e.param && !strcmp(e.param, "max_completion_tokens"), "%s", e.msg);
    // break_after_layer follows the model's layers
    ta_m.n_layers = 1;
    TA_OK(", \"break_after_layer\": 0");
    ta_refused(", \"break_after_layer\": 1", "break_after_layer");
}

// ---- the session's name: 1 to API_SESSION_MAX bytes, no NUL; "user" when there is no "session"
Test(api, session_name) {
    char *name = malloc(API_SESSION_MAX + 2);
    memset(name, 's', API_SESSION_MAX + 1);
    const char *keys[] = {"session", "user"};
    for (int k = 0; k < 2; k++) {
        api_req r;
        api_error e;
        for (int len = API_SESSION_MAX - 1; len <= API_SESSION_MAX + 1; len++) {
            name[len] = 0;
            int rc = ta_parse(0, &r, &e, "{\"prompt\": \"Once\", \"%s\": \"%s\"}", keys[k], name);
            if (len <= API_SESSION_MAX) {
                cr_assert_eq(rc, 0, "a %s of %d bytes: %s", keys[k], len, e.msg);
                cr_assert_str_eq(r.session, name);
                api_req_free(&r);
            } else {
                cr_assert(rc == -1 && e.status == 400 && e.param && !strcmp(e.param, keys[k]), "a %s of %d bytes: %s",
                          keys[k], len, e.msg);
            }
            name[len] = 's';
        }
        cr_assert_eq(ta_parse(0, &r, &e, "{\"prompt\": \"Once\", \"%s\": \"a\"}", keys[k]), 0, "%s", e.msg);
        cr_assert_str_eq(r.session, "a");
        api_req_free(&r);
        char f[64];
        snprintf(f, sizeof f, ", \"%s\": \"\"", keys[k]);
        ta_refused(f, keys[k]);
        snprintf(f, sizeof f, ", \"%s\": \"a\\u0000b\"", keys[k]);
        ta_refused(f, keys[k]);
        snprintf(f, sizeof f, ", \"%s\": 5", keys[k]);
        ta_refused(f, keys[k]);
    }
    free(name);
    api_req r;
    api_error e;
    cr_assert_eq(ta_parse(0, &r, &e, "{\"prompt\": \"Once\", \"session\": \"a\", \"user\": \"b\"}"), 0, "%s", e.msg);
    cr_assert_str_eq(r.session, "a", "session before user");
    cr_assert_eq(r.by_user, 0, "the session named by 'session' is no hint");
    api_req_free(&r);
    cr_assert_eq(ta_parse(0, &r, &e, "{\"prompt\": \"Once\", \"user\": \"b\"}"), 0, "%s", e.msg);
    cr_assert(!strcmp(r.session, "b") && r.by_user, "'user' names a session as a hint");
    api_req_free(&r);
    // park needs a session, by either name
    ta_refused(", \"park\": true", "park");
    TA_OK(", \"park\": false");
    TA_OK(", \"park\": true, \"user\": \"u\"");
    TA_OK(", \"park\": true, \"session\": \"s\"");
    ta_refused(", \"park\": 1", "park");
    // ignore_eos: a boolean, read as sent
    cr_assert_eq(ta_parse(0, &r, &e, "{\"prompt\": \"Once\", \"ignore_eos\": true}"), 0, "%s", e.msg);
    cr_assert_eq(r.ignore_eos, 1);
    api_req_free(&r);
    cr_assert_eq(ta_parse(0, &r, &e, "{\"prompt\": \"Once\", \"ignore_eos\": false}"), 0, "%s", e.msg);
    cr_assert_eq(r.ignore_eos, 0);
    api_req_free(&r);
    ta_refused(", \"ignore_eos\": 1", "ignore_eos");
}

// ---- breakpoints and resumes: each refusal alone
Test(api, breakpoints_and_resumes) {
    const char *rows = "\"AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=\"";  // 32 zero bytes: one row of dim 8
    char f[512];
    snprintf(f, sizeof f, ", \"resume\": {\"id\": \"brk-1\", \"residual\": %s}", rows);
    api_req r;
    api_error e;
    cr_assert_eq(ta_parse(0, &r, &e, "{\"prompt\": \"Once\"%s}", f), 0, "%s", e.msg);
    cr_assert(r.resume == 1 && r.n_rows == 8, "resume %llu, %lld floats", (unsigned long long)r.resume,
              (long long)r.n_rows);
    api_req_free(&r);
    cr_assert_eq(ta_parse(0, &r, &e, "{\"resume\": {\"id\": \"brk-1\", \"residual\": %s}}", rows), 0, "%s", e.msg);
    cr_assert(r.ids == NULL && r.n_ids == 0, "a resume without a prompt");
    api_req_free(&r);
    // the id: brk- and 1 to 18 digits, not starting with 0
    static const char *const ids_ok[] = {"brk-1", "brk-9", "brk-100000000000000000", "brk-999999999999999999"};
    for (size_t k = 0; k < sizeof ids_ok / sizeof *ids_ok; k++) {
        snprintf(f, sizeof f, ", \"resume\": {\"id\": \"%s\", \"residual\": %s}", ids_ok[k], rows);
        TA_OK(f);
    }
    static const char *const ids_bad[] = {"brk-0", "brk-01", "brk-", "brk", "brk-1x", "brk--1", "BRK-1", "brk-1 ",
                                          "brk-1000000000000000000", "xbrk-1"};
    for (size_t k = 0; k < sizeof ids_bad / sizeof *ids_bad; k++) {
        char *body;
        cr_assert(asprintf(&body, "{\"prompt\": \"Once\", \"resume\": {\"id\": \"%s\", \"residual\": %s}}", ids_bad[k],
                           rows) >= 0);
        ta_refused_body(0, body, 404, "resume");
        free(body);
    }
    // the residual: base64 of whole rows of finite float32
    static const char *const res_bad[] = {
        "\"\"",                                                  // nothing
        "\"AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA\"",       // 43 characters
        "\"AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA\"",      // 33 bytes: not whole rows
        "\"AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA==\"",      // 31 bytes
        "\"AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA.=\"",      // not the alphabet
        "\"AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=A=\"",      // padding inside
        "\"AACAfwAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=\"",      // +infinity first (00 00 80 7f)
        "\"AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAwH8=\"",      // NaN last (00 00 c0 7f)
        "1",
    };
    for (size_t k = 0; k < sizeof res_bad / sizeof *res_bad; k++) {
        snprintf(f, sizeof f, ", \"resume\": {\"id\": \"brk-1\", \"residual\": %s}", res_bad[k]);
        ta_refused(f, "resume");
    }
    ta_refused(", \"resume\": {\"id\": \"brk-1\"}", "resume");
    ta_refused(", \"resume\": {\"residual\": \"\"}", "resume");
    ta_refused(", \"resume\": \"brk-1\"", "resume");
    // two rows are whole rows too
    snprintf(f, sizeof f, ", \"resume\": {\"id\": \"brk-2\", \"residual\": \"%s\"}",
             "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA==");
    TA_OK(f);
    // a breakpoint: not with a resume, not streamed, not where breakpoints are off
    snprintf(f, sizeof f, ", \"break_after_layer\": 0, \"resume\": {\"id\": \"brk-1\", \"residual\": %s}", rows);
    ta_refused(f, "resume");
    ta_refused(", \"break_after_layer\": 0, \"stream\": true", "stream");
    TA_OK(", \"break_after_layer\": 0, \"stream\": false");
    ta_m.breakpoints = 0;
    ta_refused(", \"break_after_layer\": 0", "break_after_layer");
    snprintf(f, sizeof f, ", \"resume\": {\"id\": \"brk-1\", \"residual\": %s}", rows);
    ta_refused(f, "resume");
    TA_OK("");
}

// ---- features the server lacks, refused by name; their "off" values taken
Test(api, unsupported_features) {
    static const char *const ok[] = {", \"echo\": false", ", \"echo\": 0", ", \"logprobs\": null", ", \"logprobs\": false", ", \"top_logprobs\": 0",
                                     ", \"suffix\": null", ", \"tools\": []", ", \"logit_bias\": {}",
                                     ", \"response_format\": {\"type\": \"text\"}", ", \"model\": \"anything\"",
                                     ", \"stream\": true, \"stream_options\": {\"include_usage\": true}"};
    for (size_t k = 0; k < sizeof ok / sizeof *ok; k++) TA_OK(ok[k]);
    static const struct {
        const char *fields, *param;
    } bad[] = {
        {", \"echo\": true", "echo"},
        {", \"logprobs\": 1", "logprobs"},
        {", \"logprobs\": true", "logprobs"},
        {", \"suffix\": \"x\"", "suffix"},
        {", \"tools\": [{}]", "tools"},
        {", \"functions\": [1]", "functions"},
        {", \"function_call\": \"auto\"", "function_call"},
        {", \"tool_choice\": \"none\"", "tool_choice"},
        {", \"top_logprobs\": 2", "top_logprobs"},
        {", \"logit_bias\": {\"1\": 5}", "logit_bias"},
        {", \"logit_bias\": []", "logit_bias"},
        {", \"response_format\": {\"type\": \"json_object\"}", "response_format"},
        {", \"response_format\": {}", "response_format"},
        {", \"model\": 1", "model"},
        {", \"stream\": 1", "stream"},
        {", \"stream_options\": true", "stream_options"},
        {", \"stream_options\": {\"include_usage\": 1}", "include_usage"},
    };
    for (size_t k = 0; k < sizeof bad / sizeof *bad; k++) ta_refused(bad[k].fields, bad[k].param);
    // the body itself
    ta_refused_body(0, "[]", 400, NULL);
    ta_refused_body(0, "{\"prompt\": \"a\"", 400, NULL);
    ta_refused_body(0, "{}", 400, "prompt");
    ta_refused_body(0, "{\"prompt\": [\"a\", \"b\"]}", 400, "prompt");
    ta_refused_body(0, "{\"prompt\": \"a\\u0000\"}", 400, "prompt");
    ta_refused_body(1, "{\"messages\": []}", 400, "messages");
    ta_m.chat = CHAT_NONE;
    ta_refused_body(1, "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]}", 400, "messages");
}

// ---- the answer's limit under each name a client sends: OpenAI's max_completion_tokens and max_tokens, llama.cpp's
// n_predict; the first sent (not null) is the limit on either endpoint, never silently the default
Test(api, answer_limit_names) {
    static const struct {
        int chat;
        const char *fields;
        int64_t want;
    } t[] = {
        {1, "\"max_tokens\": 5, \"max_completion_tokens\": null", 5},  // a null newer name is not sent
        {1, "\"max_completion_tokens\": 3, \"max_tokens\": 9", 3},
        {0, "\"max_completion_tokens\": 3", 3},                          // on /v1/completions too
        {0, "\"max_completion_tokens\": null, \"max_tokens\": 4", 4},
        {0, "\"n_predict\": 7", 7},
        {0, "\"n_predict\": -1", -1},                                    // llama.cpp's "no limit"
        {1, "\"n_predict\": 2", 2},
        {0, "\"max_tokens\": 6, \"n_predict\": 9", 6},
        {0, "\"n_predict\": null", 16},
    };
    const char *msgs = "\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]";
    for (size_t k = 0; k < sizeof t / sizeof *t; k++) {
        api_req r;
        api_error e;
        int rc = t[k].chat ? ta_parse(1, &r, &e, "{%s, %s}", msgs, t[k].fields)
                           : ta_parse(0, &r, &e, "{\"prompt\": \"Once\", %s}", t[k].fields);
        cr_assert_eq(rc, 0, "%s: %s", t[k].fields, e.msg);
        cr_assert_eq(r.max_tokens, t[k].want, "%s: limit %lld, want %lld", t[k].fields, (long long)r.max_tokens,
                     (long long)t[k].want);
        api_req_free(&r);
    }
    ta_refused(", \"n_predict\": 0", "n_predict");
    ta_refused(", \"n_predict\": -2", "n_predict");
    ta_refused(", \"n_predict\": 1.5", "n_predict");
    ta_refused(", \"max_completion_tokens\": 0", "max_completion_tokens");
    ta_refused(", \"max_completion_tokens\": null, \"max_tokens\": 0", "max_tokens");
}

// ---- OpenAI's "developer" message is the system message: the same prompt ids
Test(api, developer_is_system) {
    api_req a, b;
    api_error e;
    const char *fmt = "{\"messages\": [{\"role\": \"%s\", \"content\": \"Be brief.\"}, {\"role\": \"user\", \"content\": "
                      "\"hi\"}]}";
    cr_assert_eq(ta_parse(1, &a, &e, fmt, "system"), 0, "%s", e.msg);
    cr_assert_eq(ta_parse(1, &b, &e, fmt, "developer"), 0, "%s", e.msg);
    cr_assert(a.n_ids == b.n_ids && !memcmp(a.ids, b.ids, a.n_ids * sizeof *a.ids), "%zu ids, system's %zu", b.n_ids,
              a.n_ids);
    api_req_free(&a), api_req_free(&b);
    // Llama 2's template: only first, as the system message (Llama 3's takes it anywhere: tokenizer/chat_templates)
    ta_refused_body(1, "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}, {\"role\": \"developer\", "
                       "\"content\": \"x\"}]}", 400, "messages");
}

// ---- a message's content: a string, or text parts joined; any other part refused, saying its type
Test(api, content_parts) {
    api_req a, b;
    api_error e;
    cr_assert_eq(ta_parse(1, &a, &e, "{\"messages\": [{\"role\": \"user\", \"content\": \"Once upon a time\"}]}"), 0,
                 "%s", e.msg);
    cr_assert_eq(ta_parse(1, &b, &e, "{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": "
                                     "\"Once upon\"}, {\"type\": \"text\", \"text\": \" a time\"}]}]}"), 0, "%s", e.msg);
    cr_assert(a.n_ids == b.n_ids && !memcmp(a.ids, b.ids, a.n_ids * sizeof *a.ids), "parts: %zu ids, the string %zu",
              b.n_ids, a.n_ids);
    api_req_free(&a), api_req_free(&b);
    cr_assert_eq(ta_parse(1, &a, &e, "{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": "
                                     "\"hi\"}, {\"type\": \"image_url\", \"image_url\": {\"url\": \"data:x\"}}]}]}"), -1);
    cr_assert(e.status == 400 && e.param && !strcmp(e.param, "messages") && strstr(e.msg, "content[1]") &&
              strstr(e.msg, "'image_url'"), "%d %s", e.status, e.msg);
    cr_assert_eq(ta_parse(1, &a, &e, "{\"messages\": [{\"role\": \"user\", \"content\": [{\"text\": \"hi\"}]}]}"), -1);
    cr_assert(e.status == 400 && strstr(e.msg, "without a type"), "%s", e.msg);
}

// ---- n and best_of: one choice a request; more are refused by name, never answered with one
Test(api, one_choice) {
    static const char *const bad[] = {"2", "3", "0", "1.5", "-1"};
    static const char *const names[] = {"n", "best_of"};
    for (size_t i = 0; i < 2; i++)
        for (size_t k = 0; k < sizeof bad / sizeof *bad; k++) {
            api_req r;
            api_error e;
            cr_assert_eq(ta_parse(0, &r, &e, "{\"prompt\": \"Once\", \"%s\": %s}", names[i], bad[k]), -1);
            cr_assert(e.status == 400 && e.param && !strcmp(e.param, names[i]) && strstr(e.msg, "one choice"),
                      "%s %s: %s", names[i], bad[k], e.msg);
        }
    TA_OK(", \"n\": 1, \"best_of\": 1");
}

// ---- integers written as whole floats (Python's json.dumps(42.0) is "42.0"): the same integer; a fraction refused
Test(api, whole_numbers_written_as_floats) {
    api_req a, b;
    api_error e;
    cr_assert_eq(ta_parse(0, &a, &e, "{\"prompt\": \"Once\", \"max_tokens\": 5.0, \"seed\": 42.0, \"top_k\": 4e1, "
                                     "\"n\": 1.0}"), 0, "%s", e.msg);
    cr_assert_eq(a.max_tokens, 5);
    cr_assert_eq(ta_parse(0, &b, &e, "{\"prompt\": \"Once\", \"seed\": 42, \"top_k\": 40}"), 0, "%s", e.msg);
    cr_assert_eq(sampler_rng_state(a.smp), sampler_rng_state(b.smp), "seed 42.0 is not seed 42");
    api_req_free(&a), api_req_free(&b);
    ta_refused(", \"max_tokens\": 5.5", "max_tokens");
    ta_refused(", \"seed\": 1e300", "seed");
    ta_refused(", \"n\": 2.0", "n");
}
