/* Python's string formatting as templates reach it: printf-style `fmt % args` (and the
 * `format` filter) and str.format() with the format-spec mini-language. */
#include "tpl_internal.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* pad text to width (in code points); align '<', '>', '^' or '=' (after a sign) */
static void pad_add(tctx *c, const node *at, tstr *out, const char *p, size_t n, int64_t width,
                    char align, int32_t fill) {
    int64_t len = 0;
    for (size_t i = 0; i < n;) {
        tpl_utf8_next(p, n, &i);
        len++;
    }
    int64_t padn = width > len ? width - len : 0;
    if (padn > (int64_t)c->max_output)
        tpl_fail(c, at, TPL_ERR_LIMIT, "output size limit exceeded (%zu bytes)", c->max_output);
    int64_t left = align == '>' ? padn : align == '^' ? padn / 2 : 0;
    int64_t right = padn - left;
    size_t signlen = 0;
    if (align == '=' && n && (p[0] == '-' || p[0] == '+' || p[0] == ' ')) signlen = 1;
    if (align == '=' && n > signlen + 1 && p[signlen] == '0' &&
        (p[signlen + 1] == 'x' || p[signlen + 1] == 'X' || p[signlen + 1] == 'o' ||
         p[signlen + 1] == 'b'))
        signlen += 2;
    if (align == '=') {
        tpl_str_add(c, at, out, p, signlen);
        left = padn;
        right = 0;
        p += signlen;
        n -= signlen;
    }
    for (int64_t i = 0; i < left; i++) tpl_str_add_cp(c, at, out, fill);
    tpl_str_add(c, at, out, p, n);
    for (int64_t i = 0; i < right; i++) tpl_str_add_cp(c, at, out, fill);
}

static int is_int(val v) {
    return v.t == V_INT || v.t == V_BOOL;
}

/* ---- printf-style ---------------------------------------------------------------------- */

