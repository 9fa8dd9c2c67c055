/* Values of the Jinja interpreter: reference-counted heap objects of one render (strings,
 * lists, insertion-ordered dicts, frames, functions), Python's semantics for truth, equality,
 * ordering and str()/repr(), and the render's error and budget plumbing. */
#include "tpl_internal.h"

#include <errno.h>
#include <float.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_NEST 200 /* nesting of values walked recursively (repr, ==, tojson) */

/* ---- errors and budgets ---------------------------------------------------------------- */

static void vfail_msg(tctx *c, const node *at, int code, const char *fmt, va_list ap) {
    char msg[1024];
    vsnprintf(msg, sizeof msg, fmt, ap);
    free(c->err);
    c->err = NULL;
    size_t n = strlen(msg) + 48;
    c->err = malloc(n);
    if (c->err) {
        if (at)
            snprintf(c->err, n, "%d:%d: %s", at->line, at->col, msg);
        else
            snprintf(c->err, n, "%s", msg);
    }
    c->err_code = code;
}

void tpl_fail(tctx *c, const node *at, int code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vfail_msg(c, at, code, fmt, ap);
    va_end(ap);
    longjmp(*c->jb, 1);
}

/* Python-style short description of an object for "has no attribute" messages. */
static const char *object_type_repr(val v) {
    switch (v.t) {
    case V_NONE:
        return "None";
    case V_BOOL:
        return "bool object";
    case V_INT:
        return "int object";
    case V_FLOAT:
        return "float object";
    case V_STR:
        return "str object";
    case V_LIST:
        switch (VLIST(v)->tuple) {
        case L_LIST:
            return "list object";
        case L_KEYS:
            return "dict_keys object";
        case L_VALUES:
            return "dict_values object";
        case L_ITEMS:
            return "dict_items object";
        case L_RANGE:
            return "range object";
        case L_GEN:
            return "generator object";
        case L_REVITER:
            return "list_reverseiterator object";
        default:
            return "tuple object";
        }
    case V_DICT:
        return "dict object";
    case V_NS:
        return "jinja2.utils.Namespace object";
    case V_FUNC:
        return VFUNC(v)->kind == F_MACRO ? "jinja2.runtime.Macro object" : "function object";
    case V_LOOP:
        return "jinja2.runtime.LoopContext object";
    default:
        return "jinja2.runtime.Undefined object";
    }
}

void tpl_fail_lazy(tctx *c, tlist *gen) {
    free(c->err);
    c->err = strdup(gen->lazy_err->s);
    c->err_code = TPL_ERR_RUNTIME;
    longjmp(*c->jb, 1);
}

void tpl_fail_undef(tctx *c, const node *at, val u) {
    tundef *d = u.t == V_UNDEF ? (tundef *)u.u.o : NULL;
    if (!d) tpl_fail(c, at, TPL_ERR_RUNTIME, "undefined value used");
    if (d->msg) tpl_fail(c, at, TPL_ERR_RUNTIME, "%s", d->msg->s);
    if (d->obj.t == V_UNDEF && d->name.t == V_STR)
        tpl_fail(c, at, TPL_ERR_RUNTIME, "'%s' is undefined", VSTR(d->name)->s);
    if (d->name.t == V_STR)
        tpl_fail(c, at, TPL_ERR_RUNTIME, "'%s' has no attribute '%s'", object_type_repr(d->obj),
                 VSTR(d->name)->s);
    tstr *s = tpl_str_new(c, at, 16);
    tpl_repr(c, at, s, d->name, 0);
    tpl_fail(c, at, TPL_ERR_RUNTIME, "%s has no element %s", object_type_repr(d->obj), s->s);
}

void tpl_over_budget(tctx *c, const node *at) {
    tpl_fail(c, at ? at : c->pos, TPL_ERR_LIMIT,
             "step limit exceeded (%" PRIu64 " steps): the template does too much work",
             c->max_steps);
}

/* ---- memory ---------------------------------------------------------------------------- */

static void mem_add(tctx *c, const node *at, size_t n) {
    if (n > c->max_mem || c->mem > c->max_mem - n)
        tpl_fail(c, at ? at : c->pos, TPL_ERR_LIMIT, "memory limit exceeded (%zu bytes)",
                 c->max_mem);
    c->mem += n;
}

static void mem_sub(tctx *c, size_t n) {
    c->mem = n > c->mem ? 0 : c->mem - n;
}

void tpl_mem_charge(tctx *c, const node *at, size_t delta) {
    mem_add(c, at, delta);
}

static const size_t kind_size[] = {
    [O_STR] = sizeof(tstr),     [O_LIST] = sizeof(tlist), [O_DICT] = sizeof(tdict),
    [O_FUNC] = sizeof(tfunc),   [O_LOOP] = sizeof(tloop), [O_FRAME] = sizeof(tframe),
    [O_UNDEF] = sizeof(tundef),
};

void *tpl_alloc(tctx *c, size_t size, int kind) {
    tpl_step(c, NULL, 1);
    mem_add(c, NULL, size);
    hobj *o = calloc(1, size);
    if (!o) tpl_fail(c, c->pos, TPL_ERR_NOMEM, "out of memory");
    o->rc = 1;
    o->kind = (uint8_t)kind;
    o->next = c->live.next;
    o->prev = &c->live;
    c->live.next->prev = o;
    c->live.next = o;
    return o;
}

static void *xrealloc(tctx *c, const node *at, void *p, size_t n) {
    void *q = realloc(p, n ? n : 1);
    if (!q) tpl_fail(c, at ? at : c->pos, TPL_ERR_NOMEM, "out of memory");
    return q;
}

