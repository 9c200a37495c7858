/* The Q8_0 / Q4_0 matmul kernels of the cpu unit (backend/cpu/quant_kernels.h):
 *  - activation quantization: every kernel table writes the same bytes as
 *    the scalar reference (q, c, d), including zero and tiny blocks;
 *  - non-finite activations: a row holding a NaN or an infinity is all NaN
 *    from every table, its neighbours untouched;
 *  - matmul: every table's outputs equal the reference's bit for bit on
 *    random shapes (k a multiple of 32 but not of 256, odd output counts,
 *    ranges that do not start on a panel, 1 and many rows), nothing outside
 *    [o0, o1) written, a GEMV row equal to the same row of a GEMM, and the
 *    same through the unit's MATMUL interface (q3_cpu_mm_quant_*);
 *  - numerics end to end: the weights of the golden small-q8_0 / small-q4_0
 *    models against random activations, compared with the matmul of the
 *    dequantized weights in double: the integer path must equal the
 *    dequantized-activation product to float rounding, and the error against
 *    unrounded activations must be that of 8-bit rounding (within its worst
 *    case bound, and with the rms a uniform rounding error predicts). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu_features.h"
#include "backend/cpu/quant_kernels.h"
#include "model/model.h"
#include "model/quantize.h"
#include "q3.h"
#include "test.h"

static uint64_t rng_state = 0x243f6a8885a308d3ull;

static uint32_t rnd(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 32);
}

static float frand(float lo, float hi) { return lo + (hi - lo) * (float)(rnd() >> 8) * (1.0f / 16777216.0f); }

static float gauss(void)
{
    float u = frand(1e-7f, 1.0f), v = frand(0.0f, 6.2831853f);
    return sqrtf(-2.0f * logf(u)) * cosf(v);
}

static void *xalloc(size_t n)
{
    void *p = aligned_alloc(64, (n + 63) & ~(size_t)63);
    if (!p) abort();
    return p;
}

/* The kernel tables this CPU can run, reference first. */
static const q3_dtype qtypes[] = {Q3_Q8_0, Q3_Q4_0, Q3_Q4_K, Q3_Q5_K, Q3_Q6_K};
#define N_QTYPES (int)(sizeof qtypes / sizeof qtypes[0])

static const q3_quant_kernels *tables[3];
static const q3_cpu_mm_kernels *mm_tables[3];
static int n_tables;

static void find_tables(void)
{
    const q3_cpu_features *f = q3_cpu_features_get();
    tables[n_tables++] = &q3_quant_ref;
    if (q3_cpu_has_avx2_path(f)) {
        mm_tables[n_tables] = &q3_cpu_mm_quant_avx2;
        tables[n_tables++] = &q3_quant_avx2;
    } else {
        SKIP_ISA("avx2", "the AVX2 quant kernels (checked against the reference): not on this CPU");
    }
    if (q3_cpu_has_avx512_path(f)) {
        mm_tables[n_tables] = &q3_cpu_mm_quant_avx512;
        tables[n_tables++] = &q3_quant_avx512;
    } else {
        SKIP_ISA("avx512", "the AVX-512 quant kernels (checked against the reference): not on this CPU");
    }
    printf("kernel tables:");
    for (int i = 0; i < n_tables; i++) printf(" %s", tables[i]->name);
    printf("\n");
}

/* Random activations: mostly N(0,1) scaled per row, with an outlier now and
 * then, an all-zero block and a block of tiny values, and exact ties
 * (x * id landing on .5) from values that are multiples of amax / 254. */
