/* Diagnostics of the host: everything goes to stderr, stdout is for command output. */
#ifndef LMHOST_LOG_H
#define LMHOST_LOG_H

#include <stddef.h>

/* 0 error, 1 warn, 2 info, 3 debug (LMH_LOG_* in abi.h). Set from LMHOST_LOG or -v. */
extern int log_level;
/* Called before a message is written, when set: a progress bar on the terminal clears its
 * line here (progress.c), and draws it again below the message. */
extern void (*log_interrupt)(void);
void log_msg(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* snprintf into err[err_len] when err is non-NULL; returns -1 for `return errf(...)`. */
int errf(char *err, size_t err_len, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

#endif
