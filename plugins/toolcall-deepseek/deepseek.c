/* Tool calls as DeepSeek V3 writes them: <｜tool▁calls▁begin｜>, then per call
 * <｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\n```json\n{..}\n```<｜tool▁call▁end｜>
 * (V3.1: <｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{..}<｜tool▁call▁end｜>), then
 * <｜tool▁calls▁end｜>. Text up to a block or call is released at once, each call when it
 * ends. */
#include "tc_common.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char CALLS_BEGIN[] = "<｜tool▁calls▁begin｜>", CALLS_END[] = "<｜tool▁calls▁end｜>",
                  CALL_BEGIN[] = "<｜tool▁call▁begin｜>", CALL_END[] = "<｜tool▁call▁end｜>",
                  SEP[] = "<｜tool▁sep｜>";

typedef struct ds_parser {
    tcc_parser base;
    int in_block, block_calls, v3;
} ds_parser;

static int st_block(tcc_parser *p);
static int st_call(tcc_parser *p);

static int st_text(tcc_parser *p) {
    static const char *const m[] = {CALLS_BEGIN, CALL_BEGIN};
    ds_parser *d = (ds_parser *)p;
    int which;
    if (!tcc_text(p, m, 2, &which)) return TCC_WAIT;
    d->block_calls = 0;
    d->in_block = which == 0;
    p->st = which == 0 ? st_block : st_call;
    p->t0 = p->at;
    return TCC_GO;
}

/* Inside <｜tool▁calls▁begin｜>, between calls. */
static int st_block(tcc_parser *p) {
    ds_parser *d = (ds_parser *)p;
    if (!tcc_skip_ws(p)) {
        if (!p->eof) return TCC_WAIT;
        if (!d->block_calls) return tcc_fail(p);
        p->pos = p->mark = TCC_LEN(p);
        p->st = st_text;
        return TCC_GO;
    }
    int b = tcc_lit_at(p, p->at, CALL_BEGIN), e = tcc_lit_at(p, p->at, CALLS_END);
    if (b == 1) {
        if (d->block_calls) p->mark = p->pos = p->at; /* a failure spares the calls before */
        p->at += strlen(CALL_BEGIN);
        p->resume = p->t0 = p->at;
        p->stage = 0;
        p->st = st_call;
        return TCC_GO;
    }
    if (e == 1 && d->block_calls) {
        p->pos = p->mark = p->at + strlen(CALLS_END);
        p->st = st_text;
        p->after_call = 1;
        return TCC_GO;
    }
    if ((b == 0 || e == 0) && !p->eof) return TCC_WAIT;
    if (!d->block_calls) return tcc_fail(p);
    /* the block goes on with something else: that is text */
    p->pos = p->mark = p->at;
    p->st = st_text;
    p->after_call = 0;
    return TCC_GO;
}

/* After <｜tool▁call▁begin｜>: V3's function<｜tool▁sep｜>NAME\n```json\n{..}\n``` or V3.1's
 * NAME<｜tool▁sep｜>{..}, then <｜tool▁call▁end｜>. */
