/* Synthetic Qwen3 checkpoints: presets, the tensor plan, parallel weight
 * generation, config.json, tokenizer copy. See synth.h for the contract. */
#include "tools/synth.h"
#include "model/layout.h"
#include "model/quantize.h"
#include "tools/convert.h"
#include "tools/gguf_write.h"
#include "tools/safetensors_write.h"
#include "util/error.h"
#include "util/file.h"
#include "util/outfile.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Values per independently seeded block; also the unit of work of a thread. */
#define BLOCK_VALUES ((size_t)1 << 20)
#define MAX_THREADS 8

/* Qwen's special token ids (config.json bos/eos for the real vocabulary). */
#define QWEN_ENDOFTEXT_ID 151643
#define QWEN_IM_END_ID 151645

/* ---- presets ------------------------------------------------------------ */

void q3_synth_preset_qwen3_0_6b(q3_config *c)
{
    memset(c, 0, sizeof *c);
    c->n_layers = 28;
    c->dim = 1024;
    c->ffn_dim = 3072;
    c->n_heads = 16;
    c->n_kv_heads = 8;
    c->head_dim = 128;
    c->vocab_size = 151936;
    c->max_seq_len = 40960;
    c->rms_eps = 1e-6f;
    c->rope_theta = 1e6f;
    c->tied_embeddings = true;
    snprintf(c->torch_dtype, sizeof c->torch_dtype, "bfloat16");
}

void q3_synth_preset_tiny(q3_config *c)
{
    q3_synth_preset_qwen3_0_6b(c);
    c->n_layers = 2;
    c->dim = 64;
    c->ffn_dim = 192;
    c->n_heads = 4;
    c->n_kv_heads = 2;
    c->head_dim = 32;
    c->vocab_size = 1024;
}

void q3_synth_preset_qwen3_30b_a3b(q3_config *c)
{
    q3_synth_preset_qwen3_0_6b(c);
    c->n_layers = 48;
    c->dim = 2048;
    c->ffn_dim = 6144;
    c->n_heads = 32;
    c->n_kv_heads = 4;
    c->head_dim = 128;
    c->tied_embeddings = false;
    c->n_experts = 128;
    c->n_experts_used = 8;
    c->expert_ffn_dim = 768;
    c->norm_topk_prob = true;
}

void q3_synth_preset_qwen3_235b_a22b(q3_config *c)
{
    q3_synth_preset_qwen3_30b_a3b(c);
    c->n_layers = 94;
    c->dim = 4096;
    c->ffn_dim = 12288;
    c->n_heads = 64;
    c->n_kv_heads = 4;
    c->expert_ffn_dim = 1536;
}

void q3_synth_preset_tiny_moe(q3_config *c)
{
    q3_synth_preset_qwen3_30b_a3b(c);
    c->n_layers = 2;
    c->dim = 256;
    c->ffn_dim = 768;
    c->n_heads = 4;
    c->n_kv_heads = 2;
    c->head_dim = 64;
    c->vocab_size = 1024;
    c->n_experts = 16;
    c->n_experts_used = 4;
    c->expert_ffn_dim = 256;
}

/* Qwen3-Embedding-0.6B and Qwen3-Reranker-0.6B: Qwen3-0.6B's shapes (their
 * config.json are Qwen3ForCausalLM's), marked as what they are for (model/task.c). */
void q3_synth_preset_qwen3_embedding_0_6b(q3_config *c)
{
    q3_synth_preset_qwen3_0_6b(c);
    c->pooling = Q3_POOLING_LAST;
}

void q3_synth_preset_qwen3_reranker_0_6b(q3_config *c)
{
    q3_synth_preset_qwen3_0_6b(c);
    c->pooling = Q3_POOLING_RANK;
}

static const struct {
    const char *name, *alias;
    void (*fn)(q3_config *);
} presets[] = {
    {"0.6b", "qwen3-0.6b", q3_synth_preset_qwen3_0_6b},
    {"tiny", NULL, q3_synth_preset_tiny},
    {"qwen3-30b-a3b", "30b-a3b", q3_synth_preset_qwen3_30b_a3b},
    {"qwen3-235b-a22b", "235b-a22b", q3_synth_preset_qwen3_235b_a22b},
    {"tiny-moe", NULL, q3_synth_preset_tiny_moe},
    {"qwen3-embedding-0.6b", "embedding-0.6b", q3_synth_preset_qwen3_embedding_0_6b},
    {"qwen3-reranker-0.6b", "reranker-0.6b", q3_synth_preset_qwen3_reranker_0_6b},
};

