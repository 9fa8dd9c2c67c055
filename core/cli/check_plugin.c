/* lmhost check-plugin: the conformance kit for plugin authors. Loads one architecture
 * plugin file ahead of every other plugin, runs a reference fixture through it (the logits
 * of the whole prompt in one pass, then greedy decoding one token a step) and says what
 * differs: the worst logit and where, the positions whose argmax differs, the first greedy
 * token that differs and, given transformers' hidden states, the first layer whose output
 * leaves the tolerance. A fixture is a model directory with reference.json (prompt,
 * greedy, top1_margin), logits.npy [prompt, vocab] and optionally hidden_states.npy
 * [layers + 1, prompt, hidden]; tools/make_reference.py writes them with transformers. */
#include "cli.h"
#include "engine.h"
#include "npy.h"
#include "plugin_loader.h"

#include <json-c/json.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct fixture {
    int32_t *prompt, *greedy;
    double *margin;
    int32_t n_prompt, n_greedy;
    float *logits; /* [n_prompt, vocab] */
    int64_t vocab;
    float *hidden; /* [layers + 1, n_prompt, width] or NULL */
    int64_t h_layers, h_width;
} fixture;

static void fixture_free(fixture *fx) {
    free(fx->prompt);
    free(fx->greedy);
    free(fx->margin);
    free(fx->logits);
    free(fx->hidden);
}

static int json_ints(json_object *a, int32_t **out, int32_t *n) {
    if (!a || !json_object_is_type(a, json_type_array)) return -1;
    *n = (int32_t)json_object_array_length(a);
    *out = malloc((size_t)(*n ? *n : 1) * sizeof **out);
    if (!*out) return -1;
    for (int32_t i = 0; i < *n; i++) {
        json_object *v = json_object_array_get_idx(a, (size_t)i);
        if (!json_object_is_type(v, json_type_int)) return -1;
        (*out)[i] = json_object_get_int(v);
    }
    return 0;
}

static int fixture_read(const char *dir, fixture *fx) {
    char path[4096], err[512];
    snprintf(path, sizeof path, "%s/reference.json", dir);
    json_object *ref = json_object_from_file(path);
    if (!ref) {
        fprintf(stderr, "lmhost check-plugin: cannot read %s as JSON\n", path);
        return -1;
    }
    json_object *m = NULL;
    int bad = json_ints(json_object_object_get(ref, "prompt"), &fx->prompt, &fx->n_prompt) ||
              json_ints(json_object_object_get(ref, "greedy"), &fx->greedy, &fx->n_greedy) ||
              fx->n_prompt < 1 || !json_object_object_get_ex(ref, "top1_margin", &m) ||
              !json_object_is_type(m, json_type_array) ||
              (int32_t)json_object_array_length(m) != fx->n_prompt;
    if (!bad && (fx->margin = malloc((size_t)fx->n_prompt * sizeof *fx->margin)))
        for (int32_t i = 0; i < fx->n_prompt; i++)
            fx->margin[i] = json_object_get_double(json_object_array_get_idx(m, (size_t)i));
    json_object_put(ref);
    if (bad || !fx->margin) {
        fprintf(stderr,
                "lmhost check-plugin: %s needs \"prompt\" and \"greedy\" (token id arrays) and "
                "\"top1_margin\" (a number per prompt token)\n",
                path);
        return -1;
    }
    int64_t rows;
    snprintf(path, sizeof path, "%s/logits.npy", dir);
    if (npy_read_f32(path, &fx->logits, &rows, &fx->vocab, err, sizeof err)) {
        fprintf(stderr, "lmhost check-plugin: %s\n", err);
        return -1;
    }
    if (rows != fx->n_prompt) {
        fprintf(stderr, "lmhost check-plugin: %s has %lld rows for a prompt of %d tokens\n", path,
                (long long)rows, fx->n_prompt);
        return -1;
    }
    snprintf(path, sizeof path, "%s/hidden_states.npy", dir);
    FILE *h = fopen(path, "rb");
    if (h) {
        fclose(h);
        int nd;
        int64_t ne[4];
        if (npy_read_f32_nd(path, &fx->hidden, &nd, ne, err, sizeof err)) {
            fprintf(stderr, "lmhost check-plugin: %s\n", err);
            return -1;
        }
        if (nd != 3 || ne[1] != fx->n_prompt) {
            fprintf(stderr,
                    "lmhost check-plugin: %s must be [layers + 1, %d, hidden] (transformers' "
                    "hidden_states for the prompt)\n",
                    path, fx->n_prompt);
            return -1;
        }
        fx->h_layers = ne[0];
        fx->h_width = ne[2];
    }
    return 0;
}

