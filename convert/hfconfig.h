// hfconfig.h: HuggingFace config.json -> dj_config, for LlamaForCausalLM only. Reads the classic keys
// (rope_theta, rope_scaling, torch_dtype) and the transformers-5 ones (rope_parameters, dtype); refuses by
// name everything the engine does not implement.
#ifndef DJINN_HFCONFIG_H
#define DJINN_HFCONFIG_H

#include <stddef.h>

#include "../model.h"

// Fills every field of c except wtype (decided from the tensors). Pure: text in, config out.
int hf_config_parse(const char *text, size_t n, dj_config *c, dj_err *e);

#endif
