/* The KV pool: K/V rows of many sequences in fixed-size blocks taken from one
 * allocation, a block table per sequence, and a prefix cache that stores the
 * full blocks two sequences share once.
 *
 * A block holds Q3_KV_BLOCK_TOKENS consecutive positions of one sequence, for
 * every layer: [n_layers][K, V][Q3_KV_BLOCK_TOKENS][kv_dim] of the pool's
 * dtype, so a layer's K rows of a block are contiguous. Position t of a
 * sequence lives in block table[t / Q3_KV_BLOCK_TOKENS], row t % that.
 *
 * Sharing rules (what keeps shared K/V immutable):
 *  - a FULL block is never written again; it may be held by several
 *    sequences (reference-counted) and, once its tokens are known, it is
 *    registered in the prefix cache under the chain hash of every token from
 *    position 0 through its last;
 *  - a PARTIAL block (the last block of a sequence, not yet full) belongs to
 *    exactly one sequence; fork and truncate copy it rather than share it;
 *  - a registered block no sequence holds stays cached (least recently used
 *    first out) until the pool needs a block and none is free.
 * K/V of a position depend only on the tokens up to it (the cpu unit's
 * determinism contract), so a sequence that reuses a cached prefix computes
 * bit for bit what it would have computed itself.
 *
 * Not thread-safe: one thread (the context's) owns a pool. */
#ifndef Q3_KV_KV_POOL_H
#define Q3_KV_KV_POOL_H

#include <stdbool.h>
#include <stdint.h>

#include "model/config.h"
#include "model/dtype.h"

#define Q3_KV_BLOCK_TOKENS 16

typedef struct q3_kv_block {
    int32_t ref;        /* sequences holding the block */
    int32_t lru_prev, lru_next; /* cached-block list (ref == 0 and registered), -1 ends */
    int32_t hash_next;  /* next block in the same prefix-table bucket, -1 ends */
    bool registered;    /* in the prefix table */
    uint64_t chain;     /* hash of every token from position 0 through this block */
    uint64_t parent;    /* the same through the block before (0 for a first block) */
    int32_t tokens[Q3_KV_BLOCK_TOKENS]; /* compared on lookup, so a hit is exact for the block */
} q3_kv_block;

typedef struct q3_kv_seq {
    bool live;
    int n_tokens;       /* positions whose K/V are stored */
    int n_reserved;     /* positions with a block (>= n_tokens) */
    int32_t *table;     /* [max_blocks] block ids */
    int32_t *tokens;    /* [n_ctx] the token at each stored position */
} q3_kv_seq;

typedef struct q3_kv_pool {
    q3_dtype dtype;     /* F32, F16, BF16 or Q8_0 (head_dim % 32 == 0: blocks never straddle heads) */
    int n_layers, kv_dim;
    int n_ctx;          /* positions a sequence may hold */
    int max_blocks;     /* per sequence: ceil(n_ctx / Q3_KV_BLOCK_TOKENS) */
    size_t row_bytes;   /* one position's K (or V) row of one layer */
    size_t layer_bytes; /* a layer's K and V rows of one block: 2 * Q3_KV_BLOCK_TOKENS * row_bytes */
    size_t layer_stride;/* n_blocks * layer_bytes: from one layer's blocks to the next layer's */
    int n_blocks;
    /* [n_layers][n_blocks][K, V][Q3_KV_BLOCK_TOKENS][row_bytes], pages touched as blocks fill.
       Layer-major: a decode step's attention reads one layer's blocks of a sequence at a time,
       and a sequence's blocks are mostly consecutive ids, so those lie together (block-major,
       each layer's 32-64 KB of a block sat a whole block of all layers apart, a new page every
       few KB read). Measured, BF16 decode at depth 4096, 2 threads: attention 58 -> 51 ms of a
       token (one run each; bench_kernels --only e2e). */
    char *data;
    q3_kv_block *blocks;  /* [n_blocks] */
    int32_t *free_ids;    /* [n_blocks] stack of never-registered free blocks */
    int n_free;
    int32_t lru_head, lru_tail; /* cached blocks, least recently used at the head */
    int n_cached;
    int32_t *buckets;     /* [n_buckets] prefix table heads, -1 empty */
    uint32_t n_buckets;   /* power of two */
    int max_seqs;
    q3_kv_seq *seqs;      /* [max_seqs] */
    uint64_t prefix_hits; /* blocks reused through the prefix cache */
} q3_kv_pool;

