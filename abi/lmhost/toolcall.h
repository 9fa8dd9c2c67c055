/* lmhost plugin ABI: tool-call format plugins (plugins/toolcall-<name>/), ABI 1.13.
 *
 * A tool-call plugin knows how a family of models writes function calls in its output: which
 * chat templates render its format, a streaming parser that turns generated text into plain
 * content, reasoning and calls, and the grammar that forces a call (the OpenAI tool_choice
 * "required" or a named function). The host keeps the OpenAI side: it picks one format per
 * model (detect), reads the request's `tools`, feeds each choice's text to a parser and makes
 * tool_calls entries of the calls. Nothing allocated crosses the boundary: a parser hands its
 * results to the host's sink, and grammars are built with the host's builders. No JSON
 * library is needed: schemas and arguments travel as JSON text.
 *
 * One plugin may read several related formats (one family's older and newer forms): they are
 * its `formats`, and every function below gets the index of the one meant. */
#ifndef LMHOST_TOOLCALL_H
#define LMHOST_TOOLCALL_H

#include "abi.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct lmh_tc_parser lmh_tc_parser; /* the plugin's */
typedef struct lmh_gram lmh_gram;           /* the host's */

/* Where a parser's results go. Each callback returns 0, or nonzero when the host is out of
 * memory: the parser then stops and push/finish return LMH_ENOMEM. */
typedef struct lmh_tc_sink {
    void *ctx;
    /* Text that is certainly plain content, to stream now (it may hold NUL bytes). */
    int (*content)(void *ctx, const char *s, size_t n);
    /* Reasoning the format carries itself (a channel of the model's thoughts). NULL: the
     * host does not want it, drop it. */
    int (*reasoning)(void *ctx, const char *s, size_t n);
    /* A completed call: the function's name (UTF-8 as the model wrote it, unescaped) and its
     * arguments as the compact JSON text of an object (RFC 8259, no whitespace outside
     * strings). Both NUL-terminated, valid during the call only. */
    int (*call)(void *ctx, const char *name, const char *arguments);
} lmh_tc_sink;

/* One tool of the request, read and checked by the host from the OpenAI `tools` array. */
typedef struct lmh_tool {
    uint32_t size;          /* sizeof(lmh_tool) as the host knows it */
    const char *name;       /* the function's name: non-empty */
    const char *parameters; /* its parameters' JSON Schema: compact JSON text of an object
                             * ({"type":"object"} where the request gave none) */
} lmh_tool;

/* The host's grammar builders (constrained decoding). Every builder takes ownership of the
 * grammars it is given, also when it fails, and a NULL argument makes its result NULL, so
 * calls nest without checks. */
typedef struct lmh_gram_api {
    uint32_t size; /* sizeof(lmh_gram_api) as the host knows it */
    /* Exactly these bytes. A special token can only be produced where a literal holds its
     * whole text. */
    lmh_gram *(*lit)(const char *bytes, size_t len);
    /* A JSON document valid against a JSON Schema given as JSON text (NULL: any JSON value).
     * What the host supports and how it writes documents is in docs/serving.md (structured
     * output); NULL with err naming an unsupported keyword and where it is. */
    lmh_gram *(*json)(const char *schema, size_t len, char *err, size_t err_len);
    /* Parts one after the other. */
    lmh_gram *(*seq)(lmh_gram **parts, int n);
    /* One of the parts. */
    lmh_gram *(*alt)(lmh_gram **parts, int n);
    /* g repeated min..max times (max -1: unbounded), sep (may be NULL) between repeats. */
    lmh_gram *(*repeat)(lmh_gram *g, lmh_gram *sep, int min, int max);
    /* Any text that does not contain end, then end. */
    lmh_gram *(*until)(const char *end, size_t len);
    void (*free)(lmh_gram *g);
} lmh_gram_api;

typedef struct lmh_toolcall_api {
    uint32_t size; /* sizeof(lmh_toolcall_api) as the plugin knows it */
    /* The formats this plugin reads, NULL-terminated: the names /health shows as
     * tool_call_format ("hermes"). */
    const char *const *formats;

    /* How surely a model whose chat template (its source text, never NULL or empty) and
     * config.json model_type (NULL when absent) are these writes calls in one of this
     * plugin's formats; *format gets which (it is 0 on entry). The host asks every tool-call
     * plugin and takes the highest score (the first plugin loaded on a tie):
     *   0: not this plugin's;
     *   > 0: this plugin's. The plugins here score a marker only their format renders
     *     60 (hermes), 50 (mistral), 40 (deepseek), 30 (harmony), 20 (llama3), in the order
     *     their markers are told apart, and 10 a guess from model_type alone (a template
     *     that renders tools without any marker known); a new format picks a score that
     *     places it among those;
     *   < 0: a template of this plugin's family in a form it cannot read: a claim scoring
     *     -score or less is not taken, so that the model gets no format rather than a
     *     wrong one (a plugin that reads that form claims it with a higher score). */
    int (*detect)(const char *chat_template, const char *model_type, int *format);

    /* A parser of format `format` for one output; NULL when out of memory. The parser sees
     * decoded text in which special tokens appear as their text, after think sections were
     * split off. It never fails on malformed input: whatever is not a well-formed call
     * comes out as content, byte for byte; feeding a text whole, a byte at a time or in any
     * other pieces gives the same results. Text that may begin a call is held back until
     * it is known. */
    lmh_tc_parser *(*parser_new)(int format);
    /* Feeds n more bytes; what is settled goes to `out` now. Returns the number of calls
     * given to out->call, or LMH_ENOMEM (the parser is then unusable). */
    int (*push)(lmh_tc_parser *p, const char *s, size_t n, const lmh_tc_sink *out);
    /* The end of the output: everything held back is settled (an unfinished call is
     * content). The same return; nothing is pushed after it. */
    int (*finish)(lmh_tc_parser *p, const lmh_tc_sink *out);
    void (*parser_free)(lmh_tc_parser *p);

    /* Forcing a call (both may be NULL: the format cannot be forced, a request that asks is
     * refused). The host calls call_grammar for each tool a request allows, makes one
     * alternative of their grammars and hands it to output_grammar. */

    /* One call of `tool` as the format writes it inside its outer wrapping, with arguments
     * valid against tool->parameters (g->json). NULL with err when it cannot be written
     * (the host puts "tool 'NAME': " in front). */
    lmh_gram *(*call_grammar)(const lmh_gram_api *g, int format, const lmh_tool *tool, char *err,
                              size_t err_len);
    /* The whole output from the generation prompt on, given `calls`, one call of any
     * allowed tool (taken over, also on failure): parallel, one or more calls; else
     * exactly one. NULL with err (empty: out of memory). */
    lmh_gram *(*output_grammar)(const lmh_gram_api *g, int format, lmh_gram *calls, int parallel,
                                char *err, size_t err_len);
} lmh_toolcall_api;

#ifdef __cplusplus
}
#endif
#endif
