// tests/common.c: helpers shared by the test files (common.h).
#include "common.h"

#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "../util.h"
#include "../model.h"
#include "../tokenizer.h"
#include "../convert/convert.h"
#include "../convert/tokjson.h"
#include "../loader.h"

// ---- the environment
const char *tc_data(void) {
    const char *d = getenv("DJINN_DATA");
    if (!d || !*d) cr_skip_test("DJINN_DATA is not set: run through 'make test' (DATA=../shared)");
    return d;
}

void tc_data_path(char *path, size_t n, const char *rel) {
    snprintf(path, n, "%s/%s", tc_data(), rel);
    if (access(path, R_OK)) cr_skip_test("shared data missing: %s not found", path);
}

const char *tc_tests_dir(void) {
    const char *t = getenv("DJINN_TESTS");
    return t && *t ? t : "tests";
}

const char *tc_bin_dir(void) {
    const char *b = getenv("DJINN_BIN");
    if (!b || !*b) cr_skip_test("DJINN_BIN is not set: run through 'make test'");
    return b;
}

// ---- files
char *tc_read(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    size_t cap = 1 << 16, len = 0, got;
    char *buf = malloc(cap + 1);
    cr_assert(buf, "out of memory reading %s", path);
    while ((got = fread(buf + len, 1, cap - len, f)) > 0) {
        len += got;
        if (len == cap) {
            cap *= 2;
            buf = realloc(buf, cap + 1);
            cr_assert(buf, "out of memory reading %s", path);
        }
    }
    cr_assert(!ferror(f), "read error on %s", path);
    fclose(f);
    buf[len] = 0;
    if (n) *n = len;
    return buf;
}

char *tc_must_read(const char *path, size_t *n) {
    char *b = tc_read(path, n);
    cr_assert(b, "cannot open %s", path);
    return b;
}

void tc_write(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    cr_assert(f, "cannot create %s", path);
    cr_assert_eq(fwrite(data, 1, n, f), n, "cannot write %s", path);
    cr_assert_eq(fclose(f), 0, "cannot write %s", path);
}

char *tc_tmpdir(const char *tag) {
    char *d = malloc(strlen(tag) + 32);
    cr_assert(d);
    sprintf(d, "/tmp/djinn_%s_XXXXXX", tag);
    cr_assert(mkdtemp(d), "mkdtemp %s failed", d);
    return d;
}

void tc_rm_rf(const char *dir) {
    DIR *dp = opendir(dir);
    if (!dp) return;
    struct dirent *de;
    char p[4200];
    while ((de = readdir(dp))) {
        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..")) continue;
        snprintf(p, sizeof p, "%s/%s", dir, de->d_name);
        if (unlink(p)) tc_rm_rf(p);  // a folder: its files first
    }
    closedir(dp);
    rmdir(dir);
}

// ---- the generator
static uint64_t tc_state = 0x9E3779B97F4A7C15ull, tc_seed_in_use;

uint64_t tc_rng_seed(uint64_t seed) {
    const char *env = getenv("DJINN_SEED");
    if (env && *env) seed = strtoull(env, NULL, 10);
    tc_seed_in_use = seed;
    tc_state = seed * 0x9E3779B97F4A7C15ull + 1;
    if (!tc_state) tc_state = 1;
    return seed;
}

uint64_t tc_rng_fresh(const char *name) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t seed = tc_rng_seed(((uint64_t)ts.tv_sec * 1000003u) ^ (uint64_t)ts.tv_nsec ^ ((uint64_t)getpid() << 32));
    fprintf(stderr, "[%s] seed %llu (DJINN_SEED=%llu replays it)\n", name, (unsigned long long)seed,
            (unsigned long long)seed);
    return seed;
}

uint64_t tc_seed_used(void) { return tc_seed_in_use; }

