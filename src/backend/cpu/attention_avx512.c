/* ATTENTION on AVX-512: flash-style (online softmax), for all the query
 * heads of one or more KV heads (GQA) and a set of query rows at once, so a
 * block of keys and values is converted to F32 once and used by every query
 * of its head. The same code runs decode (one row, keys from the cache) and
 * prefill (rows of a chunk: past keys from the cache, the chunk's own after).
 *
 * The canonical computation of one query over its keys [0, n):
 *  - keys fall into super-blocks of SUPER_BLOCK keys and blocks of KEY_BLOCK
 *    keys, both aligned to absolute positions;
 *  - a super-block is reduced from an empty state block by block: the keys
 *    are converted to F32 rows; a score is a dot product with lanes along d,
 *    acc = fma(q'[c], k[c], acc) over the 16-value chunks c in order, then
 *    its lanes summed by q3_reduce4's tree (no transposes: a decode query
 *    group of 2 costs about what its arithmetic does); then
 *    m' = max(m, max s), p = 2^(s - m'), l = l * 2^(m - m') + hsum(p),
 *    acc = acc * 2^(m - m') + sum_j p_j v_j (lanes along d), where
 *    q' = q * scale * log2(e) and keys past the query's causal limit get p = 0;
 *  - super-block states are folded left to right by merge_state, and the
 *    output is acc / l.
 * A Q8_0 cache takes integer key dot products against the query quantized
 * to Q8_0 and scales each value block through the probabilities (the
 * section "Q8_0 caches" below says how); the rest is the same.
 * Nothing in it depends on which other rows or heads share a run, or on
 * which thread reduced a super-block: decode hands super-blocks to threads
 * (reading whole cache rows, every KV head of the range at once: a head's
 * 256-byte slices of 2 KB rows stream at half the speed) and merges after;
 * prefill folds as it goes. Same bits either way. */
#include <math.h>
#include <stdbool.h>
#include <string.h>

#include "backend/cpu/kernels.h"
#include "backend/cpu/simd_avx512.h"

#define KEY_BLOCK 16
/* a key block is one KV block: its rows lie a row apart (the prefetch relies on it) */
_Static_assert(KEY_BLOCK == Q3_KV_BLOCK_TOKENS, "a key block is one KV block");
#define SUPER_BLOCK 256
#define LOG2E 1.4426950408889634f

/* How far ahead the K/V reads are prefetched, in (block, head) units: one
 * unit is a head's 16 K and 16 V slices (8 KB F16, 4.3 KB Q8_0 at head_dim
 * 128), prefetched into L2 (hint T1) while the unit this many units earlier
 * in the loop's order is reduced, a few rows at a time as that unit's own
 * rows are used (block_rows.pf). Into L2, not L1: a T0 prefetch holds one of
 * the core's few L1 miss buffers until its line comes from memory, and a
 * unit's prefetches issued in one burst stalled the loads of the unit being
 * reduced. Measured with `bench_kernels --only attn-stream --depth 4096`
 * (2-core AMD EPYC Zen 4 VM, 28 layers, best of 10 per token): a burst 16
 * KB ahead (2 F16 units, 4 Q8_0) read F16 17.5-19.8 ms, Q8_0 14.5-15.1;
 * spread over the reduction, 4 units ahead, F16 15.8-17.9, Q8_0 11.9-12.9;
 * 2-3 units and 5-6 were no better. bench/README.md has the rest. */
#define PREFETCH_UNITS 4

/* ---- workspace ------------------------------------------------------------------------ */

/* The queries of one KV head in a run. */
typedef struct head_ws {
    int kvh;
    float *qr;    /* [nqp][hdp] scaled queries, zero padded */
    float *acc;   /* [nqp][hdp] the current super-block's unnormalised output */
    float *tacc;  /* [nqp][hdp] the folded total (runs without parts) */
    float *p;     /* [nqp][KEY_BLOCK] scores, then probabilities */
    float *m, *l, *corr; /* [nqp] current super-block: running max, running sum, this block's rescale */
    float *tm, *tl;      /* [nqp] folded total */
    int *n_keys;  /* [nqp] keys each query sees (0 for padding queries) */
    /* Q8_0 caches (see "Q8_0 caches" below); hdq = head_dim rounded up to 64 */
    int8_t *qi;   /* [nqp][hdq] the query quantized, zero padded */
    int32_t *qb;  /* [nqp][hdq / 64][16] -128 * the sum of each lane's 4 qi */
    float *qd;    /* [nqp][hdq / 64][16] the scale of each lane's block * scale * log2(e) */
    float *pd;    /* [nqp][hdq / 32][KEY_BLOCK] probabilities times each key's value block scale */
} head_ws;

/* The (block, head) unit PREFETCH_UNITS ahead in the reduction's order: its
 * K (side 0) and V (side 1) slices of len bytes, n rows stride apart from
 * rows[side]; n = 0 when there is none, or when its rows run from the cache
 * into the chunk (then prefetched at once, prefetch_slices). */
typedef struct ahead_unit {
    const char *rows[2];
    size_t stride, len;
    int n;
} ahead_unit;

typedef struct attn_ws {
    int nq, nqp;  /* queries per head, and rounded up to whole groups */
    float *kb;    /* [KEY_BLOCK][hdp] the block's keys in F32 (one head at a time) */
    float *vb;    /* [KEY_BLOCK][hdp] the block's values in F32 */
    float *dv;    /* Q8_0: [hdp / 32][KEY_BLOCK] the block's value scales */
    head_ws *h;   /* [n_kvh] */
    ahead_unit ahead; /* the unit prefetched while this one is reduced */
} attn_ws;

static int padded_hd(int hd) { return (hd + 15) & ~15; }

