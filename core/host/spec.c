#include "spec.h"
#include "log.h"
#include "plugin_loader.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Prompt lookup matches the last NGRAM_MAX tokens first, then shorter suffixes down to
 * NGRAM_MIN: a single token matches almost anywhere and proposes noise. */
#define NGRAM_MAX 4
#define NGRAM_MIN 2

/* A sequence in the draft model: hist[0..fed) went in and holds; prop[0..n_prop) went in
 * after them last time (proposals, maybe rejected since); mark is the draft's state at fed
 * where it cannot be cut back. broken: the draft failed it, no more proposals. */
typedef struct dseq {
    uint64_t id;
    int32_t fed, n_prop;
    int32_t *prop;
    engine_snapshot *mark;
    int broken;
} dseq;

struct spec {
    spec_kind kind;
    int32_t draft_max, chunk, target_vocab;
    engine *draft;
    int draft_cuts;
    dseq *seqs;
    int32_t n_seqs, cap_seqs;
    /* a draft step's buffers: chunk + one row an ask */
    engine_row *rows;
    int32_t *outs, *picks, *who, cap_rows;
    spec_stats st;
};

int spec_target_cuts(const engine *e) {
    for (int32_t l = 0; l < engine_n_layers(e); l++) {
        const lmh_recurrent_state *rs = engine_layer_recurrent(e, l);
        if (rs && rs->n_bufs > 0) return 0;
    }
    return 1;
}

spec *spec_new(spec_kind kind, int32_t draft_max, engine *draft, int32_t chunk,
               int32_t target_vocab) {
    if (kind == SPEC_OFF || draft_max < 1 || draft_max > SPEC_MAX_DRAFT ||
        (kind == SPEC_DRAFT && !draft))
        return NULL;
    spec *sp = calloc(1, sizeof *sp);
    if (!sp) return NULL;
    sp->kind = kind;
    sp->draft_max = draft_max;
    sp->draft = kind == SPEC_DRAFT ? draft : NULL;
    sp->chunk = chunk > 0 ? chunk : 256;
    sp->target_vocab = target_vocab;
    sp->draft_cuts = sp->draft ? spec_target_cuts(sp->draft) : 1;
    return sp;
}

static void dseq_drop(spec *sp, int32_t i) {
    dseq *d = &sp->seqs[i];
    engine_seq_remove(sp->draft, d->id);
    engine_snapshot_free(d->mark);
    free(d->prop);
    sp->seqs[i] = sp->seqs[--sp->n_seqs];
}

void spec_free(spec *sp) {
    if (!sp) return;
    while (sp->n_seqs) dseq_drop(sp, sp->n_seqs - 1);
    free(sp->seqs);
    free(sp->rows);
    free(sp->outs);
    free(sp->picks);
    free(sp->who);
    free(sp);
}

spec_kind spec_get_kind(const spec *sp) {
    return sp ? sp->kind : SPEC_OFF;
}

int32_t spec_draft_max(const spec *sp) {
    return sp ? sp->draft_max : 0;
}

void spec_count(spec *sp, int32_t drafted, int32_t accepted) {
    if (!sp || drafted <= 0) return;
    sp->st.steps++;
    sp->st.drafted += (uint64_t)drafted;
    sp->st.accepted += (uint64_t)accepted;
}

void spec_get_stats(const spec *sp, spec_stats *st) {
    if (sp)
        *st = sp->st;
    else
        memset(st, 0, sizeof *st);
}

/* ---- prompt lookup -------------------------------------------------------------------- */

/* The tokens after the latest earlier occurrence of the history's last g tokens, longest g
 * first. Past the history's end the copy goes on from what it proposed (as an LZ77 match
 * overlaps itself): a loop of period p repeats in full, not just its last p tokens. */
