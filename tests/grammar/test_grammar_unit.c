/* The constrained-decoding engine on a small vocabulary of its own (every byte, some
 * multi-byte pieces, a special token, an end-of-sequence token, a non-special added one):
 * builders' semantics, schema errors, the special-token rule, a vocabulary larger than the
 * tokenizer's, the mask against token-by-token acceptance for every token, and random walks
 * that must end complete within their budget. */
#include "gram_test.h"

#define N_PIECES (sizeof PIECES / sizeof *PIECES)

/* Multi-byte pieces (with byte fallback for everything else). */
static const char *const PIECES[] = {
    "{",       "}",     "\"",       "{\"",
    "\":",     "\": ",  ", \"",     ",\"",
    "true",    "false", "null",     "na",
    "me",      "name",  "age",      "12",
    "3.5",     "e+",    "\xC3\xA9", "\\n",
    "\\u00",   "ab",    "abc",      "\"}",
    "\"]",     "[\"",   "], ",      "[TOOL",
    "_CALLS]", "think", "</",       "</think>",
    "0",       "-",     "]",        "[",
    ",",       ":",     " ",        "hello",
    "hel",     "lo",    "x\"y",     "\xE4\xB8\xAD",
    "\\\"",    "\\u",   "d83d",     "\\uD83D",
    "\\uDE00", "a\nb",  "tru",      "e",
    "00",
};
#define SPECIAL_TEXT "[TOOL_CALLS]"
#define ADDED_TEXT   "<tool>"
#define EOS_TEXT     "</s>"

static int32_t ID_SPECIAL, ID_ADDED, ID_EOS, N_TOK;

static void json_str(char **p, const char *s) {
    *(*p)++ = '"';
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') {
            *(*p)++ = '\\';
            *(*p)++ = (char)c;
        } else if (c < 0x20) {
            *p += sprintf(*p, "\\u%04x", c);
        } else {
            *(*p)++ = (char)c;
        }
    }
    *(*p)++ = '"';
}

static tok_tokenizer *small_tokenizer(void) {
    char *buf = malloc(65536), *p = buf;
    p +=
        sprintf(p, "{\"model\":{\"type\":\"BPE\",\"byte_fallback\":true,\"merges\":[],\"vocab\":{");
    for (int b = 0; b < 256; b++) p += sprintf(p, "%s\"<0x%02X>\":%d", b ? "," : "", b, b);
    for (size_t i = 0; i < N_PIECES; i++) {
        *p++ = ',';
        json_str(&p, PIECES[i]);
        p += sprintf(p, ":%d", 256 + (int)i);
    }
    int n = 256 + (int)N_PIECES;
    ID_SPECIAL = n;
    ID_ADDED = n + 1;
    ID_EOS = n + 2;
    N_TOK = n + 3;
    p += sprintf(p,
                 "}},\"added_tokens\":[{\"id\":%d,\"content\":\"" SPECIAL_TEXT
                 "\",\"special\":true},{\"id\":%d,\"content\":\"" ADDED_TEXT
                 "\",\"special\":false},{\"id\":%d,\"content\":\"" EOS_TEXT
                 "\",\"special\":true}],\"decoder\":{\"type\":\"Sequence\",\"decoders\":[{"
                 "\"type\":\"ByteFallback\"},{\"type\":\"Fuse\"}]}}",
                 ID_SPECIAL, ID_ADDED, ID_EOS);
    char err[512];
    tok_tokenizer *t = tok_load_from_memory(buf, strlen(buf), NULL, 0, err, sizeof err);
    if (!t) fprintf(stderr, "FAIL: small tokenizer: %s\n", err);
    free(buf);
    return t;
}

static tok_tokenizer *T;
static gram_vocab *V;
static int32_t NV, WORDS;

static size_t tbytes(int32_t id, char *buf, size_t cap) {
    size_t n = 0;
    if (tok_token_bytes(T, id, buf, cap, &n)) return 0;
    return n < cap ? n : cap;
}

/* A new match that has accepted ids[0..n). */
static gram_match *replay(const gram *g, const int32_t *ids, int n) {
    gram_match *m = gram_match_new(g, V);
    for (int i = 0; m && i < n; i++)
        if (gram_match_accept(m, ids[i])) {
            gram_match_free(m);
            return NULL;
        }
    return m;
}

