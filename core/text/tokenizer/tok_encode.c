/* Encoding: added tokens, normalizers, pre-tokenizers, the BPE model (merges by rank through a
 * priority queue) with a per-piece cache, and the post-processor. The steps and their order
 * follow Hugging Face tokenizers so that ids match it exactly. */
#include "tok_internal.h"

#include <stdlib.h>
#include <string.h>

#include <utf8proc.h>

/* ---- byte-level alphabet (GPT-2's bytes_to_unicode) ---- */

char tok_bytelevel_utf8[256][3];
uint8_t tok_bytelevel_len[256];
static int16_t bytelevel_rev[0x144];
static pthread_once_t bytelevel_once = PTHREAD_ONCE_INIT;

static void bytelevel_build(void) {
    /* printable bytes stand for themselves; the others take 256, 257, ... in byte order */
    for (size_t i = 0; i < sizeof bytelevel_rev / sizeof *bytelevel_rev; i++) bytelevel_rev[i] = -1;
    uint32_t next = 256;
    for (int b = 0; b < 256; b++) {
        bool keep = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
        uint32_t cp = keep ? (uint32_t)b : next++;
        tok_bytelevel_len[b] = (uint8_t)utf8_encode(cp, tok_bytelevel_utf8[b]);
        bytelevel_rev[cp] = (int16_t)b;
    }
}

void tok_bytelevel_init(void) {
    pthread_once(&bytelevel_once, bytelevel_build);
}

int tok_bytelevel_byte(uint32_t cp) {
    return cp < sizeof bytelevel_rev / sizeof *bytelevel_rev ? bytelevel_rev[cp] : -1;
}

/* ---- per-call state (nothing here is shared between threads) ---- */

typedef struct {
    size_t off, len;
    bool origin; /* starts at offset 0 of the original text (Metaspace "first") */
} piece;

typedef struct {
    tok_sbuf buf;
    piece *p;
    size_t n, cap;
} plist;

typedef struct {
    size_t start, end;
    bool match;
} seg;

typedef struct {
    uint64_t key; /* rank << 32 | position: the smallest rank, then the leftmost, pops first */
    int32_t merged;
    uint32_t ver; /* version of the pair at position when pushed: stale once it changed */
} heap_ent;

typedef struct {
    int32_t *id, *prev, *next;
    uint32_t *ver;
    size_t cap;
    heap_ent *heap;
    size_t hn, hcap;
} bpe_scratch;

typedef struct {
    const tok_tokenizer *t;
    pcre2_match_data *md;
    pcre2_match_context *mctx;
    pcre2_jit_stack *jit;
    seg *segs;
    size_t nseg, segcap;
    plist pa, pb;
    tok_sbuf tmp, norm, norm2;
    bpe_scratch bs;
} enc_ctx;

static int plist_add(plist *l, const char *s, size_t n, bool origin) {
    if (!n) return 0; /* empty pieces are dropped, as tokenizers does after every split */
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 64;
        piece *p = realloc(l->p, cap * sizeof *p);
        if (!p) return -1;
        l->p = p;
        l->cap = cap;
    }
    size_t off = l->buf.n;
    if (sbuf_put(&l->buf, s, n)) return -1;
    l->p[l->n++] = (piece){off, n, origin};
    return 0;
}

static void plist_clear(plist *l) {
    l->n = 0;
    l->buf.n = 0;
}

static void plist_free(plist *l) {
    sbuf_free(&l->buf);
    free(l->p);
}

static int seg_push(enc_ctx *c, size_t start, size_t end, bool match) {
    if (c->nseg == c->segcap) {
        size_t cap = c->segcap ? c->segcap * 2 : 64;
        seg *s = realloc(c->segs, cap * sizeof *s);
        if (!s) return -1;
        c->segs = s;
        c->segcap = cap;
    }
    c->segs[c->nseg++] = (seg){start, end, match};
    return 0;
}

static void scratch_free(bpe_scratch *b);

static void ctx_free(enc_ctx *c) {
    if (c->md) pcre2_match_data_free(c->md);
    if (c->mctx) pcre2_match_context_free(c->mctx);
    if (c->jit) pcre2_jit_stack_free(c->jit);
    free(c->segs);
    plist_free(&c->pa);
    plist_free(&c->pb);
    sbuf_free(&c->tmp);
    sbuf_free(&c->norm);
    sbuf_free(&c->norm2);
    scratch_free(&c->bs);
}

/* Contexts are pooled per tokenizer so that encoding many short texts does not allocate and
 * free the scratch buffers every time; a context is used by one call at a time. */
static enc_ctx *ctx_acquire(const tok_tokenizer *t) {
    tok_tokenizer *m = (tok_tokenizer *)t; /* only the pool is touched, under its lock */
    enc_ctx *c = NULL;
    pthread_mutex_lock(&m->pool_mu);
    if (m->n_pool) c = m->pool[--m->n_pool];
    pthread_mutex_unlock(&m->pool_mu);
    if (!c) c = calloc(1, sizeof *c);
    if (c) c->t = t;
    return c;
}

