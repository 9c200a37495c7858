#include "run/generate.h"

#include <stdlib.h>
#include <string.h>

#include "run/executor.h"
#include "run/session.h"
#include "util/error.h"

const char *q3_stop_reason_name(q3_stop_reason r)
{
    switch (r) {
    case Q3_STOP_END_OF_TURN: return "end of turn";
    case Q3_STOP_STRING: return "stop string";
    case Q3_STOP_LENGTH: return "token limit";
    case Q3_STOP_INTERRUPT: return "interrupted";
    case Q3_STOP_CONTEXT: return "context full";
    }
    return "?";
}

/* ---- text held back until it cannot be the start of a stop string ----------- */

typedef struct text_out {
    char *buf;
    size_t len, cap, emitted; /* buf[0..emitted) went to on_text */
    size_t hold;              /* bytes to hold back: longest stop string - 1 */
} text_out;

static int append(text_out *t, const char *s, size_t n)
{
    if (t->len + n + 1 > t->cap) {
        size_t cap = (t->len + n + 1) * 2;
        char *b = realloc(t->buf, cap);
        if (!b) return -1;
        t->buf = b;
        t->cap = cap;
    }
    memcpy(t->buf + t->len, s, n);
    t->len += n;
    t->buf[t->len] = 0;
    return 0;
}

/* Emits what can no longer be part of a stop string; returns 1 if a stop
 * string was found (text before it emitted, the rest dropped). */
static int flush_text(text_out *t, const q3_gen_opts *o, int32_t id, int final)
{
    size_t upto = t->len;
    int stopped = 0;
    for (int i = 0; i < o->n_stop; i++) {
        size_t sl = strlen(o->stop[i]);
        if (!sl) continue;
        size_t from = t->emitted > sl ? t->emitted - sl : 0;
        char *hit = memmem(t->buf + from, t->len - from, o->stop[i], sl);
        if (hit && (size_t)(hit - t->buf) < upto) {
            upto = (size_t)(hit - t->buf);
            stopped = 1;
        }
    }
    if (!stopped && !final) {
        upto = t->len > t->hold ? t->len - t->hold : 0;
        while (upto > t->emitted && upto < t->len && ((unsigned char)t->buf[upto] & 0xc0) == 0x80) upto--;
    }
    if (upto < t->emitted) upto = t->emitted;
    if (upto > t->emitted && o->on_text) o->on_text(o->user, id, t->buf + t->emitted, upto - t->emitted);
    t->emitted = upto;
    return stopped;
}

static int32_t token_or_none(const q3_tokenizer *tok, const char *s)
{
    return tok ? q3_tokenizer_token_id(tok, s, strlen(s)) : -1;
}

/* ---- the generator ---------------------------------------------------------------------- */

struct q3_gen {
    q3_ctx *ctx;
    int seq;
    q3_sampler *smp;
    const q3_tokenizer *tok;
    q3_gen_opts o;
    int32_t eot[2];
    int32_t *prompt;          /* [n_prompt] still to prefill from prompt_done */
    size_t n_prompt, prompt_done;
    int max_ids;              /* n_ids cap (ids has room for it) */
    q3_gen_result r;
    int32_t pending;          /* the sampled token the next step decodes; -1: none */
    int done;
    float *logits;            /* [vocab] */
    text_out text;
    q3_detok detok;
};

