// ringbuf.c: the residency plan for a GPU budget and the skip-end ring that streams the rest (ringbuf.h).
#include "ringbuf.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "model.h"

_Static_assert(RB_MAX_UNITS == DJ_MAX_LAYERS + 1, "a unit per layer plus the head");

#define RB_SIM_CYCLES 256  // tokens simulated to find the ring's period (padded rings repeat within 65)

static int rb_pow2(uint64_t a) { return a != 0 && (a & (a - 1)) == 0; }

// ---- ring
int rb_ring_init(rb_ring *r, uint64_t size, uint64_t align, int cap, dj_err *e) {
    if (!rb_pow2(align)) return dj_fail(e, "ring: alignment %llu is not a power of two", (unsigned long long)align);
    if (cap < 1 || cap > RB_MAX_SLOTS) return dj_fail(e, "ring: %d slots, expected 1..%d", cap, RB_MAX_SLOTS);
    size -= size % align;
    if (size == 0) return dj_fail(e, "ring: no room (size below one alignment unit of %llu bytes)", (unsigned long long)align);
    memset(r, 0, sizeof *r);
    r->size = size;
    r->align = align;
    r->cap = cap;
    return 0;
}

void rb_ring_reset(rb_ring *r) {
    r->first = r->count = 0;
    r->head = 0;
    r->next_seq = 0;
}

int64_t rb_ring_free(rb_ring *r) {
    if (r->count == 0) return -1;
    int64_t seq = r->q[r->first].seq;
    r->first = (r->first + 1) % r->cap;
    r->count--;
    return seq;
}

// Whether [off, off+fp) meets a live slab. Live slabs were placed in sequence, so they cover either one
// run [oldest.off, head) (no wrap among them) or two, [oldest.off, end) and [0, head), after a wrap; a new
// slab starts at head or at 0, so testing against those runs is exact (a skipped tail gap is never hit first).
static int rb_overlaps_live(const rb_ring *r, uint64_t off, uint64_t fp) {
    if (r->count == 0) return 0;
    uint64_t oldest = r->q[r->first].off;
    uint64_t newest = r->q[(r->first + r->count - 1) % r->cap].off;
    if (oldest <= newest) return off < r->head && off + fp > oldest;
    return off < r->head || off + fp > oldest;
}

int rb_ring_alloc(rb_ring *r, uint64_t bytes, rb_alloc *out, dj_err *e) {
    if (bytes == 0) return dj_fail(e, "ring: slab of 0 bytes");
    if (bytes > r->size) {
        return dj_fail(e, "ring: slab of %llu bytes does not fit a ring of %llu bytes", (unsigned long long)bytes,
                       (unsigned long long)r->size);
    }
    uint64_t fp = dj_align_up(bytes, r->align);  // cannot overflow: bytes <= size, size aligned
    uint64_t off = r->head + fp <= r->size ? r->head : 0;
    out->skipped = off != r->head;
    out->wait_slot = -1;
    out->wait_seq = -1;
    while (r->count > 0 && (r->count == r->cap || rb_overlaps_live(r, off, fp))) {
        out->wait_slot = r->first;
        out->wait_seq = rb_ring_free(r);
    }
    int slot = (r->first + r->count) % r->cap;
    r->q[slot] = (rb_slab){.off = off, .fp = fp, .seq = r->next_seq};
    r->count++;
    r->head = off + fp;
    out->off = off;
    out->slot = slot;
    out->seq = r->next_seq++;
    out->live = r->count;
    return 0;
}

int rb_ring_slots_for(uint64_t ring_size, uint64_t fp) {
    uint64_t k = fp ? ring_size / fp : 1;
    if (k < 1) k = 1;
    if (k > RB_MAX_SLOTS) k = RB_MAX_SLOTS;
    return (int)k;
}

// ---- minimum budget
// For a streamed set whose largest footprint is M the ring needs 2*M, and every unit larger than M must be
// resident; streaming every unit no larger than M is then cheapest. So the minimum over all plans is the
// smaller of "everything resident" and min over footprints M of (sum of footprints > M) + 2*M.
typedef struct {
    uint64_t bytes;     // budget - reserve
    uint64_t slot;      // M (0 when all resident is cheapest)
    uint64_t resident;  // forced resident bytes
} rb_min;

