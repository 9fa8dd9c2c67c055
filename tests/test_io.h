/* Small helpers the test programs share: a whole file read into memory, and text printed
 * with its control characters escaped (for readable diffs). */
#ifndef LMHOST_TEST_IO_H
#define LMHOST_TEST_IO_H

#include <stdio.h>
#include <stdlib.h>

/* The file's bytes, NUL-terminated (free them), or NULL; *len (when len is not NULL) gets
 * the size. */
static inline char *test_slurp(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = n >= 0 ? malloc((size_t)n + 1) : NULL;
    if (b && fread(b, 1, (size_t)n, f) != (size_t)n) {
        free(b);
        b = NULL;
    }
    fclose(f);
    if (b) b[n] = 0;
    if (len) *len = b ? (size_t)n : 0;
    return b;
}

/* s[0, n) in double quotes on stdout, with \n, \", \\ and other control bytes escaped. */
static inline void test_show(const char *s, size_t n) {
    putchar('"');
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)s[i];
        if (ch == '\n')
            fputs("\\n", stdout);
        else if (ch == '"' || ch == '\\')
            printf("\\%c", ch);
        else if (ch < 0x20)
            printf("\\x%02x", ch);
        else
            putchar(ch);
    }
    putchar('"');
}

#endif
