#include "metrics.h"

#include <event2/buffer.h>
#include <string.h>
#include <time.h>

static const double ttft_bounds[METRICS_BUCKETS] = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                                                    0.5,   1,    2.5,   5,    10,  30};
static const double itl_bounds[METRICS_BUCKETS] = {0.001, 0.0025, 0.005, 0.01, 0.02, 0.05,
                                                   0.1,   0.2,    0.5,   1,    2,    5};

void metrics_init(metrics *m) {
    memset(m, 0, sizeof *m);
    m->started = (int64_t)time(NULL);
}

void metrics_free(metrics *m) {
    (void)m;
}
void metrics_received(metrics *m) {
    m->received++;
}
void metrics_disconnect(metrics *m) {
    m->disconnects++;
}

void metrics_request(metrics *m, int status) {
    for (int i = 0; i < m->n_codes; i++)
        if (m->codes[i] == status) {
            m->by_code[i]++;
            return;
        }
    if (m->n_codes < 16) {
        m->codes[m->n_codes] = status;
        m->by_code[m->n_codes++] = 1;
    }
}

void metrics_finish(metrics *m, int32_t p, int32_t g) {
    m->prompt_tokens += (uint64_t)p;
    m->generated_tokens += (uint64_t)g;
}

static void observe(histogram *h, const double *bounds, double v) {
    int i = 0;
    while (i < METRICS_BUCKETS && v > bounds[i]) i++;
    h->counts[i]++;
    h->sum += v;
    h->n++;
}

void metrics_ttft(metrics *m, double s) {
    observe(&m->ttft, ttft_bounds, s);
}
void metrics_itl(metrics *m, double s) {
    observe(&m->itl, itl_bounds, s);
}

