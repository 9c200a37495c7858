/* K-quants (Q4_K, Q6_K): dequantization of hand-built super-blocks against
 * values worked out here from the format's definition; q3's quantizers
 * (round-trip error, edge cases); GGUF files with Q4_K/Q6_K tensors (read
 * back, other K types still refused); a small Qwen3 in Q4_K/Q6_K (written by
 * q3 convert --type q4_k_m) whose logits on the reference unit equal those of
 * the same weights dequantized to F32 (written by q3 convert); and the planner
 * placing the K-quant ops on the cpu unit. Whether q3's quantizers and mixes
 * are llama-quantize's, byte for byte: tests/test_convert_kquants.c. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend/backend.h"
#include "backend/registry.h"
#include "graph/graph.h"
#include "tools/convert.h"
#include "model/dtype.h"
#include "model/gguf.h"
#include "tools/gguf_write.h"
#include "model/model.h"
#include "model/quantize.h"
#include "tools/synth.h"
#include "plan/plan.h"
#include "q3.h"
#include "temps.h"
#include "test.h"

static char tmpdir[512];

static const char *tmp_path(const char *name)
{
    static char buf[8][256];
    static int next;
    char *p = buf[next++ % 8];
    snprintf(p, sizeof buf[0], "%s/%s", tmpdir, name);
    return p;
}

/* A deterministic stream of pseudo-random numbers (xorshift64*). */
static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static uint32_t rnd(void)
{
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return (uint32_t)((rng_state * 2685821657736338717ull) >> 32);
}
/* Roughly N(0, 1): a sum of 4 uniforms, scaled. */
static float gauss(void)
{
    float s = 0;
    for (int i = 0; i < 4; i++) s += (float)rnd() / 4294967296.0f - 0.5f;
    return s * sqrtf(3.0f);
}

static void put_f16(uint8_t *p, float v)
{
    uint16_t h = q3_f32_to_f16(v);
    p[0] = (uint8_t)h;
    p[1] = (uint8_t)(h >> 8);
}

/* ==== dequantization of hand-built blocks ================================================ */

/* Q4_K: the 12 scale bytes hold sc[j] and m[j] (6 bits each). Written here bit
 * by bit from the definition: for j < 4, sc[j] is bits 0-5 of byte j and m[j]
 * bits 0-5 of byte j+4; for j >= 4, the low 4 bits of sc[j] are bits 0-3 of
 * byte j+4 and its high 2 bits are bits 6-7 of byte j-4; the low 4 bits of
 * m[j] are bits 4-7 of byte j+4 and its high 2 bits bits 6-7 of byte j. */
static void set_bits(uint8_t *b, int byte, int first_bit, int n_bits, int value)
{
    for (int k = 0; k < n_bits; k++)
        if (value >> k & 1) b[byte] |= (uint8_t)(1u << (first_bit + k));
}

static void build_q4_k(uint8_t blk[144], float d, float dmin, const int sc[8], const int m[8], const int q[256])
{
    memset(blk, 0, 144);
    put_f16(blk, d);
    put_f16(blk + 2, dmin);
    uint8_t *s = blk + 4;
    for (int j = 0; j < 8; j++) {
        if (j < 4) {
            set_bits(s, j, 0, 6, sc[j]);
            set_bits(s, j + 4, 0, 6, m[j]);
        } else {
            set_bits(s, j + 4, 0, 4, sc[j] & 15);
            set_bits(s, j - 4, 6, 2, sc[j] >> 4);
            set_bits(s, j + 4, 4, 4, m[j] & 15);
            set_bits(s, j, 6, 2, m[j] >> 4);
        }
    }
    /* 4 groups of 64 values share 32 bytes: the first 32 in the low nibbles */
    for (int g = 0; g < 4; g++)
        for (int i = 0; i < 32; i++)
            blk[16 + 32 * g + i] = (uint8_t)(q[64 * g + i] | q[64 * g + 32 + i] << 4);
}

static void test_q4_k_literal(void)
{
    /* scale bytes chosen by hand; sc and m below worked out on paper */
    static const uint8_t sbytes[12] = {0xC1, 0x42, 0x83, 0x04, 0x45, 0x86, 0xC7, 0x08, 0x9A, 0xBC, 0xDE, 0xF0};
    static const int sc[8] = {1, 2, 3, 4, 58, 28, 46, 0};
    static const int m[8] = {5, 6, 7, 8, 25, 43, 61, 15};
    uint8_t blk[144];
    put_f16(blk, 1.0f);      /* d */
    put_f16(blk + 2, 0.5f);  /* dmin */
    memcpy(blk + 4, sbytes, 12);
    memset(blk + 16, 0x5A, 128); /* low nibble 10 (even sub-blocks), high 5 (odd) */
    float y[256];
    q3_row_to_f32(Q3_Q4_K, blk, y, 256);
    int bad = 0;
    for (int e = 0; e < 256; e++) {
        int j = e / 32, q = j % 2 ? 5 : 10;
        float want = (float)(sc[j] * q) - 0.5f * (float)m[j];
        if (y[e] != want && bad++ < 5) CHECK(0, "q4_k literal [%d] = %g, want %g", e, y[e], want);
    }
    CHECK(bad == 0, "q4_k literal block: %d values differ", bad);
}

