// test_json.c: the strict JSON parser: every value type, escapes and surrogates, exact int64 numbers,
// getters, and malformed inputs (each must fail with a "json: line L, column C" message). Every input is
// parsed from an exact-size heap copy so that ASan catches any read past the end.
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../json.h"
#include "common.h"

// ---- helpers
static json_doc *tj_parse_n(const char *s, size_t n, dj_err *e) {
    char *buf = malloc(n ? n : 1);
    cr_assert_not_null(buf);
    memcpy(buf, s, n);
    json_doc *d = json_parse(buf, n, e);
    free(buf);  // the doc must own all its strings
    return d;
}

static json_doc *tj_ok(const char *s) {
    dj_err e = {{0}};
    json_doc *d = tj_parse_n(s, strlen(s), &e);
    cr_assert_not_null(d, "should parse: %s\nerror: %s", s, e.msg);
    return d;
}

static void tj_bad_n(const char *s, size_t n, const char *want) {
    dj_err e = {{0}};
    json_doc *d = tj_parse_n(s, n, &e);
    if (d) json_free(d);
    cr_assert_null(d, "should fail: %.*s", (int)n, s);
    cr_assert(strncmp(e.msg, "json: line ", 11) == 0, "message '%s' for input '%.*s'", e.msg, (int)n, s);
    cr_assert(strstr(e.msg, ", column ") != NULL, "message '%s'", e.msg);
    if (want) cr_assert(strstr(e.msg, want) != NULL, "message '%s' lacks '%s' for input '%.*s'", e.msg, want, (int)n, s);
}

static void tj_bad(const char *s, const char *want) { tj_bad_n(s, strlen(s), want); }

// Parses $DJINN_DATA/rel; skips the test (visibly) when the data is absent.
static json_doc *tj_parse_data(const char *rel) {
    char path[4096];
    tc_data_path(path, sizeof path, rel);
    size_t len;
    char *buf = tc_must_read(path, &len);
    dj_err e;
    json_doc *d = json_parse(buf, len, &e);
    free(buf);
    cr_assert_not_null(d, "%s: %s", path, e.msg);
    return d;
}

// ---- valid documents
Test(json, scalars) {
    json_doc *d = tj_ok("null");
    cr_assert_eq(json_root(d)->type, JSON_NULL);
    json_free(d);

    int b = -1;
    d = tj_ok(" true ");
    cr_assert_eq(json_bool(json_root(d), &b), 0);
    cr_assert_eq(b, 1);
    json_free(d);
    d = tj_ok("\t\r\nfalse\n");
    cr_assert_eq(json_bool(json_root(d), &b), 0);
    cr_assert_eq(b, 0);
    json_free(d);

    d = tj_ok("\"hello\"");
    cr_assert_str_eq(json_str(json_root(d)), "hello");
    cr_assert_eq(json_root(d)->u.str.len, 5);
    json_free(d);

    d = tj_ok("\"\"");
    cr_assert_str_eq(json_str(json_root(d)), "");
    cr_assert_eq(json_root(d)->u.str.len, 0);
    json_free(d);

    int64_t i;
    d = tj_ok("42");
    cr_assert_eq(json_int(json_root(d), &i), 0);
    cr_assert_eq(i, 42);
    json_free(d);
}

