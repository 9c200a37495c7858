/* Token masks over a vocabulary's trie (vocab.h) from a recognizer state.
 *
 * mask_trie walks the trie depth first carrying the state after each prefix,
 * trying a node's children by their records alone (vocab.h's gkid): a dead
 * state cuts its subtree without touching it; a subtree whose every byte loops the state
 * back to itself (the inside of a string, a run of digits) is allowed whole,
 * as one range of ranks, without walking it. mask_brute feeds each token's
 * bytes one by one through the uncached recognizer: the oracle. */
#ifndef Q3_GRAMMAR_MASK_H
#define Q3_GRAMMAR_MASK_H

#include <stdint.h>

#include "grammar/recognizer.h"
#include "grammar/vocab.h"

/* Sets mask's rank bits (gvocab_mask_words words, cleared first) of the trie
 * tokens allowed after state s. Only trie tokens: ends and named tokens are
 * the matcher's. Q3_OK, or the recognizer's failure. */
q3_status mask_trie(rec *r, const gvocab *v, int s, uint64_t *mask);
q3_status mask_brute(rec *r, const gvocab *v, int s, uint64_t *mask);

/* The state after the bytes s[0..n) from state st: a state, REC_DEAD or REC_ERROR.
 * *n_ok: how many bytes were taken before it died (n if it did not). */
int mask_feed(rec *r, int st, const unsigned char *s, size_t n, size_t *n_ok);

#endif
