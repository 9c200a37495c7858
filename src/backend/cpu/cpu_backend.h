/* Internals of the cpu compute unit that tests and benchmarks look at. */
#ifndef Q3_BACKEND_CPU_BACKEND_H
#define Q3_BACKEND_CPU_BACKEND_H

#include <stdint.h>

#include "backend/backend.h"
#include "backend/cpu/kernels.h"

/* Threads a unit opened with n_threads = 0 gets: one per physical core, or $Q3_THREADS. */
int q3_cpu_default_threads(void);
/* The kernel table a new unit starts with ("avx512-amx", "avx512-bf16" or "avx2"). */
const char *q3_cpu_default_isa_name(void);

/* The kernel table an open cpu unit uses. */
const q3_cpu_isa *q3_cpu_unit_isa(const q3_unit *u);

/* Switches an open cpu unit's kernel table ("amx", "avx512", "avx2"); for
 * tests and benchmarks, never while an op runs. Returns 0, or -1 if the CPU
 * lacks the ISA. */
int q3_cpu_unit_force_isa(q3_unit *u, const char *name);

/* Counters of an open cpu unit. Each pool job ends in a barrier (the caller
 * waits for every claimed item); ops run inline on the calling thread need
 * none. */
typedef struct q3_cpu_stats {
    uint64_t ops;        /* ops run by the unit */
    uint64_t pool_jobs;  /* ops (or phases of an op) spread over the pool: barriers */
} q3_cpu_stats;
q3_cpu_stats q3_cpu_unit_stats(const q3_unit *u);

#endif
