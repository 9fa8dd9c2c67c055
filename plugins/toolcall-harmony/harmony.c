/* Tool calls in the harmony format of gpt-oss: messages
 * <|start|>assistant<|channel|>C<|message|>BODY<|end|>, a call being a message
 * to=functions.NAME<|channel|>commentary json<|message|>{..}<|call|>. The final and
 * commentary channels are content, the analysis channel reasoning; the markers are dropped.
 * Built-in tools (to=browser..., to=python) are left as content. */
#include "tc_common.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char H_START[] = "<|start|>", H_CHANNEL[] = "<|channel|>",
                  H_CONSTRAIN[] = "<|constrain|>", H_MESSAGE[] = "<|message|>", H_END[] = "<|end|>",
                  H_CALL[] = "<|call|>", H_RETURN[] = "<|return|>";

/* Longest header read before <|message|>; a longer one is not a header. */
#define H_HEADER_MAX 1024

typedef struct harmony_parser {
    tcc_parser base;
    int analysis; /* the body is the analysis channel: reasoning */
} harmony_parser;

static int st_body(tcc_parser *p);
static int st_header(tcc_parser *p);
static int st_call(tcc_parser *p);

static void reset(tcc_parser *p) {
    ((harmony_parser *)p)->analysis = 0;
}

/* The output may open by continuing the prompt's "<|start|>assistant" header with a
 * recipient (" to=functions.NAME<|channel|>..."). */
static int st_init(tcc_parser *p) {
    static const char *const open[] = {" to=", "to="};
    int partial = 0;
    for (int k = 0; k < 2; k++) {
        int r = tcc_lit_at(p, p->pos, open[k]);
        if (r == 1) {
            p->mark = p->pos;
            p->resume = p->pos + strlen(open[k]);
            p->st = st_header;
            return TCC_GO;
        }
        partial |= r == 0;
    }
    if (partial && !p->eof) return TCC_WAIT;
    p->st = st_body;
    return TCC_GO;
}

/* A message's body, or text outside messages. */
static int st_body(tcc_parser *p) {
    static const char *const m[] = {H_START, H_CHANNEL, H_CONSTRAIN, H_MESSAGE,
                                    H_END,   H_CALL,    H_RETURN};
    void (*emit)(tcc_parser *, size_t, size_t) =
        ((harmony_parser *)p)->analysis ? tcc_emit_reasoning : tcc_emit;
    int w = 0;
    size_t at, safe;
    if (!tcc_find_marker(p, p->pos, m, 7, &w, &at, &safe)) {
        size_t end = p->eof ? TCC_LEN(p) : safe;
        emit(p, p->pos, end);
        p->pos = end;
        return TCC_WAIT;
    }
    emit(p, p->pos, at);
    if (w >= 3) { /* a body without a header, or a message's end: text is content again */
        p->pos = at + strlen(m[w]);
        reset(p);
        return TCC_GO;
    }
    p->pos = p->mark = at;
    p->resume = at + strlen(m[w]);
    p->st = st_header;
    return TCC_GO;
}

/* The token after `key` in the header h[0, n): up to whitespace or '<'. */
static int header_word(const char *h, size_t n, const char *key, size_t *a, size_t *b) {
    size_t kl = strlen(key);
    const char *f = n >= kl ? memmem(h, n, key, kl) : NULL;
    if (!f) return 0;
    *a = *b = (size_t)(f - h) + kl;
    while (*b < n && !tcc_is_ws((unsigned char)h[*b]) && h[*b] != '<') (*b)++;
    return 1;
}

