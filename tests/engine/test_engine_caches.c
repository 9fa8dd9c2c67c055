/* Several caches in one engine (engine_cache_open): sequences in the default cache, f16, q8
 * and q4 decode one step together and give, each of them, the logits it gives decoding alone
 * in its cache; specs that name the same cache share it; bad specs are refused with a message
 * and leave the engine as it was; a snapshot does not cross caches; the stats count bytes per
 * cache; a cache nobody uses gives way when all are taken; a move to another backend keeps the
 * default cache and the others open again on demand.
 *
 * usage: test_engine_caches MODEL_DIR BACKEND   (heads of 32: the q8/q4 groups are 32 or 16)
 * Decoding together feeds every sequence the tokens it picked alone, so that the rows compare
 * at every step. On the CPU backend the logits must be the same bits (its kernels are batch-
 * invariant); elsewhere within 1e-5 of the largest. Exit 0 pass, 1 fail. */
#include "engine.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { PROMPT = 9, STEPS = 6, NC = 4 };

static int g_fail, g_checks;

static void expect(int ok, const char *what, const char *err) {
    g_checks++;
    if (!ok) {
        fprintf(stderr, "FAIL %s%s%s\n", what, err && *err ? ": " : "", err ? err : "");
        g_fail++;
    }
}

static const char *const specs[NC] = {NULL, "f16", "q8", "quant:q4,group=16"};

/* The logits of the prompt's last row and of STEPS decode steps, for each sequence in seqs
 * (n of them, all in one step; sequence s's prompt is the (s % 100)-th), feeding each the
 * tokens in toks (or, where they are < 0, its greedy picks, written there). */
