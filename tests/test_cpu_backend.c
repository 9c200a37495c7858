/* The cpu unit against the reference unit, op by op, on hand-built one-op
 * graphs with random data and shapes that are not multiples of the vector
 * width: every op, F32/F16/BF16 weights, F32/F16/BF16 KV caches, on each
 * kernel table the CPU has (AVX-512 with AMX, AVX-512 BF16, AVX2). Also checks the promises
 * the golden tests' mode agreement rests on: a GEMV row equals the same row
 * of a GEMM bit for bit, and decode attention equals prefill attention. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_features.h"
#include "backend/cpu/threadpool.h"
#include "q3.h"
#include "test.h"

/* ---- random data ---------------------------------------------------------------- */

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static uint32_t rnd(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 32);
}

static float frand(float lo, float hi) { return lo + (hi - lo) * (float)(rnd() >> 8) * (1.0f / 16777216.0f); }

static void fill(float *p, size_t n, float lo, float hi)
{
    for (size_t i = 0; i < n; i++) p[i] = frand(lo, hi);
}

/* ---- a one-op graph ------------------------------------------------------------------- */

#define MAX_VALUES 4

typedef struct rig {
    q3_config cfg;
    q3_graph g;
    q3_value values[MAX_VALUES];
    q3_op op;
    float *init[MAX_VALUES];   /* initial contents of each value */
    float *out[2];             /* the op's output after each unit ran */
    q3_kv_pool kv[2];          /* one pool per unit, same initial contents */
    int32_t *table;            /* the sequence's blocks: a shuffled permutation of the pool's */
    bool has_kv;
    int32_t tokens[256];
    int n_real, pos;
} rig;

static void rig_config(rig *R, int n_heads, int n_kv_heads, int head_dim)
{
    memset(R, 0, sizeof *R);
    R->cfg = (q3_config){.n_layers = 2, .dim = 64, .ffn_dim = 96, .n_heads = n_heads, .n_kv_heads = n_kv_heads,
                         .head_dim = head_dim, .vocab_size = 300, .max_seq_len = 4096, .rms_eps = 1e-6f,
                         .rope_theta = 1e6f};
    R->g.cfg = &R->cfg;
    R->g.values = R->values;
    R->g.ops = &R->op;
    R->g.n_ops = 1;
    for (int i = 0; i < 3; i++) R->op.in[i] = -1;
    R->op.out = -1;
}

static int rig_value(rig *R, int rows, int cols, float lo, float hi)
{
    int v = R->g.n_values++;
    R->values[v] = (q3_value){.rows = rows, .cols = cols};
    snprintf(R->values[v].name, sizeof R->values[v].name, "v%d", v);
    R->init[v] = calloc((size_t)rows * cols, sizeof(float));
    fill(R->init[v], (size_t)rows * cols, lo, hi);
    return v;
}

/* Units under test: [0] the reference, [1] the cpu unit (its kernel table forced per pass). */
static q3_unit *units[2];

static void *kv_k(const rig *R, int u, int l, int t) { return q3_kv_k_row(&R->kv[u], R->table, l, t); }
static void *kv_v(const rig *R, int u, int l, int t) { return q3_kv_v_row(&R->kv[u], R->table, l, t); }

/* A KV pool for both units with positions [0, filled) of one sequence set to
 * random K/V; the sequence's blocks are scattered over the pool in shuffled
 * order, so the kernels must read through the block table. */
