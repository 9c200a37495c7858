/* MATMUL on AVX2+FMA: every weight dtype (F32, F16, BF16) converted exactly
 * to F32 in registers and multiplied with the F32 activations, so this path
 * keeps activations unrounded. Same structure as matmul_avx512.c (read its
 * header comment): dot-product form, one accumulator per (row, output)
 * walking k in 8-value steps, lanes summed by q3_reduce4_avx2; GEMM tiles of
 * GEMM_R x GEMM_C with K blocks, GEMV tiles of GEMV_C outputs; the same step
 * order in both, so results do not depend on the kernel or the tile. */
#include "backend/cpu/kernels.h"
#include "backend/cpu/simd_avx2.h"

enum wkind { W_BF16, W_F32, W_F16 };

#define GEMM_R 2
#define GEMM_C 4
#define GEMV_C 8
#define TILE_MAX_R 2
#define TILE_MAX_C 8
#define KBLOCK_VALUES 512 /* k values per GEMM K block: a tile's weights stay in L1 */

Q3_INLINE __m256 load_x(const float *x, int s, int tail)
{
    if (!tail) return _mm256_loadu_ps(x + (size_t)s * 8);
    return _mm256_maskload_ps(x + (size_t)s * 8, q3_mask8(tail));
}

/* Step s (8 values) of a weight row; tail > 0: only the first tail values. */
Q3_INLINE __m256 load_w(const int kind, const char *w, int s, int tail)
{
    if (kind == W_F32) {
        const float *p = (const float *)w + (size_t)s * 8;
        return tail ? _mm256_maskload_ps(p, q3_mask8(tail)) : _mm256_loadu_ps(p);
    }
    const uint16_t *p = (const uint16_t *)w + (size_t)s * 8;
    __m128i h = tail ? q3_load_u16x8(p, tail) : _mm_loadu_si128((const __m128i *)p);
    return kind == W_BF16 ? q3_bf16x8_to_f32(h) : _mm256_cvtph_ps(h);
}

/* R x C dot products over steps [s0, s1); steps >= n_full are the tail
 * (tail values). first/last/partial as in matmul_avx512.c. */
Q3_INLINE void tile(const int kind, const int R, const int C, const float *x, size_t ldx, int rows, const char *w,
                    size_t w_stride, int cols, int s0, int s1, int n_full, int tail, __m256 *partial, int first, int last,
                    float *y, size_t ldy)
{
    const float *xp[TILE_MAX_R];
    const char *wp[TILE_MAX_C];
    __m256 acc[TILE_MAX_R][TILE_MAX_C];
#pragma GCC unroll 8
    for (int r = 0; r < R; r++) xp[r] = x + (size_t)(r < rows ? r : rows - 1) * ldx;
#pragma GCC unroll 8
    for (int c = 0; c < C; c++) wp[c] = w + (size_t)(c < cols ? c : cols - 1) * w_stride;
#pragma GCC unroll 8
    for (int r = 0; r < R; r++)
#pragma GCC unroll 8
        for (int c = 0; c < C; c++) acc[r][c] = first ? _mm256_setzero_ps() : partial[r * C + c];
    int se = s1 < n_full ? s1 : n_full;
    for (int s = s0; s < se; s++) {
        __m256 xv[TILE_MAX_R];
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) xv[r] = load_x(xp[r], s, 0);
#pragma GCC unroll 8
        for (int c = 0; c < C; c++) {
            __m256 wv = load_w(kind, wp[c], s, 0);
#pragma GCC unroll 8
            for (int r = 0; r < R; r++) acc[r][c] = _mm256_fmadd_ps(xv[r], wv, acc[r][c]);
        }
    }
    if (s1 > n_full) {
        __m256 xv[TILE_MAX_R];
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) xv[r] = load_x(xp[r], n_full, tail);
#pragma GCC unroll 8
        for (int c = 0; c < C; c++) {
            __m256 wv = load_w(kind, wp[c], n_full, tail);
#pragma GCC unroll 8
            for (int r = 0; r < R; r++) acc[r][c] = _mm256_fmadd_ps(xv[r], wv, acc[r][c]);
        }
    }
    if (!last) {
#pragma GCC unroll 8
        for (int r = 0; r < R; r++)
#pragma GCC unroll 8
            for (int c = 0; c < C; c++) partial[r * C + c] = acc[r][c];
        return;
    }
    const __m256 z = _mm256_setzero_ps();
