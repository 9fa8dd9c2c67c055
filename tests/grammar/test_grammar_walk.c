/* Constrained decoding over a real vocabulary (test_grammar_walk NAME: qwen3, llama2, ...):
 * for several schemas and many seeds, random walks over the allowed tokens, as a model with
 * random weights would sample, must end complete within their budget, and the decoded text
 * must parse as strict JSON and validate against the schema. At some states every token is
 * checked against acceptance (mask-refused ones must be refused, a sample of allowed ones
 * accepted). */
#include "gram_test.h"

static const char *const SCHEMAS[] = {
    /* nested objects, optional properties, strings with any Unicode */
    "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},\"age\":{\"type\":"
    "\"integer\"},\"address\":{\"type\":\"object\",\"properties\":{\"city\":{\"type\":"
    "\"string\"},\"zip\":{\"type\":\"string\",\"maxLength\":6}},\"required\":[\"city\"]},"
    "\"active\":{\"type\":\"boolean\"}},\"required\":[\"name\",\"address\"]}",
    /* arrays of objects with bounds */
    "{\"type\":\"array\",\"items\":{\"type\":\"object\",\"properties\":{\"id\":{\"type\":"
    "\"integer\"},\"score\":{\"type\":\"number\"}},\"required\":[\"id\",\"score\"]},"
    "\"minItems\":1,\"maxItems\":4}",
    /* enums and consts of any JSON value */
    "{\"type\":\"object\",\"properties\":{\"unit\":{\"enum\":[\"celsius\",\"fahrenheit\",null,"
    "42,{\"k\":[1,\"\\u00e9\"]}]},\"v\":{\"const\":\"fixed\"}},\"required\":[\"unit\",\"v\"]}",
    /* recursion through $defs */
    "{\"$defs\":{\"node\":{\"type\":\"object\",\"properties\":{\"value\":{\"type\":\"number\"},"
    "\"children\":{\"type\":\"array\",\"items\":{\"$ref\":\"#/$defs/node\"},\"maxItems\":2}},"
    "\"required\":[\"value\"]}},\"$ref\":\"#/$defs/node\"}",
    /* anyOf of different shapes */
    "{\"type\":\"array\",\"items\":{\"anyOf\":[{\"type\":\"string\",\"minLength\":1},{\"type\":"
    "\"number\"},{\"type\":\"null\"},{\"type\":\"object\",\"properties\":{\"k\":{\"type\":"
    "\"boolean\"}},\"required\":[\"k\"]}]},\"maxItems\":6}",
    /* the json_object mode: any object */
    "{\"type\":\"object\"}",
    /* type arrays, tuples */
    "{\"type\":\"array\",\"prefixItems\":[{\"type\":[\"integer\",\"null\"]},{\"type\":"
    "\"boolean\"},{\"type\":\"string\",\"minLength\":2,\"maxLength\":5}],\"minItems\":2}",
    /* a tool call as tool_choice forces it (pydantic's shape, definitions and oneOf) */
    "{\"type\":\"object\",\"properties\":{\"name\":{\"const\":\"get_weather\"},\"arguments\":{"
    "\"$ref\":\"#/definitions/Args\"}},\"required\":[\"name\",\"arguments\"],\"definitions\":{"
    "\"Args\":{\"title\":\"Args\",\"type\":\"object\",\"properties\":{\"location\":{\"type\":"
    "\"string\",\"description\":\"City\"},\"when\":{\"oneOf\":[{\"type\":\"integer\"},{\"type\":"
    "\"null\"}]}},\"required\":[\"location\"],\"additionalProperties\":false}}}",
    /* counted strings, short and longer than any token */
    "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\",\"minLength\":3,"
    "\"maxLength\":40},\"b\":{\"type\":\"string\",\"maxLength\":150}},\"required\":[\"a\","
    "\"b\"]}",
    /* a map */
    "{\"type\":\"object\",\"additionalProperties\":{\"type\":\"array\",\"items\":{\"type\":"
    "\"integer\"},\"maxItems\":3}}",
};

static const tok_tokenizer *T;
static gram_vocab *V;
static int32_t NV, WORDS;
static uint32_t *ONE_BYTE; /* tokens of one byte, to steer walks into structure */

static gram_match *replay(const gram *g, const int32_t *ids, int n) {
    gram_match *m = gram_match_new(g, V);
    for (int i = 0; m && i < n; i++)
        if (gram_match_accept(m, ids[i])) {
            gram_match_free(m);
            return NULL;
        }
    return m;
}

