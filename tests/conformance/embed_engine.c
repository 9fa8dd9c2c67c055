/* engine_embed between another sequence's decode steps, as the server's scheduler runs it:
 * the decoding sequence's logits are the same bits as without the embeddings in between, the
 * embeddings the same as with nothing else alive, the temporary sequences gone after each
 * call (also past a caller's sequence at ENGINE_SEQ_TEMP, which keeps its state), and
 * misuse refused with the engine left as it was.
 *
 * usage: embed_engine MODEL_DIR BACKEND [GPU_LAYERS]   Exit 0 pass, 1 fail. */
#include "engine.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { PROMPT = 7, STEPS = 6, NSEQ = 3 };

static int g_fail, g_checks;

static void expect(int ok, const char *what, const char *err) {
    g_checks++;
    if (!ok) {
        fprintf(stderr, "FAIL %s%s%s\n", what, err && *err ? ": " : "", err ? err : "");
        g_fail++;
    }
}

static int32_t vocab;

static int32_t tok(int i) {
    return (int32_t)((3 + 11 * i) % vocab);
}

/* Prefills seq and decodes STEPS greedy tokens; lg[(STEPS + 1) * vocab] gets every step's
 * logits. Between steps, with emb, embeds the NSEQ sequences into emb[step] (pooling
 * alternating mean / last). */
