/* Constrained decoding: a grammar (JSON Schema documents, literals, sequences,
 * alternatives, repeats) matched against the model's output token by token, so that tokens
 * which cannot continue a valid output are masked before sampling.
 *
 * Three objects:
 * - gram: a compiled grammar, immutable once built; built on any thread (the server builds
 *   it while validating a request, so an unsupported schema is a 400 naming the keyword).
 * - gram_vocab: every token's bytes in a trie, built once per tokenizer.
 * - gram_match: one sequence's position in a grammar; used by one thread at a time (the
 *   scheduler's engine thread).
 *
 * Termination by construction: gram_match_mask takes the number of tokens the sequence may
 * still produce and only allows tokens after which the shortest completion of the grammar
 * still fits, so a document is complete when max_tokens runs out, whatever the model's
 * weights. */
#ifndef LMHOST_GRAMMAR_H
#define LMHOST_GRAMMAR_H

#include <json-c/json.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "tokenizer.h"

typedef struct gram gram;
typedef struct gram_vocab gram_vocab;
typedef struct gram_match gram_match;

/* ---- building a grammar (each builder takes ownership of the grams it is given, also on
 * failure; NULL arguments make the result NULL, so calls nest without checks) ---------- */

/* Exactly these bytes. A special token (tok_is_special) can only be produced where a
 * literal holds its whole text. */
gram *gram_lit(const char *bytes, size_t len);
/* A JSON document valid against schema (a JSON Schema object; NULL: any JSON value).
 * Supported: type (one or an array of), properties, required, additionalProperties (false,
 * or absent/true: no properties beyond those listed are generated), items, prefixItems,
 * minItems, maxItems, enum, const, anyOf, oneOf (as anyOf), allOf of one schema, $ref to
 * #/$defs/... or #/definitions/... (recursion allowed), minLength, maxLength, and
 * annotations (title, description, default, examples, $schema, $id, $comment). Anything
 * else is refused: NULL with err naming the keyword and where it is ("'pattern' at
 * #/properties/name is not supported"). Properties come in the order the schema lists them.
 * Whitespace: none except one optional space after ':' and ','.
 * In detail:
 * - an object schema with properties generates only those, whatever additionalProperties
 *   says; one without properties and required is a map: any keys, values of
 *   additionalProperties when it is a schema (any JSON value when absent or true; false:
 *   only {}); {"type":"object"} is any object. Names in required without a schema of their
 *   own come after the listed properties, with any value;
 * - without "type", the keywords tell it (properties, required, additionalProperties:
 *   object; items, prefixItems, minItems, maxItems: array; minLength, maxLength: string),
 *   else any JSON value;
 * - enum/const values are written compactly, as listed, keeping those of the types "type"
 *   names; minLength/maxLength count characters (an escape is one);
 * - past prefixItems, items (a schema) gives further items; absent or true, only as many as
 *   minItems asks for (any JSON value); draft 7's items array and additionalItems work
 *   alike;
 * - $ref may point anywhere in the document ("#", "#/properties/a", ...), with no keyword
 *   beside it but annotations (allOf, anyOf and oneOf likewise); a reference that comes
 *   back to itself before any text is refused ("'$ref' cycle at ..."), as is a schema no
 *   finite document satisfies;
 * - annotations also: deprecated, readOnly, writeOnly, and $defs/definitions themselves;
 * - numbers have at most 15 digits before the point, 15 after it and 2 in the exponent
 *   (they read back as finite doubles, integers exactly);
 * - counts (minItems, maxItems, minLength, maxLength) are at most 10000; strings of
 *   maxLength over 1024 and long bounded arrays cost more per token (see gram_compile.c). */
gram *gram_json(json_object *schema, char *err, size_t err_len);
/* Parts one after the other. */
gram *gram_seq(gram **parts, int n);
/* One of the parts. */
gram *gram_alt(gram **parts, int n);
/* g repeated min..max times (max -1: unbounded), sep (may be NULL) between repeats. */
gram *gram_repeat(gram *g, gram *sep, int min, int max);
/* Any text that does not contain end, then end (free text before a structured part, e.g.
 * a think section: gram_until("</think>")). */
gram *gram_until(const char *end, size_t len);
void gram_free(gram *g);

/* ---- the vocabulary ----------------------------------------------------------------- */

/* Token bytes of ids [0, n_vocab) (n_vocab may exceed the tokenizer's: ids it does not
 * know are never allowed); eos ids are allowed exactly where the grammar may end. */
gram_vocab *gram_vocab_new(const tok_tokenizer *t, int32_t n_vocab, const int32_t *eos, int n_eos,
                           char *err, size_t err_len);
void gram_vocab_free(gram_vocab *v);
int32_t gram_vocab_size(const gram_vocab *v);
/* Whether every byte UTF-8 text can hold is a token of its own (true for byte-level BPE and
 * for SentencePiece with byte fallback). The budget guarantee of gram_match_mask rests on
 * it: without, a completion may need a byte that only comes inside longer tokens. */
bool gram_vocab_bytes_complete(const gram_vocab *v);

/* ---- matching ----------------------------------------------------------------------- */

typedef enum {
    GRAM_MORE = 0, /* the output is not complete yet */
    GRAM_CAN_END,  /* complete, and it may also go on */
    GRAM_ENDED,    /* complete, nothing may follow (only an end-of-sequence token) */
} gram_status;

/* g and v must outlive the match. NULL when out of memory. */
gram_match *gram_match_new(const gram *g, const gram_vocab *v);
void gram_match_free(gram_match *m);
/* Sets bit t of allowed (uint32 words, (n_vocab + 31) / 32 of them, bit t%32 of word t/32)
 * for each token that may come next given that at most `budget` more tokens may be
 * produced (this one included); clears the others. Returns how many are allowed (0: none,
 * which only happens when the budget cannot fit any completion). */
int32_t gram_match_mask(gram_match *m, int32_t budget, uint32_t *allowed);
/* Advances over token t. 0, or -1 when t is not allowed (the match is left unchanged). */
int gram_match_accept(gram_match *m, int32_t t);
gram_status gram_match_status(const gram_match *m);
/* The fewest bytes that complete the output from here (0 when it may end). */
int32_t gram_match_min_bytes(const gram_match *m);
/* Masks are cached by the match's state (LRU, at most `bytes` of memory; 8 MiB by default,
 * 0 turns the cache off). */
void gram_match_set_cache(gram_match *m, size_t bytes);
/* How many gram_match_mask calls were answered from the cache and how many were not, and
 * the cache's memory now. */
void gram_match_cache_stats(const gram_match *m, int64_t *hits, int64_t *misses, size_t *bytes);

#endif
