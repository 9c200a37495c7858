/* Hostile input, round 2: what a user, a file or a pipe can hand the command
 * line, checked end to end through build/q3 (Q3_BIN overrides the binary). */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "test.h"

#define E2E TEST_DATA "/golden/e2e"

static const char *q3_bin(void)
{
    static char path[512];
    if (getenv("Q3_BIN")) return getenv("Q3_BIN");
    snprintf(path, sizeof path, "./%s/q3", getenv("BUILD") ? getenv("BUILD") : "build");
    return path;
}

/* Runs the shell command made from fmt (its %s: the q3 binary)
 * and returns its exit status (-1: killed); *out receives
 * stdout and stderr (static, valid until the next call). */
static char outbuf[1 << 16];
static int sh(const char **out, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int sh(const char **out, const char *fmt, ...)
{
    char cmd[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    char full[4200];
    snprintf(full, sizeof full, "%s 2>&1", cmd);
    FILE *f = popen(full, "r");
    size_t got = f ? fread(outbuf, 1, sizeof outbuf - 1, f) : 0;
    outbuf[got] = 0;
    int status = f ? pclose(f) : -1;
    *out = outbuf;
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

static int count(const char *s, const char *needle)
{
    int n = 0;
    for (const char *p = s; (p = strstr(p, needle)); p++) n++;
    return n;
}

/* Item 13: an answer cut inside a character does not poison the history. */
static void test_chat_cut_character(void)
{
    const char *out;
    int rc = sh(&out, "printf 'Hello\\nNext\\nThird\\n' | %s chat -m " E2E " --seed 3 -n 54", q3_bin());
    CHECK(rc == 0, "chat exit %d: %s", rc, out);
    CHECK(count(out, "[prefill:") == 3, "three answers: %s", out);
    CHECK(!strstr(out, "invalid UTF-8"), "no encode error: %s", out);
}

int main(void)
{
    test_chat_cut_character();
    TEST_DONE();
}
