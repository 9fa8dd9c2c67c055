/* lmhost serve: an OpenAI-compatible HTTP/HTTPS server on libevent.
 *
 * Threads: the libevent loop (this file) parses requests and writes replies and never
 * computes; a prep thread renders chat templates and tokenizes; the scheduler's engine
 * thread runs the model. The two worker threads hand results back through one queue that
 * wakes the loop (event_active). All job state changes happen on the loop thread, so the
 * only locks are around the queues. */
#include "server.h"
#include "cache_spec.h"
#include "engine.h"
#include "plugin_loader.h"
#include "log.h"
#include "api.h"
#include "client_limits.h"
#include "conn_guard.h"
#include "metrics.h"
#include "scheduler.h"
#include "textio.h"
#include "toolcall.h"
#include "grammar.h"
#include "lmhost/debug.h"

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/bufferevent_ssl.h>
#include <event2/event.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>
#include <event2/listener.h>
#include <event2/thread.h>
#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <pthread.h>
#include <math.h>
#include <stdarg.h>
#include <signal.h>
#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

typedef enum {
    EV_PREP_DONE,
    EV_ADMITTED,
    EV_TOKEN,
    EV_FINISH,
    EV_ADMIN_DONE,
    EV_EMBED_DONE,
    EV_LOADED
} ev_type;

/* A backend move requested through the admin API, run on a thread of its own because it
 * waits for the running requests to finish. */
typedef struct admin_op {
    struct server *srv;
    struct evhttp_request *req; /* NULL once the client left */
    char backend[256];          /* NAME[:OPTIONS], as --backend takes it */
    int rc;
    char err[512];
} admin_op;

typedef struct ev_item {
    ev_type type;
    job *j;
    jchoice *c; /* EV_ADMITTED, EV_TOKEN, EV_FINISH: the choice */
    admin_op *admin;
    struct embed_op *emb;
    sched_token tok;
    finish_reason why;
    struct ev_item *next;
} ev_item;

/* The server's life: it listens while the model loads, serves, and on SIGTERM/SIGINT drains:
 * --drain-delay seconds still serving while /health says 503 (a balancer's time to stop
 * sending), then new API requests get 503 and the listener closes until the running ones
 * are done. */
typedef enum {
    PH_LOADING,  /* /health 503 "loading", API routes 503 */
    PH_SERVING,  /* /health 200 "ok" */
    PH_DRAINING, /* /health 503 "draining", requests still served (--drain-delay) */
    PH_STOPPING  /* /health 503 "draining", new POSTs 503, no new connections */
} phase;

typedef struct server server;
struct server {
    struct event_base *base;
    struct evhttp *http;
    struct evhttp_bound_socket *sock;
    SSL_CTX *ssl;
    registry reg;
    engine *e;
    sched *sch;
    textio *tio;
    server_opts o;
    spec *sp;      /* speculative decoding's drafter (--spec), NULL: off */
    engine *draft; /* its draft model (--draft-model) */
    char draft_chain[512];
    char model_name[256];
    int32_t eos[16], n_eos;
    gram_vocab *gv;      /* every token's bytes, for constrained decoding */
    tc_format tc_format; /* the model's tool-call format (toolcall.h) */
    /* results from the worker threads */
    pthread_mutex_t qmu;
    ev_item *qhead, *qtail;
    struct event *notify;
    /* the prep thread's queue */
    pthread_t prep_th;
    pthread_mutex_t pmu;
    pthread_cond_t pcv;
    job *prep_head, *prep_tail;
    int prep_stop;
    phase phase; /* read and written on the loop thread */
    int rc;      /* server_run's exit status */
    int port;    /* the one listened on (--port 0: the kernel's pick) */
    /* loading, on a thread of its own while the loop answers probes */
    pthread_t load_th;
    int load_started, load_rc;
    char load_err[2048];
    ev_item load_done; /* its EV_LOADED, never freed */
    double load_t0;
    atomic_uint_least64_t load_bytes, load_total;
    void (*user_progress)(void *ctx, uint64_t done, uint64_t total);
    void *user_progress_ctx;
    /* shutdown */
    int active;   /* requests accepted and not yet answered in full */
    int flushing; /* replies handed to libevent and not yet written out */
    struct event *sig_int, *sig_term, *grace, *drain_delay;
    admin_op *admin; /* the move in progress, if any */
    metrics m;
    /* limits: connections beyond conn_max wait in the kernel's backlog (the listener paused
     * until some close); rl: requests a minute per client address */
    int conn_max, conn_paused;
    conn_guard *guard;
    rate_limiter *rl;
    unsigned long long req_seq;
};

/* Once the listener is closed, exit when every request is answered and every reply written
 * out. */
static void maybe_exit(server *s) {
    if (s->phase == PH_STOPPING && s->active == 0 && s->flushing == 0) {
        log_msg(LMH_LOG_INFO, "shutdown: every request has finished");
        event_base_loopexit(s->base, NULL);
    }
}

/* A reply handed to libevent, counted in s->flushing until its last byte is written or its
 * client leaves. The connection's close callback is ours from then on. */
typedef struct flush {
    server *s;
    struct evhttp_request *req;
    int stream_open; /* a stream whose final chunk is queued and whose end is not */
} flush;

static void flush_done(flush *f) {
    server *s = f->s;
    free(f);
    s->flushing--;
    maybe_exit(s);
}

static void on_sent(struct evhttp_request *req, void *arg) {
    struct evhttp_connection *c = evhttp_request_get_connection(req);
    if (c) evhttp_connection_set_closecb(c, NULL, NULL);
    flush_done(arg);
}

static void on_flush_close(struct evhttp_connection *c, void *arg) {
    (void)c;
    flush *f = arg;
    /* libevent 2.1 detaches a request that is not ended yet from a connection that dies,
     * and leaves it to us to free; an ended one it frees itself. */
    if (f->stream_open && !evhttp_request_get_connection(f->req)) evhttp_request_free(f->req);
    flush_done(f);
}

static flush *track_reply(server *s, struct evhttp_request *req) {
    struct evhttp_connection *c = evhttp_request_get_connection(req);
    flush *f = calloc(1, sizeof *f);
    if (!f) { /* the reply still goes out; shutdown just does not wait for it */
        evhttp_connection_set_closecb(c, NULL, NULL);
        return NULL;
    }
    f->s = s;
    f->req = req;
    s->flushing++;
    evhttp_request_set_on_complete_cb(req, on_sent, f);
    evhttp_connection_set_closecb(c, on_flush_close, f);
    return f;
}

/* A stream ends here, from the "output drained" callback of its final chunk. Ending it at
 * once raced libevent 2.1's TLS bufferevent, which runs that callback deferred: one queued
 * by an earlier chunk could fire after evhttp_send_reply_end had queued the last bytes and
 * armed its completion hook, which then closed the request with those bytes unsent and the
 * client waiting for them until the connection timed out. When this callback runs nothing
 * older can be pending. */
/* While a stream runs, libevent 2.1 reads its connection for the close and times that read
 * out: a stream whose tokens pause for --timeout seconds (a backend move, a long prefill
 * beside it) would be cut. So a stream's connection keeps only the write timeout, which runs
 * only while bytes wait for the client (a reader that stopped); the read timeout comes back
 * when the stream ends, for the keep-alive wait. */
static void stream_timeouts(struct evhttp_request *req, int streaming, int timeout_s) {
    struct evhttp_connection *c = req ? evhttp_request_get_connection(req) : NULL;
    struct bufferevent *bev = c ? evhttp_connection_get_bufferevent(c) : NULL;
    if (!bev) return;
    struct timeval tv = {timeout_s, 0};
    bufferevent_set_timeouts(bev, streaming ? NULL : &tv, &tv);
}

static void end_stream(struct evhttp_connection *c, void *arg) {
    (void)c;
    flush *f = arg;
    f->stream_open = 0;
    stream_timeouts(f->req, 0, f->s->o.timeout);
    evhttp_send_reply_end(f->req);
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ---- the queue back to the loop ----------------------------------------------------- */

static void post(server *s, ev_item *it) {
    pthread_mutex_lock(&s->qmu);
    it->next = NULL;
    if (s->qtail)
        s->qtail->next = it;
    else
        s->qhead = it;
    s->qtail = it;
    pthread_mutex_unlock(&s->qmu);
    event_active(s->notify, EV_READ, 0);
}

/* Called on the engine thread. */
static void on_emit(sched_req *r, const sched_token *tok, finish_reason why, void *user) {
    jchoice *c = user;
    (void)r;
    ev_item *it = calloc(1, sizeof *it);
    if (!it) return; /* a lost token on OOM; the finish event still comes */
    it->c = c;
    it->j = c->job;
    it->type = tok ? EV_TOKEN : why == FINISH_NONE ? EV_ADMITTED : EV_FINISH;
    if (tok) it->tok = *tok;
    it->why = why;
    post(c->job->srv, it);
}

/* ---- replies ------------------------------------------------------------------------- */

/* A float in as many significant digits as asked: 7 writes a setting as it was given
 * ("0.1", not 0.10000000149011612), 9 gives back the float exactly. */
static json_object *float_json(float f, int digits) {
    char b[32];
    snprintf(b, sizeof b, "%.*g", digits, (double)f);
    return json_object_new_double_s((double)f, b);
}

static void count_status(server *s, int code) {
    metrics_request(&s->m, code);
}

static void send_json(server *s, struct evhttp_request *req, int code, json_object *o) {
    struct evbuffer *b = evbuffer_new();
    const char *txt =
        json_object_to_json_string_ext(o, JSON_C_TO_STRING_PLAIN | JSON_C_TO_STRING_NOSLASHESCAPE);
    evbuffer_add(b, txt, strlen(txt));
    evbuffer_add(b, "\n", 1);
    struct evkeyvalq *h = evhttp_request_get_output_headers(req);
    evhttp_add_header(h, "Content-Type", "application/json");
    track_reply(s, req);
    evhttp_send_reply(req, code, code == 200 ? "OK" : api_reason(code), b);
    evbuffer_free(b);
    count_status(s, code);
}

static void send_error(server *s, struct evhttp_request *req, int code, const char *type,
                       const char *param, const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));
static void send_error(server *s, struct evhttp_request *req, int code, const char *type,
                       const char *param, const char *fmt, ...) {
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    json_object *o = api_error(msg, type, param, code);
    if (code == 401)
        evhttp_add_header(evhttp_request_get_output_headers(req), "WWW-Authenticate", "Bearer");
    send_json(s, req, code, o);
    json_object_put(o);
}

/* A stream's bytes not yet taken by its client beyond which the client counts as stalled:
 * its generation stops and libevent's write timeout (--timeout) closes the connection, so a
 * reader that stops reading holds at most this much memory, and nobody else waits on it. */
enum { STALLED_BYTES = 1 << 20 };

