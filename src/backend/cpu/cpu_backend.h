/* Internals of the cpu compute unit that tests and benchmarks look at. */
#ifndef Q3_BACKEND_CPU_BACKEND_H
#define Q3_BACKEND_CPU_BACKEND_H

#include <stdint.h>

#include "backend/backend.h"
#include "backend/cpu/kernels.h"

/* The kernel table in use ("avx512-amx", "avx512-bf16" or "avx2"); starts the unit. */
const q3_cpu_isa *q3_cpu_isa_current(void);

/* Switches the kernel table ("amx", "avx512", "avx2"); for tests and benchmarks
 * only, never while an op runs. Returns 0, or -1 if the CPU lacks the ISA. */
int q3_cpu_force_isa(const char *name);

/* Threads of the pool (physical cores, or $Q3_THREADS). */
int q3_cpu_threads(void);

/* Counters since start-up. Each pool job ends in a barrier (the caller
 * waits for every claimed item); ops run inline on the calling thread need
 * none. */
typedef struct q3_cpu_stats {
    uint64_t ops;        /* ops run by the unit */
    uint64_t pool_jobs;  /* ops (or phases of an op) spread over the pool: barriers */
} q3_cpu_stats;
q3_cpu_stats q3_cpu_get_stats(void);

#endif
