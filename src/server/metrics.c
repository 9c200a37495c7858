#include "metrics.h"

#include <stdio.h>
#include <string.h>

static void hist_init(srv_hist *h, const double *le, int n)
{
    memset(h, 0, sizeof *h);
    h->n = n;
    memcpy(h->le, le, (size_t)n * sizeof *le);
}

static void hist_add(srv_hist *h, double x)
{
    int i = 0;
    while (i < h->n && x > h->le[i]) i++;
    if (i < h->n) h->count[i]++;
    h->total++;
    h->sum += x;
}

void srv_metrics_init(srv_metrics *m)
{
    memset(m, 0, sizeof *m);
    pthread_mutex_init(&m->mu, NULL);
    static const double ttft[] = {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5,
                                  0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0};
    static const double tpot[] = {0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5,
                                  0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0};
    static const double e2e[] = {0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0,
                                 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0};
    static const double toks[] = {1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000};
    hist_init(&m->ttft, ttft, (int)(sizeof ttft / sizeof *ttft));
    hist_init(&m->tpot, tpot, (int)(sizeof tpot / sizeof *tpot));
    hist_init(&m->e2e, e2e, (int)(sizeof e2e / sizeof *e2e));
    hist_init(&m->req_prompt, toks, (int)(sizeof toks / sizeof *toks));
    hist_init(&m->req_gen, toks, (int)(sizeof toks / sizeof *toks));
}

void srv_metrics_destroy(srv_metrics *m) { pthread_mutex_destroy(&m->mu); }

void srv_metrics_gauges(srv_metrics *m, int running, int waiting, double kv_usage, int block_size, int num_blocks)
{
    pthread_mutex_lock(&m->mu);
    m->running = running;
    m->waiting = waiting;
    m->kv_usage = kv_usage;
    m->block_size = block_size;
    m->num_blocks = num_blocks;
    pthread_mutex_unlock(&m->mu);
}

/* The finished_reason labels, in success[]'s order. */
static const char *const REASONS[4] = {"stop", "length", "tool_calls", "abort"};

static int reason_index(srv_finish f)
{
    switch (f) {
    case SRV_FINISH_STOP:
    case SRV_FINISH_STOP_STRING: return 0;
    case SRV_FINISH_LENGTH: return 1;
    case SRV_FINISH_TOOL_CALLS: return 2;
    case SRV_FINISH_NONE: break;
    }
    return 3;
}

void srv_metrics_request(srv_metrics *m, srv_finish finish, int prompt_tokens, int cached, int gen_tokens, double ttft,
                         double tpot, double e2e)
{
    pthread_mutex_lock(&m->mu);
    m->success[reason_index(finish)]++;
    m->prompt_tokens += (uint64_t)prompt_tokens;
    m->cached_prompt_tokens += (uint64_t)cached;
    m->generation_tokens += (uint64_t)gen_tokens;
    if (ttft >= 0) hist_add(&m->ttft, ttft);
    if (tpot >= 0) hist_add(&m->tpot, tpot);
    hist_add(&m->e2e, e2e);
    hist_add(&m->req_prompt, prompt_tokens);
    hist_add(&m->req_gen, gen_tokens);
    pthread_mutex_unlock(&m->mu);
}

void srv_metrics_abort_queued(srv_metrics *m)
{
    pthread_mutex_lock(&m->mu);
    m->success[3]++;
    pthread_mutex_unlock(&m->mu);
}

void srv_metrics_preempted(srv_metrics *m)
{
    pthread_mutex_lock(&m->mu);
    m->preemptions++;
    pthread_mutex_unlock(&m->mu);
}

void srv_metrics_rejected(srv_metrics *m)
{
    pthread_mutex_lock(&m->mu);
    m->rejected++;
    pthread_mutex_unlock(&m->mu);
}

void srv_metrics_connections(srv_metrics *m, int n)
{
    pthread_mutex_lock(&m->mu);
    m->connections = n;
    pthread_mutex_unlock(&m->mu);
}

