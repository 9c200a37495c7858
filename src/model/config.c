#include "model/config.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/error.h"
#include "util/json_check.h"
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

/* Accepts model_type "qwen3" / "qwen3_moe", or architectures naming
 * Qwen3ForCausalLM / Qwen3MoeForCausalLM; *moe says which. */
static q3_status check_architecture(const cJSON *root, const char *path, bool *moe)
{
    const cJSON *mt = cJSON_GetObjectItemCaseSensitive(root, "model_type");
    const cJSON *arch = cJSON_GetObjectItemCaseSensitive(root, "architectures");
    const char *found = NULL;
    if (cJSON_IsString(mt)) {
        if (!strcmp(mt->valuestring, "qwen3") || !strcmp(mt->valuestring, "qwen3_moe")) {
            *moe = !strcmp(mt->valuestring, "qwen3_moe");
            return Q3_OK;
        }
        found = mt->valuestring;
    }
    if (cJSON_IsArray(arch)) {
        const cJSON *a;
        cJSON_ArrayForEach(a, arch) {
            if (!cJSON_IsString(a) || found) continue;
            if (!strcmp(a->valuestring, "Qwen3ForCausalLM") || !strcmp(a->valuestring, "Qwen3MoeForCausalLM")) {
                *moe = !strcmp(a->valuestring, "Qwen3MoeForCausalLM");
                return Q3_OK;
            }
            found = a->valuestring;
        }
    }
    if (found)
        return q3_fail(Q3_ERR_UNSUPPORTED,
                       "%s: architecture \"%s\" is not Qwen3 (q3 runs Qwen3 models: model_type \"qwen3\" or "
                       "\"qwen3_moe\")",
                       path, found);
    return q3_fail(Q3_ERR_FORMAT, "%s: no \"model_type\" or \"architectures\" field", path);
}

/* The mixture-of-experts fields of a qwen3_moe config. Every layer must be a
 * MoE layer: dense layers mixed in (mlp_only_layers, decoder_sparse_step > 1)
 * are refused, as no released Qwen3 MoE has them. The training-only fields
 * (router_aux_loss_coef, output_router_logits) are ignored. */
static q3_status parse_moe(const cJSON *root, const char *path, q3_config *c)
{
    q3_status st;
    if ((st = get_int(root, path, "num_experts", &c->n_experts, 1, 0)) ||
        (st = get_int(root, path, "num_experts_per_tok", &c->n_experts_used, 1, 0)) ||
        (st = get_int(root, path, "moe_intermediate_size", &c->expert_ffn_dim, 1, 0)))
        return st;
    const cJSON *norm = cJSON_GetObjectItemCaseSensitive(root, "norm_topk_prob");
    if (norm && !cJSON_IsNull(norm) && !cJSON_IsBool(norm))
        return q3_fail(Q3_ERR_FORMAT, "%s: field \"norm_topk_prob\" must be true or false", path);
    c->norm_topk_prob = norm && cJSON_IsTrue(norm); /* transformers' default is false */
    int step;
    if ((st = get_int(root, path, "decoder_sparse_step", &step, 0, 1))) return st;
    if (step != 1)
        return q3_fail(Q3_ERR_UNSUPPORTED,
                       "%s: field \"decoder_sparse_step\" is %d: q3 runs Qwen3 MoE models whose every layer is a "
                       "mixture of experts (1)",
                       path, step);
    const cJSON *mlp_only = cJSON_GetObjectItemCaseSensitive(root, "mlp_only_layers");
    if (mlp_only && !cJSON_IsNull(mlp_only) && !(cJSON_IsArray(mlp_only) && cJSON_GetArraySize(mlp_only) == 0))
        return q3_fail(Q3_ERR_UNSUPPORTED,
                       "%s: field \"mlp_only_layers\" is not empty: q3 does not implement dense layers inside a "
                       "mixture-of-experts model",
                       path);
    return Q3_OK;
}

/* ---- fields that change the math ------------------------------------------ */