q3_status q3_synth_preset(const char *name, q3_config *out)
{
    for (size_t i = 0; i < sizeof presets / sizeof presets[0]; i++)
        if (!strcmp(name, presets[i].name) || (presets[i].alias && !strcmp(name, presets[i].alias))) {
            presets[i].fn(out);
            return Q3_OK;
        }
    return q3_fail(Q3_ERR_INVALID,
                   "unknown preset \"%s\" (known: 0.6b, tiny, qwen3-30b-a3b, qwen3-235b-a22b, tiny-moe, "
                   "qwen3-embedding-0.6b, qwen3-reranker-0.6b)", name);
}

/* ---- the tensor plan ---------------------------------------------------- */

typedef struct tensor_spec {
    char name[96];
    int ndim;
    int64_t shape[3];
    float mean, std; /* values are mean + std x N(0, 1) */
} tensor_spec;

/* Hugging Face tensors per layer: the dense layer's 11, or the 8 of attention,
 * the router and each expert's gate, up and down. */
static int layer_specs(const q3_config *c)
{
    return q3_config_is_moe(c) ? Q3_LAYER_ATTN_TENSORS + 1 + 3 * c->n_experts : Q3_LAYER_TENSORS;
}

static int plan_count(const q3_config *c) { return 2 + layer_specs(c) * c->n_layers + !c->tied_embeddings; }

/* The index in the plan of layer l's tensor `field` (q3_layer_weights order), of
 * expert e for a stack: file order is the embedding, then per layer the 8 attention
 * weights, then the dense MLP's gate, up, down, or the router and expert by expert
 * gate, up, down (as Hugging Face lists a Qwen3-MoE's); the final norm; lm_head. */
static int spec_index(const q3_config *c, int l, int field, int e)
{
    int base = 1 + l * layer_specs(c);
    if (field < Q3_LAYER_TENSORS) return base + field;
    if (field == Q3_LAYER_TENSORS) return base + Q3_LAYER_ATTN_TENSORS; /* the router */
    return base + Q3_LAYER_ATTN_TENSORS + 1 + 3 * e + (field - Q3_LAYER_TENSORS - 1);
}

/* The spec of a weight named name, laid out as layout says under c (a stack's
 * matrix: one expert's). */
static void spec_from(tensor_spec *t, const char *name, const q3_tensor_layout *layout, const q3_config *c)
{
    int64_t shape[3];
    int n = q3_layout_shape(layout, c, shape), skip = layout->stack != Q3_DIM_NONE;
    snprintf(t->name, sizeof t->name, "%s", name);
    t->ndim = n - skip;
    memcpy(t->shape, shape + skip, (size_t)t->ndim * sizeof *shape);
    if (t->ndim == 1) { /* the vectors are the norms' weights */
        t->mean = 1.0f;
        t->std = (float)Q3_SYNTH_NORM_STD;
    } else if (layout == &q3_moe_layout[0]) {
        t->std = (float)(1.0 / sqrt((double)c->dim)); /* Q3_SYNTH_ROUTER_STD */
    } else {
        t->std = (float)Q3_SYNTH_MATRIX_STD;
    }
}

/* Fills specs[plan_count(c)] in file order (spec_index). */
static void plan_tensors(const q3_config *c, tensor_spec *specs)
{
    const q3_tensor_layout *ts[Q3_LAYER_TENSORS + Q3_MOE_TENSORS];
    int fields[Q3_LAYER_TENSORS + Q3_MOE_TENSORS], n = q3_layer_tensors(c, ts, fields);
    char name[96];
    spec_from(&specs[0], q3_embed_layout.hf, &q3_embed_layout, c);
    for (int l = 0; l < c->n_layers; l++)
        for (int i = 0; i < n; i++)
            for (int e = 0; e < (ts[i]->stack != Q3_DIM_NONE ? c->n_experts : 1); e++) {
                q3_layout_name(ts[i], l, e, 0, name, sizeof name);
                spec_from(&specs[spec_index(c, l, fields[i], e)], name, ts[i], c);
            }
    tensor_spec *t = &specs[1 + c->n_layers * layer_specs(c)];
    spec_from(t++, q3_out_norm_layout.hf, &q3_out_norm_layout, c);
    if (!c->tied_embeddings) spec_from(t++, q3_lm_head_layout.hf, &q3_lm_head_layout, c);
}

static uint64_t spec_numel(const tensor_spec *t)
{
    return (uint64_t)t->shape[0] * (uint64_t)(t->ndim == 2 ? t->shape[1] : 1);
}

