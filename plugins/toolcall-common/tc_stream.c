/* The streaming machinery of the tool-call plugins (tc_common.h): the buffer of text not yet
 * released, markers that may be cut at the end of a push, constructs that succeed or fail,
 * and the driving of a format's states. */
#include "tc_common.h"

#include <stdlib.h>
#include <string.h>

/* ---- where a JSON object or array ends ------------------------------------------------ */

/* Follows brackets and strings incrementally to find the end of the value that starts with
 * an opening bracket, without judging it (tcc_parse_* do, once it is whole). Refuses early
 * what can never be JSON (a byte outside strings that no JSON token has, a control byte in
 * a string), so that a closing tag after an unfinished object settles it as malformed. */
static int js_run(tcc_jscan *m, const char *s, size_t len, size_t *end) {
    for (; m->pos < len; m->pos++) {
        unsigned char c = (unsigned char)s[m->pos];
        if (m->in_str) {
            if (m->esc)
                m->esc = 0;
            else if (c == '\\')
                m->esc = 1;
            else if (c == '"')
                m->in_str = 0;
            else if (c < 0x20)
                return TCC_JS_BAD;
            continue;
        }
        if (m->depth == 0 && c != '{' && c != '[') return TCC_JS_BAD;
        if (c == '"')
            m->in_str = 1;
        else if (c == '{' || c == '[')
            m->depth++;
        else if (c == '}' || c == ']') {
            if (--m->depth == 0) {
                *end = ++m->pos;
                return TCC_JS_END;
            }
        } else if (!c || !strchr(" \t\n\r:,-+.0123456789truefalsnE", c)) {
            return TCC_JS_BAD;
        }
    }
    return TCC_JS_MORE;
}

/* ---- output ------------------------------------------------------------------------- */

static void emit_with(tcc_parser *p, int (*to)(void *, const char *, size_t), size_t a, size_t b) {
    if (to && b > a && to(p->out->ctx, p->in.p + a, b - a)) p->oom = 1;
}

void tcc_emit(tcc_parser *p, size_t a, size_t b) {
    emit_with(p, p->out->content, a, b);
}

void tcc_emit_reasoning(tcc_parser *p, size_t a, size_t b) {
    emit_with(p, p->out->reasoning, a, b);
}

void tcc_out_call(tcc_parser *p, tcc_call *c) {
    if (!p->oom && p->out->call(p->out->ctx, c->name, c->arguments))
        p->oom = 1;
    else if (!p->oom)
        p->added++;
    tcc_call_clear(c);
}

/* ---- reading the text --------------------------------------------------------------- */

int tcc_lit_at(const tcc_parser *p, size_t at, const char *lit) {
    size_t n = strlen(lit), have = TCC_LEN(p) - at;
    if (!have) return 0;
    if (have >= n) return memcmp(p->in.p + at, lit, n) ? -1 : 1;
    return memcmp(p->in.p + at, lit, have) ? -1 : 0;
}

int tcc_find_marker(const tcc_parser *p, size_t from, const char *const *m, int nm, int *which,
                    size_t *at, size_t *safe) {
    const char *s = p->in.p + from;
    size_t n = TCC_LEN(p) - from, best = SIZE_MAX, hold = 0;
    for (int k = 0; k < nm; k++) {
        size_t ml = strlen(m[k]);
        const char *f = n ? memmem(s, n, m[k], ml) : NULL;
        if (f && (size_t)(f - s) < best) {
            best = (size_t)(f - s);
            *which = k;
        }
        for (size_t h = ml - 1 < n ? ml - 1 : n; h > hold; h--)
            if (!memcmp(s + n - h, m[k], h)) {
                hold = h;
                break;
            }
    }
    if (best != SIZE_MAX) {
        *at = from + best;
        return 1;
    }
    *safe = TCC_LEN(p) - hold;
    return 0;
}

int tcc_skip_ws(tcc_parser *p) {
    while (p->at < TCC_LEN(p) && tcc_is_ws(TCC_AT(p, p->at))) p->at++;
    return p->at < TCC_LEN(p);
}

int tcc_skip_name(tcc_parser *p, size_t from) {
    while (p->at < TCC_LEN(p) && tcc_name_char(TCC_AT(p, p->at)) &&
           p->at - from <= TCC_NAME_MAX_LEN)
        p->at++;
    return p->at - from > TCC_NAME_MAX_LEN ? -1 : 0;
}

size_t tcc_ws_tail(const tcc_parser *p, size_t end) {
    size_t ws = end;
    while (ws > p->pos && end - ws < TCC_WS_HOLD_MAX && tcc_is_ws(TCC_AT(p, ws - 1))) ws--;
    return ws;
}

