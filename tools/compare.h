/* q3 compare's work (the command's options are src/cli/cmd_compare.c): what
 * quantizing the weights (or the KV cache) costs in accuracy, as a table of
 * KL divergence and top-1 agreement per type (tools/convert.c measures). */
#ifndef Q3_TOOLS_COMPARE_H
#define Q3_TOOLS_COMPARE_H

#include "q3.h"

#define Q3_COMPARE_DEFAULT_CASES "tests/data/golden/small/cases"

typedef struct q3_compare_opts {
    const char *model;   /* the model to compare against */
    const char *types;   /* comma-separated weight types, NULL: "q8_0,q4_0" */
    const char *cases;   /* folder of *.json with "tokens", NULL: MODEL/cases, else the source tree's golden cases */
    const char *backend; /* compute unit, NULL: ref (cpu with kv) */
    const char *kv;      /* compare these KV cache types instead, or NULL */
    const char *kv_ref;  /* the reference KV cache type of kv, NULL: "f16" */
} q3_compare_opts;

/* Runs the comparison and prints its table to stdout. Q3_OK, or the status
 * of what failed with q3_last_error() saying why and *usage 1 when an option
 * was wrong (a type that is not one, an empty list), 0 otherwise. */
q3_status q3_compare_run(const q3_compare_opts *o, int *usage);

#endif
