// bench/attn_bench.cu: decode attention for B rows of a batched step (gpu_attention_decode_rows, what the server's
// pass runs each layer) on the Llama-3-8B's heads (32 query heads, 8 kv heads, head_dim 128), each row at the same
// depth in a slot of its own, beside the HBM ceiling measured in the same run: a D2D copy. The bytes are the KV the
// rows attend to (each row's keys and values once, as stored: f16, q8 with its scales, or f32); the launches cycle
// over enough layers' slots that they miss the L2, and run in a CUDA graph as a step runs them.
//
//   build/bin/attn_bench OUT.json
// ATTN_ROWS (default "1 4 16 64"), ATTN_DEPTHS (keys a row attends to; default "96 256 480"), ATTN_CTX (a slot's
// positions, the server's -c; default 512, raised to a depth that needs more), ATTN_KV (f16, q8 or f32; default f16),
// ATTN_ONE_SLOT=1 (the rows one sequence's, at the positions before the depth, in one slot: a verification pass, a
// prompt's run; the bytes are that slot's keys and values once). Each row's keys before the first one its pass
// writes are copied before the kernels' wait, as in a pass (gpu_kv_rows.fresh; until session 69 the one-slot runs
// copied none early).
#include <string.h>

#include "bench_gpu.h"

static std::vector<int64_t> env_list(const char *name, const char *def) {
    const char *v = getenv(name);
    std::vector<int64_t> out;
    for (const char *p = v && *v ? v : def; *p;) {
        char *end;
        const long long x = strtoll(p, &end, 10);
        if (end == p) {
            fprintf(stderr, "attn_bench: %s: not a list of numbers: %s\n", name, v);
            exit(2);
        }
        if (x < 1) {
            fprintf(stderr, "attn_bench: %s: %lld is below 1\n", name, x);
            exit(2);
        }
        out.push_back(x);
        p = end;
        while (*p == ' ' || *p == ',') p++;
    }
    return out;
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: attn_bench OUT.json\n");
        return 2;
    }
    const int64_t n_heads = 32, n_kv = 8, hd = 128;
    const std::vector<int64_t> rows = env_list("ATTN_ROWS", "1 4 16 64");
    const std::vector<int64_t> depths = env_list("ATTN_DEPTHS", "96 256 480");
    const int64_t ctx0 = env_list("ATTN_CTX", "512")[0];
    const char *kvname = getenv("ATTN_KV") ? getenv("ATTN_KV") : "f16";
    const int kt = dj_kv_parse(kvname);
    const bool one = getenv("ATTN_ONE_SLOT") && atoi(getenv("ATTN_ONE_SLOT")) == 1;
    if (kt < 0) {
        fprintf(stderr, "attn_bench: ATTN_KV: %s is not one of " DJ_KV_NAMES "\n", kvname);
        return 2;
    }
    FILE *jf = fopen(argv[1], "w");
    if (!jf) {
        fprintf(stderr, "attn_bench: cannot write %s\n", argv[1]);
        return 1;
    }
    cudaStream_t s;
    cudaDeviceProp prop;
    dj_gpu *g = bench_open("attn_bench", &s, &prop);

    const size_t big = (size_t)1 << 30;  // the ceiling: D2D of 1 GiB, read + write
    void *src, *dst;
    CK(cudaMalloc(&src, big));
    CK(cudaMalloc(&dst, big));
    const double d2d_gbs = d2d_copy_gbs(s, dst, src, big);
    CK(cudaFree(src));
    CK(cudaFree(dst));
    size_t free_b, total_b;
    CK(cudaMemGetInfo(&free_b, &total_b));
    printf("decode attention, Llama-3-8B heads (32 / 8 kv, head_dim 128), %s cache; D2D %.0f GB/s in this run\n",
           kvname, d2d_gbs);
    printf("%6s %7s %7s %7s %10s %10s %10s %8s\n", "rows", "depth", "ctx", "layers", "us", "KV MB", "GB/s", "of D2D");
    fprintf(jf, "{\"d2d_gbs\": %.1f, \"kv\": \"%s\", \"cases\": [", d2d_gbs, kvname);

    int first = 1;
    for (int64_t B : rows)
        for (int64_t depth : depths) {
            const int64_t ctx = depth > ctx0 ? (depth + 63) / 64 * 64 : ctx0;
            const size_t row_b = dj_kv_row_bytes(kt, hd);  // a position of a kv head, as stored
            if (one && B > depth) continue;
            const size_t slot_b = 2 * (size_t)n_kv * ctx * row_b;
            const size_t read_b = (size_t)(one ? 1 : B) * depth * 2 * n_kv * row_b;
            int64_t layers = std::max<int64_t>(2, (int64_t)(4 * (size_t)prop.l2CacheSize / read_b) + 1);
            layers = std::min<int64_t>(layers, 1024);
            if ((size_t)layers * B * slot_b > free_b / 2) layers = (int64_t)(free_b / 2 / (B * slot_b));
            if (layers < 1) {
                printf("%6lld %7lld %7lld: the slots do not fit in the GPU's memory\n", (long long)B, (long long)depth,
                       (long long)ctx);
                continue;
            }
            // one cache of layers x B slots, (n_kv, ctx, hd) each; layer l's rows in slots l B .. l B + B - 1
            const size_t elems = (size_t)layers * B * n_kv * ctx * hd;
            gpu_kv_cache c = {NULL, NULL, NULL, NULL, kt};
            CK(cudaMalloc(&c.k, elems * dj_kv_elem_bytes(kt)));
            CK(cudaMalloc(&c.v, elems * dj_kv_elem_bytes(kt)));
            if (kt == DJ_KV_F32) {
                fill_kernel<float><<<4096, 256, 0, s>>>((float *)c.k, elems, 1);
                fill_kernel<float><<<4096, 256, 0, s>>>((float *)c.v, elems, 2);
            } else {  // f16 values in [-0.5, 0.5); q8 takes the same bits as int8s
                fill_u16_kernel<<<4096, 256, 0, s>>>((uint16_t *)c.k, elems * dj_kv_elem_bytes(kt) / 2, 1, 0);
                fill_u16_kernel<<<4096, 256, 0, s>>>((uint16_t *)c.v, elems * dj_kv_elem_bytes(kt) / 2, 2, 0);
            }
            if (kt == DJ_KV_Q8) {
                CK(cudaMalloc(&c.ks, elems / hd * sizeof(float)));
                CK(cudaMalloc(&c.vs, elems / hd * sizeof(float)));
                fill_kernel<float><<<4096, 256, 0, s>>>(c.ks, elems / hd, 3);
                fill_kernel<float><<<4096, 256, 0, s>>>(c.vs, elems / hd, 4);
            }
            float *q, *out;
            int32_t *pos, *slot, *fresh;
            CK(cudaMalloc(&q, B * n_heads * hd * sizeof(float)));
            CK(cudaMalloc(&out, B * n_heads * hd * sizeof(float)));
            fill_kernel<float><<<256, 256, 0, s>>>(q, B * n_heads * hd, 5);
            CK(cudaGetLastError());
            std::vector<int32_t> hpos(B, (int32_t)(depth - 1)), hslot(layers * B);
            for (int64_t i = 0; i < layers * B; i++) hslot[i] = (int32_t)(one ? i / B * B : i);
            if (one)
                for (int64_t b = 0; b < B; b++) hpos[b] = (int32_t)(depth - B + b);
            // the first key the pass writes in each row's slot (gpu_kv_fresh): the row's own, or the run's first
            const std::vector<int32_t> hfresh(B, one ? hpos[0] : (int32_t)(depth - 1));
            CK(cudaMalloc(&pos, B * sizeof(int32_t)));
            CK(cudaMalloc(&fresh, B * sizeof(int32_t)));
            CK(cudaMemcpy(fresh, hfresh.data(), B * sizeof(int32_t), cudaMemcpyHostToDevice));
            CK(cudaMalloc(&slot, layers * B * sizeof(int32_t)));
            CK(cudaMemcpy(pos, hpos.data(), B * sizeof(int32_t), cudaMemcpyHostToDevice));
            CK(cudaMemcpy(slot, hslot.data(), layers * B * sizeof(int32_t), cudaMemcpyHostToDevice));
            CKD(gpu_reserve(g, gpu_attention_scratch(B, n_heads, n_kv, hd, ctx), &e_));
            const double ms = time_graph_ms(s, (int)layers, 21, [&](int l) {
                gpu_kv_rows kv = {pos, slot + l * B, n_kv * ctx * hd, fresh, one};
                CKD(gpu_attention_decode_rows(g, out, q, n_heads * hd, &c, B, n_heads, n_kv, hd, ctx, &kv, s, &e_));
            });
            const double gbs = read_b / (ms * 1e-3) / 1e9;
            printf("%6lld %7lld %7lld %7lld %10.2f %10.2f %10.1f %7.1f%%\n", (long long)B, (long long)depth,
                   (long long)ctx, (long long)layers, ms * 1e3, read_b / 1e6, gbs, 100 * gbs / d2d_gbs);
            fprintf(jf, "%s\n  {\"rows\": %lld, \"depth\": %lld, \"ctx\": %lld, \"us\": %.3f, \"kv_bytes\": %zu, "
                        "\"gbs\": %.1f, \"of_d2d\": %.4f}",
                    first ? "" : ",", (long long)B, (long long)depth, (long long)ctx, ms * 1e3, read_b, gbs,
                    gbs / d2d_gbs);
            first = 0;
            CK(cudaFree(c.k));
            CK(cudaFree(c.v));
            CK(cudaFree(c.ks));
            CK(cudaFree(c.vs));
            CK(cudaFree(q));
            CK(cudaFree(out));
            CK(cudaFree(pos));
            CK(cudaFree(slot));
            CK(cudaFree(fresh));
        }
    fprintf(jf, "\n]}\n");
    if (fclose(jf) != 0) {
        fprintf(stderr, "attn_bench: cannot write %s\n", argv[1]);
        return 1;
    }
    gpu_close(g);
    return 0;
}
