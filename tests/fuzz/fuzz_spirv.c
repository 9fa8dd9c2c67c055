/* libFuzzer target: the Vulkan backend's reading of a SPIR-V kernel's needs
 * (backends/vulkan/vk_spirv.c), which a plugin's module goes through before any driver
 * sees it. The input is the module; it is copied to a buffer of exactly its size, so that
 * any read past it is reported.
 *
 * clang -g -O1 -std=c11 -D_GNU_SOURCE -fsanitize=fuzzer,address,undefined \
 *   -fno-sanitize-recover=all -Ibackends/vulkan tests/fuzz/fuzz_spirv.c \
 *   backends/vulkan/vk_spirv.c -o build-fuzz/fuzz_spirv
 * (tests/fuzz/run_fuzzers.sh SECONDS builds and runs it with its corpus.) */
#include "vk_spirv.h"

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    uint32_t *code = malloc(size ? size : 1);
    if (!code) return 0;
    memcpy(code, data, size);
    vk_spirv_needs need;
    char err[160];
    if (vk_spirv_read(code, size, &need, err, sizeof err) == 0) {
        /* sizes saturate rather than wrap */
        if (need.shared_bytes > ((uint64_t)1 << 40)) abort();
    } else if (!err[0]) {
        abort(); /* a refusal always says why */
    }
    free(code);
    return 0;
}
