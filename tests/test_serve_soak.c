/* q3 serve under a bounded soak (issue 27), all on 127.0.0.1 at once for about
 * 12 seconds: slowloris connections trickling header bytes, slow bodies, a
 * flood of requests well past the queue, and streams hung up mid-way. Asserts
 * that /health answers within 1 s throughout (on the API listener and on the
 * admin one), that the flood gets 429s (with Retry-After) and the metrics
 * count them, that the server ends the slow connections at their deadlines,
 * and that afterwards the gauges (running, waiting, KV use, open connections)
 * and the server's RSS come back to their baseline. */
#include <cjson/cJSON.h>
#include <pthread.h>

#include "serve_util.h"
#include "test.h"

#define MODEL TEST_DATA "/golden/e2e"
#define SOAK_SECONDS 12.0
#define N_SLOW_HEADERS 200
#define N_SLOW_BODIES 20
#define N_FLOOD 16
#define N_HANGUP 4

static int port, admin_port;
static int running = 1; /* atomic: the attackers' loops */
static int n_hangup_429, n_200, n_429, n_429_retry_after, n_other, n_hangups, n_cut_headers, n_cut_bodies;
static double worst_health, worst_admin_health;

static int is_running(void) { return __atomic_load_n(&running, __ATOMIC_ACQUIRE); }


static long rss_kb(pid_t pid)
{
    char path[64], line[256];
    snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
    FILE *f = fopen(path, "r");
    long kb = -1;
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, "VmRSS:", 6)) kb = atol(line + 6);
    if (f) fclose(f);
    return kb;
}

/* Connections that open a request and then trickle a byte a second; reopened
 * as the server ends them. body: 0 = headers never finish, 1 = a body never finishes. */
static void *slow_main(void *arg)
{
    int body = (int)(intptr_t)arg, n = body ? N_SLOW_BODIES : N_SLOW_HEADERS;
    int fds[N_SLOW_HEADERS];
    const char *start = body ? "POST /tokenize HTTP/1.1\r\nHost: x\r\nContent-Length: 10000\r\n\r\n{\"prompt\":\""
                             : "GET /health HTTP/1.1\r\nHost: x\r\n";
    for (int i = 0; i < n; i++) {
        fds[i] = ts_connect(port);
        if (fds[i] >= 0) ts_send_all(fds[i], start, strlen(start));
    }
    double last = ts_now();
    while (is_running()) {
        for (int i = 0; i < n; i++) {
            if (fds[i] < 0) continue;
            struct pollfd p = {.fd = fds[i], .events = POLLIN};
            char b[512];
            if (poll(&p, 1, 0) > 0 && recv(fds[i], b, sizeof b, MSG_DONTWAIT) <= 0) { /* the server ended it */
                close(fds[i]);
                __atomic_add_fetch(body ? &n_cut_bodies : &n_cut_headers, 1, __ATOMIC_RELAXED);
                fds[i] = ts_connect(port);
                if (fds[i] >= 0) ts_send_all(fds[i], start, strlen(start));
            }
        }
        if (ts_now() - last >= 1.0) {
            for (int i = 0; i < n; i++)
                if (fds[i] >= 0) send(fds[i], body ? "a" : "X-Slow: 1\r\n", body ? 1 : 11, MSG_NOSIGNAL);
            last = ts_now();
        }
        usleep(50000);
    }
    for (int i = 0; i < n; i++)
        if (fds[i] >= 0) close(fds[i]);
    return NULL;
}

/* Short requests back to back: more than the queue holds. */
static void *flood_main(void *arg)
{
    int k = (int)(intptr_t)arg;
    while (is_running()) {
        char body[256];
        snprintf(body, sizeof body, "{\"prompt\":\"Flood %d\",\"max_tokens\":8,\"temperature\":0}", k++);
        ts_resp r;
        if (ts_request(port, "POST", "/v1/completions", NULL, body, &r)) { __atomic_add_fetch(&n_other, 1, __ATOMIC_RELAXED); continue; }
        if (r.status == 200) __atomic_add_fetch(&n_200, 1, __ATOMIC_RELAXED);
        else if (r.status == 429) {
            __atomic_add_fetch(&n_429, 1, __ATOMIC_RELAXED);
            if (r.head && strcasestr(r.head, "\r\nRetry-After: ")) __atomic_add_fetch(&n_429_retry_after, 1, __ATOMIC_RELAXED);
            usleep(50000); /* a pause, not Retry-After's second: the queue stays full */
        } else {
            __atomic_add_fetch(&n_other, 1, __ATOMIC_RELAXED);
        }
        ts_resp_free(&r);
    }
    return NULL;
}