/* The token whose bytes are exactly s (a piece, else the byte token), or -1. */
static int32_t tok_of(const char *s) {
    size_t n = strlen(s);
    char buf[64];
    for (int32_t id = 256; id < N_TOK; id++)
        if (tbytes(id, buf, sizeof buf) == n && !memcmp(buf, s, n) && id != ID_SPECIAL) return id;
    return n == 1 ? (unsigned char)s[0] : -1;
}

/* Feeds text byte by byte; returns 0 when all were accepted. */
static int feed_text(gram_match *m, const char *s) {
    for (; *s; s++)
        if (gram_match_accept(m, (unsigned char)*s)) return -1;
    return 0;
}

/* Whether the grammar accepts exactly text (as bytes) as a complete output. */
static bool accepts(const gram *g, const char *text) {
    gram_match *m = gram_match_new(g, V);
    bool ok = m && !feed_text(m, text) && gram_match_status(m) != GRAM_MORE;
    gram_match_free(m);
    return ok;
}

static bool is_prefix(const gram *g, const char *text) {
    gram_match *m = gram_match_new(g, V);
    bool ok = m && !feed_text(m, text);
    gram_match_free(m);
    return ok;
}

/* Every token against the mask at this state: allowed ones are accepted (checked on a
 * replayed copy) and leave a completion within the budget; refused ones are refused. */
static void check_mask(const gram *g, const int32_t *hist, int n, int32_t budget,
                       const char *what) {
    gram_match *m = replay(g, hist, n);
    GT_CHECK(m, "%s: replay failed", what);
    if (!m) return;
    uint32_t *bits = calloc((size_t)WORDS, 4), *big = calloc((size_t)WORDS, 4);
    int32_t cnt = gram_match_mask(m, budget, bits);
    gram_match_mask(m, 1 << 20, big);
    int32_t pop = 0;
    for (int32_t w = 0; w < WORDS; w++) pop += __builtin_popcount(bits[w]);
    GT_CHECK(pop == cnt, "%s: mask count %d, bits %d", what, cnt, pop);
    gram_status st0 = gram_match_status(m);
    int32_t min0 = gram_match_min_bytes(m);
    for (int32_t t = 0; t < NV; t++) {
        bool allowed = gt_bit(bits, t), ab = gt_bit(big, t);
        GT_CHECK(!allowed || ab, "%s: token %d allowed at budget %d, not at a large one", what, t,
                 budget);
        if (t == ID_EOS) {
            GT_CHECK(ab == (st0 != GRAM_MORE), "%s: eos allowed %d with status %d", what, ab, st0);
            continue;
        }
        if (!ab) {
            GT_CHECK(gram_match_accept(m, t) == -1, "%s: token %d refused by the mask accepted",
                     what, t);
            GT_CHECK(gram_match_status(m) == st0 && gram_match_min_bytes(m) == min0,
                     "%s: a refused token changed the match", what);
            continue;
        }
        gram_match *c = replay(g, hist, n);
        int rc = c ? gram_match_accept(c, t) : -2;
        GT_CHECK(rc == 0, "%s: token %d allowed by the mask refused (%d)", what, t, rc);
        if (!rc) {
            int32_t mb = gram_match_min_bytes(c);
            GT_CHECK(allowed == (mb <= budget - 1),
                     "%s: token %d allowed %d at budget %d with %d bytes to complete after it",
                     what, t, allowed, budget, mb);
        }
        gram_match_free(c);
    }
    free(bits);
    free(big);
    gram_match_free(m);
}

/* Random walks: every step has a token, the end is complete, the mask agrees with
 * acceptance on the way (every token at a few states). */
