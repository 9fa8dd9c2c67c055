/* Shared by the quantized-kernel tests (test_qkernels.c, test_q8.c): a small xorshift
 * generator (each file seeds it with QTEST_SEED, defined before this include) and the
 * store of a scale or bias in the table's dtype (0 f32, 1 f16, 2 bf16). */
#ifndef LMHOST_QTEST_UTIL_H
#define LMHOST_QTEST_UTIL_H

#include <stdint.h>
#include "kernels.h"

static uint64_t rng = QTEST_SEED;
static uint32_t rnd(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng >> 11);
}
/* uniform in [-1, 1] */
static float frnd(void) {
    return (float)(rnd() % 20001) / 10000.0f - 1.0f;
}

static inline void put_sb(void *p, int sb, int64_t i, float v) {
    if (sb == 0)
        ((float *)p)[i] = v;
    else if (sb == 1)
        ((uint16_t *)p)[i] = cpu_f32_to_f16(v);
    else
        ((uint16_t *)p)[i] = cpu_f32_to_bf16(v);
}

#endif