static void test_q4_k_random(void)
{
    static const float ds[][2] = {{0.0123f, 0.00457f}, {1.0f, 0.0f}, {-0.25f, 0.75f}, {3.1e-5f, 2.2e-3f}};
    for (size_t c = 0; c < sizeof ds / sizeof ds[0]; c++) {
        int sc[8], m[8], q[256];
        for (int j = 0; j < 8; j++) sc[j] = (int)(rnd() % 64), m[j] = (int)(rnd() % 64);
        sc[c % 8] = 63, m[(c + 3) % 8] = 63; /* the extremes of the 6-bit range */
        for (int i = 0; i < 256; i++) q[i] = (int)(rnd() % 16);
        q[0] = 15, q[255] = 0;
        uint8_t blk[2][144]; /* two super-blocks in a row of 512 */
        build_q4_k(blk[0], ds[c][0], ds[c][1], sc, m, q);
        int sc2[8], m2[8];
        for (int j = 0; j < 8; j++) sc2[j] = 63 - sc[j], m2[j] = 63 - m[j];
        build_q4_k(blk[1], ds[c][1], ds[c][0], sc2, m2, q);
        float y[512];
        q3_row_to_f32(Q3_Q4_K, blk, y, 512);
        int bad = 0;
        for (int b = 0; b < 2; b++) {
            float d = q3_f16_to_f32(q3_f32_to_f16(ds[c][b])), dmin = q3_f16_to_f32(q3_f32_to_f16(ds[c][1 - b]));
            const int *S = b ? sc2 : sc, *M = b ? m2 : m;
            for (int e = 0; e < 256; e++) {
                int j = e / 32;
                /* the value is (d*sc)*q - dmin*m, each product rounded to float */
                float scale = d * (float)S[j], off = dmin * (float)M[j], p = scale * (float)q[e];
                float want = p - off;
                double exact = (double)d * S[j] * q[e] - (double)dmin * M[j];
                if ((y[256 * b + e] != want || fabs(y[256 * b + e] - exact) > 1e-6 * (fabs(exact) + 1e-3)) &&
                    bad++ < 5)
                    CHECK(0, "q4_k case %zu block %d [%d] = %.9g, want %.9g", c, b, e, y[256 * b + e], want);
            }
        }
        CHECK(bad == 0, "q4_k random case %zu: %d values differ", c, bad);
    }
}

/* Q5_K: the header and scales of Q4_K, then qh[32] (value 64g + i has bit 2g
 * of qh[i], value 64g + 32 + i bit 2g + 1), then the low nibbles as Q4_K's. */
static void build_q5_k(uint8_t blk[176], float d, float dmin, const int sc[8], const int m[8], const int q[256])
{
    uint8_t q4[144];
    int lo[256];
    for (int i = 0; i < 256; i++) lo[i] = q[i] & 15;
    build_q4_k(q4, d, dmin, sc, m, lo);
    memset(blk, 0, 176);
    memcpy(blk, q4, 16);
    memcpy(blk + 48, q4 + 16, 128);
    for (int g = 0; g < 4; g++)
        for (int i = 0; i < 32; i++) {
            set_bits(blk + 16, i, 2 * g, 1, q[64 * g + i] >> 4);
            set_bits(blk + 16, i, 2 * g + 1, 1, q[64 * g + 32 + i] >> 4);
        }
}

static void test_q5_k(void)
{
    /* a literal: d 1, dmin 0.5, the scale bytes of the Q4_K literal, low nibbles
       0x5A, qh bytes 0x99 (bits 0, 3, 4, 7: sub-blocks 0, 3, 4, 7 get +16) */
    static const uint8_t sbytes[12] = {0xC1, 0x42, 0x83, 0x04, 0x45, 0x86, 0xC7, 0x08, 0x9A, 0xBC, 0xDE, 0xF0};
    static const int lsc[8] = {1, 2, 3, 4, 58, 28, 46, 0};
    static const int lm[8] = {5, 6, 7, 8, 25, 43, 61, 15};
    uint8_t lit[176];
    put_f16(lit, 1.0f);
    put_f16(lit + 2, 0.5f);
    memcpy(lit + 4, sbytes, 12);
    memset(lit + 16, 0x99, 32);
    memset(lit + 48, 0x5A, 128);
    float yl[256];
    q3_row_to_f32(Q3_Q5_K, lit, yl, 256);
    int bad = 0;
    for (int e = 0; e < 256; e++) {
        int j = e / 32, q = (j % 2 ? 5 : 10) + (j == 0 || j == 3 || j == 4 || j == 7 ? 16 : 0);
        float want = (float)(lsc[j] * q) - 0.5f * (float)lm[j];
        if (yl[e] != want && bad++ < 5) CHECK(0, "q5_k literal [%d] = %g, want %g", e, yl[e], want);
    }
    CHECK(bad == 0, "q5_k literal block: %d values differ", bad);

    static const float ds[][2] = {{0.0123f, 0.00457f}, {1.0f, 0.0f}, {-0.25f, 0.75f}, {3.1e-5f, 2.2e-3f}};
    for (size_t c = 0; c < sizeof ds / sizeof ds[0]; c++) {
        int sc[8], m[8], q[512];
        for (int j = 0; j < 8; j++) sc[j] = (int)(rnd() % 64), m[j] = (int)(rnd() % 64);
        sc[c % 8] = 63, m[(c + 5) % 8] = 63;
        for (int i = 0; i < 512; i++) q[i] = (int)(rnd() % 32);
        q[0] = 31, q[511] = 0, q[300] = 16, q[301] = 15;
        uint8_t blk[2][176];
        build_q5_k(blk[0], ds[c][0], ds[c][1], sc, m, q);
        build_q5_k(blk[1], ds[c][1], ds[c][0], m, sc, q + 256);
        float y[512];
        q3_row_to_f32(Q3_Q5_K, blk, y, 512);
        bad = 0;
        for (int b = 0; b < 2; b++) {
            float d = q3_f16_to_f32(q3_f32_to_f16(ds[c][b])), dmin = q3_f16_to_f32(q3_f32_to_f16(ds[c][1 - b]));
            const int *S = b ? m : sc, *M = b ? sc : m;
            for (int e = 0; e < 256; e++) {
                int j = e / 32;
                float scale = d * (float)S[j], off = dmin * (float)M[j], p = scale * (float)q[256 * b + e];
                float want = p - off;
                if (y[256 * b + e] != want && bad++ < 5)
                    CHECK(0, "q5_k case %zu block %d [%d] = %.9g, want %.9g", c, b, e, y[256 * b + e], want);
            }
        }
        CHECK(bad == 0, "q5_k random case %zu: %d values differ", c, bad);
    }
    CHECK(q3_dtype_block_values(Q3_Q5_K) == 256 && q3_dtype_block_bytes(Q3_Q5_K) == 176, "q5_k block");
    CHECK(q3_dtype_from_name("Q5_K") == Q3_Q5_K && q3_ggml_type_from_dtype(Q3_Q5_K) == 13, "q5_k names");
}

