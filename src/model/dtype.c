#include "model/dtype.h"

#include <math.h>
#include <strings.h>

#include "model/gguf.h"
#include "model/quantize.h"

float q3_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h >> 15) << 31;
    uint32_t exp = (h >> 10) & 0x1f, man = h & 0x3ff, u;
    if (exp == 0) {
        if (man == 0) {
            u = sign;
        } else { /* subnormal: value = man * 2^-24 */
            float f = (float)man * 0x1p-24f;
            memcpy(&u, &f, 4);
            u |= sign;
        }
    } else if (exp == 31) {
        u = sign | 0x7f800000u | (man << 13);
    } else {
        u = sign | ((exp + 112) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* Round to nearest even, branch-light (the KV hand-off converts millions of
 * values per prefill chunk); equal to the plain definition for all 2^32 inputs. */
uint16_t q3_f32_to_f16(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000);
    x &= 0x7fffffffu;
    if (x > 0x7f800000u) return sign | 0x7e00 | (uint16_t)((x >> 13) & 0x3ff); /* NaN: quiet, payload's top bits (as F16C) */
    if (x >= 0x477ff000u) return sign | 0x7c00; /* 65520 and up round to infinity */
    if (x < 0x38800000u) {                       /* below 2^-14: a subnormal half */
        float a;
        memcpy(&a, &x, 4);
        a += 0.5f; /* the FPU rounds (half to even) to units of 2^-24 in the low mantissa bits */
        uint32_t u;
        memcpy(&u, &a, 4);
        return sign | (uint16_t)(u - 0x3f000000u);
    }
    uint32_t odd = (x >> 13) & 1u;
    x += 0xc8000fffu + odd; /* exponent 127 -> 15 bias, and round half to even */
    return sign | (uint16_t)(x >> 13);
}

static float load_f16(const uint8_t *p) { return q3_f16_to_f32((uint16_t)(p[0] | p[1] << 8)); }

/* One Q4_K super-block (layout in dtype.h) into 256 floats. The arithmetic is
 * llama.cpp's, operation for operation: the sub-block scale d*sc and offset
 * dmin*m are rounded to float first, then value = scale*q - offset. */
static void dequant_q4_k(const uint8_t *b, float *y)
{
    float d = load_f16(b), dmin = load_f16(b + 2);
    const uint8_t *s = b + 4, *qs = b + 16;
    for (int j = 0; j < 8; j++) {
        int sc, m;
        if (j < 4) {
            sc = s[j] & 63;
            m = s[j + 4] & 63;
        } else {
            sc = (s[j + 4] & 15) | (s[j - 4] >> 6) << 4;
            m = (s[j + 4] >> 4) | (s[j] >> 6) << 4;
        }
        float scale = d * (float)sc, off = dmin * (float)m;
        const uint8_t *q = qs + 32 * (j / 2);
        int shift = 4 * (j % 2); /* even sub-blocks: low nibbles, odd: high */
        for (int i = 0; i < 32; i++) {
            float p = scale * (float)((q[i] >> shift) & 15);
            y[32 * j + i] = p - off;
        }
    }
}

/* The 6-bit scale and min of sub-block j of a Q4_K / Q5_K super-block. */
static void kscale_min(const uint8_t *s, int j, int *sc, int *m)
{
    if (j < 4) {
        *sc = s[j] & 63;
        *m = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 15) | (s[j - 4] >> 6) << 4;
        *m = (s[j + 4] >> 4) | (s[j] >> 6) << 4;
    }
}

/* One Q5_K super-block (layout in dtype.h) into 256 floats, with Q4_K's
 * arithmetic: scale = d*sc and offset = dmin*m as floats, then scale*q - offset. */
