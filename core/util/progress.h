/* Progress of a long operation on stderr. On a terminal, one line redrawn in place at most
 * about ten times a second (label, bar, percent, done/total, rate, ETA), finished with a
 * newline. Elsewhere, plain lines (label, done/total, percent, rate) at most every ~5 s and a
 * final line, unless the bar is for terminals only. Nothing at all when logging is off
 * (log_level 0, LMHOST_LOG=0). Every function takes NULL and then does nothing. */
#ifndef LMHOST_PROGRESS_H
#define LMHOST_PROGRESS_H

#include <stddef.h>
#include <stdint.h>

typedef struct progress progress;

enum {
    PROGRESS_BYTES = 1,    /* amounts as B/KiB/MiB/GiB with a rate per second */
    PROGRESS_TTY_ONLY = 2, /* silent when stderr is not a terminal */
    PROGRESS_DELAYED = 4,  /* draw nothing until it has run for more than a second */
};

/* total 0: unknown. bytes: PROGRESS_BYTES formatting. A bar that draws on a terminal and
 * writes plain lines elsewhere (downloads). NULL when out of memory or silent. */
progress *progress_start(const char *label, uint64_t total, int bytes);
/* The same, silent when stderr is not a terminal (quantize, dequantize). */
progress *progress_start_tty_only(const char *label, uint64_t total, int bytes);
/* PROGRESS_* flags; with PROGRESS_DELAYED (model load) nothing is drawn, the final line
 * included, unless the operation has taken more than a second. */
progress *progress_start_flags(const char *label, uint64_t total, int flags);
/* The amount done so far; cheap (one clock read) when nothing is to be drawn. */
void progress_set(progress *p, uint64_t done);
/* A total learnt late (0: unknown). */
void progress_set_total(progress *p, uint64_t total);
/* The final line ("LABEL: 1.2 GiB in 3.4 s, 350 MiB/s" or "LABEL: failed at ..."); frees p. */
void progress_end(progress *p, int ok);

/* Pure formatting, for the tests. Each writes a NUL-terminated string into buf[n] and
 * returns its length (truncated to fit). */
/* "512 B", "1.5 KiB", "12.3 MiB", "1.02 GiB" (bytes) or "1234567" (counts). */
size_t progress_fmt_amount(char *buf, size_t n, uint64_t v, int bytes);
/* amount / second: "12.3 MiB/s" (bytes) or "45.6/s" (counts); "-" when secs <= 0. */
size_t progress_fmt_rate(char *buf, size_t n, double amount, double secs, int bytes);
/* "0:07", "12:34", "1:02:03"; "--:--" when unknown (negative, NaN, or over 99 hours). */
size_t progress_fmt_eta(char *buf, size_t n, double secs);
/* One line without newline. width > 0: the terminal line, fit into width columns
 * ("LABEL [#####     ]  42%  1.2 GiB/3.4 GiB  350 MiB/s  ETA 0:07"); width 0: the plain
 * line ("LABEL: 1.2 GiB/3.4 GiB (42%), 350 MiB/s"). total 0: no bar, percent or ETA. */
size_t progress_fmt_line(char *buf, size_t n, const char *label, uint64_t done, uint64_t total,
                         int bytes, double elapsed, int width);
/* The final line: "LABEL: 3.4 GiB in 9.8 s, 350 MiB/s" (ok), "LABEL: failed at 1.2 GiB/3.4 GiB
 * after 3.0 s" (not ok). */
size_t progress_fmt_final(char *buf, size_t n, const char *label, uint64_t done, uint64_t total,
                          int bytes, double elapsed, int ok);
/* A progress that writes to fd as if it were (tty 1) or were not (tty 0) a terminal of width
 * columns, with the clock read through now() when non-NULL: for the tests. */
progress *progress_start_fd(const char *label, uint64_t total, int flags, int fd, int tty,
                            int width, double (*now)(void));

#endif
