/* ATTENTION on AVX-512: flash-style (online softmax) over blocks of 16 keys,
 * for all the query heads of one KV head (GQA) and a few query rows at once,
 * so each key and value row is converted to F32 once per block and reused by
 * every query of the group. The same function runs decode (one row, keys
 * from the cache) and prefill (rows of a chunk, past keys from the cache and
 * the chunk's own keys after them).
 *
 * Per query, keys are walked in blocks aligned to absolute key positions
 * (0, 16, 32, ...); a score is dot(q', k) summed in vector lanes then by
 * q3_reduce4; the block update is m' = max(m, max s), p = 2^(s - m'),
 * l = l * 2^(m - m') + sum p, acc = acc * 2^(m - m') + sum_j p_j v_j, with
 * q' = q * scale * log2(e). Keys past a query's causal limit get p = 0. So
 * a query's result does not depend on which other rows share its run. */
#include <math.h>

#include "backend/cpu/kernels.h"
#include "backend/cpu/simd_avx512.h"

#define KEY_BLOCK 16
#define LOG2E 1.4426950408889634f

typedef struct attn_ws {
    float *q;    /* [nq][hdp] scaled queries, zero padded */
    float *acc;  /* [nq][hdp] unnormalised outputs */
    float *kb;   /* [KEY_BLOCK][hdp] the block's keys in F32 */
    float *vb;   /* [KEY_BLOCK][hdp] the block's values in F32 */
    float *p;    /* [nq][KEY_BLOCK] scores, then probabilities */
    float *m, *l, *corr; /* [nq] running max, running sum, this block's rescale */
    int *n_keys; /* [nq] keys each query sees */
} attn_ws;

static int padded_hd(int hd) { return (hd + 15) & ~15; }

static size_t ws_floats(int nq, int hdp)
{
    return (size_t)nq * hdp * 2 + (size_t)KEY_BLOCK * hdp * 2 + (size_t)nq * KEY_BLOCK + (size_t)nq * 4 + 64;
}

static size_t avx512_attn_scratch(const q3_cpu_attn *a, int nrows)
{
    int nq = nrows * (a->n_heads / a->n_kv_heads);
    return (ws_floats(nq, padded_hd(a->head_dim)) * sizeof(float) + 63) & ~(size_t)63;
}

static attn_ws carve(void *scratch, int nq, int hdp)
{
    float *f = scratch;
    attn_ws w;
    w.q = f, f += (size_t)nq * hdp;
    w.acc = f, f += (size_t)nq * hdp;
    w.kb = f, f += (size_t)KEY_BLOCK * hdp;
    w.vb = f, f += (size_t)KEY_BLOCK * hdp;
    w.p = f, f += (size_t)nq * KEY_BLOCK;
    w.m = f, f += nq;
    w.l = f, f += nq;
    w.corr = f, f += nq;
    w.n_keys = (int *)f;
    return w;
}

/* Key (or value) row t of KV head kvh as hdp floats (zero padded). */
static void load_kv_row(const q3_cpu_attn *a, const void *cache, const void *chunk, int t, int kvh, float *dst)
{
    int hd = a->head_dim;
    size_t esz = a->kv_dtype == Q3_F32 ? 4 : 2;
    const char *row = t < a->n_cached ? (const char *)cache + (size_t)t * a->cache_row_bytes
                                      : (const char *)chunk + (size_t)(t - a->n_cached) * a->chunk_row_bytes;
    row += (size_t)kvh * hd * esz;
    for (int d = 0; d < hd; d += 16) {
        __mmask16 m = q3_mask16(hd - d);
        __m512 v;
        if (a->kv_dtype == Q3_BF16)
            v = q3_load_bf16x16((const uint16_t *)row + d, m);
        else if (a->kv_dtype == Q3_F16)
            v = q3_load_f16x16((const uint16_t *)row + d, m);
        else
            v = _mm512_maskz_loadu_ps(m, (const float *)row + d);
        _mm512_store_ps(dst + d, v);
    }
}

/* Scores of query qv (nch chunks of 16) against keys j0..j0+3 of the block
 * (indices past nb repeat the last key; their lanes are ignored). */
Q3_INLINE __m128 scores4(const float *qv, const float *kb, int hdp, int nch, int j0, int nb)
{
    const float *k0 = kb + (size_t)(j0 < nb ? j0 : nb - 1) * hdp;
    const float *k1 = kb + (size_t)(j0 + 1 < nb ? j0 + 1 : nb - 1) * hdp;
    const float *k2 = kb + (size_t)(j0 + 2 < nb ? j0 + 2 : nb - 1) * hdp;
    const float *k3 = kb + (size_t)(j0 + 3 < nb ? j0 + 3 : nb - 1) * hdp;
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (int c = 0; c < nch; c++) {
        __m512 q = _mm512_load_ps(qv + c * 16);
        a0 = _mm512_fmadd_ps(q, _mm512_load_ps(k0 + c * 16), a0);
        a1 = _mm512_fmadd_ps(q, _mm512_load_ps(k1 + c * 16), a1);
        a2 = _mm512_fmadd_ps(q, _mm512_load_ps(k2 + c * 16), a2);
        a3 = _mm512_fmadd_ps(q, _mm512_load_ps(k3 + c * 16), a3);
    }
    return q3_reduce4(a0, a1, a2, a3);
}

/* acc[q] = acc[q] * corr[q] + sum_{j < nb} p[q][j] * vb[j] for QG queries
 * starting at q0 (queries past nq repeat the last one and are not stored). */