Test(json, nested_and_getters) {
    json_doc *d = tj_ok("{\"name\": \"djinn\", \"layers\": [1, 2, {\"x\": [[], {}]}], \"ok\": true,"
                        " \"eps\": 1e-05, \"none\": null, \"dup\": 1, \"dup\": 2, \"emp\": {}}");
    const json_value *r = json_root(d);
    cr_assert_eq(r->type, JSON_OBJECT);
    cr_assert_eq(r->u.obj.n, 8);
    cr_assert_str_eq(r->u.obj.members[0].key, "name");
    cr_assert_str_eq(r->u.obj.members[7].key, "emp");
    cr_assert_str_eq(json_str(json_get(r, "name")), "djinn");

    const json_value *layers = json_get(r, "layers");
    cr_assert_eq(layers->type, JSON_ARRAY);
    cr_assert_eq(layers->u.arr.n, 3);
    int64_t i;
    cr_assert_eq(json_int(&layers->u.arr.items[1], &i), 0);
    cr_assert_eq(i, 2);
    const json_value *x = json_get(&layers->u.arr.items[2], "x");
    cr_assert_eq(x->type, JSON_ARRAY);
    cr_assert_eq(x->u.arr.n, 2);
    cr_assert_eq(x->u.arr.items[0].type, JSON_ARRAY);
    cr_assert_eq(x->u.arr.items[0].u.arr.n, 0);
    cr_assert_eq(x->u.arr.items[1].type, JSON_OBJECT);
    cr_assert_eq(x->u.arr.items[1].u.obj.n, 0);

    int b;
    cr_assert_eq(json_bool(json_get(r, "ok"), &b), 0);
    cr_assert_eq(b, 1);
    double eps;
    cr_assert_eq(json_num(json_get(r, "eps"), &eps), 0);
    cr_assert_eq(eps, 1e-05);
    cr_assert_eq(json_int(json_get(r, "eps"), &i), -1, "a real is not an int");
    cr_assert_eq(json_get(r, "none")->type, JSON_NULL);
    cr_assert_eq(json_int(json_get(r, "dup"), &i), 0);
    cr_assert_eq(i, 2, "the last duplicate wins");
    cr_assert_eq(json_get(r, "emp")->type, JSON_OBJECT);

    // wrong types and absent keys
    cr_assert_null(json_get(r, "missing"));
    cr_assert_null(json_get(layers, "x"), "json_get on an array");
    cr_assert_null(json_get(NULL, "x"));
    cr_assert_null(json_str(layers));
    cr_assert_null(json_str(NULL));
    cr_assert_eq(json_int(NULL, &i), -1);
    cr_assert_eq(json_num(json_get(r, "name"), &eps), -1);
    cr_assert_eq(json_bool(json_get(r, "none"), &b), -1);
    cr_assert_eq(json_int(json_get(r, "name"), &i), -1);
    double n1;
    cr_assert_eq(json_num(&layers->u.arr.items[0], &n1), 0, "json_num accepts integers");
    cr_assert_eq(n1, 1.0);
    json_free(d);
}

Test(json, type_names) {
    cr_assert_str_eq(json_type_name(JSON_NULL), "null");
    cr_assert_str_eq(json_type_name(JSON_BOOL), "bool");
    cr_assert_str_eq(json_type_name(JSON_NUMBER), "number");
    cr_assert_str_eq(json_type_name(JSON_STRING), "string");
    cr_assert_str_eq(json_type_name(JSON_ARRAY), "array");
    cr_assert_str_eq(json_type_name(JSON_OBJECT), "object");
}

Test(json, escapes) {
    json_doc *d = tj_ok("\"q\\\" b\\\\ s\\/ \\b\\f\\n\\r\\t \\u0041\\u00e9\\u20AC\\ud83d\\ude00\"");
    const char *want = "q\" b\\ s/ \b\f\n\r\t A\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80";
    cr_assert_str_eq(json_str(json_root(d)), want);
    cr_assert_eq(json_root(d)->u.str.len, strlen(want));
    json_free(d);

    // \u0000 is a NUL byte inside the string; len counts it
    d = tj_ok("\"a\\u0000b\"");
    cr_assert_eq(json_root(d)->u.str.len, 3);
    cr_assert_eq(memcmp(json_str(json_root(d)), "a\0b", 4), 0);
    json_free(d);

    // the highest code point via surrogates, and escaped keys
    d = tj_ok("{\"k\\u00e9y\": \"\\udbff\\udfff\"}");
    cr_assert_str_eq(json_str(json_get(json_root(d), "k\xc3\xa9y")), "\xf4\x8f\xbf\xbf");
    json_free(d);
}