static void walks(const gram *g, json_object *schema, const char *what, int n_walks, int budget,
                  bool check) {
    uint32_t *bits = calloc((size_t)WORDS, 4);
    int32_t *hist = malloc((size_t)(budget + 4096) * sizeof *hist);
    char *text = malloc((size_t)(budget + 4096) * 64 + 1);
    for (int w = 0; w < n_walks; w++) {
        uint64_t rng = 77 + (uint64_t)w * 1000003;
        gram_match *m = gram_match_new(g, V);
        /* a budget from the shortest document up */
        int b = gram_match_min_bytes(m) + (int)(gt_rand(&rng) % (uint64_t)budget);
        if (!b) b = 1;
        int n = 0;
        size_t tn = 0;
        bool eos = false;
        for (int step = 0; step < b; step++) {
            if (check && gt_rand(&rng) % 16 == 0) check_mask(g, hist, n, b - step, what);
            int32_t cnt = gram_match_mask(m, b - step, bits);
            if (!cnt) {
                GT_CHECK(0, "%s: no token allowed at step %d of %d (min %d)", what, step, b,
                         gram_match_min_bytes(m));
                break;
            }
            int32_t t = gt_nth_bit(bits, WORDS, (int64_t)(gt_rand(&rng) % (uint64_t)cnt));
            if (t == ID_EOS) {
                eos = true;
                break;
            }
            GT_CHECK(gram_match_accept(m, t) == 0, "%s: accept refused allowed token %d", what, t);
            GT_CHECK(gram_match_min_bytes(m) <= b - step - 1, "%s: %d bytes left, %d tokens", what,
                     gram_match_min_bytes(m), b - step - 1);
            hist[n++] = t;
            tn += tbytes(t, text + tn, 64);
        }
        text[tn] = 0;
        GT_CHECK(gram_match_status(m) != GRAM_MORE, "%s: incomplete after %d tokens: %s", what, b,
                 text);
        (void)eos;
        if (schema) {
            json_object *doc;
            bool parsed = gt_parse_strict(text, tn, &doc);
            GT_CHECK(parsed, "%s: not JSON: %s", what, text);
            if (parsed) {
                json_object *s = json_object_is_type(schema, json_type_null) ? NULL : schema;
                GT_CHECK(!s || gt_valid(doc, s, s, 0), "%s: not valid: %s", what, text);
                GT_CHECK(gt_whitespace_ok(text, tn), "%s: whitespace: %s", what, text);
            }
            json_object_put(doc);
        }
        gram_match_free(m);
    }
    free(bits);
    free(hist);
    free(text);
}

static gram *schema_gram(const char *js, json_object **out) {
    json_object *s = json_tokener_parse(js);
    char err[512];
    gram *g = gram_json(s, err, sizeof err);
    GT_CHECK(g, "schema %s: %s", js, err);
    if (out)
        *out = s;
    else
        json_object_put(s);
    return g;
}

static void expect_error(const char *js, const char *want) {
    json_object *s = json_tokener_parse(js);
    char err[512] = "";
    GT_CHECK(s, "bad test schema %s", js);
    gram *g = gram_json(s, err, sizeof err);
    GT_CHECK(!g, "schema %s compiled", js);
    GT_CHECK(strstr(err, want), "schema %s: error \"%s\" lacks \"%s\"", js, err, want);
    gram_free(g);
    json_object_put(s);
}

static void test_token_bytes(void) {
    char buf[64];
    GT_CHECK(tbytes(0x41, buf, sizeof buf) == 1 && buf[0] == 'A', "<0x41>");
    GT_CHECK(tbytes(0xE4, buf, sizeof buf) == 1 && (unsigned char)buf[0] == 0xE4, "<0xE4>");
    size_t n = tbytes(tok_of("name"), buf, sizeof buf);
    GT_CHECK(n == 4 && !memcmp(buf, "name", 4), "piece");
    n = tbytes(ID_ADDED, buf, sizeof buf);
    GT_CHECK(n == strlen(ADDED_TEXT) && !memcmp(buf, ADDED_TEXT, n), "added token");
    size_t len = 0;
    GT_CHECK(tok_token_bytes(T, N_TOK + 5, NULL, 0, &len) == -1, "unknown id");
    GT_CHECK(tok_token_bytes(T, tok_of("name"), buf, 2, &len) == 0 && len == 4 &&
                 !memcmp(buf, "na", 2),
             "short buffer");
}

