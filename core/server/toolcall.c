/* Tool calls: the host's side of the tool-call plugins (toolcall.h). Picks a model's format
 * among the registry's plugins, adapts a plugin's parser to the server's buffers and call
 * arrays, and turns the request's OpenAI tools into what a plugin's grammar takes, with the
 * grammar builders (grammar.h) as the plugin ABI's lmh_gram_api. */
#include "toolcall.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

__attribute__((format(printf, 3, 4))) static void errf(char *err, size_t len, const char *fmt,
                                                       ...) {
    va_list ap;
    va_start(ap, fmt);
    if (err && len) vsnprintf(err, len, fmt, ap);
    va_end(ap);
}

/* ---- the format ----------------------------------------------------------------------- */

static const lmh_toolcall_api *toolcall_api(const plugin *p) {
    return p->info->kind == LMH_KIND_TOOLCALL ? p->info->api : NULL;
}

/* How many formats a plugin names. */
static int n_formats(const lmh_toolcall_api *a) {
    int n = 0;
    while (a->formats[n]) n++;
    return n;
}

void tc_detect(const registry *r, const char *t, const char *model_type, tc_format *out) {
    *out = (tc_format){0};
    if (!t || !*t) return;
    int best = 0, refused = 0;
    for (int i = 0; i < r->n; i++) {
        const lmh_toolcall_api *a = toolcall_api(&r->items[i]);
        if (!a) continue;
        int format = 0, score = a->detect(t, model_type, &format);
        if (score < 0 && -score > refused) refused = -score;
        if (score > best && format >= 0 && format < n_formats(a)) {
            best = score;
            *out = (tc_format){a, format};
        }
    }
    /* a plugin that knows the template as a form it cannot read outranks lower claims */
    if (refused >= best) *out = (tc_format){0};
}

int tc_format_find(const registry *r, const char *name, tc_format *out) {
    *out = (tc_format){0};
    if (!strcmp(name, "none")) return 0;
    for (int i = 0; i < r->n; i++) {
        const lmh_toolcall_api *a = toolcall_api(&r->items[i]);
        for (int k = 0; a && a->formats[k]; k++)
            if (!strcmp(a->formats[k], name)) {
                *out = (tc_format){a, k};
                return 0;
            }
    }
    return -1;
}

const char *tc_format_name(const tc_format *f) {
    return f && f->api ? f->api->formats[f->index] : "none";
}

/* ---- the parser ----------------------------------------------------------------------- */

static int buf_add(tc_buf *b, const char *s, size_t n) {
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 64;
        while (cap < b->len + n + 1) cap *= 2;
        char *q = realloc(b->p, cap);
        if (!q) return -1;
        b->p = q;
        b->cap = cap;
    }
    if (n) memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = 0;
    return 0;
}

void tc_buf_free(tc_buf *b) {
    if (!b) return;
    free(b->p);
    b->p = NULL;
    b->len = b->cap = 0;
}

void tc_calls_free(tc_call *c, int n) {
    for (int i = 0; c && i < n; i++) {
        free(c[i].name);
        free(c[i].arguments);
    }
    free(c);
}

struct tc_parser {
    const lmh_toolcall_api *api; /* NULL: text passes through */
    lmh_tc_parser *p;
    tc_buf *reasoning;
    int oom;
};

/* One push's outputs, as the plugin's sink sees them. */
typedef struct sink_ctx {
    tc_buf *content, *reasoning;
    tc_call **calls;
    int *n_calls;
} sink_ctx;

static int sink_content(void *ctx, const char *s, size_t n) {
    return buf_add(((sink_ctx *)ctx)->content, s, n);
}

static int sink_reasoning(void *ctx, const char *s, size_t n) {
    return buf_add(((sink_ctx *)ctx)->reasoning, s, n);
}

