/* Internal helpers of the tokenizer: buffers, arena, hash maps, UTF-8. */
#include "tok_util.h"

#include <stdlib.h>
#include <string.h>

#include <utf8proc.h>

/* ---- buffers ---- */

int sbuf_reserve(tok_sbuf *b, size_t extra) {
    if (extra > SIZE_MAX / 2 - b->n) return -1;
    size_t need = b->n + extra + 1; /* room for a NUL so callers can terminate */
    if (need <= b->cap) return 0;
    size_t cap = b->cap ? b->cap : 64;
    while (cap < need) cap *= 2;
    char *p = realloc(b->p, cap);
    if (!p) return -1;
    b->p = p;
    b->cap = cap;
    return 0;
}

int sbuf_put(tok_sbuf *b, const void *s, size_t n) {
    if (sbuf_reserve(b, n)) return -1;
    if (n) memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = '\0';
    return 0;
}

int sbuf_putc(tok_sbuf *b, char c) {
    return sbuf_put(b, &c, 1);
}

void sbuf_free(tok_sbuf *b) {
    free(b->p);
    b->p = NULL;
    b->n = b->cap = 0;
}

int ivec_push(tok_ivec *v, int32_t x) {
    return ivec_append(v, &x, 1);
}

int ivec_append(tok_ivec *v, const int32_t *x, size_t n) {
    if (n > SIZE_MAX / 8 - v->n) return -1;
    if (v->n + n > v->cap) {
        size_t cap = v->cap ? v->cap : 16;
        while (cap < v->n + n) cap *= 2;
        int32_t *p = realloc(v->v, cap * sizeof *p);
        if (!p) return -1;
        v->v = p;
        v->cap = cap;
    }
    if (n) memcpy(v->v + v->n, x, n * sizeof *x);
    v->n += n;
    return 0;
}

void ivec_free(tok_ivec *v) {
    free(v->v);
    v->v = NULL;
    v->n = v->cap = 0;
}

/* ---- arena ---- */

struct tok_arena_blk {
    tok_arena_blk *next;
    size_t used, cap;
    char data[];
};

char *arena_strdup(tok_arena *a, const char *s, size_t n) {
    tok_arena_blk *b = a->head;
    if (n >= SIZE_MAX / 2) return NULL;
    if (!b || b->cap - b->used < n + 1) {
        /* blocks grow from 4 KB to 1 MB: small tokenizers stay small */
        size_t cap = b ? (b->cap < (1u << 20) ? b->cap * 2 : b->cap) : 4096;
        if (cap < n + 1) cap = n + 1;
        b = malloc(sizeof *b + cap);
        if (!b) return NULL;
        b->used = 0;
        b->cap = cap;
        b->next = a->head;
        a->head = b;
    }
    char *p = b->data + b->used;
    if (n) memcpy(p, s, n);
    p[n] = '\0';
    b->used += n + 1;
    return p;
}

void arena_free(tok_arena *a) {
    tok_arena_blk *b = a->head;
    while (b) {
        tok_arena_blk *n = b->next;
        free(b);
        b = n;
    }
    a->head = NULL;
}

const char *tok_memmem(const char *hay, size_t hn, const char *needle, size_t nn) {
    if (!nn || nn > hn) return NULL;
    const char *end = hay + hn - nn + 1;
    for (const char *p = hay; p < end;) {
        p = memchr(p, needle[0], (size_t)(end - p));
        if (!p) return NULL;
        if (memcmp(p, needle, nn) == 0) return p;
        p++;
    }
    return NULL;
}

/* ---- hashing: 8 bytes at a time with a multiply-xorshift mix ---- */

static inline uint64_t mix64(uint64_t x) {
    x ^= x >> 32;
    x *= 0xd6e8feb86659fd93ULL;
    x ^= x >> 32;
    x *= 0xd6e8feb86659fd93ULL;
    x ^= x >> 32;
    return x;
}