static void test_literals(void) {
    gram *g = gram_lit("hello", 5);
    GT_CHECK(accepts(g, "hello") && !accepts(g, "hell") && is_prefix(g, "hel") &&
                 !is_prefix(g, "hex") && !is_prefix(g, "hello!"),
             "literal");
    gram_match *m = gram_match_new(g, V);
    GT_CHECK(gram_match_min_bytes(m) == 5 && gram_match_status(m) == GRAM_MORE, "literal min");
    uint32_t *bits = calloc((size_t)WORDS, 4);
    int32_t n = gram_match_mask(m, 100, bits);
    /* 'h', "hel", "hello" */
    GT_CHECK(n == 3 && gt_bit(bits, 'h') && gt_bit(bits, tok_of("hello")) &&
                 gt_bit(bits, tok_of("hel")),
             "literal mask %d", n);
    /* budget 1: only a token that completes it */
    n = gram_match_mask(m, 1, bits);
    GT_CHECK(n == 1 && gt_bit(bits, tok_of("hello")), "literal budget 1: %d", n);
    n = gram_match_mask(m, 3, bits);
    GT_CHECK(n == 2 && gt_bit(bits, tok_of("hel")) && !gt_bit(bits, 'h'), "literal budget 3: %d",
             n);
    GT_CHECK(gram_match_accept(m, tok_of("hello")) == 0 && gram_match_status(m) == GRAM_ENDED,
             "literal ended");
    n = gram_match_mask(m, 5, bits);
    GT_CHECK(n == 1 && gt_bit(bits, ID_EOS), "only eos after the end");
    GT_CHECK(gram_match_accept(m, 'x') == -1 && gram_match_accept(m, ID_EOS) == 0, "eos accept");
    gram_match_free(m);
    gram_free(g);
    /* the empty literal */
    g = gram_lit("", 0);
    GT_CHECK(accepts(g, "") && !is_prefix(g, "a"), "empty literal");
    m = gram_match_new(g, V);
    n = gram_match_mask(m, 5, bits);
    GT_CHECK(n == 1 && gt_bit(bits, ID_EOS) && gram_match_status(m) == GRAM_ENDED, "empty: eos");
    GT_CHECK(gram_match_accept(m, 'a') == -1, "empty: nothing else");
    gram_match_free(m);
    gram_free(g);
    free(bits);
}

static void test_combinators(void) {
    gram *parts[3] = {gram_lit("ab", 2), gram_lit("c", 1), gram_lit("", 0)};
    gram *g = gram_seq(parts, 3);
    GT_CHECK(accepts(g, "abc") && !accepts(g, "ab"), "seq");
    gram_free(g);
    gram *alts[3] = {gram_lit("true", 4), gram_lit("tru", 3), gram_lit("false", 5)};
    g = gram_alt(alts, 3);
    GT_CHECK(accepts(g, "true") && accepts(g, "tru") && accepts(g, "false") &&
                 !accepts(g, "fals") && !is_prefix(g, "truee"),
             "alt");
    gram_match *m = gram_match_new(g, V);
    feed_text(m, "tru");
    GT_CHECK(gram_match_status(m) == GRAM_CAN_END && gram_match_min_bytes(m) == 0, "can end");
    gram_match_free(m);
    int32_t h[1] = {tok_of("tru")};
    check_mask(g, h, 1, 3, "alt after tru");
    gram_free(g);
    /* repeat with a separator: 2..4 of "ab" joined by "," */
    g = gram_repeat(gram_lit("ab", 2), gram_lit(",", 1), 2, 4);
    GT_CHECK(!accepts(g, "ab") && accepts(g, "ab,ab") && accepts(g, "ab,ab,ab,ab") &&
                 !is_prefix(g, "ab,ab,ab,ab,") && !is_prefix(g, "abab"),
             "repeat 2..4");
    m = gram_match_new(g, V);
    GT_CHECK(gram_match_min_bytes(m) == 5, "repeat min %d", gram_match_min_bytes(m));
    gram_match_free(m);
    gram_free(g);
    g = gram_repeat(gram_lit("x", 1), NULL, 0, -1);
    GT_CHECK(accepts(g, "") && accepts(g, "xxxxxxxx") && !is_prefix(g, "xy"), "repeat 0..");
    gram_free(g);
    g = gram_repeat(gram_lit("ab", 2), gram_lit(", ", 2), 3, -1);
    GT_CHECK(!accepts(g, "ab, ab") && accepts(g, "ab, ab, ab") && accepts(g, "ab, ab, ab, ab"),
             "repeat 3..");
    walks(g, NULL, "repeat 3..", 20, 30, true);
    gram_free(g);
    /* a repeat of something that may be empty, unbounded: must not loop */
    gram *e2[2] = {gram_lit("", 0), gram_lit("a", 1)};
    g = gram_repeat(gram_alt(e2, 2), NULL, 0, -1);
    GT_CHECK(accepts(g, "") && accepts(g, "aaa"), "repeat of nullable");
    gram_free(g);
    gram *e3[2] = {gram_lit("", 0), gram_lit("a", 1)};
    g = gram_repeat(gram_alt(e3, 2), gram_lit("", 0), 2, 300);
    GT_CHECK(accepts(g, "") && accepts(g, "aaa"), "long repeat of nullable");
    walks(g, NULL, "long repeat", 10, 20, false);
    gram_free(g);
    /* bad arguments */
    GT_CHECK(!gram_repeat(gram_lit("a", 1), NULL, 3, 2), "repeat max < min");
    GT_CHECK(!gram_repeat(NULL, NULL, 0, 1), "repeat of NULL");
    gram *bad[2] = {gram_lit("a", 1), NULL};
    GT_CHECK(!gram_seq(bad, 2), "seq with NULL");
    /* until: free text, then the end marker, first occurrence ends it */
    g = gram_until("</think>", 8);
    GT_CHECK(accepts(g, "</think>") && accepts(g, "some <b> text </thin </think>") &&
                 !is_prefix(g, "a</think>b") && is_prefix(g, "</thi") &&
                 accepts(g, "\xC3\xA9</think>") && !is_prefix(g, "\xC3</think>") &&
                 !is_prefix(g, "\xFF"),
             "until");
    m = gram_match_new(g, V);
    GT_CHECK(gram_match_min_bytes(m) == 8, "until min");
    feed_text(m, "x</th");
    GT_CHECK(gram_match_min_bytes(m) == 4, "until min mid-marker %d", gram_match_min_bytes(m));
    gram_match_free(m);
    walks(g, NULL, "until", 20, 30, true);
    gram_free(g);
}

