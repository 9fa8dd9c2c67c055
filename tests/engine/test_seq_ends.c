/* lmh_batch.seq_ends (ABI 1.10) through the engine, on the phi3 fixture, whose LongRoPE
 * takes the long factors for rows of a sequence longer than 32 positions
 * (LMH_OP_ROPE_SWITCH): a sequence's logits do not depend on what else is in the step.
 *   - a 40-token prompt (long) and a 20-token one (short) in one step give, bit for bit,
 *     what each gives alone;
 *   - two sequences decoding together, one crossing the threshold (its rows turn long at
 *     position 32) and one past it, give what each gives decoding alone;
 *   - a prompt fed in chunks of 7 after engine_seq_prompt gives what one step over it gives
 *     (the prompt's end, not the chunk's, decides); without it, the first chunks differ;
 *   - engine_seq_trim forgets the prompt's end; engine_seq_prompt refuses bad arguments.
 * The CPU backend (exact mode: the same bits for a row in any batch).
 * usage: test_seq_ends PHI3_MODEL_DIR. Exit 0 pass, 1 fail. */
#include "engine.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { LONG_N = 40, SHORT_N = 20, CROSS_N = 30, DECODE = 5, CHUNK = 7, THR = 32 };

static int g_fail, g_checks;
static int32_t g_vocab;

static void expect(int ok, const char *what, const char *err) {
    g_checks++;
    if (!ok) {
        fprintf(stderr, "FAIL %s%s%s\n", what, err && *err ? ": " : "", err ? err : "");
        g_fail++;
    }
}

static int32_t tok(int i) {
    return (int32_t)((7 + 37 * i) % 500) + 3;
}

/* Feeds tokens [from, from + n) of tok() to seq in steps of `chunk` rows; every row's logits
 * into lg (n x vocab). 0 on success. */
static int feed(engine *e, uint64_t seq, int from, int n, int chunk, float *lg, char *err,
                size_t len) {
    engine_row rows[LONG_N];
    int32_t outs[LONG_N];
    for (int at = 0; at < n; at += chunk) {
        int m = n - at < chunk ? n - at : chunk;
        for (int i = 0; i < m; i++) {
            rows[i] = (engine_row){seq, tok(from + at + i)};
            outs[i] = i;
        }
        if (engine_step(e, rows, m, outs, m, lg + (size_t)at * (size_t)g_vocab, NULL, err, len))
            return -1;
    }
    return 0;
}

