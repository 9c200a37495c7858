/* MATMUL_ID, the indexed matmul (graph.h): each row's k slots choose among
 * the matrices of a stacked [n_mat][out][in] weight. For every weight type
 * the plain MATMUL takes, on the reference unit and on each kernel table the
 * cpu unit has, with ids drawn at random (repeats within a row, matrices no
 * row chose), one row, all rows on one matrix, per-slot inputs and slot
 * weights: every output value must be bit for bit what the same unit's plain
 * MATMUL gives that row alone on the chosen matrix (the determinism
 * contract), and cpu must agree with ref within the kernels' rounding. Bad
 * ids (out of range, negative, fractional, NaN) fail the run with
 * Q3_ERR_INVALID and a message, before any weight is read; rows past n_real
 * are never read; the planner and refuses() know the op. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_features.h"
#include "plan/plan.h"
#include "q3.h"
#include "test.h"

static uint64_t rng_state = 0x2545f4914f6cdd1dull;

static uint32_t rnd(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 32);
}

static float frand(float lo, float hi) { return lo + (hi - lo) * (float)(rnd() >> 8) * (1.0f / 16777216.0f); }

static q3_unit *ref_unit, *cpu_unit;

/* ---- a one-op graph ------------------------------------------------------------------ */

enum { V_X, V_IDS, V_SW, V_Y, N_VALUES };

typedef struct idcase {
    q3_config cfg;
    q3_graph g;
    q3_value values[N_VALUES];
    q3_op op;
    q3_tensor w;             /* [n_mat][n_out][n_in] */
    void *views;             /* its matrices (q3_tensor_stack_views) */
    float *init[N_VALUES];
    int n_mat, n_out, n_in, k, rows, n_real;
    bool per_slot, weighted;
} idcase;

static void case_init(idcase *C, q3_dtype t, int n_mat, int n_out, int n_in, int k, int rows, int n_real, bool per_slot,
                      bool weighted)
{
    memset(C, 0, sizeof *C);
    C->n_mat = n_mat, C->n_out = n_out, C->n_in = n_in, C->k = k, C->rows = rows, C->n_real = n_real;
    C->per_slot = per_slot, C->weighted = weighted;
    C->cfg = (q3_config){.n_layers = 1, .dim = 64, .ffn_dim = 96, .n_heads = 4, .n_kv_heads = 2, .head_dim = 16,
                         .vocab_size = 100, .max_seq_len = 64, .rms_eps = 1e-6f, .rope_theta = 1e6f};
    C->g = (q3_graph){.kind = Q3_GRAPH_PREFILL, .cfg = &C->cfg, .rows = rows, .ops = &C->op, .n_ops = 1,
                      .values = C->values, .n_values = N_VALUES};
    int cols[N_VALUES] = {[V_X] = per_slot ? k * n_in : n_in, [V_IDS] = k, [V_SW] = k, [V_Y] = k * n_out};
    static const char *names[N_VALUES] = {"x", "ids", "sw", "y"};
    for (int v = 0; v < N_VALUES; v++) {
        C->values[v] = (q3_value){.rows = rows, .cols = cols[v]};
        snprintf(C->values[v].name, sizeof C->values[v].name, "%s", names[v]);
        C->init[v] = calloc((size_t)rows * cols[v], sizeof(float));
    }
    for (size_t i = 0; i < (size_t)rows * cols[V_X]; i++) C->init[V_X][i] = frand(-1, 1);
    for (size_t i = 0; i < (size_t)rows * k; i++) C->init[V_SW][i] = frand(0, 1);
    /* rows past n_real hold ids no unit may look at */
    for (size_t i = (size_t)n_real * k; i < (size_t)rows * k; i++) C->init[V_IDS][i] = (float)(n_mat + 7);
    for (size_t i = 0; i < (size_t)rows * cols[V_Y]; i++) C->init[V_Y][i] = -12345.0f;
    C->w = (q3_tensor){.dtype = t, .ndim = 3, .shape = {n_mat, n_out, n_in}};
    snprintf(C->w.name, sizeof C->w.name, "blk.0.ffn_up_exps.weight");
    size_t n = (size_t)n_mat * n_out * n_in;
    float *f = malloc(n * sizeof *f);
    for (size_t i = 0; i < n; i++) f[i] = frand(-1, 1);
    C->w.nbytes = q3_dtype_row_bytes(t, n);
    void *data = malloc(C->w.nbytes);
    q3_row_from_f32(t, f, data, n);
    free(f);
    C->w.data = data;
    CHECK(q3_tensor_stack_views(&C->w, &C->views) == Q3_OK, "stack views");
    C->op = (q3_op){.kind = Q3_OP_MATMUL_ID, .layer = 0, .out = V_Y, .in = {V_X, V_IDS, weighted ? V_SW : -1},
                    .weight = &C->w};
    snprintf(C->op.name, sizeof C->op.name, "blk.0.ffn_up_exps");
}

