/* The model subcommands: plugins, logits, generate, embed (a stable contract: outside
 * checks parse what they print), plus the option parser shared by the subcommands. */
#include "cli.h"
#include "engine.h"
#include "log.h"
#include "npy.h"
#include "progress.h"
#include "sampler.h"
#include "spec.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *cli_about;

static int opts_have(const cli_opt *opts, const char *name) {
    for (const cli_opt *o = opts; o->name; o++)
        if (!strcmp(o->name, name)) return 1;
    return 0;
}

/* "--name ARG" of an option, as the usage line and the help show it. */
static void opt_label(const cli_opt *o, char *buf, size_t len) {
    snprintf(buf, len, "%s%s%s", o->name, o->arg ? " " : "", o->arg ? o->arg : "");
}

/* text at column col (already reached), words wrapped to lines of width, each after col. */
static void wrap(FILE *f, const char *text, int col, int width) {
    int pos = col;
    while (*text) {
        while (*text == ' ') text++;
        int len = (int)strcspn(text, " ");
        if (!len) break;
        const char *close = *text == '[' ? strchr(text, ']') : NULL;
        if (close && close - text + 1 <= width - col) /* "[default: X]" stays whole */
            len = (int)(close - text + 1);
        if (pos > col && pos + 1 + len > width) {
            fprintf(f, "\n%*s", col, "");
            pos = col;
        }
        fprintf(f, "%s%.*s", pos > col ? " " : "", len, text);
        pos += (pos > col) + len;
        text += len;
    }
    fputc('\n', f);
}

void cli_help(FILE *f, const char *cmd, const cli_opt *opts) {
    enum { COL = 29, WIDTH = 80 };
    char lab[128], text[1024];
    fprintf(f, "usage: lmhost %s", cmd);
    for (const cli_opt *o = opts; o->name; o++)
        if (o->def && !strcmp(o->def, "required")) {
            opt_label(o, lab, sizeof lab);
            fprintf(f, " %s", lab);
        }
    fprintf(f, " [options]\n");
    if (cli_about) fprintf(f, "\n%s\n", cli_about);
    fprintf(f, "\noptions:\n");
    const cli_opt *o = opts;
    for (; o->name; o++) {
        if (!strcmp(o->name, "--help")) continue; /* below, always */
        opt_label(o, lab, sizeof lab);
        /* A label wider than its column takes a line of its own. */
        if ((int)strlen(lab) > COL - 3)
            fprintf(f, "  %s\n%*s", lab, COL, "");
        else
            fprintf(f, "  %-*s", COL - 2, lab);
        int req = o->def && !strcmp(o->def, "required");
        snprintf(text, sizeof text, "%s%s%s%s%s%s", o->help ? o->help : "",
                 o->str && o->flag ? " (may repeat)" : "", req ? " [required]" : "",
                 o->def && !req ? " [default: " : "", o->def && !req ? o->def : "",
                 o->def && !req ? "]" : "");
        wrap(f, text, COL, WIDTH);
    }
    fprintf(f, "  %-*s%s\n", COL - 2, "-h, --help", "print this help and exit");
    if (o->help) fprintf(f, "\n%s\n", o->help); /* the end row's notes */
}

/* Prints the help (or the option list) and exits 0 where argv asks for it: walks argv as
 * cli_parse does, skipping options' values, without complaining about anything. */
static void answer_help(int argc, char **argv, const cli_opt *opts) {
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            cli_help(stdout, argv[0], opts);
            exit(fflush(stdout) == 0 ? 0 : 1);
        }
        if (!strcmp(a, "--list-options")) {
            for (const cli_opt *o = opts; o->name; o++) printf("%s\n", o->name);
            if (!opts_have(opts, "--help")) printf("--help\n");
            exit(fflush(stdout) == 0 ? 0 : 1);
        }
        if (strchr(a, '=')) continue;
        for (const cli_opt *o = opts; o->name; o++)
            if (o->str && !strcmp(o->name, a)) {
                i++; /* its value, whatever it looks like */
                break;
            }
    }
}

