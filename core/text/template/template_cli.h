/* The template subcommand of lmhost. */
#ifndef LMHOST_TEMPLATE_CLI_H
#define LMHOST_TEMPLATE_CLI_H

/* lmhost template --model DIR --messages-file F.json [--tools-file F.json]
 *                 [--no-generation-prompt] [--var NAME=JSON]... [--template-file F]
 * Prints the rendered chat template exactly, nothing added; argv[0] is the subcommand name.
 * Returns the exit code (0 ok, 1 failure, including a template's raise_exception, 2 usage). */
int cli_template(int argc, char **argv);

#endif