static void case_free(idcase *C)
{
    for (int v = 0; v < N_VALUES; v++) free(C->init[v]);
    for (int m = 0; m < C->n_mat; m++) q3_tensor_drop_packed(q3_matmul_id_matrix(&C->w, m));
    q3_tensor_drop_packed(&C->w);
    free(C->views);
    free((void *)C->w.data);
}

static float *ids_of(idcase *C) { return C->init[V_IDS]; }

/* Runs the op on u over fresh copies of the values; returns the output (the
 * caller frees it) and the status in *st. */
static float *case_run(idcase *C, q3_unit *u, q3_status *st)
{
    float *buf[N_VALUES];
    for (int v = 0; v < N_VALUES; v++) {
        size_t n = (size_t)C->values[v].rows * C->values[v].cols;
        buf[v] = malloc(n * sizeof(float));
        memcpy(buf[v], C->init[v], n * sizeof(float));
    }
    int32_t pos[64] = {0};
    q3_exec e = {.g = &C->g, .buf = buf, .n_real = C->n_real, .pos = pos};
    *st = u->b->run(u->impl, &e, &C->op);
    for (int v = 0; v < N_VALUES; v++)
        if (v != V_Y) free(buf[v]);
    return buf[V_Y];
}

/* One row through the unit's plain MATMUL on weight w: y[n_out]. */
static void plain_row(q3_unit *u, const q3_tensor *w, const float *x, int n_in, int n_out, float *y)
{
    q3_config cfg = {.n_layers = 1, .dim = 64, .ffn_dim = 96, .n_heads = 4, .n_kv_heads = 2, .head_dim = 16,
                     .vocab_size = 100, .max_seq_len = 64, .rms_eps = 1e-6f, .rope_theta = 1e6f};
    q3_value values[2] = {{.name = "x", .rows = 1, .cols = n_in}, {.name = "y", .rows = 1, .cols = n_out}};
    q3_op op = {.kind = Q3_OP_MATMUL, .layer = 0, .out = 1, .in = {0, -1, -1}, .weight = w, .name = "plain"};
    q3_graph g = {.kind = Q3_GRAPH_PREFILL, .cfg = &cfg, .rows = 1, .ops = &op, .n_ops = 1, .values = values,
                  .n_values = 2};
    float *xb = malloc((size_t)n_in * sizeof *xb);
    memcpy(xb, x, (size_t)n_in * sizeof *xb);
    float *buf[2] = {xb, y};
    int32_t pos[1] = {0};
    q3_exec e = {.g = &g, .buf = buf, .n_real = 1, .pos = pos};
    CHECK(u->b->refuses(u->b, &g, &op) == NULL, "%s refuses the plain matmul", u->b->name);
    q3_status st = u->b->run(u->impl, &e, &op);
    CHECK(st == Q3_OK, "%s plain matmul: %s", u->b->name, q3_last_error());
    free(xb);
}

/* Checks out (from unit u) against u's plain matmul row by row, and returns
 * the count of values that differ in any bit. Rows past n_real: untouched. */
