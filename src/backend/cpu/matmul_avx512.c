/* MATMUL on AVX-512: BF16 weights through the BF16 dot product (vdpbf16ps,
 * activations rounded to BF16 once per op), F32 and F16 weights through F32
 * FMA with F32 activations. Weights are read in place from the mapping.
 *
 * Layout of the work: y[r][o] = dot(x[r], w[o]) in "dot-product form": a
 * 512-bit accumulator per (row, output) walks k in steps of one vector
 * (32 BF16 or 16 F32 values), then q3_reduce4 sums its lanes. The same tile
 * code serves
 *  - the GEMM (m > 1): tiles of GEMM_R rows x GEMM_C outputs (24
 *    accumulators in registers); the weights of a tile, one K block at a
 *    time (GEMM_C rows x 2 KB = 12 KB), stay in L1 while every row tile of
 *    the packed activations streams past them from L2; partial sums of a
 *    K block are parked, unreduced, in scratch. Rows go in slabs of at most
 *    X_SLAB_BYTES of activations, each slab over all the range's outputs:
 *    long F32 rows (F16/F32 weights, k = 2048 or 3072: 1-1.5 MB for 128
 *    rows) would otherwise stream from L3 once per output tile (F16
 *    attn_output and ffn_down measured 1.16x and 1.25x faster in slabs on a
 *    Zen 5 EPYC VM); a range's weights are read once per slab, from L2/L3
 *    after the first;
 *  - the GEMV (m == 1) and the small GEMM (1 < m <= SMALL_M, a decode step
 *    of a few sequences): one output at a time, its weight row read once
 *    from start to end against every activation row (in L1), so the weights
 *    stream from memory in address order. Walking 8 weight rows side by side
 *    (8 interleaved streams 2 KB apart, as the GEMM's tiles do) measured
 *    half the read rate of one sequential stream on an EPYC VM (12 vs 23 GB/s
 *    on one thread); the out-of-order core overlaps the dependency chains of
 *    consecutive outputs.
 * Both walk each accumulator through the same steps in the same order and sum
 * its lanes by the same tree, so a row's result is bit-identical whichever
 * kernel (or thread) made it. */
#include <string.h>

#include "backend/cpu/kernels.h"
#include "backend/cpu/simd_avx512.h"

enum wkind { W_BF16, W_F32, W_F16 };

#define GEMM_R 4          /* rows of a GEMM tile */
#define GEMM_C 6          /* outputs of a GEMM tile */
#define GEMV_C 16         /* outputs per work-item granule of the streaming GEMV: one line of y */
#define SMALL_M 3         /* rows up to which the small GEMM streams the weights */
#define TILE_MAX_R 4      
#define TILE_MAX_C 8
#define KBLOCK_BYTES 2048 /* bytes of one weight row per GEMM K block */
#define X_SLAB_BYTES (512 << 10) /* GEMM activations per pass over a range's outputs (half an L2) */

/* ---- one step of the dot products -------------------------------------------------- */

/* Step s of an x row: 64 bytes (32 packed BF16 or 16 F32 values). */
Q3_INLINE __m512 load_x(const int kind, const char *x, int s, const int masked, __mmask32 m)
{
    if (kind == W_BF16) return _mm512_castsi512_ps(_mm512_loadu_si512(x + (size_t)s * 64)); /* zero padded */
    return masked ? _mm512_maskz_loadu_ps((__mmask16)m, x + (size_t)s * 64) : _mm512_loadu_ps(x + (size_t)s * 64);
}