uint64_t tc_next(void) {
    tc_state ^= tc_state >> 12, tc_state ^= tc_state << 25, tc_state ^= tc_state >> 27;
    return tc_state * 0x2545F4914F6CDD1Dull;
}
float tc_unif(void) { return (float)(tc_next() >> 40) / 16777216.0f; }
float tc_sym(void) { return 2.0f * tc_unif() - 1.0f; }
float tc_uniform(float lo, float hi) { return lo + (hi - lo) * tc_unif(); }
float tc_normal(void) {
    float u1 = tc_unif(), u2 = tc_unif();
    return sqrtf(-2.0f * logf(u1 + 1e-12f)) * cosf(6.2831853f * u2);
}
uint32_t tc_below(uint32_t n) { return (uint32_t)((tc_next() >> 32) % n); }
void tc_fill(float *x, int64_t n, float lo, float hi) {
    for (int64_t i = 0; i < n; i++) x[i] = tc_uniform(lo, hi);
}

// ---- dtypes and errors
void tc_store(void *dst, float *x, int64_t n, uint32_t wtype) {
    for (int64_t i = 0; i < n; i++) {
        if (wtype == DJ_F32) {
            ((float *)dst)[i] = x[i];
            continue;
        }
        uint16_t h = wtype == DJ_F16 ? dj_f32_to_f16(x[i]) : dj_f32_to_bf16(x[i]);
        ((uint16_t *)dst)[i] = h;
        x[i] = wtype == DJ_F16 ? dj_f16_to_f32(h) : dj_bf16_to_f32(h);
    }
}

double tc_load(const void *w, uint32_t wtype, int64_t i) {
    if (wtype == DJ_F32) return ((const float *)w)[i];
    uint16_t h = ((const uint16_t *)w)[i];
    return wtype == DJ_F16 ? dj_f16_to_f32(h) : dj_bf16_to_f32(h);
}