static void ctx_release(enc_ctx *c) {
    tok_tokenizer *m = (tok_tokenizer *)c->t;
    /* don't keep the buffers of a huge input around */
    if (c->pa.buf.cap > (1u << 20) || c->pb.buf.cap > (1u << 20) || c->norm.cap > (1u << 20) ||
        c->norm2.cap > (1u << 20) || c->segcap > (1u << 16) || c->bs.cap > (1u << 16)) {
        ctx_free(c);
        memset(c, 0, sizeof *c);
    }
    pthread_mutex_lock(&m->pool_mu);
    if (m->n_pool < sizeof m->pool / sizeof *m->pool) {
        m->pool[m->n_pool++] = c;
        c = NULL;
    }
    pthread_mutex_unlock(&m->pool_mu);
    if (c) {
        ctx_free(c);
        free(c);
    }
}

void tok_ctx_pool_free(tok_tokenizer *t) {
    for (size_t i = 0; i < t->n_pool; i++) {
        ctx_free(t->pool[i]);
        free(t->pool[i]);
    }
    t->n_pool = 0;
}

/* ---- regex matching ---- */

/* One pcre2_match; grows the JIT stack or falls back to the interpreter when the JIT runs out
 * of stack, so that long inputs degrade gracefully instead of failing. */
static int match_at(enc_ctx *c, const pcre2_code *re, const char *s, size_t n, size_t off,
                    uint32_t opts) {
    if (!c->md && !(c->md = pcre2_match_data_create(1, NULL))) return PCRE2_ERROR_NOMEMORY;
    int rc = pcre2_match(re, (PCRE2_SPTR)s, n, off, opts | PCRE2_NO_UTF_CHECK, c->md, c->mctx);
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT && !c->jit) {
        if (!c->mctx) c->mctx = pcre2_match_context_create(NULL);
        c->jit = pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, NULL);
        if (c->mctx && c->jit) {
            pcre2_jit_stack_assign(c->mctx, NULL, c->jit);
            rc = pcre2_match(re, (PCRE2_SPTR)s, n, off, opts | PCRE2_NO_UTF_CHECK, c->md, c->mctx);
        }
    }
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT)
        rc = pcre2_match(re, (PCRE2_SPTR)s, n, off, opts | PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, c->md,
                         c->mctx);
    return rc;
}

static size_t char_len_at(const char *s, size_t n, size_t off) {
    size_t k = off + 1;
    while (k < n && ((unsigned char)s[k] & 0xC0) == 0x80) k++;
    return k - off;
}

/* Appends every match of re in s to c->segs as alternating unmatched/matched segments.
 * A matcher failure (resource limits) leaves the rest of s unmatched. */
static int regex_segments(enc_ctx *c, const pcre2_code *re, const char *s, size_t n) {
    size_t off = 0, prev = 0;
    uint32_t opts = 0;
    while (off <= n) {
        int rc = match_at(c, re, s, n, off, opts);
        if (rc == PCRE2_ERROR_NOMEMORY) return -1;
        if (rc == PCRE2_ERROR_NOMATCH && opts) {
            /* after an empty match: move on by one character */
            if (off >= n) break;
            off += char_len_at(s, n, off);
            opts = 0;
            continue;
        }
        if (rc < 0) break;
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(c->md);
        size_t ms = ov[0], me = ov[1];
        if (ms < prev || me < ms || me > n) break;
        if (ms > prev && seg_push(c, prev, ms, false)) return -1;
        if (seg_push(c, ms, me, true)) return -1;
        prev = me;
        off = me;
        opts = ms == me ? PCRE2_NOTEMPTY_ATSTART | PCRE2_ANCHORED : 0;
    }
    if (prev < n && seg_push(c, prev, n, false)) return -1;
    return 0;
}

static int literal_segments(enc_ctx *c, const char *pat, size_t pn, const char *s, size_t n) {
    size_t prev = 0, off = 0;
    if (pn) {
        while (off + pn <= n) {
            const char *f = tok_memmem(s + off, n - off, pat, pn);
            if (!f) break;
            size_t ms = (size_t)(f - s);
            if (ms > prev && seg_push(c, prev, ms, false)) return -1;
            if (seg_push(c, ms, ms + pn, true)) return -1;
            prev = off = ms + pn;
        }
    }
    if (prev < n && seg_push(c, prev, n, false)) return -1;
    return 0;
}

/* Each character satisfying pred is a match of its own. */
static int char_segments(enc_ctx *c, bool (*pred)(uint32_t), const char *s, size_t n) {
    size_t prev = 0, i = 0;
    while (i < n) {
        size_t k;
        uint32_t cp = utf8_decode(s + i, &k);
        if (pred(cp)) {
            if (i > prev && seg_push(c, prev, i, false)) return -1;
            if (seg_push(c, i, i + k, true)) return -1;
            prev = i + k;
        }
        i += k;
    }
    if (prev < n && seg_push(c, prev, n, false)) return -1;
    return 0;
}

static int pattern_segments(enc_ctx *c, const tok_pattern *p, const char *s, size_t n) {
    return p->is_regex ? regex_segments(c, p->re, s, n)
                       : literal_segments(c, p->lit, p->lit_len, s, n);
}

