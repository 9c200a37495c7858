/* The engine thread and its scheduler loop (see engine.h). */
#include "server/engine.h"

#include <math.h>
#include <poll.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "server/channel.h"
#include "util/error.h"

double q3_now(void);

typedef enum slot_state {
    SLOT_FREE,             /* no job */
    SLOT_PREFILL,          /* the prompt's K/V are being computed, a chunk a step */
    SLOT_DECODE,           /* generating: a decode row each step */
} slot_state;

typedef struct slot {
    slot_state state;
    srv_job *job;
    int seq;
    long long order;       /* admission order: the oldest prefilling slot gets the chunk */
    int n_done;            /* prompt tokens whose K/V are in the sequence */
    int32_t next;          /* the token the next decode row feeds */
    int n_gen;
    int need_blocks;       /* KV blocks reserved at admission (prompt + max_tokens) */
    q3_sampler *smp;
    int32_t *counts;       /* [vocab] generated-token counts, for presence/frequency penalties (lazily) */
    int32_t *gen;          /* [max_tokens] generated ids, to reset counts */
    float *raw;            /* [vocab] the row before penalties (logprobs requests) */
    q3_detok detok;
    q3_strbuf text;        /* generated text; [0, emitted) went out */
    size_t emitted, hold;  /* hold: longest stop string - 1 */
    srv_out out;
    float *logits;         /* [vocab] */
    double t_last;
} slot;

struct srv_engine {
    q3_ctx *ctx;
    const q3_tokenizer *tok;
    srv_metrics *metrics;
    int vocab, max_seqs, chunk;
    int32_t eot[2];
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int stop;
    srv_job **queue;       /* ring of waiting jobs */
    int q_head, q_len, q_cap;
    int n_running;         /* slots in use (read under mu for srv_engine_busy) */
    slot *slots;
    long long order;
    int total_blocks, block_tokens, reserved_blocks;
    q3_decode_row *rows;
    slot **row_slot;
    int started;
};

/* ---- output ---------------------------------------------------------------- */

/* Feeds what can no longer be part of a stop string to srv_out; returns 1 when a
 * stop string was found (what precedes it goes out, the rest is dropped). */
static int flush_text(slot *s, int final)
{
    srv_job *j = s->job;
    size_t upto = s->text.len;
    int stopped = 0;
    for (int i = 0; i < j->req.n_stop; i++) {
        size_t sl = strlen(j->req.stop[i]);
        size_t from = s->emitted > sl ? s->emitted - sl : 0;
        const char *hit = s->text.len > from ? memmem(s->text.data + from, s->text.len - from, j->req.stop[i], sl) : NULL;
        if (hit && (size_t)(hit - s->text.data) < upto) {
            upto = (size_t)(hit - s->text.data);
            stopped = 1;
        }
    }
    if (!stopped && !final) {
        upto = s->text.len > s->hold ? s->text.len - s->hold : 0;
        while (upto > s->emitted && upto < s->text.len && ((unsigned char)s->text.data[upto] & 0xc0) == 0x80) upto--;
    }
    if (upto > s->emitted) {
        pthread_mutex_lock(&j->mu);
        srv_out_text(&s->out, j, s->text.data + s->emitted, upto - s->emitted);
        double now = q3_now();
        if (j->req.stream) { j->st.t_last_write = now; srv_job_wake(j); }
        pthread_mutex_unlock(&j->mu);
        s->emitted = upto;
    }
    return stopped;
}

static void release_slot(srv_engine *e, slot *s)
{
    q3_seq_drop(e->ctx, s->seq);
    q3_sampler_free(s->smp);
    free(s->counts);
    free(s->gen);
    free(s->raw);
    q3_detok_free(&s->detok);
    free(s->text.data);
    srv_out_free(&s->out);
    e->reserved_blocks -= s->need_blocks;
    srv_job_unref(s->job);
    float *logits = s->logits;
    memset(s, 0, sizeof *s);
    s->logits = logits;
    s->state = SLOT_FREE;
    pthread_mutex_lock(&e->mu);
    e->n_running--;
    pthread_mutex_unlock(&e->mu);
}

