/* Tool calls in a model's output: which format a model uses (told from its chat template),
 * a streaming parser that turns generated text into plain content and OpenAI tool calls,
 * and the grammar that forces a call (tool_choice "required" or a named function).
 *
 * The parser sees decoded text in which special tokens appear as their text. It never
 * fails on malformed input: whatever is not a well-formed call (an unclosed tag, bad JSON,
 * a missing name, arguments that are not an object, a truncated call) comes out as content,
 * byte for byte. Feeding a text whole, a byte at a time or in any other pieces gives the
 * same content and calls. Whitespace that only separates a call from its surroundings
 * (before a call's opening marker, after its end) is formatting and is dropped.
 *
 * What each format holds back: Hermes, Mistral and DeepSeek release text up to a call's
 * opening marker at once and each call when it closes. A Llama 3 reply that begins with '{'
 * (or text from <|python_tag|> on) is held to the end: it is calls only if it is nothing
 * else. Harmony's final and commentary channels are content, its analysis channel reasoning
 * (tc_parser_set_reasoning), its markers are dropped, and a message to=functions.NAME is a
 * call; built-in tools (to=browser..., to=python) are left as content. */
#ifndef LMHOST_TOOLCALL_H
#define LMHOST_TOOLCALL_H

#include <json-c/json.h>
#include <stddef.h>
#include "grammar.h"

typedef enum {
    TC_NONE = 0,    /* the template knows no tool calls (e.g. Gemma 3, Llama 2) */
    TC_HERMES,      /* Hermes / Qwen: <tool_call>\n{"name": N, "arguments": {..}}\n</tool_call> */
    TC_LLAMA3,      /* Llama 3.1+: the reply is {"name": N, "parameters": {..}} (; more) */
    TC_MISTRAL,     /* Mistral: [TOOL_CALLS][{"name": N, "arguments": {..}}, ...] */
    TC_MISTRAL_V11, /* newer Mistral templates: [TOOL_CALLS]N[ARGS]{..} */
    TC_HARMONY,     /* gpt-oss: to=functions.N<|channel|>commentary json<|message|>{..}<|call|> */
    TC_DEEPSEEK, /* DeepSeek V3: <｜tool▁call▁begin｜>function<｜tool▁sep｜>N\n```json\n{..}... */
} tc_format;

/* The format a model uses, told from its chat template text (the markers it renders);
 * model_type (config.json; may be NULL) decides only for a template that renders tools
 * without a marker this knows. TC_NONE when the template knows no tools (or is NULL). */
tc_format tc_detect(const char *chat_template, const char *model_type);
/* "none", "hermes", "llama3", "mistral", "mistral-v11", "harmony", "deepseek". */
const char *tc_format_name(tc_format f);

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

/* NULL when out of memory. A TC_NONE parser passes all text through as content. Every
 * parser accepts both Mistral forms. */
tc_parser *tc_parser_new(tc_format f);
/* Harmony's analysis channel (the model's reasoning) is appended to *reasoning from now on
 * instead of being dropped; NULL drops it again. The buffer must outlive the pushes. */
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
 * exactly one (harmony ends a turn at each call, so it is always one). The arguments are
 * valid against each tool's `parameters` schema. NULL with err: f is TC_NONE, only_name
 * is not among the tools, a tool is malformed, or a tool's schema uses what the grammar
 * does not support (the message names the tool). The grammar is the whole output from the
 * generation prompt on: a think section before it is the caller's to put in front
 * (gram_until("</think>")); harmony's own analysis message is already allowed. */
gram *tc_grammar(tc_format f, json_object *tools, const char *only_name, int parallel, char *err,
                 size_t err_len);

#endif