/* Step s of a weight row (64 bytes, or 32 for F16), as F32 lanes or packed BF16 pairs. */
Q3_INLINE __m512 load_w(const int kind, const char *w, int s, const int masked, __mmask32 m)
{
    if (kind == W_BF16) {
        __m512i v = masked ? _mm512_maskz_loadu_epi16(m, w + (size_t)s * 64) : _mm512_loadu_si512(w + (size_t)s * 64);
        return _mm512_castsi512_ps(v);
    }
    if (kind == W_F32)
        return masked ? _mm512_maskz_loadu_ps((__mmask16)m, w + (size_t)s * 64) : _mm512_loadu_ps(w + (size_t)s * 64);
    __m256i h = masked ? _mm256_maskz_loadu_epi16((__mmask16)m, w + (size_t)s * 32)
                       : _mm256_loadu_si256((const __m256i *)(w + (size_t)s * 32));
    return _mm512_cvtph_ps(h);
}

Q3_INLINE __m512 madd(const int kind, __m512 acc, __m512 x, __m512 w)
{
    if (kind == W_BF16)
        return _mm512_dpbf16_ps(acc, (__m512bh)_mm512_castps_si512(x), (__m512bh)_mm512_castps_si512(w));
    return _mm512_fmadd_ps(x, w, acc);
}

/* ---- the tile -------------------------------------------------------------------------- */

/* Accumulates steps [s0, s1) of R x C dot products: rows x + r * x_stride
 * (r < rows; missing rows repeat the last one and are not stored), weight
 * rows w + c * w_stride (c < cols, likewise). Steps >= n_full are the
 * masked tail (tail_mask). first: start from zero, else from partial[r*C+c];
 * last: reduce and store into y[r * ldy + c], else park sums in partial. */
Q3_INLINE void tile(const int kind, const int R, const int C, const char *x, size_t x_stride, int rows,
                    const char *w, size_t w_stride, int cols, int s0, int s1, int n_full, __mmask32 tail_mask,
                    __m512 *partial, int first, int last, float *y, size_t ldy)
{
    const char *xp[TILE_MAX_R], *wp[TILE_MAX_C];
    __m512 acc[TILE_MAX_R][TILE_MAX_C];
#pragma GCC unroll 8
    for (int r = 0; r < R; r++) xp[r] = x + (size_t)(r < rows ? r : rows - 1) * x_stride;
#pragma GCC unroll 8
    for (int c = 0; c < C; c++) wp[c] = w + (size_t)(c < cols ? c : cols - 1) * w_stride;
#pragma GCC unroll 8
    for (int r = 0; r < R; r++)
#pragma GCC unroll 8
        for (int c = 0; c < C; c++) acc[r][c] = first ? _mm512_setzero_ps() : partial[r * C + c];

    int se = s1 < n_full ? s1 : n_full;
    for (int s = s0; s < se; s++) {
        __m512 xv[TILE_MAX_R];
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) xv[r] = load_x(kind, xp[r], s, 0, 0);
#pragma GCC unroll 8
        for (int c = 0; c < C; c++) {
            __m512 wv = load_w(kind, wp[c], s, 0, 0);
#pragma GCC unroll 8
            for (int r = 0; r < R; r++) acc[r][c] = madd(kind, acc[r][c], xv[r], wv);
        }
    }
    if (s1 > n_full) { /* the masked tail step */
        __m512 xv[TILE_MAX_R];
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) xv[r] = load_x(kind, xp[r], n_full, 1, tail_mask);
#pragma GCC unroll 8
        for (int c = 0; c < C; c++) {
            __m512 wv = load_w(kind, wp[c], n_full, 1, tail_mask);
#pragma GCC unroll 8
            for (int r = 0; r < R; r++) acc[r][c] = madd(kind, acc[r][c], xv[r], wv);
        }
    }

    if (!last) {
#pragma GCC unroll 8
        for (int r = 0; r < R; r++)
#pragma GCC unroll 8
            for (int c = 0; c < C; c++) partial[r * C + c] = acc[r][c];
        return;
    }
    const __m512 z = _mm512_setzero_ps();
