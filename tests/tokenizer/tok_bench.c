/* Encode throughput of one tokenizer on a text file.
 * usage: tok_bench MODEL_DIR TEXT_FILE [REPEATS]
 * The file is encoded line by line (as a server sees prompts) and then whole; the first pass
 * runs with a cold piece cache. Prints MB/s and tokens/s. */
#include "tokenizer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s MODEL_DIR TEXT_FILE [REPEATS]\n", argv[0]);
        return 2;
    }
    int reps = argc > 3 ? atoi(argv[3]) : 3;
    char err[512];
    double t0 = now();
    tok_tokenizer *t = tok_load(argv[1], err, sizeof err);
    if (!t) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    printf("load: %.3f s\n", now() - t0);
    FILE *f = fopen(argv[2], "rb");
    if (!f) {
        perror(argv[2]);
        return 1;
    }
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *text = malloc((size_t)n + 1);
    if (!text || fread(text, 1, (size_t)n, f) != (size_t)n) return 1;
    fclose(f);
    for (int r = 0; r < reps; r++) {
        size_t tokens = 0;
        t0 = now();
        const char *p = text, *end = text + n;
        while (p < end) {
            const char *nl = memchr(p, '\n', (size_t)(end - p));
            size_t len = nl ? (size_t)(nl - p + 1) : (size_t)(end - p);
            int32_t *ids;
            size_t k;
            if (tok_encode(t, p, len, false, &ids, &k)) return 1;
            tokens += k;
            free(ids);
            p += len;
        }
        double dt = now() - t0;
        printf("pass %d (%s cache, by line): %.2f MB in %.3f s = %.1f MB/s, %zu tokens = %.2f M "
               "tokens/s\n",
               r + 1, r ? "warm" : "cold", n / 1e6, dt, n / 1e6 / dt, tokens, tokens / 1e6 / dt);
    }
    int32_t *ids;
    size_t k;
    t0 = now();
    if (tok_encode(t, text, (size_t)n, false, &ids, &k)) return 1;
    double dt = now() - t0;
    printf("whole file in one call: %.1f MB/s, %zu tokens = %.2f M tokens/s\n", n / 1e6 / dt, k,
           k / 1e6 / dt);
    free(ids);
    free(text);
    tok_free(t);
    return 0;
}
