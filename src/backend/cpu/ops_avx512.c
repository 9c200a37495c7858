/* Elementwise ops on AVX-512: RMSNorm, RoPE, add, SwiGLU and the F32/F16/BF16
 * (and the KV cache's Q8_0) row conversions. Tails use masked loads and stores, so every element goes
 * through the same arithmetic wherever it sits in a row. */
#include <math.h>
#include <string.h>

#include "backend/cpu/kernels.h"
#include "backend/cpu/simd_avx512.h"

static void avx512_rmsnorm(const float *x, const float *w, float *out, int n, float eps)
{
    __m512 ss = _mm512_setzero_ps();
    for (int i = 0; i < n; i += 16) {
        __m512 v = _mm512_maskz_loadu_ps(q3_mask16(n - i), x + i);
        ss = _mm512_fmadd_ps(v, v, ss);
    }
    __m512 inv = _mm512_set1_ps((float)(1.0 / sqrt((double)q3_hsum(ss) / n + (double)eps)));
    for (int i = 0; i < n; i += 16) {
        __mmask16 m = q3_mask16(n - i);
        __m512 v = _mm512_maskz_loadu_ps(m, x + i);
        _mm512_mask_storeu_ps(out + i, m, _mm512_mul_ps(_mm512_mul_ps(v, inv), _mm512_maskz_loadu_ps(m, w + i)));
    }
}

static void avx512_rope(float *x, const float *cs, const float *sn, int n_heads, int hd)
{
    int half = hd / 2;
    for (int h = 0; h < n_heads; h++) {
        float *x0p = x + (size_t)h * hd, *x1p = x0p + half;
        for (int i = 0; i < half; i += 16) {
            __mmask16 m = q3_mask16(half - i);
            __m512 x0 = _mm512_maskz_loadu_ps(m, x0p + i), x1 = _mm512_maskz_loadu_ps(m, x1p + i);
            __m512 c = _mm512_maskz_loadu_ps(m, cs + i), s = _mm512_maskz_loadu_ps(m, sn + i);
            _mm512_mask_storeu_ps(x0p + i, m, _mm512_fmsub_ps(x0, c, _mm512_mul_ps(x1, s)));
            _mm512_mask_storeu_ps(x1p + i, m, _mm512_fmadd_ps(x0, s, _mm512_mul_ps(x1, c)));
        }
    }
}

static void avx512_add(const float *a, const float *b, float *out, size_t n)
{
    size_t i = 0;
    for (; i + 16 <= n; i += 16) _mm512_storeu_ps(out + i, _mm512_add_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i)));
    if (i < n) {
        __mmask16 m = q3_mask16((int)(n - i));
        _mm512_mask_storeu_ps(out + i, m, _mm512_add_ps(_mm512_maskz_loadu_ps(m, a + i), _mm512_maskz_loadu_ps(m, b + i)));
    }
}

/* silu(g) * u = g / (1 + e^-g) * u, e^-g as 2^(-g log2 e). */
static inline __m512 swiglu16(__m512 g, __m512 u)
{
    __m512 e = q3_exp2_ps(_mm512_mul_ps(g, _mm512_set1_ps(-1.4426950408889634f)));
    return _mm512_mul_ps(_mm512_div_ps(g, _mm512_add_ps(_mm512_set1_ps(1.0f), e)), u);
}

static void avx512_swiglu(const float *g, const float *u, float *out, size_t n)
{
    size_t i = 0;
    for (; i + 16 <= n; i += 16) _mm512_storeu_ps(out + i, swiglu16(_mm512_loadu_ps(g + i), _mm512_loadu_ps(u + i)));
    if (i < n) {
        __mmask16 m = q3_mask16((int)(n - i));
        _mm512_mask_storeu_ps(out + i, m, swiglu16(_mm512_maskz_loadu_ps(m, g + i), _mm512_maskz_loadu_ps(m, u + i)));
    }
}

static void avx512_to_f32(q3_dtype t, const void *src, float *dst, size_t n)
{
    if (t == Q3_F32) {
        memcpy(dst, src, n * sizeof(float));
        return;
    }
    if (t == Q3_Q8_0) { /* n % 32 == 0 */
        const uint8_t *b = src;
        for (size_t i = 0; i < n; i += 32, b += Q3_Q8_0_BYTES) {
            __m512 lo, hi;
            q3_load_q8_0x32(b, &lo, &hi);
            _mm512_storeu_ps(dst + i, lo);
            _mm512_storeu_ps(dst + i + 16, hi);
        }
        return;
    }
    const uint16_t *s = src;
    for (size_t i = 0; i < n; i += 16) {
        __mmask16 m = q3_mask16((int)(n - i < 16 ? n - i : 16));
        __m512 v = t == Q3_BF16 ? q3_load_bf16x16(s + i, m) : q3_load_f16x16(s + i, m);
        _mm512_mask_storeu_ps(dst + i, m, v);
    }
}

static void avx512_from_f32(q3_dtype t, const float *src, void *dst, size_t n)
{
    if (t == Q3_F32) {
        memcpy(dst, src, n * sizeof(float));
        return;
    }
    if (t == Q3_Q8_0) { /* n % 32 == 0 */
        uint8_t *b = dst;
        for (size_t i = 0; i < n; i += 32, b += Q3_Q8_0_BYTES) q3_store_q8_0x32(src + i, b);
        return;
    }
    uint16_t *d = dst;
    for (size_t i = 0; i < n; i += 16) {
        __mmask16 m = q3_mask16((int)(n - i < 16 ? n - i : 16));
        __m512 v = _mm512_maskz_loadu_ps(m, src + i);
        __m256i h = t == Q3_BF16 ? q3_cvt_bf16x16(v) : q3_cvt_f16x16(v);
        _mm256_mask_storeu_epi16(d + i, m, h);
    }
}

const q3_cpu_ew_kernels q3_cpu_ew_avx512 = {
    .rmsnorm = avx512_rmsnorm,
    .rope = avx512_rope,
    .add = avx512_add,
    .swiglu = avx512_swiglu,
    .to_f32 = avx512_to_f32,
    .from_f32 = avx512_from_f32,
};
