/* bench_embed: embeddings and reranking, q3 against llama.cpp on the same GGUFs.
 *
 *   build/bench/bench_embed --embed-gguf E.gguf [--rerank-gguf R.gguf] [--llama-server PATH]
 *                           [--llama-args "-np 8 -c 8192 -b 4096 -ub 4096"]... [-t 2] [--inputs 1000]
 *                           [--clients 4] [--per-request 32] [--docs 100] [--skip-library] [--skip-q3-serve]
 *
 * Workloads (deterministic, the same token ids for both engines):
 *  - embed: --inputs token-id lists of 16..512 tokens (log-normal, median 100; random ordinary
 *    tokens, then <|endoftext|>), sent as POST /v1/embeddings requests of --per-request inputs
 *    by --clients concurrent connections; inputs/s and tokens/s over the wall time;
 *  - rerank: one query and --docs documents of ~200 tokens (English words), one POST /v1/rerank;
 *  - latency (library): one 32-token input through q3_embed against a 32-token prefill
 *    (q3_ctx_step, one chunk) on the same context, medians of 21.
 * Each server runs alone (q3 serve, then llama-server once per --llama-args), with the same
 * threads; each llama-server setting is a separate row, so its best is visible. The library
 * rows (q3_embed / q3_rerank without HTTP) come first. The embeddings of the first inputs are
 * compared across engines (cosine), so both are known to compute the same thing. */
#include <math.h>
#include <pthread.h>

#include "../tests/serve_util.h"
#include "q3.h"

#define MAX_LLAMA_ARGS 8

static int threads = 2, n_inputs = 1000, clients = 4, per_request = 32, n_docs = 100;
static const char *llama_args[MAX_LLAMA_ARGS];
static int n_llama_args;

/* ---- the workload ------------------------------------------------------------------------------ */

static uint64_t rng = 0x853c49e6748fea9bull;
static double uniform(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return ((rng >> 11) + 0.5) / 9007199254740992.0;
}

static int32_t **ids;
static size_t *lens;
static long long total_tokens;

static void make_inputs(void)
{
    ids = calloc((size_t)n_inputs, sizeof *ids);
    lens = calloc((size_t)n_inputs, sizeof *lens);
    for (int i = 0; i < n_inputs; i++) {
        double z = sqrt(-2 * log(uniform())) * cos(2 * M_PI * uniform());
        int n = (int)lround(100 * exp(0.75 * z));
        n = n < 16 ? 16 : n > 512 ? 512 : n;
        ids[i] = malloc((size_t)n * sizeof **ids);
        for (int t = 0; t < n - 1; t++) ids[i][t] = 1000 + (int32_t)(uniform() * 100000); /* ordinary tokens */
        ids[i][n - 1] = 151643;                                                          /* <|endoftext|> */
        lens[i] = (size_t)n;
        total_tokens += n;
    }
}

static const char *const WORDS[] = {
    "the", "of", "and", "to", "in", "is", "was", "for", "on", "that", "with", "as", "by", "at", "from", "city",
    "river", "people", "time", "world", "water", "history", "capital", "country", "north", "south", "great",
    "small", "known", "first", "new", "old", "many", "early", "later", "during", "after", "before", "between",
    "music", "school", "market", "church", "bridge", "winter", "summer", "island", "mountain", "village", "law",
    "station", "garden", "paper", "light", "energy", "system", "model", "center", "family", "house", "road"};

/* A text of n words (about n tokens: each a common English word with its space). */
static char *words(int n)
{
    size_t cap = (size_t)n * 12 + 1, o = 0;
    char *s = malloc(cap);
    for (int i = 0; i < n; i++)
        o += (size_t)snprintf(s + o, cap - o, i ? " %s" : "%s", WORDS[(int)(uniform() * (sizeof WORDS / sizeof *WORDS))]);
    return s;
}

/* ---- HTTP -------------------------------------------------------------------------------------- */

/* ts_request with a 10-minute wait for the answer (a big request to a slow engine). */
static int request(int port, const char *method, const char *path, const char *body, ts_resp *r)
{
    int fd = ts_connect(port);
    if (fd < 0) {
        memset(r, 0, sizeof *r);
        return -1;
    }
    struct timeval tv = {.tv_sec = 600};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    int rc = ts_send_request(fd, method, path, "", body);
    if (!rc) rc = ts_read_response(fd, r);
    else memset(r, 0, sizeof *r);
    close(fd);
    return rc;
}

