/* Small helpers of the host: error strings, paths, whole-file reads, checked arithmetic and
 * strict JSON parsing on top of json-c. */
#ifndef LMHOST_UTIL_H
#define LMHOST_UTIL_H

#include <stddef.h>
#include <stdint.h>
#include <json-c/json.h>

/* snprintf into err[err_len] when err is non-NULL and err_len > 0; returns -1. */
int util_err(char *err, size_t err_len, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* "a/b" (no doubled slash), malloc'd; NULL when out of memory. */
char *util_path_join(const char *a, const char *b);
/* Memory the system could give this process now (MemAvailable), in bytes. */
uint64_t util_mem_available(void);

/* Reads a whole regular file of at most max_len bytes into a malloc'd, NUL-terminated
 * buffer. NULL with err set ("PATH: why") on failure. */
char *util_read_file(const char *path, size_t max_len, size_t *len, char *err, size_t err_len);

/* a * b into *out; non-zero on overflow. */
static inline int util_mul_u64(uint64_t a, uint64_t b, uint64_t *out) {
    return __builtin_mul_overflow(a, b, out);
}

/* Parses text[0..len) as one strict JSON object (no comments, trailing commas or invalid
 * UTF-8; NaN and Infinity pass, as Python writes them); only JSON whitespace may follow.
 * *end (when non-NULL) is set to the end of the object. NULL with err set ("not valid
 * JSON: why at byte N", "not a JSON object") on failure. */
json_object *util_json_parse_object(const char *text, size_t len, size_t *end, char *err,
                                    size_t err_len);

/* json-c keeps the last of duplicate keys and cuts keys at an escaped NUL, silently. This
 * scans the raw text of a value json-c accepted for keys it would merge. Returns 0 when
 * there are none; 1 for a duplicate, 2 for a key with a NUL in it, with the key in key[]
 * and the dotted path of the object holding it in path[] ("" for the outermost); -1 when
 * out of memory. */
int util_json_find_dup_key(const char *text, size_t len, char *key, size_t key_len, char *path,
                           size_t path_len);

#endif
