#include "model/layout.h"

#include <stdio.h>

#include "model/model.h"

const q3_tensor_layout q3_layer_layout[Q3_LAYER_TENSORS] = {
    {"input_layernorm.weight", "attn_norm", Q3_DIM_MODEL, Q3_DIM_NONE, Q3_DIM_NONE},
    {"self_attn.q_proj.weight", "attn_q", Q3_DIM_Q, Q3_DIM_MODEL, Q3_DIM_NONE},
    {"self_attn.k_proj.weight", "attn_k", Q3_DIM_KV, Q3_DIM_MODEL, Q3_DIM_NONE},
    {"self_attn.v_proj.weight", "attn_v", Q3_DIM_KV, Q3_DIM_MODEL, Q3_DIM_NONE},
    {"self_attn.o_proj.weight", "attn_output", Q3_DIM_MODEL, Q3_DIM_Q, Q3_DIM_NONE},
    {"self_attn.q_norm.weight", "attn_q_norm", Q3_DIM_HEAD, Q3_DIM_NONE, Q3_DIM_NONE},
    {"self_attn.k_norm.weight", "attn_k_norm", Q3_DIM_HEAD, Q3_DIM_NONE, Q3_DIM_NONE},
    {"post_attention_layernorm.weight", "ffn_norm", Q3_DIM_MODEL, Q3_DIM_NONE, Q3_DIM_NONE},
    {"mlp.gate_proj.weight", "ffn_gate", Q3_DIM_FFN, Q3_DIM_MODEL, Q3_DIM_NONE},
    {"mlp.up_proj.weight", "ffn_up", Q3_DIM_FFN, Q3_DIM_MODEL, Q3_DIM_NONE},
    {"mlp.down_proj.weight", "ffn_down", Q3_DIM_MODEL, Q3_DIM_FFN, Q3_DIM_NONE},
};

const q3_tensor_layout q3_moe_layout[Q3_MOE_TENSORS] = {
    {"mlp.gate.weight", "ffn_gate_inp", Q3_DIM_EXPERTS, Q3_DIM_MODEL, Q3_DIM_NONE},
    {"mlp.experts.%d.gate_proj.weight", "ffn_gate_exps", Q3_DIM_EXPERT_FFN, Q3_DIM_MODEL, Q3_DIM_EXPERTS},
    {"mlp.experts.%d.up_proj.weight", "ffn_up_exps", Q3_DIM_EXPERT_FFN, Q3_DIM_MODEL, Q3_DIM_EXPERTS},
    {"mlp.experts.%d.down_proj.weight", "ffn_down_exps", Q3_DIM_MODEL, Q3_DIM_EXPERT_FFN, Q3_DIM_EXPERTS},
};

_Static_assert(sizeof(q3_layer_weights) == (Q3_LAYER_TENSORS + Q3_MOE_TENSORS) * sizeof(const q3_tensor *),
               "one layout entry per field of q3_layer_weights, in order");

int q3_layer_tensors(const q3_config *c, const q3_tensor_layout **out, int *fields)
{
    int n = 0, dense_n = q3_config_is_moe(c) ? Q3_LAYER_ATTN_TENSORS : Q3_LAYER_TENSORS;
    for (int i = 0; i < dense_n; i++, n++) out[n] = &q3_layer_layout[i], fields[n] = i;
    if (q3_config_is_moe(c))
        for (int i = 0; i < Q3_MOE_TENSORS; i++, n++) out[n] = &q3_moe_layout[i], fields[n] = Q3_LAYER_TENSORS + i;
    return n;
}

const q3_tensor_layout q3_embed_layout = {"model.embed_tokens.weight", "token_embd.weight", Q3_DIM_VOCAB, Q3_DIM_MODEL, Q3_DIM_NONE};
const q3_tensor_layout q3_out_norm_layout = {"model.norm.weight", "output_norm.weight", Q3_DIM_MODEL, Q3_DIM_NONE, Q3_DIM_NONE};
const q3_tensor_layout q3_lm_head_layout = {"lm_head.weight", "output.weight", Q3_DIM_VOCAB, Q3_DIM_MODEL, Q3_DIM_NONE};

int64_t q3_dim_size(const q3_config *c, q3_dim d)
{
    switch (d) {
    case Q3_DIM_MODEL: return c->dim;
    case Q3_DIM_Q: return (int64_t)c->n_heads * c->head_dim;
    case Q3_DIM_KV: return (int64_t)c->n_kv_heads * c->head_dim;
    case Q3_DIM_HEAD: return c->head_dim;
    case Q3_DIM_FFN: return c->ffn_dim;
    case Q3_DIM_VOCAB: return c->vocab_size;
    case Q3_DIM_EXPERTS: return c->n_experts;
    case Q3_DIM_EXPERT_FFN: return c->expert_ffn_dim;
    case Q3_DIM_NONE: break;
    }
    return 0;
}

int q3_layout_shape(const q3_tensor_layout *t, const q3_config *c, int64_t shape[3])
{
    int n = 0;
    if (t->stack != Q3_DIM_NONE) shape[n++] = q3_dim_size(c, t->stack);
    shape[n++] = q3_dim_size(c, t->rows);
    if (t->cols != Q3_DIM_NONE) shape[n++] = q3_dim_size(c, t->cols);
    return n;
}

void q3_layout_name(const q3_tensor_layout *t, int l, int e, int gguf, char *out, size_t n)
{
    if (gguf) {
        snprintf(out, n, "blk.%d.%s.weight", l, t->gguf);
        return;
    }
    int k = snprintf(out, n, "model.layers.%d.", l);
    if (k < 0 || (size_t)k >= n) return;
    if (t->stack != Q3_DIM_NONE) snprintf(out + k, n - (size_t)k, t->hf, e); /* "mlp.experts.%d..." */
    else snprintf(out + k, n - (size_t)k, "%s", t->hf);
}

void q3_layer_tensor_name(int l, size_t i, int gguf, char *out, size_t n)
{
    q3_layout_name(&q3_layer_layout[i], l, 0, gguf, out, n);
}