static void rig_kv(rig *R, q3_dtype dtype, int n_ctx, int filled)
{
    R->has_kv = true;
    int kv_dim = R->cfg.n_kv_heads * R->cfg.head_dim, nb = q3_kv_blocks_for(n_ctx), pool_blocks = 2 * nb + 1;
    float *row = malloc((size_t)kv_dim * sizeof *row);
    for (int u = 0; u < 2; u++) q3_kv_pool_init(&R->kv[u], &R->cfg, dtype, pool_blocks, 1, n_ctx);
    int32_t *perm = malloc((size_t)pool_blocks * sizeof *perm);
    for (int i = 0; i < pool_blocks; i++) perm[i] = i;
    for (int i = pool_blocks - 1; i > 0; i--) {
        int j = (int)(rnd() % (uint32_t)(i + 1));
        int32_t t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    R->table = perm; /* the first nb entries are the sequence's blocks */
    for (int l = 0; l < R->cfg.n_layers; l++)
        for (int t = 0; t < filled; t++) {
            fill(row, (size_t)kv_dim, -2, 2);
            q3_row_from_f32(dtype, row, kv_k(R, 0, l, t), (size_t)kv_dim);
            fill(row, (size_t)kv_dim, -2, 2);
            q3_row_from_f32(dtype, row, kv_v(R, 0, l, t), (size_t)kv_dim);
        }
    memcpy(R->kv[1].data, R->kv[0].data, q3_kv_pool_bytes(&R->kv[0]));
    free(row);
}

/* Runs the op on unit u (0 = ref, 1 = cpu) over fresh copies of the values. */
static void rig_run(rig *R, int u)
{
    q3_unit *unit = units[u];
    float *buf[MAX_VALUES];
    for (int v = 0; v < R->g.n_values; v++) {
        size_t n = (size_t)R->values[v].rows * R->values[v].cols;
        buf[v] = malloc(n * sizeof(float));
        memcpy(buf[v], R->init[v], n * sizeof(float));
    }
    int32_t pos[256];
    const int32_t *tables[256];
    for (int r = 0; r < 256; r++) {
        pos[r] = R->pos + r; /* rows of one sequence at consecutive positions */
        tables[r] = R->table;
    }
    q3_exec e = {.g = &R->g, .buf = buf, .tokens = R->tokens, .n_real = R->n_real, .pos = pos,
                 .kv = R->has_kv ? &R->kv[u] : NULL, .table = tables};
    const q3_backend *b = unit->b;
    CHECK(b->refuses(b, &R->g, &R->op) == NULL, "%s refuses %s", b->name, q3_op_kind_name(R->op.kind));
    q3_status st = b->run(unit->impl, &e, &R->op);
    CHECK(st == Q3_OK, "%s %s: %s", b->name, q3_op_kind_name(R->op.kind), q3_last_error());
    free(R->out[u]);
    R->out[u] = NULL;
    for (int v = 0; v < R->g.n_values; v++) {
        if (v == R->op.out) R->out[u] = buf[v];
        else free(buf[v]);
    }
}

static void rig_free(rig *R)
{
    for (int v = 0; v < R->g.n_values; v++) free(R->init[v]);
    free(R->out[0]);
    free(R->out[1]);
    if (R->has_kv) {
        for (int u = 0; u < 2; u++) q3_kv_pool_free(&R->kv[u]);
        free(R->table);
    }
}

/* Largest |cpu - ref| / (abs_tol + rel_tol * |ref|) over the live rows of the output. */
static double rig_worst(const rig *R, double abs_tol, double rel_tol)
{
    const q3_value *o = &R->values[R->op.out];
    int rows = o->rows == 1 ? 1 : R->n_real;
    double worst = 0;
    for (size_t i = 0; i < (size_t)rows * o->cols; i++) {
        double d = fabs((double)R->out[1][i] - R->out[0][i]) / (abs_tol + rel_tol * fabs(R->out[0][i]));
        if (!(d <= worst)) worst = d; /* NaN counts */
    }
    return worst;
}

/* A weight tensor of dtype t over random values: [rows][cols], or [cols] when
 * rows is 0 (a norm). The caller frees .data. */
static q3_tensor make_weight(q3_dtype t, int rows, int cols, float lo, float hi)
{
    q3_tensor w = {.dtype = t, .ndim = rows > 0 ? 2 : 1};
    if (rows > 0) {
        w.shape[0] = rows;
        w.shape[1] = cols;
    } else {
        w.shape[0] = cols;
    }
    snprintf(w.name, sizeof w.name, "w");
    size_t n = (size_t)(rows > 0 ? rows : 1) * cols;
    float *f = malloc(n * sizeof *f);
    fill(f, n, lo, hi);
    w.nbytes = q3_dtype_row_bytes(t, n);
    void *data = malloc(w.nbytes);
    q3_row_from_f32(t, f, data, n);
    w.data = data;
    free(f);
    return w;
}

static const q3_dtype wtypes[] = {Q3_F32, Q3_F16, Q3_BF16};
static const q3_dtype kvtypes[] = {Q3_F32, Q3_F16, Q3_BF16, Q3_Q8_0};
#define N_KVTYPES (sizeof kvtypes / sizeof *kvtypes)

/* Rounds n values to dtype t and back, as a cache (or BF16 packing) would. */
static void round_to(q3_dtype t, float *p, size_t n)
{
    float *tmp = malloc(n * sizeof *tmp); /* room for any row of n values */
    if (t != Q3_F32) {
        q3_row_from_f32(t, p, tmp, n);
        q3_row_to_f32(t, tmp, p, n);
    }
    free(tmp);
}

/* ---- matmul ----------------------------------------------------------------------------- */

/* One matmul of m x k by n x k weights of type wt against the reference,
 * and each of its rows alone (the GEMV) against its row of the GEMM, bit for bit. */
static void check_matmul(const char *isa, q3_dtype wt, int m, int n, int k)
{
    bool bf16_act = q3_cpu_unit_isa(units[1])->bf16_activations;
    rig R;
    rig_config(&R, 4, 2, 8);
    q3_tensor w = make_weight(wt, n, k, -1, 1);
    int x = rig_value(&R, m, k, -1, 1), y = rig_value(&R, m, n, 0, 0);
    R.op = (q3_op){.kind = Q3_OP_MATMUL, .out = y, .in = {x, -1, -1}, .weight = &w};
    R.n_real = m;
    rig_run(&R, 0);
    rig_run(&R, 1);
    /* BF16 weights on the BF16 path: each activation rounded to BF16 (2^-9
       relative), so |error| <= 2^-9 sum |x||w| <= 2^-9 k (|x|, |w| <= 1) */
    double tol = wt == Q3_BF16 && bf16_act ? 0x1p-9 * k + 1e-5 : 2e-6 * k + 1e-6;
    double worst = rig_worst(&R, tol, 0);
    CHECK(worst <= 1, "[%s] matmul %s m=%d n=%d k=%d: error %.3g of tolerance", isa,
          q3_dtype_name(wt), m, n, k, worst);
    if (wt == Q3_BF16 && bf16_act) {
        /* activations already BF16: only the F32 summation order differs */
        round_to(Q3_BF16, R.init[x], (size_t)m * k);
        rig_run(&R, 0);
        rig_run(&R, 1);
        worst = rig_worst(&R, 2e-6 * k + 1e-6, 0);
        CHECK(worst <= 1, "[%s] matmul bf16 (BF16 inputs) m=%d n=%d k=%d: error %.3g of tolerance", isa,
              m, n, k, worst);
    }
    /* each row alone (GEMV) must equal its row of the GEMM bit for bit */
    if (m > 1) {
        float *gemm = R.out[1];
        R.out[1] = NULL;
        int diff_rows = 0;
        for (int r = 0; r < m; r++) {
            memcpy(R.init[x], R.init[x] + (size_t)r * k, (size_t)k * sizeof(float));
            R.values[x].rows = R.values[y].rows = 1;
            R.n_real = 1;
            rig_run(&R, 1);
            diff_rows += memcmp(R.out[1], gemm + (size_t)r * n, (size_t)n * sizeof(float)) != 0;
            /* back to m rows (row 0 of init now holds row r: no longer needed) */
            R.values[x].rows = R.values[y].rows = m;
        }
        CHECK(diff_rows == 0, "[%s] matmul %s m=%d n=%d k=%d: %d GEMV rows differ from the GEMM", isa,
              q3_dtype_name(wt), m, n, k, diff_rows);
        free(gemm);
    }
    rig_free(&R);
    free((void *)w.data);
}

static void test_matmul(const char *isa)
{
    static const int ms[] = {1, 2, 3, 5, 8, 13, 17, 40};
    static const int ns[] = {1, 3, 8, 16, 17, 61, 130};
    static const int ks[] = {1, 7, 16, 33, 64, 100, 515, 1056};
    for (size_t ti = 0; ti < 3; ti++)
        for (size_t a = 0; a < sizeof ms / sizeof *ms; a++)
            for (size_t b = 0; b < sizeof ns / sizeof *ns; b++)
                for (size_t c = 0; c < sizeof ks / sizeof *ks; c++) {
                    if ((a + b + c) % 3 && ks[c] > 100) continue; /* keep the run short */
                    check_matmul(isa, wtypes[ti], ms[a], ns[b], ks[c]);
                }
    /* rows so long (64 KB of F32) that the AVX-512 GEMM takes the rows in
       slabs of a few (its activations per pass stay in L2), a short last slab
       and a short last row tile included, over many K blocks and a tail */
    for (size_t ti = 0; ti < 3; ti++) {
        check_matmul(isa, wtypes[ti], 13, 17, 16391);
        check_matmul(isa, wtypes[ti], 21, 7, 16391);
    }
}

/* Matmuls over one input (a layer's Q, K, V) run by run_many as one pool job,
 * each output bit for bit what run() gives op by op; weights of three types so
 * the shared input is prepared again where the type changes; the op after them
 * (another input) is left for the next call. */
/* A layer's gate and up matmuls and their SwiGLU (into the gate's output),
 * run by run_many as one pool job: the gate's values bit for bit what run()
 * gives op by op, decode-sized and prefill-sized, for each plain weight type. */
static void test_swiglu_fused(const char *isa)
{
    static const q3_dtype ts[3] = {Q3_BF16, Q3_F16, Q3_F32};
    static const int ms[3] = {1, 3, 40};
    const int k = 515, n = 520; /* n * k >= the pool threshold; n not a multiple of any granule */
    for (int ti = 0; ti < 3; ti++)
        for (int mi = 0; mi < 3; mi++) {
            int m = ms[mi];
            q3_config cfg = {.n_layers = 1, .dim = k, .ffn_dim = n, .n_heads = 1, .n_kv_heads = 1, .head_dim = 8,
                             .vocab_size = 300, .max_seq_len = 64, .rms_eps = 1e-6f, .rope_theta = 1e6f};
            q3_value values[3] = {{.name = "h", .rows = m, .cols = k}, {.name = "gate", .rows = m, .cols = n},
                                  {.name = "up", .rows = m, .cols = n}};
            q3_tensor w[2] = {make_weight(ts[ti], n, k, -1, 1), make_weight(ts[ti], n, k, -1, 1)};
            q3_op ops[3] = {
                {.kind = Q3_OP_MATMUL, .name = "ffn_gate", .out = 1, .out2 = -1, .in = {0, -1, -1}, .weight = &w[0]},
                {.kind = Q3_OP_MATMUL, .name = "ffn_up", .out = 2, .out2 = -1, .in = {0, -1, -1}, .weight = &w[1]},
                {.kind = Q3_OP_SWIGLU, .name = "ffn_swiglu", .out = 1, .out2 = -1, .in = {1, 2, -1}},
            };
            q3_graph g = {.kind = Q3_GRAPH_PREFILL, .cfg = &cfg, .rows = m, .ops = ops, .n_ops = 3, .values = values,
                          .n_values = 3};
            float *buf[2][3];
            for (int v = 0; v < 3; v++) {
                size_t cnt = (size_t)values[v].rows * values[v].cols;
                buf[0][v] = calloc(cnt, sizeof(float));
                buf[1][v] = calloc(cnt, sizeof(float));
            }
            fill(buf[0][0], (size_t)m * k, -1, 1);
            memcpy(buf[1][0], buf[0][0], (size_t)m * k * sizeof(float));
            int32_t pos[40] = {0}, tokens[40] = {0};
            q3_exec e0 = {.g = &g, .buf = buf[0], .tokens = tokens, .n_real = m, .pos = pos};
            q3_exec e1 = e0;
            e1.buf = buf[1];
            const q3_backend *b = units[1]->b;
            for (int i = 0; i < 3; i++) CHECK(b->run(units[1]->impl, &e0, &ops[i]) == Q3_OK, "run: %s", q3_last_error());
            uint64_t jobs0 = q3_cpu_unit_stats(units[1]).pool_jobs;
            int ran = 0;
            CHECK(b->run_many(units[1]->impl, &e1, ops, 3, &ran) == Q3_OK, "run_many: %s", q3_last_error());
            uint64_t jobs = q3_cpu_unit_stats(units[1]).pool_jobs - jobs0;
            bool pool = units[1]->n_threads > 1;
            CHECK(ran == (pool ? 3 : 1), "[%s] %s m=%d: run_many ran %d ops, want gate, up and SwiGLU", isa,
                  q3_dtype_name(ts[ti]), m, ran);
            CHECK(jobs == (pool ? 1u : 0u), "[%s] m=%d: %llu pool jobs for gate, up and SwiGLU", isa, m,
                  (unsigned long long)jobs);
            for (int i = ran; i < 3; i++) /* the rest op by op */
                CHECK(b->run(units[1]->impl, &e1, &ops[i]) == Q3_OK, "run: %s", q3_last_error());
            CHECK(!memcmp(buf[0][1], buf[1][1], (size_t)m * n * sizeof(float)),
                  "[%s] %s m=%d: gate/up/SwiGLU fused differs from op by op", isa, q3_dtype_name(ts[ti]), m);
            for (int v = 0; v < 3; v++) {
                free(buf[0][v]);
                free(buf[1][v]);
            }
            free((void *)w[0].data);
            free((void *)w[1].data);
        }
}

static void test_matmul_group(const char *isa)
{
    static const int ns[4] = {600, 520, 530, 520};
    static const q3_dtype ts[4] = {Q3_BF16, Q3_F16, Q3_BF16, Q3_F32};
    const int k = 515; /* each n * k >= the unit's threshold for running on the pool */
    for (int m = 1; m <= 3; m += 2) {
        q3_config cfg = {.n_layers = 1, .dim = k, .ffn_dim = k, .n_heads = 1, .n_kv_heads = 1, .head_dim = 8,
                         .vocab_size = 300, .max_seq_len = 64, .rms_eps = 1e-6f, .rope_theta = 1e6f};
        q3_value values[6];
        q3_op ops[4];
        q3_tensor w[4];
        values[0] = (q3_value){.name = "x", .rows = m, .cols = k};
        values[5] = (q3_value){.name = "x2", .rows = m, .cols = k};
        for (int i = 0; i < 4; i++) {
            w[i] = make_weight(ts[i], ns[i], k, -1, 1);
            values[1 + i] = (q3_value){.rows = m, .cols = ns[i]};
            snprintf(values[1 + i].name, sizeof values[1 + i].name, "y%d", i);
            /* the last one reads another input: not part of the group */
            ops[i] = (q3_op){.kind = Q3_OP_MATMUL, .out = 1 + i, .out2 = -1, .in = {i == 3 ? 5 : 0, -1, -1},
                             .weight = &w[i]};
        }
        q3_graph g = {.kind = Q3_GRAPH_DECODE, .cfg = &cfg, .rows = m, .ops = ops, .n_ops = 4, .values = values,
                      .n_values = 6};
        float *buf[2][6];
        for (int v = 0; v < 6; v++) {
            size_t n = (size_t)values[v].rows * values[v].cols;
            buf[0][v] = calloc(n, sizeof(float));
            buf[1][v] = calloc(n, sizeof(float));
            if (v == 0 || v == 5) {
                fill(buf[0][v], n, -1, 1);
                memcpy(buf[1][v], buf[0][v], n * sizeof(float));
            }
        }
        int32_t pos[3] = {0, 0, 0}, tokens[3] = {0, 0, 0};
        q3_exec e0 = {.g = &g, .buf = buf[0], .tokens = tokens, .n_real = m, .pos = pos};
        q3_exec e1 = e0;
        e1.buf = buf[1];
        const q3_backend *b = units[1]->b;
        for (int i = 0; i < 4; i++) CHECK(b->run(units[1]->impl, &e0, &ops[i]) == Q3_OK, "run: %s", q3_last_error());
        uint64_t jobs0 = q3_cpu_unit_stats(units[1]).pool_jobs;
        int ran = 0;
        CHECK(b->run_many && b->run_many(units[1]->impl, &e1, ops, 4, &ran) == Q3_OK, "run_many: %s", q3_last_error());
        uint64_t jobs = q3_cpu_unit_stats(units[1]).pool_jobs - jobs0;
        /* one thread: each matmul runs inline, alone */
        bool pool = units[1]->n_threads > 1;
        CHECK(ran == (pool ? 3 : 1), "[%s] m=%d: run_many ran %d ops, want the 3 over one input", isa, m, ran);
        CHECK(jobs == (pool ? 1u : 0u), "[%s] m=%d: %llu pool jobs for 3 matmuls", isa, m, (unsigned long long)jobs);
        for (int i = 1; i < 3 && ran == 1; i++) /* the rest op by op */
            CHECK(b->run(units[1]->impl, &e1, &ops[i]) == Q3_OK, "run: %s", q3_last_error());
        for (int i = 0; i < 3; i++)
            CHECK(!memcmp(buf[0][1 + i], buf[1][1 + i], (size_t)m * ns[i] * sizeof(float)),
                  "[%s] m=%d: matmul %d (%s) run together differs from alone", isa, m, i, q3_dtype_name(ts[i]));
        for (int v = 0; v < 6; v++) {
            free(buf[0][v]);
            free(buf[1][v]);
        }
        for (int i = 0; i < 4; i++) free((void *)w[i].data);
    }
}

/* ---- attention ---------------------------------------------------------------------------- */

static void test_attention(const char *isa)
{
    /* query heads per KV head (GQA group): 1, 2, 4, 8 (the larger Qwen3s), 16 */
    static const int shapes[][3] = {{4, 2, 8},  {2, 2, 20},   {8, 2, 64}, {16, 8, 128},
                                    {6, 3, 36}, {6, 3, 32},   {16, 2, 64}, {16, 1, 32}};
    /* pos, rows: inside the first 256-key super-block, straddling it, and deep (several) */
    static const int cases[][2] = {{0, 1}, {0, 7}, {3, 5}, {17, 16}, {40, 33}, {250, 20}, {520, 9}, {700, 40}};
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++)
        for (size_t kt = 0; kt < N_KVTYPES; kt++)
            for (size_t ci = 0; ci < sizeof cases / sizeof *cases; ci++) {
                int nh = shapes[s][0], nkv = shapes[s][1], hd = shapes[s][2];
                int pos = cases[ci][0], rows = cases[ci][1];
                q3_dtype kvt = kvtypes[kt];
                if (kvt == Q3_Q8_0 && hd % 32) continue; /* Q8_0 caches need whole blocks per head */
                int kv_dim = nkv * hd;
                /* prefill: past [0, pos) from the cache, the chunk's rows from the op's inputs */
                rig R;
                rig_config(&R, nh, nkv, hd);
                int q = rig_value(&R, rows, nh * hd, -1.5f, 1.5f);
                int k = rig_value(&R, rows, kv_dim, -2, 2), v = rig_value(&R, rows, kv_dim, -2, 2);
                int o = rig_value(&R, rows, nh * hd, 0, 0);
                round_to(kvt, R.init[k], (size_t)rows * kv_dim);
                round_to(kvt, R.init[v], (size_t)rows * kv_dim);
                rig_kv(&R, kvt, pos + rows + 1, pos);
                R.op = (q3_op){.kind = Q3_OP_ATTENTION, .layer = 1, .out = o, .in = {q, k, v}, .reads_state = true};
                R.n_real = rows;
                R.pos = pos;
                rig_run(&R, 0);
                rig_run(&R, 1);
                double worst = rig_worst(&R, 2e-6, 2e-5);
                CHECK(worst <= 1, "[%s] prefill attention %d/%d x %d, kv %s, pos %d rows %d: error %.3g of tolerance",
                      isa, nh, nkv, hd, q3_dtype_name(kvt), pos, rows, worst);

                /* decode of each row with its K/V in the cache: bit-identical to prefill */
                float *prefill_out = R.out[1];
                R.out[1] = NULL;
                size_t rb = R.kv[1].row_bytes;
                for (int t = 0; t < rows; t++) {
                    q3_row_from_f32(kvt, R.init[k] + (size_t)t * kv_dim, kv_k(&R, 1, 1, pos + t), (size_t)kv_dim);
                    q3_row_from_f32(kvt, R.init[v] + (size_t)t * kv_dim, kv_v(&R, 1, 1, pos + t), (size_t)kv_dim);
                }
                for (int t = 0; t < pos + rows; t++) {
                    memcpy(kv_k(&R, 0, 1, t), kv_k(&R, 1, 1, t), rb);
                    memcpy(kv_v(&R, 0, 1, t), kv_v(&R, 1, 1, t), rb);
                }
                int bad = 0;
                double dec_worst = 0;
                float *q_all = R.init[q];
                for (int t = 0; t < rows; t++) {
                    rig D;
                    rig_config(&D, nh, nkv, hd);
                    int dq = rig_value(&D, 1, nh * hd, 0, 0), dout = rig_value(&D, 1, nh * hd, 0, 0);
                    memcpy(D.init[dq], q_all + (size_t)t * nh * hd, (size_t)nh * hd * sizeof(float));
                    D.has_kv = true;
                    D.kv[0] = R.kv[0];
                    D.kv[1] = R.kv[1];
                    D.table = R.table;
                    D.op = (q3_op){.kind = Q3_OP_ATTENTION, .layer = 1, .out = dout, .in = {dq, -1, -1}, .reads_state = true};
                    D.n_real = 1;
                    D.pos = pos + t;
                    rig_run(&D, 0);
                    rig_run(&D, 1);
                    double w = rig_worst(&D, 2e-6, 2e-5);
                    if (w > dec_worst) dec_worst = w;
                    bad += memcmp(D.out[1], prefill_out + (size_t)t * nh * hd, (size_t)nh * hd * sizeof(float)) != 0;
                    D.has_kv = false; /* the caches belong to R */
                    rig_free(&D);
                }
                CHECK(dec_worst <= 1, "[%s] decode attention %d/%d x %d, kv %s: error %.3g of tolerance", isa, nh, nkv,
                      hd, q3_dtype_name(kvt), dec_worst);
                CHECK(bad == 0, "[%s] attention %d/%d x %d, kv %s, pos %d: %d decode rows differ from prefill", isa, nh,
                      nkv, hd, q3_dtype_name(kvt), pos, bad);
                free(prefill_out);
                rig_free(&R);
            }
}

