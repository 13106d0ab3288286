// keys.c: API keys and their tenants (keys.h).
#include "keys.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "fileio.h"

int keys_add(dj_keys *k, const char *key, size_t len, const char *what, dj_err *e) {
    if (!len || len > KEYS_LEN_MAX) return dj_fail(e, "%s: a key holds 1 to %d characters, not %zu", what,
                                                   KEYS_LEN_MAX, len);
    for (size_t i = 0; i < len; i++)
        if (key[i] <= ' ' || key[i] > '~')
            return dj_fail(e, "%s: a key holds visible ASCII characters only (no spaces), not byte 0x%02x at %zu",
                           what, (unsigned char)key[i], i + 1);
    if (k->n == KEYS_MAX) return dj_fail(e, "%s: more than %d keys", what, KEYS_MAX);
    for (int32_t t = 0; t < k->n; t++)
        if (k->len[t] == len && !memcmp(k->key[t], key, len)) return dj_fail(e, "%s: a key given twice", what);
    char(*kk)[KEYS_LEN_MAX] = realloc(k->key, (size_t)(k->n + 1) * sizeof *kk);
    if (kk) k->key = kk;
    size_t *kl = kk ? realloc(k->len, (size_t)(k->n + 1) * sizeof *kl) : NULL;
    if (!kl) return dj_fail(e, "out of memory");
    k->len = kl;
    memset(k->key[k->n], 0, KEYS_LEN_MAX);
    memcpy(k->key[k->n], key, len);
    k->len[k->n++] = len;
    return 0;
}

int keys_add_file(dj_keys *k, const char *path, dj_err *e) {
    char *buf;
    size_t n;
    if (in_read_all(path, "--api-key-file", KEYS_FILE_MAX, &buf, &n, e)) return -1;
    int32_t before = k->n;
    int rc = 0, line = 0;
    for (char *p = buf, *end = buf + n; !rc && p < end; line++) {
        char *nl = memchr(p, '\n', (size_t)(end - p));
        char *stop = nl ? nl : end, *next = nl ? nl + 1 : end;
        if (stop > p && stop[-1] == '\r') stop--;
        char what[600];
        snprintf(what, sizeof what, "%s:%d", path, line + 1);
        if (stop > p) rc = keys_add(k, p, (size_t)(stop - p), what, e);
        p = next;
    }
    free(buf);
    if (!rc && k->n == before) rc = dj_fail(e, "--api-key-file %s: no key in it (one key a line)", path);
    return rc;
}

int32_t keys_match(const dj_keys *k, const char *authorization) {
    const char *a = authorization;
    if (strncasecmp(a, "bearer ", 7)) return -1;
    for (a += 7; *a == ' '; a++) {}
    size_t len = strnlen(a, KEYS_LEN_MAX + 1);
    if (!len || len > KEYS_LEN_MAX) return -1;
    unsigned char guess[KEYS_LEN_MAX] = {0};
    memcpy(guess, a, len);
    // every key compared over all its bytes, whatever matched before: the time tells nothing of a guess
    int32_t tenant = -1;
    for (int32_t t = 0; t < k->n; t++) {
        unsigned diff = (unsigned)(k->len[t] != len);
        for (size_t i = 0; i < KEYS_LEN_MAX; i++) diff |= (unsigned)(guess[i] ^ (unsigned char)k->key[t][i]);
        uint32_t same = (uint32_t)((diff - 1u) >> 31 & 1u);  // 1 when diff == 0 (diff is at most 0xff)
        tenant = (int32_t)((uint32_t)tenant ^ ((uint32_t)(tenant ^ t) & (0u - same)));
    }
    return tenant;
}

void keys_free(dj_keys *k) {
    free(k->key), free(k->len);
    memset(k, 0, sizeof *k);
}