typedef struct client_arg {
    int port, id;
    int failed;
} client_arg;

static int next_request;
static pthread_mutex_t next_mu = PTHREAD_MUTEX_INITIALIZER;
static float *first_vecs; /* [4][hidden] the first 4 inputs' embeddings of the last server run */
static int hidden;

static void parse_first_vectors(const char *body, int first)
{
    /* "embedding":[...] in index order (both servers answer in order) */
    const char *p = body;
    for (int i = first; i < 4 && (p = strstr(p, "\"embedding\":[")); i++) {
        p += strlen("\"embedding\":[");
        for (int k = 0; k < hidden; k++) {
            char *e;
            first_vecs[(size_t)i * hidden + k] = strtof(p, &e);
            p = e + 1;
        }
    }
}

static void *embed_client(void *arg)
{
    client_arg *c = arg;
    size_t cap = 1 << 22;
    char *body = malloc(cap);
    for (;;) {
        pthread_mutex_lock(&next_mu);
        int r = next_request++;
        pthread_mutex_unlock(&next_mu);
        int i0 = r * per_request;
        if (i0 >= n_inputs) break;
        int i1 = i0 + per_request < n_inputs ? i0 + per_request : n_inputs;
        size_t o = (size_t)snprintf(body, cap, "{\"input\":[");
        for (int i = i0; i < i1; i++) {
            o += (size_t)snprintf(body + o, cap - o, i > i0 ? ",[" : "[");
            for (size_t t = 0; t < lens[i]; t++) o += (size_t)snprintf(body + o, cap - o, t ? ",%d" : "%d", ids[i][t]);
            o += (size_t)snprintf(body + o, cap - o, "]");
        }
        snprintf(body + o, cap - o, "],\"encoding_format\":\"float\"}");
        ts_resp resp;
        if (request(c->port, "POST", "/v1/embeddings", body, &resp) || resp.status != 200) {
            fprintf(stderr, "embeddings request %d failed: %d %.300s\n", r, resp.status, resp.body ? resp.body : "");
            c->failed++;
        } else if (i0 == 0) {
            parse_first_vectors(resp.body, 0);
        }
        ts_resp_free(&resp);
    }
    free(body);
    return NULL;
}

/* All inputs through the server at port: seconds, or -1. */
static double run_embed_load(int port)
{
    next_request = 0;
    pthread_t th[64];
    client_arg ca[64];
    int n = clients < 64 ? clients : 64;
    double t0 = ts_now();
    for (int i = 0; i < n; i++) {
        ca[i] = (client_arg){.port = port, .id = i};
        pthread_create(&th[i], NULL, embed_client, &ca[i]);
    }
    int failed = 0;
    for (int i = 0; i < n; i++) {
        pthread_join(th[i], NULL);
        failed += ca[i].failed;
    }
    double dt = ts_now() - t0;
    return failed ? -1 : dt;
}

static char *rerank_body;

/* One rerank request of all documents: seconds, or -1. */
static double run_rerank(int port, const char *path)
{
    ts_resp resp;
    double t0 = ts_now();
    int rc = request(port, "POST", path, rerank_body, &resp);
    double dt = ts_now() - t0;
    int results = 0;
    for (const char *p = resp.body; p && (p = strstr(p, "\"relevance_score\"")); p++) results++;
    if (rc || resp.status != 200 || results != n_docs) {
        fprintf(stderr, "rerank failed: %d, %d results: %.300s\n", resp.status, results, resp.body ? resp.body : "");
        dt = -1;
    }
    ts_resp_free(&resp);
    return dt;
}

/* Starts a server (argv[0] its binary) logging to log; waits (up to 10 minutes: llama-server reads
 * a 1.2 GB GGUF slowly on a busy machine) until GET /health answers 200. */
static pid_t start_server(char *const *argv, int port, const char *log)
{
    pid_t pid = fork();
    if (pid == 0) {
        FILE *f = freopen(log, "w", stderr);
        (void)f;
        dup2(2, 1);
        execv(argv[0], argv);
        _exit(127);
    }
    for (int i = 0; i < 6000; i++) {
        ts_resp r;
        if (!ts_request(port, "GET", "/health", NULL, NULL, &r) && r.status == 200) {
            ts_resp_free(&r);
            return pid;
        }
        ts_resp_free(&r);
        int st;
        if (waitpid(pid, &st, WNOHANG) == pid) return -1;
        usleep(100000);
    }
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    return -1;
}