static void ngram_propose(spec_ask *a) {
    a->n_out = 0;
    for (int32_t g = NGRAM_MAX; g >= NGRAM_MIN && a->n_out == 0; g--) {
        if (a->n <= g) continue;
        const int32_t *tail = a->hist + a->n - g;
        for (int32_t j = a->n - g - 1; j >= 0; j--) {
            if (a->hist[j] != tail[0] || memcmp(a->hist + j, tail, (size_t)g * sizeof *tail))
                continue;
            int32_t from = j + g;
            for (int32_t i = 0; i < a->max; i++)
                a->out[i] = from + i < a->n ? a->hist[from + i] : a->out[from + i - a->n];
            a->n_out = a->max;
            break;
        }
    }
}

/* ---- the draft model ------------------------------------------------------------------ */

static dseq *dseq_get(spec *sp, uint64_t id) {
    for (int32_t i = 0; i < sp->n_seqs; i++)
        if (sp->seqs[i].id == id) return &sp->seqs[i];
    if (sp->n_seqs == sp->cap_seqs) {
        int32_t cap = sp->cap_seqs ? 2 * sp->cap_seqs : 8;
        dseq *p = realloc(sp->seqs, (size_t)cap * sizeof *p);
        if (!p) return NULL;
        sp->seqs = p;
        sp->cap_seqs = cap;
    }
    int32_t *prop = malloc((size_t)sp->draft_max * sizeof *prop);
    if (!prop || engine_seq_add(sp->draft, id) != 0) {
        free(prop);
        return NULL;
    }
    sp->seqs[sp->n_seqs] = (dseq){.id = id, .prop = prop};
    return &sp->seqs[sp->n_seqs++];
}

void spec_seq_end(spec *sp, uint64_t seq) {
    for (int32_t i = 0; sp && i < sp->n_seqs; i++)
        if (sp->seqs[i].id == seq) {
            dseq_drop(sp, i);
            return;
        }
}

/* The draft sequence back to a clean start (after a failure to rewind it). */
static void dseq_reset(spec *sp, dseq *d) {
    engine_snapshot_free(d->mark);
    d->mark = NULL;
    d->n_prop = 0;
    d->fed = 0;
    if (engine_seq_trim(sp->draft, d->id, 0) != 0) d->broken = 1;
}

/* Takes the draft sequence to what the target accepted of last time's proposals: the
 * history now continues hist[0..fed) with some prefix of them. */
static void dseq_settle(spec *sp, dseq *d, const int32_t *hist, int32_t n) {
    char err[256];
    if (d->fed > n) { /* not this history's (cannot happen while the caller keeps to it) */
        dseq_reset(sp, d);
        return;
    }
    int32_t m = 0;
    while (m < d->n_prop && d->fed + m < n && d->prop[m] == hist[d->fed + m]) m++;
    if (m == d->n_prop)
        d->fed += m;
    else if (sp->draft_cuts) {
        if (engine_seq_trim(sp->draft, d->id, d->fed + m) == 0)
            d->fed += m;
        else
            dseq_reset(sp, d);
    } else if (!d->mark || engine_seq_restore(sp->draft, d->id, d->mark, err, sizeof err) != 0) {
        dseq_reset(sp, d);
    }
    d->n_prop = 0;
    engine_snapshot_free(d->mark);
    d->mark = NULL;
}

static int grow_rows(spec *sp, int32_t need) {
    if (need <= sp->cap_rows) return 0;
    engine_row *r = realloc(sp->rows, (size_t)need * sizeof *r);
    if (r) sp->rows = r;
    int32_t *o = realloc(sp->outs, (size_t)need * sizeof *o);
    if (o) sp->outs = o;
    int32_t *p = realloc(sp->picks, (size_t)need * sizeof *p);
    if (p) sp->picks = p;
    int32_t *w = realloc(sp->who, (size_t)need * sizeof *w);
    if (w) sp->who = w;
    if (!r || !o || !p || !w) return -1;
    sp->cap_rows = need;
    return 0;
}

