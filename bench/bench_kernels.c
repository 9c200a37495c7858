/* Kernel development harness for the cpu unit: the matmul at Qwen3-0.6B's
 * shapes (BF16 weights, or F16 with --wtype f16), as a GEMM over a prefill chunk and as the decode
 * GEMV, run through the unit's op interface on every kernel table the CPU
 * has, side by side: each version is first validated against a scalar
 * double-precision reference on sampled outputs, then timed (best of reps).
 * Also a whole decode token's worth of GEMVs over distinct weights (1.19 GB,
 * so they stream from memory as in a real decode) and the prefill matmuls of
 * a 128-token chunk. Numbers are reported against the machine's limits
 * (tools/limits.h), measured at start-up unless given.
 *
 * With --model DIR (e.g. a `q3 synth` folder), also end to end through
 * q3_session_* on the "cpu" unit: prefill ms per 128-token chunk and decode
 * ms per token, with the time per op (by name, summed over layers) and the
 * pool jobs (synchronisations) per token.
 * attn-stream: one token's decode attention over 28 layers of distinct K/V
 * (streamed from memory, as at depth in a real token); --depth N: only that
 * depth; --gqa G: G query heads a KV head (default 2, Qwen3-0.6B's; 4 for
 * Qwen3-4B and 8B, 8 for Qwen3-32B), 8 KV heads of 128 values either way; --kv f16|q8_0:
 * that cache type only (attn and attn-stream), or the cache of e2e.
 *
 *   build/bench/bench_kernels [--reps N] [--bw GBS] [--peak GFLOPS] [--isa amx|avx512|avx2] [--wtype bf16|f16]
 *                             [--only gemm|gemv|token|prefill|attn|attn-stream|e2e] [--model DIR] [--gen N] [--depth N] [--layers N]
 *                             [--gqa G] [--kv f16|q8_0]
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_features.h"
#include "tools/limits.h"
#include "run/session.h"

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* CPU time of every thread of the process. */
static double cpu_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int g_layers; /* attn-stream: layers (default 28) */
#define MAX_GQA 8 /* attn-stream: query heads a KV head at most */
static int g_gqa = 2; /* attn-stream: query heads a KV head */
static int g_kv = -1; /* attn, attn-stream: the one cache type to run (--kv), -1 both; e2e: its cache (-1 default) */

static uint64_t rng = 0x2545f4914f6cdd1dull;
static float frand(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (float)((rng >> 40) & 0xffffff) / 16777216.0f * 2.0f - 1.0f;
}

/* ---- a one-op matmul graph ------------------------------------------------------------ */

typedef struct mm_case {
    const char *name;
    int n, k;
} mm_case;

static const mm_case shapes[] = {
    {"attn_q", 2048, 1024}, {"attn_k", 1024, 1024}, {"attn_v", 1024, 1024},  {"attn_output", 1024, 2048},
    {"ffn_gate", 3072, 1024}, {"ffn_up", 3072, 1024}, {"ffn_down", 1024, 3072}, {"output", 151936, 1024},
};

typedef struct mm_rig {
    q3_config cfg;
    q3_graph g;
    q3_value values[2];
    q3_op op;
    q3_tensor w;
    float *buf[2];
    q3_exec e;
} mm_rig;

/* The matmuls' weight type (--wtype): BF16 (default) or F16. */
static q3_dtype g_wtype = Q3_BF16;

static void *bf16_matrix(int n, int k)
{
    size_t count = (size_t)n * k;
    uint16_t *w = aligned_alloc(64, (count * 2 + 63) & ~(size_t)63);
    for (size_t i = 0; i < count; i++)
        w[i] = g_wtype == Q3_F16 ? q3_f32_to_f16(frand() * 0.05f) : q3_f32_to_bf16(frand() * 0.05f);
    return w;
}

static double weight_value(const uint16_t *w, size_t i)
{
    return g_wtype == Q3_F16 ? q3_f16_to_f32(w[i]) : q3_bf16_to_f32(w[i]);
}

