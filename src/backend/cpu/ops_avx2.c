/* Elementwise ops on AVX2+FMA (see ops_avx512.c); tails use maskload and
 * maskstore so every element goes through the same arithmetic. */
#include <math.h>
#include <string.h>

#include "backend/cpu/kernels.h"
#include "backend/cpu/simd_avx2.h"

static void avx2_rmsnorm(const float *x, const float *w, float *out, int n, float eps)
{
    __m256 ss = _mm256_setzero_ps();
    for (int i = 0; i < n; i += 8) {
        __m256 v = _mm256_maskload_ps(x + i, q3_mask8(n - i));
        ss = _mm256_fmadd_ps(v, v, ss);
    }
    __m256 inv = _mm256_set1_ps((float)(1.0 / sqrt((double)q3_hsum_avx2(ss) / n + (double)eps)));
    for (int i = 0; i < n; i += 8) {
        __m256i m = q3_mask8(n - i);
        __m256 v = _mm256_maskload_ps(x + i, m);
        _mm256_maskstore_ps(out + i, m, _mm256_mul_ps(_mm256_mul_ps(v, inv), _mm256_maskload_ps(w + i, m)));
    }
}

static void avx2_rope(float *x, const float *cs, const float *sn, int n_heads, int hd)
{
    int half = hd / 2;
    for (int h = 0; h < n_heads; h++) {
        float *x0p = x + (size_t)h * hd, *x1p = x0p + half;
        for (int i = 0; i < half; i += 8) {
            __m256i m = q3_mask8(half - i);
            __m256 x0 = _mm256_maskload_ps(x0p + i, m), x1 = _mm256_maskload_ps(x1p + i, m);
            __m256 c = _mm256_maskload_ps(cs + i, m), s = _mm256_maskload_ps(sn + i, m);
            _mm256_maskstore_ps(x0p + i, m, _mm256_fmsub_ps(x0, c, _mm256_mul_ps(x1, s)));
            _mm256_maskstore_ps(x1p + i, m, _mm256_fmadd_ps(x0, s, _mm256_mul_ps(x1, c)));
        }
    }
}

static void avx2_add(const float *a, const float *b, float *out, size_t n)
{
    for (size_t i = 0; i < n; i += 8) {
        __m256i m = q3_mask8((int)(n - i < 8 ? n - i : 8));
        _mm256_maskstore_ps(out + i, m, _mm256_add_ps(_mm256_maskload_ps(a + i, m), _mm256_maskload_ps(b + i, m)));
    }
}

static void avx2_swiglu(const float *g, const float *u, float *out, size_t n)
{
    for (size_t i = 0; i < n; i += 8) {
        __m256i m = q3_mask8((int)(n - i < 8 ? n - i : 8));
        __m256 gv = _mm256_maskload_ps(g + i, m), uv = _mm256_maskload_ps(u + i, m);
        __m256 e = q3_exp2_avx2(_mm256_mul_ps(gv, _mm256_set1_ps(-1.4426950408889634f)));
        _mm256_maskstore_ps(out + i, m, _mm256_mul_ps(_mm256_div_ps(gv, _mm256_add_ps(_mm256_set1_ps(1.0f), e)), uv));
    }
}

static void avx2_to_f32(q3_dtype t, const void *src, float *dst, size_t n)
{
    if (t == Q3_F32) {
        memcpy(dst, src, n * sizeof(float));
        return;
    }
    if (t == Q3_Q8_0) { /* n % 32 == 0 */
        const uint8_t *b = src;
        for (size_t i = 0; i < n; i += 32, b += Q3_Q8_0_BYTES) {
            __m256 d = q3_q8_0_scale(b);
            for (int j = 0; j < 32; j += 8) _mm256_storeu_ps(dst + i + j, q3_load_q8_0x8(b, d, j));
        }
        return;
    }
    const uint16_t *s = src;
    for (size_t i = 0; i < n; i += 8) {
        int k = (int)(n - i < 8 ? n - i : 8);
        __m128i h = q3_load_u16x8(s + i, k);
        __m256 v = t == Q3_BF16 ? q3_bf16x8_to_f32(h) : _mm256_cvtph_ps(h);
        _mm256_maskstore_ps(dst + i, q3_mask8(k), v);
    }
}

static void avx2_from_f32(q3_dtype t, const float *src, void *dst, size_t n)
{
    if (t == Q3_F32) {
        memcpy(dst, src, n * sizeof(float));
        return;
    }
    if (t == Q3_Q8_0) { /* n % 32 == 0 */
        uint8_t *b = dst;
        for (size_t i = 0; i < n; i += 32, b += Q3_Q8_0_BYTES) q3_store_q8_0x32_avx2(src + i, b);
        return;
    }
    uint16_t *d = dst;
    for (size_t i = 0; i < n; i += 8) {
        int k = (int)(n - i < 8 ? n - i : 8);
        __m256 v = _mm256_maskload_ps(src + i, q3_mask8(k));
        __m128i h = t == Q3_BF16 ? q3_cvt_bf16x8(v) : _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        if (k == 8) {
            _mm_storeu_si128((__m128i *)(d + i), h);
        } else {
            uint16_t tmp[8];
            _mm_storeu_si128((__m128i *)tmp, h);
            memcpy(d + i, tmp, (size_t)k * 2);
        }
    }
}

const q3_cpu_ew_kernels q3_cpu_ew_avx2 = {
    .rmsnorm = avx2_rmsnorm,
    .rope = avx2_rope,
    .add = avx2_add,
    .swiglu = avx2_swiglu,
    .to_f32 = avx2_to_f32,
    .from_f32 = avx2_from_f32,
};
