/* core/util/progress: the formatting (sizes, rates, ETAs, the terminal and plain lines, the
 * final line) as pure functions, and the drawing against a pipe with a fake clock: plain
 * lines at most every 5 s and a final one; a terminal line redrawn with \r at most ten
 * times a second, nothing before a second with PROGRESS_DELAYED; silent for terminals-only
 * bars off a terminal and when logging is off. */
#include "log.h"
#include "progress.h"

#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int failures;

#define CHECK(c)                                                                                   \
    do {                                                                                           \
        if (!(c)) {                                                                                \
            fprintf(stderr, "%s:%d: FAIL: %s\n", __FILE__, __LINE__, #c);                          \
            failures++;                                                                            \
        }                                                                                          \
    } while (0)

static void check_str(const char *got, const char *want, int line) {
    if (strcmp(got, want)) {
        fprintf(stderr, "%s:%d: FAIL: got '%s', want '%s'\n", __FILE__, line, got, want);
        failures++;
    }
}
#define STR(got, want) check_str(got, want, __LINE__)

static void amounts(void) {
    char b[64];
    progress_fmt_amount(b, sizeof b, 0, 1);
    STR(b, "0 B");
    progress_fmt_amount(b, sizeof b, 512, 1);
    STR(b, "512 B");
    progress_fmt_amount(b, sizeof b, 1023, 1);
    STR(b, "1023 B");
    progress_fmt_amount(b, sizeof b, 1024, 1);
    STR(b, "1.00 KiB");
    progress_fmt_amount(b, sizeof b, 1536, 1);
    STR(b, "1.50 KiB");
    progress_fmt_amount(b, sizeof b, (uint64_t)(12.3 * 1048576), 1);
    STR(b, "12.3 MiB");
    progress_fmt_amount(b, sizeof b, 350ull << 20, 1);
    STR(b, "350 MiB");
    progress_fmt_amount(b, sizeof b, 10235, 1); /* 9.995 KiB rounds up: "10.0", not "10.00" */
    STR(b, "10.0 KiB");
    progress_fmt_amount(b, sizeof b, (uint64_t)(1.02 * 1073741824.0), 1);
    STR(b, "1.02 GiB");
    progress_fmt_amount(b, sizeof b, 3ull << 40, 1);
    STR(b, "3.00 TiB");
    progress_fmt_amount(b, sizeof b, 1234567, 0);
    STR(b, "1234567");
    progress_fmt_amount(b, 4, 1234567, 0); /* truncated, terminated */
    STR(b, "123");
}

static void rates(void) {
    char b[64];
    progress_fmt_rate(b, sizeof b, 10.0 * 1048576, 2, 1);
    STR(b, "5.00 MiB/s");
    progress_fmt_rate(b, sizeof b, 700.0 * 1048576, 2, 1);
    STR(b, "350 MiB/s");
    progress_fmt_rate(b, sizeof b, 100, 0, 1);
    STR(b, "-");
    progress_fmt_rate(b, sizeof b, 228, 5, 0);
    STR(b, "45.6/s");
    progress_fmt_rate(b, sizeof b, 1000, 2, 0);
    STR(b, "500/s");
}

static void etas(void) {
    char b[32];
    progress_fmt_eta(b, sizeof b, 0);
    STR(b, "0:00");
    progress_fmt_eta(b, sizeof b, 7.2);
    STR(b, "0:07");
    progress_fmt_eta(b, sizeof b, 754);
    STR(b, "12:34");
    progress_fmt_eta(b, sizeof b, 3723);
    STR(b, "1:02:03");
    progress_fmt_eta(b, sizeof b, -1);
    STR(b, "--:--");
    progress_fmt_eta(b, sizeof b, NAN);
    STR(b, "--:--");
    progress_fmt_eta(b, sizeof b, 1e9);
    STR(b, "--:--");
}

static void lines(void) {
    char b[256];
    const uint64_t G = 1ull << 30;
    /* plain: label, done/total, percent, rate */
    progress_fmt_line(b, sizeof b, "downloading x", 3 * G / 2, 3 * G, 1, 3, 0);
    STR(b, "downloading x: 1.50 GiB/3.00 GiB (50%), 512 MiB/s");
    progress_fmt_line(b, sizeof b, "n", 5, 0, 0, 2, 0);
    STR(b, "n: 5, 2.5/s");
    /* terminal: bar, percent, done/total, rate, ETA, within the width */
    progress_fmt_line(b, sizeof b, "loading m", 3 * G / 2, 3 * G, 1, 3, 100);
    STR(b, "loading m [###############...............]  50%  1.50 GiB/3.00 GiB  512 MiB/s  ETA "
           "0:03");
    size_t k = progress_fmt_line(b, sizeof b, "loading m", 3 * G / 2, 3 * G, 1, 3, 72);
    CHECK(k <= 72 && strlen(b) == k);
    CHECK(strstr(b, "loading m [") == b && strstr(b, " 50%") && strstr(b, "ETA 0:03"));
    /* too narrow for a bar: the statistics, cut to the width */
    k = progress_fmt_line(b, sizeof b, "a rather long label", 1, 4, 0, 1, 40);
    CHECK(k <= 40 && !strchr(b, '['));
    /* done at the start, and past the total */
    progress_fmt_line(b, sizeof b, "q", 0, 10, 0, 0, 80);
    CHECK(strstr(b, "  0%") && strstr(b, "ETA --:--") && strstr(b, "0/10"));
    progress_fmt_line(b, sizeof b, "q", 12, 10, 0, 1, 80);
    CHECK(strstr(b, "100%") && strstr(b, "ETA 0:00"));
    /* unknown total: no bar, percent or ETA */
    progress_fmt_line(b, sizeof b, "dl", 2048, 0, 1, 1, 80);
    STR(b, "dl  2.00 KiB  2.00 KiB/s");
    /* final lines */
    progress_fmt_final(b, sizeof b, "quantizing m", 7 * G / 2, 7 * G / 2, 1, 10, 1);
    STR(b, "quantizing m: 3.50 GiB in 10.0 s, 358 MiB/s");
    progress_fmt_final(b, sizeof b, "loading m", G, 3 * G, 1, 3, 0);
    STR(b, "loading m: failed at 1.00 GiB/3.00 GiB after 3.0 s");
    progress_fmt_final(b, sizeof b, "t", 291, 291, 0, 75, 1);
    STR(b, "t: 291 in 1:15, 3.9/s");
}

/* The fake clock the drawing tests move. */
static double clock_s;
static double fake_now(void) {
    return clock_s;
}

/* Everything written to the pipe's read end so far. */
static size_t drain(int fd, char *buf, size_t len) {
    size_t n = 0;
    ssize_t k;
    while (n + 1 < len && (k = read(fd, buf + n, len - 1 - n)) > 0) n += (size_t)k;
    buf[n] = 0;
    return n;
}

static int count(const char *s, char c) {
    int n = 0;
    for (; *s; s++) n += *s == c;
    return n;
}

static void plain_mode(void) {
    int fd[2];
    CHECK(pipe(fd) == 0);
    fcntl(fd[0], F_SETFL, O_NONBLOCK);
    char out[4096];
    clock_s = 100;
    progress *p = progress_start_fd("downloading m", 1000, PROGRESS_BYTES, fd[1], 0, 0, fake_now);
    CHECK(p != NULL);
    for (int i = 1; i <= 120; i++) { /* 12 s in steps of 0.1 s */
        clock_s = 100 + i * 0.1;
        progress_set(p, (uint64_t)i * 8);
    }
    drain(fd[0], out, sizeof out);
    /* a line at 5 s and at 10 s, none before */
    CHECK(count(out, '\n') == 2);
    CHECK(!strchr(out, '\r') && !strchr(out, '\033'));
    CHECK(strncmp(out, "downloading m: 400 B/1000 B (40%), 80 B/s\n", 42) == 0);
    progress_end(p, 1);
    drain(fd[0], out, sizeof out);
    STR(out, "downloading m: 960 B in 12.0 s, 80 B/s\n");

    /* a quick one writes its final line alone */
    clock_s = 0;
    p = progress_start_fd("x", 3, 0, fd[1], 0, 0, fake_now);
    progress_set(p, 1);
    progress_set(p, 3);
    clock_s = 0.5;
    progress_end(p, 0);
    drain(fd[0], out, sizeof out);
    STR(out, "x: failed at 3/3 after 0.5 s\n");

    /* terminals only: nothing off a terminal */
    CHECK(progress_start_fd("q", 10, PROGRESS_TTY_ONLY, fd[1], 0, 0, fake_now) == NULL);
    progress_set(NULL, 1); /* NULL-safe */
    progress_set_total(NULL, 1);
    progress_end(NULL, 1);
    close(fd[0]);
    close(fd[1]);
}

static void tty_mode(void) {
    int fd[2];
    CHECK(pipe(fd) == 0);
    fcntl(fd[0], F_SETFL, O_NONBLOCK);
    char out[16384];
    clock_s = 0;
    progress *p = progress_start_fd("quantizing m", 100, PROGRESS_TTY_ONLY, fd[1], 1, 72, fake_now);
    CHECK(p != NULL);
    for (int i = 0; i <= 100; i++) { /* a second in steps of 10 ms: about ten redraws */
        clock_s = i * 0.01;
        progress_set(p, (uint64_t)i);
    }
    size_t n = drain(fd[0], out, sizeof out);
    int draws = count(out, '\r');
    CHECK(draws >= 9 && draws <= 12);
    CHECK(!strchr(out, '\n'));
    CHECK(n > 3 && !strcmp(out + n - 3, "\033[K"));
    /* each line fits the width, one column short */
    for (char *s = strchr(out, '\r'); s; s = strchr(s + 1, '\r')) {
        char *e = strstr(s, "\033[K");
        CHECK(e && e - s - 1 <= 71);
    }
    progress_end(p, 1);
    drain(fd[0], out, sizeof out);
    STR(out, "\rquantizing m: 100 in 1.0 s, 100/s\033[K\n");

    /* delayed: nothing within the first second, the final line neither */
    clock_s = 0;
    p = progress_start_fd("loading m", 100, PROGRESS_BYTES | PROGRESS_DELAYED, fd[1], 1, 80,
                          fake_now);
    clock_s = 0.5;
    progress_set(p, 50);
    clock_s = 0.9;
    progress_end(p, 1);
    CHECK(drain(fd[0], out, sizeof out) == 0);
    /* ... and drawn once past it */
    clock_s = 0;
    p = progress_start_fd("loading m", 100, PROGRESS_BYTES | PROGRESS_DELAYED, fd[1], 1, 80,
                          fake_now);
    clock_s = 0.5;
    progress_set(p, 10);
    CHECK(drain(fd[0], out, sizeof out) == 0);
    clock_s = 1.5;
    progress_set(p, 60);
    drain(fd[0], out, sizeof out);
    CHECK(out[0] == '\r' && strstr(out, "loading m [") && strstr(out, " 60%"));
    clock_s = 2;
    progress_end(p, 1);
    drain(fd[0], out, sizeof out);
    STR(out, "\rloading m: 60 B in 2.0 s, 30 B/s\033[K\n");
    close(fd[0]);
    close(fd[1]);
}

/* A log message while a bar is on the terminal (stderr) clears its line first; the next
 * progress_set draws it again below the message. */
static void log_between(void) {
    int fd[2], saved = dup(2);
    CHECK(pipe(fd) == 0 && saved >= 0);
    fcntl(fd[0], F_SETFL, O_NONBLOCK);
    dup2(fd[1], 2);
    char out[4096];
    clock_s = 0;
    progress *p = progress_start_fd("loading m", 100, 0, 2, 1, 80, fake_now);
    clock_s = 0.5;
    progress_set(p, 40);
    log_msg(0, "a message");
    clock_s = 0.52; /* within the redraw interval: drawn again all the same */
    progress_set(p, 41);
    progress_end(p, 1);
    log_msg(0, "after the bar");
    dup2(saved, 2);
    close(saved);
    drain(fd[0], out, sizeof out);
    const char *msg = strstr(out, "\r\033[Klmhost: error: a message\n\rloading m [");
    CHECK(msg != NULL);
    CHECK(msg && strstr(msg, " 41%"));
    CHECK(strstr(out, "\033[K\nlmhost: error: after the bar\n") != NULL); /* no clearing */
    close(fd[0]);
    close(fd[1]);
}

static void logging_off(void) {
    int saved = log_level;
    log_level = 0;
    CHECK(progress_start("downloading", 10, 1) == NULL);
    CHECK(progress_start_flags("loading", 10, PROGRESS_DELAYED) == NULL);
    log_level = saved;
    /* stderr is no terminal here (the test runner's pipe or file): terminal-only bars stay
     * silent, downloads' are made */
    if (!isatty(2)) {
        CHECK(progress_start_tty_only("quantizing", 10, 1) == NULL);
        progress *p = progress_start("downloading", 10, 1);
        CHECK(p != NULL);
        progress_end(p, 1); /* "downloading: 0 B in 0.0 s" or so, on stderr */
    }
}

int main(void) {
    amounts();
    rates();
    etas();
    lines();
    plain_mode();
    tty_mode();
    log_between();
    logging_off();
    if (failures) {
        fprintf(stderr, "%d checks failed\n", failures);
        return 1;
    }
    printf("progress: all checks passed\n");
    return 0;
}