/* A draft step failed: its sequences get no proposals now and none later. */
static void draft_failed(spec *sp, spec_ask *asks, const int32_t *who, int32_t n, const char *err) {
    log_msg(LMH_LOG_WARN, "draft model step failed (%s): those sequences decode without it", err);
    for (int32_t i = 0; i < n; i++) {
        spec_ask *a = &asks[who[i]];
        dseq *d = dseq_get(sp, a->seq);
        if (d) d->broken = 1;
        a->max = 0;
        a->n_out = 0;
    }
}

static void draft_propose(spec *sp, spec_ask *asks, int32_t n_asks) {
    char err[512];
    if (grow_rows(sp, sp->chunk + n_asks)) return;
    /* what each sequence has to take in first: the history since what the draft holds */
    int32_t *done = calloc((size_t)n_asks, sizeof *done);
    dseq **ds = calloc((size_t)n_asks, sizeof *ds);
    if (!done || !ds) goto out;
    for (int32_t i = 0; i < n_asks; i++) {
        spec_ask *a = &asks[i];
        a->n_out = 0;
        if (a->max < 1 || a->n < 1) continue;
        dseq *d = dseq_get(sp, a->seq);
        if (!d || d->broken) {
            a->max = 0;
            continue;
        }
        dseq_settle(sp, d, a->hist, a->n);
        if (d->broken || d->fed >= a->n) { /* the newest token is never in yet */
            a->max = 0;
            continue;
        }
        ds[i] = d;
    }
    /* the catch-up: every sequence's new tokens, chunk rows a step at most, the last row of
     * each its first proposal */
    for (;;) {
        int32_t n = 0, n_out = 0;
        for (int32_t i = 0; i < n_asks && n < sp->chunk; i++) {
            if (!ds[i] || done[i]) continue;
            dseq *d = ds[i];
            int32_t take = asks[i].n - d->fed, room = sp->chunk - n;
            if (take > room) take = room;
            for (int32_t j = 0; j < take; j++)
                sp->rows[n++] = (engine_row){.seq = d->id, .token = asks[i].hist[d->fed + j]};
            d->fed += take;
            if (d->fed == asks[i].n) {
                done[i] = 1;
                sp->outs[n_out] = n - 1;
                sp->who[n_out++] = i;
            }
        }
        if (n == 0) break;
        if (engine_step(sp->draft, sp->rows, n, sp->outs, n_out, NULL, sp->picks, err,
                        sizeof err)) {
            int32_t all = 0;
            for (int32_t i = 0; i < n_asks; i++)
                if (ds[i]) sp->who[all++] = i;
            draft_failed(sp, asks, sp->who, all, err);
            goto out;
        }
        for (int32_t k = 0; k < n_out; k++) {
            spec_ask *a = &asks[sp->who[k]];
            if (sp->picks[k] < 0 || sp->picks[k] >= sp->target_vocab) {
                a->max = 0;
                continue;
            }
            a->out[a->n_out++] = sp->picks[k];
        }
    }
    /* where the draft cannot be cut back, its state before the proposals go in */
    for (int32_t i = 0; i < n_asks && !sp->draft_cuts; i++)
        if (ds[i] && asks[i].n_out > 0 && asks[i].max > 1 &&
            !(ds[i]->mark = engine_seq_snapshot(sp->draft, ds[i]->id, 0, err, sizeof err)))
            asks[i].max = 1;
    /* then one token a step for each sequence that wants more */
    for (;;) {
        int32_t n = 0;
        for (int32_t i = 0; i < n_asks; i++) {
            spec_ask *a = &asks[i];
            if (!ds[i] || a->n_out == 0 || a->n_out >= a->max) continue;
            sp->rows[n] = (engine_row){.seq = ds[i]->id, .token = a->out[a->n_out - 1]};
            sp->outs[n] = n;
            sp->who[n++] = i;
        }
        if (n == 0) break;
        if (engine_step(sp->draft, sp->rows, n, sp->outs, n, NULL, sp->picks, err, sizeof err)) {
            /* the proposals so far stand; those sequences draft no more */
            log_msg(LMH_LOG_WARN, "draft model step failed: %s", err);
            for (int32_t k = 0; k < n; k++) {
                asks[sp->who[k]].max = asks[sp->who[k]].n_out;
                ds[sp->who[k]]->broken = 1;
            }
            break;
        }
        for (int32_t k = 0; k < n; k++) {
            spec_ask *a = &asks[sp->who[k]];
            dseq *d = ds[sp->who[k]];
            d->prop[d->n_prop++] = sp->rows[k].token; /* in the draft now, past d->fed */
            if (sp->picks[k] < 0 || sp->picks[k] >= sp->target_vocab)
                a->max = a->n_out; /* outside the target's vocabulary: proposals end */
            else
                a->out[a->n_out++] = sp->picks[k];
        }
    }
out:
    free(done);
    free(ds);
}