/* Queries of a head padded to whole groups: 2, 4, 8 or a multiple of 16. */
static int padded_queries(int nq) { return nq <= 2 ? 2 : nq <= 4 ? 4 : nq <= 8 ? 8 : (nq + 15) & ~15; }

static int padded_hdq(int hdp) { return (hdp + 63) & ~63; }

static size_t head_floats(int nqp, int hdp)
{
    size_t hdq = (size_t)padded_hdq(hdp);
    return (size_t)nqp * hdp * 4 + (size_t)nqp * (KEY_BLOCK + 8) + (size_t)nqp * hdq * 5 / 4 + 5 * 16;
}

static size_t avx512_attn_scratch(const q3_cpu_attn *a, int nrows, int n_kvh)
{
    int nqp = padded_queries(nrows * (a->n_heads / a->n_kv_heads)), hdp = padded_hd(a->head_dim);
    size_t floats = (size_t)KEY_BLOCK * hdp * 2 + (size_t)(hdp + 31) / 32 * KEY_BLOCK + (size_t)n_kvh * head_floats(nqp, hdp);
    return floats * sizeof(float) + (size_t)n_kvh * sizeof(head_ws) + 256;
}

static attn_ws carve(void *scratch, int n_kvh, int nq, int hdp)
{
    attn_ws w = {.nq = nq, .nqp = padded_queries(nq)};
    w.h = scratch;
    float *f = (float *)(((uintptr_t)(w.h + n_kvh) + 63) & ~(uintptr_t)63);
    w.kb = f, f += (size_t)KEY_BLOCK * hdp;
    w.vb = f, f += (size_t)KEY_BLOCK * hdp;
    w.dv = f, f += (size_t)(hdp + 31) / 32 * KEY_BLOCK;
    size_t n = (size_t)w.nqp;
    for (int i = 0; i < n_kvh; i++) {
        head_ws *h = &w.h[i];
        h->qr = f, f += n * hdp;
        h->acc = f, f += n * hdp;
        h->tacc = f, f += n * hdp;
        h->p = f, f += n * KEY_BLOCK;
        h->m = f, f += n;
        h->l = f, f += n;
        h->corr = f, f += n;
        h->tm = f, f += n;
        h->tl = f, f += n;
        h->n_keys = (int *)f, f += n;
        f = (float *)(((uintptr_t)f + 63) & ~(uintptr_t)63);
        size_t hdq = (size_t)padded_hdq(hdp);
        h->qi = (int8_t *)f, f += n * hdq / 4;
        h->qb = (int32_t *)f, f += n * hdq / 4;
        h->qd = f, f += n * hdq / 4;
        h->pd = f, f += n * hdq / 2;
    }
    return w;
}

/* ---- keys and values ------------------------------------------------------------------- */

/* Address of key (v = 0) or value (v = 1) row t (all KV heads). */
static const char *kv_row(const q3_cpu_attn *a, int v, int t)
{
    return t < a->n_cached ? q3_cpu_attn_cache_row(a, v, t)
                           : (const char *)(v ? a->v_chunk : a->k_chunk) + (size_t)(t - a->n_cached) * a->chunk_row_bytes;
}

/* 16 values of a K/V row from value d on (masked past hd), as F32. */
Q3_INLINE __m512 load16(q3_dtype t, const char *row, int d, __mmask16 m)
{
    if (t == Q3_F16) return q3_load_f16x16((const uint16_t *)row + d, m);
    if (t == Q3_BF16) return q3_load_bf16x16((const uint16_t *)row + d, m);
    return _mm512_maskz_loadu_ps(m, (const float *)row + d);
}

/* The block's keys or values of one head as F32 rows dst[j][d] (row j at
 * rows[j] + off), zero padded to hdp; rows j >= nb are zero. Not for Q8_0
 * (whose rows are read in place, see "Q8_0 caches"). */
static void load_rows(const q3_cpu_attn *a, const char *const *rows, size_t off, int nb, float *dst, int hdp)
{
    const int hd = a->head_dim;
    for (int j = 0; j < nb; j++)
        for (int d = 0; d < hdp; d += 16)
            _mm512_store_ps(dst + (size_t)j * hdp + d, load16(a->kv_dtype, rows[j] + off, d, q3_mask16(hd - d)));
    if (nb < KEY_BLOCK) memset(dst + (size_t)nb * hdp, 0, (size_t)(KEY_BLOCK - nb) * hdp * sizeof(float));
}

/* Prefetches into L2 every cache line of [p, p + len). */
Q3_INLINE void prefetch_lines(const char *p, size_t len)
{
    for (uintptr_t l = (uintptr_t)p & ~(uintptr_t)63; l < (uintptr_t)p + len; l += 64)
        _mm_prefetch((const char *)l, _MM_HINT_T1);
}

/* Prefetches into L2 the K and V slices (len bytes from off) of rows [t0, t1). */
static void prefetch_slices(const q3_cpu_attn *a, int t0, int t1, size_t off, size_t len)
{
    for (int t = t0; t < t1; t++)
        for (int v = 0; v < 2; v++) prefetch_lines(kv_row(a, v, t) + off, len);
}

/* ---- the block update -------------------------------------------------------------------- */

/* 16 values of a row from value c on (masked past hd), as F32: as load_rows
 * makes them. T, the cache's type, is a constant where it is inlined. */
Q3_INLINE __m512 row16(const q3_dtype T, const int whole, const q3_cpu_attn *a, const char *row, int c)
{
    return load16(T, row, c, whole ? (__mmask16)0xffff : q3_mask16(a->head_dim - c));
}

