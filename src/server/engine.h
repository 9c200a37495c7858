/* The engine: one thread that owns the q3_ctx and runs the scheduler loop.
 *
 * HTTP threads hand it jobs through a bounded FCFS queue (srv_engine_submit)
 * and never touch the context. Each step runs the decode rows of every
 * generating sequence, then a prefill chunk of the oldest admitted sequence
 * still prefilling with what is left of the step's token budget
 * (step_tokens), so a long prompt is spread over many steps and the running
 * streams keep their pace. A prompt is admitted when the KV pool holds it
 * beside the running sequences' next step; when a step finds the pool full
 * the youngest running sequence is preempted (its blocks given back) and
 * resumes, recomputed exactly, once the pool holds it again. Only a request
 * whose prompt and max_tokens exceed the whole pool is refused (400). A job's
 * output goes into the job (under its mutex) and its connection is resumed. */
#ifndef Q3_SERVER_ENGINE_H
#define Q3_SERVER_ENGINE_H

#include "q3.h"
#include "job.h"
#include "metrics.h"
#include "q3.h"

typedef struct srv_engine srv_engine;

typedef struct srv_engine_opts {
    q3_ctx *ctx;               /* owned by the engine from now on (freed by srv_engine_free) */
    const q3_tokenizer *tok;
    int vocab;                 /* the model's (logits per row) */
    int hidden;                /* the model's hidden size (an embedding's length) */
    srv_metrics *metrics;
    int max_queue;             /* jobs waiting at most (0: 256) */
    int step_tokens;           /* tokens a step runs at most: decode rows, then prefill (0: one chunk) */
} srv_engine_opts;

/* Starts the engine thread: Q3_OK, or Q3_ERR_NOMEM (out of memory or threads;
 * the caller still owns the context). */
q3_status srv_engine_start(const srv_engine_opts *o, srv_engine **out);
/* Queues j (taking a reference). 0, or -1 when the queue is full. */
int srv_engine_submit(srv_engine *e, srv_job *j);
/* Jobs waiting or running. */
int srv_engine_busy(srv_engine *e);
/* Stops the thread: jobs still waiting or running end with 503. Frees the context. */
void srv_engine_free(srv_engine *e);

/* Wakes the connection of j if it waits (caller holds j->mu). Defined in
 * http.c, the one file that speaks libmicrohttpd. */
void srv_job_wake(srv_job *j);

#endif
