/* The scalar reference of the K-quant matmul (Q4_K, Q5_K, Q6_K; numerics in
 * quant_kernels.h): one output at a time, one activation block of 32 at a
 * time. The oracle the SIMD kernels are tested against bit for bit. (Built
 * without FMA flags: fmaf is the correctly rounded library function.) */
#include <math.h>
#include <string.h>

#include "backend/cpu/quant_kernels.h"

static float f16_at(const uint8_t *p) { return q3_f16_to_f32((uint16_t)(p[0] | p[1] << 8)); }

/* Sub-block j's 6-bit scale and min of a Q4_K / Q5_K super-block (scale bytes at s). */
static void scale_min(const uint8_t *s, int j, int *sc, int *m)
{
    if (j < 4) {
        *sc = s[j] & 63;
        *m = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 15) | (s[j - 4] >> 6) << 4;
        *m = (s[j + 4] >> 4) | (s[j] >> 6) << 4;
    }
}

/* The 32 quants of activation block j (0..7) of a super-block. */
static void quants(q3_dtype wt, const uint8_t *sb, int j, int q[32])
{
    if (wt == Q3_Q6_K) {
        int h = j / 4, g = j % 4; /* values 128h + 32g + i */
        const uint8_t *ql = sb + 64 * h + 32 * (g & 1), *qh = sb + 128 + 32 * h;
        for (int i = 0; i < 32; i++) q[i] = ((ql[i] >> (4 * (g >> 1))) & 15) | ((qh[i] >> (2 * g)) & 3) << 4;
        return;
    }
    const uint8_t *qs = sb + (wt == Q3_Q5_K ? 48 : 16) + 32 * (j / 2);
    for (int i = 0; i < 32; i++) {
        q[i] = (qs[i] >> (4 * (j % 2))) & 15;
        if (wt == Q3_Q5_K) q[i] |= ((sb[16 + i] >> j) & 1) << 4;
    }
}

static void kmatmul(q3_dtype wt, const void *w, size_t w_row_bytes, const q3_qact *qa, float *y, size_t ldy, int o0,
                    int o1)
{
    const int nb = qa->k / Q3_QBLOCK;
    const size_t sbb = q3_dtype_block_bytes(wt);
    for (int r = 0; r < qa->rows; r++) {
        for (int o = o0; o < o1; o++) {
            const uint8_t *wr = (const uint8_t *)w + (size_t)o * w_row_bytes;
            float acc = 0.0f;
            for (int b = 0; b < nb; b++) {
                const uint8_t *sb = wr + (size_t)(b / 8) * sbb;
                const int8_t *x = q3_qact_q(qa, r, b);
                const float dx = *q3_qact_d(qa, r, b);
                const uint32_t c = (uint32_t)*q3_qact_c(qa, r, b);
                const int s[2] = {(int16_t)(c & 0xffff), (int16_t)(c >> 16)};
                int q[32];
                quants(wt, sb, b % 8, q);
                if (wt == Q3_Q6_K) {
                    float d = f16_at(sb + 208);
                    for (int h = 0; h < 2; h++) {
                        int32_t J = -32 * s[h];
                        for (int i = 16 * h; i < 16 * h + 16; i++) J += q[i] * x[i];
                        float fs = d * (float)(int8_t)sb[192 + 2 * (b % 8) + h];
                        acc = fmaf((float)J, fs * dx, acc);
                    }
                } else {
                    int sc, m;
                    scale_min(sb + 4, b % 8, &sc, &m);
                    float fs = f16_at(sb) * (float)sc, fm = f16_at(sb + 2) * (float)m;
                    int32_t I = 0;
                    for (int i = 0; i < 32; i++) I += q[i] * x[i];
                    acc = fmaf((float)I, fs * dx, acc);
                    acc = fmaf((float)(s[0] + s[1]), -(fm * dx), acc);
                }
            }
            y[(size_t)r * ldy + o] = acc;
        }
    }
}

#define ROW(name, wt)                                                                                                \
    static void name##_matmul(const void *w, size_t ws, const q3_qact *qa, float *y, size_t ldy, int o0, int o1,    \
                              void *scratch)                                                                         \
    {                                                                                                                \
        kmatmul(wt, w, ws, qa, y, ldy, o0, o1);                                                                      \
    }                                                                                                                \
    const q3_quant_type_kernels q3_kquant_ref_##name = {.matmul = name##_matmul};
ROW(q4_k, Q3_Q4_K)
ROW(q5_k, Q3_Q5_K)
ROW(q6_k, Q3_Q6_K)
#undef ROW
