/* safetensors files: memory-mapped, header fully validated before any tensor is used. */
#ifndef LMHOST_SAFETENSORS_H
#define LMHOST_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>
#include "lmhost/abi.h"

typedef struct st_tensor {
    char *name;
    lmh_dtype dtype;
    int32_t ndim;
    int64_t ne[LMH_MAX_DIMS];
    uint64_t begin, end; /* byte span relative to the data section (after the header) */
    const void *data;    /* into the mapping; NULL when parsed from a bare header */
} st_tensor;

typedef struct st_header {
    st_tensor *tensors;
    int32_t n_tensors;
    uint64_t data_size; /* bytes after the header that the file holds */
} st_header;

/* Parses and validates a whole file image (8-byte length, JSON header, data):
 * length inside the buffer, JSON object, known dtype (F32 F16 BF16 U32 I32 U8 I8; others
 * are refused by name), shape x dtype size = byte span, spans inside the data and
 * non-overlapping, names unique; "__metadata__" must map strings to strings. Pure: no I/O,
 * so fuzz targets call it directly. On error returns non-zero and writes a message saying
 * what and where (tensor name, byte offsets) into err. */
int st_parse(const uint8_t *file, size_t file_size, st_header *out, char *err, size_t err_len);
void st_header_free(st_header *h);

typedef struct st_file {
    char *path;
    void *map;
    size_t map_size;
    st_header hdr; /* tensors[i].data points into map */
} st_file;

/* mmaps and validates `path`. NULL with err set on failure (message names the file). */
st_file *st_open(const char *path, char *err, size_t err_len);
void st_close(st_file *f);

#endif