/* Q6_K from 6-bit values L[256] (0..63, value = L - 32): the definition, per
 * half h of 128 values and i < 32: byte ql[64h+i] = L[128h+i] low 4 bits |
 * L[128h+64+i] low 4 bits << 4; ql[64h+32+i] = L[128h+32+i] | L[128h+96+i] << 4
 * (low bits); qh[32h+i] = the top 2 bits of L[128h+i], L[128h+32+i],
 * L[128h+64+i], L[128h+96+i] at bits 0, 2, 4, 6. */
static void build_q6_k(uint8_t blk[210], float d, const int8_t sc[16], const int L[256])
{
    memset(blk, 0, 210);
    for (int h = 0; h < 2; h++)
        for (int i = 0; i < 32; i++) {
            int a = L[128 * h + i], b = L[128 * h + 32 + i], c = L[128 * h + 64 + i], e = L[128 * h + 96 + i];
            blk[64 * h + i] = (uint8_t)((a & 15) | (c & 15) << 4);
            blk[64 * h + 32 + i] = (uint8_t)((b & 15) | (e & 15) << 4);
            blk[128 + 32 * h + i] = (uint8_t)(a >> 4 | (b >> 4) << 2 | (c >> 4) << 4 | (e >> 4) << 6);
        }
    memcpy(blk + 192, sc, 16);
    put_f16(blk + 208, d);
}

static void test_q6_k_literal(void)
{
    /* ql[k] = k, qh all 0xE4 (bits 0-1 = 0, 2-3 = 1, 4-5 = 2, 6-7 = 3), scales
     * +-1..8, d = 0.5. Value 128h + 32t + i (t = 0..3) takes its low nibble
     * from ql[64h + 32(t%2) + i] (low nibble for t < 2, high for t >= 2) and
     * its high 2 bits = t. */
    uint8_t blk[210];
    for (int k = 0; k < 128; k++) blk[k] = (uint8_t)k;
    memset(blk + 128, 0xE4, 64);
    for (int j = 0; j < 16; j++) blk[192 + j] = (uint8_t)(int8_t)(j % 2 ? -(j / 2 + 1) : j / 2 + 1);
    put_f16(blk + 208, 0.5f);
    float y[256];
    q3_row_to_f32(Q3_Q6_K, blk, y, 256);
    int bad = 0;
    for (int h = 0; h < 2; h++)
        for (int t = 0; t < 4; t++)
            for (int i = 0; i < 32; i++) {
                int e = 128 * h + 32 * t + i, byte = 64 * h + 32 * (t % 2) + i;
                int low = t < 2 ? byte & 15 : byte >> 4;
                int q = (low | t << 4) - 32;
                int j = e / 16, s = j % 2 ? -(j / 2 + 1) : j / 2 + 1;
                float want = 0.5f * (float)s * (float)q;
                if (y[e] != want && bad++ < 5) CHECK(0, "q6_k literal [%d] = %g, want %g", e, y[e], want);
            }
    CHECK(bad == 0, "q6_k literal block: %d values differ", bad);
    /* one value by hand: e = 200 = 128 + 64 + 8 (h 1, t 2, i 8): ql[64+8] = 72 =
     * 0x48, high nibble 4; high bits 2: q = 4 | 32 = 36 - 32 = 4; scale j = 12:
     * +7; value 0.5 * 7 * 4 = 14 */
    CHECK(y[200] == 14.0f, "q6_k value 200 = %g, want 14", y[200]);
}

static void test_q6_k_random(void)
{
    static const float ds[] = {0.0123f, -1.5f, 2.9e-6f};
    for (size_t c = 0; c < sizeof ds / sizeof ds[0]; c++) {
        int8_t sc[16];
        int L[256];
        for (int j = 0; j < 16; j++) sc[j] = (int8_t)(rnd() & 0xff);
        sc[0] = -128, sc[15] = 127;
        for (int i = 0; i < 256; i++) L[i] = (int)(rnd() % 64);
        L[1] = 0, L[2] = 63;
        uint8_t blk[210];
        build_q6_k(blk, ds[c], sc, L);
        float y[256], d = q3_f16_to_f32(q3_f32_to_f16(ds[c]));
        q3_row_to_f32(Q3_Q6_K, blk, y, 256);
        int bad = 0;
        for (int e = 0; e < 256; e++) {
            float scale = d * (float)sc[e / 16], want = scale * (float)(L[e] - 32);
            double exact = (double)d * sc[e / 16] * (L[e] - 32);
            if ((y[e] != want || fabs(y[e] - exact) > 1e-6 * fabs(exact)) && bad++ < 5)
                CHECK(0, "q6_k case %zu [%d] = %.9g, want %.9g", c, e, y[e], want);
        }
        CHECK(bad == 0, "q6_k random case %zu: %d values differ", c, bad);
    }
}