static void send_sse(job *j, json_object *chunk) {
    if (j->stalled) return;
    struct evhttp_connection *c = evhttp_request_get_connection(j->req);
    struct bufferevent *bev = c ? evhttp_connection_get_bufferevent(c) : NULL;
    size_t unsent = bev ? evbuffer_get_length(bufferevent_get_output(bev)) : 0;
    if (unsent > STALLED_BYTES) {
        j->stalled = 1;
        for (int k = 0; k < j->n_choices; k++) atomic_store(&j->ch[k].sr.cancel, 1);
        log_msg(LMH_LOG_WARN,
                "%s: the client stopped reading its stream (%zu bytes unsent); "
                "stopping it",
                j->rid, unsent);
        return;
    }
    struct evbuffer *b = evbuffer_new();
    const char *txt = json_object_to_json_string_ext(chunk, JSON_C_TO_STRING_PLAIN |
                                                                JSON_C_TO_STRING_NOSLASHESCAPE);
    evbuffer_add_printf(b, "data: %s\n\n", txt);
    evhttp_send_reply_chunk(j->req, b);
    evbuffer_free(b);
}

static void release(job *j);
static json_object *read_body(struct server *s, struct evhttp_request *req, int *code);

/* A stream's 200, headers and (chat) role chunks. */
static void start_stream(job *j) {
    j->stream_started = 1;
    struct evkeyvalq *h = evhttp_request_get_output_headers(j->req);
    evhttp_add_header(h, "Content-Type", "text/event-stream");
    evhttp_add_header(h, "Cache-Control", "no-cache");
    evhttp_send_reply_start(j->req, 200, "OK");
    stream_timeouts(j->req, 1, j->srv->o.timeout);
    if (j->kind == JOB_CHAT)
        for (int k = 0; k < j->n_choices; k++) {
            json_object *c = api_role_chunk(j, k);
            send_sse(j, c);
            json_object_put(c);
        }
}

/* The end of a reply, once every choice has ended: the last chunks of a stream (each
 * choice's final chunk went out when it ended), the whole object otherwise. */
static void finish_reply(job *j) {
    server *s = j->srv;
    if (j->http_done) return;
    j->http_done = 1;
    if (!j->req) return;
    metrics_finish(&s->m, j->n_prompt, j->n_gen);
    metrics_duration(&s->m, now_s() - j->t_start);
    jchoice *bad = NULL;
    for (int k = 0; k < j->n_choices && !bad; k++)
        if (j->ch[k].fin == FINISH_ERROR) bad = &j->ch[k];
    if (bad && bad->sr.fail_code && (!j->stream || !j->stream_started)) {
        /* the request's cache cannot be served: nothing of the reply is out yet */
        send_error(s, j->req, bad->sr.fail_code,
                   bad->sr.fail_code == 400 ? "invalid_request_error" : "server_error",
                   j->cache_field, "%s: %s", j->cache_what, bad->sr.fail_msg);
    } else if (bad && (!j->stream || !j->stream_started)) {
        send_error(s, j->req, 500, "server_error", NULL, "generation failed");
    } else if (j->stream) {
        if (!j->stream_started) start_stream(j); /* cancelled before it joined */
        if (bad) {
            json_object *e = api_error("generation failed", "server_error", NULL, 500);
            send_sse(j, e);
            json_object_put(e);
        } else if (j->include_usage) {
            json_object *c = api_usage_chunk(j);
            send_sse(j, c);
            json_object_put(c);
        }
        struct evbuffer *b = evbuffer_new();
        evbuffer_add_printf(b, "data: [DONE]\n\n");
        flush *f = track_reply(s, j->req);
        if (f) {
            f->stream_open = 1;
            evhttp_send_reply_chunk_with_cb(j->req, b, end_stream, f);
        } else {
            evhttp_send_reply_chunk(j->req, b);
            stream_timeouts(j->req, 0, s->o.timeout);
            evhttp_send_reply_end(j->req);
        }
        evbuffer_free(b);
        count_status(s, 200);
    } else {
        json_object *o = api_response(j);
        send_json(s, j->req, 200, o);
        json_object_put(o);
    }
    j->req = NULL;
}

/* Tool calls the parser completed: kept, and streamed as they come. */
static void take_calls(jchoice *c, tc_call *calls, int n) {
    job *j = c->job;
    for (int k = 0; k < n; k++) {
        if (!c->calls) c->calls = json_object_new_array();
        json_object *call = json_object_new_object(), *fn = json_object_new_object();
        char id[40];
        api_call_id(id, sizeof id);
        json_object_object_add(call, "id", json_object_new_string(id));
        json_object_object_add(call, "type", json_object_new_string("function"));
        json_object_object_add(fn, "name", json_object_new_string(calls[k].name));
        json_object_object_add(fn, "arguments", json_object_new_string(calls[k].arguments));
        json_object_object_add(call, "function", fn);
        json_object_array_add(c->calls, call);
        if (j->stream && j->req && !j->http_done) {
            json_object *ch = api_tool_chunk(c, (int)json_object_array_length(c->calls) - 1);
            send_sse(j, ch);
            json_object_put(ch);
        }
    }
    tc_calls_free(calls, n);
}

/* Text the stop-string and think-tag logic let through (and, with tools on, the tool-call
 * parser): to the client or the record. final: the choice's last text. */
static void deliver(jchoice *c, const char *reasoning, size_t rl, const char *content, size_t cl,
                    json_object *logprobs, int final) {
    job *j = c->job;
    tc_buf plain = {0};
    if (c->tc) {
        tc_call *calls = NULL;
        int n = 0;
        if (cl) tc_push(c->tc, content, cl, &plain, &calls, &n);
        if (final) tc_finish(c->tc, &plain, &calls, &n);
        take_calls(c, calls, n); /* frees the array, also an empty one */
        content = plain.p ? plain.p : "";
        cl = plain.len;
        if (c->tc_reason.len && !rl) { /* reasoning the tool-call format carries itself */
            if (!j->stream) api_sbuf_add(&c->text.reasoning_all, c->tc_reason.p, c->tc_reason.len);
            reasoning = c->tc_reason.p;
            rl = c->tc_reason.len;
        }
    }
    if (!j->stream) api_sbuf_add(&c->content, content, cl);
    if (j->stream && j->req && !j->http_done && (rl || cl || logprobs)) {
        json_object *ch = api_delta_chunk(c, reasoning, rl, content, cl, logprobs);
        send_sse(j, ch);
        json_object_put(ch);
    } else if (logprobs) {
        json_object_put(logprobs);
    }
    tc_buf_free(&plain);
    if (rl && reasoning == c->tc_reason.p) c->tc_reason.len = 0;
}

/* A choice has ended (its last token, a stop string, an error): its last text, and in a
 * stream its final chunk; the reply ends with the last choice. */
static void end_choice(jchoice *c, finish_reason why, int stopped) {
    job *j = c->job;
    if (c->ended) return;
    c->ended = 1;
    c->fin = why;
    if (!j->http_done) {
        text_out out;
        if (!stopped) { /* the text held back (a stop string's text released all before it) */
            size_t len;
            const char *txt = textio_stream_flush(c->ts, &len);
            if (len && text_push(&c->text, txt, len, &out)) {
                c->fin = FINISH_STOP;
                stopped = 1;
            }
            if (len)
                deliver(c, out.reasoning, out.reasoning_len, out.content, out.content_len, NULL, 0);
            if (!stopped) {
                text_flush(&c->text, &out);
                deliver(c, out.reasoning, out.reasoning_len, out.content, out.content_len, NULL, 0);
            }
        }
        deliver(c, "", 0, "", 0, NULL, 1); /* the tool-call parser's end */
        if (j->stream && j->req && why != FINISH_ERROR) {
            if (!j->stream_started) start_stream(j);
            json_object *ch = api_final_chunk(c);
            send_sse(j, ch);
            json_object_put(ch);
        }
    }
    if (why == FINISH_ERROR && !j->failed) {
        /* one choice failed: the reply is an error, the others need not go on */
        j->failed = 1;
        for (int k = 0; k < j->n_choices; k++) atomic_store(&j->ch[k].sr.cancel, 1);
    }
    if (++j->n_ended == j->n_choices) finish_reply(j);
}

static void on_text(jchoice *c, const char *txt, size_t len, json_object *logprobs) {
    text_out out;
    int stopped = text_push(&c->text, txt, len, &out);
    deliver(c, out.reasoning, out.reasoning_len, out.content, out.content_len, logprobs, 0);
    if (stopped) {
        atomic_store(&c->sr.cancel, 1); /* the engine's finish event frees the job */
        end_choice(c, FINISH_STOP, 1);
    }
}

static void on_token(jchoice *c, const sched_token *t) {
    job *j = c->job;
    server *s = j->srv;
    double tnow = now_s();
    if (c->n_gen == 0)
        metrics_ttft(&s->m, tnow - j->t_start);
    else
        metrics_itl(&s->m, tnow - c->t_last);
    c->t_last = tnow;
    c->n_gen++;
    j->n_gen++;
    if (j->http_done || c->ended) return;
    size_t len;
    const char *txt = textio_stream_push(c->ts, t->id, &len);
    json_object *lp = j->top_logprobs >= 0 ? api_token_logprobs(s->tio, t) : NULL;
    if (lp && !j->stream) {
        api_keep_logprobs(c, lp);
        lp = NULL;
    }
    on_text(c, txt, len, lp);
}

static void on_finish(jchoice *c, finish_reason why) {
    job *j = c->job;
    c->in_engine = 0;
    j->in_engine--;
    end_choice(c, why, 0);
    release(j);
}

