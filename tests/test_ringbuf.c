// test_ringbuf.c: the skip-end ring and the residency plan, on the CPU. Randomised, seeded property tests
// check every allocation against a shadow model of the live slabs (no straddling, no overlap, alignment,
// FIFO retirement, no retirement beyond need) and every plan against its invariants (layout inside the
// budget, ring of two slots, two slabs live at every step, resident bytes maximal, minimum budget exact);
// fixed cases cover a ring that the streamed layers do not divide evenly, --stream-all, mixed sizes that
// need padding, a Llama-70B-shaped model, and degenerate inputs.
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../ringbuf.h"
#include "common.h"

// ---- helpers
static uint64_t trb_range(uint64_t lo, uint64_t hi) { return lo + tc_next() % (hi - lo + 1); }  // [lo, hi]

// The live slabs as the test sees them: FIFO by seq.
typedef struct {
    uint64_t off[RB_MAX_SLOTS], fp[RB_MAX_SLOTS];
    int64_t seq[RB_MAX_SLOTS];
    int slot[RB_MAX_SLOTS];
    int n;
    uint64_t head;  // where the previous slab ended
} trb_shadow;

static void trb_shadow_pop(trb_shadow *s) {
    memmove(s->off, s->off + 1, (size_t)(s->n - 1) * sizeof s->off[0]);
    memmove(s->fp, s->fp + 1, (size_t)(s->n - 1) * sizeof s->fp[0]);
    memmove(s->seq, s->seq + 1, (size_t)(s->n - 1) * sizeof s->seq[0]);
    memmove(s->slot, s->slot + 1, (size_t)(s->n - 1) * sizeof s->slot[0]);
    s->n--;
}

static int trb_overlap(uint64_t a, uint64_t an, uint64_t b, uint64_t bn) { return a < b + bn && b < a + an; }

// Allocates `bytes` and checks the result against the shadow, which it then updates.
static rb_alloc trb_alloc_checked(rb_ring *r, trb_shadow *s, uint64_t bytes) {
    rb_alloc a;
    dj_err e = {{0}};
    cr_assert_eq(rb_ring_alloc(r, bytes, &a, &e), 0, "alloc %llu in ring %llu: %s", (unsigned long long)bytes,
                 (unsigned long long)r->size, e.msg);
    uint64_t fp = (bytes + r->align - 1) / r->align * r->align;
    cr_assert_eq(a.off % r->align, 0, "offset %llu not aligned to %llu", (unsigned long long)a.off,
                 (unsigned long long)r->align);
    cr_assert(a.off + fp <= r->size, "slab [%llu, +%llu) straddles the end of %llu", (unsigned long long)a.off,
              (unsigned long long)fp, (unsigned long long)r->size);
    // Skip-end: at the previous end if it fits, else at 0.
    uint64_t want = s->head + fp <= r->size ? s->head : 0;
    cr_assert_eq(a.off, want, "placed at %llu, expected %llu", (unsigned long long)a.off, (unsigned long long)want);
    cr_assert_eq(a.skipped, want != s->head);
    // FIFO: what was retired is exactly the oldest slabs up to wait_seq.
    int retired = 0;
    int64_t last = -1;
    int last_slot = -1;
    while (s->n > 0 && s->seq[0] <= a.wait_seq) {
        last = s->seq[0];
        last_slot = s->slot[0];
        trb_shadow_pop(s);
        retired++;
    }
    cr_assert_eq(last, a.wait_seq, "wait_seq %lld is not a live slab", (long long)a.wait_seq);
    if (a.wait_seq >= 0) cr_assert_eq(a.wait_slot, last_slot);
    else cr_assert_eq(a.wait_slot, -1);
    // Nothing live overlaps the new slab...
    for (int i = 0; i < s->n; i++) {
        cr_assert(!trb_overlap(a.off, fp, s->off[i], s->fp[i]), "slab seq %lld [%llu,+%llu) overlaps live seq %lld [%llu,+%llu)",
                  (long long)a.seq, (unsigned long long)a.off, (unsigned long long)fp, (long long)s->seq[i],
                  (unsigned long long)s->off[i], (unsigned long long)s->fp[i]);
    }
    // (that nothing was retired without need is checked by ringbuf_ring.retires_only_what_overlaps)
    cr_assert(retired == 0 || a.wait_seq >= 0);
    cr_assert(s->n < r->cap);
    for (int i = 0; i < s->n; i++) cr_assert_neq(s->slot[i], a.slot, "slot %d reused while live", a.slot);
    cr_assert(a.slot >= 0 && a.slot < r->cap);
    s->off[s->n] = a.off;
    s->fp[s->n] = fp;
    s->seq[s->n] = a.seq;
    s->slot[s->n] = a.slot;
    s->n++;
    s->head = a.off + fp;
    cr_assert_eq(a.live, s->n, "live %d, shadow %d", a.live, s->n);
    cr_assert_eq(rb_ring_live(r), s->n);
    return a;
}

