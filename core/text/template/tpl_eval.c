/* Evaluator of the Jinja AST: expressions with Python's semantics and Jinja's sandboxed
 * attribute lookup, statements with Jinja's scoping (a fresh scope per loop iteration, macro
 * and block; `if` has none), macros and call blocks, and the render entry point. The AST is
 * only read, never written: everything a render changes lives in its context. */
#include "tpl_internal.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { EX_OK = 0, EX_BREAK, EX_CONTINUE };

#define IMMORTAL(id, text)                                                                         \
    static tstr id = {.h = {.rc = -1, .kind = O_STR},                                              \
                      .len = sizeof text - 1,                                                      \
                      .cap = sizeof text - 1,                                                      \
                      .ncp = sizeof text - 1,                                                      \
                      .s = (char *)text}
IMMORTAL(s_loop, "loop");
IMMORTAL(s_varargs, "varargs");
IMMORTAL(s_kwargs, "kwargs");
IMMORTAL(s_caller, "caller");

static void enter(tctx *c, const node *at) {
    if (++c->depth > c->max_depth)
        tpl_fail(c, at, TPL_ERR_LIMIT, "recursion limit exceeded (nesting deeper than %d)",
                 c->max_depth);
}

/* ---- attribute and item lookup --------------------------------------------------------- */

static val loop_attr(tctx *c, const node *at, val lv, tstr *name) {
    tloop *l = (tloop *)lv.u.o;
    size_t n = l->items->n, i = l->i;
    const char *k = name->s;
    if (!strcmp(k, "index")) return v_int((int64_t)i + 1);
    if (!strcmp(k, "index0")) return v_int((int64_t)i);
    if (!strcmp(k, "revindex")) return v_int((int64_t)(n - i));
    if (!strcmp(k, "revindex0")) return v_int((int64_t)(n - i - 1));
    if (!strcmp(k, "first")) return v_bool(i == 0);
    if (!strcmp(k, "last")) return v_bool(i + 1 == n);
    if (!strcmp(k, "length")) return v_int((int64_t)n);
    if (!strcmp(k, "depth")) return v_int(1);
    if (!strcmp(k, "depth0")) return v_int(0);
    if (!strcmp(k, "previtem"))
        return i > 0 ? vref(l->items->v[i - 1]) : tpl_undef_msg(c, "there is no previous item");
    if (!strcmp(k, "nextitem"))
        return i + 1 < n ? vref(l->items->v[i + 1]) : tpl_undef_msg(c, "there is no next item");
    int unsafe = 0;
    builtin_fn fn = tpl_find_method(lv, k, &unsafe);
    if (fn) {
        tfunc *f = tpl_alloc(c, sizeof(tfunc), O_FUNC);
        f->kind = F_METHOD;
        f->name = name->s;
        f->fn = fn;
        f->self = vref(lv);
        return v_obj(V_FUNC, f);
    }
    (void)at;
    return tpl_undef_attr(c, lv, v_obj(V_STR, name));
}

val tpl_getattr(tctx *c, const node *at, val obj, tstr *name) {
    if (obj.t == V_UNDEF) tpl_fail_undef(c, at, obj);
    if (obj.t == V_LOOP) return loop_attr(c, at, obj, name);
    if (obj.t == V_NS) {
        dent *e = tpl_dict_find_str(VDICT(obj), name->s, name->len);
        return e ? vref(e->v) : tpl_undef_attr(c, obj, v_obj(V_STR, name));
    }
    if (obj.t == V_INT || obj.t == V_BOOL || obj.t == V_FLOAT) { /* number attributes */
        int fl = obj.t == V_FLOAT;
        if (!strcmp(name->s, "real")) return fl ? obj : v_int(obj.u.i);
        if (!strcmp(name->s, "imag")) return fl ? v_float(0.0) : v_int(0);
        if (!fl && !strcmp(name->s, "numerator")) return v_int(obj.u.i);
        if (!fl && !strcmp(name->s, "denominator")) return v_int(1);
    }
    if (obj.t == V_FUNC && VFUNC(obj)->kind == F_MACRO && !strcmp(name->s, "name"))
        return tpl_cstr_val(c, at, VFUNC(obj)->name);
    if (obj.t == V_LIST && VLIST(obj)->tuple == L_GROUP &&
        (!strcmp(name->s, "grouper") || !strcmp(name->s, "list")))
        return vref(VLIST(obj)->v[name->s[0] == 'l']);
    if (obj.t == V_FUNC && VFUNC(obj)->kind == F_CYCLER && !strcmp(name->s, "current"))
        return tpl_cycler_current(c, obj);
    /* a Python attribute (method) first, then the item, as the sandbox's getattr does */
    int unsafe = 0;
    builtin_fn fn = tpl_find_method(obj, name->s, &unsafe);
    if (unsafe) return tpl_undef_security(c, obj, name->s);
    if (fn) {
        tfunc *f = tpl_alloc(c, sizeof(tfunc), O_FUNC);
        f->kind = F_METHOD;
        f->name = name->s;
        f->fn = fn;
        f->self = vref(obj);
        return v_obj(V_FUNC, f);
    }
    if (obj.t == V_DICT) {
        dent *e = tpl_dict_find_str(VDICT(obj), name->s, name->len);
        if (e) return vref(e->v);
    }
    return tpl_undef_attr(c, obj, v_obj(V_STR, name));
}

static int as_index(val k, int64_t *i) {
    if (k.t == V_INT || k.t == V_BOOL) {
        *i = k.u.i;
        return 1;
    }
    return 0;
}

/* byte offset of code point `idx` in s */
static size_t cp_offset(tctx *c, const node *at, tstr *s, int64_t idx) {
    if (tpl_str_ncp(s) == (int64_t)s->len) return (size_t)idx;
    tpl_step(c, at, (uint64_t)idx / 4);
    size_t i = 0;
    for (int64_t k = 0; k < idx && i < s->len; k++) tpl_utf8_next(s->s, s->len, &i);
    return i;
}

