/* The download path's parsers (core/host/hub_http.c, hub_download.c) on known inputs: response
 * heads, the chunked coding fed whole and a byte at a time, URLs, the hub's file list and
 * which files a pull wants. */
#include "hub_download.h"
#include "hub_http.h"
#include "../test_check.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int head(const char *s, hh_head *h) {
    return hh_parse_head(s, strlen(s), h);
}

typedef struct {
    char buf[256];
    size_t len;
} out;

static int sink(void *ctx, const char *p, size_t n) {
    out *o = ctx;
    if (o->len + n >= sizeof o->buf) return -1;
    memcpy(o->buf + o->len, p, n);
    o->len += n;
    o->buf[o->len] = 0;
    return 0;
}

static void test_heads(void) {
    hh_head h;
    CHECK(head("HTTP/1.1 206 Partial Content\r\ncontent-length: 10\r\n"
               "Content-Range: bytes 5-14/15\r\n\r\n",
               &h) == 0);
    CHECK(h.status == 206 && h.length == 10 && h.range_start == 5 && h.range_total == 15);
    CHECK(head("HTTP/1.1 302 Found\r\nLocation:  https://cdn.example/a?b=c \r\n"
               "Retry-After: 7\r\n\r\n",
               &h) == 0);
    CHECK(h.status == 302 && !strcmp(h.location, "https://cdn.example/a?b=c") &&
          h.retry_after == 7 && h.length == -1);
    CHECK(head("HTTP/1.1 200\r\nTransfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n", &h) ==
              0 &&
          h.chunked && h.length == -1);
    CHECK(head("HTTP/1.0 200 OK\r\n\r\n", &h) == 0 && h.status == 200);
    /* refused: differing lengths, a coding we cannot undo, space before the colon, no end,
     * a bad status, a range past its total */
    CHECK(head("HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n", &h) < 0);
    CHECK(head("HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n", &h) < 0);
    CHECK(head("HTTP/1.1 200 OK\r\nContent-Length : 5\r\n\r\n", &h) < 0);
    CHECK(head("HTTP/1.1 200 OK\r\nContent-Length: 5\r\n", &h) < 0);
    CHECK(head("HTTP/1.1 20x OK\r\n\r\n", &h) < 0);
    CHECK(head("HTTP/2 200 OK\r\n\r\n", &h) < 0);
    CHECK(head("HTTP/1.1 206 OK\r\nContent-Range: bytes 5-15/15\r\n\r\n", &h) < 0);
    CHECK(head("HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n", &h) < 0);
}

static void test_chunked(void) {
    const char *body = "4\r\nWiki\r\n5;name=v\r\npedia\r\nE\r\n in\r\n\r\nchunks.\r\n0\r\n"
                       "Trailer: x\r\n\r\nNEXT";
    size_t n = strlen(body);
    out o = {0};
    hh_chunked c = {0};
    long long used = hh_chunked_feed(&c, body, n, sink, &o);
    CHECK(c.done && used == (long long)(n - 4) && !strcmp(o.buf, "Wikipedia in\r\n\r\nchunks."));
    out o2 = {0};
    hh_chunked c2 = {0};
    size_t i = 0;
    while (i < n && !c2.done) {
        long long u = hh_chunked_feed(&c2, body + i, 1, sink, &o2);
        CHECK(u == 1);
        if (u != 1) break;
        i++;
    }
    CHECK(c2.done && i == n - 4 && !strcmp(o2.buf, o.buf));
    hh_chunked c3 = {0};
    CHECK(hh_chunked_feed(&c3, "zz\r\n", 4, sink, &o) < 0); /* not hex */
    hh_chunked c4 = {0};
    CHECK(hh_chunked_feed(&c4, "3\r\nabcX\r\n", 9, sink, &o) < 0); /* no CRLF after data */
    hh_chunked c5 = {0};
    CHECK(hh_chunked_feed(&c5, "1000000000000000\r\n", 18, sink, &o) < 0); /* too large */
}

