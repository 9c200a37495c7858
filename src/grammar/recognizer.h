/* The byte-level recognizer: a set of parser stacks over a q3g.
 *
 * A stack is a chain of nodes (pos, parent): pos is the symbol being matched
 * (an index into g->syms), parent the stack to return to when its alternative
 * ends (0: the empty stack). Nodes are hash-consed, so equal stacks are equal
 * ids; a continuation that would return straight away is its parent (a tail
 * call), so right recursion (x*) runs in constant stack. A state is the sorted
 * set of stacks whose top is a byte class or a named token, plus node 0 when
 * the text so far is complete; states are interned too, and their byte
 * transitions memoized, so the mask walk (mask.c) mostly reads a table.
 *
 * All of it is per recognizer (one per matcher, one thread); rec_compact
 * drops what the current state no longer needs when the tables grow large. */
#ifndef Q3_GRAMMAR_RECOGNIZER_H
#define Q3_GRAMMAR_RECOGNIZER_H

#include <stddef.h>
#include <stdint.h>

#include "grammar/grammar.h"

enum { REC_DEAD = -1, REC_UNKNOWN = -2, REC_ERROR = -3 };

/* Whole masks mask.c keeps per recognizer (see rec's memo_mask). */
#define REC_MEMO 4

/* A state's transitions: grp[b], the group of byte b (bytes the state's
 * stacks take alike, so that lead to one state), and next[g], the state after
 * a byte of group g: REC_UNKNOWN until asked, REC_DEAD, or a state. */
typedef struct rec_row {
    gclass live;    /* the bytes some stack takes (the others are dead) */
    uint8_t grp[256];
    int32_t next[]; /* one a group */
} rec_row;

typedef struct rec {
    const q3g *g;
    int root;               /* the rule rec_start starts from */
    /* nodes */
    int32_t *npos, *npar;   /* [cap_nodes] */
    int n_nodes, cap_nodes;
    int32_t *nhash;         /* open addressing: node + 1, 0 empty; [hash_cap] */
    uint32_t nhash_cap;
    uint32_t *seen;         /* [cap_nodes] closure stamp */
    uint32_t stamp;
    /* states */
    int32_t *st_off, *st_len; /* [cap_states] their nodes in pool */
    struct rec_row **st_trans; /* [cap_states] NULL or the state's transitions (rec_row) */
    gclass *st_loop;          /* [cap_states] bytes that lead back to the same state */
    uint8_t *st_loop_ok;      /* [cap_states] st_loop computed */
    int32_t *st_text;         /* [cap_states] mask.c's memo: the state after any one character of JSON
                                 string text (REC_UNKNOWN: not computed; REC_DEAD: none, or not one) */
    int32_t *st_budget;       /* [cap_states] mask.c's memo: how many such characters may follow
                                 (REC_UNKNOWN: not computed; INT32_MAX: any number) */
    int8_t *st_tails;         /* [cap_states] mask.c's memo: whether the state's mask is the text tokens
                                 and the tails walked from it (-1: not computed) */
    int32_t *st_run;          /* [cap_states] mask.c's memo of a counted run: an index into runs
                                 (REC_UNKNOWN: not computed) */
    /* mask.c's memo of whole masks (mask_trie's trie bits) of states that a
       child of the trie leads to and loops on: REC_MEMO of them, round robin;
       memo_state[i] holds the state + 1 (0: empty) */
    int32_t memo_state[REC_MEMO];
    uint64_t *memo_mask[REC_MEMO];
    int memo_next, memo_depth;
    struct rec_run {
        int32_t next;         /* the state some byte leads to, */
        int32_t reach;        /* how many bytes it reads the same as the state for (0: none; REC_UNKNOWN: not compared yet), */
        gclass cls;           /* and the bytes that lead to it */
    } *runs;
    int n_runs;
    size_t cap_runs;
    int n_states, cap_states;
    int32_t *shash;           /* state + 1, 0 empty; [shash_cap] */
    uint32_t shash_cap;
    int32_t *pool;
    size_t n_pool, cap_pool;
    /* scratch */
    int32_t *buf;
    int n_buf, cap_buf;
    int32_t *key_tmp;         /* rec_state_key's: the words before they are ordered, */
    size_t key_tmp_cap;
    void *key_chains;         /* and where each stack's words lie */
    size_t key_chains_cap;
    int32_t *cmp_key[2];      /* two keys mask.c compares */
    size_t cmp_key_cap[2];
    int failed;               /* an allocation failed or a state grew past REC_MAX_STACKS */
    size_t bytes;             /* memory held by the tables above */
} rec;

