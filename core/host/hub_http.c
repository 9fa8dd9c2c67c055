#include "hub_http.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

/* ------------------------------------------------------------------ parsing */

/* A decimal of at most 18 digits from s[0..n); -1 when not one. */
static long long parse_dec(const char *s, size_t n) {
    if (n == 0 || n > 18) return -1;
    long long v = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9') return -1;
        v = v * 10 + (s[i] - '0');
    }
    return v;
}

static void trim(const char **s, size_t *n) {
    while (*n && (**s == ' ' || **s == '\t')) (*s)++, (*n)--;
    while (*n && ((*s)[*n - 1] == ' ' || (*s)[*n - 1] == '\t')) (*n)--;
}

static int field_is(const char *name, size_t n, const char *want) {
    return strlen(want) == n && strncasecmp(name, want, n) == 0;
}

/* "bytes START-END/TOTAL" (TOTAL may be '*'). */
static int parse_content_range(const char *v, size_t n, hh_head *h) {
    if (n < 6 || strncasecmp(v, "bytes ", 6) != 0) return -1;
    v += 6, n -= 6;
    const char *dash = memchr(v, '-', n), *slash = memchr(v, '/', n);
    if (!dash || !slash || slash < dash) return -1;
    long long a = parse_dec(v, (size_t)(dash - v));
    long long b = parse_dec(dash + 1, (size_t)(slash - dash - 1));
    if (a < 0 || b < a) return -1;
    size_t tl = n - (size_t)(slash + 1 - v);
    long long t = (tl == 1 && slash[1] == '*') ? -1 : parse_dec(slash + 1, tl);
    if (t < -1 || (t >= 0 && b >= t)) return -1;
    h->range_start = a;
    h->range_total = t;
    return 0;
}

int hh_parse_head(const char *buf, size_t len, hh_head *h) {
    memset(h, 0, sizeof *h);
    h->length = h->range_start = h->range_total = -1;
    h->retry_after = -1;
    if (len < 4 || memcmp(buf + len - 4, "\r\n\r\n", 4) != 0) return -1;
    const char *end = buf + len - 2, *eol = NULL;
    /* status line: HTTP/1.x NNN reason */
    for (const char *q = buf; q + 1 < end + 2; q++)
        if (q[0] == '\r' && q[1] == '\n') {
            eol = q;
            break;
        }
    if (!eol || eol - buf < 12 || memcmp(buf, "HTTP/1.", 7) != 0 || buf[8] != ' ') return -1;
    long long st = parse_dec(buf + 9, 3);
    if (st < 100 || st > 599 || (eol - buf > 12 && buf[12] != ' ')) return -1;
    h->status = (int)st;
    int seen_length = 0;
    for (const char *line = eol + 2; line < end;) {
        const char *e = line;
        while (e + 1 < end + 2 && !(e[0] == '\r' && e[1] == '\n')) e++;
        if (e + 1 >= end + 2) return -1;
        size_t ln = (size_t)(e - line);
        const char *colon = memchr(line, ':', ln);
        if (!colon || colon == line) return -1;
        for (const char *c = line; c < colon; c++)
            if (!isgraph((unsigned char)*c)) return -1; /* no space before the colon */
        for (const char *c = line; c < e; c++)
            if (*c == '\0' || *c == '\r' || *c == '\n') return -1;
        size_t nn = (size_t)(colon - line);
        const char *v = colon + 1;
        size_t vn = (size_t)(e - v);
        trim(&v, &vn);
        if (field_is(line, nn, "content-length")) {
            long long l = parse_dec(v, vn);
            if (l < 0 || (seen_length && l != h->length)) return -1; /* differing lengths */
            h->length = l;
            seen_length = 1;
        } else if (field_is(line, nn, "transfer-encoding")) {
            if (vn == 7 && strncasecmp(v, "chunked", 7) == 0)
                h->chunked = 1;
            else if (!(vn == 8 && strncasecmp(v, "identity", 8) == 0))
                return -1; /* a coding we cannot undo */
        } else if (field_is(line, nn, "content-range")) {
            if (parse_content_range(v, vn, h)) return -1;
        } else if (field_is(line, nn, "retry-after")) {
            long long r = parse_dec(v, vn);
            h->retry_after = r >= 0 && r < 86400 ? (int)r : -1;
        } else if (field_is(line, nn, "location")) {
            if (vn == 0 || vn >= sizeof h->location) return -1;
            memcpy(h->location, v, vn);
            h->location[vn] = 0;
        }
        line = e + 2;
    }
    if (h->chunked) h->length = -1; /* RFC 9112 6.3: the coding wins */
    return 0;
}