uint64_t tok_hash(const void *data, size_t n) {
    const unsigned char *p = data;
    uint64_t h = 0x9e3779b97f4a7c15ULL ^ (n * 0xff51afd7ed558ccdULL);
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        h = (h ^ mix64(w)) * 0x9fb21c651e98df25ULL;
        p += 8;
        n -= 8;
    }
    uint64_t w = 0;
    for (size_t i = 0; i < n; i++) w |= (uint64_t)p[i] << (8 * i);
    h = mix64(h ^ w ^ 0x5bd1e995);
    return h ? h : 1; /* 0 marks empty slots */
}

/* ---- string map ---- */

static size_t pow2_at_least(size_t x) {
    size_t c = 16;
    while (c < x) c *= 2;
    return c;
}

int strmap_init(tok_strmap *m, size_t expected) {
    m->cap = pow2_at_least(expected * 2 + 1);
    m->n = 0;
    m->slots = calloc(m->cap, sizeof *m->slots);
    return m->slots ? 0 : -1;
}

static int strmap_grow(tok_strmap *m) {
    size_t cap = m->cap * 2;
    tok_strmap_slot *s = calloc(cap, sizeof *s);
    if (!s) return -1;
    for (size_t i = 0; i < m->cap; i++) {
        tok_strmap_slot *o = &m->slots[i];
        if (!o->h) continue;
        size_t j = o->h & (cap - 1);
        while (s[j].h) j = (j + 1) & (cap - 1);
        s[j] = *o;
    }
    free(m->slots);
    m->slots = s;
    m->cap = cap;
    return 0;
}

int strmap_put(tok_strmap *m, const char *key, size_t len, int32_t val) {
    if (!m->slots && strmap_init(m, 16)) return -1;
    if ((m->n + 1) * 2 > m->cap && strmap_grow(m)) return -1;
    uint64_t h = tok_hash(key, len);
    size_t j = h & (m->cap - 1);
    while (m->slots[j].h) {
        tok_strmap_slot *s = &m->slots[j];
        if (s->h == h && s->len == len && memcmp(s->key, key, len) == 0) {
            s->val = val;
            return 0;
        }
        j = (j + 1) & (m->cap - 1);
    }
    m->slots[j] = (tok_strmap_slot){h, key, (uint32_t)len, val};
    m->n++;
    return 0;
}

int32_t strmap_get(const tok_strmap *m, const char *key, size_t len) {
    if (!m->slots) return -1;
    uint64_t h = tok_hash(key, len);
    size_t j = h & (m->cap - 1);
    while (m->slots[j].h) {
        const tok_strmap_slot *s = &m->slots[j];
        if (s->h == h && s->len == len && memcmp(s->key, key, len) == 0) return s->val;
        j = (j + 1) & (m->cap - 1);
    }
    return -1;
}

void strmap_free(tok_strmap *m) {
    free(m->slots);
    m->slots = NULL;
    m->cap = m->n = 0;
}

/* ---- u64 map ---- */

#define U64_EMPTY UINT64_MAX

int u64map_init(tok_u64map *m, size_t expected) {
    m->cap = pow2_at_least(expected * 2 + 1);
    m->n = 0;
    m->slots = malloc(m->cap * sizeof *m->slots);
    if (!m->slots) return -1;
    for (size_t i = 0; i < m->cap; i++) m->slots[i].key = U64_EMPTY;
    return 0;
}

static int u64map_grow(tok_u64map *m) {
    size_t cap = m->cap * 2;
    tok_u64map_slot *s = malloc(cap * sizeof *s);
    if (!s) return -1;
    for (size_t i = 0; i < cap; i++) s[i].key = U64_EMPTY;
    for (size_t i = 0; i < m->cap; i++) {
        if (m->slots[i].key == U64_EMPTY) continue;
        size_t j = mix64(m->slots[i].key) & (cap - 1);
        while (s[j].key != U64_EMPTY) j = (j + 1) & (cap - 1);
        s[j] = m->slots[i];
    }
    free(m->slots);
    m->slots = s;
    m->cap = cap;
    return 0;
}

