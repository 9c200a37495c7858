/* Opening a model: a Hugging Face folder (config.json + safetensors, one file
 * or shards listed by model.safetensors.index.json). */
#include "model/model.h"

#include <cjson/cJSON.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/gguf.h"
#include "model/layout.h"
#include "q3.h" /* q3_model_open, q3_model_close, q3_model_vocab_size, q3_model_max_context: public */
#include "util/error.h"
#include "util/file.h"

/* ---- weights by name, checked against the config -------------------------- */

static void shape_str(char *buf, size_t n, int ndim, const int64_t *shape)
{
    size_t k = (size_t)snprintf(buf, n, "[");
    for (int i = 0; i < ndim && k < n; i++)
        k += (size_t)snprintf(buf + k, n - k, "%s%lld", i ? ", " : "", (long long)shape[i]);
    if (k < n) snprintf(buf + k, n - k, "]");
}

q3_status q3_model_bind_tensor(const char *source, const q3_tensor *t, const char *name, int ndim,
                               const int64_t *shape, const q3_tensor **out)
{
    if (!t) return q3_fail(Q3_ERR_FORMAT, "%s: missing tensor \"%s\"", source, name);
    int ok = t->ndim == ndim;
    for (int i = 0; ok && i < ndim; i++) ok = t->shape[i] == shape[i];
    if (!ok) {
        char want[128], got[128];
        shape_str(want, sizeof want, ndim, shape);
        shape_str(got, sizeof got, t->ndim, t->shape);
        return q3_fail(Q3_ERR_FORMAT, "%s: tensor \"%s\" has shape %s, expected %s from the config", source, name,
                       got, want);
    }
    if (ndim == 1 && !q3_dtype_is_plain(t->dtype))
        return q3_fail(Q3_ERR_UNSUPPORTED, "%s: norm tensor \"%s\" has dtype %s (F32, F16 or BF16 expected)", source,
                       name, q3_dtype_name(t->dtype));
    if (ndim >= 2 && shape[ndim - 1] % (int64_t)q3_dtype_block_values(t->dtype))
        return q3_fail(Q3_ERR_FORMAT, "%s: tensor \"%s\": rows of %lld are not whole %s blocks", source, name,
                       (long long)shape[ndim - 1], q3_dtype_name(t->dtype));
    *out = t;
    return Q3_OK;
}

struct q3_weight_map_entry {
    char *tensor;
    int file;      /* index in m->files */
    size_t order;  /* position in the index, so that a repeated key resolves as JSON readers do (the last) */
};

static int cmp_map_entry(const void *a, const void *b)
{
    const struct q3_weight_map_entry *x = a, *y = b;
    int c = strcmp(x->tensor, y->tensor);
    return c ? c : (x->order > y->order) - (x->order < y->order);
}

/* The tensor from the shard the index's weight_map names for it (even when
 * another shard holds a tensor of the same name); a tensor the map does not
 * list is looked up in every shard, in order. */
static const q3_tensor *find_any(const q3_model *m, const char *name)
{
    if (m->n_weight_map) {
        size_t lo = 0, hi = m->n_weight_map; /* the first entry > name, then step back */
        while (lo < hi) {
            size_t mid = lo + (hi - lo) / 2;
            if (strcmp(m->weight_map[mid].tensor, name) <= 0) lo = mid + 1;
            else hi = mid;
        }
        if (lo > 0 && !strcmp(m->weight_map[lo - 1].tensor, name)) {
            int f = m->weight_map[lo - 1].file;
            return f >= 0 && f < m->n_files ? q3_safetensors_find(&m->files[f], name) : NULL;
        }
    }
    for (int i = 0; i < m->n_files; i++) {
        const q3_tensor *t = q3_safetensors_find(&m->files[i], name);
        if (t) return t;
    }
    return NULL;
}

