#include "plan/plan.h"

#include <stdlib.h>
#include <string.h>

#include "util/error.h"

q3_status q3_plan_graph(const q3_graph *g, const q3_backend *const *units, int n_units, q3_plan *p)
{
    memset(p, 0, sizeof *p);
    if (n_units <= 0 || n_units > Q3_PLAN_MAX_UNITS)
        return q3_fail(Q3_ERR_INVALID, "a plan needs 1..%d compute units, got %d", Q3_PLAN_MAX_UNITS, n_units);
    p->n_ops = g->n_ops;
    p->n_units = n_units;
    memcpy(p->units, units, (size_t)n_units * sizeof *units);
    p->unit_of = malloc((size_t)g->n_ops * sizeof *p->unit_of);
    p->refusal = calloc((size_t)g->n_ops * (size_t)n_units, sizeof *p->refusal);
    if (!p->unit_of || !p->refusal) {
        q3_plan_free(p);
        return q3_fail(Q3_ERR_NOMEM, "out of memory planning a graph");
    }
    for (int i = 0; i < g->n_ops; i++) {
        p->unit_of[i] = -1;
        for (int u = 0; u < n_units && p->unit_of[i] < 0; u++) {
            const q3_backend *b = units[u];
            const char *why = b->present && !b->present(b) ? "device absent" : b->refuses(b, g, &g->ops[i]);
            if (why)
                p->refusal[(size_t)i * (size_t)n_units + (size_t)u] = why;
            else
                p->unit_of[i] = u;
        }
        if (p->unit_of[i] < 0) {
            const char *why = p->refusal[(size_t)i * (size_t)n_units];
            q3_status st = q3_fail(Q3_ERR_UNSUPPORTED, "no compute unit admits op %s (%s): %s refuses: %s",
                                   g->ops[i].name, q3_op_kind_name(g->ops[i].kind), units[0]->name, why);
            q3_plan_free(p);
            return st;
        }
    }
    return Q3_OK;
}

void q3_plan_free(q3_plan *p)
{
    free(p->unit_of);
    free(p->refusal);
    memset(p, 0, sizeof *p);
}

int q3_plan_count_on(const q3_plan *p, int u)
{
    int n = 0;
    for (int i = 0; i < p->n_ops; i++) n += p->unit_of[i] == u;
    return n;
}
