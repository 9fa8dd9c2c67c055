/* Helpers shared by the tokenizer test programs: id and text comparison with a readable diff,
 * and the check that a streaming decoder reproduces batch decoding in whole characters. */
#ifndef LMHOST_TOK_TEST_UTIL_H
#define LMHOST_TOK_TEST_UTIL_H

#include "tokenizer.h"
#include "../test_io.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <json-c/json.h>

static int failures;

static inline void print_ids(const char *label, const int32_t *v, size_t n, size_t at) {
    size_t lo = at > 8 ? at - 8 : 0, hi = at + 8 < n ? at + 8 : n;
    fprintf(stderr, "    %s (%zu ids)%s", label, n, lo ? " ... " : " ");
    for (size_t i = lo; i < hi; i++) fprintf(stderr, i == at ? "[%d] " : "%d ", (int)v[i]);
    fprintf(stderr, "%s\n", hi < n ? "..." : "");
}

static inline bool check_ids(const char *what, const char *text, json_object *want,
                             const int32_t *got, size_t n) {
    size_t wn = json_object_array_length(want);
    int32_t *w = malloc((wn ? wn : 1) * sizeof *w);
    for (size_t i = 0; i < wn; i++) w[i] = json_object_get_int(json_object_array_get_idx(want, i));
    size_t at = 0;
    while (at < wn && at < n && w[at] == got[at]) at++;
    bool ok = at == wn && at == n;
    if (!ok) {
        fprintf(stderr, "  FAIL %s of %.60s%s: first difference at index %zu\n", what, text,
                strlen(text) > 60 ? "..." : "", at);
        print_ids("want", w, wn, at);
        print_ids("got ", got, n, at);
        failures++;
    }
    free(w);
    return ok;
}

static inline void show_text(const char *label, const char *s, size_t n, size_t at) {
    size_t lo = at > 20 ? at - 20 : 0, hi = at + 20 < n ? at + 20 : n;
    fprintf(stderr, "    %s: \"", label);
    for (size_t i = lo; i < hi; i++) {
        unsigned char c = (unsigned char)s[i];
        if (i == at) fputs("\xE2\x96\xB6", stderr); /* marks the first difference */
        if (c < 0x20 || c == '"' || c == '\\')
            fprintf(stderr, "\\x%02x", c);
        else
            fputc(c, stderr);
    }
    fprintf(stderr, "\"\n");
}

static inline bool check_text(const char *what, const char *text, const char *want, size_t wn,
                              const char *got, size_t gn) {
    size_t at = 0;
    while (at < wn && at < gn && want[at] == got[at]) at++;
    if (at == wn && at == gn) return true;
    fprintf(stderr, "  FAIL %s of %.60s: first difference at byte %zu\n", what, text, at);
    show_text("want", want, wn, at);
    show_text("got ", got, gn, at);
    failures++;
    return false;
}

/* Well-formed UTF-8 (the stream must never hand out half a character). */
static inline bool valid_utf8(const char *s, size_t n) {
    const unsigned char *p = (const unsigned char *)s;
    for (size_t i = 0; i < n;) {
        unsigned char c = p[i];
        size_t k;
        unsigned char lo = 0x80, hi = 0xBF;
        if (c < 0x80) {
            i++;
            continue;
        } else if (c >= 0xC2 && c <= 0xDF) {
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
        for (size_t j = 2; j < k; j++)
            if (p[i + j] < 0x80 || p[i + j] > 0xBF) return false;
        i += k;
    }
    return true;
}

/* Streams ids one at a time; the concatenation must equal tok_decode and every chunk must be
 * whole UTF-8. */
static inline bool check_stream(const tok_tokenizer *t, const char *label, const int32_t *ids,
                                size_t n, bool skip) {
    size_t bn;
    char *batch = tok_decode(t, ids, n, skip, &bn);
    tok_stream *s = tok_stream_new(t, skip);
    char *cat = malloc(bn * 2 + 64);
    size_t cn = 0, cap = bn * 2 + 64;
    bool ok = batch && s && cat;
    for (size_t i = 0; ok && i <= n; i++) {
        size_t k;
        const char *chunk = i < n ? tok_stream_push(s, ids[i], &k) : tok_stream_flush(s, &k);
        if (!chunk || !valid_utf8(chunk, k)) {
            fprintf(stderr, "  FAIL stream of %s: %s after id %zu\n", label,
                    chunk ? "a chunk is not whole UTF-8" : "out of memory", i);
            failures++;
            ok = false;
            break;
        }
        if (cn + k > cap) {
            cap = (cn + k) * 2;
            cat = realloc(cat, cap);
        }
        memcpy(cat + cn, chunk, k);
        cn += k;
    }
    if (ok) ok = check_text("stream == decode", label, batch, bn, cat, cn);
    free(batch);
    free(cat);
    tok_stream_free(s);
    return ok;
}

static uint64_t rng = 0x9E3779B97F4A7C15ULL;
static inline uint32_t rnd(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng >> 16);
}

/* Loads the real tokenizer NAME from $LMHOST_TOKENIZERS/NAME (default
 * ~/.cache/lmhost/tokenizers/NAME). When it is missing, says how to fetch it and returns NULL:
 * the test then fails rather than passing silently. */
static inline tok_tokenizer *load_real(const char *name, char *dir, size_t dirlen) {
    const char *root = getenv("LMHOST_TOKENIZERS");
    if (root && *root)
        snprintf(dir, dirlen, "%s/%s", root, name);
    else
        snprintf(dir, dirlen, "%s/.cache/lmhost/tokenizers/%s",
                 getenv("HOME") ? getenv("HOME") : ".", name);
    char probe[4200];
    snprintf(probe, sizeof probe, "%s/tokenizer.json", dir);
    FILE *pf = fopen(probe, "rb");
    if (!pf) {
        fprintf(stderr,
                "FAIL: %s not found. Fetch the tokenizers first:\n"
                "  tools/fetch_tokenizers.sh ~/.cache/lmhost/tokenizers\n"
                "(or set LMHOST_TOKENIZERS to the directory holding <name>/tokenizer.json)\n",
                probe);
        return NULL;
    }
    fclose(pf);
    char err[512];
    tok_tokenizer *t = tok_load(dir, err, sizeof err);
    if (!t) fprintf(stderr, "FAIL: cannot load %s: %s\n", dir, err);
    return t;
}

#endif
