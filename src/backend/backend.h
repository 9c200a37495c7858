/* A compute unit: which ops it admits (and why not), and instances that run
 * them. The planner (src/plan/) places each op of a graph on a unit by its
 * descriptor (q3_backend, static, stateless); the executor (src/run/) calls
 * run() on an instance (q3_unit) that a runtime context opened and owns:
 * the instance holds the unit's threads, scratch and tables, so two contexts
 * never share them and no op waits on a process-wide lock.
 *
 * Who owns which memory: weights belong to the model (mmapped, read-only);
 * activations belong to the runner of a graph (q3_runner, host memory, one
 * arena per graph); K/V rows belong to the context's KV pool (src/kv/, host
 * memory). A unit reads and writes them in place and owns only its scratch;
 * a device unit would keep copies in its own memory and say so here. */
#ifndef Q3_BACKEND_BACKEND_H
#define Q3_BACKEND_BACKEND_H

#include <stdbool.h>
#include "graph/graph.h"
#include "kv/kv_pool.h"

/* What one run of a graph sees: its buffers and runtime inputs. Row r of a
 * run belongs to the sequence whose block table is table[r], at position
 * pos[r]: a prefill chunk's rows are one sequence at consecutive positions,
 * a decode step's rows are one row per sequence. */
typedef struct q3_exec {
    const q3_graph *g;
    float **buf;            /* [n_values] f32 buffers, [rows][cols] each */
    const int32_t *tokens;  /* [n_real] token ids (validated < vocab) */
    int n_real;             /* rows that hold real tokens (<= g->rows); others are never read */
    const int32_t *pos;     /* [n_real] position of each row */
    q3_kv_pool *kv;         /* read-only in prefill; KV_APPEND writes it in decode */
    const int32_t *const *table; /* [n_real] each row's block table in kv */
} q3_exec;

typedef struct q3_unit_opts {
    int n_threads;          /* worker threads of a CPU unit (0: one per physical core) */
} q3_unit_opts;

typedef struct q3_backend q3_backend;
struct q3_backend {
    const char *name;       /* "ref", "cpu", "cuda" */
    const char *device;     /* what it runs on, in words */
    /* false when the device is absent (no GPU, CPU lacks the ISA) */
    bool (*present)(const q3_backend *b);
    /* NULL if the backend admits the op, else the reason it refuses */
    const char *(*refuses)(const q3_backend *b, const q3_graph *g, const q3_op *op);
    /* an instance's state (*impl may stay NULL for a stateless unit) */
    q3_status (*open)(const q3_backend *b, const q3_unit_opts *o, void **impl);
    void (*close)(void *impl);
    int (*threads)(void *impl); /* optional: threads an instance runs on (NULL: 1) */
    /* runs one op; every row < n_real of its output is written. Q3_ERR_NOMEM
       (with a message) when scratch cannot be had; outputs are then undefined */
    q3_status (*run)(void *impl, const q3_exec *e, const q3_op *op);
    /* optional: runs ops[0] and as many of the ops after it as the unit can
       run together (one synchronisation instead of several: e.g. the
       matmuls that share an input), at most n, all placed on this unit and
       in graph order; *ran = how many it ran (>= 1 on success). Results are
       bit for bit those of run() op by op. NULL: the executor calls run() */
    q3_status (*run_many)(void *impl, const q3_exec *e, const q3_op *ops, int n, int *ran);
    /* optional: the K/V hand-off after a prefill chunk, n_rows rows of n F32
       values (src[i]) rounded into the cache's dtype t at dst[i], bit for bit
       as q3_row_from_f32 does; NULL: the caller converts them itself */
    void (*store_rows)(void *impl, q3_dtype t, const float *const *src, void *const *dst, size_t n_rows, size_t n);
    /* optional: host work between runs, spread over the instance's threads:
       fn(ctx, i) for every i in [0, n), each once, any order, returning when
       all are done (the generation loop's per-row token masks); never while
       an op runs. NULL: the caller loops itself */
    void (*parallel_for)(void *impl, void (*fn)(void *ctx, int i), void *ctx, int n);
    q3_dtype kv_default;    /* the KV cache dtype it prefers */
};

/* An open instance of a unit. */
typedef struct q3_unit {
    const q3_backend *b;
    void *impl;
    int n_threads;          /* as opened (1 for single-threaded units) */
} q3_unit;

/* Opens an instance of b (which must be present). The caller closes it; it
 * must outlive every runner that uses it. */
q3_status q3_unit_open(const q3_backend *b, const q3_unit_opts *o, q3_unit **out);
void q3_unit_close(q3_unit *u);

/* ---- MATMUL_ID (graph.h), the parts every unit shares ---- */

/* The shapes of a MATMUL_ID op. */
typedef struct q3_matmul_id_shape {
    int n_mat, n_out, n_in;   /* the stacked weight [n_mat][n_out][n_in] */
    int k;                    /* matrices (slots) a row chooses: in1's columns */
    bool x_per_slot;          /* in0 is [rows][k * n_in]: slot j's own input */
    size_t mat_bytes;         /* bytes of one matrix of the stack */
} q3_matmul_id_shape;

/* Why the op's weight and values do not fit together as MATMUL_ID (NULL:
 * they do, and *s, if not NULL, holds the shapes). What a unit's refuses()
 * says before its own limits. */
const char *q3_matmul_id_check(const q3_graph *g, const q3_op *op, q3_matmul_id_shape *s);
/* The ids of rows [0, rows) as ints, ids[r * k + j]. Q3_ERR_INVALID (with a
 * message naming the op, row, slot and value) when one is not an integer in
 * [0, n_mat): units call it before they read any weight. */
q3_status q3_matmul_id_ids(const q3_exec *e, const q3_op *op, const q3_matmul_id_shape *s, int rows, int32_t *ids);
/* Matrix m of the stacked weight w, a 2-D [n_out][n_in] tensor of its own
 * (w->mats[m]: the check above has seen that they all exist). */
const q3_tensor *q3_matmul_id_matrix(const q3_tensor *w, int m);

/* ---- MOE_ROUTE and MOE_SUM (graph.h): one implementation for every unit (backend/moe.c) ---- */

/* Why the op's values do not fit the op (NULL: they do). */
const char *q3_moe_route_check(const q3_graph *g, const q3_op *op);
const char *q3_moe_sum_check(const q3_graph *g, const q3_op *op);
/* One row's choice: the k of n logits, ids and weights as the op defines
 * them. Q3_ERR_INVALID (naming the op) on a logit that is not finite. */
q3_status q3_moe_route_row(const q3_op *op, const float *logits, int n, int k, bool norm, float *ids, float *w);
/* The ops over rows [0, rows) of e. */
q3_status q3_moe_route(const q3_exec *e, const q3_op *op, int rows);
q3_status q3_moe_sum(const q3_exec *e, const q3_op *op, int rows);

extern q3_backend q3_backend_ref;
extern q3_backend q3_backend_cpu;
extern q3_backend q3_backend_cuda;

#endif
