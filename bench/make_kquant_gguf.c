/* Writes a Q4_K_M-style GGUF of a model (e.g. `q3 synth`'s Qwen3-0.6B) with
 * q3's own K-quant quantizers, for benchmarking the K-quant kernels (q3
 * convert does not write K-quants: its files must match llama-quantize's
 * bytes, and q3's Q4_K/Q6_K quantizers do not). The mix follows llama.cpp's
 * Q4_K_M rule as documented: Q6_K for the embedding/LM head and for attn_v and
 * ffn_down in the "more bits" layers (the first and last eighth, and every
 * third between), Q4_K elsewhere; rows not of whole super-blocks in Q8_0.
 * The tokenizer is not copied (benchmarks need none).
 *
 *   build/bench/make_kquant_gguf MODEL OUT.gguf
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/dtype.h"
#include "model/gguf_write.h"
#include "model/model.h"
#include "model/quantize.h"
#include "q3.h"

static int more_bits(int i, int n) { return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2; }

static q3_dtype kquant_type(const char *name, int64_t row, int nl)
{
    q3_dtype t = Q3_Q4_K;
    if (strstr(name, "token_embd") || !strcmp(name, "output.weight")) t = Q3_Q6_K;
    int layer = -1;
    if (sscanf(name, "blk.%d.", &layer) == 1 && (strstr(name, "attn_v") || strstr(name, "ffn_down")) &&
        more_bits(layer, nl))
        t = Q3_Q6_K;
    return row % 256 ? Q3_Q8_0 : t;
}

typedef struct {
    uint8_t *bufs[512];
    int n;
} bufset;

static int n_layers;

static q3_status add_weight(q3_gguf_writer *w, bufset *bs, const char *name, const q3_tensor *t)
{
    size_t numel = q3_tensor_numel(t), cols = (size_t)t->shape[t->ndim - 1];
    float *f = malloc(numel * sizeof *f);
    for (size_t r = 0; r < numel / cols; r++)
        q3_row_to_f32(t->dtype, (const char *)t->data + r * q3_dtype_row_bytes(t->dtype, cols), f + r * cols, cols);
    q3_dtype dt = t->ndim == 1 ? Q3_F32 : kquant_type(name, (int64_t)cols, n_layers);
    uint8_t *q = malloc(q3_dtype_row_bytes(dt, numel));
    q3_status st = q3_quantize(dt, f, q, numel);
    free(f);
    bs->bufs[bs->n++] = q;
    return st ? st : q3_gguf_writer_add_tensor(w, name, dt, t->ndim, t->shape, q);
}

/* Writes the weights of m (F32) as a K-quant GGUF with llama.cpp's names. */
static q3_status write_kquant_gguf(const q3_model *m, const char *path)
{
    const q3_config *c = &m->cfg;
    n_layers = c->n_layers;
    q3_gguf_writer *w;
    q3_status st = q3_gguf_writer_new(&w);
    if (st) return st;
    bufset bs = {.n = 0};
    if ((st = q3_gguf_writer_add_str(w, "general.architecture", "qwen3")) ||
        (st = q3_gguf_writer_add_str(w, "general.name", "kquant-bench")) ||
        (st = q3_gguf_writer_add_u32(w, "qwen3.context_length", (uint32_t)c->max_seq_len)) ||
        (st = q3_gguf_writer_add_u32(w, "qwen3.embedding_length", (uint32_t)c->dim)) ||
        (st = q3_gguf_writer_add_u32(w, "qwen3.block_count", (uint32_t)c->n_layers)) ||
        (st = q3_gguf_writer_add_u32(w, "qwen3.feed_forward_length", (uint32_t)c->ffn_dim)) ||
        (st = q3_gguf_writer_add_u32(w, "qwen3.attention.head_count", (uint32_t)c->n_heads)) ||
        (st = q3_gguf_writer_add_u32(w, "qwen3.attention.head_count_kv", (uint32_t)c->n_kv_heads)) ||
        (st = q3_gguf_writer_add_u32(w, "qwen3.attention.key_length", (uint32_t)c->head_dim)) ||
        (st = q3_gguf_writer_add_u32(w, "qwen3.attention.value_length", (uint32_t)c->head_dim)) ||
        (st = q3_gguf_writer_add_f32(w, "qwen3.rope.freq_base", c->rope_theta)) ||
        (st = q3_gguf_writer_add_f32(w, "qwen3.attention.layer_norm_rms_epsilon", c->rms_eps)) ||
        (st = q3_gguf_writer_add_u32(w, "general.file_type", 15)) || /* llama.cpp's MOSTLY_Q4_K_M */
        (st = q3_gguf_writer_add_str(w, "tokenizer.ggml.model", "none")))
        goto done;
    const q3_weights *wt = &m->w;
    if ((st = add_weight(w, &bs, "token_embd.weight", wt->embed)) ||
        (st = add_weight(w, &bs, "output_norm.weight", wt->out_norm)))
        goto done;
    if (wt->lm_head != wt->embed && (st = add_weight(w, &bs, "output.weight", wt->lm_head))) goto done;
    static const char *const names[] = {"attn_norm", "attn_q",      "attn_k",      "attn_v",   "attn_output", "attn_q_norm",
                                        "attn_k_norm", "ffn_norm", "ffn_gate", "ffn_up", "ffn_down"};
    for (int l = 0; l < c->n_layers; l++) {
        const q3_layer_weights *L = &wt->layers[l];
        const q3_tensor *ts[] = {L->attn_norm, L->wq,     L->wk,       L->wv,   L->wo,    L->q_norm,
                                 L->k_norm,    L->ffn_norm, L->w_gate, L->w_up, L->w_down};
        for (int i = 0; i < 11; i++) {
            char n[64];
            snprintf(n, sizeof n, "blk.%d.%s.weight", l, names[i]);
            if ((st = add_weight(w, &bs, n, ts[i]))) goto done;
        }
    }
    st = q3_gguf_writer_write(w, path, NULL, NULL);
done:
    q3_gguf_writer_free(w);
    for (int i = 0; i < bs.n; i++) free(bs.bufs[i]);
    return st;
}


int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: %s MODEL OUT.gguf\n", argv[0]);
        return 2;
    }
    q3_model *m;
    if (q3_model_open(argv[1], &m)) {
        fprintf(stderr, "%s: %s\n", argv[1], q3_last_error());
        return 1;
    }
    q3_status st = write_kquant_gguf(m, argv[2]);
    q3_model_close(m);
    if (st) {
        fprintf(stderr, "%s: %s\n", argv[2], q3_last_error());
        return 1;
    }
    return 0;
}