static int sink_call(void *ctx, const char *name, const char *arguments) {
    sink_ctx *c = ctx;
    tc_call *a = realloc(*c->calls, (size_t)(*c->n_calls + 1) * sizeof *a);
    if (!a) return -1;
    *c->calls = a;
    char *nm = strdup(name), *args = strdup(arguments);
    if (!nm || !args) {
        free(nm);
        free(args);
        return -1;
    }
    a[(*c->n_calls)++] = (tc_call){nm, args};
    return 0;
}

tc_parser *tc_parser_new(const tc_format *f) {
    tc_parser *p = calloc(1, sizeof *p);
    if (!p || !f || !f->api) return p;
    p->api = f->api;
    if (!(p->p = f->api->parser_new(f->index))) {
        free(p);
        return NULL;
    }
    return p;
}

void tc_parser_set_reasoning(tc_parser *p, tc_buf *reasoning) {
    p->reasoning = reasoning;
}

static int feed(tc_parser *p, const char *s, size_t n, int eof, tc_buf *content, tc_call **calls,
                int *n_calls) {
    if (p->oom) return -1;
    int before = *n_calls;
    if (!p->api) {
        if (n && buf_add(content, s, n)) p->oom = 1;
        return p->oom ? -1 : 0;
    }
    sink_ctx ctx = {content, p->reasoning, calls, n_calls};
    lmh_tc_sink sink = {&ctx, sink_content, p->reasoning ? sink_reasoning : NULL, sink_call};
    int r = eof ? p->api->finish(p->p, &sink) : p->api->push(p->p, s, n, &sink);
    if (r < 0) p->oom = 1;
    return p->oom ? -1 : *n_calls - before;
}

int tc_push(tc_parser *p, const char *s, size_t n, tc_buf *content, tc_call **calls, int *n_calls) {
    return feed(p, s, n, 0, content, calls, n_calls);
}

int tc_finish(tc_parser *p, tc_buf *content, tc_call **calls, int *n_calls) {
    return feed(p, NULL, 0, 1, content, calls, n_calls);
}

void tc_parser_free(tc_parser *p) {
    if (!p) return;
    if (p->api) p->api->parser_free(p->p);
    free(p);
}

/* ---- the grammar that forces a call ----------------------------------------------------- */

/* The plugin ABI's builders over grammar.h: an lmh_gram is a gram. */
static lmh_gram *g_lit(const char *bytes, size_t len) {
    return (lmh_gram *)gram_lit(bytes, len);
}

static lmh_gram *g_json(const char *schema, size_t len, char *err, size_t err_len) {
    if (!schema) return (lmh_gram *)gram_json(NULL, err, err_len);
    json_tokener *tk = json_tokener_new_ex(256);
    if (!tk) return NULL;
    json_object *o = len <= INT32_MAX ? json_tokener_parse_ex(tk, schema, (int)len) : NULL;
    int whole = o && json_tokener_get_error(tk) == json_tokener_success &&
                (size_t)json_tokener_get_parse_end(tk) == len;
    json_tokener_free(tk);
    gram *g = NULL;
    if (whole)
        g = gram_json(o, err, err_len);
    else
        errf(err, err_len, "the schema is not JSON");
    json_object_put(o);
    return (lmh_gram *)g;
}

static lmh_gram *g_seq(lmh_gram **parts, int n) {
    return (lmh_gram *)gram_seq((gram **)parts, n);
}

static lmh_gram *g_alt(lmh_gram **parts, int n) {
    return (lmh_gram *)gram_alt((gram **)parts, n);
}

static lmh_gram *g_repeat(lmh_gram *g, lmh_gram *sep, int min, int max) {
    return (lmh_gram *)gram_repeat((gram *)g, (gram *)sep, min, max);
}

static lmh_gram *g_until(const char *end, size_t len) {
    return (lmh_gram *)gram_until(end, len);
}

static void g_free(lmh_gram *g) {
    gram_free((gram *)g);
}

static const lmh_gram_api gram_api = {
    .size = sizeof(lmh_gram_api),
    .lit = g_lit,
    .json = g_json,
    .seq = g_seq,
    .alt = g_alt,
    .repeat = g_repeat,
    .until = g_until,
    .free = g_free,
};

