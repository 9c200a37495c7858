/* Contexts: unit instances, the KV pool, and the step that runs the decode
 * rows of many sequences and one prefill chunk. */
#include "run/context.h"

#include <stdlib.h>
#include <string.h>

#include "backend/registry.h"
#include "util/error.h"
#include "util/opts.h"

#define MAX_SEQS 256

static q3_status pick_unit(const char *name, const char *fallback, const q3_backend **out)
{
    if (!name) name = fallback;
    if (!name) {
        *out = q3_backend_default();
        return Q3_OK;
    }
    const q3_backend *b = q3_backend_find(name);
    if (!b) {
        char known[256] = "";
        for (int i = 0; q3_backends[i]; i++) {
            strncat(known, i ? ", " : "", sizeof known - strlen(known) - 1);
            strncat(known, q3_backends[i]->name, sizeof known - strlen(known) - 1);
        }
        return q3_fail(Q3_ERR_INVALID, "unknown compute unit \"%s\" (this build has: %s)", name, known);
    }
    if (b->present && !b->present(b))
        return q3_fail(Q3_ERR_UNSUPPORTED, "compute unit \"%s\" (%s): device absent", b->name, b->device);
    *out = b;
    return Q3_OK;
}

/* The context's instance of b, opened on first request. */
static q3_status instance(q3_ctx *c, const q3_backend *b, int n_threads, q3_unit **out)
{
    for (int i = 0; i < c->n_opened; i++)
        if (c->opened[i]->b == b) {
            *out = c->opened[i];
            return Q3_OK;
        }
    q3_unit_opts uo = {.n_threads = n_threads};
    q3_status st = q3_unit_open(b, &uo, out);
    if (st) return st;
    c->opened[c->n_opened++] = *out;
    return Q3_OK;
}

q3_status q3_ctx_plan_runner(q3_ctx *c, q3_runner *r, const q3_graph *g, q3_unit *unit)
{
    q3_unit *units[2] = {unit, c->ref_unit};
    return q3_runner_init(r, g, units, unit == c->ref_unit ? 1 : 2);
}

q3_ctx_opts q3_ctx_opts_default(void)
{
    q3_ctx_opts o = {.size = sizeof o};
    return o;
}