/* Ends the job: reason SRV_FINISH_NONE = cancelled (no answer), else why it
 * ended; with res.err_status set it fails instead. */
static void finish(srv_engine *e, slot *s, srv_finish reason)
{
    srv_job *j = s->job;
    double now = q3_now();
    if (reason != SRV_FINISH_NONE && reason != SRV_FINISH_STOP_STRING) { /* a stop string drops what follows it */
        const char *piece;
        size_t pl;
        if (!q3_detok_flush(&s->detok, &piece, &pl) && pl) q3_strbuf_put(&s->text, piece, pl);
        flush_text(s, 1);
    }
    pthread_mutex_lock(&j->mu);
    j->res.n_completion = s->n_gen;
    j->res.t_done = now;
    if (reason != SRV_FINISH_NONE && !j->res.err_status) srv_out_finish(&s->out, j, reason);
    if (s->text.oom || j->st.sse.oom || j->res.content.oom || j->res.reasoning.oom) {
        j->res.err_status = 500;
        snprintf(j->res.err_msg, sizeof j->res.err_msg, "out of memory while writing the answer");
    }
    j->res.state = j->res.err_status ? SRV_JOB_FAILED : reason != SRV_FINISH_NONE ? SRV_JOB_DONE : SRV_JOB_GONE;
    srv_job_wake(j);
    srv_finish fr = j->res.finish; /* NONE unless answered: counted as "abort" */
    pthread_mutex_unlock(&j->mu);
    double ttft = j->res.t_first > 0 ? j->res.t_first - j->req.t_submit : -1;
    double tpot = s->n_gen > 1 && j->res.t_first > 0 ? (now - j->res.t_first) / (s->n_gen - 1) : -1;
    srv_metrics_request(e->metrics, fr, j->req.n_prompt, j->res.n_cached, s->n_gen, ttft, tpot, now - j->req.t_submit);
    release_slot(e, s);
}

/* A job that never reached a slot ends in state `how` (FAILED: with this
 * HTTP status; GONE_QUEUED: status 0, nobody is left to answer). */
static void end_queued(srv_job *j, srv_job_state how, int status, const char *msg)
{
    pthread_mutex_lock(&j->mu);
    j->res.err_status = status;
    snprintf(j->res.err_msg, sizeof j->res.err_msg, "%s", msg);
    j->res.state = how;
    srv_job_wake(j);
    pthread_mutex_unlock(&j->mu);
    srv_job_unref(j);
}

static void fail_job(srv_job *j, int status, const char *msg) { end_queued(j, SRV_JOB_FAILED, status, msg); }

/* The raw distribution's log-probabilities: the sampled token's and the top
 * alternatives', before penalties touch the row (raw: [vocab] copy of it). */
static void record_logprob(srv_engine *e, slot *s, const float *raw, int32_t id)
{
    srv_job *j = s->job;
    int V = e->vocab, K = j->req.top_logprobs;
    float max = raw[0];
    for (int i = 1; i < V; i++) if (raw[i] > max) max = raw[i];
    double sum = 0;
    for (int i = 0; i < V; i++) sum += exp((double)raw[i] - max);
    float lse = max + (float)log(sum);
    srv_logprob l = {.id = id, .logprob = raw[id] - lse};
    /* top K by insertion into a sorted array (K <= 20), lower id first on ties */
    for (int i = 0; i < V && K > 0; i++) {
        float x = raw[i];
        if (l.n_top == K && x <= l.top_lp[K - 1]) continue;
        int p = l.n_top < K ? l.n_top++ : K - 1;
        while (p > 0 && l.top_lp[p - 1] < x) {
            l.top_lp[p] = l.top_lp[p - 1];
            l.top_id[p] = l.top_id[p - 1];
            p--;
        }
        l.top_lp[p] = x;
        l.top_id[p] = i;
    }
    for (int k = 0; k < l.n_top; k++) l.top_lp[k] -= lse;
    pthread_mutex_lock(&j->mu);
    if (j->res.n_lp == j->res.cap_lp) {
        int cap = j->res.cap_lp ? 2 * j->res.cap_lp : 16;
        srv_logprob *p = realloc(j->res.lp, (size_t)cap * sizeof *p);
        if (p) { j->res.lp = p; j->res.cap_lp = cap; }
    }
    if (j->res.n_lp < j->res.cap_lp) j->res.lp[j->res.n_lp++] = l;
    pthread_mutex_unlock(&j->mu);
}

