/* Benchmark of the Q8_0 / Q4_0 / Q4_K / Q5_K / Q6_K matmul kernels (backend/cpu/quant_kernels.h)
 * at Qwen3-0.6B's shapes, against the machine's limits measured in the same
 * run (tools/limits.h):
 *  - decode GEMV: GB/s of weight bytes streamed, per shape, over distinct
 *    copies of the weight (an arena far larger than the caches, so every
 *    call reads from memory as a real decode does), and a whole token (28
 *    layers of distinct weights + the LM head); against the read bandwidth;
 *  - prefill GEMM of 128 rows: GOP/s (2 per multiply-add) against the INT8
 *    dot peak (vpdpbusd), and the share of the activation quantization;
 * on 1 thread and on the pool's threads, run the way the cpu unit runs a
 * MATMUL (q3_cpu_mm_quant_*: every thread quantizes the activations into its
 * own scratch, then claims ranges of outputs). Each timing is the median of
 * its repeats (best in brackets). Every kernel table is first checked
 * against the scalar reference on sampled outputs (they are bit-identical).
 * On a shared machine, --cpu-time times the 1-thread runs in this thread's
 * CPU time (the limits stay wall-clock: compare with care).
 *
 *   build/bench/bench_quant [--reps N] [--threads T] [--isa avx512|avx2] [--only decode|token|prefill]
 *                           [--dtype q8_0|q4_0|q4_k|q5_k|q6_k] [--arena MIB] [--bw GBS --peak GOPS] [--cpu-time]
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/cpu/cpu_features.h"
#include "tools/limits.h"
#include "backend/cpu/quant_kernels.h"
#include "backend/cpu/threadpool.h"

/* Wall time; or, with --cpu-time on 1 thread, this thread's CPU time (a
 * shared machine then cannot charge its other tenants' time slices to us). */