void tcc_emit_text(tcc_parser *p, size_t end) {
    for (size_t i = p->pos; p->after_call && i < end; i++)
        if (!tcc_is_ws(TCC_AT(p, i))) p->after_call = 0;
    tcc_emit(p, p->pos, end);
    p->pos = end;
}

void tcc_js_start(tcc_parser *p) {
    p->js = (tcc_jscan){.pos = p->at};
}

int tcc_js_step(tcc_parser *p, size_t *from) {
    size_t end;
    *from = p->at;
    int r = js_run(&p->js, p->in.p, TCC_LEN(p), &end);
    if (r == TCC_JS_END) p->at = end;
    return r;
}

/* ---- constructs --------------------------------------------------------------------- */

int tcc_text(tcc_parser *p, const char *const *m, int nm, int *which) {
    size_t at, safe;
    *which = 0;
    if (tcc_find_marker(p, p->pos, m, nm, which, &at, &safe)) {
        /* whitespace before a call is formatting: held with it, dropped if it is one */
        size_t ws = tcc_ws_tail(p, at);
        tcc_emit_text(p, ws);
        p->mark = ws;
        p->resume = p->at = at + strlen(m[*which]);
        p->stage = 0;
        return 1;
    }
    if (p->eof) {
        /* whitespace that only follows a call is formatting too */
        size_t q = p->pos;
        while (q < TCC_LEN(p) && tcc_is_ws(TCC_AT(p, q))) q++;
        tcc_emit_text(p,
                      p->after_call && q == TCC_LEN(p) ? tcc_ws_tail(p, TCC_LEN(p)) : TCC_LEN(p));
        p->pos = TCC_LEN(p);
        return 0;
    }
    /* trailing whitespace waits: it is dropped if a call follows it */
    tcc_emit_text(p, tcc_ws_tail(p, safe));
    return 0;
}

int tcc_fail(tcc_parser *p) {
    tcc_emit(p, p->mark, p->resume);
    p->pos = p->resume;
    p->st = p->text;
    p->after_call = 0;
    tcc_call_clear(&p->cur);
    if (p->reset) p->reset(p);
    return TCC_GO;
}

int tcc_need(tcc_parser *p) {
    return p->eof ? tcc_fail(p) : TCC_WAIT;
}

int tcc_done_call(tcc_parser *p, size_t end) {
    tcc_out_call(p, &p->cur);
    p->pos = p->mark = end;
    p->st = p->text;
    p->after_call = 1;
    return TCC_GO;
}

/* ---- driving ------------------------------------------------------------------------ */

tcc_parser *tcc_parser_new(size_t size, int format, tcc_state start, tcc_state text) {
    if (size < sizeof(tcc_parser)) return NULL;
    tcc_parser *p = calloc(1, size);
    if (!p || tcc_buf_add(&p->in, "", 0)) { /* in.p is never NULL */
        free(p);
        return NULL;
    }
    p->format = format;
    p->st = start;
    p->text = text;
    return p;
}

/* Drops what is done with, so that the buffer holds only what is still undecided. */
static void compact(tcc_parser *p) {
    size_t d = p->pos;
    if (!d || (d < 65536 && d * 2 < TCC_LEN(p))) return;
    memmove(p->in.p, p->in.p + d, TCC_LEN(p) - d);
    p->in.len -= d;
    p->in.p[p->in.len] = 0;
    /* offsets of a construct not under way are stale and set again before use */
    p->pos -= d, p->mark -= d, p->resume -= d, p->at -= d, p->t0 -= d, p->t1 -= d;
    p->js.pos -= d;
}

static int feed(tcc_parser *p, const char *s, size_t n, int eof, const lmh_tc_sink *out) {
    if (p->oom) return LMH_ENOMEM;
    if (p->eof) return 0;
    p->out = out;
    p->added = 0;
    compact(p);
    if (n && tcc_buf_add(&p->in, s, n)) {
        p->oom = 1;
        return LMH_ENOMEM;
    }
    p->eof = eof;
    while (!p->oom && p->st(p) == TCC_GO) {
    }
    p->out = NULL;
    return p->oom ? LMH_ENOMEM : p->added;
}

int tcc_push(lmh_tc_parser *p, const char *s, size_t n, const lmh_tc_sink *out) {
    return feed(p, s, n, 0, out);
}

int tcc_finish(lmh_tc_parser *p, const lmh_tc_sink *out) {
    return feed(p, NULL, 0, 1, out);
}

void tcc_parser_free(lmh_tc_parser *p) {
    if (!p) return;
    if (p->destroy) p->destroy(p);
    tcc_buf_free(&p->in);
    tcc_call_clear(&p->cur);
    free(p);
}
