/* libFuzzer target: the HTTP server end to end. Each input is the bytes one client sends
 * over one connection (one request, several pipelined, garbage, a request cut short), read
 * by the server's own code: core/server/server.c is included whole and its evhttp built by
 * its http_new() (the limits and callbacks of `lmhost serve`) on a fresh event_base per
 * input, listening on a Unix socket the target connects to. So every byte goes through
 * libevent's HTTP parser, the router (request ids, the rate limit, methods, the API and
 * admin keys), the body limit, api.c's JSON parsing and request validation, the job's
 * preparation, the replies (JSON and streams) and the connection's end.
 *
 * No model: the engine, the scheduler, the tokenizer and the chat template are stand-ins
 * below, deterministic and on the loop's thread. A token is a byte (256 ends a sequence,
 * 257 begins one); a chat renders as "role\ncontent\n" per message (a template "raises" on
 * "{% raise %}"); the scheduler runs in steps between passes of the loop, as the engine
 * thread does, and its "model" answers with the prompt's last max_tokens tokens, so what a
 * request ends with (think tags, tool calls, stop strings) flows through the reply logic.
 * More than --parallel + --queue sequences find the queue full (503); a request that names
 * a cache fails to join as one the plugin cannot open does (400); max_tokens 13 fails in
 * the engine after a token. Embeddings are 8 numbers an input; moving the backend succeeds
 * for "cpu" only. The prep thread's work (prep_one) runs on the loop's thread between
 * passes, so runs repeat exactly; a backend move runs on a thread of its own, as in the
 * server, and the loop waits for it.
 *
 * A run: send the input, run the loop until nothing moves (the client reading and dropping
 * the answers), then close the client's sending side (a request cut short ends there) and
 * run until nothing moves again; the client closes and everything is freed as server_run
 * frees it. An input ending in a NUL byte is a client that leaves as soon as it has sent
 * the rest (the NUL is not sent): its streams are cut, its requests cancelled. Findings:
 * crashes, sanitizer reports, leaks (LeakSanitizer checks each input), and a run that does
 * not settle or leaves work behind (abort).
 * FUZZ_HTTP_SHOW=1 prints the server's answers (to check what a seed reaches).
 * build: see tests/fuzz/run_fuzzers.sh (the "http" row). */
#include "../../core/server/server.c"
#include "toolcall_static.h"

#include <errno.h>
#include <sys/un.h>

/* ---- the stand-ins ------------------------------------------------------------------- */

enum { TOK_EOS = 256, TOK_BOS = 257, N_VOCAB = 258, EMBED_DIM = 8 };

/* engine */
engine *engine_open(const registry *reg, const engine_opts *o, char *err, size_t err_len) {
    (void)reg;
    (void)o;
    errf(err, err_len, "no engine in the fuzz target");
    return NULL;
}
void engine_close(engine *e) {
    (void)e;
}
int32_t engine_vocab(const engine *e) {
    (void)e;
    return N_VOCAB;
}
int32_t engine_n_layers(const engine *e) {
    (void)e;
    return 0;
}
json_object *engine_config(const engine *e) {
    (void)e;
    return NULL;
}
const char *engine_chain(const engine *e) {
    (void)e;
    return "arch=fuzz backend=cpu cache=plain(f32)";
}
void engine_get_stats(engine *e, engine_stats *st) {
    (void)e;
    memset(st, 0, sizeof *st);
}
int engine_layer_row_bytes(const engine *e, int32_t layer, uint64_t *k, uint64_t *v) {
    (void)e;
    (void)layer;
    *k = *v = 0;
    return -1;
}
/* a mixture of 8 experts, 2 a token: "moe_top_k" 1 and 2 pass, 3 is refused */
int32_t engine_moe_top_k(const engine *e, int32_t *n_experts) {
    (void)e;
    if (n_experts) *n_experts = 8;
    return 2;
}
int engine_swap_backend(engine *e, const char *name, char *err, size_t err_len) {
    (void)e;
    if (strcmp(name, "cpu") == 0 || strncmp(name, "cpu:", 4) == 0) return 0;
    return errf(err, err_len, "unknown backend '%s'", name);
}
int32_t engine_embed_dim(const engine *e) {
    (void)e;
    return EMBED_DIM;
}
int engine_embed_pooling(const engine *e, const char **why) {
    (void)e;
    if (why) *why = NULL;
    return ENGINE_POOL_MEAN;
}
int engine_embed(engine *e, const int32_t *const *tokens, const int32_t *n_tokens, int32_t n_seqs,
                 int pooling, float *out, char *err, size_t err_len) {
    (void)e;
    (void)pooling;
    (void)err;
    (void)err_len;
    for (int32_t i = 0; i < n_seqs; i++)
        for (int k = 0; k < EMBED_DIM; k++)
            out[i * EMBED_DIM + k] = (float)(tokens[i][k % n_tokens[i]] - 128) / 128.0f;
    return 0;
}

