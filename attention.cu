// attention.cu: causal GQA attention over the KV cache (f32, f16 or q8: kvtype.h): prefill (a tiled
// flash-attention kernel on the tensor cores in bf16x3, and one in fp32 FMAs for the other head_dims or on request)
// and decode (split over the KV length, then a combine pass), their shared-memory set-up at gpu_open, and the
// scratch decode needs.
#include <cuda_bf16.h>
#include <cuda_pipeline.h>
#include <cuda_runtime.h>

#include "kernels_impl.h"

// ---- shapes
#define HD_MAX 256  // largest head_dim (decode holds HD_MAX / 32 values of each query per lane)

// Elements i..i+3 of a cache of type KT widened (q8: times sc). PRECOND: i a multiple of 4, the row 16-byte
// aligned in f32 (8 in f16, 4 in q8).
template <int KT> static __device__ __forceinline__ float4 kv_get4(const void *p, int64_t i, float sc) {
    if constexpr (KT == DJ_KV_F32) {
        return *(const float4 *)((const float *)p + i);
    } else if constexpr (KT == DJ_KV_F16) {
        const uint2 u = *(const uint2 *)((const __half *)p + i);
        const float2 a = __half22float2(*(const __half2 *)&u.x), b = __half22float2(*(const __half2 *)&u.y);
        return make_float4(a.x, a.y, b.x, b.y);
    } else {
        const char4 c = *(const char4 *)((const int8_t *)p + i);
        return make_float4((float)c.x * sc, (float)c.y * sc, (float)c.z * sc, (float)c.w * sc);
    }
}

// The scale of row `row` of a q8 cache (1 for the other types, which have none).
template <int KT> static __device__ __forceinline__ float kv_scale(const float *scales, int64_t row) {
    if constexpr (KT == DJ_KV_Q8) return scales[row];
    else return 1.0f;
}

int attn_check(const char *fn, int64_t n_heads, int64_t n_kv_heads, int64_t head_dim, int64_t max_seq, dj_err *e) {
    if (n_heads < 1 || n_kv_heads < 1 || n_heads % n_kv_heads || head_dim < 2 || head_dim % 2 ||
        head_dim > HD_MAX || max_seq < 1 || max_seq > INT32_MAX / 2 || n_heads > 65535)
        return dj_fail(e, "%s: unsupported shape n_heads=%lld n_kv_heads=%lld head_dim=%lld max_seq=%lld "
                          "(need n_heads %% n_kv_heads == 0, head_dim even and <= %d)",
                       fn, (long long)n_heads, (long long)n_kv_heads, (long long)head_dim, (long long)max_seq, HD_MAX);
    return 0;
}

// ---- prefill: tiled, causal, online softmax, fp32 FMAs
#define PF_BQ 64       // query rows per block (one query head)
#define PF_BK 32       // keys per tile
#define PF_THREADS 128 // two threads per query row

static size_t prefill_smem(int hd) {
    return sizeof(float) * ((size_t)PF_BQ * (hd + 1) + (size_t)PF_BK * (hd + 1) + (size_t)PF_BK * hd +
                            (size_t)PF_BQ * (PF_BK + 1));
}

// Block (query tile, query head). Thread pair (2r, 2r+1) owns query row r: each computes the scores of
// alternate keys of a tile and alternate output dims (so the pair's shared-memory reads hit different
// banks). Shared memory: Qs (BQ, hd+1), Ks (BK, hd+1), Vs (BK, hd), Ps (BQ, BK+1); the +1 pads keep
// the 16 rows a warp reads at once in distinct banks.
// PRECOND: head_dim even, <= HD; blockDim.x == PF_THREADS.
template <int HD, int KT>
__global__ __launch_bounds__(PF_THREADS) void attn_prefill_kernel(float *out, int64_t ldo, const float *q, int64_t ldq,
                                                                 gpu_kv_cache c, int T, int group, int hd, int max_seq,
                                                                 float scale, const int32_t *d_pos) {
    extern __shared__ float smem[];
    const int hs = hd + 1;
    float *Qs = smem, *Ks = Qs + PF_BQ * hs, *Vs = Ks + PF_BK * hs, *Ps = Vs + PF_BK * hd;
    // the longest tiles (latest queries) start first, so the short ones fill the tail
    const int h = blockIdx.y, kvh = h / group, t0 = (gridDim.x - 1 - blockIdx.x) * PF_BQ;
    const int tid = threadIdx.x, r = tid >> 1, half = tid & 1;
    const int pos0 = *d_pos;
    for (int idx = tid; idx < PF_BQ * hd; idx += PF_THREADS) {
        const int rr = idx / hd, d = idx - rr * hd, t = t0 + rr;
        Qs[rr * hs + d] = t < T ? q[(int64_t)t * ldq + (int64_t)h * hd + d] : 0.0f;
    }
    const int t = t0 + r;
    const int last_key = min(pos0 + min(t0 + PF_BQ - 1, T - 1), max_seq - 1);
    const int my_last = min(pos0 + min(t, T - 1), last_key);  // rows past T mirror the last row, unwritten
    const int64_t row0 = (int64_t)kvh * max_seq;  // the kv head's first cache row

    float m = -INFINITY, l = 0.0f;
    float acc[HD / 2];
#pragma unroll
    for (int i = 0; i < HD / 2; i++) acc[i] = 0.0f;

    for (int k0 = 0; k0 <= last_key; k0 += PF_BK) {
        __syncthreads();  // the previous tile's Ks/Vs are no longer read (and Qs is complete, first time)
        for (int idx = tid; idx < PF_BK * hd; idx += PF_THREADS) {
            const int j = idx / hd, d = idx - j * hd, key = k0 + j;
            const bool ok = key <= last_key;
            const int64_t i = (row0 + key) * hd + d;
            Ks[j * hs + d] = ok ? kv_get<KT>(c.k, i, kv_scale<KT>(c.ks, row0 + key)) : 0.0f;
            Vs[j * hd + d] = ok ? kv_get<KT>(c.v, i, kv_scale<KT>(c.vs, row0 + key)) : 0.0f;
        }
        __syncthreads();

        float sj[PF_BK / 2];
#pragma unroll
        for (int jj = 0; jj < PF_BK / 2; jj++) sj[jj] = 0.0f;
        for (int d = 0; d < hd; d++) {
            const float qd = Qs[r * hs + d];
#pragma unroll
            for (int jj = 0; jj < PF_BK / 2; jj++) sj[jj] += qd * Ks[(2 * jj + half) * hs + d];
        }
        float mt = -INFINITY;
#pragma unroll
        for (int jj = 0; jj < PF_BK / 2; jj++) {
            const int key = k0 + 2 * jj + half;
            sj[jj] = key <= my_last ? sj[jj] * scale : -INFINITY;
            mt = fmaxf(mt, sj[jj]);
        }
        mt = fmaxf(mt, __shfl_xor_sync(0xffffffffu, mt, 1));
        const float mn = fmaxf(m, mt);
        // Tile 0 always holds key 0 <= my_last, so mn is finite from the first tile on.
        const float alpha = expf(m - mn);  // m = -inf on the first tile: 0
        float ls = 0.0f;
#pragma unroll
        for (int jj = 0; jj < PF_BK / 2; jj++) {
            const float p = expf(sj[jj] - mn);  // masked: exp(-inf) = 0
            Ps[r * (PF_BK + 1) + 2 * jj + half] = p;
            ls += p;
        }
        ls += __shfl_xor_sync(0xffffffffu, ls, 1);
        l = l * alpha + ls;
        m = mn;
        __syncwarp();  // row r's probabilities come from this thread pair, in this warp
#pragma unroll
        for (int i = 0; i < HD / 2; i++) acc[i] *= alpha;
        for (int j = 0; j < PF_BK; j++) {
            const float p = Ps[r * (PF_BK + 1) + j];
#pragma unroll
            for (int i = 0; i < HD / 2; i++) {
                const int d = 2 * i + half;
                if (d < hd) acc[i] += p * Vs[j * hd + d];
            }
        }
        __syncwarp();  // Ps row is rewritten by the next tile
    }
    if (t < T) {
        const float inv = 1.0f / l;
        float *o = out + (int64_t)t * ldo + (int64_t)h * hd;
#pragma unroll
        for (int i = 0; i < HD / 2; i++) {
            const int d = 2 * i + half;
            if (d < hd) o[d] = acc[i] * inv;
        }
    }
}

// ---- prefill on the tensor cores (bf16x3)
// The same tiled, causal, online-softmax attention as attn_prefill_kernel, with both products (S = Q K^T and
// O += P V) on the tensor cores (mma.sync m16n8k16, bf16 operands, f32 accumulation) in the bf16x3 split:
// each f32 operand a = hi + lo, both bf16 (|a - hi - lo| <= 2^-17 |a|), and a.b = lo.hi + hi.lo + hi.hi.
// The dropped lo.lo term is ~2^-18 of each product: f32-class attention for every weight dtype, with the
// range of f32 (bf16 has its exponent), at three tensor-core products per one. Each tile's P.V starts from
// zero and is added to O in f32 outside the tensor cores, whose own accumulation is not IEEE (over a long
// context inside them it drifts to ~6e-5 from the CPU).
// Block (64 queries, query head), 4 warps; warp w owns query rows 16w..16w+15: its Q fragments (scaled by
// 1/sqrt(head_dim)), its S and P, its O accumulators and softmax state all stay in registers, in the mma
// fragment layout (lane = 4 g + c: rows g and g + 8, columns 2c and 2c + 1 of each 8-wide tile). P goes from
// the S accumulators to A fragments without leaving the registers. Only the K/V tiles (64 keys, as bf16 hi and
// lo in shared memory, rows padded by 8 so fragment loads hit distinct banks) need block barriers.
#define TC_BQ 64
#define TC_BK 64
#define TC_THREADS 128

static size_t tc_smem(int hd) { return (size_t)4 * TC_BK * (hd + 8) * sizeof(__nv_bfloat16); }

