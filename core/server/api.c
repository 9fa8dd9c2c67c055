#include "api.h"
#include "json_fix.h"
#include "grammar.h"
#include "log.h"
#include "toolcall.h"

#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* ---- growable byte buffers -------------------------------------------------------------- */

static int sb_add(sbuf *b, const char *s, size_t n) {
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 64;
        while (cap < b->len + n + 1) cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) return -1;
        b->p = p;
        b->cap = cap;
    }
    if (n) memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = 0;
    return 0;
}

static void sb_drop_front(sbuf *b, size_t n) {
    memmove(b->p, b->p + n, b->len - n);
    b->len -= n;
    b->p[b->len] = 0;
}

static void sb_free(sbuf *b) {
    free(b->p);
    memset(b, 0, sizeof *b);
}

int api_sbuf_add(sbuf *b, const char *s, size_t n) {
    return sb_add(b, s, n);
}

/* ---- stop strings and think sections ---------------------------------------------------- */

static const char THINK_OPEN[] = "<think>", THINK_CLOSE[] = "</think>";

/* Longest k < tl such that s ends with tag[0..k). */
static size_t partial_suffix(const char *s, size_t n, const char *tag, size_t tl) {
    for (size_t k = tl - 1 > n ? n : tl - 1; k > 0; k--)
        if (memcmp(s + n - k, tag, k) == 0) return k;
    return 0;
}

static void release(text_state *t, const char *s, size_t n, int final) {
    if (!t->split_think) {
        sb_add(&t->out_c, s, n);
        sb_add(&t->content, s, n);
        return;
    }
    sb_add(&t->tag, s, n);
    for (;;) {
        const char *tag = t->reasoning ? THINK_CLOSE : THINK_OPEN;
        size_t tl = strlen(tag);
        sbuf *dst = t->reasoning ? &t->out_r : &t->out_c;
        sbuf *all = t->reasoning ? &t->reasoning_all : &t->content;
        char *hit = memmem(t->tag.p, t->tag.len, tag, tl);
        if (hit) {
            size_t at = (size_t)(hit - t->tag.p);
            sb_add(dst, t->tag.p, at);
            sb_add(all, t->tag.p, at);
            sb_drop_front(&t->tag, at + tl);
            t->reasoning = !t->reasoning;
            continue;
        }
        size_t keep = final ? 0 : partial_suffix(t->tag.p, t->tag.len, tag, tl);
        sb_add(dst, t->tag.p, t->tag.len - keep);
        sb_add(all, t->tag.p, t->tag.len - keep);
        sb_drop_front(&t->tag, t->tag.len - keep);
        return;
    }
}

static void outputs(text_state *t, text_out *o) {
    o->content = t->out_c.p ? t->out_c.p : "";
    o->content_len = t->out_c.len;
    o->reasoning = t->out_r.p ? t->out_r.p : "";
    o->reasoning_len = t->out_r.len;
}

int text_push(text_state *t, const char *s, size_t len, text_out *o) {
    t->out_c.len = t->out_r.len = 0;
    sb_add(&t->held, s, len);
    /* the earliest stop string wins; text before it is released, the rest dropped */
    size_t best = (size_t)-1;
    for (int i = 0; i < t->n_stops; i++) {
        char *hit = memmem(t->held.p, t->held.len, t->stops[i], strlen(t->stops[i]));
        if (hit && (size_t)(hit - t->held.p) < best) best = (size_t)(hit - t->held.p);
    }
    if (best != (size_t)-1) {
        release(t, t->held.p, best, 1);
        t->held.len = 0;
        outputs(t, o);
        return 1;
    }
    size_t keep = 0;
    for (int i = 0; i < t->n_stops; i++) {
        size_t k = partial_suffix(t->held.p, t->held.len, t->stops[i], strlen(t->stops[i]));
        if (k > keep) keep = k;
    }
    release(t, t->held.p, t->held.len - keep, 0);
    sb_drop_front(&t->held, t->held.len - keep);
    outputs(t, o);
    return 0;
}

void text_flush(text_state *t, text_out *o) {
    t->out_c.len = t->out_r.len = 0;
    release(t, t->held.p ? t->held.p : "", t->held.len, 1);
    t->held.len = 0;
    outputs(t, o);
}

void text_init_mode(text_state *t, int reasoning) {
    t->reasoning = reasoning;
}

int text_prompt_opens_think(const char *p) {
    const char *o = NULL, *c = NULL, *x;
    for (x = p; (x = strstr(x, THINK_OPEN)); x++) o = x;
    for (x = p; (x = strstr(x, THINK_CLOSE)); x++) c = x;
    return o && (!c || c < o);
}

/* ---- requests ------------------------------------------------------------------------- */

static int fail(char *err, size_t el, char *param, size_t pl, const char *field, const char *fmt,
                ...) __attribute__((format(printf, 6, 7)));
static int fail(char *err, size_t el, char *param, size_t pl, const char *field, const char *fmt,
                ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, el, fmt, ap);
    va_end(ap);
    snprintf(param, pl, "%s", field ? field : "");
    return -1;
}

static int is_num(json_object *o) {
    return json_object_is_type(o, json_type_int) || json_object_is_type(o, json_type_double);
}

/* Reads an optional number field within [lo, hi]. 0 absent/null, 1 read, -1 error. */
static int get_num(json_object *b, const char *k, double lo, double hi, double *out, char *err,
                   size_t el, char *param, size_t pl) {
    json_object *v;
    if (!json_object_object_get_ex(b, k, &v) || !v) return 0;
    if (!is_num(v)) return fail(err, el, param, pl, k, "'%s' must be a number", k);
    double d = json_object_get_double(v);
    if (!(d >= lo && d <= hi))
        return fail(err, el, param, pl, k, "'%s' must be between %g and %g (got %g)", k, lo, hi, d);
    *out = d;
    return 1;
}