Test(json, raw_utf8) {
    // 2-, 3- and 4-byte sequences, the extremes of each range, and DEL (allowed unescaped)
    const char *s = "\"\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80 \xc2\x80 \xdf\xbf \xe0\xa0\x80 \xef\xbf\xbf "
                    "\xed\x9f\xbf \xee\x80\x80 \xf0\x90\x80\x80 \xf4\x8f\xbf\xbf \x7f\"";
    json_doc *d = tj_ok(s);
    cr_assert_eq(json_root(d)->u.str.len, strlen(s) - 2);
    cr_assert_eq(memcmp(json_str(json_root(d)), s + 1, strlen(s) - 2), 0);
    json_free(d);
}

Test(json, int64_limits) {
    int64_t i;
    json_doc *d = tj_ok("[9223372036854775807, -9223372036854775808, 0, -0, 9223372036854775808,"
                        " -9223372036854775809, 18446744073709551616, 123456789012345678901234567890]");
    const json_value *a = json_root(d)->u.arr.items;
    cr_assert_eq(json_int(&a[0], &i), 0);
    cr_assert_eq(i, INT64_MAX);
    cr_assert_eq(json_int(&a[1], &i), 0);
    cr_assert_eq(i, INT64_MIN);
    cr_assert_eq(json_int(&a[2], &i), 0);
    cr_assert_eq(i, 0);
    cr_assert_eq(json_int(&a[3], &i), 0);
    cr_assert_eq(i, 0);
    cr_assert(signbit(a[3].u.number.num), "-0 keeps its sign as a double");
    cr_assert(!signbit(a[2].u.number.num));
    for (int k = 4; k < 8; k++) {
        cr_assert_eq(a[k].type, JSON_NUMBER);
        cr_assert_eq(json_int(&a[k], &i), -1, "item %d is beyond int64", k);
        cr_assert_eq(a[k].u.number.is_int, 0);
    }
    cr_assert_eq(a[4].u.number.num, 9223372036854775808.0);
    cr_assert_eq(a[5].u.number.num, -9223372036854775809.0);
    cr_assert_eq(a[7].u.number.num, 1.2345678901234568e29);
    json_free(d);
}

Test(json, reals) {
    const char *src = "[1.5, -0.25, 1e3, 1E+3, 2e-3, -0.0, 0.1, 6.02214076e23, 1e-400, 1.7976931348623157e308, 0e0]";
    const double want[] = {1.5, -0.25, 1000, 1000, 0.002, -0.0, 0.1, 6.02214076e23, 0, 1.7976931348623157e308, 0};
    json_doc *d = tj_ok(src);
    const json_value *r = json_root(d);
    cr_assert_eq(r->u.arr.n, sizeof want / sizeof want[0]);
    for (size_t k = 0; k < r->u.arr.n; k++) {
        double x;
        int64_t i;
        cr_assert_eq(json_num(&r->u.arr.items[k], &x), 0);
        cr_assert_eq(x, want[k], "item %zu: %.17g != %.17g", k, x, want[k]);
        cr_assert_eq(json_int(&r->u.arr.items[k], &i), -1, "item %zu has '.' or 'e': not an int", k);
    }
    cr_assert(signbit(r->u.arr.items[5].u.number.num), "-0.0 keeps its sign");
    json_free(d);
}

Test(json, long_number) {
    // longer than any fixed conversion buffer
    char buf[700];
    buf[0] = '0';
    buf[1] = '.';
    for (int k = 2; k < 690; k++) buf[k] = '3';
    buf[690] = 0;
    json_doc *d = tj_ok(buf);
    double x;
    cr_assert_eq(json_num(json_root(d), &x), 0);
    cr_assert_eq(x, 1.0 / 3.0);
    json_free(d);
}

