/* lmhost: an LLM inference host. The binary is a set of subcommands; models, backends
 * and caches come from plugins. */
#include "cli.h"
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
    {"check-plugin", cli_check_plugin, "run a reference fixture through one architecture plugin"},
};

static void usage(FILE *f) {
    fprintf(f, "usage: lmhost COMMAND [options]\n\ncommands:\n");
    for (size_t i = 0; i < sizeof commands / sizeof *commands; i++)
        fprintf(f, "  %-11s %s\n", commands[i].name, commands[i].help);
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
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        usage(stdout);
        return 0;
    }
    if (!strcmp(argv[1], "--version")) {
        printf("lmhost %s (plugin ABI %d.%d)\n", LMHOST_VERSION, LMH_ABI_MAJOR, LMH_ABI_MINOR);
        return 0;
    }
    for (size_t i = 0; i < sizeof commands / sizeof *commands; i++)
        if (!strcmp(argv[1], commands[i].name)) return commands[i].fn(argc - 1, argv + 1);
    fprintf(stderr, "lmhost: unknown command '%s'\n", argv[1]);
    usage(stderr);
    return 2;
}