static int get_int(json_object *b, const char *k, int64_t lo, int64_t hi, int64_t *out, char *err,
                   size_t el, char *param, size_t pl) {
    json_object *v;
    if (!json_object_object_get_ex(b, k, &v) || !v) return 0;
    int ok = json_object_is_type(v, json_type_int);
    if (!ok && json_object_is_type(v, json_type_double)) {
        double d = json_object_get_double(v);
        ok = d == floor(d) && fabs(d) < 9e15;
    }
    if (!ok) return fail(err, el, param, pl, k, "'%s' must be an integer", k);
    int64_t x = json_object_get_int64(v);
    if (x < lo || x > hi)
        return fail(err, el, param, pl, k, "'%s' must be between %lld and %lld (got %lld)", k,
                    (long long)lo, (long long)hi, (long long)x);
    *out = x;
    return 1;
}

static int get_bool(json_object *b, const char *k, int *out, char *err, size_t el, char *param,
                    size_t pl) {
    json_object *v;
    if (!json_object_object_get_ex(b, k, &v) || !v) return 0;
    if (!json_object_is_type(v, json_type_boolean))
        return fail(err, el, param, pl, k, "'%s' must be a boolean", k);
    *out = json_object_get_boolean(v);
    return 1;
}

/* An assistant message's tool_calls as templates read them: each function's arguments an
 * object (clients send the JSON text they were given; templates that write
 * `arguments | tojson` would quote that text again). */
static int args_as_objects(json_object *m, const char *field, char *err, size_t el, char *param,
                           size_t pl) {
    json_object *calls, *fn, *args;
    if (!json_object_object_get_ex(m, "tool_calls", &calls) || !calls) return 0;
    if (!json_object_is_type(calls, json_type_array))
        return fail(err, el, param, pl, field, "'%s.tool_calls' must be an array", field);
    for (size_t k = 0; k < json_object_array_length(calls); k++) {
        json_object *c = json_object_array_get_idx(calls, k);
        if (!json_object_is_type(c, json_type_object) ||
            !json_object_object_get_ex(c, "function", &fn) ||
            !json_object_is_type(fn, json_type_object))
            return fail(err, el, param, pl, field,
                        "'%s.tool_calls[%zu]' must be an object with a 'function' object", field,
                        k);
        if (!json_object_object_get_ex(fn, "arguments", &args) ||
            !json_object_is_type(args, json_type_string))
            continue;
        json_object *o = api_parse_body(json_object_get_string(args),
                                        (size_t)json_object_get_string_len(args), &(int){0});
        if (o && json_object_is_type(o, json_type_object))
            json_object_object_add(fn, "arguments", o);
        else
            json_object_put(o); /* not an object: the text goes to the template as it is */
    }
    return 0;
}

/* Chat messages as the template expects them: content parts joined into one string. */
static json_object *normalize_messages(json_object *msgs, char *err, size_t el, char *param,
                                       size_t pl) {
    if (!msgs || !json_object_is_type(msgs, json_type_array)) {
        fail(err, el, param, pl, "messages", "'messages' must be an array of messages");
        return NULL;
    }
    size_t n = json_object_array_length(msgs);
    if (n == 0) {
        fail(err, el, param, pl, "messages", "'messages' must not be empty");
        return NULL;
    }
    json_object *out = json_object_new_array();
    for (size_t i = 0; i < n; i++) {
        json_object *m = json_object_array_get_idx(msgs, i), *role, *content;
        char field[64];
        snprintf(field, sizeof field, "messages[%zu]", i);
        if (!json_object_is_type(m, json_type_object)) {
            fail(err, el, param, pl, field, "'%s' must be an object", field);
            goto bad;
        }
        if (!json_object_object_get_ex(m, "role", &role) ||
            !json_object_is_type(role, json_type_string)) {
            fail(err, el, param, pl, field, "'%s.role' must be a string", field);
            goto bad;
        }
        const char *r = json_object_get_string(role);
        if (strcmp(r, "system") && strcmp(r, "user") && strcmp(r, "assistant") &&
            strcmp(r, "tool") && strcmp(r, "developer")) {
            fail(err, el, param, pl, field,
                 "'%s.role' must be system, developer, user, assistant or tool (got '%s')", field,
                 r);
            goto bad;
        }
        json_object *copy = NULL;
        if (json_object_deep_copy(m, &copy, NULL) != 0) goto bad;
        if (args_as_objects(copy, field, err, el, param, pl) != 0) {
            json_object_put(copy);
            goto bad;
        }
        if (json_object_object_get_ex(m, "content", &content) && content) {
            if (json_object_is_type(content, json_type_array)) {
                sbuf text = {0};
                for (size_t k = 0; k < json_object_array_length(content); k++) {
                    json_object *part = json_object_array_get_idx(content, k), *type, *t;
                    if (!json_object_is_type(part, json_type_object) ||
                        !json_object_object_get_ex(part, "type", &type) ||
                        !json_object_is_type(type, json_type_string)) {
                        fail(err, el, param, pl, field,
                             "'%s.content[%zu]' must be an object with a 'type'", field, k);
                        sb_free(&text);
                        json_object_put(copy);
                        goto bad;
                    }
                    if (strcmp(json_object_get_string(type), "text") != 0) {
                        fail(err, el, param, pl, field,
                             "'%s.content[%zu]': content type '%s' is not supported (text only)",
                             field, k, json_object_get_string(type));
                        sb_free(&text);
                        json_object_put(copy);
                        goto bad;
                    }
                    if (!json_object_object_get_ex(part, "text", &t) ||
                        !json_object_is_type(t, json_type_string)) {
                        fail(err, el, param, pl, field, "'%s.content[%zu].text' must be a string",
                             field, k);
                        sb_free(&text);
                        json_object_put(copy);
                        goto bad;
                    }
                    sb_add(&text, json_object_get_string(t), (size_t)json_object_get_string_len(t));
                }
                json_object_object_add(
                    copy, "content",
                    json_object_new_string_len(text.p ? text.p : "", (int)text.len));
                sb_free(&text);
            } else if (!json_object_is_type(content, json_type_string)) {
                fail(err, el, param, pl, field,
                     "'%s.content' must be a string or a list of content parts", field);
                json_object_put(copy);
                goto bad;
            }
        } else if (strcmp(r, "assistant") != 0) {
            fail(err, el, param, pl, field, "'%s.content' is required", field);
            json_object_put(copy);
            goto bad;
        } else {
            /* an assistant turn of tool calls only (content null or absent): templates test
             * the content as a string */
            json_object_object_add(copy, "content", json_object_new_string(""));
        }
        json_object_array_add(out, copy);
    }
    return out;
bad:
    json_object_put(out);
    return NULL;
}

