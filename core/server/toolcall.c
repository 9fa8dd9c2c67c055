/* Tool calls in a model's output: format detection, the streaming parser and the grammar
 * that forces a call (toolcall.h).
 *
 * The parser keeps the text it has not released in one buffer and walks it with a small
 * state machine per format. Every decision (a call is complete, or malformed) is made only
 * once the bytes seen so far settle it whatever comes next, so the result does not depend
 * on how the text was split. A construct that fails goes out as content from where it was
 * held (its leading whitespace included) up to the end of its opening marker, and scanning
 * goes on after that marker, so what the construct held is looked at again as text. */
#include "toolcall.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- text buffers ------------------------------------------------------------------- */

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

static char *take(tc_buf *b) { /* the buffer's text, owned by the caller ("" when empty) */
    char *s = b->p ? b->p : strdup("");
    b->p = NULL;
    b->len = b->cap = 0;
    return s;
}

static int is_ws(int c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

/* Characters of a function name where a format writes it bare (Mistral's NAME[ARGS],
 * DeepSeek's line after <｜tool▁sep｜>, harmony's to=functions.NAME); tc_grammar refuses
 * other names for those formats. */
static int name_char(int c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
           c == '-' || c == '.' || c == ':';
}

#define NAME_MAX_LEN 256
/* Whitespace held back at most before a possible call (whitespace next to a call is
 * dropped; only this much of a run counts as next to it). */
#define WS_HOLD_MAX 256

/* ---- strict JSON (RFC 8259), validated and written back compact ---------------------- */

/* Deep enough for any real arguments; deeper documents are left as content. */
#define JP_MAX_DEPTH 200

typedef struct jp {
    const char *s;
    size_t n, i;
    int depth, oom;
} jp;

static int jp_peek(const jp *j) {
    return j->i < j->n ? (unsigned char)j->s[j->i] : -1;
}

static void jp_ws(jp *j) {
    while (j->i < j->n && is_ws((unsigned char)j->s[j->i])) j->i++;
}

static void put(jp *j, tc_buf *out, const char *s, size_t n) {
    if (out && buf_add(out, s, n)) j->oom = 1;
}

/* Length of the valid UTF-8 sequence at s (n bytes available), 0 when invalid. */
static size_t utf8_len(const unsigned char *s, size_t n) {
    unsigned c = s[0];
    size_t k;
    uint32_t u;
    if (c < 0x80) return 1;
    if (c >= 0xc2 && c <= 0xdf)
        k = 2, u = c & 0x1f;
    else if (c >= 0xe0 && c <= 0xef)
        k = 3, u = c & 0x0f;
    else if (c >= 0xf0 && c <= 0xf4)
        k = 4, u = c & 0x07;
    else
        return 0;
    if (n < k) return 0;
    for (size_t i = 1; i < k; i++) {
        if ((s[i] & 0xc0) != 0x80) return 0;
        u = (u << 6) | (s[i] & 0x3f);
    }
    if ((k == 3 && u < 0x800) || (k == 4 && (u < 0x10000 || u > 0x10ffff))) return 0;
    if (u >= 0xd800 && u <= 0xdfff) return 0;
    return k;
}

static int hex4(const jp *j, size_t at, uint32_t *u) {
    if (at + 4 > j->n) return -1;
    *u = 0;
    for (int k = 0; k < 4; k++) {
        int c = (unsigned char)j->s[at + k], v;
        if (c >= '0' && c <= '9')
            v = c - '0';
        else if (c >= 'a' && c <= 'f')
            v = c - 'a' + 10;
        else if (c >= 'A' && c <= 'F')
            v = c - 'A' + 10;
        else
            return -1;
        *u = *u << 4 | (uint32_t)v;
    }
    return 0;
}

static void put_utf8(jp *j, tc_buf *out, uint32_t u) {
    char b[4];
    size_t n;
    if (u < 0x80)
        b[0] = (char)u, n = 1;
    else if (u < 0x800)
        b[0] = (char)(0xc0 | u >> 6), b[1] = (char)(0x80 | (u & 0x3f)), n = 2;
    else if (u < 0x10000) {
        b[0] = (char)(0xe0 | u >> 12), b[1] = (char)(0x80 | ((u >> 6) & 0x3f));
        b[2] = (char)(0x80 | (u & 0x3f)), n = 3;
    } else {
        b[0] = (char)(0xf0 | u >> 18), b[1] = (char)(0x80 | ((u >> 12) & 0x3f));
        b[2] = (char)(0x80 | ((u >> 6) & 0x3f)), b[3] = (char)(0x80 | (u & 0x3f)), n = 4;
    }
    put(j, out, b, n);
}

/* The string at j->i (its opening quote): written to raw as it stands, and unescaped to
 * dec (NULL: not wanted). Unescaping refuses what a C string cannot hold: \u0000 and lone
 * surrogates (which JSON's grammar itself allows, so raw alone takes them). */
static int jp_string(jp *j, tc_buf *raw, tc_buf *dec) {
    size_t start = j->i++;
    for (;;) {
        if (j->i >= j->n) return -1;
        unsigned char c = (unsigned char)j->s[j->i];
        if (c == '"') {
            j->i++;
            break;
        }
        if (c < 0x20) return -1;
        if (c == '\\') {
            if (j->i + 1 >= j->n) return -1;
            char e = j->s[j->i + 1];
            if (e == 'u') {
                uint32_t u;
                if (hex4(j, j->i + 2, &u)) return -1;
                j->i += 6;
                if (!dec) continue;
                if (u >= 0xd800 && u < 0xdc00) {
                    uint32_t lo;
                    if (j->i + 1 >= j->n || j->s[j->i] != '\\' || j->s[j->i + 1] != 'u' ||
                        hex4(j, j->i + 2, &lo) || lo < 0xdc00 || lo > 0xdfff)
                        return -1;
                    j->i += 6;
                    u = 0x10000 + ((u - 0xd800) << 10) + (lo - 0xdc00);
                } else if ((u >= 0xdc00 && u <= 0xdfff) || u == 0) {
                    return -1;
                }
                put_utf8(j, dec, u);
                continue;
            }
            const char *from = "\"\\/bfnrt", *to = "\"\\/\b\f\n\r\t";
            const char *f = e ? strchr(from, e) : NULL;
            if (!f) return -1;
            put(j, dec, to + (f - from), 1);
            j->i += 2;
            continue;
        }
        size_t k = utf8_len((const unsigned char *)j->s + j->i, j->n - j->i);
        if (!k) return -1;
        put(j, dec, j->s + j->i, k);
        j->i += k;
    }
    put(j, raw, j->s + start, j->i - start);
    return 0;
}

static int digits(jp *j) {
    size_t at = j->i;
    while (j->i < j->n && j->s[j->i] >= '0' && j->s[j->i] <= '9') j->i++;
    return j->i > at ? 0 : -1;
}

static int jp_number(jp *j, tc_buf *out) {
    size_t start = j->i;
    if (jp_peek(j) == '-') j->i++;
    if (jp_peek(j) == '0')
        j->i++;
    else if (digits(j))
        return -1;
    if (jp_peek(j) == '.') {
        j->i++;
        if (digits(j)) return -1;
    }
    if (jp_peek(j) == 'e' || jp_peek(j) == 'E') {
        j->i++;
        if (jp_peek(j) == '+' || jp_peek(j) == '-') j->i++;
        if (digits(j)) return -1;
    }
    put(j, out, j->s + start, j->i - start);
    return 0;
}

static int jp_word(jp *j, const char *w, tc_buf *out) {
    size_t n = strlen(w);
    if (j->n - j->i < n || memcmp(j->s + j->i, w, n)) return -1;
    j->i += n;
    put(j, out, w, n);
    return 0;
}

static int jp_value(jp *j, tc_buf *out);

static int jp_object(jp *j, tc_buf *out) {
    if (++j->depth > JP_MAX_DEPTH) return -1;
    j->i++;
    put(j, out, "{", 1);
    jp_ws(j);
    if (jp_peek(j) != '}') {
        for (;;) {
            if (jp_peek(j) != '"' || jp_string(j, out, NULL)) return -1;
            jp_ws(j);
            if (jp_peek(j) != ':') return -1;
            j->i++;
            put(j, out, ":", 1);
            jp_ws(j);
            if (jp_value(j, out)) return -1;
            jp_ws(j);
            if (jp_peek(j) != ',') break;
            j->i++;
            put(j, out, ",", 1);
            jp_ws(j);
        }
        if (jp_peek(j) != '}') return -1;
    }
    j->i++;
    put(j, out, "}", 1);
    j->depth--;
    return 0;
}

static int jp_array(jp *j, tc_buf *out) {
    if (++j->depth > JP_MAX_DEPTH) return -1;
    j->i++;
    put(j, out, "[", 1);
    jp_ws(j);
    if (jp_peek(j) != ']') {
        for (;;) {
            if (jp_value(j, out)) return -1;
            jp_ws(j);
            if (jp_peek(j) != ',') break;
            j->i++;
            put(j, out, ",", 1);
            jp_ws(j);
        }
        if (jp_peek(j) != ']') return -1;
    }
    j->i++;
    put(j, out, "]", 1);
    j->depth--;
    return 0;
}

static int jp_value(jp *j, tc_buf *out) {
    int c = jp_peek(j);
    switch (c) {
    case '{':
        return jp_object(j, out);
    case '[':
        return jp_array(j, out);
    case '"':
        return jp_string(j, out, NULL);
    case 't':
        return jp_word(j, "true", out);
    case 'f':
        return jp_word(j, "false", out);
    case 'n':
        return jp_word(j, "null", out);
    default:
        return c == '-' || (c >= '0' && c <= '9') ? jp_number(j, out) : -1;
    }
}

static void call_clear(tc_call *c) {
    free(c->name);
    free(c->arguments);
    c->name = c->arguments = NULL;
}

/* A call object at j->i: {"name": N, "arguments" or "parameters": {...}}, other members
 * checked and ignored. The name must be a non-empty string, the arguments an object, and
 * neither may appear twice. */
static int jp_call(jp *j, tc_call *out) {
    tc_buf key = {0}, name = {0}, args = {0};
    int ok = 0, have_name = 0, have_args = 0;
    if (jp_peek(j) != '{' || ++j->depth > JP_MAX_DEPTH) goto done;
    j->i++;
    jp_ws(j);
    if (jp_peek(j) == '}') goto done;
    for (;;) {
        key.len = 0;
        if (jp_peek(j) != '"' || jp_string(j, NULL, &key)) goto done;
        jp_ws(j);
        if (jp_peek(j) != ':') goto done;
        j->i++;
        jp_ws(j);
        int is_name = key.len == 4 && !memcmp(key.p, "name", 4);
        int is_args = (key.len == 9 && !memcmp(key.p, "arguments", 9)) ||
                      (key.len == 10 && !memcmp(key.p, "parameters", 10));
        if (is_name) {
            if (have_name++ || jp_peek(j) != '"' || jp_string(j, NULL, &name) || !name.len)
                goto done;
        } else if (is_args) {
            if (have_args++ || jp_peek(j) != '{' || jp_object(j, &args)) goto done;
        } else if (jp_value(j, NULL)) {
            goto done;
        }
        jp_ws(j);
        if (jp_peek(j) != ',') break;
        j->i++;
        jp_ws(j);
    }
    if (jp_peek(j) != '}' || !have_name || !have_args || j->oom) goto done;
    j->i++;
    j->depth--;
    out->name = take(&name);
    out->arguments = take(&args);
    ok = 1;
done:
    tc_buf_free(&key);
    tc_buf_free(&name);
    tc_buf_free(&args);
    return ok ? 0 : -1;
}

/* s[0, n) is exactly one call object. */
static int parse_call(const char *s, size_t n, tc_call *out, int *oom) {
    jp j = {s, n, 0, 0, 0};
    int r = jp_call(&j, out);
    if (!r && j.i != n) {
        call_clear(out);
        r = -1;
    }
    *oom |= j.oom;
    return r;
}

/* s[0, n) is exactly one object: its compact text. */
static char *parse_args(const char *s, size_t n, int *oom) {
    jp j = {s, n, 0, 0, 0};
    tc_buf out = {0};
    if (jp_peek(&j) != '{' || jp_object(&j, &out) || j.i != n || j.oom) {
        *oom |= j.oom;
        tc_buf_free(&out);
        return NULL;
    }
    return take(&out);
}

/* s[0, n) is exactly a non-empty array of call objects. */
static int parse_call_array(const char *s, size_t n, tc_call **calls, int *n_calls, int *oom) {
    jp j = {s, n, 0, 1, 0};
    tc_call *a = NULL;
    int k = 0;
    j.i = 1;
    jp_ws(&j);
    for (;;) {
        tc_call c = {0};
        if (jp_call(&j, &c)) goto fail;
        tc_call *na = realloc(a, (size_t)(k + 1) * sizeof *a);
        if (!na) {
            call_clear(&c);
            j.oom = 1;
            goto fail;
        }
        a = na;
        a[k++] = c;
        jp_ws(&j);
        if (jp_peek(&j) != ',') break;
        j.i++;
        jp_ws(&j);
    }
    if (jp_peek(&j) != ']' || j.i + 1 != n) goto fail;
    *calls = a;
    *n_calls = k;
    return 0;
fail:
    *oom |= j.oom;
    tc_calls_free(a, k);
    return -1;
}

/* ---- where a JSON object or array ends ------------------------------------------------ */

/* Follows brackets and strings incrementally to find the end of the value that starts with
 * an opening bracket, without judging it (parse_* does, once it is whole). Refuses early
 * what can never be JSON (a byte outside strings that no JSON token has, a control byte in
 * a string), so that a closing tag after an unfinished object settles it as malformed. */
typedef struct jscan {
    size_t pos;
    long depth;
    int in_str, esc;
} jscan;

enum { JS_MORE, JS_END, JS_BAD };

static int js_run(jscan *m, const char *s, size_t len, size_t *end) {
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
                return JS_BAD;
            continue;
        }
        if (m->depth == 0 && c != '{' && c != '[') return JS_BAD;
        if (c == '"')
            m->in_str = 1;
        else if (c == '{' || c == '[')
            m->depth++;
        else if (c == '}' || c == ']') {
            if (--m->depth == 0) {
                *end = ++m->pos;
                return JS_END;
            }
        } else if (!c || !strchr(" \t\n\r:,-+.0123456789truefalsnE", c)) {
            return JS_BAD;
        }
    }
    return JS_MORE;
}

