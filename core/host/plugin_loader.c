/* Plugin discovery and loading. A plugin is refused (with a message naming the file)
 * when libltdl cannot open it, the entry symbol is missing, its ABI major differs or its
 * minor is newer than the host's, its info table is malformed, or its init fails; the
 * host goes on with the others. */
#include "plugin_loader.h"
#include "log.h"

#include <dirent.h>
#include <ltdl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const char *kind_name(lmh_plugin_kind k) {
    switch (k) {
    case LMH_KIND_ARCH:
        return "architecture";
    case LMH_KIND_BACKEND:
        return "backend";
    case LMH_KIND_CACHE:
        return "cache";
    case LMH_KIND_TOOLCALL:
        return "toolcall";
    }
    return "?";
}

static void refuse(registry *r, const char *file, const char *why) {
    log_msg(LMH_LOG_WARN, "plugin %s refused: %s", file, why);
    char *line = NULL;
    if (asprintf(&line, "%s: %s", file, why) < 0) return;
    char **n = realloc(r->refused, (size_t)(r->n_refused + 1) * sizeof *n);
    if (!n) {
        free(line);
        return;
    }
    r->refused = n;
    r->refused[r->n_refused++] = line;
}

/* The fixed part of the table must make sense before anything else is read. */
static int check_info(const lmh_plugin_info *in, char *why, size_t len) {
    if (in->abi_major != LMH_ABI_MAJOR)
        return errf(why, len, "plugin ABI %u.%u, host ABI %d.%d (major versions differ)",
                    in->abi_major, in->abi_minor, LMH_ABI_MAJOR, LMH_ABI_MINOR);
    /* A newer minor may rely on members this host lacks (an op it cannot run, a table
     * entry it never calls): refuse rather than run it half-way. */
    if (in->abi_minor > LMH_ABI_MINOR)
        return errf(why, len,
                    "built for plugin ABI %u.%u, newer than this host's %d.%d: update lmhost or "
                    "build the plugin against this host's headers",
                    in->abi_major, in->abi_minor, LMH_ABI_MAJOR, LMH_ABI_MINOR);
    if (in->size < offsetof(lmh_plugin_info, api) + sizeof(void *))
        return errf(why, len, "info table too small (%u bytes)", in->size);
    if (in->kind != LMH_KIND_ARCH && in->kind != LMH_KIND_BACKEND && in->kind != LMH_KIND_CACHE &&
        in->kind != LMH_KIND_TOOLCALL)
        return errf(why, len, "unknown plugin kind %d", (int)in->kind);
    if (in->kind == LMH_KIND_TOOLCALL && in->abi_minor < 13)
        return errf(why, len, "tool-call plugins came with plugin ABI 1.13; this one says %u.%u",
                    in->abi_major, in->abi_minor);
    if (!in->name || !in->name[0]) return errf(why, len, "plugin has no name");
    if (!in->api) return errf(why, len, "plugin has no %s table", kind_name(in->kind));
    const uint32_t tsize = *(const uint32_t *)in->api; /* every table starts with its size */
    size_t need = 0;
    switch (in->kind) {
    case LMH_KIND_ARCH: {
        const lmh_arch_api *a = in->api;
        need = offsetof(lmh_arch_api, unload) + sizeof(void *);
        if (tsize >= need && (!a->load || !a->forward || !a->unload || !a->model_types))
            return errf(why, len, "architecture table lacks load/forward/unload/model_types");
        break;
    }
    case LMH_KIND_BACKEND: {
        const lmh_backend_api *b = in->api;
        need = offsetof(lmh_backend_api, memory) + sizeof(void *);
        if (tsize >= need && (!b->create || !b->enqueue || !b->tensor_new || !b->download ||
                              !b->upload || !b->sync || !b->tensor_free || !b->tensor_view))
            return errf(why, len, "backend table lacks required functions");
        break;
    }
    case LMH_KIND_CACHE: {
        const lmh_cache_api *c = in->api;
        need = offsetof(lmh_cache_api, layer_rows) + sizeof(void *);
        if (tsize >= need && (!c->create || !c->append || !c->attend || !c->seq_add ||
                              !c->formats || !c->formats[0]))
            return errf(why, len, "cache table lacks required functions");
        break;
    }
    case LMH_KIND_TOOLCALL: {
        const lmh_toolcall_api *t = in->api;
        need = offsetof(lmh_toolcall_api, parser_free) + sizeof(void *);
        if (tsize >= need && (!t->formats || !t->formats[0] || !t->detect || !t->parser_new ||
                              !t->push || !t->finish || !t->parser_free))
            return errf(why, len, "toolcall table lacks required functions");
        break;
    }
    }
    if (tsize < need)
        return errf(why, len, "%s table too small (%u bytes, need %zu)", kind_name(in->kind), tsize,
                    need);
    return 0;
}

