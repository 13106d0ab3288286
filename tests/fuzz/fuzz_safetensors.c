// fuzz_safetensors.c: libFuzzer target for convert/safetensors.c. Arbitrary bytes -> st_parse; on success
// every tensor must lie inside the input, match its shape and be found by name.
#include <stdint.h>
#include <string.h>

#include "../../convert/safetensors.h"
#include "fuzz_common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t n) {
    dj_err e = {{0}};
    st_file f;
    if (st_parse(data, n, &f, &e)) {
        FUZZ_CHECK(e.msg[0] != '\0');
        return 0;
    }
    for (size_t i = 0; i < f.n; i++) {
        const st_tensor *t = &f.tensors[i];
        FUZZ_CHECK(t->name != NULL);
        FUZZ_CHECK((int)t->dtype >= 0 && t->dtype < ST_DTYPE_COUNT);
        FUZZ_CHECK(t->ndim >= 0 && t->ndim <= ST_MAX_DIMS);
        FUZZ_CHECK(st_dtype_name(t->dtype) != NULL && st_dtype_size(t->dtype) > 0);
        uint64_t elems = 1;
        for (int k = 0; k < t->ndim; k++) {
            FUZZ_CHECK(t->shape[k] >= 0);
            FUZZ_CHECK(!dj_mul_u64(elems, (uint64_t)t->shape[k], &elems));
        }
        uint64_t want;
        FUZZ_CHECK(!dj_mul_u64(elems, st_dtype_size(t->dtype), &want) && want == t->nbytes);
        if (t->nbytes) {
            FUZZ_CHECK(t->data >= data && t->nbytes <= n && t->data - data <= (ptrdiff_t)(n - t->nbytes));
            fuzz_touch(t->data, t->nbytes);
        }
        if (i) FUZZ_CHECK(strcmp(f.tensors[i - 1].name, t->name) < 0);  // sorted, unique
        FUZZ_CHECK(st_find(&f, t->name) == t);
    }
    FUZZ_CHECK(st_find(&f, "\x01no such tensor") == NULL);
    st_free(&f);
    return 0;
}
