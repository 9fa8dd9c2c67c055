/* lmhost bench: prefill and decode speed, peak memory, weight bytes read per decoded
 * token, and decode against the machine's measured memory read bandwidth (the limit for
 * a matrix-vector-bound decode step). */
#include "cli.h"
#include "engine.h"
#include "log.h"
#include "sampler.h"
#include "spec.h"

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ---- memory bandwidth: every thread sums its slice of a buffer much larger than the
 * caches, with 32-byte vector loads and independent accumulators ---------------------- */

typedef uint64_t v4u __attribute__((vector_size(32)));

typedef struct bw_arg {
    const v4u *p;
    size_t n;
    uint64_t sink;
    pthread_barrier_t *start;
} bw_arg;

static void *bw_reader(void *arg) {
    bw_arg *a = arg;
    pthread_barrier_wait(a->start);
    v4u s0 = {0}, s1 = {0}, s2 = {0}, s3 = {0};
    for (size_t i = 0; i + 4 <= a->n; i += 4) {
        s0 += a->p[i];
        s1 += a->p[i + 1];
        s2 += a->p[i + 2];
        s3 += a->p[i + 3];
    }
    v4u s = s0 + s1 + s2 + s3;
    a->sink = s[0] + s[1] + s[2] + s[3];
    return NULL;
}

/* Best of `reps` passes over `bytes`, in GB/s (1e9 bytes). */
static double measure_read_bw(int threads, size_t bytes, int reps) {
    v4u *buf = aligned_alloc(64, bytes);
    if (!buf) return 0;
    memset(buf, 1, bytes); /* fault every page in before timing */
    size_t n = bytes / sizeof(v4u), per = n / (size_t)threads;
    double best = 0;
    for (int r = 0; r < reps; r++) {
        pthread_t th[256];
        bw_arg args[256];
        pthread_barrier_t start;
        pthread_barrier_init(&start, NULL, (unsigned)threads + 1);
        for (int t = 0; t < threads; t++) {
            args[t] = (bw_arg){.p = buf + per * (size_t)t, .n = per, .start = &start};
            pthread_create(&th[t], NULL, bw_reader, &args[t]);
        }
        pthread_barrier_wait(&start);
        double t0 = now();
        for (int t = 0; t < threads; t++) pthread_join(th[t], NULL);
        double dt = now() - t0;
        pthread_barrier_destroy(&start);
        double gbs = (double)(per * (size_t)threads * sizeof(v4u)) / dt / 1e9;
        if (gbs > best) best = gbs;
    }
    free(buf);
    return best;
}

/* Host time to pick a token from the last decode step's logits with common settings:
 * between two decode steps it is time the device waits. */
static void sampling_times(const float *lg, int32_t V) {
    static const struct {
        const char *name;
        float temperature, top_p;
        int32_t top_k;
    } cfg[] = {{"greedy", 0, 1, 0},
               {"temperature 0.8", 0.8f, 1, 0},
               {"top-k 40", 0.8f, 1, 40},
               {"top-p 0.95", 0.8f, 0.95f, 0}};
    float *tmp = malloc((size_t)V * sizeof *tmp);
    if (!tmp) return;
    printf("sampling a token from %d logits (host, best of 20):", V);
    for (size_t c = 0; c < sizeof cfg / sizeof cfg[0]; c++) {
        sampler_params sp = sampler_defaults();
        sp.temperature = cfg[c].temperature;
        sp.top_p = cfg[c].top_p;
        sp.top_k = cfg[c].top_k;
        sampler *smp = sampler_new(&sp, V, NULL, 0);
        if (!smp) {
            printf("%s %s: out of memory", c ? "," : "", cfg[c].name);
            continue;
        }
        double best = 1e9;
        for (int r = 0; r < 20; r++) {
            memcpy(tmp, lg, (size_t)V * sizeof *tmp);
            double t0 = now();
            sampler_sample(smp, tmp, NULL, 0);
            double dt = now() - t0;
            if (dt < best) best = dt;
        }
        sampler_free(smp);
        printf("%s %s %.3f ms", c ? "," : "", cfg[c].name, best * 1e3);
    }
    printf("\n");
    free(tmp);
}