double tc_rel_l2(const float *got, const float *ref, int64_t n) {
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = (double)got[i] - ref[i];
        num += d * d, den += (double)ref[i] * ref[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

double tc_rel_l2_d(const float *got, const double *ref, int64_t n) {
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = got[i] - ref[i];
        num += d * d, den += ref[i] * ref[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

// ---- this process's threads
int tc_threads_named(const char *name, int *awake) {
    DIR *d = opendir("/proc/self/task");
    cr_assert(d, "cannot list /proc/self/task");
    int n = 0, up = 0;
    for (struct dirent *t; (t = readdir(d));) {
        if (t->d_name[0] == '.') continue;
        char path[300], comm[64] = "", stat[512] = "";
        snprintf(path, sizeof path, "/proc/self/task/%s/comm", t->d_name);
        FILE *f = fopen(path, "r");
        if (!f) continue;  // the thread ended meanwhile
        int got = fgets(comm, sizeof comm, f) != NULL;
        fclose(f);
        comm[strcspn(comm, "\n")] = 0;
        if (!got || strcmp(comm, name)) continue;
        snprintf(path, sizeof path, "/proc/self/task/%s/stat", t->d_name);
        if (!(f = fopen(path, "r"))) continue;
        got = fgets(stat, sizeof stat, f) != NULL;
        fclose(f);
        const char *st = strrchr(stat, ')');  // "tid (comm) S ...": the state follows the name's parenthesis
        if (!got || !st || strlen(st) < 3) continue;
        n++;
        up += st[2] != 'S' && st[2] != 'D';
    }
    closedir(d);
    if (awake) *awake = up;
    return n;
}

// ---- subprocesses
int tc_run(char *const argv[], const char *in, const char *out, int append, const char *err, unsigned seconds) {
    pid_t pid = fork();
    cr_assert(pid >= 0, "fork failed");
    if (pid == 0) {
        int i = open(in, O_RDONLY), e = open(err, O_WRONLY | O_CREAT | O_TRUNC, 0644),
            o = !strcmp(out, err) ? e : open(out, O_WRONLY | O_CREAT | (append ? O_APPEND : O_TRUNC), 0644);
        if (i < 0 || o < 0 || e < 0) _exit(126);
        dup2(i, 0), dup2(o, 1), dup2(e, 2);
        alarm(seconds);
        execvp(argv[0], argv);
        _exit(127);
    }
    int st;
    cr_assert_eq(waitpid(pid, &st, 0), pid);
    cr_assert(WIFEXITED(st), "%s killed by signal %d", argv[0], WIFSIGNALED(st) ? WTERMSIG(st) : 0);
    cr_assert_neq(WEXITSTATUS(st), 127, "cannot exec %s", argv[0]);
    return WEXITSTATUS(st);
}

int tc_convert_with_config(const char *convert, const char *dir, const char *name, const char *cfg, char *model,
                           size_t cap, const char *out, const char *err) {
    char src[4096], tokdir[4096], path[4200];
    tc_data_path(src, sizeof src, "models/stories260K");
    snprintf(tokdir, sizeof tokdir, "%s/%s_tok", dir, name);
    mkdir(tokdir, 0755);
    snprintf(path, sizeof path, "%s/tokenizer.json", src);
    size_t n;
    char *json = tc_must_read(path, &n);
    snprintf(path, sizeof path, "%s/tokenizer.json", tokdir);
    tc_write(path, json, n);
    free(json);
    snprintf(path, sizeof path, "%s/tokenizer_config.json", tokdir);
    tc_write(path, cfg, strlen(cfg));
    snprintf(model, cap, "%s/%s.bin", dir, name);
    return tc_run((char *[]){(char *)convert, src, model, "--dtype", "f32", "--tokenizer", tokdir, "-q", NULL},
                  "/dev/null", out, 0, err, 120);
}

dj_tokenizer *tc_load_tokenizer(const char *rel) {
    char dir[4096], probe[4200];
    snprintf(dir, sizeof dir, "%s/%s", tc_data(), rel);
    snprintf(probe, sizeof probe, "%s/tokenizer.json", dir);
    FILE *f = fopen(probe, "rb");
    if (!f) cr_skip_test("%s is missing", probe);
    fclose(f);
    uint8_t *blob;
    size_t n;
    dj_err e = {{0}};
    cr_assert_eq(tokjson_build_dir(dir, &blob, &n, &e), 0, "tokjson on %s: %s", dir, e.msg);
    dj_tokenizer *t = tok_load(blob, n, &e);
    free(blob);
    cr_assert(t, "tok_load: %s", e.msg);
    return t;
}

// ---- models
// stories260K converted in dtype to path.
static void stories_convert(const char *path, uint32_t dtype) {
    char stories[4096];
    tc_data_path(stories, sizeof stories, "models/stories260K");
    convert_opts co = {.hf_dir = stories, .out_path = path, .dtype = dtype, .quiet = 1};
    dj_err e = {{0}};
    cr_assert_eq(convert_run(&co, &e), 0, "converting %s: %s", stories, e.msg);
}

void tc_stories_model(const char *dir, const char *name, uint32_t dtype, dj_model *m, char *path, size_t n) {
    snprintf(path, n, "%s/%s", dir, name);
    stories_convert(path, dtype);
    dj_load_opts lo = {.quiet = 1};
    dj_err e = {{0}};
    cr_assert_eq(model_load(path, &lo, m, &e), 0, "%s: %s", path, e.msg);
}

void tc_load_stories(dj_model *m, int dtype, int gpu) {
    char *dir = tc_tmpdir("stories"), out[4200];
    snprintf(out, sizeof out, "%s/s.bin", dir);
    stories_convert(out, (uint32_t)dtype);
    dj_load_opts lo = {.want_pinned = gpu, .quiet = 1};
    dj_err e = {{0}};
    cr_assert_eq(model_load(out, &lo, m, &e), 0, "%s: %s", out, e.msg);
    tc_rm_rf(dir);
    free(dir);
}

double tc_check(const dj_ref *r, const float *logits, uint32_t wtype, int kv, dj_check *ck, const char **name) {
    FILE *table = fopen("/dev/null", "w");
    cr_assert(table, "/dev/null: %s", strerror(errno));
    check_logits(r, logits, table, ck);
    fclose(table);
    return check_measure(ck, wtype, kv, name);
}