/* Turns c->segs of one piece into pieces of out, per SplitDelimiterBehavior. */
static int apply_behavior(enc_ctx *c, int behavior, bool invert, const char *s, bool origin,
                          plist *out) {
    seg *g = c->segs;
    size_t n = c->nseg;
    if (invert)
        for (size_t i = 0; i < n; i++) g[i].match = !g[i].match;
    /* Merge in place, then emit; see NormalizedString::split. */
    size_t k = 0;
    bool prev_match = false;
    switch (behavior) {
    case B_REMOVED:
        for (size_t i = 0; i < n; i++)
            if (!g[i].match) g[k++] = g[i];
        break;
    case B_ISOLATED:
        k = n;
        break;
    case B_MERGED_PREV:
        for (size_t i = 0; i < n; i++) {
            if (g[i].match && !prev_match && k > 0)
                g[k - 1].end = g[i].end;
            else
                g[k++] = g[i];
            prev_match = g[i].match;
        }
        break;
    case B_MERGED_NEXT: {
        /* walk backwards: a match joins the piece that follows it */
        size_t w = n;
        for (size_t i = n; i-- > 0;) {
            if (g[i].match && !prev_match && w < n)
                g[w].start = g[i].start;
            else
                g[--w] = g[i];
            prev_match = g[i].match;
        }
        memmove(g, g + w, (n - w) * sizeof *g);
        k = n - w;
        break;
    }
    case B_CONTIGUOUS:
        for (size_t i = 0; i < n; i++) {
            if (k > 0 && g[i].match == prev_match)
                g[k - 1].end = g[i].end;
            else
                g[k++] = g[i];
            prev_match = g[i].match;
        }
        break;
    }
    for (size_t i = 0; i < k; i++)
        if (plist_add(out, s + g[i].start, g[i].end - g[i].start, origin && g[i].start == 0))
            return -1;
    return 0;
}

/* ---- normalizers ---- */

static int norm_unicode_run(int type, const char *s, size_t n, tok_sbuf *out) {
    if (!n) return 0;
    utf8proc_option_t o = UTF8PROC_STABLE;
    if (type == NORM_NFC || type == NORM_NFKC)
        o |= UTF8PROC_COMPOSE;
    else
        o |= UTF8PROC_DECOMPOSE;
    if (type == NORM_NFKC || type == NORM_NFKD) o |= UTF8PROC_COMPAT;
    utf8proc_uint8_t *r = NULL;
    utf8proc_ssize_t k = utf8proc_map((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)n, &r, o);
    if (k < 0) return sbuf_put(out, s, n); /* only on OOM: the input is valid UTF-8 */
    int rc = sbuf_put(out, r, (size_t)k);
    free(r);
    return rc;
}

/* Unicode normalization, with ASCII stretches copied through: an ASCII character followed by
 * another ASCII character (or the end) can neither compose nor reorder with its neighbours, so
 * splitting before it leaves the result unchanged. Only the stretches around non-ASCII text go
 * through utf8proc. */
static int norm_unicode(int type, const char *s, size_t n, tok_sbuf *out) {
    size_t i = 0;
    while (i < n) {
        size_t j = i;
        while (j < n && (unsigned char)s[j] < 0x80) j++;
        if (j == n) return sbuf_put(out, s + i, n - i);
        size_t start = j > i ? j - 1 : j; /* the ASCII char before may compose with what follows */
        size_t k = j;
        while (k < n &&
               !((unsigned char)s[k] < 0x80 && (k + 1 == n || (unsigned char)s[k + 1] < 0x80)))
            k++;
        if (sbuf_put(out, s + i, start - i)) return -1;
        /* within the stretch, characters unknown to tokenizers' tables pass through as is */
        size_t run = start;
        for (size_t p = j; p < k;) {
            size_t cl;
            uint32_t cp = utf8_decode(s + p, &cl);
            if (cp >= 0x7FD && tok_norm_inert(cp)) {
                if (norm_unicode_run(type, s + run, p - run, out) || sbuf_put(out, s + p, cl))
                    return -1;
                run = p + cl;
            }
            p += cl;
        }
        if (norm_unicode_run(type, s + run, k - run, out)) return -1;
        i = k;
    }
    return 0;
}

static int norm_one(enc_ctx *c, const tok_norm *nm, const char *s, size_t n, tok_sbuf *out) {
    out->n = 0;
    switch (nm->type) {
    case NORM_NFC:
    case NORM_NFD:
    case NORM_NFKC:
    case NORM_NFKD:
        return norm_unicode(nm->type, s, n, out);
    case NORM_LOWER:
        for (size_t i = 0; i < n;) {
            size_t k;
            uint32_t cp = utf8_decode(s + i, &k);
            char b[8];
            if (cp == 0x130) { /* full lowercase mapping of İ is two characters */
                if (sbuf_put(out, "i\xCC\x87", 3)) return -1;
            } else {
                size_t m = utf8_encode((uint32_t)utf8proc_tolower((utf8proc_int32_t)cp), b);
                if (sbuf_put(out, b, m)) return -1;
            }
            i += k;
        }
        return 0;
    case NORM_STRIP_ACCENTS:
        for (size_t i = 0; i < n;) {
            size_t k;
            uint32_t cp = utf8_decode(s + i, &k);
            /* tokenizers drops every combining mark (Mn, Mc, Me) */
            utf8proc_category_t cat = utf8proc_category((utf8proc_int32_t)cp);
            if (cat != UTF8PROC_CATEGORY_MN && cat != UTF8PROC_CATEGORY_MC &&
                cat != UTF8PROC_CATEGORY_ME && sbuf_put(out, s + i, k))
                return -1;
            i += k;
        }
        return 0;
    case NORM_STRIP: {
        size_t a = 0, b = n;
        while (nm->left && a < b) {
            size_t k;
            if (!uni_is_whitespace(utf8_decode(s + a, &k))) break;
            a += k;
        }
        while (nm->right && b > a) {
            size_t p = b - 1, k;
            while (p > a && ((unsigned char)s[p] & 0xC0) == 0x80) p--;
            if (!uni_is_whitespace(utf8_decode(s + p, &k))) break;
            b = p;
        }
        return sbuf_put(out, s + a, b - a);
    }
    case NORM_PREPEND:
        if (n && sbuf_put(out, nm->content, nm->content_len)) return -1;
        return sbuf_put(out, s, n);
    case NORM_REPLACE: {
        c->nseg = 0;
        if (pattern_segments(c, &nm->pat, s, n)) return -1;
        for (size_t i = 0; i < c->nseg; i++) {
            seg *g = &c->segs[i];
            if (g->match ? sbuf_put(out, nm->content, nm->content_len)
                         : sbuf_put(out, s + g->start, g->end - g->start))
                return -1;
        }
        return sbuf_put(out, "", 0);
    }
    }
    return sbuf_put(out, s, n);
}

