#include "model_dir.h"
#include "util.h"

#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define CONFIG_MAX (64u << 20) /* config.json is a few KB; refuse anything silly */
#define INDEX_MAX  (256u << 20)
#define INDEX_NAME "model.safetensors.index.json"

struct model_dir {
    char *dir;
    json_object *config;
    st_file **files;
    int32_t n_files;
    const st_tensor **tensors; /* load order: shard by shard, header order within */
    const st_tensor **by_name; /* sorted by name for bsearch */
    int32_t n;
    uint64_t weight_bytes;
};

json_object *md_parse_config(const char *text, size_t len, char *err, size_t err_len) {
    return util_json_parse_object(text, len, NULL, err, err_len);
}

const char *md_path(const model_dir *md) {
    return md->dir;
}
json_object *md_config(const model_dir *md) {
    return md->config;
}
int32_t md_count(const model_dir *md) {
    return md->n;
}
uint64_t md_weight_bytes(const model_dir *md) {
    return md->weight_bytes;
}

int md_locate(const model_dir *md, const st_tensor *t, const char **path, uint64_t *offset) {
    for (int32_t i = 0; md && t && t->data && i < md->n_files; i++) {
        const st_file *f = md->files[i];
        const uint8_t *m = f->map, *d = t->data;
        if (m && d >= m && d + (t->end - t->begin) <= m + f->map_size) {
            *path = f->path;
            *offset = (uint64_t)(d - m);
            return 0;
        }
    }
    return -1;
}

const st_tensor *md_at(const model_dir *md, int32_t i) {
    return i >= 0 && i < md->n ? md->tensors[i] : NULL;
}

static int cmp_name(const void *a, const void *b) {
    return strcmp((*(const st_tensor *const *)a)->name, (*(const st_tensor *const *)b)->name);
}

static int cmp_key(const void *key, const void *elem) {
    return strcmp(key, (*(const st_tensor *const *)elem)->name);
}

const st_tensor *md_find(const model_dir *md, const char *name) {
    if (!md || !name || !md->n) return NULL;
    const st_tensor *const *p =
        bsearch(name, md->by_name, (size_t)md->n, sizeof *md->by_name, cmp_key);
    return p ? *p : NULL;
}

/* Array index: digits only, no sign, below len. */
static int parse_index(const char *s, size_t n, size_t len, size_t *out) {
    if (n == 0 || n > 18) return -1;
    size_t v = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9') return -1;
        v = v * 10 + (size_t)(s[i] - '0');
    }
    if (v >= len) return -1;
    *out = v;
    return 0;
}

/* Each step takes the shortest run of dot-separated parts that names a key, so keys with
 * dots in them (per-module overrides such as "a.b.c": {...}) can be reached too. */
json_object *cfg_lookup(json_object *root, const char *path) {
    if (!root || !path) return NULL;
    json_object *cur = root;
    const char *p = path;
    char buf[256];
    while (*p) {
        const char *dot = strchr(p, '.');
        size_t n = dot ? (size_t)(dot - p) : strlen(p);
        if (n == 0) return NULL; /* "a..b", ".a", "a." */
        json_object *next = NULL;
        if (json_object_is_type(cur, json_type_array)) {
            size_t idx;
            if (parse_index(p, n, json_object_array_length(cur), &idx)) return NULL;
            next = json_object_array_get_idx(cur, idx);
        } else if (json_object_is_type(cur, json_type_object)) {
            for (;;) {
                if (n < sizeof buf) {
                    memcpy(buf, p, n);
                    buf[n] = '\0';
                    if (json_object_object_get_ex(cur, buf, &next)) break;
                }
                if (!p[n]) return NULL;
                dot = strchr(p + n + 1, '.');
                n = dot ? (size_t)(dot - p) : strlen(p);
            }
        } else {
            return NULL;
        }
        if (!next) return NULL; /* JSON null, or a null array element */
        cur = next;
        p += n;
        if (*p == '.') {
            p++;
            if (!*p) return NULL;
        }
    }
    return cur;
}

static int file_exists(const char *path) {
    return access(path, F_OK) == 0;
}

static int add_file(model_dir *md, const char *path, char *err, size_t err_len) {
    st_file **nf = realloc(md->files, ((size_t)md->n_files + 1) * sizeof *nf);
    if (!nf) return util_err(err, err_len, "out of memory");
    md->files = nf;
    st_file *f = st_open(path, err, err_len);
    if (!f) return -1;
    md->files[md->n_files++] = f;
    return 0;
}