Test(json, depth_limit) {
    // 512 levels are allowed, 513 are not
    char *s = malloc(2 * 513 + 1);
    cr_assert_not_null(s);
    memset(s, '[', 512);
    memset(s + 512, ']', 512);
    s[1024] = 0;
    json_doc *d = tj_ok(s);
    const json_value *v = json_root(d);
    int levels = 0;
    while (v->type == JSON_ARRAY && v->u.arr.n == 1) v = &v->u.arr.items[0], levels++;
    cr_assert_eq(levels, 511);
    cr_assert_eq(v->type, JSON_ARRAY);
    cr_assert_eq(v->u.arr.n, 0);
    json_free(d);

    memset(s, '[', 513);
    memset(s + 513, ']', 513);
    tj_bad_n(s, 1026, "nesting");
    free(s);
}

Test(json, deep_nesting_does_not_overflow) {
    size_t n = 100000;
    char *s = malloc(2 * n);
    cr_assert_not_null(s);
    memset(s, '[', n);
    tj_bad_n(s, n, "nesting");
    memset(s + n, ']', n);
    tj_bad_n(s, 2 * n, "nesting");
    for (size_t k = 0; k < n; k++) s[k] = (k % 2) ? '[' : '{';  // objects need keys: fails early
    tj_bad_n(s, n, "line 1");
    for (size_t k = 0; k + 5 <= n; k += 5) memcpy(s + k, "{\"a\":", 5);
    tj_bad_n(s, n, "nesting");
    free(s);
}

Test(json, whitespace_everywhere) {
    json_doc *d = tj_ok(" \n\t\r{ \"a\" \n: [ 1 ,\t2 ] , \"b\" : { } }\r\n ");
    cr_assert_eq(json_get(json_root(d), "a")->u.arr.n, 2);
    json_free(d);
}

Test(json, error_position) {
    dj_err e;
    const char *s = "{\n  \"a\": tru\n}";
    cr_assert_null(tj_parse_n(s, strlen(s), &e));
    cr_assert(strstr(e.msg, "line 2, column 11") != NULL, "got '%s'", e.msg);

    s = "[1,\n2,\n\"\xc3\xa9\xc3\xa9\", x]";  // columns count characters, not bytes
    cr_assert_null(tj_parse_n(s, strlen(s), &e));
    cr_assert(strstr(e.msg, "line 3, column 7") != NULL, "got '%s'", e.msg);

    s = "[1, 2";
    cr_assert_null(tj_parse_n(s, strlen(s), &e));
    cr_assert(strstr(e.msg, "line 1, column 6") != NULL, "got '%s'", e.msg);
    cr_assert(strstr(e.msg, "end of input") != NULL, "got '%s'", e.msg);
}

// ---- malformed documents
Test(json, empty_and_structure) {
    tj_bad("", "end of input");
    tj_bad("   \n ", "end of input");
    tj_bad("[1,]", NULL);
    tj_bad("[,1]", NULL);
    tj_bad("[1 2]", "','");
    tj_bad("{\"a\":1,}", "key");
    tj_bad("{a:1}", "key");
    tj_bad("{'a':1}", "key");
    tj_bad("{\"a\" 1}", "':'");
    tj_bad("{\"a\"}", "':'");
    tj_bad("{\"a\":}", NULL);
    tj_bad("{\"a\":1 \"b\":2}", NULL);
    tj_bad("{1:2}", "key");
    tj_bad("[}", NULL);
    tj_bad("{]", NULL);
    tj_bad("[1}", NULL);
    tj_bad("]", NULL);
    tj_bad("}", NULL);
    tj_bad(":", NULL);
    tj_bad("/* c */ 1", NULL);
    tj_bad("\xef\xbb\xbf{}", NULL);  // a byte order mark is not JSON
    tj_bad("\v1", NULL);
    tj_bad("\f1", NULL);
}

Test(json, trailing_garbage) {
    tj_bad("1 2", "end of input after");
    tj_bad("{} x", "end of input after");
    tj_bad("[1]]", "end of input after");
    tj_bad("nullx", "end of input after");
    tj_bad("\"a\"\"b\"", "end of input after");
    tj_bad_n("1\0", 2, "end of input after");
    tj_bad_n("{}\0", 3, NULL);
}