static int decode(engine *e, uint64_t seq, float *lg, float *emb, int32_t dim, char *err,
                  size_t len) {
    static const int32_t s0[] = {5, 6, 7, 8, 9}, s1[] = {10}, s2[] = {11, 12, 13};
    const int32_t *seqs[NSEQ] = {s0, s1, s2}, ns[NSEQ] = {5, 1, 3};
    engine_row rows[PROMPT];
    for (int i = 0; i < PROMPT; i++) rows[i] = (engine_row){seq, tok(i)};
    int32_t last = PROMPT - 1, out0 = 0, id;
    if (engine_seq_add(e, seq) || engine_step(e, rows, PROMPT, &last, 1, lg, &id, err, len))
        return -1;
    for (int s = 0; s < STEPS; s++) {
        if (emb) {
            const int n = engine_seq_count(e);
            if (engine_embed(e, seqs, ns, NSEQ, s % 2 ? ENGINE_POOL_LAST : ENGINE_POOL_MEAN,
                             emb + (size_t)s * NSEQ * (size_t)dim, err, len))
                return -1;
            if (engine_seq_count(e) != n) return -1;
        }
        engine_row r = {seq, id};
        if (engine_step(e, &r, 1, &out0, 1, lg + (size_t)(s + 1) * (size_t)vocab, &id, err, len))
            return -1;
    }
    engine_seq_remove(e, seq);
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 3 || argc > 4) {
        fprintf(stderr, "usage: embed_engine MODEL_DIR BACKEND [GPU_LAYERS]\n");
        return 2;
    }
    registry reg = {0};
    char err[1024] = "";
    engine_opts o = {.model_dir = argv[1],
                     .backend = argv[2],
                     .gpu_layers = argc > 3 ? atoi(argv[3]) : -1,
                     .threads = 2};
    engine *e = registry_load(&reg, NULL) ? NULL : engine_open(&reg, &o, err, sizeof err);
    if (!e) {
        fprintf(stderr, "FAIL engine_open: %s\n", err);
        return 1;
    }
    vocab = engine_vocab(e);
    const int32_t dim = engine_embed_dim(e);
    const size_t lgn = (size_t)(STEPS + 1) * (size_t)vocab, en = (size_t)STEPS * NSEQ * dim;
    float *ref = malloc(lgn * sizeof *ref), *got = malloc(lgn * sizeof *got);
    float *alone = malloc(en * sizeof *alone), *between = malloc(en * sizeof *between);
    if (!ref || !got || !alone || !between || dim <= 0) {
        fprintf(stderr, "FAIL setup (embedding width %d)\n", dim);
        return 1;
    }
    const char *why = "";
    expect(engine_embed_pooling(e, &why) == ENGINE_POOL_MEAN && !why,
           "a directory without sentence-transformers files pools by the mean", why);
    for (int p = ENGINE_POOL_MEAN; p <= ENGINE_POOL_CLS; p++)
        expect(engine_pooling_parse(engine_pooling_name(p)) == p, "pooling names", NULL);
    expect(engine_pooling_parse("max") < 0 && !engine_pooling_name(0), "unknown poolings", NULL);

    /* the embeddings with nothing else alive, then a decode without and with them between */
    static const int32_t s0[] = {5, 6, 7, 8, 9}, s1[] = {10}, s2[] = {11, 12, 13};
    const int32_t *seqs[NSEQ] = {s0, s1, s2}, ns[NSEQ] = {5, 1, 3};
    for (int s = 0; s < STEPS; s++)
        expect(!engine_embed(e, seqs, ns, NSEQ, s % 2 ? ENGINE_POOL_LAST : ENGINE_POOL_MEAN,
                             alone + (size_t)s * NSEQ * dim, err, sizeof err),
               "embeddings alone", err);
    expect(engine_seq_count(e) == 0, "no sequence left behind", NULL);
    /* the product into the logits is not run: the same rows as a step with every logit
     * take exactly its multiply-adds fewer */
    engine_stats st0, st1, st2;
    engine_get_stats(e, &st0);
    expect(!engine_embed(e, seqs, ns, NSEQ, ENGINE_POOL_MEAN, alone, err, sizeof err), "embeddings",
           err);
    engine_get_stats(e, &st1);
    engine_row rs[9];
    int32_t outs[9];
    float *lg9 = malloc(9 * (size_t)vocab * sizeof *lg9);
    for (int q = 0, k = 0; q < NSEQ; q++) {
        expect(!engine_seq_add(e, 100 + (uint64_t)q), "a sequence", NULL);
        for (int t = 0; t < ns[q]; t++, k++) {
            rs[k] = (engine_row){100 + (uint64_t)q, seqs[q][t]};
            outs[k] = k;
        }
    }
    expect(lg9 && !engine_step(e, rs, 9, outs, 9, lg9, NULL, err, sizeof err), "the same rows",
           err);
    engine_get_stats(e, &st2);
    for (int q = 0; q < NSEQ; q++) engine_seq_remove(e, 100 + (uint64_t)q);
    free(lg9);
    expect((st2.mm_flops - st1.mm_flops) - (st1.mm_flops - st0.mm_flops) ==
               2ull * 9 * (uint64_t)vocab * (uint64_t)dim,
           "no product into the logits", NULL);
    for (size_t i = 0; i < NSEQ * (size_t)dim; i++) {
        float v = alone[i];
        if (!isfinite(v)) expect(0, "finite embeddings", NULL);
    }
    expect(!decode(e, 1, ref, NULL, dim, err, sizeof err), "decode alone", err);
    expect(!decode(e, 1, got, between, dim, err, sizeof err), "decode with embeddings between",
           err);
    expect(!memcmp(ref, got, lgn * sizeof *ref),
           "the decoding sequence's logits: the same bits with embeddings between its steps", NULL);
    expect(!memcmp(alone, between, en * sizeof *alone),
           "embeddings between decode steps: the same bits as with nothing else alive", NULL);

    /* a caller's sequence at the first temporary id: skipped, and left as it was */
    engine_row r[PROMPT];
    for (int i = 0; i < PROMPT; i++) r[i] = (engine_row){ENGINE_SEQ_TEMP, tok(i)};
    int32_t last = PROMPT - 1;
    expect(!engine_seq_add(e, ENGINE_SEQ_TEMP) &&
               !engine_step(e, r, PROMPT, &last, 1, got, NULL, err, sizeof err),
           "a caller's sequence at ENGINE_SEQ_TEMP", err);
    float *v = malloc((size_t)NSEQ * dim * sizeof *v);
    expect(v && !engine_embed(e, seqs, ns, NSEQ, ENGINE_POOL_MEAN, v, err, sizeof err) &&
               !memcmp(v, alone, (size_t)NSEQ * dim * sizeof *v),
           "embeddings beside a sequence at ENGINE_SEQ_TEMP", err);
    expect(engine_seq_len(e, ENGINE_SEQ_TEMP) == PROMPT && engine_seq_count(e) == 1,
           "the caller's sequence keeps its length", NULL);
    engine_row n1 = {ENGINE_SEQ_TEMP, 1};
    int32_t out0 = 0;
    expect(!engine_step(e, &n1, 1, &out0, 1, got, NULL, err, sizeof err),
           "the caller's sequence goes on", err);
    engine_seq_remove(e, ENGINE_SEQ_TEMP);

    /* misuse: refused, nothing left behind, the next call as before */
    const int32_t bad_tok[] = {vocab}, none[] = {0};
    const int32_t *bad_seqs[2] = {s0, bad_tok};
    int32_t bad_ns[2] = {5, 1};
    expect(engine_embed(e, bad_seqs, bad_ns, 2, ENGINE_POOL_MEAN, v, err, sizeof err) != 0 &&
               strstr(err, "out of range"),
           "a token past the vocabulary refused", err);
    bad_ns[1] = 0;
    bad_seqs[1] = none;
    expect(engine_embed(e, bad_seqs, bad_ns, 2, ENGINE_POOL_MEAN, v, err, sizeof err) != 0,
           "an empty sequence refused", NULL);
    expect(engine_embed(e, seqs, ns, 0, ENGINE_POOL_MEAN, v, err, sizeof err) != 0,
           "no sequences refused", NULL);
    expect(engine_embed(e, seqs, ns, NSEQ, 9, v, err, sizeof err) != 0, "pooling 9 refused", NULL);
    expect(engine_seq_count(e) == 0, "refusals leave no sequence behind", NULL);
    engine_row sr = {7, 1};
    expect(!engine_seq_add(e, 7) && !engine_step_start(e, &sr, 1, &out0, 1, 0, err, sizeof err),
           "a started step", err);
    expect(engine_embed(e, seqs, ns, NSEQ, ENGINE_POOL_MEAN, v, err, sizeof err) != 0 &&
               strstr(err, "started"),
           "embeddings refused while a step is started", err);
    int32_t id;
    expect(engine_step_finish(e, &id, 1, err, sizeof err) == 1, "the started step finishes", err);
    engine_seq_remove(e, 7);
    expect(v && !engine_embed(e, seqs, ns, NSEQ, ENGINE_POOL_MEAN, v, err, sizeof err) &&
               !memcmp(v, alone, (size_t)NSEQ * dim * sizeof *v),
           "embeddings after the refusals as before", err);

    printf("%s (%s): %d checks, %d failed\n", argv[1], engine_chain(e), g_checks, g_fail);
    free(v);
    free(ref);
    free(got);
    free(alone);
    free(between);
    engine_close(e);
    registry_free(&reg);
    return g_fail ? 1 : 0;
}
