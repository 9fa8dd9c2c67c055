/* Model-directory reader: malformed safetensors files, config.json and sharded indexes,
 * each built here in a temporary directory (no binary fixtures), must fail with a message
 * that says what and where; good files must load with the right shapes and bytes. */
#include "model_dir.h"
#include "safetensors.h"

#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static int n_ok, n_fail;
static char tmp[256];

static void check(int cond, const char *what, const char *detail) {
    if (cond) {
        n_ok++;
    } else {
        n_fail++;
        printf("FAIL %s%s%s\n", what, detail ? ": " : "", detail ? detail : "");
    }
}

static char *fmt(const char *f, ...) __attribute__((format(printf, 1, 2)));
static char *fmt(const char *f, ...) {
    static char bufs[8][4096];
    static int k;
    char *b = bufs[k++ % 8];
    va_list ap;
    va_start(ap, f);
    vsnprintf(b, sizeof bufs[0], f, ap);
    va_end(ap);
    return b;
}

static uint8_t pattern(uint64_t i) {
    return (uint8_t)(i * 7 + 3);
}

static void write_raw(const char *path, const void *p, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(p, 1, n, f) != n || fclose(f) != 0) {
        perror(path);
        exit(2);
    }
}

static void write_text(const char *path, const char *s) {
    write_raw(path, s, strlen(s));
}

/* A safetensors image: 8-byte length, header padded with `pad` spaces, data_len bytes. */
static uint8_t *st_image(const char *header, size_t pad, uint64_t data_len, size_t *size) {
    size_t hl = strlen(header) + pad;
    *size = 8 + hl + data_len;
    uint8_t *b = malloc(*size);
    if (!b) exit(2);
    for (int i = 0; i < 8; i++) b[i] = (uint8_t)((uint64_t)hl >> (8 * i));
    memcpy(b + 8, header, strlen(header));
    memset(b + 8 + strlen(header), ' ', pad);
    for (uint64_t i = 0; i < data_len; i++) b[8 + hl + i] = pattern(i);
    return b;
}

static void write_st(const char *path, const char *header, uint64_t data_len) {
    size_t n;
    uint8_t *b = st_image(header, 0, data_len, &n);
    write_raw(path, b, n);
    free(b);
}

static void rm_rf(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *de;
    while ((de = readdir(d))) {
        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..")) continue;
        char p[512];
        snprintf(p, sizeof p, "%s/%s", dir, de->d_name);
        struct stat st;
        if (lstat(p, &st) == 0 && S_ISDIR(st.st_mode))
            rm_rf(p);
        else
            unlink(p);
    }
    closedir(d);
    rmdir(dir);
}

/* A fresh model directory under tmp with a valid config.json. */
static const char *new_dir(const char *name) {
    char *d = fmt("%s/%s", tmp, name);
    rm_rf(d);
    if (mkdir(d, 0755) != 0) {
        perror(d);
        exit(2);
    }
    write_text(fmt("%s/config.json", d), "{\"model_type\": \"test\", \"hidden_size\": 8}");
    return d;
}

/* Both the pure parser and st_open on a file must refuse the image with `want` in the
 * message, and st_open's message must name the file. */
static void expect_image_fail(const char *name, const uint8_t *img, size_t n, const char *want) {
    char err[1024] = "";
    st_header h;
    int rc = st_parse(img, n, &h, err, sizeof err);
    check(rc != 0 && strstr(err, want) != NULL, fmt("st_parse %s", name),
          fmt("rc %d, message '%s', expected '%s'", rc, err, want));
    if (rc == 0) st_header_free(&h);
    char *path = fmt("%s/%s.safetensors", tmp, name);
    write_raw(path, img, n);
    err[0] = '\0';
    st_file *f = st_open(path, err, sizeof err);
    check(!f && strstr(err, want) && strstr(err, path), fmt("st_open %s", name),
          fmt("message '%s', expected '%s' and the path", err, want));
    st_close(f);
    unlink(path);
    if (getenv("VERBOSE")) printf("ok   %-28s %s\n", name, err);
}

static void expect_fail(const char *name, const char *header, uint64_t data_len, const char *want) {
    size_t n;
    uint8_t *b = st_image(header, 0, data_len, &n);
    expect_image_fail(name, b, n, want);
    free(b);
}

