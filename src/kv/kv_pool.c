#include "kv/kv_pool.h"

#include <stdlib.h>
#include <string.h>

#include "util/error.h"

#define BT Q3_KV_BLOCK_TOKENS

int q3_kv_blocks_for(int n) { return (n + BT - 1) / BT; }

size_t q3_kv_bytes_per_token(const q3_config *c, q3_dtype dtype)
{
    return 2 * (size_t)c->n_layers * q3_dtype_row_bytes(dtype, (size_t)c->n_kv_heads * (size_t)c->head_dim);
}

/* ---- the prefix table and the cached-block list ------------------------------------ */

/* Hash of a block's tokens after the prefix whose hash is parent (FNV-1a over
 * the token bytes, then a final mix so nearby chains spread over buckets). */
static uint64_t chain_hash(uint64_t parent, const int32_t *tokens)
{
    uint64_t h = 0xcbf29ce484222325ull ^ parent;
    for (int i = 0; i < BT; i++) {
        uint32_t t = (uint32_t)tokens[i];
        for (int b = 0; b < 4; b++) {
            h ^= (t >> (8 * b)) & 0xff;
            h *= 0x100000001b3ull;
        }
    }
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33;
    return h ? h : 1; /* 0 is "no parent" */
}

static uint32_t bucket_of(const q3_kv_pool *p, uint64_t chain) { return (uint32_t)chain & (p->n_buckets - 1); }

static void table_insert(q3_kv_pool *p, int32_t id)
{
    q3_kv_block *b = &p->blocks[id];
    uint32_t k = bucket_of(p, b->chain);
    b->hash_next = p->buckets[k];
    p->buckets[k] = id;
    b->registered = true;
}

static void table_remove(q3_kv_pool *p, int32_t id)
{
    q3_kv_block *b = &p->blocks[id];
    int32_t *link = &p->buckets[bucket_of(p, b->chain)];
    while (*link != id) link = &p->blocks[*link].hash_next;
    *link = b->hash_next;
    b->hash_next = -1;
    b->registered = false;
}

/* The registered block for (parent, tokens), or -1. */
static int32_t table_find(const q3_kv_pool *p, uint64_t parent, const int32_t *tokens)
{
    uint64_t chain = chain_hash(parent, tokens);
    for (int32_t id = p->buckets[bucket_of(p, chain)]; id >= 0; id = p->blocks[id].hash_next) {
        const q3_kv_block *b = &p->blocks[id];
        if (b->chain == chain && b->parent == parent && !memcmp(b->tokens, tokens, sizeof b->tokens)) return id;
    }
    return -1;
}

static void lru_remove(q3_kv_pool *p, int32_t id)
{
    q3_kv_block *b = &p->blocks[id];
    if (b->lru_prev >= 0) p->blocks[b->lru_prev].lru_next = b->lru_next;
    else p->lru_head = b->lru_next;
    if (b->lru_next >= 0) p->blocks[b->lru_next].lru_prev = b->lru_prev;
    else p->lru_tail = b->lru_prev;
    b->lru_prev = b->lru_next = -1;
    p->n_cached--;
}

static void lru_push(q3_kv_pool *p, int32_t id)
{
    q3_kv_block *b = &p->blocks[id];
    b->lru_next = -1;
    b->lru_prev = p->lru_tail;
    if (p->lru_tail >= 0) p->blocks[p->lru_tail].lru_next = id;
    else p->lru_head = id;
    p->lru_tail = id;
    p->n_cached++;
}

/* ---- blocks ---------------------------------------------------------------------------- */

/* A block for one holder: a free one, else the least recently used cached
 * one (forgotten by the prefix table). -1 when every block is held. */
static int32_t block_take(q3_kv_pool *p)
{
    int32_t id;
    if (p->n_free > 0) {
        id = p->free_ids[--p->n_free];
    } else if (p->lru_head >= 0) {
        id = p->lru_head;
        lru_remove(p, id);
        table_remove(p, id);
    } else {
        return -1;
    }
    q3_kv_block *b = &p->blocks[id];
    b->ref = 1;
    b->chain = b->parent = 0;
    return id;
}