static void random_x(float *x, int rows, int k)
{
    for (int r = 0; r < rows; r++) {
        float scale = frand(0.01f, 4.0f);
        float *xr = x + (size_t)r * k;
        for (int i = 0; i < k; i++) xr[i] = gauss() * scale;
        if (rnd() % 3 == 0) xr[rnd() % k] = scale * 40.0f;
        int nb = k / 32;
        int zb = (int)(rnd() % nb);
        if (rnd() % 2) memset(xr + 32 * zb, 0, 32 * sizeof(float));
        int tb = (int)(rnd() % nb);
        if (rnd() % 3 == 0)
            for (int i = 0; i < 32; i++) xr[32 * tb + i] = 1e-35f * gauss();
        int hb = (int)(rnd() % nb);
        if (rnd() % 2) /* halves: amax = 127 * 2^-4 so id = 16 exactly and i/32 lands on .5 */
            for (int i = 0; i < 32; i++) xr[32 * hb + i] = i == 0 ? 127.0f / 16.0f : (float)((int)(rnd() % 255) - 127) / 32.0f;
    }
}

/* A random [n][k] weight of type t: valid blocks, scales of either sign,
 * Q8_0 bytes over the whole int8 range (-128 included). */
static void *random_w(q3_dtype t, int n, int k, size_t *row_bytes)
{
    *row_bytes = q3_dtype_row_bytes(t, (size_t)k);
    /* exactly the bytes, at an odd address: weights sit unaligned in a mapping,
       and a sanitizer build then sees any read past the end */
    uint8_t *w = (uint8_t *)malloc(*row_bytes * (size_t)n + 1) + 1;
    size_t bb = q3_dtype_block_bytes(t);
    if (q3_is_kquant(t)) { /* random bytes, then finite f16 scales (d, dmin; Q6_K: d at the end) */
        for (size_t i = 0; i < *row_bytes * (size_t)n; i++) w[i] = (uint8_t)rnd();
        for (size_t b = 0; b < (size_t)n * (k / 256); b++) {
            uint8_t *blk = w + b * bb;
            for (int f = 0; f < (t == Q3_Q6_K ? 1 : 2); f++) {
                uint16_t h = q3_f32_to_f16(frand(-0.02f, 0.02f));
                if (rnd() % 50 == 0) h = q3_f32_to_f16(frand(-1e-6f, 1e-6f));
                size_t at = t == Q3_Q6_K ? 208 : 2 * (size_t)f;
                blk[at] = (uint8_t)h;
                blk[at + 1] = (uint8_t)(h >> 8);
            }
        }
        return w;
    }
    for (size_t b = 0; b < (size_t)n * (k / 32); b++) {
        uint8_t *blk = w + b * bb;
        uint16_t h = q3_f32_to_f16(frand(-0.02f, 0.02f));
        if (rnd() % 50 == 0) h = q3_f32_to_f16(frand(-1e-6f, 1e-6f)); /* an f16 subnormal or near it */
        blk[0] = (uint8_t)h;
        blk[1] = (uint8_t)(h >> 8);
        for (size_t i = 2; i < bb; i++) blk[i] = (uint8_t)rnd();
    }
    return w;
}

/* ---- quantization ---------------------------------------------------------------- */

