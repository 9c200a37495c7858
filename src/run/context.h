/* A runtime context: the unit instances it opened, the KV pool its
 * sequences live in, and the two planned graphs (prefill chunks of S rows,
 * decode steps of up to max_seqs rows). The public step API (q3.h) is here. */
#ifndef Q3_RUN_CONTEXT_H
#define Q3_RUN_CONTEXT_H

#include "q3.h"
#include "run/executor.h"

struct q3_ctx {
    q3_model *model;
    int n_ctx, chunk, max_seqs;
    q3_unit *opened[3];           /* instances this context owns */
    int n_opened;
    q3_unit *prefill_unit, *decode_unit, *ref_unit; /* views into opened */
    q3_kv_pool kv;
    q3_graph prefill, prefill_all, decode;  /* prefill_all is built on first use */
    q3_runner run_prefill, run_prefill_all, run_decode;
    /* per-row inputs of a run */
    int32_t *row_pos;             /* [max(chunk, max_seqs)] */
    const int32_t **row_table;    /* [max(chunk, max_seqs)] */
    int32_t *row_tokens;          /* [max_seqs] */
    bool *seen;                   /* [max_seqs] step validation */
    const float **handoff_src;    /* [2 * n_layers * chunk] the hand-off's rows: graph outputs ... */
    void **handoff_dst;           /* ... and their cache rows */
    double handoff_seconds;       /* time spent copying prefill K/V into the cache */
    unsigned *seq_epoch;          /* [max_seqs] bumped when a sequence is dropped: a generator of the old one is refused */
    int busy;                     /* atomic: a thread is inside a call that changes the context */
    /* embeddings and scores (run/embed.c): the embed graph, built on first use
       and rebuilt for a longer input or a score head */
    q3_graph embed;
    q3_runner run_embed;
    q3_tensor score_head;         /* [2][dim]: the LM head rows of score_ids (data: score_mem) */
    void *score_mem;
    int32_t score_ids[2];         /* yes, no (-1: none yet) */
    int32_t *embed_tok, *embed_pos; /* [embed.rows] a run's packed tokens and positions */
};

/* One thread at a time (q3.h): a call that finds another thread inside the
 * context fails with Q3_ERR_INVALID instead of corrupting it. q3_ctx_leave
 * after a successful q3_ctx_enter. */
q3_status q3_ctx_enter(q3_ctx *c, const char *what);
void q3_ctx_leave(q3_ctx *c);

/* A runner for g on unit, the reference unit the fallback for ops it refuses. */
q3_status q3_ctx_plan_runner(q3_ctx *c, q3_runner *r, const q3_graph *g, q3_unit *unit);
/* Frees what run/embed.c made. */
void q3_ctx_embed_free(q3_ctx *c);

#endif
