/* Compiling a grammar: the tree becomes a byte NFA per rule (Thompson's construction, with
 * call edges for rules), then a DFA per rule by subset construction, where a state keeps its
 * byte transitions (by byte class), the rules it calls with the state to return to, and
 * whether its rule may end there. Then, per state, the fewest bytes to its rule's end (a
 * fixed point, since rules call each other), which the matcher sums along its stack. */
#include "gram_internal.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A repeat or bounded string unrolls inline up to this many NFA nodes; beyond it each
 * repetition calls a rule of its own, which keeps the automaton linear in the count. */
#define INLINE_LIMIT 4096
#define MAX_NFA      (1 << 22)
/* Bounded strings unroll inline up to this many characters, so that the matcher can count
 * whole tokens of plain text through them (see next_char). */
#define STRING_INLINE_CHARS 1024
#define MAX_DFA             (1 << 20)

typedef struct {
    int32_t from, to;
    uint8_t lo, hi, lit;
} bedge;

typedef struct {
    int32_t from, to;
} eedge;

typedef struct {
    int32_t rule, call_rule, call_next;
} nnode;

typedef struct {
    nnode *nodes;
    int32_t n_nodes, cap_nodes;
    bedge *be;
    int32_t n_be, cap_be;
    eedge *ee;
    int32_t n_ee, cap_ee;
    /* program rules: 0 the root, 1.. the gram's, then made here */
    int32_t n_rules, cap_rules;
    int32_t *r_start, *r_end;
    const ast **r_ast; /* NULL: the one-character string rule */
    const char **r_name;
    const ast **memo_ast; /* a repeated tree -> its rule */
    int32_t *memo_rule;
    int n_memo, cap_memo;
    int32_t char_rule;
    char **lit_text;
    size_t *lit_len;
    int n_lit, cap_lit;
    bool oom, too_big;
} nb;

static void *grow(void *p, int32_t *cap, int32_t need, size_t sz, bool *oom) {
    if (need <= *cap) return p;
    int32_t nc = *cap ? *cap : 16;
    while (nc < need) nc *= 2;
    void *q = realloc(p, (size_t)nc * sz);
    if (!q) {
        *oom = true;
        return NULL;
    }
    *cap = nc;
    return q;
}

static int32_t node(nb *b, int32_t rule) {
    if (b->n_nodes >= MAX_NFA) {
        b->too_big = true;
        return 0;
    }
    nnode *n = grow(b->nodes, &b->cap_nodes, b->n_nodes + 1, sizeof *n, &b->oom);
    if (!n) return 0;
    b->nodes = n;
    n[b->n_nodes] = (nnode){rule, -1, -1};
    return b->n_nodes++;
}

static void eps(nb *b, int32_t from, int32_t to) {
    eedge *e = grow(b->ee, &b->cap_ee, b->n_ee + 1, sizeof *e, &b->oom);
    if (!e) return;
    b->ee = e;
    e[b->n_ee++] = (eedge){from, to};
}

static void edge(nb *b, int32_t from, int32_t to, int lo, int hi, bool lit) {
    bedge *e = grow(b->be, &b->cap_be, b->n_be + 1, sizeof *e, &b->oom);
    if (!e) return;
    b->be = e;
    e[b->n_be++] = (bedge){from, to, (uint8_t)lo, (uint8_t)hi, lit};
}

static int32_t add_prule(nb *b, const ast *a, const char *name) {
    int32_t r = b->n_rules;
    int32_t cap = b->cap_rules;
    int32_t *s = grow(b->r_start, &cap, r + 1, sizeof *s, &b->oom);
    if (s) b->r_start = s;
    cap = b->cap_rules;
    int32_t *e = grow(b->r_end, &cap, r + 1, sizeof *e, &b->oom);
    if (e) b->r_end = e;
    cap = b->cap_rules;
    const ast **x = grow(b->r_ast, &cap, r + 1, sizeof *x, &b->oom);
    if (x) b->r_ast = x;
    cap = b->cap_rules;
    const char **nm = grow(b->r_name, &cap, r + 1, sizeof *nm, &b->oom);
    if (nm) b->r_name = nm;
    if (b->oom) return -1;
    b->cap_rules = cap;
    b->r_ast[r] = a;
    b->r_name[r] = name;
    b->r_start[r] = b->r_end[r] = -1;
    return b->n_rules++;
}

/* The rule that matches tree a alone (made once per tree). */
static int32_t rule_of(nb *b, const ast *a) {
    if (a->k == A_CALL) return a->rule + 1;
    for (int i = 0; i < b->n_memo; i++)
        if (b->memo_ast[i] == a) return b->memo_rule[i];
    int32_t cap = b->cap_memo;
    const ast **m = grow(b->memo_ast, &cap, b->n_memo + 1, sizeof *m, &b->oom);
    if (m) b->memo_ast = m;
    cap = b->cap_memo;
    int32_t *mr = grow(b->memo_rule, &cap, b->n_memo + 1, sizeof *mr, &b->oom);
    if (mr) b->memo_rule = mr;
    if (b->oom) return -1;
    b->cap_memo = cap;
    int32_t r = add_prule(b, a, NULL);
    if (r < 0) return -1;
    b->memo_ast[b->n_memo] = a;
    b->memo_rule[b->n_memo++] = r;
    return r;
}

static void call(nb *b, int32_t from, int32_t to, int32_t rule, int32_t cur_rule) {
    int32_t n = node(b, cur_rule);
    if (b->oom || b->too_big) return;
    b->nodes[n].call_rule = rule;
    b->nodes[n].call_next = to;
    eps(b, from, n);
}

static void lit_edges(nb *b, int32_t from, int32_t to, const char *s, size_t n, bool lit,
                      int32_t rule) {
    if (!n) {
        eps(b, from, to);
        return;
    }
    int32_t cur = from;
    for (size_t i = 0; i < n; i++) {
        int32_t nx = i + 1 == n ? to : node(b, rule);
        edge(b, cur, nx, (uint8_t)s[i], (uint8_t)s[i], lit);
        cur = nx;
    }
}

static void note_lit(nb *b, const char *s, size_t n) {
    for (int i = 0; i < b->n_lit; i++)
        if (b->lit_len[i] == n && !memcmp(b->lit_text[i], s, n)) return;
    int32_t cap = b->cap_lit;
    char **t = grow(b->lit_text, &cap, b->n_lit + 1, sizeof *t, &b->oom);
    if (t) b->lit_text = t;
    cap = b->cap_lit;
    size_t *l = grow(b->lit_len, &cap, b->n_lit + 1, sizeof *l, &b->oom);
    if (l) b->lit_len = l;
    char *d = malloc(n ? n : 1);
    if (b->oom || !d) {
        free(d);
        b->oom = true;
        return;
    }
    b->cap_lit = cap;
    if (n) memcpy(d, s, n);
    b->lit_text[b->n_lit] = d;
    b->lit_len[b->n_lit++] = n;
}

