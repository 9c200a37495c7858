/* Q4_K / Q5_K / Q6_K MATMUL on AVX2 (numerics and the activation layout in
 * quant_kernels.h): the fallback where AVX-512 VNNI is missing.
 *
 * As quant_avx2.c: a panel is 8 outputs; for one activation row and block,
 * each of the 8 rows' 32 quants (unpacked to unsigned bytes: nibbles, plus
 * the 5th bit for Q5_K, plus the top 2 bits for Q6_K) meets the row's 32
 * bytes in vpmaddubsw + vpmaddwd (no saturation: 63 * 127 * 2 < 2^15), and a
 * vphaddd tree turns the 8 vectors into one with row o in lane o: the exact
 * integer dot products (for Q6_K, the tree stops one step early and gives
 * the two 16-value halves). Each row's scales come through gathers of its
 * header bytes, decoded in 32-bit lanes. The fold is the same per-lane
 * sequence as every other kernel, so results are bit-identical to the
 * reference and the AVX-512 kernels. */
#include <string.h>

#include "backend/cpu/quant_kernels.h"
#include "backend/cpu/simd_avx2.h"

#define PANEL 8

/* Bytes of a super-block of kind 4, 5, 6 (Q4_K, Q5_K, Q6_K). */
Q3_INLINE size_t sb_bytes(const int kind) { return kind == 4 ? Q3_Q4_K_BYTES : kind == 5 ? Q3_Q5_K_BYTES : Q3_Q6_K_BYTES; }

typedef struct prows {
    const uint8_t *p[PANEL];
    __m256i vidx; /* p[l] - p[0] */
} prows;

Q3_INLINE __m256i gather(const prows *pr, size_t off)
{
    return _mm256_i32gather_epi32((const int *)(const void *)(pr->p[0] + off), pr->vidx, 1);
}

/* The low 16 bits of each lane, as f16, to float. */
Q3_INLINE __m256 f16_lanes(__m256i g)
{
    g = _mm256_and_si256(g, _mm256_set1_epi32(0xffff));
    return _mm256_cvtph_ps(_mm_packus_epi32(_mm256_castsi256_si128(g), _mm256_extracti128_si256(g, 1)));
}

Q3_INLINE __m256i shl16(__m256i v, const int n)
{
    return n > 0 ? _mm256_slli_epi16(v, n) : n < 0 ? _mm256_srli_epi16(v, -n) : v;
}

/* Q4_K / Q5_K: sub-block j's d * sc and dmin * m of each row, from the
 * gathered header: s0, s1, s2 the 12 scale bytes. */
Q3_INLINE void scale45(__m256 d, __m256 dm, __m256i s0, __m256i s1, __m256i s2, const int j, __m256 *fs, __m256 *fm)
{
    const __m256i m6 = _mm256_set1_epi32(63), m4 = _mm256_set1_epi32(15), m2 = _mm256_set1_epi32(3);
    __m256i sc, m;
    if (j < 4) {
        sc = _mm256_and_si256(_mm256_srli_epi32(s0, 8 * j), m6);
        m = _mm256_and_si256(_mm256_srli_epi32(s1, 8 * j), m6);
    } else {
        const int s = 8 * (j - 4);
        sc = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32(s2, s), m4),
                             _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(s0, s + 6), m2), 4));
        m = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32(s2, s + 4), m4),
                            _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(s1, s + 6), m2), 4));
    }
    *fs = _mm256_mul_ps(d, _mm256_cvtepi32_ps(sc));
    *fm = _mm256_mul_ps(dm, _mm256_cvtepi32_ps(m));
}

/* Q4_K / Q5_K: F0[j] = d * sc[j], F1[j] = dmin * m[j] of each row. */
Q3_INLINE void scales_q45(const prows *pr, size_t boff, __m256 F0[8], __m256 F1[8])
{
    __m256i h = gather(pr, boff), s0 = gather(pr, boff + 4), s1 = gather(pr, boff + 8), s2 = gather(pr, boff + 12);
    const __m256 d = f16_lanes(h), dm = f16_lanes(_mm256_srli_epi32(h, 16));
#pragma GCC unroll 8
    for (int j = 0; j < 8; j++) scale45(d, dm, s0, s1, s2, j, &F0[j], &F1[j]);
}