/* Frees an object's own memory; children are released by the caller when wanted. */
static void obj_free_own(tctx *c, hobj *o) {
    size_t extra = 0;
    switch (o->kind) {
    case O_STR: {
        tstr *s = (tstr *)o;
        extra = s->cap + 1;
        free(s->s);
        break;
    }
    case O_LIST: {
        tlist *l = (tlist *)o;
        extra = l->cap * sizeof(val);
        free(l->v);
        break;
    }
    case O_DICT: {
        tdict *d = (tdict *)o;
        extra = d->cap * sizeof(dent) + d->idxcap * sizeof(uint32_t);
        free(d->e);
        free(d->idx);
        break;
    }
    case O_FRAME: {
        tframe *f = (tframe *)o;
        extra = f->cap * (sizeof(tstr *) + sizeof(val));
        free(f->names);
        free(f->vals);
        break;
    }
    default:
        break;
    }
    mem_sub(c, kind_size[o->kind] + extra);
    free(o);
}

static void release_obj(tctx *c, hobj *o);

static void release_children(tctx *c, hobj *o) {
    switch (o->kind) {
    case O_LIST: {
        tlist *l = (tlist *)o;
        for (size_t i = 0; i < l->n; i++) tpl_release(c, l->v[i]);
        if (l->lazy_err) release_obj(c, &l->lazy_err->h);
        break;
    }
    case O_DICT: {
        tdict *d = (tdict *)o;
        for (size_t i = 0; i < d->n; i++) {
            tpl_release(c, d->e[i].k);
            tpl_release(c, d->e[i].v);
        }
        break;
    }
    case O_FUNC: {
        tfunc *f = (tfunc *)o;
        tpl_release(c, f->self);
        if (f->closure) release_obj(c, &f->closure->h);
        break;
    }
    case O_LOOP: {
        tloop *l = (tloop *)o;
        if (l->items) release_obj(c, &l->items->h);
        tpl_release(c, l->last);
        break;
    }
    case O_FRAME: {
        tframe *f = (tframe *)o;
        for (size_t i = 0; i < f->n; i++) {
            release_obj(c, &f->names[i]->h);
            tpl_release(c, f->vals[i]);
        }
        if (f->parent) release_obj(c, &f->parent->h);
        break;
    }
    case O_UNDEF: {
        tundef *u = (tundef *)o;
        tpl_release(c, u->name);
        tpl_release(c, u->obj);
        if (u->msg) release_obj(c, &u->msg->h);
        break;
    }
    default:
        break;
    }
}

/* Dead objects go on a list drained iteratively, so freeing a deeply nested value never
 * recurses. */
static void release_obj(tctx *c, hobj *o) {
    if (!o || o->rc < 0) return;
    if (--o->rc > 0) return;
    o->prev->next = o->next;
    o->next->prev = o->prev;
    o->next = c->dying;
    c->dying = o;
    if (c->draining) return;
    c->draining = 1;
    while ((o = c->dying)) {
        c->dying = o->next;
        release_children(c, o);
        obj_free_own(c, o);
    }
    c->draining = 0;
}

void tpl_release_obj(tctx *c, hobj *o) {
    release_obj(c, o);
}

void tpl_release(tctx *c, val v) {
    if (v.t >= V_STR || (v.t == V_UNDEF && v.u.o)) release_obj(c, v.u.o);
}

void tpl_sweep(tctx *c) {
    hobj *o = c->live.next;
    while (o != &c->live) {
        hobj *n = o->next;
        obj_free_own(c, o);
        o = n;
    }
    c->live.next = c->live.prev = &c->live;
}

/* ---- strings --------------------------------------------------------------------------- */

tstr *tpl_str_new(tctx *c, const node *at, size_t cap) {
    if (cap > c->max_output) cap = c->max_output;
    tstr *s = tpl_alloc(c, sizeof(tstr), O_STR);
    mem_add(c, at, cap + 1);
    s->s = malloc(cap + 1);
    if (!s->s) {
        mem_sub(c, cap + 1);
        tpl_fail(c, at, TPL_ERR_NOMEM, "out of memory");
    }
    s->cap = cap;
    s->s[0] = 0;
    s->ncp = 0;
    return s;
}

static void str_reserve(tctx *c, const node *at, tstr *s, size_t n) {
    if (n > c->max_output || s->len > c->max_output - n)
        tpl_fail(c, at ? at : c->pos, TPL_ERR_LIMIT, "output size limit exceeded (%zu bytes)",
                 c->max_output);
    size_t need = s->len + n;
    if (need <= s->cap) return;
    size_t cap = s->cap < 16 ? 16 : s->cap;
    while (cap < need) cap = cap > SIZE_MAX / 2 ? need : cap * 2;
    if (cap > c->max_output) cap = c->max_output;
    mem_add(c, at, cap - s->cap);
    s->s = xrealloc(c, at, s->s, cap + 1);
    s->cap = cap;
}

void tpl_str_add(tctx *c, const node *at, tstr *s, const char *p, size_t n) {
    if (!n) return;
    tpl_step(c, at, 1 + n / 16);
    str_reserve(c, at, s, n);
    memcpy(s->s + s->len, p, n);
    s->len += n;
    s->s[s->len] = 0;
    s->ncp = -1;
}

void tpl_str_addc(tctx *c, const node *at, tstr *s, char ch) {
    tpl_str_add(c, at, s, &ch, 1);
}

