#include "client_limits.h"

#include <dirent.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

int limits_open_fds(void) {
    DIR *d = opendir("/proc/self/fd");
    if (!d) return -1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (e->d_name[0] != '.') n++;
    closedir(d);
    return n - 1; /* the directory's own descriptor */
}

long limits_raise_nofile(void) {
    struct rlimit r;
    if (getrlimit(RLIMIT_NOFILE, &r)) return -1;
    if (r.rlim_cur < r.rlim_max) {
        struct rlimit want = r;
        want.rlim_cur = r.rlim_max == RLIM_INFINITY ? 1048576 : r.rlim_max;
        if (setrlimit(RLIMIT_NOFILE, &want) == 0) r = want;
    }
    return r.rlim_cur == RLIM_INFINITY ? 1048576 : (long)r.rlim_cur;
}

enum { SLOTS = 8192, PROBE = 32 };

typedef struct {
    char addr[48]; /* "" when free */
    double tokens, last;
} bucket;

struct rate_limiter {
    double per_s, burst;
    bucket b[SLOTS];
};

rate_limiter *rl_new(int per_minute) {
    rate_limiter *r = calloc(1, sizeof *r);
    if (!r) return NULL;
    r->per_s = per_minute / 60.0;
    r->burst = per_minute;
    return r;
}

void rl_free(rate_limiter *r) {
    free(r);
}

static unsigned hash(const char *s) {
    unsigned h = 2166136261u;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 16777619u;
    return h;
}

int rl_take(rate_limiter *r, const char *addr, double now) {
    unsigned h = hash(addr);
    bucket *hit = NULL, *oldest = NULL;
    for (int i = 0; i < PROBE && !hit; i++) {
        bucket *b = &r->b[(h + (unsigned)i) % SLOTS];
        if (!strncmp(b->addr, addr, sizeof b->addr - 1))
            hit = b;
        else if (!oldest || !b->addr[0] || (oldest->addr[0] && b->last < oldest->last))
            oldest = b;
    }
    if (!hit) { /* a new address, in a free slot or the least recently seen one's */
        hit = oldest;
        strncpy(hit->addr, addr, sizeof hit->addr - 1);
        hit->addr[sizeof hit->addr - 1] = 0;
        hit->tokens = r->burst;
        hit->last = now;
    }
    hit->tokens += (now - hit->last) * r->per_s;
    if (hit->tokens > r->burst) hit->tokens = r->burst;
    hit->last = now;
    if (hit->tokens >= 1) {
        hit->tokens -= 1;
        return 0;
    }
    int wait = (int)ceil((1 - hit->tokens) / r->per_s);
    return wait < 1 ? 1 : wait;
}