static q3_status bind(q3_model *m, const char *name, const q3_tensor_layout *t, const q3_tensor **out)
{
    int64_t shape[3];
    int ndim = q3_layout_shape(t, &m->cfg, shape);
    return q3_model_bind_tensor(m->path, find_any(m, name), name, ndim, shape, out);
}

/* ---- expert stacks ------------------------------------------------------------ */

void q3_tensor_stack_fill(q3_tensor *stack, q3_tensor *views, const q3_tensor **ptrs)
{
    int n_mat = (int)stack->shape[0];
    size_t mat_bytes = (size_t)stack->shape[1] * q3_dtype_row_bytes(stack->dtype, (size_t)stack->shape[2]);
    for (int e = 0; e < n_mat; e++) {
        q3_tensor *v = &views[e];
        memset(v, 0, sizeof *v);
        snprintf(v->name, sizeof v->name, "%.100s[%d]", stack->name, e);
        v->dtype = stack->dtype;
        v->ndim = 2;
        v->shape[0] = stack->shape[1];
        v->shape[1] = stack->shape[2];
        v->nbytes = mat_bytes;
        v->data = (const char *)stack->data + (size_t)e * mat_bytes;
        atomic_init(&v->packed, NULL);
        ptrs[e] = v;
    }
    stack->mats = ptrs;
}

q3_status q3_tensor_stack_views(q3_tensor *stack, void **mem)
{
    size_t n = (size_t)stack->shape[0];
    char *p = malloc(n * (sizeof(q3_tensor) + sizeof(q3_tensor *)));
    *mem = p;
    if (!p) return q3_fail(Q3_ERR_NOMEM, "out of memory for the matrices of %s", stack->name);
    q3_tensor_stack_fill(stack, (q3_tensor *)p, (const q3_tensor **)(p + n * sizeof(q3_tensor)));
    return Q3_OK;
}

q3_status q3_model_alloc_stacks(q3_model *m)
{
    const q3_config *c = &m->cfg;
    size_t n_stacks = (size_t)c->n_layers * 3, n_mats = n_stacks * (size_t)c->n_experts;
    m->stacks = calloc(n_stacks, sizeof *m->stacks);
    m->stack_mem = calloc(n_mats, sizeof(q3_tensor) + sizeof(q3_tensor *));
    if (!m->stacks || !m->stack_mem) return q3_fail(Q3_ERR_NOMEM, "out of memory for %zu expert matrices", n_mats);
    return Q3_OK;
}

q3_tensor *q3_model_stack_slot(q3_model *m, int l, int s, q3_tensor **views, const q3_tensor ***ptrs)
{
    size_t E = (size_t)m->cfg.n_experts, i = (size_t)l * 3 + (size_t)s, n_mats = (size_t)m->cfg.n_layers * 3 * E;
    *views = (q3_tensor *)m->stack_mem + i * E;
    *ptrs = (const q3_tensor **)((q3_tensor *)m->stack_mem + n_mats) + i * E;
    return &m->stacks[i];
}

/* A folder's experts are separate tensors ("mlp.experts.E.gate_proj.weight"):
 * each is bound as a 2-D weight, all of one dtype, and the stack is a
 * descriptor over them (no data of its own). */
