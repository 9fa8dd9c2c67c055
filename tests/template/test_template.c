/* Tests of the Jinja interpreter itself:
 *  - lang_cases.json: small templates covering each feature, with the output Jinja2 gives
 *    (configured as transformers configures it; regenerate with gen_cases.py), or an error;
 *  - real_cases.json: the chat templates of the tokenizers that tools/fetch_tokenizers.sh puts
 *    in $LMHOST_TOKENIZERS (default ~/.cache/lmhost/tokenizers), read from their
 *    tokenizer_config.json at run time, over a set of conversations, against Jinja2. A missing
 *    tokenizer fails the test: it never skips;
 *  - by hand: error positions and codes, limits, the chat API (tokenizer_config.json forms,
 *    template selection, special tokens), concurrent renders of one compiled template (the
 *    fetched qwen3 template), and the `lmhost template` subcommand.
 * usage: test_template DIR   (DIR: tests/template, where the tables are) */
#include "chat_template.h"
#include "template_cli.h"
#include "../test_io.h"

#include <ctype.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <json-c/json.h>

#define NOW 1721999109 /* 2024-07-26 13:05:09 UTC, what gen_cases.py pins strftime_now to */

static int failures, checks;

static void fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void fail(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    printf("FAIL: ");
    vprintf(fmt, ap);
    printf("\n");
    va_end(ap);
    failures++;
}

static void diff(const char *what, const char *want, size_t wl, const char *got, size_t gl) {
    size_t i = 0;
    while (i < wl && i < gl && want[i] == got[i]) i++;
    size_t from = i > 50 ? i - 50 : 0;
    fail("%s: differs at byte %zu (expected %zu bytes, got %zu)", what, i, wl, gl);
    printf("    expected ...");
    test_show(want + from, (wl < i + 50 ? wl : i + 50) - from);
    printf("\n    got      ...");
    test_show(got + from, (gl < i + 50 ? gl : i + 50) - from);
    printf("\n");
}

/* "LINE:COL: " at the start of an error message */
static int has_position(const char *err) {
    const char *p = err;
    if (!err || !isdigit((unsigned char)*p)) return 0;
    while (isdigit((unsigned char)*p)) p++;
    if (*p++ != ':' || !isdigit((unsigned char)*p)) return 0;
    while (isdigit((unsigned char)*p)) p++;
    return p[0] == ':' && p[1] == ' ';
}

/* compile + render; returns the code, *out and *err malloc'd */
static int run(const char *src, size_t len, json_object *vars, const tpl_limits *lim, char **out,
               size_t *out_len, char **err) {
    tpl_limits l = lim ? *lim : (tpl_limits){0};
    if (!l.now) l.now = NOW;
    *out = NULL;
    *err = NULL;
    tpl_template *t = tpl_compile(src, len, err);
    if (!t) return TPL_ERR_SYNTAX;
    int rc = tpl_render(t, vars, &l, out, out_len, err);
    tpl_free(t);
    return rc;
}

/* ---- the JSON tables ------------------------------------------------------------------- */

/* one case of a table: renders src with v, checks against "out" or "error"; returns 1 if bad */
static int check_case(const char *what, const char *src, size_t len, json_object *c, int show_src) {
    json_object *v = NULL, *o = NULL, *e = NULL;
    json_object_object_get_ex(c, "v", &v);
    json_object_object_get_ex(c, "out", &o);
    json_object_object_get_ex(c, "error", &e);
    char *out, *err;
    size_t out_len = 0;
    int rc = run(src, len, v, NULL, &out, &out_len, &err), bad = 0;
    checks++;
    if (e) {
        if (rc == 0) {
            fail("%s: Jinja2 fails here, we rendered", what);
            if (show_src) printf("    template: %.300s\n", src);
            bad = 1;
        } else if (!has_position(err)) {
            fail("%s: error without a position: %s", what, err);
            bad = 1;
        }
    } else if (rc != 0) {
        fail("%s: %s", what, err);
        if (show_src) printf("    template: %.300s\n", src);
        bad = 1;
    } else if (out_len != (size_t)json_object_get_string_len(o) ||
               memcmp(out, json_object_get_string(o), out_len)) {
        diff(what, json_object_get_string(o), (size_t)json_object_get_string_len(o), out, out_len);
        if (show_src) printf("    template: %.300s\n", src);
        bad = 1;
    }
    free(out);
    free(err);
    return bad;
}