Q3_INLINE void pv_update(const int QG, attn_ws *w, int q0, int nq, int hdp, int nb)
{
    int qi[8];
#pragma GCC unroll 8
    for (int i = 0; i < QG; i++) qi[i] = q0 + i < nq ? q0 + i : nq - 1;
    for (int c = 0; c < hdp; c += 16) {
        __m512 acc[8];
#pragma GCC unroll 8
        for (int i = 0; i < QG; i++)
            acc[i] = _mm512_mul_ps(_mm512_load_ps(w->acc + (size_t)qi[i] * hdp + c), _mm512_set1_ps(w->corr[qi[i]]));
        for (int j = 0; j < nb; j++) {
            __m512 v = _mm512_load_ps(w->vb + (size_t)j * hdp + c);
#pragma GCC unroll 8
            for (int i = 0; i < QG; i++)
                acc[i] = _mm512_fmadd_ps(_mm512_set1_ps(w->p[qi[i] * KEY_BLOCK + j]), v, acc[i]);
        }
#pragma GCC unroll 8
        for (int i = 0; i < QG; i++)
            if (q0 + i < nq) _mm512_store_ps(w->acc + (size_t)qi[i] * hdp + c, acc[i]);
    }
}

static void avx512_attention(const q3_cpu_attn *a, void *scratch, int kvh, int row0, int nrows)
{
    const int G = a->n_heads / a->n_kv_heads, hd = a->head_dim, hdp = padded_hd(hd), nch = hdp / 16;
    const int nq = nrows * G;
    const bool prefill = a->k_chunk != NULL;
    attn_ws w = carve(scratch, nq, hdp);
    const __m512 qscale = _mm512_set1_ps(a->scale * LOG2E);

    int kmax = 0;
    for (int i = 0; i < nq; i++) {
        int r = row0 + i / G, h = kvh * G + i % G;
        const float *src = a->q + (size_t)r * a->ldq + (size_t)h * hd;
        for (int c = 0; c < nch; c++) {
            __m512 v = _mm512_maskz_loadu_ps(q3_mask16(hd - c * 16), src + c * 16);
            _mm512_store_ps(w.q + (size_t)i * hdp + c * 16, _mm512_mul_ps(v, qscale));
            _mm512_store_ps(w.acc + (size_t)i * hdp + c * 16, _mm512_setzero_ps());
        }
        w.m[i] = -INFINITY;
        w.l[i] = 0;
        w.n_keys[i] = prefill ? a->n_cached + r + 1 : a->n_cached;
        if (w.n_keys[i] > kmax) kmax = w.n_keys[i];
    }

    for (int t0 = 0; t0 < kmax; t0 += KEY_BLOCK) {
        int nb = kmax - t0 < KEY_BLOCK ? kmax - t0 : KEY_BLOCK;
        for (int j = 0; j < nb; j++) load_kv_row(a, a->k_cache, a->k_chunk, t0 + j, kvh, w.kb + (size_t)j * hdp);

        /* scores and the online-softmax update, query by query */
        for (int i = 0; i < nq; i++) {
            float *p = w.p + (size_t)i * KEY_BLOCK;
            int valid = w.n_keys[i] - t0;
            if (valid <= 0) { /* past this query's causal limit: an exact no-op update */
                _mm512_storeu_ps(p, _mm512_setzero_ps());
                w.corr[i] = 1.0f;
                continue;
            }
            if (valid > KEY_BLOCK) valid = KEY_BLOCK;
            const float *qv = w.q + (size_t)i * hdp;
            for (int j0 = 0; j0 < valid; j0 += 4) _mm_storeu_ps(p + j0, scores4(qv, w.kb, hdp, nch, j0, nb));
            __mmask16 vm = q3_mask16(valid);
            __m512 s = _mm512_maskz_loadu_ps(vm, p);
            float bmax = _mm512_reduce_max_ps(_mm512_mask_blend_ps(vm, _mm512_set1_ps(-INFINITY), s));
            float m_old = w.m[i], m_new = m_old > bmax ? m_old : bmax;
            float corr = m_old == -INFINITY ? 0.0f : _mm512_cvtss_f32(q3_exp2_ps(_mm512_set1_ps(m_old - m_new)));
            __m512 pv = _mm512_maskz_mov_ps(vm, q3_exp2_ps(_mm512_sub_ps(s, _mm512_set1_ps(m_new))));
            _mm512_storeu_ps(p, pv);
            w.l[i] = w.l[i] * corr + q3_hsum(pv);
            w.m[i] = m_new;
            w.corr[i] = corr;
        }

        for (int j = 0; j < nb; j++) load_kv_row(a, a->v_cache, a->v_chunk, t0 + j, kvh, w.vb + (size_t)j * hdp);
        for (int q0 = 0; q0 < nq; q0 += 8) {
            int left = nq - q0;
            if (left <= 2)
                pv_update(2, &w, q0, nq, hdp, nb);
            else if (left <= 4)
                pv_update(4, &w, q0, nq, hdp, nb);
            else
                pv_update(8, &w, q0, nq, hdp, nb);
        }
    }

    for (int i = 0; i < nq; i++) {
        int r = row0 + i / G, h = kvh * G + i % G;
        float *dst = a->out + (size_t)r * a->ldo + (size_t)h * hd;
        __m512 inv_l = _mm512_set1_ps(w.l[i]);
        for (int c = 0; c < nch; c++) {
            __m512 v = _mm512_div_ps(_mm512_load_ps(w.acc + (size_t)i * hdp + c * 16), inv_l);
            _mm512_mask_storeu_ps(dst + c * 16, q3_mask16(hd - c * 16), v);
        }
    }
}

const q3_cpu_attn_kernels q3_cpu_attn_avx512 = {
    .scratch = avx512_attn_scratch,
    .run = avx512_attention,
};