static q3_status bind_hf_stack(q3_model *m, int l, int s, const q3_tensor_layout *t, const q3_tensor **out)
{
    q3_tensor *views;
    const q3_tensor **ptrs;
    q3_tensor *stack = q3_model_stack_slot(m, l, s, &views, &ptrs);
    int64_t shape[3];
    q3_layout_shape(t, &m->cfg, shape);
    q3_tensor_layout one = *t;
    one.stack = Q3_DIM_NONE;
    size_t total = 0;
    for (int e = 0; e < m->cfg.n_experts; e++) {
        char name[160];
        q3_layout_name(t, l, e, 0, name, sizeof name);
        q3_status st = bind(m, name, &one, &ptrs[e]);
        if (st) return st;
        if (ptrs[e]->dtype != ptrs[0]->dtype)
            return q3_fail(Q3_ERR_UNSUPPORTED, "%s: tensor \"%s\" is %s but expert 0's is %s: q3 needs one dtype for "
                           "the experts of a layer's projection",
                           m->path, name, q3_dtype_name(ptrs[e]->dtype), q3_dtype_name(ptrs[0]->dtype));
        total += ptrs[e]->nbytes;
    }
    snprintf(stack->name, sizeof stack->name, "model.layers.%d.%s", l, t->hf);
    char *fmt = strstr(stack->name, "%d");
    if (fmt) memmove(fmt + 1, fmt + 2, strlen(fmt + 2) + 1), fmt[0] = '*'; /* "mlp.experts.*.gate_proj.weight" */
    stack->dtype = ptrs[0]->dtype;
    stack->ndim = 3;
    memcpy(stack->shape, shape, sizeof shape);
    stack->nbytes = total;
    stack->mats = ptrs;
    *out = stack;
    (void)views;
    return Q3_OK;
}

static q3_status bind_hf_weights(q3_model *m)
{
    const q3_config *c = &m->cfg;
    q3_weights *w = &m->w;
    q3_status st;
    if ((st = bind(m, q3_embed_layout.hf, &q3_embed_layout, &w->embed))) return st;
    if ((st = bind(m, q3_out_norm_layout.hf, &q3_out_norm_layout, &w->out_norm))) return st;
    const q3_tensor *head = find_any(m, q3_lm_head_layout.hf);
    if (c->tied_embeddings || !head) {
        if (!c->tied_embeddings)
            return q3_fail(Q3_ERR_FORMAT, "%s: missing tensor \"%s\" (config says tie_word_embeddings is false)",
                           m->path, q3_lm_head_layout.hf);
        w->lm_head = w->embed;
    } else if ((st = bind(m, q3_lm_head_layout.hf, &q3_lm_head_layout, &w->lm_head))) {
        return st;
    }
    w->layers = calloc((size_t)c->n_layers, sizeof *w->layers);
    if (!w->layers) return q3_fail(Q3_ERR_NOMEM, "out of memory");
    if (q3_config_is_moe(c) && (st = q3_model_alloc_stacks(m))) return st;
    const q3_tensor_layout *ts[Q3_LAYER_TENSORS + Q3_MOE_TENSORS];
    int fields[Q3_LAYER_TENSORS + Q3_MOE_TENSORS], n = q3_layer_tensors(c, ts, fields);
    for (int l = 0; l < c->n_layers; l++) {
        const q3_tensor **f = (const q3_tensor **)&w->layers[l]; /* q3_layer_layout, q3_moe_layout order */
        for (int i = 0, s = 0; i < n; i++) {
            char name[160];
            if (ts[i]->stack != Q3_DIM_NONE) {
                st = bind_hf_stack(m, l, s++, ts[i], &f[fields[i]]);
            } else {
                q3_layout_name(ts[i], l, 0, 0, name, sizeof name);
                st = bind(m, name, ts[i], &f[fields[i]]);
            }
            if (st) return st;
        }
    }
    return Q3_OK;
}

/* ---- shards ---------------------------------------------------------------- */

/* Most shard files an index may name (the largest Qwen3 checkpoints have ~120). */
enum { MAX_SHARDS = 4096 };

typedef struct shard_ref {
    const char *name; /* in the cJSON tree */
    size_t first;     /* index of its first weight_map entry */
} shard_ref;

static int cmp_shard_name(const void *a, const void *b)
{
    const shard_ref *x = a, *y = b;
    int c = strcmp(x->name, y->name);
    return c ? c : (x->first > y->first) - (x->first < y->first);
}

static int cmp_shard_first(const void *a, const void *b)
{
    const shard_ref *x = a, *y = b;
    return (x->first > y->first) - (x->first < y->first);
}

/* Reads model.safetensors.index.json's weight_map and returns the distinct
 * shard file names in order of first mention (caller frees each and the
 * array). Sorted, not compared pairwise: a 64 MB index holds millions of
 * entries. */
