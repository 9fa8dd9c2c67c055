/* Conformance check of one fixture model through the lmhost CLI (the stable contract):
 *   logits   max |logit - reference| <= 1e-3 * max |reference| (f32 cache), argmax equal
 *            wherever top1_margin >= 1e-3; with the f16 cache only the argmax where
 *            top1_margin > 0.01; with the 8-bit quantized cache (q8: codes of 256 levels
 *            a group) max |logit - reference| <= 4e-2 * max |reference| and the argmax where
 *            top1_margin >= 2e-2 * max |reference|; tq3 and tq4 (TurboQuant) as f16: the
 *            fixtures' heads of 16 and 32 values keep f16 rows in that cache
 *   generate --max-tokens 12 (greedy) equals the reference continuation (f32 cache; the
 *            others may flip a near-tie, which is reported)
 *   --precision fast among the options: the fast mode's tolerance, measured on the MLX
 *            fixtures with the CPU's int8 activations (1.2e-2 to 5.1e-2 x max |logit|):
 *            max |logit - reference| <= 6e-2 * max |reference|, the argmax where
 *            top1_margin >= 6e-2 * max |reference|; greedy may flip a near-tie (reported)
 * usage: check_model LMHOST MODEL_DIR CACHE(f32|f16|q8|tq3|tq4)
 * SIMD(auto|portable|avx2|avx512|neon) [LMHOST OPTION...]   (e.g. --backend vulkan, --gpu-layers 2)
 * Exit 0 pass, 1 fail, 77 skip (this CPU cannot run the SIMD path). */
#include "npy.h"
#include "../test_debug.h"

#include <json-c/json.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int run(const char *cmd, char **out) {
    FILE *p = popen(cmd, "r");
    if (!p) return -1;
    size_t cap = 4096, len = 0;
    char *buf = malloc(cap);
    size_t n;
    while (buf && (n = fread(buf + len, 1, cap - len - 1, p)) > 0) {
        len += n;
        if (len + 1 == cap) buf = realloc(buf, cap *= 2);
    }
    if (buf) buf[len] = 0;
    int st = pclose(p);
    *out = buf;
    return st;
}