val tpl_getitem(tctx *c, const node *at, val obj, val key) {
    int64_t i;
    switch (obj.t) {
    case V_UNDEF:
        tpl_fail_undef(c, at, obj);
    case V_DICT: {
        if (key.t == V_LIST && !IS_TUPLE(VLIST(key))) break; /* unhashable: no such item */
        if (key.t == V_DICT || key.t == V_NS) break;
        dent *e = tpl_dict_find(c, at, VDICT(obj), key);
        if (e) return vref(e->v);
        break;
    }
    case V_LIST:
        if (!IS_PLAIN(VLIST(obj))) break; /* views and generators are not subscriptable */
        if (as_index(key, &i)) {
            tlist *l = VLIST(obj);
            if (i < 0) i += (int64_t)l->n;
            if (i >= 0 && i < (int64_t)l->n) return vref(l->v[i]);
            return tpl_undef_attr(c, obj, key);
        }
        break;
    case V_STR:
        if (as_index(key, &i)) {
            tstr *s = VSTR(obj);
            int64_t n = tpl_str_ncp(s);
            if (i < 0) i += n;
            if (i >= 0 && i < n) {
                size_t a = cp_offset(c, at, s, i), b = a;
                tpl_utf8_next(s->s, s->len, &b);
                return tpl_str_val(c, at, s->s + a, b - a);
            }
            return tpl_undef_attr(c, obj, key);
        }
        break;
    default:
        break;
    }
    if (key.t == V_STR) {
        if (obj.t == V_DICT) {
            int unsafe = 0;
            builtin_fn fn = tpl_find_method(obj, VSTR(key)->s, &unsafe);
            if (!fn && !unsafe) return tpl_undef_attr(c, obj, key);
        }
        return tpl_getattr(c, at, obj, VSTR(key));
    }
    return tpl_undef_attr(c, obj, key);
}

static int64_t slice_bound(tctx *c, const node *at, val v, int64_t dflt) {
    if (v.t == V_NONE) return dflt;
    if (v.t == V_INT || v.t == V_BOOL) return v.u.i;
    if (v.t == V_UNDEF) tpl_fail_undef(c, at, v);
    tpl_fail(c, at, TPL_ERR_RUNTIME,
             "slice indices must be integers or None or have an __index__ method");
}

/* Python's PySlice_AdjustIndices */
static int64_t adjust(int64_t x, int64_t len, int64_t step, int is_start, int given) {
    if (!given) return step < 0 ? (is_start ? len - 1 : -1) : (is_start ? 0 : len);
    if (x < 0) {
        x += len;
        if (x < 0) x = step < 0 ? -1 : 0;
    } else if (x >= len) {
        x = step < 0 ? len - 1 : len;
    }
    return x;
}

static int bound_ok(val v) {
    return v.t == V_NONE || v.t == V_INT || v.t == V_BOOL;
}

static val do_slice(tctx *c, const node *at, val obj, val vstart, val vstop, val vstep) {
    if (obj.t == V_UNDEF) tpl_fail_undef(c, at, obj);
    /* bounds that are not integers make Python raise a TypeError, which the sandbox's getitem
     * turns into an undefined value */
    if (!bound_ok(vstart) || !bound_ok(vstop) || !bound_ok(vstep))
        return tpl_undef_msg(c, "slice indices must be integers or None");
    int64_t step = slice_bound(c, at, vstep, 1);
    if (step == 0) tpl_fail(c, at, TPL_ERR_RUNTIME, "slice step cannot be zero");
    if (step == INT64_MIN) step = -INT64_MAX;
    int has_start = vstart.t != V_NONE, has_stop = vstop.t != V_NONE;
    int64_t s0 = slice_bound(c, at, vstart, 0), s1 = slice_bound(c, at, vstop, 0);
    if (obj.t == V_LIST && IS_PLAIN(VLIST(obj))) {
        tlist *l = VLIST(obj);
        int64_t len = (int64_t)l->n;
        int64_t a = adjust(s0, len, step, 1, has_start), b = adjust(s1, len, step, 0, has_stop);
        tlist *r = tpl_list_new(c, at, 0);
        r->tuple = IS_TUPLE(l) ? L_TUPLE : L_LIST;
        for (int64_t i = a; step > 0 ? i < b : i > b; i += step) {
            tpl_list_push(c, at, r, vref(l->v[i]));
            if ((step > 0 && i > INT64_MAX - step) || (step < 0 && i < INT64_MIN - step)) break;
        }
        tpl_step(c, at, r->n / 8);
        return v_obj(V_LIST, r);
    }
    if (obj.t == V_STR) {
        tstr *s = VSTR(obj);
        int64_t len = tpl_str_ncp(s);
        int64_t a = adjust(s0, len, step, 1, has_start), b = adjust(s1, len, step, 0, has_stop);
        tstr *r = tpl_str_new(c, at, 0);
        if (len == (int64_t)s->len) {
            for (int64_t i = a; step > 0 ? i < b : i > b; i += step) {
                tpl_str_addc(c, at, r, s->s[i]);
                if ((step > 0 && i > INT64_MAX - step) || (step < 0 && i < INT64_MIN - step)) break;
            }
        } else {
            /* offsets of every code point, then pick */
            tpl_mem_charge(c, at, (size_t)(len + 1) * sizeof(size_t));
            size_t *off = malloc((size_t)(len + 1) * sizeof(size_t));
            if (!off) tpl_fail(c, at, TPL_ERR_NOMEM, "out of memory");
            size_t k = 0, i = 0;
            while (i < s->len) {
                off[k++] = i;
                tpl_utf8_next(s->s, s->len, &i);
            }
            off[k] = s->len;
            tstr *tmp = r;
            for (int64_t x = a; step > 0 ? x < b : x > b; x += step) {
                /* an output past the limit fails in tpl_str_add, so free first */
                size_t need = off[x + 1] - off[x];
                if (tmp->len + need > c->max_output) {
                    free(off);
                    tpl_fail(c, at, TPL_ERR_LIMIT, "output size limit exceeded (%zu bytes)",
                             c->max_output);
                }
                tpl_str_add(c, at, tmp, s->s + off[x], need);
                if ((step > 0 && x > INT64_MAX - step) || (step < 0 && x < INT64_MIN - step)) break;
            }
            free(off);
        }
        tpl_step(c, at, r->len / 8);
        return v_obj(V_STR, r);
    }
    return tpl_undef_msg(c, "object is not sliceable");
}

