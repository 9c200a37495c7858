/* llama.cpp's reference quantizers for Q8_0, Q4_0 and the K-quants (see
 * quantize.h for the formulas).
 *
 * Bit compatibility with llama.cpp hinges on details kept here on purpose:
 * the scale is inverted once (id = 1/d) and values are multiplied by id, not
 * divided by d; Q8_0 rounds halves away from zero (roundf); Q4_0 truncates
 * x*id + 8.5 toward zero and picks the first value of largest magnitude. The
 * K-quants round half to even, divide where llama.cpp divides, and sum in its
 * order; the comments at each fit say which of its functions it follows. */
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
    for (size_t b = 0; b < n / QK; b++, src += QK, out += Q3_Q8_0_BYTES) {
        float amax = 0.0f;
        /* NaNs (quiet or signalling: glibc's fmaxf lets a signalling one through) are skipped */
        for (int j = 0; j < QK; j++)
            if (fabsf(src[j]) > amax) amax = fabsf(src[j]);
        float d = amax / 127.0f;
        float id = d != 0.0f ? 1.0f / d : 0.0f;
        store_f16(out, d);
        for (int j = 0; j < QK; j++) {
            float q = roundf(src[j] * id); /* |q| <= 127 for finite input */
            out[2 + j] = (uint8_t)(int8_t)(q >= -127.0f && q <= 127.0f ? (int)q : 0);
        }
    }
}

void q3_round_q8_0(const float *src, float *dst, size_t n)
{
    for (size_t b = 0; b < n / QK; b++) {
        uint8_t blk[Q3_Q8_0_BYTES];
        q3_quantize_q8_0(src + b * QK, blk, QK);
        q3_row_to_f32(Q3_Q8_0, blk, dst + b * QK, QK);
    }
}

