/* Plugins the host must refuse, each built from this file with one -D switch:
 * BAD_MAJOR (ABI major + 1), NEWER_MINOR (a minor version the host does not know yet), NO_ENTRY (no
 * entry symbol), FAIL_INIT (init says no), BAD_TABLE (a backend table without its required
 * functions), BAD_TOOLCALL (a tool-call table without its parser), OLD_TOOLCALL (a tool-call
 * plugin that says it was built for ABI 1.12, before the kind existed). */
#include "lmhost/lmhost.h"

#include <stdio.h>

__attribute__((unused)) static int fail_init(const lmh_host_api *host, char *err, size_t len) {
    (void)host;
    snprintf(err, len, "needs hardware this machine lacks");
    return -1;
}

static const char *const types[] = {"test_refused", NULL};
/* A complete table, so that only the reason under test can refuse the plugin. */
static int load(const lmh_host_api *h, lmh_load_ctx *ld, lmh_model **out) {
    (void)out;
    return h->fail(ld, "test plugin");
}
static int forward(lmh_model *m, const lmh_host_api *h, lmh_fwd *f, const lmh_batch *b) {
    (void)m;
    (void)h;
    (void)f;
    (void)b;
    return LMH_EINVAL;
}
static void unload(lmh_model *m) {
    (void)m;
}
__attribute__((unused)) static const lmh_arch_api arch = {.size = sizeof(lmh_arch_api),
                                                          .model_types = types,
                                                          .load = load,
                                                          .forward = forward,
                                                          .unload = unload};
__attribute__((unused)) static const lmh_backend_api backend = {.size = sizeof(lmh_backend_api)};
static const char *const tc_formats[] = {"test-refused", NULL};
static int detect(const char *t, const char *model_type, int *format) {
    (void)t, (void)model_type, (void)format;
    return 0;
}
__attribute__((unused)) static const lmh_toolcall_api toolcall = {
    .size = sizeof(lmh_toolcall_api), .formats = tc_formats, .detect = detect};

static const lmh_plugin_info info = {
#ifdef BAD_MAJOR
    LMH_ABI_MAJOR + 1,        0,
    sizeof(lmh_plugin_info),
#elif defined(NEWER_MINOR)
    LMH_ABI_MAJOR,          LMH_ABI_MINOR + 1, sizeof(lmh_plugin_info),
#elif defined(OLD_TOOLCALL)
    LMH_ABI_MAJOR,           12,
    sizeof(lmh_plugin_info),
#else
    LMH_PLUGIN_HEADER,
#endif
#ifdef BAD_TABLE
    .kind = LMH_KIND_BACKEND, .api = &backend,
#elif defined(BAD_TOOLCALL) || defined(OLD_TOOLCALL)
    .kind = LMH_KIND_TOOLCALL, .api = &toolcall,
#else
    .kind = LMH_KIND_ARCH,   .api = &arch,
#endif
    .name = "test-refused",   .version = "0",
#ifdef FAIL_INIT
    .init = fail_init,
#endif
};

#ifndef NO_ENTRY
LMH_EXPORT const lmh_plugin_info *lmhost_plugin_entry(void) {
    return &info;
}
#else
LMH_EXPORT const lmh_plugin_info *some_other_symbol(void) {
    return &info;
}
#endif