static void dequant_q5_k(const uint8_t *b, float *y)
{
    float d = load_f16(b), dmin = load_f16(b + 2);
    const uint8_t *qh = b + 16, *qs = b + 48;
    for (int j = 0; j < 8; j++) {
        int sc, m;
        kscale_min(b + 4, j, &sc, &m);
        float scale = d * (float)sc, off = dmin * (float)m;
        const uint8_t *q = qs + 32 * (j / 2);
        int shift = 4 * (j % 2);
        for (int i = 0; i < 32; i++) {
            int v = ((q[i] >> shift) & 15) | ((qh[i] >> j) & 1) << 4;
            float p = scale * (float)v;
            y[32 * j + i] = p - off;
        }
    }
}

/* One Q6_K super-block (layout in dtype.h) into 256 floats: d*sc rounded to
 * float, then times q - 32, as llama.cpp computes it. */
static void dequant_q6_k(const uint8_t *b, float *y)
{
    const uint8_t *ql = b, *qh = b + 128;
    const int8_t *sc = (const int8_t *)(b + 192);
    float d = load_f16(b + 208);
    for (int e = 0; e < 256; e++) {
        int h = e / 128, r = e % 128, quarter = r / 32, i = r % 32;
        int lo = (ql[64 * h + 32 * (quarter & 1) + i] >> (4 * (quarter >> 1))) & 15;
        int hi = (qh[32 * h + i] >> (2 * quarter)) & 3;
        float scale = d * (float)sc[e / 16];
        y[e] = scale * (float)((lo | hi << 4) - 32);
    }
}

/* ---- rows of each type to and from float ------------------------------------------- */

static void f32_to_f32(const void *src, float *dst, size_t n) { memcpy(dst, src, n * 4); }
static void f32_from_f32(const float *src, void *dst, size_t n) { memcpy(dst, src, n * 4); }

static void f16_to_f32(const void *src, float *dst, size_t n)
{
    const uint16_t *s = src;
    for (size_t i = 0; i < n; i++) dst[i] = q3_f16_to_f32(s[i]);
}

static void f16_from_f32(const float *src, void *dst, size_t n)
{
    uint16_t *d = dst;
    for (size_t i = 0; i < n; i++) d[i] = q3_f32_to_f16(src[i]);
}

static void bf16_to_f32(const void *src, float *dst, size_t n)
{
    const uint16_t *s = src;
    for (size_t i = 0; i < n; i++) dst[i] = q3_bf16_to_f32(s[i]);
}

static void bf16_from_f32(const float *src, void *dst, size_t n)
{
    uint16_t *d = dst;
    for (size_t i = 0; i < n; i++) d[i] = q3_f32_to_bf16(src[i]);
}

static void q8_0_to_f32(const void *src, float *dst, size_t n)
{
    const uint8_t *b = src;
    for (size_t i = 0; i < n; i += Q3_QK_0, b += Q3_Q8_0_BYTES) {
        float d = q3_f16_to_f32((uint16_t)(b[0] | b[1] << 8));
        for (int j = 0; j < Q3_QK_0; j++) dst[i + j] = d * (float)(int8_t)b[2 + j];
    }
}

static void q4_0_to_f32(const void *src, float *dst, size_t n)
{
    const uint8_t *b = src;
    for (size_t i = 0; i < n; i += Q3_QK_0, b += Q3_Q4_0_BYTES) {
        float d = q3_f16_to_f32((uint16_t)(b[0] | b[1] << 8));
        for (int j = 0; j < 16; j++) {
            dst[i + j] = d * (float)((b[2 + j] & 0x0f) - 8);
            dst[i + j + 16] = d * (float)((b[2 + j] >> 4) - 8);
        }
    }
}

static void q4_k_to_f32(const void *src, float *dst, size_t n)
{
    for (size_t i = 0; i < n; i += Q3_QK_K) dequant_q4_k((const uint8_t *)src + i / Q3_QK_K * Q3_Q4_K_BYTES, dst + i);
}

static void q5_k_to_f32(const void *src, float *dst, size_t n)
{
    for (size_t i = 0; i < n; i += Q3_QK_K) dequant_q5_k((const uint8_t *)src + i / Q3_QK_K * Q3_Q5_K_BYTES, dst + i);
}

