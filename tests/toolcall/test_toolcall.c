/* The tool-call parsers over recorded outputs of each format (cases.json: text, expected
 * content, calls and harmony's reasoning), each fed whole, a byte at a time and in random
 * pieces (the same result every way); every case's text through every other format too
 * (whatever it makes of it, the same every way, and nothing lost or crashed); and tc_detect
 * on sample templates and the real chat templates of the fetched tokenizers. The formats are
 * the tool-call plugins of the build tree (plugins/toolcall-*), loaded as the server loads
 * them, through the registry and core/server/toolcall.c.
 * usage: test_toolcall CASES.json [TOKENIZERS_DIR]   (default $LMHOST_TOKENIZERS or
 * ~/.cache/lmhost/tokenizers; a missing template fails, as the template tests do) */
#include "toolcall.h"
#include "plugin_loader.h"
#include "../test_io.h"

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

static registry reg;
/* "none", then every format of every tool-call plugin loaded */
static tc_format all_formats[64];
static int n_formats;

static const tc_format *format_named(const char *s) {
    for (int i = 0; i < n_formats; i++)
        if (!strcmp(tc_format_name(&all_formats[i]), s)) return &all_formats[i];
    fprintf(stderr, "no tool-call plugin has the format '%s'\n", s);
    exit(2);
}

static int is_format(const tc_format *f, const char *name) {
    return !strcmp(tc_format_name(f), name);
}

typedef struct result {
    tc_buf content, reasoning;
    tc_call *calls;
    int n_calls;
} result;

static void result_free(result *r) {
    tc_buf_free(&r->content);
    tc_buf_free(&r->reasoning);
    tc_calls_free(r->calls, r->n_calls);
    memset(r, 0, sizeof *r);
}

static uint64_t rng_state;
static uint64_t rng(void) {
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return rng_state >> 33;
}

/* mode 0: whole; 1: a byte at a time; 2: random pieces (0 to 7 bytes, empty ones too). */
static int parse(const tc_format *f, const char *s, size_t n, int mode, result *r) {
    memset(r, 0, sizeof *r);
    tc_parser *p = tc_parser_new(f);
    if (!p) return -1;
    tc_parser_set_reasoning(p, &r->reasoning);
    size_t at = 0;
    int total = 0, k;
    while (at < n) {
        size_t step = mode == 0 ? n : mode == 1 ? 1 : (size_t)(rng() % 8);
        if (step > n - at) step = n - at;
        int before = r->n_calls;
        if ((k = tc_push(p, s + at, step, &r->content, &r->calls, &r->n_calls)) < 0) break;
        CHECK(k == r->n_calls - before, "tc_push returned %d for %d new calls", k,
              r->n_calls - before);
        total += k;
        at += step;
    }
    int before = r->n_calls;
    k = tc_finish(p, &r->content, &r->calls, &r->n_calls);
    CHECK(k == r->n_calls - before, "tc_finish returned %d for %d new calls", k,
          r->n_calls - before);
    tc_parser_free(p);
    (void)total;
    return k < 0 ? -1 : 0;
}

static const char *text_of(const tc_buf *b) {
    return b->p ? b->p : "";
}

static int same_result(const result *a, const result *b) {
    if (strcmp(text_of(&a->content), text_of(&b->content)) ||
        strcmp(text_of(&a->reasoning), text_of(&b->reasoning)) || a->n_calls != b->n_calls)
        return 0;
    for (int i = 0; i < a->n_calls; i++)
        if (strcmp(a->calls[i].name, b->calls[i].name) ||
            strcmp(a->calls[i].arguments, b->calls[i].arguments))
            return 0;
    return 1;
}

static void show_result(const char *label, const result *r) {
    printf("  %s content ", label);
    test_show(text_of(&r->content), r->content.len);
    printf("\n  %s reasoning ", label);
    test_show(text_of(&r->reasoning), r->reasoning.len);
    for (int i = 0; i < r->n_calls; i++) {
        printf("\n  %s call %s ", label, r->calls[i].name);
        test_show(r->calls[i].arguments, strlen(r->calls[i].arguments));
    }
    putchar('\n');
}

static const char *str_member(json_object *o, const char *key) {
    json_object *v;
    return json_object_object_get_ex(o, key, &v) && json_object_is_type(v, json_type_string)
               ? json_object_get_string(v)
               : NULL;
}

