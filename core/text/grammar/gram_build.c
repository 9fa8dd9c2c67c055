/* Building grammars: the syntax tree, the public builders, and JSON Schema -> tree. The
 * tree is compiled (gram_compile.c) by every builder, so that a gram is ready to match and
 * a schema's problems show when it is built. */
#include "gram_internal.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- the tree ------------------------------------------------------------------------- */

ast *ast_new(ast_kind k) {
    ast *a = calloc(1, sizeof *a);
    if (a) a->k = k;
    return a;
}

void ast_free(ast *a) {
    if (!a) return;
    for (int i = 0; i < a->n; i++) ast_free(a->kids[i]);
    if (a->keys)
        for (int i = 0; i < a->n; i++) free(a->keys[i]);
    free(a->kids);
    free(a->keys);
    free(a->req);
    free(a->bytes);
    free(a);
}

ast *ast_lit(const char *s, size_t n, bool special) {
    ast *a = ast_new(A_LIT);
    if (!a) return NULL;
    a->bytes = malloc(n ? n : 1);
    if (!a->bytes) {
        free(a);
        return NULL;
    }
    if (n) memcpy(a->bytes, s, n);
    a->len = n;
    a->special = special;
    return a;
}

ast *ast_list(ast_kind k, ast **kids, int n) {
    bool ok = true;
    for (int i = 0; i < n; i++) ok = ok && kids[i];
    ast *a = ok ? ast_new(k) : NULL;
    if (a && n) {
        a->kids = malloc((size_t)n * sizeof *a->kids);
        if (!a->kids) {
            free(a);
            a = NULL;
        }
    }
    if (!a) {
        for (int i = 0; i < n; i++) ast_free(kids[i]);
        return NULL;
    }
    if (n) memcpy(a->kids, kids, (size_t)n * sizeof *kids);
    a->n = n;
    return a;
}

ast *ast_seq2(ast *a, ast *b) {
    ast *k[2] = {a, b};
    return ast_list(A_SEQ, k, 2);
}

ast *ast_seq3(ast *a, ast *b, ast *c) {
    ast *k[3] = {a, b, c};
    return ast_list(A_SEQ, k, 3);
}

ast *ast_alt2(ast *a, ast *b) {
    ast *k[2] = {a, b};
    return ast_list(A_ALT, k, 2);
}

static ast *ast_repeat(ast *g, ast *sep, int min, int max) {
    ast *k[2] = {g, sep ? sep : ast_new(A_EMPTY)};
    ast *a = ast_list(A_REPEAT, k, 2);
    if (!a) return NULL;
    if (!sep) { /* an empty separator is no separator */
        ast_free(a->kids[1]);
        a->n = 1;
    }
    a->min = min;
    a->max = max;
    return a;
}

static void renumber(ast *a, int off) {
    if (!a) return;
    if (a->k == A_CALL) a->rule += off;
    for (int i = 0; i < a->n; i++) renumber(a->kids[i], off);
}

/* ---- gram objects ---------------------------------------------------------------------- */

static void free_rules(ast **rules, char **names, int n) {
    for (int i = 0; i < n; i++) {
        ast_free(rules[i]);
        if (names) free(names[i]);
    }
    free(rules);
    free(names);
}

gram *gram_from_ast(ast *root, ast **rules, char **names, int n_rules, char *err, size_t err_len) {
    gram *g = root ? calloc(1, sizeof *g) : NULL;
    if (!g) {
        ast_free(root);
        free_rules(rules, names, n_rules);
        if (err && err_len && root) snprintf(err, err_len, "out of memory");
        return NULL;
    }
    g->root = root;
    g->rules = rules;
    g->rule_names = names;
    g->n_rules = n_rules;
    if (gram_compile(g, err, err_len)) {
        gram_free(g);
        return NULL;
    }
    return g;
}

ast *gram_take(gram *g, ast ***rules, char ***names, int *n_rules) {
    if (!g) return NULL;
    int n = *n_rules + g->n_rules;
    ast **r = realloc(*rules, (size_t)(n ? n : 1) * sizeof *r);
    if (r) *rules = r;
    char **nm = realloc(*names, (size_t)(n ? n : 1) * sizeof *nm);
    if (nm) *names = nm;
    if (!r || !nm) {
        gram_free(g);
        return NULL;
    }
    int off = *n_rules;
    for (int i = 0; i < g->n_rules; i++) {
        renumber(g->rules[i], off);
        r[off + i] = g->rules[i];
        nm[off + i] = g->rule_names ? g->rule_names[i] : NULL;
    }
    *n_rules = n;
    ast *root = g->root;
    renumber(root, off);
    free(g->rules);
    free(g->rule_names);
    prog_free(g->p);
    free(g);
    return root;
}

void gram_free(gram *g) {
    if (!g) return;
    ast_free(g->root);
    free_rules(g->rules, g->rule_names, g->n_rules);
    prog_free(g->p);
    free(g);
}

