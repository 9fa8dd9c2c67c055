/* Decoding: the decoder chain of tokenizer.json applied to a whole id list (tok_decode), and the
 * same chain run incrementally (tok_stream). The batch version follows Hugging Face tokenizers
 * step by step; the stream version is written independently so that the test comparing them
 * checks something. A stream only emits text that no later id can change. */
#include "tok_internal.h"

#include <stdlib.h>
#include <string.h>

#define FFFD "\xEF\xBF\xBD"

/* ---- a list of strings (the decoders' working representation) ---- */

typedef struct {
    size_t off, len;
} span;

typedef struct {
    tok_sbuf buf;
    span *v;
    size_t n, cap;
} slist;

static int slist_add(slist *l, const char *s, size_t n) {
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 32;
        span *v = realloc(l->v, cap * sizeof *v);
        if (!v) return -1;
        l->v = v;
        l->cap = cap;
    }
    size_t off = l->buf.n;
    if (sbuf_put(&l->buf, s, n)) return -1;
    l->v[l->n++] = (span){off, n};
    return 0;
}

/* Starts a new item that the caller then fills with sbuf_put on l->buf. */
static int slist_open(slist *l) {
    if (slist_add(l, "", 0)) return -1;
    return 0;
}

static void slist_close(slist *l) {
    l->v[l->n - 1].len = l->buf.n - l->v[l->n - 1].off;
}

static void slist_free(slist *l) {
    sbuf_free(&l->buf);
    free(l->v);
}

#define ITEM(l, i) ((l)->buf.p + (l)->v[i].off)

/* ---- helpers shared by both decoders ---- */

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* "<0xXX>" -> byte, else -1 (u8::from_str_radix also takes a '+' sign: "<0x+A>"). */
static int byte_token(const char *s, size_t n) {
    if (n != 6 || memcmp(s, "<0x", 3) != 0 || s[5] != '>') return -1;
    if (s[3] == '+') return hexval(s[4]);
    int a = hexval(s[3]), b = hexval(s[4]);
    return a < 0 || b < 0 ? -1 : a * 16 + b;
}

/* The bytes a token stands for under ByteLevel: each char mapped back to its byte, or the
 * token's own UTF-8 when some char is outside the byte alphabet. */
static int bytelevel_bytes(const char *s, size_t n, tok_sbuf *out) {
    size_t start = out->n;
    for (size_t i = 0; i < n;) {
        size_t k;
        int b = tok_bytelevel_byte(utf8_decode(s + i, &k));
        if (b < 0) {
            out->n = start;
            return sbuf_put(out, s, n);
        }
        char c = (char)b;
        if (sbuf_put(out, &c, 1)) return -1;
        i += k;
    }
    return 0;
}

/* Replace: every non-overlapping occurrence of the pattern, left to right. */
static int replace_all(const tok_dec *d, const char *s, size_t n, tok_sbuf *out,
                       pcre2_match_data **md) {
    if (!d->pat.is_regex) {
        size_t pn = d->pat.lit_len, i = 0;
        if (!pn) return sbuf_put(out, s, n);
        while (i < n) {
            const char *f = i + pn <= n ? tok_memmem(s + i, n - i, d->pat.lit, pn) : NULL;
            if (!f) break;
            if (sbuf_put(out, s + i, (size_t)(f - (s + i))) ||
                sbuf_put(out, d->content, d->content_len))
                return -1;
            i = (size_t)(f - s) + pn;
        }
        return sbuf_put(out, s + i, n - i);
    }
    if (!*md && !(*md = pcre2_match_data_create(1, NULL))) return -1;
    size_t off = 0, prev = 0;
    uint32_t opts = 0;
    while (off <= n) {
        int rc =
            pcre2_match(d->pat.re, (PCRE2_SPTR)s, n, off, opts | PCRE2_NO_UTF_CHECK, *md, NULL);
        if (rc == PCRE2_ERROR_NOMATCH && opts) {
            if (off >= n) break;
            off++;
            while (off < n && ((unsigned char)s[off] & 0xC0) == 0x80) off++;
            opts = 0;
            continue;
        }
        if (rc < 0) break;
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(*md);
        if (ov[0] < prev || ov[1] < ov[0] || ov[1] > n) break;
        if (sbuf_put(out, s + prev, ov[0] - prev) || sbuf_put(out, d->content, d->content_len))
            return -1;
        prev = off = ov[1];
        opts = ov[0] == ov[1] ? PCRE2_NOTEMPTY_ATSTART | PCRE2_ANCHORED : 0;
    }
    return sbuf_put(out, s + prev, n - prev);
}