/* One recorded output against its expectations, fed every way. */
static void check_case(json_object *c) {
    const char *name = str_member(c, "name"), *text = str_member(c, "text");
    json_object *jt, *jcalls;
    json_object_object_get_ex(c, "text", &jt);
    size_t n = (size_t)json_object_get_string_len(jt);
    const tc_format *f = format_named(str_member(c, "format"));
    const char *want_content = str_member(c, "content"),
               *want_reasoning = str_member(c, "reasoning");
    json_object_object_get_ex(c, "calls", &jcalls);

    for (int mode = 0; mode < 3; mode++) {
        for (int rep = 0; rep < (mode == 2 ? 50 : 1); rep++) {
            result r;
            if (parse(f, text, n, mode, &r)) {
                CHECK(0, "%s: out of memory", name);
                result_free(&r);
                continue;
            }
            int ok = !strcmp(text_of(&r.content), want_content) &&
                     (!want_reasoning || !strcmp(text_of(&r.reasoning), want_reasoning)) &&
                     r.n_calls == (int)json_object_array_length(jcalls);
            for (int i = 0; ok && i < r.n_calls; i++) {
                json_object *e = json_object_array_get_idx(jcalls, (size_t)i);
                ok = !strcmp(r.calls[i].name,
                             json_object_get_string(json_object_array_get_idx(e, 0))) &&
                     !strcmp(r.calls[i].arguments,
                             json_object_get_string(json_object_array_get_idx(e, 1)));
            }
            CHECK(ok, "%s (%s, fed %s)", name, tc_format_name(f),
                  mode == 0   ? "whole"
                  : mode == 1 ? "a byte at a time"
                              : "in random pieces");
            if (!ok) {
                printf("  text ");
                test_show(text, n);
                printf("\n  want content ");
                test_show(want_content, strlen(want_content));
                putchar('\n');
                show_result("got", &r);
                result_free(&r);
                return;
            }
            result_free(&r);
        }
    }
}

/* A text through any format: the same result however it is fed, and a call-free result
 * only when the content is the text itself (harmony drops its markers, so not there). */
static void check_invariance(const char *label, const tc_format *f, const char *text, size_t n) {
    result whole, r;
    if (parse(f, text, n, 0, &whole)) {
        CHECK(0, "%s: out of memory", label);
        result_free(&whole);
        return;
    }
    if (!is_format(f, "harmony") && whole.n_calls == 0)
        CHECK(whole.content.len == n && !memcmp(text_of(&whole.content), text, n),
              "%s as %s: no calls, yet the content is not the text", label, tc_format_name(f));
    for (int mode = 1; mode < 3; mode++) {
        for (int rep = 0; rep < (mode == 2 ? 10 : 1); rep++) {
            if (parse(f, text, n, mode, &r)) {
                CHECK(0, "%s: out of memory", label);
            } else if (!same_result(&whole, &r)) {
                CHECK(0, "%s as %s: fed %s differs from whole", label, tc_format_name(f),
                      mode == 1 ? "a byte at a time" : "in pieces");
                show_result("whole", &whole);
                show_result("split", &r);
            }
            result_free(&r);
        }
    }
    result_free(&whole);
}

/* Odd inputs made here rather than in the data file: deep nesting, bytes that are not
 * UTF-8, NUL bytes, a long name. */
