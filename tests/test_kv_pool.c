/* The KV pool alone (src/kv/): blocks, reference counts, the prefix cache,
 * least-recently-used eviction, fork, truncate, and refusals that change
 * nothing. */
#include <stdlib.h>
#include <string.h>

#include "kv/kv_pool.h"
#include "q3.h"
#include "test.h"

#define BT Q3_KV_BLOCK_TOKENS

static q3_config cfg = {.n_layers = 2, .dim = 32, .ffn_dim = 64, .n_heads = 4, .n_kv_heads = 2, .head_dim = 8,
                        .vocab_size = 100, .max_seq_len = 1024, .rms_eps = 1e-6f, .rope_theta = 1e6f};

static int used(const q3_kv_pool *p)
{
    int u;
    q3_kv_pool_usage(p, &u, NULL, NULL);
    return u;
}
static int cached(const q3_kv_pool *p)
{
    int c;
    q3_kv_pool_usage(p, NULL, &c, NULL);
    return c;
}

/* Appends n tokens (reserve + commit) and writes a marker into each new row's K of layer 1. */
static q3_status append(q3_kv_pool *p, int seq, const int32_t *toks, int n)
{
    q3_status st = q3_kv_seq_reserve(p, seq, n);
    if (st) return st;
    int t0 = q3_kv_seq_len(p, seq);
    for (int i = 0; i < n; i++) {
        float *k = q3_kv_k_row(p, p->seqs[seq].table, 1, t0 + i);
        k[0] = (float)toks[i];
        k[1] = (float)(t0 + i);
    }
    q3_kv_seq_commit(p, seq, toks, n);
    return Q3_OK;
}

/* Position t of seq holds the marker of token tok written at position t. */
static int holds(const q3_kv_pool *p, int seq, int t, int32_t tok)
{
    const float *k = q3_kv_k_row(p, p->seqs[seq].table, 1, t);
    return k[0] == (float)tok && k[1] == (float)t;
}

