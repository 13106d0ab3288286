// djinn.c: the command line: options, loading, then either generation (the prompt's prefill, the decode loop
// streaming text to stdout, the statistics, the --logits dump) or --check against a reference file.
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "chat.h"
#include "check.h"
#include "cpu.h"
#include "engine.h"
#include "fileio.h"
#include "gpu_host.h"
#include "kvsize.h"
#include "kvtype.h"
#include "loader.h"
#include "probe.h"
#include "sampler.h"
#include "server.h"
#include "session.h"
#include "spec.h"
#include "stops.h"
#include "tokenizer.h"
#include "tp.h"
#include "trace.h"
#include "util.h"

// Exit codes: 1 runtime error (missing model, bad prompt...), 2 usage error, 3 --check above tolerance,
// 130 interrupted (Ctrl-C) after printing what was generated and the statistics so far.
enum { EXIT_ERR = 1, EXIT_USAGE = 2, EXIT_CHECK = 3, EXIT_INTERRUPTED = 130 };
#define DJINN_VERSION "0.4.0"
#define MAX_STOPS 16
#define MAX_STEERS 64
#define DEFAULT_DRAFT_MAX 8
_Static_assert(SPEC_K_MAX == 32, "--draft-max's message names SPEC_K_MAX");
_Static_assert(KV_MEM_SHARE == 4, "the default context's line and --help say 'a quarter'");

// Ctrl-C during generation stops after the current token, during loading within a read chunk (loader.h), during
// the engine's set-up, a prompt's prefill, --check's or --perplexity's passes within the engine (before its next
// layer on the CPU; before its next unit's copy or its next pass of up to 4096 tokens on the GPU: dj_gpu_opts.cancel);
// a chat turn's prefill and every decode step finish their pass. A second Ctrl-C kills at once.
static volatile sig_atomic_t interrupted;
static volatile sig_atomic_t cuttable, cut;  // a phase the engine may cut short runs; the engines' flag
static void on_sigint(int sig) {
    interrupted = 1, dj_load_cancel = 1;  // a load stops within a chunk
    cut = cuttable;
    signal(sig, out_kill_handler);  // a second Ctrl-C kills at once, removing the outputs' PATH.tmp as SIGTERM does
}

