/* A cache plugin built for plugin ABI 1.7: its table ends before read_rows and row_bytes.
 * `lmhost cache-eval` must refuse it with a message naming the ABI that added them. It
 * never stores anything (create refuses). */
#include "lmhost/lmhost.h"

#include <stddef.h>
#include <stdio.h>

static const char *const formats[] = {"old17", NULL};

static int create(const lmh_host_api *host, const lmh_backend_api *be, lmh_backend *b,
                  const lmh_cache_config *cfg, lmh_cache **out, char *err, size_t err_len) {
    (void)host;
    (void)be;
    (void)b;
    (void)cfg;
    *out = NULL;
    snprintf(err, err_len, "a test plugin that stores nothing");
    return LMH_EUNSUPPORTED;
}
static int seq_add(lmh_cache *c, uint64_t seq) {
    (void)c;
    (void)seq;
    return LMH_EINVAL;
}
static int append(lmh_cache *c, uint64_t seq, int32_t layer, lmh_tensor *k, lmh_tensor *v) {
    (void)c;
    (void)seq;
    (void)layer;
    (void)k;
    (void)v;
    return LMH_EINVAL;
}
static int attend(lmh_cache *c, uint64_t seq, int32_t layer, lmh_tensor *q, lmh_tensor *q_pos,
                  lmh_tensor *out, const lmh_attn_params *p) {
    (void)c;
    (void)seq;
    (void)layer;
    (void)q;
    (void)q_pos;
    (void)out;
    (void)p;
    return LMH_EINVAL;
}

static const lmh_cache_api api = {
    .size = offsetof(lmh_cache_api, read_rows), /* as a 1.7 plugin knows the table */
    .formats = formats,
    .create = create,
    .seq_add = seq_add,
    .append = append,
    .attend = attend,
};

static const lmh_plugin_info info = {
    LMH_ABI_MAJOR,
    7,
    sizeof(lmh_plugin_info),
    .kind = LMH_KIND_CACHE,
    .name = "old17",
    .version = "0.0.1",
    .summary = "test: a cache table of plugin ABI 1.7",
    .init = NULL,
    .api = &api,
};

LMH_EXPORT const lmh_plugin_info *lmhost_plugin_entry(void) {
    return &info;
}
