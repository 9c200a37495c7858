/* What the CPU (and the OS) let the cpu unit use, read once from CPUID/XGETBV. */
#ifndef Q3_BACKEND_CPU_FEATURES_H
#define Q3_BACKEND_CPU_FEATURES_H

#include <stdbool.h>

typedef struct q3_cpu_features {
    bool avx2, fma, f16c;                 /* the AVX2 path needs all three */
    bool avx512f, avx512bw, avx512dq, avx512vl;
    bool avx512_bf16;                     /* vdpbf16ps, vcvtne2ps2bf16 */
    bool avx512_vnni;                     /* vpdpbusd */
    bool amx_bf16;                        /* AMX tiles with TDPBF16PS, and the OS let this process use them */
    bool os_ymm, os_zmm;                  /* XCR0 says the OS saves YMM / ZMM state */
    int physical_cores;                   /* cores this process may run on (SMT siblings counted once) */
} q3_cpu_features;

/* The features of this machine (computed once, thread-safe). */
const q3_cpu_features *q3_cpu_features_get(void);

/* True when the AVX2 path can run: AVX2 + FMA + F16C and YMM state enabled. */
bool q3_cpu_has_avx2_path(const q3_cpu_features *f);
/* True when the AVX-512 path can run: F/BW/DQ/VL + BF16 + VNNI and ZMM state enabled. */
bool q3_cpu_has_avx512_path(const q3_cpu_features *f);
/* True when the AVX-512 path can also use AMX for BF16 matmuls. */
bool q3_cpu_has_amx_path(const q3_cpu_features *f);

#endif
