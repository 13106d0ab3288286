// bench/peer_ceilings.cu: the ceilings of several GPUs of one host (issue 48), against which the engine on several
// GPUs is reported.
//   Per link: pinned H2D in 64 MiB chunks into each GPU alone, then into every GPU at once (each from its own pinned
//   buffer, one stream a GPU), GB/s each and together.
//   Host memory: read by every CPU of the affinity mask alone, and while every link copies at once (the combined
//   ceiling of a streamed step with a CPU share on N GPUs: the links' rate plus the reads' beside them).
//   Peer: cudaMemcpyPeerAsync of 256 MiB from each GPU to each other (GB/s), and the all-reduce's own step as the
//   engine runs it (tp_link.c): GPU a's gpu_sum_parts over its partial and GPU b's, read by peer access, for one
//   decode row (4096 floats) and for 64 rows, each launch timed on a's stream (us). Then the all-reduce itself as the
//   engine runs it on GPUs 0 and 1 (gpu_tp_exchange: each pushes its partial and flags into the other's memory,
//   waits for the other's, sums), 200 back to back captured in a graph on each GPU, both launched at once: us an
//   all-reduce, one row and 64 rows.
// Usage: peer_ceilings [out.json] (PC_EXCHANGE_ONLY=1: the all-reduce's line alone). GPU machine with two or more
// GPUs (one: the per-link rows only, said on stderr).
#include <cuda_runtime.h>

#include <chrono>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <vector>

#include "bench_gpu.h"
#include "host_read.h"
extern "C" {
#include "../pool.h"
}

#define PC_MAX 8
#define PC_CHUNK ((size_t)64 << 20)
#define PC_CHUNKS 16

static double now_s() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

typedef struct {
    void *dev, *host;  // PC_CHUNKS chunks each
    cudaStream_t s;
} pc_link;

// Every link in `use` copying `rounds` x PC_CHUNKS chunks at once; GB/s of each link into rate[] (its bytes over the
// wall time from the first issue to its own end). The host reads in between when `reads` (its passes and seconds
// into *passes, *read_s while any link still copies).
static void links_at_once(pc_link *l, const int *use, int n, int rounds, double *rate, int reads, const uint8_t *buf,
                          size_t bytes, int *passes, double *read_s) {
    std::vector<cudaEvent_t> end(n);
    for (int k = 0; k < n; k++) {
        CK(cudaSetDevice(use[k]));
        CK(cudaEventCreate(&end[k]));
    }
    const double t0 = now_s();
    for (int r = 0; r < rounds; r++)
        for (int i = 0; i < PC_CHUNKS; i++)
            for (int k = 0; k < n; k++) {
                CK(cudaSetDevice(use[k]));
                CK(cudaMemcpyAsync((char *)l[use[k]].dev + i * PC_CHUNK, (char *)l[use[k]].host + i * PC_CHUNK,
                                   PC_CHUNK, cudaMemcpyHostToDevice, l[use[k]].s));
            }
    for (int k = 0; k < n; k++) {
        CK(cudaSetDevice(use[k]));
        CK(cudaEventRecord(end[k], l[use[k]].s));
    }
    std::vector<double> done(n, 0);
    int left = n;
    if (passes) *passes = 0, *read_s = 0;
    while (left) {
        if (reads) {
            const double t = host_read_pass(buf, bytes);
            int still = 0;
            for (int k = 0; k < n; k++) still |= cudaEventQuery(end[k]) == cudaErrorNotReady;
            if (still) (*passes)++, *read_s += t;
        }
        for (int k = 0; k < n; k++)
            if (!done[k] && cudaEventQuery(end[k]) == cudaSuccess) done[k] = now_s(), left--;
    }
    (void)cudaGetLastError();  // the queries' cudaErrorNotReady
    for (int k = 0; k < n; k++) {
        rate[k] = (double)rounds * PC_CHUNKS * PC_CHUNK / (done[k] - t0) / 1e9;
        CK(cudaEventDestroy(end[k]));
    }
}

