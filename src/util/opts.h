/* Reading a caller's option struct that starts with `size_t size` (see the
 * "option structs" section of include/q3.h): fields are only appended, so a
 * struct of an older, shorter layout is copied as far as it goes and the rest
 * stays zero (each field's default). */
#ifndef Q3_UTIL_OPTS_H
#define Q3_UTIL_OPTS_H

#include <stddef.h>
#include <string.h>

#include "util/error.h"

/* Copies *src (NULL: all defaults) into dst of dst_size bytes, the library's
 * layout; its size field is set to dst_size. Q3_ERR_INVALID, naming what,
 * when the caller's struct is larger than the library knows or too small to
 * hold its own size. */
static inline q3_status q3_opts_read(void *dst, size_t dst_size, const void *src, const char *what)
{
    memset(dst, 0, dst_size);
    size_t size = dst_size;
    if (src) {
        memcpy(&size, src, sizeof size);
        if (size == 0) size = dst_size;
        if (size > dst_size)
            return q3_fail(Q3_ERR_INVALID, "%s: the struct is %zu bytes but this library knows %zu: the program was "
                           "built against a newer q3.h than the library it runs with", what, size, dst_size);
        if (size < sizeof size)
            return q3_fail(Q3_ERR_INVALID, "%s: size %zu is too small (set it with the struct's q3_*_default())",
                           what, size);
        memcpy(dst, src, size);
    }
    memcpy(dst, &dst_size, sizeof dst_size);
    return Q3_OK;
}

#endif