static void load_file(registry *r, const char *path) {
    for (int i = 0; i < r->n; i++)
        if (strcmp(r->items[i].file, path) == 0) return;

    lt_dladvise adv;
    lt_dladvise_init(&adv);
    lt_dladvise_local(&adv); /* plugins must not see each other's symbols */
    lt_dlhandle h = lt_dlopenadvise(path, adv);
    lt_dladvise_destroy(&adv);
    if (!h) {
        const char *e = lt_dlerror();
        refuse(r, path, e ? e : "cannot be opened");
        return;
    }
    lmh_plugin_entry_fn entry = (lmh_plugin_entry_fn)(uintptr_t)lt_dlsym(h, LMH_PLUGIN_ENTRY_NAME);
    if (!entry) {
        refuse(r, path, "missing entry symbol " LMH_PLUGIN_ENTRY_NAME);
        lt_dlclose(h);
        return;
    }
    const lmh_plugin_info *in = entry();
    char why[256];
    if (!in) {
        refuse(r, path, "entry returned no info table");
        lt_dlclose(h);
        return;
    }
    if (check_info(in, why, sizeof why)) {
        refuse(r, path, why);
        lt_dlclose(h);
        return;
    }
    if (registry_find(r, in->kind, in->name)) {
        log_msg(LMH_LOG_INFO, "plugin %s: %s '%s' already loaded from an earlier path; skipped",
                path, kind_name(in->kind), in->name);
        lt_dlclose(h);
        return;
    }
    if (in->init) {
        why[0] = 0;
        if (in->init(&host_api, why, sizeof why) != 0) {
            char msg[320];
            snprintf(msg, sizeof msg, "init failed: %s", why[0] ? why : "no reason given");
            refuse(r, path, msg);
            lt_dlclose(h);
            return;
        }
    }
    if (r->n == r->cap) {
        int cap = r->cap ? r->cap * 2 : 8;
        plugin *n = realloc(r->items, (size_t)cap * sizeof *n);
        if (!n) {
            lt_dlclose(h);
            return;
        }
        r->items = n;
        r->cap = cap;
    }
    /* The handle stays open for the life of the process: tables point into it. */
    r->items[r->n].info = in;
    r->items[r->n].file = strdup(path);
    r->n++;
    log_msg(LMH_LOG_DEBUG, "loaded %s plugin '%s' from %s", kind_name(in->kind), in->name, path);
}

static int is_plugin_name(const char *n) {
    size_t len = strlen(n);
    return strncmp(n, "lmhost-", 7) == 0 && len > 10 && strcmp(n + len - 3, ".so") == 0;
}

static int cmp_str(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Loads plugin files in dir, descending `depth` more levels (the build tree keeps each
 * plugin in its own folder). Files are taken in name order so results are repeatable. */
static void scan_dir(registry *r, const char *dir, int depth) {
    DIR *d = opendir(dir);
    if (!d) return;
    char **names = NULL;
    int n = 0, cap = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        if (n == cap) {
            cap = cap ? cap * 2 : 16;
            char **nn = realloc(names, (size_t)cap * sizeof *nn);
            if (!nn) break;
            names = nn;
        }
        names[n++] = strdup(e->d_name);
    }
    closedir(d);
    if (n > 1) qsort(names, (size_t)n, sizeof *names, cmp_str);
    for (int i = 0; i < n; i++) {
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        struct stat st;
        if (stat(path, &st) == 0) {
            if (S_ISDIR(st.st_mode) && depth > 0)
                scan_dir(r, path, depth - 1);
            else if (S_ISREG(st.st_mode) && is_plugin_name(names[i]))
                load_file(r, path);
        }
        free(names[i]);
    }
    free(names);
}

/* The build tree, when the running binary is in it: build/lmhost (backends/ beside it) or a
 * test program under the tree it was configured in. An installed binary does not look
 * there: it has the install prefix. */
static void scan_build_tree(registry *r) {
    char exe[4096];
    ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (len <= 0) return;
    exe[len] = 0;
    char *slash = strrchr(exe, '/');
    if (!slash) return;
    *slash = 0;
    char root[4096], probe[4200];
    snprintf(probe, sizeof probe, "%s/backends", exe);
    struct stat st;
    const size_t bl = strlen(LMHOST_BUILD_ROOT);
    if (stat(probe, &st) == 0 && S_ISDIR(st.st_mode))
        snprintf(root, sizeof root, "%s", exe);
    else if (strncmp(exe, LMHOST_BUILD_ROOT, bl) == 0 && (exe[bl] == '/' || exe[bl] == 0))
        snprintf(root, sizeof root, "%s", LMHOST_BUILD_ROOT);
    else
        return;
    static const char *const sub[] = {"backends", "plugins", "models", "examples/plugins"};
    for (size_t i = 0; i < sizeof sub / sizeof *sub; i++) {
        char dir[4200];
        snprintf(dir, sizeof dir, "%s/%s", root, sub[i]);
        scan_dir(r, dir, 1);
    }
}