static void block_hold(q3_kv_pool *p, int32_t id)
{
    if (p->blocks[id].ref++ == 0) lru_remove(p, id); /* a cached block comes back into use */
}

static void block_release(q3_kv_pool *p, int32_t id)
{
    q3_kv_block *b = &p->blocks[id];
    if (--b->ref > 0) return;
    if (b->registered) lru_push(p, id);
    else p->free_ids[p->n_free++] = id;
}

void q3_kv_block_copy(q3_kv_pool *p, int32_t dst, int32_t src)
{
    for (int l = 0; l < p->n_layers; l++)
        memcpy(p->data + (size_t)l * p->layer_stride + (size_t)dst * p->layer_bytes,
               p->data + (size_t)l * p->layer_stride + (size_t)src * p->layer_bytes, p->layer_bytes);
}

static q3_status pool_full(const q3_kv_pool *p)
{
    return q3_fail(Q3_ERR_KV_FULL, "the KV pool is full: all %d blocks of %d tokens are held by sequences", p->n_blocks,
                   BT);
}

/* ---- the pool ------------------------------------------------------------------------------ */

q3_status q3_kv_pool_init(q3_kv_pool *p, const q3_config *c, q3_dtype dtype, int n_blocks, int max_seqs, int n_ctx)
{
    memset(p, 0, sizeof *p);
    if (dtype != Q3_F32 && dtype != Q3_F16 && dtype != Q3_BF16 && dtype != Q3_Q8_0)
        return q3_fail(Q3_ERR_INVALID, "KV cache dtype %s is not supported (f32, f16, bf16, q8_0)", q3_dtype_name(dtype));
    /* Q8_0 blocks of 32 must not straddle two heads: attention reads a head's slice of a row */
    if (dtype == Q3_Q8_0 && c->head_dim % 32)
        return q3_fail(Q3_ERR_INVALID, "a Q8_0 KV cache needs head_dim to be a multiple of 32 (this model's is %d)",
                       c->head_dim);
    if (n_blocks < 1 || n_blocks > (1 << 24))
        return q3_fail(Q3_ERR_INVALID, "a KV pool of %d blocks is out of range (1..%d)", n_blocks, 1 << 24);
    if (max_seqs < 1 || max_seqs > 4096)
        return q3_fail(Q3_ERR_INVALID, "%d sequences is out of range (1..4096)", max_seqs);
    if (n_ctx < 1) return q3_fail(Q3_ERR_INVALID, "context length %d is out of range", n_ctx);
    p->dtype = dtype;
    p->n_layers = c->n_layers;
    p->kv_dim = c->n_kv_heads * c->head_dim;
    p->n_ctx = n_ctx;
    p->max_blocks = q3_kv_blocks_for(n_ctx);
    p->row_bytes = q3_dtype_row_bytes(dtype, (size_t)p->kv_dim);
    p->layer_bytes = 2 * (size_t)BT * p->row_bytes;
    p->layer_stride = (size_t)n_blocks * p->layer_bytes;
    p->n_blocks = n_blocks;
    p->max_seqs = max_seqs;
    p->lru_head = p->lru_tail = -1;
    p->n_buckets = 1;
    while (p->n_buckets < 2u * (uint32_t)n_blocks) p->n_buckets <<= 1;
    /* calloc: the pages of a block are touched only when it first fills */
    p->data = calloc((size_t)n_blocks * (size_t)p->n_layers, p->layer_bytes);
    p->blocks = calloc((size_t)n_blocks, sizeof *p->blocks);
    p->free_ids = malloc((size_t)n_blocks * sizeof *p->free_ids);
    p->buckets = malloc(p->n_buckets * sizeof *p->buckets);
    p->seqs = calloc((size_t)max_seqs, sizeof *p->seqs);
    if (!p->data || !p->blocks || !p->free_ids || !p->buckets || !p->seqs) {
        size_t bytes = (size_t)n_blocks * (size_t)p->n_layers * p->layer_bytes;
        q3_kv_pool_free(p);
        return q3_fail(Q3_ERR_NOMEM, "cannot allocate a KV pool of %d blocks (%zu bytes)", n_blocks, bytes);
    }
    for (int i = 0; i < n_blocks; i++) {
        p->blocks[i] = (q3_kv_block){.lru_prev = -1, .lru_next = -1, .hash_next = -1};
        p->free_ids[i] = n_blocks - 1 - i; /* block 0 is taken first */
    }
    p->n_free = n_blocks;
    for (uint32_t i = 0; i < p->n_buckets; i++) p->buckets[i] = -1;
    return Q3_OK;
}

