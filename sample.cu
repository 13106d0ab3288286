// sample.cu: sampler.h's rule on the GPU. A cooperative grid picks the next token of each row of logits, which it
// overwrites (the penalized logits, then the 32-bit integer weights), so that only the chosen id leaves the
// device. Sort-free: the kept prefix of the order comes from radix selects over the weights, 8 bits a pass, each
// pass one histogram in global memory built by every block of the row and read back by every block after a grid
// barrier. A row's blocks own contiguous chunks of it, so block order is index order for the draw.
#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include "kernels_impl.h"
#include "sampler.h"

namespace cg = cooperative_groups;

#define PICK_THREADS 512
#define PICK_PER_THREAD 4     // elements a thread takes, about: the number of blocks a row gets
#define PICK_MAX_BLOCKS 256   // a row's; at most PICK_THREADS (one thread per block in the reductions)
#define BINS 256              // 8-bit digits
#define PASSES 4              // over 32-bit weights
typedef unsigned long long u64;

// A row's scratch: the histograms of the two selects (0: top-k, 1: top-p), and each block's partial results.
struct pick_scratch {
    u64 cnt[2][PASSES][BINS], mass[2][PASSES][BINS];
    float pmax[PICK_MAX_BLOCKS];
    int32_t parg[PICK_MAX_BLOCKS], pbad[PICK_MAX_BLOCKS];
    u64 pw[PICK_MAX_BLOCKS], pgt[PICK_MAX_BLOCKS], peq[PICK_MAX_BLOCKS];
};

// The block's largest value and the first index holding it, from each thread's; every thread gets them.
__device__ void block_argmax(float *bv, int64_t *bi) {
    __shared__ float sv[32];
    __shared__ int64_t si[32];
    float v = *bv;
    int64_t i = *bi;
    for (int round = 0; round < 2; round++) {
        for (int o = 16; o > 0; o >>= 1) {
            const float ov = __shfl_xor_sync(0xffffffffu, v, o);
            const int64_t oi = __shfl_xor_sync(0xffffffffu, i, o);
            if (oi >= 0 && (i < 0 || ov > v || (ov == v && oi < i))) v = ov, i = oi;
        }
        if (round) break;
        const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
        __syncthreads();
        if (lane == 0) sv[warp] = v, si[warp] = i;
        __syncthreads();
        v = lane < (int)(blockDim.x >> 5) ? sv[lane] : -INFINITY;
        i = lane < (int)(blockDim.x >> 5) ? si[lane] : -1;
    }
    *bv = v, *bi = i;
}

// Sum over the row's B blocks of a per-block value (thread j reads block j's); every thread gets it.
__device__ __forceinline__ u64 row_sum(const u64 *part, int B) {
    return block_sum_u64((int)threadIdx.x < B ? part[threadIdx.x] : 0ull);
}

