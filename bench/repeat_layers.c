// bench/repeat_layers.c: a model.bin of N layers made of a donor's: layer l is the donor's layer l % (its layers),
// the tokenizer, embeddings and head are the donor's. It gives the real sizes of models whose checkpoints the GPU
// machine's disk cannot hold in f16: Llama-3-70B in q4 (about 40 GB) from a donor of two layers converted from
// tools/make_random_llama.py's checkpoint. For timing: the layers repeat, so the logits mean nothing.
// --sparse: the layers past the donor's are left as holes, zeros on reading, so the disk holds only the donor's bytes:
// Llama-3-70B's 80 layers in f16 (141 GB; the two-GPU machine's disk is 128 GiB) from a donor of two take 8 GB. A
// layer of zeros costs the matmuls what a real one does (no kernel skips zeros) and adds nothing to the residual.
//
//   repeat_layers DONOR.bin OUT.bin N [--sparse]
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../fileio.h"
#include "../loader.h"
#include "../model.h"

static int write_zeros(dj_out *o, uint64_t n, dj_err *e) {
    static const uint8_t zeros[1 << 16];
    for (uint64_t k; n; n -= k) {
        k = n < sizeof zeros ? n : sizeof zeros;
        if (out_write(o, zeros, (size_t)k, e)) return -1;
    }
    return 0;
}

// Zeros from *pos up to off (a hole where sparse), then n bytes of p: the next section at its offset.
static int put(dj_out *o, uint64_t *pos, uint64_t off, const void *p, uint64_t n, int sparse, dj_progress *pr,
               dj_err *e) {
    if (off < *pos) return dj_fail(e, "internal error: section at %llu behind the writer at %llu",
                                   (unsigned long long)off, (unsigned long long)*pos);
    if ((sparse ? out_seek(o, off, e) : write_zeros(o, off - *pos, e)) || out_write(o, p, (size_t)n, e)) return -1;
    *pos = off + n;
    dj_progress_update(pr, *pos);
    return 0;
}

int main(int argc, char **argv) {
    const int sparse = argc == 5 && !strcmp(argv[4], "--sparse");
    if (argc != 4 && !sparse) {
        fprintf(stderr, "usage: repeat_layers DONOR.bin OUT.bin N [--sparse]   (N layers, the donor's repeated; "
                        "--sparse: those past the donor's left as holes, zeros)\n");
        return 2;
    }
    char *end;
    errno = 0;
    long n = strtol(argv[3], &end, 10);
    if (errno || *end || n < 1 || n > (long)DJ_MAX_LAYERS) {
        fprintf(stderr, "repeat_layers: N must be 1..%u, not '%s'\n", DJ_MAX_LAYERS, argv[3]);
        return 2;
    }
    dj_err e;
    dj_model d;
    dj_load_opts lo = {.quiet = 1};
    if (model_load(argv[1], &lo, &d, &e)) {
        fprintf(stderr, "repeat_layers: %s: %s\n", argv[1], e.msg);
        return 1;
    }
    dj_config c = d.info.config;
    const uint32_t donor_layers = c.n_layers;
    c.n_layers = (uint32_t)n;
    dj_model_info info;
    if (model_plan(&c, d.info.tok_size, &info, &e)) {
        fprintf(stderr, "repeat_layers: %s\n", e.msg);
        model_free(&d);
        return 1;
    }
    uint8_t *hdr = calloc(1, info.header_bytes);
    dj_out o = {.fd = -1};
    const char *inputs[] = {argv[1]};
    int rc = hdr && !model_write_header(&info, hdr, info.header_bytes, &e) &&
                     !out_open(&o, argv[2], "OUT.bin", inputs, 1, &e)
                 ? 0
                 : -1;
    if (!hdr) snprintf(e.msg, sizeof e.msg, "out of memory");
    dj_progress pr;
    dj_progress_start(&pr, "repeat_layers", info.file_size, 1);
    uint64_t pos = 0;
    if (!rc)
        rc = put(&o, &pos, 0, hdr, info.header_bytes, 0, &pr, &e) ||
             put(&o, &pos, info.tok_off, d.data + d.info.tok_off, d.info.tok_size, 0, &pr, &e) ||
             put(&o, &pos, info.embed_off, d.data + d.info.embed_off, d.info.embed_size, 0, &pr, &e);
    for (uint32_t l = 0; !rc && l < c.n_layers; l++)
        if (!sparse || l < donor_layers)
            rc = put(&o, &pos, info.layer_off[l], d.data + d.info.layer_off[l % donor_layers], info.layer.size, sparse,
                     &pr, &e);
    if (!rc)  // the head after the last hole, then the file's zero padding written (its size set by a write)
        rc = put(&o, &pos, info.head_off, d.data + d.info.head_off, d.info.head_size, sparse, &pr, &e) ||
             write_zeros(&o, info.file_size - pos, &e) || out_commit(&o, 0, &e);
    if (rc) {
        out_abort(&o);
        fprintf(stderr, "repeat_layers: %s\n", e.msg);
    } else {
        dj_progress_end(&pr, info.file_size);
    }
    free(hdr);
    dj_info_free(&info);
    model_free(&d);
    return rc ? 1 : 0;
}