/* Runs a normalizer tree; the result is in *res (which points at one of the context buffers
 * or at s itself). */
static int normalize(enc_ctx *c, const tok_norm *nm, const char *s, size_t n, const char **res,
                     size_t *rn) {
    if (nm->type != NORM_SEQ) {
        tok_sbuf *dst = (s == c->norm.p) ? &c->norm2 : &c->norm;
        if (norm_one(c, nm, s, n, dst)) return -1;
        *res = dst->p ? dst->p : "";
        *rn = dst->n;
        return 0;
    }
    *res = s;
    *rn = n;
    for (size_t i = 0; i < nm->n_kids; i++)
        if (normalize(c, nm->kids[i], *res, *rn, res, rn)) return -1;
    return 0;
}

int tok_normalize(const tok_tokenizer *t, const char *s, size_t n, tok_sbuf *out) {
    enc_ctx c;
    memset(&c, 0, sizeof c);
    c.t = t;
    out->n = 0;
    const char *r = s;
    size_t rn = n;
    int rc = t->norm ? normalize(&c, t->norm, s, n, &r, &rn) : 0;
    if (!rc) rc = sbuf_put(out, r, rn);
    ctx_free(&c);
    return rc;
}

/* ---- pre-tokenizers ---- */

static int bytelevel_map(const char *s, size_t n, tok_sbuf *out) {
    if (sbuf_reserve(out, n * 2)) return -1;
    for (size_t i = 0; i < n; i++) {
        unsigned char b = (unsigned char)s[i];
        memcpy(out->p + out->n, tok_bytelevel_utf8[b], tok_bytelevel_len[b]);
        out->n += tok_bytelevel_len[b];
    }
    out->p[out->n] = '\0';
    return 0;
}

static int pretok_leaf(enc_ctx *c, const tok_pretok *p, plist *in, plist *out) {
    for (size_t i = 0; i < in->n; i++) {
        const char *s = in->buf.p + in->p[i].off;
        size_t n = in->p[i].len;
        bool origin = in->p[i].origin;
        c->nseg = 0;
        switch (p->type) {
        case PRE_SPLIT:
            if (pattern_segments(c, &p->pat, s, n) ||
                apply_behavior(c, p->behavior, p->invert, s, origin, out))
                return -1;
            break;
        case PRE_DIGITS:
            if (char_segments(c, uni_is_numeric, s, n) ||
                apply_behavior(c, p->individual_digits ? B_ISOLATED : B_CONTIGUOUS, false, s,
                               origin, out))
                return -1;
            break;
        case PRE_WHITESPACE:
            if (regex_segments(c, p->pat.re, s, n) ||
                apply_behavior(c, B_REMOVED, true, s, origin, out))
                return -1;
            break;
        case PRE_WSSPLIT:
            if (char_segments(c, uni_is_whitespace, s, n) ||
                apply_behavior(c, B_REMOVED, false, s, origin, out))
                return -1;
            break;
        case PRE_PUNCT:
            if (char_segments(c, uni_is_punct, s, n) ||
                apply_behavior(c, p->behavior, false, s, origin, out))
                return -1;
            break;
        case PRE_METASPACE: {
            tok_sbuf *b = &c->tmp;
            b->n = 0;
            bool add = p->prepend_scheme == PREPEND_ALWAYS ||
                       (p->prepend_scheme == PREPEND_FIRST && origin);
            /* prepend unless the text, spaces already replaced, starts with the replacement */
            if (add && s[0] != ' ' && !(n >= p->rep_len && memcmp(s, p->rep, p->rep_len) == 0) &&
                sbuf_put(b, p->rep, p->rep_len))
                return -1;
            for (size_t j = 0; j < n; j++)
                if (s[j] == ' ' ? sbuf_put(b, p->rep, p->rep_len) : sbuf_putc(b, s[j])) return -1;
            if (!p->split) {
                if (plist_add(out, b->p, b->n, origin)) return -1;
                break;
            }
            if (literal_segments(c, p->rep, p->rep_len, b->p, b->n) ||
                apply_behavior(c, B_MERGED_NEXT, false, b->p, origin, out))
                return -1;
            break;
        }
        case PRE_BYTELEVEL: {
            tok_sbuf *b = &c->tmp;
            b->n = 0;
            if (p->add_prefix_space && s[0] != ' ' && sbuf_putc(b, ' ')) return -1;
            if (sbuf_put(b, s, n)) return -1;
            if (p->use_regex) {
                if (regex_segments(c, p->pat.re, b->p, b->n)) return -1;
            } else {
                if (seg_push(c, 0, b->n, false)) return -1;
            }
            tok_sbuf m = {0};
            for (size_t j = 0; j < c->nseg; j++) {
                seg *g = &c->segs[j];
                m.n = 0;
                if (bytelevel_map(b->p + g->start, g->end - g->start, &m) ||
                    plist_add(out, m.p, m.n, origin && g->start == 0)) {
                    sbuf_free(&m);
                    return -1;
                }
            }
            sbuf_free(&m);
            break;
        }
        }
    }
    return 0;
}

