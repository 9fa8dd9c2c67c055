/* LMHOST_DEBUG (lmhost/debug.h) changed key by key, for the test programs that switch a
 * backend's paths between the instances they create: test_debug_set adds or replaces one key
 * and leaves the others (the meson test's own, such as vk-validate) as they were. */
#ifndef LMHOST_TEST_DEBUG_H
#define LMHOST_TEST_DEBUG_H

#include "lmhost/debug.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* LMHOST_DEBUG without `key`, then with key=val appended where val is not NULL ("" for a
 * bare key). */
static inline void test_debug_set(const char *key, const char *val) {
    const char *p = getenv("LMHOST_DEBUG");
    char out[1024] = "", k[64], v[256];
    size_t n = 0;
    while (lmh_kv_next(&p, k, sizeof k, v, sizeof v))
        if (strcmp(k, key) != 0)
            n += (size_t)snprintf(out + n, n < sizeof out ? sizeof out - n : 0, "%s%s%s%s",
                                  n ? "," : "", k, v[0] ? "=" : "", v);
    if (val)
        n += (size_t)snprintf(out + n, n < sizeof out ? sizeof out - n : 0, "%s%s%s%s",
                              n ? "," : "", key, val[0] ? "=" : "", val);
    if (n >= sizeof out) {
        fprintf(stderr, "LMHOST_DEBUG too long\n");
        exit(1);
    }
    setenv("LMHOST_DEBUG", out, 1);
}

/* LMHOST_DEBUG without `key`. */
static inline void test_debug_unset(const char *key) {
    test_debug_set(key, NULL);
}

/* A copy of LMHOST_DEBUG as it is now, for test_debug_restore (which frees it). */
static inline char *test_debug_save(void) {
    const char *v = getenv("LMHOST_DEBUG");
    return v ? strdup(v) : NULL;
}

static inline void test_debug_restore(char *saved) {
    if (saved)
        setenv("LMHOST_DEBUG", saved, 1);
    else
        unsetenv("LMHOST_DEBUG");
    free(saved);
}

#endif
