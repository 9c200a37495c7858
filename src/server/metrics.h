/* Prometheus metrics under the names vLLM exports, so routers and dashboards
 * built for vLLM (Gateway API Inference Extension, llm-d) read q3 as is.
 * The engine thread records; HTTP threads render. One mutex guards it all:
 * records are a few adds per token, renders are rare. */
#ifndef Q3_SERVER_METRICS_H
#define Q3_SERVER_METRICS_H

#include <pthread.h>
#include <stdint.h>

#include "job.h"
#include "buf.h"

#define SRV_HIST_MAX 24

typedef struct srv_hist {
    int n;                       /* buckets (le bounds), +Inf implied */
    double le[SRV_HIST_MAX];
    uint64_t count[SRV_HIST_MAX]; /* per bucket, not cumulative */
    uint64_t total;
    double sum;
} srv_hist;

typedef struct srv_metrics {
    pthread_mutex_t mu;
    /* gauges, set by the engine after each step */
    int running, waiting;
    double kv_usage;          /* 0..1: blocks held by sequences / all blocks */
    int block_size, num_blocks;
    /* counters */
    uint64_t prompt_tokens, generation_tokens, cached_prompt_tokens;
    uint64_t success[4];      /* by vLLM's finished_reason label: stop, length, tool_calls, abort */
    uint64_t rejected;        /* 429: the queue was full */
    uint64_t preemptions;     /* sequences paused for a full KV pool (vLLM's num_preemptions_total) */
    int connections;          /* open on the main listener */
    srv_hist ttft, tpot, e2e, req_prompt, req_gen;
} srv_metrics;

void srv_metrics_init(srv_metrics *m);
void srv_metrics_destroy(srv_metrics *m);
void srv_metrics_gauges(srv_metrics *m, int running, int waiting, double kv_usage, int block_size, int num_blocks);
/* A finished request (finish: SRV_FINISH_NONE counts as "abort"; ttft/tpot < 0:
 * not measured). */
void srv_metrics_request(srv_metrics *m, srv_finish finish, int prompt_tokens, int cached, int gen_tokens, double ttft,
                         double tpot, double e2e);
/* A request cancelled before it started (its client left while it waited): "abort". */
void srv_metrics_abort_queued(srv_metrics *m);
/* A running sequence preempted (its KV blocks given back for a while). */
void srv_metrics_preempted(srv_metrics *m);
/* A request refused with 429 (the queue was full). */
void srv_metrics_rejected(srv_metrics *m);
/* Connections open now on the main listener. */
void srv_metrics_connections(srv_metrics *m, int n);
/* Prometheus text exposition format 0.0.4 into b. */
void srv_metrics_render(srv_metrics *m, const char *model_name, srv_buf *b);

#endif
