/* What `--cache` and a request's "kv_cache" name: a cache plugin and one of its formats,
 * with the format's settings. Accepted spellings: "PLUGIN", "PLUGIN:FORMAT", "FORMAT" (a
 * format some cache plugin offers), each optionally followed by ",key=value,..." which
 * goes to the plugin as lmh_cache_config.options (ABI 1.8) for it to check. */
#ifndef LMHOST_CACHE_SPEC_H
#define LMHOST_CACHE_SPEC_H

#include <stddef.h>
#include "plugin_loader.h"

typedef struct cache_spec {
    const plugin *p;
    char format[32];   /* one of p's formats */
    char options[128]; /* "" for none */
} cache_spec;

/* Parses spec (NULL: "plain") into *out. Returns 0, or -1 with err naming what is known. */
int cache_spec_parse(const registry *reg, const char *spec, cache_spec *out, char *err,
                     size_t err_len);
/* "FORMAT" or "FORMAT,options": how the spec is shown (in /health, say). */
void cache_spec_name(const cache_spec *s, char *buf, size_t len);
/* The cache spec ("PLUGIN:FORMAT") that a request's kv_bits `bits` names: the first format
 * whose plugin says it stands for that many bits (lmh_cache_api.kv_bits). 0, or -1 with
 * `served` saying which kv_bits the plugins serve ("4 and 8"; "" for none). */
int cache_spec_kv_bits(const registry *reg, int bits, char *spec, size_t spec_len, char *served,
                       size_t served_len);
/* Every format of every cache plugin, ", "-separated (malloc'ed; NULL when out of memory). */
char *cache_spec_formats(const registry *reg);

#endif