int registry_load(registry *r, const char *extra_dir) {
    return registry_load_with(r, NULL, extra_dir);
}

int registry_load_with(registry *r, const char *first_file, const char *extra_dir) {
    memset(r, 0, sizeof *r);
    if (lt_dlinit() != 0) {
        log_msg(LMH_LOG_ERROR, "libltdl failed to initialise: %s", lt_dlerror());
        return -1;
    }
    if (first_file) load_file(r, first_file);
    if (extra_dir) {
        struct stat st;
        if (stat(extra_dir, &st) != 0 || !S_ISDIR(st.st_mode))
            log_msg(LMH_LOG_WARN, "--plugin-dir %s is not a directory", extra_dir);
        scan_dir(r, extra_dir, 1);
    }
    const char *env = getenv("LMHOST_PLUGIN_PATH");
    if (env && *env) {
        char *copy = strdup(env), *save = NULL;
        for (char *p = strtok_r(copy, ":", &save); p; p = strtok_r(NULL, ":", &save))
            scan_dir(r, p, 1);
        free(copy);
    }
    scan_build_tree(r);
    scan_dir(r, LMHOST_PLUGIN_LIBDIR, 0);
    return 0;
}

void registry_free(registry *r) {
    for (int i = 0; i < r->n; i++) free(r->items[i].file);
    for (int i = 0; i < r->n_refused; i++) free(r->refused[i]);
    free(r->items);
    free(r->refused);
    memset(r, 0, sizeof *r);
}

const plugin *registry_find(const registry *r, lmh_plugin_kind kind, const char *name) {
    for (int i = 0; i < r->n; i++)
        if (r->items[i].info->kind == kind && strcmp(r->items[i].info->name, name) == 0)
            return &r->items[i];
    return NULL;
}

int registry_backend_start(const registry *r, const char *spec, const lmh_backend_opts *o,
                           const plugin **p, lmh_backend **b, char *err, size_t err_len) {
    char name[64];
    const char *colon = strchr(spec, ':');
    size_t n = colon ? (size_t)(colon - spec) : strlen(spec);
    snprintf(name, sizeof name, "%.*s", (int)(n < sizeof name ? n : sizeof name - 1), spec);
    const char *params = colon && colon[1] ? colon + 1 : NULL;
    const plugin *bp = registry_find(r, LMH_KIND_BACKEND, name);
    if (p) *p = bp;
    *b = NULL;
    if (!bp) {
        char *names = registry_names(r, LMH_KIND_BACKEND, 0);
        errf(err, err_len, "unknown backend plugin '%s' (available: %s)", name,
             names && *names ? names : "none");
        free(names);
        return -1;
    }
    if (params && bp->info->abi_minor < 12)
        return errf(err, err_len,
                    "backend %s (built for plugin ABI %u.%u) takes no options ('%s'): "
                    "options came with ABI 1.12",
                    name, bp->info->abi_major, bp->info->abi_minor, params);
    lmh_backend_opts bo = *o;
    bo.size = sizeof bo;
    bo.params = params;
    const lmh_backend_api *api = bp->info->api;
    char berr[512] = "";
    if (api->create(&host_api, &bo, b, berr, sizeof berr) != 0 || !*b) {
        *b = NULL;
        return errf(err, err_len, "backend %s failed to start: %s", name,
                    berr[0] ? berr : "no reason");
    }
    return 0;
}

const plugin *registry_find_arch(const registry *r, const char *model_type) {
    for (int i = 0; i < r->n; i++) {
        if (r->items[i].info->kind != LMH_KIND_ARCH) continue;
        const lmh_arch_api *a = r->items[i].info->api;
        for (const char *const *t = a->model_types; *t; t++)
            if (strcmp(*t, model_type) == 0) return &r->items[i];
    }
    return NULL;
}

char *registry_names(const registry *r, lmh_plugin_kind kind, int model_types) {
    size_t cap = 256, len = 0;
    char *s = malloc(cap);
    if (!s) return NULL;
    s[0] = 0;
    for (int i = 0; i < r->n; i++) {
        if (r->items[i].info->kind != kind) continue;
        const char *one[] = {r->items[i].info->name, NULL};
        const char *const *names = one;
        if (model_types && kind == LMH_KIND_ARCH)
            names = ((const lmh_arch_api *)r->items[i].info->api)->model_types;
        for (; *names; names++) {
            size_t need = len + strlen(*names) + 3;
            if (need > cap) {
                cap = need * 2;
                char *n = realloc(s, cap);
                if (!n) return s;
                s = n;
            }
            len += (size_t)sprintf(s + len, "%s%s", len ? ", " : "", *names);
        }
    }
    return s;
}