/* Where a block's keys (or values) come from: staged, F32 rows of hdp values
 * in scratch (load_rows: a prefill chunk's many queries per KV head), or in
 * decode (one GQA group of query heads per KV head: 2 for Qwen3-0.6B, 8 for
 * the larger Qwen3s), where converting and storing the rows costs more than
 * the dot products that use them, "direct": each 16-value chunk read in
 * place, in the cache's type, and converted in registers where it is used
 * (row16: the same F32 values load_rows stores), for the whole group at once.
 * Either way the same FMAs in the same order: the same bits. */
typedef struct block_rows {
    const float *staged;                       /* staged: [KEY_BLOCK][hdp], rows >= nb zero */
    const q3_cpu_attn *a;                      /* direct: row j at rows[j] + off, j < nb */
    const char *const *rows;
    size_t off;
    int nb;
    /* the unit ahead, whose slices on this side (0 keys, 1 values) are
       prefetched a few rows at a time as this block's rows are used, so that
       the requests spread over the reduction (a burst of them all at once
       stalled it) */
    const ahead_unit *ahead;
    int side;
} block_rows;

/* Prefetches into L2 rows [r0, r1) of the ahead unit's slices on src's side. */
Q3_INLINE void prefetch_ahead(const block_rows *src, int r0, int r1)
{
    const ahead_unit *u = src->ahead;
    if (r1 > u->n) r1 = u->n;
    for (int r = r0; r < r1; r++) prefetch_lines(u->rows[src->side] + (size_t)r * u->stride, u->len);
}

/* full: the block holds KEY_BLOCK keys (no row past nb to test for) and
 * head_dim is a multiple of 16 (no chunk to mask). */
Q3_INLINE __m512 chunk16(const int direct, const q3_dtype T, const int full, const block_rows *src, int j, int c, int hdp)
{
    if (!direct) return _mm512_load_ps(src->staged + (size_t)j * hdp + c);
    return full || j < src->nb ? row16(T, full, src->a, src->rows[j] + src->off, c) : _mm512_setzero_ps();
}

/* The QT x KT dot products' lanes summed by q3_reduce4's tree (which sums
 * each of its 4 inputs alike: the grouping changes no bits) into the scores
 * p[q][j] (rows KEY_BLOCK apart): 4 keys a reduction, or two queries' two keys. */
Q3_INLINE void store_scores(const int QT, const int KT, __m512 acc[8][4], float *p)
{
    if (KT == 4) {
#pragma GCC unroll 8
        for (int i = 0; i < QT; i++)
            _mm_store_ps(p + (size_t)i * KEY_BLOCK, q3_reduce4(acc[i][0], acc[i][1], acc[i][2], acc[i][3]));
        return;
    }
#pragma GCC unroll 4
    for (int i = 0; i < QT; i += 2) {
        __m128 r = q3_reduce4(acc[i][0], acc[i][1], acc[i + 1][0], acc[i + 1][1]);
        _mm_storel_pi((__m64 *)(p + (size_t)i * KEY_BLOCK), r);
        _mm_storeh_pi((__m64 *)(p + (size_t)(i + 1) * KEY_BLOCK), r);
    }
}

/* Scores of the QT queries from q0 against the block's 16 keys, KT keys at a
 * time (QT x KT <= 16 accumulators: 2 or 4 queries x 4 keys, or 8 x 2, so
 * that a direct key chunk converted in registers serves a whole GQA group of
 * up to 8 query heads): for each (query, key), acc = fma(q'[c], k[c], acc)
 * over the chunks c in order, then its lanes summed (store_scores);
 * p[q][j] = the score (0 for keys j >= nb: masked by the caller). */
Q3_INLINE void scores(const int direct, const q3_dtype T, const int full, const int QT, const int KT, head_ws *h,
                      const block_rows *keys, int q0, int hdp)
{
    for (int j0 = 0; j0 < KEY_BLOCK; j0 += KT) {
        __m512 acc[8][4];
#pragma GCC unroll 8
        for (int i = 0; i < QT; i++)
#pragma GCC unroll 4
            for (int j = 0; j < KT; j++) acc[i][j] = _mm512_setzero_ps();
        const float *q = h->qr + (size_t)q0 * hdp;
        if (q0 == 0) prefetch_ahead(keys, j0, j0 + KT);
        if (full || j0 < keys->nb) {
            for (int c = 0; c < hdp; c += 16) {
                __m512 kv[4];
#pragma GCC unroll 4
                for (int j = 0; j < KT; j++) kv[j] = chunk16(direct, T, full, keys, j0 + j, c, hdp);
#pragma GCC unroll 8
                for (int i = 0; i < QT; i++) {
                    __m512 qv = _mm512_load_ps(q + (size_t)i * hdp + c);
#pragma GCC unroll 4
                    for (int j = 0; j < KT; j++) acc[i][j] = _mm512_fmadd_ps(qv, kv[j], acc[i][j]);
                }
            }
        }
        store_scores(QT, KT, acc, h->p + (size_t)q0 * KEY_BLOCK + j0);
    }
}

/* acc[q] = acc[q] * corr[q] + sum_{j < nb} p[q][j] * v[j] for the QG queries from q0. */
Q3_INLINE void pv_update(const int direct, const q3_dtype T, const int full, const int QG, head_ws *h,
                         const block_rows *vals, int q0, int hdp)
{
    for (int c = 0; c < hdp; c += 16) {
        __m512 acc[16];
        float *a = h->acc + (size_t)q0 * hdp + c;
        if (q0 == 0) prefetch_ahead(vals, c * KEY_BLOCK / hdp, (c + 16) * KEY_BLOCK / hdp);
#pragma GCC unroll 16
        for (int i = 0; i < QG; i++)
            acc[i] = _mm512_mul_ps(_mm512_load_ps(a + (size_t)i * hdp), _mm512_set1_ps(h->corr[q0 + i]));
        const float *p = h->p + (size_t)q0 * KEY_BLOCK;
        const int nb = full ? KEY_BLOCK : vals->nb;
#pragma GCC unroll 16
        for (int j = 0; j < nb; j++, p++) {
            __m512 vv = chunk16(direct, T, full, vals, j, c, hdp);
#pragma GCC unroll 16
            for (int i = 0; i < QG; i++) acc[i] = _mm512_fmadd_ps(_mm512_set1_ps(p[i * KEY_BLOCK]), vv, acc[i]);
        }
#pragma GCC unroll 16
        for (int i = 0; i < QG; i++) _mm512_store_ps(a + (size_t)i * hdp, acc[i]);
    }
}