enum {
    CK_SIZE,
    CK_EXT,
    CK_SIZE_LF,
    CK_DATA,
    CK_DATA_CR,
    CK_DATA_LF,
    CK_TRAILER,
    CK_TRAILER_LF,
    CK_TRAILER_LINE,
    CK_TRAILER_LINE_LF
};

long long hh_chunked_feed(hh_chunked *c, const char *p, size_t n, hh_sink sink, void *ctx) {
    size_t i = 0;
    while (i < n && !c->done) {
        char ch = p[i];
        switch (c->state) {
        case CK_SIZE: {
            int d = isxdigit((unsigned char)ch)
                        ? (ch <= '9' ? ch - '0' : (tolower((unsigned char)ch) - 'a' + 10))
                        : -1;
            if (d >= 0) {
                if (++c->ndigits > 15) return -1; /* no chunk of a petabyte */
                c->left = c->left * 16 + (unsigned)d;
            } else if (c->ndigits && (ch == ';' || ch == ' ' || ch == '\t')) {
                c->state = CK_EXT;
            } else if (c->ndigits && ch == '\r') {
                c->state = CK_SIZE_LF;
            } else {
                return -1;
            }
            i++;
            break;
        }
        case CK_EXT: /* chunk extensions: ignored up to the line's end */
            if (ch == '\r')
                c->state = CK_SIZE_LF;
            else if (ch == '\n')
                return -1;
            i++;
            break;
        case CK_SIZE_LF:
            if (ch != '\n') return -1;
            i++;
            c->ndigits = 0;
            c->state = c->left ? CK_DATA : CK_TRAILER;
            break;
        case CK_DATA: {
            size_t k = n - i;
            if (k > c->left) k = (size_t)c->left;
            if (sink && sink(ctx, p + i, k)) return -1;
            i += k;
            c->left -= k;
            if (!c->left) c->state = CK_DATA_CR;
            break;
        }
        case CK_DATA_CR:
            if (ch != '\r') return -1;
            i++;
            c->state = CK_DATA_LF;
            break;
        case CK_DATA_LF:
            if (ch != '\n') return -1;
            i++;
            c->state = CK_SIZE;
            break;
        case CK_TRAILER: /* after the last chunk: an empty line, or trailer fields */
            if (ch == '\r')
                c->state = CK_TRAILER_LF;
            else
                c->state = CK_TRAILER_LINE;
            i++;
            break;
        case CK_TRAILER_LF:
            if (ch != '\n') return -1;
            i++;
            c->done = 1;
            break;
        case CK_TRAILER_LINE:
            if (ch == '\r') c->state = CK_TRAILER_LINE_LF;
            i++;
            break;
        case CK_TRAILER_LINE_LF:
            if (ch != '\n') return -1;
            i++;
            c->state = CK_TRAILER;
            break;
        default:
            return -1;
        }
    }
    return (long long)i;
}

