// dense_rows.cu: y (T, n_out) f32 = x (T, n_in) . W^T for f16 and bf16 W and passes of 2 to DROW_MAX_T tokens, each
// weight read once. cuBLAS multiplies bf16 W twice there (x as hi + lo, two GEMMs: the 8B's layer at 0.39 of its
// bytes' rate at 2 tokens); here a lane loads its 16 bytes of two rows straight into registers and they are the
// mma's A fragments as they stand, both of x's parts multiplied with them (0.71). For f16 cuBLAS reads W once and is
// as fast or faster on three of the 8B's four matrices, so gpu_matmul keeps it there (bench/drow_bench.cu,
// bench/results/step_turn/session75).
//
// Why no shuffle is needed: lane (g, c) of a warp loads inputs 8c .. 8c + 7 of each 32 (a k-block) of rows g and
// g + 8 of the warp's 16. m16n8k16 wants the thread's inputs at k = 2c, 2c + 1 (A's a0, a1, B's b0) and 2c + 8,
// 2c + 9 (a2, a3, b1); a sum does not care which input stands at which k, so step s (0, 1) of the k-block takes the
// lane's inputs 8c + 4s, +1 as k = 2c, 2c + 1 and 8c + 4s + 2, +3 as 2c + 8, 2c + 9: words 2s and 2s + 1 of the
// lane's 16 bytes, of W's rows and of x's token g alike. x is rounded to f16 first (bf16 W: hi + lo in bf16, both
// multiplied: the cuBLAS path's operands), in scratch, by the kernel before this one.
//
// Work: a CTA takes DROW_ROWS rows (a 16-row tile a warp) and a slice of the k-blocks; S slices of a row block run
// as S CTAs. With S > 1, slice 0 writes its sums to y and the others to scratch; the last warp of the S to finish
// its rows (a ticket a warp's rows) adds them in slice order into y and puts the ticket back to zero, so y does not
// depend on which slice finished first and the next launch finds its tickets zeroed.
#include "kernels_impl.h"

#define DROW_WARPS 8
#define DROW_ROWS (16 * DROW_WARPS)
#define DROW_PART_CTAS 512  // the most CTAs past the first slice of each row block: bounds the slices' sums
#define DROW_TICKETS 4096   // a split launch's tickets: row blocks x DROW_WARPS

struct drow_args {
    float *y;                  // (T, n_out)
    const uint4 *x, *xlo;      // (T, n_in) in W's dtype; xlo: bf16's low parts, NULL for f16
    const uint16_t *w;         // (n_out, n_in)
    int64_t T, n_in, n_out;
    int64_t kblocks, S;        // k-blocks of 32 inputs (the last may be part); slices
    float *part;               // slices 1 .. S - 1's sums: (row blocks, S - 1, DROW_WARPS, ACC, 32)
    unsigned *tickets;         // (row blocks, DROW_WARPS), zero
};

