/* The hyper-parameters of a dense Qwen3 model, from config.json or GGUF metadata. */
#ifndef Q3_MODEL_CONFIG_H
#define Q3_MODEL_CONFIG_H

#include <stdbool.h>
#include "q3.h"

typedef struct q3_config {
    int n_layers;          /* num_hidden_layers */
    int dim;               /* hidden_size */
    int ffn_dim;           /* intermediate_size */
    int n_heads;           /* num_attention_heads */
    int n_kv_heads;        /* num_key_value_heads (divides n_heads) */
    int head_dim;          /* head_dim (n_heads * head_dim may differ from dim) */
    int vocab_size;        /* vocab_size */
    int max_seq_len;       /* max_position_embeddings */
    float rms_eps;         /* rms_norm_eps */
    float rope_theta;      /* rope_theta */
    bool tied_embeddings;  /* tie_word_embeddings: no lm_head, the embedding is reused */
    char torch_dtype[16];  /* "bfloat16", "float32", ... as the file says */
} q3_config;

/* Parses and validates a config.json; `path` names the file in messages. */
q3_status q3_config_parse_json(const char *text, const char *path, q3_config *out);
q3_status q3_config_load(const char *path, q3_config *out);
/* Checks ranges and relations (heads divisible by KV heads, ...). */
q3_status q3_config_validate(const q3_config *c, const char *source);

#endif
