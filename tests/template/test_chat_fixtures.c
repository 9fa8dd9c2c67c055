/* The chat cases of a tokenizer's reference file (tests/data/tokenizers/NAME.json, rendered by
 * transformers' apply_chat_template) against our renderer, with the real tokenizer_config.json
 * from $LMHOST_TOKENIZERS/NAME (default ~/.cache/lmhost/tokenizers; fetch them with
 * tools/fetch_tokenizers.sh). A missing tokenizer fails: it never passes silently.
 * usage: test_chat_fixtures NAME CASES_DIR */
#include "chat_template.h"
#include "../test_io.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <json-c/json.h>

static void diff(const char *want, const char *got) {
    size_t wl = strlen(want), gl = strlen(got), i = 0;
    while (i < wl && i < gl && want[i] == got[i]) i++;
    size_t from = i > 60 ? i - 60 : 0;
    printf("    first difference at byte %zu (expected %zu bytes, got %zu)\n", i, wl, gl);
    printf("    expected: ...");
    test_show(want + from, (wl < i + 60 ? wl : i + 60) - from);
    printf("\n    got:      ...");
    test_show(got + from, (gl < i + 60 ? gl : i + 60) - from);
    printf("\n");
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: %s NAME CASES_DIR\n", argv[0]);
        return 2;
    }
    const char *name = argv[1];
    char path[8192], dir[6144];
    const char *root = getenv("LMHOST_TOKENIZERS");
    char home_root[4096];
    /* sizes leave room for what is appended */
    if (!root || !*root) {
        const char *home = getenv("HOME");
        snprintf(home_root, sizeof home_root, "%s/.cache/lmhost/tokenizers", home ? home : ".");
        root = home_root;
    }
    snprintf(dir, sizeof dir, "%s/%s", root, name);
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    struct stat st;
    if (stat(path, &st) != 0) {
        printf("FAIL: %s is missing: run tools/fetch_tokenizers.sh %s (or set LMHOST_TOKENIZERS "
               "to where the tokenizers are)\n",
               path, root);
        return 1;
    }
    snprintf(path, sizeof path, "%s/%s.json", argv[2], name);
    json_object *cases = json_object_from_file(path);
    if (!cases || !json_object_is_type(cases, json_type_array)) {
        printf("FAIL: cannot read the cases in %s\n", path);
        return 1;
    }
    char *err = NULL;
    tpl_chat *chat = NULL;
    int nchat = 0, failed = 0;
    size_t n = json_object_array_length(cases);
    for (size_t i = 0; i < n; i++) {
        json_object *c = json_object_array_get_idx(cases, i), *kind, *msgs, *agp, *extra = NULL,
                    *tools = NULL, *want;
        if (!json_object_object_get_ex(c, "kind", &kind) ||
            strcmp(json_object_get_string(kind), "chat"))
            continue;
        nchat++;
        if (!chat && !(chat = tpl_chat_load(dir, &err))) {
            printf("FAIL: %s: %s\n", dir, err);
            free(err);
            json_object_put(cases);
            return 1;
        }
        json_object_object_get_ex(c, "messages", &msgs);
        json_object_object_get_ex(c, "add_generation_prompt", &agp);
        json_object_object_get_ex(c, "extra", &extra);
        json_object_object_get_ex(c, "tools", &tools);
        json_object_object_get_ex(c, "rendered", &want);
        char *out = NULL;
        int rc =
            tpl_chat_render(chat, msgs, tools, json_object_get_boolean(agp), extra, &out, &err);
        int want_error = json_object_is_type(want, json_type_object);
        if (want_error) {
            json_object *msg = NULL;
            json_object_object_get_ex(want, "error", &msg);
            if (rc == 0) {
                printf("FAIL case %zu: expected the error \"%s\", got a rendering\n", i,
                       json_object_get_string(msg));
                failed++;
            } else {
                printf("ok   case %zu: error as expected: %s\n", i, err);
            }
        } else if (rc != 0) {
            printf("FAIL case %zu: %s\n", i, err);
            failed++;
        } else if (strcmp(out, json_object_get_string(want))) {
            printf("FAIL case %zu: the rendering differs\n", i);
            diff(json_object_get_string(want), out);
            failed++;
        } else {
            printf("ok   case %zu (%zu bytes)\n", i, strlen(out));
        }
        free(out);
        free(err);
        err = NULL;
    }
    if (nchat == 0) {
        /* nothing to render: the tokenizer has no chat template, and loading says so */
        tpl_chat *none = tpl_chat_load(dir, &err);
        printf("%s: no chat cases; loading its template: %s\n", name,
               none  ? "found one"
               : err ? err
                     : "(no message)");
        tpl_chat_free(none);
        free(err);
    }
    tpl_chat_free(chat);
    json_object_put(cases);
    printf("%s: %d chat case%s, %d failed\n", name, nchat, nchat == 1 ? "" : "s", failed);
    return failed ? 1 : 0;
}