/* Optional single space. */
static void ws_edges(nb *b, int32_t from, int32_t to) {
    eps(b, from, to);
    edge(b, from, to, ' ', ' ', false);
}

static void hex_edges(nb *b, int32_t from, int32_t to) {
    edge(b, from, to, '0', '9', false);
    edge(b, from, to, 'A', 'F', false);
    edge(b, from, to, 'a', 'f', false);
}

/* One character of JSON string content: unescaped UTF-8 (no control characters, no '"' or
 * '\\'), or an escape; \u escapes of surrogates only as a high-low pair. */
static void char_edges(nb *b, int32_t from, int32_t to, int32_t r) {
    edge(b, from, to, 0x20, 0x21, false);
    edge(b, from, to, 0x23, 0x5B, false);
    edge(b, from, to, 0x5D, 0x7F, false);
    int32_t esc = node(b, r), u = node(b, r), ud = node(b, r), h3 = node(b, r), h2 = node(b, r),
            h1 = node(b, r), sh2 = node(b, r), sh1 = node(b, r), sb = node(b, r), su = node(b, r),
            sd = node(b, r), se = node(b, r);
    edge(b, from, esc, '\\', '\\', false);
    static const char simple[] = "\"\\/bfnrt";
    for (const char *p = simple; *p; p++) edge(b, esc, to, *p, *p, false);
    edge(b, esc, u, 'u', 'u', false);
    edge(b, u, h3, '0', '9', false);
    edge(b, u, h3, 'A', 'C', false);
    edge(b, u, h3, 'a', 'c', false);
    edge(b, u, h3, 'E', 'F', false);
    edge(b, u, h3, 'e', 'f', false);
    edge(b, u, ud, 'D', 'D', false);
    edge(b, u, ud, 'd', 'd', false);
    edge(b, ud, h2, '0', '7', false);
    edge(b, ud, sh2, '8', '9', false);
    edge(b, ud, sh2, 'A', 'B', false);
    edge(b, ud, sh2, 'a', 'b', false);
    hex_edges(b, h3, h2);
    hex_edges(b, h2, h1);
    hex_edges(b, h1, to);
    hex_edges(b, sh2, sh1);
    hex_edges(b, sh1, sb);
    edge(b, sb, su, '\\', '\\', false);
    edge(b, su, sd, 'u', 'u', false);
    edge(b, sd, se, 'D', 'D', false);
    edge(b, sd, se, 'd', 'd', false);
    edge(b, se, h2, 'C', 'F', false);
    edge(b, se, h2, 'c', 'f', false);
    /* UTF-8 of U+0080 and up, without overlongs and surrogates */
    int32_t t1 = node(b, r), t2 = node(b, r), t3 = node(b, r), e0 = node(b, r), ed = node(b, r),
            f0 = node(b, r), f4 = node(b, r);
    edge(b, from, t1, 0xC2, 0xDF, false);
    edge(b, t1, to, 0x80, 0xBF, false);
    edge(b, from, e0, 0xE0, 0xE0, false);
    edge(b, e0, t1, 0xA0, 0xBF, false);
    edge(b, from, t2, 0xE1, 0xEC, false);
    edge(b, from, t2, 0xEE, 0xEF, false);
    edge(b, t2, t1, 0x80, 0xBF, false);
    edge(b, from, ed, 0xED, 0xED, false);
    edge(b, ed, t1, 0x80, 0x9F, false);
    edge(b, from, f0, 0xF0, 0xF0, false);
    edge(b, f0, t2, 0x90, 0xBF, false);
    edge(b, from, t3, 0xF1, 0xF3, false);
    edge(b, t3, t2, 0x80, 0xBF, false);
    edge(b, from, f4, 0xF4, 0xF4, false);
    edge(b, f4, t2, 0x80, 0x8F, false);
}
#define CHAR_NODES 19

/* The UTF-8 decoder's states: 0 between characters, else what the next byte must be. */
static int utf8_step(int u, int c) {
    switch (u) {
    case 0:
        if (c < 0x80) return 0;
        if (c >= 0xC2 && c <= 0xDF) return 1;
        if (c == 0xE0) return 3;
        if ((c >= 0xE1 && c <= 0xEC) || c == 0xEE || c == 0xEF) return 2;
        if (c == 0xED) return 4;
        if (c == 0xF0) return 6;
        if (c >= 0xF1 && c <= 0xF3) return 5;
        if (c == 0xF4) return 7;
        return -1;
    case 1:
        return c >= 0x80 && c <= 0xBF ? 0 : -1;
    case 2:
        return c >= 0x80 && c <= 0xBF ? 1 : -1;
    case 3:
        return c >= 0xA0 && c <= 0xBF ? 1 : -1;
    case 4:
        return c >= 0x80 && c <= 0x9F ? 1 : -1;
    case 5:
        return c >= 0x80 && c <= 0xBF ? 2 : -1;
    case 6:
        return c >= 0x90 && c <= 0xBF ? 2 : -1;
    case 7:
        return c >= 0x80 && c <= 0x8F ? 2 : -1;
    }
    return -1;
}

static bool valid_utf8(const char *s, size_t n) {
    int u = 0;
    for (size_t i = 0; i < n && u >= 0; i++) u = utf8_step(u, (unsigned char)s[i]);
    return u == 0;
}

/* Valid UTF-8 text up to the first occurrence of end, which ends it: the string-matching
 * automaton of end (Knuth-Morris-Pratt) crossed with the UTF-8 decoder's states. */
static void until_edges(nb *b, int32_t from, int32_t to, const char *end, size_t len, int32_t r) {
    if (!len) {
        eps(b, from, to);
        return;
    }
    bool utf8 = valid_utf8(end, len);
    int32_t *fail = malloc(len * sizeof *fail);
    int32_t *ids = malloc((len + 1) * 8 * sizeof *ids);
    int32_t *queue = malloc((len + 1) * 8 * sizeof *queue);
    if (!fail || !ids || !queue) {
        b->oom = true;
        goto out;
    }
    fail[0] = 0;
    for (size_t i = 1, k = 0; i < len; i++) {
        while (k && end[i] != end[k]) k = (size_t)fail[k - 1];
        if (end[i] == end[k]) k++;
        fail[i] = (int32_t)k;
    }
    for (size_t i = 0; i < (len + 1) * 8; i++) ids[i] = -1;
    int nq = 0;
    ids[0] = node(b, r);
    eps(b, from, ids[0]);
    queue[nq++] = 0;
    for (int qi = 0; qi < nq && !b->oom && !b->too_big; qi++) {
        int st = queue[qi], i = st / 8, u = st % 8;
        if ((size_t)i == len) {
            eps(b, ids[st], to);
            continue;
        }
        int prev_t = -1, prev_lit = 0, lo = 0;
        for (int c = 0; c <= 256; c++) {
            int t = -1, lit = 0;
            if (c < 256) {
                int u2 = utf8 ? utf8_step(u, c) : 0;
                size_t k = (size_t)i;
                while (k && (unsigned char)end[k] != c) k = (size_t)fail[k - 1];
                if ((unsigned char)end[k] == c) k++;
                lit = k == (size_t)i + 1;
                if (u2 >= 0 && (k < len || u2 == 0)) t = (int)k * 8 + u2;
            }
            if (t != prev_t || lit != prev_lit) {
                if (prev_t >= 0) {
                    if (ids[prev_t] < 0) {
                        ids[prev_t] = node(b, r);
                        queue[nq++] = prev_t;
                    }
                    edge(b, ids[st], ids[prev_t], lo, c - 1, prev_lit);
                }
                prev_t = t;
                prev_lit = lit;
                lo = c;
            }
        }
    }
out:
    free(fail);
    free(ids);
    free(queue);
}

