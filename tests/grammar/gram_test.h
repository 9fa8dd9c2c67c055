/* Helpers shared by the grammar tests and bench: the real tokenizers, a seeded generator,
 * picking an allowed token, and an independent validator for the JSON Schema subset the
 * engine supports (written from the specification, not from the engine). */
#ifndef LMHOST_GRAM_TEST_H
#define LMHOST_GRAM_TEST_H

#include "grammar.h"
#include "tokenizer.h"

#include <json-c/json.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#if defined(__SANITIZE_ADDRESS__)
#define GT_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define GT_SANITIZED 1
#endif
#endif
#ifndef GT_SANITIZED
#define GT_SANITIZED 0
#endif

static int gt_failures __attribute__((unused));

#define GT_CHECK(cond, ...)                                                                        \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);                                   \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fprintf(stderr, "\n");                                                                 \
            gt_failures++;                                                                         \
        }                                                                                          \
    } while (0)

#ifndef GT_CLOCK
#define GT_CLOCK CLOCK_MONOTONIC
#endif

static inline double gt_now(void) {
    struct timespec ts;
    clock_gettime(GT_CLOCK, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* $LMHOST_TOKENIZERS/NAME (default ~/.cache/lmhost/tokenizers/NAME); NULL with a message
 * saying how to fetch it when it is not there. */
static inline tok_tokenizer *gt_load_tokenizer(const char *name) {
    char dir[4096], err[512];
    const char *root = getenv("LMHOST_TOKENIZERS");
    if (root && *root)
        snprintf(dir, sizeof dir, "%s/%s", root, name);
    else
        snprintf(dir, sizeof dir, "%s/.cache/lmhost/tokenizers/%s",
                 getenv("HOME") ? getenv("HOME") : ".", name);
    tok_tokenizer *t = tok_load(dir, err, sizeof err);
    if (!t)
        fprintf(stderr,
                "FAIL: cannot load the %s tokenizer from %s: %s\n"
                "  fetch it with tools/fetch_tokenizers.sh ~/.cache/lmhost/tokenizers (or set "
                "LMHOST_TOKENIZERS)\n",
                name, dir, err);
    return t;
}

static inline uint64_t gt_rand(uint64_t *s) {
    uint64_t x = *s += 0x9E3779B97F4A7C15ULL;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
    return x ^ (x >> 31);
}

/* The k-th set bit (k < the number of set bits). */
static inline int32_t gt_nth_bit(const uint32_t *bits, int32_t words, int64_t k) {
    for (int32_t w = 0; w < words; w++) {
        int c = __builtin_popcount(bits[w]);
        if (k < c) {
            uint32_t x = bits[w];
            for (; k; k--) x &= x - 1;
            return w * 32 + __builtin_ctz(x);
        }
        k -= c;
    }
    return -1;
}

static inline bool gt_bit(const uint32_t *bits, int32_t id) {
    return bits[id >> 5] >> (id & 31) & 1;
}

/* ---- a validator for the supported subset ---------------------------------------------- */

static inline json_object *gt_resolve(json_object *root, const char *ref) {
    if (ref[0] != '#') return NULL;
    json_object *cur = root;
    const char *p = ref + 1;
    char seg[512];
    while (cur && *p == '/') {
        const char *e = strchr(p + 1, '/');
        size_t n = e ? (size_t)(e - p - 1) : strlen(p + 1), o = 0;
        for (size_t i = 0; i < n && o < sizeof seg - 1; i++) {
            if (p[1 + i] == '~' && i + 1 < n) {
                seg[o++] = p[2 + i] == '1' ? '/' : '~';
                i++;
            } else {
                seg[o++] = p[1 + i];
            }
        }
        seg[o] = 0;
        json_object *nx = NULL;
        if (json_object_is_type(cur, json_type_object))
            cur = json_object_object_get_ex(cur, seg, &nx) ? nx : NULL;
        else if (json_object_is_type(cur, json_type_array))
            cur = json_object_array_get_idx(cur, (size_t)atoi(seg));
        else
            cur = NULL;
        p += 1 + n;
    }
    return cur;
}

static inline size_t gt_codepoints(const char *s, size_t n) {
    size_t c = 0;
    for (size_t i = 0; i < n; i++) c += ((unsigned char)s[i] & 0xC0) != 0x80;
    return c;
}

static inline bool gt_is_type(json_object *v, const char *t) {
    json_type jt = json_object_get_type(v);
    if (!strcmp(t, "null")) return jt == json_type_null;
    if (!strcmp(t, "boolean")) return jt == json_type_boolean;
    if (!strcmp(t, "string")) return jt == json_type_string;
    if (!strcmp(t, "array")) return jt == json_type_array;
    if (!strcmp(t, "object")) return jt == json_type_object;
    if (!strcmp(t, "number")) return jt == json_type_int || jt == json_type_double;
    if (!strcmp(t, "integer")) {
        if (jt == json_type_int) return true;
        if (jt != json_type_double) return false;
        double d = json_object_get_double(v);
        return d == (double)(long long)d;
    }
    return false;
}

static inline bool gt_valid(json_object *v, json_object *s, json_object *root, int depth);

static inline bool gt_valid_kw(json_object *v, json_object *s, json_object *root, int depth) {
    json_object *x;
    if (json_object_object_get_ex(s, "$ref", &x))
        return gt_valid(v, gt_resolve(root, json_object_get_string(x)), root, depth + 1);
    if (json_object_object_get_ex(s, "allOf", &x)) {
        for (size_t i = 0; i < json_object_array_length(x); i++)
            if (!gt_valid(v, json_object_array_get_idx(x, i), root, depth + 1)) return false;
    }
    if (json_object_object_get_ex(s, "anyOf", &x)) {
        bool any = false;
        for (size_t i = 0; i < json_object_array_length(x) && !any; i++)
            any = gt_valid(v, json_object_array_get_idx(x, i), root, depth + 1);
        if (!any) return false;
    }
    if (json_object_object_get_ex(s, "oneOf", &x)) {
        int n = 0;
        for (size_t i = 0; i < json_object_array_length(x); i++)
            n += gt_valid(v, json_object_array_get_idx(x, i), root, depth + 1);
        if (n != 1) return false;
    }
    if (json_object_object_get_ex(s, "const", &x) && !json_object_equal(v, x)) return false;
    if (json_object_object_get_ex(s, "enum", &x)) {
        bool in = false;
        for (size_t i = 0; i < json_object_array_length(x) && !in; i++)
            in = json_object_equal(v, json_object_array_get_idx(x, i));
        if (!in) return false;
    }
    if (json_object_object_get_ex(s, "type", &x)) {
        bool ok = false;
        if (json_object_is_type(x, json_type_string)) {
            ok = gt_is_type(v, json_object_get_string(x));
        } else {
            for (size_t i = 0; i < json_object_array_length(x) && !ok; i++)
                ok = gt_is_type(v, json_object_get_string(json_object_array_get_idx(x, i)));
        }
        if (!ok) return false;
    }
    if (json_object_is_type(v, json_type_string)) {
        size_t n = gt_codepoints(json_object_get_string(v), (size_t)json_object_get_string_len(v));
        if (json_object_object_get_ex(s, "minLength", &x) && n < (size_t)json_object_get_int(x))
            return false;
        if (json_object_object_get_ex(s, "maxLength", &x) && n > (size_t)json_object_get_int(x))
            return false;
    }
    if (json_object_is_type(v, json_type_array)) {
        size_t n = json_object_array_length(v), k = 0;
        if (json_object_object_get_ex(s, "minItems", &x) && n < (size_t)json_object_get_int(x))
            return false;
        if (json_object_object_get_ex(s, "maxItems", &x) && n > (size_t)json_object_get_int(x))
            return false;
        json_object *pre = NULL, *items = NULL;
        if (json_object_object_get_ex(s, "prefixItems", &pre)) {
            k = json_object_array_length(pre);
            for (size_t i = 0; i < k && i < n; i++)
                if (!gt_valid(json_object_array_get_idx(v, i), json_object_array_get_idx(pre, i),
                              root, depth + 1))
                    return false;
        }
        if (json_object_object_get_ex(s, "items", &items))
            for (size_t i = k; i < n; i++)
                if (!gt_valid(json_object_array_get_idx(v, i), items, root, depth + 1))
                    return false;
    }
    if (json_object_is_type(v, json_type_object)) {
        json_object *props = NULL, *req = NULL, *ap = NULL;
        json_object_object_get_ex(s, "properties", &props);
        json_object_object_get_ex(s, "additionalProperties", &ap);
        if (json_object_object_get_ex(s, "required", &req))
            for (size_t i = 0; i < json_object_array_length(req); i++)
                if (!json_object_object_get_ex(
                        v, json_object_get_string(json_object_array_get_idx(req, i)), NULL))
                    return false;
        json_object_object_foreach(v, key, val) {
            json_object *ps = NULL;
            if (props && json_object_object_get_ex(props, key, &ps)) {
                if (!gt_valid(val, ps, root, depth + 1)) return false;
            } else if (ap && !gt_valid(val, ap, root, depth + 1)) {
                return false;
            }
        }
    }
    return true;
}

static inline bool gt_valid(json_object *v, json_object *s, json_object *root, int depth) {
    if (!s || depth > 200) return false;
    if (json_object_is_type(s, json_type_boolean)) return json_object_get_boolean(s);
    return gt_valid_kw(v, s, root, depth);
}

/* Strict JSON of the whole text (no trailing bytes, valid UTF-8): true and *out (NULL for
 * a JSON null). */
static inline bool gt_parse_strict(const char *text, size_t n, json_object **out) {
    json_tokener *tk = json_tokener_new_ex(512);
    json_tokener_set_flags(tk, JSON_TOKENER_STRICT | JSON_TOKENER_VALIDATE_UTF8);
    json_object *o = json_tokener_parse_ex(tk, text, (int)n);
    enum json_tokener_error e = json_tokener_get_error(tk);
    bool ok = false;
    if (e == json_tokener_success) {
        ok = json_tokener_get_parse_end(tk) == n; /* no bytes after the value */
    } else if (e == json_tokener_continue) {
        /* a bare number needs to know that the text ended */
        o = json_tokener_parse_ex(tk, "", 1);
        ok = json_tokener_get_error(tk) == json_tokener_success;
    }
    json_tokener_free(tk);
    if (!ok) {
        json_object_put(o);
        o = NULL;
    }
    *out = o;
    return ok;
}

/* Whitespace only as one space after ':' or ',' (outside strings). */
static inline bool gt_whitespace_ok(const char *s, size_t n) {
    bool in_str = false;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (in_str) {
            if (c == '\\')
                i++;
            else if (c == '"')
                in_str = false;
            continue;
        }
        if (c == '"') in_str = true;
        if (c == ' ' || c == '\t' || c == '\n' || c == '\r') {
            if (c != ' ' || !i || (s[i - 1] != ':' && s[i - 1] != ',')) return false;
        }
    }
    return true;
}

#endif