#define ERRARGS err, err_len, param, param_len

/* The request's cache: "kv_cache" (a cache spec, cache_spec.h's spellings, which the server
 * checks against the plugins), or "kv_bits" with "kv_group_size", the fields some peer servers
 * take (the group, as the plugin's setting group=N; without it the plugin picks one from the
 * head size). Neither: the server's --cache. Sets j->sr.cache (or
 * j->kv_bits and kv_group, which the server resolves with the plugins), and
 * j->cache_field / j->cache_what for the errors of opening it. */
static int pick_cache(job *j, json_object *b, char *err, size_t err_len, char *param,
                      size_t param_len) {
    json_object *v;
    int64_t bits = 0, group = 0;
    int r, has_group;
    if ((r = get_int(b, "kv_bits", 2, 8, &bits, ERRARGS)) < 0) return -1;
    if ((has_group = get_int(b, "kv_group_size", 1, 1024, &group, ERRARGS)) < 0) return -1;
    int has_cache = json_object_object_get_ex(b, "kv_cache", &v) && v;
    if (has_cache && r)
        return fail(ERRARGS, "kv_bits", "'kv_cache' and 'kv_bits' both choose the cache; give one");
    if (has_group && !r)
        return fail(ERRARGS, "kv_group_size",
                    "'kv_group_size' goes with 'kv_bits' (a 'kv_cache' takes its settings after a "
                    "comma)");
    if (has_cache) {
        int len = json_object_is_type(v, json_type_string) ? json_object_get_string_len(v) : -1;
        if (len <= 0 || (size_t)len >= sizeof j->sr.cache)
            return fail(ERRARGS, "kv_cache",
                        "'kv_cache' must be a string naming a cache format (at most %zu bytes)",
                        sizeof j->sr.cache - 1);
        snprintf(j->sr.cache, sizeof j->sr.cache, "%s", json_object_get_string(v));
        snprintf(j->cache_field, sizeof j->cache_field, "kv_cache");
        snprintf(j->cache_what, sizeof j->cache_what, "'kv_cache' \"%.64s\"", j->sr.cache);
    } else if (r) {
        j->kv_bits = (int)bits;
        j->kv_group = has_group ? (int)group : 0;
        snprintf(j->cache_field, sizeof j->cache_field, "%s",
                 has_group ? "kv_group_size" : "kv_bits");
        if (has_group)
            snprintf(j->cache_what, sizeof j->cache_what,
                     "'kv_bits' %lld with 'kv_group_size' %lld", (long long)bits, (long long)group);
        else
            snprintf(j->cache_what, sizeof j->cache_what, "'kv_bits' %lld", (long long)bits);
    }
    return 0;
}

json_object *api_parse_body(const char *buf, size_t len, int *oom) {
    *oom = 0;
    if (len > INT_MAX) return NULL;
    char *fixed = NULL;
    size_t fixed_n = 0;
    int rw = json_fix_surrogates(buf, len, &fixed, &fixed_n);
    if (rw < 0) {
        *oom = 1;
        return NULL;
    }
    if (rw) {
        buf = fixed;
        len = fixed_n;
    }
    json_tokener *tk = json_tokener_new();
    if (!tk) {
        free(fixed);
        *oom = 1;
        return NULL;
    }
    json_object *o = json_tokener_parse_ex(tk, buf, (int)len);
    enum json_tokener_error je = json_tokener_get_error(tk);
    size_t used = (size_t)json_tokener_get_parse_end(tk);
    json_tokener_free(tk);
    while (o && used < len &&
           (buf[used] == ' ' || buf[used] == '\t' || buf[used] == '\r' || buf[used] == '\n'))
        used++; /* not strchr: a NUL byte is no whitespace */
    free(fixed);
    if (!o || je != json_tokener_success || used != len) {
        json_object_put(o);
        return NULL;
    }
    return o;
}

/* "logit_bias": {"token id": bias in [-100, 100], ...}, at most 1024 of them. */
static int get_logit_bias(job *j, json_object *b, char *err, size_t err_len, char *param,
                          size_t param_len) {
    json_object *v;
    if (!json_object_object_get_ex(b, "logit_bias", &v) || !v) return 0;
    if (!json_object_is_type(v, json_type_object) || json_object_object_length(v) > 1024)
        return fail(ERRARGS, "logit_bias",
                    "'logit_bias' must be an object of at most 1024 token ids and biases");
    int n = json_object_object_length(v);
    j->bias_id = malloc((size_t)(n ? n : 1) * sizeof *j->bias_id);
    j->bias = malloc((size_t)(n ? n : 1) * sizeof *j->bias);
    if (!j->bias_id || !j->bias) return fail(ERRARGS, NULL, "out of memory");
    json_object_object_foreach(v, key, val) {
        char *end;
        long long id = strtoll(key, &end, 10);
        if (!*key || *end || id < 0 || id > INT32_MAX)
            return fail(ERRARGS, "logit_bias", "'logit_bias' keys must be token ids (got '%.32s')",
                        key);
        if (!is_num(val) || !(fabs(json_object_get_double(val)) <= 100))
            return fail(ERRARGS, "logit_bias",
                        "'logit_bias' values must be numbers between -100 and 100");
        j->bias_id[j->n_bias] = (int32_t)id;
        j->bias[j->n_bias++] = (float)json_object_get_double(val);
    }
    return 0;
}

/* "tools" with "tool_choice" and "parallel_tool_calls", and "response_format": what the
 * output must be. The grammar itself is built by the server, which knows the model's
 * tool-call format (api_constrain). */
