/* lmhost template: renders a model's chat template for a conversation read from a file and
 * prints exactly the rendered text. Errors go to stderr with exit code 1 (2 for usage). */
#include "chat_template.h"
#include "template_cli.h"
#include "../cli_help.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <json-c/json.h>

/* The options, for --help and --list-options: name, value, default, explanation. */
static const struct {
    const char *name, *arg, *def, *help;
} options[] = {
    {"--model", "DIR", "required",
     "the model: a directory (tokenizer_config.json or chat_template.jinja), or a Hugging Face "
     "name in the cache"},
    {"--messages-file", "F.json", "required",
     "the conversation: a list of messages, or an object with \"messages\" ('-': stdin)"},
    {"--tools-file", "F.json", "none", "the tools the template is given"},
    {"--no-generation-prompt", NULL, "off", "leave out the prompt of the assistant's turn"},
    {"--var", "NAME=JSON", "none",
     "a template variable set to a JSON value (--var enable_thinking=false, --var "
     "'date_string=\"26 Jul 2024\"'); may repeat"},
    {"--template-file", "F.jinja", "the model's",
     "render this template instead of the model's ('-': stdin)"},
};

static void usage(FILE *f) {
    fprintf(f, "usage: lmhost template --model DIR --messages-file F.json [options]\n\n"
               "render a chat template\n\noptions:\n");
    for (size_t i = 0; i < sizeof options / sizeof *options; i++)
        text_cli_help_row(f, options[i].name, options[i].arg, options[i].def, options[i].help);
    text_cli_help_row(f, "-h, --help", NULL, NULL, "print this help and exit");
    fprintf(f, "\nPrints the template rendered for the messages, exactly, with nothing added.\n");
}

static char *slurp(const char *path, size_t *len) {
    FILE *f = strcmp(path, "-") ? fopen(path, "rb") : stdin;
    if (!f) return NULL;
    size_t cap = 65536, n = 0;
    char *b = malloc(cap);
    while (b) {
        if (n + 1 >= cap) {
            char *nb = cap < ((size_t)1 << 32) ? realloc(b, cap * 2) : NULL;
            if (!nb) {
                free(b);
                b = NULL;
                errno = ENOMEM;
                break;
            }
            b = nb;
            cap *= 2;
        }
        size_t k = fread(b + n, 1, cap - n - 1, f);
        n += k;
        if (k == 0) {
            if (ferror(f)) {
                free(b);
                b = NULL;
                errno = EIO;
            }
            break;
        }
    }
    if (f != stdin) fclose(f);
    if (b) b[n] = 0;
    *len = n;
    return b;
}

/* parses a whole JSON document (text[len] must be NUL); prints the error */
static json_object *parse_json(const char *cmd, const char *what, const char *text, size_t len) {
    json_tokener *tk = json_tokener_new_ex(JSON_TOKENER_DEFAULT_DEPTH * 8);
    if (!tk) {
        fprintf(stderr, "lmhost %s: out of memory\n", cmd);
        return NULL;
    }
    /* the terminating NUL goes in too: it ends a bare number or literal ("false") */
    json_object *o = len < 0x7fffffff ? json_tokener_parse_ex(tk, text, (int)len + 1) : NULL;
    enum json_tokener_error e = json_tokener_get_error(tk);
    size_t end = json_tokener_get_parse_end(tk);
    if (end > len) end = len;
    json_tokener_free(tk);
    if (e != json_tokener_success) {
        json_object_put(o);
        fprintf(stderr, "lmhost %s: %s is not valid JSON: %s\n", cmd, what,
                e == json_tokener_continue ? "unexpected end" : json_tokener_error_desc(e));
        return NULL;
    }
    while (end < len &&
           (text[end] == ' ' || text[end] == '\n' || text[end] == '\r' || text[end] == '\t'))
        end++;
    if (end < len) {
        json_object_put(o);
        fprintf(stderr, "lmhost %s: %s is not valid JSON: trailing data\n", cmd, what);
        return NULL;
    }
    if (!o) o = json_object_new_null(); /* "null" parses to NULL */
    return o;
}

static json_object *read_json(const char *cmd, const char *path) {
    size_t len;
    char *text = slurp(path, &len);
    if (!text) {
        fprintf(stderr, "lmhost %s: cannot read %s: %s\n", cmd, path, strerror(errno));
        return NULL;
    }
    json_object *o = parse_json(cmd, path, text, len);
    free(text);
    return o;
}

