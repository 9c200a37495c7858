#include "graph/graph.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/error.h"

static const char *const kind_names[Q3_OP_KIND_COUNT] = {
    [Q3_OP_EMBED] = "embed",         [Q3_OP_RMSNORM] = "rmsnorm", [Q3_OP_HEAD_NORM] = "head_norm",
    [Q3_OP_ROPE] = "rope",           [Q3_OP_MATMUL] = "matmul",   [Q3_OP_KV_APPEND] = "kv_append",
    [Q3_OP_ATTENTION] = "attention", [Q3_OP_ADD] = "add",         [Q3_OP_SWIGLU] = "swiglu",
    [Q3_OP_LAST_ROW] = "last_row",   [Q3_OP_MATMUL_ID] = "matmul_id", [Q3_OP_MOE_ROUTE] = "moe_route",
    [Q3_OP_MOE_SUM] = "moe_sum",
};

const char *q3_op_kind_name(q3_op_kind k) { return (unsigned)k < Q3_OP_KIND_COUNT ? kind_names[k] : "?"; }

/* ---- builder ---------------------------------------------------------------- */

typedef struct builder {
    q3_graph *g;
    int cap_ops, cap_values;
    bool oom;
} builder;

static int value(builder *b, int rows, int cols, const char *fmt, ...)
{
    if (b->g->n_values == b->cap_values) {
        b->cap_values = b->cap_values ? 2 * b->cap_values : 64;
        q3_value *v = realloc(b->g->values, (size_t)b->cap_values * sizeof *v);
        if (!v) { b->oom = true; return -1; }
        b->g->values = v;
    }
    q3_value *v = &b->g->values[b->g->n_values];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(v->name, sizeof v->name, fmt, ap);
    va_end(ap);
    v->rows = rows;
    v->cols = cols;
    return b->g->n_values++;
}

static q3_op *op(builder *b, q3_op_kind kind, int layer, const char *name, int out, int in0, int in1, int in2,
                 const q3_tensor *weight)
{
    static q3_op dummy;
    if (b->g->n_ops == b->cap_ops) {
        b->cap_ops = b->cap_ops ? 2 * b->cap_ops : 256;
        q3_op *o = realloc(b->g->ops, (size_t)b->cap_ops * sizeof *o);
        if (!o) { b->oom = true; return &dummy; }
        b->g->ops = o;
    }
    q3_op *o = &b->g->ops[b->g->n_ops++];
    memset(o, 0, sizeof *o);
    o->kind = kind;
    o->layer = layer;
    if (layer >= 0)
        snprintf(o->name, sizeof o->name, "blk.%d.%s", layer, name);
    else
        snprintf(o->name, sizeof o->name, "%s", name);
    o->out = out;
    o->out2 = -1;
    o->in[0] = in0;
    o->in[1] = in1;
    o->in[2] = in2;
    o->weight = weight;
    return o;
}

/* The three graphs share one layer body; they differ in where K/V come from
 * and go, and in what comes out at the end. */