static void test_quantize(void)
{
    static const int shapes[][2] = {{1, 32}, {1, 96}, {3, 160}, {8, 64}, {9, 1056}, {17, 288}, {130, 1024}};
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
        int rows = shapes[s][0], k = shapes[s][1];
        size_t ldx = (size_t)k + 5;
        float *x = xalloc(rows * ldx * sizeof(float));
        random_x(x, rows, (int)ldx); /* ldx, not k: block boundaries shifted against the rows */
        for (int ti = 0; ti < N_QTYPES; ti++) {
            const q3_dtype wt = qtypes[ti];
            size_t bytes = q3_qact_bytes(rows, k);
            char *ref = xalloc(bytes), *got = xalloc(bytes);
            memset(ref, 0x5a, bytes);
            q3_qact qr = q3_qact_carve(ref, rows, k);
            q3_quant_ref.quantize((q3_dtype)wt, x, ldx, &qr, 0, rows);
            for (int t = 1; t < n_tables; t++) {
                memset(got, 0x5a, bytes);
                q3_qact qg = q3_qact_carve(got, rows, k);
                /* in two row ranges, as two threads would */
                tables[t]->quantize(wt, x, ldx, &qg, 0, rows / 2);
                tables[t]->quantize(wt, x, ldx, &qg, rows / 2, rows);
                CHECK(memcmp(ref, got, bytes) == 0, "%s quantize %s rows %d k %d differs from ref", tables[t]->name,
                      q3_dtype_name((q3_dtype)wt), rows, k);
            }
            /* what the reference wrote is the formula of quant_kernels.h */
            int bad = 0;
            for (int r = 0; r < rows; r++)
                for (int b = 0; b < k / 32; b++) {
                    const float *xb = x + (size_t)r * ldx + 32 * b;
                    float amax = 0;
                    for (int i = 0; i < 32; i++) amax = fmaxf(amax, fabsf(xb[i]));
                    const int8_t *q = q3_qact_q(&qr, r, b);
                    int sum = 0, half[2] = {0, 0};
                    for (int i = 0; i < 32; i++) {
                        int want = amax > 0x1p-100f ? (int)nearbyintf(xb[i] * (127.0f / amax)) : 0;
                        if (q[i] != want) bad++;
                        sum += q[i];
                        half[i / 16] += q[i];
                    }
                    float d = amax > 0x1p-100f ? amax / 127.0f : 0.0f;
                    if (*q3_qact_d(&qr, r, b) != d) bad++;
                    int32_t c = *q3_qact_c(&qr, r, b);
                    if (q3_is_kquant(wt) ? (int16_t)(c & 0xffff) != half[0] || c >> 16 != half[1]
                                         : c != -(wt == Q3_Q8_0 ? 128 : 8) * sum)
                        bad++;
                }
            CHECK(bad == 0, "reference quantize %s rows %d k %d: %d values off the formula", q3_dtype_name((q3_dtype)wt),
                  rows, k, bad);
            free(ref);
            free(got);
        }
        free(x);
    }
}

/* ---- matmul against the reference --------------------------------------------------- */

/* Where table kt reads the [n][k] weight w: w itself, or its packed layout
 * (made into *owned, which the caller frees) for tables that pack this type. */
static const void *table_weight(const q3_quant_kernels *kt, q3_dtype wt, const void *w, size_t ws, int n, int k,
                                void **owned)
{
    *owned = NULL;
    size_t bytes = kt->packed_bytes ? kt->packed_bytes(wt, n, k) : 0;
    if (!bytes) return w;
    *owned = aligned_alloc(64, (bytes + 63) & ~(size_t)63);
    if (!*owned) abort();
    /* two ranges, the second starting off a panel boundary is rounded down: packs overlap-free halves */
    int half = n / 2 - n / 2 % kt->granule;
    kt->pack(wt, w, ws, n, k, *owned, 0, half);
    kt->pack(wt, w, ws, n, k, *owned, half, n);
    return *owned;
}

#define SENTINEL (-12345.0f)

/* One shape: every table against the reference, on ranges [o0, o1) cut at
 * awkward places, and the GEMV of each row against its GEMM row. */