/* The function object of tools[i] ({"type": "function", "function": {...}}), or NULL. */
static json_object *tool_function(json_object *tool, const char **name) {
    json_object *fn, *type, *nm;
    if (!json_object_is_type(tool, json_type_object)) return NULL;
    if (json_object_object_get_ex(tool, "type", &type) &&
        (!json_object_is_type(type, json_type_string) ||
         strcmp(json_object_get_string(type), "function")))
        return NULL;
    if (!json_object_object_get_ex(tool, "function", &fn) ||
        !json_object_is_type(fn, json_type_object) || !json_object_object_get_ex(fn, "name", &nm) ||
        !json_object_is_type(nm, json_type_string))
        return NULL;
    *name = json_object_get_string(nm);
    return **name ? fn : NULL;
}

/* The tool's parameters schema as compact JSON text ({"type":"object"} when it has none;
 * the text lives as long as fn), or NULL when they are not an object. */
static const char *tool_params(json_object *fn) {
    json_object *params = NULL;
    if (!json_object_object_get_ex(fn, "parameters", &params) || !params)
        return "{\"type\":\"object\"}";
    if (!json_object_is_type(params, json_type_object)) return NULL;
    return json_object_to_json_string_ext(params,
                                          JSON_C_TO_STRING_PLAIN | JSON_C_TO_STRING_NOSLASHESCAPE);
}

gram *tc_grammar(const tc_format *f, json_object *tools, const char *only_name, int parallel,
                 char *err, size_t err_len) {
    if (err && err_len) err[0] = 0;
    if (!f || !f->api) {
        errf(err, err_len, "the model's chat template has no tool-call format");
        return NULL;
    }
    const lmh_toolcall_api *a = f->api;
    if (a->size < offsetof(lmh_toolcall_api, output_grammar) + sizeof(void *) || !a->call_grammar ||
        !a->output_grammar) {
        errf(err, err_len, "the %s tool-call format cannot force a call", tc_format_name(f));
        return NULL;
    }
    if (!json_object_is_type(tools, json_type_array) || !json_object_array_length(tools)) {
        errf(err, err_len, "'tools' must be a non-empty array");
        return NULL;
    }
    size_t n = json_object_array_length(tools);
    gram **alts = calloc(n, sizeof *alts);
    int na = 0;
    if (!alts) {
        errf(err, err_len, "out of memory");
        return NULL;
    }
    for (size_t i = 0; i < n; i++) {
        const char *name = NULL;
        json_object *fn = tool_function(json_object_array_get_idx(tools, i), &name);
        if (!fn) {
            errf(err, err_len, "tools[%zu] is not a function tool with a name", i);
            goto fail;
        }
        if (only_name && strcmp(name, only_name)) continue;
        const char *params = tool_params(fn);
        if (!params) {
            errf(err, err_len, "tool '%s': 'parameters' must be a JSON Schema object", name);
            goto fail;
        }
        lmh_tool tool = {.size = sizeof tool, .name = name, .parameters = params};
        char e[512] = "";
        if (!(alts[na] = (gram *)a->call_grammar(&gram_api, f->index, &tool, e, sizeof e))) {
            errf(err, err_len, "tool '%s': %s", name, e[0] ? e : "out of memory");
            goto fail;
        }
        na++;
    }
    if (!na) {
        errf(err, err_len, "tool_choice names the function '%s', which is not among the tools",
             only_name ? only_name : "");
        goto fail;
    }
    gram *any = gram_alt(alts, na);
    free(alts);
    char e[512] = "";
    gram *g =
        (gram *)a->output_grammar(&gram_api, f->index, (lmh_gram *)any, parallel, e, sizeof e);
    if (!g) errf(err, err_len, "%s", e[0] ? e : "out of memory");
    return g;
fail:
    for (int i = 0; i < na; i++) gram_free(alts[i]);
    free(alts);
    return NULL;
}