static void trb_assert_plan(const rb_plan *p, const uint64_t *sizes, int n, uint64_t budget, uint64_t reserve,
                            uint64_t align, int stream_all) {
    uint64_t room = budget - reserve, total = 0, next = 0, streamed = 0, max_fp = 0;
    int k = 0, n_res = 0;
    for (int u = 0; u < n; u++) total += (sizes[u] + align - 1) / align * align;
    cr_assert_eq(p->n, n);
    for (int u = 0; u < n; u++) {
        uint64_t fp = (sizes[u] + align - 1) / align * align;
        cr_assert(p->footprint[u] >= fp && p->footprint[u] % align == 0);
        if (p->resident[u]) {
            cr_assert_eq(p->footprint[u], fp);
            cr_assert_eq(p->offset[u], next, "resident unit %d at %llu, expected packed at %llu", u,
                         (unsigned long long)p->offset[u], (unsigned long long)next);
            next += fp;
            n_res++;
        } else {
            cr_assert_eq(p->offset[u], UINT64_MAX);
            cr_assert_eq(p->stream_order[k], u, "stream_order[%d] = %d, expected %d", k, p->stream_order[k], u);
            k++;
            streamed += sizes[u];
            max_fp = p->footprint[u] > max_fp ? p->footprint[u] : max_fp;
            if (p->padded) cr_assert_eq(p->footprint[u], p->slot_bytes);
        }
    }
    cr_assert_eq(n_res, p->n_resident);
    cr_assert_eq(k, p->n_streamed);
    cr_assert_eq(p->n_resident + p->n_streamed, n);
    cr_assert_eq(p->resident_bytes, next);
    cr_assert_eq(p->ring_off, next, "ring must start after the residents: disjoint");
    cr_assert_eq(p->streamed_bytes, streamed);
    cr_assert_eq(p->ring_off % align, 0);
    cr_assert_eq(p->ring_size % align, 0);
    cr_assert_eq(p->weight_bytes, p->ring_off + p->ring_size);
    cr_assert(p->weight_bytes <= room, "weights %llu exceed budget %llu - reserve %llu",
              (unsigned long long)p->weight_bytes, (unsigned long long)budget, (unsigned long long)reserve);
    if (stream_all) cr_assert_eq(p->n_resident, 0);
    if (!stream_all && total <= room) cr_assert_eq(p->n_streamed, 0, "everything fits, yet units stream");
    if (p->n_streamed == 0) {
        cr_assert_eq(p->ring_size, 0);
        return;
    }
    cr_assert_eq(p->slot_bytes, max_fp);
    cr_assert(p->ring_size >= 2 * p->slot_bytes, "ring %llu below two slots of %llu", (unsigned long long)p->ring_size,
              (unsigned long long)p->slot_bytes);
    cr_assert(p->slots >= 2 && p->slots <= RB_MAX_SLOTS);
    cr_assert(p->min_live >= 2 && p->max_live >= p->min_live && p->max_live <= p->slots);
    if (stream_all) return;
    // Maximal: no streamed unit can become resident while the ring keeps two slots of what still streams.
    for (int i = 0; i < p->n_streamed && p->n_streamed > 1; i++) {
        int u = p->stream_order[i];
        uint64_t slot = 0;
        for (int j = 0; j < p->n_streamed; j++) {
            int v = p->stream_order[j];
            uint64_t fp = (sizes[v] + align - 1) / align * align;
            if (v != u && fp > slot) slot = fp;
        }
        uint64_t fpu = (sizes[u] + align - 1) / align * align;
        cr_assert(p->resident_bytes + fpu + 2 * slot > room, "unit %d could also be resident", u);
    }
}

// Drives the plan's ring for `cycles` tokens as the engine would; every step but the first must keep its
// predecessor live (copy of the next unit overlaps compute of the current one).
static void trb_run_plan(const rb_plan *p, int cycles) {
    rb_ring r;
    dj_err e = {{0}};
    cr_assert_eq(rb_ring_init(&r, p->ring_size, p->align, p->slots, &e), 0, "%s", e.msg);
    trb_shadow s;
    memset(&s, 0, sizeof s);
    for (int c = 0; c < cycles; c++) {
        for (int k = 0; k < p->n_streamed; k++) {
            rb_alloc a = trb_alloc_checked(&r, &s, p->footprint[p->stream_order[k]]);
            if (a.seq > 0) {
                cr_assert(a.live >= 2, "token %d unit %d: only %d live (copy cannot overlap compute)", c,
                          p->stream_order[k], a.live);
                cr_assert(a.wait_seq < a.seq - 1);
            }
            cr_assert(p->ring_off + a.off + p->footprint[p->stream_order[k]] <= p->weight_bytes);
        }
    }
}

static double trb_gb_up(uint64_t b) { return ceil((double)b / 1e7) / 100; }

