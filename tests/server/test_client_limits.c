/* The per-client rate limiter (core/server/client_limits.c): a full minute's burst, then one
 * request every 60/N seconds with the wait it reports; addresses apart; a table full of
 * addresses gives way to new ones. */
#include "client_limits.h"
#include "../test_check.h"

#include <stdio.h>

int main(void) {
    rate_limiter *r = rl_new(6); /* 6 a minute: one every 10 s */
    for (int i = 0; i < 6; i++) CHECK(rl_take(r, "10.0.0.1", 100.0) == 0);
    CHECK(rl_take(r, "10.0.0.1", 100.0) == 10);
    CHECK(rl_take(r, "10.0.0.1", 104.0) == 6);
    CHECK(rl_take(r, "10.0.0.2", 104.0) == 0); /* another address has its own bucket */
    CHECK(rl_take(r, "10.0.0.1", 110.5) == 0); /* a token refilled */
    CHECK(rl_take(r, "10.0.0.1", 110.5) >= 1);
    /* 20,000 addresses in an 8,192-slot table: each new one is served */
    char a[48];
    int refused = 0;
    for (int i = 0; i < 20000; i++) {
        snprintf(a, sizeof a, "2001:db8::%x", i);
        refused += rl_take(r, a, 200.0 + i * 1e-3) != 0;
    }
    CHECK(refused == 0);
    rl_free(r);
    CHECK(limits_open_fds() > 2); /* stdin, stdout, stderr at least */
    CHECK(limits_raise_nofile() > 0);
    if (test_failures) return 1;
    printf("ok: client limits\n");
    return 0;
}
