/* A backend plugin for tests, "noquant": the CPU backend (the file LMHOST_TEST_INNER_BACKEND
 * names) without quantized weights, its table cut before tensor_quant, and without
 * LMH_OP_ARGMAX, as a plugin of ABI 1.1 would be. Moving an MLX-quantized model to it must fail
 * cleanly, leaving the old backend serving; greedy decoding on it takes the logits back and
 * picks on the host. Built beside the server tests, outside the host's search path
 * (LMHOST_PLUGIN_PATH brings it in). */
#include "lmhost/lmhost.h"

#include <dlfcn.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

static const lmh_plugin_info *inner;
static const lmh_backend_api *inner_api;
static lmh_backend_api api;
static lmh_plugin_info info;

static int nq_init(const lmh_host_api *host, char *err, size_t err_len) {
    return inner->init ? inner->init(host, err, err_len) : 0;
}

static int nq_supports(lmh_backend *b, const lmh_op *op) {
    return op->code != LMH_OP_ARGMAX && inner_api->supports(b, op);
}

static int nq_enqueue(lmh_backend *b, const lmh_op *op) {
    return op->code == LMH_OP_ARGMAX ? LMH_EUNSUPPORTED : inner_api->enqueue(b, op);
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
    inner_api = a;
    api.supports = nq_supports;
    api.enqueue = nq_enqueue;
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
