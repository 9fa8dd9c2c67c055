#include "conn_guard.h"

#include "log.h"
#include "lmhost/abi.h"

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

typedef struct entry {
    struct bufferevent *bev;
    struct conn_guard *g;
    double reading_since; /* request bytes waiting for their request to end; 0: none */
    int shut;             /* shut down for slowness */
} entry;

struct conn_guard {
    struct event *sweep;
    double timeout;
    void (*on_change)(void *ctx, int open);
    void *ctx;
    entry **e;
    int n, cap;
    unsigned long long slow_closed;
};

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Bytes arrived on a connection: a request has begun, unless one already had. */
static void on_input(struct evbuffer *b, const struct evbuffer_cb_info *info, void *arg) {
    (void)b;
    entry *e = arg;
    if (info->n_added && !e->reading_since) e->reading_since = now_s();
}

/* Four times a second: let go of the connections libevent has freed (a freed bufferevent has
 * no callbacks; our reference keeps it readable until we drop it), and shut down those whose
 * request is overdue (libevent then sees the end and closes them itself). */
static void sweep(evutil_socket_t fd, short what, void *arg) {
    (void)fd;
    (void)what;
    conn_guard *g = arg;
    double t = now_s();
    int before = g->n;
    for (int i = 0; i < g->n;) {
        entry *e = g->e[i];
        bufferevent_data_cb rcb = NULL;
        bufferevent_event_cb ecb = NULL;
        bufferevent_getcb(e->bev, &rcb, NULL, &ecb, NULL);
        if (!rcb && !ecb) {
            bufferevent_decref(e->bev);
            free(e);
            g->e[i] = g->e[--g->n];
            continue;
        }
        if (e->reading_since && !e->shut && t - e->reading_since > g->timeout) {
            evutil_socket_t s = bufferevent_getfd(e->bev);
            if (s >= 0) shutdown(s, SHUT_RDWR);
            e->shut = 1;
            g->slow_closed++;
            log_msg(LMH_LOG_INFO, "closed a connection whose request took over %.0f s to arrive",
                    g->timeout);
        }
        i++;
    }
    if (g->n != before && g->on_change) g->on_change(g->ctx, g->n);
}

conn_guard *cg_new(struct event_base *base, int request_timeout_s,
                   void (*on_change)(void *ctx, int open), void *ctx) {
    conn_guard *g = calloc(1, sizeof *g);
    if (!g) return NULL;
    g->timeout = request_timeout_s;
    g->on_change = on_change;
    g->ctx = ctx;
    g->sweep = event_new(base, -1, EV_PERSIST, sweep, g);
    struct timeval tv = {0, 250000};
    if (!g->sweep || event_add(g->sweep, &tv)) {
        cg_free(g);
        return NULL;
    }
    return g;
}

void cg_free(conn_guard *g) {
    if (!g) return;
    if (g->sweep) event_free(g->sweep);
    for (int i = 0; i < g->n; i++) {
        bufferevent_decref(g->e[i]->bev);
        free(g->e[i]);
    }
    free(g->e);
    free(g);
}

void cg_add(conn_guard *g, struct bufferevent *bev) {
    if (!bev) return;
    if (g->n == g->cap) {
        int cap = g->cap ? 2 * g->cap : 64;
        entry **grown = realloc(g->e, (size_t)cap * sizeof *grown);
        if (!grown) return; /* unwatched: only counted less */
        g->e = grown;
        g->cap = cap;
    }
    entry *e = calloc(1, sizeof *e);
    if (!e) return;
    e->bev = bev;
    e->g = g;
    e->reading_since = now_s(); /* the first request's time starts at the accept */
    if (!evbuffer_add_cb(bufferevent_get_input(bev), on_input, e)) {
        free(e);
        return;
    }
    bufferevent_incref(bev);
    g->e[g->n++] = e;
}

void cg_request(conn_guard *g, struct bufferevent *bev) {
    for (int i = 0; i < g->n; i++)
        if (g->e[i]->bev == bev) {
            g->e[i]->reading_since = 0;
            return;
        }
}

int cg_open(const conn_guard *g) {
    return g ? g->n : 0;
}

unsigned long long cg_slow_closed(const conn_guard *g) {
    return g ? g->slow_closed : 0;
}
