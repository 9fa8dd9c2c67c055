/* The grammar that forces a call (tc_grammar, through the tool-call plugins of the build
 * tree as the server loads them), on the real tokenizers of each format: the
 * calls the parser reads are accepted and wrong ones refused (another tool's name, arguments
 * against the schema, a second call where one is asked for), refusals name the tool, and
 * seeded random walks through the grammar's masks give text that the parser of the same
 * format turns into calls of the asked-for tools with the required arguments.
 * usage: test_toolcall_grammar [TOKENIZERS_DIR]   (default $LMHOST_TOKENIZERS or
 * ~/.cache/lmhost/tokenizers; a missing tokenizer fails, as the template tests do) */
#include "toolcall.h"
#include "plugin_loader.h"

#include <json-c/json.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int failures;

#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            failures++;                                                                            \
            printf("FAIL %s:%d: ", __FILE__, __LINE__);                                            \
            printf(__VA_ARGS__);                                                                   \
            putchar('\n');                                                                         \
        }                                                                                          \
    } while (0)

static const char TOOLS[] =
    "[{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": \"Weather"
    " now\", \"parameters\": {\"type\": \"object\", \"properties\": {\"city\": {\"type\": "
    "\"string\","
    " \"maxLength\": 12}, \"unit\": {\"enum\": [\"celsius\", \"fahrenheit\"]}}, \"required\": "
    "[\"city\"]}}},"
    " {\"type\": \"function\", \"function\": {\"name\": \"search\", \"parameters\": {\"type\": "
    "\"object\", \"properties\": {\"query\": {\"type\": \"string\", \"maxLength\": 16}, \"limit\": "
    "{\"type\": \"integer\"}}, \"required\": [\"query\", \"limit\"], \"additionalProperties\": "
    "false}}},"
    " {\"type\": \"function\", \"function\": {\"name\": \"ping\"}},"
    " {\"type\": \"function\", \"function\": {\"name\": \"tree\", \"parameters\": {\"$defs\": "
    "{\"node\": {\"type\": \"object\", \"properties\": {\"v\": {\"type\": \"integer\"}, \"kids\": "
    "{\"type\": \"array\", \"items\": {\"$ref\": \"#/$defs/node\"}, \"maxItems\": 2}}, "
    "\"required\": [\"v\"]}}, \"type\": \"object\", \"properties\": {\"root\": {\"$ref\": "
    "\"#/$defs/node\"}}, \"required\": [\"root\"]}}}]";

#define DS_B  "<｜tool▁calls▁begin｜>"
#define DS_E  "<｜tool▁calls▁end｜>"
#define DS_CB "<｜tool▁call▁begin｜>function<｜tool▁sep｜>"
#define DS_CE "\n```<｜tool▁call▁end｜>"

/* Per format: the tokenizer it is tried with (no Mistral tokenizer is fetched: Qwen's
 * byte-level one spells anything), one call and two calls as the grammar writes them, a call
 * of a tool that does not exist, and one whose arguments miss a required member. */
static const struct fcase {
    const char *f; /* the format's name */
    const char *tokenizer, *one, *two, *bad_name, *bad_args;
} CASES[] = {
    {"hermes", "qwen3",
     "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>",
     "<tool_call>\n{\"name\": \"ping\", \"arguments\": {}}\n</tool_call>\n<tool_call>\n{\"name\": "
     "\"search\", \"arguments\": {\"query\": \"x\", \"limit\": 3}}\n</tool_call>",
     "<tool_call>\n{\"name\": \"nope\", \"arguments\": {}}\n</tool_call>",
     "<tool_call>\n{\"name\": \"search\", \"arguments\": {\"query\": \"x\"}}\n</tool_call>"},
    {"llama3", "llama3_1", "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}",
     "{\"name\": \"ping\", \"parameters\": {}}; {\"name\": \"search\", \"parameters\": {\"query\": "
     "\"x\", \"limit\": 3}}",
     "{\"name\": \"nope\", \"parameters\": {}}",
     "{\"name\": \"search\", \"parameters\": {\"query\": \"x\"}}"},
    {"mistral", "qwen3",
     "[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}]",
     "[TOOL_CALLS][{\"name\": \"ping\", \"arguments\": {}}, {\"name\": \"search\", \"arguments\": "
     "{\"query\": \"x\", \"limit\": 3}}]",
     "[TOOL_CALLS][{\"name\": \"nope\", \"arguments\": {}}]",
     "[TOOL_CALLS][{\"name\": \"search\", \"arguments\": {\"query\": \"x\"}}]"},
    {"mistral-v11", "qwen3", "[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Paris\"}",
     "[TOOL_CALLS]ping[ARGS]{}[TOOL_CALLS]search[ARGS]{\"query\": \"x\", \"limit\": 3}",
     "[TOOL_CALLS]nope[ARGS]{}", "[TOOL_CALLS]search[ARGS]{\"query\": \"x\"}"},
    {"deepseek", "deepseek_v3", DS_B DS_CB "get_weather\n```json\n{\"city\": \"Paris\"}" DS_CE DS_E,
     DS_B DS_CB "ping\n```json\n{}" DS_CE "\n" DS_CB
                "search\n```json\n{\"query\": \"x\", \"limit\": 3}" DS_CE DS_E,
     DS_B DS_CB "nope\n```json\n{}" DS_CE DS_E,
     DS_B DS_CB "search\n```json\n{\"query\": \"x\"}" DS_CE DS_E},
    {"harmony", "gptoss",
     "<|channel|>analysis<|message|>The user wants the weather.<|end|><|start|>assistant "
     "to=functions.get_weather<|channel|>commentary json<|message|>{\"city\": \"Paris\"}",
     NULL, " to=functions.nope<|channel|>commentary json<|message|>{}",
     " to=functions.search<|channel|>commentary json<|message|>{\"query\": \"x\"}"},
};