q3_status q3_gen_new(q3_ctx *c, int seq, q3_sampler *smp, const q3_tokenizer *tok, const q3_gen_opts *o,
                     q3_gen **out)
{
    *out = NULL;
    if (q3_seq_pos(c, seq) < 0) return q3_fail(Q3_ERR_INVALID, "sequence %d does not exist", seq);
    q3_gen *g = calloc(1, sizeof *g);
    if (!g) return q3_fail(Q3_ERR_NOMEM, "out of memory");
    g->ctx = c;
    g->seq = seq;
    g->smp = smp;
    g->tok = tok;
    if (o) g->o = *o;
    g->eot[0] = token_or_none(tok, "<|im_end|>");
    g->eot[1] = token_or_none(tok, "<|endoftext|>");
    g->pending = -1;
    g->done = 1; /* until a prompt is queued */
    for (int i = 0; i < g->o.n_stop; i++) {
        size_t l = strlen(g->o.stop[i]);
        if (l > g->text.hold + 1) g->text.hold = l - 1;
    }
    q3_detok_init(&g->detok, tok);
    g->logits = malloc((size_t)c->model->cfg.vocab_size * sizeof *g->logits);
    if (!g->logits) {
        q3_gen_free(g);
        return q3_fail(Q3_ERR_NOMEM, "out of memory");
    }
    *out = g;
    return Q3_OK;
}

void q3_gen_free(q3_gen *g)
{
    if (!g) return;
    q3_detok_free(&g->detok);
    free(g->text.buf);
    free(g->prompt);
    free(g->logits);
    free(g->r.ids);
    free(g);
}

q3_status q3_gen_prompt(q3_gen *g, const int32_t *prompt, size_t n)
{
    int pos = q3_seq_pos(g->ctx, g->seq), n_ctx = q3_ctx_n_ctx(g->ctx);
    int room = n_ctx - pos;
    if (n == 0) return q3_fail(Q3_ERR_INVALID, "the prompt is empty");
    if (n >= (size_t)room)
        return q3_fail(Q3_ERR_CONTEXT,
                       "the prompt is %zu tokens but only %d of the context's %d are free (raise --ctx, or "
                       "shorten the prompt)",
                       n, room, n_ctx);
    int max = g->o.max_tokens > 0 && g->o.max_tokens < room ? g->o.max_tokens : room;
    int32_t *p = malloc(n * sizeof *p), *ids = malloc((size_t)max * sizeof *ids);
    if (!p || !ids) {
        free(p);
        free(ids);
        return q3_fail(Q3_ERR_NOMEM, "out of memory");
    }
    memcpy(p, prompt, n * sizeof *p);
    free(g->prompt);
    free(g->r.ids);
    g->prompt = p;
    g->n_prompt = n;
    g->prompt_done = 0;
    g->max_ids = max;
    memset(&g->r, 0, sizeof g->r);
    g->r.ids = ids;
    g->r.n_prompt = (int)n;
    g->r.stop = Q3_STOP_LENGTH;
    g->pending = -1;
    g->done = 0;
    g->text.len = g->text.emitted = 0;
    for (size_t i = 0; i < n; i++) q3_sampler_accept(g->smp, prompt[i]);
    return Q3_OK;
}

int q3_gen_done(const q3_gen *g) { return g->done; }
int q3_gen_prefilling(const q3_gen *g) { return !g->done && g->prompt_done < g->n_prompt; }
const q3_gen_result *q3_gen_result_get(const q3_gen *g) { return &g->r; }

void q3_gen_cancel(q3_gen *g, q3_stop_reason why)
{
    if (g->done) return;
    g->r.stop = why;
    g->done = 1;
}

/* Ends the text: what the detokenizer holds, then everything not yet emitted. */
static void finish_text(q3_gen *g)
{
    const char *piece;
    size_t plen;
    if (g->tok && !q3_detok_flush(&g->detok, &piece, &plen) && plen) append(&g->text, piece, plen);
    flush_text(&g->text, &g->o, g->r.n_ids ? g->r.ids[g->r.n_ids - 1] : -1, 1);
}

