/* A small blocking HTTP/1.1 client for downloads from a model hub: http:// and https://
 * (OpenSSL, the system's trust store or $SSL_CERT_FILE / $SSL_CERT_DIR, TLS 1.2+, the host
 * name checked), redirects followed (a bearer token is not sent on to another host), bodies
 * with a length, chunked or up to the close, streamed to a callback, an optional byte range.
 * One connection a request ("Connection: close"): downloads are few and large.
 *
 * The response-head parser and the chunked decoder are pure functions of their input, for
 * the tests and fuzz targets. */
#ifndef LMHOST_HUB_HTTP_H
#define LMHOST_HUB_HTTP_H

#include <stddef.h>

typedef struct {
    int status;            /* 200, 206, 302, ... */
    long long length;      /* Content-Length, -1 when absent */
    int chunked;           /* Transfer-Encoding: chunked */
    long long range_start; /* Content-Range: bytes START-END/TOTAL, -1 when absent */
    long long range_total; /* TOTAL there, -1 when absent or '*' */
    int retry_after;       /* Retry-After in seconds, -1 when absent */
    char location[2048];   /* Location, "" when absent */
} hh_head;

/* Parses a response head: the status line and header lines up to and including the empty
 * line (buf holds exactly that, len bytes). 0, or -1 when malformed. */
int hh_parse_head(const char *buf, size_t len, hh_head *h);

/* The chunked transfer coding, decoded incrementally. */
typedef struct {
    int state;               /* internal */
    unsigned long long left; /* bytes left of the current chunk */
    int ndigits;             /* internal */
    int done;                /* 1 once the last chunk and its trailer were read */
} hh_chunked;

typedef int (*hh_sink)(void *ctx, const char *p, size_t n); /* 0, or -1 to stop */

/* Feeds n bytes of a chunked body; the payload goes to sink. Returns the bytes consumed (all
 * of them unless the body ended in them: the rest is not part of it), or -1 when malformed
 * or the sink stopped. */
long long hh_chunked_feed(hh_chunked *c, const char *p, size_t n, hh_sink sink, void *ctx);

/* URL parts: https or http, host (an IPv6 literal without its brackets), port, path with the
 * query. 0, or -1 when the URL is not of that form. */
typedef struct {
    int tls;
    char host[256];
    int port;
    char path[4096];
} hh_url;
int hh_parse_url(const char *url, hh_url *u);

typedef struct {
    const char *method; /* "GET" (default) or "HEAD" */
    const char *url;
    const char *token;    /* sent as "Authorization: Bearer TOKEN" to the URL's host */
    long long range_from; /* > 0: "Range: bytes=N-" */
    hh_sink body;         /* the body of a 2xx answer; NULL: dropped */
    void *ctx;
    int timeout_s; /* connect, and silence while reading; 0: 30 s */
} hh_request;

/* Runs the request, following up to 5 redirects; head gets the final answer's head (of any
 * status: the caller judges it; a 2xx answer's body went to the sink in full). Returns 0; -1
 * on an error another try may mend (connecting, reading, a body cut short, the sink
 * failing); -2 on one it will not (an untrusted certificate, a malformed answer or URL, a
 * redirect loop or one to plain http). err says which. */
int hh_fetch(const hh_request *r, hh_head *head, char *err, size_t err_len);

#endif
