/* Opening a model from a GGUF file (as llama.cpp's converter writes Qwen3):
 * the config from the qwen3.* metadata, the weights bound by llama.cpp's
 * tensor names and checked against that config. The q3_gguf handle (the
 * mapping) is kept in m->gguf and closed by q3_model_close. */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/gguf.h"
#include "model/layout.h"
#include "model/model.h"
#include "util/error.h"

/* ---- the config from metadata -------------------------------------------- */

/* A positive count stored under key (any integer type); fails naming the key. */
static q3_status get_count(const q3_gguf *g, const char *key, int *out)
{
    uint32_t v;
    q3_status st = q3_gguf_get_u32(g, key, &v);
    if (st) return st;
    if (v == 0 || v > (1u << 30))
        return q3_fail(Q3_ERR_INVALID, "%s: metadata key '%s' = %u is out of range", q3_gguf_path(g), key, v);
    *out = (int)v;
    return Q3_OK;
}

/* Like get_count, but def when the key is absent. */
static q3_status get_count_or(const q3_gguf *g, const char *key, int def, int *out)
{
    if (!q3_gguf_find(g, key)) {
        *out = def;
        return Q3_OK;
    }
    return get_count(g, key, out);
}

/* feed_forward_length: a number, or (for some architectures) one per layer,
 * which must then all be equal for a dense Qwen3. */
static q3_status get_ffn(const q3_gguf *g, const char *key, int n_layers, int *out)
{
    const q3_gguf_value *v = q3_gguf_find(g, key);
    if (!v || v->type != Q3_GGUF_ARRAY) return get_count(g, key, out);
    if (v->as.arr.items || v->as.arr.count != (size_t)n_layers || !n_layers)
        return q3_fail(Q3_ERR_FORMAT, "%s: metadata key '%s' is an array, but not of %d numbers (one per layer)",
                       q3_gguf_path(g), key, n_layers);
    int64_t first = q3_gguf_arr_i64(v, 0);
    for (size_t i = 1; i < v->as.arr.count; i++)
        if (q3_gguf_arr_i64(v, i) != first)
            return q3_fail(Q3_ERR_UNSUPPORTED, "%s: '%s' differs between layers; q3 runs dense Qwen3 models only",
                           q3_gguf_path(g), key);
    if (first <= 0 || first > (1 << 30))
        return q3_fail(Q3_ERR_INVALID, "%s: metadata key '%s' = %lld is out of range", q3_gguf_path(g), key,
                       (long long)first);
    *out = (int)first;
    return Q3_OK;
}

/* A readable name for general.file_type (llama_ftype), kept in torch_dtype. */
static const char *file_type_name(uint32_t ft)
{
    switch (ft) {
    case 0: return "float32";
    case 1: return "float16";
    case 2: return "q4_0";
    case 7: return "q8_0";
    case 14: return "q4_k_s";
    case 15: return "q4_k_m";
    case 18: return "q6_k";
    case 32: return "bfloat16";
    default: return "";
    }
}

/* An optional f32 key: *out keeps its value when the key is absent. */
static q3_status opt_f32(const q3_gguf *g, const char *key, float *out)
{
    return q3_gguf_find(g, key) ? q3_gguf_get_f32(g, key, out) : Q3_OK;
}

/* "<arch>.<key>" for the file's architecture ("qwen3" or "qwen3moe"); valid
 * until the next call on this thread. */
static const char *K(const char *arch, const char *key)
{
    static _Thread_local char buf[128];
    snprintf(buf, sizeof buf, "%s.%s", arch, key);
    return buf;
}

/* <arch>.rope.scaling.*: "none" (or absent), or "yarn" with the keys llama.cpp's
 * converter writes (factor, original_context_length) and the optional YaRN betas.
 * Keys that would change the math in ways q3 does not implement are refused. */