// m16n8k16 in W's dtype (kernels_impl.h's mma16816 for f16)
template <int WT> static __device__ __forceinline__ void mma_w(float *d, const uint32_t *a, const uint32_t *b) {
    if (WT == DJ_F16)
        mma16816(d, a, b);
    else
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                     "{%0,%1,%2,%3};\n"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

static __device__ __forceinline__ uint32_t word(const uint4 &v, int i) {
    return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

// 16 bytes at p where ok, else zeros (the load from `safe`: a select, no branch around it). STREAM: W's bytes, read
// once, past L1, so x stays there for the CTA's other warps; else x's, cached. Volatile, as the mma are: the next
// k-blocks' loads stay ahead of the products of the current ones.
template <bool STREAM> static __device__ __forceinline__ uint4 ld16(const uint4 *p, const uint4 *safe, bool ok) {
    uint4 v;
    if (STREAM)
        asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                     : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                     : "l"(ok ? p : safe));
    else
        asm volatile("ld.global.nc.v4.u32 {%0, %1, %2, %3}, [%4];"
                     : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                     : "l"(ok ? p : safe));
    return ok ? v : make_uint4(0, 0, 0, 0);
}

// NT n8 tiles of tokens (8 NT >= T), U k-blocks a lane has in flight ahead of the ones it multiplies.
template <int WT, int NT, int U>
__global__ void __launch_bounds__(DROW_WARPS * 32, 2) drow_kernel(drow_args a) {
    constexpr int ACC = NT * 4;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, c = lane & 3;
    const int64_t rb = blockIdx.x / a.S, sl = blockIdx.x % a.S;
    const int64_t k0 = sl * a.kblocks / a.S, k1 = (sl + 1) * a.kblocks / a.S;
    const int64_t r0 = rb * DROW_ROWS + warp * 16, nv = a.n_in / 8;  // nv: a row's 16-byte pieces
    // rows past n_out read the last row again (sums never stored)
    const uint4 *w0 = (const uint4 *)(a.w + (r0 + g < a.n_out ? r0 + g : a.n_out - 1) * a.n_in);
    const uint4 *w8 = (const uint4 *)(a.w + (r0 + g + 8 < a.n_out ? r0 + g + 8 : a.n_out - 1) * a.n_in);
    uint4 q0[U], q8[U], n0[U], n8[U];
    // k-blocks kb .. kb + U - 1 of the lane's rows (zeros past the slice or the row)
    auto load = [&](int64_t kb, uint4 *A, uint4 *B) {
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int64_t v = 4 * (kb + u) + c;
            const bool ok = kb + u < k1 && v < nv;
            A[u] = ld16<true>(w0 + v, w0, ok);
            B[u] = ld16<true>(w8 + v, w8, ok);
        }
    };
    if (k0 < k1) load(k0, q0, q8);
    pdl_wait();  // x is the kernel before's
    float acc[NT][4];
#pragma unroll
    for (int nt = 0; nt < NT; nt++) acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.0f;
    for (int64_t kb = k0; kb < k1; kb += U) {
        if (kb + U < k1) load(kb + U, n0, n8);
        // the group's x before its products (zeros past the slice, the row or T: their weights are zeros too)
        uint4 xv[U][NT], xl[WT == DJ_BF16 ? U : 1][NT];
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int64_t v = 4 * (kb + u) + c;
#pragma unroll
            for (int nt = 0; nt < NT; nt++) {
                const int64_t t = 8 * nt + g;
                const bool ok = kb + u < k1 && t < a.T && v < nv;
                xv[u][nt] = ld16<false>(a.x + t * nv + v, a.x, ok);
                if (WT == DJ_BF16) xl[u][nt] = ld16<false>(a.xlo + t * nv + v, a.xlo, ok);
            }
        }
#pragma unroll
        for (int u = 0; u < U; u++) {
#pragma unroll
            for (int s = 0; s < 2; s++) {
                const uint32_t af[4] = {word(q0[u], 2 * s), word(q8[u], 2 * s), word(q0[u], 2 * s + 1),
                                        word(q8[u], 2 * s + 1)};
#pragma unroll
                for (int nt = 0; nt < NT; nt++) {
                    const uint32_t bf[2] = {word(xv[u][nt], 2 * s), word(xv[u][nt], 2 * s + 1)};
                    mma_w<WT>(acc[nt], af, bf);
                    if (WT == DJ_BF16) {
                        const uint32_t bl[2] = {word(xl[WT == DJ_BF16 ? u : 0][nt], 2 * s),
                                                word(xl[WT == DJ_BF16 ? u : 0][nt], 2 * s + 1)};
                        mma_w<WT>(acc[nt], af, bl);
                    }
                }
            }
        }
#pragma unroll
        for (int u = 0; u < U; u++) q0[u] = n0[u], q8[u] = n8[u];
    }

    // the sums: rows r0 + g (acc[.][0..1]) and r0 + g + 8 ([2..3]), tokens 8 nt + 2c and + 1
    auto store = [&](const float *v) {
#pragma unroll
        for (int nt = 0; nt < NT; nt++) store_frag(a.y, a.T, a.n_out, r0 + g, 8 * nt + 2 * c, v + 4 * nt);
    };
    const float *mine = &acc[0][0];
    if (a.S == 1) {
        store(mine);
        return;
    }
    float *part = a.part + (rb * (a.S - 1) * DROW_WARPS + warp) * (ACC * 32) + lane;  // slice 1's; slice s at
    const int64_t slice_stride = DROW_WARPS * ACC * 32;                             // (s - 1) slice_stride
    if (sl == 0) {
        store(mine);
    } else {
#pragma unroll
        for (int i = 0; i < ACC; i++) part[(sl - 1) * slice_stride + i * 32] = mine[i];
    }
    // the ticket releases the warp's sums and, for the last slice, acquires every other's
    unsigned *ticket = a.tickets + rb * DROW_WARPS + warp;
    if ((int64_t)warp_ticket(ticket) != a.S - 1) return;
    float sum[ACC];
    if (sl == 0) {
#pragma unroll
        for (int i = 0; i < ACC; i++) sum[i] = mine[i];
    } else {  // slice 0's sums from y, where it stored them (elsewhere never stored: zeros)
#pragma unroll
        for (int nt = 0; nt < NT; nt++) {
            const int64_t row = r0 + g, tok = 8 * nt + 2 * c;
            float *d = sum + 4 * nt;
            d[0] = row < a.n_out && tok < a.T ? __ldcg(a.y + tok * a.n_out + row) : 0.0f;
            d[1] = row < a.n_out && tok + 1 < a.T ? __ldcg(a.y + (tok + 1) * a.n_out + row) : 0.0f;
            d[2] = row + 8 < a.n_out && tok < a.T ? __ldcg(a.y + tok * a.n_out + row + 8) : 0.0f;
            d[3] = row + 8 < a.n_out && tok + 1 < a.T ? __ldcg(a.y + (tok + 1) * a.n_out + row + 8) : 0.0f;
        }
    }
    for (int64_t s = 1; s < a.S; s++)
