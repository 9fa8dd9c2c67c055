/* lmhost plugin ABI (1.12): lists of settings, "key[=value],key[=value],...", and
 * LMHOST_DEBUG, the one environment variable for test and measurement switches.
 *
 * LMHOST_DEBUG=key[=value],... holds every switch that exists for tests and measurement
 * across the host and its plugins (docs/tuning.md lists them: `simd=avx2`, `vk-validate`,
 * `cq-dequant`, ...). Each plugin reads its own keys with lmh_debug_get or lmh_debug_on and
 * ignores the others, so one variable serves the whole chain. Keys match whole
 * ("vk-matvec" is not "vk-matvec-rows"); a key's value is what follows its '=' up to the
 * next ',' ("" for a bare key), and where a key is given twice the last one counts. A plugin
 * that finds one of its keys with a value it cannot use says so, naming the key: an error
 * from create, or a warning and its default. User-facing settings do not belong here: a
 * backend takes them as options (lmh_backend_opts.params, parsed with lmh_kv_next).
 *
 * Everything here is static inline and reads only the environment: plugins need nothing
 * of the host to use it. */
#ifndef LMHOST_DEBUG_H
#define LMHOST_DEBUG_H

#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The next item of a "key[=value],..." list at *p: copies its key (up to '=' or ',') into
 * key and its value (after '=', up to ',') into val, "" where it has none, each cut to
 * fit its buffer (kcap, vcap >= 1), and moves *p past it. Empty items are skipped.
 * Returns 1 for an item, 0 at the end of the list (or for a NULL list); *p may be NULL. */
static inline int lmh_kv_next(const char **p, char *key, size_t kcap, char *val, size_t vcap) {
    const char *s = *p;
    if (!s) return 0;
    while (*s == ',') s++;
    if (!*s) {
        *p = s;
        return 0;
    }
    size_t n = strcspn(s, ",="), k = n < kcap ? n : kcap - 1;
    memcpy(key, s, k);
    key[k] = 0;
    s += n;
    size_t v = 0;
    if (*s == '=') {
        s++;
        n = strcspn(s, ",");
        v = n < vcap ? n : vcap - 1;
        memcpy(val, s, v);
        s += n;
    }
    val[v] = 0;
    *p = s;
    return 1;
}

/* Whether LMHOST_DEBUG has `key`; its value (the last one given) into val (cap bytes, cut to
 * fit; val may be NULL with cap 0). Returns 1 where present, 0 where not. */
static inline int lmh_debug_get(const char *key, char *val, size_t cap) {
    const char *p = getenv("LMHOST_DEBUG");
    char k[64], v[256];
    int found = 0;
    while (lmh_kv_next(&p, k, sizeof k, v, sizeof v))
        if (strcmp(k, key) == 0) {
            found = 1;
            if (val && cap) {
                size_t n = strlen(v) < cap ? strlen(v) : cap - 1;
                memcpy(val, v, n);
                val[n] = 0;
            }
        }
    return found;
}

/* A switch: LMHOST_DEBUG has `key` bare or with a value other than "0". */
static inline int lmh_debug_on(const char *key) {
    char v[16];
    return lmh_debug_get(key, v, sizeof v) && strcmp(v, "0") != 0;
}

#ifdef __cplusplus
}
#endif
#endif