static void expect_md_fail(const char *name, const char *dir, const char *want) {
    char err[1024] = "";
    model_dir *md = md_open(dir, err, sizeof err);
    check(!md && strstr(err, want) != NULL, fmt("md_open %s", name),
          fmt("message '%s', expected '%s'", err, want));
    md_close(md);
    if (getenv("VERBOSE")) printf("ok   %-28s %s\n", name, err);
}

/* One F32 tensor "a" of shape [2] at [0, 8) plus the given extra fields. */
#define T_A "\"a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]}"

static void header_cases(void) {
    uint8_t small[8] = {1, 0, 0, 0, 0, 0, 0, 0};
    expect_image_fail("empty-file", small, 0, "0 bytes, too short");
    expect_image_fail("five-bytes", small, 5, "5 bytes, too short");
    expect_image_fail("length-only", small, 8, "runs past the end of the file");

    uint8_t past[16] = {0xff, 0xff, 0xff, 0, 0, 0, 0, 0, '{', '}'};
    expect_image_fail("header-past-eof", past, 10, "header length 16777215 runs past the end");
    uint8_t past2[16] = {100, 0, 0, 0, 0, 0, 0, 0, '{', '}'};
    expect_image_fail("header-past-eof2", past2, 10, "header length 100 runs past the end");
    uint8_t huge[16] = {0, 0, 0, 0, 0, 0, 0, 0x80, '{', '}'};
    expect_image_fail("header-huge", huge, 10, "absurd");

    expect_fail("not-json", "{not json at all", 0, "not valid JSON");
    expect_fail("json-cut", "{\"a\": {\"dtype\": ", 0, "not valid JSON: it ends early");
    expect_fail("empty-header", "", 0, "not valid JSON");
    expect_fail("header-array", "[1, 2]", 0, "not a JSON object");
    expect_fail("header-null", "null", 0, "not a JSON object");
    expect_fail("header-number", "12", 0, "not a JSON object");
    expect_fail("header-true-x", "truex", 0, "not valid JSON");
    expect_fail("header-string", "\"x\"", 0, "not a JSON object");
    expect_fail("trailing-garbage", "{} x", 0, "not valid JSON: unexpected character at byte 3");
    expect_fail("two-objects", "{}{}", 0, "not valid JSON");
    expect_fail("comment", "{/* c */}", 0, "not valid JSON");
    expect_fail("trailing-comma", "{" T_A ",}", 8, "not valid JSON");
    expect_fail("bad-utf8", "{\"a\xff\": 1}", 0, "not valid JSON");
    char deep[200] = "";
    for (int i = 0; i < 40; i++) strcat(deep, "[");
    expect_fail("too-deep", fmt("{\"a\": %s}", deep), 0, "not valid JSON");
    {
        size_t n;
        uint8_t *b = st_image("{}", 0, 0, &n);
        uint8_t *c = malloc(n + 2);
        memcpy(c, b, n);
        c[0] += 2; /* NUL padding is not space padding */
        c[n] = 0;
        c[n + 1] = 0;
        expect_image_fail("nul-padding", c, n + 2, "unexpected byte 0x00");
        free(b);
        free(c);
    }

    expect_fail("entry-number", "{\"a\": 5}", 0, "tensor 'a': entry is not a JSON object");
    expect_fail("entry-array", "{\"a\": [1]}", 0, "tensor 'a': entry is not a JSON object");
    expect_fail("no-dtype", "{\"a\": {\"shape\": [2], \"data_offsets\": [0, 8]}}", 8,
                "tensor 'a': missing dtype");
    expect_fail("dtype-null",
                "{\"a\": {\"dtype\": null, \"shape\": [2], \"data_offsets\": [0, 8]}}", 8,
                "tensor 'a': missing dtype");
    expect_fail("dtype-number", "{\"a\": {\"dtype\": 1, \"shape\": [2], \"data_offsets\": [0, 8]}}",
                8, "tensor 'a': dtype is not a string");
    expect_fail("unknown-dtype",
                "{\"a\": {\"dtype\": \"Q4_K\", \"shape\": [2], \"data_offsets\": [0, 8]}}", 8,
                "unknown dtype 'Q4_K' in tensor 'a'");
    expect_fail("lowercase-dtype",
                "{\"a\": {\"dtype\": \"f32\", \"shape\": [2], \"data_offsets\": [0, 8]}}", 8,
                "unknown dtype 'f32' in tensor 'a'");
    const char *unsupported[] = {"F64", "I64", "U64", "I16", "U16", "BOOL", "F8_E4M3", "F8_E5M2"};
    for (size_t i = 0; i < sizeof unsupported / sizeof *unsupported; i++)
        expect_fail(fmt("dtype-%s", unsupported[i]),
                    fmt("{\"w\": {\"dtype\": \"%s\", \"shape\": [2], \"data_offsets\": [0, 8]}}",
                        unsupported[i]),
                    8, fmt("unsupported dtype %s in tensor 'w'", unsupported[i]));

    expect_fail("no-shape", "{\"a\": {\"dtype\": \"F32\", \"data_offsets\": [0, 8]}}", 8,
                "tensor 'a': missing shape");
    expect_fail("shape-object",
                "{\"a\": {\"dtype\": \"F32\", \"shape\": {}, \"data_offsets\": [0, 8]}}", 8,
                "tensor 'a': shape is not an array");
    expect_fail("negative-dim",
                "{\"a\": {\"dtype\": \"F32\", \"shape\": [-2], \"data_offsets\": [0, 8]}}", 8,
                "tensor 'a': dim 0 of shape is negative (-2)");
    expect_fail("float-dim",
                "{\"a\": {\"dtype\": \"F32\", \"shape\": [1, 2.5], \"data_offsets\": [0, 8]}}", 8,
                "tensor 'a': dim 1 of shape is not an integer");
    expect_fail("integral-float-dim",
                "{\"a\": {\"dtype\": \"F32\", \"shape\": [2.0], \"data_offsets\": [0, 8]}}", 8,
                "dim 0 of shape is not an integer");
    expect_fail("string-dim",
                "{\"a\": {\"dtype\": \"F32\", \"shape\": [\"2\"], \"data_offsets\": [0, 8]}}", 8,
                "dim 0 of shape is not an integer");
    expect_fail("bool-dim",
                "{\"a\": {\"dtype\": \"F32\", \"shape\": [true], \"data_offsets\": [0, 8]}}", 8,
                "dim 0 of shape is not an integer");
    expect_fail("exp-dim",
                "{\"a\": {\"dtype\": \"F32\", \"shape\": [1e30], \"data_offsets\": [0, 8]}}", 8,
                "dim 0 of shape is not an integer");
    expect_fail(
        "five-dims",
        "{\"a\": {\"dtype\": \"F32\", \"shape\": [1, 1, 1, 1, 2], \"data_offsets\": [0, 8]}}", 8,
        "tensor 'a': shape has 5 dims, at most 4 are supported");
    expect_fail(
        "dim-past-int64",
        "{\"a\": {\"dtype\": \"U8\", \"shape\": [99999999999999999999], \"data_offsets\": [0, 8]}}",
        8, "is too large");
    expect_fail("shape-overflow",
                "{\"a\": {\"dtype\": \"F32\", \"shape\": [4294967296, 4294967296], "
                "\"data_offsets\": [0, 8]}}",
                8, "tensor 'a': shape [4294967296, 4294967296] of f32 overflows");
    expect_fail("shape-overflow-i64",
                "{\"a\": {\"dtype\": \"BF16\", \"shape\": [4611686018427387904], \"data_offsets\": "
                "[0, 8]}}",
                8, "overflows");
    /* a zero dim makes 0 bytes, but the other dims must still not overflow */
    expect_fail("shape-overflow-zero",
                "{\"a\": {\"dtype\": \"F32\", \"shape\": [0, 4294967296, 4294967296], "
                "\"data_offsets\": [0, 0]}}",
                8, "overflows");

    expect_fail("no-offsets", "{\"a\": {\"dtype\": \"F32\", \"shape\": [2]}}", 8,
                "tensor 'a': missing data_offsets");
    expect_fail("offsets-one",
                "{\"a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0]}}", 8,
                "tensor 'a': data_offsets is not an array of two integers");
    expect_fail("offsets-three",
                "{\"a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8, 9]}}", 8,
                "data_offsets is not an array of two integers");
    expect_fail("offsets-string",
                "{\"a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": \"0-8\"}}", 8,
                "data_offsets is not an array of two integers");
    expect_fail("offsets-float",
                "{\"a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8.0]}}", 8,
                "tensor 'a': data_offsets[1] is not an integer");
    expect_fail("offsets-negative",
                "{\"a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [-8, 0]}}", 8,
                "tensor 'a': data_offsets[0] is negative");
    expect_fail("begin-after-end",
                "{\"a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [8, 0]}}", 8,
                "tensor 'a': data_offsets [8, 0] begin after end");
    expect_fail("span-past-data",
                "{\"a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [4, 12]}}", 8,
                "tensor 'a': data_offsets [4, 12] run past the data section (8 bytes");
    expect_fail("span-huge",
                "{\"a\": {\"dtype\": \"U8\", \"shape\": [1], \"data_offsets\": "
                "[18446744073709551614, 18446744073709551615]}}",
                8, "run past the data section");
    expect_fail(
        "size-mismatch",
        "{\"a\": {\"dtype\": \"F32\", \"shape\": [2, 3], \"data_offsets\": [0, 20]}}", 24,
        "tensor 'a': shape [2, 3] of f32 needs 24 bytes but data_offsets [0, 20] span 20 bytes");
    expect_fail("size-mismatch-bf16",
                "{\"a\": {\"dtype\": \"BF16\", \"shape\": [4], \"data_offsets\": [0, 16]}}", 16,
                "needs 8 bytes but data_offsets [0, 16] span 16 bytes");
    expect_fail("overlap",
                "{\"a\": {\"dtype\": \"F32\", \"shape\": [4], \"data_offsets\": [0, 16]}, "
                "\"b\": {\"dtype\": \"F32\", \"shape\": [4], \"data_offsets\": [8, 24]}}",
                24, "tensors 'a' [0, 16) and 'b' [8, 24) overlap");
    expect_fail("overlap-reversed",
                "{\"b\": {\"dtype\": \"F32\", \"shape\": [4], \"data_offsets\": [8, 24]}, "
                "\"a\": {\"dtype\": \"F32\", \"shape\": [4], \"data_offsets\": [0, 16]}}",
                24, "tensors 'a' [0, 16) and 'b' [8, 24) overlap");
    expect_fail("overlap-same",
                "{\"a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]}, "
                "\"b\": {\"dtype\": \"U8\", \"shape\": [8], \"data_offsets\": [0, 8]}}",
                8, "overlap");
    /* a zero-size tensor between two overlapping ones must not hide the overlap */
    expect_fail("overlap-around-empty",
                "{\"a\": {\"dtype\": \"U8\", \"shape\": [16], \"data_offsets\": [0, 16]}, "
                "\"z\": {\"dtype\": \"U8\", \"shape\": [0], \"data_offsets\": [4, 4]}, "
                "\"b\": {\"dtype\": \"U8\", \"shape\": [4], \"data_offsets\": [8, 12]}}",
                16, "tensors 'a' [0, 16) and 'b' [8, 12) overlap");
    expect_fail("duplicate-name",
                "{" T_A
                ", \"b\": {\"dtype\": \"U8\", \"shape\": [1], \"data_offsets\": [8, 9]}, " T_A "}",
                9, "duplicate tensor name 'a'");
    expect_fail("duplicate-escaped",
                "{" T_A
                ", \"\\u0061\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]}}",
                8, "duplicate tensor name 'a'");
    expect_fail("nul-in-name",
                "{\"a\\u0000b\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]}}",
                8, "NUL character");
    expect_fail("duplicate-field",
                "{\"a\": {\"dtype\": \"F32\", \"dtype\": \"F16\", \"shape\": [2], "
                "\"data_offsets\": [0, 8]}}",
                8, "duplicate key 'dtype' in the entry of 'a'");
    expect_fail("metadata-array", "{\"__metadata__\": [1], " T_A "}", 8,
                "__metadata__ is not an object");
    expect_fail("metadata-number", "{\"__metadata__\": {\"format\": 1}, " T_A "}", 8,
                "__metadata__ value of key 'format' is not a string");
    expect_fail("long-name", fmt("{\"%0300d\": 5}", 7), 0, "entry is not a JSON object");
}

