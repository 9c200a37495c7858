/* Q8_0 / Q4_0 MATMUL on AVX2 (numerics and the activation layout in
 * quant_kernels.h): the fallback where AVX-512 VNNI is missing.
 *
 * A panel is 8 outputs. For one activation row and weight block b, each of
 * the 8 weight rows meets the row's 32 bytes in vpmaddubsw (unsigned x
 * signed bytes -> pairs of 16-bit sums) and vpmaddwd (-> 8 x 32-bit), then
 * a vphaddd tree turns the 8 vectors into one with output o in lane o: the
 * exact block dot products I_b, folded into the float sums with the same
 * cvt + mul + fma as every other kernel, so results are bit-identical to
 * the AVX-512 and reference kernels.
 *  - Q8_0: vpmaddubsw would saturate on (w + 128) * x, so the sign trick:
 *    |w| (unsigned, <= 128) times x with w's sign (|pair sum| <= 32512);
 *  - Q4_0: nibbles 0..15 unpacked to bytes are the unsigned side, and the
 *    activation block's c = -8 * sum(q) seeds the sum.
 * Rows are walked in tiles of 16 (their activations stay in L1), each tile
 * over all blocks of the panel (its weights stay in L1 across the tiles);
 * the GEMV is the same with one row, prefetching the next panel as it goes. */
#include <string.h>

#include "backend/cpu/quant_kernels.h"
#include "backend/cpu/simd_avx2.h"

#define PANEL 8

/* ---- activations ------------------------------------------------------------------------ */

/* max |x| as the unsigned order of the |x| bit patterns: the float max for
 * finite values, NaN or inf when the block holds one (vmaxps would drop a
 * NaN depending on the operand order). */
Q3_INLINE float block_amax(const float *x)
{
    const __m256i absmask = _mm256_set1_epi32(0x7fffffff);
    __m256i m = _mm256_max_epu32(
        _mm256_max_epu32(_mm256_and_si256(_mm256_loadu_si256((const __m256i *)x), absmask),
                         _mm256_and_si256(_mm256_loadu_si256((const __m256i *)(x + 8)), absmask)),
        _mm256_max_epu32(_mm256_and_si256(_mm256_loadu_si256((const __m256i *)(x + 16)), absmask),
                         _mm256_and_si256(_mm256_loadu_si256((const __m256i *)(x + 24)), absmask)));
    __m128i m4 = _mm_max_epu32(_mm256_castsi256_si128(m), _mm256_extracti128_si256(m, 1));
    m4 = _mm_max_epu32(m4, _mm_shuffle_epi32(m4, _MM_SHUFFLE(1, 0, 3, 2)));
    m4 = _mm_max_epu32(m4, _mm_shuffle_epi32(m4, _MM_SHUFFLE(2, 3, 0, 1)));
    uint32_t u = (uint32_t)_mm_cvtsi128_si32(m4);
    float f;
    memcpy(&f, &u, 4);
    return f;
}

Q3_INLINE void block_quant(const float *x, float id, int8_t *q, int s2[2])
{
    const __m256 vid = _mm256_set1_ps(id);
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    __m256i iq[4];
    for (int j = 0; j < 4; j++) iq[j] = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + 8 * j), vid)); /* nearest even */
    __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(iq[0], iq[1]), _mm256_packs_epi32(iq[2], iq[3]));
    _mm256_storeu_si256((__m256i *)q, _mm256_permutevar8x32_epi32(p, order));
    /* the two half sums in lanes 0 and 4, then together */
    __m256i s = _mm256_add_epi32(iq[0], iq[1]);
    __m256i t = _mm256_add_epi32(iq[2], iq[3]);
    s = _mm256_add_epi32(_mm256_permute2x128_si256(s, t, 0x20), _mm256_permute2x128_si256(s, t, 0x31));
    s = _mm256_add_epi32(s, _mm256_shuffle_epi32(s, _MM_SHUFFLE(1, 0, 3, 2)));
    s = _mm256_add_epi32(s, _mm256_shuffle_epi32(s, _MM_SHUFFLE(2, 3, 0, 1)));
    s2[0] = _mm256_cvtsi256_si32(s);
    s2[1] = _mm_cvtsi128_si32(_mm256_extracti128_si256(s, 1));
}

static void avx2_quantize(q3_dtype wt, const float *x, size_t ldx, const q3_qact *qa, int r0, int r1)
{
    q3_qact_quantize_with(q3_quant_avx2.type[wt]->act_offset, x, ldx, qa, r0, r1, block_amax, block_quant);
}

/* ---- the dot products ---------------------------------------------------------------------- */