static int get_outputs(job *j, json_object *b, char *err, size_t err_len, char *param,
                       size_t param_len) {
    json_object *v, *t, *f, *nm;
    int r;
    j->parallel_tools = 1;
    if ((r = get_bool(b, "parallel_tool_calls", &j->parallel_tools, ERRARGS)) < 0) return -1;
    for (size_t k = 0; j->tools && k < json_object_array_length(j->tools); k++) {
        json_object *tool = json_object_array_get_idx(j->tools, k);
        if (!json_object_is_type(tool, json_type_object) ||
            !json_object_object_get_ex(tool, "function", &f) ||
            !json_object_is_type(f, json_type_object) ||
            !json_object_object_get_ex(f, "name", &nm) ||
            !json_object_is_type(nm, json_type_string))
            return fail(ERRARGS, "tools",
                        "'tools[%zu]' must be {\"type\": \"function\", \"function\": {\"name\": "
                        "..., \"parameters\": {...}}}",
                        k);
    }
    j->tchoice = j->tools && json_object_array_length(j->tools) ? TOOLS_AUTO : TOOLS_NONE;
    if (json_object_object_get_ex(b, "tool_choice", &v) && v) {
        const char *s = json_object_is_type(v, json_type_string) ? json_object_get_string(v) : NULL;
        if (s && strcmp(s, "none") == 0)
            j->tchoice = TOOLS_NONE;
        else if (s && strcmp(s, "auto") == 0)
            ;
        else if (s && strcmp(s, "required") == 0)
            j->tchoice = TOOLS_REQUIRED;
        else if (!s && json_object_is_type(v, json_type_object) &&
                 json_object_object_get_ex(v, "function", &f) &&
                 json_object_object_get_ex(f, "name", &nm) &&
                 json_object_is_type(nm, json_type_string) &&
                 (size_t)json_object_get_string_len(nm) < sizeof j->tool_name) {
            j->tchoice = TOOLS_NAMED;
            snprintf(j->tool_name, sizeof j->tool_name, "%s", json_object_get_string(nm));
        } else
            return fail(ERRARGS, "tool_choice",
                        "'tool_choice' must be \"none\", \"auto\", \"required\" or "
                        "{\"type\": \"function\", \"function\": {\"name\": ...}}");
        if (s && strcmp(s, "none") && (!j->tools || !json_object_array_length(j->tools)))
            return fail(ERRARGS, "tool_choice", "'tool_choice' \"%s\" needs 'tools'", s);
        if (j->tchoice == TOOLS_NAMED) {
            int found = 0;
            for (size_t k = 0; j->tools && k < json_object_array_length(j->tools) && !found; k++) {
                json_object_object_get_ex(json_object_array_get_idx(j->tools, k), "function", &f);
                json_object_object_get_ex(f, "name", &nm);
                found = strcmp(json_object_get_string(nm), j->tool_name) == 0;
            }
            if (!found)
                return fail(ERRARGS, "tool_choice",
                            "'tool_choice' names '%s', which is not in 'tools'", j->tool_name);
        }
    }
    if (!json_object_object_get_ex(b, "response_format", &v) || !v) return 0;
    if (!json_object_is_type(v, json_type_object) || !json_object_object_get_ex(v, "type", &t) ||
        !json_object_is_type(t, json_type_string))
        return fail(ERRARGS, "response_format",
                    "'response_format' must be an object with a 'type' (text, json_object or "
                    "json_schema)");
    const char *type = json_object_get_string(t);
    if (strcmp(type, "text") == 0) return 0;
    if (strcmp(type, "json_object") == 0) {
        j->rf_schema = json_tokener_parse("{\"type\": \"object\"}");
    } else if (strcmp(type, "json_schema") == 0) {
        json_object *js, *sc;
        if (!json_object_object_get_ex(v, "json_schema", &js) ||
            !json_object_is_type(js, json_type_object))
            return fail(ERRARGS, "response_format",
                        "'response_format.json_schema' must be an object with a 'schema'");
        if (!json_object_object_get_ex(js, "schema", &sc) || !sc)
            sc = NULL; /* OpenAI's default: any JSON document */
        else if (!json_object_is_type(sc, json_type_object) &&
                 !json_object_is_type(sc, json_type_boolean))
            return fail(ERRARGS, "response_format",
                        "'response_format.json_schema.schema' must be a JSON Schema object");
        j->rf_schema = sc ? json_object_get(sc) : json_tokener_parse("{}");
    } else {
        return fail(ERRARGS, "response_format",
                    "'response_format.type' must be text, json_object or json_schema (got '%.32s')",
                    type);
    }
    if (j->tchoice == TOOLS_REQUIRED || j->tchoice == TOOLS_NAMED)
        return fail(ERRARGS, "response_format",
                    "'response_format' and a forced 'tool_choice' both constrain the output; give "
                    "one");
    return 0;
}

