/* A compute unit: which ops it admits (and why not), and how it runs one.
 * The planner (src/plan/) places each op of a graph on a backend; the
 * executor (src/run/executor.c) calls run() op by op. */
#ifndef Q3_BACKEND_BACKEND_H
#define Q3_BACKEND_BACKEND_H

#include <stdbool.h>
#include "graph/graph.h"
#include "run/kv_cache.h"

/* What one run of a graph sees: its buffers and runtime inputs. */
typedef struct q3_exec {
    const q3_graph *g;
    float **buf;            /* [n_values] f32 buffers, [rows][cols] each */
    const int32_t *tokens;  /* [n_real] token ids (validated < vocab) */
    int n_real;             /* rows that hold real tokens (<= g->rows); others are never read */
    int pos;                /* position of row 0 = tokens already in the cache */
    q3_kv_cache *kv;        /* read-only in prefill; KV_APPEND writes it in decode */
} q3_exec;

typedef struct q3_backend q3_backend;
struct q3_backend {
    const char *name;       /* "ref", "cpu", "cuda" */
    const char *device;     /* what it runs on, in words */
    /* false when the device is absent (no GPU, CPU lacks the ISA) */
    bool (*present)(const q3_backend *b);
    /* NULL if the backend admits the op, else the reason it refuses */
    const char *(*refuses)(const q3_backend *b, const q3_graph *g, const q3_op *op);
    /* runs one op; every row < n_real of its output is written */
    void (*run)(const q3_backend *b, const q3_exec *e, const q3_op *op);
    /* optional: the K/V hand-off after a prefill chunk, n_rows rows of n F32
       values (src[i]) rounded into the cache's dtype t at dst[i], bit for bit
       as q3_row_from_f32 does; NULL: the session converts them itself */
    void (*store_rows)(const q3_backend *b, q3_dtype t, const float *const *src, void *const *dst, size_t n_rows,
                       size_t n);
    q3_dtype kv_default;    /* the KV cache dtype it prefers */
    void *impl;
};

extern q3_backend q3_backend_ref;
extern q3_backend q3_backend_cpu;
extern q3_backend q3_backend_cuda;

#endif
