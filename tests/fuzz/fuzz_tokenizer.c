// clang-format off
// clang -g -O1 -fsanitize=fuzzer,address,undefined tests/fuzz/fuzz_tokenizer.c $(ls core/tokenizer/*.c | grep -v /cli.c) $(pkg-config --cflags --libs json-c libpcre2-8 libutf8proc) -o fuzz_tokenizer
// clang-format on
//
// libFuzzer target for the tokenizer (run from the repository root). The first input byte picks
// what to fuzz:
//  - even: the rest is a tokenizer.json (optionally followed by "\0\0" and a
//    tokenizer_config.json) given to tok_load_from_memory; when it loads, fixed texts and the
//    input itself are encoded, and ids taken from the input are decoded in batch and streamed;
//  - odd: the rest is text encoded with a real tokenizer ($LMHOST_TOKENIZERS or
//    ~/.cache/lmhost/tokenizers, chosen by the second byte; a small built-in one when none is
//    there), with round-trip checks where they must hold.
// Any crash, sanitizer report or failed invariant (abort) is a finding.
#include "../../core/text/tokenizer/tokenizer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A small tokenizer with byte-level pre-tokenization, a Split regex and an added token, for
 * when the real ones are not downloaded. */
static const char BUILTIN[] =
    "{\"added_tokens\":[{\"id\":7,\"content\":\"<|x|>\",\"special\":true}],"
    "\"normalizer\":{\"type\":\"NFC\"},"
    "\"pre_tokenizer\":{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Split\",\"pattern\":"
    "{\"Regex\":\"(?i:'s|'t)|[^\\\\r\\\\n\\\\p{L}\\\\p{N}]?\\\\p{L}+|\\\\p{N}{1,3}|\\\\s+(?!\\\\S)|"
    "\\\\s+\"},"
    "\"behavior\":\"Isolated\"},{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"use_regex\":"
    "false}]},"
    "\"decoder\":{\"type\":\"ByteLevel\"},"
    "\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1,\"ab\":2,\"\xC4\xA0\":3,\"\xC4\xA0"
    "ab\":4,"
    "\"c\":5,\"\xC3\xA9\":6},\"merges\":[\"a b\",\"\xC4\xA0 ab\"]}}";

static const char *const NAMES[] = {"qwen3",    "gemma3",      "llama2",
                                    "llama3_1", "deepseek_v3", "gptoss"};
/* byte-level, no normalizer: decode(encode(text)) must give the text back */
static const int ROUND_TRIP[] = {0, 0, 0, 1, 1, 1};

static tok_tokenizer *real[6];
static int real_rt[6];
static size_t n_real;
static tok_tokenizer *builtin;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    const char *root = getenv("LMHOST_TOKENIZERS");
    char dir[4096], err[512];
    for (size_t i = 0; i < 6; i++) {
        if (root && *root)
            snprintf(dir, sizeof dir, "%s/%s", root, NAMES[i]);
        else
            snprintf(dir, sizeof dir, "%s/.cache/lmhost/tokenizers/%s",
                     getenv("HOME") ? getenv("HOME") : ".", NAMES[i]);
        tok_tokenizer *t = tok_load(dir, err, sizeof err);
        if (t) {
            real_rt[n_real] = ROUND_TRIP[i];
            real[n_real++] = t;
        }
    }
    builtin = tok_load_from_memory(BUILTIN, sizeof BUILTIN - 1, NULL, 0, err, sizeof err);
    if (!builtin) {
        fprintf(stderr, "built-in tokenizer: %s\n", err);
        abort();
    }
    if (!n_real)
        fprintf(stderr, "fuzz_tokenizer: no real tokenizers found, using a built-in one\n");
    return 0;
}