Test(json, literals) {
    tj_bad("nul", "end of input");
    tj_bad("tru", "end of input");
    tj_bad("fals", "end of input");
    tj_bad("nulL", "literal");
    tj_bad("True", NULL);
    tj_bad("FALSE", NULL);
    tj_bad("truee", NULL);
    tj_bad("NaN", NULL);
    tj_bad("Infinity", NULL);
    tj_bad("undefined", NULL);
}

Test(json, bad_numbers) {
    tj_bad("01", "leading zero");
    tj_bad("-01", "leading zero");
    tj_bad("00", "leading zero");
    tj_bad("[012]", "leading zero");
    tj_bad("-00.5", "leading zero");
    tj_bad("-", "digit");
    tj_bad("--1", "digit");
    tj_bad("+1", NULL);
    tj_bad(".5", NULL);
    tj_bad("1.", "digit");
    tj_bad("1.e5", "digit");
    tj_bad("1e", "digit");
    tj_bad("1e+", "digit");
    tj_bad("1E-x", "digit");
    tj_bad("0x10", NULL);
    tj_bad("1.5.2", NULL);
    tj_bad("- 1", "digit");
    tj_bad("1e400", "range");
    tj_bad("-1e400", "range");
    tj_bad("[1,-]", "digit");
}

Test(json, bad_strings) {
    tj_bad("\"abc", "unterminated");
    tj_bad("\"", "unterminated");
    tj_bad("\"abc\\", NULL);
    tj_bad("\"abc\\\"", "unterminated");
    tj_bad("[\"a]", "unterminated");
    // control characters must be escaped
    tj_bad("\"a\nb\"", "control");
    tj_bad("\"a\tb\"", "control");
    tj_bad("\"\x01\"", "control");
    tj_bad("\"\x1f\"", "control");
    tj_bad_n("\"a\0b\"", 5, "control");
    tj_bad("{\"a\nb\":1}", "control");
}

Test(json, bad_escapes) {
    tj_bad("\"\\x\"", "escape");
    tj_bad("\"\\a\"", "escape");
    tj_bad("\"\\'\"", "escape");
    tj_bad("\"\\U0041\"", "escape");
    tj_bad("\"\\0\"", "escape");
    tj_bad("\"\\u\"", "\\u");
    tj_bad("\"\\u12\"", "\\u");
    tj_bad("\"\\u12G4\"", "\\u");
    tj_bad("\"\\u 123\"", "\\u");
    tj_bad("\"\\u-123\"", "\\u");
    tj_bad("\"\\u123", NULL);
    tj_bad("\"\\", NULL);
    tj_bad_n("\"\\\xc3\xa9\"", 5, "escape");
    tj_bad_n("\"\\\n\"", 4, "escape");
}

Test(json, lone_surrogates) {
    tj_bad("\"\\ud800\"", "surrogate");
    tj_bad("\"\\udbff\"", "surrogate");
    tj_bad("\"\\udc00\"", "surrogate");
    tj_bad("\"\\udfff\"", "surrogate");
    tj_bad("\"\\ude00\\ud83d\"", "surrogate");  // reversed pair
    tj_bad("\"\\ud83d\\ud83d\"", "surrogate");  // two highs
    tj_bad("\"\\ud83d\\u0041\"", "surrogate");
    tj_bad("\"\\ud83dx\"", "surrogate");
    tj_bad("\"\\ud83d\\n\"", "surrogate");
    tj_bad("\"\\ud83d\\ude0\"", NULL);
    tj_bad("\"\\ud83d\\ude0", NULL);
    tj_bad("\"\\ud83d", NULL);
    tj_bad("{\"\\ud800\": 1}", "surrogate");
}

