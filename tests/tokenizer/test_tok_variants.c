/* Feature coverage beyond the six fixture tokenizers: each variant in
 * tests/data/tokenizers/variants.json takes one real tokenizer.json, swaps in other normalizers,
 * pre-tokenizers, decoders, post-processors, model options or added-token flags (the "patch"),
 * and lists what Hugging Face tokenizers (Rust) returns for a common set of inputs: ids with and
 * without specials, decode with specials kept and skipped. All must match, and the streaming
 * decoder must reproduce every decode.
 *
 * usage: test_tok_variants variants.json   (tokenizers from $LMHOST_TOKENIZERS, as the others) */
#include "tok_test_util.h"

/* Applies a variant's patch to a copy of the base tokenizer.json (see the generator's rules):
 * top-level keys are replaced, model_patch keys merged into "model", added_tokens_patch
 * changes flags of existing added tokens, added_tokens_append adds new ones. */
static void apply_patch(json_object *j, json_object *patch) {
    json_object_object_foreach(patch, key, val) {
        if (!strcmp(key, "model_patch")) {
            json_object *model = json_object_object_get(j, "model");
            json_object_object_foreach(val, k2, v2)
                json_object_object_add(model, k2, json_object_get(v2));
        } else if (!strcmp(key, "added_tokens_patch")) {
            json_object *at = json_object_object_get(j, "added_tokens");
            for (size_t i = 0; i < json_object_array_length(at); i++) {
                json_object *a = json_object_array_get_idx(at, i);
                json_object *flags = json_object_object_get(
                    val, json_object_get_string(json_object_object_get(a, "content")));
                if (!flags) continue;
                json_object_object_foreach(flags, k3, v3)
                    json_object_object_add(a, k3, json_object_get(v3));
            }
        } else if (!strcmp(key, "added_tokens_append")) {
            json_object *at = json_object_object_get(j, "added_tokens");
            for (size_t i = 0; i < json_object_array_length(val); i++)
                json_object_array_add(at, json_object_get(json_object_array_get_idx(val, i)));
        } else {
            json_object_object_add(j, key, json_object_get(val));
        }
    }
}

static bool check_decode(const tok_tokenizer *t, const char *name, const char *text,
                         const int32_t *ids, size_t n, bool skip, json_object *want) {
    if (!want || json_object_is_type(want, json_type_null)) return true;
    size_t dn;
    char *d = tok_decode(t, ids, n, skip, &dn);
    char what[160];
    snprintf(what, sizeof what, "%s: decode(%s)", name, skip ? "skip specials" : "specials kept");
    bool ok = check_text(what, text, json_object_get_string(want),
                         (size_t)json_object_get_string_len(want), d ? d : "", d ? dn : 0);
    free(d);
    return ok && check_stream(t, text, ids, n, skip);
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s variants.json\n", argv[0]);
        return 2;
    }
    size_t len;
    char *spec_text = test_slurp(argv[1], &len);
    json_object *spec = spec_text ? json_tokener_parse(spec_text) : NULL;
    free(spec_text);
    json_object *inputs = spec ? json_object_object_get(spec, "inputs") : NULL;
    json_object *variants = spec ? json_object_object_get(spec, "variants") : NULL;
    if (!inputs || !variants) {
        fprintf(stderr, "FAIL: cannot read %s\n", argv[1]);
        return 1;
    }
    const char *bases[8] = {0};
    json_object *base_json[8] = {0};
    size_t n_bases = 0;
    int total = 0, passed = 0, variants_ok = 0;
    size_t nv = json_object_array_length(variants);
    for (size_t vi = 0; vi < nv; vi++) {
        json_object *v = json_object_array_get_idx(variants, vi);
        const char *name = json_object_get_string(json_object_object_get(v, "name"));
        const char *base = json_object_get_string(json_object_object_get(v, "base"));
        size_t b = 0;
        while (b < n_bases && strcmp(bases[b], base) != 0) b++;
        if (b == n_bases) {
            char dir[4096];
            tok_tokenizer *probe = load_real(base, dir, sizeof dir);
            if (!probe) return 1;
            tok_free(probe);
            char path[4200];
            snprintf(path, sizeof path, "%s/tokenizer.json", dir);
            char *text = test_slurp(path, &len);
            base_json[b] = text ? json_tokener_parse(text) : NULL;
            free(text);
            if (!base_json[b] || n_bases == 8) {
                fprintf(stderr, "FAIL: cannot parse %s\n", path);
                return 1;
            }
            bases[n_bases++] = base;
        }
        json_object *j = NULL;
        json_object_deep_copy(base_json[b], &j, NULL);
        apply_patch(j, json_object_object_get(v, "patch"));
        size_t jl;
        const char *js = json_object_to_json_string_length(j, JSON_C_TO_STRING_PLAIN, &jl);
        char err[512];
        tok_tokenizer *t = tok_load_from_memory(js, jl, NULL, 0, err, sizeof err);
        json_object_put(j);
        if (!t) {
            fprintf(stderr, "FAIL %s: cannot load: %s\n", name, err);
            failures++;
            continue;
        }
        json_object *cases = json_object_object_get(v, "cases");
        int before_variant = failures;
        for (size_t ci = 0; ci < json_object_array_length(cases); ci++) {
            json_object *c = json_object_array_get_idx(cases, ci);
            json_object *jt = json_object_array_get_idx(inputs, ci);
            const char *text = json_object_get_string(jt);
            size_t tl = (size_t)json_object_get_string_len(jt);
            int before = failures;
            int32_t *ids, *ids2;
            size_t n, n2;
            if (tok_encode(t, text, tl, false, &ids, &n) ||
                tok_encode(t, text, tl, true, &ids2, &n2)) {
                fprintf(stderr, "FAIL: out of memory\n");
                return 1;
            }
            char what[160];
            snprintf(what, sizeof what, "%s: ids", name);
            check_ids(what, text, json_object_object_get(c, "ids"), ids, n);
            snprintf(what, sizeof what, "%s: ids_with_special", name);
            check_ids(what, text, json_object_object_get(c, "ids_with_special"), ids2, n2);
            check_decode(t, name, text, ids2, n2, false, json_object_object_get(c, "decoded"));
            check_decode(t, name, text, ids2, n2, true, json_object_object_get(c, "decoded_skip"));
            free(ids);
            free(ids2);
            total++;
            if (failures == before) passed++;
        }
        if (failures == before_variant)
            variants_ok++;
        else
            fprintf(stderr, "variant %s: FAILED\n", name);
        tok_free(t);
    }
    for (size_t b = 0; b < n_bases; b++) json_object_put(base_json[b]);
    json_object_put(spec);
    printf("tokenizer variants: %d/%zu variants, %d/%d cases match Hugging Face tokenizers\n",
           variants_ok, nv, passed, total);
    return failures ? 1 : 0;
}
