// djinn.c: the command line: options, loading, then either generation (the prompt's prefill, the decode loop
// streaming text to stdout, the statistics, the --logits dump) or --check against a reference file.
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "check.h"
#include "cpu.h"
#include "engine.h"
#include "kernels.h"
#include "loader.h"
#include "sampler.h"
#include "tokenizer.h"
#include "util.h"

// Exit codes: 1 runtime error (missing model, bad prompt...), 2 usage error, 3 --check above tolerance,
// 130 interrupted (Ctrl-C) after printing what was generated and the statistics so far.
enum { EXIT_ERR = 1, EXIT_USAGE = 2, EXIT_CHECK = 3, EXIT_INTERRUPTED = 130 };
#define DEFAULT_CTX 4096  // a KV cache for Llama 3.1's 131072 positions would not fit most GPUs

// Ctrl-C during generation stops after the current token, during loading or prefill as that phase ends (a phase
// itself runs to its end); a second one kills at once.
static volatile sig_atomic_t interrupted;
static void on_sigint(int sig) {
    interrupted = 1;
    signal(sig, SIG_DFL);
}

// Tests deliver Ctrl-C at an exact point through DJINN_TEST_SIGINT_AT (a real SIGINT, through the handler):
// "load" or "prefill" as that phase starts, as if it came while the phase ran, or N before new token N+1.
static const char *test_sigint_at(void) { return getenv("DJINN_TEST_SIGINT_AT"); }
static void test_sigint_before(const char *phase) {
    const char *at = test_sigint_at();
    if (at && !strcmp(at, phase)) raise(SIGINT);
}

// Between phases: says so and returns 1 when Ctrl-C came during the one that just ended.
static int interrupted_during(const char *phase) {
    if (interrupted) fprintf(stderr, "djinn: interrupted during %s\n", phase);
    return interrupted;
}

// ---- options
typedef struct {
    const char *model_path;
    const char *prompt;
    int64_t n_new;       // new tokens
    double temp;         // 0: greedy
    double top_p;
    uint64_t seed;
    int seed_given;
    int64_t ctx;         // 0: the model's max_seq_len, at most DEFAULT_CTX
    double ring_gb;      // GPU memory for weights, GB; 0: automatic
    int force_cpu;
    int stream_all;      // ablation: nothing resident
    int sync_copy;       // ablation: no copy/compute overlap
    int no_graph;        // all-resident decode launch by launch
    int fma_attn;        // prefill attention on the fp32 FMA kernel, not the tensor cores
    double cpu_share;    // dj_gpu_opts.cpu_share: < 0 automatic (the default), 0 off
    int cpu_share_given;
    int no_pin;          // pageable host memory for the weights
    const char *stats_path;
    const char *logits_path;
    const char *check_path;
    double tol;          // <0: per-dtype default
    int tokenize;
} dj_opts;

