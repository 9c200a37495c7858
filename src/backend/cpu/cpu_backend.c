/* The "cpu" compute unit: SIMD kernels chosen once at start-up (AVX-512 with
 * AMX tiles for BF16 matmuls where the CPU and OS allow them, else AVX-512
 * with BF16/VNNI, else AVX2+FMA), run on one persistent thread pool.
 *
 * Threading: the thread that calls run() is thread 0 of the pool. Big ops
 * (MATMUL, ATTENTION, prefill-sized elementwise ops) are cut into work items
 * (blocks of output rows; (query rows, KV head) pairs; blocks of rows) that
 * the running threads claim from a shared counter, so a core slowed or
 * descheduled by a neighbour takes fewer items instead of stalling the op;
 * the end of a pool job is the barrier between two ops. Small ops (every
 * elementwise op in decode) run inline on thread 0 with no synchronisation
 * at all. One op runs at a time (a mutex serialises callers).
 *
 * Memory: weights are read where they are mapped. Scratch (per-thread matmul
 * packing and attention blocks, the chunk's K/V in the cache dtype, the RoPE
 * table) grows when an op needs more than any op before it, which happens on
 * the first run of a shape, never in steady state. run() has no way to report
 * failure (backend.h), so a failed scratch allocation aborts. */
#include "backend/cpu/cpu_backend.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu_features.h"
#include "backend/cpu/quant_kernels.h"
#include "backend/cpu/threadpool.h"
#include "model/rope.h"

/* Elementwise ops with fewer values than this run inline on one thread:
 * waking the pool costs about a microsecond, more than they take. */
#define PARALLEL_MIN_VALUES 32768
/* Matmuls with fewer multiply-adds than this run inline too. */
#define PARALLEL_MIN_MACS (1 << 18)
/* Work items a matmul is cut into, per thread (dynamic balance). */
#define MM_ITEMS_PER_THREAD 8

static const q3_cpu_isa isa_amx = {
    .name = "avx512-amx", .bf16_activations = true,
    .mm = &q3_cpu_mm_amx, .attn = &q3_cpu_attn_avx512, .ew = &q3_cpu_ew_avx512,
};
static const q3_cpu_isa isa_avx512 = {
    .name = "avx512-bf16", .bf16_activations = true,
    .mm = &q3_cpu_mm_avx512, .attn = &q3_cpu_attn_avx512, .ew = &q3_cpu_ew_avx512,
};
static const q3_cpu_isa isa_avx2 = {
    .name = "avx2", .bf16_activations = false,
    .mm = &q3_cpu_mm_avx2, .attn = &q3_cpu_attn_avx2, .ew = &q3_cpu_ew_avx2,
};

/* ---- state ---------------------------------------------------------------------- */

typedef struct grow_buf {
    void *p;
    size_t size;
} grow_buf;

static struct cpu_state {
    pthread_once_t once;
    pthread_mutex_t lock;
    const q3_cpu_isa *isa;
    q3_pool *pool;
    int nth;
    grow_buf *scratch;      /* [nth] per-thread kernel scratch */
    grow_buf kv_chunk;      /* prefill: the chunk's K and V rounded to the cache dtype */
    grow_buf attn_parts;    /* decode: super-block softmax states */
    grow_buf norm_w;        /* a norm weight converted to F32 */
    /* RoPE table: row p = cos[hd/2], sin[hd/2] of position p, for p < rope_done */
    grow_buf rope;
    int rope_done, rope_hd;
    float rope_theta;
    q3_rope_scaling rope_scaling;
    uint64_t ops;
} st = {.once = PTHREAD_ONCE_INIT, .lock = PTHREAD_MUTEX_INITIALIZER};

/* Makes b at least size bytes (64-byte aligned, contents lost). Returns 0 on success. */
static int grow(grow_buf *b, size_t size)
{
    if (b->size >= size) return 0;
    size = (size + 4095) & ~(size_t)4095;
    void *p = aligned_alloc(64, size);
    if (!p) return -1;
    free(b->p);
    b->p = p;
    b->size = size;
    return 0;
}

