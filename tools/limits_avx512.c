/* AVX-512 kernels of the limit microbenchmarks (see limits.h). */
#include <immintrin.h>

#include "tools/limits.h"

unsigned long long q3_limits_read_avx512(const void *p, size_t bytes, int streams, size_t prefetch)
{
    /* streams contiguous parts of part bytes, read side by side, 128 bytes of
       each per step; prefetch > 0: each part's line prefetch bytes ahead too */
    const size_t part = bytes / (size_t)streams / 128 * 128;
    const char *b = p;
    __m512i a0 = _mm512_setzero_si512(), a1 = a0;
    for (size_t i = 0; i < part; i += 128) {
        for (int s = 0; s < streams; s++) {
            const char *q = b + (size_t)s * part + i;
            if (prefetch && i + prefetch < part) _mm_prefetch(q + prefetch, _MM_HINT_T0);
            a0 = _mm512_xor_si512(a0, _mm512_load_si512(q));
            a1 = _mm512_xor_si512(a1, _mm512_load_si512(q + 64));
        }
    }
    return (unsigned long long)_mm512_reduce_add_epi64(_mm512_xor_si512(a0, a1));
}

/* 16 independent chains in named registers: enough to cover a 4-5 cycle
 * latency at 2 per cycle with room to spare. */
#define CHAINS(OP) OP(0) OP(1) OP(2) OP(3) OP(4) OP(5) OP(6) OP(7) OP(8) OP(9) OP(10) OP(11) OP(12) OP(13) OP(14) OP(15)
#define KEEP(T)                                                                                              \
    __asm__ volatile("" : "+v"(T##0), "+v"(T##1), "+v"(T##2), "+v"(T##3), "+v"(T##4), "+v"(T##5), "+v"(T##6), \
                     "+v"(T##7));                                                                            \
    __asm__ volatile("" : "+v"(T##8), "+v"(T##9), "+v"(T##10), "+v"(T##11), "+v"(T##12), "+v"(T##13),        \
                     "+v"(T##14), "+v"(T##15))

double q3_limits_fma_avx512(long iters)
{
#define DECL(i) __m512 a##i = _mm512_set1_ps(1.0f + (float)(i) * 1e-3f);
    CHAINS(DECL)
#undef DECL
    const __m512 m = _mm512_set1_ps(0.99999994f), c = _mm512_set1_ps(1e-7f);
    for (long it = 0; it < iters; it++) {
#define FMA(i) a##i = _mm512_fmadd_ps(a##i, m, c);
        CHAINS(FMA)
#undef FMA
        KEEP(a);
    }
    __m512 s = _mm512_setzero_ps();
#define SUM(i) s = _mm512_add_ps(s, a##i);
    CHAINS(SUM)
#undef SUM
    volatile float sink = _mm512_reduce_add_ps(s);
    (void)sink;
    return (double)iters * 16 * 16 * 2;
}

double q3_limits_bf16_avx512(long iters)
{
#define DECL(i) __m512 a##i = _mm512_setzero_ps();
    CHAINS(DECL)
#undef DECL
    __m512bh x = _mm512_cvtne2ps_pbh(_mm512_set1_ps(1e-3f), _mm512_set1_ps(2e-3f));
    __m512bh y = _mm512_cvtne2ps_pbh(_mm512_set1_ps(3e-3f), _mm512_set1_ps(1e-3f));
    for (long it = 0; it < iters; it++) {
#define DOT(i) a##i = _mm512_dpbf16_ps(a##i, x, y);
        CHAINS(DOT)
#undef DOT
        KEEP(a);
    }
    __m512 s = _mm512_setzero_ps();
#define SUM(i) s = _mm512_add_ps(s, a##i);
    CHAINS(SUM)
#undef SUM
    volatile float sink = _mm512_reduce_add_ps(s);
    (void)sink;
    return (double)iters * 16 * 16 * 4;
}

double q3_limits_int8_avx512(long iters)
{
#define DECL(i) __m512i a##i = _mm512_setzero_si512();
    CHAINS(DECL)
#undef DECL
    const __m512i x = _mm512_set1_epi8(3), y = _mm512_set1_epi8(-2);
    for (long it = 0; it < iters; it++) {
#define DOT(i) a##i = _mm512_dpbusd_epi32(a##i, x, y);
        CHAINS(DOT)
#undef DOT
        KEEP(a);
    }
    __m512i s = _mm512_setzero_si512();
#define SUM(i) s = _mm512_add_epi32(s, a##i);
    CHAINS(SUM)
#undef SUM
    volatile int sink = _mm_cvtsi128_si32(_mm512_castsi512_si128(s)); /* no C arithmetic: the sums wrap */
    (void)sink;
    return (double)iters * 16 * 16 * 8;
}
