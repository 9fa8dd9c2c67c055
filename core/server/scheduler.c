#include "scheduler.h"
#include "grammar.h"
#include "log.h"
#include "lmhost/debug.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct sched {
    engine *e;
    pthread_t th;
    pthread_mutex_t mu;
    pthread_cond_t cv, call_done;
    sched_req *wait_head, *wait_tail;
    int32_t n_wait, max_waiting, max_running, chunk;
    sched_req **run;
    int32_t n_run;     /* engine thread only */
    int32_t n_run_pub; /* n_run as of the last step, under mu */
    int stop, drain;
    long step_delay_ms; /* LMHOST_DEBUG=step-delay-ms=N: tests' slow model */
    uint64_t next_seq, steps, cache_bytes;
    engine_stats es;
    char chain[512];
    char precision[16];
    int32_t vocab;
    /* per-step buffers, sized for max_running + chunk rows */
    engine_row *rows;
    int32_t *outs;
    sched_req **out_req;
    float *logits, *lsm;
    int32_t *picks; /* greedy picks of a step's output rows, when only those came back */
    /* Decode steps started (engine_step_start) and not yet read, oldest first: each one's
     * requests by output row. finish() clears a request's entries, so that a request ended
     * meanwhile (and maybe freed) is skipped when its step is read. */
    sched_req **flight[ENGINE_MAX_PENDING];
    int32_t n_flight_rows[ENGINE_MAX_PENDING];
    int n_flight;
    /* a function to run between steps (sched_call) */
    int (*call_fn)(engine *, void *);
    void *call_arg;
    int call_rc, call_pending;
    /* functions to run between steps with requests running (sched_task), oldest first */
    struct task {
        void (*fn)(engine *, void *);
        void *arg;
        struct task *next;
    } * task_head, *task_tail;
    /* the grammar's mask of a constrained request's next token, (vocab + 31) / 32 words;
     * tokens picked under one and the time their masks took (engine thread; under mu: as
     * of the last step) */
    uint32_t *mask;
    uint64_t con_tokens, con_tokens_pub;
    double con_s, con_s_pub;
    /* the prefix cache (engine thread), its counters as of the last step (under mu), and
     * the ended sequences whose snapshot waits for the steps in flight to be read */
    prefix_cache *pc;
    pc_stats pcst;
    /* speculative decoding: the drafter, whether the model's state can be cut back, the
     * proposals asked for in a step, the counters as of the last step (under mu), and the
     * logits rows a step may bring back (grown as needed) */
    spec *sp;
    int cuts;
    spec_ask *asks;
    sched_req **ask_req, **step_req;
    spec_stats spst;
    size_t cap_logits;
    struct retired {
        uint64_t seq;
        int32_t *tok, n;
    } * ret;
    int32_t n_ret, cap_ret;
};

/* Device memory sequence seq holds: its rows in each layer (at the default cache's bytes a
 * row) and its recurrent state. */
static uint64_t seq_bytes(engine *e, uint64_t seq) {
    uint64_t n = 0, k, v;
    for (int32_t l = 0; l < engine_n_layers(e); l++)
        if (engine_layer_row_bytes(e, l, &k, &v) == 0)
            n += (uint64_t)engine_layer_rows(e, seq, l) * (k + v);
    engine_stats es;
    engine_get_stats(e, &es);
    return n + es.state_seq_bytes;
}

/* Leaves sequence seq, which holds tokens from tok[0..n), in the prefix cache (parked, or
 * a snapshot and then it ends). Needs no step in flight (a snapshot reads the cache, a
 * parked sequence must not move on). */
static void keep_prefix(sched *s, uint64_t seq, const int32_t *tok, int32_t n) {
    char err[512];
    int32_t len = engine_seq_len(s->e, seq);
    if (pc_parks(s->pc)) {
        if (len >= PC_MIN_TOKENS && len <= n)
            pc_park(s->pc, engine_seq_cache(s->e, seq), tok, len, seq, seq_bytes(s->e, seq));
        else
            engine_seq_remove(s->e, seq);
        return;
    }
    if (len >= PC_MIN_TOKENS && len <= n) {
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        engine_snapshot *sn = engine_seq_snapshot(s->e, seq, 1, err, sizeof err);
        clock_gettime(CLOCK_MONOTONIC, &t1);
        if (sn) {
            log_msg(LMH_LOG_DEBUG, "prefix cache: %d tokens kept, %.1f MiB in %.1f ms", len,
                    (double)engine_snapshot_bytes(sn) / 1048576.0,
                    (double)(t1.tv_sec - t0.tv_sec) * 1e3 +
                        (double)(t1.tv_nsec - t0.tv_nsec) * 1e-6);
            pc_insert(s->pc, engine_seq_cache(s->e, seq), tok, sn);
        } else
            log_msg(LMH_LOG_DEBUG, "prefix cache: no snapshot of a finished request: %s", err);
    }
    engine_seq_remove(s->e, seq);
}

