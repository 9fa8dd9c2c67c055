/* A backend plugin for tests, "noquant": the CPU backend (the file LMHOST_TEST_INNER_BACKEND
 * names) without quantized weights, its table cut before tensor_quant. Moving an MLX-quantized
 * model to it must fail cleanly, leaving the old backend serving. Built beside the server
 * tests, outside the host's search path (LMHOST_PLUGIN_PATH brings it in). */
#include "lmhost/lmhost.h"

#include <dlfcn.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

static const lmh_plugin_info *inner;
static lmh_backend_api api;
static lmh_plugin_info info;

static int nq_init(const lmh_host_api *host, char *err, size_t err_len) {
    return inner->init ? inner->init(host, err, err_len) : 0;
}

LMH_EXPORT const lmh_plugin_info *lmhost_plugin_entry(void) {
    if (inner) return &info;
    const char *path = getenv("LMHOST_TEST_INNER_BACKEND");
    void *h = path ? dlopen(path, RTLD_NOW | RTLD_LOCAL) : NULL;
    const lmh_plugin_info *(*entry)(void) =
        h ? (const lmh_plugin_info *(*)(void))(uintptr_t)dlsym(h, "lmhost_plugin_entry") : NULL;
    const lmh_plugin_info *in = entry ? entry() : NULL;
    if (!in || in->kind != LMH_KIND_BACKEND) return NULL;
    const lmh_backend_api *a = in->api;
    api = *a;
    api.size = (uint32_t)offsetof(lmh_backend_api, tensor_quant); /* no quantized weights */
    api.tensor_quant = NULL;
    static const char *const dtypes[] = {"f32", "f16", "bf16", NULL};
    api.weight_dtypes = dtypes;
    info = *in;
    info.name = "noquant";
    info.summary = "test: the CPU backend without quantized weights";
    info.init = nq_init;
    info.api = &api;
    inner = in;
    return &info;
}
