#include "hub_download.h"

#include "hf_cache.h"
#include "hub_http.h"
#include "log.h"
#include "progress.h"
#include "util.h"

#include <errno.h>
#include <fcntl.h>
#include <openssl/evp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

/* ------------------------------------------------------------------ the file list */

static int is_hex(const char *s, size_t n) {
    if (strlen(s) != n) return 0;
    for (size_t i = 0; i < n; i++)
        if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f'))) return 0;
    return 1;
}

/* A relative path that stays inside the snapshot: components of printable characters other
 * than backslash, none empty, "." or "..". */
static int safe_path(const char *p) {
    size_t n = strlen(p);
    if (n == 0 || n > 512 || p[0] == '/') return 0;
    for (const char *c = p; *c; c++)
        if ((unsigned char)*c < 0x20 || *c == 0x7f || *c == '\\') return 0;
    for (const char *c = p;;) {
        size_t k = strcspn(c, "/");
        if (k == 0 || (k == 1 && c[0] == '.') || (k == 2 && c[0] == '.' && c[1] == '.')) return 0;
        if (!c[k]) return 1;
        c += k + 1;
    }
}

static long long get_size(json_object *o) {
    json_object *v;
    if (!json_object_object_get_ex(o, "size", &v) || !json_object_is_type(v, json_type_int))
        return -1;
    int64_t s = json_object_get_int64(v);
    return s >= 0 && s < (1LL << 50) ? s : -1;
}

int hub_parse_info(const char *json, size_t len, hub_info *info, char *err, size_t err_len) {
    memset(info, 0, sizeof *info);
    json_object *root = util_json_parse_object(json, len, NULL, err, err_len);
    if (!root) return -1;
    int rc = -1;
    json_object *sha, *sib;
    if (!json_object_object_get_ex(root, "sha", &sha) ||
        !json_object_is_type(sha, json_type_string) || !is_hex(json_object_get_string(sha), 40)) {
        snprintf(err, err_len, "no commit (\"sha\") in the hub's answer");
        goto out;
    }
    memcpy(info->commit, json_object_get_string(sha), 41);
    if (!json_object_object_get_ex(root, "siblings", &sib) ||
        !json_object_is_type(sib, json_type_array)) {
        snprintf(err, err_len, "no file list (\"siblings\") in the hub's answer");
        goto out;
    }
    size_t n = json_object_array_length(sib);
    if (n > 100000) {
        snprintf(err, err_len, "the hub lists %zu files; more than lmhost takes", n);
        goto out;
    }
    info->files = calloc(n ? n : 1, sizeof *info->files);
    if (!info->files) {
        snprintf(err, err_len, "out of memory");
        goto out;
    }
    for (size_t i = 0; i < n; i++) {
        json_object *f = json_object_array_get_idx(sib, i), *name, *blob, *lfs, *h;
        if (!json_object_is_type(f, json_type_object) ||
            !json_object_object_get_ex(f, "rfilename", &name) ||
            !json_object_is_type(name, json_type_string)) {
            snprintf(err, err_len, "file %zu of the hub's list has no rfilename", i);
            goto out;
        }
        const char *path = json_object_get_string(name);
        if (strlen(path) != (size_t)json_object_get_string_len(name) || !safe_path(path)) {
            snprintf(err, err_len, "the hub lists a file with an unsafe path");
            goto out;
        }
        hub_file *hf = &info->files[info->n];
        if (json_object_object_get_ex(f, "lfs", &lfs) &&
            json_object_is_type(lfs, json_type_object)) {
            if (!json_object_object_get_ex(lfs, "sha256", &h) ||
                !json_object_is_type(h, json_type_string) ||
                !is_hex(json_object_get_string(h), 64) || (hf->size = get_size(lfs)) < 0) {
                snprintf(err, err_len, "%s: no valid lfs sha256 and size in the hub's list", path);
                goto out;
            }
            hf->lfs = 1;
        } else {
            if (!json_object_object_get_ex(f, "blobId", &blob) ||
                !json_object_is_type(blob, json_type_string) ||
                !is_hex(json_object_get_string(blob), 40) || (hf->size = get_size(f)) < 0) {
                snprintf(err, err_len,
                         "%s: no blobId and size in the hub's list (was ?blobs=true asked?)", path);
                goto out;
            }
            h = blob;
        }
        memcpy(hf->hash, json_object_get_string(h), hf->lfs ? 65 : 41);
        if (!(hf->path = strdup(path))) {
            snprintf(err, err_len, "out of memory");
            goto out;
        }
        info->n++;
    }
    rc = 0;
out:
    json_object_put(root);
    if (rc) hub_info_free(info);
    return rc;
}

