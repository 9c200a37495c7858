/* Invariants of a q3_model that opened: shared by the targets that open models
 * (fuzz_safetensors, fuzz_shard_index, fuzz_gguf). */
#ifndef Q3_FUZZ_MODEL_H
#define Q3_FUZZ_MODEL_H

#include "fuzz_common.h"
#include "model/config.h"
#include "model/dtype.h"
#include "model/model.h"
#include "tools/safetensors_write.h"

/* Reads every byte of t (so that a view outside its mapping faults here) and
 * checks dtype, shape against the config, and nbytes against dtype x shape. */
static void fuzz_check_weight(const q3_model *m, const q3_tensor *t, const char *what, int ndim, int64_t d0,
                              int64_t d1)
{
    FUZZ_CHECK(t != NULL, "%s: bound to NULL", what);
    if (!t) return;
    FUZZ_CHECK(t->ndim == ndim, "%s: ndim %d, expected %d", what, t->ndim, ndim);
    FUZZ_CHECK(t->shape[0] == d0 && (ndim < 2 || t->shape[1] == d1), "%s: shape [%lld, %lld], expected [%lld, %lld]",
               what, (long long)t->shape[0], (long long)(ndim > 1 ? t->shape[1] : 0), (long long)d0,
               (long long)d1);
    FUZZ_CHECK((unsigned)t->dtype < Q3_DTYPE_COUNT, "%s: dtype %d", what, (int)t->dtype);
    if ((unsigned)t->dtype >= Q3_DTYPE_COUNT || t->ndim != ndim) return;
    size_t rows = ndim == 2 ? (size_t)d0 : 1, cols = ndim == 2 ? (size_t)d1 : (size_t)d0;
    FUZZ_CHECK(cols % q3_dtype_block_values(t->dtype) == 0, "%s: rows of %zu are not whole blocks", what, cols);
    size_t want = rows * q3_dtype_row_bytes(t->dtype, cols);
    FUZZ_CHECK(t->nbytes == want, "%s: %zu bytes, dtype x shape says %zu", what, t->nbytes, want);
    int inside = m->gguf != NULL; /* GGUF views are checked by fuzz_gguf against the file */
    for (int i = 0; i < m->n_files && !inside; i++) {
        const uint8_t *b = m->files[i].map.data;
        const uint8_t *p = t->data;
        inside = b && p >= b && t->nbytes <= m->files[i].map.size && (size_t)(p - b) <= m->files[i].map.size - t->nbytes;
    }
    FUZZ_CHECK(inside, "%s: data lies outside every mapped file", what);
    volatile unsigned sum = 0;
    const uint8_t *p = t->data;
    for (size_t i = 0; i < t->nbytes; i++) sum += p[i];
    (void)sum;
}

static void fuzz_check_model(const q3_model *m)
{
    const q3_config *c = &m->cfg;
    FUZZ_CHECK(q3_config_validate(c, "fuzz") == Q3_OK, "an opened model's config fails validation: %s",
               q3_last_error());
    FUZZ_CHECK(q3_model_vocab_size(m) == c->vocab_size && q3_model_max_context(m) == c->max_seq_len,
               "public accessors disagree with the config");
    int64_t q_dim = (int64_t)c->n_heads * c->head_dim, kv_dim = (int64_t)c->n_kv_heads * c->head_dim;
    const q3_weights *w = &m->w;
    fuzz_check_weight(m, w->embed, "embed", 2, c->vocab_size, c->dim);
    fuzz_check_weight(m, w->out_norm, "out_norm", 1, c->dim, 0);
    fuzz_check_weight(m, w->lm_head, "lm_head", 2, c->vocab_size, c->dim);
    FUZZ_CHECK(!c->tied_embeddings || w->lm_head == w->embed, "tied embeddings, but lm_head is not embed");
    FUZZ_CHECK(w->layers != NULL, "no layers");
    if (!w->layers) return;
    for (int l = 0; l < c->n_layers; l++) {
        const q3_layer_weights *L = &w->layers[l];
        fuzz_check_weight(m, L->attn_norm, "attn_norm", 1, c->dim, 0);
        fuzz_check_weight(m, L->wq, "wq", 2, q_dim, c->dim);
        fuzz_check_weight(m, L->wk, "wk", 2, kv_dim, c->dim);
        fuzz_check_weight(m, L->wv, "wv", 2, kv_dim, c->dim);
        fuzz_check_weight(m, L->wo, "wo", 2, c->dim, q_dim);
        fuzz_check_weight(m, L->q_norm, "q_norm", 1, c->head_dim, 0);
        fuzz_check_weight(m, L->k_norm, "k_norm", 1, c->head_dim, 0);
        fuzz_check_weight(m, L->ffn_norm, "ffn_norm", 1, c->dim, 0);
        fuzz_check_weight(m, L->w_gate, "w_gate", 2, c->ffn_dim, c->dim);
        fuzz_check_weight(m, L->w_up, "w_up", 2, c->ffn_dim, c->dim);
        fuzz_check_weight(m, L->w_down, "w_down", 2, c->dim, c->ffn_dim);
    }
    /* Norms are float: the kernels read them as F32/F16/BF16. */
    for (int l = 0; l < c->n_layers; l++) {
        const q3_tensor *norms[] = {w->layers[l].attn_norm, w->layers[l].ffn_norm, w->layers[l].q_norm,
                                    w->layers[l].k_norm, l ? NULL : w->out_norm};
        for (size_t i = 0; i < sizeof norms / sizeof norms[0]; i++)
            FUZZ_CHECK(!norms[i] || norms[i]->dtype <= Q3_BF16, "layer %d: a norm tensor is quantized", l);
    }
}

