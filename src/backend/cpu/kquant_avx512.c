/* Q4_K / Q5_K / Q6_K MATMUL on AVX-512 VNNI (numerics and the activation
 * layout in quant_kernels.h; block layouts in model/dtype.h).
 *
 * The same "output form" as the Q8_0/Q4_0 kernels (quant_avx512.c): a panel
 * is 16 consecutive outputs, one per 32-bit lane. Every 32 bytes of a
 * super-block of the panel's 16 rows are transposed (once, when the weight
 * is packed) into T[0..7] (lane l of T[j]: the 4 bytes of row l that meet activation bytes
 * 4j..4j+3), from which the unsigned quants of one or two activation blocks
 * of 32 values are masked out (Q4_K/Q5_K: both nibbles, plus the 5th bit;
 * Q6_K: a nibble plus 2 top bits); each block's scales are two float vectors
 * F0, F1 (Q4_K/Q5_K: d*sc and dmin*m of each row's sub-block; Q6_K: d*sc of
 * its two sub-blocks). Then one activation row is 8 vpdpbusd (broadcast
 * activation bytes, integer sums exact in the lanes, no lane reductions) and
 * a fold of a few float operations per block, the same sequence whichever way
 * the block was reached:
 *  - GEMV (1 row, and decode steps of a few rows: up to 16 for Q4_K/Q5_K,
 *    8 for Q6_K, in passes of up to 8 rows): the transposed quants go from
 *    the packed weight straight into the dot products of every row (no
 *    copy), each weight byte read from memory once a pass, the next panel
 *    prefetched into L2 in address order meanwhile, a few lines per eighth
 *    of a super-block;
 *  - GEMM (more rows): the whole panel is unpacked once into scratch (8
 *    packed blocks of 640 bytes per super-block: T[0..7], F0, F1), then every
 *    tile of activation rows walks it, 8 rows at a time.
 * The weights are read in the table's own layout (made once per weight by
 * q3_kquant_pack_avx512; "the packed layout" below): panel after panel, each
 * panel's super-blocks in order, super-block s of its 16 rows one region of
 * 16 x 144/176/210 bytes holding them already transposed. Each step reads
 * one contiguous run and the panel streams in address order (the file's
 * rows are 16 interleaved streams, which the hardware prefetchers follow
 * poorly), with no transposing shuffles left in the loop.
 * Scales: the 16 header bytes of Q4_K/Q5_K (d, dmin, 12 scale bytes) and
 * the 16 int8 scales of Q6_K come in through one 16 x 16-byte transpose per
 * super-block and are decoded in 32-bit lanes (6-bit fields by shifts and
 * masks), so every lane holds its own row's scales. */
#include <string.h>

#include "backend/cpu/quant_kernels.h"
#include "backend/cpu/quant_panel_avx512.h"
#include "backend/cpu/simd_avx512.h"

#define PANEL Q3_QPANEL
#define KB_BYTES 640              /* a packed activation-block step: T[0..7], F0, F1 */
#define SB_PACKED (8 * KB_BYTES)  /* a packed super-block of 16 rows */
#define SMALL_GROUP 8             /* rows per streaming pass of the GEMV */

/* Bytes of a super-block of kind 4, 5, 6 (Q4_K, Q5_K, Q6_K). */
Q3_INLINE size_t sb_bytes(const int kind) { return kind == 4 ? Q3_Q4_K_BYTES : kind == 5 ? Q3_Q5_K_BYTES : Q3_Q6_K_BYTES; }

/* Bytes shifted within their 16-bit lanes (callers mask, so no bit they keep
 * crosses a byte). */
Q3_INLINE __m512i shl16(__m512i v, const int n)
{
    return n > 0 ? _mm512_slli_epi16(v, (unsigned)n) : n < 0 ? _mm512_srli_epi16(v, (unsigned)-n) : v;
}

/* Sub-block j's scale and min of a Q4_K / Q5_K super-block as floats
 * (d * sc, dmin * m), from the transposed scale bytes V[1..3]. */
Q3_INLINE void scales45(const __m512i V[4], __m512 d, __m512 dm, const int j, __m512 *fs, __m512 *fm)
{
    const __m512i m6 = _mm512_set1_epi32(63), m4 = _mm512_set1_epi32(15), m2 = _mm512_set1_epi32(3);
    __m512i sc, m;
    if (j < 4) {
        sc = _mm512_and_si512(_mm512_srli_epi32(V[1], 8 * j), m6);
        m = _mm512_and_si512(_mm512_srli_epi32(V[2], 8 * j), m6);
    } else {
        const int s = 8 * (j - 4);
        sc = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(V[3], s), m4),
                             _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(V[1], s + 6), m2), 4));
        m = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(V[3], s + 4), m4),
                            _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(V[2], s + 6), m2), 4));
    }
    *fs = _mm512_mul_ps(d, _mm512_cvtepi32_ps(sc));
    *fm = _mm512_mul_ps(dm, _mm512_cvtepi32_ps(m));
}