static void run_lang(const char *dir) {
    char path[4096];
    snprintf(path, sizeof path, "%s/lang_cases.json", dir);
    json_object *cases = json_object_from_file(path);
    if (!cases) {
        fail("cannot read %s", path);
        return;
    }
    int n = 0, nerr = 0, bad = 0;
    for (size_t i = 0; i < json_object_array_length(cases); i++) {
        json_object *c = json_object_array_get_idx(cases, i), *t = NULL, *e = NULL;
        json_object_object_get_ex(c, "t", &t);
        nerr += json_object_object_get_ex(c, "error", &e);
        char what[64];
        snprintf(what, sizeof what, "lang_cases.json case %zu", i);
        n++;
        bad += check_case(what, json_object_get_string(t), (size_t)json_object_get_string_len(t), c,
                          1);
    }
    json_object_put(cases);
    printf("lang_cases.json: %d cases (%d that must fail), %d failed\n", n, nerr, bad);
}

/* ---- real chat templates, from the fetched tokenizers ---------------------------------- */

static const char *const tokenizer_names[] = {"qwen3",    "gemma3",      "llama2",
                                              "llama3_1", "deepseek_v3", "gptoss"};
#define N_TOKENIZERS (sizeof tokenizer_names / sizeof *tokenizer_names)

/* $LMHOST_TOKENIZERS, or ~/.cache/lmhost/tokenizers, as tools/fetch_tokenizers.sh fills it */
static const char *tokenizer_root(void) {
    static char buf[4096];
    const char *root = getenv("LMHOST_TOKENIZERS");
    if (root && *root) return root;
    const char *home = getenv("HOME");
    snprintf(buf, sizeof buf, "%s/.cache/lmhost/tokenizers", home ? home : ".");
    return buf;
}

/* The chat template of a fetched tokenizer's tokenizer_config.json ("chat_template": a string,
 * or a list of named ones: the default), malloc'd; NULL with *missing set when the file cannot
 * be read, NULL alone when it has no template. */
static char *fetched_template(const char *name, size_t *len, int *missing) {
    char path[8192];
    snprintf(path, sizeof path, "%s/%s/tokenizer_config.json", tokenizer_root(), name);
    *missing = 0;
    json_object *cfg = json_object_from_file(path), *ct = NULL;
    if (!cfg) {
        *missing = 1;
        return NULL;
    }
    char *src = NULL;
    if (json_object_object_get_ex(cfg, "chat_template", &ct) &&
        json_object_is_type(ct, json_type_array)) {
        for (size_t i = 0; i < json_object_array_length(ct); i++) {
            json_object *e = json_object_array_get_idx(ct, i), *nm, *t;
            if (json_object_object_get_ex(e, "name", &nm) &&
                !strcmp(json_object_get_string(nm), "default") &&
                json_object_object_get_ex(e, "template", &t)) {
                ct = t;
                break;
            }
        }
    }
    if (ct && json_object_is_type(ct, json_type_string)) {
        *len = (size_t)json_object_get_string_len(ct);
        src = malloc(*len + 1);
        if (src) memcpy(src, json_object_get_string(ct), *len + 1);
    }
    json_object_put(cfg);
    return src;
}

static unsigned long long fnv1a64(const char *s, size_t n) {
    unsigned long long h = 0xcbf29ce484222325ULL;
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 0x100000001b3ULL;
    return h;
}

static void missing_tokenizer(const char *name) {
    fail("%s/%s/tokenizer_config.json is missing: run tools/fetch_tokenizers.sh %s (or set "
         "LMHOST_TOKENIZERS to where the tokenizers are)",
         tokenizer_root(), name, tokenizer_root());
}

/* real_cases.json: each fetched chat template over the conversations of gen_cases.py, against
 * what Jinja2 rendered. The templates are read from the tokenizers at run time (never copied
 * into the repository); a missing tokenizer fails, and so does a template other than the one
 * gen_cases.py saw (compared by size and FNV-1a). */
