/* libFuzzer target: OpenAI request bodies as the server validates them (JSON parsing,
 * field checks, message normalisation), and the reply-text logic fed with the same bytes
 * (stop strings across chunk boundaries, think sections), and the grammars that
 * response_format and forced tool calls compile to.
 * build: see tests/fuzz/run_fuzzers.sh (the "request" row). */
#include "api.h"
#include "toolcall_static.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* api.c links against textio for logprob entries and stream handles; the target never
 * reaches those paths, so these stand in for them. */
char *textio_token_text(textio *t, int32_t id) {
    (void)t;
    (void)id;
    return NULL;
}
void textio_stream_free(textio_stream *s) {
    (void)s;
}
textio_stream *textio_stream_new(textio *t) {
    (void)t;
    return NULL;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    server_opts o = {.max_tokens = 16, .ctx_size = 4096, .parallel = 1};
    o.defaults = sampler_defaults();
    int oom;
    json_object *body = api_parse_body((const char *)data, size, &oom);
    char err[512], param[64];
    for (int kind = 0; body && kind < 2; kind++) {
        job *j = job_from_request(kind ? JOB_COMPLETION : JOB_CHAT, body, &o, "m", err, sizeof err,
                                  param, sizeof param);
        if (!j) {
            if (!err[0]) __builtin_trap(); /* every refusal says why */
            continue;
        }
        /* the output's constraint: response_format's schema, or forced tool calls in a
         * format told by the input's length (none or one of the tool-call plugins') */
        tc_static_registry();
        const tc_format *f = &tc_static_formats[size % (size_t)tc_static_n_formats];
        if (api_constrain(j, f, err, sizeof err, param, sizeof param) != 0 && !err[0])
            __builtin_trap();
        /* feed the input itself as generated text, in uneven pieces */
        text_out out;
        size_t at = 0, step = 1;
        while (at < size) {
            size_t n = size - at < step ? size - at : step;
            if (text_push(&j->text, (const char *)data + at, n, &out)) break;
            at += n;
            step = step * 3 % 7 + 1;
        }
        text_flush(&j->text, &out);
        job_free(j);
    }
    json_object_put(body);
    return 0;
}