/* Q6_K: F[j] = d * sc[j] of each row, j < 16. */
Q3_INLINE void scales_q6(const prows *pr, size_t boff, __m256 F[16])
{
    const __m256 d = f16_lanes(_mm256_srli_epi32(gather(pr, boff + 206), 16));
#pragma GCC unroll 4
    for (int q = 0; q < 4; q++) {
        __m256i v = gather(pr, boff + 192 + 4 * (size_t)q);
#pragma GCC unroll 4
        for (int i = 0; i < 4; i++)
            F[4 * q + i] = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_srai_epi32(_mm256_slli_epi32(v, 24 - 8 * i), 24)));
    }
}

/* The 32 unsigned quants of activation block j of the super-block at sb. */
Q3_INLINE __m256i quants(const int kind, const uint8_t *sb, const int j)
{
    const __m256i lo4 = _mm256_set1_epi8(0x0f);
    if (kind == 6) {
        const int h = j / 4, g = j % 4;
        __m256i l = _mm256_loadu_si256((const __m256i *)(sb + 64 * h + 32 * (g & 1)));
        if (g >> 1) l = _mm256_srli_epi16(l, 4);
        __m256i c = _mm256_loadu_si256((const __m256i *)(sb + 128 + 32 * h));
        return _mm256_or_si256(_mm256_and_si256(l, lo4), _mm256_and_si256(shl16(c, 4 - 2 * g), _mm256_set1_epi8(0x30)));
    }
    __m256i v = _mm256_loadu_si256((const __m256i *)(sb + (kind == 5 ? 48 : 16) + 32 * (j / 2)));
    if (j % 2) v = _mm256_srli_epi16(v, 4);
    v = _mm256_and_si256(v, lo4);
    if (kind == 5) {
        __m256i h = _mm256_loadu_si256((const __m256i *)(sb + 16));
        v = _mm256_or_si256(v, _mm256_and_si256(shl16(h, 4 - j), _mm256_set1_epi8(0x10)));
    }
    return v;
}

/* From 8 vectors of 8 partial sums (lanes 0-3: first 16 values, 4-7: the
 * rest): lane o of *A, *B = row o's sums over each half. */
Q3_INLINE void reduce_halves(const __m256i p[8], __m256i *A, __m256i *B)
{
    __m256i h01 = _mm256_hadd_epi32(p[0], p[1]), h23 = _mm256_hadd_epi32(p[2], p[3]);
    __m256i h45 = _mm256_hadd_epi32(p[4], p[5]), h67 = _mm256_hadd_epi32(p[6], p[7]);
    __m256i g0 = _mm256_hadd_epi32(h01, h23), g1 = _mm256_hadd_epi32(h45, h67);
    *A = _mm256_permute2x128_si256(g0, g1, 0x20);
    *B = _mm256_permute2x128_si256(g0, g1, 0x31);
}

/* One activation tile (th rows at t0) against the panel, all super-blocks. */
Q3_INLINE void panel_tile(const int kind, const prows *pr, const q3_qact *qa, int t0, int th, float *y, size_t ldy,
                          int cols, const char *next, size_t next_bytes, size_t per_step)
{
    const int nsb = qa->k / 256;
    const size_t sbb = sb_bytes(kind);
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 f[Q3_QACT_TILE];
    for (int r = 0; r < th; r++) f[r] = _mm256_setzero_ps();
    const char *a = q3_qact_block(qa, t0, 0);
    for (int s = 0; s < nsb; s++) {
        if (t0 == 0)
            for (size_t l = (size_t)s * per_step; l < (size_t)(s + 1) * per_step && l < next_bytes; l += 64)
                _mm_prefetch(next + l, _MM_HINT_T0);
        __m256 F0[16], F1[8];
        if (kind == 6) scales_q6(pr, (size_t)s * sbb, F0);
        else scales_q45(pr, (size_t)s * sbb, F0, F1);
#pragma GCC unroll 8
        for (int j = 0; j < 8; j++, a += (size_t)th * Q3_QACT_BLOCK_BYTES) {
            __m256i W[PANEL];
            for (int o = 0; o < PANEL; o++) W[o] = quants(kind, pr->p[o] + (size_t)s * sbb, j);
            for (int r = 0; r < th; r++) {
                const __m256i x = _mm256_loadu_si256((const __m256i *)(a + 32 * r));
                __m256i p[PANEL], A, B;
                for (int o = 0; o < PANEL; o++) p[o] = _mm256_madd_epi16(_mm256_maddubs_epi16(W[o], x), ones);
                reduce_halves(p, &A, &B);
                const uint32_t c = (uint32_t)q3_ld_i32(a + 32 * th + 4 * r);
                const int s0 = (int16_t)(c & 0xffff), s1 = (int16_t)(c >> 16);
                const __m256 dx = _mm256_set1_ps(q3_ld_f32(a + 36 * th + 4 * r));
                if (kind == 6) {
                    A = _mm256_add_epi32(A, _mm256_set1_epi32(-32 * s0));
                    B = _mm256_add_epi32(B, _mm256_set1_epi32(-32 * s1));
                    f[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(A), _mm256_mul_ps(F0[2 * j], dx), f[r]);
                    f[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(B), _mm256_mul_ps(F0[2 * j + 1], dx), f[r]);
                } else {
                    __m256i I = _mm256_add_epi32(A, B);
                    f[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(I), _mm256_mul_ps(F0[j], dx), f[r]);
                    f[r] = _mm256_fnmadd_ps(_mm256_set1_ps((float)(s0 + s1)), _mm256_mul_ps(F1[j], dx), f[r]);
                }
            }
        }
    }
    __m256i m = q3_mask8(cols);
    for (int r = 0; r < th; r++) _mm256_maskstore_ps(y + (size_t)r * ldy, m, f[r]);
}