/* Step g's picks (next) against expect[g], counted into *differ, and row 0's into record[g],
 * where those are given. */
static void note_picks(int64_t g, int32_t nb, const int32_t *next, const int32_t *expect,
                       int32_t *record, int32_t *differ) {
    if (record) record[g] = next[0];
    for (int32_t i = 0; expect && i < nb; i++) *differ += next[i] != expect[g];
}

/* n greedy decode steps of nb sequences (row i: sequence seq0 + i), the first reading
 * next[i]; next ends with the last step's picks. Each step brings back its picks alone and,
 * with overlap, is enqueued before the picks of the one before are read (its tokens are
 * those picks, on the device). Each step's picks go to note_picks. Returns 0, or 1 with the
 * error printed. */
static int decode_steps(engine *e, uint64_t seq0, int32_t nb, int64_t n, int overlap, int32_t *next,
                        const int32_t *expect, int32_t *record, int32_t *differ) {
    engine_row *rows = malloc((size_t)nb * sizeof *rows);
    int32_t *outs = malloc((size_t)nb * sizeof *outs);
    char err[512] = "out of memory";
    int rc = 1;
    if (!rows || !outs) goto out;
    for (int32_t i = 0; i < nb; i++) outs[i] = i;
    for (int64_t g = 0; g < n; g++) {
        for (int32_t i = 0; i < nb; i++)
            rows[i] = (engine_row){.seq = seq0 + (uint64_t)i, .token = next[i]};
        if (overlap ? engine_step_start(e, rows, nb, outs, nb, g > 0, err, sizeof err) ||
                          (g > 0 && engine_step_finish(e, next, nb, err, sizeof err) != nb)
                    : engine_step(e, rows, nb, outs, nb, NULL, next, err, sizeof err))
            goto out;
        /* next holds this step's picks, or (overlapped) the step before's */
        if (!overlap || g > 0) note_picks(overlap ? g - 1 : g, nb, next, expect, record, differ);
    }
    if (overlap && n > 0) {
        if (engine_step_finish(e, next, nb, err, sizeof err) != nb) goto out;
        note_picks(n - 1, nb, next, expect, record, differ);
    }
    rc = 0;
out:
    if (rc) fprintf(stderr, "lmhost: %s\n", err);
    free(rows);
    free(outs);
    return rc;
}

/* --batch N: N more sequences, each prefilled with the same prompt, decoded together a row
 * each a step, as the server batches concurrent requests: the time a step takes (the first
 * step left out: a backend may build its kernels for these shapes at first use) and the
 * tokens/s the sequences make together. Each sequence's greedy tokens are compared with those
 * of the sequence decoded alone (toks[g]: the token step g reads): the kernels sum a row the
 * same way whatever the batch, so they are the same unless something is wrong. */
static int bench_batch(engine *e, int32_t nb, const int32_t *ids, int32_t n_prompt, int32_t chunk,
                       int32_t n_gen, int overlap, const int32_t *toks, float *lg, sampler *smp) {
    int32_t *next = malloc((size_t)nb * sizeof *next);
    int32_t added = 0, rc = 1, differ = 0;
    const uint64_t seq0 = 1000; /* apart from the single sequence (1) */
    if (!next) goto out;
    double tp = now();
    for (; added < nb; added++) {
        if (engine_seq_add(e, seq0 + (uint64_t)added) != 0) {
            fprintf(stderr, "lmhost: bench --batch: cannot add sequence %d\n", added + 1);
            goto out;
        }
        if (cli_prefill(e, seq0 + (uint64_t)added, ids, n_prompt, chunk, NULL, lg)) goto out;
        next[added] = sampler_sample(smp, lg, NULL, 0);
        differ += next[added] != toks[0];
    }
    tp = now() - tp;
    printf("prefill of the %d sequences, one after another: %lld tokens in %.3f s = %.1f "
           "tokens/s\n",
           nb, (long long)nb * n_prompt, tp, (double)nb * n_prompt / tp);
    if (decode_steps(e, seq0, nb, 1, overlap, next, toks + 1, NULL, &differ)) goto out;
    double t = now();
    if (decode_steps(e, seq0, nb, n_gen - 1, overlap, next, toks + 2, NULL, &differ)) goto out;
    t = now() - t;
    if (n_gen > 1)
        printf("decode, %d sequences together: %d steps in %.3f s = %.1f tokens/s (%.2f ms a "
               "step); greedy tokens as decoded alone: %s\n",
               nb, n_gen - 1, t, (double)nb * (n_gen - 1) / t, 1e3 * t / (n_gen - 1),
               differ ? "NO" : "yes");
    else
        printf("decode, %d sequences together: 1 step, not timed; greedy tokens as decoded "
               "alone: %s\n",
               nb, differ ? "NO" : "yes");
    if (differ)
        fprintf(stderr,
                "lmhost: bench --batch: %d of %lld picks differ from the sequence decoded "
                "alone\n",
                differ, (long long)nb * (n_gen + 1));
    rc = 0;
out:
    for (int32_t i = 0; i < added; i++) engine_seq_remove(e, seq0 + (uint64_t)i);
    free(next);
    return rc;
}

