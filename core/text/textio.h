/* What the server and `lmhost chat` need of text: chat templates, encoding, streaming
 * decoding. A thin layer over the tokenizer and the template engine. */
#ifndef LMHOST_TEXTIO_H
#define LMHOST_TEXTIO_H

#include <json-c/json.h>
#include <stddef.h>
#include <stdint.h>

typedef struct textio textio;
typedef struct textio_stream textio_stream;

/* Loads tokenizer.json, tokenizer_config.json (and its chat template) from dir. */
textio *textio_open(const char *dir, char *err, size_t err_len);
void textio_close(textio *t);
int textio_has_template(const textio *t);

/* The tokenizer (for constrained decoding's view of the vocabulary). */
const struct tok_tokenizer *textio_tokenizer(const textio *t);
/* The chat template's text as the model directory holds it (chat_template.jinja, else
 * tokenizer_config.json whole), malloc'd; NULL when neither is there. For telling formats
 * apart by what the template writes. */
char *textio_template_source(const char *dir);
/* Renders messages (and tools, extra variables) with the model's chat template. */
int textio_render(textio *t, json_object *messages, json_object *tools, json_object *vars,
                  int add_generation_prompt, char **out, char *err, size_t err_len);
/* Encodes text; add_special adds the tokenizer's own BOS/EOS. *ids is malloc'd. */
int textio_encode(textio *t, const char *text, int add_special, int32_t **ids, int32_t *n,
                  char *err, size_t err_len);
/* End-of-sequence ids (tokenizer_config, generation_config): up to max written. */
int32_t textio_eos(const textio *t, int32_t *out, int32_t max);
/* The text of one token alone (for logprobs), malloc'd. */
char *textio_token_text(textio *t, int32_t id);

/* Incremental decoding: push one id, get the text that is now complete (never half a
 * UTF-8 character). The returned string is valid until the next call. */
textio_stream *textio_stream_new(textio *t);
const char *textio_stream_push(textio_stream *s, int32_t id, size_t *len);
const char *textio_stream_flush(textio_stream *s, size_t *len);
void textio_stream_free(textio_stream *s);

#endif