/* ---- the packed layout ------------------------------------------------------------------
 *
 * Super-block s of a panel is one region of 16 x sbb bytes (sbb = 144, 176,
 * 210) holding the chunks the kernels transpose, already transposed: the 16
 * rows' 32 bytes at offset x of the super-block (x a multiple of 16) as
 * T[0..7] at region + 16 x (512 bytes), 16-byte chunks as V[0..3] at region +
 * 16 x (256 bytes); Q6_K's 16 f16 d after them at region + 16 * 208. The same
 * size as the file's rows, and the kernels load with no shuffle. */

/* T[8]: the transposed 32-byte chunk at offset x of the super-block at region boff. */
Q3_INLINE void ktr32(const char *panel, size_t boff, size_t x, __m512i T[8])
{
    const char *q = panel + boff + 16 * x;
#pragma GCC unroll 8
    for (int j = 0; j < 8; j++) T[j] = _mm512_loadu_si512(q + 64 * j);
}

/* V[4]: the transposed 16-byte chunk at offset x. */
Q3_INLINE void ktr16(const char *panel, size_t boff, size_t x, __m512i V[4])
{
    const char *q = panel + boff + 16 * x;
#pragma GCC unroll 4
    for (int j = 0; j < 4; j++) V[j] = _mm512_loadu_si512(q + 64 * j);
}

/* Q6_K: the 16 rows' d. */
Q3_INLINE __m512 q6_d(const char *panel, size_t boff)
{
    return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(panel + boff + 16 * 208)));
}

/* ---- unpacking a super-block of the panel ------------------------------------------------ */

/* Q4_K (q5 = 0) / Q5_K (q5 = 1) super-block at byte boff of each row -> dst. */
Q3_INLINE void unpack_q45(const int q5, const char *panel, size_t boff, char *dst)
{
    __m512i V[4];
    ktr16(panel, boff, 0, V); /* V[0]: d | dmin << 16; V[1..3]: the 12 scale bytes */
    const __m512 d = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(V[0]));
    const __m512 dm = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(V[0], 16)));
#pragma GCC unroll 8
    for (int j = 0; j < 8; j++) {
        __m512 fs, fm;
        scales45(V, d, dm, j, &fs, &fm);
        _mm512_store_ps(dst + j * KB_BYTES + 512, fs);
        _mm512_store_ps(dst + j * KB_BYTES + 576, fm);
    }
    const __m512i lo4 = _mm512_set1_epi8(0x0f), bit4 = _mm512_set1_epi8(0x10);
    __m512i H[8];
    if (q5) ktr32(panel, boff, 16, H);
    const size_t qx = q5 ? 48 : 16;
#pragma GCC unroll 4
    for (int k = 0; k < 4; k++) {
        __m512i T[8];
        ktr32(panel, boff, qx + 32 * (size_t)k, T);
        char *d0 = dst + 2 * k * KB_BYTES, *d1 = d0 + KB_BYTES;
#pragma GCC unroll 8
        for (int j = 0; j < 8; j++) {
            __m512i a = _mm512_and_si512(T[j], lo4), b = _mm512_and_si512(_mm512_srli_epi16(T[j], 4), lo4);
            if (q5) { /* bit 2k of qh is a's 5th bit, bit 2k + 1 b's */
                a = _mm512_or_si512(a, _mm512_and_si512(shl16(H[j], 4 - 2 * k), bit4));
                b = _mm512_or_si512(b, _mm512_and_si512(shl16(H[j], 3 - 2 * k), bit4));
            }
            _mm512_store_si512(d0 + 64 * j, a);
            _mm512_store_si512(d1 + 64 * j, b);
        }
    }
}