int hh_parse_url(const char *url, hh_url *u) {
    memset(u, 0, sizeof *u);
    const char *s;
    if (!strncmp(url, "https://", 8)) {
        u->tls = 1, u->port = 443, s = url + 8;
    } else if (!strncmp(url, "http://", 7)) {
        u->port = 80, s = url + 7;
    } else {
        return -1;
    }
    size_t auth = strcspn(s, "/?#");
    const char *hs = s, *he;
    const char *port = NULL;
    if (auth && s[0] == '[') {
        const char *rb = memchr(s, ']', auth);
        if (!rb) return -1;
        hs = s + 1, he = rb;
        if (rb + 1 < s + auth) {
            if (rb[1] != ':') return -1;
            port = rb + 2;
        }
    } else {
        const char *colon = memchr(s, ':', auth);
        he = colon ? colon : s + auth;
        if (colon) port = colon + 1;
    }
    if (memchr(s, '@', auth)) return -1; /* no credentials in URLs */
    size_t hn = (size_t)(he - hs);
    if (hn == 0 || hn >= sizeof u->host) return -1;
    for (size_t i = 0; i < hn; i++)
        if (!(isalnum((unsigned char)hs[i]) || strchr("-._:", hs[i]))) return -1;
    memcpy(u->host, hs, hn);
    if (port) {
        long long p = parse_dec(port, (size_t)(s + auth - port));
        if (p < 1 || p > 65535) return -1;
        u->port = (int)p;
    }
    const char *path = s + auth;
    size_t pn = strcspn(path, "#");
    if (pn + 2 > sizeof u->path) return -1;
    for (size_t i = 0; i < pn; i++)
        if ((unsigned char)path[i] <= ' ' || path[i] == 0x7f) return -1;
    if (pn == 0 || path[0] != '/') {
        u->path[0] = '/';
        memcpy(u->path + 1, path, pn);
    } else {
        memcpy(u->path, path, pn);
    }
    return 0;
}

/* ------------------------------------------------------------------ connections */

typedef struct {
    int fd;
    SSL *ssl;
    SSL_CTX *ctx;
    int untrusted; /* the handshake failed on the certificate */
} conn;

static void conn_close(conn *c) {
    if (c->ssl) {
        SSL_shutdown(c->ssl);
        SSL_free(c->ssl);
    }
    if (c->ctx) SSL_CTX_free(c->ctx);
    if (c->fd >= 0) close(c->fd);
    c->fd = -1, c->ssl = NULL, c->ctx = NULL;
}

static void tls_error(char *err, size_t n, const char *what, const char *host) {
    unsigned long e = ERR_get_error();
    char buf[256] = "";
    if (e) ERR_error_string_n(e, buf, sizeof buf);
    snprintf(err, n, "%s with %s failed%s%s", what, host, buf[0] ? ": " : "", buf);
    ERR_clear_error();
}

static int connect_tcp(const hh_url *u, int timeout_s, char *err, size_t n) {
    char port[8];
    snprintf(port, sizeof port, "%d", u->port);
    struct addrinfo hints = {0}, *res = NULL;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_family = AF_UNSPEC;
    int rc = getaddrinfo(u->host, port, &hints, &res);
    if (rc) {
        snprintf(err, n, "cannot resolve %s: %s", u->host, gai_strerror(rc));
        return -1;
    }
    int fd = -1, last = 0;
    for (struct addrinfo *a = res; a && fd < 0; a = a->ai_next) {
        fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
        if (fd < 0) continue;
        int fl = fcntl(fd, F_GETFL);
        fcntl(fd, F_SETFL, fl | O_NONBLOCK);
        int ok = connect(fd, a->ai_addr, a->ai_addrlen) == 0;
        if (!ok && errno == EINPROGRESS) {
            struct pollfd p = {.fd = fd, .events = POLLOUT};
            int soerr = 0;
            socklen_t sl = sizeof soerr;
            if (poll(&p, 1, timeout_s * 1000) == 1 &&
                getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &sl) == 0 && soerr == 0)
                ok = 1;
            else
                errno = soerr ? soerr : ETIMEDOUT;
        }
        if (ok) {
            fcntl(fd, F_SETFL, fl);
            struct timeval tv = {.tv_sec = timeout_s};
            setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
            setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
        } else {
            last = errno;
            close(fd);
            fd = -1;
        }
    }
    freeaddrinfo(res);
    if (fd < 0) snprintf(err, n, "cannot connect to %s:%d: %s", u->host, u->port, strerror(last));
    return fd;
}

