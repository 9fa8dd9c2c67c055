/* The public API: rendering a compiled template with variables, and the chat templates of a
 * model directory rendered as transformers' apply_chat_template does. */
#include "tpl_internal.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define DEFAULT_MAX_OUTPUT ((size_t)32 << 20)
#define DEFAULT_MAX_MEMORY ((size_t)256 << 20)
#define DEFAULT_MAX_STEPS  20000000ULL
#define DEFAULT_MAX_DEPTH  1000

static char *xstrdup(const char *s) {
    char *r = strdup(s);
    return r;
}

static char *fmt_err(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static char *fmt_err(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    char *r = NULL;
    if (vasprintf(&r, fmt, ap) < 0) r = NULL;
    va_end(ap);
    return r;
}

/* ---- rendering ------------------------------------------------------------------------- */

enum { VK_JSON, VK_STR, VK_BOOL, VK_NONE, VK_STRLIST };

typedef struct {
    const char *name;
    int kind;
    json_object *json;
    const char *str;
    int b;
    char *const *strs;
    size_t nstrs;
} tvar;

/* the render proper; 0, or 1 after an error (longjmp) */
static int render_body(tctx *c, const tpl_template *t, const tvar *vars, size_t nvars, char **out,
                       size_t *out_len) {
    if (setjmp(*c->jb)) return 1;
    c->root = tpl_frame_new(c, NULL);
    c->frame = c->root;
    c->out = tpl_str_new(c, NULL, 1024);
    for (size_t i = 0; i < nvars; i++) {
        const tvar *v = &vars[i];
        val x;
        switch (v->kind) {
        case VK_JSON:
            x = tpl_from_json(c, NULL, v->json, 0);
            break;
        case VK_STR:
            x = tpl_cstr_val(c, NULL, v->str);
            break;
        case VK_BOOL:
            x = v_bool(v->b);
            break;
        case VK_STRLIST: {
            tlist *l = tpl_list_new(c, NULL, v->nstrs);
            x = v_obj(V_LIST, l);
            for (size_t k = 0; k < v->nstrs; k++)
                tpl_list_push(c, NULL, l, tpl_cstr_val(c, NULL, v->strs[k]));
            break;
        }
        default:
            x = v_none();
            break;
        }
        tpl_frame_set(c, c->root, VSTR(tpl_cstr_val(c, NULL, v->name)), x);
    }
    tpl_exec(c, t->root);
    /* the output's buffer becomes the caller's */
    *out = c->out->s;
    if (out_len) *out_len = c->out->len;
    c->out->s = NULL;
    c->out->cap = 0;
    return 0;
}

static int render_vars(const tpl_template *t, const tvar *vars, size_t nvars, const tpl_limits *lim,
                       char **out, size_t *out_len, char **err) {
    if (out) *out = NULL;
    if (out_len) *out_len = 0;
    if (err) *err = NULL;
    if (!t || !out) {
        if (err) *err = xstrdup("no template or output given");
        return TPL_ERR_INPUT;
    }
    /* on the heap: nothing in it is lost by the longjmp of an error */
    tctx *c = calloc(1, sizeof *c);
    jmp_buf *jb = malloc(sizeof *jb);
    if (!c || !jb) {
        free(c);
        free(jb);
        if (err) *err = xstrdup("out of memory");
        return TPL_ERR_NOMEM;
    }
    c->jb = jb;
    c->live.next = c->live.prev = &c->live;
    c->live.rc = -1;
    c->tpl = t;
    c->max_output = lim && lim->max_output ? lim->max_output : DEFAULT_MAX_OUTPUT;
    c->max_mem = lim && lim->max_memory ? lim->max_memory : DEFAULT_MAX_MEMORY;
    c->max_steps = lim && lim->max_steps ? lim->max_steps : DEFAULT_MAX_STEPS;
    c->max_depth = lim && lim->max_depth > 0 ? lim->max_depth : DEFAULT_MAX_DEPTH;
    c->now = lim && lim->now ? lim->now : (int64_t)time(NULL);
    int rc = 0;
    if (render_body(c, t, vars, nvars, out, out_len)) {
        rc = c->err_code ? c->err_code : TPL_ERR_RUNTIME;
        if (err)
            *err = c->err ? c->err : xstrdup("out of memory");
        else
            free(c->err);
        c->err = NULL;
    }
    tpl_sweep(c);
    free(c->err);
    free(c);
    free(jb);
    return rc;
}

int tpl_render(const tpl_template *t, json_object *vars, const tpl_limits *limits, char **out,
               size_t *out_len, char **err) {
    size_t n = vars && json_object_is_type(vars, json_type_object)
                   ? (size_t)json_object_object_length(vars)
                   : 0;
    if (vars && !json_object_is_type(vars, json_type_object)) {
        if (out) *out = NULL;
        if (err) *err = xstrdup("the variables must be a JSON object");
        return TPL_ERR_INPUT;
    }
    tvar *tv = calloc(n + 1, sizeof *tv);
    if (!tv) {
        if (err) *err = xstrdup("out of memory");
        return TPL_ERR_NOMEM;
    }
    size_t k = 0;
    if (vars) {
        json_object_object_foreach(vars, key, v) {
            tv[k].name = key;
            tv[k].kind = VK_JSON;
            tv[k].json = v;
            k++;
        }
    }
    int rc = render_vars(t, tv, k, limits, out, out_len, err);
    free(tv);
    return rc;
}

/* ---- chat templates -------------------------------------------------------------------- */

static const char *const special_names[] = {"bos_token", "eos_token", "unk_token", "sep_token",
                                            "pad_token", "cls_token", "mask_token"};
#define NSPECIAL (sizeof special_names / sizeof *special_names)

struct tpl_chat {
    size_t n;
    char **names;
    tpl_template **tpls;
    char *special[NSPECIAL]; /* NULL when not set */
    char **additional;       /* additional_special_tokens */
    size_t nadditional;
};

static void drop_templates(tpl_chat *chat) {
    for (size_t i = 0; i < chat->n; i++) {
        free(chat->names[i]);
        tpl_free(chat->tpls[i]);
    }
    free(chat->names);
    free(chat->tpls);
    chat->names = NULL;
    chat->tpls = NULL;
    chat->n = 0;
}

void tpl_chat_free(tpl_chat *chat) {
    if (!chat) return;
    drop_templates(chat);
    for (size_t i = 0; i < NSPECIAL; i++) free(chat->special[i]);
    for (size_t i = 0; i < chat->nadditional; i++) free(chat->additional[i]);
    free(chat->additional);
    free(chat);
}

/* a token given as "text" or as an AddedToken object {"content": "text", ...} */
static const char *token_text(json_object *v) {
    if (json_object_is_type(v, json_type_string)) return json_object_get_string(v);
    json_object *c;
    if (json_object_is_type(v, json_type_object) && json_object_object_get_ex(v, "content", &c) &&
        json_object_is_type(c, json_type_string))
        return json_object_get_string(c);
    return NULL;
}

/* compiles and adds (or replaces) a named template; 0 or -1 with *err */
static int add_template(tpl_chat *chat, const char *name, const char *src, size_t len,
                        const char *origin, char **err) {
    char *e = NULL;
    tpl_template *t = tpl_compile(src, len, &e);
    if (!t) {
        *err = fmt_err("%s: %s", origin, e ? e : "out of memory");
        free(e);
        return -1;
    }
    for (size_t i = 0; i < chat->n; i++)
        if (!strcmp(chat->names[i], name)) {
            tpl_free(chat->tpls[i]);
            chat->tpls[i] = t;
            return 0;
        }
    char **nn = realloc(chat->names, (chat->n + 1) * sizeof *nn);
    if (nn) chat->names = nn;
    tpl_template **nt = realloc(chat->tpls, (chat->n + 1) * sizeof *nt);
    if (nt) chat->tpls = nt;
    char *dup = xstrdup(name);
    if (!nn || !nt || !dup) {
        free(dup);
        tpl_free(t);
        *err = xstrdup("out of memory");
        return -1;
    }
    chat->names[chat->n] = dup;
    chat->tpls[chat->n++] = t;
    return 0;
}

static int load_config(tpl_chat *chat, json_object *cfg, const char *origin, char **err) {
    for (size_t i = 0; i < NSPECIAL; i++) {
        json_object *v;
        if (!json_object_object_get_ex(cfg, special_names[i], &v)) continue;
        const char *s = token_text(v);
        if (s && !(chat->special[i] = xstrdup(s))) goto nomem;
    }
    json_object *add;
    if (json_object_object_get_ex(cfg, "additional_special_tokens", &add) &&
        json_object_is_type(add, json_type_array)) {
        size_t n = json_object_array_length(add);
        chat->additional = calloc(n + 1, sizeof *chat->additional);
        if (!chat->additional) goto nomem;
        for (size_t i = 0; i < n; i++) {
            const char *s = token_text(json_object_array_get_idx(add, i));
            if (s && !(chat->additional[chat->nadditional++] = xstrdup(s))) goto nomem;
        }
    }
    json_object *ct;
    if (!json_object_object_get_ex(cfg, "chat_template", &ct) || !ct) return 0;
    if (json_object_is_type(ct, json_type_string)) {
        char o[512];
        snprintf(o, sizeof o, "%s: chat_template", origin);
        return add_template(chat, "default", json_object_get_string(ct),
                            (size_t)json_object_get_string_len(ct), o, err);
    }
    if (!json_object_is_type(ct, json_type_array)) {
        *err = fmt_err("%s: chat_template must be a string or a list of {name, template}", origin);
        return -1;
    }
    for (size_t i = 0; i < json_object_array_length(ct); i++) {
        json_object *e = json_object_array_get_idx(ct, i), *nm, *tp;
        if (!json_object_object_get_ex(e, "name", &nm) ||
            !json_object_object_get_ex(e, "template", &tp) ||
            !json_object_is_type(nm, json_type_string) ||
            !json_object_is_type(tp, json_type_string)) {
            *err = fmt_err("%s: chat_template[%zu] must be {\"name\": ..., \"template\": ...}",
                           origin, i);
            return -1;
        }
        char o[512];
        snprintf(o, sizeof o, "%s: chat_template '%s'", origin, json_object_get_string(nm));
        if (add_template(chat, json_object_get_string(nm), json_object_get_string(tp),
                         (size_t)json_object_get_string_len(tp), o, err))
            return -1;
    }
    return 0;
nomem:
    *err = xstrdup("out of memory");
    return -1;
}

tpl_chat *tpl_chat_from_config(json_object *cfg, char **err) {
    char *e = NULL;
    if (err) *err = NULL;
    if (!cfg || !json_object_is_type(cfg, json_type_object)) {
        if (err) *err = xstrdup("tokenizer_config must be a JSON object");
        return NULL;
    }
    tpl_chat *chat = calloc(1, sizeof *chat);
    if (!chat || load_config(chat, cfg, "tokenizer_config.json", &e) || !chat->n) {
        if (chat && !e && !chat->n) e = xstrdup("tokenizer_config.json has no chat_template");
        tpl_chat_free(chat);
        if (err)
            *err = e ? e : xstrdup("out of memory");
        else
            free(e);
        return NULL;
    }
    return chat;
}

static char *read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char *buf = NULL;
    size_t n = 0, cap = 0;
    for (;;) {
        if (n + 4096 + 1 > cap) {
            cap = cap ? cap * 2 : 65536;
            char *nb = cap < ((size_t)1 << 30) ? realloc(buf, cap) : NULL;
            if (!nb) {
                free(buf);
                fclose(f);
                errno = ENOMEM;
                return NULL;
            }
            buf = nb;
        }
        size_t k = fread(buf + n, 1, cap - n - 1, f);
        n += k;
        if (k == 0) break;
    }
    int bad = ferror(f);
    fclose(f);
    if (bad) {
        free(buf);
        errno = EIO;
        return NULL;
    }
    buf[n] = 0;
    *len = n;
    return buf;
}