/* ---- operators ------------------------------------------------------------------------- */

static int is_num(val v) {
    return v.t == V_BOOL || v.t == V_INT || v.t == V_FLOAT;
}
static double as_f(val v) {
    return v.t == V_FLOAT ? v.u.f : (double)v.u.i;
}

static const char *op_sym(int op) {
    static const char *const s[] = {"", "+", "-", "*", "/", "//", "%", "**"};
    return s[op];
}

_Noreturn static void unsupported(tctx *c, const node *at, int op, val a, val b) {
    if ((a.t == V_STR || a.t == V_LIST) && op == OP_ADD)
        tpl_fail(c, at, TPL_ERR_RUNTIME, "can only concatenate %s (not \"%s\") to %s",
                 tpl_type_name(a), tpl_type_name(b), tpl_type_name(a));
    tpl_fail(c, at, TPL_ERR_RUNTIME, "unsupported operand type(s) for %s: '%s' and '%s'",
             op_sym(op), tpl_type_name(a), tpl_type_name(b));
}

static val repeat(tctx *c, const node *at, val seq, int64_t times) {
    if (times < 0) times = 0;
    if (seq.t == V_STR) {
        tstr *s = VSTR(seq);
        if (s->len && (uint64_t)times > c->max_output / s->len)
            tpl_fail(c, at, TPL_ERR_LIMIT, "output size limit exceeded (%zu bytes)", c->max_output);
        tstr *r = tpl_str_new(c, at, s->len * (size_t)times);
        for (int64_t i = 0; i < times; i++) tpl_str_add(c, at, r, s->s, s->len);
        tpl_step(c, at, r->len / 16);
        return v_obj(V_STR, r);
    }
    tlist *l = VLIST(seq);
    if (l->n && (uint64_t)times > c->max_mem / sizeof(val) / l->n)
        tpl_fail(c, at, TPL_ERR_LIMIT, "memory limit exceeded (%zu bytes)", c->max_mem);
    tlist *r = tpl_list_new(c, at, l->n * (size_t)times);
    r->tuple = IS_TUPLE(l) ? L_TUPLE : L_LIST;
    for (int64_t i = 0; i < times; i++)
        for (size_t k = 0; k < l->n; k++) tpl_list_push(c, at, r, vref(l->v[k]));
    tpl_step(c, at, r->n / 8);
    return v_obj(V_LIST, r);
}

/* Python's float divmod */
static void fdivmod(double vx, double wx, double *floordiv, double *mod) {
    double m = fmod(vx, wx);
    double div = (vx - m) / wx;
    if (m != 0) {
        if ((wx < 0) != (m < 0)) {
            m += wx;
            div -= 1.0;
        }
    } else {
        m = copysign(0.0, wx);
    }
    double fd;
    if (div != 0) {
        fd = floor(div);
        if (div - fd > 0.5) fd += 1.0;
    } else {
        fd = copysign(0.0, vx / wx);
    }
    *floordiv = fd;
    *mod = m;
}

static val int_pow(tctx *c, const node *at, int64_t base, int64_t e) {
    int64_t r = 1;
    while (e > 0) {
        if (e & 1) {
            if (__builtin_mul_overflow(r, base, &r)) goto over;
        }
        e >>= 1;
        if (e && __builtin_mul_overflow(base, base, &base)) goto over;
    }
    return v_int(r);
over:
    tpl_fail(c, at, TPL_ERR_RUNTIME, "integer overflow (results beyond 64 bits are not supported)");
}

