/* Mask cost of constrained decoding on a real vocabulary: loads a tokenizer (qwen3, 151936
 * ids, by default), and per schema simulates decoding: at every step a mask for the
 * remaining budget, then a token drawn by a seeded generator among the allowed ones.
 * usage: bench_grammar [TOKENIZER_NAME] [WALKS] [BUDGET] */
#include "gram_test.h"

#include <math.h>

static const struct {
    const char *name, *schema;
} SCHEMAS[] = {
    {"person",
     "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},\"age\":{\"type\":"
     "\"integer\"},\"email\":{\"type\":\"string\"},\"active\":{\"type\":\"boolean\"},\"tags\":{"
     "\"type\":\"array\",\"items\":{\"type\":\"string\"}},\"address\":{\"type\":\"object\","
     "\"properties\":{\"street\":{\"type\":\"string\"},\"city\":{\"type\":\"string\"},\"zip\":{"
     "\"type\":\"string\"}},\"required\":[\"street\",\"city\"]}},\"required\":[\"name\",\"age\","
     "\"active\"]}"},
    {"json_object", "{\"type\":\"object\"}"},
    {"tool_call",
     "{\"type\":\"object\",\"properties\":{\"name\":{\"enum\":[\"get_weather\",\"search_web\","
     "\"send_email\"]},\"arguments\":{\"type\":\"object\",\"properties\":{\"location\":{\"type\":"
     "\"string\"},\"unit\":{\"enum\":[\"celsius\",\"fahrenheit\"]},\"days\":{\"type\":"
     "\"integer\"}},\"required\":[\"location\"]}},\"required\":[\"name\",\"arguments\"]}"},
    {"tree_ref",
     "{\"$defs\":{\"node\":{\"type\":\"object\",\"properties\":{\"value\":{\"type\":\"number\"},"
     "\"children\":{\"type\":\"array\",\"items\":{\"$ref\":\"#/$defs/node\"},\"maxItems\":3}},"
     "\"required\":[\"value\"]}},\"$ref\":\"#/$defs/node\"}"},
    {"anyof_array",
     "{\"type\":\"array\",\"items\":{\"anyOf\":[{\"type\":\"string\"},{\"type\":\"number\"},{"
     "\"type\":\"null\"},{\"type\":\"object\",\"properties\":{\"k\":{\"type\":\"boolean\"}},"
     "\"required\":[\"k\"]}]},\"maxItems\":20}"},
    {"bounded_strings",
     "{\"type\":\"object\",\"properties\":{\"code\":{\"type\":\"string\",\"minLength\":3,"
     "\"maxLength\":8},\"note\":{\"type\":\"string\",\"maxLength\":200}},\"required\":[\"code\","
     "\"note\"]}"},
};

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    const char *name = argc > 1 ? argv[1] : "qwen3";
    int walks = argc > 2 ? atoi(argv[2]) : 8;
    int budget = argc > 3 ? atoi(argv[3]) : 512;
    tok_tokenizer *t = gt_load_tokenizer(name);
    if (!t) return 1;
    const int32_t *eos;
    size_t n_eos = tok_eos_ids(t, &eos);
    int32_t n_vocab = (int32_t)tok_vocab_size(t);
    if (!strcmp(name, "qwen3") && n_vocab < 151936) n_vocab = 151936; /* the model's size */
    char err[512];
    double t0 = gt_now();
    gram_vocab *v = gram_vocab_new(t, n_vocab, eos, (int)n_eos, err, sizeof err);
    double t1 = gt_now();
    if (!v) {
        fprintf(stderr, "gram_vocab_new: %s\n", err);
        return 1;
    }
    printf("grammar vocab %s: %d ids, built in %.1f ms\n", name, (int)n_vocab, (t1 - t0) * 1e3);
    int32_t words = (n_vocab + 31) / 32;
    uint32_t *bits = malloc((size_t)words * sizeof *bits);
    size_t cap = (size_t)walks * (size_t)budget + 16;
    double *times = malloc(cap * sizeof *times);
    for (size_t si = 0; si < sizeof SCHEMAS / sizeof *SCHEMAS; si++) {
        json_object *schema = json_tokener_parse(SCHEMAS[si].schema);
        double c0 = gt_now();
        gram *g = gram_json(schema, err, sizeof err);
        double c1 = gt_now();
        if (!g) {
            fprintf(stderr, "gram_json %s: %s\n", SCHEMAS[si].name, err);
            return 1;
        }
        size_t nt = 0;
        int64_t hits = 0, misses = 0, complete = 0, n_hit = 0, n_miss = 0;
        double hit_sum = 0, miss_sum = 0, miss_max = 0;
        for (int w = 0; w < walks; w++) {
            uint64_t rng = 1000 + (uint64_t)w;
            gram_match *m = gram_match_new(g, v);
            for (int step = 0; step < budget; step++) {
                int64_t h0, h1;
                gram_match_cache_stats(m, &h0, NULL, NULL);
                double a = gt_now();
                int32_t n = gram_match_mask(m, budget - step, bits);
                double b = gt_now();
                gram_match_cache_stats(m, &h1, NULL, NULL);
                times[nt++] = (b - a) * 1e6;
                if (h1 > h0) {
                    hit_sum += (b - a) * 1e6;
                    n_hit++;
                } else {
                    miss_sum += (b - a) * 1e6;
                    n_miss++;
                    if ((b - a) * 1e6 > miss_max) miss_max = (b - a) * 1e6;
                }
                if (n <= 0) break;
                int32_t tok = gt_nth_bit(bits, words, (int64_t)(gt_rand(&rng) % (uint64_t)n));
                if (tok_is_eos(t, tok)) break;
                if (gram_match_accept(m, tok)) {
                    fprintf(stderr, "accept refused an allowed token\n");
                    return 1;
                }
            }
            complete += gram_match_status(m) != GRAM_MORE;
            int64_t h, mi;
            gram_match_cache_stats(m, &h, &mi, NULL);
            hits += h;
            misses += mi;
            gram_match_free(m);
        }
        double sum = 0;
        for (size_t i = 0; i < nt; i++) sum += times[i];
        qsort(times, nt, sizeof *times, cmp_d);
        printf("grammar mask %s: steps %zu, mean %.1f us, p50 %.1f us, p99 %.1f us, max %.1f us, "
               "cache hits %.0f%% (compile %.2f ms, %lld/%d walks complete)\n",
               SCHEMAS[si].name, nt, sum / (double)nt, times[nt / 2],
               times[(size_t)((double)nt * 0.99)], times[nt - 1],
               100.0 * (double)hits / (double)(hits + misses ? hits + misses : 1), (c1 - c0) * 1e3,
               (long long)complete, walks);
        printf("  %s: hits mean %.1f us; misses %lld, mean %.1f us, max %.1f us\n",
               SCHEMAS[si].name, n_hit ? hit_sum / (double)n_hit : 0.0, (long long)n_miss,
               n_miss ? miss_sum / (double)n_miss : 0.0, miss_max);
        gram_free(g);
        json_object_put(schema);
    }
    free(times);
    free(bits);
    gram_vocab_free(v);
    tok_free(t);
    return 0;
}
