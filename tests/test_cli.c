// test_cli.c: the real ./djinn and ./convert binaries (from $DJINN_BIN) run as subprocesses on the tiny real
// model from $DJINN_DATA and the fixtures in $DJINN_TESTS (this folder): greedy text byte for byte, sampling
// determinism, exit codes and messages for bad input, the --logits file, and --check against a reference
// (built here, and the committed ones in tests/ref).
#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <poll.h>
#include <pty.h>
#include <signal.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../gpu_host.h"
#include "../json.h"
#include "../kvtype.h"
#include "../model.h"
#include "../util.h"
#include "common.h"

typedef struct {
    char bin[1024], data[1024];
    char tests[1024];     // $DJINN_TESTS: this folder, with fixtures/ and ref/ ("" when not set)
    char dir[256];        // temp folder, removed at the end
    char model[512];      // stories260K converted with --dtype f32
    char out[512], err[512];
} tcli_ctx;

#define TCLI_VOCAB 512  // stories260K's, and the fixtures' (converted with its tokenizer)

// ---- helpers
// Runs argv (argv[0] is a path) with stdout to `out` (NULL: the context's file; opened with `append`) and stderr
// to the context's file; returns the exit status. A run that hangs is killed after a minute (SIGALRM).
// stdin: /dev/null, or the file tcli_stdin names while it is set.
static const char *tcli_stdin;
static int tcli_run_to(tcli_ctx *c, char *const argv[], const char *out, int append) {
    return tc_run(argv, tcli_stdin ? tcli_stdin : "/dev/null", out ? out : c->out, append, c->err, 60);
}

static int tcli_run(tcli_ctx *c, char *const argv[]) { return tcli_run_to(c, argv, NULL, 0); }

static char *tcli_stdout(tcli_ctx *c, size_t *len) { return tc_read(c->out, len); }
static char *tcli_stderr(tcli_ctx *c) { return tc_read(c->err, NULL); }

// A run that must fail with `code`, print nothing on stdout and name `in_stderr` on stderr.
static void tcli_expect_fail(tcli_ctx *c, char *const argv[], int code, const char *in_stderr) {
    int rc = tcli_run(c, argv);
    size_t n;
    char *out = tcli_stdout(c, &n), *err = tcli_stderr(c);
    cr_assert_eq(rc, code, "%s %s: exit %d, expected %d; stderr: %s", argv[1], argv[2] ? argv[2] : "", rc, code, err);
    cr_assert_eq(n, 0, "stdout must stay empty on error: %s", out);
    cr_assert(strstr(err, in_stderr), "stderr lacks '%s': %s", in_stderr, err);
    free(out), free(err);
}

static char tcli_djinn_path[1100], tcli_convert_path[1100];

// Finds the binaries and data (skipping with the reason when the environment lacks them) and converts
// stories260K into a fresh temp folder.
static void tcli_setup(tcli_ctx *c) {
    memset(c, 0, sizeof *c);
    const char *bin = getenv("DJINN_BIN"), *data = getenv("DJINN_DATA");
    if (!bin || !*bin) cr_skip_test("DJINN_BIN is not set (run through `make test`): the CLI tests need the binaries");
    if (!data || !*data) cr_skip_test("DJINN_DATA is not set (run through `make test`): no stories260K model");
    snprintf(c->bin, sizeof c->bin, "%s", bin);
    snprintf(c->data, sizeof c->data, "%s", data);
    const char *tests = getenv("DJINN_TESTS");
    snprintf(c->tests, sizeof c->tests, "%s", tests ? tests : "");
    char probe[1200];
    snprintf(probe, sizeof probe, "%s/models/stories260K/model.safetensors", data);
    if (access(probe, R_OK)) cr_skip_test("%s is missing: no stories260K model to run", probe);
    snprintf(tcli_djinn_path, sizeof tcli_djinn_path, "%s/djinn", bin);
    snprintf(tcli_convert_path, sizeof tcli_convert_path, "%s/convert", bin);
    cr_assert(!access(tcli_djinn_path, X_OK), "%s is not built", tcli_djinn_path);
    cr_assert(!access(tcli_convert_path, X_OK), "%s is not built", tcli_convert_path);
    snprintf(c->dir, sizeof c->dir, "/tmp/djinn_cli_XXXXXX");
    cr_assert(mkdtemp(c->dir), "mkdtemp failed");
    snprintf(c->model, sizeof c->model, "%s/stories.bin", c->dir);
    snprintf(c->out, sizeof c->out, "%s/stdout", c->dir);
    snprintf(c->err, sizeof c->err, "%s/stderr", c->dir);
    char src[1200];
    snprintf(src, sizeof src, "%s/models/stories260K", data);
    char *argv[] = {tcli_convert_path, src, c->model, "--dtype", "f32", "-q", NULL};
    int rc = tcli_run(c, argv);
    cr_assert_eq(rc, 0, "convert failed: %s", tcli_stderr(c));
}

static void tcli_teardown(tcli_ctx *c) {
    if (c->dir[0]) tc_rm_rf(c->dir);
}

// Skips when $DJINN_TESTS does not say where tests/ (fixtures/, ref/) is.
static void tcli_need_tests(tcli_ctx *c) {
    if (c->tests[0]) return;
    tcli_teardown(c);
    cr_skip_test("DJINN_TESTS is not set (run through `make test`): no tests/fixtures or tests/ref");
}

// Converts the random-weight checkpoint tests/fixtures/NAME (with stories260K's tokenizer) to DIR/NAME.bin
// and puts that path in model.
static void tcli_convert_fixture(tcli_ctx *c, const char *name, char *model, size_t size) {
    tcli_need_tests(c);
    char src[1300], tok[1300];
    snprintf(src, sizeof src, "%s/fixtures/%s", c->tests, name);
    snprintf(tok, sizeof tok, "%s/models/stories260K", c->data);
    snprintf(model, size, "%s/%s.bin", c->dir, name);
    int rc = tcli_run(c, (char *[]){tcli_convert_path, src, model, "--tokenizer", tok, "-q", NULL});
    cr_assert_eq(rc, 0, "converting %s failed: %s", src, tcli_stderr(c));
}

// reference_greedy.json: greedy_text and greedy_ids (prompt ids included).
typedef struct {
    char *text;  // decode(ids) with special tokens kept: starts "<s> "
    int32_t ids[1024];
    size_t n_ids;
} tcli_greedy;

static void tcli_load_greedy(tcli_ctx *c, tcli_greedy *g) {
    char path[1200];
    snprintf(path, sizeof path, "%s/models/stories260K/reference_greedy.json", c->data);
    size_t n;
    char *txt = tc_read(path, &n);
    if (!txt) cr_skip_test("%s is missing", path);
    dj_err e;
    json_doc *d = json_parse(txt, n, &e);
    cr_assert(d, "%s: %s", path, e.msg);
    const json_value *r = json_root(d), *ids = json_get(r, "greedy_ids");
    const char *t = json_str(json_get(r, "greedy_text"));
    cr_assert(t && ids && ids->type == JSON_ARRAY && ids->u.arr.n <= 1024, "%s: unexpected layout", path);
    g->text = strdup(t);
    g->n_ids = ids->u.arr.n;
    for (size_t i = 0; i < g->n_ids; i++) {
        int64_t v;
        cr_assert_eq(json_int(&ids->u.arr.items[i], &v), 0);
        g->ids[i] = (int32_t)v;
    }
    json_free(d);
    free(txt);
}

// What djinn must print: HF decode(ids, skip_special_tokens=True) + "\n". greedy_text was decoded with the
// special tokens kept ("<s> Once upon..."); skipping BOS also lets the decoder's Strip take the space after it.
static char *tcli_expected_text(const tcli_greedy *g) {
    cr_assert(!strncmp(g->text, "<s> ", 4), "greedy_text does not start with '<s> ': %.20s", g->text);
    size_t n = strlen(g->text + 4);
    char *s = malloc(n + 2);
    memcpy(s, g->text + 4, n);
    s[n] = '\n', s[n + 1] = 0;
    return s;
}

// ---- generation
Test(cli, greedy_text_byte_exact) {
    tcli_ctx c;
    tcli_setup(&c);
    tcli_greedy g;
    tcli_load_greedy(&c, &g);
    char *argv[] = {tcli_djinn_path, c.model, "-p", "Once upon a time", "-n", "200", "-t", "0", "--cpu", NULL};
    int rc = tcli_run(&c, argv);
    char *err = tcli_stderr(&c);
    cr_assert_eq(rc, 0, "djinn failed: %s", err);
    size_t n;
    char *out = tcli_stdout(&c, &n), *want = tcli_expected_text(&g);
    cr_assert_eq(n, strlen(want), "stdout is %zu bytes, expected %zu:\n%s", n, strlen(want), out);
    cr_assert(!memcmp(out, want, n), "stdout differs from greedy_text:\n%s\n---- expected:\n%s", out, want);
    cr_assert(strstr(err, "CPU"), "stderr does not say it runs on the CPU: %s", err);
    cr_assert(strstr(err, "tokens/s") && strstr(err, "ms/token") && strstr(err, "GB/s"), "stats missing: %s", err);
    cr_assert(strstr(err, "djinn: prompt 5 tokens, prefill "), "no prompt/prefill line: %s", err);
    cr_assert(strstr(err, "djinn: time to first token "), "no time to first token: %s", err);
    cr_assert(strstr(err, "djinn: decode 199 tokens, "), "no decode line for the 199 tokens after the first: %s", err);
    free(out), free(want), free(err), free(g.text);
    tcli_teardown(&c);
}

// Without --cpu the engine follows the hardware, and stderr says which one runs.
Test(cli, announces_the_engine) {
    tcli_ctx c;
    tcli_setup(&c);
    char *argv[] = {tcli_djinn_path, c.model, "-p", "Hi", "-n", "3", "-t", "0", NULL};
    cr_assert_eq(tcli_run(&c, argv), 0);
    char *err = tcli_stderr(&c);
    if (gpu_count() > 0)
        cr_assert(strstr(err, "gpu: ") && strstr(err, "resident"), "must describe the GPU plan on stderr: %s", err);
    else
        cr_assert(strstr(err, "warning: " GPU_ABSENT ": running on the CPU"),
                  "must say on stderr why it runs on the CPU: %s", err);
    free(err);
    tcli_teardown(&c);
}

// --kv-type: each type reaches the engine, whose set-up line states it with the KV cache's bytes for the context
// (stories260K: a position's K and V over 5 layers of 4 KV heads of head_dim 8); without it, DJ_KV_DEFAULT's;
// anything else is one line naming the choices, exit 2.
Test(cli, kv_type_reaches_the_engine) {
    tcli_ctx c;
    tcli_setup(&c);
    char want[120], *err;
    for (int t = -1; t < DJ_KV_TYPES; t++) {
        const int type = t < 0 ? DJ_KV_DEFAULT : t;
        char *argv[] = {tcli_djinn_path, c.model, "-p", "Hi", "-n", "4", "-t", "0", "--cpu", "--kv-type",
                        (char *)dj_kv_name(type), NULL};
        if (t < 0) argv[9] = NULL;
        int rc = tcli_run(&c, argv);
        err = tcli_stderr(&c);
        cr_assert_eq(rc, 0, "%s: %s", dj_kv_name(type), err);
        snprintf(want, sizeof want, "; KV cache %.3g GB (%s) for a context of 512\n",
                 512.0 * 2 * 5 * 4 * (double)dj_kv_row_bytes(type, 8) / 1e9, dj_kv_name(type));
        cr_expect(strstr(err, want), "%s: not '%s' in %s", t < 0 ? "the default" : dj_kv_name(type), want, err);
        free(err);
    }
    tcli_expect_fail(&c, (char *[]){tcli_djinn_path, c.model, "--kv-type", "f64", NULL}, 2,
                     "djinn: --kv-type needs f32|f16|q8, not 'f64' (see djinn --help)\n");
    err = tcli_stderr(&c);
    cr_expect(strchr(err, '\n') == err + strlen(err) - 1, "more than one line: %s", err);
    free(err);
    tcli_teardown(&c);
}

// The context without -c (kvsize.h), with DJINN_TEST_MEM standing for the host's available memory: stories260K's 512
// positions while their KV cache takes at most a quarter of it (to the byte), else 256, said in one line; an explicit
// -c is kept whatever the memory.
static char *tcli_context_run(tcli_ctx *c, uint64_t mem, const char *ctx) {
    char m[32];
    snprintf(m, sizeof m, "%llu", (unsigned long long)mem);
    setenv("DJINN_TEST_MEM", m, 1);
    char *argv[] = {tcli_djinn_path, c->model, "-p", "Hi", "-n", "2", "-t", "0", "--cpu", "--kv-type", "f32",
                    ctx ? "-c" : NULL, (char *)ctx, NULL};
    int rc = tcli_run(c, argv);
    unsetenv("DJINN_TEST_MEM");
    char *err = tcli_stderr(c);
    cr_assert_eq(rc, 0, "%s", err);
    return err;
}

Test(cli, default_context_from_memory) {
    tcli_ctx c;
    tcli_setup(&c);
    const uint64_t slot = 512 * 2 * 5 * 4 * dj_kv_row_bytes(DJ_KV_F32, 8);  // 512 positions of stories260K, f32
    char *err = tcli_context_run(&c, 4 * slot, NULL);
    cr_expect(!strstr(err, "djinn: context") && strstr(err, "for a context of 512\n"), "%s", err);
    free(err);
    err = tcli_context_run(&c, 4 * slot - 4, NULL);
    char want[300];
    snprintf(want, sizeof want, "\ndjinn: context 256 of the model's 512: its KV cache (%.3g GB, f32) takes at most a "
             "quarter of the host's available memory, %.3g GB (-c to change)\n", (double)slot / 2e9,
             (double)(slot - 1) / 1e9);
    cr_expect(strstr(err, want) && strstr(err, "for a context of 256\n"), "not '%s' in %s", want, err);
    free(err);
    err = tcli_context_run(&c, 4 * slot - 4, "512");
    cr_expect(!strstr(err, "djinn: context") && strstr(err, "for a context of 512\n"), "%s", err);
    free(err);
    tcli_teardown(&c);
}