void hub_info_free(hub_info *info) {
    for (int i = 0; i < info->n; i++) free(info->files[i].path);
    free(info->files);
    info->files = NULL;
    info->n = 0;
}

int hub_wanted(const char *path) {
    if (strchr(path, '/')) return 0; /* sub-folders hold other formats (onnx/, original/) */
    static const char *ext[] = {".json", ".safetensors", ".jinja", ".model", ".txt", ".tiktoken"};
    size_t n = strlen(path);
    for (size_t i = 0; i < sizeof ext / sizeof *ext; i++) {
        size_t e = strlen(ext[i]);
        if (n > e && !strcmp(path + n - e, ext[i])) return 1;
    }
    return 0;
}

int hub_offline(void) {
    const char *v = getenv("HF_HUB_OFFLINE");
    return v && (!strcmp(v, "1") || !strcasecmp(v, "true") || !strcasecmp(v, "yes") ||
                 !strcasecmp(v, "on"));
}

/* ------------------------------------------------------------------ settings */

static void endpoint(char *out, size_t n) {
    const char *e = getenv("HF_ENDPOINT");
    snprintf(out, n, "%s", e && *e ? e : "https://huggingface.co");
    size_t l = strlen(out);
    while (l && out[l - 1] == '/') out[--l] = 0;
}

/* $HF_TOKEN, else the first line of the token file; "" when none. */
static void token(char *out, size_t n) {
    out[0] = 0;
    const char *t = getenv("HF_TOKEN");
    if (t && *t) {
        snprintf(out, n, "%s", t);
        return;
    }
    char path[4096];
    const char *tp = getenv("HF_TOKEN_PATH"), *home = getenv("HF_HOME"), *h = getenv("HOME");
    if (tp && *tp)
        snprintf(path, sizeof path, "%s", tp);
    else if (home && *home)
        snprintf(path, sizeof path, "%s/token", home);
    else
        snprintf(path, sizeof path, "%s/.cache/huggingface/token", h && *h ? h : ".");
    char e[256];
    size_t len;
    char *s = util_read_file(path, 4096, &len, e, sizeof e);
    if (!s) return;
    s[strcspn(s, "\r\n")] = 0;
    snprintf(out, n, "%s", s);
    free(s);
}