/* speculative decoding (server_run's; never on here) */
int spec_open(const spec_opts *so, const engine_opts *to, struct registry *reg, engine *target,
              int32_t chunk, spec **sp, engine **draft, char *err, size_t errlen) {
    (void)so, (void)to, (void)reg, (void)target, (void)chunk, (void)err, (void)errlen;
    *sp = NULL;
    *draft = NULL;
    return 0;
}
void spec_free(spec *sp) {
    (void)sp;
}
int32_t spec_draft_max(const spec *sp) {
    (void)sp;
    return 0;
}

/* the plugin registry: one cache plugin, "plain", of formats f32 and f16 */
static const char *const plain_formats[] = {"f32", "f16", NULL};
static const lmh_cache_api plain_api = {.size = sizeof(lmh_cache_api), .formats = plain_formats};
static const lmh_plugin_info plain_info = {LMH_PLUGIN_HEADER, .kind = LMH_KIND_CACHE,
                                           .name = "plain", .api = &plain_api};
static plugin plain_item = {&plain_info, "plain"};

int registry_load_with(registry *r, const char *first_file, const char *extra_dir) {
    (void)first_file;
    (void)extra_dir;
    memset(r, 0, sizeof *r);
    return 0;
}
void registry_free(registry *r) {
    (void)r;
}
const plugin *registry_find(const registry *r, lmh_plugin_kind kind, const char *name) {
    for (int i = 0; i < r->n; i++)
        if (r->items[i].info->kind == kind && strcmp(r->items[i].info->name, name) == 0)
            return &r->items[i];
    return NULL;
}
char *registry_names(const registry *r, lmh_plugin_kind kind, int model_types) {
    (void)model_types;
    char *s = calloc(64, 1);
    for (int i = 0; s && i < r->n; i++)
        if (r->items[i].info->kind == kind)
            snprintf(s + strlen(s), 64 - strlen(s), "%s%s", *s ? ", " : "", r->items[i].info->name);
    return s;
}

/* text: a token is a byte */
struct textio {
    tok_tokenizer *tok; /* the same vocabulary, for constrained decoding's trie */
};
struct textio_stream {
    unsigned char held[4]; /* an unfinished UTF-8 character */
    int n_held, need;
    char out[8];
};
static textio fuzz_tio;

textio *textio_open(const char *dir, char *err, size_t err_len) {
    (void)dir;
    errf(err, err_len, "no tokenizer in the fuzz target");
    return NULL;
}
void textio_close(textio *t) {
    (void)t;
}
int textio_has_template(const textio *t) {
    (void)t;
    return 1;
}
const struct tok_tokenizer *textio_tokenizer(const textio *t) {
    return t->tok;
}
char *textio_template_source(const char *dir) {
    (void)dir;
    return NULL;
}
int32_t textio_eos(const textio *t, int32_t *out, int32_t max) {
    (void)t;
    if (max < 1) return 0;
    out[0] = TOK_EOS;
    return 1;
}

static void put_text(sbuf *b, json_object *v) {
    const char *s = json_object_is_type(v, json_type_string)
                        ? json_object_get_string(v)
                        : json_object_to_json_string_ext(v, JSON_C_TO_STRING_PLAIN);
    if (s) api_sbuf_add(b, s, strlen(s));
}

/* "role\ncontent\n" per message (a content that is not a string as its JSON), tools and
 * extra variables as JSON before them: the last message's content ends the prompt. */
