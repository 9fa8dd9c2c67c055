/* lmhost serve: options and entry point. */
#ifndef LMHOST_SERVER_H
#define LMHOST_SERVER_H

#include <stddef.h>
#include "engine.h"
#include "sampler.h"
#include "spec.h"

typedef struct server_opts {
    engine_opts engine;     /* the model and where it runs (engine.model_dir: its directory) */
    const char *plugin_dir; /* searched for plugins besides the usual places */
    const char *model_name, *host, *tls_cert, *tls_key, *api_key;
    const char *admin_key; /* POST /admin/backend needs it; unset: admin routes off */
    int port;
    int max_tokens;          /* default max_tokens of a request */
    int ctx_size;            /* prompt + completion limit; 0: the model's */
    int parallel;            /* sequences decoded together */
    int queue;               /* requests waiting beyond those */
    int chunk;               /* prompt rows per step */
    int64_t prefix_cache_mb; /* the prefix cache's budget; -1: its default (server.c) */
    int timeout;             /* seconds a client may take to send a request (or to take a
                                reply's bytes) */
    int max_connections;     /* open connections at most; 0: from the open-file limit */
    int rate_limit;          /* requests a minute per client address; 0: no limit */
    int drain_delay;         /* seconds after SIGINT/SIGTERM that requests are still served
                                while /health says 503 "draining" */
    int shutdown_grace;      /* seconds in-flight requests get after that */
    size_t max_body;
    sampler_params defaults; /* sampling when a request does not say */
    spec_opts spec;          /* speculative decoding */
} server_opts;

int server_run(const server_opts *o);

#endif
