/* Loading tokenizer.json, tokenizer_config.json and generation_config.json. Every failure names
 * the file and the JSON path of the offending value. */
#include "json_fix.h"
#include "tok_internal.h"

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <json-c/json.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif

/* Ids above this are refused: the id table is dense, and no real vocabulary comes close (the
 * largest today hold about 260k tokens). */
#define TOK_MAX_ID (1 << 22)

typedef struct {
    char *err;
    size_t errlen;
    const char *file;
} lctx;

static int fail(lctx *c, const char *path, const char *fmt, ...) {
    if (!c->errlen) return -1;
    int k = snprintf(c->err, c->errlen, "%s: %s%s", c->file, path ? path : "", path ? ": " : "");
    if (k < 0) k = 0;
    if ((size_t)k < c->errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(c->err + k, c->errlen - (size_t)k, fmt, ap);
        va_end(ap);
    }
    return -1;
}

static const char *jtype(json_object *o) {
    return o ? json_type_to_name(json_object_get_type(o)) : "null";
}

static json_object *parse_json_text(lctx *c, const char *s, size_t n);

/* Parses a whole JSON text; NULL (with a line:column message) when it is not valid JSON. */
static json_object *parse_json(lctx *c, const char *s, size_t n) {
    if (n > INT_MAX) {
        fail(c, NULL, "file too large (%zu bytes)", n);
        return NULL;
    }
    char *fixed = NULL;
    size_t fixed_n = 0;
    int r = json_fix_surrogates(s, n, &fixed, &fixed_n); /* json_fix.h */
    if (r < 0) {
        fail(c, NULL, "out of memory");
        return NULL;
    }
    json_object *o = parse_json_text(c, r ? fixed : s, r ? fixed_n : n);
    free(fixed);
    return o;
}

static json_object *parse_json_text(lctx *c, const char *s, size_t n) {
    json_tokener *tk = json_tokener_new_ex(64);
    if (!tk) {
        fail(c, NULL, "out of memory");
        return NULL;
    }
    json_tokener_set_flags(tk, JSON_TOKENER_STRICT | JSON_TOKENER_VALIDATE_UTF8);
    json_object *o = json_tokener_parse_ex(tk, s, (int)n);
    enum json_tokener_error e = json_tokener_get_error(tk);
    size_t end = json_tokener_get_parse_end(tk);
    if (o && e == json_tokener_success) {
        while (end < n && (s[end] == ' ' || s[end] == '\n' || s[end] == '\r' || s[end] == '\t'))
            end++;
        if (end < n) {
            json_object_put(o);
            o = NULL;
            e = json_tokener_error_parse_unexpected;
        }
    } else if (o) {
        json_object_put(o);
        o = NULL;
    }
    if (!o) {
        size_t line = 1, col = 1;
        for (size_t i = 0; i < end && i < n; i++) {
            if (s[i] == '\n') {
                line++;
                col = 1;
            } else {
                col++;
            }
        }
        const char *desc = e == json_tokener_continue || e == json_tokener_success
                               ? "unexpected end of input (truncated JSON)"
                               : json_tokener_error_desc(e);
        fail(c, NULL, "invalid JSON at line %zu, column %zu: %s", line, col, desc);
    }
    json_tokener_free(tk);
    return o;
}

static json_object *get(json_object *o, const char *key) {
    json_object *v = NULL;
    if (o && json_object_is_type(o, json_type_object) && json_object_object_get_ex(o, key, &v))
        return v;
    return NULL;
}

/* Optional boolean member: absent or null gives def; another type is an error. */
static int get_bool(lctx *c, json_object *o, const char *path, const char *key, bool def,
                    bool *out) {
    json_object *v = get(o, key);
    if (!v) {
        *out = def;
        return 0;
    }
    if (!json_object_is_type(v, json_type_boolean))
        return fail(c, path, "\"%s\" must be a boolean, not %s", key, jtype(v));
    *out = json_object_get_boolean(v);
    return 0;
}

static int get_uint(lctx *c, json_object *o, const char *path, const char *key, size_t def,
                    size_t *out) {
    json_object *v = get(o, key);
    if (!v) {
        *out = def;
        return 0;
    }
    if (!json_object_is_type(v, json_type_int) || json_object_get_int64(v) < 0)
        return fail(c, path, "\"%s\" must be a non-negative integer", key);
    *out = (size_t)json_object_get_int64(v);
    return 0;
}

/* Required string member (or optional when required is false: NULL when absent or null). */
static int get_str(lctx *c, json_object *o, const char *path, const char *key, bool required,
                   const char **s, size_t *n) {
    json_object *v = get(o, key);
    *s = NULL;
    *n = 0;
    if (!v) {
        if (required) return fail(c, path, "missing string \"%s\"", key);
        return 0;
    }
    if (!json_object_is_type(v, json_type_string))
        return fail(c, path, "\"%s\" must be a string, not %s", key, jtype(v));
    *s = json_object_get_string(v);
    *n = (size_t)json_object_get_string_len(v);
    return 0;
}

/* A single Unicode character given as a string (Metaspace replacement, Strip content). */
static int get_char(lctx *c, json_object *o, const char *path, const char *key, const char *def,
                    char out[5], size_t *len) {
    const char *s;
    size_t n;
    if (get_str(c, o, path, key, false, &s, &n)) return -1;
    if (!s) s = def, n = strlen(def);
    size_t k = utf8_valid_len((const unsigned char *)s, n);
    if (!k || k != n) return fail(c, path, "\"%s\" must be exactly one character", key);
    memcpy(out, s, n);
    out[n] = '\0';
    *len = n;
    return 0;
}

/* tokenizers compiles these patterns with Oniguruma (Unicode 16), whose classes differ from
 * PCRE2's (Unicode 14 in 10.42): \s is exactly White_Space (PCRE2 adds U+180E), \w is
 * alphabetic + marks + Nd + Pc + joiners (PCRE2 takes all of \p{N}), \h is a hex digit (PCRE2:
 * horizontal space), and \p{..} must know the characters assigned since Unicode 14. Rewrite the
 * pattern so that PCRE2 matches what Oniguruma matches. */

/* Emits \p{name} (or its negation) plus the Unicode 15-16 changes of that category. */
static int emit_property(tok_sbuf *out, const char *name, size_t len, bool neg, bool in_class) {
    tok_sbuf add = {0}, rem = {0};
    int rc = -1;
    if (tok_unicode_changes(name, len, false, &add) || tok_unicode_changes(name, len, true, &rem))
        goto out;
    char prop[64];
    int k = snprintf(prop, sizeof prop, "\\p{%.*s}", (int)len, name);
    if (k < 0 || (size_t)k >= sizeof prop) goto out;
    if (!add.n && !rem.n) {
        if (neg) prop[1] = 'P';
        rc = sbuf_put(out, prop, (size_t)k);
        goto out;
    }
    if (in_class) {
        /* inside a class only additions can be expressed; a negated property stays as is */
        if (neg) prop[1] = 'P';
        rc = sbuf_put(out, prop, (size_t)k) || (!neg && add.n && sbuf_put(out, add.p, add.n));
        goto out;
    }
    if (!neg) {
        /* (?:(?![removed])[\p{X}added]) */
        rc = sbuf_put(out, "(?:", 3) ||
             (rem.n && (sbuf_put(out, "(?![", 4) || sbuf_put(out, rem.p, rem.n) ||
                        sbuf_put(out, "])", 2))) ||
             sbuf_putc(out, '[') || sbuf_put(out, prop, (size_t)k) ||
             (add.n && sbuf_put(out, add.p, add.n)) || sbuf_put(out, "])", 2);
    } else {
        /* (?:[^\p{X}added]|[removed]) */
        rc = sbuf_put(out, "(?:[^", 5) || sbuf_put(out, prop, (size_t)k) ||
             (add.n && sbuf_put(out, add.p, add.n)) || sbuf_putc(out, ']') ||
             (rem.n &&
              (sbuf_put(out, "|[", 2) || sbuf_put(out, rem.p, rem.n) || sbuf_putc(out, ']'))) ||
             sbuf_putc(out, ')');
    }
out:
    sbuf_free(&add);
    sbuf_free(&rem);
    return rc ? -1 : 0;
}