static int32_t sample(srv_engine *e, slot *s)
{
    srv_job *j = s->job;
    if (j->req.logprobs && s->raw) memcpy(s->raw, s->logits, (size_t)e->vocab * sizeof *s->raw);
    if (s->counts && s->n_gen) {
        for (int i = 0; i < s->n_gen; i++) {
            int32_t id = s->gen[i], c = s->counts[id];
            if (c > 0) { /* each distinct id once */
                s->logits[id] -= j->req.frequency_penalty * (float)c + j->req.presence_penalty;
                s->counts[id] = -c;
            }
        }
        for (int i = 0; i < s->n_gen; i++) if (s->counts[s->gen[i]] < 0) s->counts[s->gen[i]] = -s->counts[s->gen[i]];
    }
    int32_t id = q3_sampler_sample(s->smp, s->logits);
    if (j->req.logprobs && s->raw) record_logprob(e, s, s->raw, id);
    return id;
}

/* A sampled token: record, stream, and decide whether the job ends. */
static void on_token(srv_engine *e, slot *s, int32_t id)
{
    srv_job *j = s->job;
    double now = q3_now();
    if (s->n_gen == 0) j->res.t_first = now; /* written by this thread only, read once the job ended */
    s->t_last = now;
    q3_sampler_accept(s->smp, id);
    s->gen[s->n_gen++] = id;
    if (s->counts) s->counts[id]++;
    if (id == e->eot[0] || id == e->eot[1]) { finish(e, s, SRV_FINISH_STOP); return; }
    const char *piece;
    size_t pl;
    if (!q3_detok_push(&s->detok, id, &piece, &pl) && pl) q3_strbuf_put(&s->text, piece, pl);
    if (flush_text(s, 0)) { finish(e, s, SRV_FINISH_STOP_STRING); return; }
    if (s->n_gen >= j->req.max_tokens) { finish(e, s, SRV_FINISH_LENGTH); return; }
    s->next = id;
    s->state = SLOT_DECODE;
}

/* ---- admission --------------------------------------------------------------- */

static int blocks_for(const srv_engine *e, const srv_job *j)
{
    return (j->req.n_prompt + j->req.max_tokens + e->block_tokens - 1) / e->block_tokens;
}

static int admit(srv_engine *e, slot *s, srv_job *j)
{
    memset(s, 0, offsetof(slot, logits));
    s->job = j;
    if (q3_seq_new(e->ctx, &s->seq)) return -1;
    q3_sampler_params sp = j->req.sp;
    if (q3_sampler_new(&sp, e->vocab, &s->smp)) { q3_seq_drop(e->ctx, s->seq); return -1; }
    s->gen = malloc((size_t)j->req.max_tokens * sizeof *s->gen);
    if (j->req.presence_penalty != 0 || j->req.frequency_penalty != 0) s->counts = calloc((size_t)e->vocab, sizeof *s->counts);
    if (!s->gen || ((j->req.presence_penalty != 0 || j->req.frequency_penalty != 0) && !s->counts)) {
        q3_sampler_free(s->smp);
        free(s->gen);
        free(s->counts);
        q3_seq_drop(e->ctx, s->seq);
        return -1;
    }
    if (j->req.logprobs && !(s->raw = malloc((size_t)e->vocab * sizeof *s->raw))) {
        q3_sampler_free(s->smp);
        free(s->gen);
        free(s->counts);
        q3_seq_drop(e->ctx, s->seq);
        return -1;
    }
    if (sp.penalty_last_n > 0)
        for (int i = 0; i < j->req.n_prompt; i++) q3_sampler_accept(s->smp, j->req.prompt[i]);
    q3_detok_init(&s->detok, e->tok);
    for (int i = 0; i < j->req.n_stop; i++) {
        size_t l = strlen(j->req.stop[i]);
        if (l > s->hold + 1) s->hold = l - 1;
    }
    s->n_done = q3_seq_reuse_prefix(e->ctx, s->seq, j->req.prompt, (size_t)j->req.n_prompt);
    s->need_blocks = blocks_for(e, j);
    e->reserved_blocks += s->need_blocks;
    s->order = e->order++;
    s->state = SLOT_PREFILL;
    pthread_mutex_lock(&j->mu);
    j->res.n_cached = s->n_done;
    j->res.state = SRV_JOB_RUNNING;
    pthread_mutex_unlock(&j->mu);
    return 0;
}