static int against_plain(idcase *C, q3_unit *u, const float *out)
{
    float *y = malloc((size_t)C->n_out * sizeof *y);
    int diff = 0, ycols = C->k * C->n_out, xcols = C->values[V_X].cols;
    for (int r = 0; r < C->n_real; r++)
        for (int j = 0; j < C->k; j++) {
            int m = (int)ids_of(C)[(size_t)r * C->k + j];
            const float *x = C->init[V_X] + (size_t)r * xcols + (C->per_slot ? (size_t)j * C->n_in : 0);
            plain_row(u, q3_matmul_id_matrix(&C->w, m), x, C->n_in, C->n_out, y);
            if (C->weighted)
                for (int o = 0; o < C->n_out; o++) y[o] *= C->init[V_SW][(size_t)r * C->k + j];
            diff += memcmp(y, out + (size_t)r * ycols + (size_t)j * C->n_out, (size_t)C->n_out * sizeof *y) != 0;
        }
    for (size_t i = (size_t)C->n_real * ycols; i < (size_t)C->rows * ycols; i++) diff += out[i] != -12345.0f;
    free(y);
    return diff;
}

/* Largest |cpu - ref| over sum_i |x_i w_i| of its output (the kernels' own
 * scale of rounding), over the live rows. */
static double worst_rel(idcase *C, const float *cpu, const float *ref)
{
    float *wr = malloc((size_t)C->n_in * sizeof *wr);
    double worst = 0;
    int xcols = C->values[V_X].cols, ycols = C->k * C->n_out;
    for (int r = 0; r < C->n_real; r++)
        for (int j = 0; j < C->k; j++) {
            int m = (int)ids_of(C)[(size_t)r * C->k + j];
            q3_tensor v = *q3_matmul_id_matrix(&C->w, m);
            const float *x = C->init[V_X] + (size_t)r * xcols + (C->per_slot ? (size_t)j * C->n_in : 0);
            for (int o = 0; o < C->n_out; o++) {
                q3_row_to_f32(v.dtype, (const char *)v.data + (size_t)o * q3_dtype_row_bytes(v.dtype, (size_t)C->n_in),
                              wr, (size_t)C->n_in);
                double scale = 1e-30;
                for (int i = 0; i < C->n_in; i++) scale += fabs((double)x[i] * wr[i]);
                size_t at = (size_t)r * ycols + (size_t)j * C->n_out + o;
                double d = fabs((double)cpu[at] - ref[at]) / scale;
                if (!(d <= worst)) worst = d;
            }
        }
    free(wr);
    return worst;
}

/* ---- id patterns -------------------------------------------------------------------------- */

enum { IDS_RANDOM, IDS_ONE_MATRIX, IDS_SOME_UNUSED, IDS_REPEAT_IN_ROW, N_PATTERNS };
static const char *const pattern_names[N_PATTERNS] = {"random", "all rows on one matrix", "some matrices unused",
                                                      "a matrix twice in a row"};

static void set_ids(idcase *C, int pattern)
{
    int one = (int)(rnd() % (uint32_t)C->n_mat);
    for (int r = 0; r < C->n_real; r++)
        for (int j = 0; j < C->k; j++) {
            int m;
            switch (pattern) {
            case IDS_ONE_MATRIX: m = one; break;
            case IDS_SOME_UNUSED: m = (int)(rnd() % (uint32_t)((C->n_mat + 1) / 2)) * 2 % C->n_mat; break;
            case IDS_REPEAT_IN_ROW: m = j > 0 ? (int)ids_of(C)[(size_t)r * C->k] : (int)(rnd() % (uint32_t)C->n_mat); break;
            default: m = (int)(rnd() % (uint32_t)C->n_mat); break;
            }
            ids_of(C)[(size_t)r * C->k + j] = (float)m;
        }
}

/* ---- the checks --------------------------------------------------------------------------------- */

static int n_in_for(q3_dtype t, int i)
{
    size_t b = q3_dtype_block_values(t);
    return b == 1 ? (i ? 100 : 40) : (int)b * (i ? 3 : 1);
}