static int conn_open(conn *c, const hh_url *u, int timeout_s, char *err, size_t n) {
    c->fd = -1, c->ssl = NULL, c->ctx = NULL, c->untrusted = 0;
    if ((c->fd = connect_tcp(u, timeout_s, err, n)) < 0) return -1;
    if (!u->tls) return 0;
    c->ctx = SSL_CTX_new(TLS_client_method());
    if (!c->ctx) {
        tls_error(err, n, "TLS set-up", u->host);
        goto fail;
    }
    SSL_CTX_set_min_proto_version(c->ctx, TLS1_2_VERSION);
#ifdef SSL_OP_IGNORE_UNEXPECTED_EOF
    /* a close without close_notify reads as the end; lengths tell a cut body */
    SSL_CTX_set_options(c->ctx, SSL_OP_IGNORE_UNEXPECTED_EOF);
#endif
    SSL_CTX_set_verify(c->ctx, SSL_VERIFY_PEER, NULL);
    SSL_CTX_set_default_verify_paths(c->ctx); /* honours SSL_CERT_FILE and SSL_CERT_DIR */
    c->ssl = SSL_new(c->ctx);
    if (!c->ssl || !SSL_set_fd(c->ssl, c->fd)) {
        tls_error(err, n, "TLS set-up", u->host);
        goto fail;
    }
    struct in6_addr a6;
    struct in_addr a4;
    if (inet_pton(AF_INET, u->host, &a4) == 1 || inet_pton(AF_INET6, u->host, &a6) == 1) {
        X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(c->ssl), u->host);
    } else {
        SSL_set_tlsext_host_name(c->ssl, u->host);
        SSL_set1_host(c->ssl, u->host);
    }
    if (SSL_connect(c->ssl) != 1) {
        long v = SSL_get_verify_result(c->ssl);
        c->untrusted = v != X509_V_OK;
        if (v != X509_V_OK)
            snprintf(err, n, "the TLS certificate of %s is not trusted: %s", u->host,
                     X509_verify_cert_error_string(v));
        else
            tls_error(err, n, "the TLS handshake", u->host);
        ERR_clear_error();
        goto fail;
    }
    return 0;
fail:
    conn_close(c);
    return -1;
}

static int conn_write(conn *c, const char *p, size_t n) {
    while (n) {
        long w = c->ssl ? SSL_write(c->ssl, p, (int)(n > 1 << 30 ? 1 << 30 : n))
                        : send(c->fd, p, n, MSG_NOSIGNAL);
        if (w <= 0) {
            if (!c->ssl && w < 0 && errno == EINTR) continue;
            return -1;
        }
        p += w, n -= (size_t)w;
    }
    return 0;
}

/* Up to cap bytes; 0 at the end of the stream, -1 on an error or timeout. */
static long conn_read(conn *c, char *p, size_t cap) {
    for (;;) {
        if (c->ssl) {
            int r = SSL_read(c->ssl, p, (int)cap);
            if (r > 0) return r;
            int e = SSL_get_error(c->ssl, r);
            ERR_clear_error();
            /* a peer that closes without close_notify: the end, judged by the length */
            if (e == SSL_ERROR_ZERO_RETURN || (e == SSL_ERROR_SYSCALL && errno == 0) ||
                e == SSL_ERROR_SSL)
                return e == SSL_ERROR_SSL ? -1 : 0;
            if (e == SSL_ERROR_SYSCALL && errno == EINTR) continue;
            return -1;
        }
        long r = recv(c->fd, p, cap, 0);
        if (r >= 0) return r;
        if (errno == EINTR) continue;
        return -1;
    }
}