uint64_t q3_synth_param_count(const q3_config *c)
{
    uint64_t hidden = (uint64_t)c->dim, hd = (uint64_t)c->head_dim;
    uint64_t q_dim = (uint64_t)c->n_heads * hd, kv_dim = (uint64_t)c->n_kv_heads * hd;
    uint64_t mlp = q3_config_is_moe(c)
                       ? (uint64_t)c->n_experts * hidden * (1 + 3 * (uint64_t)c->expert_ffn_dim) /* router, experts */
                       : 3 * (uint64_t)c->ffn_dim * hidden;                                      /* gate, up, down */
    uint64_t per_layer = 2 * hidden + 2 * hd                        /* norms */
                         + 2 * q_dim * hidden + 2 * kv_dim * hidden /* q, o, k, v */
                         + mlp;
    uint64_t embed = (uint64_t)c->vocab_size * hidden;
    return embed * (c->tied_embeddings ? 1 : 2) + per_layer * (uint64_t)c->n_layers + hidden;
}

/* ---- random numbers ----------------------------------------------------- */

static uint64_t splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static inline uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

typedef struct xoshiro { uint64_t s[4]; } xoshiro;

/* An independent stream for block `block` of tensor `tensor`. */
static xoshiro stream_for(uint64_t seed, int tensor, uint64_t block)
{
    uint64_t x = seed;
    uint64_t key = splitmix64(&x) ^ ((uint64_t)(tensor + 1) * 0xd1b54a32d192ed03ull) ^
                   ((block + 1) * 0x8cb92ba72f3d8dd7ull);
    xoshiro g;
    for (int i = 0; i < 4; i++) g.s[i] = splitmix64(&key);
    return g;
}