/* Strip: up to `start` leading and `stop` trailing copies of one character. */
static int strip_item(const tok_dec *d, const char *s, size_t n, tok_sbuf *out) {
    size_t a = 0, b = n, cl = d->strip_len;
    for (size_t i = 0; i < d->start && a + cl <= n && memcmp(s + a, d->strip, cl) == 0; i++)
        a += cl;
    for (size_t i = 0; i < d->stop && b >= cl && memcmp(s + b - cl, d->strip, cl) == 0; i++)
        b -= cl;
    return b > a ? sbuf_put(out, s + a, b - a) : 0;
}

/* Metaspace: the replacement becomes a space, or vanishes in the first item. */
static int metaspace_item(const tok_dec *d, const char *s, size_t n, bool first, tok_sbuf *out) {
    size_t i = 0, prev = 0;
    while (i + d->rep_len <= n) {
        if (memcmp(s + i, d->rep, d->rep_len) == 0) {
            if (sbuf_put(out, s + prev, i - prev)) return -1;
            if (!(first && d->drop_first) && sbuf_putc(out, ' ')) return -1;
            i += d->rep_len;
            prev = i;
        } else {
            i++;
        }
    }
    return sbuf_put(out, s + prev, n - prev);
}

static bool id_skipped(const tok_tokenizer *t, int32_t id, bool skip_special) {
    if (id < 0 || (size_t)id >= t->n_ids || !t->id_str[id]) return true;
    return skip_special && (t->id_flags[id] & TOKF_SPECIAL);
}

/* ---- batch decoding ---- */

static int run_decoder(const tok_dec *d, slist *in, slist *out, pcre2_match_data **md) {
    switch (d->type) {
    case DEC_BYTELEVEL: {
        tok_sbuf bytes = {0};
        int rc = 0;
        for (size_t i = 0; i < in->n && !rc; i++)
            rc = bytelevel_bytes(ITEM(in, i), in->v[i].len, &bytes);
        if (!rc) rc = slist_open(out);
        if (!rc) rc = utf8_append_lossy(&out->buf, bytes.p ? bytes.p : "", bytes.n);
        if (!rc) slist_close(out);
        sbuf_free(&bytes);
        return rc;
    }
    case DEC_FUSE:
        if (slist_open(out)) return -1;
        for (size_t i = 0; i < in->n; i++)
            if (sbuf_put(&out->buf, ITEM(in, i), in->v[i].len)) return -1;
        slist_close(out);
        return 0;
    case DEC_BYTEFALLBACK: {
        tok_sbuf pend = {0};
        int rc = 0;
        for (size_t i = 0; i <= in->n && !rc; i++) {
            int b = i < in->n ? byte_token(ITEM(in, i), in->v[i].len) : -1;
            if (b >= 0) {
                char c = (char)b;
                rc = sbuf_put(&pend, &c, 1);
                continue;
            }
            if (pend.n) {
                if (utf8_is_valid(pend.p, pend.n)) {
                    rc = slist_add(out, pend.p, pend.n);
                } else {
                    for (size_t j = 0; j < pend.n && !rc; j++) rc = slist_add(out, FFFD, 3);
                }
                pend.n = 0;
            }
            if (!rc && i < in->n) rc = slist_add(out, ITEM(in, i), in->v[i].len);
        }
        sbuf_free(&pend);
        return rc;
    }
    case DEC_REPLACE:
    case DEC_STRIP:
    case DEC_METASPACE:
        for (size_t i = 0; i < in->n; i++) {
            if (slist_open(out)) return -1;
            const char *s = ITEM(in, i);
            size_t n = in->v[i].len;
            int rc = d->type == DEC_REPLACE ? replace_all(d, s, n, &out->buf, md)
                     : d->type == DEC_STRIP ? strip_item(d, s, n, &out->buf)
                                            : metaspace_item(d, s, n, i == 0, &out->buf);
            if (rc) return -1;
            slist_close(out);
        }
        return 0;
    }
    return -1;
}

