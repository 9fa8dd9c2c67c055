#include "safetensors.h"
#include "util.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <json-c/json.h>

/* The reference implementation refuses larger headers too; a real one is a few MB. */
#define ST_MAX_HEADER 100000000u

/* Names longer than this are cut in messages. */
#define NAME_FMT "'%.200s'"

static const struct {
    const char *name;
    lmh_dtype dtype;
} supported[] = {
    {"F32", LMH_F32}, {"F16", LMH_F16}, {"BF16", LMH_BF16}, {"U32", LMH_U32},
    {"I32", LMH_I32}, {"U8", LMH_U8},   {"I8", LMH_I8},
};

/* safetensors dtypes we know but cannot load yet: refused as "unsupported", not "unknown". */
static const char *const known_other[] = {
    "F64",     "I64",     "U64",     "I16",     "U16",     "BOOL", "C64",
    "F8_E4M3", "F8_E5M2", "F8_E8M0", "F6_E2M3", "F6_E3M2", "F4",   "E8M0",
};

static int parse_dtype(const char *s, lmh_dtype *out, const char *tname, char *err,
                       size_t err_len) {
    for (size_t i = 0; i < sizeof supported / sizeof supported[0]; i++)
        if (strcmp(s, supported[i].name) == 0) {
            *out = supported[i].dtype;
            return 0;
        }
    for (size_t i = 0; i < sizeof known_other / sizeof known_other[0]; i++)
        if (strcmp(s, known_other[i]) == 0)
            return util_err(err, err_len,
                            "unsupported dtype %s in tensor " NAME_FMT
                            " (supported: F32 F16 BF16 U32 I32 U8 I8)",
                            s, tname);
    return util_err(err, err_len, "unknown dtype '%.40s' in tensor " NAME_FMT, s, tname);
}

static void shape_str(char *buf, size_t len, int32_t ndim, const int64_t *ne) {
    size_t o = (size_t)snprintf(buf, len, "[");
    for (int i = 0; i < ndim && o < len; i++)
        o += (size_t)snprintf(buf + o, len - o, "%s%" PRId64, i ? ", " : "", ne[i]);
    if (o < len) snprintf(buf + o, len - o, "]");
}

/* A JSON integer as uint64: -1 when negative, -2 when not an integer. json-c stores
 * integers above INT64_MAX as uint64 (clamped at UINT64_MAX), which get_uint64 returns. */
static int json_u64(json_object *v, uint64_t *out) {
    if (!json_object_is_type(v, json_type_int)) return -2;
    if (json_object_get_int64(v) < 0) return -1;
    *out = json_object_get_uint64(v);
    return 0;
}

static int parse_shape(json_object *e, st_tensor *t, char *err, size_t err_len) {
    json_object *shape;
    if (!json_object_object_get_ex(e, "shape", &shape) || !shape)
        return util_err(err, err_len, "tensor " NAME_FMT ": missing shape", t->name);
    if (!json_object_is_type(shape, json_type_array))
        return util_err(err, err_len, "tensor " NAME_FMT ": shape is not an array", t->name);
    size_t nd = json_object_array_length(shape);
    if (nd > LMH_MAX_DIMS)
        return util_err(err, err_len,
                        "tensor " NAME_FMT ": shape has %zu dims, at most %d are supported",
                        t->name, nd, LMH_MAX_DIMS);
    t->ndim = (int32_t)nd;
    for (int i = 0; i < LMH_MAX_DIMS; i++) t->ne[i] = 1; /* unused dims read as 1 */
    for (size_t i = 0; i < nd; i++) {
        uint64_t d;
        int rc = json_u64(json_object_array_get_idx(shape, i), &d);
        if (rc == -2)
            return util_err(err, err_len, "tensor " NAME_FMT ": dim %zu of shape is not an integer",
                            t->name, i);
        if (rc == -1)
            return util_err(err, err_len, "tensor " NAME_FMT ": dim %zu of shape is negative (%s)",
                            t->name, i,
                            json_object_to_json_string(json_object_array_get_idx(shape, i)));
        if (d > (uint64_t)INT64_MAX)
            return util_err(err, err_len,
                            "tensor " NAME_FMT ": dim %zu of shape (%" PRIu64 ") is too large",
                            t->name, i, d);
        t->ne[i] = (int64_t)d;
    }
    return 0;
}

/* Bytes the shape needs. The product of the non-zero dims must fit too, so that strides
 * computed from ne[] never overflow even when another dim is 0. */
static int shape_bytes(const st_tensor *t, uint64_t *out, char *err, size_t err_len) {
    uint64_t n = lmh_dtype_size(t->dtype);
    int zero = 0;
    for (int i = 0; i < t->ndim; i++) {
        if (t->ne[i] == 0)
            zero = 1;
        else if (util_mul_u64(n, (uint64_t)t->ne[i], &n) || n > (uint64_t)INT64_MAX) {
            char s[160];
            shape_str(s, sizeof s, t->ndim, t->ne);
            return util_err(err, err_len,
                            "tensor " NAME_FMT ": shape %s of %s overflows 63 bits of bytes",
                            t->name, s, lmh_dtype_name(t->dtype));
        }
    }
    *out = zero ? 0 : n;
    return 0;
}