static void q6_k_to_f32(const void *src, float *dst, size_t n)
{
    for (size_t i = 0; i < n; i += Q3_QK_K) dequant_q6_k((const uint8_t *)src + i / Q3_QK_K * Q3_Q6_K_BYTES, dst + i);
}

/* ---- the table ------------------------------------------------------------------------ */

/* A row; the refusal reasons spelled from the label at compile time. */
#define TRAITS(lower, upper, values, bytes, ggml, to, from)                                            \
    {                                                                                                   \
        .name = lower, .label = upper, .block_values = values, .block_bytes = bytes, .ggml_type = ggml, \
        .to_f32 = to, .from_f32 = from, .no_matmul = "no kernel for " upper " weights",                 \
        .no_norm = "no " upper " norm weights",                                                         \
    }

const q3_type_traits q3_type_traits_table[Q3_DTYPE_COUNT] = {
    [Q3_F32] = TRAITS("f32", "F32", 1, 4, Q3_GGML_F32, f32_to_f32, f32_from_f32),
    [Q3_F16] = TRAITS("f16", "F16", 1, 2, Q3_GGML_F16, f16_to_f32, f16_from_f32),
    [Q3_BF16] = TRAITS("bf16", "BF16", 1, 2, Q3_GGML_BF16, bf16_to_f32, bf16_from_f32),
    [Q3_Q8_0] = TRAITS("q8_0", "Q8_0", Q3_QK_0, Q3_Q8_0_BYTES, Q3_GGML_Q8_0, q8_0_to_f32, q3_quantize_q8_0),
    [Q3_Q4_0] = TRAITS("q4_0", "Q4_0", Q3_QK_0, Q3_Q4_0_BYTES, Q3_GGML_Q4_0, q4_0_to_f32, q3_quantize_q4_0),
    [Q3_Q4_K] = TRAITS("q4_k", "Q4_K", Q3_QK_K, Q3_Q4_K_BYTES, Q3_GGML_Q4_K, q4_k_to_f32, q3_quantize_q4_k),
    [Q3_Q6_K] = TRAITS("q6_k", "Q6_K", Q3_QK_K, Q3_Q6_K_BYTES, Q3_GGML_Q6_K, q6_k_to_f32, q3_quantize_q6_k),
    [Q3_Q5_K] = TRAITS("q5_k", "Q5_K", Q3_QK_K, Q3_Q5_K_BYTES, Q3_GGML_Q5_K, q5_k_to_f32, q3_quantize_q5_k),
};

const char *q3_dtype_name(q3_dtype t)
{
    return (unsigned)t < Q3_DTYPE_COUNT ? q3_type_traits_table[t].name : "?";
}

int q3_dtype_from_name(const char *name)
{
    for (int t = 0; t < Q3_DTYPE_COUNT; t++)
        if (strcasecmp(name, q3_type_traits_table[t].name) == 0) return t;
    return -1;
}

size_t q3_dtype_block_values(q3_dtype t) { return q3_type_traits_table[t].block_values; }
size_t q3_dtype_block_bytes(q3_dtype t) { return q3_type_traits_table[t].block_bytes; }

size_t q3_dtype_row_bytes(q3_dtype t, size_t n)
{
    return n / q3_type_traits_table[t].block_values * q3_type_traits_table[t].block_bytes;
}

void q3_row_to_f32(q3_dtype t, const void *src, float *dst, size_t n)
{
    if ((unsigned)t < Q3_DTYPE_COUNT) q3_type_traits_table[t].to_f32(src, dst, n);
}

void q3_row_from_f32(q3_dtype t, const float *src, void *dst, size_t n)
{
    if ((unsigned)t < Q3_DTYPE_COUNT && q3_type_traits_table[t].from_f32) q3_type_traits_table[t].from_f32(src, dst, n);
}
