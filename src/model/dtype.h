/* Element types of weights, activations and caches, and conversions. */
#ifndef Q3_MODEL_DTYPE_H
#define Q3_MODEL_DTYPE_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

typedef enum q3_dtype {
    Q3_F32 = 0,
    Q3_F16,
    Q3_BF16,
    Q3_Q8_0,   /* llama.cpp block: f16 scale + 32 x int8 (34 bytes / 32 values) */
    Q3_Q4_0,   /* llama.cpp block: f16 scale + 16 bytes of nibbles (18 bytes / 32) */
    Q3_Q4_K,   /* llama.cpp K-quant super-block of 256 (144 bytes), see below */
    Q3_Q6_K,   /* llama.cpp K-quant super-block of 256 (210 bytes), see below */
    Q3_Q5_K,   /* llama.cpp K-quant super-block of 256 (176 bytes), see below */
    Q3_DTYPE_COUNT
} q3_dtype;

/* The K-quant super-blocks, as llama.cpp lays them out (all little-endian):
 *
 * Q4_K, 144 bytes per 256 values, 8 sub-blocks of 32:
 *   [0..2)    f16 d      scale of the sub-block scales
 *   [2..4)    f16 dmin   scale of the sub-block mins
 *   [4..16)   12 bytes: eight 6-bit scales sc[j] and eight 6-bit mins m[j];
 *             for j < 4: sc[j] = b[j] & 63, m[j] = b[j+4] & 63;
 *             for j >= 4: sc[j] = (b[j+4] & 15) | (b[j-4] >> 6) << 4,
 *                         m[j]  = (b[j+4] >> 4) | (b[j]   >> 6) << 4
 *   [16..144) 128 bytes of 4-bit quants q: value 64k + i (i < 32) is the low
 *             nibble of qs[32k + i], value 64k + 32 + i its high nibble
 *   value e = (d * sc[e/32]) * q - dmin * m[e/32]
 *
 * Q5_K, 176 bytes per 256 values, 8 sub-blocks of 32:
 *   [0..16)   d, dmin and the 12 scale bytes, as in Q4_K
 *   [16..48)  qh: the 5th bits; value 64k + i (i < 32) has bit 2k of qh[i],
 *             value 64k + 32 + i bit 2k + 1 of qh[i]
 *   [48..176) 128 bytes of low 4 bits, laid out as Q4_K's qs
 *   value e = (d * sc[e/32]) * q - dmin * m[e/32], q = nibble | bit << 4
 *
 * Q6_K, 210 bytes per 256 values, 16 sub-blocks of 16:
 *   [0..128)   ql: low 4 bits. In half h (values 128h..128h+127), for i < 32:
 *              ql[64h+i] holds value 128h+i (low nibble) and 128h+64+i (high);
 *              ql[64h+32+i] holds 128h+32+i (low) and 128h+96+i (high)
 *   [128..192) qh: high 2 bits; qh[32h+i] bits 0-1, 2-3, 4-5, 6-7 are those of
 *              values 128h+i, 128h+32+i, 128h+64+i, 128h+96+i
 *   [192..208) 16 int8 scales sc
 *   [208..210) f16 d
 *   value e = (d * sc[e/16]) * (q - 32), q the 6-bit (ql | qh << 4) */
/* Block sizes of the quantized types (layouts above): kernels, quantizers and
 * the traits table take them from here, never from literals. */
#define Q3_QK_0 32        /* values in a Q8_0 / Q4_0 block */
#define Q3_QK_K 256       /* values in a K-quant super-block */
#define Q3_Q8_0_BYTES 34  /* f16 d + 32 int8 */
#define Q3_Q4_0_BYTES 18  /* f16 d + 16 bytes of nibbles */
#define Q3_Q4_K_BYTES 144
#define Q3_Q5_K_BYTES 176
#define Q3_Q6_K_BYTES 210

