/* Workarounds for json-c 0.16, shared by every JSON reader of the host (model directories,
 * tokenizer.json, request bodies). */
#ifndef LMHOST_JSON_FIX_H
#define LMHOST_JSON_FIX_H

#include <stddef.h>

/* json-c 0.16 decodes some escaped surrogate pairs to U+FFFD (every high surrogate 0xD836,
 * 0xD837, 0xD876, ...: code points U+1D800-U+1DFFF and their 64K-periodic kin). This
 * rewrites each escaped pair inside a string ("\uD836\uDC00") as the raw UTF-8 of its code
 * point, which json-c reads right; anything else (lone surrogates, escaped backslashes,
 * text outside strings) is left as it is. Returns 1 with *out (malloc'd, NUL-terminated,
 * *out_n bytes) holding the rewrite, 0 when nothing needed it (*out untouched), -1 when out
 * of memory. */
int json_fix_surrogates(const char *s, size_t n, char **out, size_t *out_n);

#endif
