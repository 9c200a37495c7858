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
} q3_dim;

typedef struct q3_tensor_layout {
    const char *hf, *gguf;
    q3_dim rows, cols; /* cols == Q3_DIM_NONE: a vector (a norm's weight) */
} q3_tensor_layout;

/* The 11 weights of a layer, in the order of the fields of q3_layer_weights. */
#define Q3_LAYER_TENSORS 11
extern const q3_tensor_layout q3_layer_layout[Q3_LAYER_TENSORS];

/* The whole-model weights. The LM head is absent when the embeddings are tied. */
extern const q3_tensor_layout q3_embed_layout, q3_out_norm_layout, q3_lm_head_layout;

/* The size of d under c (0 for Q3_DIM_NONE). */
int64_t q3_dim_size(const q3_config *c, q3_dim d);

/* ndim (1 or 2) and shape of a weight under c. */
int q3_layout_shape(const q3_tensor_layout *t, const q3_config *c, int64_t shape[2]);

/* The full name of layer weight i of layer l, into out: Hugging Face's (gguf == 0) or GGUF's. */
void q3_layer_tensor_name(int l, size_t i, int gguf, char *out, size_t n);

#endif
