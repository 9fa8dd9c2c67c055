/* NumPy .npy files (format 1.0), float32, C order. */
#ifndef LMHOST_NPY_H
#define LMHOST_NPY_H

#include <stddef.h>
#include <stdint.h>

/* Writes data[rows * cols] as a [rows, cols] array. Returns 0 or -1 with err set. */
int npy_write_f32(const char *path, const float *data, int64_t rows, int64_t cols, char *err,
                  size_t err_len);
/* Reads a 2-D little-endian float32 array; *data is malloc'd. */
int npy_read_f32(const char *path, float **data, int64_t *rows, int64_t *cols, char *err,
                 size_t err_len);

/* The same for 2 to 4 dimensions: the shape in ne[0..*ndim). */
int npy_read_f32_nd(const char *path, float **data, int *ndim, int64_t ne[4], char *err,
                    size_t err_len);

#endif