/* Each choice's sequence, matcher and tool-call parser; then they join the queue. */
static void on_prep_done(job *j) {
    server *s = j->srv;
    j->in_prep = 0;
    if (!j->req) { /* the client left while we were tokenizing */
        release(j);
        return;
    }
    if (!j->error_code) api_choices_init(j, s->tio, s->gv);
    if (j->error_code) {
        j->http_done = 1;
        send_error(s, j->req, j->error_code,
                   j->error_code == 400 ? "invalid_request_error" : "server_error", j->error_param,
                   "%s", j->error);
        j->req = NULL;
        release(j);
        return;
    }
    for (int k = 0; k < j->n_choices; k++) {
        jchoice *c = &j->ch[k];
        c->sr.prompt = j->prompt;
        c->sr.n_prompt = j->n_prompt;
        c->sr.emit = on_emit;
        c->sr.user = c;
        c->sr.n_stop_ids = s->n_eos < 8 ? s->n_eos : 8;
        memcpy(c->sr.stop_ids, s->eos, (size_t)c->sr.n_stop_ids * sizeof(int32_t));
        if (j->ignore_eos) c->sr.n_stop_ids = 0;
        if (sched_submit(s->sch, &c->sr) != 0) {
            /* the choices already queued are cancelled; the reply is a 503 saying when to
             * come back: about the time the requests ahead take, from the recent mean */
            for (int i = 0; i < k; i++) atomic_store(&j->ch[i].sr.cancel, 1);
            j->http_done = 1;
            double mean = metrics_mean_seconds(&s->m);
            int after = (int)ceil(mean * (1 + s->o.queue / (double)s->o.parallel));
            char ra[16];
            snprintf(ra, sizeof ra, "%d", after < 1 ? 1 : after > 60 ? 60 : after);
            evhttp_add_header(evhttp_request_get_output_headers(j->req), "Retry-After", ra);
            send_error(s, j->req, 503, "server_error", NULL,
                       "the server is busy: %d requests are running and the wait queue (%d) is "
                       "full; retry after %s s",
                       s->o.parallel, s->o.queue, ra);
            j->req = NULL;
            release(j);
            return;
        }
        c->in_engine = 1;
        j->in_engine++;
    }
    /* A stream that names its cache starts when it joins the batch (on_admitted): opening
     * the cache may fail, and that answer is a 400, not a stream. */
    if (j->stream && !j->sr.cache[0]) start_stream(j);
}

static void on_admitted(job *j) {
    if (j->stream && !j->stream_started && j->req && !j->http_done) start_stream(j);
}

static int admin_swap(engine *e, void *arg) {
    admin_op *a = arg;
    return engine_swap_backend(e, a->backend, a->err, sizeof a->err);
}

static void *admin_main(void *arg) {
    admin_op *a = arg;
    a->rc = sched_call(a->srv->sch, admin_swap, a);
    ev_item *it = calloc(1, sizeof *it);
    if (it) {
        it->type = EV_ADMIN_DONE;
        it->admin = a;
        post(a->srv, it);
    }
    return NULL;
}

static void on_admin_close(struct evhttp_connection *c, void *arg) {
    (void)c;
    ((admin_op *)arg)->req = NULL;
}

static void on_admin_done(server *s, admin_op *a) {
    if (a->req) {
        evhttp_connection_set_closecb(evhttp_request_get_connection(a->req), NULL, NULL);
        if (a->rc == 0) {
            sched_stats st;
            sched_get_stats(s->sch, &st);
            json_object *o = json_object_new_object();
            json_object_object_add(o, "status", json_object_new_string("ok"));
            json_object_object_add(o, "backend", json_object_new_string(a->backend));
            json_object_object_add(o, "chain", json_object_new_string(st.chain));
            send_json(s, a->req, 200, o);
            json_object_put(o);
        } else {
            send_error(s, a->req, 409, "server_error", "backend",
                       "moving to backend '%s' failed; the old backend keeps serving: %s",
                       a->backend, a->err);
        }
    }
    log_msg(a->rc ? LMH_LOG_WARN : LMH_LOG_INFO, "admin: move to backend %s %s%s", a->backend,
            a->rc ? "failed: " : "done", a->rc ? a->err : "");
    s->admin = NULL;
    s->active--;
    free(a);
    maybe_exit(s);
}

static void handle_admin_backend(server *s, struct evhttp_request *req) {
    int code = 0;
    json_object *body = read_body(s, req, &code), *b = NULL;
    if (!body || !json_object_is_type(body, json_type_object) ||
        !json_object_object_get_ex(body, "backend", &b) ||
        !json_object_is_type(b, json_type_string) || json_object_get_string_len(b) == 0 ||
        json_object_get_string_len(b) >= (int)sizeof((admin_op *)0)->backend) {
        json_object_put(body);
        send_error(s, req, code == 413 ? 413 : 400, "invalid_request_error", "backend",
                   "the body must be a JSON object with a 'backend' name (NAME[:OPTIONS])");
        return;
    }
    if (s->admin) {
        json_object_put(body);
        send_error(s, req, 409, "invalid_request_error", NULL, "a backend move is in progress");
        return;
    }
    admin_op *a = calloc(1, sizeof *a);
    pthread_t th;
    if (!a) {
        json_object_put(body);
        send_error(s, req, 500, "server_error", NULL, "out of memory");
        return;
    }
    a->srv = s;
    a->req = req;
    snprintf(a->backend, sizeof a->backend, "%s", json_object_get_string(b));
    json_object_put(body);
    if (pthread_create(&th, NULL, admin_main, a) != 0) {
        free(a);
        send_error(s, req, 500, "server_error", NULL, "cannot start the move");
        return;
    }
    pthread_detach(th);
    s->admin = a;
    s->active++;
    evhttp_connection_set_closecb(evhttp_request_get_connection(req), on_admin_close, a);
}

/* ---- /v1/embeddings ----------------------------------------------------------------- */

/* An embeddings request: its inputs (texts, tokenized on the engine thread, or token ids),
 * run there between decode steps (sched_task), the vectors back to the loop. */
typedef struct embed_op {
    server *srv;
    struct evhttp_request *req; /* NULL once the client left */
    int n;
    char **texts;          /* [n], NULL where ids were given */
    int32_t **ids, *n_ids; /* [n] */
    int dims, b64;
    int32_t dim;
    float *out; /* [n][dim] */
    int64_t tokens;
    int code;
    char err[512], param[32];
} embed_op;

static void embed_free(embed_op *op) {
    for (int i = 0; i < op->n; i++) {
        if (op->texts) free(op->texts[i]);
        if (op->ids) free(op->ids[i]);
    }
    free(op->texts);
    free(op->ids);
    free(op->n_ids);
    free(op->out);
    free(op);
}

