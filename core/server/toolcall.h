/* Tool calls in a model's output, the host's side of the tool-call plugins (plugin ABI
 * toolcall.h): which format a model uses (the plugin that claims its chat template), a
 * streaming parser that turns generated text into plain content and OpenAI tool calls, and
 * the grammar that forces a call (tool_choice "required" or a named function). The formats
 * themselves, and what each holds back while a call may be under way, are the plugins'.
 *
 * The parser sees decoded text in which special tokens appear as their text. It never fails
 * on malformed input: whatever is not a well-formed call comes out as content, byte for byte.
 * Feeding a text whole, a byte at a time or in any other pieces gives the same content and
 * calls. */
#ifndef LMHOST_SERVER_TOOLCALL_H
#define LMHOST_SERVER_TOOLCALL_H

#include <json-c/json.h>
#include <stddef.h>
#include "grammar.h"
#include "plugin_loader.h"

/* A model's tool-call format: one of a plugin's formats, or none. Zero-initialised: none. */
typedef struct tc_format {
    const lmh_toolcall_api *api; /* NULL: the template knows no tool calls this host reads */
    int index;                   /* among api->formats */
} tc_format;

/* The format a model uses, told from its chat template text by the registry's tool-call
 * plugins (the highest score of their detect; none when none claims it, when one refuses
 * it, or when the template is NULL or empty); model_type is config.json's (may be NULL). */
void tc_detect(const registry *r, const char *chat_template, const char *model_type,
               tc_format *out);
/* The format of this name among the registry's plugins ("none" too). -1 when none has it. */
int tc_format_find(const registry *r, const char *name, tc_format *out);
/* Its name ("none" for none): what /health shows as tool_call_format. */
const char *tc_format_name(const tc_format *f);

/* A growable text buffer; p is NUL-terminated once anything was added. Zero-initialise. */
typedef struct tc_buf {
    char *p;
    size_t len, cap;
} tc_buf;
void tc_buf_free(tc_buf *b);

typedef struct tc_call {
    char *name;      /* as the model wrote it (unescaped UTF-8) */
    char *arguments; /* compact JSON text of an object */
} tc_call;

typedef struct tc_parser tc_parser;

/* NULL when out of memory. A parser of no format passes all text through as content. */
tc_parser *tc_parser_new(const tc_format *f);
/* Reasoning the format carries itself (a channel of the model's thoughts) is appended to
 * *reasoning from now on instead of being dropped; NULL drops it again. The buffer must
 * outlive the pushes. */
void tc_parser_set_reasoning(tc_parser *p, tc_buf *reasoning);
/* Feeds n bytes of generated content text (after think sections were split off), decoded
 * without skipping special tokens. Appends to *content what is certainly plain text (to
 * stream now) and appends to *calls (an array the caller owns, grown with realloc, NULL at
 * first; *n_calls its length; free with tc_calls_free) each call completed so far.
 * Text that may begin a call is held back until it is known. Returns how many calls were
 * appended, or -1 when out of memory (the parser is then unusable). */
int tc_push(tc_parser *p, const char *s, size_t n, tc_buf *content, tc_call **calls, int *n_calls);
/* The end of the output: everything still held back is resolved (an unfinished call is
 * content). Same outputs and return as tc_push; push nothing after it. */
int tc_finish(tc_parser *p, tc_buf *content, tc_call **calls, int *n_calls);
void tc_parser_free(tc_parser *p);
void tc_calls_free(tc_call *c, int n);

/* The grammar that forces a call in format f: one of `tools` (the request's OpenAI tools
 * array), or only the one named only_name (not NULL); parallel: one or more calls, else
 * exactly one (a format may allow only one). The arguments are valid against each tool's
 * `parameters` schema. NULL with err: f is none (or cannot be forced), only_name is not
 * among the tools, a tool is malformed, or a tool's schema uses what the grammar does not
 * support or its name cannot be written in the format (the message names the tool). The
 * grammar is the whole output from the generation prompt on: a think section before it is
 * the caller's to put in front (gram_until("</think>")). */
gram *tc_grammar(const tc_format *f, json_object *tools, const char *only_name, int parallel,
                 char *err, size_t err_len);

#endif