void tpl_str_addf(tctx *c, const node *at, tstr *s, const char *fmt, ...) {
    char buf[256];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    if ((size_t)n < sizeof buf) {
        tpl_str_add(c, at, s, buf, (size_t)n);
        return;
    }
    str_reserve(c, at, s, (size_t)n + 1);
    va_start(ap, fmt);
    vsnprintf(s->s + s->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    s->len += (size_t)n;
    s->ncp = -1;
}

void tpl_str_add_cp(tctx *c, const node *at, tstr *s, int32_t cp) {
    char b[4];
    size_t n = tpl_utf8_put(b, cp);
    tpl_str_add(c, at, s, b, n);
}

val tpl_str_val(tctx *c, const node *at, const char *p, size_t n) {
    tstr *s = tpl_str_new(c, at, n);
    tpl_str_add(c, at, s, p, n);
    return v_obj(V_STR, s);
}

val tpl_cstr_val(tctx *c, const node *at, const char *p) {
    return tpl_str_val(c, at, p, strlen(p));
}

static int64_t count_cp(const char *s, size_t n) {
    int64_t k = 0;
    for (size_t i = 0; i < n;) {
        tpl_utf8_next(s, n, &i);
        k++;
    }
    return k;
}

int64_t tpl_str_ncp(tstr *s) {
    if (s->ncp >= 0) return s->ncp;
    /* not charged: counted once per string, and the string's creation was */
    int64_t k = count_cp(s->s, s->len);
    if (s->h.rc >= 0) s->ncp = k; /* never write into a template's shared strings */
    return k;
}

tstr *tpl_str_immortal(tpl_template *t, const char *p, size_t n) {
    tstr *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    s->s = malloc(n + 1);
    if (!s->s || (t->nowned == t->capowned &&
                  !(t->owned = realloc(t->owned,
                                       (t->capowned = t->capowned * 2 + 16) * sizeof *t->owned)))) {
        free(s->s);
        free(s);
        return NULL;
    }
    memcpy(s->s, p, n);
    s->s[n] = 0;
    s->len = s->cap = n;
    s->h.rc = -1;
    s->h.kind = O_STR;
    s->ncp = count_cp(p, n);
    t->owned[t->nowned++] = &s->h;
    return s;
}

/* ---- lists and dicts ------------------------------------------------------------------- */

tlist *tpl_list_new(tctx *c, const node *at, size_t cap) {
    tlist *l = tpl_alloc(c, sizeof(tlist), O_LIST);
    if (cap) {
        if (cap > SIZE_MAX / sizeof(val) / 2) tpl_fail(c, at, TPL_ERR_LIMIT, "list too long");
        mem_add(c, at, cap * sizeof(val));
        l->v = malloc(cap * sizeof(val));
        if (!l->v) {
            mem_sub(c, cap * sizeof(val));
            tpl_fail(c, at, TPL_ERR_NOMEM, "out of memory");
        }
        l->cap = cap;
    }
    return l;
}

void tpl_list_push(tctx *c, const node *at, tlist *l, val v) {
    tpl_step(c, at, 1);
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 4;
        if (cap > SIZE_MAX / sizeof(val) / 2) tpl_fail(c, at, TPL_ERR_LIMIT, "list too long");
        mem_add(c, at, (cap - l->cap) * sizeof(val));
        l->v = xrealloc(c, at, l->v, cap * sizeof(val));
        l->cap = cap;
    }
    l->v[l->n++] = v;
}

tdict *tpl_dict_new(tctx *c, const node *at) {
    (void)at;
    return tpl_alloc(c, sizeof(tdict), O_DICT);
}

static uint64_t mix64(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ULL;
    x ^= x >> 33;
    return x;
}

static uint64_t hash_bytes(const char *p, size_t n) {
    uint64_t h = 1469598103934665603ULL;
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)p[i]) * 1099511628211ULL;
    return h;
}

uint64_t tpl_hash(tctx *c, const node *at, val k) {
    switch (k.t) {
    case V_STR:
        return hash_bytes(VSTR(k)->s, VSTR(k)->len);
    case V_BOOL:
    case V_INT:
        return mix64((uint64_t)k.u.i);
    case V_FLOAT: {
        double f = k.u.f;
        /* equal numbers hash alike: 1 == 1.0 == True */
        if (f == floor(f) && f >= -9.2e18 && f <= 9.2e18) return mix64((uint64_t)(int64_t)f);
        uint64_t b;
        memcpy(&b, &f, sizeof b);
        return mix64(b ^ 0x5bd1e995);
    }
    case V_NONE:
        return 0x9e3779b97f4a7c15ULL;
    case V_UNDEF:
        return 0x12345;
    case V_LIST:
        if (IS_ITER(VLIST(k))) return mix64((uint64_t)(uintptr_t)k.u.o);
        if (IS_TUPLE(VLIST(k)) || VLIST(k)->tuple == L_RANGE) {
            uint64_t h = 0x345678;
            for (size_t i = 0; i < VLIST(k)->n; i++) h = mix64(h ^ tpl_hash(c, at, VLIST(k)->v[i]));
            return h;
        }
        break;
    case V_FUNC:
    case V_LOOP:
        return mix64((uint64_t)(uintptr_t)k.u.o);
    default:
        break;
    }
    tpl_fail(c, at, TPL_ERR_RUNTIME, "unhashable type: '%s'", tpl_type_name(k));
}

static void dict_index_build(tctx *c, const node *at, tdict *d, size_t cap) {
    mem_add(c, at, cap * sizeof(uint32_t));
    uint32_t *idx = calloc(cap, sizeof *idx);
    if (!idx) tpl_fail(c, at, TPL_ERR_NOMEM, "out of memory");
    mem_sub(c, d->idxcap * sizeof(uint32_t));
    free(d->idx);
    d->idx = idx;
    d->idxcap = cap;
    for (size_t i = 0; i < d->n; i++) {
        size_t j = d->e[i].hash & (cap - 1);
        while (idx[j]) j = (j + 1) & (cap - 1);
        idx[j] = (uint32_t)(i + 1);
    }
}