int cli_parse(int argc, char **argv, const cli_opt *opts) {
    answer_help(argc, argv, opts);
    /* Which options this command line gave: a value preset by the caller (a default) is
     * not "given", so it never makes the user's own value a repeat. */
    unsigned char given[128] = {0};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *eq = strchr(a, '=');
        size_t nl = eq ? (size_t)(eq - a) : strlen(a);
        const cli_opt *o = NULL;
        for (const cli_opt *p = opts; p->name; p++)
            if (strlen(p->name) == nl && strncmp(p->name, a, nl) == 0) o = p;
        if (!o) {
            fprintf(stderr, "lmhost %s: unknown option '%s'\n", argv[0], a);
            return 2;
        }
        if (o->flag && !o->str) {
            if (eq) {
                fprintf(stderr, "lmhost %s: %s takes no value\n", argv[0], o->name);
                return 2;
            }
            *o->flag = 1;
            continue;
        }
        const char *v = eq ? eq + 1 : (i + 1 < argc ? argv[++i] : NULL);
        if (!v) {
            fprintf(stderr, "lmhost %s: %s needs a value\n", argv[0], o->name);
            return 2;
        }
        size_t k = (size_t)(o - opts);
        if (k < sizeof given && given[k] && !o->repeatable) {
            fprintf(stderr, "lmhost %s: %s given twice\n", argv[0], o->name);
            return 2;
        }
        if (k < sizeof given) given[k] = 1;
        if (o->flag) /* a list of values: every argument takes a slot at most */
            o->str[(*o->flag)++] = v;
        else
            *o->str = v;
    }
    return 0;
}

int cli_int(const char *opt, const char *s, int64_t lo, int64_t hi, int64_t *out) {
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) {
        fprintf(stderr, "lmhost: %s must be an integer in [%lld, %lld] (got '%s')\n", opt,
                (long long)lo, (long long)hi, s);
        return -1;
    }
    *out = v;
    return 0;
}

int cli_float(const char *opt, const char *s, double lo, double hi, double *out) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !(v >= lo && v <= hi)) {
        fprintf(stderr, "lmhost: %s must be a number in [%g, %g] (got '%s')\n", opt, lo, hi, s);
        return -1;
    }
    *out = v;
    return 0;
}

int cli_precision(const char *s, int *out) {
    if (!s) return 0;
    if (strcmp(s, "exact") == 0)
        *out = LMH_PRECISION_EXACT;
    else if (strcmp(s, "fast") == 0)
        *out = LMH_PRECISION_FAST;
    else {
        fprintf(stderr, "lmhost: --precision must be exact or fast (got '%s')\n", s);
        return 2;
    }
    return 0;
}

int cli_ids(const char *opt, const char *s, int32_t **ids, int32_t *n) {
    size_t cap = 16, len = 0;
    int32_t *v = malloc(cap * sizeof *v);
    const char *p = s;
    while (v && *p) {
        char *end;
        errno = 0;
        long long x = strtoll(p, &end, 10);
        if (errno || end == p || x < 0 || x > INT32_MAX || (*end && *end != ',')) {
            fprintf(stderr, "lmhost: %s must be comma-separated token ids (bad at '%s')\n", opt, p);
            free(v);
            return -1;
        }
        if (len == cap) {
            int32_t *nv = realloc(v, (cap *= 2) * sizeof *nv);
            if (!nv) break;
            v = nv;
        }
        v[len++] = (int32_t)x;
        p = *end ? end + 1 : end;
        if (*end && !*p) {
            fprintf(stderr, "lmhost: %s ends with a comma\n", opt);
            free(v);
            return -1;
        }
    }
    if (!v || len == 0) {
        fprintf(stderr, "lmhost: %s needs at least one token id\n", opt);
        free(v);
        return -1;
    }
    *ids = v;
    *n = (int32_t)len;
    return 0;
}

/* ---- plugins ------------------------------------------------------------------------ */

static void print_list(const char *label, const char *const *l) {
    printf("    %s:", label);
    for (int i = 0; l && l[i]; i++) printf("%s %s", i ? "," : "", l[i]);
    printf("\n");
}

int cli_plugins(int argc, char **argv) {
    const char *dir = NULL;
    cli_opt opts[] = {{"--plugin-dir", &dir, NULL, 0, "DIR", "none",
                       "a directory searched for plugins before the usual places"},
                      {.help = "Plugins are looked for in --plugin-dir, $LMHOST_PLUGIN_PATH, the "
                               "build tree of\nthe binary, then the install directory."}};
    if (cli_parse(argc, argv, opts)) return 2;
    registry reg;
    if (registry_load(&reg, dir)) return 1;
    static const lmh_plugin_kind kinds[] = {LMH_KIND_ARCH, LMH_KIND_BACKEND, LMH_KIND_CACHE,
                                            LMH_KIND_TOOLCALL};
    static const char *const kind_names[] = {"architecture", "backend", "cache", "toolcall"};
    for (int k = 0; k < 4; k++) {
        for (int i = 0; i < reg.n; i++) {
            const lmh_plugin_info *in = reg.items[i].info;
            if (in->kind != kinds[k]) continue;
            printf("%s %s %s (ABI %u.%u)\n    file: %s\n    %s\n", kind_names[k], in->name,
                   in->version ? in->version : "?", in->abi_major, in->abi_minor, reg.items[i].file,
                   in->summary ? in->summary : "");
            if (in->kind == LMH_KIND_ARCH)
                print_list("model types", ((const lmh_arch_api *)in->api)->model_types);
            if (in->kind == LMH_KIND_BACKEND) {
                const lmh_backend_api *b = in->api;
                print_list("ops", b->ops);
                print_list("weight dtypes", b->weight_dtypes);
            }
            if (in->kind == LMH_KIND_CACHE)
                print_list("formats", ((const lmh_cache_api *)in->api)->formats);
            if (in->kind == LMH_KIND_TOOLCALL)
                print_list("formats", ((const lmh_toolcall_api *)in->api)->formats);
        }
    }
    for (int i = 0; i < reg.n_refused; i++) printf("refused %s\n", reg.refused[i]);
    registry_free(&reg);
    return 0;
}