int u64map_put(tok_u64map *m, uint64_t key, uint64_t val) {
    if (key == U64_EMPTY) return -1;
    if (!m->slots && u64map_init(m, 16)) return -1;
    if ((m->n + 1) * 2 > m->cap && u64map_grow(m)) return -1;
    size_t j = mix64(key) & (m->cap - 1);
    while (m->slots[j].key != U64_EMPTY) {
        if (m->slots[j].key == key) {
            m->slots[j].val = val;
            return 0;
        }
        j = (j + 1) & (m->cap - 1);
    }
    m->slots[j].key = key;
    m->slots[j].val = val;
    m->n++;
    return 0;
}

bool u64map_get(const tok_u64map *m, uint64_t key, uint64_t *val) {
    if (!m->slots || key == U64_EMPTY) return false;
    size_t j = mix64(key) & (m->cap - 1);
    while (m->slots[j].key != U64_EMPTY) {
        if (m->slots[j].key == key) {
            *val = m->slots[j].val;
            return true;
        }
        j = (j + 1) & (m->cap - 1);
    }
    return false;
}

void u64map_free(tok_u64map *m) {
    free(m->slots);
    m->slots = NULL;
    m->cap = m->n = 0;
}

/* ---- UTF-8 (Unicode table 3-7 well-formed byte sequences) ---- */

/* Total length implied by the lead byte (0: not a lead) and the allowed second-byte range. */
static int lead_info(unsigned char c, unsigned char *lo, unsigned char *hi) {
    *lo = 0x80;
    *hi = 0xBF;
    if (c < 0x80) return 1;
    if (c < 0xC2) return 0;
    if (c < 0xE0) return 2;
    if (c < 0xF0) {
        if (c == 0xE0) *lo = 0xA0;
        if (c == 0xED) *hi = 0x9F;
        return 3;
    }
    if (c < 0xF5) {
        if (c == 0xF0) *lo = 0x90;
        if (c == 0xF4) *hi = 0x8F;
        return 4;
    }
    return 0;
}

/* Number of bytes at s that form a prefix of a well-formed sequence; *need gets the full length
 * (0 for an invalid lead byte). */
static size_t prefix_len(const unsigned char *s, size_t n, int *need) {
    unsigned char lo, hi;
    *need = lead_info(s[0], &lo, &hi);
    if (*need <= 1) return 1;
    size_t k = 1;
    if (k < n && s[k] >= lo && s[k] <= hi) {
        k++;
        while (k < (size_t)*need && k < n && s[k] >= 0x80 && s[k] <= 0xBF) k++;
    }
    return k;
}

size_t utf8_valid_len(const unsigned char *s, size_t n) {
    if (!n) return 0;
    if (s[0] < 0x80) return 1;
    int need;
    size_t k = prefix_len(s, n, &need);
    return (need > 1 && k == (size_t)need) ? k : 0;
}

bool utf8_is_valid(const char *s, size_t n) {
    const unsigned char *p = (const unsigned char *)s;
    size_t i = 0;
    while (i < n) {
        if (p[i] < 0x80) {
            i++;
            continue;
        }
        size_t k = utf8_valid_len(p + i, n - i);
        if (!k) return false;
        i += k;
    }
    return true;
}

uint32_t utf8_decode(const char *s, size_t *len) {
    const unsigned char *p = (const unsigned char *)s;
    if (p[0] < 0x80) {
        *len = 1;
        return p[0];
    }
    if (p[0] < 0xE0) {
        *len = 2;
        return ((uint32_t)(p[0] & 0x1F) << 6) | (p[1] & 0x3F);
    }
    if (p[0] < 0xF0) {
        *len = 3;
        return ((uint32_t)(p[0] & 0x0F) << 12) | ((uint32_t)(p[1] & 0x3F) << 6) | (p[2] & 0x3F);
    }
    *len = 4;
    return ((uint32_t)(p[0] & 0x07) << 18) | ((uint32_t)(p[1] & 0x3F) << 12) |
           ((uint32_t)(p[2] & 0x3F) << 6) | (p[3] & 0x3F);
}