q3_status q3_ctx_new(q3_model *m, const q3_ctx_opts *opts, q3_ctx **out)
{
    Q3_NOT_NULL(out);
    *out = NULL;
    Q3_NOT_NULL(m);
    q3_ctx_opts o;
    q3_status ost = q3_opts_read(&o, sizeof o, opts, "q3_ctx_new options");
    if (ost) return ost;
    int max = m->cfg.max_seq_len;
    if (o.n_ctx < 0 || o.n_ctx > max)
        return q3_fail(Q3_ERR_INVALID, "context length %d is out of range (1..%d for this model)", o.n_ctx, max);
    if (o.n_ctx == 0) o.n_ctx = max < 4096 ? max : 4096;
    if (o.chunk < 0 || o.chunk > 4096)
        return q3_fail(Q3_ERR_INVALID, "chunk size %d is out of range (1..4096)", o.chunk);
    if (o.chunk == 0) o.chunk = 128;
    if (o.max_seqs < 0 || o.max_seqs > MAX_SEQS)
        return q3_fail(Q3_ERR_INVALID, "%d parallel sequences is out of range (1..%d)", o.max_seqs, MAX_SEQS);
    if (o.max_seqs == 0) o.max_seqs = 1;
    /* by default every sequence can fill its context at once (whole blocks each) */
    long long kv_tokens = o.kv_tokens ? o.kv_tokens
                                      : (long long)q3_kv_blocks_for(o.n_ctx) * Q3_KV_BLOCK_TOKENS * o.max_seqs;
    if (o.kv_tokens < 0 || kv_tokens > (1LL << 28))
        return q3_fail(Q3_ERR_INVALID, "a KV pool of %d tokens is out of range (1..%d)", o.kv_tokens, 1 << 28);
    q3_ctx *c = calloc(1, sizeof *c);
    if (!c) return q3_fail(Q3_ERR_NOMEM, "out of memory");
    c->model = m;
    c->n_ctx = o.n_ctx;
    c->chunk = o.chunk;
    c->max_seqs = o.max_seqs;
    q3_status st;
    const q3_backend *pb, *db;
    if ((st = pick_unit(o.prefill_backend, o.backend, &pb))) goto fail;
    if ((st = pick_unit(o.decode_backend, o.backend, &db))) goto fail;
    if ((st = instance(c, &q3_backend_ref, o.n_threads, &c->ref_unit))) goto fail;
    if ((st = instance(c, pb, o.n_threads, &c->prefill_unit))) goto fail;
    if ((st = instance(c, db, o.n_threads, &c->decode_unit))) goto fail;
    int kvt = o.kv_dtype ? q3_dtype_from_name(o.kv_dtype) : (int)db->kv_default;
    if (kvt < 0) {
        st = q3_fail(Q3_ERR_INVALID, "unknown KV cache dtype \"%s\" (f32, f16, bf16, q8_0)", o.kv_dtype);
        goto fail;
    }
    if ((st = q3_kv_pool_init(&c->kv, &m->cfg, (q3_dtype)kvt, q3_kv_blocks_for((int)kv_tokens), c->max_seqs, c->n_ctx)))
        goto fail;
    if ((st = q3_graph_build_prefill(m, c->chunk, false, &c->prefill))) goto fail;
    if ((st = q3_graph_build_decode(m, c->max_seqs, &c->decode))) goto fail;
    if ((st = q3_ctx_plan_runner(c, &c->run_prefill, &c->prefill, c->prefill_unit))) goto fail;
    if ((st = q3_ctx_plan_runner(c, &c->run_decode, &c->decode, c->decode_unit))) goto fail;
    size_t rows = (size_t)(c->chunk > c->max_seqs ? c->chunk : c->max_seqs);
    c->row_pos = calloc(rows, sizeof *c->row_pos);
    c->row_table = calloc(rows, sizeof *c->row_table);
    c->row_tokens = calloc((size_t)c->max_seqs, sizeof *c->row_tokens);
    c->seen = calloc((size_t)c->max_seqs, sizeof *c->seen);
    c->seq_epoch = calloc((size_t)c->max_seqs, sizeof *c->seq_epoch);
    size_t handoff_rows = 2 * (size_t)m->cfg.n_layers * (size_t)c->chunk;
    c->handoff_src = calloc(handoff_rows, sizeof *c->handoff_src);
    c->handoff_dst = calloc(handoff_rows, sizeof *c->handoff_dst);
    if (!c->row_pos || !c->row_table || !c->row_tokens || !c->seen || !c->seq_epoch || !c->handoff_src || !c->handoff_dst) {
        st = q3_fail(Q3_ERR_NOMEM, "out of memory");
        goto fail;
    }
    *out = c;
    return Q3_OK;
fail:
    q3_ctx_free(c);
    return st;
}

void q3_ctx_free(q3_ctx *c)
{
    if (!c) return;
    q3_ctx_embed_free(c);
    q3_runner_free(&c->run_prefill);
    q3_runner_free(&c->run_prefill_all);
    q3_runner_free(&c->run_decode);
    q3_graph_free(&c->prefill);
    q3_graph_free(&c->prefill_all);
    q3_graph_free(&c->decode);
    q3_kv_pool_free(&c->kv);
    for (int i = 0; i < c->n_opened; i++) q3_unit_close(c->opened[i]);
    free(c->row_pos);
    free(c->row_table);
    free(c->row_tokens);
    free(c->seen);
    free(c->seq_epoch);
    free(c->handoff_src);
    free(c->handoff_dst);
    free(c);
}

int q3_ctx_n_ctx(const q3_ctx *c) { return c ? c->n_ctx : 0; }
int q3_ctx_max_seqs(const q3_ctx *c) { return c ? c->max_seqs : 0; }
int q3_ctx_chunk(const q3_ctx *c) { return c ? c->chunk : 0; }

