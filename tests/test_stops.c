// test_stops.c: the stop strings' hold-back (stops.c) on its own: text is emitted as soon as it cannot begin a stop
// string, a stop string split across pieces is caught and never emitted, and a piece of no bytes (a token that
// decodes to nothing) neither emits nor touches the empty buffer.
#include <criterion/criterion.h>
#include <string.h>

#include "../stops.h"

typedef struct {
    char out[256];
    size_t n;
    int calls, null_seen;
} emitted;

static int collect(void *ctx, const char *text, size_t n, dj_err *e) {
    emitted *x = ctx;
    x->calls++;
    if (!text) x->null_seen = 1;  // a NULL pointer, even with n == 0, is undefined behaviour for memcpy and friends
    if (text && n) memcpy(x->out + x->n, text, n), x->n += n;
    return 0;
}

Test(stops, nothing_held_and_nothing_new) {
    const char *stops[] = {"zz"};
    dj_held h = {0};
    emitted x = {0};
    dj_err e;
    cr_assert_eq(held_feed(&h, "", 0, stops, 1, collect, &x, &e), -1);
    cr_assert_eq(held_feed(&h, NULL, 0, stops, 1, collect, &x, &e), -1);
    cr_expect(!x.null_seen && x.n == 0, "emitted %zu bytes, NULL %d", x.n, x.null_seen);
    cr_assert_eq(held_feed(&h, "abz", 3, stops, 1, collect, &x, &e), -1);  // "z" may begin "zz": held
    cr_assert_eq(held_feed(&h, NULL, 0, stops, 1, collect, &x, &e), -1);
    cr_assert_eq(held_feed(&h, "z!", 2, stops, 1, collect, &x, &e), 0);
    x.out[x.n] = 0;
    cr_expect_str_eq(x.out, "ab");
    cr_expect(!x.null_seen);
    held_free(&h);
}

Test(stops, held_across_pieces) {
    const char *stops[] = {"END", "\n\n"};
    dj_held h = {0};
    emitted x = {0};
    dj_err e;
    const char *pieces[] = {"one E", "N", "o two\n", "three E", "ND four"};
    int hit = -1;
    for (size_t i = 0; i < 5 && hit < 0; i++) hit = held_feed(&h, pieces[i], strlen(pieces[i]), stops, 2, collect, &x, &e);
    x.out[x.n] = 0;
    cr_expect_eq(hit, 0);
    cr_expect_str_eq(x.out, "one ENo two\nthree ");
    held_free(&h);
}
