// clang-format off
// clang -g -O1 -fsanitize=fuzzer,address,undefined tests/fuzz/fuzz_grammar.c core/grammar/gram_*.c $(ls core/tokenizer/*.c | grep -v /cli.c) core/jsonfix/json_fix.c -Icore/grammar -Icore/tokenizer -Icore/jsonfix $(pkg-config --cflags --libs json-c libpcre2-8 libutf8proc) -o fuzz_grammar
// clang-format on
//
// libFuzzer target for constrained decoding (run from the repository root). The input is a
// JSON Schema (after one byte that picks how it is used: alone, after a literal holding a
// special token, or after free text up to a marker); when it compiles, a random walk over
// a small vocabulary (every byte, some JSON pieces, a special token, an end-of-sequence
// token) takes allowed tokens until the budget runs out, seeded by the input. Findings: any
// crash or sanitizer report, and broken invariants (abort): a budget that fits the shortest
// completion must always leave a token, every allowed token must be accepted, and the walk
// must end complete.
#include "grammar.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const PIECES[] = {"{\"",          "\":",     "\": ", ", \"",    "true",
                                     "false",        "null",    "\"}",  "\"]",     "12",
                                     "-0.5e+3",      "\\u00e9", "\\n",  "ab",      "\xC3\xA9",
                                     "\xE4\xB8\xAD", "[{",      "}]",   "\\ud83d", "</end>"};
static tok_tokenizer *tok;
static gram_vocab *voc;
static int32_t n_vocab, id_special, id_eos;

static void put_json_str(char **p, const char *s) {
    *(*p)++ = '"';
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') *(*p)++ = '\\';
        *(*p)++ = (char)c;
    }
    *(*p)++ = '"';
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    static char buf[32768];
    char *p = buf;
    p +=
        sprintf(p, "{\"model\":{\"type\":\"BPE\",\"byte_fallback\":true,\"merges\":[],\"vocab\":{");
    for (int b = 0; b < 256; b++) p += sprintf(p, "%s\"<0x%02X>\":%d", b ? "," : "", b, b);
    int n = 256;
    for (size_t i = 0; i < sizeof PIECES / sizeof *PIECES; i++, n++) {
        *p++ = ',';
        put_json_str(&p, PIECES[i]);
        p += sprintf(p, ":%d", n);
    }
    id_special = n;
    id_eos = n + 1;
    n_vocab = n + 2;
    p += sprintf(p,
                 "}},\"added_tokens\":[{\"id\":%d,\"content\":\"[CALL]\",\"special\":true},"
                 "{\"id\":%d,\"content\":\"</s>\",\"special\":true}],\"decoder\":{\"type\":"
                 "\"Sequence\",\"decoders\":[{\"type\":\"ByteFallback\"},{\"type\":\"Fuse\"}]}}",
                 id_special, id_eos);
    char err[256];
    tok = tok_load_from_memory(buf, strlen(buf), NULL, 0, err, sizeof err);
    if (!tok) {
        fprintf(stderr, "fuzz_grammar: tokenizer: %s\n", err);
        abort();
    }
    voc = gram_vocab_new(tok, n_vocab + 3, &id_eos, 1, err, sizeof err);
    if (!voc || !gram_vocab_bytes_complete(voc)) {
        fprintf(stderr, "fuzz_grammar: vocabulary: %s\n", err);
        abort();
    }
    return 0;
}

static uint64_t next(uint64_t *s) {
    uint64_t x = *s += 0x9E3779B97F4A7C15ULL;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
    return x ^ (x >> 31);
}

static void walk(const gram *g, uint64_t seed) {
    gram_match *m = gram_match_new(g, voc);
    if (!m) abort();
    int32_t min = gram_match_min_bytes(m);
    if (min > 400) {
        gram_match_free(m);
        return;
    }
    int32_t budget = min + (int32_t)(next(&seed) % 48);
    if (!budget) budget = 1;
    int32_t words = (gram_vocab_size(voc) + 31) / 32;
    uint32_t *bits = calloc((size_t)words, sizeof *bits);
    for (int32_t step = 0; step < budget; step++) {
        int32_t cnt = gram_match_mask(m, budget - step, bits);
        if (cnt <= 0) {
            fprintf(stderr, "no token allowed at step %d of %d (%d bytes to go)\n", step, budget,
                    gram_match_min_bytes(m));
            abort();
        }
        int64_t k = (int64_t)(next(&seed) % (uint64_t)cnt);
        int32_t t = -1;
        for (int32_t w = 0; w < words && t < 0; w++) {
            int c = __builtin_popcount(bits[w]);
            if (k < c) {
                uint32_t x = bits[w];
                for (; k; k--) x &= x - 1;
                t = w * 32 + __builtin_ctz(x);
            }
            k -= c;
        }
        if (t == id_eos) break;
        if (gram_match_accept(m, t)) {
            fprintf(stderr, "allowed token %d refused\n", t);
            abort();
        }
        if (gram_match_min_bytes(m) > budget - step - 1) abort();
    }
    if (gram_match_status(m) == GRAM_MORE) {
        fprintf(stderr, "incomplete after %d tokens\n", budget);
        abort();
    }
    free(bits);
    gram_match_free(m);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!size) return 0;
    int mode = data[0] % 3;
    data++;
    size--;
    size_t cut = 0;
    char marker[9] = {0};
    if (mode == 2) { /* a marker of up to 8 bytes, then the schema */
        cut = size < 8 ? size : (size_t)(data[0] % 9);
        if (cut > size) cut = size;
        memcpy(marker, data, cut);
    }
    json_tokener *tk = json_tokener_new_ex(64);
    json_object *schema = json_tokener_parse_ex(tk, (const char *)data + cut, (int)(size - cut));
    json_tokener_free(tk);
    if (!schema && mode == 0 && size - cut == 0) return 0;
    char err[512];
    gram *g = gram_json(schema, err, sizeof err);
    if (!g && !err[0]) abort(); /* a refusal names its reason */
    if (g && mode == 1) {
        gram *parts[2] = {gram_lit("x[CALL]", 7), g};
        g = gram_seq(parts, 2);
    } else if (g && mode == 2) {
        gram *parts[2] = {gram_until(marker, cut), g};
        g = gram_seq(parts, 2);
    }
    if (g) {
        uint64_t seed = 1469598103934665603ULL;
        for (size_t i = 0; i < size; i++) seed = (seed ^ data[i]) * 1099511628211ULL;
        walk(g, seed);
    }
    gram_free(g);
    json_object_put(schema);
    return 0;
}