static void init_unit(void)
{
    const q3_cpu_features *f = q3_cpu_features_get();
    st.isa = q3_cpu_has_amx_path(f) ? &isa_amx : q3_cpu_has_avx512_path(f) ? &isa_avx512 : &isa_avx2;
    const char *force = getenv("Q3_CPU_ISA"); /* "avx512" (no AMX) or "avx2": for comparisons */
    if (force && !strcmp(force, "avx2")) st.isa = &isa_avx2;
    if (force && !strcmp(force, "avx512") && q3_cpu_has_avx512_path(f)) st.isa = &isa_avx512;
    int n = f->physical_cores > 0 ? f->physical_cores : 1;
    const char *env = getenv("Q3_THREADS");
    if (env && atoi(env) > 0) n = atoi(env);
    if (n > 256) n = 256;
    st.pool = q3_pool_new(n);
    st.nth = st.pool ? q3_pool_size(st.pool) : 1;
    st.scratch = calloc((size_t)st.nth, sizeof *st.scratch);
    if (!st.pool || !st.scratch) abort(); /* a few bytes at start-up: nothing sensible to do */
}

static void ensure_init(void) { pthread_once(&st.once, init_unit); }

/* Every thread's scratch is at least size bytes. */
static void ensure_scratch(size_t size)
{
    for (int i = 0; i < st.nth; i++)
        if (grow(&st.scratch[i], size)) abort();
}

const q3_cpu_isa *q3_cpu_isa_current(void)
{
    ensure_init();
    return st.isa;
}

int q3_cpu_force_isa(const char *name)
{
    ensure_init();
    const q3_cpu_features *f = q3_cpu_features_get();
    if (!strcmp(name, "avx2") && q3_cpu_has_avx2_path(f)) {
        st.isa = &isa_avx2;
        return 0;
    }
    if (!strcmp(name, "avx512") && q3_cpu_has_avx512_path(f)) {
        st.isa = &isa_avx512;
        return 0;
    }
    if (!strcmp(name, "amx") && q3_cpu_has_amx_path(f)) {
        st.isa = &isa_amx;
        return 0;
    }
    return -1;
}

int q3_cpu_threads(void)
{
    ensure_init();
    return st.nth;
}

q3_cpu_stats q3_cpu_get_stats(void)
{
    ensure_init();
    return (q3_cpu_stats){.ops = st.ops, .pool_jobs = q3_pool_jobs(st.pool)};
}

/* ---- helpers ------------------------------------------------------------------------- */

static int live_rows(const q3_exec *e, int v) { return e->g->values[v].rows == 1 ? 1 : e->n_real; }

static float *row_of(const q3_exec *e, int v, int r)
{
    return e->buf[v] + (size_t)r * (size_t)e->g->values[v].cols;
}

static size_t dtype_size(q3_dtype t) { return t == Q3_F32 ? 4 : 2; }

/* A norm weight as F32: the mapping itself when it is F32, else a converted copy. */
static const float *norm_weight(const q3_tensor *w, int n)
{
    if (w->dtype == Q3_F32) return w->data;
    if (grow(&st.norm_w, (size_t)n * sizeof(float))) abort();
    st.isa->ew->to_f32(w->dtype, w->data, st.norm_w.p, (size_t)n);
    return st.norm_w.p;
}

/* Makes the RoPE table cover positions [0, end): cos and sin of p * theta^(-2i/hd),
 * computed in double like the reference. Grows ahead in steps of 256 positions
 * so decode computes a new block once every 256 tokens. */
static void ensure_rope(const q3_config *c, int end)
{
    int hd = c->head_dim, half = hd / 2;
    if (st.rope_hd != hd || st.rope_theta != c->rope_theta ||
        memcmp(&st.rope_scaling, &c->rope_scaling, sizeof c->rope_scaling)) {
        st.rope_done = 0;
        st.rope_hd = hd;
        st.rope_theta = c->rope_theta;
        st.rope_scaling = c->rope_scaling;
    }
    if (end <= st.rope_done) return;
    int target = (end + 255) & ~255;
    size_t need = (size_t)target * hd * sizeof(float);
    if (st.rope.size < need) {
        size_t cap = st.rope.size * 2 > need ? st.rope.size * 2 : need;
        void *p = aligned_alloc(64, (cap + 4095) & ~(size_t)4095);
        if (!p) abort();
        if (st.rope.p) memcpy(p, st.rope.p, (size_t)st.rope_done * hd * sizeof(float));
        free(st.rope.p);
        st.rope.p = p;
        st.rope.size = (cap + 4095) & ~(size_t)4095;
    }
    float *t = st.rope.p;
    for (int p = st.rope_done; p < target; p++)
        for (int i = 0; i < half; i++) {
            double scale, freq = q3_rope_freq(c, i, &scale), ang = (double)p * freq; /* model/rope.h */
            t[(size_t)p * hd + i] = (float)(scale * cos(ang));
            t[(size_t)p * hd + half + i] = (float)(scale * sin(ang));
        }
    st.rope_done = target;
}