// Two floats as a pair of 16-bit halves (F16: f16, else bf16), rounded to nearest; a in the low half, as the
// fragments want it; and such a pair back to floats.
template <bool F16> __device__ __forceinline__ uint32_t pack2(float a, float b) {
    uint32_t u;
    if constexpr (F16) {
        const __half2 h = __floats2half2_rn(a, b);
        u = *(const uint32_t *)&h;
    } else {
        const __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
        u = *(const uint32_t *)&h;
    }
    return u;
}
template <bool F16> __device__ __forceinline__ float2 unpack2(uint32_t u) {
    if constexpr (F16) return __half22float2(*(const __half2 *)&u);
    else return __bfloat1622float2(*(const __nv_bfloat162 *)&u);
}

// (a, b) -> hi = the pair rounded, lo = what hi missed, rounded: hi + lo carries ~16 (bf16) or ~22 (f16) bits.
template <bool F16> __device__ __forceinline__ void split_x2(float a, float b, uint32_t *hi, uint32_t *lo) {
    *hi = pack2<F16>(a, b);
    const float2 hf = unpack2<F16>(*hi);
    *lo = pack2<F16>(a - hf.x, b - hf.y);
}
__device__ __forceinline__ void split_bf16x2(float a, float b, uint32_t *hi, uint32_t *lo) {
    split_x2<false>(a, b, hi, lo);
}