gram *gram_lit(const char *bytes, size_t len) {
    if (!bytes && len) return NULL;
    return gram_from_ast(ast_lit(bytes, len, true), NULL, NULL, 0, NULL, 0);
}

static gram *combine(ast_kind k, gram **parts, int n) {
    ast **rules = NULL;
    char **names = NULL;
    int n_rules = 0;
    bool ok = parts && n >= 0;
    for (int i = 0; ok && i < n; i++) ok = parts[i] != NULL;
    ast **kids = ok ? calloc((size_t)(n ? n : 1), sizeof *kids) : NULL;
    if (!kids) {
        for (int i = 0; parts && i < n; i++) gram_free(parts[i]);
        return NULL;
    }
    for (int i = 0; i < n; i++) {
        kids[i] = gram_take(parts[i], &rules, &names, &n_rules);
        ok = ok && kids[i];
    }
    ast *root = ok ? ast_list(k, kids, n) : NULL;
    if (!ok)
        for (int i = 0; i < n; i++) ast_free(kids[i]);
    free(kids);
    return gram_from_ast(root, rules, names, n_rules, NULL, 0);
}

gram *gram_seq(gram **parts, int n) {
    return combine(A_SEQ, parts, n);
}

gram *gram_alt(gram **parts, int n) {
    return combine(A_ALT, parts, n);
}

gram *gram_repeat(gram *g, gram *sep, int min, int max) {
    if (!g || min < 0 || min > GRAM_MAX_COUNT || max > GRAM_MAX_COUNT || (max >= 0 && max < min) ||
        max < -1) {
        gram_free(g);
        gram_free(sep);
        return NULL;
    }
    ast **rules = NULL;
    char **names = NULL;
    int n_rules = 0;
    ast *a = gram_take(g, &rules, &names, &n_rules);
    ast *s = sep ? gram_take(sep, &rules, &names, &n_rules) : NULL;
    ast *r = a && (s || !sep) ? ast_repeat(a, s, min, max) : NULL;
    if (!r) {
        if (!a || (sep && !s)) {
            ast_free(a);
            ast_free(s);
        }
        free_rules(rules, names, n_rules);
        return NULL;
    }
    return gram_from_ast(r, rules, names, n_rules, NULL, 0);
}

gram *gram_until(const char *end, size_t len) {
    if (!end && len) return NULL;
    ast *a = ast_lit(end, len, true);
    if (a) a->k = A_UNTIL;
    return gram_from_ast(a, NULL, NULL, 0, NULL, 0);
}

/* ---- JSON Schema ------------------------------------------------------------------------ */

typedef struct {
    json_object *doc;
    ast **rules;
    char **names;
    int n_rules;
    char **ref_ptr; /* resolved $ref targets, one rule each */
    int *ref_rule;
    int n_refs;
    int any_rule;
    char *err;
    size_t err_len;
    bool failed;
    char *path; /* JSON pointer of the schema being compiled */
    size_t path_len, path_cap;
    int depth;
} jc;

static void jfail(jc *c, const char *fmt, ...) {
    if (c->failed) return;
    c->failed = true;
    if (!c->err || !c->err_len) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->err, c->err_len, fmt, ap);
    va_end(ap);
}

static const char *jpath(jc *c) {
    return c->path_len ? c->path : "#";
}

/* Appends "/seg" (~ and / escaped); returns the old length for jpop. */
static size_t jpush(jc *c, const char *seg) {
    size_t old = c->path_len, need = old + 2 * strlen(seg) + 3;
    if (need > c->path_cap) {
        size_t cap = need * 2;
        char *p = realloc(c->path, cap);
        if (!p) {
            jfail(c, "out of memory");
            return old;
        }
        c->path = p;
        c->path_cap = cap;
    }
    char *p = c->path + old;
    if (!old) *p++ = '#';
    *p++ = '/';
    for (const char *s = seg; *s; s++) {
        if (*s == '~' || *s == '/') {
            *p++ = '~';
            *p++ = *s == '~' ? '0' : '1';
        } else {
            *p++ = *s;
        }
    }
    *p = 0;
    c->path_len = (size_t)(p - c->path);
    return old;
}

static size_t jpush_idx(jc *c, const char *kw, size_t i) {
    char num[32];
    size_t old = jpush(c, kw);
    snprintf(num, sizeof num, "%zu", i);
    jpush(c, num);
    return old;
}

static void jpop(jc *c, size_t old) {
    c->path_len = old;
    if (c->path) c->path[old] = 0;
}

static const char *const ANNOTATIONS[] = {
    "title",    "description", "default",  "examples",  "$schema", "$id",
    "$comment", "deprecated",  "readOnly", "writeOnly", "$defs",   "definitions",
};

