#include "progress.h"

#include "log.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <time.h>
#include <unistd.h>

#define TTY_INTERVAL   0.1 /* seconds between redraws on a terminal */
#define PLAIN_INTERVAL 5.0 /* seconds between plain lines */
#define DELAY          1.0 /* PROGRESS_DELAYED: nothing before this many seconds */
#define BAR_MAX        30

struct progress {
    char label[160];
    uint64_t total, done;
    int bytes, delayed, fd, tty, width, drawn;
    double t0, last;
    double (*now)(void);
};

static double mono_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* snprintf that returns the length actually written (never more than n - 1). */
static size_t fmt(char *buf, size_t n, const char *f, ...) __attribute__((format(printf, 3, 4)));
static size_t fmt(char *buf, size_t n, const char *f, ...) {
    if (!n) return 0;
    va_list ap;
    va_start(ap, f);
    int r = vsnprintf(buf, n, f, ap);
    va_end(ap);
    if (r < 0) {
        buf[0] = 0;
        return 0;
    }
    return (size_t)r < n ? (size_t)r : n - 1;
}

static size_t fmt_bytes_d(char *buf, size_t n, double v) {
    static const char *const unit[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
    if (!(v >= 0)) v = 0;
    if (v < 1024) return fmt(buf, n, "%.0f B", v);
    int u = 0;
    while (v >= 1024 && u < 5) {
        v /= 1024;
        u++;
    }
    /* Three significant digits, rounded the way they print: 9.999 KiB is "10.0 KiB". */
    if (v < 9.995) return fmt(buf, n, "%.2f %s", v, unit[u]);
    if (v < 99.95) return fmt(buf, n, "%.1f %s", v, unit[u]);
    return fmt(buf, n, "%.0f %s", v, unit[u]);
}

size_t progress_fmt_amount(char *buf, size_t n, uint64_t v, int bytes) {
    if (bytes) return fmt_bytes_d(buf, n, (double)v);
    return fmt(buf, n, "%llu", (unsigned long long)v);
}

size_t progress_fmt_rate(char *buf, size_t n, double amount, double secs, int bytes) {
    if (!(secs > 0) || !(amount >= 0)) return fmt(buf, n, "-");
    double r = amount / secs;
    if (bytes) {
        size_t k = fmt_bytes_d(buf, n, r);
        return k + fmt(buf + k, n - k, "/s");
    }
    return fmt(buf, n, r < 99.95 ? "%.1f/s" : "%.0f/s", r);
}

size_t progress_fmt_eta(char *buf, size_t n, double secs) {
    if (!(secs >= 0) || secs >= 99 * 3600.0) return fmt(buf, n, "--:--");
    long s = (long)(secs + 0.5);
    if (s >= 3600) return fmt(buf, n, "%ld:%02ld:%02ld", s / 3600, s / 60 % 60, s % 60);
    return fmt(buf, n, "%ld:%02ld", s / 60, s % 60);
}

/* "1.2 GiB/3.4 GiB", "12/345", or just the amount done when the total is unknown. */
static size_t fmt_done_total(char *buf, size_t n, uint64_t done, uint64_t total, int bytes) {
    size_t k = progress_fmt_amount(buf, n, done, bytes);
    if (!total) return k;
    k += fmt(buf + k, n - k, "/");
    return k + progress_fmt_amount(buf + k, n - k, total, bytes);
}

static int percent(uint64_t done, uint64_t total) {
    if (!total) return 0;
    if (done >= total) return 100;
    return (int)((double)done * 100.0 / (double)total);
}

size_t progress_fmt_line(char *buf, size_t n, const char *label, uint64_t done, uint64_t total,
                         int bytes, double elapsed, int width) {
    char dt[64], rate[32], eta[32];
    fmt_done_total(dt, sizeof dt, done, total, bytes);
    progress_fmt_rate(rate, sizeof rate, (double)done, elapsed, bytes);
    if (!label) label = "";
    if (width <= 0) {
        if (total) return fmt(buf, n, "%s: %s (%d%%), %s", label, dt, percent(done, total), rate);
        return fmt(buf, n, "%s: %s, %s", label, dt, rate);
    }
    /* The statistics right of the bar, then as much bar as fits (none under 5 columns). */
    char stats[160];
    if (total) {
        double eta_s = -1;
        if (done >= total)
            eta_s = 0;
        else if (done > 0 && elapsed > 0)
            eta_s = (double)(total - done) * elapsed / (double)done;
        progress_fmt_eta(eta, sizeof eta, eta_s);
        fmt(stats, sizeof stats, " %3d%%  %s  %s  ETA %s", percent(done, total), dt, rate, eta);
    } else {
        fmt(stats, sizeof stats, "  %s  %s", dt, rate);
    }
    int lab = (int)strlen(label), st = (int)strlen(stats);
    int room = width - st;
    if (room < 1) room = 1;
    if (lab > room) lab = room; /* a label longer than the line: cut */
    int bar = total ? room - lab - 3 : 0;
    if (bar > BAR_MAX) bar = BAR_MAX;
    if (bar < 5) bar = 0;
    size_t k = fmt(buf, n, "%.*s", lab, label);
    if (bar) {
        int fill = (int)((double)bar * (double)percent(done, total) / 100.0);
        char b[BAR_MAX + 1];
        for (int i = 0; i < bar; i++) b[i] = i < fill ? '#' : '.';
        b[bar] = 0;
        k += fmt(buf + k, n - k, " [%s]", b);
    }
    k += fmt(buf + k, n - k, "%s", stats);
    /* Cut to the width (the statistics shrink last). */
    if ((int)k > width && (size_t)width < n) {
        buf[width] = 0;
        k = (size_t)width;
    }
    return k;
}

static size_t fmt_elapsed(char *buf, size_t n, double secs) {
    if (secs < 60) return fmt(buf, n, "%.1f s", secs < 0 ? 0 : secs);
    return progress_fmt_eta(buf, n, secs);
}

size_t progress_fmt_final(char *buf, size_t n, const char *label, uint64_t done, uint64_t total,
                          int bytes, double elapsed, int ok) {
    char dt[64], rate[32], el[32];
    if (!label) label = "";
    fmt_elapsed(el, sizeof el, elapsed);
    if (!ok) {
        fmt_done_total(dt, sizeof dt, done, total, bytes);
        return fmt(buf, n, "%s: failed at %s after %s", label, dt, el);
    }
    progress_fmt_amount(dt, sizeof dt, done, bytes);
    progress_fmt_rate(rate, sizeof rate, (double)done, elapsed, bytes);
    if (!(elapsed > 0)) return fmt(buf, n, "%s: %s", label, dt);
    return fmt(buf, n, "%s: %s in %s, %s", label, dt, el, rate);
}

static void put(int fd, const char *s, size_t len) {
    while (len) {
        ssize_t w = write(fd, s, len);
        if (w <= 0) return; /* a closed stderr is no reason to fail the operation */
        s += w;
        len -= (size_t)w;
    }
}

static void draw(progress *p, double t);

/* The bar whose line is on the terminal now: a log message clears it first (log_interrupt)
 * and the next progress_set draws it again below. */
static progress *shown;

static void clear_shown(void) {
    if (shown && shown->drawn) {
        put(shown->fd, "\r\033[K", 4);
        shown->drawn = 0;
        shown->last = shown->t0 - 1e9; /* redraw at the next progress_set */
    }
}

static int term_width(int fd) {
    struct winsize ws;
    if (ioctl(fd, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0) return ws.ws_col;
    return 80;
}

progress *progress_start_fd(const char *label, uint64_t total, int flags, int fd, int tty,
                            int width, double (*now)(void)) {
    if (!tty && (flags & PROGRESS_TTY_ONLY)) return NULL;
    progress *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    snprintf(p->label, sizeof p->label, "%s", label ? label : "");
    p->total = total;
    p->bytes = flags & PROGRESS_BYTES;
    p->delayed = (flags & PROGRESS_DELAYED) != 0;
    p->fd = fd;
    p->tty = tty;
    p->width = width > 1 ? width : 80;
    p->now = now ? now : mono_now;
    p->t0 = p->now();
    p->last = p->t0 - 1e9;    /* the first call may draw */
    if (tty && !p->delayed) { /* the bar at once, at 0 */
        p->last = p->t0;
        draw(p, p->t0);
    }
    return p;
}

progress *progress_start_flags(const char *label, uint64_t total, int flags) {
    if (log_level < 1) return NULL; /* logging off: no progress either */
    int tty = isatty(2);
    return progress_start_fd(label, total, flags, 2, tty, tty ? term_width(2) : 0, NULL);
}

progress *progress_start(const char *label, uint64_t total, int bytes) {
    return progress_start_flags(label, total, bytes ? PROGRESS_BYTES : 0);
}

progress *progress_start_tty_only(const char *label, uint64_t total, int bytes) {
    return progress_start_flags(label, total, (bytes ? PROGRESS_BYTES : 0) | PROGRESS_TTY_ONLY);
}

void progress_set_total(progress *p, uint64_t total) {
    if (p) p->total = total;
}

static void draw(progress *p, double t) {
    char line[512];
    /* One column short of the width, so that the cursor never wraps. */
    size_t k = progress_fmt_line(line + 1, sizeof line - 8, p->label, p->done, p->total, p->bytes,
                                 t - p->t0, p->tty ? p->width - 1 : 0);
    if (p->tty) {
        line[0] = '\r';
        memcpy(line + 1 + k, "\033[K", 3); /* clear what a longer line left */
        put(p->fd, line, k + 4);
        p->drawn = 1;
        if (p->fd == 2) { /* (the tests' pipes are no terminal for log messages) */
            shown = p;
            log_interrupt = clear_shown;
        }
    } else {
        line[1 + k] = '\n';
        put(p->fd, line + 1, k + 1);
    }
}

void progress_set(progress *p, uint64_t done) {
    if (!p) return;
    p->done = done;
    double t = p->now();
    if (p->delayed && t - p->t0 <= DELAY) return;
    if (p->tty) {
        if (t - p->last < TTY_INTERVAL) return;
    } else {
        /* The first plain line after PLAIN_INTERVAL, not at once: a quick one writes only
         * its final line. */
        if (t - (p->last > p->t0 ? p->last : p->t0) < PLAIN_INTERVAL) return;
    }
    p->last = t;
    draw(p, t);
}

void progress_end(progress *p, int ok) {
    if (!p) return;
    if (shown == p) {
        shown = NULL;
        log_interrupt = NULL;
    }
    double t = p->now();
    if (!p->delayed || t - p->t0 > DELAY || p->drawn) {
        char line[512];
        size_t k = progress_fmt_final(line + 1, sizeof line - 8, p->label, p->done, p->total,
                                      p->bytes, t - p->t0, ok);
        if (p->tty) {
            line[0] = '\r';
            memcpy(line + 1 + k, "\033[K\n", 4);
            put(p->fd, line, k + 5);
        } else {
            line[1 + k] = '\n';
            put(p->fd, line + 1, k + 1);
        }
    }
    free(p);
}