val tpl_arith(tctx *c, const node *at, int op, val a, val b) {
    /* str % anything: Python's formatting, which only touches what it converts */
    if (op == OP_MOD && a.t == V_STR) return tpl_percent_format(c, at, VSTR(a), b);
    if (a.t == V_UNDEF) tpl_fail_undef(c, at, a);
    if (b.t == V_UNDEF) tpl_fail_undef(c, at, b);
    if (is_num(a) && is_num(b)) {
        int ints = a.t != V_FLOAT && b.t != V_FLOAT;
        int64_t x = a.u.i, y = b.u.i, r;
        double fx = as_f(a), fy = as_f(b);
        switch (op) {
        case OP_ADD:
            if (ints) {
                if (__builtin_add_overflow(x, y, &r)) break;
                return v_int(r);
            }
            return v_float(fx + fy);
        case OP_SUB:
            if (ints) {
                if (__builtin_sub_overflow(x, y, &r)) break;
                return v_int(r);
            }
            return v_float(fx - fy);
        case OP_MUL:
            if (ints) {
                if (__builtin_mul_overflow(x, y, &r)) break;
                return v_int(r);
            }
            return v_float(fx * fy);
        case OP_DIV:
            if (fy == 0) tpl_fail(c, at, TPL_ERR_RUNTIME, "division by zero");
            return v_float(fx / fy);
        case OP_FLOORDIV:
        case OP_MOD:
            if (ints) {
                if (y == 0) tpl_fail(c, at, TPL_ERR_RUNTIME, "integer division or modulo by zero");
                if (x == INT64_MIN && y == -1) {
                    if (op == OP_MOD) return v_int(0);
                    break;
                }
                int64_t q = x / y, m = x % y;
                if (m != 0 && ((m < 0) != (y < 0))) {
                    m += y;
                    q -= 1;
                }
                return v_int(op == OP_MOD ? m : q);
            } else {
                if (fy == 0)
                    tpl_fail(c, at, TPL_ERR_RUNTIME,
                             op == OP_MOD ? "float modulo" : "float floor division by zero");
                double q, m;
                fdivmod(fx, fy, &q, &m);
                return v_float(op == OP_MOD ? m : q);
            }
        case OP_POW:
            if (ints && y >= 0) return int_pow(c, at, x, y);
            if (fx == 0 && fy < 0)
                tpl_fail(c, at, TPL_ERR_RUNTIME, "0.0 cannot be raised to a negative power");
            if (fx < 0 && fy != floor(fy))
                tpl_fail(c, at, TPL_ERR_RUNTIME, "complex results are not supported");
            return v_float(pow(fx, fy));
        }
        tpl_fail(c, at, TPL_ERR_RUNTIME,
                 "integer overflow (results beyond 64 bits are not supported)");
    }
    if (op == OP_ADD && a.t == V_STR && b.t == V_STR) {
        tstr *r = tpl_str_new(c, at, VSTR(a)->len + VSTR(b)->len);
        tpl_str_add(c, at, r, VSTR(a)->s, VSTR(a)->len);
        tpl_str_add(c, at, r, VSTR(b)->s, VSTR(b)->len);
        tpl_step(c, at, r->len / 64);
        return v_obj(V_STR, r);
    }
    if (op == OP_ADD && a.t == V_LIST && b.t == V_LIST && IS_PLAIN(VLIST(a)) &&
        IS_PLAIN(VLIST(b)) && VLIST(a)->tuple != L_RANGE && VLIST(b)->tuple != L_RANGE &&
        IS_TUPLE(VLIST(a)) == IS_TUPLE(VLIST(b))) {
        tlist *x = VLIST(a), *y = VLIST(b);
        tlist *r = tpl_list_new(c, at, x->n + y->n);
        r->tuple = IS_TUPLE(x) ? L_TUPLE : L_LIST;
        for (size_t i = 0; i < x->n; i++) tpl_list_push(c, at, r, vref(x->v[i]));
        for (size_t i = 0; i < y->n; i++) tpl_list_push(c, at, r, vref(y->v[i]));
        tpl_step(c, at, r->n / 8);
        return v_obj(V_LIST, r);
    }
    if (op == OP_MUL) {
        int sa =
            a.t == V_STR || (a.t == V_LIST && IS_PLAIN(VLIST(a)) && VLIST(a)->tuple != L_RANGE);
        int sb =
            b.t == V_STR || (b.t == V_LIST && IS_PLAIN(VLIST(b)) && VLIST(b)->tuple != L_RANGE);
        if (sa && (b.t == V_INT || b.t == V_BOOL)) return repeat(c, at, a, b.u.i);
        if (sb && (a.t == V_INT || a.t == V_BOOL)) return repeat(c, at, b, a.u.i);
    }
    if (op == OP_MOD && a.t == V_STR) return tpl_percent_format(c, at, VSTR(a), b);
    unsupported(c, at, op, a, b);
}

static int contains(tctx *c, const node *at, val item, val seq) {
    switch (seq.t) {
    case V_UNDEF:
        return 0;
    case V_STR:
        if (item.t == V_UNDEF) tpl_fail_undef(c, at, item);
        if (item.t != V_STR)
            tpl_fail(c, at, TPL_ERR_RUNTIME,
                     "'in <string>' requires string as left operand, not %s", tpl_type_name(item));
        tpl_step(c, at, VSTR(seq)->len / 64);
        return VSTR(item)->len == 0 ||
               memmem(VSTR(seq)->s, VSTR(seq)->len, VSTR(item)->s, VSTR(item)->len) != NULL;
    case V_LIST: {
        tlist *l = VLIST(seq);
        for (size_t i = 0; i < l->n; i++)
            if (tpl_equal(c, at, l->v[i], item)) {
                if (IS_ITER(l)) tpl_iter_consume(c, l, i + 1); /* `in` advances a generator */
                return 1;
            }
        if (IS_ITER(l)) {
            if (l->lazy_err) tpl_fail_lazy(c, l);
            tpl_iter_consume(c, l, l->n);
        }
        return 0;
    }
    case V_DICT:
        return tpl_dict_find(c, at, VDICT(seq), item) != NULL;
    default:
        tpl_fail(c, at, TPL_ERR_RUNTIME, "argument of type '%s' is not iterable",
                 tpl_type_name(seq));
    }
}

static int compare_op(tctx *c, const node *at, int op, val a, val b) {
    switch (op) {
    case CMP_EQ:
        return tpl_equal(c, at, a, b);
    case CMP_NE:
        return !tpl_equal(c, at, a, b);
    case CMP_IN:
        return contains(c, at, a, b);
    case CMP_NOTIN:
        return !contains(c, at, a, b);
    default:
        break;
    }
    static const char *const names[] = {"", "", "", "<", "<=", ">", ">="};
    int r = tpl_compare(c, at, a, b, names[op]);
    if (r == 2) return 0; /* NaN */
    switch (op) {
    case CMP_LT:
        return r < 0;
    case CMP_LE:
        return r <= 0;
    case CMP_GT:
        return r > 0;
    default:
        return r >= 0;
    }
}

/* ---- calls ----------------------------------------------------------------------------- */

/* Evaluated arguments of a call, filter or test node (n->list, n->names/list2, *n->c, **n->d) */
typedef struct {
    targs a;
    val hold[5];
} argbuf;

