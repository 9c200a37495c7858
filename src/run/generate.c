/* The one generation loop (q3.h, "generation"): what every application of
 * q3 runs between a row of logits and the text it streams. */
#include "run/generate.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grammar/compiled.h"
#include "run/context.h"
#include "run/executor.h"
#include "run/session.h"
#include "util/error.h"
#include "util/opts.h"

const char *q3_stop_reason_name(q3_stop_reason r)
{
    switch (r) {
    case Q3_STOP_END_OF_TURN: return "end of turn";
    case Q3_STOP_STRING: return "stop string";
    case Q3_STOP_LENGTH: return "token limit";
    case Q3_STOP_INTERRUPT: return "interrupted";
    case Q3_STOP_CONTEXT: return "context full";
    case Q3_STOP_CANCEL: return "cancelled";
    case Q3_STOP_ERROR: return "error";
    }
    return "?";
}

q3_gen_opts q3_gen_opts_default(void)
{
    q3_gen_opts o = {.size = sizeof o};
    return o;
}

/* ---- the generator ---------------------------------------------------------------------- */

/* Text of the current channel not yet handed out: buf[0..emitted) went to
 * on_text, the rest is held while it may be the start of a stop string. */
typedef struct text_out {
    char *buf;
    size_t len, cap, emitted;
    size_t hold;              /* bytes to hold back: longest stop string - 1 */
} text_out;

/* The markup tokens that open and close a channel's span (-1: none). */
typedef struct channel_marks {
    int32_t open[3], close[3]; /* by q3_channel; [Q3_CHANNEL_CONTENT] unused */
} channel_marks;

struct q3_gen {
    q3_ctx *ctx;
    int seq;
    q3_sampler *smp;
    const q3_tokenizer *tok;
    q3_gen_opts o;
    int32_t eot[2];
    channel_marks marks;
    int vocab;
    unsigned epoch;           /* the sequence's epoch at creation (ctx->seq_epoch): a dropped one is refused */
    int32_t *prompt;          /* [n_prompt] still to prefill from prompt_done */
    size_t n_prompt, prompt_done;
    int max_ids;              /* n_ids cap (ids has room for it) */
    q3_gen_result r;
    int32_t pending;          /* the sampled token the next step decodes; -1: none */
    int done;
    int masked;               /* this step's grammar mask is on logits already (masks_in_parallel) */
    /* preemption (q3_gen_preempt): the sequence's K/V were freed; they come back
       from the prefix cache, a prefill of the prompt's rest, then decode rows
       replaying the generated ids, so each position is computed as before */
    size_t base;              /* positions the sequence held before the prompt (earlier turns) */
    int32_t *hist;            /* [n_hist] the sequence's tokens when it was preempted; NULL: not preempted */
    size_t n_hist, hist_done; /* hist[0..hist_done) are back in the sequence */
    int resume;               /* the next step first takes what the prefix cache has of hist */
    float *logits;            /* [vocab] */
    float *raw;               /* [vocab] the row before on_logits (logprobs with a processor only) */
    text_out text;
    q3_detokenizer *detok;
    /* channels (split_channels) */
    q3_channel chan;
    int content_any;          /* content has been emitted since the start or the last think block */
    int thinking_any;         /* thinking has been emitted */
    int thinking_nl;          /* newlines held at the end of the thinking */
    /* log-probabilities (o.logprobs) */
    q3_token_logprob *lp;     /* [n_ids] */
    int cap_lp;
    char error[256];          /* why Q3_STOP_ERROR */
};

static int32_t token_or_none(const q3_tokenizer *tok, const char *s)
{
    return tok ? q3_tokenizer_token_id(tok, s, strlen(s)) : -1;
}

