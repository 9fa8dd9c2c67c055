/* Lexer and parser of the Jinja interpreter. Both follow jinja2's lexer.py and parser.py
 * closely (same precedence, same whitespace control with trim_blocks and lstrip_blocks as
 * transformers sets them, same odd corners), so that templates written against Jinja2 parse
 * the same way. The result is an immutable AST. */
#include "tpl_internal.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_PARSE_DEPTH 200

enum {
    T_DATA,
    T_VAR_BEGIN,
    T_VAR_END,
    T_BLOCK_BEGIN,
    T_BLOCK_END,
    T_NAME,
    T_STRING,
    T_INT,
    T_FLOAT,
    T_OP,
    T_EOF
};

enum {
    P_ADD = 1,
    P_SUB,
    P_DIV,
    P_FLOORDIV,
    P_MUL,
    P_MOD,
    P_POW,
    P_TILDE,
    P_LBRACKET,
    P_RBRACKET,
    P_LPAREN,
    P_RPAREN,
    P_LBRACE,
    P_RBRACE,
    P_EQ,
    P_NE,
    P_GT,
    P_GTEQ,
    P_LT,
    P_LTEQ,
    P_ASSIGN,
    P_DOT,
    P_COLON,
    P_PIPE,
    P_COMMA,
    P_SEMICOLON,
};

static const char *const op_text[] = {
    "",  "+",  "-",  "/", "//", "*", "%",  "**", "~", "[", "]", "(", ")", "{",
    "}", "==", "!=", ">", ">=", "<", "<=", "=",  ".", ":", "|", ",", ";",
};

typedef struct {
    uint8_t type, op;
    size_t pos;
    int64_t ival;
    double fval;
    tstr *str; /* NAME (interned), STRING, DATA */
} tok;

typedef struct {
    tpl_template *t;
    const char *src;
    size_t n;
    size_t *lines; /* offsets where lines start */
    size_t nlines;
    tok *toks;
    size_t ntoks, captoks, i;
    node **nodes;
    size_t nnodes, capnodes;
    tstr **interned;
    size_t ninterned, capinterned;
    int depth, loop_depth;
    const char *tag_stack[MAX_PARSE_DEPTH + 8];
    size_t tag_pos[MAX_PARSE_DEPTH + 8];
    int ntags;
    jmp_buf jb;
    char *err;
} P;

/* ---- positions and errors ------------------------------------------------------------- */

static void pos_to_lc(const P *p, size_t pos, int *line, int *col) {
    size_t lo = 0, hi = p->nlines;
    while (hi - lo > 1) {
        size_t mid = (lo + hi) / 2;
        if (p->lines[mid] <= pos)
            lo = mid;
        else
            hi = mid;
    }
    int c = 1;
    for (size_t i = p->lines[lo]; i < pos && i < p->n;) {
        tpl_utf8_next(p->src, p->n, &i);
        c++;
    }
    *line = (int)lo + 1;
    *col = c;
}