static q3_status build(const q3_model *m, q3_graph_kind kind, int rows, bool all_logits, const q3_tensor *score_head,
                       q3_graph *g)
{
    memset(g, 0, sizeof *g);
    const q3_config *c = &m->cfg;
    if (rows <= 0 || rows > 65536) return q3_fail(Q3_ERR_INVALID, "chunk size %d is out of range (1..65536)", rows);
    g->kind = kind;
    g->model = m;
    g->cfg = c;
    g->rows = rows;
    g->all_logits = all_logits;
    builder b = {.g = g};
    bool prefill = kind == Q3_GRAPH_PREFILL, embed = kind == Q3_GRAPH_EMBED;
    g->v_logits = g->v_hidden = g->v_score = -1;
    int q_dim = c->n_heads * c->head_dim, kv_dim = c->n_kv_heads * c->head_dim;
    g->v_k = calloc((size_t)c->n_layers, sizeof(int));
    g->v_v = calloc((size_t)c->n_layers, sizeof(int));
    if (!g->v_k || !g->v_v) b.oom = true;

    int x = value(&b, rows, c->dim, "x");           /* residual stream */
    int h = value(&b, rows, c->dim, "h");           /* normed input of a block */
    int q = value(&b, rows, q_dim, "q");
    int att = value(&b, rows, q_dim, "att");
    int o = value(&b, rows, c->dim, "o");
    const bool moe = q3_config_is_moe(c);
    const int n_exp = c->n_experts, k_used = c->n_experts_used;
    /* dense: gate, up [rows][ffn]; MoE: each row's k chosen experts side by side [rows][k * expert_ffn] */
    const int ffn_cols = moe ? k_used * c->expert_ffn_dim : c->ffn_dim;
    int gate = value(&b, rows, ffn_cols, "gate");
    int up = value(&b, rows, ffn_cols, "up");
    int router = -1, ids = -1, wts = -1, down = -1;
    if (moe) {
        router = value(&b, rows, n_exp, "router");
        ids = value(&b, rows, k_used, "expert_ids");
        wts = value(&b, rows, k_used, "expert_weights");
        down = value(&b, rows, k_used * c->dim, "expert_down");
    }
    int k_dec = -1, v_dec = -1;
    if (!prefill) { /* decode, embed: one K/V pair reused by every layer */
        k_dec = value(&b, rows, kv_dim, "k");
        v_dec = value(&b, rows, kv_dim, "v");
    }
    op(&b, Q3_OP_EMBED, -1, "token_embd", x, -1, -1, -1, m->w.embed);
    for (int l = 0; l < c->n_layers && !b.oom; l++) {
        const q3_layer_weights *L = &m->w.layers[l];
        int k = k_dec, v = v_dec;
        if (prefill) { /* the chunk's K/V are graph outputs, one pair per layer */
            k = value(&b, rows, kv_dim, "blk.%d.k", l);
            v = value(&b, rows, kv_dim, "blk.%d.v", l);
        }
        if (g->v_k) { g->v_k[l] = prefill ? k : -1; g->v_v[l] = prefill ? v : -1; }
        op(&b, Q3_OP_RMSNORM, l, "attn_norm", h, x, -1, -1, L->attn_norm);
        op(&b, Q3_OP_MATMUL, l, "attn_q", q, h, -1, -1, L->wq);
        op(&b, Q3_OP_MATMUL, l, "attn_k", k, h, -1, -1, L->wk);
        op(&b, Q3_OP_MATMUL, l, "attn_v", v, h, -1, -1, L->wv);
        op(&b, Q3_OP_HEAD_NORM, l, "attn_q_norm", q, q, -1, -1, L->q_norm);
        op(&b, Q3_OP_HEAD_NORM, l, "attn_k_norm", k, k, -1, -1, L->k_norm);
        op(&b, Q3_OP_ROPE, l, "attn_q_rope", q, q, -1, -1, NULL);
        op(&b, Q3_OP_ROPE, l, "attn_k_rope", k, k, -1, -1, NULL);
        if (embed) { /* each packed input attends to itself */
            op(&b, Q3_OP_ATTENTION, l, "attn", att, q, k, v, NULL);
        } else if (prefill) {
            q3_op *a = op(&b, Q3_OP_ATTENTION, l, "attn", att, q, k, v, NULL);
            a->reads_state = true;
        } else {
            q3_op *ap = op(&b, Q3_OP_KV_APPEND, l, "kv_append", -1, k, v, -1, NULL);
            ap->mutates_state = true;
            q3_op *a = op(&b, Q3_OP_ATTENTION, l, "attn", att, q, -1, -1, NULL);
            a->reads_state = true;
        }
        op(&b, Q3_OP_MATMUL, l, "attn_output", o, att, -1, -1, L->wo);
        op(&b, Q3_OP_ADD, l, "attn_residual", x, x, o, -1, NULL);
        op(&b, Q3_OP_RMSNORM, l, "ffn_norm", h, x, -1, -1, L->ffn_norm);
        if (moe) { /* route, then the chosen experts' SwiGLU MLPs, weighted and summed */
            op(&b, Q3_OP_MATMUL, l, "ffn_gate_inp", router, h, -1, -1, L->router);
            op(&b, Q3_OP_MOE_ROUTE, l, "ffn_route", ids, router, -1, -1, NULL)->out2 = wts;
            op(&b, Q3_OP_MATMUL_ID, l, "ffn_gate_exps", gate, h, ids, -1, L->exp_gate);
            op(&b, Q3_OP_MATMUL_ID, l, "ffn_up_exps", up, h, ids, -1, L->exp_up);
            op(&b, Q3_OP_SWIGLU, l, "ffn_swiglu", gate, gate, up, -1, NULL);
            op(&b, Q3_OP_MATMUL_ID, l, "ffn_down_exps", down, gate, ids, wts, L->exp_down);
            op(&b, Q3_OP_MOE_SUM, l, "ffn_moe_sum", o, down, -1, -1, NULL);
        } else {
            op(&b, Q3_OP_MATMUL, l, "ffn_gate", gate, h, -1, -1, L->w_gate);
            op(&b, Q3_OP_MATMUL, l, "ffn_up", up, h, -1, -1, L->w_up);
            op(&b, Q3_OP_SWIGLU, l, "ffn_swiglu", gate, gate, up, -1, NULL);
            op(&b, Q3_OP_MATMUL, l, "ffn_down", o, gate, -1, -1, L->w_down);
        }
        op(&b, Q3_OP_ADD, l, "ffn_residual", x, x, o, -1, NULL);
    }
    op(&b, Q3_OP_RMSNORM, -1, "output_norm", h, x, -1, -1, m->w.out_norm);
    if (embed) { /* every row's hidden state; a reranker's two logits */
        g->v_hidden = h;
        if (score_head) {
            g->v_score = value(&b, rows, 2, "score");
            op(&b, Q3_OP_MATMUL, -1, "output_score", g->v_score, h, -1, -1, score_head);
        }
    } else {
        int head_in = h, logit_rows = rows;
        if (!all_logits && rows > 1) {
            head_in = value(&b, 1, c->dim, "h_last");
            op(&b, Q3_OP_LAST_ROW, -1, "last_row", head_in, h, -1, -1, NULL);
            logit_rows = 1;
        }
        g->v_logits = value(&b, logit_rows, c->vocab_size, "logits");
        op(&b, Q3_OP_MATMUL, -1, "output", g->v_logits, head_in, -1, -1, m->w.lm_head);
    }
    if (b.oom) {
        q3_graph_free(g);
        return q3_fail(Q3_ERR_NOMEM, "out of memory building a graph");
    }
    return Q3_OK;
}