/* ---- the parser --------------------------------------------------------------------- */

enum {
    ST_TEXT,     /* plain text, looking for the format's markers */
    ST_START,    /* Llama 3: the reply's first bytes (a reply that is a JSON object) */
    ST_HERMES,   /* after <tool_call> */
    ST_LLAMA,    /* the calls that make up the rest of the reply */
    ST_MISTRAL,  /* after [TOOL_CALLS] */
    ST_DS_BLOCK, /* DeepSeek: inside <｜tool▁calls▁begin｜>, between calls */
    ST_DS_CALL,  /* DeepSeek: after <｜tool▁call▁begin｜> */
    ST_H_INIT,   /* harmony: the output's first bytes (a header continuing the prompt's) */
    ST_H_BODY,   /* harmony: a message's body, or text outside messages */
    ST_H_HEADER, /* harmony: a message header, up to <|message|> */
    ST_H_CALL,   /* harmony: the body of a message to=functions.NAME */
};

enum { GO, WAIT };

struct tc_parser {
    tc_format f;
    tc_buf in;
    size_t pos; /* in.p[0, pos) is done with; in a construct, pos == mark */
    int st, stage, eof, oom;
    int after_call; /* whitespace right after a call is dropped unless text follows it */
    /* the construct being read: on failure [mark, resume) goes out as content and scanning
     * goes on at resume; at is where its reading stands; t0..t1 a name in it */
    size_t mark, resume, at, t0, t1;
    jscan js;
    tc_call cur;
    tc_call *held; /* Llama 3: calls known only once the reply has ended */
    int n_held;
    int in_block, block_calls, v3; /* DeepSeek */
    int reasoning_kind;            /* harmony: the body is the analysis channel */
    tc_buf *reasoning;
    /* this push's outputs */
    tc_buf *content;
    tc_call **calls;
    int *n_calls, added;
};