// --threads sets the CPU engine's pool; without it the pool is one thread per CPU of the affinity mask.
Test(cli, threads_flag_sets_the_pool) {
    tcli_ctx c;
    tcli_setup(&c);
    char *argv[] = {tcli_djinn_path, c.model, "-p", "Hi", "-n", "2", "-t", "0", "--cpu", "--threads", "3", NULL};
    cr_assert_eq(tcli_run(&c, argv), 0);
    char *err = tcli_stderr(&c);
    cr_assert(strstr(err, "running on the CPU (--cpu), 3 threads"), "%s", err);
    free(err);
    cpu_set_t set;
    cr_assert_eq(sched_getaffinity(0, sizeof set, &set), 0);
    char want[64];
    snprintf(want, sizeof want, "running on the CPU (--cpu), %d thread%s", CPU_COUNT(&set), CPU_COUNT(&set) == 1 ? "" : "s");
    char *argv2[] = {tcli_djinn_path, c.model, "-p", "Hi", "-n", "2", "-t", "0", "--cpu", NULL};
    cr_assert_eq(tcli_run(&c, argv2), 0);
    err = tcli_stderr(&c);
    cr_assert(strstr(err, want), "want '%s': %s", want, err);
    free(err);
    tcli_teardown(&c);
}

// --gpus that is neither a count nor a list of device ids: one line quoting it, exit 2, on djinn and djinn serve,
// before any model is read.
Test(cli, bad_gpus_refused) {
    tcli_ctx c;
    tcli_setup(&c);
    static const char *bad[] = {"0", "9", "x", "1,", "0,,1"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        for (int serve = 0; serve < 2; serve++) {
            char *run[] = {tcli_djinn_path, c.model, "-p", "Hi", "-n", "1", "--gpus", (char *)bad[i], NULL};
            char *srv[] = {tcli_djinn_path, "serve", c.model, "--gpus", (char *)bad[i], NULL};
            cr_assert_eq(tcli_run(&c, serve ? srv : run), 2, "%s--gpus '%s' not refused", serve ? "serve " : "",
                         bad[i]);
            char *err = tcli_stderr(&c);
            char want[64];
            snprintf(want, sizeof want, "'%s'", bad[i]);
            cr_assert(strstr(err, "--gpus") && strstr(err, want) && strchr(err, '\n') == strrchr(err, '\n'),
                      "%s--gpus '%s': %s", serve ? "serve " : "", bad[i], err);
            free(err);
        }
    tcli_teardown(&c);
}

// GPU-only flags on the CPU engine: the run goes on, with one warning naming them.
Test(cli, gpu_flags_on_the_cpu_warn) {
    tcli_ctx c;
    tcli_setup(&c);
    char *argv[] = {tcli_djinn_path, c.model, "-p", "Hi", "-n", "2", "-t", "0", "--cpu", "--no-graph", NULL};
    cr_assert_eq(tcli_run(&c, argv), 0);
    char *err = tcli_stderr(&c);
    const char *warning = "warning: --ring-gb, --stream-all, --sync-copy, --no-graph, --fma-attn, --gpus and "
                          "--cpu-share apply to the GPU engine only";
    cr_assert(strstr(err, warning), "%s", err);
    free(err);
    // --cpu-share too, even at its default value
    char *argv2[] = {tcli_djinn_path, c.model, "-p", "Hi", "-n", "2", "-t", "0", "--cpu", "--cpu-share", "auto", NULL};
    cr_assert_eq(tcli_run(&c, argv2), 0);
    err = tcli_stderr(&c);
    cr_assert(strstr(err, warning), "%s", err);
    free(err);
    // --gpus too
    char *argv3[] = {tcli_djinn_path, c.model, "-p", "Hi", "-n", "2", "-t", "0", "--cpu", "--gpus", "2", NULL};
    cr_assert_eq(tcli_run(&c, argv3), 0);
    err = tcli_stderr(&c);
    cr_assert(strstr(err, warning), "%s", err);
    free(err);
    tcli_teardown(&c);
}

// The same 200 greedy tokens from the GPU engine: all resident, and with every layer streamed.
Test(cli, greedy_text_byte_exact_gpu) {
    if (gpu_count() == 0) cr_skip_test("no GPU: cudaGetDeviceCount found no usable device (runs on the GPU machine)");
    tcli_ctx c;
    tcli_setup(&c);
    tcli_greedy g;
    tcli_load_greedy(&c, &g);
    char *want = tcli_expected_text(&g);
    // 0: all resident; 1: everything streamed, no overlap; 2: everything streamed from pageable memory;
    // 3: all resident, launch by launch, prefill attention on the FMA kernel.
    for (int stream = 0; stream < 4; stream++) {
        static char *const extra[][2] = {{"-s", "1"}, {"--stream-all", "--sync-copy"}, {"--stream-all", "--no-pin"},
                                         {"--no-graph", "--fma-attn"}};
        char *argv[] = {tcli_djinn_path, c.model, "-p", "Once upon a time", "-n", "200", "-t", "0",
                        extra[stream][0], extra[stream][1], NULL};
        int rc = tcli_run(&c, argv);
        char *err = tcli_stderr(&c);
        cr_assert_eq(rc, 0, "djinn failed: %s", err);
        size_t n;
        char *out = tcli_stdout(&c, &n);
        cr_assert(n == strlen(want) && !memcmp(out, want, n), "stream %d: stdout differs from greedy_text:\n%s", stream,
                  out);
        cr_assert(strstr(err, "gpu: "), "stderr does not describe the GPU engine: %s", err);
        if (stream) cr_assert(strstr(err, "streamed"), "no streaming statistics: %s", err);
        if (stream == 2) cr_assert(strstr(err, "pageable"), "no warning about pageable memory: %s", err);
        if (stream == 3) cr_assert(strstr(err, "fp32 FMA kernel (--fma-attn)"), "FMA attention not used: %s", err);
        free(out), free(err);
    }
    free(want), free(g.text);
    tcli_teardown(&c);
}

// Runs a greedy generation with a Ctrl-C delivered at `at` (DJINN_TEST_SIGINT_AT in djinn.c): it must exit 130;
// returns stderr, and stdout in *out.
static char *tcli_interrupted_run(tcli_ctx *c, const char *at, char **out) {
    setenv("DJINN_TEST_SIGINT_AT", at, 1);
    int rc = tcli_run(c, (char *[]){tcli_djinn_path, c->model, "-p", "Once upon a time", "-n", "100", "-t", "0",
                                    "--cpu", NULL});
    unsetenv("DJINN_TEST_SIGINT_AT");
    char *err = tcli_stderr(c);
    cr_assert_eq(rc, 130, "Ctrl-C at %s: exit %d, expected 130: %s", at, rc, err);
    *out = tcli_stdout(c, NULL);
    return err;
}

// Ctrl-C during generation: the text so far and the statistics, then exit 130. During loading or prefill: no
// token is generated, and what was measured so far is on stderr.
Test(cli, ctrl_c_prints_stats_and_exits_cleanly) {
    tcli_ctx c;
    tcli_setup(&c);
    char *out, *err = tcli_interrupted_run(&c, "5", &out);
    cr_assert(strstr(err, "interrupted after 5 new tokens"), "%s", err);
    cr_assert(strstr(err, "ms/token"), "no statistics after the interrupt: %s", err);
    size_t n = strlen(out);
    cr_assert(n > 17 && out[n - 1] == '\n', "the text so far, ended by a newline: '%s'", out);
    free(out), free(err);

    err = tcli_interrupted_run(&c, "load", &out);
    cr_assert(strstr(err, "djinn: interrupted during loading\n"), "%s", err);
    cr_assert(!strstr(err, "djinn: loaded ") && !strstr(err, "prefill"), "went on after Ctrl-C during loading: %s",
              err);
    cr_assert_str_eq(out, "", "text printed after Ctrl-C during loading");
    free(out), free(err);

    // during prefill the engine stops its pass (before its next layer): no prefill figure, no text
    err = tcli_interrupted_run(&c, "prefill", &out);
    cr_assert(strstr(err, "djinn: interrupted during the prompt's prefill (5 tokens): nothing generated or written\n"),
              "%s", err);
    cr_assert(!strstr(err, "djinn: prompt 5 tokens, prefill ") && !strstr(err, "time to first token"),
              "the prefill ran through Ctrl-C: %s", err);
    cr_assert_str_eq(out, "", "text printed after Ctrl-C during prefill");
    free(out), free(err);
    tcli_teardown(&c);
}

// Ctrl-C during the prompt's prefill with --save-session and --logits: the run ends (exit 130) and neither file is
// written, not even in part (its cache was cut short: a session of it could not be resumed).
Test(cli, ctrl_c_during_prefill_writes_no_file) {
    tcli_ctx c;
    tcli_setup(&c);
    char ses[600], lg[600];
    snprintf(ses, sizeof ses, "%s/cut.ses", c.dir), snprintf(lg, sizeof lg, "%s/cut.logits", c.dir);
    setenv("DJINN_TEST_SIGINT_AT", "prefill", 1);
    int rc = tcli_run(&c, (char *[]){tcli_djinn_path, c.model, "-p", "Once upon a time", "-n", "10", "-t", "0",
                                     "--cpu", "--save-session", ses, "--logits", lg, NULL});
    unsetenv("DJINN_TEST_SIGINT_AT");
    char *err = tcli_stderr(&c);
    cr_assert_eq(rc, 130, "exit %d: %s", rc, err);
    cr_assert(strstr(err, "interrupted during the prompt's prefill"), "%s", err);
    struct stat st;
    cr_assert(stat(ses, &st) && stat(lg, &st), "a file was written after a cut prefill");
    DIR *d = opendir(c.dir);
    for (struct dirent *de; (de = readdir(d));)
        cr_assert(!strstr(de->d_name, "cut."), "%s left behind in the folder", de->d_name);
    closedir(d);
    free(err);
    tcli_teardown(&c);
}

// Ctrl-C during a load stops it within a read chunk (loader.h's dj_load_cancel): a load slowed to ~9 s (the loader's
// DJINN_TEST_LOAD_BPS, a slow disk) on a terminal, interrupted once its progress line is there, exits 130 within a
// second, having loaded nothing. Under `make test SAN=1` a leak of what the load took changes the exit status (LSan).
Test(cli, ctrl_c_stops_a_slow_load) {
    tcli_ctx c;
    tcli_setup(&c);
    setenv("DJINN_TEST_LOAD_BPS", "20000", 1);
    int fd;
    pid_t pid = forkpty(&fd, NULL, NULL, NULL);  // stderr a terminal: the load's progress line is printed
    cr_assert_geq(pid, 0, "forkpty failed");
    if (pid == 0) {
        int out = open(c.out, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        dup2(out, 1);
        execl(tcli_djinn_path, tcli_djinn_path, c.model, "-p", "Once upon a time", "-n", "5", "--cpu", (char *)NULL);
        _exit(127);
    }
    unsetenv("DJINN_TEST_LOAD_BPS");
    // the terminal until the progress line is on it (10 s at most), then Ctrl-C, then the rest until djinn ends
    char err[1 << 14];
    size_t n = 0;
    double start = dj_now(), sent = 0;
    for (;;) {
        struct pollfd pf = {.fd = fd, .events = POLLIN};
        double now = dj_now(), deadline = sent ? sent + 5 : start + 10;
        if (now > deadline || poll(&pf, 1, (int)((deadline - now) * 1000) + 1) <= 0) break;
        ssize_t got = read(fd, err + n, sizeof err - 1 - n);
        if (got <= 0) break;  // EIO once djinn has exited and closed the terminal
        n += (size_t)got, err[n] = 0;
        if (!sent && strstr(err, "loading: ")) {
            cr_assert_eq(kill(pid, SIGINT), 0);
            sent = dj_now();
        }
    }
    int st;
    if (waitpid(pid, &st, WNOHANG) != pid) kill(pid, SIGKILL), waitpid(pid, &st, 0);
    double took = dj_now() - sent;
    close(fd);
    err[n] = 0;
    cr_assert(sent, "no progress line within 10 s: %s", err);
    const char *eta = strstr(err, "ETA ");
    cr_assert(eta && atoi(eta + 4) >= 3, "the load is not slow enough to test anything: %s", err);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 130, "Ctrl-C during loading: status %#x, expected exit 130: %s",
              st, err);
    cr_assert_lt(took, 1.0, "exited %.2f s after Ctrl-C during loading", took);
    cr_assert(strstr(err, "djinn: interrupted during loading") && !strstr(err, "djinn: loaded "), "%s", err);
    char *out = tcli_stdout(&c, NULL);
    cr_assert_str_eq(out, "", "text printed after Ctrl-C during loading");
    free(out);
    tcli_teardown(&c);
}

// Runs argv, which must succeed, and returns its stdout.
static char *tcli_text(tcli_ctx *c, char *const argv[]) {
    int rc = tcli_run(c, argv);
    cr_assert_eq(rc, 0, "djinn failed: %s", tcli_stderr(c));
    return tcli_stdout(c, NULL);
}

// -f FILE and -f - give the same text as -p; a prompt far over the context (140 KB, past what an argument may
// hold) is refused by its token count; a missing file, a NUL byte and a directory by name.
Test(cli, prompt_from_file_and_stdin) {
    tcli_ctx c;
    tcli_setup(&c);
    char *d = tcli_djinn_path, *m = c.model, path[600], big[600], nul[600];
    snprintf(path, sizeof path, "%s/prompt.txt", c.dir);
    snprintf(big, sizeof big, "%s/big.txt", c.dir);
    snprintf(nul, sizeof nul, "%s/nul.txt", c.dir);
    tc_write(path, "Once upon a time", 16);
    char *want = tcli_text(&c, (char *[]){d, m, "-p", "Once upon a time", "-n", "20", "-t", "0", "--cpu", NULL});
    char *got = tcli_text(&c, (char *[]){d, m, "-f", path, "-n", "20", "-t", "0", "--cpu", NULL});
    cr_assert_str_eq(got, want, "-f FILE");
    free(got);
    tcli_stdin = path;
    got = tcli_text(&c, (char *[]){d, m, "-f", "-", "-n", "20", "-t", "0", "--cpu", NULL});
    tcli_stdin = NULL;
    cr_assert_str_eq(got, want, "-f -");
    free(got), free(want);
    size_t n = 140000;
    char *text = malloc(n);
    for (size_t i = 0; i < n; i++) text[i] = "Once upon a time "[i % 17];
    tc_write(big, text, n);
    free(text);
    tcli_expect_fail(&c, (char *[]){d, m, "-f", big, "-n", "1", "--cpu", NULL}, 1, "longer than the context");
    tc_write(nul, "Once\0upon", 9);
    tcli_expect_fail(&c, (char *[]){d, m, "-f", nul, "--cpu", NULL}, 1, "NUL byte");
    tcli_expect_fail(&c, (char *[]){d, m, "-f", "/nonexistent/prompt.txt", "--cpu", NULL}, 1, "prompt file");
    tcli_expect_fail(&c, (char *[]){d, m, "-f", c.dir, "--cpu", NULL}, 1, "prompt file");
    tcli_teardown(&c);
}

// --stop: the text ends where a stop string begins (one that spans tokens too), the string itself unprinted; the
// prompt never triggers it; a string that never appears changes nothing; empty or too many strings are usage errors.
Test(cli, stop_strings) {
    tcli_ctx c;
    tcli_setup(&c);
    char *d = tcli_djinn_path, *m = c.model;
    char *full = tcli_text(&c, (char *[]){d, m, "-p", "Once upon a time", "-n", "40", "-t", "0", "--cpu", NULL});
    const char *cut[] = {"little", ", there w", "re wa"};
    for (int k = 0; k < 3; k++) {
        const char *at = strstr(full + 16, cut[k]);
        cr_assert(at, "the greedy text lacks '%s': %s", cut[k], full);
        char *got = tcli_text(&c, (char *[]){d, m, "-p", "Once upon a time", "-n", "40", "-t", "0", "--cpu", "--stop",
                                             "never in it", "--stop", (char *)cut[k], NULL});
        size_t want = (size_t)(at - full);
        cr_assert(strlen(got) == want + 1 && !strncmp(got, full, want) && got[want] == '\n',
                  "--stop '%s': got '%s' from '%s'", cut[k], got, full);
        char *err = tcli_stderr(&c);
        char line[96];
        snprintf(line, sizeof line, "stopped at --stop '%s'", cut[k]);
        cr_assert(strstr(err, line), "%s", err);
        free(got), free(err);
    }
    char *same = tcli_text(&c, (char *[]){d, m, "-p", "Once upon a time", "-n", "40", "-t", "0", "--cpu", "--stop",
                                          "upon", NULL});
    cr_assert_str_eq(same, full, "a stop string in the prompt only must not stop the generation");
    free(same), free(full);
    tcli_expect_fail(&c, (char *[]){d, m, "--stop", "", NULL}, 2, "--stop needs a non-empty string");
    char *many[40] = {d, m};
    int k = 2;
    for (int i = 0; i < 17; i++) many[k++] = "--stop", many[k++] = "x";
    many[k] = NULL;
    tcli_expect_fail(&c, many, 2, "more than 16 --stop strings");
    tcli_teardown(&c);
}

// ---- --chat
// stories260K with tokenizer_config.json `cfg` (tc_convert_with_config, its folder c->dir/<name>_tok), converted
// into c->dir/<name>.bin, its path into out.
static void tcli_tok_model(tcli_ctx *c, const char *name, const char *cfg, char *out, size_t n) {
    cr_assert_eq(tc_convert_with_config(tcli_convert_path, c->dir, name, cfg, out, n, c->out, c->err), 0, "convert: %s",
                 tcli_stderr(c));
}

// stories260K with a Llama 2 chat template in its tokenizer_config.json (the template is recognised by its
// markers), converted into c->dir/chat.bin; `tmpl` NULL: a template of no known kind (chat_unknown.bin).
static void tcli_chat_model(tcli_ctx *c, const char *tmpl, char *out, size_t n) {
    char cfg[2048];
    snprintf(cfg, sizeof cfg, "{\"add_bos_token\": true, \"add_eos_token\": false, \"bos_token\": \"<s>\", "
             "\"eos_token\": \"</s>\", \"chat_template\": \"%s\"}",
             tmpl ? tmpl : "{% for m in messages %}<|user|>{{ m['content'] }}{% endfor %}");
    tcli_tok_model(c, tmpl ? "chat" : "chat_unknown", cfg, out, n);
}

#define TCLI_LLAMA2_TMPL "{% for m in messages %}{{ bos_token + '[INST] ' + m['content'] + ' [/INST]' }}<<SYS>>{% endfor %}"

// Turns from stdin (a pipe): one answer line per turn, the same text for the same turns (greedy); the second
// turn's answer sees the first (the KV cache is kept: alone it answers otherwise); a Ctrl-C in an answer stops that
// answer only; models without a template or with an unknown one are refused by name; --chat with -p is a usage error.
Test(cli, chat_conversation) {
    tcli_ctx c;
    tcli_setup(&c);
    char model[700], unknown[700], in2[600], in1[600];
    tcli_chat_model(&c, TCLI_LLAMA2_TMPL, model, sizeof model);
    snprintf(in2, sizeof in2, "%s/turns2.txt", c.dir);
    snprintf(in1, sizeof in1, "%s/turns1.txt", c.dir);
    tc_write(in2, "Hello there\n\nTell me a story\n", 29);
    tc_write(in1, "Tell me a story\n", 16);
    char *d = tcli_djinn_path;
    char *argv[] = {d, model, "--chat", "-t", "0", "-n", "30", "--system", "Be brief.", "--cpu", NULL};
    tcli_stdin = in2;
    char *a = tcli_text(&c, argv), *b = tcli_text(&c, argv);
    char *err = tcli_stderr(&c);
    tcli_stdin = in1;
    char *one = tcli_text(&c, argv);
    tcli_stdin = NULL;
    cr_assert_str_eq(a, b, "the same turns, greedy: different answers");
    size_t la = strlen(a), l1 = strlen(one);
    cr_assert(la > 2 && a[la - 1] == '\n' && l1 > 1, "answers end with a newline: '%s'", a);
    cr_assert(strstr(err, "Llama 2 ([INST]) template") && strstr(err, "chat: 2 turns"), "the empty line is no turn: %s",
              err);
    cr_assert(l1 >= la || strcmp(a + la - l1, one), "the second answer equals the same turn's answer alone: the first "
                                                   "turn was lost ('%s' against '%s')", a, one);
    free(err), free(b), free(one);
    // Ctrl-C (a real SIGINT, DJINN_TEST_SIGINT_AT) after 3 tokens of the first answer: that answer stops, the second
    // is answered in full, exit 0
    setenv("DJINN_TEST_SIGINT_AT", "3", 1);
    tcli_stdin = in2;
    int rc = tcli_run(&c, argv);
    tcli_stdin = NULL;
    unsetenv("DJINN_TEST_SIGINT_AT");
    char *out = tcli_stdout(&c, NULL);
    err = tcli_stderr(&c);
    cr_assert_eq(rc, 0, "%s", err);
    cr_assert(strstr(err, "answer stopped (Ctrl-C)") && strstr(err, "chat: 2 turns"), "%s", err);
    char *nl2 = strchr(out, '\n');
    cr_assert(nl2 && !strncmp(a, out, (size_t)(nl2 - out)), "the stopped answer is not the start of the full one: '%s' "
                                                           "against '%s'", out, a);
    free(out), free(err), free(a);
    tcli_chat_model(&c, NULL, unknown, sizeof unknown);
    tcli_expect_fail(&c, (char *[]){d, unknown, "--chat", "--cpu", NULL}, 1, "neither Llama 2's");
    tcli_expect_fail(&c, (char *[]){d, c.model, "--chat", "--cpu", NULL}, 1, "has no chat template");
    tcli_expect_fail(&c, (char *[]){d, model, "--chat", "-p", "x", NULL}, 2, "--chat reads its turns from stdin");
    char stats[700];  // a --stats-json the conversation would never write: refused, not left unwritten
    snprintf(stats, sizeof stats, "%s/chat_stats.json", c.dir);
    tcli_expect_fail(&c, (char *[]){d, model, "--chat", "--stats-json", stats, NULL}, 2, "--stats-json");
    tcli_expect_fail(&c, (char *[]){d, model, "--system", "x", NULL}, 2, "--system is --chat's");
    // a first turn that cannot fit the context is an error (it exited 0, nothing answered), as in plain generation
    tcli_stdin = in1;
    tcli_expect_fail(&c, (char *[]){d, model, "--chat", "-c", "8", "--system", "Be brief.", "--cpu", NULL}, 1,
                     "the first turn is");
    tcli_stdin = NULL;
    tcli_teardown(&c);
}

// Reads the pty until `want` shows up, or until djinn's side of it closes (djinn ended: its alarm bounds a hang);
// returns what was read (malloc'd).
static char *tcli_pty_until(int fd, const char *want) {
    size_t cap = 1 << 16, n = 0;
    char *buf = calloc(cap + 1, 1);
    while (!strstr(buf, want) && n < cap) {
        ssize_t got = read(fd, buf + n, cap - n);
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0) break;
        n += (size_t)got;
        buf[n] = 0;
    }
    return buf;
}

