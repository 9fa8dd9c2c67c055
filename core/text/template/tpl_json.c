/* JSON in and out: json-c objects to template values, and the tojson filter, which is
 * transformers' own (json.dumps(x, ensure_ascii=False, indent=..., separators=...,
 * sort_keys=...)), not Jinja's HTML-escaping one. */
#include "tpl_internal.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <json-c/json.h>

#define MAX_JSON_DEPTH 200

val tpl_from_json(tctx *c, const node *at, void *jo, int depth) {
    json_object *o = jo;
    if (depth > MAX_JSON_DEPTH) tpl_fail(c, at, TPL_ERR_INPUT, "input JSON nested too deeply");
    switch (json_object_get_type(o)) {
    case json_type_null:
        return v_none();
    case json_type_boolean:
        return v_bool(json_object_get_boolean(o));
    case json_type_int: {
        int64_t i = json_object_get_int64(o);
        if (i == INT64_MAX && json_object_get_uint64(o) > (uint64_t)INT64_MAX)
            return v_float((double)json_object_get_uint64(o));
        return v_int(i);
    }
    case json_type_double:
        return v_float(json_object_get_double(o));
    case json_type_string:
        return tpl_str_val(c, at, json_object_get_string(o), (size_t)json_object_get_string_len(o));
    case json_type_array: {
        size_t n = json_object_array_length(o);
        tlist *l = tpl_list_new(c, at, n);
        val r = v_obj(V_LIST, l);
        for (size_t i = 0; i < n; i++)
            tpl_list_push(c, at, l,
                          tpl_from_json(c, at, json_object_array_get_idx(o, i), depth + 1));
        return r;
    }
    case json_type_object: {
        tdict *d = tpl_dict_new(c, at);
        val r = v_obj(V_DICT, d);
        json_object_object_foreach(o, k, v) {
            tpl_dict_set(c, at, d, tpl_cstr_val(c, at, k), tpl_from_json(c, at, v, depth + 1));
        }
        return r;
    }
    }
    return v_none();
}

static void json_str(tctx *c, const node *at, tstr *s, const char *p, size_t n, int ascii) {
    tpl_step(c, at, n / 8);
    tpl_str_addc(c, at, s, '"');
    size_t run = 0; /* start of the pending run of bytes copied as they are */
    for (size_t i = 0; i < n;) {
        unsigned char b = (unsigned char)p[i];
        const char *esc = NULL;
        char buf[16];
        size_t st = i;
        if (b < 0x80) {
            i++;
            switch (b) {
            case '"':
                esc = "\\\"";
                break;
            case '\\':
                esc = "\\\\";
                break;
            case '\n':
                esc = "\\n";
                break;
            case '\r':
                esc = "\\r";
                break;
            case '\t':
                esc = "\\t";
                break;
            case '\b':
                esc = "\\b";
                break;
            case '\f':
                esc = "\\f";
                break;
            default:
                if (b < 0x20) {
                    snprintf(buf, sizeof buf, "\\u%04x", b);
                    esc = buf;
                }
            }
        } else {
            int32_t cp = tpl_utf8_next(p, n, &i);
            if (ascii) {
                if (cp >= 0xDC80 && cp <= 0xDCFF && i - st == 1) {
                    snprintf(buf, sizeof buf, "\\u%04x", (unsigned)cp);
                } else if (cp >= 0x10000) {
                    int32_t v = cp - 0x10000;
                    snprintf(buf, sizeof buf, "\\u%04x\\u%04x", (unsigned)(0xD800 + (v >> 10)),
                             (unsigned)(0xDC00 + (v & 0x3FF)));
                } else {
                    snprintf(buf, sizeof buf, "\\u%04x", (unsigned)cp);
                }
                esc = buf;
            }
        }
        if (esc) {
            tpl_str_add(c, at, s, p + run, st - run);
            tpl_str_add(c, at, s, esc, strlen(esc));
            run = i;
        }
    }
    tpl_str_add(c, at, s, p + run, n - run);
    tpl_str_addc(c, at, s, '"');
}

static void newline_indent(tctx *c, const node *at, tstr *s, const char *indent, int level) {
    tpl_str_addc(c, at, s, '\n');
    size_t il = strlen(indent);
    for (int i = 0; i < level; i++) tpl_str_add(c, at, s, indent, il);
}

/* key of a dict as json.dumps writes it, or -1 when it can't be a key */
static int key_text(tctx *c, const node *at, tstr *out, val k) {
    char buf[64];
    switch (k.t) {
    case V_STR:
        tpl_str_add(c, at, out, VSTR(k)->s, VSTR(k)->len);
        return 0;
    case V_BOOL:
        tpl_str_add(c, at, out, k.u.i ? "true" : "false", k.u.i ? 4 : 5);
        return 0;
    case V_NONE:
        tpl_str_add(c, at, out, "null", 4);
        return 0;
    case V_INT:
        tpl_str_addf(c, at, out, "%" PRId64, k.u.i);
        return 0;
    case V_FLOAT:
        if (isnan(k.u.f))
            snprintf(buf, sizeof buf, "NaN");
        else if (isinf(k.u.f))
            snprintf(buf, sizeof buf, k.u.f < 0 ? "-Infinity" : "Infinity");
        else
            tpl_float_repr(k.u.f, buf, sizeof buf);
        tpl_str_add(c, at, out, buf, strlen(buf));
        return 0;
    default:
        return -1;
    }
}

