/* Quantizing F32 rows into llama.cpp's Q8_0 and Q4_0 blocks.
 *
 * Both quantizers reproduce llama.cpp's reference (non-imatrix) quantizers bit
 * for bit, so a file q3 writes matches one llama-quantize writes from the same
 * F32 weights. Blocks are 32 values; the block layouts are in model/dtype.h. */
#ifndef Q3_MODEL_QUANTIZE_H
#define Q3_MODEL_QUANTIZE_H

#include <stddef.h>

#include "model/dtype.h"
#include "q3.h"

/* Q8_0: per block, amax = max |x|, d = amax / 127, q = round(x * (1/d)) with
 * halves away from zero, d stored as f16. n must be a multiple of 32; dst
 * receives n / 32 * 34 bytes. Inputs are expected finite; a NaN becomes 0. */
void q3_quantize_q8_0(const float *src, void *dst, size_t n);

/* Q4_0: per block, max = the value of largest magnitude (first one on ties,
 * sign kept), d = max / -8, q = min(15, trunc(x * (1/d) + 8.5)), value j in
 * the low nibble of byte j and value j + 16 in its high nibble, d as f16.
 * n must be a multiple of 32; dst receives n / 32 * 18 bytes. */
void q3_quantize_q4_0(const float *src, void *dst, size_t n);

/* Stores n floats as type t: F32/F16/BF16 converted, Q8_0/Q4_0 quantized.
 * dst receives q3_dtype_row_bytes(t, n) bytes. Fails with Q3_ERR_INVALID if n
 * is not a multiple of t's block size. */
q3_status q3_quantize(q3_dtype t, const float *src, void *dst, size_t n);

#endif