static void run_real(const char *dir) {
    char path[4096];
    snprintf(path, sizeof path, "%s/real_cases.json", dir);
    json_object *root = json_object_from_file(path), *templates = NULL, *cases = NULL;
    if (!root || !json_object_object_get_ex(root, "templates", &templates) ||
        !json_object_object_get_ex(root, "cases", &cases)) {
        fail("cannot read %s", path);
        json_object_put(root);
        return;
    }
    char *src[N_TOKENIZERS] = {0};
    size_t len[N_TOKENIZERS] = {0};
    int usable[N_TOKENIZERS] = {0}, ntpl = 0;
    for (size_t k = 0; k < N_TOKENIZERS; k++) {
        const char *name = tokenizer_names[k];
        json_object *want = NULL;
        int missing;
        checks++;
        if (!json_object_object_get_ex(templates, name, &want)) {
            fail("real_cases.json has no entry for %s: run gen_cases.py", name);
            continue;
        }
        src[k] = fetched_template(name, &len[k], &missing);
        if (missing) {
            missing_tokenizer(name);
        } else if (!want) {
            if (src[k])
                fail("%s now has a chat template: run gen_cases.py", name);
            else
                printf("%s: no chat template, as expected\n", name);
        } else if (!src[k]) {
            fail("%s: tokenizer_config.json has no chat template", name);
        } else {
            json_object *b = NULL, *h = NULL;
            json_object_object_get_ex(want, "bytes", &b);
            json_object_object_get_ex(want, "fnv1a64", &h);
            char got[17];
            snprintf(got, sizeof got, "%016llx", fnv1a64(src[k], len[k]));
            if ((size_t)json_object_get_int64(b) != len[k] ||
                strcmp(got, json_object_get_string(h)))
                fail("%s: the fetched chat template (%zu bytes, fnv1a64 %s) is not the one "
                     "real_cases.json was written from (%s bytes, %s): run gen_cases.py",
                     name, len[k], got, json_object_get_string(b), json_object_get_string(h));
            else
                usable[k] = 1, ntpl++;
        }
    }
    int n = 0, nerr = 0, bad = 0, skipped = 0;
    for (size_t i = 0; i < json_object_array_length(cases); i++) {
        json_object *c = json_object_array_get_idx(cases, i), *tk = NULL, *e = NULL;
        json_object_object_get_ex(c, "tokenizer", &tk);
        size_t k = 0;
        while (k < N_TOKENIZERS && strcmp(tokenizer_names[k], json_object_get_string(tk))) k++;
        if (k == N_TOKENIZERS || !usable[k]) {
            skipped++; /* already failed above */
            continue;
        }
        nerr += json_object_object_get_ex(c, "error", &e);
        char what[96];
        snprintf(what, sizeof what, "real_cases.json case %zu (%s)", i, tokenizer_names[k]);
        n++;
        bad += check_case(what, src[k], len[k], c, 0);
    }
    for (size_t k = 0; k < N_TOKENIZERS; k++) free(src[k]);
    json_object_put(root);
    printf("real_cases.json: %d cases over %d fetched chat templates (%d that must fail), %d "
           "failed, %d not run\n",
           n, ntpl, nerr, bad, skipped);
}

/* ---- errors, positions, limits --------------------------------------------------------- */

static void expect_error(const char *src, const char *vars_json, const tpl_limits *lim, int code,
                         const char *msg) {
    json_object *vars = vars_json ? json_tokener_parse(vars_json) : NULL;
    char *out, *err;
    size_t n;
    int rc = run(src, strlen(src), vars, lim, &out, &n, &err);
    checks++;
    if (rc != code)
        fail("%.60s: code %d, expected %d (%s)", src, rc, code, err ? err : "no error");
    else if (!err || strstr(err, msg) == NULL)
        fail("%.60s: error '%s', expected it to hold '%s'", src, err ? err : "(none)", msg);
    free(out);
    free(err);
    json_object_put(vars);
}

static void expect_out(const char *src, const char *vars_json, const char *want) {
    json_object *vars = vars_json ? json_tokener_parse(vars_json) : NULL;
    char *out, *err;
    size_t n;
    int rc = run(src, strlen(src), vars, NULL, &out, &n, &err);
    checks++;
    if (rc)
        fail("%.60s: %s", src, err);
    else if (n != strlen(want) || memcmp(out, want, n))
        diff(src, want, strlen(want), out, n);
    free(out);
    free(err);
    json_object_put(vars);
}

