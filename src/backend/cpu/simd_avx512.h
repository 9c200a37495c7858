/* Small AVX-512 building blocks shared by the *_avx512.c kernel files
 * (include only from files compiled with the AVX-512 flags). */
#ifndef Q3_BACKEND_CPU_SIMD_AVX512_H
#define Q3_BACKEND_CPU_SIMD_AVX512_H

#include <immintrin.h>
#include <stdint.h>

#define Q3_INLINE static inline __attribute__((always_inline))

/* ---- the canonical lane-sum tree ------------------------------------------------ */

/* Sums the 16 lanes of each of v0..v3; returns the four sums in lanes 0..3.
 * Every vector is summed by the same tree whatever its neighbours are:
 *   a_j = v_j + v_{j+8}; b_j = a_j + a_{j+4}; total = (b_0 + b_2) + (b_1 + b_3).
 * All dot products of the unit end here, so a row's result does not depend
 * on which tile (or kernel) computed it. */
Q3_INLINE __m128 q3_reduce4(__m512 v0, __m512 v1, __m512 v2, __m512 v3)
{
    __m512 a01 = _mm512_add_ps(_mm512_shuffle_f32x4(v0, v1, _MM_SHUFFLE(1, 0, 1, 0)),
                               _mm512_shuffle_f32x4(v0, v1, _MM_SHUFFLE(3, 2, 3, 2)));
    __m512 a23 = _mm512_add_ps(_mm512_shuffle_f32x4(v2, v3, _MM_SHUFFLE(1, 0, 1, 0)),
                               _mm512_shuffle_f32x4(v2, v3, _MM_SHUFFLE(3, 2, 3, 2)));
    __m512 b = _mm512_add_ps(_mm512_shuffle_f32x4(a01, a23, _MM_SHUFFLE(2, 0, 2, 0)),
                             _mm512_shuffle_f32x4(a01, a23, _MM_SHUFFLE(3, 1, 3, 1)));
    __m512 c = _mm512_add_ps(b, _mm512_permute_ps(b, _MM_SHUFFLE(1, 0, 3, 2)));
    __m512 d = _mm512_add_ps(c, _mm512_permute_ps(c, _MM_SHUFFLE(2, 3, 0, 1)));
    return _mm512_castps512_ps128(_mm512_permutexvar_ps(_mm512_set_epi32(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 12, 8, 4, 0), d));
}

/* The lane sum of one vector, by the same tree. */
Q3_INLINE float q3_hsum(__m512 v)
{
    __m512 z = _mm512_setzero_ps();
    return _mm_cvtss_f32(q3_reduce4(v, z, z, z));
}

/* ---- exp ---------------------------------------------------------------------------- */

/* 2^x to ~2 ulp: exactly 1 at x = 0; 0 (or a denormal) far below -126; +inf
 * above 128. Taylor polynomial of degree 7 on [-1/2, 1/2], then scalef. */
Q3_INLINE __m512 q3_exp2_ps(__m512 x)
{
    x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-160.0f)), _mm512_set1_ps(160.0f));
    __m512 n = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 f = _mm512_sub_ps(x, n);
    __m512 p = _mm512_set1_ps(1.525273380405984e-05f);
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.5403530393381606e-04f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.3333558146428443e-03f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.618129107628477e-03f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.550410866482158e-02f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.402265069591007e-01f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.931471805599453e-01f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(p, n);
}

/* ---- element conversions ------------------------------------------------------------ */

/* 16 BF16 / F16 values (masked: missing lanes read as 0) to F32, exactly. */
Q3_INLINE __m512 q3_load_bf16x16(const uint16_t *p, __mmask16 m)
{
    __m256i h = _mm256_maskz_loadu_epi16(m, p);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

Q3_INLINE __m512 q3_load_f16x16(const uint16_t *p, __mmask16 m)
{
    return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, p));
}