// The plan must fail just below the minimum, naming the minimum, and succeed at it.
static void trb_assert_min_exact(const uint64_t *sizes, int n, uint64_t reserve, uint64_t align, int stream_all) {
    uint64_t min;
    dj_err e = {{0}};
    cr_assert_eq(rb_min_budget(sizes, n, reserve, align, stream_all, &min, &e), 0, "%s", e.msg);
    static rb_plan p;
    cr_assert_eq(rb_plan_make(&p, sizes, n, min, reserve, align, stream_all, &e), 0, "minimum %llu fails: %s",
                 (unsigned long long)min, e.msg);
    cr_assert_eq(p.min_budget, min);
    char want[64];
    snprintf(want, sizeof want, "needs at least %.2f GB", trb_gb_up(min));
    uint64_t below[2] = {min - 1, min > align ? min - align : 0};
    for (int i = 0; i < 2; i++) {
        memset(&e, 0, sizeof e);
        cr_assert_eq(rb_plan_make(&p, sizes, n, below[i], reserve, align, stream_all, &e), -1, "budget %llu below minimum %llu accepted",
                     (unsigned long long)below[i], (unsigned long long)min);
        cr_assert(strncmp(e.msg, "--ring-gb ", 10) == 0, "message: %s", e.msg);
        cr_assert(strstr(e.msg, want) != NULL, "message '%s' lacks '%s'", e.msg, want);
    }
}

// ---- ring
Test(ringbuf_ring, random_invariants) {
    tc_rng_seed(12345);
    for (int t = 0; t < 2000; t++) {
        uint64_t align = 1ull << trb_range(0, 12);
        uint64_t size = trb_range(1, 64) * align + (trb_range(0, 1) ? trb_range(0, align - 1) : 0);
        int cap = (int)trb_range(1, RB_MAX_SLOTS);
        rb_ring r;
        dj_err e = {{0}};
        cr_assert_eq(rb_ring_init(&r, size, align, cap, &e), 0, "%s", e.msg);
        cr_assert_eq(r.size % align, 0);
        cr_assert(r.size <= size);
        trb_shadow s;
        memset(&s, 0, sizeof s);
        int mode = (int)trb_range(0, 2);  // 0: any size; 1: small slabs; 2: few distinct sizes
        uint64_t few[3] = {trb_range(1, r.size), trb_range(1, r.size), trb_range(1, r.size / 2 + 1)};
        for (int k = 0; k < 300; k++) {
            if (trb_range(0, 9) == 0) {  // explicit FIFO free
                int64_t want = s.n ? s.seq[0] : -1;
                cr_assert_eq(rb_ring_free(&r), want);
                if (s.n) trb_shadow_pop(&s);
                continue;
            }
            uint64_t b = mode == 0 ? trb_range(1, r.size)
                       : mode == 1 ? trb_range(1, r.size / 4 + 1)
                                   : few[trb_range(0, 2)];
            trb_alloc_checked(&r, &s, b);
        }
    }
}

// Retirement is minimal: replay each allocation and check that the newest retired slab overlapped the new
// one, unless the ring was out of slot records.
Test(ringbuf_ring, retires_only_what_overlaps) {
    tc_rng_seed(777);
    for (int t = 0; t < 500; t++) {
        uint64_t align = 1ull << trb_range(0, 6);
        rb_ring r;
        cr_assert_eq(rb_ring_init(&r, trb_range(1, 40) * align, align, (int)trb_range(1, RB_MAX_SLOTS), NULL), 0);
        uint64_t off[2000], fp[2000];
        for (int k = 0; k < 200; k++) {
            int before = rb_ring_live(&r);
            uint64_t b = trb_range(1, r.size);
            rb_alloc a;
            cr_assert_eq(rb_ring_alloc(&r, b, &a, NULL), 0);
            off[k] = a.off;
            fp[k] = (b + align - 1) / align * align;
            if (a.wait_seq >= 0) {
                int full = before == r.cap && a.wait_seq == a.seq - before;  // only the oldest, for a record
                cr_assert(full || trb_overlap(a.off, fp[k], off[a.wait_seq], fp[a.wait_seq]),
                          "retired seq %lld without overlap", (long long)a.wait_seq);
            }
        }
    }
}

// 3 layers streaming through a ring of 2.5 slots: token t places them at 0, s, 0 and token t+1 at s, 0, s;
// the placement repeats every two tokens and every step keeps its predecessor live.
Test(ringbuf_ring, uneven_three_layers_in_two_and_a_half_slots) {
    const uint64_t s = 40960;
    rb_ring r;
    dj_err e = {{0}};
    cr_assert_eq(rb_ring_init(&r, s * 5 / 2, 4096, 8, &e), 0, "%s", e.msg);
    trb_shadow sh;
    memset(&sh, 0, sizeof sh);
    uint64_t offs[1000][3];
    for (int c = 0; c < 1000; c++) {
        for (int k = 0; k < 3; k++) {
            rb_alloc a = trb_alloc_checked(&r, &sh, s);
            offs[c][k] = a.off;
            if (a.seq > 0) {
                cr_assert_eq(a.live, 2, "token %d layer %d: %d live", c, k, a.live);
                cr_assert_eq(a.wait_seq, a.seq - 2);
            }
        }
    }
    const uint64_t even[3] = {0, s, 0}, odd[3] = {s, 0, s};
    for (int c = 0; c < 1000; c++) {
        for (int k = 0; k < 3; k++) cr_assert_eq(offs[c][k], (c % 2 ? odd : even)[k], "token %d layer %d", c, k);
    }
}