Test(json, invalid_utf8) {
    const char *cases[] = {
        "\"\x80\"",              // lone continuation byte
        "\"\xbf\"",
        "\"\xc3\"",              // truncated 2-byte
        "\"\xc3x\"",
        "\"\xe2\x82\"",          // truncated 3-byte
        "\"\xf0\x9f\x98\"",      // truncated 4-byte
        "\"\xc0\xaf\"",          // overlong '/'
        "\"\xc1\xbf\"",
        "\"\xe0\x80\xaf\"",      // overlong 3-byte
        "\"\xe0\x9f\xbf\"",
        "\"\xf0\x80\x80\xaf\"",  // overlong 4-byte
        "\"\xf0\x8f\xbf\xbf\"",
        "\"\xed\xa0\x80\"",      // encoded surrogate U+D800
        "\"\xed\xbf\xbf\"",      // encoded surrogate U+DFFF
        "\"\xf4\x90\x80\x80\"",  // U+110000
        "\"\xf5\x80\x80\x80\"",
        "\"\xf8\x88\x80\x80\x80\"",
        "\"\xfe\"",
        "\"\xff\"",
        "{\"\xff\": 1}",
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) tj_bad(cases[k], "UTF-8");
    tj_bad_n("\"\xe2\x82", 3, NULL);  // truncated sequence at end of input
    tj_bad("\xc3\xa9", NULL);          // non-ASCII outside a string
}

Test(json, every_truncation_fails) {
    // all proper prefixes of a document that ends with its closing brace are invalid
    const char *s = "{\"a\": [1, -2.5e3, 0, true, false, null, \"x\\u00e9\\ud83d\\ude00\\n\xc3\xa9\\\"\"],"
                    " \"b\": {\"c\": {}, \"d\": []}, \"e\": -9223372036854775808, \"f\": \"\"}";
    size_t n = strlen(s);
    json_doc *d = tj_ok(s);
    json_free(d);
    for (size_t k = 0; k < n; k++) tj_bad_n(s, k, NULL);
}

Test(json, mutations_never_crash) {
    // random byte edits of a valid document: each result is either a document or a clean error
    const char *s = "{\"a\": [1, -2.5e3, true, null, \"x\\u00e9\\ud83d\\ude00\xe2\x82\xac\"], \"b\": {\"c\": [{}]}}";
    size_t n = strlen(s);
    char *buf = malloc(n);
    cr_assert_not_null(buf);
    const char alphabet[] = "{}[]:,\"\\u0123456789abcdefABCDEF-+.eE tnrfl\xc3\xa9\xed\xf4\x80\xbf\x00\n";
    uint32_t rng = 12345;
    int parsed = 0;
    for (int iter = 0; iter < 20000; iter++) {
        memcpy(buf, s, n);
        int edits = 1 + iter % 3;
        for (int k = 0; k < edits; k++) {
            rng = rng * 1664525u + 1013904223u;
            size_t at = (rng >> 8) % n;
            rng = rng * 1664525u + 1013904223u;
            buf[at] = alphabet[(rng >> 8) % (sizeof alphabet - 1)];
        }
        rng = rng * 1664525u + 1013904223u;
        size_t len = (iter % 4 == 0) ? (rng >> 8) % (n + 1) : n;
        dj_err e = {{0}};
        json_doc *d = tj_parse_n(buf, len, &e);
        if (d) {
            parsed++;
            json_free(d);
        } else {
            cr_assert(strncmp(e.msg, "json: line ", 11) == 0, "message '%s'", e.msg);
        }
    }
    free(buf);
    cr_assert_gt(parsed, 0, "some edits (e.g. digits) keep the document valid");
}

// ---- real files
Test(json, real_tokenizer_json) {
    json_doc *d = tj_parse_data("tokenizers/llama3/tokenizer.json");
    const json_value *model = json_get(json_root(d), "model");
    cr_assert_str_eq(json_str(json_get(model, "type")), "BPE");
    const json_value *vocab = json_get(model, "vocab");
    cr_assert_eq(vocab->type, JSON_OBJECT);
    cr_assert_eq(vocab->u.obj.n, 128000);
    int64_t id;
    cr_assert_eq(json_int(json_get(vocab, "!"), &id), 0);
    cr_assert_eq(id, 0);
    cr_assert_str_eq(vocab->u.obj.members[1].key, "\"");
    const json_value *merges = json_get(model, "merges");
    cr_assert_eq(merges->type, JSON_ARRAY);
    cr_assert_eq(merges->u.arr.n, 280147);
    cr_assert_str_eq(json_str(&merges->u.arr.items[0].u.arr.items[0]), "\xc4\xa0");  // "Ġ"
    const json_value *added = json_get(json_root(d), "added_tokens");
    cr_assert_str_eq(json_str(json_get(&added->u.arr.items[0], "content")), "<|begin_of_text|>");
    cr_assert_eq(json_int(json_get(&added->u.arr.items[0], "id"), &id), 0);
    cr_assert_eq(id, 128000);
    json_free(d);
}