static void rig_init(mm_rig *R, int m, int n, int k, const void *w)
{
    memset(R, 0, sizeof *R);
    R->cfg = (q3_config){.n_layers = 1, .dim = k, .n_heads = 1, .n_kv_heads = 1, .head_dim = 64, .vocab_size = n};
    R->w = (q3_tensor){.dtype = g_wtype, .ndim = 2, .shape = {n, k}, .data = w, .nbytes = (size_t)n * k * 2};
    R->values[0] = (q3_value){.rows = m, .cols = k};
    R->values[1] = (q3_value){.rows = m, .cols = n};
    R->g = (q3_graph){.cfg = &R->cfg, .rows = m, .ops = &R->op, .n_ops = 1, .values = R->values, .n_values = 2};
    R->op = (q3_op){.kind = Q3_OP_MATMUL, .out = 1, .in = {0, -1, -1}, .weight = &R->w, .layer = -1};
    R->buf[0] = aligned_alloc(64, ((size_t)m * k * 4 + 63) & ~(size_t)63);
    R->buf[1] = aligned_alloc(64, ((size_t)m * n * 4 + 63) & ~(size_t)63);
    for (size_t i = 0; i < (size_t)m * k; i++) R->buf[0][i] = frand();
    R->e = (q3_exec){.g = &R->g, .buf = R->buf, .n_real = m};
}

static void rig_free(mm_rig *R)
{
    free(R->buf[0]);
    free(R->buf[1]);
}

/* The units the kernels run on (opened in main). */
static q3_unit *g_cpu, *g_ref;

static void run_op(mm_rig *R) { g_cpu->b->run(g_cpu->impl, &R->e, &R->op); }

/* Max error over sampled outputs against a double reference, relative to sum |x||w|. */
static double validate(mm_rig *R)
{
    run_op(R);
    int m = R->values[0].rows, n = R->values[1].cols, k = R->values[0].cols;
    const uint16_t *w = R->w.data;
    double worst = 0;
    for (int s = 0; s < 64; s++) {
        int r = (int)((unsigned)(s * 7919) % (unsigned)m), o = (int)((unsigned)(s * 104729 + 13) % (unsigned)n);
        double ref = 0, mag = 0;
        for (int i = 0; i < k; i++) {
            double x = R->buf[0][(size_t)r * k + i], wv = weight_value(w, (size_t)o * k + i);
            ref += x * wv;
            mag += fabs(x * wv);
        }
        double err = fabs(R->buf[1][(size_t)r * n + o] - ref) / (mag > 0 ? mag : 1);
        if (err > worst) worst = err;
    }
    return worst;
}

static double time_best(mm_rig *R, int reps)
{
    double best = 1e30;
    for (int i = 0; i < reps; i++) {
        double t0 = now();
        run_op(R);
        double t = now() - t0;
        if (t < best) best = t;
    }
    return best;
}

/* ---- the benchmarks ------------------------------------------------------------------------ */

static double g_bw, g_peak;
static int g_reps = 5;

static const char *isa_names[] = {"amx", "avx512", "avx2"};

static bool use_isa(const char *name)
{
    return q3_cpu_unit_force_isa(g_cpu, name) == 0;
}

/* One shape, one mode (m rows), every ISA side by side. */
static void bench_shape(const mm_case *c, int m, const char *only_isa)
{
    void *w = bf16_matrix(c->n, c->k);
    mm_rig R;
    rig_init(&R, m, c->n, c->k, w);
    double flop = 2.0 * m * c->n * (double)c->k, bytes = 2.0 * c->n * (double)c->k;
    for (size_t i = 0; i < sizeof isa_names / sizeof *isa_names; i++) {
        if (only_isa && strcmp(only_isa, isa_names[i])) continue;
        if (!use_isa(isa_names[i])) continue;
        double err = validate(&R);
        double t = time_best(&R, m == 1 && c->n > 100000 ? 3 : g_reps);
        printf("  %-12s m=%-4d %-7s %9.3f ms %8.1f GFLOP/s (%5.1f%% peak) %7.1f GB/s (%5.1f%% bw)  err %.1e%s\n",
               c->name, m, isa_names[i], t * 1e3, flop / t * 1e-9, 100 * flop / t * 1e-9 / g_peak, bytes / t * 1e-9,
               100 * bytes / t * 1e-9 / g_bw, err, err > 1e-2 ? "  <-- WRONG" : "");
    }
    rig_free(&R);
    free(w);
}