static void usage(FILE *f) {
    fprintf(f,
            "usage: djinn MODEL [-p PROMPT] [options]\n"
            "  MODEL            a model.bin written by ./convert/convert\n"
            "  -p PROMPT        prompt text (default: empty, i.e. BOS only)\n"
            "  -n N             new tokens to generate (default 256; 0: prefill only)\n"
            "  -t TEMP          temperature (default 1.0; 0: greedy)\n"
            "  --top-p P        nucleus sampling mass in [0, 1] (default 0.9; 0: greedy)\n"
            "  -s SEED          RNG seed (default: from the clock); same seed, same text\n"
            "  -c CTX           context size in tokens: the KV cache length (default: the model's\n"
            "                   max_position_embeddings, capped at %d; an explicit -c may go up to\n"
            "                   max_position_embeddings)\n"
            "  --ring-gb G      GPU memory for weights, in GB (1e9 bytes): layers that fit stay resident, the rest\n"
            "                   stream over PCIe every token (default: free GPU memory minus the KV cache,\n"
            "                   activations and a margin; the plan is printed on stderr)\n"
            "  --stream-all     ablation: keep no layer resident, stream every layer every token\n"
            "  --sync-copy      ablation: copy a layer, wait, compute it (no overlap)\n"
            "  --no-graph       ablation: run the all-resident decode step kernel by kernel, not as a CUDA graph\n"
            "  --fma-attn       comparison: prefill attention on the fp32 FMA kernel instead of the tensor cores\n"
            "                   (bf16x3, f32-class accuracy; used for head_dim a multiple of 16 up to 256)\n"
            "  --cpu-share F    while layers stream, the CPU computes fraction F (0 to 0.95) of every streamed\n"
            "                   matrix's rows from host memory in each decode step, so those bytes never cross\n"
            "                   PCIe; 'auto' (the default) balances the CPU's measured rate against the link's,\n"
            "                   0 turns it off (then streamed logits are bitwise those of the all-resident path)\n"
            "  --no-pin         keep the weights in pageable memory (where page-locking is limited; copies\n"
            "                   then run at ~7 GB/s instead of ~50 and do not overlap compute)\n"
            "  --cpu            run on the CPU even when a GPU is present\n"
            "  --stats-json F   write the run's statistics (load, prefill, decode, streaming) to F as JSON\n"
            "  --logits FILE    write float32 logits (vocab values per row), one row per processed position:\n"
            "                   every prompt position (BOS included), then every generated token's position\n"
            "  --check REF      teacher-force REF's token ids (from tools/reference.py) and compare logits;\n"
            "                   exits 3 when the worst position's relative L2 error is above the tolerance\n"
            "  --tol X          --check tolerance on relative L2 error (default: 1e-4 on the CPU; on the GPU\n"
            "                   1e-4 for f32 weights, 5e-3 for f16, 1e-2 for bf16)\n"
            "  --tokenize       print the prompt's token ids and exit\n"
            "  --help           this text\n"
            "stdout carries only the text (prompt + generation); statistics go to stderr.\n",
            DEFAULT_CTX);
}

static int usage_error(const char *fmt, const char *arg) {
    fputs("djinn: ", stderr);
    fprintf(stderr, fmt, arg);
    fputc('\n', stderr);
    usage(stderr);
    return EXIT_USAGE;
}

// Strict number parsing: the whole string must be a number.
static int parse_i64(const char *s, int64_t *out) {
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || *end) return -1;
    *out = v;
    return 0;
}
static int parse_f64(const char *s, double *out) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !isfinite(v)) return -1;
    *out = v;
    return 0;
}