/* Percent-encodes s into out, '/' kept when keep_slash. */
static int url_escape(const char *s, int keep_slash, char *out, size_t n) {
    static const char hex[] = "0123456789ABCDEF";
    size_t o = 0;
    for (const unsigned char *c = (const unsigned char *)s; *c; c++) {
        int plain = (*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') ||
                    (*c >= '0' && *c <= '9') || strchr("-._~", *c) || (keep_slash && *c == '/');
        if (o + 4 > n) return -1;
        if (plain) {
            out[o++] = (char)*c;
        } else {
            out[o++] = '%', out[o++] = hex[*c >> 4], out[o++] = hex[*c & 15];
        }
    }
    out[o] = 0;
    return 0;
}

/* ------------------------------------------------------------------ one request */

typedef struct {
    char *buf;
    size_t len, cap, max;
} membuf;

static int mem_sink(void *ctx, const char *p, size_t n) {
    membuf *m = ctx;
    if (m->len + n > m->max) return -1;
    if (m->len + n + 1 > m->cap) {
        size_t c = m->cap ? m->cap : 65536;
        while (c < m->len + n + 1) c *= 2;
        char *g = realloc(m->buf, c);
        if (!g) return -1;
        m->buf = g, m->cap = c;
    }
    memcpy(m->buf + m->len, p, n);
    m->len += n;
    m->buf[m->len] = 0;
    return 0;
}

/* What a status means for a pull, into err; 1 when it is worth another try. */
static int status_error(int st, const char *what, const char *name, char *err, size_t n) {
    if (st == 401 || st == 403)
        snprintf(err, n,
                 "%s: the hub answered %d for %s: the model is gated or private, or the name is "
                 "wrong; set HF_TOKEN to a token that may read it (and accept the model's terms "
                 "on the hub)",
                 name, st, what);
    else if (st == 404)
        snprintf(err, n, "%s: not on the hub at %s (404)", name, what);
    else
        snprintf(err, n, "%s: the hub answered %d for %s", name, st, what);
    return st == 408 || st == 429 || st >= 500;
}

static void backoff(int attempt, int retry_after) {
    int s = retry_after >= 0 ? retry_after : 1 << attempt;
    if (s > 30) s = 30;
    log_msg(1, "hub: retrying in %d s", s);
    sleep((unsigned)s);
}

enum { ATTEMPTS = 5 };

static int fetch_info(const char *ep, const char *tok, const char *org, const char *nm,
                      const char *rev, const char *name, hub_info *info, char *err, size_t n) {
    char erev[512], url[4096];
    if (url_escape(rev, 0, erev, sizeof erev)) return -1;
    snprintf(url, sizeof url, "%s/api/models/%s/%s/revision/%s?blobs=true", ep, org, nm, erev);
    for (int attempt = 0;; attempt++) {
        membuf m = {.max = 64u << 20};
        hh_request r = {.url = url, .token = tok, .body = mem_sink, .ctx = &m};
        hh_head h;
        int retry = 1, got = hh_fetch(&r, &h, err, n);
        if (got == -2) retry = 0;
        if (got == 0) {
            if (h.status == 200) {
                int rc = hub_parse_info(m.buf ? m.buf : "", m.len, info, err, n);
                free(m.buf);
                return rc;
            }
            char what[600];
            snprintf(what, sizeof what, "revision '%s'", rev);
            retry = status_error(h.status, what, name, err, n);
        }
        free(m.buf);
        if (!retry || attempt + 1 >= ATTEMPTS) return -1;
        log_msg(1, "hub: %s", err);
        backoff(attempt, -1);
    }
}

/* ------------------------------------------------------------------ one file */

typedef struct {
    int fd;
    const hh_head *head;
    long long have, want_from;
    int started, bad_range;
    progress *bar;
} file_sink_state;

static int file_sink(void *ctx, const char *p, size_t n) {
    file_sink_state *s = ctx;
    if (!s->started) {
        s->started = 1;
        if (s->head->status == 200 && s->have > 0) {
            /* the server ignored the range: start over */
            if (ftruncate(s->fd, 0) || lseek(s->fd, 0, SEEK_SET) < 0) return -1;
            s->have = 0;
        } else if (s->head->status == 206 && s->head->range_start != s->want_from) {
            s->bad_range = 1;
            return -1;
        }
    }
    while (n) {
        ssize_t w = write(s->fd, p, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return -1;
        p += w, n -= (size_t)w;
        s->have += w;
    }
    progress_set(s->bar, (uint64_t)s->have);
    return 0;
}

/* SHA-256 (lfs) or the git blob SHA-1 of a file, as hex into out[65]. */
static int hash_file(const char *path, int lfs, long long size, char *out) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    EVP_MD_CTX *c = EVP_MD_CTX_new();
    int rc = -1;
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned mdn = 0;
    char *buf = malloc(1 << 20);
    if (!c || !buf || !EVP_DigestInit_ex(c, lfs ? EVP_sha256() : EVP_sha1(), NULL)) goto out;
    if (!lfs) {
        char hdr[64];
        int hn = snprintf(hdr, sizeof hdr, "blob %lld", size);
        if (!EVP_DigestUpdate(c, hdr, (size_t)hn + 1)) goto out; /* with its NUL */
    }
    for (;;) {
        ssize_t r = read(fd, buf, 1 << 20);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) goto out;
        if (r == 0) break;
        if (!EVP_DigestUpdate(c, buf, (size_t)r)) goto out;
    }
    if (!EVP_DigestFinal_ex(c, md, &mdn)) goto out;
    for (unsigned i = 0; i < mdn; i++) sprintf(out + 2 * i, "%02x", md[i]);
    rc = 0;
out:
    free(buf);
    EVP_MD_CTX_free(c);
    close(fd);
    return rc;
}

/* mkdir -p of path's parent folders (path itself excluded). */
static int make_parents(const char *path) {
    char p[4096];
    if (snprintf(p, sizeof p, "%s", path) >= (int)sizeof p) return -1;
    for (char *s = p + 1; *s; s++)
        if (*s == '/') {
            *s = 0;
            if (mkdir(p, 0755) && errno != EEXIST) return -1;
            *s = '/';
        }
    return 0;
}

static long long file_size(const char *p) {
    struct stat st;
    return stat(p, &st) == 0 ? (long long)st.st_size : -1;
}