/* ---- the type-traits table ----------------------------------------------------
 *
 * One row per q3_dtype: everything about a weight (or cache) type that does
 * not depend on a compute unit. What a unit does with a type is the unit's own
 * table, indexed by the same dtype: the cpu unit reaches, from its ISA table
 * (q3_cpu_isa, kernels.h; q3_cpu_isa_mm), the float kernels for the plain
 * types and, for each quantized type, that type's row of the ISA's
 * q3_quant_kernels table (activation form, scratch, packed size, pack, GEMV
 * and GEMM: quant_ref.c, the oracle; quant_avx2.c; quant_avx512.c); the ref
 * unit needs nothing but to_f32.
 *
 * Adding a quantized weight type (say Q5_0) is 6 places, each the type's own
 * row or its own kernels:
 *   1. dtype.h         its enum value, block-size define and layout comment;
 *   2. dtype.c         its traits row (names, block, GGUF id, to_f32,
 *                      from_f32) and its dequantizer (to_f32);
 *   3. quantize.c/.h   its quantizer (from_f32: llama.cpp's reference);
 *   4. quant_ref.c     its row of the scalar oracle (act_offset, matmul), and
 *                      the kernel (a file of its own, as kquant_ref.c, if big);
 *   5. quant_avx2.c    its AVX2 row and kernels (GEMV, GEMM);
 *   6. quant_avx512.c  its AVX-512 row and kernels (scratch, packed size,
 *                      pack, GEMV, GEMM);
 * then, where `q3 convert` should write it in a mix, its place in convert.c's
 * type mixes and GGUF file type (a policy, not a property of the type), and its entry in the
 * tests' and bench_quant's lists of types to cover (test_matmul_id covers
 * every row by itself). The unit then admits its matmuls and MATMUL_IDs,
 * refuses it as a norm weight with the row's reason, embeds it through
 * to_f32, loads and writes it in GGUF files, and converts to it.
 * Before this table (issue 21) a type touched 15 places: the enum,
 * dtype_info, row_to_f32's switch, q3_quantize's switch, gguf.c's two
 * switches, q3_quant_kernels_admit (and q3_is_kquant), the activation offset
 * in the shared SIMD quantizer, the ref table's quantizer and matmul
 * dispatch, the AVX2 and AVX-512 tables' dispatch (four functions there), the
 * cpu unit's two refusal tables, and convert.c's and cmd_convert.c's lists of
 * writable types. (A KV-cache type is more: the cpu unit's row conversions
 * and attention kernels read the cache.) */
typedef struct q3_type_traits {
    const char *name;         /* "q4_k": how files and command lines spell it (any case) */
    const char *label;        /* "Q4_K": how messages spell it */
    size_t block_values;      /* values per block: 1 for plain types (F32, F16, BF16) */
    size_t block_bytes;       /* bytes per block */
    uint32_t ggml_type;       /* GGUF's tensor type id (model/gguf.h Q3_GGML_*) */
    /* n values (a multiple of block_values) of a row to float */
    void (*to_f32)(const void *src, float *dst, size_t n);
    /* n floats into a row of this type: converted (plain types) or quantized
       by llama.cpp's reference quantizer (model/quantize.h); NULL: q3 cannot
       write this type */
    void (*from_f32)(const float *src, void *dst, size_t n);
    /* why a unit without the type's kernels refuses an op on it */
    const char *no_matmul;    /* "no kernel for Q4_K weights" */
    const char *no_norm;      /* "no Q4_K norm weights" */
} q3_type_traits;

/* The row of t (t < Q3_DTYPE_COUNT: callers check a dtype from a file first). */
extern const q3_type_traits q3_type_traits_table[Q3_DTYPE_COUNT];
static inline const q3_type_traits *q3_traits(q3_dtype t) { return &q3_type_traits_table[t]; }

/* A plain type: one value per "block", no scales (F32, F16, BF16). */
static inline int q3_dtype_is_plain(q3_dtype t) { return q3_type_traits_table[t].block_values == 1; }

const char *q3_dtype_name(q3_dtype t);
/* Parses "f32"/"F32"/"bf16"/... ; returns -1 if unknown. */
int q3_dtype_from_name(const char *name);
/* Values per block (1 for plain types) and bytes per block. */
size_t q3_dtype_block_values(q3_dtype t);
size_t q3_dtype_block_bytes(q3_dtype t);
/* Bytes of a row of n values (n must be a multiple of the block size). */
size_t q3_dtype_row_bytes(q3_dtype t, size_t n);

static inline float q3_bf16_to_f32(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* Round to nearest even; NaN stays NaN. */
static inline uint16_t q3_f32_to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

float q3_f16_to_f32(uint16_t h);
uint16_t q3_f32_to_f16(float f);

/* Converts n values of a row starting at src (of type t) to float; n is a
 * multiple of t's block size (32 for Q8_0/Q4_0, 256 for Q4_K/Q5_K/Q6_K):
 * the traits row's to_f32. */
void q3_row_to_f32(q3_dtype t, const void *src, float *dst, size_t n);
/* Stores n floats into a row of type t (n a multiple of its block size): the
 * traits row's from_f32 (F32/F16/BF16 converted, the quantized types by
 * llama.cpp's reference quantizers, e.g. the KV cache's Q8_0 rows by
 * q3_quantize_q8_0); nothing for a type without one. */
void q3_row_from_f32(q3_dtype t, const float *src, void *dst, size_t n);

#endif