// c += a.b on the tensor cores (m16n8k16, f32 accumulation), operands f16 (F16) or bf16.
template <bool F16> __device__ __forceinline__ void mma16816(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
    if constexpr (F16)
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                     "{%0,%1,%2,%3};\n"
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    else
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                     "{%0,%1,%2,%3};\n"
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
__device__ __forceinline__ void mma_bf16(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
    mma16816<false>(c, a, b0, b1);
}

// A fragment row's value over the 4 lanes that hold it (lane 4 g + c, c = 0..3): its max, its sum.
__device__ __forceinline__ float quad_max(float x) {
    x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
    return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
__device__ __forceinline__ float quad_sum(float x) {
    x += __shfl_xor_sync(0xffffffffu, x, 1);
    return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

// The A fragments of two query rows (lane 4 g + c: row qa is fragment row g, qb row g + 8; NULL: a zero row) over
// KS k-steps of 16 dims, scaled, split (F16: f16, else bf16): k-step s covers dims 16s..16s+15.
template <int KS, bool F16>
__device__ __forceinline__ void q_frags(uint32_t qh[KS][4], uint32_t ql[KS][4], const float *qa, const float *qb,
                                        float scale, int c) {
#pragma unroll
    for (int s = 0; s < KS; s++) {
        const int d0 = 16 * s + 2 * c, d1 = d0 + 8;
        split_x2<F16>(qa ? qa[d0] * scale : 0.0f, qa ? qa[d0 + 1] * scale : 0.0f, &qh[s][0], &ql[s][0]);
        split_x2<F16>(qb ? qb[d0] * scale : 0.0f, qb ? qb[d0 + 1] * scale : 0.0f, &qh[s][1], &ql[s][1]);
        split_x2<F16>(qa ? qa[d1] * scale : 0.0f, qa ? qa[d1 + 1] * scale : 0.0f, &qh[s][2], &ql[s][2]);
        split_x2<F16>(qb ? qb[d1] * scale : 0.0f, qb ? qb[d1 + 1] * scale : 0.0f, &qh[s][3], &ql[s][3]);
    }
}

// c += a.b in bf16x3, the small terms first.
__device__ __forceinline__ void mma_bf16x3(float c[4], const uint32_t ah[4], const uint32_t al[4], uint32_t bh0,
                                           uint32_t bh1, uint32_t bl0, uint32_t bl1) {
    mma_bf16(c, al, bh0, bh1);
    mma_bf16(c, ah, bl0, bl1);
    mma_bf16(c, ah, bh0, bh1);
}

// Two B fragments (k 16 x n 8, n-tiles n0 and n0 + 8) of V^T from row-major V (keys x dims) in shared memory.
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t r[4], const void *p) {
    const unsigned a = (unsigned)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
}

// PRECOND: HD % 16 == 0, head_dim == HD; blockDim.x == TC_THREADS; tc_smem(HD) bytes of dynamic shared memory;
// the caches 16-byte aligned.
template <int HD, int KT>
__global__ __launch_bounds__(TC_THREADS) void attn_prefill_tc_kernel(float *out, int64_t ldo, const float *q,
                                                                    int64_t ldq, gpu_kv_cache kvc, int T, int group,
                                                                    int max_seq, float scale, const int32_t *d_pos) {
    extern __shared__ __align__(128) __nv_bfloat16 tc_sm[];
    constexpr int LD = HD + 8, KS = HD / 16, ND = HD / 8;
    __nv_bfloat16 *Kh = tc_sm, *Kl = Kh + TC_BK * LD, *Vh = Kl + TC_BK * LD, *Vl = Vh + TC_BK * LD;
    const int h = blockIdx.y, kvh = h / group, t0 = (gridDim.x - 1 - blockIdx.x) * TC_BQ;  // longest tiles first
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, c = lane & 3;
    const int pos0 = *d_pos;
    const int last_key = min(pos0 + min(t0 + TC_BQ - 1, T - 1), max_seq - 1);
    // this thread's two rows; rows past T compute the last row's keys (unwritten)
    const int ta = t0 + 16 * warp + g, tb = ta + 8;
    const int last_a = min(pos0 + min(ta, T - 1), last_key), last_b = min(pos0 + min(tb, T - 1), last_key);

    // Q fragments (rows ta, tb), scaled, split: k-step s covers dims 16s..16s+15.
    uint32_t qh[KS][4], ql[KS][4];
    q_frags<KS, false>(qh, ql, ta < T ? q + (int64_t)ta * ldq + (int64_t)h * HD : NULL,
                       tb < T ? q + (int64_t)tb * ldq + (int64_t)h * HD : NULL, scale, c);
    float o[ND][4];
#pragma unroll
    for (int n = 0; n < ND; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
    float ma = -INFINITY, mb = -INFINITY, la = 0.0f, lb = 0.0f;  // this thread's partial row sums
    const int64_t row0 = (int64_t)kvh * max_seq;  // the kv head's first cache row

    for (int k0 = 0; k0 <= last_key; k0 += TC_BK) {
        __syncthreads();  // every warp is done with the previous tile
        for (int idx = tid; idx < TC_BK * HD / 4; idx += TC_THREADS) {
            const int j = idx / (HD / 4), d = (idx - j * (HD / 4)) * 4, key = k0 + j;
            const bool ok = key <= last_key;  // never read past the context (the cache may hold anything there)
            const int64_t i = (row0 + key) * HD + d;
            const float4 kv4 = ok ? kv_get4<KT>(kvc.k, i, kv_scale<KT>(kvc.ks, row0 + key)) : make_float4(0, 0, 0, 0);
            const float4 vv4 = ok ? kv_get4<KT>(kvc.v, i, kv_scale<KT>(kvc.vs, row0 + key)) : make_float4(0, 0, 0, 0);
            uint2 hi, lo;
            split_bf16x2(kv4.x, kv4.y, &hi.x, &lo.x), split_bf16x2(kv4.z, kv4.w, &hi.y, &lo.y);
            *(uint2 *)(Kh + j * LD + d) = hi, *(uint2 *)(Kl + j * LD + d) = lo;
            split_bf16x2(vv4.x, vv4.y, &hi.x, &lo.x), split_bf16x2(vv4.z, vv4.w, &hi.y, &lo.y);
            *(uint2 *)(Vh + j * LD + d) = hi, *(uint2 *)(Vl + j * LD + d) = lo;
        }
        __syncthreads();

        // S (16 rows x 64 keys): n-tile n holds keys k0 + 8n .. k0 + 8n + 7
        float sc[TC_BK / 8][4];
#pragma unroll
        for (int n = 0; n < TC_BK / 8; n++) {
            sc[n][0] = sc[n][1] = sc[n][2] = sc[n][3] = 0.0f;
            const int row = (8 * n + g) * LD + 2 * c;
#pragma unroll
            for (int s = 0; s < KS; s++) {
                const uint32_t bh0 = *(const uint32_t *)(Kh + row + 16 * s), bh1 = *(const uint32_t *)(Kh + row + 16 * s + 8);
                const uint32_t bl0 = *(const uint32_t *)(Kl + row + 16 * s), bl1 = *(const uint32_t *)(Kl + row + 16 * s + 8);
                mma_bf16x3(sc[n], qh[s], ql[s], bh0, bh1, bl0, bl1);
            }
        }
        // causal mask and the online softmax of rows ta (sc[.][0..1]) and tb (sc[.][2..3])
        float mta = -INFINITY, mtb = -INFINITY;
#pragma unroll
        for (int n = 0; n < TC_BK / 8; n++) {
            const int key = k0 + 8 * n + 2 * c;
            sc[n][0] = key <= last_a ? sc[n][0] : -INFINITY;
            sc[n][1] = key + 1 <= last_a ? sc[n][1] : -INFINITY;
            sc[n][2] = key <= last_b ? sc[n][2] : -INFINITY;
            sc[n][3] = key + 1 <= last_b ? sc[n][3] : -INFINITY;
            mta = fmaxf(mta, fmaxf(sc[n][0], sc[n][1]));
            mtb = fmaxf(mtb, fmaxf(sc[n][2], sc[n][3]));
        }
        mta = quad_max(mta), mtb = quad_max(mtb);
        // finite from the first tile on: key 0 <= last_a, last_b
        const float mna = fmaxf(ma, mta), mnb = fmaxf(mb, mtb);
        const float aa = expf(ma - mna), ab = expf(mb - mnb);  // m = -inf on the first tile: 0
        ma = mna, mb = mnb;
        float sa = 0.0f, sb = 0.0f;
#pragma unroll
        for (int n = 0; n < TC_BK / 8; n++) {
            sc[n][0] = expf(sc[n][0] - mna), sc[n][1] = expf(sc[n][1] - mna);  // masked: exp(-inf) = 0
            sc[n][2] = expf(sc[n][2] - mnb), sc[n][3] = expf(sc[n][3] - mnb);
            sa += sc[n][0] + sc[n][1], sb += sc[n][2] + sc[n][3];
        }
        la = la * aa + sa, lb = lb * ab + sb;
#pragma unroll
        for (int n = 0; n < ND; n++) o[n][0] *= aa, o[n][1] *= aa, o[n][2] *= ab, o[n][3] *= ab;

        // P as A fragments: k-step s (keys 16s..16s+15) is S n-tiles 2s and 2s + 1
        uint32_t ph[TC_BK / 16][4], pl[TC_BK / 16][4];
#pragma unroll
        for (int s = 0; s < TC_BK / 16; s++) {
            split_bf16x2(sc[2 * s][0], sc[2 * s][1], &ph[s][0], &pl[s][0]);
            split_bf16x2(sc[2 * s][2], sc[2 * s][3], &ph[s][1], &pl[s][1]);
            split_bf16x2(sc[2 * s + 1][0], sc[2 * s + 1][1], &ph[s][2], &pl[s][2]);
            split_bf16x2(sc[2 * s + 1][2], sc[2 * s + 1][3], &ph[s][3], &pl[s][3]);
        }
        // O += P V, two 8-wide dim tiles at a time; ldmatrix lane l addresses row (l & 7) + 8 ((l >> 3) & 1) of
        // the k-step and column 8 (l >> 4) of the pair
        const int lrow = (lane & 7) + 8 * ((lane >> 3) & 1), lcol = 8 * (lane >> 4);
#pragma unroll
        for (int n2 = 0; n2 < ND / 2; n2++) {
            float pv[2][4] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}};
#pragma unroll
            for (int s = 0; s < TC_BK / 16; s++) {
                uint32_t vh[4], vl[4];
                ldmatrix_x4_trans(vh, Vh + (16 * s + lrow) * LD + 16 * n2 + lcol);
                ldmatrix_x4_trans(vl, Vl + (16 * s + lrow) * LD + 16 * n2 + lcol);
                mma_bf16x3(pv[0], ph[s], pl[s], vh[0], vh[1], vl[0], vl[1]);
                mma_bf16x3(pv[1], ph[s], pl[s], vh[2], vh[3], vl[2], vl[3]);
            }
#pragma unroll
            for (int i = 0; i < 4; i++) o[2 * n2][i] += pv[0][i], o[2 * n2 + 1][i] += pv[1][i];
        }
    }
    la = quad_sum(la), lb = quad_sum(lb);
    const float ia = 1.0f / la, ib = 1.0f / lb;
    float *oa = out + (int64_t)ta * ldo + (int64_t)h * HD, *ob = out + (int64_t)tb * ldo + (int64_t)h * HD;
#pragma unroll
    for (int n = 0; n < ND; n++) {
        const int d = 8 * n + 2 * c;
        if (ta < T) oa[d] = o[n][0] * ia, oa[d + 1] = o[n][1] * ia;
        if (tb < T) ob[d] = o[n][2] * ib, ob[d + 1] = o[n][3] * ib;
    }
}

// The head_dims with a tensor-core kernel.
#define TC_HDS(X) X(16) X(32) X(48) X(64) X(80) X(96) X(112) X(128) X(144) X(160) X(176) X(192) X(208) X(224) X(240) X(256)

// ---- prefill: the tensor-core kernel where it applies, else the FMA kernel
extern "C" void gpu_set_tc_attn(dj_gpu *g, int on) { g->tc_attn = on; }

extern "C" int gpu_tc_attn_supported(const dj_gpu *g, int64_t head_dim) {
    return head_dim >= 16 && head_dim <= 256 && head_dim % 16 == 0 && tc_smem((int)head_dim) <= (size_t)g->tc_optin;
}

// The tensor-core prefill for this call, if switched on (the default) and the shape is one it has: launches it
// and sets *done, else leaves the call to the FMA kernel.
template <int KT>
static void attn_prefill_tc_launch(dim3 grid, size_t sm, cudaStream_t s, float *out, int64_t ldo, const float *q,
                                   int64_t ldq, const gpu_kv_cache *c, int T, int group, int hd, int max_seq,
                                   float scale, const int32_t *d_pos) {
#define TC_LAUNCH(HDV)                                                                                             \
    case HDV:                                                                                                      \
        attn_prefill_tc_kernel<HDV, KT><<<grid, TC_THREADS, sm, s>>>(out, ldo, q, ldq, *c, T, group, max_seq,     \
                                                                     scale, d_pos);                               \
        break;
    switch (hd) { TC_HDS(TC_LAUNCH) }
#undef TC_LAUNCH
}

static int attn_prefill_tc(dj_gpu *g, int *done, float *out, int64_t ldo, const float *q, int64_t ldq,
                           const gpu_kv_cache *c, int T, int group, int hd, int max_seq, float scale,
                           const int32_t *d_pos, int n_heads, cudaStream_t s, dj_err *e) {
    *done = 0;
    if (!g->tc_attn || !gpu_tc_attn_supported(g, hd) || ((uintptr_t)c->k & 15) || ((uintptr_t)c->v & 15)) return 0;
    *done = 1;
    dim3 grid((unsigned)((T + TC_BQ - 1) / TC_BQ), (unsigned)n_heads);
    const size_t sm = tc_smem(hd);
#define TC_TYPE(KT) attn_prefill_tc_launch<KT>(grid, sm, s, out, ldo, q, ldq, c, T, group, hd, max_seq, scale, d_pos)
    KV_SWITCH(c->type, TC_TYPE)
#undef TC_TYPE
    LAUNCH_CHECK("attn_prefill_tc", s);
    return 0;
}

extern "C" int gpu_attention_prefill(dj_gpu *g, float *out, int64_t ldo, const float *q, int64_t ldq,
                                     const gpu_kv_cache *c, int64_t T, int64_t n_heads,
                                     int64_t n_kv_heads, int64_t head_dim, int64_t max_seq, const int32_t *d_pos,
                                     cudaStream_t s, dj_err *e) {
    if (attn_check("gpu_attention_prefill", n_heads, n_kv_heads, head_dim, max_seq, e)) return -1;
    if (head_dim > g->prefill_max_hd)
        return dj_fail(e, "gpu_attention_prefill: head_dim %lld needs %zu bytes of shared memory per block; "
                          "this GPU allows head_dim <= %d", (long long)head_dim, prefill_smem((int)head_dim),
                       g->prefill_max_hd);
    if (T < 0 || T > max_seq || ldq < n_heads * head_dim || ldo < n_heads * head_dim)
        return dj_fail(e, "gpu_attention_prefill: bad T=%lld ldq=%lld ldo=%lld", (long long)T, (long long)ldq,
                       (long long)ldo);
    if (T == 0) return 0;
    const int group = (int)(n_heads / n_kv_heads), hd = (int)head_dim;
    const float scale = 1.0f / sqrtf((float)head_dim);
    int done;
    if (attn_prefill_tc(g, &done, out, ldo, q, ldq, c, (int)T, group, hd, (int)max_seq, scale, d_pos, (int)n_heads,
                        s, e))
        return -1;
    if (done) return 0;
    dim3 grid((unsigned)((T + PF_BQ - 1) / PF_BQ), (unsigned)n_heads);
    const size_t sm = prefill_smem(hd);
#define PF_LAUNCH(KT)                                                                                              \
    if (hd <= 64)                                                                                                  \
        attn_prefill_kernel<64, KT><<<grid, PF_THREADS, sm, s>>>(out, ldo, q, ldq, *c, (int)T, group, hd,         \
                                                                 (int)max_seq, scale, d_pos);                     \
    else if (hd <= 128)                                                                                            \
        attn_prefill_kernel<128, KT><<<grid, PF_THREADS, sm, s>>>(out, ldo, q, ldq, *c, (int)T, group, hd,        \
                                                                  (int)max_seq, scale, d_pos);                    \
    else                                                                                                           \
        attn_prefill_kernel<256, KT><<<grid, PF_THREADS, sm, s>>>(out, ldo, q, ldq, *c, (int)T, group, hd,        \
                                                                  (int)max_seq, scale, d_pos)
    KV_SWITCH(c->type, PF_LAUNCH)
#undef PF_LAUNCH
    LAUNCH_CHECK("attn_prefill", s);
    return 0;
}

// ---- decode: split-KV, then combine
#define DEC_CHUNK 64    // keys staged in shared memory at a time (a split loops over chunks of its keys)
#ifndef DEC_SPLITS
#define DEC_SPLITS 16   // splits a kv head aims at in a short context (dec_span)
#endif
#define DEC_G 8         // query heads of one kv head handled per block (more: blockIdx.x)
#define DEC_THREADS 128
// Split blocks a launch aims at: about four a multiprocessor (132 on an H200). A deep context uses only every
// DEC_DEEP_DIV-th of them (dec_span), each looping over more keys. Measured there (bench/results/kv_depth, 8B q4
// resident, f16 cache, ms a step at depth 0 / 8k / 32k, one call, each twice interleaved): 512 blocks 1.76 / 2.49 /
// 3.71, 512 with half of them deep 1.75 / 2.27 / 3.26 (the choice), 256 1.95 / 2.35 / 3.17, 384 1.94 / 2.42 / 3.28,
// 1024 with a quarter deep 1.80 / 2.29 / 3.41, 512 with a quarter 1.77 / 2.48 / 4.03. A grid of fewer blocks costs
// the depth-0 step 0.2 ms though every configuration there runs one block a kv head (not understood; seen in three
// calls), so the grid keeps 512 and the deep contexts take fewer, longer splits of it.
#ifndef DEC_BLOCKS
#define DEC_BLOCKS 512
#endif
#ifndef DEC_DEEP_DIV
#define DEC_DEEP_DIV 2
#endif
// Blocks a launch of rows each in blocks of their own aims at before a short context's splits shrink (dec_aim_of):
// about half a wave, fewer and longer splits, since at a short depth a split's fixed cost outweighs its keys; and
// the most keys such a split takes while the launch has fewer than DEC_BLOCKS blocks, since one long split a row
// leaves the GPU idle (bench/results/attn_rows, session 69).
#ifndef DEC_ROW_BLOCKS
#define DEC_ROW_BLOCKS 192
#endif
#define DEC_ROW_SPAN 256
#define DEC_MAX_SPLITS 1024 // the most splits a row's kv head is given (dec_grid_splits: at most DEC_BLOCKS)

// The splits a short context's kv head aims at in a launch (dec_aim_of): n_short, and up to n_fill where a split
// would pass DEC_ROW_SPAN keys.
typedef struct {
    int n_short, n_fill;
} dec_aim;

// Keys a split takes at a context of n keys, with the grid's n_splits splits a kv head. A short context (up to
// DEC_SPLITS chunks): the smallest of 16 and 32 that needs at most a.n_short splits; else whole chunks, one a split
// where the GPU has room for DEC_SPLITS of them (n_short = DEC_SPLITS), and where the rows fill it as few a split as
// n_short splits take, or as DEC_ROW_SPAN keys a split take up to n_fill splits. Measured on an H200 (one row:
// bench/results/gemv_rows, where 16 keys a split at every context sped a short context's step and slowed a
// 2000-token one's; many rows: bench/results/attn_rows). A deep context: whole chunks, as few a split as spread it
// over every DEC_DEEP_DIV-th split of the grid (each split loops over its chunks).
static __host__ __device__ __forceinline__ int dec_span(int n, int n_splits, dec_aim a) {
    if (n <= DEC_SPLITS * DEC_CHUNK) {
        for (int c = 16; c < DEC_CHUNK; c *= 2)
            if ((n + c - 1) / c <= (a.n_short < n_splits ? a.n_short : n_splits)) return c;
        if (a.n_short < DEC_SPLITS) {
            const int by_span = (n + DEC_ROW_SPAN - 1) / DEC_ROW_SPAN, ns = by_span < a.n_fill ? by_span : a.n_fill;
            const int splits = ns > a.n_short ? ns : a.n_short;
            return DEC_CHUNK * ((n + DEC_CHUNK * splits - 1) / (DEC_CHUNK * splits));
        }
        if ((n + DEC_CHUNK - 1) / DEC_CHUNK <= n_splits) return DEC_CHUNK;
    }
    const int deep = n_splits / DEC_DEEP_DIV > 0 ? n_splits / DEC_DEEP_DIV : 1;
    return DEC_CHUNK * ((n + DEC_CHUNK * deep - 1) / (DEC_CHUNK * deep));
}

// A launch's aim (dec_span) with `pairs` blocks a split (rows, or blocks of rows, x kv heads x groups of query
// heads): DEC_SPLITS, fewer where the pairs alone come near `blocks` (DEC_ROW_BLOCKS for rows each in blocks of its
// own: 1 from 192 pairs on, 24 rows of the 8B's 8 kv heads); n_fill the same of DEC_BLOCKS.
static dec_aim dec_aim_of(int64_t pairs, int64_t blocks) {
    const int64_t want = (blocks + pairs - 1) / pairs, fill = (DEC_BLOCKS + pairs - 1) / pairs;
    return dec_aim{want < DEC_SPLITS ? (int)want : DEC_SPLITS, fill < DEC_SPLITS ? (int)fill : DEC_SPLITS};
}

// The keys of row `row` that a decode launch copies before pdl_wait: those below the first key the pass writes in
// its slot (gpu_kv_rows.fresh). Reading them early is safe because of how the pass is launched: its positions,
// slots and fresh keys were uploaded before its first kernel, the kernel before a decode attention (rope_kv, the KV
// write, or a combine) passes its own pdl_wait before it lets this one launch, so every kernel before that one has
// finished, and only that one's writes (the queries, the pass's new keys and values) may be missing.
static __device__ __forceinline__ int dec_keys(const gpu_kv_rows &kv, int row, int max_seq) {  // keys 0..pos
    return min(kv.pos[row], max_seq - 1) + 1;
}
static __device__ __forceinline__ int dec_older(const gpu_kv_rows &kv, int row) {
    return min(kv.fresh ? kv.fresh[row] : kv.slot ? 0 : kv.pos[0], kv.pos[row]);  // (its own key is the pass's)
}

extern "C" void gpu_kv_fresh(int32_t *fresh, const int32_t *slot, const int32_t *pos, int64_t n, int32_t *first) {
    for (int64_t i = 0; i < n; i++) first[slot[i]] = INT32_MAX;
    for (int64_t i = 0; i < n; i++)
        if (pos[i] < first[slot[i]]) first[slot[i]] = pos[i];
    for (int64_t i = 0; i < n; i++) fresh[i] = first[slot[i]];
}

// Copies n bytes from global src to shared dst with every copy in flight at once (cp.async), in 16-byte pieces where
// both are 16-byte aligned and n a multiple of 16, else 4-byte, else byte by byte (plain loads). The caller commits.
static __device__ __forceinline__ void stage_bytes(void *dst, const void *src, int n) {
    const int tid = threadIdx.x;
    if ((((uintptr_t)src | (uintptr_t)dst | (uintptr_t)n) & 15) == 0) {
        for (int i = 16 * tid; i < n; i += 16 * DEC_THREADS)
            __pipeline_memcpy_async((char *)dst + i, (const char *)src + i, 16);
    } else if ((((uintptr_t)src | (uintptr_t)dst | (uintptr_t)n) & 3) == 0) {
        for (int i = 4 * tid; i < n; i += 4 * DEC_THREADS)
            __pipeline_memcpy_async((char *)dst + i, (const char *)src + i, 4);
    } else {
        for (int i = tid; i < n; i += DEC_THREADS) ((char *)dst)[i] = ((const char *)src)[i];
    }
}

// One block per (row and group of <= 8 query heads: blockIdx.x = row * n_gz + group chunk, kv head, split). Row
// b's query at q + b ldq, its position kv.pos[b], its caches kv.slot[b] * kv.slot_stride elements on (kv.slot
// NULL: the caches given). The split's keys go through shared memory a chunk of 64 at a time, as stored (KT, widened
// where read), the next chunk's copies in flight while this one is used when `stages` is 2; per chunk: scores, an
// online softmax per head (running max and sum), P.V into registers. Writes the unnormalised partial output with its
// max and sum:
//   part_o (rows, n_heads, n_splits, head_dim), part_ml (rows, n_heads, n_splits, 2) = (max score, sum of exp).
// PRECOND: head_dim even, <= 256; blockDim.x == DEC_THREADS; stages * dec_smem(head_dim, KT) bytes of dynamic
// shared memory.
template <int KT>
__global__ __launch_bounds__(DEC_THREADS) void attn_decode_split_kernel(float *part_o, float *part_ml, const float *q,
                                                                       int64_t ldq, gpu_kv_cache c, int n_heads,
                                                                       int group, int n_gz, int head_dim, int max_seq,
                                                                       int n_splits, dec_aim aim, int stages,
                                                                       float scale, gpu_kv_rows kv) {
    typedef typename kv_elem<KT>::T E;
    __shared__ float sc[DEC_G * DEC_CHUNK];      // scores, then probabilities (g, key)
    __shared__ float red[DEC_THREADS * DEC_G];   // P.V partials across key slices
    __shared__ float ml[DEC_G * 2];              // each head's running max and sum
    __shared__ float alpha[DEC_G];               // each head's rescale of what is summed so far, this chunk
    __shared__ float kvs[2][2 * DEC_CHUNK];      // q8: a stage's key scales, then its value scales
    extern __shared__ __align__(16) unsigned char dec_kv[];  // per stage: keys, then values (2, DEC_CHUNK, hd)
    const int split = blockIdx.z, kvh = blockIdx.y, row = blockIdx.x / n_gz, g0 = (blockIdx.x - row * n_gz) * DEC_G;
    const int ng = min(DEC_G, group - g0), hd = head_dim;
    // before pdl_wait (dec_older): the row's keys, the split's, and the first chunk's older keys in flight
    const int n = dec_keys(kv, row, max_seq);
    const int64_t slot_off = kv.slot ? (int64_t)kv.slot[row] * kv.slot_stride : 0;  // elements
    q += row * ldq;
    part_o += (int64_t)row * n_heads * n_splits * head_dim, part_ml += (int64_t)row * n_heads * n_splits * 2;
    const int span = dec_span(n, n_splits, aim), k_begin = split * span;
    if (k_begin >= n) return;  // whole block: this split is beyond the context (its slot free for the others)
    const int k_end = min(n, k_begin + span);
    const int h0 = kvh * group + g0;  // first query head of this block
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int64_t row0 = slot_off / hd + (int64_t)kvh * max_seq;  // the kv head's first cache row
    const int stage_elems = 2 * DEC_CHUNK * hd;

    // Rows [ja, jb) of chunk k0's keys and values (rows contiguous in the cache) and q8's scales into stage st:
    // every copy in flight at once (cp.async), one memory round trip where loads inside the loops would be one per
    // step. A stage is one group, committed with its last rows.
    auto stage_rows = [&](int st, int k0, int ja, int jb) {
        jb = min(jb, k_end - k0);
        if (ja >= jb) return;
        E *Ks = (E *)dec_kv + st * stage_elems + ja * hd;
        const int64_t r = row0 + k0 + ja;
        stage_bytes(Ks, (const E *)c.k + r * hd, (jb - ja) * hd * (int)sizeof(E));
        stage_bytes(Ks + DEC_CHUNK * hd, (const E *)c.v + r * hd, (jb - ja) * hd * (int)sizeof(E));
        if (KT == DJ_KV_Q8)
            for (int j = ja + tid; j < jb; j += DEC_THREADS)
                kvs[st][j] = c.ks[row0 + k0 + j], kvs[st][DEC_CHUNK + j] = c.vs[row0 + k0 + j];
    };
    auto stage = [&](int st, int k0) {
        stage_rows(st, k0, 0, DEC_CHUNK);
        __pipeline_commit();
    };
    const int early = min(DEC_CHUNK, max(0, dec_older(kv, row) - k_begin));  // the first chunk's rows before the wait
    stage_rows(0, k_begin, 0, early);
    pdl_wait();
    pdl_trigger();
    stage_rows(0, k_begin, early, DEC_CHUNK);
    __pipeline_commit();

    // q in registers: lane holds dims lane + 32 i of each head
    float qr[DEC_G][HD_MAX / 32];
#pragma unroll
    for (int g = 0; g < DEC_G; g++)
#pragma unroll
        for (int i = 0; i < HD_MAX / 32; i++) {
            const int d = lane + 32 * i;
            qr[g][i] = (g < ng && d < hd) ? q[(int64_t)(h0 + g) * hd + d] : 0.0f;
        }
    if (tid < DEC_G) ml[2 * tid] = -INFINITY, ml[2 * tid + 1] = 0.0f;

    // P.V: thread (slice, d) sums keys slice, slice + nsl, ... for dims d and d + 128
    const int dpt = hd >= DEC_THREADS ? DEC_THREADS : hd;  // threads per slice
    const int nsl = DEC_THREADS / dpt;                     // key slices
    const int sl = tid / dpt, dd = tid - sl * dpt;
    const bool two = dd + DEC_THREADS < hd;
    float acc[2][DEC_G];
#pragma unroll
    for (int g = 0; g < DEC_G; g++) acc[0][g] = acc[1][g] = 0.0f;

    for (int k0 = k_begin, st = 0; k0 < k_end; k0 += DEC_CHUNK) {
        const int nk = min(DEC_CHUNK, k_end - k0);
        const bool more = k0 + DEC_CHUNK < k_end;
        if (stages == 2 && more) {  // the next chunk's copies start now, into the other stage
            stage(st ^ 1, k0 + DEC_CHUNK);
            __pipeline_wait_prior(1);
        } else {
            __pipeline_wait_prior(0);
        }
        __syncthreads();  // this chunk staged by every thread
        const E *Ks = (const E *)dec_kv + st * stage_elems, *Vs = Ks + DEC_CHUNK * hd;
        const float *Kss = kvs[st], *Vss = kvs[st] + DEC_CHUNK;

        // scores: warp per key, lanes across head_dim
        for (int j = warp; j < nk; j += DEC_THREADS / 32) {
            float kr[HD_MAX / 32];
            const float ksc = kv_scale<KT>(Kss, j);
#pragma unroll
            for (int i = 0; i < HD_MAX / 32; i++) {
                const int d = lane + 32 * i;
                kr[i] = d < hd ? kv_get<KT>(Ks, j * hd + d, ksc) : 0.0f;
            }
#pragma unroll
            for (int g = 0; g < DEC_G; g++) {
                if (g >= ng) break;  // block-uniform
                float p = 0.0f;
#pragma unroll
                for (int i = 0; i < HD_MAX / 32; i++) p += qr[g][i] * kr[i];
                p = warp_sum(p);
                if (lane == 0) sc[g * DEC_CHUNK + j] = p * scale;
            }
        }
        __syncthreads();

        // the online softmax, warp per query head: the running max, this chunk's probabilities, the running sum
        for (int g = warp; g < ng; g += DEC_THREADS / 32) {
            float m = -INFINITY;
            for (int j = lane; j < nk; j += 32) m = fmaxf(m, sc[g * DEC_CHUNK + j]);
            m = fmaxf(warp_max(m), ml[2 * g]);
            float l = 0.0f;
            for (int j = lane; j < nk; j += 32) {
                const float p = expf(sc[g * DEC_CHUNK + j] - m);
                sc[g * DEC_CHUNK + j] = p;
                l += p;
            }
            l = warp_sum(l);
            __syncwarp();  // every lane has read ml[2 g] before lane 0 rewrites it
            if (lane == 0) {
                const float a = expf(ml[2 * g] - m);  // the first chunk: exp(-inf) = 0
                alpha[g] = a, ml[2 * g] = m, ml[2 * g + 1] = ml[2 * g + 1] * a + l;
            }
        }
        __syncthreads();

        if (sl < nsl) {
#pragma unroll
            for (int g = 0; g < DEC_G; g++) acc[0][g] *= alpha[g < ng ? g : 0], acc[1][g] *= alpha[g < ng ? g : 0];
#pragma unroll 4
            for (int j = sl; j < nk; j += nsl) {
                const float vsc = kv_scale<KT>(Vss, j);
                const float v0 = kv_get<KT>(Vs, j * hd + dd, vsc);
                const float v1 = two ? kv_get<KT>(Vs, j * hd + dd + DEC_THREADS, vsc) : 0.0f;
#pragma unroll
                for (int g = 0; g < DEC_G; g++) {
                    if (g >= ng) break;
                    const float p = sc[g * DEC_CHUNK + j];
                    acc[0][g] += p * v0;
                    acc[1][g] += p * v1;
                }
            }
        }
        if (more) {
            if (stages == 1) {
                __syncthreads();  // this stage is read by every thread before it is overwritten
                stage(0, k0 + DEC_CHUNK);
            } else {
                st ^= 1;
            }
        }
        __syncthreads();  // sc, alpha and (two stages) the stage read here are rewritten by the next chunk
    }

    if (nsl > 1) {  // then hd <= 64... < 128: one dim per thread, reduce the slices in shared memory
        if (sl < nsl)
#pragma unroll
            for (int g = 0; g < DEC_G; g++) red[(sl * DEC_G + g) * dpt + dd] = acc[0][g];
        __syncthreads();
        if (tid < dpt)
#pragma unroll
            for (int g = 0; g < DEC_G; g++) {
                float o = 0.0f;
                for (int k = 0; k < nsl; k++) o += red[(k * DEC_G + g) * dpt + tid];
                acc[0][g] = o;
            }
    }
    if (sl == 0) {
        for (int g = 0; g < ng; g++) {
            const int64_t base = ((int64_t)(h0 + g) * n_splits + split);
            part_o[base * hd + dd] = acc[0][g];
            if (two) part_o[base * hd + dd + DEC_THREADS] = acc[1][g];
            if (dd == 0) part_ml[2 * base] = ml[2 * g], part_ml[2 * base + 1] = ml[2 * g + 1];
        }
    }
}

// ---- decode on the tensor cores, over an f16 cache
// The same split and the same partials as attn_decode_split_kernel, with both products on the tensor cores
// (mma.sync m16n8k16, f16 operands, f32 accumulation). The 16 rows of the A operand are the kv head's query heads
// (group <= 8; the rest zero), so one block serves a kv head of a row. The cache's keys and values are f16 already:
// each is one exact operand; the query (scaled) and the probabilities are split into an f16 high part and an f16
// residual, two products each, so scores and outputs keep f32-class accuracy (the dropped term is ~2^-22 of each
// product). Each of the 4 warps takes 16 keys of every 64-key chunk, with its own online softmax in registers (no
// barrier inside a chunk); at the end the warps' partials are merged through shared memory. Chunks are staged with
// cp.async into rows padded by 8 halves (fragment loads in distinct banks), two stages in flight.
#define TD_WARPS 4
#define TD_STAGES 2
// Blocks a multiprocessor holds (attn_decode_tc_kernel's MINB) in launches of at least DEC_BLOCKS (row block, kv
// head) pairs: three, registers capped for them (shared memory holds three): 2.4% on a 64-row q4 turn, where a
// 16-row one lost 1% and one row at 8000 keys 10% (bench/results/step_turn/session71). Other launches: MINB 0, as
// many as the registers the kernel takes allow (two at head_dim 128).
#define TD_MANY_MINB 3

// f16: TD_STAGES stages of f16 key and value tiles (rows padded by 8). q8: one pair of f16 tiles the staged int8 rows
// are widened into, then TD_STAGES stages of the int8 rows and of their scales.
template <int HD, int KT> static size_t td_smem() {
    const size_t tiles = 2 * DEC_CHUNK * (HD + 8) * sizeof(__half);
    if (KT == DJ_KV_F16) return TD_STAGES * tiles;
    return tiles + (size_t)TD_STAGES * 2 * DEC_CHUNK * (HD + sizeof(float));
}

__device__ __forceinline__ void split_f16x2(float a, float b, uint32_t *hi, uint32_t *lo) {
    split_x2<true>(a, b, hi, lo);
}
__device__ __forceinline__ void mma_f16(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
    mma16816<true>(c, a, b0, b1);
}

// Rows of one slot (a pass, a prompt's run) go rg a block (blockIdx.x: rows rg x ..): the A operand's 16 rows are
// rg rows' group query heads (row r0 + i / group, head h0 + i % group), which read the same keys, each masked past
// its own position; the split is the one the block's deepest row takes (dec_span), as the combine works it out.
// PRECOND: HD % 16 == 0; group <= 8; rg group <= 16, rg = 1 unless the B rows are in one slot; blockDim.x ==
// 32 TD_WARPS; td_smem<HD>() bytes of dynamic shared memory; the cache f16 with 16-byte aligned rows.
template <int HD, int KT, int MINB>
__global__ __launch_bounds__(32 * TD_WARPS, MINB) void attn_decode_tc_kernel(float *part_o, float *part_ml,
                                                                            const float *q, int64_t ldq,
                                                                            gpu_kv_cache c, int n_heads, int group,
                                                                            int max_seq, int n_splits, dec_aim aim,
                                                                            int rg, int B, float scale,
                                                                            gpu_kv_rows kv) {
    constexpr int LD = HD + 8, KS = HD / 16, ND = HD / 8;
    constexpr int PIECES = KT == DJ_KV_F16 ? HD / 8 : HD / 16;  // 16-byte pieces a stored row
    constexpr bool Q8 = KT == DJ_KV_Q8;
    extern __shared__ __align__(16) __half td_sm[];  // f16: per stage keys (64, LD), then values; q8: td_smem
    int8_t *raw = (int8_t *)(td_sm + 2 * DEC_CHUNK * LD);          // q8: per stage keys (64, HD), then values
    float *rsc = (float *)(raw + TD_STAGES * 2 * DEC_CHUNK * HD);  // q8: per stage key scales (64), value scales
    const int split = blockIdx.z, kvh = blockIdx.y, r0 = blockIdx.x * rg, nr = min(rg, B - r0);
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, cq = lane & 3;
    // before pdl_wait (dec_older): the rows' keys, the split's, and the first chunk's older keys in flight. Lane
    // i < nr reads row r0 + i's keys (every load in flight at once); the block's deepest row's, and the keys before
    // any of its rows' new ones, across the warp (read a row at a time, 9 rows at 256 keys took 16.0 us, at once
    // 13.4, in two calls: bench/results/attn_rows/session68)
    const int mine = lane < nr ? dec_keys(kv, r0 + lane, max_seq) : 0;
    const int n = __reduce_max_sync(0xFFFFFFFFu, mine);
    const int older = __reduce_min_sync(0xFFFFFFFFu, lane < nr ? dec_older(kv, r0 + lane) : INT32_MAX);
    // the lane's A rows g and g + 8: row r0 + ra, query head h0 + ha (rows past the block's: none)
    const int ra = g / group, ha = g - ra * group, rb = (g + 8) / group, hb = g + 8 - rb * group;
    const int na = __shfl_sync(0xFFFFFFFFu, mine, ra & 31), nb = __shfl_sync(0xFFFFFFFFu, mine, rb & 31);
    const int64_t slot_off = kv.slot ? (int64_t)kv.slot[r0] * kv.slot_stride : 0;
    const int span = dec_span(n, n_splits, aim), k_begin = split * span;
    if (k_begin >= n) return;
    const int k_end = min(n, k_begin + span), ea = min(k_end, na), eb = min(k_end, nb);  // each A row's end
    const int h0 = kvh * group;
    typedef typename kv_elem<KT>::T E;
    const int64_t row0 = slot_off / HD + (int64_t)kvh * max_seq;  // the kv head's first cache row
    const E *kb = (const E *)c.k + row0 * HD, *vb = (const E *)c.v + row0 * HD;

    // Rows [ja, jb) of chunk k0 into stage st: their 16-byte pieces in flight at once (q8: and their scales); rows
    // past the split's end zeroed (their probabilities are 0, and 0 times a stale NaN would not be). A stage is one
    // group, committed with its last rows.
    auto stage_rows = [&](int st, int k0, int ja, int jb) {
        const int nk = min(DEC_CHUNK, k_end - k0);
        constexpr int RL = Q8 ? HD : LD;  // a staged row's elements
        E *Ks = Q8 ? (E *)(raw + st * 2 * DEC_CHUNK * HD) : (E *)(td_sm + st * 2 * DEC_CHUNK * LD);
        E *Vs = Ks + DEC_CHUNK * RL;
        constexpr int PE = 16 / sizeof(E);  // elements a piece
        for (int i = tid; i < (jb - ja) * PIECES; i += 32 * TD_WARPS) {
            const int j = ja + i / PIECES, p = (i % PIECES) * PE;
            if (j < nk) {
                __pipeline_memcpy_async(Ks + j * RL + p, kb + (int64_t)(k0 + j) * HD + p, 16);
                __pipeline_memcpy_async(Vs + j * RL + p, vb + (int64_t)(k0 + j) * HD + p, 16);
            } else {
                const uint4 z = make_uint4(0, 0, 0, 0);
                *(uint4 *)(Ks + j * RL + p) = z, *(uint4 *)(Vs + j * RL + p) = z;
            }
        }
        if (Q8)
            for (int j = ja + tid; j < jb; j += 32 * TD_WARPS) {
                float *sk = rsc + st * 2 * DEC_CHUNK;
                sk[j] = j < nk ? c.ks[row0 + k0 + j] : 0.0f, sk[DEC_CHUNK + j] = j < nk ? c.vs[row0 + k0 + j] : 0.0f;
            }
    };
    auto stage = [&](int st, int k0) {
        stage_rows(st, k0, 0, DEC_CHUNK);
        __pipeline_commit();
    };
    const int early = min(DEC_CHUNK, max(0, older - k_begin));  // the first chunk's rows before the wait
    stage_rows(0, k_begin, 0, early);
    pdl_wait();
    pdl_trigger();
    stage_rows(0, k_begin, early, DEC_CHUNK);
    __pipeline_commit();

    // Q fragments (A rows g and g + 8), scaled, split: k-step s covers dims 16s..16s+15.
    uint32_t qh[KS][4], ql[KS][4];
    q_frags<KS, true>(qh, ql, ra < nr ? q + (r0 + ra) * ldq + (int64_t)(h0 + ha) * HD : NULL,
                      rb < nr ? q + (r0 + rb) * ldq + (int64_t)(h0 + hb) * HD : NULL, scale, cq);
    float o[ND][4];
#pragma unroll
    for (int i = 0; i < ND; i++) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.0f;
    float ma = -INFINITY, mb = -INFINITY, la = 0.0f, lb = 0.0f;  // rows g, g + 8: running max, partial sums
    const int lrow = (lane & 7) + 8 * ((lane >> 3) & 1), lcol = 8 * (lane >> 4);

    for (int k0 = k_begin, st = 0; k0 < k_end; k0 += DEC_CHUNK, st ^= 1) {
        const bool more = k0 + DEC_CHUNK < k_end;
        if (more) {
            stage(st ^ 1, k0 + DEC_CHUNK);
            __pipeline_wait_prior(1);
        } else {
            __pipeline_wait_prior(0);
        }
        __syncthreads();  // this chunk staged by every thread
        if (Q8) {  // the int8 rows widened into the f16 tiles (exact: |k| <= 127); their scales stay beside
            const int8_t *rk = raw + st * 2 * DEC_CHUNK * HD;
            for (int i = tid; i < 2 * DEC_CHUNK * HD / 2; i += 32 * TD_WARPS) {
                const int e2 = 2 * i, j = e2 / HD, d = e2 - j * HD;  // j: 0..127 over keys then values
                *(__half2 *)(td_sm + j * LD + d) = __halves2half2(__int2half_rn(rk[e2]), __int2half_rn(rk[e2 + 1]));
            }
            __syncthreads();
        }
        const __half *Ks = td_sm + (Q8 ? 0 : st * 2 * DEC_CHUNK * LD) + 16 * warp * LD, *Vs = Ks + DEC_CHUNK * LD;
        const float *ksc = rsc + st * 2 * DEC_CHUNK + 16 * warp, *vsc = ksc + DEC_CHUNK;  // q8: this warp's keys'
        const int key0 = k0 + 16 * warp;  // this warp's 16 keys

        // S (16 heads x 16 keys): n-tile t holds keys key0 + 8t .. key0 + 8t + 7
        float sc[2][4];
#pragma unroll
        for (int t = 0; t < 2; t++) {
            sc[t][0] = sc[t][1] = sc[t][2] = sc[t][3] = 0.0f;
            const __half *kr = Ks + (8 * t + g) * LD + 2 * cq;
#pragma unroll
            for (int s = 0; s < KS; s++) {
                const uint32_t b0 = *(const uint32_t *)(kr + 16 * s), b1 = *(const uint32_t *)(kr + 16 * s + 8);
                mma_f16(sc[t], ql[s], b0, b1);
                mma_f16(sc[t], qh[s], b0, b1);
            }
        }
        // q8: each key's scale; keys past the split's end out; the online softmax of rows g (sc[.][0..1]) and g + 8
        // (sc[.][2..3])
        float mta = -INFINITY, mtb = -INFINITY;
#pragma unroll
        for (int t = 0; t < 2; t++) {
            const int key = key0 + 8 * t + 2 * cq;
            if (Q8) {
                const float s0 = ksc[8 * t + 2 * cq], s1 = ksc[8 * t + 2 * cq + 1];
                sc[t][0] *= s0, sc[t][2] *= s0, sc[t][1] *= s1, sc[t][3] *= s1;
            }
            if (key >= ea) sc[t][0] = -INFINITY;
            if (key + 1 >= ea) sc[t][1] = -INFINITY;
            if (key >= eb) sc[t][2] = -INFINITY;
            if (key + 1 >= eb) sc[t][3] = -INFINITY;
            mta = fmaxf(mta, fmaxf(sc[t][0], sc[t][1]));
            mtb = fmaxf(mtb, fmaxf(sc[t][2], sc[t][3]));
        }
        mta = quad_max(mta), mtb = quad_max(mtb);
        const float mna = fmaxf(ma, mta), mnb = fmaxf(mb, mtb);
        // a warp with no key yet (all of its keys past the end) keeps its state: exponents taken from 0, not -inf
        const float ua = mna == -INFINITY ? 0.0f : mna, ub = mnb == -INFINITY ? 0.0f : mnb;
        const float aa = expf(ma - ua), ab = expf(mb - ub);
        ma = mna, mb = mnb;
        float sa = 0.0f, sb = 0.0f;
#pragma unroll
        for (int t = 0; t < 2; t++) {
            sc[t][0] = expf(sc[t][0] - ua), sc[t][1] = expf(sc[t][1] - ua);
            sc[t][2] = expf(sc[t][2] - ub), sc[t][3] = expf(sc[t][3] - ub);
            sa += sc[t][0] + sc[t][1], sb += sc[t][2] + sc[t][3];
        }
        la = la * aa + sa, lb = lb * ab + sb;
        if (Q8)  // each value row's scale folded into its probability: P (diag s) V
#pragma unroll
            for (int t = 0; t < 2; t++) {
                const float s0 = vsc[8 * t + 2 * cq], s1 = vsc[8 * t + 2 * cq + 1];
                sc[t][0] *= s0, sc[t][2] *= s0, sc[t][1] *= s1, sc[t][3] *= s1;
            }
        // P as A fragments (one k-step: the 16 keys), split
        uint32_t ph[4], pl[4];
        split_f16x2(sc[0][0], sc[0][1], &ph[0], &pl[0]);
        split_f16x2(sc[0][2], sc[0][3], &ph[1], &pl[1]);
        split_f16x2(sc[1][0], sc[1][1], &ph[2], &pl[2]);
        split_f16x2(sc[1][2], sc[1][3], &ph[3], &pl[3]);
        // O = O alpha + P V, two 8-wide dim tiles at a time (V^T fragments by ldmatrix.trans)
#pragma unroll
        for (int n2 = 0; n2 < ND / 2; n2++) {
            uint32_t vf[4];
            ldmatrix_x4_trans(vf, Vs + lrow * LD + 16 * n2 + lcol);
            float pv[2][4] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}};
            mma_f16(pv[0], pl, vf[0], vf[1]);
            mma_f16(pv[0], ph, vf[0], vf[1]);
            mma_f16(pv[1], pl, vf[2], vf[3]);
            mma_f16(pv[1], ph, vf[2], vf[3]);
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const float a = i < 2 ? aa : ab;
                o[2 * n2][i] = o[2 * n2][i] * a + pv[0][i];
                o[2 * n2 + 1][i] = o[2 * n2 + 1][i] * a + pv[1][i];
            }
        }
        __syncthreads();  // every warp is done with this stage before it is refilled
    }
    la = quad_sum(la), lb = quad_sum(lb);

    // the warps' partials merged: (max, sum) and O of each warp's rows into shared memory, then one thread per
    // (head, dim) sums the warps at the largest max
    float *wo = (float *)td_sm;                  // (TD_WARPS, 16, HD)
    float *wml = wo + TD_WARPS * 16 * HD;        // (TD_WARPS, 16, 2)
    float *wo_w = wo + warp * 16 * HD;