// Enters (1) or leaves (0) a phase the engine may cut short; one entered after a Ctrl-C is cut at once.
static void cuttable_phase(int on) {
    cuttable = on;
    cut = on && interrupted;
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

// After a phase of a run that then ends: 1 when it failed or Ctrl-C came during it (said, and *rc set to
// EXIT_INTERRUPTED; a failure leaves *rc as it was), 0 when the run goes on.
static int phase_stopped(int failed, const char *phase, int *rc) {
    if (!interrupted_during(phase)) return failed != 0;
    *rc = EXIT_INTERRUPTED;
    return 1;
}

// ---- options
typedef struct {
    const char *model_path;
    const char *prompt;       // -p, or the -f file's text (main reads it)
    size_t prompt_len;
    const char *prompt_file;  // -f PATH, "-": stdin
    int64_t n_new;       // new tokens (-n -1: INT64_MAX, until the context is full or an end token)
    int ignore_eos;      // --ignore-eos: an end token does not end the generation
    dj_sampling smp;     // -t, --top-p, --top-k, --min-p, the penalties
    uint64_t seed;
    int seed_given;
    int64_t ctx;         // -c; 0 until main sets the default (default_context)
    int kv_type;         // --kv-type (kvtype.h)
    struct {             // the GPU engine's own options (dj_gpu_opts); given on the CPU, a warning
        double ring_gb;  // GPU memory for weights, GB; 0: automatic
        int stream_all;  // ablation: nothing resident
        int sync_copy;   // ablation: no copy/compute overlap
        int no_graph;    // all-resident decode launch by launch
        int fma_attn;    // prefill attention on the fp32 FMA kernel, not the tensor cores
        double cpu_share;  // dj_gpu_opts.cpu_share: < 0 automatic (the default), 0 off
        int cpu_share_given;
        int n_gpus, gpus[TP_MAX_GPUS];  // --gpus (0: one GPU, device 0)
    } gpu;
    int force_cpu;
    int no_pin;          // pageable host memory for the weights
    int64_t threads;     // CPU threads (the pool's size); 0: one per CPU of the process's affinity mask
    int chat;                 // --chat: an interactive conversation with the model's chat template
    const char *system;       // --system
    const char *chat_template;  // --chat-template llama2|llama3|FILE (NULL: the model's own)
    const char *stops[MAX_STOPS];  // --stop: the generation ends where one of these appears, without it
    int n_stops;
    const char *stats_path;
    const char *logits_path;
    const char *check_path;
    const char *ppl_path;   // --perplexity
    double tol;          // <0: per-dtype default
    int tokenize;
    const char *draft_path;  // --draft: speculative decoding with this model as the draft (spec.h)
    dj_spec_opts spec;       // --draft-max, --draft-p-min
    int spec_given;          // either of them given
    const char *dump_layers, *dump_path;  // --dump-act LAYERS FILE (probe.h)
    const char *steers[MAX_STEERS];       // --steer LAYER:FILE[:SCALE]
    int n_steers;
    const char *save_session, *load_session;  // --save-session FILE, --load-session FILE (session.h)
    const char *trace_path;                   // --trace FILE: the decode steps' timeline (trace.h)
    int64_t trace_steps;                      // --trace-steps N (0: TRACE_STEPS_DEFAULT)
    dj_probe *probe;                      // --dump-act and --steer, made once the model is loaded
    dj_model *loaded;                     // the model main loaded: on several GPUs its weights go to the GPUs'
                                          // parts as they are built (dj_gpu_opts.consume), its tokenizer stays
} dj_opts;

static void usage(FILE *f) {
    fprintf(f,
            "usage: djinn MODEL [-p PROMPT] [options]      (djinn serve MODEL: the OpenAI-compatible server)\n"
            "  MODEL, -m MODEL  a model.bin written by ./convert/convert\n"
            "  -p PROMPT        prompt text (default: empty, i.e. BOS only)\n"
            "  -f FILE          the prompt from a file, or from stdin with -f - (any length up to the context)\n"
            "  -n N             new tokens to generate (default 256; 0: prefill only; -1: until the context is full)\n"
            "  -t TEMP, --temp TEMP  temperature (default 1.0; 0: greedy). -t is llama2.c's temperature, not\n"
            "                   llama.cpp's threads (--threads): -t with a whole number of 2 or more is refused\n"
            "  --top-p P        nucleus sampling mass in [0, 1] (default 0.9; 0: greedy)\n"
            "  --top-k K        sample from the K most likely tokens only (default 0: off; 1: greedy)\n"
            "  --min-p P        only tokens at least P times as likely as the most likely one (default 0: off)\n"
            "  --repeat-penalty F  divide a positive logit (multiply a negative one) of each token among the last\n"
            "                   --repeat-last-n tokens by F (default 1: off)\n"
            "  --repeat-last-n N   the tokens the penalties look back over (default 64; 0: none)\n"
            "  --presence-penalty F   subtract F from the logit of each token among them (default 0)\n"
            "  --frequency-penalty F  subtract F times its count among them (default 0)\n"
            "  -s SEED          RNG seed (default: a fresh one from the clock's nanoseconds and the process,\n"
            "                   printed on stderr); same seed, same text\n"
            "  -c CTX           context size in tokens: the KV cache length (default: the model's\n"
            "                   max_position_embeddings where its KV cache takes at most a quarter of the GPU's\n"
            "                   memory and what the model's weights leave of it (room for 4096 positions at\n"
            "                   least), or a quarter of the host's available memory on the CPU; else the multiple\n"
            "                   of 256 that does, said on stderr; -c may go up to max_position_embeddings)\n"
            "  --kv-type T      the KV cache's elements: " DJ_KV_NAMES " (default %s; q8: int8 values with a scale\n"
            "                   per head and position, about a quarter of f32's bytes)\n"
            "  --ring-gb G      GPU memory for weights, in GB (1e9 bytes): layers that fit stay resident, the rest\n"
            "                   stream over PCIe every token (default: free GPU memory minus the KV cache,\n"
            "                   activations and a margin; the plan is printed on stderr)\n"
            "  --gpus N|IDS     run on N GPUs (the first N visible), or on the devices listed (--gpus 0,1): every\n"
            "                   layer split over them (heads and FFN rows), each GPU holding and streaming its\n"
            "                   part; --ring-gb is per GPU (default: every visible GPU the model splits over;\n"
            "                   --gpus 1 for one)\n"
            "  --stream-all     ablation: keep no layer resident, stream every layer every token\n"
            "  --sync-copy      ablation: copy a layer, wait, compute it (no overlap)\n"
            "  --no-graph       ablation: run the all-resident decode step kernel by kernel, not as a CUDA graph\n"
            "  --fma-attn       comparison: prefill attention on the fp32 FMA kernel instead of the tensor cores\n"
            "                   (bf16x3, f32-class accuracy; used for head_dim a multiple of 16 up to 256)\n"
            "  --threads N      CPU threads for the CPU engine and the CPU share (default: the CPUs this process\n"
            "                   may run on, its affinity mask)\n"
            "  llama.cpp's spellings work too: -m/--model, --temp, --seed, --ctx-size, --n-predict, --prompt, --file,\n"
            "                   and for --stop -r/--reverse-prompt, for --chat -cnv/--conversation; their -ngl N\n"
            "                   (--n-gpu-layers) is answered with one line: Djinn sizes the GPU's share in GB (--ring-gb)\n"
            "  --cpu-share F    while layers stream, the CPU computes fraction F (0 to 0.95) of each streamed\n"
            "                   layer's weights (whole matrices, the largest first) from host memory in each\n"
            "                   decode step, so those bytes never cross PCIe; 'auto' (the default) balances the\n"
            "                   CPU's measured rate against the link's, 0 turns it off (then streamed logits\n"
            "                   are bitwise those of the all-resident path)\n"
            "  --no-pin         keep the weights in pageable memory (where page-locking is limited; copies\n"
            "                   then run at ~7 GB/s instead of ~50 and do not overlap compute)\n"
            "  --cpu            run on the CPU even when a GPU is present\n"
            "  --stats-json F   write the run's statistics (load, prefill, decode, streaming) to F as JSON\n"
            "  --logits FILE    write float32 logits (vocab values per row), one row per processed position:\n"
            "                   every prompt position (BOS included), then every generated token's position\n"
            "  --check REF      teacher-force REF's token ids (from tools/reference.py) and compare logits;\n"
            "                   exits 3 when the worst position's relative L2 error (q8, q4: the mean KL) is above\n"
            "                   the tolerance\n"
            "  --tol X          --check tolerance (default: 1e-4 on the CPU; on the GPU 1e-4 for f32 weights, 5e-3\n"
            "                   for f16, 1e-2 for bf16; mean KL 1e-2 for q8, 0.3 for q4)\n"
            "  --perplexity F   the model's perplexity on text file F: every token after the first of each window of\n"
            "                   -c tokens, scored\n"
            "  --stop STR       end the generation where the generated text contains STR, which is not printed\n"
            "                   (repeatable, up to 16)\n"
            "  --ignore-eos     go on past the model's end tokens (they print nothing): -n, --stop or the context\n"
            "                   ends the generation (llama.cpp's flag; benchmarks of a fixed length use it)\n"
            "  --chat           an interactive conversation in the model's own chat template (Llama 2 or 3): a\n"
            "                   line on stdin is a turn; each answer is -n tokens at most; Ctrl-C stops the\n"
            "                   answer, Ctrl-D (end of input) ends the conversation\n"
            "  --system TEXT    the system message of --chat\n"
            "  --chat-template llama2|llama3|FILE  --chat (and djinn serve's chat endpoint) in this template instead\n"
            "                   of the model's own (FILE: a Jinja chat_template, recognised as Llama 2's or 3's)\n"
            "  --draft DRAFT    speculative decoding: DRAFT, a small model.bin with the same tokenizer (the target's\n"
            "                   own --dtype q4 copy is the natural one), resident on the GPU, proposes tokens and\n"
            "                   MODEL verifies them all in one pass; greedy text is MODEL's own, sampled text follows\n"
            "                   MODEL's distribution (speculative sampling). Not with --logits\n"
            "  --draft-max K    most tokens drafted per pass of MODEL, 1 to %d (default %d)\n"
            "  --draft-p-min P  stop drafting where the draft's most likely token is below probability P (default 0:\n"
            "                   draft all K)\n"
            "  --dump-act LAYERS FILE  write the residual stream after LAYERS ('0,15,31' or 'all') at every\n"
            "                   processed position to FILE as float32 (format: README; tools/read_act.py reads it)\n"
            "  --steer LAYER:FILE[:SCALE]  add the control vector in FILE (dim float32 values), times SCALE (default\n"
            "                   1), to the residual stream after LAYER at every position; repeatable (tools/\n"
            "                   make_cvector.py makes one)\n"
            "  --save-session FILE  after the run, write its tokens, KV cache and sampler state to FILE\n"
            "  --load-session FILE  resume a saved run: its text, then -n more tokens, as one run would have gone on\n"
            "                   (same seed, same text; -s reseeds); not with -p or -f\n"
            "  --trace FILE     write the timeline of --trace-steps decode steps of the GPU engine to FILE as JSON:\n"
            "                   each streamed copy, each layer's work and wait on the compute stream, each split\n"
            "                   matmul and the CPU share's part of it (bench/timeline.py draws it); a line of figures\n"
            "                   per step on stderr\n"
            "  --trace-steps N  the decode steps --trace records, 1 to %d, after the first (default %d)\n"
            "  --tokenize       print the prompt's token ids and exit\n"
            "  --version        print the version and the model.bin versions this build reads\n"
            "  --help           this text\n"
            "stdout carries only the text (prompt + generation); statistics go to stderr.\n",
            dj_kv_name(DJ_KV_DEFAULT), SPEC_K_MAX, DEFAULT_DRAFT_MAX, TRACE_STEPS_MAX, TRACE_STEPS_DEFAULT);
}

// One line: what was wrong, and where to look.
static int usage_error(const char *fmt, const char *arg) {
    fputs("djinn: ", stderr);
    fprintf(stderr, fmt, arg);
    fputs(" (see djinn --help)\n", stderr);
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
    double v = strtod(s, &end);  // an underflow (1e-400) is a tiny number, not an error; an overflow is infinite
    if (end == s || *end || !isfinite(v)) return -1;
    *out = v;
    return 0;
}

// DJINN_TEST_SIGINT_AT=N: the count of new tokens before which a test's Ctrl-C comes; -1 for none.
static int64_t test_sigint_token(void) {
    const char *at = test_sigint_at();
    int64_t n;
    return at && !parse_i64(at, &n) ? n : -1;
}

// --dump-act, --steer (their syntax; the layers against the model once it is loaded), --save-session, --load-session.
static int check_probe_args(const dj_opts *o) {
    dj_err e;
    uint32_t layer;
    char *file;
    double scale;
    if (o->dump_layers && probe_parse_layers(o->dump_layers, 0, NULL, &e)) return usage_error("--dump-act: %s", e.msg);
    for (int k = 0; k < o->n_steers; k++) {
        if (probe_parse_steer(o->steers[k], 0, &layer, &file, &scale, &e)) return usage_error("--steer: %s", e.msg);
        free(file);
    }
    if ((o->dump_path || o->n_steers) && (o->tokenize || o->draft_path))
        return usage_error("%s", "--dump-act and --steer work on the model's passes: not with --tokenize or --draft");
    if ((o->save_session || o->load_session) &&
        (o->chat || o->check_path || o->ppl_path || o->tokenize || o->draft_path))
        return usage_error("%s", "--save-session and --load-session keep a generation: not with --chat, --check, "
                                 "--perplexity, --tokenize or --draft");
    if (o->load_session && (o->prompt[0] || o->prompt_file || o->logits_path))
        return usage_error("%s", "--load-session resumes the session's own text: not with -p, -f or --logits");
    return 0;
}

// A flag without a value: set (1), or not one (0).
static int parse_flag(const char *a, dj_opts *o) {
    if (!strcmp(a, "--cpu")) { o->force_cpu = 1; return 1; }
    if (!strcmp(a, "--tokenize")) { o->tokenize = 1; return 1; }
    if (!strcmp(a, "--chat")) { o->chat = 1; return 1; }
    if (!strcmp(a, "--stream-all")) { o->gpu.stream_all = 1; return 1; }
    if (!strcmp(a, "--sync-copy")) { o->gpu.sync_copy = 1; return 1; }
    if (!strcmp(a, "--no-graph")) { o->gpu.no_graph = 1; return 1; }
    if (!strcmp(a, "--fma-attn")) { o->gpu.fma_attn = 1; return 1; }
    if (!strcmp(a, "--no-pin")) { o->no_pin = 1; return 1; }
    if (!strcmp(a, "--ignore-eos")) { o->ignore_eos = 1; return 1; }
    return 0;
}

// --dump-act LAYERS FILE, --steer, --save-session or --load-session at argv[*i] (*taken, *i then past its values):
// 0, or EXIT_USAGE after its line.
static int parse_probe_or_session(int argc, char **argv, int *i, dj_opts *o, int *taken) {
    const char *a = argv[*i];
    *taken = !strcmp(a, "--dump-act") || !strcmp(a, "--steer") || !strcmp(a, "--save-session") ||
             !strcmp(a, "--load-session");
    if (!*taken) return 0;
    int two = !strcmp(a, "--dump-act");
    if (*i + 1 + two >= argc)
        return usage_error(two ? "option '%s' needs LAYERS and FILE" : "option '%s' needs a value", a);
    const char *v = argv[++*i];
    if (two) {
        o->dump_layers = v, o->dump_path = argv[++*i];
    } else if (!strcmp(a, "--steer")) {
        if (o->n_steers == MAX_STEERS) return usage_error("more than %s --steer vectors", "64");
        o->steers[o->n_steers++] = v;
    } else if (!strcmp(a, "--save-session")) {
        o->save_session = v;
    } else {
        o->load_session = v;
    }
    return 0;
}

// Option `a`'s value v (a is one of with_value's): 0, or EXIT_USAGE after its line.
static int parse_value(const char *a, const char *v, dj_opts *o) {
    int64_t n;
    double d;
    if (!strcmp(a, "-p")) {
        o->prompt = v, o->prompt_len = strlen(v);
    } else if (!strcmp(a, "-f")) {
        o->prompt_file = v;
    } else if (!strcmp(a, "--chat-template")) {
        o->chat_template = v;
    } else if (!strcmp(a, "--system")) {
        o->system = v;
    } else if (!strcmp(a, "--stop")) {
        if (!v[0]) return usage_error("%s", "--stop needs a non-empty string");
        if (o->n_stops == MAX_STOPS) return usage_error("more than %s --stop strings", "16");
        o->stops[o->n_stops++] = v;
    } else if (!strcmp(a, "-n")) {
        if (parse_i64(v, &n) || n < -1) return usage_error("-n needs a count >= 0 (-1: until the context is full), not '%s'", v);
        o->n_new = n < 0 ? INT64_MAX : n;
    } else if (!strcmp(a, "-t") || !strcmp(a, "--temp")) {
        // llama2.c's temperature; after -t a whole number of 2 or more is a llama.cpp user's thread count
        if (!parse_i64(v, &n) && n >= 2 && a[1] == 't')
            return usage_error("-t %s: -t is the temperature in Djinn (as in llama2.c); threads are --threads, a "
                               "temperature this high is --temp", v);
        if (parse_f64(v, &d) || d < 0 || d >= DJ_SAMPLING_MAX)
            return usage_error("-t needs a temperature from 0 up to (not including) " DJ_TEXT(DJ_SAMPLING_MAX)
                               ", not '%s'", v);
        o->smp.temp = d;
    } else if (!strcmp(a, "-m")) {
        if (o->model_path) return usage_error("a second model '%s'", v);
        o->model_path = v;
    } else if (!strcmp(a, "-ngl")) {  // llama.cpp's layer count: said once, then the automatic sizing
        if (parse_i64(v, &n) || n < -1) return usage_error("-ngl needs a layer count, not '%s'", v);
        fprintf(stderr, "djinn: -ngl %s: %s\n", v, ENGINE_NGL_NOTE);
    } else if (!strcmp(a, "--top-p")) {
        if (parse_f64(v, &d) || d < 0 || d > 1) return usage_error("--top-p needs a value in [0, 1], not '%s'", v);
        o->smp.top_p = d;
    } else if (!strcmp(a, "--top-k")) {
        if (parse_i64(v, &n) || n < 0) return usage_error("--top-k needs a count >= 0, not '%s'", v);
        o->smp.top_k = n;
    } else if (!strcmp(a, "--min-p")) {
        if (parse_f64(v, &d) || d < 0 || d > 1) return usage_error("--min-p needs a value in [0, 1], not '%s'", v);
        o->smp.min_p = d;
    } else if (!strcmp(a, "--repeat-penalty")) {
        if (parse_f64(v, &d) || d < DJ_SAMPLING_MIN || d >= DJ_SAMPLING_MAX)
            return usage_error("--repeat-penalty needs a factor from " DJ_TEXT(DJ_SAMPLING_MIN)
                               " up to (not including) " DJ_TEXT(DJ_SAMPLING_MAX) ", not '%s'", v);
        o->smp.repeat_penalty = d;
    } else if (!strcmp(a, "--repeat-last-n")) {
        if (parse_i64(v, &n) || n < 0 || n > (1 << 24))
            return usage_error("--repeat-last-n needs a count from 0 to 16777216, not '%s'", v);
        o->smp.repeat_last_n = n;
    } else if (!strcmp(a, "--presence-penalty") || !strcmp(a, "--frequency-penalty")) {
        if (parse_f64(v, &d) || fabs(d) > DJ_SAMPLING_MAX)
            return usage_error("%s needs a number from -" DJ_TEXT(DJ_SAMPLING_MAX) " to " DJ_TEXT(DJ_SAMPLING_MAX), a);
        if (a[2] == 'p') o->smp.presence_penalty = d;
        else o->smp.frequency_penalty = d;
    } else if (!strcmp(a, "-s")) {
        if (parse_i64(v, &n) || n < 0) return usage_error("-s needs a non-negative integer seed, not '%s'", v);
        o->seed = (uint64_t)n;
        o->seed_given = 1;
    } else if (!strcmp(a, "-c")) {
        if (parse_i64(v, &n) || n <= 0) return usage_error("-c needs a positive context size, not '%s'", v);
        o->ctx = n;
    } else if (!strcmp(a, "--kv-type")) {
        if ((o->kv_type = dj_kv_parse(v)) < 0) return usage_error("--kv-type needs " DJ_KV_NAMES ", not '%s'", v);
    } else if (!strcmp(a, "--threads")) {
        if (parse_i64(v, &n) || n < 1 || n > 256) return usage_error("--threads needs a count from 1 to 256, not '%s'", v);
        o->threads = n;
    } else if (!strcmp(a, "--gpus")) {
        dj_err pe;
        if (tp_parse_gpus(v, &o->gpu.n_gpus, o->gpu.gpus, &pe)) return usage_error("%s", pe.msg);
    } else if (!strcmp(a, "--ring-gb")) {
        if (parse_f64(v, &d) || d <= 0) return usage_error("--ring-gb needs a positive number of GB, not '%s'", v);
        o->gpu.ring_gb = d;
    } else if (!strcmp(a, "--cpu-share")) {
        if (!strcmp(v, "auto")) d = -1;
        else if (parse_f64(v, &d) || d < 0 || d > 0.95)
            return usage_error("--cpu-share needs 'auto' or a fraction from 0 to 0.95, not '%s'", v);
        o->gpu.cpu_share = d;
        o->gpu.cpu_share_given = 1;
    } else if (!strcmp(a, "--logits")) {
        o->logits_path = v;
    } else if (!strcmp(a, "--stats-json")) {
        o->stats_path = v;
    } else if (!strcmp(a, "--check")) {
        o->check_path = v;
    } else if (!strcmp(a, "--perplexity")) {
        o->ppl_path = v;
    } else if (!strcmp(a, "--draft")) {
        o->draft_path = v;
    } else if (!strcmp(a, "--trace")) {
        o->trace_path = v;
    } else if (!strcmp(a, "--trace-steps")) {
        if (parse_i64(v, &n) || n < 1 || n > TRACE_STEPS_MAX)
            return usage_error("--trace-steps needs a count from 1 to 64, not '%s'", v);  // TRACE_STEPS_MAX
        o->trace_steps = n;
    } else if (!strcmp(a, "--draft-max")) {
        if (parse_i64(v, &n) || n < 1 || n > SPEC_K_MAX)
            return usage_error("--draft-max needs a count from 1 to 32, not '%s'", v);  // SPEC_K_MAX
        o->spec.k_max = n, o->spec_given = 1;
    } else if (!strcmp(a, "--draft-p-min")) {
        if (parse_f64(v, &d) || d < 0 || d > 1) return usage_error("--draft-p-min needs a value in [0, 1], not '%s'", v);
        o->spec.p_min = d, o->spec_given = 1;
    } else if (!strcmp(a, "--tol")) {
        if (parse_f64(v, &d) || d < 0) return usage_error("--tol needs a non-negative number, not '%s'", v);
        o->tol = d;
    }
    return 0;
}

// The options given together: 0, or EXIT_USAGE after its line.
static int check_args(const dj_opts *o) {
    if (!o->model_path) return usage_error("%s", "no MODEL given");
    if (o->prompt_file && o->prompt[0]) return usage_error("%s", "-p and -f both give the prompt: one of them");
    if (o->chat && (o->prompt[0] || o->prompt_file || o->tokenize || o->check_path || o->ppl_path || o->logits_path ||
                    o->stats_path || o->n_stops))
        return usage_error("%s", "--chat reads its turns from stdin: not with -p, -f, --tokenize, --check, --perplexity, "
                                 "--logits, --stats-json or --stop");
    if (o->system && !o->chat) return usage_error("%s", "--system is --chat's");
    if (o->ignore_eos && (o->chat || o->check_path || o->ppl_path || o->tokenize))
        return usage_error("%s", "--ignore-eos is a generation's: not with --chat (an answer ends at its end token), "
                                 "--check, --perplexity or --tokenize");
    if ((o->check_path || o->tokenize || o->ppl_path) && (o->logits_path || o->stats_path))
        return usage_error("%s", "--logits and --stats-json record a generation: not with --check, --perplexity or "
                                 "--tokenize");
    if (o->check_path && o->ppl_path) return usage_error("%s", "--check and --perplexity are two runs");
    if ((o->check_path || o->ppl_path) && (o->prompt[0] || o->prompt_file || o->tokenize))
        return usage_error("%s", "--check and --perplexity read their own tokens (the reference's, the text's): not "
                                 "with -p, -f or --tokenize");
    if (o->tol >= 0 && !o->check_path) return usage_error("%s", "--tol is --check's");
    if (o->chat_template && !o->chat) return usage_error("%s", "--chat-template is --chat's (and djinn serve's)");
    if (o->spec_given && !o->draft_path) return usage_error("%s", "--draft-max and --draft-p-min need --draft");
    if (o->trace_steps && !o->trace_path) return usage_error("%s", "--trace-steps needs --trace");
    if (o->trace_path && (o->force_cpu || o->check_path || o->ppl_path || o->tokenize))
        return usage_error("%s", "--trace records the GPU engine's decode steps: not with --cpu, --check, --perplexity "
                                 "or --tokenize");
    if (o->draft_path && (o->chat || o->check_path || o->ppl_path || o->tokenize || o->logits_path))
        return usage_error("%s", "--draft speeds up generation: not with --chat, --check, --perplexity, --tokenize or "
                                 "--logits");
    return check_probe_args(o);
}

// Options that take a value (parse_value).
static const char *with_value[] = {"-p", "-f", "--stop", "--system", "--chat-template", "--top-k", "--min-p", "--repeat-penalty",
                                   "--repeat-last-n", "--presence-penalty", "--frequency-penalty", "-n", "-t",
                                   "--top-p", "-s", "-c", "--ring-gb", "--logits", "--check", "--tol", "--stats-json",
                                   "--cpu-share", "--gpus", "--perplexity", "--threads", "--draft", "--draft-max",
                                   "--draft-p-min", "--trace", "--trace-steps", "-m", "-ngl", "--temp", "--kv-type"};

// llama.cpp's spellings of the same options (its users type them): the name Djinn parses them under.
static const char *canonical_flag(const char *a) {
    static const char *const alias[][2] = {
        {"--model", "-m"},     {"--seed", "-s"},      {"--ctx-size", "-c"},
        {"--n-predict", "-n"}, {"--prompt", "-p"},    {"--file", "-f"},           {"-r", "--stop"},
        {"--reverse-prompt", "--stop"},  {"--n-gpu-layers", "-ngl"},  {"--gpu-layers", "-ngl"},
        {"-cnv", "--chat"},    {"--conversation", "--chat"},
    };
    for (size_t k = 0; k < sizeof alias / sizeof *alias; k++)
        if (!strcmp(a, alias[k][0])) return alias[k][1];
    return a;
}

// Returns 0 when parsed, else the exit code (EXIT_USAGE, or -1 for --help, -2 for --version).
static int parse_args(int argc, char **argv, dj_opts *o) {
    *o = (dj_opts){.prompt = "", .n_new = 256, .smp = DJ_SAMPLING_DEFAULT, .tol = -1, .gpu.cpu_share = -1,
                   .spec = {.k_max = DEFAULT_DRAFT_MAX}, .kv_type = DJ_KV_DEFAULT};
    for (int i = 1; i < argc; i++) {
        const char *a = canonical_flag(argv[i]);
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) return -1;
        if (!strcmp(a, "--version")) return -2;
        if (parse_flag(a, o)) continue;
        int taken, rc = parse_probe_or_session(argc, argv, &i, o, &taken);  // --dump-act takes two values
        if (rc) return rc;
        if (taken) continue;
        if (a[0] != '-' || a[1] == 0) {
            if (o->model_path) return usage_error("unexpected argument '%s'", a);
            o->model_path = a;
            continue;
        }
        int known = 0;
        for (size_t k = 0; k < sizeof with_value / sizeof *with_value; k++) known |= !strcmp(a, with_value[k]);
        if (!known) return usage_error("unknown option '%s'", a);
        if (i + 1 >= argc) return usage_error("option '%s' needs a value", a);
        if ((rc = parse_value(a, argv[++i], o))) return rc;
    }
    return check_args(o);
}

