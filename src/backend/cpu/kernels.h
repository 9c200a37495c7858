/* The kernels of the cpu unit, one table per instruction set (AVX-512 with
 * AMX for BF16 matmuls, AVX-512 with BF16/VNNI, AVX2+FMA), chosen once at
 * start-up by cpu_backend.c.
 *
 * Determinism contract (what the golden tests' mode agreement relies on):
 * within one table, every output value is a fixed function of its own
 * inputs, never of the number of rows in the run, of where a row sits in a
 * tile, or of how work was split across threads. Concretely:
 *  - MATMUL: out[r][o] goes through one fixed sequence of operations in the
 *    GEMM (rows > 1) and the GEMV (rows == 1) alike: vector lanes along k
 *    summed by one lane tree (AVX-512, AVX2), or the same chain of TDPBF16PS
 *    over 32-value k blocks (AMX);
 *  - ATTENTION: a query walks its keys in blocks aligned to absolute key
 *    positions (and, on AVX-512, super-blocks folded in order), with the
 *    scores and the online-softmax update done by the same code in prefill
 *    and decode;
 *  - elementwise ops handle tails with masks, never with a scalar path that
 *    rounds differently. */
#ifndef Q3_BACKEND_CPU_KERNELS_H
#define Q3_BACKEND_CPU_KERNELS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kv/kv_pool.h"
#include "model/dtype.h"

/* ---- matmul ---------------------------------------------------------------- */

/* One MATMUL: y[r][o] = sum_i x[r][i] * w[o][i] for r < m, o < n. */
typedef struct q3_cpu_matmul {
    const void *w;         /* [n][k] of wtype, rows w_row_bytes apart (the mapped weight), or the
                              kernels' packed copy of it (packed_bytes != 0) */
    q3_dtype wtype;        /* a type the kernels take (q3_cpu_isa_mm) */
    size_t w_row_bytes;
    const float *x;        /* [m][k], rows ldx floats apart */
    size_t ldx;
    float *y;              /* [m][n], rows ldy floats apart */
    size_t ldy;
    int m, n, k;
} q3_cpu_matmul;

/* ---- attention ---------------------------------------------------------------- */

/* One ATTENTION op. Key t of a KV head lives in the cache for t < n_cached and
 * in the chunk rows (already rounded to kv_dtype, as the cache would hold
 * them) for t >= n_cached. Query row r sees keys [0, n_keys(r)):
 * n_cached + r + 1 in prefill (chunk != NULL), n_cached in decode. */
typedef struct q3_cpu_attn {
    int n_heads, n_kv_heads, head_dim;
    const float *q;        /* [rows][n_heads * head_dim], rows ldq floats apart */
    size_t ldq;
    float *out;            /* same layout as q, rows ldo floats apart */
    size_t ldo;
    q3_dtype kv_dtype;     /* F32, F16, BF16 or Q8_0 (head_dim % 32 == 0: a head's slice is whole blocks) */
    int n_cached;
    /* the cache: K row t of this layer at kv_data + table[t / Q3_KV_BLOCK_TOKENS]
       * block_bytes + k_off + (t % Q3_KV_BLOCK_TOKENS) * row_bytes (V: v_off) */
    const char *kv_data;
    const int32_t *table;
    size_t block_bytes, k_off, v_off, row_bytes;
    const void *k_chunk, *v_chunk; /* NULL in decode; row j = key n_cached + j */
    size_t chunk_row_bytes;
    float scale;           /* 1 / sqrt(head_dim) */
} q3_cpu_attn;

/* Bytes of one KV head's slice of a K/V row (Q8_0: head_dim / 32 blocks). */
static inline size_t q3_cpu_attn_head_bytes(const q3_cpu_attn *a)
{
    return q3_dtype_row_bytes(a->kv_dtype, (size_t)a->head_dim);
}

/* K (v = 0) or V (v = 1) row t of the cache (t < n_cached). */
static inline const char *q3_cpu_attn_cache_row(const q3_cpu_attn *a, int v, int t)
{
    return a->kv_data + (size_t)a->table[t / Q3_KV_BLOCK_TOKENS] * a->block_bytes + (v ? a->v_off : a->k_off) +
           (size_t)(t % Q3_KV_BLOCK_TOKENS) * a->row_bytes;
}

/* Query rows a prefill attention work item covers near the start of the
 * context (deeper, cpu_backend.c uses bigger blocks). */
#define Q3_CPU_ATTN_ROWS 8

/* ---- the tables ------------------------------------------------------------------ */

/* MATMUL. Every thread calls prepare once (it packs x into its own scratch of
 * scratch(mm) bytes, 64-byte aligned), then range for each output range
 * [o0, o1) it takes. Ranges should start at multiples of granule(mm) (tiles
 * then never straddle two ranges; results do not depend on it). */