/* ---- Q8_0 caches ---------------------------------------------------------------------------- */

/* A Q8_0 cache's keys are dotted with the query quantized as the cache's
 * rows are (Q8_0 blocks of 32: q3_quantize_q8_0's ints qi and f16 scales dq),
 * in integers, as llama.cpp's flash attention does for a Q8_0 K cache: a
 * key's score is scale * log2(e) * sum_b dq_b dk_b sum_{c in b} qi[c] k[c].
 * Blocks go two to a vector (one 64-byte vpdpbusd a pair, unsigned k + 128
 * against signed qi, the 128 * sum qi taken off by starting each lane from
 * qb), then acc = fma(float(sums), dk_pair * qd_pair, acc) over the pairs in
 * order, its lanes summed by q3_reduce4's tree. A value block's scale goes
 * into the probabilities instead of into every value: acc += (p_j * dv_jb) *
 * float(v_j[c]). With 2 query heads a KV head (Qwen3-0.6B) the F32 route's
 * scale multiplications took the FMA pipes as much as its dot products did;
 * a query's 64 cached key values now cost one vpdpbusd, a conversion, a
 * multiplication and an FMA instead of four FMAs and a share of four
 * multiplications. Decode and prefill read Q8_0 rows in place (never
 * staged), so both take the same steps: the same bits. */

/* Key block pair p of a head's slice at b: its 64 ints (the second
 * block's zero when the slice ends after the first), plus 128 (as unsigned). */
Q3_INLINE __m512i q8_pair_u8(const uint8_t *b, int two)
{
    __m256i lo = _mm256_loadu_si256((const __m256i *)(b + 2));
    __m256i hi = two ? _mm256_loadu_si256((const __m256i *)(b + Q3_Q8_0_BYTES + 2)) : _mm256_setzero_si256();
    return _mm512_xor_si512(_mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1), _mm512_set1_epi8((char)0x80));
}

Q3_INLINE uint16_t q8_scale_bits(const uint8_t *b) { return (uint16_t)(b[0] | b[1] << 8); }

/* The pair's two scales, each over its block's 8 lanes (0 for a missing second block). */
Q3_INLINE __m512 q8_pair_scales(const uint8_t *b, int two)
{
    __m128i lo = _mm_set1_epi16((short)q8_scale_bits(b));
    __m128i hi = two ? _mm_set1_epi16((short)q8_scale_bits(b + Q3_Q8_0_BYTES)) : _mm_setzero_si128();
    return _mm512_cvtph_ps(_mm256_inserti128_si256(_mm256_castsi128_si256(lo), hi, 1));
}

/* Query i of a head (nq real ones; the rest zero): qi, qb, qd from src. */
static void q8_query(head_ws *h, int i, const float *src, int hd, int hdq, float qscale)
{
    int8_t *qi = h->qi + (size_t)i * hdq;
    int32_t *qb = h->qb + (size_t)i * hdq / 4;
    float *qd = h->qd + (size_t)i * hdq / 4;
    memset(qi, 0, (size_t)hdq);
    memset(qd, 0, (size_t)hdq / 4 * sizeof(float));
    for (int d = 0; src && d < hd; d += 32) {
        uint8_t blk[Q3_Q8_0_BYTES];
        q3_store_q8_0x32(src + d, blk);
        memcpy(qi + d, blk + 2, 32);
        float s = _cvtsh_ss(q8_scale_bits(blk)) * qscale;
        for (int l = 0; l < 8; l++) qd[d / 4 + l] = s;
    }
    for (int p = 0; p < hdq / 64; p++) {
        __m512i sum = _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_set1_epi8((char)0x80),
                                          _mm512_load_si512(qi + p * 64));
        _mm512_store_si512(qb + p * 16, _mm512_sub_epi32(_mm512_setzero_si512(), sum));
    }
}

/* scores() for a Q8_0 cache: keys read in place, QT queries x KT keys at a time. */
Q3_INLINE void scores_q8(const int full, const int QT, const int KT, head_ws *h, const block_rows *keys, int q0, int hd)
{
    const int hdq = padded_hdq(hd);
    for (int j0 = 0; j0 < KEY_BLOCK; j0 += KT) {
        __m512 acc[8][4];
#pragma GCC unroll 8
        for (int i = 0; i < QT; i++)
#pragma GCC unroll 4
            for (int j = 0; j < KT; j++) acc[i][j] = _mm512_setzero_ps();
        if (q0 == 0) prefetch_ahead(keys, j0, j0 + KT);
        if (full || j0 < keys->nb) {
            for (int pr = 0; pr < hdq / 64; pr++) {
                const int two = pr * 64 + 32 < hd;
                __m512i ku[4];
                __m512 ks[4];
#pragma GCC unroll 4
                for (int j = 0; j < KT; j++) {
                    if (full || j0 + j < keys->nb) {
                        const uint8_t *b = (const uint8_t *)keys->rows[j0 + j] + keys->off + (size_t)pr * 2 * Q3_Q8_0_BYTES;
                        ku[j] = q8_pair_u8(b, two);
                        ks[j] = q8_pair_scales(b, two);
                    } else {
                        ku[j] = _mm512_setzero_si512();
                        ks[j] = _mm512_setzero_ps();
                    }
                }
#pragma GCC unroll 8
                for (int i = 0; i < QT; i++) {
                    const size_t q = (size_t)(q0 + i);
                    __m512i qv = _mm512_load_si512(h->qi + q * hdq + pr * 64);
                    __m512i qb = _mm512_load_si512(h->qb + q * hdq / 4 + pr * 16);
                    __m512 qd = _mm512_load_ps(h->qd + q * hdq / 4 + pr * 16);
#pragma GCC unroll 4
                    for (int j = 0; j < KT; j++)
                        acc[i][j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_dpbusd_epi32(qb, ku[j], qv)),
                                                    _mm512_mul_ps(ks[j], qd), acc[i][j]);
                }
            }
        }
        store_scores(QT, KT, acc, h->p + (size_t)q0 * KEY_BLOCK + j0);
    }
}

