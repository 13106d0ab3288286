// park.c: the GPU engine's KV slots parked in page-locked host memory and restored (gpu.h: gpu_park, gpu_restore,
// gpu_drop). A slot's positions 0..n-1 are, in every layer and KV head, one run of n rows: the keys (the values,
// and for q8 each's scales) of a slot are one 2-D copy of n_layers * n_kv_heads such runs, into engine.h's parked
// layout. The copies run on a stream of
// their own, so that they overlap the weights' copies (the other direction of the link, or the same one) and the
// compute; events order them with the compute stream both ways, and the host never waits for them.
#include <stdlib.h>

#include "gpu_impl.h"

#define PARK_POOL 16     // released host buffers kept for the next parks (page-locking is the slow part)
#define PARK_RECS 256    // copies whose times are not read yet
#define PARK_ROUND 256   // a buffer holds a multiple of this many positions, so that released ones fit again

struct dj_gpu_parked {
    uint8_t *host;  // engine.h's parked layout: keys, values (n_layers * n_kv_heads, n, head_dim) of the KV type
                    // each, then for q8 the keys' and values' scales (n_layers * n_kv_heads, n) f32 each
    int64_t n, cap; // positions held, positions it can hold
};

typedef struct {
    cudaEvent_t t0, t1;
    uint64_t bytes;
    int restore;
} park_rec;

struct gpu_parking {
    cudaStream_t st;
    cudaEvent_t *ready;   // (n_slots) the slot's last park or restore copy
    uint8_t *pending;     // (n_slots) the compute stream has not waited for ready[slot] yet
    cudaEvent_t used;     // the compute stream's work so far, recorded before a copy touches a slot
    dj_gpu_parked *pool[PARK_POOL];
    int n_pool;
    park_rec rec[PARK_RECS];
    int64_t rec_head, rec_tail;  // records issued, records read
};

int park_init(dj_gpu_state *s, dj_err *e) {
    gpu_parking *k = calloc(1, sizeof *k);
    if (!k || !(k->ready = calloc((size_t)s->n_slots, sizeof *k->ready)) ||
        !(k->pending = calloc((size_t)s->n_slots, 1))) {
        if (k) free(k->ready);
        free(k);
        return dj_fail(e, "out of memory");
    }
    s->park = k;
    if (gpu_stream_create(&k->st, e) || gpu_event_create(&k->used, 0, e)) return -1;
    for (int32_t i = 0; i < s->n_slots; i++)
        if (gpu_event_create(&k->ready[i], 0, e)) return -1;
    for (int i = 0; i < PARK_RECS; i++)
        if (gpu_event_create(&k->rec[i].t0, 1, e) || gpu_event_create(&k->rec[i].t1, 1, e)) return -1;
    return 0;
}

static void parked_free(dj_gpu_parked *p) {
    if (!p) return;
    gpu_host_free(p->host);
    free(p);
}

void park_free(dj_gpu_state *s) {
    gpu_parking *k = s->park;
    if (!k) return;
    if (k->st) gpu_stream_sync(k->st, NULL);
    for (int i = 0; i < k->n_pool; i++) parked_free(k->pool[i]);
    for (int32_t i = 0; k->ready && i < s->n_slots; i++) gpu_event_destroy(k->ready[i]);
    for (int i = 0; i < PARK_RECS; i++) gpu_event_destroy(k->rec[i].t0), gpu_event_destroy(k->rec[i].t1);
    gpu_event_destroy(k->used);
    if (k->st) gpu_stream_destroy(k->st);
    free(k->ready), free(k->pending), free(k);
    s->park = NULL;
}

int park_order(dj_gpu_state *s, int32_t slot, dj_err *e) {
    gpu_parking *k = s->park;
    if (!k || !k->pending[slot]) return 0;
    k->pending[slot] = 0;
    return gpu_stream_wait(s->compute, k->ready[slot], e);
}

// Reads the times of the finished copies into s->st; with `all`, waits for every one.
static int harvest(dj_gpu_state *s, int all, dj_err *e) {
    gpu_parking *k = s->park;
    for (; k->rec_tail < k->rec_head; k->rec_tail++) {
        park_rec *r = &k->rec[k->rec_tail % PARK_RECS];
        if (all && gpu_event_sync(r->t1, e)) return -1;
        if (cudaEventQuery(r->t1) != cudaSuccess) break;  // not finished yet (or failed: the next sync says)
        float ms = 0;
        if (gpu_event_ms(&ms, r->t0, r->t1, e)) return -1;
        if (r->restore) s->st.restore_bytes += r->bytes, s->st.restore_ms += ms;
        else s->st.park_bytes += r->bytes, s->st.park_ms += ms;
    }
    return 0;
}

void park_stats(dj_gpu_state *s) {
    if (s->park) harvest(s, 0, NULL);
}

