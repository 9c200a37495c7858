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
    if (s.mat_bytes * (size_t)s.n_mat > w->nbytes) return "an indexed matmul's weight holds fewer bytes than its shape";
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

q3_tensor q3_matmul_id_matrix(const q3_tensor *w, int m)
{
    q3_tensor t;
    memset(&t, 0, sizeof t);
    snprintf(t.name, sizeof t.name, "%.100s[%d]", w->name, m);
    t.dtype = w->dtype;
    t.ndim = 2;
    t.shape[0] = w->shape[1];
    t.shape[1] = w->shape[2];
    t.nbytes = (size_t)w->shape[1] * q3_dtype_row_bytes(w->dtype, (size_t)w->shape[2]);
    t.data = (const char *)w->data + (size_t)m * t.nbytes;
    atomic_init(&t.packed, NULL);
    return t;
}
