#include "cache_spec.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lmhost/lmhost.h"

static int fail(char *err, size_t err_len, const char *fmt, const char *a, const char *b) {
    if (err && err_len) snprintf(err, err_len, fmt, a, b);
    return -1;
}

int cache_spec_parse(const registry *reg, const char *spec, cache_spec *out, char *err,
                     size_t err_len) {
    memset(out, 0, sizeof *out);
    if (!spec) spec = "plain";
    const char *comma = strchr(spec, ',');
    size_t head = comma ? (size_t)(comma - spec) : strlen(spec);
    if (comma && strlen(comma + 1) >= sizeof out->options)
        return fail(err, err_len, "cache settings '%s' are too long%s", comma + 1, "");
    if (comma && !comma[1])
        return fail(err, err_len, "cache '%s': empty settings after ','%s", spec, "");
    char name[64], fmt[32] = "";
    if (head >= sizeof name) return fail(err, err_len, "unknown cache '%s'%s", spec, "");
    memcpy(name, spec, head);
    name[head] = 0;
    char *colon = strchr(name, ':');
    if (colon) {
        *colon = 0;
        if (strlen(colon + 1) >= sizeof fmt)
            return fail(err, err_len, "unknown cache format '%s'%s", colon + 1, "");
        snprintf(fmt, sizeof fmt, "%s", colon + 1);
    }
    const plugin *p = registry_find(reg, LMH_KIND_CACHE, name);
    if (!p && !colon) { /* a bare format: the first plugin that offers it */
        for (int i = 0; i < reg->n && !p; i++) {
            if (reg->items[i].info->kind != LMH_KIND_CACHE) continue;
            const lmh_cache_api *c = reg->items[i].info->api;
            for (const char *const *f = c->formats; *f && !p; f++)
                if (strcmp(*f, name) == 0) {
                    p = &reg->items[i];
                    snprintf(fmt, sizeof fmt, "%s", *f); /* a format name fits (< 32) */
                }
        }
    }
    if (!p) {
        char *known = cache_spec_formats(reg);
        char *names = registry_names(reg, LMH_KIND_CACHE, 0);
        char what[512];
        snprintf(what, sizeof what, "formats: %s; plugins: %s", known && *known ? known : "none",
                 names && *names ? names : "none");
        free(known);
        free(names);
        return fail(err, err_len, "unknown cache '%s' (%s)", name, what);
    }
    const lmh_cache_api *c = p->info->api;
    if (!fmt[0]) snprintf(fmt, sizeof fmt, "%s", c->formats[0]);
    int found = 0;
    for (const char *const *f = c->formats; *f && !found; f++) found = strcmp(*f, fmt) == 0;
    if (!found)
        return fail(err, err_len, "cache plugin '%s' has no format '%s'", p->info->name, fmt);
    if (comma && p->info->abi_minor < 8)
        return fail(err, err_len, "cache plugin '%s' takes no settings (built for plugin ABI 1.%s)",
                    p->info->name, p->info->abi_minor < 8 ? "7 or older" : "");
    out->p = p;
    snprintf(out->format, sizeof out->format, "%s", fmt);
    if (comma) snprintf(out->options, sizeof out->options, "%s", comma + 1);
    return 0;
}

void cache_spec_name(const cache_spec *s, char *buf, size_t len) {
    snprintf(buf, len, "%s%s%s", s->format, s->options[0] ? "," : "", s->options);
}

/* The plugin's kv_bits table (ABI 1.13), or NULL. */
static const int32_t *kv_bits_of(const lmh_cache_api *c) {
    return c->size >= offsetof(lmh_cache_api, kv_bits) + sizeof c->kv_bits ? c->kv_bits : NULL;
}

int cache_spec_kv_bits(const registry *reg, int bits, char *spec, size_t spec_len, char *served,
                       size_t served_len) {
    unsigned have = 0; /* bit b: some format stands for kv_bits b */
    for (int i = 0; i < reg->n; i++) {
        if (reg->items[i].info->kind != LMH_KIND_CACHE) continue;
        const lmh_cache_api *c = reg->items[i].info->api;
        const int32_t *kb = kv_bits_of(c);
        for (int f = 0; kb && c->formats[f]; f++) {
            if (kb[f] == bits) {
                snprintf(spec, spec_len, "%s:%s", reg->items[i].info->name, c->formats[f]);
                return 0;
            }
            if (kb[f] > 0 && kb[f] < 32) have |= 1u << kb[f];
        }
    }
    size_t n = 0;
    served[0] = 0;
    for (int b = 1; b < 32 && n < served_len; b++)
        if (have & (1u << b)) {
            have &= ~(1u << b);
            n += (size_t)snprintf(served + n, served_len - n, "%s%d",
                                  !n     ? ""
                                  : have ? ", "
                                         : " and ",
                                  b);
        }
    return -1;
}

char *cache_spec_formats(const registry *reg) {
    size_t cap = 256, n = 0;
    char *out = malloc(cap);
    if (!out) return NULL;
    out[0] = 0;
    for (int i = 0; i < reg->n; i++) {
        if (reg->items[i].info->kind != LMH_KIND_CACHE) continue;
        const lmh_cache_api *c = reg->items[i].info->api;
        for (const char *const *f = c->formats; *f; f++) {
            size_t need = n + strlen(*f) + 3;
            if (need > cap) {
                while (cap < need) cap *= 2;
                char *m = realloc(out, cap);
                if (!m) {
                    free(out);
                    return NULL;
                }
                out = m;
            }
            n += (size_t)snprintf(out + n, cap - n, "%s%s", n ? ", " : "", *f);
        }
    }
    return out;
}
