// convert.h: a HuggingFace Llama checkpoint folder -> model.bin (format in model.h).
#ifndef DJINN_CONVERT_H
#define DJINN_CONVERT_H

#include "../model.h"
#include "../util.h"

typedef struct {
    const char *hf_dir;    // config.json + model.safetensors or sharded model-*-of-*.safetensors with index
    const char *out_path;  // written as out_path.tmp, renamed at the end
    const char *tok_dir;   // folder holding tokenizer.json and tokenizer_config.json; NULL: hf_dir
    int dtype;             // DJ_F32/DJ_F16/DJ_BF16/DJ_Q8/DJ_Q4, or -1: BF16 stays BF16, F16 stays F16, F32 becomes
                           // F16. q8 and q4 quantize the layers' matrices, the embeddings and the lm_head go to q8
    double *report;        // when given (DJ_N_TENSOR_KINDS values): each kind's quantization error, relative RMS
    int quiet;             // no progress on stderr
} convert_opts;

int convert_run(const convert_opts *o, dj_err *e);

#endif
