/* lmhost chat: talk to a model in the terminal, through its chat template. One message with
 * --prompt, else a conversation read line by line from stdin. */
#include "cli.h"
#include "engine.h"
#include "plugin_loader.h"
#include "sampler.h"
#include "textio.h"

#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The model's reply to the conversation in msgs, streamed to stdout and appended to msgs.
 * Each turn prefills the whole conversation again in a fresh sequence: simple, and cheap
 * beside decoding for the lengths a terminal conversation reaches. */
static int reply(engine *e, textio *t, sampler *s, json_object *msgs, int32_t max_tokens,
                 int32_t chunk) {
    char err[1024], *text = NULL;
    int32_t *ids = NULL, n = 0;
    if (textio_render(t, msgs, NULL, NULL, 1, &text, err, sizeof err) ||
        textio_encode(t, text, 0, &ids, &n, err, sizeof err)) {
        fprintf(stderr, "lmhost chat: %s\n", err);
        free(text);
        return 1;
    }
    free(text);
    int32_t V = engine_vocab(e), eos[16], n_eos = textio_eos(t, eos, 16);
    float *lg = malloc((size_t)V * sizeof *lg);
    int32_t *hist = malloc(((size_t)n + (size_t)max_tokens + 1) * sizeof *hist);
    textio_stream *ts = textio_stream_new(t);
    size_t cap = 256, len = 0;
    char *out = malloc(cap);
    int rc = 1;
    if (!lg || !hist || !ts || !out || engine_seq_add(e, 1) != 0) {
        fprintf(stderr, "lmhost chat: out of memory\n");
        goto done;
    }
    if (cli_prefill(e, 1, ids, n, chunk, NULL, lg)) goto done_seq;
    memcpy(hist, ids, (size_t)n * sizeof *hist);
    int32_t nh = n;
    for (int32_t i = 0; i < max_tokens; i++) {
        int32_t tok = sampler_sample(s, lg, hist, nh), stop = 0;
        hist[nh++] = tok;
        for (int32_t k = 0; k < n_eos; k++) stop |= tok == eos[k];
        size_t m = 0;
        const char *piece = stop ? textio_stream_flush(ts, &m) : textio_stream_push(ts, tok, &m);
        if (m) {
            fwrite(piece, 1, m, stdout);
            fflush(stdout);
            if (len + m + 1 > cap) {
                while (len + m + 1 > cap) cap *= 2;
                char *grown = realloc(out, cap);
                if (!grown) goto done_seq;
                out = grown;
            }
            memcpy(out + len, piece, m);
            len += m;
        }
        if (stop) break;
        engine_row row = {.seq = 1, .token = tok};
        int32_t at = 0;
        if (engine_step(e, &row, 1, &at, 1, lg, NULL, err, sizeof err)) {
            fprintf(stderr, "\nlmhost chat: %s\n", err);
            goto done_seq;
        }
    }
    out[len] = 0;
    json_object *m = json_object_new_object();
    json_object_object_add(m, "role", json_object_new_string("assistant"));
    json_object_object_add(m, "content", json_object_new_string(out));
    json_object_array_add(msgs, m);
    printf("\n");
    rc = 0;
done_seq:
    engine_seq_remove(e, 1);
done:
    textio_stream_free(ts);
    free(out);
    free(lg);
    free(hist);
    free(ids);
    return rc;
}

static void add_message(json_object *msgs, const char *role, const char *content) {
    json_object *m = json_object_new_object();
    json_object_object_add(m, "role", json_object_new_string(role));
    json_object_object_add(m, "content", json_object_new_string(content));
    json_object_array_add(msgs, m);
}

int cli_chat(int argc, char **argv) {
    model_args a = {0};
    const char *prompt = NULL, *system = NULL, *max_tokens = NULL, *temp = NULL, *top_p = NULL,
               *top_k = NULL, *seed = NULL;
    cli_opt opts[] = {
        {"--model", &a.model, NULL, 0, "DIR", "required", HELP_MODEL},
        {"--prompt", &prompt, NULL, 0, "TEXT", "none (read stdin)",
         "one message; without it each line of stdin is a message of one conversation"},
        {"--system", &system, NULL, 0, "TEXT", "none", "the system message"},
        {"--max-tokens", &max_tokens, NULL, 0, "N", "256", "tokens a reply at most"},
        {"--temperature", &temp, NULL, 0, "T", "0.7", "sampling temperature"},
        {"--top-p", &top_p, NULL, 0, "P", "0.9", "nucleus sampling: the likeliest mass P"},
        {"--top-k", &top_k, NULL, 0, "K", "0 (off)", "sample among the K likeliest tokens"},
        {"--seed", &seed, NULL, 0, "S", "0", "the sampler's seed"},
        MODEL_ARG_OPTS(a),
        {0}};
    if (cli_parse(argc, argv, opts)) return 2;
    sampler_params sp = sampler_defaults();
    sp.temperature = 0.7f;
    sp.top_p = 0.9f;
    int64_t v, mt = 256;
    double d;
    if (max_tokens && cli_int("--max-tokens", max_tokens, 1, 1 << 20, &mt)) return 2;
    if (top_k) {
        if (cli_int("--top-k", top_k, 0, 1 << 30, &v)) return 2;
        sp.top_k = (int32_t)v;
    }
    if (seed) {
        if (cli_int("--seed", seed, 0, INT64_MAX, &v)) return 2;
        sp.seed = (uint64_t)v;
    }
    if (temp) {
        if (cli_float("--temperature", temp, 0, 2, &d)) return 2;
        sp.temperature = (float)d;
    }
    if (top_p) {
        if (cli_float("--top-p", top_p, 1e-9, 1, &d)) return 2;
        sp.top_p = (float)d;
    }
    registry reg = {0};
    engine *e = cli_open_engine(&a, &reg);
    char err[1024];
    textio *t = e ? textio_open(a.model, err, sizeof err) : NULL;
    if (e && !t) fprintf(stderr, "lmhost chat: %s\n", err);
    if (t && !textio_has_template(t)) {
        fprintf(stderr, "lmhost chat: %s has no chat template\n", a.model);
        textio_close(t);
        t = NULL;
    }
    sampler *s = t ? sampler_new(&sp, engine_vocab(e), err, sizeof err) : NULL;
    if (t && !s) fprintf(stderr, "lmhost chat: %s\n", err);
    int rc = 1;
    if (s) {
        json_object *msgs = json_object_new_array();
        if (system) add_message(msgs, "system", system);
        if (prompt) {
            add_message(msgs, "user", prompt);
            rc = reply(e, t, s, msgs, (int32_t)mt, 256);
        } else {
            char line[8192];
            int tty = isatty(0);
            rc = 0;
            while (rc == 0) {
                if (tty) fputs("> ", stdout), fflush(stdout);
                if (!fgets(line, sizeof line, stdin)) break;
                line[strcspn(line, "\r\n")] = 0;
                if (!line[0]) continue;
                add_message(msgs, "user", line);
                rc = reply(e, t, s, msgs, (int32_t)mt, 256);
            }
        }
        json_object_put(msgs);
    }
    sampler_free(s);
    textio_close(t);
    engine_close(e);
    registry_free(&reg);
    return rc;
}
