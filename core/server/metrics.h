/* Prometheus metrics of the server. Updated and rendered on the event-loop thread only. */
#ifndef LMHOST_METRICS_H
#define LMHOST_METRICS_H

#include <stdint.h>
#include "engine.h"
#include "prefix_cache.h"
#include "spec.h"

struct evbuffer;

#define METRICS_BUCKETS 12

typedef struct histogram {
    uint64_t counts[METRICS_BUCKETS + 1]; /* last: +Inf */
    double sum;
    uint64_t n;
} histogram;

typedef struct metrics {
    int64_t started;
    uint64_t received, disconnects, prompt_tokens, generated_tokens;
    int codes[16];
    uint64_t by_code[16];
    int n_codes;
    histogram ttft, itl;
    double mean_s; /* requests' duration, a moving mean (0: none finished yet) */
} metrics;

void metrics_init(metrics *m);
void metrics_free(metrics *m);
void metrics_received(metrics *m);
void metrics_request(metrics *m, int status);
void metrics_finish(metrics *m, int32_t prompt_tokens, int32_t generated_tokens);
void metrics_ttft(metrics *m, double seconds);
void metrics_itl(metrics *m, double seconds);
void metrics_disconnect(metrics *m);
/* A request's duration, into the moving mean of the last 32 or so. */
void metrics_duration(metrics *m, double seconds);
/* That mean; 1 s before any request has finished. */
double metrics_mean_seconds(const metrics *m);
/* es: the engine's stats, for the bytes of each open cache */
void metrics_render(const metrics *m, struct evbuffer *out, int running, int waiting,
                    uint64_t cache_bytes, const engine_stats *es, const pc_stats *pc,
                    const spec_stats *sp, uint64_t constrained_tokens, double mask_seconds);

#endif
