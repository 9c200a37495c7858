#include "run/kv_cache.h"

#include <stdlib.h>
#include <string.h>

#include "util/error.h"

size_t q3_kv_cache_bytes_per_token(const q3_config *c, q3_dtype dtype)
{
    return 2 * (size_t)c->n_layers * (size_t)c->n_kv_heads * (size_t)c->head_dim * q3_dtype_block_bytes(dtype);
}

q3_status q3_kv_cache_init(q3_kv_cache *kv, const q3_config *c, int n_ctx, q3_dtype dtype)
{
    memset(kv, 0, sizeof *kv);
    if (dtype != Q3_F32 && dtype != Q3_F16 && dtype != Q3_BF16)
        return q3_fail(Q3_ERR_INVALID, "KV cache dtype %s is not supported (f32, f16, bf16)", q3_dtype_name(dtype));
    kv->dtype = dtype;
    kv->n_layers = c->n_layers;
    kv->n_ctx = n_ctx;
    kv->kv_dim = c->n_kv_heads * c->head_dim;
    kv->row_bytes = (size_t)kv->kv_dim * q3_dtype_block_bytes(dtype);
    size_t bytes = (size_t)c->n_layers * (size_t)n_ctx * kv->row_bytes;
    /* calloc: pages are touched only as positions fill */
    kv->k = calloc(1, bytes);
    kv->v = calloc(1, bytes);
    if (!kv->k || !kv->v) {
        q3_kv_cache_free(kv);
        return q3_fail(Q3_ERR_NOMEM, "cannot allocate a KV cache of 2 x %zu bytes (context %d)", bytes, n_ctx);
    }
    return Q3_OK;
}

void q3_kv_cache_free(q3_kv_cache *kv)
{
    free(kv->k);
    free(kv->v);
    memset(kv, 0, sizeof *kv);
}
