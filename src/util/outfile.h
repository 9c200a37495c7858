/* Files q3 writes: complete or absent, one writer's bytes, never through an
 * existing path.
 *
 * Every output goes to a temporary file created exclusively (O_CREAT|O_EXCL|
 * O_NOFOLLOW, a random name) in the output's own folder, is written with
 * checked writes, fsync'ed, closed (checked) and only then renamed onto the
 * final name. Two writers of the same path each have their own temporary
 * file, so the final name holds one writer's complete output (the last to
 * commit); a failed or abandoned write removes its temporary file. A symlink
 * at the final name is replaced, never followed.
 *
 *     q3_outfile *f;
 *     q3_status st = q3_outfile_open("model.gguf", &f);
 *     if (!st) st = q3_outfile_write(f, header, n);
 *     ...
 *     st = st ? (q3_outfile_abort(f), st) : q3_outfile_commit(f);
 *
 * Live temporary paths are kept in a fixed table that
 * q3_outfile_remove_temps() reads without locks or allocation, so a signal
 * handler can remove them (the CLI does so on SIGINT, SIGTERM and SIGHUP). */
#ifndef Q3_UTIL_OUTFILE_H
#define Q3_UTIL_OUTFILE_H

#include <stddef.h>
#include <stdint.h>
#include "util/status.h"

typedef struct q3_outfile q3_outfile;

/* Checks, before any work, that path can be an output file: not empty, not
 * an existing folder or other non-regular file (a FIFO, a device), and its
 * folder exists, is a folder and is writable. Q3_ERR_INVALID / Q3_ERR_IO
 * with a message naming path. */
q3_status q3_outfile_check(const char *path);

/* Checks path (q3_outfile_check) and creates a new, empty temporary file
 * beside it (mode 0666 less the umask). The caller ends with exactly one of
 * q3_outfile_commit or q3_outfile_abort, which free *out. */
q3_status q3_outfile_open(const char *path, q3_outfile **out);

/* Appends n bytes (checked, retried on short writes and EINTR). The message
 * names the temporary file and the final path. */
q3_status q3_outfile_write(q3_outfile *f, const void *data, size_t n);

/* Writes n bytes at byte offset `at`, independent of the append position;
 * safe from several threads at once for non-overlapping ranges. Do not mix
 * with q3_outfile_write on one file. */
q3_status q3_outfile_pwrite(q3_outfile *f, const void *data, size_t n, uint64_t at);

/* The final path and the temporary path (valid until commit/abort). */
const char *q3_outfile_path(const q3_outfile *f);
const char *q3_outfile_temp_path(const q3_outfile *f);

/* fsync, close, rename onto the final path. Frees f whatever the outcome; on
 * failure the temporary file is removed and the final path is untouched. */
q3_status q3_outfile_commit(q3_outfile *f);

/* Closes and removes the temporary file; frees f. NULL is fine. */
void q3_outfile_abort(q3_outfile *f);

/* The whole of data[0..n) to path through a temporary file and a rename. */
q3_status q3_write_file_atomic(const char *path, const void *data, size_t n);

/* Removes every live temporary file. Async-signal-safe (unlink only). */
void q3_outfile_remove_temps(void);

#endif