static const char H_START[] = "<|start|>", H_CHANNEL[] = "<|channel|>",
                  H_CONSTRAIN[] = "<|constrain|>", H_MESSAGE[] = "<|message|>", H_END[] = "<|end|>",
                  H_CALL[] = "<|call|>", H_RETURN[] = "<|return|>";
static const char DS_CALLS_BEGIN[] = "<｜tool▁calls▁begin｜>",
                  DS_CALLS_END[] = "<｜tool▁calls▁end｜>",
                  DS_CALL_BEGIN[] = "<｜tool▁call▁begin｜>", DS_CALL_END[] = "<｜tool▁call▁end｜>",
                  DS_SEP[] = "<｜tool▁sep｜>";
static const char PYTHON_TAG[] = "<|python_tag|>";

#define L(p)    ((p)->in.len)
#define C(p, i) ((unsigned char)(p)->in.p[i])

static void emit_to(tc_parser *p, tc_buf *dst, size_t a, size_t b) {
    if (dst && b > a && buf_add(dst, p->in.p + a, b - a)) p->oom = 1;
}

static void emit(tc_parser *p, size_t a, size_t b) {
    emit_to(p, p->content, a, b);
}

static void out_call(tc_parser *p, tc_call *c) {
    tc_call *a = realloc(*p->calls, (size_t)(*p->n_calls + 1) * sizeof *a);
    if (!a) {
        call_clear(c);
        p->oom = 1;
        return;
    }
    a[(*p->n_calls)++] = *c;
    *p->calls = a;
    c->name = c->arguments = NULL;
    p->added++;
}

/* 1: lit is at `at`; 0: the text ends inside a prefix of it; -1: something else is there. */
static int lit_at(const tc_parser *p, size_t at, const char *lit) {
    size_t n = strlen(lit), have = L(p) - at;
    if (!have) return 0;
    if (have >= n) return memcmp(p->in.p + at, lit, n) ? -1 : 1;
    return memcmp(p->in.p + at, lit, have) ? -1 : 0;
}

/* The first of markers m[0..nm) in in[from, len): 1 with *which and *at; or 0 with *safe,
 * the end of the text that cannot be part of a marker (a marker's proper prefix at the end
 * of the text is held back). */
static int find_marker(const tc_parser *p, size_t from, const char *const *m, int nm, int *which,
                       size_t *at, size_t *safe) {
    const char *s = p->in.p + from;
    size_t n = L(p) - from, best = SIZE_MAX, hold = 0;
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
    *safe = L(p) - hold;
    return 0;
}

/* Moves p->at past whitespace; 1 when a byte follows it. */
static int skip_ws(tc_parser *p) {
    while (p->at < L(p) && is_ws(C(p, p->at))) p->at++;
    return p->at < L(p);
}

static int text_state(const tc_parser *p) {
    return p->f == TC_HARMONY ? ST_H_BODY : ST_TEXT;
}

/* The construct is not a call: what it held goes out as content up to resume. */
static int fail(tc_parser *p) {
    emit(p, p->mark, p->resume);
    p->pos = p->resume;
    p->st = text_state(p);
    p->reasoning_kind = 0;
    p->after_call = 0;
    call_clear(&p->cur);
    tc_calls_free(p->held, p->n_held);
    p->held = NULL;
    p->n_held = 0;
    return GO;
}