/* Decode of B sequences in one op: each row attends over its own sequence's
 * blocks (lengths differ, blocks interleaved in one pool), and each row equals
 * the same row decoded alone bit for bit; the batched KV_APPEND writes each
 * row into its own sequence. */
static void run_op(q3_unit *u, const q3_graph *g, float **buf, int n, const int32_t *pos, q3_kv_pool *kv,
                   const int32_t *const *tables, const q3_op *op)
{
    q3_exec e = {.g = g, .buf = buf, .n_real = n, .pos = pos, .kv = kv, .table = tables};
    q3_status st = u->b->run(u->impl, &e, op);
    CHECK(st == Q3_OK, "%s %s: %s", u->b->name, q3_op_kind_name(op->kind), q3_last_error());
}

static void test_decode_batch(const char *isa)
{
    enum { B = 6 };
    static const int lens[B] = {1, 17, 300, 5, 256, 530};
    static const int group[] = {4, 8}; /* query heads per KV head */
    for (size_t kt = 0; kt < N_KVTYPES * 2; kt++) {
        q3_dtype kvt = kvtypes[kt % N_KVTYPES];
        int G = group[kt / N_KVTYPES];
        q3_config cfg = {.n_layers = 2, .dim = 64, .ffn_dim = 96, .n_heads = 2 * G, .n_kv_heads = 2,
                         .head_dim = kvt == Q3_Q8_0 ? 64 : 36,
                         .vocab_size = 300, .max_seq_len = 4096, .rms_eps = 1e-6f, .rope_theta = 1e6f};
        int kv_dim = cfg.n_kv_heads * cfg.head_dim, qd = cfg.n_heads * cfg.head_dim;
        q3_kv_pool kv;
        CHECK(q3_kv_pool_init(&kv, &cfg, kvt, 200, B, 1024) == Q3_OK, "pool: %s", q3_last_error());
        int seq[B];
        for (int b = 0; b < B; b++) q3_kv_seq_add(&kv, &seq[b]);
        /* grow the sequences a block at a time, in turn, so their blocks interleave */
        int32_t zeros[Q3_KV_BLOCK_TOKENS] = {0};
        for (int round = 0; round * Q3_KV_BLOCK_TOKENS < 1024; round++)
            for (int b = 0; b < B; b++) {
                int have = q3_kv_seq_len(&kv, seq[b]), want = lens[b] + 1; /* + the decoded position */
                int n = want - have < Q3_KV_BLOCK_TOKENS ? want - have : Q3_KV_BLOCK_TOKENS;
                if (n <= 0) continue;
                CHECK(q3_kv_seq_reserve(&kv, seq[b], n) == Q3_OK, "reserve: %s", q3_last_error());
                q3_kv_seq_commit(&kv, seq[b], zeros, n);
            }
        float *row = malloc((size_t)kv_dim * sizeof *row);
        for (int b = 0; b < B; b++)
            for (int l = 0; l < cfg.n_layers; l++)
                for (int t = 0; t < lens[b]; t++) {
                    fill(row, (size_t)kv_dim, -2, 2);
                    q3_row_from_f32(kvt, row, q3_kv_k_row(&kv, kv.seqs[seq[b]].table, l, t), (size_t)kv_dim);
                    fill(row, (size_t)kv_dim, -2, 2);
                    q3_row_from_f32(kvt, row, q3_kv_v_row(&kv, kv.seqs[seq[b]].table, l, t), (size_t)kv_dim);
                }
        q3_kv_pool kv_ref = kv; /* the reference writes into a copy of the blocks */
        kv_ref.data = malloc(q3_kv_pool_bytes(&kv));
        memcpy(kv_ref.data, kv.data, q3_kv_pool_bytes(&kv));

        q3_value values[4] = {{.rows = B, .cols = kv_dim}, {.rows = B, .cols = kv_dim}, {.rows = B, .cols = qd},
                              {.rows = B, .cols = qd}};
        q3_graph g = {.kind = Q3_GRAPH_DECODE, .cfg = &cfg, .rows = B, .values = values, .n_values = 4};
        float *init[4], *buf[4], *ref_buf[4];
        for (int v = 0; v < 4; v++) {
            size_t n = (size_t)values[v].rows * values[v].cols;
            init[v] = malloc(n * sizeof(float));
            buf[v] = malloc(n * sizeof(float));
            ref_buf[v] = malloc(n * sizeof(float));
            fill(init[v], n, -1.5f, 1.5f);
            memcpy(buf[v], init[v], n * sizeof(float));
            memcpy(ref_buf[v], init[v], n * sizeof(float));
        }
        int32_t pos[B];
        const int32_t *tables[B];
        for (int b = 0; b < B; b++) {
            pos[b] = lens[b];
            tables[b] = kv.seqs[seq[b]].table;
        }
        q3_op append = {.kind = Q3_OP_KV_APPEND, .layer = 1, .out = -1, .in = {0, 1, -1}, .mutates_state = true};
        q3_op attn = {.kind = Q3_OP_ATTENTION, .layer = 1, .out = 3, .in = {2, -1, -1}, .reads_state = true};
        run_op(units[1], &g, buf, B, pos, &kv, tables, &append);
        run_op(units[0], &g, ref_buf, B, pos, &kv_ref, tables, &append);
        CHECK(!memcmp(kv.data, kv_ref.data, q3_kv_pool_bytes(&kv)),
              "[%s] batched kv_append %s: pool bytes differ from ref", isa, q3_dtype_name(kvt));
        run_op(units[1], &g, buf, B, pos, &kv, tables, &attn);
        run_op(units[0], &g, ref_buf, B, pos, &kv_ref, tables, &attn);
        double worst = 0;
        for (size_t i = 0; i < (size_t)B * qd; i++) {
            double d = fabs((double)buf[3][i] - ref_buf[3][i]) / (2e-6 + 2e-5 * fabs(ref_buf[3][i]));
            if (!(d <= worst)) worst = d;
        }
        CHECK(worst <= 1, "[%s] batched decode attention %s, GQA %d: error %.3g of tolerance", isa, q3_dtype_name(kvt), G,
              worst);
        /* each row alone */
        int differ = 0;
        q3_value one[4] = {{.rows = 1, .cols = kv_dim}, {.rows = 1, .cols = kv_dim}, {.rows = 1, .cols = qd},
                           {.rows = 1, .cols = qd}};
        q3_graph g1 = g;
        g1.rows = 1;
        g1.values = one;
        for (int b = 0; b < B; b++) {
            float *ob = calloc((size_t)qd, sizeof(float));
            float *b1[4] = {NULL, NULL, init[2] + (size_t)b * qd, ob};
            run_op(units[1], &g1, b1, 1, &pos[b], &kv, &tables[b], &attn);
            differ += memcmp(ob, buf[3] + (size_t)b * qd, (size_t)qd * sizeof(float)) != 0;
            free(ob);
        }
        CHECK(differ == 0, "[%s] batched decode attention %s, GQA %d: %d rows differ from the row alone", isa,
              q3_dtype_name(kvt), G, differ);
        for (int v = 0; v < 4; v++) {
            free(init[v]);
            free(buf[v]);
            free(ref_buf[v]);
        }
        free(kv_ref.data);
        free(row);
        q3_kv_pool_free(&kv);
    }
}