/* max |a - b| over n values, its index, and max |b|. */
static double max_diff(const float *a, const float *b, int64_t n, int64_t *at, double *max_ref) {
    double d = 0, r = 0;
    *at = 0;
    for (int64_t i = 0; i < n; i++) {
        double x = fabs((double)a[i] - (double)b[i]);
        if (!(x <= d)) { /* NaN counts as the worst */
            d = isnan(x) ? INFINITY : x;
            *at = i;
        }
        if (fabs((double)b[i]) > r) r = fabs((double)b[i]);
    }
    *max_ref = r;
    return d;
}

static int32_t argmax(const float *v, int64_t n) {
    int64_t best = 0;
    for (int64_t i = 1; i < n; i++)
        if (v[i] > v[best]) best = i;
    return (int32_t)best;
}

/* The plugin as the registry took it, or NULL after saying why it was not. */
static const plugin *find_loaded(const registry *reg, const char *file) {
    char want[4096], have[4096];
    if (!realpath(file, want)) {
        fprintf(stderr, "lmhost check-plugin: cannot open --plugin %s: %m\n", file);
        return NULL;
    }
    for (int i = 0; i < reg->n; i++)
        if (realpath(reg->items[i].file, have) && strcmp(have, want) == 0) return &reg->items[i];
    for (int i = 0; i < reg->n_refused; i++)
        if (strstr(reg->refused[i], file) || strstr(reg->refused[i], want)) {
            fprintf(stderr, "lmhost check-plugin: the plugin was refused: %s\n", reg->refused[i]);
            return NULL;
        }
    fprintf(stderr,
            "lmhost check-plugin: %s was not taken (is it named lmhost-<kind>-<name>.so, and "
            "another plugin of its kind and name not loaded first?)\n",
            file);
    return NULL;
}

static int check_layers(engine *e, const fixture *fx, double tol) {
    const int32_t L = engine_n_layers(e);
    if (fx->h_layers < 2) return 0;
    /* hidden_states[l + 1] is layer l's output; transformers' last entry has the final norm
     * applied, so the last layer is left to the logits. */
    const int32_t n_cmp = (int32_t)(fx->h_layers - 2 < L ? fx->h_layers - 2 : L);
    if (fx->h_layers != L + 1)
        printf("layers: hidden_states.npy has %lld entries, the model %d layers: comparing the "
               "first %d\n",
               (long long)fx->h_layers, L, n_cmp);
    int first_bad = -1;
    for (int32_t l = 0; l < n_cmp; l++) {
        int64_t rows, width, at;
        const float *got = engine_trace_layer(e, l, &rows, &width);
        const float *want =
            fx->hidden + (size_t)(l + 1) * (size_t)fx->n_prompt * (size_t)fx->h_width;
        if (!got || rows != fx->n_prompt || width != fx->h_width) {
            printf("layer %d: no output of [%d, %lld] traced (the layer's last op wrote [%lld, "
                   "%lld]); its residual add should come last\n",
                   l, fx->n_prompt, (long long)fx->h_width, got ? (long long)rows : 0LL,
                   got ? (long long)width : 0LL);
            if (first_bad < 0) first_bad = l;
            continue;
        }
        double mr, d = max_diff(got, want, rows * width, &at, &mr);
        const int ok = d <= tol * (mr > 0 ? mr : 1);
        printf("layer %d: max |d| = %.3g at position %lld, channel %lld (max |ref| %.3g, ratio "
               "%.3g)%s\n",
               l, d, (long long)(at / width), (long long)(at % width), mr, mr > 0 ? d / mr : d,
               ok ? "" : "  <- over the tolerance");
        if (!ok && first_bad < 0) first_bad = l;
    }
    if (first_bad >= 0) printf("layers: the first layer that differs is %d\n", first_bad);
    return first_bad >= 0;
}