typedef struct q3_cpu_mm_kernels {
    /* Optional: the kernels read some weights in a layout of their own, made
       once per weight (see q3_quant_kernels in quant_kernels.h); NULL: every
       weight is read where it is mapped. */
    size_t (*packed_bytes)(q3_dtype wt, int n, int k);
    void (*pack)(q3_dtype wt, const void *w, size_t w_row_bytes, int n, int k, void *dst, int o0, int o1);
    size_t (*scratch)(const q3_cpu_matmul *mm);
    int (*granule)(const q3_cpu_matmul *mm);
    void (*prepare)(const q3_cpu_matmul *mm, void *scratch);
    void (*range)(const q3_cpu_matmul *mm, void *scratch, int o0, int o1);
} q3_cpu_mm_kernels;

/* ATTENTION. A query's keys are reduced in super-blocks of super_block keys
 * aligned to absolute positions, each from an empty softmax state, and the
 * super-block states are folded left to right by one merge function, in
 * prefill as in decode; so decode may hand super-blocks to different threads
 * (each reading whole cache rows, all KV heads at once) and still match
 * prefill bit for bit. super_block 0: no super-blocks (decode splits by KV
 * head only).
 *  run: query rows [row0, row0 + nrows), every query head of KV heads
 *    [kvh0, kvh1). part == NULL: all keys, the output written. part != NULL
 *    (decode): only super-block sb, and the unnormalised state of each query
 *    head qh written to part + qh * part_stride(a) (m, l, then acc from
 *    offset 16).
 *  merge (decode): folds the n_sb states of each query head (parts of
 *    super-block sb at parts + sb * n_heads * part_stride) into out. */
typedef struct q3_cpu_attn_kernels {
    int super_block;
    size_t (*scratch)(const q3_cpu_attn *a, int nrows, int n_kvh);
    void (*run)(const q3_cpu_attn *a, void *scratch, int kvh0, int kvh1, int row0, int nrows, int sb, float *part);
    size_t (*part_stride)(const q3_cpu_attn *a);
    void (*merge)(const q3_cpu_attn *a, const float *parts, int n_sb, float *out);
} q3_cpu_attn_kernels;

/* Elementwise ops over one row (or n values). */
typedef struct q3_cpu_ew_kernels {
    /* out = x * rsqrt(mean(x^2) + eps) * w; out may be x */
    void (*rmsnorm)(const float *x, const float *w, float *out, int n, float eps);
    /* rotate_half RoPE of n_heads heads of hd, in place; cs, sn: [hd/2] for this position */
    void (*rope)(float *x, const float *cs, const float *sn, int n_heads, int hd);
    void (*add)(const float *a, const float *b, float *out, size_t n);
    void (*swiglu)(const float *g, const float *u, float *out, size_t n); /* silu(g) * u */
    /* F32/F16/BF16/Q8_0 rows (Q8_0: n % 32 == 0); from_f32 rounds (quantizes)
       bit for bit like q3_row_from_f32 */
    void (*to_f32)(q3_dtype t, const void *src, float *dst, size_t n);
    void (*from_f32)(q3_dtype t, const float *src, void *dst, size_t n);
} q3_cpu_ew_kernels;

/* An instruction set's kernels. Matmuls by weight dtype (the type-traits
 * table's index, model/dtype.h; q3_cpu_isa_mm in quant_kernels.h looks a
 * type up): the plain types (F32, F16, BF16) on the float kernels mm; each
 * quantized type on its own row of the set's q3_quant_kernels table (scratch,
 * packed size, pack, GEMV and GEMM), reached through the int8-dot adaptor
 * mm_quant. A type the table has no row for is refused. */
struct q3_quant_kernels;
typedef struct q3_cpu_isa {
    const char *name;           /* "avx512-amx", "avx512-bf16", "avx2" */
    bool bf16_activations;      /* BF16-weight matmuls round activations to BF16 */
    const q3_cpu_mm_kernels *mm;               /* plain weight types */
    const struct q3_quant_kernels *quant;      /* quantized weight types: a row per dtype */
    const q3_cpu_mm_kernels *mm_quant;         /* quant's rows behind the MATMUL interface */
    const q3_cpu_attn_kernels *attn;
    const q3_cpu_ew_kernels *ew;
} q3_cpu_isa;

extern const q3_cpu_mm_kernels q3_cpu_mm_avx512, q3_cpu_mm_amx, q3_cpu_mm_avx2;
extern const q3_cpu_attn_kernels q3_cpu_attn_avx512, q3_cpu_attn_avx2;
extern const q3_cpu_ew_kernels q3_cpu_ew_avx512, q3_cpu_ew_avx2;

#endif