// The all-reduce on GPUs 0 and 1 as tp_link.c runs it (peer access enabled both ways), us each, for one row of 4096
// floats, for 64 and for 16 (us[0..2]): PC_XCHG exchanges captured in a graph on each GPU, both graphs launched,
// timed on GPU 0; the flagged words' inboxes alternate by parity as tp_link.c's do.
#define PC_XCHG 200
static void exchange_us(pc_link *l, double *us) {
    const int64_t max_len = 64 * 4096;
    const size_t words = GPU_TP_XCHG_BLOCKS * sizeof(unsigned long long);
    float *mine[2], *inbox[2], *y[2];
    unsigned long long *ll[2][2];  // the flagged words' inboxes, by parity as tp_link.c alternates them
    unsigned long long *count[2], *flag[2];
    int *words_h, *abort_d[2], *err_d[2];
    CK(cudaHostAlloc(&words_h, 3 * sizeof(int), cudaHostAllocPortable | cudaHostAllocMapped));
    memset(words_h, 0, 3 * sizeof(int));
    for (int d = 0; d < 2; d++) {
        CK(cudaSetDevice(d));
        CK(cudaMalloc(&mine[d], max_len * 4));
        CK(cudaMalloc(&inbox[d], max_len * 4));
        for (int p = 0; p < 2; p++) {
            CK(cudaMalloc(&ll[d][p], max_len * 8));
            CK(cudaMemset(ll[d][p], 0, max_len * 8));
        }
        CK(cudaMalloc(&y[d], max_len * 4));
        CK(cudaMalloc(&count[d], words));
        CK(cudaMalloc(&flag[d], 2 * words));
        CK(cudaMemset(mine[d], 0, max_len * 4));
        CK(cudaMemset(count[d], 0, words));
        CK(cudaMemset(flag[d], 0, 2 * words));
        CK(cudaHostGetDevicePointer((void **)&abort_d[d], words_h, 0));
        err_d[d] = abort_d[d] + 1 + d;
        CK(cudaDeviceSynchronize());
    }
    int khz[2];
    for (int d = 0; d < 2; d++) CK(cudaDeviceGetAttribute(&khz[d], cudaDevAttrClockRate, d));
    const int64_t rows[3] = {1, 64, 16};
    for (int k = 0; k < 3; k++) {
        const int64_t len = rows[k] * 4096;
        cudaGraphExec_t g[2];
        for (int d = 0; d < 2; d++) {
            const int o = 1 - d;
            gpu_tp_xchg x;
            memset(&x, 0, sizeof x);
            x.out[o] = inbox[o], x.flag_out[o] = flag[o] + d * GPU_TP_XCHG_BLOCKS;
            x.in[o] = inbox[d], x.flag_in[o] = flag[d] + o * GPU_TP_XCHG_BLOCKS;
            CK(cudaSetDevice(d));
            cudaGraph_t gr;
            CK(cudaStreamBeginCapture(l[d].s, cudaStreamCaptureModeThreadLocal));
            for (int i = 0; i < PC_XCHG; i++) {
                x.ll_out[o] = ll[o][i & 1], x.ll_in[o] = ll[d][i & 1];
                CKD(gpu_tp_exchange(y[d], mine[d], len, &x, 2, d, count[d], abort_d[d], err_d[d], khz[d], l[d].s, &e_));
            }
            CK(cudaStreamEndCapture(l[d].s, &gr));
            CK(cudaGraphInstantiate(&g[d], gr, 0));
            CK(cudaGraphDestroy(gr));
        }
        double best = 1e30;
        for (int rep = 0; rep < 6; rep++) {  // the first warms
            cudaEvent_t t0, t1;
            CK(cudaSetDevice(0));
            CK(cudaEventCreate(&t0));
            CK(cudaEventCreate(&t1));
            CK(cudaEventRecord(t0, l[0].s));
            CK(cudaGraphLaunch(g[0], l[0].s));
            CK(cudaEventRecord(t1, l[0].s));
            CK(cudaSetDevice(1));
            CK(cudaGraphLaunch(g[1], l[1].s));
            CK(cudaStreamSynchronize(l[1].s));
            CK(cudaSetDevice(0));
            CK(cudaEventSynchronize(t1));
            float ms = 0;
            CK(cudaEventElapsedTime(&ms, t0, t1));
            if (rep && ms < best) best = ms;
            CK(cudaEventDestroy(t0));
            CK(cudaEventDestroy(t1));
        }
        if (words_h[1] || words_h[2]) {
            fprintf(stderr, "peer_ceilings: an exchange gave up\n");
            exit(1);
        }
        us[k] = 1e3 * best / PC_XCHG;
        for (int d = 0; d < 2; d++) CK(cudaGraphExecDestroy(g[d]));
    }
    printf("the all-reduce on GPUs 0 and 1 (gpu_tp_exchange, in graphs): one row %.2f us, 64 rows %.2f us, 16 rows "
           "%.2f us (flagged words to %lld floats)\n", us[0], us[1], us[2], (long long)gpu_tp_exchange_ll_max());
    for (int d = 0; d < 2; d++) {
        CK(cudaSetDevice(d));
        CK(cudaFree(mine[d]));
        CK(cudaFree(inbox[d]));
        for (int p = 0; p < 2; p++) CK(cudaFree(ll[d][p]));
        CK(cudaFree(y[d]));
        CK(cudaFree(count[d]));
        CK(cudaFree(flag[d]));
    }
    CK(cudaFreeHost(words_h));
}