static slot *free_slot(srv_engine *e)
{
    for (int i = 0; i < e->max_seqs; i++)
        if (e->slots[i].state == SLOT_FREE) return &e->slots[i];
    return NULL;
}

/* Whether the client hung up: a cancelled flag, or (while MHD does not watch a
 * suspended connection) a hang-up on its socket. */
static int gone(srv_job *j)
{
    pthread_mutex_lock(&j->mu);
    int c = j->st.cancelled || !j->st.conn;
    if (!c && j->st.suspended && j->st.fd >= 0) {
        struct pollfd p = {.fd = j->st.fd, .events = POLLRDHUP};
        if (poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL))) c = j->st.cancelled = 1;
    }
    pthread_mutex_unlock(&j->mu);
    return c;
}

/* A comment line on a stream that has been quiet for a second (a long prompt
 * prefilling, a long queue), so clients and proxies see the connection alive. */
static void ping(srv_job *j, double now)
{
    pthread_mutex_lock(&j->mu);
    if (j->req.stream && now - j->st.t_last_write > 1.0) {
        q3_strbuf_puts(&j->st.sse, ": ping\n\n");
        j->st.t_last_write = now;
        srv_job_wake(j);
    }
    pthread_mutex_unlock(&j->mu);
}

/* ---- the loop ------------------------------------------------------------------ */

static void publish(srv_engine *e, int waiting)
{
    int used, cached, total, bt;
    q3_ctx_kv_usage(e->ctx, &used, &cached, &total, &bt);
    srv_metrics_gauges(e->metrics, e->n_running, waiting, total ? (double)used / total : 0.0, bt, total);
}