static void test_dtype_table(void)
{
    CHECK(q3_dtype_block_values(Q3_Q4_K) == 256 && q3_dtype_block_bytes(Q3_Q4_K) == 144, "q4_k block");
    CHECK(q3_dtype_block_values(Q3_Q6_K) == 256 && q3_dtype_block_bytes(Q3_Q6_K) == 210, "q6_k block");
    CHECK(q3_dtype_row_bytes(Q3_Q4_K, 1024) == 576 && q3_dtype_row_bytes(Q3_Q6_K, 3072) == 2520, "row bytes");
    CHECK(!strcmp(q3_dtype_name(Q3_Q4_K), "q4_k") && !strcmp(q3_dtype_name(Q3_Q6_K), "q6_k"), "names");
    CHECK(q3_dtype_from_name("Q4_K") == Q3_Q4_K && q3_dtype_from_name("q6_k") == Q3_Q6_K, "from name");
    CHECK(q3_ggml_type_from_dtype(Q3_Q4_K) == 12 && q3_ggml_type_from_dtype(Q3_Q6_K) == 14, "ggml codes");
    for (int t = 0; t < Q3_DTYPE_COUNT; t++)
        CHECK(q3_dtype_block_values((q3_dtype)t) > 0 && q3_dtype_block_bytes((q3_dtype)t) > 0 &&
                  strcmp(q3_dtype_name((q3_dtype)t), "?"),
              "dtype %d has a table entry", t);
}

/* ==== quantizers ============================================================================ */