/* The sequences that ended while steps were in flight, once none is: kept, or (at the
 * stop) only ended. */
static void flush_retired(sched *s, int keep) {
    if (s->n_flight) return;
    for (int32_t i = 0; i < s->n_ret; i++) {
        if (keep)
            keep_prefix(s, s->ret[i].seq, s->ret[i].tok, s->ret[i].n);
        else
            engine_seq_remove(s->e, s->ret[i].seq);
        free(s->ret[i].tok);
    }
    s->n_ret = 0;
}

/* Ends r's sequence: into the prefix cache where that applies (now, or once the steps in
 * flight are read: the sequence stays until then), else gone. */
static void end_seq(sched *s, sched_req *r, finish_reason why) {
    int keep = s->pc && !r->no_prefix_cache && r->hist && !s->stop &&
               (why == FINISH_STOP || why == FINISH_LENGTH || why == FINISH_CANCELLED);
    int32_t n = r->n_prompt + r->n_gen;
    if (keep && !s->n_flight) {
        keep_prefix(s, r->seq, r->hist, n);
        return;
    }
    if (keep && s->n_ret == s->cap_ret) {
        int32_t cap = s->cap_ret ? 2 * s->cap_ret : 8;
        struct retired *p = realloc(s->ret, (size_t)cap * sizeof *p);
        if (p) s->ret = p, s->cap_ret = cap;
    }
    int32_t *tok = keep && s->n_ret < s->cap_ret ? malloc((size_t)n * sizeof *tok) : NULL;
    if (!tok) {
        engine_seq_remove(s->e, r->seq);
        return;
    }
    memcpy(tok, r->hist, (size_t)n * sizeof *tok);
    s->ret[s->n_ret++] = (struct retired){.seq = r->seq, .tok = tok, .n = n};
}

static void step_flight(sched *s);

static void finish(sched *s, sched_req *r, finish_reason why) {
    for (int f = 0; f < s->n_flight; f++)
        for (int32_t k = 0; k < s->n_flight_rows[f]; k++)
            if (s->flight[f][k] == r) s->flight[f][k] = NULL;
    if (r->mark) { /* a step with proposals failed before its rewind */
        engine_seq_trim(s->e, r->seq, 0);
        engine_snapshot_free(r->mark);
        r->mark = NULL;
    }
    end_seq(s, r, why);
    spec_seq_end(s->sp, r->seq);
    sampler_free(r->smp);
    r->smp = NULL;
    free(r->hist);
    free(r->draft);
    r->hist = NULL;
    r->draft = NULL;
    r->emit(r, NULL, why, r->user); /* after this the request may be freed by its owner */
}

/* A request that could not join: what admit gave it goes, and it hears FINISH_ERROR. */
static int refuse(sched_req *r) {
    sampler_free(r->smp);
    free(r->hist);
    free(r->draft);
    r->smp = NULL;
    r->hist = NULL;
    r->draft = NULL;
    r->emit(r, NULL, FINISH_ERROR, r->user);
    return -1;
}

/* r's new sequence (in cache ci) takes the longest usable cached prefix of its prompt:
 * r->n_done and r->n_cached say how many tokens. A restore that fails leaves a fresh
 * sequence (-1 only when even that cannot be had). */
static int reuse_prefix(sched *s, sched_req *r, int ci) {
    char err[512];
    while (s->n_flight) step_flight(s); /* a restore needs no step in flight */
    pc_hit hit;
    int found = pc_find(s->pc, ci, r->prompt, r->n_prompt, &hit);
    int32_t use = hit.use;
    const engine_snapshot *sn = hit.sn;
    if (found && hit.seq) { /* a parked sequence: the request goes on in it */
        engine_seq_remove(s->e, r->seq);
        r->seq = hit.seq;
        if (use < engine_seq_len(s->e, r->seq) && engine_seq_trim(s->e, r->seq, use) != 0) {
            log_msg(LMH_LOG_WARN,
                    "prefix cache: cutting a kept sequence back to %d failed; "
                    "prefilling them",
                    use);
            engine_seq_remove(s->e, r->seq);
            r->seq = ++s->next_seq;
            use = 0;
            if (engine_seq_add_in(s->e, r->seq, ci) != 0) return -1;
        }
    } else if (sn && (engine_seq_restore(s->e, r->seq, sn, err, sizeof err) != 0 ||
                      (use < engine_snapshot_len(sn) && engine_seq_trim(s->e, r->seq, use) != 0))) {
        log_msg(LMH_LOG_WARN, "prefix cache: reusing %d tokens failed (%s); prefilling them", use,
                err);
        engine_seq_remove(s->e, r->seq);
        use = 0;
        if (engine_seq_add_in(s->e, r->seq, ci) != 0) return -1;
    }
    r->n_done = r->n_cached = use;
    return 0;
}