static const char *const KEYWORDS[] = {
    "type",
    "properties",
    "required",
    "additionalProperties",
    "items",
    "prefixItems",
    "additionalItems",
    "minItems",
    "maxItems",
    "enum",
    "const",
    "anyOf",
    "oneOf",
    "allOf",
    "$ref",
    "minLength",
    "maxLength",
};

static bool in_list(const char *k, const char *const *l, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!strcmp(k, l[i])) return true;
    return false;
}

static bool is_annotation(const char *k) {
    return in_list(k, ANNOTATIONS, sizeof ANNOTATIONS / sizeof *ANNOTATIONS);
}

/* The first keyword of s beside `kw` that is not an annotation, or NULL. */
static const char *other_keyword(json_object *s, const char *kw, const char *kw2) {
    json_object_object_foreach(s, k, v) {
        (void)v;
        if (strcmp(k, kw) && (!kw2 || strcmp(k, kw2)) && !is_annotation(k)) return k;
    }
    return NULL;
}

/* A JSON string literal of s (quotes, escapes for '"', '\\' and control characters). */
static int put_json_string(char **buf, size_t *n, size_t *cap, const char *s, size_t len) {
    size_t need = *n + len * 6 + 3;
    if (need > *cap) {
        size_t nc = need * 2;
        char *p = realloc(*buf, nc);
        if (!p) return -1;
        *buf = p;
        *cap = nc;
    }
    char *p = *buf + *n;
    *p++ = '"';
    for (size_t i = 0; i < len; i++) {
        unsigned char ch = (unsigned char)s[i];
        if (ch == '"' || ch == '\\') {
            *p++ = '\\';
            *p++ = (char)ch;
        } else if (ch < 0x20) {
            static const char esc[] = "btnvfr";
            if (ch >= 8 && ch <= 13 && ch != 11) {
                *p++ = '\\';
                *p++ = esc[ch - 8];
            } else {
                p += sprintf(p, "\\u%04x", ch);
            }
        } else {
            *p++ = (char)ch;
        }
    }
    *p++ = '"';
    *n = (size_t)(p - *buf);
    return 0;
}

static int put_bytes(char **buf, size_t *n, size_t *cap, const char *s, size_t len) {
    if (*n + len + 1 > *cap) {
        size_t nc = (*n + len + 1) * 2;
        char *p = realloc(*buf, nc);
        if (!p) return -1;
        *buf = p;
        *cap = nc;
    }
    memcpy(*buf + *n, s, len);
    *n += len;
    return 0;
}

/* The compact JSON text of v (no whitespace at all). */
static int put_json(char **buf, size_t *n, size_t *cap, json_object *v, int depth) {
    if (depth > 256) return -1;
    switch (json_object_get_type(v)) {
    case json_type_string:
        return put_json_string(buf, n, cap, json_object_get_string(v),
                               (size_t)json_object_get_string_len(v));
    case json_type_array: {
        if (put_bytes(buf, n, cap, "[", 1)) return -1;
        size_t len = json_object_array_length(v);
        for (size_t i = 0; i < len; i++)
            if ((i && put_bytes(buf, n, cap, ",", 1)) ||
                put_json(buf, n, cap, json_object_array_get_idx(v, i), depth + 1))
                return -1;
        return put_bytes(buf, n, cap, "]", 1);
    }
    case json_type_object: {
        if (put_bytes(buf, n, cap, "{", 1)) return -1;
        bool first = true;
        json_object_object_foreach(v, k, x) {
            if ((!first && put_bytes(buf, n, cap, ",", 1)) ||
                put_json_string(buf, n, cap, k, strlen(k)) || put_bytes(buf, n, cap, ":", 1) ||
                put_json(buf, n, cap, x, depth + 1))
                return -1;
            first = false;
        }
        return put_bytes(buf, n, cap, "}", 1);
    }
    default: {
        const char *t = json_object_to_json_string_ext(v, JSON_C_TO_STRING_PLAIN);
        return put_bytes(buf, n, cap, t, strlen(t));
    }
    }
}

static ast *lit(const char *s) {
    return ast_lit(s, strlen(s), false);
}

static ast *ws(void) {
    return ast_alt2(ast_new(A_EMPTY), lit(" "));
}

static ast *sep(void) {
    return ast_seq2(lit(","), ws());
}

static ast *string_ast(int min, int max) {
    ast *s = ast_new(A_STRING);
    if (s) {
        s->min = min;
        s->max = max;
    }
    return ast_seq3(lit("\""), s, lit("\""));
}

static ast *number_ast(bool integer) {
    ast *a = ast_new(A_NUMBER);
    if (a) a->integer = integer;
    return a;
}

static ast *call_ast(int rule) {
    ast *a = rule >= 0 ? ast_new(A_CALL) : NULL;
    if (a) a->rule = rule;
    return a;
}

