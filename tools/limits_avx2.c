/* AVX2 kernels of the limit microbenchmarks (see limits.h). */
#include <immintrin.h>

#include "tools/limits.h"

unsigned long long q3_limits_read_avx2(const void *p, size_t bytes, int streams, size_t prefetch)
{
    const size_t part = bytes / (size_t)streams / 128 * 128;
    const char *b = p;
    __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
    for (size_t i = 0; i < part; i += 128) {
        for (int s = 0; s < streams; s++) {
            const char *q = b + (size_t)s * part + i;
            if (prefetch && i + prefetch < part) _mm_prefetch(q + prefetch, _MM_HINT_T0);
            a0 = _mm256_xor_si256(a0, _mm256_load_si256((const __m256i *)q));
            a1 = _mm256_xor_si256(a1, _mm256_load_si256((const __m256i *)(q + 32)));
            a2 = _mm256_xor_si256(a2, _mm256_load_si256((const __m256i *)(q + 64)));
            a3 = _mm256_xor_si256(a3, _mm256_load_si256((const __m256i *)(q + 96)));
        }
    }
    __m256i x = _mm256_xor_si256(_mm256_xor_si256(a0, a1), _mm256_xor_si256(a2, a3));
    unsigned long long out[4];
    _mm256_storeu_si256((__m256i *)out, x);
    return out[0] ^ out[1] ^ out[2] ^ out[3];
}

double q3_limits_fma_avx2(long iters)
{
    __m256 a[12];
    for (int i = 0; i < 12; i++) a[i] = _mm256_set1_ps(1.0f + (float)i * 1e-3f);
    const __m256 m = _mm256_set1_ps(0.99999994f), c = _mm256_set1_ps(1e-7f);
    for (long it = 0; it < iters; it++) {
        for (int i = 0; i < 12; i++) a[i] = _mm256_fmadd_ps(a[i], m, c);
        __asm__ volatile("" : "+x"(a[0]), "+x"(a[1]), "+x"(a[2]), "+x"(a[3]));
    }
    __m256 s = a[0];
    for (int i = 1; i < 12; i++) s = _mm256_add_ps(s, a[i]);
    float out[8];
    _mm256_storeu_ps(out, s);
    volatile float sink = out[0];
    (void)sink;
    return (double)iters * 12 * 8 * 2;
}