/* The block's value scales, dv[b][j] for value j's block b (0 for j >= nb):
 * read before the keys' dot products so that the value rows' first lines are
 * on their way while those run. */
static void q8_value_scales(const block_rows *vals, int hd, float *dv)
{
    for (int b = 0; b < hd / 32; b++) {
        uint16_t bits[KEY_BLOCK] = {0};
        for (int j = 0; j < vals->nb; j++)
            bits[j] = q8_scale_bits((const uint8_t *)vals->rows[j] + vals->off + (size_t)b * Q3_Q8_0_BYTES);
        _mm512_store_ps(dv + b * KEY_BLOCK, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)bits)));
    }
}

/* pd[q][b][j] = p[q][j] * dv[b][j], for the nqp queries. */
static void q8_value_probs(head_ws *h, const float *dv, int nqp, int hd)
{
    const int hdq = padded_hdq(hd);
    for (int b = 0; b < hd / 32; b++)
        for (int i = 0; i < nqp; i++)
            _mm512_store_ps(h->pd + ((size_t)i * hdq / 32 + b) * KEY_BLOCK,
                            _mm512_mul_ps(_mm512_load_ps(h->p + (size_t)i * KEY_BLOCK), _mm512_load_ps(dv + b * KEY_BLOCK)));
}

/* pv_update() for a Q8_0 cache: acc[q] = acc[q] * corr[q] + sum_{j < nb}
 * pd[q][b][j] * v[j] (ints as F32), CH 16-value chunks at a time (each
 * accumulator still takes its keys in order: CH changes no bits) so that a
 * small group's FMA chains are not bound by the FMA's latency. */
Q3_INLINE void pv_update_q8(const int full, const int QG, const int CH, head_ws *h, const block_rows *vals, int q0,
                            int hd)
{
    const int hdq = padded_hdq(hd), hdp = padded_hd(hd);
    for (int c = 0; c < hd; c += 16 * CH) {
        __m512 acc[16];
        float *a = h->acc + (size_t)q0 * hdp + c;
        if (q0 == 0)
            prefetch_ahead(vals, c * KEY_BLOCK / hd, c + 16 * CH >= hd ? KEY_BLOCK : (c + 16 * CH) * KEY_BLOCK / hd);
#pragma GCC unroll 4
        for (int k = 0; k < CH; k++)
#pragma GCC unroll 16
            for (int i = 0; i < QG; i++)
                acc[k * QG + i] = _mm512_mul_ps(_mm512_load_ps(a + (size_t)i * hdp + 16 * k), _mm512_set1_ps(h->corr[q0 + i]));
        const float *pd = h->pd + (size_t)q0 * hdq / 32 * KEY_BLOCK;
        const int nb = full ? KEY_BLOCK : vals->nb;
#pragma GCC unroll 16
        for (int j = 0; j < nb; j++) {
            const uint8_t *row = (const uint8_t *)vals->rows[j] + vals->off;
#pragma GCC unroll 4
            for (int k = 0; k < CH; k++) {
                const int d = c + 16 * k;
                __m128i q = _mm_loadu_si128((const __m128i *)(row + (size_t)(d / 32) * Q3_Q8_0_BYTES + 2 + d % 32));
                __m512 vv = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q));
#pragma GCC unroll 16
                for (int i = 0; i < QG; i++)
                    acc[k * QG + i] = _mm512_fmadd_ps(_mm512_set1_ps(pd[((size_t)i * hdq / 32 + d / 32) * KEY_BLOCK + j]),
                                                      vv, acc[k * QG + i]);
            }
        }
#pragma GCC unroll 4
        for (int k = 0; k < CH; k++)
#pragma GCC unroll 16
            for (int i = 0; i < QG; i++) _mm512_store_ps(a + (size_t)i * hdp + 16 * k, acc[k * QG + i]);
    }
}

/* pv_update_q8 for a group of QG queries: 4 chunks at a time for 2 queries,
 * 2 for 4 (where head_dim allows), 1 for more. (The chunk counts are spelled
 * as conditionals on QG so that no instance has QG * CH above its 16
 * accumulators, even in a branch the constant QG rules out.) */
Q3_INLINE void pv_group_q8(const int full, const int QG, head_ws *h, const block_rows *vals, int q0, int hd)
{
    if (QG == 2 && hd % 64 == 0) pv_update_q8(full, QG, QG == 2 ? 4 : 1, h, vals, q0, hd);
    else if (QG == 4) pv_update_q8(full, QG, QG == 4 ? 2 : 1, h, vals, q0, hd); /* hd % 32 == 0 */
    else pv_update_q8(full, QG, 1, h, vals, q0, hd);
}