dent *tpl_dict_find(tctx *c, const node *at, const tdict *d, val k) {
    tpl_step(c, at, 1);
    uint64_t h = tpl_hash(c, at, k);
    if (!d->idx) {
        for (size_t i = 0; i < d->n; i++)
            if (d->e[i].hash == h && tpl_equal(c, at, d->e[i].k, k)) return &d->e[i];
        return NULL;
    }
    for (size_t j = h & (d->idxcap - 1);; j = (j + 1) & (d->idxcap - 1)) {
        uint32_t e = d->idx[j];
        if (!e) return NULL;
        if (d->e[e - 1].hash == h && tpl_equal(c, at, d->e[e - 1].k, k)) return &d->e[e - 1];
    }
}

dent *tpl_dict_find_str(const tdict *d, const char *k, size_t len) {
    uint64_t h = hash_bytes(k, len);
    if (!d->idx) {
        for (size_t i = 0; i < d->n; i++) {
            const dent *e = &d->e[i];
            if (e->hash == h && e->k.t == V_STR && VSTR(e->k)->len == len &&
                !memcmp(VSTR(e->k)->s, k, len))
                return (dent *)e;
        }
        return NULL;
    }
    for (size_t j = h & (d->idxcap - 1);; j = (j + 1) & (d->idxcap - 1)) {
        uint32_t i = d->idx[j];
        if (!i) return NULL;
        const dent *e = &d->e[i - 1];
        if (e->hash == h && e->k.t == V_STR && VSTR(e->k)->len == len &&
            !memcmp(VSTR(e->k)->s, k, len))
            return (dent *)e;
    }
}

void tpl_dict_set(tctx *c, const node *at, tdict *d, val k, val v) {
    dent *e = tpl_dict_find(c, at, d, k);
    if (e) {
        tpl_release(c, e->v);
        e->v = v;
        tpl_release(c, k);
        return;
    }
    if (d->n == d->cap) {
        size_t cap = d->cap ? d->cap * 2 : 4;
        if (cap > UINT32_MAX / 4) tpl_fail(c, at, TPL_ERR_LIMIT, "dict too large");
        mem_add(c, at, (cap - d->cap) * sizeof(dent));
        d->e = xrealloc(c, at, d->e, cap * sizeof(dent));
        d->cap = cap;
    }
    uint64_t h = tpl_hash(c, at, k);
    d->e[d->n++] = (dent){k, v, h};
    if (d->n > 8 && d->n * 2 > d->idxcap) {
        size_t cap = 32;
        while (cap < d->n * 4) cap *= 2;
        dict_index_build(c, at, d, cap);
    } else if (d->idx) {
        size_t j = h & (d->idxcap - 1);
        while (d->idx[j]) j = (j + 1) & (d->idxcap - 1);
        d->idx[j] = (uint32_t)d->n;
    }
}

/* ---- frames ---------------------------------------------------------------------------- */

tframe *tpl_frame_new(tctx *c, tframe *parent) {
    tframe *f = tpl_alloc(c, sizeof(tframe), O_FRAME);
    if (parent && parent->h.rc >= 0) parent->h.rc++;
    f->parent = parent;
    return f;
}

void tpl_frame_set(tctx *c, tframe *f, tstr *name, val v) {
    for (size_t i = 0; i < f->n; i++) {
        if (f->names[i] == name ||
            (f->names[i]->len == name->len && !memcmp(f->names[i]->s, name->s, name->len))) {
            tpl_release(c, f->vals[i]);
            f->vals[i] = v;
            return;
        }
    }
    if (f->n == f->cap) {
        size_t cap = f->cap ? f->cap * 2 : 4;
        mem_add(c, NULL, (cap - f->cap) * (sizeof(tstr *) + sizeof(val)));
        f->names = xrealloc(c, NULL, f->names, cap * sizeof(tstr *));
        f->vals = xrealloc(c, NULL, f->vals, cap * sizeof(val));
        f->cap = cap;
    }
    if (name->h.rc >= 0) name->h.rc++;
    f->names[f->n] = name;
    f->vals[f->n++] = v;
}

val *tpl_frame_lookup(tframe *f, const char *name, size_t len) {
    for (; f; f = f->parent)
        for (size_t i = f->n; i-- > 0;)
            if (f->names[i]->len == len && !memcmp(f->names[i]->s, name, len)) return &f->vals[i];
    return NULL;
}

/* ---- undefined ------------------------------------------------------------------------- */

val tpl_undef_attr(tctx *c, val obj, val name) {
    tundef *u = tpl_alloc(c, sizeof(tundef), O_UNDEF);
    u->obj = vref(obj);
    u->name = vref(name);
    return v_obj(V_UNDEF, u);
}

val tpl_undef_name(tctx *c, tstr *name) {
    tundef *u = tpl_alloc(c, sizeof(tundef), O_UNDEF);
    u->name = vref(v_obj(V_STR, name));
    return v_obj(V_UNDEF, u);
}

val tpl_undef_msg(tctx *c, const char *msg) {
    tundef *u = tpl_alloc(c, sizeof(tundef), O_UNDEF);
    u->msg = VSTR(tpl_cstr_val(c, NULL, msg));
    return v_obj(V_UNDEF, u);
}

