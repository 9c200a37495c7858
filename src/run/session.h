/* A session: the KV cache, the position, and the two planned graphs. */
#ifndef Q3_RUN_SESSION_H
#define Q3_RUN_SESSION_H

#include "run/executor.h"

struct q3_session {
    q3_model *model;
    int n_ctx, chunk;
    int pos;                      /* tokens in the cache */
    q3_kv_cache kv;
    const q3_backend *prefill_unit, *decode_unit;
    q3_graph prefill, prefill_all, decode;  /* prefill_all is built on first use */
    q3_runner run_prefill, run_prefill_all, run_decode;
    int32_t *chunk_tokens;        /* [chunk] */
    const float **handoff_src;    /* [2 * n_layers * chunk] the hand-off's rows: graph outputs ... */
    void **handoff_dst;           /* ... and their cache rows */
    double handoff_seconds;       /* time spent copying prefill K/V into the cache */
};

/* Builds the unit list for a plan: the chosen unit, then the reference unit
 * as the fallback for ops it refuses. Returns the count. */
int q3_session_units(const q3_backend *preferred, const q3_backend **units);

#endif
