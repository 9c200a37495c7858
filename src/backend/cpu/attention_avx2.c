/* ATTENTION on AVX2+FMA: flash-style (online softmax) over blocks of 8 keys
 * aligned to absolute positions, for all the query heads of one KV head and a
 * few query rows at once; one state per query over all its keys (no
 * super-blocks: decode is split across threads by KV head). A score is
 * dot(q', k) in 8 lanes summed by q3_reduce4_avx2; the block update is
 * m' = max(m, max s), p = 2^(s - m'), l = l * 2^(m - m') + sum p,
 * acc = acc * 2^(m - m') + sum_j p_j v_j with q' = q * scale * log2(e); keys
 * past a query's causal limit get p = 0. The same code serves decode and
 * prefill, so their results agree bit for bit. */
#include <math.h>

#include "backend/cpu/kernels.h"
#include "backend/cpu/simd_avx2.h"
#include "model/quantize.h"

#define KEY_BLOCK 8
#define LOG2E 1.4426950408889634f

typedef struct attn_ws {
    float *q, *acc;        /* [nq][hdp] */
    float *kb, *vb;        /* [KEY_BLOCK][hdp] */
    float *p;              /* [nq][KEY_BLOCK] */
    float *m, *l, *corr;   /* [nq] */
    int *n_keys;           /* [nq] */
} attn_ws;

static int padded_hd(int hd) { return (hd + 7) & ~7; }

