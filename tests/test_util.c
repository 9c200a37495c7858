/* src/util: the growable string buffer and reading a stream to its end. */
#include <stdint.h>
#include <stdlib.h>

#include "q3.h"
#include "test.h"
#include "util/error.h"
#include "util/file.h"
#include "util/strbuf.h"

static void test_strbuf(void)
{
    q3_strbuf b = {0};
    CHECK(b.data == NULL && b.len == 0, "empty until the first append");
    q3_strbuf_put(&b, "", 0);
    CHECK(b.data && b.len == 0 && b.data[0] == 0, "an empty append makes an empty string");
    q3_strbuf_puts(&b, "abc");
    q3_strbuf_put(&b, "de\0f", 4); /* NULs are bytes like any other */
    CHECK(b.len == 7 && !memcmp(b.data, "abcde\0f", 8), "appends in order, NUL-terminated");
    q3_strbuf_printf(&b, "[%d|%s|%05.1f]", -42, "x", 2.5);
    CHECK(b.len == 7 + 13 && !strcmp(b.data + 7, "[-42|x|002.5]"), "printf appends: '%s'", b.data + 7);
    /* growth across many doublings keeps every byte */
    size_t before = b.len;
    for (int i = 0; i < 10000; i++) q3_strbuf_printf(&b, "%04d", i);
    int ok = b.len == before + 40000 && b.data[b.len] == 0 && !b.oom;
    for (int i = 0; i < 10000 && ok; i++) {
        char want[8];
        snprintf(want, sizeof want, "%04d", i);
        ok = !memcmp(b.data + before + 4 * (size_t)i, want, 4);
    }
    CHECK(ok, "40000 bytes appended in 10000 printfs, all in place");
    CHECK(b.cap >= b.len + 1, "capacity covers the text and its NUL");
    /* a size no allocation can hold sets oom and leaves the text as it was */
    size_t len = b.len;
    q3_strbuf_put(&b, "", SIZE_MAX - 8);
    CHECK(b.oom && b.len == len && b.data[len] == 0, "an impossible size: oom, text unchanged");
    q3_strbuf_puts(&b, "more");
    CHECK(b.len == len, "after oom, appends are dropped");
    free(b.data);
}

static FILE *stream_of(const char *s, size_t n)
{
    FILE *f = tmpfile();
    if (!f) return NULL;
    if (n) fwrite(s, 1, n, f);
    rewind(f);
    return f;
}

static void test_read_stream(void)
{
    char *text = NULL;
    size_t len = 99;
    FILE *f = stream_of("", 0);
    CHECK(f && q3_read_stream(f, "empty", 100, &text, &len) == Q3_OK && text && len == 0 && text[0] == 0,
          "an empty stream reads as an empty string");
    free(text);
    if (f) fclose(f);

    /* 200000 bytes with NULs: several chunks */
    size_t n = 200000;
    char *big = malloc(n);
    for (size_t i = 0; i < n; i++) big[i] = (char)(i * 7 % 251);
    f = stream_of(big, n);
    text = NULL;
    CHECK(f && q3_read_stream(f, "big", n, &text, &len) == Q3_OK && len == n && !memcmp(text, big, n) && !text[n],
          "a stream of exactly max_bytes reads whole");
    free(text);
    if (f) fclose(f);

    f = stream_of(big, n);
    text = (char *)1;
    q3_status st = f ? q3_read_stream(f, "stdin", n - 1, &text, &len) : Q3_ERR_IO;
    CHECK(st == Q3_ERR_FORMAT && text == NULL, "one byte over max_bytes is refused: %s", q3_status_name(st));
    CHECK_CONTAINS(q3_last_error(), "stdin: more than the 199999 bytes allowed");
    if (f) fclose(f);

    /* a folder opened as a stream: reading it fails (EISDIR), an error, not a hang */
    f = fopen("tests", "r");
    text = (char *)1;
    st = f ? q3_read_stream(f, "tests", 100, &text, &len) : Q3_OK;
    CHECK(st == Q3_ERR_IO && text == NULL, "a stream that cannot be read: %s", q3_status_name(st));
    CHECK_CONTAINS(q3_last_error(), "tests: read failed");
    if (f) fclose(f);
    free(big);
}

int main(void)
{
    test_strbuf();
    test_read_stream();
    TEST_DONE();
}
