/* Sessions: one sequence of a context of its own. Prompts of any length go
 * through the context's step in chunks of S; decode is a one-row step. */
#include "run/session.h"

#include <stdlib.h>
#include <string.h>

#include "util/error.h"
#include "util/opts.h"

q3_session_opts q3_session_opts_default(void)
{
    q3_session_opts o = {.size = sizeof o};
    return o;
}

q3_status q3_session_new(q3_model *m, const q3_session_opts *opts, q3_session **out)
{
    Q3_NOT_NULL(out);
    *out = NULL;
    Q3_NOT_NULL(m);
    q3_session_opts o;
    q3_status ost = q3_opts_read(&o, sizeof o, opts, "q3_session_new options");
    if (ost) return ost;
    q3_ctx_opts co = {.size = sizeof co, .n_ctx = o.n_ctx, .chunk = o.chunk, .max_seqs = 1, .n_threads = o.n_threads,
                      .backend = o.backend, .prefill_backend = o.prefill_backend,
                      .decode_backend = o.decode_backend, .kv_dtype = o.kv_dtype};
    q3_session *s = calloc(1, sizeof *s);
    if (!s) return q3_fail(Q3_ERR_NOMEM, "out of memory");
    q3_status st = q3_ctx_new(m, &co, &s->ctx);
    if (!st) st = q3_seq_new(s->ctx, &s->seq);
    if (st) {
        q3_session_free(s);
        return st;
    }
    *out = s;
    return Q3_OK;
}

void q3_session_free(q3_session *s)
{
    if (!s) return;
    q3_ctx_free(s->ctx);
    free(s);
}

q3_status q3_session_prefill(q3_session *s, const int32_t *tokens, size_t n, float *logits, int all_rows)
{
    q3_clear_error();
    Q3_NOT_NULL(s);
    if (n && !tokens) return q3_fail(Q3_ERR_INVALID, "q3_session_prefill: tokens is NULL");
    q3_ctx *c = s->ctx;
    int vocab = c->model->cfg.vocab_size, pos = q3_seq_pos(c, s->seq);
    if (n == 0) return q3_fail(Q3_ERR_INVALID, "prefill of zero tokens");
    for (size_t i = 0; i < n; i++) /* the whole prompt, before any chunk runs */
        if (tokens[i] < 0 || tokens[i] >= vocab)
            return q3_fail(Q3_ERR_INVALID, "token %zu is %d, outside the vocabulary [0, %d)", i, tokens[i], vocab);
    if (n > (size_t)(c->n_ctx - pos))
        return q3_fail(Q3_ERR_CONTEXT, "%zu more tokens do not fit: %d of the context's %d are used", n, pos, c->n_ctx);
    for (size_t done = 0; done < n;) {
        int n_real = (int)(n - done < (size_t)c->chunk ? n - done : (size_t)c->chunk);
        bool last = done + (size_t)n_real == n;
        q3_step step = {.prefill_seq = s->seq, .prefill_tokens = tokens + done, .n_prefill = n_real};
        if (logits && all_rows) {
            step.prefill_logits = logits + done * (size_t)vocab;
            step.prefill_all_rows = 1;
        } else if (logits && last) {
            step.prefill_logits = logits;
        }
        q3_status st = q3_ctx_step(c, &step);
        if (st) return st;
        done += (size_t)n_real;
    }
    return Q3_OK;
}

q3_status q3_session_decode(q3_session *s, int32_t token, float *logits)
{
    Q3_NOT_NULL(s);
    q3_decode_row row = {.seq = s->seq, .token = token, .logits = logits};
    q3_step step = {.decode = &row, .n_decode = 1, .prefill_seq = -1};
    return q3_ctx_step(s->ctx, &step);
}

int q3_session_pos(const q3_session *s) { return s ? q3_seq_pos(s->ctx, s->seq) : -1; }
int q3_session_n_ctx(const q3_session *s) { return s ? s->ctx->n_ctx : 0; }
void q3_session_reset(q3_session *s)
{
    if (s) q3_seq_truncate(s->ctx, s->seq, 0);
}

q3_status q3_session_rewind(q3_session *s, int pos)
{
    Q3_NOT_NULL(s);
    int have = q3_session_pos(s);
    if (pos < 0 || pos > have)
        return q3_fail(Q3_ERR_INVALID, "cannot rewind to position %d: the session holds %d tokens", pos, have);
    return q3_seq_truncate(s->ctx, s->seq, pos);
}