/* ---- elementwise ops, by row ranges ------------------------------------------------------ */

typedef struct rows_job {
    const q3_exec *e;
    const q3_op *op;
    const float *w;   /* F32 norm weight (RMSNORM, HEAD_NORM) */
    int rows;
} rows_job;

static void do_rows(const rows_job *j, int r0, int r1)
{
    const q3_exec *e = j->e;
    const q3_op *op = j->op;
    const q3_cpu_ew_kernels *ew = st.isa->ew;
    const q3_config *c = e->g->cfg;
    int cols = e->g->values[op->in[0]].cols;
    for (int r = r0; r < r1; r++) {
        const float *in = row_of(e, op->in[0], r);
        float *out = row_of(e, op->out, r);
        switch (op->kind) {
        case Q3_OP_RMSNORM: ew->rmsnorm(in, j->w, out, cols, c->rms_eps); break;
        case Q3_OP_HEAD_NORM:
            for (int h = 0; h < cols / c->head_dim; h++)
                ew->rmsnorm(in + h * c->head_dim, j->w, out + h * c->head_dim, c->head_dim, c->rms_eps);
            break;
        case Q3_OP_ROPE: {
            const float *t = (const float *)st.rope.p + (size_t)(e->pos + r) * c->head_dim;
            if (out != in) memcpy(out, in, (size_t)cols * sizeof(float));
            ew->rope(out, t, t + c->head_dim / 2, cols / c->head_dim, c->head_dim);
            break;
        }
        case Q3_OP_ADD: ew->add(in, row_of(e, op->in[1], r), out, (size_t)cols); break;
        case Q3_OP_SWIGLU: ew->swiglu(in, row_of(e, op->in[1], r), out, (size_t)cols); break;
        default: break;
        }
    }
}

/* Rows per work item of a parallel elementwise op. */
#define ROWS_PER_ITEM 8

static void rows_item(void *ctx, int item, int ith)
{
    const rows_job *j = ctx;
    int r0 = item * ROWS_PER_ITEM, r1 = r0 + ROWS_PER_ITEM < j->rows ? r0 + ROWS_PER_ITEM : j->rows;
    do_rows(j, r0, r1);
}

static void run_rows(const q3_exec *e, const q3_op *op, const float *w)
{
    rows_job j = {.e = e, .op = op, .w = w, .rows = live_rows(e, op->in[0])};
    if (j.rows < 2 || (size_t)j.rows * (size_t)e->g->values[op->in[0]].cols < PARALLEL_MIN_VALUES || st.nth == 1) {
        do_rows(&j, 0, j.rows);
        return;
    }
    q3_pool_job job = {.item = rows_item, .ctx = &j, .n_items = (j.rows + ROWS_PER_ITEM - 1) / ROWS_PER_ITEM};
    q3_pool_run(st.pool, &job);
}

/* ---- matmul ------------------------------------------------------------------------------- */

typedef struct mm_job {
    q3_cpu_matmul mm;
    const q3_cpu_mm_kernels *k; /* BF16/F32/F16 kernels of the ISA, or the Q8_0/Q4_0 ones */
    int item;   /* outputs per work item */
} mm_job;

static void mm_begin(void *ctx, int ith)
{
    mm_job *j = ctx;
    j->k->prepare(&j->mm, st.scratch[ith].p);
}

static void mm_item(void *ctx, int item, int ith)
{
    mm_job *j = ctx;
    int o0 = item * j->item, o1 = o0 + j->item < j->mm.n ? o0 + j->item : j->mm.n;
    j->k->range(&j->mm, st.scratch[ith].p, o0, o1);
}

