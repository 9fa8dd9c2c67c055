/* Tool calls as Llama 3.1-3.3 write them: the reply is {"name": N, "parameters": {..}}, more
 * calls after ';', or the same after <|python_tag|>. A reply that begins (after whitespace)
 * with '{', or text from <|python_tag|> on, is held to the end of the output: it is calls
 * only if it is nothing else. */
#include "tc_common.h"

#include <stdlib.h>
#include <string.h>

static const char PYTHON_TAG[] = "<|python_tag|>";

typedef struct llama_parser {
    tcc_parser base;
    tcc_call *held; /* calls known only once the reply has ended */
    int n_held;
} llama_parser;

static int st_calls(tcc_parser *p);

static void drop_held(tcc_parser *p) {
    llama_parser *l = (llama_parser *)p;
    tcc_calls_free(l->held, l->n_held);
    l->held = NULL;
    l->n_held = 0;
}

static int st_text(tcc_parser *p) {
    static const char *const m[] = {PYTHON_TAG};
    int which;
    if (!tcc_text(p, m, 1, &which)) return TCC_WAIT;
    p->st = st_calls;
    return TCC_GO;
}

/* The reply's first bytes: one that starts (after whitespace) with '{' may be nothing but
 * calls. */
static int st_start(tcc_parser *p) {
    size_t q = p->pos;
    while (q < TCC_LEN(p) && q - p->pos < TCC_WS_HOLD_MAX && tcc_is_ws(TCC_AT(p, q))) q++;
    if (q == TCC_LEN(p) && q - p->pos < TCC_WS_HOLD_MAX && !p->eof) return TCC_WAIT;
    if (q < TCC_LEN(p) && q - p->pos < TCC_WS_HOLD_MAX && TCC_AT(p, q) == '{') {
        p->mark = p->pos;
        p->resume = p->at = q;
        p->stage = 0;
        p->st = st_calls;
        return TCC_GO;
    }
    p->st = st_text;
    return TCC_GO;
}

/* Calls separated by ';' up to the end of the reply; known only at its end. */
static int st_calls(tcc_parser *p) {
    llama_parser *l = (llama_parser *)p;
    for (;;) {
        size_t from;
        if (p->stage == 0) { /* a call object */
            if (!tcc_skip_ws(p)) {
                if (p->eof && l->n_held) break; /* a trailing ';' */
                return tcc_need(p);
            }
            if (TCC_AT(p, p->at) != '{') return tcc_fail(p);
            tcc_js_start(p);
            p->stage = 1;
        }
        if (p->stage == 1) {
            switch (tcc_js_step(p, &from)) {
            case TCC_JS_MORE:
                return tcc_need(p);
            case TCC_JS_BAD:
                return tcc_fail(p);
            }
            tcc_call c = {0};
            if (tcc_parse_call(p->in.p + from, p->at - from, &c, &p->oom)) return tcc_fail(p);
            tcc_call *h = realloc(l->held, (size_t)(l->n_held + 1) * sizeof *h);
            if (!h) {
                tcc_call_clear(&c);
                p->oom = 1;
                return TCC_WAIT;
            }
            l->held = h;
            l->held[l->n_held++] = c;
            p->stage = 2;
        }
        /* stage 2: after a call, ';' and another, or the end of the reply */
        if (!tcc_skip_ws(p)) {
            if (p->eof) break;
            return TCC_WAIT;
        }
        if (TCC_AT(p, p->at) != ';') return tcc_fail(p);
        p->at++;
        p->stage = 0;
    }
    for (int i = 0; i < l->n_held; i++) tcc_out_call(p, &l->held[i]);
    drop_held(p);
    p->pos = p->mark = TCC_LEN(p);
    p->st = st_text;
    p->after_call = 1;
    return TCC_GO;
}

static lmh_tc_parser *parser_new(int format) {
    tcc_parser *p = tcc_parser_new(sizeof(llama_parser), format, st_start, st_text);
    if (p) p->reset = p->destroy = drop_held;
    return p;
}

static int detect(const char *t, const char *model_type, int *format) {
    (void)format;
    if (strstr(t, PYTHON_TAG) ||
        (strstr(t, "<|start_header_id|>") && strstr(t, "tools") && strstr(t, "\"parameters\"")))
        return 20;
    return model_type && !strcmp(model_type, "llama") && strstr(t, "tools") ? 10 : 0;
}

static lmh_gram *call_grammar(const lmh_gram_api *g, int format, const lmh_tool *tool, char *err,
                              size_t err_len) {
    (void)format;
    char *schema = tcc_call_schema(tool->name, tool->parameters, "parameters");
    lmh_gram *r = tcc_json(g, schema, err, err_len);
    free(schema);
    return r;
}

static lmh_gram *output_grammar(const lmh_gram_api *g, int format, lmh_gram *calls, int parallel,
                                char *err, size_t err_len) {
    (void)format, (void)err, (void)err_len;
    return parallel ? g->repeat(calls, tcc_lit(g, "; "), 1, -1) : calls;
}

static const char *const formats[] = {"llama3", NULL};

static const lmh_toolcall_api api = {
    .size = sizeof(lmh_toolcall_api),
    .formats = formats,
    .detect = detect,
    .parser_new = parser_new,
    .push = tcc_push,
    .finish = tcc_finish,
    .parser_free = tcc_parser_free,
    .call_grammar = call_grammar,
    .output_grammar = output_grammar,
};

static const lmh_plugin_info info = {
    LMH_PLUGIN_HEADER,
    .kind = LMH_KIND_TOOLCALL,
    .name = "llama3",
    .version = "1.0.0",
    .summary = "Llama 3.1+ tool calls: the reply is {\"name\": N, \"parameters\": {..}} (; more)",
    .api = &api,
};

TCC_ENTRY(llama3) {
    return &info;
}
