/* Speculative decoding: tokens proposed cheaply for a sequence, which the target model then
 * checks in one step of 1 + k rows (the sequence's newest token and the k proposals).
 *
 * Proposals come from a drafter: prompt lookup (the tokens that followed the latest earlier
 * occurrence of the sequence's last n-gram) or a draft model (a smaller model of the same
 * tokenizer, greedy, in an engine of its own, on any backend). Proposals are deterministic,
 * so the rule that keeps the target's output distribution is the simplest one: at each
 * checked row the target's own sampler picks a token as it would without speculation; a
 * proposal is accepted while it equals that pick, and the first pick that differs ends the
 * step. Every emitted token is the target's pick from the target's logits at its position,
 * drawn with the same random draws as without speculation: greedy output is identical, and
 * a seeded sampled run gives the same tokens too (where logits do not depend on the rows of
 * a step: the CPU's batch invariance).
 *
 * After the check, the target's positions past the last accepted token are cut back
 * (engine_seq_trim); a model with recurrent state, which cannot be cut back, is taken back to
 * a snapshot made before the step (spec_mark) and fed the accepted tokens again in its next
 * step. Not thread-safe: the caller's engine thread only. */
#ifndef LMHOST_SPEC_H
#define LMHOST_SPEC_H

#include <stdint.h>
#include "engine.h"
#include "sampler.h"

typedef enum spec_kind { SPEC_OFF = 0, SPEC_NGRAM, SPEC_DRAFT } spec_kind;

/* The most tokens proposed a step (--draft-max's bound). */
#define SPEC_MAX_DRAFT 64

typedef struct spec spec;

/* A drafter proposing at most draft_max tokens a step. SPEC_DRAFT proposes with `draft`
 * (the caller's: open and close it around spec_new/spec_free), whose prompts go in steps of
 * at most `chunk` rows. target_vocab bounds what may be proposed. */
spec *spec_new(spec_kind kind, int32_t draft_max, engine *draft, int32_t chunk,
               int32_t target_vocab);
void spec_free(spec *sp);
spec_kind spec_get_kind(const spec *sp);

/* A drafter as asked for (the CLI's --spec, --draft-model, --draft-max, --draft-backend). */
typedef struct spec_opts {
    spec_kind kind;
    int32_t draft_max;         /* 1..SPEC_MAX_DRAFT */
    const char *draft_model;   /* SPEC_DRAFT: the draft model's directory */
    const char *draft_backend; /* NULL: the target's */
} spec_opts;

struct registry;
/* Opens what `so` asks for, for `target` (opened with `to`): a draft model opens with to's
 * options but its own directory and backend, whole on that backend (the target's
 * --gpu-layers split is its own), its plugins from reg. *sp stays NULL when speculation is
 * off; *draft is the draft engine, to close after spec_free. Returns 0, or 1 with err. */
int spec_open(const spec_opts *so, const engine_opts *to, struct registry *reg, engine *target,
              int32_t chunk, spec **sp, engine **draft, char *err, size_t errlen);
int32_t spec_draft_max(const spec *sp);

/* One sequence to propose for: its tokens hist[0..n) (prompt and output so far, the last one
 * not yet fed to the target), at most max proposals. spec_propose writes up to max tokens
 * into out and their count into n_out. */
typedef struct spec_ask {
    uint64_t seq;
    const int32_t *hist;
    int32_t n, max;
    int32_t *out;
    int32_t n_out;
} spec_ask;

/* Proposals for n asks at once (a draft model decodes them together). A draft model that
 * fails leaves those sequences without proposals: they decode as without speculation. */
void spec_propose(spec *sp, spec_ask *asks, int32_t n);
/* The sequence ended: the drafter forgets it (the draft model's sequence goes). */
void spec_seq_end(spec *sp, uint64_t seq);

/* Counters over the drafter's life: steps that checked proposals for a sequence, tokens
 * proposed, and those accepted. Tokens per checked step: (steps + accepted) / steps. */
typedef struct spec_stats {
    uint64_t steps, drafted, accepted;
} spec_stats;
void spec_count(spec *sp, int32_t drafted, int32_t accepted);
void spec_get_stats(const spec *sp, spec_stats *st);

/* The target's side. Whether the target model can be cut back to any length (no recurrent
 * state); where not, spec_mark before a step with proposals and spec_rewind after it. */
int spec_target_cuts(const engine *e);
/* The target sequence's state now, for a model that cannot be cut back (NULL on failure,
 * with err set: then the step goes without proposals). */
engine_snapshot *spec_mark(engine *e, uint64_t seq, char *err, size_t err_len);
/* Keeps positions [0, len) of the target sequence after a step with proposals: cut back,
 * or (mark given) back to the mark, whose length it returns: the caller feeds the tokens
 * from there again. -1 on failure (err set). Frees the mark. */
int32_t spec_rewind(engine *e, uint64_t seq, engine_snapshot *mark, int32_t len, char *err,
                    size_t err_len);

/* One sequence's decode loop with proposals (generate and bench use it): sequence seq of
 * e holds hist[0..*nh) (a prefilled prompt), lg the logits of its last position. Up to maxn
 * tokens are picked by s and appended to hist (room for maxn more), each handed to
 * emit(token, index, user) as it is taken; an id in eos[0..n_eos) ends it. Each target step
 * feeds the newest token (and what a rewind left to feed again) and the proposals after it,
 * and takes the picks along them while they agree. *steps counts the target's steps. Returns
 * 0, or -1 with err set. */
int spec_decode(spec *sp, engine *e, uint64_t seq, sampler *s, float *lg, int32_t *hist,
                int32_t *nh, int32_t maxn, const int32_t *eos, int32_t n_eos,
                void (*emit)(int32_t token, int32_t index, void *user), void *user, int32_t *steps,
                char *err, size_t err_len);

#endif
