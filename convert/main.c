// main.c: the ./convert/convert command line.
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../fileio.h"
#include "../model.h"
#include "convert.h"

#define SYNOPSIS "convert HF_DIR OUT.bin [--dtype f16|bf16|f32|q8|q4] [--tokenizer DIR] [-q]"
#define SEE_HELP " (see convert --help)\n"

// Bits a weight of a quantized dtype, from the row layout the converter writes (model.h's dj_row_bytes), over a
// row of whole groups that needs no padding.
static double bits_per_weight(uint32_t dtype) {
    const uint64_t n = DJ_QGROUP * DJ_ROW_ALIGN;
    return (double)dj_row_bytes(dtype, n) * 8.0 / (double)n;
}

static void usage(FILE *f) {
    fprintf(f,
            "usage: " SYNOPSIS "\n"
            "  HF_DIR         a HuggingFace LlamaForCausalLM folder: config.json, model.safetensors (or sharded\n"
            "                 model-*-of-*.safetensors + model.safetensors.index.json), tokenizer.json\n"
            "  --dtype T      weight dtype in OUT.bin (default: BF16 stays bf16, F16 stays f16, F32 becomes\n"
            "                 f16); q8 / q4 quantize the layers' matrices (%.1f / %.1f bits per weight: 8-bit /\n"
            "                 4-bit values in groups of %d along each row, a 16-bit scale and zero point each),\n"
            "                 the embeddings and the lm_head to q8; norm weights are always f32. The\n"
            "                 quantization error per tensor kind is printed at the end\n"
            "  --tokenizer D  read tokenizer.json / tokenizer_config.json from D (default: HF_DIR); the bos/eos\n"
            "                 ids of HF_DIR's config.json and generation_config.json are still the model's\n"
            "  -q             no progress on stderr\n"
            "OUT.bin (model.bin format version %u) is written as OUT.bin.tmp, locked while this run writes\n"
            "it, and renamed when complete: a failed conversion leaves nothing; one killed leaves an\n"
            "OUT.bin.tmp that the next run takes over; a second run while one writes OUT.bin is refused.\n"
            "OUT.bin may be none of the inputs, and must be a regular file if it exists.\n",
            bits_per_weight(DJ_Q8), bits_per_weight(DJ_Q4), DJ_QGROUP, DJ_VERSION);
}

int main(int argc, char **argv) {
    convert_opts o = {.dtype = -1};
    const char *pos[2] = {0};
    int npos = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return fflush(stdout) || ferror(stdout) ? 1 : 0;
        } else if (!strcmp(a, "--dtype") && i + 1 < argc) {
            const char *t = argv[++i];
            o.dtype = !strcmp(t, "f32")    ? DJ_F32
                      : !strcmp(t, "f16")  ? DJ_F16
                      : !strcmp(t, "bf16") ? DJ_BF16
                      : !strcmp(t, "q8")   ? DJ_Q8
                      : !strcmp(t, "q4")   ? DJ_Q4
                                           : -2;
            if (o.dtype == -2) {
                fprintf(stderr, "convert: --dtype must be f16, bf16, f32, q8 or q4, not '%s'" SEE_HELP, t);
                return 2;
            }
        } else if (!strcmp(a, "--tokenizer") && i + 1 < argc) {
            o.tok_dir = argv[++i];
        } else if (!strcmp(a, "-q")) {
            o.quiet = 1;
        } else if (a[0] == '-') {
            fprintf(stderr, "convert: unknown or incomplete option '%s'" SEE_HELP, a);
            return 2;
        } else if (npos < 2) {
            pos[npos++] = a;
        } else {
            fprintf(stderr, "convert: too many arguments ('%s')" SEE_HELP, a);
            return 2;
        }
    }
    if (argc == 1) {  // as djinn: one line, not the whole help
        fputs("usage: " SYNOPSIS SEE_HELP, stderr);
        return 2;
    }
    if (npos != 2) {
        fprintf(stderr, "convert: need HF_DIR and OUT.bin" SEE_HELP);
        return 2;
    }
    o.hf_dir = pos[0], o.out_path = pos[1];
    // Ctrl-C and kill: the partial output removed (only while this run holds it), then death by the same signal
    out_kill_arm();
    signal(SIGINT, out_kill_handler);
    signal(SIGXFSZ, SIG_IGN);  // a file-size limit: let write() fail with EFBIG so the cleanup runs
    signal(SIGPIPE, SIG_IGN);  // a closed stderr: the conversion goes on, its messages are lost
    dj_err e;
    if (convert_run(&o, &e)) {
        fprintf(stderr, "convert: %s\n", e.msg);
        return 1;
    }
    return 0;
}
