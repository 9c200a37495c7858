/* The machine's limits, measured by q3's own microbenchmarks, so benchmarks
 * can report kernels as a fraction of what the hardware can do:
 *  - memory read bandwidth (a buffer far larger than the caches, streamed);
 *  - peak F32 FMA, BF16 dot product (vdpbf16ps), INT8 dot product
 *    (vpdpbusd) and AMX BF16 tile (TDPBF16PS) throughput, from independent
 *    chains of one instruction.
 * Each runs on n_threads threads started together; timing is wall clock
 * from the common start to the last thread's end, best of a few passes. */
#ifndef Q3_BACKEND_CPU_LIMITS_H
#define Q3_BACKEND_CPU_LIMITS_H

#include <stddef.h>

typedef enum q3_limit_kind {
    Q3_LIMIT_FMA_F32,   /* GFLOP/s: vfmadd231ps, 2 FLOP per lane */
    Q3_LIMIT_DOT_BF16,  /* GFLOP/s: vdpbf16ps, 2 products of 2 FLOP per 32-bit lane */
    Q3_LIMIT_DOT_INT8,  /* GOP/s:   vpdpbusd, 4 products of 2 OP per 32-bit lane */
    Q3_LIMIT_AMX_BF16,  /* GFLOP/s: TDPBF16PS, 16 x 16 x 32 multiply-adds per instruction */
    Q3_LIMIT_KIND_COUNT
} q3_limit_kind;

const char *q3_limit_kind_name(q3_limit_kind k);

/* Read bandwidth in GB/s (1e9 bytes/s): n_threads threads each read their
 * slice of a `bytes` buffer (its pages faulted in, and transparent huge pages
 * asked for, before timing), by each of a few read kernels: 1 to 8
 * interleaved streams per thread, with and without software prefetch at a
 * few distances; the best kernel's best of `passes` (a weight-streaming
 * kernel that reads several rows at once with prefetch is measured against
 * the best the machine gives such a pattern, not against one plain stream).
 * Returns a negative value if the buffer cannot be allocated. */
double q3_limit_read_gbs(int n_threads, size_t bytes, int passes);
/* The same; also names the winning kernel ("4 streams, prefetch 1024") in
 * desc (of desc_size bytes) when desc is not NULL. */
double q3_limit_read_gbs_desc(int n_threads, size_t bytes, int passes, char *desc, size_t desc_size);

/* Peak throughput of kind on n_threads threads, each running about `seconds`
 * (best of 3). GFLOP/s, or GOP/s for INT8; 0 if this CPU lacks the
 * instruction. Names the instruction set used in *isa if isa is not NULL. */
double q3_limit_peak(q3_limit_kind kind, int n_threads, double seconds, const char **isa);

/* ---- the kernels (per-ISA files) ---- */
/* Reads bytes from p (64-byte aligned) as `streams` contiguous parts side by
 * side (the tail beyond a multiple of streams * 128 bytes is skipped),
 * prefetching `prefetch` bytes ahead in each when prefetch > 0; returns a
 * checksum. */
unsigned long long q3_limits_read_avx512(const void *p, size_t bytes, int streams, size_t prefetch);
unsigned long long q3_limits_read_avx2(const void *p, size_t bytes, int streams, size_t prefetch);
/* Runs iters iterations of 16 independent chains of the instruction; returns
 * the operations done (FLOP or OP). */
double q3_limits_fma_avx512(long iters);
double q3_limits_bf16_avx512(long iters);
double q3_limits_int8_avx512(long iters);
double q3_limits_fma_avx2(long iters);
double q3_limits_amx_bf16(long iters);

#endif
