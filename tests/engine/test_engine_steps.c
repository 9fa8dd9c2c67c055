/* The engine's pipelined greedy steps (engine_step_start / engine_step_finish) against plain
 * engine_step on a real fixture model: the same picks for one sequence and for a step of two,
 * a speculative step taken back with engine_seq_trim, and the misuse the engine refuses.
 *
 * usage: test_engine_steps MODEL_DIR BACKEND
 * On the CPU backend the picks are read at start (no download_start); on Vulkan they stay on
 * the device and the copy waits only for the step that made them. Exit 0 pass, 1 fail. */
#include "engine.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { PROMPT = 7, STEPS = 12 };

static int g_fail, g_checks;

static void expect(int ok, const char *what, const char *err) {
    g_checks++;
    if (!ok) {
        fprintf(stderr, "FAIL %s%s%s\n", what, err && *err ? ": " : "", err ? err : "");
        g_fail++;
    }
}

/* Prefills `seq` with prompt p and returns the greedy pick after it (-1 on error). */
static int32_t prefill(engine *e, uint64_t seq, int p, char *err, size_t len) {
    engine_row rows[PROMPT];
    for (int i = 0; i < PROMPT; i++) rows[i] = (engine_row){seq, (int32_t)(3 + 11 * i + 5 * p)};
    int32_t last = PROMPT - 1, id = -1;
    if (engine_seq_add(e, seq) || engine_step(e, rows, PROMPT, &last, 1, NULL, &id, err, len))
        return -1;
    return id;
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: test_engine_steps MODEL_DIR BACKEND\n");
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
    int32_t outs[2] = {0, 1};

    /* the reference: two sequences decoded one plain step at a time, each on its own */
    int32_t ref[2][STEPS + 1];
    for (int s = 0; s < 2; s++) {
        ref[s][0] = prefill(e, 10 + s, s, err, sizeof err);
        expect(ref[s][0] >= 0, "reference prefill", err);
        for (int i = 0; i < STEPS && ref[s][0] >= 0; i++) {
            engine_row r = {10 + s, ref[s][i]};
            expect(!engine_step(e, &r, 1, outs, 1, NULL, &ref[s][i + 1], err, sizeof err),
                   "reference step", err);
        }
    }

    /* one sequence: each step started on the last one's picks before those are read */
    int32_t got[STEPS + 1], id = -1;
    got[0] = prefill(e, 20, 0, err, sizeof err);
    engine_row r = {20, got[0]};
    int ok = got[0] >= 0 && !engine_step_start(e, &r, 1, outs, 1, 0, err, sizeof err);
    for (int i = 1; ok && i <= STEPS; i++) {
        if (i < STEPS) ok = !engine_step_start(e, &r, 1, outs, 1, 1, err, sizeof err);
        ok = ok && engine_step_finish(e, &got[i], 1, err, sizeof err) == 1;
    }
    expect(ok, "pipelined steps", err);
    expect(ok && !memcmp(got, ref[0], sizeof got), "pipelined picks equal plain steps", NULL);
    expect(engine_seq_len(e, 20) == PROMPT + STEPS, "positions after the pipelined steps", NULL);

    /* a step started past the end (as at an EOS), finished and taken back: the sequence goes
     * on as if it had not run */
    r.token = 0; /* ignored: chained */
    ok = !engine_step_start(e, &(engine_row){20, got[STEPS]}, 1, outs, 1, 0, err, sizeof err) &&
         engine_step_finish(e, &id, 1, err, sizeof err) == 1;
    int32_t spec = id;
    ok = ok && !engine_seq_trim(e, 20, PROMPT + STEPS);
    engine_row again = {20, got[STEPS]};
    ok = ok && !engine_step(e, &again, 1, outs, 1, NULL, &id, err, sizeof err);
    expect(ok && id == spec, "a step taken back and run again gives the same pick", err);

    /* two sequences in one step, chained */
    int32_t two[2][STEPS + 1], pick[2];
    two[0][0] = prefill(e, 30, 0, err, sizeof err);
    two[1][0] = prefill(e, 31, 1, err, sizeof err);
    engine_row rows[2] = {{30, two[0][0]}, {31, two[1][0]}};
    ok = two[0][0] >= 0 && two[1][0] >= 0 &&
         !engine_step_start(e, rows, 2, outs, 2, 0, err, sizeof err);
    for (int i = 1; ok && i <= STEPS; i++) {
        if (i < STEPS) ok = !engine_step_start(e, rows, 2, outs, 2, 1, err, sizeof err);
        ok = ok && engine_step_finish(e, pick, 2, err, sizeof err) == 2;
        two[0][i] = pick[0];
        two[1][i] = pick[1];
    }
    expect(ok && !memcmp(two[0], ref[0], sizeof two[0]) && !memcmp(two[1], ref[1], sizeof two[1]),
           "two sequences a step, chained, equal their plain steps", err);

    /* misuse is refused and changes nothing */
    expect(engine_step_finish(e, &id, 1, err, sizeof err) < 0, "finish with nothing started", NULL);
    expect(engine_step_start(e, rows, 2, outs, 2, 1, err, sizeof err) != 0,
           "chain with nothing started", NULL);
    int32_t len = engine_seq_len(e, 30);
    ok = !engine_step_start(e, rows, 1, outs, 1, 0, err, sizeof err);
    expect(ok && engine_step_start(e, rows, 2, outs, 2, 1, err, sizeof err) != 0 &&
               engine_seq_len(e, 30) == len + 1 && engine_seq_len(e, 31) == len,
           "a chained step of 2 rows after a step of 1 pick", NULL);
    ok = ok && !engine_step_start(e, rows, 1, outs, 1, 1, err, sizeof err);
    expect(ok && engine_step_start(e, rows, 1, outs, 1, 1, err, sizeof err) != 0 &&
               strstr(err, "not finished"),
           "a third step started while two are outstanding", err);
    expect(engine_swap_backend(e, "cpu", err, sizeof err) != 0 && strstr(err, "not finished"),
           "no backend swap with steps outstanding", err);
    expect(engine_step_finish(e, NULL, 0, err, sizeof err) == 1 &&
               engine_step_finish(e, &id, 1, err, sizeof err) == 1 &&
               engine_step_finish(e, &id, 1, err, sizeof err) < 0,
           "outstanding steps finish in order, then none is left", err);

    /* closing with a step outstanding frees it */
    ok = !engine_step_start(e, rows, 1, outs, 1, 0, err, sizeof err);
    expect(ok, "a step left outstanding at close", err);
    engine_close(e);
    registry_free(&reg);
    printf("%d checks, %d failed\n", g_checks, g_fail);
    return g_fail ? 1 : 0;
}
