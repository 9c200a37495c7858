/* Output files written under a unique temporary name and renamed when
 * complete. See outfile.h. */
#include "util/outfile.h"
#include "util/error.h"
#include "util/file.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

struct q3_outfile {
    int fd;
    int slot;   /* index in the temp table, or -1 when it did not fit */
    char *path; /* final name */
    char *tmp;  /* unique temporary name in the same folder */
};

/* ---- the table of live temporary files (read by signal handlers) -------- */

enum { TEMP_SLOTS = 64 };
enum { SLOT_FREE = 0, SLOT_FILLING = 1, SLOT_LIVE = 2 };

static int temp_state[TEMP_SLOTS];
static char temp_path[TEMP_SLOTS][PATH_MAX];

static int temp_register(const char *tmp)
{
    size_t n = strlen(tmp);
    if (n >= PATH_MAX) return -1;
    for (int i = 0; i < TEMP_SLOTS; i++) {
        int expected = SLOT_FREE;
        if (__atomic_compare_exchange_n(&temp_state[i], &expected, SLOT_FILLING, 0, __ATOMIC_ACQUIRE,
                                        __ATOMIC_RELAXED)) {
            memcpy(temp_path[i], tmp, n + 1);
            __atomic_store_n(&temp_state[i], SLOT_LIVE, __ATOMIC_RELEASE);
            return i;
        }
    }
    return -1; /* more live outputs than slots: still written safely, just not removed on a signal */
}

static void temp_release(int slot)
{
    if (slot >= 0) __atomic_store_n(&temp_state[slot], SLOT_FREE, __ATOMIC_RELEASE);
}

void q3_outfile_remove_temps(void)
{
    for (int i = 0; i < TEMP_SLOTS; i++)
        if (__atomic_load_n(&temp_state[i], __ATOMIC_ACQUIRE) == SLOT_LIVE) unlink(temp_path[i]);
}

/* ---- checks ------------------------------------------------------------- */

/* The folder part of path ("." when it has none), in buf. */
static q3_status folder_of(const char *path, char *buf, size_t cap)
{
    const char *slash = strrchr(path, '/');
    if (!slash) {
        snprintf(buf, cap, ".");
        return Q3_OK;
    }
    size_t n = slash == path ? 1 : (size_t)(slash - path);
    if (n >= cap) return q3_fail(Q3_ERR_INVALID, "%s: path too long", path);
    memcpy(buf, path, n);
    buf[n] = 0;
    return Q3_OK;
}

q3_status q3_outfile_check(const char *path)
{
    if (!path || !*path) return q3_fail(Q3_ERR_INVALID, "the output path is empty");
    size_t len = strlen(path);
    if (len >= PATH_MAX) return q3_fail(Q3_ERR_INVALID, "%.80s...: output path too long", path);
    if (path[len - 1] == '/') return q3_fail(Q3_ERR_INVALID, "%s: is a folder, not a file name", path);
    struct stat st;
    if (lstat(path, &st) == 0) {
        if (S_ISDIR(st.st_mode)) return q3_fail(Q3_ERR_INVALID, "%s: is a folder, not a file name", path);
        if (!S_ISREG(st.st_mode) && !S_ISLNK(st.st_mode)) /* a symlink is replaced, never followed */
            return q3_fail(Q3_ERR_INVALID, "%s: %s; q3 writes regular files only", path,
                           q3_file_kind(st.st_mode));
    } else if (errno != ENOENT && errno != ENOTDIR) { /* those two: the folder check below says which */
        return q3_fail(Q3_ERR_IO, "%s: %s", path, strerror(errno));
    }
    char dir[PATH_MAX];
    q3_status s = folder_of(path, dir, sizeof dir);
    if (s) return s;
    if (stat(dir, &st) != 0)
        return q3_fail(Q3_ERR_IO, "%s: its folder %s: %s", path, dir,
                       errno == ENOENT ? "no such folder" : strerror(errno));
    if (!S_ISDIR(st.st_mode)) return q3_fail(Q3_ERR_IO, "%s: %s is not a folder", path, dir);
    if (access(dir, W_OK | X_OK) != 0)
        return q3_fail(Q3_ERR_IO, "%s: cannot write in its folder %s: %s", path, dir, strerror(errno));
    return Q3_OK;
}

/* ---- the temporary file -------------------------------------------------- */

static void random_hex(char *out, size_t n_hex)
{
    unsigned char bytes[16] = {0};
    size_t nb = (n_hex + 1) / 2;
    if (nb > sizeof bytes) nb = sizeof bytes;
    if (getrandom(bytes, nb, GRND_NONBLOCK) != (ssize_t)nb) {
        /* no entropy yet (early boot): still unique enough with O_EXCL retries */
        static unsigned long counter;
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        unsigned long long x = (unsigned long long)ts.tv_nsec ^ ((unsigned long long)getpid() << 32) ^
                               __atomic_add_fetch(&counter, 0x9e3779b97f4a7c15ul, __ATOMIC_RELAXED);
        for (size_t i = 0; i < nb; i++, x = x * 6364136223846793005ull + 1442695040888963407ull)
            bytes[i] = (unsigned char)(x >> 56);
    }
    static const char hex[] = "0123456789abcdef";
    for (size_t i = 0; i < n_hex; i++) out[i] = hex[(bytes[i / 2] >> (i % 2 ? 0 : 4)) & 15];
    out[n_hex] = 0;
}