/* The text ends here for now: wait for more, or at the end of the output, fail. */
static int need(tc_parser *p) {
    return p->eof ? fail(p) : WAIT;
}

/* A call is complete and its text ends at `end`. */
static int done_call(tc_parser *p, size_t end) {
    out_call(p, &p->cur);
    p->pos = p->mark = end;
    p->st = text_state(p);
    p->after_call = 1;
    return GO;
}

static void js_start(tc_parser *p) {
    p->js = (jscan){.pos = p->at};
}

/* Reads the JSON value that starts at p->at (already checked to open with a bracket):
 * JS_END with p->at moved past it and *from its start, or what js_run said. */
static int js_step(tc_parser *p, size_t *from) {
    size_t end;
    *from = p->at;
    int r = js_run(&p->js, p->in.p, L(p), &end);
    if (r == JS_END) p->at = end;
    return r;
}

/* Where the whitespace right before `end` starts (at most WS_HOLD_MAX bytes of it, so that
 * a long run of whitespace is not held back, nor scanned again at every push). */
static size_t ws_tail(const tc_parser *p, size_t end) {
    size_t ws = end;
    while (ws > p->pos && end - ws < WS_HOLD_MAX && is_ws(C(p, ws - 1))) ws--;
    return ws;
}

/* Releases in[pos, end) as content. */
static void emit_text(tc_parser *p, size_t end) {
    for (size_t i = p->pos; p->after_call && i < end; i++)
        if (!is_ws(C(p, i))) p->after_call = 0;
    emit(p, p->pos, end);
    p->pos = end;
}

static int st_text(tc_parser *p) {
    static const char *const hermes[] = {"<tool_call>"}, *const llama[] = {PYTHON_TAG},
                             *const mistral[] = {"[TOOL_CALLS]"},
                             *const deepseek[] = {DS_CALLS_BEGIN, DS_CALL_BEGIN};
    const char *const *m = NULL;
    int nm = 0, which = 0;
    switch (p->f) {
    case TC_HERMES:
        m = hermes, nm = 1;
        break;
    case TC_LLAMA3:
        m = llama, nm = 1;
        break;
    case TC_MISTRAL:
    case TC_MISTRAL_V11:
        m = mistral, nm = 1;
        break;
    case TC_DEEPSEEK:
        m = deepseek, nm = 2;
        break;
    default:
        break;
    }
    size_t at, safe;
    if (find_marker(p, p->pos, m, nm, &which, &at, &safe)) {
        /* whitespace before a call is formatting: held with it, dropped if it is one */
        size_t ws = ws_tail(p, at);
        emit_text(p, ws);
        p->mark = ws;
        p->resume = p->at = at + strlen(m[which]);
        p->stage = 0;
        switch (p->f) {
        case TC_HERMES:
            p->st = ST_HERMES;
            break;
        case TC_LLAMA3:
            p->st = ST_LLAMA;
            break;
        case TC_DEEPSEEK:
            p->block_calls = 0;
            p->in_block = which == 0;
            p->st = which == 0 ? ST_DS_BLOCK : ST_DS_CALL;
            p->t0 = p->at;
            break;
        default:
            p->st = ST_MISTRAL;
            break;
        }
        return GO;
    }
    if (p->eof) {
        /* whitespace that only follows a call is formatting too */
        size_t q = p->pos;
        while (q < L(p) && is_ws(C(p, q))) q++;
        emit_text(p, p->after_call && q == L(p) ? ws_tail(p, L(p)) : L(p));
        p->pos = L(p);
        return WAIT;
    }
    /* trailing whitespace waits: it is dropped if a call follows it */
    emit_text(p, ws_tail(p, safe));
    return WAIT;
}

/* Llama 3: a reply that starts (after whitespace) with '{' may be nothing but calls. */
static int st_start(tc_parser *p) {
    size_t q = p->pos;
    while (q < L(p) && q - p->pos < WS_HOLD_MAX && is_ws(C(p, q))) q++;
    if (q == L(p) && q - p->pos < WS_HOLD_MAX && !p->eof) return WAIT;
    if (q < L(p) && q - p->pos < WS_HOLD_MAX && C(p, q) == '{') {
        p->mark = p->pos;
        p->resume = p->at = q;
        p->stage = 0;
        p->st = ST_LLAMA;
        return GO;
    }
    p->st = ST_TEXT;
    return GO;
}

static int st_hermes(tc_parser *p) {
    size_t from;
    switch (p->stage) {
    case 0:
        if (!skip_ws(p)) return need(p);
        if (C(p, p->at) != '{') return fail(p);
        js_start(p);
        p->stage = 1;
        /* fall through */
    case 1:
        switch (js_step(p, &from)) {
        case JS_MORE:
            return need(p);
        case JS_BAD:
            return fail(p);
        }
        if (parse_call(p->in.p + from, p->at - from, &p->cur, &p->oom)) return fail(p);
        p->stage = 2;
        /* fall through */
    default:
        if (!skip_ws(p)) return need(p);
        switch (lit_at(p, p->at, "</tool_call>")) {
        case 0:
            return need(p);
        case -1:
            return fail(p);
        }
        return done_call(p, p->at + strlen("</tool_call>"));
    }
}

/* Llama 3: calls separated by ';' up to the end of the reply; known only at its end. */
static int st_llama(tc_parser *p) {
    for (;;) {
        size_t from;
        if (p->stage == 0) { /* a call object */
            if (!skip_ws(p)) {
                if (p->eof && p->n_held) break; /* a trailing ';' */
                return need(p);
            }
            if (C(p, p->at) != '{') return fail(p);
            js_start(p);
            p->stage = 1;
        }
        if (p->stage == 1) {
            switch (js_step(p, &from)) {
            case JS_MORE:
                return need(p);
            case JS_BAD:
                return fail(p);
            }
            tc_call c = {0};
            if (parse_call(p->in.p + from, p->at - from, &c, &p->oom)) return fail(p);
            tc_call *h = realloc(p->held, (size_t)(p->n_held + 1) * sizeof *h);
            if (!h) {
                call_clear(&c);
                p->oom = 1;
                return WAIT;
            }
            p->held = h;
            p->held[p->n_held++] = c;
            p->stage = 2;
        }
        /* stage 2: after a call, ';' and another, or the end of the reply */
        if (!skip_ws(p)) {
            if (p->eof) break;
            return WAIT;
        }
        if (C(p, p->at) != ';') return fail(p);
        p->at++;
        p->stage = 0;
    }
    for (int i = 0; i < p->n_held; i++) out_call(p, &p->held[i]);
    free(p->held);
    p->held = NULL;
    p->n_held = 0;
    p->pos = p->mark = L(p);
    p->st = ST_TEXT;
    p->after_call = 1;
    return GO;
}

