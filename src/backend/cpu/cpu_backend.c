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
 * elementwise op of a one-row decode) run inline on thread 0 with no
 * synchronisation at all.
 *
 * Instances: each open() makes a unit of its own (pool, scratch, RoPE table,
 * kernel table); nothing is process-wide but the CPU's features. One thread
 * at a time may call an instance (its context's); two instances run in
 * parallel without a lock between them.
 *
 * Memory: weights are read where they are mapped. Scratch (per-thread matmul
 * packing and attention blocks, the chunk's K/V in the cache dtype, the RoPE
 * table) grows when an op needs more than any op before it, which happens on
 * the first run of a shape, never in steady state. A failed allocation makes
 * the op return Q3_ERR_NOMEM with a message. */
#include "backend/cpu/cpu_backend.h"

#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu_features.h"
#include "backend/cpu/quant_kernels.h"
#include "backend/cpu/threadpool.h"
#include "model/rope.h"
#include "util/error.h"
#include "util/file.h"

/* Elementwise ops with fewer values than this run inline on one thread:
 * waking the pool costs about a microsecond, more than they take. */
#define PARALLEL_MIN_VALUES 32768
/* Matmuls with fewer multiply-adds than this run inline too. */
#define PARALLEL_MIN_MACS (1 << 18)
/* Work items a matmul is cut into, per thread (dynamic balance). */
#define MM_ITEMS_PER_THREAD 8

static const q3_cpu_isa isa_amx = {
    .name = "avx512-amx", .bf16_activations = true,
    .mm = &q3_cpu_mm_amx, .quant = &q3_quant_avx512, .mm_quant = &q3_cpu_mm_quant_avx512,
    .attn = &q3_cpu_attn_avx512, .ew = &q3_cpu_ew_avx512,
};
static const q3_cpu_isa isa_avx512 = {
    .name = "avx512-bf16", .bf16_activations = true,
    .mm = &q3_cpu_mm_avx512, .quant = &q3_quant_avx512, .mm_quant = &q3_cpu_mm_quant_avx512,
    .attn = &q3_cpu_attn_avx512, .ew = &q3_cpu_ew_avx512,
};
static const q3_cpu_isa isa_avx2 = {
    .name = "avx2", .bf16_activations = false,
    .mm = &q3_cpu_mm_avx2, .quant = &q3_quant_avx2, .mm_quant = &q3_cpu_mm_quant_avx2,
    .attn = &q3_cpu_attn_avx2, .ew = &q3_cpu_ew_avx2,
};

/* ---- state ---------------------------------------------------------------------- */

typedef struct grow_buf {
    void *p;
    size_t size;
} grow_buf;

typedef struct cpu_unit {
    const q3_cpu_isa *isa;
    q3_pool *pool;
    int nth;
    grow_buf *scratch;      /* [nth] per-thread kernel scratch */
    int *mm_prepared;       /* [nth] a matmul job's per-thread note of what its scratch holds */
    grow_buf kv_chunk;      /* prefill: the chunk's K and V rounded to the cache dtype */
    grow_buf attn_parts;    /* decode: super-block softmax states of every row */
    grow_buf attn_rows;     /* decode: per-row attention descriptors */
    grow_buf attn_segs;     /* embed: per-input attention descriptors */
    grow_buf norm_w;        /* a norm weight converted to F32 */
    grow_buf mmid;          /* MATMUL_ID: ids, the rows grouped by matrix, their inputs and outputs */
    /* RoPE table: row p = cos[hd/2], sin[hd/2] of position p, for p < rope_done */
    grow_buf rope;
    int rope_done, rope_hd;
    float rope_theta;
    q3_rope_scaling rope_scaling;
    uint64_t ops;
} cpu_unit;

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

static q3_status no_scratch(const q3_op *op, size_t size)
{
    return q3_fail(Q3_ERR_NOMEM, "cpu unit: cannot allocate %zu bytes of scratch for %s", size,
                   op ? op->name : "the K/V hand-off");
}

/* The kernel table for this CPU (or the one $Q3_CPU_ISA asks for: "avx512",
 * without AMX, or "avx2", for comparisons). */
static const q3_cpu_isa *default_isa(void)
{
    const q3_cpu_features *f = q3_cpu_features_get();
    const q3_cpu_isa *isa = q3_cpu_has_amx_path(f) ? &isa_amx : q3_cpu_has_avx512_path(f) ? &isa_avx512 : &isa_avx2;
    const char *force = getenv("Q3_CPU_ISA");
    if (force && !strcmp(force, "avx2")) isa = &isa_avx2;
    if (force && !strcmp(force, "avx512") && q3_cpu_has_avx512_path(f)) isa = &isa_avx512;
    return isa;
}

int q3_cpu_default_threads(void)
{
    const q3_cpu_features *f = q3_cpu_features_get();
    int n = f->physical_cores > 0 ? f->physical_cores : 1;
    const char *env = getenv("Q3_THREADS");
    if (env && atoi(env) > 0) n = atoi(env);
    return n > 256 ? 256 : n;
}

static void cpu_close(void *impl)
{
    cpu_unit *u = impl;
    if (!u) return;
    q3_pool_free(u->pool);
    if (u->scratch)
        for (int i = 0; i < u->nth; i++) free(u->scratch[i].p);
    free(u->scratch);
    free(u->mm_prepared);
    free(u->kv_chunk.p);
    free(u->attn_parts.p);
    free(u->attn_rows.p);
    free(u->attn_segs.p);
    free(u->norm_w.p);
    free(u->mmid.p);
    free(u->rope.p);
    free(u);
}

static q3_status cpu_open(const q3_backend *b, const q3_unit_opts *o, void **impl)
{
    cpu_unit *u = calloc(1, sizeof *u);
    if (!u) return q3_fail(Q3_ERR_NOMEM, "out of memory opening the cpu unit");
    u->isa = default_isa();
    int n = o && o->n_threads > 0 ? o->n_threads : q3_cpu_default_threads();
    u->pool = q3_pool_new(n);
    u->nth = u->pool ? q3_pool_size(u->pool) : 1;
    u->scratch = calloc((size_t)u->nth, sizeof *u->scratch);
    u->mm_prepared = calloc((size_t)u->nth, sizeof *u->mm_prepared);
    if (!u->pool || !u->scratch || !u->mm_prepared) {
        cpu_close(u);
        return q3_fail(Q3_ERR_NOMEM, "cpu unit: cannot start a pool of %d threads", n);
    }
    *impl = u;
    return Q3_OK;
}

static int cpu_threads(void *impl) { return ((cpu_unit *)impl)->nth; }

typedef struct for_job {
    void (*fn)(void *ctx, int i);
    void *ctx;
} for_job;

static void for_item(void *ctx, int item, int ith)
{
    (void)ith;
    for_job *j = ctx;
    j->fn(j->ctx, item);
}

static void cpu_parallel_for(void *impl, void (*fn)(void *ctx, int i), void *ctx, int n)
{
    cpu_unit *u = impl;
    for_job j = {fn, ctx};
    q3_pool_job job = {.item = for_item, .ctx = &j, .n_items = n};
    q3_pool_run(u->pool, &job);
}

/* Every thread's scratch is at least size bytes. */
static q3_status ensure_scratch(cpu_unit *u, const q3_op *op, size_t size)
{
    for (int i = 0; i < u->nth; i++)
        if (grow(&u->scratch[i], size)) return no_scratch(op, size);
    return Q3_OK;
}

const q3_cpu_isa *q3_cpu_unit_isa(const q3_unit *unit) { return ((const cpu_unit *)unit->impl)->isa; }

int q3_cpu_unit_force_isa(q3_unit *unit, const char *name)
{
    cpu_unit *u = unit->impl;
    const q3_cpu_features *f = q3_cpu_features_get();
    if (!strcmp(name, "avx2") && q3_cpu_has_avx2_path(f)) {
        u->isa = &isa_avx2;
        return 0;
    }
    if (!strcmp(name, "avx512") && q3_cpu_has_avx512_path(f)) {
        u->isa = &isa_avx512;
        return 0;
    }
    if (!strcmp(name, "amx") && q3_cpu_has_amx_path(f)) {
        u->isa = &isa_amx;
        return 0;
    }
    return -1;
}

const char *q3_cpu_default_isa_name(void) { return default_isa()->name; }

q3_cpu_stats q3_cpu_unit_stats(const q3_unit *unit)
{
    const cpu_unit *u = unit->impl;
    return (q3_cpu_stats){.ops = u->ops, .pool_jobs = q3_pool_jobs(u->pool)};
}

/* ---- helpers ------------------------------------------------------------------------- */

static int live_rows(const q3_exec *e, int v) { return e->g->values[v].rows == 1 ? 1 : e->n_real; }

static float *row_of(const q3_exec *e, int v, int r)
{
    return e->buf[v] + (size_t)r * (size_t)e->g->values[v].cols;
}

/* A norm weight as F32: the mapping itself when it is F32, else a converted copy. */
static const float *norm_weight(cpu_unit *u, const q3_tensor *w, int n)
{
    if (w->dtype == Q3_F32) return w->data;
    if (grow(&u->norm_w, (size_t)n * sizeof(float))) return NULL;
    u->isa->ew->to_f32(w->dtype, w->data, u->norm_w.p, (size_t)n);
    return u->norm_w.p;
}

/* Makes the RoPE table cover positions [0, end): cos and sin of p * theta^(-2i/hd),
 * computed in double like the reference. Grows ahead in steps of 256 positions
 * so decode computes a new block once every 256 tokens. */
static q3_status ensure_rope(cpu_unit *u, const q3_config *c, int end)
{
    int hd = c->head_dim, half = hd / 2;
    if (u->rope_hd != hd || u->rope_theta != c->rope_theta ||
        memcmp(&u->rope_scaling, &c->rope_scaling, sizeof c->rope_scaling)) {
        u->rope_done = 0;
        u->rope_hd = hd;
        u->rope_theta = c->rope_theta;
        u->rope_scaling = c->rope_scaling;
    }
    if (end <= u->rope_done) return Q3_OK;
    int target = (end + 255) & ~255;
    size_t need = (size_t)target * hd * sizeof(float);
    if (u->rope.size < need) {
        size_t cap = u->rope.size * 2 > need ? u->rope.size * 2 : need;
        cap = (cap + 4095) & ~(size_t)4095;
        void *p = aligned_alloc(64, cap);
        if (!p) return q3_fail(Q3_ERR_NOMEM, "cpu unit: cannot allocate a RoPE table of %zu bytes", cap);
        if (u->rope.p) memcpy(p, u->rope.p, (size_t)u->rope_done * hd * sizeof(float));
        free(u->rope.p);
        u->rope.p = p;
        u->rope.size = cap;
    }
    float *t = u->rope.p;
    for (int p = u->rope_done; p < target; p++)
        for (int i = 0; i < half; i++) {
            double scale, freq = q3_rope_freq(c, i, &scale), ang = (double)p * freq; /* model/rope.h */
            t[(size_t)p * hd + i] = (float)(scale * cos(ang));
            t[(size_t)p * hd + half + i] = (float)(scale * sin(ang));
        }
    u->rope_done = target;
    return Q3_OK;
}

/* ---- elementwise ops, by row ranges ------------------------------------------------------ */

typedef struct rows_job {
    cpu_unit *u;
    const q3_exec *e;
    const q3_op *op;
    const float *w;   /* F32 norm weight (RMSNORM, HEAD_NORM) */
    int rows;
} rows_job;

static void do_rows(const rows_job *j, int r0, int r1)
{
    const q3_exec *e = j->e;
    const q3_op *op = j->op;
    const q3_cpu_ew_kernels *ew = j->u->isa->ew;
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
            const float *t = (const float *)j->u->rope.p + (size_t)e->pos[r] * c->head_dim;
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

static void run_rows(cpu_unit *u, const q3_exec *e, const q3_op *op, const float *w)
{
    rows_job j = {.u = u, .e = e, .op = op, .w = w, .rows = live_rows(e, op->in[0])};
    if (j.rows < 2 || (size_t)j.rows * (size_t)e->g->values[op->in[0]].cols < PARALLEL_MIN_VALUES || u->nth == 1) {
        do_rows(&j, 0, j.rows);
        return;
    }
    q3_pool_job job = {.item = rows_item, .ctx = &j, .n_items = (j.rows + ROWS_PER_ITEM - 1) / ROWS_PER_ITEM};
    q3_pool_run(u->pool, &job);
}

/* ---- matmul ------------------------------------------------------------------------------- */

/* One matmul of a pool job: its kernels and problem, cut into items of
 * `item` outputs, the job's items [item0, item0 + n_items). */
typedef struct mm_part {
    q3_cpu_matmul mm;
    const q3_cpu_mm_kernels *k; /* the weight type's kernels on this ISA (q3_cpu_isa_mm) */
    int item, item0, n_items;
} mm_part;

/* Up to MM_GROUP_MAX matmuls over one input (a layer's Q, K and V; its gate
 * and up) in one pool job: one synchronisation for all of them. */
#define MM_GROUP_MAX 4

typedef struct mm_job {
    cpu_unit *u;
    mm_part part[MM_GROUP_MAX];
    int n_parts;
    int *prepared; /* [nth] the part whose prepared activations a thread's scratch holds (-1: none) */
    /* SwiGLU fused in: parts 0 (gate) and 1 (up) of the same shape, item i
       makes outputs range i of both, then gate = silu(gate) * up on it */
    bool swiglu;
} mm_job;

static void mm_begin(void *ctx, int ith) { ((mm_job *)ctx)->prepared[ith] = -1; }

/* Item of a fused gate/up/SwiGLU job: both matmuls' outputs [o0, o1) (the
 * same kernels over the same input: prepared once), then the SwiGLU of those
 * columns of every row, by the op's own elementwise kernel (per value, so a
 * slice of a row gets the bits the whole row would). */
static void swiglu_item(mm_job *j, int item, int ith)
{
    const mm_part *g = &j->part[0], *up = &j->part[1];
    void *scratch = j->u->scratch[ith].p;
    if (j->prepared[ith] < 0) g->k->prepare(&g->mm, scratch);
    j->prepared[ith] = 0;
    int o0 = item * g->item, o1 = o0 + g->item < g->mm.n ? o0 + g->item : g->mm.n;
    g->k->range(&g->mm, scratch, o0, o1);
    up->k->range(&up->mm, scratch, o0, o1);
    for (int r = 0; r < g->mm.m; r++) {
        float *gr = g->mm.y + (size_t)r * g->mm.ldy + o0;
        j->u->isa->ew->swiglu(gr, up->mm.y + (size_t)r * up->mm.ldy + o0, gr, (size_t)(o1 - o0));
    }
}

/* Items are claimed in increasing order, so a thread meets each part at most
 * once in a row; it prepares (rounds or quantizes the shared input) again
 * only where the part's weight type or kernels differ from the last. */
static void mm_item(void *ctx, int item, int ith)
{
    mm_job *j = ctx;
    if (j->swiglu) {
        swiglu_item(j, item, ith);
        return;
    }
    int p = 0;
    while (p + 1 < j->n_parts && j->part[p + 1].item0 <= item) p++;
    const mm_part *t = &j->part[p];
    void *scratch = j->u->scratch[ith].p;
    int q = j->prepared[ith];
    if (q < 0 || (q != p && (j->part[q].k != t->k || j->part[q].mm.wtype != t->mm.wtype))) t->k->prepare(&t->mm, scratch);
    j->prepared[ith] = p;
    int o0 = (item - t->item0) * t->item, o1 = o0 + t->item < t->mm.n ? o0 + t->item : t->mm.n;
    t->k->range(&t->mm, scratch, o0, o1);
}

/* Packing a weight: panels of outputs over the pool's threads; a stack
 * (MATMUL_ID) matrix by matrix, each from its own tensor's data. */
typedef struct pack_job {
    const q3_cpu_mm_kernels *k;
    q3_dtype t;
    const q3_tensor *w;       /* the weight: 2-D, or a stack whose matrices are w->mats */
    char *dst;
    int n, kk;                /* outputs and inputs of one matrix */
    size_t dst_stride;        /* bytes from one packed matrix to the next */
    int item;                 /* outputs per work item */
    int items_per_mat;
} pack_job;

static void pack_item(void *ctx, int item, int ith)
{
    const pack_job *j = ctx;
    int m = item / j->items_per_mat, o0 = item % j->items_per_mat * j->item, o1 = o0 + j->item < j->n ? o0 + j->item : j->n;
    const void *src = j->w->ndim == 3 ? j->w->mats[m]->data : j->w->data;
    j->k->pack(j->t, src, q3_dtype_row_bytes(j->t, (size_t)j->kk), j->n, j->kk, j->dst + (size_t)m * j->dst_stride, o0,
               o1);
}

/* Memory for a packed copy: 2 MB aligned and marked for transparent huge
 * pages when it is that large (a decode step streams it: 4 KB pages would
 * cost a TLB miss every 4 KB), else 64-byte aligned. */
static void *alloc_packed(size_t bytes)
{
    const size_t huge = (size_t)2 << 20;
    if (bytes < huge) return aligned_alloc(64, (bytes + 63) & ~(size_t)63);
    bytes = (bytes + huge - 1) & ~(huge - 1);
    void *p = aligned_alloc(huge, bytes);
    if (p) q3_memory_prefer_huge_pages(p, bytes);
    return p;
}

/* The kernels' packed copy of w (a 2-D weight, or every matrix of a stack,
 * *stride bytes apart), made now if no unit has made it yet (*out = NULL:
 * these kernels read w in place). Racing contexts each pack; one copy is
 * published, the others freed. */
static q3_status packed_weight(cpu_unit *u, const q3_op *op, const q3_tensor *w, const q3_cpu_mm_kernels *k,
                               const void **out, size_t *stride)
{
    const int stacked = w->ndim == 3, n_mat = stacked ? (int)w->shape[0] : 1;
    const int n = (int)w->shape[stacked], kk = (int)w->shape[stacked + 1];
    *out = NULL;
    size_t per = k->packed_bytes ? k->packed_bytes(w->dtype, n, kk) : 0;
    if (!per) return Q3_OK;
    *stride = n_mat == 1 ? per : (per + 63) & ~(size_t)63;
    size_t bytes = (size_t)n_mat * *stride;
    void *p = atomic_load_explicit(&((q3_tensor *)w)->packed, memory_order_acquire);
    if (!p) {
        if (!(p = alloc_packed(bytes)))
            return q3_fail(Q3_ERR_NOMEM, "cpu unit: cannot allocate %zu bytes for the packed weight of %s", bytes,
                           op->name);
        pack_job j = {.k = k, .t = w->dtype, .w = w, .dst = p, .n = n, .kk = kk, .dst_stride = *stride, .item = 16 * 64};
        j.items_per_mat = (n + j.item - 1) / j.item;
        q3_pool_job job = {.item = pack_item, .ctx = &j, .n_items = n_mat * j.items_per_mat};
        q3_pool_run(u->pool, &job);
        void *none = NULL;
        if (!atomic_compare_exchange_strong(&((q3_tensor *)w)->packed, &none, p)) {
            free(p);
            p = none;
        } else {
            /* the matmuls read the copy from now on: the file's pages go back
               (a tied embedding's few rows a step are read in again) */
            for (int m = 0; m < n_mat; m++) {
                const q3_tensor *t = stacked ? w->mats[m] : w;
                q3_mapped_pages_release(t->data, t->nbytes);
            }
        }
    }
    *out = p;
    return Q3_OK;
}

/* The part that runs op, its weight packed if its kernels read a packed
 * copy, every thread's scratch big enough; *inline_run: small enough to run
 * on this thread alone. */
static q3_status mm_setup(cpu_unit *u, const q3_exec *e, const q3_op *op, mm_part *t, bool *inline_run)
{
    const q3_tensor *w = op->weight;
    *t = (mm_part){.mm = {
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
    /* the weight type's row (quantized weights: int8 dot products on activations
       quantized per 32-block, each thread quantizing all rows into its own
       scratch: no barrier) */
    t->k = q3_cpu_isa_mm(u->isa, w->dtype);
    const void *packed;
    size_t stride;
    q3_status st = packed_weight(u, op, w, t->k, &packed, &stride);
    if (st) return st;
    if (packed) t->mm.w = packed;
    if ((st = ensure_scratch(u, op, t->k->scratch(&t->mm)))) return st;
    int g = t->k->granule(&t->mm);
    *inline_run = u->nth == 1 || (double)t->mm.m * t->mm.n * t->mm.k < PARALLEL_MIN_MACS;
    int want = *inline_run ? 1 : u->nth * MM_ITEMS_PER_THREAD;
    t->item = (t->mm.n + want - 1) / want;
    t->item = (t->item + g - 1) / g * g;
    t->n_items = (t->mm.n + t->item - 1) / t->item;
    return Q3_OK;
}

/* Whether op b can join a's pool job: a matmul over the same input whose
 * output neither is that input nor a's output. */
static bool mm_joins(const q3_exec *e, const q3_op *a, const q3_op *b)
{
    return b->kind == Q3_OP_MATMUL && b->in[0] == a->in[0] && b->out != a->out && b->out != a->in[0] &&
           live_rows(e, b->in[0]) == live_rows(e, a->in[0]);
}

/* Whether c is the SwiGLU of a's and b's outputs written over a's, of the
 * same rows and width: what the layer's gate, up and SwiGLU are. */
static bool swiglu_joins(const q3_exec *e, const q3_op *a, const q3_op *b, const q3_op *c)
{
    return c->kind == Q3_OP_SWIGLU && c->in[0] == a->out && c->in[1] == b->out && c->out == a->out &&
           e->g->values[a->out].cols == e->g->values[b->out].cols && live_rows(e, c->in[0]) == live_rows(e, a->in[0]);
}

/* ops[0], a MATMUL, and the matmuls right after it over the same input (at
 * most n in all) as one pool job; *ran = how many. Each output is what the
 * op alone gives: the same kernel over the same row. */
static q3_status run_matmuls(cpu_unit *u, const q3_exec *e, const q3_op *ops, int n, int *ran)
{
    mm_job j = {.u = u, .prepared = u->mm_prepared};
    bool small;
    *ran = 1;
    q3_status st = mm_setup(u, e, &ops[0], &j.part[0], &small);
    if (st) return st;
    j.n_parts = 1;
    int items = j.part[0].n_items;
    while (!small && j.n_parts < MM_GROUP_MAX && *ran < n && mm_joins(e, &ops[0], &ops[*ran])) {
        mm_part *t = &j.part[j.n_parts];
        bool small_b;
        if ((st = mm_setup(u, e, &ops[*ran], t, &small_b))) return st;
        if (small_b) break; /* runs on its own, inline, next */
        t->item0 = items;
        items += t->n_items;
        j.n_parts++;
        (*ran)++;
    }
    /* a gate and an up matmul of one shape followed by their SwiGLU (into the
       gate's output): the SwiGLU joins the job */
    if (j.n_parts == 2 && *ran == 2 && n > 2 && swiglu_joins(e, &ops[0], &ops[1], &ops[2]) &&
        j.part[0].k == j.part[1].k && j.part[0].mm.wtype == j.part[1].mm.wtype && j.part[0].mm.n == j.part[1].mm.n &&
        j.part[0].item == j.part[1].item) {
        j.swiglu = true;
        items = j.part[0].n_items;
        *ran = 3;
    }
    q3_pool_job job = {.begin = mm_begin, .item = mm_item, .ctx = &j, .n_items = items};
    if (small) {
        mm_begin(&j, 0);
        for (int i = 0; i < items; i++) mm_item(&j, i, 0);
    } else {
        q3_pool_run(u->pool, &job);
    }
    return Q3_OK;
}

/* ---- matmul_id ---------------------------------------------------------------------------- */

/* The (row, slot) pairs that chose one matrix, gathered: a plain matmul of
 * their inputs (rows of x) by that matrix into rows of y, run by the same
 * kernels as MATMUL (whose outputs do not depend on the rows beside them). */
typedef struct mmid_group {
    q3_cpu_matmul mm;
    int item, item0, n_items; /* outputs per work item; the group's items are [item0, item0 + n_items) */
} mmid_group;

typedef struct mmid_job {
    cpu_unit *u;
    const q3_cpu_mm_kernels *k;
    mmid_group *g;
    int n_groups;
    int *prepared; /* [nth] the group whose activations each thread's scratch holds (-1: none) */
} mmid_job;

static void mmid_begin(void *ctx, int ith) { ((mmid_job *)ctx)->prepared[ith] = -1; }

/* Items are claimed in increasing order, so a thread meets each group at
 * most once in a row and prepares it (packs its rows) once. */
static void mmid_item(void *ctx, int item, int ith)
{
    mmid_job *j = ctx;
    int lo = 0, hi = j->n_groups - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (j->g[mid].item0 <= item) lo = mid;
        else hi = mid - 1;
    }
    const mmid_group *g = &j->g[lo];
    void *scratch = j->u->scratch[ith].p;
    if (j->prepared[ith] != lo) {
        j->k->prepare(&g->mm, scratch);
        j->prepared[ith] = lo;
    }
    int o0 = (item - g->item0) * g->item, o1 = o0 + g->item < g->mm.n ? o0 + g->item : g->mm.n;
    j->k->range(&g->mm, scratch, o0, o1);
}

static size_t align64(size_t n) { return (n + 63) & ~(size_t)63; }

/* Rows grouped by the matrix they chose (a counting sort, stable in (row,
 * slot) order), each chosen matrix's weights read once for all its rows in
 * one pool job over every group's output ranges; then each result goes back
 * to its row and slot (times the slot weight, if any). */
static q3_status run_matmul_id(cpu_unit *u, const q3_exec *e, const q3_op *op)
{
    q3_matmul_id_shape s;
    const char *why = q3_matmul_id_check(e->g, op, &s);
    if (why) return q3_fail(Q3_ERR_INVALID, "op %s: %s", op->name, why);
    const q3_tensor *w = op->weight;
    const q3_cpu_mm_kernels *k = q3_cpu_isa_mm(u->isa, w->dtype);
    if (!k) return q3_fail(Q3_ERR_UNSUPPORTED, "op %s: %s", op->name, q3_traits(w->dtype)->no_matmul);
    const int rows = live_rows(e, op->out);
    const size_t pairs = (size_t)rows * (size_t)s.k, max_groups = pairs < (size_t)s.n_mat ? pairs : (size_t)s.n_mat;
    const size_t o_cnt = pairs * sizeof(int32_t), o_order = o_cnt + ((size_t)s.n_mat + 1) * sizeof(int32_t),
                 o_prep = o_order + pairs * sizeof(int32_t), o_groups = align64(o_prep + (size_t)u->nth * sizeof(int)),
                 o_x = align64(o_groups + max_groups * sizeof(mmid_group)),
                 o_y = align64(o_x + pairs * (size_t)s.n_in * sizeof(float)),
                 total = o_y + pairs * (size_t)s.n_out * sizeof(float);
    if (grow(&u->mmid, total)) return no_scratch(op, total);
    char *base = u->mmid.p;
    int32_t *ids = (int32_t *)base, *cnt = (int32_t *)(base + o_cnt), *order = (int32_t *)(base + o_order);
    mmid_group *groups = (mmid_group *)(base + o_groups);
    float *X = (float *)(base + o_x), *Y = (float *)(base + o_y);
    q3_status st = q3_matmul_id_ids(e, op, &s, rows, ids);
    if (st) return st;

    /* cnt[m + 1] = pairs that chose m, then offsets; order = pairs by matrix */
    memset(cnt, 0, ((size_t)s.n_mat + 1) * sizeof *cnt);
    for (size_t p = 0; p < pairs; p++) cnt[ids[p] + 1]++;
    for (int m = 0; m < s.n_mat; m++) cnt[m + 1] += cnt[m];
    for (size_t p = 0; p < pairs; p++) order[cnt[ids[p]]++] = (int32_t)p;
    for (int m = s.n_mat; m > 0; m--) cnt[m] = cnt[m - 1]; /* back to starts: cnt[m] = first pair of m */
    cnt[0] = 0;

    const void *packed;
    size_t stride = 0;
    if ((st = packed_weight(u, op, w, k, &packed, &stride))) return st;
    const size_t w_row_bytes = q3_dtype_row_bytes(w->dtype, (size_t)s.n_in);
    int n_groups = 0;
    size_t scratch = 0;
    for (int m = 0; m < s.n_mat; m++) {
        int first = cnt[m], n = (m + 1 < s.n_mat ? cnt[m + 1] : (int32_t)pairs) - first;
        if (!n) continue; /* a matrix no row chose is never read */
        mmid_group *g = &groups[n_groups++];
        g->mm = (q3_cpu_matmul){
            .w = packed ? (const char *)packed + (size_t)m * stride : q3_matmul_id_matrix(w, m)->data,
            .wtype = w->dtype,
            .w_row_bytes = w_row_bytes,
            .x = X + (size_t)first * s.n_in,
            .ldx = (size_t)s.n_in,
            .y = Y + (size_t)first * s.n_out,
            .ldy = (size_t)s.n_out,
            .m = n,
            .n = s.n_out,
            .k = s.n_in,
        };
        size_t sc = k->scratch(&g->mm);
        if (sc > scratch) scratch = sc;
    }
    for (size_t q = 0; q < pairs; q++) {
        int r = order[q] / s.k, j = order[q] % s.k;
        memcpy(X + q * (size_t)s.n_in, row_of(e, op->in[0], r) + (s.x_per_slot ? (size_t)j * s.n_in : 0),
               (size_t)s.n_in * sizeof(float));
    }
    if ((st = ensure_scratch(u, op, scratch))) return st;

    bool inline_run = u->nth == 1 || (double)pairs * s.n_out * s.n_in < PARALLEL_MIN_MACS;
    int want = inline_run ? 1 : (u->nth * MM_ITEMS_PER_THREAD + n_groups - 1) / n_groups;
    int items = 0;
    for (int i = 0; i < n_groups; i++) {
        mmid_group *g = &groups[i];
        int gr = k->granule(&g->mm);
        g->item = (s.n_out + want - 1) / want;
        g->item = (g->item + gr - 1) / gr * gr;
        g->n_items = (s.n_out + g->item - 1) / g->item;
        g->item0 = items;
        items += g->n_items;
    }
    mmid_job j = {.u = u, .k = k, .g = groups, .n_groups = n_groups, .prepared = (int *)(base + o_prep)};
    if (inline_run) {
        mmid_begin(&j, 0);
        for (int i = 0; i < items; i++) mmid_item(&j, i, 0);
    } else {
        q3_pool_job job = {.begin = mmid_begin, .item = mmid_item, .ctx = &j, .n_items = items};
        q3_pool_run(u->pool, &job);
    }

    for (size_t q = 0; q < pairs; q++) {
        int r = order[q] / s.k, jj = order[q] % s.k;
        float *dst = row_of(e, op->out, r) + (size_t)jj * s.n_out;
        const float *src = Y + q * (size_t)s.n_out;
        if (op->in[2] < 0) {
            memcpy(dst, src, (size_t)s.n_out * sizeof(float));
        } else {
            const float sw = row_of(e, op->in[2], r)[jj];
            for (int o = 0; o < s.n_out; o++) dst[o] = src[o] * sw;
        }
    }
    return Q3_OK;
}

/* ---- attention ------------------------------------------------------------------------------- */

/* The cache of one sequence, as the attention kernels address it. */
static void attn_cache(q3_cpu_attn *a, const q3_kv_pool *kv, const int32_t *table, int layer)
{
    a->kv_dtype = kv->dtype;
    a->kv_data = kv->data + (size_t)layer * kv->layer_stride; /* this layer's blocks */
    a->table = table;
    a->block_bytes = kv->layer_bytes;
    a->k_off = 0;
    a->v_off = (size_t)Q3_KV_BLOCK_TOKENS * kv->row_bytes;
    a->row_bytes = kv->row_bytes;
}

typedef struct attn_job {
    cpu_unit *u;
    q3_cpu_attn a;
    const q3_exec *e;
    const q3_op *op;
    int rows, row_block, n_row_blocks; /* prefill: query rows in blocks */
} attn_job;

/* Prefill with an F16/BF16/Q8_0 cache: rounds (quantizes) the chunk's K/V rows
 * [8 item, +8) to the cache dtype, as the hand-off will store them. */
static void convert_item(void *ctx, int item, int ith)
{
    attn_job *j = ctx;
    const q3_cpu_ew_kernels *ew = j->u->isa->ew;
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
    j->u->isa->attn->run(&j->a, j->u->scratch[ith].p, kvh, kvh + 1, row0, nrows, 0, NULL);
}

/* Decode: one row per sequence. Row r's items are (super-block, KV head
 * group) pairs over its own cache; items of all rows share one pool job. */
typedef struct dec_row {
    q3_cpu_attn a;
    int n_sb, heads_per_item, n_groups;
    int item0;          /* first item of this row */
    float *parts;       /* [n_sb][n_heads][part_stride] */
} dec_row;

typedef struct dec_job {
    cpu_unit *u;
    dec_row *rows;
    int n_rows;
} dec_job;

static void decode_item(void *ctx, int item, int ith)
{
    dec_job *j = ctx;
    int r = 0;
    while (r + 1 < j->n_rows && j->rows[r + 1].item0 <= item) r++;
    dec_row *d = &j->rows[r];
    item -= d->item0;
    const q3_cpu_attn_kernels *k = j->u->isa->attn;
    void *scratch = j->u->scratch[ith].p;
    if (!k->super_block) { /* one KV head, all keys */
        k->run(&d->a, scratch, item, item + 1, 0, 1, 0, NULL);
        return;
    }
    int sb = item / d->n_groups, g = item % d->n_groups;
    int kvh0 = g * d->heads_per_item,
        kvh1 = kvh0 + d->heads_per_item < d->a.n_kv_heads ? kvh0 + d->heads_per_item : d->a.n_kv_heads;
    k->run(&d->a, scratch, kvh0, kvh1, 0, 1, sb, d->parts + (size_t)sb * d->a.n_heads * k->part_stride(&d->a));
}

static q3_status run_decode_attention(cpu_unit *u, const q3_exec *e, const q3_op *op, const q3_cpu_attn *proto)
{
    const q3_config *c = e->g->cfg;
    const q3_kv_pool *kv = e->kv;
    const q3_cpu_attn_kernels *k = u->isa->attn;
    int n = e->n_real;
    if (grow(&u->attn_rows, (size_t)n * sizeof(dec_row))) return no_scratch(op, (size_t)n * sizeof(dec_row));
    dec_row *rows = u->attn_rows.p;
    size_t scratch = 0, n_parts = 0, stride = k->super_block ? k->part_stride(proto) : 0;
    int items = 0, all_sb = 0;
    for (int r = 0; r < n && k->super_block; r++) all_sb += (e->pos[r] + 1 + k->super_block - 1) / k->super_block;
    /* KV heads grouped so that each item reads whole cache rows (a head's
       slices of a row stream at about half the speed) when the step's rows
       hold super-blocks enough to go round, counted over all its rows */
    int groups = all_sb ? (4 * u->nth + all_sb - 1) / all_sb : 1;
    groups = groups < 1 ? 1 : groups > c->n_kv_heads ? c->n_kv_heads : groups;
    for (int r = 0; r < n; r++) {
        dec_row *d = &rows[r];
        d->a = *proto;
        d->a.q = row_of(e, op->in[0], r);
        d->a.out = row_of(e, op->out, r);
        d->a.n_cached = e->pos[r] + 1;
        attn_cache(&d->a, kv, e->table[r], op->layer);
        d->item0 = items;
        if (k->super_block) {
            /* super-blocks over threads, KV heads in groups */
            d->n_sb = (d->a.n_cached + k->super_block - 1) / k->super_block;
            d->heads_per_item = (c->n_kv_heads + groups - 1) / groups;
            d->n_groups = (c->n_kv_heads + d->heads_per_item - 1) / d->heads_per_item;
            items += d->n_sb * d->n_groups;
            n_parts += (size_t)d->n_sb * c->n_heads * stride;
            size_t sc = k->scratch(&d->a, 1, d->heads_per_item);
            if (sc > scratch) scratch = sc;
        } else {
            items += c->n_kv_heads;
            size_t sc = k->scratch(&d->a, 1, 1);
            if (sc > scratch) scratch = sc;
        }
    }
    q3_status st = ensure_scratch(u, op, scratch);
    if (st) return st;
    if (k->super_block) {
        /* sized for a whole context per row once, not grown token by token */
        size_t per_row = (size_t)(kv->n_ctx + k->super_block - 1) / (size_t)k->super_block * c->n_heads * stride;
        size_t want = (size_t)n * per_row > n_parts ? (size_t)n * per_row : n_parts;
        if (grow(&u->attn_parts, want * sizeof(float)) && grow(&u->attn_parts, n_parts * sizeof(float)))
            return no_scratch(op, n_parts * sizeof(float));
        float *p = u->attn_parts.p;
        for (int r = 0; r < n; r++) {
            rows[r].parts = p;
            p += (size_t)rows[r].n_sb * c->n_heads * stride;
        }
    }
    dec_job j = {.u = u, .rows = rows, .n_rows = n};
    q3_pool_job job = {.item = decode_item, .ctx = &j, .n_items = items};
    q3_pool_run(u->pool, &job);
    if (k->super_block)
        for (int r = 0; r < n; r++) k->merge(&rows[r].a, rows[r].parts, rows[r].n_sb, rows[r].a.out);
    return Q3_OK;
}

/* Embed (no cache): the run holds many inputs packed one after another (a row
 * with pos 0 starts one); each is a prefill of its own from position 0 over
 * its own F32 K/V rows, cut into (row block, KV head) items as a prefill is,
 * so an input's rows come out the same whatever else is packed with it. */
typedef struct seg_attn {
    q3_cpu_attn a;
    int rows, item0;
} seg_attn;

typedef struct seg_job {
    cpu_unit *u;
    const seg_attn *segs;
    int n_segs;
} seg_job;

static void seg_item(void *ctx, int item, int ith)
{
    const seg_job *j = ctx;
    int s = 0;
    while (s + 1 < j->n_segs && j->segs[s + 1].item0 <= item) s++;
    const seg_attn *g = &j->segs[s];
    item -= g->item0;
    int nkv = g->a.n_kv_heads, rb = item / nkv, kvh = item % nkv, row0 = rb * Q3_CPU_ATTN_ROWS;
    int nrows = g->rows - row0 < Q3_CPU_ATTN_ROWS ? g->rows - row0 : Q3_CPU_ATTN_ROWS;
    j->u->isa->attn->run(&g->a, j->u->scratch[ith].p, kvh, kvh + 1, row0, nrows, 0, NULL);
}

static q3_status run_packed_attention(cpu_unit *u, const q3_exec *e, const q3_op *op, const q3_cpu_attn *proto)
{
    int n = e->n_real, n_segs = 0;
    for (int r = 0; r < n; r++) n_segs += e->pos[r] == 0;
    if (n > 0 && e->pos[0] != 0) return q3_fail(Q3_ERR_INVALID, "op %s: a packed run must start an input at row 0", op->name);
    if (grow(&u->attn_segs, (size_t)n_segs * sizeof(seg_attn))) return no_scratch(op, (size_t)n_segs * sizeof(seg_attn));
    seg_attn *segs = u->attn_segs.p;
    size_t ldk = (size_t)e->g->values[op->in[1]].cols;
    int items = 0, s = -1;
    for (int r = 0; r < n; r++) {
        if (e->pos[r] != 0) {
            if (e->pos[r] != e->pos[r - 1] + 1)
                return q3_fail(Q3_ERR_INVALID, "op %s: row %d of a packed run is at position %d after %d", op->name, r,
                               e->pos[r], e->pos[r - 1]);
            segs[s].rows++;
            continue;
        }
        seg_attn *g = &segs[++s];
        g->a = *proto;
        g->a.kv_dtype = Q3_F32;
        g->a.n_cached = 0;
        g->a.q = proto->q + (size_t)r * proto->ldq;
        g->a.out = proto->out + (size_t)r * proto->ldo;
        g->a.k_chunk = e->buf[op->in[1]] + (size_t)r * ldk;
        g->a.v_chunk = e->buf[op->in[2]] + (size_t)r * ldk;
        g->a.chunk_row_bytes = ldk * sizeof(float);
        g->rows = 1;
    }
    for (s = 0; s < n_segs; s++) {
        segs[s].item0 = items;
        items += (segs[s].rows + Q3_CPU_ATTN_ROWS - 1) / Q3_CPU_ATTN_ROWS * proto->n_kv_heads;
    }
    q3_status st = n_segs ? ensure_scratch(u, op, u->isa->attn->scratch(&segs[0].a, Q3_CPU_ATTN_ROWS, 1)) : Q3_OK;
    if (st) return st;
    seg_job j = {.u = u, .segs = segs, .n_segs = n_segs};
    q3_pool_job job = {.item = seg_item, .ctx = &j, .n_items = items};
    q3_pool_run(u->pool, &job);
    return Q3_OK;
}

static q3_status run_attention(cpu_unit *u, const q3_exec *e, const q3_op *op)
{
    const q3_config *c = e->g->cfg;
    const q3_kv_pool *kv = e->kv;
    const q3_cpu_attn_kernels *k = u->isa->attn;
    bool prefill = op->in[1] >= 0, convert = false;
    attn_job j = {.u = u, .e = e, .op = op};
    j.a = (q3_cpu_attn){
        .n_heads = c->n_heads,
        .n_kv_heads = c->n_kv_heads,
        .head_dim = c->head_dim,
        .q = e->buf[op->in[0]],
        .ldq = (size_t)e->g->values[op->in[0]].cols,
        .out = e->buf[op->out],
        .ldo = (size_t)e->g->values[op->out].cols,
        .scale = (float)(1.0 / sqrt((double)c->head_dim)),
    };
    if (!prefill) return run_decode_attention(u, e, op, &j.a);
    if (!op->reads_state) return run_packed_attention(u, e, op, &j.a);

    /* prefill: one sequence, the past [0, pos[0]) from its cache */
    attn_cache(&j.a, kv, e->table[0], op->layer);
    j.a.n_cached = e->pos[0];
    j.rows = e->n_real;
    int kv_dim = c->n_kv_heads * c->head_dim;
    if (kv->dtype == Q3_F32) { /* the chunk's rows are already what the cache would hold */
        j.a.k_chunk = e->buf[op->in[1]];
        j.a.v_chunk = e->buf[op->in[2]];
        j.a.chunk_row_bytes = (size_t)e->g->values[op->in[1]].cols * sizeof(float);
    } else {
        j.a.chunk_row_bytes = q3_dtype_row_bytes(kv->dtype, (size_t)kv_dim);
        size_t half = ((size_t)j.rows * j.a.chunk_row_bytes + 63) & ~(size_t)63;
        if (grow(&u->kv_chunk, 2 * half)) return no_scratch(op, 2 * half);
        j.a.k_chunk = u->kv_chunk.p;
        j.a.v_chunk = (char *)u->kv_chunk.p + half;
        convert = true;
    }
    /* Small row blocks near the start (a causal chunk skips most of the late
       keys); deep in the context, few big blocks so each head's past K/V is
       streamed once per chunk rather than once per 8 rows. */
    j.row_block = Q3_CPU_ATTN_ROWS;
    if (e->pos[0] >= 256) {
        int blocks = (4 * u->nth + c->n_kv_heads - 1) / c->n_kv_heads;
        j.row_block = ((j.rows + blocks - 1) / blocks + 7) & ~7;
    }
    j.n_row_blocks = (j.rows + j.row_block - 1) / j.row_block;
    q3_status st = ensure_scratch(u, op, k->scratch(&j.a, j.row_block, 1));
    if (st) return st;
    if (convert) {
        q3_pool_job cj = {.item = convert_item, .ctx = &j, .n_items = (j.rows + ROWS_PER_ITEM - 1) / ROWS_PER_ITEM};
        q3_pool_run(u->pool, &cj);
    }
    q3_pool_job aj = {.item = prefill_item, .ctx = &j, .n_items = j.n_row_blocks * c->n_kv_heads};
    q3_pool_run(u->pool, &aj);
    return Q3_OK;
}

/* ---- the other ops ---------------------------------------------------------------------------- */

/* One row per token: quantized tables (Q8_0, Q4_0) go through the portable
 * dequantizer, which is plenty for a few rows. */
static void run_embed(cpu_unit *u, const q3_exec *e, const q3_op *op)
{
    const q3_tensor *w = op->weight;
    size_t cols = (size_t)w->shape[1], rb = q3_dtype_row_bytes(w->dtype, cols);
    bool simd = q3_dtype_is_plain(w->dtype);
    for (int r = 0; r < e->n_real; r++) {
        const void *src = (const char *)w->data + (size_t)e->tokens[r] * rb;
        if (simd) u->isa->ew->to_f32(w->dtype, src, row_of(e, op->out, r), cols);
        else q3_row_to_f32(w->dtype, src, row_of(e, op->out, r), cols);
    }
}

/* Row r's K and V go to its sequence's position pos[r]. */
static void run_kv_append(cpu_unit *u, const q3_exec *e, const q3_op *op)
{
    q3_kv_pool *kv = e->kv;
    for (int r = 0; r < e->n_real; r++) {
        u->isa->ew->from_f32(kv->dtype, row_of(e, op->in[0], r), q3_kv_k_row(kv, e->table[r], op->layer, e->pos[r]),
                             (size_t)kv->kv_dim);
        u->isa->ew->from_f32(kv->dtype, row_of(e, op->in[1], r), q3_kv_v_row(kv, e->table[r], op->layer, e->pos[r]),
                             (size_t)kv->kv_dim);
    }
}

/* ---- the unit ------------------------------------------------------------------------------------ */

static bool cpu_present(const q3_backend *b) { return q3_cpu_has_avx2_path(q3_cpu_features_get()); }

static const char *cpu_refuses(const q3_backend *b, const q3_graph *g, const q3_op *op)
{
    const char *why;
    if (op->kind == Q3_OP_MATMUL_ID && !op->weight) return q3_matmul_id_check(g, op, NULL);
    if (op->weight) {
        q3_dtype t = op->weight->dtype;
        if ((unsigned)t >= Q3_DTYPE_COUNT) return "unknown weight dtype";
        const q3_type_traits *tt = q3_traits(t);
        if (op->kind == Q3_OP_MATMUL || op->kind == Q3_OP_MATMUL_ID) {
            if (op->kind == Q3_OP_MATMUL_ID && (why = q3_matmul_id_check(g, op, NULL))) return why;
            /* every ISA has the same rows: the default one's say what the unit admits */
            if (!q3_cpu_isa_mm(default_isa(), t) || op->weight->shape[op->weight->ndim - 1] % (int64_t)tt->block_values)
                return tt->no_matmul;
        } else if (!q3_dtype_is_plain(t) && op->kind != Q3_OP_EMBED) {
            return tt->no_norm; /* embedding rows of every type: q3_row_to_f32 */
        }
    }
    if (op->kind == Q3_OP_ROPE && g->cfg->head_dim % 2) return "RoPE needs an even head_dim";
    if (op->kind == Q3_OP_MOE_ROUTE) return q3_moe_route_check(g, op);
    if (op->kind == Q3_OP_MOE_SUM) return q3_moe_sum_check(g, op);
    return NULL;
}

static q3_status cpu_run(void *impl, const q3_exec *e, const q3_op *op)
{
    cpu_unit *u = impl;
    u->ops++;
    switch (op->kind) {
    case Q3_OP_EMBED: run_embed(u, e, op); return Q3_OK;
    case Q3_OP_RMSNORM:
    case Q3_OP_HEAD_NORM: {
        int n = op->kind == Q3_OP_RMSNORM ? e->g->values[op->in[0]].cols : e->g->cfg->head_dim;
        const float *w = norm_weight(u, op->weight, n);
        if (!w) return no_scratch(op, (size_t)n * sizeof(float));
        run_rows(u, e, op, w);
        return Q3_OK;
    }
    case Q3_OP_ROPE: {
        int end = 0;
        for (int r = 0; r < live_rows(e, op->in[0]); r++)
            if (e->pos[r] + 1 > end) end = e->pos[r] + 1;
        q3_status st = ensure_rope(u, e->g->cfg, end);
        if (st) return st;
        run_rows(u, e, op, NULL);
        return Q3_OK;
    }
    case Q3_OP_MATMUL: {
        int ran;
        return run_matmuls(u, e, op, 1, &ran);
    }
    case Q3_OP_MATMUL_ID: return run_matmul_id(u, e, op);
    case Q3_OP_MOE_ROUTE: return q3_moe_route(e, op, live_rows(e, op->out));
    case Q3_OP_MOE_SUM: return q3_moe_sum(e, op, live_rows(e, op->out));
    case Q3_OP_KV_APPEND: run_kv_append(u, e, op); return Q3_OK;
    case Q3_OP_ATTENTION: return run_attention(u, e, op);
    case Q3_OP_ADD:
    case Q3_OP_SWIGLU: run_rows(u, e, op, NULL); return Q3_OK;
    case Q3_OP_LAST_ROW:
        memcpy(row_of(e, op->out, 0), row_of(e, op->in[0], e->n_real - 1),
               (size_t)e->g->values[op->out].cols * sizeof(float));
        return Q3_OK;
    case Q3_OP_KIND_COUNT: break;
    }
    return q3_fail(Q3_ERR_UNSUPPORTED, "op %s: unknown kind", op->name);
}

/* A matmul runs together with the matmuls after it over the same input;
 * every other op alone. */
static q3_status cpu_run_many(void *impl, const q3_exec *e, const q3_op *ops, int n, int *ran)
{
    cpu_unit *u = impl;
    if (ops[0].kind != Q3_OP_MATMUL) {
        *ran = 1;
        return cpu_run(impl, e, &ops[0]);
    }
    q3_status st = run_matmuls(u, e, ops, n, ran);
    u->ops += (uint64_t)*ran;
    return st;
}

/* ---- the K/V hand-off -------------------------------------------------------------------- */

typedef struct store_job {
    const q3_cpu_ew_kernels *ew;
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
    for (size_t r = r0; r < r1; r++) j->ew->from_f32(j->t, j->src[r], j->dst[r], j->n);
}

static void cpu_store_rows(void *impl, q3_dtype t, const float *const *src, void *const *dst, size_t n_rows, size_t n)
{
    cpu_unit *u = impl;
    store_job j = {.ew = u->isa->ew, .t = t, .src = src, .dst = dst, .n_rows = n_rows, .n = n};
    q3_pool_job job = {.item = store_item, .ctx = &j,
                       .n_items = (int)((n_rows + STORE_ROWS_PER_ITEM - 1) / STORE_ROWS_PER_ITEM)};
    q3_pool_run(u->pool, &job);
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
    .open = cpu_open,
    .close = cpu_close,
    .threads = cpu_threads,
    .run = cpu_run,
    .run_many = cpu_run_many,
    .store_rows = cpu_store_rows,
    .parallel_for = cpu_parallel_for,
    .kv_default = Q3_F16,
};