job *job_from_request(job_kind kind, json_object *b, const server_opts *o, const char *model_name,
                      char *err, size_t err_len, char *param, size_t param_len) {
    if (!json_object_is_type(b, json_type_object)) {
        fail(ERRARGS, NULL, "the request body must be a JSON object");
        return NULL;
    }
    job *j = calloc(1, sizeof *j);
    if (!j) {
        fail(ERRARGS, NULL, "out of memory");
        return NULL;
    }
    j->kind = kind;
    j->top_logprobs = -1;
    j->sr.sp = o->defaults;
    json_object *v;
    double d;
    int64_t x;
    int flag = 0, r;

    if (json_object_object_get_ex(b, "model", &v) && v &&
        !json_object_is_type(v, json_type_string)) {
        fail(ERRARGS, "model", "'model' must be a string");
        goto bad;
    }
    snprintf(j->model, sizeof j->model, "%s", model_name);

    if (kind == JOB_CHAT) {
        json_object *msgs = NULL;
        json_object_object_get_ex(b, "messages", &msgs);
        if (!msgs) {
            fail(ERRARGS, "messages", "'messages' is required");
            goto bad;
        }
        if (!(j->messages = normalize_messages(msgs, ERRARGS))) goto bad;
        if (json_object_object_get_ex(b, "tools", &v) && v) {
            if (!json_object_is_type(v, json_type_array)) {
                fail(ERRARGS, "tools", "'tools' must be an array");
                goto bad;
            }
            j->tools = json_object_get(v);
        }
        j->vars = json_object_new_object();
        if (json_object_object_get_ex(b, "chat_template_kwargs", &v) && v) {
            if (!json_object_is_type(v, json_type_object)) {
                fail(ERRARGS, "chat_template_kwargs", "'chat_template_kwargs' must be an object");
                goto bad;
            }
            json_object_object_foreach(v, k, val) {
                json_object_object_add(j->vars, k, json_object_get(val));
            }
        }
        if ((r = get_bool(b, "enable_thinking", &flag, ERRARGS)) < 0) goto bad;
        if (r) json_object_object_add(j->vars, "enable_thinking", json_object_new_boolean(flag));
        j->text.split_think = 1;
    } else {
        json_object *p = NULL;
        json_object_object_get_ex(b, "prompt", &p);
        if (!p) {
            fail(ERRARGS, "prompt", "'prompt' is required");
            goto bad;
        }
        if (json_object_is_type(p, json_type_array) && json_object_array_length(p) == 1 &&
            json_object_is_type(json_object_array_get_idx(p, 0), json_type_string))
            p = json_object_array_get_idx(p, 0);
        if (json_object_is_type(p, json_type_string)) {
            j->prompt_text = strdup(json_object_get_string(p));
        } else if (json_object_is_type(p, json_type_array) && json_object_array_length(p) > 0) {
            size_t n = json_object_array_length(p);
            j->prompt = malloc(n * sizeof *j->prompt);
            for (size_t i = 0; j->prompt && i < n; i++) {
                json_object *t = json_object_array_get_idx(p, i);
                if (!json_object_is_type(t, json_type_int) || json_object_get_int64(t) < 0 ||
                    json_object_get_int64(t) > INT32_MAX) {
                    fail(ERRARGS, "prompt",
                         "'prompt' must be a string, a list of one string, or a list of token "
                         "ids (only one prompt per request is supported)");
                    goto bad;
                }
                j->prompt[i] = (int32_t)json_object_get_int64(t);
            }
            j->n_prompt = (int32_t)n;
        } else {
            fail(ERRARGS, "prompt",
                 "'prompt' must be a string, a list of one string, or a list of token ids");
            goto bad;
        }
    }

    j->max_tokens = o->max_tokens;
    if ((r = get_int(b, "max_tokens", 1, 1 << 24, &x, ERRARGS)) < 0) goto bad;
    if (r) j->max_tokens = (int32_t)x;
    if ((r = get_int(b, "max_completion_tokens", 1, 1 << 24, &x, ERRARGS)) < 0) goto bad;
    if (r) j->max_tokens = (int32_t)x;
    j->sr.max_tokens = j->max_tokens;

    sampler_params *sp = &j->sr.sp;
    if ((r = get_num(b, "temperature", 0, 2, &d, ERRARGS)) < 0) goto bad;
    if (r) sp->temperature = (float)d;
    if ((r = get_num(b, "top_p", 0, 1, &d, ERRARGS)) < 0) goto bad;
    if (r) {
        if (d <= 0) {
            fail(ERRARGS, "top_p", "'top_p' must be greater than 0");
            goto bad;
        }
        sp->top_p = (float)d;
    }
    if ((r = get_int(b, "top_k", -1, INT32_MAX, &x, ERRARGS)) < 0) goto bad;
    if (r) sp->top_k = x < 0 ? 0 : (int32_t)x;
    if ((r = get_num(b, "min_p", 0, 1, &d, ERRARGS)) < 0) goto bad;
    if (r) sp->min_p = (float)d;
    if ((r = get_num(b, "repetition_penalty", 1e-6, 1e6, &d, ERRARGS)) < 0) goto bad;
    if (r) sp->repetition_penalty = (float)d;
    if ((r = get_num(b, "presence_penalty", -2, 2, &d, ERRARGS)) < 0) goto bad;
    if (r) sp->presence_penalty = (float)d;
    if ((r = get_num(b, "frequency_penalty", -2, 2, &d, ERRARGS)) < 0) goto bad;
    if (r) sp->frequency_penalty = (float)d;
    if ((r = get_int(b, "seed", INT64_MIN, INT64_MAX, &x, ERRARGS)) < 0) goto bad;
    if (r) {
        sp->seed = (uint64_t)x;
    } else {
        static atomic_uint_fast64_t counter;
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        sp->seed = (uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 20) ^
                   (atomic_fetch_add(&counter, 1) * 0x9e3779b97f4a7c15ULL);
    }
    j->n_choices = 1;
    if ((r = get_int(b, "n", 1, 16, &x, ERRARGS)) < 0) goto bad;
    if (r) j->n_choices = (int)x;
    if (json_object_object_get_ex(b, "user", &v) && v &&
        !json_object_is_type(v, json_type_string)) {
        fail(ERRARGS, "user", "'user' must be a string");
        goto bad;
    }
    if (get_logit_bias(j, b, ERRARGS) != 0) goto bad;
    /* a mixture of experts' experts per token (the server checks it against the model) */
    if ((r = get_int(b, "moe_top_k", 1, 1 << 16, &x, ERRARGS)) < 0) goto bad;
    if (r) j->sr.moe_top_k = (int32_t)x;
    if (get_outputs(j, b, ERRARGS) != 0) goto bad;
    if (json_object_object_get_ex(b, "stop", &v) && v) {
        size_t n = json_object_is_type(v, json_type_string)  ? 1
                   : json_object_is_type(v, json_type_array) ? json_object_array_length(v)
                                                             : (size_t)-1;
        if (n == (size_t)-1 || n > 16) {
            fail(ERRARGS, "stop", "'stop' must be a string or a list of at most 16 strings");
            goto bad;
        }
        j->text.stops = calloc(n ? n : 1, sizeof(char *));
        for (size_t i = 0; i < n; i++) {
            json_object *s =
                json_object_is_type(v, json_type_string) ? v : json_object_array_get_idx(v, i);
            if (!json_object_is_type(s, json_type_string) || json_object_get_string_len(s) == 0) {
                fail(ERRARGS, "stop", "'stop' entries must be non-empty strings");
                goto bad;
            }
            j->text.stops[j->text.n_stops++] = strdup(json_object_get_string(s));
        }
    }
    int lp = 0;
    if ((r = get_bool(b, "logprobs", &lp, ERRARGS)) < 0) {
        /* the legacy completions API takes an integer here */
        if (kind != JOB_COMPLETION) goto bad;
        if ((r = get_int(b, "logprobs", 0, SCHED_MAX_TOP_LOGPROBS, &x, ERRARGS)) < 0) goto bad;
        j->top_logprobs = (int32_t)x;
    } else if (lp) {
        j->top_logprobs = 0;
    }
    if ((r = get_int(b, "top_logprobs", 0, SCHED_MAX_TOP_LOGPROBS, &x, ERRARGS)) < 0) goto bad;
    if (r) {
        if (j->top_logprobs < 0) {
            fail(ERRARGS, "top_logprobs", "'top_logprobs' needs 'logprobs': true");
            goto bad;
        }
        j->top_logprobs = (int32_t)x;
    }
    if ((r = get_bool(b, "stream", &j->stream, ERRARGS)) < 0) goto bad;
    /* the field other servers take: false keeps the request out of the prefix cache both ways */
    int cache_prompt = 1;
    if ((r = get_bool(b, "cache_prompt", &cache_prompt, ERRARGS)) < 0) goto bad;
    j->no_prefix_cache = !cache_prompt;
    /* false: this request decodes without proposals, whatever the server's --spec */
    int speculative = 1;
    if ((r = get_bool(b, "speculative", &speculative, ERRARGS)) < 0) goto bad;
    j->no_spec = !speculative;
    if (json_object_object_get_ex(b, "stream_options", &v) && v) {
        if (!json_object_is_type(v, json_type_object)) {
            fail(ERRARGS, "stream_options", "'stream_options' must be an object");
            goto bad;
        }
        if (get_bool(v, "include_usage", &j->include_usage, ERRARGS) < 0) {
            snprintf(param, param_len, "stream_options.include_usage");
            goto bad;
        }
    }
    if ((r = get_bool(b, "ignore_eos", &j->ignore_eos, ERRARGS)) < 0) goto bad;
    if (pick_cache(j, b, ERRARGS) != 0) goto bad;

    if (!(j->ch = calloc((size_t)j->n_choices, sizeof *j->ch))) {
        fail(ERRARGS, NULL, "out of memory");
        goto bad;
    }
    for (int k = 0; k < j->n_choices; k++) {
        j->ch[k].job = j;
        j->ch[k].index = k;
    }
    static atomic_uint_fast64_t ids;
    unsigned long long id = atomic_fetch_add(&ids, 1) + 1;
    snprintf(j->id, sizeof j->id, "%s-%08llx%08llx", kind == JOB_CHAT ? "chatcmpl" : "cmpl",
             (unsigned long long)(sp->seed & 0xffffffffULL), id);
    j->created = (int64_t)time(NULL);
    return j;
bad:
    job_free(j);
    return NULL;
}