static void test_special(void) {
    /* a literal holding the special token's text: the token may stand for it there */
    json_object *sch = json_tokener_parse("{\"type\":\"string\"}");
    gram *parts[2] = {gram_lit(SPECIAL_TEXT, strlen(SPECIAL_TEXT)), gram_json(sch, NULL, 0)};
    json_object_put(sch);
    gram *g = gram_seq(parts, 2);
    GT_CHECK(g, "special seq");
    uint32_t *bits = calloc((size_t)WORDS, 4);
    gram_match *m = gram_match_new(g, V);
    gram_match_mask(m, 100, bits);
    GT_CHECK(gt_bit(bits, ID_SPECIAL) && gt_bit(bits, tok_of("[TOOL")), "special at its literal");
    GT_CHECK(gram_match_accept(m, ID_SPECIAL) == 0, "special accepted");
    GT_CHECK(gram_match_accept(m, '"') == 0, "then the string");
    /* inside a JSON string the text may come, as text, but never the special token */
    gram_match_mask(m, 100, bits);
    GT_CHECK(!gt_bit(bits, ID_SPECIAL) && gt_bit(bits, tok_of("[TOOL")),
             "no special token in a string");
    GT_CHECK(gram_match_accept(m, ID_SPECIAL) == -1, "special refused in a string");
    GT_CHECK(gt_bit(bits, ID_ADDED), "a non-special added token is text");
    gram_match_free(m);
    int32_t h0[1] = {ID_SPECIAL};
    check_mask(g, h0, 1, 50, "after special");
    check_mask(g, NULL, 0, 50, "special start");
    gram_free(g);
    /* only at the start of the literal's text, and where it holds the whole text */
    g = gram_lit("x" SPECIAL_TEXT, strlen(SPECIAL_TEXT) + 1);
    m = gram_match_new(g, V);
    gram_match_mask(m, 100, bits);
    GT_CHECK(!gt_bit(bits, ID_SPECIAL), "special not before its place");
    gram_match_accept(m, 'x');
    gram_match_mask(m, 100, bits);
    GT_CHECK(gt_bit(bits, ID_SPECIAL), "special at its place");
    gram_match_free(m);
    gram_free(g);
    g = gram_lit("[TOOL_CALL", 10);
    m = gram_match_new(g, V);
    gram_match_mask(m, 100, bits);
    GT_CHECK(!gt_bit(bits, ID_SPECIAL), "special longer than the literal");
    gram_match_free(m);
    gram_free(g);
    /* the end of an until: the special token may end it, never come inside */
    g = gram_until(SPECIAL_TEXT, strlen(SPECIAL_TEXT));
    m = gram_match_new(g, V);
    gram_match_mask(m, 100, bits);
    GT_CHECK(gt_bit(bits, ID_SPECIAL), "special ends an until");
    GT_CHECK(gram_match_accept(m, ID_SPECIAL) == 0 && gram_match_status(m) == GRAM_ENDED,
             "until ended by special");
    gram_match_free(m);
    gram_free(g);
    g = gram_until("</think>", 8);
    m = gram_match_new(g, V);
    gram_match_mask(m, 100, bits);
    GT_CHECK(!gt_bit(bits, ID_SPECIAL) && gt_bit(bits, tok_of("[TOOL")),
             "no special in until text");
    gram_match_free(m);
    gram_free(g);
    free(bits);
}

