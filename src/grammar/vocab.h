/* Per-tokenizer tables for token masks, built once per process for each
 * distinct vocabulary (keyed by a hash of every token's bytes and kind) and
 * kept until exit.
 *
 * The trie holds every token that is text (added tokens such as <think> and
 * special ones such as <|im_end|> are not: they are allowed only by name, or
 * as the end of the output). Tokens are ranked in the trie's preorder,
 * children by byte, so the tokens of a subtree are one range of ranks. Ranks
 * of the other ids follow the trie's. A mask is a bit set over ranks.
 *
 * The mask walk reads the trie as lists of children (gkid): each record holds
 * what the walk decides a child on, and a node's children lie side by side,
 * so trying them reads memory in order. */
#ifndef Q3_GRAMMAR_VOCAB_H
#define Q3_GRAMMAR_VOCAB_H

#include <stddef.h>
#include <stdint.h>

#include "grammar/grammar.h"
#include "text/tokenizer.h"

/* The UTF-8 automaton of JSON string text: U_B between characters, the others
 * inside one (how many continuation bytes are left, and the first one's range). */
enum { U_B, U_C1, U_C2, U_C3, U_E0, U_ED, U_F0, U_F4, U_N };

/* Its next state on byte b (U_B: a character ended), or -1: not such text
 * (a table: vocab.c's utf8_text1 holds it plus one). */
extern const uint8_t utf8_text1[U_N][256];
static inline int utf8_text_next(int q, unsigned b) { return (int)utf8_text1[q][b & 255] - 1; }

/* One child in the trie: a byte, the subtree under it, and its own children. */
typedef struct gkid {
    int32_t rank_lo, rank_hi; /* the subtree's tokens: ranks [rank_lo, rank_hi) */
    int32_t kids_lo, kids_hi; /* its children: kids[kids_lo .. kids_hi) */
    int32_t tok_rank;         /* the token ending at it, or -1 */
    uint32_t uni;             /* index into unions: every byte of the subtree, its own too */
    uint16_t below;           /* the most bytes a token of the subtree has after this one */
    uint8_t lab;              /* the byte */
    /* JSON string text (UTF-8 characters, none a control character, " or \\):
     * bit q: every token of the subtree, its bytes from this one on read from
     * state q of the UTF-8 automaton (U_*), is a prefix of such text (it may
     * end inside a character, as byte-level BPE tokens do) */
    uint8_t uok;
} gkid;

/* One node of the tail trie (gvocab's tails), as its parent's child. */
typedef struct gtail {
    int32_t kids_lo, kids_hi;   /* its children: tails[kids_lo .. kids_hi) */
    int32_t ranks_lo, ranks_hi; /* the tokens whose tail ends here: tail_ranks[ranks_lo .. ranks_hi) */
    uint8_t lab;                /* the byte */
} gtail;

typedef struct gvocab {
    int32_t n_ids;        /* the tokenizer's ids */
    int32_t n_trie_ranks; /* ranks [0, n_trie_ranks) are trie tokens */
    int32_t *rank_of;     /* [n_ids] (ids with equal bytes share a rank) */
    int32_t *id_of_rank;  /* [n_ids] one id of each rank */
    char *bytes;          /* token bytes, by id: bytes + off[id], len[id] */
    uint32_t *off, *len;  /* [n_ids] */
    uint8_t *in_trie;     /* [n_ids] */
    int32_t max_token_bytes; /* the longest trie token */
    int32_t n_nodes;      /* trie nodes, the root (the empty prefix) too */
    gkid *kids;           /* [n_nodes - 1] every node but the root, as its parent's child */
    int32_t n_root_kids;  /* the root's children: kids[0 .. n_root_kids) */
    gclass *unions;
    int32_t n_unions;
    /* For a state that any one character of JSON string text leads back to
     * (the inside of a free string): text_only, the trie tokens that are such
     * text from a character's start (a mask over ranks; a token may end inside
     * a character), and the other trie tokens by their tail, the bytes from
     * the start of the character where they stop being such text: a trie of
     * their own (tails, children blocks as kids; the root's first), each node
     * listing the ranks of the tokens whose tail ends there. From such a
     * state a token of text is allowed, and any other by its tail alone. */
    uint64_t *text_only;  /* [mask words] */
    gtail *tails;         /* [n_tail_nodes - 1] */
    int32_t n_tail_nodes, n_tail_root_kids;
    int32_t *tail_ranks;
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

/* Sets (on = 1) or clears ranks [lo, hi) of a mask. */
static inline void gvocab_mask_put(uint64_t *m, int32_t lo, int32_t hi, int on)
{
    if (lo >= hi) return;
    int32_t wl = lo >> 6, wh = (hi - 1) >> 6;
    uint64_t first = ~0ull << (lo & 63), last = ~0ull >> (63 - ((hi - 1) & 63));
    if (wl == wh) first &= last;
    if (on) m[wl] |= first;
    else m[wl] &= ~first;
    if (wl == wh) return;
    for (int32_t w = wl + 1; w < wh; w++) m[w] = on ? ~0ull : 0;
    if (on) m[wh] |= last;
    else m[wh] &= ~last;
}

#endif
