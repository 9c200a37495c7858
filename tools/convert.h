/* Converting a model to a GGUF file that llama.cpp and q3 load (arch qwen3, or qwen3moe
 * for a mixture of experts),
 * and measuring what quantization costs in accuracy.
 *
 * What is written, in order (as llama.cpp's convert_hf_to_gguf.py writes Qwen3):
 *   general.architecture "qwen3", general.type "model", general.name
 *   qwen3.context_length, embedding_length, block_count, feed_forward_length,
 *         attention.head_count, attention.head_count_kv, attention.key_length,
 *         attention.value_length, rope.freq_base, attention.layer_norm_rms_epsilon
 *   general.file_type (llama_ftype: 0 F32, 1 F16, 32 BF16, 7 Q8_0, 2 Q4_0, 14/15 Q4_K_S/M,
 *         16/17 Q5_K_S/M, 18 Q6_K),
 *   general.quantization_version 2
 *   tokenizer.ggml.model "gpt2", .pre "qwen2", .tokens (byte-level strings by id, added
 *         tokens as their text, ids without a token as "[PAD<id>]"), .token_type (1 normal,
 *         3 control = a special added token, 4 user-defined = a non-special added token,
 *         5 unused = padding), .merges ("left right"), .bos/.eos/.padding_token_id,
 *         .add_bos_token, tokenizer.chat_template (when the folder has one)
 *   tensors with llama.cpp's names: token_embd, blk.N.{attn_norm, attn_q, attn_k, attn_v,
 *         attn_output, attn_q_norm, attn_k_norm, ffn_norm, ffn_gate, ffn_up, ffn_down},
 *         output_norm, output (only when the embeddings are not tied); ".weight" each.
 *   A mixture of experts (qwen3moe): qwen3moe.* keys, with expert_feed_forward_length,
 *         expert_count and expert_used_count after feed_forward_length; each layer has
 *         blk.N.ffn_gate_inp (the router, [n_experts][hidden], F32 in every type, as
 *         llama.cpp's converter keeps it and llama-quantize leaves it) and the experts
 *         stacked as blk.N.ffn_{gate,up,down}_exps, 3-D tensors in llama.cpp's layout
 *         (GGUF ne = [cols, rows, n_experts], expert-major data) instead of ffn_gate/up/down.
 * Norms (1-D) are F32. With F32, F16, BF16, Q8_0 or Q4_0 every 2-D weight is in that
 * type, except that a matrix whose rows are not whole 32-value blocks stays F16 when
 * Q8_0/Q4_0 is asked for (as llama.cpp's converter falls back). With Q4_K, Q5_K or Q6_K
 * the 2-D weights follow llama-quantize's mixes (Q4_K_M, Q4_K_S, Q5_K_M, Q5_K_S, Q6_K;
 * no importance matrix), tensor for tensor, as q3_convert_pick_type says. Every quantizer
 * comes from src/model/quantize.h, so the tensors are the bytes llama.cpp's quantizer makes
 * from the same F32 values. */
#ifndef Q3_MODEL_CONVERT_H
#define Q3_MODEL_CONVERT_H

#include <stddef.h>
#include <stdint.h>

#include "model/dtype.h"
#include "model/gguf.h"
#include "tools/gguf_write.h"
#include "model/layout.h"
#include "model/model.h"
#include "q3.h"

/* Which of llama-quantize's mixes a Q4_K or Q5_K file follows (its plain Q4_K and Q5_K
 * are the _M mixes). */
typedef enum q3_kmix {
    Q3_KMIX_M = 0, /* Q6_K for attn_v and ffn_down in the "more bits" layers */
    Q3_KMIX_S,     /* Q4_K_S: Q5_K for attn_v of layers 0-3 and ffn_down of the first eighth;
                      Q5_K_S: Q5_K throughout */
} q3_kmix;

typedef struct q3_convert_opts {
    q3_dtype type;             /* type of the 2-D weights: F32, F16, BF16, Q8_0 or Q4_0; or the
                                  base type of a K-quant mix: Q4_K, Q5_K or Q6_K */
    q3_kmix kmix;              /* with Q4_K or Q5_K: the mix (default: _M) */
    const char *tokenizer_dir; /* a folder with tokenizer.json (+ tokenizer_config.json); NULL:
                                  the model's own (its folder, or the source GGUF's metadata) */
    int no_tokenizer;          /* write tokenizer.ggml.model "none" and no vocabulary (a model
                                  without a tokenizer, for tests and accuracy runs) */
    const char *name;          /* general.name; NULL: the source's base name */
    q3_gguf_progress_fn progress; /* called after each tensor (may be NULL) */
    void *user;
} q3_convert_opts;