/* A field q3 implements at one value only: absent, null, or that value. */
static q3_status check_bool_off(const cJSON *root, const char *path, const char *key, const char *what)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, key);
    if (!v || cJSON_IsNull(v) || cJSON_IsFalse(v)) return Q3_OK;
    return q3_fail(Q3_ERR_UNSUPPORTED, "%s: field \"%s\" is %s: q3 does not implement %s", path, key,
                   cJSON_IsTrue(v) ? "true" : "not false", what);
}

static q3_status check_unimplemented(const cJSON *root, const char *path)
{
    q3_status st;
    if ((st = check_bool_off(root, path, "attention_bias", "biases on the attention projections")) ||
        (st = check_bool_off(root, path, "mlp_bias", "biases on the MLP projections")) ||
        (st = check_bool_off(root, path, "use_sliding_window", "sliding-window attention")))
        return st;
    const cJSON *act = cJSON_GetObjectItemCaseSensitive(root, "hidden_act");
    if (act && !cJSON_IsNull(act) && !(cJSON_IsString(act) && !strcmp(act->valuestring, "silu")))
        return q3_fail(Q3_ERR_UNSUPPORTED, "%s: field \"hidden_act\" is %s%.40s%s: q3 implements \"silu\" only", path,
                       cJSON_IsString(act) ? "\"" : "not a string", cJSON_IsString(act) ? act->valuestring : "",
                       cJSON_IsString(act) ? "\"" : "");
    const cJSON *prf = cJSON_GetObjectItemCaseSensitive(root, "partial_rotary_factor");
    if (prf && !cJSON_IsNull(prf) && !(cJSON_IsNumber(prf) && prf->valuedouble == 1.0))
        return q3_fail(Q3_ERR_UNSUPPORTED, "%s: field \"partial_rotary_factor\" is not 1: q3 rotates whole heads",
                       path);
    const cJSON *lt = cJSON_GetObjectItemCaseSensitive(root, "layer_types"), *e;
    if (lt && !cJSON_IsNull(lt)) {
        if (!cJSON_IsArray(lt))
            return q3_fail(Q3_ERR_FORMAT, "%s: field \"layer_types\" must be a list", path);
        cJSON_ArrayForEach(e, lt) if (!cJSON_IsString(e) || strcmp(e->valuestring, "full_attention"))
            return q3_fail(Q3_ERR_UNSUPPORTED,
                           "%s: field \"layer_types\" has a layer that is not \"full_attention\": q3 does not "
                           "implement sliding-window attention",
                           path);
    }
    return Q3_OK;
}

/* A positive finite number member of the rope object: *present says whether it was given. */
static q3_status rope_number(const cJSON *obj, const char *path, const char *field, const char *key,
                             double *out, int *present)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    *present = v && !cJSON_IsNull(v);
    if (!*present) return Q3_OK;
    if (!cJSON_IsNumber(v) || !(v->valuedouble > 0) || !isfinite(v->valuedouble) || v->valuedouble > 1e9)
        return q3_fail(Q3_ERR_INVALID, "%s: field \"%s.%s\" must be a positive number", path, field, key);
    *out = v->valuedouble;
    return Q3_OK;
}