typedef struct named_index {
    const char *name;
    int index;
} named_index;

static int cmp_named(const void *a, const void *b)
{
    return strcmp(((const named_index *)a)->name, ((const named_index *)b)->name);
}

/* Fills m->weight_map from the index's weight_map object and the shard list (file order). */
static q3_status build_weight_map(q3_model *m, const cJSON *map, char **list, size_t n, const char *index_path)
{
    size_t n_entries = (size_t)cJSON_GetArraySize(map);
    named_index *files = malloc((n ? n : 1) * sizeof *files);
    m->weight_map = calloc(n_entries ? n_entries : 1, sizeof *m->weight_map);
    if (!files || !m->weight_map) {
        free(files);
        return q3_fail(Q3_ERR_NOMEM, "%s: out of memory for %zu weight_map entries", index_path, n_entries);
    }
    for (size_t i = 0; i < n; i++) files[i] = (named_index){list[i], (int)i};
    qsort(files, n, sizeof *files, cmp_named);
    const cJSON *e;
    size_t k = 0;
    cJSON_ArrayForEach(e, map) {
        named_index key = {e->valuestring, 0};
        const named_index *hit = bsearch(&key, files, n, sizeof *files, cmp_named);
        struct q3_weight_map_entry *w = &m->weight_map[k];
        w->tensor = strdup(e->string ? e->string : "");
        w->file = hit ? hit->index : -1;
        w->order = k++;
        if (!w->tensor) {
            m->n_weight_map = k;
            free(files);
            return q3_fail(Q3_ERR_NOMEM, "%s: out of memory", index_path);
        }
    }
    m->n_weight_map = k;
    free(files);
    qsort(m->weight_map, k, sizeof *m->weight_map, cmp_map_entry);
    return Q3_OK;
}

static q3_status read_shard_list(q3_model *m, const char *index_path, char ***names, int *count)
{
    char *text;
    q3_status st = q3_read_file(index_path, 64u << 20, &text, NULL);
    if (st) return st;
    cJSON *root = cJSON_Parse(text);
    free(text);
    if (!root) return q3_fail(Q3_ERR_FORMAT, "%s: malformed JSON", index_path);
    const cJSON *map = cJSON_GetObjectItemCaseSensitive(root, "weight_map");
    if (!cJSON_IsObject(map)) {
        cJSON_Delete(root);
        return q3_fail(Q3_ERR_FORMAT, "%s: no \"weight_map\" object", index_path);
    }
    size_t n_entries = (size_t)cJSON_GetArraySize(map), n = 0;
    shard_ref *refs = malloc((n_entries ? n_entries : 1) * sizeof *refs);
    char **list = NULL;
    if (!refs) {
        st = q3_fail(Q3_ERR_NOMEM, "%s: out of memory for %zu weight_map entries", index_path, n_entries);
        goto done;
    }
    const cJSON *e;
    size_t i = 0;
    cJSON_ArrayForEach(e, map) {
        if (!cJSON_IsString(e) || strchr(e->valuestring, '/') || !strcmp(e->valuestring, "..") ||
            !e->valuestring[0]) {
            st = q3_fail(Q3_ERR_FORMAT, "%s: weight_map entry \"%s\" is not a plain file name", index_path,
                         e->string);
            goto done;
        }
        refs[i] = (shard_ref){e->valuestring, i};
        i++;
    }
    if (n_entries == 0) {
        st = q3_fail(Q3_ERR_FORMAT, "%s: weight_map is empty", index_path);
        goto done;
    }
    /* distinct names, each at its first mention, back in file order */
    qsort(refs, n_entries, sizeof *refs, cmp_shard_name);
    for (i = 0; i < n_entries; i++)
        if (i == 0 || strcmp(refs[i].name, refs[n - 1].name)) refs[n++] = refs[i];
    if (n > MAX_SHARDS) {
        st = q3_fail(Q3_ERR_FORMAT, "%s: weight_map names %zu shard files, more than the %d q3 opens", index_path,
                     n, MAX_SHARDS);
        goto done;
    }
    qsort(refs, n, sizeof *refs, cmp_shard_first);
    list = calloc(n, sizeof *list);
    if (!list) {
        st = q3_fail(Q3_ERR_NOMEM, "%s: out of memory", index_path);
        goto done;
    }
    for (i = 0; i < n; i++)
        if (!(list[i] = strdup(refs[i].name))) {
            st = q3_fail(Q3_ERR_NOMEM, "%s: out of memory", index_path);
            goto done;
        }
    st = build_weight_map(m, map, list, n, index_path);
done:
    free(refs);
    cJSON_Delete(root);
    if (st) {
        if (list)
            for (i = 0; i < n; i++) free(list[i]);
        free(list);
        return st;
    }
    *names = list;
    *count = (int)n;
    return Q3_OK;
}

