/* Unit tests of the tokenizer internals that need no downloaded tokenizer: the hash maps, the
 * priority-queue BPE merge (against a quadratic reference, and for speed on long words), the
 * streaming UTF-8 handling, and malformed tokenizer.json inputs (each must fail with a clear
 * message, never crash). */
#include "tok_internal.h"
#include "tokenizer.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static int failures;

#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);                                   \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fprintf(stderr, "\n");                                                                 \
            failures++;                                                                            \
        }                                                                                          \
    } while (0)

static uint64_t rng = 88172645463325252ULL;
static uint32_t rnd(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng >> 11);
}

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ---- hash maps ---- */

static void test_strmap(void) {
    tok_strmap m = {0};
    tok_arena a = {0};
    CHECK(strmap_init(&m, 4) == 0, "init");
    enum { N = 100000 };
    char buf[32];
    for (int i = 0; i < N; i++) {
        int k = snprintf(buf, sizeof buf, "key%d", i);
        char *s = arena_strdup(&a, buf, (size_t)k);
        CHECK(s && strmap_put(&m, s, (size_t)k, i) == 0, "put %d", i);
    }
    CHECK(m.n == N, "count %zu", m.n);
    for (int i = 0; i < N; i++) {
        int k = snprintf(buf, sizeof buf, "key%d", i);
        if (strmap_get(&m, buf, (size_t)k) != i) {
            CHECK(0, "get key%d", i);
            break;
        }
    }
    CHECK(strmap_get(&m, "key", 3) == -1, "absent key found");
    CHECK(strmap_get(&m, "key100000", 9) == -1, "absent key found");
    /* overwrite keeps the count; empty and NUL-containing keys are keys like any other */
    CHECK(strmap_put(&m, "key7", 4, -5) == 0 && strmap_get(&m, "key7", 4) == -5, "overwrite");
    CHECK(m.n == N, "overwrite changed the count");
    CHECK(strmap_put(&m, "", 0, 42) == 0 && strmap_get(&m, "", 0) == 42, "empty key");
    static const char nul[] = {'a', 0, 'b'};
    CHECK(strmap_put(&m, nul, 3, 43) == 0 && strmap_get(&m, nul, 3) == 43, "NUL key");
    CHECK(strmap_get(&m, nul, 1) == -1, "prefix of NUL key");
    strmap_free(&m);
    arena_free(&a);
}

static void test_u64map(void) {
    tok_u64map m = {0};
    CHECK(u64map_init(&m, 1) == 0, "init");
    enum { N = 200000 };
    for (uint64_t i = 0; i < N; i++) {
        uint64_t key = i * 0x9E3779B97F4A7C15ULL; /* includes key 0 */
        CHECK(u64map_put(&m, key, i + 1) == 0, "put");
    }
    uint64_t v;
    for (uint64_t i = 0; i < N; i++)
        if (!u64map_get(&m, i * 0x9E3779B97F4A7C15ULL, &v) || v != i + 1) {
            CHECK(0, "get %llu", (unsigned long long)i);
            break;
        }
    CHECK(!u64map_get(&m, 12345, &v), "absent key found");
    CHECK(u64map_put(&m, UINT64_MAX, 1) != 0, "the reserved key must be refused");
    CHECK(!u64map_get(&m, UINT64_MAX, &v), "reserved key found");
    CHECK(u64map_put(&m, 0, 77) == 0 && u64map_get(&m, 0, &v) && v == 77, "overwrite key 0");
    u64map_free(&m);
}

/* ---- BPE merge ---- */

/* The textbook algorithm: repeatedly merge the adjacent pair of lowest rank, leftmost first. */
static size_t naive_merge(const tok_u64map *merges, int32_t *s, size_t n) {
    for (;;) {
        uint64_t best_rank = UINT64_MAX;
        size_t best = 0;
        int32_t best_id = -1;
        for (size_t i = 0; i + 1 < n; i++) {
            uint64_t v;
            if (u64map_get(merges, (uint64_t)(uint32_t)s[i] << 32 | (uint32_t)s[i + 1], &v) &&
                (v >> 32) < best_rank) {
                best_rank = v >> 32;
                best = i;
                best_id = (int32_t)(uint32_t)v;
            }
        }
        if (best_id < 0) return n;
        s[best] = best_id;
        memmove(s + best + 1, s + best + 2, (n - best - 2) * sizeof *s);
        n--;
    }
}