static void pretok_flatten(const tok_pretok *p, const tok_pretok **leaves, size_t *n) {
    if (p->type != PRE_SEQ) {
        if (*n < 64) leaves[(*n)++] = p;
        return;
    }
    for (size_t i = 0; i < p->n_kids; i++) pretok_flatten(p->kids[i], leaves, n);
}

/* ---- BPE ---- */

static void heap_push(bpe_scratch *b, heap_ent e) {
    size_t i = b->hn++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (b->heap[p].key <= e.key) break;
        b->heap[i] = b->heap[p];
        i = p;
    }
    b->heap[i] = e;
}

static heap_ent heap_pop(bpe_scratch *b) {
    heap_ent top = b->heap[0], last = b->heap[--b->hn];
    size_t i = 0, n = b->hn;
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        uint64_t mk = last.key;
        if (l < n && b->heap[l].key < mk) m = l, mk = b->heap[l].key;
        if (r < n && b->heap[r].key < mk) m = r;
        if (m == i) break;
        b->heap[i] = b->heap[m];
        i = m;
    }
    if (n) b->heap[i] = last;
    return top;
}

static int scratch_reserve(bpe_scratch *b, size_t n) {
    /* every merge pushes at most two entries, so 3n bounds the heap */
    if (n <= b->cap) return 0;
    size_t cap = b->cap ? b->cap : 64;
    while (cap < n) cap *= 2;
    int32_t *id = realloc(b->id, cap * sizeof *id);
    if (id) b->id = id;
    int32_t *pv = realloc(b->prev, cap * sizeof *pv);
    if (pv) b->prev = pv;
    int32_t *nx = realloc(b->next, cap * sizeof *nx);
    if (nx) b->next = nx;
    uint32_t *ver = realloc(b->ver, cap * sizeof *ver);
    if (ver) b->ver = ver;
    heap_ent *h = realloc(b->heap, 3 * cap * sizeof *h);
    if (h) b->heap = h;
    if (!id || !pv || !nx || !ver || !h) return -1;
    b->cap = cap;
    b->hcap = 3 * cap;
    return 0;
}

static void scratch_free(bpe_scratch *b) {
    free(b->id);
    free(b->prev);
    free(b->next);
    free(b->ver);
    free(b->heap);
}

static inline void push_pair(const tok_u64map *merges, bpe_scratch *b, int32_t pos) {
    int32_t l = b->id[pos], r = b->id[b->next[pos]];
    uint64_t v;
    if (u64map_get(merges, (uint64_t)(uint32_t)l << 32 | (uint32_t)r, &v))
        heap_push(b,
                  (heap_ent){(v >> 32) << 32 | (uint32_t)pos, (int32_t)(uint32_t)v, b->ver[pos]});
}

/* Merges b->id[0..n) by merge rank: pop the best pair (lowest rank, then leftmost), skip it if
 * stale (a version counter per position changes whenever the pair starting there changes),
 * merge, push the two new neighbouring pairs. O(n log n). */
static size_t bpe_merge_scratch(const tok_u64map *merges, bpe_scratch *b, size_t n) {
    b->hn = 0;
    for (size_t i = 0; i < n; i++) {
        b->prev[i] = (int32_t)i - 1;
        b->next[i] = i + 1 < n ? (int32_t)i + 1 : -1;
        b->ver[i] = 0;
    }
    for (size_t i = 0; i + 1 < n; i++) push_pair(merges, b, (int32_t)i);
    while (b->hn) {
        heap_ent e = heap_pop(b);
        int32_t pos = (int32_t)(uint32_t)e.key;
        if (b->ver[pos] != e.ver) continue; /* stale */
        int32_t nx = b->next[pos], pv = b->prev[pos];
        b->id[pos] = e.merged;
        b->id[nx] = -1;
        b->ver[pos]++;
        b->ver[nx]++;
        if (pv >= 0) b->ver[pv]++; /* its right neighbour changed */
        b->next[pos] = b->next[nx];
        if (b->next[nx] >= 0) b->prev[b->next[nx]] = pos;
        if (pv >= 0) push_pair(merges, b, pv);
        if (b->next[pos] >= 0) push_pair(merges, b, pos);
    }
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (b->id[i] >= 0) b->id[k++] = b->id[i];
    return k;
}

