/* The tensors of a Qwen3 checkpoint, in one table: for each weight, its name in
 * a Hugging Face folder and in a GGUF file, and its shape from the config. The
 * loaders (model.c, model_gguf.c), the GGUF converter and the synthetic
 * checkpoint writer all read this table, so the names are written once.
 *
 * Per layer N the Hugging Face name is "model.layers.N." + hf and the GGUF
 * name "blk.N." + gguf + ".weight"; the whole-model tensors are named in full. */
#ifndef Q3_MODEL_LAYOUT_H
#define Q3_MODEL_LAYOUT_H

#include <stddef.h>
#include <stdint.h>

#include "model/config.h"

/* A dimension of a weight, in terms of the config. */
typedef enum q3_dim {
    Q3_DIM_NONE,  /* the second dimension of a vector */
    Q3_DIM_MODEL, /* hidden_size */
    Q3_DIM_Q,     /* num_attention_heads * head_dim */
    Q3_DIM_KV,    /* num_key_value_heads * head_dim */
    Q3_DIM_HEAD,  /* head_dim */
    Q3_DIM_FFN,   /* intermediate_size */
    Q3_DIM_VOCAB, /* vocab_size */
    Q3_DIM_EXPERTS,    /* num_experts */
    Q3_DIM_EXPERT_FFN, /* moe_intermediate_size */
} q3_dim;

typedef struct q3_tensor_layout {
    const char *hf, *gguf;
    q3_dim rows, cols; /* cols == Q3_DIM_NONE: a vector (a norm's weight) */
    q3_dim stack;      /* Q3_DIM_EXPERTS: one matrix per expert, [n_experts][rows][cols]
                          (GGUF: one 3-D tensor; Hugging Face: hf is a format with the
                          expert's index, one tensor each); else Q3_DIM_NONE */
} q3_tensor_layout;

/* The 11 weights of a dense layer, in the order of the first fields of
 * q3_layer_weights: the first Q3_LAYER_ATTN_TENSORS (attention and the two
 * norms) are in every layer, the last three (the MLP) in dense layers only. */
#define Q3_LAYER_TENSORS 11
#define Q3_LAYER_ATTN_TENSORS 8
extern const q3_tensor_layout q3_layer_layout[Q3_LAYER_TENSORS];

/* The 4 weights of a mixture-of-experts layer's MLP, in the order of the
 * fields router, exp_gate, exp_up, exp_down of q3_layer_weights. */
#define Q3_MOE_TENSORS 4
extern const q3_tensor_layout q3_moe_layout[Q3_MOE_TENSORS];

/* The weights of one layer under c: n (8 + 3 or 8 + 4) pointers to layouts,
 * into out, each with the index of its field in q3_layer_weights (fields). */
int q3_layer_tensors(const q3_config *c, const q3_tensor_layout **out, int *fields);

/* The whole-model weights. The LM head is absent when the embeddings are tied. */
extern const q3_tensor_layout q3_embed_layout, q3_out_norm_layout, q3_lm_head_layout;

/* The size of d under c (0 for Q3_DIM_NONE). */
int64_t q3_dim_size(const q3_config *c, q3_dim d);

/* ndim (1, 2, or 3 for a stack) and shape of a weight under c. */
int q3_layout_shape(const q3_tensor_layout *t, const q3_config *c, int64_t shape[3]);

/* The full name of layer weight i of layer l, into out: Hugging Face's (gguf == 0) or GGUF's. */
void q3_layer_tensor_name(int l, size_t i, int gguf, char *out, size_t n);
/* The full name of weight t of layer l: GGUF's (gguf != 0), or Hugging
 * Face's, which for a stack names expert e's own matrix. */
void q3_layout_name(const q3_tensor_layout *t, int l, int e, int gguf, char *out, size_t n);

#endif