static q3_status open_shards(q3_model *m)
{
    char p[PATH_MAX];
    snprintf(p, sizeof p, "%s/model.safetensors", m->path);
    if (q3_file_exists(p)) {
        m->files = calloc(1, sizeof *m->files);
        if (!m->files) return q3_fail(Q3_ERR_NOMEM, "out of memory");
        q3_status st = q3_safetensors_open(p, &m->files[0]);
        if (!st) m->n_files = 1;
        return st;
    }
    snprintf(p, sizeof p, "%s/model.safetensors.index.json", m->path);
    if (!q3_file_exists(p))
        return q3_fail(Q3_ERR_IO, "%s: no model.safetensors or model.safetensors.index.json in the folder", m->path);
    char **names = NULL;
    int n = 0;
    q3_status st = read_shard_list(m, p, &names, &n);
    if (st) return st;
    m->files = calloc((size_t)n, sizeof *m->files);
    for (int i = 0; i < n; i++) {
        if (!st && m->files) {
            if ((size_t)snprintf(p, sizeof p, "%s/%s", m->path, names[i]) >= sizeof p)
                st = q3_fail(Q3_ERR_FORMAT, "%s: shard file name \"%.60s...\" is too long for a path", m->path,
                             names[i]);
            else if (!(st = q3_safetensors_open(p, &m->files[i])))
                m->n_files++;
        }
        free(names[i]);
    }
    free(names);
    if (!m->files) return q3_fail(Q3_ERR_NOMEM, "out of memory");
    return st;
}

/* ---- public ---------------------------------------------------------------- */

q3_status q3_model_open_gguf(const char *path, q3_model *m); /* model_gguf.c */
q3_status q3_model_find_pooling(q3_model *m);                 /* task.c */

q3_status q3_model_open(const char *path, q3_model **out)
{
    Q3_NOT_NULL(out);
    *out = NULL;
    q3_clear_error();
    if (!path || !*path) return q3_fail(Q3_ERR_INVALID, "no model path given");
    q3_model *m = calloc(1, sizeof *m);
    if (!m) return q3_fail(Q3_ERR_NOMEM, "out of memory");
    m->path = strdup(path);
    q3_status st;
    if (q3_is_dir(path)) {
        char p[PATH_MAX];
        snprintf(p, sizeof p, "%s/config.json", path);
        if (!q3_file_exists(p)) {
            st = q3_fail(Q3_ERR_IO, "%s: no config.json in the model folder", path);
        } else if (!(st = q3_config_load(p, &m->cfg)) && !(st = open_shards(m))) {
            st = bind_hf_weights(m);
        }
    } else if (q3_file_exists(path)) {
        size_t n = strlen(path);
        if (n > 5 && !strcmp(path + n - 5, ".gguf"))
            st = q3_model_open_gguf(path, m);
        else
            st = q3_fail(Q3_ERR_UNSUPPORTED, "%s: not a model folder or a .gguf file", path);
    } else {
        st = q3_fail(Q3_ERR_IO, "%s: %s", path, q3_path_problem(path)); /* "is a FIFO", not "no such file" */
    }
    if (!st) st = q3_model_find_pooling(m);
    if (st) {
        q3_model_close(m);
        return st;
    }
    *out = m;
    return Q3_OK;
}