/* ---- GEMV: one activation row, each weight byte read once ------------------------------------- */

/* The panel (all super-blocks) against one activation row (blocks at a,
 * 40 bytes each): per activation block, the 8 rows' quants go straight into
 * the dot products, the scales decoded per block from the gathered header;
 * the next panel (next_bytes at next) prefetched into L2, per_step bytes
 * per block. */
Q3_INLINE __m256 gemv_panel(const int kind, const prows *pr, const char *a, int nsb, const char *next, size_t next_bytes,
                            size_t per_step)
{
    const size_t sbb = sb_bytes(kind);
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 f = _mm256_setzero_ps();
    size_t at = 0;
    for (int s = 0; s < nsb; s++) {
        const size_t boff = (size_t)s * sbb;
        __m256 d, dm = _mm256_setzero_ps();
        __m256i s0, s1, s2, sq[4];
        if (kind == 6) {
            d = f16_lanes(_mm256_srli_epi32(gather(pr, boff + 206), 16));
            for (int q = 0; q < 4; q++) sq[q] = gather(pr, boff + 192 + 4 * (size_t)q);
        } else {
            const __m256i h = gather(pr, boff);
            s0 = gather(pr, boff + 4);
            s1 = gather(pr, boff + 8);
            s2 = gather(pr, boff + 12);
            d = f16_lanes(h);
            dm = f16_lanes(_mm256_srli_epi32(h, 16));
        }
#pragma GCC unroll 8
        for (int j = 0; j < 8; j++, a += Q3_QACT_BLOCK_BYTES, at += per_step) {
            for (size_t l = at; l < at + per_step && l < next_bytes; l += 64) _mm_prefetch(next + l, _MM_HINT_T1);
            const __m256i x = _mm256_loadu_si256((const __m256i *)a);
            __m256i p[PANEL], A, B;
#pragma GCC unroll 8
            for (int o = 0; o < PANEL; o++)
                p[o] = _mm256_madd_epi16(_mm256_maddubs_epi16(quants(kind, pr->p[o] + boff, j), x), ones);
            reduce_halves(p, &A, &B);
            const uint32_t c = (uint32_t)q3_ld_i32(a + 32);
            const int c0 = (int16_t)(c & 0xffff), c1 = (int16_t)(c >> 16);
            const __m256 dx = _mm256_set1_ps(q3_ld_f32(a + 36));
            if (kind == 6) {
                const __m256i v = sq[j / 2];
                const int i0 = 2 * (j % 2), i1 = i0 + 1; /* the two sub-blocks' bytes in v */
                const __m256 F0 = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_srai_epi32(_mm256_slli_epi32(v, 24 - 8 * i0), 24)));
                const __m256 F1 = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_srai_epi32(_mm256_slli_epi32(v, 24 - 8 * i1), 24)));
                A = _mm256_add_epi32(A, _mm256_set1_epi32(-32 * c0));
                B = _mm256_add_epi32(B, _mm256_set1_epi32(-32 * c1));
                f = _mm256_fmadd_ps(_mm256_cvtepi32_ps(A), _mm256_mul_ps(F0, dx), f);
                f = _mm256_fmadd_ps(_mm256_cvtepi32_ps(B), _mm256_mul_ps(F1, dx), f);
            } else {
                __m256 fs, fm;
                scale45(d, dm, s0, s1, s2, j, &fs, &fm);
                f = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_add_epi32(A, B)), _mm256_mul_ps(fs, dx), f);
                f = _mm256_fnmadd_ps(_mm256_set1_ps((float)(c0 + c1)), _mm256_mul_ps(fm, dx), f);
            }
        }
    }
    return f;
}