#pragma GCC unroll 8
    for (int i = 0; i < R * C; i += 4) {
        __m256 v0 = acc[i / C][i % C];
        __m256 v1 = i + 1 < R * C ? acc[(i + 1) / C][(i + 1) % C] : z;
        __m256 v2 = i + 2 < R * C ? acc[(i + 2) / C][(i + 2) % C] : z;
        __m256 v3 = i + 3 < R * C ? acc[(i + 3) / C][(i + 3) % C] : z;
        float out[4];
        _mm_storeu_ps(out, q3_reduce4_avx2(v0, v1, v2, v3));
#pragma GCC unroll 4
        for (int j = 0; j < 4; j++) {
            int idx = i + j, r = idx / C, c = idx % C;
            if (idx < R * C && r < rows && c < cols) y[(size_t)r * ldy + c] = out[j];
        }
    }
}

static int kind_of(q3_dtype t) { return t == Q3_BF16 ? W_BF16 : t == Q3_F16 ? W_F16 : W_F32; }

static size_t avx2_matmul_scratch(const q3_cpu_matmul *mm)
{
    return (size_t)((mm->m + GEMM_R - 1) / GEMM_R) * GEMM_R * GEMM_C * sizeof(__m256);
}

static int avx2_matmul_granule(const q3_cpu_matmul *mm) { return mm->m == 1 ? GEMV_C : GEMM_C; }

static void avx2_matmul_prepare(const q3_cpu_matmul *mm, void *scratch) {}

Q3_INLINE void range_generic(const int kind, const q3_cpu_matmul *mm, void *scratch, int o0, int o1)
{
    const int n_full = mm->k / 8, n_steps = (mm->k + 7) / 8, tail = mm->k % 8;
    const char *w = (const char *)mm->w;
    const size_t ws = mm->w_row_bytes;
    if (mm->m == 1) {
        for (int oc = o0; oc < o1; oc += GEMV_C)
            tile(kind, 1, GEMV_C, mm->x, mm->ldx, 1, w + (size_t)oc * ws, ws, o1 - oc, 0, n_steps, n_full, tail, NULL, 1,
                 1, mm->y + oc, mm->ldy);
        return;
    }
    const int kb = KBLOCK_VALUES / 8;
    __m256 *partial = scratch;
    for (int oc = o0; oc < o1; oc += GEMM_C) {
        int cols = o1 - oc < GEMM_C ? o1 - oc : GEMM_C;
        for (int sb = 0; sb < n_steps; sb += kb) {
            int se = sb + kb < n_steps ? sb + kb : n_steps;
            for (int r0 = 0; r0 < mm->m; r0 += GEMM_R) {
                int rows = mm->m - r0 < GEMM_R ? mm->m - r0 : GEMM_R;
                tile(kind, GEMM_R, GEMM_C, mm->x + (size_t)r0 * mm->ldx, mm->ldx, rows, w + (size_t)oc * ws, ws, cols, sb,
                     se, n_full, tail, partial + (size_t)r0 * GEMM_C, sb == 0, se == n_steps,
                     mm->y + (size_t)r0 * mm->ldy + oc, mm->ldy);
            }
        }
    }
}

static void range_bf16(const q3_cpu_matmul *mm, void *s, int o0, int o1) { range_generic(W_BF16, mm, s, o0, o1); }
static void range_f32(const q3_cpu_matmul *mm, void *s, int o0, int o1) { range_generic(W_F32, mm, s, o0, o1); }
static void range_f16(const q3_cpu_matmul *mm, void *s, int o0, int o1) { range_generic(W_F16, mm, s, o0, o1); }

static void avx2_matmul_range(const q3_cpu_matmul *mm, void *scratch, int o0, int o1)
{
    switch (kind_of(mm->wtype)) {
    case W_BF16: range_bf16(mm, scratch, o0, o1); break;
    case W_F16: range_f16(mm, scratch, o0, o1); break;
    default: range_f32(mm, scratch, o0, o1); break;
    }
}

const q3_cpu_mm_kernels q3_cpu_mm_avx2 = {
    .scratch = avx2_matmul_scratch,
    .granule = avx2_matmul_granule,
    .prepare = avx2_matmul_prepare,
    .range = avx2_matmul_range,
};
