/* What the tool-call plugins share (plugins/toolcall-*): strict JSON, the streaming machinery
 * that holds back text which may begin a call, and grammar helpers. A static library linked
 * into each plugin; nothing of it is exported.
 *
 * A parser keeps the text it has not released in one buffer and walks it with a small state
 * machine. Every decision (a call is complete, or malformed) is made only once the bytes seen
 * so far settle it whatever comes next, so the result does not depend on how the text was
 * split. A construct that fails goes out as content from where it was held (its leading
 * whitespace included) up to the end of its opening marker (tcc_fail), and scanning goes on
 * after that marker, so what the construct held is looked at again as text. Whitespace that
 * only separates a call from its surroundings (before its opening marker, after its end) is
 * formatting and is dropped.
 *
 * A format writes its states as functions tcc_state, which return TCC_GO (run the next
 * state now) or TCC_WAIT (more text is needed, or the end of the output has been handled);
 * the offsets below are the only ones kept into the buffer (it is compacted between
 * pushes). */
#ifndef LMHOST_TC_COMMON_H
#define LMHOST_TC_COMMON_H

#include "lmhost/lmhost.h"

#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* ---- text and calls ------------------------------------------------------------------- */

typedef struct tcc_buf {
    char *p; /* NUL-terminated once anything was added */
    size_t len, cap;
} tcc_buf;

int tcc_buf_add(tcc_buf *b, const char *s, size_t n);
void tcc_buf_free(tcc_buf *b);

typedef struct tcc_call {
    char *name;      /* unescaped UTF-8 */
    char *arguments; /* compact JSON text of an object */
} tcc_call;

void tcc_call_clear(tcc_call *c);
void tcc_calls_free(tcc_call *c, int n);

