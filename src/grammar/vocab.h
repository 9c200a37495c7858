/* Per-tokenizer tables for token masks, built once per process for each
 * distinct vocabulary (keyed by a hash of every token's bytes and kind) and
 * kept until exit.
 *
 * The trie holds every token that is text (added tokens such as <think> and
 * special ones such as <|im_end|> are not: they are allowed only by name, or
 * as the end of the output). Its nodes are in preorder, children by byte, so a
 * subtree is the index range [v, end[v]); tokens are ranked in the same order,
 * so the tokens of a subtree are the rank range [rank_lo[v], rank_lo[end[v]]).
 * Ranks of the other ids follow the trie's. A mask is a bit set over ranks. */
#ifndef Q3_GRAMMAR_VOCAB_H
#define Q3_GRAMMAR_VOCAB_H

#include <stddef.h>
#include <stdint.h>

#include "grammar/grammar.h"
#include "text/tokenizer.h"

/* The UTF-8 automaton of JSON string text: U_B between characters, the others
 * inside one (how many continuation bytes are left, and the first one's range). */
enum { U_B, U_C1, U_C2, U_C3, U_E0, U_ED, U_F0, U_F4, U_N };

/* Its next state on byte b (U_B: a character ended), or -1: not such text. */
int utf8_text_next(int q, unsigned b);

typedef struct gvocab {
    int32_t n_ids;        /* the tokenizer's ids */
    int32_t n_trie_ranks; /* ranks [0, n_trie_ranks) are trie tokens */
    int32_t *rank_of;     /* [n_ids] (ids with equal bytes share a rank) */
    int32_t *id_of_rank;  /* [n_ids] one id of each rank */
    char *bytes;          /* token bytes, by id: bytes + off[id], len[id] */
    uint32_t *off, *len;  /* [n_ids] */
    uint8_t *in_trie;     /* [n_ids] */
    /* the trie, preorder; node 0 is the root (the empty prefix) */
    int32_t n_nodes;
    uint8_t *lab;         /* [n_nodes] the byte into the node */
    int32_t *end;         /* [n_nodes] first index after the subtree */
    int32_t *rank_lo;     /* [n_nodes + 1] ranks before the node's subtree; [n_nodes] = n_trie_ranks */
    int32_t *tok_rank;    /* [n_nodes] the token ending here, or -1 */
    /* each node's children (by byte, ascending), side by side so that the mask walk
     * tries a child's byte without touching the child: node v's are kid[kid_off[v]
     * .. kid_off[v + 1]) with bytes kid_lab[...] */
    int32_t *kid_off;     /* [n_nodes + 1] */
    int32_t *kid;         /* [n_nodes - 1] */
    uint8_t *kid_lab;     /* [n_nodes - 1] */
    uint32_t *uni;        /* [n_nodes] index into unions: every byte of the subtree, its own label too */
    gclass *unions;
    int32_t n_unions;
    /* JSON string text (UTF-8 characters, none a control character, " or \):
     * bit q of uok[v]: every token of v's subtree, its bytes below v read from state q
     * of the UTF-8 automaton (mask.c's U_*), is a prefix of such text (it may end
     * inside a character, as byte-level BPE tokens do) */
    uint8_t *uok;         /* [n_nodes] */
    uint16_t *below;      /* [n_nodes] the most bytes a token of v's subtree has below v */
    int32_t eot, eos;     /* <|im_end|> and <|endoftext|> (or -1): the output may end with either */
    int shared_ranks;     /* some ids share a rank (equal bytes): id_of_rank does not list them all */
    double build_s;       /* time it took */
    size_t bytes_held;    /* memory it holds */
} gvocab;

/* The tables of tok's vocabulary (n_ids ids; eot and eos the ids that end an
 * output, or -1), built on first use (thread-safe). The result lives until
 * the process ends. */
q3_status gvocab_get(const q3_tokenizer *tok, int32_t n_ids, int32_t eot, int32_t eos, const gvocab **out);

/* Words of a mask over a vocabulary's ranks. */
static inline size_t gvocab_mask_words(const gvocab *v) { return ((size_t)v->n_ids + 63) / 64; }

#endif