/* Digits a number may have: 15 before the point (integers up to 10^15 are exact doubles), 15
 * after it and 2 in the exponent, so that what is written reads back as a finite double and
 * a weak model cannot spend its tokens on one number. */
#define NUM_INT_DIGITS  15
#define NUM_FRAC_DIGITS 15
#define NUM_EXP_DIGITS  2

/* A chain of 1..n digits from `from`; each digit's node goes on to every node of `ends`. */
static void digits(nb *b, int32_t from, int n, const int32_t *ends, int n_ends, bool first_nonzero,
                   int32_t r) {
    int32_t prev = from;
    for (int k = 0; k < n; k++) {
        int32_t d = node(b, r);
        edge(b, prev, d, k == 0 && first_nonzero ? '1' : '0', '9', false);
        for (int e = 0; e < n_ends; e++) eps(b, d, ends[e]);
        prev = d;
    }
}

static void number_edges(nb *b, int32_t from, int32_t to, bool integer, int32_t r) {
    int32_t n1 = node(b, r), ie = node(b, r);
    edge(b, from, n1, '-', '-', false);
    eps(b, from, n1);
    edge(b, n1, ie, '0', '0', false);
    digits(b, n1, NUM_INT_DIGITS, &ie, 1, true, r);
    eps(b, ie, to);
    if (integer) return;
    int32_t f1 = node(b, r), fe = node(b, r), x1 = node(b, r), x2 = node(b, r);
    edge(b, ie, f1, '.', '.', false);
    digits(b, f1, NUM_FRAC_DIGITS, &fe, 1, false, r);
    eps(b, fe, to);
    edge(b, ie, x1, 'e', 'e', false);
    edge(b, ie, x1, 'E', 'E', false);
    edge(b, fe, x1, 'e', 'e', false);
    edge(b, fe, x1, 'E', 'E', false);
    edge(b, x1, x2, '+', '+', false);
    edge(b, x1, x2, '-', '-', false);
    eps(b, x1, x2);
    digits(b, x2, NUM_EXP_DIGITS, &to, 1, false, r);
}

/* About how many NFA nodes building a makes (saturating). */
static int64_t est(const ast *a) {
    int64_t s = 1;
    switch (a->k) {
    case A_LIT:
        return (int64_t)a->len + 1;
    case A_UNTIL:
        return (int64_t)a->len * 8 + 1;
    case A_STRING:
        return (int64_t)(a->max >= 0 ? a->max : a->min + 1) * CHAR_NODES + 2;
    case A_NUMBER:
        return 2 * (NUM_INT_DIGITS + NUM_FRAC_DIGITS + NUM_EXP_DIGITS) + 10;
    case A_CALL:
        return 2;
    case A_REPEAT: {
        int64_t per = est(a->kids[0]) + (a->n > 1 ? est(a->kids[1]) : 0);
        int64_t copies = a->max >= 0 ? a->max : a->min + 1;
        s = per * (copies ? copies : 1);
        break;
    }
    default:
        for (int i = 0; i < a->n; i++) s += est(a->kids[i]) + (a->keys ? 8 : 0);
    }
    return s > MAX_NFA ? MAX_NFA : s;
}

static void build(nb *b, const ast *a, int32_t from, int32_t to, int32_t r);

/* One item of a repeat: inline, or a call of its rule when the unrolled copies would be
 * too many. */
static void item(nb *b, const ast *a, bool by_call, int32_t from, int32_t to, int32_t r) {
    if (by_call) {
        int32_t rr = rule_of(b, a);
        if (rr >= 0) call(b, from, to, rr, r);
    } else {
        build(b, a, from, to, r);
    }
}

static void repeat_edges(nb *b, const ast *g, const ast *sp, int min, int max, int32_t from,
                         int32_t to, int32_t r) {
    if (max < 0 && min <= 1) {
        int32_t s = node(b, r), m = node(b, r);
        eps(b, from, s);
        build(b, g, s, m, r);
        if (sp)
            build(b, sp, m, s, r);
        else
            eps(b, m, s);
        eps(b, m, to);
        if (!min) eps(b, from, to);
        return;
    }
    int64_t copies = max >= 0 ? max : min + 1;
    bool by_call = copies * (est(g) + (sp ? est(sp) : 0)) > INLINE_LIMIT;
    int32_t cur = from;
    for (int i = 0; i < min && !b->oom && !b->too_big; i++) {
        if (i && sp) {
            int32_t n = node(b, r);
            item(b, sp, by_call, cur, n, r);
            cur = n;
        }
        int32_t n = node(b, r);
        item(b, g, by_call, cur, n, r);
        cur = n;
    }
    if (max < 0) {
        /* min >= 2 here: the rest is a loop of (sep item) */
        int32_t s = node(b, r), n = node(b, r);
        eps(b, cur, s);
        if (sp)
            item(b, sp, by_call, s, n, r);
        else
            eps(b, s, n);
        item(b, g, by_call, n, s, r);
        eps(b, s, to);
        return;
    }
    for (int i = min; i < max && !b->oom && !b->too_big; i++) {
        eps(b, cur, to);
        if (i && sp) {
            int32_t n = node(b, r);
            item(b, sp, by_call, cur, n, r);
            cur = n;
        }
        int32_t n = node(b, r);
        item(b, g, by_call, cur, n, r);
        cur = n;
    }
    eps(b, cur, to);
}

