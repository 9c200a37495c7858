/* Token sampler: turns a row of logits into the next token id.
 *
 * Pipeline, in this order (each stage can be switched off):
 *   1. penalties    repetition (HF / llama.cpp: a seen token's logit > 0 is
 *                   divided by the penalty, otherwise multiplied) and presence
 *                   (a constant subtracted from every seen token's logit), over
 *                   the distinct ids among the last `penalty_last_n` accepted
 *                   tokens
 *   2. temperature  logits / T; T <= 0 means greedy argmax (lowest id on ties)
 *   3. top-k        keep the k largest (ties broken by lower id first)
 *   4. softmax
 *   5. top-p        the smallest prefix, in descending probability, whose
 *                   cumulative probability reaches p (always >= 1 token)
 *   6. min-p        keep tokens with p >= min_p * p_max
 *   7. renormalize and draw with the sampler's own seeded PRNG
 *
 * All scratch is allocated once by q3_sampler_new for the given vocabulary;
 * sampling never allocates. Top-k uses a bounded heap (O(V log k)), never a
 * full sort of the vocabulary. A sampler is not thread-safe; use one per
 * generation stream. */
#ifndef Q3_TEXT_SAMPLER_H
#define Q3_TEXT_SAMPLER_H

#include <stddef.h>
#include <stdint.h>
#include "q3.h"

typedef struct q3_sampler_params {
    float temperature;      /* <= 0: greedy argmax */
    int top_k;              /* 0: off; >= vocab behaves as off */
    float top_p;            /* in [0, 1]; 1: off */
    float min_p;            /* in [0, 1]; 0: off */
    float repeat_penalty;   /* > 0; 1: off */
    float presence_penalty; /* subtracted from seen tokens' logits; 0: off */
    int penalty_last_n;     /* how many recent accepted tokens the penalties see; 0: none */
    uint64_t seed;          /* same seed + same inputs -> same draws */
} q3_sampler_params;

/* Qwen's recommended settings. thinking: T 0.6, top-p 0.95, top-k 20, min-p 0;
 * otherwise T 0.7, top-p 0.8, top-k 20, min-p 0. No penalties, seed 0. */
q3_sampler_params q3_sampler_defaults(int thinking);

/* Checks every field's range; Q3_ERR_INVALID with a message naming the field. */
q3_status q3_sampler_params_check(const q3_sampler_params *p);

typedef struct q3_sampler q3_sampler;

/* Creates a sampler for logits rows of n_vocab floats. Allocates all scratch
 * (a few bytes times n_vocab) now. The caller frees it with q3_sampler_free. */
q3_status q3_sampler_new(const q3_sampler_params *p, int n_vocab, q3_sampler **out);
void q3_sampler_free(q3_sampler *s);

/* Forgets the token history and restarts the PRNG from the seed. */
void q3_sampler_reset(q3_sampler *s);

/* Records a token (prompt or generated) in the penalty window. Ids outside
 * [0, n_vocab) are ignored. */
void q3_sampler_accept(q3_sampler *s, int32_t id);

/* Applies the penalties to a caller's row of n_vocab logits, in place: each
 * distinct id in the window is penalized once, all others are untouched. */
void q3_sampler_apply_penalties(q3_sampler *s, float *logits);

/* Picks the next token from logits[n_vocab] (not modified). Does not accept
 * the token: call q3_sampler_accept with it if it should count for penalties. */
int32_t q3_sampler_sample(q3_sampler *s, const float *logits);

/* Runs stages 1-6 and returns the number of kept candidates; *ids and *probs
 * (renormalized, summing to 1) point into the sampler's scratch, valid until
 * the next call on s. Ordered by descending probability, ties by lower id.
 * Does not advance the PRNG. Meant for tests and inspection, not the hot path
 * (it may sort the whole kept set). */
size_t q3_sampler_candidates(q3_sampler *s, const float *logits,
                             const int32_t **ids, const float **probs);

#endif