static void check_shape(q3_dtype wt, int rows, int n, int k)
{
    size_t ws;
    void *w = random_w(wt, n, k, &ws);
    float *x = xalloc((size_t)rows * k * sizeof(float));
    random_x(x, rows, k);
    char *qbuf = xalloc(q3_qact_bytes(rows, k));
    q3_qact qa = q3_qact_carve(qbuf, rows, k);
    q3_quant_ref.quantize(wt, x, (size_t)k, &qa, 0, rows);

    size_t ldy = (size_t)n + 3;
    float *ref = xalloc((size_t)rows * ldy * sizeof(float)), *got = xalloc((size_t)rows * ldy * sizeof(float));
    q3_quant_ref.matmul(wt, w, ws, &qa, ref, ldy, 0, n, NULL);

    /* a cut that starts off the panel grid, and the rest */
    int cut = n > 1 ? 1 + (int)(rnd() % (unsigned)(n - 1)) : n;
    for (int t = 1; t < n_tables; t++) {
        const q3_quant_kernels *kt = tables[t];
        for (size_t i = 0; i < (size_t)rows * ldy; i++) got[i] = SENTINEL;
        size_t sb = kt->scratch(wt, rows, k);
        void *scratch = sb ? xalloc(sb) : NULL, *packed;
        const void *tw = table_weight(kt, wt, w, ws, n, k, &packed);
        kt->matmul(wt, tw, ws, &qa, got, ldy, 0, cut, scratch);
        kt->matmul(wt, tw, ws, &qa, got, ldy, cut, n, scratch);
        int diff = 0, outside = 0;
        for (int r = 0; r < rows; r++) {
            for (int o = 0; o < n; o++) diff += memcmp(&ref[(size_t)r * ldy + o], &got[(size_t)r * ldy + o], 4) != 0;
            for (size_t o = (size_t)n; o < ldy; o++) outside += got[(size_t)r * ldy + o] != SENTINEL;
        }
        CHECK(diff == 0, "%s %s rows %d n %d k %d (cut %d): %d outputs differ from ref", kt->name, q3_dtype_name(wt),
              rows, n, k, cut, diff);
        CHECK(outside == 0, "%s %s rows %d n %d k %d: %d values written past n", kt->name, q3_dtype_name(wt), rows, n,
              k, outside);
        /* a range in the middle writes only itself */
        if (n >= 5) {
            for (size_t i = 0; i < (size_t)rows * ldy; i++) got[i] = SENTINEL;
            int a = 1 + (int)(rnd() % 3), b = n - 1 - (int)(rnd() % 2);
            kt->matmul(wt, tw, ws, &qa, got, ldy, a, b, scratch);
            int wrong = 0;
            for (int r = 0; r < rows; r++)
                for (int o = 0; o < n; o++) {
                    float v = got[(size_t)r * ldy + o];
                    wrong += (o >= a && o < b) ? memcmp(&v, &ref[(size_t)r * ldy + o], 4) != 0 : v != SENTINEL;
                }
            CHECK(wrong == 0, "%s %s rows %d n %d k %d range [%d,%d): %d wrong", kt->name, q3_dtype_name(wt), rows, n,
                  k, a, b, wrong);
        }
        /* each row as a GEMV, against its row of the GEMM */
        if (rows > 1) {
            char *q1 = xalloc(q3_qact_bytes(1, k));
            float *y1 = xalloc((size_t)n * sizeof(float));
            int gd = 0;
            for (int r = 0; r < rows; r++) {
                q3_qact one = q3_qact_carve(q1, 1, k);
                kt->quantize(wt, x + (size_t)r * k, (size_t)k, &one, 0, 1);
                kt->matmul(wt, tw, ws, &one, y1, (size_t)n, 0, n, NULL);
                for (int o = 0; o < n; o++) gd += memcmp(&y1[o], &ref[(size_t)r * ldy + o], 4) != 0;
            }
            CHECK(gd == 0, "%s %s rows %d n %d k %d: %d GEMV outputs differ from the GEMM's", kt->name,
                  q3_dtype_name(wt), rows, n, k, gd);
            free(q1);
            free(y1);
        }
        free(scratch);
        free(packed);
    }
    free((uint8_t *)w - 1);
    free(x);
    free(qbuf);
    free(ref);
    free(got);
}