// ---- engines
// The context without -c (kv_default_context): the model's max_seq_len where its KV cache of kv_type fits the memory
// it may take, else the multiple of 256 that does, said in one line.
static int64_t default_context(const dj_model *m, int kv_type, int gpu) {
    const dj_config *c = &m->info.config;
    const char *mem;
    const uint64_t pos_bytes = engine_kv_pos_bytes(c, kv_type);
    const kv_ctx_choice ch = kv_default_context(pos_bytes, c->max_seq_len, kv_budget(gpu, &mem), gpu,
                                                m->info.file_size);
    const int64_t ctx = ch.ctx;
    if (ctx < (int64_t)c->max_seq_len)
        fprintf(stderr, "djinn: context %" PRId64 " of the model's %u: its KV cache (%.3g GB, %s) takes at most %s%s, "
                        "%.3g GB (-c to change)\n", ctx, c->max_seq_len, (double)pos_bytes * (double)ctx / 1e9,
                dj_kv_name(kv_type), ch.by_weights ? "what the model's weights leave of " : "a quarter of ", mem,
                (double)ch.budget / 1e9);
    return ctx;
}

// One pass over n ids from position 0, every row's logits (n, vocab), that Ctrl-C may cut short.
static int cut_forward(dj_engine *eng, const int32_t *ids, int64_t n, float *logits, dj_err *e) {
    cuttable_phase(1);
    int rc = eng->forward(eng->ctx, 0, ids, n, 0, logits, 1, e);
    cuttable_phase(0);
    return rc;
}