static void prows_init(prows *pr, const void *w, size_t ws, int o, int o1)
{
    int32_t idx[PANEL];
    for (int l = 0; l < PANEL; l++) {
        int row = o + l < o1 ? o + l : o1 - 1;
        pr->p[l] = (const uint8_t *)w + (size_t)row * ws;
        idx[l] = (int32_t)((size_t)(row - o) * ws);
    }
    pr->vidx = _mm256_loadu_si256((const __m256i *)idx);
}

Q3_INLINE void kgemv(const int kind, const void *w, size_t ws, const q3_qact *qa, float *y, int o0, int o1)
{
    const size_t pbytes = (size_t)PANEL * ws, nsb = (size_t)(qa->k / 256);
    const size_t per_step = (pbytes / 64 + 8 * nsb - 1) / (8 * nsb) * 64;
    for (size_t l = 0; l < pbytes && l < (size_t)(o1 - o0) * ws; l += 64)
        _mm_prefetch((const char *)w + (size_t)o0 * ws + l, _MM_HINT_T1);
    for (int o = o0; o < o1; o += PANEL) {
        const char *next = (const char *)w + (size_t)(o + PANEL) * ws;
        size_t next_bytes = o + PANEL < o1 ? (size_t)(o1 - o - PANEL) * ws : 0;
        if (next_bytes > pbytes) next_bytes = pbytes;
        prows pr;
        prows_init(&pr, w, ws, o, o1);
        __m256 f = gemv_panel(kind, &pr, qa->base, (int)nsb, next, next_bytes, per_step);
        _mm256_maskstore_ps(y + o, q3_mask8(o1 - o), f);
    }
}

static void gemv_q4_k(const void *w, size_t ws, const q3_qact *qa, float *y, int o0, int o1) { kgemv(4, w, ws, qa, y, o0, o1); }
static void gemv_q5_k(const void *w, size_t ws, const q3_qact *qa, float *y, int o0, int o1) { kgemv(5, w, ws, qa, y, o0, o1); }
static void gemv_q6_k(const void *w, size_t ws, const q3_qact *qa, float *y, int o0, int o1) { kgemv(6, w, ws, qa, y, o0, o1); }

/* ---- several rows ----------------------------------------------------------------------------- */

Q3_INLINE void kmatmul(const int kind, const void *w, size_t ws, const q3_qact *qa, float *y, size_t ldy, int o0, int o1)
{
    const size_t pbytes = (size_t)PANEL * ws, nsb = (size_t)(qa->k / 256);
    const size_t per_step = (pbytes / 64 + nsb - 1) / nsb * 64;
    for (size_t l = 0; l < pbytes && l < (size_t)(o1 - o0) * ws; l += 64)
        _mm_prefetch((const char *)w + (size_t)o0 * ws + l, _MM_HINT_T0);
    for (int o = o0; o < o1; o += PANEL) {
        const char *next = (const char *)w + (size_t)(o + PANEL) * ws;
        size_t next_bytes = o + PANEL < o1 ? (size_t)(o1 - o - PANEL) * ws : 0;
        if (next_bytes > pbytes) next_bytes = pbytes;
        prows pr;
        prows_init(&pr, w, ws, o, o1);
        for (int t0 = 0; t0 < qa->rows; t0 += Q3_QACT_TILE)
            panel_tile(kind, &pr, qa, t0, q3_qact_tile_rows(qa, t0), y + (size_t)t0 * ldy + o, ldy, o1 - o, next,
                       next_bytes, per_step);
    }
}

/* The rows: qa->rows == 1 is the GEMV. */
#define ROW(name, kind)                                                                                              \
    static void name##_matmul(const void *w, size_t ws, const q3_qact *qa, float *y, size_t ldy, int o0, int o1,    \
                              void *scratch)                                                                         \
    {                                                                                                                \
        if (o1 <= o0) return;                                                                                        \
        if (qa->rows == 1) gemv_##name(w, ws, qa, y, o0, o1);                                                        \
        else kmatmul(kind, w, ws, qa, y, ldy, o0, o1);                                                               \
    }                                                                                                                \
    const q3_quant_type_kernels q3_kquant_avx2_##name = {.matmul = name##_matmul};
ROW(q4_k, 4)
ROW(q5_k, 5)
ROW(q6_k, 6)
#undef ROW