/* "rope_scaling" (or transformers 5's "rope_parameters"): none, "default", or YaRN. */
static q3_status parse_rope(const cJSON *root, const char *path, q3_config *c)
{
    const char *field = "rope_scaling";
    const cJSON *obj = cJSON_GetObjectItemCaseSensitive(root, field);
    if (!obj || cJSON_IsNull(obj)) {
        field = "rope_parameters";
        obj = cJSON_GetObjectItemCaseSensitive(root, field);
    }
    memset(&c->rope_scaling, 0, sizeof c->rope_scaling);
    if (!obj || cJSON_IsNull(obj)) return Q3_OK;
    if (!cJSON_IsObject(obj)) return q3_fail(Q3_ERR_FORMAT, "%s: field \"%s\" must be an object or null", path, field);

    static const char *const known[] = {"rope_type", "type", "factor", "original_max_position_embeddings",
                                        "beta_fast", "beta_slow", "attention_factor", "mscale", "mscale_all_dim",
                                        "truncate", "rope_theta", NULL};
    for (const cJSON *m = obj->child; m; m = m->next) {
        int ok = 0;
        for (int k = 0; known[k] && !ok; k++) ok = !strcmp(m->string, known[k]);
        if (!ok)
            return q3_fail(Q3_ERR_UNSUPPORTED, "%s: field \"%s.%.40s\" is not one q3 implements", path, field,
                           m->string);
    }
    q3_status st;
    double v;
    int present;
    /* transformers 5 keeps rope_theta here */
    if ((st = rope_number(obj, path, field, "rope_theta", &v, &present))) return st;
    if (present && !cJSON_GetObjectItemCaseSensitive(root, "rope_theta")) c->rope_theta = (float)v;

    const cJSON *type = cJSON_GetObjectItemCaseSensitive(obj, "rope_type");
    if (!type || cJSON_IsNull(type)) type = cJSON_GetObjectItemCaseSensitive(obj, "type");
    if (!cJSON_IsString(type))
        return q3_fail(Q3_ERR_FORMAT, "%s: field \"%s\" has no \"rope_type\" string", path, field);
    if (!strcmp(type->valuestring, "default")) return Q3_OK;
    if (strcmp(type->valuestring, "yarn"))
        return q3_fail(Q3_ERR_UNSUPPORTED,
                       "%s: field \"%s\" has rope_type \"%.40s\": q3 implements \"default\" and \"yarn\"", path,
                       field, type->valuestring);

    q3_rope_scaling *y = &c->rope_scaling;
    y->type = Q3_ROPE_YARN;
    y->orig_ctx = c->max_seq_len;
    y->beta_fast = 32;
    y->beta_slow = 1;
    y->truncate = 1;
    if ((st = rope_number(obj, path, field, "original_max_position_embeddings", &v, &present))) return st;
    if (present) {
        if (v != floor(v))
            return q3_fail(Q3_ERR_INVALID, "%s: field \"%s.original_max_position_embeddings\" must be an integer",
                           path, field);
        y->orig_ctx = (int)v;
    }
    int has_orig = present;
    if ((st = rope_number(obj, path, field, "factor", &v, &present))) return st;
    if (present) y->factor = (float)v;
    else if (has_orig) y->factor = (float)c->max_seq_len / (float)y->orig_ctx; /* transformers does this */
    else return q3_fail(Q3_ERR_FORMAT, "%s: field \"%s\" (yarn) has no \"factor\"", path, field);
    if (!(y->factor >= 1))
        return q3_fail(Q3_ERR_INVALID, "%s: field \"%s.factor\" is %g: YaRN needs a factor of at least 1", path,
                       field, (double)y->factor);
    if ((st = rope_number(obj, path, field, "beta_fast", &v, &present))) return st;
    if (present) y->beta_fast = (float)v;
    if ((st = rope_number(obj, path, field, "beta_slow", &v, &present))) return st;
    if (present) y->beta_slow = (float)v;
    if ((st = rope_number(obj, path, field, "attention_factor", &v, &present))) return st;
    if (present) y->attn_factor = (float)v;
    if ((st = rope_number(obj, path, field, "mscale", &v, &present))) return st;
    if (present) y->mscale = (float)v;
    if ((st = rope_number(obj, path, field, "mscale_all_dim", &v, &present))) return st;
    if (present) y->mscale_all_dim = (float)v;
    const cJSON *tr = cJSON_GetObjectItemCaseSensitive(obj, "truncate");
    if (tr && !cJSON_IsNull(tr)) {
        if (!cJSON_IsBool(tr))
            return q3_fail(Q3_ERR_FORMAT, "%s: field \"%s.truncate\" must be true or false", path, field);
        y->truncate = cJSON_IsTrue(tr);
    }
    return Q3_OK;
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
    const char *dup = q3_json_duplicate_key(root);
    if (dup) {
        st = q3_fail(Q3_ERR_FORMAT, "%s: key \"%.60s\" appears twice in one object", path, dup);
        goto done;
    }
    bool moe = false;
    if ((st = check_architecture(root, path, &moe))) goto done;
    if ((st = check_unimplemented(root, path))) goto done;
    if ((st = get_int(root, path, "num_hidden_layers", &c->n_layers, 1, 0))) goto done;
    if ((st = get_int(root, path, "hidden_size", &c->dim, 1, 0))) goto done;
    if (moe && (st = parse_moe(root, path, c))) goto done;
    /* a MoE model's dense intermediate_size is unused (and optional) */
    if ((st = get_int(root, path, "intermediate_size", &c->ffn_dim, !moe, c->expert_ffn_dim))) goto done;
    if ((st = get_int(root, path, "num_attention_heads", &c->n_heads, 1, 0))) goto done;
    if ((st = get_int(root, path, "num_key_value_heads", &c->n_kv_heads, 0, c->n_heads))) goto done;
    if ((st = get_int(root, path, "vocab_size", &c->vocab_size, 1, 0))) goto done;
    if ((st = get_int(root, path, "head_dim", &c->head_dim, 0, c->dim / c->n_heads))) goto done;
    if ((st = get_int(root, path, "max_position_embeddings", &c->max_seq_len, 0, 40960))) goto done;
    if ((st = get_float(root, path, "rms_norm_eps", &c->rms_eps, 1e-6f))) goto done;
    if ((st = get_float(root, path, "rope_theta", &c->rope_theta, 1e6f))) goto done;
    if ((st = parse_rope(root, path, c))) goto done;
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
    if (c->n_experts < 0 || c->n_experts > 4096 ||
        (c->n_experts && (c->n_experts_used < 1 || c->n_experts_used > c->n_experts || c->expert_ffn_dim < 1 ||
                          c->expert_ffn_dim > (1 << 22))))
        return q3_fail(Q3_ERR_INVALID,
                       "%s: mixture-of-experts sizes out of range (%d experts, %d per token, expert intermediate "
                       "size %d; 1 <= per token <= experts <= 4096)",
                       src, c->n_experts, c->n_experts_used, c->expert_ffn_dim);
    if (!(c->rms_eps > 0 && c->rms_eps < 1))
        return q3_fail(Q3_ERR_INVALID, "%s: rms_norm_eps %g is out of range", src, c->rms_eps);
    if (!(c->rope_theta > 0 && isfinite(c->rope_theta)))
        return q3_fail(Q3_ERR_INVALID, "%s: rope_theta %g is not a finite positive number", src, c->rope_theta);
    const q3_rope_scaling *y = &c->rope_scaling;
    if (y->type != Q3_ROPE_NONE && y->type != Q3_ROPE_YARN)
        return q3_fail(Q3_ERR_INVALID, "%s: unknown RoPE scaling type %d", src, y->type);
    if (y->type == Q3_ROPE_YARN &&
        (!(y->factor >= 1 && y->factor <= 1e6f) || y->orig_ctx <= 0 || !(y->beta_fast > 0 && y->beta_fast < 1e9f) ||
         !(y->beta_slow > 0 && y->beta_slow < 1e9f) || !(y->attn_factor >= 0 && y->attn_factor < 1e9f) ||
         !(y->mscale >= 0 && y->mscale < 1e9f) || !(y->mscale_all_dim >= 0 && y->mscale_all_dim < 1e9f)))
        return q3_fail(Q3_ERR_INVALID,
                       "%s: YaRN parameters out of range (factor %g >= 1, original context %d > 0, beta_fast %g, "
                       "beta_slow %g > 0)",
                       src, (double)y->factor, y->orig_ctx, (double)y->beta_fast, (double)y->beta_slow);
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
