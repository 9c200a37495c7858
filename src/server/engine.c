/* The engine thread and its scheduler loop (see engine.h): admission,
 * cancellation and the KV budget are the server's; every token goes through
 * the library's one generation loop (q3_gen_step), whose text pieces and
 * tokens come back through the callbacks below. */
#include "engine.h"

#include <poll.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "channel.h"
#include "embed_api.h"

/* Embedding and rerank requests run between steps, together in one packed
 * batch, up to this many tokens an iteration (at least one request), so a
 * flood of them holds generating sequences back by about one such batch. */
#define EMBED_TOKENS_PER_ITERATION 4096
#define EMBED_JOBS_PER_ITERATION 256

typedef struct slot {
    int busy;
    srv_job *job;
    int seq;
    int paused;            /* preempted (its KV blocks given back): out of the steps until the pool has room */
    q3_sampler *smp;
    q3_gen *gen;
    q3_matcher *matcher;   /* the job's constraint followed, or NULL */
    srv_out out;
} slot;

struct srv_engine {
    q3_ctx *ctx;
    const q3_tokenizer *tok;
    srv_metrics *metrics;
    int vocab, hidden, max_seqs;
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int stop;
    srv_job **queue;       /* ring of waiting jobs */
    int q_head, q_len, q_cap;
    int n_running;         /* slots in use (read under mu for srv_engine_busy) */
    slot *slots;
    slot **active;         /* [n_active] busy slots in admission order: the oldest prefilling one gets the chunk */
    q3_gen **gens;         /* [n_active] their generators, the same order */
    int n_active;
    int total_blocks, block_tokens;
    int step_tokens;       /* the per-step token budget (q3_gen_step_budget) */
    int started;
};

/* ---- what the generation loop hands back (engine thread) -------------------- */

/* Each sampled token: the time of the first, and its log-probability. */
static void on_token(void *user, q3_gen *g, int32_t id)
{
    slot *s = user;
    srv_job *j = s->job;
    if (q3_gen_result_get(g)->n_ids == 1) j->res.t_first = q3_now(); /* this thread only writes it; read once the job ended */
    int n;
    const q3_token_logprob *lp = q3_gen_logprobs(g, &n);
    if (!lp) return;
    pthread_mutex_lock(&j->mu);
    if (j->res.n_lp == j->res.cap_lp) {
        int cap = j->res.cap_lp ? 2 * j->res.cap_lp : 16;
        q3_token_logprob *p = realloc(j->res.lp, (size_t)cap * sizeof *p);
        if (p) { j->res.lp = p; j->res.cap_lp = cap; }
    }
    if (j->res.n_lp < j->res.cap_lp) j->res.lp[j->res.n_lp++] = lp[n - 1];
    pthread_mutex_unlock(&j->mu);
}

/* The logits processor: the request's logit_bias (a -100 forbids the token in
 * practice, a +100 all but forces it, as OpenAI describes them). */
static q3_status apply_bias(void *user, q3_gen *g, float *logits, int n_vocab)
{
    const srv_request *r = &((slot *)user)->job->req;
    for (int i = 0; i < r->n_bias; i++) logits[r->bias[i].id] += r->bias[i].bias;
    return Q3_OK;
}

/* Text as it comes: rendered into the job, its connection woken. */
static void on_text(void *user, const q3_text_piece *p)
{
    slot *s = user;
    srv_job *j = s->job;
    pthread_mutex_lock(&j->mu);
    srv_out_piece(&s->out, j, p);
    if (j->req.stream) {
        j->st.t_last_write = q3_now();
        srv_job_wake(j);
    }
    pthread_mutex_unlock(&j->mu);
}

