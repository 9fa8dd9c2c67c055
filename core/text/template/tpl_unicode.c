/* UTF-8 and the Unicode character classes and case mappings of Python's str methods:
 * utf8proc's categories and simple mappings, plus what tpl_unitab.h (generated from Python)
 * adds: multi-character mappings (ß -> SS), Other_Uppercase/Lowercase, extra digits. */
#include "tpl_internal.h"

#include <utf8proc.h>

#include "tpl_unitab.h"

int32_t tpl_utf8_next(const char *s, size_t n, size_t *i) {
    const unsigned char *p = (const unsigned char *)s + *i;
    size_t left = n - *i;
    unsigned char b = p[0];
    if (b < 0x80) {
        *i += 1;
        return b;
    }
    int len;
    int32_t cp, min;
    if (b >= 0xC2 && b <= 0xDF) {
        len = 2;
        cp = b & 0x1F;
        min = 0x80;
    } else if (b >= 0xE0 && b <= 0xEF) {
        len = 3;
        cp = b & 0x0F;
        min = 0x800;
    } else if (b >= 0xF0 && b <= 0xF4) {
        len = 4;
        cp = b & 0x07;
        min = 0x10000;
    } else {
        goto bad;
    }
    if (left < (size_t)len) goto bad;
    for (int k = 1; k < len; k++) {
        if ((p[k] & 0xC0) != 0x80) goto bad;
        cp = (cp << 6) | (p[k] & 0x3F);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) goto bad;
    *i += (size_t)len;
    return cp;
bad:
    /* surrogateescape: the byte travels as U+DC80..U+DCFF and is written back as it was */
    *i += 1;
    return 0xDC00 + b;
}