/* Makes blobs/HASH hold the file: downloaded (resumed from blobs/HASH.incomplete), checked,
 * renamed. Holds a lock so two pulls of one model do not write one file. */
static int fetch_blob(const char *ep, const char *tok, const char *org, const char *nm,
                      const char *repo, const char *locks, const char *commit, const hub_file *f,
                      const char *name, int quiet, char *err, size_t n) {
    char blob[4300], inc[4400], lock[4400];
    snprintf(blob, sizeof blob, "%s/blobs/%s", repo, f->hash);
    snprintf(inc, sizeof inc, "%s.incomplete", blob);
    snprintf(lock, sizeof lock, "%s/%s.lock", locks, f->hash);
    if (file_size(blob) == f->size) return 0;
    if (make_parents(blob) || make_parents(lock)) {
        snprintf(err, n, "cannot create folders under %s: %s", repo, strerror(errno));
        return -1;
    }
    int lfd = open(lock, O_CREAT | O_RDWR | O_CLOEXEC, 0644);
    if (lfd < 0 || flock(lfd, LOCK_EX)) {
        snprintf(err, n, "cannot lock %s: %s", lock, strerror(errno));
        if (lfd >= 0) close(lfd);
        return -1;
    }
    int rc = -1;
    if (file_size(blob) == f->size) { /* another pull finished it meanwhile */
        rc = 0;
        goto out_lock;
    }
    int fd = open(inc, O_CREAT | O_WRONLY | O_CLOEXEC, 0644);
    if (fd < 0) {
        snprintf(err, n, "cannot write %s: %s", inc, strerror(errno));
        goto out_lock;
    }
    char path[1600], url[6000];
    if (url_escape(f->path, 1, path, sizeof path)) {
        snprintf(err, n, "%s: path too long", f->path);
        goto out_fd;
    }
    snprintf(url, sizeof url, "%s/%s/%s/resolve/%s/%s", ep, org, nm, commit, path);
    progress *bar = quiet ? NULL : progress_start(f->path, (uint64_t)f->size, 1);
    long long have = file_size(inc);
    if (have > 0) log_msg(2, "hub: %s: resuming at byte %lld", f->path, have);
    for (int attempt = 0;; attempt++) {
        if (have > f->size || lseek(fd, 0, SEEK_END) != have) { /* longer than it should be */
            if (ftruncate(fd, 0) || lseek(fd, 0, SEEK_SET)) break;
            have = 0;
        }
        if (have == f->size) {
            rc = 0;
            break;
        }
        hh_head h;
        file_sink_state s = {.fd = fd, .head = &h, .have = have, .want_from = have, .bar = bar};
        hh_request r = {.url = url, .token = tok, .range_from = have, .body = file_sink, .ctx = &s};
        int retry = 1, retry_after = -1, got = hh_fetch(&r, &h, err, n);
        if (got == -2) retry = 0;
        if (got == 0) {
            if (h.status == 200 || h.status == 206) {
                if (s.have == f->size) {
                    rc = 0;
                    break;
                }
                snprintf(err, n, "%s: the hub sent %lld bytes of %lld", f->path, s.have, f->size);
            } else if (h.status == 416 && have > 0) {
                if (ftruncate(fd, 0)) break; /* the range is past the file: start over */
                have = 0;
                continue;
            } else {
                retry = status_error(h.status, f->path, name, err, n);
                retry_after = h.retry_after;
            }
        } else if (s.bad_range) {
            snprintf(err, n, "%s: the hub answered a different range than asked", f->path);
            if (ftruncate(fd, 0) == 0) s.have = 0;
        }
        have = s.have;
        if (!retry || attempt + 1 >= ATTEMPTS) break;
        log_msg(1, "hub: %s (%lld of %lld bytes kept)", err, have, f->size);
        backoff(attempt, retry_after);
    }
    progress_end(bar, rc == 0);
    if (rc == 0) {
        char got[65] = "";
        if (fsync(fd) || hash_file(inc, f->lfs, f->size, got)) {
            snprintf(err, n, "%s: cannot read back %s: %s", f->path, inc, strerror(errno));
            rc = -1;
        } else if (strcmp(got, f->hash)) {
            snprintf(err, n,
                     "%s: refused: its %s is %s, the hub's list says %s (a corrupted download; "
                     "removed)",
                     f->path, f->lfs ? "SHA-256" : "git blob SHA-1", got, f->hash);
            unlink(inc);
            rc = -1;
        } else if (rename(inc, blob)) {
            snprintf(err, n, "cannot rename %s: %s", inc, strerror(errno));
            rc = -1;
        }
    }
out_fd:
    close(fd);
out_lock:
    flock(lfd, LOCK_UN);
    close(lfd);
    return rc;
}