static int add_rule(jc *c, const char *name) {
    ast **r = realloc(c->rules, (size_t)(c->n_rules + 1) * sizeof *r);
    if (r) c->rules = r;
    char **nm = realloc(c->names, (size_t)(c->n_rules + 1) * sizeof *nm);
    if (nm) c->names = nm;
    char *dup = name ? strdup(name) : NULL;
    if (!r || !nm || (name && !dup)) {
        free(dup);
        jfail(c, "out of memory");
        return -1;
    }
    c->rules[c->n_rules] = NULL;
    c->names[c->n_rules] = dup;
    return c->n_rules++;
}

/* The rule for any JSON value (made on first use). */
static int any_rule(jc *c) {
    if (c->any_rule >= 0) return c->any_rule;
    int r = add_rule(c, "any JSON value");
    if (r < 0) return -1;
    c->any_rule = r;
    ast *member = ast_seq2(string_ast(0, -1), ast_seq3(lit(":"), ws(), call_ast(r)));
    ast *obj = ast_seq3(lit("{"), ast_repeat(member, sep(), 0, -1), lit("}"));
    ast *arr = ast_seq3(lit("["), ast_repeat(call_ast(r), sep(), 0, -1), lit("]"));
    ast *k[] = {obj,         arr,          string_ast(0, -1), number_ast(false),
                lit("true"), lit("false"), lit("null")};
    c->rules[r] = ast_list(A_ALT, k, 7);
    if (!c->rules[r]) {
        jfail(c, "out of memory");
        return -1;
    }
    return r;
}

static ast *j_schema(jc *c, json_object *s);

/* A count keyword: absent -> def; else a non-negative integer up to GRAM_MAX_COUNT. */
static int j_count(jc *c, json_object *s, const char *kw, int def) {
    json_object *v;
    if (!json_object_object_get_ex(s, kw, &v)) return def;
    bool integral = json_object_is_type(v, json_type_int) ||
                    (json_object_is_type(v, json_type_double) &&
                     json_object_get_double(v) == (double)(int64_t)json_object_get_double(v));
    if (!integral) {
        jfail(c, "'%s' at %s must be a non-negative integer", kw, jpath(c));
        return -2;
    }
    int64_t x = json_object_is_type(v, json_type_int) ? json_object_get_int64(v)
                                                      : (int64_t)json_object_get_double(v);
    if (x < 0) {
        jfail(c, "'%s' at %s must be a non-negative integer", kw, jpath(c));
        return -2;
    }
    if (x > GRAM_MAX_COUNT) {
        jfail(c, "'%s' %lld at %s is too large (at most %d)", kw, (long long)x, jpath(c),
              GRAM_MAX_COUNT);
        return -2;
    }
    return (int)x;
}

/* JSON pointer unescaping (~0 ~1 and %XX) of one segment of length n into out. */
static void unescape_seg(const char *s, size_t n, char *out) {
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] == '~' && i + 1 < n && (s[i + 1] == '0' || s[i + 1] == '1')) {
            out[o++] = s[++i] == '0' ? '~' : '/';
        } else if (s[i] == '%' && i + 2 < n) {
            char hex[3] = {s[i + 1], s[i + 2], 0};
            char *end;
            long v = strtol(hex, &end, 16);
            if (*end || v <= 0) {
                out[o++] = s[i];
            } else {
                out[o++] = (char)v;
                i += 2;
            }
        } else {
            out[o++] = s[i];
        }
    }
    out[o] = 0;
}

static json_object *resolve(jc *c, const char *ref) {
    if (ref[0] != '#' || (ref[1] && ref[1] != '/')) {
        jfail(c,
              "'$ref' at %s: only references within the schema (\"#/...\") are supported, "
              "not \"%s\"",
              jpath(c), ref);
        return NULL;
    }
    json_object *cur = c->doc;
    const char *p = ref + 1;
    char *seg = malloc(strlen(ref) + 1);
    if (!seg) {
        jfail(c, "out of memory");
        return NULL;
    }
    while (cur && *p == '/') {
        const char *e = strchr(p + 1, '/');
        size_t n = e ? (size_t)(e - p - 1) : strlen(p + 1);
        unescape_seg(p + 1, n, seg);
        if (json_object_is_type(cur, json_type_object)) {
            json_object *nx = NULL;
            cur = json_object_object_get_ex(cur, seg, &nx) ? nx : NULL;
        } else if (json_object_is_type(cur, json_type_array)) {
            char *end;
            unsigned long i = strtoul(seg, &end, 10);
            cur = *seg && !*end && i < json_object_array_length(cur)
                      ? json_object_array_get_idx(cur, i)
                      : NULL;
        } else {
            cur = NULL;
        }
        p += 1 + n;
    }
    free(seg);
    if (!cur) jfail(c, "'$ref' at %s: \"%s\" is not in the schema", jpath(c), ref);
    return cur;
}

