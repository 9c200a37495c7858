#include "util/file.h"
#include "util/error.h"
#include "util/strbuf.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

q3_status q3_read_file(const char *path, size_t max_bytes, char **out, size_t *len)
{
    *out = NULL;
    if (len) *len = 0;
    int fd = open(path, O_RDONLY);
    if (fd < 0) return q3_fail(Q3_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return q3_fail(Q3_ERR_IO, "%s: not a regular file", path);
    }
    if ((unsigned long long)st.st_size > max_bytes) {
        close(fd);
        return q3_fail(Q3_ERR_FORMAT, "%s: file is %lld bytes, more than the %zu allowed",
                       path, (long long)st.st_size, max_bytes);
    }
    size_t n = (size_t)st.st_size;
    char *buf = malloc(n + 1);
    if (!buf) { close(fd); return q3_fail(Q3_ERR_NOMEM, "%s: out of memory", path); }
    size_t got = 0;
    while (got < n) {
        ssize_t r = read(fd, buf + got, n - got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            free(buf);
            close(fd);
            return q3_fail(Q3_ERR_IO, "%s: read failed", path);
        }
        got += (size_t)r;
    }
    close(fd);
    buf[n] = 0;
    *out = buf;
    if (len) *len = n;
    return Q3_OK;
}

q3_status q3_read_stream(FILE *f, const char *name, size_t max_bytes, char **out, size_t *len)
{
    *out = NULL;
    if (len) *len = 0;
    q3_strbuf b = {0};
    char chunk[65536];
    q3_strbuf_put(&b, "", 0);
    for (;;) {
        size_t got = fread(chunk, 1, sizeof chunk, f);
        if (got > max_bytes - b.len) {
            free(b.data);
            return q3_fail(Q3_ERR_FORMAT, "%s: more than the %zu bytes allowed", name, max_bytes);
        }
        q3_strbuf_put(&b, chunk, got);
        if (b.oom) {
            free(b.data);
            return q3_fail(Q3_ERR_NOMEM, "%s: out of memory", name);
        }
        if (got < sizeof chunk) { /* the end, or an error */
            if (ferror(f)) {
                free(b.data);
                return q3_fail(Q3_ERR_IO, "%s: read failed: %s", name, strerror(errno));
            }
            break;
        }
    }
    *out = b.data;
    if (len) *len = b.len;
    return Q3_OK;
}

q3_status q3_map_file(const char *path, q3_mapping *out)
{
    out->data = NULL;
    out->size = 0;
    int fd = open(path, O_RDONLY);
    if (fd < 0) return q3_fail(Q3_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return q3_fail(Q3_ERR_IO, "%s: not a regular file", path);
    }
    out->size = (size_t)st.st_size;
    if (out->size > 0) {
        void *p = mmap(NULL, out->size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (p == MAP_FAILED) {
            close(fd);
            return q3_fail(Q3_ERR_IO, "%s: mmap failed: %s", path, strerror(errno));
        }
        out->data = p;
    }
    close(fd);
    return Q3_OK;
}

void q3_unmap_file(q3_mapping *m)
{
    if (m->data) munmap(m->data, m->size);
    m->data = NULL;
    m->size = 0;
}

int q3_is_dir(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

int q3_file_exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}