static q3_status read_rope_scaling(const q3_gguf *g, const char *arch, q3_config *c)
{
    const char *path = q3_gguf_path(g);
    memset(&c->rope_scaling, 0, sizeof c->rope_scaling);
    const char *type = "none";
    q3_status st;
    if (q3_gguf_find(g, K(arch, "rope.scaling.type")) && (st = q3_gguf_get_str(g, K(arch, "rope.scaling.type"), &type)))
        return st;
    if (!strcmp(type, "none")) return Q3_OK;
    if (strcmp(type, "yarn"))
        return q3_fail(Q3_ERR_UNSUPPORTED, "%s: %s.rope.scaling.type \"%.40s\": q3 implements \"none\" and \"yarn\"",
                       path, arch, type);
    q3_rope_scaling *y = &c->rope_scaling;
    y->type = Q3_ROPE_YARN;
    y->beta_fast = 32;
    y->beta_slow = 1;
    y->truncate = 1;
    y->orig_ctx = c->max_seq_len;
    float one = 1, zero = 0, ext = -1;
    uint32_t orig;
    if ((st = q3_gguf_get_f32(g, K(arch, "rope.scaling.factor"), &y->factor))) return st;
    if (q3_gguf_find(g, K(arch, "rope.scaling.original_context_length"))) {
        if ((st = q3_gguf_get_u32(g, K(arch, "rope.scaling.original_context_length"), &orig))) return st;
        if (orig == 0 || orig > (1u << 30))
            return q3_fail(Q3_ERR_INVALID, "%s: %s.rope.scaling.original_context_length %u is out of range", path, arch,
                           orig);
        y->orig_ctx = (int)orig;
    }
    if ((st = opt_f32(g, K(arch, "rope.scaling.yarn_beta_fast"), &y->beta_fast)) ||
        (st = opt_f32(g, K(arch, "rope.scaling.yarn_beta_slow"), &y->beta_slow)) ||
        (st = opt_f32(g, K(arch, "rope.scaling.attn_factor"), &one)))
        return st;
    if (one != 1)
        return q3_fail(Q3_ERR_UNSUPPORTED, "%s: %s.rope.scaling.attn_factor %g: q3 implements 1 only", path, arch,
                       (double)one);
    if ((st = opt_f32(g, K(arch, "rope.scaling.yarn_attn_factor"), &one))) return st;
    if (one != 1)
        return q3_fail(Q3_ERR_UNSUPPORTED, "%s: %s.rope.scaling.yarn_attn_factor %g: q3 implements 1 only", path, arch,
                       (double)one);
    if ((st = opt_f32(g, K(arch, "rope.scaling.yarn_log_multiplier"), &zero))) return st;
    if (zero != 0)
        return q3_fail(Q3_ERR_UNSUPPORTED, "%s: %s.rope.scaling.yarn_log_multiplier %g: q3 implements 0 only",
                       path, arch, (double)zero);
    if ((st = opt_f32(g, K(arch, "rope.scaling.yarn_ext_factor"), &ext))) return st;
    if (ext != -1 && ext != 1) /* -1: llama.cpp's "default", which is 1 for YaRN */
        return q3_fail(Q3_ERR_UNSUPPORTED, "%s: %s.rope.scaling.yarn_ext_factor %g: q3 implements 1 only", path, arch,
                       (double)ext);
    return Q3_OK;
}

