/* The reference backend: portable scalar C for every op, accumulating dot
 * products, norms and softmax in double. Slow and obviously correct: it is
 * the oracle every faster backend is tested against. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "model/quantize.h"
#include "model/rope.h"
#include "util/error.h"

/* Rows of a value that hold data in this run: 1-row values stay 1 row. */
static int live_rows(const q3_exec *e, int v)
{
    return e->g->values[v].rows == 1 ? 1 : e->n_real;
}

static float *row_of(const q3_exec *e, int v, int r)
{
    return e->buf[v] + (size_t)r * (size_t)e->g->values[v].cols;
}

static void weight_row(const q3_tensor *w, size_t r, float *out)
{
    size_t cols = (size_t)w->shape[w->ndim - 1];
    q3_row_to_f32(w->dtype, (const char *)w->data + r * q3_dtype_row_bytes(w->dtype, cols), out, cols);
}

/* ---- ops ---------------------------------------------------------------------- */

static q3_status oom(const q3_op *op)
{
    return q3_fail(Q3_ERR_NOMEM, "out of memory running %s on the reference unit", op->name);
}

static q3_status embed(const q3_exec *e, const q3_op *op)
{
    for (int r = 0; r < e->n_real; r++) weight_row(op->weight, (size_t)e->tokens[r], row_of(e, op->out, r));
    return Q3_OK;
}

static void rmsnorm_row(const float *x, const float *w, float *out, int n, float eps)
{
    double ss = 0;
    for (int i = 0; i < n; i++) ss += (double)x[i] * x[i];
    double inv = 1.0 / sqrt(ss / n + (double)eps);
    for (int i = 0; i < n; i++) out[i] = (float)((double)x[i] * inv) * w[i];
}

static q3_status rmsnorm(const q3_exec *e, const q3_op *op)
{
    int n = e->g->values[op->in[0]].cols;
    float *w = malloc((size_t)n * sizeof *w);
    if (!w) return oom(op);
    weight_row(op->weight, 0, w);
    for (int r = 0; r < live_rows(e, op->in[0]); r++)
        rmsnorm_row(row_of(e, op->in[0], r), w, row_of(e, op->out, r), n, e->g->cfg->rms_eps);
    free(w);
    return Q3_OK;
}

static q3_status head_norm(const q3_exec *e, const q3_op *op)
{
    int hd = e->g->cfg->head_dim, cols = e->g->values[op->in[0]].cols;
    float *w = malloc((size_t)hd * sizeof *w);
    if (!w) return oom(op);
    weight_row(op->weight, 0, w);
    for (int r = 0; r < live_rows(e, op->in[0]); r++)
        for (int h = 0; h < cols / hd; h++)
            rmsnorm_row(row_of(e, op->in[0], r) + h * hd, w, row_of(e, op->out, r) + h * hd, hd,
                        e->g->cfg->rms_eps);
    free(w);
    return Q3_OK;
}

/* rotate_half layout: element i pairs with i + head_dim/2. */
static q3_status rope(const q3_exec *e, const q3_op *op)
{
    const q3_config *c = e->g->cfg;
    int hd = c->head_dim, half = hd / 2, cols = e->g->values[op->in[0]].cols;
    for (int r = 0; r < live_rows(e, op->in[0]); r++) {
        double p = (double)e->pos[r];
        float *in = row_of(e, op->in[0], r), *out = row_of(e, op->out, r);
        for (int i = 0; i < half; i++) {
            double scale, freq = q3_rope_freq(c, i, &scale); /* model/rope.h: plain RoPE or YaRN */
            double cs = scale * cos(p * freq), sn = scale * sin(p * freq);
            for (int h = 0; h < cols / hd; h++) {
                double x0 = in[h * hd + i], x1 = in[h * hd + half + i];
                out[h * hd + i] = (float)(x0 * cs - x1 * sn);
                out[h * hd + half + i] = (float)(x0 * sn + x1 * cs);
            }
        }
    }
    return Q3_OK;
}

/* A dot product in double; four partial sums only to break the dependency chain. */
static double dot(const float *x, const float *y, int n)
{
    double a0 = 0, a1 = 0, a2 = 0, a3 = 0;
    int i = 0;
    for (; i + 4 <= n; i += 4) {
        a0 += (double)x[i] * y[i];
        a1 += (double)x[i + 1] * y[i + 1];
        a2 += (double)x[i + 2] * y[i + 2];
        a3 += (double)x[i + 3] * y[i + 3];
    }
    for (; i < n; i++) a0 += (double)x[i] * y[i];
    return (a0 + a1) + (a2 + a3);
}

static q3_status matmul(const q3_exec *e, const q3_op *op)
{
    const q3_tensor *w = op->weight;
    int n_out = (int)w->shape[0], n_in = (int)w->shape[1], rows = live_rows(e, op->in[0]);
    float *wr = malloc((size_t)n_in * sizeof *wr);
    if (!wr) return oom(op);
    for (int o = 0; o < n_out; o++) {
        weight_row(w, (size_t)o, wr);
        for (int r = 0; r < rows; r++) {
            row_of(e, op->out, r)[o] = (float)dot(row_of(e, op->in[0], r), wr, n_in);
        }
    }
    free(wr);
    return Q3_OK;
}