static int parse_offsets(json_object *e, st_tensor *t, char *err, size_t err_len) {
    json_object *off;
    if (!json_object_object_get_ex(e, "data_offsets", &off) || !off)
        return util_err(err, err_len, "tensor " NAME_FMT ": missing data_offsets", t->name);
    if (!json_object_is_type(off, json_type_array) || json_object_array_length(off) != 2)
        return util_err(err, err_len,
                        "tensor " NAME_FMT ": data_offsets is not an array of two integers",
                        t->name);
    uint64_t v[2];
    for (size_t i = 0; i < 2; i++) {
        int rc = json_u64(json_object_array_get_idx(off, i), &v[i]);
        if (rc)
            return util_err(err, err_len, "tensor " NAME_FMT ": data_offsets[%zu] is %s", t->name,
                            i, rc == -1 ? "negative" : "not an integer");
    }
    t->begin = v[0];
    t->end = v[1];
    return 0;
}

static int parse_metadata(json_object *m, char *err, size_t err_len) {
    if (!json_object_is_type(m, json_type_object))
        return util_err(err, err_len, "__metadata__ is not an object");
    json_object_object_foreach(m, k, v) {
        if (!json_object_is_type(v, json_type_string))
            return util_err(err, err_len, "__metadata__ value of key '%.200s' is not a string", k);
    }
    return 0;
}

static int parse_entry(const char *name, json_object *e, st_tensor *t, uint64_t data_size,
                       uint64_t data_at, char *err, size_t err_len) {
    t->name = strdup(name);
    if (!t->name) return util_err(err, err_len, "out of memory");
    if (!json_object_is_type(e, json_type_object))
        return util_err(err, err_len, "tensor " NAME_FMT ": entry is not a JSON object", name);
    json_object *dt;
    if (!json_object_object_get_ex(e, "dtype", &dt) || !dt)
        return util_err(err, err_len, "tensor " NAME_FMT ": missing dtype", name);
    if (!json_object_is_type(dt, json_type_string))
        return util_err(err, err_len, "tensor " NAME_FMT ": dtype is not a string", name);
    if (parse_dtype(json_object_get_string(dt), &t->dtype, name, err, err_len)) return -1;
    if (parse_shape(e, t, err, err_len) || parse_offsets(e, t, err, err_len)) return -1;
    if (t->begin > t->end)
        return util_err(err, err_len,
                        "tensor " NAME_FMT ": data_offsets [%" PRIu64 ", %" PRIu64
                        "] begin after end",
                        name, t->begin, t->end);
    if (t->end > data_size)
        return util_err(err, err_len,
                        "tensor " NAME_FMT ": data_offsets [%" PRIu64 ", %" PRIu64
                        "] run past the data section (%" PRIu64 " bytes from file offset %" PRIu64
                        ")",
                        name, t->begin, t->end, data_size, data_at);
    uint64_t need = 0;
    if (shape_bytes(t, &need, err, err_len)) return -1;
    if (need != t->end - t->begin) {
        char s[160];
        shape_str(s, sizeof s, t->ndim, t->ne);
        return util_err(err, err_len,
                        "tensor " NAME_FMT ": shape %s of %s needs %" PRIu64
                        " bytes but data_offsets [%" PRIu64 ", %" PRIu64 "] span %" PRIu64 " bytes",
                        name, s, lmh_dtype_name(t->dtype), need, t->begin, t->end,
                        t->end - t->begin);
    }
    return 0;
}

static int cmp_begin(const void *a, const void *b) {
    const st_tensor *x = *(const st_tensor *const *)a, *y = *(const st_tensor *const *)b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    return (x->end > y->end) - (x->end < y->end);
}

/* Sorted by begin, non-empty spans are disjoint iff each starts at or after the end of the
 * one before. Empty spans (zero-size tensors) overlap nothing. */
static int check_overlap(const st_header *h, char *err, size_t err_len) {
    const st_tensor **v = malloc((size_t)h->n_tensors * sizeof *v + 1);
    if (!v) return util_err(err, err_len, "out of memory");
    int32_t n = 0;
    for (int32_t i = 0; i < h->n_tensors; i++)
        if (h->tensors[i].end > h->tensors[i].begin) v[n++] = &h->tensors[i];
    qsort(v, (size_t)n, sizeof *v, cmp_begin);
    int rc = 0;
    for (int32_t i = 1; i < n && !rc; i++)
        if (v[i]->begin < v[i - 1]->end)
            rc = util_err(err, err_len,
                          "tensors " NAME_FMT " [%" PRIu64 ", %" PRIu64 ") and " NAME_FMT
                          " [%" PRIu64 ", %" PRIu64 ") overlap",
                          v[i - 1]->name, v[i - 1]->begin, v[i - 1]->end, v[i]->name, v[i]->begin,
                          v[i]->end);
    free(v);
    return rc;
}