static void release_slot(srv_engine *e, slot *s)
{
    q3_gen_free(s->gen);
    q3_matcher_free(s->matcher);
    q3_seq_drop(e->ctx, s->seq);
    q3_sampler_free(s->smp);
    srv_out_free(&s->out);
    srv_job_unref(s->job);
    int k = 0;
    for (int i = 0; i < e->n_active; i++) /* out of the active list, keeping the order */
        if (e->active[i] != s) {
            e->active[k] = e->active[i];
            e->gens[k++] = e->gens[i];
        }
    e->n_active = k;
    memset(s, 0, sizeof *s);
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
    int n_gen = q3_gen_result_get(s->gen)->n_ids;
    pthread_mutex_lock(&j->mu);
    j->res.n_completion = n_gen;
    j->res.t_done = now;
    if (reason != SRV_FINISH_NONE && !j->res.err_status) srv_out_finish(&s->out, j, reason);
    if (s->out.tool.oom || j->st.sse.oom || j->res.content.oom || j->res.reasoning.oom) {
        j->res.err_status = 500;
        snprintf(j->res.err_msg, sizeof j->res.err_msg, "out of memory while writing the answer");
    }
    j->res.state = j->res.err_status ? SRV_JOB_FAILED : reason != SRV_FINISH_NONE ? SRV_JOB_DONE : SRV_JOB_GONE;
    srv_job_wake(j);
    srv_finish fr = j->res.finish; /* NONE unless answered: counted as "abort" */
    pthread_mutex_unlock(&j->mu);
    double ttft = j->res.t_first > 0 ? j->res.t_first - j->req.t_submit : -1;
    double tpot = n_gen > 1 && j->res.t_first > 0 ? (now - j->res.t_first) / (n_gen - 1) : -1;
    srv_metrics_request(e->metrics, fr, j->req.n_prompt, j->res.n_cached, n_gen, ttft, tpot, now - j->req.t_submit);
    release_slot(e, s);
}

/* Ends the job with an error (HTTP status) while it runs. */
static void fail_running(srv_engine *e, slot *s, int status, const char *msg)
{
    pthread_mutex_lock(&s->job->mu);
    s->job->res.err_status = status;
    snprintf(s->job->res.err_msg, sizeof s->job->res.err_msg, "%s", msg);
    pthread_mutex_unlock(&s->job->mu);
    q3_gen_cancel(s->gen, Q3_STOP_CANCEL);
    finish(e, s, SRV_FINISH_LENGTH);
}

