/* q3 info's work: a model's config, parameters, weight bytes by dtype, KV bytes per token. */
#include "tools/info.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kv/kv_pool.h"
#include "model/model.h"
#include "util/error.h"

static void count_dtype(const q3_tensor *t, size_t *bytes, size_t *count)
{
    if (!t) return; /* a dense model's MoE fields, a MoE model's dense MLP */
    bytes[t->dtype] += t->nbytes;
    count[t->dtype]++;
}

static void count_all(const q3_model *m, size_t *by, size_t *cnt)
{
    count_dtype(m->w.embed, by, cnt);
    count_dtype(m->w.out_norm, by, cnt);
    if (m->w.lm_head != m->w.embed) count_dtype(m->w.lm_head, by, cnt);
    for (int l = 0; l < m->cfg.n_layers; l++) {
        const q3_tensor *const *t = (const q3_tensor *const *)&m->w.layers[l];
        for (size_t i = 0; i < sizeof(q3_layer_weights) / sizeof(void *); i++) count_dtype(t[i], by, cnt);
    }
}

static q3_status info_json(const char *path, const q3_model *m)
{
    const q3_config *c = &m->cfg;
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "schema", "q3.info/1");
    cJSON_AddStringToObject(o, "model", path);
    cJSON_AddNumberToObject(o, "layers", c->n_layers);
    cJSON_AddNumberToObject(o, "hidden", c->dim);
    cJSON_AddNumberToObject(o, "intermediate", c->ffn_dim);
    cJSON_AddNumberToObject(o, "heads", c->n_heads);
    cJSON_AddNumberToObject(o, "kv_heads", c->n_kv_heads);
    cJSON_AddNumberToObject(o, "head_dim", c->head_dim);
    cJSON_AddNumberToObject(o, "vocab", c->vocab_size);
    cJSON_AddNumberToObject(o, "max_context", c->max_seq_len);
    cJSON_AddNumberToObject(o, "rope_theta", c->rope_theta);
    if (c->rope_scaling.type == Q3_ROPE_YARN) {
        cJSON *y = cJSON_AddObjectToObject(o, "rope_scaling");
        cJSON_AddStringToObject(y, "type", "yarn");
        cJSON_AddNumberToObject(y, "factor", c->rope_scaling.factor);
        cJSON_AddNumberToObject(y, "original_context", c->rope_scaling.orig_ctx);
    }
    cJSON_AddNumberToObject(o, "rms_eps", c->rms_eps);
    cJSON_AddBoolToObject(o, "tied_embeddings", c->tied_embeddings);
    /* a GGUF keeps its general.file_type there: named as what it is */
    if (c->torch_dtype[0]) cJSON_AddStringToObject(o, m->gguf ? "file_type" : "torch_dtype", c->torch_dtype);
    if (q3_config_is_moe(c)) {
        cJSON *x = cJSON_AddObjectToObject(o, "experts");
        cJSON_AddNumberToObject(x, "count", c->n_experts);
        cJSON_AddNumberToObject(x, "per_token", c->n_experts_used);
        cJSON_AddNumberToObject(x, "intermediate", c->expert_ffn_dim);
        cJSON_AddBoolToObject(x, "norm_topk_prob", c->norm_topk_prob);
    }
    cJSON_AddNumberToObject(o, "parameters", (double)q3_model_param_count(m));
    cJSON_AddNumberToObject(o, "active_parameters", (double)q3_model_active_params(m));
    cJSON_AddNumberToObject(o, "weight_bytes", (double)q3_model_weight_bytes(m));
    cJSON_AddNumberToObject(o, "active_bytes_per_token", (double)q3_model_active_bytes(m));
    size_t by[Q3_DTYPE_COUNT] = {0}, cnt[Q3_DTYPE_COUNT] = {0};
    count_all(m, by, cnt);
    cJSON *d = cJSON_AddObjectToObject(o, "dtypes");
    for (int k = 0; k < Q3_DTYPE_COUNT; k++)
        if (cnt[k]) {
            cJSON *x = cJSON_AddObjectToObject(d, q3_dtype_name((q3_dtype)k));
            cJSON_AddNumberToObject(x, "tensors", (double)cnt[k]);
            cJSON_AddNumberToObject(x, "bytes", (double)by[k]);
        }
    cJSON *kv = cJSON_AddObjectToObject(o, "kv_bytes_per_token");
    cJSON_AddNumberToObject(kv, "f32", (double)q3_kv_bytes_per_token(c, Q3_F32));
    cJSON_AddNumberToObject(kv, "f16", (double)q3_kv_bytes_per_token(c, Q3_F16));
    if (c->head_dim % 32 == 0) cJSON_AddNumberToObject(kv, "q8_0", (double)q3_kv_bytes_per_token(c, Q3_Q8_0));
    char *text = cJSON_Print(o);
    cJSON_Delete(o);
    if (!text) return q3_fail(Q3_ERR_NOMEM, "out of memory");
    puts(text);
    free(text);
    return Q3_OK;
}