static int same(const float *a, const float *b, int rows) {
    return !memcmp(a, b, (size_t)rows * (size_t)g_vocab * sizeof *a);
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: test_seq_ends PHI3_MODEL_DIR\n");
        return 2;
    }
    registry reg = {0};
    char err[1024] = "";
    engine_opts o = {.model_dir = argv[1], .backend = "cpu", .gpu_layers = -1, .threads = 2};
    engine *e = registry_load(&reg, NULL) ? NULL : engine_open(&reg, &o, err, sizeof err);
    if (!e) {
        fprintf(stderr, "FAIL engine_open: %s\n", err);
        return 1;
    }
    g_vocab = engine_vocab(e);
    const size_t V = (size_t)g_vocab;
    float *la = malloc(LONG_N * V * sizeof *la), *lb = malloc(SHORT_N * V * sizeof *lb),
          *lt = malloc((LONG_N + SHORT_N) * V * sizeof *lt), *lc = malloc(LONG_N * V * sizeof *lc);

    /* alone: a long prompt, a short one (tokens 5.. so that the two differ) */
    expect(!engine_seq_add(e, 1) && !feed(e, 1, 0, LONG_N, LONG_N, la, err, sizeof err),
           "long prompt alone", err);
    expect(!engine_seq_add(e, 2) && !feed(e, 2, 5, SHORT_N, SHORT_N, lb, err, sizeof err),
           "short prompt alone", err);

    /* together in one step */
    engine_row rows[LONG_N + SHORT_N];
    int32_t outs[LONG_N + SHORT_N];
    for (int i = 0; i < LONG_N; i++) rows[i] = (engine_row){3, tok(i)};
    for (int i = 0; i < SHORT_N; i++) rows[LONG_N + i] = (engine_row){4, tok(5 + i)};
    for (int i = 0; i < LONG_N + SHORT_N; i++) outs[i] = i;
    int ok =
        !engine_seq_add(e, 3) && !engine_seq_add(e, 4) &&
        !engine_step(e, rows, LONG_N + SHORT_N, outs, LONG_N + SHORT_N, lt, NULL, err, sizeof err);
    expect(ok, "the two prompts in one step", err);
    expect(ok && same(lt, la, LONG_N), "the long prompt's logits beside the short one", NULL);
    expect(ok && same(lt + LONG_N * V, lb, SHORT_N), "the short prompt's logits beside the long",
           NULL);

    /* a chunked prompt: the prompt's end decides for every chunk */
    ok = !engine_seq_add(e, 5) && !engine_seq_prompt(e, 5, LONG_N) &&
         !feed(e, 5, 0, LONG_N, CHUNK, lc, err, sizeof err);
    expect(ok, "a prompt in chunks after engine_seq_prompt", err);
    expect(ok && same(lc, la, LONG_N), "chunks after engine_seq_prompt give the one step's logits",
           NULL);
    /* without it the chunks up to position 32 are short-rotated: their logits differ */
    ok = !engine_seq_add(e, 6) && !feed(e, 6, 0, LONG_N, CHUNK, lc, err, sizeof err);
    expect(ok, "a prompt in chunks", err);
    expect(ok && !same(lc, la, CHUNK), "the first chunk alone is short-rotated", NULL);

    /* a trim forgets the prompt's end: the first chunk again, now short-rotated */
    float *l7 = malloc(CHUNK * V * sizeof *l7), *l7b = malloc(CHUNK * V * sizeof *l7b);
    ok = !engine_seq_add(e, 7) && !engine_seq_prompt(e, 7, LONG_N) &&
         !feed(e, 7, 0, CHUNK, CHUNK, l7, err, sizeof err) && same(l7, la, CHUNK) &&
         !engine_seq_trim(e, 7, 0) && !feed(e, 7, 0, CHUNK, CHUNK, l7b, err, sizeof err);
    expect(ok && same(l7b, lc, CHUNK), "a trim forgets the prompt's end", err);
    expect(engine_seq_prompt(e, 99, 3) == LMH_EINVAL, "engine_seq_prompt: an unknown sequence",
           NULL);
    expect(engine_seq_prompt(e, 7, -1) == LMH_EINVAL, "engine_seq_prompt: n < 0", NULL);
    free(l7);
    free(l7b);

    /* decode: seq 8 (30 positions) crosses 32 while seq 9 (40) decodes beside it; 10 and 11
     * the same alone */
    float *ld = malloc(2 * V * sizeof *ld), *lx = malloc(V * sizeof *lx),
          *lp = malloc(LONG_N * V * sizeof *lp);
    ok = !engine_seq_add(e, 8) && !engine_seq_add(e, 9) && !engine_seq_add(e, 10) &&
         !engine_seq_add(e, 11) && !feed(e, 8, 5, CROSS_N, CROSS_N, lp, err, sizeof err) &&
         !feed(e, 9, 0, LONG_N, LONG_N, lp, err, sizeof err) &&
         !feed(e, 10, 5, CROSS_N, CROSS_N, lp, err, sizeof err) &&
         !feed(e, 11, 0, LONG_N, LONG_N, lp, err, sizeof err);
    expect(ok, "decode prompts", err);
    for (int s = 0; ok && s < DECODE; s++) {
        engine_row d[2] = {{8, tok(100 + s)}, {9, tok(200 + s)}};
        int32_t o2[2] = {0, 1};
        ok = !engine_step(e, d, 2, o2, 2, ld, NULL, err, sizeof err) &&
             !feed(e, 10, 100 + s, 1, 1, lx, err, sizeof err);
        char what[96];
        snprintf(what, sizeof what, "decode step %d (position %d) beside a long sequence", s,
                 CROSS_N + s);
        expect(ok && same(ld, lx, 1), what, err);
        ok = ok && !feed(e, 11, 200 + s, 1, 1, lx, err, sizeof err);
        snprintf(what, sizeof what, "decode step %d of the long sequence beside one crossing", s);
        expect(ok && same(ld + V, lx, 1), what, err);
    }
    free(ld);
    free(lx);
    free(lp);
    free(la);
    free(lb);
    free(lt);
    free(lc);
    engine_close(e);
    registry_free(&reg);
    printf("%d checks, %d failed\n", g_checks, g_fail);
    return g_fail ? 1 : 0;
}