q3_status q3_gen_new(q3_ctx *c, int seq, q3_sampler *smp, const q3_tokenizer *tok, const q3_gen_opts *o,
                     q3_gen **out)
{
    Q3_NOT_NULL(out);
    *out = NULL;
    Q3_NOT_NULL(c);
    Q3_NOT_NULL(smp);
    if (q3_seq_pos(c, seq) < 0) return q3_fail(Q3_ERR_INVALID, "sequence %d does not exist", seq);
    q3_gen_opts opts;
    q3_status st = q3_opts_read(&opts, sizeof opts, o, "q3_gen_new options");
    if (st) return st;
    if (opts.top_logprobs < 0 || opts.top_logprobs > Q3_MAX_TOP_LOGPROBS)
        return q3_fail(Q3_ERR_INVALID, "top_logprobs is %d, must be in [0, %d]", opts.top_logprobs,
                       Q3_MAX_TOP_LOGPROBS);
    if (opts.max_tokens < 0) return q3_fail(Q3_ERR_INVALID, "max_tokens is %d, must be >= 0 (0: until the context is full)", opts.max_tokens);
    if (opts.n_stop < 0) return q3_fail(Q3_ERR_INVALID, "n_stop is %d, must be >= 0", opts.n_stop);
    if (opts.n_stop > 0 && !opts.stop) return q3_fail(Q3_ERR_INVALID, "n_stop is %d but stop is NULL", opts.n_stop);
    for (int i = 0; i < opts.n_stop; i++)
        if (!opts.stop[i]) return q3_fail(Q3_ERR_INVALID, "stop[%d] is NULL", i);
    if ((unsigned)opts.split_channels > 1 || (unsigned)opts.logprobs > 1 || (unsigned)opts.no_prompt_penalty > 1)
        return q3_fail(Q3_ERR_INVALID, "split_channels, logprobs and no_prompt_penalty are 0 or 1 (%d, %d, %d)",
                       opts.split_channels, opts.logprobs, opts.no_prompt_penalty);
    if (opts.top_logprobs > 0 && !opts.logprobs)
        return q3_fail(Q3_ERR_INVALID, "top_logprobs %d needs logprobs 1", opts.top_logprobs);
    q3_gen *g = calloc(1, sizeof *g);
    if (!g) return q3_fail(Q3_ERR_NOMEM, "out of memory");
    g->ctx = c;
    g->seq = seq;
    g->smp = smp;
    g->tok = tok;
    g->o = opts;
    g->vocab = c->model->cfg.vocab_size;
    g->epoch = c->seq_epoch[seq];
    g->eot[0] = token_or_none(tok, "<|im_end|>");
    g->eot[1] = token_or_none(tok, "<|endoftext|>");
    for (int k = 0; k < 3; k++) g->marks.open[k] = g->marks.close[k] = -1;
    if (opts.split_channels) {
        g->marks.open[Q3_CHANNEL_THINKING] = token_or_none(tok, "<think>");
        g->marks.close[Q3_CHANNEL_THINKING] = token_or_none(tok, "</think>");
        g->marks.open[Q3_CHANNEL_TOOL_CALL] = token_or_none(tok, "<tool_call>");
        g->marks.close[Q3_CHANNEL_TOOL_CALL] = token_or_none(tok, "</tool_call>");
    }
    g->pending = -1;
    g->done = 1; /* until a prompt is queued */
    for (int i = 0; i < g->o.n_stop; i++) {
        size_t l = strlen(g->o.stop[i]);
        if (l > g->text.hold + 1) g->text.hold = l - 1;
    }
    g->logits = malloc((size_t)g->vocab * sizeof *g->logits);
    int processed = opts.on_logits || opts.grammar; /* the row changes before sampling */
    if (opts.logprobs && processed) g->raw = malloc((size_t)g->vocab * sizeof *g->raw);
    if (!g->logits || (opts.logprobs && processed && !g->raw) || (tok && q3_detokenizer_new(tok, &g->detok))) {
        q3_gen_free(g);
        return q3_fail(Q3_ERR_NOMEM, "out of memory");
    }
    *out = g;
    return Q3_OK;
}

void q3_gen_free(q3_gen *g)
{
    if (!g) return;
    q3_detokenizer_free(g->detok);
    free(g->text.buf);
    free(g->prompt);
    free(g->hist);
    free(g->logits);
    free(g->raw);
    free(g->r.ids);
    free(g->lp);
    free(g);
}

