// ringbuf.h: how a model larger than its GPU budget is laid out in that budget, and the skip-end ring
// through which the layers that do not fit are streamed every forward pass. Pure C, no CUDA: the GPU
// engine's copy schedule (stream.c) drives its copy stream, compute stream and per-slot events from what these
// functions return.
//
// ---- units
// A forward pass touches "units" in a fixed order: layer 0 .. n_layers-1, then the output head (final
// norm + lm_head) as unit n_layers. Each unit is one contiguous slab in host memory (model.h), so moving
// it to the GPU is one copy. Token embeddings are not a unit: they stay in host memory.
//
// ---- the budget (--ring-gb)
// budget bytes = reserve (KV cache, activations: whatever the engine keeps outside the weights)
//              + one device buffer of weight_bytes laid out as
//   [0, ring_off)                   resident units at fixed offsets, packed in forward order
//   [ring_off, ring_off+ring_size)  the streaming ring: streamed units cycle through it, each placed by
//                                   rb_ring_alloc at a ring-relative offset
//
// ---- the streaming schedule (what the engine does with a plan: stream.c issues it)
// Streamed units are copied in forward order, cyclically across tokens: after the last streamed unit of
// token t comes the first streamed unit of token t+1 (rb_plan_next). For each streamed unit, in that order:
//   a = rb_ring_alloc(ring, footprint[u])    offset, slot, and the slab that had to be retired for it
//   copy stream: wait free[a.wait_slot] (if >= 0); H2D copy to ring_off + a.off; record copied[a.slot]
//   compute stream (later, when unit u runs): wait copied[a.slot]; kernels; record free[a.slot]
// The copy of the next streamed unit is issued before the compute of the current one, so it runs while the
// current unit computes. That is safe only when a.wait_seq < a.seq - 1 (the retired slab's free event has
// already been recorded), i.e. a.live >= 2: the plan guarantees this for every step of every token.
// With --sync-copy the engine instead waits for each copy before computing, and needs no such guarantee.
#ifndef DJINN_RINGBUF_H
#define DJINN_RINGBUF_H

#include <stddef.h>
#include <stdint.h>

#include "util.h"

#define RB_MAX_UNITS 1025  // DJ_MAX_LAYERS layers + the head
#define RB_MAX_SLOTS 64    // most slabs live in the ring at once (per-slot events the engine keeps)

// ---- the ring: skip-end FIFO placement over [0, size)
// Slabs are placed one after another; a slab that would straddle the end skips to offset 0. A slab never
// overlaps a live one: placing it first retires (FIFO, oldest first) every live slab up to the newest one
// it would overlap, and reports that newest one so that the caller waits for it to be free. A slab's
// offset depends only on where the previous one ended (offset = head if head + fp <= size, else 0), never
// on what is live; O(1) amortised per allocation (each slab is retired once).
typedef struct {
    uint64_t off, fp;  // ring-relative offset and footprint (bytes, multiples of align)
    int64_t seq;       // allocation number
} rb_slab;

typedef struct {
    uint64_t size;     // ring bytes (multiple of align)
    uint64_t align;    // power of two; every offset and footprint is a multiple of it
    int cap;           // slot records, 1..RB_MAX_SLOTS: at most cap slabs live at once
    int first, count;  // live slabs: q[first], q[(first+1)%cap], ..., oldest first
    uint64_t head;     // end of the newest slab placed (in [0, size]): where the next one tries to go
    int64_t next_seq;
    rb_slab q[RB_MAX_SLOTS];
} rb_ring;

typedef struct {
    uint64_t off;      // ring-relative offset, multiple of align; off + footprint <= ring size
    int slot;          // in [0, cap): distinct among live slabs; index of the engine's per-slot events
    int64_t seq;       // allocation number, from 0
    int wait_slot;     // -1: nothing to wait for; else the slot whose slab must be free before the copy
    int64_t wait_seq;  // the seq of that slab (-1 if none); every older slab was retired too
    int live;          // live slabs including this one
    int skipped;       // 1: it would have straddled the end and skipped to 0
} rb_alloc;