/* Decode against the bandwidth of the memory it reads (bps, bytes/s): its weights alone
 * (per_tok bytes a token), and, where the cache plugin counts them (kv_tok >= 0), with the
 * stored keys and values each step's attention reads, which at long contexts are a large
 * share of a step's bytes. */
static void print_bounds(double bps, double per_tok, double kv_tok, double dec_tps) {
    double limit = bps / per_tok;
    printf("decode bound by bandwidth (weight reads): %.2f tokens/s; measured decode is %.0f%% "
           "of it\n",
           limit, 100.0 * dec_tps / limit);
    if (kv_tok < 0) return;
    limit = bps / (per_tok + kv_tok);
    printf("decode bound by bandwidth (weight and cache reads): %.2f tokens/s; measured decode "
           "is %.0f%% of it\n",
           limit, 100.0 * dec_tps / limit);
}

/* n bytes as GiB, MiB, KiB or bytes, whichever reads best. */
static void fmt_bytes(char *buf, size_t len, double n) {
    if (n >= 1073741824.0)
        snprintf(buf, len, "%.2f GiB", n / 1073741824.0);
    else if (n >= 1048576.0)
        snprintf(buf, len, "%.2f MiB", n / 1048576.0);
    else if (n >= 1024.0)
        snprintf(buf, len, "%.2f KiB", n / 1024.0);
    else
        snprintf(buf, len, "%.0f bytes", n);
}

/* What a token costs in the cache (row_bytes, ABI 1.8), summed over every layer whichever
 * backend's cache holds it, and what a sequence takes at 32K positions and at the bench's
 * context; a sliding-window layer keeps about its window, so it counts at most that. */
static void cache_token_bytes(engine *e, const char *spec, int64_t ctx) {
    uint64_t kt = 0, vt = 0;
    double at_32k = 0, at_ctx = 0;
    int windows = 0;
    for (int32_t l = 0; l < engine_n_layers(e); l++) {
        uint64_t k = 0, v = 0;
        if (engine_layer_row_bytes(e, l, &k, &v) != 0) {
            printf("cache %s: bytes per token not reported (cache plugin %s has no row_bytes, "
                   "plugin ABI 1.8)\n",
                   spec, engine_cache_plugin(e));
            return;
        }
        const lmh_layer_state *st = engine_layer_state(e, l);
        int32_t w = st->kind == LMH_STATE_KV ? st->window : 0;
        windows |= w > 0 && k + v > 0;
        kt += k;
        vt += v;
        at_32k += (double)(k + v) * (double)(w > 0 && w < 32768 ? w : 32768);
        at_ctx += (double)(k + v) * (double)(w > 0 && w < ctx ? w : ctx);
    }
    char a[32], b[32];
    fmt_bytes(a, sizeof a, at_32k);
    fmt_bytes(b, sizeof b, at_ctx);
    printf("cache %s: %llu bytes/token (K %llu, V %llu); %s at 32768 tokens, %s at %lld "
           "tokens%s\n",
           spec, (unsigned long long)(kt + vt), (unsigned long long)kt, (unsigned long long)vt, a,
           b, (long long)ctx, windows ? " (sliding-window layers count at most their window)" : "");
}

static void keep_token(int32_t tok, int32_t i, void *user) {
    ((int32_t *)user)[i] = tok;
}

