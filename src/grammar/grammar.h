/* The grammar IR every front end compiles to, and the builder that makes it.
 *
 * A grammar is a set of rules; a rule is a list of alternatives; an
 * alternative is a sequence of symbols, each a byte class (one byte out of a
 * 256-bit set), a reference to a rule, or a named token (an added token such
 * as <tool_call>, matched by id, never by its bytes). Text is bytes: a front
 * end that speaks of code points (GBNF's character classes, a regex's `.`)
 * spells them as UTF-8 byte sequences (utf8_class.c), so the recognizer
 * (recognizer.c) and the token masks (mask.c) work on bytes alone.
 *
 * Finished grammars hold only productive alternatives (each can derive a
 * finite string) and no left recursion: then every live parser stack can
 * still complete, so "some stack survives" is exactly "the text so far is a
 * prefix of the language", which is what makes the masks exact.
 *
 * Files: builder.c (this header's builder and the finishing checks),
 * utf8_class.c, recognizer.c, vocab.c (per-tokenizer tables), mask.c,
 * gbnf.c, regex.c, json_schema.c, choice.c, api.c (the public q3_grammar_*). */
#ifndef Q3_GRAMMAR_GRAMMAR_H
#define Q3_GRAMMAR_GRAMMAR_H

#include <stddef.h>
#include <stdint.h>

#include "util/status.h"

/* ---- the IR ------------------------------------------------------------- */

enum { GS_END = 0, GS_BYTES = 1, GS_RULE = 2, GS_TOKEN = 3 };

typedef struct gsym {
    uint32_t kind : 2;  /* GS_* */
    uint32_t arg : 30;  /* GS_BYTES: class index; GS_RULE: rule; GS_TOKEN: index into token_names */
} gsym;

/* Where a counted repetition item{min,max} stands after some of its items: how
 * many more it needs (req) and allows (tot, req included; INT32_MAX: no bound).
 * Two such positions of one repetition whose counts agree up to c (req and
 * tot each taken as min(x, c)) lead to languages with the same strings and
 * prefixes of up to c bytes: such a string holds at most c non-empty items.
 * The masks use it (recognizer.h's rec_state_key): a token is at most as
 * long as the vocabulary's longest, so counts past that never change one. */
typedef struct grepeat {
    int32_t rep, req, tot;
} grepeat;

typedef struct gclass {
    uint64_t w[4]; /* bit b: byte b is in the class */
} gclass;

static inline int gclass_has(const gclass *c, unsigned b) { return (int)((c->w[b >> 6] >> (b & 63)) & 1); }
static inline void gclass_add(gclass *c, unsigned b) { c->w[b >> 6] |= 1ull << (b & 63); }
/* Whether every byte of a is in b. */
static inline int gclass_subset(const gclass *a, const gclass *b)
{
    return !((a->w[0] & ~b->w[0]) | (a->w[1] & ~b->w[1]) | (a->w[2] & ~b->w[2]) | (a->w[3] & ~b->w[3]));
}

/* A finished grammar: immutable, shared by every matcher made from it. */
typedef struct q3g {
    gsym *syms;       /* [n_syms] the alternatives one after another, each ended by GS_END */
    int n_syms;
    int *alt_start;   /* [n_alts] index of an alternative's first symbol */
    int n_alts;
    int *rule_alt0;   /* [n_rules] the rule's first alternative (its alternatives are consecutive) */
    int *rule_nalt;   /* [n_rules] */
    char **rule_name; /* [n_rules] for messages */
    int n_rules;
    gclass *classes;  /* [n_classes] distinct byte classes */
    int n_classes;
    char **token_names; /* [n_token_names] names of GS_TOKEN symbols ("<tool_call>") */
    int n_token_names;
    int32_t *sym_rep; /* [n_syms] index into reps of the count a position stands at, or -1;
                         NULL when the grammar counts nothing */
    grepeat *reps;
    int n_reps;
    int root;
    int root_after_think; /* the rule for output after </think>: a newline or two, then root (-1: none) */
    size_t bytes;     /* memory it holds, for reports */
} q3g;

void q3g_free(q3g *g);

/* ---- the builder ----------------------------------------------------------
 *
 * Rules are made with gb_rule, alternatives opened on a rule with gb_alt and
 * filled with gb_* appends to that rule's last alternative; so a front end may
 * build helper rules while in the middle of another. Errors (out of memory)
 * are sticky: the first is kept and gb_finish reports it. */

typedef struct gb gb;

gb *gb_new(void);
void gb_free(gb *b);

/* A new rule. name NULL: a generated name ("<prefix>_<n>" from hint). */
int gb_rule(gb *b, const char *name, const char *hint);
/* The rule called name, created (empty, to be defined) if none is. */
int gb_rule_named(gb *b, const char *name, size_t len);
/* Whether rule r has any alternative (GBNF: was it defined?). */
int gb_rule_defined(const gb *b, int r);
const char *gb_rule_name(const gb *b, int r);

void gb_alt(gb *b, int r);                     /* opens a new, empty alternative of r */
void gb_bytes(gb *b, int r, const gclass *c);  /* appends one byte out of c */
void gb_byte(gb *b, int r, unsigned char c);
void gb_lit(gb *b, int r, const char *s, size_t n);
void gb_ref(gb *b, int r, int callee);
void gb_token(gb *b, int r, const char *name); /* a named added token, e.g. "<tool_call>" */

/* Helper rules around an existing rule `item`: item*, item+, item?, and
 * item{min,max} (max < 0: no upper bound). Each returns the new rule. */
int gb_star(gb *b, int item);
int gb_plus(gb *b, int item);
int gb_opt(gb *b, int item);
int gb_repeat(gb *b, int item, int min, int max);
/* A rule matching exactly the literal s[0..n). */
int gb_lit_rule(gb *b, const char *s, size_t n);

/* Marks the builder failed with a message (the front ends' syntax errors go
 * through q3_fail directly; this is for failures found deep in helpers). */
void gb_set_error(gb *b, q3_status st, const char *msg);
q3_status gb_error(const gb *b);

/* Finishes the grammar whose start is rule root: every referenced rule must
 * be defined (else Q3_ERR_INVALID naming it), unproductive alternatives are
 * dropped (a root that derives nothing is Q3_ERR_INVALID), left recursion is
 * refused (Q3_ERR_UNSUPPORTED naming the rule). The builder stays the
 * caller's to free. */
q3_status gb_finish(gb *b, int root, q3g **out);

/* ---- code points -------------------------------------------------------------- */

/* A set of code point ranges [lo, hi], to be spelled as UTF-8. */
typedef struct cp_range {
    uint32_t lo, hi;
} cp_range;

/* A rule matching one code point out of ranges[0..n) (any order, may overlap;
 * surrogates D800-DFFF are never matched), as UTF-8 byte sequences.
 * negate: the complement within [0, 10FFFF]. */
int gb_codepoints(gb *b, const cp_range *ranges, size_t n, int negate);

/* The UTF-8 encoding of cp into out (1..4 bytes); returns the length. */
int utf8_put(uint32_t cp, char *out);

#endif