/* snapshots/COMMIT/PATH -> ../../blobs/HASH (one more ../ a sub-folder). */
static int link_file(const char *repo, const char *commit, const hub_file *f, char *err, size_t n) {
    char link[5000], target[5000] = "";
    snprintf(link, sizeof link, "%s/snapshots/%s/%s", repo, commit, f->path);
    size_t t = 0;
    for (const char *c = f->path; *c; c++)
        if (*c == '/') t += (size_t)snprintf(target + t, sizeof target - t, "../");
    snprintf(target + t, sizeof target - t, "../../blobs/%s", f->hash);
    char now[5000];
    ssize_t l = readlink(link, now, sizeof now - 1);
    if (l >= 0) {
        now[l] = 0;
        if (!strcmp(now, target)) return 0;
    }
    if (make_parents(link)) {
        snprintf(err, n, "cannot create %s: %s", link, strerror(errno));
        return -1;
    }
    unlink(link);
    if (symlink(target, link)) {
        snprintf(err, n, "cannot link %s: %s", link, strerror(errno));
        return -1;
    }
    return 0;
}

static int write_ref(const char *repo, const char *rev, const char *commit, char *err, size_t n) {
    char p[4400], tmp[4500];
    snprintf(p, sizeof p, "%s/refs/%s", repo, rev);
    snprintf(tmp, sizeof tmp, "%s.tmp%d", p, (int)getpid());
    FILE *f = NULL;
    if (make_parents(p) || !(f = fopen(tmp, "w")) || fputs(commit, f) < 0 || fclose(f) ||
        rename(tmp, p)) {
        snprintf(err, n, "cannot write %s: %s", p, strerror(errno));
        unlink(tmp);
        return -1;
    }
    return 0;
}

int hub_pull(const char *name, const hub_pull_opts *o, char *dir, size_t dir_cap, char *err,
             size_t err_len) {
    char org[97], nm[97], rev[129];
    if (!hfc_split(name, org, nm, rev)) {
        snprintf(err, err_len, "'%s' is not a model name ORG/NAME[@REVISION]", name);
        return -1;
    }
    if (hub_offline()) {
        snprintf(err, err_len, "%s/%s is not in the cache, and HF_HUB_OFFLINE forbids fetching it",
                 org, nm);
        return -1;
    }
    signal(SIGPIPE, SIG_IGN); /* a peer gone mid-write is an error, not the end */
    char ep[2048], tok[4096], cache[2048], repo[2400], locks[2400], full[300];
    endpoint(ep, sizeof ep);
    token(tok, sizeof tok);
    hfc_cache_dir(cache, sizeof cache);
    snprintf(repo, sizeof repo, "%s/models--%s--%s", cache, org, nm);
    snprintf(locks, sizeof locks, "%s/.locks/models--%s--%s", cache, org, nm);
    snprintf(full, sizeof full, "%s/%s", org, nm);
    hub_info info;
    if (fetch_info(ep, tok, org, nm, rev, full, &info, err, err_len)) return -1;
    int rc = 0, n = 0;
    long long bytes = 0;
    for (int i = 0; i < info.n && rc == 0; i++) {
        const hub_file *f = &info.files[i];
        if (!o->all_files && !hub_wanted(f->path)) continue;
        rc = fetch_blob(ep, tok, org, nm, repo, locks, info.commit, f, full, o->quiet, err,
                        err_len) ||
             link_file(repo, info.commit, f, err, err_len);
        n++, bytes += f->size;
    }
    if (rc == 0 && n == 0) {
        snprintf(err, err_len, "%s: the hub lists no file lmhost reads at %s", full, rev);
        rc = -1;
    }
    if (rc == 0 && !hfc_is_commit(rev)) rc = write_ref(repo, rev, info.commit, err, err_len);
    if (rc == 0) {
        snprintf(dir, dir_cap, "%s/snapshots/%s", repo, info.commit);
        log_msg(2, "hub: %s@%s: %d files, %.1f MiB in %s", full, rev, n, bytes / 1048576.0, dir);
    }
    hub_info_free(&info);
    return rc ? -1 : 0;
}
