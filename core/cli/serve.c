/* lmhost serve: option parsing. */
#include "cli.h"
#include "log.h"
#include "server.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char *read_key_file(const char *path) {
    FILE *f = fopen(path, "r");
    if (!f) {
        fprintf(stderr, "lmhost serve: cannot read --api-key-file %s: %m\n", path);
        return NULL;
    }
    char buf[4096];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    buf[strcspn(buf, "\r\n")] = 0; /* the first line is the key */
    if (!buf[0]) {
        fprintf(stderr, "lmhost serve: --api-key-file %s is empty\n", path);
        return NULL;
    }
    return strdup(buf);
}

int cli_serve(int argc, char **argv) {
    server_opts o = {.host = "127.0.0.1",
                     .port = 5413,
                     .max_tokens = 2048,
                     .parallel = 4,
                     .queue = 64,
                     .chunk = 256,
                     .prefix_cache_mb = -1,
                     .timeout = 60,
                     .shutdown_grace = 30,
                     .max_body = 4u << 20};
    o.defaults = sampler_defaults();
    o.defaults.temperature = 1.0f; /* OpenAI's default when a request does not say */
    const char *port = NULL, *max_tokens = NULL, *ctx = NULL, *parallel = NULL, *queue = NULL,
               *chunk = NULL, *timeout = NULL, *grace = NULL, *max_body = NULL, *key_file = NULL,
               *top_k = NULL, *top_p = NULL, *min_p = NULL, *temp = NULL, *prefix_mb = NULL;
    int help = 0;
    model_args ma = {0};
    spec_args sa = {0};
    cli_opt opts[] = {{"--model", &ma.model, NULL, 0},
                      {"--model-name", &o.model_name, NULL, 0},
                      {"--host", &o.host, NULL, 0},
                      {"--port", &port, NULL, 0},
                      {"--tls-cert", &o.tls_cert, NULL, 0},
                      {"--tls-key", &o.tls_key, NULL, 0},
                      {"--api-key", &o.api_key, NULL, 0},
                      {"--api-key-file", &key_file, NULL, 0},
                      {"--max-tokens", &max_tokens, NULL, 0},
                      {"--ctx-size", &ctx, NULL, 0},
                      {"--parallel", &parallel, NULL, 0},
                      {"--queue", &queue, NULL, 0},
                      {"--chunk", &chunk, NULL, 0},
                      {"--prefix-cache-mb", &prefix_mb, NULL, 0},
                      {"--timeout", &timeout, NULL, 0},
                      {"--shutdown-grace", &grace, NULL, 0},
                      {"--max-body", &max_body, NULL, 0},
                      {"--admin-key", &o.admin_key, NULL, 0},
                      MODEL_ARG_OPTS(ma),
                      {"--top-k", &top_k, NULL, 0},
                      {"--top-p", &top_p, NULL, 0},
                      {"--min-p", &min_p, NULL, 0},
                      {"--temperature", &temp, NULL, 0},
                      SPEC_ARG_OPTS(sa),
                      {"--help", NULL, &help, 0},
                      {0}};
    if (cli_parse(argc, argv, opts)) return 2;
    if (help) {
        printf("usage: lmhost serve --model DIR [--host 127.0.0.1] [--port 5413] [--tls-cert F "
               "--tls-key F] [--api-key K | --api-key-file F] [--max-tokens 2048] [--ctx-size N] "
               "[--parallel 4] [--queue 64] [--chunk 256] [--prefix-cache-mb N] [--timeout 60] "
               "[--shutdown-grace 30] "
               "[--max-body BYTES] [--backend NAME] [--gpu-layers N] [--device N] "
               "[--precision exact|fast] [--stream-experts [--expert-cache-mb N]] "
               "[--moe-top-k K] [--admin-key K] [--cache NAME] [--threads N] [--top-k 0] "
               "[--top-p 1.0] [--min-p 0] [--temperature 1.0] [--model-name NAME] "
               "[--plugin-dir DIR] " SPEC_ARG_HELP "\n");
        return 0;
    }
    if (!ma.model) {
        fprintf(stderr, "lmhost serve: --model DIR is required\n");
        return 2;
    }
    if (cli_engine_opts(&ma, &o.engine) || cli_spec_opts(&sa, &o.spec)) return 2;
    o.plugin_dir = ma.plugin_dir;
    int64_t v;
    double d;
#define INTOPT(s, name, lo, hi, dst)                                                               \
    if (s) {                                                                                       \
        if (cli_int(name, s, lo, hi, &v)) return 2;                                                \
        dst = v;                                                                                   \
    }
    INTOPT(port, "--port", 0, 65535, o.port);
    INTOPT(max_tokens, "--max-tokens", 1, 1 << 24, o.max_tokens);
    INTOPT(ctx, "--ctx-size", 1, 1 << 26, o.ctx_size);
    INTOPT(parallel, "--parallel", 1, 1024, o.parallel);
    INTOPT(queue, "--queue", 0, 1 << 20, o.queue);
    INTOPT(chunk, "--chunk", 16, 1 << 16, o.chunk);
    INTOPT(prefix_mb, "--prefix-cache-mb", 0, (int64_t)1 << 40, o.prefix_cache_mb);
    INTOPT(timeout, "--timeout", 1, 86400, o.timeout);
    INTOPT(grace, "--shutdown-grace", 0, 86400, o.shutdown_grace);
    INTOPT(max_body, "--max-body", 1024, 1 << 30, o.max_body);
    INTOPT(top_k, "--top-k", 0, 1 << 30, o.defaults.top_k);
#undef INTOPT
    if (top_p) {
        if (cli_float("--top-p", top_p, 1e-9, 1, &d)) return 2;
        o.defaults.top_p = (float)d;
    }
    if (min_p) {
        if (cli_float("--min-p", min_p, 0, 1, &d)) return 2;
        o.defaults.min_p = (float)d;
    }
    if (temp) {
        if (cli_float("--temperature", temp, 0, 2, &d)) return 2;
        o.defaults.temperature = (float)d;
    }
    char *key = NULL;
    if (key_file) {
        if (o.api_key) {
            fprintf(stderr, "lmhost serve: give --api-key or --api-key-file, not both\n");
            return 2;
        }
        if (!(key = read_key_file(key_file))) return 2;
        o.api_key = key;
    }
    int rc = server_run(&o);
    free(key);
    return rc;
}
