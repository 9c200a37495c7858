#include "util/error.h"

#include "q3.h" /* q3_last_error, q3_status_name: public */

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static _Thread_local char last_error[1024];

const char *q3_last_error(void) { return last_error; }

void q3_clear_error(void) { last_error[0] = 0; }

q3_status q3_fail(q3_status st, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof last_error, fmt, ap);
    va_end(ap);
    return st;
}

q3_status q3_fail_wrap(q3_status st, const char *fmt, ...)
{
    char prefix[512], old[sizeof last_error];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    memcpy(old, last_error, sizeof old);
    size_t n = strlen(prefix);
    memcpy(last_error, prefix, n);
    if (n + 2 < sizeof last_error) {
        memcpy(last_error + n, ": ", 2);
        n += 2;
    }
    size_t m = strlen(old);
    if (m > sizeof last_error - 1 - n) m = sizeof last_error - 1 - n;
    memcpy(last_error + n, old, m);
    last_error[n + m] = 0;
    return st;
}

const char *q3_status_name(q3_status st)
{
    switch (st) {
    case Q3_OK: return "ok";
    case Q3_ERR_IO: return "i/o error";
    case Q3_ERR_FORMAT: return "malformed input";
    case Q3_ERR_INVALID: return "invalid argument";
    case Q3_ERR_UNSUPPORTED: return "unsupported";
    case Q3_ERR_NOMEM: return "out of memory";
    case Q3_ERR_CONTEXT: return "context full";
    case Q3_ERR_KV_FULL: return "KV pool full";
    }
    return "unknown status";
}
