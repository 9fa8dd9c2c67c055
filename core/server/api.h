/* The OpenAI API surface: request validation into a job, the JSON of replies and stream
 * chunks, and the text handling between tokens and replies (stop strings matched across
 * token boundaries and never streamed partially; <think> sections split off into
 * reasoning_content). */
#ifndef LMHOST_API_H
#define LMHOST_API_H

#include <json-c/json.h>
#include <stddef.h>
#include <stdint.h>
#include "scheduler.h"
#include "server.h"
#include "textio.h"
#include "toolcall.h"

typedef enum { JOB_CHAT, JOB_COMPLETION } job_kind;

typedef struct text_out {
    const char *reasoning, *content;
    size_t reasoning_len, content_len;
} text_out;

typedef struct sbuf {
    char *p;
    size_t len, cap;
} sbuf;

int api_sbuf_add(sbuf *b, const char *s, size_t n);

typedef struct text_state {
    char **stops;
    int n_stops;
    sbuf held;                   /* generated text not yet released (may begin a stop string) */
    int split_think;             /* chat replies: <think>...</think> becomes reasoning_content */
    int reasoning;               /* inside a think section */
    sbuf tag;                    /* released text that may begin a think tag */
    sbuf content, reasoning_all; /* everything released, for non-streamed replies */
    sbuf out_c, out_r;           /* what the last call released */
} text_state;

struct server;
struct evhttp_request;
struct gram;
struct gram_match;

/* "tool_choice": calls parsed out of the output (auto), not looked for (none), or forced
 * by constrained decoding (required: any of the tools; named: that one). */
typedef enum { TOOLS_AUTO, TOOLS_NONE, TOOLS_REQUIRED, TOOLS_NAMED } tool_choice;

struct job;

/* One of a request's n choices: its own sequence, sampler seed, text and tool calls. */
typedef struct jchoice {
    struct job *job;
    int index;
    sched_req sr;
    textio_stream *ts;
    text_state text;
    sbuf content; /* non-streamed replies: the content released (tool calls taken out) */
    int32_t n_gen;
    finish_reason fin;
    int in_engine, ended;
    double t_last;
    json_object *lp_all;   /* non-streamed logprobs entries */
    struct gram_match *gm; /* the grammar's match, where the output is constrained */
    struct tc_parser *tc;  /* tool calls taken out of the content, where tools are on */
    tc_buf tc_reason;      /* reasoning the parser found (a format's own reasoning channel) */
    json_object *calls;    /* the calls found (OpenAI tool_calls entries) */
} jchoice;

typedef struct job {
    struct server *srv;
    struct evhttp_request *req; /* NULL once the reply is done or the client left */
    job_kind kind;
    int stream, include_usage, ignore_eos;
    int32_t max_tokens;
    int32_t top_logprobs; /* -1: no logprobs */
    int no_prefix_cache;  /* "cache_prompt": false */
    int no_spec;          /* "speculative": false */
    json_object *messages, *tools, *vars;
    char *prompt_text;
    int32_t *prompt, n_prompt;
    /* what every choice starts from: sampling, max_tokens, cache (sr) and stop strings,
     * think splitting (text); each choice's seed is the request's + its index */
    sched_req sr;
    text_state text;
    int n_choices, n_ended;
    jchoice *ch;
    int in_engine; /* choices in the scheduler */
    /* logit_bias */
    int32_t *bias_id, n_bias;
    float *bias;
    /* tools and structured output */
    tool_choice tchoice;
    char tool_name[128];    /* TOOLS_NAMED's */
    int parallel_tools;     /* parallel_tool_calls (default true) */
    tc_format tc_format;    /* the model's tool-call format (toolcall.h), where tools are on */
    json_object *rf_schema; /* response_format: json_schema's schema, or {"type":"object"} */
    struct gram *gram;      /* the compiled constraint (NULL: free text) */
    int think;
    int32_t n_gen; /* all choices' tokens */
    int in_prep, http_done;
    int failed; /* a choice ended in an error: the reply is an error */
    double t_start;
    char id[48];
    int64_t created;
    char model[256];
    int error_code;
    char error[1024], error_param[64];
    /* the cache the request asked for (sr.cache): the field that named it, and how errors
     * quote it ("'kv_bits' 8"); empty for the server's default */
    char cache_field[16], cache_what[128];
    /* the request's kv_bits and kv_group_size (0: not given): the server turns them into
     * sr.cache through the cache plugins (cache_spec_kv_bits) */
    int kv_bits, kv_group;
    int stream_started; /* a stream's 200 and role chunks are sent */
    int stalled;        /* its client stopped reading: no more chunks (server.c) */
    char rid[72];       /* the request id, for the logs */
    struct job *prep_next;
} job;

/* Validates a request body; NULL with a message (and the offending field in param). */
/* A request body (len bytes at buf) as JSON: one value and nothing but whitespace after it.
 * NULL when it is not JSON (*oom 0) or memory ran out (*oom 1). Escaped surrogate pairs are
 * read right despite json-c 0.16 (json_fix.h). */
json_object *api_parse_body(const char *buf, size_t len, int *oom);
job *job_from_request(job_kind kind, json_object *body, const server_opts *o,
                      const char *model_name, char *err, size_t err_len, char *param,
                      size_t param_len);
/* The output's constraint (response_format, or a tool call that tool_choice forces in the
 * model's tool-call format fmt, toolcall.h): compiled into j->gram. -1 with a 400's
 * message (an unsupported schema keyword, a forced call the model has no format for). */
int api_constrain(job *j, const tc_format *fmt, char *err, size_t err_len, char *param,
                  size_t param_len);
struct gram_vocab;
/* After the prompt is rendered: each choice's request, text state, decoder, tool-call
 * parser and grammar match; a failure is left in j->error_code. */
void api_choices_init(job *j, textio *tio, const struct gram_vocab *gv);
void job_fail(job *j, int code, const char *param, const char *msg);
void job_free(job *j);

const char *api_reason(int code);
json_object *api_error(const char *msg, const char *type, const char *param, int code);
json_object *api_role_chunk(job *j, int index);
/* Takes ownership of logprobs (an entry made by api_token_logprobs) when not NULL. */
json_object *api_delta_chunk(jchoice *c, const char *reasoning, size_t rl, const char *content,
                             size_t cl, json_object *logprobs);
/* A stream chunk with one tool call (an entry of c->calls, index k among them). */
json_object *api_tool_chunk(jchoice *c, int k);
json_object *api_final_chunk(jchoice *c);
json_object *api_usage_chunk(job *j);
json_object *api_response(job *j);
json_object *api_token_logprobs(textio *tio, const sched_token *t);
void api_keep_logprobs(jchoice *c, json_object *entry);
/* "call_" and 24 random characters. */
void api_call_id(char *out, size_t len);

int text_push(text_state *t, const char *s, size_t len, text_out *out);
void text_flush(text_state *t, text_out *out);
void text_init_mode(text_state *t, int reasoning);
/* Whether a rendered prompt leaves a think section open (the model continues inside it). */
int text_prompt_opens_think(const char *prompt);

#endif