// Through a pseudo-terminal, as a user types, each key once the terminal shows what it waits for: the "> " prompt,
// an answer, Ctrl-C at the prompt (nothing to stop: the conversation goes on, and the next answer is whole), then
// Ctrl-D ends it with exit 0.
Test(cli, chat_on_a_terminal) {
    tcli_ctx c;
    tcli_setup(&c);
    char model[700];
    tcli_chat_model(&c, TCLI_LLAMA2_TMPL, model, sizeof model);
    int fd;
    pid_t pid = forkpty(&fd, NULL, NULL, NULL);
    cr_assert(pid >= 0, "forkpty failed");
    if (pid == 0) {
        alarm(60);
        execl(tcli_djinn_path, tcli_djinn_path, model, "--chat", "-t", "0", "-n", "20", "--cpu", (char *)NULL);
        _exit(127);
    }
    char *seen = tcli_pty_until(fd, "> ");
    cr_assert(strstr(seen, "> "), "no prompt on the terminal: %s", seen);
    free(seen);
    cr_assert_eq(write(fd, "Hello\n", 6), 6);
    seen = tcli_pty_until(fd, "\n> ");
    cr_assert(strstr(seen, "\n> "), "no second prompt after the answer: %s", seen);
    free(seen);
    cr_assert_eq(write(fd, "\x03", 1), 1);  // Ctrl-C at the prompt
    // The terminal echoes ^C once it has sent djinn the SIGINT: the line typed next comes after it
    seen = tcli_pty_until(fd, "^C");
    cr_assert(strstr(seen, "^C"), "the terminal did not take Ctrl-C: %s", seen);
    free(seen);
    cr_assert_eq(write(fd, "Again\n", 6), 6);
    seen = tcli_pty_until(fd, "\n> ");
    cr_assert(strstr(seen, "\n> "), "the conversation did not go on after Ctrl-C at the prompt: %s", seen);
    cr_assert(!strstr(seen, "answer stopped"), "Ctrl-C at the prompt stopped the next answer: %s", seen);
    free(seen);
    cr_assert_eq(write(fd, "\x04", 1), 1);  // Ctrl-D: the end of input
    seen = tcli_pty_until(fd, "turns");
    int st;
    cr_assert_eq(waitpid(pid, &st, 0), pid);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "exit %d / signal %d: %s", WIFEXITED(st) ? WEXITSTATUS(st) : -1,
              WIFSIGNALED(st) ? WTERMSIG(st) : 0, seen);
    cr_assert(strstr(seen, "chat: 2 turns"), "%s", seen);
    free(seen);
    close(fd);
    tcli_teardown(&c);
}

// A prompt that writes the BOS token's text itself gets one BOS, not two, and a warning.
Test(cli, bos_text_in_prompt_not_doubled) {
    tcli_ctx c;
    tcli_setup(&c);
    char *d = tcli_djinn_path, *m = c.model;
    char *plain = tcli_text(&c, (char *[]){d, m, "-p", "Once upon", "--tokenize", NULL});
    char *err = tcli_stderr(&c);
    cr_assert(!strstr(err, "BOS"), "%s", err);
    free(err);
    char *with = tcli_text(&c, (char *[]){d, m, "-p", "<s>Once upon", "--tokenize", NULL});
    err = tcli_stderr(&c);
    cr_assert_str_eq(with, plain, "'<s>Once upon' must tokenize as 'Once upon' with its BOS");
    cr_assert(strstr(err, "warning: the prompt starts with the BOS token's text"), "%s", err);
    free(plain), free(with), free(err);
    tcli_teardown(&c);
}

// Without -s each run draws a fresh seed and prints it; that seed given back with -s gives the same text. Runs in
// the same second differ (the seed is not the clock's seconds).
Test(cli, fresh_seed_printed_and_replayable) {
    tcli_ctx c;
    tcli_setup(&c);
    char *d = tcli_djinn_path, *m = c.model;
    unsigned long long seed[2];
    char *text[2];
    for (int k = 0; k < 2; k++) {
        text[k] = tcli_text(&c, (char *[]){d, m, "-p", "Once", "-n", "40", "-t", "1", "--cpu", NULL});
        char *err = tcli_stderr(&c), *at = strstr(err, "djinn: seed ");
        cr_assert(at && sscanf(at, "djinn: seed %llu", &seed[k]) == 1, "no seed line: %s", err);
        free(err);
    }
    cr_assert_neq(seed[0], seed[1], "two runs drew the same seed %llu", seed[0]);
    char s0[32];
    snprintf(s0, sizeof s0, "%llu", seed[0]);
    char *again = tcli_text(&c, (char *[]){d, m, "-p", "Once", "-n", "40", "-t", "1", "-s", s0, "--cpu", NULL});
    cr_assert_str_eq(again, text[0], "-s with the printed seed");
    free(again), free(text[0]), free(text[1]);
    tcli_teardown(&c);
}

