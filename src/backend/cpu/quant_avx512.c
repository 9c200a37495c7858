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
 * The transposition is done once per weight: the table reads Q8_0/Q4_0
 * weights packed panel by panel ("packed weights" below), so
 *  - GEMV (1 to 16 rows): each packed panel streams in address order and
 *    meets every row at once (each weight byte read once per step);
 *  - GEMM (more rows): each panel is unpacked into scratch (576 bytes per
 *    block), then every tile of 16 activation rows walks it: the 8 T
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

/* max |x| as the unsigned order of the |x| bit patterns: the float max for
 * finite values, NaN or inf when the block holds one (vmaxps would drop a
 * NaN depending on the operand order). */
Q3_INLINE float block_amax(const float *x)
{
    const __m512i absmask = _mm512_set1_epi32(0x7fffffff);
    __m512i lo = _mm512_and_si512(_mm512_loadu_si512(x), absmask), hi = _mm512_and_si512(_mm512_loadu_si512(x + 16), absmask);
    uint32_t m = _mm512_reduce_max_epu32(_mm512_max_epu32(lo, hi));
    float f;
    memcpy(&f, &m, 4);
    return f;
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
    q3_qact_quantize_with(q3_quant_avx512.type[wt]->act_offset, x, ldx, qa, r0, r1, block_amax, block_quant);
}

/* ---- a panel's weight block, transposed ---------------------------------------------------- */

/* The 16 f16 scales at byte boff of each row (the gather reads the scale and
 * the block's first 2 quant bytes: always inside the block). */
Q3_INLINE __m256i panel_scales_f16(const q3_panel_rows *pr, size_t boff)
{
    __m512i g = _mm512_i32gather_epi32(pr->vidx, (const void *)(pr->p[0] + boff), 1);
    return _mm512_cvtepi32_epi16(g);
}

/* ---- packed weights ------------------------------------------------------------------------
 *
 * Transposing a panel's blocks as they stream in (the shuffles above and the
 * scale gather: about as many cycles per byte as the memory takes to deliver
 * it) and reading 16 rows side by side (16 interleaved streams, which the
 * hardware prefetchers follow poorly) kept the GEMV well below the read
 * bandwidth. So this table reads Q8_0/Q4_0 weights in a layout of its own,
 * made once per weight by pack(): panel after panel (16 outputs; a last
 * partial panel repeats its last row), each panel its nb transposed blocks in
 * order (Q8_0: T[0..7], 512 bytes, already offset by 0x80; Q4_0: V[0..3], 256
 * bytes of nibble pairs), then the panel's f16 scales (16 per block). The
 * GEMV streams that in address order with no shuffle (Q4_0: two ands and a
 * shift per vector), and the GEMM unpacks each panel into its tile layout.
 * The same bytes meet the same dot products: the results do not change. */

/* How far ahead the GEMV prefetches its packed stream (into L2: into L1 it
 * evicted what was being read). bench_quant --only token, Q4_0, 2 threads,
 * one run: none 17.3-18.4 ms per token's GEMVs, 4 KB ahead 14.5, 8 KB 11.2-11.5,
 * 16 KB 12.0-13.0, 32 KB 13.0-13.4 (Q8_0: the same within the noise). */
#define GEMV_PREFETCH 8192

static size_t qblock_bytes(int q8) { return q8 ? 512 : 256; }

static size_t panel_bytes(int q8, int nb) { return ((size_t)nb * (qblock_bytes(q8) + 32) + 63) & ~(size_t)63; }

static size_t packed_bytes(const int q8, int n, int k)
{
    return (size_t)((n + PANEL - 1) / PANEL) * panel_bytes(q8, k / Q3_QBLOCK);
}

static void pack(const int q8, const void *w, size_t ws, int n, int k, void *dst, int o0, int o1)
{
    const int nb = k / Q3_QBLOCK;
    const size_t bb = q8 ? Q3_Q8_0_BYTES : Q3_Q4_0_BYTES, qb = qblock_bytes(q8), pb = panel_bytes(q8, nb);
    for (int o = o0 - o0 % PANEL; o < o1; o += PANEL) {
        q3_panel_rows pr;
        q3_panel_rows_init(&pr, w, ws, o, n);
        char *q = (char *)dst + (size_t)(o / PANEL) * pb, *sc = q + (size_t)nb * qb;
        for (int b = 0; b < nb; b++, q += qb, sc += 32) {
            __m512i T[8];
            if (q8) { /* Q8_0: T[0..7], offset to unsigned */
                q3_panel_tr32(&pr, (size_t)b * bb + 2, T);
                for (int j = 0; j < 8; j++) T[j] = _mm512_xor_si512(T[j], _mm512_set1_epi8((char)0x80));
            } else { /* Q4_0: V[0..3], the nibble pairs */
                q3_panel_tr16(&pr, (size_t)b * bb + 2, T);
            }
            for (int j = 0; j < (q8 ? 8 : 4); j++) _mm512_store_si512(q + 64 * j, T[j]);
            _mm256_storeu_si256((__m256i *)sc, panel_scales_f16(&pr, (size_t)b * bb));
        }
    }
}

