// fuzz_http.c: libFuzzer target for http.c. The first input byte picks the body limit (0, 100 bytes, 1 MiB or
// 2^40); the rest is what a client sent. Checks what http.h promises: a head is found only whole, refusals carry
// a status it names and a reason, the fields are NUL-terminated within their arrays, the body limit holds, and
// the verdict depends on the head alone (a prefix of an accepted head is "not yet"; bytes after it change nothing).
#include <stdint.h>
#include <string.h>

#include "../../http.h"
#include "fuzz_common.h"

static void check_fields(const http_req *r, size_t n, size_t max_body) {
    FUZZ_CHECK(r->head_len >= 4 && r->head_len <= n && r->head_len <= HTTP_HEAD_MAX);
    FUZZ_CHECK(memchr(r->method, 0, sizeof r->method) && r->method[0]);
    FUZZ_CHECK(memchr(r->path, 0, sizeof r->path) && r->path[0] == '/');
    FUZZ_CHECK(memchr(r->authorization, 0, sizeof r->authorization));
    FUZZ_CHECK(r->minor >= 0 && r->minor <= 9);
    FUZZ_CHECK(r->keep_alive == 0 || r->keep_alive == 1);
    FUZZ_CHECK(r->expect_continue == 0 || r->expect_continue == 1);
    FUZZ_CHECK(r->content_length <= max_body);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    static const size_t limits[4] = {0, 100, 1u << 20, (size_t)1 << 40};
    const size_t max_body = limits[data[0] & 3], n = size - 1;
    const char *buf = (const char *)data + 1;
    http_req r, again;
    int status = 0, st2 = 0;
    const char *why = NULL, *why2 = NULL;
    const int rc = http_parse_head(buf, n, max_body, &r, &status, &why);
    FUZZ_CHECK(rc == -1 || rc == 0 || rc == 1);
    if (rc == 0) FUZZ_CHECK(n < HTTP_HEAD_MAX);
    if (rc == -1) {
        FUZZ_CHECK(status == 400 || status == 413 || status == 431 || status == 501 || status == 505);
        FUZZ_CHECK(why && why[0] && !strchr(why, '\n'));
        FUZZ_CHECK(strcmp(http_reason(status), "Error") != 0);
    }
    if (rc != 1) return 0;
    check_fields(&r, n, max_body);
    // the head alone gives the same request, and any shorter prefix of it is not yet a head
    FUZZ_CHECK(http_parse_head(buf, r.head_len, max_body, &again, &st2, &why2) == 1);
    FUZZ_CHECK(memcmp(&r, &again, sizeof r) == 0);
    FUZZ_CHECK(http_parse_head(buf, r.head_len - 1, max_body, &again, &st2, &why2) == 0);
    FUZZ_CHECK(http_parse_head(buf, r.head_len / 2, max_body, &again, &st2, &why2) == 0);
    return 0;
}
