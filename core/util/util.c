#include "util.h"
#include "json_fix.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int util_err(char *err, size_t err_len, const char *fmt, ...) {
    if (err && err_len) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, err_len, fmt, ap);
        va_end(ap);
    }
    return -1;
}

char *util_path_join(const char *a, const char *b) {
    size_t la = strlen(a), lb = strlen(b);
    while (la > 1 && a[la - 1] == '/') la--;
    int slash = la > 0 && a[la - 1] != '/';
    char *p = malloc(la + (size_t)slash + lb + 1);
    if (!p) return NULL;
    memcpy(p, a, la);
    if (slash) p[la] = '/';
    memcpy(p + la + (size_t)slash, b, lb + 1);
    return p;
}

char *util_read_file(const char *path, size_t max_len, size_t *len, char *err, size_t err_len) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        util_err(err, err_len, "%s: cannot open: %s", path, strerror(errno));
        return NULL;
    }
    char *buf = NULL;
    struct stat st;
    if (fstat(fd, &st) != 0) {
        util_err(err, err_len, "%s: cannot stat: %s", path, strerror(errno));
        goto fail;
    }
    if (!S_ISREG(st.st_mode)) {
        util_err(err, err_len, "%s: not a regular file", path);
        goto fail;
    }
    if ((uint64_t)st.st_size > max_len) {
        util_err(err, err_len, "%s: %lld bytes is too large (limit %zu)", path,
                 (long long)st.st_size, max_len);
        goto fail;
    }
    size_t size = (size_t)st.st_size, got = 0;
    buf = malloc(size + 1);
    if (!buf) {
        util_err(err, err_len, "%s: out of memory", path);
        goto fail;
    }
    while (got < size) {
        ssize_t r = read(fd, buf + got, size - got);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) {
            util_err(err, err_len, "%s: read failed: %s", path, strerror(errno));
            goto fail;
        }
        if (r == 0) break; /* shrank while we read: take what is there */
        got += (size_t)r;
    }
    buf[got] = '\0';
    close(fd);
    if (len) *len = got;
    return buf;
fail:
    free(buf);
    close(fd);
    return NULL;
}

