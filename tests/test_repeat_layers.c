// test_repeat_layers.c: bench/repeat_layers, the tool that gives the GPU benchmarks models larger than the disk
// holds (issue 48's 70B in f16): its layers are the donor's repeated, or with --sparse holes past the donor's, which
// read as zeros and, since a layer of zeros adds nothing to the residual, leave the donor's greedy text unchanged.
// Needs $DJINN_DATA (stories260K) and $DJINN_BIN; skips visibly without them.
#include <criterion/criterion.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../loader.h"
#include "../model.h"
#include "common.h"

// Whether the folder's file system stores a skipped range as a hole (fewer blocks than bytes).
static int makes_holes(const char *dir) {
    char p[4200];
    snprintf(p, sizeof p, "%s/hole_probe", dir);
    int fd = open(p, O_CREAT | O_TRUNC | O_WRONLY, 0644), holes = 0;
    cr_assert(fd >= 0, "%s: cannot create", p);
    struct stat st;
    if (lseek(fd, 8 << 20, SEEK_SET) >= 0 && write(fd, "x", 1) == 1 && !fstat(fd, &st))
        holes = (uint64_t)st.st_blocks * 512 < (8u << 20);
    close(fd);
    unlink(p);
    return holes;
}

static int all_zero(const uint8_t *p, uint64_t n) {
    for (uint64_t i = 0; i < n; i++)
        if (p[i]) return 0;
    return 1;
}

// djinn's greedy text for `model` into dir/name; its exit status
static int greedy(const char *dir, const char *model, const char *name, char *out, size_t n) {
    char djinn[4200];
    snprintf(djinn, sizeof djinn, "%s/djinn", tc_bin_dir());
    snprintf(out, n, "%s/%s", dir, name);
    char *argv[] = {djinn, (char *)model, "-p", "Once upon a time", "-n", "24", "-t", "0", NULL};
    return tc_run(argv, "/dev/null", out, 0, "/dev/null", 60);
}

Test(repeat_layers, dense_repeats_sparse_leaves_zeros_and_the_donors_text) {
    char *dir = tc_tmpdir("repeat");
    char donor[4200], dense[4200], sparse[4200], tool[4200];
    dj_model d, md, ms;
    tc_stories_model(dir, "donor.bin", DJ_F32, &d, donor, sizeof donor);
    snprintf(tool, sizeof tool, "%s/repeat_layers", tc_bin_dir());
    cr_assert(access(tool, X_OK) == 0, "%s: not built ('make test' builds it)", tool);
    snprintf(dense, sizeof dense, "%s/dense.bin", dir);
    snprintf(sparse, sizeof sparse, "%s/sparse.bin", dir);
    const uint32_t nd = d.info.config.n_layers, n = 2 * nd + 1;
    char count[16];
    snprintf(count, sizeof count, "%u", n);
    char *a_dense[] = {tool, donor, dense, count, NULL}, *a_sparse[] = {tool, donor, sparse, count, "--sparse", NULL};
    cr_assert_eq(tc_run(a_dense, "/dev/null", "/dev/null", 0, "/dev/null", 60), 0, "repeat_layers failed");
    cr_assert_eq(tc_run(a_sparse, "/dev/null", "/dev/null", 0, "/dev/null", 60), 0, "repeat_layers --sparse failed");

    dj_load_opts lo = {.quiet = 1};
    dj_err e = {{0}};
    cr_assert_eq(model_load(dense, &lo, &md, &e), 0, "%s: %s", dense, e.msg);
    cr_assert_eq(model_load(sparse, &lo, &ms, &e), 0, "%s: %s", sparse, e.msg);
    cr_assert_eq(md.info.config.n_layers, n);
    cr_assert_eq(ms.info.config.n_layers, n);
    cr_assert_eq(md.data_size, ms.data_size, "the sparse file is as long as the dense one");
    const uint64_t ls = d.info.layer.size;
    for (uint32_t l = 0; l < n; l++) {
        const uint8_t *src = d.data + d.info.layer_off[l % nd];
        cr_assert(!memcmp(md.data + md.info.layer_off[l], src, ls), "dense layer %u is not the donor's %u", l, l % nd);
        if (l < nd) cr_assert(!memcmp(ms.data + ms.info.layer_off[l], src, ls), "sparse layer %u is not the donor's", l);
        else cr_assert(all_zero(ms.data + ms.info.layer_off[l], ls), "sparse layer %u is not zeros", l);
    }
    for (const dj_model *m = &md; m; m = m == &md ? &ms : NULL) {  // the embeddings and the head are the donor's
        cr_assert(!memcmp(m->data + m->info.embed_off, d.data + d.info.embed_off, d.info.embed_size));
        cr_assert(!memcmp(m->data + m->info.head_off, d.data + d.info.head_off, d.info.head_size));
    }
    if (makes_holes(dir)) {
        struct stat a, b;
        cr_assert(!stat(dense, &a) && !stat(sparse, &b));
        cr_expect_lt((uint64_t)b.st_blocks * 512, (uint64_t)a.st_blocks * 512 - (n - nd) * ls / 2,
                     "the sparse file takes %llu bytes on disk, the dense one %llu", (unsigned long long)b.st_blocks * 512,
                     (unsigned long long)a.st_blocks * 512);
    } else {
        cr_log_warn("%s's file system stores no holes: the sparse file's disk use is not checked", dir);
    }
    model_free(&md), model_free(&ms), model_free(&d);

    // layers of zeros add nothing to the residual: the donor's greedy text, exactly
    char t_donor[4300], t_sparse[4300];
    cr_assert_eq(greedy(dir, donor, "donor.txt", t_donor, sizeof t_donor), 0);
    cr_assert_eq(greedy(dir, sparse, "sparse.txt", t_sparse, sizeof t_sparse), 0);
    size_t n1, n2;
    char *x1 = tc_must_read(t_donor, &n1), *x2 = tc_must_read(t_sparse, &n2);
    cr_assert(n1 > 16, "the donor wrote no text");
    cr_assert(n1 == n2 && !memcmp(x1, x2, n1), "the sparse model's text differs:\n%s\n%s", x1, x2);
    free(x1), free(x2);
    tc_rm_rf(dir);
    free(dir);
}

Test(repeat_layers, refuses_bad_arguments) {
    char tool[4200];
    snprintf(tool, sizeof tool, "%s/repeat_layers", tc_bin_dir());
    char *dir = tc_tmpdir("repeat_args"), out[4200];
    snprintf(out, sizeof out, "%s/x.bin", dir);
    char *bad_flag[] = {tool, "in.bin", out, "4", "--dense", NULL}, *bad_n[] = {tool, "in.bin", out, "0", NULL},
         *missing[] = {tool, "/nonexistent/donor.bin", out, "4", NULL};
    cr_expect_eq(tc_run(bad_flag, "/dev/null", "/dev/null", 0, "/dev/null", 10), 2);
    cr_expect_eq(tc_run(bad_n, "/dev/null", "/dev/null", 0, "/dev/null", 10), 2);
    cr_expect_eq(tc_run(missing, "/dev/null", "/dev/null", 0, "/dev/null", 10), 1);
    cr_expect(access(out, F_OK) != 0, "a failed run left %s", out);
    tc_rm_rf(dir);
    free(dir);
}