static int run(engine *e, const uint64_t *seqs, int n, int32_t toks[][STEPS + 1], float *lg,
               char *err, size_t err_len) {
    int32_t vocab = engine_vocab(e);
    engine_row rows[NC * PROMPT];
    int32_t outs[NC];
    for (int k = 0; k < n; k++) {
        for (int i = 0; i < PROMPT; i++)
            rows[k * PROMPT + i] =
                (engine_row){seqs[k], (int32_t)(5 + 13 * i + 7 * (seqs[k] % 100))};
        outs[k] = k * PROMPT + PROMPT - 1;
    }
    for (int t = 0; t <= STEPS; t++) {
        int32_t nr = t ? n : n * PROMPT;
        if (t)
            for (int k = 0; k < n; k++) {
                rows[k] = (engine_row){seqs[k], toks[k][t - 1]};
                outs[k] = k;
            }
        float *out = lg + (size_t)t * NC * vocab;
        if (engine_step(e, rows, nr, outs, n, out, NULL, err, err_len)) return -1;
        for (int k = 0; k < n; k++)
            if (toks[k][t] < 0) {
                const float *l = out + (size_t)k * vocab;
                int32_t best = 0;
                for (int32_t v = 1; v < vocab; v++)
                    if (l[v] > l[best]) best = v;
                if (toks[k][t] < 0) toks[k][t] = best;
            }
    }
    return 0;
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: test_engine_caches MODEL_DIR BACKEND\n");
        return 2;
    }
    registry reg = {0};
    char err[1024] = "";
    engine_opts o = {.model_dir = argv[1], .backend = argv[2], .gpu_layers = -1, .threads = 2};
    engine *e = registry_load(&reg, NULL) ? NULL : engine_open(&reg, &o, err, sizeof err);
    if (!e) {
        fprintf(stderr, "FAIL engine_open: %s\n", err);
        return 1;
    }
    const int exact = strcmp(argv[2], "cpu") == 0;
    int32_t vocab = engine_vocab(e);
    engine_stats st;

    /* opening: an index each, the same one for the same cache however it is spelled */
    int ci[NC] = {0};
    for (int k = 1; k < NC; k++) {
        ci[k] = engine_cache_open(e, specs[k], err, sizeof err);
        expect(ci[k] > 0, specs[k], err);
    }
    expect(ci[1] != ci[2] && ci[2] != ci[3] && ci[1] != ci[3], "distinct caches", NULL);
    expect(engine_cache_open(e, "plain:f16", err, sizeof err) == ci[1], "plain:f16 is f16", err);
    expect(engine_cache_open(e, "quant", err, sizeof err) == ci[2], "quant is q8", err);
    expect(engine_cache_open(e, "plain", err, sizeof err) == 0, "plain is the default", err);
    engine_get_stats(e, &st);
    expect(st.n_caches == NC && !strcmp(st.cache[0].name, "f32") &&
               !strcmp(st.cache[1].name, "f16") && !strcmp(st.cache[2].name, "q8") &&
               !strcmp(st.cache[3].name, "q4,group=16") && !strcmp(st.cache[3].plugin, "quant"),
           "the stats name the open caches", st.cache[3].name);

    /* refusals: a message, nothing opened */
    static const struct {
        const char *spec, *says;
        int rc;
    } bad[] = {{"q5", "formats: f32, f16, q8, q4", LMH_EINVAL},
               {"f16,x=1", "format f16 takes no settings (got 'x=1')", LMH_EINVAL},
               {"q8,bits=4", "unknown setting 'bits=4'", LMH_EINVAL},
               {"q4,group=128", "group=128 does not divide", LMH_EINVAL},
               {"q4,group=48", "16, 32, 64 or 128", LMH_EINVAL},
               {"plain:q8", "has no format 'q8'", LMH_EINVAL}};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        err[0] = 0;
        int rc = engine_cache_open(e, bad[i].spec, err, sizeof err);
        char what[128];
        snprintf(what, sizeof what, "'%s' refused saying '%s'", bad[i].spec, bad[i].says);
        expect(rc == bad[i].rc && strstr(err, bad[i].says), what, err);
    }
    engine_get_stats(e, &st);
    expect(st.n_caches == NC, "refusals open nothing", NULL);

    /* each cache alone, then all four in one step */
    size_t per = (size_t)(STEPS + 1) * NC * (size_t)vocab;
    float *alone = calloc(per * NC, sizeof(float)), *together = calloc(per, sizeof(float));
    int32_t toks[NC][STEPS + 1];
    memset(toks, 0xff, sizeof toks);
    for (int k = 0; k < NC; k++) {
        uint64_t seq = 100 + (uint64_t)k;
        expect(!engine_seq_add_in(e, seq, ci[k]) && engine_seq_cache(e, seq) == ci[k], "add", NULL);
        expect(!run(e, &seq, 1, &toks[k], alone + per * k, err, sizeof err), "alone", err);
        engine_seq_remove(e, seq);
    }
    uint64_t seqs[NC];
    int32_t forced[NC][STEPS + 1];
    memcpy(forced, toks, sizeof forced);
    for (int k = 0; k < NC; k++) {
        seqs[k] = 200 + (uint64_t)k;
        expect(!engine_seq_add_in(e, seqs[k], ci[k]), "add", NULL);
    }
    expect(engine_seq_add_in(e, seqs[1], ci[2]) == LMH_EINVAL, "an id in use is refused", NULL);
    expect(engine_seq_add_in(e, 999, 7) == LMH_EINVAL, "a cache not open is refused", NULL);
    expect(!run(e, seqs, NC, forced, together, err, sizeof err), "together", err);
    double worst = 0;
    for (int k = 0; k < NC; k++) {
        double maxd = 0, maxv = 0;
        for (int t = 0; t <= STEPS; t++)
            for (int32_t v = 0; v < vocab; v++) {
                float a = alone[per * k + (size_t)t * NC * vocab + v];
                float b = together[(size_t)t * NC * vocab + (size_t)k * vocab + v];
                maxv = fmax(maxv, fabs(a));
                maxd = isnan(b) ? INFINITY : fmax(maxd, fabs((double)a - b));
            }
        char what[128];
        snprintf(what, sizeof what, "cache %s: together as alone (max |d| %.3g of %.3g)",
                 specs[k] ? specs[k] : "default", maxd, maxv);
        expect(exact ? maxd == 0 : maxd <= 1e-5 * maxv, what, NULL);
        worst = fmax(worst, maxd / maxv);
    }
    /* the formats differ: a wrong cache would not go unseen */
    int differ = 0;
    for (size_t i = 0; i < per && !differ; i++) differ = alone[i] != alone[per * 2 + i];
    expect(differ, "the q8 cache's logits differ from the f32 cache's", NULL);

    engine_get_stats(e, &st);
    uint64_t sum = 0;
    int each = 1;
    for (int k = 0; k < st.n_caches; k++) {
        sum += st.cache[k].bytes;
        each &= st.cache[k].bytes > 0 && st.cache[k].seqs == 1 && st.cache[k].index == ci[k];
    }
    expect(each && sum == st.cache_bytes, "bytes and sequences per cache", NULL);
    expect(st.cache[2].bytes < st.cache[1].bytes && st.cache[1].bytes < st.cache[0].bytes,
           "q8 holds less than f16, f16 less than f32", NULL);

    /* a snapshot restores only into its own cache */
    engine_snapshot *sn = engine_seq_snapshot(e, seqs[2], 1, err, sizeof err);
    expect(sn != NULL, "snapshot", err);
    expect(sn && engine_seq_restore(e, seqs[1], sn, err, sizeof err) != 0 &&
               strstr(err, "taken in cache q8; sequence 201 lives in cache f16"),
           "a snapshot of q8 into an f16 sequence is refused", err);
    expect(!engine_seq_add_in(e, 300, ci[2]) && sn &&
               !engine_seq_restore(e, 300, sn, err, sizeof err),
           "a snapshot of q8 into another q8 sequence", err);
    engine_snapshot_free(sn);
    engine_seq_remove(e, 300);

    /* every entry taken (heads of 64 offer enough settings): a cache nobody uses gives way
     * to a new one, a refused one takes nothing, and with all in use none opens */
    int hd = 0;
    for (int32_t l = 0; l < engine_n_layers(e) && !hd; l++)
        if (engine_layer_state(e, l)->kind == LMH_STATE_KV)
            hd = engine_layer_state(e, l)->head_dim_k;
    if (hd % 64 == 0) {
        static const char *const more[] = {"q8,group=16", "q8,group=32", "q4", "q4,group=32"};
        int at[4];
        for (int i = 0; i < 4; i++) {
            at[i] = engine_cache_open(e, more[i], err, sizeof err);
            expect(at[i] == NC + i, more[i], err);
        }
        engine_get_stats(e, &st);
        expect(st.n_caches == ENGINE_MAX_CACHES, "every entry taken", NULL);
        expect(!engine_seq_add_in(e, 400, at[0]), "a sequence in q8,group=16", NULL);
        expect(engine_cache_open(e, "q4,group=48", err, sizeof err) == LMH_EINVAL,
               "a refused spec with every entry taken", err);
        engine_get_stats(e, &st);
        expect(st.n_caches == ENGINE_MAX_CACHES && !strcmp(st.cache[5].name, "q8,group=32"),
               "a refused spec closes nothing", NULL);
        int g64 = engine_cache_open(e, "q8,group=64", err, sizeof err);
        engine_get_stats(e, &st);
        expect(g64 == at[1] && st.n_caches == ENGINE_MAX_CACHES &&
                   !strcmp(st.cache[g64].name, "q8,group=64"),
               "an idle cache gives way to a new one", err);
        for (int i = 1; i < 4; i++)
            expect(!engine_seq_add_in(e, 400 + (uint64_t)i, at[i]), "a sequence in each", NULL);
        expect(engine_cache_open(e, "q4,group=64", err, sizeof err) == LMH_ENOMEM &&
                   strstr(err, "all in use"),
               "none opens while all are in use", err);
        expect(engine_cache_open(e, "q4", err, sizeof err) == at[2], "an open one still opens",
               err);
        for (uint64_t i = 0; i < 4; i++) engine_seq_remove(e, 400 + i);
    }
    for (int k = 0; k < NC; k++) engine_seq_remove(e, seqs[k]);
    engine_get_stats(e, &st);
    expect(st.cache_bytes == 0 && engine_seq_count(e) == 0, "nothing held once all are gone", NULL);

    /* the model moved: the default cache moves, the others open again when asked for */
    expect(!engine_swap_backend(e, argv[2], err, sizeof err), "move", err);
    engine_get_stats(e, &st);
    expect(st.n_caches == 1 && st.cache[0].index == 0, "only the default cache after a move", NULL);
    int q8 = engine_cache_open(e, "q8", err, sizeof err);
    expect(q8 > 0, "q8 again", err);
    int32_t again[1][STEPS + 1];
    memset(again, 0xff, sizeof again);
    float *lg = calloc(per, sizeof(float));
    expect(!engine_seq_add_in(e, 502, q8) &&
               !run(e, &(uint64_t){502}, 1, again, lg, err, sizeof err),
           "decode in q8 after the move", err);
    int same = !memcmp(again[0], toks[2], sizeof again[0]);
    for (int t = 0; exact && t <= STEPS; t++)
        same &= !memcmp(lg + (size_t)t * NC * vocab, alone + per * 2 + (size_t)t * NC * vocab,
                        (size_t)vocab * sizeof(float));
    expect(same, "the same tokens (and, on the CPU, logits) as before the move", NULL);
    engine_seq_remove(e, 502);

    free(lg);
    free(alone);
    free(together);
    engine_close(e);
    registry_free(&reg);
    printf("%s (%s): worst |together - alone| %.2e of the largest logit; %d checks, %d failed\n",
           argv[1], argv[2], worst, g_checks, g_fail);
    return g_fail ? 1 : 0;
}
