/* The hyper-parameters of a Qwen3 model (dense, or mixture-of-experts), from
 * config.json or GGUF metadata. */
#ifndef Q3_MODEL_CONFIG_H
#define Q3_MODEL_CONFIG_H

#include <stdbool.h>
#include "util/status.h"

typedef enum q3_rope_type { Q3_ROPE_NONE = 0, Q3_ROPE_YARN = 1 } q3_rope_type;

/* RoPE scaling (config.json "rope_scaling", GGUF qwen3.rope.scaling.*); see
 * model/rope.h for the formulas. Every member is 4 bytes: no padding, so two
 * can be compared with memcmp. */
typedef struct q3_rope_scaling {
    int type;              /* q3_rope_type */
    float factor;          /* YaRN: the context scale s (>= 1) */
    int orig_ctx;          /* YaRN: original_max_position_embeddings */
    float beta_fast;       /* YaRN: 32 unless given */
    float beta_slow;       /* YaRN: 1 unless given */
    float attn_factor;     /* YaRN: cos/sin scale if given, else 0 (computed from s) */
    float mscale;          /* YaRN: mscale, 0 if not given */
    float mscale_all_dim;  /* YaRN: mscale_all_dim, 0 if not given */
    int truncate;          /* YaRN: floor/ceil the correction range (default 1) */
} q3_rope_scaling;

typedef struct q3_config {
    int n_layers;          /* num_hidden_layers */
    int dim;               /* hidden_size */
    int ffn_dim;           /* intermediate_size (a dense layer's MLP; unused by a MoE model) */
    int n_heads;           /* num_attention_heads */
    int n_kv_heads;        /* num_key_value_heads (divides n_heads) */
    int head_dim;          /* head_dim (n_heads * head_dim may differ from dim) */
    int vocab_size;        /* vocab_size */
    int max_seq_len;       /* max_position_embeddings */
    float rms_eps;         /* rms_norm_eps */
    float rope_theta;      /* rope_theta */
    q3_rope_scaling rope_scaling; /* rope_scaling (all zero: none) */
    bool tied_embeddings;  /* tie_word_embeddings: no lm_head, the embedding is reused */
    char torch_dtype[16];  /* "bfloat16", "float32", ... as the file says */
    /* Mixture of experts (Qwen3MoeForCausalLM, GGUF "qwen3moe"): every layer's
       MLP is a router and n_experts experts, n_experts_used of them per token.
       n_experts == 0: a dense model. */
    int n_experts;         /* num_experts */
    int n_experts_used;    /* num_experts_per_tok */
    int expert_ffn_dim;    /* moe_intermediate_size */
    bool norm_topk_prob;   /* the chosen experts' weights divided by their sum */
    /* What the checkpoint is for, in llama.cpp's pooling-type numbers (GGUF
       <arch>.pooling_type; a folder's markers, model/task.c): 0 a generator,
       3 (last token) an embedding model, 4 (rank) a reranker. */
    int pooling;
} q3_config;

enum { Q3_POOLING_NONE = 0, Q3_POOLING_LAST = 3, Q3_POOLING_RANK = 4 };

/* A mixture-of-experts model. */
static inline bool q3_config_is_moe(const q3_config *c) { return c->n_experts > 0; }

/* Parses and validates a config.json; `path` names the file in messages. */
q3_status q3_config_parse_json(const char *text, const char *path, q3_config *out);
q3_status q3_config_load(const char *path, q3_config *out);
/* Checks ranges and relations (heads divisible by KV heads, ...). */
q3_status q3_config_validate(const q3_config *c, const char *source);

#endif