/* Q6_K super-block at byte boff of each row -> dst. */
Q3_INLINE void unpack_q6(const char *panel, size_t boff, char *dst)
{
    __m512i V[4];
    ktr16(panel, boff, 192, V); /* the 16 int8 scales */
    const __m512 d = q6_d(panel, boff);
#pragma GCC unroll 16
    for (int j = 0; j < 16; j++) {
        __m512i sc = _mm512_srai_epi32(_mm512_slli_epi32(V[j / 4], 24 - 8 * (j % 4)), 24);
        _mm512_store_ps(dst + (j / 2) * KB_BYTES + 512 + 64 * (j % 2), _mm512_mul_ps(d, _mm512_cvtepi32_ps(sc)));
    }
    const __m512i lo4 = _mm512_set1_epi8(0x0f), hi2 = _mm512_set1_epi8(0x30);
#pragma GCC unroll 2
    for (int h = 0; h < 2; h++) {
        __m512i TA[8], TB[8], TC[8];
        ktr32(panel, boff, 64 * (size_t)h, TA);       /* values 128h + i (low), 128h + 64 + i (high) */
        ktr32(panel, boff, 64 * (size_t)h + 32, TB);  /* 128h + 32 + i, 128h + 96 + i */
        ktr32(panel, boff, 128 + 32 * (size_t)h, TC); /* their top 2 bits at bits 0, 2, 4, 6 */
        char *o = dst + 4 * h * KB_BYTES;
#pragma GCC unroll 8
        for (int j = 0; j < 8; j++) {
            __m512i c = TC[j];
            __m512i v0 = _mm512_or_si512(_mm512_and_si512(TA[j], lo4), _mm512_and_si512(_mm512_slli_epi16(c, 4), hi2));
            __m512i v1 = _mm512_or_si512(_mm512_and_si512(TB[j], lo4), _mm512_and_si512(_mm512_slli_epi16(c, 2), hi2));
            __m512i v2 = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(TA[j], 4), lo4), _mm512_and_si512(c, hi2));
            __m512i v3 = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(TB[j], 4), lo4),
                                         _mm512_and_si512(_mm512_srli_epi16(c, 2), hi2));
            _mm512_store_si512(o + 64 * j, v0);
            _mm512_store_si512(o + KB_BYTES + 64 * j, v1);
            _mm512_store_si512(o + 2 * KB_BYTES + 64 * j, v2);
            _mm512_store_si512(o + 3 * KB_BYTES + 64 * j, v3);
        }
    }
}

Q3_INLINE void unpack(const int kind, const char *panel, size_t boff, char *dst)
{
    if (kind == 6) unpack_q6(panel, boff, dst);
    else unpack_q45(kind == 5, panel, boff, dst);
}

/* ---- the dot products ------------------------------------------------------------------------ */

/* Rows [r0, r0 + R) of an activation tile of th rows (block data at a:
 * q[th][32], c[th], d[th]) against the packed block pb: f[r] folds in the
 * block as quant_kernels.h defines. */
Q3_INLINE void kdot(const int q6, const int R, const char *pb, const char *a, int th, int r0, __m512 *f)
{
    const char *aq = a + 32 * r0, *ac = a + 32 * th + 4 * r0, *ad = a + 36 * th + 4 * r0;
    __m512i acc[8];
    if (!q6) {
        __m512i T[8];
#pragma GCC unroll 8
        for (int j = 0; j < 8; j++) T[j] = _mm512_load_si512(pb + 64 * j);
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) acc[r] = _mm512_setzero_si512();
#pragma GCC unroll 8
        for (int j = 0; j < 8; j++)
#pragma GCC unroll 8
            for (int r = 0; r < R; r++) acc[r] = q3_dot_bcast(acc[r], T[j], aq + 32 * r + 4 * j);
        const __m512 F0 = _mm512_load_ps(pb + 512), F1 = _mm512_load_ps(pb + 576);
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) {
            const __m512 dx = _mm512_set1_ps(q3_ld_f32(ad + 4 * r));
            const uint32_t c = (uint32_t)q3_ld_i32(ac + 4 * r);
            const float S = (float)((int16_t)(c & 0xffff) + (int16_t)(c >> 16));
            f[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc[r]), _mm512_mul_ps(F0, dx), f[r]);
            f[r] = _mm512_fnmadd_ps(_mm512_set1_ps(S), _mm512_mul_ps(F1, dx), f[r]);
        }
        return;
    }
#pragma GCC unroll 2
    for (int h = 0; h < 2; h++) {
        __m512i T[4];
#pragma GCC unroll 4
        for (int j = 0; j < 4; j++) T[j] = _mm512_load_si512(pb + 256 * h + 64 * j);
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) {
            const uint32_t c = (uint32_t)q3_ld_i32(ac + 4 * r);
            acc[r] = _mm512_set1_epi32(-32 * (int16_t)(h ? c >> 16 : c & 0xffff));
        }
#pragma GCC unroll 4
        for (int j = 0; j < 4; j++)
#pragma GCC unroll 8
            for (int r = 0; r < R; r++) acc[r] = q3_dot_bcast(acc[r], T[j], aq + 32 * r + 16 * h + 4 * j);
        const __m512 F = _mm512_load_ps(pb + 512 + 64 * h);