/* The llama_ftype code of general.file_type for a weight type (and mix, for Q4_K/Q5_K):
 * 0 F32, 1 F16, 2 Q4_0, 7 Q8_0, 14/15 Q4_K_S/M, 16/17 Q5_K_S/M, 18 Q6_K, 32 BF16. */
uint32_t q3_convert_file_type(q3_dtype t, q3_kmix mix);

/* Parses a --type name: f32, f16, bf16, q8_0, q4_0, q4_k_m, q4_k_s, q5_k_m, q5_k_s, q6_k,
 * and q4_k / q5_k (llama-quantize's aliases of the _M mixes); any case. Returns 0, or -1
 * for an unknown name. */
int q3_convert_parse_type(const char *name, q3_dtype *type, q3_kmix *mix);

/* The name of a file type as --type spells it ("q4_k_m", "q6_k", "q8_0", "bf16"). */
const char *q3_convert_type_name(q3_dtype t, q3_kmix mix);

/* The type a tensor of this shape is stored in when the plain type `want` (F32, F16,
 * BF16, Q8_0 or Q4_0) is asked for. */
q3_dtype q3_convert_tensor_type(q3_dtype want, int ndim, const int64_t *shape);

/* The type q3 convert stores tensor `name` (a GGUF name: token_embd.weight, output.weight,
 * blk.N.attn_v.weight, ...) of the given shape in, for a model of config c whose output
 * matrix is the embedding (tied) or not. For the plain types, q3_convert_tensor_type.
 * For the K-quant mixes, llama-quantize's choice for a Qwen3 model (its
 * llama_tensor_get_type, read as a rule): the output matrix (the embedding when tied)
 * Q6_K, or Q8_0 when its rows are not whole 256-value super-blocks; attn_v and ffn_down
 * of layer i Q6_K in the _M mixes where i < n/8, i >= 7n/8 or (i - n/8) % 3 == 2
 * (n layers); in Q4_K_S, Q5_K for attn_v of layers 0-3 and ffn_down of layers below
 * n/8; everything else the base type. For a mixture of experts the stacks take the rule
 * of their kind (ffn_down_exps that of ffn_down; ffn_gate_exps and ffn_up_exps the base
 * type), and with exactly 8 experts (llama-quantize's Mixtral rule, hparams.n_expert ==
 * 8) attn_v and attn_k are Q8_0 and, in Q4_K_M/Q4_K_S, attn_output Q5_K. The router
 * (ffn_gate_inp) is F32 in every type, the norms too. A matrix whose rows are not whole
 * super-blocks then falls back as there: Q6_K to Q8_0, Q4_K to Q5_0, Q5_K to Q5_1, and to F16 when
 * not even whole 32-value blocks. Fails with Q3_ERR_UNSUPPORTED where that is Q5_0 or
 * Q5_1 (q3 has neither; no released Qwen3 has such rows), naming the tensor. */
q3_status q3_convert_pick_type(const q3_convert_opts *o, const q3_config *c, int tied, const char *name, int ndim,
                               const int64_t *shape, q3_dtype *out);

/* A q3_config q3 writes as a GGUF: Q3_OK, or Q3_ERR_UNSUPPORTED for a mixture of
 * experts whose norm_topk_prob is false (llama.cpp's qwen3moe always renormalizes the
 * chosen experts' weights; q3's GGUF loader assumes so too). source names the model in
 * the message. */
q3_status q3_convert_check_config(const q3_config *c, const char *source);

/* Adds general.architecture ("qwen3", or "qwen3moe" for a mixture of experts),
 * general.type, general.name (name), the <arch>.* hyper-parameters (with a MoE's
 * expert_feed_forward_length, expert_count, expert_used_count), general.file_type of
 * o's type and general.quantization_version, in that order. */
q3_status q3_convert_add_metadata(q3_gguf_writer *w, const q3_config *c, const q3_convert_opts *o, const char *name);

/* One tensor of the GGUF q3 writes for a config: the file's tensors in file order are
 * token_embd, each layer's (q3_layer_tensors order: attention and norms, then the dense
 * MLP or the router and the three expert stacks), output_norm, output (untied only). */
