/* What one client, and all of them, may hold of the server: open connections and requests
 * a minute per client address. */
#ifndef LMHOST_CLIENT_LIMITS_H
#define LMHOST_CLIENT_LIMITS_H

/* File descriptors the process has open (Linux: /proc/self/fd), -1 when unknown. libevent
 * 2.1's HTTP server says nothing when it closes a connection, so connections are counted as
 * descriptors above the count before the first one was accepted. */
int limits_open_fds(void);

/* Raises the soft limit on open files to the hard one and returns it (-1 when unknown). */
long limits_raise_nofile(void);

/* Requests a minute per client address: a token bucket each (a full minute's worth at most),
 * in a table of bounded size (the least recently seen address gives way). */
typedef struct rate_limiter rate_limiter;
rate_limiter *rl_new(int per_minute);
void rl_free(rate_limiter *r);
/* Takes a request from addr's bucket at time now (seconds): 0 when allowed, else the
 * seconds (>= 1) until one would be. */
int rl_take(rate_limiter *r, const char *addr, double now);

#endif