static void check_mask(const gram *g, const int32_t *hist, int n, int32_t budget, uint64_t *rng,
                       const char *what) {
    gram_match *m = replay(g, hist, n);
    GT_CHECK(m, "%s: replay", what);
    if (!m) return;
    uint32_t *bits = calloc((size_t)WORDS, 4), *bud = calloc((size_t)WORDS, 4);
    gram_match_mask(m, budget, bud);
    int32_t cnt = gram_match_mask(m, 1 << 20, bits);
    gram_status st0 = gram_match_status(m);
    int32_t min0 = gram_match_min_bytes(m), checked = 0;
    for (int32_t t = 0; t < NV; t++) {
        if (tok_is_eos(T, t)) {
            GT_CHECK(gt_bit(bits, t) == (st0 != GRAM_MORE), "%s: eos %d", what, t);
            continue;
        }
        if (!gt_bit(bits, t)) {
            if (gram_match_accept(m, t) != -1) {
                GT_CHECK(0, "%s: token %d refused by the mask was accepted", what, t);
                gram_match_free(m);
                m = replay(g, hist, n);
            }
            continue;
        }
        GT_CHECK(!tok_is_special(T, t), "%s: special token %d allowed", what, t);
        /* a sample of the allowed ones, on a copy, also against the budget */
        if (gt_rand(rng) % (uint64_t)(cnt / 64 + 1)) continue;
        gram_match *c = replay(g, hist, n);
        GT_CHECK(c && gram_match_accept(c, t) == 0, "%s: token %d allowed but refused", what, t);
        if (c)
            GT_CHECK(gt_bit(bud, t) == (gram_match_min_bytes(c) <= budget - 1),
                     "%s: token %d at budget %d: allowed %d, %d bytes to go after it", what, t,
                     budget, gt_bit(bud, t), gram_match_min_bytes(c));
        checked++;
        gram_match_free(c);
    }
    GT_CHECK(gram_match_status(m) == st0 && gram_match_min_bytes(m) == min0,
             "%s: refused tokens changed the match", what);
    (void)checked;
    free(bits);
    free(bud);
    gram_match_free(m);
}

/* One walk; returns the decoded text (malloc'd) or NULL. */
static char *walk(const gram *g, uint64_t seed, int extra, bool check, const char *what,
                  size_t *len) {
    uint64_t rng = seed;
    gram_match *m = gram_match_new(g, V);
    int budget = gram_match_min_bytes(m) + (int)(gt_rand(&rng) % (uint64_t)(extra + 1));
    if (!budget) budget = 1;
    int32_t *ids = malloc((size_t)budget * sizeof *ids);
    uint32_t *bits = calloc((size_t)WORDS, 4), *one = calloc((size_t)WORDS, 4);
    char *bytes = malloc((size_t)budget * 256 + 1);
    size_t nb = 0;
    int n = 0;
    for (int step = 0; step < budget; step++) {
        if (check &&
            (step == (int)(seed % 7) || step == 12 + (int)(seed % 13) || budget - step == 3))
            check_mask(g, ids, n, budget - step, &rng, what);
        int32_t cnt = gram_match_mask(m, budget - step, bits);
        if (!cnt) {
            GT_CHECK(0, "%s: nothing allowed at step %d of %d (%d bytes to go)", what, step, budget,
                     gram_match_min_bytes(m));
            break;
        }
        int32_t t = -1;
        if (gt_rand(&rng) % 10 < 3) {
            int32_t c1 = 0;
            for (int32_t w = 0; w < WORDS; w++)
                c1 += __builtin_popcount(one[w] = bits[w] & ONE_BYTE[w]);
            if (c1) t = gt_nth_bit(one, WORDS, (int64_t)(gt_rand(&rng) % (uint64_t)c1));
        }
        if (t < 0) t = gt_nth_bit(bits, WORDS, (int64_t)(gt_rand(&rng) % (uint64_t)cnt));
        if (tok_is_eos(T, t)) {
            GT_CHECK(gram_match_status(m) != GRAM_MORE, "%s: eos allowed before the end", what);
            break;
        }
        if (gram_match_accept(m, t)) {
            GT_CHECK(0, "%s: allowed token %d refused", what, t);
            break;
        }
        GT_CHECK(gram_match_min_bytes(m) <= budget - step - 1, "%s: %d bytes to go, %d tokens",
                 what, gram_match_min_bytes(m), budget - step - 1);
        ids[n++] = t;
        size_t k = 0;
        tok_token_bytes(T, t, bytes + nb, 256, &k);
        nb += k;
    }
    GT_CHECK(gram_match_status(m) != GRAM_MORE, "%s: incomplete after %d tokens (seed %llu)", what,
             budget, (unsigned long long)seed);
    size_t dl = 0;
    char *dec = tok_decode(T, ids, (size_t)n, false, &dl);
    /* SentencePiece decoders drop one space at the very start of a text (Strip) */
    bool same = dec && ((dl == nb && !memcmp(dec, bytes, nb)) ||
                        (dl + 1 == nb && bytes[0] == ' ' && !memcmp(dec, bytes + 1, dl)));
    GT_CHECK(same, "%s: decoded text differs from the token bytes (seed %llu)", what,
             (unsigned long long)seed);
    free(bytes);
    free(ids);
    free(bits);
    free(one);
    gram_match_free(m);
    *len = dl;
    return dec;
}