static void test_matmul(void)
{
    static const int fixed[][3] = {
        /* rows, n, k */
        {1, 1, 32},   {1, 17, 96},    {1, 33, 1056},  {1, 200, 288}, {2, 16, 64},   {7, 31, 160},
        {8, 48, 256}, {9, 5, 1024},   {16, 40, 512},  {17, 3, 32},   {33, 70, 800}, {128, 37, 1056},
    };
    for (int wt = Q3_Q8_0; wt <= Q3_Q4_0; wt++) {
        for (size_t s = 0; s < sizeof fixed / sizeof *fixed; s++) check_shape((q3_dtype)wt, fixed[s][0], fixed[s][1], fixed[s][2]);
        for (int s = 0; s < 12; s++) {
            int rows = s % 3 == 0 ? 1 : 1 + (int)(rnd() % 40);
            int n = 1 + (int)(rnd() % 90), k = 32 * (1 + (int)(rnd() % 40));
            check_shape((q3_dtype)wt, rows, n, k);
        }
    }
    /* K-quants: k in whole super-blocks */
    static const int kfixed[][3] = {
        {1, 1, 256},  {1, 17, 512},  {1, 33, 1280}, {1, 200, 768}, {2, 16, 256}, {7, 31, 512},
        {8, 48, 256}, {9, 5, 1024},  {16, 40, 512}, {17, 3, 256},  {33, 70, 768}, {40, 37, 1024},
    };
    for (int ti = 2; ti < N_QTYPES; ti++) {
        for (size_t s = 0; s < sizeof kfixed / sizeof *kfixed; s++) check_shape(qtypes[ti], kfixed[s][0], kfixed[s][1], kfixed[s][2]);
        /* every row count of one tile and just past it: the decode GEMV's
           streaming passes (up to 8 rows each) and the GEMM either side of
           where the kernels switch */
        for (int rows = 1; rows <= 18; rows++) check_shape(qtypes[ti], rows, 21, 512);
        for (int s = 0; s < 8; s++) {
            int rows = s % 3 == 0 ? 1 : 1 + (int)(rnd() % 40);
            int n = 1 + (int)(rnd() % 90), k = 256 * (1 + (int)(rnd() % 6));
            check_shape(qtypes[ti], rows, n, k);
        }
    }
}

/* The K-quant reference against the dtype's scalar dequantizer
 * (model/dtype.c, separate code): y must equal sum_i w[o][i] * dx * q[i] in
 * double, with w the dequantized weights, to float rounding (the fold
 * rounds once per block; 1e-5 of sum |w x| is far above that and far below
 * any wrong scale, sign or bit). */
static void test_kquant_numerics(void)
{
    for (int ti = 2; ti < N_QTYPES; ti++) {
        const q3_dtype wt = qtypes[ti];
        const int rows = 3, n = 29, k = 768;
        size_t ws;
        uint8_t *w = random_w(wt, n, k, &ws);
        float *x = xalloc((size_t)rows * k * sizeof(float)), *y = xalloc((size_t)rows * n * sizeof(float));
        float *wf = xalloc((size_t)k * sizeof(float));
        random_x(x, rows, k);
        char *qbuf = xalloc(q3_qact_bytes(rows, k));
        q3_qact qa = q3_qact_carve(qbuf, rows, k);
        q3_quant_ref.quantize(wt, x, (size_t)k, &qa, 0, rows);
        q3_quant_ref.matmul(wt, w, ws, &qa, y, (size_t)n, 0, n, NULL);
        int bad = 0, nonzero = 0;
        double worst = 0;
        for (int o = 0; o < n; o++) {
            q3_row_to_f32(wt, w + (size_t)o * ws, wf, (size_t)k);
            for (int r = 0; r < rows; r++) {
                double sum = 0, mag = 0;
                for (int i = 0; i < k; i++) {
                    double xv = (double)*q3_qact_d(&qa, r, i / 32) * q3_qact_q(&qa, r, i / 32)[i % 32];
                    sum += (double)wf[i] * xv;
                    mag += fabs((double)wf[i] * xv);
                }
                double e = fabs(y[(size_t)r * n + o] - sum) / (mag + 1e-30);
                if (e > worst) worst = e;
                bad += e > 1e-5;
                nonzero += y[(size_t)r * n + o] != 0;
            }
        }
        CHECK(bad == 0 && nonzero > rows * n / 2, "%s reference vs dequantized weights: %d off (worst %.3g), %d nonzero",
              q3_dtype_name(wt), bad, worst, nonzero);
        printf("  %s reference vs dequantized weights: worst %.2e of sum|w x|\n", q3_dtype_name(wt), worst);
        free(w - 1);
        free(x);
        free(y);
        free(wf);
        free(qbuf);
    }
}

/* Through the unit's MATMUL interface: prepare on two "threads" (two
 * scratches), ranges on granule multiples, against the reference. */