/* ---- shared by logits / generate ------------------------------------------------------ */

/* A model's short name for a progress bar: "org/name" for a Hugging Face cache snapshot
 * (.../models--org--name/snapshots/REV), else the directory's last component. */
static void model_label(const char *dir, char *out, size_t len) {
    const char *m = strstr(dir, "models--"), *snap = m ? strstr(m, "/snapshots/") : NULL;
    if (snap) {
        snprintf(out, len, "%.*s", (int)(snap - m - 8), m + 8);
        char *sep = strstr(out, "--");
        if (sep) { /* models--org--name: org/name */
            *sep = '/';
            memmove(sep + 1, sep + 2, strlen(sep + 2) + 1);
        }
        return;
    }
    size_t n = strlen(dir);
    while (n > 1 && dir[n - 1] == '/') n--; /* "dir/" */
    size_t b = n;
    while (b > 0 && dir[b - 1] != '/') b--;
    snprintf(out, len, "%.*s", (int)(n - b), dir + b);
}

void cli_load_progress(void *ctx, uint64_t done, uint64_t total) {
    /* One load at a time (the target, then a draft): a bar from its first call to its last. */
    static progress *bar;
    if (done == ENGINE_LOAD_FAILED) {
        progress_end(bar, 0);
        bar = NULL;
        return;
    }
    if (!bar) {
        if (done >= total) return; /* the last call of a load whose bar has ended */
        char name[256], label[300];
        model_label(ctx ? (const char *)ctx : "model", name, sizeof name);
        snprintf(label, sizeof label, "loading %s", name);
        bar = progress_start_flags(label, total,
                                   PROGRESS_BYTES | PROGRESS_TTY_ONLY | PROGRESS_DELAYED);
        if (!bar) return;
    }
    progress_set(bar, done);
    if (done >= total) {
        progress_end(bar, 1);
        bar = NULL;
    }
}

/* --devices and --tensor-split: comma-separated values, n of them at most. */
static int num_list(const char *opt, const char *s, int is_int, double lo, double hi, double *v,
                    int max) {
    int n = 0;
    const char *p = s;
    while (*p) {
        char *end;
        errno = 0;
        double x = is_int ? (double)strtol(p, &end, 10) : strtod(p, &end);
        if (errno || end == p || (*end && *end != ',') || !(x >= lo && x <= hi)) {
            fprintf(stderr, "lmhost: %s takes comma-separated %s from %g to %g (bad at '%s')\n",
                    opt, is_int ? "integers" : "numbers", lo, hi, p);
            return -1;
        }
        if (n == max) {
            fprintf(stderr, "lmhost: %s takes at most %d values\n", opt, max);
            return -1;
        }
        v[n++] = x;
        p = *end ? end + 1 : end;
        if (*end && !*p) {
            fprintf(stderr, "lmhost: %s ends with a comma\n", opt);
            return -1;
        }
    }
    if (!n) fprintf(stderr, "lmhost: %s needs a value\n", opt);
    return n ? n : -1;
}

