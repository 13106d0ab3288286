// share_chan.c: the CPU share's job channel: the pinned buffers x goes to the host in and the CPU's rows come back
// in, the words through which the GPU says x has landed and the workers say their rows are done, and the one job
// queued (its workers' state, cpu_job, owned here). The host joins a job before the next takes the channel, and
// before any wait of its own on the compute stream (share_flush).
#include <stdatomic.h>

#include "cpu.h"
#include "gpu_impl.h"

// The widest input and output of the split matmuls.
static void share_widths(const dj_gpu_state *s, int64_t *in, int64_t *out) {
    const dj_config *c = &s->m->info.config;
    int64_t dim = c->dim, q = (int64_t)c->n_heads * c->head_dim, kv = (int64_t)c->n_kv_heads * c->head_dim,
            hid = c->hidden_dim, vocab = c->vocab_size;
    *in = hid > dim ? hid : dim, *out = 3 * hid + dim;  // a chain's h, gate|up and down rows (share_ffn)
    if (q > *in) *in = q;
    if (q + 2 * kv > *out) *out = q + 2 * kv;
    if (vocab > *out) *out = vocab;
}

uint64_t share_device_bytes(const dj_gpu_state *s) {
    int64_t in, out, rows = s->max_batch < SH_ROWS ? s->max_batch : SH_ROWS;
    share_widths(s, &in, &out);
    return s->opts.cpu_share != 0 ? (uint64_t)(rows * out) * 4 : 0;
}

// gpu_set_hold's: the job queued computed before cuBLAS or the scratch may block the host on the device.
static int share_hold(void *ctx, dj_err *e) { return share_flush((dj_gpu_state *)ctx, e); }

int share_init(dj_gpu_state *s, dj_err *e) {
    gpu_share *sh = &s->sh;
    share_chan *ch = &sh->chan;
    int64_t in, out;
    share_widths(s, &in, &out);
    sh->max_rows = s->max_batch < SH_ROWS ? s->max_batch : SH_ROWS;
    size_t rows = (size_t)sh->max_rows;
    if (gpu_host_alloc((void **)&ch->h_in, rows * (size_t)in * 4, "the CPU share's input", e) ||
        gpu_host_alloc((void **)&ch->h_out, rows * (size_t)out * 4, "the CPU share's output", e) ||
        gpu_host_device_ptr((void **)&ch->d_out, ch->h_out, e) ||
        gpu_malloc((void **)&sh->d_gpu_part, share_device_bytes(s), "the CPU share's GPU rows", e) ||
        gpu_host_alloc((void **)&ch->h_words, SW_WORDS * sizeof *ch->h_words, "the CPU share's job words", e) ||
        gpu_host_device_ptr((void **)&ch->d_words, (void *)ch->h_words, e) ||
        gpu_host_device_ptr((void **)&ch->d_in, ch->h_in, e) ||
        gpu_malloc((void **)&ch->d_count, sizeof *ch->d_count, "the CPU share's block count", e) ||
        gpu_memset(ch->d_count, 0, sizeof *ch->d_count, s->compute, e))
        return -1;
    if (!(ch->work = cpu_job_new())) return dj_fail(e, "out of memory");
    for (int k = 0; k < SW_WORDS; k++) atomic_store(&ch->h_words[k], 0);
    ch->jobs = 0;
    gpu_set_hold(s->g, share_hold, s);
    return 0;
}

void share_free(dj_gpu_state *s) {
    share_chan *ch = &s->sh.chan;
    gpu_host_free(ch->h_in), gpu_host_free(ch->h_out), gpu_host_free((void *)ch->h_words);
    gpu_free(s->sh.d_gpu_part), gpu_free(ch->d_count);
    cpu_job_free(ch->work);
}

int share_send_x(dj_gpu_state *s, const float *x, int64_t T, int64_t n_in, int mat, uint32_t seq, dj_err *e) {
    gpu_share *sh = &s->sh;
    share_chan *ch = &sh->chan;
    if (T > sh->max_rows) return dj_fail(e, "internal error: a CPU share over %lld rows", (long long)T);
    return share_flush(s, e) || trace_split(s->tr, mat, 0, e) ||
                   gpu_to_host(ch->d_in, x, T * n_in, ch->d_count, &ch->d_words[SW_X_LANDED], ch->jobs = seq,
                               s->compute, e)
               ? -1
               : 0;
}

int share_flush_if_loading(dj_gpu_state *s, dj_err *e) {
    return !gpu_kernels_loaded(s->g) && share_flush(s, e) ? -1 : 0;
}

int share_flush(dj_gpu_state *s, dj_err *e) {
    gpu_share *sh = &s->sh;
    share_chan *ch = &sh->chan;
    if (!ch->job.on) return 0;
    ch->job.on = 0;
    double t[3];
    if (cpu_matvec_finish(ch->work, t)) return dj_fail(e, "gpu: out of memory for the CPU share's rows");
    double t0 = ch->job.posted < t[0] ? ch->job.posted : t[0];
    sh->pass_wait_s += t[0] - t0, sh->pass_cpu_s += t[2] - t[0];
    sh->pass_cpu_bytes += ch->job.bytes[0] + ch->job.bytes[1];
    return trace_split_times(s->tr, ch->job.mark[0], t0, t[0], t[1], ch->job.bytes[0], e) ||
                   trace_split_times(s->tr, ch->job.mark[1], t[1], t[1], t[2], ch->job.bytes[1], e)
               ? -1
               : 0;
}

void share_release(dj_gpu_state *s) {
    share_chan *ch = &s->sh.chan;
    if (!ch->job.on) return;
    ch->job.on = 0;
    atomic_store_explicit(&ch->h_words[SW_X_LANDED], ch->jobs, memory_order_release);
    double t[3];
    (void)cpu_matvec_finish(ch->work, t);  // its rows are garbage anyway
}
