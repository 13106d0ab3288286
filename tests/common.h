// tests/common.h: what the test files share: the data, fixtures and binaries the environment names (a test skips
// with the reason when they are absent), reading and writing files, one seeded generator whose seed a failure
// names and DJINN_SEED replays, storing floats in a weight dtype, relative L2 errors.
#ifndef DJINN_TESTS_COMMON_H
#define DJINN_TESTS_COMMON_H

#include <stddef.h>
#include <stdint.h>

#include "../loader.h"

// The tests and the binaries they run are built with the same flags (make test SAN=1 builds both with ASan): gcc
// says so with __SANITIZE_ADDRESS__, clang with __has_feature.
#if defined(__SANITIZE_ADDRESS__)
#define DJ_TEST_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define DJ_TEST_ASAN 1
#endif
#endif

// ---- the environment (set by `make test`)
// $DJINN_DATA (the shared test data): skips the test when unset.
const char *tc_data(void);
// path (n bytes) = $DJINN_DATA/rel; skips the test when that file or folder is missing.
void tc_data_path(char *path, size_t n, const char *rel);
// The tokenizer of $DJINN_DATA/rel (a folder of HF tokenizer files) through tokjson and tok_load; skips the test when
// its tokenizer.json is missing.
struct dj_tokenizer *tc_load_tokenizer(const char *rel);
// $DJINN_DATA/models/stories260K converted to dtype (DJ_*) in a fresh folder and loaded into m: for the GPU engine
// (page-locked) when gpu, else for the CPU's; skips the test when the model is missing.
void tc_load_stories(dj_model *m, int dtype, int gpu);
// $DJINN_TESTS (this folder: fixtures/, ref/), else "tests" (the repository root is the working directory).
const char *tc_tests_dir(void);
// $DJINN_BIN (the binaries under test): skips the test when unset.
const char *tc_bin_dir(void);

// ---- files
// The whole file, NUL-terminated (*n without the NUL; n may be NULL); NULL when it cannot be opened.
char *tc_read(const char *path, size_t *n);
// tc_read, or fail the test.
char *tc_must_read(const char *path, size_t *n);
// Writes the bytes, or fails the test.
void tc_write(const char *path, const void *data, size_t n);
// A fresh folder /tmp/djinn_<tag>_XXXXXX (malloc'd path); tc_rm_rf removes it and everything in it.
char *tc_tmpdir(const char *tag);
void tc_rm_rf(const char *dir);

// ---- subprocesses
// Runs argv (argv[0] a path, or a name looked up in PATH) with stdin from `in`, stdout to `out` (appended when
// `append`; the same file as `err`: both streams into one, as on a terminal) and stderr to `err`; returns its exit
// status. A run still going after `seconds` is killed (SIGALRM); one killed by a signal, or that cannot be started,
// fails the test.
int tc_run(char *const argv[], const char *in, const char *out, int append, const char *err, unsigned seconds);
// $DJINN_DATA's stories260K with its tokenizer.json and tokenizer_config.json `cfg` (both written into
// dir/<name>_tok) converted to f32 by `convert` into dir/<name>.bin (its path into model, cap bytes), the
// converter's stdout and stderr into out and err; returns its exit status.
int tc_convert_with_config(const char *convert, const char *dir, const char *name, const char *cfg, char *model,
                           size_t cap, const char *out, const char *err);

// ---- this process's threads
// The threads named `name` (/proc/self/task/*/comm); *awake (when given): how many of them are not asleep (their
// state neither S nor D: running or runnable, as a spinning thread is).
int tc_threads_named(const char *name, int *awake);

// ---- a seeded generator (xorshift64*), one per test process
// Seeds it with $DJINN_SEED when set, else `seed`; returns the seed in use.
uint64_t tc_rng_seed(uint64_t seed);
// Seeds it from the clock (or $DJINN_SEED) and prints "[name] seed N (DJINN_SEED=N replays it)" on stderr: fresh
// inputs every run, replayable when one fails (assertions print tc_seed_used()).
uint64_t tc_rng_fresh(const char *name);
uint64_t tc_seed_used(void);
uint64_t tc_next(void);
float tc_unif(void);                 // [0, 1)
float tc_sym(void);                  // [-1, 1)
float tc_uniform(float lo, float hi);
float tc_normal(void);               // N(0, 1)
uint32_t tc_below(uint32_t n);       // [0, n)
void tc_fill(float *x, int64_t n, float lo, float hi);

// ---- dtypes and errors
// Stores x (n) into dst in wtype (model.h's DJ_F32, DJ_F16, DJ_BF16) and leaves in x the values actually stored.
void tc_store(void *dst, float *x, int64_t n, uint32_t wtype);
double tc_load(const void *w, uint32_t wtype, int64_t i);
// sqrt(sum (got - ref)^2 / sum ref^2) (the plain L2 norm of the difference when ref is all zero).
double tc_rel_l2(const float *got, const float *ref, int64_t n);
double tc_rel_l2_d(const float *got, const double *ref, int64_t n);

// ---- models
#include "../loader.h"
// stories260K converted in `dtype` (model.h's DJ_F32...) to dir/name (path: n bytes) and loaded for the CPU engine (not
// page-locked); skips the test when the shared data lacks it.
void tc_stories_model(const char *dir, const char *name, uint32_t dtype, dj_model *m, char *path, size_t n);

// ---- against HF
#include "../check.h"
// The logits (r's tokens, vocab) against reference r as --check compares them (the table thrown away): *ck filled,
// check_measure's figure for weights wtype and KV type kv returned, its name in *name.
double tc_check(const dj_ref *r, const float *logits, uint32_t wtype, int kv, dj_check *ck, const char **name);

#endif