Test(ringbuf_ring, errors) {
    rb_ring r;
    dj_err e = {{0}};
    cr_assert_eq(rb_ring_init(&r, 1 << 20, 0, 4, &e), -1);
    cr_assert(strstr(e.msg, "power of two"), "%s", e.msg);
    cr_assert_eq(rb_ring_init(&r, 1 << 20, 3, 4, &e), -1);
    cr_assert_eq(rb_ring_init(&r, 1 << 20, 4096, 0, &e), -1);
    cr_assert_eq(rb_ring_init(&r, 1 << 20, 4096, RB_MAX_SLOTS + 1, &e), -1);
    cr_assert_eq(rb_ring_init(&r, 4095, 4096, 4, &e), -1);
    cr_assert_eq(rb_ring_init(&r, 0, 1, 4, &e), -1);
    cr_assert_eq(rb_ring_init(&r, 3 * 4096 + 5, 4096, 4, &e), 0);
    cr_assert_eq(r.size, 3 * 4096);
    rb_alloc a;
    cr_assert_eq(rb_ring_alloc(&r, 0, &a, &e), -1);
    cr_assert(strstr(e.msg, "0 bytes"), "%s", e.msg);
    cr_assert_eq(rb_ring_alloc(&r, 3 * 4096 + 1, &a, &e), -1);
    cr_assert(strstr(e.msg, "does not fit"), "%s", e.msg);
    cr_assert_eq(rb_ring_live(&r), 0);
    cr_assert_eq(rb_ring_free(&r), -1);
    cr_assert_eq(rb_ring_alloc(&r, 3 * 4096, &a, &e), 0);  // exactly the ring
    cr_assert_eq(a.off, 0);
    cr_assert_eq(rb_ring_alloc(&r, 1, &a, &e), 0);
    cr_assert_eq(a.off, 0);
    cr_assert(a.skipped);
    cr_assert_eq(a.wait_seq, 0);
    cr_assert_eq(a.live, 1);
    rb_ring_reset(&r);
    cr_assert_eq(rb_ring_live(&r), 0);
    cr_assert_eq(rb_ring_alloc(&r, 1, &a, &e), 0);
    cr_assert_eq(a.seq, 0);
    cr_assert_eq(rb_ring_slots_for(10, 3), 3);
    cr_assert_eq(rb_ring_slots_for(2, 3), 1);
    cr_assert_eq(rb_ring_slots_for(1ull << 40, 1), RB_MAX_SLOTS);
}

// ---- plan
Test(ringbuf_plan, random_invariants) {
    tc_rng_seed(4242);
    static uint64_t sizes[RB_MAX_UNITS];
    static rb_plan p;
    int planned = 0, failed = 0, streaming = 0, padded = 0;
    for (int t = 0; t < 3000; t++) {
        int n = trb_range(0, 20) == 0 ? (int)trb_range(1, RB_MAX_UNITS) : (int)trb_range(1, 40);
        uint64_t align = 1ull << trb_range(0, 16);
        int mode = (int)trb_range(0, 2);  // 0: equal layers + head; 1: random; 2: two sizes
        uint64_t layer = trb_range(1, 1 << 22), head = trb_range(1, 1 << 23);
        for (int u = 0; u < n; u++) {
            sizes[u] = mode == 0 ? (u == n - 1 ? head : layer)
                     : mode == 1 ? trb_range(1, 1 << 22)
                                 : (trb_range(0, 1) ? layer : head);
        }
        uint64_t reserve = trb_range(0, 3) ? 0 : trb_range(1, 1 << 24);
        int stream_all = trb_range(0, 3) == 0;
        uint64_t min, total = 0;
        dj_err e = {{0}};
        cr_assert_eq(rb_min_budget(sizes, n, reserve, align, stream_all, &min, &e), 0, "%s", e.msg);
        for (int u = 0; u < n; u++) total += (sizes[u] + align - 1) / align * align;
        uint64_t budget = trb_range(min / 2, reserve + total + total / 4 + 2 * align);
        int rc = rb_plan_make(&p, sizes, n, budget, reserve, align, stream_all, &e);
        if (budget < min) {
            cr_assert_eq(rc, -1, "budget %llu below minimum %llu accepted", (unsigned long long)budget, (unsigned long long)min);
            cr_assert(strstr(e.msg, "is too small: this model needs at least"), "%s", e.msg);
            failed++;
            continue;
        }
        cr_assert_eq(rc, 0, "case %d: %s", t, e.msg);
        planned++;
        trb_assert_plan(&p, sizes, n, budget, reserve, align, stream_all);
        if (p.n_streamed) {
            streaming++;
            padded += p.padded;
            trb_run_plan(&p, n > 64 ? 3 : 12);
        }
        if (t % 10 == 0 && n <= 64) trb_assert_min_exact(sizes, n, reserve, align, stream_all);
    }
    // The generator must exercise every branch, or the test proves less than it claims.
    cr_assert(planned > 1000 && failed > 100 && streaming > 500 && padded > 0, "planned %d failed %d streaming %d padded %d",
              planned, failed, streaming, padded);
}

