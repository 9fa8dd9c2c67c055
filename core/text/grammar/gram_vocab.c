/* The vocabulary side of constrained decoding: every token's bytes, and a trie over the
 * ordinary ones laid out in depth-first order, so that a mask is one pass over an array
 * that jumps past the subtree of every rejected prefix. */
#include "gram_internal.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    const char *s;
    uint32_t len;
    int32_t id;
} tokref;

static int cmp_tok(const void *a, const void *b) {
    const tokref *x = a, *y = b;
    uint32_t n = x->len < y->len ? x->len : y->len;
    int c = memcmp(x->s, y->s, n);
    if (c) return c;
    if (x->len != y->len) return x->len < y->len ? -1 : 1;
    return (x->id > y->id) - (x->id < y->id);
}

static gram_vocab *vfail(gram_vocab *v, char *err, size_t err_len, const char *fmt, ...) {
    if (err && err_len) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, err_len, fmt, ap);
        va_end(ap);
    }
    gram_vocab_free(v);
    return NULL;
}

void gram_vocab_free(gram_vocab *v) {
    if (!v) return;
    free(v->off);
    free(v->bytes);
    free(v->kind);
    free(v->tb);
    free(v->td);
    free(v->skip);
    free(v->tok_at);
    free(v->maxrem);
    free(v->tok_ids);
    free(v->nchars);
    free(v->plain_sub);
    free(v->pchars);
    free(v->all_plain);
    free(v->char_off);
    free(v->char_ids);
    free(v->by_chars);
    free(v->sub_cmin);
    free(v->sub_cmax);
    free(v->eos);
    free(v->special);
    free(v);
}

int32_t gram_vocab_size(const gram_vocab *v) {
    return v ? v->n_vocab : 0;
}

bool gram_vocab_bytes_complete(const gram_vocab *v) {
    return v && v->all_bytes;
}

/* Valid UTF-8 without control characters, '"' and '\\': what JSON string content may hold
 * as is. */
static bool plain_utf8(const char *s, uint32_t n) {
    const unsigned char *p = (const unsigned char *)s;
    for (uint32_t i = 0; i < n;) {
        unsigned c = p[i];
        if (c < 0x80) {
            if (c < 0x20 || c == '"' || c == '\\') return false;
            i++;
            continue;
        }
        uint32_t k;
        unsigned lo = 0x80, hi = 0xBF;
        if (c >= 0xC2 && c <= 0xDF) {
            k = 2;
        } else if (c >= 0xE0 && c <= 0xEF) {
            k = 3;
            if (c == 0xE0) lo = 0xA0;
            if (c == 0xED) hi = 0x9F;
        } else if (c >= 0xF0 && c <= 0xF4) {
            k = 4;
            if (c == 0xF0) lo = 0x90;
            if (c == 0xF4) hi = 0x8F;
        } else {
            return false;
        }
        if (i + k > n || p[i + 1] < lo || p[i + 1] > hi) return false;
        for (uint32_t j = 2; j < k; j++)
            if (p[i + j] < 0x80 || p[i + j] > 0xBF) return false;
        i += k;
    }
    return true;
}

