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
 * multiple of t's block size (32 for Q8_0/Q4_0, 256 for Q4_K/Q5_K/Q6_K). */
void q3_row_to_f32(q3_dtype t, const void *src, float *dst, size_t n);
/* Stores n floats into a row of type t (F32, F16 or BF16 only). */
void q3_row_from_f32(q3_dtype t, const float *src, void *dst, size_t n);

#endif
