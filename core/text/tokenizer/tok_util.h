/* Internal helpers of the tokenizer: growable buffers, a string arena, open-addressing hash
 * maps and UTF-8 utilities. Not part of the public API. */
#ifndef LMHOST_TOK_UTIL_H
#define LMHOST_TOK_UTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* ---- growable byte buffer ---- */
typedef struct {
    char *p;
    size_t n, cap;
} tok_sbuf;

int sbuf_reserve(tok_sbuf *b, size_t extra);
int sbuf_put(tok_sbuf *b, const void *s, size_t n);
int sbuf_putc(tok_sbuf *b, char c);
void sbuf_free(tok_sbuf *b);

/* ---- growable int32 vector ---- */
typedef struct {
    int32_t *v;
    size_t n, cap;
} tok_ivec;

int ivec_push(tok_ivec *v, int32_t x);
int ivec_append(tok_ivec *v, const int32_t *x, size_t n);
void ivec_free(tok_ivec *v);

/* ---- string arena: many small immutable strings freed at once ---- */
typedef struct tok_arena_blk tok_arena_blk;
typedef struct {
    tok_arena_blk *head;
} tok_arena;

/* Copies n bytes and a terminating NUL; returns NULL when out of memory. */
char *arena_strdup(tok_arena *a, const char *s, size_t n);
void arena_free(tok_arena *a);

/* memmem, which strict C11 lacks: the first occurrence of needle (nn > 0) in hay, or NULL. */
const char *tok_memmem(const char *hay, size_t hn, const char *needle, size_t nn);

/* ---- hashing ---- */
uint64_t tok_hash(const void *data, size_t n);

/* ---- string -> int32 map; keys are borrowed (they must outlive the map) ---- */
typedef struct {
    uint64_t h; /* 0 marks an empty slot */
    const char *key;
    uint32_t len;
    int32_t val;
} tok_strmap_slot;

typedef struct {
    tok_strmap_slot *slots;
    size_t cap, n; /* cap is a power of two */
} tok_strmap;

int strmap_init(tok_strmap *m, size_t expected);
/* Inserts or overwrites. Returns 0, or -1 when out of memory. */
int strmap_put(tok_strmap *m, const char *key, size_t len, int32_t val);
/* Returns the value, or -1 when absent. */
int32_t strmap_get(const tok_strmap *m, const char *key, size_t len);
void strmap_free(tok_strmap *m);

/* ---- uint64 -> uint64 map (UINT64_MAX is reserved as the empty key) ---- */
typedef struct {
    uint64_t key, val;
} tok_u64map_slot;

typedef struct {
    tok_u64map_slot *slots;
    size_t cap, n;
} tok_u64map;

int u64map_init(tok_u64map *m, size_t expected);
int u64map_put(tok_u64map *m, uint64_t key, uint64_t val);
/* Returns true and sets *val when present. */
bool u64map_get(const tok_u64map *m, uint64_t key, uint64_t *val);
void u64map_free(tok_u64map *m);

/* ---- UTF-8 ---- */
/* Length of the valid UTF-8 sequence at s (1..4), or 0 when s[0..n) does not start with one. */
size_t utf8_valid_len(const unsigned char *s, size_t n);
bool utf8_is_valid(const char *s, size_t n);
/* Decodes the valid sequence at s (caller checked validity); sets *len. */
uint32_t utf8_decode(const char *s, size_t *len);
/* Encodes cp into out (4 bytes room); returns the length. */
size_t utf8_encode(uint32_t cp, char *out);
/* Appends s to b replacing each maximal invalid subpart by U+FFFD (as Rust's
 * String::from_utf8_lossy and the WHATWG decoder do). */
int utf8_append_lossy(tok_sbuf *b, const char *s, size_t n);
/* Length of the maximal subpart at s (one U+FFFD replaces it) when s starts no valid sequence. */
size_t utf8_subpart_len(const unsigned char *s, size_t n);
/* Length of the longest prefix of s that is a proper prefix of a valid sequence (an
 * incomplete character that more bytes could complete), for s starting at a lead byte. */
size_t utf8_incomplete_len(const unsigned char *s, size_t n);

/* Unicode predicates as Rust's char methods define them. */
bool uni_is_whitespace(uint32_t cp); /* White_Space */
bool uni_is_word(uint32_t cp);       /* regex \w: alphabetic, marks, digits, Pc, joiners */
bool uni_is_numeric(uint32_t cp);    /* Nd, Nl, No */
bool uni_is_punct(uint32_t cp);      /* ASCII punctuation or P* */

#endif
