/* Snapshots of a sequence (engine_seq_snapshot / engine_seq_restore) on a fixture model:
 * prefill, snapshot at position p, decode k greedy tokens, restore, decode again: the same
 * tokens. Then: a trim back, which recurrent state cannot take, leaves the sequence refused
 * until a restore mends it; a snapshot with keys and values restored into a new sequence;
 * and, with MOVE_TO, that snapshot restored after the model moved to another backend.
 *
 * usage: test_snapshot MODEL_DIR BACKEND [MOVE_TO|- [CACHE]]     Exit 0 pass, 1 fail. */
#include "engine.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { PROMPT = 21, STEPS = 8 };

static int g_fail, g_checks;

static void expect(int ok, const char *what, const char *err) {
    g_checks++;
    if (!ok) {
        fprintf(stderr, "FAIL %s%s%s\n", what, err && *err ? ": " : "", err ? err : "");
        g_fail++;
    }
}

/* Feeds `n` tokens to seq in steps of `chunk` rows; the greedy pick after the last. */
static int32_t feed(engine *e, uint64_t seq, const int32_t *tok, int n, int chunk, char *err,
                    size_t len) {
    engine_row rows[64];
    int32_t id = -1;
    for (int i = 0; i < n; i += chunk) {
        int m = n - i < chunk ? n - i : chunk;
        for (int j = 0; j < m; j++) rows[j] = (engine_row){seq, tok[i + j]};
        int32_t last = m - 1;
        if (engine_step(e, rows, m, &last, 1, NULL, &id, err, len)) return -1;
    }
    return id;
}