static void eval_args(tctx *c, const node *n, argbuf *ab) {
    val star = v_undef(), dstar = v_undef();
    if (n->c) star = tpl_eval(c, n->c);
    if (n->d) dstar = tpl_eval(c, n->d);
    size_t npos = n->n, nkw = n->nnames;
    tlist *sl = NULL;
    if (n->c) {
        sl = tpl_iterate(c, n->c, star);
        npos += sl->n;
    }
    if (n->d && dstar.t != V_DICT)
        tpl_fail(c, n->d, TPL_ERR_RUNTIME, "argument after ** must be a mapping, not %s",
                 tpl_type_name(dstar));
    if (n->d) nkw += VDICT(dstar)->n;
    /* positional then keyword values in one list, keyword names in another */
    tlist *vals = tpl_list_new(c, n, npos + nkw + 1);
    tlist *names = tpl_list_new(c, n, nkw + 1);
    for (size_t i = 0; i < n->n; i++) tpl_list_push(c, n, vals, tpl_eval(c, n->list[i]));
    if (sl)
        for (size_t i = 0; i < sl->n; i++) tpl_list_push(c, n, vals, vref(sl->v[i]));
    for (size_t i = 0; i < n->nnames; i++) {
        tpl_list_push(c, n, vals, tpl_eval(c, n->list2[i]));
        tpl_list_push(c, n, names, v_obj(V_STR, n->names[i]));
    }
    if (n->d) {
        tdict *d = VDICT(dstar);
        for (size_t i = 0; i < d->n; i++) {
            if (d->e[i].k.t != V_STR)
                tpl_fail(c, n->d, TPL_ERR_RUNTIME, "keywords must be strings");
            tpl_list_push(c, n, vals, vref(d->e[i].v));
            tpl_list_push(c, n, names, vref(d->e[i].k));
        }
    }
    ab->a =
        (targs){.n = npos, .pos = vals->v, .nkw = names->n, .kwn = names->v, .kw = vals->v + npos};
    ab->hold[0] = v_obj(V_LIST, vals);
    ab->hold[1] = v_obj(V_LIST, names);
    ab->hold[2] = star;
    ab->hold[3] = dstar;
    ab->hold[4] = sl ? v_obj(V_LIST, sl) : v_undef();
}

static void free_args(tctx *c, argbuf *ab) {
    for (int i = 0; i < 5; i++) tpl_release(c, ab->hold[i]);
}

static val call_macro(tctx *c, const node *at, tfunc *f, const targs *a);

val tpl_call(tctx *c, const node *at, val fn, const targs *a) {
    if (fn.t == V_UNDEF) tpl_fail_undef(c, at, fn);
    if (fn.t != V_FUNC)
        tpl_fail(c, at, TPL_ERR_RUNTIME, "'%s' object is not callable", tpl_type_name(fn));
    tfunc *f = VFUNC(fn);
    switch (f->kind) {
    case F_BUILTIN:
        return f->fn(c, at, v_undef(), a);
    case F_METHOD:
        return f->fn(c, at, f->self, a);
    case F_MACRO:
        return call_macro(c, at, f, a);
    case F_JOINER:
        if (a->n || a->nkw) tpl_fail(c, at, TPL_ERR_RUNTIME, "joiner() takes no arguments");
        if (!f->state) {
            f->state = 1;
            return tpl_cstr_val(c, at, "");
        }
        return vref(f->self);
    default:
        tpl_fail(c, at, TPL_ERR_RUNTIME, "'%s' object is not callable", tpl_type_name(fn));
    }
}

/* ---- assignment ------------------------------------------------------------------------ */

static void assign(tctx *c, tframe *fr, const node *target, val v) {
    if (target->kind == E_NAME) {
        tpl_frame_set(c, fr, target->name, vref(v));
        return;
    }
    if (target->kind == E_NSREF) {
        val *ns = tpl_frame_lookup(c->frame, target->name->s, target->name->len);
        if (!ns || ns->t != V_NS)
            tpl_fail(c, target, TPL_ERR_RUNTIME, "cannot assign attribute on non-namespace object");
        tpl_dict_set(c, target, VDICT(*ns), target->a->cval, vref(v));
        return;
    }
    /* a tuple of targets: unpack */
    tlist *items = tpl_iterate(c, target, v);
    if (items->n != target->n) {
        if (items->n < target->n)
            tpl_fail(c, target, TPL_ERR_RUNTIME,
                     "not enough values to unpack (expected %zu, got %zu)", target->n, items->n);
        tpl_fail(c, target, TPL_ERR_RUNTIME, "too many values to unpack (expected %zu)", target->n);
    }
    for (size_t i = 0; i < target->n; i++) assign(c, fr, target->list[i], items->v[i]);
    tpl_release(c, v_obj(V_LIST, items));
}

/* ---- expressions ----------------------------------------------------------------------- */

static val apply_filter(tctx *c, const node *f, val input);

/* Operand of a test: an attribute or item of an undefined value is undefined here instead
 * of an error, so `a.b.c is defined` answers for the whole chain. */
static val eval_lenient(tctx *c, const node *n) {
    if (n->kind != E_GETATTR && n->kind != E_GETITEM) return tpl_eval(c, n);
    enter(c, n);
    val obj = eval_lenient(c, n->a);
    val r;
    if (obj.t == V_UNDEF) {
        r = obj;
    } else if (n->kind == E_GETATTR) {
        r = tpl_getattr(c, n, obj, n->name);
        tpl_release(c, obj);
    } else {
        val key = tpl_eval(c, n->b);
        r = tpl_getitem(c, n, obj, key);
        tpl_release(c, key);
        tpl_release(c, obj);
    }
    c->depth--;
    return r;
}

static val lookup_name(tctx *c, tstr *name) {
    val *v = tpl_frame_lookup(c->frame, name->s, name->len);
    if (v) return vref(*v);
    const builtin *b = tpl_find_global(name->s);
    if (b) {
        tfunc *f = tpl_alloc(c, sizeof(tfunc), O_FUNC);
        f->kind = F_BUILTIN;
        f->name = b->name;
        f->fn = b->fn;
        return v_obj(V_FUNC, f);
    }
    return tpl_undef_name(c, name);
}

