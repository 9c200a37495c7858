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

q3_status q3_generate(q3_session *s, q3_sampler *smp, const q3_tokenizer *tok, const int32_t *prompt, size_t n,
                      const q3_gen_opts *o, q3_gen_result *r)
{
    memset(r, 0, sizeof *r);
    r->n_prompt = (int)n;
    int room = q3_session_n_ctx(s) - q3_session_pos(s);
    if (n == 0) return q3_fail(Q3_ERR_INVALID, "the prompt is empty");
    if (n >= (size_t)room)
        return q3_fail(Q3_ERR_CONTEXT,
                       "the prompt is %zu tokens but only %d of the context's %d are free (raise --ctx, or "
                       "shorten the prompt)",
                       n, room, q3_session_n_ctx(s));
    int V = q3_model_vocab_size(s->ctx->model);
    int max = o->max_tokens > 0 ? o->max_tokens : room;
    float *logits = malloc((size_t)V * sizeof *logits);
    r->ids = malloc((size_t)(max > 0 ? max : 1) * sizeof *r->ids);
    text_out text = {0};
    q3_detok detok;
    q3_detok_init(&detok, tok);
    for (int i = 0; i < o->n_stop; i++) {
        size_t l = strlen(o->stop[i]);
        if (l > text.hold + 1) text.hold = l - 1;
    }
    q3_status st = Q3_OK;
    if (!logits || !r->ids) {
        st = q3_fail(Q3_ERR_NOMEM, "out of memory");
        goto done;
    }
    int32_t eot[2] = {token_or_none(tok, "<|im_end|>"), token_or_none(tok, "<|endoftext|>")};
    double t0 = q3_now();
    if ((st = q3_session_prefill(s, prompt, n, logits, 0))) goto done;
    r->prefill_s = q3_now() - t0;
    for (size_t i = 0; i < n; i++) q3_sampler_accept(smp, prompt[i]);
    t0 = q3_now();
    r->stop = Q3_STOP_LENGTH;
    for (;;) {
        if (o->interrupt && *o->interrupt) { r->stop = Q3_STOP_INTERRUPT; break; }
        int32_t id = q3_sampler_sample(smp, logits);
        q3_sampler_accept(smp, id);
        r->ids[r->n_ids++] = id;
        if (id == eot[0] || id == eot[1]) { r->stop = Q3_STOP_END_OF_TURN; break; }
        const char *piece;
        size_t plen;
        if (tok && !q3_detok_push(&detok, id, &piece, &plen) && plen && append(&text, piece, plen)) {
            st = q3_fail(Q3_ERR_NOMEM, "out of memory");
            break;
        }
        if (flush_text(&text, o, id, 0)) { r->stop = Q3_STOP_STRING; break; }
        if (r->n_ids >= max) { r->stop = Q3_STOP_LENGTH; break; }
        if (q3_session_pos(s) >= q3_session_n_ctx(s)) { r->stop = Q3_STOP_CONTEXT; break; }
        if ((st = q3_session_decode(s, id, logits))) break;
    }
    r->decode_s = q3_now() - t0;
    if (!st && r->stop != Q3_STOP_STRING) {
        const char *piece;
        size_t plen;
        if (tok && !q3_detok_flush(&detok, &piece, &plen) && plen) append(&text, piece, plen);
        flush_text(&text, o, r->n_ids ? r->ids[r->n_ids - 1] : -1, 1);
    }
done:
    q3_detok_free(&detok);
    free(text.buf);
    free(logits);
    if (st) {
        free(r->ids);
        r->ids = NULL;
        r->n_ids = 0;
    }
    return st;
}