static int admit(sched *s, sched_req *r) {
    char err[512];
    r->seq = ++s->next_seq;
    r->n_done = r->n_gen = r->n_cached = r->fed = r->n_draft = 0;
    r->mark = NULL;
    r->fail_code = 0;
    r->fail_msg[0] = 0;
    /* the request's cache, opened here on first use (the engine is this thread's) and kept */
    int ci = r->cache[0] ? engine_cache_open(s->e, r->cache, r->fail_msg, sizeof r->fail_msg) : 0;
    if (ci < 0) {
        r->fail_code = ci == LMH_ENOMEM ? 503 : 400;
        log_msg(LMH_LOG_WARN, "cache %s refused: %s", r->cache, r->fail_msg);
        r->emit(r, NULL, FINISH_ERROR, r->user);
        return -1;
    }
    r->hist = malloc(((size_t)r->n_prompt + (size_t)r->max_tokens + 1) * sizeof *r->hist);
    r->draft = s->sp ? malloc((size_t)spec_draft_max(s->sp) * sizeof *r->draft) : NULL;
    r->smp = sampler_new(&r->sp, s->vocab, err, sizeof err);
    if (!r->hist || !r->smp || (s->sp && !r->draft) || engine_seq_add_in(s->e, r->seq, ci) != 0) {
        log_msg(LMH_LOG_ERROR, "cannot start a sequence: %s", r->smp ? "out of memory" : err);
        return refuse(r);
    }
    memcpy(r->hist, r->prompt, (size_t)r->n_prompt * sizeof *r->hist);
    if (s->pc && !r->no_prefix_cache && r->n_prompt > PC_MIN_TOKENS && reuse_prefix(s, r, ci))
        return refuse(r);
    if (r->moe_top_k && engine_seq_moe_top_k(s->e, r->seq, r->moe_top_k) != 0) {
        snprintf(r->fail_msg, sizeof r->fail_msg, "moe_top_k %d is not served", r->moe_top_k);
        r->fail_code = 400;
        engine_seq_remove(s->e, r->seq);
        r->emit(r, NULL, FINISH_ERROR, r->user);
        return -1;
    }
    /* the prompt goes in over several steps (the chunk budget): one prompt to the model */
    engine_seq_prompt(s->e, r->seq, r->n_prompt - r->n_done);
    r->emit(r, NULL, FINISH_NONE, r->user); /* it has joined */
    return 0;
}

/* log-softmax of the raw logits (before penalties and temperature): the chosen token's
 * logprob and the `want` most likely tokens'. */
static void top_logprobs(sched *s, const float *lg, int32_t want, sched_token *t) {
    t->n_top = want;
    for (int32_t k = 0; k < want; k++) {
        t->top_id[k] = -1;
        t->top_logprob[k] = -INFINITY;
    }
    float mx = -INFINITY;
    for (int32_t i = 0; i < s->vocab; i++)
        if (lg[i] > mx) mx = lg[i];
    double sum = 0;
    for (int32_t i = 0; i < s->vocab; i++) sum += exp((double)(lg[i] - mx));
    float lse = mx + (float)log(sum);
    t->logprob = lg[t->id] - lse;
    for (int32_t i = 0; i < s->vocab && want > 0; i++) {
        float v = lg[i] - lse;
        if (v <= t->top_logprob[want - 1]) continue;
        int32_t k = want - 1;
        while (k > 0 && t->top_logprob[k - 1] < v) {
            t->top_logprob[k] = t->top_logprob[k - 1];
            t->top_id[k] = t->top_id[k - 1];
            k--;
        }
        t->top_logprob[k] = v;
        t->top_id[k] = i;
    }
}

static void drop_running(sched *s, sched_req *r) {
    for (int32_t i = 0; i < s->n_run; i++)
        if (s->run[i] == r) {
            s->run[i] = s->run[--s->n_run];
            break;
        }
}

/* What r's grammar refuses cannot be drawn: those logits go to -inf. The budget keeps the
 * output completable in the tokens left (grammar.h). Only the refused tokens are written: a
 * word of them at once where a word allows none (between JSON values little is allowed),
 * else bit by bit (inside a string almost everything is): 6-15 us at 151936 tokens, where
 * testing every bit took 70-100. */
