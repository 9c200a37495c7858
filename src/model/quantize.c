/* Reference quantizers for Q8_0 and Q4_0 (see quantize.h for the formulas).
 *
 * Bit compatibility with llama.cpp hinges on details kept here on purpose:
 * the scale is inverted once (id = 1/d) and values are multiplied by id, not
 * divided by d; Q8_0 rounds halves away from zero (roundf); Q4_0 truncates
 * x*id + 8.5 toward zero and picks the first value of largest magnitude. */
#include "model/quantize.h"

#include <math.h>
#include <stdint.h>

#include "util/error.h"

enum { QK = 32 };

static void store_f16(uint8_t *p, float d)
{
    uint16_t h = q3_f32_to_f16(d);
    p[0] = (uint8_t)(h & 0xff);
    p[1] = (uint8_t)(h >> 8);
}

void q3_quantize_q8_0(const float *src, void *dst, size_t n)
{
    uint8_t *out = dst;
    for (size_t b = 0; b < n / QK; b++, src += QK, out += 34) {
        float amax = 0.0f;
        for (int j = 0; j < QK; j++) amax = fmaxf(amax, fabsf(src[j]));
        float d = amax / 127.0f;
        float id = d != 0.0f ? 1.0f / d : 0.0f;
        store_f16(out, d);
        for (int j = 0; j < QK; j++) {
            float q = roundf(src[j] * id); /* |q| <= 127 for finite input */
            out[2 + j] = (uint8_t)(int8_t)(q >= -127.0f && q <= 127.0f ? (int)q : 0);
        }
    }
}

void q3_quantize_q4_0(const float *src, void *dst, size_t n)
{
    uint8_t *out = dst;
    for (size_t b = 0; b < n / QK; b++, src += QK, out += 18) {
        float amax = 0.0f, max = 0.0f;
        for (int j = 0; j < QK; j++)
            if (fabsf(src[j]) > amax) {
                amax = fabsf(src[j]);
                max = src[j];
            }
        float d = max / -8.0f;
        float id = d != 0.0f ? 1.0f / d : 0.0f;
        store_f16(out, d);
        for (int j = 0; j < QK / 2; j++) {
            /* x*id lies in [-8, 8], so v in [0.5, 16.5]: truncation then the
             * clamp to 15 is llama.cpp's MIN(15, (int8_t)v); NaN maps to 0. */
            float v0 = src[j] * id + 8.5f, v1 = src[j + QK / 2] * id + 8.5f;
            int q0 = v0 >= 0.0f ? (v0 < 15.0f ? (int)v0 : 15) : 0;
            int q1 = v1 >= 0.0f ? (v1 < 15.0f ? (int)v1 : 15) : 0;
            out[2 + j] = (uint8_t)(q0 | q1 << 4);
        }
    }
}

q3_status q3_quantize(q3_dtype t, const float *src, void *dst, size_t n)
{
    if ((unsigned)t >= Q3_DTYPE_COUNT)
        return q3_fail(Q3_ERR_INVALID, "quantize: unknown dtype %d", (int)t);
    if (n % q3_dtype_block_values(t))
        return q3_fail(Q3_ERR_INVALID, "quantize: %zu values are not a multiple of the %s block size %zu",
                       n, q3_dtype_name(t), q3_dtype_block_values(t));
    switch (t) {
    case Q3_Q8_0: q3_quantize_q8_0(src, dst, n); break;
    case Q3_Q4_0: q3_quantize_q4_0(src, dst, n); break;
    default: q3_row_from_f32(t, src, dst, n); break;
    }
    return Q3_OK;
}