void q3_quantize_q4_0(const float *src, void *dst, size_t n)
{
    uint8_t *out = dst;
    for (size_t b = 0; b < n / QK; b++, src += QK, out += Q3_Q4_0_BYTES) {
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

/* Rounds to the nearest integer, half to even, the way llama.cpp's K-quant code
 * does: adding 1.5 * 2^23 leaves the rounded integer in the low mantissa bits.
 * Exact for |x| < 2^22; beyond that the result is garbage (never UB), as there. */
static int round_k(float x)
{
    float v = x + 12582912.0f;
    int32_t bits;
    memcpy(&bits, &v, sizeof bits);
    return (bits & 0x7fffff) - 0x400000;
}

static float load_f16(const uint8_t *p) { return q3_f16_to_f32((uint16_t)(p[0] | p[1] << 8)); }

/* A super-block's 256 values with non-finite ones replaced by 0 (finite input
 * passes unchanged, so its bytes are llama.cpp's). */
static void finite_copy(const float *src, float *x)
{
    for (int i = 0; i < QK_K; i++) x[i] = isfinite(src[i]) ? src[i] : 0.0f;
}

/* ---- Q4_K and Q5_K: 8 sub-blocks of 32, x ~ scale * l - min ---------------------------- */

/* Fits x[0..32) as scale * l - min, l in 0..lmax, min >= 0, by weighted least
 * squares (weights w) over a sweep of candidate steps. Starting point: the step
 * (hi - lo) / lmax over [min(lo, 0), hi]. Candidate k of 0..nstep maps the
 * range onto lmax + rmin + rdelta * k levels; each candidate's l get the
 * least-squares (scale, offset), with the offset pinned to 0 if it would be
 * positive, and the candidate replaces the best when its weighted squared
 * error is smaller. The offset of the best fit so far is where the next
 * candidate's levels start from. Writes l to L, the min (>= 0) to *min_out;
 * returns the scale. Every float operation is in the order llama.cpp's
 * make_qkx2_quants uses, so the result is the same to the bit. */
static float fit_affine(const float *x, const float *w, int lmax, float rmin, float rdelta, int nstep, uint8_t *L,
                        float *min_out)
{
    enum { N = 32 };
    float lo = x[0], hi = x[0], sum_w = w[0], sum_x = w[0] * x[0];
    for (int i = 1; i < N; i++) {
        if (x[i] < lo) lo = x[i];
        if (x[i] > hi) hi = x[i];
        sum_w += w[i];
        sum_x += w[i] * x[i];
    }
    if (lo > 0) lo = 0;
    if (hi == lo) {
        memset(L, 0, N);
        *min_out = -lo;
        return 0.0f;
    }
    float offset = lo; /* the fit's value at l = 0: -min */
    float iscale = (float)lmax / (hi - offset), scale = 1 / iscale, best_err = 0;
    for (int i = 0; i < N; i++) {
        int l = round_k(iscale * (x[i] - offset));
        L[i] = (uint8_t)(l < 0 ? 0 : l > lmax ? lmax : l);
        float diff = scale * (float)L[i] + offset - x[i];
        diff = diff * diff;
        best_err += w[i] * diff;
    }
    for (int k = 0; k <= nstep; k++) {
        uint8_t cand[N];
        iscale = (rmin + rdelta * (float)k + (float)lmax) / (hi - offset);
        float sum_l = 0, sum_l2 = 0, sum_xl = 0;
        for (int i = 0; i < N; i++) {
            int l = round_k(iscale * (x[i] - offset));
            l = l < 0 ? 0 : l > lmax ? lmax : l;
            cand[i] = (uint8_t)l;
            float wl = w[i] * (float)l;
            sum_l += wl;
            sum_l2 += wl * (float)l;
            sum_xl += wl * x[i];
        }
        float det = sum_w * sum_l2 - sum_l * sum_l;
        if (!(det > 0)) continue;
        float s = (sum_w * sum_xl - sum_x * sum_l) / det;
        float off = (sum_l2 * sum_x - sum_l * sum_xl) / det;
        if (off > 0) {
            off = 0;
            s = sum_xl / sum_l2;
        }
        float err = 0;
        for (int i = 0; i < N; i++) {
            float diff = s * (float)cand[i] + off - x[i];
            diff = diff * diff;
            err += w[i] * diff;
        }
        if (err < best_err) {
            memcpy(L, cand, N);
            best_err = err;
            scale = s;
            offset = off;
        }
    }
    *min_out = -offset;
    return scale;
}

/* The Q4_K/Q5_K super-block head (d, dmin, the 12 scale bytes at out[0..16))
 * and the levels L[256] (0..lmax) of one super-block, as llama.cpp's reference
 * quantizers make them: each sub-block fit with weights sqrt(mean x^2) + |x|,
 * d = max scale / 63 and dmin = max min / 63 as f16, 6-bit scales and mins
 * round(63 * s / max s), then every level chosen again against the scale and
 * min the block stores (a sub-block whose stored scale is 0 keeps its fit's). */
static void affine_superblock(const float *x, int lmax, float rmin, int nstep, uint8_t *out, uint8_t L[QK_K])
{
    float scales[8], mins[8], max_scale = 0, max_min = 0;
    for (int j = 0; j < 8; j++) {
        const float *xs = x + 32 * j;
        float sum_x2 = 0, w[32];
        for (int i = 0; i < 32; i++) sum_x2 += xs[i] * xs[i];
        float av_x = sqrtf(sum_x2 / 32);
        for (int i = 0; i < 32; i++) w[i] = av_x + fabsf(xs[i]);
        scales[j] = fit_affine(xs, w, lmax, rmin, 0.1f, nstep, L + 32 * j, &mins[j]);
        if (scales[j] > max_scale) max_scale = scales[j];
        if (mins[j] > max_min) max_min = mins[j];
    }
    float inv_scale = max_scale > 0 ? 63.0f / max_scale : 0.0f;
    float inv_min = max_min > 0 ? 63.0f / max_min : 0.0f;
    uint8_t sc[8], mn[8], *b = out + 4;
    for (int j = 0; j < 8; j++) {
        uint8_t ls = (uint8_t)round_k(inv_scale * scales[j]), lm = (uint8_t)round_k(inv_min * mins[j]);
        sc[j] = ls < 63 ? ls : 63;
        mn[j] = lm < 63 ? lm : 63;
    }
    for (int j = 0; j < 4; j++) { /* the layout in dtype.h */
        b[j] = (uint8_t)(sc[j] | (sc[j + 4] >> 4) << 6);
        b[j + 4] = (uint8_t)(mn[j] | (mn[j + 4] >> 4) << 6);
        b[j + 8] = (uint8_t)((sc[j + 4] & 15) | (mn[j + 4] & 15) << 4);
    }
    store_f16(out, max_scale / 63.0f);
    store_f16(out + 2, max_min / 63.0f);
    float d_all = load_f16(out), dmin_all = load_f16(out + 2);
    for (int j = 0; j < 8; j++) {
        float d = d_all * (float)sc[j];
        if (d == 0.0f) continue;
        float dm = dmin_all * (float)mn[j];
        for (int i = 0; i < 32; i++) {
            int l = round_k((x[32 * j + i] + dm) / d);
            L[32 * j + i] = (uint8_t)(l < 0 ? 0 : l > lmax ? lmax : l);
        }
    }
}

void q3_quantize_q4_k(const float *src, void *dst, size_t n)
{
    uint8_t *out = dst;
    for (size_t blk = 0; blk < n / QK_K; blk++, src += QK_K, out += Q3_Q4_K_BYTES) {
        float x[QK_K];
        uint8_t L[QK_K];
        finite_copy(src, x);
        affine_superblock(x, 15, -1.0f, 20, out, L);
        uint8_t *qs = out + 16;
        for (int k = 0; k < 4; k++)
            for (int i = 0; i < 32; i++) qs[32 * k + i] = (uint8_t)(L[64 * k + i] | L[64 * k + 32 + i] << 4);
    }
}

void q3_quantize_q5_k(const float *src, void *dst, size_t n)
{
    uint8_t *out = dst;
    for (size_t blk = 0; blk < n / QK_K; blk++, src += QK_K, out += Q3_Q5_K_BYTES) {
        float x[QK_K];
        uint8_t L[QK_K];
        finite_copy(src, x);
        affine_superblock(x, 31, -0.5f, 15, out, L);
        uint8_t *qh = out + 16, *qs = out + 48;
        memset(qh, 0, 32);
        for (int k = 0; k < 4; k++)
            for (int i = 0; i < 32; i++) {
                int lo = L[64 * k + i], hi = L[64 * k + 32 + i];
                qh[i] |= (uint8_t)((lo >> 4) << (2 * k) | (hi >> 4) << (2 * k + 1));
                qs[32 * k + i] = (uint8_t)((lo & 15) | (hi & 15) << 4);
            }
    }
}

/* ---- Q6_K: 16 sub-blocks of 16, x ~ scale * l, l in -32..31 ----------------------------- */

/* Fits x[0..16) as scale * l, l in -32..31, weights x^2: the step that maps
 * the value of largest magnitude (the first, on ties) to -32, then steps for
 * -32 -/+ 0.1k (k = 1..9 each way), each scored by its least-squares scale;
 * a candidate wins when it explains more of the weighted sum of squares.
 * Writes l + 32 to L (all 0 for an all-zero sub-block, scale 0); returns the
 * scale. llama.cpp's make_qx_quants with rmse_type 1, operation for operation. */
static float fit_q6_sub(const float *x, uint8_t *L)
{
    enum { N = 16, NMAX = 32 };
    float amax = 0, max = 0;
    for (int i = 0; i < N; i++)
        if (fabsf(x[i]) > amax) {
            amax = fabsf(x[i]);
            max = x[i];
        }
    if (amax < 1e-15f) {
        memset(L, 0, N);
        return 0.0f;
    }
    float iscale = (float)-NMAX / max, sumlx = 0, suml2 = 0;
    for (int i = 0; i < N; i++) {
        int l = round_k(iscale * x[i]);
        l = l < -NMAX ? -NMAX : l > NMAX - 1 ? NMAX - 1 : l;
        L[i] = (uint8_t)(l + NMAX);
        float w = x[i] * x[i];
        sumlx += w * x[i] * (float)l;
        suml2 += w * (float)l * (float)l;
    }
    float scale = suml2 != 0 ? sumlx / suml2 : 0.0f, best = scale * sumlx;
    for (int k = -9; k <= 9; k++) {
        if (!k) continue;
        iscale = -((float)NMAX + 0.1f * (float)k) / max;
        sumlx = suml2 = 0;
        for (int i = 0; i < N; i++) {
            int l = round_k(iscale * x[i]);
            l = l < -NMAX ? -NMAX : l > NMAX - 1 ? NMAX - 1 : l;
            float w = x[i] * x[i];
            sumlx += w * x[i] * (float)l;
            suml2 += w * (float)l * (float)l;
        }
        if (suml2 > 0 && sumlx * sumlx > best * suml2) {
            for (int i = 0; i < N; i++) {
                int l = round_k(iscale * x[i]);
                L[i] = (uint8_t)((l < -NMAX ? -NMAX : l > NMAX - 1 ? NMAX - 1 : l) + NMAX);
            }
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    return scale;
}

void q3_quantize_q6_k(const float *src, void *dst, size_t n)
{
    uint8_t *out = dst;
    for (size_t blk = 0; blk < n / QK_K; blk++, src += QK_K, out += Q3_Q6_K_BYTES) {
        float x[QK_K], scales[16], max_scale = 0, max_abs = 0;
        uint8_t L[QK_K];
        finite_copy(src, x);
        for (int j = 0; j < 16; j++) {
            scales[j] = fit_q6_sub(x + 16 * j, L + 16 * j);
            if (fabsf(scales[j]) > max_abs) {
                max_abs = fabsf(scales[j]);
                max_scale = scales[j];
            }
        }
        if (max_abs < 1e-15f) { /* all (near) zero: an all-zero block */
            memset(out, 0, Q3_Q6_K_BYTES);
            continue;
        }
        float iscale = -128.0f / max_scale;
        store_f16(out + 208, 1 / iscale);
        float d_all = load_f16(out + 208);
        int8_t *sc = (int8_t *)(out + 192);
        for (int j = 0; j < 16; j++) {
            int q = round_k(iscale * scales[j]);
            sc[j] = (int8_t)(q < 127 ? q : 127);
        }
        for (int j = 0; j < 16; j++) {
            float d = d_all * (float)sc[j];
            if (d == 0.0f) continue;
            for (int i = 0; i < 16; i++) {
                int l = round_k(x[16 * j + i] / d);
                L[16 * j + i] = (uint8_t)((l < -32 ? -32 : l > 31 ? 31 : l) + 32);
            }
        }
        uint8_t *ql = out, *qh = out + 128;
        for (int h = 0; h < 2; h++)
            for (int i = 0; i < 32; i++) {
                const uint8_t *v = L + 128 * h + i; /* v[0], v[32], v[64], v[96] */
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
    if (!q3_traits(t)->from_f32)
        return q3_fail(Q3_ERR_UNSUPPORTED, "quantize: q3 has no quantizer for %s", q3_traits(t)->label);
    q3_traits(t)->from_f32(src, dst, n);
    return Q3_OK;
}
