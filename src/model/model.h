/* A loaded Qwen3 model: its config and its weights, viewed in mapped files. */
#ifndef Q3_MODEL_MODEL_H
#define Q3_MODEL_MODEL_H

#include "model/config.h"
#include "model/safetensors.h"
#include "model/tensor.h"

typedef struct q3_layer_weights {
    const q3_tensor *attn_norm; /* [dim]                         input_layernorm */
    const q3_tensor *wq;        /* [n_heads*head_dim][dim]        q_proj */
    const q3_tensor *wk;        /* [n_kv_heads*head_dim][dim]     k_proj */
    const q3_tensor *wv;        /* [n_kv_heads*head_dim][dim]     v_proj */
    const q3_tensor *wo;        /* [dim][n_heads*head_dim]        o_proj */
    const q3_tensor *q_norm;    /* [head_dim]                     per-head RMSNorm before RoPE */
    const q3_tensor *k_norm;    /* [head_dim] */
    const q3_tensor *ffn_norm;  /* [dim]                          post_attention_layernorm */
    const q3_tensor *w_gate;    /* [ffn_dim][dim]                 gate_proj */
    const q3_tensor *w_up;      /* [ffn_dim][dim]                 up_proj */
    const q3_tensor *w_down;    /* [dim][ffn_dim]                 down_proj */
    /* a mixture-of-experts layer instead of the three above (NULL in a dense model) */
    const q3_tensor *router;    /* [n_experts][dim]               mlp.gate */
    const q3_tensor *exp_gate;  /* [n_experts][expert_ffn][dim]   mlp.experts.E.gate_proj, stacked */
    const q3_tensor *exp_up;    /* [n_experts][expert_ffn][dim]   mlp.experts.E.up_proj, stacked */
    const q3_tensor *exp_down;  /* [n_experts][dim][expert_ffn]   mlp.experts.E.down_proj, stacked */
} q3_layer_weights;

typedef struct q3_weights {
    const q3_tensor *embed;     /* [vocab][dim]                   embed_tokens */
    const q3_tensor *out_norm;  /* [dim]                          model.norm */
    const q3_tensor *lm_head;   /* [vocab][dim]                   == embed when tied */
    const q3_tensor *cls_out;   /* [2][dim] a reranker's classifier head (GGUF cls.output.weight: the LM
                                   head rows of "yes" and "no", as llama.cpp's converter writes them), or NULL */
    q3_layer_weights *layers;   /* [n_layers] */
} q3_weights;

typedef struct q3_model q3_model; /* opaque in include/q3.h */
struct q3_model {
    q3_config cfg;
    q3_weights w;
    char *path;                 /* the folder or file it was opened from */
    q3_safetensors *files;      /* [n_files] mapped shards */
    int n_files;
    struct q3_weight_map_entry *weight_map; /* [n_weight_map] sorted by tensor name: the shard the
                                            index's weight_map names for each tensor (NULL: no index) */
    size_t n_weight_map;
    void *gguf;                 /* an open q3_gguf when loaded from GGUF */
    q3_tensor *stacks;          /* [n_layers][3] a MoE model's expert stacks (gate, up, down), each with
                                   mats set: views into a GGUF's 3-D tensor, or the folder's per-expert
                                   tensors (then data is NULL) */
    void *stack_mem;            /* the matrices' views and pointer arrays */
};

/* Looks a weight up by name across the shards and checks its dtype family
 * (float for norms) and exact shape; the message names the tensor, what was
 * expected and what was found. */
q3_status q3_model_bind_tensor(const char *source, const q3_tensor *t, const char *name, int ndim,
                               const int64_t *shape, const q3_tensor **out);

/* Sets stack->mats to views of its n_mat contiguous matrices ([n_mat][rows][cols]
 * at stack->data), made in *mem (the caller frees it after the stack). */
q3_status q3_tensor_stack_views(q3_tensor *stack, void **mem);
/* The same into the caller's views[n_mat] and ptrs[n_mat]. */
void q3_tensor_stack_fill(q3_tensor *stack, q3_tensor *views, const q3_tensor **ptrs);
/* The loaders' expert stacks: m->stacks and their views for a MoE config, and
 * stack s (0 gate, 1 up, 2 down) of layer l with its views and pointers. */
q3_status q3_model_alloc_stacks(q3_model *m);
q3_tensor *q3_model_stack_slot(q3_model *m, int l, int s, q3_tensor **views, const q3_tensor ***ptrs);

/* Total bytes and parameters of the bound weights (lm_head counted once when tied). */
size_t q3_model_weight_bytes(const q3_model *m);
size_t q3_model_param_count(const q3_model *m);
/* Bytes and parameters one token reads: every weight but the experts, and
 * n_experts_used of each layer's experts (the embedding counted as one row).
 * Equal to the totals, less the embedding's other rows, for a dense model. */
size_t q3_model_active_bytes(const q3_model *m);
size_t q3_model_active_params(const q3_model *m);

#endif