int textio_render(textio *t, json_object *messages, json_object *tools, json_object *vars,
                  int add_generation_prompt, char **out, char *err, size_t err_len) {
    (void)t;
    (void)add_generation_prompt;
    sbuf b = {0};
    if (api_sbuf_add(&b, "", 0) != 0) return errf(err, err_len, "out of memory");
    if (tools) put_text(&b, tools);
    if (vars) put_text(&b, vars);
    size_t n =
        json_object_is_type(messages, json_type_array) ? json_object_array_length(messages) : 0;
    for (size_t i = 0; i < n; i++) {
        json_object *m = json_object_array_get_idx(messages, i), *v;
        if (json_object_object_get_ex(m, "role", &v)) put_text(&b, v);
        api_sbuf_add(&b, "\n", 1);
        if (json_object_object_get_ex(m, "content", &v) && v) put_text(&b, v);
        api_sbuf_add(&b, "\n", 1);
    }
    /* a template that refuses what it is given, as a real one raises an exception */
    if (strstr(b.p, "{% raise %}")) {
        free(b.p);
        return errf(err, err_len, "the chat template raised an exception");
    }
    *out = b.p;
    return 0;
}

int textio_encode(textio *t, const char *text, int add_special, int32_t **ids, int32_t *n,
                  char *err, size_t err_len) {
    (void)t;
    size_t len = strlen(text), at = 0;
    int32_t *p = malloc((len + 1) * sizeof *p);
    if (!p) return errf(err, err_len, "out of memory");
    if (add_special) p[at++] = TOK_BOS;
    for (size_t i = 0; i < len; i++) p[at++] = (unsigned char)text[i];
    *ids = p;
    *n = (int32_t)at;
    return 0;
}

char *textio_token_text(textio *t, int32_t id) {
    (void)t;
    char *s = malloc(8);
    if (!s) return NULL;
    if (id >= 0 && id < 128)
        snprintf(s, 8, "%c", (char)id);
    else
        snprintf(s, 8, "<%d>", (int)id);
    return s;
}

textio_stream *textio_stream_new(textio *t) {
    (void)t;
    return calloc(1, sizeof(textio_stream));
}
void textio_stream_free(textio_stream *s) {
    free(s);
}
/* never half a UTF-8 character; a broken one comes out as U+FFFD */
const char *textio_stream_push(textio_stream *s, int32_t id, size_t *len) {
    static const char bad[] = "\xEF\xBF\xBD";
    *len = 0;
    if (id < 0 || id > 255) return "";
    unsigned char c = (unsigned char)id;
    size_t o = 0;
    if (s->n_held && (c & 0xC0) != 0x80) { /* the character broke off */
        memcpy(s->out, bad, 3);
        o = 3;
        s->n_held = 0;
    }
    if (s->n_held) {
        s->held[s->n_held++] = c;
        if (s->n_held == s->need) {
            memcpy(s->out + o, s->held, (size_t)s->n_held);
            o += (size_t)s->n_held;
            s->n_held = 0;
        }
    } else if (c < 0x80) {
        s->out[o++] = (char)c;
    } else if (c >= 0xC2 && c <= 0xF4) {
        s->need = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : 2;
        s->held[0] = c;
        s->n_held = 1;
    } else {
        memcpy(s->out + o, bad, 3);
        o += 3;
    }
    *len = o;
    return s->out;
}
const char *textio_stream_flush(textio_stream *s, size_t *len) {
    *len = 0;
    if (!s->n_held) return "";
    s->n_held = 0;
    memcpy(s->out, "\xEF\xBF\xBD", 3);
    *len = 3;
    return s->out;
}

/* the scheduler: requests and tasks run in steps, one step between two passes of the loop
 * (as the engine thread's steps interleave with the loop): a step admits a request (or
 * fails it), or emits its next token, or ends it; a cancelled one ends cancelled. The
 * model's output is the prompt's last max_tokens tokens. */
typedef struct task {
    void (*fn)(engine *e, void *arg);
    void *arg;
    struct task *next;
} task;
struct sched {
    sched_req *head, *tail; /* joined (through qnext), in order */
    int n;
    task *tasks, *tasks_tail;
};
static sched fuzz_sched;