static void test_bpe_merge(void) {
    /* random merge tables over a 4-symbol alphabet, random words */
    for (int round = 0; round < 50; round++) {
        tok_u64map m = {0};
        u64map_init(&m, 64);
        int32_t next_id = 4;
        int32_t known[256] = {0, 1, 2, 3};
        size_t nk = 4;
        uint32_t rank = 0;
        for (int k = 0; k < 40 && nk < 250; k++) {
            int32_t a = known[rnd() % nk], b = known[rnd() % nk];
            uint64_t key = (uint64_t)(uint32_t)a << 32 | (uint32_t)b, v;
            if (u64map_get(&m, key, &v)) continue;
            u64map_put(&m, key, (uint64_t)rank++ << 32 | (uint32_t)next_id);
            known[nk++] = next_id++;
        }
        for (int w = 0; w < 200; w++) {
            int32_t a[64], b[64];
            size_t n = 1 + rnd() % 64;
            for (size_t i = 0; i < n; i++) a[i] = b[i] = (int32_t)(rnd() % 4);
            size_t na = tok_bpe_merge(&m, a, n), nb = naive_merge(&m, b, n);
            if (na != nb || memcmp(a, b, na * sizeof *a) != 0) {
                CHECK(0, "priority-queue merge differs from the reference (round %d word %d)",
                      round, w);
                round = 1000;
                break;
            }
        }
        u64map_free(&m);
    }

    /* a 200k-symbol word must not take quadratic time: merges a+a, aa+aa, ... and one that
     * only applies at the end */
    tok_u64map m = {0};
    u64map_init(&m, 32);
    for (int32_t k = 0; k < 16; k++)
        u64map_put(&m, (uint64_t)(uint32_t)k << 32 | (uint32_t)k,
                   (uint64_t)(uint32_t)k << 32 | (uint32_t)(k + 1));
    size_t n = 200000;
    int32_t *w = malloc(n * sizeof *w);
    for (size_t i = 0; i < n; i++) w[i] = 0;
    double t0 = now();
    size_t k = tok_bpe_merge(&m, w, n);
    double dt = now() - t0;
    /* 200000 = 3*65536 + 3392: three 65536-runs and the binary digits of 3392 */
    CHECK(k == 7, "long word merged into %zu symbols, not 3 + popcount(3392) = 7", k);
    CHECK(dt < 2.0, "merging a 200k-symbol word took %.2f s", dt);
    free(w);
    u64map_free(&m);
}

/* ---- UTF-8 helpers ---- */

static void test_utf8(void) {
#define R3 "\xEF\xBF\xBD"
    static const struct {
        const char *in;
        size_t n;
        const char *out;
        size_t on;
    } cases[] = {
        {"abc", 3, "abc", 3},
        {"\xE2\x82\xAC", 3, "\xE2\x82\xAC", 3},
        {"\xE2\x82", 2, R3, 3}, /* truncated: one U+FFFD for the maximal subpart */
        {"\xE2\x82x", 3, R3 "x", 4},
        {"\xF0\x80\x80\x80", 4, R3 R3 R3 R3, 12}, /* overlong */
        {"\xED\xA0\x80", 3, R3 R3 R3, 9},         /* surrogate */
        {"\xF4\x90\x80\x80", 4, R3 R3 R3 R3, 12}, /* above U+10FFFF */
        {"\xFF\xC0", 2, R3 R3, 6},
        {"a\x00"
         "b",
         3,
         "a\x00"
         "b",
         3},
    };
#undef R3
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        tok_sbuf b = {0};
        utf8_append_lossy(&b, cases[i].in, cases[i].n);
        CHECK(b.n == cases[i].on && memcmp(b.p, cases[i].out, b.n) == 0, "lossy case %zu", i);
        sbuf_free(&b);
    }
}

/* ---- a small valid tokenizer, and malformed variants ---- */

static const char SMALL[] =
    "{\"version\":\"1.0\",\"added_tokens\":[{\"id\":6,\"content\":\"<s>\",\"special\":true}],"
    "\"normalizer\":null,\"pre_tokenizer\":{\"type\":\"ByteLevel\",\"add_prefix_space\":false,"
    "\"use_regex\":true},\"post_processor\":null,\"decoder\":{\"type\":\"ByteLevel\"},"
    "\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1,\"ab\":2,\"\xC4\xA0\":3,"
    "\"\xC4\xA0"
    "ab\":4,\"c\":5},\"merges\":[\"a b\",[\"\xC4\xA0\",\"ab\"]]}}";

