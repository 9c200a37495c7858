/* Minimal test harness: CHECK counts, TEST_DONE prints the closing line.
 * Each tests/test_*.c is its own program; tests/run.sh adds the counts up. */
#ifndef Q3_TEST_H
#define Q3_TEST_H

#include <stdio.h>
#include <string.h>

static int test_passed, test_failed;

#define CHECK(cond, ...)                                                   \
    do {                                                                   \
        if (cond) {                                                        \
            test_passed++;                                                 \
        } else {                                                           \
            test_failed++;                                                 \
            fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond); \
            fprintf(stderr, __VA_ARGS__);                                  \
            fputc('\n', stderr);                                           \
        }                                                                  \
    } while (0)

/* Checks that s contains needle (for error messages). */
#define CHECK_CONTAINS(s, needle)                                          \
    CHECK(strstr((s), (needle)) != NULL, "\"%s\" does not contain \"%s\"", (s), (needle))

#define TEST_DONE()                                                        \
    do {                                                                   \
        printf("%d passed, %d failed\n", test_passed, test_failed);       \
        return test_failed ? 1 : 0;                                        \
    } while (0)

/* Where test data lives, relative to the repository root (tests run from there). */
#define TEST_DATA "tests/data"

#endif
