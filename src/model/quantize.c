/* Reference quantizers for Q8_0 and Q4_0, and q3's own Q4_K and Q6_K (see
 * quantize.h for the formulas).
 *
 * Bit compatibility with llama.cpp hinges on details kept here on purpose:
 * the scale is inverted once (id = 1/d) and values are multiplied by id, not
 * divided by d; Q8_0 rounds halves away from zero (roundf); Q4_0 truncates
 * x*id + 8.5 toward zero and picks the first value of largest magnitude. */
#include "model/quantize.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

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

/* ==== K-quants ================================================================ */

enum { QK_K = 256 };

/* Round half to even, clamped to [lo, hi] (NaN gives lo). */
static int round_clamp(float v, int lo, int hi)
{
    if (!(v >= (float)lo)) return lo;
    if (v >= (float)hi) return hi;
    return (int)nearbyintf(v);
}

/* A super-block's 256 values with non-finite ones replaced by 0. */
static void finite_copy(const float *src, float *x)
{
    for (int i = 0; i < QK_K; i++) x[i] = isfinite(src[i]) ? src[i] : 0.0f;
}

/* Q4_K sub-block fit: x[0..32) ~ s*q - m, q in 0..15, s >= 0, m >= 0.
 * Candidate steps around (hi - lo) / 15 pick the q; for each, (s, m) is the
 * least-squares solution for those q (m pinned to 0 if it would go negative);
 * the candidate with the least squared error wins. */
static void fit_q4_sub(const float *x, float *s_out, float *m_out)
{
    float lo = x[0], hi = x[0];
    for (int i = 1; i < 32; i++) {
        lo = fminf(lo, x[i]);
        hi = fmaxf(hi, x[i]);
    }
    if (lo > 0.0f) lo = 0.0f; /* the format's offset -dmin*m is never positive */
    if (hi <= lo) {           /* a constant block at or below 0 */
        *s_out = 0.0f;
        *m_out = -lo;
        return;
    }
    float best_s = (hi - lo) / 15.0f, best_m = -lo;
    double best_err = INFINITY;
    for (int k = -6; k <= 6; k++) {
        float iscale = (15.0f + 0.1f * (float)k) / (hi - lo);
        int q[32];
        double sq = 0, sx = 0, sqq = 0, sqx = 0;
        for (int i = 0; i < 32; i++) {
            q[i] = round_clamp((x[i] - lo) * iscale, 0, 15);
            sq += q[i];
            sx += x[i];
            sqq += (double)q[i] * q[i];
            sqx += (double)q[i] * x[i];
        }
        double det = 32.0 * sqq - sq * sq, s, b;
        if (det <= 0) continue; /* all q equal: nothing to fit */
        s = (32.0 * sqx - sq * sx) / det;
        b = (sx - s * sq) / 32.0;
        if (b > 0) { /* the offset must stay <= 0: refit the scale alone */
            b = 0;
            s = sqq > 0 ? sqx / sqq : 0;
        }
        if (s <= 0) continue;
        double err = 0;
        for (int i = 0; i < 32; i++) {
            double e = s * q[i] + b - x[i];
            err += e * e;
        }
        if (err < best_err) {
            best_err = err;
            best_s = (float)s;
            best_m = (float)-b;
        }
    }
    *s_out = best_s;
    *m_out = best_m;
}

void q3_quantize_q4_k(const float *src, void *dst, size_t n)
{
    uint8_t *out = dst;
    for (size_t blk = 0; blk < n / QK_K; blk++, src += QK_K, out += 144) {
        float x[QK_K], s[8], m[8], max_s = 0.0f, max_m = 0.0f;
        finite_copy(src, x);
        for (int j = 0; j < 8; j++) {
            fit_q4_sub(x + 32 * j, &s[j], &m[j]);
            max_s = fmaxf(max_s, s[j]);
            max_m = fmaxf(max_m, m[j]);
        }
        store_f16(out, max_s / 63.0f);
        store_f16(out + 2, max_m / 63.0f);
        /* quantize the sub-block scales against the f16 values really stored */
        float d = q3_f16_to_f32((uint16_t)(out[0] | out[1] << 8));
        float dmin = q3_f16_to_f32((uint16_t)(out[2] | out[3] << 8));
        int sc[8], mn[8];
        for (int j = 0; j < 8; j++) {
            sc[j] = d > 0.0f ? round_clamp(s[j] / d, 0, 63) : 0;
            mn[j] = dmin > 0.0f ? round_clamp(m[j] / dmin, 0, 63) : 0;
        }
        uint8_t *b = out + 4;
        for (int j = 0; j < 4; j++) {
            b[j] = (uint8_t)(sc[j] | (sc[j + 4] >> 4) << 6);
            b[j + 4] = (uint8_t)(mn[j] | (mn[j + 4] >> 4) << 6);
            b[j + 8] = (uint8_t)((sc[j + 4] & 15) | (mn[j + 4] & 15) << 4);
        }
        uint8_t *qs = out + 16;
        memset(qs, 0, 128);
        for (int j = 0; j < 8; j++) {
            float scale = d * (float)sc[j], off = dmin * (float)mn[j];
            for (int i = 0; i < 32; i++) {
                int q = scale > 0.0f ? round_clamp((x[32 * j + i] + off) / scale, 0, 15) : 0;
                qs[32 * (j / 2) + i] |= (uint8_t)(q << (4 * (j % 2)));
            }
        }
    }
}