#pragma GCC unroll 8
    for (int i = 0; i < R * C; i += 4) {
        __m512 v0 = acc[i / C][i % C];
        __m512 v1 = i + 1 < R * C ? acc[(i + 1) / C][(i + 1) % C] : z;
        __m512 v2 = i + 2 < R * C ? acc[(i + 2) / C][(i + 2) % C] : z;
        __m512 v3 = i + 3 < R * C ? acc[(i + 3) / C][(i + 3) % C] : z;
        float out[4];
        _mm_storeu_ps(out, q3_reduce4(v0, v1, v2, v3));
#pragma GCC unroll 4
        for (int j = 0; j < 4; j++) {
            int idx = i + j, r = idx / C, c = idx % C;
            if (idx < R * C && r < rows && c < cols) y[(size_t)r * ldy + c] = out[j];
        }
    }
}

/* Outputs [o0, o1) of R rows (x + r * x_stride, r < R), all of k, one output
 * after the other: each output's weight row streams once, in address order. */
Q3_INLINE void stream_rows(const int kind, const int R, const char *x, size_t x_stride, const char *w, size_t w_stride,
                           int o0, int o1, int n_full, int n_steps, __mmask32 tail_mask, float *y, size_t ldy)
{
    for (int o = o0; o < o1; o++) {
        const char *wp = w + (size_t)o * w_stride;
        __m512 acc[TILE_MAX_R];
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) acc[r] = _mm512_setzero_ps();
#pragma GCC unroll 4
        for (int s = 0; s < n_full; s++) {
            __m512 wv = load_w(kind, wp, s, 0, 0);
#pragma GCC unroll 4
            for (int r = 0; r < R; r++) acc[r] = madd(kind, acc[r], load_x(kind, x + (size_t)r * x_stride, s, 0, 0), wv);
        }
        if (n_steps > n_full) { /* the masked tail step */
            __m512 wv = load_w(kind, wp, n_full, 1, tail_mask);
#pragma GCC unroll 4
            for (int r = 0; r < R; r++)
                acc[r] = madd(kind, acc[r], load_x(kind, x + (size_t)r * x_stride, n_full, 1, tail_mask), wv);
        }
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) y[(size_t)r * ldy + o] = q3_hsum(acc[r]);
    }
}

/* ---- drivers --------------------------------------------------------------------------- */

static int kind_of(q3_dtype t) { return t == Q3_BF16 ? W_BF16 : t == Q3_F16 ? W_F16 : W_F32; }

static size_t packed_row_bytes(int k) { return (size_t)((k + 31) / 32) * 64; }

static size_t packed_bytes(const q3_cpu_matmul *mm)
{
    if (kind_of(mm->wtype) != W_BF16) return 0;
    return ((size_t)mm->m * packed_row_bytes(mm->k) + 63) & ~(size_t)63;
}

static size_t avx512_matmul_scratch(const q3_cpu_matmul *mm)
{
    size_t partial = (size_t)((mm->m + GEMM_R - 1) / GEMM_R) * GEMM_R * GEMM_C * sizeof(__m512);
    return packed_bytes(mm) + partial;
}

static int avx512_matmul_granule(const q3_cpu_matmul *mm)
{
    return mm->m <= SMALL_M ? GEMV_C : GEMM_C;
}

/* Rounds the activations to BF16 (nearest even), rows zero-padded to 32 values. */
static void avx512_matmul_prepare(const q3_cpu_matmul *mm, void *scratch)
{
    if (kind_of(mm->wtype) != W_BF16) return;
    size_t prb = packed_row_bytes(mm->k);
    for (int r = 0; r < mm->m; r++) {
        const float *x = mm->x + (size_t)r * mm->ldx;
        char *dst = (char *)scratch + (size_t)r * prb;
        for (int i = 0; i < mm->k; i += 32) {
            __m512 lo = _mm512_maskz_loadu_ps(q3_mask16(mm->k - i), x + i);
            __m512 hi = _mm512_maskz_loadu_ps(q3_mask16(mm->k - i - 16), x + i + 16);
            _mm512_storeu_si512(dst + (size_t)i * 2, (__m512i)_mm512_cvtne2ps_pbh(hi, lo));
        }
    }
}