/* Streams read up to their first event, then hung up. */
static void *hangup_main(void *arg)
{
    (void)arg;
    while (is_running()) {
        int fd = ts_connect_timeout(port, 5);
        if (fd < 0) continue;
        ts_send_request(fd, "POST", "/v1/chat/completions", "",
                        "{\"messages\":[{\"role\":\"user\",\"content\":\"Go on.\"}],\"max_tokens\":200,\"stream\":true}");
        char b[512];
        ssize_t n = recv(fd, b, sizeof b - 1, 0);
        if (n > 0) {
            b[n] = 0;
            if (strstr(b, " 200 ")) __atomic_add_fetch(&n_hangups, 1, __ATOMIC_RELAXED);
            else if (strstr(b, " 429 ")) __atomic_add_fetch(&n_hangup_429, 1, __ATOMIC_RELAXED);
        }
        close(fd);
        usleep(100000);
    }
    return NULL;
}

/* /health every 100 ms on both listeners; the worst latency of each (1e9: a failure). */
static void *health_main(void *arg)
{
    (void)arg;
    while (is_running()) {
        for (int admin = 0; admin < 2; admin++) {
            double t0 = ts_now();
            ts_resp r;
            int rc = ts_request(admin ? admin_port : port, "GET", "/health", NULL, NULL, &r);
            double dt = ts_now() - t0;
            if (rc || r.status != 200) dt = 1e9;
            double *w = admin ? &worst_admin_health : &worst_health;
            if (dt > *w) *w = dt;
            ts_resp_free(&r);
        }
        usleep(100000);
    }
    return NULL;
}

static void gauges(double *run, double *wait, double *kv, double *conns, double *rejected, double *aborts)
{
    ts_resp r;
    *run = *wait = *kv = *conns = *rejected = *aborts = -1;
    if (ts_request(admin_port, "GET", "/metrics", NULL, NULL, &r)) return;
    *run = ts_metric(r.body, "vllm:num_requests_running");
    *wait = ts_metric(r.body, "vllm:num_requests_waiting");
    *kv = ts_metric(r.body, "vllm:kv_cache_usage_perc");
    *conns = ts_metric(r.body, "q3:http_connections");
    *rejected = ts_metric(r.body, "q3:requests_rejected_total");
    const char *a = strstr(r.body, "vllm:request_success_total{finished_reason=\"abort\"");
    *aborts = a ? ts_metric(a, "vllm:request_success_total") : -1;
    ts_resp_free(&r);
}

