/* Q8_0 / Q4_0 MATMUL on AVX-512 VNNI (numerics and the activation layout in
 * quant_kernels.h).
 *
 * Layout of the work: "output form". A panel is 16 consecutive outputs, one
 * per 32-bit lane. For weight block b the panel's 16 rows are transposed in
 * registers into 8 vectors T[j]: lane l of T[j] holds the 4 weight bytes of
 * row l that meet activation bytes 4j..4j+3 (Q8_0 offset to unsigned by xor
 * 0x80, Q4_0 nibbles 0..15 unpacked). Then for one activation row
 *     acc = c (the offset correction), acc = vpdpbusd(acc, T[j], broadcast
 *     of the row's 4 bytes j) for j = 0..7
 * leaves the 16 exact block dot products I_b in the lanes, and one
 * cvt + mul + fma folds them into the panel's 16 float sums: 8 dot
 * instructions per 4 others (the broadcast of c included), and no lane
 * reductions at all.
 *  - GEMV (1 row): each panel's blocks are transposed as they stream from
 *    memory and used at once (each weight byte read once; the compute runs
 *    at ~25 GB/s of Q8_0 from L2, ~15 of Q4_0, well above the memory);
 *  - GEMM (rows > 1): each panel is transposed once into scratch (576 bytes
 *    per block), then every tile of 16 activation rows walks it: the 8 T
 *    vectors and 16 integer accumulators in registers, the activations'
 *    4-byte groups broadcast from memory inside vpdpbusd, the 16 float sums
 *    half in registers, half in L1. ~85% of the vector units' issue rate.
 * Both run the same per-lane sequence, so a row's outputs are the same bits
 * from either (and from the AVX2 and reference kernels).
 *
 * Tried and dropped: an AMX-INT8 GEMM (TDPBSSD on the same panels, one C
 * tile per 32-value block because every block has its own scales). Each C
 * tile must go through memory (a tile store, 16 row loads) before the
 * cvt + mul + fma of its block, and on this machine the tile loads and
 * stores plus the fold's loads saturate the load/store ports: it measured
 * 0.9x this kernel in bench_quant, so it is not worth its complexity. */
#include <string.h>

#include "backend/cpu/quant_kernels.h"
#include "backend/cpu/quant_panel_avx512.h"
#include "backend/cpu/simd_avx512.h"

#define PANEL Q3_QPANEL
#define PANEL_BLOCK_BYTES 576 /* packed panel block: T[0..7] (8 x 64 bytes), then 16 float scales */

/* ---- activations --------------------------------------------------------------------- */

Q3_INLINE float block_amax(const float *x)
{
    const __m512 absmask = _mm512_castsi512_ps(_mm512_set1_epi32(0x7fffffff));
    __m512 lo = _mm512_loadu_ps(x), hi = _mm512_loadu_ps(x + 16);
    return _mm512_reduce_max_ps(_mm512_max_ps(_mm512_and_ps(lo, absmask), _mm512_and_ps(hi, absmask)));
}

Q3_INLINE void block_quant(const float *x, float id, int8_t *q, int s[2])
{
    const __m512 vid = _mm512_set1_ps(id);
    __m512i ql = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(x), vid)); /* MXCSR: nearest even */
    __m512i qh = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(x + 16), vid));
    _mm_storeu_si128((__m128i *)q, _mm512_cvtsepi32_epi8(ql));
    _mm_storeu_si128((__m128i *)(q + 16), _mm512_cvtsepi32_epi8(qh));
    s[0] = _mm512_reduce_add_epi32(ql);
    s[1] = _mm512_reduce_add_epi32(qh);
}

static void avx512_quantize(q3_dtype wt, const float *x, size_t ldx, const q3_qact *qa, int r0, int r1)
{
    q3_qact_quantize_with(wt, x, ldx, qa, r0, r1, block_amax, block_quant);
}

/* ---- a panel's weight block, transposed ---------------------------------------------------- */

/* The 16 f16 scales at byte boff of each row, as floats (the gather reads the
 * scale and the block's first 2 quant bytes: always inside the block). */
Q3_INLINE __m512 panel_scales(const q3_panel_rows *pr, size_t boff)
{
    __m512i g = _mm512_i32gather_epi32(pr->vidx, (const void *)(pr->p[0] + boff), 1);
    return _mm512_cvtph_ps(_mm512_cvtepi32_epi16(g));
}