int cli_template(int argc, char **argv) {
    const char *cmd = argv[0];
    const char *model = NULL, *messages_file = NULL, *tools_file = NULL, *template_file = NULL;
    int no_gen = 0, rc = 1;
    json_object *vars = json_object_new_object();
    json_object *messages = NULL, *tools = NULL;
    char *out = NULL, *err = NULL;
    tpl_chat *chat = NULL;
    if (!vars) {
        fprintf(stderr, "lmhost %s: out of memory\n", cmd);
        return 1;
    }
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            json_object_put(vars);
            return 0;
        }
        if (!strcmp(a, "--list-options")) { /* for the tests: every option, one a line */
            for (size_t k = 0; k < sizeof options / sizeof *options; k++)
                printf("%s\n", options[k].name);
            printf("--help\n");
            json_object_put(vars);
            return 0;
        }
        if (!strcmp(a, "--no-generation-prompt")) {
            no_gen = 1;
            continue;
        }
        const char *names[] = {"--model", "--messages-file", "--tools-file", "--var",
                               "--template-file"};
        const char **dest[] = {&model, &messages_file, &tools_file, NULL, &template_file};
        size_t k = 0, nl = 0;
        for (; k < 5; k++) {
            nl = strlen(names[k]);
            if (!strncmp(a, names[k], nl) && (a[nl] == 0 || a[nl] == '=')) break;
        }
        if (k == 5) {
            fprintf(stderr, "lmhost %s: unknown option '%s'\n", cmd, a);
            usage(stderr);
            rc = 2;
            goto done;
        }
        const char *v = a[nl] == '=' ? a + nl + 1 : (i + 1 < argc ? argv[++i] : NULL);
        if (!v) {
            fprintf(stderr, "lmhost %s: %s needs a value\n", cmd, names[k]);
            rc = 2;
            goto done;
        }
        if (dest[k]) {
            if (*dest[k]) {
                fprintf(stderr, "lmhost %s: %s given twice\n", cmd, names[k]);
                rc = 2;
                goto done;
            }
            *dest[k] = v;
            continue;
        }
        /* --var NAME=JSON */
        const char *eq = strchr(v, '=');
        if (!eq || eq == v) {
            fprintf(stderr, "lmhost %s: --var takes NAME=JSON, not '%s'\n", cmd, v);
            rc = 2;
            goto done;
        }
        char name[256];
        snprintf(name, sizeof name, "%.*s", (int)(eq - v), v);
        char what[600];
        snprintf(what, sizeof what, "the value of --var %s (quote strings: %s='\"text\"')", name,
                 name);
        json_object *jv = parse_json(cmd, what, eq + 1, strlen(eq + 1));
        if (!jv) {
            rc = 2;
            goto done;
        }
        json_object_object_add(vars, name, jv);
    }
    if (!model || !messages_file) {
        fprintf(stderr, "lmhost %s: need --model and --messages-file\n", cmd);
        usage(stderr);
        rc = 2;
        goto done;
    }
    if (!(messages = read_json(cmd, messages_file))) goto done;
    json_object *inner;
    if (json_object_is_type(messages, json_type_object) &&
        json_object_object_get_ex(messages, "messages", &inner)) {
        json_object_get(inner);
        json_object_put(messages);
        messages = inner;
    }
    if (!json_object_is_type(messages, json_type_array)) {
        fprintf(stderr, "lmhost %s: %s must hold a list of messages\n", cmd, messages_file);
        goto done;
    }
    if (tools_file && !(tools = read_json(cmd, tools_file))) goto done;
    if (tools && json_object_is_type(tools, json_type_null)) {
        json_object_put(tools);
        tools = NULL;
    }
    chat = tpl_chat_load(model, &err);
    if (template_file) {
        /* the model's special tokens, this template */
        size_t len;
        char *src = slurp(template_file, &len);
        if (!src) {
            fprintf(stderr, "lmhost %s: cannot read %s: %s\n", cmd, template_file, strerror(errno));
            goto done;
        }
        json_object *cfg = json_object_new_object();
        char path[4096];
        snprintf(path, sizeof path, "%s/tokenizer_config.json", model);
        json_object *model_cfg = json_object_from_file(path);
        if (model_cfg && json_object_is_type(model_cfg, json_type_object)) {
            json_object_object_foreach(model_cfg, key, val) {
                if (strcmp(key, "chat_template"))
                    json_object_object_add(cfg, key, json_object_get(val));
            }
        }
        json_object_put(model_cfg);
        json_object_object_add(cfg, "chat_template", json_object_new_string_len(src, (int)len));
        free(src);
        free(err);
        err = NULL;
        tpl_chat_free(chat);
        chat = tpl_chat_from_config(cfg, &err);
        json_object_put(cfg);
    }
    if (!chat) {
        fprintf(stderr, "lmhost %s: %s\n", cmd, err ? err : "cannot load the chat template");
        goto done;
    }
    size_t out_len = 0;
    int r = tpl_chat_render_ex(chat, messages, tools, !no_gen, vars, NULL, &out, &out_len, &err);
    if (r) {
        fprintf(stderr, "lmhost %s: %s%s\n", cmd,
                r == TPL_ERR_RAISED ? "the template raised an error at " : "", err);
        goto done;
    }
    if (fwrite(out, 1, out_len, stdout) != out_len || fflush(stdout) != 0) {
        fprintf(stderr, "lmhost %s: cannot write the output: %s\n", cmd, strerror(errno));
        goto done;
    }
    rc = 0;
done:
    free(out);
    free(err);
    tpl_chat_free(chat);
    json_object_put(messages);
    json_object_put(tools);
    json_object_put(vars);
    return rc;
}