/* Calls CALL(QG, q0) over the nqp (padded) queries in groups of QG. */
#define FOR_QUERY_GROUPS(nqp, CALL)                                                                               \
    for (int q0 = 0; q0 < (nqp); q0 += 16) {                                                                       \
        if ((nqp) == 2) CALL(2, q0);                                                                               \
        else if ((nqp) == 4) CALL(4, q0);                                                                          \
        else if ((nqp) == 8) CALL(8, q0);                                                                          \
        else CALL(16, q0);                                                                                         \
    }

/* Calls CALL(QT, KT, q0) over the nqp (padded) queries in groups of QT:
 * staged keys 4 queries x 4 keys at a time, direct ones 8 x 2 (each key
 * chunk converted once for 8 queries). */
#define FOR_SCORE_GROUPS(direct, nqp, CALL)                                                                       \
    for (int q0 = 0; q0 < (nqp); q0 += (direct) && (nqp) >= 8 ? 8 : 4) {                                           \
        if ((nqp) == 2) CALL(2, 4, q0);                                                                            \
        else if ((nqp) == 4 || !(direct)) CALL(4, 4, q0);                                                          \
        else CALL(8, 2, q0);                                                                                       \
    }

/* Whether a run reads its keys and values direct (converted in registers
 * where they are used) rather than staged as F32 rows: a decode run (a query
 * head group of up to 16, e.g. 2 for Qwen3-0.6B, 8 for the larger Qwen3s),
 * or a prefill run of at most 4 queries per KV head. (Q8_0 rows are always
 * read in place.) */
static bool reads_direct(const q3_cpu_attn *a, int nqp) { return nqp <= 4 || (!a->k_chunk && nqp <= 16); }

/* The online softmax step of a block: the scores in p become probabilities
 * (0 past each query's causal limit), m, l and corr move on. */
Q3_INLINE void softmax_block(head_ws *h, int nqp, int t0, int nb)
{
    for (int i = 0; i < nqp; i++) {
        float *p = h->p + (size_t)i * KEY_BLOCK;
        int valid = h->n_keys[i] - t0;
        if (valid <= 0) { /* past this query's causal limit: an exact no-op update */
            _mm512_store_ps(p, _mm512_setzero_ps());
            h->corr[i] = 1.0f;
            continue;
        }
        __mmask16 vm = q3_mask16(valid < nb ? valid : nb);
        __m512 s = _mm512_load_ps(p);
        float bmax = _mm512_reduce_max_ps(_mm512_mask_blend_ps(vm, _mm512_set1_ps(-INFINITY), s));
        float m_old = h->m[i], m_new = m_old > bmax ? m_old : bmax;
        float corr = m_old == -INFINITY ? 0.0f : _mm512_cvtss_f32(q3_exp2_ps(_mm512_set1_ps(m_old - m_new)));
        __m512 pv = _mm512_maskz_mov_ps(vm, q3_exp2_ps(_mm512_sub_ps(s, _mm512_set1_ps(m_new))));
        _mm512_store_ps(p, pv);
        h->l[i] = h->l[i] * corr + q3_hsum(pv);
        h->m[i] = m_new;
        h->corr[i] = corr;
    }
}

/* One block of nb keys from t0 for one head's queries; T the cache's type
 * (not Q8_0) and full (nb == KEY_BLOCK and head_dim % 16 == 0) constants
 * where it is inlined, so the direct reads' loops hold no test of either. */
Q3_INLINE void block_update_t(const q3_dtype T, const int full, const q3_cpu_attn *a, attn_ws *w, head_ws *h,
                              const char *const *krows, const char *const *vrows, int t0, int nb)
{
    const int hd = a->head_dim, hdp = padded_hd(hd), nqp = w->nqp;
    const size_t off = (size_t)h->kvh * q3_cpu_attn_head_bytes(a);
    const bool direct = reads_direct(a, nqp);
    block_rows keys = {.staged = w->kb, .a = a, .rows = krows, .off = off, .nb = nb, .ahead = &w->ahead, .side = 0};
    block_rows vals = {.staged = w->vb, .a = a, .rows = vrows, .off = off, .nb = nb, .ahead = &w->ahead, .side = 1};
    if (direct) {
#define SCORES(QT, KT, q0) scores(1, T, full, QT, KT, h, &keys, q0, hdp)
        FOR_SCORE_GROUPS(1, nqp, SCORES)
#undef SCORES
    } else {
        load_rows(a, krows, off, nb, w->kb, hdp);
#define SCORES(QT, KT, q0) scores(0, T, full, QT, KT, h, &keys, q0, hdp)
        FOR_SCORE_GROUPS(0, nqp, SCORES)
#undef SCORES
    }
    softmax_block(h, nqp, t0, nb);
    if (direct) {
#define PV(QG, q0) pv_update(1, T, full, QG, h, &vals, q0, hdp)
        FOR_QUERY_GROUPS(nqp, PV)
#undef PV
        return;
    }
    load_rows(a, vrows, off, nb, w->vb, hdp);
#define PV(QG, q0) pv_update(0, T, full, QG, h, &vals, q0, hdp)
    FOR_QUERY_GROUPS(nqp, PV)
#undef PV
}

