/* Whole-file reading and read-only mapping, with size checks. */
#ifndef Q3_UTIL_FILE_H
#define Q3_UTIL_FILE_H

#include <stddef.h>
#include <stdio.h>
#include "q3.h"

/* Reads a whole file into a NUL-terminated heap buffer (caller frees).
 * Refuses files larger than max_bytes with a message naming the file. */
q3_status q3_read_file(const char *path, size_t max_bytes, char **out, size_t *len);

/* Reads a stream (stdin, a pipe) to its end the same way; name is for the
 * messages ("stdin"). */
q3_status q3_read_stream(FILE *f, const char *name, size_t max_bytes, char **out, size_t *len);

typedef struct q3_mapping {
    void *data;   /* read-only mapping of the whole file (NULL if size 0) */
    size_t size;  /* file size in bytes */
} q3_mapping;

q3_status q3_map_file(const char *path, q3_mapping *out);
void q3_unmap_file(q3_mapping *m);

int q3_is_dir(const char *path);
int q3_file_exists(const char *path);

#endif
