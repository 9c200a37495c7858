/* MATMUL with Q8_0 / Q4_0 weights (llama.cpp blocks, model/dtype.h) on the
 * cpu unit: the activations are quantized to 8 bits per block of 32 values
 * once per op, then every weight block meets every activation block in an
 * integer dot product.
 *
 * ---- numerics (the same in every kernel, the scalar reference included) ----
 * Activation block (32 values x of one row):
 *     amax = max |x|;   amax <= 2^-100 (or 0): a zero block (d = 0, q = 0)
 *     id   = 127 / amax              (float division)
 *     q    = round_half_even(x * id) (float multiply; |q| <= 127)
 *     d    = amax / 127              (kept as float, not rounded to f16 as
 *                                     llama.cpp does: one rounding less)
 * A block holding a non-finite value (NaN, +-inf) is a "poisoned" block:
 * q = 0, c = 0 and d = NaN, so every output of its row is NaN (NaN times
 * any weight scale, zero included): a non-finite activation shows up as NaN
 * logits, never as plausible numbers, and no integer sum overflows. amax
 * is taken so that it is NaN or inf exactly when the block holds one (the
 * SIMD kernels compare the |x| bit patterns as unsigned integers, which
 * orders finite values as floats do and puts NaN above inf).
 * Output (row r, output o), blocks b in order 0, 1, ..., k/32 - 1:
 *     I_b  = sum_i qw[o][b][i] * q[r][b][i]   exactly, in integers
 *            (Q4_0: qw = nibble - 8)
 *     acc  = fmaf((float)I_b, dw[o][b] * d[r][b], acc)   from acc = 0
 *     y[r][o] = acc
 * where dw is the weight block's f16 scale as float and dw * d is one float
 * multiply. |I_b| <= 32 * 128 * 127 < 2^24, so (float)I_b is exact and the
 * only roundings are the product of the scales and the fused multiply-add:
 * every kernel (AVX-512 VNNI GEMV and GEMM, AVX2, reference)
 * returns the same bits for an output whatever the number of rows, the tile
 * it sat in or the thread that made it (kernels.h's determinism contract).
 *
 * Accuracy: the same scheme as llama.cpp's Q8_0/Q4_0 dot products (8 bits per
 * 32 activations, relative rounding error <= 1/254 of the block's largest
 * value), with the activation scale kept in float instead of f16.
 *
 * ---- how the integer dot products are done ----
 * vpdpbusd multiplies unsigned bytes by signed bytes. Weights are made the
 * unsigned side: Q8_0 bytes are offset by 128 (xor 0x80), Q4_0 nibbles are
 * 0..15 already; the offset comes back out through c = -off * sum(q) of the
 * activation block (off = 128 or 8), which seeds the integer accumulator.
 * AVX2 (vpmaddubsw would saturate on 255 * 127 * 2) uses the sign trick for
 * Q8_0 instead (|w| times x with w's sign) and the same c for Q4_0.
 *
 * ---- K-quant weights (Q4_K, Q5_K, Q6_K; blocks in model/dtype.h) ----
 * The activations are quantized exactly as above (blocks of 32, same q and
 * d), except that c holds the two half sums of the block's q instead:
 *     c = (uint16_t)s0 | s1 << 16,  s0 = sum q[0..16), s1 = sum q[16..32)
 * Activation block b of a row meets values 32b..32b+31 of the weight row,
 * i.e. sub-block b % 8 of super-block b / 8 (Q4_K, Q5_K: sub-blocks of 32,
 * scale sc, min m, q in 0..15 or 0..31) or sub-blocks 2(b % 8) and
 * 2(b % 8) + 1 (Q6_K: sub-blocks of 16, int8 scale sc, q in 0..63).
 * Output (row r, output o), activation blocks b in order, from acc = 0:
 *   Q4_K, Q5_K:  fs = d * (float)sc,  fm = dmin * (float)m   (exact)
 *                I  = sum_i q[i] * x[i]            exactly, in integers
 *                acc = fmaf((float)I, fs * dx, acc)
 *                acc = fmaf((float)(s0 + s1), -(fm * dx), acc)
 *   Q6_K, for each of its two sub-blocks h = 0, 1 (values 16h..16h+15):
 *                fs = d * (float)sc                        (exact)
 *                J  = sum_i q[i] * x[i] - 32 * s_h         exactly
 *                acc = fmaf((float)J, fs * dx, acc)
 * with dx the activation block's d. Every integer is below 2^24 in
 * magnitude, so again the only roundings are the scale products and the
 * fused multiply-adds, and every kernel returns the same bits. (llama.cpp
 * quantizes the activations per 256 values for K-quants; per 32 here is one
 * scheme for every weight type and a finer activation scale.) */