int main(void)
{
    double t_start = ts_now();
#if defined(__SANITIZE_ADDRESS__)
    { /* ASan keeps freed memory in a quarantine (256 MB): off for the server, so its RSS means what it says */
        const char *o = getenv("ASAN_OPTIONS");
        char opts[512];
        snprintf(opts, sizeof opts, "%s%squarantine_size_mb=0:thread_local_quarantine_size_kb=0", o ? o : "", o && *o ? ":" : "");
        setenv("ASAN_OPTIONS", opts, 1);
    }
#endif
    test_server srv = {0};
    const char *args[] = {"-m", MODEL, "-t", "1", "--parallel", "2", "--ctx", "256", "--max-queue", "8", "--header-timeout", "3",
                          "--body-timeout", "3", "--max-connections", "350", "--max-connections-per-ip", "320", "--admin-port", "0",
                          NULL};
    CHECK(ts_start(&srv, args) == 0 && ts_wait_line(&srv, "ready") == 0, "server started");
    if (!srv.port || !srv.admin_port) TEST_DONE();
    port = srv.port;
    admin_port = srv.admin_port;

    /* warm up (every thread's first allocations), then the baseline */
    for (int i = 0; i < 8; i++) {
        ts_resp r;
        ts_request(port, "POST", "/v1/completions", NULL, "{\"prompt\":\"Warm up\",\"max_tokens\":8}", &r);
        ts_resp_free(&r);
    }
    usleep(300000);
    long rss0 = rss_kb(srv.pid);
    double run0, wait0, kv0, conns0, rej0, ab0;
    gauges(&run0, &wait0, &kv0, &conns0, &rej0, &ab0);
    CHECK(run0 == 0 && wait0 == 0 && kv0 == 0 && conns0 >= 0, "baseline gauges: %g %g %g %g", run0, wait0, kv0, conns0);

    pthread_t slow[2], flood[N_FLOOD], hang[N_HANGUP], health;
    pthread_create(&health, NULL, health_main, NULL);
    pthread_create(&slow[0], NULL, slow_main, (void *)0);
    pthread_create(&slow[1], NULL, slow_main, (void *)1);
    for (int i = 0; i < N_FLOOD; i++) pthread_create(&flood[i], NULL, flood_main, (void *)(intptr_t)(i * 100000));
    for (int i = 0; i < N_HANGUP; i++) pthread_create(&hang[i], NULL, hangup_main, NULL);
    double peak_conns = 0;
    for (double t0 = ts_now(); ts_now() - t0 < SOAK_SECONDS;) {
        double run, wait, kv, conns, rej, ab;
        gauges(&run, &wait, &kv, &conns, &rej, &ab);
        if (conns > peak_conns) peak_conns = conns;
        usleep(500000);
    }
    __atomic_store_n(&running, 0, __ATOMIC_RELEASE);
    for (int i = 0; i < N_FLOOD; i++) pthread_join(flood[i], NULL);
    for (int i = 0; i < N_HANGUP; i++) pthread_join(hang[i], NULL);
    pthread_join(slow[0], NULL);
    pthread_join(slow[1], NULL);
    pthread_join(health, NULL);
    fprintf(stderr, "soak: %d answered, %d x 429 (%d with Retry-After), %d other; %d streams hung up; the server cut %d slow headers "
            "and %d slow bodies; worst /health %.0f ms (admin %.0f ms); peak %g connections\n", n_200, n_429, n_429_retry_after,
            n_other, n_hangups, n_cut_headers, n_cut_bodies, worst_health * 1e3, worst_admin_health * 1e3, peak_conns);
    CHECK(worst_health < 1.0, "/health on the API listener within 1 s throughout: worst %.0f ms", worst_health * 1e3);
    CHECK(worst_admin_health < 1.0, "/health on the admin listener within 1 s throughout: worst %.0f ms", worst_admin_health * 1e3);
    CHECK(n_200 > 0 && n_429 > 0 && n_429 == n_429_retry_after, "the flood: %d answered, %d refused with 429 (%d with Retry-After)",
          n_200, n_429, n_429_retry_after);
    CHECK(n_other == 0, "%d flood requests neither answered nor refused with 429", n_other);
    CHECK(n_hangups > 0, "streams hung up mid-way: %d", n_hangups);
    /* each slow connection lived at most its 3 s deadline: in 12 s each of them was cut at least twice */
    CHECK(n_cut_headers >= 2 * N_SLOW_HEADERS && n_cut_bodies >= 2 * N_SLOW_BODIES, "slow connections cut at their deadlines: %d, %d",
          n_cut_headers, n_cut_bodies);
    CHECK(peak_conns > N_SLOW_HEADERS, "the slow connections were open at once: peak %g", peak_conns);

    /* back to the baseline: nothing running or waiting, no KV held, no connection left open */
    double run = -1, wait = -1, kv = -1, conns = -1, rej = -1, ab = -1;
    for (int i = 0; i < 100; i++) {
        gauges(&run, &wait, &kv, &conns, &rej, &ab);
        if (run == 0 && wait == 0 && kv == 0 && conns <= conns0) break;
        usleep(100000);
    }
    CHECK(run == 0 && wait == 0 && kv == 0 && conns <= conns0, "gauges back: running %g waiting %g kv %g connections %g (baseline %g)",
          run, wait, kv, conns, conns0);
    CHECK(rej - rej0 == n_429 + n_hangup_429, "q3:requests_rejected_total counted every 429: %g, the clients saw %d", rej - rej0,
          n_429 + n_hangup_429);
    CHECK(ab - ab0 > 0, "aborted requests counted: %g (%d hang-ups; a stream may end before its client leaves)", ab - ab0, n_hangups);
    long rss1 = rss_kb(srv.pid);
    fprintf(stderr, "soak: RSS %ld kB before, %ld kB after; %.1f s in all\n", rss0, rss1, ts_now() - t_start);
    /* slack for allocator arenas and caches: 32 MB (an 8 MB body per connection kept would be gigabytes) */
    CHECK(rss0 > 0 && rss1 > 0 && rss1 < rss0 + 32 * 1024, "RSS back near its baseline: %ld kB -> %ld kB", rss0, rss1);
    ts_resp r;
    ts_request(port, "GET", "/health", NULL, NULL, &r);
    CHECK(r.status == 200, "the API listener answers after the soak: %d", r.status);
    ts_resp_free(&r);
    CHECK(ts_stop(&srv) == 0, "exit 0 on SIGTERM");
    TEST_DONE();
}