static const st_tensor *find(const model_dir *md, const char *name) {
    const st_tensor *t = md_find(md, name);
    check(t != NULL, fmt("md_find %s", name), NULL);
    return t;
}

static void check_tensor(const st_tensor *t, lmh_dtype dt, int ndim, const int64_t *ne,
                         uint64_t begin, uint64_t end) {
    if (!t) return;
    int same = t->dtype == dt && t->ndim == ndim && t->begin == begin && t->end == end;
    for (int i = 0; i < ndim; i++) same = same && t->ne[i] == ne[i];
    check(same, fmt("tensor %s", t->name),
          fmt("dtype %d ndim %d [%" PRIu64 ", %" PRIu64 ")", t->dtype, t->ndim, t->begin, t->end));
    int bytes_ok = t->data != NULL;
    for (uint64_t i = begin; bytes_ok && i < end; i++)
        bytes_ok = ((const uint8_t *)t->data)[i - begin] == pattern(i);
    check(bytes_ok, fmt("data of %s", t->name), NULL);
}

static void good_single(void) {
    const char *d = new_dir("good-single");
    /* every dtype, a scalar, a 4-dim tensor, zero-size tensors, metadata, out-of-order
     * entries, space padding and spare bytes after the last span */
    const char *hdr =
        "{\"__metadata__\": {\"format\": \"pt\", \"note\": \"x\"},"
        "\"f16\": {\"dtype\": \"F16\", \"shape\": [3], \"data_offsets\": [16, 22]},"
        "\"f32\": {\"dtype\": \"F32\", \"shape\": [2, 2], \"data_offsets\": [0, 16]},"
        "\"bf16\": {\"dtype\": \"BF16\", \"shape\": [1, 1, 1, 1], \"data_offsets\": [22, 24]},"
        "\"u32\": {\"dtype\": \"U32\", \"shape\": [], \"data_offsets\": [24, 28]},"
        "\"i32\": {\"dtype\": \"I32\", \"shape\": [1, 1], \"data_offsets\": [28, 32]},"
        "\"u8\": {\"dtype\": \"U8\", \"shape\": [3], \"data_offsets\": [32, 35]},"
        "\"i8\": {\"dtype\": \"I8\", \"shape\": [1], \"data_offsets\": [35, 36]},"
        "\"empty\": {\"dtype\": \"F32\", \"shape\": [0], \"data_offsets\": [36, 36]},"
        "\"empty2\": {\"dtype\": \"BF16\", \"shape\": [4, 0], \"data_offsets\": [40, 40]},"
        "\"empty-end\": {\"dtype\": \"I8\", \"shape\": [0, 3], \"data_offsets\": [40, 40]}}";
    size_t n;
    uint8_t *img = st_image(hdr, 5, 40, &n); /* data is 40 bytes, spans end at 36 */
    write_raw(fmt("%s/model.safetensors", d), img, n);
    free(img);
    write_text(fmt("%s/config.json", d),
               "{\"model_type\": \"test\", \"hidden_size\": 8, \"n\": null,"
               " \"rope_parameters\": {\"rope_theta\": 10000.0, \"rope_type\": \"default\"},"
               " \"layer_types\": [\"full\", \"sliding\", {\"k\": [1, 2]}],"
               " \"quantization\": {\"bits\": 4, \"model.layers.0.mlp.gate\": {\"bits\": 8}}}\n");
    char err[1024] = "";
    model_dir *md = md_open(d, err, sizeof err);
    check(md != NULL, "md_open good-single", err);
    if (!md) return;
    check(md_count(md) == 10, "count good-single", fmt("%d", md_count(md)));
    check(md_weight_bytes(md) == 36, "weight bytes", fmt("%" PRIu64, md_weight_bytes(md)));
    check(strcmp(md_path(md), d) == 0, "md_path", md_path(md));
    check_tensor(find(md, "f32"), LMH_F32, 2, (int64_t[]){2, 2}, 0, 16);
    check_tensor(find(md, "f16"), LMH_F16, 1, (int64_t[]){3}, 16, 22);
    check_tensor(find(md, "bf16"), LMH_BF16, 4, (int64_t[]){1, 1, 1, 1}, 22, 24);
    check_tensor(find(md, "u32"), LMH_U32, 0, NULL, 24, 28);
    check_tensor(find(md, "i32"), LMH_I32, 2, (int64_t[]){1, 1}, 28, 32);
    check_tensor(find(md, "u8"), LMH_U8, 1, (int64_t[]){3}, 32, 35);
    check_tensor(find(md, "i8"), LMH_I8, 1, (int64_t[]){1}, 35, 36);
    check_tensor(find(md, "empty"), LMH_F32, 1, (int64_t[]){0}, 36, 36);
    check_tensor(find(md, "empty2"), LMH_BF16, 2, (int64_t[]){4, 0}, 40, 40);
    check_tensor(find(md, "empty-end"), LMH_I8, 2, (int64_t[]){0, 3}, 40, 40);
    check(md_find(md, "missing") == NULL, "md_find missing", NULL);
    check(md_find(md, "__metadata__") == NULL, "metadata is no tensor", NULL);
    check(md_find(md, "f3") == NULL && md_find(md, "f320") == NULL, "md_find near names", NULL);
    int all = 1;
    for (int32_t i = 0; i < md_count(md); i++)
        all = all && md_at(md, i) == md_find(md, md_at(md, i)->name);
    check(all, "md_at agrees with md_find", NULL);
    check(md_at(md, -1) == NULL && md_at(md, md_count(md)) == NULL, "md_at out of range", NULL);

    json_object *c = md_config(md);
    json_object *v;
    check(json_object_get_int(cfg_lookup(c, "hidden_size")) == 8, "cfg hidden_size", NULL);
    v = cfg_lookup(c, "rope_parameters.rope_theta");
    check(v && json_object_get_double(v) == 10000.0, "cfg nested", NULL);
    v = cfg_lookup(c, "layer_types.1");
    check(v && strcmp(json_object_get_string(v), "sliding") == 0, "cfg array index", NULL);
    v = cfg_lookup(c, "layer_types.2.k.1");
    check(v && json_object_get_int(v) == 2, "cfg deep path", NULL);
    v = cfg_lookup(c, "quantization.model.layers.0.mlp.gate.bits");
    check(v && json_object_get_int(v) == 8, "cfg key with dots", NULL);
    check(cfg_lookup(c, "n") == NULL, "cfg JSON null", NULL);
    check(cfg_lookup(c, "nope") == NULL, "cfg absent", NULL);
    const char *bad[] = {"layer_types.3",
                         "layer_types.-1",
                         "layer_types.x",
                         "layer_types.",
                         ".hidden_size",
                         "hidden_size..x",
                         "hidden_size.x",
                         "rope_parameters..rope_theta",
                         "layer_types.99999999999999999999999"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        check(cfg_lookup(c, bad[i]) == NULL, fmt("cfg_lookup %s is NULL", bad[i]), NULL);
    check(cfg_lookup(NULL, "a") == NULL, "cfg NULL root", NULL);
    md_close(md);
}

static void good_lone_and_many(void) {
    /* a lone *.safetensors with another name is accepted */
    const char *d = new_dir("good-lone");
    write_st(fmt("%s/weights.safetensors", d), "{" T_A "}", 8);
    char err[1024] = "";
    model_dir *md = md_open(d, err, sizeof err);
    check(md && md_count(md) == 1 && md_find(md, "a"), "md_open lone file", err);
    md_close(md);

    /* thousands of tensors: every one found by name */
    d = new_dir("good-many");
    enum { N = 5000 };
    size_t cap = N * 96 + 16, o = 0;
    char *h = malloc(cap);
    o += (size_t)snprintf(h + o, cap - o, "{");
    for (int i = 0; i < N; i++)
        o += (size_t)snprintf(h + o, cap - o,
                              "%s\"model.layers.%d.w\": {\"dtype\": \"U8\", \"shape\": [2], "
                              "\"data_offsets\": [%d, %d]}",
                              i ? "," : "", N - 1 - i, 2 * i, 2 * i + 2);
    snprintf(h + o, cap - o, "}");
    write_st(fmt("%s/model.safetensors", d), h, 2 * N);
    free(h);
    md = md_open(d, err, sizeof err);
    check(md && md_count(md) == N, "md_open many", err);
    int found = 0;
    for (int i = 0; md && i < N; i++) {
        const st_tensor *t = md_find(md, fmt("model.layers.%d.w", i));
        found += t && t->begin == (uint64_t)(2 * (N - 1 - i));
    }
    check(found == N, "all of many found", fmt("%d", found));
    md_close(md);
}

static void good_sharded(void) {
    const char *d = new_dir("good-sharded");
    write_st(fmt("%s/model-00001-of-00002.safetensors", d),
             "{\"__metadata__\": {\"format\": \"pt\"},"
             "\"a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]},"
             "\"c\": {\"dtype\": \"U8\", \"shape\": [2, 2], \"data_offsets\": [8, 12]}}",
             12);
    write_st(fmt("%s/model-00002-of-00002.safetensors", d),
             "{\"b\": {\"dtype\": \"BF16\", \"shape\": [3], \"data_offsets\": [0, 6]},"
             "\"a\": {\"dtype\": \"I8\", \"shape\": [1], \"data_offsets\": [6, 7]},"
             "\"extra\": {\"dtype\": \"U8\", \"shape\": [1], \"data_offsets\": [7, 8]}}",
             8);
    write_text(fmt("%s/model.safetensors.index.json", d),
               "{\"metadata\": {\"total_size\": 18},\n \"weight_map\": {\n"
               "  \"a\": \"model-00001-of-00002.safetensors\",\n"
               "  \"b\": \"model-00002-of-00002.safetensors\",\n"
               "  \"c\": \"model-00001-of-00002.safetensors\"}}\n");
    char err[1024] = "";
    model_dir *md = md_open(d, err, sizeof err);
    check(md != NULL, "md_open sharded", err);
    if (!md) return;
    check(md_count(md) == 3, "sharded count (index names three)", fmt("%d", md_count(md)));
    /* "a" is in both shards: the index says shard 1, so the F32 one */
    check_tensor(find(md, "a"), LMH_F32, 1, (int64_t[]){2}, 0, 8);
    check_tensor(find(md, "b"), LMH_BF16, 1, (int64_t[]){3}, 0, 6);
    check_tensor(find(md, "c"), LMH_U8, 2, (int64_t[]){2, 2}, 8, 12);
    check(md_find(md, "extra") == NULL, "tensor outside the index ignored", NULL);
    check(md_weight_bytes(md) == 18, "sharded weight bytes", fmt("%" PRIu64, md_weight_bytes(md)));
    md_close(md);
}

static void dir_cases(void) {
    const char *d = new_dir("no-config");
    unlink(fmt("%s/config.json", d));
    write_st(fmt("%s/model.safetensors", d), "{" T_A "}", 8);
    expect_md_fail("no-config", d, "config.json: cannot open");
    expect_md_fail("no-dir", fmt("%s/does-not-exist", tmp), "config.json: cannot open");

    d = new_dir("config-not-json");
    write_text(fmt("%s/config.json", d), "{\"model_type\": ");
    expect_md_fail("config-not-json", d, "config.json: not valid JSON");
    d = new_dir("config-array");
    write_text(fmt("%s/config.json", d), "[]");
    expect_md_fail("config-array", d, "config.json: not a JSON object");
    d = new_dir("config-garbage");
    write_text(fmt("%s/config.json", d), "{} {}");
    expect_md_fail("config-garbage", d, "config.json: not valid JSON");
    d = new_dir("config-dir");
    unlink(fmt("%s/config.json", d));
    mkdir(fmt("%s/config.json", d), 0755);
    expect_md_fail("config-is-dir", d, "config.json: not a regular file");

    d = new_dir("no-weights");
    expect_md_fail("no-weights", d, "no model.safetensors, model.safetensors.index.json");
    d = new_dir("two-bare");
    write_st(fmt("%s/x.safetensors", d), "{" T_A "}", 8);
    write_st(fmt("%s/y.safetensors", d), "{" T_A "}", 8);
    expect_md_fail("two-bare", d, "2 *.safetensors files but no model.safetensors.index.json");

    d = new_dir("corrupt-single");
    write_st(fmt("%s/model.safetensors", d),
             "{\"a\": {\"dtype\": \"F32\", \"shape\": [4], \"data_offsets\": [0, 16]}}", 8);
    expect_md_fail("corrupt-single", d, "model.safetensors: corrupt safetensors: tensor 'a'");
    d = new_dir("truncated-single");
    write_st(fmt("%s/model.safetensors", d), "{" T_A "}", 8);
    if (truncate(fmt("%s/model.safetensors", d), 20) != 0) perror("truncate");
    expect_md_fail("truncated-single", d, "model.safetensors: corrupt safetensors: header length");

    /* sharded: each case starts from a good pair of shards */
    const char *s1 = "{\"a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]}}";
    const char *s2 = "{\"b\": {\"dtype\": \"U8\", \"shape\": [2], \"data_offsets\": [0, 2]}}";
    struct {
        const char *name, *index, *want;
    } idx[] = {
        {"index-not-json", "{\"weight_map\": ", "index.json: not valid JSON"},
        {"index-array", "[]", "index.json: not a JSON object"},
        {"index-no-map", "{\"metadata\": {}}", "index.json: no weight_map object"},
        {"index-map-array", "{\"weight_map\": [\"s1.safetensors\"]}", "no weight_map object"},
        {"index-map-empty", "{\"weight_map\": {}}", "weight_map is empty"},
        {"index-value-number", "{\"weight_map\": {\"a\": 1}}",
         "weight_map value of 'a' is not a file name"},
        {"index-slash", "{\"weight_map\": {\"a\": \"sub/s1.safetensors\"}}",
         "weight_map puts 'a' in 'sub/s1.safetensors', which is not a file name inside"},
        {"index-dotdot", "{\"weight_map\": {\"a\": \"..\"}}", "which is not a file name inside"},
        {"index-escape",
         "{\"weight_map\": {\"a\": \"../good-sharded/model-00001-of-00002.safetensors\"}}",
         "which is not a file name inside"},
        {"index-absolute", "{\"weight_map\": {\"a\": \"/etc/passwd\"}}",
         "which is not a file name inside"},
        {"index-empty-name", "{\"weight_map\": {\"a\": \"\"}}", "which is not a file name inside"},
        {"index-missing-shard",
         "{\"weight_map\": {\"a\": \"s1.safetensors\", \"b\": \"s3.safetensors\"}}",
         "s3.safetensors: cannot open"},
        {"index-wrong-shard",
         "{\"weight_map\": {\"a\": \"s2.safetensors\", \"b\": \"s2.safetensors\"}}",
         "tensor 'a' is not in s2.safetensors, where model.safetensors.index.json says it is"},
        {"index-absent-tensor",
         "{\"weight_map\": {\"a\": \"s1.safetensors\", \"zz\": \"s1.safetensors\"}}",
         "tensor 'zz' is not in s1.safetensors"},
        {"index-duplicate",
         "{\"weight_map\": {\"a\": \"s1.safetensors\", \"b\": \"s2.safetensors\", \"a\": "
         "\"s2.safetensors\"}}",
         "tensor 'a' is listed twice in weight_map"},
        {"index-duplicate-top", "{\"weight_map\": {\"a\": \"s1.safetensors\"}, \"weight_map\": {}}",
         "duplicate key 'weight_map' in the top-level object"},
        {"index-corrupt-shard",
         "{\"weight_map\": {\"a\": \"s1.safetensors\", \"c\": \"bad.safetensors\"}}",
         "bad.safetensors: corrupt safetensors: header"},
    };
    for (size_t i = 0; i < sizeof idx / sizeof *idx; i++) {
        d = new_dir(idx[i].name);
        write_st(fmt("%s/s1.safetensors", d), s1, 8);
        write_st(fmt("%s/s2.safetensors", d), s2, 2);
        write_text(fmt("%s/bad.safetensors", d), "garbage!garbage!garbage!");
        write_text(fmt("%s/model.safetensors.index.json", d), idx[i].index);
        expect_md_fail(idx[i].name, d, idx[i].want);
    }
}

int main(void) {
    const char *t = getenv("TMPDIR");
    snprintf(tmp, sizeof tmp, "%s/lmhost-modeldir-XXXXXX", t && *t ? t : "/tmp");
    if (!mkdtemp(tmp)) {
        perror("mkdtemp");
        return 2;
    }
    header_cases();
    good_single();
    good_lone_and_many();
    good_sharded();
    dir_cases();
    rm_rf(tmp);
    printf("%d checks passed, %d failed\n", n_ok, n_fail);
    return n_fail ? 1 : 0;
}