// Equal layers and a head: the plan keeps the most bytes resident, compared with every (head resident or
// not, k layers resident) choice.
Test(ringbuf_plan, optimal_for_layers_and_head) {
    tc_rng_seed(99);
    static uint64_t sizes[RB_MAX_UNITS];
    static rb_plan p;
    for (int t = 0; t < 2000; t++) {
        int L = (int)trb_range(1, 60);
        uint64_t align = 4096, layer = trb_range(1, 64) * align, head = trb_range(1, 160) * align;
        for (int u = 0; u < L; u++) sizes[u] = layer;
        sizes[L] = head;
        uint64_t total = (uint64_t)L * layer + head;
        uint64_t budget = trb_range(0, total + layer);
        uint64_t best = 0;
        int feasible = 0;
        if (total <= budget) {
            best = total;
            feasible = 1;
        }
        for (int h = 0; h <= 1; h++) {
            for (int k = 0; k <= L; k++) {
                if (h && k == L) continue;  // nothing would stream
                uint64_t res = h * head + (uint64_t)k * layer;
                uint64_t M = k < L ? layer : 0;
                if (!h && head > M) M = head;
                if (res + 2 * M <= budget) {
                    feasible = 1;
                    best = res > best ? res : best;
                }
            }
        }
        dj_err e = {{0}};
        int rc = rb_plan_make(&p, sizes, L + 1, budget, 0, align, 0, &e);
        cr_assert_eq(rc, feasible ? 0 : -1, "L %d layer %llu head %llu budget %llu: %s", L, (unsigned long long)layer,
                     (unsigned long long)head, (unsigned long long)budget, e.msg);
        if (!feasible) continue;
        cr_assert_eq(p.resident_bytes, best, "L %d layer %llu head %llu budget %llu: resident %llu, best %llu", L,
                     (unsigned long long)layer, (unsigned long long)head, (unsigned long long)budget,
                     (unsigned long long)p.resident_bytes, (unsigned long long)best);
        trb_assert_plan(&p, sizes, L + 1, budget, 0, align, 0);
        // Equal streamed slabs keep two live in a ring of two slots without padding; a streamed head of
        // another size may need it (8 layers of 44 and a head of 34 through a ring of 104 do).
        int mixed = 0;
        for (int k = 1; k < p.n_streamed; k++) mixed |= sizes[p.stream_order[k]] != sizes[p.stream_order[0]];
        if (!mixed) cr_assert_eq(p.padded, 0);
        if (p.n_streamed) trb_run_plan(&p, 4);
    }
}

// A model whose streamed layers do not divide the ring: 6 layers and a head, all of s, in a budget of
// 6.5 s. The head and three layers stay (4 s); the other three, every second one (rb_spread), cycle through a
// ring of 2.5 slots for many tokens.
Test(ringbuf_plan, layers_do_not_divide_ring) {
    const uint64_t s = 10 * 4096;
    uint64_t sizes[7] = {s, s, s, s, s, s, s};
    static rb_plan p;
    dj_err e = {{0}};
    cr_assert_eq(rb_plan_make(&p, sizes, 7, s * 13 / 2, 0, 4096, 0, &e), 0, "%s", e.msg);
    cr_assert_eq(p.n_streamed, 3);
    for (int u = 0; u < 6; u++) cr_assert_eq(p.resident[u], u % 2 == 0, "layer %d", u);
    cr_assert(p.resident[6], "the head should be resident");
    cr_assert_eq(p.stream_order[0], 1);
    cr_assert_eq(p.ring_size, s * 5 / 2);
    cr_assert_eq(p.slot_bytes, s);
    cr_assert_eq(p.slots, 2);
    cr_assert_eq(p.min_live, 2);
    cr_assert_eq(rb_plan_next(&p, 0), 1);
    cr_assert_eq(rb_plan_next(&p, 1), 3);
    cr_assert_eq(rb_plan_next(&p, 4), 5);
    cr_assert_eq(rb_plan_next(&p, 5), 1);  // the next token's first streamed layer
    cr_assert_eq(rb_plan_next(&p, 6), 1);
    trb_assert_plan(&p, sizes, 7, s * 13 / 2, 0, 4096, 0);
    trb_run_plan(&p, 1000);
}