/* Q8_0 block at byte boff of each row -> T[8] (bytes xor 0x80). */
Q3_INLINE void panel_q8(const q3_panel_rows *pr, size_t boff, __m512i T[8], __m512 *dw)
{
    const __m512i flip = _mm512_set1_epi8((char)0x80);
    q3_panel_tr32(pr, boff + 2, T);
#pragma GCC unroll 8
    for (int j = 0; j < 8; j++) T[j] = _mm512_xor_si512(T[j], flip);
    *dw = panel_scales(pr, boff);
}

/* Q4_0 block at byte boff of each row -> T[8] (T[j]: low nibbles of bytes
 * 4j..4j+3 = values 4j..4j+3; T[4+j]: their high nibbles = values
 * 16+4j..). */
Q3_INLINE void panel_q4(const q3_panel_rows *pr, size_t boff, __m512i T[8], __m512 *dw)
{
    const __m512i low4 = _mm512_set1_epi8(0x0f);
    __m512i V[4];
    q3_panel_tr16(pr, boff + 2, V);
#pragma GCC unroll 4
    for (int j = 0; j < 4; j++) {
        T[j] = _mm512_and_si512(V[j], low4);
        T[j + 4] = _mm512_and_si512(_mm512_srli_epi16(V[j], 4), low4);
    }
    *dw = panel_scales(pr, boff);
}

/* ---- the dot products -------------------------------------------------------------------- */

/* One block of R activation rows against the panel: a is the block in the
 * activation layout (q[R][32], c[R], d[R]); f[r] += float(I) * (dw * d[r]). */
Q3_INLINE void block_dot(const int R, const __m512i T[8], __m512 dw, const char *a, __m512 *f)
{
    __m512i acc[Q3_QACT_TILE];
#pragma GCC unroll 16
    for (int r = 0; r < R; r++) acc[r] = _mm512_set1_epi32(q3_ld_i32(a + R * Q3_QBLOCK + 4 * r));
#pragma GCC unroll 8
    for (int j = 0; j < 8; j++)
#pragma GCC unroll 16
        for (int r = 0; r < R; r++) acc[r] = q3_dot_bcast(acc[r], T[j], a + Q3_QBLOCK * r + 4 * j);
#pragma GCC unroll 16
    for (int r = 0; r < R; r++) {
        __m512 s = _mm512_mul_ps(dw, _mm512_set1_ps(q3_ld_f32(a + R * (Q3_QBLOCK + 4) + 4 * r)));
        f[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc[r]), s, f[r]);
    }
}

static size_t block_bytes(q3_dtype wt) { return wt == Q3_Q8_0 ? 34 : 18; }

/* The GEMV streams each panel's 16 rows at once (16 interleaved streams,
 * which the hardware prefetchers follow poorly: ~60% of the read bandwidth),
 * so it prefetches the next panel, a contiguous 16 rows, in address order,
 * spread over the current panel's block steps (and the first panel of the
 * range up front): ~90% of the bandwidth. */
/* R activation rows (R = qa->rows <= SMALL_ROWS: one tile) against each
 * panel as it streams in: the GEMV's loop, each transposed block used by all
 * R rows at once (a decode step of a few sequences reads each weight byte
 * once, with no packed copy). R = 1 is the GEMV. */
Q3_INLINE void gemv_kind(const int q8, const int R, const void *w, size_t ws, const q3_qact *qa, float *y, size_t ldy,
                         int o0, int o1)
{
    const int nb = qa->k / Q3_QBLOCK;
    const size_t bb = q8 ? 34 : 18, pbytes = (size_t)PANEL * ws;
    const size_t per_step = (pbytes / 64 + (size_t)nb - 1) / (size_t)nb * 64; /* bytes of the next panel per block */
    q3_prefetch_lines((const char *)w + (size_t)o0 * ws, (size_t)(o1 - o0) * ws, 0, pbytes, 0);
    for (int o = o0; o < o1; o += PANEL) {
        q3_panel_rows pr;
        q3_panel_rows_init(&pr, w, ws, o, o1);
        const char *next = (const char *)w + (size_t)(o + PANEL) * ws;
        const size_t next_bytes = o + PANEL < o1 ? (size_t)(o1 - o - PANEL) * ws : 0;
        __m512 f[Q3_QACT_TILE];
#pragma GCC unroll 16
        for (int r = 0; r < R; r++) f[r] = _mm512_setzero_ps();
        const char *a = qa->base;
        for (int b = 0; b < nb; b++, a += R * Q3_QACT_BLOCK_BYTES) {
            __m512i T[8];
            __m512 dw;
            q3_prefetch_lines(next, next_bytes < pbytes ? next_bytes : pbytes, (size_t)b * per_step, (size_t)(b + 1) * per_step, 0);
            if (q8) panel_q8(&pr, (size_t)b * bb, T, &dw);
            else panel_q4(&pr, (size_t)b * bb, T, &dw);
            block_dot(R, T, dw, a, f);
        }
#pragma GCC unroll 16
        for (int r = 0; r < R; r++) _mm512_mask_storeu_ps(y + (size_t)r * ldy + o, q3_mask16(o1 - o), f[r]);
    }
}

