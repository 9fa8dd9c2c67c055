/* Chat templates: a Jinja interpreter for the subset of Jinja2 that Hugging Face chat
 * templates use, rendering them as transformers' apply_chat_template does
 * (ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks, loop controls, the
 * `generation` tag, and the globals raise_exception and strftime_now, its own tojson filter).
 *
 * A compiled template is immutable: it may be rendered from several threads at once. Every
 * error message says where: "LINE:COL: message". Rendering is bounded (output size, memory,
 * steps, recursion depth), so a hostile template fails instead of hanging or exhausting memory. */
#ifndef LMHOST_CHAT_TEMPLATE_H
#define LMHOST_CHAT_TEMPLATE_H

#include <stddef.h>
#include <stdint.h>

#include <json-c/json.h>

/* Result codes: 0 on success, or one of these (negative). */
enum {
    TPL_ERR_SYNTAX = -1,  /* the template does not parse (or names an unknown filter/test) */
    TPL_ERR_RUNTIME = -2, /* undefined operand, type error, ... while rendering */
    TPL_ERR_RAISED = -3,  /* the template called raise_exception(msg): a rejected input */
    TPL_ERR_LIMIT = -4,   /* a limit of tpl_limits was reached */
    TPL_ERR_INPUT = -5,   /* bad arguments or files (tpl_chat_*, tpl_render_chat) */
    TPL_ERR_NOMEM = -6,
};

typedef struct tpl_template tpl_template;

typedef struct tpl_limits {
    size_t max_output;  /* bytes of any one string, the output included (default 32 MiB) */
    size_t max_memory;  /* bytes held by the render's values (default 256 MiB) */
    uint64_t max_steps; /* evaluation steps, loop iterations included (default 20 million) */
    int max_depth;      /* nesting of evaluation, macro calls included (default 400) */
    int64_t now;        /* seconds since the epoch for strftime_now; 0: the clock */
} tpl_limits;

/* Compiles src[0..len). Returns NULL with *err (malloc'd, "LINE:COL: message") on a syntax
 * error or when out of memory; err may be NULL. */
tpl_template *tpl_compile(const char *src, size_t len, char **err);
void tpl_free(tpl_template *t);

/* Renders with the members of the json-c object `vars` as variables (NULL: none). On success
 * returns 0 and *out (malloc'd, NUL-terminated; *out_len its length when out_len is not NULL:
 * the text may hold NULs). On failure returns a TPL_ERR_* code and *err (malloc'd), *out NULL.
 * limits may be NULL for the defaults; fields left 0 take their default. */
int tpl_render(const tpl_template *t, json_object *vars, const tpl_limits *limits, char **out,
               size_t *out_len, char **err);

/* ---- chat templates of a model directory ---------------------------------------------- */

typedef struct tpl_chat tpl_chat;

/* Loads the chat template(s) of a model directory: chat_template.jinja when present (it
 * overrides, as in transformers), else tokenizer_config.json's chat_template, a string or a
 * list of {name, template}; and the special tokens (bos_token, eos_token, ...: strings or
 * {"content": ...} objects). Returns NULL with *err when there is none or it does not compile. */
tpl_chat *tpl_chat_load(const char *model_dir, char **err);
/* The same from a parsed tokenizer_config.json (only what it holds; nothing is kept). */
tpl_chat *tpl_chat_from_config(json_object *tokenizer_config, char **err);
void tpl_chat_free(tpl_chat *chat);

/* Renders as apply_chat_template(messages, tools=tools, add_generation_prompt=...,
 * **extra_vars) does: the variables are the special tokens, then extra_vars (an object, or
 * NULL), then messages, tools (None when NULL), documents (None) and add_generation_prompt.
 * With tools given and a template named "tool_use", that one is used, else "default".
 * Returns 0 and *out (malloc'd), or a TPL_ERR_* code and *err (malloc'd). Thread-safe. */
int tpl_chat_render(const tpl_chat *chat, json_object *messages, json_object *tools,
                    int add_generation_prompt, json_object *extra_vars, char **out, char **err);
/* As tpl_chat_render with limits (NULL: defaults) and the output's length. */
int tpl_chat_render_ex(const tpl_chat *chat, json_object *messages, json_object *tools,
                       int add_generation_prompt, json_object *extra_vars, const tpl_limits *limits,
                       char **out, size_t *out_len, char **err);

/* Convenience: tpl_chat_load + tpl_chat_render + tpl_chat_free. */
int tpl_render_chat(const char *model_dir, json_object *messages, json_object *tools_or_NULL,
                    int add_generation_prompt, json_object *extra_vars_or_NULL, char **out,
                    char **err);

#endif