Test(json, real_config_json) {
    json_doc *d = tj_parse_data("models/stories260K/config.json");
    const json_value *r = json_root(d);
    int64_t i;
    double x;
    int b;
    cr_assert_eq(json_int(json_get(r, "hidden_size"), &i), 0);
    cr_assert_eq(i, 64);
    cr_assert_eq(json_num(json_get(r, "rms_norm_eps"), &x), 0);
    cr_assert_eq(x, 1e-5);
    cr_assert_eq(json_num(json_get(json_get(r, "rope_parameters"), "rope_theta"), &x), 0);
    cr_assert_eq(x, 10000.0);
    cr_assert_eq(json_bool(json_get(r, "tie_word_embeddings"), &b), 0);
    cr_assert_eq(b, 1);
    cr_assert_eq(json_get(r, "pad_token_id")->type, JSON_NULL);
    json_free(d);
}

// ---- each UTF-8 and surrogate check alone, at its limit
// A continuation byte is 10xxxxxx: each position of a 2-, 3- and 4-byte sequence (the lead byte's range right) with
// ASCII, a lead byte (11xxxxxx) or the closing quote in its place is refused; with the smallest and the largest
// continuation byte it is taken.
Test(json, utf8_each_continuation_byte) {
    static const struct {
        const char *lead;  // a valid sequence, its last bytes replaced below
        int len;
    } seqs[] = {{"\xc3\xa9", 2}, {"\xe2\x82\xac", 3}, {"\xf0\x9f\x98\x80", 4}, {"\xf4\x8f\xbf\xbf", 4},
                {"\xe0\xa0\x80", 3}, {"\xed\x9f\xbf", 3}, {"\xf0\x90\x80\x80", 4}};
    const unsigned char bad[] = {'x', 0xc0, 0xc3, 0xff, '"'}, good[] = {0x80, 0xbf};
    for (size_t k = 0; k < sizeof seqs / sizeof *seqs; k++) {
        char s[16];
        for (int at = 1; at < seqs[k].len; at++) {
            // bytes that stay a valid sequence: the lead's second byte has its own range (E0, ED, F0, F4)
            unsigned char lead = (unsigned char)seqs[k].lead[0];
            int restricted = at == 1 && (lead == 0xe0 || lead == 0xed || lead == 0xf0 || lead == 0xf4);
            for (size_t b = 0; b < sizeof bad; b++) {
                s[0] = '"';
                memcpy(s + 1, seqs[k].lead, (size_t)seqs[k].len);
                s[1 + at] = (char)bad[b];
                s[1 + seqs[k].len] = '"';
                tj_bad_n(s, (size_t)seqs[k].len + 2, bad[b] == '"' ? NULL : "UTF-8");
            }
            for (size_t b = 0; b < sizeof good && !restricted; b++) {
                s[0] = '"';
                memcpy(s + 1, seqs[k].lead, (size_t)seqs[k].len);
                s[1 + at] = (char)good[b];
                s[1 + seqs[k].len] = '"';
                s[2 + seqs[k].len] = 0;
                json_free(tj_ok(s));
            }
        }
    }
    tj_bad("\"\xf0\x9f\x98x\"", "UTF-8");  // the fourth byte of a 4-byte sequence
    tj_bad("\"\xf0\x9f\x98\xc0\"", "UTF-8");
    tj_bad("\"\xe2\x82x\"", "UTF-8");      // the third of a 3-byte one
}