val tpl_undef_security(tctx *c, val obj, const char *attr) {
    tundef *u = tpl_alloc(c, sizeof(tundef), O_UNDEF);
    char buf[160];
    snprintf(buf, sizeof buf, "access to attribute '%s' of '%s' object is unsafe.", attr,
             tpl_type_name(obj));
    u->msg = VSTR(tpl_cstr_val(c, NULL, buf));
    return v_obj(V_UNDEF, u);
}

/* ---- Python semantics ------------------------------------------------------------------ */

const char *tpl_type_name(val v) {
    switch (v.t) {
    case V_UNDEF:
        return "Undefined";
    case V_NONE:
        return "NoneType";
    case V_BOOL:
        return "bool";
    case V_INT:
        return "int";
    case V_FLOAT:
        return "float";
    case V_STR:
        return "str";
    case V_LIST:
        switch (VLIST(v)->tuple) {
        case L_LIST:
            return "list";
        case L_KEYS:
            return "dict_keys";
        case L_VALUES:
            return "dict_values";
        case L_ITEMS:
            return "dict_items";
        case L_RANGE:
            return "range";
        case L_GEN:
            return "generator";
        case L_REVITER:
            return "list_reverseiterator";
        default:
            return "tuple";
        }
    case V_DICT:
        return "dict";
    case V_NS:
        return "Namespace";
    case V_FUNC:
        switch (VFUNC(v)->kind) {
        case F_MACRO:
            return "Macro";
        case F_METHOD:
            return "builtin_function_or_method";
        case F_JOINER:
            return "Joiner";
        case F_CYCLER:
            return "Cycler";
        default:
            return "function";
        }
    case V_LOOP:
        return "LoopContext";
    }
    return "object";
}

int tpl_truthy(val v) {
    switch (v.t) {
    case V_UNDEF:
    case V_NONE:
        return 0;
    case V_BOOL:
    case V_INT:
        return v.u.i != 0;
    case V_FLOAT:
        return v.u.f != 0.0;
    case V_STR:
        return VSTR(v)->len != 0;
    case V_LIST:
        return VLIST(v)->n != 0 || IS_ITER(VLIST(v)); /* a generator is always true */
    case V_DICT:
        return VDICT(v)->n != 0;
    default:
        return 1;
    }
}

static int is_num(val v) {
    return v.t == V_BOOL || v.t == V_INT || v.t == V_FLOAT;
}

/* Exact comparison of an integer with a double, as Python does. */
static int cmp_int_float(int64_t i, double f) {
    if (isnan(f)) return 2; /* unordered */
    if (f >= 9223372036854775808.0) return -1;
    if (f < -9223372036854775808.0) return 1;
    double fl = floor(f);
    int64_t fi = (int64_t)fl;
    if (i < fi) return -1;
    if (i > fi) return 1;
    return fl == f ? 0 : -1;
}

/* <0, 0, >0, or 2 when unordered (NaN) */
static int num_cmp(val a, val b) {
    if (a.t != V_FLOAT && b.t != V_FLOAT) return a.u.i < b.u.i ? -1 : a.u.i > b.u.i;
    if (a.t == V_FLOAT && b.t == V_FLOAT) {
        if (isnan(a.u.f) || isnan(b.u.f)) return 2;
        return a.u.f < b.u.f ? -1 : a.u.f > b.u.f;
    }
    if (a.t == V_FLOAT) {
        int r = cmp_int_float(b.u.i, a.u.f);
        return r == 2 ? 2 : -r;
    }
    return cmp_int_float(a.u.i, b.u.f);
}

static int equal_d(tctx *c, const node *at, val a, val b, int depth) {
    if (depth > MAX_NEST) tpl_fail(c, at, TPL_ERR_LIMIT, "values nested too deeply");
    tpl_step(c, at, 1);
    if (is_num(a) && is_num(b)) return num_cmp(a, b) == 0;
    if (a.t != b.t) return 0;
    switch (a.t) {
    case V_UNDEF:
    case V_NONE:
        return 1;
    case V_STR:
        return VSTR(a)->len == VSTR(b)->len && !memcmp(VSTR(a)->s, VSTR(b)->s, VSTR(a)->len);
    case V_LIST: {
        tlist *x = VLIST(a), *y = VLIST(b);
        if (x == y) return 1;
        if (IS_ITER(x) || IS_ITER(y) || (x->tuple == L_RANGE) != (y->tuple == L_RANGE)) return 0;
        if (IS_TUPLE(x) != IS_TUPLE(y) || (IS_VIEW(x) && x->tuple != y->tuple) ||
            IS_VIEW(x) != IS_VIEW(y) || x->n != y->n)
            return 0;
        for (size_t i = 0; i < x->n; i++)
            if (!equal_d(c, at, x->v[i], y->v[i], depth + 1)) return 0;
        return 1;
    }
    case V_DICT: {
        tdict *x = VDICT(a), *y = VDICT(b);
        if (x == y) return 1;
        if (x->n != y->n) return 0;
        for (size_t i = 0; i < x->n; i++) {
            dent *e = tpl_dict_find(c, at, y, x->e[i].k);
            if (!e || !equal_d(c, at, x->e[i].v, e->v, depth + 1)) return 0;
        }
        return 1;
    }
    default:
        return a.u.o == b.u.o;
    }
}

int tpl_equal(tctx *c, const node *at, val a, val b) {
    return equal_d(c, at, a, b, 0);
}