/* Oniguruma's \w as class items. */
static int emit_word_items(tok_sbuf *out) {
    static const char *const parts[] = {"L", "M", "Nd", "Nl", "Pc"};
    if (sbuf_put(out, "\\p{Alphabetic}\\x{200C}\\x{200D}", 30)) return -1;
    for (size_t i = 0; i < sizeof parts / sizeof *parts; i++)
        if (emit_property(out, parts[i], strlen(parts[i]), false, true)) return -1;
    return 0;
}

static int translate_regex(const char *p, size_t n, tok_sbuf *out) {
    bool in_class = false;
    for (size_t i = 0; i < n; i++) {
        char c = p[i];
        if (c == '\\' && i + 1 < n) {
            char e = p[++i];
            int rc = 0;
            if ((e == 'p' || e == 'P') && i + 1 < n) {
                /* \pL, \p{Lu}, \p{^Lu}, \P{Lu} */
                bool neg = e == 'P';
                const char *name = p + i + 1;
                size_t len = 1;
                if (*name == '{') {
                    const char *close = memchr(name, '}', n - (size_t)(name - p));
                    if (!close) return sbuf_put(out, p + i - 1, n - i + 1); /* PCRE2 reports it */
                    name++;
                    len = (size_t)(close - name);
                    if (len && *name == '^') neg = !neg, name++, len--;
                    i = (size_t)(close - p);
                } else {
                    i++;
                }
                rc = emit_property(out, name, len, neg, in_class);
            } else if (e == 's') {
                rc = sbuf_put(out, "\\p{White_Space}", 15);
            } else if (e == 'S') {
                rc = sbuf_put(out, "\\P{White_Space}", 15);
            } else if (e == 'w') {
                rc = (!in_class && sbuf_putc(out, '[')) || emit_word_items(out) ||
                     (!in_class && sbuf_putc(out, ']'));
            } else if (e == 'W' && !in_class) {
                rc = sbuf_put(out, "[^", 2) || emit_word_items(out) || sbuf_putc(out, ']');
            } else if (e == 'u' && i + 4 < n && isxdigit((unsigned char)p[i + 1]) &&
                       isxdigit((unsigned char)p[i + 2]) && isxdigit((unsigned char)p[i + 3]) &&
                       isxdigit((unsigned char)p[i + 4])) {
                /* Oniguruma's \uHHHH */
                rc = sbuf_put(out, "\\x{", 3) || sbuf_put(out, p + i + 1, 4) || sbuf_putc(out, '}');
                i += 4;
            } else if (e == 'h') {
                rc = in_class ? sbuf_put(out, "0-9a-fA-F", 9) : sbuf_put(out, "[0-9a-fA-F]", 11);
            } else if (e == 'H' && !in_class) {
                rc = sbuf_put(out, "[^0-9a-fA-F]", 12);
            } else {
                rc = sbuf_putc(out, '\\') || sbuf_putc(out, e);
            }
            if (rc) return -1;
            continue;
        }
        if (!in_class && c == '[') {
            in_class = true;
            if (sbuf_putc(out, c)) return -1;
            /* a ']' right after '[' or '[^' is a literal */
            if (i + 1 < n && p[i + 1] == '^' && sbuf_putc(out, p[++i])) return -1;
            if (i + 1 < n && p[i + 1] == ']' && sbuf_putc(out, p[++i])) return -1;
            continue;
        }
        if (in_class && c == '[' && i + 1 < n && p[i + 1] == ':') {
            /* POSIX class [:name:] inside a class */
            const char *end = tok_memmem(p + i + 2, n - i - 2, ":]", 2);
            if (end) {
                size_t k = (size_t)(end + 2 - (p + i));
                if (sbuf_put(out, p + i, k)) return -1;
                i += k - 1;
                continue;
            }
        }
        if (in_class && c == ']') in_class = false;
        if (sbuf_putc(out, c)) return -1;
    }
    return sbuf_put(out, "", 0);
}

/* Compiles a (rewritten) regex with UTF and UCP, JIT when available; NULL with a message. */
static pcre2_code *tok_regex_compile(const char *pat, size_t len, char *err, size_t errlen) {
    int ec;
    PCRE2_SIZE off;
    tok_sbuf tr = {0};
    if (translate_regex(pat, len, &tr)) {
        sbuf_free(&tr);
        if (errlen) snprintf(err, errlen, "out of memory");
        return NULL;
    }
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)tr.p, tr.n, PCRE2_UTF | PCRE2_UCP, &ec, &off, NULL);
    sbuf_free(&tr);
    if (!re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(ec, msg, sizeof msg);
        if (errlen) snprintf(err, errlen, "%s at offset %zu", (const char *)msg, (size_t)off);
        return NULL;
    }
    /* JIT is an optimisation only: without it pcre2_match interprets. */
    (void)pcre2_jit_compile(re, PCRE2_JIT_COMPLETE);
    return re;
}

/* {"String": s} or {"Regex": r}. */
static int load_pattern(lctx *c, tok_tokenizer *t, json_object *o, const char *path,
                        tok_pattern *p) {
    char sub[300];
    snprintf(sub, sizeof sub, "%s.pattern", path);
    json_object *v = get(o, "pattern");
    if (!v || !json_object_is_type(v, json_type_object))
        return fail(c, sub, "must be an object {\"String\": ...} or {\"Regex\": ...}, not %s",
                    jtype(v));
    const char *s;
    size_t n;
    if (get(v, "Regex")) {
        if (get_str(c, v, sub, "Regex", true, &s, &n)) return -1;
        char msg[300];
        p->is_regex = true;
        p->re = tok_regex_compile(s, n, msg, sizeof msg);
        if (!p->re) return fail(c, sub, "bad regular expression: %s", msg);
        return 0;
    }
    if (get_str(c, v, sub, "String", true, &s, &n)) return -1;
    p->lit = arena_strdup(&t->arena, s, n);
    p->lit_len = n;
    if (!p->lit) return fail(c, sub, "out of memory");
    return 0;
}

static int load_behavior(lctx *c, json_object *o, const char *path, int def, int *out) {
    const char *s;
    size_t n;
    if (get_str(c, o, path, "behavior", false, &s, &n)) return -1;
    if (!s) {
        *out = def;
        return 0;
    }
    static const char *names[] = {"Removed", "Isolated", "MergedWithPrevious", "MergedWithNext",
                                  "Contiguous"};
    for (int i = 0; i < 5; i++)
        if (strcmp(s, names[i]) == 0) {
            *out = i;
            return 0;
        }
    return fail(c, path, "unknown split behavior \"%s\"", s);
}

static void free_pattern(tok_pattern *p) {
    if (p->re) pcre2_code_free(p->re);
    p->re = NULL;
}

/* ---- normalizers ---- */