// warm: the length of the first pass to come (the GPU engine warms up on that shape)
static int open_engine(dj_engine *eng, const dj_model *m, const dj_opts *o, int64_t ctx, int64_t warm, dj_err *e) {
    dj_gpu_opts go = {.ring_gb = o->gpu.ring_gb, .max_seq = ctx, .stream_all = o->gpu.stream_all,
                      .sync_copy = o->gpu.sync_copy, .no_graph = o->gpu.no_graph, .fma_attn = o->gpu.fma_attn,
                      .warm_rows = warm, .cpu_share = o->gpu.cpu_share, .trace = o->trace_path,
                      .trace_steps = (int)o->trace_steps, .kv_type = o->kv_type, .n_gpus = o->gpu.n_gpus};
    memcpy(go.gpus, o->gpu.gpus, sizeof go.gpus);
    if (m->for_gpu) engine_default_gpus(&go, &m->info.config, "djinn");
    if (go.n_gpus > 1 && o->loaded == m) go.consume = o->loaded;
    go.cancel = &cut;
    cuttable_phase(1);
    int rc = engine_open(eng, m, &go, 1, e);
    cuttable_phase(0);
    if (rc) return -1;
    if (o->probe && !eng->set_probe) return dj_fail(e, "--dump-act and --steer: the %s engine has no probes", eng->name);
    return o->probe ? eng->set_probe(eng->ctx, o->probe, e) : 0;
}

// --draft: the draft model, loaded as the target was (page-locked for the GPU), checked against the target's
// tokenizer and opened first, so that on the GPU all of it stays resident (its weights, KV cache and activations)
// and the target's automatic budget is what is left; an explicit --ring-gb is the target's alone and must fit beside.
typedef struct {
    dj_model m;
    dj_tokenizer *tok;
    dj_engine eng;
} dj_draft;

static int open_draft(dj_draft *d, const dj_model *target, const dj_tokenizer *ttok, const dj_opts *o, int64_t ctx,
                      int64_t warm, dj_err *e) {
    dj_load_opts lo = {.want_pinned = target->for_gpu, .no_pin = o->no_pin, .quiet = 1};
    double t0 = dj_now();
    if (model_load(o->draft_path, &lo, &d->m, e)) return -1;
    const dj_config *c = &d->m.info.config;
    if (!(d->tok = tok_load(d->m.data + d->m.info.tok_off, (size_t)d->m.info.tok_size, e)) ||
        spec_check_pair(target, ttok, &d->m, d->tok, o->draft_path, e))
        return -1;
    if (ctx > (int64_t)c->max_seq_len)
        return dj_fail(e, "--draft %s: a context of %u positions (max_position_embeddings), the run's is %" PRId64
                          ": lower -c", o->draft_path, c->max_seq_len, ctx);
    dj_gpu_opts go = {.max_seq = ctx, .no_graph = o->gpu.no_graph, .fma_attn = o->gpu.fma_attn, .warm_rows = warm,
                      .quiet = 1, .kv_type = o->kv_type};
    if (engine_open(&d->eng, &d->m, &go, 1, e)) return -1;
    double kv_gb = (double)engine_kv_pos_bytes(c, d->eng.kv_type) * (double)ctx / 1e9;
    dj_gpu_stats g;
    if (engine_gpu_stats(&d->eng, &g)) {
        if (g.n_streamed)
            return dj_fail(e, "--draft %s does not fit on the GPU beside its KV cache (%.2f GB for -c %" PRId64 "): %d "
                              "of its units would stream; a smaller draft (--dtype q4) or a lower -c", o->draft_path,
                           kv_gb, ctx, g.n_streamed);
        fprintf(stderr, "djinn: draft %s: %.3f GB of %s weights resident on the GPU, KV cache %.2f GB (%s); up to %"
                        PRId64 " tokens drafted a pass (%.2f s)\n", o->draft_path, (double)g.resident_bytes / 1e9,
                dj_dtype_name(c->wtype), kv_gb, dj_kv_name(d->eng.kv_type), o->spec.k_max, dj_now() - t0);
    } else {
        fprintf(stderr, "djinn: draft %s: %s weights on the CPU; up to %" PRId64 " tokens drafted a pass\n",
                o->draft_path, dj_dtype_name(c->wtype), o->spec.k_max);
    }
    return 0;
}

static void close_draft(dj_draft *d) {
    engine_close(&d->eng);
    tok_free(d->tok);
    model_free(&d->m);
}

// ---- output helpers
// stdout carries the text: a write that fails (a full disk, a closed file) ends the run with an error.
static int emit(const char *text, size_t len, dj_err *e) {
    if (len && fwrite(text, 1, len, stdout) != len) return dj_fail(e, "cannot write to stdout: %s", strerror(errno));
    return stdout_flush(e);
}

// The run's output files (fileio.h: checked and created before loading, renamed into place when complete).
typedef struct {
    dj_out logits, stats;
    dj_out dump, session;  // --dump-act (handed to the probe), --save-session
} dj_outputs;

static int write_rows(dj_outputs *out, const float *rows, int64_t n_rows, int64_t vocab, dj_err *e) {
    if (!out->logits.tmp) return 0;
    return out_write(&out->logits, rows, (size_t)(n_rows * vocab) * sizeof(float), e);
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
    if (r.n_tokens > c->max_seq_len) {
        dj_fail(e, "reference %s has %u tokens, more than the model's context of %u (max_position_embeddings)",
                o->check_path, r.n_tokens, c->max_seq_len);
        goto out;
    }
    if (phase_stopped(open_engine(&eng, m, o, r.n_tokens, r.n_tokens, e), "the engine's setup", &rc)) goto out;
    logits = malloc(4ull * r.n_tokens * r.vocab);
    if (!logits) {
        dj_fail(e, "out of memory for %u x %u logits", r.n_tokens, r.vocab);
        goto out;
    }
    double t0 = dj_now();
    if (phase_stopped(cut_forward(&eng, r.ids, r.n_tokens, logits, e), "--check's pass", &rc)) goto out;
    double dt = dj_now() - t0;
    fprintf(stderr, "djinn: check: %u positions (%u prompt) in %.3f s on the %s\n", r.n_tokens, r.n_prompt, dt,
            eng.name);
    double tol = o->tol >= 0 ? o->tol : check_default_tol(eng.is_gpu, c->wtype, eng.kv_type);
    dj_check ck;
    check_logits(&r, logits, stdout, &ck);
    const char *what;
    double v = check_measure(&ck, c->wtype, eng.kv_type, &what);
    int pass = v <= tol;  // false for NaN too
    printf("check %s: %s %.4e %s tolerance %.1e (%s weights, %s engine)\n", pass ? "PASSED" : "FAILED", what, v,
           pass ? "<=" : ">", tol, dj_dtype_name(c->wtype), eng.name);
    if (stdout_flush(e)) goto out;
    rc = pass ? 0 : EXIT_CHECK;
out:
    engine_close(&eng);
    free(logits);
    ref_free(&r);
    return rc;
}

// ---- --perplexity: every token of a text scored, window by window of the context
static int run_perplexity(const dj_model *m, const dj_tokenizer *tok, const dj_opts *o, dj_err *e) {
    const dj_config *c = &m->info.config;
    int64_t vocab = c->vocab_size;
    int64_t ctx = o->ctx;
    char *text = NULL;
    size_t n_text, n_ids = 0;
    int32_t *ids = NULL;
    float *logits = NULL;
    dj_engine eng = {0};
    int rc = EXIT_ERR;
    if (in_read_all(o->ppl_path, "text", 64u << 20, &text, &n_text, e)) goto out;
    if (memchr(text, 0, n_text)) {  // as -f's prompt: a NUL byte is not text
        dj_fail(e, "%s holds a NUL byte: --perplexity scores a text", o->ppl_path);
        goto out;
    }
    if (tok_encode(tok, text, n_text, 1, &ids, &n_ids, e)) goto out;
    if (n_ids < 2) {
        dj_fail(e, "%s holds %zu tokens: nothing to score", o->ppl_path, n_ids);
        goto out;
    }
    if (ctx < 2) {  // a window scores every token after its first: one of 1 token scores none
        dj_fail(e, "--perplexity needs a context of at least 2 tokens, not -c %lld", (long long)ctx);
        goto out;
    }
    int64_t win = (int64_t)n_ids < ctx ? (int64_t)n_ids : ctx;
    if (!(logits = malloc((size_t)win * (size_t)vocab * sizeof *logits))) {
        dj_fail(e, "out of memory for %lld x %lld logits", (long long)win, (long long)vocab);
        goto out;
    }
    if (phase_stopped(open_engine(&eng, m, o, ctx, win, e), "the engine's setup", &rc)) goto out;
    double nll = 0, t0 = dj_now();
    int64_t scored = 0, windows = 0;
    for (int64_t w0 = 0; w0 + 1 < (int64_t)n_ids && !interrupted; w0 += ctx, windows++) {
        int64_t T = (int64_t)n_ids - w0 < ctx ? (int64_t)n_ids - w0 : ctx;
        int frc = cut_forward(&eng, ids + w0, T, logits, e);
        if (frc && interrupted) break;  // the window cut short: the score of those before it
        if (frc) goto out;
        for (int64_t t = 0; t + 1 < T; t++, scored++) {
            double v = check_nll(logits + t * vocab, vocab, ids[w0 + t + 1]);
            if (!isfinite(v)) {
                dj_fail(e, "the logits at position %lld hold NaN or infinity", (long long)(w0 + t));
                goto out;
            }
            nll += v;
        }
    }
    if (!scored && phase_stopped(0, "--perplexity's first window", &rc)) goto out;  // Ctrl-C before a window's score
    fprintf(stderr, "djinn: perplexity: %lld tokens in %lld windows of up to %lld, %.3f s on the %s\n",
            (long long)scored, (long long)windows, (long long)ctx, dj_now() - t0, eng.name);
    printf("perplexity %.4f over %lld tokens (mean negative log-likelihood %.6f nats)\n", exp(nll / (double)scored),
           (long long)scored, nll / (double)scored);
    rc = stdout_flush(e) ? EXIT_ERR : interrupted ? EXIT_INTERRUPTED : 0;
out:
    engine_close(&eng);
    free(logits), free(ids), free(text);
    return rc;
}