static char *tok_decode_impl(const tok_tokenizer *t, const int32_t *ids, size_t n, unsigned flags,
                             size_t *len) {
    slist a = {0}, b = {0};
    pcre2_match_data *md = NULL;
    char *res = NULL;
    bool skip = flags & TOK_DECODE_SKIP_SPECIAL;
    for (size_t i = 0; i < n; i++) {
        if (id_skipped(t, ids[i], skip)) continue;
        if (slist_add(&a, t->id_str[ids[i]], t->id_len[ids[i]])) goto out;
    }
    if (!t->has_decoder) {
        /* tokenizers joins the raw tokens with spaces when there is no decoder */
        tok_sbuf j = {0};
        for (size_t i = 0; i < a.n; i++)
            if ((i && sbuf_putc(&j, ' ')) || sbuf_put(&j, ITEM(&a, i), a.v[i].len)) {
                sbuf_free(&j);
                goto out;
            }
        slist_free(&a);
        a = (slist){0};
        if (slist_add(&a, j.p ? j.p : "", j.n)) {
            sbuf_free(&j);
            goto out;
        }
        sbuf_free(&j);
    }
    for (size_t k = 0; k < t->n_dec; k++) {
        b.n = 0;
        b.buf.n = 0;
        if (run_decoder(&t->dec[k], &a, &b, &md)) goto out;
        slist x = a;
        a = b;
        b = x;
    }
    tok_sbuf r = {0};
    for (size_t i = 0; i < a.n; i++)
        if (sbuf_put(&r, ITEM(&a, i), a.v[i].len)) {
            sbuf_free(&r);
            goto out;
        }
    if (sbuf_put(&r, "", 0)) goto out;
    if (flags & TOK_DECODE_CLEANUP_SPACES) r.n = tok_cleanup_spaces(r.p, r.n);
    if (len) *len = r.n;
    res = r.p;
out:
    slist_free(&a);
    slist_free(&b);
    if (md) pcre2_match_data_free(md);
    return res;
}

char *tok_decode(const tok_tokenizer *t, const int32_t *ids, size_t n, bool skip_special,
                 size_t *len) {
    return tok_decode_impl(t, ids, n, skip_special ? TOK_DECODE_SKIP_SPECIAL : 0, len);
}

char *tok_decode_ex(const tok_tokenizer *t, const int32_t *ids, size_t n, unsigned flags,
                    size_t *len) {
    return tok_decode_impl(t, ids, n, flags, len);
}

/* transformers' clean_up_tokenization: ten replace() passes, in this order. */
size_t tok_cleanup_spaces(char *s, size_t n) {
    static const struct {
        const char *from, *to;
    } R[] = {{" .", "."},     {" ?", "?"},   {" !", "!"},   {" ,", ","},     {" ' ", "'"},
             {" n't", "n't"}, {" 'm", "'m"}, {" 's", "'s"}, {" 've", "'ve"}, {" 're", "'re"}};
    for (size_t r = 0; r < sizeof R / sizeof *R; r++) {
        size_t fl = strlen(R[r].from), tl = strlen(R[r].to), w = 0, i = 0;
        /* every replacement is shorter, so it can be done in place */
        while (i < n) {
            if (i + fl <= n && memcmp(s + i, R[r].from, fl) == 0) {
                memmove(s + w, R[r].to, tl);
                w += tl;
                i += fl;
            } else {
                s[w++] = s[i++];
            }
        }
        n = w;
    }
    s[n] = '\0';
    return n;
}

/* ---- streaming ---- */

/* Per-decoder stream state. Decoders before the first fusing one (Fuse, ByteLevel) see items
 * (token strings); from there on they see a text stream in chunks of whole characters. */
typedef struct {
    tok_sbuf hold;   /* ByteFallback: pending bytes; stream stages: held-back text */
    size_t n_items;  /* items seen (Metaspace's "first") */
    size_t stripped; /* Strip in a stream: leading chars removed so far */
    bool started;    /* Strip in a stream: leading run over */
    size_t held;     /* Strip in a stream: trailing content chars held back */
} stage;

struct tok_stream {
    const tok_tokenizer *t;
    bool skip_special;
    size_t fuse_at; /* index of the first fusing decoder, or n_dec */
    size_t n_tokens;
    stage st[64];
    tok_sbuf utf8; /* ByteLevel: bytes of an unfinished character */
    tok_sbuf out;  /* text returned by the current call */
    tok_sbuf tmp[64];
    pcre2_match_data *md;
};