sched *sched_new(engine *e, int32_t max_running, int32_t max_waiting, int32_t chunk,
                 uint64_t prefix_bytes, int park, spec *sp) {
    (void)e, (void)max_running, (void)max_waiting, (void)chunk, (void)prefix_bytes, (void)park;
    (void)sp;
    return NULL;
}
void sched_free(sched *s, int drain) {
    (void)s;
    (void)drain;
}
void sched_get_stats(sched *s, sched_stats *st) {
    memset(st, 0, sizeof *st);
    st->running = s->n;
    snprintf(st->chain, sizeof st->chain, "%s", engine_chain(NULL));
    snprintf(st->precision, sizeof st->precision, "exact");
    st->engine.n_backends = 1;
    snprintf(st->engine.backend[0].name, sizeof st->engine.backend[0].name, "cpu");
    st->engine.n_caches = 1;
    snprintf(st->engine.cache[0].name, sizeof st->engine.cache[0].name, "f32");
    snprintf(st->engine.cache[0].plugin, sizeof st->engine.cache[0].plugin, "plain");
}

int sched_submit(sched *sc, sched_req *r) {
    jchoice *c = r->user;
    server *s = c->job->srv;
    if (sc->n >= s->o.parallel + s->o.queue) return -1; /* the wait queue is full */
    r->qnext = NULL;
    r->n_done = 0; /* 0: not admitted yet */
    r->n_gen = 0;
    if (sc->tail)
        sc->tail->qnext = r;
    else
        sc->head = r;
    sc->tail = r;
    sc->n++;
    return 0;
}

int sched_task(sched *s, void (*fn)(engine *e, void *arg), void *arg) {
    task *t = calloc(1, sizeof *t);
    if (!t) return -1;
    t->fn = fn;
    t->arg = arg;
    if (s->tasks_tail)
        s->tasks_tail->next = t;
    else
        s->tasks = t;
    s->tasks_tail = t;
    return 0;
}

/* a backend move: the server's admin thread waits here; no request runs meanwhile (the
 * connection waits for its answer) */
int sched_call(sched *s, int (*fn)(engine *e, void *arg), void *arg) {
    (void)s;
    return fn(NULL, arg);
}

/* One request's step; 1 when it has ended. */
static int step_req(sched_req *r) {
    if (atomic_load(&r->cancel)) {
        r->emit(r, NULL, FINISH_CANCELLED, r->user);
        return 1;
    }
    if (!r->n_done) {      /* admission */
        if (r->cache[0]) { /* a cache the plugin cannot open: it never joins */
            r->fail_code = 400;
            snprintf(r->fail_msg, sizeof r->fail_msg, "the fuzz target opens no caches");
            r->emit(r, NULL, FINISH_ERROR, r->user);
            return 1;
        }
        r->n_done = r->n_prompt;
        r->emit(r, NULL, FINISH_NONE, r->user);
        return 0;
    }
    if (r->max_tokens == 13 && r->n_gen == 1) { /* the engine fails mid-way */
        r->emit(r, NULL, FINISH_ERROR, r->user);
        return 1;
    }
    int32_t m = r->max_tokens < r->n_prompt ? r->max_tokens : r->n_prompt;
    if (r->n_gen >= m) {
        r->emit(r, NULL, m == r->max_tokens ? FINISH_LENGTH : FINISH_STOP, r->user);
        return 1;
    }
    sched_token t = {.id = r->prompt[r->n_prompt - m + r->n_gen++], .logprob = -0.5f};
    for (int k = 0; k < r->n_stop_ids; k++)
        if (t.id == r->stop_ids[k]) {
            r->emit(r, NULL, FINISH_STOP, r->user);
            return 1;
        }
    if (r->top_logprobs >= 0) {
        t.n_top = r->top_logprobs < 3 ? r->top_logprobs : 3;
        for (int k = 0; k < t.n_top; k++) {
            t.top_id[k] = (t.id + k) % N_VOCAB;
            t.top_logprob[k] = -0.5f - (float)k;
        }
    }
    r->emit(r, &t, FINISH_NONE, r->user);
    return 0;
}