static void string_edges(nb *b, int min, int max, int32_t from, int32_t to, int32_t r) {
    int64_t copies = max >= 0 ? max : min + 1;
    bool by_call = copies > STRING_INLINE_CHARS;
    if (by_call && b->char_rule < 0) b->char_rule = add_prule(b, NULL, NULL);
    int32_t cur = from;
#define ONE_CHAR(f, t)                                                                             \
    do {                                                                                           \
        if (by_call)                                                                               \
            call(b, f, t, b->char_rule, r);                                                        \
        else                                                                                       \
            char_edges(b, f, t, r);                                                                \
    } while (0)
    for (int i = 0; i < min && !b->oom && !b->too_big; i++) {
        int32_t n = node(b, r);
        ONE_CHAR(cur, n);
        cur = n;
    }
    if (max < 0) {
        int32_t s = node(b, r);
        eps(b, cur, s);
        ONE_CHAR(s, s);
        eps(b, s, to);
        return;
    }
    for (int i = min; i < max && !b->oom && !b->too_big; i++) {
        eps(b, cur, to);
        int32_t n = node(b, r);
        ONE_CHAR(cur, n);
        cur = n;
    }
#undef ONE_CHAR
    eps(b, cur, to);
}

/* '{' then the properties in order, each optional one maybe left out, ',' between: nodes
 * a[i] (none written yet) and w[i] (some written) before property i; the value of property i
 * is built once, after its key from either. */
static void object_edges(nb *b, const ast *o, int32_t from, int32_t to, int32_t r) {
    int32_t a = node(b, r), w = node(b, r);
    lit_edges(b, from, a, "{", 1, false, r);
    for (int i = 0; i < o->n && !b->oom && !b->too_big; i++) {
        int32_t a2 = node(b, r), w2 = node(b, r), k1 = node(b, r), k2 = node(b, r), x = node(b, r),
                y = node(b, r);
        const char *key = o->keys[i];
        size_t kl = strlen(key);
        lit_edges(b, a, k1, key, kl, false, r);
        int32_t c = node(b, r);
        lit_edges(b, w, c, ",", 1, false, r);
        int32_t c2 = node(b, r);
        ws_edges(b, c, c2);
        lit_edges(b, c2, k2, key, kl, false, r);
        eps(b, k1, x);
        eps(b, k2, x);
        int32_t colon = node(b, r);
        lit_edges(b, x, colon, ":", 1, false, r);
        ws_edges(b, colon, y);
        build(b, o->kids[i], y, w2, r);
        if (!o->req[i]) {
            eps(b, a, a2);
            eps(b, w, w2);
        }
        a = a2;
        w = w2;
    }
    lit_edges(b, a, to, "}", 1, false, r);
    lit_edges(b, w, to, "}", 1, false, r);
}

static void build(nb *b, const ast *a, int32_t from, int32_t to, int32_t r) {
    if (b->oom || b->too_big) return;
    switch (a->k) {
    case A_EMPTY:
        eps(b, from, to);
        break;
    case A_NONE:
        break;
    case A_LIT:
        if (a->special && a->len) note_lit(b, a->bytes, a->len);
        lit_edges(b, from, to, a->bytes, a->len, a->special, r);
        break;
    case A_SEQ: {
        int32_t cur = from;
        for (int i = 0; i < a->n; i++) {
            int32_t nx = i + 1 == a->n ? to : node(b, r);
            build(b, a->kids[i], cur, nx, r);
            cur = nx;
        }
        if (!a->n) eps(b, from, to);
        break;
    }
    case A_ALT:
        for (int i = 0; i < a->n; i++) build(b, a->kids[i], from, to, r);
        break;
    case A_REPEAT:
        repeat_edges(b, a->kids[0], a->n > 1 ? a->kids[1] : NULL, a->min, a->max, from, to, r);
        break;
    case A_CALL:
        call(b, from, to, a->rule + 1, r);
        break;
    case A_UNTIL:
        if (a->len) note_lit(b, a->bytes, a->len);
        until_edges(b, from, to, a->bytes, a->len, r);
        break;
    case A_STRING:
        string_edges(b, a->min, a->max, from, to, r);
        break;
    case A_NUMBER:
        number_edges(b, from, to, a->integer, r);
        break;
    case A_OBJECT:
        object_edges(b, a, from, to, r);
        break;
    }
}

/* ---- subset construction ------------------------------------------------------------------- */

typedef struct {
    const nb *b;
    int32_t *eo, *bo; /* CSR offsets of eps and byte edges by node */
    int32_t *eto;
    int32_t *bix;             /* byte edge indices by node */
    int32_t *ecls_off, *ecls; /* per byte edge: the classes it covers */
    /* DFA states: NFA sets */
    int32_t *set_off, *set_len;
    int32_t n_st, cap_st;
    int32_t *pool;
    int64_t n_pool, cap_pool;
    int32_t *ht;
    int64_t ht_cap;
    /* scratch */
    int32_t *stack, *mark, stamp;
    int32_t *tmp;
    int32_t n_tmp, cap_tmp;
    bool oom;
} dfa_b;

static uint64_t set_hash(const int32_t *s, int32_t n) {
    uint64_t h = 1469598103934665603ULL;
    for (int32_t i = 0; i < n; i++) {
        h ^= (uint64_t)(uint32_t)s[i];
        h *= 1099511628211ULL;
        h ^= h >> 29;
    }
    return h;
}