#ifndef Q3_BACKEND_CPU_QUANT_KERNELS_H
#define Q3_BACKEND_CPU_QUANT_KERNELS_H

#include <float.h>
#include <math.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "backend/cpu/kernels.h"
#include "model/dtype.h"

#define Q3_QBLOCK 32

/* ---- quantized activations ---------------------------------------------------- */

/* Rows of k values (k % 32 == 0) quantized as above, for one weight dtype
 * (c depends on it), in one buffer. Rows are grouped in tiles of
 * Q3_QACT_TILE (the last tile may hold fewer, th rows); inside a tile, the
 * th rows' data of block b sit together at tile + b * th * 40:
 *     q[th][32]   int8   quantized values of each row
 *     c[th]       int32  -off * sum of the row's q (off: 128 Q8_0, 8 Q4_0)
 *     d[th]       float  amax / 127
 * so a GEMM tile of rows reads one block of all its rows from one place, and
 * a single row (decode) is 40 bytes a block. Use the accessors below. */
#define Q3_QACT_TILE 16
#define Q3_QACT_BLOCK_BYTES 40

typedef struct q3_qact {
    char *base;   /* 64-byte aligned, q3_qact_bytes(rows, k) bytes */
    int rows, k;
} q3_qact;

/* Bytes of rows x k quantized activations (a multiple of 64). */
static inline size_t q3_qact_bytes(int rows, int k)
{
    return ((size_t)rows * (size_t)(k / Q3_QBLOCK) * Q3_QACT_BLOCK_BYTES + 63) & ~(size_t)63;
}

static inline q3_qact q3_qact_carve(void *buf, int rows, int k) { return (q3_qact){(char *)buf, rows, k}; }

/* Rows in the tile of row r. */
static inline int q3_qact_tile_rows(const q3_qact *qa, int r)
{
    int t0 = r - r % Q3_QACT_TILE;
    return qa->rows - t0 < Q3_QACT_TILE ? qa->rows - t0 : Q3_QACT_TILE;
}

/* Start of block b of the tile holding row r (row r % 8 of it). */
static inline char *q3_qact_block(const q3_qact *qa, int r, int b)
{
    int t0 = r - r % Q3_QACT_TILE;
    size_t nb = (size_t)(qa->k / Q3_QBLOCK);
    return qa->base + ((size_t)t0 * nb + (size_t)b * (size_t)q3_qact_tile_rows(qa, r)) * Q3_QACT_BLOCK_BYTES;
}

static inline int8_t *q3_qact_q(const q3_qact *qa, int r, int b)
{
    return (int8_t *)(q3_qact_block(qa, r, b) + (r % Q3_QACT_TILE) * Q3_QBLOCK);
}
static inline int32_t *q3_qact_c(const q3_qact *qa, int r, int b)
{
    return (int32_t *)(q3_qact_block(qa, r, b) + q3_qact_tile_rows(qa, r) * Q3_QBLOCK + (r % Q3_QACT_TILE) * 4);
}
static inline float *q3_qact_d(const q3_qact *qa, int r, int b)
{
    return (float *)(q3_qact_block(qa, r, b) + q3_qact_tile_rows(qa, r) * (Q3_QBLOCK + 4) + (r % Q3_QACT_TILE) * 4);
}

/* Unaligned 4-byte loads (an activation block's c and d, weight bytes). */
static inline int32_t q3_ld_i32(const void *p)
{
    int32_t v;
    memcpy(&v, p, 4);
    return v;
}

static inline float q3_ld_f32(const void *p)
{
    float v;
    memcpy(&v, p, 4);
    return v;
}

/* The K-quants (super-blocks of 256: Q4_K, Q5_K, Q6_K). */
static inline bool q3_is_kquant(q3_dtype t) { return q3_dtype_block_values(t) == Q3_QK_K; }