q3_status q3_info_print(const char *path, int json)
{
    q3_model *m;
    q3_status st = q3_model_open(path, &m);
    if (st) return st;
    if (json) {
        st = info_json(path, m);
        q3_model_close(m);
        return st;
    }
    const q3_config *c = &m->cfg;
    printf("model            %s\n", path);
    printf("layers           %d\n", c->n_layers);
    printf("hidden           %d\n", c->dim);
    if (q3_config_is_moe(c))
        printf("experts          %d, %d per token (intermediate %d%s)\n", c->n_experts, c->n_experts_used,
               c->expert_ffn_dim, c->norm_topk_prob ? ", chosen weights renormalized" : "");
    else
        printf("intermediate     %d\n", c->ffn_dim);
    printf("heads / kv heads %d / %d (head_dim %d)\n", c->n_heads, c->n_kv_heads, c->head_dim);
    printf("vocab            %d\n", c->vocab_size);
    printf("max context      %d\n", c->max_seq_len);
    printf("rope theta       %g\n", c->rope_theta);
    if (c->rope_scaling.type == Q3_ROPE_YARN)
        printf("rope scaling     yarn, factor %g, original context %d\n", (double)c->rope_scaling.factor,
               c->rope_scaling.orig_ctx);
    printf("rms eps          %g\n", c->rms_eps);
    printf("tied embeddings  %s\n", c->tied_embeddings ? "yes" : "no");
    if (m->gguf) printf("file type        %s\n", c->torch_dtype[0] ? c->torch_dtype : "(not given)");
    else printf("torch_dtype      %s\n", c->torch_dtype[0] ? c->torch_dtype : "(not given)");
    size_t params = q3_model_param_count(m), bytes = q3_model_weight_bytes(m);
    printf("parameters       %zu (%.3f B)\n", params, (double)params / 1e9);
    printf("weight bytes     %zu (%.3f GB)\n", bytes, (double)bytes / 1e9);
    size_t a_params = q3_model_active_params(m), a_bytes = q3_model_active_bytes(m);
    printf("active / token   %zu parameters (%.3f B), %zu bytes (%.3f GB) read\n", a_params, (double)a_params / 1e9,
           a_bytes, (double)a_bytes / 1e9);
    size_t by[Q3_DTYPE_COUNT] = {0}, cnt[Q3_DTYPE_COUNT] = {0};
    count_all(m, by, cnt);
    for (int d = 0; d < Q3_DTYPE_COUNT; d++)
        if (cnt[d]) printf("  %-6s         %zu tensors, %zu bytes\n", q3_dtype_name((q3_dtype)d), cnt[d], by[d]);
    printf("KV cache / token %zu bytes F32, %zu bytes F16/BF16", q3_kv_bytes_per_token(c, Q3_F32), q3_kv_bytes_per_token(c, Q3_F16));
    if (c->head_dim % 32 == 0) printf(", %zu bytes Q8_0", q3_kv_bytes_per_token(c, Q3_Q8_0));
    printf("\n");
    q3_model_close(m);
    return Q3_OK;
}
