/* Sessions: prompts of any length as a series of prefill chunks whose K/V are
 * handed to the cache, then decode steps that append to it in-graph. */
#include "run/session.h"

#include <stdlib.h>
#include <string.h>

#include "backend/registry.h"
#include "util/error.h"

int q3_session_units(const q3_backend *preferred, const q3_backend **units)
{
    int n = 0;
    units[n++] = preferred;
    if (preferred != &q3_backend_ref) units[n++] = &q3_backend_ref;
    return n;
}

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

static q3_status plan_runner(q3_runner *r, const q3_graph *g, const q3_backend *unit)
{
    const q3_backend *units[Q3_PLAN_MAX_UNITS];
    int n = q3_session_units(unit, units);
    return q3_runner_init(r, g, units, n);
}

q3_status q3_session_new(q3_model *m, const q3_session_opts *opts, q3_session **out)
{
    *out = NULL;
    q3_session_opts o = {0};
    if (opts) o = *opts;
    int max = m->cfg.max_seq_len;
    if (o.n_ctx < 0 || o.n_ctx > max)
        return q3_fail(Q3_ERR_INVALID, "context length %d is out of range (1..%d for this model)", o.n_ctx, max);
    if (o.n_ctx == 0) o.n_ctx = max < 4096 ? max : 4096;
    if (o.chunk < 0 || o.chunk > 4096)
        return q3_fail(Q3_ERR_INVALID, "chunk size %d is out of range (1..4096)", o.chunk);
    if (o.chunk == 0) o.chunk = 128;
    q3_session *s = calloc(1, sizeof *s);
    if (!s) return q3_fail(Q3_ERR_NOMEM, "out of memory");
    s->model = m;
    s->n_ctx = o.n_ctx;
    s->chunk = o.chunk;
    q3_status st;
    if ((st = pick_unit(o.prefill_backend, o.backend, &s->prefill_unit))) goto fail;
    if ((st = pick_unit(o.decode_backend, o.backend, &s->decode_unit))) goto fail;
    int kvt = o.kv_dtype ? q3_dtype_from_name(o.kv_dtype) : (int)s->decode_unit->kv_default;
    if (kvt < 0) {
        st = q3_fail(Q3_ERR_INVALID, "unknown KV cache dtype \"%s\" (f32, f16, bf16)", o.kv_dtype);
        goto fail;
    }
    if ((st = q3_kv_cache_init(&s->kv, &m->cfg, s->n_ctx, (q3_dtype)kvt))) goto fail;
    if ((st = q3_graph_build_prefill(m, s->chunk, false, &s->prefill))) goto fail;
    if ((st = q3_graph_build_decode(m, &s->decode))) goto fail;
    if ((st = plan_runner(&s->run_prefill, &s->prefill, s->prefill_unit))) goto fail;
    if ((st = plan_runner(&s->run_decode, &s->decode, s->decode_unit))) goto fail;
    s->chunk_tokens = calloc((size_t)s->chunk, sizeof *s->chunk_tokens);
    size_t handoff_rows = 2 * (size_t)m->cfg.n_layers * (size_t)s->chunk;
    s->handoff_src = calloc(handoff_rows, sizeof *s->handoff_src);
    s->handoff_dst = calloc(handoff_rows, sizeof *s->handoff_dst);
    if (!s->chunk_tokens || !s->handoff_src || !s->handoff_dst) {
        st = q3_fail(Q3_ERR_NOMEM, "out of memory");
        goto fail;
    }
    *out = s;
    return Q3_OK;
fail:
    q3_session_free(s);
    return st;
}

void q3_session_free(q3_session *s)
{
    if (!s) return;
    q3_runner_free(&s->run_prefill);
    q3_runner_free(&s->run_prefill_all);
    q3_runner_free(&s->run_decode);
    q3_graph_free(&s->prefill);
    q3_graph_free(&s->prefill_all);
    q3_graph_free(&s->decode);
    q3_kv_cache_free(&s->kv);
    free(s->chunk_tokens);
    free(s->handoff_src);
    free(s->handoff_dst);
    free(s);
}