/* ---- the kernels, one table per instruction set --------------------------------- */

/* One weight type's matmul on one instruction set: a row of that set's
 * q3_quant_kernels table, with the contracts of the table's functions below
 * (for weights of this type). */
typedef struct q3_quant_type_kernels {
    /* The activation form the type meets (numerics above): the offset its
       unsigned quants carry (Q8_0 128, Q4_0 8), whose correction
       c = -off * sum(q) the activation blocks hold; 0: the blocks' two half
       sums instead (the K-quants, whose sub-blocks carry their own mins or
       offsets). Every table's row of a type says the same (tests). */
    int act_offset;
    size_t (*scratch)(int rows, int k);   /* NULL: no scratch */
    size_t (*packed_bytes)(int n, int k); /* NULL: weights read in place */
    void (*pack)(const void *w, size_t w_row_bytes, int n, int k, void *dst, int o0, int o1);
    void (*matmul)(const void *w, size_t w_row_bytes, const q3_qact *qa, float *y, size_t ldy, int o0, int o1,
                   void *scratch);
} q3_quant_type_kernels;

typedef struct q3_quant_kernels {
    const char *name;  /* "ref", "avx2", "avx512-vnni" */
    /* Output panel width: ranges should start at multiples of it (results do
       not depend on it). */
    int granule;
    /* The rows by weight dtype (NULL: no kernel for that type); the functions
       below dispatch wt to them. */
    const q3_quant_type_kernels *const *type;
    /* Quantizes rows [r0, r1) of x (rows ldx floats apart) into qa for weights
       of type wt (any type with a row). Rows of qa are independent: threads may
       quantize disjoint row ranges of one qa. */
    void (*quantize)(q3_dtype wt, const float *x, size_t ldx, const q3_qact *qa, int r0, int r1);
    /* Bytes of per-thread scratch matmul needs for qa->rows rows of k values
       (64-byte aligned; 0 when rows == 1). */
    size_t (*scratch)(q3_dtype wt, int rows, int k);
    /* Optional (NULL: every weight is read in place, as the file holds it).
       packed_bytes(wt, n, k): bytes of the table's own layout of an [n][k]
       weight (0: this type is read in place); pack() writes outputs [o0, o1)
       of it (whole panels of granule outputs: threads may pack disjoint
       ranges) from w (rows w_row_bytes apart). Made once per weight. */
    size_t (*packed_bytes)(q3_dtype wt, int n, int k);
    void (*pack)(q3_dtype wt, const void *w, size_t w_row_bytes, int n, int k, void *dst, int o0, int o1);
    /* y[r][o] for r < qa->rows, o in [o0, o1): w is the [n][k] weight of type
       wt (rows w_row_bytes apart, read in place; or its packed layout when
       packed_bytes says so, w_row_bytes then unused), qa its quantized
       activations (all rows done before the call), y rows ldy floats apart.
       Writes only y[r][o0..o1). rows == 1 is the decode GEMV (weights
       streamed once); rows > 1 the prefill GEMM (each weight block reused
       from cache across all rows). */
    void (*matmul)(q3_dtype wt, const void *w, size_t w_row_bytes, const q3_qact *qa, float *y, size_t ldy, int o0,
                   int o1, void *scratch);
} q3_quant_kernels;

/* The dispatch of a table's functions to its rows (each table's functions
 * are these, over its own rows). */
static inline size_t q3_quant_rows_scratch(const q3_quant_type_kernels *const *rows, q3_dtype wt, int r, int k)
{
    return rows[wt]->scratch ? rows[wt]->scratch(r, k) : 0;
}
static inline size_t q3_quant_rows_packed_bytes(const q3_quant_type_kernels *const *rows, q3_dtype wt, int n, int k)
{
    return rows[wt]->packed_bytes ? rows[wt]->packed_bytes(n, k) : 0;
}

/* Rows [r0, r1) of x (rows ldx floats apart) quantized into qa for weights
 * whose row has act_offset off: the loop, the zero-block rule, q, c and d as defined above,
 * shared by the SIMD tables (the scalar reference keeps its own, as the
 * oracle), each giving its block primitives, inlined:
 *   amax(x)            max |x[i]| over the block's 32 values, NaN or inf
 *                      when one of them is;
 *   quant(x, id, q, s) q[i] = round_half_even(x[i] * id) (nearest even:
 *                      the MXCSR default), s[0], s[1] = the sums of
 *                      q[0..16) and q[16..32). */