#pragma GCC unroll 8
        for (int r = 0; r < R; r++)
            f[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc[r]), _mm512_mul_ps(F, _mm512_set1_ps(q3_ld_f32(ad + 4 * r))), f[r]);
    }
}

/* The next panel's bytes, prefetched into L2 (PREFETCHT1) a few lines at a
 * time as the current panel is worked through: a panel's worth at once
 * overflows the miss queue and stalls, and into L1 (T0) the next panel
 * evicts the current one once two panels outgrow L1 (k >= 2048, or Q6_K):
 * measured from memory, 1 thread, T1 against T0: q6_k 15 vs 9 GB/s, q4_k
 * 15 vs 10-20 (k = 1024 fast, k = 3072 slow). */
typedef struct pf_cursor {
    const char *p;
    size_t bytes, at, step;
} pf_cursor;

Q3_INLINE void pf_next(pf_cursor *c)
{
    q3_prefetch_lines(c->p, c->bytes, c->at, c->at + c->step, 1);
    c->at += c->step;
}

/* ---- GEMV and the few-row decode: fused ------------------------------------------------------ */


/* R rows of a tile of activation blocks, from block b0 on: row r's q of
 * block b0 + i at q + i * bs + 32 r, its c at c + i * bs + 4 r, its d at
 * d + i * bs + 4 r (bs: the tile's bytes per block). */
typedef struct arows {
    const char *q, *c, *d;
    size_t bs;
} arows;

/* The same rows from block i on. */
Q3_INLINE arows arows_at(const arows *a, int i)
{
    const size_t o = (size_t)i * a->bs;
    return (arows){a->q + o, a->c + o, a->d + o, a->bs};
}

Q3_INLINE float a_d(const arows *a, int r) { return q3_ld_f32(a->d + 4 * r); }
Q3_INLINE uint32_t a_c(const arows *a, int r) { return (uint32_t)q3_ld_i32(a->c + 4 * r); }

/* Folds Q4_K / Q5_K block sums I[r] of the R rows of activation block a. */
Q3_INLINE void fold45(const int R, const __m512i *I, __m512 fs, __m512 fm, const arows *a, __m512 *f)
{
#pragma GCC unroll 8
    for (int r = 0; r < R; r++) {
        const __m512 dx = _mm512_set1_ps(a_d(a, r));
        const uint32_t c = a_c(a, r);
        const float S = (float)((int16_t)(c & 0xffff) + (int16_t)(c >> 16));
        f[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(I[r]), _mm512_mul_ps(fs, dx), f[r]);
        f[r] = _mm512_fnmadd_ps(_mm512_set1_ps(S), _mm512_mul_ps(fm, dx), f[r]);
    }
}

/* Activation blocks 2k and 2k + 1 of a Q4_K / Q5_K super-block (quants at
 * qoff + 32k of each row; header V, d, dm; Q5_K's high bits H). */
Q3_INLINE void sb45_step(const int q5, const int R, const char *panel, size_t boff, size_t qx, int k, const __m512i V[4], __m512 d,
                         __m512 dm, const __m512i H[8], const arows *a, __m512 *f, pf_cursor *pf)
{
    const __m512i lo4 = _mm512_set1_epi8(0x0f), hi4 = _mm512_set1_epi8((char)0xf0), bit4 = _mm512_set1_epi8(0x10);
    __m512i T[8], I0[SMALL_GROUP], I1[SMALL_GROUP];
    const arows a0 = arows_at(a, 2 * k), a1 = arows_at(a, 2 * k + 1);
    pf_next(pf);
    ktr32(panel, boff, qx + 32 * (size_t)k, T);
#pragma GCC unroll 8
    for (int r = 0; r < R; r++) I0[r] = I1[r] = _mm512_setzero_si512();
#pragma GCC unroll 8
    for (int j = 0; j < 8; j++) {
        if (j == 4) pf_next(pf);
        __m512i lo = _mm512_and_si512(T[j], lo4), hi;
        if (q5) { /* bit 2k of qh is lo's 5th bit, bit 2k + 1 hi's */
            hi = _mm512_and_si512(_mm512_srli_epi16(T[j], 4), lo4);
            lo = _mm512_or_si512(lo, _mm512_and_si512(shl16(H[j], 4 - 2 * k), bit4));
            hi = _mm512_or_si512(hi, _mm512_and_si512(shl16(H[j], 3 - 2 * k), bit4));
        } else {
            hi = _mm512_and_si512(T[j], hi4);
        }
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) {
            I0[r] = q3_dot_bcast(I0[r], lo, a0.q + 32 * r + 4 * j);
            I1[r] = q3_dot_bcast(I1[r], hi, a1.q + 32 * r + 4 * j);
        }
    }
    if (!q5)
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) I1[r] = _mm512_srai_epi32(I1[r], 4);
    __m512 fs, fm;
    scales45(V, d, dm, 2 * k, &fs, &fm);
    fold45(R, I0, fs, fm, &a0, f);
    scales45(V, d, dm, 2 * k + 1, &fs, &fm);
    fold45(R, I1, fs, fm, &a1, f);
}