/* A shard name from the index must be a plain file name inside the directory. */
static int bad_shard_name(const char *s) {
    return !*s || strchr(s, '/') || strcmp(s, ".") == 0 || strcmp(s, "..") == 0;
}

static int cmp_str(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

typedef struct {
    const char *name;
    int32_t file;
    const st_tensor *t;
} shard_entry;

static int cmp_entry(const void *a, const void *b) {
    const shard_entry *x = a, *y = b;
    int c = strcmp(x->name, y->name);
    return c ? c : (x->file > y->file) - (x->file < y->file);
}

/* The index names the tensors; each shard it names is mapped once and must hold the
 * tensors the index puts in it. Tensors a shard holds beyond those are ignored, as other
 * loaders do. */
static int open_sharded(model_dir *md, const char *index_path, char *err, size_t err_len) {
    char jerr[512], key[256], path[256];
    size_t len;
    int rc = -1;
    const char **uniq = NULL;
    shard_entry *all = NULL;
    char *text = util_read_file(index_path, INDEX_MAX, &len, err, err_len);
    if (!text) return -1;
    json_object *root = util_json_parse_object(text, len, NULL, jerr, sizeof jerr);
    if (!root) {
        util_err(err, err_len, "%s: %s", index_path, jerr);
        goto done;
    }
    int dup = util_json_find_dup_key(text, len, key, sizeof key, path, sizeof path);
    if (dup < 0) {
        util_err(err, err_len, "out of memory");
        goto done;
    }
    if (dup) {
        if (dup == 1 && strcmp(path, "weight_map") == 0)
            util_err(err, err_len, "%s: tensor '%s' is listed twice in weight_map", index_path,
                     key);
        else
            util_err(err, err_len, "%s: %s key '%s' in %s%s%s", index_path,
                     dup == 1 ? "duplicate" : "NUL character in", key,
                     path[0] ? "object '" : "the top-level object", path, path[0] ? "'" : "");
        goto done;
    }
    json_object *wm;
    if (!json_object_object_get_ex(root, "weight_map", &wm) ||
        !json_object_is_type(wm, json_type_object)) {
        util_err(err, err_len, "%s: no weight_map object", index_path);
        goto done;
    }
    int n = json_object_object_length(wm);
    if (n == 0) {
        util_err(err, err_len, "%s: weight_map is empty", index_path);
        goto done;
    }
    uniq = malloc((size_t)n * sizeof *uniq);
    md->tensors = calloc((size_t)n, sizeof *md->tensors);
    if (!uniq || !md->tensors) {
        util_err(err, err_len, "out of memory");
        goto done;
    }
    int nu = 0;
    json_object_object_foreach(wm, tname, v) {
        if (!json_object_is_type(v, json_type_string)) {
            util_err(err, err_len, "%s: weight_map value of '%.200s' is not a file name",
                     index_path, tname);
            goto done;
        }
        const char *s = json_object_get_string(v);
        if (bad_shard_name(s)) {
            util_err(err, err_len,
                     "%s: weight_map puts '%.200s' in '%.200s', which is not a file name "
                     "inside the model directory",
                     index_path, tname, s);
            goto done;
        }
        uniq[nu++] = s;
    }
    qsort(uniq, (size_t)nu, sizeof *uniq, cmp_str);
    int k = 0;
    for (int i = 0; i < nu; i++)
        if (k == 0 || strcmp(uniq[i], uniq[k - 1]) != 0) uniq[k++] = uniq[i];
    nu = k;
    size_t total = 0;
    for (int i = 0; i < nu; i++) {
        char *sp = util_path_join(md->dir, uniq[i]);
        if (!sp) {
            util_err(err, err_len, "out of memory");
            goto done;
        }
        int fail = add_file(md, sp, err, err_len);
        free(sp);
        if (fail) goto done;
        total += (size_t)md->files[i]->hdr.n_tensors;
    }
    /* Every shard tensor, sorted by (name, shard): one bsearch per index entry. */
    all = malloc((total + 1) * sizeof *all);
    if (!all) {
        util_err(err, err_len, "out of memory");
        goto done;
    }
    size_t na = 0;
    for (int32_t f = 0; f < md->n_files; f++)
        for (int32_t j = 0; j < md->files[f]->hdr.n_tensors; j++)
            all[na++] =
                (shard_entry){md->files[f]->hdr.tensors[j].name, f, &md->files[f]->hdr.tensors[j]};
    qsort(all, na, sizeof *all, cmp_entry);
    json_object_object_foreach(wm, name, sv) {
        const char *s = json_object_get_string(sv);
        const char **u = bsearch(&s, uniq, (size_t)nu, sizeof *uniq, cmp_str);
        if (!u) continue; /* cannot happen: uniq holds every value */
        shard_entry want = {name, (int32_t)(u - uniq), NULL};
        const shard_entry *got = bsearch(&want, all, na, sizeof *all, cmp_entry);
        if (!got) {
            util_err(err, err_len, "%s: tensor '%.200s' is not in %s, where %s says it is", md->dir,
                     name, s, INDEX_NAME);
            goto done;
        }
        md->tensors[md->n++] = got->t;
    }
    rc = 0;
done:
    free(all);
    free(uniq);
    json_object_put(root);
    free(text);
    return rc;
}

static int has_suffix(const char *s, const char *suf) {
    size_t n = strlen(s), m = strlen(suf);
    return n > m && strcmp(s + n - m, suf) == 0;
}

/* No model.safetensors and no index: accept a lone *.safetensors file. */
static int open_lone(model_dir *md, char *err, size_t err_len) {
    DIR *d = opendir(md->dir);
    if (!d)
        return util_err(err, err_len, "%s: cannot open directory: %s", md->dir, strerror(errno));
    char *found = NULL;
    int count = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        if (!has_suffix(de->d_name, ".safetensors")) continue;
        if (!count++) found = strdup(de->d_name);
    }
    closedir(d);
    int rc;
    if (count == 0)
        rc = util_err(err, err_len, "%s: no model.safetensors, %s or other *.safetensors file",
                      md->dir, INDEX_NAME);
    else if (count > 1)
        rc = util_err(err, err_len,
                      "%s: %d *.safetensors files but no %s to say which tensors each holds",
                      md->dir, count, INDEX_NAME);
    else if (!found)
        rc = util_err(err, err_len, "out of memory");
    else {
        char *p = util_path_join(md->dir, found);
        rc = p ? add_file(md, p, err, err_len) : util_err(err, err_len, "out of memory");
        free(p);
    }
    free(found);
    return rc;
}

