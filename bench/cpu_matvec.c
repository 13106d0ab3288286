// bench/cpu_matvec.c: the CPU share's matvec against the host's memory bandwidth, measured in the same run.
//   ceiling   every thread of the pool reading a buffer far larger than the caches with 32-byte loads (GB/s; the
//             reader is bench/host_read.c, which bench/ceilings.cu runs too), at the start and again before each
//             matrix's runs, whose fractions are of that figure (a shared host's bandwidth moves within a run)
//   matvec    cpu_matvec (the CPU share's kernel) over matrices of the Llama-3-8B shapes in f16, q8 and q4,
//             rotating over copies totalling more than the buffer so every call reads DRAM; GB/s of weights read
//             and the fraction of the ceiling; then cpu_matvec_multi (the share of a pass of T rows) for each T
//             asked: GB/s of weights and GFLOP/s (2 T flops a weight), the work turning from memory to arithmetic
//             on each vector path asked (cpu_set_simd's levels: 2 AVX-512 tiles and, for q8/q4 at T = 1, AVX-512
//             VNNI; 1 AVX2 tiles and integer path; the first one is the product's, the others for comparison)
// Usage: cpu_matvec [out.json] [GB of buffer, default 4] [T,T,...: default 1] [levels: default 2]. Prints a table;
// writes JSON when given a path.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../cpu.h"
#include "../quant.h"
#include "../util.h"
#include "host_read.h"

int main(int argc, char **argv) {
    const char *out = argc > 1 ? argv[1] : NULL;
    double gb = argc > 2 ? atof(argv[2]) : 4.0;
    int64_t Ts[16] = {1}, nT = 1;
    if (argc > 3) {
        nT = 0;
        for (char *p = argv[3], *end; *p && nT < 16; p = *end ? end + 1 : end) {
            Ts[nT] = strtol(p, &end, 10);
            if (end == p || Ts[nT] < 1 || Ts[nT] > 64) dj_die("bad T list '%s' (1..64, comma-separated)", argv[3]);
            nT++;
        }
    }
    int levels[3] = {CPU_SIMD_BEST}, nl = 1;
    if (argc > 4) {
        nl = 0;
        for (char *p = argv[4], *end; *p && nl < 3; p = *end ? end + 1 : end) {
            levels[nl] = (int)strtol(p, &end, 10);
            if (end == p || levels[nl] < 0 || levels[nl] > CPU_SIMD_BEST) dj_die("bad level list '%s' (0..2)", argv[4]);
            nl++;
        }
    }
    size_t bytes = (size_t)(gb * 1e9) / 4096 * 4096;
    uint8_t *buf = aligned_alloc(4096, bytes);
    if (!buf) dj_die("cannot allocate %.1f GB", gb);
    host_touch(buf, bytes);
    int threads = cpu_threads();
    double ceiling = host_read_gbs(buf, bytes, 5);
    printf("host memory: %d threads read %.1f GB/s (best of 5 passes over %.1f GB)\n", threads, ceiling, gb);
    // Llama-3-8B's decode matrices: q|k|v (6144 x 4096), wo (4096 x 4096), gate|up (28672 x 4096), down (4096 x 14336)
    const int64_t shapes[][2] = {{6144, 4096}, {4096, 4096}, {28672, 4096}, {4096, 14336}};
    const uint32_t dts[] = {DJ_F16, DJ_Q8, DJ_Q4};
    float *x = malloc(64 * 14336 * 4), *y = malloc(64 * 28672 * 4), *row = malloc(14336 * 4);
    for (int i = 0; i < 64 * 14336; i++) x[i] = (float)((i * 37) % 101) / 101.0f - 0.5f;
    FILE *js = out ? fopen(out, "w") : NULL;
    if (js) fprintf(js, "{\"threads\": %d, \"host_read_gb_s\": %.3f, \"matvec\": [", threads, ceiling);
    printf("%-6s %14s %4s %5s %10s %12s %10s %10s %9s\n", "dtype", "shape", "T", "simd", "GB/s", "of ceiling", "GFLOP/s",
           "us/call", "ceiling");
    int first = 1;
    for (size_t d = 0; d < sizeof dts / sizeof *dts; d++)
        for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
            int64_t n_out = shapes[s][0], n_in = shapes[s][1];
            size_t mb = (size_t)dj_matrix_bytes(dts[d], (uint64_t)n_out, (uint64_t)n_in);
            size_t copies = bytes / mb;
            if (copies < 2) continue;
            for (int64_t o = 0; o < n_out; o++) {  // one matrix of real values, copied over the buffer
                for (int64_t i = 0; i < n_in; i++) row[i] = (float)(((o * 131 + i * 7) % 97) - 48) / 512.0f;
                uint8_t *dst = buf + (size_t)o * dj_row_bytes(dts[d], (uint64_t)n_in);
                if (dts[d] == DJ_F16)
                    for (int64_t i = 0; i < n_in; i++) ((uint16_t *)dst)[i] = dj_f32_to_f16(row[i]);
                else if (quant_row(dts[d], row, n_in, dst, NULL, NULL))
                    dj_die("quantization failed");
            }
            for (size_t c = 1; c < copies; c++) memcpy(buf + c * mb, buf, mb);
            // the read ceiling again, beside this matrix's runs: a shared host's bandwidth moves within a run (on
            // the H100 machine's host the f16 matvec read up to 41% more than the start's figure)
            double here = host_read_gbs(buf, bytes, 2);
            for (int64_t k = 0; k < nT; k++)
                for (int l = 0; l < nl; l++) {
                    int64_t T = Ts[k];
                    int level = cpu_set_simd(levels[l]);  // what runs: the lower of the level and the CPU's
                    double best = 0;
                    for (int r = 0; r < 3; r++) {
                        double t0 = dj_now();
                        for (size_t c = 0; c < copies; c++) cpu_matvec_multi(y, x, buf + c * mb, dts[d], T, n_in, n_out);
                        double t = (dj_now() - t0) / (double)copies;
                        if (best == 0 || t < best) best = t;
                    }
                    double gbs = (double)mb / best / 1e9, gfl = 2.0 * (double)T * (double)(n_in * n_out) / best / 1e9;
                    printf("%-6s %6lldx%-7lld %4lld %5d %10.1f %11.0f%% %10.1f %10.1f %9.1f\n", dj_dtype_name(dts[d]),
                           (long long)n_out, (long long)n_in, (long long)T, level, gbs, 100 * gbs / here, gfl,
                           best * 1e6, here);
                    if (js)
                        fprintf(js,
                                "%s\n  {\"dtype\": \"%s\", \"n_out\": %lld, \"n_in\": %lld, \"T\": %lld, \"simd\": %d, "
                                "\"gb_s\": %.3f, \"of_ceiling\": %.4f, \"gflop_s\": %.2f, \"host_read_gb_s\": %.3f}",
                                first ? "" : ",", dj_dtype_name(dts[d]), (long long)n_out, (long long)n_in, (long long)T,
                                level, gbs, gbs / here, gfl, here);
                    first = 0;
                }
            cpu_set_simd(CPU_SIMD_BEST);
        }
    if (js) {
        fprintf(js, "\n]}\n");
        if (fclose(js)) dj_die("cannot write %s", out);
    }
    cpu_pool_stop();
    free(buf), free(x), free(y), free(row);
    return 0;
}