static bool hold_all(const tok_dec *d) {
    /* these need the whole text when they come after fusion */
    return d->type == DEC_BYTELEVEL || d->type == DEC_BYTEFALLBACK ||
           (d->type == DEC_REPLACE && d->pat.is_regex);
}

tok_stream *tok_stream_new(const tok_tokenizer *t, bool skip_special) {
    tok_stream *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    s->t = t;
    s->skip_special = skip_special;
    s->fuse_at = t->n_dec;
    for (size_t i = 0; i < t->n_dec; i++)
        if (t->dec[i].type == DEC_FUSE || t->dec[i].type == DEC_BYTELEVEL) {
            s->fuse_at = i;
            break;
        }
    return s;
}

void tok_stream_free(tok_stream *s) {
    if (!s) return;
    for (size_t i = 0; i < 64; i++) {
        sbuf_free(&s->st[i].hold);
        sbuf_free(&s->tmp[i]);
    }
    sbuf_free(&s->utf8);
    sbuf_free(&s->out);
    if (s->md) pcre2_match_data_free(s->md);
    free(s);
}

static int feed_chunk(tok_stream *s, size_t k, const char *p, size_t n);

/* An item enters decoder k (k < fuse_at, or k == fuse_at for the fusing decoder itself). */
static int feed_item(tok_stream *s, size_t k, const char *p, size_t n) {
    const tok_tokenizer *t = s->t;
    if (k == t->n_dec) return feed_chunk(s, k, p, n); /* the final join */
    const tok_dec *d = &t->dec[k];
    stage *st = &s->st[k];
    tok_sbuf *tmp = &s->tmp[k];
    switch (d->type) {
    case DEC_FUSE:
        return feed_chunk(s, k + 1, p, n);
    case DEC_BYTELEVEL: {
        /* bytes -> complete characters; U+FFFD for each maximal invalid subpart */
        tok_sbuf *u = &s->utf8;
        if (bytelevel_bytes(p, n, u)) return -1;
        tmp->n = 0;
        const unsigned char *b = (const unsigned char *)u->p;
        size_t i = 0, run = 0;
        while (i < u->n) {
            if (b[i] < 0x80) {
                i++;
                continue;
            }
            size_t v = utf8_valid_len(b + i, u->n - i);
            if (v) {
                i += v;
                continue;
            }
            if (utf8_incomplete_len(b + i, u->n - i)) break; /* may complete later */
            if (sbuf_put(tmp, u->p + run, i - run) || sbuf_put(tmp, FFFD, 3)) return -1;
            i += utf8_subpart_len(b + i, u->n - i);
            run = i;
        }
        if (sbuf_put(tmp, u->p + run, i - run)) return -1;
        memmove(u->p, u->p + i, u->n - i);
        u->n -= i;
        return tmp->n ? feed_chunk(s, k + 1, tmp->p, tmp->n) : 0;
    }
    case DEC_BYTEFALLBACK: {
        int b = byte_token(p, n);
        if (b >= 0) {
            char c = (char)b;
            return sbuf_put(&st->hold, &c, 1);
        }
        if (st->hold.n) {
            /* a run of byte tokens is valid UTF-8 as a whole or one U+FFFD per byte; the
             * decoders after this one never touch this hold buffer */
            int rc = 0;
            if (utf8_is_valid(st->hold.p, st->hold.n))
                rc = feed_item(s, k + 1, st->hold.p, st->hold.n);
            else
                for (size_t j = 0; j < st->hold.n && !rc; j++) rc = feed_item(s, k + 1, FFFD, 3);
            st->hold.n = 0;
            if (rc) return -1;
        }
        return feed_item(s, k + 1, p, n);
    }
    default: {
        tmp->n = 0;
        int rc = d->type == DEC_REPLACE ? replace_all(d, p, n, tmp, &s->md)
                 : d->type == DEC_STRIP ? strip_item(d, p, n, tmp)
                                        : metaspace_item(d, p, n, st->n_items == 0, tmp);
        st->n_items++;
        if (rc || sbuf_put(tmp, "", 0)) return -1;
        /* tmp[k] is only reused by this decoder, which runs again only after this returns */
        return feed_item(s, k + 1, tmp->p, tmp->n);
    }
    }
}

