/* CPUID/XGETBV feature detection and the physical core count. */
#include "backend/cpu/cpu_features.h"

#include <cpuid.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <sys/syscall.h>
#include <unistd.h>

/* Linux: a process asks once for the AMX tile data state (XFEATURE 18). */
#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18

static q3_cpu_features features;
static pthread_once_t features_once = PTHREAD_ONCE_INIT;

static unsigned long long read_xcr0(void)
{
    unsigned int lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((unsigned long long)hi << 32) | lo;
}

/* Counts distinct (package, core) pairs among the CPUs this process may use;
 * falls back to the online CPU count when sysfs says nothing. */
static int count_physical_cores(void)
{
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) != 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        return n > 0 ? (int)n : 1;
    }
    enum { MAX_CORES = 1024 };
    static long seen[MAX_CORES];
    int n_seen = 0, n_cpus = 0;
    for (int cpu = 0; cpu < CPU_SETSIZE; cpu++) {
        if (!CPU_ISSET(cpu, &set)) continue;
        n_cpus++;
        char path[128];
        long pkg = 0, core = cpu;
        snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu%d/topology/physical_package_id", cpu);
        FILE *f = fopen(path, "r");
        if (f) {
            if (fscanf(f, "%ld", &pkg) != 1) pkg = 0;
            fclose(f);
        }
        snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu%d/topology/core_id", cpu);
        f = fopen(path, "r");
        if (f) {
            if (fscanf(f, "%ld", &core) != 1) core = cpu;
            fclose(f);
        }
        long key = pkg * 65536 + core;
        int dup = 0;
        for (int i = 0; i < n_seen; i++) dup |= seen[i] == key;
        if (!dup && n_seen < MAX_CORES) seen[n_seen++] = key;
    }
    if (n_seen > 0) return n_seen;
    return n_cpus > 0 ? n_cpus : 1;
}

static void detect(void)
{
    q3_cpu_features *f = &features;
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return;
    bool osxsave = c & bit_OSXSAVE;
    f->fma = c & bit_FMA;
    f->f16c = c & bit_F16C;
    if (osxsave) {
        unsigned long long xcr0 = read_xcr0();
        f->os_ymm = (xcr0 & 0x6) == 0x6;             /* SSE + AVX state */
        f->os_zmm = f->os_ymm && (xcr0 & 0xe0) == 0xe0; /* opmask + ZMM_Hi256 + Hi16_ZMM */
    }
    if (__get_cpuid_max(0, NULL) >= 7) {
        __cpuid_count(7, 0, a, b, c, d);
        f->avx2 = b & bit_AVX2;
        f->avx512f = b & bit_AVX512F;
        f->avx512dq = b & bit_AVX512DQ;
        f->avx512bw = b & bit_AVX512BW;
        f->avx512vl = b & bit_AVX512VL;
        f->avx512_vnni = c & bit_AVX512VNNI;
        bool amx_tile = d & (1u << 24), amx_bf16 = d & (1u << 22);
        __cpuid_count(7, 1, a, b, c, d);
        f->avx512_bf16 = a & bit_AVX512BF16;
        if (amx_tile && amx_bf16 && osxsave && (read_xcr0() & 0x60000) == 0x60000)
            f->amx_bf16 = syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
    }
    f->physical_cores = count_physical_cores();
}

const q3_cpu_features *q3_cpu_features_get(void)
{
    pthread_once(&features_once, detect);
    return &features;
}

bool q3_cpu_has_avx2_path(const q3_cpu_features *f)
{
    return f->avx2 && f->fma && f->f16c && f->os_ymm;
}

bool q3_cpu_has_avx512_path(const q3_cpu_features *f)
{
    return q3_cpu_has_avx2_path(f) && f->avx512f && f->avx512bw && f->avx512dq && f->avx512vl && f->avx512_bf16 &&
           f->avx512_vnni && f->os_zmm;
}

bool q3_cpu_has_amx_path(const q3_cpu_features *f) { return q3_cpu_has_avx512_path(f) && f->amx_bf16; }