q3_status q3_outfile_open(const char *path, q3_outfile **out)
{
    *out = NULL;
    q3_status st = q3_outfile_check(path);
    if (st) return st;
    q3_outfile *f = calloc(1, sizeof *f);
    size_t len = strlen(path);
    char *tmp = malloc(len + 64);
    char *final = strdup(path);
    if (!f || !tmp || !final) {
        free(f);
        free(tmp);
        free(final);
        return q3_fail(Q3_ERR_NOMEM, "%s: out of memory", path);
    }
    const char *slash = strrchr(path, '/');
    size_t base_len = slash ? len - (size_t)(slash + 1 - path) : len;
    int fd = -1, err = 0;
    for (int attempt = 0; attempt < 100 && fd < 0; attempt++) {
        char rnd[17];
        random_hex(rnd, 12);
        if (base_len + 18 <= NAME_MAX) /* PATH.<12 hex>.tmp beside PATH */
            snprintf(tmp, len + 64, "%s.%s.tmp", path, rnd);
        else /* a name too long for a suffix: a short hidden one in the same folder */
            snprintf(tmp, len + 64, "%.*s.q3-%s.tmp", (int)(len - base_len), path, rnd);
        /* in the table before it exists, so that no signal finds it created but
         * unlisted; a name someone else holds (EEXIST) leaves the table untouched */
        f->slot = temp_register(tmp);
        fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0666);
        err = errno;
        if (fd < 0) {
            temp_release(f->slot);
            f->slot = -1;
        }
        if (fd < 0 && err != EEXIST) break;
    }
    if (fd < 0) {
        st = q3_fail(Q3_ERR_IO, "%s: cannot create a temporary file (%s) beside it: %s", path, tmp,
                     strerror(err));
        free(f);
        free(tmp);
        free(final);
        return st;
    }
    f->fd = fd;
    f->tmp = tmp;
    f->path = final;
    *out = f;
    return Q3_OK;
}

const char *q3_outfile_path(const q3_outfile *f) { return f->path; }
const char *q3_outfile_temp_path(const q3_outfile *f) { return f->tmp; }

static q3_status write_failed(const q3_outfile *f, ssize_t r)
{
    return q3_fail(Q3_ERR_IO, "%s: write failed (to %s): %s", f->path, f->tmp,
                   r < 0 ? strerror(errno) : "no progress");
}

q3_status q3_outfile_write(q3_outfile *f, const void *data, size_t n)
{
    const char *p = data;
    while (n > 0) {
        ssize_t r = write(f->fd, p, n > (1u << 30) ? (1u << 30) : n);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return write_failed(f, r);
        p += r;
        n -= (size_t)r;
    }
    return Q3_OK;
}

q3_status q3_outfile_pwrite(q3_outfile *f, const void *data, size_t n, uint64_t at)
{
    const char *p = data;
    while (n > 0) {
        if (at > (uint64_t)INT64_MAX - n) return q3_fail(Q3_ERR_INVALID, "%s: offset overflow", f->path);
        ssize_t r = pwrite(f->fd, p, n > (1u << 30) ? (1u << 30) : n, (off_t)at);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return write_failed(f, r);
        p += r;
        n -= (size_t)r;
        at += (uint64_t)r;
    }
    return Q3_OK;
}

static void outfile_free(q3_outfile *f)
{
    temp_release(f->slot);
    free(f->tmp);
    free(f->path);
    free(f);
}

void q3_outfile_abort(q3_outfile *f)
{
    if (!f) return;
    if (f->fd >= 0) close(f->fd);
    unlink(f->tmp);
    outfile_free(f);
}

q3_status q3_outfile_commit(q3_outfile *f)
{
    q3_status st = Q3_OK;
    /* On the disk before the rename, so that after a crash the final name
     * never holds a file whose contents were still in flight. */
    if (fsync(f->fd) != 0 && errno != EINVAL && errno != EROFS)
        st = q3_fail(Q3_ERR_IO, "%s: write failed (fsync of %s): %s", f->path, f->tmp, strerror(errno));
    /* The written pages leave the page cache (clean now, so this only drops
     * them): pages cached by writes of a few KB each (pwrite from several
     * threads) stay 4 KB folios, so a later mapping of a model file we wrote
     * could never use 2 MB pages, and decode streamed its weights through a
     * TLB miss every 4 KB (measured: a third slower than the same weights
     * read back from disk, which fills the cache in large folios). */
    if (!st) posix_fadvise(f->fd, 0, 0, POSIX_FADV_DONTNEED);
    int fd = f->fd;
    f->fd = -1;
    if (close(fd) != 0 && !st)
        st = q3_fail(Q3_ERR_IO, "%s: write failed (close of %s): %s", f->path, f->tmp, strerror(errno));
    if (!st && rename(f->tmp, f->path) != 0)
        st = q3_fail(Q3_ERR_IO, "%s: cannot rename %s to it: %s", f->path, f->tmp, strerror(errno));
    if (st) {
        q3_outfile_abort(f);
        return st;
    }
    outfile_free(f);
    return Q3_OK;
}

q3_status q3_write_file_atomic(const char *path, const void *data, size_t n)
{
    q3_outfile *f;
    q3_status st = q3_outfile_open(path, &f);
    if (st) return st;
    st = q3_outfile_write(f, data, n);
    if (st) {
        q3_outfile_abort(f);
        return st;
    }
    return q3_outfile_commit(f);
}