static void embed_fail(embed_op *op, int code, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void embed_fail(embed_op *op, int code, const char *param, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(op->err, sizeof op->err, fmt, ap);
    va_end(ap);
    op->code = code;
    snprintf(op->param, sizeof op->param, "%s", param ? param : "");
}

/* On the engine thread: tokenize, then run the inputs in batches of at most EMBED_BATCH
 * tokens (one engine step each). */
#define EMBED_BATCH 4096
static void embed_task(engine *e, void *arg) {
    embed_op *op = arg;
    server *s = op->srv;
    char err[512];
    for (int i = 0; i < op->n && !op->code; i++) {
        if (op->texts && op->texts[i] &&
            textio_encode(s->tio, op->texts[i], 0, &op->ids[i], &op->n_ids[i], err, sizeof err))
            embed_fail(op, 400, "input", "input %d: %s", i, err);
        else if (op->n_ids[i] == 0)
            embed_fail(op, 400, "input", "input %d is empty", i);
        else if (op->n_ids[i] > s->o.ctx_size)
            embed_fail(op, 400, "input",
                       "input %d has %d tokens; this model's maximum context length is %d", i,
                       op->n_ids[i], s->o.ctx_size);
        op->tokens += op->n_ids[i];
    }
    op->dim = engine_embed_dim(e);
    const char *why = NULL;
    if (!op->code && engine_embed_pooling(e, &why) < 0)
        embed_fail(op, 400, NULL, "this model's embeddings are off: %s", why ? why : "?");
    if (!op->code && op->dim <= 0)
        embed_fail(op, 400, NULL, "this model's config gives no hidden size to embed in");
    if (!op->code && !(op->out = malloc((size_t)op->n * (size_t)op->dim * sizeof(float))))
        embed_fail(op, 500, NULL, "out of memory");
    for (int i = 0; i < op->n && !op->code;) {
        int k = i + 1;
        int64_t sum = op->n_ids[i];
        while (k < op->n && sum + op->n_ids[k] <= EMBED_BATCH) sum += op->n_ids[k++];
        if (engine_embed(e, (const int32_t *const *)op->ids + i, op->n_ids + i, k - i,
                         ENGINE_POOL_MODEL, op->out + (size_t)i * (size_t)op->dim, err,
                         sizeof err) != 0)
            embed_fail(op, 500, NULL, "embedding failed: %s", err);
        i = k;
    }
    ev_item *it = calloc(1, sizeof *it);
    if (!it) return; /* lost; the client times out */
    it->type = EV_EMBED_DONE;
    it->emb = op;
    post(s, it);
}

static const char B64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

static json_object *base64_floats(const float *v, int n) {
    const unsigned char *b = (const unsigned char *)v; /* little-endian float32, as OpenAI's */
    size_t len = (size_t)n * 4, o = 0;
    char *out = malloc((len + 2) / 3 * 4 + 1);
    if (!out) return NULL;
    for (size_t i = 0; i < len; i += 3) {
        uint32_t x = (uint32_t)b[i] << 16 | (i + 1 < len ? (uint32_t)b[i + 1] << 8 : 0) |
                     (i + 2 < len ? b[i + 2] : 0);
        out[o++] = B64[x >> 18 & 63];
        out[o++] = B64[x >> 12 & 63];
        out[o++] = i + 1 < len ? B64[x >> 6 & 63] : '=';
        out[o++] = i + 2 < len ? B64[x & 63] : '=';
    }
    out[o] = 0;
    json_object *j = json_object_new_string_len(out, (int)o);
    free(out);
    return j;
}

static void on_embed_done(server *s, embed_op *op) {
    s->active--;
    if (!op->req) {
        embed_free(op);
        return;
    }
    if (!op->code && op->dims > op->dim)
        embed_fail(op, 400, "dimensions", "'dimensions' %d is more than the model's %d", op->dims,
                   op->dim);
    if (op->code) {
        send_error(s, op->req, op->code, op->code == 400 ? "invalid_request_error" : "server_error",
                   op->param[0] ? op->param : NULL, "%s", op->err);
        embed_free(op);
        return;
    }
    json_object *o = json_object_new_object(), *data = json_object_new_array();
    json_object_object_add(o, "object", json_object_new_string("list"));
    int d = op->dims ? op->dims : op->dim;
    for (int i = 0; i < op->n; i++) {
        float *v = op->out + (size_t)i * (size_t)op->dim;
        if (d < op->dim) { /* truncated, then of length 1 again (as OpenAI's dimensions) */
            double ss = 0;
            for (int k = 0; k < d; k++) ss += (double)v[k] * v[k];
            double inv = ss > 0 ? 1.0 / sqrt(ss) : 0;
            for (int k = 0; k < d; k++) v[k] = (float)(v[k] * inv);
        }
        json_object *item = json_object_new_object();
        json_object_object_add(item, "object", json_object_new_string("embedding"));
        json_object_object_add(item, "index", json_object_new_int(i));
        json_object *vec;
        if (op->b64) {
            vec = base64_floats(v, d);
        } else {
            vec = json_object_new_array_ext(d);
            for (int k = 0; k < d; k++) json_object_array_add(vec, float_json(v[k], 9));
        }
        json_object_object_add(item, "embedding", vec);
        json_object_array_add(data, item);
    }
    json_object_object_add(o, "data", data);
    json_object_object_add(o, "model", json_object_new_string(s->model_name));
    json_object *u = json_object_new_object();
    json_object_object_add(u, "prompt_tokens", json_object_new_int64(op->tokens));
    json_object_object_add(u, "total_tokens", json_object_new_int64(op->tokens));
    json_object_object_add(o, "usage", u);
    send_json(s, op->req, 200, o);
    json_object_put(o);
    embed_free(op);
}

static void on_embed_close(struct evhttp_connection *c, void *arg) {
    (void)c;
    embed_op *op = arg;
    if (op->req && !evhttp_request_get_connection(op->req)) evhttp_request_free(op->req);
    op->req = NULL;
}

/* A token-id list, or NULL with op's error set. */
static int read_ids(embed_op *op, int i, json_object *arr) {
    size_t n = json_object_array_length(arr);
    if (!(op->ids[i] = malloc((n ? n : 1) * sizeof(int32_t)))) return -1;
    for (size_t k = 0; k < n; k++) {
        json_object *t = json_object_array_get_idx(arr, k);
        int64_t id = json_object_is_type(t, json_type_int) ? json_object_get_int64(t) : -1;
        if (id < 0 || id >= engine_vocab(op->srv->e)) {
            embed_fail(op, 400, "input", "input %d: token %zu is not an id of the vocabulary", i,
                       k);
            return -1;
        }
        op->ids[i][k] = (int32_t)id;
    }
    op->n_ids[i] = (int32_t)n;
    return 0;
}

static void handle_embeddings(server *s, struct evhttp_request *req) {
    int code = 0;
    json_object *b = read_body(s, req, &code), *in = NULL, *v;
    if (!b) {
        send_error(s, req, code, code == 500 ? "server_error" : "invalid_request_error", NULL,
                   code == 413   ? "request body is larger than the limit"
                   : code == 400 ? "the request body is not valid JSON"
                                 : "out of memory");
        return;
    }
    embed_op *op = calloc(1, sizeof *op);
    if (!op) goto oom;
    op->srv = s;
    if (!json_object_is_type(b, json_type_object) || !json_object_object_get_ex(b, "input", &in) ||
        !in) {
        embed_fail(op, 400, "input",
                   "'input' is required: a string, a list of strings, a list "
                   "of token ids or a list of such lists");
        goto bad;
    }
    /* one input (a string or one list of ids) or a list of them */
    int one = json_object_is_type(in, json_type_string) ||
              (json_object_is_type(in, json_type_array) && json_object_array_length(in) > 0 &&
               json_object_is_type(json_object_array_get_idx(in, 0), json_type_int));
    op->n = one                                        ? 1
            : json_object_is_type(in, json_type_array) ? (int)json_object_array_length(in)
                                                       : 0;
    if (op->n <= 0 || op->n > 2048) {
        embed_fail(op, 400, "input", "'input' must hold 1 to 2048 inputs");
        goto bad;
    }
    op->texts = calloc((size_t)op->n, sizeof *op->texts);
    op->ids = calloc((size_t)op->n, sizeof *op->ids);
    op->n_ids = calloc((size_t)op->n, sizeof *op->n_ids);
    if (!op->texts || !op->ids || !op->n_ids) goto oom;
    for (int i = 0; i < op->n; i++) {
        json_object *x = one ? in : json_object_array_get_idx(in, (size_t)i);
        if (json_object_is_type(x, json_type_string)) {
            if (!(op->texts[i] = strdup(json_object_get_string(x)))) goto oom;
        } else if (json_object_is_type(x, json_type_array)) {
            if (read_ids(op, i, x) != 0) {
                if (!op->code) goto oom;
                goto bad;
            }
        } else {
            embed_fail(op, 400, "input", "input %d must be a string or a list of token ids", i);
            goto bad;
        }
    }
    if (json_object_object_get_ex(b, "encoding_format", &v) && v) {
        const char *f = json_object_is_type(v, json_type_string) ? json_object_get_string(v) : "";
        if (strcmp(f, "base64") == 0)
            op->b64 = 1;
        else if (strcmp(f, "float") != 0) {
            embed_fail(op, 400, "encoding_format", "'encoding_format' must be float or base64");
            goto bad;
        }
    }
    if (json_object_object_get_ex(b, "dimensions", &v) && v) {
        int64_t d = json_object_is_type(v, json_type_int) ? json_object_get_int64(v) : 0;
        if (d < 1 || d > engine_embed_dim(s->e)) {
            embed_fail(op, 400, "dimensions", "'dimensions' must be an integer from 1 to %d",
                       engine_embed_dim(s->e));
            goto bad;
        }
        op->dims = (int)d;
    }
    if (json_object_object_get_ex(b, "user", &v) && v &&
        !json_object_is_type(v, json_type_string)) {
        embed_fail(op, 400, "user", "'user' must be a string");
        goto bad;
    }
    json_object_put(b);
    op->req = req;
    s->active++;
    evhttp_connection_set_closecb(evhttp_request_get_connection(req), on_embed_close, op);
    if (sched_task(s->sch, embed_task, op) != 0) {
        s->active--;
        send_error(s, req, 503, "server_error", NULL, "the server is shutting down");
        embed_free(op);
    }
    return;
bad:
    send_error(s, req, op->code, "invalid_request_error", op->param[0] ? op->param : NULL, "%s",
               op->err);
    embed_free(op);
    json_object_put(b);
    return;
oom:
    send_error(s, req, 500, "server_error", NULL, "out of memory");
    if (op) embed_free(op);
    json_object_put(b);
}

static void on_loaded(server *s);

static void drain_queue(evutil_socket_t fd, short what, void *arg) {
    (void)fd;
    (void)what;
    server *s = arg;
    pthread_mutex_lock(&s->qmu);
    ev_item *it = s->qhead;
    s->qhead = s->qtail = NULL;
    pthread_mutex_unlock(&s->qmu);
    while (it) {
        ev_item *next = it->next;
        switch (it->type) {
        case EV_PREP_DONE:
            on_prep_done(it->j);
            break;
        case EV_ADMITTED:
            on_admitted(it->j);
            break;
        case EV_TOKEN:
            on_token(it->c, &it->tok);
            break;
        case EV_FINISH:
            on_finish(it->c, it->why);
            break;
        case EV_ADMIN_DONE:
            on_admin_done(s, it->admin);
            break;
        case EV_EMBED_DONE:
            on_embed_done(s, it->emb);
            break;
        case EV_LOADED:
            on_loaded(s);
            break;
        }
        if (it != &s->load_done) free(it);
        it = next;
    }
    maybe_exit(s);
}

/* A job is freed once neither the engine nor the prep thread holds it and its reply is
 * done or its client gone. */
static void release(job *j) {
    if (j->in_engine || j->in_prep) return;
    if (j->req && !j->http_done) return;
    server *s = j->srv;
    s->active--;
    job_free(j);
}

static void on_close(struct evhttp_connection *c, void *arg) {
    (void)c;
    job *j = arg;
    /* A client that leaves mid-reply: libevent 2.1 detaches the request (no connection) and
     * leaves it to us; one still attached it frees after this callback. */
    if (j->req && !evhttp_request_get_connection(j->req)) evhttp_request_free(j->req);
    j->req = NULL;
    j->http_done = 1;
    for (int k = 0; k < j->n_choices; k++) atomic_store(&j->ch[k].sr.cancel, 1);
    metrics_disconnect(&j->srv->m);
    if (!j->in_engine && !j->in_prep) release(j);
}

/* ---- the prep thread: chat template and tokenizer ------------------------------------- */

static void prep(server *s, job *j) {
    char err[1024] = "";
    char *text = NULL;
    if (j->kind == JOB_CHAT) {
        if (!textio_has_template(s->tio)) {
            job_fail(j, 400, NULL, "this model has no chat template; use /v1/completions");
            return;
        }
        if (textio_render(s->tio, j->messages, j->tools, j->vars, 1, &text, err, sizeof err)) {
            job_fail(j, 400, "messages", err);
            return;
        }
        j->think = text_prompt_opens_think(text);
        if (textio_encode(s->tio, text, 0, &j->prompt, &j->n_prompt, err, sizeof err)) {
            free(text);
            job_fail(j, 400, "messages", err);
            return;
        }
        free(text);
    } else if (!j->prompt) {
        if (textio_encode(s->tio, j->prompt_text, 1, &j->prompt, &j->n_prompt, err, sizeof err)) {
            job_fail(j, 400, "prompt", err);
            return;
        }
    }
    int32_t vocab = engine_vocab(s->e);
    for (int32_t i = 0; i < j->n_prompt; i++)
        if (j->prompt[i] < 0 || j->prompt[i] >= vocab) {
            snprintf(err, sizeof err, "token id %d is outside the vocabulary (%d)", j->prompt[i],
                     vocab);
            job_fail(j, 400, "prompt", err);
            return;
        }
    if (j->n_prompt == 0) {
        job_fail(j, 400, j->kind == JOB_CHAT ? "messages" : "prompt", "the prompt is empty");
        return;
    }
    if ((int64_t)j->n_prompt + j->max_tokens > s->o.ctx_size) {
        snprintf(err, sizeof err,
                 "This model's maximum context length is %d tokens. However, you requested %lld "
                 "tokens (%d in the prompt, %d for the completion). Please reduce the length of "
                 "the prompt or of max_tokens.",
                 s->o.ctx_size, (long long)j->n_prompt + j->max_tokens, j->n_prompt, j->max_tokens);
        job_fail(j, 400, "messages", err);
        return;
    }
}

/* The prep thread's work on one job taken off its queue: prep, then back to the loop.
 * (tests/fuzz/fuzz_http.c calls it on the loop's thread instead, so its runs repeat.) */
static void prep_one(server *s, job *j) {
    prep(s, j);
    ev_item *it = calloc(1, sizeof *it);
    if (it) {
        it->type = EV_PREP_DONE;
        it->j = j;
        /* in_prep is cleared on the loop thread, where it is read */
        post(s, it);
    }
}

static void *prep_main(void *arg) {
    server *s = arg;
    pthread_mutex_lock(&s->pmu);
    for (;;) {
        while (!s->prep_head && !s->prep_stop) pthread_cond_wait(&s->pcv, &s->pmu);
        if (!s->prep_head) break;
        job *j = s->prep_head;
        s->prep_head = j->prep_next;
        if (!s->prep_head) s->prep_tail = NULL;
        pthread_mutex_unlock(&s->pmu);
        prep_one(s, j);
        pthread_mutex_lock(&s->pmu);
    }
    pthread_mutex_unlock(&s->pmu);
    return NULL;
}

/* ---- routes --------------------------------------------------------------------------- */

/* Authorization: Bearer KEY, compared in time that does not depend on where it differs. */
static int key_matches(struct evhttp_request *req, const char *key) {
    const char *h = evhttp_find_header(evhttp_request_get_input_headers(req), "Authorization");
    if (!h || strncasecmp(h, "Bearer ", 7) != 0) return 0;
    const char *k = h + 7;
    size_t kl = strlen(k), want = strlen(key);
    unsigned char diff = (unsigned char)(kl != want);
    for (size_t i = 0; i < want; i++) diff |= (unsigned char)(key[i] ^ (i < kl ? k[i] : 0));
    return diff == 0;
}

static int authorized(server *s, struct evhttp_request *req) {
    return !s->o.api_key || key_matches(req, s->o.api_key);
}

static json_object *read_body(struct server *s, struct evhttp_request *req, int *code) {
    struct evbuffer *b = evhttp_request_get_input_buffer(req);
    size_t len = evbuffer_get_length(b);
    if (len > s->o.max_body) {
        *code = 413;
        return NULL;
    }
    char *buf = malloc(len + 1);
    if (!buf) {
        *code = 500;
        return NULL;
    }
    evbuffer_copyout(b, buf, len);
    buf[len] = 0;
    int oom;
    json_object *o = api_parse_body(buf, len, &oom);
    free(buf);
    if (!o) *code = oom ? 500 : 400;
    return o;
}

static void handle_generate(server *s, struct evhttp_request *req, job_kind kind) {
    int code = 0;
    json_object *body = read_body(s, req, &code);
    if (!body) {
        if (code == 413)
            send_error(s, req, 413, "invalid_request_error", NULL,
                       "request body is larger than %zu bytes", s->o.max_body);
        else if (code == 400)
            send_error(s, req, 400, "invalid_request_error", NULL,
                       "the request body is not valid JSON");
        else
            send_error(s, req, 500, "server_error", NULL, "out of memory");
        return;
    }
    char err[512], param[64] = "";
    job *j =
        job_from_request(kind, body, &s->o, s->model_name, err, sizeof err, param, sizeof param);
    json_object_put(body);
    if (!j) {
        send_error(s, req, 400, "invalid_request_error", param[0] ? param : NULL, "%s", err);
        return;
    }
    if (j->kv_bits) { /* kv_bits: the format a cache plugin says it stands for */
        char spec[96], served[64];
        if (cache_spec_kv_bits(&s->reg, j->kv_bits, spec, sizeof spec, served, sizeof served)) {
            send_error(s, req, 400, "invalid_request_error", "kv_bits",
                       served[0] ? "'kv_bits' %d is not served: this server quantizes the cache "
                                   "to kv_bits %s"
                                 : "'kv_bits' %d is not served: no cache plugin here quantizes "
                                   "to a kv_bits%s",
                       j->kv_bits, served);
            job_free(j);
            return;
        }
        if (j->kv_group)
            snprintf(j->sr.cache, sizeof j->sr.cache, "%s,group=%d", spec, j->kv_group);
        else
            snprintf(j->sr.cache, sizeof j->sr.cache, "%s", spec);
    }
    cache_spec cs;
    if (j->sr.cache[0] && cache_spec_parse(&s->reg, j->sr.cache, &cs, err, sizeof err) != 0) {
        /* known here (the registry is read-only); what the plugin thinks comes at admission */
        send_error(s, req, 400, "invalid_request_error", j->cache_field, "%s: %s", j->cache_what,
                   err);
        job_free(j);
        return;
    }
    int32_t moe_k = engine_moe_top_k(s->e, NULL);
    if (j->sr.moe_top_k && (!moe_k || j->sr.moe_top_k > moe_k)) {
        if (moe_k)
            send_error(s, req, 400, "invalid_request_error", "moe_top_k",
                       "'moe_top_k' must be 1 to %d: the model routes each token to %d experts",
                       moe_k, moe_k);
        else
            send_error(s, req, 400, "invalid_request_error", "moe_top_k",
                       "'moe_top_k': this model has no experts whose number a token uses could "
                       "change");
        job_free(j);
        return;
    }
    j->srv = s;
    j->req = req;
    j->t_start = now_s();
    const char *rid = evhttp_find_header(evhttp_request_get_output_headers(req), "X-Request-Id");
    snprintf(j->rid, sizeof j->rid, "%s", rid ? rid : "-");
    if (api_constrain(j, &s->tc_format, err, sizeof err, param, sizeof param) != 0) {
        send_error(s, req, 400, "invalid_request_error", param[0] ? param : NULL, "%s", err);
        job_free(j);
        return;
    }
    s->active++;
    metrics_received(&s->m);
    evhttp_connection_set_closecb(evhttp_request_get_connection(req), on_close, j);
    j->in_prep = 1;
    pthread_mutex_lock(&s->pmu);
    j->prep_next = NULL;
    if (s->prep_tail)
        s->prep_tail->prep_next = j;
    else
        s->prep_head = j;
    s->prep_tail = j;
    pthread_cond_signal(&s->pcv);
    pthread_mutex_unlock(&s->pmu);
}

/* Seconds the load may still take, from its pace so far (5 before it has one), for the
 * Retry-After of requests that come meanwhile. */
static int load_eta(server *s, double *elapsed) {
    double t = now_s() - s->load_t0;
    uint64_t done = atomic_load(&s->load_bytes), total = atomic_load(&s->load_total);
    if (elapsed) *elapsed = t;
    if (!done || !total || done >= total) return 5;
    double left = t * (double)(total - done) / (double)done;
    return left < 1 ? 1 : left > 60 ? 60 : (int)ceil(left);
}

/* /health while the model loads: 503 and how far the weights have come. */
static void health_loading(server *s, struct evhttp_request *req) {
    double t;
    char ra[16];
    snprintf(ra, sizeof ra, "%d", load_eta(s, &t));
    uint64_t done = atomic_load(&s->load_bytes), total = atomic_load(&s->load_total);
    json_object *o = json_object_new_object(), *l = json_object_new_object();
    json_object_object_add(o, "status", json_object_new_string("loading"));
    json_object_object_add(o, "model", json_object_new_string(s->model_name));
    json_object_object_add(l, "loaded_bytes", json_object_new_int64((int64_t)done));
    json_object_object_add(l, "total_bytes", json_object_new_int64((int64_t)total));
    json_object_object_add(l, "progress",
                           float_json(total ? (float)((double)done / (double)total) : 0.0f, 3));
    json_object_object_add(l, "seconds", float_json((float)t, 3));
    json_object_object_add(o, "load", l);
    evhttp_add_header(evhttp_request_get_output_headers(req), "Retry-After", ra);
    send_json(s, req, 503, o);
    json_object_put(o);
}

/* 200 only while serving: a balancer sends requests to a replica whose /health is 200. */
static void handle_health(server *s, struct evhttp_request *req) {
    if (s->phase == PH_LOADING) {
        health_loading(s, req);
        return;
    }
    sched_stats st;
    sched_get_stats(s->sch, &st);
    json_object *o = json_object_new_object();
    json_object_object_add(o, "status",
                           json_object_new_string(s->phase == PH_SERVING ? "ok" : "draining"));
    json_object_object_add(o, "model", json_object_new_string(s->model_name));
    json_object *caps = json_object_new_array();
    json_object_array_add(caps, json_object_new_string("completions"));
    if (textio_has_template(s->tio)) json_object_array_add(caps, json_object_new_string("chat"));
    json_object_array_add(caps, json_object_new_string("streaming"));
    json_object_array_add(caps, json_object_new_string("logprobs"));
    json_object_array_add(caps, json_object_new_string("embeddings"));
    if (s->gv) json_object_array_add(caps, json_object_new_string("structured_output"));
    if (s->gv && s->tc_format.api) json_object_array_add(caps, json_object_new_string("tools"));
    json_object_object_add(o, "capabilities", caps);
    json_object_object_add(o, "tool_call_format",
                           json_object_new_string(tc_format_name(&s->tc_format)));
    /* the settings a request runs under, as the command line set them */
    json_object *lim = json_object_new_object();
    json_object_object_add(lim, "parallel", json_object_new_int(s->o.parallel));
    json_object_object_add(lim, "queue", json_object_new_int(s->o.queue));
    json_object_object_add(lim, "max_connections", json_object_new_int(s->conn_max));
    json_object_object_add(lim, "rate_limit", json_object_new_int(s->o.rate_limit));
    json_object_object_add(lim, "ctx_size", json_object_new_int(s->o.ctx_size));
    json_object_object_add(lim, "max_tokens", json_object_new_int(s->o.max_tokens));
    json_object_object_add(lim, "chunk", json_object_new_int(s->o.chunk));
    json_object_object_add(lim, "timeout", json_object_new_int(s->o.timeout));
    json_object_object_add(lim, "shutdown_grace", json_object_new_int(s->o.shutdown_grace));
    json_object_object_add(lim, "drain_delay", json_object_new_int(s->o.drain_delay));
    json_object_object_add(lim, "max_body", json_object_new_int64((int64_t)s->o.max_body));
    json_object_object_add(lim, "threads",
                           json_object_new_int(s->o.engine.threads
                                                   ? s->o.engine.threads
                                                   : (int)sysconf(_SC_NPROCESSORS_ONLN)));
    json_object_object_add(o, "limits", lim);
    json_object *sd = json_object_new_object();
    json_object_object_add(sd, "temperature", float_json(s->o.defaults.temperature, 7));
    json_object_object_add(sd, "top_k", json_object_new_int(s->o.defaults.top_k));
    json_object_object_add(sd, "top_p", float_json(s->o.defaults.top_p, 7));
    json_object_object_add(sd, "min_p", float_json(s->o.defaults.min_p, 7));
    json_object_object_add(o, "sampling_defaults", sd);
    json_object_object_add(o, "chain", json_object_new_string(st.chain));
    json_object_object_add(o, "precision", json_object_new_string(st.precision));
    json_object *mem = json_object_new_array();
    for (int i = 0; i < st.engine.n_backends; i++) {
        json_object *b = json_object_new_object();
        json_object_object_add(b, "backend", json_object_new_string(st.engine.backend[i].name));
        json_object_object_add(b, "weights_bytes",
                               json_object_new_int64((int64_t)st.engine.backend[i].weights));
        json_object_object_add(b, "mapped_weights_bytes",
                               json_object_new_int64((int64_t)st.engine.backend[i].mapped));
        json_object_object_add(b, "cache_and_scratch_bytes",
                               json_object_new_int64((int64_t)st.engine.backend[i].other));
        json_object_object_add(b, "device", json_object_new_int(st.engine.backend[i].device));
        if (st.engine.backend[i].first_layer >= 0) { /* the layers it runs: [first, last] */
            json_object *ly = json_object_new_array();
            json_object_array_add(ly, json_object_new_int(st.engine.backend[i].first_layer));
            json_object_array_add(ly, json_object_new_int(st.engine.backend[i].last_layer));
            json_object_object_add(b, "layers", ly);
        }
        json_object_array_add(mem, b);
    }
    json_object_object_add(o, "memory", mem);
    int32_t n_exp = 0, top_k = engine_moe_top_k(s->e, &n_exp);
    const engine_expert_stats *x = &st.engine.experts;
    if (top_k || x->streamed) { /* a mixture of experts: routing, and what is resident */
        json_object *xo = json_object_new_object();
        json_object_object_add(xo, "experts", json_object_new_int(n_exp));
        json_object_object_add(xo, "top_k", json_object_new_int(top_k));
        json_object_object_add(
            xo, "moe_top_k",
            json_object_new_int(s->o.engine.moe_top_k ? s->o.engine.moe_top_k : top_k));
        json_object_object_add(xo, "streamed", json_object_new_boolean(x->streamed));
        if (x->streamed) {
            json_object_object_add(xo, "budget_bytes",
                                   json_object_new_int64((int64_t)x->budget_bytes));
            json_object_object_add(xo, "resident_bytes",
                                   json_object_new_int64((int64_t)x->resident_bytes));
            json_object_object_add(xo, "stack_bytes",
                                   json_object_new_int64((int64_t)x->stack_bytes));
            json_object_object_add(xo, "expert_bytes",
                                   json_object_new_int64((int64_t)x->expert_bytes));
        }
        json_object_object_add(o, "experts", xo);
    }
    json_object_object_add(o, "running", json_object_new_int(st.running));
    json_object_object_add(o, "waiting", json_object_new_int(st.waiting));
    json_object_object_add(o, "cache_bytes", json_object_new_int64((int64_t)st.cache_bytes));
    /* each cache open (requests pick theirs; the first is --cache's), as of the last step */
    json_object *caches = json_object_new_array();
    for (int i = 0; i < st.engine.n_caches; i++) {
        const engine_cache_stats *c = &st.engine.cache[i];
        json_object *b = json_object_new_object();
        json_object_object_add(b, "format", json_object_new_string(c->name));
        json_object_object_add(b, "plugin", json_object_new_string(c->plugin));
        json_object_object_add(b, "default", json_object_new_boolean(c->index == 0));
        json_object_object_add(b, "bytes", json_object_new_int64((int64_t)c->bytes));
        json_object_object_add(b, "sequences", json_object_new_int(c->seqs));
        json_object_array_add(caches, b);
    }
    json_object_object_add(o, "caches", caches);
    json_object *sp = json_object_new_object();
    json_object_object_add(sp, "mode",
                           json_object_new_string(st.spec == SPEC_NGRAM   ? "ngram"
                                                  : st.spec == SPEC_DRAFT ? "draft"
                                                                          : "off"));
    if (st.spec) {
        json_object_object_add(sp, "draft_max", json_object_new_int(spec_draft_max(s->sp)));
        json_object_object_add(sp, "proposed", json_object_new_int64((int64_t)st.spec_st.drafted));
        json_object_object_add(sp, "accepted", json_object_new_int64((int64_t)st.spec_st.accepted));
    }
    if (s->draft) json_object_object_add(sp, "draft_chain", json_object_new_string(s->draft_chain));
    json_object_object_add(o, "speculative", sp);
    send_json(s, req, s->phase == PH_SERVING ? 200 : 503, o);
    json_object_put(o);
}

/* Liveness: the loop answers, whatever the phase (a probe that restarts what fails it must
 * not fail a server that is loading or draining). */
static void handle_live(server *s, struct evhttp_request *req) {
    json_object *o = json_object_new_object();
    json_object_object_add(o, "status", json_object_new_string("alive"));
    send_json(s, req, 200, o);
    json_object_put(o);
}

static void handle_models(server *s, struct evhttp_request *req) {
    json_object *o = json_object_new_object(), *data = json_object_new_array(),
                *m = json_object_new_object();
    json_object_object_add(m, "id", json_object_new_string(s->model_name));
    json_object_object_add(m, "object", json_object_new_string("model"));
    json_object_object_add(m, "created", json_object_new_int64(s->m.started));
    json_object_object_add(m, "owned_by", json_object_new_string("lmhost"));
    json_object_array_add(data, m);
    json_object_object_add(o, "object", json_object_new_string("list"));
    json_object_object_add(o, "data", data);
    send_json(s, req, 200, o);
    json_object_put(o);
}

static void handle_metrics(server *s, struct evhttp_request *req) {
    sched_stats st = {0};
    if (s->sch) sched_get_stats(s->sch, &st); /* none while loading */
    struct evbuffer *b = evbuffer_new();
    metrics_render(&s->m, b, st.running, st.waiting, st.cache_bytes, &st.engine,
                   st.prefix.budget ? &st.prefix : NULL, st.spec ? &st.spec_st : NULL,
                   st.constrained_tokens, st.mask_seconds);
    evbuffer_add_printf(b,
                        "# HELP lmhost_connections Client connections open.\n"
                        "# TYPE lmhost_connections gauge\nlmhost_connections %d\n"
                        "# HELP lmhost_connections_max The most that may be open "
                        "(--max-connections).\n"
                        "# TYPE lmhost_connections_max gauge\nlmhost_connections_max %d\n"
                        "# HELP lmhost_slow_requests_closed_total Connections closed because "
                        "their request took over --timeout to arrive.\n"
                        "# TYPE lmhost_slow_requests_closed_total counter\n"
                        "lmhost_slow_requests_closed_total %llu\n"
                        "# HELP lmhost_ready 1 while /health answers 200; 0 while the model "
                        "loads or the server drains.\n"
                        "# TYPE lmhost_ready gauge\nlmhost_ready %d\n"
                        "# HELP lmhost_draining 1 from SIGTERM or SIGINT until the exit.\n"
                        "# TYPE lmhost_draining gauge\nlmhost_draining %d\n",
                        cg_open(s->guard), s->conn_max, cg_slow_closed(s->guard),
                        s->phase == PH_SERVING, s->phase >= PH_DRAINING);
    evhttp_add_header(evhttp_request_get_output_headers(req), "Content-Type",
                      "text/plain; version=0.0.4");
    track_reply(s, req);
    evhttp_send_reply(req, 200, "OK", b);
    evbuffer_free(b);
    count_status(s, 200);
}

/* The request's id: the client's X-Request-Id when it is a short token, else one of ours;
 * sent back in X-Request-Id and named in the logs (never the prompt or the key). */
static void request_id(server *s, struct evhttp_request *req, char *out, size_t n) {
    const char *h = evhttp_find_header(evhttp_request_get_input_headers(req), "X-Request-Id");
    size_t hl = h ? strlen(h) : 0;
    int ok = hl > 0 && hl < 64;
    for (size_t i = 0; ok && i < hl; i++)
        ok = (h[i] >= 'a' && h[i] <= 'z') || (h[i] >= 'A' && h[i] <= 'Z') ||
             (h[i] >= '0' && h[i] <= '9') || h[i] == '-' || h[i] == '_' || h[i] == '.';
    if (ok)
        snprintf(out, n, "%s", h);
    else
        snprintf(out, n, "req-%llx-%llx", (unsigned long long)s->m.started, ++s->req_seq);
}

static void route(struct evhttp_request *req, void *arg) {
    server *s = arg;
    const char *uri = evhttp_request_get_uri(req);
    char rid[72], peer[64] = "?";
    request_id(s, req, rid, sizeof rid);
    evhttp_add_header(evhttp_request_get_output_headers(req), "X-Request-Id", rid);
    struct evhttp_connection *conn = evhttp_request_get_connection(req);
    if (conn) {
        cg_request(s->guard, evhttp_connection_get_bufferevent(conn));
        char *addr = NULL;
        ev_uint16_t pport = 0;
        evhttp_connection_get_peer(conn, &addr, &pport);
        if (addr) snprintf(peer, sizeof peer, "%s", addr);
    }
    char path[256];
    size_t pl = strcspn(uri, "?#");
    snprintf(path, sizeof path, "%.*s", (int)(pl < 255 ? pl : 255), uri);
    enum evhttp_cmd_type m = evhttp_request_get_command(req);
    enum { R_HEALTH, R_LIVE, R_METRICS, R_MODELS, R_CHAT, R_COMPLETIONS, R_EMBEDDINGS, R_ADMIN };
    /* auth: 1 the API key, 2 the admin key. Probes (/health, /health/live, /metrics) are
     * never rate-limited nor gated on the phase: balancers and monitors poll them. */
    static const struct {
        const char *path;
        enum evhttp_cmd_type method;
        int auth, probe;
    } routes[] = {[R_HEALTH] = {"/health", EVHTTP_REQ_GET, 0, 1},
                  [R_LIVE] = {"/health/live", EVHTTP_REQ_GET, 0, 1},
                  [R_METRICS] = {"/metrics", EVHTTP_REQ_GET, 0, 1},
                  [R_MODELS] = {"/v1/models", EVHTTP_REQ_GET, 1, 0},
                  [R_CHAT] = {"/v1/chat/completions", EVHTTP_REQ_POST, 1, 0},
                  [R_COMPLETIONS] = {"/v1/completions", EVHTTP_REQ_POST, 1, 0},
                  [R_EMBEDDINGS] = {"/v1/embeddings", EVHTTP_REQ_POST, 1, 0},
                  [R_ADMIN] = {"/admin/backend", EVHTTP_REQ_POST, 2, 0}};
    int found = -1;
    for (size_t i = 0; i < sizeof routes / sizeof *routes; i++)
        if (strcmp(path, routes[i].path) == 0) found = (int)i;
    log_msg(LMH_LOG_DEBUG, "%s: %s %s from %s", rid,
            m == EVHTTP_REQ_GET    ? "GET"
            : m == EVHTTP_REQ_POST ? "POST"
                                   : "other",
            path, peer);
    /* Draining: each reply closes its connection, so that keep-alive clients (behind an L4
     * balancer such as a Kubernetes Service) reconnect to a replica that is not going away. */
    if (s->phase >= PH_DRAINING)
        evhttp_add_header(evhttp_request_get_output_headers(req), "Connection", "close");
    if (found < 0) {
        send_error(s, req, 404, "invalid_request_error", NULL, "unknown route %s", path);
        return;
    }
    int wait = s->rl && !routes[found].probe ? rl_take(s->rl, peer, now_s()) : 0;
    if (wait) {
        char ra[16];
        snprintf(ra, sizeof ra, "%d", wait);
        evhttp_add_header(evhttp_request_get_output_headers(req), "Retry-After", ra);
        send_error(s, req, 429, "rate_limit_exceeded", NULL,
                   "more than %d requests a minute from %s; retry after %d s", s->o.rate_limit,
                   peer, wait);
        return;
    }
    if (m != routes[found].method) {
        evhttp_add_header(evhttp_request_get_output_headers(req), "Allow",
                          routes[found].method == EVHTTP_REQ_GET ? "GET" : "POST");
        send_error(s, req, 405, "invalid_request_error", NULL, "%s takes %s", path,
                   routes[found].method == EVHTTP_REQ_GET ? "GET" : "POST");
        return;
    }
    if (routes[found].auth == 2) { /* admin routes: their own key, off without one */
        if (!s->o.admin_key) {
            send_error(s, req, 403, "invalid_request_error", NULL,
                       "the admin API is off; start the server with --admin-key");
            return;
        }
        if (!key_matches(req, s->o.admin_key)) {
            send_error(s, req, 401, "invalid_request_error", NULL, "missing or wrong admin key");
            return;
        }
    } else if (routes[found].auth && !authorized(s, req)) {
        send_error(s, req, 401, "invalid_request_error", NULL,
                   "missing or wrong API key (send Authorization: Bearer KEY)");
        return;
    }
    if (!routes[found].probe && s->phase == PH_LOADING) {
        char ra[16];
        snprintf(ra, sizeof ra, "%d", load_eta(s, NULL));
        evhttp_add_header(evhttp_request_get_output_headers(req), "Retry-After", ra);
        send_error(s, req, 503, "server_error", NULL, "the model is loading; retry after %s s", ra);
        return;
    }
    if (s->phase == PH_STOPPING && routes[found].method == EVHTTP_REQ_POST) {
        /* another replica can take it now */
        evhttp_add_header(evhttp_request_get_output_headers(req), "Retry-After", "1");
        send_error(s, req, 503, "server_error", NULL, "the server is shutting down");
        return;
    }
    switch (found) {
    case R_HEALTH:
        handle_health(s, req);
        break;
    case R_LIVE:
        handle_live(s, req);
        break;
    case R_METRICS:
        handle_metrics(s, req);
        break;
    case R_MODELS:
        handle_models(s, req);
        break;
    case R_CHAT:
        handle_generate(s, req, JOB_CHAT);
        break;
    case R_COMPLETIONS:
        handle_generate(s, req, JOB_COMPLETION);
        break;
    case R_EMBEDDINGS:
        handle_embeddings(s, req);
        break;
    case R_ADMIN:
        handle_admin_backend(s, req);
        break;
    }
}

/* ---- connections ------------------------------------------------------------------------ */

/* Connections went (conn_guard): below the limit again, the listener resumes. */
static void conns_changed(void *arg, int open) {
    server *s = arg;
    if (!s->conn_paused || open >= s->conn_max || !s->sock) return;
    evconnlistener_enable(evhttp_bound_socket_get_listener(s->sock));
    s->conn_paused = 0;
    log_msg(LMH_LOG_INFO, "connections below --max-connections %d: accepting again", s->conn_max);
}

/* Every new connection passes here (libevent's bufferevent callback): watched by the guard;
 * at the limit the listener pauses and later clients wait in the kernel's backlog. */
static struct bufferevent *accepted(server *s, struct bufferevent *bev) {
    cg_add(s->guard, bev);
    if (!s->conn_paused && s->sock && cg_open(s->guard) >= s->conn_max) {
        evconnlistener_disable(evhttp_bound_socket_get_listener(s->sock));
        s->conn_paused = 1;
        log_msg(LMH_LOG_WARN, "%d connections open (--max-connections): new ones wait",
                s->conn_max);
    }
    return bev;
}

static struct bufferevent *plain_bev(struct event_base *base, void *arg) {
    return accepted(arg, bufferevent_socket_new(base, -1, BEV_OPT_CLOSE_ON_FREE));
}

/* ---- TLS ------------------------------------------------------------------------------ */

static struct bufferevent *tls_bev(struct event_base *base, void *arg) {
    server *s = arg;
    SSL *ssl = SSL_new(s->ssl);
    if (!ssl) return NULL;
    return accepted(s, bufferevent_openssl_socket_new(base, -1, ssl, BUFFEREVENT_SSL_ACCEPTING,
                                                      BEV_OPT_CLOSE_ON_FREE));
}

static int tls_setup(server *s, char *err, size_t err_len) {
    s->ssl = SSL_CTX_new(TLS_server_method());
    if (!s->ssl) return errf(err, err_len, "cannot create a TLS context");
    SSL_CTX_set_min_proto_version(s->ssl, TLS1_2_VERSION);
    SSL_CTX_set_options(s->ssl, SSL_OP_NO_COMPRESSION | SSL_OP_CIPHER_SERVER_PREFERENCE |
                                    SSL_OP_NO_RENEGOTIATION);
    /* TLS 1.2: forward-secret AEAD suites only (TLS 1.3's are all of that kind) */
    SSL_CTX_set_cipher_list(s->ssl, "ECDHE+AESGCM:ECDHE+CHACHA20:DHE+AESGCM:!aNULL:!eNULL");
    /* resumption by tickets; the server-side session cache stays small and bounded */
    SSL_CTX_sess_set_cache_size(s->ssl, 1024);
    if (SSL_CTX_use_certificate_chain_file(s->ssl, s->o.tls_cert) != 1) {
        char e[256];
        ERR_error_string_n(ERR_get_error(), e, sizeof e);
        return errf(err, err_len, "cannot load TLS certificate %s: %s", s->o.tls_cert, e);
    }
    if (SSL_CTX_use_PrivateKey_file(s->ssl, s->o.tls_key, SSL_FILETYPE_PEM) != 1 ||
        SSL_CTX_check_private_key(s->ssl) != 1) {
        char e[256];
        ERR_error_string_n(ERR_get_error(), e, sizeof e);
        return errf(err, err_len, "cannot load TLS key %s: %s", s->o.tls_key, e);
    }
    return 0;
}

/* ---- the HTTP front ------------------------------------------------------------------- */

/* The evhttp of s->base with the server's settings: libevent's limits, the connections'
 * bufferevents (TLS where s->ssl is set) and the router. tests/fuzz/fuzz_http.c, which
 * includes this file, builds its server with it too, so the fuzzed requests meet the same
 * limits as real ones. */
static struct evhttp *http_new(server *s) {
    struct evhttp *http = evhttp_new(s->base);
    if (!http) return NULL;
    evhttp_set_bevcb(http, s->ssl ? tls_bev : plain_bev, s);
    evhttp_set_max_headers_size(http, 16384);
    /* Bodies a little over the limit get our 413 in OpenAI's shape; far over it, libevent
     * stops reading and answers 413 itself, so a huge upload is never held in memory. */
    evhttp_set_max_body_size(http, (ev_ssize_t)(s->o.max_body + (1u << 20)));
    evhttp_set_timeout(http, s->o.timeout);
    evhttp_set_allowed_methods(http, EVHTTP_REQ_GET | EVHTTP_REQ_POST | EVHTTP_REQ_PUT |
                                         EVHTTP_REQ_DELETE | EVHTTP_REQ_HEAD | EVHTTP_REQ_OPTIONS |
                                         EVHTTP_REQ_PATCH);
    evhttp_set_gencb(http, route, s);
    return http;
}

/* ---- shutdown --------------------------------------------------------------------------- */

static void on_grace(evutil_socket_t fd, short what, void *arg) {
    (void)fd;
    (void)what;
    server *s = arg;
    log_msg(LMH_LOG_WARN,
            "shutdown: %d requests still running after the grace period; "
            "stopping them",
            s->active);
    event_base_loopexit(s->base, NULL);
}

/* The drain delay is over (or there was none): no new connections, new POSTs get 503, and
 * the running requests have --shutdown-grace seconds. */
static void stop_accepting(server *s) {
    log_msg(LMH_LOG_INFO, "shutdown: no new connections; finishing %d requests", s->active);
    s->phase = PH_STOPPING;
    if (s->sock) {
        evhttp_del_accept_socket(s->http, s->sock);
        s->sock = NULL;
    }
    if (s->active == 0 && s->flushing == 0) {
        event_base_loopexit(s->base, NULL);
        return;
    }
    struct timeval tv = {s->o.shutdown_grace, 0};
    s->grace = evtimer_new(s->base, on_grace, s);
    evtimer_add(s->grace, &tv);
}

static void on_drain_delay(evutil_socket_t fd, short what, void *arg) {
    (void)fd;
    (void)what;
    stop_accepting(arg);
}

static void on_signal(evutil_socket_t sig, short what, void *arg) {
    (void)what;
    server *s = arg;
    if (s->phase == PH_LOADING) {
        /* Nothing runs yet, and engine_open cannot be interrupted: waiting for it would
         * hold a stopping replica for as long as the load takes. */
        log_msg(LMH_LOG_WARN, "signal %d while the model loads: exiting", (int)sig);
        _exit(0);
    }
    if (s->phase != PH_SERVING) {
        log_msg(LMH_LOG_WARN, "signal %d again: stopping now", (int)sig);
        event_base_loopexit(s->base, NULL); /* a second signal: stop now */
        return;
    }
    s->phase = PH_DRAINING;
    if (s->o.drain_delay <= 0) {
        log_msg(LMH_LOG_INFO, "signal %d: draining", (int)sig);
        stop_accepting(s);
        return;
    }
    log_msg(LMH_LOG_INFO,
            "signal %d: draining: /health answers 503; requests are still served for %d s "
            "(--drain-delay)",
            (int)sig, s->o.drain_delay);
    struct timeval tv = {s->o.drain_delay, 0};
    s->drain_delay = evtimer_new(s->base, on_drain_delay, s);
    if (!s->drain_delay || evtimer_add(s->drain_delay, &tv) != 0) stop_accepting(s);
}

/* ---- loading ---------------------------------------------------------------------------- */

/* engine_opts.progress on the loading thread: the bytes for /health, then the caller's. */
static void load_progress(void *ctx, uint64_t done, uint64_t total) {
    server *s = ctx;
    if (done != ENGINE_LOAD_FAILED) {
        atomic_store(&s->load_total, total);
        atomic_store(&s->load_bytes, done);
    }
    if (s->user_progress) s->user_progress(s->user_progress_ctx, done, total);
}

/* Everything the model needs before the first request, on the loading thread. The loop
 * reads none of what this sets before EV_LOADED. */
static int load_model(server *s, char *err, size_t err_len) {
    const server_opts *o = &s->o;
    char v[32];
    if (lmh_debug_get("load-delay-ms", v, sizeof v)) { /* tests: a model slow to load */
        long ms = atol(v);
        struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
        if (ms > 0) nanosleep(&ts, NULL);
    }
    if (registry_load_with(&s->reg, NULL, o->plugin_dir))
        return errf(err, err_len, "cannot load the plugins");
    engine_opts eo = o->engine;
    eo.progress = load_progress;
    eo.progress_ctx = s;
    s->e = engine_open(&s->reg, &eo, err, err_len);
    if (!s->e) return 1;
    s->tio = textio_open(o->engine.model_dir, err, err_len);
    if (!s->tio) return 1;
    s->n_eos = textio_eos(s->tio, s->eos, 16);
    {
        /* constrained decoding's view of the vocabulary, and the model's tool-call format */
        double t0 = now_s();
        char gerr[512];
        s->gv = gram_vocab_new(textio_tokenizer(s->tio), engine_vocab(s->e), s->eos, s->n_eos, gerr,
                               sizeof gerr);
        if (!s->gv)
            log_msg(LMH_LOG_WARN, "constrained decoding is off: %s", gerr);
        else
            log_msg(LMH_LOG_DEBUG, "constrained decoding: vocabulary ready in %.0f ms",
                    (now_s() - t0) * 1e3);
        char *tpl = textio_template_source(o->engine.model_dir);
        json_object *mt = json_object_object_get(engine_config(s->e), "model_type");
        tc_detect(&s->reg, tpl, mt ? json_object_get_string(mt) : NULL, &s->tc_format);
        free(tpl);
    }
    if (s->o.ctx_size <= 0) {
        json_object *mp = json_object_object_get(engine_config(s->e), "max_position_embeddings");
        s->o.ctx_size = mp ? json_object_get_int(mp) : 4096;
        if (s->o.ctx_size <= 0) s->o.ctx_size = 4096;
    }
    /* The prefix cache. Where every backend computes in host memory (its weights used in
     * place), states are kept as snapshots there, by default in an eighth of the memory free
     * now: a copy is a memcpy. On a device a state's copy through host memory took longer
     * than prefill itself (H200: 875 MiB for a 4000-token state of a 1.7B model, 0.6-0.7 s
     * each way against 0.32 s of prefill), so ended sequences stay where they are instead
     * (prefix_cache.h), by default up to what --parallel sequences at the full context hold:
     * they give way whenever running ones need the memory. */
    engine_stats es0;
    engine_get_stats(s->e, &es0);
    int in_host = es0.n_backends > 0;
    for (int i = 0; i < es0.n_backends; i++) in_host &= es0.backend[i].mapped > 0;
    uint64_t per_tok = 0, kb, vb;
    for (int32_t l = 0; l < engine_n_layers(s->e); l++)
        if (engine_layer_row_bytes(s->e, l, &kb, &vb) == 0) per_tok += kb + vb;
    uint64_t prefix =
        o->prefix_cache_mb >= 0 ? (uint64_t)o->prefix_cache_mb << 20
        : in_host
            ? (uint64_t)sysconf(_SC_AVPHYS_PAGES) * (uint64_t)sysconf(_SC_PAGESIZE) / 8
            : (uint64_t)o->parallel * ((uint64_t)s->o.ctx_size * per_tok + es0.state_seq_bytes);
    if (spec_open(&o->spec, &o->engine, &s->reg, s->e, o->chunk, &s->sp, &s->draft, err, err_len))
        return 1;
    if (s->draft) snprintf(s->draft_chain, sizeof s->draft_chain, "%s", engine_chain(s->draft));
    s->sch = sched_new(s->e, o->parallel, o->queue, o->chunk, prefix, !in_host, s->sp);
    if (!s->sch) return errf(err, err_len, "cannot start the scheduler");
    if (pthread_create(&s->prep_th, NULL, prep_main, s) != 0) {
        s->prep_th = 0;
        return errf(err, err_len, "cannot start the tokenizer thread");
    }
    return 0;
}

static void *load_main(void *arg) {
    server *s = arg;
    s->load_rc = load_model(s, s->load_err, sizeof s->load_err);
    s->load_done.type = EV_LOADED;
    post(s, &s->load_done);
    return NULL;
}

/* Connections at most: --max-connections, else what the open-file limit leaves after the
 * descriptors open now and a margin for the model's and clients' other files. */
static void set_conn_max(server *s, int warn) {
    long nofile = limits_raise_nofile();
    int fds = limits_open_fds();
    if (fds < 0) fds = 64;
    s->conn_max = s->o.max_connections > 0 ? s->o.max_connections
                  : nofile > fds + 96      ? (int)(nofile - fds - 64)
                                           : 32;
    if (warn && s->o.max_connections > 0 && nofile > 0 && s->o.max_connections > nofile - fds - 16)
        log_msg(LMH_LOG_WARN,
                "--max-connections %d is more than the open-file limit (%ld) leaves room for",
                s->o.max_connections, nofile);
}

/* On the loop: the load ended. A failed one ends the process (a replica that stayed up
 * unready would only be restarted by its liveness probe later, or never). */
static void on_loaded(server *s) {
    pthread_join(s->load_th, NULL);
    s->load_started = 0;
    if (s->load_rc) {
        fprintf(stderr, "lmhost: %s\n", s->load_err);
        s->rc = 1;
        event_base_loopexit(s->base, NULL);
        return;
    }
    set_conn_max(s, 0); /* the model's files are open now */
    s->phase = PH_SERVING;
    log_msg(LMH_LOG_INFO, "the model loaded in %.1f s", now_s() - s->load_t0);
    fprintf(stderr, "lmhost: serving %s on %s://%s:%d (%s)\n", s->model_name,
            s->ssl ? "https" : "http", s->o.host, s->port, engine_chain(s->e));
}

/* ---- the command ---------------------------------------------------------------------- */

int server_run(const server_opts *o) {
    server *s = calloc(1, sizeof *s);
    if (!s) return 1;
    s->o = *o;
    s->rc = 1;
    s->user_progress = o->engine.progress;
    s->user_progress_ctx = o->engine.progress_ctx;
    if (o->admin_key && o->api_key && !strcmp(o->admin_key, o->api_key)) {
        /* whoever may generate would then also move the model between devices */
        fprintf(stderr, "lmhost serve: --admin-key must differ from the API key\n");
        free(s);
        return 1;
    }
    pthread_mutex_init(&s->qmu, NULL);
    pthread_mutex_init(&s->pmu, NULL);
    pthread_cond_init(&s->pcv, NULL);
    metrics_init(&s->m);
    const char *slash = strrchr(o->engine.model_dir, '/');
    while (slash && slash[1] == 0 && slash > o->engine.model_dir) { /* "dir/" */
        const char *p = slash - 1;
        while (p > o->engine.model_dir && *p != '/') p--;
        slash = *p == '/' ? p : NULL;
    }
    snprintf(s->model_name, sizeof s->model_name, "%s",
             o->model_name ? o->model_name
             : slash       ? slash + 1
                           : o->engine.model_dir);
    if (!o->model_name) s->model_name[strcspn(s->model_name, "/")] = 0;

    /* Listen first, then load: probes get answers (503 "loading") meanwhile. */
    char err[2048];
    if (evthread_use_pthreads() != 0) goto out;
    s->base = event_base_new();
    if (!s->base) goto out;
    if (o->tls_cert || o->tls_key) {
        if (!o->tls_cert || !o->tls_key) {
            fprintf(stderr, "lmhost serve: --tls-cert and --tls-key go together\n");
            goto out;
        }
        if (tls_setup(s, err, sizeof err)) {
            fprintf(stderr, "lmhost: %s\n", err);
            goto out;
        }
    }
    if (!(s->http = http_new(s))) goto out;
    s->sock = evhttp_bind_socket_with_handle(s->http, o->host, (ev_uint16_t)o->port);
    if (!s->sock) {
        fprintf(stderr, "lmhost serve: cannot listen on %s:%d\n", o->host, o->port);
        goto out;
    }
    /* libevent listens with a backlog of 128: a burst of connections, or the clients that
     * wait while --max-connections holds the listener paused, overflow it, and the kernel
     * drops their SYNs, which clients resend only after 1, 3, 7... s. Take the kernel's
     * most (net.core.somaxconn caps it). */
    if (listen(evhttp_bound_socket_get_fd(s->sock), 65535) != 0)
        log_msg(LMH_LOG_WARN, "cannot raise the listen backlog: %s", strerror(errno));
    set_conn_max(s, 1);
    if (!(s->guard = cg_new(s->base, o->timeout, conns_changed, s))) goto out;
    if (o->rate_limit > 0 && !(s->rl = rl_new(o->rate_limit))) goto out;
    s->port = o->port;
    {
        /* --port 0 asks the kernel for a free port; say which one we got */
        struct sockaddr_storage ss;
        socklen_t sl = sizeof ss;
        if (getsockname(evhttp_bound_socket_get_fd(s->sock), (struct sockaddr *)&ss, &sl) == 0)
            s->port = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                                     : ((struct sockaddr_in *)&ss)->sin_port);
    }
    s->notify = event_new(s->base, -1, EV_PERSIST, drain_queue, s);
    s->sig_int = evsignal_new(s->base, SIGINT, on_signal, s);
    s->sig_term = evsignal_new(s->base, SIGTERM, on_signal, s);
    if (!s->notify || !s->sig_int || !s->sig_term) goto out;
    event_add(s->sig_int, NULL);
    event_add(s->sig_term, NULL);
    signal(SIGPIPE, SIG_IGN);
    s->load_t0 = now_s();
    if (pthread_create(&s->load_th, NULL, load_main, s) != 0) {
        fprintf(stderr, "lmhost: cannot start the loading thread\n");
        goto out;
    }
    s->load_started = 1;
    fprintf(stderr, "lmhost: listening on %s://%s:%d; loading %s\n", s->ssl ? "https" : "http",
            o->host, s->port, s->model_name);
    event_base_dispatch(s->base);
    if (s->phase != PH_LOADING) s->rc = 0; /* else the load failed (on_loaded) */
out:
    if (s->load_started) pthread_join(s->load_th, NULL); /* only on an early loop exit */
    if (s->prep_th) {
        pthread_mutex_lock(&s->pmu);
        s->prep_stop = 1;
        pthread_cond_signal(&s->pcv);
        pthread_mutex_unlock(&s->pmu);
        pthread_join(s->prep_th, NULL);
    }
    if (s->sch) sched_free(s->sch, 0);
    if (s->notify) {
        drain_queue(-1, 0, s); /* the cancel events of what was still running */
        event_free(s->notify);
    }
    if (s->sig_int) event_free(s->sig_int);
    if (s->sig_term) event_free(s->sig_term);
    if (s->grace) event_free(s->grace);
    if (s->drain_delay) event_free(s->drain_delay);
    rl_free(s->rl);
    if (s->http) evhttp_free(s->http);
    cg_free(s->guard); /* after libevent let go of the connections */
    if (s->base) event_base_free(s->base);
    if (s->ssl) SSL_CTX_free(s->ssl);
    textio_close(s->tio);
    gram_vocab_free(s->gv);
    spec_free(s->sp);
    engine_close(s->draft);
    engine_close(s->e);
    registry_free(&s->reg);
    metrics_free(&s->m);
    int rc = s->rc;
    free(s);
    return rc;
}