// The lead byte's own ranges at their edges: the smallest lead of each length, the second byte that makes a
// 3- or 4-byte sequence overlong, a surrogate or too large, each just inside (taken) and just outside (refused).
Test(json, utf8_lead_and_second_byte_edges) {
    const char *ok[] = {
        "\"\xc2\x80\"", "\"\xdf\xbf\"",                      // U+0080, U+07FF
        "\"\xe0\xa0\x80\"", "\"\xe1\x80\x80\"",              // U+0800, U+1000
        "\"\xec\xbf\xbf\"", "\"\xed\x80\x80\"", "\"\xed\x9f\xbf\"", "\"\xee\x80\x80\"",  // around the surrogates
        "\"\xef\xbf\xbf\"",                                  // U+FFFF
        "\"\xf0\x90\x80\x80\"", "\"\xf1\x80\x80\x80\"",      // U+10000, U+40000
        "\"\xf3\xbf\xbf\xbf\"", "\"\xf4\x80\x80\x80\"", "\"\xf4\x8f\xbf\xbf\"",  // up to U+10FFFF
    };
    for (size_t k = 0; k < sizeof ok / sizeof *ok; k++) json_free(tj_ok(ok[k]));
    const char *bad[] = {
        "\"\xc1\xbf\"",                                      // overlong U+007F
        "\"\xe0\x9f\xbf\"",                                  // overlong U+07FF
        "\"\xed\xa0\x80\"", "\"\xed\xbf\xbf\"",              // U+D800, U+DFFF encoded
        "\"\xf0\x8f\xbf\xbf\"",                              // overlong U+FFFF
        "\"\xf4\x90\x80\x80\"", "\"\xf4\xbf\xbf\xbf\"",      // U+110000 and up
        "\"\xf5\x80\x80\x80\"", "\"\xf7\xbf\xbf\xbf\"",      // leads past F4
        "\"\xed\xa0\x80\xed\xb0\x80\"",                      // a surrogate pair encoded in UTF-8 (CESU-8)
    };
    for (size_t k = 0; k < sizeof bad / sizeof *bad; k++) tj_bad(bad[k], "UTF-8");
}

// A high surrogate needs a low one (DC00..DFFF) right after it: the edges of that range, each alone.
Test(json, surrogate_pair_edges) {
    static const struct {
        const char *in, *want;
    } ok[] = {
        {"\"\\ud800\\udc00\"", "\xf0\x90\x80\x80"},  // U+10000, the first pair
        {"\"\\ud83d\\udfff\"", "\xf0\x9f\x9f\xbf"},  // the highest low surrogate
        {"\"\\udbff\\udc00\"", "\xf4\x8f\xb0\x80"},
        {"\"\\uD83D\\uDE00\"", "\xf0\x9f\x98\x80"},  // upper-case hex
        {"\"\\ud7ff\\ue000\"", "\xed\x9f\xbf\xee\x80\x80"},  // the code points either side of the surrogates
    };
    for (size_t k = 0; k < sizeof ok / sizeof *ok; k++) {
        json_doc *d = tj_ok(ok[k].in);
        cr_assert_str_eq(json_str(json_root(d)), ok[k].want, "%s", ok[k].in);
        json_free(d);
    }
    tj_bad("\"\\ud83d\\ue000\"", "surrogate");  // just above the low range
    tj_bad("\"\\ud83d\\uffff\"", "surrogate");
    tj_bad("\"\\ud83d\\udbff\"", "surrogate");  // just below it: another high
    tj_bad("\"\\udbff\\ue000\"", "surrogate");
    tj_bad("\"\\ud800\\u0000\"", "surrogate");
    tj_bad("\"\\udc00\\ud800\"", "surrogate");  // a lone low, whatever follows
    tj_bad("\"\\ud83d\\ude00\\udc00\"", "surrogate");  // a pair, then a lone low
    tj_bad("\"\\ud83d\\u00\"", NULL);           // the low escape cut short
    tj_bad("\"\\ud83d\\\"", NULL);
}