// Returns 0 when parsed, else the exit code (EXIT_USAGE, or -1 for --help).
static int parse_args(int argc, char **argv, dj_opts *o) {
    *o = (dj_opts){.prompt = "", .n_new = 256, .temp = 1.0, .top_p = 0.9, .tol = -1, .cpu_share = -1};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) return -1;
        if (!strcmp(a, "--cpu")) { o->force_cpu = 1; continue; }
        if (!strcmp(a, "--tokenize")) { o->tokenize = 1; continue; }
        if (!strcmp(a, "--stream-all")) { o->stream_all = 1; continue; }
        if (!strcmp(a, "--sync-copy")) { o->sync_copy = 1; continue; }
        if (!strcmp(a, "--no-graph")) { o->no_graph = 1; continue; }
        if (!strcmp(a, "--fma-attn")) { o->fma_attn = 1; continue; }
        if (!strcmp(a, "--no-pin")) { o->no_pin = 1; continue; }
        if (a[0] != '-' || a[1] == 0) {
            if (o->model_path) return usage_error("unexpected argument '%s'", a);
            o->model_path = a;
            continue;
        }
        static const char *with_value[] = {"-p", "-n", "-t", "--top-p", "-s", "-c", "--ring-gb", "--logits",
                                           "--check", "--tol", "--stats-json", "--cpu-share"};
        int known = 0;
        for (size_t k = 0; k < sizeof with_value / sizeof *with_value; k++) known |= !strcmp(a, with_value[k]);
        if (!known) return usage_error("unknown option '%s'", a);
        if (i + 1 >= argc) return usage_error("option '%s' needs a value", a);
        const char *v = argv[++i];
        int64_t n;
        double d;
        if (!strcmp(a, "-p")) {
            o->prompt = v;
        } else if (!strcmp(a, "-n")) {
            if (parse_i64(v, &n) || n < 0) return usage_error("-n needs a count >= 0, not '%s'", v);
            o->n_new = n;
        } else if (!strcmp(a, "-t")) {
            if (parse_f64(v, &d) || d < 0) return usage_error("-t needs a temperature >= 0, not '%s'", v);
            o->temp = d;
        } else if (!strcmp(a, "--top-p")) {
            if (parse_f64(v, &d) || d < 0 || d > 1) return usage_error("--top-p needs a value in [0, 1], not '%s'", v);
            o->top_p = d;
        } else if (!strcmp(a, "-s")) {
            if (parse_i64(v, &n) || n < 0) return usage_error("-s needs a non-negative integer seed, not '%s'", v);
            o->seed = (uint64_t)n;
            o->seed_given = 1;
        } else if (!strcmp(a, "-c")) {
            if (parse_i64(v, &n) || n <= 0) return usage_error("-c needs a positive context size, not '%s'", v);
            o->ctx = n;
        } else if (!strcmp(a, "--ring-gb")) {
            if (parse_f64(v, &d) || d <= 0) return usage_error("--ring-gb needs a positive number of GB, not '%s'", v);
            o->ring_gb = d;
        } else if (!strcmp(a, "--cpu-share")) {
            if (!strcmp(v, "auto")) d = -1;
            else if (parse_f64(v, &d) || d < 0 || d > 0.95)
                return usage_error("--cpu-share needs 'auto' or a fraction from 0 to 0.95, not '%s'", v);
            o->cpu_share = d;
            o->cpu_share_given = 1;
        } else if (!strcmp(a, "--logits")) {
            o->logits_path = v;
        } else if (!strcmp(a, "--stats-json")) {
            o->stats_path = v;
        } else if (!strcmp(a, "--check")) {
            o->check_path = v;
        } else if (!strcmp(a, "--tol")) {
            if (parse_f64(v, &d) || d < 0) return usage_error("--tol needs a non-negative number, not '%s'", v);
            o->tol = d;
        }
    }
    if (!o->model_path) return usage_error("%s", "no MODEL given");
    return 0;
}

// ---- engines
// warm: the length of the first pass to come (the GPU engine warms up on that shape)
static int open_engine(dj_engine *eng, const dj_model *m, const dj_opts *o, int64_t ctx, int64_t warm, dj_err *e) {
    dj_gpu_opts go = {.ring_gb = o->ring_gb, .max_seq = ctx, .stream_all = o->stream_all,
                      .sync_copy = o->sync_copy, .no_graph = o->no_graph, .fma_attn = o->fma_attn,
                      .warm_rows = warm, .cpu_share = o->cpu_share};
    return engine_open(eng, m, &go, e);
}

// ---- output helpers
static void emit(const char *text, size_t len) {
    if (len) {
        fwrite(text, 1, len, stdout);
        fflush(stdout);
    }
}

static int write_rows(FILE *f, const float *rows, int64_t n_rows, int64_t vocab, const char *path, dj_err *e) {
    if (!f) return 0;
    if (fwrite(rows, sizeof(float), (size_t)(n_rows * vocab), f) != (size_t)(n_rows * vocab))
        return dj_fail(e, "cannot write logits to %s: %s", path, strerror(errno));
    return 0;
}