static void test_kv_append(const char *isa)
{
    for (size_t kt = 0; kt < N_KVTYPES; kt++) {
        rig R;
        int hd = kvtypes[kt] == Q3_Q8_0 ? 32 : 36; /* Q8_0: whole blocks per head */
        rig_config(&R, 6, 3, hd);
        int kv_dim = 3 * hd;
        int k = rig_value(&R, 1, kv_dim, -3, 3), v = rig_value(&R, 1, kv_dim, -3, 3);
        /* values that stress rounding: ties, tiny, huge, F16 subnormals and overflow */
        float special[] = {0.0f, -0.0f, 1.0f + 0x1p-8f, 1.0f + 0x1p-11f, 3e-8f, -6e-5f, 1e-39f, 65519.0f, 65520.0f,
                           -70000.0f, 1e30f, 0x1.0101p0f, 0x1.00801p0f};
        memcpy(R.init[k], special, sizeof special);
        /* Q8_0: a block whose values sit on rounding halves (x * id = k + 0.5 with
           amax = 127 exactly, so id = 1), one of tiny values only, one all zero */
        for (int i = 0; i < 32; i++) {
            R.init[v][i] = i == 0 ? 127.0f : (float)(i - 16) + 0.5f;
            R.init[v][32 + i] = (float)(i + 1) * 1e-40f;
            R.init[v][64 + i] = 0.0f;
        }
        rig_kv(&R, kvtypes[kt], 8, 3);
        R.op = (q3_op){.kind = Q3_OP_KV_APPEND, .layer = 1, .out = -1, .in = {k, v, -1}, .mutates_state = true};
        R.n_real = 1;
        R.pos = 3;
        rig_run(&R, 0);
        rig_run(&R, 1);
        size_t bytes = q3_kv_pool_bytes(&R.kv[0]);
        CHECK(!memcmp(R.kv[0].data, R.kv[1].data, bytes),
              "[%s] kv_append %s: cache bytes differ from ref", isa, q3_dtype_name(kvtypes[kt]));
        rig_free(&R);
    }
}