static void render_hist(struct evbuffer *b, const char *name, const char *help, const histogram *h,
                        const double *bounds) {
    evbuffer_add_printf(b, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
    uint64_t acc = 0;
    for (int i = 0; i < METRICS_BUCKETS; i++) {
        acc += h->counts[i];
        evbuffer_add_printf(b, "%s_bucket{le=\"%g\"} %llu\n", name, bounds[i],
                            (unsigned long long)acc);
    }
    acc += h->counts[METRICS_BUCKETS];
    evbuffer_add_printf(b, "%s_bucket{le=\"+Inf\"} %llu\n%s_sum %.6f\n%s_count %llu\n", name,
                        (unsigned long long)acc, name, h->sum, name, (unsigned long long)h->n);
}

/* A label value as the exposition format writes it: \\, \" and \n escaped. */
static void label_value(struct evbuffer *b, const char *v) {
    for (; *v; v++) {
        if (*v == '\\' || *v == '"')
            evbuffer_add_printf(b, "\\%c", *v);
        else if (*v == '\n')
            evbuffer_add(b, "\\n", 2);
        else
            evbuffer_add(b, v, 1);
    }
}

void metrics_render(const metrics *m, struct evbuffer *b, int running, int waiting,
                    uint64_t cache_bytes, const engine_stats *es, const pc_stats *pc,
                    const spec_stats *sp, uint64_t constrained_tokens, double mask_seconds) {
    evbuffer_add_printf(b, "# HELP lmhost_requests_total HTTP responses by status code.\n"
                           "# TYPE lmhost_requests_total counter\n");
    for (int i = 0; i < m->n_codes; i++)
        evbuffer_add_printf(b, "lmhost_requests_total{status=\"%d\"} %llu\n", m->codes[i],
                            (unsigned long long)m->by_code[i]);
    evbuffer_add_printf(
        b,
        "# HELP lmhost_generation_requests_total Completion requests accepted.\n"
        "# TYPE lmhost_generation_requests_total counter\nlmhost_generation_requests_total %llu\n"
        "# HELP lmhost_client_disconnects_total Clients gone before their reply ended.\n"
        "# TYPE lmhost_client_disconnects_total counter\nlmhost_client_disconnects_total %llu\n"
        "# HELP lmhost_prompt_tokens_total Prompt tokens of finished requests.\n"
        "# TYPE lmhost_prompt_tokens_total counter\nlmhost_prompt_tokens_total %llu\n"
        "# HELP lmhost_generation_tokens_total Tokens generated.\n"
        "# TYPE lmhost_generation_tokens_total counter\nlmhost_generation_tokens_total %llu\n"
        "# HELP lmhost_requests_running Sequences in the running batch.\n"
        "# TYPE lmhost_requests_running gauge\nlmhost_requests_running %d\n"
        "# HELP lmhost_queue_depth Requests waiting for a place in the batch.\n"
        "# TYPE lmhost_queue_depth gauge\nlmhost_queue_depth %d\n"
        "# HELP lmhost_cache_bytes Bytes held by the K/V cache.\n"
        "# TYPE lmhost_cache_bytes gauge\nlmhost_cache_bytes %llu\n",
        (unsigned long long)m->received, (unsigned long long)m->disconnects,
        (unsigned long long)m->prompt_tokens, (unsigned long long)m->generated_tokens, running,
        waiting, (unsigned long long)cache_bytes);
    /* by cache format, a family of its own (each cache open; lmhost_cache_bytes is their sum):
     * labelled and unlabelled samples in one family would be counted twice by sum() */
    if (es && es->n_caches)
        evbuffer_add_printf(b, "# HELP lmhost_cache_format_bytes Bytes held by the K/V cache of "
                               "one format.\n# TYPE lmhost_cache_format_bytes gauge\n");
    for (int i = 0; es && i < es->n_caches; i++) {
        evbuffer_add_printf(b, "lmhost_cache_format_bytes{format=\"");
        label_value(b, es->cache[i].name);
        evbuffer_add_printf(b, "\"} %llu\n", (unsigned long long)es->cache[i].bytes);
    }
    if (pc)
        evbuffer_add_printf(
            b,
            "# HELP lmhost_prefix_cache_hits_total Requests that reused a cached prefix.\n"
            "# TYPE lmhost_prefix_cache_hits_total counter\nlmhost_prefix_cache_hits_total %llu\n"
            "# HELP lmhost_prefix_cache_misses_total Requests that looked and found none.\n"
            "# TYPE lmhost_prefix_cache_misses_total counter\n"
            "lmhost_prefix_cache_misses_total %llu\n"
            "# HELP lmhost_prefix_cache_reused_tokens_total Prompt tokens restored, not "
            "prefilled.\n# TYPE lmhost_prefix_cache_reused_tokens_total counter\n"
            "lmhost_prefix_cache_reused_tokens_total %llu\n"
            "# HELP lmhost_prefix_cache_evictions_total Entries dropped for room.\n"
            "# TYPE lmhost_prefix_cache_evictions_total counter\n"
            "lmhost_prefix_cache_evictions_total %llu\n"
            "# HELP lmhost_prefix_cache_entries Sequences' states kept.\n"
            "# TYPE lmhost_prefix_cache_entries gauge\nlmhost_prefix_cache_entries %llu\n"
            "# HELP lmhost_prefix_cache_bytes Host memory they hold.\n"
            "# TYPE lmhost_prefix_cache_bytes gauge\nlmhost_prefix_cache_bytes %llu\n"
            "# HELP lmhost_prefix_cache_budget_bytes The most they may hold.\n"
            "# TYPE lmhost_prefix_cache_budget_bytes gauge\nlmhost_prefix_cache_budget_bytes "
            "%llu\n",
            (unsigned long long)pc->hits, (unsigned long long)pc->misses,
            (unsigned long long)pc->reused_tokens, (unsigned long long)pc->evictions,
            (unsigned long long)pc->entries, (unsigned long long)pc->bytes,
            (unsigned long long)pc->budget);
    if (sp)
        evbuffer_add_printf(
            b,
            "# HELP lmhost_spec_steps_total Sequence steps that checked proposed tokens.\n"
            "# TYPE lmhost_spec_steps_total counter\nlmhost_spec_steps_total %llu\n"
            "# HELP lmhost_spec_draft_tokens_total Tokens proposed (draft model or prompt "
            "lookup).\n# TYPE lmhost_spec_draft_tokens_total counter\n"
            "lmhost_spec_draft_tokens_total %llu\n"
            "# HELP lmhost_spec_accepted_tokens_total Proposed tokens the target's picks took.\n"
            "# TYPE lmhost_spec_accepted_tokens_total counter\n"
            "lmhost_spec_accepted_tokens_total %llu\n"
            "# HELP lmhost_spec_acceptance_rate Accepted over proposed, so far.\n"
            "# TYPE lmhost_spec_acceptance_rate gauge\nlmhost_spec_acceptance_rate %.4f\n"
            "# HELP lmhost_spec_tokens_per_step Tokens a step with proposals gives a sequence.\n"
            "# TYPE lmhost_spec_tokens_per_step gauge\nlmhost_spec_tokens_per_step %.4f\n",
            (unsigned long long)sp->steps, (unsigned long long)sp->drafted,
            (unsigned long long)sp->accepted,
            sp->drafted ? (double)sp->accepted / (double)sp->drafted : 0.0,
            sp->steps ? (double)(sp->steps + sp->accepted) / (double)sp->steps : 0.0);
    const engine_expert_stats *x = &es->experts;
    if (x->streamed)
        evbuffer_add_printf(
            b,
            "# HELP lmhost_expert_cache_hits_total Experts a product found resident "
            "(--stream-experts; one expert of one weight each).\n"
            "# TYPE lmhost_expert_cache_hits_total counter\nlmhost_expert_cache_hits_total %llu\n"
            "# HELP lmhost_expert_cache_misses_total Experts a product had to read from disk.\n"
            "# TYPE lmhost_expert_cache_misses_total counter\n"
            "lmhost_expert_cache_misses_total %llu\n"
            "# HELP lmhost_expert_read_bytes_total Expert bytes read from disk.\n"
            "# TYPE lmhost_expert_read_bytes_total counter\nlmhost_expert_read_bytes_total %llu\n"
            "# HELP lmhost_expert_reads_total Reads of expert parts issued.\n"
            "# TYPE lmhost_expert_reads_total counter\nlmhost_expert_reads_total %llu\n"
            "# HELP lmhost_expert_read_busy_seconds_total Time with at least one read in flight "
            "(read bytes over it: the read throughput).\n"
            "# TYPE lmhost_expert_read_busy_seconds_total counter\n"
            "lmhost_expert_read_busy_seconds_total %.6f\n"
            "# HELP lmhost_expert_reads_in_flight Reads queued or running now.\n"
            "# TYPE lmhost_expert_reads_in_flight gauge\nlmhost_expert_reads_in_flight %u\n"
            "# HELP lmhost_expert_reads_in_flight_max The most at once so far.\n"
            "# TYPE lmhost_expert_reads_in_flight_max gauge\n"
            "lmhost_expert_reads_in_flight_max %u\n"
            "# HELP lmhost_expert_resident_bytes Experts held in memory now (all backends).\n"
            "# TYPE lmhost_expert_resident_bytes gauge\nlmhost_expert_resident_bytes %llu\n"
            "# HELP lmhost_expert_budget_bytes The most each backend holds (--expert-cache-mb).\n"
            "# TYPE lmhost_expert_budget_bytes gauge\nlmhost_expert_budget_bytes %llu\n",
            (unsigned long long)x->hits, (unsigned long long)x->misses,
            (unsigned long long)x->read_bytes, (unsigned long long)x->reads, x->read_busy_s,
            x->depth_now, x->depth_max, (unsigned long long)x->resident_bytes,
            (unsigned long long)x->budget_bytes);
    evbuffer_add_printf(
        b,
        "# HELP lmhost_constrained_tokens_total Tokens picked under a grammar (response_format, "
        "forced tool calls).\n# TYPE lmhost_constrained_tokens_total counter\n"
        "lmhost_constrained_tokens_total %llu\n"
        "# HELP lmhost_constrained_mask_seconds_total Time their masks took (the grammar's, and "
        "putting them on the logits).\n# TYPE lmhost_constrained_mask_seconds_total counter\n"
        "lmhost_constrained_mask_seconds_total %.6f\n",
        (unsigned long long)constrained_tokens, mask_seconds);
    render_hist(b, "lmhost_time_to_first_token_seconds",
                "Time from request to its first generated token.", &m->ttft, ttft_bounds);
    render_hist(b, "lmhost_time_per_output_token_seconds", "Time between generated tokens.",
                &m->itl, itl_bounds);
}

void metrics_duration(metrics *m, double seconds) {
    m->mean_s = m->mean_s > 0 ? m->mean_s + (seconds - m->mean_s) / 32 : seconds;
}

double metrics_mean_seconds(const metrics *m) {
    return m->mean_s > 0 ? m->mean_s : 1.0;
}