/* --devices, --split and --tensor-split into o. */
static int cli_devices(const model_args *a, engine_opts *o) {
    if (a->split && strcmp(a->split, "layer")) {
        fprintf(stderr,
                "lmhost: --split %s: only 'layer' is supported (each device a contiguous share "
                "of layers)\n",
                a->split);
        return 2;
    }
    if (a->tensor_split && !a->devices) {
        fprintf(stderr, "lmhost: --tensor-split goes with --devices\n");
        return 2;
    }
    if (!a->devices) return 0;
    if (a->device) {
        fprintf(stderr, "lmhost: --device and --devices: give one of them\n");
        return 2;
    }
    double v[ENGINE_MAX_DEVICES];
    int n = num_list("--devices", a->devices, 1, 0, 255, v, ENGINE_MAX_DEVICES);
    if (n < 0) return 2;
    for (int i = 0; i < n; i++) o->devices[i] = (int)v[i];
    o->n_devices = n;
    if (a->tensor_split) {
        int m = num_list("--tensor-split", a->tensor_split, 0, 0, 1e6, v, ENGINE_MAX_DEVICES);
        if (m < 0) return 2;
        double sum = 0;
        for (int i = 0; i < m; i++) sum += v[i];
        if (m != n) {
            fprintf(stderr, "lmhost: --tensor-split has %d values for %d devices\n", m, n);
            return 2;
        }
        if (!(sum > 0)) {
            fprintf(stderr, "lmhost: --tensor-split: the shares add up to 0\n");
            return 2;
        }
        for (int i = 0; i < m; i++) o->tensor_split[i] = v[i];
    }
    return 0;
}

int cli_engine_opts(const model_args *a, engine_opts *o) {
    if (!a->model) {
        fprintf(stderr, "lmhost: --model DIR is required\n");
        return 2;
    }
    int64_t th = 0, gl = -1, dev = 0;
    if (a->threads && cli_int("--threads", a->threads, 1, 1024, &th)) return 2;
    if (a->gpu_layers && cli_int("--gpu-layers", a->gpu_layers, 0, 1 << 20, &gl)) return 2;
    if (a->device && cli_int("--device", a->device, 0, 255, &dev)) return 2;
    int prec = 0;
    if (cli_precision(a->precision, &prec)) return 2;
    int64_t mk = 0;
    double xmb = 0; /* fractions too: the test fixtures' experts are a few hundred KB */
    if (a->expert_cache_mb &&
        cli_float("--expert-cache-mb", a->expert_cache_mb, 0.01, (double)(1 << 30), &xmb))
        return 2;
    if (a->expert_cache_mb && !a->stream_experts) {
        fprintf(stderr, "lmhost: --expert-cache-mb goes with --stream-experts\n");
        return 2;
    }
    if (a->moe_top_k && cli_int("--moe-top-k", a->moe_top_k, 1, 1 << 16, &mk)) return 2;
    *o = (engine_opts){.model_dir = a->model,
                       .backend = a->backend,
                       .cache = a->cache,
                       .threads = (int)th,
                       .gpu_layers = (int)gl,
                       .device = (int)dev,
                       .precision = prec,
                       .stream_experts = a->stream_experts,
                       .expert_cache_bytes = (int64_t)(xmb * (1 << 20)),
                       .moe_top_k = (int)mk,
                       .progress = cli_load_progress,
                       .progress_ctx = (void *)a->model};
    return cli_devices(a, o);
}

engine *cli_open_engine(const model_args *a, registry *reg) {
    engine_opts o;
    if (cli_engine_opts(a, &o)) return NULL;
    if (registry_load_with(reg, a->plugin_file, a->plugin_dir)) return NULL;
    char err[2048];
    engine *e = engine_open(reg, &o, err, sizeof err);
    if (!e) fprintf(stderr, "lmhost: %s\n", err);
    return e;
}

int cli_spec_opts(const spec_args *sa, spec_opts *so) {
    *so = (spec_opts){.kind = sa->draft_model ? SPEC_DRAFT : SPEC_OFF,
                      .draft_max = 8,
                      .draft_model = sa->draft_model,
                      .draft_backend = sa->draft_backend};
    if (sa->spec && strcmp(sa->spec, "ngram") == 0)
        so->kind = SPEC_NGRAM;
    else if (sa->spec && strcmp(sa->spec, "draft") == 0)
        so->kind = SPEC_DRAFT;
    else if (sa->spec && strcmp(sa->spec, "off") == 0)
        so->kind = SPEC_OFF;
    else if (sa->spec) {
        fprintf(stderr, "lmhost: --spec must be ngram, draft or off (got '%s')\n", sa->spec);
        return 2;
    }
    if (so->kind == SPEC_DRAFT && !sa->draft_model) {
        fprintf(stderr, "lmhost: --spec draft needs --draft-model DIR\n");
        return 2;
    }
    if (so->kind != SPEC_DRAFT && (sa->draft_model || sa->draft_backend)) {
        fprintf(stderr, "lmhost: --draft-model and --draft-backend go with --spec draft\n");
        return 2;
    }
    int64_t k = 8;
    if (sa->draft_max && cli_int("--draft-max", sa->draft_max, 1, SPEC_MAX_DRAFT, &k)) return 2;
    so->draft_max = (int32_t)k;
    if (so->kind == SPEC_OFF && sa->draft_max)
        fprintf(stderr, "lmhost: --draft-max ignored: speculation is off\n");
    return 0;
}