/* A message header, up to <|message|>. */
static int st_header(tcc_parser *p) {
    static const char *const m[] = {H_MESSAGE, H_START, H_END, H_CALL, H_RETURN};
    int w = 0;
    size_t at, safe;
    if (!tcc_find_marker(p, p->resume, m, 5, &w, &at, &safe))
        return TCC_LEN(p) - p->mark > H_HEADER_MAX + strlen(H_MESSAGE) ? tcc_fail(p) : tcc_need(p);
    if (at - p->mark > H_HEADER_MAX || w != 0) return tcc_fail(p);
    const char *h = p->in.p + p->mark;
    size_t n = at - p->mark, ra, rb, ca, cb;
    size_t body = at + strlen(H_MESSAGE);
    int to = header_word(h, n, "to=", &ra, &rb);
    int fn = to && rb - ra > 10 && !memcmp(h + ra, "functions.", 10);
    for (size_t i = ra + 10; fn && i < rb; i++) fn = tcc_name_char((unsigned char)h[i]);
    if (fn) {
        p->t0 = p->mark + ra + 10;
        p->t1 = p->mark + rb;
        p->at = p->resume = body;
        p->stage = 0;
        p->st = st_call;
        return TCC_GO;
    }
    if (to && rb > ra) { /* a built-in tool (browser, python): left as text */
        p->resume = body;
        return tcc_fail(p);
    }
    int ch = header_word(h, n, H_CHANNEL, &ca, &cb);
    ((harmony_parser *)p)->analysis = ch && cb - ca == 8 && !memcmp(h + ca, "analysis", 8);
    p->pos = body;
    p->st = st_body;
    return TCC_GO;
}

/* The body of a message to=functions.NAME. */
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
        if (!(p->cur.arguments = tcc_parse_args(p->in.p + from, p->at - from, &p->oom)))
            return tcc_fail(p);
        if (!(p->cur.name = strndup(p->in.p + p->t0, p->t1 - p->t0))) p->oom = 1;
        p->stage = 2;
        /* fall through */
    default: {
        if (!tcc_skip_ws(p)) {
            if (!p->eof) return TCC_WAIT;
            return tcc_done_call(p, TCC_LEN(p)); /* <|call|> ends generation: it may not be here */
        }
        static const char *const ends[] = {H_CALL, H_END, H_RETURN};
        int partial = 0;
        for (int k = 0; k < 3; k++) {
            int r = tcc_lit_at(p, p->at, ends[k]);
            if (r == 1) return tcc_done_call(p, p->at + strlen(ends[k]));
            partial |= r == 0;
        }
        return partial ? tcc_need(p) : tcc_fail(p);
    }
    }
}

static lmh_tc_parser *parser_new(int format) {
    tcc_parser *p = tcc_parser_new(sizeof(harmony_parser), format, st_init, st_body);
    if (p) p->reset = reset;
    return p;
}

static int detect(const char *t, const char *model_type, int *format) {
    (void)format;
    if (strstr(t, "to=functions") || (strstr(t, H_CHANNEL) && strstr(t, H_CALL))) return 30;
    return model_type && !strcmp(model_type, "gpt_oss") && strstr(t, "tools") ? 10 : 0;
}

static lmh_gram *call_grammar(const lmh_gram_api *g, int format, const lmh_tool *tool, char *err,
                              size_t err_len) {
    (void)format;
    if (!tcc_bare_name_ok(tool->name)) {
        snprintf(err, err_len, "the name cannot be written in the harmony tool-call format");
        return NULL;
    }
    /* the template's order, after the prompt's "<|start|>assistant" */
    return g->seq((lmh_gram *[]){tcc_lit3(g, " to=functions.", tool->name,
                                          "<|channel|>commentary json<|message|>"),
                                 tcc_json(g, tool->parameters, err, err_len)},
                  2);
}

/* Reasoning first if the model wants, then one call: <|call|> ends the turn (an
 * end-of-sequence token), so there is never more than one. */
static lmh_gram *output_grammar(const lmh_gram_api *g, int format, lmh_gram *calls, int parallel,
                                char *err, size_t err_len) {
    (void)format, (void)parallel, (void)err, (void)err_len;
    lmh_gram *think =
        g->seq((lmh_gram *[]){tcc_lit(g, "<|channel|>analysis<|message|>"),
                              g->until(H_END, strlen(H_END)), tcc_lit(g, "<|start|>assistant")},
               3);
    return g->seq((lmh_gram *[]){g->repeat(think, NULL, 0, 1), calls}, 2);
}

static const char *const formats[] = {"harmony", NULL};

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
    .name = "harmony",
    .version = "1.0.0",
    .summary = "gpt-oss harmony tool calls: to=functions.N<|channel|>commentary "
               "json<|message|>{..}<|call|>; the analysis channel is reasoning",
    .api = &api,
};

TCC_ENTRY(harmony) {
    return &info;
}