static int take_all(model_dir *md, char *err, size_t err_len) {
    const st_header *h = &md->files[0]->hdr;
    md->tensors = calloc((size_t)h->n_tensors + 1, sizeof *md->tensors);
    if (!md->tensors) return util_err(err, err_len, "out of memory");
    for (int32_t i = 0; i < h->n_tensors; i++) md->tensors[md->n++] = &h->tensors[i];
    return 0;
}

static int open_weights(model_dir *md, char *err, size_t err_len) {
    char *single = util_path_join(md->dir, "model.safetensors");
    char *index = util_path_join(md->dir, INDEX_NAME);
    int rc;
    if (!single || !index)
        rc = util_err(err, err_len, "out of memory");
    else if (file_exists(single))
        rc = add_file(md, single, err, err_len) || take_all(md, err, err_len) ? -1 : 0;
    else if (file_exists(index))
        rc = open_sharded(md, index, err, err_len);
    else
        rc = open_lone(md, err, err_len) || take_all(md, err, err_len) ? -1 : 0;
    free(single);
    free(index);
    return rc;
}

model_dir *md_open(const char *dir, char *err, size_t err_len) {
    model_dir *md = calloc(1, sizeof *md);
    char *cpath = NULL, *text = NULL;
    if (!md || !(md->dir = strdup(dir))) goto oom;
    if (!(cpath = util_path_join(dir, "config.json"))) goto oom;
    size_t len;
    if (!(text = util_read_file(cpath, CONFIG_MAX, &len, err, err_len))) goto fail;
    char jerr[512];
    md->config = md_parse_config(text, len, jerr, sizeof jerr);
    if (!md->config) {
        util_err(err, err_len, "%s: %s", cpath, jerr);
        goto fail;
    }
    if (open_weights(md, err, err_len)) goto fail;
    md->by_name = malloc(((size_t)md->n + 1) * sizeof *md->by_name);
    if (!md->by_name) goto oom;
    for (int32_t i = 0; i < md->n; i++) {
        md->by_name[i] = md->tensors[i];
        md->weight_bytes += md->tensors[i]->end - md->tensors[i]->begin;
    }
    qsort(md->by_name, (size_t)md->n, sizeof *md->by_name, cmp_name);
    free(cpath);
    free(text);
    return md;
oom:
    util_err(err, err_len, "out of memory opening %s", dir);
fail:
    free(cpath);
    free(text);
    md_close(md);
    return NULL;
}

void md_close(model_dir *md) {
    if (!md) return;
    for (int32_t i = 0; i < md->n_files; i++) st_close(md->files[i]);
    free(md->files);
    free(md->tensors);
    free(md->by_name);
    json_object_put(md->config);
    free(md->dir);
    free(md);
}