size_t tpl_utf8_put(char *out, int32_t cp) {
    unsigned char *o = (unsigned char *)out;
    if (cp >= 0xDC80 && cp <= 0xDCFF) {
        o[0] = (unsigned char)(cp - 0xDC00);
        return 1;
    }
    if (cp < 0 || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) cp = 0xFFFD;
    if (cp < 0x80) {
        o[0] = (unsigned char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (unsigned char)(0xC0 | (cp >> 6));
        o[1] = (unsigned char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (unsigned char)(0xE0 | (cp >> 12));
        o[1] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
        o[2] = (unsigned char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (unsigned char)(0xF0 | (cp >> 18));
    o[1] = (unsigned char)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
    o[3] = (unsigned char)(0x80 | (cp & 0x3F));
    return 4;
}

static int in_ranges(const int32_t (*r)[2], size_t n, int32_t cp) {
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (cp < r[mid][0])
            hi = mid;
        else if (cp > r[mid][1])
            lo = mid + 1;
        else
            return 1;
    }
    return 0;
}
#define IN(tab, cp) in_ranges(tab, sizeof tab / sizeof *tab, cp)

static int ascii_alnum(int32_t cp);

static int cat(int32_t cp) {
    if (cp < 0 || cp > 0x10FFFF) return UTF8PROC_CATEGORY_CN;
    return utf8proc_category(cp);
}

/* Python's str.isspace() (and what re's \s and str.split() take for whitespace) */
int tpl_py_isspace(int32_t cp) {
    if (cp <= 0x20) return cp == ' ' || (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x1F);
    return cp == 0x85 || cp == 0xA0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) ||
           cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

int tpl_is_upper(int32_t cp) {
    return cat(cp) == UTF8PROC_CATEGORY_LU || IN(uni_other_upper, cp);
}

int tpl_is_lower(int32_t cp) {
    return cat(cp) == UTF8PROC_CATEGORY_LL || IN(uni_other_lower, cp);
}

int tpl_is_cased(int32_t cp) {
    return tpl_is_upper(cp) || tpl_is_lower(cp) || cat(cp) == UTF8PROC_CATEGORY_LT;
}

int tpl_is_alpha(int32_t cp) {
    int k = cat(cp);
    return k == UTF8PROC_CATEGORY_LU || k == UTF8PROC_CATEGORY_LL || k == UTF8PROC_CATEGORY_LT ||
           k == UTF8PROC_CATEGORY_LM || k == UTF8PROC_CATEGORY_LO;
}

int tpl_is_decimal(int32_t cp) {
    return cat(cp) == UTF8PROC_CATEGORY_ND;
}

int tpl_is_digit(int32_t cp) {
    return tpl_is_decimal(cp) || IN(uni_digit_extra, cp);
}

int tpl_is_numeric(int32_t cp) {
    int k = cat(cp);
    return k == UTF8PROC_CATEGORY_ND || k == UTF8PROC_CATEGORY_NL || k == UTF8PROC_CATEGORY_NO ||
           IN(uni_numeric_extra, cp);
}

int tpl_is_alnum(int32_t cp) {
    if (cp < 0x80) return ascii_alnum(cp);
    return tpl_is_alpha(cp) || tpl_is_digit(cp) || tpl_is_numeric(cp);
}

static int ascii_alnum(int32_t cp) {
    return (cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z') || (cp >= '0' && cp <= '9');
}

int tpl_is_word(int32_t cp) {
    if (cp < 0x80) return cp == '_' || ascii_alnum(cp);
    return tpl_is_alnum(cp);
}

int tpl_is_printable(int32_t cp) {
    if (cp == ' ') return 1;
    switch (cat(cp)) {
    case UTF8PROC_CATEGORY_CC:
    case UTF8PROC_CATEGORY_CF:
    case UTF8PROC_CATEGORY_CS:
    case UTF8PROC_CATEGORY_CO:
    case UTF8PROC_CATEGORY_CN:
    case UTF8PROC_CATEGORY_ZL:
    case UTF8PROC_CATEGORY_ZP:
    case UTF8PROC_CATEGORY_ZS:
        return 0;
    default:
        return 1;
    }
}

int tpl_is_ident_start(int32_t cp) {
    if (cp < 0x80) return (cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z') || cp == '_';
    return tpl_is_alpha(cp) || cat(cp) == UTF8PROC_CATEGORY_NL;
}

int tpl_is_ident_char(int32_t cp) {
    if (cp < 0x80)
        return (cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z') || (cp >= '0' && cp <= '9') ||
               cp == '_';
    int k = cat(cp);
    return tpl_is_ident_start(cp) || k == UTF8PROC_CATEGORY_MN || k == UTF8PROC_CATEGORY_MC ||
           k == UTF8PROC_CATEGORY_ND || k == UTF8PROC_CATEGORY_PC;
}

static const int32_t *special_case(int32_t cp, int mode) {
    const int32_t(*t)[4];
    size_t n;
    if (mode == CASE_LOWER) {
        t = uni_special_lower;
        n = sizeof uni_special_lower / sizeof *uni_special_lower;
    } else if (mode == CASE_UPPER) {
        t = uni_special_upper;
        n = sizeof uni_special_upper / sizeof *uni_special_upper;
    } else {
        t = uni_special_title;
        n = sizeof uni_special_title / sizeof *uni_special_title;
    }
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (t[mid][0] == cp) return t[mid] + 1;
        if (t[mid][0] < cp)
            lo = mid + 1;
        else
            hi = mid;
    }
    return NULL;
}

void tpl_case_map(tctx *c, const node *at, tstr *s, int32_t cp, int mode) {
    if (cp < 0x80) {
        char ch = (char)cp;
        if (mode == CASE_LOWER) {
            if (ch >= 'A' && ch <= 'Z') ch = (char)(ch + 32);
        } else if (ch >= 'a' && ch <= 'z') {
            ch = (char)(ch - 32);
        }
        tpl_str_addc(c, at, s, ch);
        return;
    }
    if (cp >= 0xDC80 && cp <= 0xDCFF) { /* a raw byte stays as it was */
        tpl_str_add_cp(c, at, s, cp);
        return;
    }
    const int32_t *sp = special_case(cp, mode);
    if (sp) {
        for (int j = 0; j < 3 && sp[j]; j++) tpl_str_add_cp(c, at, s, sp[j]);
        return;
    }
    int32_t r = mode == CASE_LOWER   ? utf8proc_tolower(cp)
                : mode == CASE_UPPER ? utf8proc_toupper(cp)
                                     : utf8proc_totitle(cp);
    tpl_str_add_cp(c, at, s, r);
}

/* Word_Break MidLetter / MidNumLet / Single_Quote, which Python counts as case-ignorable */
static int is_case_ignorable(int32_t cp) {
    switch (cat(cp)) {
    case UTF8PROC_CATEGORY_MN:
    case UTF8PROC_CATEGORY_ME:
    case UTF8PROC_CATEGORY_CF:
    case UTF8PROC_CATEGORY_LM:
    case UTF8PROC_CATEGORY_SK:
        return 1;
    default:
        break;
    }
    return cp == '\'' || cp == '.' || cp == ':' || cp == 0xB7 || cp == 0x387 || cp == 0x5F4 ||
           cp == 0x2018 || cp == 0x2019 || cp == 0x2024 || cp == 0x2027 || cp == 0xFE13 ||
           cp == 0xFE52 || cp == 0xFE55 || cp == 0xFF07 || cp == 0xFF0E || cp == 0xFF1A;
}

void tpl_lower_str(tctx *c, const node *at, tstr *out, const char *p, size_t n) {
    tpl_lower_range(c, at, out, p, n, 0, n);
}

void tpl_lower_range(tctx *c, const node *at, tstr *out, const char *p, size_t n, size_t from,
                     size_t to) {
    for (size_t i = from; i < to;) {
        if ((unsigned char)p[i] < 0x80) { /* a run of ASCII in one go */
            char buf[256];
            size_t k = 0;
            while (i < to && k < sizeof buf && (unsigned char)p[i] < 0x80) {
                char ch = p[i++];
                buf[k++] = (char)(ch >= 'A' && ch <= 'Z' ? ch + 32 : ch);
            }
            tpl_str_add(c, at, out, buf, k);
            continue;
        }
        size_t st = i;
        int32_t cp = tpl_utf8_next(p, n, &i);
        if (cp != 0x3A3) {
            tpl_case_map(c, at, out, cp, CASE_LOWER);
            continue;
        }
        /* capital sigma at the end of a word lowers to final sigma, as CPython does */
        int32_t prev = 0, next = 0;
        int have_prev = 0, have_next = 0;
        for (size_t j = st; j > 0;) {
            size_t k = j - 1;
            while (k > 0 && ((unsigned char)p[k] & 0xC0) == 0x80) k--;
            size_t kk = k;
            prev = tpl_utf8_next(p, n, &kk);
            j = k;
            if (!is_case_ignorable(prev)) {
                have_prev = 1;
                break;
            }
        }
        int fin = have_prev && tpl_is_cased(prev);
        if (fin) {
            for (size_t j = i; j < n;) {
                next = tpl_utf8_next(p, n, &j);
                if (!is_case_ignorable(next)) {
                    have_next = 1;
                    break;
                }
            }
            fin = !have_next || !tpl_is_cased(next);
        }
        tpl_str_add_cp(c, at, out, fin ? 0x3C2 : 0x3C3);
    }
}