size_t utf8_encode(uint32_t cp, char *out) {
    unsigned char *o = (unsigned char *)out;
    if (cp < 0x80) {
        o[0] = (unsigned char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (unsigned char)(0xC0 | (cp >> 6));
        o[1] = (unsigned char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (unsigned char)(0xE0 | (cp >> 12));
        o[1] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
        o[2] = (unsigned char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (unsigned char)(0xF0 | (cp >> 18));
    o[1] = (unsigned char)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
    o[3] = (unsigned char)(0x80 | (cp & 0x3F));
    return 4;
}

int utf8_append_lossy(tok_sbuf *b, const char *s, size_t n) {
    const unsigned char *p = (const unsigned char *)s;
    size_t i = 0, run = 0; /* run: start of the pending valid stretch */
    while (i < n) {
        if (p[i] < 0x80) {
            i++;
            continue;
        }
        int need;
        size_t k = prefix_len(p + i, n - i, &need);
        if (need > 1 && k == (size_t)need) {
            i += k;
            continue;
        }
        if (sbuf_put(b, s + run, i - run) || sbuf_put(b, "\xEF\xBF\xBD", 3)) return -1;
        i += k;
        run = i;
    }
    return sbuf_put(b, s + run, n - run);
}

size_t utf8_subpart_len(const unsigned char *s, size_t n) {
    int need;
    return n ? prefix_len(s, n, &need) : 0;
}

size_t utf8_incomplete_len(const unsigned char *s, size_t n) {
    if (!n) return 0;
    int need;
    size_t k = prefix_len(s, n, &need);
    return (need > 1 && k < (size_t)need && k == n) ? k : 0;
}

/* ---- Unicode predicates ---- */

bool uni_is_whitespace(uint32_t c) {
    return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
           c == 0x205F || c == 0x3000;
}

bool uni_is_word(uint32_t c) {
    if (c < 0x80)
        return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
               c == '_';
    if (c == 0x200C || c == 0x200D) return true;
    switch (utf8proc_category((utf8proc_int32_t)c)) {
    case UTF8PROC_CATEGORY_LU:
    case UTF8PROC_CATEGORY_LL:
    case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM:
    case UTF8PROC_CATEGORY_LO:
    case UTF8PROC_CATEGORY_MN:
    case UTF8PROC_CATEGORY_MC:
    case UTF8PROC_CATEGORY_ME:
    case UTF8PROC_CATEGORY_ND:
    case UTF8PROC_CATEGORY_NL:
    case UTF8PROC_CATEGORY_PC:
        return true;
    default:
        return false;
    }
}

bool uni_is_numeric(uint32_t c) {
    if (c < 0x80) return c >= '0' && c <= '9';
    utf8proc_category_t k = utf8proc_category((utf8proc_int32_t)c);
    return k == UTF8PROC_CATEGORY_ND || k == UTF8PROC_CATEGORY_NL || k == UTF8PROC_CATEGORY_NO;
}

bool uni_is_punct(uint32_t c) {
    if (c < 0x80)
        return (c >= 0x21 && c <= 0x2F) || (c >= 0x3A && c <= 0x40) || (c >= 0x5B && c <= 0x60) ||
               (c >= 0x7B && c <= 0x7E);
    switch (utf8proc_category((utf8proc_int32_t)c)) {
    case UTF8PROC_CATEGORY_PC:
    case UTF8PROC_CATEGORY_PD:
    case UTF8PROC_CATEGORY_PS:
    case UTF8PROC_CATEGORY_PE:
    case UTF8PROC_CATEGORY_PI:
    case UTF8PROC_CATEGORY_PF:
    case UTF8PROC_CATEGORY_PO:
        return true;
    default:
        return false;
    }
}