// size: ring bytes (rounded down to align); align: power of two; cap: 1..RB_MAX_SLOTS.
int rb_ring_init(rb_ring *r, uint64_t size, uint64_t align, int cap, dj_err *e);
void rb_ring_reset(rb_ring *r);  // empty, head at 0, seq from 0
// Places `bytes` (rounded up to align). Fails for 0 bytes or a slab larger than the ring.
int rb_ring_alloc(rb_ring *r, uint64_t bytes, rb_alloc *out, dj_err *e);
// Retires the oldest live slab (FIFO); returns its seq, or -1 when the ring is empty.
int64_t rb_ring_free(rb_ring *r);
static inline int rb_ring_live(const rb_ring *r) { return r->count; }
// Slot records the engine needs for slabs of the given footprint: how many fit side by side, clamped to
// [1, RB_MAX_SLOTS].
int rb_ring_slots_for(uint64_t ring_size, uint64_t fp);

// ---- the plan: which units stay resident, and the ring for the rest
// Residency maximises resident bytes (so the fewest bytes stream per token) subject to the ring holding
// two slots of the largest streamed footprint; see rb_plan_make in ringbuf.c for which units are chosen.
typedef struct {
    uint64_t budget, reserve;  // as given (bytes)
    uint64_t align;            // as given: power of two
    int n;                     // units
    int stream_all;            // as given
    uint64_t size[RB_MAX_UNITS];       // unit bytes, as given
    uint64_t footprint[RB_MAX_UNITS];  // bytes the unit occupies: size rounded up to align; for streamed
                                       // units padded to slot_bytes when `padded` (pass to rb_ring_alloc)
    uint8_t resident[RB_MAX_UNITS];    // 1: placed once at offset[u]; 0: streamed every forward pass
    uint64_t offset[RB_MAX_UNITS];     // resident: offset in the weight buffer; streamed: UINT64_MAX
    int n_resident, n_streamed;
    int stream_order[RB_MAX_UNITS];    // (n_streamed) streamed units in forward order
    uint64_t resident_bytes;  // sum of resident footprints (= ring_off)
    uint64_t streamed_bytes;  // sum of streamed unit sizes: bytes copied per token
    uint64_t ring_off, ring_size;  // ring region in the weight buffer; ring_size 0 when nothing streams
    uint64_t weight_bytes;    // device buffer to allocate: ring_off + ring_size <= budget - reserve
    uint64_t slot_bytes;      // largest streamed footprint (0 when nothing streams); ring_size >= 2*slot_bytes
    int padded;               // 1: streamed footprints padded to slot_bytes (mixed sizes that the ring
                              //    could not otherwise keep two of live at every step)
    int slots;                // cap for rb_ring_init: most slabs live at once, >= 2 when streaming
    int min_live;             // fewest live slabs after any allocation but the first, from an empty ring
                              // through the first tokens until the placement repeats (>= 2)
    int max_live;             // most, over the same tokens
    uint64_t min_budget;      // smallest budget for which a plan exists (same units, align, reserve, mode)
} rb_plan;

// sizes (n): unit bytes in forward order, the head last; budget: --ring-gb in bytes; reserve: bytes of the
// budget kept for non-weights; align: power of two (e.g. 4096); stream_all: nothing resident.
// Fails for n outside 1..RB_MAX_UNITS, a zero size, a bad align, overflow, or a budget below the minimum:
// "--ring-gb 3.20 is too small: this model needs at least 3.51 GB (two 1.60 GB streaming slots + ...)".
int rb_plan_make(rb_plan *p, const uint64_t *sizes, int n, uint64_t budget, uint64_t reserve, uint64_t align,
                 int stream_all, dj_err *e);
// The smallest budget for which rb_plan_make succeeds with these arguments.
int rb_min_budget(const uint64_t *sizes, int n, uint64_t reserve, uint64_t align, int stream_all, uint64_t *out,
                  dj_err *e);
// The streamed unit copied after streamed unit u (wrapping to the next token's first); -1 if none stream.
int rb_plan_next(const rb_plan *p, int u);
// --ring-gb to bytes (1 GB = 1e9 bytes, rounded to the nearest byte); 0 for a negative or NaN value.
uint64_t rb_gb_bytes(double gb);

#endif