int cli_open_spec(const spec_args *sa, const model_args *a, registry *reg, engine *target,
                  int32_t chunk, spec **sp, engine **draft) {
    spec_opts so;
    engine_opts o;
    int rc = cli_spec_opts(sa, &so);
    if (rc == 0) rc = cli_engine_opts(a, &o);
    if (rc) return rc;
    o.progress_ctx = (void *)sa->draft_model; /* the draft model's load bar */
    char err[2048];
    if (spec_open(&so, &o, reg, target, chunk, sp, draft, err, sizeof err)) {
        fprintf(stderr, "lmhost: %s\n", err);
        return 1;
    }
    return 0;
}

/* Runs the prompt through the model in chunks of at most `chunk` rows; leaves the logits
 * of the last position in last[vocab] (and every position's in all[n*vocab] if given). */
int cli_prefill(engine *e, uint64_t seq, const int32_t *ids, int32_t n, int32_t chunk, float *all,
                float *last) {
    int32_t V = engine_vocab(e);
    engine_row *rows = malloc((size_t)chunk * sizeof *rows);
    int32_t *outs = malloc((size_t)chunk * sizeof *outs);
    /* one prompt however many steps it takes: what a model sees of its length is the
     * prompt's (engine_seq_prompt) */
    int rc = engine_seq_prompt(e, seq, n) ? 1 : 0;
    char err[1024];
    for (int32_t at = 0; rows && outs && at < n && rc == 0; at += chunk) {
        int32_t m = n - at < chunk ? n - at : chunk;
        for (int32_t i = 0; i < m; i++) {
            rows[i] = (engine_row){.seq = seq, .token = ids[at + i]};
            outs[i] = i;
        }
        float *dst = all ? all + (size_t)at * (size_t)V : last;
        int32_t n_out = all ? m : 1;
        if (!all) outs[0] = m - 1;
        if (engine_step(e, rows, m, outs, n_out, dst, NULL, err, sizeof err)) {
            fprintf(stderr, "lmhost: %s\n", err);
            rc = 1;
        }
    }
    if (!rows || !outs) rc = 1;
    if (rc == 0 && all) memcpy(last, all + (size_t)(n - 1) * (size_t)V, (size_t)V * sizeof(float));
    free(rows);
    free(outs);
    return rc;
}

int cli_logits(int argc, char **argv) {
    model_args a = {0};
    const char *out = NULL, *chunk_s = NULL;
    cli_opt opts[] = {
        {"--model", &a.model, NULL, 0, "DIR", "required", HELP_MODEL},
        {"--tokens", &a.tokens, NULL, 0, "1,2,3", "required", "the prompt's token ids"},
        {"--out", &out, NULL, 0, "F.npy", "required",
         "where the logits go: float32 [n_tokens, vocab]"},
        MODEL_ARG_OPTS(a),
        {"--chunk", &chunk_s, NULL, 0, "N", "512", "prompt tokens a prefill step at most"},
        {0}};
    if (cli_parse(argc, argv, opts)) return 2;
    if (!a.tokens || !out) {
        fprintf(stderr, "lmhost logits: --tokens and --out are required\n");
        return 2;
    }
    int32_t *ids, n;
    int64_t chunk = 512;
    if (cli_ids("--tokens", a.tokens, &ids, &n)) return 2;
    if (chunk_s && cli_int("--chunk", chunk_s, 1, 1 << 20, &chunk)) return 2;
    registry reg = {0};
    engine *e = cli_open_engine(&a, &reg);
    int rc = 1;
    if (e) {
        int32_t V = engine_vocab(e);
        float *all = malloc((size_t)n * (size_t)V * sizeof(float));
        float *last = malloc((size_t)V * sizeof(float));
        char err[512];
        if (all && last && engine_seq_add(e, 1) == 0 &&
            cli_prefill(e, 1, ids, n, (int32_t)chunk, all, last) == 0) {
            if (npy_write_f32(out, all, n, V, err, sizeof err) == 0)
                rc = 0;
            else
                fprintf(stderr, "lmhost: %s\n", err);
        }
        free(all);
        free(last);
        engine_close(e);
    }
    registry_free(&reg);
    free(ids);
    return rc;
}