#pragma unroll
    for (int i = 0; i < ND; i++) {
        const int d = 8 * i + 2 * cq;
        wo_w[g * HD + d] = o[i][0], wo_w[g * HD + d + 1] = o[i][1];
        wo_w[(g + 8) * HD + d] = o[i][2], wo_w[(g + 8) * HD + d + 1] = o[i][3];
    }
    if (cq == 0) {
        float *ml_w = wml + warp * 32;
        ml_w[2 * g] = ma, ml_w[2 * g + 1] = la, ml_w[2 * (g + 8)] = mb, ml_w[2 * (g + 8) + 1] = lb;
    }
    __syncthreads();
    for (int i = tid; i < nr * group * HD; i += 32 * TD_WARPS) {
        const int r = i / HD, d = i - r * HD;  // A row r: row r0 + r / group, query head h0 + r % group
        float m = -INFINITY;
#pragma unroll
        for (int w = 0; w < TD_WARPS; w++) m = fmaxf(m, wml[w * 32 + 2 * r]);
        float l = 0.0f, acc = 0.0f;
        if (m != -INFINITY)  // (a row whose keys all lie before this split: its partial is never read)
#pragma unroll
            for (int w = 0; w < TD_WARPS; w++) {
                const float f = expf(wml[w * 32 + 2 * r] - m);  // a warp without keys: exp(-inf) = 0
                l += wml[w * 32 + 2 * r + 1] * f, acc += wo[(w * 16 + r) * HD + d] * f;
            }
        const int64_t base = ((int64_t)(r0 + r / group) * n_heads + h0 + r % group) * n_splits + split;
        part_o[base * HD + d] = acc;
        if (d == 0) part_ml[2 * base] = m, part_ml[2 * base + 1] = l;
    }
}