/* Rows up to which the GEMV's streaming loop serves several rows (beyond, the
 * GEMM packs each panel once for its 16-row tiles). */
#define SMALL_ROWS 16

static void gemv_rows(q3_dtype wt, const void *w, size_t ws, const q3_qact *qa, float *y, size_t ldy, int o0, int o1)
{
    const int q8 = wt == Q3_Q8_0;
#define ROWS_CASE(n)                                                                                                 \
    case n:                                                                                                          \
        if (q8) gemv_kind(1, n, w, ws, qa, y, ldy, o0, o1);                                                           \
        else gemv_kind(0, n, w, ws, qa, y, ldy, o0, o1);                                                              \
        break;
    switch (qa->rows) {
        ROWS_CASE(1) ROWS_CASE(2) ROWS_CASE(3) ROWS_CASE(4) ROWS_CASE(5) ROWS_CASE(6) ROWS_CASE(7) ROWS_CASE(8)
        ROWS_CASE(9) ROWS_CASE(10) ROWS_CASE(11) ROWS_CASE(12) ROWS_CASE(13) ROWS_CASE(14) ROWS_CASE(15) ROWS_CASE(16)
    }
#undef ROWS_CASE
}

/* ---- the GEMM -------------------------------------------------------------------------------- */

/* Transposes the panel at output o (all nb blocks) into dst: per block T[0..7]
 * then the 16 scales (PANEL_BLOCK_BYTES). */
static void pack_panel(q3_dtype wt, const void *w, size_t ws, int nb, int o, int o1, char *dst)
{
    const size_t bb = block_bytes(wt);
    q3_panel_rows pr;
    q3_panel_rows_init(&pr, w, ws, o, o1);
    for (int b = 0; b < nb; b++, dst += PANEL_BLOCK_BYTES) {
        __m512i T[8];
        __m512 dw;
        if (wt == Q3_Q8_0) panel_q8(&pr, (size_t)b * bb, T, &dw);
        else panel_q4(&pr, (size_t)b * bb, T, &dw);
        for (int j = 0; j < 8; j++) _mm512_store_si512(dst + 64 * j, T[j]);
        _mm512_store_ps(dst + 512, dw);
    }
}

/* R rows (one activation tile) against a packed panel, all blocks. The R
 * sums live in f[] (beyond the registers for R = 16: the compiler keeps
 * them in L1, one load and store per row and block next to 8 dot products). */
Q3_INLINE void gemm_tile(const int R, const char *panel, int nb, const char *a, float *y, size_t ldy, __mmask16 m)
{
    __m512 f[Q3_QACT_TILE];
#pragma GCC unroll 16
    for (int r = 0; r < R; r++) f[r] = _mm512_setzero_ps();
    for (int b = 0; b < nb; b++, panel += PANEL_BLOCK_BYTES, a += R * Q3_QACT_BLOCK_BYTES) {
        __m512i T[8];
#pragma GCC unroll 8
        for (int j = 0; j < 8; j++) T[j] = _mm512_load_si512(panel + 64 * j);
        block_dot(R, T, _mm512_load_ps(panel + 512), a, f);
    }
#pragma GCC unroll 16
    for (int r = 0; r < R; r++) _mm512_mask_storeu_ps(y + (size_t)r * ldy, m, f[r]);
}

