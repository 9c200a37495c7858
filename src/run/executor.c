#include "run/executor.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "q3.h" /* q3_now: public */
#include "util/error.h"

/* Ops offered to a unit's run_many at once. */
#define RUN_MANY_MAX 8

double q3_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

q3_status q3_runner_init(q3_runner *r, const q3_graph *g, q3_unit *const *units, int n_units)
{
    memset(r, 0, sizeof *r);
    r->g = g;
    if (n_units <= 0 || n_units > Q3_PLAN_MAX_UNITS)
        return q3_fail(Q3_ERR_INVALID, "a plan needs 1..%d compute units, got %d", Q3_PLAN_MAX_UNITS, n_units);
    const q3_backend *descs[Q3_PLAN_MAX_UNITS];
    for (int u = 0; u < n_units; u++) {
        descs[u] = units[u]->b;
        r->unit[u] = units[u];
    }
    q3_status st = q3_plan_graph(g, descs, n_units, &r->plan);
    if (st) return st;
    size_t total = 0;
    for (int v = 0; v < g->n_values; v++)
        total += ((size_t)g->values[v].rows * (size_t)g->values[v].cols * sizeof(float) + 63) & ~(size_t)63;
    r->buf = calloc(g->n_values > 0 ? (size_t)g->n_values : 1, sizeof *r->buf);
    r->arena = aligned_alloc(64, total ? total : 64);
    if (!r->buf || !r->arena) {
        q3_runner_free(r);
        return q3_fail(Q3_ERR_NOMEM, "cannot allocate %zu bytes of activations", total);
    }
    memset(r->arena, 0, total);
    char *p = r->arena;
    for (int v = 0; v < g->n_values; v++) {
        r->buf[v] = (float *)p;
        p += ((size_t)g->values[v].rows * (size_t)g->values[v].cols * sizeof(float) + 63) & ~(size_t)63;
    }
    return Q3_OK;
}

void q3_runner_free(q3_runner *r)
{
    q3_plan_free(&r->plan);
    free(r->buf);
    free(r->arena);
    free(r->op_seconds);
    memset(r, 0, sizeof *r);
}

q3_status q3_runner_profile(q3_runner *r, int on)
{
    free(r->op_seconds);
    r->op_seconds = NULL;
    if (on && !(r->op_seconds = calloc((size_t)r->g->n_ops, sizeof *r->op_seconds)))
        return q3_fail(Q3_ERR_NOMEM, "out of memory");
    return Q3_OK;
}

q3_status q3_runner_run(q3_runner *r, const int32_t *tokens, int n_real, const int32_t *pos, q3_kv_pool *kv,
                        const int32_t *const *table)
{
    q3_exec e = {.g = r->g, .buf = r->buf, .tokens = tokens, .n_real = n_real, .pos = pos, .kv = kv, .table = table};
    for (int i = 0; i < r->g->n_ops;) {
        q3_unit *u = r->unit[r->plan.unit_of[i]];
        int n = 1, ran = 1;
        if (u->b->run_many) /* the next few ops, up to one placed elsewhere */
            while (n < RUN_MANY_MAX && i + n < r->g->n_ops && r->plan.unit_of[i + n] == r->plan.unit_of[i]) n++;
        double t0 = r->op_seconds ? q3_now() : 0;
        q3_status st = u->b->run_many ? u->b->run_many(u->impl, &e, &r->g->ops[i], n, &ran)
                                      : u->b->run(u->impl, &e, &r->g->ops[i]);
        /* ops run together: their time is the first one's */
        if (r->op_seconds) r->op_seconds[i] += q3_now() - t0;
        if (st) return st;
        i += ran;
    }
    return Q3_OK;
}