/* Mistral: [TOOL_CALLS][{call}, ...] or [TOOL_CALLS]NAME[CALL_ID]ID[ARGS]{args} (the
 * [CALL_ID] part optional). */
static int st_mistral(tc_parser *p) {
    size_t from;
    int r;
    for (;;) switch (p->stage) {
        case 0:
            if (!skip_ws(p)) return need(p);
            if (C(p, p->at) == '[') {
                js_start(p);
                p->stage = 1;
            } else {
                p->t0 = p->at;
                p->stage = 2;
            }
            break;
        case 1: { /* the array form */
            switch (js_step(p, &from)) {
            case JS_MORE:
                return need(p);
            case JS_BAD:
                return fail(p);
            }
            tc_call *a;
            int n;
            if (parse_call_array(p->in.p + from, p->at - from, &a, &n, &p->oom)) return fail(p);
            for (int i = 0; i < n; i++) out_call(p, &a[i]);
            free(a);
            p->pos = p->mark = p->at;
            p->st = ST_TEXT;
            p->after_call = 1;
            return GO;
        }
        case 2: /* NAME up to '[' */
            while (p->at < L(p) && name_char(C(p, p->at)) && p->at - p->t0 <= NAME_MAX_LEN) p->at++;
            if (p->at - p->t0 > NAME_MAX_LEN) return fail(p);
            if (p->at == L(p)) return need(p);
            if (C(p, p->at) != '[' || p->at == p->t0) return fail(p);
            p->t1 = p->at;
            p->stage = 3;
            break;
        case 3: { /* [ARGS], or [CALL_ID] first */
            int a = lit_at(p, p->at, "[ARGS]"), c = lit_at(p, p->at, "[CALL_ID]");
            if (a == 1) {
                p->at += 6;
                p->stage = 5;
            } else if (c == 1) {
                p->at += 9;
                p->stage = 4;
            } else if (a == 0 || c == 0) {
                return need(p);
            } else {
                return fail(p);
            }
            break;
        }
        case 4: /* the call id, then [ARGS] */
            while (p->at < L(p) && name_char(C(p, p->at)) && p->at - p->t1 <= NAME_MAX_LEN) p->at++;
            if (p->at - p->t1 > NAME_MAX_LEN) return fail(p);
            if ((r = lit_at(p, p->at, "[ARGS]")) != 1) return r ? fail(p) : need(p);
            p->at += 6;
            p->stage = 5;
            break;
        case 5:
            if (!skip_ws(p)) return need(p);
            if (C(p, p->at) != '{') return fail(p);
            js_start(p);
            p->stage = 6;
            break;
        default:
            switch (js_step(p, &from)) {
            case JS_MORE:
                return need(p);
            case JS_BAD:
                return fail(p);
            }
            if (!(p->cur.arguments = parse_args(p->in.p + from, p->at - from, &p->oom)))
                return fail(p);
            if (!(p->cur.name = strndup(p->in.p + p->t0, p->t1 - p->t0))) p->oom = 1;
            return done_call(p, p->at);
        }
}

/* DeepSeek: between calls of a <｜tool▁calls▁begin｜> block. */
static int st_ds_block(tc_parser *p) {
    if (!skip_ws(p)) {
        if (!p->eof) return WAIT;
        if (!p->block_calls) return fail(p);
        p->pos = p->mark = L(p);
        p->st = ST_TEXT;
        return GO;
    }
    int b = lit_at(p, p->at, DS_CALL_BEGIN), e = lit_at(p, p->at, DS_CALLS_END);
    if (b == 1) {
        if (p->block_calls) p->mark = p->pos = p->at; /* a failure spares the calls before */
        p->at += strlen(DS_CALL_BEGIN);
        p->resume = p->t0 = p->at;
        p->stage = 0;
        p->st = ST_DS_CALL;
        return GO;
    }
    if (e == 1 && p->block_calls) {
        p->pos = p->mark = p->at + strlen(DS_CALLS_END);
        p->st = ST_TEXT;
        p->after_call = 1;
        return GO;
    }
    if ((b == 0 || e == 0) && !p->eof) return WAIT;
    if (!p->block_calls) return fail(p);
    /* the block goes on with something else: that is text */
    p->pos = p->mark = p->at;
    p->st = ST_TEXT;
    p->after_call = 0;
    return GO;
}

/* DeepSeek V3: function<｜tool▁sep｜>NAME\n```json\n{..}\n```<｜tool▁call▁end｜>;
 * V3.1: NAME<｜tool▁sep｜>{..}<｜tool▁call▁end｜>. */
static int st_ds_call(tc_parser *p) {
    size_t from;
    int r;
    for (;;) switch (p->stage) {
        case 0: /* the type (V3) or the name (V3.1), then the separator */
            while (p->at < L(p) && name_char(C(p, p->at)) && p->at - p->t0 <= NAME_MAX_LEN) p->at++;
            if (p->at - p->t0 > NAME_MAX_LEN) return fail(p);
            if (p->at == L(p)) return need(p);
            if (p->at == p->t0) return fail(p);
            if ((r = lit_at(p, p->at, DS_SEP)) != 1) return r ? fail(p) : need(p);
            p->t1 = p->at;
            p->at += strlen(DS_SEP);
            p->stage = 1;
            break;
        case 1:
            if (p->at == L(p)) return need(p);
            if (C(p, p->at) == '{' || is_ws(C(p, p->at))) {
                p->v3 = 0;
                p->stage = 5;
            } else {
                if (p->t1 - p->t0 != 8 || memcmp(p->in.p + p->t0, "function", 8)) return fail(p);
                p->v3 = 1;
                p->t0 = p->at;
                p->stage = 2;
            }
            break;
        case 2: /* V3: the name on its own line */
            while (p->at < L(p) && name_char(C(p, p->at)) && p->at - p->t0 <= NAME_MAX_LEN) p->at++;
            if (p->at - p->t0 > NAME_MAX_LEN) return fail(p);
            if (p->at == L(p)) return need(p);
            if (C(p, p->at) != '\n' || p->at == p->t0) return fail(p);
            p->t1 = p->at++;
            p->stage = 3;
            break;
        case 3: /* the code fence, "json" optional */
            if ((r = lit_at(p, p->at, "```")) != 1) return r ? fail(p) : need(p);
            p->at += 3;
            p->stage = 4;
            break;
        case 4:
            if ((r = lit_at(p, p->at, "json")) == 0) return need(p);
            if (r == 1) p->at += 4;
            p->stage = 5;
            break;
        case 5:
            if (!skip_ws(p)) return need(p);
            if (C(p, p->at) != '{') return fail(p);
            js_start(p);
            p->stage = 6;
            break;
        case 6:
            switch (js_step(p, &from)) {
            case JS_MORE:
                return need(p);
            case JS_BAD:
                return fail(p);
            }
            if (!(p->cur.arguments = parse_args(p->in.p + from, p->at - from, &p->oom)))
                return fail(p);
            p->stage = p->v3 ? 7 : 8;
            break;
        case 7: /* V3: the closing fence */
            if (!skip_ws(p)) return need(p);
            if ((r = lit_at(p, p->at, "```")) != 1) return r ? fail(p) : need(p);
            p->at += 3;
            p->stage = 8;
            break;
        default:
            if (!skip_ws(p)) return need(p);
            if ((r = lit_at(p, p->at, DS_CALL_END)) != 1) return r ? fail(p) : need(p);
            if (!(p->cur.name = strndup(p->in.p + p->t0, p->t1 - p->t0))) p->oom = 1;
            out_call(p, &p->cur);
            p->at += strlen(DS_CALL_END);
            p->pos = p->mark = p->at;
            if (p->in_block) {
                p->block_calls++;
                p->st = ST_DS_BLOCK;
            } else {
                p->st = ST_TEXT;
                p->after_call = 1;
            }
            return GO;
        }
}