static void check_generated(void) {
    size_t depth = 5000, n = 0;
    char *s = malloc(depth * 2 + 200);
    n += (size_t)sprintf(s, "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": ");
    for (size_t i = 0; i < depth; i++) s[n++] = '[';
    for (size_t i = 0; i < depth; i++) s[n++] = ']';
    n += (size_t)sprintf(s + n, "}}\n</tool_call>");
    result r;
    const tc_format *hermes = format_named("hermes");
    CHECK(!parse(hermes, s, n, 0, &r) && r.n_calls == 0 && r.content.len == n,
          "deep nesting is content");
    result_free(&r);
    check_invariance("deep nesting", hermes, s, n);
    free(s);

    static const char bad_utf8[] =
        "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": \"\xff\xfe\"}}\n</tool_call>";
    CHECK(!parse(hermes, bad_utf8, sizeof bad_utf8 - 1, 0, &r) && r.n_calls == 0 &&
              r.content.len == sizeof bad_utf8 - 1,
          "invalid UTF-8 in arguments is content");
    result_free(&r);
    static const char overlong[] =
        "[TOOL_CALLS]f[ARGS]{\"a\": \"\xc0\xaf\", \"b\": \"\xed\xa0\x80\"}";
    CHECK(!parse(format_named("mistral"), overlong, sizeof overlong - 1, 0, &r) && r.n_calls == 0,
          "overlong and surrogate UTF-8 are content");
    result_free(&r);
    static const char nul[] = "a\0b<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>"
                              "\0";
    CHECK(!parse(hermes, nul, sizeof nul - 1, 0, &r) && r.n_calls == 1 && r.content.len == 4 &&
              !memcmp(r.content.p, "a\0b\0", 4),
          "NUL bytes in text pass through");
    result_free(&r);
    check_invariance("NUL bytes", hermes, nul, sizeof nul - 1);

    char longname[600] = "[TOOL_CALLS]";
    memset(longname + 12, 'x', 400);
    strcpy(longname + 412, "[ARGS]{}");
    CHECK(!parse(format_named("mistral-v11"), longname, strlen(longname), 0, &r) && r.n_calls == 0,
          "a 400-byte name is content");
    result_free(&r);
    check_invariance("long name", format_named("mistral-v11"), longname, strlen(longname));

    /* a long streamed call: held back whole, released once */
    tc_parser *p = tc_parser_new(hermes);
    tc_buf content = {0};
    tc_call *calls = NULL;
    int n_calls = 0;
    static const char head[] = "ok <tool_call>\n{\"name\": \"w\", \"arguments\": {\"t\": \"";
    static const char tail[] = "\"}}\n</tool_call>";
    tc_push(p, head, strlen(head), &content, &calls, &n_calls);
    for (int i = 0; i < 20000; i++) tc_push(p, "abcdefgh", 8, &content, &calls, &n_calls);
    CHECK(content.len == 2 && n_calls == 0, "a call under way is held back");
    tc_push(p, tail, strlen(tail), &content, &calls, &n_calls);
    CHECK(n_calls == 1 && strlen(calls[0].arguments) == 160000 + 8, "a long call comes out");
    CHECK(tc_finish(p, &content, &calls, &n_calls) == 0 && content.len == 2, "nothing after");
    tc_parser_free(p);
    tc_buf_free(&content);
    tc_calls_free(calls, n_calls);
}

static char *template_of(const char *dir, const char *name) {
    char path[8192];
    snprintf(path, sizeof path, "%s/%s/tokenizer_config.json", dir, name);
    json_object *cfg = json_object_from_file(path), *t;
    if (!cfg) return NULL;
    char *s = strdup("");
    if (json_object_object_get_ex(cfg, "chat_template", &t)) {
        if (json_object_is_type(t, json_type_string)) {
            free(s);
            s = strdup(json_object_get_string(t));
        } else if (json_object_is_type(t, json_type_array) && json_object_array_length(t)) {
            json_object *first = json_object_array_get_idx(t, 0), *src;
            if (json_object_object_get_ex(first, "template", &src)) {
                free(s);
                s = strdup(json_object_get_string(src));
            }
        }
    }
    json_object_put(cfg);
    return s;
}

static void check_detect(json_object *root, const char *tok_dir) {
    json_object *det, *real;
    json_object_object_get_ex(root, "detect", &det);
    for (size_t i = 0; i < json_object_array_length(det); i++) {
        json_object *d = json_object_array_get_idx(det, i);
        const char *t = str_member(d, "template"), *mt = str_member(d, "model_type");
        const char *want = str_member(d, "format");
        tc_format got;
        tc_detect(&reg, t, mt, &got);
        CHECK(is_format(&got, want), "tc_detect(sample %zu, %s) = %s, want %s", i, mt ? mt : "NULL",
              tc_format_name(&got), want);
    }
    json_object_object_get_ex(root, "detect_real", &real);
    json_object_object_foreach(real, name, fmt) {
        char *t = template_of(tok_dir, name);
        CHECK(t != NULL, "no tokenizer_config.json for %s under %s (tools/fetch_tokenizers.sh)",
              name, tok_dir);
        if (!t) continue;
        const char *want = json_object_get_string(fmt);
        tc_format got;
        tc_detect(&reg, t, NULL, &got);
        CHECK(is_format(&got, want), "tc_detect(real %s template) = %s, want %s", name,
              tc_format_name(&got), want);
        free(t);
    }
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s CASES.json [TOKENIZERS_DIR]\n", argv[0]);
        return 2;
    }
    char tok_dir[4096];
    if (argc > 2)
        snprintf(tok_dir, sizeof tok_dir, "%s", argv[2]);
    else if (getenv("LMHOST_TOKENIZERS"))
        snprintf(tok_dir, sizeof tok_dir, "%s", getenv("LMHOST_TOKENIZERS"));
    else
        snprintf(tok_dir, sizeof tok_dir, "%s/.cache/lmhost/tokenizers", getenv("HOME"));

    json_object *root = json_object_from_file(argv[1]), *cases;
    if (!root || !json_object_object_get_ex(root, "cases", &cases)) {
        fprintf(stderr, "cannot read %s\n", argv[1]);
        return 2;
    }
    /* the plugins as the server finds them: the build tree's */
    if (registry_load(&reg, NULL)) return 2;
    n_formats = 1; /* none */
    for (int i = 0; i < reg.n; i++) {
        const lmh_plugin_info *in = reg.items[i].info;
        if (in->kind != LMH_KIND_TOOLCALL) continue;
        const lmh_toolcall_api *a = in->api;
        for (int k = 0; a->formats[k] && n_formats < 64; k++)
            all_formats[n_formats++] = (tc_format){a, k};
        printf("toolcall plugin %s from %s\n", in->name, reg.items[i].file);
    }
    rng_state = 12345;
    size_t nc = json_object_array_length(cases);
    for (size_t i = 0; i < nc; i++) check_case(json_object_array_get_idx(cases, i));
    for (size_t i = 0; i < nc; i++) {
        json_object *c = json_object_array_get_idx(cases, i), *jt;
        json_object_object_get_ex(c, "text", &jt);
        for (int k = 0; k < n_formats; k++)
            check_invariance(str_member(c, "name"), &all_formats[k], json_object_get_string(jt),
                             (size_t)json_object_get_string_len(jt));
    }
    check_generated();
    check_detect(root, tok_dir);
    json_object_put(root);
    registry_free(&reg);
    printf("%zu cases, %d failures\n", nc, failures);
    return failures ? 1 : 0;
}
