/* The prefix cache: sequences' states (keys and values, recurrent state) kept in host
 * memory after their requests end, indexed by the token ids they hold, so that a request
 * whose prompt starts with one of them restores it and prefills only the rest. Chat clients
 * resend the whole conversation every turn; agents resend one long system prompt.
 *
 * It works for every cache format (the snapshots are the cache plugins' own state_save) and
 * for every family: where a state can be cut back (keys and values of full attention) any
 * common prefix of an entry is used; where it cannot (recurrent state, sliding windows) only
 * an entry the prompt extends whole. Entries are found by the hash of their first block of
 * tokens, then compared token by token; the least recently used go first past the budget.
 * Not thread-safe: the scheduler's engine thread owns it (the counters are read under the
 * scheduler's lock). */
#ifndef LMHOST_PREFIX_CACHE_H
#define LMHOST_PREFIX_CACHE_H
#include <stdint.h>

#include "../engine.h"

/* Tokens a reuse must save at least (shorter prefixes are cheaper to prefill again). */
#define PC_MIN_TOKENS 16

typedef struct pc_stats {
    uint64_t hits, misses;  /* lookups that restored an entry, and those that found none */
    uint64_t reused_tokens; /* prompt tokens taken from entries rather than prefilled */
    uint64_t inserts, evictions;
    uint64_t bytes, budget; /* held now, and the most it may hold */
    uint64_t entries;
} pc_stats;

typedef struct prefix_cache prefix_cache;

/* budget: bytes of snapshots kept at most (0: none kept); cut: whether states can be cut
 * back to any shorter length (no recurrent state, no sliding window). */
prefix_cache *pc_new(uint64_t budget, int cut);
void pc_free(prefix_cache *pc);
/* Forgets every entry (after the engine changed: a backend move). */
void pc_clear(prefix_cache *pc);

/* The entry to restore for a prompt tok[0..n) in cache `cache`, and in *use how many of its
 * tokens to keep (at least PC_MIN_TOKENS, at most n - 1: the last prompt token is always
 * computed, for its logits); NULL when none serves. Counts a hit or a miss. */
const engine_snapshot *pc_find(prefix_cache *pc, int cache, const int32_t *tok, int32_t n,
                               int32_t *use);
/* Keeps sn, the state of a sequence in cache `cache` holding tok[0..engine_snapshot_len(sn)),
 * taking it over (freed now when it cannot be kept). Entries it makes redundant go. */
void pc_insert(prefix_cache *pc, int cache, const int32_t *tok, engine_snapshot *sn);
void pc_get_stats(const prefix_cache *pc, pc_stats *st);

#endif
