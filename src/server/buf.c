#include "buf.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A pointer to room for n more bytes and the NUL at the end of b (the
 * caller then adds n to len), or NULL once an allocation failed. */
static char *room(srv_buf *b, size_t n)
{
    if (b->oom || n >= SIZE_MAX / 2 - b->len) goto fail;
    size_t need = b->len + n + 1;
    if (need > b->cap) {
        size_t cap = b->cap < 128 ? 128 : b->cap;
        while (cap < need) cap += cap / 2 + 64;
        char *p = realloc(b->data, cap);
        if (!p) goto fail;
        b->data = p;
        b->cap = cap;
    }
    return b->data + b->len;
fail:
    b->oom = 1;
    return NULL;
}

void srv_buf_put(srv_buf *b, const char *s, size_t n)
{
    if (!n) return; /* s may be NULL then */
    char *p = room(b, n);
    if (!p) return;
    memcpy(p, s, n);
    b->len += n;
    p[n] = 0;
}

void srv_buf_puts(srv_buf *b, const char *s) { srv_buf_put(b, s, strlen(s)); }

void srv_buf_printf(srv_buf *b, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    char *p = n < 0 ? NULL : room(b, (size_t)n);
    if (!p) { b->oom = 1; return; }
    va_start(ap, fmt);
    vsnprintf(p, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
}
