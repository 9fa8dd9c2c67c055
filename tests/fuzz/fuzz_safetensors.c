/* libFuzzer target: st_parse on the input as a whole safetensors file image. Accepted
 * headers are checked against the promises st_parse makes, so a validation gap shows up
 * as a crash, not only memory errors.
 *
 * clang -g -O1 -std=c11 -D_GNU_SOURCE -fsanitize=fuzzer,address,undefined \
 *   -fno-sanitize-recover=all -Icore -Iabi tests/fuzz/fuzz_safetensors.c \
 *   core/safetensors.c core/util.c $(pkg-config --cflags --libs json-c) \
 *   -o build-fuzz/fuzz_safetensors
 * (tests/fuzz/run_fuzzers.sh SECONDS builds and runs it with its corpus.) */
#include "safetensors.h"

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    st_header h;
    char err[512] = "";
    if (st_parse(data, size, &h, err, sizeof err) != 0) {
        if (!err[0] || h.tensors || h.n_tensors) abort(); /* every refusal says why */
        return 0;
    }
    if (size < 8 || h.data_size > size - 8) abort();
    for (int32_t i = 0; i < h.n_tensors; i++) {
        const st_tensor *t = &h.tensors[i];
        if (!t->name || t->data || t->ndim < 0 || t->ndim > LMH_MAX_DIMS) abort();
        if ((unsigned)t->dtype >= LMH_DTYPE_COUNT) abort();
        if (t->begin > t->end || t->end > h.data_size) abort();
        uint64_t n = lmh_dtype_size(t->dtype);
        for (int d = 0; d < t->ndim; d++) {
            if (t->ne[d] < 0) abort();
            n *= (uint64_t)t->ne[d]; /* cannot wrap: st_parse checked the product */
        }
        if (n != t->end - t->begin) abort();
    }
    /* Spans disjoint and names unique: quadratic, so only on small headers. */
    for (int32_t i = 0; i < h.n_tensors && h.n_tensors <= 256; i++)
        for (int32_t j = i + 1; j < h.n_tensors; j++) {
            const st_tensor *a = &h.tensors[i], *b = &h.tensors[j];
            if (strcmp(a->name, b->name) == 0) abort();
            if (a->begin < a->end && b->begin < b->end && a->begin < b->end && b->begin < a->end)
                abort();
        }
    st_header_free(&h);
    return 0;
}