size_t tok_bpe_merge(const tok_u64map *merges, int32_t *syms, size_t n) {
    bpe_scratch b;
    memset(&b, 0, sizeof b);
    size_t k = (size_t)-1;
    if (!scratch_reserve(&b, n ? n : 1)) {
        if (n) memcpy(b.id, syms, n * sizeof *syms);
        k = bpe_merge_scratch(merges, &b, n);
        if (k) memcpy(syms, b.id, k * sizeof *syms);
    }
    scratch_free(&b);
    return k;
}

/* ---- piece cache ---- */

static bool cache_get(const tok_tokenizer *t, uint64_t h, const char *s, size_t n, tok_ivec *out,
                      int *rc) {
    tok_cache_shard *sh = (tok_cache_shard *)&t->cache[h >> 60];
    bool hit = false;
    *rc = 0;
    pthread_mutex_lock(&sh->mu);
    if (sh->slots) {
        size_t j = h & (sh->cap - 1);
        while (sh->slots[j].h) {
            tok_cache_slot *e = &sh->slots[j];
            if (e->h == h && e->klen == n && memcmp(sh->data + e->off, s, n) == 0) {
                int32_t tmp[64];
                size_t ioff = (e->off + e->klen + 3) & ~(size_t)3;
                if (e->nids <= 64) {
                    memcpy(tmp, sh->data + ioff, e->nids * sizeof(int32_t));
                    *rc = ivec_append(out, tmp, e->nids);
                } else {
                    *rc = -1;
                }
                hit = *rc == 0;
                break;
            }
            j = (j + 1) & (sh->cap - 1);
        }
    }
    pthread_mutex_unlock(&sh->mu);
    if (*rc) *rc = 0, hit = false; /* recompute instead */
    return hit;
}

/* Grows a shard's index; returns false when out of memory. */
static bool cache_grow(tok_cache_shard *sh, size_t cap) {
    tok_cache_slot *ns = calloc(cap, sizeof *ns);
    if (!ns) return false;
    for (size_t i = 0; i < sh->cap; i++) {
        if (!sh->slots[i].h) continue;
        size_t j = sh->slots[i].h & (cap - 1);
        while (ns[j].h) j = (j + 1) & (cap - 1);
        ns[j] = sh->slots[i];
    }
    free(sh->slots);
    sh->slots = ns;
    sh->cap = cap;
    return true;
}

static void cache_put(const tok_tokenizer *t, uint64_t h, const char *s, size_t n,
                      const int32_t *ids, size_t nids) {
    if (nids > 64) return;
    tok_cache_shard *sh = (tok_cache_shard *)&t->cache[h >> 60];
    /* shards start small and grow to 8192 slots / 1 MB of keys and ids, then start over */
    const size_t MAX_CAP = 8192, MAX_DATA = 1u << 20;
    size_t need = ((n + 3) & ~(size_t)3) + nids * sizeof(int32_t) + 4;
    pthread_mutex_lock(&sh->mu);
    if (!sh->slots && !cache_grow(sh, 64)) goto out;
    if (sh->n * 2 >= sh->cap && (sh->cap >= MAX_CAP || !cache_grow(sh, sh->cap * 2))) {
        memset(sh->slots, 0, sh->cap * sizeof *sh->slots);
        sh->n = 0;
        sh->dlen = 0;
    }
    if (sh->dlen + need > sh->dcap) {
        size_t dcap = sh->dcap ? sh->dcap : 4096;
        while (dcap < sh->dlen + need && dcap < MAX_DATA) dcap *= 2;
        char *nd = dcap >= sh->dlen + need ? realloc(sh->data, dcap) : NULL;
        if (nd) {
            sh->data = nd;
            sh->dcap = dcap;
        } else {
            /* full (or no memory): start over */
            memset(sh->slots, 0, sh->cap * sizeof *sh->slots);
            sh->n = 0;
            sh->dlen = 0;
            if (need > sh->dcap) goto out;
        }
    }
    size_t j = h & (sh->cap - 1);
    while (sh->slots[j].h) {
        tok_cache_slot *e = &sh->slots[j];
        if (e->h == h && e->klen == n && memcmp(sh->data + e->off, s, n) == 0) goto out;
        j = (j + 1) & (sh->cap - 1);
    }
    size_t off = sh->dlen, ioff = (off + n + 3) & ~(size_t)3;
    memcpy(sh->data + off, s, n);
    memcpy(sh->data + ioff, ids, nids * sizeof *ids);
    sh->dlen = ioff + nids * sizeof *ids;
    sh->slots[j] = (tok_cache_slot){h, (uint32_t)off, (uint32_t)n, (uint32_t)nids};
    sh->n++;
out:
    pthread_mutex_unlock(&sh->mu);
}

/* Id of one character of a word (with the continuing-subword prefix / end-of-word suffix). */
static int32_t char_id(enc_ctx *c, const char *ch, size_t k, bool first, bool last) {
    const tok_bpe *m = &c->t->bpe;
    if (m->bmp_ids && k <= 3) {
        size_t dl;
        return m->bmp_ids[utf8_decode(ch, &dl)];
    }
    if (!m->prefix && !m->suffix) return strmap_get(&m->vocab, ch, k);
    tok_sbuf *b = &c->tmp;
    b->n = 0;
    if ((!first && m->prefix && sbuf_put(b, m->prefix, m->prefix_len)) || sbuf_put(b, ch, k) ||
        (last && m->suffix && sbuf_put(b, m->suffix, m->suffix_len)))
        return -2;
    return strmap_get(&m->vocab, b->p, b->n);
}