static void test_types(const char *isa)
{
    /* rows: one (decode), a few (the GEMV of a few rows), many (the GEMM) */
    static const int shapes[][6] = {
        /* n_mat, n_out, k, rows, n_real, per_slot */
        {1, 17, 1, 1, 1, 0}, {3, 16, 2, 5, 5, 0}, {5, 33, 4, 23, 20, 1}, {8, 40, 2, 40, 40, 0}, {4, 17, 3, 9, 1, 1},
    };
    for (int ti = 0; ti < Q3_DTYPE_COUNT; ti++) {
        q3_dtype t = (q3_dtype)ti;
        for (size_t si = 0; si < sizeof shapes / sizeof *shapes; si++)
            for (int pattern = 0; pattern < N_PATTERNS; pattern++) {
                const int *sh = shapes[si];
                if (sh[2] == 1 && pattern == IDS_REPEAT_IN_ROW) continue;
                int n_in = n_in_for(t, (int)(si + pattern) % 2);
                bool weighted = (si + pattern) % 2 == 1;
                idcase C;
                case_init(&C, t, sh[0], sh[1], n_in, sh[2], sh[3], sh[4], sh[5], weighted);
                set_ids(&C, pattern);
                const char *why_ref = ref_unit->b->refuses(ref_unit->b, &C.g, &C.op);
                const char *why_cpu = cpu_unit->b->refuses(cpu_unit->b, &C.g, &C.op);
                CHECK(why_ref == NULL && why_cpu == NULL, "[%s] %s refused: ref %s, cpu %s", isa, q3_dtype_name(t),
                      why_ref ? why_ref : "-", why_cpu ? why_cpu : "-");
                q3_status st_ref, st_cpu;
                float *ref = case_run(&C, ref_unit, &st_ref), *cpu = case_run(&C, cpu_unit, &st_cpu);
                CHECK(st_ref == Q3_OK && st_cpu == Q3_OK, "[%s] %s matmul_id: %s", isa, q3_dtype_name(t), q3_last_error());
                int dr = against_plain(&C, ref_unit, ref), dc = against_plain(&C, cpu_unit, cpu);
                CHECK(dr == 0, "[%s] %s n_mat=%d out=%d in=%d k=%d rows=%d/%d (%s%s%s): %d ref rows differ from ref's plain matmul",
                      isa, q3_dtype_name(t), C.n_mat, C.n_out, n_in, C.k, C.n_real, C.rows, pattern_names[pattern],
                      C.per_slot ? ", per-slot x" : "", weighted ? ", weighted" : "", dr);
                CHECK(dc == 0, "[%s] %s n_mat=%d out=%d in=%d k=%d rows=%d/%d (%s%s%s): %d cpu rows differ from cpu's plain matmul",
                      isa, q3_dtype_name(t), C.n_mat, C.n_out, n_in, C.k, C.n_real, C.rows, pattern_names[pattern],
                      C.per_slot ? ", per-slot x" : "", weighted ? ", weighted" : "", dc);
                /* cpu against ref: F32/F16 sum in another order (~k ulps), BF16 rounds
                   activations to BF16 (2^-9), the int8 kernels quantize them (1/254 of
                   a block's largest; far less relative to sum |x w| on average) */
                double tol = q3_dtype_is_plain(t) ? (t == Q3_BF16 ? 0x1p-8 : 1e-5) : 2e-2;
                double worst = worst_rel(&C, cpu, ref);
                CHECK(worst <= tol, "[%s] %s matmul_id: cpu vs ref %.3g of sum|x w| (tolerance %.3g)", isa,
                      q3_dtype_name(t), worst, tol);
                free(ref);
                free(cpu);
                case_free(&C);
            }
    }
}

/* Out-of-range, negative, fractional and NaN ids fail on both units, naming
 * the row and slot; valid ids in other rows change nothing about it. */
static void test_bad_ids(void)
{
    static const float bad[] = {3.0f, -1.0f, 1.5f, 1e30f, -0.5f};
    float nan_id = nanf("");
    for (size_t i = 0; i <= sizeof bad / sizeof *bad; i++) {
        float v = i < sizeof bad / sizeof *bad ? bad[i] : nan_id;
        idcase C;
        case_init(&C, Q3_Q8_0, 3, 16, 32, 2, 4, 4, false, false);
        set_ids(&C, IDS_RANDOM);
        ids_of(&C)[2 * 2 + 1] = v; /* row 2, slot 1 */
        q3_unit *us[2] = {ref_unit, cpu_unit};
        for (int u = 0; u < 2; u++) {
            q3_status st;
            float *out = case_run(&C, us[u], &st);
            CHECK(st == Q3_ERR_INVALID, "%s accepts id %g", us[u]->b->name, (double)v);
            if (st == Q3_ERR_INVALID) {
                CHECK_CONTAINS(q3_last_error(), "row 2, slot 1");
                CHECK_CONTAINS(q3_last_error(), "not one of the 3 stacked");
            }
            free(out);
        }
        case_free(&C);
    }
}

