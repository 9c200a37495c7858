/* MATMUL of BF16 weights on AMX (TDPBF16PS), for CPUs that have it and an OS
 * that grants it: an order of magnitude more BF16 throughput than
 * vdpbf16ps (which on some AMX parts runs at half the F32 FMA rate).
 *
 * Formulation: y^T = W x^T. A tiles are weight blocks read in place from the
 * mapping (16 output rows x 64 bytes = 32 k values, row stride = the
 * weight's row bytes); B tiles are the activations, rounded to BF16 once per
 * op and packed in the VNNI layout (16 k-pairs x 16 token rows of 32-bit
 * words); C tiles are 16 outputs x 16 token rows of F32, transposed into y.
 *  - GEMM (m > 1): 2 x 2 register blocking (C0..C3 += A4,A5 x B6,B7), all of
 *    K, then the C tiles are transposed out.
 *  - GEMV (m == 1): B is the BF16 row itself (16 k-pairs x 1 column), three
 *    C tiles (48 outputs) in flight, each 16 x 1.
 * Both accumulate every output through the same sequence of TDPBF16PS over
 * the same 32-value k blocks, so a row's result is the same whichever of
 * the two computed it (test_cpu_backend checks it bit for bit).
 *
 * Eligible ops: BF16 weights with k % 32 == 0 and n >= 16 (a short last
 * output block is computed as the 16 rows ending at n and stored in part).
 * Any other op goes to the AVX-512 kernels, decided by the weight's shape
 * alone, so the GEMM and the GEMV of one weight always take the same path. */
#pragma GCC push_options
#pragma GCC target("amx-tile,amx-bf16")
#include <immintrin.h>
#include <string.h>

#include "backend/cpu/kernels.h"
#include "backend/cpu/simd_avx512.h"

typedef struct tile_config {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16]; /* bytes per row of each tile */
    uint8_t rows[16];
} tile_config;

enum { TILE_BYTES = 1024, GEMV_BLOCKS = 3 };

static bool eligible(const q3_cpu_matmul *mm) { return mm->wtype == Q3_BF16 && mm->k % 32 == 0 && mm->n >= 16; }

/* GEMM: every tile 16 x 64 bytes. GEMV: C0..C2 and B6 are 16 x 4 bytes. */
static void load_config(bool gemv)
{
    tile_config c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    for (int t = 0; t < 8; t++) {
        c.rows[t] = 16;
        c.colsb[t] = 64;
    }
    if (gemv) c.colsb[0] = c.colsb[1] = c.colsb[2] = c.colsb[6] = 4;
    /* not _tile_loadconfig: GCC 12 declares only 8 bytes of its operand as
       read, and then drops the stores to the rest of the struct */
    __asm__ volatile("ldtilecfg %0" ::"m"(c));
}

/* ---- scratch layout ---------------------------------------------------------------- */
/* GEMM: packed B tiles [row block][k block] (1 KB each), a 16-row BF16 staging
 * block [16][k], 4 C tiles. GEMV: the BF16 row [k], one C tile. */

static int row_blocks(const q3_cpu_matmul *mm) { return (mm->m + 15) / 16; }

static size_t packed_bytes(const q3_cpu_matmul *mm)
{
    return mm->m == 1 ? ((size_t)mm->k * 2 + 63) & ~(size_t)63 : (size_t)row_blocks(mm) * (mm->k / 32) * TILE_BYTES;
}

static size_t amx_matmul_scratch(const q3_cpu_matmul *mm)
{
    if (!eligible(mm)) return q3_cpu_mm_avx512.scratch(mm);
    return packed_bytes(mm) + (size_t)16 * mm->k * 2 + 4 * TILE_BYTES;
}

static int amx_matmul_granule(const q3_cpu_matmul *mm)
{
    if (!eligible(mm)) return q3_cpu_mm_avx512.granule(mm);
    return mm->m == 1 ? 16 * GEMV_BLOCKS : 32;
}

/* Rounds x to BF16 (nearest even) in the B-tile layout, and loads the tile
 * configuration on this thread. */