int main(int argc, char **argv) {
    if (argc < 5) {
        fprintf(stderr, "usage: check_model LMHOST MODEL_DIR f32|f16 SIMD [LMHOST OPTION...]\n");
        return 2;
    }
    char extra[1024] = "";
    for (int i = 5; i < argc; i++)
        snprintf(extra + strlen(extra), sizeof extra - strlen(extra), " '%s'", argv[i]);
    const char *lmhost = argv[1], *dir = argv[2], *cache = argv[3], *simd = argv[4];
#if defined(__x86_64__)
    if ((!strcmp(simd, "avx512") && !__builtin_cpu_supports("avx512f")) ||
        (!strcmp(simd, "avx2") && !__builtin_cpu_supports("avx2")) || !strcmp(simd, "neon")) {
        printf("SKIP: this CPU cannot run the %s path\n", simd);
        return 77;
    }
#endif
    if (strcmp(simd, "auto") != 0) test_debug_set("simd", simd);
    int f16 = !strcmp(cache, "f16") || !strcmp(cache, "tq3") || !strcmp(cache, "tq4");
    int q8 = !strcmp(cache, "q8");
    if (!f16 && !q8 && strcmp(cache, "f32") != 0) {
        fprintf(stderr, "check_model: cache %s is not f32, f16, q8, tq3 or tq4\n", cache);
        return 2;
    }
    int fast = 0;
    for (int i = 5; i + 1 < argc; i++)
        if (!strcmp(argv[i], "--precision") && !strcmp(argv[i + 1], "fast")) fast = 1;
    for (int i = 5; i < argc; i++)
        if (!strcmp(argv[i], "--precision=fast")) fast = 1;
    const double fast_tol = 6e-2;
    int lossy = f16 || q8 || fast;

    char path[4096];
    snprintf(path, sizeof path, "%s/reference.json", dir);
    json_object *ref = json_object_from_file(path);
    if (!ref) {
        fprintf(stderr, "FAIL: cannot read %s\n", path);
        return 1;
    }
    json_object *prompt = json_object_object_get(ref, "prompt"),
                *greedy = json_object_object_get(ref, "greedy"),
                *top1 = json_object_object_get(ref, "top1"),
                *margin = json_object_object_get(ref, "top1_margin");
    size_t np = json_object_array_length(prompt);
    char ids[8192] = "";
    for (size_t i = 0; i < np; i++)
        snprintf(ids + strlen(ids), sizeof ids - strlen(ids), "%s%d", i ? "," : "",
                 json_object_get_int(json_object_array_get_idx(prompt, i)));

    char tmp[] = "/tmp/lmhost-check-XXXXXX";
    int fd = mkstemp(tmp);
    if (fd < 0) return 1;
    close(fd);
    char cmd[16384];
    snprintf(cmd, sizeof cmd, "'%s' logits --model '%s' --tokens %s --out '%s' --cache %s%s",
             lmhost, dir, ids, tmp, cache, extra);
    char *out = NULL;
    int fails = 0;
    if (run(cmd, &out) != 0) {
        fprintf(stderr, "FAIL: %s\n", cmd);
        unlink(tmp);
        return 1;
    }
    free(out);
    float *got, *want;
    int64_t gr, gc, wr, wc;
    char err[512];
    snprintf(path, sizeof path, "%s/logits.npy", dir);
    if (npy_read_f32(tmp, &got, &gr, &gc, err, sizeof err) ||
        npy_read_f32(path, &want, &wr, &wc, err, sizeof err)) {
        fprintf(stderr, "FAIL: %s\n", err);
        unlink(tmp);
        return 1;
    }
    unlink(tmp);
    if (gr != wr || gc != wc) {
        fprintf(stderr, "FAIL: logits shape [%lld, %lld], reference [%lld, %lld]\n", (long long)gr,
                (long long)gc, (long long)wr, (long long)wc);
        return 1;
    }
    double maxref = 0, maxd = 0;
    for (int64_t i = 0; i < wr * wc; i++) {
        if (fabs(want[i]) > maxref) maxref = fabs(want[i]);
        double d = fabs((double)got[i] - want[i]);
        if (!(d <= maxd)) maxd = isnan(d) ? INFINITY : d;
    }
    int argmax_bad = 0, decided = 0;
    for (int64_t r = 0; r < wr; r++) {
        int64_t best = 0;
        for (int64_t c = 1; c < wc; c++)
            if (got[r * wc + c] > got[r * wc + best]) best = c;
        double m = json_object_get_double(json_object_array_get_idx(margin, (size_t)r));
        int t = json_object_get_int(json_object_array_get_idx(top1, (size_t)r));
        if (m >= (fast ? fast_tol * maxref : q8 ? 2e-2 * maxref : f16 ? 0.01 : 1e-3)) {
            decided++;
            if (best != t) {
                argmax_bad++;
                fprintf(stderr, "  position %lld: argmax %lld, reference %d (margin %.4g)\n",
                        (long long)r, (long long)best, t, m);
            }
        }
    }
    printf("logits (%s cache, %s%s): max |d| = %.3g, max |ref| = %.3g, ratio %.2e; argmax equal "
           "at %d/%d decided positions\n",
           cache, simd, extra, maxd, maxref, maxd / maxref, decided - argmax_bad, decided);
    if (!lossy && !(maxd <= 1e-3 * maxref)) {
        fprintf(stderr, "FAIL: logits differ by more than 1e-3 x max |logit|\n");
        fails++;
    }
    if (fast && !(maxd <= fast_tol * maxref)) {
        fprintf(stderr, "FAIL: logits differ by more than %g x max |logit| (fast mode)\n",
                fast_tol);
        fails++;
    }
    if (q8 && !(maxd <= 4e-2 * maxref)) {
        fprintf(stderr, "FAIL: logits differ by more than 4e-2 x max |logit| (q8 cache)\n");
        fails++;
    }
    if (argmax_bad) {
        fprintf(stderr, "FAIL: argmax differs at %d positions\n", argmax_bad);
        fails++;
    }
    free(got);
    free(want);

    snprintf(cmd, sizeof cmd, "'%s' generate --model '%s' --tokens %s --max-tokens 12 --cache %s%s",
             lmhost, dir, ids, cache, extra);
    if (run(cmd, &out) != 0) {
        fprintf(stderr, "FAIL: %s\n", cmd);
        return 1;
    }
    json_object *gen = json_tokener_parse(out);
    json_object *toks = gen ? json_object_object_get(gen, "tokens") : NULL;
    int same = toks && json_object_array_length(toks) == json_object_array_length(greedy);
    for (size_t i = 0; same && i < json_object_array_length(greedy); i++)
        same = json_object_get_int(json_object_array_get_idx(toks, i)) ==
               json_object_get_int(json_object_array_get_idx(greedy, i));
    printf("generate: %s", out);
    if (!same && !lossy) {
        fprintf(stderr, "FAIL: greedy continuation differs; reference %s\n",
                json_object_to_json_string(greedy));
        fails++;
    } else if (!same) {
        /* a lossy cache or fast operands may flip a near-tie; report, the argmax check
         * above decides */
        printf("note: %s-cache%s greedy differs from the f32 reference %s\n", cache,
               fast ? " (fast mode)" : "", json_object_to_json_string(greedy));
    }
    free(out);
    json_object_put(gen);
    json_object_put(ref);
    return fails ? 1 : 0;
}