/* One Q4_K (q5 = 0) / Q5_K (q5 = 1) super-block of the panel at boff against
 * its 8 activation blocks a..: every 32 bytes of the 16 rows are transposed
 * and go straight into the dot products of two activation blocks (low
 * nibbles: block 2k, high: 2k + 1). Q4_K's high nibbles are used in place
 * (T & 0xf0: 16 times the quant, so 16 times the exact sum, shifted back
 * before the fold). */
Q3_INLINE void sb_q45(const int q5, const int R, const char *panel, size_t boff, const arows *a, __m512 *f, pf_cursor *pf)
{
    __m512i V[4];
    ktr16(panel, boff, 0, V);
    const __m512 d = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(V[0]));
    const __m512 dm = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(V[0], 16)));
    __m512i H[8];
    if (q5) ktr32(panel, boff, 16, H);
    const size_t qx = q5 ? 48 : 16;
    if (q5) {
        sb45_step(1, R, panel, boff, qx, 0, V, d, dm, H, a, f, pf);
        sb45_step(1, R, panel, boff, qx, 1, V, d, dm, H, a, f, pf);
        sb45_step(1, R, panel, boff, qx, 2, V, d, dm, H, a, f, pf);
        sb45_step(1, R, panel, boff, qx, 3, V, d, dm, H, a, f, pf);
    } else {
#pragma GCC unroll 1
        for (int k = 0; k < 4; k++) sb45_step(0, R, panel, boff, qx, k, V, d, dm, H, a, f, pf);
    }
}

/* One Q6_K super-block of the panel at boff against its 8 activation blocks
 * a..: per half h (values 128h..128h+127: activation blocks 4h + g, g =
 * 0..3), the top-bit bytes TC and the low-nibble bytes TA (blocks g = 0, 2)
 * then TB (g = 1, 3) go straight into the dot products, each block's two
 * 16-value sub-blocks in their own sums (seeded with the -32 offset); the
 * four blocks are folded in order after. */
Q3_INLINE void sb_q6(const int R, const char *panel, size_t boff, const arows *a, __m512 *f, pf_cursor *pf)
{
    __m512i V[4];
    ktr16(panel, boff, 192, V); /* the 16 int8 scales */
    const __m512 d = q6_d(panel, boff);
    const __m512i lo4 = _mm512_set1_epi8(0x0f), hi2 = _mm512_set1_epi8(0x30);
#pragma GCC unroll 1
    for (int h = 0; h < 2; h++) {
        arows ag[4];
        __m512i TC[8], T[8], J[4][2][SMALL_GROUP];
#pragma GCC unroll 4
        for (int q = 0; q < 4; q++) {
            ag[q] = arows_at(a, 4 * h + q);
#pragma GCC unroll 8
            for (int r = 0; r < R; r++) {
                const uint32_t c = a_c(&ag[q], r);
                J[q][0][r] = _mm512_set1_epi32(-32 * (int16_t)(c & 0xffff));
                J[q][1][r] = _mm512_set1_epi32(-32 * (int16_t)(c >> 16));
            }
        }
        ktr32(panel, boff, 128 + 32 * (size_t)h, TC); /* the top 2 bits of the 4 groups at bits 0, 2, 4, 6 */
#pragma GCC unroll 2
        for (int p = 0; p < 2; p++) {               /* TA: groups 0 and 2; TB: groups 1 and 3 */
            pf_next(pf);
            ktr32(panel, boff, 64 * (size_t)h + 32 * (size_t)p, T);
#pragma GCC unroll 8
            for (int j = 0; j < 8; j++) {
                if (j == 4) pf_next(pf);
                const __m512i c = TC[j];
                const __m512i v = _mm512_or_si512(_mm512_and_si512(T[j], lo4),
                                                  _mm512_and_si512(p ? _mm512_slli_epi16(c, 2) : _mm512_slli_epi16(c, 4), hi2));
                const __m512i w = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(T[j], 4), lo4),
                                                  _mm512_and_si512(p ? _mm512_srli_epi16(c, 2) : c, hi2));
#pragma GCC unroll 8
                for (int r = 0; r < R; r++) {
                    J[p][j / 4][r] = q3_dot_bcast(J[p][j / 4][r], v, ag[p].q + 32 * r + 4 * j);
                    J[p + 2][j / 4][r] = q3_dot_bcast(J[p + 2][j / 4][r], w, ag[p + 2].q + 32 * r + 4 * j);
                }
            }
        }
