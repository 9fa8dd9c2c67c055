/* Internals of the Jinja interpreter shared by its source files: values, the AST, the
 * render context and the builtin tables. Nothing here is part of the public API. */
#ifndef LMHOST_TPL_INTERNAL_H
#define LMHOST_TPL_INTERNAL_H

#include "chat_template.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

/* ---- values ---------------------------------------------------------------------------- */

typedef enum {
    V_UNDEF, /* u.o: NULL or an O_UNDEF object saying why (for error messages) */
    V_NONE,
    V_BOOL, /* u.i: 0 or 1 */
    V_INT,
    V_FLOAT,
    V_STR,  /* u.o: tstr */
    V_LIST, /* u.o: tlist (also tuples) */
    V_DICT, /* u.o: tdict */
    V_NS,   /* u.o: tdict (namespace attributes) */
    V_FUNC, /* u.o: tfunc */
    V_LOOP, /* u.o: tloop */
} vtype;

typedef struct hobj hobj;

typedef struct val {
    uint8_t t;
    uint8_t safe; /* V_STR: marked safe (|safe, |e), so |e leaves it alone */
    union {
        int64_t i;
        double f;
        hobj *o;
    } u;
} val;

enum { O_STR, O_LIST, O_DICT, O_FUNC, O_LOOP, O_FRAME, O_UNDEF };

/* Heap objects of one render are linked in the context's list so that an error (a longjmp)
 * or a reference cycle never leaks: whatever is left is swept when the render ends. An
 * object owned by a compiled template has rc < 0 and is never touched by a render, which is
 * what makes one compiled template safe to render from several threads at once. */
struct hobj {
    hobj *prev, *next;
    int32_t rc;
    uint8_t kind;
};

typedef struct tstr {
    hobj h;
    size_t len, cap;
    int64_t ncp; /* code points, -1 until counted */
    char *s;     /* NUL-terminated; may hold NULs inside */
} tstr;

enum { L_LIST, L_TUPLE, L_GROUP, L_RANGE, L_KEYS, L_VALUES, L_ITEMS, L_GEN, L_REVITER };

typedef struct tlist {
    hobj h;
    size_t n, cap;
    /* L_LIST; L_TUPLE; L_GROUP: groupby's (grouper, list); L_RANGE: range(); L_KEYS, ..: the
     * views that dict.keys() and co. return, which print and index differently; L_GEN,
     * L_REVITER: the generators that map, select, unique, ... and reverse return in jinja:
     * always true, without a length, and empty once iterated */
    uint8_t tuple;
    val *v;
    int64_t rstart, rstop, rstep; /* L_RANGE: its arguments, for repr */
    struct tstr *lazy_err;        /* L_GEN: the error its computation met, raised on use */
} tlist;
#define IS_TUPLE(l) ((l)->tuple == L_TUPLE || (l)->tuple == L_GROUP)
#define IS_VIEW(l)  ((l)->tuple >= L_KEYS && (l)->tuple <= L_ITEMS)
#define IS_ITER(l)  ((l)->tuple >= L_GEN)
#define IS_PLAIN(l) ((l)->tuple <= L_RANGE) /* an indexable list, tuple or range */

typedef struct dent {
    val k, v;
    uint64_t hash;
} dent;

typedef struct tdict {
    hobj h;
    size_t n, cap;
    dent *e;
    uint32_t *idx; /* open-addressing index (entry+1, 0 empty) once the dict grows */
    size_t idxcap;
} tdict;

struct node;
struct tframe;

typedef enum {
    F_BUILTIN, /* global function or constructor: range, dict, namespace, ... */
    F_METHOD,  /* bound method of a str/list/dict/loop/cycler */
    F_MACRO,   /* macro or call-block caller */
    F_JOINER,
    F_CYCLER,
} fkind;

struct targs;
struct tctx;
typedef val (*builtin_fn)(struct tctx *c, const struct node *at, val self, const struct targs *a);

typedef struct tfunc {
    hobj h;
    uint8_t kind;
    const char *name;
    builtin_fn fn;            /* F_BUILTIN, F_METHOD */
    val self;                 /* F_METHOD receiver; F_JOINER separator; F_CYCLER items */
    const struct node *macro; /* F_MACRO: S_MACRO or S_CALLBLOCK */
    struct tframe *closure;   /* F_MACRO */
    int64_t state;            /* F_JOINER used flag, F_CYCLER position */
} tfunc;