static void test_urls(void) {
    hh_url u;
    CHECK(hh_parse_url("https://huggingface.co/api/models/a/b?x=1#f", &u) == 0 && u.tls &&
          u.port == 443 && !strcmp(u.host, "huggingface.co") &&
          !strcmp(u.path, "/api/models/a/b?x=1"));
    CHECK(hh_parse_url("http://[::1]:8080", &u) == 0 && !u.tls && u.port == 8080 &&
          !strcmp(u.host, "::1") && !strcmp(u.path, "/"));
    CHECK(hh_parse_url("http://127.0.0.1:0/", &u) < 0);
    CHECK(hh_parse_url("ftp://example.com/", &u) < 0);
    CHECK(hh_parse_url("https://user:pw@example.com/", &u) < 0);
    CHECK(hh_parse_url("https://exa mple.com/", &u) < 0);
    CHECK(hh_parse_url("https://example.com/a b", &u) < 0);
}

static void test_info(void) {
    const char *ok =
        "{\"sha\":\"0123456789abcdef0123456789abcdef01234567\",\"siblings\":["
        "{\"rfilename\":\"config.json\",\"blobId\":\"89abcdef0123456789abcdef0123456789abcdef\","
        "\"size\":12},"
        "{\"rfilename\":\"model.safetensors\",\"blobId\":"
        "\"89abcdef0123456789abcdef0123456789abcdef\","
        "\"size\":135,\"lfs\":{\"sha256\":\""
        "0123456789abcdef0123456789abcdef"
        "0123456789abcdef0123456789abcdef\",\"size\":4096,\"pointerSize\":135}},"
        "{\"rfilename\":\"onnx/"
        "model.onnx\",\"blobId\":\"89abcdef0123456789abcdef0123456789abcdef\","
        "\"size\":1}]}";
    hub_info info;
    char err[256];
    CHECK(hub_parse_info(ok, strlen(ok), &info, err, sizeof err) == 0);
    CHECK(info.n == 3 && !strcmp(info.commit, "0123456789abcdef0123456789abcdef01234567"));
    if (info.n == 3) {
        CHECK(!info.files[0].lfs && info.files[0].size == 12 && strlen(info.files[0].hash) == 40);
        CHECK(info.files[1].lfs && info.files[1].size == 4096 && strlen(info.files[1].hash) == 64);
        CHECK(hub_wanted(info.files[0].path) && hub_wanted(info.files[1].path) &&
              !hub_wanted(info.files[2].path));
    }
    hub_info_free(&info);
    const char *bad[] = {
        "{\"siblings\":[]}", /* no commit */
        "{\"sha\":\"0123456789abcdef0123456789abcdef01234567\"}",
        "{\"sha\":\"0123456789abcdef0123456789abcdef01234567\",\"siblings\":[{\"rfilename\":"
        "\"../x\",\"blobId\":\"89abcdef0123456789abcdef0123456789abcdef\",\"size\":1}]}",
        "{\"sha\":\"0123456789abcdef0123456789abcdef01234567\",\"siblings\":[{\"rfilename\":"
        "\"/etc/x\",\"blobId\":\"89abcdef0123456789abcdef0123456789abcdef\",\"size\":1}]}",
        "{\"sha\":\"0123456789abcdef0123456789abcdef01234567\",\"siblings\":[{\"rfilename\":"
        "\"a//b\",\"blobId\":\"89abcdef0123456789abcdef0123456789abcdef\",\"size\":1}]}",
        "{\"sha\":\"0123456789abcdef0123456789abcdef01234567\",\"siblings\":[{\"rfilename\":"
        "\"x\",\"size\":1}]}", /* no blobId (not asked with blobs=true) */
        "{\"sha\":\"0123456789abcdef0123456789abcdef01234567\",\"siblings\":[{\"rfilename\":"
        "\"x\",\"blobId\":\"89abcdef0123456789abcdef0123456789abcdef\",\"size\":1,\"lfs\":"
        "{\"sha256\":\"abc\",\"size\":1}}]}", /* a short sha256 */
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        err[0] = 0;
        CHECK(hub_parse_info(bad[i], strlen(bad[i]), &info, err, sizeof err) < 0 && err[0]);
    }
    CHECK(hub_wanted("tokenizer.json") && hub_wanted("chat_template.jinja") &&
          hub_wanted("model-00001-of-00002.safetensors") && !hub_wanted("README.md") &&
          !hub_wanted("pytorch_model.bin") && !hub_wanted("original/params.json"));
}

int main(void) {
    test_heads();
    test_chunked();
    test_urls();
    test_info();
    if (test_failures) {
        fprintf(stderr, "%d failures\n", test_failures);
        return 1;
    }
    printf("ok: hub http\n");
    return 0;
}