static void test_errors(void) {
    /* positions are LINE:COL of the token at fault */
    expect_error("{% if x %}", NULL, NULL, TPL_ERR_SYNTAX,
                 "1:11: syntax error: unexpected end of template: looking for 'elif' or 'else' "
                 "or 'endif' to close the 'if' opened at 1:4");
    expect_error("line1\nline2 {{ x.y }}", NULL, NULL, TPL_ERR_RUNTIME, "2:11: 'x' is undefined");
    expect_error("a\n\n  {% if x %}\n{{ 1 + }}", NULL, NULL, TPL_ERR_SYNTAX,
                 "4:8: syntax error: unexpected 'end of print statement'");
    expect_error("{{ 'abc }}", NULL, NULL, TPL_ERR_SYNTAX,
                 "1:4: syntax error: unterminated string");
    expect_error("é{{ x | nosuch }}", NULL, NULL, TPL_ERR_SYNTAX,
                 "1:9: syntax error: no filter named 'nosuch'");
    expect_error("{% for a in [1] %}\n  {{ a.b.c }}{% endfor %}", NULL, NULL, TPL_ERR_RUNTIME,
                 "2:9: 'int object' has no attribute 'b'");
    expect_error("{{ [1, 2][5] + 1 }}", NULL, NULL, TPL_ERR_RUNTIME,
                 "list object has no element 5");
    expect_error("{% break %}", NULL, NULL, TPL_ERR_SYNTAX, "'break' outside loop");
    expect_error("{% include 'x' %}", NULL, NULL, TPL_ERR_SYNTAX, "cannot load other templates");
    expect_error("{{ l.append(1) }}", "{\"l\": []}", NULL, TPL_ERR_RUNTIME,
                 "access to attribute 'append' of 'list' object is unsafe.");
    /* raise_exception: its own code and the template's message */
    expect_error("{% if true %}\n  {{ raise_exception('Roles must alternate') }}{% endif %}", NULL,
                 NULL, TPL_ERR_RAISED, "2:21: Roles must alternate");
    /* an unknown filter inside an `if` fails only when used, as in jinja */
    expect_out("{% if false %}{{ x | nosuch }}{% endif %}ok", NULL, "ok");
    expect_error("{% if true %}{{ x | nosuch }}{% endif %}", NULL, NULL, TPL_ERR_RUNTIME,
                 "No filter named 'nosuch'.");
    /* malformed bytes pass through untouched */
    expect_out("{{ s }}|{{ s|length }}|{{ s[::-1] }}", "{\"s\": \"a\\u00e9\"}", "aé|2|éa");
    const char bad_utf8[] = "x\xff\xc3{{ 1 }}\xe2\x82";
    char *out, *err;
    size_t n;
    int rc = run(bad_utf8, sizeof bad_utf8 - 1, NULL, NULL, &out, &n, &err);
    checks++;
    if (rc || n != 6 ||
        memcmp(out,
               "x\xff\xc3"
               "1\xe2\x82",
               6))
        fail("invalid UTF-8 in data");
    free(out);
    free(err);
}