// The streamed layers of one size are spread evenly among the resident ones (rb_spread): the resident runs before
// and between streamed layers differ by at most one layer, the last layer streams, and the plan stays maximal and
// packed (trb_assert_plan). Llama-3-8B-shaped q4 (32 layers of 122.7 MB and a 558 MB head) at 1-4 GB.
Test(ringbuf_plan, streamed_layers_spread) {
    static uint64_t sizes[33];
    for (int u = 0; u < 32; u++) sizes[u] = 122716160ull;
    sizes[32] = 558219264ull;
    static rb_plan p;
    dj_err e = {{0}};
    int mixed = 0;
    for (double gb = 1.0; gb <= 4.0; gb += 0.25) {
        cr_assert_eq(rb_plan_make(&p, sizes, 33, rb_gb_bytes(gb), 0, 4096, 0, &e), 0, "%s", e.msg);
        int k = 0;
        for (int u = 0; u < 32; u++) k += !p.resident[u];
        if (k == 0 || k == 32) continue;
        mixed++;
        cr_assert(!p.resident[31], "%.2f GB: the last layer streams", gb);
        int run = 0, lo = 33, hi = -1;
        for (int u = 0; u < 32; u++) {
            if (p.resident[u]) {
                run++;
                continue;
            }
            lo = run < lo ? run : lo, hi = run > hi ? run : hi, run = 0;
        }
        cr_assert(hi - lo <= 1, "%.2f GB: resident runs of %d to %d layers before streamed ones", gb, lo, hi);
        trb_assert_plan(&p, sizes, 33, rb_gb_bytes(gb), 0, 4096, 0);
    }
    cr_assert_geq(mixed, 8, "budgets of 1-4 GB keep some layers resident and stream others");
}

Test(ringbuf_plan, stream_all) {
    const uint64_t s = 8 * 4096;
    uint64_t sizes[5] = {s, s, s, s, 3 * 4096};  // 4 layers, a small head
    static rb_plan p;
    dj_err e = {{0}};
    uint64_t min;
    cr_assert_eq(rb_min_budget(sizes, 5, 0, 4096, 1, &min, &e), 0);
    cr_assert_eq(min, 2 * s);
    // Even a budget that holds the whole model streams everything.
    cr_assert_eq(rb_plan_make(&p, sizes, 5, 100 * s, 0, 4096, 1, &e), 0, "%s", e.msg);
    cr_assert_eq(p.n_resident, 0);
    cr_assert_eq(p.n_streamed, 5);
    cr_assert_eq(p.ring_off, 0);
    cr_assert_eq(p.streamed_bytes, 4 * s + 3 * 4096);
    trb_assert_plan(&p, sizes, 5, 100 * s, 0, 4096, 1);
    trb_run_plan(&p, 200);
    // Without the flag the same budget keeps everything resident and streams nothing.
    cr_assert_eq(rb_plan_make(&p, sizes, 5, 100 * s, 0, 4096, 0, &e), 0, "%s", e.msg);
    cr_assert_eq(p.n_streamed, 0);
    cr_assert_eq(p.weight_bytes, 4 * s + 3 * 4096);
    trb_assert_min_exact(sizes, 5, 0, 4096, 1);
    trb_assert_min_exact(sizes, 5, 12345, 4096, 1);
}

// Sizes 2, 4, 4 (x4096) in a ring of 8: the third slab skips to 0 over the second, so with true sizes a copy
// could not overlap its predecessor's compute. The plan pads every streamed slab to a full slot instead.
Test(ringbuf_plan, mixed_sizes_padded) {
    const uint64_t k = 4096;
    uint64_t sizes[3] = {2 * k, 4 * k, 4 * k};
    static rb_plan p;
    dj_err e = {{0}};
    cr_assert_eq(rb_plan_make(&p, sizes, 3, 8 * k, 0, k, 1, &e), 0, "%s", e.msg);
    cr_assert_eq(p.padded, 1);
    cr_assert_eq(p.footprint[0], 4 * k);
    trb_assert_plan(&p, sizes, 3, 8 * k, 0, k, 1);
    trb_run_plan(&p, 500);
    // The unpadded ring really does lose the overlap.
    rb_ring r;
    cr_assert_eq(rb_ring_init(&r, 8 * k, k, 8, NULL), 0);
    int min_live = 99;
    for (int c = 0; c < 10; c++) {
        for (int u = 0; u < 3; u++) {
            rb_alloc a;
            cr_assert_eq(rb_ring_alloc(&r, sizes[u], &a, NULL), 0);
            if (a.seq > 0 && a.live < min_live) min_live = a.live;
        }
    }
    cr_assert_eq(min_live, 1);
    // A roomier budget lets the true sizes keep two live without padding.
    cr_assert_eq(rb_plan_make(&p, sizes, 3, 10 * k, 0, k, 1, &e), 0, "%s", e.msg);
    cr_assert_eq(p.padded, 0);
    trb_run_plan(&p, 500);
}

