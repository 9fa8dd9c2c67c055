/* lmhost tokenize / detokenize. Output is one JSON object and a newline on stdout; errors go
 * to stderr with a non-zero exit code (2 for usage errors, 1 for failures). */
#include "tokenizer.h"
#include "tokenizer_cli.h"
#include "../cli_help.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <json-c/json.h>

/* An option, and what --help says of it: the value's name (NULL for flags), its default
 * ("required", "off"...) and one line. */
typedef struct {
    const char *name;
    const char **val; /* NULL for a flag */
    int *flag;
    const char *arg, *def, *help;
} opt;

/* A command's help: its table, one line about it and notes after the options. */
typedef struct {
    const char *about, *notes;
    const opt *opts;
} cmd_help;

/* As lmhost's other commands print it (core/cli's cli_help). */
static void usage(FILE *f, const char *cmd, const cmd_help *h) {
    fprintf(f, "usage: lmhost %s", cmd);
    for (const opt *o = h->opts; o->name; o++)
        if (o->def && !strcmp(o->def, "required"))
            fprintf(f, " %s%s%s", o->name, o->arg ? " " : "", o->arg ? o->arg : "");
    fprintf(f, " [options]\n\n%s\n\noptions:\n", h->about);
    for (const opt *o = h->opts; o->name; o++)
        text_cli_help_row(f, o->name, o->arg, o->def, o->help);
    text_cli_help_row(f, "-h, --help", NULL, NULL, "print this help and exit");
    if (h->notes) fprintf(f, "\n%s\n", h->notes);
}

/* Returns 0, 2 (usage error, printed) or 1 (help printed: exit 0). */
static int parse(int argc, char **argv, const cmd_help *h) {
    const opt *opts = h->opts;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout, argv[0], h);
            return 1;
        }
        if (!strcmp(a, "--list-options")) { /* for the tests: every option, one a line */
            for (const opt *o = opts; o->name; o++) printf("%s\n", o->name);
            printf("--help\n");
            return 1;
        }
        const char *eq = strchr(a, '=');
        size_t nl = eq ? (size_t)(eq - a) : strlen(a);
        const opt *o = NULL;
        for (const opt *p = opts; p->name; p++)
            if (strlen(p->name) == nl && !strncmp(p->name, a, nl)) o = p;
        if (!o) {
            fprintf(stderr, "lmhost %s: unknown option '%s'\n", argv[0], a);
            usage(stderr, argv[0], h);
            return 2;
        }
        if (o->flag) {
            if (eq) {
                fprintf(stderr, "lmhost %s: %s takes no value\n", argv[0], o->name);
                return 2;
            }
            *o->flag = 1;
            continue;
        }
        const char *v = eq ? eq + 1 : (i + 1 < argc ? argv[++i] : NULL);
        if (!v) {
            fprintf(stderr, "lmhost %s: %s needs a value\n", argv[0], o->name);
            return 2;
        }
        if (*o->val) {
            fprintf(stderr, "lmhost %s: %s given twice\n", argv[0], o->name);
            return 2;
        }
        *o->val = v;
    }
    return 0;
}

static tok_tokenizer *open_model(const char *cmd, const char *dir) {
    char err[512];
    tok_tokenizer *t = tok_load(dir, err, sizeof err);
    if (!t) fprintf(stderr, "lmhost %s: cannot load the tokenizer: %s\n", cmd, err);
    return t;
}