/* The prompt again in a sequence of its own, decoded greedily with proposals (spec.h): its
 * tokens/s against the plain decode's (t_plain for the same n_gen steps), the acceptance,
 * and whether it picked the plain decode's tokens (toks[0..n_gen]). */
static int bench_spec(engine *e, spec *sp, const int32_t *ids, int32_t n_prompt, int32_t chunk,
                      int32_t n_gen, const int32_t *toks, float *lg, sampler *smp, double t_plain) {
    const uint64_t seq = (uint64_t)1 << 40; /* apart from --batch's */
    char err[512];
    int32_t *hist = malloc(((size_t)n_prompt + (size_t)n_gen + 1) * sizeof *hist);
    int32_t *got = malloc(((size_t)n_gen + 1) * sizeof *got);
    int rc = 1;
    if (!hist || !got || engine_seq_add(e, seq) != 0 ||
        cli_prefill(e, seq, ids, n_prompt, chunk, NULL, lg))
        goto out;
    /* a first pass, untimed, builds the pipelines of the steps' shapes (checked steps have
     * other row counts than decode's, and a draft model has kernels of its own) */
    memcpy(hist, ids, (size_t)n_prompt * sizeof *hist);
    int32_t nh = n_prompt, steps = 0;
    if (spec_decode(sp, e, seq, smp, lg, hist, &nh, n_gen < 32 ? n_gen + 1 : 33, NULL, 0,
                    keep_token, got, &steps, err, sizeof err)) {
        fprintf(stderr, "lmhost: %s\n", err);
        goto out;
    }
    spec_seq_end(sp, seq);
    engine_seq_remove(e, seq);
    if (engine_seq_add(e, seq) != 0 || cli_prefill(e, seq, ids, n_prompt, chunk, NULL, lg))
        goto out;
    spec_stats st0, st;
    spec_get_stats(sp, &st0);
    nh = n_prompt;
    double t0 = now();
    if (spec_decode(sp, e, seq, smp, lg, hist, &nh, n_gen + 1, NULL, 0, keep_token, got, &steps,
                    err, sizeof err)) {
        fprintf(stderr, "lmhost: %s\n", err);
        goto out;
    }
    double t = now() - t0;
    spec_get_stats(sp, &st);
    st.steps -= st0.steps;
    st.drafted -= st0.drafted;
    st.accepted -= st0.accepted;
    int32_t same = 0;
    while (same <= n_gen && got[same] == toks[same]) same++;
    printf("speculative decode (%s, up to %d a step): %d tokens in %d target steps, %.3f s = "
           "%.2f tokens/s (%.2fx the plain decode's %.2f)\n",
           spec_get_kind(sp) == SPEC_NGRAM ? "prompt lookup" : "draft model", spec_draft_max(sp),
           n_gen, steps, t, (double)n_gen / t, t_plain / t, (double)n_gen / t_plain);
    printf("speculative acceptance: %llu of %llu proposed (%.1f%%), %.2f tokens a step with "
           "proposals; tokens as the plain decode's: %s\n",
           (unsigned long long)st.accepted, (unsigned long long)st.drafted,
           st.drafted ? 100.0 * (double)st.accepted / (double)st.drafted : 0.0,
           st.steps ? (double)(st.steps + st.accepted) / (double)st.steps : 0.0,
           same > n_gen ? "all" : "NOT ALL");
    rc = same > n_gen ? 0 : 1;
    if (rc)
        fprintf(stderr, "lmhost: speculative decode differs from the plain one at token %d\n",
                same);
out:
    engine_seq_remove(e, seq);
    free(hist);
    free(got);
    return rc;
}

/* The rate (bytes/s read, kind 0; FLOP/s, kind 1) of backends holding shares of the
 * weights and running one after the other: the total over the sum of each share's time. */
static int split_rate(engine *e, const engine_stats *s, int kind, double *rate) {
    double total = 0, time = 0;
    for (int i = 0; i < s->n_backends; i++) {
        double w = (double)(s->backend[i].weights + s->backend[i].mapped), r = 0;
        if (w <= 0) continue;
        char what[128];
        int rc = kind ? engine_backend_compute_peak(e, i, &r, what, sizeof what)
                      : engine_backend_read_bandwidth(e, i, &r);
        if (rc) return rc;
        if (!(r > 0)) return LMH_EINVAL;
        total += w;
        time += w / r;
    }
    if (!(time > 0)) return LMH_EINVAL;
    *rate = total / time;
    return 0;
}