// Llama-3-70B-shaped, bf16: 80 layers of ~1.71 GB and a 2.10 GB head. At 24 GB the head and 10 layers stay
// resident; the minimum streams the head too (two head-sized slots, 4.21 GB) and the error says so.
Test(ringbuf_plan, llama70b_shape) {
    const uint64_t align = 4096;
    const uint64_t layer = 1711276032ull;  // 417792 * 4096
    const uint64_t head = 2101346304ull + 16384;
    static uint64_t sizes[81];
    for (int u = 0; u < 80; u++) sizes[u] = layer;
    sizes[80] = head;
    uint64_t hfp = (head + align - 1) / align * align;
    static rb_plan p;
    dj_err e = {{0}};
    cr_assert_eq(rb_plan_make(&p, sizes, 81, rb_gb_bytes(24), 0, align, 0, &e), 0, "%s", e.msg);
    cr_assert(p.resident[80]);
    cr_assert_eq(p.n_resident, 11);
    for (int u = 0; u < 80; u++)  // every eighth layer resident from layer 6, spread (rb_spread)
        cr_assert_eq(p.resident[u], u % 8 == 6, "layer %d", u);
    cr_assert_eq(p.slot_bytes, layer);
    cr_assert_eq(p.streamed_bytes, 70 * layer);
    cr_assert_eq(p.resident_bytes, hfp + 10 * layer);
    trb_assert_plan(&p, sizes, 81, rb_gb_bytes(24), 0, align, 0);
    trb_run_plan(&p, 5);

    uint64_t min;
    cr_assert_eq(rb_min_budget(sizes, 81, 0, align, 0, &min, &e), 0);
    cr_assert_eq(min, 2 * hfp);
    cr_assert_eq(rb_plan_make(&p, sizes, 81, rb_gb_bytes(3.2), 0, align, 0, &e), -1);
    cr_assert_str_eq(e.msg, "--ring-gb 3.20 is too small: this model needs at least 4.21 GB (two 2.11 GB streaming slots)");
    cr_assert_eq(rb_plan_make(&p, sizes, 81, rb_gb_bytes(4.21), 0, align, 0, &e), 0, "%s", e.msg);
    cr_assert_eq(p.n_resident, 0);
    cr_assert_eq(rb_plan_make(&p, sizes, 81, rb_gb_bytes(2), rb_gb_bytes(0.5), align, 0, &e), -1);
    cr_assert_str_eq(e.msg, "--ring-gb 2.00 is too small: this model needs at least 4.71 GB (two 2.11 GB streaming slots "
                            "+ 0.50 GB reserved)");
    trb_assert_min_exact(sizes, 81, 0, align, 0);
    trb_assert_min_exact(sizes, 81, rb_gb_bytes(0.3), align, 0);
}

// A head so large that the cheapest plan keeps it resident: the message names the resident part.
Test(ringbuf_plan, message_names_resident_part) {
    uint64_t sizes[3] = {rb_gb_bytes(1), rb_gb_bytes(1), rb_gb_bytes(5)};
    static rb_plan p;
    dj_err e = {{0}};
    cr_assert_eq(rb_plan_make(&p, sizes, 3, rb_gb_bytes(1), 0, 1, 0, &e), -1);
    cr_assert_str_eq(e.msg, "--ring-gb 1.00 is too small: this model needs at least 7.00 GB (two 1.00 GB streaming "
                            "slots + 5.00 GB resident)");
    trb_assert_min_exact(sizes, 3, 0, 1, 0);
    // One unit: streaming it would need two slots, so the minimum is the unit itself, resident.
    cr_assert_eq(rb_plan_make(&p, sizes, 1, rb_gb_bytes(0.5), 0, 1, 0, &e), -1);
    cr_assert_str_eq(e.msg, "--ring-gb 0.50 is too small: this model needs at least 1.00 GB (the whole model resident, "
                            "1.00 GB)");
    trb_assert_min_exact(sizes, 1, 0, 1, 0);
}