// ---- generation
// Statistics of one run, for stderr and --stats-json.
typedef struct {
    double load_s, setup_s, prefill_s, ttft_ms, decode_s;
    int64_t prompt_tokens, decode_tokens;
    const dj_spec *spec;  // --draft's run, or NULL
} dj_run_stats;

// Writes the run's figures as one JSON object (the benchmark reads it).
static int write_stats(dj_out *out, const dj_model *m, const dj_engine *eng, const dj_opts *o, const dj_run_stats *r,
                       dj_err *e) {
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    if (!f) return dj_fail(e, "out of memory for the statistics");
    double gb = (double)m->data_size / 1e9, dec_ms = r->decode_tokens > 0 ? r->decode_s * 1e3 / r->decode_tokens : 0;
    fprintf(f, "{\"engine\": \"%s\", \"model_gb\": %.6f, \"wtype\": \"%s\", \"load_s\": %.6f, \"load_gb_s\": %.4f,\n \"setup_s\": %.6f,",
            eng->name, gb, dj_dtype_name(m->info.config.wtype), r->load_s, gb / fmax(r->load_s, 1e-9), r->setup_s);
    fprintf(f, " \"prompt_tokens\": %" PRId64 ", \"prefill_s\": %.6f, \"prefill_tok_s\": %.4f, \"ttft_ms\": %.4f,\n",
            r->prompt_tokens, r->prefill_s, (double)r->prompt_tokens / fmax(r->prefill_s, 1e-9), r->ttft_ms);
    fprintf(f, " \"decode_tokens\": %" PRId64 ", \"decode_ms_per_token\": %.6f, \"decode_tok_s\": %.4f",
            r->decode_tokens, dec_ms, dec_ms > 0 ? 1e3 / dec_ms : 0.0);
    dj_gpu_stats g;
    if (engine_gpu_stats(eng, &g))
        fprintf(f, ",\n \"ring_gb\": %.4f, \"stream_all\": %d, \"sync_copy\": %d, \"resident_units\": %d, "
                   "\"streamed_units\": %d, \"resident_gb\": %.6f,\n \"streamed_gb_per_token\": %.6f, \"h2d_gb_s\": %.4f, "
                   "\"wait_ms_per_token\": %.6f, \"passes\": %" PRId64 ", \"tc_attn\": %d,\n"
                   " \"cpu_share\": %.4f, \"cpu_gb_per_token\": %.6f, \"cpu_threads\": %d",
                o->gpu.ring_gb, o->gpu.stream_all, o->gpu.sync_copy, g.n_resident, g.n_streamed,
                (double)g.resident_bytes / 1e9, (double)g.bytes_per_token / 1e9,
                g.copy_ms > 0 ? (double)g.copied_bytes / 1e6 / g.copy_ms : 0.0,
                g.passes > 0 ? g.wait_ms / (double)g.passes : 0.0, g.passes, g.tc_attn, g.cpu_share,
                (double)g.cpu_bytes_per_token / 1e9, cpu_threads_planned());
    if (r->spec) {
        dj_spec_stats sp;
        spec_stats(r->spec, &sp);
        fprintf(f, ",\n \"draft_max\": %" PRId64 ", \"draft_p_min\": %.4f, \"spec_passes\": %" PRId64 ", "
                   "\"tokens_per_pass\": %.4f, \"drafted\": %" PRId64 ", \"accepted\": %" PRId64 ", \"acceptance\": %.4f,\n"
                   " \"draft_steps\": %" PRId64 ", \"draft_s\": %.6f, \"target_s\": %.6f",
                o->spec.k_max, o->spec.p_min, sp.passes, sp.passes ? (double)sp.produced / (double)sp.passes : 0.0,
                sp.drafted, sp.accepted, sp.drafted ? (double)sp.accepted / (double)sp.drafted : 0.0, sp.draft_steps,
                sp.draft_s, sp.target_s);
    }
    fprintf(f, "}\n");
    int rc = fclose(f) ? dj_fail(e, "out of memory for the statistics") : out_write(out, text, len, e);
    free(text);
    return rc ? -1 : out_commit(out, 0, e);
}

// A resumed session keeps its sampling settings when this run leaves every one at its default.
static int sampling_is_default(const dj_sampling *p) {
    const dj_sampling d = DJ_SAMPLING_DEFAULT;
    return p->temp == d.temp && p->top_p == d.top_p && p->min_p == d.min_p && p->top_k == d.top_k &&
           p->repeat_penalty == d.repeat_penalty && p->presence_penalty == d.presence_penalty &&
           p->frequency_penalty == d.frequency_penalty && p->repeat_last_n == d.repeat_last_n;
}

// ---- --stop (stops.h): the generated text goes to stdout through the held text
static int emit_to_stdout(void *ctx, const char *text, size_t n, dj_err *e) { return emit(text, n, e); }

// A seed no two runs share by accident: the clock's nanoseconds and the process id, mixed (splitmix64's finalizer).
static uint64_t fresh_seed(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t z = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec + ((uint64_t)getpid() << 40);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return (z ^ (z >> 31)) >> 1;  // below 2^63: -s takes it back
}

// The prompt of -f: a file (a regular one, at most PROMPT_MAX bytes) or stdin ("-"), without NUL bytes.
#define PROMPT_MAX ((size_t)64 << 20)
static int read_prompt(const char *path, char **text, size_t *len, dj_err *e) {
    *text = NULL, *len = 0;
    if (strcmp(path, "-")) {
        if (in_read_all(path, "prompt file", PROMPT_MAX, text, len, e)) return -1;
    } else {
        size_t cap = 1 << 16, n = 0;
        char *b = malloc(cap + 1);
        for (size_t got; b; n += got) {
            if (n == cap) {
                char *g = cap < PROMPT_MAX ? realloc(b, 2 * cap + 1) : NULL;
                if (!g) break;
                b = g, cap *= 2;
            }
            got = fread(b + n, 1, cap - n, stdin);
            if (!got) break;
        }
        if (!b) return dj_fail(e, "out of memory reading the prompt from stdin");
        if (ferror(stdin) || (n == cap && getc(stdin) != EOF)) {
            free(b);
            return ferror(stdin) ? dj_fail(e, "cannot read the prompt from stdin: %s", strerror(errno))
                                 : dj_fail(e, "the prompt on stdin is larger than %zu MB", PROMPT_MAX >> 20);
        }
        b[n] = 0;
        *text = b, *len = n;
    }
    if (memchr(*text, 0, *len)) {
        free(*text), *text = NULL;
        return dj_fail(e, "%s holds a NUL byte: a prompt is text", strcmp(path, "-") ? path : "the prompt on stdin");
    }
    return 0;
}

// Why a run stopped generating before -n tokens (GEN_RAN: it did not).
typedef enum { GEN_RAN, GEN_EOS, GEN_STOP_STRING, GEN_CONTEXT_FULL, GEN_INTERRUPTED } gen_stop;

// One generation run, from its set-up through prefill and decode to its report.
typedef struct {
    const dj_model *m;
    const dj_tokenizer *tok;
    const dj_opts *o;
    dj_outputs *out;
    int64_t ctx, vocab;
    int32_t *ids;       // the prompt, then the tokens generated (cap + 1)
    size_t n_prompt;
    float *logits;      // (n_prompt with --logits, else 1, vocab)
    int want_rows;      // --logits: every position's row
    dj_engine eng;
    dj_draft draft;     // --draft
    dj_spec *sp;
    dj_session ses;     // --load-session: its tokens take the prompt's place
    dj_sampler *smp;
    const dj_sampling *smp_set;  // the sampling in effect (a resumed session's, or the options')
    dj_tok_stream *stream;
    dj_held held;       // --stop: the generated text not yet printed
    int hit;            // the --stop string found, or -1
    int32_t cand;       // the token the last pass picked
    int64_t n, n_gen;   // tokens in ids; of them generated
    double t_start, t_first, t_decode0;
    gen_stop stop;
    int cut;            // the prefill was cut short by Ctrl-C: nothing to report or save
    dj_run_stats rs;
} gen_run;

// The prompt's ids (or a session's), the engine (and --draft's), the sampler and the text stream.
static int gen_open(gen_run *g, dj_err *e) {
    const dj_opts *o = g->o;
    if (o->load_session) {
        if (session_open(&g->ses, o->load_session, g->m, o->model_path, g->ctx, e)) return -1;
        free(g->ids), g->n_prompt = (size_t)g->ses.n_tokens;
        if (!(g->ids = malloc(g->n_prompt * sizeof *g->ids))) return dj_fail(e, "out of memory");
        memcpy(g->ids, g->ses.ids, g->n_prompt * sizeof *g->ids);
    }
    if (g->n_prompt == 0)
        return dj_fail(e, "the prompt is empty and the model has no BOS token: give a prompt with -p");
    if ((int64_t)g->n_prompt > g->ctx)
        return dj_fail(e, "the prompt is %zu tokens, longer than the context of %" PRId64 " tokens (-c)", g->n_prompt,
                       g->ctx);
    int64_t cap = o->n_new < g->ctx ? (int64_t)g->n_prompt + o->n_new : g->ctx;  // ids: prompt + new tokens, <= ctx
    int32_t *grown = realloc(g->ids, (size_t)(cap + 1) * sizeof *g->ids);
    if (grown) g->ids = grown;
    g->logits = malloc((g->want_rows ? g->n_prompt : 1) * (size_t)g->vocab * sizeof(float));  // (rows, vocab)
    if (!grown || !g->logits) return dj_fail(e, "out of memory");
    double t_setup = dj_now();
    if (o->draft_path && open_draft(&g->draft, g->m, g->tok, o, g->ctx, (int64_t)g->n_prompt, e))
        return interrupted_during("the draft's load") ? 1 : -1;  // first: all resident
    if (open_engine(&g->eng, g->m, o, g->ctx, (int64_t)g->n_prompt, e))
        return interrupted_during("the engine's setup") ? 1 : -1;
    g->rs.setup_s = dj_now() - t_setup;
    fprintf(stderr, "djinn: %s engine set up in %.3f s%s; KV cache %.3g GB (%s) for a context of %" PRId64 "\n",
            g->eng.name, g->rs.setup_s,
            g->eng.is_gpu ? " (buffers, a warm-up pass of the prompt's length, the decode graph)" : "",
            (double)engine_kv_pos_bytes(&g->m->info.config, g->eng.kv_type) * (double)g->ctx / 1e9,
            dj_kv_name(g->eng.kv_type), g->ctx);
    if (interrupted_during("the engine's setup")) return 1;
    uint64_t seed = o->seed_given ? o->seed : fresh_seed();
    // a resumed run samples as the session did, unless this run's sampling options say otherwise
    g->smp_set = o->load_session && sampling_is_default(&o->smp) ? &g->ses.smp : &o->smp;
    if (!(g->smp = sampler_new_with(g->vocab, g->smp_set, seed, e))) return -1;
    if (o->draft_path && !(g->rs.spec = g->sp = spec_new(&g->eng, &g->draft.eng, g->vocab, g->smp, &o->smp,
                                                         seed ^ 0xD1B54A32D192ED03ull, g->tok, g->ctx, &o->spec, e)))
        return -1;
    // the penalties' window starts in the prompt
    for (size_t i = 0; i < g->n_prompt; i++) sampler_accept(g->smp, g->ids[i]);
    if (o->load_session && !o->seed_given) sampler_set_rng_state(g->smp, g->ses.rng);  // -s reseeds
    else if (!o->seed_given && !sampler_is_greedy(g->smp))
        fprintf(stderr, "djinn: seed %" PRIu64 " (-s to repeat)\n", seed);
    if (!(g->stream = tok_stream_new(g->tok))) return dj_fail(e, "out of memory");
    return 0;
}