int api_constrain(job *j, const tc_format *fmt, char *err, size_t err_len, char *param,
                  size_t param_len) {
    if (j->rf_schema) {
        char e[512];
        if (!(j->gram = gram_json(j->rf_schema, e, sizeof e)))
            return fail(ERRARGS, "response_format", "'response_format': %s", e);
    } else if (j->tchoice == TOOLS_REQUIRED || j->tchoice == TOOLS_NAMED) {
        if (!fmt->api)
            return fail(ERRARGS, "tool_choice",
                        "this model's chat template has no tool-call format this server knows, so "
                        "a call cannot be forced; use \"auto\"");
        char e[512];
        int named = j->tchoice == TOOLS_NAMED;
        if (!(j->gram = tc_grammar(fmt, j->tools, named ? j->tool_name : NULL,
                                   !named && j->parallel_tools, e, sizeof e)))
            return fail(ERRARGS, "tools", "'tools': %s", e);
    }
    j->tc_format = j->tchoice != TOOLS_NONE ? *fmt : (tc_format){0};
    return 0;
}

void api_choices_init(job *j, textio *tio, const gram_vocab *gv) {
    if (j->gram && j->think) {
        /* the prompt opened a think section: free text up to its end, then the output */
        gram *parts[2] = {gram_until("</think>", 8), j->gram};
        j->gram = gram_seq(parts, 2);
        if (!j->gram) goto oom;
    }
    for (int k = 0; k < j->n_choices; k++) {
        jchoice *c = &j->ch[k];
        c->sr = j->sr;
        atomic_init(&c->sr.cancel, 0);
        c->sr.sp.seed = j->sr.sp.seed + (uint64_t)k; /* n choices: n draws */
        c->sr.top_logprobs = j->top_logprobs;
        /* a prefix cached with another number of experts would hold other keys and values */
        c->sr.no_prefix_cache = j->no_prefix_cache || j->sr.moe_top_k;
        c->sr.no_spec = j->no_spec;
        c->sr.bias_id = j->bias_id;
        c->sr.bias = j->bias;
        c->sr.n_bias = j->n_bias;
        c->text.stops = j->text.stops;
        c->text.n_stops = j->text.n_stops;
        c->text.split_think = j->text.split_think;
        text_init_mode(&c->text, j->think);
        if (!(c->ts = textio_stream_new(tio))) goto oom;
        if (j->tc_format.api) {
            if (!(c->tc = tc_parser_new(&j->tc_format))) goto oom;
            tc_parser_set_reasoning(c->tc, &c->tc_reason);
        }
        if (j->gram) {
            if (!gv) {
                job_fail(j, 500, NULL, "constrained decoding is not available (no vocabulary)");
                return;
            }
            if (!(c->gm = gram_match_new(j->gram, gv))) goto oom;
            int32_t need = gram_match_min_bytes(c->gm);
            if (need > j->max_tokens) {
                char e[256];
                snprintf(
                    e, sizeof e,
                    "'max_tokens' %d is too small for the output's shape: it needs at least %d",
                    j->max_tokens, need);
                job_fail(j, 400, "max_tokens", e);
                return;
            }
            c->sr.gm = c->gm;
            c->sr.no_spec = 1; /* proposals are not checked against the grammar */
        }
    }
    return;
oom:
    job_fail(j, 500, NULL, "out of memory");
}

void job_fail(job *j, int code, const char *param, const char *msg) {
    j->error_code = code;
    snprintf(j->error, sizeof j->error, "%s", msg);
    snprintf(j->error_param, sizeof j->error_param, "%s", param ? param : "");
}