static void test_mm_interface(void)
{
    for (int ti = 0; ti < N_QTYPES; ti++) {
        const int wt = qtypes[ti];
        static const int shapes[][3] = {{1, 100, 320}, {21, 45, 224}};
        for (int s = 0; s < 2; s++) {
            int m = shapes[s][0], n = shapes[s][1], k = q3_is_kquant((q3_dtype)wt) ? 256 * (s + 2) : shapes[s][2];
            size_t ws;
            void *w = random_w((q3_dtype)wt, n, k, &ws);
            size_t ldx = (size_t)k + 7, ldy = (size_t)n + 1;
            float *x = xalloc((size_t)m * ldx * sizeof(float));
            random_x(x, m, (int)ldx);
            float *ref = xalloc((size_t)m * ldy * sizeof(float)), *got = xalloc((size_t)m * ldy * sizeof(float));
            char *qbuf = xalloc(q3_qact_bytes(m, k));
            q3_qact qa = q3_qact_carve(qbuf, m, k);
            q3_quant_ref.quantize((q3_dtype)wt, x, ldx, &qa, 0, m);
            q3_quant_ref.matmul((q3_dtype)wt, w, ws, &qa, ref, ldy, 0, n, NULL);
            for (int t = 1; t < n_tables; t++) {
                const q3_cpu_mm_kernels *kt = mm_tables[t];
                q3_cpu_matmul mm = {.w = w, .wtype = (q3_dtype)wt, .w_row_bytes = ws, .x = x, .ldx = ldx, .y = got,
                                    .ldy = ldy, .m = m, .n = n, .k = k};
                void *packed;
                mm.w = table_weight(tables[t], (q3_dtype)wt, w, ws, n, k, &packed);
                size_t sb = kt->scratch(&mm);
                void *s0 = xalloc(sb), *s1 = xalloc(sb);
                int g = kt->granule(&mm);
                kt->prepare(&mm, s0);
                kt->prepare(&mm, s1);
                int item = 0;
                for (int o = 0; o < n; o += g, item++) kt->range(&mm, item % 2 ? s1 : s0, o, o + g < n ? o + g : n);
                int diff = 0;
                for (int r = 0; r < m; r++)
                    diff += memcmp(ref + (size_t)r * ldy, got + (size_t)r * ldy, (size_t)n * sizeof(float)) != 0;
                CHECK(diff == 0, "mm interface of %s, %s m %d n %d k %d: %d rows differ", tables[t]->name,
                      q3_dtype_name((q3_dtype)wt), m, n, k, diff);
                free(s0);
                free(s1);
                free(packed);
            }
            free((uint8_t *)w - 1);
            free(x);
            free(ref);
            free(got);
            free(qbuf);
        }
    }
}

/* ---- non-finite activations -------------------------------------------------------- */

/* A row with a NaN or an infinity comes out all NaN (quant_kernels.h: the
 * poisoned block, q = 0, c = 0, d = NaN) from every table, as quantized bytes
 * equal to the reference's and as outputs; the rows beside it are untouched
 * (bit for bit the reference). Before the rule, the AVX-512 quantizer turned
 * NaN into -128s whose 32-bit sums overflowed (UB under make SAN=1) and every
 * table returned finite, plausible numbers for the row. */