static inline uint64_t xoshiro_next(xoshiro *g)
{
    uint64_t *s = g->s;
    uint64_t result = rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

/* Approximately N(0, 1) from 64 random bits: the sum of four 16-bit
 * uniforms, centred and scaled to unit variance (Irwin-Hall, n = 4). */
static inline float approx_normal(uint64_t r)
{
    const int32_t mean = 4 * 65535 / 2;            /* 131070 */
    const float inv_std = 1.7320508f / 65536.0f;   /* 1 / sqrt(4 x 65536^2 / 12) */
    /* Pairwise sums of the 16-bit fields in two 32-bit lanes, then the lanes. */
    uint64_t pairs = (r & 0x0000ffff0000ffffull) + (r >> 16 & 0x0000ffff0000ffffull);
    int32_t sum = (int32_t)((pairs >> 32) + (pairs & 0xffffffffu));
    return (float)(sum - mean) * inv_std;
}

/* A weight's value: the one expression both the folder and the streamed GGUF use. */
static inline float gen_value(float mean, float std, uint64_t r) { return mean + std * approx_normal(r); }

/* Fills out with n values of tensor spec t starting at element `first`
 * (a multiple of BLOCK_VALUES; n <= BLOCK_VALUES), stored as dtype. */
static void fill_block(const tensor_spec *t, int tensor, uint64_t seed, uint64_t first, size_t n,
                       q3_dtype dtype, void *out)
{
    xoshiro g = stream_for(seed, tensor, first / BLOCK_VALUES);
    float mean = t->mean, std = t->std;
    if (dtype == Q3_BF16) {
        uint16_t *o = out;
        for (size_t i = 0; i < n; i++) o[i] = q3_f32_to_bf16(gen_value(mean, std, xoshiro_next(&g)));
    } else {
        float *o = out;
        for (size_t i = 0; i < n; i++) o[i] = gen_value(mean, std, xoshiro_next(&g));
    }
}

/* ---- parallel generation ------------------------------------------------ */

typedef struct work_block {
    int tensor;
    uint64_t first; /* first element */
    size_t n;       /* elements */
} work_block;

typedef struct synth_job {
    q3_st_writer *w;
    const tensor_spec *specs;
    const work_block *blocks;
    size_t n_blocks;
    uint64_t seed;
    q3_dtype dtype;
    size_t next;           /* next block to claim (atomic) */
    int failed;            /* set once by the first failing worker (atomic) */
    q3_status status;      /* that worker's status and message */
    char message[1024];
} synth_job;

/* Claims blocks until none are left, generates and writes each. */
static void *synth_worker(void *arg)
{
    synth_job *job = arg;
    size_t esize = q3_dtype_block_bytes(job->dtype);
    void *buf = malloc(BLOCK_VALUES * esize);
    q3_status st = buf ? Q3_OK : q3_fail(Q3_ERR_NOMEM, "out of memory for a weight buffer");
    while (!st && !__atomic_load_n(&job->failed, __ATOMIC_RELAXED)) {
        size_t b = __atomic_fetch_add(&job->next, 1, __ATOMIC_RELAXED);
        if (b >= job->n_blocks) break;
        const work_block *wb = &job->blocks[b];
        fill_block(&job->specs[wb->tensor], wb->tensor, job->seed, wb->first, wb->n, job->dtype, buf);
        st = q3_st_writer_write(job->w, wb->tensor, (size_t)wb->first * esize, buf, wb->n * esize);
    }
    free(buf);
    /* Errors are per thread: hand the first one to the caller's thread. */
    if (st && !__atomic_exchange_n(&job->failed, 1, __ATOMIC_ACQ_REL)) {
        job->status = st;
        snprintf(job->message, sizeof job->message, "%s", q3_last_error());
    }
    return NULL;
}

static int thread_count(size_t n_blocks)
{
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    int n = cpus < 1 ? 1 : cpus > MAX_THREADS ? MAX_THREADS : (int)cpus;
    return (size_t)n > n_blocks ? (int)(n_blocks ? n_blocks : 1) : n;
}

static q3_status write_safetensors(const char *path, uint64_t seed, q3_dtype dtype,
                                   const tensor_spec *specs, int n_specs)
{
    q3_st_writer *w;
    q3_status st = q3_st_writer_new(path, &w);
    if (st) return st;
    size_t n_blocks = 0;
    for (int i = 0; i < n_specs && !st; i++) {
        st = q3_st_writer_add(w, specs[i].name, dtype, specs[i].ndim, specs[i].shape);
        n_blocks += (spec_numel(&specs[i]) + BLOCK_VALUES - 1) / BLOCK_VALUES;
    }
    if (!st) st = q3_st_writer_begin_data(w);
    work_block *blocks = st ? NULL : malloc(n_blocks * sizeof *blocks);
    if (!st && !blocks) st = q3_fail(Q3_ERR_NOMEM, "%s: out of memory", path);
    if (st) {
        q3_st_writer_abort(w);
        return st;
    }
    size_t k = 0;
    for (int i = 0; i < n_specs; i++) {
        uint64_t numel = spec_numel(&specs[i]);
        for (uint64_t first = 0; first < numel; first += BLOCK_VALUES) {
            size_t n = numel - first < BLOCK_VALUES ? (size_t)(numel - first) : BLOCK_VALUES;
            blocks[k++] = (work_block){.tensor = i, .first = first, .n = n};
        }
    }

    synth_job job = {.w = w, .specs = specs, .blocks = blocks, .n_blocks = n_blocks, .seed = seed,
                     .dtype = dtype};
    pthread_t threads[MAX_THREADS];
    int n_threads = thread_count(n_blocks), started = 0;
    for (int t = 1; t < n_threads; t++) /* this thread is worker 0 */
        if (pthread_create(&threads[started], NULL, synth_worker, &job) == 0) started++;
    synth_worker(&job);
    for (int t = 0; t < started; t++) pthread_join(threads[t], NULL);
    free(blocks);

    if (job.failed) {
        q3_st_writer_abort(w);
        return q3_fail(job.status, "%s", job.message);
    }
    return q3_st_writer_commit(w);
}

/* ---- config.json -------------------------------------------------------- */

/* A float as Python's json would print it for a config: integral values as
 * "1000000.0", others with the fewest digits that read back to the same
 * float ("1e-06", "0.02"). */
static void format_float(float x, char *buf, size_t cap)
{
    if (x == floorf(x) && fabsf(x) < 1e15f) {
        snprintf(buf, cap, "%.1f", (double)x);
        return;
    }
    for (int digits = 1; digits <= 9; digits++) {
        snprintf(buf, cap, "%.*g", digits, (double)x);
        if (strtof(buf, NULL) == x) return;
    }
}

/* bos/eos: Qwen's <|endoftext|> and <|im_end|> when the vocabulary holds
 * them, otherwise the last ids (as small test models do). */
static void special_ids(const q3_config *c, int *bos, int *eos)
{
    if (c->vocab_size > QWEN_IM_END_ID) {
        *bos = QWEN_ENDOFTEXT_ID;
        *eos = QWEN_IM_END_ID;
    } else {
        *bos = c->vocab_size >= 3 ? c->vocab_size - 3 : 0;
        *eos = c->vocab_size - 1;
    }
}

/* Writes the whole of data to path via a unique temporary file and a rename. */
static q3_status write_file_atomically(const char *path, const char *data, size_t n)
{
    return q3_write_file_atomic(path, data, n);
}

/* config.json's text for c (keys sorted, as transformers writes them), into buf. */
static int format_config_json(const q3_config *c, q3_dtype dtype, uint64_t seed, char *buf, size_t cap)
{
    char eps[32], theta[32];
    int bos, eos, moe = q3_config_is_moe(c);
    format_float(c->rms_eps, eps, sizeof eps);
    format_float(c->rope_theta, theta, sizeof theta);
    special_ids(c, &bos, &eos);
    size_t n = 0;
#define PUT(...) (n += (size_t)snprintf(buf + (n < cap ? n : cap), n < cap ? cap - n : 0, __VA_ARGS__))
    PUT("{\n"
        "  \"architectures\": [\n    \"%s\"\n  ],\n"
        "  \"attention_bias\": false,\n"
        "  \"attention_dropout\": 0.0,\n"
        "  \"bos_token_id\": %d,\n",
        moe ? "Qwen3MoeForCausalLM" : "Qwen3ForCausalLM", bos);
    if (moe) PUT("  \"decoder_sparse_step\": 1,\n");
    PUT("  \"eos_token_id\": %d,\n"
        "  \"head_dim\": %d,\n"
        "  \"hidden_act\": \"silu\",\n"
        "  \"hidden_size\": %d,\n"
        "  \"initializer_range\": 0.02,\n"
        "  \"intermediate_size\": %d,\n"
        "  \"max_position_embeddings\": %d,\n"
        "  \"max_window_layers\": %d,\n",
        eos, c->head_dim, c->dim, c->ffn_dim, c->max_seq_len, c->n_layers);
    if (moe) PUT("  \"mlp_only_layers\": [],\n  \"model_type\": \"qwen3_moe\",\n  \"moe_intermediate_size\": %d,\n"
                 "  \"norm_topk_prob\": %s,\n",
                 c->expert_ffn_dim, c->norm_topk_prob ? "true" : "false");
    else PUT("  \"model_type\": \"qwen3\",\n");
    PUT("  \"num_attention_heads\": %d,\n", c->n_heads);
    if (moe) PUT("  \"num_experts\": %d,\n  \"num_experts_per_tok\": %d,\n", c->n_experts, c->n_experts_used);
    PUT("  \"num_hidden_layers\": %d,\n"
        "  \"num_key_value_heads\": %d,\n",
        c->n_layers, c->n_kv_heads);
    if (moe) PUT("  \"output_router_logits\": false,\n");
    PUT("  \"q3_synth_seed\": %llu,\n"
        "  \"rms_norm_eps\": %s,\n"
        "  \"rope_scaling\": null,\n"
        "  \"rope_theta\": %s,\n",
        (unsigned long long)seed, eps, theta);
    if (moe) PUT("  \"router_aux_loss_coef\": 0.001,\n");
    PUT("  \"sliding_window\": null,\n"
        "  \"tie_word_embeddings\": %s,\n"
        "  \"torch_dtype\": \"%s\",\n"
        "  \"use_cache\": true,\n"
        "  \"use_sliding_window\": false,\n"
        "  \"vocab_size\": %d\n"
        "}\n",
        c->tied_embeddings ? "true" : "false", dtype == Q3_BF16 ? "bfloat16" : "float32", c->vocab_size);
#undef PUT
    return n < cap ? (int)n : -1;
}

static q3_status write_config_json(const char *path, const q3_config *c, q3_dtype dtype, uint64_t seed)
{
    char text[4096];
    int n = format_config_json(c, dtype, seed, text, sizeof text);
    if (n < 0) return q3_fail(Q3_ERR_INVALID, "%s: config.json too long", path);
    return write_file_atomically(path, text, (size_t)n);
}

/* ---- files and folders -------------------------------------------------- */

/* mkdir -p: creates dir and its missing parents. */
static q3_status make_dirs(const char *dir)
{
    char path[4096];
    if (snprintf(path, sizeof path, "%s", dir) >= (int)sizeof path)
        return q3_fail(Q3_ERR_INVALID, "%s: path too long", dir);
    for (char *p = path + 1; ; p++) {
        if (*p == '/' || *p == 0) {
            char saved = *p;
            *p = 0;
            if (mkdir(path, 0755) != 0 && errno != EEXIST)
                return q3_fail(Q3_ERR_IO, "%s: cannot create folder: %s", path, strerror(errno));
            *p = saved;
            if (!saved) break;
        }
    }
    if (!q3_is_dir(dir)) return q3_fail(Q3_ERR_IO, "%s: exists and is not a folder", dir);
    return Q3_OK;
}

static q3_status join_path(char *out, size_t cap, const char *dir, const char *name)
{
    if (snprintf(out, cap, "%s/%s", dir, name) >= (int)cap)
        return q3_fail(Q3_ERR_INVALID, "%s: path too long", dir);
    return Q3_OK;
}

static q3_status copy_file(const char *src, const char *dst)
{
    char *data;
    size_t n;
    q3_status st = q3_read_file(src, (size_t)1 << 30, &data, &n);
    if (st) return st;
    st = write_file_atomically(dst, data, n);
    free(data);
    return st;
}

static q3_status copy_tokenizer(const char *tokenizer_dir, const char *dir)
{
    static const struct { const char *name; int required; } files[] = {
        {"tokenizer.json", 1},
        {"tokenizer_config.json", 0},
        {"chat_template.jinja", 0},
    };
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        char src[4096], dst[4096];
        q3_status st = join_path(src, sizeof src, tokenizer_dir, files[i].name);
        if (!st) st = join_path(dst, sizeof dst, dir, files[i].name);
        if (st) return st;
        int present = 1;
        if (!files[i].required && (st = q3_regular_or_absent(src, &present))) return st;
        if (!present) continue;
        if ((st = copy_file(src, dst))) return q3_fail_wrap(st, "copying the tokenizer");
    }
    return Q3_OK;
}