/* The generator's sequence is still the one it was made for (not dropped, its id reused or not). */
static q3_status check_seq(const q3_gen *g)
{
    if (q3_seq_pos(g->ctx, g->seq) < 0 || g->ctx->seq_epoch[g->seq] != g->epoch)
        return q3_fail(Q3_ERR_INVALID, "the generator's sequence %d was dropped (q3_seq_drop): free the generator", g->seq);
    return Q3_OK;
}

q3_status q3_gen_prompt_from(q3_gen *g, const int32_t *prompt, size_t n, size_t skip)
{
    Q3_NOT_NULL(g);
    if (n && !prompt) return q3_fail(Q3_ERR_INVALID, "q3_gen_prompt_from: prompt is NULL");
    q3_status cst = check_seq(g);
    if (cst) return cst;
    for (size_t i = 0; i < n; i++) /* every id, before anything is queued (a bad one would fail every step) */
        if (prompt[i] < 0 || prompt[i] >= g->vocab)
            return q3_fail(Q3_ERR_INVALID, "prompt token %zu is %d, outside the vocabulary [0, %d)", i, prompt[i], g->vocab);
    int pos = q3_seq_pos(g->ctx, g->seq), n_ctx = q3_ctx_n_ctx(g->ctx);
    int room = n_ctx - pos;
    if (n == 0) return q3_fail(Q3_ERR_INVALID, "the prompt is empty");
    if (skip >= n || skip > (size_t)pos)
        return q3_fail(Q3_ERR_INVALID, "%zu of a %zu-token prompt already in a sequence of %d positions: at least "
                       "the last token must be prefilled", skip, n, pos);
    if (n - skip >= (size_t)room)
        return q3_fail(Q3_ERR_CONTEXT,
                       "the prompt is %zu tokens but only %d of the context's %d are free (raise --ctx, or "
                       "shorten the prompt)",
                       n - skip, room, n_ctx);
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
    g->prompt_done = skip;
    g->max_ids = max;
    memset(&g->r, 0, sizeof g->r);
    g->r.ids = ids;
    g->r.n_prompt = (int)n;
    g->r.stop = Q3_STOP_LENGTH;
    g->pending = -1;
    g->done = 0;
    g->base = (size_t)pos - skip;
    free(g->hist);
    g->hist = NULL;
    g->n_hist = g->hist_done = 0;
    g->resume = 0;
    g->text.len = g->text.emitted = 0;
    g->chan = Q3_CHANNEL_CONTENT;
    g->content_any = g->thinking_any = g->thinking_nl = 0;
    g->error[0] = 0;
    if (!g->o.no_prompt_penalty)
        for (size_t i = 0; i < n; i++) q3_sampler_accept(g->smp, prompt[i]);
    return Q3_OK;
}

q3_status q3_gen_prompt(q3_gen *g, const int32_t *prompt, size_t n) { return q3_gen_prompt_from(g, prompt, n, 0); }

int q3_gen_done(const q3_gen *g) { return g ? g->done : 1; }
int q3_gen_prefilling(const q3_gen *g) { return g && !g->done && (g->resume || g->prompt_done < g->n_prompt); }
const q3_gen_result *q3_gen_result_get(const q3_gen *g) { return g ? &g->r : NULL; }
int q3_gen_seq(const q3_gen *g) { return g ? g->seq : -1; }
const char *q3_gen_error(const q3_gen *g) { return g && g->r.stop == Q3_STOP_ERROR ? g->error : ""; }

const q3_token_logprob *q3_gen_logprobs(const q3_gen *g, int *n)
{
    int k = g && g->o.logprobs ? g->r.n_ids : 0;
    if (n) *n = k;
    return k ? g->lp : NULL;
}

void q3_gen_cancel(q3_gen *g, q3_stop_reason why)
{
    if (!g || g->done) return;
    g->r.stop = why;
    g->done = 1;
}

/* ---- channels ------------------------------------------------------------------------- */