_Noreturn static void pfail(P *p, size_t pos, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void pfail(P *p, size_t pos, const char *fmt, ...) {
    char msg[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    int line, col;
    pos_to_lc(p, pos, &line, &col);
    size_t n = strlen(msg) + 64;
    free(p->err);
    p->err = malloc(n);
    if (p->err) snprintf(p->err, n, "%d:%d: syntax error: %s", line, col, msg);
    longjmp(p->jb, 1);
}

_Noreturn static void nomem(P *p) {
    free(p->err);
    p->err = NULL; /* the caller reports "out of memory" */
    longjmp(p->jb, 2);
}

static void *pgrow(P *p, void *arr, size_t *cap, size_t need, size_t elem) {
    if (need <= *cap) return arr;
    size_t nc = *cap ? *cap * 2 : 16;
    while (nc < need) nc *= 2;
    void *q = realloc(arr, nc * elem);
    if (!q) nomem(p);
    *cap = nc;
    return q;
}

static tstr *intern(P *p, const char *s, size_t n) {
    for (size_t i = 0; i < p->ninterned; i++)
        if (p->interned[i]->len == n && !memcmp(p->interned[i]->s, s, n)) return p->interned[i];
    tstr *r = tpl_str_immortal(p->t, s, n);
    if (!r) nomem(p);
    p->interned = pgrow(p, p->interned, &p->capinterned, p->ninterned + 1, sizeof(tstr *));
    p->interned[p->ninterned++] = r;
    return r;
}

static tstr *immortal(P *p, const char *s, size_t n) {
    tstr *r = tpl_str_immortal(p->t, s, n);
    if (!r) nomem(p);
    return r;
}

/* ---- lexer ----------------------------------------------------------------------------- */

static void emit(P *p, tok t) {
    p->toks = pgrow(p, p->toks, &p->captoks, p->ntoks + 1, sizeof(tok));
    p->toks[p->ntoks++] = t;
}

static void emit_data(P *p, size_t a, size_t b) {
    if (b > a) emit(p, (tok){.type = T_DATA, .pos = a, .str = immortal(p, p->src + a, b - a)});
}

/* the end of a run of Python whitespace starting at i */
static size_t skip_ws(const P *p, size_t i) {
    while (i < p->n) {
        size_t j = i;
        if (!tpl_py_isspace(tpl_utf8_next(p->src, p->n, &j))) break;
        i = j;
    }
    return i;
}

/* text[a..b) with trailing Python whitespace removed: its new end */
static size_t rstrip_ws(const P *p, size_t a, size_t b) {
    while (b > a) {
        size_t k = b - 1;
        while (k > a && ((unsigned char)p->src[k] & 0xC0) == 0x80) k--;
        size_t j = k;
        int32_t cp = tpl_utf8_next(p->src, p->n, &j);
        if (j != b || !tpl_py_isspace(cp)) break;
        b = k;
    }
    return b;
}

/* Jinja's whitespace control of the data before a tag: '-' strips all whitespace;
 * otherwise lstrip_blocks removes the whitespace between a line start and a block tag. */
static size_t strip_before(const P *p, size_t a, size_t b, char sign, int is_var,
                           int line_starting) {
    if (sign == '-') return rstrip_ws(p, a, b);
    if (sign == '+' || is_var) return b;
    size_t l = b;
    while (l > a && p->src[l - 1] != '\n') l--;
    int has_nl = l > a;
    if (!has_nl && !line_starting) return b;
    /* jinja 3.1: whitespace_re.fullmatch(text, l_pos), i.e. only \s characters */
    for (size_t i = l; i < b;)
        if (!tpl_py_isspace(tpl_utf8_next(p->src, b, &i))) return b;
    return l;
}

static int is_digit(char ch) {
    return ch >= '0' && ch <= '9';
}

/* end of (\d+_)*\d+ at i, or i */
static size_t match_digits(const P *p, size_t i) {
    if (i >= p->n || !is_digit(p->src[i])) return i;
    size_t j = i;
    for (;;) {
        while (j < p->n && is_digit(p->src[j])) j++;
        if (j + 1 < p->n && p->src[j] == '_' && is_digit(p->src[j + 1])) {
            j++;
            continue;
        }
        return j;
    }
}

static size_t match_float(const P *p, size_t i) {
    if (i > 0 && p->src[i - 1] == '.') return i;
    size_t j = match_digits(p, i);
    if (j == i) return i;
    size_t k = j;
    int frac = 0;
    if (k < p->n && p->src[k] == '.') {
        size_t f = match_digits(p, k + 1);
        if (f > k + 1) {
            k = f;
            frac = 1;
        }
    }
    if (k < p->n && (p->src[k] == 'e' || p->src[k] == 'E')) {
        size_t m = k + 1;
        if (m < p->n && (p->src[m] == '+' || p->src[m] == '-')) m++;
        size_t e = match_digits(p, m);
        if (e > m) return e;
    }
    return frac ? k : i;
}

static int hexval(char ch) {
    if (ch >= '0' && ch <= '9') return ch - '0';
    if (ch >= 'a' && ch <= 'f') return ch - 'a' + 10;
    if (ch >= 'A' && ch <= 'F') return ch - 'A' + 10;
    return -1;
}

/* integer literal at i: its end (i when none) and value */
static size_t match_int(P *p, size_t i, int64_t *out) {
    const char *s = p->src;
    size_t n = p->n;
    if (i >= n || !is_digit(s[i])) return i;
    if (s[i] == '0' && i + 1 < n) {
        char k = (char)(s[i + 1] | 0x20);
        int base = k == 'b' ? 2 : k == 'o' ? 8 : k == 'x' ? 16 : 0;
        if (base) {
            size_t j = i + 2;
            uint64_t v = 0;
            int any = 0, over = 0;
            for (;;) {
                size_t q = j;
                if (q < n && s[q] == '_') q++;
                int d = q < n ? hexval(s[q]) : -1;
                if (d < 0 || d >= base) break;
                if (v > (UINT64_MAX - (uint64_t)d) / (uint64_t)base) over = 1;
                v = v * (uint64_t)base + (uint64_t)d;
                j = q + 1;
                any = 1;
            }
            if (any) {
                if (over || v > INT64_MAX) pfail(p, i, "integer literal too large");
                *out = (int64_t)v;
                return j;
            }
        }
    }
    size_t j = i;
    uint64_t v = 0;
    int over = 0;
    if (s[i] == '0') {
        j++;
        while (j + 1 < n && s[j] == '_' && s[j + 1] == '0') j += 2;
        while (j < n && s[j] == '0') j++; /* 0(_?0)* */
        *out = 0;
        return j;
    }
    for (;;) {
        if (j < n && is_digit(s[j])) {
            uint64_t d = (uint64_t)(s[j] - '0');
            if (v > (UINT64_MAX - d) / 10) over = 1;
            v = v * 10 + d;
            j++;
        } else if (j > i && j + 1 < n && s[j] == '_' && is_digit(s[j + 1])) {
            j++;
        } else {
            break;
        }
    }
    if (over || v > INT64_MAX) pfail(p, i, "integer literal too large");
    *out = (int64_t)v;
    return j;
}

static void put_cp(P *p, char **buf, size_t *len, size_t *cap, int32_t cp) {
    *buf = pgrow(p, *buf, cap, *len + 5, 1);
    *len += tpl_utf8_put(*buf + *len, cp);
}

/* A string literal at i (a quote): decodes Python's unicode-escape sequences. */
static size_t lex_string(P *p, size_t i, tstr **out) {
    const char *s = p->src;
    char q = s[i];
    size_t j = i + 1;
    while (j < p->n && s[j] != q) j += s[j] == '\\' ? 2 : 1;
    if (j >= p->n) pfail(p, i, "unterminated string literal");
    char *buf = NULL;
    size_t len = 0, cap = 0;
    /* buf is freed on every path: pfail inside would leak it, so errors are noted first */
    const char *bad = NULL;
    size_t badpos = 0;
    for (size_t k = i + 1; k < j && !bad;) {
        if (s[k] != '\\') {
            size_t st = k;
            int32_t cp = tpl_utf8_next(s, j, &k);
            if (cp >= 0xDC80 && cp <= 0xDCFF && k - st == 1) {
                buf = pgrow(p, buf, &cap, len + 1, 1);
                buf[len++] = s[st];
            } else {
                put_cp(p, &buf, &len, &cap, cp);
            }
            continue;
        }
        char e = s[k + 1];
        size_t at = k;
        k += 2;
        int32_t cp = -1;
        switch (e) {
        case '\n':
            continue; /* line continuation */
        case '\\':
            cp = '\\';
            break;
        case '\'':
            cp = '\'';
            break;
        case '"':
            cp = '"';
            break;
        case 'a':
            cp = 7;
            break;
        case 'b':
            cp = 8;
            break;
        case 'f':
            cp = 12;
            break;
        case 'n':
            cp = '\n';
            break;
        case 'r':
            cp = '\r';
            break;
        case 't':
            cp = '\t';
            break;
        case 'v':
            cp = 11;
            break;
        case 'x':
        case 'u':
        case 'U': {
            int nd = e == 'x' ? 2 : e == 'u' ? 4 : 8;
            int32_t v = 0;
            for (int d = 0; d < nd; d++) {
                int h = k < j ? hexval(s[k]) : -1;
                if (h < 0) {
                    bad = e == 'x'   ? "truncated \\xXX escape"
                          : e == 'u' ? "truncated \\uXXXX escape"
                                     : "truncated \\UXXXXXXXX escape";
                    badpos = at;
                    break;
                }
                v = v * 16 + h;
                k++;
            }
            if (bad) break;
            if (v > 0x10FFFF) {
                bad = "illegal Unicode character";
                badpos = at;
                break;
            }
            /* a surrogate pair written as two \u escapes is one character */
            if (v >= 0xD800 && v <= 0xDBFF && k + 5 < j && s[k] == '\\' && s[k + 1] == 'u') {
                int32_t lo = 0;
                int okp = 1;
                for (int d = 0; d < 4; d++) {
                    int h = hexval(s[k + 2 + d]);
                    if (h < 0) okp = 0;
                    lo = lo * 16 + (h < 0 ? 0 : h);
                }
                if (okp && lo >= 0xDC00 && lo <= 0xDFFF) {
                    v = 0x10000 + ((v - 0xD800) << 10) + (lo - 0xDC00);
                    k += 6;
                }
            }
            cp = v;
            break;
        }
        case 'N':
            bad = "\\N{...} escapes are not supported";
            badpos = at;
            break;
        default:
            if ((unsigned char)e >= 0x80) {
                /* jinja backslash-replaces non-ASCII before unescaping: "\\é" reads "\\xe9" */
                size_t q = at + 1;
                int32_t ncp = tpl_utf8_next(s, j, &q);
                char esc[16];
                int el = snprintf(esc, sizeof esc,
                                  ncp < 0x100     ? "\\x%02x"
                                  : ncp < 0x10000 ? "\\u%04x"
                                                  : "\\U%08x",
                                  (unsigned)ncp);
                buf = pgrow(p, buf, &cap, len + (size_t)el, 1);
                memcpy(buf + len, esc, (size_t)el);
                len += (size_t)el;
                k = q;
                continue;
            }
            if (e >= '0' && e <= '7') {
                int32_t v = e - '0';
                for (int d = 0; d < 2 && k < j && s[k] >= '0' && s[k] <= '7'; d++, k++)
                    v = v * 8 + (s[k] - '0');
                cp = v;
            } else {
                /* unknown escapes stay as written */
                buf = pgrow(p, buf, &cap, len + 1, 1);
                buf[len++] = '\\';
                k = at + 1;
                continue;
            }
        }
        if (cp >= 0) put_cp(p, &buf, &len, &cap, cp);
    }
    if (bad) {
        free(buf);
        pfail(p, badpos, "%s in string literal", bad);
    }
    tstr *r = tpl_str_immortal(p->t, buf ? buf : "", len);
    free(buf);
    if (!r) nomem(p);
    *out = r;
    return j + 1;
}

static void lex(P *p) {
    const char *s = p->src;
    size_t n = p->n, pos = 0;
    int line_starting = 1;
    while (pos < n) {
        size_t q = pos;
        char kind = 0;
        for (; q + 1 < n; q++)
            if (s[q] == '{' && (s[q + 1] == '{' || s[q + 1] == '%' || s[q + 1] == '#')) {
                kind = s[q + 1];
                break;
            }
        if (!kind) {
            emit_data(p, pos, n);
            break;
        }
        char sign = q + 2 < n && (s[q + 2] == '-' || s[q + 2] == '+') ? s[q + 2] : 0;
        size_t after = q + 2 + (sign != 0);

        /* {% raw %} (its begin tag takes no trim_blocks newline) */
        size_t raw_end = 0;
        if (kind == '%') {
            size_t k = skip_ws(p, after);
            if (k + 3 <= n && !memcmp(s + k, "raw", 3)) {
                k = skip_ws(p, k + 3);
                if (k + 3 <= n && !memcmp(s + k, "-%}", 3))
                    raw_end = skip_ws(p, k + 3);
                else if (k + 2 <= n && !memcmp(s + k, "%}", 2))
                    raw_end = k + 2;
            }
        }
        emit_data(p, pos, strip_before(p, pos, q, sign, kind == '{', line_starting));

        if (raw_end) {
            int ls = s[raw_end - 1] == '\n';
            size_t r = raw_end, e = 0;
            char esign = 0;
            for (; r + 1 < n; r++) {
                if (s[r] != '{' || s[r + 1] != '%') continue;
                size_t k = r + 2;
                char sg = k < n && (s[k] == '-' || s[k] == '+') ? s[k] : 0;
                k = skip_ws(p, k + (sg != 0));
                if (k + 6 > n || memcmp(s + k, "endraw", 6)) continue;
                k = skip_ws(p, k + 6);
                if (k + 3 <= n && !memcmp(s + k, "+%}", 3))
                    e = k + 3;
                else if (k + 3 <= n && !memcmp(s + k, "-%}", 3))
                    e = skip_ws(p, k + 3);
                else if (k + 2 <= n && !memcmp(s + k, "%}", 2))
                    e = k + 2 + (k + 2 < n && s[k + 2] == '\n');
                else
                    continue;
                esign = sg;
                break;
            }
            if (!e) pfail(p, q, "missing end of raw directive");
            emit_data(p, raw_end, strip_before(p, raw_end, r, esign, 0, ls));
            pos = e;
            line_starting = s[e - 1] == '\n';
            continue;
        }

        if (kind == '#') {
            size_t r = after;
            while (r + 1 < n && !(s[r] == '#' && s[r + 1] == '}')) r++;
            if (r + 1 >= n) pfail(p, q, "missing end of comment tag");
            char m = r > after && (s[r - 1] == '-' || s[r - 1] == '+') ? s[r - 1] : 0;
            size_t e = r + 2;
            if (m == '-')
                e = skip_ws(p, e);
            else if (!m && e < n && s[e] == '\n')
                e++;
            pos = e;
            line_starting = s[e - 1] == '\n';
            continue;
        }

        int is_var = kind == '{';
        emit(p, (tok){.type = is_var ? T_VAR_BEGIN : T_BLOCK_BEGIN, .pos = q});
        size_t i = after;
        char stack[MAX_PARSE_DEPTH];
        size_t stackpos[MAX_PARSE_DEPTH];
        int sp = 0;
        for (;;) {
            if (sp == 0) {
                size_t e = 0;
                if (is_var) {
                    if (i + 3 <= n && !memcmp(s + i, "-}}", 3))
                        e = skip_ws(p, i + 3);
                    else if (i + 2 <= n && !memcmp(s + i, "}}", 2))
                        e = i + 2;
                } else {
                    if (i + 3 <= n && !memcmp(s + i, "+%}", 3))
                        e = i + 3;
                    else if (i + 3 <= n && !memcmp(s + i, "-%}", 3))
                        e = skip_ws(p, i + 3);
                    else if (i + 2 <= n && !memcmp(s + i, "%}", 2))
                        e = i + 2 + (i + 2 < n && s[i + 2] == '\n');
                }
                if (e) {
                    emit(p, (tok){.type = is_var ? T_VAR_END : T_BLOCK_END, .pos = i});
                    pos = e;
                    line_starting = s[e - 1] == '\n';
                    break;
                }
            }
            if (i >= n) {
                if (sp) pfail(p, stackpos[sp - 1], "'%c' is never closed", s[stackpos[sp - 1]]);
                pfail(p, q, "unexpected end of template: '%.2s' is never closed by '%s'", s + q,
                      is_var ? "}}" : "%}");
            }
            size_t j = i;
            int32_t cp = tpl_utf8_next(s, n, &j);
            if (tpl_py_isspace(cp)) {
                i = skip_ws(p, i);
                continue;
            }
            size_t e = match_float(p, i);
            if (e > i) {
                char buf[128];
                size_t k = 0;
                for (size_t x = i; x < e && k < sizeof buf - 1; x++)
                    if (s[x] != '_') buf[k++] = s[x];
                buf[k] = 0;
                emit(p, (tok){.type = T_FLOAT, .pos = i, .fval = strtod(buf, NULL)});
                i = e;
                continue;
            }
            int64_t iv;
            e = match_int(p, i, &iv);
            if (e > i) {
                emit(p, (tok){.type = T_INT, .pos = i, .ival = iv});
                i = e;
                continue;
            }
            if (tpl_is_ident_start(cp)) {
                e = j;
                while (e < n) {
                    size_t x = e;
                    if (!tpl_is_ident_char(tpl_utf8_next(s, n, &x))) break;
                    e = x;
                }
                emit(p, (tok){.type = T_NAME, .pos = i, .str = intern(p, s + i, e - i)});
                i = e;
                continue;
            }
            if (cp == '\'' || cp == '"') {
                tstr *str;
                e = lex_string(p, i, &str);
                emit(p, (tok){.type = T_STRING, .pos = i, .str = str});
                i = e;
                continue;
            }
            int op = 0;
            static const int two[] = {P_FLOORDIV, P_POW, P_EQ, P_NE, P_LTEQ, P_GTEQ};
            for (size_t k = 0; k < sizeof two / sizeof *two && !op; k++)
                if (i + 2 <= n && !memcmp(s + i, op_text[two[k]], 2)) op = two[k];
            for (int k = 1; k <= P_SEMICOLON && !op; k++)
                if (op_text[k][1] == 0 && s[i] == op_text[k][0]) op = k;
            if (!op) {
                if (cp < 0x80 && cp >= 0x20) pfail(p, i, "unexpected char '%c'", (char)cp);
                pfail(p, i, "unexpected char U+%04X", (unsigned)cp);
            }
            if (op == P_LPAREN || op == P_LBRACKET || op == P_LBRACE) {
                if (sp == MAX_PARSE_DEPTH) pfail(p, i, "brackets nested too deeply");
                stackpos[sp] = i;
                stack[sp++] = op == P_LPAREN ? ')' : op == P_LBRACKET ? ']' : '}';
            } else if (op == P_RPAREN || op == P_RBRACKET || op == P_RBRACE) {
                char ch = op_text[op][0];
                if (!sp) pfail(p, i, "unexpected '%c'", ch);
                if (stack[sp - 1] != ch)
                    pfail(p, i, "unexpected '%c', expected '%c'", ch, stack[sp - 1]);
                sp--;
            }
            emit(p, (tok){.type = T_OP, .op = (uint8_t)op, .pos = i});
            i += strlen(op_text[op]);
        }
    }
    emit(p, (tok){.type = T_EOF, .pos = n});
}

/* ---- parser helpers -------------------------------------------------------------------- */

static tok *cur(P *p) {
    return &p->toks[p->i];
}
static tok *look(P *p) {
    return &p->toks[p->i + 1 < p->ntoks ? p->i + 1 : p->i];
}
static tok *advance(P *p) {
    tok *t = &p->toks[p->i];
    if (p->i + 1 < p->ntoks) p->i++;
    return t;
}
static int is_op(tok *t, int op) {
    return t->type == T_OP && t->op == op;
}
static int is_name(tok *t, const char *name) {
    return t->type == T_NAME && !strcmp(t->str->s, name);
}

static void describe(const tok *t, char *buf, size_t n) {
    switch (t->type) {
    case T_DATA:
        snprintf(buf, n, "template data / text");
        break;
    case T_VAR_BEGIN:
        snprintf(buf, n, "begin of print statement");
        break;
    case T_VAR_END:
        snprintf(buf, n, "end of print statement");
        break;
    case T_BLOCK_BEGIN:
        snprintf(buf, n, "begin of statement block");
        break;
    case T_BLOCK_END:
        snprintf(buf, n, "end of statement block");
        break;
    case T_NAME:
        snprintf(buf, n, "%.60s", t->str->s);
        break;
    case T_STRING:
        snprintf(buf, n, "string");
        break;
    case T_INT:
        snprintf(buf, n, "integer");
        break;
    case T_FLOAT:
        snprintf(buf, n, "float");
        break;
    case T_OP:
        snprintf(buf, n, "%s", op_text[t->op]);
        break;
    default:
        snprintf(buf, n, "end of template");
        break;
    }
}

_Noreturn static void unexpected(P *p, const char *expected) {
    char got[80];
    describe(cur(p), got, sizeof got);
    if (expected) pfail(p, cur(p)->pos, "expected %s, got '%s'", expected, got);
    pfail(p, cur(p)->pos, "unexpected '%s'", got);
}

static tok *expect_op(P *p, int op) {
    if (!is_op(cur(p), op)) {
        char e[16];
        snprintf(e, sizeof e, "'%s'", op_text[op]);
        unexpected(p, e);
    }
    return advance(p);
}

static tok *expect_type(P *p, int type, const char *what) {
    if (cur(p)->type != type) unexpected(p, what);
    return advance(p);
}

static node *mk(P *p, int kind, size_t pos) {
    p->nodes = pgrow(p, p->nodes, &p->capnodes, p->nnodes + 1, sizeof(node *));
    node *n = calloc(1, sizeof *n);
    if (!n) nomem(p);
    p->nodes[p->nnodes++] = n;
    n->kind = (uint8_t)kind;
    pos_to_lc(p, pos, &n->line, &n->col);
    return n;
}

typedef struct {
    node **v;
    size_t n, cap;
} nvec;

static void nv_push(P *p, nvec *v, node *x) {
    v->v = pgrow(p, v->v, &v->cap, v->n + 1, sizeof(node *));
    v->v[v->n++] = x;
}

typedef struct {
    tstr **v;
    size_t n, cap;
} svec;

static void sv_push(P *p, svec *v, tstr *x) {
    v->v = pgrow(p, v->v, &v->cap, v->n + 1, sizeof(tstr *));
    v->v[v->n++] = x;
}

/* vectors hang off their node at once so that a failing parse frees them with it */
static void attach_list(node *n, nvec *v) {
    n->list = v->v;
    n->n = v->n;
}
static void attach_list2(node *n, nvec *v) {
    n->list2 = v->v;
    n->n2 = v->n;
}
static void attach_names(node *n, svec *v) {
    n->names = v->v;
    n->nnames = v->n;
}

static void enter(P *p) {
    if (++p->depth > MAX_PARSE_DEPTH) pfail(p, cur(p)->pos, "template nested too deeply");
}
static void leave(P *p) {
    p->depth--;
}

/* ---- expressions ----------------------------------------------------------------------- */

static node *parse_expression(P *p, int with_condexpr);
static node *parse_tuple(P *p, int simplified, int with_condexpr, const char *extra_end,
                         int explicit_parens, int with_namespace);
static node *parse_unary(P *p, int with_filter);
static node *parse_primary(P *p, int with_namespace);
static node *parse_postfix(P *p, node *n);
static node *parse_filter_expr(P *p, node *n);
static node *parse_filter(P *p, node *n, int start_inline);

/* (args, kwargs, *dyn_args, **dyn_kwargs) into n->list, n->names/list2, n->c, n->d */
static void parse_call_args(P *p, node *n) {
    tok *open = expect_op(p, P_LPAREN);
    node *pending = n;
    nvec args = {0}, kwv = {0};
    svec kwn = {0};
    int require_comma = 0;
    while (!is_op(cur(p), P_RPAREN)) {
        if (require_comma) {
            expect_op(p, P_COMMA);
            if (is_op(cur(p), P_RPAREN)) break;
        }
        if (is_op(cur(p), P_MUL)) {
            if (pending->c || pending->d)
                pfail(p, open->pos, "invalid syntax for function call expression");
            advance(p);
            pending->c = parse_expression(p, 1);
        } else if (is_op(cur(p), P_POW)) {
            if (pending->d) pfail(p, open->pos, "invalid syntax for function call expression");
            advance(p);
            pending->d = parse_expression(p, 1);
        } else if (cur(p)->type == T_NAME && is_op(look(p), P_ASSIGN)) {
            if (pending->d) pfail(p, open->pos, "invalid syntax for function call expression");
            tstr *key = advance(p)->str;
            advance(p);
            node *v = parse_expression(p, 1);
            sv_push(p, &kwn, key);
            nv_push(p, &kwv, v);
            attach_names(n, &kwn);
            attach_list2(n, &kwv);
        } else {
            if (pending->c || pending->d || kwn.n)
                pfail(p, open->pos, "invalid syntax for function call expression");
            nv_push(p, &args, parse_expression(p, 1));
            attach_list(n, &args);
        }
        require_comma = 1;
    }
    expect_op(p, P_RPAREN);
    attach_list(n, &args);
    attach_names(n, &kwn);
    attach_list2(n, &kwv);
}

static node *parse_call(P *p, node *callee) {
    node *n = mk(p, E_CALL, cur(p)->pos);
    n->a = callee;
    parse_call_args(p, n);
    return n;
}

static node *parse_subscribed(P *p) {
    size_t pos = cur(p)->pos;
    node *start = NULL, *stop = NULL, *step = NULL;
    if (is_op(cur(p), P_COLON)) {
        advance(p);
    } else {
        node *x = parse_expression(p, 1);
        if (!is_op(cur(p), P_COLON)) return x;
        advance(p);
        start = x;
    }
    if (!is_op(cur(p), P_COLON) && !is_op(cur(p), P_RBRACKET) && !is_op(cur(p), P_COMMA))
        stop = parse_expression(p, 1);
    if (is_op(cur(p), P_COLON)) {
        advance(p);
        if (!is_op(cur(p), P_RBRACKET) && !is_op(cur(p), P_COMMA)) step = parse_expression(p, 1);
    }
    node *s = mk(p, E_SLICE, pos);
    s->b = start;
    s->c = stop;
    s->d = step;
    return s;
}

static node *parse_subscript(P *p, node *obj) {
    tok *t = advance(p);
    if (t->type == T_OP && t->op == P_DOT) {
        tok *a = cur(p);
        if (a->type == T_NAME) {
            advance(p);
            node *n = mk(p, E_GETATTR, t->pos);
            n->a = obj;
            n->name = a->str;
            return n;
        }
        if (a->type != T_INT) unexpected(p, "name or number");
        advance(p);
        node *k = mk(p, E_CONST, a->pos);
        k->cval = v_int(a->ival);
        node *n = mk(p, E_GETITEM, t->pos);
        n->a = obj;
        n->b = k;
        return n;
    }
    /* '[' */
    nvec args = {0};
    node *n = mk(p, E_GETITEM, t->pos);
    n->a = obj;
    node *holder = mk(p, E_TUPLE, t->pos);
    while (!is_op(cur(p), P_RBRACKET)) {
        if (args.n) expect_op(p, P_COMMA);
        nv_push(p, &args, parse_subscribed(p));
        attach_list(holder, &args);
    }
    expect_op(p, P_RBRACKET);
    attach_list(holder, &args);
    if (args.n == 0) pfail(p, t->pos, "expected subscript expression");
    if (args.n == 1) {
        node *x = args.v[0];
        if (x->kind == E_SLICE) {
            x->a = obj;
            return x;
        }
        n->b = x;
        return n;
    }
    for (size_t i = 0; i < args.n; i++)
        if (args.v[i]->kind == E_SLICE)
            pfail(p, t->pos, "slices inside a tuple index are not supported");
    n->b = holder;
    return n;
}

static node *parse_postfix(P *p, node *n) {
    for (;;) {
        if (is_op(cur(p), P_DOT) || is_op(cur(p), P_LBRACKET))
            n = parse_subscript(p, n);
        else if (is_op(cur(p), P_LPAREN))
            n = parse_call(p, n);
        else
            return n;
    }
}

static tstr *dotted_name(P *p, tok *first) {
    tstr *name = first->str;
    if (!is_op(cur(p), P_DOT)) return name;
    char buf[256];
    size_t k = (size_t)snprintf(buf, sizeof buf, "%s", name->s);
    while (is_op(cur(p), P_DOT)) {
        advance(p);
        tok *t = expect_type(p, T_NAME, "name");
        k += (size_t)snprintf(buf + k, k < sizeof buf ? sizeof buf - k : 0, ".%s", t->str->s);
        if (k >= sizeof buf) pfail(p, t->pos, "name too long");
    }
    return intern(p, buf, k);
}

static node *parse_filter(P *p, node *n, int start_inline) {
    while (is_op(cur(p), P_PIPE) || start_inline) {
        if (!start_inline) advance(p);
        tok *t = expect_type(p, T_NAME, "filter name");
        tstr *name = dotted_name(p, t);
        /* an unknown name is an error now, or when used if it sits in an `if` (see
         * check_names) */
        const builtin *b = tpl_find_filter(name->s);
        node *f = mk(p, E_FILTER, t->pos);
        f->a = n;
        f->name = name;
        f->fn = b;
        if (is_op(cur(p), P_LPAREN)) parse_call_args(p, f);
        n = f;
        start_inline = 0;
    }
    return n;
}

static node *parse_test(P *p, node *n) {
    tok *is = advance(p);
    int negated = 0;
    if (is_name(cur(p), "not")) {
        advance(p);
        negated = 1;
    }
    tok *t = expect_type(p, T_NAME, "test name");
    tstr *name = dotted_name(p, t);
    const builtin *b = tpl_find_test(name->s);
    node *x = mk(p, E_TEST, is->pos);
    x->a = n;
    x->name = name;
    x->fn = b;
    tok *c = cur(p);
    if (is_op(c, P_LPAREN)) {
        parse_call_args(p, x);
    } else if ((c->type == T_NAME || c->type == T_STRING || c->type == T_INT ||
                c->type == T_FLOAT || is_op(c, P_LPAREN) || is_op(c, P_LBRACKET) ||
                is_op(c, P_LBRACE)) &&
               !is_name(c, "else") && !is_name(c, "or") && !is_name(c, "and")) {
        if (is_name(c, "is")) pfail(p, c->pos, "you cannot chain multiple tests with 'is'");
        /* one argument without parentheses: `is divisibleby 3`, `is sameas none` */
        node *arg = parse_postfix(p, parse_primary(p, 0));
        nvec args = {0};
        nv_push(p, &args, arg);
        attach_list(x, &args);
    }
    if (negated) {
        node *nn = mk(p, E_NOT, is->pos);
        nn->a = x;
        return nn;
    }
    return x;
}

static node *parse_filter_expr(P *p, node *n) {
    for (;;) {
        if (is_op(cur(p), P_PIPE))
            n = parse_filter(p, n, 0);
        else if (is_name(cur(p), "is"))
            n = parse_test(p, n);
        else if (is_op(cur(p), P_LPAREN))
            n = parse_call(p, n);
        else
            return n;
    }
}

static node *parse_list(P *p) {
    tok *t = expect_op(p, P_LBRACKET);
    node *n = mk(p, E_LIST, t->pos);
    nvec items = {0};
    while (!is_op(cur(p), P_RBRACKET)) {
        if (items.n) expect_op(p, P_COMMA);
        if (is_op(cur(p), P_RBRACKET)) break;
        nv_push(p, &items, parse_expression(p, 1));
        attach_list(n, &items);
    }
    expect_op(p, P_RBRACKET);
    attach_list(n, &items);
    return n;
}

static node *parse_dict(P *p) {
    tok *t = expect_op(p, P_LBRACE);
    node *n = mk(p, E_DICT, t->pos);
    nvec keys = {0}, vals = {0};
    while (!is_op(cur(p), P_RBRACE)) {
        if (keys.n) expect_op(p, P_COMMA);
        if (is_op(cur(p), P_RBRACE)) break;
        nv_push(p, &keys, parse_expression(p, 1));
        attach_list(n, &keys);
        expect_op(p, P_COLON);
        nv_push(p, &vals, parse_expression(p, 1));
        attach_list2(n, &vals);
    }
    expect_op(p, P_RBRACE);
    attach_list(n, &keys);
    attach_list2(n, &vals);
    return n;
}

static node *parse_primary(P *p, int with_namespace) {
    enter(p);
    tok *t = cur(p);
    node *n;
    if (t->type == T_NAME) {
        const char *v = t->str->s;
        if (with_namespace && is_op(look(p), P_DOT)) {
            advance(p);
            advance(p);
            tok *attr = expect_type(p, T_NAME, "name");
            n = mk(p, E_NSREF, t->pos);
            n->name = t->str;
            n->a = mk(p, E_CONST, attr->pos);
            n->a->cval = v_obj(V_STR, attr->str);
        } else if (!strcmp(v, "true") || !strcmp(v, "True") || !strcmp(v, "false") ||
                   !strcmp(v, "False")) {
            n = mk(p, E_CONST, t->pos);
            n->cval = v_bool(v[0] == 't' || v[0] == 'T');
            advance(p);
        } else if (!strcmp(v, "none") || !strcmp(v, "None")) {
            n = mk(p, E_CONST, t->pos);
            n->cval = v_none();
            advance(p);
        } else {
            n = mk(p, E_NAME, t->pos);
            n->name = t->str;
            advance(p);
        }
    } else if (t->type == T_STRING) {
        advance(p);
        n = mk(p, E_CONST, t->pos);
        if (cur(p)->type != T_STRING) {
            n->cval = v_obj(V_STR, t->str);
        } else { /* adjacent literals concatenate */
            size_t len = t->str->len, cap = 0;
            char *buf = NULL;
            buf = pgrow(p, buf, &cap, len + 1, 1);
            memcpy(buf, t->str->s, len);
            while (cur(p)->type == T_STRING) {
                tstr *x = advance(p)->str;
                char *nb = realloc(buf, len + x->len + 1);
                if (!nb) {
                    free(buf);
                    nomem(p);
                }
                buf = nb;
                memcpy(buf + len, x->s, x->len);
                len += x->len;
            }
            tstr *r = tpl_str_immortal(p->t, buf, len);
            free(buf);
            if (!r) nomem(p);
            n->cval = v_obj(V_STR, r);
        }
    } else if (t->type == T_INT || t->type == T_FLOAT) {
        advance(p);
        n = mk(p, E_CONST, t->pos);
        n->cval = t->type == T_INT ? v_int(t->ival) : v_float(t->fval);
    } else if (is_op(t, P_LPAREN)) {
        advance(p);
        n = parse_tuple(p, 0, 1, NULL, 1, 0);
        expect_op(p, P_RPAREN);
    } else if (is_op(t, P_LBRACKET)) {
        n = parse_list(p);
    } else if (is_op(t, P_LBRACE)) {
        n = parse_dict(p);
    } else {
        unexpected(p, NULL);
    }
    leave(p);
    return n;
}

static node *parse_unary(P *p, int with_filter) {
    enter(p);
    tok *t = cur(p);
    node *n;
    if (is_op(t, P_SUB) || is_op(t, P_ADD)) {
        advance(p);
        n = mk(p, is_op(t, P_SUB) ? E_NEG : E_POS, t->pos);
        n->a = parse_unary(p, 0);
    } else {
        n = parse_primary(p, 0);
    }
    n = parse_postfix(p, n);
    if (with_filter) n = parse_filter_expr(p, n);
    leave(p);
    return n;
}

static node *binop(P *p, int op, size_t pos, node *l, node *r) {
    node *n = mk(p, E_BIN, pos);
    n->op = (uint8_t)op;
    n->a = l;
    n->b = r;
    return n;
}

static node *parse_pow(P *p) {
    node *l = parse_unary(p, 1);
    while (is_op(cur(p), P_POW)) {
        size_t pos = advance(p)->pos;
        l = binop(p, OP_POW, pos, l, parse_unary(p, 1));
    }
    return l;
}

static node *parse_math2(P *p) {
    node *l = parse_pow(p);
    for (;;) {
        tok *t = cur(p);
        int op = is_op(t, P_MUL)        ? OP_MUL
                 : is_op(t, P_DIV)      ? OP_DIV
                 : is_op(t, P_FLOORDIV) ? OP_FLOORDIV
                 : is_op(t, P_MOD)      ? OP_MOD
                                        : 0;
        if (!op) return l;
        advance(p);
        l = binop(p, op, t->pos, l, parse_pow(p));
    }
}

static node *parse_concat(P *p) {
    size_t pos = cur(p)->pos;
    node *first = parse_math2(p);
    if (!is_op(cur(p), P_TILDE)) return first;
    node *n = mk(p, E_CONCAT, pos);
    nvec args = {0};
    nv_push(p, &args, first);
    attach_list(n, &args);
    while (is_op(cur(p), P_TILDE)) {
        advance(p);
        nv_push(p, &args, parse_math2(p));
        attach_list(n, &args);
    }
    return n;
}

static node *parse_math1(P *p) {
    node *l = parse_concat(p);
    for (;;) {
        tok *t = cur(p);
        int op = is_op(t, P_ADD) ? OP_ADD : is_op(t, P_SUB) ? OP_SUB : 0;
        if (!op) return l;
        advance(p);
        l = binop(p, op, t->pos, l, parse_concat(p));
    }
}

static node *parse_compare(P *p) {
    size_t pos = cur(p)->pos;
    node *first = parse_math1(p);
    node *n = NULL;
    nvec operands = {0};
    uint8_t *ops = NULL;
    size_t capops = 0;
    for (;;) {
        tok *t = cur(p);
        int op = is_op(t, P_EQ)     ? CMP_EQ
                 : is_op(t, P_NE)   ? CMP_NE
                 : is_op(t, P_LT)   ? CMP_LT
                 : is_op(t, P_LTEQ) ? CMP_LE
                 : is_op(t, P_GT)   ? CMP_GT
                 : is_op(t, P_GTEQ) ? CMP_GE
                                    : 0;
        if (op) {
            advance(p);
        } else if (is_name(t, "in")) {
            advance(p);
            op = CMP_IN;
        } else if (is_name(t, "not") && is_name(look(p), "in")) {
            advance(p);
            advance(p);
            op = CMP_NOTIN;
        } else {
            break;
        }
        if (!n) {
            n = mk(p, E_CMP, pos);
            n->a = first;
        }
        ops = pgrow(p, ops, &capops, operands.n + 1, 1);
        n->ops = ops;
        ops[operands.n] = (uint8_t)op;
        nv_push(p, &operands, parse_math1(p));
        attach_list(n, &operands);
    }
    return n ? n : first;
}

static node *parse_not(P *p) {
    if (is_name(cur(p), "not")) {
        enter(p);
        size_t pos = advance(p)->pos;
        node *n = mk(p, E_NOT, pos);
        n->a = parse_not(p);
        leave(p);
        return n;
    }
    return parse_compare(p);
}

static node *parse_and(P *p) {
    node *l = parse_not(p);
    while (is_name(cur(p), "and")) {
        size_t pos = advance(p)->pos;
        node *n = mk(p, E_AND, pos);
        n->a = l;
        n->b = parse_not(p);
        l = n;
    }
    return l;
}

static node *parse_or(P *p) {
    node *l = parse_and(p);
    while (is_name(cur(p), "or")) {
        size_t pos = advance(p)->pos;
        node *n = mk(p, E_OR, pos);
        n->a = l;
        n->b = parse_and(p);
        l = n;
    }
    return l;
}

static node *parse_condexpr(P *p) {
    enter(p);
    size_t pos = cur(p)->pos;
    node *e1 = parse_or(p);
    while (is_name(cur(p), "if")) {
        advance(p);
        node *n = mk(p, E_COND, pos);
        n->b = e1;
        n->a = parse_or(p);
        if (is_name(cur(p), "else")) {
            advance(p);
            n->c = parse_condexpr(p);
        }
        e1 = n;
        pos = cur(p)->pos;
    }
    leave(p);
    return e1;
}

static node *parse_expression(P *p, int with_condexpr) {
    return with_condexpr ? parse_condexpr(p) : parse_or(p);
}

static int is_tuple_end(P *p, const char *extra_end) {
    tok *t = cur(p);
    /* jinja also passes extra end names (`in` of a for loop) but they never match there
     * (test_any gets them as one tuple), so `for a, in x` fails as it does in jinja */
    (void)extra_end;
    return t->type == T_VAR_END || t->type == T_BLOCK_END || is_op(t, P_RPAREN);
}

static node *parse_tuple(P *p, int simplified, int with_condexpr, const char *extra_end,
                         int explicit_parens, int with_namespace) {
    size_t pos = cur(p)->pos;
    nvec args = {0};
    int is_tuple = 0;
    node *holder = mk(p, E_TUPLE, pos);
    for (;;) {
        if (args.n) expect_op(p, P_COMMA);
        if (is_tuple_end(p, extra_end)) break;
        nv_push(p, &args,
                simplified ? parse_primary(p, with_namespace) : parse_expression(p, with_condexpr));
        attach_list(holder, &args);
        if (is_op(cur(p), P_COMMA))
            is_tuple = 1;
        else
            break;
    }
    attach_list(holder, &args);
    if (!is_tuple) {
        if (args.n) return args.v[0];
        if (!explicit_parens) unexpected(p, "an expression");
    }
    return holder;
}

/* ---- statements ------------------------------------------------------------------------ */

static node *subparse(P *p, const char *const *end_names);

static int can_assign(const node *n, int allow_ns) {
    if (n->kind == E_NAME) return 1;
    if (n->kind == E_NSREF) return allow_ns;
    if (n->kind == E_TUPLE) {
        for (size_t i = 0; i < n->n; i++)
            if (!can_assign(n->list[i], allow_ns)) return 0;
        return 1;
    }
    return 0;
}

static node *parse_assign_target(P *p, const char *extra_end, int with_namespace) {
    size_t pos = cur(p)->pos;
    node *t = parse_tuple(p, 1, 1, extra_end, 0, with_namespace);
    if (!can_assign(t, with_namespace)) pfail(p, pos, "can't assign to this expression");
    return t;
}

static tstr *parse_name_target(P *p) {
    tok *t = expect_type(p, T_NAME, "name");
    const char *v = t->str->s;
    if (!strcmp(v, "true") || !strcmp(v, "false") || !strcmp(v, "none") || !strcmp(v, "True") ||
        !strcmp(v, "False") || !strcmp(v, "None"))
        pfail(p, t->pos, "can't assign to '%s'", v);
    return t->str;
}

/* After the tag's own tokens: the end of the tag, the body up to one of end_names, and
 * (drop_needle) the end name itself. */
static node *parse_statements(P *p, const char *const *end_names, int drop_needle) {
    if (is_op(cur(p), P_COLON)) advance(p);
    expect_type(p, T_BLOCK_END, "end of statement block");
    node *body = subparse(p, end_names);
    if (cur(p)->type == T_EOF) {
        char want[256];
        size_t k = 0;
        want[0] = 0;
        for (const char *const *e = end_names; *e; e++)
            k += (size_t)snprintf(want + k, sizeof want - k, "%s'%s'", k ? " or " : "", *e);
        const char *tag = p->ntags ? p->tag_stack[p->ntags - 1] : "?";
        int line = 0, col = 0;
        if (p->ntags) pos_to_lc(p, p->tag_pos[p->ntags - 1], &line, &col);
        pfail(p, cur(p)->pos,
              "unexpected end of template: looking for %s to close the '%s' opened at %d:%d", want,
              tag, line, col);
    }
    if (drop_needle) advance(p);
    return body;
}

static void scan_macro_names(P *p, size_t from, node *m) {
    for (size_t i = from; i < p->nnodes; i++) {
        node *x = p->nodes[i];
        if (x->kind != E_NAME) continue;
        if (!strcmp(x->name->s, "varargs")) m->flags |= MF_VARARGS;
        if (!strcmp(x->name->s, "kwargs")) m->flags |= MF_KWARGS;
        if (!strcmp(x->name->s, "caller")) m->flags |= MF_CALLER;
    }
}

/* (a, b=default, ...) into m->names and m->list (NULL where no default) */
static void parse_signature(P *p, node *m) {
    expect_op(p, P_LPAREN);
    svec names = {0};
    nvec defs = {0};
    int seen_default = 0;
    while (!is_op(cur(p), P_RPAREN)) {
        if (names.n) expect_op(p, P_COMMA);
        size_t pos = cur(p)->pos;
        tstr *name = parse_name_target(p);
        node *d = NULL;
        if (is_op(cur(p), P_ASSIGN)) {
            advance(p);
            d = parse_expression(p, 1);
            seen_default = 1;
        } else if (seen_default) {
            pfail(p, pos, "non-default argument follows default argument");
        }
        sv_push(p, &names, name);
        nv_push(p, &defs, d);
        attach_names(m, &names);
        attach_list(m, &defs);
    }
    expect_op(p, P_RPAREN);
    attach_names(m, &names);
    attach_list(m, &defs);
}

static node *parse_for(P *p, tok *t) {
    node *n = mk(p, S_FOR, t->pos);
    n->a = parse_assign_target(p, "in", 0);
    if (!is_name(cur(p), "in")) unexpected(p, "'in'");
    advance(p);
    n->b = parse_tuple(p, 0, 0, "recursive", 0, 0);
    if (is_name(cur(p), "if")) {
        advance(p);
        n->c = parse_expression(p, 1);
    }
    if (is_name(cur(p), "recursive"))
        pfail(p, cur(p)->pos, "recursive for loops are not supported");
    static const char *const ends[] = {"endfor", "else", NULL};
    static const char *const end2[] = {"endfor", NULL};
    p->loop_depth++;
    n->d = parse_statements(p, ends, 0);
    p->loop_depth--;
    if (is_name(advance(p), "else")) n->e = parse_statements(p, end2, 1);
    return n;
}

static node *parse_if(P *p, tok *t) {
    node *n = mk(p, S_IF, t->pos);
    nvec conds = {0}, bodies = {0};
    static const char *const ends[] = {"elif", "else", "endif", NULL};
    static const char *const end2[] = {"endif", NULL};
    for (;;) {
        nv_push(p, &conds, parse_tuple(p, 0, 0, NULL, 0, 0));
        attach_list(n, &conds);
        nv_push(p, &bodies, parse_statements(p, ends, 0));
        attach_list2(n, &bodies);
        tok *e = advance(p);
        if (is_name(e, "elif")) continue;
        if (is_name(e, "else")) n->b = parse_statements(p, end2, 1);
        break;
    }
    return n;
}

static node *parse_statement(P *p) {
    tok *t = cur(p);
    if (t->type != T_NAME) unexpected(p, "tag name");
    const char *name = t->str->s;
    if (p->ntags >= MAX_PARSE_DEPTH) pfail(p, t->pos, "template nested too deeply");
    p->tag_stack[p->ntags] = name;
    p->tag_pos[p->ntags++] = t->pos;
    enter(p);
    node *n = NULL;
    if (!strcmp(name, "for")) {
        advance(p);
        n = parse_for(p, t);
    } else if (!strcmp(name, "if")) {
        advance(p);
        n = parse_if(p, t);
    } else if (!strcmp(name, "set")) {
        advance(p);
        node *target = parse_assign_target(p, NULL, 1);
        if (is_op(cur(p), P_ASSIGN)) {
            advance(p);
            n = mk(p, S_SET, t->pos);
            n->a = target;
            n->b = parse_tuple(p, 0, 1, NULL, 0, 0);
        } else {
            if (target->kind == E_TUPLE) pfail(p, t->pos, "a block assignment takes one name");
            n = mk(p, S_SETBLOCK, t->pos);
            n->a = target;
            n->c = parse_filter(p, NULL, 0);
            static const char *const ends[] = {"endset", NULL};
            n->b = parse_statements(p, ends, 1);
        }
    } else if (!strcmp(name, "macro") || !strcmp(name, "call")) {
        int is_macro = name[0] == 'm';
        advance(p);
        n = mk(p, is_macro ? S_MACRO : S_CALLBLOCK, t->pos);
        size_t from = p->nnodes;
        if (is_macro) {
            n->name = parse_name_target(p);
            parse_signature(p, n);
        } else {
            if (is_op(cur(p), P_LPAREN)) parse_signature(p, n);
            size_t pos = cur(p)->pos;
            n->a = parse_expression(p, 1);
            if (n->a->kind != E_CALL) pfail(p, pos, "expected a call");
            from = p->nnodes;
        }
        static const char *const mend[] = {"endmacro", NULL};
        static const char *const cend[] = {"endcall", NULL};
        int saved = p->loop_depth;
        p->loop_depth = 0;
        n->b = parse_statements(p, is_macro ? mend : cend, 1);
        p->loop_depth = saved;
        scan_macro_names(p, from, n);
    } else if (!strcmp(name, "filter")) {
        advance(p);
        n = mk(p, S_FILTERBLOCK, t->pos);
        n->a = parse_filter(p, NULL, 1);
        static const char *const ends[] = {"endfilter", NULL};
        n->b = parse_statements(p, ends, 1);
    } else if (!strcmp(name, "with")) {
        advance(p);
        n = mk(p, S_WITH, t->pos);
        nvec targets = {0}, values = {0};
        while (cur(p)->type != T_BLOCK_END) {
            if (targets.n) expect_op(p, P_COMMA);
            nv_push(p, &targets, parse_assign_target(p, NULL, 0));
            attach_list(n, &targets);
            expect_op(p, P_ASSIGN);
            nv_push(p, &values, parse_expression(p, 1));
            attach_list2(n, &values);
        }
        static const char *const ends[] = {"endwith", NULL};
        n->b = parse_statements(p, ends, 1);
    } else if (!strcmp(name, "print")) {
        /* {% print a, b %} prints each expression */
        advance(p);
        n = mk(p, S_LIST, t->pos);
        nvec outs = {0};
        while (cur(p)->type != T_BLOCK_END) {
            if (outs.n) expect_op(p, P_COMMA);
            node *o = mk(p, S_OUT, cur(p)->pos);
            o->a = parse_expression(p, 1);
            nv_push(p, &outs, o);
            attach_list(n, &outs);
        }
    } else if (!strcmp(name, "break") || !strcmp(name, "continue")) {
        advance(p);
        if (!p->loop_depth) pfail(p, t->pos, "'%s' outside loop", name);
        n = mk(p, name[0] == 'b' ? S_BREAK : S_CONTINUE, t->pos);
    } else if (!strcmp(name, "generation") || !strcmp(name, "block")) {
        int gen = name[0] == 'g';
        advance(p);
        n = mk(p, S_SCOPE, t->pos);
        if (!gen) {
            expect_type(p, T_NAME, "block name");
            while (is_name(cur(p), "scoped") || is_name(cur(p), "required")) advance(p);
        }
        static const char *const gend[] = {"endgeneration", NULL};
        static const char *const bend[] = {"endblock", NULL};
        n->b = parse_statements(p, gen ? gend : bend, 1);
        if (!gen && cur(p)->type == T_NAME) advance(p); /* {% endblock name %} */
    } else if (!strcmp(name, "extends") || !strcmp(name, "include") || !strcmp(name, "import") ||
               !strcmp(name, "from")) {
        pfail(p, t->pos, "'%s' is not supported: a chat template cannot load other templates",
              name);
    } else {
        if (p->ntags > 1) {
            p->ntags--;
            pfail(p, t->pos,
                  "encountered unknown tag '%s' (the innermost block that needs to be closed is "
                  "'%s')",
                  name, p->tag_stack[p->ntags - 1]);
        }
        pfail(p, t->pos, "encountered unknown tag '%s'", name);
    }
    leave(p);
    p->ntags--;
    return n;
}

static node *subparse(P *p, const char *const *end_names) {
    node *body = mk(p, S_LIST, cur(p)->pos);
    nvec stmts = {0};
    for (;;) {
        tok *t = cur(p);
        if (t->type == T_EOF) break;
        if (t->type == T_DATA) {
            node *d = mk(p, S_DATA, t->pos);
            d->cval = v_obj(V_STR, t->str);
            advance(p);
            nv_push(p, &stmts, d);
        } else if (t->type == T_VAR_BEGIN) {
            advance(p);
            node *o = mk(p, S_OUT, t->pos);
            o->a = parse_tuple(p, 0, 1, NULL, 0, 0);
            expect_type(p, T_VAR_END, "end of print statement");
            nv_push(p, &stmts, o);
        } else if (t->type == T_BLOCK_BEGIN) {
            advance(p);
            if (end_names && cur(p)->type == T_NAME)
                for (const char *const *e = end_names; *e; e++)
                    if (is_name(cur(p), *e)) {
                        attach_list(body, &stmts);
                        return body;
                    }
            nv_push(p, &stmts, parse_statement(p));
            attach_list(body, &stmts);
            expect_type(p, T_BLOCK_END, "end of statement block");
        } else {
            unexpected(p, NULL);
        }
        attach_list(body, &stmts);
    }
    attach_list(body, &stmts);
    return body;
}

/* ---- compile / free -------------------------------------------------------------------- */

void tpl_node_free(node *n) {
    if (!n) return;
    free(n->list);
    free(n->list2);
    free(n->names);
    free(n->ops);
    free(n);
}

static void free_template(tpl_template *t, node **nodes, size_t nnodes) {
    for (size_t i = 0; i < nnodes; i++) tpl_node_free(nodes[i]);
    free(nodes);
    for (size_t i = 0; i < t->nowned; i++) {
        tstr *s = (tstr *)t->owned[i];
        free(s->s);
        free(s);
    }
    free(t->owned);
    free(t->src);
    free(t);
}

/* nodes of a compiled template, kept for freeing */
typedef struct {
    tpl_template t;
    node **nodes;
    size_t nnodes;
} tpl_full;

/* Jinja reports an unknown filter or test when it compiles the template, except inside an
 * `if` statement or an inline if-expression ("soft" frames), where only using it is an error:
 * a template may guard a filter that some environments lack. The same walk as its compiler,
 * without recursion (expression chains can be long). */
typedef struct {
    node *n;
    int soft;
} walk_item;

static void check_names(P *p, node *root) {
    size_t cap = 64, top = 0;
    walk_item *st = malloc(cap * sizeof *st);
    if (!st) nomem(p);
    st[top++] = (walk_item){root, 0};
    while (top) {
        walk_item w = st[--top];
        node *n = w.n;
        if ((n->kind == E_FILTER || n->kind == E_TEST) && !n->fn && !w.soft) {
            char msg[300];
            snprintf(msg, sizeof msg, "no %s named '%s'", n->kind == E_FILTER ? "filter" : "test",
                     n->name->s);
            free(st);
            free(p->err);
            size_t len = strlen(msg) + 64;
            p->err = malloc(len);
            if (p->err) snprintf(p->err, len, "%d:%d: syntax error: %s", n->line, n->col, msg);
            longjmp(p->jb, 1);
        }
        /* children with the softness they are compiled in */
        node *kids[5] = {n->a, n->b, n->c, n->d, n->e};
        int soft[5] = {w.soft, w.soft, w.soft, w.soft, w.soft};
        int lists_soft = w.soft;
        switch (n->kind) {
        case S_IF:
        case E_COND:
            for (int i = 0; i < 5; i++) soft[i] = 1;
            lists_soft = 1;
            break;
        case S_FOR: /* the iterable in the outer frame; the rest in the loop's */
            soft[0] = soft[2] = soft[3] = soft[4] = 0;
            break;
        case S_MACRO:
        case S_SETBLOCK:
        case S_FILTERBLOCK:
        case S_SCOPE:
            for (int i = 0; i < 5; i++) soft[i] = 0;
            lists_soft = 0;
            break;
        case S_CALLBLOCK: /* the call in the outer frame, the body and defaults in the macro's */
            soft[1] = 0;
            lists_soft = 0;
            break;
        case S_WITH:
            soft[1] = 0;
            break;
        default:
            break;
        }
        size_t need = top + 5 + n->n + n->n2;
        if (need > cap) {
            while (cap < need) cap *= 2;
            walk_item *ns = realloc(st, cap * sizeof *st);
            if (!ns) {
                free(st);
                nomem(p);
            }
            st = ns;
        }
        for (int i = 0; i < 5; i++)
            if (kids[i]) st[top++] = (walk_item){kids[i], soft[i]};
        for (size_t i = 0; i < n->n; i++)
            if (n->list[i]) st[top++] = (walk_item){n->list[i], lists_soft};
        for (size_t i = 0; i < n->n2; i++)
            if (n->list2[i]) st[top++] = (walk_item){n->list2[i], lists_soft};
    }
    free(st);
}

/* lexes and parses p->src into p->t->root; 0, or 1 (syntax error) or 2 (out of memory) */
static int parse_all(P *p) {
    int rc = setjmp(p->jb);
    if (rc) return rc;
    size_t cap = 0;
    p->lines = pgrow(p, NULL, &cap, 16, sizeof(size_t));
    p->lines[p->nlines++] = 0;
    for (size_t i = 0; i < p->n; i++)
        if (p->src[i] == '\n') {
            p->lines = pgrow(p, p->lines, &cap, p->nlines + 1, sizeof(size_t));
            p->lines[p->nlines++] = i + 1;
        }
    lex(p);
    p->t->root = subparse(p, NULL);
    if (cur(p)->type != T_EOF) unexpected(p, NULL);
    check_names(p, p->t->root);
    return 0;
}

tpl_template *tpl_compile(const char *src, size_t len, char **err) {
    if (err) *err = NULL;
    tpl_full *full = calloc(1, sizeof *full);
    P *p = calloc(1, sizeof *p);
    char *norm = malloc(len + 1);
    if (!full || !p || !norm) {
        free(full);
        free(p);
        free(norm);
        if (err) *err = strdup("out of memory");
        return NULL;
    }
    /* Jinja reads \r\n and \r as \n and drops one trailing newline */
    size_t n = 0;
    for (size_t i = 0; i < len; i++) {
        if (src[i] == '\r') {
            norm[n++] = '\n';
            if (i + 1 < len && src[i + 1] == '\n') i++;
        } else {
            norm[n++] = src[i];
        }
    }
    if (n && norm[n - 1] == '\n') n--;
    norm[n] = 0;
    tpl_template *t = &full->t;
    t->src = norm;
    p->t = t;
    p->src = norm;
    p->n = n;
    int rc = parse_all(p);
    if (rc) {
        if (err)
            *err = p->err ? p->err : strdup("out of memory");
        else
            free(p->err);
        free_template(t, p->nodes, p->nnodes);
        t = NULL;
    } else {
        full->nodes = p->nodes;
        full->nnodes = p->nnodes;
        free(p->err);
    }
    free(p->lines);
    free(p->toks);
    free(p->interned);
    free(p);
    return t;
}

void tpl_free(tpl_template *t) {
    if (!t) return;
    tpl_full *full = (tpl_full *)t;
    free_template(t, full->nodes, full->nnodes);
}
