#include "textio.h"
#include "log.h"
#include "lmhost/abi.h"
#include "chat_template.h"
#include "tokenizer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct textio {
    tok_tokenizer *tok;
    tpl_chat *chat; /* NULL when the model has no chat template */
};

struct textio_stream {
    tok_stream *s;
};

textio *textio_open(const char *dir, char *err, size_t err_len) {
    textio *t = calloc(1, sizeof *t);
    if (!t) {
        errf(err, err_len, "out of memory");
        return NULL;
    }
    t->tok = tok_load(dir, err, err_len);
    if (!t->tok) {
        free(t);
        return NULL;
    }
    char *terr = NULL;
    t->chat = tpl_chat_load(dir, &terr);
    if (!t->chat && terr) {
        /* a model without a chat template still serves /v1/completions */
        log_msg(LMH_LOG_WARN, "%s: no usable chat template (%s); /v1/chat/completions is off", dir,
                terr);
    }
    free(terr);
    return t;
}

void textio_close(textio *t) {
    if (!t) return;
    tok_free(t->tok);
    tpl_chat_free(t->chat);
    free(t);
}

const struct tok_tokenizer *textio_tokenizer(const textio *t) {
    return t->tok;
}

static char *slurp(const char *dir, const char *name) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char *buf = NULL;
    size_t len = 0, cap = 0, n;
    char tmp[65536];
    while ((n = fread(tmp, 1, sizeof tmp, f)) > 0 && len + n < (64u << 20)) {
        if (len + n + 1 > cap) {
            cap = (len + n + 1) * 2;
            char *nb = realloc(buf, cap);
            if (!nb) break;
            buf = nb;
        }
        memcpy(buf + len, tmp, n);
        len += n;
    }
    fclose(f);
    if (buf) buf[len] = 0;
    return buf;
}

char *textio_template_source(const char *dir) {
    char *s = slurp(dir, "chat_template.jinja");
    return s ? s : slurp(dir, "tokenizer_config.json");
}

int textio_has_template(const textio *t) {
    return t->chat != NULL;
}

int textio_render(textio *t, json_object *messages, json_object *tools, json_object *vars,
                  int add_generation_prompt, char **out, char *err, size_t err_len) {
    char *e = NULL;
    if (tpl_chat_render(t->chat, messages, tools, add_generation_prompt, vars, out, &e) != 0) {
        errf(err, err_len, "chat template: %s", e ? e : "rendering failed");
        free(e);
        return -1;
    }
    return 0;
}

int textio_encode(textio *t, const char *text, int add_special, int32_t **ids, int32_t *n,
                  char *err, size_t err_len) {
    size_t len = 0;
    if (tok_encode(t->tok, text, strlen(text), add_special != 0, ids, &len) != 0)
        return errf(err, err_len, "out of memory while tokenizing");
    if (len > INT32_MAX) return errf(err, err_len, "prompt too long");
    *n = (int32_t)len;
    return 0;
}

int32_t textio_eos(const textio *t, int32_t *out, int32_t max) {
    const int32_t *ids = NULL;
    size_t n = tok_eos_ids(t->tok, &ids);
    int32_t k = 0;
    for (size_t i = 0; i < n && k < max; i++) out[k++] = ids[i];
    return k;
}

char *textio_token_text(textio *t, int32_t id) {
    return tok_decode(t->tok, &id, 1, false, NULL);
}

textio_stream *textio_stream_new(textio *t) {
    textio_stream *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    /* specials stay in the text, as the reference decodes them; EOS never reaches here */
    s->s = tok_stream_new(t->tok, false);
    if (!s->s) {
        free(s);
        return NULL;
    }
    return s;
}

const char *textio_stream_push(textio_stream *s, int32_t id, size_t *len) {
    const char *r = tok_stream_push(s->s, id, len);
    if (!r) *len = 0;
    return r ? r : "";
}

const char *textio_stream_flush(textio_stream *s, size_t *len) {
    const char *r = tok_stream_flush(s->s, len);
    if (!r) *len = 0;
    return r ? r : "";
}

void textio_stream_free(textio_stream *s) {
    if (!s) return;
    tok_stream_free(s->s);
    free(s);
}
