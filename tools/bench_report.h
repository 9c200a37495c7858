/* q3 bench's report (the command's options are src/cli/cmd_bench.c): the
 * split-phase table per compute unit or the batched-decode table, measured
 * with tools/bench.c, set against the machine's limits (tools/limits.c),
 * printed as text or one JSON object, and an SVG chart. */
#ifndef Q3_TOOLS_BENCH_REPORT_H
#define Q3_TOOLS_BENCH_REPORT_H

#include "tools/bench.h"

typedef struct q3_bench_report_opts {
    const char *model;      /* a model folder or .gguf */
    const char *units;      /* units to measure ("cpu,ref", "all"), or NULL: every present unit but ref */
    const char *prefill_on; /* split-phase: prefill on this unit ... */
    const char *decode_on;  /* ... and decode on this one (both or neither) */
    const char *svg;        /* also draw the table into this file, or NULL */
    double drain;           /* tok/s that RTFx divides by */
    int json;               /* one JSON object (docs/bench.schema.json) instead of the table */
    int limits;             /* measure the machine's read bandwidth and arithmetic peaks */
    const int *batches;     /* batched decode instead: these batch sizes ... */
    int n_batches;          /* ... (0: the split-phase table) */
    q3_bench_opts bench;    /* chunk, gen, repeats, prompt_len, depth, kv_dtype */
} q3_bench_report_opts;

/* Measures and prints (progress on stderr). Q3_OK, or the status of what
 * failed with q3_last_error() saying why; an unknown or absent unit fails
 * before anything is printed. */
q3_status q3_bench_report(q3_bench_report_opts *o);

#endif
