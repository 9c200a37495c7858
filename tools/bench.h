/* The split-phase benchmark: prefill latency per fixed-size chunk and decode
 * latency per token, on chosen compute units, with the K/V hand-off between. */
#ifndef Q3_RUN_BENCH_H
#define Q3_RUN_BENCH_H

#include <stdint.h>
#include "q3.h"

typedef struct q3_bench_opts {
    const char *prefill_unit;  /* compute unit for prefill */
    const char *decode_unit;   /* compute unit for decode (may differ: split-phase) */
    const char *kv_dtype;      /* NULL: the decode unit's default */
    int chunk;                 /* prefill chunk S (tokens per prefill run) */
    int gen;                   /* decode steps timed */
    int repeats;               /* prefill runs timed */
    int depth;                 /* tokens already in the cache before decode is timed (>= prompt) */
    int prompt_len;            /* tokens per timed prefill run (0: one chunk) */
    const int32_t *prompt;     /* [chunk] prompt ids, or NULL for deterministic pseudo-random ids */
} q3_bench_opts;

typedef struct q3_stats {
    double p50, p99, mean, min, max; /* milliseconds */
    double sd;                       /* sample standard deviation (0 for one sample) */
    int n;
} q3_stats;

typedef struct q3_bench_result {
    q3_stats prefill_ms;       /* per prefill run of prompt_len tokens */
    int prompt_len, n_chunks;  /* tokens and chunks per prefill run */
    q3_stats decode_ms;        /* per token */
    double prompt_tok_s;       /* prompt_len / prefill p50 */
    double decode_tok_s;       /* 1000 / decode mean */
    double handoff_ms;         /* per chunk: prefill K/V into the cache */
    double prefill_flops;      /* per prefill run */
    double decode_bytes;       /* weight + KV bytes streamed per decode token */
    double active_bytes;       /* the weight part: what one token reads (q3_model_active_bytes: a MoE
                                  model's n_experts_used experts a layer, one embedding row) */
    double kv_bytes;           /* the K/V part, at the mean depth of the timed tokens */
    int32_t *generated;        /* [n_generated] greedy ids (caller frees) */
    int n_generated;
} q3_bench_result;

q3_status q3_bench_run(q3_model *m, const q3_bench_opts *o, q3_bench_result *r);

/* Batched decode: B sequences at depth o->depth (at least 1), each step one
 * row per sequence, o->gen timed steps per B (after one warm-up). */
typedef struct q3_batch_result {
    int batch;                 /* B */
    q3_stats step_ms;          /* per step of B rows */
    double tok_s;              /* B / mean step */
    double weight_bytes;       /* weight bytes a step streams (once for all rows; a MoE model's
                                  experts: the union the rows chose, as experts_measured) */
    double kv_bytes;           /* K/V bytes a step reads (every row's own cache, mean depth) */
    double flops;              /* multiply-adds x 2 of a step */
    /* a mixture-of-experts model (0 for a dense one): distinct experts a layer
       reads in a step of B rows */
    double experts_expected;   /* under uniform routing: E (1 - (1 - k/E)^B) */
    double experts_measured;   /* counted from the router's choices (MOE_ROUTE's ids) of every
                                  layer of every timed step, mean per layer and step */
} q3_batch_result;

/* Distinct experts of n (k chosen per row, uniformly) that B rows choose
 * between them, expected: n (1 - (1 - k/n)^B). */
double q3_bench_experts_expected(int n, int k, int rows);

q3_status q3_bench_batch(q3_model *m, const q3_bench_opts *o, const int *batches, int n, q3_batch_result *out);
void q3_stats_compute(const double *ms, int n, q3_stats *out);

#endif
