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
} q3_layer_weights;

typedef struct q3_weights {
    const q3_tensor *embed;     /* [vocab][dim]                   embed_tokens */
    const q3_tensor *out_norm;  /* [dim]                          model.norm */
    const q3_tensor *lm_head;   /* [vocab][dim]                   == embed when tied */
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
};

/* Looks a weight up by name across the shards and checks its dtype family
 * (float for norms) and exact shape; the message names the tensor, what was
 * expected and what was found. */
q3_status q3_model_bind_tensor(const char *source, const q3_tensor *t, const char *name, int ndim,
                               const int64_t *shape, const q3_tensor **out);

/* Total bytes and parameters of the bound weights (lm_head counted once when tied). */
size_t q3_model_weight_bytes(const q3_model *m);
size_t q3_model_param_count(const q3_model *m);

#endif
