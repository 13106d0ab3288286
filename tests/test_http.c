// test_http.c: http_parse_head (http.c) at the edge of every limit and refusal it has, each case alone: the head's
// 16 KB, the method's 15 bytes, the target's 1023 (its query not counted), the Authorization's 511, Content-Length
// against the body limit and its overflow guard, duplicate and malformed headers. Every input is parsed from an
// exact-size heap copy so that ASan catches any read past the end.
#include <criterion/criterion.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../http.h"

// ---- helpers
typedef struct {
    int rc, status;
    const char *why;
    http_req r;
} th_res;

static th_res th_parse_n(const char *head, size_t n, size_t max_body) {
    th_res x = {0};
    char *buf = malloc(n ? n : 1);
    cr_assert(buf);
    memcpy(buf, head, n);
    x.rc = http_parse_head(buf, n, max_body, &x.r, &x.status, &x.why);
    free(buf);
    if (x.rc < 0) cr_assert(x.why && x.why[0], "a refusal (%d) without a reason", x.status);
    return x;
}

static th_res th_parse(const char *head, size_t max_body) { return th_parse_n(head, strlen(head), max_body); }

// printf into a buffer of this file's, valid until the next call (th_fmt or th_head).
static char th_buf[4 * HTTP_HEAD_MAX];
static char *th_vfmt(const char *prefix, const char *fmt, va_list ap, const char *suffix) {
    int n = snprintf(th_buf, sizeof th_buf, "%s", prefix);
    n += vsnprintf(th_buf + n, sizeof th_buf - (size_t)n, fmt, ap);
    cr_assert((size_t)n + strlen(suffix) < sizeof th_buf, "a test head over %zu bytes", sizeof th_buf);
    strcpy(th_buf + n, suffix);
    return th_buf;
}