static void test_errors(void) {
    expect_error("{\"type\":\"string\",\"pattern\":\"^a\"}", "'pattern' at # is not supported");
    expect_error("{\"properties\":{\"name\":{\"type\":\"string\",\"format\":\"email\"}}}",
                 "'format' at #/properties/name is not supported");
    expect_error("{\"type\":\"array\",\"items\":{\"minimum\":1}}", "'minimum' at #/items");
    expect_error("{\"anyOf\":[{\"type\":\"null\"},{\"uniqueItems\":true}]}",
                 "'uniqueItems' at #/anyOf/1");
    expect_error("{\"$ref\":\"#/$defs/missing\"}", "#/$defs/missing");
    expect_error("{\"$ref\":\"http://example.com/s.json\"}", "'$ref' at #");
    expect_error("{\"$defs\":{\"a\":{\"$ref\":\"#/$defs/a\"}},\"$ref\":\"#/$defs/a\"}",
                 "'$ref' cycle");
    expect_error("{\"$defs\":{\"a\":{\"anyOf\":[{\"$ref\":\"#/$defs/a\"},{\"type\":\"null\"}]}},"
                 "\"$ref\":\"#/$defs/a\"}",
                 "'$ref' cycle at #/$defs/a");
    expect_error(
        "{\"type\":\"object\",\"properties\":{\"a\":{\"$ref\":\"#\"}},\"required\":[\"a\"]}",
        "cannot be satisfied");
    expect_error("false", "cannot be satisfied");
    expect_error("{\"type\":\"strin\"}", "'type' at #");
    expect_error("{\"type\":\"string\",\"maxLength\":-1}", "'maxLength' at #");
    expect_error("{\"type\":\"array\",\"maxItems\":100000}", "'maxItems' 100000 at #");
    expect_error("{\"type\":\"object\",\"$ref\":\"#/$defs/a\",\"$defs\":{\"a\":{}}}",
                 "'type' beside '$ref'");
    expect_error("{\"allOf\":[{\"type\":\"string\"},{\"maxLength\":3}]}", "'allOf' at #");
    expect_error("{\"properties\":{\"a~b/c\":{\"not\":{}}}}", "'not' at #/properties/a~0b~1c");
    expect_error("{\"required\":\"a\"}", "'required' at #");
    expect_error("[1]", "must be an object or a boolean");
    /* annotations are fine */
    json_object *s = json_tokener_parse(
        "{\"title\":\"T\",\"description\":\"d\",\"$schema\":\"x\",\"$id\":\"y\",\"$comment\":\"c\","
        "\"examples\":[1],\"default\":1,\"type\":\"integer\"}");
    gram *g = gram_json(s, NULL, 0);
    GT_CHECK(g && accepts(g, "-12") && !accepts(g, "1.5") && !accepts(g, "01"), "annotations");
    gram_free(g);
    json_object_put(s);
}

/* Numbers stay short enough to read back as finite doubles (integers exactly). */
static void test_number_bounds(void) {
    gram *g = schema_gram("{\"type\":\"number\"}", NULL);
    GT_CHECK(accepts(g, "-123456789012345.123456789012345e-12"), "the longest number");
    GT_CHECK(!is_prefix(g, "1234567890123456"), "a 16th integer digit is refused");
    GT_CHECK(!is_prefix(g, "1.1234567890123456"), "a 16th fraction digit is refused");
    GT_CHECK(!is_prefix(g, "1e123"), "a third exponent digit is refused");
    GT_CHECK(!is_prefix(g, "01"), "a leading zero is refused");
    gram_free(g);
    g = schema_gram("{\"type\":\"integer\"}", NULL);
    GT_CHECK(accepts(g, "-999999999999999") && !is_prefix(g, "1.") && !is_prefix(g, "1e"),
             "integers: 15 digits, no fraction or exponent");
    gram_free(g);
}

