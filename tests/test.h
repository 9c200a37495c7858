/* Minimal test harness: CHECK counts, SKIP records what did not run and why,
 * TEST_DONE prints the closing lines. Each tests/test_*.c is its own program;
 * tests/run.sh adds the counts up.
 *
 * Output contract (tests/run.sh parses it): the last line is exactly
 * `N passed, N failed`; when something was skipped, the line before it is
 * `N skipped: reason; reason; ...`. */
#ifndef Q3_TEST_H
#define Q3_TEST_H

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#include "backend/cpu/cpu_features.h"
#endif

static int test_passed, test_failed, test_skipped;
static char test_skip_why[4096]; /* the reasons, "; "-separated */

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

__attribute__((unused)) static void test_skip_add(const char *why)
{
    printf("SKIP %s\n", why);
    test_skipped++;
    size_t n = strlen(test_skip_why);
    snprintf(test_skip_why + n, sizeof test_skip_why - n, "%s%s", n ? "; " : "", why);
}

/* The q3 program under test: $Q3_BIN, else $BUILD/q3 (default build/q3). */
__attribute__((unused)) static const char *q3_bin(void)
{
    static char path[512];
    if (getenv("Q3_BIN")) return getenv("Q3_BIN");
    snprintf(path, sizeof path, "./%s/q3", getenv("BUILD") ? getenv("BUILD") : "build");
    return path;
}

/* Records that part of the suite did not run: SKIP("cuda: device absent").
 * The reason starts with what was skipped, then a colon. */
__attribute__((format(printf, 1, 2), unused)) static void test_skip(const char *fmt, ...)
{
    char why[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    test_skip_add(why);
}
#define SKIP(...) test_skip(__VA_ARGS__)

/* Whether this machine can run an instruction set the build has kernels for
 * ("avx2", "avx512", "amx"), by the cpu unit's own detection (CPUID, XGETBV,
 * and for AMX the OS's permission). 0 for anything the build does not support. */
__attribute__((unused)) static int test_machine_has_isa(const char *isa)
{
#if defined(__x86_64__) || defined(__i386__)
    const q3_cpu_features *f = q3_cpu_features_get();
    if (!strcmp(isa, "avx2")) return q3_cpu_has_avx2_path(f);
    if (!strcmp(isa, "avx512")) return q3_cpu_has_avx512_path(f);
    if (!strcmp(isa, "amx")) return q3_cpu_has_amx_path(f);
#endif
    (void)isa;
    return 0;
}

/* A skip because an instruction set is missing: SKIP_ISA("avx512", "not on
 * this CPU") records "avx512: not on this CPU". With Q3_REQUIRE_ISA=1 in the
 * environment (CI) it is a failure instead when the machine has the ISA and the
 * build supports it: the suite skipped something it could have run. */
__attribute__((format(printf, 4, 5), unused)) static void test_skip_isa(const char *file, int line, const char *isa,
                                                                        const char *fmt, ...)
{
    char why[512];
    int n = snprintf(why, sizeof why, "%s: ", isa);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why + n, sizeof why - (size_t)n, fmt, ap);
    va_end(ap);
    const char *req = getenv("Q3_REQUIRE_ISA");
    if (req && *req && strcmp(req, "0") && test_machine_has_isa(isa)) {
        test_failed++;
        fprintf(stderr, "FAIL %s:%d: skipped \"%s\", but this CPU has %s and the build supports it (Q3_REQUIRE_ISA)\n",
                file, line, why, isa);
        return;
    }
    test_skip_add(why);
}
#define SKIP_ISA(isa, ...) test_skip_isa(__FILE__, __LINE__, (isa), __VA_ARGS__)

#define TEST_DONE()                                                        \
    do {                                                                   \
        if (test_skipped) printf("%d skipped: %s\n", test_skipped, test_skip_why); \
        printf("%d passed, %d failed\n", test_passed, test_failed);       \
        return test_failed ? 1 : 0;                                        \
    } while (0)

/* Where test data lives, relative to the repository root (tests run from there). */
#define TEST_DATA "tests/data"

#endif