static void run_matmul(const q3_exec *e, const q3_op *op)
{
    const q3_tensor *w = op->weight;
    mm_job j = {.mm = {
                    .w = w->data,
                    .wtype = w->dtype,
                    .w_row_bytes = q3_dtype_row_bytes(w->dtype, (size_t)w->shape[1]),
                    .x = e->buf[op->in[0]],
                    .ldx = (size_t)e->g->values[op->in[0]].cols,
                    .y = e->buf[op->out],
                    .ldy = (size_t)e->g->values[op->out].cols,
                    .m = live_rows(e, op->in[0]),
                    .n = (int)w->shape[0],
                    .k = (int)w->shape[1],
                }};
    const q3_cpu_mm_kernels *k = st.isa->mm;
    /* quantized weights: int8 dot products on activations quantized per 32-block
       (each thread quantizes all rows into its own scratch: no barrier) */
    if (w->dtype == Q3_Q8_0 || w->dtype == Q3_Q4_0)
        k = st.isa == &isa_avx2 ? &q3_cpu_mm_quant_avx2 : &q3_cpu_mm_quant_avx512;
    j.k = k;
    ensure_scratch(k->scratch(&j.mm));
    int g = k->granule(&j.mm);
    bool inline_run = st.nth == 1 || (double)j.mm.m * j.mm.n * j.mm.k < PARALLEL_MIN_MACS;
    int want = inline_run ? 1 : st.nth * MM_ITEMS_PER_THREAD;
    j.item = (j.mm.n + want - 1) / want;
    j.item = (j.item + g - 1) / g * g;
    q3_pool_job job = {.begin = mm_begin, .item = mm_item, .ctx = &j, .n_items = (j.mm.n + j.item - 1) / j.item};
    if (inline_run) {
        mm_begin(&j, 0);
        for (int i = 0; i < job.n_items; i++) mm_item(&j, i, 0);
    } else {
        q3_pool_run(st.pool, &job);
    }
}

/* ---- attention ------------------------------------------------------------------------------- */

typedef struct attn_job {
    q3_cpu_attn a;
    const q3_exec *e;
    const q3_op *op;
    int rows, row_block, n_row_blocks; /* prefill: query rows in blocks */
    int n_sb, heads_per_item, n_groups; /* decode with super-blocks: items (super-block, KV head group) */
    float *parts;                       /* decode: [n_sb][n_heads][part_stride] super-block states */
} attn_job;

/* Prefill with an F16/BF16 cache: rounds the chunk's K/V rows [8 item, +8) to
 * the cache dtype, as the session's hand-off will store them. */
static void convert_item(void *ctx, int item, int ith)
{
    attn_job *j = ctx;
    const q3_cpu_ew_kernels *ew = st.isa->ew;
    size_t kv_dim = (size_t)j->a.n_kv_heads * (size_t)j->a.head_dim;
    int r0 = item * ROWS_PER_ITEM, r1 = r0 + ROWS_PER_ITEM < j->rows ? r0 + ROWS_PER_ITEM : j->rows;
    for (int r = r0; r < r1; r++) {
        ew->from_f32(j->a.kv_dtype, row_of(j->e, j->op->in[1], r), (char *)j->a.k_chunk + (size_t)r * j->a.chunk_row_bytes,
                     kv_dim);
        ew->from_f32(j->a.kv_dtype, row_of(j->e, j->op->in[2], r), (char *)j->a.v_chunk + (size_t)r * j->a.chunk_row_bytes,
                     kv_dim);
    }
}

static void prefill_item(void *ctx, int item, int ith)
{
    attn_job *j = ctx;
    /* heaviest first: the last row blocks see the most keys */
    int rb = j->n_row_blocks - 1 - item / j->a.n_kv_heads, kvh = item % j->a.n_kv_heads;
    int row0 = rb * j->row_block, nrows = j->rows - row0 < j->row_block ? j->rows - row0 : j->row_block;
    st.isa->attn->run(&j->a, st.scratch[ith].p, kvh, kvh + 1, row0, nrows, 0, NULL);
}