/* Block b of a packed panel -> T[8] and the 16 scales as floats. */
Q3_INLINE void packed_block(const int q8, const char *panel, int nb, int b, __m512i T[8], __m512 *dw)
{
    const char *q = panel + (size_t)b * qblock_bytes(q8);
    if (q8) {
#pragma GCC unroll 8
        for (int j = 0; j < 8; j++) T[j] = _mm512_load_si512(q + 64 * j);
    } else {
        const __m512i low4 = _mm512_set1_epi8(0x0f);
#pragma GCC unroll 4
        for (int j = 0; j < 4; j++) { /* low nibbles: values 4j..4j+3; high: 16+4j.. */
            __m512i v = _mm512_load_si512(q + 64 * j);
            T[j] = _mm512_and_si512(v, low4);
            T[j + 4] = _mm512_and_si512(_mm512_srli_epi16(v, 4), low4);
        }
    }
    *dw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(panel + (size_t)nb * qblock_bytes(q8) + (size_t)b * 32)));
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

/* R activation rows (R = qa->rows <= SMALL_ROWS: one tile) against each
 * packed panel as it streams in, in address order: the GEMV's loop, each block
 * used by all R rows at once (a decode step of a few sequences reads each
 * weight byte once). R = 1 is the GEMV. */
Q3_INLINE void gemv_kind(const int q8, const int R, const char *packed, const q3_qact *qa, float *y, size_t ldy, int o0,
                         int o1)
{
    const int nb = qa->k / Q3_QBLOCK;
    const size_t pb = panel_bytes(q8, nb);
    for (int p = o0 / PANEL; p * PANEL < o1; p++) {
        const char *panel = packed + (size_t)p * pb;
        __m512 f[Q3_QACT_TILE];
#pragma GCC unroll 16
        for (int r = 0; r < R; r++) f[r] = _mm512_setzero_ps();
        const char *a = qa->base;
        for (int b = 0; b < nb; b++, a += R * Q3_QACT_BLOCK_BYTES) {
            __m512i T[8];
            __m512 dw;
            { /* the stream GEMV_PREFETCH bytes ahead, into L2 */
                const char *pq = panel + (size_t)b * qblock_bytes(q8) + GEMV_PREFETCH;
                for (int l = 0; l < (q8 ? 8 : 4); l++) _mm_prefetch(pq + 64 * l, _MM_HINT_T1);
                if (b % 2 == 0) _mm_prefetch(panel + (size_t)nb * qblock_bytes(q8) + (size_t)b * 32 + GEMV_PREFETCH, _MM_HINT_T1);
            }
            packed_block(q8, panel, nb, b, T, &dw);
            block_dot(R, T, dw, a, f);
        }
        const __mmask16 m = q3_panel_mask(p, o0, o1);
#pragma GCC unroll 16
        for (int r = 0; r < R; r++) _mm512_mask_storeu_ps(y + (size_t)r * ldy + (size_t)p * PANEL, m, f[r]);
    }
}

/* Rows up to which the GEMV's streaming loop serves several rows (beyond, the
 * GEMM unpacks each panel once for its 16-row tiles). */
#define SMALL_ROWS 16

static void gemv_rows(const int q8, const void *packed, const q3_qact *qa, float *y, size_t ldy, int o0, int o1)
{
#define ROWS_CASE(n)                                                                                                 \
    case n:                                                                                                          \
        if (q8) gemv_kind(1, n, packed, qa, y, ldy, o0, o1);                                                          \
        else gemv_kind(0, n, packed, qa, y, ldy, o0, o1);                                                             \
        break;
    switch (qa->rows) {
        ROWS_CASE(1) ROWS_CASE(2) ROWS_CASE(3) ROWS_CASE(4) ROWS_CASE(5) ROWS_CASE(6) ROWS_CASE(7) ROWS_CASE(8)
        ROWS_CASE(9) ROWS_CASE(10) ROWS_CASE(11) ROWS_CASE(12) ROWS_CASE(13) ROWS_CASE(14) ROWS_CASE(15) ROWS_CASE(16)
    }
#undef ROWS_CASE
}

/* ---- the GEMM -------------------------------------------------------------------------------- */

/* A packed panel (all nb blocks) -> dst in the tile layout: per block T[0..7]
 * then the 16 scales as floats (PANEL_BLOCK_BYTES). */
static void unpack_panel(int q8, const char *panel, int nb, char *dst)
{
    for (int b = 0; b < nb; b++, dst += PANEL_BLOCK_BYTES) {
        __m512i T[8];
        __m512 dw;
        packed_block(q8, panel, nb, b, T, &dw);
        for (int j = 0; j < 8; j++) _mm512_store_si512(dst + 64 * j, T[j]);
        _mm512_store_ps(dst + 512, dw);
    }
}

