/* CHECK(cond) for the plain unit tests: prints the failed condition with its line and counts
 * it in test_failures; main returns test_failures != 0. */
#ifndef LMHOST_TEST_CHECK_H
#define LMHOST_TEST_CHECK_H

#include <stdio.h>

static int test_failures;
#define CHECK(c)                                                                                   \
    do {                                                                                           \
        if (!(c)) {                                                                                \
            fprintf(stderr, "%s:%d: CHECK(%s) failed\n", __FILE__, __LINE__, #c);                  \
            test_failures++;                                                                       \
        }                                                                                          \
    } while (0)

#endif