/* The activation tile at row t0 (th rows) against a packed panel. */
static void gemm_rows(const char *panel, int nb, const q3_qact *qa, int t0, float *y, size_t ldy, __mmask16 m)
{
    const char *a = q3_qact_block(qa, t0, 0);
    switch (q3_qact_tile_rows(qa, t0)) {
#define TILE_CASE(n) \
    case n: gemm_tile(n, panel, nb, a, y, ldy, m); break;
        TILE_CASE(1) TILE_CASE(2) TILE_CASE(3) TILE_CASE(4) TILE_CASE(5) TILE_CASE(6) TILE_CASE(7) TILE_CASE(8)
        TILE_CASE(9) TILE_CASE(10) TILE_CASE(11) TILE_CASE(12) TILE_CASE(13) TILE_CASE(14) TILE_CASE(15)
#undef TILE_CASE
    default: gemm_tile(16, panel, nb, a, y, ldy, m); break;
    }
}

static void gemm(q3_dtype wt, const void *w, size_t ws, const q3_qact *qa, float *y, size_t ldy, int o0, int o1,
                 void *scratch)
{
    const int nb = qa->k / Q3_QBLOCK, n_tiles = (qa->rows + Q3_QACT_TILE - 1) / Q3_QACT_TILE;
    const size_t pbytes = (size_t)PANEL * ws, per_tile = (pbytes / 64 + (size_t)n_tiles - 1) / (size_t)n_tiles * 64;
    for (int o = o0; o < o1; o += PANEL) {
        pack_panel(wt, w, ws, nb, o, o1, scratch);
        /* the next panel's weights into L2 while this one computes */
        const char *next = (const char *)w + (size_t)(o + PANEL) * ws;
        size_t next_bytes = o + PANEL < o1 ? (size_t)(o1 - o - PANEL) * ws : 0;
        if (next_bytes > pbytes) next_bytes = pbytes;
        for (int t = 0; t < n_tiles; t++) {
            q3_prefetch_lines(next, next_bytes, (size_t)t * per_tile, (size_t)(t + 1) * per_tile, 1);
            int t0 = t * Q3_QACT_TILE;
            gemm_rows(scratch, nb, qa, t0, y + (size_t)t0 * ldy + o, ldy, q3_mask16(o1 - o));
        }
    }
}

static size_t avx512_scratch(q3_dtype wt, int rows, int k)
{
    if (q3_is_kquant(wt)) return q3_kquant_scratch_avx512(wt, rows, k);
    return rows > SMALL_ROWS ? (size_t)(k / Q3_QBLOCK) * PANEL_BLOCK_BYTES : 0;
}

static void avx512_matmul(q3_dtype wt, const void *w, size_t ws, const q3_qact *qa, float *y, size_t ldy, int o0, int o1,
                          void *scratch)
{
    if (o1 <= o0) return;
    if (q3_is_kquant(wt)) q3_kquant_matmul_avx512(wt, w, ws, qa, y, ldy, o0, o1, scratch);
    else if (qa->rows > SMALL_ROWS) gemm(wt, w, ws, qa, y, ldy, o0, o1, scratch);
    else gemv_rows(wt, w, ws, qa, y, ldy, o0, o1);
}

const q3_quant_kernels q3_quant_avx512 = {
    .name = "avx512-vnni",
    .granule = PANEL,
    .quantize = avx512_quantize,
    .scratch = avx512_scratch,
    .matmul = avx512_matmul,
};

/* ---- behind the unit's MATMUL interface ------------------------------------------------------ */

static size_t mm_scratch(const q3_cpu_matmul *mm)
{
    return q3_qact_bytes(mm->m, mm->k) + avx512_scratch(mm->wtype, mm->m, mm->k);
}

static int mm_granule(const q3_cpu_matmul *mm) { return PANEL; }

static void mm_prepare(const q3_cpu_matmul *mm, void *scratch)
{
    q3_qact qa = q3_qact_carve(scratch, mm->m, mm->k);
    avx512_quantize(mm->wtype, mm->x, mm->ldx, &qa, 0, mm->m);
}

static void mm_range(const q3_cpu_matmul *mm, void *scratch, int o0, int o1)
{
    q3_qact qa = q3_qact_carve(scratch, mm->m, mm->k);
    avx512_matmul(mm->wtype, mm->w, mm->w_row_bytes, &qa, mm->y, mm->ldy, o0, o1,
                  (char *)scratch + q3_qact_bytes(mm->m, mm->k));
}

const q3_cpu_mm_kernels q3_cpu_mm_quant_avx512 = {
    .scratch = mm_scratch,
    .granule = mm_granule,
    .prepare = mm_prepare,
    .range = mm_range,
};