void q3_ctx_kv_usage(const q3_ctx *c, int *used, int *cached, int *total, int *block_tokens)
{
    if (!c) {
        if (used) *used = 0;
        if (cached) *cached = 0;
        if (total) *total = 0;
        if (block_tokens) *block_tokens = 0;
        return;
    }
    q3_kv_pool_usage(&c->kv, used, cached, total);
    if (block_tokens) *block_tokens = Q3_KV_BLOCK_TOKENS;
}

q3_status q3_ctx_enter(q3_ctx *c, const char *what)
{
    if (__atomic_exchange_n(&c->busy, 1, __ATOMIC_ACQUIRE))
        return q3_fail(Q3_ERR_INVALID, "%s: another thread is using this context at the same time (a context is used by "
                       "one thread at a time)", what);
    return Q3_OK;
}

void q3_ctx_leave(q3_ctx *c) { __atomic_store_n(&c->busy, 0, __ATOMIC_RELEASE); }

/* ---- sequences --------------------------------------------------------------------------- */

q3_status q3_seq_new(q3_ctx *c, int *seq)
{
    q3_clear_error();
    Q3_NOT_NULL(c);
    Q3_NOT_NULL(seq);
    q3_status st = q3_ctx_enter(c, "q3_seq_new");
    if (st) return st;
    st = q3_kv_seq_add(&c->kv, seq);
    q3_ctx_leave(c);
    return st;
}

void q3_seq_drop(q3_ctx *c, int seq)
{
    if (!c || q3_ctx_enter(c, "q3_seq_drop")) return; /* another thread inside: nothing dropped, q3_last_error says why */
    if (q3_kv_seq_valid(&c->kv, seq)) {
        q3_kv_seq_drop(&c->kv, seq);
        c->seq_epoch[seq]++;
    }
    q3_ctx_leave(c);
}

q3_status q3_seq_truncate(q3_ctx *c, int seq, int pos)
{
    q3_clear_error();
    Q3_NOT_NULL(c);
    q3_status st = q3_ctx_enter(c, "q3_seq_truncate");
    if (st) return st;
    st = q3_kv_seq_truncate(&c->kv, seq, pos);
    q3_ctx_leave(c);
    return st;
}

q3_status q3_seq_fork(q3_ctx *c, int seq, int *child)
{
    q3_clear_error();
    Q3_NOT_NULL(c);
    Q3_NOT_NULL(child);
    q3_status st = q3_ctx_enter(c, "q3_seq_fork");
    if (st) return st;
    st = q3_kv_seq_fork(&c->kv, seq, child);
    q3_ctx_leave(c);
    return st;
}

int q3_seq_pos(const q3_ctx *c, int seq) { return c && q3_kv_seq_valid(&c->kv, seq) ? q3_kv_seq_len(&c->kv, seq) : -1; }

int q3_seq_reuse_prefix(q3_ctx *c, int seq, const int32_t *tokens, size_t n)
{
    if (!c || !tokens || n < 2 || q3_ctx_enter(c, "q3_seq_reuse_prefix")) return 0;
    int max = n - 1 < (size_t)c->n_ctx ? (int)(n - 1) : c->n_ctx;
    int got = q3_kv_seq_reuse_prefix(&c->kv, seq, tokens, max, max);
    q3_ctx_leave(c);
    return got;
}

/* ---- the step ------------------------------------------------------------------------------ */

static q3_status check_seq(const q3_ctx *c, int seq, const char *what)
{
    if (!q3_kv_seq_valid(&c->kv, seq)) return q3_fail(Q3_ERR_INVALID, "%s names sequence %d, which does not exist", what, seq);
    if (c->seen[seq]) return q3_fail(Q3_ERR_INVALID, "%s names sequence %d twice in one step", what, seq);
    return Q3_OK;
}

static q3_status check_tokens(const q3_ctx *c, const int32_t *tokens, int n, const char *what)
{
    int vocab = c->model->cfg.vocab_size;
    for (int i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= vocab)
            return q3_fail(Q3_ERR_INVALID, "%s: token %d is %d, outside the vocabulary [0, %d)", what, i, tokens[i], vocab);
    return Q3_OK;
}

