/* Internal structures of the tokenizer, shared by the loader, the encoder and the decoder. */
#ifndef LMHOST_TOK_INTERNAL_H
#define LMHOST_TOK_INTERNAL_H

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <pthread.h>

#include "tok_util.h"
#include "tokenizer.h"

/* A String or Regex pattern of tokenizer.json. */
typedef struct {
    bool is_regex;
    char *lit; /* literal (arena) */
    size_t lit_len;
    pcre2_code *re;
} tok_pattern;

/* Split delimiter behaviors. */
enum { B_REMOVED, B_ISOLATED, B_MERGED_PREV, B_MERGED_NEXT, B_CONTIGUOUS };

enum {
    NORM_SEQ,
    NORM_NFC,
    NORM_NFD,
    NORM_NFKC,
    NORM_NFKD,
    NORM_LOWER,
    NORM_STRIP,
    NORM_STRIP_ACCENTS,
    NORM_REPLACE,
    NORM_PREPEND,
};

typedef struct tok_norm {
    int type;
    struct tok_norm **kids;
    size_t n_kids;
    tok_pattern pat;
    char *content; /* Replace content / Prepend text (arena) */
    size_t content_len;
    bool left, right; /* Strip */
} tok_norm;

enum {
    PRE_SEQ,
    PRE_SPLIT,
    PRE_BYTELEVEL,
    PRE_DIGITS,
    PRE_METASPACE,
    PRE_WHITESPACE,
    PRE_WSSPLIT,
    PRE_PUNCT,
};

enum { PREPEND_ALWAYS, PREPEND_FIRST, PREPEND_NEVER };

typedef struct tok_pretok {
    int type;
    struct tok_pretok **kids;
    size_t n_kids;
    tok_pattern pat; /* Split; ByteLevel and Whitespace use their own regex here */
    int behavior;
    bool invert;
    bool add_prefix_space, use_regex; /* ByteLevel */
    bool individual_digits;           /* Digits */
    bool split;                       /* Metaspace */
    int prepend_scheme;               /* Metaspace */
    char rep[5];                      /* Metaspace replacement char, UTF-8 */
    size_t rep_len;
} tok_pretok;

enum { DEC_BYTELEVEL, DEC_REPLACE, DEC_BYTEFALLBACK, DEC_FUSE, DEC_STRIP, DEC_METASPACE };

/* One decoder of the flattened decoder sequence. */
typedef struct {
    int type;
    tok_pattern pat; /* Replace */
    char *content;   /* Replace content (arena) */
    size_t content_len;
    char strip[5];                 /* Strip content char, UTF-8 */
    size_t strip_len, start, stop; /* Strip */
    char rep[5];                   /* Metaspace replacement, UTF-8 */
    size_t rep_len;
    bool drop_first; /* Metaspace: prepend_scheme != never */
} tok_dec;

/* One element of a TemplateProcessing "single" template. */
typedef struct {
    bool is_seq; /* the encoded text ($A) */
    int32_t *ids;
    size_t n;
} tok_post_item;

typedef struct {
    const char *content;
    uint32_t len;
    int32_t id;
    bool special, lstrip, rstrip, normalized, single_word;
} tok_added;

/* Byte trie over added tokens for leftmost-longest matching. */
typedef struct {
    tok_u64map edges; /* (node << 8 | byte) -> child */
    int32_t *term;    /* per node: index into added[], or -1 */
    size_t n_nodes, cap;
    uint8_t first[32]; /* bitset of first bytes */
    bool empty;
} tok_trie;

typedef struct {
    tok_strmap vocab;  /* model vocabulary (not added tokens) */
    tok_u64map merges; /* (left << 32 | right) -> (rank << 32 | merged id) */
    int32_t unk_id;
    bool byte_fallback, fuse_unk, ignore_merges;
    const char *prefix, *suffix; /* continuing_subword_prefix, end_of_word_suffix (NULL: none) */
    size_t prefix_len, suffix_len;
    int32_t byte_ids[256]; /* ids of "<0xXX>" or -1 */
    int32_t *bmp_ids;      /* codepoint < 0x10000 -> id of that one-char token (or -1) */
} tok_bpe;

/* A small locked cache of BPE results per pre-token piece. */
typedef struct {
    uint64_t h;
    uint32_t off, klen, nids;
} tok_cache_slot;

typedef struct {
    pthread_mutex_t mu;
    tok_cache_slot *slots;
    size_t cap, n;
    char *data;
    size_t dlen, dcap;
} tok_cache_shard;

#define TOK_CACHE_SHARDS  16
#define TOK_CACHE_MAX_KEY 256

enum { TOKF_SPECIAL = 1, TOKF_ADDED = 2 };

struct tok_tokenizer {
    tok_arena arena;
    size_t n_ids;        /* one more than the largest id */
    const char **id_str; /* token strings (NULL: hole) */
    uint32_t *id_len;
    uint8_t *id_flags;
    tok_strmap added_map; /* added token content -> id */
    tok_bpe bpe;
    tok_added *added;
    size_t n_added;
    tok_trie trie_raw, trie_norm;
    tok_norm *norm;  /* NULL: none */
    tok_pretok *pre; /* NULL: none */
    tok_dec *dec;    /* flattened decoders */
    size_t n_dec;
    bool has_decoder;
    tok_post_item *post; /* what add_special produces around the text (NULL: nothing) */
    size_t n_post;
    bool post_decides; /* a post_processor is present: it alone decides the specials */
    bool add_bos, add_eos;
    int32_t bos_id, cfg_eos_id;
    int32_t *eos;
    size_t n_eos;
    bool cleanup;
    tok_cache_shard cache[TOK_CACHE_SHARDS];
    /* encode scratch contexts kept for reuse (their buffers stay allocated) */
    pthread_mutex_t pool_mu;
    void *pool[8];
    size_t n_pool;
};

/* Byte-level (GPT-2) alphabet: byte -> UTF-8 of its stand-in char, and the reverse. */
extern char tok_bytelevel_utf8[256][3];
extern uint8_t tok_bytelevel_len[256];
/* Reverse map for code points below 0x144; -1 where no byte maps there. */
int tok_bytelevel_byte(uint32_t cp);
void tok_bytelevel_init(void);

/* Applies the normalizer to s, writing the result to out (which is reset first). */
int tok_normalize(const tok_tokenizer *t, const char *s, size_t n, tok_sbuf *out);

/* The encoder's BPE merge step on its own, for tests: merges syms[0..n) in place by merge rank
 * (priority queue); returns the new count, or (size_t)-1 when out of memory. */
size_t tok_bpe_merge(const tok_u64map *merges, int32_t *syms, size_t n);

/* Code points whose general category differs between PCRE2's Unicode 14 and tokenizers'
 * Unicode 16, as regex class items: added to (or, removed = true, taken from) `name`. */
int tok_unicode_changes(const char *name, size_t len, bool removed, tok_sbuf *out);

/* Whether normalization must leave cp alone to agree with tokenizers (see tok_unidata.c). */
bool tok_norm_inert(uint32_t cp);

/* Frees the pooled encode contexts (tok_free calls it). */
void tok_ctx_pool_free(tok_tokenizer *t);

/* transformers' clean_up_tokenization applied to s (in place, returns the new length). */
size_t tok_cleanup_spaces(char *s, size_t n);

#endif