static void render_hist(srv_buf *b, const char *name, const char *help, const char *labels, const srv_hist *h)
{
    srv_buf_printf(b, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
    uint64_t cum = 0;
    for (int i = 0; i < h->n; i++) {
        cum += h->count[i];
        srv_buf_printf(b, "%s_bucket{%s,le=\"%g\"} %llu\n", name, labels, h->le[i], (unsigned long long)cum);
    }
    srv_buf_printf(b, "%s_bucket{%s,le=\"+Inf\"} %llu\n", name, labels, (unsigned long long)h->total);
    srv_buf_printf(b, "%s_sum{%s} %.9g\n%s_count{%s} %llu\n", name, labels, h->sum, name, labels,
                     (unsigned long long)h->total);
}

/* A label value with \, " and newlines escaped as the exposition format wants. */
static void label_value(char *out, size_t cap, const char *s)
{
    size_t o = 0;
    for (; *s && o + 3 < cap; s++) {
        if (*s == '\\' || *s == '"') { out[o++] = '\\'; out[o++] = *s; }
        else if (*s == '\n') { out[o++] = '\\'; out[o++] = 'n'; }
        else out[o++] = *s;
    }
    out[o] = 0;
}

void srv_metrics_render(srv_metrics *m, const char *model_name, srv_buf *b)
{
    char name[256], labels[300];
    label_value(name, sizeof name, model_name);
    snprintf(labels, sizeof labels, "model_name=\"%s\"", name);
    pthread_mutex_lock(&m->mu);
    srv_buf_printf(b, "# HELP vllm:num_requests_running Number of requests in model execution batches.\n"
                        "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{%s} %d\n", labels, m->running);
    srv_buf_printf(b, "# HELP vllm:num_requests_waiting Number of requests waiting to be processed.\n"
                        "# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{%s} %d\n", labels, m->waiting);
    srv_buf_printf(b, "# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.\n"
                        "# TYPE vllm:kv_cache_usage_perc gauge\nvllm:kv_cache_usage_perc{%s} %.6f\n", labels, m->kv_usage);
    srv_buf_printf(b, "# HELP vllm:cache_config_info Information of the KV cache config.\n"
                        "# TYPE vllm:cache_config_info gauge\n"
                        "vllm:cache_config_info{block_size=\"%d\",num_gpu_blocks=\"%d\",%s} 1\n",
                     m->block_size, m->num_blocks, labels);
    srv_buf_printf(b, "# HELP vllm:num_preemptions_total Cumulative number of preemptions from the engine.\n"
                        "# TYPE vllm:num_preemptions_total counter\nvllm:num_preemptions_total{%s} %llu\n", labels,
                     (unsigned long long)m->preemptions);
    srv_buf_printf(b, "# HELP vllm:prompt_tokens_total Number of prefill tokens processed.\n"
                        "# TYPE vllm:prompt_tokens_total counter\nvllm:prompt_tokens_total{%s} %llu\n", labels,
                     (unsigned long long)m->prompt_tokens);
    srv_buf_printf(b, "# HELP vllm:prefix_cache_hits_total Prompt tokens taken from the prefix cache.\n"
                        "# TYPE vllm:prefix_cache_hits_total counter\nvllm:prefix_cache_hits_total{%s} %llu\n", labels,
                     (unsigned long long)m->cached_prompt_tokens);
    srv_buf_printf(b, "# HELP vllm:generation_tokens_total Number of generation tokens processed.\n"
                        "# TYPE vllm:generation_tokens_total counter\nvllm:generation_tokens_total{%s} %llu\n", labels,
                     (unsigned long long)m->generation_tokens);
    srv_buf_puts(b, "# HELP vllm:request_success_total Count of finished requests by finish reason.\n"
                      "# TYPE vllm:request_success_total counter\n");
    for (int i = 0; i < 4; i++)
        srv_buf_printf(b, "vllm:request_success_total{finished_reason=\"%s\",%s} %llu\n", REASONS[i], labels,
                         (unsigned long long)m->success[i]);
    srv_buf_printf(b, "# HELP q3:requests_rejected_total Requests answered 429 because the queue was full.\n"
                        "# TYPE q3:requests_rejected_total counter\nq3:requests_rejected_total{%s} %llu\n", labels,
                     (unsigned long long)m->rejected);
    srv_buf_printf(b, "# HELP q3:http_connections Connections open on the API listener.\n"
                        "# TYPE q3:http_connections gauge\nq3:http_connections{%s} %d\n", labels, m->connections);
    render_hist(b, "vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", labels, &m->ttft);
    render_hist(b, "vllm:time_per_output_token_seconds", "Histogram of time per output token in seconds.", labels, &m->tpot);
    render_hist(b, "vllm:e2e_request_latency_seconds", "Histogram of end to end request latency in seconds.", labels, &m->e2e);
    render_hist(b, "vllm:request_prompt_tokens", "Number of prefill tokens processed.", labels, &m->req_prompt);
    render_hist(b, "vllm:request_generation_tokens", "Number of generation tokens processed.", labels, &m->req_gen);
    pthread_mutex_unlock(&m->mu);
}
