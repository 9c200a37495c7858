/* The session's KV cache: per layer, K and V rows for every position. */
#ifndef Q3_RUN_KV_CACHE_H
#define Q3_RUN_KV_CACHE_H

#include "model/config.h"
#include "model/dtype.h"

typedef struct q3_kv_cache {
    q3_dtype dtype;   /* F32, F16 or BF16 */
    int n_layers;
    int n_ctx;        /* capacity in positions */
    int kv_dim;       /* n_kv_heads * head_dim */
    size_t row_bytes; /* bytes of one position's K (or V) row */
    void *k;          /* [n_layers][n_ctx][kv_dim] of dtype */
    void *v;          /* [n_layers][n_ctx][kv_dim] of dtype */
} q3_kv_cache;

q3_status q3_kv_cache_init(q3_kv_cache *kv, const q3_config *c, int n_ctx, q3_dtype dtype);
void q3_kv_cache_free(q3_kv_cache *kv);

static inline void *q3_kv_k_row(const q3_kv_cache *kv, int layer, int pos)
{
    return (char *)kv->k + ((size_t)layer * (size_t)kv->n_ctx + (size_t)pos) * kv->row_bytes;
}
static inline void *q3_kv_v_row(const q3_kv_cache *kv, int layer, int pos)
{
    return (char *)kv->v + ((size_t)layer * (size_t)kv->n_ctx + (size_t)pos) * kv->row_bytes;
}
size_t q3_kv_cache_bytes_per_token(const q3_config *c, q3_dtype dtype);

#endif
