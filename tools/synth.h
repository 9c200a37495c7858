/* Synthetic Qwen3 checkpoints: a Hugging Face folder (config.json +
 * model.safetensors, optionally the tokenizer files) with deterministic
 * random weights, for tests and benchmarks without downloading a model.
 *
 * Tensor names and shapes are exactly those Hugging Face writes for
 * Qwen3ForCausalLM (Linear weights are [out][in]):
 *   model.embed_tokens.weight                       [vocab][hidden]
 *   model.layers.N.input_layernorm.weight           [hidden]
 *   model.layers.N.self_attn.q_proj.weight          [heads*head_dim][hidden]
 *   model.layers.N.self_attn.k_proj.weight          [kv_heads*head_dim][hidden]
 *   model.layers.N.self_attn.v_proj.weight          [kv_heads*head_dim][hidden]
 *   model.layers.N.self_attn.o_proj.weight          [hidden][heads*head_dim]
 *   model.layers.N.self_attn.q_norm.weight          [head_dim]
 *   model.layers.N.self_attn.k_norm.weight          [head_dim]
 *   model.layers.N.post_attention_layernorm.weight  [hidden]
 *   model.layers.N.mlp.gate_proj.weight             [intermediate][hidden]
 *   model.layers.N.mlp.up_proj.weight               [intermediate][hidden]
 *   model.layers.N.mlp.down_proj.weight             [hidden][intermediate]
 *   model.norm.weight                               [hidden]
 *   lm_head.weight                                  [vocab][hidden]  (untied only)
 * A mixture of experts (Qwen3MoeForCausalLM, config.json model_type "qwen3_moe") has,
 * instead of each layer's three mlp.*_proj, the router and every expert's own matrices,
 * in this order:
 *   model.layers.N.mlp.gate.weight                  [experts][hidden]
 *   model.layers.N.mlp.experts.E.gate_proj.weight   [moe_intermediate][hidden]  (E = 0, 1, ...:
 *   model.layers.N.mlp.experts.E.up_proj.weight     [moe_intermediate][hidden]   gate, up, down
 *   model.layers.N.mlp.experts.E.down_proj.weight   [hidden][moe_intermediate]   of each in turn)
 *
 * Weights are scaled like a trained model's: matrices ~ N(0, 0.02), norm
 * weights ~ 1 + 0.05 N(0, 1); the router ~ N(0, 1/hidden), so that a hidden state of
 * RMS 1 (the post-attention norm's output) gives router logits of about unit
 * variance: the softmax over the experts is neither flat nor one-hot, and which
 * experts win changes from token to token. (Routing on random hidden states is
 * spread over the experts whatever the scale; the scale sets how peaked the chosen
 * experts' weights are.) The normal is approximated by a sum of four
 * 16-bit uniforms (exact mean and variance, tails cut at 3.46 sigma), drawn
 * from xoshiro256** streams seeded per (seed, tensor, block of 2^20
 * values), so the bytes depend only on the seed, dtype and config, never on
 * the number of threads that wrote them. */
#ifndef Q3_MODEL_SYNTH_H
#define Q3_MODEL_SYNTH_H

#include <stdint.h>
#include "model/config.h"
#include "model/dtype.h"
#include "tools/convert.h"
#include "q3.h"

#define Q3_SYNTH_MATRIX_STD 0.02 /* standard deviation of every matrix */
#define Q3_SYNTH_NORM_STD 0.05   /* norm weights: 1 + this x N(0, 1) */

/* Qwen3-0.6B: 28 layers, hidden 1024, intermediate 3072, 16 heads, 8 KV
 * heads, head_dim 128, vocab 151936, rope_theta 1e6, rms eps 1e-6, 40960
 * positions, tied embeddings. */
void q3_synth_preset_qwen3_0_6b(q3_config *out);

/* A tiny Qwen3 for tests: 2 layers, hidden 64, intermediate 192, 4 heads,
 * 2 KV heads, head_dim 32, vocab 1024, tied embeddings. */
void q3_synth_preset_tiny(q3_config *out);

