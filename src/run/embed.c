/* Embeddings and reranker scores (q3.h): inputs packed into runs of the
 * embed graph (graph.h, Q3_GRAPH_EMBED), each run as many whole inputs as
 * fit in batch_tokens rows, one after another with no padding; an input
 * longer than that runs alone in a graph grown to its length. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "q3.h" /* q3_embed, q3_rerank, q3_model_task: public */
#include "run/context.h"
#include "util/error.h"
#include "util/opts.h"

#define DEFAULT_BATCH_TOKENS 1024

q3_task q3_model_task(const q3_model *m)
{
    return m->cfg.pooling == Q3_POOLING_LAST ? Q3_TASK_EMBED : m->cfg.pooling == Q3_POOLING_RANK ? Q3_TASK_RERANK
                                                                                                : Q3_TASK_GENERATE;
}

const char *q3_task_name(q3_task t)
{
    switch (t) {
    case Q3_TASK_GENERATE: return "generate";
    case Q3_TASK_EMBED: return "embed";
    case Q3_TASK_RERANK: return "rerank";
    }
    return "?";
}

int q3_model_hidden_size(const q3_model *m) { return m->cfg.dim; }

q3_embed_opts q3_embed_opts_default(void)
{
    q3_embed_opts o = {.size = sizeof o};
    return o;
}

void q3_ctx_embed_free(q3_ctx *c)
{
    q3_runner_free(&c->run_embed);
    q3_graph_free(&c->embed);
    q3_tensor_drop_packed(&c->score_head);
    free(c->score_mem);
    c->score_mem = NULL;
    free(c->embed_tok);
    free(c->embed_pos);
    c->embed_tok = c->embed_pos = NULL;
}

/* The score head: rows yes and no of the LM head, copied side by side into
 * a [2][dim] weight of the LM head's type (whole rows: every type's blocks
 * run along a row). */
static q3_status make_score_head(q3_ctx *c, int32_t yes, int32_t no)
{
    if (c->model->w.cls_out) return Q3_OK; /* the model's own classifier head */
    if (c->score_mem && c->score_ids[0] == yes && c->score_ids[1] == no) return Q3_OK;
    const q3_tensor *head = c->model->w.lm_head;
    size_t rb = q3_dtype_row_bytes(head->dtype, (size_t)c->model->cfg.dim);
    void *mem = aligned_alloc(64, (2 * rb + 63) & ~(size_t)63);
    if (!mem) return q3_fail(Q3_ERR_NOMEM, "out of memory");
    memcpy(mem, (const char *)head->data + (size_t)yes * rb, rb);
    memcpy((char *)mem + rb, (const char *)head->data + (size_t)no * rb, rb);
    /* the graph that points at the old head goes with it */
    q3_runner_free(&c->run_embed);
    q3_graph_free(&c->embed);
    q3_tensor_drop_packed(&c->score_head);
    free(c->score_mem);
    c->score_mem = mem;
    c->score_ids[0] = yes;
    c->score_ids[1] = no;
    q3_tensor *t = &c->score_head;
    memset(t, 0, sizeof *t);
    snprintf(t->name, sizeof t->name, "%s[yes=%d,no=%d]", head->name, (int)yes, (int)no);
    t->dtype = head->dtype;
    t->ndim = 2;
    t->shape[0] = 2;
    t->shape[1] = c->model->cfg.dim;
    t->data = mem;
    t->nbytes = 2 * rb;
    return Q3_OK;
}