static ast *j_ref(jc *c, const char *ref) {
    for (int i = 0; i < c->n_refs; i++)
        if (!strcmp(c->ref_ptr[i], ref)) return call_ast(c->ref_rule[i]);
    json_object *target = resolve(c, ref);
    if (!target) return NULL;
    char **rp = realloc(c->ref_ptr, (size_t)(c->n_refs + 1) * sizeof *rp);
    if (rp) c->ref_ptr = rp;
    int *rr = realloc(c->ref_rule, (size_t)(c->n_refs + 1) * sizeof *rr);
    if (rr) c->ref_rule = rr;
    char *dup = strdup(ref);
    int r = rp && rr && dup ? add_rule(c, ref) : -1;
    if (r < 0) {
        free(dup);
        jfail(c, "out of memory");
        return NULL;
    }
    c->ref_ptr[c->n_refs] = dup;
    c->ref_rule[c->n_refs++] = r;
    /* the target compiles at its own place, so that messages name it */
    char *saved = c->path;
    size_t saved_len = c->path_len, saved_cap = c->path_cap;
    c->path = strdup(ref);
    if (!c->path) {
        c->path = saved;
        jfail(c, "out of memory");
        return NULL;
    }
    c->path_len = strlen(ref) > 1 ? strlen(ref) : 0;
    c->path_cap = strlen(ref) + 1;
    ast *body = j_schema(c, target);
    c->rules[r] = body;
    free(c->path);
    c->path = saved;
    c->path_len = saved_len;
    c->path_cap = saved_cap;
    return body ? call_ast(r) : NULL;
}

/* Whether v is an instance of JSON type `t`. */
static bool has_type(json_object *v, const char *t) {
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
        return d == d && d - (double)(int64_t)d == 0 && d > -9.2e18 && d < 9.2e18;
    }
    return false;
}

static const char *const TYPES[] = {"null",   "boolean", "object", "array",
                                    "number", "string",  "integer"};

/* The types s allows (bit i: TYPES[i]); -1 on error. Without "type": from its keywords. */
static int j_types(jc *c, json_object *s) {
    json_object *t;
    int mask = 0;
    if (json_object_object_get_ex(s, "type", &t)) {
        bool arr = json_object_is_type(t, json_type_array);
        size_t n = arr ? json_object_array_length(t) : 1;
        for (size_t i = 0; i < n; i++) {
            json_object *x = arr ? json_object_array_get_idx(t, i) : t;
            int k = -1;
            if (json_object_is_type(x, json_type_string))
                for (int j = 0; j < 7; j++)
                    if (!strcmp(json_object_get_string(x), TYPES[j])) k = j;
            if (k < 0) {
                jfail(c,
                      "'type' at %s must be one of null, boolean, object, array, number, "
                      "string, integer, or an array of them",
                      jpath(c));
                return -1;
            }
            mask |= 1 << k;
        }
        if (!n) mask = 0;
        return mask;
    }
    json_object *v;
    static const char *const obj_kw[] = {"properties", "required", "additionalProperties"};
    static const char *const arr_kw[] = {"items", "prefixItems", "additionalItems", "minItems",
                                         "maxItems"};
    static const char *const str_kw[] = {"minLength", "maxLength"};
    for (int i = 0; i < 3; i++)
        if (json_object_object_get_ex(s, obj_kw[i], &v)) mask |= 1 << 2;
    for (int i = 0; i < 5; i++)
        if (json_object_object_get_ex(s, arr_kw[i], &v)) mask |= 1 << 3;
    for (int i = 0; i < 2; i++)
        if (json_object_object_get_ex(s, str_kw[i], &v)) mask |= 1 << 5;
    return mask ? mask : 0x7f;
}

static ast *j_enum(jc *c, json_object *s, int types) {
    json_object *e = NULL, *k = NULL;
    bool has_e = json_object_object_get_ex(s, "enum", &e);
    bool has_c = json_object_object_get_ex(s, "const", &k);
    if (has_e && !json_object_is_type(e, json_type_array)) {
        jfail(c, "'enum' at %s must be an array", jpath(c));
        return NULL;
    }
    size_t n = has_e ? json_object_array_length(e) : 1;
    ast **alts = calloc(n ? n : 1, sizeof *alts);
    int na = 0;
    if (!alts) {
        jfail(c, "out of memory");
        return NULL;
    }
    for (size_t i = 0; i < n; i++) {
        json_object *v = has_e ? json_object_array_get_idx(e, i) : k;
        if (has_e && has_c && !json_object_equal(v, k)) continue;
        bool ok = false;
        for (int t = 0; t < 7; t++)
            if ((types >> t & 1) && has_type(v, TYPES[t])) ok = true;
        if (!ok) continue;
        char *buf = NULL;
        size_t bn = 0, cap = 0;
        if (put_json(&buf, &bn, &cap, v, 0)) {
            free(buf);
            jfail(c, "'%s' at %s: a value is too deep or out of memory", has_e ? "enum" : "const",
                  jpath(c));
            for (int j = 0; j < na; j++) ast_free(alts[j]);
            free(alts);
            return NULL;
        }
        alts[na++] = ast_lit(buf ? buf : "", bn, false);
        free(buf);
    }
    ast *r = na ? ast_list(A_ALT, alts, na) : ast_new(A_NONE);
    free(alts);
    if (!r) jfail(c, "out of memory");
    return r;
}

