/* The tokenize and detokenize subcommands of lmhost. */
#ifndef LMHOST_TOKENIZER_CLI_H
#define LMHOST_TOKENIZER_CLI_H

/* lmhost tokenize --model DIR (--text S | --text-file F) [--special]
 * Prints {"ids": [...]}; argv[0] is the subcommand name. Returns the exit code (0 ok, 1 failure,
 * 2 usage). */
int cli_tokenize(int argc, char **argv);

/* lmhost detokenize --model DIR --ids 1,2,3
 * Prints {"text": "..."} (special tokens kept); argv[0] is the subcommand name. */
int cli_detokenize(int argc, char **argv);

#endif
