/* Drivers of the limit microbenchmarks: threads started together on a
 * spin barrier, wall-clock timing, best of several passes (see limits.h). */
#include "tools/limits.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "backend/cpu/cpu_features.h"

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

const char *q3_limit_kind_name(q3_limit_kind k)
{
    static const char *const names[] = {"fma_f32", "dot_bf16", "dot_int8", "amx_bf16"};
    return (unsigned)k < Q3_LIMIT_KIND_COUNT ? names[k] : "?";
}

/* ---- running a function on n threads at once -------------------------------------- */

typedef struct team {
    int n;
    _Atomic int arrived;
    void (*fn)(struct team *t, int ith);
    /* what the threads work on */
    const char *buf;
    size_t slice;
    int streams;      /* read kernel: streams per thread, prefetch distance */
    size_t prefetch;
    long iters;
    q3_limit_kind kind;
    _Atomic unsigned long long sink;
    double t_start, t_end[256];
    double ops[256];              /* operations each thread did (peak runs) */
} team;

typedef struct member {
    team *t;
    int ith;
} member;

static void *member_main(void *arg)
{
    member *m = arg;
    team *t = m->t;
    atomic_fetch_add(&t->arrived, 1);
    while (atomic_load(&t->arrived) < t->n) {
    }
    if (m->ith == 0) t->t_start = now();
    t->fn(t, m->ith);
    t->t_end[m->ith] = now();
    return NULL;
}

/* Runs t->fn on t->n threads; returns the wall time from the start to the last end. */
static double run_team(team *t)
{
    pthread_t th[256];
    member mem[256];
    atomic_store(&t->arrived, 0);
    for (int i = 1; i < t->n; i++) {
        mem[i] = (member){t, i};
        if (pthread_create(&th[i], NULL, member_main, &mem[i]) != 0) t->n = i;
    }
    mem[0] = (member){t, 0};
    member_main(&mem[0]);
    double end = t->t_end[0];
    for (int i = 1; i < t->n; i++) {
        pthread_join(th[i], NULL);
        if (t->t_end[i] > end) end = t->t_end[i];
    }
    return end - t->t_start;
}

/* ---- bandwidth ------------------------------------------------------------------------- */

static void read_slice(team *t, int ith)
{
    const char *p = t->buf + (size_t)ith * t->slice;
    const q3_cpu_features *f = q3_cpu_features_get();
    unsigned long long s = q3_cpu_has_avx512_path(f) ? q3_limits_read_avx512(p, t->slice, t->streams, t->prefetch)
                                                     : q3_limits_read_avx2(p, t->slice, t->streams, t->prefetch);
    atomic_fetch_xor(&t->sink, s);
}

/* The read kernels tried: streams per thread, prefetch distance in bytes. */
static const struct {
    int streams;
    size_t prefetch;
} read_kinds[] = {{1, 0}, {1, 1024}, {2, 2048}, {4, 0}, {4, 1024}, {8, 512}, {8, 2048}};

double q3_limit_read_gbs_desc(int n_threads, size_t bytes, int passes, char *desc, size_t desc_size)
{
    if (n_threads < 1) n_threads = 1;
    if (n_threads > 256) n_threads = 256;
    size_t slice = bytes / (size_t)n_threads / (8 * 4096) * (8 * 4096); /* whole pages for every stream count */
    if (slice == 0) return -1;
    char *buf = aligned_alloc(1 << 21, (slice * (size_t)n_threads + (1 << 21) - 1) & ~(size_t)((1 << 21) - 1));
    if (!buf) return -1;
#ifdef MADV_HUGEPAGE
    madvise(buf, slice * (size_t)n_threads, MADV_HUGEPAGE); /* fewer TLB misses, if the kernel allows */
#endif
    memset(buf, 1, slice * (size_t)n_threads); /* fault every page in before timing */
    double best = 0;
    int best_kind = 0;
    for (size_t k = 0; k < sizeof read_kinds / sizeof read_kinds[0]; k++) {
        for (int p = 0; p < (passes > 0 ? passes : 1); p++) {
            team t = {.n = n_threads, .fn = read_slice, .buf = buf, .slice = slice,
                      .streams = read_kinds[k].streams, .prefetch = read_kinds[k].prefetch};
            double s = run_team(&t);
            double gbs = (double)slice * t.n / s * 1e-9;
            if (gbs > best) best = gbs, best_kind = (int)k;
        }
    }
    free(buf);
    if (desc && desc_size)
        snprintf(desc, desc_size, "%d stream%s, prefetch %zu", read_kinds[best_kind].streams,
                 read_kinds[best_kind].streams > 1 ? "s" : "", read_kinds[best_kind].prefetch);
    return best;
}

double q3_limit_read_gbs(int n_threads, size_t bytes, int passes)
{
    return q3_limit_read_gbs_desc(n_threads, bytes, passes, NULL, 0);
}

/* ---- peak compute ---------------------------------------------------------------------- */

static void peak_member(team *t, int ith)
{
    bool avx512 = q3_cpu_has_avx512_path(q3_cpu_features_get());
    double ops = 0;
    switch (t->kind) {
    case Q3_LIMIT_FMA_F32: ops = avx512 ? q3_limits_fma_avx512(t->iters) : q3_limits_fma_avx2(t->iters); break;
    case Q3_LIMIT_DOT_BF16: ops = q3_limits_bf16_avx512(t->iters); break;
    case Q3_LIMIT_DOT_INT8: ops = q3_limits_int8_avx512(t->iters); break;
    case Q3_LIMIT_AMX_BF16: ops = q3_limits_amx_bf16(t->iters / 16); break; /* ~16x the work per step */
    default: break;
    }
    t->ops[ith] = ops;
}

double q3_limit_peak(q3_limit_kind kind, int n_threads, double seconds, const char **isa)
{
    const q3_cpu_features *f = q3_cpu_features_get();
    bool avx512 = q3_cpu_has_avx512_path(f);
    if (isa) *isa = kind == Q3_LIMIT_AMX_BF16 ? "amx" : avx512 ? "avx512" : "avx2";
    if (!q3_cpu_has_avx2_path(f) || (kind != Q3_LIMIT_FMA_F32 && !avx512)) return 0;
    if (kind == Q3_LIMIT_AMX_BF16 && !q3_cpu_has_amx_path(f)) return 0;
    if (n_threads < 1) n_threads = 1;
    if (n_threads > 256) n_threads = 256;
    /* calibrate: iterations for about `seconds` on one thread */
    team cal = {.n = 1, .fn = peak_member, .kind = kind, .iters = 1 << 16};
    double s = run_team(&cal);
    long iters = (long)((double)cal.iters * seconds / (s > 1e-6 ? s : 1e-6));
    if (iters < 1000) iters = 1000;
    double best = 0;
    for (int p = 0; p < 3; p++) {
        team t = {.n = n_threads, .fn = peak_member, .kind = kind, .iters = iters};
        double el = run_team(&t), total = 0;
        for (int i = 0; i < t.n; i++) total += t.ops[i];
        if (total / el * 1e-9 > best) best = total / el * 1e-9;
    }
    return best;
}
