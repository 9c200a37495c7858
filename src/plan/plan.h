/* Placement: each op of a graph goes to the most preferred compute unit that
 * is present and admits it; for every unit passed over, the reason is kept.
 * Planning is a pure function of (graph, units), so it is testable alone. */
#ifndef Q3_PLAN_PLAN_H
#define Q3_PLAN_PLAN_H

#include "backend/backend.h"

#define Q3_PLAN_MAX_UNITS 8

typedef struct q3_plan {
    int n_ops, n_units;
    const q3_backend *units[Q3_PLAN_MAX_UNITS]; /* in order of preference */
    int *unit_of;            /* [n_ops] index into units, -1 if no unit admits the op */
    const char **refusal;    /* [n_ops][n_units]: why units[u] did not take op i (NULL: not asked / took it) */
} q3_plan;

/* Places every op; fails (naming the op and each unit's reason) if some op
 * has no unit at all. */
q3_status q3_plan_graph(const q3_graph *g, const q3_backend *const *units, int n_units, q3_plan *out);
void q3_plan_free(q3_plan *p);

/* Ops placed on unit u. */
int q3_plan_count_on(const q3_plan *p, int u);

#endif