/* Lane o of the result = the sum of the 8 lanes of p[o] (exact integers). */
Q3_INLINE __m256i reduce8(const __m256i p[8])
{
    __m256i h01 = _mm256_hadd_epi32(p[0], p[1]), h23 = _mm256_hadd_epi32(p[2], p[3]);
    __m256i h45 = _mm256_hadd_epi32(p[4], p[5]), h67 = _mm256_hadd_epi32(p[6], p[7]);
    __m256i g0 = _mm256_hadd_epi32(h01, h23), g1 = _mm256_hadd_epi32(h45, h67);
    return _mm256_add_epi32(_mm256_permute2x128_si256(g0, g1, 0x20), _mm256_permute2x128_si256(g0, g1, 0x31));
}

/* I_b of one activation row (32 bytes at xq, correction c) against block
 * boff of the 8 rows at rp[]. */
Q3_INLINE __m256i dot_q8(const uint8_t *const rp[PANEL], size_t boff, const int8_t *xq)
{
    const __m256i ones = _mm256_set1_epi16(1);
    const __m256i x = _mm256_loadu_si256((const __m256i *)xq);
    __m256i p[8];
#pragma GCC unroll 8
    for (int o = 0; o < PANEL; o++) {
        __m256i w = _mm256_loadu_si256((const __m256i *)(rp[o] + boff + 2));
        p[o] = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_abs_epi8(w), _mm256_sign_epi8(x, w)), ones);
    }
    return reduce8(p);
}

Q3_INLINE __m256i dot_q4(const uint8_t *const rp[PANEL], size_t boff, const int8_t *xq, int32_t c)
{
    const __m256i ones = _mm256_set1_epi16(1), low4 = _mm256_set1_epi8(0x0f);
    const __m256i x = _mm256_loadu_si256((const __m256i *)xq);
    __m256i p[8];
#pragma GCC unroll 8
    for (int o = 0; o < PANEL; o++) {
        __m128i v = _mm_loadu_si128((const __m128i *)(rp[o] + boff + 2));
        __m256i w = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(v, 4), v), low4); /* values 0..15, then 16..31 */
        p[o] = _mm256_madd_epi16(_mm256_maddubs_epi16(w, x), ones);
    }
    return _mm256_add_epi32(reduce8(p), _mm256_set1_epi32(c));
}

/* The 8 f16 scales at byte boff of each row, as floats. */
Q3_INLINE __m256 scales8(const uint8_t *const rp[PANEL], __m256i vidx, size_t boff)
{
    __m256i g = _mm256_i32gather_epi32((const int *)(const void *)(rp[0] + boff), vidx, 1);
    g = _mm256_and_si256(g, _mm256_set1_epi32(0xffff));
    __m128i h = _mm_packus_epi32(_mm256_castsi256_si128(g), _mm256_extracti128_si256(g, 1));
    return _mm256_cvtph_ps(h);
}

/* One activation tile against the panel at rp, all blocks. The panel's
 * rows are read as 8 interleaved streams, which the hardware prefetchers
 * follow poorly, so the first tile also prefetches next_bytes of the next
 * panel (contiguous rows) in address order, per_step bytes per block. */
Q3_INLINE void panel_tile(const int q8, const uint8_t *const rp[PANEL], __m256i vidx, size_t bb, const q3_qact *qa,
                          int t0, int th, float *y, size_t ldy, int cols, const char *next, size_t next_bytes,
                          size_t per_step)
{
    const int nb = qa->k / Q3_QBLOCK;
    __m256 f[Q3_QACT_TILE];
    for (int r = 0; r < th; r++) f[r] = _mm256_setzero_ps();
    const char *a = q3_qact_block(qa, t0, 0);
    for (int b = 0; b < nb; b++, a += (size_t)th * Q3_QACT_BLOCK_BYTES) {
        size_t boff = (size_t)b * bb;
        if (t0 == 0)
            for (size_t l = (size_t)b * per_step; l < (size_t)(b + 1) * per_step && l < next_bytes; l += 64)
                _mm_prefetch(next + l, _MM_HINT_T0);
        __m256 dw = scales8(rp, vidx, boff);
        for (int r = 0; r < th; r++) {
            const int8_t *xq = (const int8_t *)a + r * Q3_QBLOCK;
            __m256i I = q8 ? dot_q8(rp, boff, xq) : dot_q4(rp, boff, xq, q3_ld_i32(a + th * Q3_QBLOCK + 4 * r));
            __m256 s = _mm256_mul_ps(dw, _mm256_set1_ps(q3_ld_f32(a + th * (Q3_QBLOCK + 4) + 4 * r)));
            f[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(I), s, f[r]);
        }
    }
    __m256i m = q3_mask8(cols);
    for (int r = 0; r < th; r++) _mm256_maskstore_ps(y + (size_t)r * ldy, m, f[r]);
}