/* End-of-sequence ids from config.json's eos_token_id (a number or a list). */
static int32_t eos_ids(engine *e, int32_t *out, int32_t max) {
    json_object *o = json_object_object_get(engine_config(e), "eos_token_id");
    int32_t n = 0;
    if (o && json_object_is_type(o, json_type_int))
        out[n++] = json_object_get_int(o);
    else if (o && json_object_is_type(o, json_type_array))
        for (size_t i = 0; i < json_object_array_length(o) && n < max; i++) {
            json_object *x = json_object_array_get_idx(o, i);
            if (json_object_is_type(x, json_type_int)) out[n++] = json_object_get_int(x);
        }
    return n;
}

/* Sequence seq takes the state of another that ran ids[0..n): its keys, values and
 * recurrent state, copied out and back in (engine_seq_snapshot), the prefix cache's path. */
static int restore_prefix(engine *e, uint64_t seq, const int32_t *ids, int32_t n, int32_t chunk) {
    char err[512];
    const uint64_t other = seq + 1;
    float *lg = malloc((size_t)engine_vocab(e) * sizeof *lg);
    engine_snapshot *sn = NULL;
    int rc = !lg || engine_seq_add(e, other) != 0 || cli_prefill(e, other, ids, n, chunk, NULL, lg);
    if (rc == 0 && !(sn = engine_seq_snapshot(e, other, 1, err, sizeof err))) rc = 1;
    engine_seq_remove(e, other);
    if (rc == 0 && engine_seq_restore(e, seq, sn, err, sizeof err) != 0) rc = 1;
    if (rc)
        fprintf(stderr, "lmhost: restoring a prefix of %d tokens: %s\n", n,
                sn || !lg ? err : "failed");
    engine_snapshot_free(sn);
    free(lg);
    return rc;
}

static void print_token(int32_t tok, int32_t i, void *user) {
    (void)user;
    printf("%s%d", i ? ", " : "", tok);
}

