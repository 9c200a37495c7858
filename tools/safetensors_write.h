/* Writing one .safetensors file.
 *
 * Layout: an 8-byte little-endian header length N, then N bytes of JSON
 *   {"__metadata__": {"format": "pt"},
 *    "name": {"dtype": "BF16", "shape": [..], "data_offsets": [begin, end]}, ...}
 * padded with spaces so the data starts 8-byte aligned, then the tensors'
 * bytes, contiguous, in the order they were declared (offsets are relative
 * to the start of the data).
 *
 * Use: declare every tensor with q3_st_writer_add, fix the layout with
 * q3_st_writer_begin_data, fill each tensor's bytes with q3_st_writer_write
 * (from any number of threads, in any order), then q3_st_writer_commit.
 * The file is written under a unique temporary name beside PATH
 * (util/outfile.h) and renamed to PATH only by a commit that found every byte
 * of every tensor written, so PATH is never partial nor mixed. */
#ifndef Q3_MODEL_SAFETENSORS_WRITE_H
#define Q3_MODEL_SAFETENSORS_WRITE_H

#include <stddef.h>
#include <stdint.h>
#include "model/dtype.h"
#include "model/tensor.h"
#include "q3.h"

typedef struct q3_st_writer q3_st_writer;

/* Creates a new temporary file beside PATH. The caller finishes with
 * q3_st_writer_commit or q3_st_writer_abort, which free the writer. */
q3_status q3_st_writer_new(const char *path, q3_st_writer **out);

/* Declares the next tensor. dtype: Q3_F32, Q3_F16 or Q3_BF16. ndim in
 * [0, Q3_MAX_DIMS], every dimension > 0. Names are printable ASCII without
 * quotes or backslashes, shorter than 128 bytes, and unique. */
q3_status q3_st_writer_add(q3_st_writer *w, const char *name, q3_dtype dtype, int ndim,
                           const int64_t *shape);

/* Writes the header; no tensor can be added afterwards. */
q3_status q3_st_writer_begin_data(q3_st_writer *w);

/* Size in bytes of declared tensor i (in declaration order, from 0). */
size_t q3_st_writer_tensor_bytes(const q3_st_writer *w, int i);

/* Writes n bytes at byte `offset` of tensor i's data. Thread-safe between
 * begin_data and commit; writes must not overlap. */
q3_status q3_st_writer_write(q3_st_writer *w, int i, size_t offset, const void *data, size_t n);

/* Checks that every tensor was written in full, closes the temporary file
 * and renames it to PATH. Frees w whatever the outcome; on failure the
 * temporary file is removed. */
q3_status q3_st_writer_commit(q3_st_writer *w);

/* Abandons the file: closes and removes the temporary file, frees w. NULL is fine. */
void q3_st_writer_abort(q3_st_writer *w);

/* The safetensors name of a dtype ("F32", "F16", "BF16"), or NULL. */
const char *q3_st_dtype_name(q3_dtype t);

#endif