#pragma GCC unroll 4
        for (int q = 0; q < 4; q++) {
#pragma GCC unroll 2
            for (int e = 0; e < 2; e++) {
                const int j = 8 * h + 2 * q + e; /* the sub-block */
                const __m512i sc = _mm512_srai_epi32(_mm512_slli_epi32(V[j / 4], 24 - 8 * (j % 4)), 24);
                const __m512 F = _mm512_mul_ps(d, _mm512_cvtepi32_ps(sc));
#pragma GCC unroll 8
                for (int r = 0; r < R; r++)
                    f[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(J[q][e][r]), _mm512_mul_ps(F, _mm512_set1_ps(a_d(&ag[q], r))),
                                           f[r]);
            }
        }
    }
}

/* Rows [r0, r0 + R) of the activations (one tile) against each panel of
 * [o0, o1) as it streams in: every weight byte read once and used by the R
 * rows straight from the registers it was transposed into, the next panel
 * prefetched meanwhile. R = 1 of 1 is the GEMV. */
Q3_INLINE void gemv(const int kind, const int R, const void *w, size_t ws, const q3_qact *qa, int r0, float *y,
                    size_t ldy, int o0, int o1)
{
    const int nsb = qa->k / 256, th = qa->rows;
    const size_t sbb = sb_bytes(kind), pbytes = (size_t)PANEL * ws;
    const size_t bs = (size_t)th * Q3_QACT_BLOCK_BYTES;
    const arows a0 = {qa->base + 32 * r0, qa->base + 32 * th + 4 * r0, qa->base + 36 * th + 4 * r0, bs};
    /* the next panel's bytes to prefetch per eighth of a super-block */
    const size_t per_step = (pbytes / 64 + 8 * (size_t)nsb - 1) / (8 * (size_t)nsb) * 64;
    const int p1 = (o1 + PANEL - 1) / PANEL;
    q3_prefetch_lines((const char *)w + (size_t)(o0 / PANEL) * pbytes, pbytes, 0, pbytes, 1);
    for (int p = o0 / PANEL; p < p1; p++) {
        const char *panel = (const char *)w + (size_t)p * pbytes;
        pf_cursor pf = {panel + pbytes, p + 1 < p1 ? pbytes : 0, 0, per_step};
        __m512 f[SMALL_GROUP];
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) f[r] = _mm512_setzero_ps();
        for (int s = 0; s < nsb; s++) {
            const arows a = arows_at(&a0, 8 * s);
            if (kind == 6) sb_q6(R, panel, (size_t)s * PANEL * sbb, &a, f, &pf);
            else sb_q45(kind == 5, R, panel, (size_t)s * PANEL * sbb, &a, f, &pf);
        }
        const __mmask16 m = q3_panel_mask(p, o0, o1);
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) _mm512_mask_storeu_ps(y + (size_t)(r0 + r) * ldy + (size_t)p * PANEL, m, f[r]);
    }
}

/* All qa->rows rows (one tile): groups of up to SMALL_GROUP rows, each a
 * streaming pass over the weights. */
#define GEMV_KIND(name, kind)                                                                                        \
    static void name(const void *w, size_t ws, const q3_qact *qa, float *y, size_t ldy, int o0, int o1)            \
    {                                                                                                                \
        if (qa->rows == 1) {                                                                                         \
            gemv(kind, 1, w, ws, &(q3_qact){qa->base, 1, qa->k}, 0, y, ldy, o0, o1);                                  \
            return;                                                                                                  \
        }                                                                                                            \
        for (int r0 = 0; r0 < qa->rows; r0 += SMALL_GROUP) {                                                         \
            switch (qa->rows - r0 < SMALL_GROUP ? qa->rows - r0 : SMALL_GROUP) {                                     \
            case 1: gemv(kind, 1, w, ws, qa, r0, y, ldy, o0, o1); break;                                             \
            case 2: gemv(kind, 2, w, ws, qa, r0, y, ldy, o0, o1); break;                                             \
            case 3: gemv(kind, 3, w, ws, qa, r0, y, ldy, o0, o1); break;                                             \
            case 4: gemv(kind, 4, w, ws, qa, r0, y, ldy, o0, o1); break;                                             \
            case 5: gemv(kind, 5, w, ws, qa, r0, y, ldy, o0, o1); break;                                             \
            case 6: gemv(kind, 6, w, ws, qa, r0, y, ldy, o0, o1); break;                                             \
            case 7: gemv(kind, 7, w, ws, qa, r0, y, ldy, o0, o1); break;                                             \
            default: gemv(kind, 8, w, ws, qa, r0, y, ldy, o0, o1); break;                                            \
            }                                                                                                        \
        }                                                                                                            \
    }