// ---- --check: teacher-force the reference's ids, compare every position's logits
static int run_check(const dj_model *m, const dj_opts *o, dj_err *e) {
    const dj_config *c = &m->info.config;
    dj_ref r;
    if (ref_load(o->check_path, &r, e)) return EXIT_ERR;
    int rc = EXIT_ERR;
    dj_engine eng = {0};
    float *logits = NULL;
    if (r.vocab != c->vocab_size) {
        dj_fail(e, "reference %s has vocab %u but the model has %u: not the same model", o->check_path, r.vocab,
                c->vocab_size);
        goto out;
    }
    if (open_engine(&eng, m, o, r.n_tokens, r.n_tokens, e)) goto out;
    if (interrupted_during("the engine's setup")) {
        rc = EXIT_INTERRUPTED;
        goto out;
    }
    logits = malloc(4ull * r.n_tokens * r.vocab);
    if (!logits) {
        dj_fail(e, "out of memory for %u x %u logits", r.n_tokens, r.vocab);
        goto out;
    }
    double t0 = dj_now();
    if (eng.forward(eng.ctx, r.ids, r.n_tokens, 0, logits, 1, e)) goto out;
    double dt = dj_now() - t0;
    fprintf(stderr, "djinn: check: %u positions (%u prompt) in %.3f s on the %s\n", r.n_tokens, r.n_prompt, dt,
            eng.name);
    double tol = o->tol >= 0 ? o->tol : check_default_tol(eng.is_gpu, c->wtype);
    dj_check ck;
    check_logits(&r, logits, stdout, &ck);
    int pass = ck.worst_rel <= tol;  // false for NaN too
    printf("check %s: worst rel_l2 %.4e %s tolerance %.1e (%s weights, %s engine)\n", pass ? "PASSED" : "FAILED",
           ck.worst_rel, pass ? "<=" : ">", tol, dj_dtype_name(c->wtype), eng.name);
    rc = pass ? 0 : EXIT_CHECK;
out:
    engine_close(&eng);
    free(logits);
    ref_free(&r);
    return rc;
}

// ---- generation
// Statistics of one run, for stderr and --stats-json.
typedef struct {
    double load_s, setup_s, prefill_s, ttft_ms, decode_s;
    int64_t prompt_tokens, decode_tokens;
} dj_run_stats;

// Writes the run's figures as one JSON object (the benchmark reads it).
static int write_stats(const char *path, const dj_model *m, const dj_engine *eng, const dj_opts *o,
                       const dj_run_stats *r, dj_err *e) {
    FILE *f = fopen(path, "w");
    if (!f) return dj_fail(e, "cannot create %s: %s", path, strerror(errno));
    double gb = (double)m->data_size / 1e9, dec_ms = r->decode_tokens > 0 ? r->decode_s * 1e3 / r->decode_tokens : 0;
    fprintf(f, "{\"engine\": \"%s\", \"model_gb\": %.6f, \"wtype\": \"%s\", \"load_s\": %.6f, \"load_gb_s\": %.4f,\n \"setup_s\": %.6f,",
            eng->name, gb, dj_dtype_name(m->info.config.wtype), r->load_s, gb / fmax(r->load_s, 1e-9), r->setup_s);
    fprintf(f, " \"prompt_tokens\": %" PRId64 ", \"prefill_s\": %.6f, \"prefill_tok_s\": %.4f, \"ttft_ms\": %.4f,\n",
            r->prompt_tokens, r->prefill_s, (double)r->prompt_tokens / fmax(r->prefill_s, 1e-9), r->ttft_ms);
    fprintf(f, " \"decode_tokens\": %" PRId64 ", \"decode_ms_per_token\": %.6f, \"decode_tok_s\": %.4f",
            r->decode_tokens, dec_ms, dec_ms > 0 ? 1e3 / dec_ms : 0.0);
    if (eng->is_gpu) {
        dj_gpu_stats g;
        gpu_state_stats(eng->ctx, &g);
        fprintf(f, ",\n \"ring_gb\": %.4f, \"stream_all\": %d, \"sync_copy\": %d, \"resident_units\": %d, "
                   "\"streamed_units\": %d,\n \"streamed_gb_per_token\": %.6f, \"h2d_gb_s\": %.4f, "
                   "\"wait_ms_per_token\": %.6f, \"passes\": %" PRId64 ", \"tc_attn\": %d,\n"
                   " \"cpu_share\": %.4f, \"cpu_gb_per_token\": %.6f, \"cpu_threads\": %d",
                o->ring_gb, o->stream_all, o->sync_copy, g.n_resident, g.n_streamed, (double)g.bytes_per_token / 1e9,
                g.copy_ms > 0 ? (double)g.copied_bytes / 1e6 / g.copy_ms : 0.0,
                g.passes > 0 ? g.wait_ms / (double)g.passes : 0.0, g.passes, g.tc_attn, g.cpu_share,
                (double)g.cpu_bytes_per_token / 1e9, cpu_threads());
    }
    fprintf(f, "}\n");
    if (fclose(f)) return dj_fail(e, "cannot write %s: %s", path, strerror(errno));
    return 0;
}