static int rb_check_units(const uint64_t *sizes, int n, uint64_t align, uint64_t *fp, uint64_t *total, dj_err *e) {
    if (n < 1 || n > RB_MAX_UNITS) return dj_fail(e, "plan: %d units, expected 1..%d", n, RB_MAX_UNITS);
    if (!rb_pow2(align)) return dj_fail(e, "plan: alignment %llu is not a power of two", (unsigned long long)align);
    *total = 0;
    for (int i = 0; i < n; i++) {
        if (sizes[i] == 0) return dj_fail(e, "plan: unit %d has size 0", i);
        if (sizes[i] > UINT64_MAX / 4 - align) return dj_fail(e, "plan: unit %d size overflows", i);
        fp[i] = dj_align_up(sizes[i], align);
        if (dj_add_u64(*total, fp[i], total) || *total > UINT64_MAX / 4) return dj_fail(e, "plan: unit sizes overflow");
    }
    return 0;
}

static rb_min rb_min_of(const uint64_t *fp, int n, uint64_t total, int stream_all) {
    uint64_t max = 0;
    for (int i = 0; i < n; i++) max = fp[i] > max ? fp[i] : max;
    rb_min best = {.bytes = 2 * max, .slot = max, .resident = 0};
    if (stream_all) return best;
    for (int i = 0; i < n; i++) {
        uint64_t forced = 0;
        for (int j = 0; j < n; j++) forced += fp[j] > fp[i] ? fp[j] : 0;
        if (forced + 2 * fp[i] < best.bytes) best = (rb_min){.bytes = forced + 2 * fp[i], .slot = fp[i], .resident = forced};
    }
    if (total < best.bytes) best = (rb_min){.bytes = total, .slot = 0, .resident = 0};  // ties: name the slots
    return best;
}

int rb_min_budget(const uint64_t *sizes, int n, uint64_t reserve, uint64_t align, int stream_all, uint64_t *out,
                  dj_err *e) {
    uint64_t fp[RB_MAX_UNITS], total;
    if (rb_check_units(sizes, n, align, fp, &total, e)) return -1;
    rb_min m = rb_min_of(fp, n, total, stream_all);
    if (dj_add_u64(m.bytes, reserve, out)) return dj_fail(e, "plan: reserve of %llu bytes overflows", (unsigned long long)reserve);
    return 0;
}

uint64_t rb_gb_bytes(double gb) {
    if (!(gb > 0)) return 0;
    if (gb >= 9e9) return UINT64_MAX;  // 9e18 bytes: beyond any budget, and llround would overflow
    return (uint64_t)llround(gb * 1e9);
}

// GB with two decimals, rounded up (a minimum the user can pass back) or down (a budget shown below it).
static double rb_gb_up(uint64_t b) { return ceil((double)b / 1e7) / 100; }
static double rb_gb_down(uint64_t b) { return floor((double)b / 1e7) / 100; }

static int rb_too_small(uint64_t budget, uint64_t reserve, uint64_t min_total, rb_min m, dj_err *e) {
    char parts[200];
    int k;
    if (m.slot == 0) {
        k = snprintf(parts, sizeof parts, "the whole model resident, %.2f GB", rb_gb_up(m.bytes));
    } else {
        k = snprintf(parts, sizeof parts, "two %.2f GB streaming slots", rb_gb_up(m.slot));
        if (m.resident) k += snprintf(parts + k, sizeof parts - (size_t)k, " + %.2f GB resident", rb_gb_up(m.resident));
    }
    if (reserve) snprintf(parts + k, sizeof parts - (size_t)k, " + %.2f GB reserved", rb_gb_up(reserve));
    return dj_fail(e, "--ring-gb %.2f is too small: this model needs at least %.2f GB (%s)", rb_gb_down(budget),
                   rb_gb_up(min_total), parts);
}

// ---- residency choice
// Among units no larger than the slot M, fill `room` bytes first-fit in a preference order. Three orders are
// tried and the one keeping the most bytes resident wins (ties go to the earlier order):
//   0. the head first, then layers from the first: the head is needed every token and is, in Llama, the
//      largest unit, so keeping it shrinks the slot (and the ring).
//   1. layers from the first, the head last: better when the head is a little larger than what is left
//      but whole layers still fit (a head of 1.5 layers and room for 2 layers).
//   2. largest first: better for mixed sizes that orders 0 and 1 pack poorly.
static void rb_orders(const uint64_t *fp, int n, int idx[3][RB_MAX_UNITS]) {
    for (int i = 0; i < n; i++) {
        idx[0][i] = i == 0 ? n - 1 : i - 1;
        idx[1][i] = idx[2][i] = i;
    }
    for (int i = 1; i < n; i++) {  // stable insertion sort by footprint, largest first; once per plan
        int v = idx[2][i], j = i;
        for (; j > 0 && fp[idx[2][j - 1]] < fp[v]; j--) idx[2][j] = idx[2][j - 1];
        idx[2][j] = v;
    }
}

