/* Builtins: Jinja's filters and tests, the methods of str/dict/list that the sandbox lets a
 * template call, and the globals (range, dict, namespace, joiner, cycler, and transformers'
 * raise_exception and strftime_now). Each follows the Python function it stands for,
 * including its corner cases, since chat templates were written against those. */
#include "tpl_internal.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define BUILTIN(name) static val name(tctx *c, const node *at, val self, const targs *a)
#define UNUSED_ARGS   (void)self, (void)a

val tpl_str_format(tctx *c, const node *at, tstr *fmt, const targs *a);

static int is_int(val v) {
    return v.t == V_INT || v.t == V_BOOL;
}
static int is_num(val v) {
    return v.t == V_INT || v.t == V_BOOL || v.t == V_FLOAT;
}

static tstr *need_str(tctx *c, const node *at, val v, const char *what) {
    if (v.t == V_UNDEF) tpl_fail_undef(c, at, v);
    if (v.t != V_STR)
        tpl_fail(c, at, TPL_ERR_RUNTIME, "%s must be str, not %s", what, tpl_type_name(v));
    return VSTR(v);
}

static int64_t need_int(tctx *c, const node *at, val v, const char *what) {
    if (v.t == V_UNDEF) tpl_fail_undef(c, at, v);
    if (!is_int(v))
        tpl_fail(c, at, TPL_ERR_RUNTIME, "%s must be an integer, not %s", what, tpl_type_name(v));
    return v.u.i;
}

/* code point decoding of a whole string; the arrays live in the render's memory */
typedef struct {
    int32_t *cp;
    size_t *off; /* byte offset of each code point, plus the end */
    size_t n;
    tlist *h1, *h2;
} cps;

static cps decode(tctx *c, const node *at, tstr *s) {
    size_t n = (size_t)tpl_str_ncp(s);
    cps r = {.n = n};
    /* raw arrays in lists' storage: the lists stay empty, so nothing there is released */
    r.h1 = tpl_list_new(c, at, n + 1);
    r.h2 = tpl_list_new(c, at, n + 1);
    r.cp = (int32_t *)(void *)r.h1->v;
    r.off = (size_t *)(void *)r.h2->v;
    size_t i = 0, k = 0;
    while (i < s->len) {
        r.off[k] = i;
        r.cp[k] = tpl_utf8_next(s->s, s->len, &i);
        k++;
    }
    r.off[k] = s->len;
    tpl_step(c, at, s->len / 32);
    return r;
}

static void cps_free(tctx *c, cps *d) {
    tpl_release(c, v_obj(V_LIST, d->h1));
    tpl_release(c, v_obj(V_LIST, d->h2));
}

/* ---- strings --------------------------------------------------------------------------- */

static int in_chars(const cps *set, int32_t cp) {
    for (size_t i = 0; i < set->n; i++)
        if (set->cp[i] == cp) return 1;
    return 0;
}

/* which: 1 left, 2 right, 3 both; chars: none for whitespace, else a str */
static val do_strip(tctx *c, const node *at, tstr *s, val chars, int which) {
    cps set = {0};
    int ws = chars.t == V_NONE || !given(chars);
    if (!ws) {
        if (chars.t != V_STR) tpl_fail(c, at, TPL_ERR_RUNTIME, "strip arg must be None or str");
        set = decode(c, at, VSTR(chars));
    }
    size_t a = 0, b = s->len;
    if (which & 1) {
        while (a < b) {
            size_t j = a;
            int32_t cp = tpl_utf8_next(s->s, s->len, &j);
            if (ws ? !tpl_py_isspace(cp) : !in_chars(&set, cp)) break;
            a = j;
        }
    }
    if (which & 2) {
        while (b > a) {
            size_t k = b - 1;
            while (k > a && ((unsigned char)s->s[k] & 0xC0) == 0x80) k--;
            size_t j = k;
            int32_t cp = tpl_utf8_next(s->s, s->len, &j);
            if (j != b) { /* an invalid byte sequence: step one byte */
                k = b - 1;
                j = k;
                cp = tpl_utf8_next(s->s, s->len, &j);
            }
            if (ws ? !tpl_py_isspace(cp) : !in_chars(&set, cp)) break;
            b = k;
        }
    }
    if (!ws) cps_free(c, &set);
    tpl_step(c, at, (a + (s->len - b)) * (ws ? 1 : set.n + 1) / 4);
    return tpl_str_val(c, at, s->s + a, b - a);
}

static val case_str(tctx *c, const node *at, tstr *s, int mode) {
    tstr *r = tpl_str_new(c, at, s->len);
    if (mode == CASE_LOWER) {
        tpl_lower_str(c, at, r, s->s, s->len);
    } else {
        for (size_t i = 0; i < s->len;) {
            if ((unsigned char)s->s[i] < 0x80) { /* a run of ASCII in one go */
                char buf[256];
                size_t k = 0;
                while (i < s->len && k < sizeof buf && (unsigned char)s->s[i] < 0x80) {
                    char ch = s->s[i++];
                    buf[k++] = (char)(ch >= 'a' && ch <= 'z' ? ch - 32 : ch);
                }
                tpl_str_add(c, at, r, buf, k);
                continue;
            }
            tpl_case_map(c, at, r, tpl_utf8_next(s->s, s->len, &i), mode);
        }
    }
    return v_obj(V_STR, r);
}

/* Python's str.capitalize(): first character title-cased, the rest lowered */
static val capitalize_str(tctx *c, const node *at, tstr *s) {
    tstr *r = tpl_str_new(c, at, s->len);
    size_t i = 0;
    if (s->len) tpl_case_map(c, at, r, tpl_utf8_next(s->s, s->len, &i), CASE_TITLE);
    tpl_lower_range(c, at, r, s->s, s->len, i, s->len);
    return v_obj(V_STR, r);
}

/* Python's str.title() */
static val title_str(tctx *c, const node *at, tstr *s) {
    tstr *r = tpl_str_new(c, at, s->len);
    int prev_cased = 0;
    for (size_t i = 0; i < s->len;) {
        size_t st = i;
        int32_t cp = tpl_utf8_next(s->s, s->len, &i);
        if (prev_cased)
            tpl_lower_range(c, at, r, s->s, s->len, st, i);
        else
            tpl_case_map(c, at, r, cp, CASE_TITLE);
        prev_cased = tpl_is_cased(cp);
    }
    return v_obj(V_STR, r);
}

static int is_word_begin_sep(int32_t cp) {
    return cp == '-' || cp == '(' || cp == '{' || cp == '[' || cp == '<' || tpl_py_isspace(cp);
}

/* Jinja's title filter: each chunk after [-\s({\[<]+ gets its first character upper-cased
 * and the rest lowered. */
static val jinja_title(tctx *c, const node *at, tstr *s) {
    tstr *r = tpl_str_new(c, at, s->len);
    for (size_t i = 0; i < s->len;) {
        size_t st = i;
        int32_t cp = tpl_utf8_next(s->s, s->len, &i);
        if (is_word_begin_sep(cp)) {
            tpl_str_add(c, at, r, s->s + st, i - st);
            continue;
        }
        /* item[0].upper() + item[1:].lower(): the rest is lowered as a string of its own */
        size_t e = i;
        while (e < s->len) {
            size_t k = e;
            if (is_word_begin_sep(tpl_utf8_next(s->s, s->len, &k))) break;
            e = k;
        }
        tpl_case_map(c, at, r, cp, CASE_UPPER);
        tpl_lower_str(c, at, r, s->s + i, e - i);
        i = e;
    }
    return v_obj(V_STR, r);
}

/* byte offset -> code point index */
static int64_t cp_index(tstr *s, size_t off) {
    if (tpl_str_ncp(s) == (int64_t)s->len) return (int64_t)(off < s->len ? off : s->len);
    int64_t k = 0;
    for (size_t i = 0; i < off && i < s->len;) {
        tpl_utf8_next(s->s, s->len, &i);
        k++;
    }
    return k;
}

/* code point index (Python-adjusted start/end) -> byte offset */
static size_t byte_off(tstr *s, int64_t idx) {
    int64_t n = tpl_str_ncp(s);
    if (idx >= n) return s->len;
    if (n == (int64_t)s->len) return idx < 0 ? 0 : (size_t)idx;
    size_t i = 0;
    for (int64_t k = 0; k < idx && i < s->len; k++) tpl_utf8_next(s->s, s->len, &i);
    return i;
}

/* optional start/end arguments of find/count/startswith as a byte range */
static void sub_range(tctx *c, const node *at, tstr *s, val vs, val ve, size_t *a, size_t *b) {
    int64_t n = tpl_str_ncp(s), st = 0, en = n;
    tpl_step(c, at, s->len / 16);
    if (given(vs) && vs.t != V_NONE) st = need_int(c, at, vs, "start");
    if (given(ve) && ve.t != V_NONE) en = need_int(c, at, ve, "end");
    if (st < 0) st = st + n < 0 ? 0 : st + n;
    if (en < 0) en = en + n < 0 ? 0 : en + n;
    if (st > n) st = n + 1; /* empty, and an empty needle is not found either */
    if (en > n) en = n;
    *a = st > n ? s->len + 1 : byte_off(s, st);
    *b = byte_off(s, en);
}

static const char *find_bytes(const char *h, size_t hn, const char *nd, size_t nn) {
    if (nn == 0) return h;
    if (nn > hn) return NULL;
    return memmem(h, hn, nd, nn);
}

/* the last occurrence; charged per position tried, as it is quadratic at worst */
static const char *rfind_bytes(tctx *c, const node *at, const char *h, size_t hn, const char *nd,
                               size_t nn) {
    if (nn > hn) return NULL;
    uint64_t cost = 0;
    for (size_t i = hn - nn + 1; i-- > 0;) {
        if (!memcmp(h + i, nd, nn)) break;
        cost += 1 + nn / 16;
        if (cost >= 4096) {
            tpl_step(c, at, cost / 8);
            cost = 0;
        }
        if (i == 0) return NULL;
    }
    for (size_t i = hn - nn + 1; i-- > 0;)
        if (!memcmp(h + i, nd, nn)) return h + i;
    return NULL;
}

static val str_find(tctx *c, const node *at, tstr *s, const targs *a, int rev, int raise) {
    val x[3];
    tpl_bind(c, at, rev ? "rfind" : "find", a, "sub,start=,end=", x, 3);
    tstr *sub = need_str(c, at, x[0], "substring");
    size_t lo, hi;
    sub_range(c, at, s, x[1], x[2], &lo, &hi);
    tpl_step(c, at, s->len / 64);
    const char *f = NULL;
    if (lo <= s->len && hi >= lo)
        f = rev ? rfind_bytes(c, at, s->s + lo, hi - lo, sub->s, sub->len)
                : find_bytes(s->s + lo, hi - lo, sub->s, sub->len);
    if (!f) {
        if (raise) tpl_fail(c, at, TPL_ERR_RUNTIME, "substring not found");
        return v_int(-1);
    }
    return v_int(cp_index(s, (size_t)(f - s->s)));
}

static int64_t count_sub(tctx *c, const node *at, tstr *s, size_t lo, size_t hi, tstr *sub) {
    if (lo > s->len || hi < lo) return 0;
    if (!sub->len) return cp_index(s, hi) - cp_index(s, lo) + 1;
    int64_t k = 0;
    const char *p = s->s + lo, *e = s->s + hi;
    for (;;) {
        const char *f = find_bytes(p, (size_t)(e - p), sub->s, sub->len);
        if (!f) return k;
        k++;
        tpl_step(c, at, 1);
        p = f + sub->len;
    }
}

static val str_replace(tctx *c, const node *at, tstr *s, tstr *old, tstr *new, int64_t count) {
    tstr *r = tpl_str_new(c, at, s->len);
    if (count < 0) count = INT64_MAX;
    if (!old->len) { /* inserts `new` around every character, as Python does */
        size_t i = 0;
        int64_t k = 0;
        if (k < count) {
            tpl_str_add(c, at, r, new->s, new->len);
            k++;
        }
        while (i < s->len) {
            size_t st = i;
            tpl_utf8_next(s->s, s->len, &i);
            tpl_str_add(c, at, r, s->s + st, i - st);
            if (k < count) {
                tpl_str_add(c, at, r, new->s, new->len);
                k++;
            }
        }
        return v_obj(V_STR, r);
    }
    const char *p = s->s, *e = s->s + s->len;
    int64_t k = 0;
    while (k < count) {
        const char *f = find_bytes(p, (size_t)(e - p), old->s, old->len);
        if (!f) break;
        tpl_str_add(c, at, r, p, (size_t)(f - p));
        tpl_str_add(c, at, r, new->s, new->len);
        p = f + old->len;
        k++;
        tpl_step(c, at, 1);
    }
    tpl_str_add(c, at, r, p, (size_t)(e - p));
    tpl_step(c, at, s->len / 64);
    return v_obj(V_STR, r);
}

