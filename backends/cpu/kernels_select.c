/* Run-time choice of the kernel table. The SIMD files are built with their own target
 * flags, so nothing from them may run before the CPU has been checked here. */
#include "kernels.h"

#include <pthread.h>
#include <stddef.h>
#include <string.h>

extern const cpu_kernels cpu_kernels_portable;
#if defined(__x86_64__)
#include <cpuid.h>
extern const cpu_kernels cpu_kernels_avx2;
extern const cpu_kernels cpu_kernels_avx512;
#elif defined(__aarch64__)
extern const cpu_kernels cpu_kernels_neon;
#endif

/* Best first, NULL-terminated. */
static const cpu_kernels *list[4];
static pthread_once_t list_once = PTHREAD_ONCE_INIT;

#if defined(__x86_64__)
/* clang 14 has no "f16c" for __builtin_cpu_supports: ask cpuid (leaf 1, ecx bit 29). The
 * AVX checks already cover the OS saving the ymm registers F16C uses. */
static int has_f16c(void) {
    unsigned a, b, c, d;
    return __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C);
}
#endif

static void fill_list(void) {
    int i = 0;
#if defined(__x86_64__)
    __builtin_cpu_init();
    /* __builtin_cpu_supports also checks that the OS saves the wider registers. */
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("fma") && has_f16c())
        list[i++] = &cpu_kernels_avx512;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && has_f16c())
        list[i++] = &cpu_kernels_avx2;
#elif defined(__aarch64__)
    list[i++] = &cpu_kernels_neon; /* Advanced SIMD is part of the base ARMv8-A ABI */
#endif
    list[i++] = &cpu_kernels_portable;
    list[i] = NULL;
}

static const cpu_kernels *const *tables(void) {
    pthread_once(&list_once, fill_list);
    return list;
}

const cpu_kernels *const *cpu_kernels_available(void) {
    return tables();
}

const cpu_kernels *cpu_kernels_select(const char *force) {
    const cpu_kernels *const *t = tables();
    if (force && *force) {
        for (; *t; t++)
            if (strcmp((*t)->name, force) == 0) return *t;
        return NULL;
    }
    return t[0];
}
