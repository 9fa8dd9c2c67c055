/* Subcommands of the lmhost binary and the small option parser they share. */
#ifndef LMHOST_CLI_H
#define LMHOST_CLI_H

#include <stdint.h>
#include "engine.h"
#include "spec.h"

/* One option: "--name" taking a value (stored in *str) or a flag (*flag = 1). */
typedef struct cli_opt {
    const char *name;
    const char **str; /* NULL for flags */
    int *flag;
    int repeatable; /* given again, the last value counts; with both str and flag, every value
                       counts: str[(*flag)++], in order (room for argc values is enough) */
} cli_opt;

/* Parses argv[1..argc) against opts (argv[0] is the subcommand). Unknown options, missing
 * values and repeats are errors printed to stderr; returns 0 or 2 (the usage exit code). */
int cli_parse(int argc, char **argv, const cli_opt *opts);
/* Strict numeric values: the whole string must parse and lie in range. */
int cli_int(const char *opt, const char *s, int64_t lo, int64_t hi, int64_t *out);
int cli_float(const char *opt, const char *s, double lo, double hi, double *out);
/* --precision's value: "exact" (1) or "fast" (2), as lmh_precision; NULL leaves 0 (each
 * backend's default). Prints the error and returns 2 on anything else. */
int cli_precision(const char *s, int *out);
/* "1,2,3" into a malloc'd array. */
int cli_ids(const char *opt, const char *s, int32_t **ids, int32_t *n);

/* Options every model command takes. */
typedef struct model_args {
    const char *model, *backend, *cache, *threads, *plugin_dir, *tokens, *gpu_layers, *device;
    const char *precision;
    const char *plugin_file; /* check-plugin's --plugin: loaded before any other plugin */
    const char *expert_cache_mb, *moe_top_k;
    int stream_experts;
} model_args;

/* The option-table rows of model_args (placed in each command's table). */
#define MODEL_ARG_OPTS(a)                                                                          \
    {"--backend", &(a).backend, NULL, 0}, {"--cache", &(a).cache, NULL, 0},                        \
        {"--threads", &(a).threads, NULL, 0}, {"--plugin-dir", &(a).plugin_dir, NULL, 0},          \
        {"--gpu-layers", &(a).gpu_layers, NULL, 0}, {"--device", &(a).device, NULL, 0},            \
        {"--precision", &(a).precision, NULL, 0},                                                  \
        {"--stream-experts", NULL, &(a).stream_experts, 0},                                        \
        {"--expert-cache-mb", &(a).expert_cache_mb, NULL, 0}, {                                    \
        "--moe-top-k", &(a).moe_top_k, NULL, 0                                                     \
    }

#define MODEL_ARG_HELP                                                                             \
    "[--backend NAME] [--gpu-layers N] [--device N] [--cache NAME] [--threads N] "                 \
    "[--precision exact|fast] [--plugin-dir DIR] [--stream-experts [--expert-cache-mb N]] "        \
    "[--moe-top-k K]"

/* Speculative decoding's options (spec.h), taken by generate and serve. */
typedef struct spec_args {
    const char *spec, *draft_model, *draft_max, *draft_backend;
} spec_args;

#define SPEC_ARG_OPTS(s)                                                                           \
    {"--spec", &(s).spec, NULL, 0}, {"--draft-model", &(s).draft_model, NULL, 0},                  \
        {"--draft-max", &(s).draft_max, NULL, 0}, {                                                \
        "--draft-backend", &(s).draft_backend, NULL, 0                                             \
    }

#define SPEC_ARG_HELP                                                                              \
    "[--spec ngram|draft|off] [--draft-model DIR] [--draft-max 8] [--draft-backend NAME]"

struct engine;
struct registry;
struct spec;
/* The engine options a describes, checked (errors printed; returns 0 or 2, the usage code). */
int cli_engine_opts(const model_args *a, engine_opts *o);
/* The drafter sa describes, checked (errors printed; returns 0 or 2). */
int cli_spec_opts(const spec_args *sa, spec_opts *so);
/* Loads plugins into *reg (always free it) and opens the model; NULL after printing why. */
struct engine *cli_open_engine(const model_args *a, struct registry *reg);
/* Prefills sequence `seq` with ids in chunks; last[vocab] gets the last position's logits,
 * all[n * vocab] (optional) every position's. Prints errors; returns 0 or 1. */
int cli_prefill(struct engine *e, uint64_t seq, const int32_t *ids, int32_t n, int32_t chunk,
                float *all, float *last);

/* The drafter spec_args ask for, for `target` (opened from `a`; the draft model opens with
 * a's options but its own directory and --draft-backend, its plugins from *reg). *sp stays
 * NULL where none is asked for; *draft is the draft model's engine, to close after
 * spec_free. Returns 0, or 2 (usage) / 1 (failure) after printing why. */
int cli_open_spec(const spec_args *sa, const model_args *a, struct registry *reg,
                  struct engine *target, int32_t chunk, struct spec **sp, struct engine **draft);

int cli_plugins(int argc, char **argv);
int cli_logits(int argc, char **argv);
int cli_generate(int argc, char **argv);
int cli_bench(int argc, char **argv);
int cli_quantize(int argc, char **argv);
int cli_dequantize(int argc, char **argv);
int cli_cache_eval(int argc, char **argv);
int cli_check_plugin(int argc, char **argv);
int cli_embed(int argc, char **argv);
int cli_serve(int argc, char **argv);

#endif