/* A decode token's GEMVs: 28 layers of distinct weights plus the LM head. */
static void bench_token(const char *only_isa)
{
    enum { LAYERS = 28 };
    void *ws[LAYERS][7];
    mm_rig rigs[LAYERS][7], head;
    double bytes = 0;
    for (int l = 0; l < LAYERS; l++)
        for (int j = 0; j < 7; j++) {
            ws[l][j] = bf16_matrix(shapes[j].n, shapes[j].k);
            rig_init(&rigs[l][j], 1, shapes[j].n, shapes[j].k, ws[l][j]);
            bytes += 2.0 * shapes[j].n * shapes[j].k;
        }
    void *wh = bf16_matrix(shapes[7].n, shapes[7].k);
    rig_init(&head, 1, shapes[7].n, shapes[7].k, wh);
    bytes += 2.0 * shapes[7].n * shapes[7].k;
    for (size_t i = 0; i < sizeof isa_names / sizeof *isa_names; i++) {
        if (only_isa && strcmp(only_isa, isa_names[i])) continue;
        if (!use_isa(isa_names[i])) continue;
        double best = 1e30, best_head = 1e30;
        for (int rep = 0; rep < g_reps; rep++) {
            double t0 = now();
            for (int l = 0; l < LAYERS; l++)
                for (int j = 0; j < 7; j++) run_op(&rigs[l][j]);
            double t1 = now();
            run_op(&head);
            double t2 = now();
            if (t2 - t0 < best) best = t2 - t0;
            if (t2 - t1 < best_head) best_head = t2 - t1;
        }
        printf("  decode token %-7s %8.2f ms  %6.1f GB/s (%5.1f%% of %.1f)  -> %5.1f tok/s bound by GEMVs; "
               "LM head alone %.2f ms %.1f GB/s\n",
               isa_names[i], best * 1e3, bytes / best * 1e-9, 100 * bytes / best * 1e-9 / g_bw, g_bw, 1 / best,
               best_head * 1e3, 2.0 * shapes[7].n * shapes[7].k / best_head * 1e-9);
    }
    for (int l = 0; l < LAYERS; l++)
        for (int j = 0; j < 7; j++) {
            rig_free(&rigs[l][j]);
            free(ws[l][j]);
        }
    rig_free(&head);
    free(wh);
}

/* The matmuls of one prefill chunk of 128 rows: 28 layers of 7 GEMMs over
 * distinct weights (880 MB, so they stream from memory as in a real
 * prefill), and the last row's LM head GEMV. */
static void bench_prefill(const char *only_isa)
{
    enum { LAYERS = 28 };
    void *ws[LAYERS][7];
    mm_rig rigs[LAYERS][7], head;
    double flop = 0;
    for (int l = 0; l < LAYERS; l++)
        for (int j = 0; j < 7; j++) {
            ws[l][j] = bf16_matrix(shapes[j].n, shapes[j].k);
            rig_init(&rigs[l][j], 128, shapes[j].n, shapes[j].k, ws[l][j]);
            flop += 2.0 * 128 * shapes[j].n * shapes[j].k;
        }
    void *wh = bf16_matrix(shapes[7].n, shapes[7].k);
    rig_init(&head, 1, shapes[7].n, shapes[7].k, wh);
    flop += 2.0 * shapes[7].n * shapes[7].k;
    for (size_t i = 0; i < sizeof isa_names / sizeof *isa_names; i++) {
        if (only_isa && strcmp(only_isa, isa_names[i])) continue;
        if (!use_isa(isa_names[i])) continue;
        double best = 1e30;
        for (int rep = 0; rep < (g_reps < 3 ? g_reps : 3); rep++) {
            double t0 = now();
            for (int l = 0; l < LAYERS; l++)
                for (int j = 0; j < 7; j++) run_op(&rigs[l][j]);
            run_op(&head);
            double t = now() - t0;
            if (t < best) best = t;
        }
        printf("  prefill chunk 128 matmuls %-7s %8.1f ms  %7.1f GFLOP/s (%5.1f%% of %.1f)\n", isa_names[i], best * 1e3,
               flop / best * 1e-9, 100 * flop / best * 1e-9 / g_peak, g_peak);
    }
    for (int l = 0; l < LAYERS; l++)
        for (int j = 0; j < 7; j++) {
            rig_free(&rigs[l][j]);
            free(ws[l][j]);
        }
    rig_free(&head);
    free(wh);
}

/* ---- attention --------------------------------------------------------------------------------- */