/* block_update_t for a Q8_0 cache: its rows read in place by any run. */
Q3_INLINE void block_update_q8(const int full, const q3_cpu_attn *a, attn_ws *w, head_ws *h,
                               const char *const *krows, const char *const *vrows, int t0, int nb)
{
    const int hd = a->head_dim, nqp = w->nqp;
    const size_t off = (size_t)h->kvh * q3_cpu_attn_head_bytes(a);
    block_rows keys = {.a = a, .rows = krows, .off = off, .nb = nb, .ahead = &w->ahead, .side = 0};
    block_rows vals = {.a = a, .rows = vrows, .off = off, .nb = nb, .ahead = &w->ahead, .side = 1};
    q8_value_scales(&vals, hd, w->dv);
#define SCORES(QT, KT, q0) scores_q8(full, QT, KT, h, &keys, q0, hd)
    FOR_SCORE_GROUPS(0, nqp, SCORES) /* 4 x 4 (2 x 4): 8 x 2 measured 6-10% slower at 8 queries a KV head */
#undef SCORES
    softmax_block(h, nqp, t0, nb);
    q8_value_probs(h, w->dv, nqp, hd);
#define PV(QG, q0) pv_group_q8(full, QG, h, &vals, q0, hd)
    FOR_QUERY_GROUPS(nqp, PV)
#undef PV
}

#define BLOCK_UPDATE_T(T, full)                                                                                    \
    static void block_update_##T##_##full(const q3_cpu_attn *a, attn_ws *w, head_ws *h, const char *const *krows, \
                                          const char *const *vrows, int t0, int nb)                               \
    {                                                                                                             \
        block_update_t(T, full, a, w, h, krows, vrows, t0, nb);                                                   \
    }
BLOCK_UPDATE_T(Q3_F16, 1)
BLOCK_UPDATE_T(Q3_F16, 0)
BLOCK_UPDATE_T(Q3_BF16, 1)
BLOCK_UPDATE_T(Q3_BF16, 0)
BLOCK_UPDATE_T(Q3_F32, 1)
BLOCK_UPDATE_T(Q3_F32, 0)
#undef BLOCK_UPDATE_T
static void block_update_Q3_Q8_0_1(const q3_cpu_attn *a, attn_ws *w, head_ws *h, const char *const *krows,
                                   const char *const *vrows, int t0, int nb)
{
    block_update_q8(1, a, w, h, krows, vrows, t0, nb);
}
static void block_update_Q3_Q8_0_0(const q3_cpu_attn *a, attn_ws *w, head_ws *h, const char *const *krows,
                                   const char *const *vrows, int t0, int nb)
{
    block_update_q8(0, a, w, h, krows, vrows, t0, nb);
}

static void block_update(const q3_cpu_attn *a, attn_ws *w, head_ws *h, const char *const *krows,
                         const char *const *vrows, int t0, int nb)
{
    const int full = nb == KEY_BLOCK && a->head_dim % 16 == 0;
    switch (a->kv_dtype) {
    case Q3_F16: (full ? block_update_Q3_F16_1 : block_update_Q3_F16_0)(a, w, h, krows, vrows, t0, nb); break;
    case Q3_BF16: (full ? block_update_Q3_BF16_1 : block_update_Q3_BF16_0)(a, w, h, krows, vrows, t0, nb); break;
    case Q3_Q8_0: (full ? block_update_Q3_Q8_0_1 : block_update_Q3_Q8_0_0)(a, w, h, krows, vrows, t0, nb); break;
    default: (full ? block_update_Q3_F32_1 : block_update_Q3_F32_0)(a, w, h, krows, vrows, t0, nb); break;
    }
}

/* ---- super-block states ------------------------------------------------------------------ */

/* Folds a super-block's state (m, l, acc) into a total (tm, tl, tacc); an
 * empty total (tm = -inf) takes the state as it is. The one fold of the
 * unit: prefill calls it as it goes, decode after its threads are done. */
static void merge_state(float *tm, float *tl, float *tacc, float m, float l, const float *acc, int hdp)
{
    if (m == -INFINITY) return;
    if (*tm == -INFINITY) {
        *tm = m;
        *tl = l;
        memcpy(tacc, acc, (size_t)hdp * sizeof(float));
        return;
    }
    float nm = *tm > m ? *tm : m;
    float ea = _mm512_cvtss_f32(q3_exp2_ps(_mm512_set1_ps(*tm - nm)));
    float eb = _mm512_cvtss_f32(q3_exp2_ps(_mm512_set1_ps(m - nm)));
    *tl = *tl * ea + l * eb;
    __m512 va = _mm512_set1_ps(ea), vb = _mm512_set1_ps(eb);
    for (int c = 0; c < hdp; c += 16)
        _mm512_storeu_ps(tacc + c, _mm512_fmadd_ps(_mm512_loadu_ps(tacc + c), va, _mm512_mul_ps(_mm512_loadu_ps(acc + c), vb)));
    *tm = nm;
}

static size_t avx512_part_stride(const q3_cpu_attn *a) { return (size_t)padded_hd(a->head_dim) + 16; }

/* out[0..hd) = tacc / tl */
static void write_output(float *dst, const float *tacc, float tl, int hd)
{
    __m512 l = _mm512_set1_ps(tl);
    for (int d = 0; d < hd; d += 16)
        _mm512_mask_storeu_ps(dst + d, q3_mask16(hd - d), _mm512_div_ps(_mm512_loadu_ps(tacc + d), l));
}

/* ---- the op ----------------------------------------------------------------------------- */