static void test_limits(void) {
    tpl_limits steps = {.max_steps = 10000};
    expect_error("{% for i in range(100000) %}{% endfor %}", NULL, &steps, TPL_ERR_LIMIT,
                 "step limit exceeded");
    expect_error("{% for i in range(99999) %}{% for j in range(99999) %}{% endfor %}{% endfor %}",
                 NULL, NULL, TPL_ERR_LIMIT, "step limit exceeded");
    tpl_limits out = {.max_output = 1000};
    expect_error("{% for i in range(2000) %}x{% endfor %}", NULL, &out, TPL_ERR_LIMIT,
                 "output size limit exceeded (1000 bytes)");
    expect_error("{{ 'ab' * 100000000 }}", NULL, NULL, TPL_ERR_LIMIT, "output size limit");
    tpl_limits mem = {.max_memory = 1 << 20};
    expect_error("{% set s = 'x' * 2000000 %}", NULL, &mem, TPL_ERR_LIMIT, "memory limit exceeded");
    expect_error("{{ [1] * 100000000 }}", NULL, NULL, TPL_ERR_LIMIT, "memory limit exceeded");
    expect_error("{% macro m() %}{{ m() }}{% endmacro %}{{ m() }}", NULL, NULL, TPL_ERR_LIMIT,
                 "recursion limit exceeded");
    /* nesting: in the parser, in values, in the input */
    char deep[2100];
    size_t k = 0;
    k += (size_t)snprintf(deep + k, sizeof deep - k, "{{ ");
    for (int i = 0; i < 600; i++) deep[k++] = '(';
    deep[k++] = '1';
    for (int i = 0; i < 600; i++) deep[k++] = ')';
    snprintf(deep + k, sizeof deep - k, " }}");
    expect_error(deep, NULL, NULL, TPL_ERR_SYNTAX, "nested too deeply");
    expect_error("{% set ns = namespace(x=none) %}{% set ns.x = ns %}{{ ns }}", NULL, NULL,
                 TPL_ERR_LIMIT, "values nested too deeply");
    expect_error("{% set ns = namespace(x=[]) %}{% for i in range(5000) %}{% set ns.x = [ns.x] "
                 "%}{% endfor %}{{ ns.x|tojson }}",
                 NULL, NULL, TPL_ERR_RUNTIME, "Circular reference detected");
    expect_out("{% set ns = namespace(x=[]) %}{% for i in range(50000) %}{% set ns.x = [ns.x] "
               "%}{% endfor %}{{ ns.x|length }}",
               NULL, "1");
    json_object *root = json_object_new_array(), *cur = root;
    for (int i = 0; i < 300; i++) {
        json_object *a = json_object_new_array();
        json_object_array_add(cur, a);
        cur = a;
    }
    json_object *vars = json_object_new_object();
    json_object_object_add(vars, "x", root);
    char *o, *err;
    size_t n;
    int rc = run("{{ x|length }}", 14, vars, NULL, &o, &n, &err);
    checks++;
    if (rc != TPL_ERR_INPUT) fail("deep input: code %d (%s)", rc, err);
    free(o);
    free(err);
    json_object_put(vars);
}

/* ---- concurrent renders of one compiled template --------------------------------------- */

typedef struct {
    const tpl_template *t;
    json_object *vars;
    const char *want;
    size_t want_len;
    int bad;
} thread_job;

static void *render_many(void *arg) {
    thread_job *j = arg;
    tpl_limits lim = {.now = NOW};
    for (int i = 0; i < 40; i++) {
        char *out, *err;
        size_t n;
        if (tpl_render(j->t, j->vars, &lim, &out, &n, &err) || n != j->want_len ||
            memcmp(out, j->want, n))
            j->bad++;
        free(out);
        free(err);
    }
    return NULL;
}

/* The fetched qwen3 chat template (tool calls, namespace, reversed loops, macros of the
 * string methods) rendered from 8 threads at once. gpt-oss would be the richer template, but
 * its fetched tokenizer carries none. */
static void test_threads(void) {
    size_t len = 0;
    int missing;
    char *src = fetched_template("qwen3", &len, &missing);
    char *err = NULL;
    checks++;
    if (missing) {
        missing_tokenizer("qwen3");
        return;
    }
    tpl_template *t = src ? tpl_compile(src, len, &err) : NULL;
    if (!t) {
        fail("qwen3 chat template: %s", err ? err : "none in tokenizer_config.json");
        free(src);
        free(err);
        return;
    }
    json_object *vars = json_tokener_parse(
        "{\"messages\": [{\"role\": \"system\", \"content\": \"S\"}, {\"role\": \"user\", "
        "\"content\": \"q\"}, {\"role\": \"assistant\", \"content\": \"\", \"tool_calls\": "
        "[{\"function\": {\"name\": \"f\", \"arguments\": {\"a\": [1, 2.5]}}}]}, {\"role\": "
        "\"tool\", \"content\": \"r\"}], \"tools\": [{\"type\": \"function\", \"function\": "
        "{\"name\": \"f\", \"description\": \"d\", \"parameters\": {\"type\": \"object\", "
        "\"properties\": {\"a\": {\"type\": \"array\", \"items\": {\"type\": \"number\"}, "
        "\"description\": \"x\"}}}}}], \"add_generation_prompt\": true}");
    tpl_limits lim = {.now = NOW};
    char *want;
    size_t want_len;
    if (tpl_render(t, vars, &lim, &want, &want_len, &err)) {
        fail("qwen3 chat template render: %s", err);
    } else {
        pthread_t th[8];
        thread_job jobs[8];
        for (int i = 0; i < 8; i++) {
            jobs[i] = (thread_job){t, vars, want, want_len, 0};
            pthread_create(&th[i], NULL, render_many, &jobs[i]);
        }
        int bad = 0;
        for (int i = 0; i < 8; i++) {
            pthread_join(th[i], NULL);
            bad += jobs[i].bad;
        }
        if (bad) fail("concurrent renders: %d of 320 differ", bad);
        free(want);
    }
    free(err);
    json_object_put(vars);
    tpl_free(t);
    free(src);
}