typedef struct tloop {
    hobj h;
    tlist *items;
    size_t i;
    val last; /* loop.changed() */
    int has_last;
} tloop;

/* Variables of one scope, newest last. */
typedef struct tframe {
    hobj h;
    struct tframe *parent;
    size_t n, cap;
    tstr **names;
    val *vals;
} tframe;

/* Why a value is undefined, for the message of the error its use raises. */
typedef struct tundef {
    hobj h;
    val name;  /* a str, or the missing index */
    val obj;   /* the object looked into, V_UNDEF when a variable was missing */
    tstr *msg; /* custom message (sandbox refusal, first of an empty sequence, ...) */
} tundef;

/* ---- AST ------------------------------------------------------------------------------- */

typedef enum {
    /* expressions */
    E_CONST,
    E_NAME,
    E_GETATTR,
    E_GETITEM,
    E_SLICE,
    E_CALL,
    E_FILTER,
    E_TEST,
    E_BIN,
    E_CONCAT,
    E_NEG,
    E_POS,
    E_NOT,
    E_AND,
    E_OR,
    E_CMP,
    E_COND,
    E_LIST,
    E_TUPLE,
    E_DICT,
    E_NSREF, /* ns.attr as an assignment target */
    /* statements */
    S_LIST,
    S_DATA,
    S_OUT,
    S_IF,
    S_FOR,
    S_SET,
    S_SETBLOCK,
    S_MACRO,
    S_CALLBLOCK,
    S_FILTERBLOCK,
    S_WITH,
    S_BREAK,
    S_CONTINUE,
    S_SCOPE, /* generation / block: renders its body in place */
} nkind;

enum { OP_ADD = 1, OP_SUB, OP_MUL, OP_DIV, OP_FLOORDIV, OP_MOD, OP_POW };
enum { CMP_EQ = 1, CMP_NE, CMP_LT, CMP_LE, CMP_GT, CMP_GE, CMP_IN, CMP_NOTIN };

/* macro flags */
enum { MF_VARARGS = 1, MF_KWARGS = 2, MF_CALLER = 4 };

struct builtin;

/* One node type for everything; the comments of nkind's users say which fields they use. */
typedef struct node {
    uint8_t kind;
    uint8_t op;
    uint8_t flags;
    int line, col;
    val cval;   /* E_CONST, S_DATA */
    tstr *name; /* names: variable, attribute, filter, test, macro */
    struct node *a, *b, *c, *d, *e;
    struct node **list; /* positional args, items, keys, conditions, body statements, ... */
    size_t n;
    struct node **list2; /* keyword values, dict values, bodies, defaults */
    size_t n2;
    tstr **names; /* keyword names, macro parameters */
    size_t nnames;
    uint8_t *ops;             /* E_CMP operators */
    const struct builtin *fn; /* E_FILTER, E_TEST */
} node;

struct tpl_template {
    node *root;
    hobj **owned; /* immortal strings owned by this template */
    size_t nowned, capowned;
    char *src; /* the normalized source */
};

/* ---- builtins ------------------------------------------------------------------------- */

typedef struct targs {
    size_t n;
    val *pos;
    size_t nkw;
    val *kwn; /* V_STR names */
    val *kw;
} targs;

typedef struct builtin {
    const char *name;
    builtin_fn fn;
} builtin;

const builtin *tpl_find_filter(const char *name);
const builtin *tpl_find_test(const char *name);
const builtin *tpl_find_global(const char *name);
val tpl_cycler_current(struct tctx *c, val cycler);
/* Method `name` of v's type; *unsafe set when the sandbox refuses it (list.append, ...). */
builtin_fn tpl_find_method(val v, const char *name, int *unsafe);

/* ---- render context -------------------------------------------------------------------- */

typedef struct tctx {
    jmp_buf *jb;
    int err_code;
    char *err; /* malloc'd message once an error happened */
    hobj live; /* sentinel of the list of live objects */
    hobj *dying;
    int draining;
    size_t mem, max_mem;
    uint64_t steps, max_steps;
    int depth, max_depth;
    size_t max_output;
    tstr *out; /* where output goes now */
    tframe *root;
    tframe *frame;   /* the innermost scope */
    const node *pos; /* the node being evaluated: where budget and memory errors point */
    int64_t now;     /* seconds since the epoch for strftime_now */
    const tpl_template *tpl;
} tctx;