q3_status q3_graph_build_prefill(const q3_model *m, int rows, bool all_logits, q3_graph *g)
{
    return build(m, Q3_GRAPH_PREFILL, rows, all_logits, NULL, g);
}

q3_status q3_graph_build_decode(const q3_model *m, int rows, q3_graph *g)
{
    return build(m, Q3_GRAPH_DECODE, rows, true, NULL, g);
}

q3_status q3_graph_build_embed(const q3_model *m, int rows, const q3_tensor *score_head, q3_graph *g)
{
    if (score_head && (score_head->ndim != 2 || score_head->shape[0] != 2 || score_head->shape[1] != m->cfg.dim))
        return q3_fail(Q3_ERR_INVALID, "a score head must be [2][%d]", m->cfg.dim);
    return build(m, Q3_GRAPH_EMBED, rows, true, score_head, g);
}

void q3_graph_free(q3_graph *g)
{
    free(g->ops);
    free(g->values);
    free(g->v_k);
    free(g->v_v);
    memset(g, 0, sizeof *g);
}

double q3_graph_flops(const q3_graph *g, int n_real, int pos)
{
    const q3_config *c = g->cfg;
    double f = 0;
    for (int i = 0; i < g->n_ops; i++) {
        const q3_op *o = &g->ops[i];
        const q3_value *out = o->out >= 0 ? &g->values[o->out] : NULL;
        if (o->kind == Q3_OP_MATMUL) {
            int r = out->rows == 1 ? 1 : n_real;
            f += 2.0 * r * (double)o->weight->shape[0] * (double)o->weight->shape[1];
        } else if (o->kind == Q3_OP_MATMUL_ID) { /* k chosen matrices a row */
            int r = out->rows == 1 ? 1 : n_real;
            f += 2.0 * r * g->values[o->in[1]].cols * (double)o->weight->shape[1] * (double)o->weight->shape[2];
        } else if (o->kind == Q3_OP_ATTENTION) {
            /* QK^T and PV: each row r attends to pos + r + 1 keys */
            double keys = (double)n_real * pos + (double)n_real * (n_real + 1) / 2.0;
            f += 4.0 * keys * c->n_heads * c->head_dim;
        }
    }
    return f;
}