tpl_chat *tpl_chat_load(const char *dir, char **err) {
    char *e = NULL;
    if (err) *err = NULL;
    tpl_chat *chat = calloc(1, sizeof *chat);
    char path[4096];
    if (!chat) {
        e = xstrdup("out of memory");
        goto fail;
    }
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    size_t len = 0;
    char *text = read_file(path, &len);
    if (text) {
        json_tokener *tk = json_tokener_new_ex(JSON_TOKENER_DEFAULT_DEPTH);
        if (!tk) {
            free(text);
            e = xstrdup("out of memory");
            goto fail;
        }
        json_object *cfg = json_tokener_parse_ex(tk, text, (int)(len < INT32_MAX ? len : 0));
        enum json_tokener_error je = json_tokener_get_error(tk);
        json_tokener_free(tk);
        free(text);
        if (!cfg || je != json_tokener_success) {
            json_object_put(cfg);
            e = fmt_err("%s: invalid JSON (%s)", path,
                        je == json_tokener_continue ? "unexpected end"
                                                    : json_tokener_error_desc(je));
            goto fail;
        }
        int rc = json_object_is_type(cfg, json_type_object) ? load_config(chat, cfg, path, &e) : 0;
        json_object_put(cfg);
        if (rc) goto fail;
    } else if (errno != ENOENT) {
        e = fmt_err("%s: %s", path, strerror(errno));
        goto fail;
    }
    /* template files (chat_template.jinja, additional_chat_templates/NAME.jinja) replace the
     * config's templates altogether, as in transformers */
    snprintf(path, sizeof path, "%s/chat_template.jinja", dir);
    text = read_file(path, &len);
    int from_files = 0;
    if (text) {
        drop_templates(chat);
        from_files = 1;
        int rc = add_template(chat, "default", text, len, path, &e);
        free(text);
        if (rc) goto fail;
    }
    /* additional_chat_templates/NAME.jinja */
    snprintf(path, sizeof path, "%s/additional_chat_templates", dir);
    DIR *d = opendir(path);
    if (d) {
        struct dirent *de;
        while ((de = readdir(d))) {
            size_t nl = strlen(de->d_name);
            if (nl <= 6 || strcmp(de->d_name + nl - 6, ".jinja")) continue;
            char name[256], p2[4096 + 300];
            snprintf(name, sizeof name, "%.*s", (int)(nl - 6), de->d_name);
            snprintf(p2, sizeof p2, "%s/%s", path, de->d_name);
            text = read_file(p2, &len);
            if (!text) continue;
            if (!from_files) drop_templates(chat);
            from_files = 1;
            int rc = add_template(chat, name, text, len, p2, &e);
            free(text);
            if (rc) {
                closedir(d);
                goto fail;
            }
        }
        closedir(d);
    }
    if (!chat->n) {
        e = fmt_err("%s has no chat template (no chat_template in tokenizer_config.json, no "
                    "chat_template.jinja)",
                    dir);
        goto fail;
    }
    return chat;
fail:
    tpl_chat_free(chat);
    if (err)
        *err = e ? e : xstrdup("out of memory");
    else
        free(e);
    return NULL;
}