/* A state holding more stacks than this is refused (an ambiguous grammar). */
#define REC_MAX_STACKS 4096

/* A recognizer of g's language from rule root. */
q3_status rec_init(rec *r, const q3g *g, int root);
void rec_free(rec *r);

/* The start state (>= 0), or REC_ERROR (message set). */
int rec_start(rec *r);

/* The state after byte c from state s: a state, REC_DEAD, or REC_ERROR.
 * Memoized: rec_next reads the row, rec_next_fill fills it (for every byte
 * of c's group at once). */
int rec_next_fill(rec *r, int s, unsigned c);
static inline int rec_next(rec *r, int s, unsigned c)
{
    const rec_row *t = r->st_trans[s];
    if (t) {
        int n = t->next[t->grp[c & 255]];
        if (n != REC_UNKNOWN) return n;
    }
    return rec_next_fill(r, s, c);
}
/* s's transition row (its byte groups and live bytes), made if new; NULL out of memory. */
const rec_row *rec_row_of(rec *r, int s);
/* A new entry of runs (its index), or REC_ERROR. */
int rec_run_add(rec *r);
/* The bytes that s's stacks take just as they take c (so that lead where c
 * leads): 0, or REC_ERROR. */
int rec_group(rec *r, int s, unsigned c, gclass *out);
/* The same computed afresh (no memo): the oracle the tests compare against. */
int rec_next_uncached(rec *r, int s, unsigned c);
/* The state after the named token tok (an index into g->token_names). */
int rec_next_token(rec *r, int s, int tok);

/* Whether the text so far may end here. */
static inline int rec_accepting(const rec *r, int s) { return r->st_len[s] > 0 && r->pool[r->st_off[s]] == 0; }
/* Whether some byte may follow (some stack's top is a byte class). */
int rec_can_continue(const rec *r, int s);
/* Whether every stack of state a is one of state b's. Then the state after any
 * bytes from b holds the state after them from a (a state's next is the union
 * of its stacks' nexts). */
int rec_subset(const rec *r, int a, int b);
/* State s as words that mean the same in every recognizer of the grammar:
 * each stack's chain of grammar positions (top first, behind its length),
 * the chains in an order of their own content (node and state numbers are a
 * recognizer's own); a position inside a counted repetition written as the
 * repetition and its counts taken up to `upto` (grammar.h's grepeat). Equal
 * words: the same strings and prefixes of up to `upto` bytes, so the same
 * mask when `upto` is at least the longest token (mask_share.h), and the same
 * bits for every token of up to `upto` bytes otherwise (mask.h's keep).
 * Into *key (grown as needed; *key_cap words held); returns the count of
 * words, or -1 out of memory. *hash: their hash; *least: the least `tot` of
 * the counted positions (INT32_MAX: none). */
long rec_state_key(rec *r, int s, int upto, int32_t **key, size_t *key_cap, uint64_t *hash, int32_t *least);
/* Whether some stack's top is a named token. */
int rec_wants_token(const rec *r, int s);

/* The bytes that lead from s back to s, or NULL (REC_ERROR). */
const gclass *rec_loop(rec *r, int s);

/* When the tables have grown past about limit bytes: rebuilds them holding
 * only state *s (renumbered in place). Returns 1 if it did (every state id
 * held elsewhere is then stale), 0 if not needed, -1 on failure. */
int rec_compact(rec *r, int *s, size_t limit);

#endif
