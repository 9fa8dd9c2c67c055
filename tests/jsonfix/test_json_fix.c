/* json_fix_surrogates: escaped surrogate pairs inside strings become raw UTF-8, and nothing
 * else changes (escaped backslashes, lone or reversed surrogates, text outside strings, a
 * pair cut short); json-c then reads the rewritten text as the code points. */
#include "json_fix.h"

#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int fails, checks;

/* in: JSON text; want: the rewrite, or NULL for "left as it is" */
static void expect(const char *in, const char *want) {
    char *out = NULL;
    size_t n = 0;
    int r = json_fix_surrogates(in, strlen(in), &out, &n);
    checks++;
    if (want ? r != 1 || n != strlen(want) || memcmp(out, want, n) || out[n] : r != 0) {
        fprintf(stderr, "FAIL %s: got %d '%.*s'\n", in, r, r == 1 ? (int)n : 0, r == 1 ? out : "");
        fails++;
    }
    free(out);
}

/* the whole chain: the string value of key "s" in the rewritten text */
static void expect_value(const char *in, const char *want) {
    char *out = NULL;
    size_t n = 0;
    int r = json_fix_surrogates(in, strlen(in), &out, &n);
    json_object *o = json_tokener_parse(r == 1 ? out : in), *v = NULL;
    const char *got = o && json_object_object_get_ex(o, "s", &v) ? json_object_get_string(v) : NULL;
    checks++;
    if (!got || strcmp(got, want)) {
        fprintf(stderr, "FAIL value of %s\n", in);
        fails++;
    }
    json_object_put(o);
    free(out);
}

int main(void) {
    /* U+1D800 (one of the pairs json-c 0.16 alone reads as U+FFFD), U+1F600, U+10000, U+10FFFF */
    expect("{\"s\":\"\\ud836\\udc00\"}", "{\"s\":\"\xF0\x9D\xA0\x80\"}");
    expect("[\"a\\uD83D\\uDE00b\", \"\\ud800\\udc00\\udbff\\udfff\"]",
           "[\"a\xF0\x9F\x98\x80"
           "b\", \"\xF0\x90\x80\x80\xF4\x8F\xBF\xBF\"]");
    expect("\"\\\"\\ud836\\udc00\"", "\"\\\"\xF0\x9D\xA0\x80\""); /* after an escaped quote */
    expect("\"\\\\ud836\\udc00\"", NULL); /* an escaped backslash, then text */
    expect("\"\\ud836\"", NULL);          /* a lone high surrogate */
    expect("\"\\udc00\\ud836\"", NULL);   /* reversed */
    expect("\"\\ud836\\u0041\"", NULL);   /* high then not low */
    expect("\\ud836\\udc00", NULL);       /* outside a string */
    expect("\"\\ud836\\udc0", NULL);      /* cut short */
    expect("\"\\ud836\\udcZZ\"", NULL);   /* not hex */
    expect("{\"k\":\"plain\"}", NULL);
    expect("", NULL);
    expect_value("{\"s\":\"x\\ud836\\udc00y\"}", "x\xF0\x9D\xA0\x80y");
    expect_value("{\"s\":\"\\ud837\\udfff\\ud876\\udc00\"}", "\xF0\x9D\xBF\xBF\xF0\xAD\xA0\x80");
    printf("%d checks, %d failed\n", checks, fails);
    return fails ? 1 : 0;
}