static void free_norm(tok_norm *n) {
    if (!n) return;
    for (size_t i = 0; i < n->n_kids; i++) free_norm(n->kids[i]);
    free(n->kids);
    free_pattern(&n->pat);
    free(n);
}

static int load_norm(lctx *c, tok_tokenizer *t, json_object *o, const char *path, int depth,
                     tok_norm **out) {
    *out = NULL;
    if (!json_object_is_type(o, json_type_object))
        return fail(c, path, "must be an object, not %s", jtype(o));
    if (depth > 16) return fail(c, path, "nested too deeply");
    const char *type;
    size_t tn;
    if (get_str(c, o, path, "type", true, &type, &tn)) return -1;
    tok_norm *n = calloc(1, sizeof *n);
    if (!n) return fail(c, path, "out of memory");
    *out = n;
    if (strcmp(type, "Sequence") == 0) {
        n->type = NORM_SEQ;
        json_object *arr = get(o, "normalizers");
        if (!arr || !json_object_is_type(arr, json_type_array))
            return fail(c, path, "\"normalizers\" must be an array, not %s", jtype(arr));
        size_t k = json_object_array_length(arr);
        n->kids = calloc(k ? k : 1, sizeof *n->kids);
        if (!n->kids) return fail(c, path, "out of memory");
        for (size_t i = 0; i < k; i++) {
            char sub[300];
            snprintf(sub, sizeof sub, "%s.normalizers[%zu]", path, i);
            n->n_kids = i + 1;
            if (load_norm(c, t, json_object_array_get_idx(arr, i), sub, depth + 1, &n->kids[i]))
                return -1;
        }
    } else if (strcmp(type, "NFC") == 0) {
        n->type = NORM_NFC;
    } else if (strcmp(type, "NFD") == 0) {
        n->type = NORM_NFD;
    } else if (strcmp(type, "NFKC") == 0) {
        n->type = NORM_NFKC;
    } else if (strcmp(type, "NFKD") == 0) {
        n->type = NORM_NFKD;
    } else if (strcmp(type, "Lowercase") == 0) {
        n->type = NORM_LOWER;
    } else if (strcmp(type, "StripAccents") == 0) {
        n->type = NORM_STRIP_ACCENTS;
    } else if (strcmp(type, "Strip") == 0) {
        n->type = NORM_STRIP;
        if (get_bool(c, o, path, "strip_left", true, &n->left) ||
            get_bool(c, o, path, "strip_right", true, &n->right))
            return -1;
    } else if (strcmp(type, "Replace") == 0) {
        n->type = NORM_REPLACE;
        const char *s;
        size_t sl;
        if (load_pattern(c, t, o, path, &n->pat) || get_str(c, o, path, "content", true, &s, &sl))
            return -1;
        n->content = arena_strdup(&t->arena, s, sl);
        n->content_len = sl;
        if (!n->content) return fail(c, path, "out of memory");
    } else if (strcmp(type, "Prepend") == 0) {
        n->type = NORM_PREPEND;
        const char *s;
        size_t sl;
        if (get_str(c, o, path, "prepend", true, &s, &sl)) return -1;
        n->content = arena_strdup(&t->arena, s, sl);
        n->content_len = sl;
        if (!n->content) return fail(c, path, "out of memory");
    } else {
        return fail(c, path, "unsupported normalizer type \"%s\"", type);
    }
    return 0;
}

/* ---- pre-tokenizers ---- */

static void free_pretok(tok_pretok *p) {
    if (!p) return;
    for (size_t i = 0; i < p->n_kids; i++) free_pretok(p->kids[i]);
    free(p->kids);
    free_pattern(&p->pat);
    free(p);
}