static void piece(q3_gen *g, const char *s, size_t n, int32_t id, q3_edge edge)
{
    if (!g->o.on_text || (!n && edge == Q3_EDGE_NONE)) return;
    q3_text_piece p = {.text = s, .len = n, .id = id, .channel = g->chan, .edge = edge};
    g->o.on_text(g->o.user, &p);
}

/* Text of the current channel, shaped as the split promises: content without
 * the blank lines that follow a think block (or open the answer); thinking
 * without its first and last newlines (the last held until more follows). */
static void emit(q3_gen *g, const char *s, size_t n, int32_t id)
{
    if (!g->o.split_channels || g->chan == Q3_CHANNEL_TOOL_CALL) {
        piece(g, s, n, id, Q3_EDGE_NONE);
        return;
    }
    if (g->chan == Q3_CHANNEL_CONTENT) {
        if (!g->content_any) {
            while (n && *s == '\n') { s++; n--; }
            if (!n) return;
            g->content_any = 1;
        }
        piece(g, s, n, id, Q3_EDGE_NONE);
        return;
    }
    if (!g->thinking_any)
        while (n && *s == '\n') { s++; n--; }
    size_t body = n;
    while (body && s[body - 1] == '\n') body--;
    if (body) {
        static const char nl[] = "\n\n\n\n\n\n\n\n";
        while (g->thinking_nl > 0) {
            int k = g->thinking_nl > 8 ? 8 : g->thinking_nl;
            piece(g, nl, (size_t)k, id, Q3_EDGE_NONE);
            g->thinking_nl -= k;
        }
        piece(g, s, body, id, Q3_EDGE_NONE);
        g->thinking_any = 1;
    }
    g->thinking_nl += (int)(n - body);
}

/* Enters channel ch (its opening token id came) or, for CONTENT, leaves the
 * current one with edge (CLOSE: its closing token; CUT: the end). */
static void switch_channel(q3_gen *g, q3_channel ch, int32_t id, q3_edge edge)
{
    if (ch == Q3_CHANNEL_CONTENT) {
        if (g->chan == Q3_CHANNEL_CONTENT) return;
        if (g->chan == Q3_CHANNEL_THINKING) {
            g->thinking_nl = 0;  /* the newlines before </think> */
            g->content_any = 0;  /* strip those after it */
        }
        piece(g, "", 0, id, edge);
        g->chan = Q3_CHANNEL_CONTENT;
        return;
    }
    g->chan = ch;
    piece(g, "", 0, id, Q3_EDGE_OPEN);
}

/* The channel a markup token switches to from the current one, or -1 if id
 * is not markup here (then it is text). */
static int channel_switch(const q3_gen *g, int32_t id)
{
    if (!g->o.split_channels || id < 0) return -1;
    if (g->chan == Q3_CHANNEL_CONTENT) {
        if (id == g->marks.open[Q3_CHANNEL_THINKING]) return Q3_CHANNEL_THINKING;
        if (id == g->marks.open[Q3_CHANNEL_TOOL_CALL]) return Q3_CHANNEL_TOOL_CALL;
        return -1;
    }
    return id == g->marks.close[g->chan] ? Q3_CHANNEL_CONTENT : -1;
}

/* ---- text held back until it cannot be the start of a stop string ----------- */

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

/* Emits what can no longer be part of a stop string (final: everything);
 * returns 1 if a stop string was found (text before it emitted, the rest
 * dropped). */