static int run_generate(const dj_model *m, const dj_tokenizer *tok, const dj_opts *o, double load_s, dj_err *e) {
    dj_run_stats rs = {.load_s = load_s};
    const dj_config *c = &m->info.config;
    int64_t vocab = c->vocab_size;
    int32_t *ids = NULL;
    size_t n_prompt = 0;
    if (tok_encode(tok, o->prompt, strlen(o->prompt), 1, &ids, &n_prompt, e)) return EXIT_ERR;
    if (o->tokenize) {
        for (size_t i = 0; i < n_prompt; i++) printf("%s%d", i ? " " : "", ids[i]);
        printf("\n");
        free(ids);
        return 0;
    }
    int64_t ctx = o->ctx ? o->ctx : c->max_seq_len < DEFAULT_CTX ? (int64_t)c->max_seq_len : DEFAULT_CTX;
    int rc = EXIT_ERR;
    dj_engine eng = {0};
    float *logits = NULL;
    FILE *lf = NULL;
    dj_tok_stream *stream = NULL;
    dj_sampler *smp = NULL;
    if (n_prompt == 0) {
        dj_fail(e, "the prompt is empty and the model has no BOS token: give a prompt with -p");
        goto out;
    }
    if ((int64_t)n_prompt > ctx) {
        dj_fail(e, "the prompt is %zu tokens, longer than the context of %" PRId64 " tokens (-c)", n_prompt, ctx);
        goto out;
    }
    int64_t cap = o->n_new < ctx ? (int64_t)n_prompt + o->n_new : ctx;  // ids: prompt + new tokens, <= ctx
    int32_t *grown = realloc(ids, (size_t)(cap + 1) * sizeof *ids);
    logits = malloc((o->logits_path ? n_prompt : 1) * (size_t)vocab * sizeof(float));  // (rows, vocab)
    if (!grown || !logits) {
        if (grown) ids = grown;
        dj_fail(e, "out of memory");
        goto out;
    }
    ids = grown;
    if (o->logits_path && !(lf = fopen(o->logits_path, "wb"))) {
        dj_fail(e, "cannot create %s: %s", o->logits_path, strerror(errno));
        goto out;
    }
    double t_setup = dj_now();
    if (open_engine(&eng, m, o, ctx, (int64_t)n_prompt, e)) goto out;
    rs.setup_s = dj_now() - t_setup;
    fprintf(stderr, "djinn: %s engine set up in %.3f s%s\n", eng.name, rs.setup_s,
            eng.is_gpu ? " (buffers, a warm-up pass of the prompt's length, the decode graph)" : "");
    if (interrupted_during("the engine's setup")) {
        rc = EXIT_INTERRUPTED;
        goto out;
    }
    uint64_t seed = o->seed_given ? o->seed : (uint64_t)time(NULL);
    if (!(smp = sampler_new(vocab, o->temp, o->top_p, seed, e))) goto out;
    if (!o->seed_given && !sampler_is_greedy(smp)) fprintf(stderr, "djinn: seed %" PRIu64 " (-s to repeat)\n", seed);

    // Prompt text first: stdout is decode(all ids), so the prompt goes through the same stream.
    stream = tok_stream_new(tok);
    if (!stream) {
        dj_fail(e, "out of memory");
        goto out;
    }
    size_t len;
    for (size_t i = 0; i < n_prompt; i++) {
        const char *s = tok_stream_push(stream, ids[i], &len);
        emit(s, len);
    }

    // Prefill: every row when --logits wants them, otherwise only the last position's.
    double t_start = dj_now();
    const float *last;
    test_sigint_before("prefill");
    if (eng.forward(eng.ctx, ids, (int64_t)n_prompt, 0, logits, lf != NULL, e)) goto out;
    if (write_rows(lf, logits, (int64_t)n_prompt, vocab, o->logits_path, e)) goto out;
    last = lf ? logits + (n_prompt - 1) * (size_t)vocab : logits;
    double t_prefill = dj_now() - t_start;
    rs.prompt_tokens = (int64_t)n_prompt, rs.prefill_s = t_prefill;
    fprintf(stderr, "djinn: prompt %zu tokens, prefill %.1f tokens/s (%.3f s)\n", n_prompt,
            (double)n_prompt / fmax(t_prefill, 1e-9), t_prefill);

    // Decode: sample from the last row, feed the token back. The last token is fed only when its logits row
    // is wanted (--logits), so the file has one row per token of the output.
    int64_t n = (int64_t)n_prompt, n_gen = 0;
    double t_first = 0, t_decode0 = 0;
    const char *stop = NULL;
    const char *at = test_sigint_at();
    int64_t sigint_after = -1;
    if (at && parse_i64(at, &sigint_after)) sigint_after = -1;
    while (n_gen < o->n_new) {  // a Ctrl-C during prefill stops it before the first token is sampled
        if (n_gen == sigint_after) raise(SIGINT);
        if (interrupted) {
            stop = "interrupted";
            break;
        }
        if (n >= ctx) {
            stop = "context full";
            break;
        }
        int32_t next = sampler_next(smp, last);
        if (n_gen == 0) t_first = t_decode0 = dj_now();
        ids[n++] = next;
        n_gen++;
        const char *s = tok_stream_push(stream, next, &len);
        emit(s, len);
        int eos = tok_is_eos(tok, next);
        if (lf || (n_gen < o->n_new && !eos)) {  // position n-1 < ctx: always fits
            if (eng.forward(eng.ctx, &next, 1, n - 1, logits, 0, e)) goto out;
            if (write_rows(lf, logits, 1, vocab, o->logits_path, e)) goto out;
            last = logits;
        }
        if (eos) {
            stop = "end of sequence";
            break;
        }
    }
    if (!stop && interrupted) stop = "interrupted";  // during the prefill of -n 0, or the last token's pass
    const char *tail = tok_stream_flush(stream, &len);
    emit(tail, len);
    fputc('\n', stdout);
    fflush(stdout);

    if (stop && !strcmp(stop, "context full"))
        fprintf(stderr, "djinn: stopped after %" PRId64 " of %" PRId64 " new tokens: the context of %" PRId64
                        " tokens is full (-c)\n", n_gen, o->n_new, ctx);
    else if (stop && !strcmp(stop, "interrupted"))
        fprintf(stderr, "djinn: interrupted after %" PRId64 " new tokens\n", n_gen);
    else if (stop)
        fprintf(stderr, "djinn: stopped at the end-of-sequence token after %" PRId64 " new tokens\n", n_gen);
    if (n_gen > 0) {
        double t_end = dj_now(), t_dec = t_end - t_decode0;
        fprintf(stderr, "djinn: time to first token %.1f ms\n", (t_first - t_start) * 1e3);
        rs.ttft_ms = (t_first - t_start) * 1e3, rs.decode_s = t_dec, rs.decode_tokens = n_gen - 1;
        if (n_gen > 1)
            fprintf(stderr, "djinn: decode %" PRId64 " tokens, %.1f tokens/s, %.2f ms/token\n", n_gen - 1,
                    (double)(n_gen - 1) / fmax(t_dec, 1e-9), t_dec * 1e3 / (double)(n_gen - 1));
    }
    if (eng.is_gpu) {
        dj_gpu_stats g;
        gpu_state_stats(eng.ctx, &g);
        if (g.n_streamed)
            fprintf(stderr, "djinn: streamed %d units, %.3f GB per pass over PCIe at %.2f GB/s achieved; compute "
                            "waited %.2f ms per pass for copies (%" PRId64 " passes)\n", g.n_streamed,
                    (double)g.bytes_per_token / 1e9, g.copy_ms > 0 ? (double)g.copied_bytes / 1e6 / g.copy_ms : 0.0,
                    g.passes ? g.wait_ms / (double)g.passes : 0.0, g.passes);
        if (g.cpu_share > 0)
            fprintf(stderr, "djinn: CPU share %.2f: %.3f GB per decode token read by the CPU from host memory\n",
                    g.cpu_share, (double)g.cpu_bytes_per_token / 1e9);
    }
    if (o->stats_path && write_stats(o->stats_path, m, &eng, o, &rs, e)) goto out;
    if (lf) {
        FILE *f = lf;
        lf = NULL;
        if (fclose(f)) {
            dj_fail(e, "cannot write logits to %s: %s", o->logits_path, strerror(errno));
            goto out;
        }
    }
    rc = interrupted ? EXIT_INTERRUPTED : 0;
out:
    if (lf) fclose(lf);
    if (stream) tok_stream_free(stream);
    engine_close(&eng);
    sampler_free(smp);
    free(logits);
    free(ids);
    return rc;
}