GEMV_KIND(gemv_q4_k, 4)
GEMV_KIND(gemv_q5_k, 5)
GEMV_KIND(gemv_q6_k, 6)
#undef GEMV_KIND

/* ---- GEMM ---------------------------------------------------------------------------------------- */

/* Rows [r0, r0 + R) of the activation tile at row t0 (th rows) against a
 * packed panel of nb blocks. */
Q3_INLINE void tile_rows(const int q6, const int R, const char *panel, int nb, const char *a, int th, int r0, float *y,
                         size_t ldy, __mmask16 m)
{
    __m512 f[8];
#pragma GCC unroll 8
    for (int r = 0; r < R; r++) f[r] = _mm512_setzero_ps();
    for (int b = 0; b < nb; b++, panel += KB_BYTES, a += (size_t)th * Q3_QACT_BLOCK_BYTES)
        kdot(q6, R, panel, a, th, r0, f);
#pragma GCC unroll 8
    for (int r = 0; r < R; r++) _mm512_mask_storeu_ps(y + (size_t)r * ldy, m, f[r]);
}

static void rows_q45(const char *panel, int nb, const char *a, int th, int r0, int R, float *y, size_t ldy, __mmask16 m)
{
    switch (R) {
#define CASE(n) \
    case n: tile_rows(0, n, panel, nb, a, th, r0, y, ldy, m); break;
        CASE(1) CASE(2) CASE(3) CASE(4) CASE(5) CASE(6) CASE(7)
#undef CASE
    default: tile_rows(0, 8, panel, nb, a, th, r0, y, ldy, m); break;
    }
}

static void rows_q6(const char *panel, int nb, const char *a, int th, int r0, int R, float *y, size_t ldy, __mmask16 m)
{
    switch (R) {
#define CASE(n) \
    case n: tile_rows(1, n, panel, nb, a, th, r0, y, ldy, m); break;
        CASE(1) CASE(2) CASE(3) CASE(4) CASE(5) CASE(6) CASE(7)
#undef CASE
    default: tile_rows(1, 8, panel, nb, a, th, r0, y, ldy, m); break;
    }
}

/* A packed-layout panel (nsb super-blocks of 16 rows) -> the tile layout in dst. */
static void unpack_panel(const int kind, const char *panel, int nsb, char *dst)
{
    const size_t sbb = sb_bytes(kind);
    for (int s = 0; s < nsb; s++) unpack(kind, panel, (size_t)s * PANEL * sbb, dst + (size_t)s * SB_PACKED);
}

static void gemm(int kind, const void *w, size_t ws, const q3_qact *qa, float *y, size_t ldy, int o0, int o1,
                 char *scratch)
{
    const int nsb = qa->k / 256, nb = qa->k / Q3_QBLOCK, n_tiles = (qa->rows + Q3_QACT_TILE - 1) / Q3_QACT_TILE;
    const size_t pbytes = (size_t)PANEL * ws, per_tile = (pbytes / 64 + (size_t)n_tiles - 1) / (size_t)n_tiles * 64;
    const int p1 = (o1 + PANEL - 1) / PANEL;
    for (int p = o0 / PANEL; p < p1; p++) {
        const char *panel = (const char *)w + (size_t)p * pbytes;
        if (kind == 4) unpack_panel(4, panel, nsb, scratch);
        else if (kind == 5) unpack_panel(5, panel, nsb, scratch);
        else unpack_panel(6, panel, nsb, scratch);
        const size_t next_bytes = p + 1 < p1 ? pbytes : 0;
        const __mmask16 m = q3_panel_mask(p, o0, o1);
        for (int t = 0; t < n_tiles; t++) {
            q3_prefetch_lines(panel + pbytes, next_bytes, (size_t)t * per_tile, (size_t)(t + 1) * per_tile, 1);
            const int t0 = t * Q3_QACT_TILE, th = q3_qact_tile_rows(qa, t0);
            const char *a = q3_qact_block(qa, t0, 0);
            for (int r0 = 0; r0 < th; r0 += 8) {
                int R = th - r0 < 8 ? th - r0 : 8;
                float *yr = y + (size_t)(t0 + r0) * ldy + (size_t)p * PANEL;
                if (kind == 6) rows_q6(scratch, nb, a, th, r0, R, yr, ldy, m);
                else rows_q45(scratch, nb, a, th, r0, R, yr, ldy, m);
            }
        }
    }
}