static q3_status check_tokens(const q3_session *s, const int32_t *tokens, size_t n)
{
    int vocab = s->model->cfg.vocab_size;
    for (size_t i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= vocab)
            return q3_fail(Q3_ERR_INVALID, "token %zu is %d, outside the vocabulary [0, %d)", i, tokens[i], vocab);
    if (n > (size_t)(s->n_ctx - s->pos))
        return q3_fail(Q3_ERR_CONTEXT, "%zu more tokens do not fit: %d of the context's %d are used", n, s->pos,
                       s->n_ctx);
    return Q3_OK;
}

/* The hand-off: the chunk's K/V rows (graph outputs) go into the cache. */
static void hand_off_kv(q3_session *s, const q3_runner *r, int n_real)
{
    double t0 = q3_now();
    const q3_graph *g = r->g;
    size_t kv_dim = (size_t)s->kv.kv_dim, n = 0;
    for (int l = 0; l < g->cfg->n_layers; l++) {
        const float *k = r->buf[g->v_k[l]], *v = r->buf[g->v_v[l]];
        for (int t = 0; t < n_real; t++) {
            s->handoff_src[n] = k + (size_t)t * kv_dim;
            s->handoff_dst[n++] = q3_kv_k_row(&s->kv, l, s->pos + t);
            s->handoff_src[n] = v + (size_t)t * kv_dim;
            s->handoff_dst[n++] = q3_kv_v_row(&s->kv, l, s->pos + t);
        }
    }
    /* on the unit that ran the prefill when it can (in parallel, with its SIMD) */
    const q3_backend *unit = s->prefill_unit;
    if (unit->store_rows) {
        unit->store_rows(unit, s->kv.dtype, s->handoff_src, s->handoff_dst, n, kv_dim);
    } else {
        for (size_t i = 0; i < n; i++) q3_row_from_f32(s->kv.dtype, s->handoff_src[i], s->handoff_dst[i], kv_dim);
    }
    s->handoff_seconds += q3_now() - t0;
}

q3_status q3_session_prefill(q3_session *s, const int32_t *tokens, size_t n, float *logits, int all_rows)
{
    q3_clear_error();
    q3_status st = check_tokens(s, tokens, n);
    if (st) return st;
    if (n == 0) return q3_fail(Q3_ERR_INVALID, "prefill of zero tokens");
    q3_runner *r = &s->run_prefill;
    if (logits && all_rows) {
        if (!s->prefill_all.ops) {
            if ((st = q3_graph_build_prefill(s->model, s->chunk, true, &s->prefill_all))) return st;
            if ((st = plan_runner(&s->run_prefill_all, &s->prefill_all, s->prefill_unit))) {
                q3_graph_free(&s->prefill_all);
                return st;
            }
        }
        r = &s->run_prefill_all;
    }
    size_t vocab = (size_t)s->model->cfg.vocab_size;
    for (size_t done = 0; done < n;) {
        int n_real = (int)(n - done < (size_t)s->chunk ? n - done : (size_t)s->chunk);
        memcpy(s->chunk_tokens, tokens + done, (size_t)n_real * sizeof *tokens);
        q3_runner_run(r, s->chunk_tokens, n_real, s->pos, &s->kv);
        hand_off_kv(s, r, n_real);
        s->pos += n_real;
        const float *out = r->buf[r->g->v_logits];
        if (logits && all_rows)
            memcpy(logits + done * vocab, out, (size_t)n_real * vocab * sizeof(float));
        done += (size_t)n_real;
        if (logits && !all_rows && done == n) memcpy(logits, out, vocab * sizeof(float));
    }
    return Q3_OK;
}

q3_status q3_session_decode(q3_session *s, int32_t token, float *logits)
{
    q3_clear_error();
    q3_status st = check_tokens(s, &token, 1);
    if (st) return st;
    q3_runner_run(&s->run_decode, &token, 1, s->pos, &s->kv);
    s->pos++;
    if (logits)
        memcpy(logits, s->run_decode.buf[s->decode.v_logits], (size_t)s->model->cfg.vocab_size * sizeof(float));
    return Q3_OK;
}

int q3_session_pos(const q3_session *s) { return s->pos; }
int q3_session_n_ctx(const q3_session *s) { return s->n_ctx; }
void q3_session_reset(q3_session *s) { s->pos = 0; }

q3_status q3_session_rewind(q3_session *s, int pos)
{
    if (pos < 0 || pos > s->pos)
        return q3_fail(Q3_ERR_INVALID, "cannot rewind to position %d: the session holds %d tokens", pos, s->pos);
    s->pos = pos;
    return Q3_OK;
}
