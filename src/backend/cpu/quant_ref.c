/* The scalar reference of the Q8_0 / Q4_0 matmul (numerics and the layout of
 * quantized activations in quant_kernels.h). Plain C, one
 * output at a time: the oracle the SIMD kernels are tested against bit for
 * bit. (Compiled without FMA flags: fmaf is the correctly rounded library
 * function, and -std=c17 keeps the compiler from contracting anything else.) */
#include <math.h>
#include <string.h>

#include "backend/cpu/quant_kernels.h"

static void ref_quantize(q3_dtype wt, const float *x, size_t ldx, const q3_qact *qa, int r0, int r1)
{
    const int k = qa->k, nb = k / Q3_QBLOCK, off = q3_quant_ref.type[wt]->act_offset;
    for (int r = r0; r < r1; r++) {
        const float *xr = x + (size_t)r * ldx;
        for (int b = 0; b < nb; b++) {
            const float *xb = xr + b * Q3_QBLOCK;
            int8_t *q = q3_qact_q(qa, r, b);
            float amax = 0.0f;
            bool finite = true;
            for (int i = 0; i < Q3_QBLOCK; i++) {
                amax = fmaxf(amax, fabsf(xb[i]));
                finite = finite && isfinite(xb[i]);
            }
            int sum = 0, half[2] = {0, 0};
            if (!finite) { /* the poisoned block: every output of the row NaN */
                memset(q, 0, Q3_QBLOCK);
                *q3_qact_d(qa, r, b) = NAN;
            } else if (amax > 0x1p-100f) {
                float id = 127.0f / amax;
                for (int i = 0; i < Q3_QBLOCK; i++) {
                    float t = xb[i] * id;
                    int v = (int)nearbyintf(t); /* round half even (the default mode); |t| <= 127 */
                    q[i] = (int8_t)v;
                    sum += v;
                    half[i / 16] += v;
                }
                *q3_qact_d(qa, r, b) = amax / 127.0f;
            } else {
                memset(q, 0, Q3_QBLOCK);
                *q3_qact_d(qa, r, b) = 0.0f;
            }
            /* K-quants (no offset): the two half sums, packed */
            *q3_qact_c(qa, r, b) = off == 0 ? (int32_t)((uint32_t)(uint16_t)half[0] | (uint32_t)half[1] << 16) : -off * sum;
        }
    }
}

static float f16_at(const uint8_t *p) { return q3_f16_to_f32((uint16_t)(p[0] | p[1] << 8)); }

/* Q8_0 (q8 = 1) or Q4_0 weights. */
static void matmul_q0(const int q8, const void *w, size_t w_row_bytes, const q3_qact *qa, float *y, size_t ldy,
                      int o0, int o1)
{
    const int k = qa->k, nb = k / Q3_QBLOCK;
    for (int r = 0; r < qa->rows; r++) {
        for (int o = o0; o < o1; o++) {
            const uint8_t *wr = (const uint8_t *)w + (size_t)o * w_row_bytes;
            float acc = 0.0f;
            for (int b = 0; b < nb; b++) {
                const int8_t *xb = q3_qact_q(qa, r, b);
                int32_t dot = 0;
                float dw;
                if (q8) {
                    const uint8_t *blk = wr + (size_t)b * Q3_Q8_0_BYTES;
                    dw = f16_at(blk);
                    for (int i = 0; i < Q3_QBLOCK; i++) dot += (int8_t)blk[2 + i] * xb[i];
                } else {
                    const uint8_t *blk = wr + (size_t)b * Q3_Q4_0_BYTES;
                    dw = f16_at(blk);
                    for (int i = 0; i < 16; i++) {
                        dot += ((blk[2 + i] & 15) - 8) * xb[i];
                        dot += ((blk[2 + i] >> 4) - 8) * xb[i + 16];
                    }
                }
                acc = fmaf((float)dot, dw * *q3_qact_d(qa, r, b), acc);
            }
            y[(size_t)r * ldy + o] = acc;
        }
    }
}

static void matmul_q8_0(const void *w, size_t ws, const q3_qact *qa, float *y, size_t ldy, int o0, int o1, void *s)
{
    matmul_q0(1, w, ws, qa, y, ldy, o0, o1);
}

static void matmul_q4_0(const void *w, size_t ws, const q3_qact *qa, float *y, size_t ldy, int o0, int o1, void *s)
{
    matmul_q0(0, w, ws, qa, y, ldy, o0, o1);
}

static const q3_quant_type_kernels q8_0_row = {.act_offset = 128, .matmul = matmul_q8_0},
                                    q4_0_row = {.act_offset = 8, .matmul = matmul_q4_0};

/* The oracle's rows, by weight dtype. */
static const q3_quant_type_kernels *const ref_rows[Q3_DTYPE_COUNT] = {
    [Q3_Q8_0] = &q8_0_row,
    [Q3_Q4_0] = &q4_0_row,
    [Q3_Q4_K] = &q3_kquant_ref_q4_k,
    [Q3_Q5_K] = &q3_kquant_ref_q5_k,
    [Q3_Q6_K] = &q3_kquant_ref_q6_k,
};

static size_t ref_scratch(q3_dtype wt, int rows, int k) { return q3_quant_rows_scratch(ref_rows, wt, rows, k); }

static void ref_matmul(q3_dtype wt, const void *w, size_t w_row_bytes, const q3_qact *qa, float *y, size_t ldy,
                       int o0, int o1, void *scratch)
{
    ref_rows[wt]->matmul(w, w_row_bytes, qa, y, ldy, o0, o1, scratch);
}

const q3_quant_kernels q3_quant_ref = {
    .name = "ref",
    .granule = 1,
    .type = ref_rows,
    .quantize = ref_quantize,
    .scratch = ref_scratch,
    .matmul = ref_matmul,
};