static q3_status read_config(const q3_gguf *g, q3_config *c)
{
    const char *path = q3_gguf_path(g);
    const char *arch;
    q3_status st = q3_gguf_get_str(g, "general.architecture", &arch);
    if (st) return st;
    bool moe = !strcmp(arch, "qwen3moe");
    if (strcmp(arch, "qwen3") && !moe)
        return q3_fail(Q3_ERR_UNSUPPORTED,
                       "%s: general.architecture is \"%.40s\"; q3 runs \"qwen3\" and \"qwen3moe\" models only", path,
                       arch);
    memset(c, 0, sizeof *c);
    if ((st = get_count(g, K(arch, "block_count"), &c->n_layers)) ||
        (st = get_count(g, K(arch, "embedding_length"), &c->dim)))
        return st;
    if (moe) {
        /* every layer a mixture of experts; the dense feed_forward_length is unused */
        c->norm_topk_prob = true; /* llama.cpp's qwen3moe always renormalizes the chosen weights */
        if ((st = get_count(g, K(arch, "expert_count"), &c->n_experts)) ||
            (st = get_count(g, K(arch, "expert_used_count"), &c->n_experts_used)) ||
            (st = get_count(g, K(arch, "expert_feed_forward_length"), &c->expert_ffn_dim)))
            return st;
        if (q3_gguf_find(g, K(arch, "feed_forward_length"))) {
            if ((st = get_ffn(g, K(arch, "feed_forward_length"), c->n_layers, &c->ffn_dim))) return st;
        } else {
            c->ffn_dim = c->expert_ffn_dim;
        }
        if (q3_gguf_find(g, K(arch, "expert_shared_count")) || q3_gguf_find(g, K(arch, "expert_shared_feed_forward_length")))
            return q3_fail(Q3_ERR_UNSUPPORTED, "%s: shared experts (%s.expert_shared_*): no Qwen3 MoE has them", path,
                           arch);
    } else if ((st = get_ffn(g, K(arch, "feed_forward_length"), c->n_layers, &c->ffn_dim))) {
        return st;
    }
    if ((st = get_count(g, K(arch, "attention.head_count"), &c->n_heads)) ||
        (st = get_count_or(g, K(arch, "attention.head_count_kv"), c->n_heads, &c->n_kv_heads)) ||
        (st = get_count_or(g, K(arch, "attention.key_length"), c->dim / c->n_heads, &c->head_dim)) ||
        (st = get_count(g, K(arch, "context_length"), &c->max_seq_len)) ||
        (st = q3_gguf_get_f32(g, K(arch, "rope.freq_base"), &c->rope_theta)) ||
        (st = q3_gguf_get_f32(g, K(arch, "attention.layer_norm_rms_epsilon"), &c->rms_eps)))
        return st;
    if (!(c->rope_theta > 0 && c->rope_theta < 1e30f))
        return q3_fail(Q3_ERR_INVALID, "%s: %s.rope.freq_base %g is out of range", path, arch, c->rope_theta);
    int v_len, rot;
    if ((st = get_count_or(g, K(arch, "attention.value_length"), c->head_dim, &v_len))) return st;
    if (v_len != c->head_dim)
        return q3_fail(Q3_ERR_UNSUPPORTED, "%s: attention.value_length %d differs from key_length %d", path, v_len,
                       c->head_dim);
    if ((st = get_count_or(g, K(arch, "rope.dimension_count"), c->head_dim, &rot))) return st;
    if (rot != c->head_dim)
        return q3_fail(Q3_ERR_UNSUPPORTED, "%s: rope.dimension_count %d: q3 rotates whole heads (%d)", path, rot,
                       c->head_dim);
    if ((st = read_rope_scaling(g, arch, c))) return st;

    /* the vocabulary is as large as the embedding */
    const q3_tensor *embd = q3_gguf_find_tensor(g, q3_embed_layout.gguf);
    if (!embd) return q3_fail(Q3_ERR_FORMAT, "%s: missing tensor \"token_embd.weight\"", path);
    if (embd->ndim != 2 || embd->shape[0] <= 0 || embd->shape[0] > (1 << 24))
        return q3_fail(Q3_ERR_FORMAT, "%s: tensor \"token_embd.weight\" is not a [vocab][dim] matrix", path);
    c->vocab_size = (int)embd->shape[0];
    c->tied_embeddings = q3_gguf_find_tensor(g, q3_lm_head_layout.gguf) == NULL;
    uint32_t ft;
    if (q3_gguf_find(g, "general.file_type") && !q3_gguf_get_u32(g, "general.file_type", &ft))
        snprintf(c->torch_dtype, sizeof c->torch_dtype, "%s", file_type_name(ft));
    return q3_config_validate(c, path);
}

/* ---- weights ------------------------------------------------------------------ */

static q3_status bind(const q3_gguf *g, const q3_config *c, const char *name, const q3_tensor_layout *t,
                      const q3_tensor **out)
{
    int64_t shape[3];
    int ndim = q3_layout_shape(t, c, shape);
    return q3_model_bind_tensor(q3_gguf_path(g), q3_gguf_find_tensor(g, name), name, ndim, shape, out);
}

/* A GGUF's experts are one 3-D tensor: the model's stack is a copy of its
 * descriptor with a view of each matrix. */
