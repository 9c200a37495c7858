/* MOE_ROUTE and MOE_SUM (graph.h): the routing math and the slot sum, one
 * implementation that every unit calls, so that units agree on which experts
 * a token chose bit for bit (a different choice would be a different model,
 * not a rounding difference). Both are O(rows * experts): nothing to gain
 * from a second, faster copy. */
#include <math.h>
#include <string.h>

#include "backend/backend.h"
#include "util/error.h"

const char *q3_moe_route_check(const q3_graph *g, const q3_op *op)
{
    if (op->in[0] < 0 || op->out < 0 || op->out2 < 0) return "a router needs logits, ids and weights";
    const q3_value *l = &g->values[op->in[0]], *ids = &g->values[op->out], *w = &g->values[op->out2];
    if (l->cols < 1 || ids->cols < 1 || ids->cols > l->cols) return "a router chooses 1..n_experts experts a row";
    if (w->cols != ids->cols) return "a router's weights are not [rows][k] like its ids";
    if (l->rows < ids->rows || w->rows < ids->rows) return "a router's logits or weights have fewer rows than its ids";
    if (l->cols > (1 << 24)) return "a router with more than 2^24 experts cannot hold their ids as floats";
    return NULL;
}

const char *q3_moe_sum_check(const q3_graph *g, const q3_op *op)
{
    if (op->in[0] < 0 || op->out < 0) return "a slot sum needs an input and an output";
    const q3_value *x = &g->values[op->in[0]], *y = &g->values[op->out];
    if (y->cols < 1 || x->cols % y->cols || x->cols < y->cols) return "a slot sum's input is not [rows][k * cols]";
    if (x->rows < y->rows) return "a slot sum's input has fewer rows than its output";
    return NULL;
}

q3_status q3_moe_route_row(const q3_op *op, const float *logits, int n, int k, bool norm, float *ids, float *w)
{
    int chosen[k > 0 ? k : 1];
    memset(chosen, 0, sizeof chosen);
    for (int j = 0; j < k; j++) {
        int best = -1;
        for (int e = 0; e < n; e++) {
            if (!isfinite(logits[e]))
                return q3_fail(Q3_ERR_INVALID, "op %s: router logit %d is %g: the activations are not finite",
                               op->name, e, (double)logits[e]);
            bool taken = false;
            for (int i = 0; i < j && !taken; i++) taken = chosen[i] == e;
            if (!taken && (best < 0 || logits[e] > logits[best])) best = e; /* ties: the lower index */
        }
        chosen[j] = best;
    }
    /* softmax over every expert (the largest logit is chosen[0]), then the chosen ones */
    double max = logits[chosen[0]], all = 0, sum = 0;
    for (int e = 0; e < n; e++) all += exp((double)logits[e] - max);
    double p[k > 0 ? k : 1];
    for (int j = 0; j < k; j++) {
        p[j] = exp((double)logits[chosen[j]] - max) / all;
        sum += p[j];
    }
    for (int j = 0; j < k; j++) {
        ids[j] = (float)chosen[j];
        w[j] = (float)(norm ? p[j] / sum : p[j]);
    }
    return Q3_OK;
}

q3_status q3_moe_route(const q3_exec *e, const q3_op *op, int rows)
{
    const char *why = q3_moe_route_check(e->g, op);
    if (why) return q3_fail(Q3_ERR_INVALID, "op %s: %s", op->name, why);
    int n = e->g->values[op->in[0]].cols, k = e->g->values[op->out].cols;
    bool norm = e->g->cfg->norm_topk_prob;
    for (int r = 0; r < rows; r++) {
        q3_status st = q3_moe_route_row(op, e->buf[op->in[0]] + (size_t)r * n, n, k, norm,
                                        e->buf[op->out] + (size_t)r * k, e->buf[op->out2] + (size_t)r * k);
        if (st) return st;
    }
    return Q3_OK;
}

q3_status q3_moe_sum(const q3_exec *e, const q3_op *op, int rows)
{
    const char *why = q3_moe_sum_check(e->g, op);
    if (why) return q3_fail(Q3_ERR_INVALID, "op %s: %s", op->name, why);
    size_t cols = (size_t)e->g->values[op->out].cols, in_cols = (size_t)e->g->values[op->in[0]].cols;
    size_t k = in_cols / cols;
    for (int r = 0; r < rows; r++) {
        const float *x = e->buf[op->in[0]] + (size_t)r * in_cols;
        float *y = e->buf[op->out] + (size_t)r * cols;
        memcpy(y, x, cols * sizeof *y);
        for (size_t j = 1; j < k; j++)
            for (size_t i = 0; i < cols; i++) y[i] += x[j * cols + i];
    }
    return Q3_OK;
}
