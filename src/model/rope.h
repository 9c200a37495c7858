/* Rotary position embedding frequencies: Qwen3's plain RoPE, and YaRN
 * ("rope_scaling": {"rope_type": "yarn", "factor": 4.0,
 * "original_max_position_embeddings": 32768}, as Qwen's model cards tell users
 * to add for contexts past 32K; or a GGUF's qwen3.rope.scaling.* keys).
 *
 * Pair i of a head (elements i and i + head_dim/2, the rotate_half layout) is
 * turned by the angle pos * inv_freq[i]; with YaRN, cos and sin are also
 * multiplied by an attention factor. The formulas are those of Hugging Face
 * transformers' _compute_yarn_parameters, which llama.cpp's rope_yarn computes
 * too:
 *
 *   base_i  = theta^(-2i/d)                      (d = head_dim; plain RoPE: inv_freq = base_i)
 *   corr(r) = d * ln(L / (2 pi r)) / (2 ln theta)      (L = original_max_position_embeddings)
 *   low     = max(floor(corr(beta_fast)), 0), high = min(ceil(corr(beta_slow)), d - 1)
 *             (no floor/ceil when "truncate" is false)
 *   ramp_i  = clamp((i - low) / (high - low), 0, 1)   (high - low: at least 0.001)
 *   inv_freq[i] = base_i / s * ramp_i + base_i * (1 - ramp_i)
 *             (s = factor: low-frequency pairs are interpolated, high-frequency ones kept)
 *   attention factor = attention_factor if given, else
 *             mscale(s, mscale) / mscale(s, mscale_all_dim) if both are given, else
 *             mscale(s, 1), where mscale(s, m) = 0.1 m ln(s) + 1 (1 when s <= 1). */
#ifndef Q3_MODEL_ROPE_H
#define Q3_MODEL_ROPE_H

#include "model/config.h"

/* The angular frequency (radians per position) of pair i of a head, 0 <= i <
 * head_dim/2; *scale receives the factor that multiplies cos and sin (1 without
 * scaling). Pure: any thread, any time. */
double q3_rope_freq(const q3_config *c, int i, double *scale);

#endif
