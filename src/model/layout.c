#include "model/layout.h"

#include <stdio.h>

#include "model/model.h"

const q3_tensor_layout q3_layer_layout[Q3_LAYER_TENSORS] = {
    {"input_layernorm.weight", "attn_norm", Q3_DIM_MODEL, Q3_DIM_NONE},
    {"self_attn.q_proj.weight", "attn_q", Q3_DIM_Q, Q3_DIM_MODEL},
    {"self_attn.k_proj.weight", "attn_k", Q3_DIM_KV, Q3_DIM_MODEL},
    {"self_attn.v_proj.weight", "attn_v", Q3_DIM_KV, Q3_DIM_MODEL},
    {"self_attn.o_proj.weight", "attn_output", Q3_DIM_MODEL, Q3_DIM_Q},
    {"self_attn.q_norm.weight", "attn_q_norm", Q3_DIM_HEAD, Q3_DIM_NONE},
    {"self_attn.k_norm.weight", "attn_k_norm", Q3_DIM_HEAD, Q3_DIM_NONE},
    {"post_attention_layernorm.weight", "ffn_norm", Q3_DIM_MODEL, Q3_DIM_NONE},
    {"mlp.gate_proj.weight", "ffn_gate", Q3_DIM_FFN, Q3_DIM_MODEL},
    {"mlp.up_proj.weight", "ffn_up", Q3_DIM_FFN, Q3_DIM_MODEL},
    {"mlp.down_proj.weight", "ffn_down", Q3_DIM_MODEL, Q3_DIM_FFN},
};

_Static_assert(sizeof(q3_layer_weights) == Q3_LAYER_TENSORS * sizeof(const q3_tensor *),
               "one layout entry per field of q3_layer_weights, in order");

const q3_tensor_layout q3_embed_layout = {"model.embed_tokens.weight", "token_embd.weight", Q3_DIM_VOCAB, Q3_DIM_MODEL};
const q3_tensor_layout q3_out_norm_layout = {"model.norm.weight", "output_norm.weight", Q3_DIM_MODEL, Q3_DIM_NONE};
const q3_tensor_layout q3_lm_head_layout = {"lm_head.weight", "output.weight", Q3_DIM_VOCAB, Q3_DIM_MODEL};

int64_t q3_dim_size(const q3_config *c, q3_dim d)
{
    switch (d) {
    case Q3_DIM_MODEL: return c->dim;
    case Q3_DIM_Q: return (int64_t)c->n_heads * c->head_dim;
    case Q3_DIM_KV: return (int64_t)c->n_kv_heads * c->head_dim;
    case Q3_DIM_HEAD: return c->head_dim;
    case Q3_DIM_FFN: return c->ffn_dim;
    case Q3_DIM_VOCAB: return c->vocab_size;
    case Q3_DIM_NONE: break;
    }
    return 0;
}

int q3_layout_shape(const q3_tensor_layout *t, const q3_config *c, int64_t shape[2])
{
    shape[0] = q3_dim_size(c, t->rows);
    shape[1] = q3_dim_size(c, t->cols);
    return t->cols == Q3_DIM_NONE ? 1 : 2;
}

void q3_layer_tensor_name(int l, size_t i, int gguf, char *out, size_t n)
{
    if (gguf) snprintf(out, n, "blk.%d.%s.weight", l, q3_layer_layout[i].gguf);
    else snprintf(out, n, "model.layers.%d.%s", l, q3_layer_layout[i].hf);
}