static char tok_dir[4096];
static registry reg;

static tc_format format_named(const char *name) {
    tc_format f;
    if (tc_format_find(&reg, name, &f)) {
        fprintf(stderr, "no tool-call plugin has the format '%s'\n", name);
        exit(2);
    }
    return f;
}

static tok_tokenizer *load(const char *name) {
    char dir[8192], err[512];
    snprintf(dir, sizeof dir, "%s/%s", tok_dir, name);
    tok_tokenizer *t = tok_load(dir, err, sizeof err);
    CHECK(t != NULL, "tokenizer %s: %s (tools/fetch_tokenizers.sh)", name, err);
    return t;
}

/* Whether the grammar takes text (tokenized as the model would write it) as a whole output. */
static int accepts(const gram *g, const gram_vocab *v, const tok_tokenizer *t, const char *text) {
    int32_t *ids = NULL;
    size_t n = 0;
    if (tok_encode(t, text, strlen(text), false, &ids, &n)) return 0;
    gram_match *m = gram_match_new(g, v);
    int ok = m != NULL;
    for (size_t i = 0; ok && i < n; i++) ok = gram_match_accept(m, ids[i]) == 0;
    ok = ok && gram_match_status(m) != GRAM_MORE;
    gram_match_free(m);
    free(ids);
    return ok;
}

static int parse(const char *format, const char *text, size_t n, tc_call **calls, int *n_calls,
                 tc_buf *content) {
    tc_format f = format_named(format);
    tc_parser *p = tc_parser_new(&f);
    tc_buf reasoning = {0};
    tc_parser_set_reasoning(p, &reasoning);
    *calls = NULL;
    *n_calls = 0;
    int r = tc_push(p, text, n, content, calls, n_calls) < 0 ||
            tc_finish(p, content, calls, n_calls) < 0;
    tc_parser_free(p);
    tc_buf_free(&reasoning);
    return r ? -1 : 0;
}

/* Every required member of the tool's parameters is in the call's arguments. */
static int args_complete(json_object *tools, const tc_call *c) {
    json_object *args = json_tokener_parse(c->arguments), *req = NULL;
    int ok = args && json_object_is_type(args, json_type_object), found = 0;
    for (size_t i = 0; ok && i < json_object_array_length(tools); i++) {
        json_object *fn, *nm, *params;
        json_object_object_get_ex(json_object_array_get_idx(tools, i), "function", &fn);
        json_object_object_get_ex(fn, "name", &nm);
        if (strcmp(json_object_get_string(nm), c->name)) continue;
        found = 1;
        if (json_object_object_get_ex(fn, "parameters", &params))
            json_object_object_get_ex(params, "required", &req);
        for (size_t k = 0; req && k < json_object_array_length(req); k++)
            ok = ok && json_object_object_get_ex(
                           args, json_object_get_string(json_object_array_get_idx(req, k)), NULL);
    }
    json_object_put(args);
    return ok && found;
}

static uint64_t rng_state = 42;
static uint64_t rng(void) {
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return rng_state >> 33;
}