static int is_json_ws(char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

json_object *util_json_parse_object(const char *text, size_t len, size_t *end, char *err,
                                    size_t err_len) {
    if (len > INT_MAX) {
        util_err(err, err_len, "%zu bytes of JSON is too large", len);
        return NULL;
    }
    json_tokener *tok = json_tokener_new_ex(JSON_TOKENER_DEFAULT_DEPTH);
    if (!tok) {
        util_err(err, err_len, "out of memory");
        return NULL;
    }
    json_tokener_set_flags(tok, JSON_TOKENER_STRICT | JSON_TOKENER_VALIDATE_UTF8);
    /* escaped surrogate pairs as raw UTF-8 (json_fix.h); a rewrite shortens strings only, so
     * what follows the object keeps its length and *end maps back by the difference */
    size_t orig_len = len, fixed_n = 0;
    char *fixed = NULL;
    int rw = json_fix_surrogates(text, len, &fixed, &fixed_n);
    if (rw < 0) {
        json_tokener_free(tok);
        util_err(err, err_len, "out of memory");
        return NULL;
    }
    if (rw) {
        text = fixed;
        len = fixed_n;
    }
    json_object *o = json_tokener_parse_ex(tok, text, (int)len);
    enum json_tokener_error e = json_tokener_get_error(tok);
    size_t stop = json_tokener_get_parse_end(tok);
    if (e == json_tokener_continue && !o) {
        /* A bare literal ("null", "12") is only complete once json-c sees its end. */
        json_object *last = json_tokener_parse_ex(tok, "", 1);
        if (json_tokener_get_error(tok) == json_tokener_success) {
            o = last;
            e = json_tokener_success;
        }
    }
    json_tokener_free(tok);
    if (e == json_tokener_continue) {
        util_err(err, err_len, "not valid JSON: it ends early (after %zu bytes)", orig_len);
        goto fail;
    }
    if (e != json_tokener_success) {
        util_err(err, err_len, "not valid JSON: %s at byte %zu", json_tokener_error_desc(e), stop);
        goto fail;
    }
    if (!json_object_is_type(o, json_type_object)) {
        util_err(err, err_len, "not a JSON object");
        goto fail;
    }
    /* A NUL ends json-c's parse with success: whatever follows must still be whitespace. */
    for (size_t i = stop; i < len; i++)
        if (!is_json_ws(text[i])) {
            util_err(err, err_len,
                     "not valid JSON: unexpected byte 0x%02x after the object at byte %zu",
                     (unsigned char)text[i], i);
            goto fail;
        }
    if (end) *end = stop + (orig_len - len);
    free(fixed);
    return o;
fail:
    free(fixed);
    json_object_put(o);
    return NULL;
}

/* ---- duplicate keys ---------------------------------------------------------------- */

typedef struct {
    char *s; /* decoded key */
    size_t n;
} dkey;

typedef struct {
    const char *t;
    size_t n;
    json_tokener *tok;
    char path[512];
    size_t path_n;
    char *key;
    size_t key_len;
    int found; /* 1 duplicate, 2 NUL in a key, -1 out of memory */
    int depth;
} dscan;

static size_t ds_ws(const dscan *s, size_t i) {
    while (i < s->n && is_json_ws(s->t[i])) i++;
    return i;
}

/* json-c's strict mode still takes 'single-quoted' strings. */
static size_t ds_string(const dscan *s, size_t i) {
    char q = s->t[i++];
    while (i < s->n && s->t[i] != q) i += s->t[i] == '\\' ? 2 : 1;
    return i < s->n ? i + 1 : s->n;
}

static size_t ds_value(dscan *s, size_t i);

static void ds_path_push(dscan *s, const char *part, size_t n, size_t *saved) {
    *saved = s->path_n;
    size_t room = sizeof s->path - 1 - s->path_n;
    size_t dot = s->path_n > 0;
    if (dot + n > room) n = room > dot ? room - dot : 0;
    if (dot && room) s->path[s->path_n++] = '.';
    memcpy(s->path + s->path_n, part, n);
    s->path_n += n;
    s->path[s->path_n] = '\0';
}

static void ds_path_pop(dscan *s, size_t saved) {
    s->path_n = saved;
    s->path[saved] = '\0';
}

static int dkey_cmp(const void *a, const void *b) {
    const dkey *x = a, *y = b;
    size_t n = x->n < y->n ? x->n : y->n;
    int c = memcmp(x->s, y->s, n);
    return c ? c : (x->n > y->n) - (x->n < y->n);
}

static void ds_report(dscan *s, int what, const char *k, size_t n) {
    s->found = what;
    if (s->key && s->key_len) snprintf(s->key, s->key_len, "%.*s", (int)(n > 200 ? 200 : n), k);
}

static size_t ds_object(dscan *s, size_t i) {
    dkey *keys = NULL;
    size_t nk = 0, cap = 0;
    i++; /* '{' */
    for (;;) {
        i = ds_ws(s, i);
        if (i >= s->n || s->t[i] == '}' || (s->t[i] != '"' && s->t[i] != '\'')) break;
        size_t kend = ds_string(s, i);
        if (nk == cap) {
            cap = cap ? cap * 2 : 16;
            dkey *nkeys = realloc(keys, cap * sizeof *nkeys);
            if (!nkeys) {
                s->found = -1;
                break;
            }
            keys = nkeys;
        }
        json_tokener_reset(s->tok);
        json_object *ko = json_tokener_parse_ex(s->tok, s->t + i, (int)(kend - i));
        const char *ks = s->t + i + 1; /* raw bytes if json-c cannot decode it alone */
        size_t kn = kend - i >= 2 ? kend - i - 2 : 0;
        if (json_object_is_type(ko, json_type_string)) {
            ks = json_object_get_string(ko);
            kn = (size_t)json_object_get_string_len(ko);
        }
        keys[nk].s = malloc(kn + 1);
        if (!keys[nk].s) {
            json_object_put(ko);
            s->found = -1;
            break;
        }
        memcpy(keys[nk].s, ks, kn);
        keys[nk].s[kn] = '\0';
        keys[nk].n = kn;
        json_object_put(ko);
        if (memchr(keys[nk].s, '\0', kn)) {
            ds_report(s, 2, keys[nk].s, strlen(keys[nk].s));
            nk++;
            break;
        }
        nk++;
        i = ds_ws(s, kend);
        if (i >= s->n || s->t[i] != ':') break;
        size_t saved;
        ds_path_push(s, keys[nk - 1].s, keys[nk - 1].n, &saved);
        i = ds_value(s, i + 1);
        if (s->found) break;
        ds_path_pop(s, saved);
        i = ds_ws(s, i);
        if (i < s->n && s->t[i] == ',') i++;
    }
    if (!s->found && nk > 1) {
        qsort(keys, nk, sizeof *keys, dkey_cmp);
        for (size_t k = 1; k < nk && !s->found; k++)
            if (dkey_cmp(&keys[k - 1], &keys[k]) == 0) ds_report(s, 1, keys[k].s, keys[k].n);
    }
    for (size_t k = 0; k < nk; k++) free(keys[k].s);
    free(keys);
    if (i < s->n && s->t[i] == '}') i++;
    return i;
}

static size_t ds_array(dscan *s, size_t i) {
    i++; /* '[' */
    for (size_t idx = 0;; idx++) {
        i = ds_ws(s, i);
        if (i >= s->n || s->t[i] == ']') break;
        char part[24];
        size_t saved, before = i;
        int pn = snprintf(part, sizeof part, "%zu", idx);
        ds_path_push(s, part, (size_t)pn, &saved);
        i = ds_value(s, i);
        if (s->found) return s->n;
        ds_path_pop(s, saved);
        i = ds_ws(s, i);
        if (i < s->n && s->t[i] == ',') i++;
        if (i == before) break; /* no progress: not JSON we understand */
    }
    if (i < s->n && s->t[i] == ']') i++;
    return i;
}

static size_t ds_value(dscan *s, size_t i) {
    i = ds_ws(s, i);
    if (i >= s->n) return s->n;
    char c = s->t[i];
    if (c == '"' || c == '\'') return ds_string(s, i);
    if (c == '{' || c == '[') {
        if (s->depth >= 2 * JSON_TOKENER_DEFAULT_DEPTH) return s->n;
        s->depth++;
        i = c == '{' ? ds_object(s, i) : ds_array(s, i);
        s->depth--;
        return i;
    }
    while (i < s->n && !is_json_ws(s->t[i]) && !strchr(",]}", s->t[i])) i++;
    return i;
}

int util_json_find_dup_key(const char *text, size_t len, char *key, size_t key_len, char *path,
                           size_t path_len) {
    dscan s = {.t = text, .n = len, .key = key, .key_len = key_len};
    if (len > INT_MAX) return 0;
    s.tok = json_tokener_new_ex(JSON_TOKENER_DEFAULT_DEPTH);
    if (!s.tok) return -1;
    json_tokener_set_flags(s.tok, JSON_TOKENER_STRICT);
    ds_value(&s, 0);
    json_tokener_free(s.tok);
    if (s.found > 0 && path && path_len) snprintf(path, path_len, "%s", s.path);
    return s.found;
}

uint64_t util_mem_available(void) {
    FILE *f = fopen("/proc/meminfo", "r");
    char line[256];
    unsigned long long kb = 0;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1) break;
    if (f) fclose(f);
    if (kb) return (uint64_t)kb << 10;
    long pages = sysconf(_SC_AVPHYS_PAGES), size = sysconf(_SC_PAGESIZE);
    return pages > 0 && size > 0 ? (uint64_t)pages * (uint64_t)size : 0;
}