/* Each chosen matrix once, row by row of it, every (row, slot) that chose it
 * by the plain matmul's dot product (then times the slot weight). */
static q3_status matmul_id(const q3_exec *e, const q3_op *op)
{
    q3_matmul_id_shape s;
    const char *why = q3_matmul_id_check(e->g, op, &s);
    if (why) return q3_fail(Q3_ERR_INVALID, "op %s: %s", op->name, why);
    int rows = live_rows(e, op->out);
    int32_t *ids = malloc((size_t)rows * (size_t)s.k * sizeof *ids);
    float *wr = malloc((size_t)s.n_in * sizeof *wr);
    if (!ids || !wr) {
        free(ids);
        free(wr);
        return oom(op);
    }
    q3_status st = q3_matmul_id_ids(e, op, &s, rows, ids);
    for (int m = 0; m < s.n_mat && !st; m++) {
        int used = 0;
        for (int i = 0; i < rows * s.k && !used; i++) used = ids[i] == m;
        if (!used) continue;
        const q3_tensor *w = q3_matmul_id_matrix(op->weight, m);
        for (int o = 0; o < s.n_out; o++) {
            weight_row(w, (size_t)o, wr);
            for (int r = 0; r < rows; r++)
                for (int j = 0; j < s.k; j++) {
                    if (ids[(size_t)r * s.k + j] != m) continue;
                    const float *x = row_of(e, op->in[0], r) + (s.x_per_slot ? (size_t)j * s.n_in : 0);
                    float y = (float)dot(x, wr, s.n_in);
                    if (op->in[2] >= 0) y *= row_of(e, op->in[2], r)[j];
                    row_of(e, op->out, r)[(size_t)j * s.n_out + o] = y;
                }
        }
    }
    free(ids);
    free(wr);
    return st;
}

/* Row r's K and V go to its sequence's position pos[r]. */
static q3_status kv_append(const q3_exec *e, const q3_op *op)
{
    const q3_kv_pool *kv = e->kv;
    for (int r = 0; r < e->n_real; r++) {
        q3_row_from_f32(kv->dtype, row_of(e, op->in[0], r), q3_kv_k_row(kv, e->table[r], op->layer, e->pos[r]),
                        (size_t)kv->kv_dim);
        q3_row_from_f32(kv->dtype, row_of(e, op->in[1], r), q3_kv_v_row(kv, e->table[r], op->layer, e->pos[r]),
                        (size_t)kv->kv_dim);
    }
    return Q3_OK;
}

/* Prefill: row r attends to its sequence's cached positions [0, pos[0]) and
 * chunk rows 0..r. Decode: row r attends to its own sequence's cache
 * [0, pos[r]] (the cache already holds pos[r]). Embed (no state): row r
 * attends to chunk rows [r - pos[r], r], its own packed input. */
static q3_status attention(const q3_exec *e, const q3_op *op)
{
    const q3_config *c = e->g->cfg;
    const q3_kv_pool *kv = e->kv; /* NULL in an embed graph */
    int hd = c->head_dim, group = c->n_heads / c->n_kv_heads, kv_dim = c->n_kv_heads * hd;
    bool chunk = op->in[1] >= 0, packed = chunk && !op->reads_state;
    int max_keys = 0;
    for (int r = 0; r < e->n_real; r++) {
        int n = packed ? e->pos[r] + 1 : chunk ? e->pos[0] + r + 1 : e->pos[r] + 1;
        if (n > max_keys) max_keys = n;
    }
    double *score = malloc((size_t)max_keys * sizeof *score);
    float *key = malloc((size_t)kv_dim * 2 * sizeof *key), *val = key ? key + kv_dim : NULL;
    double *acc = malloc((size_t)hd * sizeof *acc);
    float *qround = malloc((size_t)hd * sizeof *qround);
    if (!score || !key || !acc || !qround) {
        free(score);
        free(key);
        free(acc);
        free(qround);
        return oom(op);
    }
    double scale = 1.0 / sqrt((double)hd);
    for (int r = 0; r < e->n_real; r++) {
        const float *q = row_of(e, op->in[0], r);
        const int32_t *table = packed ? NULL : e->table[r];
        int n_cached = packed ? 0 : chunk ? e->pos[0] : e->pos[r] + 1;
        int first = packed ? r - e->pos[r] : 0; /* the chunk row of key n_cached */
        int n_keys = n_cached + (packed ? e->pos[r] + 1 : chunk ? r + 1 : 0);
        for (int h = 0; h < c->n_heads; h++) {
            int kh = h / group;
            size_t head_off = n_cached ? (size_t)kh * q3_dtype_row_bytes(kv->dtype, (size_t)hd) : 0; /* Q8_0: hd % 32 == 0 */
            const float *qh = q + h * hd;
            if (kv && kv->dtype == Q3_Q8_0 && !packed) { /* a Q8_0 cache's keys meet the query as Q8_0 too */
                q3_round_q8_0(qh, qround, (size_t)hd);
                qh = qround;
            }
            double mx = -INFINITY;
            for (int t = 0; t < n_keys; t++) {
                const float *kr;
                if (t < n_cached) {
                    q3_row_to_f32(kv->dtype, (const char *)q3_kv_k_row(kv, table, op->layer, t) + head_off, key + kh * hd,
                                  (size_t)hd);
                    kr = key;
                } else {
                    kr = row_of(e, op->in[1], first + t - n_cached);
                }
                double s = 0;
                for (int i = 0; i < hd; i++) s += (double)qh[i] * kr[kh * hd + i];
                score[t] = s * scale;
                if (score[t] > mx) mx = score[t];
            }
            double sum = 0;
            for (int t = 0; t < n_keys; t++) sum += (score[t] = exp(score[t] - mx));
            for (int i = 0; i < hd; i++) acc[i] = 0;
            for (int t = 0; t < n_keys; t++) {
                const float *vr;
                if (t < n_cached) {
                    q3_row_to_f32(kv->dtype, (const char *)q3_kv_v_row(kv, table, op->layer, t) + head_off, val + kh * hd,
                                  (size_t)hd);
                    vr = val;
                } else {
                    vr = row_of(e, op->in[2], first + t - n_cached);
                }
                for (int i = 0; i < hd; i++) acc[i] += score[t] * vr[kh * hd + i];
            }
            float *out = row_of(e, op->out, r) + h * hd;
            for (int i = 0; i < hd; i++) out[i] = (float)(acc[i] / sum);
        }
    }
    free(score);
    free(key);
    free(acc);
    free(qround);
    return Q3_OK;
}