/* Walks the grammar with random allowed tokens (stopping at random where it may end) and
 * parses what came out: the calls of an allowed tool, complete, one unless parallel. */
static void walk(const struct fcase *fc, const gram *g, const gram_vocab *v, const tok_tokenizer *t,
                 json_object *tools, const char *only, int parallel) {
    int32_t n_vocab = gram_vocab_size(v), budget = 400;
    uint32_t *mask = malloc(((size_t)n_vocab + 31) / 32 * sizeof *mask);
    int32_t *ids = malloc((size_t)budget * sizeof *ids);
    gram_match *m = gram_match_new(g, v);
    int n = 0;
    while (n < budget) {
        gram_status st = gram_match_status(m);
        if (st == GRAM_ENDED || (st == GRAM_CAN_END && rng() % 4 == 0)) break;
        int32_t allowed = gram_match_mask(m, budget - n, mask);
        CHECK(allowed > 0, "%s: no token allowed after %d", fc->f, n);
        if (allowed <= 0) break;
        int32_t k = (int32_t)(rng() % (uint64_t)allowed), id = -1;
        for (int32_t i = 0; i < n_vocab; i++)
            if (mask[i / 32] >> (i % 32) & 1 && k-- == 0) {
                id = i;
                break;
            }
        if (tok_is_eos(t, id)) break;
        CHECK(gram_match_accept(m, id) == 0, "%s: an allowed token refused", fc->f);
        ids[n++] = id;
    }
    CHECK(gram_match_status(m) != GRAM_MORE, "%s: the walk did not complete in %d tokens", fc->f,
          budget);
    size_t len = 0;
    char *text = tok_decode(t, ids, (size_t)n, false, &len);
    tc_call *calls = NULL;
    int n_calls = 0;
    tc_buf content = {0};
    int ok = text && !parse(fc->f, text, len, &calls, &n_calls, &content);
    ok = ok && n_calls >= 1 && (parallel || n_calls == 1) && content.len == 0;
    for (int i = 0; ok && i < n_calls; i++)
        ok = (!only || !strcmp(calls[i].name, only)) && args_complete(tools, &calls[i]);
    CHECK(ok, "%s%s%s%s: the grammar's output does not parse into the asked-for calls: %s", fc->f,
          parallel ? ", parallel" : "", only ? ", only " : "", only ? only : "",
          text ? text : "(null)");
    if (!ok && text) {
        printf("  content: %s\n", content.p ? content.p : "");
        for (int i = 0; i < n_calls; i++)
            printf("  call %s %s\n", calls[i].name, calls[i].arguments);
    }
    tc_calls_free(calls, n_calls);
    tc_buf_free(&content);
    free(text);
    gram_match_free(m);
    free(ids);
    free(mask);
}

static void check_format(const struct fcase *fc, json_object *tools) {
    tok_tokenizer *t = load(fc->tokenizer);
    if (!t) return;
    const int32_t *eos;
    size_t n_eos = tok_eos_ids(t, &eos);
    char err[512];
    gram_vocab *v = gram_vocab_new(t, (int32_t)tok_vocab_size(t), eos, (int)n_eos, err, sizeof err);
    CHECK(v != NULL, "gram_vocab_new(%s): %s", fc->tokenizer, err);
    if (!v) {
        tok_free(t);
        return;
    }
    const char *name = fc->f;
    tc_format f = format_named(name);
    for (int parallel = 0; parallel < 2; parallel++) {
        gram *g = tc_grammar(&f, tools, NULL, parallel, err, sizeof err);
        CHECK(g != NULL, "tc_grammar(%s): %s", name, err);
        if (!g) continue;
        CHECK(accepts(g, v, t, fc->one), "%s: one call refused", name);
        if (fc->two)
            CHECK(accepts(g, v, t, fc->two) == parallel, "%s: two calls %s", name,
                  parallel ? "refused" : "accepted without parallel");
        CHECK(!accepts(g, v, t, fc->bad_name), "%s: an unknown tool accepted", name);
        CHECK(!accepts(g, v, t, fc->bad_args), "%s: arguments without a required member accepted",
              name);
        /* what the grammar takes, the parser reads */
        tc_call *calls;
        int n_calls;
        tc_buf content = {0};
        CHECK(!parse(fc->f, fc->one, strlen(fc->one), &calls, &n_calls, &content) && n_calls == 1 &&
                  !strcmp(calls[0].name, "get_weather") &&
                  !strcmp(calls[0].arguments, "{\"city\":\"Paris\"}") && !content.len,
              "%s: the parser does not read the grammar's call", name);
        tc_calls_free(calls, n_calls);
        tc_buf_free(&content);
        for (int w = 0; w < 12; w++) walk(fc, g, v, t, tools, NULL, parallel);
        gram_free(g);

        /* tool_choice naming one function */
        g = tc_grammar(&f, tools, "tree", parallel, err, sizeof err);
        CHECK(g != NULL, "tc_grammar(%s, only tree): %s", name, err);
        if (g) {
            CHECK(!accepts(g, v, t, fc->one), "%s: another tool accepted when one is named", name);
            for (int w = 0; w < 6; w++) walk(fc, g, v, t, tools, "tree", parallel);
            gram_free(g);
        }
    }
    gram_vocab_free(v);
    tok_free(t);
}