static int bpe_word(enc_ctx *c, const char *s, size_t n, tok_ivec *out) {
    const tok_tokenizer *t = c->t;
    const tok_bpe *m = &t->bpe;
    if (!n) return 0;
    if (m->ignore_merges) {
        int32_t id = strmap_get(&m->vocab, s, n);
        if (id >= 0) return ivec_push(out, id);
    }
    uint64_t h = 0;
    bool cacheable = n <= TOK_CACHE_MAX_KEY;
    if (cacheable) {
        int rc;
        h = tok_hash(s, n);
        if (cache_get(t, h, s, n, out, &rc)) return 0;
    }
    bpe_scratch *b = &c->bs;
    /* a symbol per byte at most, except that byte fallback spells out the continuing-subword
     * prefix and end-of-word suffix too (grown below when that happens) */
    if (scratch_reserve(b, n + 8)) return -1;
    size_t k = 0;
    int32_t unk = -1; /* pending (possibly fused) unknown */
    for (size_t i = 0; i < n;) {
        size_t cl = char_len_at(s, n, i);
        bool first = i == 0, last = i + cl >= n;
        int32_t id = char_id(c, s + i, cl, first, last);
        if (id == -2) return -1;
        if (id >= 0) {
            if (unk >= 0) b->id[k++] = unk, unk = -1;
            b->id[k++] = id;
            i += cl;
            continue;
        }
        if (m->byte_fallback) {
            /* the bytes of the character as <0xXX> tokens, all or nothing */
            const char *bs = s + i;
            size_t bl = cl;
            if (m->prefix || m->suffix) {
                tok_sbuf *tb = &c->tmp;
                tb->n = 0;
                if ((!first && m->prefix && sbuf_put(tb, m->prefix, m->prefix_len)) ||
                    sbuf_put(tb, s + i, cl) ||
                    (last && m->suffix && sbuf_put(tb, m->suffix, m->suffix_len)))
                    return -1;
                bs = tb->p;
                bl = tb->n;
                if (scratch_reserve(b, k + bl + (n - i) + 8)) return -1;
            }
            bool ok = true;
            for (size_t j = 0; j < bl; j++)
                if (m->byte_ids[(unsigned char)bs[j]] < 0) ok = false;
            if (ok) {
                for (size_t j = 0; j < bl; j++) b->id[k++] = m->byte_ids[(unsigned char)bs[j]];
                i += cl;
                continue;
            }
        }
        if (m->unk_id >= 0) {
            if (unk >= 0 && !m->fuse_unk) b->id[k++] = unk;
            unk = m->unk_id;
        }
        i += cl;
    }
    if (unk >= 0) b->id[k++] = unk;
    k = bpe_merge_scratch(&m->merges, b, k);
    if (ivec_append(out, b->id, k)) return -1;
    if (cacheable) cache_put(t, h, s, n, b->id, k);
    return 0;
}

/* ---- added tokens ---- */

typedef struct {
    size_t start, end;
    int32_t id; /* -1: text */
} tseg;

typedef struct {
    tseg *v;
    size_t n, cap;
} tsegs;

static int tseg_push(tsegs *l, size_t start, size_t end, int32_t id) {
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 16;
        tseg *v = realloc(l->v, cap * sizeof *v);
        if (!v) return -1;
        l->v = v;
        l->cap = cap;
    }
    l->v[l->n++] = (tseg){start, end, id};
    return 0;
}

static size_t prev_char(const char *s, size_t i) {
    while (i > 0 && ((unsigned char)s[--i] & 0xC0) == 0x80) {
    }
    return i;
}

/* Splits s on added tokens (leftmost-longest, as tokenizers' Aho-Corasick does), honouring
 * single_word, lstrip and rstrip. */
static int split_added(const tok_tokenizer *t, const tok_trie *tr, const char *s, size_t n,
                       tsegs *out) {
    size_t start_off = 0, i = 0;
    if (!tr->empty) {
        while (i < n) {
            unsigned char c0 = (unsigned char)s[i];
            if (!(tr->first[c0 >> 3] & (1u << (c0 & 7)))) {
                i++;
                continue;
            }
            uint64_t node = 0, child;
            int32_t best = -1;
            size_t best_end = 0;
            for (size_t j = i; j < n; j++) {
                if (!u64map_get(&tr->edges, node << 8 | (unsigned char)s[j], &child)) break;
                node = child;
                if (tr->term[node] >= 0) best = tr->term[node], best_end = j + 1;
            }
            if (best < 0) {
                i++;
                continue;
            }
            const tok_added *a = &t->added[best];
            size_t start = i, stop = best_end, k;
            i = best_end;
            if (a->single_word) {
                bool before = start > 0 && uni_is_word(utf8_decode(s + prev_char(s, start), &k));
                bool after = stop < n && uni_is_word(utf8_decode(s + stop, &k));
                if (before || after) continue;
            }
            if (a->lstrip) {
                while (start > start_off) {
                    size_t p = prev_char(s, start);
                    if (!uni_is_whitespace(utf8_decode(s + p, &k))) break;
                    start = p;
                }
            }
            if (a->rstrip) {
                while (stop < n && uni_is_whitespace(utf8_decode(s + stop, &k))) stop += k;
                i = stop;
            }
            if (start_off < start && tseg_push(out, start_off, start, -1)) return -1;
            if (tseg_push(out, start, stop, a->id)) return -1;
            start_off = stop;
        }
    }
    if (start_off < n && tseg_push(out, start_off, n, -1)) return -1;
    return 0;
}