void q3_model_close(q3_model *m)
{
    if (!m) return;
    /* compute units' packed copies of the weights (matmuls: the layers' and the LM head) */
    for (int l = 0; m->w.layers && l < m->cfg.n_layers; l++) {
        const q3_layer_weights *L = &m->w.layers[l];
        const q3_tensor *ts[] = {L->wq, L->wk, L->wv, L->wo, L->w_gate, L->w_up, L->w_down, L->router};
        for (size_t i = 0; i < sizeof ts / sizeof *ts; i++)
            if (ts[i]) q3_tensor_drop_packed(ts[i]);
        const q3_tensor *stacks[] = {L->exp_gate, L->exp_up, L->exp_down};
        for (size_t i = 0; i < 3; i++) {
            if (stacks[i]) q3_tensor_drop_packed(stacks[i]); /* a unit's copy of all its matrices */
            for (int e = 0; stacks[i] && stacks[i]->mats && e < stacks[i]->shape[0]; e++)
                if (stacks[i]->mats[e]) q3_tensor_drop_packed(stacks[i]->mats[e]);
        }
    }
    if (m->w.lm_head) q3_tensor_drop_packed(m->w.lm_head);
    for (int i = 0; i < m->n_files; i++) q3_safetensors_close(&m->files[i]);
    free(m->files);
    for (size_t i = 0; i < m->n_weight_map; i++) free(m->weight_map[i].tensor);
    free(m->weight_map);
    free(m->w.layers);
    free(m->stacks);
    free(m->stack_mem);
    q3_gguf_close(m->gguf);
    free(m->path);
    free(m);
}

int q3_model_vocab_size(const q3_model *m) { return m ? m->cfg.vocab_size : 0; }
int q3_model_max_context(const q3_model *m) { return m ? m->cfg.max_seq_len : 0; }

/* fn(t, share, arg) for every bound weight once, share = the fraction of it
 * one token reads (experts: used / total; the embedding: one row). */
static void each_tensor(const q3_model *m, void (*fn)(const q3_tensor *, double, void *), void *arg)
{
    const q3_weights *w = &m->w;
    const q3_config *c = &m->cfg;
    bool tied = w->lm_head == w->embed;
    fn(w->embed, tied ? 1.0 : 1.0 / (double)c->vocab_size, arg);
    fn(w->out_norm, 1.0, arg);
    if (!tied) fn(w->lm_head, 1.0, arg);
    for (int l = 0; l < c->n_layers; l++) {
        const q3_tensor *const *t = (const q3_tensor *const *)&w->layers[l];
        for (size_t i = 0; i < sizeof(q3_layer_weights) / sizeof(void *); i++)
            if (t[i]) fn(t[i], t[i]->ndim == 3 ? (double)c->n_experts_used / (double)c->n_experts : 1.0, arg);
    }
}

typedef struct tally {
    double total, active;
    bool params;
} tally;

static void add(const q3_tensor *t, double share, void *arg)
{
    tally *s = arg;
    double n = s->params ? (double)q3_tensor_numel(t) : (double)t->nbytes;
    s->total += n;
    s->active += n * share;
}

static tally count(const q3_model *m, bool params)
{
    tally s = {.params = params};
    each_tensor(m, add, &s);
    return s;
}

size_t q3_model_weight_bytes(const q3_model *m) { return (size_t)count(m, false).total; }
size_t q3_model_param_count(const q3_model *m) { return (size_t)count(m, true).total; }
size_t q3_model_active_bytes(const q3_model *m) { return (size_t)count(m, false).active; }
size_t q3_model_active_params(const q3_model *m) { return (size_t)count(m, true).active; }