static void amx_matmul_prepare(const q3_cpu_matmul *mm, void *scratch)
{
    if (!eligible(mm)) {
        q3_cpu_mm_avx512.prepare(mm, scratch);
        return;
    }
    const int k = mm->k, nkb = k / 32;
    if (mm->m == 1) {
        for (int i = 0; i < k; i += 32) {
            __m512bh v = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(mm->x + i + 16), _mm512_loadu_ps(mm->x + i));
            _mm512_storeu_si512((char *)scratch + (size_t)i * 2, (__m512i)v);
        }
        load_config(true);
        return;
    }
    char *packed = scratch;
    uint16_t *stage = (uint16_t *)((char *)scratch + packed_bytes(mm)); /* [16][k] BF16 */
    for (int rb = 0; rb < row_blocks(mm); rb++) {
        for (int r = 0; r < 16; r++) {
            int row = rb * 16 + r;
            uint16_t *dst = stage + (size_t)r * k;
            if (row >= mm->m) {
                memset(dst, 0, (size_t)k * 2);
                continue;
            }
            const float *x = mm->x + (size_t)row * mm->ldx;
            for (int i = 0; i < k; i += 32) {
                __m512bh v = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(x + i + 16), _mm512_loadu_ps(x + i));
                _mm512_storeu_si512(dst + i, (__m512i)v);
            }
        }
        /* B tile (rb, kb): word [kk][r] = BF16 pair kk of row r: a 16 x 16 word transpose */
        for (int kb = 0; kb < nkb; kb++)
            q3_transpose16((const float *)(stage + (size_t)kb * 32), (size_t)k / 2,
                           (float *)(packed + ((size_t)rb * nkb + kb) * TILE_BYTES), 16, 16, 0xffff);
    }
    load_config(false);
}

/* First row of the 16-row block that covers outputs [s, s + 16) clipped to
 * o1: the block ends at o1 when fewer than 16 are left (o1 >= 16 always). */
static int block_start(int s, int o1) { return s + 16 <= o1 ? s : o1 - 16; }

static void gemm_range(const q3_cpu_matmul *mm, void *scratch, int o0, int o1)
{
    const int nkb = mm->k / 32, nrb = row_blocks(mm);
    const size_t ws = mm->w_row_bytes;
    const char *packed = scratch;
    float *ctile = (float *)((char *)scratch + packed_bytes(mm) + (size_t)16 * mm->k * 2); /* [4][16][16] */
    for (int ob = o0; ob < o1; ob += 32) {
        int two_o = o1 - ob > 16;
        int st0 = block_start(ob, o1), st1 = two_o ? block_start(ob + 16, o1) : st0;
        const char *w0 = (const char *)mm->w + (size_t)st0 * ws, *w1 = (const char *)mm->w + (size_t)st1 * ws;
        /* The next block's 32 weight rows come from memory: prefetch them into
           L2 spread over this block's passes, else the first pass over them
           waits on 16-row strided tile loads at full memory latency. */
        const int next_rows = o1 - (ob + 32) < 32 ? o1 - (ob + 32) : 32;
        const char *next = (const char *)mm->w + (size_t)(ob + 32) * ws;
        const int n_passes = (nrb + 1) / 2, next_lines = next_rows > 0 ? next_rows * nkb : 0;
        const int per_iter = (next_lines + n_passes * nkb - 1) / (n_passes * nkb);
        int line = 0;
        for (int rb = 0; rb < nrb; rb += 2) {
            int two_r = nrb - rb > 1;
            const char *b0 = packed + (size_t)rb * nkb * TILE_BYTES, *b1 = b0 + (size_t)nkb * TILE_BYTES;
            _tile_zero(0);
            _tile_zero(1);
            _tile_zero(2);
            _tile_zero(3);
            if (two_o && two_r) {
                for (int kb = 0; kb < nkb; kb++) {
                    for (int i = 0; i < per_iter && line < next_lines; i++, line++)
                        _mm_prefetch(next + (size_t)(line / nkb) * ws + (size_t)(line % nkb) * 64, _MM_HINT_T1);
                    _tile_loadd(4, w0 + (size_t)kb * 64, ws);
                    _tile_loadd(6, b0 + (size_t)kb * TILE_BYTES, 64);
                    _tile_dpbf16ps(0, 4, 6);
                    _tile_loadd(7, b1 + (size_t)kb * TILE_BYTES, 64);
                    _tile_dpbf16ps(1, 4, 7);
                    _tile_loadd(5, w1 + (size_t)kb * 64, ws);
                    _tile_dpbf16ps(2, 5, 6);
                    _tile_dpbf16ps(3, 5, 7);
                }
            } else {
                for (int kb = 0; kb < nkb; kb++) {
                    _tile_loadd(4, w0 + (size_t)kb * 64, ws);
                    _tile_loadd(6, b0 + (size_t)kb * TILE_BYTES, 64);
                    _tile_dpbf16ps(0, 4, 6);
                    if (two_r) {
                        _tile_loadd(7, b1 + (size_t)kb * TILE_BYTES, 64);
                        _tile_dpbf16ps(1, 4, 7);
                    }
                    if (two_o) {
                        _tile_loadd(5, w1 + (size_t)kb * 64, ws);
                        _tile_dpbf16ps(2, 5, 6);
                    }
                }
            }
            _tile_stored(0, ctile, 64);
            _tile_stored(1, ctile + 256, 64);
            _tile_stored(2, ctile + 512, 64);
            _tile_stored(3, ctile + 768, 64);
            /* C tile [o][r] -> y[row][output], rows < m, outputs from the first not yet stored */
            for (int j = 0; j < 1 + two_o; j++) {
                int st = j ? st1 : st0, from = (j ? ob + 16 : ob) - st;
                __mmask16 mask = (__mmask16)(0xffffu << from);
                for (int i = 0; i < 1 + two_r; i++) {
                    int row0 = (rb + i) * 16, rows = mm->m - row0 < 16 ? mm->m - row0 : 16;
                    q3_transpose16(ctile + (size_t)(2 * j + i) * 256, 16, mm->y + (size_t)row0 * mm->ldy + st,
                                   mm->ldy, rows, mask);
                }
            }
        }
    }
}

