#include "model/config.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/error.h"
#include "util/file.h"

/* ---- field readers: every failure names the file and the field ------------ */

static q3_status get_int(const cJSON *root, const char *path, const char *key, int *out,
                         int required, int dflt)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, key);
    if (!v || cJSON_IsNull(v)) {
        if (required) return q3_fail(Q3_ERR_FORMAT, "%s: missing field \"%s\"", path, key);
        *out = dflt;
        return Q3_OK;
    }
    if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble))
        return q3_fail(Q3_ERR_FORMAT, "%s: field \"%s\" must be an integer", path, key);
    if (v->valuedouble <= 0 || v->valuedouble > 1e9)
        return q3_fail(Q3_ERR_INVALID, "%s: field \"%s\" = %g is out of range (must be 1..1e9)",
                       path, key, v->valuedouble);
    *out = (int)v->valuedouble;
    return Q3_OK;
}

static q3_status get_float(const cJSON *root, const char *path, const char *key, float *out,
                           float dflt)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, key);
    if (!v || cJSON_IsNull(v)) {
        *out = dflt;
        return Q3_OK;
    }
    if (!cJSON_IsNumber(v) || !(v->valuedouble > 0) || !isfinite(v->valuedouble))
        return q3_fail(Q3_ERR_INVALID, "%s: field \"%s\" must be a positive number", path, key);
    /* The value is kept as a float: 1e39 would become inf, 1e-50 zero. */
    float f = (float)v->valuedouble;
    if (!(f > 0) || !isfinite(f))
        return q3_fail(Q3_ERR_INVALID, "%s: field \"%s\" = %g is out of a float's range", path, key,
                       v->valuedouble);
    *out = f;
    return Q3_OK;
}

/* Accepts model_type "qwen3" or architectures containing "Qwen3ForCausalLM". */
static q3_status check_architecture(const cJSON *root, const char *path)
{
    const cJSON *mt = cJSON_GetObjectItemCaseSensitive(root, "model_type");
    const cJSON *arch = cJSON_GetObjectItemCaseSensitive(root, "architectures");
    const char *found = NULL;
    if (cJSON_IsString(mt)) {
        if (!strcmp(mt->valuestring, "qwen3")) return Q3_OK;
        found = mt->valuestring;
    }
    if (cJSON_IsArray(arch)) {
        const cJSON *a;
        cJSON_ArrayForEach(a, arch) {
            if (cJSON_IsString(a) && !strcmp(a->valuestring, "Qwen3ForCausalLM") && !found) return Q3_OK;
            if (cJSON_IsString(a) && !found) found = a->valuestring;
        }
    }
    if (found)
        return q3_fail(Q3_ERR_UNSUPPORTED,
                       "%s: architecture \"%s\" is not Qwen3 (q3 runs dense Qwen3 models: model_type \"qwen3\")",
                       path, found);
    return q3_fail(Q3_ERR_FORMAT, "%s: no \"model_type\" or \"architectures\" field", path);
}

q3_status q3_config_parse_json(const char *text, const char *path, q3_config *c)
{
    memset(c, 0, sizeof *c);
    cJSON *root = cJSON_Parse(text);
    if (!root) {
        const char *at = cJSON_GetErrorPtr();
        return q3_fail(Q3_ERR_FORMAT, "%s: malformed JSON (near byte %ld)", path,
                       at ? (long)(at - text) : -1L);
    }
    q3_status st = Q3_OK;
    if (!cJSON_IsObject(root)) {
        st = q3_fail(Q3_ERR_FORMAT, "%s: top level is not a JSON object", path);
        goto done;
    }
    if ((st = check_architecture(root, path))) goto done;
    if ((st = get_int(root, path, "num_hidden_layers", &c->n_layers, 1, 0))) goto done;
    if ((st = get_int(root, path, "hidden_size", &c->dim, 1, 0))) goto done;
    if ((st = get_int(root, path, "intermediate_size", &c->ffn_dim, 1, 0))) goto done;
    if ((st = get_int(root, path, "num_attention_heads", &c->n_heads, 1, 0))) goto done;
    if ((st = get_int(root, path, "num_key_value_heads", &c->n_kv_heads, 0, c->n_heads))) goto done;
    if ((st = get_int(root, path, "vocab_size", &c->vocab_size, 1, 0))) goto done;
    if ((st = get_int(root, path, "head_dim", &c->head_dim, 0, c->dim / c->n_heads))) goto done;
    if ((st = get_int(root, path, "max_position_embeddings", &c->max_seq_len, 0, 40960))) goto done;
    if ((st = get_float(root, path, "rms_norm_eps", &c->rms_eps, 1e-6f))) goto done;
    if ((st = get_float(root, path, "rope_theta", &c->rope_theta, 1e6f))) goto done;
    const cJSON *tie = cJSON_GetObjectItemCaseSensitive(root, "tie_word_embeddings");
    if (tie && !cJSON_IsBool(tie) && !cJSON_IsNull(tie)) {
        st = q3_fail(Q3_ERR_FORMAT, "%s: field \"tie_word_embeddings\" must be true or false", path);
        goto done;
    }
    c->tied_embeddings = tie ? cJSON_IsTrue(tie) : false;
    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(root, "torch_dtype");
    if (!dt) dt = cJSON_GetObjectItemCaseSensitive(root, "dtype");
    if (dt && cJSON_IsString(dt)) snprintf(c->torch_dtype, sizeof c->torch_dtype, "%s", dt->valuestring);
    st = q3_config_validate(c, path);
done:
    cJSON_Delete(root);
    return st;
}

q3_status q3_config_validate(const q3_config *c, const char *src)
{
    if (c->n_layers <= 0 || c->dim <= 0 || c->ffn_dim <= 0 || c->n_heads <= 0 || c->n_kv_heads <= 0 ||
        c->head_dim <= 0 || c->vocab_size <= 0 || c->max_seq_len <= 0)
        return q3_fail(Q3_ERR_INVALID, "%s: every size must be positive", src);
    if (c->n_heads % c->n_kv_heads)
        return q3_fail(Q3_ERR_INVALID,
                       "%s: num_attention_heads (%d) is not divisible by num_key_value_heads (%d)", src,
                       c->n_heads, c->n_kv_heads);
    if (c->head_dim % 2)
        return q3_fail(Q3_ERR_INVALID, "%s: head_dim (%d) must be even for RoPE", src, c->head_dim);
    if ((long long)c->n_heads * c->head_dim > (1 << 20) || c->dim > (1 << 20) || c->ffn_dim > (1 << 22) ||
        c->n_layers > 4096 || c->vocab_size > (1 << 24))
        return q3_fail(Q3_ERR_INVALID, "%s: sizes are implausibly large for a Qwen3 model", src);
    if (!(c->rms_eps > 0 && c->rms_eps < 1))
        return q3_fail(Q3_ERR_INVALID, "%s: rms_norm_eps %g is out of range", src, c->rms_eps);
    if (!(c->rope_theta > 0 && isfinite(c->rope_theta)))
        return q3_fail(Q3_ERR_INVALID, "%s: rope_theta %g is not a finite positive number", src, c->rope_theta);
    return Q3_OK;
}

q3_status q3_config_load(const char *path, q3_config *out)
{
    char *text;
    q3_status st = q3_read_file(path, 1 << 20, &text, NULL);
    if (st) return st;
    st = q3_config_parse_json(text, path, out);
    free(text);
    return st;
}
