/* Subcommands of the lmhost binary and the small option parser they share. */
#ifndef LMHOST_CLI_H
#define LMHOST_CLI_H

#include <stdint.h>
#include <stdio.h>
#include "engine.h"
#include "spec.h"

/* One option: "--name" taking a value (stored in *str) or a flag (*flag = 1). arg, def and
 * help are what `--help` prints of it: the value's name ("N", "DIR"; NULL for flags), its
 * default (a literal, or "required", "off", "the model's", "all cores"...) and one line. The
 * row that ends a table ({0}, or {.help = "..."}) may carry notes that --help prints after
 * the options. */
typedef struct cli_opt {
    const char *name;
    const char **str; /* NULL for flags */
    int *flag;
    int repeatable; /* given again, the last value counts; with both str and flag, every value
                       counts: str[(*flag)++], in order (room for argc values is enough) */
    const char *arg, *def, *help;
} cli_opt;

/* Parses argv[1..argc) against opts (argv[0] is the subcommand). Unknown options, missing
 * values and repeats are errors printed to stderr; returns 0 or 2 (the usage exit code).
 * `--help` or `-h` anywhere an option may stand prints the command's help from the table
 * (cli_help) and exits 0; so does the hidden `--list-options` with the options' names, one a
 * line (for the tests). */
int cli_parse(int argc, char **argv, const cli_opt *opts);
/* The help of command cmd: a usage line (its required options, then [options]), cli_about,
 * and every option of opts with its value, explanation and default, then -h/--help. */
void cli_help(FILE *f, const char *cmd, const cli_opt *opts);
/* The one-line description of the command running (main sets it), for cli_help. */
extern const char *cli_about;
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
    const char *devices, *split, *tensor_split;
    const char *precision;
    const char *plugin_file; /* check-plugin's --plugin: loaded before any other plugin */
    const char *expert_cache_mb, *moe_top_k;
    int stream_experts;
} model_args;

/* --model's help line. */
#define HELP_MODEL "the model: a directory, or a Hugging Face name in the cache (ORG/NAME[@REV])"

/* The option-table rows of model_args (placed in each command's table). */
#define MODEL_ARG_OPTS(a)                                                                          \
    {"--backend",                                                                                  \
     &(a).backend,                                                                                 \
     NULL,                                                                                         \
     0,                                                                                            \
     "NAME[:OPTIONS]",                                                                             \
     "cpu",                                                                                        \
     "the backend plugin that runs the model, and its options (vulkan:max-memory=4G)"},            \
        {"--cache",                                                                                \
         &(a).cache,                                                                               \
         NULL,                                                                                     \
         0,                                                                                        \
         "NAME",                                                                                   \
         "plain",                                                                                  \
         "the cache format and its settings, FORMAT[,KEY=VALUE...] (from the cache plugins: "      \
         "`lmhost plugins`; docs/caches.md)"},                                                     \
        {"--threads", &(a).threads, NULL, 0, "N", "all cores", "CPU threads"},                     \
        {"--plugin-dir",                                                                           \
         &(a).plugin_dir,                                                                          \
         NULL,                                                                                     \
         0,                                                                                        \
         "DIR",                                                                                    \
         "none",                                                                                   \
         "a directory searched for plugins before the usual places"},                              \
        {"--gpu-layers",                                                                           \
         &(a).gpu_layers,                                                                          \
         NULL,                                                                                     \
         0,                                                                                        \
         "N",                                                                                      \
         "all layers",                                                                             \
         "the first N layers on --backend, the rest on the CPU (0: the CPU alone)"},               \
        {"--device", &(a).device, NULL, 0, "N", "0", "the backend's device index"},                \
        {"--devices",                                                                              \
         &(a).devices,                                                                             \
         NULL,                                                                                     \
         0,                                                                                        \
         "N,N[,..]",                                                                               \
         "--device's",                                                                             \
         "several devices of --backend in one process, the layers split over them"},               \
        {"--split",                                                                                \
         &(a).split,                                                                               \
         NULL,                                                                                     \
         0,                                                                                        \
         "layer",                                                                                  \
         "layer",                                                                                  \
         "how --devices share the model: layer (each a contiguous share of layers)"},              \
        {"--tensor-split",                                                                         \
         &(a).tensor_split,                                                                        \
         NULL,                                                                                     \
         0,                                                                                        \
         "W,W[,..]",                                                                               \
         "free memory",                                                                            \
         "with --devices: each device's share of the layers, in proportion (3,1)"},                \
        {"--precision",                                                                            \
         &(a).precision,                                                                           \
         NULL,                                                                                     \
         0,                                                                                        \
         "exact|fast",                                                                             \
         "exact on CPUs, fast on GPUs",                                                            \
         "exact: f32 arithmetic, the same bits in any batch; fast: f16/int8 matrix cores"},        \
        {"--stream-experts",                                                                       \
         NULL,                                                                                     \
         &(a).stream_experts,                                                                      \
         0,                                                                                        \
         NULL,                                                                                     \
         "off",                                                                                    \
         "mixtures of experts: read experts from disk into a resident budget"},                    \
        {"--expert-cache-mb",                                                                      \
         &(a).expert_cache_mb,                                                                     \
         NULL,                                                                                     \
         0,                                                                                        \
         "N",                                                                                      \
         "half the memory available",                                                              \
         "with --stream-experts: the resident experts' budget"},                                   \
    {                                                                                              \
        "--moe-top-k", &(a).moe_top_k, NULL, 0, "K", "the model's",                                \
            "route each token to K of the model's experts"                                         \
    }


/* Speculative decoding's options (spec.h), taken by generate and serve. */
typedef struct spec_args {
    const char *spec, *draft_model, *draft_max, *draft_backend;
} spec_args;

#define SPEC_ARG_OPTS(s)                                                                           \
    {"--spec",                                                                                     \
     &(s).spec,                                                                                    \
     NULL,                                                                                         \
     0,                                                                                            \
     "ngram|draft|off",                                                                            \
     "off (draft with --draft-model)",                                                             \
     "speculative decoding: prompt lookup (ngram) or a draft model"},                              \
        {"--draft-model",                                                                          \
         &(s).draft_model,                                                                         \
         NULL,                                                                                     \
         0,                                                                                        \
         "DIR",                                                                                    \
         "none",                                                                                   \
         "the draft model (same tokenizer): a directory or a Hugging Face name"},                  \
        {"--draft-max", &(s).draft_max, NULL, 0, "N", "8", "tokens proposed a step at most"}, {    \
        "--draft-backend", &(s).draft_backend, NULL, 0, "NAME", "--backend's",                     \
            "the draft model's backend"                                                            \
    }


struct engine;
struct registry;
struct spec;
/* The engine options a describes, checked (errors printed; returns 0 or 2, the usage code). */
int cli_engine_opts(const model_args *a, engine_opts *o);
/* The drafter sa describes, checked (errors printed; returns 0 or 2). */
int cli_spec_opts(const spec_args *sa, spec_opts *so);
/* engine_opts.progress of the commands and the server (cli_engine_opts sets it, ctx the
 * model's directory): a bar "loading MODEL" on a terminal once a load takes over a second. */
void cli_load_progress(void *ctx, uint64_t done, uint64_t total);
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
int cli_chat(int argc, char **argv);
int cli_list(int argc, char **argv);
int cli_pull(int argc, char **argv);

#endif