/* Heads are processed one after the other, so scratch for one is enough. */
static size_t avx2_attn_scratch(const q3_cpu_attn *a, int nrows, int n_kvh)
{
    size_t nq = (size_t)nrows * (size_t)(a->n_heads / a->n_kv_heads), hdp = (size_t)padded_hd(a->head_dim);
    size_t floats = nq * hdp * 2 + KEY_BLOCK * hdp * 2 + nq * KEY_BLOCK + nq * 4 + 64;
    return (floats * sizeof(float) + 63) & ~(size_t)63;
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

static void load_kv_row(const q3_cpu_attn *a, int v, int t, int kvh, float *dst)
{
    int hd = a->head_dim;
    const char *row = t < a->n_cached ? q3_cpu_attn_cache_row(a, v, t)
                                      : (const char *)(v ? a->v_chunk : a->k_chunk) + (size_t)(t - a->n_cached) * a->chunk_row_bytes;
    row += (size_t)kvh * q3_cpu_attn_head_bytes(a);
    if (a->kv_dtype == Q3_Q8_0) { /* hd % 32 == 0: whole blocks, dequantized exactly */
        const uint8_t *b = (const uint8_t *)row;
        for (int d = 0; d < hd; d += 32, b += Q3_Q8_0_BYTES) {
            __m256 s = q3_q8_0_scale(b);
            for (int j = 0; j < 32; j += 8) _mm256_store_ps(dst + d + j, q3_load_q8_0x8(b, s, j));
        }
        return;
    }
    for (int d = 0; d < hd; d += 8) {
        __m256 v;
        if (a->kv_dtype == Q3_F32) {
            v = _mm256_maskload_ps((const float *)row + d, q3_mask8(hd - d));
        } else {
            __m128i h = q3_load_u16x8((const uint16_t *)row + d, hd - d);
            v = a->kv_dtype == Q3_BF16 ? q3_bf16x8_to_f32(h) : _mm256_cvtph_ps(h);
        }
        _mm256_store_ps(dst + d, v);
    }
}

Q3_INLINE __m128 scores4(const float *qv, const float *kb, int hdp, int j0, int nb)
{
    const float *k0 = kb + (size_t)(j0 < nb ? j0 : nb - 1) * hdp;
    const float *k1 = kb + (size_t)(j0 + 1 < nb ? j0 + 1 : nb - 1) * hdp;
    const float *k2 = kb + (size_t)(j0 + 2 < nb ? j0 + 2 : nb - 1) * hdp;
    const float *k3 = kb + (size_t)(j0 + 3 < nb ? j0 + 3 : nb - 1) * hdp;
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (int c = 0; c < hdp; c += 8) {
        __m256 q = _mm256_load_ps(qv + c);
        a0 = _mm256_fmadd_ps(q, _mm256_load_ps(k0 + c), a0);
        a1 = _mm256_fmadd_ps(q, _mm256_load_ps(k1 + c), a1);
        a2 = _mm256_fmadd_ps(q, _mm256_load_ps(k2 + c), a2);
        a3 = _mm256_fmadd_ps(q, _mm256_load_ps(k3 + c), a3);
    }
    return q3_reduce4_avx2(a0, a1, a2, a3);
}

Q3_INLINE void pv_update(const int QG, attn_ws *w, int q0, int nq, int hdp, int nb)
{
    int qi[4];
#pragma GCC unroll 4
    for (int i = 0; i < QG; i++) qi[i] = q0 + i < nq ? q0 + i : nq - 1;
    for (int c = 0; c < hdp; c += 8) {
        __m256 acc[4];
#pragma GCC unroll 4
        for (int i = 0; i < QG; i++)
            acc[i] = _mm256_mul_ps(_mm256_load_ps(w->acc + (size_t)qi[i] * hdp + c), _mm256_set1_ps(w->corr[qi[i]]));
        for (int j = 0; j < nb; j++) {
            __m256 v = _mm256_load_ps(w->vb + (size_t)j * hdp + c);
#pragma GCC unroll 4
            for (int i = 0; i < QG; i++)
                acc[i] = _mm256_fmadd_ps(_mm256_set1_ps(w->p[qi[i] * KEY_BLOCK + j]), v, acc[i]);
        }
#pragma GCC unroll 4
        for (int i = 0; i < QG; i++)
            if (q0 + i < nq) _mm256_store_ps(w->acc + (size_t)qi[i] * hdp + c, acc[i]);
    }
}

static void attend_head(const q3_cpu_attn *a, void *scratch, int kvh, int row0, int nrows)
{
    const int G = a->n_heads / a->n_kv_heads, hd = a->head_dim, hdp = padded_hd(hd);
    const int nq = nrows * G;
    const bool prefill = a->k_chunk != NULL;
    attn_ws w = carve(scratch, nq, hdp);
    const __m256 qscale = _mm256_set1_ps(a->scale * LOG2E);

    int kmax = 0;
    float qround[hd];
    for (int i = 0; i < nq; i++) {
        int r = row0 + i / G, h = kvh * G + i % G;
        const float *src = a->q + (size_t)r * a->ldq + (size_t)h * hd;
        if (a->kv_dtype == Q3_Q8_0) { /* a Q8_0 cache's keys meet the query as Q8_0 too */
            q3_round_q8_0(src, qround, (size_t)hd);
            src = qround;
        }
        for (int c = 0; c < hdp; c += 8) {
            __m256 v = _mm256_maskload_ps(src + c, q3_mask8(hd - c));
            _mm256_store_ps(w.q + (size_t)i * hdp + c, _mm256_mul_ps(v, qscale));
            _mm256_store_ps(w.acc + (size_t)i * hdp + c, _mm256_setzero_ps());
        }
        w.m[i] = -INFINITY;
        w.l[i] = 0;
        w.n_keys[i] = prefill ? a->n_cached + r + 1 : a->n_cached;
        if (w.n_keys[i] > kmax) kmax = w.n_keys[i];
    }

    for (int t0 = 0; t0 < kmax; t0 += KEY_BLOCK) {
        int nb = kmax - t0 < KEY_BLOCK ? kmax - t0 : KEY_BLOCK;
        for (int j = 0; j < nb; j++) load_kv_row(a, 0, t0 + j, kvh, w.kb + (size_t)j * hdp);
        for (int i = 0; i < nq; i++) {
            float *p = w.p + (size_t)i * KEY_BLOCK;
            int valid = w.n_keys[i] - t0;
            if (valid <= 0) {
                _mm256_storeu_ps(p, _mm256_setzero_ps());
                w.corr[i] = 1.0f;
                continue;
            }
            if (valid > KEY_BLOCK) valid = KEY_BLOCK;
            const float *qv = w.q + (size_t)i * hdp;
            for (int j0 = 0; j0 < valid; j0 += 4) _mm_storeu_ps(p + j0, scores4(qv, w.kb, hdp, j0, nb));
            float bmax = -INFINITY;
            for (int j = 0; j < valid; j++) bmax = p[j] > bmax ? p[j] : bmax;
            float m_old = w.m[i], m_new = m_old > bmax ? m_old : bmax;
            float corr = m_old == -INFINITY ? 0.0f : _mm256_cvtss_f32(q3_exp2_avx2(_mm256_set1_ps(m_old - m_new)));
            __m256 vm = _mm256_castsi256_ps(q3_mask8(valid));
            __m256 pv = _mm256_and_ps(vm, q3_exp2_avx2(_mm256_sub_ps(_mm256_loadu_ps(p), _mm256_set1_ps(m_new))));
            _mm256_storeu_ps(p, pv);
            w.l[i] = w.l[i] * corr + q3_hsum_avx2(pv);
            w.m[i] = m_new;
            w.corr[i] = corr;
        }
        for (int j = 0; j < nb; j++) load_kv_row(a, 1, t0 + j, kvh, w.vb + (size_t)j * hdp);
        for (int q0 = 0; q0 < nq; q0 += 4) {
            if (nq - q0 <= 2)
                pv_update(2, &w, q0, nq, hdp, nb);
            else
                pv_update(4, &w, q0, nq, hdp, nb);
        }
    }

    for (int i = 0; i < nq; i++) {
        int r = row0 + i / G, h = kvh * G + i % G;
        float *dst = a->out + (size_t)r * a->ldo + (size_t)h * hd;
        __m256 l = _mm256_set1_ps(w.l[i]);
        for (int c = 0; c < hdp; c += 8)
            _mm256_maskstore_ps(dst + c, q3_mask8(hd - c), _mm256_div_ps(_mm256_load_ps(w.acc + (size_t)i * hdp + c), l));
    }
}

/* No super-blocks (super_block = 0): every run covers all keys (part is NULL). */
static void avx2_attention(const q3_cpu_attn *a, void *scratch, int kvh0, int kvh1, int row0, int nrows, int sb,
                           float *part)
{
    for (int kvh = kvh0; kvh < kvh1; kvh++) attend_head(a, scratch, kvh, row0, nrows);
}

const q3_cpu_attn_kernels q3_cpu_attn_avx2 = {
    .super_block = 0,
    .scratch = avx2_attn_scratch,
    .run = avx2_attention,
};