static void test_schemas(void) {
    static const char *const S[] = {
        "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},\"age\":{\"type\":"
        "\"integer\"},\"ok\":{\"type\":\"boolean\"}},\"required\":[\"name\"]}",
        "{\"type\":\"object\"}",
        "{\"type\":\"array\",\"items\":{\"enum\":[\"a\",\"ab\",1,null,{\"k\":[true]}]},"
        "\"minItems\":1,\"maxItems\":3}",
        "{\"$defs\":{\"t\":{\"type\":\"object\",\"properties\":{\"v\":{\"type\":\"number\"},"
        "\"kids\":{\"type\":\"array\",\"items\":{\"$ref\":\"#/$defs/t\"}}},\"required\":[\"v\"]}},"
        "\"$ref\":\"#/$defs/t\"}",
        "{\"anyOf\":[{\"type\":\"string\",\"minLength\":2,\"maxLength\":3},{\"type\":\"null\"},"
        "{\"const\":[1,2]}]}",
        "{\"type\":[\"number\",\"boolean\"]}",
        "{\"type\":\"array\",\"prefixItems\":[{\"type\":\"integer\"},{\"type\":\"string\"}],"
        "\"items\":{\"type\":\"null\"},\"minItems\":1}",
        "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\"},\"b\":{\"type\":"
        "\"string\"}},\"required\":[\"b\"],\"additionalProperties\":false}",
        "{\"type\":\"object\",\"additionalProperties\":{\"type\":\"integer\"}}",
        "{\"type\":\"string\",\"maxLength\":300}",
        "{}",
    };
    for (size_t i = 0; i < sizeof S / sizeof *S; i++) {
        json_object *s;
        gram *g = schema_gram(S[i], &s);
        if (!g) continue;
        char what[64];
        snprintf(what, sizeof what, "schema %zu", i);
        walks(g, s, what, GT_SANITIZED ? 25 : 60, 48, true);
        gram_free(g);
        json_object_put(s);
    }
    /* any JSON value */
    gram *g = gram_json(NULL, NULL, 0);
    json_object *null_schema = json_object_new_boolean(1);
    walks(g, null_schema, "any value", 40, 40, true);
    json_object_put(null_schema);
    /* specific texts */
    GT_CHECK(accepts(g, "{\"a\": [1, -0.5e+3, \"x\\n\\u00e9\\ud83d\\ude00\"], \"b\":null}"),
             "any: a document");
    GT_CHECK(!is_prefix(g, "{ \"a\"") && !is_prefix(g, "[1 ,") && !is_prefix(g, "[1,  2") &&
                 !is_prefix(g, "01") && !is_prefix(g, "\"\\ud83d\\u0041") &&
                 !is_prefix(g, "\"\\x") && !is_prefix(g, "\"a\nb") && !is_prefix(g, "\"\xC0\xAF"),
             "any: refusals");
    gram_free(g);
    g = schema_gram("{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"}},"
                    "\"required\":[\"a\"]}",
                    NULL);
    gram_match *m = gram_match_new(g, V);
    GT_CHECK(gram_match_min_bytes(m) == 7, "min of {\"a\":0}: %d", gram_match_min_bytes(m));
    gram_match_free(m);
    GT_CHECK(accepts(g, "{\"a\": -12}") && !accepts(g, "{}") && !is_prefix(g, "{\"b\""),
             "object texts");
    gram_free(g);
    g = schema_gram(
        "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"null\"},\"b\":{\"type\":"
        "\"null\"},\"c\":{\"type\":\"null\"}}}",
        NULL);
    GT_CHECK(accepts(g, "{}") && accepts(g, "{\"b\":null}") &&
                 accepts(g, "{\"a\":null, \"c\":null}") && !is_prefix(g, "{\"b\":null,\"a\"") &&
                 !is_prefix(g, "{,"),
             "optional properties in order");
    gram_free(g);
    g = schema_gram("{\"type\":\"string\",\"minLength\":2,\"maxLength\":2}", NULL);
    GT_CHECK(accepts(g, "\"\xE4\xB8\xAD\\n\"") && !accepts(g, "\"a\"") && !is_prefix(g, "\"abc") &&
                 accepts(g, "\"\\uD83D\\uDE00a\""),
             "string lengths count characters");
    gram_free(g);
}

