/* Every client connection, watched from its accept to its close. libevent 2.1's HTTP server
 * neither counts its connections nor bounds how long a client may take to send a request (its
 * timeout restarts with every byte, so a client sending a byte a second holds a connection
 * forever). The guard keeps a reference to each connection's bufferevent (so it can tell when
 * libevent has let go of it), notes when request bytes start arriving and when a whole request
 * has arrived, and shuts down a connection whose request takes longer than the timeout. */
#ifndef LMHOST_CONN_GUARD_H
#define LMHOST_CONN_GUARD_H

struct event_base;
struct bufferevent;

typedef struct conn_guard conn_guard;

/* on_change(ctx, open) runs on the loop thread whenever connections close. */
conn_guard *cg_new(struct event_base *base, int request_timeout_s,
                   void (*on_change)(void *ctx, int open), void *ctx);
void cg_free(conn_guard *g);
/* A new connection's bufferevent, as libevent's bevcb made it. */
void cg_add(conn_guard *g, struct bufferevent *bev);
/* A whole request has arrived on the connection of bev. */
void cg_request(conn_guard *g, struct bufferevent *bev);
/* Connections open. */
int cg_open(const conn_guard *g);
/* Connections closed so far for taking too long over a request. */
unsigned long long cg_slow_closed(const conn_guard *g);

#endif