int cli_bench(int argc, char **argv) {
    model_args a = {0};
    spec_args sa = {0};
    const char *prompt_s = NULL, *gen_s = NULL, *chunk_s = NULL, *batch_s = NULL;
    int no_bw = 0, no_peak = 0, no_overlap = 0, varied = 0;
    cli_opt opts[] = {
        {"--model", &a.model, NULL, 0, "DIR", "required", HELP_MODEL},
        {"--prompt", &prompt_s, NULL, 0, "N", "128", "prompt tokens (pseudo-random ids)"},
        {"--gen", &gen_s, NULL, 0, "N", "32", "tokens decoded (greedy)"},
        MODEL_ARG_OPTS(a),
        {"--chunk", &chunk_s, NULL, 0, "N", "512", "prompt tokens a prefill step at most"},
        {"--batch", &batch_s, NULL, 0, "N", "off",
         "then N sequences of the same prompt decoded together, a row each a step"},
        {"--no-bandwidth", NULL, &no_bw, 0, NULL, "off", "skip the memory bandwidth probe"},
        {"--no-peak", NULL, &no_peak, 0, NULL, "off", "skip the compute peak probe"},
        {"--no-overlap", NULL, &no_overlap, 0, NULL, "off",
         "each decode step waits for its pick before the next one is enqueued"},
        {"--varied", NULL, &varied, 0, NULL, "off",
         "decode reads pseudo-random tokens, not its picks (a random model's picks repeat, "
         "so every step would route to the same experts)"},
        SPEC_ARG_OPTS(sa),
        {.help = "With --spec or --draft-model, the same prompt is then decoded with proposals "
                 "(greedy),\nagainst the plain decode."}};
    if (cli_parse(argc, argv, opts)) return 2;
    int64_t n_prompt = 128, n_gen = 32, chunk = 512, threads = 0, batch = 0;
    if (prompt_s && cli_int("--prompt", prompt_s, 1, 1 << 20, &n_prompt)) return 2;
    if (gen_s && cli_int("--gen", gen_s, 1, 1 << 20, &n_gen)) return 2;
    if (chunk_s && cli_int("--chunk", chunk_s, 1, 1 << 20, &chunk)) return 2;
    if (batch_s && cli_int("--batch", batch_s, 1, 4096, &batch)) return 2;
    if (a.threads && cli_int("--threads", a.threads, 1, 256, &threads)) return 2;
    registry reg = {0};
    double t_load = now();
    engine *e = cli_open_engine(&a, &reg);
    if (!e) {
        registry_free(&reg);
        return 1;
    }
    t_load = now() - t_load;
    spec *drafter = NULL;
    engine *draft = NULL;
    int orc = cli_open_spec(&sa, &a, &reg, e, (int32_t)chunk, &drafter, &draft);
    if (orc) {
        engine_close(e);
        registry_free(&reg);
        return orc;
    }
    int32_t V = engine_vocab(e);
    /* A fixed pseudo-random prompt: the same run to run, no tokenizer needed. */
    int32_t *ids = malloc((size_t)n_prompt * sizeof *ids);
    int32_t *toks = malloc((size_t)(n_gen + 1) * sizeof *toks); /* the sequence's tokens */
    float *lg = malloc((size_t)V * sizeof(float));
    uint64_t x = 42;
    for (int64_t i = 0; ids && i < n_prompt; i++) {
        x = x * 6364136223846793005ULL + 1442695040888963407ULL;
        ids[i] = (int32_t)((x >> 33) % (uint64_t)V);
    }
    int rc = 1;
    engine_stats s0, s1, s2;
    char err[512];
    sampler_params sp = sampler_defaults();
    sampler *smp = sampler_new(&sp, V, err, sizeof err);
    if (!ids || !toks || !lg || !smp || engine_seq_add(e, 1) != 0) goto out;

    engine_get_stats(e, &s0);
    double t0 = now();
    if (cli_prefill(e, 1, ids, (int32_t)n_prompt, (int32_t)chunk, NULL, lg)) goto out;
    double t_prefill = now() - t0;
    engine_get_stats(e, &s1);

    double t1 = now();
    /* greedy, as generate decodes it: each step brings back its pick alone and, where the
     * backend overlaps them, is enqueued before the pick of the one before it is read (its
     * tokens are those picks, on the device); the last step runs by itself and brings its
     * logits too (for the sampling times below) */
    int32_t next = sampler_sample(smp, lg, NULL, 0), out0 = 0;
    toks[0] = next; /* toks[g]: the token step g reads; toks[n_gen]: the last step's pick */
    no_overlap |= !engine_step_overlaps(e);
    for (int64_t g = 1; varied && g < n_gen; g++) { /* each step its own token, as text has */
        x = x * 6364136223846793005ULL + 1442695040888963407ULL;
        engine_row r = {.seq = 1, .token = (int32_t)((x >> 33) % (uint64_t)V)};
        if (engine_step(e, &r, 1, &out0, 1, NULL, &next, err, sizeof err)) {
            fprintf(stderr, "lmhost: %s\n", err);
            goto out;
        }
        toks[g] = next = r.token;
    }
    if (!varied && decode_steps(e, 1, 1, n_gen - 1, !no_overlap, &next, NULL, toks + 1, NULL))
        goto out;
    engine_row row = {.seq = 1, .token = next};
    if (engine_step(e, &row, 1, &out0, 1, lg, &next, err, sizeof err)) {
        fprintf(stderr, "lmhost: %s\n", err);
        goto out;
    }
    toks[n_gen] = next;
    double t_decode = now() - t1;
    engine_get_stats(e, &s2);
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);

    double per_tok = (double)(s2.weight_read_bytes - s1.weight_read_bytes) / (double)n_gen;
    double dec_tps = (double)n_gen / t_decode;
    printf("model: %s\n", a.model);
    printf("chain: %s\n", engine_chain(e));
    printf("load: %.2f s\n", t_load);
    printf("weights: %.1f MiB\n", (double)s2.weight_bytes / 1048576.0);
    printf("prefill: %lld tokens in %.3f s = %.1f tokens/s\n", (long long)n_prompt, t_prefill,
           (double)n_prompt / t_prefill);
    /* the work prefill's rate stands for: its matrix products (the head's only where a
     * chunk computes logits), not attention, whose work grows with the context */
    double pf_flops = (double)(s1.mm_flops - s0.mm_flops);
    printf("prefill matrix products: %.0f FLOP a token, %.4g TFLOP/s\n",
           pf_flops / (double)n_prompt, pf_flops / t_prefill * 1e-12);
    printf("decode: %lld tokens in %.3f s = %.2f tokens/s (%.2f ms/token)\n", (long long)n_gen,
           t_decode, dec_tps, 1e3 * t_decode / (double)n_gen);
    printf("weight bytes read per decoded token: %.1f MiB (%.1f%% of the %.1f MiB of weights; "
           "experts not routed to and unread table rows are skipped)\n",
           per_tok / 1048576.0, 100.0 * per_tok / (double)s2.weight_bytes,
           (double)s2.weight_bytes / 1048576.0);
    if (s2.experts.streamed) { /* decode's share of the expert reads and lookups */
        const engine_expert_stats *x1 = &s1.experts, *x2 = &s2.experts;
        uint64_t hit = x2->hits - x1->hits, miss = x2->misses - x1->misses,
                 rb = x2->read_bytes - x1->read_bytes;
        double busy = x2->read_busy_s - x1->read_busy_s;
        printf("experts streamed: %.1f MiB read from disk per decoded token, hit rate %.1f%% "
               "(%llu hits, %llu misses, %llu of them already being read), reads at %.1f MB/s "
               "while in flight, %.1f in flight on average (at most %u); %llu read ahead for a "
               "predicted routing, %llu of them used; %.1f of %.1f MiB resident, budget %.1f "
               "MiB a backend, experts %.1f MiB\n",
               (double)rb / (double)n_gen / 1048576.0,
               hit + miss ? 100.0 * (double)hit / (double)(hit + miss) : 0.0,
               (unsigned long long)hit, (unsigned long long)miss,
               (unsigned long long)(x2->prefetched - x1->prefetched),
               busy > 0 ? (double)rb / busy * 1e-6 : 0.0, x2->depth_mean, x2->depth_max,
               (unsigned long long)(x2->ahead - x1->ahead),
               (unsigned long long)(x2->ahead_used - x1->ahead_used),
               (double)x2->resident_bytes / 1048576.0, (double)x2->stack_bytes / 1048576.0,
               (double)x2->budget_bytes / 1048576.0, (double)x2->expert_bytes / 1048576.0);
    }
    /* the cache's reads a token, -1 where the cache plugin does not count them */
    double kv_tok = s2.cache_read_counted
                        ? (double)(s2.cache_read_bytes - s1.cache_read_bytes) / (double)n_gen
                        : -1;
    if (kv_tok >= 0) {
        printf("cache bytes read per decoded token: %.1f MiB (%.0f bytes: the stored keys and "
               "values its queries see%s)\n",
               kv_tok / 1048576.0, kv_tok, s2.state_seq_bytes ? ", and the recurrent state" : "");
    }
    printf("cache: %.1f MiB after %lld positions\n", (double)s2.cache_bytes / 1048576.0,
           (long long)(n_prompt + n_gen));
    cache_token_bytes(e, a.cache ? a.cache : engine_cache_format(e), n_prompt + n_gen);
    if (s2.state_seq_bytes) { /* recurrent layers: a fixed size, read and rewritten a step */
        int32_t n_rec = 0;
        for (int32_t l = 0; l < engine_n_layers(e); l++)
            n_rec += engine_layer_recurrent(e, l)->n_bufs > 0;
        printf("recurrent state per sequence: %.3f MiB in %d layers (the same at any length; "
               "read and rewritten by every step)\n",
               (double)s2.state_seq_bytes / 1048576.0, n_rec);
    }
    /* what chunked prefill saves: a prompt token against a decode step */
    printf("prefill against decode: a prompt token takes %.3g%% of a decode step's time\n",
           100.0 * (t_prefill / (double)n_prompt) / (t_decode / (double)n_gen));
    /* cache rows by layer kind: full-attention layers hold the whole sequence, sliding
     * ones about their window */
    for (int pass = 0; pass < 2; pass++) {
        int32_t n_layers = engine_n_layers(e), count = 0, rows_min = INT32_MAX, rows_max = 0;
        int32_t window = 0;
        for (int32_t l = 0; l < n_layers; l++) {
            const lmh_layer_state *st = engine_layer_state(e, l);
            if (st->kind != LMH_STATE_KV || (st->window > 0) != pass) continue;
            int32_t r = engine_layer_rows(e, 1, l);
            count++;
            window = st->window;
            if (r < rows_min) rows_min = r;
            if (r > rows_max) rows_max = r;
        }
        if (!count) continue;
        if (pass)
            printf("cache rows per sequence, sliding-window layers (window %d): %d..%d in %d "
                   "layers\n",
                   window, rows_min, rows_max, count);
        else
            printf("cache rows per sequence, full-attention layers: %d..%d in %d layers\n",
                   rows_min, rows_max, count);
    }
    for (int i = 0; i < s2.n_backends; i++) {
        char where[64] = ""; /* which device and layers, where the model is split */
        if (s2.n_backends > 1 && s2.backend[i].first_layer >= 0)
            snprintf(where, sizeof where, " (device %d, layers %d-%d)", s2.backend[i].device,
                     s2.backend[i].first_layer, s2.backend[i].last_layer);
        printf("backend %s%s memory: weights %.1f MiB (+%.1f MiB used in place from the file), "
               "cache and scratch %.1f MiB\n",
               s2.backend[i].name, where, (double)s2.backend[i].weights / 1048576.0,
               (double)s2.backend[i].mapped / 1048576.0, (double)s2.backend[i].other / 1048576.0);
    }
    printf("peak resident memory: %.1f MiB\n", (double)ru.ru_maxrss / 1024.0);
    sampling_times(lg, V);
    /* Decode's bound is the bandwidth of the memory its weights are read from: the host's
     * (measured here) on the CPU backend; a device's, measured by its backend, where all
     * weights are on other backends (GPUs'). Layers split over several devices run one
     * after the other, so their bound is each device's share of the bytes at its own
     * bandwidth, summed (split_rate); weights split between a device and the host get no
     * bound. */
    const char *elsewhere = NULL;
    int n_holding = 0, holder = -1, on_host = 0;
    for (int i = 0; i < s2.n_backends; i++)
        if (s2.backend[i].weights + s2.backend[i].mapped) {
            n_holding++;
            holder = i;
            if (strcmp(s2.backend[i].name, "cpu"))
                elsewhere = s2.backend[i].name;
            else
                on_host = 1;
        }
    if (!no_bw && elsewhere) {
        double bps = 0;
        int brc = on_host ? LMH_EINVAL : split_rate(e, &s2, 0, &bps);
        if (brc == 0 && bps > 0) {
            if (n_holding == 1)
                printf("device memory read bandwidth (backend %s): %.2f GB/s\n", elsewhere,
                       bps * 1e-9);
            else
                printf("device memory read bandwidth (backend %s, %d devices one after the other, "
                       "by their shares of the weights): %.2f GB/s\n",
                       elsewhere, n_holding, bps * 1e-9);
            print_bounds(bps, per_tok, kv_tok, dec_tps);
        } else {
            printf("memory read bandwidth: not measured (weights on backend %s%s)\n", elsewhere,
                   on_host                   ? " and the host"
                   : brc == LMH_EUNSUPPORTED ? ", which offers no probe"
                                             : ", whose probe failed");
        }
    }
    if (!no_bw && !elsewhere) {
        int bw_threads = threads > 0 ? (int)threads : (int)sysconf(_SC_NPROCESSORS_ONLN);
        if (bw_threads > 256) bw_threads = 256;
        double bw = measure_read_bw(bw_threads, (size_t)1 << 30, 5);
        printf("memory read bandwidth: %.2f GB/s (%d threads summing a 1 GiB buffer, best of 5)\n",
               bw, bw_threads);
        print_bounds(bw * 1e9, per_tok, kv_tok, dec_tps);
    }
    /* Prefill's bound is the multiply-add rate of the device that runs its products, which
     * its backend measures: the one holding all weights, or devices of one backend holding
     * shares of the layers, each its share of the products (taken as its share of the
     * weights) at its own rate. */
    if (!no_peak && (n_holding == 1 || (elsewhere && !on_host))) {
        double fps = 0;
        char what[128] = "";
        int prc = n_holding == 1 ? engine_backend_compute_peak(e, holder, &fps, what, sizeof what)
                                 : split_rate(e, &s2, 1, &fps);
        if (n_holding > 1 && !prc)
            snprintf(what, sizeof what, "%d devices one after the other, by their shares",
                     n_holding);
        if (prc == 0 && fps > 0 && pf_flops > 0) {
            double limit = fps / (pf_flops / (double)n_prompt);
            printf("compute peak (backend %s): %.4g TFLOP/s (%s)\n", s2.backend[holder].name,
                   fps * 1e-12, what[0] ? what : "multiply-adds");
            printf("prefill bound by compute (matrix products): %.1f tokens/s; measured prefill "
                   "is %.3g%% of it\n",
                   limit, 100.0 * pf_flops / t_prefill / fps);
        } else if (prc) {
            printf("compute peak: not measured (backend %s %s)\n", s2.backend[holder].name,
                   prc == LMH_EUNSUPPORTED ? "offers no probe" : "failed its probe");
        }
    }
    if (batch && bench_batch(e, (int32_t)batch, ids, (int32_t)n_prompt, (int32_t)chunk,
                             (int32_t)n_gen, !no_overlap, toks, lg, smp))
        goto out;
    if (drafter && bench_spec(e, drafter, ids, (int32_t)n_prompt, (int32_t)chunk, (int32_t)n_gen,
                              toks, lg, smp, t_decode))
        goto out;
    rc = 0;
out:
    spec_free(drafter);
    engine_close(draft);
    sampler_free(smp);
    free(ids);
    free(toks);
    free(lg);
    engine_close(e);
    registry_free(&reg);
    return rc;
}