/* Everything a step can refuse, refused before anything changes. */
static q3_status check_step(q3_ctx *c, const q3_step *s)
{
    memset(c->seen, 0, (size_t)c->max_seqs * sizeof *c->seen);
    if (s->n_decode < 0 || s->n_decode > c->max_seqs)
        return q3_fail(Q3_ERR_INVALID, "a step of %d decode rows: this context decodes at most %d sequences at once",
                       s->n_decode, c->max_seqs);
    if (s->n_decode > 0 && !s->decode) return q3_fail(Q3_ERR_INVALID, "a step of %d decode rows without rows", s->n_decode);
    q3_status st;
    for (int r = 0; r < s->n_decode; r++) {
        const q3_decode_row *d = &s->decode[r];
        if ((st = check_seq(c, d->seq, "a decode row"))) return st;
        c->seen[d->seq] = true;
        if ((st = check_tokens(c, &d->token, 1, "a decode row"))) return st;
    }
    if (s->prefill_seq >= 0) {
        if ((st = check_seq(c, s->prefill_seq, "the prefill"))) return st;
        if (s->n_prefill < 1 || s->n_prefill > c->chunk)
            return q3_fail(Q3_ERR_INVALID, "a prefill chunk of %d tokens (1..%d in one step)", s->n_prefill, c->chunk);
        if (!s->prefill_tokens) return q3_fail(Q3_ERR_INVALID, "a prefill chunk without tokens");
        if ((st = check_tokens(c, s->prefill_tokens, s->n_prefill, "the prefill"))) return st;
    }
    return Q3_OK;
}

/* Reserves every row's blocks, or none. */
static q3_status reserve_step(q3_ctx *c, const q3_step *s)
{
    q3_status st = Q3_OK;
    int r = 0;
    for (; r < s->n_decode; r++)
        if ((st = q3_kv_seq_reserve(&c->kv, s->decode[r].seq, 1)))
            break;
    if (!st && s->prefill_seq >= 0) st = q3_kv_seq_reserve(&c->kv, s->prefill_seq, s->n_prefill);
    if (st) { /* back to the blocks each sequence had */
        char msg[512];
        snprintf(msg, sizeof msg, "%s", q3_last_error());
        for (int i = 0; i < r; i++) q3_kv_seq_truncate(&c->kv, s->decode[i].seq, q3_kv_seq_len(&c->kv, s->decode[i].seq));
        int bad = r < s->n_decode ? s->decode[r].seq : s->prefill_seq;
        return q3_fail(st, "sequence %d: %s", bad, msg);
    }
    return Q3_OK;
}

static void unreserve_step(q3_ctx *c, const q3_step *s)
{
    for (int r = 0; r < s->n_decode; r++) q3_kv_seq_truncate(&c->kv, s->decode[r].seq, q3_kv_seq_len(&c->kv, s->decode[r].seq));
    if (s->prefill_seq >= 0) q3_kv_seq_truncate(&c->kv, s->prefill_seq, q3_kv_seq_len(&c->kv, s->prefill_seq));
}

/* The hand-off: the chunk's K/V rows (graph outputs) go into the sequence's blocks. */
static void hand_off_kv(q3_ctx *c, const q3_runner *r, const int32_t *table, int pos0, int n_real)
{
    double t0 = q3_now();
    const q3_graph *g = r->g;
    size_t kv_dim = (size_t)c->kv.kv_dim, n = 0;
    for (int l = 0; l < g->cfg->n_layers; l++) {
        const float *k = r->buf[g->v_k[l]], *v = r->buf[g->v_v[l]];
        for (int t = 0; t < n_real; t++) {
            c->handoff_src[n] = k + (size_t)t * kv_dim;
            c->handoff_dst[n++] = q3_kv_k_row(&c->kv, table, l, pos0 + t);
            c->handoff_src[n] = v + (size_t)t * kv_dim;
            c->handoff_dst[n++] = q3_kv_v_row(&c->kv, table, l, pos0 + t);
        }
    }
    /* on the unit that ran the prefill when it can (in parallel, with its SIMD) */
    q3_unit *u = c->prefill_unit;
    if (u->b->store_rows) {
        u->b->store_rows(u->impl, c->kv.dtype, c->handoff_src, c->handoff_dst, n, kv_dim);
    } else {
        for (size_t i = 0; i < n; i++) q3_row_from_f32(c->kv.dtype, c->handoff_src[i], c->handoff_dst[i], kv_dim);
    }
    c->handoff_seconds += q3_now() - t0;
}