/* ---- sentence-transformers pooling ---------------------------------------------------- */

#define ST_FILE_MAX (1u << 20) /* modules.json and a pooling config are a few hundred bytes */

/* PATH as one strict JSON document of any type (modules.json is an array), checked for
 * keys json-c would merge. NULL with err set ("PATH: why"). */
static json_object *read_json_doc(const char *path, char *err, size_t err_len) {
    size_t len;
    char *text = util_read_file(path, ST_FILE_MAX, &len, err, err_len);
    if (!text) return NULL;
    json_object *o = NULL;
    json_tokener *tok = len <= INT32_MAX ? json_tokener_new() : NULL;
    if (!tok) {
        util_err(err, err_len, "%s: out of memory", path);
        goto fail;
    }
    json_tokener_set_flags(tok, JSON_TOKENER_STRICT | JSON_TOKENER_VALIDATE_UTF8);
    o = json_tokener_parse_ex(tok, text, (int)len);
    enum json_tokener_error je = json_tokener_get_error(tok);
    size_t stop = json_tokener_get_parse_end(tok);
    json_tokener_free(tok);
    if (je != json_tokener_success || !o) {
        if (je == json_tokener_success)
            util_err(err, err_len, "%s: null where a JSON value was expected", path);
        else if (je == json_tokener_continue)
            util_err(err, err_len, "%s: not valid JSON: it ends early (after %zu bytes)", path,
                     len);
        else
            util_err(err, err_len, "%s: not valid JSON: %s at byte %zu", path,
                     json_tokener_error_desc(je), stop);
        goto fail;
    }
    /* json-c stops at a NUL too: only whitespace may follow the value */
    for (size_t i = stop; i < len; i++)
        if (!strchr(" \t\r\n", text[i]) || !text[i]) {
            util_err(err, err_len, "%s: not valid JSON: unexpected byte 0x%02x at byte %zu", path,
                     (unsigned char)text[i], i);
            goto fail;
        }
    char key[128], where[256];
    int dup = util_json_find_dup_key(text, len, key, sizeof key, where, sizeof where);
    if (dup) {
        if (dup < 0)
            util_err(err, err_len, "%s: out of memory", path);
        else
            util_err(err, err_len, "%s: %s key '%s'", path,
                     dup == 1 ? "duplicate" : "NUL character in", key);
        goto fail;
    }
    free(text);
    return o;
fail:
    json_object_put(o);
    free(text);
    return NULL;
}

/* A module folder named by modules.json: relative, inside the model directory. */
static int bad_module_path(const char *p) {
    if (!*p || *p == '/' || strlen(p) > 255) return 1;
    for (const char *s = p; *s;) {
        size_t n = strcspn(s, "/");
        if (n == 2 && s[0] == '.' && s[1] == '.') return 1;
        s += n + (s[n] == '/');
    }
    return 0;
}

/* The pooling config at PATH: exactly one supported mode on. */
static int read_pooling_config(const char *path, int *pooling, int64_t *dim, char *err,
                               size_t err_len) {
    static const struct {
        const char *key;
        int mode; /* MD_POOL_NONE: a mode sentence-transformers has and the host does not */
    } modes[] = {{"pooling_mode_mean_tokens", MD_POOL_MEAN},
                 {"pooling_mode_lasttoken", MD_POOL_LAST},
                 {"pooling_mode_cls_token", MD_POOL_CLS},
                 {"pooling_mode_max_tokens", MD_POOL_NONE},
                 {"pooling_mode_mean_sqrt_len_tokens", MD_POOL_NONE},
                 {"pooling_mode_weightedmean_tokens", MD_POOL_NONE}};
    json_object *cfg = read_json_doc(path, err, err_len);
    if (!cfg) return -1;
    int rc = -1, n_on = 0;
    const char *on[2] = {NULL, NULL};
    if (!json_object_is_type(cfg, json_type_object)) {
        util_err(err, err_len, "%s: not a JSON object", path);
        goto done;
    }
    for (size_t i = 0; i < sizeof modes / sizeof *modes; i++) {
        json_object *v;
        if (!json_object_object_get_ex(cfg, modes[i].key, &v)) continue;
        if (!json_object_is_type(v, json_type_boolean)) {
            util_err(err, err_len, "%s: %s must be true or false", path, modes[i].key);
            goto done;
        }
        if (!json_object_get_boolean(v)) continue;
        if (modes[i].mode == MD_POOL_NONE) {
            util_err(err, err_len,
                     "%s: %s is not supported (lmhost pools by the mean, the last token or the "
                     "first token)",
                     path, modes[i].key);
            goto done;
        }
        if (n_on < 2) on[n_on] = modes[i].key;
        n_on++;
        *pooling = modes[i].mode;
    }
    if (n_on == 0) {
        util_err(err, err_len,
                 "%s: no pooling mode is on (one of pooling_mode_mean_tokens, "
                 "pooling_mode_lasttoken or pooling_mode_cls_token must be true)",
                 path);
        goto done;
    }
    if (n_on > 1) {
        util_err(err, err_len,
                 "%s: %s and %s are both on; sentence-transformers concatenates such poolings, "
                 "which lmhost does not",
                 path, on[0], on[1]);
        goto done;
    }
    json_object *d;
    if (json_object_object_get_ex(cfg, "word_embedding_dimension", &d)) {
        int64_t x = json_object_is_type(d, json_type_int) ? json_object_get_int64(d) : 0;
        if (x <= 0 || x > INT32_MAX) {
            util_err(err, err_len, "%s: word_embedding_dimension must be a positive integer", path);
            goto done;
        }
        *dim = x;
    }
    rc = 0;
done:
    if (rc) *pooling = MD_POOL_NONE;
    json_object_put(cfg);
    return rc;
}