static void decode_item(void *ctx, int item, int ith)
{
    attn_job *j = ctx;
    const q3_cpu_attn_kernels *k = st.isa->attn;
    if (!k->super_block) { /* one KV head, all keys */
        k->run(&j->a, st.scratch[ith].p, item, item + 1, 0, 1, 0, NULL);
        return;
    }
    int sb = item / j->n_groups, g = item % j->n_groups;
    int kvh0 = g * j->heads_per_item, kvh1 = kvh0 + j->heads_per_item < j->a.n_kv_heads ? kvh0 + j->heads_per_item : j->a.n_kv_heads;
    k->run(&j->a, st.scratch[ith].p, kvh0, kvh1, 0, 1, sb, j->parts + (size_t)sb * j->a.n_heads * k->part_stride(&j->a));
}

static void run_attention(const q3_exec *e, const q3_op *op)
{
    const q3_config *c = e->g->cfg;
    const q3_kv_cache *kv = e->kv;
    const q3_cpu_attn_kernels *k = st.isa->attn;
    bool prefill = op->in[1] >= 0, convert = false;
    attn_job j = {.e = e, .op = op};
    j.a = (q3_cpu_attn){
        .n_heads = c->n_heads,
        .n_kv_heads = c->n_kv_heads,
        .head_dim = c->head_dim,
        .q = e->buf[op->in[0]],
        .ldq = (size_t)e->g->values[op->in[0]].cols,
        .out = e->buf[op->out],
        .ldo = (size_t)e->g->values[op->out].cols,
        .kv_dtype = kv->dtype,
        .n_cached = prefill ? e->pos : e->pos + 1,
        .k_cache = q3_kv_k_row(kv, op->layer, 0),
        .v_cache = q3_kv_v_row(kv, op->layer, 0),
        .cache_row_bytes = kv->row_bytes,
        .scale = (float)(1.0 / sqrt((double)c->head_dim)),
    };
    if (!prefill) {
        q3_pool_job job = {.item = decode_item, .ctx = &j, .n_items = c->n_kv_heads};
        if (k->super_block) {
            /* super-blocks over threads; KV heads grouped so that each item reads
               whole rows when there are super-blocks enough to go round */
            j.n_sb = (j.a.n_cached + k->super_block - 1) / k->super_block;
            int groups = (4 * st.nth + j.n_sb - 1) / j.n_sb;
            groups = groups < 1 ? 1 : groups > c->n_kv_heads ? c->n_kv_heads : groups;
            j.heads_per_item = (c->n_kv_heads + groups - 1) / groups;
            j.n_groups = (c->n_kv_heads + j.heads_per_item - 1) / j.heads_per_item;
            /* sized for the whole cache once, not grown token by token */
            size_t max_sb = (size_t)(kv->n_ctx + k->super_block - 1) / (size_t)k->super_block;
            if ((size_t)j.n_sb > max_sb) max_sb = (size_t)j.n_sb;
            if (grow(&st.attn_parts, max_sb * c->n_heads * k->part_stride(&j.a) * sizeof(float))) abort();
            j.parts = st.attn_parts.p;
            job.n_items = j.n_sb * j.n_groups;
            ensure_scratch(k->scratch(&j.a, 1, j.heads_per_item));
        } else {
            ensure_scratch(k->scratch(&j.a, 1, 1));
        }
        q3_pool_run(st.pool, &job);
        if (k->super_block) k->merge(&j.a, j.parts, j.n_sb, j.a.out);
        return;
    }

    j.rows = e->n_real;
    int kv_dim = c->n_kv_heads * c->head_dim;
    if (kv->dtype == Q3_F32) { /* the chunk's rows are already what the cache would hold */
        j.a.k_chunk = e->buf[op->in[1]];
        j.a.v_chunk = e->buf[op->in[2]];
        j.a.chunk_row_bytes = (size_t)e->g->values[op->in[1]].cols * sizeof(float);
    } else {
        j.a.chunk_row_bytes = (size_t)kv_dim * dtype_size(kv->dtype);
        size_t half = ((size_t)j.rows * j.a.chunk_row_bytes + 63) & ~(size_t)63;
        if (grow(&st.kv_chunk, 2 * half)) abort();
        j.a.k_chunk = st.kv_chunk.p;
        j.a.v_chunk = (char *)st.kv_chunk.p + half;
        convert = true;
    }
    /* Small row blocks near the start (a causal chunk skips most of the late
       keys); deep in the context, few big blocks so each head's past K/V is
       streamed once per chunk rather than once per 8 rows. */
    j.row_block = Q3_CPU_ATTN_ROWS;
    if (e->pos >= 256) {
        int blocks = (4 * st.nth + c->n_kv_heads - 1) / c->n_kv_heads;
        j.row_block = ((j.rows + blocks - 1) / blocks + 7) & ~7;
    }
    j.n_row_blocks = (j.rows + j.row_block - 1) / j.row_block;
    ensure_scratch(k->scratch(&j.a, j.row_block, 1));
    if (convert) {
        q3_pool_job cj = {.item = convert_item, .ctx = &j, .n_items = (j.rows + ROWS_PER_ITEM - 1) / ROWS_PER_ITEM};
        q3_pool_run(st.pool, &cj);
    }
    q3_pool_job aj = {.item = prefill_item, .ctx = &j, .n_items = j.n_row_blocks * c->n_kv_heads};
    q3_pool_run(st.pool, &aj);
}

