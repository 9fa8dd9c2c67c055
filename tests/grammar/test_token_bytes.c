/* tok_token_bytes on a real tokenizer (test_token_bytes NAME): what each token adds to the
 * text in the middle of a sequence. Random token sequences after a fixed first token must
 * decode (tok_decode) to that token's text followed by the concatenated token bytes,
 * whenever those are valid UTF-8 (a partial character decodes to U+FFFD); every byte must be
 * a token of its own; a few tokens are checked by hand. */
#include "gram_test.h"

static bool utf8_ok(const char *s, size_t n) {
    const unsigned char *p = (const unsigned char *)s;
    for (size_t i = 0; i < n;) {
        unsigned c = p[i];
        size_t k = c < 0x80                 ? 1
                   : c >= 0xC2 && c <= 0xDF ? 2
                   : c >= 0xE0 && c <= 0xEF ? 3
                   : c >= 0xF0 && c <= 0xF4 ? 4
                                            : 0;
        if (!k || i + k > n) return false;
        for (size_t j = 1; j < k; j++)
            if ((p[i + j] & 0xC0) != 0x80) return false;
        if ((c == 0xE0 && p[i + 1] < 0xA0) || (c == 0xED && p[i + 1] > 0x9F) ||
            (c == 0xF0 && p[i + 1] < 0x90) || (c == 0xF4 && p[i + 1] > 0x8F))
            return false;
        i += k;
    }
    return true;
}

static void expect(const tok_tokenizer *t, const char *piece, const char *want, size_t wn) {
    int32_t id = tok_piece_to_token(t, piece, strlen(piece));
    char buf[64];
    size_t n = 0;
    GT_CHECK(id >= 0 && !tok_token_bytes(t, id, buf, sizeof buf, &n) && n == wn &&
                 !memcmp(buf, want, wn),
             "token %s: %zu bytes", piece, n);
}

int main(int argc, char **argv) {
    const char *name = argc > 1 ? argv[1] : "qwen3";
    tok_tokenizer *t = gt_load_tokenizer(name);
    if (!t) return 1;
    int32_t nv = (int32_t)tok_vocab_size(t);
    bool have[256] = {false};
    int32_t *plain = malloc((size_t)nv * sizeof *plain), n_plain = 0;
    for (int32_t id = 0; id < nv; id++) {
        size_t n = 0;
        char buf[8];
        if (tok_token_bytes(t, id, buf, sizeof buf, &n)) continue;
        if (n == 1 && !tok_is_special(t, id)) have[(unsigned char)buf[0]] = true;
        if (!tok_is_special(t, id) && n) plain[n_plain++] = id;
    }
    for (int c = 0; c < 256; c++)
        GT_CHECK(have[c] || c == 0xC0 || c == 0xC1 || c >= 0xF5, "%s: byte %02x is no token", name,
                 c);
    size_t n = 0;
    GT_CHECK(tok_token_bytes(t, nv + 10, NULL, 0, &n) == -1 &&
                 tok_token_bytes(t, -1, NULL, 0, &n) == -1,
             "%s: ids outside", name);
    /* sequences after a first token (whose own start-of-text treatment stays with it) */
    int32_t first = -1;
    int32_t *ids = NULL;
    size_t nf = 0;
    tok_encode(t, "x", 1, false, &ids, &nf);
    if (nf) first = ids[nf - 1];
    free(ids);
    GT_CHECK(first >= 0, "%s: no token for x", name);
    size_t fl = 0;
    char *ftext = tok_decode(t, &first, 1, false, &fl);
    uint64_t rng = 12345;
    int tried = 0, compared = 0;
    for (int iter = 0; iter < (GT_SANITIZED ? 4000 : 20000) && first >= 0; iter++) {
        int32_t seq[8];
        seq[0] = first;
        int len = 1 + (int)(gt_rand(&rng) % 6);
        char bytes[8 * 512];
        size_t nb = 0;
        for (int k = 1; k <= len; k++) {
            seq[k] = plain[gt_rand(&rng) % (uint64_t)n_plain];
            size_t m = 0;
            tok_token_bytes(t, seq[k], bytes + nb, 512, &m);
            nb += m < 512 ? m : 512;
        }
        tried++;
        if (!utf8_ok(bytes, nb)) continue;
        compared++;
        size_t dl = 0;
        char *dec = tok_decode(t, seq, (size_t)len + 1, false, &dl);
        bool ok = dec && dl == fl + nb && !memcmp(dec, ftext, fl) && !memcmp(dec + fl, bytes, nb);
        GT_CHECK(ok, "%s: tokens %d %d ... decode to other bytes", name, (int)seq[1],
                 len > 1 ? (int)seq[2] : -1);
        free(dec);
    }
    free(ftext);
    GT_CHECK(compared > tried / 4, "%s: only %d of %d sequences were valid UTF-8", name, compared,
             tried);
    if (!strcmp(name, "qwen3")) {
        expect(t, "\xC4\xA0world", " world", 6); /* Ġworld */
        expect(t, "\xC4\x8A", "\n", 1);          /* Ċ */
        expect(t, "<tool_call>", "<tool_call>", 11);
        expect(t, "<|im_end|>", "<|im_end|>", 10);
        /* a piece holding part of a character: its raw byte */
        expect(t, "\xC3\xA6", "\xE6", 1); /* æ stands for byte 0xE6 */
    } else if (!strcmp(name, "llama2")) {
        expect(t, "\xE2\x96\x81the", " the", 4); /* ▁the */
        expect(t, "<0x0A>", "\n", 1);
        expect(t, "<0xE4>", "\xE4", 1);
        expect(t, "</s>", "</s>", 4);
    }
    free(plain);
    tok_free(t);
    if (gt_failures) {
        fprintf(stderr, "%d failures\n", gt_failures);
        return 1;
    }
    printf("%s: token bytes agree with decoding (%d of %d sequences compared)\n", name, compared,
           tried);
    return 0;
}