// Among the weights w >= from of the row (plus n_extra more of weight x_extra: tied elements the caller counts
// itself), the largest value t whose elements with w >= t total at least `target`, in number (COUNT) or in
// weight; *above and *above_w: the number and the weight of those with w > t. Every block of the grid calls it
// (active or not: the barriers are the grid's). PRECOND (active): the elements reach target.
template <bool COUNT>
__device__ void grid_select(cg::grid_group &grid, pick_scratch &S, int sel, const unsigned *w, int64_t lo, int64_t hi,
                            u64 from, u64 x_extra, u64 n_extra, u64 target, bool active, u64 *t_out, u64 *above_out,
                            u64 *above_w_out) {
    __shared__ u64 hc[BINS], hm[BINS];
    __shared__ u64 found[3];  // digit, number above, weight above
    const int tid = threadIdx.x, lane = tid & 31;
    u64 prefix = 0, above = 0, above_w = 0;
    for (int pass = 0; pass < PASSES; pass++) {
        const int shift = 24 - 8 * pass;
        for (int b = tid; b < BINS; b += PICK_THREADS) hc[b] = 0, hm[b] = 0;
        __syncthreads();
        if (active) {
            // warp-uniform trip count: the lanes stay converged for the match below
            for (int64_t base = lo; base < hi; base += PICK_THREADS) {
                const int64_t i = base + tid;
                const unsigned x = i < hi ? w[i] : 0u;
                const bool in = i < hi && x >= from && (pass == 0 || (x >> (shift + 8)) == prefix);
                const unsigned d = in ? (x >> shift) & (BINS - 1) : BINS;
                // the lanes of one digit add once: a flat row puts every element in one bin
                const unsigned peers = __match_any_sync(0xffffffffu, d);
                const unsigned s_lo = __reduce_add_sync(peers, in ? x & 0xffffu : 0u);
                const unsigned s_hi = __reduce_add_sync(peers, in ? x >> 16 : 0u);
                if (in && lane == __ffs(peers) - 1) {
                    atomicAdd(&hc[d], (u64)__popc(peers));
                    atomicAdd(&hm[d], ((u64)s_hi << 16) + s_lo);
                }
            }
            if (blockIdx.x == 0 && tid == 0 && n_extra && (pass == 0 || (x_extra >> (shift + 8)) == prefix)) {
                const unsigned d = (unsigned)(x_extra >> shift) & (BINS - 1);
                atomicAdd(&hc[d], n_extra);
                atomicAdd(&hm[d], n_extra * x_extra);
            }
            __syncthreads();
            for (int b = tid; b < BINS; b += PICK_THREADS) {
                if (hc[b]) atomicAdd(&S.cnt[sel][pass][b], hc[b]);
                if (hm[b]) atomicAdd(&S.mass[sel][pass][b], hm[b]);
            }
        }
        grid.sync();
        if (active) {
            if (tid < 32) {  // lane L holds bins 255 - 8L .. 248 - 8L, from the top
                u64 c[8], m[8], sc = 0, sm = 0;
                for (int j = 0; j < 8; j++) {
                    const int b = BINS - 1 - 8 * lane - j;
                    c[j] = S.cnt[sel][pass][b], m[j] = S.mass[sel][pass][b];
                    sc += c[j], sm += m[j];
                }
                u64 ic = sc, im = sm;  // inclusive scans in lane order
                for (int o = 1; o < 32; o <<= 1) {
                    const u64 pc = __shfl_up_sync(0xffffffffu, ic, o), pm = __shfl_up_sync(0xffffffffu, im, o);
                    if (lane >= o) ic += pc, im += pm;
                }
                u64 rc = above + ic - sc, rm = above_w + im - sm;  // totals above this lane's bins
                for (int j = 0; j < 8; j++) {
                    const u64 before = COUNT ? rc : rm;
                    rc += c[j], rm += m[j];
                    // the digit: the first bin from the top where the running total reaches target (exactly one)
                    if (before < target && (COUNT ? rc : rm) >= target)
                        found[0] = (u64)(BINS - 1 - 8 * lane - j), found[1] = rc - c[j], found[2] = rm - m[j];
                }
            }
            __syncthreads();
            prefix = (prefix << 8) | found[0], above = found[1], above_w = found[2];
        }
        __syncthreads();  // hc, hm and found are rewritten by the next pass
    }
    *t_out = prefix, *above_out = above, *above_w_out = above_w;
}

__device__ __forceinline__ u64 clamped_target(float frac, u64 total) {
    const double tg = ceil((double)frac * (double)total);
    return tg < 1.0 ? 1ull : tg >= (double)total ? total : (u64)tg;
}

