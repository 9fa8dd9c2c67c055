/* Batch invariance of decoding: NSEQ distinct prompts (3 to 11 tokens) each decoded greedily
 * alone (a step of its prompt, then a step of one row per token), then N of them together
 * (one step with all N prompts, 3 to 444 rows, then one step of N rows per token, each
 * sequence fed its own picks), for N in 1, 3, 16 and 64, in the exact and the fast precision
 * modes. Every sequence must pick the tokens it picks alone, and its logits must be:
 *   exact mode: the same bits (docs/backends.md: one reduction order whatever the batch);
 *   fast mode: within FAST_TOL of its largest |logit|.
 * The mode checked is the one the engine runs (engine_precision): Vulkan on a device
 * without matrix cores (lavapipe) runs exact when asked for fast, and says so.
 *
 * Vulkan's exact mode is not batch-invariant with its default paths (VK_EXACT_TOL below
 * names the three causes): there it is held to the same tokens and VK_EXACT_TOL, and a
 * third pass takes only the paths that are invariant (no norm inside the products, the
 * matrix-vector kernels for every product, the same workgroup for one row and several),
 * where it must give the same bits. That pass still takes decode attention per sequence
 * (N = 1) and as one dispatch for the batch (N >= 2 on CPU devices), the fused SwiGLU and
 * residual add, prefill attention over several sequences' prompts in one step.
 *
 * usage: test_batch_invariance MODEL_DIR BACKEND
 * Prints one line per (backend, precision, N). Exit 0 pass, 1 fail. */
#include "engine.h"
#include "../test_debug.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { NSEQ = 64, STEPS = 8, MAXP = 11 };

/* Vulkan's exact mode, default paths: |together - alone| relative to the sequence's largest
 * |logit|. Measured on lavapipe (the meson test's LMHOST_DEBUG, vk-fuse-products on): at
 * most 1.0e-6 on this test's qwen3-hd64 (N = 3: 4.3e-7, 16: 8.3e-7, 64: 1.0e-6), and 1.25e-6
 * from cause 3 alone on a random qwen3 of hidden size 1024; the bound leaves 10x. From N = 3
 * every sequence's bits differ, from three causes, each found by switching it off alone
 * (backends/vulkan):
 *  1. one-row RMSNorm inside the product (vk_fuse.c's put-off norm, fused.glsl's PRO 1: the
 *     product runs on x * w and scales its sums by 1/rms, gathering sum(x^2) in its own
 *     order) for one row, rms_norm.comp's separate norm for several: decode at N = 1
 *     against N >= 2, and the output head after the prompts (one row out against N). On
 *     GPUs by default; on lavapipe with vk-fuse-products, which every Vulkan meson test sets;
 *  2. products past the matrix-vector rows (vk_ops.c's matmul_dispatch: 4 rows on CPU
 *     devices, 16 on GPUs) as tiles (matmul.comp; on GPUs matmul_big.comp, k split over
 *     workgroups where tiles are few, then split_sum.comp), which sum over k in another
 *     order than the matrix-vector kernels: decode at N = 16 and 64, and the batched prompts
 *     against a prompt alone of up to 4 rows;
 *  3. the one-row product (matvec1, MATVEC1_WG = 128 threads) and the several-row ones
 *     (matvec and matvec8, MATVEC_WG = 64) split the inner dimension over their threads
 *     differently (thread l sums chunks l, l + WG, ...): they differ where it is more than 64
 *     chunks of 16 bytes (f32 inner size > 256, f16/bf16 > 512), so not on this model
 *     (inner sizes 64 to 256) but at N = 1 against N >= 2 on the hidden-1024 one. */
#define VK_EXACT_TOL 1e-5

/* The fast mode: the same as VK_EXACT_TOL, measured: 0 on the CPU (its fast mode changes
 * only products over MLX-quantized weights, and this model's are bf16), and on lavapipe, which
 * runs exact when asked for fast, the exact mode's figures above. Not measured on a GPU with
 * matrix cores, whose fast mode takes f16 operands for products of 128 rows or more: the
 * batched prompts of N = 64 (444 rows) would take them where a prompt alone does not, which
 * docs/backends.md bounds at 6e-2 against exact. */
#define FAST_TOL 1e-5

static int g_fail, g_checks;

static void expect(int ok, const char *what, const char *err) {
    g_checks++;
    if (!ok) {
        fprintf(stderr, "FAIL %s%s%s\n", what, err && *err ? ": " : "", err ? err : "");
        g_fail++;
    }
}

static int prompt_len(int s) {
    return 3 + (s * 5) % (MAXP - 2); /* 3..11, neighbours of different lengths */
}

static int32_t prompt_tok(int s, int i, int32_t vocab) {
    return (int32_t)((5 + 13 * i + 7 * s + 3 * s * s) % vocab);
}

