/* Tool calls as Mistral models write them, in two forms: [TOOL_CALLS][{"name": N,
 * "arguments": {..}}, ...] ("mistral") and, from the newer templates on,
 * [TOOL_CALLS]N[ARGS]{..} ("mistral-v11"), [CALL_ID]ID optional before [ARGS]. The template
 * tells which form the grammar writes; the parser of either reads both. Text up to
 * [TOOL_CALLS] is released at once, each call when it is complete. */
#include "tc_common.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { MISTRAL, MISTRAL_V11 };

static const char TOOL_CALLS[] = "[TOOL_CALLS]";

static int st_calls(tcc_parser *p);

static int st_text(tcc_parser *p) {
    static const char *const m[] = {TOOL_CALLS};
    int which;
    if (!tcc_text(p, m, 1, &which)) return TCC_WAIT;
    p->st = st_calls;
    return TCC_GO;
}

/* After [TOOL_CALLS]: [{call}, ...] or NAME[CALL_ID]ID[ARGS]{args} (the [CALL_ID] part
 * optional). */
static int st_calls(tcc_parser *p) {
    size_t from;
    int r;
    for (;;) switch (p->stage) {
        case 0:
            if (!tcc_skip_ws(p)) return tcc_need(p);
            if (TCC_AT(p, p->at) == '[') {
                tcc_js_start(p);
                p->stage = 1;
            } else {
                p->t0 = p->at;
                p->stage = 2;
            }
            break;
        case 1: { /* the array form */
            switch (tcc_js_step(p, &from)) {
            case TCC_JS_MORE:
                return tcc_need(p);
            case TCC_JS_BAD:
                return tcc_fail(p);
            }
            tcc_call *a;
            int n;
            if (tcc_parse_call_array(p->in.p + from, p->at - from, &a, &n, &p->oom))
                return tcc_fail(p);
            for (int i = 0; i < n; i++) tcc_out_call(p, &a[i]);
            free(a);
            p->pos = p->mark = p->at;
            p->st = st_text;
            p->after_call = 1;
            return TCC_GO;
        }
        case 2: /* NAME up to '[' */
            if (tcc_skip_name(p, p->t0)) return tcc_fail(p);
            if (p->at == TCC_LEN(p)) return tcc_need(p);
            if (TCC_AT(p, p->at) != '[' || p->at == p->t0) return tcc_fail(p);
            p->t1 = p->at;
            p->stage = 3;
            break;
        case 3: { /* [ARGS], or [CALL_ID] first */
            int a = tcc_lit_at(p, p->at, "[ARGS]"), c = tcc_lit_at(p, p->at, "[CALL_ID]");
            if (a == 1) {
                p->at += 6;
                p->stage = 5;
            } else if (c == 1) {
                p->at += 9;
                p->stage = 4;
            } else if (a == 0 || c == 0) {
                return tcc_need(p);
            } else {
                return tcc_fail(p);
            }
            break;
        }
        case 4: /* the call id, then [ARGS] */
            if (tcc_skip_name(p, p->t1)) return tcc_fail(p);
            if ((r = tcc_lit_at(p, p->at, "[ARGS]")) != 1) return r ? tcc_fail(p) : tcc_need(p);
            p->at += 6;
            p->stage = 5;
            break;
        case 5:
            if (!tcc_skip_ws(p)) return tcc_need(p);
            if (TCC_AT(p, p->at) != '{') return tcc_fail(p);
            tcc_js_start(p);
            p->stage = 6;
            break;
        default:
            switch (tcc_js_step(p, &from)) {
            case TCC_JS_MORE:
                return tcc_need(p);
            case TCC_JS_BAD:
                return tcc_fail(p);
            }
            if (!(p->cur.arguments = tcc_parse_args(p->in.p + from, p->at - from, &p->oom)))
                return tcc_fail(p);
            if (!(p->cur.name = strndup(p->in.p + p->t0, p->t1 - p->t0))) p->oom = 1;
            return tcc_done_call(p, p->at);
        }
}

static lmh_tc_parser *parser_new(int format) {
    return tcc_parser_new(sizeof(tcc_parser), format, st_text, st_text);
}

static int detect(const char *t, const char *model_type, int *format) {
    if (strstr(t, TOOL_CALLS)) {
        *format = strstr(t, "[ARGS]") ? MISTRAL_V11 : MISTRAL;
        return 50;
    }
    if (model_type && strstr(t, "tools") &&
        (!strcmp(model_type, "mistral") || !strcmp(model_type, "mixtral")))
        return 10;
    return 0;
}

static lmh_gram *call_grammar(const lmh_gram_api *g, int format, const lmh_tool *tool, char *err,
                              size_t err_len) {
    if (format == MISTRAL_V11) {
        if (!tcc_bare_name_ok(tool->name)) {
            snprintf(err, err_len,
                     "the name cannot be written in the mistral-v11 tool-call format");
            return NULL;
        }
        return g->seq((lmh_gram *[]){tcc_lit3(g, "", tool->name, "[ARGS]"),
                                     tcc_json(g, tool->parameters, err, err_len)},
                      2);
    }
    char *schema = tcc_call_schema(tool->name, tool->parameters, "arguments");
    lmh_gram *r = tcc_json(g, schema, err, err_len);
    free(schema);
    return r;
}

static lmh_gram *output_grammar(const lmh_gram_api *g, int format, lmh_gram *calls, int parallel,
                                char *err, size_t err_len) {
    (void)err, (void)err_len;
    if (format == MISTRAL_V11) {
        lmh_gram *one = g->seq((lmh_gram *[]){tcc_lit(g, TOOL_CALLS), calls}, 2);
        return parallel ? g->repeat(one, NULL, 1, -1) : one;
    }
    return g->seq((lmh_gram *[]){tcc_lit(g, "[TOOL_CALLS]["),
                                 parallel ? g->repeat(calls, tcc_lit(g, ", "), 1, -1) : calls,
                                 tcc_lit(g, "]")},
                  3);
}

static const char *const formats[] = {"mistral", "mistral-v11", NULL};

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
    .name = "mistral",
    .version = "1.0.0",
    .summary = "Mistral tool calls: [TOOL_CALLS][{\"name\": N, \"arguments\": {..}}] and "
               "[TOOL_CALLS]N[ARGS]{..}",
    .api = &api,
};

TCC_ENTRY(mistral) {
    return &info;
}
