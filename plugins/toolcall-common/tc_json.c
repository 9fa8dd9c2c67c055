/* Strict JSON for the tool-call plugins (tc_common.h): call objects and arguments validated
 * and written back compact, and the JSON Schema of a call object for the grammars. */
#include "tc_common.h"

#include <stdlib.h>
#include <string.h>

/* ---- text buffers and calls ------------------------------------------------------------ */

int tcc_buf_add(tcc_buf *b, const char *s, size_t n) {
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

void tcc_buf_free(tcc_buf *b) {
    if (!b) return;
    free(b->p);
    b->p = NULL;
    b->len = b->cap = 0;
}

static char *take(tcc_buf *b) { /* the buffer's text, owned by the caller ("" when empty) */
    char *s = b->p ? b->p : strdup("");
    b->p = NULL;
    b->len = b->cap = 0;
    return s;
}

void tcc_call_clear(tcc_call *c) {
    free(c->name);
    free(c->arguments);
    c->name = c->arguments = NULL;
}

void tcc_calls_free(tcc_call *c, int n) {
    for (int i = 0; c && i < n; i++) tcc_call_clear(&c[i]);
    free(c);
}

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
    while (j->i < j->n && tcc_is_ws((unsigned char)j->s[j->i])) j->i++;
}

static void put(jp *j, tcc_buf *out, const char *s, size_t n) {
    if (out && tcc_buf_add(out, s, n)) j->oom = 1;
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

static void put_utf8(jp *j, tcc_buf *out, uint32_t u) {
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
static int jp_string(jp *j, tcc_buf *raw, tcc_buf *dec) {
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

static int jp_number(jp *j, tcc_buf *out) {
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

static int jp_word(jp *j, const char *w, tcc_buf *out) {
    size_t n = strlen(w);
    if (j->n - j->i < n || memcmp(j->s + j->i, w, n)) return -1;
    j->i += n;
    put(j, out, w, n);
    return 0;
}

static int jp_value(jp *j, tcc_buf *out);

static int jp_object(jp *j, tcc_buf *out) {
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

static int jp_array(jp *j, tcc_buf *out) {
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

static int jp_value(jp *j, tcc_buf *out) {
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

/* A call object at j->i: {"name": N, "arguments" or "parameters": {...}}, other members
 * checked and ignored. The name must be a non-empty string, the arguments an object, and
 * neither may appear twice. */
static int jp_call(jp *j, tcc_call *out) {
    tcc_buf key = {0}, name = {0}, args = {0};
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
    tcc_buf_free(&key);
    tcc_buf_free(&name);
    tcc_buf_free(&args);
    return ok ? 0 : -1;
}

/* s[0, n) is exactly one call object. */
int tcc_parse_call(const char *s, size_t n, tcc_call *out, int *oom) {
    jp j = {s, n, 0, 0, 0};
    int r = jp_call(&j, out);
    if (!r && j.i != n) {
        tcc_call_clear(out);
        r = -1;
    }
    *oom |= j.oom;
    return r;
}

/* s[0, n) is exactly one object: its compact text. */
char *tcc_parse_args(const char *s, size_t n, int *oom) {
    jp j = {s, n, 0, 0, 0};
    tcc_buf out = {0};
    if (jp_peek(&j) != '{' || jp_object(&j, &out) || j.i != n || j.oom) {
        *oom |= j.oom;
        tcc_buf_free(&out);
        return NULL;
    }
    return take(&out);
}

/* s[0, n) is exactly a non-empty array of call objects. */
int tcc_parse_call_array(const char *s, size_t n, tcc_call **calls, int *n_calls, int *oom) {
    jp j = {s, n, 0, 1, 0};
    tcc_call *a = NULL;
    int k = 0;
    j.i = 1;
    jp_ws(&j);
    for (;;) {
        tcc_call c = {0};
        if (jp_call(&j, &c)) goto fail;
        tcc_call *na = realloc(a, (size_t)(k + 1) * sizeof *a);
        if (!na) {
            tcc_call_clear(&c);
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
    tcc_calls_free(a, k);
    return -1;
}

/* ---- grammars --------------------------------------------------------------------------- */

int tcc_bare_name_ok(const char *name) {
    for (const unsigned char *s = (const unsigned char *)name; *s; s++)
        if (!tcc_name_char(*s)) return 0;
    return strlen(name) <= TCC_NAME_MAX_LEN;
}

/* s as a JSON string. */
static void put_str(jp *j, tcc_buf *out, const char *s) {
    put(j, out, "\"", 1);
    for (const unsigned char *c = (const unsigned char *)s; *c; c++) {
        char e[8];
        if (*c == '"' || *c == '\\') {
            e[0] = '\\', e[1] = (char)*c;
            put(j, out, e, 2);
        } else if (*c < 0x20) {
            static const char hex[] = "0123456789abcdef";
            memcpy(e, "\\u00", 4);
            e[4] = hex[*c >> 4], e[5] = hex[*c & 15];
            put(j, out, e, 6);
        } else {
            put(j, out, (const char *)c, 1);
        }
    }
    put(j, out, "\"", 1);
}

static void put_s(jp *j, tcc_buf *out, const char *s) {
    put(j, out, s, strlen(s));
}

char *tcc_call_schema(const char *name, const char *params, const char *key) {
    static const char *const defs_keys[] = {"\"$defs\"", "\"definitions\""};
    jp j = {params, strlen(params), 0, 0, 0};
    tcc_buf defs[2] = {{0}, {0}}, rest = {0}, mkey = {0}, out = {0};
    char *res = NULL;
    int n_rest = 0;
    /* params' members: $defs and definitions apart, the others in their order */
    jp_ws(&j);
    if (jp_peek(&j) != '{') goto done;
    j.i++;
    jp_ws(&j);
    if (jp_peek(&j) != '}') {
        for (;;) {
            mkey.len = 0;
            if (jp_peek(&j) != '"' || jp_string(&j, &mkey, NULL)) goto done;
            jp_ws(&j);
            if (jp_peek(&j) != ':') goto done;
            j.i++;
            jp_ws(&j);
            tcc_buf *dst = &rest;
            for (int k = 0; k < 2; k++)
                if (mkey.len == strlen(defs_keys[k]) && !memcmp(mkey.p, defs_keys[k], mkey.len))
                    dst = &defs[k];
            if (dst == &rest) {
                if (n_rest++) put(&j, &rest, ",", 1);
                put(&j, &rest, mkey.p, mkey.len);
                put(&j, &rest, ":", 1);
            } else {
                dst->len = 0;
            }
            if (jp_value(&j, dst)) goto done;
            jp_ws(&j);
            if (jp_peek(&j) != ',') break;
            j.i++;
            jp_ws(&j);
        }
        if (jp_peek(&j) != '}') goto done;
    }
    j.i++;
    jp_ws(&j);
    if (j.i != j.n) goto done;
    /* {"$defs":..,"type":"object","properties":{"name":{"const":NAME},KEY:PARAMS},
     *  "required":["name",KEY]} */
    put(&j, &out, "{", 1);
    for (int k = 0; k < 2; k++)
        if (defs[k].len) {
            put_s(&j, &out, defs_keys[k]);
            put(&j, &out, ":", 1);
            put(&j, &out, defs[k].p, defs[k].len);
            put(&j, &out, ",", 1);
        }
    put_s(&j, &out, "\"type\":\"object\",\"properties\":{\"name\":{\"const\":");
    put_str(&j, &out, name);
    put_s(&j, &out, "},");
    put_str(&j, &out, key);
    put_s(&j, &out, ":{");
    if (rest.len) put(&j, &out, rest.p, rest.len);
    put_s(&j, &out, "}},\"required\":[\"name\",");
    put_str(&j, &out, key);
    put_s(&j, &out, "]}");
    if (!j.oom) res = take(&out);
done:
    tcc_buf_free(&defs[0]);
    tcc_buf_free(&defs[1]);
    tcc_buf_free(&rest);
    tcc_buf_free(&mkey);
    tcc_buf_free(&out);
    return res;
}

lmh_gram *tcc_lit3(const lmh_gram_api *g, const char *a, const char *b, const char *c) {
    size_t la = strlen(a), lb = strlen(b), lc = strlen(c);
    char *s = malloc(la + lb + lc + 1);
    if (!s) return NULL;
    memcpy(s, a, la);
    memcpy(s + la, b, lb);
    memcpy(s + la + lb, c, lc + 1);
    lmh_gram *r = g->lit(s, la + lb + lc);
    free(s);
    return r;
}

lmh_gram *tcc_json(const lmh_gram_api *g, const char *schema, char *err, size_t err_len) {
    if (!schema) return NULL;
    return g->json(schema, strlen(schema), err, err_len);
}
