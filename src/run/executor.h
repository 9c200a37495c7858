/* Runs a planned graph: one arena of activation buffers per graph, allocated
 * once; ops run in order, each on the unit instance the plan chose. */
#ifndef Q3_RUN_EXECUTOR_H
#define Q3_RUN_EXECUTOR_H

#include "plan/plan.h"

typedef struct q3_runner {
    const q3_graph *g;
    q3_plan plan;
    q3_unit *unit[Q3_PLAN_MAX_UNITS]; /* the instance of each plan unit (borrowed) */
    float **buf;        /* [n_values] views into arena */
    void *arena;
    double *op_seconds; /* [n_ops] accumulated wall time when profiling, else NULL */
} q3_runner;

/* Plans g over the units' descriptors (in order of preference) and sizes its
 * buffers. The units must outlive the runner. */
q3_status q3_runner_init(q3_runner *r, const q3_graph *g, q3_unit *const *units, int n_units);
void q3_runner_free(q3_runner *r);
/* Turns per-op timing on (zeroed) or off. */
q3_status q3_runner_profile(q3_runner *r, int on);

/* One run over n_real rows: row i is token tokens[i] at position pos[i] of
 * the sequence whose block table in kv is table[i] (the caller validated
 * them and reserved the blocks). Stops at the first op that fails. */
q3_status q3_runner_run(q3_runner *r, const int32_t *tokens, int n_real, const int32_t *pos, q3_kv_pool *kv,
                        const int32_t *const *table);

double q3_now(void); /* monotonic seconds */

#endif
