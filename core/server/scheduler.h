/* The scheduler: one engine thread running continuous batching. Requests join the running
 * batch between decode steps; prompts are prefilled in chunks so a long prompt cannot stall
 * the others; every step decodes one token for each running sequence. Tokens go back to the
 * caller through a callback invoked on the engine thread (the server forwards them to its
 * event loop). */
#ifndef LMHOST_SCHEDULER_H
#define LMHOST_SCHEDULER_H

#include <stdatomic.h>
#include <stdint.h>
#include "engine.h"
#include "sampler.h"
#include "spec.h"
#include "prefix_cache.h"

typedef enum finish_reason {
    FINISH_NONE = 0,
    FINISH_STOP,
    FINISH_LENGTH,
    FINISH_CANCELLED,
    FINISH_ERROR
} finish_reason;

#define SCHED_MAX_TOP_LOGPROBS 20

typedef struct sched_token {
    int32_t id;
    float logprob; /* log-softmax of the model's raw logits */
    int32_t n_top;
    int32_t top_id[SCHED_MAX_TOP_LOGPROBS];
    float top_logprob[SCHED_MAX_TOP_LOGPROBS];
} sched_token;

typedef struct sched_req sched_req;

/* Called on the engine thread once the request joins the running batch (tok == NULL,
 * FINISH_NONE), for every generated token (tok != NULL), then once at the end (tok == NULL,
 * reason set; a request that could not join gets only this, FINISH_ERROR, with fail_code
 * and fail_msg set where the cause is the request's). Must not block. */
typedef void (*sched_emit_fn)(sched_req *r, const sched_token *tok, finish_reason reason,
                              void *user);

struct sched_req {
    /* set by the caller before sched_submit */
    int32_t *prompt;
    int32_t n_prompt;
    int32_t max_tokens;
    sampler_params sp;
    int32_t stop_ids[8]; /* end-of-sequence ids that finish with FINISH_STOP */
    int32_t n_stop_ids;
    int32_t top_logprobs; /* 0..SCHED_MAX_TOP_LOGPROBS; -1: no logprobs */
    int no_prefix_cache;  /* "cache_prompt": false: neither reuse a cached prefix nor leave one */
    int no_spec;          /* "speculative": false: no proposals (spec.h) for this request */
    /* constrained decoding (grammar.h): tokens the grammar refuses are masked before
     * sampling, and the match advanced over each pick; NULL: free text. Set with no_spec
     * (proposals are not checked against the grammar). Used on the engine thread only. */
    struct gram_match *gm;
    /* logit_bias: added to these tokens' logits before sampling (the caller's arrays) */
    const int32_t *bias_id;
    const float *bias;
    int32_t n_bias;
    /* "moe_top_k": experts a token routes to (engine_seq_moe_top_k); 0: the server's */
    int32_t moe_top_k;
    /* the cache to run in (engine_cache_open's spec, opened at admission on the engine
     * thread); "": the engine's default */
    char cache[200];
    /* set when it cannot join: 400 (a cache that cannot be served) or 503 (out of memory) */
    int fail_code;
    char fail_msg[768];
    sched_emit_fn emit;
    void *user;
    /* set from any thread: stop generating at the next step (client gone, stop string) */
    atomic_int cancel;

    /* engine thread's own */
    uint64_t seq;
    int32_t n_done;   /* prompt tokens prefilled */
    int32_t n_cached; /* of those, restored from the prefix cache */
    int32_t n_gen;
    int32_t *hist;
    sampler *smp;
    int32_t next; /* token to feed in the next step, once prefilled */
    int32_t fed;  /* once prefilled: hist[0..fed) are in the model; the next step feeds the
                     rest (one token, or more where a rewind took a recurrent model back) */
    int32_t *draft, n_draft; /* this step's proposals (spec.h) */
    engine_snapshot *mark;   /* the state before them, where it cannot be cut back */
    double t_submit, t_first, t_last;
    sched_req *qnext;
};

typedef struct sched_stats {
    int32_t running, waiting;
    uint64_t cache_bytes;
    uint64_t steps;
    engine_stats engine; /* as of the last step (read on the engine thread) */
    char chain[512];
    char precision[16]; /* engine_precision */
    pc_stats prefix;    /* the prefix cache's */
    spec_kind spec;     /* speculative decoding's drafter, and its counters */
    spec_stats spec_st;
    /* constrained decoding: tokens picked under a grammar's mask, and the seconds the masks
     * took (the grammar's, and putting them on the logits) */
    uint64_t constrained_tokens;
    double mask_seconds;
} sched_stats;

typedef struct sched sched;

/* max_running sequences decode together; at most max_waiting wait behind them;
 * chunk is the most prompt rows one step takes (across all prefilling sequences);
 * prefix_bytes is the prefix cache's budget (prefix_cache.h; 0: off), park whether it keeps
 * ended sequences in place (on a device) rather than snapshots in host memory; sp proposes
 * tokens for speculative decoding (NULL: off; the caller's, used on the engine thread
 * only). */
sched *sched_new(engine *e, int32_t max_running, int32_t max_waiting, int32_t chunk,
                 uint64_t prefix_bytes, int park, spec *sp);
/* Stops the thread after the running and waiting requests have finished (drain=1) or
 * cancels them (drain=0), then frees the scheduler (not the engine). */
void sched_free(sched *s, int drain);
/* Queues r. Returns 0, or -1 when the wait queue is full (the caller answers 429). */
int sched_submit(sched *s, sched_req *r);
void sched_get_stats(sched *s, sched_stats *st);
/* Queues fn(e, arg) to run on the engine thread between two steps, the running requests
 * going on around it (fn must leave their sequences alone: embeddings use sequences of
 * their own). Returns at once; fn reports its result itself. -1 when stopping. */
int sched_task(sched *s, void (*fn)(engine *e, void *arg), void *arg);
/* Runs fn on the engine thread once the running requests have finished (waiting ones are
 * not admitted meanwhile; they run after it), and waits for it. For moving the model. */
int sched_call(sched *s, int (*fn)(engine *e, void *arg), void *arg);

#endif