// ---- main
int main(int argc, char **argv) {
    dj_opts o;
    int prc = parse_args(argc, argv, &o);
    if (prc == -1) {
        usage(stdout);
        return 0;
    }
    if (prc) return prc;

    signal(SIGINT, on_sigint);
    dj_err e = {{0}};
    dj_model m;
    int use_gpu = !o.force_cpu && !o.tokenize && gpu_count() > 0;
    if (o.force_cpu) fprintf(stderr, "djinn: running on the CPU (--cpu), %d threads\n", cpu_threads());
    else if (!o.tokenize && !use_gpu)
        fprintf(stderr, "djinn: warning: no GPU found: running on the CPU, %d threads\n", cpu_threads());
    if (!use_gpu &&
        (o.stream_all || o.sync_copy || o.ring_gb > 0 || o.no_graph || o.fma_attn || o.cpu_share_given))
        fprintf(stderr, "djinn: warning: --ring-gb, --stream-all, --sync-copy, --no-graph, --fma-attn and "
                        "--cpu-share apply to the GPU engine only\n");
    dj_load_opts lo = {.want_pinned = use_gpu, .no_pin = o.no_pin, .quiet = 0};
    double t0 = dj_now();
    test_sigint_before("load");
    if (model_load(o.model_path, &lo, &m, &e)) {
        fprintf(stderr, "djinn: %s\n", e.msg);
        return EXIT_ERR;
    }
    double dt = dj_now() - t0;
    const dj_config *c = &m.info.config;
    fprintf(stderr,
            "djinn: loaded %s: %.3f GB in %.3f s (%.2f GB/s); dim %u, %u layers, %u/%u heads, head_dim %u, "
            "vocab %u, %s weights\n",
            o.model_path, (double)m.data_size / 1e9, dt, (double)m.data_size / 1e9 / fmax(dt, 1e-9), c->dim,
            c->n_layers, c->n_heads, c->n_kv_heads, c->head_dim, c->vocab_size, dj_dtype_name(c->wtype));
    if (interrupted_during("loading")) {
        model_free(&m);
        return EXIT_INTERRUPTED;
    }
    if (o.ctx > (int64_t)c->max_seq_len) {
        fprintf(stderr, "djinn: -c %" PRId64 " is beyond the model's max_seq_len of %u\n", o.ctx, c->max_seq_len);
        model_free(&m);
        return EXIT_USAGE;
    }

    int rc;
    if (o.check_path) {
        rc = run_check(&m, &o, &e);
    } else {
        dj_tokenizer *tok = tok_load(m.data + m.info.tok_off, (size_t)m.info.tok_size, &e);
        if (!tok) {
            fprintf(stderr, "djinn: %s\n", e.msg);
            model_free(&m);
            return EXIT_ERR;
        }
        rc = run_generate(&m, tok, &o, dt, &e);
        tok_free(tok);
    }
    if (rc && rc != EXIT_CHECK && rc != EXIT_INTERRUPTED) fprintf(stderr, "djinn: %s\n", e.msg);
    model_free(&m);
    return rc;
}