// The head_dims with a tensor-core decode kernel.
#define TD_HDS(X) X(64) X(128)

// out (rows, n_heads, head_dim) from the partials of the splits that hold keys 0..pos. One block per (query head,
// row): the splits' weights exp(m_s - m) in shared memory (threads over splits), then each dim summed over the
// splits (threads over dims, reads coalesced). The split is the one the deepest row of the row's block of rg took.
__global__ __launch_bounds__(DEC_THREADS) void attn_decode_combine_kernel(float *out, const float *part_o,
                                                                         const float *part_ml, int head_dim,
                                                                         int max_seq, int n_splits, dec_aim aim,
                                                                         int rg, gpu_kv_rows kv) {
    __shared__ float w[DEC_MAX_SPLITS];
    __shared__ float red[DEC_THREADS / 32];
    const int h = blockIdx.x, row = blockIdx.y, n_heads = gridDim.x, tid = threadIdx.x;
    const int g0 = row / rg * rg, g1 = min((int)gridDim.y, g0 + rg);
    const int lane = tid & 31;
    const int deepest = __reduce_max_sync(0xFFFFFFFFu, g0 + lane < g1 ? dec_keys(kv, g0 + lane, max_seq) : 0);
    pdl_wait();
    pdl_trigger();
    const int n = dec_keys(kv, row, max_seq);
    out += (int64_t)row * n_heads * head_dim;
    part_o += (int64_t)row * n_heads * n_splits * head_dim, part_ml += (int64_t)row * n_heads * n_splits * 2;
    const int span = dec_span(deepest, n_splits, aim), ns = (n + span - 1) / span;
    const float *mlh = part_ml + (int64_t)h * n_splits * 2;
    float m = -INFINITY;
    for (int s = tid; s < ns; s += DEC_THREADS) m = fmaxf(m, mlh[2 * s]);
    m = warp_max(m);
    if ((tid & 31) == 0) red[tid >> 5] = m;
    __syncthreads();
    static_assert(DEC_THREADS == 128, "the combine's max reads four warps' maxima");
    m = fmaxf(fmaxf(red[0], red[1]), fmaxf(red[2], red[3]));
    float l = 0.0f;
    for (int s = tid; s < ns; s += DEC_THREADS) {
        const float ws = expf(mlh[2 * s] - m);
        w[s] = ws;
        l += mlh[2 * s + 1] * ws;
    }
    l = block_sum(l);  // its barriers also order the writes of w before the reads below
    const float inv = 1.0f / l;
    const float *po = part_o + (int64_t)h * n_splits * head_dim;
    for (int d = tid; d < head_dim; d += DEC_THREADS) {
        float o0 = 0.0f, o1 = 0.0f;  // two chains: the loads of both in flight
        int s = 0;
        for (; s + 1 < ns; s += 2)
            o0 += po[(int64_t)s * head_dim + d] * w[s], o1 += po[(int64_t)(s + 1) * head_dim + d] * w[s + 1];
        if (s < ns) o0 += po[(int64_t)s * head_dim + d] * w[s];
        out[(int64_t)h * head_dim + d] = (o0 + o1) * inv;
    }
}

