/* Small AVX2 building blocks shared by the *_avx2.c kernel files (include
 * only from files compiled with the AVX2 flags). */
#ifndef Q3_BACKEND_CPU_SIMD_AVX2_H
#define Q3_BACKEND_CPU_SIMD_AVX2_H

#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#define Q3_INLINE static inline __attribute__((always_inline))

/* Lane mask of the first n of 8 lanes (n clamped to 0..8), for maskload/maskstore. */
Q3_INLINE __m256i q3_mask8(int n)
{
    n = n < 0 ? 0 : n > 8 ? 8 : n;
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

/* Sums the 8 lanes of each of v0..v3 into lanes 0..3, each by the same tree:
 * a_j = v_j + v_{j+4}; total = (a_0 + a_2) + (a_1 + a_3). */
Q3_INLINE __m128 q3_reduce4_avx2(__m256 v0, __m256 v1, __m256 v2, __m256 v3)
{
    __m256 a01 = _mm256_add_ps(_mm256_permute2f128_ps(v0, v1, 0x20), _mm256_permute2f128_ps(v0, v1, 0x31));
    __m256 a23 = _mm256_add_ps(_mm256_permute2f128_ps(v2, v3, 0x20), _mm256_permute2f128_ps(v2, v3, 0x31));
    __m256 b = _mm256_add_ps(_mm256_shuffle_ps(a01, a23, _MM_SHUFFLE(1, 0, 1, 0)),
                             _mm256_shuffle_ps(a01, a23, _MM_SHUFFLE(3, 2, 3, 2)));
    __m256 c = _mm256_add_ps(_mm256_shuffle_ps(b, b, _MM_SHUFFLE(2, 0, 2, 0)), _mm256_shuffle_ps(b, b, _MM_SHUFFLE(3, 1, 3, 1)));
    return _mm_unpacklo_ps(_mm256_castps256_ps128(c), _mm256_extractf128_ps(c, 1));
}

Q3_INLINE float q3_hsum_avx2(__m256 v)
{
    __m256 z = _mm256_setzero_ps();
    return _mm_cvtss_f32(q3_reduce4_avx2(v, z, z, z));
}

/* 2^x: exactly 1 at x = 0; x is clamped to [-126, 126] (callers mask lanes
 * that must be 0). Degree-7 Taylor polynomial on [-1/2, 1/2]. */
Q3_INLINE __m256 q3_exp2_avx2(__m256 x)
{
    x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-126.0f)), _mm256_set1_ps(126.0f));
    __m256 n = _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 f = _mm256_sub_ps(x, n);
    __m256 p = _mm256_set1_ps(1.525273380405984e-05f);
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.5403530393381606e-04f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.3333558146428443e-03f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(9.618129107628477e-03f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(5.550410866482158e-02f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(2.402265069591007e-01f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(6.931471805599453e-01f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.0f));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

/* Up to 8 16-bit values (n < 8: the rest read as 0) into a 128-bit register. */
Q3_INLINE __m128i q3_load_u16x8(const uint16_t *p, int n)
{
    if (n >= 8) return _mm_loadu_si128((const __m128i *)p);
    uint16_t tmp[8] = {0};
    memcpy(tmp, p, (size_t)(n > 0 ? n : 0) * 2);
    return _mm_loadu_si128((const __m128i *)tmp);
}

Q3_INLINE __m256 q3_bf16x8_to_f32(__m128i h)
{
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

/* 8 floats to BF16, bit for bit q3_f32_to_bf16 (nearest even, NaN kept quiet). */
Q3_INLINE __m128i q3_cvt_bf16x8(__m256 v)
{
    __m256i u = _mm256_castps_si256(v);
    __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    __m256i r = _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7fff)), lsb), 16);
    /* NaN: |u| > 0x7f800000 (signed compare is fine on the absolute value) */
    __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff)), _mm256_set1_epi32(0x7f800000));
    __m256i q = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x40));
    r = _mm256_blendv_epi8(r, q, nan);
    /* pack 8 x 32-bit (each < 65536) to 8 x 16-bit */
    __m128i lo = _mm256_castsi256_si128(r), hi = _mm256_extracti128_si256(r, 1);
    return _mm_packus_epi32(lo, hi);
}

/* ---- Q8_0 blocks (the KV cache's; layout in model/dtype.h) ---------------------------- */

/* 8 values of a Q8_0 block from value j (j % 8 == 0) as F32 d * q: the
 * products are exact (11 by 8 significant bits), the values q3_row_to_f32 gives. */
Q3_INLINE __m256 q3_load_q8_0x8(const uint8_t *b, __m256 d, int j)
{
    __m128i q = _mm_loadl_epi64((const __m128i *)(b + 2 + j));
    return _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q)));
}

Q3_INLINE __m256 q3_q8_0_scale(const uint8_t *b)
{
    return _mm256_set1_ps(_cvtsh_ss((unsigned short)(b[0] | b[1] << 8)));
}

/* 8 values x * id rounded half away from zero (as roundf) into int32 lanes;
 * lanes outside [-127, 127] or NaN give 0 (trunc and v - trunc(v) are exact). */
Q3_INLINE __m256i q3_q8_round8(__m256 x, __m256 id)
{
    __m256 v = _mm256_mul_ps(x, id);
    __m256 t = _mm256_round_ps(v, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
    __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    __m256 up = _mm256_cmp_ps(_mm256_and_ps(_mm256_sub_ps(v, t), absmask), _mm256_set1_ps(0.5f), _CMP_GE_OQ);
    __m256 one = _mm256_or_ps(_mm256_set1_ps(1.0f), _mm256_andnot_ps(absmask, v));
    __m256 r = _mm256_add_ps(t, _mm256_and_ps(up, one));
    __m256 ok = _mm256_and_ps(_mm256_cmp_ps(r, _mm256_set1_ps(-127.0f), _CMP_GE_OQ),
                              _mm256_cmp_ps(r, _mm256_set1_ps(127.0f), _CMP_LE_OQ));
    return _mm256_and_si256(_mm256_cvttps_epi32(r), _mm256_castps_si256(ok));
}

/* Quantizes 32 floats into one block, bit for bit q3_quantize_q8_0 (amax over
 * the non-NaN |x|, d = amax / 127 as f16, id = 1 / d or 0, q3_q8_round8). */
Q3_INLINE void q3_store_q8_0x32_avx2(const float *x, uint8_t *b)
{
    __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    __m256 xv[4], m = _mm256_setzero_ps();
    for (int i = 0; i < 4; i++) {
        xv[i] = _mm256_loadu_ps(x + 8 * i);
        m = _mm256_max_ps(_mm256_and_ps(xv[i], absmask), m); /* NaN lanes keep the running max */
    }
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_shuffle_ps(m4, m4, 1));
    float amax = _mm_cvtss_f32(m4);
    float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
    unsigned short h = _cvtss_sh(d, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    b[0] = (uint8_t)(h & 0xff);
    b[1] = (uint8_t)(h >> 8);
    __m256 vid = _mm256_set1_ps(id);
    __m256i q01 = _mm256_packs_epi32(q3_q8_round8(xv[0], vid), q3_q8_round8(xv[1], vid));
    __m256i q23 = _mm256_packs_epi32(q3_q8_round8(xv[2], vid), q3_q8_round8(xv[3], vid));
    __m256i q = _mm256_packs_epi16(q01, q23); /* 128-bit lanes interleaved: put the dwords back in order */
    q = _mm256_permutevar8x32_epi32(q, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256((__m256i *)(b + 2), q);
}

#endif