static q3_status bind_stack(const q3_gguf *g, q3_model *m, int l, int s, const q3_tensor_layout *t,
                            const q3_tensor **out)
{
    char name[96];
    q3_layout_name(t, l, 0, 1, name, sizeof name);
    const q3_tensor *file;
    q3_status st = bind(g, &m->cfg, name, t, &file);
    if (st) return st;
    q3_tensor *views;
    const q3_tensor **ptrs;
    q3_tensor *stack = q3_model_stack_slot(m, l, s, &views, &ptrs);
    memcpy(stack->name, file->name, sizeof stack->name);
    stack->dtype = file->dtype;
    stack->ndim = 3;
    memcpy(stack->shape, file->shape, sizeof stack->shape);
    stack->data = file->data;
    stack->nbytes = file->nbytes;
    size_t need = (size_t)stack->shape[0] * (size_t)stack->shape[1] *
                  q3_dtype_row_bytes(stack->dtype, (size_t)stack->shape[2]);
    if (need > stack->nbytes)
        return q3_fail(Q3_ERR_FORMAT, "%s: tensor \"%s\" holds %zu bytes, its shape needs %zu", q3_gguf_path(g), name,
                       stack->nbytes, need);
    q3_tensor_stack_fill(stack, views, ptrs);
    *out = stack;
    return Q3_OK;
}

static q3_status bind_weights(const q3_gguf *g, q3_model *m)
{
    const q3_config *c = &m->cfg;
    q3_weights *w = &m->w;
    q3_status st;
    if ((st = bind(g, c, q3_embed_layout.gguf, &q3_embed_layout, &w->embed))) return st;
    if ((st = bind(g, c, q3_out_norm_layout.gguf, &q3_out_norm_layout, &w->out_norm))) return st;
    if (c->tied_embeddings) w->lm_head = w->embed;
    else if ((st = bind(g, c, q3_lm_head_layout.gguf, &q3_lm_head_layout, &w->lm_head))) return st;
    const q3_tensor *cls = q3_gguf_find_tensor(g, "cls.output.weight"); /* a reranker's, when present */
    if (cls) {
        if (cls->ndim != 2 || cls->shape[0] != 2 || cls->shape[1] != c->dim)
            return q3_fail(Q3_ERR_FORMAT, "%s: cls.output.weight is not [2][%d] (a yes/no classifier head)",
                           q3_gguf_path(g), c->dim);
        if (cls->nbytes < 2 * q3_dtype_row_bytes(cls->dtype, (size_t)c->dim))
            return q3_fail(Q3_ERR_FORMAT, "%s: cls.output.weight holds %zu bytes, too few for its shape", q3_gguf_path(g),
                           cls->nbytes);
        w->cls_out = cls;
    }
    w->layers = calloc((size_t)c->n_layers, sizeof *w->layers);
    if (!w->layers) return q3_fail(Q3_ERR_NOMEM, "out of memory");
    if (q3_config_is_moe(c) && (st = q3_model_alloc_stacks(m))) return st;
    const q3_tensor_layout *ts[Q3_LAYER_TENSORS + Q3_MOE_TENSORS];
    int fields[Q3_LAYER_TENSORS + Q3_MOE_TENSORS], n = q3_layer_tensors(c, ts, fields);
    for (int l = 0; l < c->n_layers; l++) {
        const q3_tensor **f = (const q3_tensor **)&w->layers[l]; /* q3_layer_layout, q3_moe_layout order */
        for (int i = 0, s = 0; i < n; i++) {
            if (ts[i]->stack != Q3_DIM_NONE) {
                st = bind_stack(g, m, l, s++, ts[i], &f[fields[i]]);
            } else {
                char name[96];
                q3_layout_name(ts[i], l, 0, 1, name, sizeof name);
                st = bind(g, c, name, ts[i], &f[fields[i]]);
            }
            if (st) return st;
        }
    }
    return Q3_OK;
}

/* Called by q3_model_open for a path ending in .gguf; on failure the caller
 * closes m (and with it m->gguf). */
q3_status q3_model_open_gguf(const char *path, q3_model *m)
{
    q3_gguf *g;
    q3_status st = q3_gguf_open(path, &g);
    if (st) return st;
    m->gguf = g;
    if ((st = read_config(g, &m->cfg))) return st;
    return bind_weights(g, m);
}