/* ---- harmony (gpt-oss) ---------------------------------------------------------------- */

/* Longest header read before <|message|>; a longer one is not a header. */
#define H_HEADER_MAX 1024

/* The output may open by continuing the prompt's "<|start|>assistant" header with a
 * recipient (" to=functions.NAME<|channel|>..."). */
static int st_h_init(tc_parser *p) {
    static const char *const open[] = {" to=", "to="};
    int partial = 0;
    for (int k = 0; k < 2; k++) {
        int r = lit_at(p, p->pos, open[k]);
        if (r == 1) {
            p->mark = p->pos;
            p->resume = p->pos + strlen(open[k]);
            p->st = ST_H_HEADER;
            return GO;
        }
        partial |= r == 0;
    }
    if (partial && !p->eof) return WAIT;
    p->st = ST_H_BODY;
    return GO;
}

static int st_h_body(tc_parser *p) {
    static const char *const m[] = {H_START, H_CHANNEL, H_CONSTRAIN, H_MESSAGE,
                                    H_END,   H_CALL,    H_RETURN};
    tc_buf *dst = p->reasoning_kind ? p->reasoning : p->content;
    int w = 0;
    size_t at, safe;
    if (!find_marker(p, p->pos, m, 7, &w, &at, &safe)) {
        size_t end = p->eof ? L(p) : safe;
        emit_to(p, dst, p->pos, end);
        p->pos = end;
        return WAIT;
    }
    emit_to(p, dst, p->pos, at);
    if (w >= 3) { /* a body without a header, or a message's end: text is content again */
        p->pos = at + strlen(m[w]);
        p->reasoning_kind = 0;
        return GO;
    }
    p->pos = p->mark = at;
    p->resume = at + strlen(m[w]);
    p->st = ST_H_HEADER;
    return GO;
}

/* The token after `key` in the header h[0, n): up to whitespace or '<'. */
static int header_word(const char *h, size_t n, const char *key, size_t *a, size_t *b) {
    size_t kl = strlen(key);
    const char *f = n >= kl ? memmem(h, n, key, kl) : NULL;
    if (!f) return 0;
    *a = *b = (size_t)(f - h) + kl;
    while (*b < n && !is_ws((unsigned char)h[*b]) && h[*b] != '<') (*b)++;
    return 1;
}

static int st_h_header(tc_parser *p) {
    static const char *const m[] = {H_MESSAGE, H_START, H_END, H_CALL, H_RETURN};
    int w = 0;
    size_t at, safe;
    if (!find_marker(p, p->resume, m, 5, &w, &at, &safe))
        return L(p) - p->mark > H_HEADER_MAX + strlen(H_MESSAGE) ? fail(p) : need(p);
    if (at - p->mark > H_HEADER_MAX || w != 0) return fail(p);
    const char *h = p->in.p + p->mark;
    size_t n = at - p->mark, ra, rb, ca, cb;
    size_t body = at + strlen(H_MESSAGE);
    int to = header_word(h, n, "to=", &ra, &rb);
    int fn = to && rb - ra > 10 && !memcmp(h + ra, "functions.", 10);
    for (size_t i = ra + 10; fn && i < rb; i++) fn = name_char((unsigned char)h[i]);
    if (fn) {
        p->t0 = p->mark + ra + 10;
        p->t1 = p->mark + rb;
        p->at = p->resume = body;
        p->stage = 0;
        p->st = ST_H_CALL;
        return GO;
    }
    if (to && rb > ra) { /* a built-in tool (browser, python): left as text */
        p->resume = body;
        return fail(p);
    }
    int ch = header_word(h, n, H_CHANNEL, &ca, &cb);
    p->reasoning_kind = ch && cb - ca == 8 && !memcmp(h + ca, "analysis", 8);
    p->pos = body;
    p->st = ST_H_BODY;
    return GO;
}

static int st_h_call(tc_parser *p) {
    size_t from;
    switch (p->stage) {
    case 0:
        if (!skip_ws(p)) return need(p);
        if (C(p, p->at) != '{') return fail(p);
        js_start(p);
        p->stage = 1;
        /* fall through */
    case 1:
        switch (js_step(p, &from)) {
        case JS_MORE:
            return need(p);
        case JS_BAD:
            return fail(p);
        }
        if (!(p->cur.arguments = parse_args(p->in.p + from, p->at - from, &p->oom))) return fail(p);
        if (!(p->cur.name = strndup(p->in.p + p->t0, p->t1 - p->t0))) p->oom = 1;
        p->stage = 2;
        /* fall through */
    default: {
        if (!skip_ws(p)) {
            if (!p->eof) return WAIT;
            return done_call(p, L(p)); /* <|call|> ends generation: it may not be here */
        }
        static const char *const ends[] = {H_CALL, H_END, H_RETURN};
        int partial = 0;
        for (int k = 0; k < 3; k++) {
            int r = lit_at(p, p->at, ends[k]);
            if (r == 1) return done_call(p, p->at + strlen(ends[k]));
            partial |= r == 0;
        }
        return partial ? need(p) : fail(p);
    }
    }
}

/* ---- driving ------------------------------------------------------------------------ */