static void stop_server(pid_t pid)
{
    kill(pid, SIGTERM);
    for (int i = 0; i < 200; i++) {
        if (waitpid(pid, NULL, WNOHANG) == pid) return;
        usleep(50000);
    }
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
}

static int free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t l = sizeof a;
    bind(fd, (struct sockaddr *)&a, sizeof a);
    getsockname(fd, (struct sockaddr *)&a, &l);
    close(fd);
    return ntohs(a.sin_port);
}

/* ---- rows ---------------------------------------------------------------------------------------- */

static void row(const char *engine, const char *what, double seconds, int items, long long tokens)
{
    if (seconds < 0) {
        printf("| %s | %s | failed | | | |\n", engine, what);
        return;
    }
    printf("| %s | %s | %.2f | %.1f | %.0f | %d items, %lld tokens |\n", engine, what, seconds, items / seconds,
           (double)tokens / seconds, items, tokens);
    fflush(stdout);
}

static double median(double *v, int n)
{
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && v[j] < v[j - 1]; j--) {
            double t = v[j];
            v[j] = v[j - 1];
            v[j - 1] = t;
        }
    return v[n / 2];
}

static double cosine(const float *a, const float *b, int n)
{
    double ab = 0, aa = 0, bb = 0;
    for (int i = 0; i < n; i++) ab += (double)a[i] * b[i], aa += (double)a[i] * a[i], bb += (double)b[i] * b[i];
    return ab / sqrt(aa * bb);
}

