/* bench_serve: a serving benchmark for `q3 serve`. Starts the server on a
 * free loopback port (or, with --port, talks to a server already there, such
 * as llama-server), then for each client count N runs N concurrent
 * streaming clients (each R requests, greedy, ignore_eos, the same prompt
 * length and max_tokens; client k starts k x --stagger-ms later, so prompts
 * arrive while others stream) and reports aggregate generated tok/s, time to
 * first token p50/p99, time per output token p50/p99 (per request: (last
 * content chunk - first) / (completion_tokens - 1)) and inter-token latency
 * p50/p99 (every gap between two content chunks of an answer).
 *
 *   build/bench/bench_serve [-m MODEL] [--clients 1,4,8,16] [--requests 2]
 *                           [--gen 32] [--prompt-words 48] [-t THREADS]
 *                           [--stagger-ms MS] [--step-tokens N] [--port P]
 * MODEL defaults to the synthetic Qwen3-0.6B in the cache folder, where
 * `./build/q3 bench` builds it ($Q3_MODELS, else $Q3_CACHE_DIR, else
 * ~/.cache/q3: tools/defaults.h); built there first when absent. */
#include <pthread.h>

#include "tools/defaults.h"

#include "../tests/serve_util.h"

static int port, gen = 32, prompt_words = 48, requests = 2, stagger_ms = 0;

typedef struct sample { double ttft, tpot; int tokens; } sample;

typedef struct client {
    int id, n;
    sample s[64];
    int failed;
    double *gaps;      /* inter-token gaps, s: between consecutive content chunks of one answer */
    int n_gaps, cap_gaps;
} client;

static int one_request(client *c, int cid, int k, sample *out)
{
    char body[8192];
    int o = snprintf(body, sizeof body, "{\"messages\":[{\"role\":\"user\",\"content\":\"Client %d request %d:", cid, k);
    for (int w = 0; w < prompt_words && o < (int)sizeof body - 200; w++) o += snprintf(body + o, sizeof body - (size_t)o, " word%d", (w * 7 + cid) % 97);
    snprintf(body + o, sizeof body - (size_t)o, "\"}],\"max_tokens\":%d,\"temperature\":0,\"stream\":true,\"ignore_eos\":true,"
             "\"stream_options\":{\"include_usage\":true},\"chat_template_kwargs\":{\"enable_thinking\":false}}", gen);
    int fd = ts_connect(port);
    if (fd < 0) return -1;
    double t0 = ts_now();
    if (ts_send_request(fd, "POST", "/v1/chat/completions", "", body)) { close(fd); return -1; }
    size_t cap = 1 << 16, len = 0, scanned = 0;
    char *buf = malloc(cap);
    double first = -1, last = -1;
    const char *pat = "\"delta\":{\"content\":";
    size_t pl = strlen(pat);
    for (;;) {
        if (len + 4096 > cap) buf = realloc(buf, cap *= 2);
        ssize_t n = recv(fd, buf + len, cap - len - 1, 0);
        if (n <= 0) break;
        double t = ts_now();
        len += (size_t)n;
        buf[len] = 0;
        for (char *p = buf + scanned; (p = strstr(p, pat)); p += pl) {
            if (first < 0) first = t;
            else if (c && c->n_gaps < c->cap_gaps) c->gaps[c->n_gaps++] = t - last;
            last = t;
        }
        scanned = len > pl ? len - pl : 0;
    }
    close(fd);
    const char *u = strstr(buf, "\"completion_tokens\":");
    int tokens = u ? atoi(u + 20) : 0;
    int ok = strstr(buf, "data: [DONE]") != NULL && first > 0;
    free(buf);
    if (!ok) return -1;
    out->ttft = first - t0;
    out->tpot = tokens > 1 ? (last - first) / (tokens - 1) : 0;
    out->tokens = tokens;
    return 0;
}

static void *client_main(void *arg)
{
    client *c = arg;
    if (stagger_ms) usleep((useconds_t)c->id * (useconds_t)stagger_ms * 1000u); /* arrivals spread: prompts come while others stream */
    for (int k = 0; k < requests && c->n < 64; k++)
        if (one_request(c, c->id, k, &c->s[c->n])) c->failed++;
        else c->n++;
    return NULL;
}

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double pct(double *v, int n, double p)
{
    if (!n) return 0;
    qsort(v, (size_t)n, sizeof *v, cmp);
    int i = (int)(p * (n - 1) + 0.5);
    return v[i];
}