static void test_big_vocab(void) {
    int32_t big = N_TOK + 1000;
    char err[256];
    int32_t eos = ID_EOS;
    gram_vocab *v = gram_vocab_new(T, big, &eos, 1, err, sizeof err);
    GT_CHECK(v && gram_vocab_size(v) == big && gram_vocab_bytes_complete(v), "big vocab: %s", err);
    gram *g = gram_json(NULL, NULL, 0);
    gram_match *m = gram_match_new(g, v);
    uint32_t *bits = calloc(((size_t)big + 31) / 32, 4);
    for (int i = 0; i < 3; i++) {
        int32_t n = gram_match_mask(m, 100, bits);
        GT_CHECK(n > 0, "big vocab mask");
        for (int32_t t = N_TOK; t < big; t++)
            GT_CHECK(!gt_bit(bits, t), "id %d beyond the tokenizer allowed", t);
        GT_CHECK(gram_match_accept(m, big - 1) == -1 && gram_match_accept(m, big) == -1 &&
                     gram_match_accept(m, -1) == -1,
                 "ids beyond accepted");
        gram_match_accept(m, '[');
    }
    free(bits);
    gram_match_free(m);
    gram_free(g);
    gram_vocab_free(v);
    eos = big;
    GT_CHECK(!gram_vocab_new(T, big, &eos, 1, err, sizeof err) && strstr(err, "outside"),
             "eos outside");
    /* a vocabulary smaller than the tokenizer's: the rest is simply not there */
    v = gram_vocab_new(T, 200, NULL, 0, err, sizeof err);
    GT_CHECK(v && !gram_vocab_bytes_complete(v), "small vocab");
    gram_vocab_free(v);
}

static void test_cache(void) {
    /* the same walk with and without the cache gives the same masks */
    gram *g = schema_gram("{\"type\":\"object\",\"properties\":{\"s\":{\"type\":\"string\"},"
                          "\"n\":{\"type\":\"array\",\"items\":{\"type\":\"number\"}}}}",
                          NULL);
    gram_match *a = gram_match_new(g, V), *b = gram_match_new(g, V), *c = gram_match_new(g, V);
    gram_match_set_cache(b, 0);
    gram_match_set_cache(c, 1500); /* a few entries: eviction at work */
    uint32_t *ba = calloc((size_t)WORDS, 4), *bb = calloc((size_t)WORDS, 4),
             *bc = calloc((size_t)WORDS, 4);
    uint64_t rng = 5;
    for (int step = 0; step < 60; step++) {
        int32_t budget = 60 - step;
        int32_t na = gram_match_mask(a, budget, ba), nb = gram_match_mask(b, budget, bb);
        int32_t nc = gram_match_mask(c, budget, bc);
        GT_CHECK(na == nb && !memcmp(ba, bb, (size_t)WORDS * 4), "cache differs at step %d", step);
        GT_CHECK(nc == nb && !memcmp(bc, bb, (size_t)WORDS * 4), "small cache differs at step %d",
                 step);
        size_t bytes;
        gram_match_cache_stats(c, NULL, NULL, &bytes);
        GT_CHECK(bytes <= 1500, "cache holds %zu bytes over its 1500", bytes);
        if (!na) break;
        int32_t t = gt_nth_bit(ba, WORDS, (int64_t)(gt_rand(&rng) % (uint64_t)na));
        if (t == ID_EOS) break;
        gram_match_accept(a, t);
        gram_match_accept(b, t);
        gram_match_accept(c, t);
    }
    free(bc);
    gram_match_free(c);
    int64_t hits, misses;
    gram_match_cache_stats(a, &hits, &misses, NULL);
    GT_CHECK(hits > 0, "no cache hits");
    gram_match_cache_stats(b, &hits, &misses, NULL);
    GT_CHECK(hits == 0, "hits with the cache off");
    free(ba);
    free(bb);
    gram_match_free(a);
    gram_match_free(b);
    gram_free(g);
}

int main(void) {
    T = small_tokenizer();
    if (!T) return 1;
    char err[256];
    int32_t eos = ID_EOS;
    NV = N_TOK;
    WORDS = (NV + 31) / 32;
    V = gram_vocab_new(T, NV, &eos, 1, err, sizeof err);
    if (!V) {
        fprintf(stderr, "FAIL: vocab: %s\n", err);
        return 1;
    }
    GT_CHECK(gram_vocab_bytes_complete(V), "every byte a token");
    test_token_bytes();
    test_literals();
    test_combinators();
    test_special();
    test_errors();
    test_schemas();
    test_number_bounds();
    test_big_vocab();
    test_cache();
    gram_vocab_free(V);
    tok_free(T);
    if (gt_failures) {
        fprintf(stderr, "%d failures\n", gt_failures);
        return 1;
    }
    printf("grammar unit tests passed\n");
    return 0;
}