static double rel_rms(const float *a, const float *b, size_t n)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        num += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        den += (double)a[i] * a[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

static void roundtrip(q3_dtype t, const float *x, float *y, size_t n)
{
    uint8_t *q = malloc(q3_dtype_row_bytes(t, n));
    CHECK(q3_quantize(t, x, q, n) == Q3_OK, "quantize %s: %s", q3_dtype_name(t), q3_last_error());
    q3_row_to_f32(t, q, y, n);
    free(q);
}

static void test_quantizers(void)
{
    enum { N = 256 * 64 };
    float *x = malloc(N * sizeof *x), *y = malloc(N * sizeof *y);
    /* weights like a trained model's: N(0, 0.02) with some rows scaled and outliers */
    for (size_t i = 0; i < N; i++) x[i] = 0.02f * gauss() * (i / 1024 % 3 == 1 ? 4.0f : 1.0f);
    for (size_t i = 0; i < N; i += 997) x[i] *= 6.0f;
    roundtrip(Q3_Q4_K, x, y, N);
    double e4 = rel_rms(x, y, N);
    roundtrip(Q3_Q6_K, x, y, N);
    double e6 = rel_rms(x, y, N);
    roundtrip(Q3_Q4_0, x, y, N);
    double e40 = rel_rms(x, y, N);
    roundtrip(Q3_Q8_0, x, y, N);
    double e80 = rel_rms(x, y, N);
    if (getenv("Q3_TEST_VERBOSE"))
        printf("relative RMS error: q4_k %.4f  q4_0 %.4f  q6_k %.4f  q8_0 %.4f\n", e4, e40, e6, e80);
    /* a 4-bit affine code with 32-value sub-blocks: about 0.1 on Gaussian data
     * (llama.cpp's reference quantizer is in the same place); better than Q4_0 */
    CHECK(e4 < 0.11 && e4 < e40, "q4_k round trip: relative RMS error %.4f (q4_0 %.4f)", e4, e40);
    CHECK(e6 < 0.03 && e6 < e4 / 3, "q6_k round trip: relative RMS error %.4f", e6);

    /* Gaussian blocks with a common offset exercise the Q4_K min */
    for (size_t i = 0; i < N; i++) x[i] = 0.5f + 0.1f * gauss();
    roundtrip(Q3_Q4_K, x, y, N);
    /* all-positive sub-blocks: offsets are never positive (llama.cpp's
     * convention), so they are coded from 0 and the error is that of [0, max] */
    CHECK(rel_rms(x, y, N) < 0.03, "q4_k shifted data: %.4f", rel_rms(x, y, N));
    for (size_t i = 0; i < N; i++) x[i] = -0.5f + 0.1f * gauss();
    roundtrip(Q3_Q4_K, x, y, N);
    CHECK(rel_rms(x, y, N) < 0.03, "q4_k negative-shifted data: %.4f", rel_rms(x, y, N));

    /* values a Q4_K block can hold come back (almost) exactly */
    {
        int sc[8], m[8], q[256];
        for (int j = 0; j < 8; j++) sc[j] = 40 + j * 3, m[j] = 20 + j;
        for (int i = 0; i < 256; i++) q[i] = (int)(rnd() % 16);
        for (int j = 0; j < 8; j++) q[32 * j] = 0, q[32 * j + 1] = 15; /* each sub-block spans the range */
        uint8_t blk[144], blk2[144];
        build_q4_k(blk, 0.01f, 0.005f, sc, m, q);
        float v[256], w[256];
        q3_row_to_f32(Q3_Q4_K, blk, v, 256);
        q3_quantize_q4_k(v, blk2, 256);
        q3_row_to_f32(Q3_Q4_K, blk2, w, 256);
        double err = rel_rms(v, w, 256);
        CHECK(err < 0.01, "q4_k representable block: relative error %.5f", err);
    }
    {
        int8_t sc[16];
        int L[256];
        for (int j = 0; j < 16; j++) sc[j] = (int8_t)(j % 2 ? -100 - j : 90 + j);
        for (int i = 0; i < 256; i++) L[i] = (int)(rnd() % 64);
        for (int j = 0; j < 16; j++) L[16 * j] = 0; /* -32 in every sub-block */
        uint8_t blk[210], blk2[210];
        build_q6_k(blk, 0.001f, sc, L);
        float v[256], w[256];
        q3_row_to_f32(Q3_Q6_K, blk, v, 256);
        q3_quantize_q6_k(v, blk2, 256);
        q3_row_to_f32(Q3_Q6_K, blk2, w, 256);
        double err = rel_rms(v, w, 256);
        CHECK(err < 0.01, "q6_k representable block: relative error %.5f", err);
    }

    /* zeros, constants, non-finite values */
    {
        float z[512] = {0}, out[512];
        uint8_t b4[2 * 144], b6[2 * 210];
        q3_quantize_q4_k(z, b4, 512);
        q3_quantize_q6_k(z, b6, 512);
        q3_row_to_f32(Q3_Q4_K, b4, out, 512);
        int nz = 0;
        for (int i = 0; i < 512; i++) nz += out[i] != 0.0f;
        q3_row_to_f32(Q3_Q6_K, b6, out, 512);
        for (int i = 0; i < 512; i++) nz += out[i] != 0.0f;
        CHECK(nz == 0, "zeros stay zeros (%d differ)", nz);
        for (int i = 0; i < 256; i++) z[i] = -0.75f, z[256 + i] = 0.375f;
        q3_quantize_q4_k(z, b4, 512);
        q3_row_to_f32(Q3_Q4_K, b4, out, 512);
        CHECK(rel_rms(z, out, 512) < 0.01, "q4_k constant blocks: %.4f", rel_rms(z, out, 512));
        q3_quantize_q6_k(z, b6, 512);
        q3_row_to_f32(Q3_Q6_K, b6, out, 512);
        CHECK(rel_rms(z, out, 512) < 0.01, "q6_k constant blocks: %.4f", rel_rms(z, out, 512));
        for (int i = 0; i < 256; i++) z[i] = 0.01f * gauss();
        z[3] = NAN, z[77] = INFINITY, z[200] = -INFINITY;
        q3_quantize_q4_k(z, b4, 256);
        q3_quantize_q6_k(z, b6, 256);
        int nonfinite = 0;
        q3_row_to_f32(Q3_Q4_K, b4, out, 256);
        for (int i = 0; i < 256; i++) nonfinite += !isfinite(out[i]);
        q3_row_to_f32(Q3_Q6_K, b6, out, 256);
        for (int i = 0; i < 256; i++) nonfinite += !isfinite(out[i]);
        CHECK(nonfinite == 0 && fabsf(out[3]) < 0.05f, "non-finite input gives finite blocks (%d, %g)", nonfinite,
              out[3]);
    }
    uint8_t junk[144];
    CHECK(q3_quantize(Q3_Q4_K, x, junk, 128) == Q3_ERR_INVALID, "q4_k needs whole super-blocks");
    CHECK_CONTAINS(q3_last_error(), "block size 256");
    free(x);
    free(y);
}

/* ==== GGUF files ============================================================================= */

/* Stores v as k little-endian bytes at b + n; returns n + k. */
static size_t put_le(uint8_t *b, size_t n, uint64_t v, int k)
{
    for (int i = 0; i < k; i++) b[n++] = (uint8_t)(v >> (8 * i));
    return n;
}

static void test_gguf_read(void)
{
    enum { ROWS = 3, COLS = 512 };
    float src[ROWS * COLS];
    for (int i = 0; i < ROWS * COLS; i++) src[i] = 0.05f * gauss();
    uint8_t q4[ROWS * COLS / 256 * 144], q6[ROWS * COLS / 256 * 210];
    q3_quantize(Q3_Q4_K, src, q4, ROWS * COLS);
    q3_quantize(Q3_Q6_K, src, q6, ROWS * COLS);
    q3_gguf_writer *w;
    CHECK(q3_gguf_writer_new(&w) == Q3_OK, "writer");
    const int64_t shape[2] = {ROWS, COLS};
    CHECK(q3_gguf_writer_add_str(w, "general.architecture", "test") == Q3_OK, "kv");
    CHECK(q3_gguf_writer_add_tensor(w, "t.q4_k", Q3_Q4_K, 2, shape, q4) == Q3_OK, "q4_k tensor: %s", q3_last_error());
    CHECK(q3_gguf_writer_add_tensor(w, "t.q6_k", Q3_Q6_K, 2, shape, q6) == Q3_OK, "q6_k tensor: %s", q3_last_error());
    CHECK(q3_gguf_writer_add_tensor(w, "t.bad", Q3_Q4_K, 2, (const int64_t[]){2, 128}, q4) == Q3_ERR_INVALID,
          "rows of 128 are not Q4_K super-blocks");
    const char *path = tmp_path("kq.gguf");
    CHECK(q3_gguf_writer_write(w, path, NULL, NULL) == Q3_OK, "write: %s", q3_last_error());
    q3_gguf_writer_free(w);
    q3_gguf *g;
    CHECK(q3_gguf_open(path, &g) == Q3_OK, "open: %s", q3_last_error());
    if (g) {
        const q3_tensor *a = q3_gguf_find_tensor(g, "t.q4_k"), *b = q3_gguf_find_tensor(g, "t.q6_k");
        CHECK(a && a->dtype == Q3_Q4_K && a->shape[0] == ROWS && a->shape[1] == COLS && a->nbytes == sizeof q4 &&
                  !memcmp(a->data, q4, sizeof q4),
              "q4_k tensor read back");
        CHECK(b && b->dtype == Q3_Q6_K && b->nbytes == sizeof q6 && !memcmp(b->data, q6, sizeof q6),
              "q6_k tensor read back");
        q3_gguf_close(g);
    }
    unlink(path);

    /* a hand-made file: one tensor of a given ggml type and row length */
    struct {
        uint32_t type;
        uint64_t ne0;
        q3_status want;
        const char *msg;
    } cases[] = {
        {12, 256, Q3_OK, ""},
        {14, 512, Q3_OK, ""},
        {12, 128, Q3_ERR_FORMAT, "row length 128 is not a multiple of the q4_k block size 256"},
        {14, 32, Q3_ERR_FORMAT, "row length 32 is not a multiple of the q6_k block size 256"},
        {13, 768, Q3_OK, ""},
        {13, 64, Q3_ERR_FORMAT, "row length 64 is not a multiple of the q5_k block size 256"},
        {10, 256, Q3_ERR_UNSUPPORTED, "ggml type Q2_K (10) is not supported"},
        {11, 256, Q3_ERR_UNSUPPORTED, "ggml type Q3_K (11)"},
        {15, 256, Q3_ERR_UNSUPPORTED, "ggml type Q8_K (15)"},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        uint8_t file[4096] = {0};
        size_t n = 4;
        memcpy(file, "GGUF", 4);
        n = put_le(file, n, 3, 4);            /* version */
        n = put_le(file, n, 1, 8);            /* 1 tensor */
        n = put_le(file, n, 0, 8);            /* no metadata */
        n = put_le(file, n, 1, 8);            /* name "x" */
        file[n++] = 'x';
        n = put_le(file, n, 1, 4);            /* 1 dimension */
        n = put_le(file, n, cases[c].ne0, 8);
        n = put_le(file, n, cases[c].type, 4);
        n = put_le(file, n, 0, 8);            /* offset */
        n = (n + 31) / 32 * 32 + 1024; /* aligned data section, big enough */
        const char *p = tmp_path("one.gguf");
        FILE *f = fopen(p, "wb");
        CHECK(f && fwrite(file, 1, n, f) == n, "write %s", p);
        if (f) fclose(f);
        q3_status st = q3_gguf_open(p, &g);
        CHECK(st == cases[c].want, "type %u, row %llu: status %s, want %s (%s)", cases[c].type,
              (unsigned long long)cases[c].ne0, q3_status_name(st), q3_status_name(cases[c].want), q3_last_error());
        if (st) CHECK_CONTAINS(q3_last_error(), cases[c].msg);
        if (!st) {
            const q3_tensor *t = q3_gguf_tensor_at(g, 0);
            size_t want_bytes = cases[c].ne0 / 256 * (cases[c].type == 12 ? 144 : cases[c].type == 13 ? 176 : 210);
            CHECK(t->nbytes == want_bytes, "nbytes %zu, want %zu", t->nbytes, want_bytes);
            q3_gguf_close(g);
        }
        unlink(p);
    }
}

/* ==== a small Qwen3 in K-quants ================================================================ */

/* hidden 256, intermediate 512: every row is whole super-blocks. Written by
 * q3 convert --type q4_k_m (llama-quantize's mix): Q6_K for the token embedding
 * (the output head, as it is tied) and for attn_v and ffn_down of layer 1 (of
 * 2, a "more bits" layer), Q4_K for every other matrix. */
static void small_config(q3_config *c)
{
    q3_synth_preset_tiny(c);
    c->n_layers = 2;
    c->dim = 256;
    c->ffn_dim = 512;
    c->n_heads = 4;
    c->n_kv_heads = 2;
    c->head_dim = 64;
    c->vocab_size = 320;
    c->max_seq_len = 2048;
}

/* Logits [n][V] of a prefill of tokens[0..n_pre) then decodes of the rest, on unit. */
static float *run(q3_model *m, const int32_t *tokens, int n, int n_pre, const char *unit, const char *kv)
{
    size_t V = (size_t)q3_model_vocab_size(m);
    q3_session_opts o = {.n_ctx = 256, .chunk = 8, .backend = unit, .kv_dtype = kv};
    q3_session *s;
    if (q3_session_new(m, &o, &s)) {
        CHECK(0, "session on %s: %s", unit, q3_last_error());
        return NULL;
    }
    float *out = malloc((size_t)n * V * sizeof(float));
    q3_status st = q3_session_prefill(s, tokens, (size_t)n_pre, out, 1);
    for (int t = n_pre; !st && t < n; t++) st = q3_session_decode(s, tokens[t], out + (size_t)t * V);
    CHECK(st == Q3_OK, "run on %s: %s", unit, q3_last_error());
    q3_session_free(s);
    if (st) {
        free(out);
        return NULL;
    }
    return out;
}

/* Largest |a - b|; infinite if either holds a NaN. */
static float max_abs_diff(const float *a, const float *b, size_t n)
{
    float d = 0;
    for (size_t i = 0; i < n; i++) {
        float e = fabsf(a[i] - b[i]);
        if (isnan(e)) return INFINITY;
        d = fmaxf(d, e);
    }
    return d;
}

static int is_kquant(const q3_tensor *t) { return t && (t->dtype == Q3_Q4_K || t->dtype == Q3_Q6_K); }

/* Places the graph on [cpu, ref] and checks that every op, those with a
 * K-quant weight included, lands on cpu (which now has K-quant kernels and
 * embeds K-quant rows); returns how many K-quant ops there are. */
static int check_plan(const q3_graph *g, const char *what)
{
    const q3_backend *units[] = {&q3_backend_cpu, &q3_backend_ref};
    q3_plan p;
    CHECK(q3_plan_graph(g, units, 2, &p) == Q3_OK, "plan %s: %s", what, q3_last_error());
    int n = 0, off_cpu = 0;
    for (int i = 0; i < g->n_ops; i++) {
        const q3_op *op = &g->ops[i];
        n += is_kquant(op->weight);
        if (p.unit_of[i] != 0 && off_cpu++ < 3)
            CHECK(0, "%s: %s (%s weight) placed on %d, not cpu: %s", what, op->name,
                  op->weight ? q3_dtype_name(op->weight->dtype) : "no", p.unit_of[i],
                  p.refusal[(size_t)i * 2] ? p.refusal[(size_t)i * 2] : "(no reason)");
    }
    CHECK(off_cpu == 0, "%s: %d ops off cpu", what, off_cpu);
    q3_plan_free(&p);
    return n;
}

static void test_model(void)
{
    q3_config cfg;
    small_config(&cfg);
    const char *hf = tmp_path("hf");
    CHECK(q3_synth_write(hf, 7, Q3_F32, &cfg, NULL) == Q3_OK, "synth: %s", q3_last_error());
    q3_model *src = NULL, *kq = NULL, *deq = NULL;
    CHECK(q3_model_open(hf, &src) == Q3_OK, "open synth: %s", q3_last_error());
    if (!src) return;
    const char *kq_path = tmp_path("kq-model.gguf"), *deq_path = tmp_path("deq-model.gguf");
    q3_convert_opts o = {.type = Q3_Q4_K, .kmix = Q3_KMIX_M, .no_tokenizer = 1};
    CHECK(q3_convert_model(src, kq_path, &o) == Q3_OK, "convert to q4_k_m: %s", q3_last_error());
    CHECK(q3_model_open(kq_path, &kq) == Q3_OK, "open K-quant GGUF: %s", q3_last_error());
    if (!kq) goto out;
    const q3_weights *w = &kq->w;
    CHECK(w->embed->dtype == Q3_Q6_K && w->layers[0].wq->dtype == Q3_Q4_K && w->layers[1].wv->dtype == Q3_Q6_K &&
              w->layers[0].wv->dtype == Q3_Q4_K && w->layers[0].w_gate->dtype == Q3_Q4_K &&
              w->layers[0].w_down->dtype == Q3_Q4_K && w->layers[1].w_down->dtype == Q3_Q6_K &&
              w->out_norm->dtype == Q3_F32,
          "the K-quant mix: embed %s, wq %s, wv %s/%s, gate %s, down %s/%s", q3_dtype_name(w->embed->dtype),
          q3_dtype_name(w->layers[0].wq->dtype), q3_dtype_name(w->layers[0].wv->dtype),
          q3_dtype_name(w->layers[1].wv->dtype), q3_dtype_name(w->layers[0].w_gate->dtype),
          q3_dtype_name(w->layers[0].w_down->dtype), q3_dtype_name(w->layers[1].w_down->dtype));

    /* q3 convert from a K-quant source: to the same mix, every tensor is copied
     * as it is; to F32, the dequantized weights, value for value */
    CHECK(q3_convert_model(kq, deq_path, &o) == Q3_OK, "convert K-quant -> q4_k_m: %s", q3_last_error());
    {
        q3_gguf *g2 = NULL;
        size_t same = 0, n_t = q3_gguf_tensor_count(kq->gguf);
        CHECK(q3_gguf_open(deq_path, &g2) == Q3_OK, "open: %s", q3_last_error());
        for (size_t i = 0; g2 && i < n_t; i++) {
            const q3_tensor *a = q3_gguf_tensor_at(kq->gguf, i), *b = q3_gguf_find_tensor(g2, a->name);
            same += b && b->dtype == a->dtype && b->nbytes == a->nbytes && !memcmp(a->data, b->data, a->nbytes);
        }
        CHECK(same == n_t && n_t == 2 + 11 * (size_t)cfg.n_layers, "%zu of %zu tensors copied unchanged", same, n_t);
        q3_gguf_close(g2);
    }
    o.type = Q3_F32;
    CHECK(q3_convert_model(kq, deq_path, &o) == Q3_OK, "convert K-quant -> f32: %s", q3_last_error());
    CHECK(q3_model_open(deq_path, &deq) == Q3_OK, "open dequantized GGUF: %s", q3_last_error());
    if (!deq) goto out;
    {
        const q3_gguf *gk = kq->gguf, *gd = deq->gguf;
        size_t n_t = q3_gguf_tensor_count(gk), mismatched = 0;
        CHECK(n_t == q3_gguf_tensor_count(gd), "same tensors: %zu vs %zu", n_t, q3_gguf_tensor_count(gd));
        for (size_t i = 0; i < n_t; i++) {
            const q3_tensor *a = q3_gguf_tensor_at(gk, i), *b = q3_gguf_find_tensor(gd, a->name);
            size_t numel = q3_tensor_numel(a);
            if (!b || b->dtype != Q3_F32 || q3_tensor_numel(b) != numel) {
                mismatched++;
                continue;
            }
            float *f = malloc(numel * sizeof *f);
            size_t cols = (size_t)a->shape[a->ndim - 1];
            for (size_t r = 0; r < numel / cols; r++)
                q3_row_to_f32(a->dtype, (const char *)a->data + r * q3_dtype_row_bytes(a->dtype, cols), f + r * cols,
                              cols);
            mismatched += memcmp(f, b->data, numel * sizeof *f) != 0;
            free(f);
        }
        CHECK(mismatched == 0, "%zu tensors of the F32 conversion differ from the dequantized weights", mismatched);
    }

    /* logits on ref: the K-quant model equals its dequantized twin */
    enum { NT = 24, NPRE = 17 };
    int32_t toks[NT];
    for (int i = 0; i < NT; i++) toks[i] = (int32_t)((i * 37 + 11) % cfg.vocab_size);
    size_t V = (size_t)cfg.vocab_size, nv = NT * V;
    float *lk = run(kq, toks, NT, NPRE, "ref", "f32"), *ld = run(deq, toks, NT, NPRE, "ref", "f32");
    float *ls = run(src, toks, NT, NPRE, "ref", "f32");
    /* the same source in Q4_0 (q3 convert), for scale */
    const char *q40_path = tmp_path("q4_0-model.gguf");
    q3_model *q40 = NULL;
    o.type = Q3_Q4_0;
    CHECK(q3_convert_model(src, q40_path, &o) == Q3_OK, "convert to q4_0: %s", q3_last_error());
    CHECK(q3_model_open(q40_path, &q40) == Q3_OK, "open q4_0: %s", q3_last_error());
    float *l40 = q40 ? run(q40, toks, NT, NPRE, "ref", "f32") : NULL;
    if (lk && ld && ls && l40) {
        float d = max_abs_diff(lk, ld, nv), range = 0;
        for (size_t i = 0; i < nv; i++) range = fmaxf(range, fabsf(ls[i]));
        float dq = max_abs_diff(lk, ls, nv), d40 = max_abs_diff(l40, ls, nv);
        if (getenv("Q3_TEST_VERBOSE"))
            printf("K-quant vs dequantized F32: %.3g; vs the F32 source: %.3g (Q4_0: %.3g; |logit| <= %.3g)\n", d,
                   dq, d40, range);
        CHECK(d <= 1e-4f, "K-quant logits differ from the dequantized twin's by %g", d);
        /* quantization moves the logits, less than Q4_0 everywhere does */
        CHECK(dq > 0 && dq < d40, "K-quant vs F32 source: %g (Q4_0: %g, range %g)", dq, d40, range);
    }
    free(l40);
    q3_model_close(q40);
    unlink(q40_path);

    /* the cpu unit runs the K-quant ops too (its own kernels, the embedding by q3_row_to_f32) */
    q3_graph pre, dec;
    CHECK(q3_graph_build_prefill(kq, 8, false, &pre) == Q3_OK, "prefill graph");
    CHECK(q3_graph_build_decode(kq, 1, &dec) == Q3_OK, "decode graph");
    if (q3_backend_cpu.present(&q3_backend_cpu)) {
        /* per layer: q, k, v, o, gate, up, down (Q4_K or Q6_K); plus embed and lm_head (Q6_K) */
        int n_pre = check_plan(&pre, "prefill"), n_dec = check_plan(&dec, "decode");
        CHECK(n_pre == 7 * cfg.n_layers + 2 && n_dec == n_pre, "K-quant ops: %d prefill, %d decode", n_pre, n_dec);
        /* and a session on cpu runs close to ref (activations rounded to 8 bits per 32 values) */
        float *lc = run(kq, toks, NT, NPRE, "cpu", "f32");
        if (lc && lk) {
            float d = max_abs_diff(lc, lk, nv);
            if (getenv("Q3_TEST_VERBOSE")) printf("cpu (K-quant kernels) vs ref: %.3g\n", d);
            /* every matmul runs with activations rounded to 8 bits: the golden
               README's bound for such engines is 5e-2 */
            CHECK(d < 5e-2f, "cpu vs ref: %g", d);
        }
        free(lc);
    } else {
        SKIP_ISA("avx2", "the cpu unit is absent: K-quant planner and cpu-vs-ref checks");
    }
    q3_graph_free(&pre);
    q3_graph_free(&dec);
    free(lk);
    free(ld);
    free(ls);
out:
    q3_model_close(src);
    q3_model_close(kq);
    q3_model_close(deq);
    unlink(kq_path);
    unlink(deq_path);
    char p[300];
    snprintf(p, sizeof p, "%s/config.json", hf);
    unlink(p);
    snprintf(p, sizeof p, "%s/model.safetensors", hf);
    unlink(p);
    rmdir(hf);
}

int main(void)
{
    snprintf(tmpdir, sizeof tmpdir, "%s", test_tmpdir());
    test_dtype_table();
    test_q4_k_literal();
    test_q4_k_random();
    test_q6_k_literal();
    test_q6_k_random();
    test_q5_k();
    test_quantizers();
    test_gguf_read();
    test_model();
    rmdir(tmpdir);
    TEST_DONE();
}