// Splits a kv head gets in a launch of B rows: DEC_SPLITS, more where the rows and heads leave the GPU short of
// DEC_BLOCKS blocks, and never more than the context has chunks of 64 (every split then holds whole chunks).
static int64_t dec_grid_splits(int64_t B, int64_t n_kv_heads, int64_t n_gz, int64_t max_seq) {
    const int64_t want = (DEC_BLOCKS + B * n_kv_heads * n_gz - 1) / (B * n_kv_heads * n_gz);
    const int64_t chunks = (max_seq + DEC_CHUNK - 1) / DEC_CHUNK;
    int64_t ns = want > DEC_SPLITS ? want : DEC_SPLITS;
    if (ns > chunks) ns = chunks;
    return ns < 1 ? 1 : ns;
}
// A decode launch's split plan, as attn_decode_launch makes it and gpu_attention_splits reports it: groups of query
// heads a block (n_gz), the grid's splits a kv head (ns) and the splits a short context aims at (aim), for B rows
// rg a block (rows of one slot on the tensor-core kernel, dec_rows_a_block; else 1) and `group` query heads a kv head.
typedef struct {
    int64_t n_gz, ns;
    dec_aim aim;
} dec_plan;
static dec_plan dec_plan_of(int64_t B, int64_t group, int64_t n_kv_heads, int64_t max_seq, int64_t rg) {
    dec_plan p;
    p.n_gz = (group + DEC_G - 1) / DEC_G;
    p.ns = dec_grid_splits(B, n_kv_heads, p.n_gz, max_seq);
    // rows rg a block make rg times fewer blocks: they aim as B rows did (bench/results/attn_rows/session69)
    p.aim = dec_aim_of(B * n_kv_heads * p.n_gz, rg > 1 ? DEC_BLOCKS : DEC_ROW_BLOCKS);
    return p;
}
static size_t dec_smem(int hd, int kv_type) {  // a stage: a chunk's K and V as stored
    return 2 * dj_kv_elem_bytes(kv_type) * DEC_CHUNK * (size_t)hd;
}

