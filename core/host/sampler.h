/* Turning logits into the next token: penalties, temperature, top-k, top-p, min-p, and a
 * seeded generator so that a seed reproduces a run. */
#ifndef LMHOST_SAMPLER_H
#define LMHOST_SAMPLER_H

#include <stddef.h>
#include <stdint.h>

typedef struct sampler_params {
    float temperature;        /* 0: greedy (argmax, lowest id on ties) */
    int32_t top_k;            /* 0: off */
    float top_p;              /* 1: off */
    float min_p;              /* 0: off */
    float repetition_penalty; /* 1: off; as Hugging Face applies it */
    float presence_penalty;   /* 0: off; as OpenAI defines it */
    float frequency_penalty;  /* 0: off */
    uint64_t seed;
} sampler_params;

typedef struct sampler sampler;

/* Returns NULL with err set when a parameter is out of range. */
sampler *sampler_new(const sampler_params *p, int32_t vocab, char *err, size_t err_len);
void sampler_free(sampler *s);
/* Picks a token from logits[vocab] (modified in place) given the tokens seen so far. */
int32_t sampler_sample(sampler *s, float *logits, const int32_t *history, int32_t n_history);
/* The lowest index of the largest of x[0..n) (NaNs skipped; a NaN first gives 0): the
 * greedy pick, which LMH_OP_ARGMAX makes on a backend by the same rule. */
int32_t sampler_argmax(const float *x, int32_t n);
/* Whether s picks by sampler_argmax alone (greedy, no penalties): it then needs no logits. */
int sampler_is_greedy(const sampler *s);
/* The default parameters: greedy, every filter off. */
sampler_params sampler_defaults(void);

#endif