/* An embed graph of at least rows rows (with the score head when score). */
static q3_status ensure_graph(q3_ctx *c, int rows, bool score)
{
    if (c->embed.ops && c->embed.rows >= rows && (!score || c->embed.v_score >= 0)) return Q3_OK;
    bool with_score = score || (c->embed.ops && c->embed.v_score >= 0);
    q3_runner_free(&c->run_embed);
    q3_graph_free(&c->embed);
    free(c->embed_tok);
    free(c->embed_pos);
    c->embed_tok = malloc((size_t)rows * sizeof *c->embed_tok);
    c->embed_pos = malloc((size_t)rows * sizeof *c->embed_pos);
    if (!c->embed_tok || !c->embed_pos) return q3_fail(Q3_ERR_NOMEM, "out of memory");
    const q3_tensor *head = c->model->w.cls_out ? c->model->w.cls_out : &c->score_head;
    q3_status st = q3_graph_build_embed(c->model, rows, with_score ? head : NULL, &c->embed);
    if (!st && (st = q3_ctx_plan_runner(c, &c->run_embed, &c->embed, c->prefill_unit))) q3_graph_free(&c->embed);
    return st;
}

/* Checks every input before any runs. */
static q3_status check_inputs(const q3_ctx *c, const int32_t *const *inputs, const size_t *lens, size_t n)
{
    if (n && (!inputs || !lens)) return q3_fail(Q3_ERR_INVALID, "no inputs given");
    int vocab = c->model->cfg.vocab_size;
    for (size_t i = 0; i < n; i++) {
        if (lens[i] == 0) return q3_fail(Q3_ERR_INVALID, "input %zu is empty", i);
        if (lens[i] > (size_t)c->n_ctx)
            return q3_fail(Q3_ERR_CONTEXT, "input %zu has %zu tokens; the context holds %d", i, lens[i], c->n_ctx);
        if (!inputs[i]) return q3_fail(Q3_ERR_INVALID, "input %zu has no tokens", i);
        for (size_t t = 0; t < lens[i]; t++)
            if (inputs[i][t] < 0 || inputs[i][t] >= vocab)
                return q3_fail(Q3_ERR_INVALID, "input %zu: token %zu is %d, outside the vocabulary [0, %d)", i, t,
                               (int)inputs[i][t], vocab);
    }
    return Q3_OK;
}

/* Runs the inputs in packed batches; for each input i, `emit` gets the row of
 * its last token in the run's outputs. */
typedef void (*emit_fn)(void *user, size_t i, const q3_runner *r, int row);

static q3_status run_packed(q3_ctx *c, const int32_t *const *inputs, const size_t *lens, size_t n, int batch,
                            bool score, emit_fn emit, void *user)
{
    q3_status st;
    for (size_t i = 0; i < n;) {
        /* as many whole inputs as fit; at least one */
        size_t j = i, rows = 0;
        while (j < n && (j == i || rows + lens[j] <= (size_t)batch)) rows += lens[j++];
        int want = (int)rows > batch ? (int)rows : batch;
        if ((st = ensure_graph(c, want, score))) return st;
        int r = 0;
        for (size_t k = i; k < j; k++)
            for (size_t t = 0; t < lens[k]; t++, r++) {
                c->embed_tok[r] = inputs[k][t];
                c->embed_pos[r] = (int32_t)t;
            }
        if ((st = q3_runner_run(&c->run_embed, c->embed_tok, r, c->embed_pos, NULL, NULL))) return st;
        int end = 0;
        for (size_t k = i; k < j; k++) {
            end += (int)lens[k];
            emit(user, k, &c->run_embed, end - 1);
        }
        i = j;
    }
    return Q3_OK;
}

typedef struct embed_out {
    float *out;
    int dim, hidden;
    bool normalize;
} embed_out;

void q3_embed_normalize(float *v, int dim)
{
    double ss = 0;
    for (int k = 0; k < dim; k++) ss += (double)v[k] * v[k];
    if (!(ss > 0)) return;
    double inv = 1.0 / sqrt(ss);
    for (int k = 0; k < dim; k++) v[k] = (float)((double)v[k] * inv);
}

static void emit_embedding(void *user, size_t i, const q3_runner *r, int row)
{
    const embed_out *e = user;
    const float *h = r->buf[r->g->v_hidden] + (size_t)row * (size_t)e->hidden;
    float *o = e->out + i * (size_t)e->dim;
    memcpy(o, h, (size_t)e->dim * sizeof *o);
    if (e->normalize) q3_embed_normalize(o, e->dim);
}

