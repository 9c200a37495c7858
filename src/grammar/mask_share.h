/* A grammar's token masks, shared by all its matchers.
 *
 * Each matcher has its own recognizer (its node and state numbers are its
 * own), but a state is a set of parser stacks, and a stack is a chain of
 * grammar positions that means the same in every matcher of one grammar.
 * rec_state_key (recognizer.h) writes a state as those chains in a canonical
 * order; two states with the same key have the same language and so the same
 * mask. A server that gets the same schema with many requests (the compile
 * cache hands them one q3_grammar) computes each mask once; the rows of a
 * batch with the same schema share them too.
 *
 * Masks are kept until the grammar is freed, within a memory bound per
 * grammar and one for the process (past either, masks are not kept: the
 * matcher computes them as before). Thread-safe: find and put take a lock,
 * and a kept mask never changes or moves. */
#ifndef Q3_GRAMMAR_MASK_SHARE_H
#define Q3_GRAMMAR_MASK_SHARE_H

#include <stddef.h>
#include <stdint.h>

typedef struct mask_share mask_share;

/* Bounds: masks kept per grammar, and by all grammars of the process. */
#define MASK_SHARE_GRAMMAR_BYTES ((size_t)4 << 20)
#define MASK_SHARE_TOTAL_BYTES ((size_t)64 << 20)

/* A table for masks of `words` 64-bit words; NULL when out of memory (the
 * grammar then works without one). */
mask_share *mask_share_new(size_t words);
void mask_share_free(mask_share *s);

/* The mask kept for key[0..n) (hash h), or NULL. s may be NULL. */
const uint64_t *mask_share_find(mask_share *s, const int32_t *key, size_t n, uint64_t h);

/* Keeps a copy of bits for key[0..n) (hash h), unless a bound is reached or
 * memory is short (then nothing happens: keeping is an optimization). */
void mask_share_put(mask_share *s, const int32_t *key, size_t n, uint64_t h, const uint64_t *bits);

/* How many masks are kept, and the bytes they hold (for tests and reports). */
size_t mask_share_count(mask_share *s, size_t *bytes);

#endif
