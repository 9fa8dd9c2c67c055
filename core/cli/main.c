/* lmhost: an LLM inference host. The binary is a set of subcommands; models, backends
 * and caches come from plugins. */
#include "cli.h"
#include "hf_cache.h"
#include "hub_download.h"
#include "lmhost/abi.h"
#include "log.h"
#include "template_cli.h"
#include "tokenizer_cli.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const struct {
    const char *name;
    int (*fn)(int, char **);
    const char *help;
} commands[] = {
    {"serve", cli_serve, "serve the OpenAI API over HTTP/HTTPS"},
    {"chat", cli_chat, "talk to a model in the terminal, through its chat template"},
    {"generate", cli_generate, "generate tokens from prompt token ids"},
    {"logits", cli_logits, "write the logits of one prefill as .npy"},
    {"embed", cli_embed, "print pooled, normalized embeddings of token id sequences"},
    {"bench", cli_bench, "measure prefill/decode speed, memory and bytes per token"},
    {"cache-eval", cli_cache_eval, "measure a cache format's error and bits on random vectors"},
    {"quantize", cli_quantize, "write an MLX-format affine-quantized checkpoint"},
    {"dequantize", cli_dequantize, "write the float32 checkpoint a quantized one stands for"},
    {"tokenize", cli_tokenize, "text to token ids"},
    {"detokenize", cli_detokenize, "token ids to text"},
    {"template", cli_template, "render a chat template"},
    {"plugins", cli_plugins, "list the plugins found and what they claim"},
    {"list", cli_list, "list the models in the Hugging Face cache"},
    {"pull", cli_pull, "download a model from the Hugging Face hub into the cache"},
    {"check-plugin", cli_check_plugin, "run a reference fixture through one architecture plugin"},
};

/* --model and --draft-model take a Hugging Face name as well as a directory, for every
 * command: a name's value is replaced by its snapshot directory before the command parses
 * it. serve without --model-name then calls the model by that name. Returns 0, or 1 after
 * printing why a name did not resolve. */
static int resolve_names(int *argc, char ***argv) {
    static char dirs[2][4096];
    static char *grown[256];
    const char *name = NULL;
    int has_name = 0, nd = 0, n = *argc;
    for (int i = 1; i < n; i++) {
        char **a = *argv;
        has_name |= !strcmp(a[i], "--model-name") || !strncmp(a[i], "--model-name=", 13);
        const char *flags[] = {"--model", "--draft-model"};
        for (int f = 0; f < 2; f++) {
            size_t fl = strlen(flags[f]);
            int eq = !strncmp(a[i], flags[f], fl) && a[i][fl] == '=';
            if (!eq && !(strcmp(a[i], flags[f]) == 0 && i + 1 < n)) continue;
            char **slot = eq ? &a[i] : &a[i + 1];
            const char *v = eq ? a[i] + fl + 1 : a[i + 1];
            if (!hfc_is_name(v) || nd == 2) continue;
            char err[4096], dir[4096];
            if (hfc_resolve(v, dir, sizeof dir, err, sizeof err)) {
                /* not (all) in the cache: fetched from the hub, unless offline */
                char why[4096];
                hub_pull_opts po = {0};
                if (hub_offline()) {
                    fprintf(stderr, "lmhost: %s (and HF_HUB_OFFLINE=%s forbids fetching it)\n", err,
                            getenv("HF_HUB_OFFLINE"));
                    return 1;
                }
                if (hub_pull(v, &po, dir, sizeof dir, why, sizeof why)) {
                    fprintf(stderr, "lmhost: %s\nlmhost: fetching it failed: %s\n", err, why);
                    return 1;
                }
            }
            if (f == 0) name = v;
            int w = eq ? snprintf(dirs[nd], sizeof dirs[nd], "%s=%s", flags[f], dir)
                       : snprintf(dirs[nd], sizeof dirs[nd], "%s", dir);
            if (w >= (int)sizeof dirs[nd]) {
                fprintf(stderr, "lmhost: the cache path of %s is too long\n", v);
                return 1;
            }
            *slot = dirs[nd++];
        }
    }
    static char model_name[256];
    if (name && !has_name && !strcmp((*argv)[0], "serve") && n + 2 < 256) {
        snprintf(model_name, sizeof model_name, "%.*s", (int)strcspn(name, "@"), name);
        memcpy(grown, *argv, (size_t)n * sizeof *grown);
        grown[n] = "--model-name";
        grown[n + 1] = model_name;
        grown[n + 2] = NULL;
        *argv = grown;
        *argc = n + 2;
    }
    return 0;
}

/* Whether a command line asks for the command's help (cli_parse answers it). */
static int wants_help(int argc, char **argv) {
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h") ||
            !strcmp(argv[i], "--list-options"))
            return 1;
    return 0;
}

static void usage(FILE *f) {
    fprintf(f, "usage: lmhost COMMAND [options]     (lmhost COMMAND --help: its options)\n"
               "       lmhost --version\n\ncommands:\n");
    for (size_t i = 0; i < sizeof commands / sizeof *commands; i++)
        fprintf(f, "  %-13s %s\n", commands[i].name, commands[i].help);
    fprintf(f, "\nRun 'lmhost COMMAND --help' for a command's options. LMHOST_LOG=0..3 sets "
               "how much goes to stderr.\n");
}

int main(int argc, char **argv) {
    const char *lv = getenv("LMHOST_LOG");
    if (lv && *lv >= '0' && *lv <= '3') log_level = *lv - '0';
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (!strcmp(argv[1], "help") && argc == 3) { /* lmhost help CMD: lmhost CMD --help */
        static char help_flag[] = "--help";
        char *sub[] = {argv[0], argv[2], help_flag, NULL};
        return main(3, sub);
    }
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        usage(stdout);
        return 0;
    }
    if (!strcmp(argv[1], "--version") || !strcmp(argv[1], "version")) {
        printf("lmhost %s (plugin ABI %d.%d)\n", LMHOST_VERSION, LMH_ABI_MAJOR, LMH_ABI_MINOR);
        return 0;
    }
    for (size_t i = 0; i < sizeof commands / sizeof *commands; i++)
        if (!strcmp(argv[1], commands[i].name)) {
            int sub_argc = argc - 1;
            char **sub_argv = argv + 1;
            cli_about = commands[i].help;
            /* (a name that does not resolve is no reason to refuse help) */
            if (strcmp(argv[1], "pull") && !wants_help(sub_argc, sub_argv) &&
                resolve_names(&sub_argc, &sub_argv))
                return 1;
            return commands[i].fn(sub_argc, sub_argv);
        }
    fprintf(stderr, "lmhost: unknown command '%s' (run 'lmhost --help' for the commands)\n",
            argv[1]);
    return 2;
}