// Prefill: every row when --logits wants them (the host samples), otherwise the first token picked where the logits
// are (engine_next); then the prompt's text (stdout is decode(all ids), so the prompt goes through the same stream:
// on a terminal, where stdout and stderr share the screen, no statistics line lands inside it until it ends).
static int gen_prefill(gen_run *g, dj_err *e) {
    int64_t np = (int64_t)g->n_prompt;
    g->t_start = dj_now();
    test_sigint_before("prefill");
    if (g->o->load_session) {  // the session's KV cache, then the token after its text
        if (session_resume(&g->ses, &g->eng, 0, g->smp, g->logits, &g->cand, e)) return -1;
    } else {
        cuttable_phase(1);  // Ctrl-C cuts the prompt's passes short (the run then ends: its cache is not kept)
        int rc = g->want_rows ? g->eng.forward(g->eng.ctx, 0, g->ids, np, 0, g->logits, 1, e)
                 : g->sp      ? spec_prefill(g->sp, g->ids, np, &g->cand, e)
                              : engine_next(&g->eng, g->smp, 0, g->ids, np, 0, g->logits, &g->cand, e);
        cuttable_phase(0);
        if (rc && interrupted) {
            fprintf(stderr, "djinn: interrupted during the prompt's prefill (%zu tokens): nothing generated or "
                            "written\n", g->n_prompt);
            return g->cut = 1, g->stop = GEN_INTERRUPTED, 0;
        }
        if (rc || (g->want_rows && write_rows(g->out, g->logits, np, g->vocab, e))) return -1;
        if (g->want_rows) g->cand = sampler_next(g->smp, g->logits + (g->n_prompt - 1) * (size_t)g->vocab);
    }
    double t_prefill = dj_now() - g->t_start;
    g->rs.prompt_tokens = np, g->rs.prefill_s = t_prefill;
    fprintf(stderr, "djinn: prompt %zu tokens, prefill %.1f tokens/s (%.3f s)\n", g->n_prompt,
            (double)g->n_prompt / fmax(t_prefill, 1e-9), t_prefill);
    size_t len;
    for (size_t i = 0; i < g->n_prompt; i++) {
        const char *s = tok_stream_push(g->stream, g->ids[i], &len);
        if (emit(s, len, e)) return -1;
    }
    return 0;
}

// Decode: take the pick, feed the token back (the pass picks the next). The last token is fed only when its logits
// row is wanted (--logits), so the file has one row per token of the output.
static int gen_decode(gen_run *g, dj_err *e) {
    const dj_opts *o = g->o;
    const int64_t sigint_after = test_sigint_token();
    size_t len;
    g->n = (int64_t)g->n_prompt;
    while (g->n_gen < o->n_new) {  // a Ctrl-C during prefill stops it before the first token is sampled
        if (g->n_gen == sigint_after) raise(SIGINT);
        if (interrupted) return g->stop = GEN_INTERRUPTED, 0;
        if (g->n >= g->ctx) return g->stop = GEN_CONTEXT_FULL, 0;
        int32_t next = g->cand;
        if (next < 0)
            return dj_fail(e, "the logits at position %" PRId64 " hold NaN or infinity: the model's weights or its "
                              "arithmetic overflowed", g->n - 1);
        if (g->n_gen == 0) g->t_first = g->t_decode0 = dj_now();
        sampler_accept(g->smp, next);
        g->ids[g->n++] = next;
        g->n_gen++;
        const int end = tok_is_eos(g->tok, next), eos = end && !o->ignore_eos;
        const char *s = "";  // an end token passed over (--ignore-eos) adds no text
        len = 0;
        if (!(end && o->ignore_eos)) s = tok_stream_push(g->stream, next, &len);
        if (o->n_stops ? (g->hit = held_feed(&g->held, s, len, o->stops, o->n_stops, emit_to_stdout, NULL, e)) == -2
                       : emit(s, len, e))
            return -1;
        int more = g->n_gen < o->n_new && !eos && g->hit < 0;
        if (g->want_rows) {  // position n-1 < ctx: always fits
            if (g->eng.forward(g->eng.ctx, 0, &next, 1, g->n - 1, g->logits, 0, e) ||
                write_rows(g->out, g->logits, 1, g->vocab, e))
                return -1;
            if (more) g->cand = sampler_next(g->smp, g->logits);
        } else if (more && (g->sp ? spec_next(g->sp, g->ids, g->n, o->n_new - g->n_gen, &g->cand, e)  // verified run's
                                  : engine_next(&g->eng, g->smp, 0, &next, 1, g->n - 1, g->logits, &g->cand, e))) {
            return -1;
        }
        if (g->hit >= 0) return g->stop = GEN_STOP_STRING, 0;
        if (eos) return g->stop = GEN_EOS, 0;
    }
    return 0;
}

// The text still held (the stream's tail; with --stop, up to the stop string found), then the final newline.
static int gen_flush_text(gen_run *g, dj_err *e) {
    const dj_opts *o = g->o;
    size_t len;
    const char *tail = tok_stream_flush(g->stream, &len);
    if (o->n_stops) {  // the held text: up to the stop string found, or all of it
        if (g->hit < 0 &&
            (g->hit = held_feed(&g->held, tail, len, o->stops, o->n_stops, emit_to_stdout, NULL, e)) == -2)
            return -1;
        if (g->hit >= 0) g->stop = GEN_STOP_STRING;
        if (emit(g->held.buf, g->held.len, e)) return -1;
    } else if (emit(tail, len, e)) {
        return -1;
    }
    return emit("\n", 1, e);
}

// The run's figures on stderr: why it stopped, time to first token and decode rate, speculation, streaming.
static void gen_report(gen_run *g) {
    const dj_opts *o = g->o;
    int64_t n_gen = g->n_gen;
    switch (g->stop) {
    case GEN_STOP_STRING:
        fprintf(stderr, "djinn: stopped at --stop '%s' after %" PRId64 " new tokens\n", o->stops[g->hit], n_gen);
        break;
    case GEN_CONTEXT_FULL:
        if (o->n_new == INT64_MAX)  // -n -1: the context's end is where it was to stop
            fprintf(stderr, "djinn: stopped after %" PRId64 " new tokens: the context of %" PRId64 " tokens is full "
                            "(-c)\n", n_gen, g->ctx);
        else
            fprintf(stderr, "djinn: stopped after %" PRId64 " of %" PRId64 " new tokens: the context of %" PRId64
                            " tokens is full (-c)\n", n_gen, o->n_new, g->ctx);
        break;
    case GEN_INTERRUPTED: fprintf(stderr, "djinn: interrupted after %" PRId64 " new tokens\n", n_gen); break;
    case GEN_EOS:
        fprintf(stderr, "djinn: stopped at the end-of-sequence token after %" PRId64 " new tokens\n", n_gen);
        break;
    case GEN_RAN: break;
    }
    if (n_gen > 0) {
        double t_end = dj_now(), t_dec = t_end - g->t_decode0;
        fprintf(stderr, "djinn: time to first token %.1f ms\n", (g->t_first - g->t_start) * 1e3);
        g->rs.ttft_ms = (g->t_first - g->t_start) * 1e3, g->rs.decode_s = t_dec, g->rs.decode_tokens = n_gen - 1;
        if (n_gen > 1)
            fprintf(stderr, "djinn: decode %" PRId64 " tokens, %.1f tokens/s, %.2f ms/token\n", n_gen - 1,
                    (double)(n_gen - 1) / fmax(t_dec, 1e-9), t_dec * 1e3 / (double)(n_gen - 1));
    }
    if (g->sp) {
        dj_spec_stats ss;
        spec_stats(g->sp, &ss);
        fprintf(stderr, "djinn: speculative: %" PRId64 " passes of the target, %.2f tokens a pass; %" PRId64 " of %"
                        PRId64 " drafted tokens accepted (%.1f%%); draft %.1f ms (%.2f ms a step), target %.1f ms "
                        "(%.2f ms a pass)\n", ss.passes, ss.passes ? (double)ss.produced / (double)ss.passes : 0.0,
                ss.accepted, ss.drafted, ss.drafted ? 100.0 * (double)ss.accepted / (double)ss.drafted : 0.0,
                ss.draft_s * 1e3, ss.draft_steps ? ss.draft_s * 1e3 / (double)ss.draft_steps : 0.0, ss.target_s * 1e3,
                ss.passes ? ss.target_s * 1e3 / (double)ss.passes : 0.0);
    }
    dj_gpu_stats gs;
    if (engine_gpu_stats(&g->eng, &gs)) {
        if (gs.n_streamed)
            fprintf(stderr, "djinn: streamed %d units, %.3f GB per pass over PCIe at %.2f GB/s achieved; compute "
                            "waited %.2f ms per pass for copies (%" PRId64 " passes)\n", gs.n_streamed,
                    (double)gs.bytes_per_token / 1e9, gs.copy_ms > 0 ? (double)gs.copied_bytes / 1e6 / gs.copy_ms : 0.0,
                    gs.passes ? gs.wait_ms / (double)gs.passes : 0.0, gs.passes);
        if (gs.cpu_share > 0)
            fprintf(stderr, "djinn: CPU share %.2f: %.3f GB per decode token read by the CPU from host memory\n",
                    gs.cpu_share, (double)gs.cpu_bytes_per_token / 1e9);
    }
}

