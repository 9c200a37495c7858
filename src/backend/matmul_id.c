/* MATMUL_ID: the shape checks, id validation and matrix views every unit shares. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "backend/backend.h"
#include "util/error.h"

const char *q3_matmul_id_check(const q3_graph *g, const q3_op *op, q3_matmul_id_shape *out)
{
    const q3_tensor *w = op->weight;
    if (!w || w->ndim != 3 || w->shape[0] < 1 || w->shape[1] < 1 || w->shape[2] < 1)
        return "an indexed matmul needs a stacked [n_mat][out][in] weight";
    if ((unsigned)w->dtype >= Q3_DTYPE_COUNT) return "unknown weight dtype";
    if (w->shape[0] > INT32_MAX || w->shape[1] > INT32_MAX || w->shape[2] > INT32_MAX)
        return "an indexed matmul's weight is too large";
    if (w->shape[2] % (int64_t)q3_dtype_block_values(w->dtype)) return "rows of the stacked weight are not whole blocks";
    if (op->in[0] < 0 || op->in[1] < 0 || op->out < 0) return "an indexed matmul needs an input, ids and an output";
    q3_matmul_id_shape s = {.n_mat = (int)w->shape[0], .n_out = (int)w->shape[1], .n_in = (int)w->shape[2],
                            .k = g->values[op->in[1]].cols};
    const q3_value *x = &g->values[op->in[0]], *y = &g->values[op->out];
    if (s.k < 1) return "an indexed matmul needs at least one id a row";
    if (x->cols != s.n_in && (int64_t)x->cols != (int64_t)s.k * s.n_in)
        return "an indexed matmul's input is neither [rows][in] nor [rows][k * in]";
    s.x_per_slot = x->cols != s.n_in;
    if ((int64_t)y->cols != (int64_t)s.k * s.n_out) return "an indexed matmul's output is not [rows][k * out]";
    if (op->in[2] >= 0 && g->values[op->in[2]].cols != s.k) return "an indexed matmul's slot weights are not [rows][k]";
    if (g->values[op->in[1]].rows < y->rows || x->rows < y->rows) return "an indexed matmul's ids or input have fewer rows than its output";
    s.mat_bytes = (size_t)s.n_out * q3_dtype_row_bytes(w->dtype, (size_t)s.n_in);
    if (!w->mats) return "a stacked weight without its matrices (q3_tensor_stack_views)";
    for (int m = 0; m < s.n_mat; m++) {
        const q3_tensor *t = w->mats[m];
        if (!t || t->ndim != 2 || t->dtype != w->dtype || t->shape[0] != s.n_out || t->shape[1] != s.n_in ||
            t->nbytes < s.mat_bytes || !t->data)
            return "a matrix of the stacked weight does not match the stack's dtype and shape";
    }
    if (out) *out = s;
    return NULL;
}

q3_status q3_matmul_id_ids(const q3_exec *e, const q3_op *op, const q3_matmul_id_shape *s, int rows, int32_t *ids)
{
    size_t ld = (size_t)e->g->values[op->in[1]].cols;
    for (int r = 0; r < rows; r++)
        for (int j = 0; j < s->k; j++) {
            float v = e->buf[op->in[1]][(size_t)r * ld + (size_t)j];
            /* NaN fails the first test */
            if (!(v >= 0.0f && v < (float)s->n_mat) || v != floorf(v))
                return q3_fail(Q3_ERR_INVALID, "op %s: row %d, slot %d chooses matrix %g, not one of the %d stacked (ids 0..%d)",
                               op->name, r, j, (double)v, s->n_mat, s->n_mat - 1);
            ids[(size_t)r * (size_t)s->k + (size_t)j] = (int32_t)v;
        }
    return Q3_OK;
}

const q3_tensor *q3_matmul_id_matrix(const q3_tensor *w, int m) { return w->mats[m]; }
