/* The machine's limits by q3's own microbenchmarks: memory read bandwidth
 * and peak F32 FMA / BF16 dot / INT8 dot / AMX BF16 throughput, on one thread and on
 * all of the cpu unit's threads (tools/limits.h).
 *
 *   build/bench/bench_limits [--mib N] [--seconds S] [--threads T]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_features.h"
#include "tools/limits.h"

int main(int argc, char **argv)
{
    size_t mib = 1024;
    double seconds = 0.3;
    int threads = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--mib") && i + 1 < argc) mib = (size_t)atol(argv[++i]);
        else if (!strcmp(argv[i], "--seconds") && i + 1 < argc) seconds = atof(argv[++i]);
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc) threads = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: %s [--mib N] [--seconds S] [--threads T]\n", argv[0]);
            return 2;
        }
    }
    const q3_cpu_features *f = q3_cpu_features_get();
    if (threads <= 0) threads = q3_cpu_default_threads();
    printf("cpu: %d physical cores, amx %s, avx512 path %s, avx2 path %s; measuring on 1 and %d threads\n",
           f->physical_cores, q3_cpu_has_amx_path(f) ? "yes" : "no", q3_cpu_has_avx512_path(f) ? "yes" : "no",
           q3_cpu_has_avx2_path(f) ? "yes" : "no", threads);
    printf("%-28s %12s %12s\n", "limit", "1 thread", "all threads");
    /* read bandwidth per thread count, with the read kernel that won */
    for (int n = 1; n <= threads; n++) {
        char desc[64];
        double bw = q3_limit_read_gbs_desc(n, mib << 20, 3, desc, sizeof desc);
        printf("memory read, %2d thread%s     %12.1f GB/s   (%zu MiB buffer; best kernel: %s)\n", n, n > 1 ? "s" : " ",
               bw, mib, desc);
    }
    for (int k = 0; k < Q3_LIMIT_KIND_COUNT; k++) {
        const char *isa;
        double p1 = q3_limit_peak((q3_limit_kind)k, 1, seconds, &isa);
        double pn = q3_limit_peak((q3_limit_kind)k, threads, seconds, &isa);
        char name[64];
        snprintf(name, sizeof name, "peak %s (%s)", q3_limit_kind_name((q3_limit_kind)k), isa);
        printf("%-28s %12.1f %12.1f   (%s)\n", name, p1, pn, k == Q3_LIMIT_DOT_INT8 ? "GOP/s" : "GFLOP/s");
    }
    return 0;
}
