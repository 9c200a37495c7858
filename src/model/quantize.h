/* Quantizing F32 rows into llama.cpp's Q8_0, Q4_0, Q4_K, Q5_K and Q6_K blocks.
 *
 * Every quantizer here reproduces llama.cpp's reference (non-imatrix) quantizer
 * bit for bit, so a file q3 writes matches one llama-quantize writes from the
 * same F32 weights (the K-quants checked against llama-quantize's own output in
 * tests/test_convert_kquants.c). The block layouts are in model/dtype.h.
 *
 * Matching to the bit needs the float operations in llama.cpp's order with no
 * fused multiply-adds: the Makefile compiles with -ffp-contract=off. */
#ifndef Q3_MODEL_QUANTIZE_H
#define Q3_MODEL_QUANTIZE_H

#include <stddef.h>

#include "model/dtype.h"
#include "util/status.h"

/* Q8_0: per block, amax = max |x|, d = amax / 127, q = round(x * (1/d)) with
 * halves away from zero, d stored as f16. n must be a multiple of 32; dst
 * receives n / 32 * 34 bytes. Inputs are expected finite; a NaN becomes 0. */
void q3_quantize_q8_0(const float *src, void *dst, size_t n);

/* The values Q8_0 blocks of src hold: dst[i] = d * q of q3_quantize_q8_0, with
 * d as stored (f16). n must be a multiple of 32. Attention over a Q8_0 KV
 * cache takes its query this way (see backend/cpu/attention_avx512.c). */
void q3_round_q8_0(const float *src, float *dst, size_t n);

/* Q4_0: per block, max = the value of largest magnitude (first one on ties,
 * sign kept), d = max / -8, q = min(15, trunc(x * (1/d) + 8.5)), value j in
 * the low nibble of byte j and value j + 16 in its high nibble, d as f16.
 * n must be a multiple of 32; dst receives n / 32 * 18 bytes. */
void q3_quantize_q4_0(const float *src, void *dst, size_t n);

/* The K-quants: super-blocks of 256 values; n must be a multiple of 256.
 * Non-finite inputs (which llama-quantize rejects) are quantized as 0.
 *
 * Q4_K (144 bytes a block) and Q5_K (176): each 32-value sub-block is fit as
 * x ~ s*l - m (l in 0..15, resp. 0..31; m >= 0) by weighted least squares,
 * weights sqrt(mean x^2) + |x|, over a sweep of 21 (resp. 16) candidate steps;
 * then d = max s / 63 and dmin = max m / 63 (f16), 6-bit scales and mins
 * round(63 s / max s), round(63 m / max m), and every l chosen again against
 * the scale and min the block stores.
 *
 * Q6_K (210 bytes): each 16-value sub-block is fit as x ~ s*l (l in -32..31),
 * weights x^2, over 19 candidate steps around (value of largest magnitude) /
 * -32; then d = (the s of largest magnitude) / -128 (f16), int8 scales
 * round(s / d) (at most 127), and every l chosen again. */
void q3_quantize_q4_k(const float *src, void *dst, size_t n);
void q3_quantize_q5_k(const float *src, void *dst, size_t n);
void q3_quantize_q6_k(const float *src, void *dst, size_t n);

/* Stores n floats as type t: F32/F16/BF16 converted, the others quantized.
 * dst receives q3_dtype_row_bytes(t, n) bytes. Fails with Q3_ERR_INVALID if n
 * is not a multiple of t's block size. */
q3_status q3_quantize(q3_dtype t, const float *src, void *dst, size_t n);

#endif