int main(int argc, char **argv)
{
    const char *model = NULL, *threads = "2", *clients = "1,4,8,16", *step_tokens = NULL;
    int ext_port = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h") || !v) {
            fprintf(stderr, "usage: bench_serve [-m MODEL] [--clients 1,4,8,16] [--requests 2] [--gen 32] [--prompt-words 48] [-t THREADS]\n"
                            "                   [--stagger-ms MS] [--step-tokens N] [--port P: a server already on 127.0.0.1:P, e.g. llama-server]\n");
            return !strcmp(a, "--help") || !strcmp(a, "-h") ? 0 : 2;
        }
        i++;
        if (!strcmp(a, "-m")) model = v;
        else if (!strcmp(a, "--clients")) clients = v;
        else if (!strcmp(a, "--requests")) requests = atoi(v);
        else if (!strcmp(a, "--gen")) gen = atoi(v);
        else if (!strcmp(a, "--prompt-words")) prompt_words = atoi(v);
        else if (!strcmp(a, "-t")) threads = v;
        else if (!strcmp(a, "--stagger-ms")) stagger_ms = atoi(v);
        else if (!strcmp(a, "--step-tokens")) step_tokens = v;
        else if (!strcmp(a, "--port")) ext_port = atoi(v);
        else { fprintf(stderr, "bench_serve: unknown option %s\n", a); return 2; }
    }
    if (requests < 1 || requests > 64 || gen < 2 || prompt_words < 1 || stagger_ms < 0 || ext_port < 0 || ext_port > 65535) { fprintf(stderr, "bench_serve: bad sizes\n"); return 2; }
    int list[16], n_list = 0, max_n = 1;
    for (const char *p = clients; *p && n_list < 16;) {
        list[n_list] = atoi(p);
        if (list[n_list] < 1 || list[n_list] > 256) { fprintf(stderr, "bench_serve: bad client count\n"); return 2; }
        if (list[n_list] > max_n) max_n = list[n_list];
        n_list++;
        p = strchr(p, ',');
        if (!p) break;
        p++;
    }
    if (!model && !ext_port && q3_default_model("bench_serve", &model)) {
        fprintf(stderr, "bench_serve: %s (or pass -m MODEL)\n", q3_last_error());
        return 1;
    }
    char par[16];
    snprintf(par, sizeof par, "%d", max_n);
    test_server srv = {0};
    const char *args[] = {"-m", model, "-t", threads, "--parallel", par, "--ctx", "1024",
                          step_tokens ? "--step-tokens" : NULL, step_tokens, NULL};
    if (!ext_port && (ts_start(&srv, args) || ts_wait_line(&srv, "ready"))) {
        fprintf(stderr, "bench_serve: the server did not start (is %s a Qwen3 folder or .gguf? its stderr is above)\n", model);
        ts_stop(&srv);
        return 1;
    }
    port = ext_port ? ext_port : srv.port;
    sample warm;
    one_request(NULL, 999, 0, &warm); /* page the weights in */
    printf("%s, %s threads, greedy, ignore_eos, prompt ~%d words, %d tokens per answer, %d requests per client, "
           "client k starts at k x %d ms\n", ext_port ? "the server on 127.0.0.1" : model, threads, prompt_words, gen,
           requests, stagger_ms);
    printf("| clients | requests | tok/s (all) | TTFT p50 ms | TTFT p99 ms | TPOT p50 ms | TPOT p99 ms | ITL p50 ms | ITL p99 ms | failed |\n");
    printf("|---|---|---|---|---|---|---|---|---|---|\n");
    for (int li = 0; li < n_list; li++) {
        int n = list[li];
        client *cs = calloc((size_t)n, sizeof *cs);
        pthread_t *th = calloc((size_t)n, sizeof *th);
        double t0 = ts_now();
        for (int c = 0; c < n; c++) {
            cs[c].id = c;
            cs[c].cap_gaps = requests * gen;
            cs[c].gaps = calloc((size_t)cs[c].cap_gaps, sizeof *cs[c].gaps);
            pthread_create(&th[c], NULL, client_main, &cs[c]);
        }
        for (int c = 0; c < n; c++) pthread_join(th[c], NULL);
        double wall = ts_now() - t0;
        int total = 0, count = 0, failed = 0, n_gaps = 0;
        double *gaps = calloc((size_t)(n * requests * gen), sizeof *gaps);
        for (int c = 0; c < n; c++)
            for (int k = 0; k < cs[c].n_gaps; k++) gaps[n_gaps++] = cs[c].gaps[k] * 1e3;
        double *ttft = calloc((size_t)(n * requests), sizeof *ttft), *tpot = calloc((size_t)(n * requests), sizeof *tpot);
        for (int c = 0; c < n; c++) {
            failed += cs[c].failed;
            for (int k = 0; k < cs[c].n; k++) {
                total += cs[c].s[k].tokens;
                ttft[count] = cs[c].s[k].ttft * 1e3;
                tpot[count++] = cs[c].s[k].tpot * 1e3;
            }
        }
        printf("| %d | %d | %.1f | %.0f | %.0f | %.1f | %.1f | %.1f | %.1f | %d |\n", n, count, total / wall, pct(ttft, count, 0.5),
               pct(ttft, count, 0.99), pct(tpot, count, 0.5), pct(tpot, count, 0.99), pct(gaps, n_gaps, 0.5),
               pct(gaps, n_gaps, 0.99), failed);
        for (int c = 0; c < n; c++) free(cs[c].gaps);
        free(gaps);
        fflush(stdout);
        free(ttft);
        free(tpot);
        free(cs);
        free(th);
    }
    return ext_port || ts_stop(&srv) == 0 ? 0 : 1;
}
