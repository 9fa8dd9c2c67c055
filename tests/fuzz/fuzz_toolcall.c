/* libFuzzer target: the tool-call parsers of every format (plugins/toolcall-*, linked in,
 * driven through core/server/toolcall.c as the server drives them) on any bytes. The first
 * byte picks the format (none or one of the plugins'), the second seeds the split points;
 * the rest is the model's output, fed whole, a byte at a time and in pieces. Traps when the
 * results differ, when a call's arguments are not a JSON object, or when text without calls
 * does not come out unchanged.
 * build: see tests/fuzz/run_fuzzers.sh (the "toolcall" row). */
#include "toolcall.h"
#include "toolcall_static.h"

#include <json-c/json.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* toolcall.c also builds grammars (tc_grammar), which this target never does; these stand
 * in for the grammar library so that the parser links alone. */
gram *gram_lit(const char *bytes, size_t len) {
    (void)bytes, (void)len;
    return NULL;
}
gram *gram_json(json_object *schema, char *err, size_t err_len) {
    (void)schema, (void)err, (void)err_len;
    return NULL;
}
gram *gram_seq(gram **parts, int n) {
    (void)parts, (void)n;
    return NULL;
}
gram *gram_alt(gram **parts, int n) {
    (void)parts, (void)n;
    return NULL;
}
gram *gram_repeat(gram *g, gram *sep, int min, int max) {
    (void)g, (void)sep, (void)min, (void)max;
    return NULL;
}
gram *gram_until(const char *end, size_t len) {
    (void)end, (void)len;
    return NULL;
}
void gram_free(gram *g) {
    (void)g;
}

typedef struct result {
    tc_buf content, reasoning;
    tc_call *calls;
    int n_calls;
} result;

static void result_free(result *r) {
    tc_buf_free(&r->content);
    tc_buf_free(&r->reasoning);
    tc_calls_free(r->calls, r->n_calls);
}

/* mode 0: whole; 1: a byte at a time; 2: pieces of 0..15 bytes from seed. */
static int parse(const tc_format *f, const char *s, size_t n, int mode, unsigned seed, result *r) {
    memset(r, 0, sizeof *r);
    tc_parser *p = tc_parser_new(f);
    if (!p) return -1;
    tc_parser_set_reasoning(p, &r->reasoning);
    size_t at = 0;
    int rc = 0;
    while (at < n && rc >= 0) {
        seed = seed * 1103515245u + 12345u;
        size_t step = mode == 0 ? n : mode == 1 ? 1 : (seed >> 16) % 16;
        if (step > n - at) step = n - at;
        rc = tc_push(p, s + at, step, &r->content, &r->calls, &r->n_calls);
        at += step;
    }
    if (rc >= 0) rc = tc_finish(p, &r->content, &r->calls, &r->n_calls);
    tc_parser_free(p);
    return rc < 0 ? -1 : 0;
}

static int buf_eq(const tc_buf *a, const tc_buf *b) {
    return a->len == b->len && (!a->len || !memcmp(a->p, b->p, a->len));
}

static int same(const result *a, const result *b) {
    if (!buf_eq(&a->content, &b->content) || !buf_eq(&a->reasoning, &b->reasoning) ||
        a->n_calls != b->n_calls)
        return 0;
    for (int i = 0; i < a->n_calls; i++)
        if (strcmp(a->calls[i].name, b->calls[i].name) ||
            strcmp(a->calls[i].arguments, b->calls[i].arguments))
            return 0;
    return 1;
}

static int is_object(const char *s) {
    json_tokener *t = json_tokener_new_ex(1000);
    if (!t) return 1;
    json_object *o = json_tokener_parse_ex(t, s, (int)strlen(s));
    int ok = o && json_object_is_type(o, json_type_object) &&
             json_tokener_get_error(t) == json_tokener_success &&
             (size_t)json_tokener_get_parse_end(t) == strlen(s);
    json_object_put(o);
    json_tokener_free(t);
    return ok;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 2) return 0;
    tc_static_registry();
    const tc_format *f = &tc_static_formats[data[0] % tc_static_n_formats];
    unsigned seed = data[1];
    const char *s = (const char *)data + 2;
    size_t n = size - 2;
    result whole, r;
    if (parse(f, s, n, 0, 0, &whole)) {
        result_free(&whole);
        return 0;
    }
    for (int i = 0; i < whole.n_calls; i++) {
        if (!whole.calls[i].name[0] || !is_object(whole.calls[i].arguments)) __builtin_trap();
        for (const char *a = whole.calls[i].arguments; *a; a++)
            if (*a == '\n' || *a == '\r' || *a == '\t') __builtin_trap(); /* not compact */
    }
    /* harmony drops its markers: its content is never the text itself */
    if (!whole.n_calls && strcmp(tc_format_name(f), "harmony") &&
        !buf_eq(&whole.content, &(tc_buf){(char *)s, n, n}))
        __builtin_trap();
    for (int mode = 1; mode < 3; mode++) {
        if (!parse(f, s, n, mode, seed, &r) && !same(&whole, &r)) __builtin_trap();
        result_free(&r);
    }
    result_free(&whole);
    return 0;
}