__global__ __launch_bounds__(PICK_THREADS) void pick_kernel(int32_t *out, float *logits, int64_t n,
                                                            const dj_pick_args *args, int32_t *counts,
                                                            pick_scratch *scratch, int64_t chunk) {
    cg::grid_group grid = cg::this_grid();
    __shared__ u64 bcast[2];
    const int row = blockIdx.y, B = gridDim.x, tid = threadIdx.x;
    const dj_pick_args &a = args[row];
    pick_scratch &S = scratch[row];
    float *z = logits + (int64_t)row * n;
    unsigned *w = reinterpret_cast<unsigned *>(z);
    int32_t *cnt = counts ? counts + (int64_t)row * n : nullptr;
    const int64_t lo = min((int64_t)blockIdx.x * chunk, n), hi = min(lo + chunk, n);
    // the stages some row needs: the same in every block, so every block meets the same barriers
    bool any_sample = false, any_k = false, any_p = false;
    for (int r = 0; r < (int)gridDim.y; r++)
        if (args[r].temp > 0.0f) {
            any_sample = true;
            any_k |= args[r].top_k > 0 && args[r].top_k < n;
            any_p |= args[r].top_p < 1.0f;
        }

    // 1: the histograms zeroed; the count changes; the penalties in place; the largest logit; NaN or +infinity
    for (int i = blockIdx.x * PICK_THREADS + tid; i < 2 * PASSES * BINS; i += B * PICK_THREADS)
        (&S.cnt[0][0][0])[i] = 0, (&S.mass[0][0][0])[i] = 0;
    if (cnt && a.n_set > 0) {
        if (tid < a.n_set && tid < DJ_PICK_SETS && a.set_id[tid] >= lo && a.set_id[tid] < hi)
            cnt[a.set_id[tid]] = a.set_count[tid];
        __syncthreads();
    }
    const bool pen = cnt && a.penalize;
    float bv = -INFINITY;
    int64_t bi = -1;
    int bad = 0;
    for (int64_t i = lo + tid; i < hi; i += PICK_THREADS) {
        float v = z[i];
        if (pen) {
            const int c = cnt[i];
            if (c > 0) z[i] = v = dj_pick_penalized(v, c, a.repeat_penalty, a.frequency_penalty, a.presence_penalty);
        }
        if (v != v || v == INFINITY) bad = 1;
        if (bi < 0 || v > bv) bv = v, bi = i;
    }
    bad = __syncthreads_or(bad);
    block_argmax(&bv, &bi);
    if (tid == 0) S.pmax[blockIdx.x] = bv, S.parg[blockIdx.x] = (int32_t)bi, S.pbad[blockIdx.x] = bad;
    grid.sync();

    // 2: the row's maximum; greedy rows and rows without a distribution are done; the weights in place
    bv = tid < B ? S.pmax[tid] : -INFINITY, bi = tid < B ? S.parg[tid] : -1;
    bad = __syncthreads_or(tid < B && S.pbad[tid]);
    block_argmax(&bv, &bi);
    const bool none = bad || bv == -INFINITY, live = !none && a.temp > 0.0f;
    if (!live && blockIdx.x == 0 && tid == 0) out[row] = none ? -1 : (int32_t)bi;
    if (!any_sample) return;  // every row greedy: no barrier follows
    u64 part = 0;
    if (live)
        for (int64_t i = lo + tid; i < hi; i += PICK_THREADS) {
            const unsigned x = dj_pick_weight(z[i], bv, a.temp);
            w[i] = x;
            part += x;
        }
    part = block_sum_u64(part);
    if (tid == 0) S.pw[blockIdx.x] = part;
    grid.sync();
    const u64 W = row_sum(S.pw, B);

    // 3: the kept prefix as a cut: w > t, and the first nt (in id order) with w == t
    u64 t = 0, nt = ~0ull, Wk = W;
    const int64_t k = live && a.top_k > 0 && a.top_k < n ? a.top_k : 0;
    if (any_k) {
        u64 tk, n_above, w_above;
        grid_select<true>(grid, S, 0, w, lo, hi, 0, 0, 0, (u64)k, k > 0, &tk, &n_above, &w_above);
        if (k) t = tk, nt = (u64)k - n_above, Wk = w_above + nt * tk;
    }
    if (any_p) {
        const bool act = live && a.top_p < 1.0f;
        const u64 target = clamped_target(a.top_p, Wk);
        u64 tp, n_above, w_above;
        grid_select<false>(grid, S, 1, w, lo, hi, k ? t + 1 : 1, t, k ? nt : 0, target, act, &tp, &n_above, &w_above);
        if (act) {
            const u64 ntp = (target - w_above + tp - 1) / tp;
            nt = tp == t && ntp > nt ? nt : ntp, t = tp;
        }
    }
    if (a.min_p > 0.0f) {
        const u64 wm = (u64)ceil((double)a.min_p * 4294967295.0);
        if (wm > t) t = wm, nt = ~0ull;
    }

    // 4: the draw. Each block's kept weight and ties, then the block holding r finds the id in its chunk.
    u64 gt = 0, eq = 0;
    if (live)
        for (int64_t i = lo + tid; i < hi; i += PICK_THREADS) {
            const unsigned x = w[i];
            if (x > t) gt += x;
            else if (x == t) eq++;
        }
    gt = block_sum_u64(gt), eq = block_sum_u64(eq);
    if (tid == 0) S.pgt[blockIdx.x] = gt, S.peq[blockIdx.x] = eq;
    grid.sync();
    if (!live) return;
    // thread j: block j's admitted ties and kept weight; the scans in block order
    const u64 ej = tid < B ? S.peq[tid] : 0, ej_before = block_scan_u64(ej) - ej;
    const u64 adm = nt > ej_before ? min(nt - ej_before, ej) : 0ull;
    const u64 mj = tid < B ? S.pgt[tid] + adm * t : 0, mj_incl = block_scan_u64(mj);
    if (tid == B - 1) bcast[0] = mj_incl;
    __syncthreads();
    const u64 M = bcast[0];  // > 0: the most likely token is always kept
    const double rd = floor((double)a.u * (double)M);
    const u64 r = rd <= 0.0 ? 0ull : rd >= (double)M ? M - 1 : (u64)rd;
    __syncthreads();
    __shared__ u64 mine[3];
    if (tid == (int)blockIdx.x) mine[0] = mj_incl - mj, mine[1] = mj, mine[2] = ej_before;
    __syncthreads();
    u64 base_w = mine[0], base_ties = mine[2];
    if (!(base_w <= r && r < base_w + mine[1])) return;  // not this block's chunk
    // tiles of PICK_THREADS ids in order: the kept ones' running weight crosses r at the pick
    for (int64_t base = lo; base < hi && base_w <= r; base += PICK_THREADS) {
        const int64_t i = base + tid;
        const unsigned x = i < hi ? w[i] : 0u;
        const u64 e = i < hi && x == t, e_incl = block_scan_u64(e);
        const bool kept = i < hi && (x > t || (e && base_ties + e_incl - e < nt));
        const u64 v = kept ? x : 0u, v_incl = block_scan_u64(v);
        if (v > 0 && base_w + v_incl - v <= r && r < base_w + v_incl) out[row] = (int32_t)i;
        if (tid == PICK_THREADS - 1) bcast[0] = v_incl, bcast[1] = e_incl;
        __syncthreads();
        base_w += bcast[0], base_ties += bcast[1];
        __syncthreads();
    }
}