int cli_generate(int argc, char **argv) {
    model_args a = {0};
    spec_args sa = {0};
    const char *max_s = NULL, *temp_s = NULL, *topk_s = NULL, *topp_s = NULL, *minp_s = NULL,
               *rep_s = NULL, *seed_s = NULL, *chunk_s = NULL, *prefix_s = NULL;
    int ignore_eos = 0;
    cli_opt opts[] = {
        {"--model", &a.model, NULL, 0, "DIR", "required", HELP_MODEL},
        {"--tokens", &a.tokens, NULL, 0, "1,2,3", "required", "the prompt's token ids"},
        {"--max-tokens", &max_s, NULL, 0, "N", "required", "tokens to generate at most"},
        {"--temperature", &temp_s, NULL, 0, "T", "0 (greedy)", "sampling temperature"},
        {"--top-k", &topk_s, NULL, 0, "K", "0 (off)", "sample among the K likeliest tokens"},
        {"--top-p", &topp_s, NULL, 0, "P", "1 (off)", "nucleus sampling: the likeliest mass P"},
        {"--min-p", &minp_s, NULL, 0, "M", "0 (off)",
         "drop tokens below M x the likeliest one's probability"},
        {"--repetition-penalty", &rep_s, NULL, 0, "R", "1 (off)",
         "penalise the tokens seen so far as Hugging Face does (positive logits / R, negative x "
         "R)"},
        {"--seed", &seed_s, NULL, 0, "S", "0", "the sampler's seed"},
        MODEL_ARG_OPTS(a),
        {"--chunk", &chunk_s, NULL, 0, "N", "512", "prompt tokens a prefill step at most"},
        {"--ignore-eos", NULL, &ignore_eos, 0, NULL, "off",
         "keep going past end-of-sequence tokens"},
        SPEC_ARG_OPTS(sa),
        {"--restore-prefix", &prefix_s, NULL, 0, "N", "off",
         "the prompt's first N tokens go through another sequence whose state is restored "
         "into this one, as the server's prefix cache does"},
        {.help = "Prints {\"tokens\": [...]} as the tokens come."}};
    if (cli_parse(argc, argv, opts)) return 2;
    if (!a.tokens || !max_s) {
        fprintf(stderr, "lmhost generate: --tokens and --max-tokens are required\n");
        return 2;
    }
    sampler_params sp = sampler_defaults();
    int64_t maxn, iv, chunk = 512;
    double fv;
    if (cli_int("--max-tokens", max_s, 0, 1 << 24, &maxn)) return 2;
    if (temp_s) {
        if (cli_float("--temperature", temp_s, 0, 100, &fv)) return 2;
        sp.temperature = (float)fv;
    }
    if (topk_s) {
        if (cli_int("--top-k", topk_s, 0, INT32_MAX, &iv)) return 2;
        sp.top_k = (int32_t)iv;
    }
    if (topp_s) {
        if (cli_float("--top-p", topp_s, 1e-9, 1, &fv)) return 2;
        sp.top_p = (float)fv;
    }
    if (minp_s) {
        if (cli_float("--min-p", minp_s, 0, 1, &fv)) return 2;
        sp.min_p = (float)fv;
    }
    if (rep_s) {
        if (cli_float("--repetition-penalty", rep_s, 1e-6, 1e6, &fv)) return 2;
        sp.repetition_penalty = (float)fv;
    }
    if (seed_s) {
        if (cli_int("--seed", seed_s, 0, INT64_MAX, &iv)) return 2;
        sp.seed = (uint64_t)iv;
    }
    if (chunk_s && cli_int("--chunk", chunk_s, 1, 1 << 20, &chunk)) return 2;
    int32_t *ids, n;
    if (cli_ids("--tokens", a.tokens, &ids, &n)) return 2;
    int64_t prefix = 0;
    if (prefix_s && cli_int("--restore-prefix", prefix_s, 1, n - 1, &prefix)) {
        free(ids);
        return 2;
    }
    registry reg = {0};
    engine *e = cli_open_engine(&a, &reg);
    if (!e) {
        registry_free(&reg);
        free(ids);
        return 1;
    }
    spec *drafter = NULL;
    engine *draft = NULL;
    int rc = cli_open_spec(&sa, &a, &reg, e, (int32_t)chunk, &drafter, &draft);
    if (rc) {
        engine_close(e);
        registry_free(&reg);
        free(ids);
        return rc;
    }
    rc = 1;
    int32_t V = engine_vocab(e), eos[16], n_eos = ignore_eos ? 0 : eos_ids(e, eos, 16);
    char err[512];
    sampler *s = sampler_new(&sp, V, err, sizeof err);
    float *lg = malloc((size_t)V * sizeof(float));
    int32_t *hist = malloc(((size_t)n + (size_t)maxn + 1) * sizeof *hist);
    if (!s) fprintf(stderr, "lmhost: %s\n", err);
    if (s && lg && hist && engine_seq_add(e, 1) == 0 &&
        (!prefix || restore_prefix(e, 1, ids, (int32_t)prefix, (int32_t)chunk) == 0) &&
        (maxn == 0 ||
         cli_prefill(e, 1, ids + prefix, n - (int32_t)prefix, (int32_t)chunk, NULL, lg) == 0)) {
        memcpy(hist, ids, (size_t)n * sizeof *hist);
        int32_t nh = n;
        rc = 0;
        /* A greedy sampler needs no logits: each step brings back its pick alone; where
         * the backend overlaps them, the next step is enqueued before that pick is read
         * (its token is the pick, on the device); `started` counts the steps enqueued and
         * not read. */
        int greedy = sampler_is_greedy(s), overlap = greedy && engine_step_overlaps(e);
        int32_t tok, next = -1, out0 = 0, started = 0;
        printf("{\"tokens\": [");
        if (drafter && maxn > 0) {
            int32_t steps = 0, before = nh;
            rc = spec_decode(drafter, e, 1, s, lg, hist, &nh, (int32_t)maxn, eos, n_eos,
                             print_token, NULL, &steps, err, sizeof err) != 0;
            if (rc) fprintf(stderr, "lmhost: %s\n", err);
            spec_stats st;
            spec_get_stats(drafter, &st);
            fprintf(stderr,
                    "lmhost: speculative: %d target steps for %d tokens; %llu proposed, %llu "
                    "accepted (%.1f%%); %.2f tokens a step with proposals\n",
                    steps, nh - before - 1, (unsigned long long)st.drafted,
                    (unsigned long long)st.accepted,
                    st.drafted ? 100.0 * (double)st.accepted / (double)st.drafted : 0.0,
                    st.steps ? (double)(st.steps + st.accepted) / (double)st.steps : 0.0);
            maxn = 0; /* the plain loop below has nothing left to do */
        }
        for (int64_t t = 0; t < maxn; t++) {
            if (t == 0 || !greedy) {
                tok = sampler_sample(s, lg, hist, nh);
            } else if (!overlap) {
                tok = next;
            } else {
                if (engine_step_finish(e, &tok, 1, err, sizeof err) != 1) goto failed;
                started--;
            }
            hist[nh++] = tok;
            printf("%s%d", t ? ", " : "", tok);
            int stop = 0;
            for (int32_t i = 0; i < n_eos; i++) stop |= tok == eos[i];
            if (stop || t + 1 == maxn) break;
            /* the step after this token; overlapped, also the one after the next token */
            engine_row row = {.seq = 1, .token = tok};
            if (overlap ? (!started && engine_step_start(e, &row, 1, &out0, 1, 0, err, sizeof err))
                        : engine_step(e, &row, 1, &out0, 1, greedy ? NULL : lg,
                                      greedy ? &next : NULL, err, sizeof err))
                goto failed;
            started += overlap && !started;
            if (overlap && t + 2 < maxn) {
                if (engine_step_start(e, &row, 1, &out0, 1, 1, err, sizeof err)) goto failed;
                started++;
            }
            continue;
        failed:
            fprintf(stderr, "lmhost: %s\n", err);
            rc = 1;
            break;
        }
        printf("]}\n"); /* a step started past a stop is dropped with the engine */
    }
    sampler_free(s);
    free(lg);
    free(hist);
    free(ids);
    spec_free(drafter);
    engine_close(draft);
    engine_close(e);
    registry_free(&reg);
    return rc;
}