/* The K/V hand-off (store_rows): 300 rows of odd length, random bits (NaNs,
 * infinities, subnormals included) and values near F16/BF16 rounding ties, into
 * each cache dtype, bit for bit as q3_row_from_f32 writes them. */
static void test_store_rows(const char *isa)
{
    enum { ROWS = 300, N = 133 };
    float *src = malloc(sizeof(float) * ROWS * N);
    for (size_t i = 0; i < (size_t)ROWS * N; i++) {
        uint32_t u = rnd();
        if (i % 3 == 0) u = (u & 0x80001fffu) | (uint32_t)(0x30 + (rnd() % 0x20)) << 23 | 0x1000u; /* F16 ties */
        memcpy(&src[i], &u, 4);
    }
    for (size_t kt = 0; kt < N_KVTYPES; kt++) {
        size_t n = kvtypes[kt] == Q3_Q8_0 ? 4 * 32 : N, rb = q3_dtype_row_bytes(kvtypes[kt], n);
        char *got = malloc(rb * ROWS), *want = malloc(rb * ROWS);
        const float *srcs[ROWS];
        void *dsts[ROWS];
        for (int r = 0; r < ROWS; r++) {
            srcs[r] = src + (size_t)r * N;
            dsts[r] = got + rb * (size_t)r;
            q3_row_from_f32(kvtypes[kt], srcs[r], want + rb * (size_t)r, n);
        }
        memset(got, 0xAB, rb * ROWS);
        q3_backend_cpu.store_rows(units[1]->impl, kvtypes[kt], srcs, dsts, ROWS, n);
        CHECK(!memcmp(got, want, rb * ROWS), "[%s] store_rows %s differs from q3_row_from_f32", isa,
              q3_dtype_name(kvtypes[kt]));
        /* and back: the unit's to_f32 reads the rows as q3_row_to_f32 does */
        float *back = malloc(sizeof(float) * n), *back_ref = malloc(sizeof(float) * n);
        int back_bad = 0;
        for (int r = 0; r < ROWS; r++) {
            q3_cpu_unit_isa(units[1])->ew->to_f32(kvtypes[kt], want + rb * (size_t)r, back, n);
            q3_row_to_f32(kvtypes[kt], want + rb * (size_t)r, back_ref, n);
            back_bad += memcmp(back, back_ref, sizeof(float) * n) != 0;
        }
        CHECK(back_bad == 0, "[%s] to_f32 %s: %d rows differ from q3_row_to_f32", isa, q3_dtype_name(kvtypes[kt]),
              back_bad);
        free(back);
        free(back_ref);
        free(got);
        free(want);
    }
    free(src);
}