void q3_kv_pool_free(q3_kv_pool *p)
{
    if (p->seqs)
        for (int i = 0; i < p->max_seqs; i++) {
            free(p->seqs[i].table);
            free(p->seqs[i].tokens);
        }
    free(p->seqs);
    free(p->data);
    free(p->blocks);
    free(p->free_ids);
    free(p->buckets);
    memset(p, 0, sizeof *p);
}

void q3_kv_pool_usage(const q3_kv_pool *p, int *used, int *cached, int *total)
{
    if (used) *used = p->n_blocks - p->n_free - p->n_cached;
    if (cached) *cached = p->n_cached;
    if (total) *total = p->n_blocks;
}

/* ---- sequences --------------------------------------------------------------------------- */

bool q3_kv_seq_valid(const q3_kv_pool *p, int id) { return id >= 0 && id < p->max_seqs && p->seqs[id].live; }

q3_status q3_kv_seq_add(q3_kv_pool *p, int *id)
{
    for (int i = 0; i < p->max_seqs; i++) {
        q3_kv_seq *s = &p->seqs[i];
        if (s->live) continue;
        if (!s->table) {
            s->table = malloc((size_t)p->max_blocks * sizeof *s->table);
            s->tokens = malloc((size_t)p->n_ctx * sizeof *s->tokens);
            if (!s->table || !s->tokens) {
                free(s->table);
                free(s->tokens);
                s->table = s->tokens = NULL;
                return q3_fail(Q3_ERR_NOMEM, "out of memory for a sequence's block table");
            }
        }
        s->live = true;
        s->n_tokens = s->n_reserved = 0;
        *id = i;
        return Q3_OK;
    }
    return q3_fail(Q3_ERR_INVALID, "all %d sequences of the KV pool are in use", p->max_seqs);
}

static int seq_blocks(const q3_kv_seq *s) { return q3_kv_blocks_for(s->n_reserved); }

void q3_kv_seq_drop(q3_kv_pool *p, int id)
{
    if (!q3_kv_seq_valid(p, id)) return;
    q3_kv_seq *s = &p->seqs[id];
    /* last block first: a prefix's first block is then the most recently used
       of its chain, and the cache evicts children before their parents */
    for (int b = seq_blocks(s) - 1; b >= 0; b--) block_release(p, s->table[b]);
    s->live = false;
    s->n_tokens = s->n_reserved = 0;
}

q3_status q3_kv_seq_truncate(q3_kv_pool *p, int id, int n)
{
    if (!q3_kv_seq_valid(p, id)) return q3_fail(Q3_ERR_INVALID, "sequence %d does not exist", id);
    q3_kv_seq *s = &p->seqs[id];
    if (n < 0 || n > s->n_tokens)
        return q3_fail(Q3_ERR_INVALID, "cannot truncate sequence %d to %d positions: it holds %d", id, n, s->n_tokens);
    int keep = q3_kv_blocks_for(n);
    if (n % BT) { /* the last kept block becomes partial again: it must be this sequence's alone */
        int32_t old = s->table[keep - 1];
        q3_kv_block *b = &p->blocks[old];
        if (b->ref > 1) {
            int32_t copy = block_take(p);
            if (copy < 0) return pool_full(p);
            q3_kv_block_copy(p, copy, old);
            block_release(p, old);
            s->table[keep - 1] = copy;
        } else if (b->registered) {
            table_remove(p, old); /* its tokens will change: the cache forgets it */
        }
    }
    for (int b = seq_blocks(s) - 1; b >= keep; b--) block_release(p, s->table[b]);
    s->n_tokens = s->n_reserved = n;
    if (s->n_reserved % BT) s->n_reserved = keep * BT;
    return Q3_OK;
}