static int flush_text(q3_gen *g, int32_t id, int final)
{
    text_out *t = &g->text;
    size_t upto = t->len;
    int stopped = 0;
    for (int i = 0; i < g->o.n_stop; i++) {
        size_t sl = strlen(g->o.stop[i]);
        if (!sl) continue;
        size_t from = t->emitted > sl ? t->emitted - sl : 0;
        char *hit = t->len > from ? memmem(t->buf + from, t->len - from, g->o.stop[i], sl) : NULL;
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
    if (upto > t->emitted) emit(g, t->buf + t->emitted, upto - t->emitted, id);
    t->emitted = upto;
    if (final || stopped) t->len = t->emitted = 0;
    return stopped;
}

/* What the detokenizer holds (a character cut short becomes U+FFFD). */
static int flush_detok(q3_gen *g)
{
    const char *s;
    size_t n;
    if (g->detok && !q3_detokenizer_flush(g->detok, &s, &n) && n) return append(&g->text, s, n);
    return 0;
}

/* Ends the text: what the detokenizer holds, then everything not yet
 * emitted; a span still open is cut. */
static void finish_text(q3_gen *g)
{
    int32_t last = g->r.n_ids ? g->r.ids[g->r.n_ids - 1] : -1;
    flush_detok(g);
    flush_text(g, last, 1);
    switch_channel(g, Q3_CHANNEL_CONTENT, -1, Q3_EDGE_CUT);
}

static void end(q3_gen *g, q3_stop_reason why)
{
    g->r.stop = why;
    g->done = 1;
}

/* ---- log-probabilities ------------------------------------------------------------------ */

/* The raw row's log-softmax at id and its top K (lower id first on ties). */
static void logprob_of(const float *raw, int V, int32_t id, int K, q3_token_logprob *l)
{
    float max = raw[0];
    for (int i = 1; i < V; i++)
        if (raw[i] > max) max = raw[i];
    double sum = 0;
    for (int i = 0; i < V; i++) sum += exp((double)raw[i] - max);
    float lse = max + (float)log(sum);
    memset(l, 0, sizeof *l);
    l->id = id;
    l->logprob = raw[id] - lse;
    for (int i = 0; i < V && K > 0; i++) { /* insertion into a sorted array, K <= 20 */
        float x = raw[i];
        if (l->n_top == K && x <= l->top_logprob[K - 1]) continue;
        int p = l->n_top < K ? l->n_top++ : K - 1;
        while (p > 0 && l->top_logprob[p - 1] < x) {
            l->top_logprob[p] = l->top_logprob[p - 1];
            l->top_id[p] = l->top_id[p - 1];
            p--;
        }
        l->top_logprob[p] = x;
        l->top_id[p] = i;
    }
    for (int k = 0; k < l->n_top; k++) l->top_logprob[k] -= lse;
}

/* ---- one sampled position --------------------------------------------------------------- */

/* New logits for g: process, sample, record, stream, and decide whether it goes on. */
static q3_status after_logits(q3_gen *g)
{
    if (g->o.interrupt && *g->o.interrupt) {
        finish_text(g);
        end(g, Q3_STOP_INTERRUPT);
        return Q3_OK;
    }
    if (g->o.logprobs) { /* of the raw row: before the processor and the sampler touch it */
        if (g->r.n_ids == g->cap_lp) {
            int cap = g->cap_lp ? 2 * g->cap_lp : 16;
            q3_token_logprob *p = realloc(g->lp, (size_t)cap * sizeof *p);
            if (!p) {
                end(g, Q3_STOP_ERROR);
                return q3_fail(Q3_ERR_NOMEM, "out of memory");
            }
            g->lp = p;
            g->cap_lp = cap;
        }
        if (g->raw) memcpy(g->raw, g->logits, (size_t)g->vocab * sizeof *g->raw);
    }
    if (g->o.on_logits) {
        q3_status st = g->o.on_logits(g->o.user, g, g->logits, g->vocab);
        if (st) {
            snprintf(g->error, sizeof g->error, "%s", q3_last_error()[0] ? q3_last_error() : q3_status_name(st));
            finish_text(g);
            end(g, Q3_STOP_ERROR);
            return Q3_OK;
        }
    }
    if (g->o.grammar && !g->masked) { /* masks_in_parallel may have put it on */
        q3_status st = q3_matcher_apply(g->o.grammar, g->logits, g->vocab);
        if (st) {
            snprintf(g->error, sizeof g->error, "grammar: %s", q3_last_error()[0] ? q3_last_error() : q3_status_name(st));
            finish_text(g);
            end(g, Q3_STOP_ERROR);
            return Q3_OK;
        }
    }
    int32_t id = q3_sampler_sample(g->smp, g->logits);
    if (id < 0) { /* a row the sampler refuses (NaN, +inf, nothing allowed): the answer ends with the reason */
        snprintf(g->error, sizeof g->error, "%s", q3_last_error());
        finish_text(g);
        end(g, Q3_STOP_ERROR);
        return Q3_OK;
    }
    if (g->o.grammar && q3_matcher_accept(g->o.grammar, id)) {
        /* the mask allowed only tokens it accepts: this is a bug, not the model's doing */
        snprintf(g->error, sizeof g->error, "grammar: the sampled token %d is not allowed: %s", id, q3_last_error());
        finish_text(g);
        end(g, Q3_STOP_ERROR);
        return Q3_OK;
    }
    if (g->o.logprobs) {
        logprob_of(g->raw ? g->raw : g->logits, g->vocab, id, g->o.top_logprobs, &g->lp[g->r.n_ids]);
    }
    q3_sampler_accept(g->smp, id);
    g->r.ids[g->r.n_ids++] = id;
    if (g->o.on_token) g->o.on_token(g->o.user, g, id);
    if (id == g->eot[0] || id == g->eot[1]) {
        finish_text(g);
        end(g, Q3_STOP_END_OF_TURN);
        return Q3_OK;
    }
    int to = channel_switch(g, id);
    int stopped;
    if (to >= 0) { /* markup: the text so far ends in its channel, the token is an edge */
        if (flush_detok(g)) goto oom;
        stopped = flush_text(g, id, 1);
        if (!stopped) switch_channel(g, (q3_channel)to, id, Q3_EDGE_CLOSE);
    } else {
        const char *s;
        size_t n;
        if (g->detok && !q3_detokenizer_push(g->detok, id, &s, &n) && n && append(&g->text, s, n)) goto oom;
        stopped = flush_text(g, id, 0);
    }
    if (stopped) {
        switch_channel(g, Q3_CHANNEL_CONTENT, id, Q3_EDGE_CUT);
        end(g, Q3_STOP_STRING);
        return Q3_OK;
    }
    if (g->r.n_ids >= g->max_ids || q3_seq_pos(g->ctx, g->seq) >= q3_ctx_n_ctx(g->ctx)) {
        finish_text(g);
        end(g, g->o.max_tokens > 0 && g->r.n_ids >= g->o.max_tokens ? Q3_STOP_LENGTH : Q3_STOP_CONTEXT);
        return Q3_OK;
    }
    g->pending = id;
    return Q3_OK;
oom:
    end(g, Q3_STOP_ERROR);
    snprintf(g->error, sizeof g->error, "out of memory");
    return q3_fail(Q3_ERR_NOMEM, "out of memory");
}

/* ---- preemption: the K/V given back, recomputed later ------------------------------------- */

/* The position where the prompt ends (earlier turns, then the prompt). */
static size_t prompt_end(const q3_gen *g) { return g->base + g->n_prompt; }
/* Positions of hist still to compute again. */
static int recovering(const q3_gen *g) { return g->hist && g->hist_done < g->n_hist; }

q3_status q3_gen_preempt(q3_gen *g)
{
    q3_clear_error();
    Q3_NOT_NULL(g);
    if (g->done) return q3_fail(Q3_ERR_INVALID, "q3_gen_preempt: the generator has stopped");
    q3_status st = check_seq(g);
    if (st) return st;
    if ((st = q3_ctx_enter(g->ctx, "q3_gen_preempt"))) return st;
    const q3_kv_seq *kv = &g->ctx->kv.seqs[g->seq];
    if (!g->hist) { /* preempted again before it came back: hist already holds what it held then */
        g->n_hist = (size_t)kv->n_tokens;
        g->hist = malloc((g->n_hist ? g->n_hist : 1) * sizeof *g->hist);
        if (!g->hist) {
            q3_ctx_leave(g->ctx);
            return q3_fail(Q3_ERR_NOMEM, "out of memory");
        }
        memcpy(g->hist, kv->tokens, g->n_hist * sizeof *g->hist);
    }
    st = q3_kv_seq_truncate(&g->ctx->kv, g->seq, 0); /* cannot fail at 0: whole blocks, full ones cached */
    q3_ctx_leave(g->ctx);
    if (st) return st;
    g->hist_done = 0;
    g->resume = 1;
    return Q3_OK;
}

/* A preempted generator's first step: the prefix cache gives back what it
 * still has of hist (full blocks, prompt and generated alike). */
static q3_status resume(q3_gen *g)
{
    q3_status st = q3_ctx_enter(g->ctx, "q3_gen_step");
    if (st) return st;
    int n = (int)g->n_hist;
    g->hist_done = (size_t)q3_kv_seq_reuse_prefix(&g->ctx->kv, g->seq, g->hist, n, n);
    q3_ctx_leave(g->ctx);
    g->resume = 0;
    if (g->hist_done == g->n_hist) {
        free(g->hist);
        g->hist = NULL;
        g->n_hist = g->hist_done = 0;
    }
    return Q3_OK;
}

/* ---- token masks of a step's rows, in parallel ----------------------------------------- */

static void mask_row(void *ctx, int i)
{
    q3_gen *g = ((q3_gen *const *)ctx)[i];
    const uint64_t *mask;
    if (matcher_rank_mask(g->o.grammar, &mask)) return; /* a failure is met again, and reported, in after_logits */
    /* where nothing reads the row before the mask (no processor, no log-probabilities), the mask goes
       on here too, on this thread: what after_logits would do, in parallel */
    if (!g->o.on_logits && !g->o.logprobs && !q3_matcher_apply(g->o.grammar, g->logits, g->vocab)) g->masked = 1;
}

/* Computes (and where it can, applies) the masks of the constrained rows
 * among rows[0..n) on the decode unit's threads, so that after_logits finds
 * each ready (a matcher keeps its current mask). Each row has its own
 * matcher and logits; an unconstrained row, or one replaying its history
 * (replay[r]: no logits), is not visited. Nothing to do for fewer than two
 * constrained rows or one thread. */
static void masks_in_parallel(q3_ctx *c, q3_gen *const *rows, const int *replay, int n)
{
    q3_unit *u = c->decode_unit;
    if (!u->b->parallel_for || u->n_threads < 2) return;
    q3_gen *con[256];
    int k = 0;
    for (int i = 0; i < n; i++)
        if (rows[i]->o.grammar && !replay[i]) con[k++] = rows[i];
    if (k >= 2) u->b->parallel_for(u->impl, mask_row, con, k);
}

/* ---- the step ------------------------------------------------------------------------------ */

/* The tokens g prefills next ([*n] at *tokens; 0: none) and whether its
 * last one yields logits to sample. Positions first prefilled are prefilled
 * again (any split gives the same K/V); generated ones are decode rows. */
static size_t prefill_next(const q3_gen *g, const int32_t **tokens, int *sample)
{
    *sample = 0;
    if (recovering(g)) {
        size_t end = prompt_end(g) < g->n_hist ? prompt_end(g) : g->n_hist;
        *tokens = g->hist + g->hist_done;
        return g->hist_done < end ? end - g->hist_done : 0;
    }
    *tokens = g->prompt + g->prompt_done;
    *sample = 1;
    return g->n_prompt - g->prompt_done;
}

q3_status q3_gen_step(q3_gen *const *gens, int n) { return q3_gen_step_budget(gens, n, 0); }

q3_status q3_gen_step_budget(q3_gen *const *gens, int n, int budget)
{
    q3_clear_error();
    if (n <= 0) return Q3_OK;
    if (!gens) return q3_fail(Q3_ERR_INVALID, "q3_gen_step: gens is NULL");
    if (budget < 0 && budget != Q3_STEP_PACED)
        return q3_fail(Q3_ERR_INVALID, "q3_gen_step_budget: budget is %d, must be >= 0 (0: one chunk) or Q3_STEP_PACED", budget);
    for (int i = 0; i < n; i++)
        if (!gens[i]) return q3_fail(Q3_ERR_INVALID, "q3_gen_step: gens[%d] is NULL", i);
    q3_ctx *c = gens[0]->ctx;
    int max = q3_ctx_max_seqs(c);
    q3_decode_row rows[256];
    q3_gen *row_gen[256];
    int row_replay[256];
    q3_step s = {.decode = rows, .prefill_seq = -1};
    q3_gen *pg = NULL;
    int pg_sample = 0;
    size_t pg_left = 0;
    for (int i = 0; i < n; i++) {
        q3_gen *g = gens[i];
        if (g->ctx != c) return q3_fail(Q3_ERR_INVALID, "generators of different contexts in one step");
        if (g->done) continue;
        g->masked = 0; /* set again only by this step's masks_in_parallel */
        q3_status cst = check_seq(g);
        if (cst) return cst;
        if (g->resume && (cst = resume(g))) return cst;
        const int32_t *t;
        int sample;
        size_t left = prefill_next(g, &t, &sample);
        if (left) {
            if (!pg) {
                pg = g;
                pg_left = left;
                pg_sample = sample;
                s.prefill_tokens = t;
            }
            continue;
        }
        if (s.n_decode == max || s.n_decode == 256) continue; /* the rest wait for the next step */
        int replay = recovering(g); /* a generated token's K/V again: the row it had, no sampling */
        rows[s.n_decode] = (q3_decode_row){.seq = g->seq, .token = replay ? g->hist[g->hist_done] : g->pending,
                                           .logits = replay ? NULL : g->logits};
        row_replay[s.n_decode] = replay;
        row_gen[s.n_decode++] = g;
    }
    int n_pre = 0;
    if (pg) {
        int cap = q3_ctx_chunk(c);
        if (budget > 0 && s.n_decode > 0) { /* the decode rows first, the prefill the rest (at least a token,
                                                so it moves); with no decode row, no stream waits: a whole chunk */
            int rest = budget - s.n_decode;
            if (rest < cap) cap = rest > 1 ? rest : 1;
        } else if (budget == Q3_STEP_PACED && s.n_decode > 0) {
            int rest = (3 * s.n_decode + 1) / 2;
            if (rest < Q3_STEP_PACED_MIN) rest = Q3_STEP_PACED_MIN;
            if (rest < cap) cap = rest;
        }
        n_pre = pg_left < (size_t)cap ? (int)pg_left : cap;
        s.prefill_seq = pg->seq;
        s.n_prefill = n_pre;
        if ((size_t)n_pre == pg_left && pg_sample) s.prefill_logits = pg->logits;
    }
    if (!s.n_decode && !pg) return Q3_OK;
    double t0 = q3_now();
    q3_status st = q3_ctx_step(c, &s);
    if (st) return st;
    double dt = q3_now() - t0;
    if (pg) {
        pg->r.prefill_s += dt;
        if (!pg_sample) {
            pg->hist_done += (size_t)n_pre;
        } else {
            pg->prompt_done += (size_t)n_pre;
            if (pg->prompt_done == pg->n_prompt && (st = after_logits(pg))) return st;
        }
    }
    masks_in_parallel(c, row_gen, row_replay, s.n_decode);
    for (int r = 0; r < s.n_decode; r++) {
        q3_gen *g = row_gen[r];
        g->r.decode_s += dt;
        if (row_replay[r]) g->hist_done++;
        else if ((st = after_logits(g))) return st;
    }
    for (int i = 0; i < n; i++) /* back where it was: hist no longer needed */
        if (gens[i]->hist && !recovering(gens[i]) && !gens[i]->resume) {
            free(gens[i]->hist);
            gens[i]->hist = NULL;
            gens[i]->n_hist = gens[i]->hist_done = 0;
        }
    return Q3_OK;
}

q3_status q3_generate(q3_session *s, q3_sampler *smp, const q3_tokenizer *tok, const int32_t *prompt, size_t n,
                      const q3_gen_opts *o, q3_gen_result *r)
{
    Q3_NOT_NULL(r);
    memset(r, 0, sizeof *r);
    Q3_NOT_NULL(s);
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