val tpl_percent_format(tctx *c, const node *at, tstr *fmt, val args) {
    tlist *tuple = args.t == V_LIST && IS_TUPLE(VLIST(args)) ? VLIST(args) : NULL;
    tdict *map = args.t == V_DICT ? VDICT(args) : NULL;
    /* Python takes any non-tuple with __getitem__ (a list, an Undefined) for a mapping: then
     * leftover arguments are no error */
    int maplike = map || args.t == V_UNDEF || (args.t == V_LIST && IS_PLAIN(VLIST(args)) && !tuple);
    size_t argi = 0, nargs = tuple ? tuple->n : 1;
    int used_map = 0;
    tstr *out = tpl_str_new(c, at, fmt->len + 16);
    const char *s = fmt->s;
    size_t n = fmt->len;
#define NEXT_ARG()                                                                                 \
    (argi < nargs                                                                                  \
         ? (tuple ? tuple->v[argi++] : (argi++, args))                                             \
         : (tpl_fail(c, at, TPL_ERR_RUNTIME, "not enough arguments for format string"), args))
    for (size_t i = 0; i < n;) {
        if (s[i] != '%') {
            size_t j = i;
            while (j < n && s[j] != '%') j++;
            tpl_str_add(c, at, out, s + i, j - i);
            i = j;
            continue;
        }
        size_t start = i++;
        val v;
        int have_v = 0;
        if (i < n && s[i] == '(') {
            if (!map) tpl_fail(c, at, TPL_ERR_RUNTIME, "format requires a mapping");
            size_t j = ++i;
            int depth = 1;
            while (j < n && depth) {
                if (s[j] == '(') depth++;
                if (s[j] == ')') depth--;
                if (depth) j++;
            }
            if (j >= n) tpl_fail(c, at, TPL_ERR_RUNTIME, "incomplete format key");
            dent *e = tpl_dict_find(c, at, map, tpl_str_val(c, at, s + i, j - i));
            if (!e)
                tpl_fail(c, at, TPL_ERR_RUNTIME, "format key '%.*s' not found", (int)(j - i),
                         s + i);
            v = e->v;
            have_v = 1;
            used_map = 1;
            i = j + 1;
        }
        int left = 0, zero = 0, plus = 0, space = 0, alt = 0;
        for (; i < n; i++) {
            if (s[i] == '-')
                left = 1;
            else if (s[i] == '0')
                zero = 1;
            else if (s[i] == '+')
                plus = 1;
            else if (s[i] == ' ')
                space = 1;
            else if (s[i] == '#')
                alt = 1;
            else
                break;
        }
        int64_t width = -1, prec = -1;
        if (i < n && s[i] == '*') {
            val w = NEXT_ARG();
            if (!is_int(w)) tpl_fail(c, at, TPL_ERR_RUNTIME, "* wants int");
            width = w.u.i;
            if (width < 0) {
                left = 1;
                width = -width;
            }
            i++;
        } else {
            while (i < n && s[i] >= '0' && s[i] <= '9') {
                width = (width < 0 ? 0 : width) * 10 + (s[i++] - '0');
                if (width > 1000000) tpl_fail(c, at, TPL_ERR_LIMIT, "width too big");
            }
        }
        if (i < n && s[i] == '.') {
            i++;
            prec = 0;
            if (i < n && s[i] == '*') {
                val w = NEXT_ARG();
                if (!is_int(w)) tpl_fail(c, at, TPL_ERR_RUNTIME, "* wants int");
                prec = w.u.i < 0 ? 0 : w.u.i;
                i++;
            } else {
                while (i < n && s[i] >= '0' && s[i] <= '9') {
                    prec = prec * 10 + (s[i++] - '0');
                    if (prec > 10000) tpl_fail(c, at, TPL_ERR_LIMIT, "precision too big");
                }
            }
        }
        while (i < n && (s[i] == 'h' || s[i] == 'l' || s[i] == 'L')) i++;
        if (i >= n) tpl_fail(c, at, TPL_ERR_RUNTIME, "incomplete format");
        char conv = s[i++];
        if (conv == '%') {
            tpl_str_addc(c, at, out, '%');
            continue;
        }
        if (!have_v) v = map ? args : NEXT_ARG();
        tstr *tmp = tpl_str_new(c, at, 32);
        char cf[32];
        switch (conv) {
        case 's':
        case 'r':
        case 'a': {
            if (conv == 's')
                tpl_to_str(c, at, tmp, v);
            else
                tpl_repr(c, at, tmp, v, 0);
            size_t len = tmp->len;
            if (prec >= 0) { /* precision counts code points */
                size_t k = 0;
                for (int64_t q = 0; q < prec && k < tmp->len; q++)
                    tpl_utf8_next(tmp->s, tmp->len, &k);
                len = k;
            }
            pad_add(c, at, out, tmp->s, len, width, left ? '<' : '>', ' ');
            tpl_release(c, v_obj(V_STR, tmp));
            continue;
        }
        case 'c': {
            if (v.t == V_STR && tpl_str_ncp(VSTR(v)) == 1)
                tpl_str_add(c, at, tmp, VSTR(v)->s, VSTR(v)->len);
            else if (is_int(v) && v.u.i >= 0 && v.u.i <= 0x10FFFF)
                tpl_str_add_cp(c, at, tmp, (int32_t)v.u.i);
            else
                tpl_fail(c, at, TPL_ERR_RUNTIME, "%%c requires int or char");
            pad_add(c, at, out, tmp->s, tmp->len, width, left ? '<' : '>', ' ');
            tpl_release(c, v_obj(V_STR, tmp));
            continue;
        }
        case 'd':
        case 'i':
        case 'u':
        case 'o':
        case 'x':
        case 'X': {
            int64_t x;
            if (is_int(v))
                x = v.u.i;
            else if (v.t == V_FLOAT && (conv == 'd' || conv == 'i' || conv == 'u')) {
                if (!isfinite(v.u.f) || fabs(v.u.f) >= 9.2e18)
                    tpl_fail(c, at, TPL_ERR_RUNTIME, "cannot convert float to integer");
                x = (int64_t)v.u.f;
            } else if (v.t == V_UNDEF) {
                tpl_fail_undef(c, at, v);
            } else {
                tpl_fail(c, at, TPL_ERR_RUNTIME, "%%%c format: %s is required, not %s", conv,
                         conv == 'd' || conv == 'i' || conv == 'u' ? "a real number" : "an integer",
                         tpl_type_name(v));
            }
            char cc = conv == 'i' || conv == 'u' ? 'd' : conv;
            unsigned long long ux =
                x < 0 ? (unsigned long long)0 - (unsigned long long)x : (unsigned long long)x;
            char digits[80];
            snprintf(digits, sizeof digits,
                     cc == 'd'   ? "%llu"
                     : cc == 'o' ? "%llo"
                     : cc == 'x' ? "%llx"
                                 : "%llX",
                     ux);
            size_t nd = strlen(digits);
            const char *prefix = !alt || cc == 'd' ? ""
                                 : cc == 'o'       ? "0o"
                                 : cc == 'x'       ? "0x"
                                                   : "0X";
            tpl_str_add(c, at, tmp,
                        x < 0   ? "-"
                        : plus  ? "+"
                        : space ? " "
                                : "",
                        x < 0 || plus || space ? 1 : 0);
            tpl_str_add(c, at, tmp, prefix, strlen(prefix));
            for (int64_t q = (int64_t)nd; q < prec; q++) tpl_str_addc(c, at, tmp, '0');
            tpl_str_add(c, at, tmp, digits, nd);
            pad_add(c, at, out, tmp->s, tmp->len, width, left ? '<' : (zero ? '=' : '>'),
                    zero && !left ? '0' : ' ');
            tpl_release(c, v_obj(V_STR, tmp));
            continue;
        }
        case 'e':
        case 'E':
        case 'f':
        case 'F':
        case 'g':
        case 'G': {
            double x;
            if (v.t == V_FLOAT)
                x = v.u.f;
            else if (is_int(v))
                x = (double)v.u.i;
            else if (v.t == V_UNDEF)
                tpl_fail_undef(c, at, v);
            else
                tpl_fail(c, at, TPL_ERR_RUNTIME, "must be real number, not %s", tpl_type_name(v));
            snprintf(cf, sizeof cf, "%%%s%s%s.*%c", plus ? "+" : "", space ? " " : "",
                     alt ? "#" : "", conv);
            char buf[512];
            int pr = prec < 0 ? 6 : (int)(prec > 300 ? 300 : prec);
            snprintf(buf, sizeof buf, cf, pr, x);
            tpl_release(c, v_obj(V_STR, tmp));
            pad_add(c, at, out, buf, strlen(buf), width,
                    left ? '<' : (zero && isfinite(x) ? '=' : '>'),
                    zero && !left && isfinite(x) ? '0' : ' ');
            continue;
        }
        default:
            tpl_fail(c, at, TPL_ERR_RUNTIME,
                     "unsupported format character '%c' (0x%x) at index %zu", conv,
                     (unsigned char)conv, start + (size_t)(i - start - 1));
        }
    }
    if (!maplike && argi < nargs && !used_map)
        tpl_fail(c, at, TPL_ERR_RUNTIME, "not all arguments converted during string formatting");
#undef NEXT_ARG
    return v_obj(V_STR, out);
}