static char *read_all(const char *path, size_t *len) {
    FILE *f = strcmp(path, "-") ? fopen(path, "rb") : stdin;
    if (!f) return NULL;
    size_t cap = 1 << 16, n = 0;
    char *b = malloc(cap);
    while (b) {
        if (n == cap) {
            char *nb = cap < ((size_t)1 << 40) ? realloc(b, cap * 2) : NULL;
            if (!nb) {
                free(b);
                b = NULL;
                errno = ENOMEM;
                break;
            }
            b = nb;
            cap *= 2;
        }
        size_t k = fread(b + n, 1, cap - n, f);
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
    *len = n;
    return b;
}

int cli_tokenize(int argc, char **argv) {
    const char *model = NULL, *text = NULL, *file = NULL;
    int special = 0;
    const opt opts[] = {
        {"--model", &model, NULL, "DIR", "required",
         "the model: a directory (tokenizer.json), or a Hugging Face name in the cache"},
        {"--text", &text, NULL, "S", "required (or --text-file)", "the text"},
        {"--text-file", &file, NULL, "F", "required (or --text)", "the text from F ('-': stdin)"},
        {"--special", NULL, &special, NULL, "off",
         "add the tokenizer's own BOS/EOS (add_special_tokens=True)"},
        {NULL, NULL, NULL, NULL, NULL, NULL}};
    const cmd_help h = {"text to token ids", "Prints {\"ids\": [...]}.", opts};
    int rc = parse(argc, argv, &h);
    if (rc) return rc == 1 ? 0 : rc;
    if (!model || (!text) == (!file)) {
        fprintf(stderr, "lmhost %s: need --model and exactly one of --text, --text-file\n",
                argv[0]);
        usage(stderr, argv[0], &h);
        return 2;
    }
    size_t len = text ? strlen(text) : 0;
    char *buf = NULL;
    if (file) {
        buf = read_all(file, &len);
        if (!buf) {
            fprintf(stderr, "lmhost %s: cannot read %s: %s\n", argv[0], file, strerror(errno));
            return 1;
        }
        text = buf;
    }
    tok_tokenizer *t = open_model(argv[0], model);
    if (!t) {
        free(buf);
        return 1;
    }
    int32_t *ids;
    size_t n;
    if (tok_encode(t, text, len, special, &ids, &n)) {
        fprintf(stderr, "lmhost %s: out of memory\n", argv[0]);
        free(buf);
        tok_free(t);
        return 1;
    }
    fputs("{\"ids\": [", stdout);
    for (size_t i = 0; i < n; i++) printf(i ? ", %d" : "%d", (int)ids[i]);
    fputs("]}\n", stdout);
    free(ids);
    free(buf);
    tok_free(t);
    return fflush(stdout) == 0 && !ferror(stdout) ? 0 : 1;
}

/* "1,2,3" (spaces and surrounding brackets allowed) into ids, each below vocab. */
static int parse_ids(const char *cmd, const char *s, size_t vocab, int32_t **out, size_t *n) {
    size_t cap = 16, k = 0;
    int32_t *v = malloc(cap * sizeof *v);
    if (!v) return -1;
    const char *p = s;
    while (*p == ' ' || *p == '[') p++;
    while (*p && *p != ']') {
        char *end;
        errno = 0;
        long long x = strtoll(p, &end, 10);
        if (end == p || errno || x < 0 || (unsigned long long)x >= vocab) {
            if (end == p)
                fprintf(stderr, "lmhost %s: --ids must be integers separated by commas (at '%s')\n",
                        cmd, p);
            else
                fprintf(stderr, "lmhost %s: id %.*s is outside the vocabulary (size %zu)\n", cmd,
                        (int)(end - p), p, vocab);
            free(v);
            return -1;
        }
        if (k == cap) {
            int32_t *nv = realloc(v, cap * 2 * sizeof *nv);
            if (!nv) {
                free(v);
                return -1;
            }
            v = nv;
            cap *= 2;
        }
        v[k++] = (int32_t)x;
        p = end;
        while (*p == ' ') p++;
        if (*p == ',') {
            p++;
            while (*p == ' ') p++;
            if (!*p || *p == ']') {
                fprintf(stderr, "lmhost %s: --ids ends with a comma\n", cmd);
                free(v);
                return -1;
            }
        } else if (*p && *p != ']') {
            fprintf(stderr, "lmhost %s: --ids must be integers separated by commas (at '%s')\n",
                    cmd, p);
            free(v);
            return -1;
        }
    }
    if (*p == ']') p++;
    while (*p == ' ') p++;
    if (*p) {
        fprintf(stderr, "lmhost %s: unexpected '%s' after --ids\n", cmd, p);
        free(v);
        return -1;
    }
    *out = v;
    *n = k;
    return 0;
}

int cli_detokenize(int argc, char **argv) {
    const char *model = NULL, *ids_s = NULL;
    const opt opts[] = {
        {"--model", &model, NULL, "DIR", "required",
         "the model: a directory (tokenizer.json), or a Hugging Face name in the cache"},
        {"--ids", &ids_s, NULL, "1,2,3", "required", "the token ids"},
        {NULL, NULL, NULL, NULL, NULL, NULL}};
    const cmd_help h = {"token ids to text", "Prints {\"text\": \"...\"} with special tokens kept.",
                        opts};
    int rc = parse(argc, argv, &h);
    if (rc) return rc == 1 ? 0 : rc;
    if (!model || !ids_s) {
        fprintf(stderr, "lmhost %s: need --model and --ids\n", argv[0]);
        usage(stderr, argv[0], &h);
        return 2;
    }
    tok_tokenizer *t = open_model(argv[0], model);
    if (!t) return 1;
    int32_t *ids;
    size_t n, len;
    if (parse_ids(argv[0], ids_s, tok_vocab_size(t), &ids, &n)) {
        tok_free(t);
        return 2;
    }
    /* as transformers' decode: clean_up_tokenization_spaces as tokenizer_config.json says */
    unsigned flags = tok_cleanup_spaces_default(t) ? TOK_DECODE_CLEANUP_SPACES : 0;
    char *text = tok_decode_ex(t, ids, n, flags, &len);
    free(ids);
    tok_free(t);
    if (!text) {
        fprintf(stderr, "lmhost %s: out of memory\n", argv[0]);
        return 1;
    }
    json_object *js = len <= 0x7fffffff ? json_object_new_string_len(text, (int)len) : NULL;
    free(text);
    if (!js) {
        fprintf(stderr, "lmhost %s: out of memory\n", argv[0]);
        return 1;
    }
    printf("{\"text\": %s}\n", json_object_to_json_string_ext(
                                   js, JSON_C_TO_STRING_PLAIN | JSON_C_TO_STRING_NOSLASHESCAPE));
    json_object_put(js);
    return fflush(stdout) == 0 && !ferror(stdout) ? 0 : 1;
}