/* ------------------------------------------------------------------ requests */

typedef struct {
    hh_sink sink;
    void *ctx;
    long long got;
} body_state;

static int count_sink(void *ctx, const char *p, size_t n) {
    body_state *b = ctx;
    b->got += (long long)n;
    return b->sink ? b->sink(b->ctx, p, n) : 0;
}

/* One request on a new connection. */
static int fetch_once(const hh_request *r, const hh_url *u, int send_token, hh_head *h, char *err,
                      size_t n) {
    int timeout = r->timeout_s > 0 ? r->timeout_s : 30;
    const char *method = r->method ? r->method : "GET";
    conn c;
    if (conn_open(&c, u, timeout, err, n)) return c.untrusted ? -2 : -1;
    char req[8192], hostport[300];
    int default_port = u->port == (u->tls ? 443 : 80);
    if (strchr(u->host, ':'))
        snprintf(hostport, sizeof hostport, default_port ? "[%s]" : "[%s]:%d", u->host, u->port);
    else
        snprintf(hostport, sizeof hostport, default_port ? "%s" : "%s:%d", u->host, u->port);
    int len = snprintf(req, sizeof req,
                       "%s %s HTTP/1.1\r\nHost: %s\r\nUser-Agent: lmhost/0.1\r\n"
                       "Accept-Encoding: identity\r\nConnection: close\r\n",
                       method, u->path, hostport);
    if (send_token && r->token && *r->token)
        len +=
            snprintf(req + len, sizeof req - (size_t)len, "Authorization: Bearer %s\r\n", r->token);
    if (r->range_from > 0)
        len +=
            snprintf(req + len, sizeof req - (size_t)len, "Range: bytes=%lld-\r\n", r->range_from);
    len += snprintf(req + len, sizeof req - (size_t)len, "\r\n");
    if (len >= (int)sizeof req) {
        snprintf(err, n, "request to %s too long", u->host);
        conn_close(&c);
        return -1;
    }
    if (conn_write(&c, req, (size_t)len)) {
        snprintf(err, n, "sending the request to %s failed", u->host);
        conn_close(&c);
        return -1;
    }
    /* the head, up to 64 KiB */
    static const size_t head_max = 65536;
    char *buf = malloc(head_max);
    if (!buf) {
        snprintf(err, n, "out of memory");
        conn_close(&c);
        return -1;
    }
    size_t have = 0, head_len = 0;
    int rc = -1;
    while (!head_len) {
        if (have == head_max) {
            snprintf(err, n, "%s sent a response head over 64 KiB", u->host);
            goto out;
        }
        long got = conn_read(&c, buf + have, head_max - have);
        if (got <= 0) {
            snprintf(err, n, "%s closed the connection or timed out before answering", u->host);
            goto out;
        }
        size_t from = have > 3 ? have - 3 : 0;
        have += (size_t)got;
        for (size_t i = from; i + 4 <= have; i++)
            if (!memcmp(buf + i, "\r\n\r\n", 4)) {
                head_len = i + 4;
                break;
            }
    }
    if (hh_parse_head(buf, head_len, h)) {
        snprintf(err, n, "%s sent a malformed response head", u->host);
        rc = -2;
        goto out;
    }
    if (!strcmp(method, "HEAD") || h->status < 200 || h->status >= 300 || h->status == 204) {
        rc = 0; /* the body of a redirect or an error is not wanted */
        goto out;
    }
    body_state bs = {.sink = r->body, .ctx = r->ctx};
    hh_chunked ck = {0};
    size_t extra = have - head_len;
    char *p = buf + head_len;
    for (;;) {
        if (extra) {
            if (h->chunked) {
                if (hh_chunked_feed(&ck, p, extra, count_sink, &bs) < 0) {
                    snprintf(err, n,
                             "%s sent a malformed chunked body (or it could not be "
                             "written)",
                             u->host);
                    goto out;
                }
                if (ck.done) break;
            } else {
                size_t k = extra;
                if (h->length >= 0 && (long long)k > h->length - bs.got)
                    k = (size_t)(h->length - bs.got);
                if (count_sink(&bs, p, k)) {
                    snprintf(err, n, "writing the body from %s failed", u->host);
                    goto out;
                }
            }
        }
        if (!h->chunked && h->length >= 0 && bs.got >= h->length) break;
        long got = conn_read(&c, buf, head_max);
        if (got < 0) {
            snprintf(err, n, "reading from %s failed or timed out after %lld bytes", u->host,
                     bs.got);
            goto out;
        }
        if (got == 0) {
            if (!h->chunked && h->length < 0) break; /* a body up to the close */
            snprintf(err, n, "%s closed the connection after %lld of %lld bytes", u->host, bs.got,
                     h->length);
            goto out;
        }
        p = buf, extra = (size_t)got;
    }
    rc = 0;
out:
    free(buf);
    conn_close(&c);
    return rc;
}