int cli_check_plugin(int argc, char **argv) {
    model_args a = {0};
    const char *plugin_file = NULL, *fixture_dir = NULL, *tol_s = NULL;
    cli_opt opts[] = {
        {"--plugin", &plugin_file, NULL, 0, "FILE", "required",
         "the architecture plugin (.so) to check"},
        {"--fixture", &fixture_dir, NULL, 0, "DIR", "required",
         "the model and its reference: reference.json, logits.npy, optional hidden_states.npy"},
        {"--tolerance", &tol_s, NULL, 0, "X", "1e-3",
         "max |logit difference| / max |reference logit|"},
        MODEL_ARG_OPTS(a),
        {.help = "Runs the fixture's prompt through the plugin and reports where it differs."}};
    if (cli_parse(argc, argv, opts)) return 2;
    if (!plugin_file || !fixture_dir) {
        fprintf(stderr, "lmhost check-plugin: --plugin FILE and --fixture DIR are required\n");
        cli_help(stderr, argv[0], opts);
        return 2;
    }
    double tol = 1e-3;
    if (tol_s && cli_float("--tolerance", tol_s, 0, 1, &tol)) return 2;
    fixture fx = {0};
    if (fixture_read(fixture_dir, &fx)) {
        fixture_free(&fx);
        return 1;
    }
    a.model = fixture_dir;
    a.plugin_file = plugin_file;
    registry reg = {0};
    engine *e = cli_open_engine(&a, &reg);
    const plugin *p = find_loaded(&reg, plugin_file);
    int fails = 0;
    if (!e || !p) {
        fails = 1;
        goto out;
    }
    if (p->info->kind != LMH_KIND_ARCH || strcmp(engine_arch_file(e), p->file) != 0) {
        fprintf(stderr,
                "lmhost check-plugin: %s is not the architecture plugin that took the fixture "
                "(%s did)\n",
                plugin_file, engine_arch_file(e));
        fails = 1;
        goto out;
    }
    printf("plugin: %s %s (ABI %u.%u) from %s\n", p->info->name,
           p->info->version ? p->info->version : "?", p->info->abi_major, p->info->abi_minor,
           p->file);
    printf("chain: %s\n", engine_chain(e));
    const int32_t V = engine_vocab(e), n = fx.n_prompt;
    if (V != fx.vocab) {
        printf("FAIL: the plugin declared a vocabulary of %d, the reference logits have %lld\n", V,
               (long long)fx.vocab);
        fails = 1;
        goto out;
    }

    /* The whole prompt in one pass, every position's logits, every layer traced. */
    float *logits = malloc((size_t)n * (size_t)V * sizeof *logits);
    engine_row *rows = malloc((size_t)n * sizeof *rows);
    int32_t *outs = malloc((size_t)n * sizeof *outs);
    char err[1024];
    int rc =
        !logits || !rows || !outs || engine_trace(e, fx.hidden != NULL) || engine_seq_add(e, 1);
    for (int32_t i = 0; !rc && i < n; i++) {
        rows[i] = (engine_row){.seq = 1, .token = fx.prompt[i]};
        outs[i] = i;
    }
    if (!rc && engine_step(e, rows, n, outs, n, logits, NULL, err, sizeof err)) {
        printf("FAIL: the prompt's forward pass: %s\n", err);
        rc = 1;
    }
    if (!rc) {
        int64_t at;
        double mr, d = max_diff(logits, fx.logits, (int64_t)n * V, &at, &mr);
        const int ok = d <= tol * mr;
        printf("logits: max |d| = %.3g at position %lld, token %lld; max |ref| = %.3g, ratio %.3g "
               "(tolerance %.3g)%s\n",
               d, (long long)(at / V), (long long)(at % V), mr, mr > 0 ? d / mr : d, tol,
               ok ? "" : "  <- FAIL");
        fails += !ok;
        int decided = 0, wrong = 0;
        for (int32_t i = 0; i < n; i++) {
            if (!(fx.margin[i] >= tol * mr)) continue; /* a near-tie either way is fine */
            decided++;
            int32_t got = argmax(logits + (size_t)i * V, V),
                    want = argmax(fx.logits + (size_t)i * V, V);
            if (got != want) {
                if (!wrong) printf("argmax differs at positions:");
                printf(" %d (%d, want %d)", i, got, want);
                wrong++;
            }
        }
        if (wrong) printf("\n");
        printf("argmax: equal at %d/%d positions whose reference margin is over the tolerance%s\n",
               decided - wrong, decided, wrong ? "  <- FAIL" : "");
        fails += wrong > 0;
        if (fx.hidden) fails += check_layers(e, &fx, tol);
    }
    engine_trace(e, 0);
    engine_seq_remove(e, 1);

    /* Greedy decoding as a server runs it: the prompt, then one token a step. */
    int32_t tok = 0, step_bad = -1;
    if (!rc && fx.n_greedy > 0 && engine_seq_add(e, 2) == 0) {
        for (int32_t i = 0; i < n; i++) rows[i].seq = 2;
        int32_t last = n - 1;
        rc = engine_step(e, rows, n, &last, 1, NULL, &tok, err, sizeof err);
        for (int32_t k = 0; !rc && k < fx.n_greedy; k++) {
            if (tok != fx.greedy[k]) {
                step_bad = k;
                break;
            }
            if (k + 1 == fx.n_greedy) break;
            engine_row r = {.seq = 2, .token = tok};
            int32_t zero = 0;
            rc = engine_step(e, &r, 1, &zero, 1, NULL, &tok, err, sizeof err);
        }
        if (rc) printf("FAIL: a decode step: %s\n", err);
        if (step_bad >= 0)
            printf("greedy: token %d differs: %d, want %d (the ones before it agree)  <- FAIL\n",
                   step_bad, tok, fx.greedy[step_bad]);
        else if (!rc)
            printf("greedy: %d/%d tokens equal\n", fx.n_greedy, fx.n_greedy);
        engine_seq_remove(e, 2);
    }
    fails += rc != 0 || step_bad >= 0;
    free(logits);
    free(rows);
    free(outs);
out:
    printf("check-plugin: %s\n", fails ? "FAIL" : "PASS");
    engine_close(e);
    registry_free(&reg);
    fixture_free(&fx);
    return fails ? 1 : 0;
}
