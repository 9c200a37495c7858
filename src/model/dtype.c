#include "model/dtype.h"

#include <math.h>
#include <strings.h>

static const struct {
    const char *name;
    size_t block_values, block_bytes;
} dtype_info[Q3_DTYPE_COUNT] = {
    [Q3_F32] = {"f32", 1, 4},
    [Q3_F16] = {"f16", 1, 2},
    [Q3_BF16] = {"bf16", 1, 2},
    [Q3_Q8_0] = {"q8_0", 32, 34},
    [Q3_Q4_0] = {"q4_0", 32, 18},
    [Q3_Q4_K] = {"q4_k", 256, 144},
    [Q3_Q6_K] = {"q6_k", 256, 210},
    [Q3_Q5_K] = {"q5_k", 256, 176},
};

const char *q3_dtype_name(q3_dtype t)
{
    return (unsigned)t < Q3_DTYPE_COUNT ? dtype_info[t].name : "?";
}

int q3_dtype_from_name(const char *name)
{
    for (int t = 0; t < Q3_DTYPE_COUNT; t++)
        if (strcasecmp(name, dtype_info[t].name) == 0) return t;
    return -1;
}

size_t q3_dtype_block_values(q3_dtype t) { return dtype_info[t].block_values; }
size_t q3_dtype_block_bytes(q3_dtype t) { return dtype_info[t].block_bytes; }

size_t q3_dtype_row_bytes(q3_dtype t, size_t n)
{
    return n / dtype_info[t].block_values * dtype_info[t].block_bytes;
}

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

void q3_row_to_f32(q3_dtype t, const void *src, float *dst, size_t n)
{
    switch (t) {
    case Q3_F32:
        memcpy(dst, src, n * 4);
        break;
    case Q3_F16: {
        const uint16_t *s = src;
        for (size_t i = 0; i < n; i++) dst[i] = q3_f16_to_f32(s[i]);
        break;
    }
    case Q3_BF16: {
        const uint16_t *s = src;
        for (size_t i = 0; i < n; i++) dst[i] = q3_bf16_to_f32(s[i]);
        break;
    }
    case Q3_Q8_0: {
        const uint8_t *b = src;
        for (size_t i = 0; i < n; i += 32, b += 34) {
            float d = q3_f16_to_f32((uint16_t)(b[0] | b[1] << 8));
            for (int j = 0; j < 32; j++) dst[i + j] = d * (float)(int8_t)b[2 + j];
        }
        break;
    }
    case Q3_Q4_0: {
        const uint8_t *b = src;
        for (size_t i = 0; i < n; i += 32, b += 18) {
            float d = q3_f16_to_f32((uint16_t)(b[0] | b[1] << 8));
            for (int j = 0; j < 16; j++) {
                dst[i + j] = d * (float)((b[2 + j] & 0x0f) - 8);
                dst[i + j + 16] = d * (float)((b[2 + j] >> 4) - 8);
            }
        }
        break;
    }
    case Q3_Q4_K:
        for (size_t i = 0; i < n; i += 256) dequant_q4_k((const uint8_t *)src + i / 256 * 144, dst + i);
        break;
    case Q3_Q6_K:
        for (size_t i = 0; i < n; i += 256) dequant_q6_k((const uint8_t *)src + i / 256 * 210, dst + i);
        break;
    case Q3_Q5_K:
        for (size_t i = 0; i < n; i += 256) dequant_q5_k((const uint8_t *)src + i / 256 * 176, dst + i);
        break;
    default:
        break;
    }
}

void q3_row_from_f32(q3_dtype t, const float *src, void *dst, size_t n)
{
    switch (t) {
    case Q3_F32:
        memcpy(dst, src, n * 4);
        break;
    case Q3_F16: {
        uint16_t *d = dst;
        for (size_t i = 0; i < n; i++) d[i] = q3_f32_to_f16(src[i]);
        break;
    }
    case Q3_BF16: {
        uint16_t *d = dst;
        for (size_t i = 0; i < n; i++) d[i] = q3_f32_to_bf16(src[i]);
        break;
    }
    default:
        break;
    }
}