Q3_INLINE void matmul_kind(const int q8, const void *w, size_t ws, const q3_qact *qa, float *y, size_t ldy, int o0,
                           int o1)
{
    const size_t bb = q8 ? Q3_Q8_0_BYTES : Q3_Q4_0_BYTES, pbytes = (size_t)PANEL * ws, nb = (size_t)(qa->k / Q3_QBLOCK);
    const size_t per_step = (pbytes / 64 + nb - 1) / nb * 64;
    for (size_t l = 0; l < pbytes && l < (size_t)(o1 - o0) * ws; l += 64)
        _mm_prefetch((const char *)w + (size_t)o0 * ws + l, _MM_HINT_T0);
    for (int o = o0; o < o1; o += PANEL) {
        const char *next = (const char *)w + (size_t)(o + PANEL) * ws;
        size_t next_bytes = o + PANEL < o1 ? (size_t)(o1 - o - PANEL) * ws : 0;
        if (next_bytes > pbytes) next_bytes = pbytes;
        const uint8_t *rp[PANEL];
        int32_t idx[PANEL];
        for (int l = 0; l < PANEL; l++) {
            int row = o + l < o1 ? o + l : o1 - 1;
            rp[l] = (const uint8_t *)w + (size_t)row * ws;
            idx[l] = (int32_t)((size_t)(row - o) * ws);
        }
        __m256i vidx = _mm256_loadu_si256((const __m256i *)idx);
        for (int t0 = 0; t0 < qa->rows; t0 += Q3_QACT_TILE)
            panel_tile(q8, rp, vidx, bb, qa, t0, q3_qact_tile_rows(qa, t0), y + (size_t)t0 * ldy + o, ldy, o1 - o, next,
                       next_bytes, per_step);
    }
}

static void matmul_q8_0(const void *w, size_t ws, const q3_qact *qa, float *y, size_t ldy, int o0, int o1, void *s)
{
    matmul_kind(1, w, ws, qa, y, ldy, o0, o1);
}

static void matmul_q4_0(const void *w, size_t ws, const q3_qact *qa, float *y, size_t ldy, int o0, int o1, void *s)
{
    matmul_kind(0, w, ws, qa, y, ldy, o0, o1);
}

static const q3_quant_type_kernels q8_0_row = {.act_offset = 128, .matmul = matmul_q8_0},
                                    q4_0_row = {.act_offset = 8, .matmul = matmul_q4_0};

/* This table's rows, by weight dtype. */
static const q3_quant_type_kernels *const avx2_rows[Q3_DTYPE_COUNT] = {
    [Q3_Q8_0] = &q8_0_row,
    [Q3_Q4_0] = &q4_0_row,
    [Q3_Q4_K] = &q3_kquant_avx2_q4_k,
    [Q3_Q5_K] = &q3_kquant_avx2_q5_k,
    [Q3_Q6_K] = &q3_kquant_avx2_q6_k,
};

static size_t avx2_scratch(q3_dtype wt, int rows, int k) { return q3_quant_rows_scratch(avx2_rows, wt, rows, k); }

static void avx2_matmul(q3_dtype wt, const void *w, size_t ws, const q3_qact *qa, float *y, size_t ldy, int o0, int o1,
                        void *scratch)
{
    avx2_rows[wt]->matmul(w, ws, qa, y, ldy, o0, o1, scratch);
}

const q3_quant_kernels q3_quant_avx2 = {
    .name = "avx2",
    .granule = PANEL,
    .type = avx2_rows,
    .quantize = avx2_quantize,
    .scratch = avx2_scratch,
    .matmul = avx2_matmul,
};

/* ---- behind the unit's MATMUL interface ------------------------------------------------------ */

static size_t mm_scratch(const q3_cpu_matmul *mm) { return q3_qact_bytes(mm->m, mm->k); }

static int mm_granule(const q3_cpu_matmul *mm) { return PANEL; }

static void mm_prepare(const q3_cpu_matmul *mm, void *scratch)
{
    q3_qact qa = q3_qact_carve(scratch, mm->m, mm->k);
    avx2_quantize(mm->wtype, mm->x, mm->ldx, &qa, 0, mm->m);
}

static void mm_range(const q3_cpu_matmul *mm, void *scratch, int o0, int o1)
{
    q3_qact qa = q3_qact_carve(scratch, mm->m, mm->k);
    avx2_matmul(mm->wtype, mm->w, mm->w_row_bytes, &qa, mm->y, mm->ldy, o0, o1, NULL);
}

const q3_cpu_mm_kernels q3_cpu_mm_quant_avx2 = {
    .scratch = mm_scratch,
    .granule = mm_granule,
    .prepare = mm_prepare,
    .range = mm_range,
};