/* 16 floats to BF16 rounding to nearest even, NaN kept quiet: bit for bit
 * q3_f32_to_bf16 (vcvtneps2bf16 would flush denormals). */
Q3_INLINE __m256i q3_cvt_bf16x16(__m512 v)
{
    __m512i u = _mm512_castps_si512(v);
    __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    __m512i r = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)), lsb), 16);
    __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)),
                                            _mm512_set1_epi32(0x7f800000));
    r = _mm512_mask_or_epi32(r, nan, _mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40));
    return _mm512_cvtepi32_epi16(r);
}

/* 16 floats to F16 rounding to nearest even (F16C handles denormals and overflow
 * as q3_f32_to_f16 does). */
Q3_INLINE __m256i q3_cvt_f16x16(__m512 v)
{
    return _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}

/* ---- Q8_0 blocks (the KV cache's; layout in model/dtype.h) ---------------------------- */

/* One block (f16 scale d, 32 int8 q) as F32 d * q in two vectors, the values
 * q3_row_to_f32 gives: d has 11 significant bits and q 8, so every product is
 * exact and no rounding can differ. */
Q3_INLINE void q3_load_q8_0x32(const uint8_t *b, __m512 *lo, __m512 *hi)
{
    __m512 d = _mm512_set1_ps(_cvtsh_ss((unsigned short)(b[0] | b[1] << 8)));
    __m256i q = _mm256_loadu_si256((const __m256i *)(b + 2));
    *lo = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_castsi256_si128(q))));
    *hi = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_extracti128_si256(q, 1))));
}

/* 16 values v * id rounded half away from zero (as roundf), stored as int8;
 * lanes whose rounded value is outside [-127, 127] or NaN store 0. trunc(v)
 * and v - trunc(v) are exact, so |v - trunc(v)| >= 0.5 decides as roundf does. */