/* One engine step: the tasks queued, then each request once. 1 when anything ran. */
static int sched_step(sched *s) {
    int ran = s->tasks || s->head;
    while (s->tasks) {
        task *t = s->tasks;
        s->tasks = t->next;
        if (!s->tasks) s->tasks_tail = NULL;
        t->fn(NULL, t->arg);
        free(t);
    }
    for (sched_req **pp = &s->head, *prev = NULL; *pp;) {
        sched_req *r = *pp;
        if (step_req(r)) {
            *pp = r->qnext;
            if (s->tail == r) s->tail = prev;
            s->n--;
        } else {
            prev = r;
            pp = &r->qnext;
        }
    }
    return ran;
}

/* ---- the run ------------------------------------------------------------------------- */

static server_opts fuzz_opts;
static gram_vocab *fuzz_gv;
static int show_replies; /* FUZZ_HTTP_SHOW=1: the server's answers to stderr (for seeds) */

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    log_level = -1; /* quiet: warnings of clients that stop reading, failed moves */
    show_replies = getenv("FUZZ_HTTP_SHOW") && atoi(getenv("FUZZ_HTTP_SHOW")) > 0;
    signal(SIGPIPE, SIG_IGN);
    if (evthread_use_pthreads() != 0) abort(); /* the admin thread posts to the loop */
    static char buf[16384];
    char *p = buf;
    p += sprintf(p, "{\"model\":{\"type\":\"BPE\",\"byte_fallback\":true,\"merges\":[],"
                    "\"vocab\":{");
    for (int b = 0; b < 256; b++) p += sprintf(p, "%s\"<0x%02X>\":%d", b ? "," : "", b, b);
    sprintf(p,
            "}},\"added_tokens\":[{\"id\":%d,\"content\":\"</s>\",\"special\":true},"
            "{\"id\":%d,\"content\":\"<s>\",\"special\":true}],\"decoder\":{\"type\":"
            "\"Sequence\",\"decoders\":[{\"type\":\"ByteFallback\"},{\"type\":\"Fuse\"}]}}",
            TOK_EOS, TOK_BOS);
    char err[256];
    fuzz_tio.tok = tok_load_from_memory(buf, strlen(buf), NULL, 0, err, sizeof err);
    int32_t eos = TOK_EOS;
    fuzz_gv = fuzz_tio.tok ? gram_vocab_new(fuzz_tio.tok, N_VOCAB, &eos, 1, err, sizeof err) : NULL;
    if (!fuzz_gv) {
        fprintf(stderr, "fuzz_http: %s\n", err);
        abort();
    }
    server_opts *o = &fuzz_opts;
    o->model_name = "fuzz-model";
    o->host = "127.0.0.1";
    o->api_key = "sk-fuzz";
    o->admin_key = "sk-admin";
    o->max_tokens = 16;
    o->ctx_size = 2048;
    o->parallel = 2;
    o->queue = 2;
    o->chunk = 64;
    o->timeout = 30;
    o->max_connections = 8;
    o->rate_limit = 24; /* a burst of 24 requests, then 429 */
    o->shutdown_grace = 1;
    o->max_body = 4096; /* under the inputs' 8192 bytes: our 413 is reachable */
    o->defaults = sampler_defaults();
    return 0;
}

typedef struct run {
    server *s;
    int fd; /* the client's end */
    const uint8_t *data;
    size_t size, sent;
    int leave_early; /* half-close as soon as everything is sent */
    int shut;        /* the client's sending side is closed */
    int eof;         /* the server closed the connection */
} run;

/* The client's part of one pass: send what is left, read (and drop) what came. */
static int client_pass(run *r) {
    int moved = 0;
    while (r->sent < r->size) {
        ssize_t n = send(r->fd, r->data + r->sent, r->size - r->sent, MSG_NOSIGNAL);
        if (n <= 0) break;
        r->sent += (size_t)n;
        moved = 1;
    }
    if (r->leave_early && !r->shut && r->sent == r->size) {
        shutdown(r->fd, SHUT_WR);
        r->shut = 1;
    }
    char buf[16384];
    while (!r->eof) {
        ssize_t n = recv(r->fd, buf, sizeof buf, 0);
        if (n > 0) {
            if (show_replies) fwrite(buf, 1, (size_t)n, stderr);
            moved = 1;
        } else if (n == 0 || (errno != EAGAIN && errno != EINTR)) {
            r->eof = 1;
            moved = 1;
        } else {
            break;
        }
    }
    return moved;
}