// The output files: --stats-json, --save-session, --logits.
static int gen_write_outputs(gen_run *g, int last_ran, dj_err *e) {
    const dj_opts *o = g->o;
    dj_outputs *out = g->out;
    int64_t n = g->n;
    if (out->stats.tmp && write_stats(&out->stats, g->m, &g->eng, o, &g->rs, e)) return -1;
    if (out->session.tmp) {
        dj_session save = {.ids = g->ids, .n_tokens = n,
                           .n_prompt = o->load_session ? g->ses.n_prompt : (int64_t)g->n_prompt,
                           .n_kv = last_ran || g->want_rows ? n : n - 1, .next = last_ran ? g->cand : -1,
                           .rng = sampler_rng_state(g->smp), .smp = *g->smp_set, .ctx = g->ctx};
        if (session_save(&out->session, g->m, &g->eng, 0, &save, e)) return -1;
    }
    return g->want_rows && out_commit(&out->logits, 0, e) ? -1 : 0;
}

static void gen_close(gen_run *g) {
    held_free(&g->held);
    if (g->stream) tok_stream_free(g->stream);
    session_close(&g->ses);
    spec_free(g->sp);
    engine_close(&g->eng);
    close_draft(&g->draft);
    sampler_free(g->smp);
    free(g->logits);
    free(g->ids);
}

static int run_generate(const dj_model *m, const dj_tokenizer *tok, const dj_opts *o, dj_outputs *out, double load_s,
                        dj_err *e) {
    gen_run g = {.m = m, .tok = tok, .o = o, .out = out, .vocab = m->info.config.vocab_size, .hit = -1,
                 .want_rows = out->logits.tmp != NULL, .rs = {.load_s = load_s}};
    if (tok_encode(tok, o->prompt, o->prompt_len, 1, &g.ids, &g.n_prompt, e)) return EXIT_ERR;
    // A prompt that starts with the BOS token's own text (a hand-written chat prompt) would begin with two: the one
    // the model's post-processor adds is dropped, with a warning (HF would keep both; llama.cpp keeps both and warns).
    int32_t bos = tok_bos(tok);
    if (bos >= 0 && g.n_prompt >= 2 && g.ids[0] == bos && g.ids[1] == bos) {
        memmove(g.ids, g.ids + 1, (g.n_prompt - 1) * sizeof *g.ids);
        g.n_prompt--;
        fprintf(stderr, "djinn: warning: the prompt starts with the BOS token's text: not adding a second BOS\n");
    }
    if (o->tokenize) {
        for (size_t i = 0; i < g.n_prompt; i++) printf("%s%d", i ? " " : "", g.ids[i]);
        printf("\n");
        free(g.ids);
        return stdout_flush(e) ? EXIT_ERR : 0;
    }
    g.ctx = o->ctx;
    int rc = gen_open(&g, e);
    if (rc) {
        gen_close(&g);
        return rc > 0 ? EXIT_INTERRUPTED : EXIT_ERR;
    }
    rc = EXIT_ERR;
    if (gen_prefill(&g, e)) goto out;
    if (g.cut) {  // Ctrl-C cut the prefill short: no text, no statistics of a prefill, no output file
        rc = EXIT_INTERRUPTED;
        goto out;
    }
    if (gen_decode(&g, e)) goto out;
    // --save-session: the last token's pass ran (and picked the next) when none was generated or the loop stopped
    // before sampling again; otherwise the last token is not fed yet (with --logits: fed, nothing picked)
    const int last_ran = g.n_gen == 0 || g.stop == GEN_INTERRUPTED || g.stop == GEN_CONTEXT_FULL;
    if (!g.stop && interrupted) g.stop = GEN_INTERRUPTED;  // during the prefill of -n 0, or the last token's pass
    if (gen_flush_text(&g, e)) goto out;
    gen_report(&g);
    if (gen_write_outputs(&g, last_ran, e)) goto out;
    rc = interrupted ? EXIT_INTERRUPTED : 0;
out:
    gen_close(&g);
    return rc;
}

// ---- --chat
// Each line on stdin is a user turn: its ids (chat.h) are prefilled after what the KV cache already holds, and the
// answer is sampled until the model's end token, -n tokens or Ctrl-C, which stops the answer and not the
// conversation. The end of input ends it. On a terminal a "> " prompt goes to stderr; stdout carries the answers,
// each ended by a newline.
#define CHAT_LINE_MAX ((size_t)1 << 20)
// A conversation (run_chat): the engine, the sampler, and where the context stands.
typedef struct {
    const dj_tokenizer *tok;
    const dj_opts *o;
    dj_engine eng;
    dj_sampler *smp;
    float *logits;                      // (vocab)
    int64_t ctx, pos, turns, answered;  // answered: tokens of every answer so far
    int32_t end_tok;  // the previous answer's end token, fed with the next turn (-1: it was cut short)
} chat_run;

// The next turn's line from stdin into *line (*len bytes): 1, or 0 at the end of input (the conversation is over),
// -1 on an error.
static int chat_read_line(int tty, char **line, size_t *cap, size_t *len, dj_err *e) {
    if (tty) fputs("> ", stderr);
    errno = 0;
    ssize_t got = getline(line, cap, stdin);
    if (got < 0) {
        if (ferror(stdin) && errno != EINTR) return dj_fail(e, "cannot read stdin: %s", strerror(errno));
        if (tty) fputc('\n', stderr);
        return 0;
    }
    if (interrupted) {  // Ctrl-C at the prompt: nothing to stop
        interrupted = 0;
        signal(SIGINT, on_sigint);
    }
    if ((size_t)got > CHAT_LINE_MAX)
        return dj_fail(e, "--chat: a turn of %zd bytes, over the %zu MB a line may hold", got, CHAT_LINE_MAX >> 20);
    if (memchr(*line, 0, (size_t)got)) return dj_fail(e, "--chat: a turn holds a NUL byte");
    *len = (size_t)got;
    return 1;
}

// The answer whose first token is `next`, streamed to stdout until its end token, -n tokens, the context's end or
// Ctrl-C, then a newline. -1 on an error.
static int chat_answer(chat_run *g, int32_t next, dj_err *e) {
    dj_tok_stream *stream = tok_stream_new(g->tok);
    if (!stream) return dj_fail(e, "out of memory");
    int64_t gen = 0;
    size_t len;
    int rc = 0;
    const int64_t sigint_after = test_sigint_token();
    g->end_tok = -1;
    while (gen < g->o->n_new && g->pos < g->ctx) {
        if (gen == sigint_after && g->turns == 1) raise(SIGINT);  // tests: Ctrl-C in the first answer
        if (interrupted) break;
        if (next < 0) {
            rc = dj_fail(e, "the logits at position %" PRId64 " hold NaN or infinity", g->pos - 1);
            break;
        }
        sampler_accept(g->smp, next);
        gen++;
        if (tok_is_eos(g->tok, next)) {
            g->end_tok = next;
            break;
        }
        const char *piece = tok_stream_push(stream, next, &len);
        if ((rc = emit(piece, len, e) || engine_next(&g->eng, g->smp, 0, &next, 1, g->pos, g->logits, &next, e)))
            break;
        g->pos++;
    }
    if (!rc) {
        const char *tail = tok_stream_flush(stream, &len);  // the stream's own memory: written before it is freed
        rc = emit(tail, len, e) || emit("\n", 1, e);
    }
    tok_stream_free(stream);
    g->answered += gen;
    return rc ? -1 : 0;
}

static void chat_context_full(const chat_run *g) {
    fprintf(stderr, "djinn: the conversation fills the context of %" PRId64 " tokens (-c): it ends here\n", g->ctx);
}

static int run_chat(const dj_model *m, const dj_tokenizer *tok, const dj_opts *o, dj_err *e) {
    const dj_config *c = &m->info.config;
    int64_t vocab = c->vocab_size;
    chat_kind kind;
    if (chat_choose(o->chat_template, tok_chat_template(tok), &kind, e)) return EXIT_ERR;
    if (kind == CHAT_NONE)
        return dj_fail(e, "--chat: %s has no chat template (tokenizer_config.json's chat_template): give one with "
                          "--chat-template llama2|llama3|FILE, or the prompt with -p", o->model_path), EXIT_ERR;
    if (kind == CHAT_UNKNOWN)
        return dj_fail(e, "--chat: the model's chat template is neither Llama 2's ([INST], <<SYS>>) nor Llama 3's "
                          "(<|start_header_id|>): write the prompt out with -p"), EXIT_ERR;
    int rc = EXIT_ERR, tty = isatty(STDIN_FILENO);
    chat_run g = {.tok = tok, .o = o, .ctx = o->ctx, .end_tok = -1};
    char *line = NULL;
    size_t cap = 0, got;
    int32_t *turn = NULL;
    if (!(g.logits = malloc((size_t)vocab * sizeof(float)))) {
        dj_fail(e, "out of memory");
        goto out;
    }
    if (phase_stopped(open_engine(&g.eng, m, o, g.ctx, 16, e), "the engine's setup", &rc)) goto out;
    uint64_t seed = o->seed_given ? o->seed : fresh_seed();
    if (!(g.smp = sampler_new_with(vocab, &o->smp, seed, e))) goto out;
    fprintf(stderr, "djinn: chat, %s template, context %" PRId64 " tokens%s", chat_kind_name(kind), g.ctx,
            sampler_is_greedy(g.smp) ? "\n" : "");
    if (!sampler_is_greedy(g.smp)) fprintf(stderr, ", seed %" PRIu64 " (-s to repeat)\n", seed);
    for (int more; (more = chat_read_line(tty, &line, &cap, &got, e));) {
        if (more < 0) goto out;
        if (!line[strspn(line, " \t\r\n")]) continue;  // an empty line: no turn
        // the turn in the template's words, then the answer's first token
        size_t nt = 0;
        free(turn), turn = NULL;
        if (chat_turn_ids(tok, kind, o->system, line, g.turns == 0, g.end_tok, &turn, &nt, e)) goto out;
        if (g.pos + (int64_t)nt >= g.ctx) {
            if (!g.turns) {  // not a conversation that filled the context: one that can never start
                dj_fail(e, "--chat: the first turn is %zu tokens in the template (with --system), the context of %"
                           PRId64 " tokens (-c) leaves no room to answer it", nt, g.ctx);
                goto out;
            }
            chat_context_full(&g);
            break;
        }
        for (size_t i = 0; i < nt; i++) sampler_accept(g.smp, turn[i]);
        int32_t next;
        if (engine_next(&g.eng, g.smp, 0, turn, (int64_t)nt, g.pos, g.logits, &next, e)) goto out;
        g.pos += (int64_t)nt, g.turns++;
        if (chat_answer(&g, next, e)) goto out;
        if (interrupted) {  // Ctrl-C stops this answer only
            fprintf(stderr, "djinn: answer stopped (Ctrl-C); Ctrl-D ends the conversation\n");
            interrupted = 0;
            signal(SIGINT, on_sigint);
        }
        if (g.pos >= g.ctx) {
            chat_context_full(&g);
            break;
        }
    }
    fprintf(stderr, "djinn: chat: %" PRId64 " turns, %" PRId64 " tokens answered, %" PRId64 " of %" PRId64
                    " context tokens used\n", g.turns, g.answered, g.pos, g.ctx);
    rc = 0;
out:
    engine_close(&g.eng);
    sampler_free(g.smp);
    free(g.logits), free(line), free(turn);
    return rc;
}