static void test_small(void) {
    char err[256];
    tok_tokenizer *t = tok_load_from_memory(SMALL, sizeof SMALL - 1, NULL, 0, err, sizeof err);
    CHECK(t != NULL, "small tokenizer: %s", err);
    if (!t) return;
    int32_t *ids;
    size_t n;
    CHECK(tok_encode(t, "ab ab<s>c", 9, false, &ids, &n) == 0, "encode");
    int32_t want[] = {2, 4, 6, 5};
    CHECK(n == 4 && memcmp(ids, want, sizeof want) == 0, "small encode got %zu ids", n);
    size_t len;
    char *s = tok_decode(t, ids, n, false, &len);
    CHECK(s && strcmp(s, "ab ab<s>c") == 0, "small decode '%s'", s ? s : "(null)");
    free(s);
    s = tok_decode(t, ids, n, true, &len);
    CHECK(s && strcmp(s, "ab abc") == 0, "small decode skipping specials '%s'", s ? s : "(null)");
    free(s);
    free(ids);
    /* characters outside the vocabulary (no unk, no byte fallback) are dropped, as in
     * tokenizers; invalid UTF-8 input becomes U+FFFD first, never undefined behaviour */
    CHECK(tok_encode(t,
                     "a\xFF\xFE"
                     "b",
                     4, false, &ids, &n) == 0,
          "encode invalid UTF-8");
    free(ids);
    CHECK(tok_encode(t, NULL, 0, true, &ids, &n) == 0 && n == 0 && !ids, "empty input");
    CHECK(tok_vocab_size(t) == 7, "vocab size %zu", tok_vocab_size(t));
    CHECK(tok_is_special(t, 6) && !tok_is_special(t, 2) && !tok_is_special(t, 99), "is_special");
    CHECK(tok_piece_to_token(t, "<s>", 3) == 6 && tok_piece_to_token(t, "zz", 2) == -1, "lookup");
    const char *p = tok_token_to_piece(t, 4, &len);
    CHECK(p && len == 4 &&
              memcmp(p,
                     "\xC4\xA0"
                     "ab",
                     4) == 0,
          "token_to_piece");
    CHECK(tok_token_to_piece(t, -1, &len) == NULL && tok_token_to_piece(t, 7, &len) == NULL,
          "token_to_piece out of range");
    tok_free(t);
}

typedef struct {
    const char *json, *config, *expect;
} bad_case;

/* Formats the next of a few scratch JSON texts. */
__attribute__((format(printf, 3, 4))) static const char *jfmt(char (*buf)[512], int *k,
                                                              const char *fmt, ...) {
    char *b = buf[(*k)++];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(b, 512, fmt, ap);
    va_end(ap);
    return b;
}