/* Python's str.split / rsplit */
static val str_split(tctx *c, const node *at, tstr *s, val sepv, int64_t maxsplit, int rev) {
    tlist *out = tpl_list_new(c, at, 4);
    val r = v_obj(V_LIST, out);
    if (maxsplit < 0) maxsplit = INT64_MAX;
    tpl_step(c, at, s->len / 32);
    if (sepv.t == V_NONE || !given(sepv)) {
        cps d = decode(c, at, s);
        size_t nparts = 0;
        if (!rev) {
            size_t i = 0;
            while (i < d.n) {
                while (i < d.n && tpl_py_isspace(d.cp[i])) i++;
                if (i == d.n) break;
                if ((int64_t)nparts == maxsplit) {
                    size_t e = d.n;
                    tpl_list_push(c, at, out,
                                  tpl_str_val(c, at, s->s + d.off[i], d.off[e] - d.off[i]));
                    break;
                }
                size_t j = i;
                while (j < d.n && !tpl_py_isspace(d.cp[j])) j++;
                tpl_list_push(c, at, out, tpl_str_val(c, at, s->s + d.off[i], d.off[j] - d.off[i]));
                nparts++;
                i = j;
            }
        } else {
            size_t i = d.n;
            while (i > 0) {
                while (i > 0 && tpl_py_isspace(d.cp[i - 1])) i--;
                if (i == 0) break;
                if ((int64_t)nparts == maxsplit) {
                    tpl_list_push(c, at, out, tpl_str_val(c, at, s->s, d.off[i]));
                    break;
                }
                size_t j = i;
                while (j > 0 && !tpl_py_isspace(d.cp[j - 1])) j--;
                tpl_list_push(c, at, out, tpl_str_val(c, at, s->s + d.off[j], d.off[i] - d.off[j]));
                nparts++;
                i = j;
            }
        }
        cps_free(c, &d);
    } else {
        tstr *sep = need_str(c, at, sepv, "separator");
        if (!sep->len) tpl_fail(c, at, TPL_ERR_RUNTIME, "empty separator");
        if (!rev) {
            const char *p = s->s, *e = s->s + s->len;
            int64_t k = 0;
            for (;;) {
                const char *f =
                    k < maxsplit ? find_bytes(p, (size_t)(e - p), sep->s, sep->len) : NULL;
                if (!f) {
                    tpl_list_push(c, at, out, tpl_str_val(c, at, p, (size_t)(e - p)));
                    break;
                }
                tpl_list_push(c, at, out, tpl_str_val(c, at, p, (size_t)(f - p)));
                p = f + sep->len;
                k++;
            }
        } else {
            const char *b = s->s, *e = s->s + s->len;
            int64_t k = 0;
            for (;;) {
                const char *f =
                    k < maxsplit ? rfind_bytes(c, at, b, (size_t)(e - b), sep->s, sep->len) : NULL;
                if (!f) {
                    tpl_list_push(c, at, out, tpl_str_val(c, at, b, (size_t)(e - b)));
                    break;
                }
                tpl_list_push(c, at, out,
                              tpl_str_val(c, at, f + sep->len, (size_t)(e - f - sep->len)));
                e = f;
                k++;
            }
        }
    }
    if (rev) { /* collected right to left */
        for (size_t i = 0, j = out->n ? out->n - 1 : 0; i < j; i++, j--) {
            val t = out->v[i];
            out->v[i] = out->v[j];
            out->v[j] = t;
        }
    }
    return r;
}

static int is_linebreak(int32_t cp) {
    return cp == '\n' || cp == '\r' || cp == 0x0B || cp == 0x0C || cp == 0x1C || cp == 0x1D ||
           cp == 0x1E || cp == 0x85 || cp == 0x2028 || cp == 0x2029;
}

static tlist *splitlines(tctx *c, const node *at, tstr *s, int keepends) {
    tpl_step(c, at, s->len / 8);
    tlist *out = tpl_list_new(c, at, 4);
    size_t i = 0, start = 0;
    while (i < s->len) {
        size_t st = i;
        int32_t cp = tpl_utf8_next(s->s, s->len, &i);
        if (!is_linebreak(cp)) continue;
        size_t eol = i;
        if (cp == '\r' && i < s->len && s->s[i] == '\n') eol = ++i;
        tpl_list_push(c, at, out, tpl_str_val(c, at, s->s + start, (keepends ? eol : st) - start));
        start = i;
    }
    if (start < s->len) tpl_list_push(c, at, out, tpl_str_val(c, at, s->s + start, s->len - start));
    tpl_step(c, at, s->len / 32);
    return out;
}

static val pad_str(tctx *c, const node *at, tstr *s, int64_t width, val fillv, char align) {
    int32_t fill = ' ';
    if (given(fillv)) {
        tstr *f = need_str(c, at, fillv, "fill character");
        if (tpl_str_ncp(f) != 1)
            tpl_fail(c, at, TPL_ERR_RUNTIME,
                     "The fill character must be exactly one character long");
        size_t i = 0;
        fill = tpl_utf8_next(f->s, f->len, &i);
    }
    int64_t n = tpl_str_ncp(s);
    if (width > (int64_t)c->max_output)
        tpl_fail(c, at, TPL_ERR_LIMIT, "output size limit exceeded (%zu bytes)", c->max_output);
    int64_t marg = width > n ? width - n : 0;
    int64_t left = align == '>' ? marg : align == '^' ? marg / 2 + (marg & width & 1) : 0;
    tstr *r = tpl_str_new(c, at, s->len + (size_t)marg);
    for (int64_t i = 0; i < left; i++) tpl_str_add_cp(c, at, r, fill);
    tpl_str_add(c, at, r, s->s, s->len);
    for (int64_t i = 0; i < marg - left; i++) tpl_str_add_cp(c, at, r, fill);
    return v_obj(V_STR, r);
}

static int prefix_match(tctx *c, const node *at, tstr *s, val pv, size_t lo, size_t hi, int end) {
    if (pv.t == V_LIST && IS_TUPLE(VLIST(pv))) {
        for (size_t i = 0; i < VLIST(pv)->n; i++)
            if (prefix_match(c, at, s, VLIST(pv)->v[i], lo, hi, end)) return 1;
        return 0;
    }
    if (pv.t != V_STR)
        tpl_fail(c, at, TPL_ERR_RUNTIME, "%s first arg must be str or a tuple of str, not %s",
                 end ? "endswith" : "startswith", tpl_type_name(pv));
    tstr *p = VSTR(pv);
    if (lo > s->len || hi < lo || p->len > hi - lo) return 0;
    return !memcmp(end ? s->s + hi - p->len : s->s + lo, p->s, p->len);
}

/* str.isX(): every code point passes and there is at least one */
static val str_all(tctx *c, const node *at, tstr *s, int (*pred)(int32_t)) {
    tpl_step(c, at, s->len / 8);
    if (!s->len) return v_bool(0);
    for (size_t i = 0; i < s->len;)
        if (!pred(tpl_utf8_next(s->s, s->len, &i))) return v_bool(0);
    return v_bool(1);
}

static int str_islower(tstr *s) {
    int cased = 0;
    for (size_t i = 0; i < s->len;) {
        int32_t cp = tpl_utf8_next(s->s, s->len, &i);
        if (tpl_is_upper(cp) || (tpl_is_cased(cp) && !tpl_is_lower(cp))) return 0;
        if (tpl_is_lower(cp)) cased = 1;
    }
    return cased;
}

static int str_isupper(tstr *s) {
    int cased = 0;
    for (size_t i = 0; i < s->len;) {
        int32_t cp = tpl_utf8_next(s->s, s->len, &i);
        if (tpl_is_lower(cp) || (tpl_is_cased(cp) && !tpl_is_upper(cp))) return 0;
        if (tpl_is_upper(cp)) cased = 1;
    }
    return cased;
}

static int str_istitle(tstr *s) {
    int cased = 0, prev = 0;
    for (size_t i = 0; i < s->len;) {
        int32_t cp = tpl_utf8_next(s->s, s->len, &i);
        if (tpl_is_upper(cp) || (tpl_is_cased(cp) && !tpl_is_lower(cp))) {
            if (prev) return 0;
            prev = cased = 1;
        } else if (tpl_is_lower(cp)) {
            if (!prev) return 0;
            prev = cased = 1;
        } else {
            prev = 0;
        }
    }
    return cased;
}

static val join_strs(tctx *c, const node *at, tstr *sep, tlist *items, int strict) {
    tstr *r = tpl_str_new(c, at, 64);
    for (size_t i = 0; i < items->n; i++) {
        if (i) tpl_str_add(c, at, r, sep->s, sep->len);
        val v = items->v[i];
        if (strict && v.t != V_STR)
            tpl_fail(c, at, TPL_ERR_RUNTIME, "sequence item %zu: expected str instance, %s found",
                     i, tpl_type_name(v));
        tpl_to_str(c, at, r, v);
    }
    tpl_step(c, at, items->n / 4);
    return v_obj(V_STR, r);
}

/* ---- str methods ----------------------------------------------------------------------- */

#define STR_SELF tstr *s = VSTR(self)