// stdout and stderr into one file (a terminal's view): every statistics line starts a line of its own, and stderr
// holds no carriage return when it is not a terminal.
Test(cli, statistics_never_inside_the_text) {
    tcli_ctx c;
    tcli_setup(&c);
    cr_assert_eq(tcli_run_to(&c, (char *[]){tcli_djinn_path, c.model, "-p", "Once upon a time", "-n", "30", "-t", "0",
                                           "--cpu", NULL}, c.err, 0), 0);
    char *all = tcli_stderr(&c);
    for (char *p = strstr(all, "djinn:"); p; p = strstr(p + 1, "djinn:"))
        cr_assert(p == all || p[-1] == '\n', "a statistics line glued to the text: %s", all);
    for (char *p = strstr(all, "loading:"); p; p = strstr(p + 1, "loading:"))
        cr_assert(p == all || p[-1] == '\n', "the progress line glued to something: %s", all);
    cr_assert(!strchr(all, '\r'), "a carriage return in a log: %s", all);
    cr_assert(strstr(all, "\nOnce upon a time"), "the text on a line of its own: %s", all);
    free(all);
    tcli_teardown(&c);
}

static char *tcli_sample(tcli_ctx *c, const char *temp, const char *top_p, const char *seed) {
    return tcli_text(c, (char *[]){tcli_djinn_path, c->model, "-p", "Once upon a time", "-n", "60", "-t",
                                   (char *)temp, "--top-p", (char *)top_p, "-s", (char *)seed, "--cpu", NULL});
}

Test(cli, sampling_is_seeded) {
    tcli_ctx c;
    tcli_setup(&c);
    char *a = tcli_sample(&c, "1.0", "0.95", "42"), *b = tcli_sample(&c, "1.0", "0.95", "42");
    char *d = tcli_sample(&c, "1.0", "0.95", "43");
    cr_assert_str_eq(a, b, "same seed, different text");
    cr_assert_str_neq(a, d, "different seeds gave the same 60 tokens");
    char *greedy = tcli_sample(&c, "0", "0.9", "1"), *p0 = tcli_sample(&c, "1.5", "0", "7");
    cr_assert_str_eq(p0, greedy, "top-p 0 is not greedy");
    // --top-k 1 is greedy at any temperature; a repeat penalty changes the greedy text (stories260K repeats
    // "Lily" and "park" within 60 tokens); the flags are seeded like the rest
    char *k1 = tcli_text(&c, (char *[]){tcli_djinn_path, c.model, "-p", "Once upon a time", "-n", "60", "-t", "1.5",
                                        "--top-k", "1", "--cpu", NULL});
    cr_assert_str_eq(k1, greedy, "--top-k 1 is not greedy");
    char *pen = tcli_text(&c, (char *[]){tcli_djinn_path, c.model, "-p", "Once upon a time", "-n", "60", "-t", "0",
                                         "--repeat-penalty", "1.5", "--cpu", NULL});
    cr_assert_str_neq(pen, greedy, "--repeat-penalty 1.5 left the greedy text as it was");
    char *argv_k[] = {tcli_djinn_path, c.model, "-p", "Once upon a time", "-n", "60", "-t", "1", "--top-k", "20",
                      "--min-p", "0.05", "--presence-penalty", "0.3", "--frequency-penalty", "0.2", "-s", "5", "--cpu",
                      NULL};
    char *r1 = tcli_text(&c, argv_k), *r2 = tcli_text(&c, argv_k);
    cr_assert_str_eq(r1, r2, "same seed and samplers, different text");
    free(k1), free(pen), free(r1), free(r2);
    cr_assert_str_neq(a, greedy, "sampling at temperature 1 gave the greedy text");
    free(a), free(b), free(d), free(greedy), free(p0);
    tcli_teardown(&c);
}

// On the GPU the token is picked where the logits are: the same seed gives the same text, resident (the decode
// graph) and streamed alike (the same logits, bitwise); another seed another text; top-k 1 is greedy's text.
Test(cli, sampling_on_the_gpu_is_seeded) {
    if (gpu_count() == 0) cr_skip_test("no GPU: cudaGetDeviceCount found no usable device (runs on the GPU machine)");
    tcli_ctx c;
    tcli_setup(&c);
    char *d = tcli_djinn_path, *m = c.model;
    char *a = tcli_text(&c, (char *[]){d, m, "-p", "Once upon a time", "-n", "60", "-t", "1", "--top-k", "40",
                                       "--min-p", "0.02", "--repeat-penalty", "1.2", "-s", "5", NULL});
    char *b = tcli_text(&c, (char *[]){d, m, "-p", "Once upon a time", "-n", "60", "-t", "1", "--top-k", "40",
                                       "--min-p", "0.02", "--repeat-penalty", "1.2", "-s", "5", "--stream-all", NULL});
    char *o = tcli_text(&c, (char *[]){d, m, "-p", "Once upon a time", "-n", "60", "-t", "1", "--top-k", "40",
                                       "--min-p", "0.02", "--repeat-penalty", "1.2", "-s", "6", NULL});
    char *g = tcli_text(&c, (char *[]){d, m, "-p", "Once upon a time", "-n", "60", "-t", "0", NULL});
    char *k1 = tcli_text(&c, (char *[]){d, m, "-p", "Once upon a time", "-n", "60", "-t", "1.5", "--top-k", "1",
                                        "-s", "3", NULL});
    cr_assert_str_eq(a, b, "same seed, resident and streamed: different text");
    cr_assert_str_neq(a, o, "seeds 5 and 6 gave the same 60 tokens");
    cr_assert_str_neq(a, g, "sampling gave the greedy text");
    cr_assert_str_eq(k1, g, "--top-k 1 on the GPU is not greedy");
    free(a), free(b), free(o), free(g), free(k1);
    tcli_teardown(&c);
}

// top-p below 1/vocab on a nearly flat distribution: the nucleus is the top token alone. The sampler's cutoff
// once exceeded every weight there, kept no token and read before its buffer (under SAN=1, ASan stops the first
// run below).
Test(cli, tiny_top_p_keeps_the_top_token) {
    tcli_ctx c;
    tcli_setup(&c);
    char *d = tcli_djinn_path, *m = c.model;
    // Temperature 1e9: every weight rounds to exactly 1, all tie, and the lowest id is the top token.
    int rc = tcli_run(&c, (char *[]){d, m, "-p", "Once", "-n", "10", "-t", "1e9", "--top-p", "0.001", "-s", "1",
                                     "--cpu", NULL});
    char *err = tcli_stderr(&c);
    cr_assert_eq(rc, 0, "djinn failed: %s", err);
    cr_assert(strstr(err, "decode 9 tokens"), "10 tokens not generated: %s", err);
    // Temperature 3e4: the weights are still within 0.1% of 1 (the cutoff still above them all) but distinct,
    // so the top token is greedy's.
    char *flat = tcli_text(&c, (char *[]){d, m, "-p", "Once", "-n", "10", "-t", "3e4", "--top-p", "0.001", "-s",
                                          "1", "--cpu", NULL});
    char *greedy = tcli_text(&c, (char *[]){d, m, "-p", "Once", "-n", "10", "-t", "0", "--cpu", NULL});
    cr_assert_str_eq(flat, greedy, "top-p 0.001 at temperature 3e4 is not greedy");
    free(err), free(flat), free(greedy);
    tcli_teardown(&c);
}

Test(cli, tokenize_prints_ids) {
    tcli_ctx c;
    tcli_setup(&c);
    char *argv[] = {tcli_djinn_path, c.model, "-p", "Once upon a time", "--tokenize", NULL};
    cr_assert_eq(tcli_run(&c, argv), 0);
    char *out = tcli_stdout(&c, NULL);
    cr_assert_str_eq(out, "1 403 407 261 378\n");  // reference_greedy.json's prompt_ids
    free(out);
    tcli_teardown(&c);
}

Test(cli, context_full_stops_with_note) {
    tcli_ctx c;
    tcli_setup(&c);
    tcli_greedy g;
    tcli_load_greedy(&c, &g);
    char *argv[] = {tcli_djinn_path, c.model, "-p", "Once upon a time", "-n", "50", "-t", "0", "-c", "12", NULL};
    cr_assert_eq(tcli_run(&c, argv), 0, "%s", tcli_stderr(&c));
    char *out = tcli_stdout(&c, NULL), *err = tcli_stderr(&c), *want = tcli_expected_text(&g);
    cr_assert(strstr(err, "context"), "no note about the full context: %s", err);
    size_t n = strlen(out);
    cr_assert(n > 1 && out[n - 1] == '\n');
    cr_assert(n - 1 < strlen(want) - 1 && !strncmp(out, want, n - 1), "not a prefix of the greedy text: %s", out);
    cr_assert(n - 1 > strlen("Once upon a time"), "nothing generated: %s", out);
    free(out), free(err), free(want), free(g.text);
    tcli_teardown(&c);
}

// Greedy from "She was happy." on the mha_untied_f16 fixture reaches eos (id 2) as new token 19. Greedy, not a
// seed: along the way the top logit leads the second by 0.036 or more, while the CPU is within 3e-6 relative
// L2 of HF (tests/ref/mha_untied_f16.bin), so only a real change to the forward pass moves it.
Test(cli, stops_at_end_of_sequence) {
    tcli_ctx c;
    tcli_setup(&c);
    char model[600], lp[600];
    tcli_convert_fixture(&c, "mha_untied_f16", model, sizeof model);
    snprintf(lp, sizeof lp, "%s/logits.f32", c.dir);
    char *d = tcli_djinn_path, *p = "She was happy.";
    int rc = tcli_run(&c, (char *[]){d, model, "-p", p, "-n", "100", "-t", "0", "--cpu", "--logits", lp, NULL});
    char *err = tcli_stderr(&c);
    cr_assert_eq(rc, 0, "djinn failed: %s", err);
    cr_assert(strstr(err, "djinn: stopped at the end-of-sequence token after 19 new tokens\n"), "%s", err);
    // The text is the 18 tokens before eos, eos itself adds nothing: the same as stopping at -n 18.
    char *out = tcli_stdout(&c, NULL);
    char *upto = tcli_text(&c, (char *[]){d, model, "-p", p, "-n", "18", "-t", "0", "--cpu", NULL});
    cr_assert_str_eq(out, upto, "the eos run's text differs from the 18 tokens before it");
    cr_assert(!strstr(out, "</s>"), "eos printed: %s", out);
    // One row per position: 5 prompt tokens (BOS included) + 19 generated; the next-to-last row chose eos.
    size_t n;
    float *rows = (float *)tc_read(lp, &n);
    cr_assert_eq(n, (5 + 19) * TCLI_VOCAB * sizeof(float), "--logits: %zu bytes", n);
    const float *r = rows + 22 * TCLI_VOCAB;
    int best = 0;
    for (int i = 1; i < TCLI_VOCAB; i++)
        if (r[i] > r[best]) best = i;
    cr_assert_eq(best, 2, "row 22 picks %d, not eos", best);
    free(rows), free(upto), free(out), free(err);
    tcli_teardown(&c);
}

// --ignore-eos (llama.cpp's): the same greedy run goes past that eos to -n, printing nothing for it, so its text
// begins with the 18 tokens' and goes on; a run that does not generate (--chat, --check, --perplexity, --tokenize)
// refuses the flag.
Test(cli, ignore_eos_goes_past_the_end_token) {
    tcli_ctx c;
    tcli_setup(&c);
    char model[600];
    tcli_convert_fixture(&c, "mha_untied_f16", model, sizeof model);
    char *d = tcli_djinn_path, *p = "She was happy.";
    char *upto = tcli_text(&c, (char *[]){d, model, "-p", p, "-n", "18", "-t", "0", "--cpu", NULL});
    char *all = tcli_text(&c, (char *[]){d, model, "-p", p, "-n", "30", "-t", "0", "--cpu", "--ignore-eos", NULL});
    char *err = tcli_stderr(&c);
    cr_assert(!strstr(err, "end-of-sequence") && strstr(err, "djinn: decode 29 tokens"), "%s", err);
    size_t k = strlen(upto);
    if (k && upto[k - 1] == '\n') k--;  // the run's closing newline
    cr_assert(!strncmp(all, upto, k) && strlen(all) > strlen(upto) && !strstr(all, "</s>"), "'%s' after '%s'", all,
              upto);
    tcli_expect_fail(&c, (char *[]){d, model, "--chat", "--ignore-eos", NULL}, 2, "--ignore-eos is a generation's");
    tcli_expect_fail(&c, (char *[]){d, model, "--tokenize", "-p", p, "--ignore-eos", NULL}, 2,
                     "--ignore-eos is a generation's");
    free(upto), free(all), free(err);
    tcli_teardown(&c);
}

// ---- bad input

