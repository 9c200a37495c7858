/* Per-vocabulary tables of one byte class, for a state that every byte of
 * the class leads back to (the local part of an email, a run of letters or
 * digits): the trie tokens whose bytes are all in the class, each allowed
 * from such a state, and the exits, the trie nodes where a token first leaves
 * the class (a byte not in it after at least one that is), grouped by that
 * byte. From such a state a token that starts in the class is allowed when it
 * stays in the class or when the rest from its exit is allowed from the state
 * itself (the bytes before the exit led back to it), so the mask needs only
 * the exits of the bytes the state takes, not a walk of every node on the way.
 *
 * Built on first use for each (vocabulary, class): a walk of the trie's nodes
 * in the class that have some other byte below (the nodes whose bytes are all
 * in the class are taken whole by their rank range); kept until the process
 * ends, at most GCLASS_TABLES of them. A class whose walk meets more than
 * GCLASS_MAX_NODES such nodes or more than GCLASS_MAX_EXITS exits (most of
 * printable ASCII: the inside of an unanchored pattern) gets no table: its
 * exits would cost more than the walk they replace, and its build a few
 * milliseconds; that answer is kept too. */
#ifndef Q3_GRAMMAR_CLASS_TABLE_H
#define Q3_GRAMMAR_CLASS_TABLE_H

#include <stddef.h>
#include <stdint.h>

#include "grammar/vocab.h"

#define GCLASS_TABLES 64
#define GCLASS_MAX_NODES 8192
#define GCLASS_MAX_EXITS 4096

typedef struct gclass_table {
    gclass cls;
    uint64_t *in_cls;     /* [gvocab_mask_words] the trie tokens whose bytes are all in cls
                             (NULL: the class has no table, too many nodes or exits) */
    int32_t *exits;       /* indices into v->kids */
    int32_t exit_lo[257]; /* byte b's exits: exits[exit_lo[b] .. exit_lo[b + 1]) */
    int32_t max_len;      /* the longest trie token that starts with a byte of cls */
    size_t bytes;         /* memory held */
} gclass_table;

/* cls's table over v's trie, built on first use (thread-safe) and kept until
 * the process ends; *out NULL when the class has none or GCLASS_TABLES are
 * kept already (the caller walks instead). Q3_OK or Q3_ERR_NOMEM. */
q3_status gclass_table_get(const gvocab *v, const gclass *cls, const gclass_table **out);

#endif