/* Text enters stream decoder k (k > fuse_at). */
static int feed_chunk(tok_stream *s, size_t k, const char *p, size_t n) {
    const tok_tokenizer *t = s->t;
    if (k >= t->n_dec) return sbuf_put(&s->out, p, n);
    const tok_dec *d = &t->dec[k];
    stage *st = &s->st[k];
    if (hold_all(d)) return sbuf_put(&st->hold, p, n);
    switch (d->type) {
    case DEC_FUSE:
        return feed_chunk(s, k + 1, p, n);
    case DEC_METASPACE: {
        tok_sbuf *tmp = &s->tmp[k];
        tmp->n = 0;
        if (metaspace_item(d, p, n, true, tmp)) return -1; /* the stream is the first item */
        return tmp->n ? feed_chunk(s, k + 1, tmp->p, tmp->n) : 0;
    }
    case DEC_STRIP: {
        tok_sbuf *tmp = &s->tmp[k];
        size_t cl = d->strip_len, i = 0;
        tmp->n = 0;
        while (i < n) {
            bool is_c = i + cl <= n && memcmp(p + i, d->strip, cl) == 0;
            size_t k2 = is_c ? cl : 1;
            if (!is_c) {
                while (i + k2 < n && ((unsigned char)p[i + k2] & 0xC0) == 0x80) k2++;
            }
            if (!st->started && is_c && st->stripped < d->start) {
                st->stripped++;
            } else if (is_c) {
                st->started = true;
                if (st->held < d->stop)
                    st->held++;
                else if (sbuf_put(tmp, d->strip, cl))
                    return -1;
            } else {
                st->started = true;
                for (; st->held; st->held--)
                    if (sbuf_put(tmp, d->strip, cl)) return -1;
                if (sbuf_put(tmp, p + i, k2)) return -1;
            }
            i += k2;
        }
        return tmp->n ? feed_chunk(s, k + 1, tmp->p, tmp->n) : 0;
    }
    case DEC_REPLACE: {
        /* literal pattern: hold back a tail that could be the start of a match */
        tok_sbuf *h = &st->hold, *tmp = &s->tmp[k];
        if (sbuf_put(h, p, n)) return -1;
        size_t pn = d->pat.lit_len, i = 0, prev = 0;
        tmp->n = 0;
        if (!pn) {
            if (sbuf_put(tmp, h->p, h->n)) return -1;
            h->n = 0;
            return tmp->n ? feed_chunk(s, k + 1, tmp->p, tmp->n) : 0;
        }
        while (i + pn <= h->n) {
            if (memcmp(h->p + i, d->pat.lit, pn) == 0) {
                if (sbuf_put(tmp, h->p + prev, i - prev) ||
                    sbuf_put(tmp, d->content, d->content_len))
                    return -1;
                i += pn;
                prev = i;
            } else {
                i++;
            }
        }
        /* i is where an unfinished match could start; keep from there, on a char boundary */
        while (i > prev && ((unsigned char)h->p[i] & 0xC0) == 0x80) i--;
        if (sbuf_put(tmp, h->p + prev, i - prev)) return -1;
        memmove(h->p, h->p + i, h->n - i);
        h->n -= i;
        return tmp->n ? feed_chunk(s, k + 1, tmp->p, tmp->n) : 0;
    }
    }
    return -1;
}

static void stream_reset(tok_stream *s) {
    for (size_t i = 0; i < 64; i++) {
        s->st[i].hold.n = 0;
        s->st[i].n_items = s->st[i].stripped = s->st[i].held = 0;
        s->st[i].started = false;
    }
    s->utf8.n = 0;
    s->n_tokens = 0;
}

const char *tok_stream_push(tok_stream *s, int32_t id, size_t *len) {
    const tok_tokenizer *t = s->t;
    s->out.n = 0;
    if (sbuf_put(&s->out, "", 0)) return NULL;
    if (!id_skipped(t, id, s->skip_special)) {
        const char *p = t->id_str[id];
        size_t n = t->id_len[id];
        int rc = 0;
        if (!t->has_decoder) {
            if (s->n_tokens) rc = sbuf_putc(&s->out, ' ');
            if (!rc) rc = sbuf_put(&s->out, p, n);
        } else {
            rc = feed_item(s, 0, p, n);
        }
        s->n_tokens++;
        if (rc) return NULL;
    }
    if (len) *len = s->out.n;
    return s->out.p;
}