/* ---- the other ops ---------------------------------------------------------------------------- */

/* One row per token: quantized tables (Q8_0, Q4_0) go through the portable
 * dequantizer, which is plenty for a few rows. */
static void run_embed(const q3_exec *e, const q3_op *op)
{
    const q3_tensor *w = op->weight;
    size_t cols = (size_t)w->shape[1], rb = q3_dtype_row_bytes(w->dtype, cols);
    bool simd = w->dtype == Q3_F32 || w->dtype == Q3_F16 || w->dtype == Q3_BF16;
    for (int r = 0; r < e->n_real; r++) {
        const void *src = (const char *)w->data + (size_t)e->tokens[r] * rb;
        if (simd) st.isa->ew->to_f32(w->dtype, src, row_of(e, op->out, r), cols);
        else q3_row_to_f32(w->dtype, src, row_of(e, op->out, r), cols);
    }
}

static void run_kv_append(const q3_exec *e, const q3_op *op)
{
    q3_kv_cache *kv = e->kv;
    st.isa->ew->from_f32(kv->dtype, row_of(e, op->in[0], 0), q3_kv_k_row(kv, op->layer, e->pos), (size_t)kv->kv_dim);
    st.isa->ew->from_f32(kv->dtype, row_of(e, op->in[1], 0), q3_kv_v_row(kv, op->layer, e->pos), (size_t)kv->kv_dim);
}

/* ---- the unit ------------------------------------------------------------------------------------ */

static bool cpu_present(const q3_backend *b) { return q3_cpu_has_avx2_path(q3_cpu_features_get()); }

static const char *cpu_refuses(const q3_backend *b, const q3_graph *g, const q3_op *op)
{
    static const char *const no_matmul[Q3_DTYPE_COUNT] = {
        [Q3_Q8_0] = "no kernel for Q8_0 weights",
        [Q3_Q4_0] = "no kernel for Q4_0 weights",
        [Q3_Q4_K] = "no kernel for Q4_K weights",
        [Q3_Q6_K] = "no kernel for Q6_K weights",
    };
    static const char *const no_norm[Q3_DTYPE_COUNT] = {
        [Q3_Q8_0] = "no Q8_0 norm weights",
        [Q3_Q4_0] = "no Q4_0 norm weights",
        [Q3_Q4_K] = "no Q4_K norm weights",
        [Q3_Q6_K] = "no Q6_K norm weights",
    };
    static const char *const no_embed[Q3_DTYPE_COUNT] = {
        [Q3_Q4_K] = "no Q4_K row conversion (embedding)",
        [Q3_Q6_K] = "no Q6_K row conversion (embedding)",
    };
    if (op->weight) {
        q3_dtype t = op->weight->dtype;
        if ((unsigned)t >= Q3_DTYPE_COUNT) return "unknown weight dtype";
        bool plain = t == Q3_F32 || t == Q3_F16 || t == Q3_BF16;
        bool quant_mm = op->kind == Q3_OP_MATMUL && (t == Q3_Q8_0 || t == Q3_Q4_0) && op->weight->shape[1] % 32 == 0;
        if (quant_mm) return NULL;
        /* a dtype missing from the tables (K-quants) is refused too, never admitted by default */
        if (!plain && op->kind == Q3_OP_MATMUL) return no_matmul[t] ? no_matmul[t] : "no kernel for this weight dtype";
        if (!plain && op->kind != Q3_OP_EMBED) return no_norm[t] ? no_norm[t] : "no norm kernel for this weight dtype";
        if (!plain && t != Q3_Q8_0 && t != Q3_Q4_0) return no_embed[t] ? no_embed[t] : "no row conversion for this weight dtype";
    }
    if (op->kind == Q3_OP_ROPE && g->cfg->head_dim % 2) return "RoPE needs an even head_dim";
    return NULL;
}