static char *th_fmt(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static char *th_fmt(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    char *h = th_vfmt("", fmt, ap, "");
    va_end(ap);
    return h;
}

// A request head "GET / HTTP/1.1\r\n" + the header lines given (each ending in \r\n) + "\r\n".
static char *th_head(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static char *th_head(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    char *h = th_vfmt("GET / HTTP/1.1\r\n", fmt, ap, "\r\n");
    va_end(ap);
    return h;
}

// n bytes of c, NUL-terminated (malloc'd).
static char *th_fill(size_t n, char c) {
    char *s = malloc(n + 1);
    cr_assert(s);
    memset(s, c, n);
    s[n] = 0;
    return s;
}

static void th_expect_ok(const char *head, size_t max_body) {
    th_res x = th_parse(head, max_body);
    cr_assert_eq(x.rc, 1, "refused (%d %s): %.200s", x.status, x.why, head);
    cr_assert_eq(x.r.head_len, strlen(head));
}

static void th_expect_refused(const char *head, size_t max_body, int status, const char *why) {
    th_res x = th_parse(head, max_body);
    cr_assert_eq(x.rc, -1, "accepted: %.200s", head);
    cr_assert_eq(x.status, status, "status %d (%s), want %d: %.200s", x.status, x.why, status, head);
    if (why) cr_assert(strstr(x.why, why), "reason '%s' lacks '%s': %.200s", x.why, why, head);
}

// ---- the head's size: a head whose blank line ends at byte HTTP_HEAD_MAX is taken; one byte more is refused
// (431), and so is an unfinished head that has reached HTTP_HEAD_MAX bytes; fewer bytes are "not yet".
Test(http_edges, head_size_limit) {
    const size_t base = strlen("GET / HTTP/1.1\r\nX: \r\n\r\n");
    for (size_t len = HTTP_HEAD_MAX - 2; len <= HTTP_HEAD_MAX + 1; len++) {
        char *pad = th_fill(len - base, 'a'), *h = strdup(th_head("X: %s\r\n", pad));
        cr_assert_eq(strlen(h), len);
        if (len <= HTTP_HEAD_MAX) {
            th_expect_ok(h, 0);
            // with a body after it in the buffer: the head ends at the same byte
            char *more;
            cr_assert(asprintf(&more, "%s{\"a\": 1}", h) >= 0);
            th_res x = th_parse(more, 0);
            cr_assert_eq(x.rc, 1, "a head of %zu bytes with bytes after it: %d %s", len, x.status, x.why);
            cr_assert_eq(x.r.head_len, len);
            free(more);
        } else {
            th_expect_refused(h, 0, 431, "16 KB");
        }
        free(pad), free(h);
    }
    // an unfinished head: waiting below HTTP_HEAD_MAX bytes, refused at it
    char *h = th_fill(HTTP_HEAD_MAX + 1, 'a');
    memcpy(h, "GET / HTTP/1.1\r\nX: ", 19);
    th_res x = th_parse_n(h, HTTP_HEAD_MAX - 1, 0);
    cr_assert_eq(x.rc, 0, "%zu bytes without a blank line: %d", (size_t)HTTP_HEAD_MAX - 1, x.rc);
    x = th_parse_n(h, HTTP_HEAD_MAX, 0);
    cr_assert(x.rc == -1 && x.status == 431, "%d bytes without a blank line: %d %d", HTTP_HEAD_MAX, x.rc, x.status);
    // the blank line's last byte just past the limit, the rest of the buffer in hand
    memcpy(h + HTTP_HEAD_MAX - 3, "\r\n\r\n", 4);
    x = th_parse_n(h, HTTP_HEAD_MAX + 1, 0);
    cr_assert(x.rc == -1 && x.status == 431, "a head of %d bytes: %d %d", HTTP_HEAD_MAX + 1, x.rc, x.status);
    free(h);
}

// ---- the request line
// A method is 1 to 15 capital letters (r.method holds 16 bytes).
Test(http_edges, method) {
    char *m15 = th_fill(15, 'P'), *m16 = th_fill(16, 'P');
    th_res x = th_parse(th_fmt("%s / HTTP/1.1\r\n\r\n", m15), 0);
    cr_assert_eq(x.rc, 1, "a method of 15 letters: %s", x.why);
    cr_assert_str_eq(x.r.method, m15);
    th_expect_refused(th_fmt("%s / HTTP/1.1\r\n\r\n", m16), 0, 400, "request line");
    free(m15), free(m16);
    x = th_parse("A / HTTP/1.1\r\n\r\n", 0);
    cr_assert(x.rc == 1 && !strcmp(x.r.method, "A"));
    th_expect_refused(" / HTTP/1.1\r\n\r\n", 0, 400, "request line");      // empty
    th_expect_refused("GEt / HTTP/1.1\r\n\r\n", 0, 400, "request line");   // a small letter
    th_expect_refused("G1T / HTTP/1.1\r\n\r\n", 0, 400, "request line");   // a digit
    th_expect_refused("@ / HTTP/1.1\r\n\r\n", 0, 400, "request line");     // just below 'A'
    th_expect_refused("[ / HTTP/1.1\r\n\r\n", 0, 400, "request line");     // just above 'Z'
    th_expect_refused("GET\r\n\r\n", 0, 400, "request line");              // no target at all
}

// A target starts with '/', holds no control character, space or DEL, and its path (the query not counted) is at
// most 1023 bytes (r.path holds 1024).
Test(http_edges, target) {
    char *p1023 = th_fill(1023, 'p'), *p1024 = th_fill(1024, 'p'), *q = th_fill(4000, 'q');
    p1023[0] = p1024[0] = '/';
    th_res x = th_parse(th_fmt("GET %s HTTP/1.1\r\n\r\n", p1023), 0);
    cr_assert_eq(x.rc, 1, "a path of 1023 bytes: %s", x.why);
    cr_assert_str_eq(x.r.path, p1023);
    th_expect_refused(th_fmt("GET %s HTTP/1.1\r\n\r\n", p1024), 0, 400, "over 1 KB");
    x = th_parse(th_fmt("GET %s?%s HTTP/1.1\r\n\r\n", p1023, q), 0);  // a long query is not the path's
    cr_assert_eq(x.rc, 1, "a path of 1023 bytes and a query of 4000: %s", x.why);
    cr_assert_str_eq(x.r.path, p1023);
    th_expect_refused(th_fmt("GET %s? HTTP/1.1\r\n\r\n", p1024), 0, 400, "over 1 KB");
    free(p1023), free(p1024), free(q);
    x = th_parse("GET /v1/models?a=b HTTP/1.1\r\n\r\n", 0);
    cr_assert(x.rc == 1 && !strcmp(x.r.path, "/v1/models"));
    x = th_parse("GET /?x HTTP/1.1\r\n\r\n", 0);
    cr_assert(x.rc == 1 && !strcmp(x.r.path, "/"));
    th_expect_refused("GET v1 HTTP/1.1\r\n\r\n", 0, 400, "target");
    th_expect_refused("GET  HTTP/1.1\r\n\r\n", 0, 400, "target");        // empty
    th_expect_refused("GET * HTTP/1.1\r\n\r\n", 0, 400, "target");
    th_expect_refused("GET /a\x7f HTTP/1.1\r\n\r\n", 0, 400, "target");  // DEL
    th_expect_refused("GET /a\x01 HTTP/1.1\r\n\r\n", 0, 400, "target");  // a control character
    th_expect_refused("GET /a?\x1f HTTP/1.1\r\n\r\n", 0, 400, "target"); // in the query too
    th_expect_refused("GET /a\tb HTTP/1.1\r\n\r\n", 0, 400, "target");
    th_expect_refused("GET / x HTTP/1.1\r\n\r\n", 0, 400, NULL);          // a space inside
    x = th_parse("GET /~\x80 HTTP/1.1\r\n\r\n", 0);                      // bytes above DEL are not control bytes
    cr_assert_eq(x.rc, 1, "%s", x.why);
}

// HTTP/1.0 to HTTP/1.9: keep-alive by default from 1.1 on; another major version is 505; anything else 400.
Test(http_edges, version) {
    th_res x = th_parse("GET / HTTP/1.0\r\n\r\n", 0);
    cr_assert(x.rc == 1 && x.r.minor == 0 && !x.r.keep_alive);
    x = th_parse("GET / HTTP/1.1\r\n\r\n", 0);
    cr_assert(x.rc == 1 && x.r.minor == 1 && x.r.keep_alive);
    x = th_parse("GET / HTTP/1.9\r\n\r\n", 0);
    cr_assert(x.rc == 1 && x.r.minor == 9 && x.r.keep_alive);
    th_expect_refused("GET / HTTP/2.0\r\n\r\n", 0, 505, "HTTP/1.x");
    th_expect_refused("GET / HTTP/0.9\r\n\r\n", 0, 505, "HTTP/1.x");
    th_expect_refused("GET / HTTP/1.10\r\n\r\n", 0, 400, "HTTP/1.x");
    th_expect_refused("GET / HTTP/1.\r\n\r\n", 0, 400, "HTTP/1.x");
    th_expect_refused("GET / http/1.1\r\n\r\n", 0, 400, "HTTP/1.x");
    th_expect_refused("GET / HTTP/1.1 \r\n\r\n", 0, 400, "HTTP/1.x");
    th_expect_refused("GET / \r\n\r\n", 0, 400, NULL);
}

// ---- Content-Length
// A body of exactly the limit is taken, one byte more is 413; its digits are checked one by one, and a value
// that would overflow 64 bits is refused as malformed (400) before it wraps to a small one.
Test(http_edges, content_length_against_the_limit) {
    const size_t limits[] = {0, 1, 100, 1 << 20};
    for (size_t k = 0; k < sizeof limits / sizeof *limits; k++) {
        size_t lim = limits[k];
        for (size_t len = lim ? lim - 1 : 0; len <= lim + 1; len++) {
            char *h = th_head("Content-Length: %zu\r\n", len);
            th_res x = th_parse(h, lim);
            if (len <= lim) {
                cr_assert_eq(x.rc, 1, "a body of %zu bytes, limit %zu: refused (%d %s)", len, lim, x.status, x.why);
                cr_assert_eq(x.r.content_length, len);
            } else {
                cr_assert(x.rc == -1 && x.status == 413, "a body of %zu bytes, limit %zu: %d %d", len, lim, x.rc,
                          x.status);
            }
        }
    }
    th_res x = th_parse("GET / HTTP/1.1\r\n\r\n", 0);
    cr_assert(x.rc == 1 && x.r.content_length == 0, "no Content-Length: no body");
}

Test(http_edges, content_length_overflow) {
    // 2^64 + 1 would wrap to 1, 2^64 to 0, and a limit of SIZE_MAX would take either
    th_expect_refused(th_head("Content-Length: 18446744073709551617\r\n"), SIZE_MAX, 400, "Content-Length");
    th_expect_refused(th_head("Content-Length: 18446744073709551616\r\n"), SIZE_MAX, 400, "Content-Length");
    th_expect_refused(th_head("Content-Length: 18446744073709551615\r\n"), SIZE_MAX, 400, "Content-Length");
    th_expect_refused(th_head("Content-Length: 99999999999999999999999999\r\n"), SIZE_MAX, 400, "Content-Length");
    // the guard's edge: a next digit is taken while the value so far is at most 2^40 (1099511627776)
    th_res x = th_parse(th_head("Content-Length: 10995116277769\r\n"), SIZE_MAX);
    cr_assert(x.rc == 1 && x.r.content_length == 10995116277769ull, "%d %s", x.rc, x.why);
    th_expect_refused(th_head("Content-Length: 10995116277770\r\n"), SIZE_MAX, 400, "Content-Length");
    // below the guard, a large value against a small limit is 413 (too large), not 400
    th_expect_refused(th_head("Content-Length: 1099511627776\r\n"), 1 << 20, 413, "size limit");
    // leading zeros do not count towards it
    x = th_parse(th_head("Content-Length: 000000000000000000000000000000007\r\n"), 100);
    cr_assert(x.rc == 1 && x.r.content_length == 7, "%d %s", x.rc, x.why);
}

Test(http_edges, content_length_malformed) {
    static const char *const bad[] = {
        "Content-Length: \r\n", "Content-Length:\r\n", "Content-Length: +5\r\n", "Content-Length: -0\r\n",
        "Content-Length: 5a\r\n", "Content-Length: 0x10\r\n", "Content-Length: 1 2\r\n", "Content-Length: 1.0\r\n",
        "Content-Length: 5,5\r\n",
        "Content-Length: 5\r\nContent-Length: 5\r\n",  // a duplicate, even of the same value
        "Content-Length: 5\r\nCONTENT-LENGTH: 6\r\n",
        "content-length: 0\r\nContent-Length: 0\r\n",
    };
    for (size_t k = 0; k < sizeof bad / sizeof *bad; k++) {
        char *h = th_head("%s", bad[k]);
        th_expect_refused(h, 100, 400, "Content-Length");
    }
    // whitespace around the value is not part of it
    th_res x = th_parse(th_head("Content-Length: \t 12 \t\r\n"), 100);
    cr_assert(x.rc == 1 && x.r.content_length == 12, "%d %s", x.rc, x.why);
    x = th_parse(th_head("cOnTeNt-LeNgTh:3\r\n"), 100);
    cr_assert(x.rc == 1 && x.r.content_length == 3, "%d %s", x.rc, x.why);
    // a value of 511 bytes is read (leading zeros), one of 512 is refused
    char *z = th_fill(511, '0'), *h;
    z[510] = '9';
    cr_assert((h = th_head("Content-Length: %s\r\n", z)));
    x = th_parse(h, 100);
    cr_assert(x.rc == 1 && x.r.content_length == 9, "a value of 511 bytes: %d %s", x.rc, x.why);
    free(z);
    z = th_fill(512, '0');
    z[511] = '9';
    cr_assert((h = th_head("Content-Length: %s\r\n", z)));
    th_expect_refused(h, 100, 400, "Content-Length");
    free(z);
    // a header whose name only begins like it is another header
    x = th_parse(th_head("Content-Lengthy: x\r\nContent-Lengt: y\r\nContent-Length: 4\r\n"), 100);
    cr_assert(x.rc == 1 && x.r.content_length == 4, "%d %s", x.rc, x.why);
}

// ---- other headers
// Authorization: at most 511 bytes without the whitespace around it (r.authorization holds 512); more is 431.
Test(http_edges, authorization_length) {
    char *v = th_fill(511, 'k'), *h = th_head("Authorization:  %s \t\r\n", v);
    th_res x = th_parse(h, 0);
    cr_assert_eq(x.rc, 1, "511 bytes: %d %s", x.status, x.why);
    cr_assert_str_eq(x.r.authorization, v);
    free(v);
    v = th_fill(512, 'k'), h = th_head("Authorization: %s\r\n", v);
    th_expect_refused(h, 0, 431, "Authorization");
    free(v);
    x = th_parse(th_head("authorization: Bearer  a b \r\n"), 0);
    cr_assert(x.rc == 1 && !strcmp(x.r.authorization, "Bearer  a b"), "'%s'", x.r.authorization);
    x = th_parse(th_head("Authorization:\r\n"), 0);
    cr_assert(x.rc == 1 && !x.r.authorization[0]);
}

// Header lines: a name of at least one byte without space, control characters or DEL, then ':'; a value without NUL;
// each line ended by CRLF. Transfer-Encoding of any kind is refused (501).
Test(http_edges, header_lines) {
    static const struct {
        const char *lines;
        int status;
        const char *why;
    } bad[] = {
        {"X-A b\r\n", 400, "header line"},             // no colon
        {": b\r\n", 400, "header line"},                // an empty name
        {"X A: b\r\n", 400, "header name"},             // a space in the name
        {"X-A : b\r\n", 400, "header name"},            // before the colon
        {"X\tA: b\r\n", 400, "header name"},
        {"X\x01: b\r\n", 400, "header name"},
        {"X\x7f: b\r\n", 400, "header name"},
        {"X-A: b\rc\r\n", 400, "header line"},          // a bare CR
        {"Transfer-Encoding: chunked\r\n", 501, "Content-Length"},
        {"TRANSFER-ENCODING: identity\r\n", 501, "Content-Length"},
        {"Content-Length: 3\r\nTransfer-Encoding: gzip\r\n", 501, "Content-Length"},
    };
    for (size_t k = 0; k < sizeof bad / sizeof *bad; k++) {
        char *h = th_head("%s", bad[k].lines);
        th_expect_refused(h, 100, bad[k].status, bad[k].why);
    }
    // a NUL in a value (the head taken with its exact length)
    const char nul[] = "GET / HTTP/1.1\r\nX-A: b\0c\r\n\r\n";
    th_res x = th_parse_n(nul, sizeof nul - 1, 0);
    cr_assert(x.rc == -1 && x.status == 400 && strstr(x.why, "header value"), "%d %d %s", x.rc, x.status, x.why);
    // names of one byte, values with colons, bytes above DEL: fine
    x = th_parse(th_head("X: a:b:c\r\nY:\r\nZ-\x80: \xff\r\n"), 0);
    cr_assert_eq(x.rc, 1, "%d %s", x.status, x.why);
}

// Connection and Expect are read case-insensitively; a Connection value too long to read changes nothing.
Test(http_edges, connection_and_expect) {
    th_res x = th_parse("GET / HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n", 0);
    cr_assert(x.rc == 1 && x.r.keep_alive);
    x = th_parse("GET / HTTP/1.1\r\nconnection: CLOSE\r\n\r\n", 0);
    cr_assert(x.rc == 1 && !x.r.keep_alive);
    x = th_parse("GET / HTTP/1.1\r\nConnection: keep-alive, close\r\n\r\n", 0);
    cr_assert(x.rc == 1 && !x.r.keep_alive, "close wins");
    char *v = th_fill(600, 'x');
    memcpy(v, "close", 5);
    x = th_parse(th_head("Connection: %s\r\n", v), 0);
    cr_assert(x.rc == 1 && x.r.keep_alive, "a Connection value over 511 bytes is not read");
    free(v);
    x = th_parse(th_head("Expect: 100-Continue\r\n"), 0);
    cr_assert(x.rc == 1 && x.r.expect_continue);
    x = th_parse(th_head("Expect: 100-continue-x\r\n"), 0);
    cr_assert(x.rc == 1 && !x.r.expect_continue);
    x = th_parse(th_head("X-Expect: 100-continue\r\n"), 0);
    cr_assert(x.rc == 1 && !x.r.expect_continue);
}
