// keys.h: the server's API keys, each one a tenant (server.c): given as flags or read from a file, one a line, and
// matched against a request's Authorization header in a time that does not depend on where a guess goes wrong.
#ifndef DJINN_KEYS_H
#define DJINN_KEYS_H

#include <stddef.h>
#include <stdint.h>

#include "util.h"

#define KEYS_LEN_MAX 256        // bytes of one key
#define KEYS_MAX 4096           // keys in all
#define KEYS_FILE_MAX (1 << 20) // bytes of a key file

typedef struct {
    char (*key)[KEYS_LEN_MAX];  // (n) each zero-padded: compared over all KEYS_LEN_MAX bytes
    size_t *len;                // (n)
    int32_t n;
} dj_keys;

// One more key, the next tenant; `what` names where it came from in errors ("--api-key", "keys.txt:3"). A key is
// 1 to KEYS_LEN_MAX visible ASCII characters without spaces (what a Bearer token may hold); a repeated key is refused.
int keys_add(dj_keys *k, const char *key, size_t len, const char *what, dj_err *e);
// Every line of the file a key (a trailing CR dropped; blank lines skipped); none at all is an error.
int keys_add_file(dj_keys *k, const char *path, dj_err *e);
// The tenant whose key an Authorization value carries ("Bearer KEY", the scheme in any case): 0..n-1, or -1.
int32_t keys_match(const dj_keys *k, const char *authorization);
void keys_free(dj_keys *k);

#endif