/* What marks an embedding model or a reranker in a folder (model/task.c reads
 * them): sentence-transformers' last-token pooling config, as Qwen3-Embedding
 * ships it, or its CrossEncoder config. */
static q3_status write_task_markers(const char *dir, const q3_config *cfg)
{
    char path[4096], text[512];
    q3_status st;
    int n;
    if (cfg->pooling == Q3_POOLING_LAST) {
        if ((st = join_path(path, sizeof path, dir, "1_Pooling")) || (st = make_dirs(path))) return st;
        if ((st = join_path(path, sizeof path, dir, "1_Pooling/config.json"))) return st;
        n = snprintf(text, sizeof text,
                     "{\n  \"word_embedding_dimension\": %d,\n  \"pooling_mode_cls_token\": false,\n"
                     "  \"pooling_mode_mean_tokens\": false,\n  \"pooling_mode_max_tokens\": false,\n"
                     "  \"pooling_mode_mean_sqrt_len_tokens\": false,\n  \"pooling_mode_weightedmean_tokens\": false,\n"
                     "  \"pooling_mode_lasttoken\": true,\n  \"include_prompt\": true\n}\n",
                     cfg->dim);
        return write_file_atomically(path, text, (size_t)n);
    }
    if (cfg->pooling == Q3_POOLING_RANK) {
        if ((st = join_path(path, sizeof path, dir, "config_sentence_transformers.json"))) return st;
        n = snprintf(text, sizeof text, "{\n  \"model_type\": \"CrossEncoder\"\n}\n");
        return write_file_atomically(path, text, (size_t)n);
    }
    return Q3_OK;
}