static int compare_d(tctx *c, const node *at, val a, val b, const char *op, int depth) {
    if (depth > MAX_NEST) tpl_fail(c, at, TPL_ERR_LIMIT, "values nested too deeply");
    tpl_step(c, at, 1);
    if (a.t == V_UNDEF) tpl_fail_undef(c, at, a);
    if (b.t == V_UNDEF) tpl_fail_undef(c, at, b);
    if (is_num(a) && is_num(b)) {
        int r = num_cmp(a, b);
        return r == 2 ? 2 : r;
    }
    if (a.t == V_STR && b.t == V_STR) {
        /* UTF-8 byte order is code point order */
        tstr *x = VSTR(a), *y = VSTR(b);
        size_t n = x->len < y->len ? x->len : y->len;
        int r = memcmp(x->s, y->s, n);
        if (r) return r < 0 ? -1 : 1;
        return x->len < y->len ? -1 : x->len > y->len;
    }
    if (a.t == V_LIST && b.t == V_LIST && IS_PLAIN(VLIST(a)) && IS_PLAIN(VLIST(b)) &&
        VLIST(a)->tuple != L_RANGE && VLIST(b)->tuple != L_RANGE &&
        IS_TUPLE(VLIST(a)) == IS_TUPLE(VLIST(b))) {
        tlist *x = VLIST(a), *y = VLIST(b);
        for (size_t i = 0; i < x->n && i < y->n; i++) {
            if (equal_d(c, at, x->v[i], y->v[i], depth + 1)) continue;
            return compare_d(c, at, x->v[i], y->v[i], op, depth + 1);
        }
        return x->n < y->n ? -1 : x->n > y->n;
    }
    tpl_fail(c, at, TPL_ERR_RUNTIME, "'%s' not supported between instances of '%s' and '%s'", op,
             tpl_type_name(a), tpl_type_name(b));
}

int tpl_compare(tctx *c, const node *at, val a, val b, const char *opname) {
    return compare_d(c, at, a, b, opname, 0);
}

/* Python's repr(float): the shortest string that reads back as the same double, in fixed
 * notation for exponents in [-4, 16), else scientific with at least two exponent digits. */
void tpl_float_repr(double f, char *buf, size_t n) {
    if (isnan(f)) {
        snprintf(buf, n, "nan");
        return;
    }
    if (isinf(f)) {
        snprintf(buf, n, f < 0 ? "-inf" : "inf");
        return;
    }
    if (f == 0) {
        snprintf(buf, n, signbit(f) ? "-0.0" : "0.0");
        return;
    }
    char tmp[64];
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(tmp, sizeof tmp, "%.*e", prec - 1, f);
        if (strtod(tmp, NULL) == f) break;
    }
    /* tmp: [-]d[.ddd]e[+-]xx */
    const char *p = tmp;
    int neg = 0;
    if (*p == '-') {
        neg = 1;
        p++;
    }
    char digits[32];
    int nd = 0;
    for (; *p && *p != 'e'; p++)
        if (*p >= '0' && *p <= '9') digits[nd++] = *p;
    while (nd > 1 && digits[nd - 1] == '0') nd--;
    int exp = atoi(p + 1);
    int decpt = exp + 1; /* value = 0.digits * 10^decpt */
    char out[64];
    int o = 0;
    if (neg) out[o++] = '-';
    if (decpt > -4 && decpt <= 16) {
        if (decpt <= 0) {
            out[o++] = '0';
            out[o++] = '.';
            for (int i = 0; i < -decpt; i++) out[o++] = '0';
            for (int i = 0; i < nd; i++) out[o++] = digits[i];
        } else {
            for (int i = 0; i < decpt; i++) out[o++] = i < nd ? digits[i] : '0';
            out[o++] = '.';
            if (nd > decpt)
                for (int i = decpt; i < nd; i++) out[o++] = digits[i];
            else
                out[o++] = '0';
        }
        out[o] = 0;
    } else {
        out[o++] = digits[0];
        if (nd > 1) {
            out[o++] = '.';
            for (int i = 1; i < nd; i++) out[o++] = digits[i];
        }
        out[o] = 0;
        char e[16];
        snprintf(e, sizeof e, "e%c%02d", exp < 0 ? '-' : '+', exp < 0 ? -exp : exp);
        memcpy(out + o, e, strlen(e) + 1);
    }
    snprintf(buf, n, "%s", out);
}

static void repr_str(tctx *c, const node *at, tstr *s, const char *p, size_t n) {
    int has_sq = memchr(p, '\'', n) != NULL, has_dq = memchr(p, '"', n) != NULL;
    char q = has_sq && !has_dq ? '"' : '\'';
    tpl_str_addc(c, at, s, q);
    for (size_t i = 0; i < n;) {
        size_t st = i;
        int32_t cp = tpl_utf8_next(p, n, &i);
        if (cp == q || cp == '\\') {
            tpl_str_addc(c, at, s, '\\');
            tpl_str_addc(c, at, s, (char)cp);
        } else if (cp == '\n')
            tpl_str_add(c, at, s, "\\n", 2);
        else if (cp == '\r')
            tpl_str_add(c, at, s, "\\r", 2);
        else if (cp == '\t')
            tpl_str_add(c, at, s, "\\t", 2);
        else if (cp >= 0xDC80 && cp <= 0xDCFF && i - st == 1)
            tpl_str_addf(c, at, s, "\\udc%02x", (unsigned)(cp & 0xFF));
        else if (!tpl_is_printable(cp)) {
            if (cp < 0x100)
                tpl_str_addf(c, at, s, "\\x%02x", (unsigned)cp);
            else if (cp < 0x10000)
                tpl_str_addf(c, at, s, "\\u%04x", (unsigned)cp);
            else
                tpl_str_addf(c, at, s, "\\U%08x", (unsigned)cp);
        } else
            tpl_str_add(c, at, s, p + st, i - st);
    }
    tpl_str_addc(c, at, s, q);
}

static void repr_any(tctx *c, const node *at, tstr *s, val v, int depth, int sorted);