/* ---- embed ---------------------------------------------------------------------------- */

int cli_embed(int argc, char **argv) {
    model_args a = {0};
    const char *pool_s = NULL, **ids_s = calloc((size_t)argc + 1, sizeof *ids_s);
    int n_seqs = 0;
    if (!ids_s) {
        fprintf(stderr, "lmhost: out of memory\n");
        return 1;
    }
    cli_opt opts[] = {
        {"--model", &a.model, NULL, 0, "DIR", "required", HELP_MODEL},
        /* one a sequence, each kept */
        {"--ids", ids_s, &n_seqs, 1, "1,2,3", "required", "one sequence's token ids"},
        {"--pooling", &pool_s, NULL, 0, "mean|last|cls", "the model's, else mean",
         "how a sequence's hidden states pool into one vector"},
        MODEL_ARG_OPTS(a),
        {.help = "Every --ids sequence is embedded in one step; prints a line a sequence:\n"
                 "'embedding I dim D: v0 v1 ...' (L2-normalized). The model's pooling is its\n"
                 "sentence-transformers one (1_Pooling)."}};
    int rc = cli_parse(argc, argv, opts);
    if (rc) {
        free(ids_s);
        return rc;
    }
    int pooling = ENGINE_POOL_MODEL;
    if (pool_s && (pooling = engine_pooling_parse(pool_s)) < 0) {
        fprintf(stderr, "lmhost embed: --pooling must be mean, last or cls (got '%s')\n", pool_s);
        free(ids_s);
        return 2;
    }
    if (!n_seqs) {
        fprintf(stderr, "lmhost embed: --ids is required (one a sequence)\n");
        free(ids_s);
        return 2;
    }
    int32_t **toks = calloc((size_t)n_seqs, sizeof *toks);
    int32_t *lens = calloc((size_t)n_seqs, sizeof *lens);
    if (!toks || !lens) {
        fprintf(stderr, "lmhost: out of memory\n");
        rc = 1;
    }
    for (int i = 0; rc == 0 && i < n_seqs; i++)
        if (cli_ids("--ids", ids_s[i], &toks[i], &lens[i])) rc = 2;
    registry reg = {0};
    engine *e = rc ? NULL : cli_open_engine(&a, &reg);
    if (!rc && !e) rc = 1;
    if (e) {
        const char *why;
        if (pooling == ENGINE_POOL_MODEL && engine_embed_pooling(e, &why) < 0) {
            fprintf(stderr, "lmhost embed: %s (give --pooling to embed anyway)\n", why);
            rc = 1;
        }
        const int32_t dim = engine_embed_dim(e);
        float *out = dim > 0 ? malloc((size_t)n_seqs * (size_t)dim * sizeof *out) : NULL;
        char err[1024];
        if (!rc && dim > 0 && !out) {
            fprintf(stderr, "lmhost: out of memory\n");
            rc = 1;
        } else if (!rc && engine_embed(e, (const int32_t *const *)toks, lens, n_seqs, pooling, out,
                                       err, sizeof err) != 0) {
            fprintf(stderr, "lmhost embed: %s\n", err);
            rc = 1;
        }
        for (int i = 0; !rc && i < n_seqs; i++) {
            printf("embedding %d dim %d:", i, dim);
            for (int32_t j = 0; j < dim; j++) printf(" %.9g", out[(size_t)i * (size_t)dim + j]);
            printf("\n");
        }
        free(out);
        engine_close(e);
    }
    registry_free(&reg);
    for (int i = 0; toks && i < n_seqs; i++) free(toks[i]);
    free(toks);
    free(lens);
    free(ids_s);
    return rc;
}