val tpl_eval(tctx *c, const node *n) {
    enter(c, n);
    tpl_step(c, n, 1);
    const node *saved_pos = c->pos;
    c->pos = n;
    val r;
    switch (n->kind) {
    case E_CONST:
        r = vref(n->cval);
        break;
    case E_NAME:
        r = lookup_name(c, n->name);
        break;
    case E_GETATTR: {
        val obj = tpl_eval(c, n->a);
        r = tpl_getattr(c, n, obj, n->name);
        tpl_release(c, obj);
        break;
    }
    case E_GETITEM: {
        val obj = tpl_eval(c, n->a);
        val key = tpl_eval(c, n->b);
        r = tpl_getitem(c, n, obj, key);
        tpl_release(c, key);
        tpl_release(c, obj);
        break;
    }
    case E_SLICE: {
        val obj = tpl_eval(c, n->a);
        val a = n->b ? tpl_eval(c, n->b) : v_none();
        val b = n->c ? tpl_eval(c, n->c) : v_none();
        val s = n->d ? tpl_eval(c, n->d) : v_none();
        r = do_slice(c, n, obj, a, b, s);
        tpl_release(c, a);
        tpl_release(c, b);
        tpl_release(c, s);
        tpl_release(c, obj);
        break;
    }
    case E_CALL: {
        val fn = tpl_eval(c, n->a);
        argbuf ab;
        eval_args(c, n, &ab);
        r = tpl_call(c, n, fn, &ab.a);
        free_args(c, &ab);
        tpl_release(c, fn);
        break;
    }
    case E_FILTER:
        r = apply_filter(c, n, v_undef());
        break;
    case E_TEST: {
        if (!n->fn) tpl_fail(c, n, TPL_ERR_RUNTIME, "No test named '%s'.", n->name->s);
        val v = eval_lenient(c, n->a);
        argbuf ab;
        eval_args(c, n, &ab);
        r = v_bool(tpl_truthy(n->fn->fn(c, n, v, &ab.a)));
        free_args(c, &ab);
        tpl_release(c, v);
        break;
    }
    case E_BIN: {
        val a = tpl_eval(c, n->a);
        val b = tpl_eval(c, n->b);
        r = tpl_arith(c, n, n->op, a, b);
        tpl_release(c, a);
        tpl_release(c, b);
        break;
    }
    case E_CONCAT: {
        tstr *s = tpl_str_new(c, n, 32);
        for (size_t i = 0; i < n->n; i++) {
            val v = tpl_eval(c, n->list[i]);
            tpl_to_str(c, n, s, v);
            tpl_release(c, v);
        }
        r = v_obj(V_STR, s);
        break;
    }
    case E_NEG:
    case E_POS: {
        val v = tpl_eval(c, n->a);
        if (v.t == V_UNDEF) tpl_fail_undef(c, n, v);
        if (!is_num(v))
            tpl_fail(c, n, TPL_ERR_RUNTIME, "bad operand type for unary %c: '%s'",
                     n->kind == E_NEG ? '-' : '+', tpl_type_name(v));
        if (n->kind == E_POS)
            r = v.t == V_BOOL ? v_int(v.u.i) : v;
        else if (v.t == V_FLOAT)
            r = v_float(-v.u.f);
        else if (v.u.i == INT64_MIN)
            tpl_fail(c, n, TPL_ERR_RUNTIME,
                     "integer overflow (results beyond 64 bits are not supported)");
        else
            r = v_int(-v.u.i);
        break;
    }
    case E_NOT: {
        val v = tpl_eval(c, n->a);
        r = v_bool(!tpl_truthy(v));
        tpl_release(c, v);
        break;
    }
    case E_AND:
    case E_OR: {
        val a = tpl_eval(c, n->a);
        if (tpl_truthy(a) == (n->kind == E_OR)) {
            r = a;
        } else {
            tpl_release(c, a);
            r = tpl_eval(c, n->b);
        }
        break;
    }
    case E_CMP: {
        val left = tpl_eval(c, n->a);
        int ok = 1;
        for (size_t i = 0; i < n->n && ok; i++) {
            val right = tpl_eval(c, n->list[i]);
            ok = compare_op(c, n, n->ops[i], left, right);
            tpl_release(c, left);
            left = right;
        }
        tpl_release(c, left);
        r = v_bool(ok);
        break;
    }
    case E_COND: {
        val t = tpl_eval(c, n->a);
        int yes = tpl_truthy(t);
        tpl_release(c, t);
        if (yes)
            r = tpl_eval(c, n->b);
        else if (n->c)
            r = tpl_eval(c, n->c);
        else
            r = tpl_undef_msg(c, "the inline if-expression evaluated to false and no else "
                                 "section was defined");
        break;
    }
    case E_LIST:
    case E_TUPLE: {
        tlist *l = tpl_list_new(c, n, n->n);
        l->tuple = n->kind == E_TUPLE ? L_TUPLE : L_LIST;
        r = v_obj(V_LIST, l);
        for (size_t i = 0; i < n->n; i++) tpl_list_push(c, n, l, tpl_eval(c, n->list[i]));
        break;
    }
    case E_DICT: {
        tdict *d = tpl_dict_new(c, n);
        r = v_obj(V_DICT, d);
        for (size_t i = 0; i < n->n; i++) {
            val k = tpl_eval(c, n->list[i]);
            val v = tpl_eval(c, n->list2[i]);
            tpl_dict_set(c, n->list[i], d, k, v);
        }
        break;
    }
    default:
        tpl_fail(c, n, TPL_ERR_RUNTIME, "internal error: not an expression");
    }
    c->pos = saved_pos;
    c->depth--;
    return r;
}

/* A filter node applied to its operand, or (for filter blocks and `set x | f`) to `input`
 * where the innermost operand is missing. */