static void constrain(sched *s, sched_req *r, float *lg) {
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    if (gram_match_mask(r->gm, r->max_tokens - r->n_gen, s->mask) > 0) {
        int32_t words = (s->vocab + 31) / 32;
        for (int32_t w = 0; w < words; w++) {
            uint32_t z = ~s->mask[w];
            float *x = lg + (size_t)w * 32;
            if (w == words - 1 && s->vocab % 32) z &= (1u << (s->vocab % 32)) - 1;
            if (z == UINT32_MAX) {
                for (int b = 0; b < 32; b++) x[b] = -INFINITY;
                continue;
            }
            for (; z; z &= z - 1) x[__builtin_ctz(z)] = -INFINITY;
        }
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    s->con_tokens++;
    s->con_s += (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9;
}

/* r's next token, into its history: the device's pick, or (lg set) drawn from its logits
 * row. Returns why it ends the request (FINISH_NONE: it goes on). */
static finish_reason pick_token(sched *s, sched_req *r, float *lg, int32_t pick, sched_token *t) {
    t->n_top = 0;
    if (lg && r->top_logprobs >= 0) memcpy(s->lsm, lg, (size_t)s->vocab * sizeof(float));
    if (lg) {
        for (int32_t k = 0; k < r->n_bias; k++)
            if (r->bias_id[k] >= 0 && r->bias_id[k] < s->vocab) lg[r->bias_id[k]] += r->bias[k];
        if (r->gm) constrain(s, r, lg);
    }
    t->id = lg ? sampler_sample(r->smp, lg, r->hist, r->n_prompt + r->n_gen) : pick;
    if (lg && r->top_logprobs >= 0) top_logprobs(s, s->lsm, r->top_logprobs, t);
    r->hist[r->n_prompt + r->n_gen++] = t->id;
    r->next = t->id;
    for (int32_t j = 0; j < r->n_stop_ids; j++)
        if (t->id == r->stop_ids[j]) return FINISH_STOP;
    if (r->gm && gram_match_accept(r->gm, t->id) == 0 && gram_match_status(r->gm) == GRAM_ENDED)
        return FINISH_STOP; /* nothing may follow but the end */
    return r->n_gen >= r->max_tokens ? FINISH_LENGTH : FINISH_NONE;
}

/* Hands a picked token to the caller (an end-of-sequence id is not text), and ends the
 * request where the pick did. */
static void deliver(sched *s, sched_req *r, const sched_token *t, finish_reason end) {
    int eos = 0;
    for (int32_t j = 0; j < r->n_stop_ids; j++) eos |= t->id == r->stop_ids[j];
    if (!eos) r->emit(r, t, FINISH_NONE, r->user);
    if (end != FINISH_NONE) {
        drop_running(s, r);
        finish(s, r, end);
    }
}

static void take_token(sched *s, sched_req *r, float *lg, int32_t pick) {
    sched_token t;
    finish_reason end = pick_token(s, r, lg, pick, &t);
    deliver(s, r, &t, end);
}

/* Whether the step after the one in flight will have the same rows, so that it can be
 * started now on that step's picks: nothing else runs or waits to join, no request in it
 * is cancelled or ends by length with the pick being read, no call waits for the engine. */
static int may_chain(sched *s) {
    if (s->n_flight != 1 || s->n_run != s->n_flight_rows[0]) return 0;
    for (int32_t k = 0; k < s->n_flight_rows[0]; k++) {
        sched_req *r = s->flight[0][k];
        if (!r || atomic_load(&r->cancel) || r->n_gen + 1 >= r->max_tokens) return 0;
        if (s->sp && !r->no_spec) return 0; /* its next step takes proposals */
    }
    pthread_mutex_lock(&s->mu);
    int busy = s->call_pending || s->task_head || (s->stop && !s->drain) ||
               (s->wait_head && s->n_run < s->max_running);
    pthread_mutex_unlock(&s->mu);
    return !busy;
}

/* Reads the oldest step in flight, after starting the step that follows it where
 * may_chain allows: the device runs that one while the host hands these tokens out. */
static void step_flight(sched *s) {
    char err[512];
    int32_t n = s->n_flight_rows[0];
    if (may_chain(s)) {
        for (int32_t k = 0; k < n; k++) {
            s->rows[k] = (engine_row){.seq = s->flight[0][k]->seq};
            s->outs[k] = k;
        }
        if (engine_step_start(s->e, s->rows, n, s->outs, n, 1, err, sizeof err) == 0) {
            memcpy(s->flight[1], s->flight[0], (size_t)n * sizeof **s->flight);
            s->n_flight_rows[1] = n;
            s->n_flight = 2;
            s->steps++;
        } else {
            log_msg(LMH_LOG_WARN, "starting a decode step early failed: %s", err);
        }
    }
    int32_t got = engine_step_finish(s->e, s->picks, n, err, sizeof err);
    /* the step read leaves the flight before its tokens go out (finish() looks there) */
    sched_req **done = s->flight[0];
    s->flight[0] = s->flight[1];
    s->flight[1] = done;
    s->n_flight_rows[0] = s->n_flight_rows[1];
    s->n_flight--;
    if (got != n) {
        log_msg(LMH_LOG_ERROR, "step failed: %s", err);
        /* its sequences are ended; the step started after it had the same rows */
        if (s->n_flight) engine_step_finish(s->e, NULL, 0, err, sizeof err);
        s->n_flight = 0;
        for (int32_t k = 0; k < n; k++)
            if (done[k]) {
                drop_running(s, done[k]);
                finish(s, done[k], FINISH_ERROR);
            }
        return;
    }
    for (int32_t k = 0; k < n; k++)
        if (done[k]) {
            done[k]->fed++; /* a started step feeds one token a sequence */
            take_token(s, done[k], NULL, s->picks[k]);
        }
}

/* Proposals (spec.h) for the decoding requests that take them, each bounded by the tokens
 * it has left; where the model cannot be cut back, its state before them (without that,
 * a request goes without). A request that a rewind left with tokens to feed again takes
 * them in a plain step first: a mark is then at its newest token, and what is fed again
 * stays bounded. */
static int32_t propose(sched *s) {
    int32_t n = 0;
    for (int32_t i = 0; i < s->n_run; i++) {
        sched_req *r = s->run[i];
        r->n_draft = 0;
        int32_t left = r->max_tokens - r->n_gen - 1;
        if (!s->sp || r->n_done < r->n_prompt || r->no_spec || r->gm || left < 1 ||
            r->fed < r->n_prompt + r->n_gen - 1)
            continue;
        s->asks[n] = (spec_ask){.seq = r->seq,
                                .hist = r->hist,
                                .n = r->n_prompt + r->n_gen,
                                .max = left,
                                .out = r->draft};
        s->ask_req[n++] = r;
    }
    if (n == 0) return 0;
    spec_propose(s->sp, s->asks, n);
    char err[512];
    for (int32_t i = 0; i < n; i++) {
        sched_req *r = s->ask_req[i];
        r->n_draft = s->asks[i].n_out;
        if (r->n_draft && !s->cuts && !(r->mark = spec_mark(s->e, r->seq, err, sizeof err))) {
            log_msg(LMH_LOG_WARN, "no snapshot to check proposals against: %s", err);
            r->n_draft = 0;
        }
    }
    return n;
}

/* A decoding request's outputs of a step: its token, then one more for each proposal that
 * equals the pick before it; the model is then cut back (or taken back) to what was
 * accepted, and the tokens go out. lg: the step's logits rows (NULL: picks only). */
static void take_checked(sched *s, sched_req *r, float *lg, const int32_t *picks) {
    sched_token t[1 + SPEC_MAX_DRAFT];
    finish_reason end = FINISH_NONE;
    int32_t n = 0, accepted = 0;
    for (int32_t i = 0; i <= r->n_draft; i++) {
        end = pick_token(s, r, lg ? lg + (size_t)i * (size_t)s->vocab : NULL, picks[i], &t[n++]);
        if (i == r->n_draft || t[n - 1].id != r->draft[i]) break;
        accepted++;
        if (end != FINISH_NONE) break;
    }
    spec_count(s->sp, r->n_draft, accepted);
    /* in the model: the history but its newest token (the rows past it were rejected) */
    char err[512];
    int32_t keep = r->n_prompt + r->n_gen - 1;
    r->fed = spec_rewind(s->e, r->seq, r->mark, keep, err, sizeof err);
    r->mark = NULL;
    r->n_draft = 0;
    if (r->fed < 0) {
        log_msg(LMH_LOG_ERROR, "after checking proposals: %s", err);
        drop_running(s, r);
        finish(s, r, FINISH_ERROR);
        return;
    }
    for (int32_t i = 0; i < n; i++) deliver(s, r, &t[i], i + 1 == n ? end : FINISH_NONE);
}

static int grow_logits(sched *s, int32_t rows) {
    size_t need = (size_t)rows * (size_t)s->vocab;
    if (need <= s->cap_logits) return 0;
    float *p = realloc(s->logits, need * sizeof *p);
    if (!p) return -1;
    s->logits = p;
    s->cap_logits = need;
    return 0;
}

/* One step: rows for every prefilled sequence (its token, the tokens a rewind left to feed
 * again, and its proposals), then prompt rows up to the chunk budget. Returns 0 when there
 * was nothing to do. Where the backend overlaps them, a step of greedy one-row decodes alone
 * is started and read at the next call (step_flight), which may start the one after it
 * first. */
static int step(sched *s) {
    if (s->n_flight) {
        step_flight(s);
        return 1;
    }
    flush_retired(s, 1);
    int32_t asked = propose(s);
    int32_t n = 0, n_out = 0, n_req = 0, n_drafts = 0, budget = s->chunk;
    for (int32_t i = 0; i < s->n_run; i++) {
        sched_req *r = s->run[i];
        if (r->n_done < r->n_prompt) continue;
        for (int32_t p = r->fed; p < r->n_prompt + r->n_gen; p++)
            s->rows[n++] = (engine_row){.seq = r->seq, .token = r->hist[p]};
        for (int32_t k = 0; k <= r->n_draft; k++) {
            s->outs[n_out] = n - 1 + k;
            s->out_req[n_out++] = r;
        }
        for (int32_t k = 0; k < r->n_draft; k++)
            s->rows[n++] = (engine_row){.seq = r->seq, .token = r->draft[k]};
        n_drafts += r->n_draft;
        s->step_req[n_req++] = r;
    }
    int32_t n_decode = n;
    budget -= n;
    if (budget < 16) budget = 16; /* prompts always progress, however many decode */
    for (int32_t i = 0; i < s->n_run && budget > 0; i++) {
        sched_req *r = s->run[i];
        if (r->n_done >= r->n_prompt) continue;
        int32_t take = r->n_prompt - r->n_done;
        if (take > budget) take = budget;
        for (int32_t j = 0; j < take; j++)
            s->rows[n++] = (engine_row){.seq = r->seq, .token = r->prompt[r->n_done + j]};
        r->n_done += take;
        budget -= take;
        if (r->n_done == r->n_prompt) {
            r->fed = r->n_prompt;
            s->outs[n_out] = n - 1;
            s->out_req[n_out++] = r;
            s->step_req[n_req++] = r;
        }
    }
    if (n == 0) return 0;
    char err[512];
    /* greedy requests without log-probabilities need their picks only: then only those
     * come back from the backend, not n_out rows of the vocabulary */
    int picks_only = n_out > 0;
    for (int32_t k = 0; k < n_out && picks_only; k++)
        picks_only = sampler_is_greedy(s->out_req[k]->smp) && s->out_req[k]->top_logprobs < 0 &&
                     !s->out_req[k]->gm && !s->out_req[k]->n_bias;
    /* started: one row and one pick a sequence, none that takes proposals (a chain of
     * started steps would go on without them) */
    int started = picks_only && n_decode == n && n_out == n && !n_drafts && !asked &&
                  engine_step_overlaps(s->e);
    int rc = !picks_only && grow_logits(s, n_out) ? LMH_ENOMEM : 0;
    if (rc) snprintf(err, sizeof err, "out of memory for %d rows of logits", n_out);
    while (rc == 0) {
        rc = started ? engine_step_start(s->e, s->rows, n, s->outs, n_out, 0, err, sizeof err)
                     : engine_step(s->e, s->rows, n, s->outs, n_out, picks_only ? NULL : s->logits,
                                   picks_only ? s->picks : NULL, err, sizeof err);
        /* the device is full: kept sequences give way to running ones (a model with
         * recurrent state may have moved on in the failed step: no second try there) */
        if (rc != LMH_ENOMEM || !s->cuts || !pc_parks(s->pc) || !pc_evict(s->pc)) break;
        log_msg(LMH_LOG_INFO, "out of device memory: a kept prefix gave way (%s)", err);
        rc = 0;
    }
    if (rc) {
        log_msg(LMH_LOG_ERROR, "step failed: %s", err);
        /* every sequence in the step is ended; the others go on */
        for (int32_t i = 0; i < s->n_run;) {
            int in = 0;
            for (int32_t j = 0; j < n && !in; j++) in = s->rows[j].seq == s->run[i]->seq;
            if (in) {
                finish(s, s->run[i], FINISH_ERROR);
                s->run[i] = s->run[--s->n_run];
            } else {
                i++;
            }
        }
        return 1;
    }
    s->steps++;
    if (started) {
        memcpy(s->flight[0], s->out_req, (size_t)n_out * sizeof *s->out_req);
        s->n_flight_rows[0] = n_out;
        s->n_flight = 1;
        return 1;
    }
    for (int32_t k = 0, q = 0; q < n_req; q++) {
        sched_req *r = s->step_req[q];
        float *lg = picks_only ? NULL : s->logits + (size_t)k * (size_t)s->vocab;
        if (r->n_gen == 0) { /* its prompt's last row */
            take_token(s, r, lg, s->picks[k]);
            k++;
        } else {
            int32_t outs = 1 + r->n_draft;
            take_checked(s, r, lg, s->picks + k);
            k += outs;
        }
    }
    return 1;
}

static void *thread_main(void *arg) {
    sched *s = arg;
    pthread_mutex_lock(&s->mu);
    for (;;) {
        if ((s->n_flight || s->n_ret) && s->n_run == 0) { /* every request in it has ended */
            pthread_mutex_unlock(&s->mu);
            while (s->n_flight) step_flight(s);
            flush_retired(s, 1);
            pthread_mutex_lock(&s->mu);
            pc_get_stats(s->pc, &s->pcst);
        }
        if (s->call_pending && s->n_run == 0) {
            /* the engine is idle: nothing is mid-sequence */
            pthread_mutex_unlock(&s->mu);
            /* what the call changes (a backend move) the kept states may not match */
            pc_clear(s->pc);
            int rc = s->call_fn(s->e, s->call_arg);
            engine_stats es;
            engine_get_stats(s->e, &es);
            pthread_mutex_lock(&s->mu);
            s->es = es;
            snprintf(s->chain, sizeof s->chain, "%s", engine_chain(s->e));
            snprintf(s->precision, sizeof s->precision, "%s", engine_precision(s->e));
            pc_get_stats(s->pc, &s->pcst);
            s->call_rc = rc;
            s->call_pending = 0;
            pthread_cond_broadcast(&s->call_done);
        }
        if (s->task_head) {
            /* between steps: none in flight (a task runs steps of its own) */
            pthread_mutex_unlock(&s->mu);
            while (s->n_flight) step_flight(s);
            pthread_mutex_lock(&s->mu);
            while (s->task_head) {
                struct task *t = s->task_head;
                s->task_head = t->next;
                if (!s->task_head) s->task_tail = NULL;
                pthread_mutex_unlock(&s->mu);
                t->fn(s->e, t->arg);
                free(t);
                pthread_mutex_lock(&s->mu);
            }
        }
        if (s->stop && !s->drain) {
            /* cancel everything still here */
            while (s->wait_head) {
                sched_req *r = s->wait_head;
                s->wait_head = r->qnext;
                s->n_wait--;
                r->emit(r, NULL, FINISH_CANCELLED, r->user);
            }
            for (int32_t i = 0; i < s->n_run; i++) finish(s, s->run[i], FINISH_CANCELLED);
            s->n_run = 0;
        }
        while (!s->call_pending && s->n_run < s->max_running && s->wait_head) {
            sched_req *r = s->wait_head;
            s->wait_head = r->qnext;
            if (!s->wait_head) s->wait_tail = NULL;
            s->n_wait--;
            pthread_mutex_unlock(&s->mu);
            int ok = admit(s, r) == 0;
            pthread_mutex_lock(&s->mu);
            if (ok) s->run[s->n_run++] = r;
        }
        s->n_run_pub = s->n_run;
        if (s->n_run == 0) {
            if (s->stop) break;
            if (!s->call_pending && !s->task_head) pthread_cond_wait(&s->cv, &s->mu);
            continue;
        }
        pthread_mutex_unlock(&s->mu);
        for (int32_t i = 0; i < s->n_run;) {
            if (atomic_load(&s->run[i]->cancel)) {
                finish(s, s->run[i], FINISH_CANCELLED);
                s->run[i] = s->run[--s->n_run];
            } else {
                i++;
            }
        }
        if (s->step_delay_ms > 0) {
            struct timespec ts = {s->step_delay_ms / 1000, (s->step_delay_ms % 1000) * 1000000L};
            nanosleep(&ts, NULL);
        }
        step(s);
        engine_stats es;
        engine_get_stats(s->e, &es);
        pthread_mutex_lock(&s->mu);
        s->cache_bytes = es.cache_bytes;
        s->es = es;
        pc_get_stats(s->pc, &s->pcst);
        spec_get_stats(s->sp, &s->spst);
        s->con_tokens_pub = s->con_tokens;
        s->con_s_pub = s->con_s;
        s->n_run_pub = s->n_run;
    }
    pthread_mutex_unlock(&s->mu);
    while (s->n_flight) step_flight(s); /* requests cancelled at the stop */
    flush_retired(s, 0);
    return NULL;
}

/* Whether every layer's state can be cut back to any length: keys and values of full
 * attention, no recurrent state, no sliding window. */
static int states_cut(const engine *e) {
    for (int32_t l = 0; l < engine_n_layers(e); l++) {
        const lmh_recurrent_state *rs = engine_layer_recurrent(e, l);
        const lmh_layer_state *ls = engine_layer_state(e, l);
        if ((rs && rs->n_bufs > 0) || (ls && ls->window > 0)) return 0;
    }
    return 1;
}

sched *sched_new(engine *e, int32_t max_running, int32_t max_waiting, int32_t chunk,
                 uint64_t prefix_bytes, int park, spec *sp) {
    sched *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    s->e = e;
    if (prefix_bytes && !(s->pc = pc_new(prefix_bytes, states_cut(e), park ? e : NULL))) {
        free(s);
        return NULL;
    }
    pc_get_stats(s->pc, &s->pcst);
    s->sp = sp;
    s->cuts = spec_target_cuts(e);
    s->vocab = engine_vocab(e);
    s->max_running = max_running > 0 ? max_running : 1;
    s->max_waiting = max_waiting >= 0 ? max_waiting : 0;
    char dv[32];
    if (lmh_debug_get("step-delay-ms", dv, sizeof dv)) s->step_delay_ms = atol(dv);
    s->chunk = chunk > 16 ? chunk : 16;
    /* a decoding request's rows: its token and proposals, or what a rewind left to feed */
    size_t rows = (size_t)s->max_running * (1 + (size_t)spec_draft_max(sp)) + (size_t)s->chunk;
    s->run = calloc((size_t)s->max_running, sizeof *s->run);
    s->rows = malloc(rows * sizeof *s->rows);
    s->outs = malloc(rows * sizeof *s->outs);
    s->picks = malloc(rows * sizeof *s->picks);
    for (int f = 0; f < ENGINE_MAX_PENDING; f++)
        s->flight[f] = malloc((size_t)s->max_running * sizeof **s->flight);
    s->out_req = malloc(rows * sizeof *s->out_req);
    s->step_req = malloc(rows * sizeof *s->step_req);
    s->ask_req = malloc((size_t)s->max_running * sizeof *s->ask_req);
    s->asks = malloc((size_t)s->max_running * sizeof *s->asks);
    s->cap_logits = (size_t)s->max_running * (size_t)s->vocab * 2;
    s->logits = malloc(s->cap_logits * sizeof(float));
    s->lsm = malloc((size_t)s->vocab * sizeof(float));
    s->mask = malloc(((size_t)s->vocab + 31) / 32 * sizeof(uint32_t));
    engine_get_stats(e, &s->es);
    snprintf(s->chain, sizeof s->chain, "%s", engine_chain(e));
    snprintf(s->precision, sizeof s->precision, "%s", engine_precision(e));
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    pthread_cond_init(&s->call_done, NULL);
    if (!s->run || !s->rows || !s->outs || !s->picks || !s->out_req || !s->logits || !s->lsm ||
        !s->mask || !s->step_req || !s->ask_req || !s->asks || !s->flight[0] || !s->flight[1] ||
        pthread_create(&s->th, NULL, thread_main, s) != 0) {
        for (int f = 0; f < ENGINE_MAX_PENDING; f++) free(s->flight[f]);
        free(s->run);
        free(s->rows);
        free(s->outs);
        free(s->picks);
        free(s->out_req);
        free(s->step_req);
        free(s->ask_req);
        free(s->asks);
        free(s->logits);
        free(s->lsm);
        free(s->mask);
        pc_free(s->pc);
        free(s);
        return NULL;
    }
    return s;
}

void sched_free(sched *s, int drain) {
    if (!s) return;
    pthread_mutex_lock(&s->mu);
    s->stop = 1;
    s->drain = drain;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
    pthread_join(s->th, NULL);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    pthread_cond_destroy(&s->call_done);
    free(s->run);
    free(s->rows);
    free(s->outs);
    free(s->picks);
    for (int f = 0; f < ENGINE_MAX_PENDING; f++) free(s->flight[f]);
    free(s->out_req);
    free(s->step_req);
    free(s->ask_req);
    free(s->asks);
    free(s->logits);
    free(s->lsm);
    free(s->mask);
    pc_free(s->pc);
    free(s->ret);
    free(s);
}

int sched_submit(sched *s, sched_req *r) {
    pthread_mutex_lock(&s->mu);
    int free_slots = s->max_running - s->n_run_pub;
    if (s->stop || s->n_wait >= s->max_waiting + (free_slots > 0 ? free_slots : 0)) {
        pthread_mutex_unlock(&s->mu);
        return -1;
    }
    atomic_store(&r->cancel, 0);
    r->qnext = NULL;
    if (s->wait_tail)
        s->wait_tail->qnext = r;
    else
        s->wait_head = r;
    s->wait_tail = r;
    s->n_wait++;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
    return 0;
}

void sched_get_stats(sched *s, sched_stats *st) {
    pthread_mutex_lock(&s->mu);
    st->running = s->n_run_pub;
    st->waiting = s->n_wait;
    st->cache_bytes = s->cache_bytes;
    st->steps = s->steps;
    st->engine = s->es;
    snprintf(st->chain, sizeof st->chain, "%s", s->chain);
    snprintf(st->precision, sizeof st->precision, "%s", s->precision);
    st->prefix = s->pcst;
    st->spec = spec_get_kind(s->sp);
    st->spec_st = s->spst;
    st->constrained_tokens = s->con_tokens_pub;
    st->mask_seconds = s->con_s_pub;
    pthread_mutex_unlock(&s->mu);
}

int sched_task(sched *s, void (*fn)(engine *e, void *arg), void *arg) {
    struct task *t = malloc(sizeof *t);
    if (!t) return -1;
    *t = (struct task){.fn = fn, .arg = arg};
    pthread_mutex_lock(&s->mu);
    if (s->stop) {
        pthread_mutex_unlock(&s->mu);
        free(t);
        return -1;
    }
    if (s->task_tail)
        s->task_tail->next = t;
    else
        s->task_head = t;
    s->task_tail = t;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
    return 0;
}

int sched_call(sched *s, int (*fn)(engine *e, void *arg), void *arg) {
    pthread_mutex_lock(&s->mu);
    while (s->call_pending) pthread_cond_wait(&s->call_done, &s->mu);
    s->call_fn = fn;
    s->call_arg = arg;
    s->call_pending = 1;
    pthread_cond_signal(&s->cv);
    while (s->call_pending) pthread_cond_wait(&s->call_done, &s->mu);
    int rc = s->call_rc;
    pthread_mutex_unlock(&s->mu);
    return rc;
}
