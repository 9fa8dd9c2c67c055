/* libFuzzer target: cache specs as `--cache` and a request's "kv_cache" give them
 * ("PLUGIN", "PLUGIN:FORMAT", "FORMAT", then ",key=value" settings): core/cache_spec.c's
 * parse against a registry of the plain and TurboQuant formats, then the TurboQuant
 * plugin's own parse of the settings (its source included for its static parser).
 * build: see tests/fuzz/run_fuzzers.sh (the "cachespec" row). */
#include "cache_spec.h"

#include "../../plugins/cache-turboquant/cache_tq.c"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* the registry functions cache_spec.c calls, over the table below (plugin_loader.c would
 * bring libltdl) */
static const char *const plain_formats[] = {"f32", "f16", NULL};
static const lmh_cache_api plain_api = {.size = sizeof(lmh_cache_api), .formats = plain_formats};
static const lmh_plugin_info infos[2] = {
    {LMH_PLUGIN_HEADER, .kind = LMH_KIND_CACHE, .name = "plain", .api = &plain_api},
    {LMH_PLUGIN_HEADER, .kind = LMH_KIND_CACHE, .name = "turboquant", .api = &api},
};
static plugin items[2] = {{&infos[0], "plain"}, {&infos[1], "turboquant"}};
static const registry reg = {.items = items, .n = 2, .cap = 2};

const plugin *registry_find(const registry *r, lmh_plugin_kind kind, const char *name) {
    for (int i = 0; i < r->n; i++)
        if (r->items[i].info->kind == kind && strcmp(r->items[i].info->name, name) == 0)
            return &r->items[i];
    return NULL;
}

char *registry_names(const registry *r, lmh_plugin_kind kind, int model_types) {
    (void)model_types;
    char *s = calloc(64, 1);
    for (int i = 0; s && i < r->n; i++)
        if (r->items[i].info->kind == kind)
            snprintf(s + strlen(s), 64 - strlen(s), "%s%s", *s ? ", " : "", r->items[i].info->name);
    return s;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *spec = malloc(size + 1);
    if (!spec) return 0;
    memcpy(spec, data, size);
    spec[size] = 0;
    cache_spec cs;
    char err[512] = "", name[256];
    if (cache_spec_parse(&reg, spec, &cs, err, sizeof err) == 0) {
        cache_spec_name(&cs, name, sizeof name);
        if (cs.p == &items[1]) {
            lmh_cache c = {.bits = strcmp(cs.format, "tq4") == 0 ? 4 : 3};
            c.qjl = c.use_qjl = c.bits == 3;
            err[0] = 0;
            if (parse_options(&c, cs.options, err, sizeof err) != LMH_OK && !err[0])
                __builtin_trap(); /* every refusal says why */
            if (c.step < 0 || c.hot < 0 || c.start < 0) __builtin_trap();
        }
    } else if (!err[0]) {
        __builtin_trap();
    }
    free(spec);
    return 0;
}
