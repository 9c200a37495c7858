/* The 16-output panels of the AVX-512 VNNI quantized matmuls (quant_avx512.c:
 * Q8_0/Q4_0; kquant_avx512.c: the K-quants): the panel's row pointers, the
 * in-register transposes of its rows' bytes into the output form, the dot
 * product with an embedded broadcast, and line prefetches. Include only
 * from files compiled with the AVX-512 flags. */
#ifndef Q3_BACKEND_CPU_QUANT_PANEL_AVX512_H
#define Q3_BACKEND_CPU_QUANT_PANEL_AVX512_H

#include "backend/cpu/quant_kernels.h"
#include "backend/cpu/simd_avx512.h"

#define Q3_QPANEL 16 /* outputs per panel, one per 32-bit lane */

/* The rows of the panel at output o: row l is output min(o + l, o1 - 1)
 * (duplicates are computed and never stored). The gather offsets are int32:
 * 15 rows of a weight must span less than 2 GB. */
typedef struct q3_panel_rows {
    const uint8_t *p[Q3_QPANEL];
    __m512i vidx; /* p[l] - p[0], for gathers of one field of every row */
} q3_panel_rows;

static inline void q3_panel_rows_init(q3_panel_rows *pr, const void *w, size_t ws, int o, int o1)
{
    int32_t idx[Q3_QPANEL];
    for (int l = 0; l < Q3_QPANEL; l++) {
        int row = o + l < o1 ? o + l : o1 - 1;
        pr->p[l] = (const uint8_t *)w + (size_t)row * ws;
        idx[l] = (int32_t)((size_t)(row - o) * ws);
    }
    pr->vidx = _mm512_loadu_si512(idx);
}

/* 16 rows x 32 bytes at byte off of each row -> T[8], lane l of T[j] = bytes
 * 4j..4j+3 of row l. Z[i] holds rows (i, i+4) for i < 4 and (i+4, i+8) for
 * i >= 4, so the three unpack/shuffle stages leave the rows in lane order. */
Q3_INLINE void q3_panel_tr32(const q3_panel_rows *pr, size_t off, __m512i T[8])
{
    __m512i Z[8], t[8], u[8];
#pragma GCC unroll 8
    for (int i = 0; i < 8; i++) {
        int a = i < 4 ? i : i + 4;
        __m256i lo = _mm256_loadu_si256((const __m256i *)(pr->p[a] + off));
        __m256i hi = _mm256_loadu_si256((const __m256i *)(pr->p[a + 4] + off));
        Z[i] = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
    }
#pragma GCC unroll 4
    for (int m = 0; m < 4; m++) {
        t[2 * m] = _mm512_unpacklo_epi32(Z[2 * m], Z[2 * m + 1]);
        t[2 * m + 1] = _mm512_unpackhi_epi32(Z[2 * m], Z[2 * m + 1]);
    }
#pragma GCC unroll 2
    for (int h = 0; h < 2; h++) {
        __m512i *tt = t + 4 * h, *uu = u + 4 * h;
        uu[0] = _mm512_unpacklo_epi64(tt[0], tt[2]);
        uu[1] = _mm512_unpackhi_epi64(tt[0], tt[2]);
        uu[2] = _mm512_unpacklo_epi64(tt[1], tt[3]);
        uu[3] = _mm512_unpackhi_epi64(tt[1], tt[3]);
    }
#pragma GCC unroll 4
    for (int j = 0; j < 4; j++) {
        T[j] = _mm512_shuffle_i32x4(u[j], u[4 + j], _MM_SHUFFLE(2, 0, 2, 0));
        T[j + 4] = _mm512_shuffle_i32x4(u[j], u[4 + j], _MM_SHUFFLE(3, 1, 3, 1));
    }
}

/* 16 rows x 16 bytes at off -> V[4], lane l of V[j] = bytes 4j..4j+3 of row l. */
Q3_INLINE void q3_panel_tr16(const q3_panel_rows *pr, size_t off, __m512i V[4])
{
    __m512i Y[4];
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++) {
        __m512i v = _mm512_castsi128_si512(_mm_loadu_si128((const __m128i *)(pr->p[i] + off)));
        v = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)(pr->p[4 + i] + off)), 1);
        v = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)(pr->p[8 + i] + off)), 2);
        Y[i] = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)(pr->p[12 + i] + off)), 3);
    }
    __m512i t0 = _mm512_unpacklo_epi32(Y[0], Y[1]), t1 = _mm512_unpackhi_epi32(Y[0], Y[1]);
    __m512i t2 = _mm512_unpacklo_epi32(Y[2], Y[3]), t3 = _mm512_unpackhi_epi32(Y[2], Y[3]);
    V[0] = _mm512_unpacklo_epi64(t0, t2);
    V[1] = _mm512_unpackhi_epi64(t0, t2);
    V[2] = _mm512_unpacklo_epi64(t1, t3);
    V[3] = _mm512_unpackhi_epi64(t1, t3);
}

/* The lanes of panel p (outputs 16p..16p+15) that fall in [o0, o1). */
Q3_INLINE __mmask16 q3_panel_mask(int p, int o0, int o1)
{
    int lo = o0 - p * Q3_QPANEL, hi = o1 - p * Q3_QPANEL;
    lo = lo < 0 ? 0 : lo;
    hi = hi > Q3_QPANEL ? Q3_QPANEL : hi;
    return (__mmask16)(q3_mask16(hi) & ~q3_mask16(lo));
}

/* acc += vpdpbusd(T, the 4 bytes at p broadcast): the broadcast embedded in
 * the instruction. (GCC emits a separate vpbroadcastd, which on this core
 * costs a shuffle-port uop per dot product: 20-30% of the GEMM.) */
Q3_INLINE __m512i q3_dot_bcast(__m512i acc, __m512i T, const void *p)
{
    __asm__("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(T), "m"(*(const int32_t *)p));
    return acc;
}

/* Prefetches lines [from, to) of a region of bytes (clipped to its size),
 * into L1 (hint 0) or L2 (hint 1). */
Q3_INLINE void q3_prefetch_lines(const char *p, size_t bytes, size_t from, size_t to, const int hint)
{
    if (to > bytes) to = bytes;
    for (size_t l = from; l < to; l += 64) {
        if (hint == 0) _mm_prefetch(p + l, _MM_HINT_T0);
        else _mm_prefetch(p + l, _MM_HINT_T1);
    }
}

#endif