static void test_nonfinite(void)
{
    const float bad[] = {NAN, -NAN, INFINITY, -INFINITY};
    for (int ti = 0; ti < N_QTYPES; ti++) {
        const q3_dtype wt = qtypes[ti];
        const int k = 512, n = 40;
        for (int rows = 5; rows <= 21; rows += 16) { /* a GEMV-sized and a GEMM-sized batch */
            size_t ws;
            void *w = random_w(wt, n, k, &ws);
            float *x = xalloc((size_t)rows * k * sizeof(float));
            random_x(x, rows, k);
            /* rows 0, 2, 3, 4 hold one non-finite value each, at a place that moves */
            for (int r = 0; r < 4; r++) x[(size_t)(r ? r + 1 : 0) * k + (size_t)(rnd() % k)] = bad[r];
            size_t qb = q3_qact_bytes(rows, k), ldy = (size_t)n;
            char *qref = xalloc(qb), *qgot = xalloc(qb);
            float *ref = xalloc((size_t)rows * n * sizeof(float)), *got = xalloc((size_t)rows * n * sizeof(float));
            q3_qact qr = q3_qact_carve(qref, rows, k);
            memset(qref, 0x5a, qb);
            q3_quant_ref.quantize(wt, x, (size_t)k, &qr, 0, rows);
            q3_quant_ref.matmul(wt, w, ws, &qr, ref, ldy, 0, n, NULL);
            int not_nan = 0;
            for (int r = 0; r < rows; r++)
                for (int o = 0; o < n; o++) {
                    bool poisoned = r == 0 || (r >= 2 && r <= 4);
                    not_nan += poisoned ? !isnan(ref[(size_t)r * n + o]) : !isfinite(ref[(size_t)r * n + o]);
                }
            CHECK(not_nan == 0, "ref %s rows %d: %d outputs not NaN in a non-finite row (or not finite elsewhere)",
                  q3_dtype_name(wt), rows, not_nan);
            for (int t = 1; t < n_tables; t++) {
                const q3_quant_kernels *kt = tables[t];
                memset(qgot, 0x5a, qb);
                q3_qact qg = q3_qact_carve(qgot, rows, k);
                kt->quantize(wt, x, (size_t)k, &qg, 0, rows);
                CHECK(memcmp(qref, qgot, qb) == 0, "%s quantize %s with non-finite values differs from ref", kt->name,
                      q3_dtype_name(wt));
                size_t sb = kt->scratch(wt, rows, k);
                void *scratch = sb ? xalloc(sb) : NULL, *packed;
                const void *tw = table_weight(kt, wt, w, ws, n, k, &packed);
                kt->matmul(wt, tw, ws, &qg, got, ldy, 0, n, scratch);
                int diff = 0;
                for (size_t i = 0; i < (size_t)rows * n; i++)
                    diff += isnan(ref[i]) ? !isnan(got[i]) : memcmp(&ref[i], &got[i], 4) != 0;
                CHECK(diff == 0, "%s %s rows %d with non-finite values: %d outputs differ from ref", kt->name,
                      q3_dtype_name(wt), rows, diff);
                free(scratch);
                free(packed);
            }
            free((uint8_t *)w - 1);
            free(x);
            free(qref);
            free(qgot);
            free(ref);
            free(got);
        }
    }
}

/* ---- end to end on the golden quantized models ------------------------------------------ */

typedef struct named_w {
    const char *name;
    const q3_tensor *t;
} named_w;

