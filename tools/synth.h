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
 *
 * Weights are scaled like a trained model's: matrices ~ N(0, 0.02), norm
 * weights ~ 1 + 0.05 N(0, 1). The normal is approximated by a sum of four
 * 16-bit uniforms (exact mean and variance, tails cut at 3.46 sigma), drawn
 * from xoshiro256** streams seeded per (seed, tensor, block of 2^20
 * values), so the bytes depend only on the seed, dtype and config, never on
 * the number of threads that wrote them. */
#ifndef Q3_MODEL_SYNTH_H
#define Q3_MODEL_SYNTH_H

#include <stdint.h>
#include "model/config.h"
#include "model/dtype.h"
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

/* Looks a preset up by name: "0.6b" (or "qwen3-0.6b") or "tiny".
 * Q3_ERR_INVALID naming the known presets if there is no such preset. */
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

#endif