static int cmp_i32(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

/* Closes tmp[0..n) over eps edges, sorts it and returns its DFA state (new or old); -1 on
 * failure. */
static int32_t intern_closure(dfa_b *d, int32_t n) {
    d->stamp++;
    int32_t sp = 0;
    for (int32_t i = 0; i < n; i++)
        if (d->mark[d->tmp[i]] != d->stamp) {
            d->mark[d->tmp[i]] = d->stamp;
            d->stack[sp++] = d->tmp[i];
        }
    int32_t cnt = 0;
    while (sp) {
        int32_t u = d->stack[--sp];
        if (cnt >= d->cap_tmp) {
            int32_t *t = grow(d->tmp, &d->cap_tmp, cnt + 1, sizeof *t, &d->oom);
            if (!t) return -1;
            d->tmp = t;
        }
        d->tmp[cnt++] = u;
        for (int32_t e = d->eo[u]; e < d->eo[u + 1]; e++) {
            int32_t v = d->eto[e];
            if (d->mark[v] != d->stamp) {
                d->mark[v] = d->stamp;
                d->stack[sp++] = v;
            }
        }
    }
    qsort(d->tmp, (size_t)cnt, sizeof *d->tmp, cmp_i32);
    uint64_t h = set_hash(d->tmp, cnt);
    int64_t mask = d->ht_cap - 1;
    for (int64_t i = (int64_t)(h & (uint64_t)mask);; i = (i + 1) & mask) {
        int32_t s = d->ht[i];
        if (s < 0) break;
        if (d->set_len[s] == cnt &&
            !memcmp(d->pool + d->set_off[s], d->tmp, (size_t)cnt * sizeof *d->tmp))
            return s;
    }
    if (d->n_st >= MAX_DFA) return -2;
    /* new state */
    if (d->n_pool + cnt > d->cap_pool) {
        int64_t nc = d->cap_pool ? d->cap_pool : 1024;
        while (nc < d->n_pool + cnt) nc *= 2;
        int32_t *p = realloc(d->pool, (size_t)nc * sizeof *p);
        if (!p) {
            d->oom = true;
            return -1;
        }
        d->pool = p;
        d->cap_pool = nc;
    }
    int32_t cap = d->cap_st;
    int32_t *so = grow(d->set_off, &cap, d->n_st + 1, sizeof *so, &d->oom);
    if (so) d->set_off = so;
    cap = d->cap_st;
    int32_t *sl = grow(d->set_len, &cap, d->n_st + 1, sizeof *sl, &d->oom);
    if (sl) d->set_len = sl;
    if (d->oom) return -1;
    d->cap_st = cap;
    memcpy(d->pool + d->n_pool, d->tmp, (size_t)cnt * sizeof *d->tmp);
    int32_t s = d->n_st++;
    d->set_off[s] = (int32_t)d->n_pool;
    d->set_len[s] = cnt;
    d->n_pool += cnt;
    if ((int64_t)d->n_st * 2 > d->ht_cap) {
        int64_t nc = d->ht_cap * 2;
        int32_t *ht = malloc((size_t)nc * sizeof *ht);
        if (!ht) {
            d->oom = true;
            return -1;
        }
        for (int64_t i = 0; i < nc; i++) ht[i] = -1;
        for (int32_t x = 0; x < d->n_st; x++) {
            uint64_t hx = set_hash(d->pool + d->set_off[x], d->set_len[x]);
            int64_t j = (int64_t)(hx & (uint64_t)(nc - 1));
            while (ht[j] >= 0) j = (j + 1) & (nc - 1);
            ht[j] = x;
        }
        free(d->ht);
        d->ht = ht;
        d->ht_cap = nc;
    } else {
        int64_t i = (int64_t)(h & (uint64_t)mask);
        while (d->ht[i] >= 0) i = (i + 1) & mask;
        d->ht[i] = s;
    }
    return s;
}

/* ---- the program ---------------------------------------------------------------------- */

void prog_free(prog *p) {
    if (!p) return;
    free(p->st);
    free(p->trans);
    free(p->calls);
    free(p->lits);
    free(p->rule_start);
    for (int i = 0; i < p->n_lit_text; i++) free(p->lit_text[i]);
    free(p->lit_text);
    free(p->lit_len);
    free(p);
}

static int fail(char *err, size_t len, const char *fmt, ...) {
    if (err && len) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, len, fmt, ap);
        va_end(ap);
    }
    return -1;
}

static void nb_free(nb *b) {
    free(b->nodes);
    free(b->be);
    free(b->ee);
    free(b->r_start);
    free(b->r_end);
    free(b->r_ast);
    free(b->r_name);
    free(b->memo_ast);
    free(b->memo_rule);
    for (int i = 0; i < b->n_lit; i++) free(b->lit_text[i]);
    free(b->lit_text);
    free(b->lit_len);
}

static void dfa_free(dfa_b *d) {
    free(d->eo);
    free(d->bo);
    free(d->eto);
    free(d->bix);
    free(d->ecls_off);
    free(d->ecls);
    free(d->set_off);
    free(d->set_len);
    free(d->pool);
    free(d->ht);
    free(d->stack);
    free(d->mark);
    free(d->tmp);
}

/* Byte classes: bytes no edge tells apart share one. */
static void byte_classes(const nb *b, prog *p) {
    uint8_t *seen = calloc(256 * 256 / 8, 1);
    int16_t cls[256] = {0};
    int K = 1;
    for (int32_t e = 0; e < b->n_be; e++) {
        int lo = b->be[e].lo, hi = b->be[e].hi, key = lo * 256 + hi;
        if (seen) { /* each distinct range splits once */
            if (seen[key / 8] >> (key % 8) & 1) continue;
            seen[key / 8] |= (uint8_t)(1 << (key % 8));
        }
        int16_t remap[512], dense[512];
        for (int i = 0; i < 512; i++) remap[i] = dense[i] = -1;
        for (int c = lo; c <= hi; c++) {
            if (remap[cls[c]] < 0) remap[cls[c]] = (int16_t)K++;
            cls[c] = remap[cls[c]];
        }
        int nk = 0;
        for (int c = 0; c < 256; c++) {
            if (dense[cls[c]] < 0) dense[cls[c]] = (int16_t)nk++;
            cls[c] = dense[cls[c]];
        }
        K = nk;
    }
    for (int c = 0; c < 256; c++) p->cls[c] = (uint8_t)cls[c];
    p->K = K;
    free(seen);
}

static int32_t rule_min(const prog *p, int32_t r) {
    return p->st[p->rule_start[r]].min_end;
}

/* Fewest bytes from each state to its rule's end, to a fixed point (rules call each other). */
static int min_lengths(prog *p) {
    int32_t n = p->n_st, K = p->K;
    if (n <= 0) return -1;
    int32_t *cnt = calloc((size_t)n + 1, sizeof *cnt);
    int32_t *queue = malloc((size_t)n * sizeof *queue);
    uint8_t *inq = malloc((size_t)n);
    if (!cnt || !queue || !inq) {
        free(cnt);
        free(queue);
        free(inq);
        return -1;
    }
    /* reverse dependencies in CSR form */
    int64_t n_dep = 0;
    for (int32_t s = 0; s < n; s++) {
        const gstate *g = &p->st[s];
        if (g->row >= 0)
            for (int c = 0; c < K; c++)
                if (p->trans[g->row + c] >= 0) cnt[p->trans[g->row + c]]++, n_dep++;
        for (int i = 0; i < g->n_call; i++) {
            const gcall *cl = &p->calls[g->call_off + i];
            cnt[cl->ret]++;
            cnt[p->rule_start[cl->rule]]++;
            n_dep += 2;
        }
    }
    int32_t *off = malloc(((size_t)n + 1) * sizeof *off);
    int32_t *dep = malloc((size_t)(n_dep ? n_dep : 1) * sizeof *dep);
    if (!off || !dep) {
        free(cnt);
        free(queue);
        free(inq);
        free(off);
        free(dep);
        return -1;
    }
    off[0] = 0;
    for (int32_t s = 0; s < n; s++) off[s + 1] = off[s] + cnt[s];
    memcpy(cnt, off, (size_t)n * sizeof *cnt);
    for (int32_t s = 0; s < n; s++) {
        const gstate *g = &p->st[s];
        if (g->row >= 0)
            for (int c = 0; c < K; c++)
                if (p->trans[g->row + c] >= 0) dep[cnt[p->trans[g->row + c]]++] = s;
        for (int i = 0; i < g->n_call; i++) {
            const gcall *cl = &p->calls[g->call_off + i];
            dep[cnt[cl->ret]++] = s;
            dep[cnt[p->rule_start[cl->rule]]++] = s;
        }
    }
    int32_t qh = 0, qn = 0;
    for (int32_t s = n; s-- > 0;) {
        p->st[s].min_end = GRAM_INF;
        queue[qn++] = s;
        inq[s] = 1;
    }
    /* a circular queue: every state is in it at most once */
    while (qn) {
        int32_t s = queue[qh];
        qh = (qh + 1) % n;
        qn--;
        inq[s] = 0;
        const gstate *g = &p->st[s];
        int32_t v = g->final ? 0 : GRAM_INF;
        if (g->row >= 0)
            for (int c = 0; c < K; c++) {
                int32_t t = p->trans[g->row + c];
                if (t >= 0 && p->st[t].min_end + 1 < v) v = p->st[t].min_end + 1;
            }
        for (int i = 0; i < g->n_call; i++) {
            const gcall *cl = &p->calls[g->call_off + i];
            int32_t x = rule_min(p, cl->rule) + p->st[cl->ret].min_end;
            if (x < v) v = x;
        }
        if (v > GRAM_INF) v = GRAM_INF;
        if (v < p->st[s].min_end) {
            p->st[s].min_end = v;
            for (int32_t j = off[s]; j < off[s + 1]; j++)
                if (!inq[dep[j]]) {
                    inq[dep[j]] = 1;
                    queue[(qh + qn) % n] = dep[j];
                    qn++;
                }
        }
    }
    free(cnt);
    free(queue);
    free(inq);
    free(off);
    free(dep);
    return 0;
}