static inline __attribute__((always_inline)) void q3_qact_quantize_with(
    const int off, const float *x, size_t ldx, const q3_qact *qa, int r0, int r1, float (*amax)(const float *x),
    void (*quant)(const float *x, float id, int8_t *q, int s[2]))
{
    const int nb = qa->k / Q3_QBLOCK, kq = off == 0;
    for (int r = r0; r < r1; r++) {
        const float *xr = x + (size_t)r * ldx;
        const int th = q3_qact_tile_rows(qa, r), i = r % Q3_QACT_TILE;
        char *blk = q3_qact_block(qa, r, 0);
        for (int b = 0; b < nb; b++, blk += (size_t)th * Q3_QACT_BLOCK_BYTES) {
            const float *xb = xr + b * Q3_QBLOCK;
            const float m = amax(xb);
            int8_t *q = (int8_t *)blk + i * Q3_QBLOCK;
            int s[2] = {0, 0};
            float d = 0.0f;
            if (!(m <= FLT_MAX)) { /* a non-finite value: the poisoned block */
                memset(q, 0, Q3_QBLOCK);
                d = NAN;
            } else if (m > 0x1p-100f) {
                quant(xb, 127.0f / m, q, s);
                d = m / 127.0f;
            } else {
                memset(q, 0, Q3_QBLOCK);
            }
            int32_t c = kq ? (int32_t)((uint32_t)(uint16_t)s[0] | (uint32_t)s[1] << 16) : -off * (s[0] + s[1]);
            memcpy(blk + th * Q3_QBLOCK + i * 4, &c, 4);
            memcpy(blk + th * (Q3_QBLOCK + 4) + i * 4, &d, 4);
        }
    }
}

/* The K-quant rows of each table (kquant_*.c), same contracts. */
extern const q3_quant_type_kernels q3_kquant_ref_q4_k, q3_kquant_ref_q5_k, q3_kquant_ref_q6_k;
extern const q3_quant_type_kernels q3_kquant_avx2_q4_k, q3_kquant_avx2_q5_k, q3_kquant_avx2_q6_k;
extern const q3_quant_type_kernels q3_kquant_avx512_q4_k, q3_kquant_avx512_q5_k, q3_kquant_avx512_q6_k;

extern const q3_quant_kernels q3_quant_ref;     /* portable C: the oracle */
extern const q3_quant_kernels q3_quant_avx2;    /* AVX2 (vpmaddubsw) */
extern const q3_quant_kernels q3_quant_avx512;  /* AVX-512 VNNI (vpdpbusd) GEMV and GEMM */

/* ---- the same behind the unit's MATMUL interface (kernels.h) -----------------------
 * For a q3_cpu_matmul whose wtype has a row in the table (k a multiple of its block):
 *  - scratch(mm) = q3_qact_bytes(m, k) + the table's matmul scratch;
 *  - prepare(mm, scratch) quantizes all m rows of x into the thread's own
 *    scratch (redundantly on every thread: cheap next to the matmul, see
 *    bench_quant), so no barrier is needed between quantizing and the range;
 *  - range(mm, scratch, o0, o1) runs the table's matmul (mm->w packed when
 *    the table packs this type);
 *  - granule(mm) = the table's granule;
 *  - packed_bytes/pack: the table's (NULL where it has none). */
extern const q3_cpu_mm_kernels q3_cpu_mm_quant_avx2, q3_cpu_mm_quant_avx512;

/* The matmul kernels of weight type t on an instruction set: its float
 * kernels for the plain types, its int8-dot adaptor for a type its
 * q3_quant_kernels table has a row for; NULL: none (the unit refuses). */
static inline const q3_cpu_mm_kernels *q3_cpu_isa_mm(const q3_cpu_isa *isa, q3_dtype t)
{
    if ((unsigned)t >= Q3_DTYPE_COUNT) return NULL;
    if (q3_dtype_is_plain(t)) return isa->mm;
    return isa->quant->type[t] ? isa->mm_quant : NULL;
}

#endif