typedef struct q3_convert_entry {
    char name[64];                  /* the GGUF name ("blk.3.ffn_down_exps.weight") */
    const q3_tensor_layout *layout; /* model/layout.h */
    int layer;                      /* -1 for a whole-model tensor */
    int field;                      /* index into q3_layer_weights (as a pointer array); -1 outside layers */
    int ndim;                       /* 1, 2, or 3 for an expert stack */
    int64_t shape[3];               /* row-major ([n_experts][rows][cols] for a stack) */
    q3_dtype type;                  /* q3_convert_pick_type's choice */
} q3_convert_entry;

/* Number of tensors in the GGUF of c. */
size_t q3_convert_plan_count(const q3_config *c);

/* Fills out[q3_convert_plan_count(c)] for the weights' type in o; fails as
 * q3_convert_pick_type does. convert and synth --type both write from this plan, so
 * their files list the same tensors in the same order and types. */
q3_status q3_convert_plan(const q3_convert_opts *o, const q3_config *c, q3_convert_entry *out);

/* The base name of a path without a trailing ".gguf" or slashes, into out: the
 * default general.name. */
void q3_convert_base_name(const char *path, char *out, size_t n);

/* Converts an open model (from a folder or a GGUF) to a GGUF file at out_path
 * (written under a unique temporary name, renamed when complete). Fails with Q3_ERR_INVALID (a type
 * q3 cannot write), Q3_ERR_IO (no tokenizer found, an unwritable path) or whatever
 * reading the tokenizer files reports; the message names the file. */
q3_status q3_convert_model(const q3_model *m, const char *out_path, const q3_convert_opts *o);

/* Opens model_path (a Hugging Face folder or a .gguf) and converts it. */
q3_status q3_convert(const char *model_path, const char *out_path, const q3_convert_opts *o);

/* Adds tokenizer.* metadata read from dir/tokenizer.json and dir/tokenizer_config.json
 * (and dir/chat_template.jinja) for a model of vocab_size ids. config_json (may be NULL)
 * is the model's config.json, where bos/eos ids are taken from when the tokenizer's
 * config does not name them. */
q3_status q3_convert_add_tokenizer(q3_gguf_writer *w, const char *dir, const char *config_json,
                                   int vocab_size);

/* The same with the model's config.json given as text (may be NULL), for a model that
 * is not on disk (q3 synth --type). */
q3_status q3_convert_add_tokenizer_text(q3_gguf_writer *w, const char *dir, const char *config_text,
                                        int vocab_size);

/* Adds one metadata pair copied from a GGUF value (strings, bools, 32/64-bit integers,
 * f32, arrays of strings and of integers or f32). Q3_ERR_UNSUPPORTED for other types. */
q3_status q3_convert_copy_kv(q3_gguf_writer *w, const char *key, const q3_gguf_value *v);

/* ---- accuracy of quantized weights ------------------------------------------------ */

typedef struct q3_quant_report {
    q3_dtype type;          /* the weight type measured */
    size_t n_positions;     /* next-token distributions compared */
    double kl_mean, kl_max; /* KL(reference || quantized) of the next-token distribution, nats */
    double top1_agree;      /* fraction of positions where the argmax is the same */
    double max_abs_logit;   /* largest |logit difference| seen */
    size_t weight_bytes;    /* bytes of the quantized model's weights */
} q3_quant_report;

/* For each of types[0..n_types): converts ref to that type (through a temporary GGUF
 * under $TMPDIR or /tmp, removed at once), runs the token sequences seqs[i][0..lens[i])
 * through both models on compute unit `backend` (NULL: the default), one prefill each,
 * and compares the next-token distributions at every position. out[k] receives the
 * report for types[k]. */
q3_status q3_convert_compare(q3_model *ref, const q3_dtype *types, size_t n_types,
                             const int32_t *const *seqs, const size_t *lens, size_t n_seqs,
                             const char *backend, q3_quant_report *out);

/* The same for the KV cache's type instead of the weights': m as given, one
 * session with a ref_kv cache (the reference) and one per kv_types[k];
 * out[k].weight_bytes holds the KV bytes per token of kv_types[k]. Run it on
 * the cpu unit: the ref unit's prefill attends to a chunk's own K/V unrounded,
 * so only earlier chunks would see the cache's type there. */
q3_status q3_convert_compare_kv(q3_model *m, q3_dtype ref_kv, const q3_dtype *kv_types, size_t n_types,
                                const int32_t *const *seqs, const size_t *lens, size_t n_seqs, const char *backend,
                                q3_quant_report *out);

#endif
