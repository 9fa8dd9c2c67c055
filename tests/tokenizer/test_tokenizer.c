/* Checks one real tokenizer against its reference cases (tests/data/tokenizers/NAME.json,
 * produced by Hugging Face tokenizers/transformers): for every encode case the ids, the ids with
 * the tokenizer's own specials and the decoded text must match exactly, and a streaming decoder
 * fed the ids one by one must produce decode(ids) in whole characters. Then random id sequences
 * (heavy on byte tokens and multi-byte pieces) check streaming against batch decoding.
 *
 * usage: test_tokenizer NAME CASES.json
 * The tokenizers come from $LMHOST_TOKENIZERS/NAME (default ~/.cache/lmhost/tokenizers/NAME),
 * which tools/fetch_tokenizers.sh fills. */
#include "tok_test_util.h"

#include <pthread.h>

/* Several threads encode the same texts at once (sharing the piece cache and the context
 * pool) and must all get the reference ids. */
typedef struct {
    const tok_tokenizer *t;
    json_object *cases;
    int bad;
} thread_arg;

static void *encode_thread(void *p) {
    thread_arg *a = p;
    for (int rep = 0; rep < 20; rep++) {
        for (size_t ci = 0; ci < json_object_array_length(a->cases); ci++) {
            json_object *c = json_object_array_get_idx(a->cases, ci), *jt, *ji;
            if (!json_object_object_get_ex(c, "text", &jt) ||
                !json_object_object_get_ex(c, "ids", &ji))
                continue;
            int32_t *ids;
            size_t n;
            if (tok_encode(a->t, json_object_get_string(jt), (size_t)json_object_get_string_len(jt),
                           false, &ids, &n)) {
                a->bad++;
                continue;
            }
            size_t wn = json_object_array_length(ji);
            bool same = wn == n;
            for (size_t i = 0; same && i < n; i++)
                same = ids[i] == json_object_get_int(json_object_array_get_idx(ji, i));
            if (!same) a->bad++;
            free(ids);
        }
    }
    return NULL;
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: %s NAME CASES.json\n", argv[0]);
        return 2;
    }
    const char *name = argv[1];
    char dir[4096];
    tok_tokenizer *t = load_real(name, dir, sizeof dir);
    if (!t) return 1;
    size_t clen;
    char *cases_text = test_slurp(argv[2], &clen);
    json_object *cases = cases_text ? json_tokener_parse(cases_text) : NULL;
    free(cases_text);
    if (!cases || !json_object_is_type(cases, json_type_array)) {
        fprintf(stderr, "FAIL: cannot read the cases in %s\n", argv[2]);
        tok_free(t);
        return 1;
    }

    int n_cases = 0, n_ok = 0;
    unsigned flags = tok_cleanup_spaces_default(t) ? TOK_DECODE_CLEANUP_SPACES : 0;
    for (size_t ci = 0; ci < json_object_array_length(cases); ci++) {
        json_object *c = json_object_array_get_idx(cases, ci), *v;
        if (!json_object_object_get_ex(c, "kind", &v) ||
            strcmp(json_object_get_string(v), "encode") != 0)
            continue;
        n_cases++;
        int before = failures;
        json_object *jt, *ji, *jis, *jd;
        json_object_object_get_ex(c, "text", &jt);
        json_object_object_get_ex(c, "ids", &ji);
        json_object_object_get_ex(c, "ids_with_special", &jis);
        json_object_object_get_ex(c, "decoded", &jd);
        const char *text = json_object_get_string(jt);
        size_t tl = (size_t)json_object_get_string_len(jt);

        int32_t *ids, *ids2;
        size_t n, n2, dn;
        if (tok_encode(t, text, tl, false, &ids, &n) || tok_encode(t, text, tl, true, &ids2, &n2)) {
            fprintf(stderr, "FAIL: out of memory\n");
            return 1;
        }
        check_ids("ids", text, ji, ids, n);
        check_ids("ids_with_special", text, jis, ids2, n2);
        char *dec = tok_decode_ex(t, ids, n, flags, &dn);
        check_text("decoded", text, json_object_get_string(jd),
                   (size_t)json_object_get_string_len(jd), dec ? dec : "", dec ? dn : 0);
        check_stream(t, text, ids, n, false);
        check_stream(t, text, ids2, n2, true);
        free(dec);
        free(ids);
        free(ids2);
        if (failures == before) n_ok++;
    }

    /* random id sequences: byte tokens, specials and ordinary pieces in any order */
    size_t vocab = tok_vocab_size(t);
    int32_t bytes[256];
    size_t nb = 0;
    for (int b = 0; b < 256; b++) {
        char name_b[8];
        snprintf(name_b, sizeof name_b, "<0x%02X>", b);
        int32_t id = tok_piece_to_token(t, name_b, 6);
        if (id >= 0) bytes[nb++] = id;
    }
    int rand_fail = failures;
    for (int r = 0; r < 300 && failures - rand_fail < 5; r++) {
        int32_t seq[48];
        size_t len = 1 + rnd() % 48;
        for (size_t i = 0; i < len; i++) {
            uint32_t k = rnd() % 4;
            seq[i] = (k == 0 && nb) ? bytes[rnd() % nb] : (int32_t)(rnd() % vocab);
        }
        char label[32];
        snprintf(label, sizeof label, "random sequence %d", r);
        check_stream(t, label, seq, len, r & 1);
    }
    bool rand_ok = failures == rand_fail;

    enum { NT = 4 };
    pthread_t th[NT];
    thread_arg args[NT];
    int thread_bad = 0;
    for (int i = 0; i < NT; i++) {
        args[i] = (thread_arg){t, cases, 0};
        pthread_create(&th[i], NULL, encode_thread, &args[i]);
    }
    for (int i = 0; i < NT; i++) {
        pthread_join(th[i], NULL);
        thread_bad += args[i].bad;
    }
    if (thread_bad) {
        fprintf(stderr, "  FAIL concurrent encoding: %d wrong results\n", thread_bad);
        failures++;
    }

    printf("%s: %d/%d encode cases match (ids, ids_with_special, decoded, streaming); random "
           "streaming %s; concurrent encoding %s\n",
           name, n_ok, n_cases, rand_ok ? "ok" : "FAILED", thread_bad ? "FAILED" : "ok");
    json_object_put(cases);
    tok_free(t);
    if (n_cases == 0) {
        fprintf(stderr, "FAIL: no encode cases in %s\n", argv[2]);
        return 1;
    }
    return failures ? 1 : 0;
}