static void avx512_attention(const q3_cpu_attn *a, void *scratch, int kvh0, int kvh1, int row0, int nrows, int sb,
                             float *part)
{
    const int G = a->n_heads / a->n_kv_heads, hd = a->head_dim, hdp = padded_hd(hd), nch = hdp / 16;
    const int n_kvh = kvh1 - kvh0;
    const bool prefill = a->k_chunk != NULL;
    attn_ws w = carve(scratch, n_kvh, nrows * G, hdp);
    const int nqp = w.nqp;
    const __m512 qscale = _mm512_set1_ps(a->scale * LOG2E);

    int kmax = 0;
    for (int hi = 0; hi < n_kvh; hi++) {
        head_ws *h = &w.h[hi];
        h->kvh = kvh0 + hi;
        for (int i = 0; i < nqp; i++) {
            int r = row0 + i / G, qh = h->kvh * G + i % G;
            const float *src = a->q + (size_t)r * a->ldq + (size_t)qh * hd;
            if (a->kv_dtype == Q3_Q8_0) {
                q8_query(h, i, i < w.nq ? src : NULL, hd, padded_hdq(hdp), a->scale * LOG2E);
            } else {
                for (int c = 0; c < nch; c++) {
                    __m512 v = i < w.nq ? _mm512_maskz_loadu_ps(q3_mask16(hd - c * 16), src + c * 16) : _mm512_setzero_ps();
                    _mm512_store_ps(h->qr + (size_t)i * hdp + c * 16, _mm512_mul_ps(v, qscale));
                }
            }
            h->tm[i] = -INFINITY;
            h->tl[i] = 0;
            h->n_keys[i] = i >= w.nq ? 0 : prefill ? a->n_cached + r + 1 : a->n_cached;
            if (h->n_keys[i] > kmax) kmax = h->n_keys[i];
        }
    }

    const size_t slice = q3_cpu_attn_head_bytes(a);
    const int sb0 = part ? sb : 0, sb1 = part ? sb + 1 : (kmax + SUPER_BLOCK - 1) / SUPER_BLOCK;
    for (int s = sb0; s < sb1; s++) {
        int k0 = s * SUPER_BLOCK, k1 = k0 + SUPER_BLOCK < kmax ? k0 + SUPER_BLOCK : kmax;
        for (int hi = 0; hi < n_kvh; hi++) {
            head_ws *h = &w.h[hi];
            for (int i = 0; i < nqp; i++) {
                h->m[i] = -INFINITY;
                h->l[i] = 0;
            }
            memset(h->acc, 0, (size_t)nqp * hdp * sizeof(float));
        }
        for (int t0 = k0; t0 < k1; t0 += KEY_BLOCK) {
            int nb = k1 - t0 < KEY_BLOCK ? k1 - t0 : KEY_BLOCK;
            const char *krows[KEY_BLOCK], *vrows[KEY_BLOCK];
            for (int j = 0; j < nb; j++) {
                krows[j] = kv_row(a, 0, t0 + j);
                vrows[j] = kv_row(a, 1, t0 + j);
            }
            for (int hi = 0; hi < n_kvh; hi++) {
                /* the (block, head) unit PREFETCH_UNITS ahead in this loop's order */
                int u = hi + PREFETCH_UNITS, pt0 = t0 + u / n_kvh * KEY_BLOCK;
                w.ahead.n = 0;
                if (pt0 < k1) {
                    const int pt1 = pt0 + KEY_BLOCK < k1 ? pt0 + KEY_BLOCK : k1;
                    const size_t poff = (size_t)(kvh0 + u % n_kvh) * slice;
                    /* a key block is a KV block (both 16, aligned): its rows lie a
                       row apart unless it runs from the cache into the chunk */
                    if (pt0 < a->n_cached && pt1 > a->n_cached) {
                        prefetch_slices(a, pt0, pt1, poff, slice);
                    } else {
                        w.ahead = (ahead_unit){.rows = {kv_row(a, 0, pt0) + poff, kv_row(a, 1, pt0) + poff},
                                               .stride = pt0 < a->n_cached ? a->row_bytes : a->chunk_row_bytes,
                                               .len = slice,
                                               .n = pt1 - pt0};
                    }
                }
                block_update(a, &w, &w.h[hi], krows, vrows, t0, nb);
            }
        }
        for (int hi = 0; hi < n_kvh; hi++) {
            head_ws *h = &w.h[hi];
            for (int i = 0; i < w.nq; i++) {
                if (part) { /* decode: one row, query head kvh * G + i */
                    float *dst = part + (size_t)(h->kvh * G + i) * avx512_part_stride(a);
                    dst[0] = h->m[i];
                    dst[1] = h->l[i];
                    memcpy(dst + 16, h->acc + (size_t)i * hdp, (size_t)hdp * sizeof(float));
                } else {
                    merge_state(&h->tm[i], &h->tl[i], h->tacc + (size_t)i * hdp, h->m[i], h->l[i],
                                h->acc + (size_t)i * hdp, hdp);
                }
            }
        }
    }
    if (part) return;
    for (int hi = 0; hi < n_kvh; hi++) {
        head_ws *h = &w.h[hi];
        for (int i = 0; i < w.nq; i++) {
            int r = row0 + i / G, qh = h->kvh * G + i % G;
            write_output(a->out + (size_t)r * a->ldo + (size_t)qh * hd, h->tacc + (size_t)i * hdp, h->tl[i], hd);
        }
    }
}

/* Decode: folds the super-block states of every query head, in order. */
static void avx512_attn_merge(const q3_cpu_attn *a, const float *parts, int n_sb, float *out)
{
    const int hd = a->head_dim, hdp = padded_hd(hd);
    const size_t stride = avx512_part_stride(a);
    float tacc[hdp];
    for (int qh = 0; qh < a->n_heads; qh++) {
        float tm = -INFINITY, tl = 0;
        for (int s = 0; s < n_sb; s++) {
            const float *st = parts + ((size_t)s * a->n_heads + qh) * stride;
            merge_state(&tm, &tl, tacc, st[0], st[1], st + 16, hdp);
        }
        write_output(out + (size_t)qh * hd, tacc, tl, hd);
    }
}

const q3_cpu_attn_kernels q3_cpu_attn_avx512 = {
    .super_block = SUPER_BLOCK,
    .scratch = avx512_attn_scratch,
    .run = avx512_attention,
    .part_stride = avx512_part_stride,
    .merge = avx512_attn_merge,
};
