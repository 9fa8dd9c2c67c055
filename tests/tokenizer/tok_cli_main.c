/* A stand-alone driver for the tokenize / detokenize subcommands (the lmhost binary wires the
 * same functions): tok_cli tokenize|detokenize [options]. */
#include "tokenizer_cli.h"

#include <stdio.h>
#include <string.h>

int main(int argc, char **argv) {
    if (argc >= 2 && !strcmp(argv[1], "tokenize")) return cli_tokenize(argc - 1, argv + 1);
    if (argc >= 2 && !strcmp(argv[1], "detokenize")) return cli_detokenize(argc - 1, argv + 1);
    fprintf(stderr, "usage: %s tokenize|detokenize [options]\n", argv[0]);
    return 2;
}