static void run(tc_parser *p) {
    for (;;) {
        if (p->oom) return;
        int r;
        switch (p->st) {
        case ST_START:
            r = st_start(p);
            break;
        case ST_HERMES:
            r = st_hermes(p);
            break;
        case ST_LLAMA:
            r = st_llama(p);
            break;
        case ST_MISTRAL:
            r = st_mistral(p);
            break;
        case ST_DS_BLOCK:
            r = st_ds_block(p);
            break;
        case ST_DS_CALL:
            r = st_ds_call(p);
            break;
        case ST_H_INIT:
            r = st_h_init(p);
            break;
        case ST_H_BODY:
            r = st_h_body(p);
            break;
        case ST_H_HEADER:
            r = st_h_header(p);
            break;
        case ST_H_CALL:
            r = st_h_call(p);
            break;
        default:
            r = st_text(p);
            break;
        }
        if (r == WAIT) return;
    }
}

tc_parser *tc_parser_new(tc_format f) {
    tc_parser *p = calloc(1, sizeof *p);
    if (!p || buf_add(&p->in, "", 0)) { /* in.p is never NULL */
        free(p);
        return NULL;
    }
    p->f = f;
    p->st = f == TC_LLAMA3 ? ST_START : f == TC_HARMONY ? ST_H_INIT : ST_TEXT;
    return p;
}

void tc_parser_set_reasoning(tc_parser *p, tc_buf *reasoning) {
    p->reasoning = reasoning;
}

/* Drops what is done with, so that the buffer holds only what is still undecided. */
static void compact(tc_parser *p) {
    size_t d = p->pos;
    if (!d || (d < 65536 && d * 2 < L(p))) return;
    memmove(p->in.p, p->in.p + d, L(p) - d);
    p->in.len -= d;
    p->in.p[p->in.len] = 0;
    /* offsets of a construct not under way are stale and set again before use */
    p->pos -= d, p->mark -= d, p->resume -= d, p->at -= d, p->t0 -= d, p->t1 -= d;
    p->js.pos -= d;
}

static int feed(tc_parser *p, const char *s, size_t n, int eof, tc_buf *content, tc_call **calls,
                int *n_calls) {
    if (p->oom) return -1;
    if (p->eof) return 0;
    p->content = content;
    p->calls = calls;
    p->n_calls = n_calls;
    p->added = 0;
    compact(p);
    if (n && buf_add(&p->in, s, n)) {
        p->oom = 1;
        return -1;
    }
    p->eof = eof;
    run(p);
    p->content = NULL;
    p->calls = NULL;
    p->n_calls = NULL;
    return p->oom ? -1 : p->added;
}

int tc_push(tc_parser *p, const char *s, size_t n, tc_buf *content, tc_call **calls, int *n_calls) {
    return feed(p, s, n, 0, content, calls, n_calls);
}

int tc_finish(tc_parser *p, tc_buf *content, tc_call **calls, int *n_calls) {
    return feed(p, NULL, 0, 1, content, calls, n_calls);
}

void tc_parser_free(tc_parser *p) {
    if (!p) return;
    tc_buf_free(&p->in);
    call_clear(&p->cur);
    tc_calls_free(p->held, p->n_held);
    free(p);
}

void tc_calls_free(tc_call *c, int n) {
    for (int i = 0; c && i < n; i++) call_clear(&c[i]);
    free(c);
}

/* ---- detection ---------------------------------------------------------------------- */

tc_format tc_detect(const char *t, const char *model_type) {
    if (!t || !*t) return TC_NONE;
    if (strstr(t, "<tool_call>")) {
        /* Qwen3-Coder writes XML (<function=NAME><parameter=...>) inside these tags: a
         * format of its own, not parsed here */
        if (strstr(t, "<function=")) return TC_NONE;
        return TC_HERMES;
    }
    if (strstr(t, "[TOOL_CALLS]")) return strstr(t, "[ARGS]") ? TC_MISTRAL_V11 : TC_MISTRAL;
    if (strstr(t, "tool▁calls▁begin") || strstr(t, "tool▁call▁begin")) return TC_DEEPSEEK;
    if (strstr(t, "to=functions") || (strstr(t, "<|channel|>") && strstr(t, "<|call|>")))
        return TC_HARMONY;
    if (strstr(t, "<|python_tag|>") ||
        (strstr(t, "<|start_header_id|>") && strstr(t, "tools") && strstr(t, "\"parameters\"")))
        return TC_LLAMA3;
    /* Gemma 3's template (like Llama 2's) defines no tool format: function calling there
     * is left to the user's own prompt, so it is TC_NONE. */
    if (!strstr(t, "tools") || !model_type) return TC_NONE;
    static const struct {
        const char *type;
        tc_format f;
    } by_type[] = {
        {"qwen2", TC_HERMES},         {"qwen2_moe", TC_HERMES}, {"qwen3", TC_HERMES},
        {"qwen3_moe", TC_HERMES},     {"llama", TC_LLAMA3},     {"mistral", TC_MISTRAL},
        {"mixtral", TC_MISTRAL},      {"gpt_oss", TC_HARMONY},  {"deepseek_v2", TC_DEEPSEEK},
        {"deepseek_v3", TC_DEEPSEEK},
    };
    for (size_t i = 0; i < sizeof by_type / sizeof by_type[0]; i++)
        if (!strcmp(model_type, by_type[i].type)) return by_type[i].f;
    return TC_NONE;
}

const char *tc_format_name(tc_format f) {
    switch (f) {
    case TC_HERMES:
        return "hermes";
    case TC_LLAMA3:
        return "llama3";
    case TC_MISTRAL:
        return "mistral";
    case TC_MISTRAL_V11:
        return "mistral-v11";
    case TC_HARMONY:
        return "harmony";
    case TC_DEEPSEEK:
        return "deepseek";
    default:
        return "none";
    }
}

/* ---- the grammar that forces a call ------------------------------------------------- */

__attribute__((format(printf, 3, 4))) static void errf(char *err, size_t len, const char *fmt,
                                                       ...) {
    va_list ap;
    va_start(ap, fmt);
    if (err && len) vsnprintf(err, len, fmt, ap);
    va_end(ap);
}

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

/* A copy of the tool's parameters schema ({"type": "object"} when it has none), or NULL
 * when they are not an object. */
static json_object *tool_params(json_object *fn) {
    json_object *params = NULL, *copy = NULL;
    if (!json_object_object_get_ex(fn, "parameters", &params) || !params) {
        copy = json_object_new_object();
        if (copy) json_object_object_add(copy, "type", json_object_new_string("object"));
        return copy;
    }
    if (!json_object_is_type(params, json_type_object)) return NULL;
    if (json_object_deep_copy(params, &copy, NULL)) return NULL;
    return copy;
}

