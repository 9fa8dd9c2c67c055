/* Tool calls in the Hermes format, which Qwen 2.5/3 and Hermes models write:
 * <tool_call>\n{"name": N, "arguments": {..}}\n</tool_call>, one block a call. Text up to a
 * call's opening tag is released at once, each call when it closes. */
#include "tc_common.h"

#include <stdlib.h>
#include <string.h>

static const char OPEN[] = "<tool_call>", CLOSE[] = "</tool_call>";

static int st_call(tcc_parser *p);

static int st_text(tcc_parser *p) {
    static const char *const m[] = {OPEN};
    int which;
    if (!tcc_text(p, m, 1, &which)) return TCC_WAIT;
    p->st = st_call;
    return TCC_GO;
}

static int st_call(tcc_parser *p) {
    size_t from;
    switch (p->stage) {
    case 0:
        if (!tcc_skip_ws(p)) return tcc_need(p);
        if (TCC_AT(p, p->at) != '{') return tcc_fail(p);
        tcc_js_start(p);
        p->stage = 1;
        /* fall through */
    case 1:
        switch (tcc_js_step(p, &from)) {
        case TCC_JS_MORE:
            return tcc_need(p);
        case TCC_JS_BAD:
            return tcc_fail(p);
        }
        if (tcc_parse_call(p->in.p + from, p->at - from, &p->cur, &p->oom)) return tcc_fail(p);
        p->stage = 2;
        /* fall through */
    default:
        if (!tcc_skip_ws(p)) return tcc_need(p);
        switch (tcc_lit_at(p, p->at, CLOSE)) {
        case 0:
            return tcc_need(p);
        case -1:
            return tcc_fail(p);
        }
        return tcc_done_call(p, p->at + strlen(CLOSE));
    }
}

static lmh_tc_parser *parser_new(int format) {
    return tcc_parser_new(sizeof(tcc_parser), format, st_text, st_text);
}

static int detect(const char *t, const char *model_type, int *format) {
    (void)format;
    if (strstr(t, OPEN))
        /* Qwen3-Coder writes XML (<function=NAME><parameter=...>) inside these tags: a format
         * of its own, which this plugin does not read and no other guess may take */
        return strstr(t, "<function=") ? -60 : 60;
    static const char *const types[] = {"qwen2", "qwen2_moe", "qwen3", "qwen3_moe"};
    if (model_type && strstr(t, "tools"))
        for (size_t i = 0; i < sizeof types / sizeof *types; i++)
            if (!strcmp(model_type, types[i])) return 10;
    return 0;
}

static lmh_gram *call_grammar(const lmh_gram_api *g, int format, const lmh_tool *tool, char *err,
                              size_t err_len) {
    (void)format;
    char *schema = tcc_call_schema(tool->name, tool->parameters, "arguments");
    lmh_gram *r = tcc_json(g, schema, err, err_len);
    free(schema);
    return r;
}

static lmh_gram *output_grammar(const lmh_gram_api *g, int format, lmh_gram *calls, int parallel,
                                char *err, size_t err_len) {
    (void)format, (void)err, (void)err_len;
    lmh_gram *one =
        g->seq((lmh_gram *[]){tcc_lit(g, "<tool_call>\n"), calls, tcc_lit(g, "\n</tool_call>")}, 3);
    return parallel ? g->repeat(one, tcc_lit(g, "\n"), 1, -1) : one;
}

static const char *const formats[] = {"hermes", NULL};

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
    .name = "hermes",
    .version = "1.0.0",
    .summary =
        "Hermes / Qwen tool calls: <tool_call>{\"name\": N, \"arguments\": {..}}</tool_call>",
    .api = &api,
};

TCC_ENTRY(hermes) {
    return &info;
}