// ---- --dump-act, --steer, --save-session
// The probe of --dump-act and --steer for the loaded model: the layers checked against it (a usage error), the dump's
// file handed over, the vectors read.
static int make_probe(const dj_model *m, dj_opts *o, dj_outputs *out, dj_err *e) {
    const dj_config *c = &m->info.config;
    uint32_t layer;
    double scale;
    char *file;
    if (o->dump_layers && probe_parse_layers(o->dump_layers, c->n_layers, NULL, e))
        return usage_error("--dump-act: %s", e->msg);
    for (int k = 0; k < o->n_steers; k++) {
        if (probe_parse_steer(o->steers[k], c->n_layers, &layer, &file, &scale, e))
            return usage_error("--steer: %s", e->msg);
        free(file);
    }
    if (!(o->probe = probe_new(c, e))) return EXIT_ERR;
    if (o->dump_path && probe_open_dump(o->probe, o->dump_layers, &out->dump, e)) return EXIT_ERR;
    for (int k = 0; k < o->n_steers; k++)
        if (probe_add_steer(o->probe, o->steers[k], e)) return EXIT_ERR;
    return 0;
}

// ---- main
// The files this run writes, checked and created before the long work: none of them a file of the run's (an input:
// the model, a reference, a text, a prompt, a session loaded, a draft, a steering vector; or another output)
// (fileio.h). stdout appended to an input (djinn m.bin >> m.bin) is refused too.
static int open_outputs(const dj_opts *o, dj_outputs *out, dj_err *e) {
    enum { LOGITS = 6, STATS, TRACE, DUMP, SESSION, N_FIXED };
    const char *f[N_FIXED + MAX_STEERS] = {o->model_path,  o->check_path, o->ppl_path,   o->prompt_file,
                                           o->load_session, o->draft_path, o->logits_path, o->stats_path,
                                           o->trace_path,  o->dump_path,  o->save_session};
    int n = N_FIXED, rc = 0;
    for (int k = 0; k < o->n_steers; k++) {
        uint32_t layer;
        double scale;
        char *file;
        if (probe_parse_steer(o->steers[k], 0, &layer, &file, &scale, e)) {  // checked already: does not fail
            rc = -1;
            goto done;
        }
        f[n++] = file;
    }
    struct stat so, si;
    if (fstat(STDOUT_FILENO, &so) == 0 && S_ISREG(so.st_mode))
        for (int i = 0; i < n && !rc; i++)
            if (i < LOGITS || i >= N_FIXED)  // the inputs
                if (f[i] && strcmp(f[i], "-") && stat(f[i], &si) == 0 && si.st_dev == so.st_dev &&
                    si.st_ino == so.st_ino)
                    rc = dj_fail(e, "stdout is %s, an input of this run: the text would be written into it", f[i]);
    // each output against every other file of the run: itself left out of the list while it is checked
    static const char *const names[] = {"--logits", "--stats-json", "--trace", "--dump-act", "--save-session"};
    dj_out *outs[] = {&out->logits, &out->stats, NULL, &out->dump, &out->session};  // the trace: the engine's
    for (int k = LOGITS; k < N_FIXED && !rc; k++) {
        const char *self = f[k];
        if (!self) continue;
        f[k] = NULL;
        rc = outs[k - LOGITS] ? out_open(outs[k - LOGITS], self, names[k - LOGITS], f, n, e)
                              : out_check(self, names[k - LOGITS], f, n, e);
        f[k] = self;
    }
done:
    for (int k = N_FIXED; k < n; k++) free((char *)f[k]);
    return rc;
}

int main(int argc, char **argv) {
    if (argc > 1 && !strcmp(argv[1], "serve")) return serve_main(argc - 1, argv + 1);
    dj_opts o;
    int prc = parse_args(argc, argv, &o);
    if (prc == -1 || prc == -2) {  // --help, --version: a failed write is said, as every other stdout's
        if (prc == -1) usage(stdout);
        else
            printf("djinn %s (model.bin version %u, as ./convert/convert writes it; versions %u to %u read but version "
                   "2's q8 and q4; weights f32, f16, bf16, q8, q4)\n", DJINN_VERSION, DJ_VERSION, DJ_VERSION_MIN,
                   DJ_VERSION);
        dj_err we;
        if (!stdout_flush(&we)) return 0;
        fprintf(stderr, "djinn: %s\n", we.msg);
        return EXIT_ERR;
    }
    if (prc) return prc;
    if (o.threads) cpu_set_threads((int)o.threads);

    signal(SIGINT, on_sigint);
    out_kill_arm();  // a killed run leaves no half-written output (fileio.h)
    signal(SIGPIPE, SIG_IGN);  // a reader gone (djinn ... | head): a failed write, said, and the outputs removed
    dj_err e = {{0}};
    dj_model m = {0};
    dj_outputs out = {{.fd = -1}, {.fd = -1}, {.fd = -1}, {.fd = -1}};
    dj_tokenizer *tok = NULL;
    int rc = EXIT_ERR;
    char *prompt_text = NULL;
    if (open_outputs(&o, &out, &e)) goto done;
    if (o.prompt_file) {  // before the model's load: a missing file costs nothing
        if (read_prompt(o.prompt_file, &prompt_text, &o.prompt_len, &e)) goto done;
        o.prompt = prompt_text;
    }
    if (access(o.model_path, R_OK)) {  // a missing model is said before any GPU is looked for
        dj_fail(&e, "cannot open model %s: %s", o.model_path, strerror(errno));
        goto done;
    }
    int use_gpu = !o.force_cpu && !o.tokenize && gpu_count() > 0;
    if (o.trace_path && !use_gpu) {
        dj_fail(&e, "--trace records the GPU engine's decode steps: " GPU_ABSENT);
        goto done;
    }
    const int nt = cpu_threads_planned();
    if (o.force_cpu) fprintf(stderr, "djinn: running on the CPU (--cpu), %d thread%s\n", nt, nt == 1 ? "" : "s");
    else if (!o.tokenize && !use_gpu)
        fprintf(stderr, "djinn: warning: " GPU_ABSENT ": running on the CPU, %d thread%s\n", nt, nt == 1 ? "" : "s");
    if (!use_gpu && (o.gpu.stream_all || o.gpu.sync_copy || o.gpu.ring_gb > 0 || o.gpu.no_graph || o.gpu.fma_attn ||
                     o.gpu.cpu_share_given || o.gpu.n_gpus))
        fprintf(stderr, "djinn: warning: --ring-gb, --stream-all, --sync-copy, --no-graph, --fma-attn, --gpus and "
                        "--cpu-share apply to the GPU engine only\n");
    // the load's progress on a terminal only: a log gets the one line below
    dj_load_opts lo = {.want_pinned = use_gpu, .no_pin = o.no_pin, .quiet = !isatty(STDERR_FILENO)};
    double t0 = dj_now();
    test_sigint_before("load");
    if (model_load(o.model_path, &lo, &m, &e)) {
        rc = interrupted_during("loading") ? EXIT_INTERRUPTED : EXIT_ERR;
        goto done;
    }
    o.loaded = &m;
    double dt = dj_now() - t0;
    const dj_config *c = &m.info.config;
    fprintf(stderr,
            "djinn: loaded %s: %.3f GB in %.3f s (%.2f GB/s); dim %u, %u layers, %u/%u heads, head_dim %u, "
            "vocab %u, %s weights\n",
            o.model_path, (double)m.data_size / 1e9, dt, (double)m.data_size / 1e9 / fmax(dt, 1e-9), c->dim,
            c->n_layers, c->n_heads, c->n_kv_heads, c->head_dim, c->vocab_size, dj_dtype_name(c->wtype));
    if (interrupted_during("loading")) {
        rc = EXIT_INTERRUPTED;
        goto done;
    }
    if (o.ctx > (int64_t)c->max_seq_len) {
        fprintf(stderr, "djinn: -c %" PRId64 " is beyond the model's max_seq_len of %u (see djinn --help)\n", o.ctx,
                c->max_seq_len);
        rc = EXIT_USAGE;
        goto done;
    }
    if (!o.ctx && !o.check_path && !o.tokenize) o.ctx = default_context(&m, o.kv_type, m.for_gpu);
    if ((o.dump_path || o.n_steers) && (rc = make_probe(&m, &o, &out, &e))) goto done;
    rc = EXIT_ERR;
    if (o.check_path) {
        rc = run_check(&m, &o, &e);
    } else {
        if (!(tok = tok_load(m.data + m.info.tok_off, (size_t)m.info.tok_size, &e))) goto done;
        if (tok_vocab_size(tok) > (int32_t)c->vocab_size) {
            dj_fail(&e, "%s: the tokenizer has %d tokens but the model's vocabulary is %u: a damaged file, re-run "
                       "./convert/convert", o.model_path, tok_vocab_size(tok), c->vocab_size);
            goto done;
        }
        rc = o.ppl_path ? run_perplexity(&m, tok, &o, &e)
             : o.chat   ? run_chat(&m, tok, &o, &e)
                        : run_generate(&m, tok, &o, &out, dt, &e);
    }
    if (o.probe && (rc == 0 || rc == EXIT_INTERRUPTED) && probe_finish(o.probe, &e)) rc = EXIT_ERR;  // the dump
done:
    if (rc && rc != EXIT_CHECK && rc != EXIT_INTERRUPTED && rc != EXIT_USAGE) fprintf(stderr, "djinn: %s\n", e.msg);
    out_abort(&out.logits), out_abort(&out.stats);  // what was not completed
    out_abort(&out.dump), out_abort(&out.session), probe_free(o.probe);
    tok_free(tok);
    model_free(&m);
    free(prompt_text);
    cpu_pool_stop();
    return rc;
}