Test(cli, bad_flags_give_usage) {
    tcli_ctx c;
    tcli_setup(&c);
    char *m = c.model, *d = tcli_djinn_path;
    const char *see = "(see djinn --help)\n";  // one line: what was wrong, and where to look
    tcli_expect_fail(&c, (char *[]){d, m, "--bogus", NULL}, 2, "unknown option '--bogus' (see djinn --help)\n");
    char *err = tcli_stderr(&c);
    cr_assert(strchr(err, '\n') == err + strlen(err) - 1, "a usage error is one line: %s", err);
    free(err);
    tcli_expect_fail(&c, (char *[]){d, m, "-n", "abc", NULL}, 2, see);
    tcli_expect_fail(&c, (char *[]){d, m, "-n", NULL}, 2, see);
    tcli_expect_fail(&c, (char *[]){d, m, "-t", "-1", NULL}, 2, see);
    tcli_expect_fail(&c, (char *[]){d, m, "--top-p", "1.5", NULL}, 2, see);
    tcli_expect_fail(&c, (char *[]){d, m, "--ring-gb", "0", NULL}, 2, "--ring-gb");
    tcli_expect_fail(&c, (char *[]){d, m, "--ring-gb", "lots", NULL}, 2, "--ring-gb");
    tcli_expect_fail(&c, (char *[]){d, m, "--cpu-share", "0.96", NULL}, 2, "--cpu-share");
    tcli_expect_fail(&c, (char *[]){d, m, "--cpu-share", "-0.1", NULL}, 2, "--cpu-share");
    tcli_expect_fail(&c, (char *[]){d, m, "--cpu-share", "half", NULL}, 2, "--cpu-share");
    tcli_expect_fail(&c, (char *[]){d, m, "-c", "0", NULL}, 2, see);
    tcli_expect_fail(&c, (char *[]){d, "-p", "x", NULL}, 2, "no MODEL given (see djinn --help)");
    tcli_expect_fail(&c, (char *[]){d, m, "-p", "x", "-f", "-", NULL}, 2, "-p and -f");
    // --version: one line on stdout
    cr_assert_eq(tcli_run(&c, (char *[]){d, "--version", NULL}), 0);
    char *ver = tcli_stdout(&c, NULL);
    cr_assert(!strncmp(ver, "djinn ", 6) && strchr(ver, '\n') == ver + strlen(ver) - 1, "%s", ver);
    free(ver);
    tcli_expect_fail(&c, (char *[]){d, m, "-c", "100000", NULL}, 2, "max_seq_len");
    tcli_expect_fail(&c, (char *[]){d, m, "--threads", "0", NULL}, 2, "--threads");
    tcli_expect_fail(&c, (char *[]){d, m, "--top-k", "-1", NULL}, 2, "--top-k");
    tcli_expect_fail(&c, (char *[]){d, m, "--min-p", "2", NULL}, 2, "--min-p");
    tcli_expect_fail(&c, (char *[]){d, m, "--repeat-penalty", "0", NULL}, 2, "--repeat-penalty");
    tcli_expect_fail(&c, (char *[]){d, m, "--repeat-last-n", "-3", NULL}, 2, "--repeat-last-n");
    tcli_expect_fail(&c, (char *[]){d, m, "--presence-penalty", "lots", NULL}, 2, "--presence-penalty");
    tcli_expect_fail(&c, (char *[]){d, m, "--frequency-penalty", "nan", NULL}, 2, "--frequency-penalty");
    tcli_expect_fail(&c, (char *[]){d, m, "--threads", "257", NULL}, 2, "--threads");
    tcli_expect_fail(&c, (char *[]){d, m, "--threads", "four", NULL}, 2, "--threads");
    tcli_expect_fail(&c, (char *[]){d, m, "--kv-type", "q4", NULL}, 2, "--kv-type");
    // values that parse but overflow the sampler's floats later (it then blamed the model's arithmetic): refused here
    tcli_expect_fail(&c, (char *[]){d, m, "-t", "1e308", NULL}, 2, "-t needs a temperature");
    tcli_expect_fail(&c, (char *[]){d, m, "--repeat-penalty", "1e-300", NULL}, 2, "--repeat-penalty");
    tcli_expect_fail(&c, (char *[]){d, m, "--presence-penalty", "-1e39", NULL}, 2, "--presence-penalty");
    tcli_expect_fail(&c, (char *[]){d, m, "--frequency-penalty", "-2e38", NULL}, 2, "--frequency-penalty");
    // --perplexity over windows of one token scores nothing: refused, not "perplexity -nan over 0 tokens"
    char ppl_text[600];
    snprintf(ppl_text, sizeof ppl_text, "%s/ppl.txt", c.dir);
    tc_write(ppl_text, "Once upon a time there was a cat.", 33);
    tcli_expect_fail(&c, (char *[]){d, m, "--perplexity", ppl_text, "-c", "1", NULL}, 1, "at least 2 tokens");
    tc_write(ppl_text, "Once upon\0 a time", 17);  // a NUL byte is not text, as -f's prompt says too
    tcli_expect_fail(&c, (char *[]){d, m, "--perplexity", ppl_text, NULL}, 1, "holds a NUL byte");
    // a flag the run would ignore is refused by name: --tol is --check's, --chat-template --chat's, and --check and
    // --perplexity read their own tokens
    tcli_expect_fail(&c, (char *[]){d, m, "-p", "x", "--tol", "5", NULL}, 2, "--tol is --check's");
    tcli_expect_fail(&c, (char *[]){d, m, "-p", "x", "--chat-template", "llama2", NULL}, 2, "--chat-template is --chat's");
    tcli_expect_fail(&c, (char *[]){d, m, "--check", ppl_text, "-p", "x", NULL}, 2, "not with -p, -f or --tokenize");
    tcli_expect_fail(&c, (char *[]){d, m, "--perplexity", ppl_text, "-f", ppl_text, NULL}, 2, "not with -p, -f");
    tcli_expect_fail(&c, (char *[]){d, m, "--check", ppl_text, "--tokenize", NULL}, 2, "not with -p, -f or --tokenize");
    // --help lists every option on stdout
    cr_assert_eq(tcli_run(&c, (char *[]){d, "--help", NULL}), 0);
    char *out = tcli_stdout(&c, NULL);
    const char *opts[] = {"-p", "-n", "-t", "--top-p", "-s", "-c", "--ring-gb", "--cpu", "--logits", "--check",
                          "--tol", "--tokenize", "--stream-all", "--sync-copy", "--no-graph", "--no-pin",
                          "--stats-json", "--fma-attn", "--cpu-share", "--threads", "-f", "--version", "--stop",
                          "--top-k", "--min-p", "--repeat-penalty", "--repeat-last-n", "--presence-penalty",
                          "--frequency-penalty", "--chat", "--system", "--trace", "--trace-steps", "--kv-type",
                          "--ignore-eos"};
    for (size_t i = 0; i < sizeof opts / sizeof *opts; i++) cr_assert(strstr(out, opts[i]), "--help lacks %s", opts[i]);
    char kv_help[100];
    snprintf(kv_help, sizeof kv_help, "--kv-type T      the KV cache's elements: f32|f16|q8 (default %s;",
             dj_kv_name(DJ_KV_DEFAULT));
    cr_assert(strstr(out, kv_help), "--help does not state --kv-type's choices and default: %s", out);
    cr_assert(strstr(out, "max_position_embeddings where its KV cache takes at most a quarter of the GPU's"),
              "--help does not state -c's default: %s", out);
    // a valid --ring-gb is accepted
    cr_assert_eq(tcli_run(&c, (char *[]){d, m, "--ring-gb", "1.5", "-n", "1", "-t", "0", NULL}), 0);
    free(out);
    tcli_teardown(&c);
}

// --trace: its refusals by name, here and on the GPU machine alike; without a GPU one line saying so and no file;
// with one, a streamed run's file (its steps: the structure is trace_gpu's test), the figures on stderr, and the
// text the untraced run's.
Test(cli, trace_flags) {
    tcli_ctx c;
    tcli_setup(&c);
    char *d = tcli_djinn_path, *m = c.model, tp[600], nodir[600];
    snprintf(tp, sizeof tp, "%s/trace.json", c.dir);
    snprintf(nodir, sizeof nodir, "%s/none/trace.json", c.dir);
    tcli_expect_fail(&c, (char *[]){d, m, "--trace-steps", "3", NULL}, 2, "--trace-steps needs --trace");
    tcli_expect_fail(&c, (char *[]){d, m, "--trace", tp, "--trace-steps", "0", NULL}, 2, "--trace-steps needs a count");
    tcli_expect_fail(&c, (char *[]){d, m, "--trace", tp, "--trace-steps", "65", NULL}, 2, "from 1 to 64");
    tcli_expect_fail(&c, (char *[]){d, m, "--trace", tp, "--cpu", NULL}, 2, "not with --cpu");
    tcli_expect_fail(&c, (char *[]){d, m, "--trace", tp, "--tokenize", NULL}, 2, "--tokenize");
    tcli_expect_fail(&c, (char *[]){d, m, "-n", "2", "--trace", m, NULL}, 1, "is the same file as");
    tcli_expect_fail(&c, (char *[]){d, m, "-n", "2", "--trace", nodir, NULL}, 1, "does not exist");
    tcli_expect_fail(&c, (char *[]){d, m, "-n", "2", "--trace", tp, "--stats-json", tp, NULL}, 1, "same file as");
    char *args[] = {d, m, "-p", "Once upon a time", "-n", "12", "-t", "0", "--stream-all", "--cpu-share", "0",
                    "--trace", tp, "--trace-steps", "3", NULL};
    if (gpu_count() == 0) {
        tcli_expect_fail(&c, args, 1, "--trace records the GPU engine's decode steps: " GPU_ABSENT);
        cr_assert(access(tp, F_OK), "a refused --trace left a file");
        tcli_teardown(&c);
        return;
    }
    cr_assert_eq(tcli_run(&c, args), 0);
    char *traced = tcli_stdout(&c, NULL), *err = tcli_stderr(&c);
    cr_assert(strstr(err, "trace: step 3:") && !strstr(err, "trace: step 4:") && strstr(err, "written to"), "%s", err);
    size_t n;
    char *text = tc_must_read(tp, &n);
    dj_err e;
    json_doc *doc = json_parse(text, n, &e);
    cr_assert(doc, "the trace is not JSON: %s", e.msg);
    const json_value *steps = json_get(json_root(doc), "steps");
    cr_assert(steps && steps->type == JSON_ARRAY && steps->u.arr.n == 3, "the trace's steps");
    args[11] = NULL;  // the same run untraced
    cr_assert_eq(tcli_run(&c, args), 0);
    char *plain = tcli_stdout(&c, NULL);
    cr_assert_str_eq(traced, plain, "tracing changed the text");
    json_free(doc);
    free(text), free(traced), free(plain), free(err);
    tcli_teardown(&c);
}

Test(cli, prompt_longer_than_context) {
    tcli_ctx c;
    tcli_setup(&c);
    tcli_expect_fail(&c, (char *[]){tcli_djinn_path, c.model, "-p", "Once upon a time there was a dog", "-c", "4", NULL},
                     1, "longer than the context");
    tcli_teardown(&c);
}

// A prompt that is not UTF-8: one error line that says so, exit 1, nothing on stdout, with or without --tokenize.
Test(cli, malformed_utf8_prompt) {
    tcli_ctx c;
    tcli_setup(&c);
    for (int tokenize = 0; tokenize < 2; tokenize++) {
        char *argv[] = {tcli_djinn_path, c.model, "-p", "ab\xff" "cd", tokenize ? "--tokenize" : NULL, NULL};
        tcli_expect_fail(&c, argv, 1, "UTF-8");
        char *err = tcli_stderr(&c);
        int hits = 0;
        for (const char *h = err; (h = strstr(h, "UTF-8")); h++) hits++;
        cr_assert_eq(hits, 1, "--tokenize %d: UTF-8 mentioned %d times, not in one error line: %s", tokenize, hits,
                     err);
        free(err);
    }
    tcli_teardown(&c);
}

Test(cli, missing_or_corrupt_model) {
    tcli_ctx c;
    tcli_setup(&c);
    char path[600];
    tcli_expect_fail(&c, (char *[]){tcli_djinn_path, "/nonexistent/model.bin", "-p", "x", NULL}, 1, "djinn: ");
    snprintf(path, sizeof path, "%s/garbage.bin", c.dir);
    char junk[8192];
    memset(junk, 'x', sizeof junk);
    tc_write(path, junk, sizeof junk);
    tcli_expect_fail(&c, (char *[]){tcli_djinn_path, path, "-p", "x", NULL}, 1, "djinn: ");
    // llama.cpp's format: named, with what to do instead
    memcpy(junk, "GGUF\3\0\0\0", 8);
    snprintf(path, sizeof path, "%s/model.gguf", c.dir);
    tc_write(path, junk, sizeof junk);
    char want[900];
    snprintf(want, sizeof want, "djinn: %s: a GGUF file (llama.cpp's format), which Djinn does not read: convert the "
             "Hugging Face checkpoint with ./convert/convert instead\n", path);
    tcli_expect_fail(&c, (char *[]){tcli_djinn_path, path, "-p", "x", NULL}, 1, want);
    size_t n;
    char *whole = tc_read(c.model, &n);
    snprintf(path, sizeof path, "%s/truncated.bin", c.dir);
    tc_write(path, whole, n / 2);
    tcli_expect_fail(&c, (char *[]){tcli_djinn_path, path, "-p", "x", NULL}, 1, "djinn: ");
    free(whole);
    tcli_teardown(&c);
}

// ---- --logits and --check

Test(cli, logits_file_rows) {
    tcli_ctx c;
    tcli_setup(&c);
    tcli_greedy g;
    tcli_load_greedy(&c, &g);
    char lp[600];
    snprintf(lp, sizeof lp, "%s/logits.f32", c.dir);
    // prefill only: one row per prompt position, BOS included; stdout is the prompt
    cr_assert_eq(tcli_run(&c, (char *[]){tcli_djinn_path, c.model, "-p", "Once upon a time", "-n", "0", "--logits", lp, NULL}), 0);
    size_t n;
    char *out = tcli_stdout(&c, NULL);
    cr_assert_str_eq(out, "Once upon a time\n");
    free(tc_read(lp, &n));
    cr_assert_eq(n, 5 * TCLI_VOCAB * sizeof(float), "-n 0: %zu bytes", n);
    // 20 greedy tokens: 25 rows, and each row's argmax is the next greedy id
    cr_assert_eq(tcli_run(&c, (char *[]){tcli_djinn_path, c.model, "-p", "Once upon a time", "-n", "20", "-t", "0",
                                         "--logits", lp, NULL}), 0);
    float *rows = (float *)tc_read(lp, &n);
    cr_assert_eq(n, 25 * TCLI_VOCAB * sizeof(float), "-n 20: %zu bytes", n);
    for (int t = 4; t < 24; t++) {
        int best = 0;
        for (int i = 1; i < TCLI_VOCAB; i++)
            if (rows[t * TCLI_VOCAB + i] > rows[t * TCLI_VOCAB + best]) best = i;
        cr_assert_eq(best, g.ids[t + 1], "row %d: argmax %d, greedy id %d", t, best, g.ids[t + 1]);
    }
    free(rows), free(out), free(g.text);
    tcli_teardown(&c);
}

// Writes a reference file (format in djinn.c / tools/reference.py).
static void tcli_write_ref(const char *path, const int32_t *ids, uint32_t n, uint32_t n_prompt, const float *logits,
                           uint32_t vocab) {
    FILE *f = fopen(path, "wb");
    cr_assert(f);
    uint32_t h[4] = {1, n, n_prompt, vocab};
    fwrite("DJINNREF", 1, 8, f);
    fwrite(h, 4, 4, f);
    fwrite(ids, 4, n, f);
    fwrite(logits, 4, (size_t)n * vocab, f);
    fclose(f);
}

