// hfconfig.h: HuggingFace config.json -> dj_config, for LlamaForCausalLM only. Reads the classic RoPE keys
// (rope_theta, rope_scaling) and the transformers-5 ones (rope_parameters); when both kinds are present they
// must agree. Refuses by name everything the engine does not implement (other architectures, activations,
// biases, RoPE types, partial rotary), and a RoPE block it cannot read unambiguously.
// torch_dtype / dtype (transformers 5) are not read: the output dtype follows the dtype the tensors are stored
// in (see convert.c), which is what the numbers are; the config's key only names what HF casts them to.
#ifndef DJINN_HFCONFIG_H
#define DJINN_HFCONFIG_H

#include <stddef.h>

#include "../model.h"

// Fills every field of c except wtype (decided from the tensors). Pure: text in, config out.
int hf_config_parse(const char *text, size_t n, dj_config *c, dj_err *e);

#endif