/* ---- elementwise ops ------------------------------------------------------------------------ */

static void test_elementwise(const char *isa)
{
    static const int rows_list[] = {1, 3, 40};
    static const int cols_list[] = {1, 15, 17, 64, 300, 1000};
    for (size_t ri = 0; ri < 3; ri++)
        for (size_t ci = 0; ci < sizeof cols_list / sizeof *cols_list; ci++) {
            int rows = rows_list[ri], cols = cols_list[ci];
            for (int kind = 0; kind < 3; kind++) { /* ADD, SWIGLU, RMSNORM with each weight dtype */
                for (size_t ti = 0; ti < (kind == 2 ? 3 : 1); ti++) {
                    rig R;
                    rig_config(&R, 4, 2, 8);
                    int a = rig_value(&R, rows, cols, -8, 8), b = rig_value(&R, rows, cols, -3, 3);
                    q3_tensor w = make_weight(wtypes[ti], 0, cols, 0.5f, 1.5f);
                    R.n_real = rows;
                    const char *name;
                    if (kind == 0) {
                        R.op = (q3_op){.kind = Q3_OP_ADD, .out = a, .in = {a, b, -1}};
                        name = "add";
                    } else if (kind == 1) {
                        R.op = (q3_op){.kind = Q3_OP_SWIGLU, .out = a, .in = {a, b, -1}};
                        name = "swiglu";
                    } else {
                        R.op = (q3_op){.kind = Q3_OP_RMSNORM, .out = b, .in = {a, -1, -1}, .weight = &w};
                        name = "rmsnorm";
                    }
                    rig_run(&R, 0);
                    rig_run(&R, 1);
                    double worst = rig_worst(&R, 1e-6, 1e-6);
                    CHECK(worst <= 1, "[%s] %s (%s) rows %d cols %d: error %.3g of tolerance", isa, name,
                          q3_dtype_name(wtypes[ti]), rows, cols, worst);
                    rig_free(&R);
                    free((void *)w.data);
                }
            }
        }

    /* HEAD_NORM and ROPE, in place over heads; odd head dims and late positions */
    static const int heads[][2] = {{4, 8}, {3, 20}, {16, 128}, {2, 34}};
    for (size_t h = 0; h < 4; h++)
        for (size_t ri = 0; ri < 3; ri++) {
            int nh = heads[h][0], hd = heads[h][1], rows = rows_list[ri];
            for (int kind = 0; kind < 2; kind++) {
                rig R;
                rig_config(&R, nh, nh, hd);
                int x = rig_value(&R, rows, nh * hd, -4, 4);
                q3_tensor w = make_weight(Q3_BF16, 0, hd, 0.5f, 1.5f);
                R.n_real = rows;
                R.pos = kind == 0 ? 0 : 3000 + (int)ri * 7;
                R.op = kind == 0 ? (q3_op){.kind = Q3_OP_HEAD_NORM, .out = x, .in = {x, -1, -1}, .weight = &w}
                                 : (q3_op){.kind = Q3_OP_ROPE, .out = x, .in = {x, -1, -1}};
                rig_run(&R, 0);
                rig_run(&R, 1);
                double worst = rig_worst(&R, 2e-6, 1e-6);
                CHECK(worst <= 1, "[%s] %s %d x %d rows %d: error %.3g of tolerance", isa, kind ? "rope" : "head_norm",
                      nh, hd, rows, worst);
                rig_free(&R);
                free((void *)w.data);
            }
        }

    /* EMBED from each weight dtype (and a Q8_0 table); LAST_ROW */
    for (size_t ti = 0; ti < 4; ti++) {
        rig R;
        rig_config(&R, 4, 2, 8);
        q3_tensor w;
        if (ti < 3) {
            w = make_weight(wtypes[ti], 300, 64, -1, 1);
        } else { /* Q8_0 blocks: f16 scale 1/64, int8 values */
            w = (q3_tensor){.dtype = Q3_Q8_0, .ndim = 2, .shape = {300, 64}};
            w.nbytes = q3_dtype_row_bytes(Q3_Q8_0, 300 * 64);
            uint8_t *b = malloc(w.nbytes);
            for (size_t i = 0; i < w.nbytes; i += 34) {
                b[i] = 0x00;
                b[i + 1] = 0x24; /* 2^-6 in F16 */
                for (int j = 0; j < 32; j++) b[i + 2 + j] = (uint8_t)rnd();
            }
            w.data = b;
        }
        int o = rig_value(&R, 9, 64, 0, 0);
        for (int r = 0; r < 9; r++) R.tokens[r] = (int32_t)(rnd() % 300);
        R.n_real = 7;
        R.op = (q3_op){.kind = Q3_OP_EMBED, .out = o, .in = {-1, -1, -1}, .weight = &w};
        rig_run(&R, 0);
        rig_run(&R, 1);
        CHECK(rig_worst(&R, 1e-30, 0) == 0, "[%s] embed %s differs", isa, q3_dtype_name(w.dtype));
        rig_free(&R);
        free((void *)w.data);
    }
    rig R;
    rig_config(&R, 4, 2, 8);
    int in = rig_value(&R, 9, 37, -1, 1), o = rig_value(&R, 1, 37, 0, 0);
    R.n_real = 6;
    R.op = (q3_op){.kind = Q3_OP_LAST_ROW, .out = o, .in = {in, -1, -1}};
    rig_run(&R, 0);
    rig_run(&R, 1);
    CHECK(rig_worst(&R, 1e-30, 0) == 0, "[%s] last_row differs", isa);
    rig_free(&R);
}