/* ---- the micro model of FUZZ_MICRO_CONFIG ----------------------------------- */

typedef struct fuzz_micro_tensor {
    const char *hf, *gguf; /* names in safetensors and in GGUF */
    int ndim;
    int64_t shape[2];
} fuzz_micro_tensor;

static const fuzz_micro_tensor fuzz_micro[] = {
    {"model.embed_tokens.weight", "token_embd.weight", 2, {16, 8}},
    {"model.norm.weight", "output_norm.weight", 1, {8, 0}},
    {"model.layers.0.input_layernorm.weight", "blk.0.attn_norm.weight", 1, {8, 0}},
    {"model.layers.0.self_attn.q_proj.weight", "blk.0.attn_q.weight", 2, {8, 8}},
    {"model.layers.0.self_attn.k_proj.weight", "blk.0.attn_k.weight", 2, {4, 8}},
    {"model.layers.0.self_attn.v_proj.weight", "blk.0.attn_v.weight", 2, {4, 8}},
    {"model.layers.0.self_attn.o_proj.weight", "blk.0.attn_output.weight", 2, {8, 8}},
    {"model.layers.0.self_attn.q_norm.weight", "blk.0.attn_q_norm.weight", 1, {4, 0}},
    {"model.layers.0.self_attn.k_norm.weight", "blk.0.attn_k_norm.weight", 1, {4, 0}},
    {"model.layers.0.post_attention_layernorm.weight", "blk.0.ffn_norm.weight", 1, {8, 0}},
    {"model.layers.0.mlp.gate_proj.weight", "blk.0.ffn_gate.weight", 2, {16, 8}},
    {"model.layers.0.mlp.up_proj.weight", "blk.0.ffn_up.weight", 2, {16, 8}},
    {"model.layers.0.mlp.down_proj.weight", "blk.0.ffn_down.weight", 2, {8, 16}},
};
#define FUZZ_MICRO_N (sizeof fuzz_micro / sizeof fuzz_micro[0])

/* Writes tensors [first, first + n) of the micro model (plus lm_head when
 * with_head) as a safetensors file of dtype dt, with small deterministic values,
 * through the project's writer. */
static q3_status fuzz_write_micro_st(const char *path, size_t first, size_t n, int with_head, q3_dtype dt)
{
    q3_st_writer *w;
    q3_status st = q3_st_writer_new(path, &w);
    if (st) return st;
    static const int64_t head_shape[2] = {16, 8};
    for (size_t i = first; i < first + n && !st; i++)
        st = q3_st_writer_add(w, fuzz_micro[i].hf, dt, fuzz_micro[i].ndim, fuzz_micro[i].shape);
    if (!st && with_head) st = q3_st_writer_add(w, "lm_head.weight", dt, 2, head_shape);
    if (!st) st = q3_st_writer_begin_data(w);
    int count = (int)n + (with_head != 0);
    for (int i = 0; i < count && !st; i++) {
        size_t bytes = q3_st_writer_tensor_bytes(w, i), esz = q3_dtype_block_bytes(dt);
        float vals[256];
        uint8_t row[256 * 4];
        for (size_t k = 0; k < 256; k++) vals[k] = (float)((int)((k * 7 + (size_t)i) % 17) - 8) / 16.0f;
        for (size_t off = 0; off < bytes && !st; off += sizeof row / 4 * esz) {
            size_t chunk = bytes - off < 256 * esz ? bytes - off : 256 * esz;
            q3_row_from_f32(dt, vals, row, chunk / esz);
            st = q3_st_writer_write(w, i, off, row, chunk);
        }
    }
    if (st) {
        q3_st_writer_abort(w);
        return st;
    }
    return q3_st_writer_commit(w);
}

#endif
