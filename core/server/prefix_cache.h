/* The prefix cache: sequences' states (keys and values, recurrent state) kept after their
 * requests end, indexed by the token ids they hold, so that a request whose prompt starts
 * with one of them restores it and prefills only the rest. Chat clients resend the whole
 * conversation every turn; agents resend one long system prompt.
 *
 * Two ways to keep a state. Where the model computes in host memory, as a snapshot there
 * (engine_seq_snapshot): a hit copies it into the new sequence and the entry stays for
 * others. On a device, where such copies cross to the host and cost more than prefill, the
 * ended sequence itself stays alive in the device's cache ("parked"): a hit hands it to the
 * new request, which continues it in place (no copy; the entry goes, and comes back longer
 * when that request ends: a conversation's next turn). Parked entries are sequences of the
 * engine given to pc_new; dropping one removes its sequence.
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

#include "engine.h"

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

/* budget: bytes kept at most (0: none kept); cut: whether states can be cut back to any
 * shorter length (no recurrent state, no sliding window); park: the engine whose ended
 * sequences are kept in place (NULL: snapshots). */
prefix_cache *pc_new(uint64_t budget, int cut, engine *park);
void pc_free(prefix_cache *pc);
/* Forgets every entry (after the engine changed: a backend move). */
void pc_clear(prefix_cache *pc);

/* What serves a prompt: a snapshot to restore (the entry stays), or a parked sequence to
 * continue (seq; the entry is gone, the sequence now the caller's), and how many of its
 * tokens to keep (use: at least PC_MIN_TOKENS, at most n - 1: the last prompt token is
 * always computed, for its logits). */
typedef struct pc_hit {
    const engine_snapshot *sn;
    uint64_t seq;
    int32_t use;
} pc_hit;
/* The entry for a prompt tok[0..n) in cache `cache`: 1 with *hit set, 0 when none serves.
 * Counts a hit or a miss. */
int pc_find(prefix_cache *pc, int cache, const int32_t *tok, int32_t n, pc_hit *hit);
/* Keeps sn, the state of a sequence in cache `cache` holding tok[0..engine_snapshot_len(sn)),
 * taking it over (freed now when it cannot be kept). Entries it makes redundant go. */
void pc_insert(prefix_cache *pc, int cache, const int32_t *tok, engine_snapshot *sn);
/* Parks sequence seq of cache `cache`, holding tok[0..n) in bytes of device memory: the
 * cache takes it over (removes it now when it cannot be kept). Entries it makes redundant
 * go. */
void pc_park(prefix_cache *pc, int cache, const int32_t *tok, int32_t n, uint64_t seq,
             uint64_t bytes);
/* Whether entries are parked sequences (pc_new's park). */
int pc_parks(const prefix_cache *pc);
/* Drops the least recently used entry (memory ran out elsewhere); 0 when there was none. */
int pc_evict(prefix_cache *pc);
void pc_get_stats(const prefix_cache *pc, pc_stats *st);

#endif