/* {"type":"object","properties":{"name":{"const":NAME},KEY:PARAMS},"required":["name",KEY]},
 * with the parameters' $defs / definitions moved to the top, where their "#/$defs/..."
 * references point. Takes params. */
static json_object *call_schema(const char *name, json_object *params, const char *key) {
    json_object *root = json_object_new_object(), *props = json_object_new_object(),
                *nm = json_object_new_object(), *req = json_object_new_array();
    if (!root || !props || !nm || !req) {
        json_object_put(root), json_object_put(props), json_object_put(nm);
        json_object_put(req), json_object_put(params);
        return NULL;
    }
    static const char *const defs[] = {"$defs", "definitions"};
    for (int i = 0; i < 2; i++) {
        json_object *d;
        if (json_object_object_get_ex(params, defs[i], &d)) {
            json_object_object_add(root, defs[i], json_object_get(d));
            json_object_object_del(params, defs[i]);
        }
    }
    json_object_object_add(root, "type", json_object_new_string("object"));
    json_object_object_add(nm, "const", json_object_new_string(name));
    json_object_object_add(props, "name", nm);
    json_object_object_add(props, key, params);
    json_object_object_add(root, "properties", props);
    json_object_array_add(req, json_object_new_string("name"));
    json_object_array_add(req, json_object_new_string(key));
    json_object_object_add(root, "required", req);
    return root;
}

/* Whether a name can be written bare in format f and read back by the parser. */
static int bare_name_ok(const char *name) {
    for (const unsigned char *s = (const unsigned char *)name; *s; s++)
        if (!name_char(*s)) return 0;
    return strlen(name) <= NAME_MAX_LEN;
}

static gram *lit(const char *s) {
    return gram_lit(s, strlen(s));
}

static gram *lit3(const char *a, const char *b, const char *c) {
    size_t la = strlen(a), lb = strlen(b), lc = strlen(c);
    char *s = malloc(la + lb + lc + 1);
    if (!s) return NULL;
    memcpy(s, a, la);
    memcpy(s + la, b, lb);
    memcpy(s + la + lb, c, lc + 1);
    gram *g = gram_lit(s, la + lb + lc);
    free(s);
    return g;
}

/* One tool's call in format f (without the format's outer wrapping); NULL with err. */
static gram *tool_gram(tc_format f, const char *name, json_object *fn, char *err, size_t err_len) {
    char e[512] = "";
    json_object *params = tool_params(fn);
    if (!params) {
        errf(err, err_len, "tool '%s': 'parameters' must be a JSON Schema object", name);
        return NULL;
    }
    if ((f == TC_MISTRAL_V11 || f == TC_DEEPSEEK || f == TC_HARMONY) && !bare_name_ok(name)) {
        json_object_put(params);
        errf(err, err_len, "tool '%s': the name cannot be written in the %s tool-call format", name,
             tc_format_name(f));
        return NULL;
    }
    json_object *schema = params;
    if (f == TC_HERMES || f == TC_LLAMA3 || f == TC_MISTRAL) {
        schema = call_schema(name, params, f == TC_LLAMA3 ? "parameters" : "arguments");
        if (!schema) {
            errf(err, err_len, "out of memory");
            return NULL;
        }
    }
    gram *g = gram_json(schema, e, sizeof e);
    json_object_put(schema);
    if (!g) {
        errf(err, err_len, "tool '%s': %s", name, e[0] ? e : "out of memory");
        return NULL;
    }
    switch (f) {
    case TC_MISTRAL_V11:
        return gram_seq((gram *[]){lit3("", name, "[ARGS]"), g}, 2);
    case TC_DEEPSEEK:
        return gram_seq(
            (gram *[]){lit3("<｜tool▁call▁begin｜>function<｜tool▁sep｜>", name, "\n```json\n"), g,
                       lit("\n```<｜tool▁call▁end｜>")},
            3);
    case TC_HARMONY:
        /* the template's order, after the prompt's "<|start|>assistant" */
        return gram_seq(
            (gram *[]){lit3(" to=functions.", name, "<|channel|>commentary json<|message|>"), g},
            2);
    default:
        return g;
    }
}

gram *tc_grammar(tc_format f, json_object *tools, const char *only_name, int parallel, char *err,
                 size_t err_len) {
    if (err && err_len) err[0] = 0;
    if (f == TC_NONE) {
        errf(err, err_len, "the model's chat template has no tool-call format");
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
        if (!(alts[na] = tool_gram(f, name, fn, err, err_len))) goto fail;
        na++;
    }
    if (!na) {
        errf(err, err_len, "tool_choice names the function '%s', which is not among the tools",
             only_name ? only_name : "");
        goto fail;
    }
    gram *any = gram_alt(alts, na), *g;
    free(alts);
    switch (f) {
    case TC_HERMES: {
        gram *one = gram_seq((gram *[]){lit("<tool_call>\n"), any, lit("\n</tool_call>")}, 3);
        g = parallel ? gram_repeat(one, lit("\n"), 1, -1) : one;
        break;
    }
    case TC_LLAMA3:
        g = parallel ? gram_repeat(any, lit("; "), 1, -1) : any;
        break;
    case TC_MISTRAL:
        g = gram_seq((gram *[]){lit("[TOOL_CALLS]["),
                                parallel ? gram_repeat(any, lit(", "), 1, -1) : any, lit("]")},
                     3);
        break;
    case TC_MISTRAL_V11: {
        gram *one = gram_seq((gram *[]){lit("[TOOL_CALLS]"), any}, 2);
        g = parallel ? gram_repeat(one, NULL, 1, -1) : one;
        break;
    }
    case TC_DEEPSEEK:
        g = gram_seq((gram *[]){lit("<｜tool▁calls▁begin｜>"),
                                parallel ? gram_repeat(any, lit("\n"), 1, -1) : any,
                                lit("<｜tool▁calls▁end｜>")},
                     3);
        break;
    default: { /* harmony: reasoning first if the model wants, then one call (<|call|>
                * ends the turn, as an end-of-sequence token) */
        gram *think = gram_seq((gram *[]){lit("<|channel|>analysis<|message|>"),
                                          gram_until("<|end|>", 7), lit("<|start|>assistant")},
                               3);
        g = gram_seq((gram *[]){gram_repeat(think, NULL, 0, 1), any}, 2);
        break;
    }
    }
    if (!g) errf(err, err_len, "out of memory");
    return g;
fail:
    for (int i = 0; i < na; i++) gram_free(alts[i]);
    free(alts);
    return NULL;
}