int md_read_pooling(const char *dir, int *pooling, int64_t *dim, char *err, size_t err_len) {
    *pooling = MD_POOL_NONE;
    *dim = 0;
    char *mpath = util_path_join(dir, "modules.json"), *pdir = NULL, *ppath = NULL;
    json_object *mods = NULL;
    int rc = -1;
    if (!mpath) goto oom;
    if (!file_exists(mpath)) {
        /* no module list: the usual folder of a Pooling module, if there is one */
        if (!(ppath = util_path_join(dir, "1_Pooling/config.json"))) goto oom;
        rc = file_exists(ppath) ? read_pooling_config(ppath, pooling, dim, err, err_len) : 0;
        goto done;
    }
    if (!(mods = read_json_doc(mpath, err, err_len))) goto done;
    if (!json_object_is_type(mods, json_type_array)) {
        util_err(err, err_len, "%s: not a JSON array of modules", mpath);
        goto done;
    }
    const char *pool = NULL;
    for (size_t i = 0; i < json_object_array_length(mods); i++) {
        json_object *m = json_object_array_get_idx(mods, i), *t, *p;
        if (!m || !json_object_is_type(m, json_type_object) ||
            !json_object_object_get_ex(m, "type", &t) ||
            !json_object_is_type(t, json_type_string)) {
            util_err(err, err_len, "%s: module %zu is not an object with a \"type\" string", mpath,
                     i);
            goto done;
        }
        const char *type = json_object_get_string(t), *dot = strrchr(type, '.');
        const char *cls = dot ? dot + 1 : type;
        if (strcmp(cls, "Transformer") == 0 || strcmp(cls, "Normalize") == 0)
            continue; /* the model itself; every embedding is L2-normalized anyway */
        if (strcmp(cls, "Pooling") != 0) {
            /* a Dense projection or anything else would change the vectors */
            util_err(err, err_len,
                     "%s: module %zu (%s) is not supported: lmhost embeds with the transformer, "
                     "its pooling and normalization alone",
                     mpath, i, type);
            goto done;
        }
        if (pool) {
            util_err(err, err_len, "%s: two Pooling modules", mpath);
            goto done;
        }
        if (!json_object_object_get_ex(m, "path", &p) ||
            !json_object_is_type(p, json_type_string) ||
            bad_module_path(json_object_get_string(p))) {
            util_err(err, err_len,
                     "%s: module %zu (Pooling) needs a \"path\": a folder inside the model "
                     "directory",
                     mpath, i);
            goto done;
        }
        pool = json_object_get_string(p);
    }
    if (!pool) {
        rc = 0; /* no pooling named: the caller's default */
        goto done;
    }
    if (!(pdir = util_path_join(dir, pool)) || !(ppath = util_path_join(pdir, "config.json")))
        goto oom;
    if (!file_exists(ppath)) {
        util_err(err, err_len, "%s names a Pooling module in %s, which has no config.json", mpath,
                 pool);
        goto done;
    }
    rc = read_pooling_config(ppath, pooling, dim, err, err_len);
    goto done;
oom:
    util_err(err, err_len, "out of memory reading %s's pooling", dir);
done:
    json_object_put(mods);
    free(mpath);
    free(pdir);
    free(ppath);
    return rc;
}
