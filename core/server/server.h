/* lmhost serve: options and entry point. */
#ifndef LMHOST_SERVER_H
#define LMHOST_SERVER_H

#include <stddef.h>
#include "../cli.h"
#include "../sampler.h"

typedef struct server_opts {
    const char *model_dir, *model_name, *host, *tls_cert, *tls_key, *api_key;
    const char *backend, *cache, *threads, *plugin_dir, *gpu_layers, *device;
    const char *precision; /* exact|fast; NULL: each backend's default */
    /* mixtures of experts: --stream-experts, --expert-cache-mb, --moe-top-k (engine_opts) */
    int stream_experts;
    const char *expert_cache_mb, *moe_top_k;
    const char *admin_key; /* POST /admin/backend needs it; unset: admin routes off */
    int port;
    int max_tokens;          /* default max_tokens of a request */
    int ctx_size;            /* prompt + completion limit; 0: the model's */
    int parallel;            /* sequences decoded together */
    int queue;               /* requests waiting beyond those */
    int chunk;               /* prompt rows per step */
    int64_t prefix_cache_mb; /* the prefix cache's budget; -1: its default (server.c) */
    int timeout;             /* seconds a client may take to send a request */
    int shutdown_grace;      /* seconds in-flight requests get after SIGINT/SIGTERM */
    size_t max_body;
    sampler_params defaults; /* sampling when a request does not say */
    spec_args spec;          /* speculative decoding (spec.h) */
} server_opts;

int server_run(const server_opts *o);
int cli_serve(int argc, char **argv);

#endif
