#include "log.h"

#include <stdarg.h>
#include <stdio.h>

int log_level = 1;
void (*log_interrupt)(void);

void log_msg(int level, const char *fmt, ...) {
    static const char *const tag[] = {"error", "warning", "info", "debug"};
    if (level > log_level) return;
    if (log_interrupt) log_interrupt();
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "lmhost: %s: ", tag[level < 0 ? 0 : level > 3 ? 3 : level]);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

int errf(char *err, size_t err_len, const char *fmt, ...) {
    if (err && err_len) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, err_len, fmt, ap);
        va_end(ap);
    }
    return -1;
}
