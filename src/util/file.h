/* Whole-file reading and read-only mapping, with size checks. */
#ifndef Q3_UTIL_FILE_H
#define Q3_UTIL_FILE_H

#include <stddef.h>
#include <stdio.h>
#include "util/status.h"

/* Reads a whole file into a NUL-terminated heap buffer (caller frees).
 * Refuses files larger than max_bytes with a message naming the file. */
q3_status q3_read_file(const char *path, size_t max_bytes, char **out, size_t *len);

/* Reads a stream (stdin, a pipe) to its end the same way; name is for the
 * messages ("stdin"). */
q3_status q3_read_stream(FILE *f, const char *name, size_t max_bytes, char **out, size_t *len);

typedef struct q3_mapping {
    void *data;   /* read-only mapping of the whole file (NULL if size 0) */
    size_t size;  /* file size in bytes */
    int slot;     /* 1 + its entry in the table of mapped files, 0 for none */
} q3_mapping;

/* Gives back the whole pages of [p, p + n) when they lie in a file
 * q3_map_file mapped (read again from the file if touched later; anything
 * else, e.g. malloc'd memory, is left alone): for weights copied into
 * another layout that will not be read here again. */
void q3_mapped_pages_release(const void *p, size_t n);

/* Asks for transparent huge pages for [p, p + n) (2 MB aligned, anonymous
 * memory about to be written): honoured where the kernel's THP setting is
 * "madvise" or "always", ignored elsewhere. */
void q3_memory_prefer_huge_pages(void *p, size_t n);

/* Maps a regular file read-only and records [data, data+size) and path in a
 * table q3_mapped_file_at reads, so a SIGBUS handler can name the file that
 * changed underneath (truncated while mapped). */
q3_status q3_map_file(const char *path, q3_mapping *out);
void q3_unmap_file(q3_mapping *m);

/* The path of the mapped file whose mapping holds addr, or NULL.
 * Async-signal-safe: no locks, no allocation. */
const char *q3_mapped_file_at(const void *addr);

/* "is a FIFO", "is a character device", ...: what a non-regular file is. */
const char *q3_file_kind(unsigned mode);

/* Opens path for reading without blocking (a FIFO does not hang the open)
 * and refuses anything but a regular file, saying what it is ("x: is a FIFO,
 * not a regular file"). *fd is blocking again on return; *size its size. */
q3_status q3_open_regular(const char *path, int *fd, size_t *size);

/* Whether an optional input file is there: *present = 0 when nothing is at
 * path, 1 for a regular file; anything else (a FIFO, a device, a symlink
 * loop, no permission) is an error saying what, never "absent". */
q3_status q3_regular_or_absent(const char *path, int *present);

/* Why path is neither a folder nor a regular file, for "PATH: <why>":
 * "no such file or folder", "is a FIFO", "too many levels of symbolic
 * links", ... */
const char *q3_path_problem(const char *path);

int q3_is_dir(const char *path);
int q3_file_exists(const char *path);

#endif