#pragma unroll
        for (int i = 0; i < ACC; i++) sum[i] += s == sl ? mine[i] : __ldcg(part + (s - 1) * slice_stride + i * 32);
    store(sum);
    if (lane == 0) *ticket = 0;
}

// Bytes of scratch the slices' sums take past x's copy, for a pass of T tokens: the most any launch uses (at most
// DROW_PART_CTAS CTAs' sums), never less for more tokens.
size_t drow_part_bytes(int64_t T) {
    const size_t tokens = T <= 8 ? 8 : 16;  // drow_launch's n8 tiles
    return (size_t)DROW_PART_CTAS * DROW_ROWS * tokens * sizeof(float);
}

int drow_takes(uint32_t wtype, const void *w, int64_t T, int64_t n_in, int64_t n_out) {
    return (wtype == DJ_F16 || wtype == DJ_BF16) && T >= 2 && T <= DROW_MAX_T && n_in % 8 == 0 && n_out >= 1 &&
           ((uintptr_t)w & 15) == 0;
}

// Slices for the shape on g: as many as one wave of CTAs holds (two a multiprocessor; the 8B's and 70B's matrices at
// 2-16 tokens were fastest there, and a part second wave cost the 8B's q|k|v 30%: bench/results/step_turn/session75),
// each slice at least 8 k-blocks, the sums within DROW_PART_CTAS CTAs and the tickets within DROW_TICKETS.
static int64_t drow_slices(const dj_gpu *g, int64_t n_in, int64_t n_out) {
    const int64_t rbs = (n_out + DROW_ROWS - 1) / DROW_ROWS, kblocks = (n_in + 31) / 32;
    int64_t S = 2 * (int64_t)g->n_sm / rbs;
    if (S > kblocks / 8) S = kblocks / 8;
    if (S > 1 + DROW_PART_CTAS / rbs) S = 1 + DROW_PART_CTAS / rbs;
    return S < 1 || rbs * DROW_WARPS > DROW_TICKETS ? 1 : S;
}

template <int WT, int NT, int U>
static int drow_go(const drow_args &a, int64_t rbs, cudaStream_t s, dj_err *e) {
    CUDA_CHECK(pdl_launch(drow_kernel<WT, NT, U>, dim3((unsigned)(rbs * a.S)), dim3(DROW_WARPS * 32), 0, s, a));
    LAUNCH_CHECK("drow", s);
    return 0;
}

int drow_launch(dj_gpu *g, int64_t S, float *y, const void *xb, const void *xlo, void *part, const void *w,
                uint32_t wtype, int64_t T, int64_t n_in, int64_t n_out, cudaStream_t s, dj_err *e) {
    const int64_t rbs = (n_out + DROW_ROWS - 1) / DROW_ROWS, kblocks = (n_in + 31) / 32;
    if (S <= 0) S = drow_slices(g, n_in, n_out);
    if (S > kblocks || (S > 1 && ((S - 1) * rbs > DROW_PART_CTAS || rbs * DROW_WARPS > DROW_TICKETS)) ||
        rbs * S > INT32_MAX)
        return dj_fail(e, "drow: %lld slices of %lld row blocks and %lld k-blocks", (long long)S, (long long)rbs,
                       (long long)kblocks);
    const drow_args a = {y, (const uint4 *)xb, (const uint4 *)xlo, (const uint16_t *)w, T, n_in, n_out, kblocks, S,
                         (float *)part, g->drow_tickets};
    const bool bf = wtype == DJ_BF16;
    if (T <= 8) return bf ? drow_go<DJ_BF16, 1, 4>(a, rbs, s, e) : drow_go<DJ_F16, 1, 4>(a, rbs, s, e);
    return bf ? drow_go<DJ_BF16, 2, 2>(a, rbs, s, e) : drow_go<DJ_F16, 2, 2>(a, rbs, s, e);
}

int drow_setup(dj_gpu *g, dj_err *e) {
    if (gpu_malloc((void **)&g->drow_tickets, DROW_TICKETS * sizeof(unsigned), "the dense rows' tickets", e))
        return -1;
    CUDA_CHECK(cudaMemset(g->drow_tickets, 0, DROW_TICKETS * sizeof(unsigned)));
    return load_module_of(g, (const void *)drow_kernel<DJ_F16, 1, 4>, e);
}