/* GPT-2's pre-tokenization regex, used by ByteLevel with use_regex. */
static const char GPT2_RE[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

static int load_pretok(lctx *c, tok_tokenizer *t, json_object *o, const char *path, int depth,
                       tok_pretok **out) {
    *out = NULL;
    if (!json_object_is_type(o, json_type_object))
        return fail(c, path, "must be an object, not %s", jtype(o));
    if (depth > 16) return fail(c, path, "nested too deeply");
    const char *type;
    size_t tn;
    if (get_str(c, o, path, "type", true, &type, &tn)) return -1;
    tok_pretok *p = calloc(1, sizeof *p);
    if (!p) return fail(c, path, "out of memory");
    *out = p;
    char msg[300];
    if (strcmp(type, "Sequence") == 0) {
        p->type = PRE_SEQ;
        json_object *arr = get(o, "pretokenizers");
        if (!arr || !json_object_is_type(arr, json_type_array))
            return fail(c, path, "\"pretokenizers\" must be an array, not %s", jtype(arr));
        size_t k = json_object_array_length(arr);
        p->kids = calloc(k ? k : 1, sizeof *p->kids);
        if (!p->kids) return fail(c, path, "out of memory");
        for (size_t i = 0; i < k; i++) {
            char sub[300];
            snprintf(sub, sizeof sub, "%s.pretokenizers[%zu]", path, i);
            p->n_kids = i + 1;
            if (load_pretok(c, t, json_object_array_get_idx(arr, i), sub, depth + 1, &p->kids[i]))
                return -1;
        }
    } else if (strcmp(type, "Split") == 0) {
        p->type = PRE_SPLIT;
        if (load_pattern(c, t, o, path, &p->pat) ||
            load_behavior(c, o, path, B_ISOLATED, &p->behavior) ||
            get_bool(c, o, path, "invert", false, &p->invert))
            return -1;
    } else if (strcmp(type, "ByteLevel") == 0) {
        p->type = PRE_BYTELEVEL;
        if (get_bool(c, o, path, "add_prefix_space", true, &p->add_prefix_space) ||
            get_bool(c, o, path, "use_regex", true, &p->use_regex))
            return -1;
        if (p->use_regex) {
            p->pat.is_regex = true;
            p->pat.re = tok_regex_compile(GPT2_RE, sizeof GPT2_RE - 1, msg, sizeof msg);
            if (!p->pat.re) return fail(c, path, "internal regex: %s", msg);
        }
    } else if (strcmp(type, "Digits") == 0) {
        p->type = PRE_DIGITS;
        if (get_bool(c, o, path, "individual_digits", false, &p->individual_digits)) return -1;
    } else if (strcmp(type, "Metaspace") == 0) {
        p->type = PRE_METASPACE;
        if (get_char(c, o, path, "replacement", "\xE2\x96\x81", p->rep, &p->rep_len) ||
            get_bool(c, o, path, "split", true, &p->split))
            return -1;
        const char *s;
        size_t sl;
        if (get_str(c, o, path, "prepend_scheme", false, &s, &sl)) return -1;
        if (s) {
            if (strcmp(s, "always") == 0)
                p->prepend_scheme = PREPEND_ALWAYS;
            else if (strcmp(s, "first") == 0)
                p->prepend_scheme = PREPEND_FIRST;
            else if (strcmp(s, "never") == 0)
                p->prepend_scheme = PREPEND_NEVER;
            else
                return fail(c, path, "unknown prepend_scheme \"%s\"", s);
        } else {
            bool aps;
            if (get_bool(c, o, path, "add_prefix_space", true, &aps)) return -1;
            p->prepend_scheme = aps ? PREPEND_ALWAYS : PREPEND_NEVER;
        }
    } else if (strcmp(type, "Whitespace") == 0) {
        p->type = PRE_WHITESPACE;
        static const char WS_RE[] = "\\w+|[^\\w\\s]+";
        p->pat.is_regex = true;
        p->pat.re = tok_regex_compile(WS_RE, sizeof WS_RE - 1, msg, sizeof msg);
        if (!p->pat.re) return fail(c, path, "internal regex: %s", msg);
    } else if (strcmp(type, "WhitespaceSplit") == 0) {
        p->type = PRE_WSSPLIT;
    } else if (strcmp(type, "Punctuation") == 0) {
        p->type = PRE_PUNCT;
        if (load_behavior(c, o, path, B_ISOLATED, &p->behavior)) return -1;
    } else {
        return fail(c, path, "unsupported pre-tokenizer type \"%s\"", type);
    }
    return 0;
}

/* ---- decoders (flattened) ---- */

static int push_dec(lctx *c, tok_tokenizer *t, const char *path, tok_dec *d) {
    if (t->n_dec >= 64) return fail(c, path, "too many decoders");
    tok_dec *nd = realloc(t->dec, (t->n_dec + 1) * sizeof *nd);
    if (!nd) return fail(c, path, "out of memory");
    t->dec = nd;
    t->dec[t->n_dec++] = *d;
    return 0;
}

static int load_dec(lctx *c, tok_tokenizer *t, json_object *o, const char *path, int depth) {
    if (!json_object_is_type(o, json_type_object))
        return fail(c, path, "must be an object, not %s", jtype(o));
    if (depth > 16) return fail(c, path, "nested too deeply");
    const char *type;
    size_t tn;
    if (get_str(c, o, path, "type", true, &type, &tn)) return -1;
    tok_dec d;
    memset(&d, 0, sizeof d);
    if (strcmp(type, "Sequence") == 0) {
        json_object *arr = get(o, "decoders");
        if (!arr || !json_object_is_type(arr, json_type_array))
            return fail(c, path, "\"decoders\" must be an array, not %s", jtype(arr));
        for (size_t i = 0; i < json_object_array_length(arr); i++) {
            char sub[300];
            snprintf(sub, sizeof sub, "%s.decoders[%zu]", path, i);
            if (load_dec(c, t, json_object_array_get_idx(arr, i), sub, depth + 1)) return -1;
        }
        return 0;
    }
    if (strcmp(type, "ByteLevel") == 0) {
        d.type = DEC_BYTELEVEL;
    } else if (strcmp(type, "ByteFallback") == 0) {
        d.type = DEC_BYTEFALLBACK;
    } else if (strcmp(type, "Fuse") == 0) {
        d.type = DEC_FUSE;
    } else if (strcmp(type, "Replace") == 0) {
        d.type = DEC_REPLACE;
        const char *s;
        size_t sl;
        if (load_pattern(c, t, o, path, &d.pat)) return -1;
        if (get_str(c, o, path, "content", true, &s, &sl)) {
            free_pattern(&d.pat);
            return -1;
        }
        d.content = arena_strdup(&t->arena, s, sl);
        d.content_len = sl;
        if (!d.content) {
            free_pattern(&d.pat);
            return fail(c, path, "out of memory");
        }
    } else if (strcmp(type, "Strip") == 0) {
        d.type = DEC_STRIP;
        if (get_char(c, o, path, "content", " ", d.strip, &d.strip_len) ||
            get_uint(c, o, path, "start", 0, &d.start) || get_uint(c, o, path, "stop", 0, &d.stop))
            return -1;
    } else if (strcmp(type, "Metaspace") == 0) {
        d.type = DEC_METASPACE;
        if (get_char(c, o, path, "replacement", "\xE2\x96\x81", d.rep, &d.rep_len)) return -1;
        const char *s;
        size_t sl;
        if (get_str(c, o, path, "prepend_scheme", false, &s, &sl)) return -1;
        if (s) {
            if (strcmp(s, "never") != 0 && strcmp(s, "always") != 0 && strcmp(s, "first") != 0)
                return fail(c, path, "unknown prepend_scheme \"%s\"", s);
            d.drop_first = strcmp(s, "never") != 0;
        } else if (get_bool(c, o, path, "add_prefix_space", true, &d.drop_first)) {
            return -1;
        }
    } else {
        return fail(c, path, "unsupported decoder type \"%s\"", type);
    }
    if (push_dec(c, t, path, &d)) {
        free_pattern(&d.pat);
        return -1;
    }
    return 0;
}

/* ---- post-processor: composed into one "single" template ---- */

static void free_items(tok_post_item *it, size_t n) {
    for (size_t i = 0; i < n; i++) free(it[i].ids);
    free(it);
}

/* Replaces the $A of outer by inner (processors of a Sequence apply one after the other). */
static int compose(tok_post_item **items, size_t *n, tok_post_item *outer, size_t n_outer) {
    size_t total = 0;
    for (size_t i = 0; i < n_outer; i++) total += outer[i].is_seq ? *n : 1;
    tok_post_item *r = calloc(total ? total : 1, sizeof *r);
    if (!r) return -1;
    size_t k = 0;
    for (size_t i = 0; i < n_outer; i++) {
        if (!outer[i].is_seq) {
            r[k] = outer[i];
            outer[i].ids = NULL;
            k++;
            continue;
        }
        for (size_t j = 0; j < *n; j++) {
            r[k] = (*items)[j];
            if (!r[k].is_seq) {
                r[k].ids = malloc((r[k].n ? r[k].n : 1) * sizeof(int32_t));
                if (!r[k].ids) {
                    free_items(r, k);
                    return -1;
                }
                memcpy(r[k].ids, (*items)[j].ids, r[k].n * sizeof(int32_t));
            }
            k++;
        }
    }
    free_items(*items, *n);
    *items = r;
    *n = k;
    return 0;
}

static int special_item(lctx *c, const char *path, json_object *pair, tok_post_item *it) {
    /* Roberta/Bert processing: "sep": ["</s>", 2] */
    if (!pair || !json_object_is_type(pair, json_type_array) ||
        json_object_array_length(pair) != 2 ||
        !json_object_is_type(json_object_array_get_idx(pair, 1), json_type_int))
        return fail(c, path, "cls/sep must be [token, id]");
    int64_t id = json_object_get_int64(json_object_array_get_idx(pair, 1));
    if (id < 0 || id >= TOK_MAX_ID) return fail(c, path, "id %lld out of range", (long long)id);
    it->ids = malloc(sizeof(int32_t));
    if (!it->ids) return fail(c, path, "out of memory");
    it->ids[0] = (int32_t)id;
    it->n = 1;
    return 0;
}

static int load_post(lctx *c, tok_tokenizer *t, json_object *o, const char *path, int depth) {
    if (!json_object_is_type(o, json_type_object))
        return fail(c, path, "must be an object, not %s", jtype(o));
    if (depth > 16) return fail(c, path, "nested too deeply");
    const char *type;
    size_t tn;
    if (get_str(c, o, path, "type", true, &type, &tn)) return -1;
    if (strcmp(type, "Sequence") == 0) {
        json_object *arr = get(o, "processors");
        if (!arr || !json_object_is_type(arr, json_type_array))
            return fail(c, path, "\"processors\" must be an array, not %s", jtype(arr));
        for (size_t i = 0; i < json_object_array_length(arr); i++) {
            char sub[300];
            snprintf(sub, sizeof sub, "%s.processors[%zu]", path, i);
            if (load_post(c, t, json_object_array_get_idx(arr, i), sub, depth + 1)) return -1;
        }
        return 0;
    }
    if (strcmp(type, "ByteLevel") == 0) return 0; /* offsets only */
    tok_post_item *outer = NULL;
    size_t n_outer = 0;
    if (strcmp(type, "TemplateProcessing") == 0) {
        json_object *single = get(o, "single"), *specials = get(o, "special_tokens");
        if (!single || !json_object_is_type(single, json_type_array))
            return fail(c, path, "\"single\" must be an array, not %s", jtype(single));
        if (specials && !json_object_is_type(specials, json_type_object))
            return fail(c, path, "\"special_tokens\" must be an object, not %s", jtype(specials));
        size_t k = json_object_array_length(single);
        outer = calloc(k ? k : 1, sizeof *outer);
        if (!outer) return fail(c, path, "out of memory");
        for (size_t i = 0; i < k; i++) {
            char sub[300];
            snprintf(sub, sizeof sub, "%s.single[%zu]", path, i);
            json_object *e = json_object_array_get_idx(single, i);
            json_object *sp = get(e, "SpecialToken"), *sq = get(e, "Sequence");
            if (sq) {
                const char *id;
                size_t il;
                if (get_str(c, sq, sub, "id", true, &id, &il)) goto bad;
                if (strcmp(id, "A") != 0) continue; /* "B" is for pairs */
                outer[n_outer++].is_seq = true;
            } else if (sp) {
                const char *id;
                size_t il;
                if (get_str(c, sp, sub, "id", true, &id, &il)) goto bad;
                json_object *st = get(specials, id);
                json_object *ids = get(st, "ids");
                if (!ids || !json_object_is_type(ids, json_type_array)) {
                    fail(c, sub, "special token \"%s\" has no \"ids\" in special_tokens", id);
                    goto bad;
                }
                size_t m = json_object_array_length(ids);
                tok_post_item *it = &outer[n_outer++];
                it->ids = malloc((m ? m : 1) * sizeof(int32_t));
                if (!it->ids) {
                    fail(c, sub, "out of memory");
                    goto bad;
                }
                for (size_t j = 0; j < m; j++) {
                    json_object *x = json_object_array_get_idx(ids, j);
                    int64_t v = json_object_get_int64(x);
                    if (!json_object_is_type(x, json_type_int) || v < 0 || v >= TOK_MAX_ID) {
                        fail(c, sub, "special token \"%s\": bad id", id);
                        goto bad;
                    }
                    it->ids[it->n++] = (int32_t)v;
                }
            } else {
                fail(c, sub, "must hold \"SpecialToken\" or \"Sequence\"");
                goto bad;
            }
        }
    } else if (strcmp(type, "RobertaProcessing") == 0 || strcmp(type, "BertProcessing") == 0) {
        outer = calloc(3, sizeof *outer);
        if (!outer) return fail(c, path, "out of memory");
        n_outer = 3;
        outer[1].is_seq = true;
        if (special_item(c, path, get(o, "cls"), &outer[0]) ||
            special_item(c, path, get(o, "sep"), &outer[2]))
            goto bad;
    } else {
        return fail(c, path, "unsupported post-processor type \"%s\"", type);
    }
    if (!t->post) {
        t->post = calloc(1, sizeof *t->post);
        if (!t->post) {
            fail(c, path, "out of memory");
            goto bad;
        }
        t->post[0].is_seq = true;
        t->n_post = 1;
    }
    if (compose(&t->post, &t->n_post, outer, n_outer)) {
        fail(c, path, "out of memory");
        goto bad;
    }
    free_items(outer, n_outer);
    t->post_decides = true;
    return 0;
bad:
    free_items(outer, n_outer);
    return -1;
}

/* ---- added tokens trie ---- */

static int trie_add(tok_trie *tr, const char *s, size_t n, int32_t idx) {
    if (!n) return 0;
    if (!tr->term) {
        tr->cap = 64;
        tr->term = malloc(tr->cap * sizeof *tr->term);
        if (!tr->term || u64map_init(&tr->edges, 64)) return -1;
        tr->term[0] = -1;
        tr->n_nodes = 1;
    }
    uint64_t node = 0;
    for (size_t i = 0; i < n; i++) {
        uint64_t key = node << 8 | (unsigned char)s[i], child;
        if (!u64map_get(&tr->edges, key, &child)) {
            if (tr->n_nodes == tr->cap) {
                int32_t *nt = realloc(tr->term, tr->cap * 2 * sizeof *nt);
                if (!nt) return -1;
                tr->term = nt;
                tr->cap *= 2;
            }
            child = tr->n_nodes++;
            tr->term[child] = -1;
            if (u64map_put(&tr->edges, key, child)) return -1;
        }
        node = child;
    }
    tr->term[node] = idx;
    tr->first[(unsigned char)s[0] >> 3] |= (uint8_t)(1u << ((unsigned char)s[0] & 7));
    tr->empty = false;
    return 0;
}

static void set_id(tok_tokenizer *t, int32_t id, const char *s, uint32_t n) {
    t->id_str[id] = s;
    t->id_len[id] = n;
}

static int build_tries(lctx *c, tok_tokenizer *t) {
    t->trie_raw.empty = t->trie_norm.empty = true;
    for (size_t i = 0; i < t->n_added; i++) {
        tok_added *a = &t->added[i];
        int rc;
        if (a->normalized && t->norm) {
            /* normalized tokens are matched in normalized text, so normalize them too; the
             * token's string becomes that normalized form */
            tok_sbuf b = {0};
            rc = tok_normalize(t, a->content, a->len, &b);
            if (!rc) rc = trie_add(&t->trie_norm, b.p, b.n, (int32_t)i);
            const char *ns = rc || !b.n ? NULL : arena_strdup(&t->arena, b.p, b.n);
            if (ns) set_id(t, a->id, ns, (uint32_t)b.n);
            sbuf_free(&b);
        } else {
            rc = trie_add(a->normalized ? &t->trie_norm : &t->trie_raw, a->content, a->len,
                          (int32_t)i);
        }
        if (rc) return fail(c, "added_tokens", "out of memory");
    }
    return 0;
}

/* ---- model ---- */

static int load_model(lctx *c, tok_tokenizer *t, json_object *model) {
    if (!model || !json_object_is_type(model, json_type_object))
        return fail(c, "model", "must be an object, not %s", jtype(model));
    const char *type;
    size_t tn;
    if (get_str(c, model, "model", "type", false, &type, &tn)) return -1;
    if (!type && get(model, "merges")) type = "BPE";
    if (!type) return fail(c, "model", "missing \"type\"");
    if (strcmp(type, "BPE") != 0)
        return fail(c, "model.type", "unsupported model type \"%s\" (only BPE is supported)", type);

    tok_bpe *m = &t->bpe;
    json_object *vocab = get(model, "vocab");
    if (!vocab || !json_object_is_type(vocab, json_type_object))
        return fail(c, "model.vocab", "must be an object {token: id}, not %s", jtype(vocab));
    size_t nv = (size_t)json_object_object_length(vocab);
    if (strmap_init(&m->vocab, nv)) return fail(c, "model.vocab", "out of memory");
    int64_t max_id = -1;
    json_object_iter it;
    json_object_object_foreachC(vocab, it) {
        if (!json_object_is_type(it.val, json_type_int))
            return fail(c, "model.vocab", "id of \"%.60s\" must be an integer, not %s", it.key,
                        jtype(it.val));
        int64_t id = json_object_get_int64(it.val);
        if (id < 0 || id >= TOK_MAX_ID)
            return fail(c, "model.vocab", "id %lld of \"%.60s\" out of range", (long long)id,
                        it.key);
        if (id > max_id) max_id = id;
        size_t n = strlen(it.key);
        const char *str = arena_strdup(&t->arena, it.key, n);
        if (!str || strmap_put(&m->vocab, str, n, (int32_t)id))
            return fail(c, "model.vocab", "out of memory");
    }
    t->n_ids = (size_t)(max_id + 1);
    return 0;
}

/* The model's options and merges. */
static int load_vocab_merges(lctx *c, tok_tokenizer *t, json_object *model) {
    tok_bpe *m = &t->bpe;

    const char *s;
    size_t n;
    if (get_str(c, model, "model", "continuing_subword_prefix", false, &s, &n)) return -1;
    if (s && n) {
        m->prefix = arena_strdup(&t->arena, s, n);
        m->prefix_len = n;
    }
    if (get_str(c, model, "model", "end_of_word_suffix", false, &s, &n)) return -1;
    if (s && n) {
        m->suffix = arena_strdup(&t->arena, s, n);
        m->suffix_len = n;
    }
    if (get_bool(c, model, "model", "byte_fallback", false, &m->byte_fallback) ||
        get_bool(c, model, "model", "fuse_unk", false, &m->fuse_unk) ||
        get_bool(c, model, "model", "ignore_merges", false, &m->ignore_merges))
        return -1;
    json_object *dropout = get(model, "dropout");
    if (dropout && !json_object_is_type(dropout, json_type_double) &&
        !json_object_is_type(dropout, json_type_int))
        return fail(c, "model", "\"dropout\" must be a number or null, not %s", jtype(dropout));
    m->unk_id = -1;
    if (get_str(c, model, "model", "unk_token", false, &s, &n)) return -1;
    if (s) {
        m->unk_id = strmap_get(&m->vocab, s, n);
        if (m->unk_id < 0)
            return fail(c, "model.unk_token", "\"%.60s\" is not in the vocabulary", s);
    }
    for (int b = 0; b < 256; b++) {
        char name[8];
        snprintf(name, sizeof name, "<0x%02X>", b);
        m->byte_ids[b] = strmap_get(&m->vocab, name, 6);
    }
    if (!m->prefix && !m->suffix && m->vocab.n >= 4096) {
        /* one-character tokens of the BMP, looked up without hashing */
        m->bmp_ids = malloc(0x10000 * sizeof(int32_t));
        if (!m->bmp_ids) return fail(c, "model.vocab", "out of memory");
        for (size_t i = 0; i < 0x10000; i++) m->bmp_ids[i] = -1;
        for (size_t i = 0; i < m->vocab.cap; i++) {
            tok_strmap_slot *sl = &m->vocab.slots[i];
            if (!sl->h || !sl->len || sl->len > 3) continue;
            size_t k = utf8_valid_len((const unsigned char *)sl->key, sl->len);
            if (k != sl->len) continue;
            size_t dl;
            uint32_t cp = utf8_decode(sl->key, &dl);
            m->bmp_ids[cp] = sl->val;
        }
    }

    json_object *merges = get(model, "merges");
    if (!merges)
        merges = json_object_new_array(); /* a BPE without merges is valid */
    else
        json_object_get(merges);
    if (!json_object_is_type(merges, json_type_array)) {
        json_object_put(merges);
        return fail(c, "model.merges", "must be an array, not %s", jtype(merges));
    }
    size_t nm = json_object_array_length(merges);
    if (nm > UINT32_MAX / 2) {
        json_object_put(merges);
        return fail(c, "model.merges", "too many merges");
    }
    int rc = 0;
    char path[64];
    tok_sbuf cat = {0};
    if (u64map_init(&m->merges, nm)) {
        rc = fail(c, "model.merges", "out of memory");
        goto out;
    }
    for (size_t i = 0; i < nm; i++) {
        json_object *e = json_object_array_get_idx(merges, i);
        const char *a, *b;
        size_t al, bl;
        snprintf(path, sizeof path, "model.merges[%zu]", i);
        if (json_object_is_type(e, json_type_string)) {
            /* "a b": exactly one space, as tokenizers requires */
            a = json_object_get_string(e);
            size_t el = (size_t)json_object_get_string_len(e);
            const char *sp = memchr(a, ' ', el);
            if (!sp || memchr(sp + 1, ' ', el - (size_t)(sp + 1 - a))) {
                rc = fail(c, path, "\"%.60s\" must be two tokens separated by one space", a);
                goto out;
            }
            al = (size_t)(sp - a);
            b = sp + 1;
            bl = el - al - 1;
        } else if (json_object_is_type(e, json_type_array) && json_object_array_length(e) == 2 &&
                   json_object_is_type(json_object_array_get_idx(e, 0), json_type_string) &&
                   json_object_is_type(json_object_array_get_idx(e, 1), json_type_string)) {
            json_object *x = json_object_array_get_idx(e, 0), *y = json_object_array_get_idx(e, 1);
            a = json_object_get_string(x);
            al = (size_t)json_object_get_string_len(x);
            b = json_object_get_string(y);
            bl = (size_t)json_object_get_string_len(y);
        } else {
            rc = fail(c, path, "must be a string \"a b\" or a pair [a, b], not %s", jtype(e));
            goto out;
        }
        int32_t ia = strmap_get(&m->vocab, a, al), ib = strmap_get(&m->vocab, b, bl);
        if (ia < 0 || ib < 0) {
            const char *miss = ia < 0 ? a : b;
            int ml = (int)(ia < 0 ? al : bl);
            rc = fail(c, path, "token \"%.*s\" is not in the vocabulary", ml > 60 ? 60 : ml, miss);
            goto out;
        }
        /* the merged token drops b's continuing_subword_prefix */
        size_t skip = m->prefix && bl >= m->prefix_len && memcmp(b, m->prefix, m->prefix_len) == 0
                          ? m->prefix_len
                          : 0;
        cat.n = 0;
        if (sbuf_put(&cat, a, al) || sbuf_put(&cat, b + skip, bl - skip)) {
            rc = fail(c, path, "out of memory");
            goto out;
        }
        int32_t im = strmap_get(&m->vocab, cat.p, cat.n);
        if (im < 0) {
            rc = fail(c, path, "merged token \"%.*s\" is not in the vocabulary",
                      (int)(cat.n > 60 ? 60 : cat.n), cat.p);
            goto out;
        }
        if (u64map_put(&m->merges, (uint64_t)(uint32_t)ia << 32 | (uint32_t)ib,
                       (uint64_t)i << 32 | (uint32_t)im)) {
            rc = fail(c, path, "out of memory");
            goto out;
        }
    }
out:
    sbuf_free(&cat);
    json_object_put(merges);
    return rc;
}

/* Added tokens get their ids as tokenizers assigns them (the "id" in the file is only checked
 * for type, as tokenizers does): the id of the same content added before or in the model
 * vocabulary, else the next id after the vocabulary and the added tokens so far. Files written
 * by tokenizers always agree with this. */
static int load_added(lctx *c, tok_tokenizer *t, json_object *arr, int64_t *max_id) {
    if (strmap_init(&t->added_map, 16)) return fail(c, "added_tokens", "out of memory");
    if (!arr) return 0;
    if (!json_object_is_type(arr, json_type_array))
        return fail(c, "added_tokens", "must be an array, not %s", jtype(arr));
    size_t k = json_object_array_length(arr);
    t->added = calloc(k ? k : 1, sizeof *t->added);
    if (!t->added) return fail(c, "added_tokens", "out of memory");
    int64_t max_added_v = -1, *max_added = &max_added_v;
    for (size_t i = 0; i < k; i++) {
        char path[64];
        snprintf(path, sizeof path, "added_tokens[%zu]", i);
        json_object *e = json_object_array_get_idx(arr, i);
        if (!json_object_is_type(e, json_type_object))
            return fail(c, path, "must be an object, not %s", jtype(e));
        tok_added *a = &t->added[t->n_added];
        json_object *id = get(e, "id");
        if (!id || !json_object_is_type(id, json_type_int))
            return fail(c, path, "\"id\" must be an integer, not %s", jtype(id));
        int64_t v = json_object_get_int64(id);
        if (v < 0 || v >= TOK_MAX_ID) return fail(c, path, "id %lld out of range", (long long)v);
        const char *s;
        size_t n;
        a->special = false;
        if (get_str(c, e, path, "content", true, &s, &n) ||
            get_bool(c, e, path, "special", false, &a->special) ||
            get_bool(c, e, path, "lstrip", false, &a->lstrip) ||
            get_bool(c, e, path, "rstrip", false, &a->rstrip) ||
            get_bool(c, e, path, "single_word", false, &a->single_word) ||
            get_bool(c, e, path, "normalized", !a->special, &a->normalized))
            return -1;
        if (!n) continue; /* tokenizers ignores empty added tokens */
        a->content = arena_strdup(&t->arena, s, n);
        if (!a->content) return fail(c, path, "out of memory");
        a->len = (uint32_t)n;
        int32_t aid = strmap_get(&t->added_map, s, n);
        if (aid < 0) aid = strmap_get(&t->bpe.vocab, s, n);
        if (aid < 0) {
            int64_t nv = (int64_t)t->bpe.vocab.n;
            aid = (int32_t)(*max_added >= nv ? *max_added + 1 : nv);
            if (aid >= TOK_MAX_ID) return fail(c, path, "too many added tokens");
        }
        if (aid > *max_added) *max_added = aid;
        if (aid > *max_id) *max_id = aid;
        a->id = aid;
        if (strmap_put(&t->added_map, a->content, a->len, aid))
            return fail(c, path, "out of memory");
        t->n_added++;
    }
    return 0;
}

/* bos_token / eos_token: a string, {"content": ...} (AddedToken) or null. */
static int config_token(lctx *c, tok_tokenizer *t, json_object *cfg, const char *key, int32_t *id) {
    *id = -1;
    json_object *v = get(cfg, key);
    if (!v) return 0;
    if (json_object_is_type(v, json_type_object)) {
        v = get(v, "content");
        if (!v || !json_object_is_type(v, json_type_string))
            return fail(c, key, "must be a string or an object with a string \"content\"");
    }
    if (!json_object_is_type(v, json_type_string))
        return fail(c, key, "must be a string, an object or null, not %s", jtype(v));
    *id = tok_piece_to_token(t, json_object_get_string(v), (size_t)json_object_get_string_len(v));
    return 0;
}

static int add_eos(tok_tokenizer *t, int32_t id) {
    if (id < 0) return 0;
    for (size_t i = 0; i < t->n_eos; i++)
        if (t->eos[i] == id) return 0;
    int32_t *e = realloc(t->eos, (t->n_eos + 1) * sizeof *e);
    if (!e) return -1;
    t->eos = e;
    t->eos[t->n_eos++] = id;
    return 0;
}

static int load_config(lctx *c, tok_tokenizer *t, json_object *cfg) {
    if (!json_object_is_type(cfg, json_type_object))
        return fail(c, NULL, "must hold a JSON object, not %s", jtype(cfg));
    if (config_token(c, t, cfg, "bos_token", &t->bos_id) ||
        config_token(c, t, cfg, "eos_token", &t->cfg_eos_id) ||
        get_bool(c, cfg, NULL, "add_bos_token", false, &t->add_bos) ||
        get_bool(c, cfg, NULL, "add_eos_token", false, &t->add_eos) ||
        get_bool(c, cfg, NULL, "clean_up_tokenization_spaces", false, &t->cleanup))
        return -1;
    if (add_eos(t, t->cfg_eos_id)) return fail(c, NULL, "out of memory");
    return 0;
}

static int load_generation_config(lctx *c, tok_tokenizer *t, json_object *g) {
    json_object *e = get(g, "eos_token_id");
    if (!e) return 0;
    if (json_object_is_type(e, json_type_int)) {
        int64_t v = json_object_get_int64(e);
        if (v >= 0 && v < TOK_MAX_ID && add_eos(t, (int32_t)v))
            return fail(c, "eos_token_id", "out of memory");
        return 0;
    }
    if (!json_object_is_type(e, json_type_array))
        return fail(c, "eos_token_id", "must be an integer or a list of integers, not %s",
                    jtype(e));
    for (size_t i = 0; i < json_object_array_length(e); i++) {
        json_object *x = json_object_array_get_idx(e, i);
        if (!json_object_is_type(x, json_type_int))
            return fail(c, "eos_token_id", "must be a list of integers");
        int64_t v = json_object_get_int64(x);
        if (v >= 0 && v < TOK_MAX_ID && add_eos(t, (int32_t)v))
            return fail(c, "eos_token_id", "out of memory");
    }
    return 0;
}

static void cache_init(tok_tokenizer *t) {
    for (int i = 0; i < TOK_CACHE_SHARDS; i++) pthread_mutex_init(&t->cache[i].mu, NULL);
    pthread_mutex_init(&t->pool_mu, NULL);
}

void tok_free(tok_tokenizer *t) {
    if (!t) return;
    tok_ctx_pool_free(t);
    pthread_mutex_destroy(&t->pool_mu);
    for (int i = 0; i < TOK_CACHE_SHARDS; i++) {
        pthread_mutex_destroy(&t->cache[i].mu);
        free(t->cache[i].slots);
        free(t->cache[i].data);
    }
    free_norm(t->norm);
    free_pretok(t->pre);
    for (size_t i = 0; i < t->n_dec; i++) free_pattern(&t->dec[i].pat);
    free(t->dec);
    free_items(t->post, t->n_post);
    strmap_free(&t->bpe.vocab);
    u64map_free(&t->bpe.merges);
    free(t->bpe.bmp_ids);
    strmap_free(&t->added_map);
    u64map_free(&t->trie_raw.edges);
    free(t->trie_raw.term);
    u64map_free(&t->trie_norm.edges);
    free(t->trie_norm.term);
    free(t->added);
    free(t->eos);
    free(t->id_str);
    free(t->id_len);
    free(t->id_flags);
    arena_free(&t->arena);
    free(t);
}

static tok_tokenizer *build(lctx *c, json_object *root, json_object *cfg, json_object *gen,
                            const char *cfg_name, const char *gen_name) {
    tok_bytelevel_init();
    tok_tokenizer *t = calloc(1, sizeof *t);
    if (!t) {
        fail(c, NULL, "out of memory");
        return NULL;
    }
    cache_init(t);
    t->bos_id = t->cfg_eos_id = -1;
    if (!json_object_is_type(root, json_type_object)) {
        fail(c, NULL, "must hold a JSON object, not %s", jtype(root));
        goto bad;
    }
    json_object *model = get(root, "model");
    if (load_model(c, t, model)) goto bad;
    int64_t max_id = (int64_t)t->n_ids - 1;
    if (load_added(c, t, get(root, "added_tokens"), &max_id)) goto bad;
    t->n_ids = (size_t)(max_id + 1);
    size_t nid = t->n_ids ? t->n_ids : 1;
    t->id_str = calloc(nid, sizeof *t->id_str);
    t->id_len = calloc(nid, sizeof *t->id_len);
    t->id_flags = calloc(nid, sizeof *t->id_flags);
    if (!t->id_str || !t->id_len || !t->id_flags) {
        fail(c, NULL, "out of memory");
        goto bad;
    }
    for (size_t i = 0; i < t->bpe.vocab.cap; i++) {
        tok_strmap_slot *sl = &t->bpe.vocab.slots[i];
        if (sl->h) set_id(t, sl->val, sl->key, sl->len);
    }
    /* added tokens take precedence over the model vocabulary for id -> string (build_tries
     * puts the normalized form of normalized ones, as tokenizers does) */
    for (size_t i = 0; i < t->n_added; i++) {
        tok_added *a = &t->added[i];
        set_id(t, a->id, a->content, a->len);
        t->id_flags[a->id] = (uint8_t)(TOKF_ADDED | (a->special ? TOKF_SPECIAL : 0));
    }
    if (load_vocab_merges(c, t, model)) goto bad;

    json_object *v;
    if ((v = get(root, "normalizer")) && load_norm(c, t, v, "normalizer", 0, &t->norm)) goto bad;
    if ((v = get(root, "pre_tokenizer")) && load_pretok(c, t, v, "pre_tokenizer", 0, &t->pre))
        goto bad;
    if ((v = get(root, "decoder"))) {
        t->has_decoder = true;
        if (load_dec(c, t, v, "decoder", 0)) goto bad;
    }
    if ((v = get(root, "post_processor"))) {
        if (load_post(c, t, v, "post_processor", 0)) goto bad;
        t->post_decides = true; /* a present post-processor decides alone */
    }
    if (build_tries(c, t)) goto bad;
    /* an id the template adds must exist, or the model would be fed an id it may not have */
    for (size_t i = 0; i < t->n_post; i++)
        for (size_t k = 0; k < t->post[i].n; k++)
            if ((size_t)t->post[i].ids[k] >= t->n_ids || !t->id_str[t->post[i].ids[k]]) {
                fail(c, "post_processor", "special token id %d is not in the vocabulary",
                     (int)t->post[i].ids[k]);
                goto bad;
            }

    const char *file = c->file;
    if (cfg) {
        c->file = cfg_name;
        if (load_config(c, t, cfg)) goto bad;
    }
    if (gen) {
        c->file = gen_name;
        if (load_generation_config(c, t, gen)) goto bad;
    }
    c->file = file;
    if (!t->post_decides) {
        /* no post-processor: tokenizer_config.json's add_bos_token / add_eos_token decide */
        size_t k = 0;
        t->post = calloc(3, sizeof *t->post);
        if (!t->post) {
            fail(c, NULL, "out of memory");
            goto bad;
        }
        if (t->add_bos && t->bos_id >= 0) {
            t->post[k].ids = malloc(sizeof(int32_t));
            if (!t->post[k].ids) goto oom;
            t->post[k].ids[0] = t->bos_id;
            t->post[k++].n = 1;
        }
        t->post[k++].is_seq = true;
        if (t->add_eos && t->cfg_eos_id >= 0) {
            t->post[k].ids = malloc(sizeof(int32_t));
            if (!t->post[k].ids) goto oom;
            t->post[k].ids[0] = t->cfg_eos_id;
            t->post[k++].n = 1;
        }
        t->n_post = k;
    }
    return t;
oom:
    fail(c, NULL, "out of memory");
bad:
    tok_free(t);
    return NULL;
}

tok_tokenizer *tok_load_from_memory(const char *json, size_t json_len, const char *config_json,
                                    size_t config_len, char *err, size_t errlen) {
    lctx c = {err, errlen, "tokenizer.json"};
    if (errlen) err[0] = '\0';
    if (!json) {
        fail(&c, NULL, "no data");
        return NULL;
    }
    json_object *root = parse_json(&c, json, json_len), *cfg = NULL;
    if (!root) return NULL;
    if (config_json) {
        c.file = "tokenizer_config.json";
        cfg = parse_json(&c, config_json, config_len);
        c.file = "tokenizer.json";
        if (!cfg) {
            json_object_put(root);
            return NULL;
        }
    }
    tok_tokenizer *t = build(&c, root, cfg, NULL, "tokenizer_config.json", NULL);
    json_object_put(root);
    json_object_put(cfg);
    return t;
}

/* Reads a whole file; returns NULL with *missing set when it does not exist. */
static char *read_file(lctx *c, const char *path, size_t *len, bool *missing) {
    *missing = false;
    c->file = path;
    FILE *f = fopen(path, "rb");
    if (!f) {
        *missing = errno == ENOENT;
        fail(c, NULL, "cannot open: %s", strerror(errno));
        return NULL;
    }
    tok_sbuf b = {0};
    char tmp[1 << 16];
    size_t k;
    while ((k = fread(tmp, 1, sizeof tmp, f)) > 0) {
        if (sbuf_put(&b, tmp, k)) {
            fail(c, NULL, "out of memory");
            fclose(f);
            sbuf_free(&b);
            return NULL;
        }
    }
    if (ferror(f)) {
        fail(c, NULL, "read error: %s", strerror(errno));
        fclose(f);
        sbuf_free(&b);
        return NULL;
    }
    fclose(f);
    if (!b.p && sbuf_put(&b, "", 0)) return NULL;
    *len = b.n;
    return b.p;
}

tok_tokenizer *tok_load(const char *dir, char *err, size_t errlen) {
    lctx c = {err, errlen, dir};
    if (errlen) err[0] = '\0';
    if (!dir) {
        fail(&c, NULL, "no directory given");
        return NULL;
    }
    size_t dl = strlen(dir);
    char *p1 = malloc(dl + 32), *p2 = malloc(dl + 32), *p3 = malloc(dl + 32);
    char *s1 = NULL, *s2 = NULL, *s3 = NULL;
    json_object *root = NULL, *cfg = NULL, *gen = NULL;
    tok_tokenizer *t = NULL;
    if (!p1 || !p2 || !p3) {
        fail(&c, NULL, "out of memory");
        goto out;
    }
    snprintf(p1, dl + 32, "%s/tokenizer.json", dir);
    snprintf(p2, dl + 32, "%s/tokenizer_config.json", dir);
    snprintf(p3, dl + 32, "%s/generation_config.json", dir);
    size_t n1 = 0, n2 = 0, n3 = 0;
    bool missing;
    if (!(s1 = read_file(&c, p1, &n1, &missing))) goto out;
    s2 = read_file(&c, p2, &n2, &missing);
    if (!s2 && !missing) goto out;
    s3 = read_file(&c, p3, &n3, &missing);
    if (!s3 && !missing) goto out;
    if (errlen) err[0] = '\0';
    c.file = p1;
    if (!(root = parse_json(&c, s1, n1))) goto out;
    free(s1);
    s1 = NULL;
    c.file = p2;
    if (s2 && !(cfg = parse_json(&c, s2, n2))) goto out;
    c.file = p3;
    if (s3 && !(gen = parse_json(&c, s3, n3))) goto out;
    c.file = p1;
    t = build(&c, root, cfg, gen, p2, p3);
out:
    json_object_put(root);
    json_object_put(cfg);
    json_object_put(gen);
#ifdef __GLIBC__
    /* the JSON tree of a large tokenizer.json is hundreds of MB of small blocks: give them back */
    malloc_trim(0);
#endif
    free(s1);
    free(s2);
    free(s3);
    free(p1);
    free(p2);
    free(p3);
    return t;
}
