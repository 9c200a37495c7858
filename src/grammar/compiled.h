/* What a compiled q3_grammar is: the finished rules, the vocabulary's tables
 * and the ids of the tokens the rules name. Shared by compile.c and
 * matcher.c (and the tests and bench, which look inside). */
#ifndef Q3_GRAMMAR_COMPILED_H
#define Q3_GRAMMAR_COMPILED_H

#include "grammar/grammar.h"
#include "grammar/mask_share.h"
#include "grammar/recognizer.h"
#include "grammar/vocab.h"

struct q3_grammar {
    int refs;           /* the callers' and the compile cache's (atomic) */
    char *key;          /* the cache's key: kind, then the text */
    size_t key_len;
    q3g *g;
    const gvocab *v;
    int32_t *token_ids; /* [g->n_token_names] the id of each named token */
    int32_t think_close; /* </think>, or -1 */
    int kind;           /* q3_grammar_kind */
    mask_share *share;  /* masks met by any of its matchers (NULL: none kept) */
};

/* Masks remembered per matcher, by recognizer state (each slot's own bits
 * allocated on first use, 19 KB for Qwen3's vocabulary, or a view of the
 * grammar's shared mask): enough for the states a string's text cycles
 * through (between characters, inside a multi-byte one, escapes). */
#define MATCHER_CACHE 32

struct q3_matcher {
    const struct q3_grammar *G;
    unsigned flags;
    int phase;       /* 0: thinking (before </think>), 1: constrained, 2: ended by an end-of-turn token */
    rec r;
    int state;       /* the recognizer's state in phase 1 */
    uint64_t *mask;  /* [gvocab_mask_words] by rank: the thinking and ended phases' masks, and a
                        state's when no cache slot could be had */
    const uint64_t *cur; /* the current state's mask: mask or a cache slot's bits */
    int mask_state;  /* the state cur is for (-1: none) */
    struct {
        int state;   /* -1: empty */
        uint64_t *bits;        /* the slot's own buffer (NULL until needed) */
        const uint64_t *view;  /* the state's mask: bits, or the grammar's shared one */
        int32_t *key;          /* the state's rec_state_key up to the longest token (n_key < 0: none) */
        long n_key;
        size_t key_cap;
        uint64_t hash;
    } cache[MATCHER_CACHE];
    int cache_next;
    int last_slot;   /* the slot that served the last mask (-1: none) */
    unsigned n_same, n_derived; /* masks taken from a state whose counts differ past the longest
                                   token, and masks derived from the last one (for tests) */
    int32_t *key;    /* scratch for rec_state_key: the current state's */
    size_t key_cap;
    int32_t *side[2]; /* scratch for two states' keys up to fewer bytes */
    size_t side_cap[2];
};

/* The mask of m's current position by rank (owned by m, valid until its next
 * call). */
q3_status matcher_rank_mask(struct q3_matcher *m, const uint64_t **mask);

#endif