/* Batch decode and streaming must agree, and the stream must hand out whole UTF-8. */
static void check_decode(const tok_tokenizer *t, const int32_t *ids, size_t n, bool skip) {
    size_t bn;
    char *b = tok_decode(t, ids, n, skip, &bn);
    if (!b) abort();
    tok_stream *s = tok_stream_new(t, skip);
    if (!s) abort();
    char *cat = malloc(bn + 1);
    size_t cn = 0;
    for (size_t i = 0; i <= n; i++) {
        size_t k;
        const char *c = i < n ? tok_stream_push(s, ids[i], &k) : tok_stream_flush(s, &k);
        if (!c || cn + k > bn || memcmp(b + cn, c, k) != 0) abort(); /* stream != decode */
        memcpy(cat + cn, c, k);
        cn += k;
    }
    if (cn != bn) abort();
    tok_stream_free(s);
    free(cat);
    char *c = tok_decode_ex(t, ids, n, TOK_DECODE_CLEANUP_SPACES, &bn);
    free(c);
    free(b);
}

static void exercise(const tok_tokenizer *t, const char *text, size_t len, int round_trip) {
    for (int special = 0; special < 2; special++) {
        int32_t *ids;
        size_t n;
        if (tok_encode(t, text, len, special, &ids, &n)) abort();
        size_t vs = tok_vocab_size(t);
        for (size_t i = 0; i < n; i++)
            if (ids[i] < 0 || (size_t)ids[i] >= vs) abort();
        check_decode(t, ids, n, special);
        if (round_trip && !special) {
            size_t dn;
            char *d = tok_decode(t, ids, n, false, &dn);
            /* invalid UTF-8 comes back as U+FFFD, so compare only valid inputs */
            bool valid = true;
            for (size_t i = 0; i < len && valid; i++) valid = (unsigned char)text[i] < 0x80;
            if (valid && (dn != len || memcmp(d, text, len) != 0)) abort();
            free(d);
        }
        free(ids);
    }
    /* ids straight from the input bytes, byte-fallback and special ones included */
    size_t vs = tok_vocab_size(t), n = len / 3;
    int32_t *ids = malloc((n ? n : 1) * sizeof *ids);
    for (size_t i = 0; i < n; i++) {
        uint32_t v = (uint32_t)(unsigned char)text[3 * i] << 16 |
                     (uint32_t)(unsigned char)text[3 * i + 1] << 8 | (unsigned char)text[3 * i + 2];
        ids[i] = vs ? (int32_t)(v % (vs + 8)) : (int32_t)v; /* a few ids past the end too */
    }
    check_decode(t, ids, n, false);
    check_decode(t, ids, n, true);
    free(ids);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 2) return 0;
    const char *rest = (const char *)data + 1;
    size_t rn = size - 1;
    if (!(data[0] & 1)) {
        const char *cfg = NULL;
        size_t jn = rn, cn = 0;
        for (size_t i = 0; i + 1 < rn; i++)
            if (rest[i] == 0 && rest[i + 1] == 0) {
                jn = i;
                cfg = rest + i + 2;
                cn = rn - i - 2;
                break;
            }
        char err[256];
        tok_tokenizer *t = tok_load_from_memory(rest, jn, cfg, cn, err, sizeof err);
        if (!t) {
            if (!err[0]) abort(); /* a failure must say why */
            return 0;
        }
        static const char *const texts[] = {"",
                                            " ",
                                            "Hello, world! 123",
                                            "a\xCC\x81 \xE2\x96\x81x",
                                            "<s> <|x|>\n\t",
                                            "\xF0\x9F\x99\x82\xFF"};
        for (size_t i = 0; i < sizeof texts / sizeof *texts; i++)
            exercise(t, texts[i], strlen(texts[i]), 0);
        exercise(t, rest, rn, 0);
        tok_free(t);
        return 0;
    }
    if (!n_real) {
        exercise(builtin, rest, rn, 0);
        return 0;
    }
    size_t k = data[1] % n_real;
    exercise(real[k], rest + 1, rn - 1, real_rt[k]);
    return 0;
}