/* next_char: from (state, UTF-8 decoder state) every plain character's rest ends in one
 * state; memo of the pairs seen while checking one state. */
typedef struct {
    int32_t st, u, res;
} nc_memo;

static int32_t char_end(const prog *p, int32_t s, int u, nc_memo *memo, int *n_memo) {
    for (int i = 0; i < *n_memo; i++)
        if (memo[i].st == s && memo[i].u == u) return memo[i].res;
    if (*n_memo >= 64) return -1;
    int slot = (*n_memo)++;
    memo[slot] = (nc_memo){s, u, -1}; /* -1 while open: a loop inside a character fails */
    const gstate *g = &p->st[s];
    if (!g->simple) return -1;
    int32_t res = -2;
    for (int c = 0; c < 256; c++) {
        int u2 = utf8_step(u, c);
        if (u2 < 0 || (u == 0 && (c < 0x20 || c == '"' || c == '\\'))) continue;
        int32_t t = p->trans[g->row + p->cls[c]];
        if (t < 0 || !p->st[t].simple) return memo[slot].res = -1;
        int32_t e = u2 ? char_end(p, t, u2, memo, n_memo) : t;
        if (e < 0 || (res != -2 && e != res)) return memo[slot].res = -1;
        res = e;
    }
    return memo[slot].res = res < 0 ? -1 : res;
}

static void next_chars(prog *p) {
    int ca = p->cls['a'], cs = p->cls[' '];
    nc_memo memo[64];
    for (int32_t s = 0; s < p->n_st; s++) {
        gstate *g = &p->st[s];
        g->next_char = -1;
        g->plain_dead = 1;
        for (int c = 0x20; c < 0xF5 && g->row >= 0 && g->plain_dead; c++)
            if (c != '"' && c != '\\' && (c < 0x80 || c >= 0xC2) &&
                p->trans[g->row + p->cls[c]] >= 0)
                g->plain_dead = 0;
        /* string content reads at least these; most states are ruled out here */
        if (!g->simple || p->trans[g->row + ca] < 0 || p->trans[g->row + cs] < 0) continue;
        int n = 0;
        g->next_char = char_end(p, s, 0, memo, &n);
    }
}

/* A rule that calls itself before any byte would make the matcher loop: find one. */
static int32_t left_recursive(const prog *p) {
    int32_t nr = p->n_rules, n = p->n_st;
    /* edges r -> callee, by a walk over states reachable without bytes */
    int32_t *mark = malloc((size_t)n * sizeof *mark), *stack = malloc((size_t)n * sizeof *stack);
    int32_t *eoff = calloc((size_t)nr + 1, sizeof *eoff);
    int32_t *edges = NULL, n_e = 0, cap_e = 0;
    int32_t *color = calloc((size_t)nr, sizeof *color), *rs = malloc((size_t)nr * sizeof *rs),
            *ri = malloc((size_t)nr * sizeof *ri);
    int32_t found = -2;
    bool oom = false;
    if (!mark || !stack || !eoff || !color || !rs || !ri) goto out;
    for (int32_t i = 0; i < n; i++) mark[i] = -1;
    for (int32_t r = 0; r < nr; r++) {
        eoff[r] = n_e;
        int32_t sp = 0;
        stack[sp++] = p->rule_start[r];
        mark[p->rule_start[r]] = r;
        while (sp) {
            const gstate *g = &p->st[stack[--sp]];
            for (int i = 0; i < g->n_call; i++) {
                const gcall *cl = &p->calls[g->call_off + i];
                int32_t *e = grow(edges, &cap_e, n_e + 1, sizeof *e, &oom);
                if (!e) goto out;
                edges = e;
                edges[n_e++] = cl->rule;
                if (rule_min(p, cl->rule) == 0 && mark[cl->ret] != r) {
                    mark[cl->ret] = r;
                    stack[sp++] = cl->ret;
                }
            }
        }
    }
    eoff[nr] = n_e;
    /* iterative depth-first search for a cycle */
    found = -1;
    for (int32_t r0 = 0; r0 < nr && found < 0; r0++) {
        if (color[r0]) continue;
        int32_t sp = 0;
        rs[sp] = r0;
        ri[sp++] = eoff[r0];
        color[r0] = 1;
        while (sp && found < 0) {
            int32_t r = rs[sp - 1];
            if (ri[sp - 1] < eoff[r + 1]) {
                int32_t c = edges[ri[sp - 1]++];
                if (color[c] == 1) {
                    found = c;
                } else if (!color[c]) {
                    color[c] = 1;
                    rs[sp] = c;
                    ri[sp++] = eoff[c];
                }
            } else {
                color[r] = 2;
                sp--;
            }
        }
    }
out:
    free(mark);
    free(stack);
    free(eoff);
    free(edges);
    free(color);
    free(rs);
    free(ri);
    return found;
}