/* Decodes n sequences, prompts first, first + 1, ... (mod NSEQ), as the engine's sequences
 * id0 + k, all in one step each: their prompts, then STEPS steps of a row each, fed its own
 * greedy pick. Writes sequence k's picks toks[k][0..STEPS] and the logits they came from,
 * lg[k][t][vocab]. */
static int decode(engine *e, uint64_t id0, int first, int n, int32_t (*toks)[STEPS + 1], float *lg,
                  char *err, size_t err_len) {
    int32_t vocab = engine_vocab(e);
    engine_row *rows = malloc(sizeof *rows * (size_t)n * MAXP);
    int32_t *outs = malloc(sizeof *outs * (size_t)n), *ids = malloc(sizeof *ids * (size_t)n);
    float *out = malloc(sizeof *out * (size_t)n * (size_t)vocab);
    int rc = 0;
    for (int k = 0; k < n && !rc; k++) rc = engine_seq_add(e, id0 + (uint64_t)k);
    if (rc) snprintf(err, err_len, "engine_seq_add: %d", rc);
    for (int t = 0; t <= STEPS && !rc; t++) {
        int32_t nr = 0;
        for (int k = 0; k < n; k++) {
            int s = (first + k) % NSEQ;
            if (t == 0)
                for (int i = 0; i < prompt_len(s); i++)
                    rows[nr++] = (engine_row){id0 + (uint64_t)k, prompt_tok(s, i, vocab)};
            else
                rows[nr++] = (engine_row){id0 + (uint64_t)k, toks[k][t - 1]};
            outs[k] = nr - 1;
        }
        rc = engine_step(e, rows, nr, outs, n, out, ids, err, err_len);
        for (int k = 0; k < n && !rc; k++) {
            toks[k][t] = ids[k];
            memcpy(lg + ((size_t)k * (STEPS + 1) + (size_t)t) * (size_t)vocab,
                   out + (size_t)k * (size_t)vocab, sizeof *out * (size_t)vocab);
        }
    }
    for (int k = 0; k < n; k++) engine_seq_remove(e, id0 + (uint64_t)k);
    free(rows);
    free(outs);
    free(ids);
    free(out);
    return rc;
}

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static const int batches[] = {1, 3, 16, 64};

/* Every batch size against each sequence alone, in precision mode `precision`; `invariant`:
 * Vulkan with only its batch-invariant paths (LMHOST_DEBUG, read when the backend opens). */