/* stable merge sort of dict entry indices by key */
static void sort_idx(tctx *c, const node *at, const dent *e, size_t *idx, size_t *tmp, size_t n) {
    if (n < 2) return;
    size_t h = n / 2;
    sort_idx(c, at, e, idx, tmp, h);
    sort_idx(c, at, e, idx + h, tmp, n - h);
    size_t i = 0, j = h, k = 0;
    while (i < h && j < n)
        tmp[k++] = tpl_compare(c, at, e[idx[j]].k, e[idx[i]].k, "<") < 0 ? idx[j++] : idx[i++];
    while (i < h) tmp[k++] = idx[i++];
    while (j < n) tmp[k++] = idx[j++];
    memcpy(idx, tmp, n * sizeof *idx);
}

void tpl_tojson(tctx *c, const node *at, tstr *s, val v, int ascii, const char *indent,
                int has_indent, const char *item_sep, const char *key_sep, int sort_keys, int depth,
                int level) {
    if (depth > MAX_JSON_DEPTH) tpl_fail(c, at, TPL_ERR_RUNTIME, "Circular reference detected");
    tpl_step(c, at, 1);
    char buf[64];
    switch (v.t) {
    case V_NONE:
        tpl_str_add(c, at, s, "null", 4);
        return;
    case V_BOOL:
        tpl_str_add(c, at, s, v.u.i ? "true" : "false", v.u.i ? 4 : 5);
        return;
    case V_INT:
        tpl_str_addf(c, at, s, "%" PRId64, v.u.i);
        return;
    case V_FLOAT:
        if (isnan(v.u.f))
            snprintf(buf, sizeof buf, "NaN");
        else if (isinf(v.u.f))
            snprintf(buf, sizeof buf, v.u.f < 0 ? "-Infinity" : "Infinity");
        else
            tpl_float_repr(v.u.f, buf, sizeof buf);
        tpl_str_add(c, at, s, buf, strlen(buf));
        return;
    case V_STR:
        json_str(c, at, s, VSTR(v)->s, VSTR(v)->len, ascii);
        return;
    case V_LIST: {
        tlist *l = VLIST(v);
        if (!IS_PLAIN(l) || l->tuple == L_RANGE)
            tpl_fail(c, at, TPL_ERR_RUNTIME, "Object of type %s is not JSON serializable",
                     tpl_type_name(v));
        if (!l->n) {
            tpl_str_add(c, at, s, "[]", 2);
            return;
        }
        tpl_str_addc(c, at, s, '[');
        if (has_indent) newline_indent(c, at, s, indent, level + 1);
        for (size_t i = 0; i < l->n; i++) {
            if (i) {
                tpl_str_add(c, at, s, item_sep, strlen(item_sep));
                if (has_indent) newline_indent(c, at, s, indent, level + 1);
            }
            tpl_tojson(c, at, s, l->v[i], ascii, indent, has_indent, item_sep, key_sep, sort_keys,
                       depth + 1, level + 1);
        }
        if (has_indent) newline_indent(c, at, s, indent, level);
        tpl_str_addc(c, at, s, ']');
        return;
    }
    case V_DICT: {
        tdict *d = VDICT(v);
        if (!d->n) {
            tpl_str_add(c, at, s, "{}", 2);
            return;
        }
        /* the order: insertion, or sorted by key */
        tlist *order = tpl_list_new(c, at, d->n);
        size_t *idx = (size_t *)(void *)order->v; /* d->n size_t fit in d->n vals */
        for (size_t i = 0; i < d->n; i++) idx[i] = i;
        if (sort_keys) {
            tlist *tmpl = tpl_list_new(c, at, d->n);
            sort_idx(c, at, d->e, idx, (size_t *)(void *)tmpl->v, d->n);
            tpl_release(c, v_obj(V_LIST, tmpl));
        }
        tpl_str_addc(c, at, s, '{');
        if (has_indent) newline_indent(c, at, s, indent, level + 1);
        tstr *kt = tpl_str_new(c, at, 16);
        for (size_t k = 0; k < d->n; k++) {
            const dent *e = &d->e[idx[k]];
            if (k) {
                tpl_str_add(c, at, s, item_sep, strlen(item_sep));
                if (has_indent) newline_indent(c, at, s, indent, level + 1);
            }
            kt->len = 0;
            if (key_text(c, at, kt, e->k) < 0)
                tpl_fail(c, at, TPL_ERR_RUNTIME,
                         "keys must be str, int, float, bool or None, not %s", tpl_type_name(e->k));
            json_str(c, at, s, kt->s, kt->len, ascii);
            tpl_str_add(c, at, s, key_sep, strlen(key_sep));
            tpl_tojson(c, at, s, e->v, ascii, indent, has_indent, item_sep, key_sep, sort_keys,
                       depth + 1, level + 1);
        }
        if (has_indent) newline_indent(c, at, s, indent, level);
        tpl_str_addc(c, at, s, '}');
        tpl_release(c, v_obj(V_STR, kt));
        tpl_release(c, v_obj(V_LIST, order));
        return;
    }
    default:
        tpl_fail(c, at, TPL_ERR_RUNTIME, "Object of type %s is not JSON serializable",
                 tpl_type_name(v));
    }
}