// Blocks a row gets (co-resident with every other block of the launch: the grid barriers need it).
static int pick_blocks(int64_t rows, int64_t n, int *blocks, dj_err *e) {
    static int capacity = 0;  // co-resident blocks on the device
    if (!capacity) {
        int dev, sms, per_sm;
        CUDA_CHECK(cudaGetDevice(&dev));
        CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
        CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, pick_kernel, PICK_THREADS, 0));
        capacity = sms * per_sm;
    }
    if (rows > capacity) return dj_fail(e, "gpu_pick: %lld rows, more than the %d blocks the device holds at once",
                                        (long long)rows, capacity);
    int64_t want = (n + PICK_THREADS * PICK_PER_THREAD - 1) / (PICK_THREADS * PICK_PER_THREAD), most = capacity / rows;
    if (most > PICK_MAX_BLOCKS) most = PICK_MAX_BLOCKS;
    *blocks = (int)(want < 1 ? 1 : want > most ? most : want);
    return 0;
}

extern "C" size_t gpu_pick_scratch(int64_t rows) { return (size_t)rows * sizeof(pick_scratch); }

extern "C" int gpu_pick(void *scratch, int32_t *d_out, float *logits, int64_t rows, int64_t n,
                        const dj_pick_args *d_args, int32_t *d_counts, cudaStream_t s, dj_err *e) {
    if (n < 1 || n > INT32_MAX || rows < 1 || rows > 65535)
        return dj_fail(e, "gpu_pick: bad shape rows=%lld n=%lld", (long long)rows, (long long)n);
    int blocks = 1;
    if (pick_blocks(rows, n, &blocks, e)) return -1;
    int64_t chunk = (n + blocks - 1) / blocks;
    pick_scratch *sc = (pick_scratch *)scratch;
    void *params[] = {&d_out, &logits, &n, (void *)&d_args, &d_counts, &sc, &chunk};
    CUDA_CHECK(cudaLaunchCooperativeKernel((const void *)pick_kernel, dim3((unsigned)blocks, (unsigned)rows),
                                           dim3(PICK_THREADS), params, 0, s));
    LAUNCH_CHECK("pick", s);
    return 0;
}

int sample_setup(dj_gpu *g, dj_err *e) { return load_module_of(g, (const void *)pick_kernel, e); }