Test(cli, check_against_own_logits) {
    tcli_ctx c;
    tcli_setup(&c);
    tcli_greedy g;
    tcli_load_greedy(&c, &g);
    char lp[600], rp[600];
    snprintf(lp, sizeof lp, "%s/logits.f32", c.dir);
    snprintf(rp, sizeof rp, "%s/ref.bin", c.dir);
    // f32 caches: on the GPU machine generation runs on the GPU, the check on the CPU, and their f16 caches' rows may
    // round apart by an ulp, past this test's 1e-5 (each type's own tolerance is check.c's)
    cr_assert_eq(tcli_run(&c, (char *[]){tcli_djinn_path, c.model, "-p", "Once upon a time", "-n", "200", "-t", "0",
                                         "--logits", lp, "--kv-type", "f32", NULL}), 0);
    size_t n;
    float *rows = (float *)tc_read(lp, &n);
    uint32_t T = (uint32_t)g.n_ids;
    cr_assert_eq(n, (size_t)T * TCLI_VOCAB * 4);
    // The same ids teacher-forced in one prefill give the logits generation gave, up to rounding.
    tcli_write_ref(rp, g.ids, T, 5, rows, TCLI_VOCAB);
    int rc = tcli_run(&c, (char *[]){tcli_djinn_path, c.model, "--check", rp, "--cpu", "--tol", "1e-5", "--kv-type",
                                     "f32", NULL});
    char *out = tcli_stdout(&c, NULL);
    cr_assert_eq(rc, 0, "check failed: %s %s", out, tcli_stderr(&c));
    cr_assert(strstr(out, "PASSED") && strstr(out, "top1 205/205"), "%s", out);
    free(out);
    // One wrong logit in the middle: above tolerance, exit 3.
    rows[100 * TCLI_VOCAB + 17] += 5.0f;
    tcli_write_ref(rp, g.ids, T, 5, rows, TCLI_VOCAB);
    rc = tcli_run(&c, (char *[]){tcli_djinn_path, c.model, "--check", rp, NULL});
    out = tcli_stdout(&c, NULL);
    cr_assert_eq(rc, 3, "a perturbed reference passed: %s", out);
    cr_assert(strstr(out, "FAILED") && strstr(out, "position 100"), "%s", out);
    free(out);
    // Another vocabulary, a bad magic, a truncated file: errors, exit 1.
    tcli_write_ref(rp, g.ids, 3, 1, rows, 100);
    tcli_expect_fail(&c, (char *[]){tcli_djinn_path, c.model, "--check", rp, NULL}, 1, "vocab");
    tc_write(rp, "NOTAREF!", 8);
    tcli_expect_fail(&c, (char *[]){tcli_djinn_path, c.model, "--check", rp, NULL}, 1, "reference");
    tcli_write_ref(rp, g.ids, T, 5, rows, TCLI_VOCAB);
    cr_assert_eq(truncate(rp, 1000), 0);
    tcli_expect_fail(&c, (char *[]){tcli_djinn_path, c.model, "--check", rp, NULL}, 1, "truncated");
    free(rows), free(g.text);
    tcli_teardown(&c);
}

// The references made with tools/make_refs.sh on the GPU machine (HF in float64), committed under tests/ref,
// with their random-weight checkpoints under tests/fixtures. Each must be there, and the CPU within 1e-4
// relative L2 of it at every position.
Test(cli, check_committed_references, .timeout = 300) {
    static const char *names[] = {"stories260K", "llama3_gqa_bf16", "tied_gqa_f16", "mha_untied_f16"};
    tcli_ctx c;
    tcli_setup(&c);
    tcli_need_tests(&c);
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
        char ref[1300], model[600];
        if (!strcmp(names[i], "stories260K"))
            snprintf(model, sizeof model, "%s", c.model);
        else
            tcli_convert_fixture(&c, names[i], model, sizeof model);
        snprintf(ref, sizeof ref, "%s/ref/%s.bin", c.tests, names[i]);
        cr_assert(!access(ref, R_OK), "%s is missing (tools/make_refs.sh makes it on the GPU machine)", ref);
        // the f32 KV cache at 1e-4; the default one (f16) at its type's default tolerance (check.h)
        for (int kv = 0; kv < 2; kv++) {
            char *argv[] = {tcli_djinn_path, model, "--check", ref, "--cpu", "--kv-type", "f32", "--tol", "1e-4", NULL};
            if (kv) argv[5] = NULL;
            int rc = tcli_run(&c, argv);
            char *out = tcli_stdout(&c, NULL);
            const char *summary = strstr(out, "overall:"), *kv_name = kv ? dj_kv_name(DJ_KV_DEFAULT) : "f32";
            cr_assert(rc == 0 && strstr(out, "check PASSED"), "%s, %s KV: CPU logits off the HF reference (exit %d): "
                      "%s\n%s", names[i], kv_name, rc, summary ? summary : out, tcli_stderr(&c));
            cr_log_info("%s, %s KV: %s", names[i], kv_name, summary ? summary : "");
            free(out);
        }
    }
    tcli_teardown(&c);
}

// ---- hostile files and failing writes (issue 14)
// One line on stderr, the exit status, stdout empty: tcli_expect_fail, with stderr naming `in_stderr`.
static int tcli_same_inode(const char *a, const struct stat *before) {
    struct stat now;
    return stat(a, &now) == 0 && now.st_ino == before->st_ino && now.st_size == before->st_size &&
           now.st_mtim.tv_sec == before->st_mtim.tv_sec && now.st_mtim.tv_nsec == before->st_mtim.tv_nsec;
}

// stdout that cannot be written (a full disk: /dev/full) is an error, not a silent exit 0.
Test(cli, stdout_write_error_fails) {
    tcli_ctx c;
    tcli_setup(&c);
    char *d = tcli_djinn_path, *m = c.model;
    char *const runs[][10] = {{d, m, "-p", "Once upon a time", "-n", "5", "-t", "0", NULL},
                              {d, m, "--tokenize", "-p", "Once upon a time", NULL}};
    for (int i = 0; i < 2; i++) {
        int rc = tcli_run_to(&c, runs[i], "/dev/full", 0);
        char *err = tcli_stderr(&c);
        cr_assert_eq(rc, 1, "run %d: exit %d with stdout on a full disk: %s", i, rc, err);
        cr_assert(strstr(err, "cannot write to stdout") && strstr(err, "No space left"), "run %d: %s", i, err);
        free(err);
    }
    // --check's table too
    char lp[600], rp[600];
    snprintf(lp, sizeof lp, "%s/logits.f32", c.dir);
    snprintf(rp, sizeof rp, "%s/ref.bin", c.dir);
    cr_assert_eq(tcli_run(&c, (char *[]){d, m, "-p", "Once", "-n", "2", "-t", "0", "--logits", lp, NULL}), 0);
    size_t n;
    float *rows = (float *)tc_must_read(lp, &n);
    int32_t ids[4];
    cr_assert_eq(tcli_run(&c, (char *[]){d, m, "--tokenize", "-p", "Once", NULL}), 0);
    char *toks = tcli_stdout(&c, NULL);
    uint32_t k = 0;
    for (char *t = strtok(toks, " \n"); t && k < 4; t = strtok(NULL, " \n")) ids[k++] = atoi(t);
    free(toks);
    cr_assert(k >= 1 && n >= k * TCLI_VOCAB * 4);
    tcli_write_ref(rp, ids, k, k, rows, TCLI_VOCAB);
    free(rows);
    int rc = tcli_run_to(&c, (char *[]){d, m, "--check", rp, NULL}, "/dev/full", 0);
    char *err = tcli_stderr(&c);
    cr_assert(rc == 1 && strstr(err, "cannot write to stdout"), "--check on a full stdout: exit %d: %s", rc, err);
    free(err);
    // --help and --version too (--help's exit 0, --version's silent exit 1)
    char *const info[][3] = {{d, "--help", NULL}, {d, "--version", NULL}, {d, "serve", "--help"}};
    for (int i = 0; i < 3; i++) {
        char *argv[] = {info[i][0], info[i][1], info[i][2], NULL};
        rc = tcli_run_to(&c, argv, "/dev/full", 0);
        err = tcli_stderr(&c);
        cr_assert(rc == 1 && strstr(err, "cannot write to stdout: No space left"), "%s %s on a full stdout: exit %d: %s",
                  info[i][1], info[i][2] ? info[i][2] : "", rc, err);
        free(err);
    }
    tcli_teardown(&c);
}