Test(ringbuf_plan, degenerate_inputs) {
    static rb_plan p;
    uint64_t sizes[4] = {4096, 4096, 0, 4096};
    uint64_t min;
    dj_err e = {{0}};
    cr_assert_eq(rb_plan_make(&p, sizes, 0, 1 << 30, 0, 4096, 0, &e), -1);
    cr_assert(strstr(e.msg, "0 units"), "%s", e.msg);
    cr_assert_eq(rb_plan_make(&p, NULL, 0, 1 << 30, 0, 4096, 0, &e), -1);
    cr_assert_eq(rb_plan_make(&p, sizes, -1, 1 << 30, 0, 4096, 0, &e), -1);
    cr_assert_eq(rb_plan_make(&p, sizes, RB_MAX_UNITS + 1, 1 << 30, 0, 4096, 0, &e), -1);
    cr_assert_eq(rb_min_budget(sizes, 0, 0, 4096, 0, &min, &e), -1);
    cr_assert_eq(rb_plan_make(&p, sizes, 4, 1 << 30, 0, 4096, 0, &e), -1);
    cr_assert(strstr(e.msg, "unit 2 has size 0"), "%s", e.msg);
    cr_assert_eq(rb_plan_make(&p, sizes, 2, 1 << 30, 0, 0, 0, &e), -1);
    cr_assert(strstr(e.msg, "power of two"), "%s", e.msg);
    cr_assert_eq(rb_plan_make(&p, sizes, 2, 1 << 30, 0, 6144, 0, &e), -1);
    // A budget smaller than one slab, and none at all.
    cr_assert_eq(rb_plan_make(&p, sizes, 2, 100, 0, 4096, 0, &e), -1);
    cr_assert(strstr(e.msg, "needs at least 0.01 GB"), "%s", e.msg);
    cr_assert_eq(rb_plan_make(&p, sizes, 2, 0, 0, 4096, 1, &e), -1);
    cr_assert(strstr(e.msg, "--ring-gb 0.00 is too small"), "%s", e.msg);
    // A reserve larger than the budget, and sizes that overflow.
    cr_assert_eq(rb_plan_make(&p, sizes, 2, 1 << 20, 1 << 21, 4096, 0, &e), -1);
    cr_assert(strstr(e.msg, "too small"), "%s", e.msg);
    uint64_t huge[2] = {UINT64_MAX, 1};
    cr_assert_eq(rb_plan_make(&p, huge, 2, UINT64_MAX, 0, 4096, 0, &e), -1);
    cr_assert(strstr(e.msg, "overflow"), "%s", e.msg);
    uint64_t big[3] = {UINT64_MAX / 8, UINT64_MAX / 8, UINT64_MAX / 8};
    cr_assert_eq(rb_plan_make(&p, big, 3, UINT64_MAX, 0, 4096, 0, &e), -1);
    cr_assert_eq(rb_plan_make(&p, sizes, 2, 1 << 20, UINT64_MAX, 4096, 0, &e), -1);
    cr_assert(strstr(e.msg, "overflow"), "%s", e.msg);
    // No unit streams when everything fits: no ring, and no next streamed unit.
    cr_assert_eq(rb_plan_make(&p, sizes, 2, 1 << 20, 0, 4096, 0, &e), 0, "%s", e.msg);
    cr_assert_eq(p.ring_size, 0);
    cr_assert_eq(rb_plan_next(&p, 0), -1);
}

Test(ringbuf_plan, gb_bytes) {
    cr_assert_eq(rb_gb_bytes(3.51), 3510000000ull);
    cr_assert_eq(rb_gb_bytes(0.1), 100000000ull);
    cr_assert_eq(rb_gb_bytes(0), 0);
    cr_assert_eq(rb_gb_bytes(-1), 0);
    cr_assert_eq(rb_gb_bytes(NAN), 0);
    cr_assert_eq(rb_gb_bytes(1e30), UINT64_MAX);
}

// Ties and exact fits, found by comparing the planner with its off-by-one variants over every small plan: the budget
// a plan needs is named by streaming slots of the largest unit when a smaller slot with resident units costs the
// same; units that fill the room exactly stay resident; one unit more than RB_MAX_UNITS is refused.
Test(ringbuf_plan, ties_exact_fits_and_unit_count) {
    static rb_plan p;
    dj_err e = {{0}};
    uint64_t tie[3] = {rb_gb_bytes(2), rb_gb_bytes(1), rb_gb_bytes(1)};  // 2 x 2 GB = 2 GB resident + 2 x 1 GB
    cr_assert_eq(rb_plan_make(&p, tie, 3, rb_gb_bytes(1), 0, 1, 0, &e), -1);
    cr_assert_str_eq(e.msg, "--ring-gb 1.00 is too small: this model needs at least 4.00 GB (two 2.00 GB streaming "
                            "slots)");
    // {2, 2, 2, 1} in 6 bytes: a 2-byte layer resident beside two 2-byte slots fills the budget exactly
    uint64_t fit[4] = {2, 2, 2, 1};
    cr_assert_eq(rb_plan_make(&p, fit, 4, 6, 0, 1, 0, &e), 0, "%s", e.msg);
    uint64_t kept = 0;
    for (int u = 0; u < 4; u++) kept += p.resident[u] ? fit[u] : 0;
    cr_expect_eq(kept, 2, "resident bytes %llu of a budget of 6 (slot %llu)", (unsigned long long)kept,
                 (unsigned long long)p.slot_bytes);
    static uint64_t many[RB_MAX_UNITS + 1];
    for (int u = 0; u <= RB_MAX_UNITS; u++) many[u] = 4096;
    uint64_t min;
    cr_expect_eq(rb_plan_make(&p, many, RB_MAX_UNITS + 1, UINT64_MAX / 8, 0, 4096, 0, &e), -1);
    cr_expect_eq(rb_min_budget(many, RB_MAX_UNITS + 1, 0, 4096, 0, &min, &e), -1);
    cr_expect_eq(rb_min_budget(many, RB_MAX_UNITS, 0, 4096, 0, &min, &e), 0, "%s", e.msg);
}