static q3_status read_opts(const q3_ctx *c, const q3_embed_opts *opts, q3_embed_opts *o)
{
    q3_status st = q3_opts_read(o, sizeof *o, opts, "q3_embed options");
    if (st) return st;
    int hidden = c->model->cfg.dim;
    if (o->dim < 0 || o->dim > hidden)
        return q3_fail(Q3_ERR_INVALID, "an embedding of %d values: this model's are 1..%d", o->dim, hidden);
    if (o->batch_tokens < 0 || o->batch_tokens > 65536)
        return q3_fail(Q3_ERR_INVALID, "batch_tokens %d is out of range (1..65536)", o->batch_tokens);
    if (!o->dim) o->dim = hidden;
    if (!o->batch_tokens) o->batch_tokens = DEFAULT_BATCH_TOKENS;
    return Q3_OK;
}

q3_status q3_embed(q3_ctx *c, const int32_t *const *inputs, const size_t *lens, size_t n, const q3_embed_opts *opts,
                   float *out)
{
    q3_clear_error();
    q3_embed_opts o;
    q3_status st = read_opts(c, opts, &o);
    if (st || (st = check_inputs(c, inputs, lens, n))) return st;
    if (n && !out) return q3_fail(Q3_ERR_INVALID, "q3_embed: no output buffer");
    embed_out e = {.out = out, .dim = o.dim, .hidden = c->model->cfg.dim, .normalize = !o.unnormalized};
    return run_packed(c, inputs, lens, n, o.batch_tokens, false, emit_embedding, &e);
}

typedef struct score_out {
    float *scores, *logits;
} score_out;

static void emit_score(void *user, size_t i, const q3_runner *r, int row)
{
    const score_out *s = user;
    const float *l = r->buf[r->g->v_score] + (size_t)row * 2;
    /* P(yes) / (P(yes) + P(no)) = 1 / (1 + exp(no - yes)) */
    s->scores[i] = (float)(1.0 / (1.0 + exp((double)l[1] - (double)l[0])));
    if (s->logits) {
        s->logits[2 * i] = l[0];
        s->logits[2 * i + 1] = l[1];
    }
}

q3_status q3_rerank(q3_ctx *c, const q3_tokenizer *tok, const int32_t *const *inputs, const size_t *lens, size_t n,
                    const q3_embed_opts *opts, float *scores, float *logits)
{
    q3_clear_error();
    q3_embed_opts o;
    q3_status st = read_opts(c, opts, &o);
    if (st || (st = check_inputs(c, inputs, lens, n))) return st;
    if (n && !scores) return q3_fail(Q3_ERR_INVALID, "q3_rerank: no output buffer");
    if (!c->model->w.cls_out) { /* the LM head's rows of "yes" and "no" */
        if (!tok) return q3_fail(Q3_ERR_INVALID, "q3_rerank: no tokenizer (it names the tokens yes and no)");
        int32_t yes = q3_tokenizer_token_id(tok, "yes", 3), no = q3_tokenizer_token_id(tok, "no", 2);
        if (yes < 0 || no < 0)
            return q3_fail(Q3_ERR_UNSUPPORTED, "the tokenizer has no token \"%s\"", yes < 0 ? "yes" : "no");
        int vocab = c->model->cfg.vocab_size;
        if (yes >= vocab || no >= vocab)
            return q3_fail(Q3_ERR_INVALID, "the tokens yes (%d) and no (%d) are outside this model's vocabulary [0, %d)",
                           (int)yes, (int)no, vocab);
        if ((st = make_score_head(c, yes, no))) return st;
    }
    score_out s = {.scores = scores, .logits = logits};
    return run_packed(c, inputs, lens, n, o.batch_tokens, true, emit_score, &s);
}