BUILTIN(m_upper) {
    STR_SELF;
    tpl_bind(c, at, "upper", a, "", NULL, 0);
    return case_str(c, at, s, CASE_UPPER);
}
BUILTIN(m_lower) {
    STR_SELF;
    tpl_bind(c, at, "lower", a, "", NULL, 0);
    return case_str(c, at, s, CASE_LOWER);
}
BUILTIN(m_title) {
    STR_SELF;
    tpl_bind(c, at, "title", a, "", NULL, 0);
    return title_str(c, at, s);
}
BUILTIN(m_capitalize) {
    STR_SELF;
    tpl_bind(c, at, "capitalize", a, "", NULL, 0);
    return capitalize_str(c, at, s);
}
BUILTIN(m_swapcase) {
    STR_SELF;
    tpl_bind(c, at, "swapcase", a, "", NULL, 0);
    tstr *r = tpl_str_new(c, at, s->len);
    for (size_t i = 0; i < s->len;) {
        int32_t cp = tpl_utf8_next(s->s, s->len, &i);
        if (tpl_is_upper(cp))
            tpl_case_map(c, at, r, cp, CASE_LOWER);
        else if (tpl_is_lower(cp))
            tpl_case_map(c, at, r, cp, CASE_UPPER);
        else
            tpl_str_add_cp(c, at, r, cp);
    }
    return v_obj(V_STR, r);
}
BUILTIN(m_strip) {
    STR_SELF;
    val x[1];
    tpl_bind(c, at, "strip", a, "chars=", x, 1);
    return do_strip(c, at, s, x[0], 3);
}
BUILTIN(m_lstrip) {
    STR_SELF;
    val x[1];
    tpl_bind(c, at, "lstrip", a, "chars=", x, 1);
    return do_strip(c, at, s, x[0], 1);
}
BUILTIN(m_rstrip) {
    STR_SELF;
    val x[1];
    tpl_bind(c, at, "rstrip", a, "chars=", x, 1);
    return do_strip(c, at, s, x[0], 2);
}
BUILTIN(m_split) {
    STR_SELF;
    val x[2];
    tpl_bind(c, at, "split", a, "sep=,maxsplit=", x, 2);
    int64_t ms = given(x[1]) ? need_int(c, at, x[1], "maxsplit") : -1;
    return str_split(c, at, s, x[0], ms, 0);
}
BUILTIN(m_rsplit) {
    STR_SELF;
    val x[2];
    tpl_bind(c, at, "rsplit", a, "sep=,maxsplit=", x, 2);
    int64_t ms = given(x[1]) ? need_int(c, at, x[1], "maxsplit") : -1;
    return str_split(c, at, s, x[0], ms, 1);
}
BUILTIN(m_splitlines) {
    STR_SELF;
    val x[1];
    tpl_bind(c, at, "splitlines", a, "keepends=", x, 1);
    return v_obj(V_LIST, splitlines(c, at, s, given(x[0]) && tpl_truthy(x[0])));
}
BUILTIN(m_startswith) {
    STR_SELF;
    val x[3];
    tpl_bind(c, at, "startswith", a, "prefix,start=,end=", x, 3);
    size_t lo, hi;
    sub_range(c, at, s, x[1], x[2], &lo, &hi);
    return v_bool(prefix_match(c, at, s, x[0], lo, hi, 0));
}
BUILTIN(m_endswith) {
    STR_SELF;
    val x[3];
    tpl_bind(c, at, "endswith", a, "suffix,start=,end=", x, 3);
    size_t lo, hi;
    sub_range(c, at, s, x[1], x[2], &lo, &hi);
    return v_bool(prefix_match(c, at, s, x[0], lo, hi, 1));
}
BUILTIN(m_find) {
    return str_find(c, at, VSTR(self), a, 0, 0);
}
BUILTIN(m_rfind) {
    return str_find(c, at, VSTR(self), a, 1, 0);
}
BUILTIN(m_index) {
    return str_find(c, at, VSTR(self), a, 0, 1);
}
BUILTIN(m_rindex) {
    return str_find(c, at, VSTR(self), a, 1, 1);
}
BUILTIN(m_count) {
    STR_SELF;
    val x[3];
    tpl_bind(c, at, "count", a, "sub,start=,end=", x, 3);
    size_t lo, hi;
    sub_range(c, at, s, x[1], x[2], &lo, &hi);
    return v_int(count_sub(c, at, s, lo, hi, need_str(c, at, x[0], "substring")));
}
BUILTIN(m_replace) {
    STR_SELF;
    val x[3];
    tpl_bind(c, at, "replace", a, "old,new,count=", x, 3);
    int64_t n = given(x[2]) ? need_int(c, at, x[2], "count") : -1;
    return str_replace(c, at, s, need_str(c, at, x[0], "old"), need_str(c, at, x[1], "new"), n);
}
BUILTIN(m_join) {
    STR_SELF;
    val x[1];
    tpl_bind(c, at, "join", a, "iterable", x, 1);
    tlist *items = tpl_iterate(c, at, x[0]);
    val r = join_strs(c, at, s, items, 1);
    tpl_release(c, v_obj(V_LIST, items));
    return r;
}
BUILTIN(m_format) {
    return tpl_str_format(c, at, VSTR(self), a);
}
BUILTIN(m_center) {
    val x[2];
    tpl_bind(c, at, "center", a, "width,fillchar=", x, 2);
    return pad_str(c, at, VSTR(self), need_int(c, at, x[0], "width"), x[1], '^');
}
BUILTIN(m_ljust) {
    val x[2];
    tpl_bind(c, at, "ljust", a, "width,fillchar=", x, 2);
    return pad_str(c, at, VSTR(self), need_int(c, at, x[0], "width"), x[1], '<');
}
BUILTIN(m_rjust) {
    val x[2];
    tpl_bind(c, at, "rjust", a, "width,fillchar=", x, 2);
    return pad_str(c, at, VSTR(self), need_int(c, at, x[0], "width"), x[1], '>');
}
BUILTIN(m_zfill) {
    STR_SELF;
    val x[1];
    tpl_bind(c, at, "zfill", a, "width", x, 1);
    int64_t w = need_int(c, at, x[0], "width"), n = tpl_str_ncp(s);
    if (w > (int64_t)c->max_output)
        tpl_fail(c, at, TPL_ERR_LIMIT, "output size limit exceeded (%zu bytes)", c->max_output);
    tstr *r = tpl_str_new(c, at, s->len + 8);
    size_t i = 0;
    if (s->len && (s->s[0] == '-' || s->s[0] == '+')) tpl_str_addc(c, at, r, s->s[i++]);
    for (int64_t k = n; k < w; k++) tpl_str_addc(c, at, r, '0');
    tpl_str_add(c, at, r, s->s + i, s->len - i);
    return v_obj(V_STR, r);
}
static val partition(tctx *c, const node *at, tstr *s, const targs *a, int rev) {
    val x[1];
    tpl_bind(c, at, rev ? "rpartition" : "partition", a, "sep", x, 1);
    tstr *sep = need_str(c, at, x[0], "separator");
    if (!sep->len) tpl_fail(c, at, TPL_ERR_RUNTIME, "empty separator");
    const char *f = rev ? rfind_bytes(c, at, s->s, s->len, sep->s, sep->len)
                        : find_bytes(s->s, s->len, sep->s, sep->len);
    tlist *r = tpl_list_new(c, at, 3);
    r->tuple = L_TUPLE;
    if (!f) {
        val e = tpl_str_val(c, at, "", 0);
        if (rev) {
            tpl_list_push(c, at, r, e);
            tpl_list_push(c, at, r, tpl_str_val(c, at, "", 0));
            tpl_list_push(c, at, r, vref(v_obj(V_STR, s)));
        } else {
            tpl_list_push(c, at, r, vref(v_obj(V_STR, s)));
            tpl_list_push(c, at, r, e);
            tpl_list_push(c, at, r, tpl_str_val(c, at, "", 0));
        }
    } else {
        tpl_list_push(c, at, r, tpl_str_val(c, at, s->s, (size_t)(f - s->s)));
        tpl_list_push(c, at, r, vref(x[0]));
        const char *e = f + sep->len;
        tpl_list_push(c, at, r, tpl_str_val(c, at, e, (size_t)(s->s + s->len - e)));
    }
    return v_obj(V_LIST, r);
}
BUILTIN(m_partition) {
    return partition(c, at, VSTR(self), a, 0);
}
BUILTIN(m_rpartition) {
    return partition(c, at, VSTR(self), a, 1);
}
BUILTIN(m_removeprefix) {
    STR_SELF;
    val x[1];
    tpl_bind(c, at, "removeprefix", a, "prefix", x, 1);
    tstr *p = need_str(c, at, x[0], "prefix");
    if (p->len <= s->len && !memcmp(s->s, p->s, p->len))
        return tpl_str_val(c, at, s->s + p->len, s->len - p->len);
    return vref(self);
}
BUILTIN(m_removesuffix) {
    STR_SELF;
    val x[1];
    tpl_bind(c, at, "removesuffix", a, "suffix", x, 1);
    tstr *p = need_str(c, at, x[0], "suffix");
    if (p->len && p->len <= s->len && !memcmp(s->s + s->len - p->len, p->s, p->len))
        return tpl_str_val(c, at, s->s, s->len - p->len);
    return vref(self);
}
#define STR_PRED(fname, pred)                                                                      \
    BUILTIN(fname) {                                                                               \
        tpl_bind(c, at, &#fname[2], a, "", NULL, 0);                                               \
        return str_all(c, at, VSTR(self), pred);                                                   \
    }
STR_PRED(m_isalpha, tpl_is_alpha)
STR_PRED(m_isalnum, tpl_is_alnum)
STR_PRED(m_isdigit, tpl_is_digit)
STR_PRED(m_isdecimal, tpl_is_decimal)
STR_PRED(m_isnumeric, tpl_is_numeric)
STR_PRED(m_isspace, tpl_py_isspace)
BUILTIN(m_islower) {
    tpl_bind(c, at, "islower", a, "", NULL, 0);
    tpl_step(c, at, VSTR(self)->len / 8);
    return v_bool(str_islower(VSTR(self)));
}
BUILTIN(m_isupper) {
    tpl_bind(c, at, "isupper", a, "", NULL, 0);
    tpl_step(c, at, VSTR(self)->len / 8);
    return v_bool(str_isupper(VSTR(self)));
}
BUILTIN(m_istitle) {
    tpl_bind(c, at, "istitle", a, "", NULL, 0);
    tpl_step(c, at, VSTR(self)->len / 8);
    return v_bool(str_istitle(VSTR(self)));
}

/* ---- dict and list methods ------------------------------------------------------------- */

static tlist *dict_items(tctx *c, const node *at, tdict *d) {
    tlist *r = tpl_list_new(c, at, d->n);
    for (size_t i = 0; i < d->n; i++) {
        tlist *p = tpl_list_new(c, at, 2);
        p->tuple = L_TUPLE;
        tpl_list_push(c, at, p, vref(d->e[i].k));
        tpl_list_push(c, at, p, vref(d->e[i].v));
        tpl_list_push(c, at, r, v_obj(V_LIST, p));
    }
    tpl_step(c, at, d->n / 4);
    return r;
}

BUILTIN(m_items) {
    tpl_bind(c, at, "items", a, "", NULL, 0);
    tlist *r = dict_items(c, at, VDICT(self));
    r->tuple = L_ITEMS;
    return v_obj(V_LIST, r);
}
BUILTIN(m_keys) {
    tpl_bind(c, at, "keys", a, "", NULL, 0);
    tlist *r = tpl_iterate(c, at, self);
    r->tuple = L_KEYS;
    return v_obj(V_LIST, r);
}
BUILTIN(m_values) {
    tpl_bind(c, at, "values", a, "", NULL, 0);
    tdict *d = VDICT(self);
    tlist *r = tpl_list_new(c, at, d->n);
    r->tuple = L_VALUES;
    for (size_t i = 0; i < d->n; i++) tpl_list_push(c, at, r, vref(d->e[i].v));
    return v_obj(V_LIST, r);
}
BUILTIN(m_get) {
    val x[2];
    tpl_bind(c, at, "get", a, "key,default=", x, 2);
    if (x[0].t == V_LIST && !IS_TUPLE(VLIST(x[0])))
        tpl_fail(c, at, TPL_ERR_RUNTIME, "unhashable type: '%s'", tpl_type_name(x[0]));
    dent *e = tpl_dict_find(c, at, VDICT(self), x[0]);
    if (e) return vref(e->v);
    return given(x[1]) ? vref(x[1]) : v_none();
}
BUILTIN(m_dict_copy) {
    tpl_bind(c, at, "copy", a, "", NULL, 0);
    tdict *d = VDICT(self), *r = tpl_dict_new(c, at);
    for (size_t i = 0; i < d->n; i++) tpl_dict_set(c, at, r, vref(d->e[i].k), vref(d->e[i].v));
    return v_obj(V_DICT, r);
}
BUILTIN(m_list_copy) {
    tpl_bind(c, at, "copy", a, "", NULL, 0);
    tlist *l = VLIST(self), *r = tpl_list_new(c, at, l->n);
    for (size_t i = 0; i < l->n; i++) tpl_list_push(c, at, r, vref(l->v[i]));
    return v_obj(V_LIST, r);
}
BUILTIN(m_list_index) {
    val x[1];
    tpl_bind(c, at, "index", a, "value", x, 1);
    tlist *l = VLIST(self);
    for (size_t i = 0; i < l->n; i++)
        if (tpl_equal(c, at, l->v[i], x[0])) return v_int((int64_t)i);
    tpl_fail(c, at, TPL_ERR_RUNTIME, "value is not in %s", tpl_type_name(self));
}
BUILTIN(m_list_count) {
    val x[1];
    tpl_bind(c, at, "count", a, "value", x, 1);
    tlist *l = VLIST(self);
    int64_t k = 0;
    for (size_t i = 0; i < l->n; i++) k += tpl_equal(c, at, l->v[i], x[0]);
    return v_int(k);
}
BUILTIN(m_float_is_integer) {
    tpl_bind(c, at, "is_integer", a, "", NULL, 0);
    return v_bool(isfinite(self.u.f) && self.u.f == floor(self.u.f));
}

/* loop.cycle(...) and loop.changed(...) */
BUILTIN(m_loop_cycle) {
    tloop *l = (tloop *)self.u.o;
    if (a->nkw) tpl_fail(c, at, TPL_ERR_RUNTIME, "cycle() takes no keyword arguments");
    if (!a->n) tpl_fail(c, at, TPL_ERR_RUNTIME, "no items for cycling given");
    return vref(a->pos[l->i % a->n]);
}
BUILTIN(m_loop_changed) {
    tloop *l = (tloop *)self.u.o;
    tlist *now = tpl_list_new(c, at, a->n);
    now->tuple = L_TUPLE;
    for (size_t i = 0; i < a->n; i++) tpl_list_push(c, at, now, vref(a->pos[i]));
    val nv = v_obj(V_LIST, now);
    if (l->has_last && tpl_equal(c, at, l->last, nv)) {
        tpl_release(c, nv);
        return v_bool(0);
    }
    tpl_release(c, l->last);
    l->last = nv;
    l->has_last = 1;
    return v_bool(1);
}

/* cycler.next(), cycler.reset(); `current` is an attribute */
BUILTIN(m_cycler_next) {
    tpl_bind(c, at, "next", a, "", NULL, 0);
    tfunc *f = VFUNC(self);
    tlist *items = VLIST(f->self);
    val r = vref(items->v[(size_t)f->state % items->n]);
    f->state = (f->state + 1) % (int64_t)items->n;
    return r;
}
BUILTIN(m_cycler_reset) {
    tpl_bind(c, at, "reset", a, "", NULL, 0);
    VFUNC(self)->state = 0;
    return v_none();
}

typedef struct {
    const char *name;
    builtin_fn fn;
} mdef;

static const mdef str_methods[] = {
    {"capitalize", m_capitalize},
    {"casefold", m_lower},
    {"center", m_center},
    {"count", m_count},
    {"endswith", m_endswith},
    {"find", m_find},
    {"format", m_format},
    {"index", m_index},
    {"isalnum", m_isalnum},
    {"isalpha", m_isalpha},
    {"isdecimal", m_isdecimal},
    {"isdigit", m_isdigit},
    {"islower", m_islower},
    {"isnumeric", m_isnumeric},
    {"isspace", m_isspace},
    {"istitle", m_istitle},
    {"isupper", m_isupper},
    {"join", m_join},
    {"ljust", m_ljust},
    {"lower", m_lower},
    {"lstrip", m_lstrip},
    {"partition", m_partition},
    {"removeprefix", m_removeprefix},
    {"removesuffix", m_removesuffix},
    {"replace", m_replace},
    {"rfind", m_rfind},
    {"rindex", m_rindex},
    {"rjust", m_rjust},
    {"rpartition", m_rpartition},
    {"rsplit", m_rsplit},
    {"rstrip", m_rstrip},
    {"split", m_split},
    {"splitlines", m_splitlines},
    {"startswith", m_startswith},
    {"strip", m_strip},
    {"swapcase", m_swapcase},
    {"title", m_title},
    {"upper", m_upper},
    {"zfill", m_zfill},
    {NULL, NULL},
};
static const mdef dict_methods[] = {
    {"copy", m_dict_copy}, {"get", m_get},       {"items", m_items},
    {"keys", m_keys},      {"values", m_values}, {NULL, NULL},
};
static const mdef list_methods[] = {
    {"copy", m_list_copy}, {"count", m_list_count}, {"index", m_list_index}, {NULL, NULL}};
static const mdef tuple_methods[] = {
    {"count", m_list_count}, {"index", m_list_index}, {NULL, NULL}};
static const mdef float_methods[] = {{"is_integer", m_float_is_integer}, {NULL, NULL}};
static const mdef loop_methods[] = {
    {"cycle", m_loop_cycle}, {"changed", m_loop_changed}, {NULL, NULL}};
static const mdef cycler_methods[] = {
    {"next", m_cycler_next}, {"reset", m_cycler_reset}, {NULL, NULL}};

/* what ImmutableSandboxedEnvironment refuses: methods that change a list or dict */
static const char *const unsafe_list[] = {"append", "clear",   "extend", "insert", "pop",
                                          "remove", "reverse", "sort",   NULL};
static const char *const unsafe_dict[] = {"clear", "pop", "popitem", "setdefault", "update", NULL};

builtin_fn tpl_find_method(val v, const char *name, int *unsafe) {
    const mdef *t = NULL;
    const char *const *bad = NULL;
    *unsafe = 0;
    switch (v.t) {
    case V_STR:
        t = str_methods;
        break;
    case V_DICT:
        t = dict_methods;
        bad = unsafe_dict;
        break;
    case V_LIST:
        if (!IS_PLAIN(VLIST(v))) break;
        t = VLIST(v)->tuple == L_LIST ? list_methods : tuple_methods;
        if (VLIST(v)->tuple == L_LIST) bad = unsafe_list;
        break;
    case V_FLOAT:
        t = float_methods;
        break;
    case V_LOOP:
        t = loop_methods;
        break;
    case V_FUNC:
        if (VFUNC(v)->kind == F_CYCLER) t = cycler_methods;
        break;
    default:
        break;
    }
    if (name[0] == '_') {
        *unsafe = 1; /* the sandbox hides every _private and __dunder__ attribute */
        return NULL;
    }
    for (; t && t->name; t++)
        if (!strcmp(t->name, name)) return t->fn;
    for (; bad && *bad; bad++)
        if (!strcmp(*bad, name)) *unsafe = 1;
    return NULL;
}

/* ---- attribute getters (map, sort, selectattr, ...) ------------------------------------ */

/* "a.b.0" -> item lookups, digits as integers, like jinja's make_attrgetter */
static val attr_get(tctx *c, const node *at, val item, val attr, val dflt, int lower) {
    val cur = vref(item);
    if (attr.t == V_STR) {
        tstr *s = VSTR(attr);
        size_t i = 0;
        for (;;) {
            size_t j = i;
            while (j < s->len && s->s[j] != '.') j++;
            int digits = j > i;
            for (size_t k = i; k < j; k++)
                if (s->s[k] < '0' || s->s[k] > '9') digits = 0;
            val key = digits && j - i < 18 ? v_int(strtoll(s->s + i, NULL, 10))
                                           : tpl_str_val(c, at, s->s + i, j - i);
            val nx = tpl_getitem(c, at, cur, key);
            tpl_release(c, key);
            tpl_release(c, cur);
            cur = nx;
            if (given(dflt) && dflt.t != V_NONE && cur.t == V_UNDEF) {
                tpl_release(c, cur);
                cur = vref(dflt);
            }
            if (j >= s->len) break;
            i = j + 1;
        }
    } else if (given(attr) && attr.t != V_NONE) {
        val nx = tpl_getitem(c, at, cur, attr);
        tpl_release(c, cur);
        cur = nx;
        if (given(dflt) && dflt.t != V_NONE && cur.t == V_UNDEF) {
            tpl_release(c, cur);
            cur = vref(dflt);
        }
    }
    if (lower && cur.t == V_STR) {
        val l = case_str(c, at, VSTR(cur), CASE_LOWER);
        tpl_release(c, cur);
        cur = l;
    }
    return cur;
}

/* sort key: one value, or a list for "a,b" attributes (make_multi_attrgetter) */
static val sort_key(tctx *c, const node *at, val item, val attr, int lower) {
    if (attr.t != V_STR || !memchr(VSTR(attr)->s, ',', VSTR(attr)->len))
        return attr_get(c, at, item, attr, v_undef(), lower);
    tstr *s = VSTR(attr);
    tlist *k = tpl_list_new(c, at, 2);
    size_t i = 0;
    for (;;) {
        size_t j = i;
        while (j < s->len && s->s[j] != ',') j++;
        val part = tpl_str_val(c, at, s->s + i, j - i);
        tpl_list_push(c, at, k, attr_get(c, at, item, part, v_undef(), lower));
        tpl_release(c, part);
        if (j >= s->len) break;
        i = j + 1;
    }
    return v_obj(V_LIST, k);
}

/* stable merge sort of items by keys */
static void msort(tctx *c, const node *at, val *items, val *keys, val *ti, val *tk, size_t n,
                  int rev) {
    if (n < 2) return;
    size_t h = n / 2;
    msort(c, at, items, keys, ti, tk, h, rev);
    msort(c, at, items + h, keys + h, ti, tk, n - h, rev);
    size_t i = 0, j = h, k = 0;
    tpl_step(c, at, n);
    while (i < h && j < n) {
        int r = tpl_compare(c, at, keys[j], keys[i], "<");
        int take_right = rev ? (r > 0 && r != 2) : r < 0;
        if (take_right) {
            ti[k] = items[j];
            tk[k++] = keys[j++];
        } else {
            ti[k] = items[i];
            tk[k++] = keys[i++];
        }
    }
    while (i < h) ti[k] = items[i], tk[k++] = keys[i++];
    while (j < n) ti[k] = items[j], tk[k++] = keys[j++];
    memcpy(items, ti, n * sizeof *items);
    memcpy(keys, tk, n * sizeof *keys);
}

/* items sorted (stable) by key_of(item): returns a new list */
static tlist *sorted_by(tctx *c, const node *at, tlist *items, val attr, int lower, int rev,
                        int by_value_of_pair) {
    size_t n = items->n;
    tlist *out = tpl_list_new(c, at, n);
    tlist *keys = tpl_list_new(c, at, n);
    tlist *t1 = tpl_list_new(c, at, n), *t2 = tpl_list_new(c, at, n);
    for (size_t i = 0; i < n; i++) {
        tpl_list_push(c, at, out, vref(items->v[i]));
        val key;
        if (by_value_of_pair >= 0) {
            val pair = items->v[i];
            key = vref(VLIST(pair)->v[by_value_of_pair]);
            if (lower && key.t == V_STR) {
                val l = case_str(c, at, VSTR(key), CASE_LOWER);
                tpl_release(c, key);
                key = l;
            }
        } else {
            key = sort_key(c, at, items->v[i], attr, lower);
        }
        tpl_list_push(c, at, keys, key);
    }
    msort(c, at, out->v, keys->v, t1->v, t2->v, n, rev);
    tpl_release(c, v_obj(V_LIST, keys));
    tpl_release(c, v_obj(V_LIST, t1));
    tpl_release(c, v_obj(V_LIST, t2));
    return out;
}

/* ---- filters --------------------------------------------------------------------------- */

/* Jinja's map, select, unique, batch, slice and items filters are generators: they run when
 * iterated, so an error they meet surfaces then, or never when the result is only tested for
 * truth. The items are computed now; an error stops that and waits in the generator. */
typedef void (*fill_fn)(tctx *c, const node *at, val self, const targs *a, tlist *out);

typedef struct {
    jmp_buf *jb;
    int depth;
    const node *pos;
    tstr *out;
    tframe *frame;
} saved_state;

static int run_fill(tctx *c, const node *at, val self, const targs *a, fill_fn fill, tlist *out,
                    jmp_buf *jb) {
    if (setjmp(*jb)) return 1;
    fill(c, at, self, a, out);
    return 0;
}

static val lazy(tctx *c, const node *at, val self, const targs *a, fill_fn fill) {
    tlist *out = tpl_list_new(c, at, 0);
    out->tuple = L_GEN;
    saved_state st = {c->jb, c->depth, c->pos, c->out, c->frame};
    jmp_buf jb;
    c->jb = &jb;
    int failed = run_fill(c, at, self, a, fill, out, &jb);
    c->jb = st.jb;
    if (failed) {
        c->depth = st.depth;
        c->pos = st.pos;
        c->out = st.out;
        c->frame = st.frame;
        /* running out of steps or memory is not the generator's to keep */
        if (c->err_code != TPL_ERR_RUNTIME || !c->err) longjmp(*c->jb, 1);
        out->lazy_err = VSTR(tpl_cstr_val(c, at, c->err));
        free(c->err);
        c->err = NULL;
        c->err_code = 0;
    }
    return v_obj(V_LIST, out);
}

BUILTIN(f_abs) {
    tpl_bind(c, at, "abs", a, "", NULL, 0);
    if (self.t == V_UNDEF) tpl_fail_undef(c, at, self);
    if (self.t == V_FLOAT) return v_float(fabs(self.u.f));
    if (is_int(self)) {
        if (self.u.i == INT64_MIN) tpl_fail(c, at, TPL_ERR_RUNTIME, "integer overflow");
        return v_int(self.u.i < 0 ? -self.u.i : self.u.i);
    }
    tpl_fail(c, at, TPL_ERR_RUNTIME, "bad operand type for abs(): '%s'", tpl_type_name(self));
}

BUILTIN(f_attr) {
    val x[1];
    tpl_bind(c, at, "attr", a, "name", x, 1);
    tstr *name = need_str(c, at, x[0], "attribute name");
    if (self.t == V_DICT) { /* attributes only: a key is not an attribute */
        int unsafe;
        if (!tpl_find_method(self, name->s, &unsafe) && !unsafe)
            return tpl_undef_attr(c, self, x[0]);
    }
    if (self.t == V_UNDEF) tpl_fail_undef(c, at, self);
    return tpl_getattr(c, at, self, name);
}

static void fill_batch(tctx *c, const node *at, val self, const targs *a, tlist *out) {
    val x[2];
    tpl_bind(c, at, "batch", a, "linecount,fill_with=", x, 2);
    int64_t n = need_int(c, at, x[0], "linecount");
    tlist *items = tpl_iterate(c, at, self);
    tlist *cur = tpl_list_new(c, at, 4);
    /* jinja's loop as it is: a linecount below 1 gives an empty first batch, then one */
    for (size_t i = 0; i < items->n; i++) {
        if ((int64_t)cur->n == n) {
            tpl_list_push(c, at, out, v_obj(V_LIST, cur));
            cur = tpl_list_new(c, at, 4);
        }
        tpl_list_push(c, at, cur, vref(items->v[i]));
    }
    if (cur->n) {
        if (given(x[1]) && x[1].t != V_NONE)
            while ((int64_t)cur->n < n) tpl_list_push(c, at, cur, vref(x[1]));
        tpl_list_push(c, at, out, v_obj(V_LIST, cur));
    } else {
        tpl_release(c, v_obj(V_LIST, cur));
    }
    tpl_release(c, v_obj(V_LIST, items));
}
BUILTIN(f_batch) {
    return lazy(c, at, self, a, fill_batch);
}

BUILTIN(f_capitalize) {
    tpl_bind(c, at, "capitalize", a, "", NULL, 0);
    val s = tpl_str_of(c, at, self);
    val r = capitalize_str(c, at, VSTR(s));
    tpl_release(c, s);
    return r;
}

BUILTIN(f_center) {
    val x[1];
    tpl_bind(c, at, "center", a, "width=", x, 1);
    val s = tpl_str_of(c, at, self);
    val r = pad_str(c, at, VSTR(s), given(x[0]) ? need_int(c, at, x[0], "width") : 80,
                    (val){.t = V_UNDEF, .safe = 1}, '^');
    tpl_release(c, s);
    return r;
}

BUILTIN(f_default) {
    val x[2];
    tpl_bind(c, at, "default", a, "default_value=,boolean=", x, 2);
    int boolean = given(x[1]) && tpl_truthy(x[1]);
    if (self.t == V_UNDEF || (boolean && !tpl_truthy(self)))
        return given(x[0]) ? vref(x[0]) : tpl_str_val(c, at, "", 0);
    return vref(self);
}

BUILTIN(f_dictsort) {
    val x[3];
    tpl_bind(c, at, "dictsort", a, "case_sensitive=,by=,reverse=", x, 3);
    if (self.t != V_DICT) tpl_fail(c, at, TPL_ERR_RUNTIME, "dictsort: expected a dict");
    int by_value = 0;
    if (given(x[1])) {
        tstr *by = need_str(c, at, x[1], "by");
        if (!strcmp(by->s, "value"))
            by_value = 1;
        else if (strcmp(by->s, "key"))
            tpl_fail(c, at, TPL_ERR_RUNTIME, "You can only sort by either \"key\" or \"value\"");
    }
    tlist *items = dict_items(c, at, VDICT(self));
    tlist *r = sorted_by(c, at, items, v_undef(), !(given(x[0]) && tpl_truthy(x[0])),
                         given(x[2]) && tpl_truthy(x[2]), by_value);
    tpl_release(c, v_obj(V_LIST, items));
    return v_obj(V_LIST, r);
}

static val html_escape(tctx *c, const node *at, val v, int force) {
    if (v.t == V_STR && v.safe && !force) return vref(v);
    val s = tpl_str_of(c, at, v);
    tstr *in = VSTR(s), *r = tpl_str_new(c, at, in->len + 16);
    for (size_t i = 0; i < in->len; i++) {
        char ch = in->s[i];
        switch (ch) {
        case '&':
            tpl_str_add(c, at, r, "&amp;", 5);
            break;
        case '<':
            tpl_str_add(c, at, r, "&lt;", 4);
            break;
        case '>':
            tpl_str_add(c, at, r, "&gt;", 4);
            break;
        case '"':
            tpl_str_add(c, at, r, "&#34;", 5);
            break;
        case '\'':
            tpl_str_add(c, at, r, "&#39;", 5);
            break;
        default:
            tpl_str_addc(c, at, r, ch);
        }
    }
    tpl_release(c, s);
    val out = v_obj(V_STR, r);
    out.safe = 1;
    return out;
}

BUILTIN(f_escape) {
    tpl_bind(c, at, "escape", a, "", NULL, 0);
    if (self.t == V_UNDEF) return tpl_str_val(c, at, "", 0);
    return html_escape(c, at, self, 0);
}
BUILTIN(f_forceescape) {
    tpl_bind(c, at, "forceescape", a, "", NULL, 0);
    return html_escape(c, at, self, 1);
}
BUILTIN(f_safe) {
    tpl_bind(c, at, "safe", a, "", NULL, 0);
    val s = tpl_str_of(c, at, self);
    s.safe = 1;
    return s;
}

BUILTIN(f_first) {
    tpl_bind(c, at, "first", a, "", NULL, 0);
    if (self.t == V_LIST) {
        tlist *l = VLIST(self);
        if (!l->n && l->lazy_err) tpl_fail_lazy(c, l);
        if (!l->n) return tpl_undef_msg(c, "No first item, sequence was empty.");
        val r = vref(l->v[0]);
        if (IS_ITER(l)) tpl_iter_consume(c, l, 1); /* next(iter(gen)) */
        return r;
    }
    tlist *items = tpl_iterate(c, at, self);
    val r = items->n ? vref(items->v[0]) : tpl_undef_msg(c, "No first item, sequence was empty.");
    tpl_release(c, v_obj(V_LIST, items));
    return r;
}

BUILTIN(f_last) {
    tpl_bind(c, at, "last", a, "", NULL, 0);
    if (self.t == V_UNDEF) return tpl_undef_msg(c, "No last item, sequence was empty.");
    if (self.t == V_LIST && VLIST(self)->tuple == L_GEN)
        tpl_fail(c, at, TPL_ERR_RUNTIME, "'generator' object is not reversible");
    tlist *items = tpl_iterate(c, at, self);
    val r = items->n ? vref(items->v[items->n - 1])
                     : tpl_undef_msg(c, "No last item, sequence was empty.");
    tpl_release(c, v_obj(V_LIST, items));
    return r;
}

/* Python's float(str): surrounding whitespace, '_' between digits, inf/nan */
static int parse_float(tstr *s, double *out) {
    size_t a = 0, b = s->len;
    while (a < b && (s->s[a] == ' ' || (s->s[a] >= 9 && s->s[a] <= 13))) a++;
    while (b > a && (s->s[b - 1] == ' ' || (s->s[b - 1] >= 9 && s->s[b - 1] <= 13))) b--;
    if (a == b || b - a > 400) return 0;
    char buf[512];
    size_t k = 0;
    for (size_t i = a; i < b; i++) {
        char ch = s->s[i];
        if (ch == '_') {
            if (i == a || i + 1 == b || !(s->s[i - 1] >= '0' && s->s[i - 1] <= '9') ||
                !(s->s[i + 1] >= '0' && s->s[i + 1] <= '9'))
                return 0;
            continue;
        }
        if (!((ch >= '0' && ch <= '9') || ch == '.' || ch == 'e' || ch == 'E' || ch == '+' ||
              ch == '-' || (ch | 0x20) == 'i' || (ch | 0x20) == 'n' || (ch | 0x20) == 'f' ||
              (ch | 0x20) == 'a' || (ch | 0x20) == 't' || (ch | 0x20) == 'y'))
            return 0;
        buf[k++] = ch;
    }
    buf[k] = 0;
    const char *p = buf;
    if (*p == '+' || *p == '-') p++;
    if (!strcasecmp(p, "inf") || !strcasecmp(p, "infinity") || !strcasecmp(p, "nan")) {
        double v = (p[0] | 0x20) == 'n' ? NAN : INFINITY;
        *out = buf[0] == '-' ? -v : v;
        return 1;
    }
    if ((p[0] | 0x20) == 'i' || (p[0] | 0x20) == 'n') return 0;
    if (strchr(buf, 'x') || strchr(buf, 'X')) return 0;
    char *end;
    *out = strtod(buf, &end);
    return *end == 0 && end != buf;
}

BUILTIN(f_float) {
    val x[1];
    tpl_bind(c, at, "float", a, "default=", x, 1);
    double d;
    if (self.t == V_UNDEF) tpl_fail_undef(c, at, self); /* float(Undefined) raises */
    if (self.t == V_FLOAT) return self;
    if (is_int(self)) return v_float((double)self.u.i);
    if (self.t == V_STR && parse_float(VSTR(self), &d)) return v_float(d);
    return given(x[0]) ? vref(x[0]) : v_float(0.0);
}

/* Python's int(str, base) */
static int parse_int(tstr *s, int64_t base, int64_t *out) {
    size_t a = 0, b = s->len;
    while (a < b && tpl_py_isspace((unsigned char)s->s[a])) a++;
    while (b > a && tpl_py_isspace((unsigned char)s->s[b - 1])) b--;
    int neg = 0;
    if (a < b && (s->s[a] == '+' || s->s[a] == '-')) neg = s->s[a++] == '-';
    if (a + 1 < b && s->s[a] == '0') {
        char k = (char)(s->s[a + 1] | 0x20);
        int pb = k == 'x' ? 16 : k == 'o' ? 8 : k == 'b' ? 2 : 0;
        if (pb && (base == 0 || base == pb)) {
            base = pb;
            a += 2;
            if (a < b && s->s[a] == '_') a++;
        }
    }
    if (base == 0) base = 10;
    if (a == b) return 0;
    uint64_t v = 0;
    int prev_us = 1;
    for (size_t i = a; i < b; i++) {
        char ch = s->s[i];
        if (ch == '_') {
            if (prev_us) return 0;
            prev_us = 1;
            continue;
        }
        int d = ch >= '0' && ch <= '9'                     ? ch - '0'
                : (ch | 0x20) >= 'a' && (ch | 0x20) <= 'z' ? (ch | 0x20) - 'a' + 10
                                                           : 99;
        if (d >= base) return 0;
        if (v > (UINT64_MAX - (uint64_t)d) / (uint64_t)base) return -1;
        v = v * (uint64_t)base + (uint64_t)d;
        prev_us = 0;
    }
    if (prev_us) return 0;
    if (v > (uint64_t)INT64_MAX + (uint64_t)neg) return -1;
    *out = neg ? (int64_t)(0 - v) : (int64_t)v;
    return 1;
}

BUILTIN(f_int) {
    val x[2];
    tpl_bind(c, at, "int", a, "default=,base=", x, 2);
    int64_t base = given(x[1]) ? need_int(c, at, x[1], "base") : 10;
    if (self.t == V_UNDEF) tpl_fail_undef(c, at, self); /* int(Undefined) raises */
    if (is_int(self)) return v_int(self.u.i);
    double d = 0;
    int okf = 0;
    if (self.t == V_FLOAT) {
        d = self.u.f;
        okf = 1;
    } else if (self.t == V_STR) {
        int64_t iv;
        int r = base == 0 || (base >= 2 && base <= 36) ? parse_int(VSTR(self), base, &iv) : 0;
        if (r == 1) return v_int(iv);
        if (r == -1) tpl_fail(c, at, TPL_ERR_RUNTIME, "integer beyond 64 bits");
        okf = parse_float(VSTR(self), &d); /* "42.23"|int gives 42 */
    }
    if (okf) {
        if (isnan(d)) return given(x[0]) ? vref(x[0]) : v_int(0);
        if (isinf(d)) tpl_fail(c, at, TPL_ERR_RUNTIME, "cannot convert float infinity to integer");
        if (fabs(d) >= 9.2e18) tpl_fail(c, at, TPL_ERR_RUNTIME, "integer beyond 64 bits");
        return v_int((int64_t)d);
    }
    return given(x[0]) ? vref(x[0]) : v_int(0);
}

BUILTIN(f_indent) {
    val x[3];
    tpl_bind(c, at, "indent", a, "width=,first=,blank=", x, 3);
    tstr *ind;
    val indv;
    if (given(x[0]) && x[0].t == V_STR) {
        indv = vref(x[0]);
    } else {
        int64_t w = given(x[0]) ? need_int(c, at, x[0], "width") : 4;
        if (w > (int64_t)c->max_output) tpl_fail(c, at, TPL_ERR_LIMIT, "indent too wide");
        tstr *t = tpl_str_new(c, at, (size_t)(w > 0 ? w : 0));
        for (int64_t i = 0; i < w; i++) tpl_str_addc(c, at, t, ' ');
        indv = v_obj(V_STR, t);
    }
    ind = VSTR(indv);
    int first = given(x[1]) && tpl_truthy(x[1]), blank = given(x[2]) && tpl_truthy(x[2]);
    /* jinja appends "\n" to the value itself: anything but a string fails */
    if (self.t == V_UNDEF) tpl_fail_undef(c, at, self);
    if (self.t != V_STR)
        tpl_fail(c, at, TPL_ERR_RUNTIME, "unsupported operand type(s) for +=: '%s' and 'str'",
                 tpl_type_name(self));
    val sv = tpl_str_of(c, at, self);
    tstr *s1 = tpl_str_new(c, at, VSTR(sv)->len + 1);
    tpl_str_add(c, at, s1, VSTR(sv)->s, VSTR(sv)->len);
    tpl_str_addc(c, at, s1, '\n'); /* jinja's quirk for splitlines */
    tlist *lines = splitlines(c, at, s1, 0);
    tstr *r = tpl_str_new(c, at, s1->len + lines->n * ind->len);
    for (size_t i = 0; i < lines->n; i++) {
        tstr *ln = VSTR(lines->v[i]);
        if (i) {
            tpl_str_addc(c, at, r, '\n');
            if (blank || ln->len) tpl_str_add(c, at, r, ind->s, ind->len);
        }
        tpl_str_add(c, at, r, ln->s, ln->len);
    }
    val out = v_obj(V_STR, r);
    if (first) {
        tstr *r2 = tpl_str_new(c, at, r->len + ind->len);
        tpl_str_add(c, at, r2, ind->s, ind->len);
        tpl_str_add(c, at, r2, r->s, r->len);
        tpl_release(c, out);
        out = v_obj(V_STR, r2);
    }
    tpl_release(c, v_obj(V_LIST, lines));
    tpl_release(c, v_obj(V_STR, s1));
    tpl_release(c, sv);
    tpl_release(c, indv);
    return out;
}

static void fill_items(tctx *c, const node *at, val self, const targs *a, tlist *out) {
    tpl_bind(c, at, "items", a, "", NULL, 0);
    if (self.t == V_UNDEF) return;
    if (self.t != V_DICT)
        tpl_fail(c, at, TPL_ERR_RUNTIME, "Can only get item pairs from a mapping.");
    tlist *r = dict_items(c, at, VDICT(self));
    for (size_t i = 0; i < r->n; i++) tpl_list_push(c, at, out, vref(r->v[i]));
    tpl_release(c, v_obj(V_LIST, r));
}
BUILTIN(f_items) {
    return lazy(c, at, self, a, fill_items);
}

static tlist *map_attr_list(tctx *c, const node *at, tlist *items, val attr) {
    tlist *r = tpl_list_new(c, at, items->n);
    for (size_t i = 0; i < items->n; i++)
        tpl_list_push(c, at, r, attr_get(c, at, items->v[i], attr, v_undef(), 0));
    return r;
}

BUILTIN(f_join) {
    val x[2];
    tpl_bind(c, at, "join", a, "d=,attribute=", x, 2);
    val sepv = given(x[0]) ? tpl_str_of(c, at, x[0]) : tpl_str_val(c, at, "", 0);
    tlist *items = tpl_iterate(c, at, self);
    if (given(x[1]) && x[1].t != V_NONE) {
        tlist *m = map_attr_list(c, at, items, x[1]);
        tpl_release(c, v_obj(V_LIST, items));
        items = m;
    }
    val r = join_strs(c, at, VSTR(sepv), items, 0);
    tpl_release(c, v_obj(V_LIST, items));
    tpl_release(c, sepv);
    return r;
}

BUILTIN(f_length) {
    tpl_bind(c, at, "length", a, "", NULL, 0);
    return v_int(tpl_length(c, at, self));
}

BUILTIN(f_list) {
    tpl_bind(c, at, "list", a, "", NULL, 0);
    tlist *items = tpl_iterate(c, at, self);
    if (self.t == V_LIST && !IS_ITER(VLIST(self))) { /* a fresh list, not the argument */
        tlist *r = tpl_list_new(c, at, items->n);
        for (size_t i = 0; i < items->n; i++) tpl_list_push(c, at, r, vref(items->v[i]));
        tpl_release(c, v_obj(V_LIST, items));
        return v_obj(V_LIST, r);
    }
    return v_obj(V_LIST, items);
}

BUILTIN(f_lower) {
    tpl_bind(c, at, "lower", a, "", NULL, 0);
    val s = tpl_str_of(c, at, self);
    val r = case_str(c, at, VSTR(s), CASE_LOWER);
    tpl_release(c, s);
    return r;
}

BUILTIN(f_upper) {
    tpl_bind(c, at, "upper", a, "", NULL, 0);
    val s = tpl_str_of(c, at, self);
    val r = case_str(c, at, VSTR(s), CASE_UPPER);
    tpl_release(c, s);
    return r;
}

/* arguments after the first `skip` positional ones */
static targs rest_args(const targs *a, size_t skip) {
    targs r = *a;
    r.n = a->n > skip ? a->n - skip : 0;
    r.pos = a->pos + (a->n > skip ? skip : a->n);
    return r;
}

static val kwarg(const targs *a, const char *name) {
    for (size_t i = 0; i < a->nkw; i++)
        if (!strcmp(VSTR(a->kwn[i])->s, name)) return a->kw[i];
    return (val){.t = V_UNDEF, .safe = 1};
}

static void fill_map(tctx *c, const node *at, val self, const targs *a, tlist *out) {
    if (!tpl_truthy(self)) return;
    tlist *items = tpl_iterate(c, at, self);
    if (a->n == 0 && given(kwarg(a, "attribute"))) {
        for (size_t i = 0; i < a->nkw; i++) {
            const char *k = VSTR(a->kwn[i])->s;
            if (strcmp(k, "attribute") && strcmp(k, "default"))
                tpl_fail(c, at, TPL_ERR_RUNTIME, "Unexpected keyword argument '%s'", k);
        }
        val attr = kwarg(a, "attribute"), dflt = kwarg(a, "default");
        for (size_t i = 0; i < items->n; i++)
            tpl_list_push(c, at, out, attr_get(c, at, items->v[i], attr, dflt, 0));
    } else {
        if (a->n == 0) tpl_fail(c, at, TPL_ERR_RUNTIME, "map requires a filter argument");
        tstr *name = need_str(c, at, a->pos[0], "filter name");
        targs rest = rest_args(a, 1);
        for (size_t i = 0; i < items->n; i++)
            tpl_list_push(c, at, out, tpl_call_filter(c, at, name->s, items->v[i], &rest));
    }
    tpl_release(c, v_obj(V_LIST, items));
}
BUILTIN(f_map) {
    return lazy(c, at, self, a, fill_map);
}

static val minmax(tctx *c, const node *at, val self, const targs *a, int want_max) {
    val x[2];
    tpl_bind(c, at, want_max ? "max" : "min", a, "case_sensitive=,attribute=", x, 2);
    int lower = !(given(x[0]) && tpl_truthy(x[0]));
    tlist *items = tpl_iterate(c, at, self);
    if (!items->n) {
        tpl_release(c, v_obj(V_LIST, items));
        return tpl_undef_msg(c, "No aggregated item, sequence was empty.");
    }
    size_t best = 0;
    val bk = attr_get(c, at, items->v[0], x[1], v_undef(), lower);
    for (size_t i = 1; i < items->n; i++) {
        val k = attr_get(c, at, items->v[i], x[1], v_undef(), lower);
        int r = tpl_compare(c, at, k, bk, want_max ? ">" : "<");
        if (r != 2 && (want_max ? r > 0 : r < 0)) {
            tpl_release(c, bk);
            bk = k;
            best = i;
        } else {
            tpl_release(c, k);
        }
    }
    val r = vref(items->v[best]);
    tpl_release(c, bk);
    tpl_release(c, v_obj(V_LIST, items));
    return r;
}
BUILTIN(f_max) {
    return minmax(c, at, self, a, 1);
}
BUILTIN(f_min) {
    return minmax(c, at, self, a, 0);
}

BUILTIN(f_pprint) {
    tpl_bind(c, at, "pprint", a, "", NULL, 0);
    tstr *s = tpl_str_new(c, at, 32);
    tpl_repr_sorted(c, at, s, self, 0); /* pprint sorts dict keys */
    return v_obj(V_STR, s);
}

/* select / reject / selectattr / rejectattr */
static void select_reject(tctx *c, const node *at, val self, const targs *a, int keep_if,
                          int by_attr, tlist *out) {
    if (!tpl_truthy(self)) return;
    size_t off = 0;
    val attr = v_undef();
    if (by_attr) {
        if (a->n < 1) tpl_fail(c, at, TPL_ERR_RUNTIME, "Missing parameter for attribute name");
        attr = a->pos[0];
        off = 1;
    }
    const char *test = NULL;
    if (a->n > off) test = need_str(c, at, a->pos[off], "test name")->s;
    targs rest = rest_args(a, off + 1);
    tlist *items = tpl_iterate(c, at, self);
    for (size_t i = 0; i < items->n; i++) {
        val v = by_attr ? attr_get(c, at, items->v[i], attr, v_undef(), 0) : vref(items->v[i]);
        int t = test ? tpl_call_test(c, at, test, v, &rest) : tpl_truthy(v);
        tpl_release(c, v);
        if (t == keep_if) tpl_list_push(c, at, out, vref(items->v[i]));
    }
    tpl_release(c, v_obj(V_LIST, items));
}
static void fill_select(tctx *c, const node *at, val self, const targs *a, tlist *out) {
    select_reject(c, at, self, a, 1, 0, out);
}
static void fill_reject(tctx *c, const node *at, val self, const targs *a, tlist *out) {
    select_reject(c, at, self, a, 0, 0, out);
}
static void fill_selectattr(tctx *c, const node *at, val self, const targs *a, tlist *out) {
    select_reject(c, at, self, a, 1, 1, out);
}
static void fill_rejectattr(tctx *c, const node *at, val self, const targs *a, tlist *out) {
    select_reject(c, at, self, a, 0, 1, out);
}
BUILTIN(f_select) {
    return lazy(c, at, self, a, fill_select);
}
BUILTIN(f_reject) {
    return lazy(c, at, self, a, fill_reject);
}
BUILTIN(f_selectattr) {
    return lazy(c, at, self, a, fill_selectattr);
}
BUILTIN(f_rejectattr) {
    return lazy(c, at, self, a, fill_rejectattr);
}

BUILTIN(f_replace) {
    val x[3];
    tpl_bind(c, at, "replace", a, "old,new,count=", x, 3);
    val s = tpl_str_of(c, at, self), o = tpl_str_of(c, at, x[0]), n = tpl_str_of(c, at, x[1]);
    int64_t cnt = given(x[2]) && x[2].t != V_NONE ? need_int(c, at, x[2], "count") : -1;
    val r = str_replace(c, at, VSTR(s), VSTR(o), VSTR(n), cnt);
    tpl_release(c, s);
    tpl_release(c, o);
    tpl_release(c, n);
    return r;
}

BUILTIN(f_reverse) {
    tpl_bind(c, at, "reverse", a, "", NULL, 0);
    if (self.t == V_STR) {
        tstr *s = VSTR(self), *r = tpl_str_new(c, at, s->len);
        size_t i = s->len;
        while (i > 0) {
            size_t k = i - 1;
            while (k > 0 && ((unsigned char)s->s[k] & 0xC0) == 0x80 && i - k < 4) k--;
            size_t j = k;
            tpl_utf8_next(s->s, s->len, &j);
            if (j != i) k = i - 1; /* invalid sequence: one byte */
            tpl_str_add(c, at, r, s->s + k, i - k);
            i = k;
        }
        return v_obj(V_STR, r);
    }
    /* reversed(seq): an iterator; a generator has no reversed() and becomes a list */
    int iter_in = self.t == V_LIST && IS_ITER(VLIST(self));
    tlist *items = tpl_iterate(c, at, self);
    tlist *r = tpl_list_new(c, at, items->n);
    r->tuple = iter_in ? L_LIST : L_REVITER;
    for (size_t i = items->n; i-- > 0;) tpl_list_push(c, at, r, vref(items->v[i]));
    tpl_release(c, v_obj(V_LIST, items));
    return v_obj(V_LIST, r);
}

/* Python's round(x, n): correctly rounded, ties to even */
static double py_round(double x, int64_t n) {
    if (!isfinite(x)) return x;
    if (n >= 0) {
        if (n > 320) return x;
        char buf[400];
        snprintf(buf, sizeof buf, "%.*f", (int)n, x);
        return strtod(buf, NULL);
    }
    if (n < -308) return copysign(0.0, x);
    double p = pow(10.0, (double)-n);
    double y = x / p;
    return nearbyint(y) * p;
}

BUILTIN(f_round) {
    val x[2];
    tpl_bind(c, at, "round", a, "precision=,method=", x, 2);
    int64_t prec = given(x[0]) ? need_int(c, at, x[0], "precision") : 0;
    const char *method = given(x[1]) ? need_str(c, at, x[1], "method")->s : "common";
    if (strcmp(method, "common") && strcmp(method, "ceil") && strcmp(method, "floor"))
        tpl_fail(c, at, TPL_ERR_RUNTIME, "method must be common, ceil or floor");
    if (self.t == V_UNDEF) tpl_fail_undef(c, at, self);
    if (!is_num(self))
        tpl_fail(c, at, TPL_ERR_RUNTIME, "type %s doesn't define __round__ method",
                 tpl_type_name(self));
    if (!strcmp(method, "common")) {
        if (is_int(self)) {
            if (prec >= 0) return v_int(self.u.i);
            double r = py_round((double)self.u.i, prec);
            return v_int((int64_t)r);
        }
        return v_float(py_round(self.u.f, prec));
    }
    double p = pow(10.0, (double)prec);
    double v = (self.t == V_FLOAT ? self.u.f : (double)self.u.i) * p;
    return v_float((method[0] == 'c' ? ceil(v) : floor(v)) / p);
}

static void fill_slice(tctx *c, const node *at, val self, const targs *a, tlist *out) {
    val x[2];
    tpl_bind(c, at, "slice", a, "slices,fill_with=", x, 2);
    int64_t slices = need_int(c, at, x[0], "slices");
    if (slices < 1) tpl_fail(c, at, TPL_ERR_RUNTIME, "slice() needs at least one slice");
    if (slices > 100000) tpl_fail(c, at, TPL_ERR_LIMIT, "too many slices");
    tlist *seq = tpl_iterate(c, at, self);
    int64_t len = (int64_t)seq->n, per = len / slices, extra = len % slices, offset = 0;
    for (int64_t k = 0; k < slices; k++) {
        int64_t start = offset + k * per;
        if (k < extra) offset++;
        int64_t end = offset + (k + 1) * per;
        tlist *t = tpl_list_new(c, at, (size_t)(end - start + 1));
        for (int64_t i = start; i < end; i++) tpl_list_push(c, at, t, vref(seq->v[i]));
        if (given(x[1]) && x[1].t != V_NONE && k >= extra) tpl_list_push(c, at, t, vref(x[1]));
        tpl_list_push(c, at, out, v_obj(V_LIST, t));
    }
    tpl_release(c, v_obj(V_LIST, seq));
}
BUILTIN(f_slice) {
    return lazy(c, at, self, a, fill_slice);
}

BUILTIN(f_sort) {
    val x[3];
    tpl_bind(c, at, "sort", a, "reverse=,case_sensitive=,attribute=", x, 3);
    tlist *items = tpl_iterate(c, at, self);
    tlist *r = sorted_by(c, at, items, x[2], !(given(x[1]) && tpl_truthy(x[1])),
                         given(x[0]) && tpl_truthy(x[0]), -1);
    tpl_release(c, v_obj(V_LIST, items));
    return v_obj(V_LIST, r);
}

BUILTIN(f_string) {
    tpl_bind(c, at, "string", a, "", NULL, 0);
    return tpl_str_of(c, at, self);
}

BUILTIN(f_sum) {
    val x[2];
    tpl_bind(c, at, "sum", a, "attribute=,start=", x, 2);
    tlist *items = tpl_iterate(c, at, self);
    val acc = given(x[1]) ? vref(x[1]) : v_int(0);
    for (size_t i = 0; i < items->n; i++) {
        val v = attr_get(c, at, items->v[i], x[0], v_undef(), 0);
        val n = tpl_arith(c, at, OP_ADD, acc, v);
        tpl_release(c, acc);
        tpl_release(c, v);
        acc = n;
    }
    tpl_release(c, v_obj(V_LIST, items));
    return acc;
}

BUILTIN(f_title) {
    tpl_bind(c, at, "title", a, "", NULL, 0);
    val s = tpl_str_of(c, at, self);
    val r = jinja_title(c, at, VSTR(s));
    tpl_release(c, s);
    return r;
}

/* transformers: json.dumps(x, ensure_ascii=False, indent=None, separators=None,
 * sort_keys=False) */
BUILTIN(f_tojson) {
    val x[4];
    tpl_bind(c, at, "tojson", a, "ensure_ascii=,indent=,separators=,sort_keys=", x, 4);
    int ascii = given(x[0]) && tpl_truthy(x[0]);
    int has_indent = given(x[1]) && x[1].t != V_NONE;
    val indv = v_undef();
    const char *indent = "";
    if (has_indent) {
        if (x[1].t == V_STR) {
            indv = vref(x[1]);
        } else {
            int64_t w = need_int(c, at, x[1], "indent");
            if (w > 1000) tpl_fail(c, at, TPL_ERR_LIMIT, "indent too wide");
            tstr *t = tpl_str_new(c, at, (size_t)(w > 0 ? w : 0));
            for (int64_t i = 0; i < w; i++) tpl_str_addc(c, at, t, ' ');
            indv = v_obj(V_STR, t);
        }
        indent = VSTR(indv)->s;
    }
    const char *item_sep = has_indent ? "," : ", ", *key_sep = ": ";
    if (given(x[2]) && x[2].t != V_NONE) {
        val sp = x[2];
        if (sp.t != V_LIST || VLIST(sp)->n != 2 || VLIST(sp)->v[0].t != V_STR ||
            VLIST(sp)->v[1].t != V_STR)
            tpl_fail(c, at, TPL_ERR_RUNTIME, "separators must be a pair of strings");
        item_sep = VSTR(VLIST(sp)->v[0])->s;
        key_sep = VSTR(VLIST(sp)->v[1])->s;
    }
    tstr *s = tpl_str_new(c, at, 64);
    tpl_tojson(c, at, s, self, ascii, indent, has_indent, item_sep, key_sep,
               given(x[3]) && tpl_truthy(x[3]), 0, 0);
    tpl_release(c, indv);
    return v_obj(V_STR, s);
}

BUILTIN(f_trim) {
    val x[1];
    tpl_bind(c, at, "trim", a, "chars=", x, 1);
    val s = tpl_str_of(c, at, self);
    val r = do_strip(c, at, VSTR(s), x[0], 3);
    tpl_release(c, s);
    return r;
}

BUILTIN(f_truncate) {
    val x[4];
    tpl_bind(c, at, "truncate", a, "length=,killwords=,end=,leeway=", x, 4);
    int64_t length = given(x[0]) ? need_int(c, at, x[0], "length") : 255;
    int killwords = given(x[1]) && tpl_truthy(x[1]);
    val endv = given(x[2]) ? tpl_str_of(c, at, x[2]) : tpl_str_val(c, at, "...", 3);
    int64_t leeway = given(x[3]) && x[3].t != V_NONE ? need_int(c, at, x[3], "leeway") : 5;
    tstr *end = VSTR(endv);
    int64_t endn = tpl_str_ncp(end);
    if (length < endn)
        tpl_fail(c, at, TPL_ERR_RUNTIME, "expected length >= %" PRId64 ", got %" PRId64, endn,
                 length);
    if (leeway < 0) tpl_fail(c, at, TPL_ERR_RUNTIME, "expected leeway >= 0, got %" PRId64, leeway);
    if (self.t != V_STR) { /* jinja takes len() of the value as it is */
        if (tpl_length(c, at, self) <= length + leeway) {
            tpl_release(c, endv);
            return vref(self);
        }
        tpl_fail(c, at, TPL_ERR_RUNTIME, "truncate: cannot cut a %s", tpl_type_name(self));
    }
    val sv = tpl_str_of(c, at, self);
    tstr *s = VSTR(sv);
    tpl_step(c, at, s->len / 8);
    if (tpl_str_ncp(s) <= length + leeway) {
        tpl_release(c, endv);
        return sv;
    }
    size_t cut = byte_off(s, length - endn);
    if (!killwords) {
        size_t k = cut;
        while (k > 0 && s->s[k - 1] != ' ') k--;
        if (k > 0) cut = k - 1;
    }
    tstr *r = tpl_str_new(c, at, cut + end->len);
    tpl_str_add(c, at, r, s->s, cut);
    tpl_str_add(c, at, r, end->s, end->len);
    tpl_release(c, sv);
    tpl_release(c, endv);
    return v_obj(V_STR, r);
}

static void fill_unique(tctx *c, const node *at, val self, const targs *a, tlist *out) {
    val x[2];
    tpl_bind(c, at, "unique", a, "case_sensitive=,attribute=", x, 2);
    int lower = !(given(x[0]) && tpl_truthy(x[0]));
    tlist *items = tpl_iterate(c, at, self);
    tdict *seen = tpl_dict_new(c, at);
    for (size_t i = 0; i < items->n; i++) {
        val k = attr_get(c, at, items->v[i], x[1], v_undef(), lower);
        if (k.t == V_LIST && !IS_TUPLE(VLIST(k)))
            tpl_fail(c, at, TPL_ERR_RUNTIME, "unhashable type: '%s'", tpl_type_name(k));
        if (tpl_dict_find(c, at, seen, k)) {
            tpl_release(c, k);
            continue;
        }
        tpl_dict_set(c, at, seen, k, v_none());
        tpl_list_push(c, at, out, vref(items->v[i]));
    }
    tpl_release(c, v_obj(V_DICT, seen));
    tpl_release(c, v_obj(V_LIST, items));
}
BUILTIN(f_unique) {
    return lazy(c, at, self, a, fill_unique);
}

BUILTIN(f_wordcount) {
    tpl_bind(c, at, "wordcount", a, "", NULL, 0);
    val sv = tpl_str_of(c, at, self);
    tstr *s = VSTR(sv);
    tpl_step(c, at, s->len / 4);
    int64_t n = 0;
    int in = 0;
    for (size_t i = 0; i < s->len;) {
        int w = tpl_is_word(tpl_utf8_next(s->s, s->len, &i));
        if (w && !in) n++;
        in = w;
    }
    tpl_release(c, sv);
    return v_int(n);
}

BUILTIN(f_format) {
    val sv = tpl_str_of(c, at, self);
    val args;
    if (a->n && a->nkw)
        tpl_fail(c, at, TPL_ERR_RUNTIME,
                 "can't handle positional and keyword arguments at the same time");
    if (a->nkw) {
        tdict *d = tpl_dict_new(c, at);
        for (size_t i = 0; i < a->nkw; i++) tpl_dict_set(c, at, d, vref(a->kwn[i]), vref(a->kw[i]));
        args = v_obj(V_DICT, d);
    } else {
        tlist *l = tpl_list_new(c, at, a->n);
        l->tuple = L_TUPLE;
        for (size_t i = 0; i < a->n; i++) tpl_list_push(c, at, l, vref(a->pos[i]));
        args = v_obj(V_LIST, l);
    }
    val r = tpl_percent_format(c, at, VSTR(sv), args);
    tpl_release(c, args);
    tpl_release(c, sv);
    return r;
}

BUILTIN(f_groupby) {
    val x[3];
    tpl_bind(c, at, "groupby", a, "attribute,default=,case_sensitive=", x, 3);
    int lower = !(given(x[2]) && tpl_truthy(x[2]));
    tlist *items = tpl_iterate(c, at, self);
    tlist *sorted = sorted_by(c, at, items, x[0], lower, 0, -1);
    tlist *out = tpl_list_new(c, at, 0);
    val prevk = v_undef();
    tlist *grp = NULL;
    for (size_t i = 0; i < sorted->n; i++) {
        val k = attr_get(c, at, sorted->v[i], x[0], x[1], lower);
        if (!grp || !tpl_equal(c, at, k, prevk)) {
            tlist *t = tpl_list_new(c, at, 2);
            t->tuple = L_GROUP;
            /* the grouper is the real key of the group's first item, not its lowered form */
            tpl_list_push(c, at, t, attr_get(c, at, sorted->v[i], x[0], x[1], 0));
            grp = tpl_list_new(c, at, 4);
            tpl_list_push(c, at, t, v_obj(V_LIST, grp));
            tpl_list_push(c, at, out, v_obj(V_LIST, t));
        }
        tpl_list_push(c, at, grp, vref(sorted->v[i]));
        tpl_release(c, prevk);
        prevk = k;
    }
    tpl_release(c, prevk);
    tpl_release(c, v_obj(V_LIST, sorted));
    tpl_release(c, v_obj(V_LIST, items));
    return v_obj(V_LIST, out);
}

static const builtin filters[] = {
    {"abs", f_abs},
    {"attr", f_attr},
    {"batch", f_batch},
    {"capitalize", f_capitalize},
    {"center", f_center},
    {"count", f_length},
    {"d", f_default},
    {"default", f_default},
    {"dictsort", f_dictsort},
    {"e", f_escape},
    {"escape", f_escape},
    {"first", f_first},
    {"float", f_float},
    {"forceescape", f_forceescape},
    {"format", f_format},
    {"groupby", f_groupby},
    {"indent", f_indent},
    {"int", f_int},
    {"items", f_items},
    {"join", f_join},
    {"last", f_last},
    {"length", f_length},
    {"list", f_list},
    {"lower", f_lower},
    {"map", f_map},
    {"max", f_max},
    {"min", f_min},
    {"pprint", f_pprint},
    {"reject", f_reject},
    {"rejectattr", f_rejectattr},
    {"replace", f_replace},
    {"reverse", f_reverse},
    {"round", f_round},
    {"safe", f_safe},
    {"select", f_select},
    {"selectattr", f_selectattr},
    {"slice", f_slice},
    {"sort", f_sort},
    {"string", f_string},
    {"sum", f_sum},
    {"title", f_title},
    {"tojson", f_tojson},
    {"trim", f_trim},
    {"truncate", f_truncate},
    {"unique", f_unique},
    {"upper", f_upper},
    {"wordcount", f_wordcount},
    {NULL, NULL},
};

/* ---- tests ----------------------------------------------------------------------------- */

static val tv(int b) {
    return v_bool(b);
}

#define TEST0(fname, expr)                                                                         \
    BUILTIN(fname) {                                                                               \
        tpl_bind(c, at, &#fname[2], a, "", NULL, 0);                                               \
        return tv(expr);                                                                           \
    }
TEST0(t_defined, self.t != V_UNDEF)
TEST0(t_undefined, self.t == V_UNDEF)
TEST0(t_none, self.t == V_NONE)
TEST0(t_boolean, self.t == V_BOOL)
TEST0(t_false, self.t == V_BOOL && !self.u.i)
TEST0(t_true, self.t == V_BOOL && self.u.i)
TEST0(t_integer, self.t == V_INT)
TEST0(t_float, self.t == V_FLOAT)
TEST0(t_number, is_num(self))
TEST0(t_string, self.t == V_STR)
TEST0(t_mapping, self.t == V_DICT)
TEST0(t_sequence,
      self.t == V_STR || (self.t == V_LIST && IS_PLAIN(VLIST(self))) || self.t == V_DICT)
/* an Undefined is iterable (empty) and callable (raising), as in jinja2 */
TEST0(t_iterable, self.t == V_STR || self.t == V_LIST || self.t == V_DICT || self.t == V_UNDEF ||
                      self.t == V_LOOP)
TEST0(t_callable,
      (self.t == V_FUNC && VFUNC(self)->kind != F_CYCLER) || self.t == V_UNDEF || self.t == V_LOOP)
TEST0(t_escaped, self.t == V_STR && self.safe)

static val str_test(tctx *c, const node *at, val self, const targs *a, int upper) {
    tpl_bind(c, at, upper ? "upper" : "lower", a, "", NULL, 0);
    val s = tpl_str_of(c, at, self);
    tpl_step(c, at, VSTR(s)->len / 8);
    int r = upper ? str_isupper(VSTR(s)) : str_islower(VSTR(s));
    tpl_release(c, s);
    return tv(r);
}
BUILTIN(t_lower) {
    return str_test(c, at, self, a, 0);
}
BUILTIN(t_upper) {
    return str_test(c, at, self, a, 1);
}

static val mod_test(tctx *c, const node *at, val self, val by, int64_t want) {
    val m = tpl_arith(c, at, OP_MOD, self, by);
    int r = tpl_equal(c, at, m, v_int(want));
    tpl_release(c, m);
    return tv(r);
}
BUILTIN(t_odd) {
    tpl_bind(c, at, "odd", a, "", NULL, 0);
    return mod_test(c, at, self, v_int(2), 1);
}
BUILTIN(t_even) {
    tpl_bind(c, at, "even", a, "", NULL, 0);
    return mod_test(c, at, self, v_int(2), 0);
}
BUILTIN(t_divisibleby) {
    val x[1];
    tpl_bind(c, at, "divisibleby", a, "num", x, 1);
    return mod_test(c, at, self, x[0], 0);
}

#define TEST_CMP(fname, op)                                                                        \
    BUILTIN(fname) {                                                                               \
        val x[1];                                                                                  \
        tpl_bind(c, at, &#fname[2], a, "other", x, 1);                                             \
        int r = tpl_compare(c, at, self, x[0], #op);                                               \
        return tv(r != 2 && r op 0);                                                               \
    }
TEST_CMP(t_gt, >)
TEST_CMP(t_ge, >=)
TEST_CMP(t_lt, <)
TEST_CMP(t_le, <=)

BUILTIN(t_eq) {
    val x[1];
    tpl_bind(c, at, "eq", a, "other", x, 1);
    return tv(tpl_equal(c, at, self, x[0]));
}
BUILTIN(t_ne) {
    val x[1];
    tpl_bind(c, at, "ne", a, "other", x, 1);
    return tv(!tpl_equal(c, at, self, x[0]));
}
BUILTIN(t_in) {
    val x[1];
    tpl_bind(c, at, "in", a, "seq", x, 1);
    switch (x[0].t) {
    case V_UNDEF:
        return tv(0);
    case V_STR:
        if (self.t != V_STR)
            tpl_fail(c, at, TPL_ERR_RUNTIME,
                     "'in <string>' requires string as left operand, not %s", tpl_type_name(self));
        return tv(!VSTR(self)->len ||
                  memmem(VSTR(x[0])->s, VSTR(x[0])->len, VSTR(self)->s, VSTR(self)->len) != NULL);
    case V_LIST:
        for (size_t i = 0; i < VLIST(x[0])->n; i++)
            if (tpl_equal(c, at, VLIST(x[0])->v[i], self)) return tv(1);
        return tv(0);
    case V_DICT:
        return tv(tpl_dict_find(c, at, VDICT(x[0]), self) != NULL);
    default:
        tpl_fail(c, at, TPL_ERR_RUNTIME, "argument of type '%s' is not iterable",
                 tpl_type_name(x[0]));
    }
}
BUILTIN(t_sameas) {
    val x[1];
    tpl_bind(c, at, "sameas", a, "other", x, 1);
    val o = x[0];
    if (self.t != o.t) return tv(0);
    switch (self.t) {
    case V_NONE:
    case V_UNDEF:
        return tv(self.u.o == o.u.o || self.t == V_NONE);
    case V_BOOL:
        return tv(self.u.i == o.u.i);
    case V_INT:
        return tv(self.u.i == o.u.i && self.u.i >= -5 && self.u.i <= 256);
    case V_FLOAT:
        return tv(0);
    default:
        return tv(self.u.o == o.u.o);
    }
}
BUILTIN(t_filter) {
    tpl_bind(c, at, "filter", a, "", NULL, 0);
    return tv(self.t == V_STR && tpl_find_filter(VSTR(self)->s));
}
BUILTIN(t_test) {
    tpl_bind(c, at, "test", a, "", NULL, 0);
    return tv(self.t == V_STR && tpl_find_test(VSTR(self)->s));
}

static const builtin tests[] = {
    {"!=", t_ne},
    {"<", t_lt},
    {"<=", t_le},
    {"==", t_eq},
    {">", t_gt},
    {">=", t_ge},
    {"boolean", t_boolean},
    {"callable", t_callable},
    {"defined", t_defined},
    {"divisibleby", t_divisibleby},
    {"eq", t_eq},
    {"equalto", t_eq},
    {"escaped", t_escaped},
    {"even", t_even},
    {"false", t_false},
    {"filter", t_filter},
    {"float", t_float},
    {"ge", t_ge},
    {"greaterthan", t_gt},
    {"gt", t_gt},
    {"in", t_in},
    {"integer", t_integer},
    {"iterable", t_iterable},
    {"le", t_le},
    {"lessthan", t_lt},
    {"lower", t_lower},
    {"lt", t_lt},
    {"mapping", t_mapping},
    {"ne", t_ne},
    {"none", t_none},
    {"number", t_number},
    {"odd", t_odd},
    {"sameas", t_sameas},
    {"sequence", t_sequence},
    {"string", t_string},
    {"test", t_test},
    {"true", t_true},
    {"undefined", t_undefined},
    {"upper", t_upper},
    {NULL, NULL},
};

/* ---- globals --------------------------------------------------------------------------- */

#define MAX_RANGE 100000 /* the sandbox's limit */

BUILTIN(g_range) {
    (void)self;
    if (a->nkw) tpl_fail(c, at, TPL_ERR_RUNTIME, "range() takes no keyword arguments");
    if (a->n < 1 || a->n > 3)
        tpl_fail(c, at, TPL_ERR_RUNTIME, "range expected 1 to 3 arguments, got %zu", a->n);
    int64_t start = 0, stop, step = 1;
    for (size_t i = 0; i < a->n; i++)
        if (!is_int(a->pos[i])) {
            if (a->pos[i].t == V_UNDEF) tpl_fail_undef(c, at, a->pos[i]);
            tpl_fail(c, at, TPL_ERR_RUNTIME, "'%s' object cannot be interpreted as an integer",
                     tpl_type_name(a->pos[i]));
        }
    if (a->n == 1) {
        stop = a->pos[0].u.i;
    } else {
        start = a->pos[0].u.i;
        stop = a->pos[1].u.i;
        if (a->n == 3) step = a->pos[2].u.i;
    }
    if (step == 0) tpl_fail(c, at, TPL_ERR_RUNTIME, "range() arg 3 must not be zero");
    /* count without overflow */
    long double span = step > 0 ? (long double)stop - start : (long double)start - stop;
    long double cnt =
        span <= 0 ? 0 : ceill(span / (step > 0 ? (long double)step : -(long double)step));
    if (cnt > MAX_RANGE)
        tpl_fail(c, at, TPL_ERR_LIMIT,
                 "Range too big. The sandbox blocks ranges larger than MAX_RANGE (%d).", MAX_RANGE);
    size_t n = (size_t)cnt;
    tlist *l = tpl_list_new(c, at, n);
    l->tuple = L_RANGE;
    l->rstart = start;
    l->rstop = stop;
    l->rstep = step;
    for (size_t i = 0; i < n; i++) tpl_list_push(c, at, l, v_int(start + (int64_t)i * step));
    tpl_step(c, at, n / 8);
    return v_obj(V_LIST, l);
}

/* dict(mapping or pairs, **kw) into d */
static void dict_fill(tctx *c, const node *at, tdict *d, const targs *a, const char *fname) {
    if (a->n > 1)
        tpl_fail(c, at, TPL_ERR_RUNTIME, "%s expected at most 1 argument, got %zu", fname, a->n);
    if (a->n == 1) {
        val src = a->pos[0];
        if (src.t == V_DICT || src.t == V_NS) {
            tdict *s = VDICT(src);
            for (size_t i = 0; i < s->n; i++)
                tpl_dict_set(c, at, d, vref(s->e[i].k), vref(s->e[i].v));
        } else {
            tlist *items = tpl_iterate(c, at, src);
            for (size_t i = 0; i < items->n; i++) {
                tlist *pair = tpl_iterate(c, at, items->v[i]);
                if (pair->n != 2)
                    tpl_fail(
                        c, at, TPL_ERR_RUNTIME,
                        "dictionary update sequence element #%zu has length %zu; 2 is required", i,
                        pair->n);
                tpl_dict_set(c, at, d, vref(pair->v[0]), vref(pair->v[1]));
                tpl_release(c, v_obj(V_LIST, pair));
            }
            tpl_release(c, v_obj(V_LIST, items));
        }
    }
    for (size_t i = 0; i < a->nkw; i++) tpl_dict_set(c, at, d, vref(a->kwn[i]), vref(a->kw[i]));
}

BUILTIN(g_dict) {
    (void)self;
    tdict *d = tpl_dict_new(c, at);
    val r = v_obj(V_DICT, d);
    dict_fill(c, at, d, a, "dict");
    return r;
}

BUILTIN(g_namespace) {
    (void)self;
    tdict *d = tpl_dict_new(c, at);
    val r = v_obj(V_NS, d);
    dict_fill(c, at, d, a, "namespace");
    for (size_t i = 0; i < d->n; i++)
        if (d->e[i].k.t != V_STR)
            tpl_fail(c, at, TPL_ERR_RUNTIME, "namespace keys must be strings");
    return r;
}

BUILTIN(g_raise_exception) {
    (void)self;
    val x[1];
    tpl_bind(c, at, "raise_exception", a, "message", x, 1);
    val s = tpl_str_of(c, at, x[0]);
    tpl_fail(c, at, TPL_ERR_RAISED, "%s", VSTR(s)->s);
}

BUILTIN(g_strftime_now) {
    (void)self;
    val x[1];
    tpl_bind(c, at, "strftime_now", a, "format", x, 1);
    tstr *fmt = need_str(c, at, x[0], "format");
    time_t t = (time_t)c->now;
    struct tm tmv;
    if (!localtime_r(&t, &tmv)) tpl_fail(c, at, TPL_ERR_RUNTIME, "the clock cannot be read");
    /* a sentinel character tells an empty result from a buffer that is too small */
    size_t cap = fmt->len * 4 + 64;
    if (cap > 65536) tpl_fail(c, at, TPL_ERR_LIMIT, "strftime format too long");
    tstr *f2 = tpl_str_new(c, at, fmt->len + 1);
    tpl_str_add(c, at, f2, fmt->s, fmt->len);
    tpl_str_addc(c, at, f2, 'x');
    tstr *out = tpl_str_new(c, at, cap);
    size_t n = strftime(out->s, cap, f2->s, &tmv);
    if (n == 0) tpl_fail(c, at, TPL_ERR_RUNTIME, "strftime result too long");
    out->len = n - 1;
    out->s[out->len] = 0;
    out->ncp = -1;
    tpl_release(c, v_obj(V_STR, f2));
    return v_obj(V_STR, out);
}

BUILTIN(g_joiner) {
    (void)self;
    val x[1];
    tpl_bind(c, at, "joiner", a, "sep=", x, 1);
    tfunc *f = tpl_alloc(c, sizeof(tfunc), O_FUNC);
    f->kind = F_JOINER;
    f->name = "joiner";
    f->self = given(x[0]) ? tpl_str_of(c, at, x[0]) : tpl_str_val(c, at, ", ", 2);
    return v_obj(V_FUNC, f);
}

BUILTIN(g_cycler) {
    (void)self;
    if (a->nkw) tpl_fail(c, at, TPL_ERR_RUNTIME, "cycler() takes no keyword arguments");
    if (!a->n) tpl_fail(c, at, TPL_ERR_RUNTIME, "at least one item has to be provided");
    tlist *items = tpl_list_new(c, at, a->n);
    for (size_t i = 0; i < a->n; i++) tpl_list_push(c, at, items, vref(a->pos[i]));
    tfunc *f = tpl_alloc(c, sizeof(tfunc), O_FUNC);
    f->kind = F_CYCLER;
    f->name = "cycler";
    f->self = v_obj(V_LIST, items);
    return v_obj(V_FUNC, f);
}

static const builtin globals[] = {
    {"cycler", g_cycler},
    {"dict", g_dict},
    {"joiner", g_joiner},
    {"namespace", g_namespace},
    {"raise_exception", g_raise_exception},
    {"range", g_range},
    {"strftime_now", g_strftime_now},
    {NULL, NULL},
};

static const builtin *find(const builtin *t, const char *name) {
    for (; t->name; t++)
        if (!strcmp(t->name, name)) return t;
    return NULL;
}

const builtin *tpl_find_filter(const char *name) {
    return find(filters, name);
}
const builtin *tpl_find_test(const char *name) {
    return find(tests, name);
}
const builtin *tpl_find_global(const char *name) {
    return find(globals, name);
}

val tpl_call_filter(tctx *c, const node *at, const char *name, val self, const targs *a) {
    const builtin *b = find(filters, name);
    if (!b) tpl_fail(c, at, TPL_ERR_RUNTIME, "No filter named '%s'.", name);
    return b->fn(c, at, self, a);
}

int tpl_call_test(tctx *c, const node *at, const char *name, val v, const targs *a) {
    const builtin *b = find(tests, name);
    if (!b) tpl_fail(c, at, TPL_ERR_RUNTIME, "No test named '%s'.", name);
    val r = b->fn(c, at, v, a);
    int t = tpl_truthy(r);
    tpl_release(c, r);
    return t;
}

val tpl_cycler_current(tctx *c, val cy) {
    (void)c;
    tfunc *f = VFUNC(cy);
    tlist *items = VLIST(f->self);
    return vref(items->v[(size_t)f->state % items->n]);
}
