#include "npy.h"
#include "log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int npy_write_f32(const char *path, const float *data, int64_t rows, int64_t cols, char *err,
                  size_t err_len) {
    char dict[128];
    int dl = snprintf(dict, sizeof dict,
                      "{'descr': '<f4', 'fortran_order': False, 'shape': (%lld, %lld), }",
                      (long long)rows, (long long)cols);
    /* magic(6) + version(2) + header length(2) + dict, padded with spaces and a newline
     * to a multiple of 64 bytes */
    int total = 10 + dl + 1;
    int pad = (64 - total % 64) % 64;
    int hlen = dl + pad + 1;
    FILE *f = fopen(path, "wb");
    if (!f) return errf(err, err_len, "cannot write %s: %m", path);
    unsigned char pre[10] = {0x93,
                             'N',
                             'U',
                             'M',
                             'P',
                             'Y',
                             1,
                             0,
                             (unsigned char)(hlen & 0xff),
                             (unsigned char)(hlen >> 8)};
    int ok = fwrite(pre, 1, 10, f) == 10 && fwrite(dict, 1, (size_t)dl, f) == (size_t)dl;
    for (int i = 0; ok && i < pad; i++) ok = fputc(' ', f) != EOF;
    ok = ok && fputc('\n', f) != EOF;
    size_t n = (size_t)(rows * cols);
    ok = ok && fwrite(data, sizeof(float), n, f) == n; /* x86-64 and aarch64: little-endian */
    if (fclose(f) != 0) ok = 0;
    return ok ? 0 : errf(err, err_len, "writing %s failed", path);
}

/* Reads a little-endian float32 C-order array of 2 to max_dims dimensions into *data
 * (malloc'd), with its shape in ne[0..*ndim). */
static int read_f32(const char *path, int max_dims, float **data, int *ndim, int64_t *ne, char *err,
                    size_t err_len) {
    FILE *f = fopen(path, "rb");
    if (!f) return errf(err, err_len, "cannot open %s: %m", path);
    unsigned char pre[10];
    char hdr[4096];
    int rc = -1;
    if (fread(pre, 1, 10, f) != 10 || memcmp(pre, "\x93NUMPY", 6) != 0 || pre[6] != 1) {
        errf(err, err_len, "%s: not a version 1 .npy file", path);
        goto out;
    }
    size_t hl = (size_t)pre[8] | ((size_t)pre[9] << 8);
    if (hl >= sizeof hdr || fread(hdr, 1, hl, f) != hl) {
        errf(err, err_len, "%s: bad header", path);
        goto out;
    }
    hdr[hl] = 0;
    const char *sh = strstr(hdr, "'shape': (");
    int nd = 0, bad = !sh;
    long long total = 1;
    for (const char *p = sh ? sh + 10 : ""; !bad && *p && *p != ')';) {
        char *end;
        long long v = strtoll(p, &end, 10);
        if (end == p || v <= 0 || nd == max_dims || v > (1LL << 34) / total) {
            bad = 1;
            break;
        }
        total *= v;
        ne[nd++] = v;
        p = end;
        while (*p == ',' || *p == ' ') p++;
    }
    if (bad || nd < 2 || !strstr(hdr, "'descr': '<f4'") || !strstr(hdr, "'fortran_order': False")) {
        errf(err, err_len, "%s: expected a %s float32 C-order array", path,
             max_dims == 2 ? "2-D" : "2-D to 4-D");
        goto out;
    }
    /* the data must be there before anything is allocated for it */
    struct stat st;
    if (fstat(fileno(f), &st) != 0 || st.st_size < 0 ||
        (uint64_t)st.st_size < 10 + hl + (uint64_t)total * sizeof(float)) {
        errf(err, err_len, "%s: truncated data", path);
        goto out;
    }
    float *d = malloc((size_t)total * sizeof(float));
    if (!d || fread(d, sizeof(float), (size_t)total, f) != (size_t)total) {
        free(d);
        errf(err, err_len, "%s: truncated data", path);
        goto out;
    }
    *data = d;
    *ndim = nd;
    rc = 0;
out:
    fclose(f);
    return rc;
}

int npy_read_f32(const char *path, float **data, int64_t *rows, int64_t *cols, char *err,
                 size_t err_len) {
    int nd;
    int64_t ne[2];
    if (read_f32(path, 2, data, &nd, ne, err, err_len)) return -1;
    *rows = ne[0];
    *cols = ne[1];
    return 0;
}

int npy_read_f32_nd(const char *path, float **data, int *ndim, int64_t ne[4], char *err,
                    size_t err_len) {
    return read_f32(path, 4, data, ndim, ne, err, err_len);
}