/* ---- the chat API ---------------------------------------------------------------------- */

static char tmpdir[64];

static void write_file(const char *name, const char *text) {
    char path[256];
    snprintf(path, sizeof path, "%s/%s", tmpdir, name);
    FILE *f = fopen(path, "wb");
    if (!f) {
        fail("cannot write %s", path);
        return;
    }
    fputs(text, f);
    fclose(f);
}

static void rm_file(const char *name) {
    char path[256];
    snprintf(path, sizeof path, "%s/%s", tmpdir, name);
    unlink(path);
}

static void expect_chat(tpl_chat *chat, const char *msgs, const char *tools, int agp,
                        const char *extra, int code, const char *want) {
    json_object *m = json_tokener_parse(msgs), *t = tools ? json_tokener_parse(tools) : NULL,
                *x = extra ? json_tokener_parse(extra) : NULL;
    char *out = NULL, *err = NULL;
    int rc = tpl_chat_render(chat, m, t, agp, x, &out, &err);
    checks++;
    if (rc != code)
        fail("chat render: code %d, expected %d (%s)", rc, code, err ? err : out);
    else if (!rc && strcmp(out, want))
        diff("chat render", want, strlen(want), out, strlen(out));
    else if (rc && (!err || !strstr(err, want)))
        fail("chat render: error '%s', expected '%s'", err ? err : "(none)", want);
    free(out);
    free(err);
    json_object_put(m);
    json_object_put(t);
    json_object_put(x);
}