static inline int tcc_is_ws(int c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

/* Characters of a function name where a format writes it bare (NAME[ARGS], to=functions.NAME,
 * a line of its own); the grammars refuse other names for those formats. */
static inline int tcc_name_char(int c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
           c == '-' || c == '.' || c == ':';
}

#define TCC_NAME_MAX_LEN 256
/* Whitespace held back at most before a possible call. */
#define TCC_WS_HOLD_MAX 256

/* ---- strict JSON (RFC 8259), validated and written back compact ---------------------- */

/* s[0, n) is exactly one call object: {"name": N, "arguments" or "parameters": {...}},
 * other members checked and ignored; neither may appear twice, the name is a non-empty
 * string, the arguments an object. 0, or -1 (*oom set when memory ran out). */
int tcc_parse_call(const char *s, size_t n, tcc_call *out, int *oom);
/* s[0, n) is exactly one object: its compact text (malloc'd), or NULL. */
char *tcc_parse_args(const char *s, size_t n, int *oom);
/* s[0, n) is exactly a non-empty array of call objects: *calls (malloc'd) and *n_calls. */
int tcc_parse_call_array(const char *s, size_t n, tcc_call **calls, int *n_calls, int *oom);

/* Where a JSON object or array ends: follows brackets and strings incrementally, without
 * judging the value (tcc_parse_* do, once it is whole). Refuses early what can never be
 * JSON (a byte outside strings that no JSON token has, a control byte in a string). */
typedef struct tcc_jscan {
    size_t pos;
    long depth;
    int in_str, esc;
} tcc_jscan;

enum { TCC_JS_MORE, TCC_JS_END, TCC_JS_BAD };

/* ---- the streaming parser ------------------------------------------------------------- */

enum { TCC_GO, TCC_WAIT };

typedef struct lmh_tc_parser tcc_parser;
typedef int (*tcc_state)(tcc_parser *p);

struct lmh_tc_parser {
    tcc_buf in;
    size_t pos; /* in.p[0, pos) is done with; in a construct, pos == mark */
    int stage, eof, oom;
    int after_call; /* whitespace right after a call is dropped unless text follows it */
    /* the construct being read: on failure [mark, resume) goes out as content and scanning
     * goes on at resume; at is where its reading stands; t0..t1 a name in it */
    size_t mark, resume, at, t0, t1;
    tcc_jscan js;
    tcc_call cur;
    int format;     /* the index into the plugin's formats */
    tcc_state st;   /* runs next */
    tcc_state text; /* plain text: where a construct goes back to when it ends or fails */
    /* on a failure, the format's own state is reset (may be NULL) */
    void (*reset)(tcc_parser *p);
    /* frees what the format keeps beside (may be NULL) */
    void (*destroy)(tcc_parser *p);
    /* this push's sink, and the calls given to it */
    const lmh_tc_sink *out;
    int added;
};

#define TCC_LEN(p)   ((p)->in.len)
#define TCC_AT(p, i) ((unsigned char)(p)->in.p[i])

/* A parser of `size` bytes (a format's own struct with tcc_parser first) starting in state
 * `start`, plain text being `text`. NULL when out of memory. */
tcc_parser *tcc_parser_new(size_t size, int format, tcc_state start, tcc_state text);
/* lmh_toolcall_api's push, finish and parser_free. */
int tcc_push(lmh_tc_parser *p, const char *s, size_t n, const lmh_tc_sink *out);
int tcc_finish(lmh_tc_parser *p, const lmh_tc_sink *out);
void tcc_parser_free(lmh_tc_parser *p);

/* in[a, b) to the content, or to the reasoning (dropped where the host wants none). */
void tcc_emit(tcc_parser *p, size_t a, size_t b);
void tcc_emit_reasoning(tcc_parser *p, size_t a, size_t b);
/* Gives a call to the sink (and clears *c). */
void tcc_out_call(tcc_parser *p, tcc_call *c);

/* 1: lit is at `at`; 0: the text ends inside a prefix of it; -1: something else is there. */
int tcc_lit_at(const tcc_parser *p, size_t at, const char *lit);
/* The first of markers m[0..nm) in in[from, len): 1 with *which and *at; or 0 with *safe,
 * the end of the text that cannot be part of a marker (a marker's proper prefix at the end
 * of the text is held back). */
int tcc_find_marker(const tcc_parser *p, size_t from, const char *const *m, int nm, int *which,
                    size_t *at, size_t *safe);
/* Moves p->at past whitespace; 1 when a byte follows it. */
int tcc_skip_ws(tcc_parser *p);
/* Moves p->at past name characters from `from` on: -1 when more than TCC_NAME_MAX_LEN. */
int tcc_skip_name(tcc_parser *p, size_t from);
/* Where the whitespace right before `end` starts (at most TCC_WS_HOLD_MAX bytes of it). */
size_t tcc_ws_tail(const tcc_parser *p, size_t end);
/* Releases in[pos, end) as content. */
void tcc_emit_text(tcc_parser *p, size_t end);

/* Plain text, looking for markers m[0..nm): releases what cannot be (whitespace before) a
 * marker. 1 when marker *which was found: a construct begins (mark at its leading
 * whitespace, at and resume past the marker, stage 0) and the caller moves to its state;
 * 0: return TCC_WAIT. */
int tcc_text(tcc_parser *p, const char *const *m, int nm, int *which);

/* The construct is not a call: what it held goes out as content up to resume. TCC_GO. */
int tcc_fail(tcc_parser *p);
/* The text ends here for now: wait for more, or at the end of the output, fail. */
int tcc_need(tcc_parser *p);
/* p->cur is complete and its text ends at `end`. TCC_GO. */
int tcc_done_call(tcc_parser *p, size_t end);

/* Starts reading the JSON value at p->at (checked to open with a bracket). */
void tcc_js_start(tcc_parser *p);
/* TCC_JS_END with p->at moved past the value and *from its start, or what the scan said. */
int tcc_js_step(tcc_parser *p, size_t *from);

/* ---- grammars ------------------------------------------------------------------------- */

/* Whether a name can be written bare (tcc_name_char, at most TCC_NAME_MAX_LEN bytes). */
int tcc_bare_name_ok(const char *name);
/* The JSON Schema (malloc'd text) of a call object
 * {"name": NAME, KEY: arguments valid against params}, params' $defs / definitions moved to
 * the top, where their "#/$defs/..." references point. NULL when out of memory or params is
 * not an object. */
char *tcc_call_schema(const char *name, const char *params, const char *key);

static inline lmh_gram *tcc_lit(const lmh_gram_api *g, const char *s) {
    return g->lit(s, strlen(s));
}
/* The literal a b c. */
lmh_gram *tcc_lit3(const lmh_gram_api *g, const char *a, const char *b, const char *c);
/* g->json over NUL-terminated schema text (NULL: out of memory, passed along). */
lmh_gram *tcc_json(const lmh_gram_api *g, const char *schema, char *err, size_t err_len);

/* The entry point: lmhost_plugin_entry in a plugin; tcc_entry_NAME where the formats are
 * linked into one program (-DTCC_STATIC: tests and fuzz targets). */
#ifdef TCC_STATIC
#define TCC_ENTRY(name) const lmh_plugin_info *tcc_entry_##name(void)
#else
#define TCC_ENTRY(name) LMH_EXPORT const lmh_plugin_info *lmhost_plugin_entry(void)
#endif

#endif