static ast *j_object(jc *c, json_object *s) {
    json_object *props = NULL, *req = NULL, *ap = NULL;
    bool has_p = json_object_object_get_ex(s, "properties", &props);
    bool has_r = json_object_object_get_ex(s, "required", &req);
    bool has_ap = json_object_object_get_ex(s, "additionalProperties", &ap);
    if (has_p && !json_object_is_type(props, json_type_object)) {
        jfail(c, "'properties' at %s must be an object", jpath(c));
        return NULL;
    }
    size_t nreq = 0;
    if (has_r) {
        bool ok = json_object_is_type(req, json_type_array);
        nreq = ok ? json_object_array_length(req) : 0;
        for (size_t i = 0; ok && i < nreq; i++)
            ok = json_object_is_type(json_object_array_get_idx(req, i), json_type_string);
        if (!ok) {
            jfail(c, "'required' at %s must be an array of strings", jpath(c));
            return NULL;
        }
    }
    if (has_ap && !json_object_is_type(ap, json_type_boolean) &&
        !json_object_is_type(ap, json_type_object)) {
        jfail(c, "'additionalProperties' at %s must be a boolean or a schema", jpath(c));
        return NULL;
    }
    if (!has_p && !nreq) {
        /* a map: any keys, values of additionalProperties (any value by default) */
        if (has_ap && json_object_is_type(ap, json_type_boolean) && !json_object_get_boolean(ap))
            return lit("{}");
        ast *val;
        if (has_ap && json_object_is_type(ap, json_type_object)) {
            size_t old = jpush(c, "additionalProperties");
            val = j_schema(c, ap);
            jpop(c, old);
        } else {
            val = call_ast(any_rule(c));
        }
        if (!val) return NULL;
        ast *member = ast_seq2(string_ast(0, -1), ast_seq3(lit(":"), ws(), val));
        return ast_seq3(lit("{"), ast_repeat(member, sep(), 0, -1), lit("}"));
    }
    size_t np = has_p ? (size_t)json_object_object_length(props) : 0;
    size_t cap = np + nreq;
    ast *o = ast_new(A_OBJECT);
    if (!o || !(o->kids = calloc(cap, sizeof *o->kids)) ||
        !(o->keys = calloc(cap, sizeof *o->keys)) || !(o->req = calloc(cap, sizeof *o->req))) {
        ast_free(o);
        jfail(c, "out of memory");
        return NULL;
    }
    size_t old = jpush(c, "properties");
    bool ok = true;
    if (has_p) {
        json_object_object_foreach(props, key, ps) {
            if (!ok) break;
            size_t o2 = jpush(c, key);
            ast *v = j_schema(c, ps);
            jpop(c, o2);
            char *kb = NULL;
            size_t kn = 0, kc = 0;
            if (!v || put_json_string(&kb, &kn, &kc, key, strlen(key)) ||
                put_bytes(&kb, &kn, &kc, "", 1)) {
                ast_free(v);
                free(kb);
                ok = false;
                break;
            }
            bool r = false;
            for (size_t i = 0; i < nreq; i++)
                if (!strcmp(json_object_get_string(json_object_array_get_idx(req, i)), key))
                    r = true;
            o->kids[o->n] = v;
            o->keys[o->n] = kb;
            o->req[o->n++] = r;
        }
    }
    jpop(c, old);
    /* required names without a schema of their own: any value, after the listed ones */
    for (size_t i = 0; ok && i < nreq; i++) {
        const char *key = json_object_get_string(json_object_array_get_idx(req, i));
        json_object *dummy;
        if (has_p && json_object_object_get_ex(props, key, &dummy)) continue;
        bool dup = false;
        for (size_t j = 0; j < i; j++)
            if (!strcmp(json_object_get_string(json_object_array_get_idx(req, j)), key)) dup = true;
        if (dup) continue;
        char *kb = NULL;
        size_t kn = 0, kc = 0;
        ast *v = call_ast(any_rule(c));
        if (!v || put_json_string(&kb, &kn, &kc, key, strlen(key)) ||
            put_bytes(&kb, &kn, &kc, "", 1)) {
            ast_free(v);
            free(kb);
            ok = false;
            break;
        }
        o->kids[o->n] = v;
        o->keys[o->n] = kb;
        o->req[o->n++] = true;
    }
    if (!ok) {
        ast_free(o);
        jfail(c, "out of memory");
        return NULL;
    }
    return o;
}

