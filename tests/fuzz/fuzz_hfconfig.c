// fuzz_hfconfig.c: libFuzzer target for convert/hfconfig.c: a config.json text -> hf_config_parse. Checks what the
// converter relies on: a failure says why on one line; a config it accepts has every dimension it fills positive,
// its heads grouped evenly, finite positive norm epsilon and RoPE theta, a known RoPE type; and model_plan sizes
// a model.bin for it or refuses it with a reason, either way without a crash.
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "../../convert/hfconfig.h"
#include "fuzz_common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t n) {
    dj_config c;
    dj_err e = {{0}};
    memset(&c, 0, sizeof c);
    if (hf_config_parse((const char *)data, n, &c, &e)) {
        FUZZ_CHECK(fuzz_one_line(e.msg, sizeof e.msg));
        return 0;
    }
    FUZZ_CHECK(c.n_layers >= 1 && c.dim >= 1 && c.n_heads >= 1 && c.n_kv_heads >= 1 && c.head_dim >= 1);
    FUZZ_CHECK(c.hidden_dim >= 1 && c.vocab_size >= 1);
    FUZZ_CHECK(c.n_heads % c.n_kv_heads == 0);
    FUZZ_CHECK(isfinite(c.norm_eps) && c.norm_eps > 0 && isfinite(c.rope_theta) && c.rope_theta > 0);
    FUZZ_CHECK(c.rope_type == DJ_ROPE_DEFAULT || c.rope_type == DJ_ROPE_LLAMA3);
    for (uint32_t wt = DJ_F32; wt <= DJ_Q4; wt++) {
        dj_config_set_wtype(&c, wt);
        dj_model_info m;
        if (model_plan(&c, 64, &m, &e)) {
            FUZZ_CHECK(fuzz_one_line(e.msg, sizeof e.msg));
            continue;
        }
        FUZZ_CHECK(m.tok_off >= model_header_bytes(c.n_layers));
        dj_info_free(&m);
    }
    return 0;
}