static val apply_filter(tctx *c, const node *f, val input) {
    if (!f->fn) tpl_fail(c, f, TPL_ERR_RUNTIME, "No filter named '%s'.", f->name->s);
    enter(c, f);
    val self;
    if (!f->a)
        self = vref(input);
    else if (f->a->kind == E_FILTER)
        self = apply_filter(c, f->a, input);
    else
        self = tpl_eval(c, f->a);
    argbuf ab;
    eval_args(c, f, &ab);
    val r = f->fn->fn(c, f, self, &ab.a);
    free_args(c, &ab);
    tpl_release(c, self);
    c->depth--;
    return r;
}

/* ---- statements ------------------------------------------------------------------------ */

static int exec_in(tctx *c, const node *body, tframe *fr) {
    tframe *saved = c->frame;
    c->frame = fr;
    int r = tpl_exec(c, body);
    c->frame = saved;
    return r;
}

/* Renders body in a new scope into a new string. */
static val capture(tctx *c, const node *body, tframe *fr) {
    tstr *saved = c->out;
    tstr *s = tpl_str_new(c, body, 64);
    c->out = s;
    exec_in(c, body, fr);
    c->out = saved;
    return v_obj(V_STR, s);
}

static tfunc *make_macro(tctx *c, const node *m, const char *name) {
    tfunc *f = tpl_alloc(c, sizeof(tfunc), O_FUNC);
    f->kind = F_MACRO;
    f->name = name;
    f->macro = m;
    f->closure = c->frame;
    if (c->frame->h.rc >= 0) c->frame->h.rc++;
    return f;
}

static val call_macro(tctx *c, const node *at, tfunc *f, const targs *a) {
    const node *m = f->macro;
    size_t np = m->nnames;
    tframe *fr = tpl_frame_new(c, f->closure);
    uint8_t *bound = NULL;
    tlist *varargs = NULL;
    tdict *kwargs = NULL;
    val caller = v_undef();
    int have_caller = 0;
    if (np) {
        tstr *tmp = tpl_str_new(c, at, np);
        bound = (uint8_t *)tmp->s;
        memset(bound, 0, np);
    }
    for (size_t i = 0; i < a->n; i++) {
        if (i < np) {
            tpl_frame_set(c, fr, m->names[i], vref(a->pos[i]));
            bound[i] = 1;
            continue;
        }
        if (!(m->flags & MF_VARARGS))
            tpl_fail(c, at, TPL_ERR_RUNTIME, "macro '%s' takes not more than %zu argument(s)",
                     f->name, np);
        if (!varargs) varargs = tpl_list_new(c, at, a->n - np);
        tpl_list_push(c, at, varargs, vref(a->pos[i]));
    }
    for (size_t k = 0; k < a->nkw; k++) {
        tstr *kn = VSTR(a->kwn[k]);
        size_t i = 0;
        while (i < np && !(m->names[i]->len == kn->len && !memcmp(m->names[i]->s, kn->s, kn->len)))
            i++;
        if (i < np) {
            if (bound[i])
                tpl_fail(c, at, TPL_ERR_RUNTIME, "macro '%s' got multiple values for argument '%s'",
                         f->name, kn->s);
            tpl_frame_set(c, fr, m->names[i], vref(a->kw[k]));
            bound[i] = 1;
        } else if (!strcmp(kn->s, "caller") && (m->flags & MF_CALLER)) {
            caller = a->kw[k];
            have_caller = 1;
        } else if (m->flags & MF_KWARGS) {
            if (!kwargs) kwargs = tpl_dict_new(c, at);
            tpl_dict_set(c, at, kwargs, vref(v_obj(V_STR, kn)), vref(a->kw[k]));
        } else {
            tpl_fail(c, at, TPL_ERR_RUNTIME, "macro '%s' takes no keyword argument '%s'", f->name,
                     kn->s);
        }
    }
    if (m->flags & MF_VARARGS) {
        if (!varargs) varargs = tpl_list_new(c, at, 0);
        varargs->tuple = L_TUPLE;
        tpl_frame_set(c, fr, &s_varargs, v_obj(V_LIST, varargs));
    }
    if (m->flags & MF_KWARGS)
        tpl_frame_set(c, fr, &s_kwargs, v_obj(V_DICT, kwargs ? kwargs : tpl_dict_new(c, at)));
    if (m->flags & MF_CALLER)
        tpl_frame_set(c, fr, &s_caller,
                      have_caller ? vref(caller) : tpl_undef_msg(c, "No caller defined"));
    /* defaults are evaluated in the macro's scope, so they may use earlier parameters */
    for (size_t i = 0; i < np; i++) {
        if (bound[i]) continue;
        val v;
        if (m->list[i]) {
            tframe *saved = c->frame;
            c->frame = fr;
            v = tpl_eval(c, m->list[i]);
            c->frame = saved;
        } else {
            char msg[160];
            snprintf(msg, sizeof msg, "parameter '%s' was not provided", m->names[i]->s);
            v = tpl_undef_msg(c, msg);
        }
        tpl_frame_set(c, fr, m->names[i], v);
    }
    val r = capture(c, m->b, fr);
    tpl_release_obj(c, &fr->h);
    return r;
}