/* Qwen3-30B-A3B: 48 layers, hidden 2048, 32 heads, 4 KV heads, head_dim 128, 128
 * experts, 8 per token, moe_intermediate_size 768 (intermediate_size 6144), vocab
 * 151936, untied, rope_theta 1e6, 40960 positions, norm_topk_prob true. */
void q3_synth_preset_qwen3_30b_a3b(q3_config *out);

/* Qwen3-235B-A22B: 94 layers, hidden 4096, 64 heads, 4 KV heads, head_dim 128, 128
 * experts, 8 per token, moe_intermediate_size 1536 (intermediate_size 12288), vocab
 * 151936, untied, as 30B-A3B otherwise. */
void q3_synth_preset_qwen3_235b_a22b(q3_config *out);

/* A tiny Qwen3-MoE for tests: 2 layers, hidden 256, 4 heads, 2 KV heads, head_dim 64,
 * 16 experts, 4 per token, moe_intermediate_size 256, vocab 1024, untied. Every matrix
 * row is whole 256-value super-blocks, so every K-quant mix applies to it. */
void q3_synth_preset_tiny_moe(q3_config *out);

/* Qwen3-Embedding-0.6B / Qwen3-Reranker-0.6B: Qwen3-0.6B's shapes, pooling
 * Q3_POOLING_LAST / Q3_POOLING_RANK (the folder gets sentence-transformers'
 * markers, the GGUF <arch>.pooling_type). */
void q3_synth_preset_qwen3_embedding_0_6b(q3_config *out);
void q3_synth_preset_qwen3_reranker_0_6b(q3_config *out);

/* Looks a preset up by name: "0.6b" (or "qwen3-0.6b"), "tiny", "qwen3-30b-a3b" (or
 * "30b-a3b"), "qwen3-235b-a22b" (or "235b-a22b"), "tiny-moe", "qwen3-embedding-0.6b",
 * "qwen3-reranker-0.6b". Q3_ERR_INVALID naming
 * the known presets if there is no such preset. */
q3_status q3_synth_preset(const char *name, q3_config *out);

/* Number of weights the checkpoint of c holds (lm_head counted if untied). */
uint64_t q3_synth_param_count(const q3_config *c);

/* Writes DIR/config.json and DIR/model.safetensors for cfg with weights
 * drawn from seed, stored as dtype (Q3_BF16 or Q3_F32). Creates DIR (and
 * its parents) if needed and replaces files of the same names; each file is
 * written under a unique temporary name and renamed when complete. If tokenizer_dir is
 * not NULL, copies its tokenizer.json (required) and tokenizer_config.json
 * (if present) into DIR. cfg->torch_dtype is ignored: config.json states
 * dtype. Uses up to 8 threads. */
q3_status q3_synth_write(const char *dir, uint64_t seed, q3_dtype dtype, const q3_config *cfg,
                         const char *tokenizer_dir);

/* Writes the checkpoint cfg would be as a GGUF file at path, straight from the
 * generator: the file `q3 synth` to a folder with this seed and dtype (Q3_BF16 or
 * Q3_F32), then `q3 convert` of that folder with o, would be, byte for byte (same
 * tensors, types and bytes; general.name o->name, else path's base name without
 * .gguf). Memory is bounded by the largest tensor in its file type plus a row per
 * thread: no F32 or BF16 copy of the model is made. o->type and o->kmix choose the
 * types (tools/convert.h); o->tokenizer_dir, if not NULL, is the folder whose
 * tokenizer.json (+ tokenizer_config.json, chat_template.jinja) is embedded, with the
 * config.json the folder would have for bos/eos; NULL writes tokenizer.ggml.model
 * "none"; o->no_tokenizer is ignored. o->progress is called after each tensor. Fails
 * as q3_convert_model does (a MoE with norm_topk_prob false is refused). Uses up to 8
 * threads. */
q3_status q3_synth_write_gguf(const char *path, uint64_t seed, q3_dtype dtype, const q3_config *cfg,
                              const q3_convert_opts *o);

#endif
