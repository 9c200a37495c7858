/* Quantizing F32 rows into llama.cpp's Q8_0, Q4_0, Q4_K and Q6_K blocks.
 *
 * The Q8_0 and Q4_0 quantizers reproduce llama.cpp's reference (non-imatrix)
 * quantizers bit for bit, so a file q3 writes matches one llama-quantize writes
 * from the same F32 weights. Blocks are 32 values; the block layouts are in
 * model/dtype.h.
 *
 * The Q4_K and Q6_K quantizers are q3's own: they write valid blocks that
 * llama.cpp reads, with a round-trip error of the same order as llama.cpp's
 * reference quantizers, but not the same bytes (llama.cpp's searches for the
 * sub-block scales differ in detail). They exist so tests and experiments can
 * make K-quant files; real K-quant models come from llama-quantize. */
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

/* Q4_K (256-value super-blocks of 8 sub-blocks of 32): each sub-block is fit
 * as x ~ s*q - m, q in 0..15, s >= 0, m = -min(0, lowest fit) >= 0, by a small
 * search over the quantization step with a least-squares refit of (s, m) for
 * each candidate, keeping the least squared error. Then d = max s / 63 and
 * dmin = max m / 63 (stored as f16), the 6-bit sub-block scales and mins are
 * round(s / d) and round(m / dmin), and every q is chosen again against the
 * scale and min the block really stores. n must be a multiple of 256; dst
 * receives n / 256 * 144 bytes. Inputs are expected finite: NaN and +-inf are
 * quantized as 0. */
void q3_quantize_q4_k(const float *src, void *dst, size_t n);

/* Q6_K (256-value super-blocks of 16 sub-blocks of 16): each sub-block's
 * scale s (x ~ s*q, q in -32..31) is searched around (value of largest
 * magnitude) / -32 with a least-squares refit for each candidate; then
 * d = (the s of largest magnitude) / -128 as f16, the int8 scales are
 * round(s / d) clamped to -128..127, and every q is chosen again against the
 * stored scale. n must be a multiple of 256; dst receives n / 256 * 210 bytes.
 * NaN and +-inf are quantized as 0. */
void q3_quantize_q6_k(const float *src, void *dst, size_t n);

/* Stores n floats as type t: F32/F16/BF16 converted, the others quantized.
 * dst receives q3_dtype_row_bytes(t, n) bytes. Fails with Q3_ERR_INVALID if n
 * is not a multiple of t's block size. */
q3_status q3_quantize(q3_dtype t, const float *src, void *dst, size_t n);

#endif