static uint64_t rb_fill(const uint64_t *fp, int n, uint64_t slot, uint64_t room, const int *idx, uint8_t *res) {
    uint64_t used = 0;
    for (int k = 0; k < n; k++) {
        int u = idx[k];
        if (fp[u] > slot || res[u]) continue;
        if (fp[u] <= room - used) {
            res[u] = 1;
            used += fp[u];
        }
    }
    return used;
}

// First-fit for a slot M can miss a unit that fits once it is resident, because moving it shrinks the slot
// (it was the only streamed unit of size M). Move such units, the head first, until none is left: then no
// single streamed unit can be made resident while the ring keeps two slots of what still streams.
static void rb_improve(const uint64_t *fp, int n, uint64_t room, uint8_t *res) {
    for (int changed = 1; changed;) {
        changed = 0;
        uint64_t kept = 0, max1 = 0, max2 = 0;  // resident bytes; largest and second largest streamed
        int n_max1 = 0, left = 0;
        for (int u = 0; u < n; u++) {
            if (res[u]) {
                kept += fp[u];
                continue;
            }
            left++;
            if (fp[u] > max1) {
                max2 = max1;
                max1 = fp[u];
                n_max1 = 1;
            } else if (fp[u] == max1) {
                n_max1++;
            } else if (fp[u] > max2) {
                max2 = fp[u];
            }
        }
        for (int k = 0; k < n && left > 1 && !changed; k++) {
            int u = k == 0 ? n - 1 : k - 1;
            if (res[u]) continue;
            uint64_t slot = fp[u] == max1 && n_max1 == 1 ? max2 : max1;
            if (kept + fp[u] + 2 * slot <= room) {
                res[u] = 1;
                changed = 1;
            }
        }
    }
}

// Which of the layers (units 0 .. n - 2; the head, n - 1, keeps its choice) of one footprint stream, once the count
// is set: evenly spaced, the last of them last (layer (j + 1) m / k - 1 of the m for j < k), rather than the run at
// the end that first-fit leaves. A copy can start only once the slab two back in a ring of two slots is done, so with
// the streamed layers in one run the link could copy only two of them beside the resident layers; spread, it copies
// each one's slab while the resident layers before it compute (H200, Llama-3-8B q4 at 4 GB, where layers 26-31
// streamed: the best fixed CPU share 7.51 -> 7.17 ms a token; bench/results/share_spread). Bytes, slot and ring are
// those of the choice it replaces.
static void rb_spread(const uint64_t *fp, int n, uint8_t *res) {
    for (int a = 0; a < n - 1; a++) {
        int first = 1, m = 0, k = 0;
        for (int u = 0; u < a && first; u++) first = fp[u] != fp[a];
        if (!first) continue;  // that footprint's layers done already
        for (int u = a; u < n - 1; u++) m += fp[u] == fp[a], k += fp[u] == fp[a] && !res[u];
        if (k == 0 || k == m) continue;
        for (int u = a, j = 0, i = 0; u < n - 1; u++) {
            if (fp[u] != fp[a]) continue;
            const int streamed = j < k && i == (int)((int64_t)(j + 1) * m / k - 1);
            res[u] = !streamed;
            j += streamed, i++;
        }
    }
}

// Simulates the ring for the plan's streamed footprints from an empty ring, token after token, until the
// offset at which a token's first streamed unit lands repeats (from then on every offset repeats). Returns
// the fewest live slabs after any allocation but the very first, and sets *max_live.
static int rb_simulate(const rb_plan *p, int *max_live) {
    rb_ring r;
    if (rb_ring_init(&r, p->ring_size, p->align, p->slots, NULL)) return 0;
    uint64_t heads[RB_SIM_CYCLES];
    int min_live = RB_MAX_SLOTS + 1;
    *max_live = 0;
    for (int c = 0; c < RB_SIM_CYCLES; c++) {
        for (int s = 0; s < c; s++) {
            if (heads[s] == r.head) return min_live;
        }
        heads[c] = r.head;
        for (int k = 0; k < p->n_streamed; k++) {
            rb_alloc a;
            if (rb_ring_alloc(&r, p->footprint[p->stream_order[k]], &a, NULL)) return 0;
            if (a.seq > 0 && a.live < min_live) min_live = a.live;
            if (a.live > *max_live) *max_live = a.live;
        }
    }
    return 0;  // no period found: the caller pads
}

