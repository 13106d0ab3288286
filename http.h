// http.h: the HTTP/1.1 that `djinn serve` speaks: a request head parsed from bytes (pure, bounded), and the
// reason phrases of the statuses it answers with. Bodies come by Content-Length only (no chunked requests).
#ifndef DJINN_HTTP_H
#define DJINN_HTTP_H

#include <stddef.h>

#define HTTP_HEAD_MAX 16384  // request line and headers

typedef struct {
    char method[16];
    char path[1024];        // the target without its query
    int minor;              // HTTP/1.<minor>
    size_t content_length;  // 0 when absent
    int keep_alive;         // HTTP/1.1 unless "Connection: close"; HTTP/1.0 only with "Connection: keep-alive"
    char authorization[512];
    int expect_continue;    // "Expect: 100-continue": the client waits for a 100 before sending the body
    size_t head_len;        // bytes of the head, its blank line included: the body starts there
} http_req;

// 1: buf[0..n) begins with a whole head (r filled); 0: not yet (no blank line within the bytes so far, and fewer
// than HTTP_HEAD_MAX of them); -1: a request to refuse: *status (400, 413, 431, 501 or 505) and *why say how.
int http_parse_head(const char *buf, size_t n, size_t max_body, http_req *r, int *status, const char **why);
const char *http_reason(int status);

#endif