void spec_propose(spec *sp, spec_ask *asks, int32_t n) {
    if (!sp) {
        for (int32_t i = 0; i < n; i++) asks[i].n_out = 0;
        return;
    }
    for (int32_t i = 0; i < n; i++) {
        if (asks[i].max > sp->draft_max) asks[i].max = sp->draft_max;
        asks[i].n_out = 0;
    }
    if (sp->kind == SPEC_NGRAM) {
        for (int32_t i = 0; i < n; i++)
            if (asks[i].max > 0) ngram_propose(&asks[i]);
        return;
    }
    draft_propose(sp, asks, n);
}

/* ---- the target ----------------------------------------------------------------------- */

engine_snapshot *spec_mark(engine *e, uint64_t seq, char *err, size_t err_len) {
    return engine_seq_snapshot(e, seq, 0, err, err_len);
}

int32_t spec_rewind(engine *e, uint64_t seq, engine_snapshot *mark, int32_t len, char *err,
                    size_t err_len) {
    int32_t at = len;
    if (engine_seq_len(e, seq) <= len) {
        at = len; /* everything that went in was accepted */
    } else if (mark) {
        at = engine_seq_restore(e, seq, mark, err, err_len) == 0 ? engine_snapshot_len(mark) : -1;
    } else {
        int rc = engine_seq_trim(e, seq, len);
        if (rc) {
            snprintf(err, err_len, "cutting sequence %llu back to %d positions failed (error %d)",
                     (unsigned long long)seq, len, rc);
            at = -1;
        }
    }
    engine_snapshot_free(mark);
    return at;
}

/* ---- one sequence's loop -------------------------------------------------------------- */