static void test_chat(void) {
    const char *msgs = "[{\"role\": \"user\", \"content\": \"hi\"}]";
    /* a list of named templates, special tokens as strings and AddedToken objects */
    write_file("tokenizer_config.json",
               "{\"bos_token\": {\"__type\": \"AddedToken\", \"content\": \"<s>\"}, "
               "\"eos_token\": \"</s>\", \"unk_token\": null, "
               "\"additional_special_tokens\": [\"<x>\", {\"content\": \"<y>\"}], "
               "\"chat_template\": [{\"name\": \"default\", \"template\": \"{{ bos_token }}D{{ "
               "messages[0].content }}{{ eos_token }}{{ unk_token is defined }}{{ "
               "additional_special_tokens }}{{ tools }}{{ documents }}{{ "
               "add_generation_prompt }}{{ enable_thinking }}\"}, {\"name\": \"tool_use\", "
               "\"template\": \"T{{ tools|length }}\"}]}");
    char *err = NULL;
    tpl_chat *chat = tpl_chat_load(tmpdir, &err);
    checks++;
    if (!chat) {
        fail("tpl_chat_load: %s", err);
        free(err);
        return;
    }
    expect_chat(chat, msgs, NULL, 1, NULL, 0, "<s>Dhi</s>False['<x>', '<y>']NoneNoneTrue");
    expect_chat(chat, msgs, NULL, 0, "{\"enable_thinking\": false, \"bos_token\": \"B\"}", 0,
                "BDhi</s>False['<x>', '<y>']NoneNoneFalseFalse");
    expect_chat(chat, msgs, "[{\"a\": 1}, {\"b\": 2}]", 1, NULL, 0, "T2");
    expect_chat(chat, msgs, NULL, 1, "{\"messages\": []}", TPL_ERR_INPUT, "cannot be overridden");
    tpl_chat_free(chat);

    /* chat_template.jinja replaces the config's templates, as in transformers */
    write_file("chat_template.jinja", "{% if messages|length > 1 %}{{ raise_exception('only "
                                      "one') }}{% endif %}J:{{ messages[0]['content'] }}\n");
    chat = tpl_chat_load(tmpdir, &err);
    checks++;
    if (!chat) {
        fail("tpl_chat_load with chat_template.jinja: %s", err);
        free(err);
        return;
    }
    expect_chat(chat, msgs, "[]", 1, NULL, 0, "J:hi"); /* no tool_use any more */
    expect_chat(chat, "[{\"role\": \"user\", \"content\": \"a\"}, {\"role\": \"user\"}]", NULL, 1,
                NULL, TPL_ERR_RAISED, "only one");
    tpl_chat_free(chat);

    /* the convenience call */
    json_object *m = json_tokener_parse(msgs);
    char *out = NULL;
    int rc = tpl_render_chat(tmpdir, m, NULL, 1, NULL, &out, &err);
    checks++;
    if (rc || strcmp(out, "J:hi")) fail("tpl_render_chat: %s", rc ? err : out);
    free(out);
    free(err);
    err = NULL;

    /* no template at all, and one that does not compile: a message that says so */
    rm_file("chat_template.jinja");
    write_file("tokenizer_config.json", "{\"bos_token\": \"<s>\"}");
    chat = tpl_chat_load(tmpdir, &err);
    checks++;
    if (chat || !err || !strstr(err, "no chat template")) fail("no template: %s", err);
    tpl_chat_free(chat);
    free(err);
    err = NULL;
    rc = tpl_render_chat(tmpdir, m, NULL, 1, NULL, &out, &err);
    checks++;
    if (rc != TPL_ERR_INPUT || !err) fail("tpl_render_chat without a template: %d", rc);
    free(err);
    err = NULL;
    write_file("tokenizer_config.json", "{\"chat_template\": \"{% for %}\"}");
    chat = tpl_chat_load(tmpdir, &err);
    checks++;
    if (chat || !err || !strstr(err, "chat_template: 1:8: syntax error"))
        fail("bad template: %s", err ? err : "(loaded)");
    tpl_chat_free(chat);
    free(err);
    json_object_put(m);
}

/* ---- lmhost template ------------------------------------------------------------------- */