static void text_free(text_state *t) {
    sb_free(&t->held);
    sb_free(&t->tag);
    sb_free(&t->content);
    sb_free(&t->reasoning_all);
    sb_free(&t->out_c);
    sb_free(&t->out_r);
}

void job_free(job *j) {
    if (!j) return;
    for (int k = 0; j->ch && k < j->n_choices; k++) {
        jchoice *c = &j->ch[k];
        text_free(&c->text); /* its stop strings are the job's */
        sb_free(&c->content);
        json_object_put(c->lp_all);
        json_object_put(c->calls);
        gram_match_free(c->gm);
        tc_parser_free(c->tc);
        tc_buf_free(&c->tc_reason);
        if (c->ts) textio_stream_free(c->ts);
    }
    free(j->ch);
    json_object_put(j->messages);
    json_object_put(j->tools);
    json_object_put(j->vars);
    json_object_put(j->rf_schema);
    gram_free(j->gram);
    free(j->bias_id);
    free(j->bias);
    free(j->prompt_text);
    free(j->prompt);
    for (int i = 0; i < j->text.n_stops; i++) free(j->text.stops[i]);
    free(j->text.stops);
    text_free(&j->text);
    free(j);
}

/* ---- replies --------------------------------------------------------------------------- */

const char *api_reason(int code) {
    switch (code) {
    case 400:
        return "Bad Request";
    case 401:
        return "Unauthorized";
    case 404:
        return "Not Found";
    case 405:
        return "Method Not Allowed";
    case 403:
        return "Forbidden";
    case 409:
        return "Conflict";
    case 413:
        return "Payload Too Large";
    case 429:
        return "Too Many Requests";
    case 503:
        return "Service Unavailable";
    default:
        return "Internal Server Error";
    }
}

json_object *api_error(const char *msg, const char *type, const char *param, int code) {
    json_object *e = json_object_new_object(), *o = json_object_new_object();
    json_object_object_add(e, "message", json_object_new_string(msg));
    json_object_object_add(e, "type", json_object_new_string(type));
    json_object_object_add(e, "param", param ? json_object_new_string(param) : NULL);
    char c[16];
    snprintf(c, sizeof c, "%d", code);
    const char *name = code == 401   ? "invalid_api_key"
                       : code == 404 ? "not_found"
                       : code == 405 ? "method_not_allowed"
                       : code == 413 ? "request_too_large"
                       : code == 429 ? "rate_limit_exceeded"
                                     : NULL;
    json_object_object_add(e, "code", json_object_new_string(name ? name : c));
    json_object_object_add(o, "error", e);
    return o;
}

static json_object *envelope(job *j, int chunk) {
    json_object *o = json_object_new_object();
    json_object_object_add(o, "id", json_object_new_string(j->id));
    const char *obj = j->kind == JOB_CHAT ? (chunk ? "chat.completion.chunk" : "chat.completion")
                                          : "text_completion";
    json_object_object_add(o, "object", json_object_new_string(obj));
    json_object_object_add(o, "created", json_object_new_int64(j->created));
    json_object_object_add(o, "model", json_object_new_string(j->model));
    return o;
}

static const char *reason_name(jchoice *c) {
    if (c->fin == FINISH_ERROR) return "error";
    if (c->calls && json_object_array_length(c->calls)) return "tool_calls";
    return c->fin == FINISH_LENGTH ? "length" : "stop";
}

static json_object *choice(job *j, int index, json_object *delta_or_text, json_object *logprobs,
                           const char *finish) {
    json_object *c = json_object_new_object();
    json_object_object_add(c, "index", json_object_new_int(index));
    if (j->kind == JOB_CHAT)
        json_object_object_add(c, j->stream ? "delta" : "message", delta_or_text);
    else
        json_object_object_add(c, "text", delta_or_text);
    json_object_object_add(c, "logprobs", logprobs);
    json_object_object_add(c, "finish_reason", finish ? json_object_new_string(finish) : NULL);
    return c;
}

static json_object *with_choice(json_object *env, json_object *ch) {
    json_object *arr = json_object_new_array();
    json_object_array_add(arr, ch);
    json_object_object_add(env, "choices", arr);
    return env;
}

json_object *api_role_chunk(job *j, int index) {
    json_object *d = json_object_new_object();
    json_object_object_add(d, "role", json_object_new_string("assistant"));
    json_object_object_add(d, "content", json_object_new_string(""));
    return with_choice(envelope(j, 1), choice(j, index, d, NULL, NULL));
}

/* Chat logprobs are {"content": [entries]}; completions keep the legacy arrays. */
static json_object *wrap_logprobs(job *j, json_object *entries) {
    if (!entries) return NULL;
    if (j->kind == JOB_CHAT) {
        json_object *o = json_object_new_object();
        json_object_object_add(o, "content", entries);
        return o;
    }
    json_object *o = json_object_new_object(), *toks = json_object_new_array(),
                *lps = json_object_new_array(), *tops = json_object_new_array();
    for (size_t i = 0; i < json_object_array_length(entries); i++) {
        json_object *e = json_object_array_get_idx(entries, i), *t, *l, *tl;
        json_object_object_get_ex(e, "token", &t);
        json_object_object_get_ex(e, "logprob", &l);
        json_object_array_add(toks, json_object_get(t));
        json_object_array_add(lps, json_object_get(l));
        json_object *m = json_object_new_object();
        if (json_object_object_get_ex(e, "top_logprobs", &tl))
            for (size_t k = 0; k < json_object_array_length(tl); k++) {
                json_object *x = json_object_array_get_idx(tl, k), *xt, *xl;
                json_object_object_get_ex(x, "token", &xt);
                json_object_object_get_ex(x, "logprob", &xl);
                json_object_object_add(m, json_object_get_string(xt), json_object_get(xl));
            }
        json_object_array_add(tops, m);
    }
    json_object_object_add(o, "tokens", toks);
    json_object_object_add(o, "token_logprobs", lps);
    json_object_object_add(o, "top_logprobs", tops);
    json_object_put(entries);
    return o;
}

/* Thinking text under both names that clients of other servers read: reasoning_content and
 * reasoning. */