/* R rows (one activation tile) against an unpacked panel, all blocks. The R
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

/* The activation tile at row t0 (th rows) against an unpacked panel. */
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

static void gemm(const int q8, const char *packed, const q3_qact *qa, float *y, size_t ldy, int o0, int o1, void *scratch)
{
    const int nb = qa->k / Q3_QBLOCK, n_tiles = (qa->rows + Q3_QACT_TILE - 1) / Q3_QACT_TILE;
    const size_t pb = panel_bytes(q8, nb), per_tile = (pb / 64 + (size_t)n_tiles - 1) / (size_t)n_tiles * 64;
    const int p1 = (o1 + PANEL - 1) / PANEL;
    for (int p = o0 / PANEL; p < p1; p++) {
        unpack_panel(q8, packed + (size_t)p * pb, nb, scratch);
        /* the next panel's weights into L2 while this one computes */
        const char *next = packed + (size_t)(p + 1) * pb;
        const size_t next_bytes = p + 1 < p1 ? pb : 0;
        const __mmask16 m = q3_panel_mask(p, o0, o1);
        for (int t = 0; t < n_tiles; t++) {
            q3_prefetch_lines(next, next_bytes, (size_t)t * per_tile, (size_t)(t + 1) * per_tile, 1);
            int t0 = t * Q3_QACT_TILE;
            gemm_rows(scratch, nb, qa, t0, y + (size_t)t0 * ldy + (size_t)p * PANEL, ldy, m);
        }
    }
}

/* ---- the rows ------------------------------------------------------------------------------ */

static size_t q0_scratch(int rows, int k) { return rows > SMALL_ROWS ? (size_t)(k / Q3_QBLOCK) * PANEL_BLOCK_BYTES : 0; }

/* w is the packed weight (ws unused). */
#define ROW(name, q8, off)                                                                                            \
    static size_t name##_packed_bytes(int n, int k) { return packed_bytes(q8, n, k); }                               \
    static void name##_pack(const void *w, size_t ws, int n, int k, void *dst, int o0, int o1)                      \
    {                                                                                                                \
        pack(q8, w, ws, n, k, dst, o0, o1);                                                                          \
    }                                                                                                                \
    static void name##_matmul(const void *w, size_t ws, const q3_qact *qa, float *y, size_t ldy, int o0, int o1,    \
                              void *scratch)                                                                         \
    {                                                                                                                \
        if (qa->rows > SMALL_ROWS) gemm(q8, w, qa, y, ldy, o0, o1, scratch);                                         \
        else gemv_rows(q8, w, qa, y, ldy, o0, o1);                                                                   \
    }                                                                                                                \
    static const q3_quant_type_kernels name##_row = {                                                                \
        .act_offset = off, .scratch = q0_scratch, .packed_bytes = name##_packed_bytes, .pack = name##_pack, .matmul = name##_matmul};
ROW(q8_0, 1, 128)
ROW(q4_0, 0, 8)
#undef ROW

/* This table's rows, by weight dtype. */
static const q3_quant_type_kernels *const avx512_rows[Q3_DTYPE_COUNT] = {
    [Q3_Q8_0] = &q8_0_row,
    [Q3_Q4_0] = &q4_0_row,
    [Q3_Q4_K] = &q3_kquant_avx512_q4_k,
    [Q3_Q5_K] = &q3_kquant_avx512_q5_k,
    [Q3_Q6_K] = &q3_kquant_avx512_q6_k,
};

static size_t avx512_scratch(q3_dtype wt, int rows, int k) { return q3_quant_rows_scratch(avx512_rows, wt, rows, k); }

static size_t avx512_packed_bytes(q3_dtype wt, int n, int k) { return q3_quant_rows_packed_bytes(avx512_rows, wt, n, k); }

static void avx512_pack(q3_dtype wt, const void *w, size_t ws, int n, int k, void *dst, int o0, int o1)
{
    avx512_rows[wt]->pack(w, ws, n, k, dst, o0, o1);
}

/* w is the packed weight (Q8_0/Q4_0: ws unused; K-quants: ws is the file's row bytes). */
static void avx512_matmul(q3_dtype wt, const void *w, size_t ws, const q3_qact *qa, float *y, size_t ldy, int o0, int o1,
                          void *scratch)
{
    if (o1 <= o0) return;
    avx512_rows[wt]->matmul(w, ws, qa, y, ldy, o0, o1, scratch);
}

const q3_quant_kernels q3_quant_avx512 = {
    .name = "avx512-vnni",
    .granule = PANEL,
    .type = avx512_rows,
    .quantize = avx512_quantize,
    .scratch = avx512_scratch,
    .packed_bytes = avx512_packed_bytes,
    .pack = avx512_pack,
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
    .packed_bytes = avx512_packed_bytes,
    .pack = avx512_pack,
    .scratch = mm_scratch,
    .granule = mm_granule,
    .prepare = mm_prepare,
    .range = mm_range,
};