static void *engine_main(void *arg)
{
    srv_engine *e = arg;
    for (;;) {
        /* take what the queue offers: cancelled jobs out, new ones into free slots */
        pthread_mutex_lock(&e->mu);
        while (!e->stop && e->q_len == 0 && e->n_running == 0) {
            publish(e, 0);
            pthread_cond_wait(&e->cv, &e->mu);
        }
        if (e->stop) { pthread_mutex_unlock(&e->mu); break; }
        srv_job *admitted[256];
        int n_adm = 0;
        double now = q3_now();
        for (int k = 0; k < e->q_len;) {
            srv_job *j = e->queue[(e->q_head + k) % e->q_cap];
            int cancel = gone(j);
            int too_big = blocks_for(e, j) > e->total_blocks;
            if (cancel || too_big) { /* out of the queue, keeping the order of the rest */
                for (int m = k; m + 1 < e->q_len; m++)
                    e->queue[(e->q_head + m) % e->q_cap] = e->queue[(e->q_head + m + 1) % e->q_cap];
                e->q_len--;
                if (too_big) fail_job(j, 400, "the prompt and max_tokens need more KV cache than this server has (--kv-size)");
                else end_queued(j, SRV_JOB_GONE_QUEUED, 0, "client closed the connection");
                continue;
            }
            k++;
        }
        int running = e->n_running;
        while (e->q_len > 0 && running + n_adm < e->max_seqs) {
            srv_job *j = e->queue[e->q_head];
            if (e->reserved_blocks + blocks_for(e, j) > e->total_blocks) break; /* FCFS: wait for room */
            e->q_head = (e->q_head + 1) % e->q_cap;
            e->q_len--;
            admitted[n_adm++] = j;
            e->reserved_blocks += blocks_for(e, j); /* undone by admit() recounting below */
        }
        for (int k = 0; k < e->q_len; k++) ping(e->queue[(e->q_head + k) % e->q_cap], now);
        e->n_running += n_adm;
        int waiting = e->q_len;
        pthread_mutex_unlock(&e->mu);

        for (int k = 0; k < n_adm; k++) {
            srv_job *j = admitted[k];
            e->reserved_blocks -= blocks_for(e, j);
            slot *s = free_slot(e);
            if (!s || admit(e, s, j)) {
                pthread_mutex_lock(&e->mu);
                e->n_running--;
                pthread_mutex_unlock(&e->mu);
                fail_job(j, 503, "the server could not start this request (out of memory)");
            }
        }
        /* cancelled sequences free their blocks before the step */
        for (int i = 0; i < e->max_seqs; i++)
            if (e->slots[i].state != SLOT_FREE && gone(e->slots[i].job)) finish(e, &e->slots[i], SRV_FINISH_NONE);

        q3_step st = {.decode = e->rows, .prefill_seq = -1};
        slot *pre = NULL;
        for (int i = 0; i < e->max_seqs; i++) {
            slot *s = &e->slots[i];
            if (s->state == SLOT_DECODE) {
                e->rows[st.n_decode] = (q3_decode_row){.seq = s->seq, .token = s->next, .logits = s->logits};
                e->row_slot[st.n_decode++] = s;
            } else if (s->state == SLOT_PREFILL && (!pre || s->order < pre->order)) {
                pre = s;
            }
        }
        int n_pre = 0;
        if (pre) {
            int left = pre->job->req.n_prompt - pre->n_done;
            n_pre = left < e->chunk ? left : e->chunk;
            st.prefill_seq = pre->seq;
            st.prefill_tokens = pre->job->req.prompt + pre->n_done;
            st.n_prefill = n_pre;
            st.prefill_logits = n_pre == left ? pre->logits : NULL;
        }
        if (st.n_decode == 0 && !pre) { /* only jobs that cannot start yet: do not spin */
            publish(e, waiting);
            usleep(1000);
            continue;
        }
        if (q3_ctx_step(e->ctx, &st)) {
            /* should not happen (admission reserved the blocks): end the step's jobs with an error */
            char msg[256];
            snprintf(msg, sizeof msg, "the engine failed a step: %s", q3_last_error());
            for (int r = 0; r < st.n_decode; r++) {
                slot *s = e->row_slot[r];
                pthread_mutex_lock(&s->job->mu);
                s->job->res.err_status = 500;
                snprintf(s->job->res.err_msg, sizeof s->job->res.err_msg, "%s", msg);
                pthread_mutex_unlock(&s->job->mu);
                finish(e, s, SRV_FINISH_LENGTH);
            }
            if (pre) {
                pthread_mutex_lock(&pre->job->mu);
                pre->job->res.err_status = 500;
                snprintf(pre->job->res.err_msg, sizeof pre->job->res.err_msg, "%s", msg);
                pthread_mutex_unlock(&pre->job->mu);
                finish(e, pre, SRV_FINISH_LENGTH);
            }
            publish(e, waiting);
            continue;
        }
        for (int r = 0; r < st.n_decode; r++) {
            slot *s = e->row_slot[r];
            on_token(e, s, sample(e, s));
        }
        if (pre) {
            pre->n_done += n_pre;
            if (pre->n_done == pre->job->req.n_prompt) on_token(e, pre, sample(e, pre));
            else ping(pre->job, q3_now());
        }
        publish(e, waiting);
    }
    /* stopping: everything left ends with 503 */
    for (int i = 0; i < e->max_seqs; i++)
        if (e->slots[i].state != SLOT_FREE) {
            srv_job *j = e->slots[i].job;
            pthread_mutex_lock(&j->mu);
            j->res.err_status = 503;
            snprintf(j->res.err_msg, sizeof j->res.err_msg, "the server is shutting down");
            pthread_mutex_unlock(&j->mu);
            finish(e, &e->slots[i], SRV_FINISH_LENGTH);
        }
    pthread_mutex_lock(&e->mu);
    while (e->q_len > 0) {
        srv_job *j = e->queue[e->q_head];
        e->q_head = (e->q_head + 1) % e->q_cap;
        e->q_len--;
        fail_job(j, 503, "the server is shutting down");
    }
    pthread_mutex_unlock(&e->mu);
    return NULL;
}

