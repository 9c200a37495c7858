/* Runs a planned graph: one arena of activation buffers per graph, allocated
 * once; ops run in order, each on the unit the plan chose. */
#ifndef Q3_RUN_EXECUTOR_H
#define Q3_RUN_EXECUTOR_H

#include "plan/plan.h"

typedef struct q3_runner {
    const q3_graph *g;
    q3_plan plan;
    float **buf;        /* [n_values] views into arena */
    void *arena;
    double *op_seconds; /* [n_ops] accumulated wall time when profiling, else NULL */
} q3_runner;

q3_status q3_runner_init(q3_runner *r, const q3_graph *g, const q3_backend *const *units, int n_units);
void q3_runner_free(q3_runner *r);
/* Turns per-op timing on (zeroed) or off. */
q3_status q3_runner_profile(q3_runner *r, int on);

/* One run: n_real tokens at position pos (caller validated both). */
void q3_runner_run(q3_runner *r, const int32_t *tokens, int n_real, int pos, q3_kv_cache *kv);

double q3_now(void); /* monotonic seconds */

#endif
