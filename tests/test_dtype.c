/* dtype conversions: BF16/F16 round-trips and rounding, block dequantization. */
#include <math.h>
#include <stdint.h>

#include "model/dtype.h"
#include "test.h"

int main(void)
{
    /* BF16: round to nearest even */
    CHECK(q3_f32_to_bf16(1.0f) == 0x3f80, "1.0");
    CHECK(q3_bf16_to_f32(0x3f80) == 1.0f, "1.0 back");
    float halfway = q3_bf16_to_f32(0x3f80) + 0x1p-8f; /* exactly between 0x3f80 and 0x3f81 */
    CHECK(q3_f32_to_bf16(halfway) == 0x3f80, "tie to even");
    CHECK(q3_f32_to_bf16(-2.5f) == 0xc020, "-2.5");
    /* F16 */
    float vals[] = {0.0f, 1.0f, -2.0f, 0.5f, 65504.0f, 0x1p-24f, 0x1p-14f, 3.140625f};
    for (size_t i = 0; i < sizeof vals / sizeof vals[0]; i++)
        CHECK(q3_f16_to_f32(q3_f32_to_f16(vals[i])) == vals[i], "f16 round trip %g", vals[i]);
    CHECK(q3_f32_to_f16(1e6f) == 0x7c00, "overflow to inf");
    CHECK(q3_f32_to_f16(1.0f + 0x1p-11f) == 0x3c00, "f16 tie to even");
    CHECK(isnan(q3_f16_to_f32(q3_f32_to_f16(NAN))), "nan stays nan");
    {
        /* a NaN keeps its sign and the top of its payload, quieted, as F16C's vcvtps2ph writes it */
        uint32_t snan = 0xff800001u, qnan = 0x7fd56000u;
        float a, b;
        memcpy(&a, &snan, 4);
        memcpy(&b, &qnan, 4);
        CHECK(q3_f32_to_f16(a) == 0xfe00, "signalling NaN -> %04x", q3_f32_to_f16(a));
        CHECK(q3_f32_to_f16(b) == 0x7eab, "quiet NaN with payload -> %04x", q3_f32_to_f16(b));
    }
    /* Q8_0 block: scale 0.5, values -3..28 */
    uint8_t blk[34];
    uint16_t d = q3_f32_to_f16(0.5f);
    blk[0] = d & 0xff;
    blk[1] = d >> 8;
    for (int j = 0; j < 32; j++) blk[2 + j] = (uint8_t)(int8_t)(j - 3);
    float out[32];
    q3_row_to_f32(Q3_Q8_0, blk, out, 32);
    CHECK(out[0] == -1.5f && out[31] == 14.0f, "q8_0 %g %g", out[0], out[31]);
    /* Q8_0 rows from floats (the KV cache's): q3_quantize_q8_0's bytes, and back
       within half a step (d / 2) of each value */
    {
        float x[64], y[64];
        uint8_t q[68];
        for (int j = 0; j < 64; j++) x[j] = (float)((j * 37) % 64 - 30) * 0.071f;
        x[5] = 127.0f; /* block 0: amax 127, so d = 1 and halves round away from zero */
        x[6] = 2.5f;
        x[7] = -3.5f;
        q3_row_from_f32(Q3_Q8_0, x, q, 64);
        CHECK(q[0] == 0x00 && q[1] == 0x3c, "q8_0 scale 1.0 -> %02x%02x", q[1], q[0]);
        CHECK((int8_t)q[2 + 5] == 127 && (int8_t)q[2 + 6] == 3 && (int8_t)q[2 + 7] == -4, "q8_0 halves away: %d %d %d",
              (int8_t)q[2 + 5], (int8_t)q[2 + 6], (int8_t)q[2 + 7]);
        q3_row_to_f32(Q3_Q8_0, q, y, 64);
        float d1 = q3_f16_to_f32((uint16_t)(q[34] | q[35] << 8)), worst = 0;
        for (int j = 32; j < 64; j++) worst = fmaxf(worst, fabsf(y[j] - x[j]));
        CHECK(d1 > 0 && worst <= d1 * 0.5f * 1.01f, "q8_0 round trip error %g, step %g", worst, d1);
    }
    /* Q4_0 block: low nibbles are values 0..15, high nibbles 16..31; value = (q-8)*d */
    uint8_t b4[18] = {blk[0], blk[1]};
    for (int j = 0; j < 16; j++) b4[2 + j] = (uint8_t)(j | (15 - j) << 4);
    q3_row_to_f32(Q3_Q4_0, b4, out, 32);
    CHECK(out[0] == -4.0f && out[15] == 3.5f && out[16] == 3.5f && out[31] == -4.0f,
          "q4_0 %g %g %g %g", out[0], out[15], out[16], out[31]);
    CHECK(q3_dtype_row_bytes(Q3_Q4_0, 64) == 36, "row bytes");
    CHECK(q3_dtype_from_name("BF16") == Q3_BF16 && q3_dtype_from_name("x") == -1, "names");
    TEST_DONE();
}