/* The absolute URL a Location names, relative to base. */
static int resolve_location(const hh_url *base, const char *loc, char *out, size_t n) {
    if (!strncmp(loc, "https://", 8) || !strncmp(loc, "http://", 7))
        return snprintf(out, n, "%s", loc) < (int)n ? 0 : -1;
    const char *scheme = base->tls ? "https" : "http";
    const char *fmt = strchr(base->host, ':') ? "%s://[%s]:%d" : "%s://%s:%d";
    int w = snprintf(out, n, fmt, scheme, base->host, base->port);
    if (w < 0 || (size_t)w >= n) return -1;
    if (loc[0] == '/')
        return snprintf(out + w, n - (size_t)w, "%s", loc) < (int)(n - (size_t)w) ? 0 : -1;
    /* relative to the base path's folder */
    const char *q = strchr(base->path, '?');
    size_t pl = q ? (size_t)(q - base->path) : strlen(base->path);
    while (pl && base->path[pl - 1] != '/') pl--;
    return snprintf(out + w, n - (size_t)w, "%.*s%s", (int)pl, base->path, loc) <
                   (int)(n - (size_t)w)
               ? 0
               : -1;
}

int hh_fetch(const hh_request *r, hh_head *head, char *err, size_t err_len) {
    static int once;
    if (!once) {
        OPENSSL_init_ssl(0, NULL);
        once = 1;
    }
    char url[4096];
    if (snprintf(url, sizeof url, "%s", r->url) >= (int)sizeof url) {
        snprintf(err, err_len, "URL too long");
        return -2;
    }
    hh_url first, u;
    if (hh_parse_url(url, &first)) {
        snprintf(err, err_len, "not an http(s) URL: %s", r->url);
        return -2;
    }
    u = first;
    for (int hop = 0; hop <= 5; hop++) {
        /* the token goes to the host it was meant for, never on to a CDN's */
        int same = !strcmp(u.host, first.host) && u.port == first.port && u.tls == first.tls;
        int rc = fetch_once(r, &u, same, head, err, err_len);
        if (rc) return rc;
        int redirect = head->status == 301 || head->status == 302 || head->status == 303 ||
                       head->status == 307 || head->status == 308;
        if (!redirect) return 0;
        if (!head->location[0]) {
            snprintf(err, err_len, "%s answered %d without a Location", u.host, head->status);
            return -2;
        }
        char next[4096];
        hh_url nu;
        if (resolve_location(&u, head->location, next, sizeof next) || hh_parse_url(next, &nu)) {
            snprintf(err, err_len, "%s redirected to an unusable URL", u.host);
            return -2;
        }
        if (u.tls && !nu.tls) {
            snprintf(err, err_len, "%s redirected from https to plain http; refused", u.host);
            return -2;
        }
        u = nu;
    }
    snprintf(err, err_len, "more than 5 redirects from %s", first.host);
    return -2;
}
