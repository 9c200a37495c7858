/* Token sampler: turns a row of logits into the next token id.
 *
 * Pipeline, in this order (each stage can be switched off):
 *   1. penalties    repetition (HF / llama.cpp: a seen token's logit > 0 is
 *                   divided by the penalty, otherwise multiplied), then presence
 *                   and frequency (OpenAI's: logit - (frequency * count +
 *                   presence), count = the id's occurrences in the window), over
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
#ifndef Q3_SAMPLE_SAMPLER_H
#define Q3_SAMPLE_SAMPLER_H

/* The sampler's API is public: include/q3.h. */
#include "q3.h"

#endif