/* Pre-tokenizes one text piece and runs the model on each resulting piece. */
static int encode_text(enc_ctx *c, const char *s, size_t n, bool origin, tok_ivec *out) {
    const tok_tokenizer *t = c->t;
    if (!t->pre) return bpe_word(c, s, n, out);
    const tok_pretok *leaves[64];
    size_t nl = 0;
    pretok_flatten(t->pre, leaves, &nl);
    plist *in = &c->pa, *o = &c->pb;
    plist_clear(in);
    if (plist_add(in, s, n, origin)) return -1;
    for (size_t i = 0; i < nl; i++) {
        plist_clear(o);
        if (pretok_leaf(c, leaves[i], in, o)) return -1;
        plist *x = in;
        in = o;
        o = x;
    }
    for (size_t i = 0; i < in->n; i++)
        if (bpe_word(c, in->buf.p + in->p[i].off, in->p[i].len, out)) return -1;
    return 0;
}

static int encode_raw(enc_ctx *c, const char *s, size_t n, tok_ivec *out) {
    const tok_tokenizer *t = c->t;
    tsegs raw = {0}, nrm = {0};
    int rc = -1;
    if (split_added(t, &t->trie_raw, s, n, &raw)) goto out;
    for (size_t i = 0; i < raw.n; i++) {
        tseg *g = &raw.v[i];
        if (g->id >= 0) {
            if (ivec_push(out, g->id)) goto out;
            continue;
        }
        const char *ns = s + g->start;
        size_t nn = g->end - g->start;
        if (t->norm) {
            if (normalize(c, t->norm, ns, nn, &ns, &nn)) goto out;
        }
        nrm.n = 0;
        if (split_added(t, &t->trie_norm, ns, nn, &nrm)) goto out;
        for (size_t j = 0; j < nrm.n; j++) {
            tseg *h = &nrm.v[j];
            if (h->id >= 0) {
                if (ivec_push(out, h->id)) goto out;
            } else if (encode_text(c, ns + h->start, h->end - h->start,
                                   g->start == 0 && h->start == 0, out)) {
                goto out;
            }
        }
    }
    rc = 0;
out:
    free(raw.v);
    free(nrm.v);
    return rc;
}

int tok_encode(const tok_tokenizer *t, const char *text, size_t len, bool add_special,
               int32_t **ids, size_t *n_ids) {
    *ids = NULL;
    *n_ids = 0;
    if (!text) len = 0;
    enc_ctx *c = ctx_acquire(t);
    if (!c) return -1;
    tok_sbuf clean = {0};
    tok_ivec body = {0}, res = {0};
    int rc = -1;
    if (len && !utf8_is_valid(text, len)) {
        if (utf8_append_lossy(&clean, text, len)) goto out;
        text = clean.p;
        len = clean.n;
    }
    if (len && encode_raw(c, text, len, &body)) goto out;
    if (add_special && t->post) {
        for (size_t i = 0; i < t->n_post; i++) {
            const tok_post_item *it = &t->post[i];
            if (it->is_seq ? ivec_append(&res, body.v, body.n) : ivec_append(&res, it->ids, it->n))
                goto out;
        }
        ivec_free(&body);
        body = res;
        res = (tok_ivec){0};
    }
    *ids = body.v;
    *n_ids = body.n;
    body = (tok_ivec){0};
    rc = 0;
out:
    ivec_free(&body);
    ivec_free(&res);
    sbuf_free(&clean);
    ctx_release(c);
    return rc;
}

/* ---- small accessors ---- */

const char *tok_token_to_piece(const tok_tokenizer *t, int32_t id, size_t *len) {
    if (id < 0 || (size_t)id >= t->n_ids || !t->id_str[id]) return NULL;
    if (len) *len = t->id_len[id];
    return t->id_str[id];
}

int32_t tok_piece_to_token(const tok_tokenizer *t, const char *piece, size_t len) {
    int32_t id = strmap_get(&t->added_map, piece, len);
    return id >= 0 ? id : strmap_get(&t->bpe.vocab, piece, len);
}

size_t tok_vocab_size(const tok_tokenizer *t) {
    return t->n_ids;
}

int32_t tok_bos_id(const tok_tokenizer *t) {
    return t->bos_id;
}

size_t tok_eos_ids(const tok_tokenizer *t, const int32_t **ids) {
    *ids = t->n_eos ? t->eos : NULL;
    return t->n_eos;
}

bool tok_is_eos(const tok_tokenizer *t, int32_t id) {
    for (size_t i = 0; i < t->n_eos; i++)
        if (t->eos[i] == id) return true;
    return false;
}

bool tok_is_special(const tok_tokenizer *t, int32_t id) {
    return id >= 0 && (size_t)id < t->n_ids && (t->id_flags[id] & TOKF_SPECIAL);
}

bool tok_cleanup_spaces_default(const tok_tokenizer *t) {
    return t->cleanup;
}