static void test_malformed(void) {
    const char *M =
        "\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1,\"ab\":2},\"merges\":[\"a b\"]}";
    static char buf[16][512];
    static int k;
    k = 0;
#define J(...) jfmt(buf, &k, __VA_ARGS__)
    const bad_case cases[] = {
        {"", NULL, "invalid JSON at line 1, column 1"},
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0", NULL, "truncated"},
        {"{\"model\": {}}}", NULL, "invalid JSON"},
        {"[1, 2]", NULL, "must hold a JSON object"},
        {"{}", NULL, "model: must be an object"},
        {"{\"model\":{\"type\":\"Unigram\",\"vocab\":[]}}", NULL,
         "unsupported model type \"Unigram\""},
        {"{\"model\":{\"type\":\"WordPiece\",\"vocab\":{}}}", NULL, "unsupported model type"},
        {"{\"model\":{\"type\":\"BPE\",\"vocab\":[[\"a\",0]],\"merges\":[]}}", NULL,
         "model.vocab: must be an object"},
        {"{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":\"0\"},\"merges\":[]}}", NULL,
         "id of \"a\" must be an integer"},
        {"{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":-3},\"merges\":[]}}", NULL, "out of range"},
        {"{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":99999999999},\"merges\":[]}}", NULL,
         "out of range"},
        {"{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[\"a zz\"]}}", NULL,
         "model.merges[0]: token \"zz\" is not in the vocabulary"},
        {"{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1},\"merges\":[\"a b\"]}}", NULL,
         "merged token \"ab\" is not in the vocabulary"},
        {"{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[\"ab\"]}}", NULL,
         "two tokens separated by one space"},
        {"{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[[\"a\"]]}}", NULL,
         "must be a string \"a b\" or a pair [a, b]"},
        {"{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":{}}}", NULL,
         "model.merges: must be an array"},
        {"{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"unk_token\":\"<unk>\"}}", NULL,
         "model.unk_token: \"<unk>\" is not in the vocabulary"},
        {"{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"byte_fallback\":\"yes\"}}", NULL,
         "\"byte_fallback\" must be a boolean"},
        {J("{%s,\"added_tokens\":{}}", M), NULL, "added_tokens: must be an array"},
        {J("{%s,\"added_tokens\":[{\"id\":\"5\",\"content\":\"x\"}]}", M), NULL,
         "added_tokens[0]: \"id\" must be an integer"},
        {J("{%s,\"added_tokens\":[{\"id\":5}]}", M), NULL, "missing string \"content\""},
        {J("{%s,\"normalizer\":{\"type\":\"Precompiled\"}}", M), NULL,
         "normalizer: unsupported normalizer type \"Precompiled\""},
        {J("{%s,\"normalizer\":{\"type\":\"Sequence\",\"normalizers\":[{\"type\":\"NFC\"},7]}}", M),
         NULL, "normalizer.normalizers[1]: must be an object"},
        {J("{%s,\"pre_tokenizer\":{\"type\":\"Split\",\"pattern\":{\"Regex\":\"(a\"},"
           "\"behavior\":\"Isolated\"}}",
           M),
         NULL, "pre_tokenizer.pattern: bad regular expression"},
        {J("{%s,\"pre_tokenizer\":{\"type\":\"Split\",\"pattern\":{\"String\":\"a\"},"
           "\"behavior\":\"Sideways\"}}",
           M),
         NULL, "unknown split behavior \"Sideways\""},
        {J("{%s,\"pre_tokenizer\":{\"type\":\"Split\",\"pattern\":\"a\"}}", M), NULL,
         "pre_tokenizer.pattern: must be an object"},
        {J("{%s,\"decoder\":{\"type\":\"WordPiece\"}}", M), NULL,
         "decoder: unsupported decoder type \"WordPiece\""},
        {J("{%s,\"decoder\":{\"type\":\"Strip\",\"content\":\"ab\",\"start\":1,\"stop\":0}}", M),
         NULL, "exactly one character"},
        {J("{%s,\"post_processor\":{\"type\":\"TemplateProcessing\",\"single\":[{\"SpecialToken\":"
           "{\"id\":\"<s>\",\"type_id\":0}}],\"special_tokens\":{}}}",
           M),
         NULL, "special token \"<s>\" has no \"ids\""},
        {J("{%s,\"post_processor\":{\"type\":\"BertProcessing\",\"sep\":[\"x\"]}}", M), NULL,
         "cls/sep must be [token, id]"},
        {J("{%s}", M), "{\"bos_token\": 7}", "tokenizer_config.json: bos_token: must be a string"},
        {J("{%s}", M), "{\"add_bos_token\": 1}", "\"add_bos_token\" must be a boolean"},
        {J("{%s}", M), "{\"bos_token\": ", "tokenizer_config.json: invalid JSON"},
        {"{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0}},\"model\":7}", NULL,
         "model: must be an object"},
        {"{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0}}} trailing", NULL, "invalid JSON"},
        {"{\"model\":{\"type\":\"BPE\",\"vocab\":{\"\xFF\":0}}}", NULL, "invalid JSON"},
    };
#undef J
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char err[512] = "";
        const bad_case *c = &cases[i];
        tok_tokenizer *t = tok_load_from_memory(c->json, strlen(c->json), c->config,
                                                c->config ? strlen(c->config) : 0, err, sizeof err);
        CHECK(t == NULL, "malformed case %zu loaded: %s", i, c->json);
        CHECK(strstr(err, c->expect) != NULL, "malformed case %zu: message '%s' lacks '%s'", i, err,
              c->expect);
        tok_free(t);
    }
    /* a tiny error buffer truncates but still terminates */
    char small[8];
    CHECK(tok_load_from_memory("{", 1, NULL, 0, small, sizeof small) == NULL &&
              strlen(small) < sizeof small,
          "short error buffer");
    CHECK(tok_load_from_memory("{", 1, NULL, 0, NULL, 0) == NULL, "no error buffer");
}