/* ---- life cycle ------------------------------------------------------------------ */

q3_status srv_engine_start(const srv_engine_opts *o, srv_engine **out)
{
    *out = NULL;
    srv_engine *e = calloc(1, sizeof *e);
    if (!e) return q3_fail(Q3_ERR_NOMEM, "out of memory");
    e->ctx = o->ctx;
    e->tok = o->tok;
    e->metrics = o->metrics;
    e->vocab = o->vocab;
    e->max_seqs = q3_ctx_max_seqs(o->ctx);
    e->chunk = q3_ctx_chunk(o->ctx);
    int used, cached;
    q3_ctx_kv_usage(o->ctx, &used, &cached, &e->total_blocks, &e->block_tokens);
    e->q_cap = o->max_queue > 0 ? o->max_queue : 256;
    e->queue = calloc((size_t)e->q_cap, sizeof *e->queue);
    e->slots = calloc((size_t)e->max_seqs, sizeof *e->slots);
    e->rows = calloc((size_t)e->max_seqs, sizeof *e->rows);
    e->row_slot = calloc((size_t)e->max_seqs, sizeof *e->row_slot);
    int ok = e->queue && e->slots && e->rows && e->row_slot;
    for (int i = 0; ok && i < e->max_seqs; i++) ok = (e->slots[i].logits = malloc((size_t)e->vocab * sizeof(float))) != NULL;
    e->eot[0] = q3_tokenizer_token_id(o->tok, "<|im_end|>", 10);
    e->eot[1] = q3_tokenizer_token_id(o->tok, "<|endoftext|>", 13);
    pthread_mutex_init(&e->mu, NULL);
    pthread_cond_init(&e->cv, NULL);
    if (!ok || pthread_create(&e->thread, NULL, engine_main, e)) {
        e->ctx = NULL; /* the caller still owns it */
        e->thread = 0;
        srv_engine_free(e);
        return q3_fail(Q3_ERR_NOMEM, "could not start the engine (out of memory or threads)");
    }
    e->started = 1;
    return *out = e, Q3_OK;
}

int srv_engine_submit(srv_engine *e, srv_job *j)
{
    pthread_mutex_lock(&e->mu);
    if (e->stop || e->q_len == e->q_cap) {
        pthread_mutex_unlock(&e->mu);
        return -1;
    }
    srv_job_ref(j);
    e->queue[(e->q_head + e->q_len++) % e->q_cap] = j;
    pthread_cond_signal(&e->cv);
    pthread_mutex_unlock(&e->mu);
    return 0;
}

int srv_engine_busy(srv_engine *e)
{
    pthread_mutex_lock(&e->mu);
    int n = e->q_len + e->n_running;
    pthread_mutex_unlock(&e->mu);
    return n;
}

void srv_engine_free(srv_engine *e)
{
    if (!e) return;
    if (e->started) {
        pthread_mutex_lock(&e->mu);
        e->stop = 1;
        pthread_cond_signal(&e->cv);
        pthread_mutex_unlock(&e->mu);
        pthread_join(e->thread, NULL);
    }
    for (int i = 0; e->slots && i < e->max_seqs; i++) free(e->slots[i].logits);
    free(e->slots);
    free(e->queue);
    free(e->rows);
    free(e->row_slot);
    q3_ctx_free(e->ctx);
    pthread_mutex_destroy(&e->mu);
    pthread_cond_destroy(&e->cv);
    free(e);
}
