#include "hf_cache.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

static int name_char(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
           c == '_' || c == '.';
}

/* One path component of a name: 1..96 name characters, not "." or "..". */
static int part_ok(const char *s, size_t n) {
    if (n == 0 || n > 96 || (n == 1 && s[0] == '.') || (n == 2 && s[0] == '.' && s[1] == '.'))
        return 0;
    for (size_t i = 0; i < n; i++)
        if (!name_char(s[i])) return 0;
    return 1;
}

int hfc_split(const char *s, char *org, char *name, char *rev) {
    const char *slash = strchr(s, '/'), *at = strchr(s, '@');
    if (!slash || strchr(slash + 1, '/') || (at && at < slash)) return 0;
    size_t no = (size_t)(slash - s), nn = at ? (size_t)(at - slash - 1) : strlen(slash + 1);
    if (!part_ok(s, no) || !part_ok(slash + 1, nn)) return 0;
    const char *r = at ? at + 1 : "main";
    size_t nr = strlen(r);
    if (nr == 0 || nr > 128 || strstr(r, "..")) return 0;
    for (size_t i = 0; i < nr; i++)
        if (!name_char(r[i]) && r[i] != '/') return 0;
    memcpy(org, s, no), org[no] = 0;
    memcpy(name, slash + 1, nn), name[nn] = 0;
    memcpy(rev, r, nr + 1);
    return 1;
}

int hfc_is_name(const char *s) {
    char o[97], n[97], r[129];
    struct stat st;
    return s && hfc_split(s, o, n, r) && stat(s, &st) != 0;
}

void hfc_cache_dir(char *out, size_t cap) {
    const char *c = getenv("HF_HUB_CACHE"), *h = getenv("HF_HOME"), *home = getenv("HOME");
    if (c && *c)
        snprintf(out, cap, "%s", c);
    else if (h && *h)
        snprintf(out, cap, "%s/hub", h);
    else
        snprintf(out, cap, "%s/.cache/huggingface/hub", home && *home ? home : ".");
}

int hfc_is_commit(const char *r) {
    if (strlen(r) != 40) return 0;
    for (int i = 0; i < 40; i++)
        if (!((r[i] >= '0' && r[i] <= '9') || (r[i] >= 'a' && r[i] <= 'f'))) return 0;
    return 1;
}

/* The commit refs/REV holds, into commit[41]; 0 or -1. */
static int read_ref(const char *repo, const char *rev, char *commit) {
    char p[4096];
    snprintf(p, sizeof p, "%s/refs/%s", repo, rev);
    FILE *f = fopen(p, "r");
    if (!f) return -1;
    char buf[64] = "";
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    buf[strcspn(buf, " \r\n")] = 0;
    if (!hfc_is_commit(buf)) return -1;
    memcpy(commit, buf, 41);
    return 0;
}

int hfc_resolve(const char *s, char *out, size_t cap, char *err, size_t err_len) {
    char org[97], name[97], rev[129], cache[2048], repo[4096], commit[41];
    if (!hfc_split(s, org, name, rev)) {
        snprintf(err, err_len, "'%s' is neither a directory nor a model name ORG/NAME[@REVISION]",
                 s);
        return -1;
    }
    hfc_cache_dir(cache, sizeof cache);
    snprintf(repo, sizeof repo, "%s/models--%s--%s", cache, org, name);
    struct stat st;
    if (stat(repo, &st) != 0) {
        snprintf(err, err_len, "%s/%s is not in the Hugging Face cache (%s)", org, name, cache);
        return -1;
    }
    if (hfc_is_commit(rev))
        memcpy(commit, rev, 41);
    else if (read_ref(repo, rev, commit)) {
        snprintf(err, err_len, "%s/%s: revision '%s' is not in the cache (no %s/refs/%s)", org,
                 name, rev, repo, rev);
        return -1;
    }
    snprintf(out, cap, "%s/snapshots/%s", repo, commit);
    char cfg[4200];
    snprintf(cfg, sizeof cfg, "%s/config.json", out);
    if (stat(cfg, &st) != 0) {
        snprintf(err, err_len, "%s/%s@%s: the cached snapshot %s has no config.json", org, name,
                 rev, out);
        return -1;
    }
    return 0;
}

static unsigned long long dir_bytes(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return 0;
    unsigned long long total = 0;
    struct dirent *e;
    char p[4200];
    struct stat st;
    while ((e = readdir(d))) {
        if (snprintf(p, sizeof p, "%s/%s", dir, e->d_name) >= (int)sizeof p) continue;
        if (e->d_name[0] != '.' && lstat(p, &st) == 0 && S_ISREG(st.st_mode))
            total += (unsigned long long)st.st_size;
    }
    closedir(d);
    return total;
}

/* The newest snapshot of repo into commit[41]; 0 or -1. */
static int newest_snapshot(const char *repo, char *commit) {
    char p[4200];
    snprintf(p, sizeof p, "%s/snapshots", repo);
    DIR *d = opendir(p);
    if (!d) return -1;
    time_t best = 0;
    int found = -1;
    struct dirent *e;
    struct stat st;
    char q[4400];
    while ((e = readdir(d))) {
        if (snprintf(q, sizeof q, "%s/%s", p, e->d_name) >= (int)sizeof q) continue;
        if (hfc_is_commit(e->d_name) && stat(q, &st) == 0 && (found || st.st_mtime > best)) {
            best = st.st_mtime;
            memcpy(commit, e->d_name, 41);
            found = 0;
        }
    }
    closedir(d);
    return found;
}

static int by_name(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

int hfc_list(hfc_list_fn fn, void *ctx) {
    char cache[2048];
    hfc_cache_dir(cache, sizeof cache);
    DIR *d = opendir(cache);
    if (!d) return 0;
    char **names = NULL;
    size_t n = 0, cap = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (strncmp(e->d_name, "models--", 8) != 0) continue;
        if (n == cap) {
            cap = cap ? 2 * cap : 16;
            char **grown = realloc(names, cap * sizeof *names);
            if (!grown) break;
            names = grown;
        }
        if (!(names[n] = strdup(e->d_name))) break;
        n++;
    }
    closedir(d);
    if (n) qsort(names, n, sizeof *names, by_name);
    for (size_t i = 0; i < n; i++) {
        /* models--ORG--NAME: the first "--" after the prefix ends ORG (names hold no "--"
         * in ORG; NAME may) */
        char name[256], repo[4096], blobs[4200], commit[41] = "", dir[4300], cfg[4400];
        const char *o = names[i] + 8, *sep = strstr(o, "--");
        if (!sep) continue;
        snprintf(name, sizeof name, "%.*s/%s", (int)(sep - o), o, sep + 2);
        snprintf(repo, sizeof repo, "%s/%s", cache, names[i]);
        snprintf(blobs, sizeof blobs, "%s/blobs", repo);
        if (read_ref(repo, "main", commit) && newest_snapshot(repo, commit)) commit[0] = 0;
        snprintf(dir, sizeof dir, "%s/snapshots/%s", repo, commit);
        snprintf(cfg, sizeof cfg, "%s/config.json", dir);
        struct stat st;
        fn(ctx, name, commit[0] ? commit : "-", commit[0] ? dir : "-",
           commit[0] && stat(cfg, &st) == 0, dir_bytes(blobs));
    }
    for (size_t i = 0; i < n; i++) free(names[i]);
    free(names);
    return (int)n;
}
