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
    Q3_DTYPE_COUNT
} q3_dtype;

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

/* Converts n values of a row starting at src (of type t) to float. */
void q3_row_to_f32(q3_dtype t, const void *src, float *dst, size_t n);
/* Stores n floats into a row of type t (F32, F16 or BF16 only). */
void q3_row_from_f32(q3_dtype t, const float *src, void *dst, size_t n);

#endif