/* ---- entry points ------------------------------------------------------------------------------- */

/* Rows up to which the streaming GEMV serves them, in passes of up to
 * SMALL_GROUP rows; beyond, the GEMM packs each panel once for all tiles.
 * Measured (1 thread, weights from memory, 1024 -> 3072): the streaming
 * passes win up to 16 rows for Q4_K/Q5_K (16 rows: 0.50 vs 0.62 ms), up to
 * 8 for Q6_K (8 rows: 0.33 vs 0.59 ms; 16 rows: 0.89 vs 0.80). */
static int small_rows(const int kind) { return kind == 6 ? 8 : 16; }

static size_t packed_bytes(q3_dtype wt, int n, int k)
{
    return (size_t)((n + PANEL - 1) / PANEL) * PANEL * q3_dtype_row_bytes(wt, (size_t)k);
}

static void pack(const int kind, const void *w, size_t ws, int n, int k, void *dst, int o0, int o1)
{
    const size_t sbb = sb_bytes(kind);
    const int nsb = k / 256;
    /* the chunks each kind's kernels transpose: 32-byte ones at x32[], 16-byte ones at x16 */
    static const int x32_q4[] = {16, 48, 80, 112}, x32_q5[] = {16, 48, 80, 112, 144},
                     x32_q6[] = {0, 32, 64, 96, 128, 160};
    const int *x32 = kind == 4 ? x32_q4 : kind == 5 ? x32_q5 : x32_q6;
    const int n32 = kind == 4 ? 4 : kind == 5 ? 5 : 6, x16 = kind == 6 ? 192 : 0;
    for (int p = o0 / PANEL; p * PANEL < o1; p++) {
        q3_panel_rows pr; /* the file's rows; a last partial panel repeats its last row */
        q3_panel_rows_init(&pr, w, ws, p * PANEL, n);
        char *region = (char *)dst + (size_t)p * PANEL * ws;
        for (int s = 0; s < nsb; s++, region += PANEL * sbb) {
            const size_t off = (size_t)s * sbb;
            __m512i T[8];
            for (int c = 0; c < n32; c++) {
                q3_panel_tr32(&pr, off + (size_t)x32[c], T);
                for (int j = 0; j < 8; j++) _mm512_storeu_si512(region + 16 * x32[c] + 64 * j, T[j]);
            }
            q3_panel_tr16(&pr, off + (size_t)x16, T);
            for (int j = 0; j < 4; j++) _mm512_storeu_si512(region + 16 * x16 + 64 * j, T[j]);
            if (kind == 6) { /* d: the top half of bytes 206..209 of each row's block */
                __m512i g = _mm512_i32gather_epi32(pr.vidx, (const void *)(pr.p[0] + off + 206), 1);
                _mm256_storeu_si256((__m256i *)(region + 16 * 208), _mm512_cvtepi32_epi16(_mm512_srli_epi32(g, 16)));
            }
        }
    }
}

/* The rows (w is the packed layout, ws the file's row bytes). */
#define ROW(name, kind, wt)                                                                                          \
    static size_t name##_scratch(int rows, int k) { return rows > small_rows(kind) ? (size_t)(k / 256) * SB_PACKED : 0; } \
    static size_t name##_packed_bytes(int n, int k) { return packed_bytes(wt, n, k); }                               \
    static void name##_pack(const void *w, size_t ws, int n, int k, void *dst, int o0, int o1)                      \
    {                                                                                                                \
        pack(kind, w, ws, n, k, dst, o0, o1);                                                                        \
    }                                                                                                                \
    static void name##_matmul(const void *w, size_t ws, const q3_qact *qa, float *y, size_t ldy, int o0, int o1,    \
                              void *scratch)                                                                         \
    {                                                                                                                \
        if (o1 <= o0) return;                                                                                        \
        if (qa->rows > small_rows(kind)) gemm(kind, w, ws, qa, y, ldy, o0, o1, scratch);                             \
        else gemv_##name(w, ws, qa, y, ldy, o0, o1);                                                                 \
    }                                                                                                                \
    const q3_quant_type_kernels q3_kquant_avx512_##name = {                                                          \
        .scratch = name##_scratch, .packed_bytes = name##_packed_bytes, .pack = name##_pack, .matmul = name##_matmul};
ROW(q4_k, 4, Q3_Q4_K)
ROW(q5_k, 5, Q3_Q5_K)
ROW(q6_k, 6, Q3_Q6_K)
#undef ROW