int st_parse(const uint8_t *file, size_t file_size, st_header *out, char *err, size_t err_len) {
    memset(out, 0, sizeof *out);
    if (file_size < 8)
        return util_err(err, err_len, "file is %zu bytes, too short for the 8-byte header length",
                        file_size);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = hlen << 8 | file[i]; /* little-endian u64 */
    if (hlen > ST_MAX_HEADER)
        return util_err(err, err_len, "header length %" PRIu64 " is absurd (limit %u bytes)", hlen,
                        ST_MAX_HEADER);
    if (hlen > file_size - 8)
        return util_err(err, err_len,
                        "header length %" PRIu64 " runs past the end of the file (%zu bytes "
                        "after the 8-byte length)",
                        hlen, file_size - 8);
    const char *text = (const char *)file + 8;
    uint64_t data_at = 8 + hlen, data_size = file_size - data_at;
    char jerr[256];
    size_t jend;
    /* Writers pad the header with spaces to align the data; util_json_parse_object takes
     * trailing whitespace and nothing else. */
    json_object *root = util_json_parse_object(text, (size_t)hlen, &jend, jerr, sizeof jerr);
    if (!root) return util_err(err, err_len, "header (bytes 8..%" PRIu64 ") is %s", data_at, jerr);

    int rc = -1;
    char key[256], path[256];
    int dup = util_json_find_dup_key(text, jend, key, sizeof key, path, sizeof path);
    if (dup < 0) {
        util_err(err, err_len, "out of memory");
        goto done;
    }
    if (dup) {
        if (!path[0])
            util_err(err, err_len,
                     dup == 1 ? "duplicate tensor name '%s' in the header"
                              : "tensor name '%s...' has a NUL character in it",
                     key);
        else
            util_err(err, err_len, "header: %s key '%s' in the entry of '%.200s'",
                     dup == 1 ? "duplicate" : "NUL character in", key, path);
        goto done;
    }

    int n = json_object_object_length(root);
    out->data_size = data_size;
    out->tensors = calloc((size_t)n + 1, sizeof *out->tensors);
    if (!out->tensors) {
        util_err(err, err_len, "out of memory");
        goto done;
    }
    json_object_object_foreach(root, name, e) {
        if (strcmp(name, "__metadata__") == 0) {
            if (parse_metadata(e, err, err_len)) goto done;
            continue;
        }
        st_tensor *t = &out->tensors[out->n_tensors++];
        if (parse_entry(name, e, t, data_size, data_at, err, err_len)) goto done;
    }
    rc = check_overlap(out, err, err_len);
done:
    json_object_put(root);
    if (rc) st_header_free(out);
    return rc;
}

void st_header_free(st_header *h) {
    if (!h) return;
    for (int32_t i = 0; i < h->n_tensors; i++) free(h->tensors[i].name);
    free(h->tensors);
    memset(h, 0, sizeof *h);
}

st_file *st_open(const char *path, char *err, size_t err_len) {
    char perr[768];
    st_file *f = calloc(1, sizeof *f);
    if (!f || !(f->path = strdup(path))) {
        free(f);
        util_err(err, err_len, "%s: out of memory", path);
        return NULL;
    }
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        util_err(err, err_len, "%s: cannot open: %s", path, strerror(errno));
        goto fail;
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        util_err(err, err_len, "%s: not a regular file", path);
        close(fd);
        goto fail;
    }
    if ((uint64_t)st.st_size > SIZE_MAX) {
        util_err(err, err_len, "%s: too large to map", path);
        close(fd);
        goto fail;
    }
    size_t size = (size_t)st.st_size;
    if (size > 0) { /* mmap refuses length 0; st_parse reports the short file */
        void *m = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (m == MAP_FAILED) {
            util_err(err, err_len, "%s: mmap failed: %s", path, strerror(errno));
            close(fd);
            goto fail;
        }
        f->map = m;
        f->map_size = size;
    }
    close(fd);
    static const uint8_t empty[1];
    const uint8_t *base = f->map ? f->map : empty;
    if (st_parse(base, size, &f->hdr, perr, sizeof perr)) {
        util_err(err, err_len, "%s: corrupt safetensors: %s", path, perr);
        goto fail;
    }
    /* The data section is the tail of the file; empty tensors point at (at most) its end. */
    const uint8_t *data = base + (size - f->hdr.data_size);
    for (int32_t i = 0; i < f->hdr.n_tensors; i++)
        f->hdr.tensors[i].data = data + f->hdr.tensors[i].begin;
    return f;
fail:
    st_close(f);
    return NULL;
}

void st_close(st_file *f) {
    if (!f) return;
    st_header_free(&f->hdr);
    if (f->map) munmap(f->map, f->map_size);
    free(f->path);
    free(f);
}
