/* libFuzzer target: config.json parsing (md_parse_config) and cfg_lookup. Looks up a
 * fixed set of dotted paths, then every path that the parsed object itself spells out
 * (which must find exactly that value), then the input itself as a path into a fixed
 * config.
 *
 * clang -g -O1 -std=c11 -D_GNU_SOURCE -fsanitize=fuzzer,address,undefined \
 *   -fno-sanitize-recover=all -Icore -Iabi tests/fuzz/fuzz_config.c core/model_dir.c \
 *   core/safetensors.c core/util.c $(pkg-config --cflags --libs json-c) \
 *   -o build-fuzz/fuzz_config
 * (tests/fuzz/run_fuzzers.sh SECONDS builds and runs it with its corpus.) */
#include "model_dir.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const char *const paths[] = {
    "model_type",
    "hidden_size",
    "num_attention_heads",
    "rope_theta",
    "rope_scaling",
    "rope_scaling.rope_type",
    "rope_scaling.factor",
    "rope_parameters.rope_theta",
    "rope_parameters.full_attention.rope_theta",
    "rope_parameters.sliding_attention.rope_type",
    "layer_types.0",
    "layer_types.3",
    "layer_types.18446744073709551615",
    "layer_types.-1",
    "a.0.1.2.b",
    "quantization.model.layers.0.mlp.gate.bits",
    "text_config.rope_parameters.rope_theta",
    "",
    ".",
    "..",
    "a.",
    ".a",
    "a..b",
};

/* Every key path the object spells (keys without dots, up to a few levels) must resolve
 * to exactly its value. */
static void walk(json_object *root, json_object *o, char *path, size_t len, int depth) {
    if (depth > 4 || !o) return;
    if (json_object_is_type(o, json_type_object)) {
        json_object_object_foreach(o, k, v) {
            size_t kl = strlen(k);
            if (!kl || strchr(k, '.') || len + kl + 2 > 200) continue;
            size_t n = len;
            if (n) path[n++] = '.';
            memcpy(path + n, k, kl + 1);
            /* no key on the way has a dot, so no other key can shadow this path */
            if (v && cfg_lookup(root, path) != v) abort();
            walk(root, v, path, n + kl, depth + 1);
            path[len] = '\0';
        }
    } else if (json_object_is_type(o, json_type_array)) {
        size_t n = json_object_array_length(o);
        for (size_t i = 0; i < n && i < 8; i++) {
            int w = snprintf(path + len, 220 - len, "%s%zu", len ? "." : "", i);
            json_object *v = json_object_array_get_idx(o, i);
            if (v && cfg_lookup(root, path) != v) abort();
            walk(root, v, path, len + (size_t)w, depth + 1);
            path[len] = '\0';
        }
    }
}

static json_object *fixed;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char err[512] = "";
    json_object *o = md_parse_config((const char *)data, size, err, sizeof err);
    if (!o) {
        if (!err[0]) abort();
    } else {
        if (!json_object_is_type(o, json_type_object)) abort();
        for (size_t i = 0; i < sizeof paths / sizeof *paths; i++) {
            json_object *v = cfg_lookup(o, paths[i]);
            if (v) (void)json_object_to_json_string(v);
        }
        char path[256] = "";
        walk(o, o, path, 0, 0);
        json_object_put(o);
    }
    if (!fixed) {
        static const char cfg[] =
            "{\"a\": {\"b\": [1, {\"c\": null}], \"d.e\": {\"f\": 2}}, \"g\": [[3]]}";
        fixed = md_parse_config(cfg, strlen(cfg), NULL, 0);
    }
    char p[257];
    size_t n = size < 256 ? size : 256;
    memcpy(p, data, n);
    p[n] = '\0';
    (void)cfg_lookup(fixed, p);
    return 0;
}
