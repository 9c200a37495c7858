#include "util/file.h"
#include "util/error.h"
#include "util/strbuf.h"

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
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
    int fd;
    size_t size;
    q3_status s = q3_open_regular(path, &fd, &size);
    if (s) return s;
    if (size > max_bytes) {
        close(fd);
        return q3_fail(Q3_ERR_FORMAT, "%s: file is %zu bytes, more than the %zu allowed", path, size, max_bytes);
    }
    size_t n = size;
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

/* ---- the table of mapped files (read by a SIGBUS handler) ------------------- */

enum { MAP_SLOTS = 4096 + 64 }; /* the most shards a model may have, and some */
enum { MAP_FREE = 0, MAP_FILLING = 1, MAP_LIVE = 2 };

static struct {
    int state;
    uintptr_t begin, end;
    char *path;
} map_table[MAP_SLOTS];

static int map_register(const void *data, size_t size, const char *path)
{
    char *copy = strdup(path);
    if (!copy) return 0;
    for (int i = 0; i < MAP_SLOTS; i++) {
        int expected = MAP_FREE;
        if (__atomic_compare_exchange_n(&map_table[i].state, &expected, MAP_FILLING, 0, __ATOMIC_ACQUIRE,
                                        __ATOMIC_RELAXED)) {
            map_table[i].begin = (uintptr_t)data;
            map_table[i].end = (uintptr_t)data + size;
            map_table[i].path = copy;
            __atomic_store_n(&map_table[i].state, MAP_LIVE, __ATOMIC_RELEASE);
            return i + 1;
        }
    }
    free(copy); /* a full table: the file is still mapped, only not named on SIGBUS */
    return 0;
}

static void map_release(int slot)
{
    if (slot <= 0 || slot > MAP_SLOTS) return;
    char *path = map_table[slot - 1].path;
    __atomic_store_n(&map_table[slot - 1].state, MAP_FREE, __ATOMIC_RELEASE);
    free(path);
}

const char *q3_mapped_file_at(const void *addr)
{
    uintptr_t a = (uintptr_t)addr;
    for (int i = 0; i < MAP_SLOTS; i++)
        if (__atomic_load_n(&map_table[i].state, __ATOMIC_ACQUIRE) == MAP_LIVE && a >= map_table[i].begin &&
            a < map_table[i].end)
            return map_table[i].path;
    return NULL;
}

q3_status q3_map_file(const char *path, q3_mapping *out)
{
    out->data = NULL;
    out->size = 0;
    out->slot = 0;
    int fd;
    q3_status s = q3_open_regular(path, &fd, &out->size);
    if (s) return s;
    if (out->size > 0) {
        void *p = mmap(NULL, out->size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (p == MAP_FAILED) {
            close(fd);
            out->size = 0;
            return q3_fail(Q3_ERR_IO, "%s: mmap failed: %s", path, strerror(errno));
        }
        /* 2 MB pages where the page cache holds 2 MB folios of the file (it
           does when it read them from disk): a decode step streams every
           weight, and 4 KB pages cost it a TLB miss each */
        q3_memory_prefer_huge_pages(p, out->size);
        out->data = p;
        out->slot = map_register(p, out->size, path);
    }
    close(fd);
    return Q3_OK;
}

void q3_unmap_file(q3_mapping *m)
{
    map_release(m->slot);
    if (m->data) munmap(m->data, m->size);
    m->data = NULL;
    m->size = 0;
    m->slot = 0;
}

/* ---- what is at a path ------------------------------------------------------ */

const char *q3_file_kind(unsigned mode)
{
    switch (mode & S_IFMT) {
    case S_IFREG: return "is a regular file";
    case S_IFDIR: return "is a folder";
    case S_IFIFO: return "is a FIFO";
    case S_IFCHR: return "is a character device";
    case S_IFBLK: return "is a block device";
    case S_IFSOCK: return "is a socket";
    case S_IFLNK: return "is a symbolic link";
    default: return "is not a regular file";
    }
}

q3_status q3_open_regular(const char *path, int *fd, size_t *size)
{
    *fd = -1;
    if (size) *size = 0;
    int f = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (f < 0) return q3_fail(Q3_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(f, &st) != 0) {
        q3_status s = q3_fail(Q3_ERR_IO, "%s: cannot stat: %s", path, strerror(errno));
        close(f);
        return s;
    }
    if (!S_ISREG(st.st_mode)) {
        close(f);
        return q3_fail(Q3_ERR_IO, "%s: %s, not a regular file", path, q3_file_kind(st.st_mode));
    }
    int fl = fcntl(f, F_GETFL);
    if (fl >= 0) fcntl(f, F_SETFL, fl & ~O_NONBLOCK);
    *fd = f;
    if (size) *size = (size_t)st.st_size;
    return Q3_OK;
}

q3_status q3_regular_or_absent(const char *path, int *present)
{
    *present = 0;
    struct stat st;
    if (stat(path, &st) != 0) {
        if (errno == ENOENT) return Q3_OK;
        return q3_fail(Q3_ERR_IO, "%s: %s", path, q3_path_problem(path));
    }
    if (!S_ISREG(st.st_mode))
        return q3_fail(Q3_ERR_IO, "%s: %s, not a regular file", path, q3_file_kind(st.st_mode));
    *present = 1;
    return Q3_OK;
}

const char *q3_path_problem(const char *path)
{
    struct stat st;
    if (stat(path, &st) != 0) return errno == ENOENT ? "no such file or folder" : strerror(errno);
    return q3_file_kind(st.st_mode);
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

void q3_memory_prefer_huge_pages(void *p, size_t n)
{
#ifdef MADV_HUGEPAGE
    madvise(p, n, MADV_HUGEPAGE);
#else
    (void)p, (void)n;
#endif
}

void q3_mapped_pages_release(const void *p, size_t n)
{
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE), a = ((uintptr_t)p + page - 1) & ~(page - 1),
              b = ((uintptr_t)p + n) & ~(page - 1);
    if (n && b > a && q3_mapped_file_at(p) && q3_mapped_file_at((const char *)p + n - 1))
        madvise((void *)a, b - a, MADV_DONTNEED);
}