/* ---- str.format ------------------------------------------------------------------------ */

typedef struct {
    int32_t fill;
    char align, sign, type, grouping;
    int alt, zero;
    int64_t width, prec;
} fspec;

static void parse_spec(tctx *c, const node *at, const char *s, size_t n, fspec *f) {
    memset(f, 0, sizeof *f);
    f->fill = ' ';
    f->width = -1;
    f->prec = -1;
    size_t i = 0;
    size_t j = 0;
    int32_t cp0 = n ? tpl_utf8_next(s, n, &j) : 0;
    if (j < n && (s[j] == '<' || s[j] == '>' || s[j] == '^' || s[j] == '=')) {
        f->fill = cp0;
        f->align = s[j];
        i = j + 1;
    } else if (i < n && (s[i] == '<' || s[i] == '>' || s[i] == '^' || s[i] == '=')) {
        f->align = s[i++];
    }
    if (i < n && (s[i] == '+' || s[i] == '-' || s[i] == ' ')) f->sign = s[i++];
    if (i < n && s[i] == 'z') i++;
    if (i < n && s[i] == '#') {
        f->alt = 1;
        i++;
    }
    if (i < n && s[i] == '0') {
        f->zero = 1;
        i++;
    }
    while (i < n && s[i] >= '0' && s[i] <= '9') {
        f->width = (f->width < 0 ? 0 : f->width) * 10 + (s[i++] - '0');
        if (f->width > 1000000) tpl_fail(c, at, TPL_ERR_LIMIT, "format width too big");
    }
    if (i < n && (s[i] == ',' || s[i] == '_')) f->grouping = s[i++];
    if (i < n && s[i] == '.') {
        i++;
        if (i >= n || s[i] < '0' || s[i] > '9')
            tpl_fail(c, at, TPL_ERR_RUNTIME, "Format specifier missing precision");
        f->prec = 0;
        while (i < n && s[i] >= '0' && s[i] <= '9') {
            f->prec = f->prec * 10 + (s[i++] - '0');
            if (f->prec > 10000) tpl_fail(c, at, TPL_ERR_LIMIT, "format precision too big");
        }
    }
    if (i < n) f->type = s[i++];
    if (i < n) tpl_fail(c, at, TPL_ERR_RUNTIME, "Invalid format specifier '%.*s'", (int)n, s);
}

