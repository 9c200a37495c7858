/* A growable NUL-terminated string buffer. An allocation failure is sticky:
 * the buffer stops growing, oom is set, and the caller reports it once at the
 * end instead of checking every append.
 *
 *     q3_strbuf b = {0};
 *     q3_strbuf_puts(&b, "<|im_start|>");
 *     q3_strbuf_printf(&b, "%d", n);
 *     if (b.oom) ... else use b.data (b.len bytes; NULL if nothing was written)
 *     free(b.data);
 */
#ifndef Q3_UTIL_STRBUF_H
#define Q3_UTIL_STRBUF_H

#include <stddef.h>

typedef struct q3_strbuf {
    char *data; /* NUL-terminated; NULL until the first append */
    size_t len, cap;
    int oom;    /* an allocation failed: the text is incomplete */
} q3_strbuf;

void q3_strbuf_put(q3_strbuf *b, const char *s, size_t n);
void q3_strbuf_puts(q3_strbuf *b, const char *s);
void q3_strbuf_printf(q3_strbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif
