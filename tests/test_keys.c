// test_keys.c: the server's API keys (keys.c): what a key may hold, a key file's lines, and which tenant an
// Authorization value names: the scheme in any case, the key whole (a prefix, an extension, one byte changed at
// either end: none), every key its own tenant.
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../keys.h"
#include "common.h"

static dj_keys three(void) {
    dj_keys k = {0};
    dj_err e;
    cr_assert(!keys_add(&k, "alpha", 5, "t", &e) && !keys_add(&k, "beta-key", 8, "t", &e) &&
              !keys_add(&k, "alphabet", 8, "t", &e), "%s", e.msg);
    return k;
}

Test(keys, each_key_its_tenant) {
    dj_keys k = three();
    static const struct {
        const char *auth;
        int32_t tenant;
    } cases[] = {
        {"Bearer alpha", 0},    {"bearer beta-key", 1}, {"BEARER alphabet", 2}, {"bEaReR   alpha", 0},
        {"Bearer alph", -1},    {"Bearer alphab", -1},  {"Bearer alphabets", -1}, {"Bearer Alpha", -1},
        {"Bearer blpha", -1},   {"Bearer alphb", -1},   {"Bearer ", -1},          {"Bearer", -1},
        {"alpha", -1},          {"Basic alpha", -1},    {"Bearer\talpha", -1},    {"", -1},
        {"Bearer beta-key ", -1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
        cr_expect_eq(keys_match(&k, cases[i].auth), cases[i].tenant, "'%s'", cases[i].auth);
    // a key of the longest length, and one byte over it
    char longest[KEYS_LEN_MAX + 1], auth[KEYS_LEN_MAX + 16];
    memset(longest, 'x', KEYS_LEN_MAX);
    dj_err e;
    cr_assert(!keys_add(&k, longest, KEYS_LEN_MAX, "t", &e), "%s", e.msg);
    snprintf(auth, sizeof auth, "Bearer %.*s", KEYS_LEN_MAX, longest);
    cr_expect_eq(keys_match(&k, auth), 3);
    snprintf(auth, sizeof auth, "Bearer %.*sx", KEYS_LEN_MAX, longest);
    cr_expect_eq(keys_match(&k, auth), -1);
    keys_free(&k);
    dj_keys none = {0};
    cr_expect_eq(keys_match(&none, "Bearer alpha"), -1);
}

Test(keys, what_a_key_may_hold) {
    dj_keys k = {0};
    dj_err e = {{0}};
    char big[KEYS_LEN_MAX + 1];
    memset(big, 'a', sizeof big);
    cr_expect_eq(keys_add(&k, "", 0, "--api-key", &e), -1);
    cr_expect(strstr(e.msg, "--api-key: a key holds 1 to 256 characters, not 0"), "%s", e.msg);
    cr_expect_eq(keys_add(&k, big, KEYS_LEN_MAX + 1, "--api-key", &e), -1);
    cr_expect(strstr(e.msg, "not 257"), "%s", e.msg);
    cr_expect_eq(keys_add(&k, "a b", 3, "--api-key", &e), -1);
    cr_expect(strstr(e.msg, "not byte 0x20 at 2"), "%s", e.msg);
    cr_expect_eq(keys_add(&k, "a\x7f", 2, "--api-key", &e), -1);
    cr_expect_eq(keys_add(&k, "\xc3\xa9", 2, "--api-key", &e), -1);
    cr_expect_eq(keys_add(&k, "~!", 2, "--api-key", &e), 0, "%s", e.msg);
    cr_expect_eq(keys_add(&k, "~!", 2, "--api-key", &e), -1);
    cr_expect(strstr(e.msg, "a key given twice"), "%s", e.msg);
    cr_expect_eq(k.n, 1);
    keys_free(&k);
}

Test(keys, a_key_file) {
    char *dir = tc_tmpdir("keys");
    char path[600];
    snprintf(path, sizeof path, "%s/keys", dir);
    tc_write(path, "one\r\n\n  \ntwo", 13);  // a CRLF line, a blank one, one of spaces: refused by its line
    dj_keys k = {0};
    dj_err e = {{0}};
    cr_assert_eq(keys_add_file(&k, path, &e), -1);
    cr_expect(strstr(e.msg, "keys:3: a key holds visible ASCII"), "%s", e.msg);
    keys_free(&k);
    tc_write(path, "one\r\n\ntwo", 9);
    cr_assert_eq(keys_add_file(&k, path, &e), 0, "%s", e.msg);
    cr_expect(k.n == 2 && keys_match(&k, "Bearer one") == 0 && keys_match(&k, "Bearer two") == 1);
    cr_expect_eq(keys_match(&k, "Bearer one\r"), -1);
    keys_free(&k);
    tc_write(path, "\n\r\n\n", 4);
    cr_assert_eq(keys_add_file(&k, path, &e), -1);
    cr_expect(strstr(e.msg, "no key in it"), "%s", e.msg);
    snprintf(path, sizeof path, "%s/absent", dir);
    cr_assert_eq(keys_add_file(&k, path, &e), -1);
    cr_expect(strstr(e.msg, "absent"), "%s", e.msg);
    keys_free(&k);
    tc_rm_rf(dir);
    free(dir);
}