/* ---- entry point -------------------------------------------------------- */

q3_status q3_synth_write(const char *dir, uint64_t seed, q3_dtype dtype, const q3_config *cfg,
                         const char *tokenizer_dir)
{
    if (dtype != Q3_BF16 && dtype != Q3_F32)
        return q3_fail(Q3_ERR_UNSUPPORTED, "synth: dtype %s is not supported (bf16 or f32)",
                       q3_dtype_name(dtype));
    q3_status st = q3_config_validate(cfg, "synth config");
    if (st) return st;

    if (!dir || !*dir) return q3_fail(Q3_ERR_INVALID, "synth: the output folder is empty");
    char weights_path[4096], config_path[4096];
    if ((st = join_path(weights_path, sizeof weights_path, dir, "model.safetensors"))) return st;
    if ((st = join_path(config_path, sizeof config_path, dir, "config.json"))) return st;
    if ((st = make_dirs(dir))) return st;
    /* every output checked before the work: a folder named config.json fails now, not after the weights */
    if ((st = q3_outfile_check(weights_path)) || (st = q3_outfile_check(config_path))) return st;

    int n_specs = plan_count(cfg);
    tensor_spec *specs = calloc((size_t)n_specs, sizeof *specs);
    if (!specs) return q3_fail(Q3_ERR_NOMEM, "synth: out of memory");
    plan_tensors(cfg, specs);
    st = write_safetensors(weights_path, seed, dtype, specs, n_specs);
    free(specs);
    if (st) return st;

    if ((st = write_config_json(config_path, cfg, dtype, seed))) return st;
    if ((st = write_task_markers(dir, cfg))) return st;
    if (tokenizer_dir && (st = copy_tokenizer(tokenizer_dir, dir))) return st;
    return Q3_OK;
}

/* ---- straight to a GGUF --------------------------------------------------- */

/* Values per unit of work of the streamed writer: GROUP_BLOCKS generator blocks. */
#define GROUP_BLOCKS 2

/* The values of one spec from element `first` on, in file order: the same
 * streams fill_block draws from. */
typedef struct value_stream {
    xoshiro g;
    uint64_t seed, block;
    size_t left; /* values left in this block */
    int tensor;
} value_stream;