/* A pool of n_blocks blocks for up to max_seqs sequences of up to n_ctx
 * positions each. */
q3_status q3_kv_pool_init(q3_kv_pool *p, const q3_config *c, q3_dtype dtype, int n_blocks, int max_seqs, int n_ctx);
void q3_kv_pool_free(q3_kv_pool *p);
/* Blocks a sequence of n positions needs. */
int q3_kv_blocks_for(int n);
size_t q3_kv_bytes_per_token(const q3_config *c, q3_dtype dtype);

/* Blocks held by some sequence (used), cached for reuse (no holder), and in all. */
void q3_kv_pool_usage(const q3_kv_pool *p, int *used, int *cached, int *total);

/* ---- sequences ------------------------------------------------------------------ */

/* A new empty sequence; Q3_ERR_INVALID when max_seqs are live. */
q3_status q3_kv_seq_add(q3_kv_pool *p, int *id);
/* Releases every block of the sequence (full registered ones stay cached). */
void q3_kv_seq_drop(q3_kv_pool *p, int id);
/* Keeps positions [0, n) (n <= the positions stored). */
q3_status q3_kv_seq_truncate(q3_kv_pool *p, int id, int n);
/* A new sequence with src's positions: full blocks shared, the partial one copied. */
q3_status q3_kv_seq_fork(q3_kv_pool *p, int src, int *id);
/* True when id names a live sequence. */
bool q3_kv_seq_valid(const q3_kv_pool *p, int id);
static inline int q3_kv_seq_len(const q3_kv_pool *p, int id) { return p->seqs[id].n_tokens; }

/* An empty sequence takes the longest run of cached full blocks whose tokens
 * are tokens[0..), at most max_tokens positions; returns the positions taken
 * (a multiple of Q3_KV_BLOCK_TOKENS, 0 when nothing matched or the sequence
 * is not empty). */
int q3_kv_seq_reuse_prefix(q3_kv_pool *p, int id, const int32_t *tokens, int n, int max_tokens);

/* Makes blocks exist for positions [n_tokens, n_tokens + n). On failure
 * (Q3_ERR_CONTEXT past n_ctx, Q3_ERR_NOMEM when the pool has no block to
 * give) nothing changed. */
q3_status q3_kv_seq_reserve(q3_kv_pool *p, int id, int n);
/* Records that positions [n_tokens, n_tokens + n) now hold the K/V of
 * tokens[0..n) (reserved before), and registers blocks that became full. */
void q3_kv_seq_commit(q3_kv_pool *p, int id, const int32_t *tokens, int n);

/* Bytes of the whole pool's K/V. */
static inline size_t q3_kv_pool_bytes(const q3_kv_pool *p) { return (size_t)p->n_layers * p->layer_stride; }

/* Copies block src's K/V (every layer) into block dst. */
void q3_kv_block_copy(q3_kv_pool *p, int32_t dst, int32_t src);

/* ---- rows ------------------------------------------------------------------------- */

/* K (or V) row of position t of a sequence whose block table is table. */
static inline void *q3_kv_k_row(const q3_kv_pool *p, const int32_t *table, int layer, int t)
{
    return p->data + (size_t)layer * p->layer_stride + (size_t)table[t / Q3_KV_BLOCK_TOKENS] * p->layer_bytes +
           (size_t)(t % Q3_KV_BLOCK_TOKENS) * p->row_bytes;
}
static inline void *q3_kv_v_row(const q3_kv_pool *p, const int32_t *table, int layer, int t)
{
    return (char *)q3_kv_k_row(p, table, layer, t) + (size_t)Q3_KV_BLOCK_TOKENS * p->row_bytes;
}

#endif
