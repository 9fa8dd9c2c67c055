/* Internals of the constrained-decoding engine, shared by its files:
 * - gram_build.c: the builders and JSON Schema -> a syntax tree (ast) with named rules;
 * - gram_compile.c: ast -> a byte NFA per rule -> a DFA per rule (a pushdown automaton:
 *   states have byte transitions, calls of other rules and an end), shortest completions;
 * - gram_vocab.c: the token trie;
 * - gram_match.c: the matcher, its token masks and their cache. */
#ifndef LMHOST_GRAM_INTERNAL_H
#define LMHOST_GRAM_INTERNAL_H

#include "grammar.h"

#include <stdbool.h>

#define GRAM_INF (INT32_MAX / 4) /* "no completion"; sums of two stay below INT32_MAX */

/* Bounds of count keywords (minItems, maxLength, repeat counts): unrolled, so bounded. */
#define GRAM_MAX_COUNT 10000

/* ---- syntax tree ---------------------------------------------------------------------- */

typedef enum {
    A_EMPTY,  /* nothing */
    A_NONE,   /* matches nothing (a false schema, an enum whose values all fail "type") */
    A_LIT,    /* bytes; special: a special token may stand for (part of) them */
    A_SEQ,    /* kids one after the other */
    A_ALT,    /* one of kids */
    A_REPEAT, /* kids[0] min..max times (max -1: unbounded), kids[1] (or NULL) between */
    A_CALL,   /* rule `rule` of the gram */
    A_UNTIL,  /* any valid UTF-8 text without bytes as a substring, then bytes */
    A_STRING, /* JSON string content (between the quotes), min..max characters */
    A_NUMBER, /* a JSON number; integer: without fraction and exponent */
    A_OBJECT, /* '{' properties in order '}': keys[i] (a JSON string), kids[i] the value */
} ast_kind;

typedef struct ast {
    ast_kind k;
    int n; /* kids */
    struct ast **kids;
    char *bytes; /* A_LIT, A_UNTIL */
    size_t len;
    bool special; /* A_LIT */
    bool integer; /* A_NUMBER */
    int min, max; /* A_REPEAT, A_STRING */
    int rule;     /* A_CALL */
    char **keys;  /* A_OBJECT: n literal keys with quotes */
    bool *req;    /* A_OBJECT: required */
} ast;

ast *ast_new(ast_kind k);
void ast_free(ast *a);
ast *ast_lit(const char *s, size_t n, bool special);
/* Takes kids (n may be 0; NULL kids free the others and return NULL). */
ast *ast_list(ast_kind k, ast **kids, int n);
ast *ast_seq2(ast *a, ast *b);
ast *ast_seq3(ast *a, ast *b, ast *c);
ast *ast_alt2(ast *a, ast *b);

/* ---- compiled program ----------------------------------------------------------------- */

typedef struct {
    int32_t row;      /* first of K entries in prog.trans, -1: no byte transitions */
    int32_t call_off; /* calls[call_off .. call_off + n_call) */
    int32_t lit_off;  /* lit transitions (special tokens only walk these) */
    uint16_t n_call, n_lit;
    int32_t min_end; /* fewest bytes to this rule's end; GRAM_INF: none */
    /* the state after any one character of string content (valid UTF-8 without control
     * characters, '"' or '\\'), the same for all of them and reached through states that
     * only read bytes, or -1: string content (itself again) or a counted string's position */
    int32_t next_char;
    int32_t rule;
    uint8_t final;      /* the rule may end here */
    uint8_t simple;     /* byte transitions only: no calls, not final */
    uint8_t pure_final; /* final and nothing else: returning here is returning further */
    uint8_t plain_dead; /* no character of string content can come */
} gstate;

typedef struct {
    int32_t rule, ret; /* call rule, then continue at state ret */
} gcall;

typedef struct {
    int32_t cls, to;
} glit;

typedef struct prog {
    uint8_t cls[256]; /* byte -> class */
    int K;            /* classes */
    gstate *st;
    int32_t n_st;
    int32_t *trans; /* rows of K: the state after a byte of that class, or -1 */
    gcall *calls;
    glit *lits;
    int32_t n_rules;
    int32_t *rule_start;
    int32_t start; /* the grammar's start state (rule 0) */
    /* texts a special token may be produced in (literals and until ends) */
    char **lit_text;
    size_t *lit_len;
    int n_lit_text;
} prog;

struct gram {
    ast *root;
    ast **rules;       /* A_CALL targets */
    char **rule_names; /* for messages (a JSON pointer), may be NULL */
    int n_rules;
    prog *p; /* built by gram_finish */
};

/* Compiles g (root and rules) into g->p. 0, or -1 with a message in err. */
int gram_compile(gram *g, char *err, size_t err_len);
void prog_free(prog *p);

/* A gram around a tree (takes it; NULL: NULL). Compiles it; NULL on failure. */
gram *gram_from_ast(ast *root, ast **rules, char **names, int n_rules, char *err, size_t err_len);
/* Moves g's rules into the rule table being built (renumbering g's calls) and returns
 * g's root; frees the rest of g. */
ast *gram_take(gram *g, ast ***rules, char ***names, int *n_rules);

/* ---- vocabulary ----------------------------------------------------------------------- */

struct gram_vocab {
    int32_t n_vocab;
    /* every id's bytes (empty for ids the tokenizer lacks) */
    uint32_t *off; /* n_vocab + 1 */
    char *bytes;
    uint8_t *kind; /* TK_* */
    /* the trie over ordinary tokens in depth-first order: node i has byte tb[i] at depth
     * td[i] (1-based); its subtree ends before skip[i]; its tokens are
     * tok_ids[tok_at[i] .. tok_at[i + 1]); maxrem[i]: the longest token below it, in bytes
     * past it */
    int32_t n_nodes;
    uint8_t *tb;
    uint16_t *td;
    uint32_t *skip, *tok_at;
    uint16_t *maxrem;
    int32_t *tok_ids;
    int max_depth;
    /* plain text: per token (in trie order, as tok_ids) its characters when it is valid
     * UTF-8 without control characters, '"' and '\\' (else NOT_PLAIN); per node, whether every
     * token in its subtree is plain, and the characters on its path (bytes that do not continue a
     * character) */
    uint16_t *nchars;
    uint8_t *plain_sub;
    uint16_t *pchars;
    int max_chars;
    uint16_t *sub_cmin, *sub_cmax; /* fewest and most characters of a token below a node */
    uint32_t *all_plain;           /* the plain tokens, as a mask */
    /* plain tokens by characters: ids char_ids[char_off[c] .. char_off[c + 1]), and for
     * c <= GROUP_MASKS as a mask, by_chars + (c - 1) * words */
    int32_t *char_off, *char_ids;
    uint32_t *by_chars;
    int32_t *eos;
    int n_eos;
    int32_t *special; /* special, not eos */
    int n_special;
    bool all_bytes; /* every byte a UTF-8 text can hold is a token of its own */
};

enum { TK_NONE = 0, TK_TEXT, TK_SPECIAL, TK_EOS };
#define NOT_PLAIN   0xFFFF
#define GROUP_MASKS 32

#endif