static void test_load_dir(void) {
    char err[512];
    tok_tokenizer *t = tok_load("/nonexistent/lmhost-tok", err, sizeof err);
    CHECK(!t && strstr(err, "/nonexistent/lmhost-tok/tokenizer.json") &&
              strstr(err, "No such file"),
          "missing dir: '%s'", err);
    char dir[] = "/tmp/lmhost-tok-XXXXXX";
    if (!mkdtemp(dir)) return;
    char path[600];
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    FILE *f = fopen(path, "w");
    fputs(SMALL, f);
    fclose(f);
    t = tok_load(dir, err, sizeof err);
    CHECK(t != NULL, "dir without config: %s", err);
    tok_free(t);
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    f = fopen(path, "w");
    fputs("{\"bos_token\": {\"content\": \"<s>\"}, \"eos_token\": \"b\", \"add_bos_token\": true}",
          f);
    fclose(f);
    snprintf(path, sizeof path, "%s/generation_config.json", dir);
    f = fopen(path, "w");
    fputs("{\"eos_token_id\": [1, 5, 6]}", f);
    fclose(f);
    t = tok_load(dir, err, sizeof err);
    CHECK(t != NULL, "dir with configs: %s", err);
    if (t) {
        const int32_t *eos;
        size_t ne = tok_eos_ids(t, &eos);
        CHECK(tok_bos_id(t) == 6, "bos %d", tok_bos_id(t));
        CHECK(ne == 3 && eos[0] == 1 && eos[1] == 5 && eos[2] == 6, "eos list (%zu)", ne);
        CHECK(tok_is_eos(t, 5) && !tok_is_eos(t, 2), "is_eos");
        /* no post-processor: add_bos_token from the config decides */
        int32_t *ids;
        size_t n;
        tok_encode(t, "ab", 2, true, &ids, &n);
        CHECK(n == 2 && ids[0] == 6 && ids[1] == 2, "config BOS");
        free(ids);
        tok_free(t);
    }
    f = fopen(path, "w");
    fputs("{\"eos_token_id\": \"x\"}", f);
    fclose(f);
    t = tok_load(dir, err, sizeof err);
    CHECK(!t && strstr(err, "generation_config.json") && strstr(err, "eos_token_id"),
          "bad generation config: '%s'", err);
    unlink(path);
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    unlink(path);
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    unlink(path);
    rmdir(dir);
}

/* The streaming decoder on a byte-fallback tokenizer: bytes of one character arrive in
 * separate tokens, and invalid runs become one U+FFFD per byte, exactly as batch decoding. */
static void test_stream_bytes(void) {
    static const char J[] =
        "{\"model\":{\"type\":\"BPE\",\"byte_fallback\":true,\"vocab\":{\"<0xE2>\":0,\"<0x82>\":1,"
        "\"<0xAC>\":2,\"\xE2\x96\x81"
        "a\":3,\"<0xF0>\":4,\"b\":5},\"merges\":[]},"
        "\"decoder\":{\"type\":\"Sequence\",\"decoders\":[{\"type\":\"Replace\",\"pattern\":"
        "{\"String\":\"\xE2\x96\x81\"},\"content\":\" \"},{\"type\":\"ByteFallback\"},"
        "{\"type\":\"Fuse\"},{\"type\":\"Strip\",\"content\":\" \",\"start\":1,\"stop\":0}]}}";
    char err[256];
    tok_tokenizer *t = tok_load_from_memory(J, sizeof J - 1, NULL, 0, err, sizeof err);
    CHECK(t != NULL, "byte tokenizer: %s", err);
    if (!t) return;
    static const struct {
        int32_t ids[8];
        size_t n;
        const char *want;
    } cases[] = {
        {{3, 0, 1, 2, 3}, 5, "a\xE2\x82\xAC a"},
        {{0, 1, 2}, 3, "\xE2\x82\xAC"},
        {{0, 1}, 2, "\xEF\xBF\xBD\xEF\xBF\xBD"},
        {{0, 1, 2, 1, 5},
         5,
         "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD"
         "b"},
        {{4, 3}, 2, "\xEF\xBF\xBD a"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        size_t len;
        char *b = tok_decode(t, cases[i].ids, cases[i].n, false, &len);
        CHECK(b && strcmp(b, cases[i].want) == 0, "byte decode case %zu: '%s'", i, b ? b : "");
        tok_stream *s = tok_stream_new(t, false);
        char cat[64] = "";
        for (size_t j = 0; j <= cases[i].n; j++) {
            size_t k;
            const char *c =
                j < cases[i].n ? tok_stream_push(s, cases[i].ids[j], &k) : tok_stream_flush(s, &k);
            strncat(cat, c, sizeof cat - strlen(cat) - 1);
        }
        CHECK(strcmp(cat, cases[i].want) == 0, "byte stream case %zu: '%s'", i, cat);
        tok_stream_free(s);
        free(b);
    }
    tok_free(t);
}

int main(void) {
    test_strmap();
    test_u64map();
    test_bpe_merge();
    test_utf8();
    test_small();
    test_malformed();
    test_load_dir();
    test_stream_bytes();
    if (failures) {
        fprintf(stderr, "%d failure(s)\n", failures);
        return 1;
    }
    printf("tokenizer unit tests: all passed\n");
    return 0;
}
