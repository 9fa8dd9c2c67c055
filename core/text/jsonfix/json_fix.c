#include "json_fix.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static int hex4(const char *s) {
    int v = 0;
    for (int i = 0; i < 4; i++) {
        int c = (unsigned char)s[i], d = c >= '0' && c <= '9'   ? c - '0'
                                         : c >= 'a' && c <= 'f' ? c - 'a' + 10
                                         : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                                                : -1;
        if (d < 0) return -1;
        v = v * 16 + d;
    }
    return v;
}

/* an escaped surrogate pair at s[i] ("\uD8xx\uDCxx", 12 bytes): its code point, else 0 */
static uint32_t pair_at(const char *s, size_t i, size_t n) {
    if (i + 12 > n || s[i] != '\\' || s[i + 1] != 'u' || s[i + 6] != '\\' || s[i + 7] != 'u')
        return 0;
    int hi = hex4(s + i + 2), lo = hex4(s + i + 8);
    if (hi < 0xD800 || hi > 0xDBFF || lo < 0xDC00 || lo > 0xDFFF) return 0;
    return 0x10000 + (((uint32_t)hi - 0xD800) << 10) + ((uint32_t)lo - 0xDC00);
}

int json_fix_surrogates(const char *s, size_t n, char **out, size_t *out_n) {
    char *o = NULL;
    size_t k = 0, run = 0;
    int in_str = 0;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (!in_str) {
            in_str = c == '"';
            continue;
        }
        if (c == '"') {
            in_str = 0;
        } else if (c == '\\') {
            uint32_t cp = pair_at(s, i, n);
            if (!cp) {
                i++; /* the escaped character (\" and \\ in particular) */
                continue;
            }
            if (!o && !(o = malloc(n + 1))) return -1; /* 4 bytes replace 12: never longer */
            memcpy(o + k, s + run, i - run);
            k += i - run;
            o[k++] = (char)(0xF0 | (cp >> 18));
            o[k++] = (char)(0x80 | ((cp >> 12) & 0x3F));
            o[k++] = (char)(0x80 | ((cp >> 6) & 0x3F));
            o[k++] = (char)(0x80 | (cp & 0x3F));
            i += 11;
            run = i + 1;
        }
    }
    if (!o) return 0;
    memcpy(o + k, s + run, n - run);
    k += n - run;
    o[k] = 0;
    *out = o;
    *out_n = k;
    return 1;
}