Q3_INLINE __m128i q3_q8_round16(__m512 x, __m512 id)
{
    __m512 v = _mm512_mul_ps(x, id);
    __m512 t = _mm512_roundscale_ps(v, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
    __mmask16 up = _mm512_cmp_ps_mask(_mm512_abs_ps(_mm512_sub_ps(v, t)), _mm512_set1_ps(0.5f), _CMP_GE_OQ);
    __m512 one = _mm512_castsi512_ps(_mm512_or_si512(_mm512_set1_epi32(0x3f800000),
                                                     _mm512_and_si512(_mm512_castps_si512(v), _mm512_set1_epi32((int)0x80000000u))));
    __m512 r = _mm512_mask_add_ps(t, up, t, one);
    __mmask16 ok = _mm512_cmp_ps_mask(r, _mm512_set1_ps(-127.0f), _CMP_GE_OQ) &
                   _mm512_cmp_ps_mask(r, _mm512_set1_ps(127.0f), _CMP_LE_OQ);
    return _mm512_cvtepi32_epi8(_mm512_maskz_cvttps_epi32(ok, r));
}

/* Quantizes 32 floats into one block, bit for bit q3_quantize_q8_0: amax over
 * the non-NaN |x| (max is exact in any order), d = amax / 127 stored as f16
 * (F16C rounds as q3_f32_to_f16 does), id = 1 / d (0 when d is 0), then
 * q3_q8_round16. */
Q3_INLINE void q3_store_q8_0x32(const float *x, uint8_t *b)
{
    __m512 x0 = _mm512_loadu_ps(x), x1 = _mm512_loadu_ps(x + 16);
    /* vmaxps returns its second operand when either is NaN: NaN lanes keep the running max */
    __m512 m = _mm512_max_ps(_mm512_abs_ps(x0), _mm512_setzero_ps());
    m = _mm512_max_ps(_mm512_abs_ps(x1), m);
    float amax = _mm512_reduce_max_ps(m);
    float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
    unsigned short h = _cvtss_sh(d, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    b[0] = (uint8_t)(h & 0xff);
    b[1] = (uint8_t)(h >> 8);
    __m512 vid = _mm512_set1_ps(id);
    _mm_storeu_si128((__m128i *)(b + 2), q3_q8_round16(x0, vid));
    _mm_storeu_si128((__m128i *)(b + 18), q3_q8_round16(x1, vid));
}

/* Transposes 16 rows r[0..15] of 16 values in registers: row i of dst (at
 * dst + i * ldd) gets column i. Rows of dst are stored under mask; only rows
 * i < n_dst_rows are written. */
Q3_INLINE void q3_transpose16_regs(const __m512 *r, float *dst, size_t ldd, int n_dst_rows, __mmask16 mask)
{
    __m512 t[16], u[16];
    for (int i = 0; i < 8; i++) {
        t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    /* u[4i + e], 128-bit lane L: column 4L + e of rows 4i..4i+3 */
    for (int i = 0; i < 4; i++) {
        u[4 * i + 0] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], 0x44);
        u[4 * i + 1] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], 0xee);
        u[4 * i + 2] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0x44);
        u[4 * i + 3] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0xee);
    }
    for (int e = 0; e < 4; e++) {
        __m512 v02 = _mm512_shuffle_f32x4(u[e], u[4 + e], _MM_SHUFFLE(2, 0, 2, 0));
        __m512 w02 = _mm512_shuffle_f32x4(u[8 + e], u[12 + e], _MM_SHUFFLE(2, 0, 2, 0));
        __m512 v13 = _mm512_shuffle_f32x4(u[e], u[4 + e], _MM_SHUFFLE(3, 1, 3, 1));
        __m512 w13 = _mm512_shuffle_f32x4(u[8 + e], u[12 + e], _MM_SHUFFLE(3, 1, 3, 1));
        __m512 c0 = _mm512_shuffle_f32x4(v02, w02, _MM_SHUFFLE(2, 0, 2, 0)); /* column e */
        __m512 c2 = _mm512_shuffle_f32x4(v02, w02, _MM_SHUFFLE(3, 1, 3, 1)); /* column 8 + e */
        __m512 c1 = _mm512_shuffle_f32x4(v13, w13, _MM_SHUFFLE(2, 0, 2, 0)); /* column 4 + e */
        __m512 c3 = _mm512_shuffle_f32x4(v13, w13, _MM_SHUFFLE(3, 1, 3, 1)); /* column 12 + e */
        if (e < n_dst_rows) _mm512_mask_storeu_ps(dst + (size_t)e * ldd, mask, c0);
        if (4 + e < n_dst_rows) _mm512_mask_storeu_ps(dst + (size_t)(4 + e) * ldd, mask, c1);
        if (8 + e < n_dst_rows) _mm512_mask_storeu_ps(dst + (size_t)(8 + e) * ldd, mask, c2);
        if (12 + e < n_dst_rows) _mm512_mask_storeu_ps(dst + (size_t)(12 + e) * ldd, mask, c3);
    }
}

/* The same for a 16 x 16 block in memory (rows at src + j * lds). */
Q3_INLINE void q3_transpose16(const float *src, size_t lds, float *dst, size_t ldd, int n_dst_rows, __mmask16 mask)
{
    __m512 r[16];
    for (int i = 0; i < 16; i++) r[i] = _mm512_loadu_ps(src + (size_t)i * lds);
    q3_transpose16_regs(r, dst, ldd, n_dst_rows, mask);
}

/* Mask of the first n lanes (n may be negative or exceed the width). */
Q3_INLINE __mmask16 q3_mask16(int n)
{
    return n >= 16 ? (__mmask16)0xffff : n <= 0 ? (__mmask16)0 : (__mmask16)((1u << n) - 1);
}
Q3_INLINE __mmask32 q3_mask32(int n)
{
    return n >= 32 ? (__mmask32)0xffffffffu : n <= 0 ? (__mmask32)0 : (__mmask32)((1u << n) - 1);
}

#endif