void tpl_repr(tctx *c, const node *at, tstr *s, val v, int depth) {
    repr_any(c, at, s, v, depth, 0);
}

void tpl_repr_sorted(tctx *c, const node *at, tstr *s, val v, int depth) {
    repr_any(c, at, s, v, depth, 1);
}

/* indices of a dict's entries ordered by key (insertion order among equal keys) */
static void sort_entries(tctx *c, const node *at, const tdict *d, size_t *idx, size_t *tmp,
                         size_t n) {
    if (n < 2) return;
    size_t h = n / 2;
    sort_entries(c, at, d, idx, tmp, h);
    sort_entries(c, at, d, idx + h, tmp, n - h);
    size_t i = 0, j = h, k = 0;
    while (i < h && j < n)
        tmp[k++] =
            tpl_compare(c, at, d->e[idx[j]].k, d->e[idx[i]].k, "<") < 0 ? idx[j++] : idx[i++];
    while (i < h) tmp[k++] = idx[i++];
    while (j < n) tmp[k++] = idx[j++];
    memcpy(idx, tmp, n * sizeof *idx);
}

static void repr_any(tctx *c, const node *at, tstr *s, val v, int depth, int sorted) {
    if (depth > MAX_NEST) tpl_fail(c, at, TPL_ERR_LIMIT, "values nested too deeply");
    tpl_step(c, at, 1);
    switch (v.t) {
    case V_STR:
        if (v.safe) tpl_str_add(c, at, s, "Markup(", 7); /* |e and |safe give Markup */
        repr_str(c, at, s, VSTR(v)->s, VSTR(v)->len);
        if (v.safe) tpl_str_addc(c, at, s, ')');
        return;
    case V_UNDEF:
        tpl_str_add(c, at, s, "Undefined", 9);
        return;
    case V_LIST: {
        tlist *l = VLIST(v);
        if (IS_ITER(l)) {
            tpl_str_addf(c, at, s, "<%s object>", tpl_type_name(v));
            return;
        }
        if (l->tuple == L_RANGE) {
            if (l->rstep == 1)
                tpl_str_addf(c, at, s, "range(%" PRId64 ", %" PRId64 ")", l->rstart, l->rstop);
            else
                tpl_str_addf(c, at, s, "range(%" PRId64 ", %" PRId64 ", %" PRId64 ")", l->rstart,
                             l->rstop, l->rstep);
            return;
        }
        if (IS_VIEW(l)) {
            const char *name = tpl_type_name(v);
            tpl_str_add(c, at, s, name, strlen(name));
            tpl_str_add(c, at, s, "([", 2);
        } else {
            tpl_str_addc(c, at, s, IS_TUPLE(l) ? '(' : '[');
        }
        for (size_t i = 0; i < l->n; i++) {
            if (i) tpl_str_add(c, at, s, ", ", 2);
            repr_any(c, at, s, l->v[i], depth + 1, sorted);
        }
        if (IS_TUPLE(l) && l->n == 1) tpl_str_addc(c, at, s, ',');
        if (IS_VIEW(l))
            tpl_str_add(c, at, s, "])", 2);
        else
            tpl_str_addc(c, at, s, IS_TUPLE(l) ? ')' : ']');
        return;
    }
    case V_DICT:
    case V_NS: {
        tdict *d = VDICT(v);
        if (v.t == V_NS) tpl_str_add(c, at, s, "<Namespace ", 11);
        tpl_str_addc(c, at, s, '{');
        tlist *order = NULL, *tmp = NULL;
        size_t *idx = NULL;
        if (sorted && d->n > 1) { /* raw index arrays in lists' storage */
            order = tpl_list_new(c, at, d->n);
            tmp = tpl_list_new(c, at, d->n);
            idx = (size_t *)(void *)order->v;
            for (size_t i = 0; i < d->n; i++) idx[i] = i;
            sort_entries(c, at, d, idx, (size_t *)(void *)tmp->v, d->n);
        }
        for (size_t k = 0; k < d->n; k++) {
            size_t i = idx ? idx[k] : k;
            if (k) tpl_str_add(c, at, s, ", ", 2);
            repr_any(c, at, s, d->e[i].k, depth + 1, sorted);
            tpl_str_add(c, at, s, ": ", 2);
            repr_any(c, at, s, d->e[i].v, depth + 1, sorted);
        }
        if (order) {
            tpl_release(c, v_obj(V_LIST, order));
            tpl_release(c, v_obj(V_LIST, tmp));
        }
        tpl_str_addc(c, at, s, '}');
        if (v.t == V_NS) tpl_str_addc(c, at, s, '>');
        return;
    }
    case V_FUNC: {
        tfunc *f = VFUNC(v);
        if (f->kind == F_MACRO)
            tpl_str_addf(c, at, s, "<Macro '%s'>", f->name);
        else if (f->kind == F_METHOD)
            tpl_str_addf(c, at, s, "<built-in method %s of %s object>", f->name,
                         tpl_type_name(f->self));
        else if (f->kind == F_JOINER)
            tpl_str_add(c, at, s, "<jinja2.utils.Joiner object>", 28);
        else if (f->kind == F_CYCLER)
            tpl_str_add(c, at, s, "<jinja2.utils.Cycler object>", 28);
        else
            tpl_str_addf(c, at, s, "<function %s>", f->name);
        return;
    }
    case V_LOOP: {
        tloop *l = (tloop *)v.u.o;
        tpl_str_addf(c, at, s, "<LoopContext %zu/%zu>", l->i + 1, l->items ? l->items->n : 0);
        return;
    }
    default:
        tpl_to_str(c, at, s, v);
        return;
    }
}