static const tpl_template *pick(const tpl_chat *chat, int with_tools) {
    const tpl_template *dflt = NULL;
    for (size_t i = 0; i < chat->n; i++) {
        if (with_tools && !strcmp(chat->names[i], "tool_use")) return chat->tpls[i];
        if (!strcmp(chat->names[i], "default")) dflt = chat->tpls[i];
    }
    return dflt;
}

int tpl_chat_render_ex(const tpl_chat *chat, json_object *messages, json_object *tools,
                       int add_generation_prompt, json_object *extra, const tpl_limits *limits,
                       char **out, size_t *out_len, char **err) {
    if (out) *out = NULL;
    if (err) *err = NULL;
    if (!chat) {
        if (err) *err = xstrdup("the model has no chat template");
        return TPL_ERR_INPUT;
    }
    const tpl_template *t = pick(chat, tools != NULL);
    if (!t) {
        if (err) *err = xstrdup("the model has several chat templates and none named 'default'");
        return TPL_ERR_INPUT;
    }
    if (extra && !json_object_is_type(extra, json_type_object)) {
        if (err) *err = xstrdup("the extra template variables must be a JSON object");
        return TPL_ERR_INPUT;
    }
    size_t nextra = extra ? (size_t)json_object_object_length(extra) : 0;
    size_t cap = NSPECIAL + 1 + nextra + 4;
    tvar *v = calloc(cap, sizeof *v);
    if (!v) {
        if (err) *err = xstrdup("out of memory");
        return TPL_ERR_NOMEM;
    }
    size_t n = 0;
    for (size_t i = 0; i < NSPECIAL; i++)
        if (chat->special[i])
            v[n++] = (tvar){.name = special_names[i], .kind = VK_STR, .str = chat->special[i]};
    if (chat->additional)
        v[n++] = (tvar){.name = "additional_special_tokens",
                        .kind = VK_STRLIST,
                        .strs = chat->additional,
                        .nstrs = chat->nadditional};
    if (extra) {
        json_object_object_foreach(extra, key, val) {
            if (!strcmp(key, "messages") || !strcmp(key, "tools") || !strcmp(key, "documents") ||
                !strcmp(key, "add_generation_prompt")) {
                if (err) *err = fmt_err("the template variable '%s' cannot be overridden", key);
                free(v);
                return TPL_ERR_INPUT;
            }
            v[n++] = (tvar){.name = key, .kind = VK_JSON, .json = val};
        }
    }
    v[n++] = (tvar){.name = "messages", .kind = messages ? VK_JSON : VK_NONE, .json = messages};
    v[n++] = (tvar){.name = "tools", .kind = tools ? VK_JSON : VK_NONE, .json = tools};
    v[n++] = (tvar){.name = "documents", .kind = VK_NONE};
    v[n++] =
        (tvar){.name = "add_generation_prompt", .kind = VK_BOOL, .b = add_generation_prompt != 0};
    int rc = render_vars(t, v, n, limits, out, out_len, err);
    free(v);
    return rc;
}

int tpl_chat_render(const tpl_chat *chat, json_object *messages, json_object *tools,
                    int add_generation_prompt, json_object *extra, char **out, char **err) {
    return tpl_chat_render_ex(chat, messages, tools, add_generation_prompt, extra, NULL, out, NULL,
                              err);
}

int tpl_render_chat(const char *model_dir, json_object *messages, json_object *tools,
                    int add_generation_prompt, json_object *extra, char **out, char **err) {
    if (out) *out = NULL;
    tpl_chat *chat = tpl_chat_load(model_dir, err);
    if (!chat) return TPL_ERR_INPUT;
    int rc = tpl_chat_render(chat, messages, tools, add_generation_prompt, extra, out, err);
    tpl_chat_free(chat);
    return rc;
}
