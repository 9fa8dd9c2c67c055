/* libFuzzer target: the input is a chat template, compiled and rendered with a small fixed
 * set of messages under tight limits. A hostile template must fail with a message that says
 * where (LINE:COL), never crash, hang or grow without bound.
 *
 * clang -g -O1 -std=c11 -D_GNU_SOURCE -fsanitize=fuzzer,address,undefined \
 *   -fno-sanitize-recover=all -Icore/template tests/fuzz/fuzz_template.c \
 *   core/template/chat_template.c core/template/tpl_builtins.c core/template/tpl_eval.c \
 *   core/template/tpl_format.c core/template/tpl_json.c core/template/tpl_parse.c \
 *   core/template/tpl_unicode.c core/template/tpl_value.c \
 *   $(pkg-config --cflags --libs json-c libutf8proc) -lm -o build-fuzz/fuzz_template
 * build-fuzz/fuzz_template -max_total_time=30 -dict=tests/fuzz/template.dict \
 *   build-fuzz/corpus/template tests/fuzz/corpus/template
 * (tests/fuzz/run_fuzzers.sh SECONDS template does the same.) */
#include "chat_template.h"

#include <ctype.h>
#include <stdint.h>
#include <stdlib.h>

static json_object *vars(void) {
    static const char *const src =
        "{\"messages\": [{\"role\": \"system\", \"content\": \"be brief\"},"
        " {\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": \"hi \\u00e9\"}]},"
        " {\"role\": \"assistant\", \"content\": \"ok\", \"tool_calls\": [{\"function\":"
        " {\"name\": \"f\", \"arguments\": {\"a\": 1}}}], \"reasoning_content\": \"r\"}],"
        " \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\"}}],"
        " \"add_generation_prompt\": true, \"bos_token\": \"<s>\", \"eos_token\": \"</s>\"}";
    return json_tokener_parse(src);
}

/* "LINE:COL: ..." */
static int positioned(const char *e) {
    if (!isdigit((unsigned char)*e)) return 0;
    while (isdigit((unsigned char)*e)) e++;
    if (*e++ != ':' || !isdigit((unsigned char)*e)) return 0;
    while (isdigit((unsigned char)*e)) e++;
    return *e == ':';
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *err = NULL, *out = NULL;
    tpl_template *t = tpl_compile((const char *)data, size, &err);
    if (!t) {
        if (!err || !positioned(err)) __builtin_trap(); /* every failure says where */
        free(err);
        return 0;
    }
    json_object *v = vars();
    tpl_limits lim = {.max_output = 1 << 20,
                      .max_memory = 16 << 20,
                      .max_steps = 200000,
                      .max_depth = 64,
                      .now = 1700000000};
    size_t len = 0;
    int rc = tpl_render(t, v, &lim, &out, &len, &err);
    if (rc != 0 && (!err || (rc != TPL_ERR_NOMEM && !positioned(err)))) __builtin_trap();
    if (rc == 0 && (!out || len > lim.max_output)) __builtin_trap();
    free(out);
    free(err);
    json_object_put(v);
    tpl_free(t);
    return 0;
}