/* errors: format the message with the node's position, then longjmp out of the render */
_Noreturn void tpl_fail(tctx *c, const node *at, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
_Noreturn void tpl_fail_undef(tctx *c, const node *at, val u);
/* raises a generator's deferred error (already "LINE:COL: message") */
_Noreturn void tpl_fail_lazy(tctx *c, tlist *gen);
_Noreturn void tpl_over_budget(tctx *c, const node *at);
/* Work is charged where it happens (each node, object, list item, string append, compared
 * value), so that every loop of a template, whatever it does, runs out of steps. */
static inline void tpl_step(tctx *c, const node *at, uint64_t n) {
    c->steps += n;
    if (c->steps > c->max_steps) tpl_over_budget(c, at);
}

/* memory */
void *tpl_alloc(tctx *c, size_t size, int kind);
void tpl_mem_charge(tctx *c, const node *at, size_t delta);
void tpl_release(tctx *c, val v);
void tpl_release_obj(tctx *c, hobj *o);
void tpl_sweep(tctx *c);
static inline val vref(val v) {
    if (v.t >= V_STR || (v.t == V_UNDEF && v.u.o)) {
        if (v.u.o->rc >= 0) v.u.o->rc++;
    }
    return v;
}
#define VUNREF(c, v) tpl_release((c), (v))

/* constructors */
static inline val v_undef(void) {
    return (val){.t = V_UNDEF};
}
static inline val v_none(void) {
    return (val){.t = V_NONE};
}
static inline val v_bool(int b) {
    return (val){.t = V_BOOL, .u.i = b != 0};
}
static inline val v_int(int64_t i) {
    return (val){.t = V_INT, .u.i = i};
}
static inline val v_float(double f) {
    return (val){.t = V_FLOAT, .u.f = f};
}
static inline val v_obj(int t, void *o) {
    return (val){.t = (uint8_t)t, .u.o = (hobj *)o};
}
#define VSTR(v)  ((tstr *)(v).u.o)
#define VLIST(v) ((tlist *)(v).u.o)
#define VDICT(v) ((tdict *)(v).u.o)
#define VFUNC(v) ((tfunc *)(v).u.o)

/* strings */
tstr *tpl_str_new(tctx *c, const node *at, size_t cap);
void tpl_str_add(tctx *c, const node *at, tstr *s, const char *p, size_t n);
void tpl_str_addc(tctx *c, const node *at, tstr *s, char ch);
void tpl_str_addf(tctx *c, const node *at, tstr *s, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
void tpl_str_add_cp(tctx *c, const node *at, tstr *s, int32_t cp);
val tpl_str_val(tctx *c, const node *at, const char *p, size_t n);
val tpl_cstr_val(tctx *c, const node *at, const char *p);
int64_t tpl_str_ncp(tstr *s);
tstr *tpl_str_immortal(tpl_template *t, const char *p, size_t n);

/* lists and dicts */
tlist *tpl_list_new(tctx *c, const node *at, size_t cap);
void tpl_list_push(tctx *c, const node *at, tlist *l, val v); /* takes the reference */
tdict *tpl_dict_new(tctx *c, const node *at);
/* takes both references; replaces the value of an existing key in place */
void tpl_dict_set(tctx *c, const node *at, tdict *d, val k, val v);
dent *tpl_dict_find(tctx *c, const node *at, const tdict *d, val k);
dent *tpl_dict_find_str(const tdict *d, const char *k, size_t len);

/* frames */
tframe *tpl_frame_new(tctx *c, tframe *parent);
void tpl_frame_set(tctx *c, tframe *f, tstr *name, val v); /* takes v */
val *tpl_frame_lookup(tframe *f, const char *name, size_t len);

/* undefined with a reason */
val tpl_undef_attr(tctx *c, val obj, val name);
val tpl_undef_name(tctx *c, tstr *name);
val tpl_undef_msg(tctx *c, const char *msg);
val tpl_undef_security(tctx *c, val obj, const char *attr);

/* Python-like semantics */
const char *tpl_type_name(val v);
int tpl_truthy(val v);
int tpl_equal(tctx *c, const node *at, val a, val b);
/* <0, 0, >0; fails with a TypeError-like message when the types don't order */
int tpl_compare(tctx *c, const node *at, val a, val b, const char *opname);
/* str(v) appended to s (Python's str(): repr inside containers) */
void tpl_to_str(tctx *c, const node *at, tstr *s, val v);
void tpl_repr(tctx *c, const node *at, tstr *s, val v, int depth);
/* repr with dict keys in sorted order, as pprint writes them (no line wrapping) */
void tpl_repr_sorted(tctx *c, const node *at, tstr *s, val v, int depth);
val tpl_str_of(tctx *c, const node *at, val v); /* str(v) as a new value (v itself if a str) */
void tpl_float_repr(double f, char *buf, size_t n);
uint64_t tpl_hash(tctx *c, const node *at, val k);
/* items of an iterable as a new list (dict: keys, str: characters, undefined: empty) */
tlist *tpl_iterate(tctx *c, const node *at, val v);
int64_t tpl_length(tctx *c, const node *at, val v);
/* drops the first k items of a generator (they have been consumed) */
void tpl_iter_consume(tctx *c, tlist *l, size_t k);

/* evaluation entry points used by the builtins */
val tpl_getattr(tctx *c, const node *at, val obj, tstr *name);
val tpl_getitem(tctx *c, const node *at, val obj, val key);
val tpl_call(tctx *c, const node *at, val fn, const targs *a);
val tpl_call_filter(tctx *c, const node *at, const char *name, val self, const targs *a);
int tpl_call_test(tctx *c, const node *at, const char *name, val v, const targs *a);

/* json */
val tpl_from_json(tctx *c, const node *at, void *json_obj, int depth);
void tpl_tojson(tctx *c, const node *at, tstr *s, val v, int ensure_ascii, const char *indent,
                int has_indent, const char *item_sep, const char *key_sep, int sort_keys, int depth,
                int level);

/* argument binding for builtins: spec is "name,name2=,..." (a '=' marks an optional one);
 * out[i] is V_UNDEF with safe == 1 (and no object) when not given */
void tpl_bind(tctx *c, const node *at, const char *fname, const targs *a, const char *spec,
              val *out, size_t nout);
static inline int given(val v) {
    return !(v.t == V_UNDEF && v.safe == 1);
}

/* ---- unicode --------------------------------------------------------------------------- */

/* One code point of s[i..n); invalid bytes decode to 0xDC80+byte (and encode back). */
int32_t tpl_utf8_next(const char *s, size_t n, size_t *i);
size_t tpl_utf8_put(char *out, int32_t cp);
int tpl_py_isspace(int32_t cp);
int tpl_is_cased(int32_t cp);
int tpl_is_alpha(int32_t cp);
int tpl_is_alnum(int32_t cp);
int tpl_is_digit(int32_t cp);
int tpl_is_decimal(int32_t cp);
int tpl_is_numeric(int32_t cp);
int tpl_is_upper(int32_t cp);
int tpl_is_lower(int32_t cp);
int tpl_is_printable(int32_t cp);
int tpl_is_word(int32_t cp); /* regex \w */
int tpl_is_ident_start(int32_t cp);
int tpl_is_ident_char(int32_t cp);
enum { CASE_LOWER, CASE_UPPER, CASE_TITLE };
/* Full case mapping of one code point (Python str.upper/lower/title), appended to s. */
void tpl_case_map(tctx *c, const node *at, tstr *s, int32_t cp, int mode);
/* Python str.lower() of a whole string (with the final sigma rule) */
void tpl_lower_str(tctx *c, const node *at, tstr *out, const char *p, size_t n);
/* lowers p[from..to) with the rest of p[0..n) as the context of a final sigma */
void tpl_lower_range(tctx *c, const node *at, tstr *out, const char *p, size_t n, size_t from,
                     size_t to);

/* ---- compiling ------------------------------------------------------------------------- */

int tpl_exec(tctx *c, const node *n);
val tpl_eval(tctx *c, const node *n);
/* a string of printf-style formatting: fmt % args (Python's str.__mod__) */
val tpl_percent_format(tctx *c, const node *at, tstr *fmt, val args);
/* Python's floor division and modulo of two numbers */
val tpl_arith(tctx *c, const node *at, int op, val a, val b);

#endif
