/* Token masks over a vocabulary's trie (vocab.h) from a recognizer state.
 *
 * mask_trie walks the trie depth first carrying the state after each prefix,
 * trying a node's children by their records alone (vocab.h's gkid): a dead
 * state cuts its subtree without touching it; a subtree whose every byte loops the state
 * back to itself (the inside of a string, a run of digits) is allowed whole,
 * as one range of ranks, without walking it. Some states skip most of the
 * walk: inside a free JSON string the mask is the text tokens plus the others
 * judged by their tails (vocab.h); a state that loops on (or starts a long
 * counted run of) a byte class of its own, an email's local part or a domain
 * label, takes that class's table (class_table.h); a root child whose byte
 * leads to a state that loops on it takes that state's whole mask. mask_brute
 * feeds each token's bytes one by one through the uncached recognizer: the
 * oracle. */
#ifndef Q3_GRAMMAR_MASK_H
#define Q3_GRAMMAR_MASK_H

#include <stdint.h>

#include "grammar/class_table.h"
#include "grammar/recognizer.h"
#include "grammar/vocab.h"

/* Sets mask's rank bits (gvocab_mask_words words) of the trie tokens allowed
 * after state s; the other ranks (ends and named tokens, the matcher's) are
 * left clear. keep < 0: every token is decided (mask cleared first). keep >= 0:
 * mask holds the mask of a state that has the same strings and prefixes of up
 * to keep bytes as s (rec_state_key), whose bits are right for every token of
 * up to keep bytes: only the longer ones are decided, walking only the paths
 * to them. Q3_OK, or the recognizer's failure. */
q3_status mask_trie(rec *r, const gvocab *v, int s, int keep, uint64_t *mask);
q3_status mask_brute(rec *r, const gvocab *v, int s, uint64_t *mask);

/* The byte class table (class_table.h) that gives s's whole mask, or *out
 * NULL when s takes none (mask_trie's choice). */
q3_status mask_class_table(rec *r, const gvocab *v, int s, const gclass_table **out);

/* The state after the bytes s[0..n) from state st: a state, REC_DEAD or REC_ERROR.
 * *n_ok: how many bytes were taken before it died (n if it did not). */
int mask_feed(rec *r, int st, const unsigned char *s, size_t n, size_t *n_ok);

#endif