q3_status q3_kv_seq_fork(q3_kv_pool *p, int src, int *id)
{
    if (!q3_kv_seq_valid(p, src)) return q3_fail(Q3_ERR_INVALID, "sequence %d does not exist", src);
    int dst;
    q3_status st = q3_kv_seq_add(p, &dst);
    if (st) return st;
    q3_kv_seq *s = &p->seqs[src], *d = &p->seqs[dst];
    int full = s->n_tokens / BT, nb = q3_kv_blocks_for(s->n_tokens);
    if (nb > full) { /* the partial block is copied */
        int32_t copy = block_take(p);
        if (copy < 0) {
            d->live = false;
            return pool_full(p);
        }
        q3_kv_block_copy(p, copy, s->table[full]);
        d->table[full] = copy;
    }
    for (int b = 0; b < full; b++) {
        block_hold(p, s->table[b]);
        d->table[b] = s->table[b];
    }
    memcpy(d->tokens, s->tokens, (size_t)s->n_tokens * sizeof *s->tokens);
    d->n_tokens = s->n_tokens;
    d->n_reserved = nb * BT;
    *id = dst;
    return Q3_OK;
}

int q3_kv_seq_reuse_prefix(q3_kv_pool *p, int id, const int32_t *tokens, int n, int max_tokens)
{
    if (!q3_kv_seq_valid(p, id) || p->seqs[id].n_reserved != 0) return 0;
    q3_kv_seq *s = &p->seqs[id];
    if (max_tokens > n) max_tokens = n;
    uint64_t parent = 0;
    int b = 0;
    for (; (b + 1) * BT <= max_tokens; b++) {
        int32_t hit = table_find(p, parent, tokens + (size_t)b * BT);
        if (hit < 0) break;
        block_hold(p, hit);
        s->table[b] = hit;
        parent = p->blocks[hit].chain;
    }
    p->prefix_hits += (uint64_t)b;
    s->n_tokens = s->n_reserved = b * BT;
    memcpy(s->tokens, tokens, (size_t)s->n_tokens * sizeof *tokens);
    return s->n_tokens;
}

q3_status q3_kv_seq_reserve(q3_kv_pool *p, int id, int n)
{
    if (!q3_kv_seq_valid(p, id)) return q3_fail(Q3_ERR_INVALID, "sequence %d does not exist", id);
    q3_kv_seq *s = &p->seqs[id];
    if (n < 0 || n > p->n_ctx - s->n_tokens)
        return q3_fail(Q3_ERR_CONTEXT, "%d more tokens do not fit: %d of the context's %d are used", n, s->n_tokens,
                       p->n_ctx);
    int have = seq_blocks(s), need = q3_kv_blocks_for(s->n_tokens + n);
    for (int b = have; b < need; b++) {
        int32_t id_b = block_take(p);
        if (id_b < 0) {
            while (--b >= have) block_release(p, s->table[b]);
            return pool_full(p);
        }
        s->table[b] = id_b;
    }
    if (need > have) s->n_reserved = need * BT;
    return Q3_OK;
}

void q3_kv_seq_commit(q3_kv_pool *p, int id, const int32_t *tokens, int n)
{
    q3_kv_seq *s = &p->seqs[id];
    int t0 = s->n_tokens;
    memcpy(s->tokens + t0, tokens, (size_t)n * sizeof *tokens);
    s->n_tokens += n;
    /* blocks that became full: their chain hash, and the prefix table unless it has them already */
    for (int b = t0 / BT; (b + 1) * BT <= s->n_tokens; b++) {
        q3_kv_block *blk = &p->blocks[s->table[b]];
        if (blk->registered || blk->ref > 1) continue; /* reused or shared: already known */
        blk->parent = b ? p->blocks[s->table[b - 1]].chain : 0;
        memcpy(blk->tokens, s->tokens + (size_t)b * BT, sizeof blk->tokens);
        blk->chain = chain_hash(blk->parent, blk->tokens);
        if (table_find(p, blk->parent, blk->tokens) < 0) table_insert(p, s->table[b]);
    }
}