static void add_reasoning(json_object *d, const char *r, size_t rl) {
    json_object_object_add(d, "reasoning_content", json_object_new_string_len(r, (int)rl));
    json_object_object_add(d, "reasoning", json_object_new_string_len(r, (int)rl));
}

json_object *api_delta_chunk(jchoice *c, const char *reasoning, size_t rl, const char *content,
                             size_t cl, json_object *logprobs) {
    job *j = c->job;
    json_object *entries = NULL;
    if (logprobs) {
        entries = json_object_new_array();
        json_object_array_add(entries, logprobs);
    }
    json_object *lp = wrap_logprobs(j, entries);
    if (j->kind == JOB_CHAT) {
        json_object *d = json_object_new_object();
        if (rl) add_reasoning(d, reasoning, rl);
        if (cl || !rl)
            json_object_object_add(d, "content", json_object_new_string_len(content, (int)cl));
        return with_choice(envelope(j, 1), choice(j, c->index, d, lp, NULL));
    }
    return with_choice(envelope(j, 1),
                       choice(j, c->index, json_object_new_string_len(content, (int)cl), lp, NULL));
}

json_object *api_tool_chunk(jchoice *c, int k) {
    json_object *d = json_object_new_object(), *arr = json_object_new_array();
    json_object *call = json_object_get(json_object_array_get_idx(c->calls, (size_t)k));
    /* streamed calls carry their position among the choice's calls */
    json_object *e = NULL;
    json_object_deep_copy(call, &e, NULL);
    json_object_put(call);
    if (e) json_object_object_add(e, "index", json_object_new_int(k));
    json_object_array_add(arr, e);
    json_object_object_add(d, "tool_calls", arr);
    return with_choice(envelope(c->job, 1), choice(c->job, c->index, d, NULL, NULL));
}

json_object *api_final_chunk(jchoice *c) {
    job *j = c->job;
    json_object *d = j->kind == JOB_CHAT ? json_object_new_object() : json_object_new_string("");
    return with_choice(envelope(j, 1), choice(j, c->index, d, NULL, reason_name(c)));
}

static json_object *usage(job *j) {
    json_object *u = json_object_new_object();
    json_object_object_add(u, "prompt_tokens", json_object_new_int(j->n_prompt));
    json_object_object_add(u, "completion_tokens", json_object_new_int(j->n_gen));
    json_object_object_add(u, "total_tokens", json_object_new_int(j->n_prompt + j->n_gen));
    /* OpenAI's name for the prompt tokens a prefix cache supplied */
    json_object *d = json_object_new_object();
    json_object_object_add(d, "cached_tokens", json_object_new_int(j->ch[0].sr.n_cached));
    json_object_object_add(u, "prompt_tokens_details", d);
    return u;
}

json_object *api_usage_chunk(job *j) {
    json_object *o = envelope(j, 1);
    json_object_object_add(o, "choices", json_object_new_array());
    json_object_object_add(o, "usage", usage(j));
    return o;
}

json_object *api_response(job *j) {
    json_object *o = envelope(j, 0), *arr = json_object_new_array();
    for (int k = 0; k < j->n_choices; k++) {
        jchoice *c = &j->ch[k];
        text_state *t = &c->text;
        json_object *lp = wrap_logprobs(j, c->lp_all ? json_object_get(c->lp_all) : NULL);
        json_object *body;
        int calls = c->calls && json_object_array_length(c->calls);
        if (j->kind == JOB_CHAT) {
            body = json_object_new_object();
            json_object_object_add(body, "role", json_object_new_string("assistant"));
            /* OpenAI's content is null beside tool calls when there is no text */
            json_object_object_add(body, "content",
                                   calls && !c->content.len ? NULL
                                                            : json_object_new_string_len(
                                                                  c->content.p ? c->content.p : "",
                                                                  (int)c->content.len));
            if (t->reasoning_all.len) add_reasoning(body, t->reasoning_all.p, t->reasoning_all.len);
            if (calls) json_object_object_add(body, "tool_calls", json_object_get(c->calls));
        } else {
            body =
                json_object_new_string_len(c->content.p ? c->content.p : "", (int)c->content.len);
        }
        json_object_array_add(arr, choice(j, k, body, lp, reason_name(c)));
    }
    json_object_object_add(o, "choices", arr);
    json_object_object_add(o, "usage", usage(j));
    return o;
}

void api_call_id(char *out, size_t len) {
    static const char al[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    static atomic_uint_fast64_t ctr;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t x = (uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 30) ^
                 (atomic_fetch_add(&ctr, 1) + 1) * 0x9e3779b97f4a7c15ULL;
    char id[32] = "call_";
    for (int i = 0; i < 24; i++) {
        x ^= x >> 12, x ^= x << 25, x ^= x >> 27; /* xorshift64* */
        id[5 + i] = al[(x * 0x2545f4914f6cdd1dULL >> 58) % 62];
    }
    id[29] = 0;
    snprintf(out, len, "%s", id);
}

static json_object *token_entry(textio *tio, int32_t id, float lp) {
    json_object *e = json_object_new_object();
    char *txt = textio_token_text(tio, id);
    const char *s = txt ? txt : "";
    json_object_object_add(e, "token", json_object_new_string(s));
    json_object_object_add(e, "logprob", json_object_new_double(isfinite(lp) ? lp : -9999.0));
    json_object *bytes = json_object_new_array();
    for (const unsigned char *p = (const unsigned char *)s; *p; p++)
        json_object_array_add(bytes, json_object_new_int(*p));
    json_object_object_add(e, "bytes", bytes);
    free(txt);
    return e;
}

json_object *api_token_logprobs(textio *tio, const sched_token *t) {
    json_object *e = token_entry(tio, t->id, t->logprob), *top = json_object_new_array();
    for (int32_t k = 0; k < t->n_top; k++)
        if (t->top_id[k] >= 0)
            json_object_array_add(top, token_entry(tio, t->top_id[k], t->top_logprob[k]));
    json_object_object_add(e, "top_logprobs", top);
    return e;
}

void api_keep_logprobs(jchoice *c, json_object *entry) {
    if (!c->lp_all) c->lp_all = json_object_new_array();
    json_object_array_add(c->lp_all, entry);
}