// Rows of one slot a tensor-core block takes (the A operand's 16 rows over the kv head's query heads); 1 where the
// kernel takes none (group > DEC_G: the FMA kernel).
static int64_t dec_rows_a_block(int64_t group) { return group <= DEC_G ? 16 / group : 1; }

extern "C" size_t gpu_attention_scratch(int64_t rows, int64_t n_heads, int64_t n_kv_heads, int64_t head_dim,
                                        int64_t max_seq) {
    // any launch of up to `rows` rows: the largest rows * splits over them (not monotone in the rows, by a little)
    const int64_t group = n_kv_heads > 0 ? n_heads / n_kv_heads : 1, n_gz = (group + DEC_G - 1) / DEC_G;
    int64_t most = 0;
    for (int64_t B = 1; B <= rows; B++) {
        const int64_t u = B * dec_grid_splits(B, n_kv_heads > 0 ? n_kv_heads : 1, n_gz, max_seq);
        if (u > most) most = u;
    }
    return (size_t)most * (size_t)n_heads * (size_t)(head_dim + 2) * sizeof(float);
}

static int attn_decode_launch(dj_gpu *g, const char *fn, float *out, const float *q, int64_t ldq,
                              const gpu_kv_cache *c, int64_t B, int64_t n_heads,
                              int64_t n_kv_heads, int64_t head_dim, int64_t max_seq, gpu_kv_rows kv, cudaStream_t s,
                              dj_err *e) {
    if (attn_check(fn, n_heads, n_kv_heads, head_dim, max_seq, e)) return -1;
    if (B < 1) return dj_fail(e, "%s: bad rows B=%lld ldq=%lld", fn, (long long)B, (long long)ldq);
    const int64_t group = n_heads / n_kv_heads;
    const bool tc = (c->type == DJ_KV_F16 || c->type == DJ_KV_Q8) && g->tc_attn && group <= DEC_G &&
                    !((uintptr_t)c->k & 15) && !((uintptr_t)c->v & 15) && (head_dim == 64 || head_dim == 128);
    // the tensor-core kernel takes rows of one slot rg a block, each over the splits of the plan (dec_plan_of)
    const int64_t rg = tc && (!kv.slot || kv.one_slot) ? dec_rows_a_block(group) : 1;
    const dec_plan p = dec_plan_of(B, group, n_kv_heads, max_seq, rg);  // (it divides by the rows)
    const int64_t n_gz = p.n_gz, ns = p.ns, blocks = (B + rg - 1) / rg;
    const dec_aim aim = p.aim;
    if (B * n_gz > 65535 || (B > 1 && ldq < n_heads * head_dim))
        return dj_fail(e, "%s: bad rows B=%lld ldq=%lld", fn, (long long)B, (long long)ldq);
    if (scratch_need(g, gpu_attention_scratch(B, n_heads, n_kv_heads, head_dim, max_seq), s, e)) return -1;
    float *part_o = (float *)g->scratch, *part_ml = part_o + B * n_heads * ns * head_dim;
    // splits slowest: the grid holds the splits of the longest context the slots allow (a graph serves every
    // position), and a shorter context's blocks past its own splits return at once; dispatched last, they hold no
    // multiprocessor ahead of a working block
    dim3 grid((unsigned)(B * n_gz), (unsigned)n_kv_heads, (unsigned)ns);
    const float scale = 1.0f / sqrtf((float)head_dim);
    if (tc) {
        dim3 tgrid((unsigned)blocks, (unsigned)n_kv_heads, (unsigned)ns);
        const bool many = blocks * n_kv_heads >= DEC_BLOCKS;
#define TD_LAUNCH(HDV, KT, MINB)                                                                                   \
    if (head_dim == HDV && c->type == KT && many == (MINB == TD_MANY_MINB))                                        \
        CUDA_CHECK(pdl_launch(attn_decode_tc_kernel<HDV, KT, MINB>, tgrid, dim3(32 * TD_WARPS), td_smem<HDV, KT>(), \
                              s, part_o, part_ml, q, ldq, *c, (int)n_heads, (int)group, (int)max_seq, (int)ns, aim, \
                              (int)rg, (int)B, scale, kv));
#define TD_TYPES(HDV)                                                                                              \
    TD_LAUNCH(HDV, DJ_KV_F16, 0) TD_LAUNCH(HDV, DJ_KV_Q8, 0) TD_LAUNCH(HDV, DJ_KV_F16, TD_MANY_MINB)              \
    TD_LAUNCH(HDV, DJ_KV_Q8, TD_MANY_MINB)
        TD_HDS(TD_TYPES)
#undef TD_TYPES
#undef TD_LAUNCH
        LAUNCH_CHECK("attn_decode_tc", s);
    } else {
    const int stages = 2 * dec_smem((int)head_dim, c->type) <= (size_t)g->dec_smem_max ? 2 : 1;
#define DEC_LAUNCH(KT)                                                                                             \
    CUDA_CHECK(pdl_launch(attn_decode_split_kernel<KT>, grid, dim3(DEC_THREADS),                                  \
                          stages * dec_smem((int)head_dim, KT), s, part_o, part_ml, q, ldq, *c, (int)n_heads,     \
                          (int)group, (int)n_gz, (int)head_dim, (int)max_seq, (int)ns, aim, stages, scale,        \
                          kv))
    KV_SWITCH(c->type, DEC_LAUNCH)
#undef DEC_LAUNCH
    LAUNCH_CHECK("attn_decode_split", s);
    }
    CUDA_CHECK(pdl_launch(attn_decode_combine_kernel, dim3((unsigned)n_heads, (unsigned)B), dim3(DEC_THREADS), 0, s,
                          out, part_o, part_ml, (int)head_dim, (int)max_seq, (int)ns, aim, (int)rg, kv));
    LAUNCH_CHECK("attn_decode_combine", s);
    return 0;
}