int main(void)
{
    int32_t toks[256];
    for (int i = 0; i < 256; i++) toks[i] = (int32_t)(i * 7 % 100);
    q3_kv_pool p;
    CHECK(q3_kv_pool_init(&p, &cfg, Q3_F32, 8, 4, 128) == Q3_OK, "init: %s", q3_last_error());
    CHECK(p.layer_bytes == (size_t)2 * BT * 16 * 4 && p.layer_stride == 8 * p.layer_bytes &&
              q3_kv_pool_bytes(&p) == (size_t)2 * p.layer_stride,
          "layer bytes %zu, layer stride %zu", p.layer_bytes, p.layer_stride);
    int a, b, c, d;
    CHECK(q3_kv_seq_add(&p, &a) == Q3_OK && q3_kv_seq_add(&p, &b) == Q3_OK, "two sequences");

    /* a: 40 tokens = 2 full blocks (registered) + 1 partial */
    CHECK(append(&p, a, toks, 40) == Q3_OK, "a: %s", q3_last_error());
    CHECK(used(&p) == 3 && cached(&p) == 0, "a holds 3 blocks: %d", used(&p));
    int ok = 1;
    for (int t = 0; t < 40; t++) ok &= holds(&p, a, t, toks[t]);
    CHECK(ok, "a's rows hold what was written");

    /* b reuses a's two full blocks (never the partial one), at most max_tokens */
    CHECK(q3_kv_seq_reuse_prefix(&p, b, toks, 40, 40) == 32, "b reuses 32");
    CHECK(p.seqs[b].table[0] == p.seqs[a].table[0] && p.seqs[b].table[1] == p.seqs[a].table[1], "shared blocks");
    CHECK(used(&p) == 3, "sharing takes no block: %d", used(&p));
    CHECK(q3_kv_seq_reuse_prefix(&p, b, toks, 40, 40) == 0, "reuse only into an empty sequence");
    int e;
    CHECK(q3_kv_seq_add(&p, &e) == Q3_OK, "e");
    CHECK(q3_kv_seq_reuse_prefix(&p, e, toks, 40, 31) == 16, "max_tokens 31 takes one block");
    int32_t other[40];
    memcpy(other, toks, sizeof other);
    other[20] = 99; /* differs in the second block */
    q3_kv_seq_drop(&p, e);
    CHECK(q3_kv_seq_add(&p, &e) == Q3_OK, "e again");
    CHECK(q3_kv_seq_reuse_prefix(&p, e, other, 40, 40) == 16, "a different second block stops the match");
    other[3] = 98;
    q3_kv_seq_drop(&p, e);
    CHECK(q3_kv_seq_add(&p, &e) == Q3_OK, "e again");
    CHECK(q3_kv_seq_reuse_prefix(&p, e, other, 40, 40) == 0, "a different first block: nothing");
    q3_kv_seq_drop(&p, e);

    /* b continues on its own: its third block is new, a's rows are untouched */
    CHECK(append(&p, b, other + 32, 8) == Q3_OK, "b appends");
    CHECK(p.seqs[b].table[2] != p.seqs[a].table[2], "b's partial block is its own");
    ok = 1;
    for (int t = 0; t < 40; t++) ok &= holds(&p, a, t, toks[t]);
    for (int t = 32; t < 40; t++) ok &= holds(&p, b, t, other[t]);
    CHECK(ok, "a and b keep their own rows");

    /* truncating b into a shared block copies it (copy on write) */
    int32_t shared1 = p.seqs[b].table[1];
    CHECK(q3_kv_seq_truncate(&p, b, 20) == Q3_OK, "truncate b to 20: %s", q3_last_error());
    CHECK(p.seqs[b].table[1] != shared1 && p.seqs[a].table[1] == shared1, "b's block 1 is a copy now");
    CHECK(holds(&p, b, 19, toks[19]), "the copy holds the shared rows");
    CHECK(append(&p, b, other + 20, 4) == Q3_OK, "b appends into its copy");
    ok = 1;
    for (int t = 0; t < 40; t++) ok &= holds(&p, a, t, toks[t]);
    CHECK(ok, "a's shared block unchanged by b's writes");

    /* fork: full blocks shared, the partial one copied */
    CHECK(q3_kv_seq_fork(&p, a, &c) == Q3_OK, "fork: %s", q3_last_error());
    CHECK(q3_kv_seq_len(&p, c) == 40 && p.seqs[c].table[0] == p.seqs[a].table[0] &&
              p.seqs[c].table[2] != p.seqs[a].table[2] && holds(&p, c, 39, toks[39]),
          "fork shares 2 blocks and copies the partial one");
    CHECK(p.blocks[p.seqs[a].table[0]].ref == 3, "block 0 held by a, b, c: ref %d", p.blocks[p.seqs[a].table[0]].ref);
    /* a 5th sequence is refused */
    CHECK(q3_kv_seq_add(&p, &d) == Q3_OK, "4th sequence");
    int x;
    CHECK(q3_kv_seq_add(&p, &x) == Q3_ERR_INVALID, "a 5th sequence is refused");
    q3_kv_seq_drop(&p, d);

    /* drop everything: registered full blocks stay cached, the rest are free */
    q3_kv_seq_drop(&p, a);
    q3_kv_seq_drop(&p, b);
    q3_kv_seq_drop(&p, c);
    CHECK(used(&p) == 0, "nothing held: %d", used(&p));
    CHECK(cached(&p) == 2, "a's two full blocks cached: %d", cached(&p));
    /* a new sequence reuses them after everything was dropped */
    CHECK(q3_kv_seq_add(&p, &a) == Q3_OK && q3_kv_seq_reuse_prefix(&p, a, toks, 40, 40) == 32, "cached prefix reused");
    CHECK(holds(&p, a, 31, toks[31]), "its rows survived");
    q3_kv_seq_drop(&p, a);

    /* pool pressure: 8 blocks; a sequence of 128 tokens needs 8: the cached ones are evicted */
    CHECK(q3_kv_seq_add(&p, &a) == Q3_OK, "a");
    int32_t fresh[128];
    for (int i = 0; i < 128; i++) fresh[i] = 50 + i % 40;
    CHECK(append(&p, a, fresh, 128) == Q3_OK, "128 tokens fill the pool: %s", q3_last_error());
    CHECK(used(&p) == 8 && cached(&p) == 0, "pool full: %d used, %d cached", used(&p), cached(&p));
    CHECK(q3_kv_seq_add(&p, &b) == Q3_OK, "b");
    CHECK(q3_kv_seq_reuse_prefix(&p, b, toks, 40, 40) == 0, "the evicted prefix is gone");
    CHECK(append(&p, b, toks, 1) == Q3_ERR_KV_FULL, "no block for b");
    CHECK_CONTAINS(q3_last_error(), "KV pool is full");
    CHECK(q3_kv_seq_len(&p, b) == 0 && used(&p) == 8, "the refusal changed nothing");
    CHECK(q3_kv_seq_reserve(&p, a, 1) == Q3_ERR_CONTEXT, "past n_ctx refused");
    CHECK_CONTAINS(q3_last_error(), "do not fit");

    /* LRU: the least recently released cached block goes first */
    q3_kv_seq_truncate(&p, a, 64); /* blocks 4..7 released: registered, so cached */
    CHECK(used(&p) == 4 && cached(&p) == 4, "after truncate: %d used, %d cached", used(&p), cached(&p));
    int32_t lru_first = p.lru_head;
    CHECK(append(&p, b, toks, BT) == Q3_OK, "b takes a block");
    CHECK(p.seqs[b].table[0] == lru_first && cached(&p) == 3, "the oldest cached block was evicted and taken");
    /* truncate released the deepest block first, so that is the one evicted:
       a newcomer gets a's held 64 and the 3 cached blocks after them */
    CHECK(q3_kv_seq_add(&p, &c) == Q3_OK, "c");
    CHECK(q3_kv_seq_reuse_prefix(&p, c, fresh, 128, 128) == 112, "held + cached prefix blocks reused");
    CHECK(cached(&p) == 0 && used(&p) == 8, "reused cached blocks are held again: %d used", used(&p));
    q3_kv_pool_free(&p);

    /* bad pools */
    /* Q8_0: blocks of 32 must not straddle heads; this config's head_dim is 8 */
    CHECK(q3_kv_pool_init(&p, &cfg, Q3_Q8_0, 8, 4, 128) == Q3_ERR_INVALID, "Q8_0 cache of head_dim 8 refused");
    CHECK_CONTAINS(q3_last_error(), "multiple of 32");
    CHECK(q3_kv_pool_init(&p, &cfg, Q3_Q4_0, 8, 4, 128) == Q3_ERR_INVALID, "Q4_0 cache refused");
    q3_config c32 = cfg;
    c32.head_dim = 32;
    CHECK(q3_kv_pool_init(&p, &c32, Q3_Q8_0, 8, 4, 128) == Q3_OK, "Q8_0 cache of head_dim 32: %s", q3_last_error());
    CHECK(p.row_bytes == (size_t)c32.n_kv_heads * 34 && p.layer_bytes == (size_t)2 * BT * p.row_bytes,
          "Q8_0 row bytes %zu, layer bytes %zu", p.row_bytes, p.layer_bytes);
    CHECK(q3_kv_bytes_per_token(&c32, Q3_Q8_0) == 2 * (size_t)c32.n_layers * p.row_bytes, "Q8_0 bytes per token %zu",
          q3_kv_bytes_per_token(&c32, Q3_Q8_0));
    q3_kv_pool_free(&p);
    CHECK(q3_kv_pool_init(&p, &cfg, Q3_F16, 0, 4, 128) == Q3_ERR_INVALID, "zero blocks refused");
    CHECK(q3_kv_pool_init(&p, &cfg, Q3_F16, 8, 0, 128) == Q3_ERR_INVALID, "zero sequences refused");
    TEST_DONE();
}