/* A generator that stopped: its job ends the way the wire says it. */
static void generator_done(srv_engine *e, slot *s)
{
    const q3_gen_result *r = q3_gen_result_get(s->gen);
    switch (r->stop) {
    case Q3_STOP_END_OF_TURN: finish(e, s, SRV_FINISH_STOP); break;
    case Q3_STOP_STRING: finish(e, s, SRV_FINISH_STOP_STRING); break;
    case Q3_STOP_LENGTH:
    case Q3_STOP_CONTEXT: finish(e, s, SRV_FINISH_LENGTH); break;
    case Q3_STOP_INTERRUPT:
    case Q3_STOP_CANCEL: finish(e, s, SRV_FINISH_NONE); break;
    case Q3_STOP_ERROR: {
        char msg[300];
        snprintf(msg, sizeof msg, "generation failed: %s", q3_gen_error(s->gen));
        fail_running(e, s, 500, msg);
        break;
    }
    }
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

/* ---- admission --------------------------------------------------------------- */

static int blocks_of(const srv_engine *e, int tokens) { return (tokens + e->block_tokens - 1) / e->block_tokens; }

/* What the request needs at its longest: more than the pool is a 400. */
static int blocks_for(const srv_engine *e, const srv_job *j) { return blocks_of(e, j->req.n_prompt + j->req.max_tokens); }

/* What a running sequence holds after its next step (prompt, tokens so far, one more). */
static int blocks_next(const srv_engine *e, const slot *s)
{
    return blocks_of(e, s->job->req.n_prompt + q3_gen_result_get(s->gen)->n_ids + 1);
}

/* The blocks the sequences in the steps hold after the next one (shared
 * prefix blocks counted for each: an upper bound). */
static int blocks_running(const srv_engine *e)
{
    int n = 0;
    for (int i = 0; i < e->n_active; i++)
        if (!e->active[i]->paused) n += blocks_next(e, e->active[i]);
    return n;
}

/* A sequence, a sampler and a generator for j; its prompt queued after the
 * longest cached prefix. 0, or -1 (nothing held). */
static int admit(srv_engine *e, slot *s, srv_job *j)
{
    memset(s, 0, sizeof *s);
    s->job = j;
    if (q3_seq_new(e->ctx, &s->seq)) return -1;
    q3_gen_opts o = q3_gen_opts_default();
    o.max_tokens = j->req.max_tokens;
    o.stop = (const char *const *)j->req.stop;
    o.n_stop = j->req.n_stop;
    o.on_text = on_text;
    o.on_token = on_token;
    o.user = s;
    o.split_channels = j->req.kind == SRV_CHAT;
    o.logprobs = j->req.logprobs;
    o.top_logprobs = j->req.top_logprobs;
    o.no_prompt_penalty = j->req.no_prompt_penalty;
    if (j->req.n_bias) o.on_logits = apply_bias;
    if (j->req.grammar) { /* compiled by the HTTP thread; the matcher is this sequence's */
        if (q3_matcher_new(j->req.grammar, j->req.grammar_flags, &s->matcher)) {
            q3_seq_drop(e->ctx, s->seq);
            memset(s, 0, sizeof *s);
            return -1;
        }
        o.grammar = s->matcher;
    }
    int n_done = q3_seq_reuse_prefix(e->ctx, s->seq, j->req.prompt, (size_t)j->req.n_prompt);
    if (q3_sampler_new(&j->req.sp, e->vocab, &s->smp) || q3_gen_new(e->ctx, s->seq, s->smp, e->tok, &o, &s->gen) ||
        q3_gen_prompt_from(s->gen, j->req.prompt, (size_t)j->req.n_prompt, (size_t)n_done)) {
        q3_gen_free(s->gen);
        q3_matcher_free(s->matcher);
        q3_sampler_free(s->smp);
        q3_seq_drop(e->ctx, s->seq);
        memset(s, 0, sizeof *s);
        return -1;
    }
    s->busy = 1;
    e->active[e->n_active] = s;
    e->gens[e->n_active++] = s->gen;
    pthread_mutex_lock(&j->mu);
    j->res.n_cached = n_done;
    j->res.state = SRV_JOB_RUNNING;
    pthread_mutex_unlock(&j->mu);
    return 0;
}

static slot *free_slot(srv_engine *e)
{
    for (int i = 0; i < e->max_seqs; i++)
        if (!e->slots[i].busy) return &e->slots[i];
    return NULL;
}

/* Whether the client hung up: a cancelled flag, or (while MHD does not watch a
 * suspended connection) a reset or closed socket. A client that only shut its
 * sending side (shutdown(SHUT_WR) after the request: POLLRDHUP) still reads
 * its answer, so that is no hang-up; a client gone for good shows when bytes
 * reach it (a stream's chunks and pings, at least every second). */
static int gone(srv_job *j)
{
    pthread_mutex_lock(&j->mu);
    int c = j->st.cancelled || !j->st.conn;
    if (!c && j->st.suspended && j->st.fd >= 0) {
        struct pollfd p = {.fd = j->st.fd, .events = 0};
        if (poll(&p, 1, 0) > 0 && (p.revents & (POLLHUP | POLLERR | POLLNVAL))) c = j->st.cancelled = 1;
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
        srv_buf_puts(&j->st.sse, ": ping\n\n");
        j->st.t_last_write = now;
        srv_job_wake(j);
    }
    pthread_mutex_unlock(&j->mu);
}

/* ---- embeddings and rerank --------------------------------------------------------- */

/* Runs the jobs in one packed batch (embed_api.c) and answers each. */
static void run_embeds(srv_engine *e, srv_job *const *jobs, int n)
{
    char msg[256] = "";
    double t0 = q3_now();
    for (int k = 0; k < n; k++) {
        pthread_mutex_lock(&jobs[k]->mu);
        jobs[k]->res.state = SRV_JOB_RUNNING;
        pthread_mutex_unlock(&jobs[k]->mu);
    }
    int rc = srv_embed_run(e->ctx, e->tok, e->hidden, jobs, n, msg, sizeof msg);
    double now = q3_now();
    for (int k = 0; k < n; k++) {
        srv_job *j = jobs[k];
        pthread_mutex_lock(&j->mu);
        j->res.t_first = t0;
        j->res.t_done = now;
        if (rc) {
            j->res.err_status = 500;
            snprintf(j->res.err_msg, sizeof j->res.err_msg, "%s", msg);
        }
        j->res.finish = rc ? SRV_FINISH_NONE : SRV_FINISH_STOP;
        j->res.state = rc ? SRV_JOB_FAILED : SRV_JOB_DONE;
        srv_job_wake(j);
        pthread_mutex_unlock(&j->mu);
        srv_metrics_request(e->metrics, j->res.finish, j->req.n_prompt, 0, 0, t0 - j->req.t_submit, -1, now - j->req.t_submit);
        srv_job_unref(j);
    }
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
            int too_big = j->req.kind < SRV_EMBED && blocks_for(e, j) > e->total_blocks;
            if (cancel || too_big) { /* out of the queue, keeping the order of the rest */
                for (int m = k; m + 1 < e->q_len; m++)
                    e->queue[(e->q_head + m) % e->q_cap] = e->queue[(e->q_head + m + 1) % e->q_cap];
                e->q_len--;
                if (too_big) fail_job(j, 400, "the prompt and max_tokens need more KV cache than this server has (--kv-size)");
                else {
                    end_queued(j, SRV_JOB_GONE_QUEUED, 0, "client closed the connection");
                    srv_metrics_abort_queued(e->metrics);
                }
                continue;
            }
            k++;
        }
        /* embedding and rerank jobs: out of the queue in order, up to a batch's worth of tokens */
        srv_job *embeds[EMBED_JOBS_PER_ITERATION];
        int n_emb = 0;
        long long emb_tokens = 0;
        for (int k = 0; k < e->q_len;) {
            srv_job *j = e->queue[(e->q_head + k) % e->q_cap];
            if (j->req.kind >= SRV_EMBED && n_emb < EMBED_JOBS_PER_ITERATION &&
                (n_emb == 0 || emb_tokens + j->req.embed->n_tokens <= EMBED_TOKENS_PER_ITERATION)) {
                for (int m = k; m + 1 < e->q_len; m++)
                    e->queue[(e->q_head + m) % e->q_cap] = e->queue[(e->q_head + m + 1) % e->q_cap];
                e->q_len--;
                embeds[n_emb++] = j;
                emb_tokens += j->req.embed->n_tokens;
                continue;
            }
            k++;
        }
        /* new prompts while the pool holds the running sequences' next step and
           their prompts (the longest answers may still fill it: then the youngest
           is preempted); none while a preempted sequence waits to come back */
        int running = e->n_running, room = e->total_blocks - blocks_running(e);
        for (int i = 0; i < e->n_active; i++)
            if (e->active[i]->paused) room = -1;
        while (e->q_len > 0 && running + n_adm < e->max_seqs && room >= 0) {
            srv_job *j = e->queue[e->q_head];
            if (j->req.kind >= SRV_EMBED) break; /* its turn comes next iteration */
            int need = blocks_of(e, j->req.n_prompt + 1);
            if (need > room) break; /* FCFS: wait for room */
            room -= need;
            e->q_head = (e->q_head + 1) % e->q_cap;
            e->q_len--;
            admitted[n_adm++] = j;
        }
        for (int k = 0; k < e->q_len; k++) ping(e->queue[(e->q_head + k) % e->q_cap], now);
        e->n_running += n_adm;
        int waiting = e->q_len;
        pthread_mutex_unlock(&e->mu);

        for (int k = 0; k < n_adm; k++) {
            srv_job *j = admitted[k];
            slot *s = free_slot(e);
            if (!s || admit(e, s, j)) {
                pthread_mutex_lock(&e->mu);
                e->n_running--;
                pthread_mutex_unlock(&e->mu);
                fail_job(j, 503, "the server could not start this request (out of memory)");
            }
        }
        if (n_emb) run_embeds(e, embeds, n_emb);
        /* cancelled sequences free their blocks before the step */
        for (int i = e->n_active - 1; i >= 0; i--)
            if (gone(e->active[i]->job)) {
                q3_gen_cancel(e->active[i]->gen, Q3_STOP_CANCEL);
                finish(e, e->active[i], SRV_FINISH_NONE);
            }
        if (e->n_active == 0) { /* only jobs that cannot start yet: do not spin */
            publish(e, waiting);
            usleep(1000);
            continue;
        }
        /* preempted sequences come back, oldest first, when the pool holds them again */
        int held = blocks_running(e);
        for (int i = 0; i < e->n_active; i++) {
            slot *s = e->active[i];
            if (!s->paused) continue;
            if (held + blocks_next(e, s) > e->total_blocks) break;
            held += blocks_next(e, s);
            s->paused = 0;
        }
        int n_step = 0;
        for (int i = 0; i < e->n_active; i++)
            if (!e->active[i]->paused) e->gens[n_step++] = e->active[i]->gen;
        q3_status st = n_step ? q3_gen_step_budget(e->gens, n_step, e->step_tokens) : Q3_OK;
        if (st == Q3_ERR_KV_FULL && n_step > 1) { /* the youngest running sequence steps aside */
            slot *y = NULL;
            for (int i = 0; i < e->n_active; i++)
                if (!e->active[i]->paused) y = e->active[i];
            if (q3_gen_preempt(y->gen)) fail_running(e, y, 500, "the engine could not preempt this request");
            else {
                y->paused = 1;
                srv_metrics_preempted(e->metrics);
            }
            publish(e, waiting);
            continue;
        }
        if (st) {
            /* should not happen (one sequence alone fits the pool: admission refuses the rest): end every running job with an error */
            char msg[256];
            snprintf(msg, sizeof msg, "the engine failed a step: %s", q3_last_error());
            while (e->n_active > 0) fail_running(e, e->active[e->n_active - 1], 500, msg);
            publish(e, waiting);
            continue;
        }
        now = q3_now();
        for (int i = e->n_active - 1; i >= 0; i--) {
            slot *s = e->active[i];
            if (q3_gen_done(s->gen)) generator_done(e, s);
            else if (s->paused || q3_gen_prefilling(s->gen)) ping(s->job, now);
        }
        publish(e, waiting);
    }
    /* stopping: everything left ends with 503 */
    while (e->n_active > 0) fail_running(e, e->active[e->n_active - 1], 503, "the server is shutting down");
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
    if (!e) return Q3_ERR_NOMEM;
    e->ctx = o->ctx;
    e->tok = o->tok;
    e->metrics = o->metrics;
    e->vocab = o->vocab;
    e->hidden = o->hidden;
    e->max_seqs = q3_ctx_max_seqs(o->ctx);
    e->step_tokens = o->step_tokens;
    int used, cached;
    q3_ctx_kv_usage(o->ctx, &used, &cached, &e->total_blocks, &e->block_tokens);
    e->q_cap = o->max_queue > 0 ? o->max_queue : 256;
    e->queue = calloc((size_t)e->q_cap, sizeof *e->queue);
    e->slots = calloc((size_t)e->max_seqs, sizeof *e->slots);
    e->active = calloc((size_t)e->max_seqs, sizeof *e->active);
    e->gens = calloc((size_t)e->max_seqs, sizeof *e->gens);
    int ok = e->queue && e->slots && e->active && e->gens;
    pthread_mutex_init(&e->mu, NULL);
    pthread_cond_init(&e->cv, NULL);
    if (!ok || pthread_create(&e->thread, NULL, engine_main, e)) {
        e->ctx = NULL; /* the caller still owns it */
        e->thread = 0;
        srv_engine_free(e);
        return Q3_ERR_NOMEM;
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
    free(e->slots);
    free(e->queue);
    free(e->active);
    free(e->gens);
    q3_ctx_free(e->ctx);
    pthread_mutex_destroy(&e->mu);
    pthread_cond_destroy(&e->cv);
    free(e);
}