extern "C" int gpu_attention_splits(int64_t B, int64_t n_heads, int64_t n_kv_heads, int64_t max_seq, int64_t pos,
                                    int64_t *n_splits, int64_t *span) {
    const dec_plan p = dec_plan_of(B, n_heads / n_kv_heads, n_kv_heads, max_seq, 1);
    const int64_t n = (pos < max_seq - 1 ? pos : max_seq - 1) + 1;  // as the kernels clamp it
    *n_splits = p.ns;
    *span = dec_span((int)n, (int)p.ns, p.aim);
    return (int)((n + *span - 1) / *span);
}

extern "C" int gpu_attention_decode(dj_gpu *g, float *out, const float *q, const gpu_kv_cache *c, int64_t n_heads,
                                    int64_t n_kv_heads, int64_t head_dim, int64_t max_seq, const int32_t *d_pos,
                                    cudaStream_t s, dj_err *e) {
    return attn_decode_launch(g, "gpu_attention_decode", out, q, 0, c, 1, n_heads, n_kv_heads, head_dim, max_seq,
                              gpu_kv_rows{d_pos, NULL, 0, NULL, 0}, s, e);
}

extern "C" int gpu_attention_decode_rows(dj_gpu *g, float *out, const float *q, int64_t ldq, const gpu_kv_cache *c,
                                         int64_t B, int64_t n_heads, int64_t n_kv_heads, int64_t head_dim,
                                         int64_t max_seq, const gpu_kv_rows *kv, cudaStream_t s, dj_err *e) {
    if (!kv->pos || kv->slot_stride < 0 || kv->slot_stride % head_dim)
        return dj_fail(e, "gpu_attention_decode_rows: no positions, or slots %lld elements apart",
                       (long long)kv->slot_stride);
    return attn_decode_launch(g, "gpu_attention_decode_rows", out, q, ldq, c, B, n_heads, n_kv_heads, head_dim,
                              max_seq, *kv, s, e);
}

// ---- set-up, run once by gpu_open
// The FMA prefill's shared-memory limit raised to `bytes` for every KV type (its tiles are f32 whichever the cache).
template <int HD> static cudaError_t prefill_allow(int bytes) {
    const cudaFuncAttribute a = cudaFuncAttributeMaxDynamicSharedMemorySize;
    cudaError_t r = cudaFuncSetAttribute(attn_prefill_kernel<HD, DJ_KV_F32>, a, bytes);
    if (r == cudaSuccess) r = cudaFuncSetAttribute(attn_prefill_kernel<HD, DJ_KV_F16>, a, bytes);
    if (r == cudaSuccess) r = cudaFuncSetAttribute(attn_prefill_kernel<HD, DJ_KV_Q8>, a, bytes);
    return r;
}
// Raises the dynamic shared-memory limit of decode, and of each FMA prefill instantiation to what its largest
// head_dim needs as far as the device allows (H100: 227 KB, all of them); records the largest head_dim that fits.
int attention_setup(dj_gpu *g, dj_err *e) {
    if (load_module_of(g, (const void *)attn_decode_split_kernel<DJ_KV_F32>, e)) return -1;
    int optin = 0;
    CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, g->device));
    // Decode stages a chunk's keys and values: 128 KiB at head_dim 256 (every device Djinn runs on has that).
    // Decode stages a chunk's keys and values (two stages where they fit): at least one stage of f32 at head_dim 256
    // (128 KiB; every device Djinn runs on has that) beside its static arrays (under 16 KiB).
    const size_t dec_static = 16 * 1024;
    if (dec_smem(HD_MAX, DJ_KV_F32) + dec_static > (size_t)optin)
        return dj_fail(e, "cuda: %s allows %d bytes of shared memory per block; decode attention needs %zu",
                       g->name, optin, dec_smem(HD_MAX, DJ_KV_F32) + dec_static);
    g->dec_smem_max = optin - (int)dec_static;
#define DEC_SET(KT)                                                                                                \
    CUDA_CHECK(cudaFuncSetAttribute(attn_decode_split_kernel<KT>, cudaFuncAttributeMaxDynamicSharedMemorySize,     \
                                    g->dec_smem_max))
    DEC_SET(DJ_KV_F32);
    DEC_SET(DJ_KV_F16);
    DEC_SET(DJ_KV_Q8);
#undef DEC_SET
    g->prefill_max_hd = 0;
    if (prefill_smem(64) > (size_t)optin) return 0;
    CUDA_CHECK(prefill_allow<64>((int)prefill_smem(64)));
    g->prefill_max_hd = 64;
    if (prefill_smem(128) > (size_t)optin) return 0;
    CUDA_CHECK(prefill_allow<128>((int)prefill_smem(128)));
    g->prefill_max_hd = 128;
    if (prefill_smem(256) > (size_t)optin) {
        g->prefill_max_hd = (int)((optin / sizeof(float) - PF_BQ * (PF_BK + 1) - PF_BQ - PF_BK) / (PF_BQ + 2 * PF_BK)) & ~1;
        if (g->prefill_max_hd > HD_MAX) g->prefill_max_hd = HD_MAX;
    } else {
        g->prefill_max_hd = HD_MAX;
    }
    if (g->prefill_max_hd > 128)
        CUDA_CHECK(prefill_allow<256>((int)prefill_smem(g->prefill_max_hd)));
    return 0;
}

// Raises the tensor-core kernels' shared-memory limits (H100: all fit; elsewhere the ones that do).
int tc_setup(dj_gpu *g, dj_err *e) {
    int optin = 0;
    CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, g->device));
    g->tc_optin = optin;
    g->tc_attn = 1;
#define TC_SET(HDV)                                                                                              \
    if (tc_smem(HDV) <= (size_t)optin) {                                                                         \
        CUDA_CHECK(cudaFuncSetAttribute(attn_prefill_tc_kernel<HDV, DJ_KV_F32>,                                  \
                                        cudaFuncAttributeMaxDynamicSharedMemorySize, (int)tc_smem(HDV)));        \
        CUDA_CHECK(cudaFuncSetAttribute(attn_prefill_tc_kernel<HDV, DJ_KV_F16>,                                  \
                                        cudaFuncAttributeMaxDynamicSharedMemorySize, (int)tc_smem(HDV)));        \
        CUDA_CHECK(cudaFuncSetAttribute(attn_prefill_tc_kernel<HDV, DJ_KV_Q8>,                                   \
                                        cudaFuncAttributeMaxDynamicSharedMemorySize, (int)tc_smem(HDV)));        \
    }
    TC_HDS(TC_SET)
#undef TC_SET
#define TD_SET1(HDV, KT, MINB)                                                                                    \
    CUDA_CHECK(cudaFuncSetAttribute(attn_decode_tc_kernel<HDV, KT, MINB>, cudaFuncAttributeMaxDynamicSharedMemorySize, \
                                    (int)td_smem<HDV, KT>()));
#define TD_SET(HDV)                                                                                               \
    TD_SET1(HDV, DJ_KV_F16, 0) TD_SET1(HDV, DJ_KV_Q8, 0) TD_SET1(HDV, DJ_KV_F16, TD_MANY_MINB)                    \
    TD_SET1(HDV, DJ_KV_Q8, TD_MANY_MINB)
    TD_HDS(TD_SET)
#undef TD_SET
#undef TD_SET1
    return 0;
}