static void value_stream_init(value_stream *v, uint64_t seed, int tensor, uint64_t first)
{
    v->seed = seed;
    v->tensor = tensor;
    v->block = first / BLOCK_VALUES;
    v->g = stream_for(seed, tensor, v->block);
    size_t skip = (size_t)(first % BLOCK_VALUES);
    for (size_t i = 0; i < skip; i++) xoshiro_next(&v->g);
    v->left = BLOCK_VALUES - skip;
}

static inline uint64_t value_stream_next(value_stream *v)
{
    if (!v->left) {
        v->g = stream_for(v->seed, v->tensor, ++v->block);
        v->left = BLOCK_VALUES;
    }
    v->left--;
    return xoshiro_next(&v->g);
}

/* One GGUF tensor made from n_parts specs (first + p x stride): a matrix or
 * vector (1 part), or an expert stack (one part per expert). */
typedef struct stream_job {
    const tensor_spec *specs;
    int first, stride, n_parts;
    uint64_t seed;
    q3_dtype src, dst; /* the folder's dtype the values are rounded to; the file's type */
    /* set by stream_fill */
    char *out;
    size_t part_bytes, units_per_part, rows, cols;
    size_t next;      /* next unit to claim (atomic) */
    int failed;       /* set once by the first failing worker (atomic) */
    q3_status status; /* that worker's status and message */
    char message[1024];
} stream_job;

/* Unit k of a part: the rows that start in generator blocks [k G, (k + 1) G). */
static void unit_rows(const stream_job *j, size_t k, size_t *r0, size_t *r1)
{
    uint64_t span = (uint64_t)GROUP_BLOCKS * BLOCK_VALUES;
    uint64_t a = ((uint64_t)k * span + j->cols - 1) / j->cols, b = ((uint64_t)(k + 1) * span + j->cols - 1) / j->cols;
    *r0 = a < j->rows ? (size_t)a : j->rows;
    *r1 = b < j->rows ? (size_t)b : j->rows;
}

/* Claims units until none are left: generates each row as the folder would hold
 * it (rounded to src) and converts it as q3 convert would (a copy when dst is src,
 * else q3_quantize of the F32 values). */
static void *stream_worker(void *arg)
{
    stream_job *j = arg;
    size_t cols = j->cols, src_row = q3_dtype_row_bytes(j->src, cols), dst_row = q3_dtype_row_bytes(j->dst, cols);
    float *row = malloc(cols * sizeof *row);
    uint16_t *half = malloc(cols * sizeof *half);
    q3_status st = row && half ? Q3_OK : q3_fail(Q3_ERR_NOMEM, "out of memory for a row");
    size_t n_units = j->units_per_part * (size_t)j->n_parts;
    while (!st && !__atomic_load_n(&j->failed, __ATOMIC_RELAXED)) {
        size_t u = __atomic_fetch_add(&j->next, 1, __ATOMIC_RELAXED);
        if (u >= n_units) break;
        size_t p = u / j->units_per_part, r0, r1;
        unit_rows(j, u % j->units_per_part, &r0, &r1);
        if (r0 >= r1) continue;
        int tensor = j->first + (int)p * j->stride;
        const tensor_spec *t = &j->specs[tensor];
        value_stream v;
        value_stream_init(&v, j->seed, tensor, (uint64_t)r0 * cols);
        for (size_t r = r0; r < r1 && !st; r++) {
            char *dst = j->out + p * j->part_bytes + r * dst_row;
            if (j->src == Q3_BF16) {
                for (size_t i = 0; i < cols; i++) {
                    half[i] = q3_f32_to_bf16(gen_value(t->mean, t->std, value_stream_next(&v)));
                    row[i] = q3_bf16_to_f32(half[i]);
                }
                if (j->dst == Q3_BF16) memcpy(dst, half, src_row);
            } else {
                for (size_t i = 0; i < cols; i++) row[i] = gen_value(t->mean, t->std, value_stream_next(&v));
                if (j->dst == Q3_F32) memcpy(dst, row, src_row);
            }
            if (j->dst != j->src) st = q3_quantize(j->dst, row, dst, cols);
        }
    }
    free(row);
    free(half);
    if (st && !__atomic_exchange_n(&j->failed, 1, __ATOMIC_ACQ_REL)) {
        j->status = st;
        snprintf(j->message, sizeof j->message, "%s", q3_last_error());
    }
    return NULL;
}