void tpl_to_str(tctx *c, const node *at, tstr *s, val v) {
    char buf[64];
    switch (v.t) {
    case V_UNDEF:
        return;
    case V_NONE:
        tpl_str_add(c, at, s, "None", 4);
        return;
    case V_BOOL:
        if (v.u.i)
            tpl_str_add(c, at, s, "True", 4);
        else
            tpl_str_add(c, at, s, "False", 5);
        return;
    case V_INT:
        tpl_str_addf(c, at, s, "%" PRId64, v.u.i);
        return;
    case V_FLOAT:
        tpl_float_repr(v.u.f, buf, sizeof buf);
        tpl_str_add(c, at, s, buf, strlen(buf));
        return;
    case V_STR:
        tpl_str_add(c, at, s, VSTR(v)->s, VSTR(v)->len);
        return;
    default:
        tpl_repr(c, at, s, v, 0);
        return;
    }
}

val tpl_str_of(tctx *c, const node *at, val v) {
    if (v.t == V_STR) return vref(v);
    tstr *s = tpl_str_new(c, at, 16);
    tpl_to_str(c, at, s, v);
    return v_obj(V_STR, s);
}

tlist *tpl_iterate(tctx *c, const node *at, val v) {
    switch (v.t) {
    case V_UNDEF:
        return tpl_list_new(c, at, 0);
    case V_LIST: {
        tlist *l = VLIST(v);
        if (!IS_ITER(l)) {
            vref(v);
            return l;
        }
        /* a generator gives its items once, then the error it met if it met one */
        if (l->lazy_err) tpl_fail_lazy(c, l);
        tlist *r = tpl_list_new(c, at, l->n);
        for (size_t i = 0; i < l->n; i++) tpl_list_push(c, at, r, vref(l->v[i]));
        tpl_iter_consume(c, l, l->n);
        return r;
    }
    case V_DICT: {
        tdict *d = VDICT(v);
        tlist *l = tpl_list_new(c, at, d->n);
        for (size_t i = 0; i < d->n; i++) tpl_list_push(c, at, l, vref(d->e[i].k));
        tpl_step(c, at, d->n / 8);
        return l;
    }
    case V_STR: {
        tstr *s = VSTR(v);
        tlist *l = tpl_list_new(c, at, (size_t)tpl_str_ncp(s));
        for (size_t i = 0; i < s->len;) {
            size_t st = i;
            tpl_utf8_next(s->s, s->len, &i);
            tpl_list_push(c, at, l, tpl_str_val(c, at, s->s + st, i - st));
        }
        tpl_step(c, at, s->len / 8);
        return l;
    }
    default:
        tpl_fail(c, at, TPL_ERR_RUNTIME, "'%s' object is not iterable", tpl_type_name(v));
    }
}

void tpl_iter_consume(tctx *c, tlist *l, size_t k) {
    if (k > l->n) k = l->n;
    if (!k) return;
    for (size_t i = 0; i < k; i++) tpl_release(c, l->v[i]);
    memmove(l->v, l->v + k, (l->n - k) * sizeof(val));
    l->n -= k;
}

int64_t tpl_length(tctx *c, const node *at, val v) {
    switch (v.t) {
    case V_UNDEF:
        return 0;
    case V_STR:
        return tpl_str_ncp(VSTR(v));
    case V_LIST:
        if (IS_ITER(VLIST(v))) break;
        return (int64_t)VLIST(v)->n;
    case V_DICT:
        return (int64_t)VDICT(v)->n;
    default:
        break;
    }
    tpl_fail(c, at, TPL_ERR_RUNTIME, "object of type '%s' has no len()", tpl_type_name(v));
}

/* ---- argument binding ------------------------------------------------------------------ */

void tpl_bind(tctx *c, const node *at, const char *fname, const targs *a, const char *spec,
              val *out, size_t nout) {
    const char *names[16];
    size_t lens[16];
    int optional[16];
    size_t np = 0;
    for (const char *p = spec; *p && np < 16;) {
        const char *e = p;
        while (*e && *e != ',' && *e != '=') e++;
        names[np] = p;
        lens[np] = (size_t)(e - p);
        optional[np] = *e == '=';
        while (*e && *e != ',') e++;
        np++;
        p = *e ? e + 1 : e;
    }
    for (size_t i = 0; i < nout; i++) out[i] = (val){.t = V_UNDEF, .safe = 1};
    if (a->n > np || a->n > nout)
        tpl_fail(c, at, TPL_ERR_RUNTIME, "%s() takes at most %zu argument%s (%zu given)", fname, np,
                 np == 1 ? "" : "s", a->n);
    for (size_t i = 0; i < a->n; i++) out[i] = a->pos[i];
    for (size_t k = 0; k < a->nkw; k++) {
        size_t i = 0;
        tstr *kn = VSTR(a->kwn[k]);
        while (i < np && !(lens[i] == kn->len && !memcmp(names[i], kn->s, lens[i]))) i++;
        if (i == np || i >= nout)
            tpl_fail(c, at, TPL_ERR_RUNTIME, "%s() got an unexpected keyword argument '%s'", fname,
                     kn->s);
        if (given(out[i]))
            tpl_fail(c, at, TPL_ERR_RUNTIME, "%s() got multiple values for argument '%s'", fname,
                     kn->s);
        out[i] = a->kw[k];
    }
    for (size_t i = 0; i < np && i < nout; i++)
        if (!optional[i] && !given(out[i]))
            tpl_fail(c, at, TPL_ERR_RUNTIME, "%s() missing required argument '%.*s'", fname,
                     (int)lens[i], names[i]);
}