static ast *j_array(jc *c, json_object *s) {
    json_object *items = NULL, *prefix = NULL, *addl = NULL;
    bool has_i = json_object_object_get_ex(s, "items", &items);
    bool has_p = json_object_object_get_ex(s, "prefixItems", &prefix);
    bool has_a = json_object_object_get_ex(s, "additionalItems", &addl);
    int min = j_count(c, s, "minItems", 0), max = j_count(c, s, "maxItems", -1);
    if (min < -1 || max < -1) return NULL;
    const char *pkw = "prefixItems", *xkw = "items";
    json_object *extra = items;
    bool has_x = has_i;
    if (has_p && !json_object_is_type(prefix, json_type_array)) {
        jfail(c, "'prefixItems' at %s must be an array", jpath(c));
        return NULL;
    }
    if (has_i && json_object_is_type(items, json_type_array)) {
        if (has_p) {
            jfail(c, "'items' at %s must be a schema beside 'prefixItems'", jpath(c));
            return NULL;
        }
        /* draft 7 tuples: items [..] and additionalItems */
        prefix = items;
        has_p = true;
        pkw = "items";
        extra = addl;
        has_x = has_a;
        xkw = "additionalItems";
    }
    if (has_x && !json_object_is_type(extra, json_type_object) &&
        !json_object_is_type(extra, json_type_boolean)) {
        jfail(c, "'%s' at %s must be a schema", xkw, jpath(c));
        return NULL;
    }
    if (max >= 0 && min > max) return ast_new(A_NONE);
    size_t k = has_p ? json_object_array_length(prefix) : 0;
    if (k > 1000) { /* each position nests in the tree */
        jfail(c, "'%s' at %s has too many schemas (at most 1000)", pkw, jpath(c));
        return NULL;
    }
    /* the schema of items past the prefix: NULL when there may be none */
    ast *item = NULL;
    bool x_false =
        has_x && json_object_is_type(extra, json_type_boolean) && !json_object_get_boolean(extra);
    bool x_schema = has_x && json_object_is_type(extra, json_type_object);
    if (x_schema) {
        size_t old = jpush(c, xkw);
        item = j_schema(c, extra);
        jpop(c, old);
        if (!item) return NULL;
    } else if (!x_false) {
        item = call_ast(any_rule(c));
        if (!item) return NULL;
    }
    if (!k) {
        if (!item) return min ? ast_new(A_NONE) : lit("[]");
        return ast_seq3(lit("["), ast_repeat(item, sep(), min, max), lit("]"));
    }
    /* past a prefix, items of an absent or true schema come only as far as minItems asks */
    int lo = min > (int)k ? min - (int)k : 0;
    int hi = max < 0 ? -1 : (max > (int)k ? max - (int)k : 0);
    if (!x_schema && (hi < 0 || hi > lo)) hi = lo;
    if (!item) hi = 0;
    if (lo > hi && hi >= 0) {
        ast_free(item);
        return ast_new(A_NONE);
    }
    size_t kk = max >= 0 && (size_t)max < k ? (size_t)max : k;
    ast *tail;
    if (kk == k && item && hi != 0) {
        tail = ast_repeat(ast_seq2(sep(), item), NULL, lo, hi);
    } else {
        ast_free(item);
        tail = ast_new(A_EMPTY);
    }
    /* positions from the last: each optional from minItems on */
    ast *chain = tail;
    for (size_t i = kk; i-- > 0;) {
        size_t old = jpush_idx(c, pkw, i);
        ast *p = j_schema(c, json_object_array_get_idx(prefix, i));
        jpop(c, old);
        if (!p) {
            ast_free(chain);
            return NULL;
        }
        ast *node = i ? ast_seq3(sep(), p, chain) : ast_seq2(p, chain);
        chain = (int)i >= min ? ast_alt2(ast_new(A_EMPTY), node) : node;
    }
    return ast_seq3(lit("["), chain, lit("]"));
}

static ast *j_string(jc *c, json_object *s) {
    int min = j_count(c, s, "minLength", 0), max = j_count(c, s, "maxLength", -1);
    if (min < -1 || max < -1) return NULL;
    if (max >= 0 && min > max) return ast_new(A_NONE);
    return string_ast(min, max);
}

