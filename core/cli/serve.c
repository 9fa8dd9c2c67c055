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
               *top_k = NULL, *top_p = NULL, *min_p = NULL, *temp = NULL, *prefix_mb = NULL,
               *max_conn = NULL, *rate = NULL, *drain = NULL;
    model_args ma = {0};
    spec_args sa = {0};
    cli_opt opts[] = {
        {"--model", &ma.model, NULL, 0, "DIR", "required", HELP_MODEL},
        {"--model-name", &o.model_name, NULL, 0, "NAME", "the directory's name",
         "the model's name in the API (/v1/models, \"model\")"},
        {"--host", &o.host, NULL, 0, "ADDR", "127.0.0.1", "the address to listen on"},
        {"--port", &port, NULL, 0, "N", "5413", "the TCP port to listen on"},
        {"--tls-cert", &o.tls_cert, NULL, 0, "F", "none (HTTP)",
         "PEM certificate chain: HTTPS (with --tls-key)"},
        {"--tls-key", &o.tls_key, NULL, 0, "F", "none", "PEM private key of --tls-cert"},
        {"--api-key", &o.api_key, NULL, 0, "K", "none (open)",
         "requests must send 'Authorization: Bearer K'"},
        {"--api-key-file", &key_file, NULL, 0, "F", "none",
         "--api-key read from the first line of F"},
        {"--max-tokens", &max_tokens, NULL, 0, "N", "2048",
         "a request's max_tokens when it gives none"},
        {"--ctx-size", &ctx, NULL, 0, "N", "the model's",
         "prompt + completion tokens a sequence may hold"},
        {"--parallel", &parallel, NULL, 0, "N", "4", "sequences decoded together"},
        {"--queue", &queue, NULL, 0, "N", "64",
         "requests waiting beyond those (then 503 with Retry-After)"},
        {"--max-connections", &max_conn, NULL, 0, "N", "the open-file limit less a margin",
         "open connections at most; more wait to be accepted"},
        {"--rate-limit", &rate, NULL, 0, "N", "0 (none)",
         "requests a minute per client address (then 429 with Retry-After)"},
        {"--chunk", &chunk, NULL, 0, "N", "256", "prompt tokens a prefill step at most"},
        {"--prefix-cache-mb", &prefix_mb, NULL, 0, "N",
         "an eighth of free memory (CPU), --parallel full contexts (GPU)",
         "the prefix cache's budget (0: off)"},
        {"--timeout", &timeout, NULL, 0, "S", "60", "seconds a client may take to send a request"},
        {"--drain-delay", &drain, NULL, 0, "S", "0",
         "seconds after SIGINT/SIGTERM that new requests are still served while /health "
         "answers 503 (behind a balancer: a few health-check intervals)"},
        {"--shutdown-grace", &grace, NULL, 0, "S", "30",
         "seconds running requests get to finish after the drain delay"},
        {"--max-body", &max_body, NULL, 0, "BYTES", "4194304", "the largest request body"},
        {"--admin-key", &o.admin_key, NULL, 0, "K", "none (admin routes off)",
         "the key POST /admin/backend needs"},
        MODEL_ARG_OPTS(ma),
        {"--top-k", &top_k, NULL, 0, "K", "0 (off)", "top_k when a request gives none"},
        {"--top-p", &top_p, NULL, 0, "P", "1", "top_p when a request gives none"},
        {"--min-p", &min_p, NULL, 0, "M", "0", "min_p when a request gives none"},
        {"--temperature", &temp, NULL, 0, "T", "1", "temperature when a request gives none"},
        SPEC_ARG_OPTS(sa),
        {0}};
    if (cli_parse(argc, argv, opts)) return 2;
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
    INTOPT(max_conn, "--max-connections", 1, 1 << 24, o.max_connections);
    INTOPT(rate, "--rate-limit", 0, 1 << 24, o.rate_limit);
    INTOPT(chunk, "--chunk", 16, 1 << 16, o.chunk);
    INTOPT(prefix_mb, "--prefix-cache-mb", 0, (int64_t)1 << 40, o.prefix_cache_mb);
    INTOPT(timeout, "--timeout", 1, 86400, o.timeout);
    INTOPT(drain, "--drain-delay", 0, 3600, o.drain_delay);
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