/* ---- refusals --------------------------------------------------------------------------------- */

static void test_refuses(void)
{
    rig R;
    rig_config(&R, 4, 2, 8);
    q3_tensor w = {.dtype = Q3_Q8_0, .ndim = 2, .shape = {64, 64}};
    R.op = (q3_op){.kind = Q3_OP_MATMUL, .weight = &w};
    /* Q8_0 / Q4_0 matmuls run on the int8 kernels (src/backend/cpu/quant_kernels.h) */
    const char *why = q3_backend_cpu.refuses(&q3_backend_cpu, &R.g, &R.op);
    CHECK(why == NULL, "cpu refuses Q8_0 matmuls: %s", why);
    w.dtype = Q3_Q4_0;
    why = q3_backend_cpu.refuses(&q3_backend_cpu, &R.g, &R.op);
    CHECK(why == NULL, "cpu refuses Q4_0 matmuls: %s", why);
    /* K-quants on their kernels too (kquant_*.c), when rows are whole super-blocks */
    w.dtype = Q3_Q4_K;
    why = q3_backend_cpu.refuses(&q3_backend_cpu, &R.g, &R.op);
    CHECK(why != NULL, "cpu admits Q4_K matmuls of 64-value rows");
    if (why) CHECK_CONTAINS(why, "Q4_K");
    w.shape[1] = 512;
    static const q3_dtype kq[] = {Q3_Q4_K, Q3_Q5_K, Q3_Q6_K};
    for (int i = 0; i < 3; i++) {
        w.dtype = kq[i];
        why = q3_backend_cpu.refuses(&q3_backend_cpu, &R.g, &R.op);
        CHECK(why == NULL, "cpu refuses %s matmuls: %s", q3_dtype_name(kq[i]), why);
        R.op.kind = Q3_OP_EMBED;
        why = q3_backend_cpu.refuses(&q3_backend_cpu, &R.g, &R.op);
        CHECK(why == NULL, "cpu refuses %s embeddings: %s", q3_dtype_name(kq[i]), why);
        R.op.kind = Q3_OP_RMSNORM;
        CHECK(q3_backend_cpu.refuses(&q3_backend_cpu, &R.g, &R.op) != NULL, "cpu admits %s norm weights",
              q3_dtype_name(kq[i]));
        R.op.kind = Q3_OP_MATMUL;
    }
    w.shape[1] = 64;
    w.dtype = Q3_BF16;
    CHECK(q3_backend_cpu.refuses(&q3_backend_cpu, &R.g, &R.op) == NULL, "cpu refuses BF16 matmuls");
    w.dtype = Q3_Q8_0;
    R.op.kind = Q3_OP_EMBED;
    CHECK(q3_backend_cpu.refuses(&q3_backend_cpu, &R.g, &R.op) == NULL, "cpu refuses Q8_0 embeddings");
    CHECK(q3_backend_cpu.kv_default == Q3_F16 || q3_backend_cpu.kv_default == Q3_BF16, "kv_default");
}

/* ---- the pool on a busy machine ----------------------------------------------------- */

typedef struct {
    int max_ith; /* the highest thread index that ran an item */
    int sum;     /* items done */
} pool_probe;

static void sleep_us(long us)
{
    struct timespec ts = {us / 1000000, (us % 1000000) * 1000};
    nanosleep(&ts, NULL);
}