static void run_mode(const registry *reg, const char *dir, const char *backend, int precision,
                     int invariant) {
    const char *asked = precision == LMH_PRECISION_EXACT ? "exact" : "fast";
    char err[1024] = "", what[256];
    char *saved = test_debug_save();
    if (invariant) {
        test_debug_set("vk-fuse-products", "0"); /* cause 1 */
        test_debug_set("vk-matvec-rows", "512"); /* cause 2: above the 444 rows of prompts */
        test_debug_set("vk-matvec", "64x2");     /* cause 3: one workgroup for every row count */
    }
    engine_opts o = {.model_dir = dir,
                     .backend = backend,
                     .gpu_layers = -1,
                     .threads = 2,
                     .max_seq_len = MAXP + STEPS + 1,
                     .precision = precision};
    double t0 = now();
    engine *e = engine_open(reg, &o, err, sizeof err);
    test_debug_restore(saved);
    snprintf(what, sizeof what, "%s %s: engine_open", backend, asked);
    expect(e != NULL, what, err);
    if (!e) return;
    const char *runs = engine_precision(e);
    const int exact = !strcmp(runs, "exact");
    /* the bound on |together - alone| / max |logit|; 0: the same bits */
    const double tol = !exact                                   ? FAST_TOL
                       : strcmp(backend, "vulkan") || invariant ? 0
                                                                : VK_EXACT_TOL;
    char mode[96];
    snprintf(mode, sizeof mode, "%s %s%s%s%s%s", backend, asked,
             strcmp(runs, asked) ? " (runs " : "", strcmp(runs, asked) ? runs : "",
             strcmp(runs, asked) ? ")" : "", invariant ? " [invariant paths]" : "");
    int32_t vocab = engine_vocab(e);
    size_t per = (size_t)(STEPS + 1) * (size_t)vocab;
    int32_t(*alone_tok)[STEPS + 1] = malloc(sizeof *alone_tok * NSEQ);
    int32_t(*tok)[STEPS + 1] = malloc(sizeof *tok * NSEQ);
    float *alone = malloc(sizeof *alone * per * NSEQ), *lg = malloc(sizeof *lg * per * NSEQ);

    /* each sequence alone */
    for (int s = 0; s < NSEQ; s++) {
        snprintf(what, sizeof what, "%s: sequence %d alone", mode, s);
        expect(!decode(e, 1000 + (uint64_t)s, s, 1, alone_tok + s, alone + per * (size_t)s, err,
                       sizeof err),
               what, err);
    }
    /* the picks depend on the prompt: a batch of copies would not be much of a test */
    int distinct = 0;
    for (int s = 1; s < NSEQ; s++)
        distinct += memcmp(alone_tok[s], alone_tok[0], sizeof alone_tok[0]) != 0;
    snprintf(what, sizeof what,
             "%s: the prompts decode to different tokens (%d of %d differ "
             "from the first)",
             mode, distinct, NSEQ - 1);
    expect(distinct >= NSEQ / 2, what, NULL);

    /* N together: each N starts at another prompt, so each batch mixes other lengths, and
     * takes new engine ids */
    for (size_t b = 0; b < sizeof batches / sizeof *batches; b++) {
        int n = batches[b], first = (int)(7 * b) % NSEQ;
        snprintf(what, sizeof what, "%s n=%d: decode", mode, n);
        if (decode(e, 100000 * (uint64_t)(b + 1), first, n, tok, lg, err, sizeof err)) {
            expect(0, what, err);
            continue;
        }
        int tok_diff = 0, bits_diff = 0, first_t = -1;
        double maxd = 0, rel = 0;
        for (int k = 0; k < n; k++) {
            int s = (first + k) % NSEQ;
            /* logits compare up to the first pick that differs: past it the rows differ */
            int t_end = STEPS;
            for (int t = 0; t <= STEPS; t++)
                if (tok[k][t] != alone_tok[s][t]) {
                    if (!tok_diff++)
                        fprintf(stderr,
                                "%s n=%d: sequence %d (prompt %d) picks %d at step %d, "
                                "alone %d\n",
                                mode, n, k, s, tok[k][t], t, alone_tok[s][t]);
                    t_end = t;
                    break;
                }
            const float *a = alone + per * (size_t)s, *g = lg + per * (size_t)k;
            for (int t = 0; t <= t_end; t++)
                if (memcmp(a + (size_t)t * vocab, g + (size_t)t * vocab, sizeof *a * vocab)) {
                    bits_diff++;
                    first_t = first_t < 0 || t < first_t ? t : first_t;
                    break;
                }
            double d = 0, big = 0;
            for (size_t i = 0; i < (size_t)(t_end + 1) * (size_t)vocab; i++) {
                big = fmax(big, fabs(a[i]));
                d = isnan(g[i]) || isnan(a[i]) ? INFINITY : fmax(d, fabs((double)a[i] - g[i]));
            }
            maxd = fmax(maxd, d);
            rel = fmax(rel, big > 0 ? d / big : d);
        }
        char how[160] = "bit-identical";
        if (bits_diff)
            snprintf(how, sizeof how,
                     "%d of %d sequences' bits differ, from %s; %.3g of the largest logit",
                     bits_diff, n, first_t ? "a decode step" : "the prompt", rel);
        printf("%s n=%d: tokens %s, logits max|d| %.3g (%s)\n", mode, n,
               tok_diff ? "DIFFER" : "same", maxd, how);
        fflush(stdout);
        snprintf(what, sizeof what,
                 "%s n=%d: every sequence picks the tokens it picks alone "
                 "(%d differ)",
                 mode, n, tok_diff);
        expect(!tok_diff, what, NULL);
        if (tol == 0)
            snprintf(what, sizeof what, "%s n=%d: the same logits' bits as alone (%d differ)", mode,
                     n, bits_diff);
        else
            snprintf(what, sizeof what, "%s n=%d: logits within %g of the largest as alone (%.3g)",
                     mode, n, tol, rel);
        expect(tol == 0 ? !bits_diff : rel <= tol, what, NULL);
    }
    free(alone_tok);
    free(tok);
    free(alone);
    free(lg);
    engine_close(e);
    printf("%s: %.1f s\n", mode, now() - t0);
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: test_batch_invariance MODEL_DIR BACKEND\n");
        return 2;
    }
    registry reg = {0};
    if (registry_load(&reg, NULL)) {
        fprintf(stderr, "FAIL registry_load\n");
        return 1;
    }
    run_mode(&reg, argv[1], argv[2], LMH_PRECISION_EXACT, 0);
    run_mode(&reg, argv[1], argv[2], LMH_PRECISION_FAST, 0);
    if (!strcmp(argv[2], "vulkan")) run_mode(&reg, argv[1], argv[2], LMH_PRECISION_EXACT, 1);
    registry_free(&reg);
    printf("%s (%s): %d checks, %d failed\n", argv[1], argv[2], g_checks, g_fail);
    return g_fail ? 1 : 0;
}
