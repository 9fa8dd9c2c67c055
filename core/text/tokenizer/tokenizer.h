/* Hugging Face tokenizer.json tokenizers (BPE: byte-level with regex pre-tokenizers, and
 * SentencePiece-style with ▁ and byte fallback) and streaming
 * detokenization.
 *
 * A loaded tokenizer is immutable apart from an internal, locked piece cache: any number of
 * threads may encode and decode with one tokenizer at once. A tok_stream belongs to one thread
 * at a time. Text given to the encoder may be any bytes: invalid UTF-8 is replaced by U+FFFD
 * (as Python does with errors="replace") before tokenization. */
#ifndef LMHOST_TOKENIZER_H
#define LMHOST_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tok_tokenizer tok_tokenizer;
typedef struct tok_stream tok_stream;

/* Flags of tok_decode_ex. */
enum {
    TOK_DECODE_SKIP_SPECIAL = 1,   /* drop special tokens (added tokens marked special) */
    TOK_DECODE_CLEANUP_SPACES = 2, /* transformers' clean_up_tokenization (" ." -> "." ...) */
};

/* Loads DIR/tokenizer.json, DIR/tokenizer_config.json (optional) and
 * DIR/generation_config.json (optional, for eos_token_id). On failure returns NULL and writes
 * a message saying what failed and where into err (errlen bytes, may be 0). */
tok_tokenizer *tok_load(const char *dir, char *err, size_t errlen);

/* Same as tok_load from in-memory JSON texts; config_json may be NULL (no config). */
tok_tokenizer *tok_load_from_memory(const char *json, size_t json_len, const char *config_json,
                                    size_t config_len, char *err, size_t errlen);

/* Frees a tokenizer (NULL is ignored). No stream of it may be in use. */
void tok_free(tok_tokenizer *t);

/* Encodes len bytes of text into a malloc'd array *ids of *n_ids ids (free() it; NULL when
 * empty). add_special adds the tokenizer's own specials, as add_special_tokens=True does.
 * Returns 0, or -1 when out of memory. */
int tok_encode(const tok_tokenizer *t, const char *text, size_t len, bool add_special,
               int32_t **ids, size_t *n_ids);

/* Decodes ids into a malloc'd NUL-terminated UTF-8 string (free() it), *len set when len is not
 * NULL; unknown ids are skipped. No space clean-up, so the result equals the concatenated
 * output of a tok_stream. Returns NULL only when out of memory. */
char *tok_decode(const tok_tokenizer *t, const int32_t *ids, size_t n, bool skip_special,
                 size_t *len);

/* tok_decode with TOK_DECODE_* flags. */
char *tok_decode_ex(const tok_tokenizer *t, const int32_t *ids, size_t n, unsigned flags,
                    size_t *len);

/* Whether tokenizer_config.json asks for clean_up_tokenization_spaces (transformers' decode
 * default; pass TOK_DECODE_CLEANUP_SPACES to follow it). */
bool tok_cleanup_spaces_default(const tok_tokenizer *t);

/* The vocabulary string of a token (e.g. "Ġworld", "▁the", "<0x0A>", "<|im_end|>"), not
 * NUL-free in general: *len gets its length. NULL for an id outside the vocabulary. */
const char *tok_token_to_piece(const tok_tokenizer *t, int32_t id, size_t *len);

/* The bytes token id contributes to decoded text in the middle of a sequence (after other
 * tokens), as constrained decoding needs them: a byte-level BPE piece mapped back through the
 * byte-to-unicode table (possibly part of a UTF-8 character), a SentencePiece "▁" as a space,
 * a "<0xNN>" byte-fallback token as that one byte, an added token as its content (each
 * through the tokenizer's decoders, without the start-of-text rules such as Strip's).
 * Writes min(*len, cap) bytes to buf and sets *len to the full length (so cap 0 asks for the
 * length). Returns 0, or -1 for an id outside the vocabulary or when out of memory. */
int tok_token_bytes(const tok_tokenizer *t, int32_t id, char *buf, size_t cap, size_t *len);

/* The id of a vocabulary string (model vocab or added token), or -1. */
int32_t tok_piece_to_token(const tok_tokenizer *t, const char *piece, size_t len);

/* One more than the largest id the tokenizer knows (model vocabulary and added tokens). */
size_t tok_vocab_size(const tok_tokenizer *t);

/* The BOS id named by tokenizer_config.json's bos_token, or -1. */
int32_t tok_bos_id(const tok_tokenizer *t);

/* The EOS ids (tokenizer_config.json's eos_token, then generation_config.json's eos_token_id,
 * without repeats); returns their count and points *ids at them (NULL when none). */
size_t tok_eos_ids(const tok_tokenizer *t, const int32_t **ids);

/* Whether id is one of the EOS ids. */
bool tok_is_eos(const tok_tokenizer *t, int32_t id);

/* Whether id is an added token marked special (skipped by skip_special). */
bool tok_is_special(const tok_tokenizer *t, int32_t id);

/* A streaming decoder: push ids one at a time, get back only text that is final (complete
 * UTF-8 characters that later ids cannot change). NULL when out of memory. */
tok_stream *tok_stream_new(const tok_tokenizer *t, bool skip_special);

/* Feeds one id. Returns the newly final text (NUL-terminated, *len bytes, possibly empty) in a
 * buffer owned by the stream and valid until its next call, or NULL when out of memory. */
const char *tok_stream_push(tok_stream *s, int32_t id, size_t *len);

/* Ends the stream: returns the held-back rest (as tok_stream_push does) and resets the stream
 * so that it can decode a new sequence. */
const char *tok_stream_flush(tok_stream *s, size_t *len);

/* Frees a stream (NULL is ignored). */
void tok_stream_free(tok_stream *s);

#ifdef __cplusplus
}
#endif

#endif