static void group_digits(char *buf, size_t cap, char sep) {
    /* buf: [sign]digits[.rest]; inserts sep every three integer digits */
    char *p = buf;
    if (*p == '-' || *p == '+' || *p == ' ') p++;
    size_t nd = 0;
    while (p[nd] >= '0' && p[nd] <= '9') nd++;
    if (nd <= 3) return;
    size_t nsep = (nd - 1) / 3, len = strlen(buf);
    if (len + nsep + 1 > cap) return;
    char *end = p + nd;
    memmove(end + nsep, end, strlen(end) + 1);
    char *src = end - 1, *dst = end + nsep - 1;
    for (size_t k = 0; k < nd; k++) {
        *dst-- = *src--;
        if ((k + 1) % 3 == 0 && k + 1 < nd) *dst-- = sep;
    }
}

static void format_value(tctx *c, const node *at, tstr *out, val v, const char *spec, size_t n) {
    fspec f;
    parse_spec(c, at, spec, n, &f);
    char buf[512];
    if (v.t == V_UNDEF) tpl_fail_undef(c, at, v);
    int numeric = v.t == V_INT || v.t == V_BOOL || v.t == V_FLOAT;
    if (!numeric || (v.t == V_BOOL && !f.type && !n)) {
        if (f.type && f.type != 's')
            tpl_fail(c, at, TPL_ERR_RUNTIME, "Unknown format code '%c' for object of type '%s'",
                     f.type, tpl_type_name(v));
        tstr *s = tpl_str_new(c, at, 32);
        tpl_to_str(c, at, s, v);
        size_t len = s->len;
        if (f.prec >= 0) {
            size_t k = 0;
            for (int64_t q = 0; q < f.prec && k < s->len; q++) tpl_utf8_next(s->s, s->len, &k);
            len = k;
        }
        pad_add(c, at, out, s->s, len, f.width, f.align ? f.align : '<', f.fill);
        tpl_release(c, v_obj(V_STR, s));
        return;
    }
    char t = f.type;
    const char *sg = f.sign == '+' ? "+" : f.sign == ' ' ? " " : "";
    if (v.t != V_FLOAT &&
        (!t || t == 'd' || t == 'n' || t == 'x' || t == 'X' || t == 'o' || t == 'b' || t == 'c')) {
        int64_t x = v.u.i;
        if (f.prec >= 0)
            tpl_fail(c, at, TPL_ERR_RUNTIME, "Precision not allowed in integer format specifier");
        unsigned long long ux =
            x < 0 ? (unsigned long long)0 - (unsigned long long)x : (unsigned long long)x;
        const char *sign = x < 0 ? "-" : sg;
        if (t == 'c') {
            tstr *s = tpl_str_new(c, at, 4);
            tpl_str_add_cp(c, at, s, (int32_t)(x & 0x1FFFFF));
            pad_add(c, at, out, s->s, s->len, f.width, f.align ? f.align : '<', f.fill);
            tpl_release(c, v_obj(V_STR, s));
            return;
        }
        if (t == 'b') {
            char bits[80];
            int k = 0;
            do {
                bits[k++] = (char)('0' + (ux & 1));
                ux >>= 1;
            } while (ux);
            char *o = buf + snprintf(buf, sizeof buf, "%s%s", sign, f.alt ? "0b" : "");
            while (k) *o++ = bits[--k];
            *o = 0;
        } else if (t == 'x' || t == 'X' || t == 'o') {
            snprintf(buf, sizeof buf,
                     t == 'o'   ? "%s%s%llo"
                     : t == 'x' ? "%s%s%llx"
                                : "%s%s%llX",
                     sign,
                     f.alt ? (t == 'o'   ? "0o"
                              : t == 'x' ? "0x"
                                         : "0X")
                           : "",
                     ux);
        } else {
            snprintf(buf, sizeof buf, "%s%llu", sign, ux);
            if (f.grouping) group_digits(buf, sizeof buf, f.grouping);
        }
    } else {
        double x = v.t == V_FLOAT ? v.u.f : (double)v.u.i;
        if (t && !strchr("eEfFgGn%", t))
            tpl_fail(c, at, TPL_ERR_RUNTIME, "Unknown format code '%c' for object of type '%s'", t,
                     tpl_type_name(v));
        int prec = f.prec < 0 ? 6 : (int)(f.prec > 300 ? 300 : f.prec);
        if (!t) {
            if (f.prec < 0) {
                char r[64];
                tpl_float_repr(x, r, sizeof r);
                snprintf(buf, sizeof buf, "%s%s", x >= 0 && !signbit(x) ? sg : "", r);
            } else {
                /* like 'g', but fixed notation keeps a digit after the point */
                snprintf(buf, sizeof buf, "%s%.*g", x >= 0 ? sg : "", prec ? prec : 1, x);
                if (isfinite(x) && !strchr(buf, '.') && !strchr(buf, 'e') &&
                    strlen(buf) + 3 < sizeof buf)
                    strcat(buf, ".0");
            }
        } else if (t == '%') {
            snprintf(buf, sizeof buf, "%s%.*f%%", x >= 0 ? sg : "", prec, x * 100);
        } else {
            char cf[16];
            snprintf(cf, sizeof cf, "%%%s.*%c", f.alt ? "#" : "", t == 'n' ? 'g' : t);
            char num[400];
            snprintf(num, sizeof num, cf, prec, x);
            snprintf(buf, sizeof buf, "%s%s", x >= 0 && !signbit(x) ? sg : "", num);
        }
        if (f.grouping) group_digits(buf, sizeof buf, f.grouping);
    }
    char align = f.align ? f.align : (f.zero ? '=' : '>');
    int32_t fill = f.align ? f.fill : (f.zero ? '0' : ' ');
    pad_add(c, at, out, buf, strlen(buf), f.width, align, fill);
}