Q3_INLINE void range_generic(const int kind, const q3_cpu_matmul *mm, void *scratch, int o0, int o1)
{
    const int per_step = kind == W_BF16 ? 32 : 16;
    const int n_full = mm->k / per_step, n_steps = (mm->k + per_step - 1) / per_step;
    const __mmask32 tail = q3_mask32(mm->k % per_step);
    const char *x = kind == W_BF16 ? (const char *)scratch : (const char *)mm->x;
    const size_t xs = kind == W_BF16 ? packed_row_bytes(mm->k) : mm->ldx * sizeof(float);
    const char *w = (const char *)mm->w;
    const size_t ws = mm->w_row_bytes;

    if (mm->m <= SMALL_M) {
        if (mm->m == 1) stream_rows(kind, 1, x, xs, w, ws, o0, o1, n_full, n_steps, tail, mm->y, mm->ldy);
        else if (mm->m == 2) stream_rows(kind, 2, x, xs, w, ws, o0, o1, n_full, n_steps, tail, mm->y, mm->ldy);
        else stream_rows(kind, 3, x, xs, w, ws, o0, o1, n_full, n_steps, tail, mm->y, mm->ldy);
        return;
    }
    const int kb = KBLOCK_BYTES / (kind == W_F16 ? 32 : 64); /* steps per K block */
    __m512 *partial = (__m512 *)((char *)scratch + packed_bytes(mm));
    /* rows per pass over the outputs: as many as keep their activations in L2 */
    int slab = (int)(X_SLAB_BYTES / xs) / GEMM_R * GEMM_R;
    if (slab < GEMM_R) slab = GEMM_R;
    for (int rb = 0; rb < mm->m; rb += slab) {
        int re = rb + slab < mm->m ? rb + slab : mm->m;
        for (int oc = o0; oc < o1; oc += GEMM_C) {
            int cols = o1 - oc < GEMM_C ? o1 - oc : GEMM_C;
            for (int sb = 0; sb < n_steps; sb += kb) {
                int se = sb + kb < n_steps ? sb + kb : n_steps;
                for (int r0 = rb; r0 < re; r0 += GEMM_R) {
                    int rows = re - r0 < GEMM_R ? re - r0 : GEMM_R;
                    tile(kind, GEMM_R, GEMM_C, x + (size_t)r0 * xs, xs, rows, w + (size_t)oc * ws, ws, cols, sb, se,
                         n_full, tail, partial + (size_t)r0 * GEMM_C, sb == 0, se == n_steps,
                         mm->y + (size_t)r0 * mm->ldy + oc, mm->ldy);
                }
            }
        }
    }
}

static void range_bf16(const q3_cpu_matmul *mm, void *s, int o0, int o1) { range_generic(W_BF16, mm, s, o0, o1); }
static void range_f32(const q3_cpu_matmul *mm, void *s, int o0, int o1) { range_generic(W_F32, mm, s, o0, o1); }
static void range_f16(const q3_cpu_matmul *mm, void *s, int o0, int o1) { range_generic(W_F16, mm, s, o0, o1); }

static void avx512_matmul_range(const q3_cpu_matmul *mm, void *scratch, int o0, int o1)
{
    switch (mm->wtype) {
    case Q3_BF16: range_bf16(mm, scratch, o0, o1); break;
    case Q3_F16: range_f16(mm, scratch, o0, o1); break;
    default: range_f32(mm, scratch, o0, o1); break;
    }
}

const q3_cpu_mm_kernels q3_cpu_mm_avx512 = {
    .scratch = avx512_matmul_scratch,
    .granule = avx512_matmul_granule,
    .prepare = avx512_matmul_prepare,
    .range = avx512_matmul_range,
};