static ast *j_schema(jc *c, json_object *s) {
    if (c->failed) return NULL;
    if (json_object_is_type(s, json_type_boolean))
        return json_object_get_boolean(s) ? call_ast(any_rule(c)) : ast_new(A_NONE);
    if (!json_object_is_type(s, json_type_object)) {
        jfail(c, "the schema at %s must be an object or a boolean", jpath(c));
        return NULL;
    }
    if (++c->depth > 128) {
        jfail(c, "the schema at %s is nested too deeply", jpath(c));
        c->depth--;
        return NULL;
    }
    ast *r = NULL;
    json_object *v;
    json_object_object_foreach(s, key, val) {
        (void)val;
        if (!is_annotation(key) && !in_list(key, KEYWORDS, sizeof KEYWORDS / sizeof *KEYWORDS)) {
            jfail(c, "'%s' at %s is not supported", key, jpath(c));
            goto out;
        }
    }
    if (json_object_object_get_ex(s, "$ref", &v)) {
        const char *o = other_keyword(s, "$ref", NULL);
        if (o) {
            jfail(c, "'%s' beside '$ref' at %s is not supported", o, jpath(c));
        } else if (!json_object_is_type(v, json_type_string)) {
            jfail(c, "'$ref' at %s must be a string", jpath(c));
        } else {
            r = j_ref(c, json_object_get_string(v));
        }
        goto out;
    }
    if (json_object_object_get_ex(s, "allOf", &v)) {
        const char *o = other_keyword(s, "allOf", NULL);
        if (o) {
            jfail(c, "'%s' beside 'allOf' at %s is not supported", o, jpath(c));
        } else if (!json_object_is_type(v, json_type_array) || json_object_array_length(v) != 1) {
            jfail(c, "'allOf' at %s is only supported with one schema", jpath(c));
        } else {
            size_t old = jpush_idx(c, "allOf", 0);
            r = j_schema(c, json_object_array_get_idx(v, 0));
            jpop(c, old);
        }
        goto out;
    }
    json_object *any = NULL;
    const char *akw = json_object_object_get_ex(s, "anyOf", &any)   ? "anyOf"
                      : json_object_object_get_ex(s, "oneOf", &any) ? "oneOf"
                                                                    : NULL;
    if (akw) {
        /* oneOf as anyOf: the branches of the schemas met in practice exclude each other */
        const char *o = other_keyword(s, akw, NULL);
        if (o) {
            jfail(c, "'%s' beside '%s' at %s is not supported", o, akw, jpath(c));
        } else if (!json_object_is_type(any, json_type_array) || !json_object_array_length(any)) {
            jfail(c, "'%s' at %s must be a non-empty array of schemas", akw, jpath(c));
        } else {
            size_t n = json_object_array_length(any);
            ast **alts = calloc(n, sizeof *alts);
            bool ok = alts != NULL;
            for (size_t i = 0; ok && i < n; i++) {
                size_t old = jpush_idx(c, akw, i);
                alts[i] = j_schema(c, json_object_array_get_idx(any, i));
                jpop(c, old);
                ok = alts[i] != NULL;
            }
            if (ok) {
                r = ast_list(A_ALT, alts, (int)n);
            } else if (alts) {
                for (size_t i = 0; i < n; i++) ast_free(alts[i]);
            }
            free(alts);
            if (!r) jfail(c, "out of memory");
        }
        goto out;
    }
    int types = j_types(c, s);
    if (types < 0) goto out;
    if (json_object_object_get_ex(s, "enum", &v) || json_object_object_get_ex(s, "const", &v)) {
        /* the values as listed, of the types "type" names (without it, of any type) */
        r = j_enum(c, s, json_object_object_get_ex(s, "type", &v) ? types : 0x7f);
        goto out;
    }
    if ((types & (1 << 4)) && (types & (1 << 6))) types &= ~(1 << 6); /* number has integers */
    ast *alts[7];
    int n = 0;
    for (int t = 0; t < 7 && !c->failed; t++) {
        if (!(types >> t & 1)) continue;
        ast *a = NULL;
        switch (t) {
        case 0:
            a = lit("null");
            break;
        case 1:
            a = ast_alt2(lit("true"), lit("false"));
            break;
        case 2:
            a = j_object(c, s);
            break;
        case 3:
            a = j_array(c, s);
            break;
        case 4:
            a = number_ast(false);
            break;
        case 5:
            a = j_string(c, s);
            break;
        case 6:
            a = number_ast(true);
            break;
        }
        if (!a) {
            jfail(c, "out of memory");
            break;
        }
        alts[n++] = a;
    }
    if (c->failed) {
        for (int i = 0; i < n; i++) ast_free(alts[i]);
    } else {
        r = n == 1 ? alts[0] : n ? ast_list(A_ALT, alts, n) : ast_new(A_NONE);
        if (!r) jfail(c, "out of memory");
    }
out:
    c->depth--;
    if (c->failed) {
        ast_free(r);
        return NULL;
    }
    return r;
}

gram *gram_json(json_object *schema, char *err, size_t err_len) {
    if (err && err_len) err[0] = 0;
    jc c = {.doc = schema, .any_rule = -1, .err = err, .err_len = err_len};
    ast *root = schema ? j_schema(&c, schema) : call_ast(any_rule(&c));
    for (int i = 0; i < c.n_refs; i++) free(c.ref_ptr[i]);
    free(c.ref_ptr);
    free(c.ref_rule);
    free(c.path);
    if (!root) {
        if (!c.failed) jfail(&c, "out of memory");
        free_rules(c.rules, c.names, c.n_rules);
        return NULL;
    }
    return gram_from_ast(root, c.rules, c.names, c.n_rules, err, err_len);
}