int main(int argc, char **argv) {
    int n = gpu_count();
    if (n == 0) {
        fprintf(stderr, "peer_ceilings: no GPU found\n");
        return 1;
    }
    if (n > PC_MAX) n = PC_MAX;
    if (n == 1) fprintf(stderr, "peer_ceilings: one GPU: the per-link rows only\n");
    pc_link l[PC_MAX];
    for (int d = 0; d < n; d++) {
        CK(cudaSetDevice(d));
        CK(cudaStreamCreateWithFlags(&l[d].s, cudaStreamNonBlocking));
        if (getenv("PC_EXCHANGE_ONLY")) continue;
        CK(cudaMalloc(&l[d].dev, PC_CHUNK * PC_CHUNKS));
        CK(cudaHostAlloc(&l[d].host, PC_CHUNK * PC_CHUNKS, cudaHostAllocPortable));
        memset(l[d].host, 1 + d, PC_CHUNK * PC_CHUNKS);
    }
    if (getenv("PC_EXCHANGE_ONLY")) {  // the all-reduce alone (peer access both ways between GPUs 0 and 1)
        double us[3];
        for (int d = 0; d < 2 && n >= 2; d++) {
            CK(cudaSetDevice(d));
            CK(cudaDeviceEnablePeerAccess(1 - d, 0));
        }
        if (n >= 2) exchange_us(l, us);
        return n >= 2 ? 0 : 1;
    }
    int all[PC_MAX];
    for (int d = 0; d < n; d++) all[d] = d;
    // ---- each link alone, then all at once
    double alone[PC_MAX], together[PC_MAX], beside[PC_MAX];
    for (int d = 0; d < n; d++) {
        links_at_once(l, &all[d], 1, 1, &alone[d], 0, NULL, 0, NULL, NULL);  // warm
        links_at_once(l, &all[d], 1, 4, &alone[d], 0, NULL, 0, NULL, NULL);
    }
    links_at_once(l, all, n, 4, together, 0, NULL, 0, NULL, NULL);
    // ---- host reads alone and beside every link's copies
    const size_t bytes = (size_t)4 << 30;
    uint8_t *buf = (uint8_t *)aligned_alloc(64, bytes);
    if (!buf) {
        fprintf(stderr, "peer_ceilings: no 4 GiB for the host reads\n");
        return 1;
    }
    host_touch(buf, bytes);
    const double read_alone = host_read_gbs(buf, bytes, 5);
    int passes = 0;
    double read_s = 0;
    links_at_once(l, all, n, 40, beside, 1, buf, bytes, &passes, &read_s);
    const double read_beside = passes ? (double)passes * (double)bytes / read_s / 1e9 : 0;
    double sum_alone = 0, sum_together = 0, sum_beside = 0;
    for (int d = 0; d < n; d++) sum_alone += alone[d], sum_together += together[d], sum_beside += beside[d];
    printf("%d GPUs of one host\n", n);
    for (int d = 0; d < n; d++) {
        cudaDeviceProp p;
        CK(cudaGetDeviceProperties(&p, d));
        printf("GPU %d: %s; pinned H2D alone %.2f GB/s, with every link copying %.2f, beside the host's reads %.2f\n",
               d, p.name, alone[d], together[d], beside[d]);
    }
    printf("links together: %.2f GB/s (%.2fx one link alone on average)\n", sum_together, sum_together / (sum_alone / n));
    printf("host memory read, %d threads: alone %.2f GB/s, beside every link's copies %.2f (%d passes; links %.2f "
           "GB/s together meanwhile): combined %.2f GB/s\n", cpu_threads(), read_alone, read_beside, passes,
           sum_beside, read_beside + sum_beside);
    // ---- peer copies and the all-reduce's sum
    double peer_gbs[PC_MAX][PC_MAX] = {}, sum_us[PC_MAX][PC_MAX][2] = {};
    for (int a = 0; a < n; a++)
        for (int b = 0; b < n; b++) {
            if (a == b) continue;
            int can = 0;
            CK(cudaDeviceCanAccessPeer(&can, a, b));
            if (!can) {
                printf("GPU %d -> %d: no peer access\n", a, b);
                continue;
            }
            CK(cudaSetDevice(a));
            cudaError_t pe = cudaDeviceEnablePeerAccess(b, 0);
            if (pe == cudaErrorPeerAccessAlreadyEnabled) (void)cudaGetLastError();
            else CK(pe);
            const size_t pb = (size_t)256 << 20;
            peer_gbs[a][b] = (double)pb / (time_ms(l[a].s, 1, 5, [&](int) {
                                 CK(cudaMemcpyPeerAsync(l[a].dev, a, l[b].dev, b, pb, l[a].s));
                             }) * 1e-3) / 1e9;
            const int64_t rows[2] = {1, 64};
            for (int k = 0; k < 2; k++) {
                const int64_t len = rows[k] * 4096;
                const float *parts[2] = {(const float *)l[a].dev + len, (const float *)l[b].dev};
                sum_us[a][b][k] = 1e3 * time_ms(l[a].s, 200, 5, [&](int) {
                                      CKD(gpu_sum_parts((float *)l[a].dev, parts, 2, len, l[a].s, &e_));
                                  });
            }
            printf("GPU %d <- %d: peer copy %.2f GB/s; the all-reduce's sum over both partials (peer reads): one row "
                   "%.2f us, 64 rows %.2f us\n", a, b, peer_gbs[a][b], sum_us[a][b][0], sum_us[a][b][1]);
        }
    double xchg_us[3] = {0, 0, 0};
    if (n >= 2 && peer_gbs[0][1] > 0 && peer_gbs[1][0] > 0) exchange_us(l, xchg_us);
    FILE *f = argc > 1 ? fopen(argv[1], "w") : NULL;
    if (argc > 1 && !f) {
        perror(argv[1]);
        return 1;
    }
    if (f) {
        int bad = fprintf(f, "{\"gpus\": %d, \"h2d_alone_gbs\": [", n) < 0;
        for (int d = 0; d < n; d++) bad |= fprintf(f, "%s%.3f", d ? ", " : "", alone[d]) < 0;
        bad |= fprintf(f, "], \"h2d_together_gbs\": [") < 0;
        for (int d = 0; d < n; d++) bad |= fprintf(f, "%s%.3f", d ? ", " : "", together[d]) < 0;
        bad |= fprintf(f, "], \"host_read_alone_gbs\": %.3f, \"host_read_beside_links_gbs\": %.3f, "
                          "\"links_beside_reads_gbs\": %.3f, \"peer\": [", read_alone, read_beside, sum_beside) < 0;
        int first = 1;
        for (int a = 0; a < n; a++)
            for (int b = 0; b < n; b++)
                if (peer_gbs[a][b] > 0) {
                    bad |= fprintf(f, "%s{\"to\": %d, \"from\": %d, \"copy_gbs\": %.3f, \"sum_1row_us\": %.3f, "
                                      "\"sum_64rows_us\": %.3f}", first ? "" : ", ", a, b, peer_gbs[a][b],
                                   sum_us[a][b][0], sum_us[a][b][1]) < 0;
                    first = 0;
                }
        bad |= fprintf(f, "], \"exchange_1row_us\": %.3f, \"exchange_64rows_us\": %.3f, \"exchange_16rows_us\": "
                          "%.3f}\n", xchg_us[0], xchg_us[1], xchg_us[2]) < 0;
        if (bad || fclose(f)) {
            perror(argv[1]);
            return 1;
        }
    }
    free(buf);
    cpu_pool_stop();
    return 0;
}