/* An item of us microseconds done by thread ith. */
static void probe_item(pool_probe *pp, long us, int ith)
{
    if (us) sleep_us(us);
    __atomic_fetch_add(&pp->sum, 1, __ATOMIC_RELAXED);
    for (int m = __atomic_load_n(&pp->max_ith, __ATOMIC_RELAXED); ith > m;)
        if (__atomic_compare_exchange_n(&pp->max_ith, &m, ith, 0, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) break;
}

/* A worker's item takes 6 ms (as if it lost its core while holding it), the
 * caller's 0.5 ms. */
static void late_worker_item(void *ctx, int item, int ith)
{
    (void)item;
    probe_item(ctx, ith ? 6000 : 500, ith);
}

/* 0.5 ms whoever runs it. */
static void quick_item(void *ctx, int item, int ith)
{
    (void)item;
    probe_item(ctx, 500, ith);
}

/* No wait at all. */
static void instant_item(void *ctx, int item, int ith)
{
    (void)item;
    probe_item(ctx, 0, ith);
}

/* Runs jobs whose worker items are late until the pool puts its caller on
 * its own (at most 40 jobs); then jobs until that stretch ends. Returns the
 * jobs the stretch ran alone, 0 if none began. */
static uint64_t solo_stretch(q3_pool *p)
{
    uint64_t s0 = q3_pool_shed_jobs(p);
    pool_probe pp = {0};
    q3_pool_job late = {.item = late_worker_item, .ctx = &pp, .n_items = 2};
    for (int i = 0; i < 40 && q3_pool_shed_jobs(p) == s0; i++) q3_pool_run(p, &late);
    CHECK(q3_pool_active(p) == 1, "a stretch of a 2-thread pool runs the caller alone (%d)", q3_pool_active(p));
    if (q3_pool_shed_jobs(p) == s0) return 0;
    pool_probe q = {0};
    q3_pool_job next = {.item = instant_item, .ctx = &q, .n_items = 2};
    for (int i = 0; i < 100000; i++) {
        uint64_t before = q3_pool_shed_jobs(p);
        q3_pool_run(p, &next);
        if (q3_pool_shed_jobs(p) == before) break;
    }
    return q3_pool_shed_jobs(p) - s0;
}

/* A stretch alone that begins soon after the last one ended is twice as
 * long (the other work is still there); one that begins long after is as
 * long as the first. (Stretches of a 2-thread pool run the caller alone.) */
static void test_pool_solo_backoff(void)
{
    q3_pool *p = q3_pool_new(2);
    if (!p || q3_pool_size(p) < 2) {
        q3_pool_free(p);
        return;
    }
    uint64_t first = solo_stretch(p), second = solo_stretch(p), third = solo_stretch(p);
    CHECK(first > 0 && second == 2 * first && third == 4 * first,
          "stretches alone back to back double (%llu, %llu, %llu jobs)", (unsigned long long)first,
          (unsigned long long)second, (unsigned long long)third);
    pool_probe q = {0};
    q3_pool_job next = {.item = instant_item, .ctx = &q, .n_items = 2};
    for (int i = 0; i < 10000; i++) q3_pool_run(p, &next);
    CHECK(q.sum == 20000, "every item runs once (%d)", q.sum);
    uint64_t later = solo_stretch(p);
    CHECK(later == first, "a stretch long after the last is as long as the first (%llu, %llu jobs)",
          (unsigned long long)later, (unsigned long long)first);
    q3_pool_free(p);
}

/* In a pool of 4, joins that keep waiting for late workers take one thread
 * off after the other: the items then run on the threads left, each once. */
static void test_pool_shed(void)
{
    q3_pool *p = q3_pool_new(4);
    if (!p || q3_pool_size(p) < 4) {
        q3_pool_free(p);
        return;
    }
    pool_probe pp = {0};
    q3_pool_job late = {.item = late_worker_item, .ctx = &pp, .n_items = 4};
    int jobs = 0, seen[4] = {0, 0, 0, 0}; /* jobs: late items run */
    for (int want = 3; want >= 1; want--) {
        while (q3_pool_active(p) > want && jobs < 800) { /* an item each: the caller's short, the others late */
            late.n_items = q3_pool_active(p);
            q3_pool_run(p, &late);
            jobs += late.n_items;
        }
        seen[want] = q3_pool_active(p);
        pool_probe q = {0};
        q3_pool_job next = {.item = quick_item, .ctx = &q, .n_items = 12};
        q3_pool_run(p, &next);
        CHECK(q.sum == 12 && q.max_ith < want, "%d threads on: 12 items on threads below %d (%d, thread %d)", want,
              want, q.sum, q.max_ith);
    }
    CHECK(seen[3] == 3 && seen[2] == 2 && seen[1] == 1, "one thread off at a time (%d, %d, %d; %d late items)", seen[3],
          seen[2], seen[1], jobs);
    CHECK(pp.sum == jobs, "every late item ran (%d of %d)", pp.sum, jobs);
    q3_pool_free(p);
}

/* Joins that keep waiting for a late worker put the pool's caller on its own
 * for a while: every item still runs, once, on thread 0. */
static void test_pool_solo(void)
{
    q3_pool *p = q3_pool_new(2);
    CHECK(p != NULL, "pool of 2");
    if (!p || q3_pool_size(p) < 2) {
        q3_pool_free(p);
        return;
    }
    pool_probe pp = {0};
    q3_pool_job late = {.item = late_worker_item, .ctx = &pp, .n_items = 2};
    int jobs = 0;
    while (!q3_pool_shed_jobs(p) && jobs < 40) { /* a worker claims an item in most jobs; 3 late ones in a row suffice */
        q3_pool_run(p, &late);
        jobs++;
        pool_probe q = {0};
        q3_pool_job next = {.item = quick_item, .ctx = &q, .n_items = 4};
        q3_pool_run(p, &next); /* a job after the late ones: run alone once they add up */
        CHECK(q.sum == 4, "every item runs once (%d)", q.sum);
        jobs++;
    }
    CHECK(pp.sum == 2 * (jobs / 2), "every late item ran (%d of %d)", pp.sum, 2 * (jobs / 2));
    CHECK(q3_pool_shed_jobs(p) > 0, "late workers put the caller on its own (%d jobs)", jobs);
    pool_probe q = {0};
    q3_pool_job next = {.item = quick_item, .ctx = &q, .n_items = 8};
    q3_pool_run(p, &next);
    CHECK(q.sum == 8 && q.max_ith == 0, "alone: all 8 items on the caller (%d, thread %d)", q.sum, q.max_ith);
    q3_pool_free(p);
}

int main(void)
{
    if (!q3_backend_cpu.present(&q3_backend_cpu)) {
        SKIP_ISA("avx2", "the cpu unit is absent (no AVX2+FMA+F16C): nothing here runs");
        TEST_DONE();
    }
    CHECK(q3_unit_open(&q3_backend_ref, NULL, &units[0]) == Q3_OK, "open ref: %s", q3_last_error());
    CHECK(q3_unit_open(&q3_backend_cpu, NULL, &units[1]) == Q3_OK, "open cpu: %s", q3_last_error());
    if (!units[0] || !units[1]) TEST_DONE();
    printf("cpu unit: %s, %d threads\n", q3_cpu_unit_isa(units[1])->name, units[1]->n_threads);
    test_refuses();
    test_pool_solo();
    test_pool_solo_backoff();
    test_pool_shed();
    const char *isas[] = {"amx", "avx512", "avx2"};
    for (int i = 0; i < 3; i++) {
        if (q3_cpu_unit_force_isa(units[1], isas[i])) {
            SKIP_ISA(isas[i], "the cpu unit's %s kernels: not on this CPU", isas[i]);
            continue;
        }
        test_matmul(isas[i]);
        test_matmul_group(isas[i]);
        test_swiglu_fused(isas[i]);
        test_attention(isas[i]);
        test_decode_batch(isas[i]);
        test_kv_append(isas[i]);
        test_store_rows(isas[i]);
        test_elementwise(isas[i]);
    }
    q3_cpu_stats s = q3_cpu_unit_stats(units[1]);
    printf("%llu ops, %llu pool jobs\n", (unsigned long long)s.ops, (unsigned long long)s.pool_jobs);
    q3_unit_close(units[0]);
    q3_unit_close(units[1]);
    TEST_DONE();
}