int main(int argc, char **argv)
{
    const char *embed_gguf = NULL, *rerank_gguf = NULL, *llama_server = NULL;
    int skip_library = 0, skip_q3_serve = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--embed-gguf") && v) embed_gguf = v, i++;
        else if (!strcmp(a, "--rerank-gguf") && v) rerank_gguf = v, i++;
        else if (!strcmp(a, "--llama-server") && v) llama_server = v, i++;
        else if (!strcmp(a, "--llama-args") && v && n_llama_args < MAX_LLAMA_ARGS) llama_args[n_llama_args++] = v, i++;
        else if (!strcmp(a, "-t") && v) threads = atoi(v), i++;
        else if (!strcmp(a, "--inputs") && v) n_inputs = atoi(v), i++;
        else if (!strcmp(a, "--clients") && v) clients = atoi(v), i++;
        else if (!strcmp(a, "--per-request") && v) per_request = atoi(v), i++;
        else if (!strcmp(a, "--docs") && v) n_docs = atoi(v), i++;
        else if (!strcmp(a, "--skip-library")) skip_library = 1;
        else if (!strcmp(a, "--skip-q3-serve")) skip_q3_serve = 1;
        else {
            fprintf(stderr, "usage: bench_embed --embed-gguf E.gguf [--rerank-gguf R.gguf] [--llama-server PATH]\n"
                            "       [--llama-args \"ARGS\"]... [-t N] [--inputs N] [--clients N] [--per-request N]\n"
                            "       [--docs N] [--skip-library] [--skip-q3-serve]\n");
            return 2;
        }
    }
    if (!embed_gguf || threads < 1 || n_inputs < 4 || clients < 1 || per_request < 1 || n_docs < 1) {
        fprintf(stderr, "bench_embed: --embed-gguf is required (and counts must be positive)\n");
        return 2;
    }
    if (!n_llama_args) llama_args[n_llama_args++] = "-np 8 -c 8192 -b 4096 -ub 4096";
    make_inputs();
    /* the rerank request: a query and documents of ~200 words */
    char *query = words(12);
    size_t cap = (size_t)n_docs * 2600 + 4096, o = 0;
    rerank_body = malloc(cap);
    o += (size_t)snprintf(rerank_body + o, cap - o, "{\"query\":\"%s\",\"documents\":[", query);
    char **docs = calloc((size_t)n_docs, sizeof *docs);
    for (int d = 0; d < n_docs; d++) {
        docs[d] = words(200);
        o += (size_t)snprintf(rerank_body + o, cap - o, d ? ",\"%s\"" : "\"%s\"", docs[d]);
    }
    snprintf(rerank_body + o, cap - o, "],\"top_n\":%d}", n_docs);

    q3_model *m = NULL;
    q3_tokenizer *tok = NULL;
    if (q3_model_open(embed_gguf, &m) || q3_tokenizer_for_model(m, &tok)) {
        fprintf(stderr, "bench_embed: %s\n", q3_last_error());
        return 1;
    }
    hidden = q3_model_hidden_size(m);
    first_vecs = calloc(4 * (size_t)hidden, sizeof *first_vecs);
    float *q3_first = calloc(4 * (size_t)hidden, sizeof *q3_first);
    /* the documents' prompt tokens, for the rows */
    long long rerank_tokens = 0;
    for (int d = 0; d < n_docs; d++) {
        int32_t *p;
        size_t n;
        if (!q3_rerank_tokenize(tok, NULL, query, docs[d], &p, &n)) rerank_tokens += (long long)n;
        free(p);
    }
    printf("workload: %d inputs, %lld tokens (16..512, median 100); rerank: %d documents, %lld prompt tokens; "
           "%d threads; requests of %d inputs from %d clients\n\n",
           n_inputs, total_tokens, n_docs, rerank_tokens, threads, per_request, clients);
    printf("| engine | workload | seconds | items/s | tokens/s | |\n|---|---|---|---|---|---|\n");

    if (!skip_library) {
        q3_ctx_opts co = q3_ctx_opts_default();
        co.n_threads = threads;
        co.n_ctx = 1024;
        q3_ctx *c = NULL;
        if (q3_ctx_new(m, &co, &c)) {
            fprintf(stderr, "bench_embed: %s\n", q3_last_error());
            return 1;
        }
        float *out = malloc((size_t)n_inputs * hidden * sizeof *out);
        q3_embed(c, (const int32_t *const *)ids, lens, 4, NULL, out); /* warm-up: graphs, packed weights */
        double t0 = ts_now();
        q3_status st = q3_embed(c, (const int32_t *const *)ids, lens, (size_t)n_inputs, NULL, out);
        row("q3 library (q3_embed)", "embed", st ? -1 : ts_now() - t0, n_inputs, total_tokens);
        memcpy(q3_first, out, 4 * (size_t)hidden * sizeof *out);
        /* latency: one 32-token input against a 32-token prefill */
        double te[21], tp[21];
        int32_t q32[32];
        for (int t = 0; t < 32; t++) q32[t] = ids[0][t % lens[0]];
        q32[31] = 151643;
        const int32_t *qin[1] = {q32};
        size_t qlen = 32;
        for (int r = 0; r < 21; r++) {
            double a = ts_now();
            q3_embed(c, qin, &qlen, 1, NULL, out);
            te[r] = ts_now() - a;
            int seq;
            q3_seq_new(c, &seq);
            q3_step s = {.prefill_seq = seq, .prefill_tokens = q32, .n_prefill = 32};
            a = ts_now();
            q3_ctx_step(c, &s);
            tp[r] = ts_now() - a;
            q3_seq_drop(c, seq);
        }
        double me = median(te, 21), mp = median(tp, 21);
        printf("| q3 library | one 32-token query: q3_embed %.2f ms, 32-token prefill step %.2f ms | ratio %.2f | | | |\n",
               me * 1e3, mp * 1e3, me / mp);
        free(out);
        q3_ctx_free(c);
        if (rerank_gguf) {
            q3_model *rm = NULL;
            q3_tokenizer *rt = NULL;
            if (q3_model_open(rerank_gguf, &rm) || q3_tokenizer_for_model(rm, &rt) || q3_ctx_new(rm, &co, &c)) {
                fprintf(stderr, "bench_embed: %s\n", q3_last_error());
                return 1;
            }
            int32_t **rids = calloc((size_t)n_docs, sizeof *rids);
            size_t *rl = calloc((size_t)n_docs, sizeof *rl);
            float *scores = calloc((size_t)n_docs, sizeof *scores);
            q3_rerank(c, rt, (const int32_t *const *)ids, lens, 2, NULL, scores, NULL); /* warm-up */
            double t1 = ts_now();
            for (int d = 0; d < n_docs; d++) q3_rerank_tokenize(rt, NULL, query, docs[d], &rids[d], &rl[d]);
            st = q3_rerank(c, rt, (const int32_t *const *)rids, rl, (size_t)n_docs, NULL, scores, NULL);
            row("q3 library (q3_rerank)", "rerank", st ? -1 : ts_now() - t1, n_docs, rerank_tokens);
            for (int d = 0; d < n_docs; d++) free(rids[d]);
            free(rids);
            free(rl);
            free(scores);
            q3_ctx_free(c);
            q3_tokenizer_free(rt);
            q3_model_close(rm);
        }
    }

    /* servers: q3 serve, then llama-server once per argument set */
    const char *build = getenv("BUILD") ? getenv("BUILD") : "build";
    char q3bin[256], tbuf[16], pbuf[16];
    snprintf(q3bin, sizeof q3bin, "%s/q3", build);
    snprintf(tbuf, sizeof tbuf, "%d", threads);
    for (int kind = 0; kind < 2; kind++) {
        const char *gguf = kind ? rerank_gguf : embed_gguf;
        if (!gguf) continue;
        int port = free_port();
        snprintf(pbuf, sizeof pbuf, "%d", port);
        char *qargv[] = {q3bin, "serve", "-m", (char *)gguf, "-t", tbuf, "--port", pbuf, "--ctx", "1024",
                         kind ? "--rerank" : "--embeddings", "--max-body", "67108864", NULL};
        pid_t pid = skip_q3_serve ? 0 : start_server(qargv, port, kind ? "/tmp/bench_embed_q3_rerank.log" : "/tmp/bench_embed_q3.log");
        if (skip_q3_serve) {
        } else if (pid < 0) {
            row("q3 serve", kind ? "rerank" : "embed", -1, 0, 0);
        } else {
            if (kind) {
                run_rerank(port, "/v1/rerank"); /* warm-up */
                row("q3 serve", "rerank", run_rerank(port, "/v1/rerank"), n_docs, rerank_tokens);
            } else {
                row("q3 serve", "embed", run_embed_load(port), n_inputs, total_tokens);
                double cq = 0;
                for (int i = 0; i < 4; i++) cq += cosine(first_vecs + (size_t)i * hidden, q3_first + (size_t)i * hidden, hidden);
                if (!skip_library) printf("|  | cosine(q3 serve, q3 library), first 4 inputs: %.6f | | | | |\n", cq / 4);
                memcpy(q3_first, first_vecs, 4 * (size_t)hidden * sizeof *q3_first);
            }
            stop_server(pid);
        }
        for (int a = 0; llama_server && a < n_llama_args; a++) {
            port = free_port();
            snprintf(pbuf, sizeof pbuf, "%d", port);
            char *largv[48], argcopy[512];
            int n = 0;
            largv[n++] = (char *)llama_server;
            largv[n++] = "-m";
            largv[n++] = (char *)gguf;
            largv[n++] = "-t";
            largv[n++] = tbuf;
            largv[n++] = "--port";
            largv[n++] = pbuf;
            if (kind) largv[n++] = "--reranking";
            else largv[n++] = "--embeddings", largv[n++] = "--pooling", largv[n++] = "last";
            snprintf(argcopy, sizeof argcopy, "%s", llama_args[a]);
            for (char *t = strtok(argcopy, " "); t && n < 46; t = strtok(NULL, " ")) largv[n++] = t;
            largv[n] = NULL;
            char label[160];
            snprintf(label, sizeof label, "llama-server %s", llama_args[a]);
            pid = start_server(largv, port, kind ? "/tmp/bench_embed_llama_rerank.log" : "/tmp/bench_embed_llama.log");
            if (pid < 0) {
                row(label, kind ? "rerank" : "embed", -1, 0, 0);
                continue;
            }
            if (kind) {
                run_rerank(port, "/v1/rerank");
                row(label, "rerank", run_rerank(port, "/v1/rerank"), n_docs, rerank_tokens);
            } else {
                memset(first_vecs, 0, 4 * (size_t)hidden * sizeof *first_vecs);
                row(label, "embed", run_embed_load(port), n_inputs, total_tokens);
                double cq = 0;
                for (int i = 0; i < 4; i++) cq += cosine(first_vecs + (size_t)i * hidden, q3_first + (size_t)i * hidden, hidden);
                printf("|  | cosine(llama.cpp, q3), first 4 inputs: %.6f | | | | |\n", cq / 4);
            }
            stop_server(pid);
        }
    }
    q3_tokenizer_free(tok);
    q3_model_close(m);
    return 0;
}