static int exec_for(tctx *c, const node *n) {
    val itv = tpl_eval(c, n->b);
    tlist *items = tpl_iterate(c, n->b, itv);
    tpl_release(c, itv);
    if (n->c) { /* loop filter: items for which the condition holds, before `loop` exists */
        tlist *kept = tpl_list_new(c, n, 0);
        for (size_t i = 0; i < items->n; i++) {
            tpl_step(c, n, 1);
            tframe *fr = tpl_frame_new(c, c->frame);
            assign(c, fr, n->a, items->v[i]);
            tframe *saved = c->frame;
            c->frame = fr;
            val t = tpl_eval(c, n->c);
            c->frame = saved;
            if (tpl_truthy(t)) tpl_list_push(c, n, kept, vref(items->v[i]));
            tpl_release(c, t);
            tpl_release_obj(c, &fr->h);
        }
        tpl_release(c, v_obj(V_LIST, items));
        items = kept;
    }
    if (items->n == 0) {
        tpl_release(c, v_obj(V_LIST, items));
        if (!n->e) return EX_OK;
        tframe *fr = tpl_frame_new(c, c->frame);
        int r = exec_in(c, n->e, fr);
        tpl_release_obj(c, &fr->h);
        return r;
    }
    tloop *lp = tpl_alloc(c, sizeof(tloop), O_LOOP);
    lp->items = items; /* takes the reference */
    val lv = v_obj(V_LOOP, lp);
    for (size_t i = 0; i < items->n; i++) {
        tpl_step(c, n, 1);
        lp->i = i;
        tframe *fr = tpl_frame_new(c, c->frame);
        assign(c, fr, n->a, items->v[i]);
        tpl_frame_set(c, fr, &s_loop, vref(lv));
        int r = exec_in(c, n->d, fr);
        tpl_release_obj(c, &fr->h);
        if (r == EX_BREAK) break;
    }
    tpl_release(c, lv);
    return EX_OK;
}

int tpl_exec(tctx *c, const node *n) {
    enter(c, n);
    tpl_step(c, n, 1);
    const node *saved_pos = c->pos;
    c->pos = n;
    int r = EX_OK;
    switch (n->kind) {
    case S_LIST:
        for (size_t i = 0; i < n->n && r == EX_OK; i++) r = tpl_exec(c, n->list[i]);
        break;
    case S_DATA:
        tpl_str_add(c, n, c->out, VSTR(n->cval)->s, VSTR(n->cval)->len);
        break;
    case S_OUT: {
        val v = tpl_eval(c, n->a);
        tpl_to_str(c, n, c->out, v);
        tpl_release(c, v);
        break;
    }
    case S_IF: {
        size_t i = 0;
        for (; i < n->n; i++) {
            val t = tpl_eval(c, n->list[i]);
            int yes = tpl_truthy(t);
            tpl_release(c, t);
            if (yes) break;
        }
        if (i < n->n)
            r = tpl_exec(c, n->list2[i]);
        else if (n->b)
            r = tpl_exec(c, n->b);
        break;
    }
    case S_FOR:
        r = exec_for(c, n);
        break;
    case S_SET: {
        val v = tpl_eval(c, n->b);
        assign(c, c->frame, n->a, v);
        tpl_release(c, v);
        break;
    }
    case S_SETBLOCK: {
        tframe *fr = tpl_frame_new(c, c->frame);
        val v = capture(c, n->b, fr);
        tpl_release_obj(c, &fr->h);
        if (n->c) {
            val f = apply_filter(c, n->c, v);
            tpl_release(c, v);
            v = f;
        }
        assign(c, c->frame, n->a, v);
        tpl_release(c, v);
        break;
    }
    case S_MACRO: {
        tfunc *f = make_macro(c, n, n->name->s);
        tpl_frame_set(c, c->frame, n->name, v_obj(V_FUNC, f));
        break;
    }
    case S_CALLBLOCK: {
        const node *call = n->a;
        tfunc *f = make_macro(c, n, "caller");
        val fv = v_obj(V_FUNC, f);
        val fn = tpl_eval(c, call->a);
        argbuf ab;
        eval_args(c, call, &ab);
        /* the same arguments plus caller= */
        tlist *kwv = tpl_list_new(c, n, ab.a.nkw + 1);
        tlist *kwn = tpl_list_new(c, n, ab.a.nkw + 1);
        for (size_t i = 0; i < ab.a.nkw; i++) {
            tpl_list_push(c, n, kwv, vref(ab.a.kw[i]));
            tpl_list_push(c, n, kwn, vref(ab.a.kwn[i]));
        }
        tpl_list_push(c, n, kwv, vref(fv));
        tpl_list_push(c, n, kwn, v_obj(V_STR, &s_caller));
        targs a2 = {.n = ab.a.n, .pos = ab.a.pos, .nkw = kwn->n, .kwn = kwn->v, .kw = kwv->v};
        val v = tpl_call(c, n, fn, &a2);
        tpl_to_str(c, n, c->out, v);
        tpl_release(c, v);
        tpl_release(c, v_obj(V_LIST, kwv));
        tpl_release(c, v_obj(V_LIST, kwn));
        free_args(c, &ab);
        tpl_release(c, fn);
        tpl_release(c, fv);
        break;
    }
    case S_FILTERBLOCK: {
        tframe *fr = tpl_frame_new(c, c->frame);
        val v = capture(c, n->b, fr);
        tpl_release_obj(c, &fr->h);
        val f = apply_filter(c, n->a, v);
        tpl_to_str(c, n, c->out, f);
        tpl_release(c, f);
        tpl_release(c, v);
        break;
    }
    case S_WITH: {
        tframe *fr = tpl_frame_new(c, c->frame);
        /* all values first, in the outer scope */
        tlist *vals = tpl_list_new(c, n, n->n2);
        for (size_t i = 0; i < n->n2; i++) tpl_list_push(c, n, vals, tpl_eval(c, n->list2[i]));
        for (size_t i = 0; i < n->n; i++) assign(c, fr, n->list[i], vals->v[i]);
        tpl_release(c, v_obj(V_LIST, vals));
        r = exec_in(c, n->b, fr);
        tpl_release_obj(c, &fr->h);
        break;
    }
    case S_BREAK:
        r = EX_BREAK;
        break;
    case S_CONTINUE:
        r = EX_CONTINUE;
        break;
    case S_SCOPE: {
        tframe *fr = tpl_frame_new(c, c->frame);
        r = exec_in(c, n->b, fr);
        tpl_release_obj(c, &fr->h);
        break;
    }
    default:
        tpl_fail(c, n, TPL_ERR_RUNTIME, "internal error: not a statement");
    }
    c->pos = saved_pos;
    c->depth--;
    return r;
}
