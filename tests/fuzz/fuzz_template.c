/* libFuzzer target: the input is a chat template, compiled and rendered with a small fixed
 * set of messages under tight limits (a hostile template must fail, not hang or grow).
 * build: see tests/fuzz/run_fuzzers.sh (the "template" row). */
#include "chat_template.h"

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

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *err = NULL, *out = NULL;
    tpl_template *t = tpl_compile((const char *)data, size, &err);
    if (!t) {
        if (!err) __builtin_trap(); /* every failure says why */
        free(err);
        return 0;
    }
    json_object *v = vars();
    tpl_limits lim = {.max_output = 1 << 20, .max_memory = 16 << 20, .max_steps = 200000,
                      .max_depth = 64, .now = 1700000000};
    size_t len = 0;
    int rc = tpl_render(t, v, &lim, &out, &len, &err);
    if (rc != 0 && !err) __builtin_trap();
    free(out);
    free(err);
    json_object_put(v);
    tpl_free(t);
    return 0;
}