static int st_call(tcc_parser *p) {
    ds_parser *d = (ds_parser *)p;
    size_t from;
    int r;
    for (;;) switch (p->stage) {
        case 0: /* the type (V3) or the name (V3.1), then the separator */
            if (tcc_skip_name(p, p->t0)) return tcc_fail(p);
            if (p->at == TCC_LEN(p)) return tcc_need(p);
            if (p->at == p->t0) return tcc_fail(p);
            if ((r = tcc_lit_at(p, p->at, SEP)) != 1) return r ? tcc_fail(p) : tcc_need(p);
            p->t1 = p->at;
            p->at += strlen(SEP);
            p->stage = 1;
            break;
        case 1:
            if (p->at == TCC_LEN(p)) return tcc_need(p);
            if (TCC_AT(p, p->at) == '{' || tcc_is_ws(TCC_AT(p, p->at))) {
                d->v3 = 0;
                p->stage = 5;
            } else {
                if (p->t1 - p->t0 != 8 || memcmp(p->in.p + p->t0, "function", 8))
                    return tcc_fail(p);
                d->v3 = 1;
                p->t0 = p->at;
                p->stage = 2;
            }
            break;
        case 2: /* V3: the name on its own line */
            if (tcc_skip_name(p, p->t0)) return tcc_fail(p);
            if (p->at == TCC_LEN(p)) return tcc_need(p);
            if (TCC_AT(p, p->at) != '\n' || p->at == p->t0) return tcc_fail(p);
            p->t1 = p->at++;
            p->stage = 3;
            break;
        case 3: /* the code fence, "json" optional */
            if ((r = tcc_lit_at(p, p->at, "```")) != 1) return r ? tcc_fail(p) : tcc_need(p);
            p->at += 3;
            p->stage = 4;
            break;
        case 4:
            if ((r = tcc_lit_at(p, p->at, "json")) == 0) return tcc_need(p);
            if (r == 1) p->at += 4;
            p->stage = 5;
            break;
        case 5:
            if (!tcc_skip_ws(p)) return tcc_need(p);
            if (TCC_AT(p, p->at) != '{') return tcc_fail(p);
            tcc_js_start(p);
            p->stage = 6;
            break;
        case 6:
            switch (tcc_js_step(p, &from)) {
            case TCC_JS_MORE:
                return tcc_need(p);
            case TCC_JS_BAD:
                return tcc_fail(p);
            }
            if (!(p->cur.arguments = tcc_parse_args(p->in.p + from, p->at - from, &p->oom)))
                return tcc_fail(p);
            p->stage = d->v3 ? 7 : 8;
            break;
        case 7: /* V3: the closing fence */
            if (!tcc_skip_ws(p)) return tcc_need(p);
            if ((r = tcc_lit_at(p, p->at, "```")) != 1) return r ? tcc_fail(p) : tcc_need(p);
            p->at += 3;
            p->stage = 8;
            break;
        default:
            if (!tcc_skip_ws(p)) return tcc_need(p);
            if ((r = tcc_lit_at(p, p->at, CALL_END)) != 1) return r ? tcc_fail(p) : tcc_need(p);
            if (!(p->cur.name = strndup(p->in.p + p->t0, p->t1 - p->t0))) p->oom = 1;
            tcc_out_call(p, &p->cur);
            p->at += strlen(CALL_END);
            p->pos = p->mark = p->at;
            if (d->in_block) {
                d->block_calls++;
                p->st = st_block;
            } else {
                p->st = st_text;
                p->after_call = 1;
            }
            return TCC_GO;
        }
}

static lmh_tc_parser *parser_new(int format) {
    return tcc_parser_new(sizeof(ds_parser), format, st_text, st_text);
}

static int detect(const char *t, const char *model_type, int *format) {
    (void)format;
    if (strstr(t, "tool▁calls▁begin") || strstr(t, "tool▁call▁begin")) return 40;
    if (model_type && strstr(t, "tools") &&
        (!strcmp(model_type, "deepseek_v2") || !strcmp(model_type, "deepseek_v3")))
        return 10;
    return 0;
}

static lmh_gram *call_grammar(const lmh_gram_api *g, int format, const lmh_tool *tool, char *err,
                              size_t err_len) {
    (void)format;
    if (!tcc_bare_name_ok(tool->name)) {
        snprintf(err, err_len, "the name cannot be written in the deepseek tool-call format");
        return NULL;
    }
    return g->seq((lmh_gram *[]){tcc_lit3(g, "<｜tool▁call▁begin｜>function<｜tool▁sep｜>",
                                          tool->name, "\n```json\n"),
                                 tcc_json(g, tool->parameters, err, err_len),
                                 tcc_lit(g, "\n```<｜tool▁call▁end｜>")},
                  3);
}

static lmh_gram *output_grammar(const lmh_gram_api *g, int format, lmh_gram *calls, int parallel,
                                char *err, size_t err_len) {
    (void)format, (void)err, (void)err_len;
    return g->seq((lmh_gram *[]){tcc_lit(g, CALLS_BEGIN),
                                 parallel ? g->repeat(calls, tcc_lit(g, "\n"), 1, -1) : calls,
                                 tcc_lit(g, CALLS_END)},
                  3);
}

static const char *const formats[] = {"deepseek", NULL};

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
    .name = "deepseek",
    .version = "1.0.0",
    .summary = "DeepSeek V3 tool calls: <｜tool▁call▁begin｜>function<｜tool▁sep｜>N and a json "
               "code block",
    .api = &api,
};

TCC_ENTRY(deepseek) {
    return &info;
}