static void cpu_run(const q3_backend *b, const q3_exec *e, const q3_op *op)
{
    ensure_init();
    pthread_mutex_lock(&st.lock);
    st.ops++;
    switch (op->kind) {
    case Q3_OP_EMBED: run_embed(e, op); break;
    case Q3_OP_RMSNORM: run_rows(e, op, norm_weight(op->weight, e->g->values[op->in[0]].cols)); break;
    case Q3_OP_HEAD_NORM: run_rows(e, op, norm_weight(op->weight, e->g->cfg->head_dim)); break;
    case Q3_OP_ROPE:
        ensure_rope(e->g->cfg, e->pos + live_rows(e, op->in[0]));
        run_rows(e, op, NULL);
        break;
    case Q3_OP_MATMUL: run_matmul(e, op); break;
    case Q3_OP_KV_APPEND: run_kv_append(e, op); break;
    case Q3_OP_ATTENTION: run_attention(e, op); break;
    case Q3_OP_ADD:
    case Q3_OP_SWIGLU: run_rows(e, op, NULL); break;
    case Q3_OP_LAST_ROW:
        memcpy(row_of(e, op->out, 0), row_of(e, op->in[0], e->n_real - 1),
               (size_t)e->g->values[op->out].cols * sizeof(float));
        break;
    case Q3_OP_KIND_COUNT: break;
    }
    pthread_mutex_unlock(&st.lock);
}

/* ---- the K/V hand-off -------------------------------------------------------------------- */

typedef struct store_job {
    q3_dtype t;
    const float *const *src;
    void *const *dst;
    size_t n_rows, n;
} store_job;

enum { STORE_ROWS_PER_ITEM = 16 };

static void store_item(void *ctx, int item, int ith)
{
    const store_job *j = ctx;
    size_t r0 = (size_t)item * STORE_ROWS_PER_ITEM, r1 = r0 + STORE_ROWS_PER_ITEM;
    if (r1 > j->n_rows) r1 = j->n_rows;
    for (size_t r = r0; r < r1; r++) st.isa->ew->from_f32(j->t, j->src[r], j->dst[r], j->n);
}

static void cpu_store_rows(const q3_backend *b, q3_dtype t, const float *const *src, void *const *dst, size_t n_rows,
                           size_t n)
{
    ensure_init();
    pthread_mutex_lock(&st.lock);
    store_job j = {.t = t, .src = src, .dst = dst, .n_rows = n_rows, .n = n};
    q3_pool_job job = {.item = store_item, .ctx = &j,
                       .n_items = (int)((n_rows + STORE_ROWS_PER_ITEM - 1) / STORE_ROWS_PER_ITEM)};
    q3_pool_run(st.pool, &job);
    pthread_mutex_unlock(&st.lock);
}

/* kv_default = F16: the cache is read in full by every decode step's
 * attention, so at depth its bytes rival the weights'; F16 halves them
 * against F32. F16 rather than BF16 because K and V are small and well
 * scaled (K is RMS-normed per head), so F16's 10-bit mantissa (8x finer than
 * BF16's 7 bits) costs nothing in range and keeps logits ~8x closer to an F32
 * cache; conversion is one F16C instruction per 16 values either way. */
q3_backend q3_backend_cpu = {
    .name = "cpu",
    .device = "CPU, SIMD (AVX-512 + AMX, AVX-512 BF16/VNNI or AVX2+FMA), one thread per core",
    .present = cpu_present,
    .refuses = cpu_refuses,
    .run = cpu_run,
    .store_rows = cpu_store_rows,
    .kv_default = Q3_F16,
};