/* runs cli_template with stdout and stderr in files; returns the exit code */
static int run_cli(char **argv, int argc, char **out, char **errs) {
    char op[128], ep[128];
    snprintf(op, sizeof op, "%s/stdout", tmpdir);
    snprintf(ep, sizeof ep, "%s/stderr", tmpdir);
    fflush(stdout);
    fflush(stderr);
    int so = dup(1), se = dup(2);
    int fo = open(op, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    int fe = open(ep, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    dup2(fo, 1);
    dup2(fe, 2);
    int rc = cli_template(argc, argv);
    fflush(stdout);
    fflush(stderr);
    dup2(so, 1);
    dup2(se, 2);
    close(so);
    close(se);
    close(fo);
    close(fe);
    *out = test_slurp(op, NULL);
    *errs = test_slurp(ep, NULL);
    return rc;
}

static void expect_cli(int code, const char *want_out, const char *want_err, ...) {
    char *argv[32];
    int argc = 0;
    argv[argc++] = "template";
    va_list ap;
    va_start(ap, want_err);
    char *a;
    while ((a = va_arg(ap, char *)) && argc < 31) argv[argc++] = a;
    va_end(ap);
    argv[argc] = NULL;
    char *out, *errs;
    int rc = run_cli(argv, argc, &out, &errs);
    checks++;
    if (rc != code)
        fail("lmhost template %s ...: exit %d, expected %d (%s)", argv[1], rc, code,
             errs ? errs : "");
    else if (want_out && strcmp(out ? out : "", want_out))
        diff("lmhost template output", want_out, strlen(want_out), out ? out : "",
             out ? strlen(out) : 0);
    else if (want_err && (!errs || !strstr(errs, want_err)))
        fail("lmhost template: stderr '%s', expected it to hold '%s'", errs ? errs : "", want_err);
    free(out);
    free(errs);
}

static void test_cli(void) {
    write_file("tokenizer_config.json",
               "{\"bos_token\": \"<s>\", \"chat_template\": \"{{ bos_token }}{% for m in "
               "messages %}{% if m.role == 'x' %}{{ raise_exception('bad role x') }}{% endif "
               "%}[{{ m.role }}]{{ m.content }}\\n{% endfor %}{% if tools %}{{ tools|tojson "
               "}}{% endif %}{% if add_generation_prompt %}>{% endif %}{{ v }}\"}");
    write_file("tokenizer.json", "{}");
    write_file("m.json", "[{\"role\": \"user\", \"content\": \"hi \\u00e9\"}]");
    write_file("x.json", "{\"messages\": [{\"role\": \"x\", \"content\": \"?\"}]}");
    write_file("t.json", "[{\"type\": \"function\", \"function\": {\"name\": \"f\"}}]");
    write_file("t.jinja", "other {{ messages|length }}");
    char m[128], x[128], t[128], tj[128], missing[128];
    snprintf(m, sizeof m, "%s/m.json", tmpdir);
    snprintf(x, sizeof x, "%s/x.json", tmpdir);
    snprintf(t, sizeof t, "%s/t.json", tmpdir);
    snprintf(tj, sizeof tj, "%s/t.jinja", tmpdir);
    snprintf(missing, sizeof missing, "%s/missing.json", tmpdir);
    expect_cli(0, "<s>[user]hi é\n>", NULL, "--model", tmpdir, "--messages-file", m, NULL);
    expect_cli(0, "<s>[user]hi é\n", NULL, "--model", tmpdir, "--messages-file", m,
               "--no-generation-prompt", NULL);
    expect_cli(0,
               "<s>[user]hi é\n[{\"type\": \"function\", \"function\": {\"name\": \"f\"}}]>[1, "
               "'a']",
               NULL, "--model", tmpdir, "--messages-file", m, "--tools-file", t, "--var",
               "v=[1, \"a\"]", NULL);
    char joined[160];
    snprintf(joined, sizeof joined, "--model=%s", tmpdir);
    expect_cli(0, "<s>[user]hi é\n>x", NULL, joined, "--messages-file", m, "--var=v=\"x\"", NULL);
    expect_cli(1, "", "bad role x", "--model", tmpdir, "--messages-file", x, NULL);
    expect_cli(0, "other 1", NULL, "--model", tmpdir, "--messages-file", m, "--template-file", tj,
               NULL);
    expect_cli(2, "", "--var takes NAME=JSON", "--model", tmpdir, "--messages-file", m, "--var",
               "novalue", NULL);
    expect_cli(2, "", "not valid JSON", "--model", tmpdir, "--messages-file", m, "--var", "v=nope",
               NULL);
    expect_cli(2, "", "need --model", "--messages-file", m, NULL);
    expect_cli(2, "", "unknown option", "--model", tmpdir, "--messages-file", m, "--bogus", NULL);
    expect_cli(1, "", "cannot read", "--model", tmpdir, "--messages-file", missing, NULL);
    expect_cli(0, NULL, NULL, "--help", NULL);
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s TESTS_TEMPLATE_DIR\n", argv[0]);
        return 2;
    }
    setenv("TZ", "UTC", 1); /* strftime_now formats local time */
    tzset();
    run_lang(argv[1]);
    run_real(argv[1]);
    test_errors();
    test_limits();
    test_threads();
    snprintf(tmpdir, sizeof tmpdir, "/tmp/lmhost-tpl-XXXXXX");
    if (!mkdtemp(tmpdir)) {
        fail("mkdtemp");
    } else {
        test_chat();
        test_cli();
        const char *names[] = {"tokenizer_config.json",
                               "tokenizer.json",
                               "chat_template.jinja",
                               "m.json",
                               "x.json",
                               "t.json",
                               "t.jinja",
                               "stdout",
                               "stderr"};
        for (size_t i = 0; i < sizeof names / sizeof *names; i++) rm_file(names[i]);
        rmdir(tmpdir);
    }
    printf("%d checks, %d failed\n", checks, failures);
    return failures ? 1 : 0;
}