static int g_cpu_time;
static int g_nth_now;
static double now(void)
{
    struct timespec ts;
    clock_gettime(g_cpu_time && g_nth_now == 1 ? CLOCK_THREAD_CPUTIME_ID : CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static uint64_t rnd64(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}
static float frand(void) { return (float)((rnd64() >> 40) & 0xffffff) / 16777216.0f * 2.0f - 1.0f; }

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* ---- shapes ----------------------------------------------------------------------------- */

typedef struct shape {
    const char *name;
    int n, k;
} shape;

static const shape layer_shapes[] = {
    {"attn_q", 2048, 1024}, {"attn_k", 1024, 1024},   {"attn_v", 1024, 1024}, {"attn_output", 1024, 2048},
    {"ffn_gate", 3072, 1024}, {"ffn_up", 3072, 1024}, {"ffn_down", 1024, 3072},
};
static const shape head_shape = {"output", 151936, 1024};

/* ---- the weight arena --------------------------------------------------------------------- */

/* Random bytes with a valid f16 scale (|d| ~ 0.001..0.01, no subnormals) at
 * the start of every block of the dtype: the weights of every matrix carved
 * from it at multiples of a row. */
static uint8_t *arena;
static size_t arena_bytes;
static q3_dtype arena_dtype = Q3_F32;

static void arena_fill(q3_dtype t)
{
    if (arena_dtype == t) return;
    size_t bb = q3_dtype_block_bytes(t);
    /* the f16 scales: d (and Q4_K/Q5_K's dmin after it) first; Q6_K's d last */
    size_t at = t == Q3_Q6_K ? 208 : 0, n_f16 = t == Q3_Q4_K || t == Q3_Q5_K ? 2 : 1;
    for (size_t i = 0; i + bb <= arena_bytes; i += bb) {
        for (size_t j = 0; j < n_f16; j++) {
            float d = (0.001f + 0.009f * (float)((rnd64() >> 40) & 0xffff) / 65536.0f) * ((rnd64() & 1) ? 1.0f : -1.0f);
            uint16_t h = q3_f32_to_f16(d);
            arena[i + at + 2 * j] = (uint8_t)h;
            arena[i + at + 2 * j + 1] = (uint8_t)(h >> 8);
        }
    }
    arena_dtype = t;
}

/* ---- one matmul, run the way the unit runs it ------------------------------------------------- */

typedef struct mm_job {
    const q3_cpu_mm_kernels *k;
    q3_cpu_matmul mm;
    void **scratch; /* [threads] */
    int item;       /* outputs per work item */
} mm_job;

static void job_begin(void *ctx, int ith)
{
    mm_job *j = ctx;
    j->k->prepare(&j->mm, j->scratch[ith]);
}

static void job_item(void *ctx, int item, int ith)
{
    mm_job *j = ctx;
    int o0 = item * j->item, o1 = o0 + j->item < j->mm.n ? o0 + j->item : j->mm.n;
    j->k->range(&j->mm, j->scratch[ith], o0, o1);
}

static q3_pool *pool;
static int n_pool;
static void *scratch[64];
static size_t scratch_size;

static void ensure_scratch(size_t bytes)
{
    if (bytes <= scratch_size) return;
    bytes = (bytes + 4095) & ~(size_t)4095;
    for (int i = 0; i < n_pool; i++) {
        free(scratch[i]);
        scratch[i] = aligned_alloc(64, bytes);
        if (!scratch[i]) abort();
    }
    scratch_size = bytes;
}

/* Runs one matmul on nth threads (1: inline on this thread, as the unit does
 * small ops), work items of granule multiples, 8 per thread. */
static void run_mm(const q3_cpu_mm_kernels *k, const q3_cpu_matmul *mm, int nth)
{
    mm_job j = {.k = k, .mm = *mm, .scratch = scratch};
    ensure_scratch(k->scratch(mm));
    int g = k->granule(mm), want = nth * 8;
    j.item = (mm->n + want - 1) / want;
    j.item = (j.item + g - 1) / g * g;
    q3_pool_job job = {.begin = job_begin, .item = job_item, .ctx = &j, .n_items = (mm->n + j.item - 1) / j.item};
    if (nth == 1) {
        job_begin(&j, 0);
        for (int i = 0; i < job.n_items; i++) job_item(&j, i, 0);
    } else {
        q3_pool_run(pool, &job);
    }
}

/* ---- the kernel tables --------------------------------------------------------------------- */

typedef struct table {
    const char *name;
    const q3_quant_kernels *q;
    const q3_cpu_mm_kernels *mm;
} table;

static table tables[3];
static int n_tables;

/* Tables that read weights in a layout of their own (packed_bytes != 0) get
 * the weight at arena + off packed into packed_arena + off, as the unit packs
 * a model's weights once: the packed Q8_0/Q4_0 layouts are the size of the
 * rows they come from, and every shape here has whole panels. Returns where
 * the table reads the weight. */
static uint8_t *packed_arena;

static const void *table_weight(const table *tb, const q3_cpu_matmul *mm, int pack)
{
    size_t bytes = tb->mm->packed_bytes ? tb->mm->packed_bytes(mm->wtype, mm->n, mm->k) : 0;
    if (!bytes) return mm->w;
    size_t off = (size_t)((const uint8_t *)mm->w - arena);
    if (bytes != mm->w_row_bytes * (size_t)mm->n || off + bytes > arena_bytes) abort();
    if (pack) tb->mm->pack(mm->wtype, mm->w, mm->w_row_bytes, mm->n, mm->k, packed_arena + off, 0, mm->n);
    return packed_arena + off;
}

/* Max relative error over sampled outputs against the reference kernel
 * (they are bit-identical by design: anything but 0 is a bug). */
static double validate(const table *t, const q3_cpu_matmul *mm)
{
    q3_cpu_matmul m = *mm;
    int rows = m.m < 4 ? m.m : 4, n = m.n < 64 ? m.n : 64;
    m.m = rows;
    m.n = n;
    size_t qb = q3_qact_bytes(rows, m.k);
    char *qbuf = aligned_alloc(64, qb);
    float *ref = malloc((size_t)rows * n * sizeof(float)), *got = malloc((size_t)rows * m.ldy * sizeof(float));
    q3_qact qa = q3_qact_carve(qbuf, rows, m.k);
    q3_quant_ref.quantize(m.wtype, m.x, m.ldx, &qa, 0, rows);
    q3_quant_ref.matmul(m.wtype, m.w, m.w_row_bytes, &qa, ref, (size_t)n, 0, n, NULL);
    m.y = got;
    m.w = table_weight(t, &m, 1);
    run_mm(t->mm, &m, 1);
    double worst = 0;
    for (int r = 0; r < rows; r++)
        for (int o = 0; o < n; o++) {
            double a = ref[(size_t)r * n + o], b = got[(size_t)r * m.ldy + o];
            double e = fabs(a - b) / (fabs(a) > 1e-30 ? fabs(a) : 1);
            if (e > worst) worst = e;
        }
    free(qbuf);
    free(ref);
    free(got);
    return worst;
}

/* ---- benchmarks ------------------------------------------------------------------------------ */

static int g_reps = 30;
static double bw[3], peak[3]; /* [threads]: 1 and n_pool */
static float *xbuf;           /* [128][3072] activations */
static float *ybuf;           /* [128][151936] outputs */

static q3_cpu_matmul make_mm(q3_dtype t, const shape *s, int m, size_t copy)
{
    size_t ws = q3_dtype_row_bytes(t, (size_t)s->k);
    return (q3_cpu_matmul){.w = arena + copy * ws * (size_t)s->n, .wtype = t, .w_row_bytes = ws, .x = xbuf,
                           .ldx = (size_t)s->k, .y = ybuf, .ldy = (size_t)s->n, .m = m, .n = s->n, .k = s->k};
}


static size_t copies_of(q3_dtype t, const shape *s)
{
    return arena_bytes / (q3_dtype_row_bytes(t, (size_t)s->k) * (size_t)s->n);
}

/* Median and best seconds of reps calls of one matmul shape, each call on the
 * next distinct copy of the weight. */
static void time_shape(const table *tb, q3_dtype t, const shape *s, int m, int nth, int reps, double *med, double *best)
{
    size_t nc = copies_of(t, s);
    double *ts = malloc((size_t)reps * sizeof *ts);
    static size_t next;
    for (size_t c = 0; c < nc; c++) {
        q3_cpu_matmul mm = make_mm(t, s, m, c);
        table_weight(tb, &mm, 1);
    }
    for (int i = 0; i < reps; i++) {
        q3_cpu_matmul mm = make_mm(t, s, m, next++ % nc);
        mm.w = table_weight(tb, &mm, 0);
        double t0 = now();
        run_mm(tb->mm, &mm, nth);
        ts[i] = now() - t0;
    }
    qsort(ts, (size_t)reps, sizeof *ts, cmp_double);
    *med = ts[reps / 2];
    *best = ts[0];
    free(ts);
}

static void bench_decode(const table *tb, q3_dtype t, int nth, int ti)
{
    printf("decode GEMV, %s, %s, %d thread%s (read bandwidth %.1f GB/s):\n", q3_dtype_name(t), tb->name, nth,
           nth > 1 ? "s" : "", bw[ti]);
    for (size_t i = 0; i <= sizeof layer_shapes / sizeof *layer_shapes; i++) {
        const shape *s = i < sizeof layer_shapes / sizeof *layer_shapes ? &layer_shapes[i] : &head_shape;
        double bytes = (double)q3_dtype_row_bytes(t, (size_t)s->k) * s->n, med, best;
        int reps = s->n > 100000 ? (g_reps < 8 ? g_reps : 8) : g_reps * 4;
        if (!copies_of(t, s)) {
            printf("  %-12s %5d->%-6d (needs a %zu MiB arena)\n", s->name, s->k, s->n, (size_t)(bytes / 1048576) + 1);
            continue;
        }
        time_shape(tb, t, s, 1, nth, reps, &med, &best);
        printf("  %-12s %5d->%-6d %8.3f ms [%8.3f]  %6.2f GB/s [%6.2f]  %5.1f%% of bw\n", s->name, s->k, s->n, med * 1e3,
               best * 1e3, bytes / med * 1e-9, bytes / best * 1e-9, 100 * bytes / med * 1e-9 / bw[ti]);
    }
}

/* A whole token's GEMVs: 28 layers of distinct weights, then the LM head. */
static void bench_token(const table *tb, q3_dtype t, int nth, int ti)
{
    enum { LAYERS = 28 };
    size_t off[LAYERS][7], head_off, pos = 0;
    for (int l = 0; l < LAYERS; l++)
        for (int j = 0; j < 7; j++) {
            off[l][j] = pos;
            pos += q3_dtype_row_bytes(t, (size_t)layer_shapes[j].k) * (size_t)layer_shapes[j].n;
        }
    head_off = pos;
    pos += q3_dtype_row_bytes(t, (size_t)head_shape.k) * (size_t)head_shape.n;
    if (pos > arena_bytes) {
        printf("  (token: needs a %zu MiB arena)\n", pos >> 20);
        return;
    }
    int reps = g_reps < 10 ? g_reps : 10;
    double *ts = malloc((size_t)reps * sizeof *ts), *th = malloc((size_t)reps * sizeof *th);
    for (int rep = -1; rep < reps; rep++) { /* rep -1: the tables that pack pack every weight once */
        double t0 = now();
        for (int l = 0; l < LAYERS; l++)
            for (int j = 0; j < 7; j++) {
                q3_cpu_matmul mm = make_mm(t, &layer_shapes[j], 1, 0);
                mm.w = arena + off[l][j];
                mm.w = table_weight(tb, &mm, rep < 0);
                if (rep >= 0) run_mm(tb->mm, &mm, nth);
            }
        double t1 = now();
        q3_cpu_matmul mm = make_mm(t, &head_shape, 1, 0);
        mm.w = arena + head_off;
        mm.w = table_weight(tb, &mm, rep < 0);
        if (rep < 0) continue;
        run_mm(tb->mm, &mm, nth);
        double t2 = now();
        ts[rep] = t2 - t0;
        th[rep] = t2 - t1;
    }
    qsort(ts, (size_t)reps, sizeof *ts, cmp_double);
    qsort(th, (size_t)reps, sizeof *th, cmp_double);
    double med = ts[reps / 2], hm = th[reps / 2], hb = (double)(pos - head_off);
    printf("  decode token %s %s %d thr: %7.2f ms [%7.2f]  %6.2f GB/s (%5.1f%% of bw) -> %5.1f tok/s by GEMVs; "
           "LM head %.2f ms %.2f GB/s\n",
           q3_dtype_name(t), tb->name, nth, med * 1e3, ts[0] * 1e3, pos / med * 1e-9, 100 * pos / med * 1e-9 / bw[ti],
           1 / med, hm * 1e3, hb / hm * 1e-9);
    free(ts);
    free(th);
}

static void bench_prefill(const table *tb, q3_dtype t, int nth, int ti)
{
    enum { ROWS = 128 };
    printf("prefill GEMM, %d rows, %s, %s, %d thread%s (INT8 dot peak %.1f GOP/s):\n", ROWS, q3_dtype_name(t), tb->name,
           nth, nth > 1 ? "s" : "", peak[ti]);
    double tot_ops = 0, tot_t = 0;
    for (size_t i = 0; i < sizeof layer_shapes / sizeof *layer_shapes; i++) {
        const shape *s = &layer_shapes[i];
        double ops = 2.0 * ROWS * s->n * (double)s->k, med, best;
        int reps = g_reps < 10 ? 10 : g_reps / 2;
        time_shape(tb, t, s, ROWS, nth, reps, &med, &best);
        /* the activation quantization alone (what each thread's prepare does) */
        char *qbuf = aligned_alloc(64, q3_qact_bytes(ROWS, s->k));
        q3_qact qa = q3_qact_carve(qbuf, ROWS, s->k);
        double tq = 1e30;
        for (int r = 0; r < 5; r++) {
            double t0 = now();
            tb->q->quantize(t, xbuf, (size_t)s->k, &qa, 0, ROWS);
            double e = now() - t0;
            if (e < tq) tq = e;
        }
        free(qbuf);
        printf("  %-12s %5d->%-5d %8.3f ms [%8.3f]  %7.1f GOP/s [%7.1f]  %5.1f%% of peak  (quantize %.3f ms, %.1f%%)\n",
               s->name, s->k, s->n, med * 1e3, best * 1e3, ops / med * 1e-9, ops / best * 1e-9,
               100 * ops / med * 1e-9 / peak[ti], tq * 1e3, 100 * tq / med);
        tot_ops += ops;
        tot_t += med;
    }
    printf("  %-25s %8.3f ms             %7.1f GOP/s            %5.1f%% of peak\n", "one layer", tot_t * 1e3,
           tot_ops / tot_t * 1e-9, 100 * tot_ops / tot_t * 1e-9 / peak[ti]);
}

int main(int argc, char **argv)
{
    const char *only = NULL, *only_isa = NULL, *only_dtype = NULL;
    int threads = 0;
    size_t arena_mib = 768;
    double bw_arg = 0, peak_arg = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--reps") && i + 1 < argc) g_reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc) threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--isa") && i + 1 < argc) only_isa = argv[++i];
        else if (!strcmp(argv[i], "--only") && i + 1 < argc) only = argv[++i];
        else if (!strcmp(argv[i], "--dtype") && i + 1 < argc) only_dtype = argv[++i];
        else if (!strcmp(argv[i], "--arena") && i + 1 < argc) arena_mib = (size_t)atol(argv[++i]);
        else if (!strcmp(argv[i], "--bw") && i + 1 < argc) bw_arg = atof(argv[++i]);
        else if (!strcmp(argv[i], "--cpu-time")) g_cpu_time = 1;
        else if (!strcmp(argv[i], "--peak") && i + 1 < argc) peak_arg = atof(argv[++i]);
        else {
            fprintf(stderr,
                    "usage: %s [--reps N] [--threads T] [--isa avx512|avx2] [--only decode|token|prefill] "
                    "[--dtype q8_0|q4_0|q4_k|q5_k|q6_k] [--arena MIB] [--bw GBS --peak GOPS] [--cpu-time]\n",
                    argv[0]);
            return 2;
        }
    }
    if (g_reps < 1) g_reps = 1;
    const q3_cpu_features *f = q3_cpu_features_get();
    if (threads <= 0) threads = f->physical_cores > 0 ? f->physical_cores : 1;
    if (threads > 64) threads = 64;
    pool = q3_pool_new(threads);
    n_pool = pool ? q3_pool_size(pool) : 1;

    if (q3_cpu_has_avx512_path(f)) tables[n_tables++] = (table){"avx512", &q3_quant_avx512, &q3_cpu_mm_quant_avx512};
    if (q3_cpu_has_avx2_path(f)) tables[n_tables++] = (table){"avx2", &q3_quant_avx2, &q3_cpu_mm_quant_avx2};

    int nths[2] = {1, n_pool}, n_nth = n_pool > 1 ? 2 : 1;
    printf("machine: %d physical cores; measuring limits on 1 and %d threads\n", f->physical_cores, n_pool);
    for (int i = 0; i < n_nth; i++) {
        bw[i] = bw_arg > 0 ? bw_arg : q3_limit_read_gbs(nths[i], (size_t)1 << 30, 3);
        peak[i] = peak_arg > 0 ? peak_arg : q3_limit_peak(Q3_LIMIT_DOT_INT8, nths[i], 0.2, NULL);
        printf("  %d thread%s: read %.2f GB/s, INT8 dot peak %.1f GOP/s\n", nths[i], nths[i] > 1 ? "s" : "", bw[i],
               peak[i]);
    }

    arena_bytes = arena_mib << 20;
    arena = aligned_alloc(4096, arena_bytes);
    packed_arena = aligned_alloc(4096, arena_bytes);
    xbuf = aligned_alloc(64, (size_t)128 * 3072 * sizeof(float));
    ybuf = aligned_alloc(64, (size_t)128 * 151936 * sizeof(float));
    if (!arena || !packed_arena || !xbuf || !ybuf) {
        fprintf(stderr, "out of memory\n");
        return 1;
    }
    for (size_t i = 0; i < arena_bytes / 8; i++) ((uint64_t *)arena)[i] = rnd64();
    for (size_t i = 0; i < (size_t)128 * 3072; i++) xbuf[i] = frand() * (i % 97 == 0 ? 8.0f : 1.0f);
    memset(ybuf, 0, (size_t)128 * 151936 * sizeof(float));

    static const q3_dtype dtypes[] = {Q3_Q8_0, Q3_Q4_0, Q3_Q4_K, Q3_Q5_K, Q3_Q6_K};
    for (size_t d = 0; d < sizeof dtypes / sizeof dtypes[0]; d++) {
        q3_dtype t = dtypes[d];
        if (only_dtype && q3_dtype_from_name(only_dtype) != (int)t) continue;
        arena_fill(t);
        for (int ti = 0; ti < n_tables; ti++) {
            const table *tb = &tables[ti];
            if (only_isa && strcmp(only_isa, tb->name)) continue;
            q3_cpu_matmul v1 = make_mm(t, &layer_shapes[0], 1, 0), v2 = make_mm(t, &layer_shapes[6], 37, 1);
            double e1 = validate(tb, &v1), e2 = validate(tb, &v2);
            printf("== %s on %s: validated against the reference, max rel diff %.1e (GEMV) %.1e (GEMM)%s\n",
                   q3_dtype_name(t), tb->q->name, e1, e2, e1 > 0 || e2 > 0 ? "  <-- NOT BIT-IDENTICAL" : "");
            for (int i = 0; i < n_nth; i++) {
                g_nth_now = nths[i];
                if (!only || !strcmp(only, "decode")) bench_decode(tb, t, nths[i], i);
                if (!only || !strcmp(only, "token")) bench_token(tb, t, nths[i], i);
                if (!only || !strcmp(only, "prefill")) bench_prefill(tb, t, nths[i], i);
            }
        }
    }
    q3_pool_free(pool);
    for (int i = 0; i < n_pool; i++) free(scratch[i]);
    free(arena);
    free(packed_arena);
    free(xbuf);
    free(ybuf);
    return 0;
}
