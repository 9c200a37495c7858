/* The op IR: a graph is a list of explicit ops over f32 activation buffers
 * ("values") with static shapes, built once for a config and a row count.
 * The graph layer knows no kernels: backends run ops (src/backend/). */
#ifndef Q3_GRAPH_GRAPH_H
#define Q3_GRAPH_GRAPH_H

#include <stdbool.h>
#include "model/model.h"

typedef enum q3_op_kind {
    Q3_OP_EMBED,     /* out[r] = weight[tokens[r]]                        (rows, dim) */
    Q3_OP_RMSNORM,   /* out[r] = in0[r] * rsqrt(mean(in0[r]^2) + eps) * weight      */
    Q3_OP_HEAD_NORM, /* the same per head of head_dim, in place (out == in0)         */
    Q3_OP_ROPE,      /* rotate_half RoPE of each head of row r at position pos[r], in place */
    Q3_OP_MATMUL,    /* out[r][o] = sum_i in0[r][i] * weight[o][i]                   */
    Q3_OP_KV_APPEND, /* row r's sequence's cache at pos[r] gets in0 (K), in1 (V): MUTATES STATE */
    Q3_OP_ATTENTION, /* causal GQA attention of in0 (Q): in prefill over the sequence's
                        cached past [0, pos[0]) and the chunk's own K/V in1, in2
                        (rows 0..r); in decode (in1 = in2 = -1) row r over its own
                        sequence's cache [0, pos[r]]; in an embed graph (reads_state
                        false: no cache at all) row r over the rows of its own packed
                        input, chunk rows [r - pos[r], r] of in1, in2               */
    Q3_OP_ADD,       /* out = in0 + in1 (out may be in0: the residual stream)        */
    Q3_OP_SWIGLU,    /* out = silu(in0) * in1 (out may be in0)                        */
    Q3_OP_LAST_ROW,  /* out[0] = in0[n_real - 1]: only the last row needs logits      */
    Q3_OP_MATMUL_ID, /* the indexed matmul (mixture-of-experts layers): weight stacks
                        n_mat matrices [n_mat][n_out][n_in]; in1 = ids [rows][k] (each
                        an integer in [0, n_mat), held exactly as a float); in0 = x,
                        [rows][n_in] (one input for every slot) or [rows][k * n_in]
                        (slot j's input at column j * n_in); in2 = optional slot
                        weights [rows][k] (-1: none); out [rows][k * n_out]:
                          out[r][j*n_out + o] = (w[r][j] *) sum_i x_rj[i] * weight[ids[r][j]][o][i]
                        each value by the plain MATMUL's own operation sequence on
                        matrix ids[r][j] (times w[r][j], one float multiply), so a row's
                        outputs are bit for bit what MATMUL on that matrix gives it,
                        whatever the batch; an id out of range fails the run
                        (Q3_ERR_INVALID), never reads outside the weight          */
    Q3_OP_MOE_ROUTE, /* a mixture-of-experts router's choice: in0 = the router's logits
                        [rows][n_experts]; out = ids [rows][k] (the k largest logits,
                        largest first, ties to the lower expert index, as floats),
                        out2 = their weights [rows][k]: the softmax over all experts
                        of the chosen ones, divided by their sum when the config's
                        norm_topk_prob is set; computed in double, rounded once      */
    Q3_OP_MOE_SUM,   /* out[r][i] = sum over slots j = 0..k-1, in order, of
                        in0[r][j * cols + i]: the chosen experts' (weighted) outputs  */
    Q3_OP_KIND_COUNT
} q3_op_kind;

const char *q3_op_kind_name(q3_op_kind k);

typedef struct q3_value {
    char name[32];   /* e.g. "x", "blk.3.k" */
    int rows, cols;  /* f32 [rows][cols], rows = the graph's S (or 1) */
} q3_value;

typedef struct q3_op {
    q3_op_kind kind;
    char name[48];            /* e.g. "blk.3.attn_q", "output", "token_embd" */
    int layer;                /* -1 outside the layers */
    int out;                  /* value id written */
    int out2;                 /* a second value written (MOE_ROUTE's weights), else -1 */
    int in[3];                /* value ids read, -1 = none */
    const q3_tensor *weight;  /* EMBED, RMSNORM, HEAD_NORM, MATMUL, MATMUL_ID; else NULL */
    bool mutates_state;       /* writes state that outlives the graph (KV_APPEND) */
    bool reads_state;         /* reads the session's KV cache (ATTENTION) */
} q3_op;

/* EMBED: prefill-only, for embeddings and reranker scores. Many inputs packed
 * into one run, each row at its position within its own input (pos[r] == 0
 * starts an input), attending only to its own input; no cache is read or
 * written (no K/V outlives the run). */
typedef enum q3_graph_kind { Q3_GRAPH_PREFILL, Q3_GRAPH_DECODE, Q3_GRAPH_EMBED } q3_graph_kind;

typedef struct q3_graph {
    q3_graph_kind kind;
    const q3_model *model;
    const q3_config *cfg;
    int rows;                 /* static rows per run: S (prefill), sequences at once (decode) */
    bool all_logits;          /* logits for every row instead of the last real one */
    q3_op *ops;               /* [n_ops] in execution order */
    int n_ops;
    q3_value *values;         /* [n_values] */
    int n_values;
    int v_logits;             /* output: [1 or rows][vocab] (-1 in an embed graph) */
    int v_hidden;             /* embed: output [rows][dim], the final-norm hidden state of every row */
    int v_score;              /* embed with a score head: output [rows][2], the two logits, else -1 */
    int *v_k, *v_v;           /* prefill outputs: [n_layers] value ids of the chunk's K/V */
} q3_graph;

/* Builds the prefill graph for chunks of `rows` tokens: stateless (reads the
 * past K/V, outputs the chunk's K/V and the logits). */
q3_status q3_graph_build_prefill(const q3_model *m, int rows, bool all_logits, q3_graph *g);
/* Builds the decode graph for up to `rows` sequences, one token each: every
 * row appends its K/V to its own sequence's cache in-graph, attends over
 * that cache alone, and gets logits. */
q3_status q3_graph_build_decode(const q3_model *m, int rows, q3_graph *g);
/* Builds the embed graph for runs of up to `rows` packed tokens: every row's
 * final-norm hidden state (v_hidden), and with score_head (a [2][dim] weight:
 * two rows of the LM head) two logits per row (v_score) instead of the whole
 * LM head. score_head must outlive the graph. */
q3_status q3_graph_build_embed(const q3_model *m, int rows, const q3_tensor *score_head, q3_graph *g);
void q3_graph_free(q3_graph *g);

/* FLOPs of one run with n_real rows at position pos (multiply-adds count 2). */
double q3_graph_flops(const q3_graph *g, int n_real, int pos);

#endif
