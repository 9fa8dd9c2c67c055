/* engine_opts.progress: engine_open reports the weight bytes it has loaded, from 0, rising,
 * never above the total (the checkpoint's bytes), and ends with done == total; a load that
 * fails after it began ends with ENGINE_LOAD_FAILED; one that fails before (no model
 * directory) makes no call.
 * usage: test_load_progress MODEL_DIR */
#include "engine.h"

#include <stdio.h>
#include <string.h>

static int failures;
#define CHECK(c)                                                                                   \
    do {                                                                                           \
        if (!(c)) {                                                                                \
            fprintf(stderr, "%s:%d: FAIL: %s\n", __FILE__, __LINE__, #c);                          \
            failures++;                                                                            \
        }                                                                                          \
    } while (0)

typedef struct calls {
    int n, rising;
    uint64_t first, last, total, max_done;
} calls;

static void record(void *ctx, uint64_t done, uint64_t total) {
    calls *c = ctx;
    if (c->n == 0) {
        c->first = done;
        c->total = total;
        c->rising = 1;
    }
    if (done != ENGINE_LOAD_FAILED) {
        if (c->n && done < c->last) c->rising = 0;
        if (done > c->max_done) c->max_done = done;
    }
    if (total != c->total) c->rising = 0;
    c->last = done;
    c->n++;
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: test_load_progress MODEL_DIR\n");
        return 2;
    }
    registry reg = {0};
    char err[1024] = "";
    if (registry_load(&reg, NULL)) return 1;

    calls c = {0};
    engine_opts o = {.model_dir = argv[1],
                     .gpu_layers = -1,
                     .threads = 2,
                     .progress = record,
                     .progress_ctx = &c};
    engine *e = engine_open(&reg, &o, err, sizeof err);
    CHECK(e != NULL);
    if (!e) fprintf(stderr, "engine_open: %s\n", err);
    CHECK(c.n >= 3); /* the start, the weights, the end */
    CHECK(c.first == 0);
    CHECK(c.total > 0 && c.rising);
    CHECK(c.last == c.total && c.max_done == c.total);
    printf("load: %d calls, %llu bytes\n", c.n, (unsigned long long)c.total);
    engine_close(e);

    /* a load that fails after it began: the backend is unknown */
    c = (calls){0};
    o.backend = "no-such-backend";
    e = engine_open(&reg, &o, err, sizeof err);
    CHECK(e == NULL);
    CHECK(c.n >= 2 && c.first == 0 && c.last == ENGINE_LOAD_FAILED);

    /* one that fails before: nothing to report */
    c = (calls){0};
    o.backend = NULL;
    o.model_dir = "/nonexistent/model";
    e = engine_open(&reg, &o, err, sizeof err);
    CHECK(e == NULL && c.n == 0);

    registry_free(&reg);
    if (failures) return 1;
    printf("load progress: all checks passed\n");
    return 0;
}