int gram_compile(gram *g, char *err, size_t err_len) {
    nb b = {.char_rule = -1};
    dfa_b d = {.b = &b};
    prog *p = calloc(1, sizeof *p);
    int rc = -1;
    int32_t *bucket = NULL, *bucket_n = NULL, *bucket_off = NULL, *touched = NULL;
    int32_t *lbucket = NULL, *lbucket_n = NULL;
    gcall *calls = NULL;
    glit *lits = NULL;
    int32_t n_calls = 0, cap_calls = 0, n_lits = 0, cap_lits = 0, n_rows = 0, cap_rows = 0;
    int32_t cap_states = 0;
    if (!p) goto oom;
    /* rules: the root, the gram's, then the ones building makes */
    add_prule(&b, g->root, "#");
    for (int i = 0; i < g->n_rules; i++)
        add_prule(&b, g->rules[i], g->rule_names ? g->rule_names[i] : NULL);
    for (int32_t r = 0; r < b.n_rules && !b.oom && !b.too_big; r++) {
        b.r_start[r] = node(&b, r);
        b.r_end[r] = node(&b, r);
        if (b.r_ast[r])
            build(&b, b.r_ast[r], b.r_start[r], b.r_end[r], r);
        else
            char_edges(&b, b.r_start[r], b.r_end[r], r);
    }
    if (b.oom) goto oom;
    if (b.too_big) {
        fail(err, err_len, "the grammar is too large (over %d automaton nodes)", MAX_NFA);
        goto out;
    }
    byte_classes(&b, p);
    int K = p->K;
    /* adjacency */
    int32_t nn = b.n_nodes;
    d.eo = calloc((size_t)nn + 1, sizeof *d.eo);
    d.bo = calloc((size_t)nn + 1, sizeof *d.bo);
    d.eto = malloc((size_t)(b.n_ee ? b.n_ee : 1) * sizeof *d.eto);
    d.bix = malloc((size_t)(b.n_be ? b.n_be : 1) * sizeof *d.bix);
    d.ecls_off = malloc(((size_t)b.n_be + 1) * sizeof *d.ecls_off);
    d.stack = malloc((size_t)nn * sizeof *d.stack);
    d.mark = calloc((size_t)nn, sizeof *d.mark);
    d.ht_cap = 1024;
    d.ht = malloc((size_t)d.ht_cap * sizeof *d.ht);
    if (!d.eo || !d.bo || !d.eto || !d.bix || !d.ecls_off || !d.stack || !d.mark || !d.ht) goto oom;
    for (int64_t i = 0; i < d.ht_cap; i++) d.ht[i] = -1;
    for (int32_t e = 0; e < b.n_ee; e++) d.eo[b.ee[e].from + 1]++;
    for (int32_t e = 0; e < b.n_be; e++) d.bo[b.be[e].from + 1]++;
    for (int32_t i = 0; i < nn; i++) {
        d.eo[i + 1] += d.eo[i];
        d.bo[i + 1] += d.bo[i];
    }
    {
        int32_t *fe = malloc((size_t)nn * sizeof *fe), *fb = malloc((size_t)nn * sizeof *fb);
        if (!fe || !fb) {
            free(fe);
            free(fb);
            goto oom;
        }
        memcpy(fe, d.eo, (size_t)nn * sizeof *fe);
        memcpy(fb, d.bo, (size_t)nn * sizeof *fb);
        for (int32_t e = 0; e < b.n_ee; e++) d.eto[fe[b.ee[e].from]++] = b.ee[e].to;
        for (int32_t e = 0; e < b.n_be; e++) d.bix[fb[b.be[e].from]++] = e;
        free(fe);
        free(fb);
    }
    /* classes per byte edge */
    {
        int64_t total = 0;
        uint8_t seen[256];
        for (int32_t e = 0; e < b.n_be; e++) {
            memset(seen, 0, (size_t)K);
            d.ecls_off[e] = (int32_t)total;
            for (int c = b.be[e].lo; c <= b.be[e].hi; c++)
                if (!seen[p->cls[c]]) seen[p->cls[c]] = 1, total++;
        }
        d.ecls_off[b.n_be] = (int32_t)total;
        d.ecls = malloc((size_t)(total ? total : 1) * sizeof *d.ecls);
        if (!d.ecls) goto oom;
        int64_t k = 0;
        for (int32_t e = 0; e < b.n_be; e++) {
            memset(seen, 0, (size_t)K);
            for (int c = b.be[e].lo; c <= b.be[e].hi; c++)
                if (!seen[p->cls[c]]) seen[p->cls[c]] = 1, d.ecls[k++] = p->cls[c];
        }
    }
    bucket_n = calloc((size_t)K, sizeof *bucket_n);
    lbucket_n = calloc((size_t)K, sizeof *lbucket_n);
    bucket_off = malloc((size_t)K * sizeof *bucket_off);
    touched = malloc((size_t)K * sizeof *touched);
    if (!bucket_n || !lbucket_n || !bucket_off || !touched) goto oom;
    /* rule starts */
    p->n_rules = b.n_rules;
    p->rule_start = malloc((size_t)b.n_rules * sizeof *p->rule_start);
    if (!p->rule_start) goto oom;
    for (int32_t r = 0; r < b.n_rules; r++) {
        d.tmp = grow(d.tmp, &d.cap_tmp, 1, sizeof *d.tmp, &d.oom);
        if (!d.tmp) goto oom;
        d.tmp[0] = b.r_start[r];
        int32_t s = intern_closure(&d, 1);
        if (s < 0) goto dfa_fail;
        p->rule_start[r] = s;
    }
    /* the states, in order of discovery */
    for (int32_t s = 0; s < d.n_st; s++) {
        if (s >= cap_states) {
            int32_t cap = cap_states;
            gstate *st = grow(p->st, &cap, s + 1, sizeof *st, &d.oom);
            if (!st) goto oom;
            p->st = st;
            cap_states = cap;
        }
        gstate *gs = &p->st[s];
        memset(gs, 0, sizeof *gs);
        gs->row = -1;
        int32_t so = d.set_off[s], sl = d.set_len[s];
        int32_t rule = b.nodes[d.pool[so]].rule;
        gs->rule = rule;
        /* final */
        for (int32_t i = 0; i < sl; i++)
            if (d.pool[so + i] == b.r_end[rule]) gs->final = 1;
        /* calls, grouped by callee */
        gs->call_off = n_calls;
        for (int32_t i = 0; i < sl; i++) {
            int32_t u = d.pool[so + i];
            int32_t callee = b.nodes[u].call_rule;
            if (callee < 0) continue;
            bool done = false;
            for (int32_t j = 0; j < i; j++)
                if (b.nodes[d.pool[so + j]].call_rule == callee) done = true;
            if (done) continue;
            int32_t cnt = 0;
            for (int32_t j = i; j < sl; j++) {
                int32_t v = d.pool[d.set_off[s] + j];
                if (b.nodes[v].call_rule != callee) continue;
                d.tmp = grow(d.tmp, &d.cap_tmp, cnt + 1, sizeof *d.tmp, &d.oom);
                if (!d.tmp) goto oom;
                d.tmp[cnt++] = b.nodes[v].call_next;
            }
            int32_t ret = intern_closure(&d, cnt);
            if (ret < 0) goto dfa_fail;
            gcall *cl = grow(calls, &cap_calls, n_calls + 1, sizeof *cl, &d.oom);
            if (!cl) goto oom;
            calls = cl;
            calls[n_calls++] = (gcall){callee, ret};
            so = d.set_off[s]; /* the pool may have moved */
        }
        gs = &p->st[s];
        gs->n_call = (uint16_t)(n_calls - gs->call_off);
        if (n_calls - gs->call_off > 65535) {
            fail(err, err_len, "the grammar is too large (a state calls too many rules)");
            goto out;
        }
        /* byte transitions: targets per class, then their closures */
        int32_t n_touched = 0, total = 0, ltotal = 0;
        for (int32_t i = 0; i < sl; i++) {
            int32_t u = d.pool[so + i];
            for (int32_t k = d.bo[u]; k < d.bo[u + 1]; k++) {
                const bedge *e = &b.be[d.bix[k]];
                for (int32_t x = d.ecls_off[d.bix[k]]; x < d.ecls_off[d.bix[k] + 1]; x++) {
                    int32_t c = d.ecls[x];
                    if (!bucket_n[c] && !lbucket_n[c]) touched[n_touched++] = c;
                    bucket_n[c]++;
                    total++;
                    if (e->lit) lbucket_n[c]++, ltotal++;
                }
            }
        }
        if (n_touched) {
            /* fill flat buckets: full targets then literal-only targets per class */
            int32_t *tb = realloc(bucket, (size_t)(total + ltotal + 1) * sizeof *tb);
            if (!tb) goto oom;
            bucket = tb;
            lbucket = bucket + total;
            int32_t acc = 0, lacc = 0;
            int32_t *loff = malloc((size_t)K * sizeof *loff);
            if (!loff) goto oom;
            for (int32_t t = 0; t < n_touched; t++) {
                int32_t c = touched[t];
                bucket_off[c] = acc;
                loff[c] = lacc;
                acc += bucket_n[c];
                lacc += lbucket_n[c];
                bucket_n[c] = lbucket_n[c] = 0;
            }
            for (int32_t i = 0; i < sl; i++) {
                int32_t u = d.pool[so + i];
                for (int32_t k = d.bo[u]; k < d.bo[u + 1]; k++) {
                    const bedge *e = &b.be[d.bix[k]];
                    for (int32_t x = d.ecls_off[d.bix[k]]; x < d.ecls_off[d.bix[k] + 1]; x++) {
                        int32_t c = d.ecls[x];
                        bucket[bucket_off[c] + bucket_n[c]++] = e->to;
                        if (e->lit) lbucket[loff[c] + lbucket_n[c]++] = e->to;
                    }
                }
            }
            int32_t row = n_rows * K;
            int32_t cap = cap_rows;
            int32_t *tr = grow(p->trans, &cap, row + K, sizeof *tr, &d.oom);
            if (!tr) {
                free(loff);
                goto oom;
            }
            p->trans = tr;
            cap_rows = cap;
            n_rows++;
            for (int c = 0; c < K; c++) p->trans[row + c] = -1;
            int32_t lit_off = n_lits;
            for (int32_t t = 0; t < n_touched && !d.oom; t++) {
                int32_t c = touched[t];
                if (bucket_n[c]) {
                    d.tmp = grow(d.tmp, &d.cap_tmp, bucket_n[c], sizeof *d.tmp, &d.oom);
                    if (!d.tmp) break;
                    memcpy(d.tmp, bucket + bucket_off[c], (size_t)bucket_n[c] * sizeof *d.tmp);
                    int32_t to = intern_closure(&d, bucket_n[c]);
                    if (to < 0) {
                        free(loff);
                        goto dfa_fail;
                    }
                    p->trans[row + c] = to;
                }
                if (lbucket_n[c]) {
                    d.tmp = grow(d.tmp, &d.cap_tmp, lbucket_n[c], sizeof *d.tmp, &d.oom);
                    if (!d.tmp) break;
                    memcpy(d.tmp, lbucket + loff[c], (size_t)lbucket_n[c] * sizeof *d.tmp);
                    int32_t to = intern_closure(&d, lbucket_n[c]);
                    if (to < 0) {
                        free(loff);
                        goto dfa_fail;
                    }
                    glit *gl = grow(lits, &cap_lits, n_lits + 1, sizeof *gl, &d.oom);
                    if (!gl) break;
                    lits = gl;
                    lits[n_lits++] = (glit){c, to};
                }
                bucket_n[c] = lbucket_n[c] = 0;
            }
            free(loff);
            if (d.oom) goto oom;
            gs = &p->st[s];
            gs->row = row;
            gs->lit_off = lit_off;
            gs->n_lit = (uint16_t)(n_lits - lit_off);
        }
    }
    p->n_st = d.n_st;
    p->calls = calls;
    p->lits = lits;
    calls = NULL;
    lits = NULL;
    p->start = p->rule_start[0];
    for (int32_t s = 0; s < p->n_st; s++) {
        gstate *gs = &p->st[s];
        gs->simple = gs->row >= 0 && !gs->n_call && !gs->final;
        gs->pure_final = gs->final && gs->row < 0 && !gs->n_call;
    }
    if (min_lengths(p)) goto oom;
    next_chars(p);
    int32_t lr = left_recursive(p);
    if (lr == -2) goto oom;
    if (lr >= 0) {
        const char *nm = lr < b.n_rules && b.r_name[lr] ? b.r_name[lr] : "a rule";
        fail(err, err_len, "'$ref' cycle at %s: it refers to itself before any text", nm);
        goto out;
    }
    if (rule_min(p, 0) >= GRAM_INF) {
        fail(err, err_len, "the schema cannot be satisfied by any finite document");
        goto out;
    }
    /* texts special tokens may stand in */
    p->lit_text = b.lit_text;
    p->lit_len = b.lit_len;
    p->n_lit_text = b.n_lit;
    b.lit_text = NULL;
    b.lit_len = NULL;
    b.n_lit = 0;
    g->p = p;
    p = NULL;
    rc = 0;
    goto out;
dfa_fail:
    if (!d.oom) {
        fail(err, err_len, "the grammar is too large (over %d automaton states)", MAX_DFA);
        goto out;
    }
oom:
    fail(err, err_len, "out of memory");
out:
    free(bucket);
    free(bucket_n);
    free(lbucket_n);
    free(bucket_off);
    free(touched);
    free(calls);
    free(lits);
    prog_free(p);
    dfa_free(&d);
    nb_free(&b);
    return rc;
}
