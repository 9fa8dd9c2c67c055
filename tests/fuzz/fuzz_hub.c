/* libFuzzer target: what a download reads from the network (core/host/hub_http.c,
 * hub_download.c). The first byte picks the parser: the response head, the chunked decoder
 * (fed in pieces whose sizes come from the input, against the same input in one piece), a
 * redirect's URL, or the hub's file list. Invariants: a decoded chunked body is never longer
 * than its coding, the split feed gives the bytes the whole feed gives, accepted file paths
 * stay inside the snapshot. (tests/fuzz/run_fuzzers.sh SECONDS builds and runs it.) */
#include "hub_download.h"
#include "hub_http.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

typedef struct {
    char *buf;
    size_t len, cap;
} sink_buf;

static int collect(void *ctx, const char *p, size_t n) {
    sink_buf *s = ctx;
    if (s->len + n > s->cap) abort(); /* more payload than coding */
    memcpy(s->buf + s->len, p, n);
    s->len += n;
    return 0;
}

static void chunked(const char *p, size_t n, const uint8_t *cuts, size_t ncuts) {
    sink_buf whole = {malloc(n + 1), 0, n}, split = {malloc(n + 1), 0, n};
    hh_chunked a = {0}, b = {0};
    long long ra = hh_chunked_feed(&a, p, n, collect, &whole);
    size_t off = 0, k = 0;
    long long rb = 0;
    while (off < n && rb >= 0 && !b.done) {
        size_t step = ncuts ? (size_t)(cuts[k++ % ncuts] % 17) + 1 : n;
        if (step > n - off) step = n - off;
        rb = hh_chunked_feed(&b, p + off, step, collect, &split);
        if (rb >= 0) off += (size_t)rb;
    }
    if (ra >= 0 && rb >= 0) {
        if (a.done != b.done || (size_t)ra != (b.done ? off : n)) abort();
        if (whole.len != split.len || memcmp(whole.buf, split.buf, whole.len)) abort();
    }
    free(whole.buf);
    free(split.buf);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    int which = data[0] & 3;
    const char *p = (const char *)data + 1;
    size_t n = size - 1;
    char *s = malloc(n + 1);
    memcpy(s, p, n);
    s[n] = 0;
    if (which == 0) {
        hh_head h;
        if (hh_parse_head(s, n, &h) == 0) {
            if (h.status < 100 || h.status > 599) abort();
            if (strlen(h.location) >= sizeof h.location) abort();
        }
    } else if (which == 1) {
        size_t ncut = n < 8 ? n : 8;
        chunked(s + ncut, n - ncut, (const uint8_t *)s, ncut);
    } else if (which == 2) {
        hh_url u;
        if (hh_parse_url(s, &u) == 0) {
            if (!u.host[0] || u.port < 1 || u.port > 65535 || u.path[0] != '/') abort();
        }
    } else {
        hub_info info;
        char err[512] = "";
        if (hub_parse_info(s, n, &info, err, sizeof err) == 0) {
            for (int i = 0; i < info.n; i++) {
                const char *f = info.files[i].path;
                if (f[0] == '/' || strstr(f, "..") == f || strstr(f, "/../") || strchr(f, '\\'))
                    abort();
                if (info.files[i].size < 0) abort();
                (void)hub_wanted(f);
            }
            hub_info_free(&info);
        } else if (!err[0]) {
            abort(); /* every refusal says why */
        }
    }
    free(s);
    return 0;
}