/* "{0.name[key]!r:>10}" style replacement fields */
val tpl_str_format(tctx *c, const node *at, tstr *fmt, const targs *a);
val tpl_str_format(tctx *c, const node *at, tstr *fmt, const targs *a) {
    tstr *out = tpl_str_new(c, at, fmt->len + 16);
    const char *s = fmt->s;
    size_t n = fmt->len;
    int auto_idx = 0, manual = 0;
    for (size_t i = 0; i < n;) {
        char ch = s[i];
        if (ch == '}') {
            if (i + 1 < n && s[i + 1] == '}') {
                tpl_str_addc(c, at, out, '}');
                i += 2;
                continue;
            }
            tpl_fail(c, at, TPL_ERR_RUNTIME, "Single '}' encountered in format string");
        }
        if (ch != '{') {
            size_t j = i;
            while (j < n && s[j] != '{' && s[j] != '}') j++;
            tpl_str_add(c, at, out, s + i, j - i);
            i = j;
            continue;
        }
        if (i + 1 < n && s[i + 1] == '{') {
            tpl_str_addc(c, at, out, '{');
            i += 2;
            continue;
        }
        /* find the matching '}' (one level of nested fields inside the spec) */
        size_t j = i + 1;
        int depth = 1;
        while (j < n && depth) {
            if (s[j] == '{') depth++;
            if (s[j] == '}') depth--;
            if (depth) j++;
        }
        if (j >= n) tpl_fail(c, at, TPL_ERR_RUNTIME, "expected '}' before end of string");
        const char *f = s + i + 1;
        size_t fl = j - i - 1;
        i = j + 1;
        size_t k = 0;
        while (k < fl && f[k] != '.' && f[k] != '[' && f[k] != '!' && f[k] != ':') k++;
        val v;
        if (k == 0) {
            if (manual)
                tpl_fail(c, at, TPL_ERR_RUNTIME,
                         "cannot switch from manual field specification to automatic field "
                         "numbering");
            auto_idx++;
            if ((size_t)(auto_idx - 1) >= a->n)
                tpl_fail(c, at, TPL_ERR_RUNTIME,
                         "Replacement index %d out of range for positional args tuple",
                         auto_idx - 1);
            v = vref(a->pos[auto_idx - 1]);
        } else if (f[0] >= '0' && f[0] <= '9') {
            if (auto_idx)
                tpl_fail(c, at, TPL_ERR_RUNTIME,
                         "cannot switch from automatic field numbering to manual field "
                         "specification");
            manual = 1;
            size_t idx = 0;
            for (size_t q = 0; q < k; q++) {
                if (f[q] < '0' || f[q] > '9' || idx > 100000)
                    tpl_fail(c, at, TPL_ERR_RUNTIME, "bad field name in format string");
                idx = idx * 10 + (size_t)(f[q] - '0');
            }
            if (idx >= a->n)
                tpl_fail(c, at, TPL_ERR_RUNTIME,
                         "Replacement index %zu out of range for positional args tuple", idx);
            v = vref(a->pos[idx]);
        } else {
            size_t q = 0;
            while (q < a->nkw && !(VSTR(a->kwn[q])->len == k && !memcmp(VSTR(a->kwn[q])->s, f, k)))
                q++;
            if (q == a->nkw) tpl_fail(c, at, TPL_ERR_RUNTIME, "KeyError: '%.*s'", (int)k, f);
            v = vref(a->kw[q]);
        }
        /* .attr and [key] */
        while (k < fl && (f[k] == '.' || f[k] == '[')) {
            if (f[k] == '.') {
                size_t e = ++k;
                while (e < fl && f[e] != '.' && f[e] != '[' && f[e] != '!' && f[e] != ':') e++;
                val name = tpl_str_val(c, at, f + k, e - k);
                val nv = tpl_getattr(c, at, v, VSTR(name));
                tpl_release(c, name);
                tpl_release(c, v);
                v = nv;
                k = e;
            } else {
                size_t e = ++k;
                while (e < fl && f[e] != ']') e++;
                if (e >= fl) tpl_fail(c, at, TPL_ERR_RUNTIME, "Missing ']' in format string");
                val key;
                int digits = e > k;
                for (size_t q = k; q < e; q++)
                    if (f[q] < '0' || f[q] > '9') digits = 0;
                if (digits && e - k < 18)
                    key = v_int(strtoll(f + k, NULL, 10));
                else
                    key = tpl_str_val(c, at, f + k, e - k);
                val nv = tpl_getitem(c, at, v, key);
                tpl_release(c, key);
                tpl_release(c, v);
                v = nv;
                k = e + 1;
            }
        }
        char conv = 0;
        if (k < fl && f[k] == '!') {
            if (k + 1 >= fl)
                tpl_fail(c, at, TPL_ERR_RUNTIME,
                         "end of string while looking for conversion specifier");
            conv = f[k + 1];
            k += 2;
            if (conv != 'r' && conv != 's' && conv != 'a')
                tpl_fail(c, at, TPL_ERR_RUNTIME, "Unknown conversion specifier %c", conv);
        }
        const char *spec = "";
        size_t sl = 0;
        if (k < fl) {
            if (f[k] != ':')
                tpl_fail(c, at, TPL_ERR_RUNTIME, "expected ':' after conversion specifier");
            spec = f + k + 1;
            sl = fl - k - 1;
        }
        if (conv) {
            tstr *t = tpl_str_new(c, at, 16);
            if (conv == 's')
                tpl_to_str(c, at, t, v);
            else
                tpl_repr(c, at, t, v, 0);
            tpl_release(c, v);
            v = v_obj(V_STR, t);
        }
        tstr *expanded = NULL;
        if (memchr(spec, '{', sl)) { /* nested fields inside the spec */
            tstr *sub = VSTR(tpl_str_val(c, at, spec, sl));
            val e = tpl_str_format(c, at, sub, a);
            expanded = VSTR(e);
            spec = expanded->s;
            sl = expanded->len;
            tpl_release(c, v_obj(V_STR, sub));
        }
        format_value(c, at, out, v, spec, sl);
        if (expanded) tpl_release(c, v_obj(V_STR, expanded));
        tpl_release(c, v);
    }
    return v_obj(V_STR, out);
}
