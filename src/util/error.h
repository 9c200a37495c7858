/* Error reporting: library code records a message and returns a status;
 * only the CLI prints. */
#ifndef Q3_UTIL_ERROR_H
#define Q3_UTIL_ERROR_H

#include "util/status.h"

/* Records the formatted message as this thread's last error and returns st,
 * so that failures read `return q3_fail(Q3_ERR_FORMAT, "%s: ...", path);`. */
q3_status q3_fail(q3_status st, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Prefixes the current last error with more context ("loading X: <old>"). */
q3_status q3_fail_wrap(q3_status st, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

void q3_clear_error(void);

/* The library's NULL rule (q3.h): a NULL handle or out-pointer passed to a
 * function that returns a status fails with Q3_ERR_INVALID naming it. */
#define Q3_NOT_NULL(p)                                                                      \
    do {                                                                                    \
        if (!(p)) return q3_fail(Q3_ERR_INVALID, "%s: %s is NULL", __func__, #p);           \
    } while (0)

#endif