/* refuses(): shapes that do not fit, and weight types a unit has no kernel
 * for at that width; the planner places the op and keeps each reason. */
static void test_refuses_and_plan(void)
{
    idcase C;
    case_init(&C, Q3_Q4_K, 2, 16, 256, 2, 3, 3, false, false);
    const q3_backend *cpu = &q3_backend_cpu, *ref = &q3_backend_ref;
    CHECK(cpu->refuses(cpu, &C.g, &C.op) == NULL, "cpu refuses a Q4_K matmul_id");
    const q3_backend *units[2] = {cpu, ref};
    q3_plan p;
    CHECK(q3_plan_graph(&C.g, units, 2, &p) == Q3_OK && p.unit_of[0] == 0, "matmul_id not placed on cpu");
    q3_plan_free(&p);
    CHECK(q3_graph_flops(&C.g, 3, 0) == 2.0 * 3 * 2 * 16 * 256, "matmul_id flops: %g", q3_graph_flops(&C.g, 3, 0));
    CHECK(!strcmp(q3_op_kind_name(Q3_OP_MATMUL_ID), "matmul_id"), "kind name");

    /* a 2-D weight is not a stack */
    C.w.ndim = 2;
    const char *why = cpu->refuses(cpu, &C.g, &C.op);
    CHECK(why && strstr(why, "stacked"), "cpu: %s", why ? why : "(admitted)");
    why = ref->refuses(ref, &C.g, &C.op);
    CHECK(why && strstr(why, "stacked"), "ref: %s", why ? why : "(admitted)");
    C.w.ndim = 3;
    /* output columns that are not k * out */
    C.values[V_Y].cols = 16;
    why = ref->refuses(ref, &C.g, &C.op);
    CHECK(why && strstr(why, "output"), "ref: %s", why ? why : "(admitted)");
    CHECK(q3_plan_graph(&C.g, units, 2, &p) != Q3_OK, "a matmul_id of the wrong output shape was placed");
    CHECK_CONTAINS(q3_last_error(), "matmul_id");
    C.values[V_Y].cols = 32;
    /* an input of neither in nor k * in columns */
    C.values[V_X].cols = 100;
    why = cpu->refuses(cpu, &C.g, &C.op);
    CHECK(why && strstr(why, "input"), "cpu: %s", why ? why : "(admitted)");
    C.values[V_X].cols = 256;
    /* rows of Q4_K weights must be whole super-blocks: the shape says 128 */
    C.w.shape[2] = 128;
    C.w.shape[1] = 32;
    why = cpu->refuses(cpu, &C.g, &C.op);
    CHECK(why != NULL, "cpu admits Q4_K rows of 128 values");
    case_free(&C);
}

int main(void)
{
    if (!q3_backend_cpu.present(&q3_backend_cpu)) {
        SKIP_ISA("avx2", "the cpu unit is absent (no AVX2+FMA+F16C): nothing here runs");
        TEST_DONE();
    }
    CHECK(q3_unit_open(&q3_backend_ref, NULL, &ref_unit) == Q3_OK, "open ref: %s", q3_last_error());
    CHECK(q3_unit_open(&q3_backend_cpu, NULL, &cpu_unit) == Q3_OK, "open cpu: %s", q3_last_error());
    if (!ref_unit || !cpu_unit) TEST_DONE();
    printf("cpu unit: %s, %d threads\n", q3_cpu_unit_isa(cpu_unit)->name, cpu_unit->n_threads);
    test_refuses_and_plan();
    test_bad_ids();
    const char *isas[] = {"amx", "avx512", "avx2"};
    for (int i = 0; i < 3; i++) {
        if (q3_cpu_unit_force_isa(cpu_unit, isas[i])) {
            SKIP_ISA(isas[i], "the cpu unit's %s MATMUL_ID kernels: not on this CPU", isas[i]);
            continue;
        }
        test_types(isas[i]);
    }
    q3_unit_close(ref_unit);
    q3_unit_close(cpu_unit);
    TEST_DONE();
}