/* Runs the loop until nothing moves: no callback pending, no job waiting for prep, nothing
 * for the engine to do, no byte to send or to read, and no backend move under way. */
static void settle(run *r) {
    server *s = r->s;
    int quiet = 0;
    for (int pass = 0; quiet < 2; pass++) {
        if (pass > 100000) abort(); /* it never settles */
        int moved = client_pass(r);
        /* a backend move's thread wakes the loop when done */
        event_base_loop(s->base, s->admin ? EVLOOP_ONCE : EVLOOP_NONBLOCK);
        while (s->prep_head) {
            job *j = s->prep_head;
            s->prep_head = j->prep_next;
            if (!s->prep_head) s->prep_tail = NULL;
            prep_one(s, j);
            moved = 1;
        }
        moved |= sched_step(s->sch);
        moved |= client_pass(r) || s->admin ||
                 event_base_get_num_events(s->base, EVENT_BASE_COUNT_ACTIVE) > 0;
        quiet = moved ? 0 : quiet + 1;
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    server *s = calloc(1, sizeof *s);
    if (!s) return 0;
    s->o = fuzz_opts;
    pthread_mutex_init(&s->qmu, NULL);
    pthread_mutex_init(&s->pmu, NULL);
    pthread_cond_init(&s->pcv, NULL);
    metrics_init(&s->m);
    snprintf(s->model_name, sizeof s->model_name, "%s", s->o.model_name);
    s->reg = (registry){.items = &plain_item, .n = 1, .cap = 1};
    s->tio = &fuzz_tio;
    s->gv = fuzz_gv;
    if (tc_format_find(tc_static_registry(), "hermes", &s->tc_format)) abort();
    s->eos[0] = TOK_EOS;
    s->n_eos = 1;
    s->sch = &fuzz_sched;
    s->conn_max = s->o.max_connections;
    s->phase = PH_SERVING; /* the model is "loaded" (the stand-ins above) */

    /* an input ending in a NUL byte: a client that leaves (half-closes) as soon as it has
     * sent the rest, without waiting for its answers; the NUL is not sent */
    int leave_early = size > 0 && data[size - 1] == 0;
    run r = {.s = s,
             .fd = -1,
             .data = data,
             .size = size - (size_t)leave_early,
             .leave_early = leave_early};
    int lfd = -1;
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    socklen_t alen = sizeof a;
    if (!(s->base = event_base_new()) || !(s->http = http_new(s))) abort();
    if (!(s->guard = cg_new(s->base, s->o.timeout, conns_changed, s))) abort();
    if (!(s->rl = rl_new(s->o.rate_limit))) abort();
    if (!(s->notify = event_new(s->base, -1, EV_PERSIST, drain_queue, s))) abort();
    /* the listener: a Unix socket of a name the kernel picks (abstract, nothing on disk) */
    lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (lfd < 0 || bind(lfd, (struct sockaddr *)&a, sizeof(sa_family_t)) != 0 ||
        listen(lfd, 4) != 0 || getsockname(lfd, (struct sockaddr *)&a, &alen) != 0)
        abort();
    if (!(s->sock = evhttp_accept_socket_with_handle(s->http, lfd))) abort(); /* owns lfd */
    r.fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (r.fd < 0 || connect(r.fd, (struct sockaddr *)&a, alen) != 0) abort();

    settle(&r);
    if (!r.shut) { /* the client has had its answers and says no more */
        shutdown(r.fd, SHUT_WR);
        r.shut = 1;
        settle(&r);
    }
    close(r.fd);
    if (fuzz_sched.head || fuzz_sched.tasks) abort(); /* work left behind */

    /* as server_run ends */
    drain_queue(-1, 0, s);
    event_free(s->notify);
    rl_free(s->rl);
    evhttp_free(s->http);
    cg_free(s->guard);
    event_base_free(s->base);
    metrics_free(&s->m);
    pthread_cond_destroy(&s->pcv);
    pthread_mutex_destroy(&s->pmu);
    pthread_mutex_destroy(&s->qmu);
    free(s);
    return 0;
}