gram_vocab *gram_vocab_new(const tok_tokenizer *t, int32_t n_vocab, const int32_t *eos, int n_eos,
                           char *err, size_t err_len) {
    if (err && err_len) err[0] = 0;
    if (!t || n_vocab <= 0 || n_eos < 0 || (n_eos && !eos))
        return vfail(NULL, err, err_len, "no tokenizer, or a vocabulary of %d tokens",
                     (int)n_vocab);
    gram_vocab *v = calloc(1, sizeof *v);
    if (!v) return vfail(NULL, err, err_len, "out of memory");
    v->n_vocab = n_vocab;
    int32_t known =
        (int32_t)(tok_vocab_size(t) < (size_t)n_vocab ? tok_vocab_size(t) : (size_t)n_vocab);
    v->off = malloc(((size_t)n_vocab + 1) * sizeof *v->off);
    v->kind = calloc((size_t)n_vocab, 1);
    v->eos = malloc((size_t)(n_eos ? n_eos : 1) * sizeof *v->eos);
    if (!v->off || !v->kind || !v->eos) return vfail(v, err, err_len, "out of memory");
    for (int i = 0; i < n_eos; i++) {
        if (eos[i] < 0 || eos[i] >= n_vocab)
            return vfail(v, err, err_len, "end-of-sequence id %d is outside the vocabulary (%d)",
                         (int)eos[i], (int)n_vocab);
        v->eos[v->n_eos++] = eos[i];
        v->kind[eos[i]] = TK_EOS;
    }
    /* every id's bytes */
    size_t cap = (size_t)known * 8 + 64, used = 0;
    v->bytes = malloc(cap);
    if (!v->bytes) return vfail(v, err, err_len, "out of memory");
    int32_t n_text = 0, n_special = 0;
    for (int32_t id = 0; id < n_vocab; id++) {
        v->off[id] = (uint32_t)used;
        size_t len = 0;
        if (id >= known || tok_token_bytes(t, id, NULL, 0, &len)) continue;
        if (len > 65535 || used + len > UINT32_MAX) continue; /* never allowed */
        if (used + len > cap) {
            size_t nc = (used + len) * 2;
            char *nb = realloc(v->bytes, nc);
            if (!nb) return vfail(v, err, err_len, "out of memory");
            v->bytes = nb;
            cap = nc;
        }
        if (tok_token_bytes(t, id, v->bytes + used, len, &len))
            return vfail(v, err, err_len, "out of memory");
        used += len;
        if (v->kind[id] == TK_EOS) continue;
        if (!len) continue; /* an empty token would let the output stall */
        if (tok_is_special(t, id)) {
            v->kind[id] = TK_SPECIAL;
            n_special++;
        } else {
            v->kind[id] = TK_TEXT;
            n_text++;
        }
    }
    v->off[n_vocab] = (uint32_t)used;
    /* Termination needs every byte a UTF-8 text holds as a token of its own: then the
     * shortest completion, written byte by byte, takes at most min_bytes tokens. Byte-level
     * BPE vocabularies have all 256; SentencePiece ones have them as byte-fallback tokens.
     * Without them (gram_vocab_bytes_complete false), a mask still never leaves the grammar,
     * but a completion may need a byte that only comes inside longer tokens, so max_tokens
     * can cut a document short or a state can have no allowed token. */
    bool have[256] = {false};
    for (int32_t id = 0; id < n_vocab; id++)
        if (v->kind[id] == TK_TEXT && v->off[id + 1] - v->off[id] == 1)
            have[(unsigned char)v->bytes[v->off[id]]] = true;
    v->all_bytes = true;
    for (int c = 0; c < 256; c++)
        if (!have[c] && !(c >= 0xC0 && c <= 0xC1) && c < 0xF5) v->all_bytes = false;
    v->special = malloc((size_t)(n_special ? n_special : 1) * sizeof *v->special);
    tokref *refs = malloc((size_t)(n_text ? n_text : 1) * sizeof *refs);
    if (!v->special || !refs) {
        free(refs);
        return vfail(v, err, err_len, "out of memory");
    }
    int32_t k = 0;
    size_t total = 0;
    for (int32_t id = 0; id < n_vocab; id++) {
        if (v->kind[id] == TK_SPECIAL) v->special[v->n_special++] = id;
        if (v->kind[id] != TK_TEXT) continue;
        refs[k++] = (tokref){v->bytes + v->off[id], v->off[id + 1] - v->off[id], id};
        total += v->off[id + 1] - v->off[id];
    }
    if (n_text) qsort(refs, (size_t)n_text, sizeof *refs, cmp_tok);
    /* the trie, depth-first: sorted tokens share their common prefix with the one before */
    v->tb = malloc(total + 1);
    v->td = malloc((total + 1) * sizeof *v->td);
    v->skip = malloc((total + 1) * sizeof *v->skip);
    v->maxrem = calloc(total + 1, sizeof *v->maxrem);
    v->tok_at = calloc(total + 2, sizeof *v->tok_at);
    v->tok_ids = malloc((size_t)(n_text ? n_text : 1) * sizeof *v->tok_ids);
    v->pchars = malloc((total + 1) * sizeof *v->pchars);
    uint32_t *path = malloc(65537 * sizeof *path);
    if (!v->tb || !v->td || !v->skip || !v->maxrem || !v->tok_at || !v->tok_ids || !v->pchars ||
        !path) {
        free(refs);
        free(path);
        return vfail(v, err, err_len, "out of memory");
    }
    uint32_t n = 0;
    uint32_t depth = 0; /* nodes open on the path */
    const tokref *prev = NULL;
    for (int32_t i = 0; i < n_text; i++) {
        const tokref *r = &refs[i];
        uint32_t lcp = 0;
        if (prev) {
            uint32_t m = prev->len < r->len ? prev->len : r->len;
            while (lcp < m && prev->s[lcp] == r->s[lcp]) lcp++;
        }
        /* close the nodes below the common prefix */
        while (depth > lcp) v->skip[path[depth--]] = n;
        for (uint32_t dd = lcp + 1; dd <= r->len; dd++) {
            v->tb[n] = (uint8_t)r->s[dd - 1];
            v->td[n] = (uint16_t)dd;
            v->pchars[n] =
                (uint16_t)((dd > 1 ? v->pchars[path[dd - 1]] : 0) + ((v->tb[n] & 0xC0) != 0x80));
            path[dd] = n++;
        }
        depth = r->len;
        v->tok_ids[i] = r->id;
        v->tok_at[path[r->len] + 1]++;
        for (uint32_t dd = 1; dd <= r->len; dd++)
            if (v->maxrem[path[dd]] < r->len - dd) v->maxrem[path[dd]] = (uint16_t)(r->len - dd);
        if ((int)r->len > v->max_depth) v->max_depth = (int)r->len;
        prev = r;
    }
    while (depth > 0) v->skip[path[depth--]] = n;
    for (uint32_t i = 0; i < n; i++) v->tok_at[i + 1] += v->tok_at[i];
    v->n_nodes = (int32_t)n;
    /* plain text, for the matcher's bulk steps through string content */
    v->nchars = malloc((size_t)(n_text ? n_text : 1) * sizeof *v->nchars);
    v->plain_sub = malloc((size_t)n + 1);
    if (!v->nchars || !v->plain_sub) {
        free(refs);
        free(path);
        return vfail(v, err, err_len, "out of memory");
    }
    for (int32_t k = 0; k < n_text; k++) {
        int32_t id = v->tok_ids[k];
        uint32_t len = v->off[id + 1] - v->off[id];
        v->nchars[k] = NOT_PLAIN;
        if (plain_utf8(v->bytes + v->off[id], len)) {
            uint32_t c = 0;
            for (uint32_t j = 0; j < len; j++)
                c += ((unsigned char)v->bytes[v->off[id] + j] & 0xC0) != 0x80;
            v->nchars[k] = (uint16_t)c;
            if ((int)c > v->max_chars) v->max_chars = (int)c;
        }
    }
    v->sub_cmin = malloc((size_t)(n + 1) * sizeof *v->sub_cmin);
    v->sub_cmax = malloc((size_t)(n + 1) * sizeof *v->sub_cmax);
    if (!v->sub_cmin || !v->sub_cmax) {
        free(refs);
        free(path);
        return vfail(v, err, err_len, "out of memory");
    }
    /* children come after their parent: fold from the back */
    for (uint32_t i = n; i-- > 0;) {
        uint8_t ok = 1;
        uint16_t cmin = NOT_PLAIN, cmax = 0;
        for (uint32_t k = v->tok_at[i]; k < v->tok_at[i + 1]; k++) {
            ok &= v->nchars[k] != NOT_PLAIN;
            cmin = v->nchars[k] < cmin ? v->nchars[k] : cmin;
            cmax = v->nchars[k] > cmax ? v->nchars[k] : cmax;
        }
        for (uint32_t c = i + 1; c < v->skip[i] && ok; c = v->skip[c]) {
            ok &= v->plain_sub[c];
            cmin = v->sub_cmin[c] < cmin ? v->sub_cmin[c] : cmin;
            cmax = v->sub_cmax[c] > cmax ? v->sub_cmax[c] : cmax;
        }
        v->plain_sub[i] = ok;
        v->sub_cmin[i] = cmin;
        v->sub_cmax[i] = cmax;
    }
    v->all_plain = calloc(((size_t)n_vocab + 31) / 32, sizeof *v->all_plain);
    if (!v->all_plain) {
        free(refs);
        free(path);
        return vfail(v, err, err_len, "out of memory");
    }
    for (int32_t k = 0; k < n_text; k++)
        if (v->nchars[k] != NOT_PLAIN)
            v->all_plain[v->tok_ids[k] >> 5] |= 1u << (v->tok_ids[k] & 31);
    /* plain tokens grouped by characters */
    size_t words = ((size_t)n_vocab + 31) / 32;
    int gm = v->max_chars < GROUP_MASKS ? v->max_chars : GROUP_MASKS;
    v->char_off = calloc((size_t)v->max_chars + 3, sizeof *v->char_off);
    v->char_ids = malloc((size_t)(n_text ? n_text : 1) * sizeof *v->char_ids);
    v->by_chars = calloc((size_t)(gm ? gm : 1) * words, sizeof *v->by_chars);
    if (!v->char_off || !v->char_ids || !v->by_chars) {
        free(refs);
        free(path);
        return vfail(v, err, err_len, "out of memory");
    }
    for (int32_t k = 0; k < n_text; k++)
        if (v->nchars[k] != NOT_PLAIN) v->char_off[v->nchars[k] + 1]++;
    for (int c = 0; c <= v->max_chars; c++) v->char_off[c + 1] += v->char_off[c];
    for (int32_t k = 0; k < n_text; k++) {
        int c = v->nchars[k];
        if (c == NOT_PLAIN) continue;
        int32_t id = v->tok_ids[k];
        v->char_ids[v->char_off[c]++] = id;
        if (c >= 1 && c <= gm)
            v->by_chars[(size_t)(c - 1) * words + (size_t)(id >> 5)] |= 1u << (id & 31);
    }
    for (int c = v->max_chars + 1; c > 0; c--) v->char_off[c] = v->char_off[c - 1];
    v->char_off[0] = 0;
    free(path);
    free(refs);
    return v;
}