/* ATTENTION at Qwen3-0.6B's shape (16 query heads, 8 KV heads, head_dim 128):
 * a 128-row prefill chunk at position pos, and decode at depth pos, with an
 * F16 and a Q8_0 cache; reported as GB/s of K/V read. Validated against ref. */
static void bench_attention(const char *only_isa)
{
    enum { NH = 16, NKV = 8, HD = 128, ROWS = 128 };
    static const int depths[] = {0, 1024, 4096};
    q3_config cfg = {.n_layers = 1, .dim = 1024, .ffn_dim = 3072, .n_heads = NH, .n_kv_heads = NKV, .head_dim = HD,
                     .vocab_size = 1000, .max_seq_len = 8192, .rms_eps = 1e-6f, .rope_theta = 1e6f};
    static const q3_dtype kvts[] = {Q3_F16, Q3_Q8_0};
    for (size_t di = 0; di < sizeof depths / sizeof *depths * 2; di++) {
        int pos = depths[di / 2];
        q3_dtype kvt = kvts[di % 2];
        if (g_kv >= 0 && (int)kvt != g_kv) continue;
        q3_kv_pool kv;
        int seq, n = pos + ROWS + 1;
        if (q3_kv_pool_init(&kv, &cfg, kvt, q3_kv_blocks_for(n), 1, n) || q3_kv_seq_add(&kv, &seq) ||
            q3_kv_seq_reserve(&kv, seq, n))
            return;
        const int32_t *table = kv.seqs[seq].table;
        float *row = malloc(NKV * HD * sizeof *row);
        for (int t = 0; t < n; t++) {
            for (int i = 0; i < NKV * HD; i++) row[i] = frand();
            q3_row_from_f32(kvt, row, q3_kv_k_row(&kv, table, 0, t), NKV * HD);
            for (int i = 0; i < NKV * HD; i++) row[i] = frand();
            q3_row_from_f32(kvt, row, q3_kv_v_row(&kv, table, 0, t), NKV * HD);
        }
        free(row);
        int32_t rpos[ROWS];
        const int32_t *tables[ROWS];
        for (int r = 0; r < ROWS; r++) {
            rpos[r] = pos + r;
            tables[r] = table;
        }
        for (int decode = 0; decode < 2; decode++) {
            int rows = decode ? 1 : ROWS;
            q3_value values[4] = {{.rows = rows, .cols = NH * HD}, {.rows = rows, .cols = NKV * HD},
                                  {.rows = rows, .cols = NKV * HD}, {.rows = rows, .cols = NH * HD}};
            q3_op op = {.kind = Q3_OP_ATTENTION, .layer = 0, .out = 3, .in = {0, decode ? -1 : 1, decode ? -1 : 2},
                        .reads_state = true};
            q3_graph g = {.cfg = &cfg, .rows = rows, .ops = &op, .n_ops = 1, .values = values, .n_values = 4};
            float *buf[4], *ref_out = malloc((size_t)rows * NH * HD * sizeof(float));
            for (int v = 0; v < 4; v++) {
                buf[v] = malloc((size_t)values[v].rows * values[v].cols * sizeof(float));
                for (int i = 0; i < values[v].rows * values[v].cols; i++) buf[v][i] = frand();
            }
            q3_exec e = {.g = &g, .buf = buf, .n_real = rows, .pos = rpos, .kv = &kv, .table = tables};
            g_ref->b->run(g_ref->impl, &e, &op);
            memcpy(ref_out, buf[3], (size_t)rows * NH * HD * sizeof(float));
            double keys = decode ? pos + 1.0 : (double)rows * pos + rows * (rows + 1) / 2.0;
            double flop = 4.0 * keys * NH * HD, bytes = 2.0 * (decode ? pos + 1.0 : pos + rows) * (double)kv.row_bytes;
            for (size_t i = 0; i < sizeof isa_names / sizeof *isa_names; i++) {
                if (only_isa && strcmp(only_isa, isa_names[i])) continue;
                if (!use_isa(isa_names[i])) continue;
                double best = 1e30, err = 0;
                for (int rep = 0; rep < g_reps; rep++) {
                    double t0 = now();
                    g_cpu->b->run(g_cpu->impl, &e, &op);
                    double t = now() - t0;
                    if (t < best) best = t;
                }
                for (int j = 0; j < rows * NH * HD; j++) err = fmax(err, fabs(buf[3][j] - ref_out[j]));
                /* prefill rounds the chunk's K/V to F16 (as the cache will hold them): ~1e-3 from ref */
                printf("  attention %-7s %-6s kv %-4s pos %-5d %8.3f ms %7.1f GFLOP/s %6.1f GB/s of K/V  max err %.1e\n",
                       isa_names[i], decode ? "decode" : "prefill", q3_dtype_name(kvt), pos, best * 1e3, flop / best * 1e-9,
                       bytes / best * 1e-9, err);
            }
            for (int v = 0; v < 4; v++) free(buf[v]);
            free(ref_out);
        }
        q3_kv_pool_free(&kv);
    }
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Decode attention of one token over all 28 layers of Qwen3-0.6B at depth D
 * (the K/V of every layer distinct: 28 x 4 KB x D with an F16 cache, so it
 * streams from memory as in a real token): ms per token (best and median of
 * reps), the K/V read rate against the measured read bandwidth. One layer
 * checked against ref first. */
static void bench_attention_stream(const char *only_isa, int depth)
{
    enum { NKV = 8, HD = 128, MAXL = 28 };
    const int NH = NKV * g_gqa;
    const int NL = g_layers > 0 && g_layers < MAXL ? g_layers : MAXL;
    int depths[] = {1024, 4096};
    if (depth > 0) depths[0] = depths[1] = depth;
    q3_config cfg = {.n_layers = NL, .dim = 1024, .ffn_dim = 3072, .n_heads = NH, .n_kv_heads = NKV, .head_dim = HD,
                     .vocab_size = 1000, .max_seq_len = 8192, .rms_eps = 1e-6f, .rope_theta = 1e6f};
    static const q3_dtype kvts[] = {Q3_F16, Q3_Q8_0};
    for (size_t di = 0; di < sizeof depths / sizeof *depths * 2; di++) {
        int pos = depths[di / 2];
        q3_dtype kvt = kvts[di % 2];
        if (depth > 0 && di >= 2) break;
        if (g_kv >= 0 && (int)kvt != g_kv) continue;
        q3_kv_pool kv;
        int seq, n = pos + 1;
        if (q3_kv_pool_init(&kv, &cfg, kvt, q3_kv_blocks_for(n), 1, n) || q3_kv_seq_add(&kv, &seq) ||
            q3_kv_seq_reserve(&kv, seq, n))
            return;
        const int32_t *table = kv.seqs[seq].table;
        float *row = malloc(NKV * HD * sizeof *row);
        for (int l = 0; l < NL; l++)
            for (int t = 0; t < n; t++) {
                for (int i = 0; i < NKV * HD; i++) row[i] = frand();
                q3_row_from_f32(kvt, row, q3_kv_k_row(&kv, table, l, t), NKV * HD);
                for (int i = 0; i < NKV * HD; i++) row[i] = frand();
                q3_row_from_f32(kvt, row, q3_kv_v_row(&kv, table, l, t), NKV * HD);
            }
        free(row);
        int32_t rpos = pos;
        const int32_t *tables[1] = {table};
        q3_value values[4] = {{.rows = 1, .cols = NH * HD}, {.rows = 1, .cols = NKV * HD},
                              {.rows = 1, .cols = NKV * HD}, {.rows = 1, .cols = NH * HD}};
        q3_op ops[MAXL];
        for (int l = 0; l < NL; l++)
            ops[l] = (q3_op){.kind = Q3_OP_ATTENTION, .layer = l, .out = 3, .in = {0, -1, -1}, .reads_state = true};
        q3_graph g = {.cfg = &cfg, .rows = 1, .ops = ops, .n_ops = NL, .values = values, .n_values = 4};
        float *buf[4], ref_out[NKV * MAX_GQA * HD];
        for (int v = 0; v < 4; v++) {
            buf[v] = malloc((size_t)values[v].cols * sizeof(float));
            for (int i = 0; i < values[v].cols; i++) buf[v][i] = frand();
        }
        q3_exec e = {.g = &g, .buf = buf, .n_real = 1, .pos = &rpos, .kv = &kv, .table = tables};
        g_ref->b->run(g_ref->impl, &e, &ops[NL - 1]);
        memcpy(ref_out, buf[3], (size_t)NH * HD * sizeof(float));
        double bytes = 2.0 * (pos + 1.0) * (double)kv.row_bytes * NL;
        for (size_t i = 0; i < sizeof isa_names / sizeof *isa_names; i++) {
            if (only_isa && strcmp(only_isa, isa_names[i])) continue;
            if (!use_isa(isa_names[i])) continue;
            g_cpu->b->run(g_cpu->impl, &e, &ops[NL - 1]);
            double err = 0;
            for (int j = 0; j < NH * HD; j++) err = fmax(err, fabs(buf[3][j] - ref_out[j]));
            int reps = g_reps < 3 ? 3 : g_reps;
            double *ts = malloc((size_t)reps * sizeof *ts), *cs = malloc((size_t)reps * sizeof *cs);
            for (int rep = 0; rep < reps; rep++) {
                double t0 = now(), c0 = cpu_now();
                for (int l = 0; l < NL; l++) g_cpu->b->run(g_cpu->impl, &e, &ops[l]);
                ts[rep] = now() - t0;
                cs[rep] = cpu_now() - c0;
            }
            qsort(ts, (size_t)reps, sizeof *ts, cmp_double);
            qsort(cs, (size_t)reps, sizeof *cs, cmp_double);
            /* CPU time: the threads' time on a core (spinning included), which a
               busy machine does not inflate the way it does wall time */
            printf("  decode attention %-7s kv %-4s gqa %d depth %-5d x %d layers: best %7.3f ms, p50 %7.3f ms per token "
                   "(CPU time p50 %7.3f ms); %5.1f GB/s of K/V (best) = %3.0f%% of the read bandwidth; max err %.1e\n",
                   isa_names[i], q3_dtype_name(kvt), g_gqa, pos, NL, ts[0] * 1e3, ts[reps / 2] * 1e3, cs[reps / 2] * 1e3,
                   bytes / ts[0] * 1e-9, 100 * bytes / ts[0] * 1e-9 / g_bw, err);
            free(ts);
            free(cs);
        }
        for (int v = 0; v < 4; v++) free(buf[v]);
        q3_kv_pool_free(&kv);
    }
}

/* ---- end to end ------------------------------------------------------------------------------ */

/* Prints the per-op time of a profiled runner, summed by op name without its
 * "blk.N." prefix, per run. */
static void print_profile(const q3_runner *r, int runs, double total)
{
    const q3_graph *g = r->g;
    char names[64][48];
    double secs[64];
    int n = 0;
    for (int i = 0; i < g->n_ops; i++) {
        const char *name = g->ops[i].name;
        if (!strncmp(name, "blk.", 4) && strchr(name + 4, '.')) name = strchr(name + 4, '.') + 1;
        int j = 0;
        while (j < n && strcmp(names[j], name)) j++;
        if (j == n && n < 64) {
            snprintf(names[n], sizeof names[n], "%s", name);
            secs[n++] = 0;
        }
        if (j < 64) secs[j] += r->op_seconds[i];
    }
    for (int j = 0; j < n; j++)
        if (secs[j] / runs > 0.002 * total)
            printf("      %-16s %8.3f ms  %5.1f%%\n", names[j], secs[j] / runs * 1e3, 100 * secs[j] / runs / total);
}


static void bench_e2e(const char *dir, int gen, int depth, const char *only_isa)
{
    q3_model *m;
    if (q3_model_open(dir, &m)) {
        fprintf(stderr, "%s: %s\n", dir, q3_last_error());
        return;
    }
    q3_session_opts o = {.n_ctx = depth + 128 + gen + 8, .chunk = 128, .backend = "cpu",
                         .kv_dtype = g_kv >= 0 ? q3_dtype_name((q3_dtype)g_kv) : NULL};
    q3_session *s;
    if (q3_session_new(m, &o, &s)) {
        fprintf(stderr, "session: %s\n", q3_last_error());
        q3_model_close(m);
        return;
    }
    int vocab = q3_model_vocab_size(m), n_prompt = depth > 128 ? depth : 128;
    int32_t *tokens = malloc((size_t)(n_prompt + gen) * sizeof *tokens);
    for (int i = 0; i < n_prompt + gen; i++) tokens[i] = (int32_t)((unsigned)(i * 7919 + 17) % (unsigned)vocab);
    float *logits = malloc((size_t)vocab * sizeof *logits);
    q3_ctx *c = s->ctx;
    if (only_isa) q3_cpu_unit_force_isa(c->prefill_unit, only_isa);
    printf("end to end, %s, unit cpu (%s, %d threads), KV cache %s:\n", dir, q3_cpu_unit_isa(c->prefill_unit)->name,
           c->prefill_unit->n_threads, q3_dtype_name(c->kv.dtype));

    /* the machine is shared: limits measured right before each phase */
    int nth = c->prefill_unit->n_threads;
    double peak_dot = q3_limit_peak(Q3_LIMIT_DOT_BF16, nth, 0.1, NULL);
    double peak_amx = q3_limit_peak(Q3_LIMIT_AMX_BF16, nth, 0.1, NULL);

    /* prefill: one chunk of 128 at position 0, best of reps */
    q3_runner_profile(&c->run_prefill, 1);
    double best = 1e30, sum = 0, handoff0 = c->handoff_seconds;
    q3_cpu_stats p0 = q3_cpu_unit_stats(c->prefill_unit);
    for (int rep = 0; rep < g_reps; rep++) {
        q3_session_reset(s);
        double t0 = now();
        q3_session_prefill(s, tokens, 128, logits, 0);
        double t = now() - t0;
        sum += t;
        if (t < best) best = t;
    }
    q3_cpu_stats p1 = q3_cpu_unit_stats(c->prefill_unit);
    double flop = q3_graph_flops(&c->prefill, 128, 0);
    printf("  prefill chunk 128: best %.1f ms, mean %.1f ms; %.1f GFLOP/s = %.0f%% of the vdpbf16ps peak (%.1f), "
           "%.0f%% of the AMX peak (%.1f), both measured just before; K/V hand-off (session) %.2f ms\n",
           best * 1e3, sum / g_reps * 1e3, flop / best * 1e-9, 100 * flop / best * 1e-9 / peak_dot, peak_dot,
           peak_amx > 0 ? 100 * flop / best * 1e-9 / peak_amx : 0, peak_amx,
           (c->handoff_seconds - handoff0) / g_reps * 1e3);
    printf("  prefill: %.1f pool jobs (barriers) per chunk, the K/V hand-off's included\n",
           (double)(p1.pool_jobs - p0.pool_jobs) / g_reps);
    print_profile(&c->run_prefill, g_reps, sum / g_reps);

    /* decode: gen tokens after a prompt of n_prompt */
    q3_session_reset(s);
    q3_session_prefill(s, tokens, (size_t)n_prompt, NULL, 0);
    q3_runner_profile(&c->run_decode, 1);
    double bw = q3_limit_read_gbs(nth, (size_t)512 << 20, 2);
    double *times = malloc((size_t)gen * sizeof *times);
    q3_cpu_stats s0 = q3_cpu_unit_stats(c->decode_unit);
    double dsum = 0;
    for (int i = 0; i < gen; i++) {
        double t0 = now();
        q3_session_decode(s, tokens[n_prompt + i], logits);
        times[i] = now() - t0;
        dsum += times[i];
    }
    q3_cpu_stats s1 = q3_cpu_unit_stats(c->decode_unit);
    qsort(times, (size_t)gen, sizeof *times, cmp_double);
    double bytes = (double)q3_model_active_bytes(m); /* what one token reads: the chosen experts of a MoE model */
    double bw_after = q3_limit_read_gbs(nth, (size_t)512 << 20, 2);
    printf("  decode at depth %d: p50 %.2f ms/token (%.1f tok/s), min %.2f ms, p99 %.2f ms; weights at %.1f GB/s "
           "(p50), %.1f GB/s (min) = %.0f%% / %.0f%% of the read bandwidth measured around it (%.1f before, %.1f "
           "after); %.1f pool jobs (barriers) per token\n",
           n_prompt, times[gen / 2] * 1e3, 1 / times[gen / 2], times[0] * 1e3, times[gen - 1 - gen / 100] * 1e3,
           bytes / times[gen / 2] * 1e-9, bytes / times[0] * 1e-9, 100 * bytes / times[gen / 2] * 1e-9 / fmax(bw, bw_after),
           100 * bytes / times[0] * 1e-9 / fmax(bw, bw_after), bw, bw_after, (double)(s1.pool_jobs - s0.pool_jobs) / gen);
    print_profile(&c->run_decode, gen, dsum / gen);
    free(times);
    free(tokens);
    free(logits);
    q3_session_free(s);
    q3_model_close(m);
}

int main(int argc, char **argv)
{
    const char *only = NULL, *only_isa = NULL, *model = NULL;
    int gen = 32, depth = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--reps") && i + 1 < argc) g_reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--bw") && i + 1 < argc) g_bw = atof(argv[++i]);
        else if (!strcmp(argv[i], "--peak") && i + 1 < argc) g_peak = atof(argv[++i]);
        else if (!strcmp(argv[i], "--only") && i + 1 < argc) only = argv[++i];
        else if (!strcmp(argv[i], "--isa") && i + 1 < argc) only_isa = argv[++i];
        else if (!strcmp(argv[i], "--wtype") && i + 1 < argc && (!strcmp(argv[i + 1], "f16") || !strcmp(argv[i + 1], "bf16")))
            g_wtype = !strcmp(argv[++i], "f16") ? Q3_F16 : Q3_BF16;
        else if (!strcmp(argv[i], "--model") && i + 1 < argc) model = argv[++i];
        else if (!strcmp(argv[i], "--gen") && i + 1 < argc) gen = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--depth") && i + 1 < argc) depth = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--layers") && i + 1 < argc) g_layers = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--kv") && i + 1 < argc && (!strcmp(argv[i + 1], "f16") || !strcmp(argv[i + 1], "q8_0")))
            g_kv = !strcmp(argv[++i], "f16") ? Q3_F16 : Q3_Q8_0;
        else if (!strcmp(argv[i], "--gqa") && i + 1 < argc) {
            g_gqa = atoi(argv[++i]);
            if (g_gqa < 1 || g_gqa > MAX_GQA) {
                fprintf(stderr, "--gqa takes 1 to %d query heads a KV head\n", MAX_GQA);
                return 2;
            }
        }
        else {
            fprintf(stderr, "usage: %s [--reps N] [--bw GBS] [--peak GFLOPS] [--isa amx|avx512|avx2] "
                            "[--wtype bf16|f16] [--only gemm|gemv|token|prefill|attn|attn-stream|e2e] [--model DIR] [--gen N] [--depth N] "
                            "[--layers N] [--gqa G] [--kv f16|q8_0]\n", argv[0]);
            return 2;
        }
    }
    if (q3_unit_open(&q3_backend_cpu, NULL, &g_cpu) || q3_unit_open(&q3_backend_ref, NULL, &g_ref)) {
        fprintf(stderr, "%s\n", q3_last_error());
        return 1;
    }
    int nth = g_cpu->n_threads;
    if (g_bw <= 0) g_bw = q3_limit_read_gbs(nth, (size_t)1 << 30, 3);
    /* the matmuls' peak: vdpbf16ps for BF16 weights, F32 FMA for F16 (widened exactly to F32) */
    if (g_peak <= 0) g_peak = q3_limit_peak(g_wtype == Q3_F16 ? Q3_LIMIT_FMA_F32 : Q3_LIMIT_DOT_BF16, nth, 0.2, NULL);
    printf("cpu unit: %d threads; %s weights; limits: read %.1f GB/s, %s peak %.1f GFLOP/s\n", nth,
           q3_dtype_name(g_wtype), g_bw, g_wtype == Q3_F16 ? "F32 FMA" : "BF16 dot (vdpbf16ps)", g_peak);
    if (!only || !strcmp(only, "gemm")) {
        printf("GEMM (prefill chunk of 128 rows):\n");
        for (size_t i = 0; i < 7; i++) bench_shape(&shapes[i], 128, only_isa);
    }
    if (!only || !strcmp(only, "gemv")) {
        printf("GEMV (decode):\n");
        for (size_t i = 0; i < 8; i++) bench_shape(&shapes[i], 1, only_isa);
    }
    if (!only || !strcmp(only, "token")) bench_token(only_isa);
    if (!only || !strcmp(only, "prefill")) bench_prefill(only_isa);
    if (!only || !strcmp(only, "attn")) bench_attention(only_isa);
    if (!only || !strcmp(only, "attn") || !strcmp(only, "attn-stream")) bench_attention_stream(only_isa, depth);
    if (model && (!only || !strcmp(only, "e2e"))) {
        bench_e2e(model, gen > 0 ? gen : 1, depth, only_isa);
    }
    return 0;
}