/* New logits for g: sample, record, stream, and decide whether it goes on. */
static q3_status after_logits(q3_gen *g)
{
    if (g->o.interrupt && *g->o.interrupt) {
        g->r.stop = Q3_STOP_INTERRUPT;
        finish_text(g);
        g->done = 1;
        return Q3_OK;
    }
    int32_t id = q3_sampler_sample(g->smp, g->logits);
    q3_sampler_accept(g->smp, id);
    g->r.ids[g->r.n_ids++] = id;
    if (id == g->eot[0] || id == g->eot[1]) {
        g->r.stop = Q3_STOP_END_OF_TURN;
        finish_text(g);
        g->done = 1;
        return Q3_OK;
    }
    const char *piece;
    size_t plen;
    if (g->tok && !q3_detok_push(&g->detok, id, &piece, &plen) && plen && append(&g->text, piece, plen)) {
        g->done = 1;
        return q3_fail(Q3_ERR_NOMEM, "out of memory");
    }
    if (flush_text(&g->text, &g->o, id, 0)) {
        g->r.stop = Q3_STOP_STRING;
        g->done = 1;
        return Q3_OK;
    }
    if (g->r.n_ids >= g->max_ids || q3_seq_pos(g->ctx, g->seq) >= q3_ctx_n_ctx(g->ctx)) {
        g->r.stop = g->r.n_ids >= g->max_ids && (g->o.max_tokens > 0 && g->r.n_ids >= g->o.max_tokens)
                        ? Q3_STOP_LENGTH
                        : Q3_STOP_CONTEXT;
        finish_text(g);
        g->done = 1;
        return Q3_OK;
    }
    g->pending = id;
    return Q3_OK;
}

q3_status q3_gen_step(q3_gen *const *gens, int n)
{
    q3_clear_error();
    if (n <= 0) return Q3_OK;
    q3_ctx *c = gens[0]->ctx;
    int max = q3_ctx_max_seqs(c);
    q3_decode_row rows[256];
    q3_gen *row_gen[256];
    q3_step s = {.decode = rows, .prefill_seq = -1};
    q3_gen *pg = NULL;
    for (int i = 0; i < n; i++) {
        q3_gen *g = gens[i];
        if (g->ctx != c) return q3_fail(Q3_ERR_INVALID, "generators of different contexts in one step");
        if (g->done) continue;
        if (g->prompt_done < g->n_prompt) {
            if (!pg) pg = g;
            continue;
        }
        if (s.n_decode == max || s.n_decode == 256) continue; /* the rest wait for the next step */
        rows[s.n_decode] = (q3_decode_row){.seq = g->seq, .token = g->pending, .logits = g->logits};
        row_gen[s.n_decode++] = g;
    }
    int n_pre = 0;
    if (pg) {
        size_t left = pg->n_prompt - pg->prompt_done;
        n_pre = left < (size_t)q3_ctx_chunk(c) ? (int)left : q3_ctx_chunk(c);
        s.prefill_seq = pg->seq;
        s.prefill_tokens = pg->prompt + pg->prompt_done;
        s.n_prefill = n_pre;
        if ((size_t)n_pre == left) s.prefill_logits = pg->logits;
    }
    if (!s.n_decode && !pg) return Q3_OK;
    double t0 = q3_now();
    q3_status st = q3_ctx_step(c, &s);
    if (st) return st;
    double dt = q3_now() - t0;
    if (pg) {
        pg->prompt_done += (size_t)n_pre;
        pg->r.prefill_s += dt;
        if (pg->prompt_done == pg->n_prompt && (st = after_logits(pg))) return st;
    }
    for (int r = 0; r < s.n_decode; r++) {
        row_gen[r]->r.decode_s += dt;
        if ((st = after_logits(row_gen[r]))) return st;
    }
    return Q3_OK;
}

q3_status q3_generate(q3_session *s, q3_sampler *smp, const q3_tokenizer *tok, const int32_t *prompt, size_t n,
                      const q3_gen_opts *o, q3_gen_result *r)
{
    memset(r, 0, sizeof *r);
    q3_gen *g;
    q3_status st = q3_gen_new(s->ctx, s->seq, smp, tok, o, &g);
    if (st) return st;
    if ((st = q3_gen_prompt(g, prompt, n))) goto done;
    while (!st && !q3_gen_done(g)) st = q3_gen_step(&g, 1);
    if (!st) {
        *r = g->r;
        g->r.ids = NULL; /* the caller's now */
    }
done:
    q3_gen_free(g);
    return st;
}