/* The gguf writer's fill: the tensor's bytes, made on up to MAX_THREADS threads. */
static q3_status stream_fill(void *user, void *dst, size_t nbytes)
{
    stream_job *j = user;
    const tensor_spec *t = &j->specs[j->first];
    j->cols = (size_t)t->shape[t->ndim - 1];
    j->rows = (size_t)(spec_numel(t) / j->cols);
    j->part_bytes = j->rows * q3_dtype_row_bytes(j->dst, j->cols);
    if (j->part_bytes * (size_t)j->n_parts != nbytes)
        return q3_fail(Q3_ERR_INVALID, "synth: tensor \"%s\": size mismatch", t->name);
    uint64_t span = (uint64_t)GROUP_BLOCKS * BLOCK_VALUES;
    j->units_per_part = (size_t)((spec_numel(t) + span - 1) / span);
    j->out = dst;
    j->next = 0;
    j->failed = 0;
    size_t n_units = j->units_per_part * (size_t)j->n_parts;
    pthread_t threads[MAX_THREADS];
    int n_threads = thread_count(n_units), started = 0;
    for (int i = 1; i < n_threads; i++)
        if (pthread_create(&threads[started], NULL, stream_worker, j) == 0) started++;
    stream_worker(j);
    for (int i = 0; i < started; i++) pthread_join(threads[i], NULL);
    return j->failed ? q3_fail(j->status, "%s", j->message) : Q3_OK;
}

q3_status q3_synth_write_gguf(const char *path, uint64_t seed, q3_dtype dtype, const q3_config *cfg,
                              const q3_convert_opts *o)
{
    if (dtype != Q3_BF16 && dtype != Q3_F32)
        return q3_fail(Q3_ERR_UNSUPPORTED, "synth: dtype %s is not supported (bf16 or f32)", q3_dtype_name(dtype));
    if ((unsigned)o->type >= Q3_DTYPE_COUNT || !q3_traits(o->type)->from_f32)
        return q3_fail(Q3_ERR_INVALID, "synth: q3 cannot write %s weights", q3_dtype_name(o->type));
    q3_status st = q3_config_validate(cfg, "synth config");
    if (!st) st = q3_convert_check_config(cfg, "synth config");
    if (st) return st;
    if (!path || !*path) return q3_fail(Q3_ERR_INVALID, "synth: the output file is empty");

    int n_specs = plan_count(cfg);
    size_t n_plan = q3_convert_plan_count(cfg);
    tensor_spec *specs = calloc((size_t)n_specs, sizeof *specs);
    q3_convert_entry *plan = calloc(n_plan, sizeof *plan);
    stream_job *jobs = calloc(n_plan, sizeof *jobs);
    q3_gguf_writer *w = NULL;
    if (!specs || !plan || !jobs) st = q3_fail(Q3_ERR_NOMEM, "synth: out of memory");
    if (!st) st = q3_convert_plan(o, cfg, plan);
    if (!st) st = q3_gguf_writer_new(&w);
    char name[256], config_text[4096];
    if (o->name) snprintf(name, sizeof name, "%s", o->name);
    else q3_convert_base_name(path, name, sizeof name);
    if (!st) st = q3_convert_add_metadata(w, cfg, o, name);
    if (!st) {
        plan_tensors(cfg, specs);
        for (size_t i = 0; i < n_plan && !st; i++) {
            const q3_convert_entry *e = &plan[i];
            stream_job *j = &jobs[i];
            *j = (stream_job){.specs = specs, .n_parts = 1, .seed = seed, .src = dtype, .dst = e->type};
            if (e->layer < 0) {
                j->first = e->layout == &q3_embed_layout ? 0
                           : e->layout == &q3_out_norm_layout ? 1 + cfg->n_layers * layer_specs(cfg)
                                                              : 2 + cfg->n_layers * layer_specs(cfg);
            } else {
                j->first = spec_index(cfg, e->layer, e->field, 0);
                if (e->layout->stack != Q3_DIM_NONE) {
                    j->n_parts = cfg->n_experts;
                    j->stride = spec_index(cfg, e->layer, e->field, 1) - j->first;
                }
            }
            st = q3_gguf_writer_add_tensor_fn(w, e->name, e->type, e->ndim, e->shape, stream_fill, j);
        }
    }
    if (!st) {
        if (o->tokenizer_dir) {
            int n = format_config_json(cfg, dtype, seed, config_text, sizeof config_text);
            st = n < 0 ? q3_fail(Q3_ERR_INVALID, "synth: config.json too long")
                       : q3_convert_add_tokenizer_text(w, o->tokenizer_dir, config_text, cfg->vocab_size);
        } else {
            st = q3_gguf_writer_add_str(w, "tokenizer.ggml.model", "none");
        }
    }
    if (!st) st = q3_gguf_writer_write(w, path, o->progress, o->user);
    q3_gguf_writer_free(w);
    free(jobs);
    free(plan);
    free(specs);
    return st;
}