static void check_weight(const q3_quant_kernels *kt, const char *set, const named_w *nw, int rows)
{
    const q3_tensor *t = nw->t;
    int n = (int)t->shape[0], k = (int)t->shape[1];
    size_t ws = q3_dtype_row_bytes(t->dtype, (size_t)k);
    float *x = xalloc((size_t)rows * k * sizeof(float));
    for (size_t i = 0; i < (size_t)rows * k; i++) x[i] = gauss();
    x[3] = 25.0f; /* an outlier, as hidden states have */
    char *qbuf = xalloc(q3_qact_bytes(rows, k));
    q3_qact qa = q3_qact_carve(qbuf, rows, k);
    kt->quantize(t->dtype, x, (size_t)k, &qa, 0, rows);
    float *y = xalloc((size_t)rows * n * sizeof(float));
    size_t sb = kt->scratch(t->dtype, rows, k);
    void *scratch = sb ? xalloc(sb) : NULL;
    void *packed;
    kt->matmul(t->dtype, table_weight(kt, t->dtype, t->data, ws, n, k, &packed), ws, &qa, y, (size_t)n, 0, n, scratch);
    free(packed);

    float *wrow = xalloc((size_t)k * sizeof(float));
    double worst_exact = 0, worst_bound = 0, se = 0, se_pred = 0, sy = 0;
    for (int o = 0; o < n; o++) {
        q3_row_to_f32(t->dtype, (const char *)t->data + (size_t)o * ws, wrow, (size_t)k);
        for (int r = 0; r < rows; r++) {
            const float *xr = x + (size_t)r * k;
            double yf = 0, yq = 0, mag = 0, bound = 0, var = 0;
            for (int b = 0; b < k / 32; b++) {
                const int8_t *q = q3_qact_q(&qa, r, b);
                double d = *q3_qact_d(&qa, r, b);
                for (int i = 0; i < 32; i++) {
                    double wv = wrow[32 * b + i];
                    yf += wv * xr[32 * b + i];
                    yq += wv * (q[i] * d);
                    mag += fabs(wv * q[i] * d);
                    bound += fabs(wv) * d / 2; /* |x - q d| <= d / 2 */
                    var += wv * wv * d * d / 12; /* uniform rounding error */
                }
            }
            double got = y[(size_t)r * n + o];
            /* the kernel = the product with dequantized activations, to float rounding */
            double e1 = fabs(got - yq) / (mag > 0 ? mag : 1);
            if (e1 > worst_exact) worst_exact = e1;
            /* against unrounded activations: within the rounding bound */
            double e2 = fabs(got - yf) / (bound + 1e-6 * mag + 1e-30);
            if (e2 > worst_bound) worst_bound = e2;
            se += (got - yf) * (got - yf);
            se_pred += var;
            sy += yf * yf;
        }
    }
    double rms_ratio = sqrt(se / se_pred), rel = sqrt(se / sy);
    printf("  %s %-10s %s [%d][%d] x %d rows: vs dequantized-x %.2e (of sum|w x|), vs F32 x: %.3f of the worst case, "
           "rms %.3f of uniform rounding's, rel rms %.2e\n",
           set, nw->name, kt->name, n, k, rows, worst_exact, worst_bound, rms_ratio, rel);
    CHECK(worst_exact < 2e-6, "%s %s %s: %.3e from the dequantized-activation product", set, nw->name, kt->name,
          worst_exact);
    CHECK(worst_bound <= 1.0, "%s %s %s: error %.3f of the 8-bit rounding bound", set, nw->name, kt->name, worst_bound);
    CHECK(rms_ratio > 0.7 && rms_ratio < 1.3, "%s %s %s: rms error %.3f of what 8-bit rounding predicts", set, nw->name,
          kt->name, rms_ratio);
    free(x);
    free(qbuf);
    free(y);
    free(scratch);
    free(wrow);
}

static void test_golden(void)
{
    static const char *const sets[][2] = {{"small-q8_0", "model-q8_0.gguf"}, {"small-q4_0", "model-q4_0.gguf"}};
    for (int s = 0; s < 2; s++) {
        char path[256];
        snprintf(path, sizeof path, TEST_DATA "/golden/%s/%s", sets[s][0], sets[s][1]);
        q3_model *m = NULL;
        q3_status st = q3_model_open(path, &m);
        CHECK(st == Q3_OK, "open %s: %s", path, q3_last_error());
        if (st) continue;
        const q3_layer_weights *L = &m->w.layers[1];
        named_w ws[] = {{"wq", L->wq}, {"wo", L->wo}, {"w_down", L->w_down}, {"lm_head", m->w.lm_head}};
        for (size_t i = 0; i < sizeof ws / sizeof *ws; i++) {
            CHECK(ws[i].t->dtype == (s ? Q3_Q4_0 : Q3_Q8_0), "%s %s is %s", sets[s][0], ws[i].name,
                  q3_dtype_name(ws[i].t->dtype));
            const q3_quant_kernels *kt = tables[n_tables - 1]; /* the fastest; all are bit-identical */
            check_weight(kt, sets[s][0], &ws[i], i % 2 ? 1 : 24);
        }
        q3_model_close(m);
    }
}

int main(void)
{
    find_tables();
    test_quantize();
    test_matmul();
    test_kquant_numerics();
    test_mm_interface();
    test_nonfinite();
    test_golden();
    TEST_DONE();
}