static void check_refusals(json_object *tools) {
    char err[512];
    tc_format none = format_named("none"), hermes = format_named("hermes"),
              deepseek = format_named("deepseek");
    CHECK(!tc_grammar(&none, tools, NULL, 1, err, sizeof err) && strstr(err, "no tool-call"),
          "none refused: %s", err);
    CHECK(!tc_grammar(&hermes, tools, "missing", 1, err, sizeof err) && strstr(err, "missing"),
          "an unknown tool_choice name refused: %s", err);
    json_object *bad = json_tokener_parse(
        "[{\"type\": \"function\", \"function\": {\"name\": \"ok\"}}, {\"type\": \"function\", "
        "\"function\": {\"name\": \"zip_lookup\", \"parameters\": {\"type\": \"object\", "
        "\"properties\": {\"zip\": {\"type\": \"string\", \"pattern\": \"^[0-9]+$\"}}}}}]");
    for (size_t i = 0; i < sizeof CASES / sizeof CASES[0]; i++) {
        tc_format f = format_named(CASES[i].f);
        err[0] = 0;
        CHECK(!tc_grammar(&f, bad, NULL, 1, err, sizeof err) && strstr(err, "zip_lookup") &&
                  strstr(err, "pattern"),
              "%s: an unsupported keyword refused naming the tool: %s", CASES[i].f, err);
    }
    /* a schema the grammar cannot write in the other tool is fine when only one is asked for */
    gram *g = tc_grammar(&hermes, bad, "ok", 0, err, sizeof err);
    CHECK(g != NULL, "the named tool alone builds: %s", err);
    gram_free(g);
    json_object_put(bad);
    bad = json_tokener_parse("[{\"type\": \"function\", \"function\": {\"name\": \"a b\"}}]");
    CHECK(!tc_grammar(&deepseek, bad, NULL, 0, err, sizeof err) && strstr(err, "a b"),
          "a name the format cannot write refused: %s", err);
    CHECK((g = tc_grammar(&hermes, bad, NULL, 0, err, sizeof err)) != NULL,
          "any name in a JSON format: %s", err);
    gram_free(g);
    json_object_put(bad);
    bad = json_tokener_parse("[{\"type\": \"function\"}]");
    CHECK(!tc_grammar(&hermes, bad, NULL, 0, err, sizeof err) && strstr(err, "tools[0]"),
          "a tool without a function refused: %s", err);
    json_object_put(bad);
    bad = json_tokener_parse("[{\"type\": \"function\", \"function\": {\"name\": \"f\", "
                             "\"parameters\": [1]}}]");
    CHECK(!tc_grammar(&hermes, bad, NULL, 0, err, sizeof err) && strstr(err, "'f'"),
          "parameters that are not an object refused: %s", err);
    json_object_put(bad);
}

int main(int argc, char **argv) {
    if (argc > 1)
        snprintf(tok_dir, sizeof tok_dir, "%s", argv[1]);
    else if (getenv("LMHOST_TOKENIZERS"))
        snprintf(tok_dir, sizeof tok_dir, "%s", getenv("LMHOST_TOKENIZERS"));
    else
        snprintf(tok_dir, sizeof tok_dir, "%s/.cache/lmhost/tokenizers", getenv("HOME"));
    if (registry_load(&reg, NULL)) return 2;
    json_object *tools = json_tokener_parse(TOOLS);
    if (!tools) {
        fprintf(stderr, "bad TOOLS\n");
        return 2;
    }
    check_refusals(tools);
    for (size_t i = 0; i < sizeof CASES / sizeof CASES[0]; i++) check_format(&CASES[i], tools);
    json_object_put(tools);
    registry_free(&reg);
    printf("%d failures\n", failures);
    return failures ? 1 : 0;
}