/* k greedy steps from `first` into out[0..k) (out[i]: the pick after step i). */
static int decode(engine *e, uint64_t seq, int32_t first, int k, int32_t *out, char *err,
                  size_t len) {
    int32_t tok = first, o = 0;
    for (int i = 0; i < k; i++) {
        engine_row r = {seq, tok};
        if (engine_step(e, &r, 1, &o, 1, NULL, &tok, err, len)) return -1;
        out[i] = tok;
    }
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 3 || argc > 5) {
        fprintf(stderr, "usage: test_snapshot MODEL_DIR BACKEND [MOVE_TO|- [CACHE]]\n");
        return 2;
    }
    const char *move_to = argc > 3 && strcmp(argv[3], "-") ? argv[3] : NULL;
    registry reg = {0};
    char err[1024] = "";
    engine_opts o = {.model_dir = argv[1],
                     .backend = argv[2],
                     .cache = argc > 4 ? argv[4] : NULL,
                     .gpu_layers = -1,
                     .threads = 2};
    engine *e = registry_load(&reg, NULL) ? NULL : engine_open(&reg, &o, err, sizeof err);
    if (!e) {
        fprintf(stderr, "FAIL engine_open: %s\n", err);
        return 1;
    }
    const int32_t V = engine_vocab(e);
    int recurrent = 0;
    for (int32_t l = 0; l < engine_n_layers(e); l++)
        recurrent |= engine_layer_recurrent(e, l)->n_bufs > 0;
    int32_t prompt[PROMPT], a[STEPS], b[STEPS], c[STEPS];
    for (int i = 0; i < PROMPT; i++) prompt[i] = (int32_t)((7 + 37 * i) % V);

    /* A sliding window's ring drops what falls out of the window: a snapshot without keys
     * and values cannot take it back past that, so such models roll back with a full one. */
    int windowed = 0, has_kv = 0;
    for (int32_t l = 0; l < engine_n_layers(e); l++) {
        windowed |= engine_layer_state(e, l)->window > 0;
        has_kv |= engine_layer_state(e, l)->kind == LMH_STATE_KV;
    }

    /* prefill in chunks of 4, snapshot at p (with and without keys and values), decode k */
    expect(!engine_seq_add(e, 1), "add", NULL);
    int32_t first = feed(e, 1, prompt, PROMPT, 4, err, sizeof err);
    expect(first >= 0, "prefill", err);
    engine_snapshot *sn = engine_seq_snapshot(e, 1, 0, err, sizeof err);
    expect(sn && engine_snapshot_len(sn) == PROMPT, "snapshot at the prompt's end", err);
    expect(!recurrent || (sn && engine_snapshot_bytes(sn) > 0), "a snapshot holds the state", NULL);
    engine_snapshot *full = engine_seq_snapshot(e, 1, 1, err, sizeof err);
    expect(full && engine_snapshot_len(full) == PROMPT &&
               (!has_kv || engine_snapshot_bytes(full) > engine_snapshot_bytes(sn)),
           "a snapshot with keys and values", err);
    expect(!decode(e, 1, first, STEPS, a, err, sizeof err), "decode", err);

    /* restore and decode again: the same tokens */
    engine_snapshot *back = sn;
    if (windowed) {
        expect(sn && engine_seq_restore(e, 1, sn, err, sizeof err) != 0 &&
                   strstr(err, "sliding window"),
               "a window that moved past the snapshot refuses it", err);
        back = full;
    }
    expect(back && !engine_seq_restore(e, 1, back, err, sizeof err), "restore", err);
    expect(engine_seq_len(e, 1) == PROMPT, "length after restore", NULL);
    expect(!decode(e, 1, first, STEPS, b, err, sizeof err) && !memcmp(a, b, sizeof a),
           "the same tokens after a restore", err);

    /* the same prompt token by token in another sequence: the same tokens */
    expect(!engine_seq_add(e, 2), "add", NULL);
    int32_t first2 = feed(e, 2, prompt, PROMPT, 1, err, sizeof err);
    expect(first2 == first && !decode(e, 2, first2, STEPS, c, err, sizeof err) &&
               !memcmp(a, c, sizeof a),
           "token by token decodes the same", err);

    /* a trim back: refused for recurrent state, which is unusable until a restore */
    int trc = engine_seq_trim(e, 1, PROMPT + 2);
    expect(recurrent ? trc == LMH_EUNSUPPORTED : trc == 0 || (windowed && trc == LMH_EUNSUPPORTED),
           "trim back answers as documented", NULL);
    if (recurrent) {
        engine_row r = {1, a[1]};
        int32_t out0 = 0, id;
        char serr[512] = "";
        expect(engine_step(e, &r, 1, &out0, 1, NULL, &id, serr, sizeof serr) != 0 &&
                   strstr(serr, "cache"),
               "a step after a trim back is refused", serr);
    }
    expect(back && !engine_seq_restore(e, 1, back, err, sizeof err), "restore after a trim", err);
    expect(!decode(e, 1, first, STEPS, b, err, sizeof err) && !memcmp(a, b, sizeof a),
           "the same tokens after a trim and a restore", err);

    /* a snapshot without keys and values cannot go to a sequence that lacks them; one with
     * them can */
    expect(!engine_seq_add(e, 3), "add", NULL);
    if (has_kv)
        expect(sn && engine_seq_restore(e, 3, sn, err, sizeof err) != 0 &&
                   strstr(err, "without its keys and values"),
               "a snapshot without keys and values into an empty sequence is refused", err);
    expect(full && !engine_seq_restore(e, 3, full, err, sizeof err),
           "restore into another sequence", err);
    expect(engine_seq_len(e, 3) == PROMPT, "its length", NULL);
    expect(!decode(e, 3, first, STEPS, c, err, sizeof err) && !memcmp(a, c, sizeof a),
           "another sequence decodes the same from the snapshot", err);

    /* the model moved to another backend (no sequence alive), the snapshot restored there */
    if (move_to && full) {
        for (uint64_t s = 1; s <= 3; s++) engine_seq_remove(e, s);
        expect(!engine_swap_backend(e, move_to, err, sizeof err), "move to the other backend", err);
        expect(!engine_seq_add(e, 4), "add after the move", NULL);
        expect(!engine_seq_restore(e, 4, full, err, sizeof err), "restore after the move", err);
        expect(!decode(e, 4, first, STEPS, c, err, sizeof err) && !memcmp(a, c, sizeof a),
               "the same tokens after the move", err);
    }
    engine_snapshot_free(sn);
    engine_snapshot_free(full);
    engine_close(e);
    registry_free(&reg);
    printf("%s (%s%s%s): %d checks, %d failed\n", argv[1], argv[2], argc > 4 ? ", cache " : "",
           argc > 4 ? argv[4] : "", g_checks, g_fail);
    return g_fail ? 1 : 0;
}