int spec_decode(spec *sp, engine *e, uint64_t seq, sampler *s, float *lg, int32_t *hist,
                int32_t *nh, int32_t maxn, const int32_t *eos, int32_t n_eos,
                void (*emit)(int32_t token, int32_t index, void *user), void *user, int32_t *steps,
                char *err, size_t err_len) {
    const int32_t V = engine_vocab(e), K = spec_draft_max(sp);
    const int greedy = sampler_is_greedy(s), cuts = spec_target_cuts(e);
    float *lgs = greedy ? NULL : malloc((size_t)(K + 1) * (size_t)V * sizeof *lgs);
    int32_t *picks = malloc((size_t)(K + 1) * sizeof *picks),
            *outs = malloc((size_t)(K + 1) * sizeof *outs),
            *draft = malloc((size_t)(K > 0 ? K : 1) * sizeof *draft);
    engine_row *rows = malloc((size_t)(2 * K + 2) * sizeof *rows);
    int rc = 0;
    int32_t fed = *nh, produced = 0;
    engine_snapshot *mark = NULL; /* the state before the proposals, where it cannot be cut */
    *steps = 0;
    if ((!greedy && !lgs) || !picks || !outs || !draft || !rows) {
        snprintf(err, err_len, "out of memory");
        rc = -1;
    }
    for (int stop = 0, k = 0, first = 1; rc == 0 && maxn > 0;) {
        int32_t acc = 0; /* proposals the picks took */
        for (int32_t i = 0; i <= k; i++) {
            int32_t x = first    ? sampler_sample(s, lg, hist, *nh)
                        : greedy ? picks[i]
                                 : sampler_sample(s, lgs + (size_t)i * (size_t)V, hist, *nh);
            first = 0;
            hist[(*nh)++] = x;
            emit(x, produced++, user);
            for (int32_t j = 0; j < n_eos; j++) stop |= x == eos[j];
            if (produced == maxn) stop = 1;
            if (i == k || x != draft[i]) break;
            acc++;
            if (stop) break;
        }
        spec_count(sp, k, acc);
        /* in the model now: the history but its newest token */
        if (*steps) {
            fed = spec_rewind(e, seq, mark, *nh - 1, err, err_len);
            mark = NULL;
            if (fed < 0) {
                rc = -1;
                break;
            }
        }
        if (stop) break;
        /* proposals, unless a rewind left tokens to feed again (then a plain step first) */
        spec_ask a = {.seq = seq, .hist = hist, .n = *nh, .max = maxn - produced - 1, .out = draft};
        a.n_out = 0;
        if (a.max > 0 && fed == *nh - 1) spec_propose(sp, &a, 1);
        k = a.n_out;
        if (k && !cuts && !(mark = spec_mark(e, seq, err, err_len))) k = 0;
        int32_t n = 0;
        for (int32_t p = fed; p < *nh; p++) rows[n++] = (engine_row){.seq = seq, .token = hist[p]};
        for (int32_t i = 0; i <= k; i++) outs[i] = n - 1 + i;
        for (int32_t i = 0; i < k; i++) rows[n++] = (engine_row){.seq = seq, .token = draft[i]};
        if (engine_step(e, rows, n, outs, k + 1, lgs, greedy ? picks : NULL, err, err_len)) {
            rc = -1;
            break;
        }
        (*steps)++;
    }
    engine_snapshot_free(mark);
    free(lgs);
    free(picks);
    free(outs);
    free(draft);
    free(rows);
    return rc;
}

int spec_open(const spec_opts *so, const engine_opts *to, registry *reg, engine *target,
              int32_t chunk, spec **sp, engine **draft, char *err, size_t errlen) {
    *sp = NULL;
    *draft = NULL;
    if (so->kind == SPEC_OFF) return 0;
    if (so->kind == SPEC_DRAFT) {
        engine_opts d = *to;
        d.model_dir = so->draft_model;
        if (so->draft_backend) d.backend = so->draft_backend;
        d.gpu_layers = -1;
        if (d.n_devices) d.device = d.devices[0]; /* a draft is small: whole on the first */
        d.n_devices = 0;
        d.stream_experts = 0; /* a draft is small: its experts load as any weight */
        d.expert_cache_bytes = 0;
        d.moe_top_k = 0;
        char why[1536];
        if (!(*draft = engine_open(reg, &d, why, sizeof why))) {
            snprintf(err, errlen, "draft model: %s", why);
            return 1;
        }
        int32_t vt = engine_vocab(target), vd = engine_vocab(*draft);
        if (vt != vd)
            log_msg(LMH_LOG_WARN,
                    "the draft model's vocabulary has %d entries, the target's %d: proposals "
                    "only count where both models share a tokenizer",
                    vd, vt);
        log_msg(LMH_LOG_INFO, "speculative decoding: draft model %s (%s), up to %d tokens a step",
                so->draft_model, engine_chain(*draft), (int)so->draft_max);
    }
    *sp = spec_new(so->kind, so->draft_max, *draft, chunk, engine_vocab(target));
    if (!*sp) {
        snprintf(err, errlen, "out of memory");
        engine_close(*draft);
        *draft = NULL;
        return 1;
    }
    return 0;
}
