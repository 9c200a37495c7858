/* The server's growable byte buffer (response bodies, SSE streams, metrics):
 * NUL-terminated, and an allocation failure is sticky (oom set, later appends
 * do nothing), so a writer checks once at the end. The server builds against
 * the public q3.h alone, so it keeps its own rather than the library's. */
#ifndef Q3_SERVER_BUF_H
#define Q3_SERVER_BUF_H

#include <stddef.h>

typedef struct srv_buf {
    char *data; /* NUL-terminated; NULL until the first append */
    size_t len, cap;
    int oom;    /* an allocation failed: the text is incomplete */
} srv_buf;

void srv_buf_put(srv_buf *b, const char *s, size_t n);
void srv_buf_puts(srv_buf *b, const char *s);
void srv_buf_printf(srv_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif
