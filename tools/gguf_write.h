/* Writing GGUF version 3 files that llama.cpp and q3_gguf_open read.
 *
 * Collect metadata and tensors in a writer, then write the file in one go:
 *
 *     q3_gguf_writer *w;
 *     q3_gguf_writer_new(&w);
 *     q3_gguf_writer_add_str(w, "general.architecture", "qwen3");
 *     q3_gguf_writer_add_tensor(w, "token_embd.weight", Q3_Q8_0, 2, shape, blocks);
 *     q3_status st = q3_gguf_writer_write(w, "model.gguf", NULL, NULL);
 *     q3_gguf_writer_free(w);
 *
 * Metadata is copied when added; tensor data is not (see add_tensor). The file
 * is written under a unique temporary name beside PATH and renamed to PATH
 * only once complete (util/outfile.h), so an interrupted or failed write never
 * leaves a partial file under PATH, and two writers never mix their bytes.
 * general.alignment = 32 (u32) is the first pair of every file. */
#ifndef Q3_MODEL_GGUF_WRITE_H
#define Q3_MODEL_GGUF_WRITE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "model/dtype.h"
#include "q3.h"

/* Alignment of the data section and of every tensor in files q3 writes. */
#define Q3_GGUF_WRITE_ALIGNMENT 32u
/* Longest tensor name written: llama.cpp reads names of at most 63 bytes. */
#define Q3_GGUF_WRITE_MAX_NAME 63u

typedef struct q3_gguf_writer q3_gguf_writer;

q3_status q3_gguf_writer_new(q3_gguf_writer **out);
void q3_gguf_writer_free(q3_gguf_writer *w);

/* ---- metadata ------------------------------------------------------------ */
/* Each adds one pair in call order. Fails with Q3_ERR_INVALID on an empty or
 * over-long key or one already added, Q3_ERR_NOMEM when out of memory. */
q3_status q3_gguf_writer_add_str(q3_gguf_writer *w, const char *key, const char *value);
q3_status q3_gguf_writer_add_u32(q3_gguf_writer *w, const char *key, uint32_t value);
q3_status q3_gguf_writer_add_i32(q3_gguf_writer *w, const char *key, int32_t value);
q3_status q3_gguf_writer_add_u64(q3_gguf_writer *w, const char *key, uint64_t value);
q3_status q3_gguf_writer_add_f32(q3_gguf_writer *w, const char *key, float value);
q3_status q3_gguf_writer_add_bool(q3_gguf_writer *w, const char *key, bool value);
q3_status q3_gguf_writer_add_str_array(q3_gguf_writer *w, const char *key,
                                       const char *const *values, size_t n);
q3_status q3_gguf_writer_add_i32_array(q3_gguf_writer *w, const char *key,
                                       const int32_t *values, size_t n);
q3_status q3_gguf_writer_add_f32_array(q3_gguf_writer *w, const char *key,
                                       const float *values, size_t n);

/* ---- tensors --------------------------------------------------------------- */

/* Adds a tensor of row-major shape [ndim] (shape[0] outermost, as q3_tensor)
 * whose q3_dtype_row_bytes-sized data is at data. The data is NOT copied: it
 * must stay valid until q3_gguf_writer_write returns. Fails with
 * Q3_ERR_INVALID on a duplicate or over-long name, ndim outside 1..4, a dim
 * < 1, a row length not a multiple of the block size, or a size overflow. */
q3_status q3_gguf_writer_add_tensor(q3_gguf_writer *w, const char *name, q3_dtype dtype,
                                    int ndim, const int64_t *shape, const void *data);

/* Produces a tensor's nbytes of data into dst when the file is written; returns
 * Q3_OK or a status with a message set. */
typedef q3_status (*q3_gguf_fill_fn)(void *user, void *dst, size_t nbytes);

/* Like add_tensor, but the data is made by fill(user, buf, nbytes) into a
 * temporary buffer while the file is written, so a converter never needs all
 * of a model's converted weights in memory at once. */
q3_status q3_gguf_writer_add_tensor_fn(q3_gguf_writer *w, const char *name, q3_dtype dtype,
                                       int ndim, const int64_t *shape, q3_gguf_fill_fn fill,
                                       void *user);

/* ---- writing ---------------------------------------------------------------- */

/* Called after each tensor is written. Returning nonzero cancels the write
 * (the temporary file is removed and write fails with Q3_ERR_INVALID). */
typedef int (*q3_gguf_progress_fn)(void *user, size_t tensors_done, size_t tensors_total,
                                   uint64_t bytes_done, uint64_t bytes_total);

/* Writes everything added so far to path (via a unique temporary file, then
 * rename). progress may be NULL. On failure PATH is untouched, the temporary
 * file is removed, and the message names the file. The writer can be written
 * again. */
q3_status q3_gguf_writer_write(q3_gguf_writer *w, const char *path, q3_gguf_progress_fn progress,
                               void *user);

#endif