/* Q6_K sub-block scale: x[0..16) ~ s*q, q in -32..31. Candidate steps around
 * (value of largest magnitude) / -32 pick the q, the least-squares scale for
 * those q is refit, and the least squared error wins. */
static float fit_q6_sub(const float *x)
{
    float amax = 0.0f, mx = 0.0f;
    for (int i = 0; i < 16; i++)
        if (fabsf(x[i]) > amax) {
            amax = fabsf(x[i]);
            mx = x[i];
        }
    if (amax == 0.0f) return 0.0f;
    float best_s = mx / -32.0f;
    double best_err = INFINITY;
    for (int k = -6; k <= 6; k++) {
        float iscale = -(32.0f + 0.1f * (float)k) / mx;
        int q[16];
        double sqq = 0, sqx = 0;
        for (int i = 0; i < 16; i++) {
            q[i] = round_clamp(x[i] * iscale, -32, 31);
            sqq += (double)q[i] * q[i];
            sqx += (double)q[i] * x[i];
        }
        if (sqq <= 0) continue;
        double s = sqx / sqq, err = 0;
        for (int i = 0; i < 16; i++) {
            double e = s * q[i] - x[i];
            err += e * e;
        }
        if (err < best_err) {
            best_err = err;
            best_s = (float)s;
        }
    }
    return best_s;
}

void q3_quantize_q6_k(const float *src, void *dst, size_t n)
{
    uint8_t *out = dst;
    for (size_t blk = 0; blk < n / QK_K; blk++, src += QK_K, out += 210) {
        float x[QK_K], s[16], smax = 0.0f;
        finite_copy(src, x);
        for (int j = 0; j < 16; j++) {
            s[j] = fit_q6_sub(x + 16 * j);
            if (fabsf(s[j]) > fabsf(smax)) smax = s[j];
        }
        store_f16(out + 208, smax / -128.0f);
        float d = q3_f16_to_f32((uint16_t)(out[208] | out[209] << 8));
        int8_t *sc = (int8_t *)(out + 192);
        int L[QK_K];
        for (int j = 0; j < 16; j++) {
            sc[j] = (int8_t)(d != 0.0f ? round_clamp(s[j] / d, -128, 127) : 0);
            float scale = d * (float)sc[j];
            for (int i = 0; i < 16; i++)
                L[16 * j + i] = (scale != 0.0f ? round_clamp(x[16 * j + i] / scale, -32, 31) : 0) + 32;
        }
        uint8_t *ql = out, *qh = out + 128;
        for (int h = 0; h < 2; h++)
            for (int i = 0; i < 32; i++) {
                const int *v = L + 128 * h + i; /* v[0], v[32], v[64], v[96] */
                ql[64 * h + i] = (uint8_t)((v[0] & 15) | (v[64] & 15) << 4);
                ql[64 * h + 32 + i] = (uint8_t)((v[32] & 15) | (v[96] & 15) << 4);
                qh[32 * h + i] = (uint8_t)(v[0] >> 4 | (v[32] >> 4) << 2 | (v[64] >> 4) << 4 | (v[96] >> 4) << 6);
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
    if (t == Q3_Q5_K) return q3_fail(Q3_ERR_UNSUPPORTED, "quantize: q3 has no Q5_K quantizer");
    switch (t) {
    case Q3_Q8_0: q3_quantize_q8_0(src, dst, n); break;
    case Q3_Q4_0: q3_quantize_q4_0(src, dst, n); break;
    case Q3_Q4_K: q3_quantize_q4_k(src, dst, n); break;
    case Q3_Q6_K: q3_quantize_q6_k(src, dst, n); break;
    default: q3_row_from_f32(t, src, dst, n); break;
    }
    return Q3_OK;
}