static void gemv_range(const q3_cpu_matmul *mm, void *scratch, int o0, int o1)
{
    const int nkb = mm->k / 32;
    const size_t ws = mm->w_row_bytes;
    const char *xb = scratch;
    float *ctile = (float *)((char *)scratch + packed_bytes(mm) + (size_t)16 * mm->k * 2);
    for (int ob = o0; ob < o1; ob += 16 * GEMV_BLOCKS) {
        int nb = (o1 - ob + 15) / 16;
        if (nb > GEMV_BLOCKS) nb = GEMV_BLOCKS;
        int st[GEMV_BLOCKS];
        for (int j = 0; j < nb; j++) st[j] = block_start(ob + 16 * j, o1);
        const char *w0 = (const char *)mm->w + (size_t)st[0] * ws;
        const char *w1 = (const char *)mm->w + (size_t)st[nb > 1 ? 1 : 0] * ws;
        const char *w2 = (const char *)mm->w + (size_t)st[nb > 2 ? 2 : 0] * ws;
        /* The next group's rows are one contiguous stretch of the weight:
           prefetch it into L2 linearly while this group runs (the 48 row
           streams of a tile group ramp up too slowly on their own). */
        const char *next = (const char *)mm->w + (size_t)(ob + 16 * GEMV_BLOCKS) * ws;
        size_t next_bytes = o1 - (ob + 16 * GEMV_BLOCKS) > 0 ? (size_t)(o1 - (ob + 16 * GEMV_BLOCKS)) * ws : 0;
        if (next_bytes > (size_t)16 * GEMV_BLOCKS * ws) next_bytes = (size_t)16 * GEMV_BLOCKS * ws;
        const size_t per_kb = (next_bytes / 64 + nkb - 1) / nkb;
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        if (nb == GEMV_BLOCKS) {
            for (int kb = 0; kb < nkb; kb++) {
                for (size_t i = 0, line = (size_t)kb * per_kb; i < per_kb && line * 64 < next_bytes; i++, line++)
                    _mm_prefetch(next + line * 64, _MM_HINT_T1);
                _tile_loadd(6, xb + (size_t)kb * 64, 4);
                _tile_loadd(3, w0 + (size_t)kb * 64, ws);
                _tile_dpbf16ps(0, 3, 6);
                _tile_loadd(4, w1 + (size_t)kb * 64, ws);
                _tile_dpbf16ps(1, 4, 6);
                _tile_loadd(5, w2 + (size_t)kb * 64, ws);
                _tile_dpbf16ps(2, 5, 6);
            }
        } else {
            for (int kb = 0; kb < nkb; kb++) {
                _tile_loadd(6, xb + (size_t)kb * 64, 4);
                _tile_loadd(3, w0 + (size_t)kb * 64, ws);
                _tile_dpbf16ps(0, 3, 6);
                if (nb > 1) {
                    _tile_loadd(4, w1 + (size_t)kb * 64, ws);
                    _tile_dpbf16ps(1, 4, 6);
                }
            }
        }
        for (int j = 0; j < nb; j++) {
            int from = ob + 16 * j - st[j];
            if (from == 0 && j == 0) _tile_stored(0, mm->y + st[0], 4);
            else if (from == 0 && j == 1) _tile_stored(1, mm->y + st[1], 4);
            else if (from == 0 && j == 2) _tile_stored(2, mm->y + st[2], 4);
            else {
                if (j == 0) _tile_stored(0, ctile, 4);
                else if (j == 1) _tile_stored(1, ctile, 4);
                else _tile_stored(2, ctile, 4);
                memcpy(mm->y + st[j] + from, ctile + from, (size_t)(16 - from) * sizeof(float));
            }
        }
    }
}

static void amx_matmul_range(const q3_cpu_matmul *mm, void *scratch, int o0, int o1)
{
    if (!eligible(mm)) q3_cpu_mm_avx512.range(mm, scratch, o0, o1);
    else if (mm->m == 1) gemv_range(mm, scratch, o0, o1);
    else gemm_range(mm, scratch, o0, o1);
}

const q3_cpu_mm_kernels q3_cpu_mm_amx = {
    .scratch = amx_matmul_scratch,
    .granule = amx_matmul_granule,
    .prepare = amx_matmul_prepare,
    .range = amx_matmul_range,
};

#pragma GCC pop_options