// Both caches of `slot`, positions 0..n-1, to the host buffer (to_host) or back, timed; the slot's ready event
// marks the end.
static int slot_copy(dj_gpu_state *s, dj_gpu_parked *p, int32_t slot, int to_host, dj_err *e) {
    gpu_parking *k = s->park;
    const dj_config *c = &s->m->info.config;
    const gpu_kv_cache *kv = &s->b.kv;
    const size_t rows = (size_t)c->n_layers * c->n_kv_heads, slot_rows = (size_t)s->slot_elems / c->head_dim;
    // the arrays: keys, values, then the scales, each a row of `unit` bytes a position
    const size_t row_bytes = c->head_dim * dj_kv_elem_bytes(kv->type);
    uint8_t *dev[4] = {(uint8_t *)kv->k + (size_t)slot * slot_rows * row_bytes,
                       (uint8_t *)kv->v + (size_t)slot * slot_rows * row_bytes,
                       kv->ks ? (uint8_t *)(kv->ks + (size_t)slot * slot_rows) : NULL,
                       kv->vs ? (uint8_t *)(kv->vs + (size_t)slot * slot_rows) : NULL};
    const size_t unit[4] = {row_bytes, row_bytes, sizeof(float), sizeof(float)};
    if (k->rec_head - k->rec_tail >= PARK_RECS && harvest(s, 1, e)) return -1;
    park_rec *r = &k->rec[k->rec_head % PARK_RECS];
    // the compute stream's work on the slot so far (its last steps, or the previous occupant's) comes first
    if (gpu_event_record(k->used, s->compute, e) || gpu_stream_wait(k->st, k->used, e) ||
        gpu_event_record(r->t0, k->st, e))
        return -1;
    uint8_t *h = p->host;
    r->bytes = 0;
    for (int a = 0; a < 4 && dev[a]; a++) {
        const size_t run = (size_t)p->n * unit[a], pitch = (size_t)s->max_seq * unit[a];
        if (to_host ? gpu_copy2d_async(h, run, dev[a], pitch, run, rows, k->st, e)
                    : gpu_copy2d_async(dev[a], pitch, h, run, run, rows, k->st, e))
            return -1;
        h += run * rows, r->bytes += run * rows;
    }
    if (gpu_event_record(r->t1, k->st, e) || gpu_event_record(k->ready[slot], k->st, e)) return -1;
    r->restore = !to_host;
    k->rec_head++;
    k->pending[slot] = 1;
    return 0;
}

dj_gpu_parked *gpu_park(dj_gpu_state *s, int32_t slot, int64_t n, dj_err *e) {
    gpu_parking *k = s->park;
    if (kv_slot_ok(s, slot, e)) return NULL;
    if (n < 0 || n > s->max_seq) {
        dj_fail(e, "gpu_park: %lld positions, outside 0..%lld", (long long)n, (long long)s->max_seq);
        return NULL;
    }
    // the smallest released buffer that holds n positions, else a new one
    int best = -1;
    for (int i = 0; i < k->n_pool; i++)
        if (k->pool[i]->cap >= n && (best < 0 || k->pool[i]->cap < k->pool[best]->cap)) best = i;
    dj_gpu_parked *p;
    if (best >= 0) {
        p = k->pool[best];
        k->pool[best] = k->pool[--k->n_pool];
    } else {
        int64_t cap = (n + PARK_ROUND) / PARK_ROUND * PARK_ROUND;  // at least one position
        if (cap > s->max_seq) cap = s->max_seq;
        p = calloc(1, sizeof *p);
        if (!p) {
            dj_fail(e, "out of memory");
            return NULL;
        }
        p->cap = cap;
        const dj_config *c = &s->m->info.config;
        const size_t pos_bytes = 2 * (size_t)c->n_layers * c->n_kv_heads * dj_kv_row_bytes(s->b.kv.type, c->head_dim);
        if (gpu_host_alloc((void **)&p->host, (size_t)cap * pos_bytes, "a parked KV cache", e)) {
            free(p);
            return NULL;
        }
    }
    p->n = n;
    if (n && slot_copy(s, p, slot, 1, e)) {
        gpu_drop(s, p);
        return NULL;
    }
    return p;
}

int gpu_restore(dj_gpu_state *s, dj_gpu_parked *p, int32_t slot, dj_err *e) {
    if (kv_slot_ok(s, slot, e) || (p->n && slot_copy(s, p, slot, 0, e))) return -1;
    gpu_drop(s, p);
    return 0;
}

void *gpu_parked_host(dj_gpu_state *s, dj_gpu_parked *p, dj_err *e) {
    return gpu_stream_sync(s->park->st, e) ? NULL : p->host;
}

// Into the pool (later copies on the parking stream come after this one's, so a reuse is safe), or freed: the
// largest goes when the pool is full. Freeing page-locked memory waits for the device.
void gpu_drop(dj_gpu_state *s, dj_gpu_parked *p) {
    gpu_parking *k = s->park;
    if (!p) return;
    if (k->n_pool < PARK_POOL) {
        k->pool[k->n_pool++] = p;
        return;
    }
    int big = 0;
    for (int i = 1; i < k->n_pool; i++)
        if (k->pool[i]->cap > k->pool[big]->cap) big = i;
    if (k->pool[big]->cap > p->cap) {
        dj_gpu_parked *t = k->pool[big];
        k->pool[big] = p, p = t;
    }
    gpu_stream_sync(k->st, NULL);  // no copy of it in flight
    parked_free(p);
}
