#include "tools/bench.h"

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "model/model.h"
#include "run/session.h"
#include "run/context.h"
#include "util/error.h"

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Percentiles by nearest rank on a sorted copy. */
void q3_stats_compute(const double *ms, int n, q3_stats *s)
{
    memset(s, 0, sizeof *s);
    if (n <= 0) return;
    double *v = malloc((size_t)n * sizeof *v);
    memcpy(v, ms, (size_t)n * sizeof *v);
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    double sum = 0;
    for (int i = 0; i < n; i++) sum += v[i];
    s->n = n;
    s->mean = sum / n;
    s->min = v[0];
    s->max = v[n - 1];
    s->p50 = v[(int)ceil(0.50 * n) - 1];
    s->p99 = v[(int)ceil(0.99 * n) - 1];
    double ss = 0;
    for (int i = 0; i < n; i++) ss += (v[i] - s->mean) * (v[i] - s->mean);
    s->sd = n > 1 ? sqrt(ss / (n - 1)) : 0;
    free(v);
}

static int32_t argmax(const float *x, int n)
{
    int32_t best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

q3_status q3_bench_run(q3_model *m, const q3_bench_opts *o, q3_bench_result *r)
{
    memset(r, 0, sizeof *r);
    int S = o->chunk > 0 ? o->chunk : 128, gen = o->gen > 0 ? o->gen : 64;
    int P = o->prompt_len > 0 ? o->prompt_len : S;
    int reps = o->repeats > 0 ? o->repeats : 5, depth = o->depth > P ? o->depth : P;
    int V = m->cfg.vocab_size;
    q3_session_opts so = {.n_ctx = depth + gen + 2, .chunk = S, .prefill_backend = o->prefill_unit,
                          .decode_backend = o->decode_unit, .kv_dtype = o->kv_dtype};
    if (so.n_ctx > m->cfg.max_seq_len)
        return q3_fail(Q3_ERR_INVALID, "depth %d + %d generated tokens exceed the model's context %d", depth, gen,
                       m->cfg.max_seq_len);
    q3_session *s;
    q3_status st = q3_session_new(m, &so, &s);
    if (st) return st;
    int32_t *prompt = malloc((size_t)depth * sizeof *prompt);
    float *logits = malloc((size_t)V * sizeof *logits);
    double *ms = malloc((size_t)(reps > gen ? reps : gen) * sizeof *ms);
    r->generated = malloc((size_t)gen * sizeof *r->generated);
    if (!prompt || !logits || !ms || !r->generated) {
        st = q3_fail(Q3_ERR_NOMEM, "out of memory");
        goto done;
    }
    uint64_t x = 0x9e3779b97f4a7c15ull;
    for (int i = 0; i < depth; i++) {
        if (o->prompt && i < P) {
            prompt[i] = o->prompt[i];
        } else {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            prompt[i] = (int32_t)(x % (uint64_t)V);
        }
    }
    /* prefill: one warm-up run, then `reps` timed runs of the prompt from position 0 */
    for (int i = -1; i < reps; i++) {
        q3_session_reset(s);
        s->ctx->handoff_seconds = 0;
        double t0 = q3_now();
        if ((st = q3_session_prefill(s, prompt, (size_t)P, logits, 0))) goto done;
        if (i >= 0) ms[i] = 1e3 * (q3_now() - t0);
    }
    q3_stats_compute(ms, reps, &r->prefill_ms);
    r->prompt_len = P;
    r->n_chunks = (P + S - 1) / S;
    r->handoff_ms = 1e3 * s->ctx->handoff_seconds / r->n_chunks;
    r->prompt_tok_s = P / (r->prefill_ms.p50 / 1e3);
    for (int c = 0; c < r->n_chunks; c++)
        r->prefill_flops += q3_graph_flops(&s->ctx->prefill, P - c * S < S ? P - c * S : S, c * S);
    /* fill the cache to `depth`, then decode greedily: one warm-up step, `gen` timed */
    if (depth > P && (st = q3_session_prefill(s, prompt + P, (size_t)(depth - P), logits, 0))) goto done;
    int32_t tok = argmax(logits, V);
    for (int i = -1; i < gen; i++) {
        double t0 = q3_now();
        if ((st = q3_session_decode(s, tok, logits))) goto done;
        if (i >= 0) ms[i] = 1e3 * (q3_now() - t0);
        tok = argmax(logits, V);
        if (i >= 0) r->generated[r->n_generated++] = tok;
    }
    q3_stats_compute(ms, gen, &r->decode_ms);
    r->decode_tok_s = 1e3 / r->decode_ms.mean;
    /* bytes a decode token streams: what one token reads of the weights (every
       matrix once, a MoE layer's chosen experts only, one embedding row unless
       it is the LM head too), and the K/V of the positions it attends to */
    r->active_bytes = (double)q3_model_active_bytes(m);
    r->kv_bytes = (double)(depth + gen / 2) * (double)s->ctx->kv.row_bytes * 2.0 * m->cfg.n_layers;
    r->decode_bytes = r->active_bytes + r->kv_bytes;
done:
    if (st) {
        free(r->generated);
        r->generated = NULL;
    }
    q3_session_free(s);
    free(prompt);
    free(logits);
    free(ms);
    return st;
}

double q3_bench_experts_expected(int n, int k, int rows)
{
    if (n <= 0 || k <= 0) return 0;
    return n * (1.0 - pow(1.0 - (double)k / n, rows));
}

/* Bytes of one expert (gate, up and down) of layer l. */
static double expert_bytes(const q3_model *m, int l)
{
    const q3_layer_weights *L = &m->w.layers[l];
    if (!L->exp_gate) return 0;
    return (double)(L->exp_gate->nbytes + L->exp_up->nbytes + L->exp_down->nbytes) / m->cfg.n_experts;
}

/* Weight bytes one decode step of B rows streams, each matrix read once for
 * all rows: what one token reads (q3_model_active_bytes) with each MoE
 * layer's k experts replaced by the `experts` distinct ones the rows chose. */
static double step_weight_bytes(const q3_model *m, double experts)
{
    double w = (double)q3_model_active_bytes(m);
    for (int l = 0; l < m->cfg.n_layers; l++) w += (experts - m->cfg.n_experts_used) * expert_bytes(m, l);
    return w;
}

/* ---- a tap on the decode runner's units: the router's choices, counted ----
 * Each unit instance of the decode runner is replaced, for the timed steps,
 * by one that runs the op on it and, after a MOE_ROUTE, counts the distinct
 * experts of the step's live rows (its ids output). Nothing in src/ changes:
 * the runner calls whichever unit its table names. */
typedef struct expert_tap {
    q3_backend b;      /* the inner unit's descriptor with run() and run_many() replaced */
    q3_unit u;         /* what the runner calls */
    q3_unit *inner;
    double distinct;   /* sum over routed layers and steps */
    long routes;       /* MOE_ROUTE ops counted */
} expert_tap;

/* After op ran: a MOE_ROUTE's distinct experts over the live rows, counted. */
static void tap_count(expert_tap *t, const q3_exec *e, const q3_op *op)
{
    if (op->kind != Q3_OP_MOE_ROUTE) return;
    const q3_value *ids = &e->g->values[op->out];
    int n_exp = e->g->values[op->in[0]].cols, rows = ids->rows == 1 ? 1 : e->n_real, seen = 0;
    unsigned char used[4096];
    if (n_exp > (int)sizeof used) return;
    memset(used, 0, (size_t)n_exp);
    for (size_t i = 0; i < (size_t)rows * (size_t)ids->cols; i++) {
        int x = (int)e->buf[op->out][i];
        if (x >= 0 && x < n_exp && !used[x]++) seen++;
    }
    t->distinct += seen;
    t->routes++;
}

static q3_status tap_run(void *impl, const q3_exec *e, const q3_op *op)
{
    expert_tap *t = impl;
    q3_status st = t->inner->b->run(t->inner->impl, e, op);
    if (!st) tap_count(t, e, op);
    return st;
}

/* The inner unit's run_many (set only where it has one), every op it ran counted. */
static q3_status tap_run_many(void *impl, const q3_exec *e, const q3_op *ops, int n, int *ran)
{
    expert_tap *t = impl;
    q3_status st = t->inner->b->run_many(t->inner->impl, e, ops, n, ran);
    for (int i = 0; !st && i < *ran; i++) tap_count(t, e, &ops[i]);
    return st;
}

q3_status q3_bench_batch(q3_model *m, const q3_bench_opts *o, const int *batches, int n, q3_batch_result *out)
{
    int max_b = 0, gen = o->gen > 0 ? o->gen : 32, depth = o->depth > 0 ? o->depth : 1, V = m->cfg.vocab_size;
    for (int i = 0; i < n; i++) {
        if (batches[i] < 1 || batches[i] > 256) return q3_fail(Q3_ERR_INVALID, "batch %d is out of range (1..256)", batches[i]);
        if (batches[i] > max_b) max_b = batches[i];
    }
    int n_ctx = depth + gen + 4;
    if (n_ctx > m->cfg.max_seq_len)
        return q3_fail(Q3_ERR_INVALID, "depth %d + %d steps exceed the model's context %d", depth, gen, m->cfg.max_seq_len);
    q3_ctx_opts co = {.n_ctx = n_ctx, .chunk = o->chunk > 0 ? o->chunk : 128, .max_seqs = max_b,
                      .prefill_backend = o->prefill_unit, .decode_backend = o->decode_unit, .kv_dtype = o->kv_dtype};
    q3_ctx *c;
    q3_status st = q3_ctx_new(m, &co, &c);
    if (st) return st;
    int32_t *tokens = malloc((size_t)n_ctx * sizeof *tokens);
    double *ms = malloc((size_t)gen * sizeof *ms);
    q3_decode_row *rows = calloc((size_t)max_b, sizeof *rows);
    int *seq = calloc((size_t)max_b, sizeof *seq);
    if (!tokens || !ms || !rows || !seq) {
        st = q3_fail(Q3_ERR_NOMEM, "out of memory");
        goto done;
    }
    /* sequence 0 is prefilled to the depth; the others get copies of its K/V
       in blocks of their own (real bytes to read, not shared blocks) */
    uint64_t x = 0x9e3779b97f4a7c15ull;
    for (int i = 0; i < n_ctx; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        tokens[i] = (int32_t)(x % (uint64_t)V);
    }
    for (int b = 0; b < max_b; b++)
        if ((st = q3_seq_new(c, &seq[b]))) goto done;
    for (int done = 0; done < depth;) {
        int k = depth - done < c->chunk ? depth - done : c->chunk;
        q3_step s = {.prefill_seq = seq[0], .prefill_tokens = tokens + done, .n_prefill = k};
        if ((st = q3_ctx_step(c, &s))) goto done;
        done += k;
    }
    for (int b = 1; b < max_b; b++) {
        if ((st = q3_kv_seq_reserve(&c->kv, seq[b], depth))) goto done;
        const int32_t *src = c->kv.seqs[seq[0]].table, *dst = c->kv.seqs[seq[b]].table;
        for (int blk = 0; blk < q3_kv_blocks_for(depth); blk++)
            q3_kv_block_copy(&c->kv, dst[blk], src[blk]);
        tokens[0] = b; /* its own first token: the prefix cache keeps the copies apart */
        q3_kv_seq_commit(&c->kv, seq[b], tokens, depth);
    }
    bool moe = q3_config_is_moe(&m->cfg);
    expert_tap taps[Q3_PLAN_MAX_UNITS];
    q3_unit *saved[Q3_PLAN_MAX_UNITS];
    int n_units = c->run_decode.plan.n_units;
    for (int u = 0; u < n_units; u++) {
        saved[u] = c->run_decode.unit[u];
        taps[u] = (expert_tap){.b = *saved[u]->b, .inner = saved[u]};
        taps[u].b.run = tap_run;
        if (taps[u].b.run_many) taps[u].b.run_many = tap_run_many;
        taps[u].u = (q3_unit){.b = &taps[u].b, .impl = &taps[u], .n_threads = saved[u]->n_threads};
    }
    double kv_row = 2.0 * m->cfg.n_layers * (double)c->kv.row_bytes; /* K and V of one position */
    for (int i = 0; i < n; i++) {
        int B = batches[i];
        q3_batch_result *r = &out[i];
        memset(r, 0, sizeof *r);
        r->batch = B;
        for (int b = 0; b < B; b++)
            if ((st = q3_seq_truncate(c, seq[b], depth))) goto done;
        for (int u = 0; u < n_units; u++) taps[u].distinct = 0, taps[u].routes = 0;
        for (int step = -1; step < gen; step++) {
            for (int b = 0; b < B; b++)
                rows[b] = (q3_decode_row){.seq = seq[b], .token = tokens[(depth + step + 1 + 7 * b) % n_ctx]};
            q3_step s = {.decode = rows, .n_decode = B, .prefill_seq = -1};
            /* the timed steps of a MoE model run through the taps (one indirect call more an op) */
            for (int u = 0; moe && step == 0 && u < n_units; u++) c->run_decode.unit[u] = &taps[u].u;
            double t0 = q3_now();
            st = q3_ctx_step(c, &s);
            if (step >= 0) ms[step] = 1e3 * (q3_now() - t0);
            if (st) break;
        }
        for (int u = 0; u < n_units; u++) c->run_decode.unit[u] = saved[u];
        if (st) goto done;
        q3_stats_compute(ms, gen, &r->step_ms);
        r->tok_s = B * 1e3 / r->step_ms.mean;
        if (moe) {
            double distinct = 0;
            long routes = 0;
            for (int u = 0; u < n_units; u++) distinct += taps[u].distinct, routes += taps[u].routes;
            r->experts_measured = routes ? distinct / routes : 0;
            r->experts_expected = q3_bench_experts_expected(m->cfg.n_experts, m->cfg.n_experts_used, B);
        }
        r->weight_bytes = step_weight_bytes(m, moe ? r->experts_measured : m->cfg.n_experts_used);
        r->kv_bytes = (double)B * (depth + 1 + gen / 2.0) * kv_row;
        double mm = 0;
        for (int op = 0; op < c->decode.n_ops; op++) {
            const q3_op *o = &c->decode.ops[op];
            if (o->kind == Q3_OP_MATMUL)
                mm += 2.0 * (double)o->weight->shape[0] * (double)o->weight->shape[1];
            else if (o->kind == Q3_OP_MATMUL_ID) /* k experts a row */
                mm += 2.0 * m->cfg.n_experts_used * (double)o->weight->shape[1] * (double)o->weight->shape[2];
        }
        r->flops = B * (mm + 4.0 * (depth + 1 + gen / 2.0) * m->cfg.n_heads * m->cfg.head_dim * m->cfg.n_layers);
    }
done:
    free(tokens);
    free(ms);
    free(rows);
    free(seq);
    q3_ctx_free(c);
    return st;
}