// Starts argv with stdin from fd `in`, stdout to fd `out`, stderr to the context's file, and SIGPIPE at its default
// action, as a shell leaves it (this runner may ignore it, and a child would inherit that).
static pid_t tcli_spawn(tcli_ctx *c, char *const argv[], int in, int out) {
    pid_t pid = fork();
    cr_assert_geq(pid, 0, "fork failed");
    if (pid == 0) {
        int e = open(c->err, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (e < 0) _exit(126);
        dup2(in, 0), dup2(out, 1), dup2(e, 2);
        signal(SIGPIPE, SIG_DFL);
        execv(argv[0], argv);
        _exit(127);
    }
    return pid;
}

// The status of pid once it ends (killed after 20 s: a hang).
static int tcli_wait(pid_t pid) {
    int st;
    for (int i = 0; i < 2000; i++, usleep(10000))
        if (waitpid(pid, &st, WNOHANG) == pid) return st;
    kill(pid, SIGKILL), waitpid(pid, &st, 0);
    cr_assert_fail("djinn hung: killed after 20 s");
    return st;
}

// The files of the run's outputs (o.*) left in the folder, in one string ("" when none).
static void tcli_outputs_left(tcli_ctx *c, char *left, size_t n) {
    left[0] = 0;
    DIR *d = opendir(c->dir);
    for (struct dirent *de; (de = readdir(d));)
        if (!strncmp(de->d_name, "o.", 2)) snprintf(left + strlen(left), n - strlen(left), " %s", de->d_name);
    closedir(d);
}

// A reader gone (djinn ... | head -c1) is a failed write to stdout like any other: one line, exit 1, no output file
// left, not a silent death by SIGPIPE (exit 141 in a shell).
Test(cli, closed_pipe_on_stdout_fails) {
    tcli_ctx c;
    tcli_setup(&c);
    char ses[600], st[600], left[2000];
    snprintf(ses, sizeof ses, "%s/o.ses", c.dir), snprintf(st, sizeof st, "%s/o.json", c.dir);
    int p[2], in = open("/dev/null", O_RDONLY);
    cr_assert(!pipe(p) && in >= 0);
    close(p[0]);  // no reader from the start: djinn's first write meets EPIPE
    pid_t pid = tcli_spawn(&c, (char *[]){tcli_djinn_path, c.model, "-p", "Once upon a time", "-n", "20", "-t", "0",
                                         "--cpu", "--save-session", ses, "--stats-json", st, NULL}, in, p[1]);
    close(p[1]), close(in);
    int s = tcli_wait(pid);
    char *err = tcli_stderr(&c);
    cr_assert(WIFEXITED(s) && WEXITSTATUS(s) == 1, "status %#x (killed by signal %d): %s", s,
              WIFSIGNALED(s) ? WTERMSIG(s) : 0, err);
    cr_assert(strstr(err, "djinn: cannot write to stdout: Broken pipe\n"), "%s", err);
    tcli_outputs_left(&c, left, sizeof left);
    cr_assert_str_eq(left, "", "a failed run left its outputs");
    free(err);
    tcli_teardown(&c);
}

// SIGTERM, SIGHUP or a second Ctrl-C kill the run at once; it first removes the PATH.tmp of every output it had
// created (as the converter does), then dies of that signal. The run waits on its prompt from stdin, every output
// open.
Test(cli, killed_run_leaves_no_tmp) {
    tcli_ctx c;
    tcli_setup(&c);
    char ses[600], lg[600], st[600], act[600], tmp[700], left[2000];
    snprintf(ses, sizeof ses, "%s/o.ses", c.dir), snprintf(lg, sizeof lg, "%s/o.logits", c.dir);
    snprintf(st, sizeof st, "%s/o.json", c.dir), snprintf(act, sizeof act, "%s/o.act", c.dir);
    snprintf(tmp, sizeof tmp, "%s.tmp", act);  // the last one opened
    const int sigs[][2] = {{SIGTERM, 0}, {SIGHUP, 0}, {SIGINT, SIGINT}};
    for (int k = 0; k < 3; k++) {
        int p[2], out = open(c.out, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        cr_assert(!pipe(p) && out >= 0);
        pid_t pid = tcli_spawn(&c, (char *[]){tcli_djinn_path, c.model, "-f", "-", "-n", "3", "--cpu", "--save-session",
                                             ses, "--logits", lg, "--stats-json", st, "--dump-act", "all", act,
                                             NULL}, p[0], out);
        close(p[0]), close(out);
        for (int i = 0; i < 1000 && access(tmp, F_OK); i++) usleep(10000);
        cr_assert(!access(tmp, F_OK), "signal %d: %s never appeared: %s", sigs[k][0], tmp, tcli_stderr(&c));
        kill(pid, sigs[k][0]);
        if (sigs[k][1]) usleep(200000), kill(pid, sigs[k][1]);  // the first Ctrl-C waits for the prompt: the second kills
        int s = tcli_wait(pid);
        close(p[1]);
        cr_assert(WIFSIGNALED(s) && WTERMSIG(s) == sigs[k][0], "signal %d: status %#x: %s", sigs[k][0], s,
                  tcli_stderr(&c));
        tcli_outputs_left(&c, left, sizeof left);
        cr_assert_str_eq(left, "", "killed by signal %d: left behind", sigs[k][0]);
    }
    tcli_teardown(&c);
}

// --logits and --stats-json never replace an input or each other, never write into a special file, and a run that
// fails leaves neither behind.
Test(cli, outputs_never_replace_inputs) {
    tcli_ctx c;
    tcli_setup(&c);
    char *d = tcli_djinn_path, *m = c.model, lp[600], sp[600], fifo[600];
    struct stat before;
    cr_assert_eq(stat(m, &before), 0);
    snprintf(lp, sizeof lp, "%s/logits.f32", c.dir);
    snprintf(sp, sizeof sp, "%s/stats.json", c.dir);
    snprintf(fifo, sizeof fifo, "%s/fifo", c.dir);
    cr_assert_eq(mkfifo(fifo, 0644), 0);
    tcli_expect_fail(&c, (char *[]){d, m, "-p", "x", "-n", "1", "--logits", m, NULL}, 1, "same file as");
    tcli_expect_fail(&c, (char *[]){d, m, "-p", "x", "-n", "1", "--stats-json", m, NULL}, 1, "same file as");
    tcli_expect_fail(&c, (char *[]){d, m, "-p", "x", "-n", "1", "--logits", lp, "--stats-json", lp, NULL}, 1,
                     "same file as");
    tcli_expect_fail(&c, (char *[]){d, m, "-p", "x", "-n", "1", "--logits", fifo, NULL}, 1, "a FIFO");
    tcli_expect_fail(&c, (char *[]){d, m, "-p", "x", "-n", "1", "--stats-json", "/dev/null", NULL}, 1,
                     "a character device");
    tcli_expect_fail(&c, (char *[]){d, m, "-p", "x", "-n", "1", "--logits", c.dir, NULL}, 1, "a folder");
    tcli_expect_fail(&c, (char *[]){d, m, "-p", "x", "--logits", lp, "--check", m, NULL}, 2, "not with --check");
    // nor a prompt file, a steering vector or a session loaded: each left as it was (a prompt read with -f was
    // once replaced by the logits)
    char pf[600], vf[600], vec[64 * 4];
    snprintf(pf, sizeof pf, "%s/prompt.txt", c.dir);
    snprintf(vf, sizeof vf, "%s/vec.f32", c.dir);
    memset(vec, 0, sizeof vec);
    tc_write(pf, "Once upon a time", 16);
    tc_write(vf, vec, sizeof vec);
    char sv[640];
    snprintf(sv, sizeof sv, "0:%s", vf);
    tcli_expect_fail(&c, (char *[]){d, m, "-f", pf, "-n", "1", "--logits", pf, NULL}, 1, "same file as");
    tcli_expect_fail(&c, (char *[]){d, m, "-f", pf, "-n", "1", "--stats-json", pf, NULL}, 1, "same file as");
    tcli_expect_fail(&c, (char *[]){d, m, "-p", "x", "-n", "1", "--steer", sv, "--logits", vf, NULL}, 1,
                     "same file as");
    tcli_expect_fail(&c, (char *[]){d, m, "-p", "x", "-n", "1", "--steer", sv, "--stats-json", vf, NULL}, 1,
                     "same file as");
    tcli_expect_fail(&c, (char *[]){d, m, "-n", "1", "--load-session", pf, "--stats-json", pf, NULL}, 1,
                     "same file as");
    size_t pn, vn;
    char *pb = tc_must_read(pf, &pn), *vb = tc_must_read(vf, &vn);
    cr_assert(pn == 16 && !memcmp(pb, "Once upon a time", 16), "the prompt file was written to");
    cr_assert(vn == sizeof vec && !memcmp(vb, vec, sizeof vec), "the steering vector was written to");
    free(pb), free(vb);
    cr_assert(tcli_same_inode(m, &before), "the model was touched");
    cr_assert(access(lp, F_OK) && access(sp, F_OK), "an output was left behind by a refused run");
    // stdout appended to the prompt file
    int rcp = tcli_run_to(&c, (char *[]){d, m, "-f", pf, "-n", "1", NULL}, pf, 1);
    char *errp = tcli_stderr(&c);
    cr_assert(rcp == 1 && strstr(errp, "stdout is") && strstr(errp, "input"), "exit %d: %s", rcp, errp);
    free(errp);
    // stdout appended to the model
    int rc = tcli_run_to(&c, (char *[]){d, m, "-p", "x", "-n", "1", NULL}, m, 1);
    char *err = tcli_stderr(&c);
    cr_assert(rc == 1 && strstr(err, "stdout is") && strstr(err, "input"), "exit %d: %s", rc, err);
    free(err);
    cr_assert(tcli_same_inode(m, &before), "the model was written to");
    // a failure after the outputs were opened (the prompt is too long) removes their temporary files
    tcli_expect_fail(&c, (char *[]){d, m, "-p", "Once upon a time there was", "-c", "3", "--logits", lp,
                                    "--stats-json", sp, NULL}, 1, "longer than the context");
    char tmp[700];
    snprintf(tmp, sizeof tmp, "%s.tmp", lp);
    cr_assert(access(lp, F_OK) && access(tmp, F_OK), "a failed run left %s or its .tmp", lp);
    // a complete run renames both into place
    cr_assert_eq(tcli_run(&c, (char *[]){d, m, "-p", "x", "-n", "2", "-t", "0", "--logits", lp, "--stats-json", sp,
                                         NULL}), 0);
    cr_assert(!access(lp, F_OK) && !access(sp, F_OK) && access(tmp, F_OK));
    tcli_teardown(&c);
}

// A FIFO as the model or the reference is refused at once (opened without waiting for a writer).
Test(cli, special_files_as_inputs) {
    tcli_ctx c;
    tcli_setup(&c);
    char fifo[600];
    snprintf(fifo, sizeof fifo, "%s/fifo", c.dir);
    cr_assert_eq(mkfifo(fifo, 0644), 0);
    tcli_expect_fail(&c, (char *[]){tcli_djinn_path, fifo, "-p", "x", NULL}, 1, "a FIFO");
    tcli_expect_fail(&c, (char *[]){tcli_djinn_path, c.model, "--check", fifo, NULL}, 1, "a FIFO");
    tcli_expect_fail(&c, (char *[]){tcli_djinn_path, "/dev/zero", "-p", "x", NULL}, 1, "a character device");
    tcli_expect_fail(&c, (char *[]){tcli_djinn_path, c.model, "--check", c.dir, NULL}, 1, "a folder");
    tcli_teardown(&c);
}

// A model whose weights hold a NaN (the converter refuses such checkpoints; this file is edited after it):
// generation stops with one line, whatever the sampler (ASan: nothing read out of bounds).
Test(cli, non_finite_logits_stop_cleanly) {
    tcli_ctx c;
    tcli_setup(&c);
    size_t n;
    uint8_t *img = (uint8_t *)tc_must_read(c.model, &n);
    dj_model_info info;
    dj_err e;
    cr_assert_eq(model_parse(img, n, n, &info, &e), 0, "%s", e.msg);
    const float nan = NAN;
    memcpy(img + info.layer_off[1] + info.layer.wo + 40, &nan, 4);  // layer 1's output projection (f32)
    dj_info_free(&info);
    char bad[600];
    snprintf(bad, sizeof bad, "%s/nan.bin", c.dir);
    tc_write(bad, img, n);
    free(img);
    const char *temps[] = {"0", "1", "0.7"};
    for (int i = 0; i < 3; i++) {
        int rc = tcli_run(&c, (char *[]){tcli_djinn_path, bad, "-p", "Once upon a time", "-n", "4", "-t",
                                         (char *)temps[i], "-s", "1", NULL});
        char *err = tcli_stderr(&c);
        cr_assert_eq(rc, 1, "-t %s: exit %d: %s", temps[i], rc, err);
        cr_assert(strstr(err, "NaN or infinity"), "-t %s: %s", temps[i], err);
        free(err);
    }
    tcli_teardown(&c);
}

// A reference longer than the model's context is refused as -c of that size is; a tokenizer section with more
// tokens than the model's vocabulary is refused at load, not at the first out-of-range token.
Test(cli, reference_and_tokenizer_beyond_the_model) {
    tcli_ctx c;
    tcli_setup(&c);
    enum { T = 513 };  // stories260K's context is 512
    int32_t *ids = calloc(T, 4);
    float *lg = calloc((size_t)T * TCLI_VOCAB, 4);
    char rp[600];
    snprintf(rp, sizeof rp, "%s/long.bin", c.dir);
    tcli_write_ref(rp, ids, T, 1, lg, TCLI_VOCAB);
    free(ids), free(lg);
    tcli_expect_fail(&c, (char *[]){tcli_djinn_path, c.model, "--check", rp, "--cpu", NULL}, 1, "context of 512");
    // the same tokenizer over a model of 300 tokens
    size_t n;
    uint8_t *img = (uint8_t *)tc_must_read(c.model, &n);
    dj_model_info info, small;
    dj_err e;
    cr_assert_eq(model_parse(img, n, n, &info, &e), 0, "%s", e.msg);
    dj_config cfg = info.config;
    cfg.vocab_size = 300;
    cr_assert_eq(model_plan(&cfg, info.tok_size, &small, &e), 0, "%s", e.msg);
    uint8_t *out = calloc(1, small.file_size);
    uint64_t hb = model_header_bytes(cfg.n_layers);
    cr_assert_eq(model_write_header(&small, out, hb, &e), 0, "%s", e.msg);
    memcpy(out + small.tok_off, img + info.tok_off, info.tok_size);
    char sp[600];
    snprintf(sp, sizeof sp, "%s/small_vocab.bin", c.dir);
    tc_write(sp, out, small.file_size);
    free(out), free(img);
    dj_info_free(&info), dj_info_free(&small);
    tcli_expect_fail(&c, (char *[]){tcli_djinn_path, sp, "-p", "x", "--cpu", NULL}, 1, "vocabulary is 300");
    tcli_teardown(&c);
}

// A temperature that underflows to a tiny double is a temperature, not a negative number, and one that is 0 in the
// sampler's float is greedy: the reference greedy text, byte for byte (the seed would give another text if it
// sampled).
Test(cli, tiny_temperature_is_accepted) {
    tcli_ctx c;
    tcli_setup(&c);
    tcli_greedy g;
    tcli_load_greedy(&c, &g);
    char *out = tcli_text(&c, (char *[]){tcli_djinn_path, c.model, "-p", "Once upon a time", "-n", "200", "-t",
                                         "1e-308", "-s", "1", "--cpu", NULL});
    char *want = tcli_expected_text(&g);
    cr_assert_str_eq(out, want, "-t 1e-308 did not give the greedy text:\n%s\n---- expected:\n%s", out, want);
    free(out), free(want), free(g.text);
    tcli_teardown(&c);
}

// valgrind on a CPU generation: no leak of any kind (the thread pool is joined at exit), no invalid access. The
// suppressions (tests/valgrind.supp) cover only an over-read inside glibc's loader, before main().
Test(cli, valgrind_clean_cpu_generation, .timeout = 300) {
#ifdef DJ_TEST_ASAN
    cr_skip_test("ASan build: valgrind does not run ASan binaries (runs in the plain 'make test')");
#endif
    if (system("command -v valgrind > /dev/null 2>&1"))
        cr_skip_test("valgrind is not installed ('make test' installs it when run as root)");
    tcli_ctx c;
    tcli_setup(&c);
    tcli_need_tests(&c);
    char supp[1200];
    snprintf(supp, sizeof supp, "--suppressions=%s/valgrind.supp", c.tests);
    char *argv[] = {"/bin/sh", "-c", NULL, NULL};
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "exec valgrind -q --leak-check=full --errors-for-leak-kinds=definite,indirect,possible "
                              "--error-exitcode=9 %s %s %s -p 'Once upon a time' -n 6 -t 0.8 -s 3 --cpu", supp,
             tcli_djinn_path, c.model);
    argv[2] = cmd;
    // A bound on a hang, not a timing: under valgrind the run takes tens of seconds, past tcli_run's minute on a busy
    // machine, so it gets nearly the test's whole timeout.
    int rc = tc_run(argv, "/dev/null", c.out, 0, c.err, 280);
    char *err = tcli_stderr(&c);
    cr_assert_eq(rc, 0, "valgrind found errors or leaks (exit %d): %s", rc, err);
    free(err);
    tcli_teardown(&c);
}

// ---- probes (probe.h) and sessions (session.h)
// The text of `argv` with one more flag at its end (NULL: none), which must succeed.
#define TCLI_ARGV(...) ((char *[]){tcli_djinn_path, __VA_ARGS__, NULL})

// --dump-act: the run's text is unchanged, and the file holds a record per processed position and listed layer
// (the prompt's 5, then each generated token but the last), its header saying so.
Test(cli, dump_act_file) {
    tcli_ctx c;
    tcli_setup(&c);
    char act[600];
    snprintf(act, sizeof act, "%s/act.bin", c.dir);
    char *want = tcli_text(&c, TCLI_ARGV(c.model, "-p", "Once upon a time", "-n", "8", "-t", "0", "--cpu"));
    char *got = tcli_text(&c, TCLI_ARGV(c.model, "-p", "Once upon a time", "-n", "8", "-t", "0", "--cpu", "--dump-act",
                                        "4,0", act));
    cr_assert_str_eq(got, want, "--dump-act changed the text");
    size_t n;
    uint8_t *b = (uint8_t *)tc_must_read(act, &n);
    uint64_t nrec, rb;
    memcpy(&nrec, b + 24, 8), memcpy(&rb, b + 32, 8);
    cr_assert(!memcmp(b, "DJINNACT", 8) && nrec == 12 * 2 && n == 256 + nrec * rb && b[64] == 0x11,
              "%zu bytes, %llu records", n, (unsigned long long)nrec);
    int pos_seen[12] = {0};
    for (uint64_t r = 0; r < nrec; r++) {
        uint32_t h[4];
        memcpy(h, b + 256 + r * rb, 16);
        cr_assert((h[0] == 0 || h[0] == 4) && h[1] < 12 && h[3] == 0, "record %llu: layer %u pos %u slot %u",
                  (unsigned long long)r, h[0], h[1], h[3]);
        pos_seen[h[1]]++;
    }
    for (int p = 0; p < 12; p++) cr_assert_eq(pos_seen[p], 2, "position %d", p);
    free(b), free(want), free(got);
    tcli_teardown(&c);
}

// --steer: a zero vector gives the --logits file byte for byte and the same text; a vector of the stream's size
// changes the text; two --steer on one layer add up (v and -v: the zero vector).
static void tcli_steer_case(tcli_ctx *c, char *engine) {
    char zero[600], vec[600], zl[600], pl[600], z[650], v1[650], v2[650];
    snprintf(zero, sizeof zero, "%s/zero.bin", c->dir), snprintf(vec, sizeof vec, "%s/v.bin", c->dir);
    snprintf(zl, sizeof zl, "%s/zero.logits", c->dir), snprintf(pl, sizeof pl, "%s/plain.logits", c->dir);
    float v[64] = {0};
    tc_write(zero, v, sizeof v);
    for (int i = 0; i < 64; i++) v[i] = (i % 7 - 3) * 0.9f;
    tc_write(vec, v, sizeof v);
    snprintf(z, sizeof z, "2:%s", zero), snprintf(v1, sizeof v1, "3:%s:1.5", vec), snprintf(v2, sizeof v2, "3:%s:-1.5", vec);
    char *plain = tcli_text(c, TCLI_ARGV(c->model, "-p", "Once upon a time", "-n", "30", "-t", "0", "--logits", pl,
                                         engine));
    char *zt = tcli_text(c, TCLI_ARGV(c->model, "-p", "Once upon a time", "-n", "30", "-t", "0", "--logits", zl,
                                      "--steer", z, engine));
    cr_assert_str_eq(zt, plain, "a zero vector changed the text");
    size_t n1, n2;
    char *a = tc_must_read(pl, &n1), *b = tc_must_read(zl, &n2);
    cr_assert(n1 == n2 && n1 == 35ull * TCLI_VOCAB * 4 && !memcmp(a, b, n1), "a zero vector changed the logits");
    char *st = tcli_text(c, TCLI_ARGV(c->model, "-p", "Once upon a time", "-n", "30", "-t", "0", "--steer", v1,
                                      engine));
    cr_assert_str_neq(st, plain, "a vector of the stream's size left the text as it was");
    char *both = tcli_text(c, TCLI_ARGV(c->model, "-p", "Once upon a time", "-n", "30", "-t", "0", "--steer", v1,
                                        "--steer", v2, engine));
    cr_assert_str_eq(both, plain, "v and -v on one layer did not cancel");
    free(plain), free(zt), free(a), free(b), free(st), free(both);
}

Test(cli, steer_zero_vector_is_bitwise) {
    tcli_ctx c;
    tcli_setup(&c);
    tcli_steer_case(&c, "--cpu");
    tcli_teardown(&c);
}

// Bad lists, layers the model lacks, vectors of the wrong size, outputs over inputs: one line each, nothing on stdout.
Test(cli, probe_refusals) {
    tcli_ctx c;
    tcli_setup(&c);
    char act[600], shortv[600], s1[700], s2[700];
    snprintf(act, sizeof act, "%s/act.bin", c.dir), snprintf(shortv, sizeof shortv, "%s/short.bin", c.dir);
    tc_write(shortv, "12345678", 8);
    snprintf(s1, sizeof s1, "1:%s", shortv), snprintf(s2, sizeof s2, "1:%s/absent.bin", c.dir);
    char *m = c.model;
    tcli_expect_fail(&c, TCLI_ARGV(m, "-n", "2", "--cpu", "--dump-act", "0,x", act), 2,
                     "--dump-act: layer list: 'x' is not a layer number (see djinn --help)");
    tcli_expect_fail(&c, TCLI_ARGV(m, "-n", "2", "--cpu", "--dump-act", "5", act), 2,
                     "--dump-act: layer list: layer 5 does not exist (the model has 5 layers: 0 to 4)");
    tcli_expect_fail(&c, TCLI_ARGV(m, "-n", "2", "--cpu", "--dump-act", "0"), 2, "'--dump-act' needs LAYERS and FILE");
    tcli_expect_fail(&c, TCLI_ARGV(m, "-n", "2", "--cpu", "--dump-act", "0", m), 1, "--dump-act");
    tcli_expect_fail(&c, TCLI_ARGV(m, "-n", "2", "--cpu", "--steer", "2"), 2, "--steer: '2' is not LAYER:FILE[:SCALE]");
    tcli_expect_fail(&c, TCLI_ARGV(m, "-n", "2", "--cpu", "--steer", s1), 1,
                     "holds 8 bytes, not a vector of the model's 64 floats (256 bytes)");
    tcli_expect_fail(&c, TCLI_ARGV(m, "-n", "2", "--cpu", "--steer", s2), 1, "absent.bin");
    tcli_expect_fail(&c, TCLI_ARGV(m, "-n", "2", "--cpu", "--steer", s1, "--dump-act", "0", shortv), 1, "--dump-act");
    tcli_expect_fail(&c, TCLI_ARGV(m, "--tokenize", "--dump-act", "0", act), 2, "not with --tokenize");
    // a vector whose scale overflows a float: refused before any text (it failed after the prompt, blaming the
    // model's arithmetic); a file far past a vector's size says its limit in bytes, not "0 MB"
    char onesv[600], bigv[600], s3[700], s4[700];
    snprintf(onesv, sizeof onesv, "%s/ones.bin", c.dir), snprintf(bigv, sizeof bigv, "%s/big.bin", c.dir);
    float ones[64], big[2048] = {0};
    for (int i = 0; i < 64; i++) ones[i] = 1.0f;
    tc_write(onesv, ones, sizeof ones), tc_write(bigv, big, sizeof big);
    snprintf(s3, sizeof s3, "1:%s:1e300", onesv), snprintf(s4, sizeof s4, "1:%s", bigv);
    tcli_expect_fail(&c, TCLI_ARGV(m, "-n", "2", "--cpu", "--steer", s3), 1, "overflows a float");
    tcli_expect_fail(&c, TCLI_ARGV(m, "-n", "2", "--cpu", "--steer", s4), 1, "bytes such a file may have");
    struct stat st;
    cr_assert(stat(act, &st) && !stat(shortv, &st) && st.st_size == 8, "a refused run left or replaced a file");
    tcli_teardown(&c);
}

// `save` stopped by Ctrl-C before new token `at` (exit 130), then `resume`: the text `full`.
static void tcli_resume_after_ctrl_c(tcli_ctx *c, char *const save[], const char *at, char *const resume[],
                                     const char *full) {
    setenv("DJINN_TEST_SIGINT_AT", at, 1);
    int rc = tcli_run(c, save);
    unsetenv("DJINN_TEST_SIGINT_AT");
    cr_assert_eq(rc, 130, "Ctrl-C with --save-session: exit %d: %s", rc, tcli_stderr(c));
    char *t = tcli_text(c, resume);
    cr_assert_str_eq(t, full, "resumed after Ctrl-C at %s", at);
    free(t);
}

// A run saved and resumed gives the uninterrupted run's text: greedy and sampled (with penalties: their window
// comes back), resumed twice in a row, from a prompt alone (-n 0), from a run stopped by Ctrl-C, and from one that
// wrote --logits (its last token fed, nothing picked). -s on resume reseeds.
static void tcli_session_case(tcli_ctx *c, char *engine) {
    char s1[600], s2[600], lg[600];
    snprintf(s1, sizeof s1, "%s/a.ses", c->dir), snprintf(s2, sizeof s2, "%s/b.ses", c->dir);
    snprintf(lg, sizeof lg, "%s/l.logits", c->dir);
    char *P = "Once upon a time";
    char *full = tcli_text(c, TCLI_ARGV(c->model, "-p", P, "-n", "40", "-t", "0", engine));
    char *t = tcli_text(c, TCLI_ARGV(c->model, "-p", P, "-n", "15", "-t", "0", "--save-session", s1, engine));
    cr_assert(strlen(t) < strlen(full) && !strncmp(t, full, strlen(t) - 1), "the first part: %s", t);
    free(t);
    t = tcli_text(c, TCLI_ARGV(c->model, "--load-session", s1, "-n", "25", engine));
    cr_assert_str_eq(t, full, "greedy, resumed");
    free(t);
    t = tcli_text(c, TCLI_ARGV(c->model, "--load-session", s1, "-n", "10", "--save-session", s2, engine));
    free(t);
    t = tcli_text(c, TCLI_ARGV(c->model, "--load-session", s2, "-n", "15", engine));
    cr_assert_str_eq(t, full, "greedy, resumed twice");
    free(t);
    t = tcli_text(c, TCLI_ARGV(c->model, "-p", P, "-n", "0", "--save-session", s1, engine));
    free(t);
    t = tcli_text(c, TCLI_ARGV(c->model, "--load-session", s1, "-n", "40", "-t", "0", engine));
    cr_assert_str_eq(t, full, "greedy, resumed after the prompt alone");
    free(t);
    t = tcli_text(c, TCLI_ARGV(c->model, "-p", P, "-n", "15", "-t", "0", "--logits", lg, "--save-session", s1, engine));
    free(t);
    t = tcli_text(c, TCLI_ARGV(c->model, "--load-session", s1, "-n", "25", engine));
    cr_assert_str_eq(t, full, "greedy, resumed after --logits");
    free(t);
    tcli_resume_after_ctrl_c(c, TCLI_ARGV(c->model, "-p", P, "-n", "40", "-t", "0", "--save-session", s1, engine),
                             "7", TCLI_ARGV(c->model, "--load-session", s1, "-n", "33", engine), full);
    free(full);

    full = tcli_text(c, TCLI_ARGV(c->model, "-p", P, "-n", "50", "-t", "0.9", "--top-k", "40", "--repeat-penalty",
                                  "1.3", "-s", "11", engine));
    t = tcli_text(c, TCLI_ARGV(c->model, "-p", P, "-n", "12", "-t", "0.9", "--top-k", "40", "--repeat-penalty",
                               "1.3", "-s", "11", "--save-session", s1, engine));
    free(t);
    t = tcli_text(c, TCLI_ARGV(c->model, "--load-session", s1, "-n", "38", engine));
    cr_assert_str_eq(t, full, "sampled, resumed");
    free(t);
    t = tcli_text(c, TCLI_ARGV(c->model, "--load-session", s1, "-n", "38", "-s", "12", engine));
    cr_assert_str_neq(t, full, "-s on resume did not reseed");
    free(t);
    // the token after the 9th is drawn already when Ctrl-C stops the run: the session keeps it
    tcli_resume_after_ctrl_c(c, TCLI_ARGV(c->model, "-p", P, "-n", "50", "-t", "0.9", "--top-k", "40",
                                          "--repeat-penalty", "1.3", "-s", "11", "--save-session", s1, engine),
                             "9", TCLI_ARGV(c->model, "--load-session", s1, "-n", "41", engine), full);
    free(full);
}

Test(cli, session_resumes_the_run) {
    tcli_ctx c;
    tcli_setup(&c);
    tcli_session_case(&c, "--cpu");
    tcli_teardown(&c);
}

// Another model, another context, a truncated or corrupt file, not a session at all: refused by name, nothing on
// stdout.
Test(cli, session_refusals) {
    tcli_ctx c;
    tcli_setup(&c);
    char ses[600], bad[600], other[600], src[1200];
    snprintf(ses, sizeof ses, "%s/a.ses", c.dir), snprintf(bad, sizeof bad, "%s/bad.ses", c.dir);
    snprintf(other, sizeof other, "%s/other.bin", c.dir);
    snprintf(src, sizeof src, "%s/models/stories260K", c.data);
    cr_assert_eq(tcli_run(&c, (char *[]){tcli_convert_path, src, other, "--dtype", "f16", "-q", NULL}), 0);
    char *t = tcli_text(&c, TCLI_ARGV(c.model, "-p", "Once upon a time", "-n", "10", "-t", "0", "--save-session", ses,
                                      "--cpu"));
    free(t);
    size_t n;
    char *b = tc_must_read(ses, &n);
    tcli_expect_fail(&c, TCLI_ARGV(other, "--load-session", ses, "--cpu"), 1, "was saved with another model");
    tcli_expect_fail(&c, TCLI_ARGV(c.model, "--load-session", ses, "-c", "100", "--cpu"), 1,
                     "was saved with a context of 512 tokens, this run's is 100: give -c 512");
    // saved at the default KV type (f16), resumed at another: refused by name
    char kv_want[100];
    snprintf(kv_want, sizeof kv_want, "holds its KV cache in %s; this run's is in q8: give --kv-type %s",
             dj_kv_name(DJ_KV_DEFAULT), dj_kv_name(DJ_KV_DEFAULT));
    tcli_expect_fail(&c, TCLI_ARGV(c.model, "--load-session", ses, "--kv-type", "q8", "--cpu"), 1, kv_want);
    tc_write(bad, b, n - 100);
    tcli_expect_fail(&c, TCLI_ARGV(c.model, "--load-session", bad, "--cpu"), 1, "is truncated");
    tc_write(bad, b, 100);
    tcli_expect_fail(&c, TCLI_ARGV(c.model, "--load-session", bad, "--cpu"), 1,
                     "is truncated: 100 bytes, less than a session header");
    b[72] ^= 1;  // n_tokens
    tc_write(bad, b, n);
    tcli_expect_fail(&c, TCLI_ARGV(c.model, "--load-session", bad, "--cpu"), 1, "is corrupt: its header");
    b[72] ^= 1, b[n - 5] ^= 0x40;  // a value of the KV cache
    tc_write(bad, b, n);
    tcli_expect_fail(&c, TCLI_ARGV(c.model, "--load-session", bad, "--cpu"), 1,
                     "is corrupt: its tokens and KV cache do not match their checksum");
    tcli_expect_fail(&c, TCLI_ARGV(c.model, "--load-session", c.model, "--cpu"), 1, "is not a djinn session file");
    tcli_expect_fail(&c, TCLI_ARGV(c.model, "--load-session", bad, "-p", "x", "--cpu"), 2, "not with -p");
    tcli_expect_fail(&c, TCLI_ARGV(c.model, "--save-session", c.model, "--cpu"), 1, "--save-session");
    tcli_expect_fail(&c, TCLI_ARGV(c.model, "--load-session", ses, "--save-session", ses, "--cpu"), 1, "--save-session");
    free(b);
    tcli_teardown(&c);
}

// The same on the GPU engine, resident (the decode graph: steering captured in it) and streamed.
Test(cli, probes_and_sessions_on_the_gpu) {
    if (gpu_count() == 0) cr_skip_test("no GPU: cudaGetDeviceCount found no usable device (runs on the GPU machine)");
    tcli_ctx c;
    tcli_setup(&c);
    // --steer runs on one GPU; the runs it is compared with too (with no --gpus they take every visible one)
    setenv("CUDA_VISIBLE_DEVICES", "0", 1);
    tcli_steer_case(&c, NULL);
    tcli_steer_case(&c, "--stream-all");
    tcli_session_case(&c, NULL);
    tcli_session_case(&c, "--stream-all");
    unsetenv("CUDA_VISIBLE_DEVICES");
    tcli_teardown(&c);
}