const char *tok_stream_flush(tok_stream *s, size_t *len) {
    const tok_tokenizer *t = s->t;
    int rc = 0;
    s->out.n = 0;
    if (sbuf_put(&s->out, "", 0)) return NULL;
    /* flush each decoder in order: what it held goes through the ones after it */
    for (size_t k = 0; k < t->n_dec && !rc; k++) {
        const tok_dec *d = &t->dec[k];
        stage *st = &s->st[k];
        tok_sbuf h = st->hold;
        st->hold = (tok_sbuf){0};
        if (k < s->fuse_at) {
            if (d->type == DEC_BYTEFALLBACK && h.n) {
                if (utf8_is_valid(h.p, h.n))
                    rc = feed_item(s, k + 1, h.p, h.n);
                else
                    for (size_t j = 0; j < h.n && !rc; j++) rc = feed_item(s, k + 1, FFFD, 3);
            }
        } else if (k == s->fuse_at) {
            if (d->type == DEC_BYTELEVEL && s->utf8.n) {
                s->utf8.n = 0; /* an unfinished character is one maximal invalid subpart */
                rc = feed_chunk(s, k + 1, FFFD, 3);
            }
        } else if (hold_all(d)) {
            /* the whole text is this decoder's single item */
            slist in = {0}, o = {0};
            rc = slist_add(&in, h.p ? h.p : "", h.n);
            if (!rc) rc = run_decoder(d, &in, &o, &s->md);
            for (size_t i = 0; i < o.n && !rc; i++)
                rc = feed_chunk(s, k + 1, ITEM(&o, i), o.v[i].len);
            slist_free(&in);
            slist_free(&o);
        } else if (d->type == DEC_REPLACE && h.n) {
            rc = feed_chunk(s, k + 1, h.p, h.n); /* too short to hold a match */
        }
        /* Strip's held trailing characters are simply dropped */
        sbuf_free(&h);
    }
    stream_reset(s);
    if (rc) return NULL;
    if (len) *len = s->out.n;
    return s->out.p;
}

/* ---- one token's bytes in the middle of a sequence ---- */

int tok_token_bytes(const tok_tokenizer *t, int32_t id, char *buf, size_t cap, size_t *len) {
    if (id_skipped(t, id, false)) return -1;
    tok_sbuf a = {0}, b = {0};
    pcre2_match_data *md = NULL;
    int rc = 0;
    /* without a decoder tokenizers joins tokens with spaces: one comes before every token
     * but the first */
    if (!t->has_decoder) rc = sbuf_putc(&a, ' ');
    if (!rc) rc = sbuf_put(&a, t->id_str[id], t->id_len[id]);
    bool fused = false;
    for (size_t k = 0; k < t->n_dec && !rc; k++) {
        const tok_dec *d = &t->dec[k];
        b.n = 0;
        const char *s = a.p ? a.p : "";
        switch (d->type) {
        case DEC_BYTELEVEL:
            /* raw bytes, not the lossy text: a piece may hold part of a character */
            rc = bytelevel_bytes(s, a.n, &b);
            fused = true;
            break;
        case DEC_BYTEFALLBACK: {
            int v = byte_token(s, a.n);
            if (v >= 0) {
                rc = sbuf_putc(&b, (char)v);
            } else {
                rc = sbuf_put(&b, s, a.n);
            }
            break;
        }
        case DEC_FUSE:
            fused = true;
            rc = sbuf_put(&b, s, a.n);
            break;
        case DEC_REPLACE:
            rc = replace_all(d, s, a.n, &b, &md);
            break;
        case DEC_STRIP:
            /* after fusion Strip trims the start and end of the whole text only; before it,
             * every token */
            rc = fused ? sbuf_put(&b, s, a.n) : strip_item(d, s, a.n, &b);
            break;
        case DEC_METASPACE:
            rc = metaspace_item(d, s, a.n, false, &b);
            break;
        default:
            rc = sbuf_put(&b, s, a.n);
        }
        tok_sbuf x = a;
        a = b;
        b = x;
    }
    if (!rc) {
        if (len) *len = a.n;
        if (buf && cap) memcpy(buf, a.p ? a.p : "", a.n < cap ? a.n : cap);
    }
    sbuf_free(&a);
    sbuf_free(&b);
    if (md) pcre2_match_data_free(md);
    return rc ? -1 : 0;
}
