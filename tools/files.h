/* The files of the q3 commands: whole inputs read with a size limit, output
 * files checked before any work and written complete or not at all. The
 * library keeps these internal (src/util/file.c, src/util/outfile.c); this is
 * the narrow part of them the CLI reaches, so that src/cli includes nothing
 * below tools/. */
#ifndef Q3_TOOLS_FILES_H
#define Q3_TOOLS_FILES_H

#include <stddef.h>

#include "q3.h"

/* The whole regular file at path, NUL-terminated (caller frees; *len its
 * length, len may be NULL); more than max_bytes, a FIFO or a device is
 * refused with a message naming path. */
q3_status q3_tool_read_file(const char *path, size_t max_bytes, char **text, size_t *len);

/* All of stdin, the same way ("stdin" in the messages). */
q3_status q3_tool_read_stdin(size_t max_bytes, char **text, size_t *len);

/* Whether path can be an output file (before any work): not empty, not a
 * folder or a FIFO, in a folder that exists and is writable. */
q3_status q3_tool_output_check(const char *path);

/* Writes n bytes to path under a unique temporary name beside it, renamed
 * over path only when complete. */
q3_status q3_tool_write_file(const char *path, const void *data, size_t n);

#endif