static void run_schema(const char *js, int n_walks, int extra, int n_check) {
    json_object *s = json_tokener_parse(js);
    char err[512];
    gram *g = gram_json(s, err, sizeof err);
    GT_CHECK(g, "schema %.60s: %s", js, err);
    for (int w = 0; g && w < n_walks; w++) {
        char what[96];
        snprintf(what, sizeof what, "%.40s... walk %d", js, w);
        size_t n;
        char *text = walk(g, 1 + (uint64_t)w * 7919, extra, w < n_check, what, &n);
        json_object *doc;
        bool ok = text && gt_parse_strict(text, n, &doc);
        GT_CHECK(ok, "%s: not JSON: %s", what, text ? text : "(null)");
        if (getenv("GRAMMAR_VERBOSE")) printf("    %s\n", text ? text : "");
        if (ok) {
            GT_CHECK(gt_valid(doc, s, s, 0), "%s: invalid: %s", what, text);
            GT_CHECK(gt_whitespace_ok(text, n), "%s: whitespace: %s", what, text);
            json_object_put(doc);
        }
        free(text);
    }
    gram_free(g);
    json_object_put(s);
}

/* Free text up to a marker, then a JSON document (a think section before the answer). */
static void run_until(int n_walks) {
    json_object *s = json_tokener_parse("{\"type\":\"object\",\"properties\":{\"a\":{\"type\":"
                                        "\"integer\"}},\"required\":[\"a\"]}");
    gram *parts[3] = {gram_until("</think>", 8), gram_lit("\n\n", 2), gram_json(s, NULL, 0)};
    gram *g = gram_seq(parts, 3);
    GT_CHECK(g, "until seq");
    for (int w = 0; g && w < n_walks; w++) {
        size_t n;
        char *text = walk(g, 99 + (uint64_t)w, 40, w == 0, "think+json", &n);
        const char *end = text ? strstr(text, "</think>\n\n") : NULL;
        GT_CHECK(end, "think+json: no marker: %s", text ? text : "");
        if (end) {
            const char *j = end + 10;
            json_object *doc;
            bool ok = gt_parse_strict(j, n - (size_t)(j - text), &doc);
            GT_CHECK(ok && gt_valid(doc, s, s, 0), "think+json: %s", text);
            json_object_put(doc);
        }
        free(text);
    }
    gram_free(g);
    json_object_put(s);
}

int main(int argc, char **argv) {
    const char *name = argc > 1 ? argv[1] : "qwen3";
    tok_tokenizer *t = gt_load_tokenizer(name);
    if (!t) return 1;
    T = t;
    const int32_t *eos;
    size_t n_eos = tok_eos_ids(t, &eos);
    NV = (int32_t)tok_vocab_size(t) + 37; /* models pad their vocabulary */
    WORDS = (NV + 31) / 32;
    char err[512];
    double t0 = gt_now();
    V = gram_vocab_new(t, NV, eos, (int)n_eos, err, sizeof err);
    if (!V) {
        fprintf(stderr, "FAIL: vocab: %s\n", err);
        return 1;
    }
    printf("%s: vocabulary of %d in %.0f ms\n", name, (int)NV, (gt_now() - t0) * 1e3);
    GT_CHECK(gram_vocab_bytes_complete(V), "%s: every byte a token", name);
    ONE_BYTE = calloc((size_t)WORDS, 4);
    for (int32_t id = 0; id < (int32_t)tok_vocab_size(t); id++) {
        size_t k = 0;
        if (!tok_token_bytes(t, id, NULL, 0, &k) && k == 1 && !tok_is_special(t, id))
            ONE_BYTE[id >> 5] |= 1u << (id & 31);
    }
    int walks = GT_SANITIZED ? 16 : 40, checks = GT_SANITIZED ? 2 : 3;
    for (size_t i = 0; i < sizeof SCHEMAS / sizeof *SCHEMAS; i++) {
        double a = gt_now();
        run_schema(SCHEMAS[i], walks, 120, checks);
        printf("  schema %zu: %d walks in %.0f ms\n", i, walks, (gt_now() - a) * 1e3);
    }
    run_until(GT_SANITIZED ? 2 : 6);
    free(ONE_BYTE);
    gram_vocab_free(V);
    tok_free(t);
    if (gt_failures) {
        fprintf(stderr, "%d failures\n", gt_failures);
        return 1;
    }
    printf("%s: grammar walks passed\n", name);
    return 0;
}