int rb_plan_make(rb_plan *p, const uint64_t *sizes, int n, uint64_t budget, uint64_t reserve, uint64_t align,
                 int stream_all, dj_err *e) {
    uint64_t fp[RB_MAX_UNITS], total;
    if (rb_check_units(sizes, n, align, fp, &total, e)) return -1;
    rb_min m = rb_min_of(fp, n, total, stream_all);
    uint64_t min_total;
    if (dj_add_u64(m.bytes, reserve, &min_total)) return dj_fail(e, "plan: reserve of %llu bytes overflows", (unsigned long long)reserve);
    if (budget < min_total) return rb_too_small(budget, reserve, min_total, m, e);

    memset(p, 0, sizeof *p);
    p->budget = budget;
    p->reserve = reserve;
    p->align = align;
    p->n = n;
    p->stream_all = stream_all;
    p->min_budget = min_total;
    memcpy(p->size, sizes, (size_t)n * sizeof *sizes);
    memcpy(p->footprint, fp, (size_t)n * sizeof *fp);
    uint64_t room = budget - reserve;

    if (!stream_all && total <= room) {
        for (int u = 0; u < n; u++) p->resident[u] = 1;
    } else if (!stream_all) {
        // Try every slot size M a plan could have, keep the one with the most resident bytes.
        uint64_t best = 0;
        int found = 0;
        int idx[3][RB_MAX_UNITS];
        rb_orders(fp, n, idx);
        for (int i = 0; i < n; i++) {
            uint64_t M = fp[i], forced = 0;
            int seen = 0;
            for (int j = 0; j < i && !seen; j++) seen = fp[j] == M;
            if (seen) continue;
            for (int j = 0; j < n; j++) forced += fp[j] > M ? fp[j] : 0;
            if (forced + 2 * M > room) continue;
            for (int order = 0; order < 3; order++) {
                uint8_t res[RB_MAX_UNITS];
                for (int j = 0; j < n; j++) res[j] = fp[j] > M;
                uint64_t kept = forced + rb_fill(fp, n, M, room - forced - 2 * M, idx[order], res);
                if (!found || kept > best) {
                    found = 1;
                    best = kept;
                    memcpy(p->resident, res, (size_t)n);
                }
            }
        }
        if (!found) return rb_too_small(budget, reserve, min_total, m, e);  // unreachable: budget >= minimum
        rb_improve(fp, n, room, p->resident);
        rb_spread(fp, n, p->resident);
    }

    // Resident units packed in forward order; the ring takes what is left, up to RB_MAX_SLOTS slots.
    uint64_t off = 0;
    for (int u = 0; u < n; u++) {
        if (p->resident[u]) {
            p->offset[u] = off;
            off += fp[u];
            p->n_resident++;
        } else {
            p->offset[u] = UINT64_MAX;
            p->stream_order[p->n_streamed++] = u;
            p->streamed_bytes += sizes[u];
            p->slot_bytes = fp[u] > p->slot_bytes ? fp[u] : p->slot_bytes;
        }
    }
    p->resident_bytes = p->ring_off = off;
    if (p->n_streamed > 0) {
        uint64_t ring = room - off;
        ring -= ring % align;
        if (ring / RB_MAX_SLOTS > p->slot_bytes) ring = (uint64_t)RB_MAX_SLOTS * p->slot_bytes;
        p->ring_size = ring;
        if (ring < 2 * p->slot_bytes) return dj_fail(e, "plan: internal error: ring below two slots");
        // Mixed streamed sizes can leave a slab overlapping its predecessor at some step (no overlap of copy
        // and compute there); if the simulation finds such a step, every streamed slab takes a full slot,
        // which keeps two live with a ring of two slots.
        uint64_t min_fp = p->slot_bytes;
        for (int k = 0; k < p->n_streamed; k++) {
            uint64_t f = fp[p->stream_order[k]];
            min_fp = f < min_fp ? f : min_fp;
        }
        p->slots = rb_ring_slots_for(ring, min_fp);
        p->min_live = rb_simulate(p, &p->max_live);
        if (p->min_live < 2) {
            p->padded = 1;
            for (int k = 0; k < p->n_streamed; k++) p->footprint[p->stream_order[k]] = p->slot_bytes;
            p->slots = rb_ring_slots_for(ring, p->slot_bytes);
            p->min_live = rb_simulate(p, &p->max_live);
            if (p->min_live < 2) return dj_fail(e, "plan: internal error: padded ring keeps %d live", p->min_live);
        }
    }
    p->weight_bytes = p->ring_off + p->ring_size;
    return 0;
}

int rb_plan_next(const rb_plan *p, int u) {
    if (p->n_streamed == 0) return -1;
    for (int k = 0; k < p->n_streamed; k++) {
        if (p->stream_order[k] > u) return p->stream_order[k];
    }
    return p->stream_order[0];
}