static q3_status run_decode(q3_ctx *c, const q3_step *s)
{
    int n = s->n_decode;
    for (int r = 0; r < n; r++) {
        int seq = s->decode[r].seq;
        c->row_tokens[r] = s->decode[r].token;
        c->row_pos[r] = q3_kv_seq_len(&c->kv, seq);
        c->row_table[r] = c->kv.seqs[seq].table;
    }
    q3_status st = q3_runner_run(&c->run_decode, c->row_tokens, n, c->row_pos, &c->kv, c->row_table);
    if (st) return st;
    size_t vocab = (size_t)c->model->cfg.vocab_size;
    const float *logits = c->run_decode.buf[c->decode.v_logits];
    for (int r = 0; r < n; r++)
        if (s->decode[r].logits) memcpy(s->decode[r].logits, logits + (size_t)r * vocab, vocab * sizeof(float));
    return Q3_OK;
}

static q3_status run_prefill(q3_ctx *c, const q3_step *s)
{
    q3_status st;
    q3_runner *r = &c->run_prefill;
    bool all = s->prefill_logits && s->prefill_all_rows;
    if (all) {
        if (!c->prefill_all.ops) {
            if ((st = q3_graph_build_prefill(c->model, c->chunk, true, &c->prefill_all))) return st;
            if ((st = q3_ctx_plan_runner(c, &c->run_prefill_all, &c->prefill_all, c->prefill_unit))) {
                q3_graph_free(&c->prefill_all);
                return st;
            }
        }
        r = &c->run_prefill_all;
    }
    int seq = s->prefill_seq, n = s->n_prefill, pos0 = q3_kv_seq_len(&c->kv, seq);
    const int32_t *table = c->kv.seqs[seq].table;
    for (int i = 0; i < n; i++) {
        c->row_pos[i] = pos0 + i;
        c->row_table[i] = table;
    }
    if ((st = q3_runner_run(r, s->prefill_tokens, n, c->row_pos, &c->kv, c->row_table))) return st;
    hand_off_kv(c, r, table, pos0, n);
    if (s->prefill_logits) {
        size_t vocab = (size_t)c->model->cfg.vocab_size;
        memcpy(s->prefill_logits, r->buf[r->g->v_logits], (all ? (size_t)n : 1) * vocab * sizeof(float));
    }
    return Q3_OK;
}

static q3_status step(q3_ctx *c, const q3_step *s)
{
    q3_status st = check_step(c, s);
    if (st) return st;
    if ((st = reserve_step(c, s))) return st;
    if (s->n_decode > 0 && (st = run_decode(c, s))) goto undo;
    if (s->prefill_seq >= 0 && (st = run_prefill(c, s))) goto undo;
    for (int r = 0; r < s->n_decode; r++) q3_kv_seq_commit(&c->kv, s->decode[r].seq, &s->decode[r].token, 1);
    if (s->prefill_seq >= 0) q3_kv_seq_commit(&c->kv, s->prefill_seq, s->prefill_tokens, s->n_prefill);
    return Q3_OK;
undo:
    unreserve_step(c, s);
    return st;
}

q3_status q3_ctx_step(q3_ctx *c, const q3_step *s)
{
    q3_clear_error();
    Q3_NOT_NULL(c);
    Q3_NOT_NULL(s);
    q3_status st = q3_ctx_enter(c, "q3_ctx_step");
    if (st) return st;
    st = step(c, s);
    q3_ctx_leave(c);
    return st;
}