static q3_status add(const q3_exec *e, const q3_op *op)
{
    int cols = e->g->values[op->out].cols;
    for (int r = 0; r < live_rows(e, op->out); r++) {
        const float *a = row_of(e, op->in[0], r), *b = row_of(e, op->in[1], r);
        float *o = row_of(e, op->out, r);
        for (int i = 0; i < cols; i++) o[i] = a[i] + b[i];
    }
    return Q3_OK;
}

static q3_status swiglu(const q3_exec *e, const q3_op *op)
{
    int cols = e->g->values[op->out].cols;
    for (int r = 0; r < live_rows(e, op->out); r++) {
        const float *g = row_of(e, op->in[0], r), *u = row_of(e, op->in[1], r);
        float *o = row_of(e, op->out, r);
        for (int i = 0; i < cols; i++) o[i] = (float)((double)g[i] / (1.0 + exp(-(double)g[i])) * u[i]);
    }
    return Q3_OK;
}

static q3_status last_row(const q3_exec *e, const q3_op *op)
{
    memcpy(row_of(e, op->out, 0), row_of(e, op->in[0], e->n_real - 1),
           (size_t)e->g->values[op->out].cols * sizeof(float));
    return Q3_OK;
}

/* ---- the backend ---------------------------------------------------------------- */

static bool ref_present(const q3_backend *b) { return true; }

static const char *ref_refuses(const q3_backend *b, const q3_graph *g, const q3_op *op)
{
    if (op->weight && op->weight->dtype >= Q3_DTYPE_COUNT) return "unknown weight dtype";
    if (op->kind == Q3_OP_MATMUL_ID) return q3_matmul_id_check(g, op, NULL);
    if (op->kind == Q3_OP_MOE_ROUTE) return q3_moe_route_check(g, op);
    if (op->kind == Q3_OP_MOE_SUM) return q3_moe_sum_check(g, op);
    return NULL;
}

static q3_status ref_run(void *impl, const q3_exec *e, const q3_op *op)
{
    switch (op->kind) {
    case Q3_OP_EMBED: return embed(e, op);
    case Q3_OP_RMSNORM: return rmsnorm(e, op);
    case Q3_OP_HEAD_NORM: return head_norm(e, op);
    case Q3_OP_ROPE: return rope(e, op);
    case Q3_OP_MATMUL: return matmul(e, op);
    case Q3_OP_KV_APPEND: return kv_append(e, op);
    case Q3_OP_ATTENTION: return attention(e, op);
    case Q3_OP_ADD: return add(e, op);
    case Q3_OP_SWIGLU: return swiglu(e, op);
    case Q3_OP_LAST_ROW: return last_row(e, op);
    case Q3_OP_MATMUL_ID: return matmul_id(e, op);
    case Q3_OP_MOE_ROUTE: return q3_moe_route(e, op, live_rows(e, op->out));
    case Q3_OP_MOE_SUM: return q3_moe_sum(e, op, live_rows(e, op->out));
    case Q3_OP_KIND_COUNT: break;
    }
    return q3_fail(Q3_ERR_UNSUPPORTED, "op %s: unknown kind", op->name);
}

q3_backend q3_backend_ref = {
    .name = "ref",
    .device = "CPU, portable scalar C (reference)",
    .present = ref_present,
    .refuses = ref_refuses,
    .run = ref_run,
    .kv_default = Q3_F32,
};
