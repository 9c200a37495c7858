/* HTTP with GNU libmicrohttpd: the route table, limits, API keys, and the
 * suspend/resume plumbing between connections and the engine. The only file
 * of src/server that includes microhttpd.h. */
#include "server.h"

#include <arpa/inet.h>
#include <microhttpd.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "embed_api.h"
#include "render.h"
#include "request.h"


struct srv_server {
    struct MHD_Daemon *d;
    int port;
    char *api_key;
    size_t max_body;
    srv_metrics metrics;
    srv_api api;
    srv_engine *eng;
    long long started;
    int ready, draining;   /* read with atomics */
    int in_flight;         /* connections holding a job */
};

typedef struct conn_ctx {
    srv_buf body;
    int too_big;
    srv_job *job;
} conn_ctx;

/* ---- answers ---------------------------------------------------------------- */

static enum MHD_Result respond(struct MHD_Connection *c, unsigned status, const char *type, const char *body, size_t len)
{
    struct MHD_Response *r = MHD_create_response_from_buffer(len, (void *)body, MHD_RESPMEM_MUST_COPY);
    if (!r) return MHD_NO;
    MHD_add_response_header(r, "Content-Type", type);
    enum MHD_Result ok = MHD_queue_response(c, status, r);
    MHD_destroy_response(r);
    return ok;
}

static enum MHD_Result respond_json(struct MHD_Connection *c, unsigned status, srv_buf *b)
{
    if (b->oom) {
        free(b->data);
        static const char oom[] = "{\"error\":{\"message\":\"out of memory\",\"type\":\"server_error\",\"param\":null,\"code\":500}}";
        return respond(c, 500, "application/json", oom, sizeof oom - 1);
    }
    enum MHD_Result ok = respond(c, status, "application/json", b->data ? b->data : "", b->len);
    free(b->data);
    return ok;
}

static enum MHD_Result respond_err(struct MHD_Connection *c, const srv_err *e)
{
    srv_buf b = {0};
    srv_err_json(e, &b);
    return respond_json(c, (unsigned)e->status, &b);
}

static enum MHD_Result fail(struct MHD_Connection *c, int status, const char *type, const char *code, const char *msg)
{
    srv_err e;
    srv_err_set(&e, status, type, code, NULL, "%s", msg);
    return respond_err(c, &e);
}

/* ---- streams ------------------------------------------------------------------ */

/* The engine's wake-up call (engine.h): the one place a job's connection is
 * resumed (caller holds j->mu). */
void srv_job_wake(srv_job *j)
{
    if (j->st.suspended && j->st.conn) {
        j->st.suspended = 0;
        MHD_resume_connection(j->st.conn);
    }
}

/* MHD asks for the next bytes of a stream. With none ready the connection is
 * suspended (no thread waits on it) until the engine resumes it. */
static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max)
{
    (void)pos;
    srv_job *j = cls;
    pthread_mutex_lock(&j->mu);
    if (j->res.state == SRV_JOB_FAILED) srv_render_failure(j); /* a failure after the stream began (once) */
    size_t avail = j->st.sse.len - j->st.sse_sent;
    if (avail) {
        size_t n = avail < max ? avail : max;
        memcpy(buf, j->st.sse.data + j->st.sse_sent, n);
        j->st.sse_sent += n;
        if (j->st.sse_sent == j->st.sse.len) j->st.sse.len = j->st.sse_sent = 0;
        pthread_mutex_unlock(&j->mu);
        return (ssize_t)n;
    }
    if (srv_job_ended(j->res.state) || j->st.sse.oom) {
        pthread_mutex_unlock(&j->mu);
        return MHD_CONTENT_READER_END_OF_STREAM;
    }
    j->st.suspended = 1;
    MHD_suspend_connection(j->st.conn);
    pthread_mutex_unlock(&j->mu);
    return 0;
}

static void stream_free(void *cls) { srv_job_unref(cls); }

/* ---- requests ------------------------------------------------------------------ */

static int authorized(srv_server *s, struct MHD_Connection *c)
{
    if (!s->api_key) return 1;
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
    if (!h || strncmp(h, "Bearer ", 7)) return 0;
    const char *k = h + 7;
    size_t a = strlen(k), b = strlen(s->api_key);
    unsigned diff = a != b;
    for (size_t i = 0; i < a && i < b; i++) diff |= (unsigned char)(k[i] ^ s->api_key[i]);
    return diff == 0;
}

/* Answers a job that ended (non-stream). */
static enum MHD_Result answer_job(struct MHD_Connection *c, srv_job *j)
{
    if (j->res.state == SRV_JOB_FAILED || j->res.state == SRV_JOB_GONE_QUEUED) {
        srv_err e;
        srv_job_err(j, &e);
        return respond_err(c, &e);
    }
    srv_buf b = {0};
    if (j->req.kind >= SRV_EMBED) srv_embed_response_json(j, &b);
    else srv_response_json(j, &b);
    return respond_json(c, 200, &b);
}

/* ---- handlers: one a route; the table below has already checked the method,
 * the key and, where the route needs it, readiness and the body's limits ---- */

typedef int (*parse_fn)(const srv_api *a, const char *body, size_t len, srv_job *j, srv_err *e);
typedef int (*answer_fn)(const srv_api *a, const char *body, size_t len, srv_buf *out, srv_err *e);

/* Parses the body into a job and submits it; a stream is answered as it comes,
 * otherwise the connection is suspended until the job ends. */
static enum MHD_Result start_job(srv_server *s, struct MHD_Connection *c, conn_ctx *cc, parse_fn parse)
{
    srv_job *j = srv_job_new();
    if (!j) return fail(c, 500, "server_error", NULL, "out of memory");
    srv_err e = {0};
    const char *body = cc->body.data ? cc->body.data : "";
    if (parse(&s->api, body, cc->body.len, j, &e)) {
        srv_job_unref(j);
        return respond_err(c, &e);
    }
    j->req.model_name = s->api.model_name;
    j->st.conn = c;
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    j->st.fd = ci ? ci->connect_fd : -1;
    j->req.t_submit = j->st.t_last_write = q3_now();
    if (j->req.stream) srv_stream_begin(j);
    if (srv_engine_submit(s->eng, j)) {
        srv_job_unref(j);
        return fail(c, 429, "server_error", "queue_full", "the server's queue is full; try again later");
    }
    cc->job = j;
    __atomic_add_fetch(&s->in_flight, 1, __ATOMIC_SEQ_CST);
    if (j->req.stream) {
        struct MHD_Response *r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, stream_read, j, stream_free);
        if (!r) return MHD_NO;
        srv_job_ref(j);
        MHD_add_response_header(r, "Content-Type", "text/event-stream");
        MHD_add_response_header(r, "Cache-Control", "no-cache");
        enum MHD_Result ok = MHD_queue_response(c, 200, r);
        MHD_destroy_response(r);
        return ok;
    }
    pthread_mutex_lock(&j->mu);
    if (srv_job_ended(j->res.state)) {
        pthread_mutex_unlock(&j->mu);
        return answer_job(c, j);
    }
    j->st.suspended = 1;
    MHD_suspend_connection(c);
    pthread_mutex_unlock(&j->mu);
    return MHD_YES;
}

/* A body in, a JSON answer out, on the HTTP thread. */
static enum MHD_Result answer_body(srv_server *s, struct MHD_Connection *c, conn_ctx *cc, answer_fn answer)
{
    srv_buf b = {0};
    srv_err e = {0};
    const char *body = cc->body.data ? cc->body.data : "";
    if (answer(&s->api, body, cc->body.len, &b, &e)) {
        free(b.data);
        return respond_err(c, &e);
    }
    return respond_json(c, 200, &b);
}

/* Whether the server takes requests now; otherwise *out is the 503 answer. */
static int ready(srv_server *s, struct MHD_Connection *c, enum MHD_Result *out)
{
    if (!__atomic_load_n(&s->ready, __ATOMIC_ACQUIRE)) {
        *out = fail(c, 503, "server_error", "loading", "the model is loading");
        return 0;
    }
    if (__atomic_load_n(&s->draining, __ATOMIC_ACQUIRE)) {
        *out = fail(c, 503, "server_error", "draining", "the server is shutting down");
        return 0;
    }
    return 1;
}

/* 200 when ready, 503 while loading or draining; never waits on inference. */
static enum MHD_Result h_health(srv_server *s, struct MHD_Connection *c, conn_ctx *cc)
{
    enum MHD_Result out;
    if (!ready(s, c, &out)) return out;
    return respond(c, 200, "application/json", "{}", 2);
}

static enum MHD_Result h_metrics(srv_server *s, struct MHD_Connection *c, conn_ctx *cc)
{
    srv_buf b = {0};
    srv_metrics_render(&s->metrics, s->api.model_name ? s->api.model_name : "", &b);
    if (b.oom) { free(b.data); return fail(c, 500, "server_error", NULL, "out of memory"); }
    enum MHD_Result ok = respond(c, 200, "text/plain; version=0.0.4; charset=utf-8", b.data ? b.data : "", b.len);
    free(b.data);
    return ok;
}

static enum MHD_Result h_models(srv_server *s, struct MHD_Connection *c, conn_ctx *cc)
{
    srv_buf b = {0};
    srv_models_json(&s->api, s->started, &b);
    return respond_json(c, 200, &b);
}

/* An embedding model or a reranker does not chat: 400 saying which endpoint it serves. */
static int refuse_task(srv_server *s, struct MHD_Connection *c, enum MHD_Result *out)
{
    srv_err e = {0};
    if (!srv_check_generate(&s->api, &e)) return 0;
    *out = respond_err(c, &e);
    return 1;
}

static enum MHD_Result h_chat(srv_server *s, struct MHD_Connection *c, conn_ctx *cc)
{
    enum MHD_Result out;
    return refuse_task(s, c, &out) ? out : start_job(s, c, cc, srv_parse_chat);
}
static enum MHD_Result h_completions(srv_server *s, struct MHD_Connection *c, conn_ctx *cc)
{
    enum MHD_Result out;
    return refuse_task(s, c, &out) ? out : start_job(s, c, cc, srv_parse_completion);
}
static enum MHD_Result h_embeddings(srv_server *s, struct MHD_Connection *c, conn_ctx *cc) { return start_job(s, c, cc, srv_parse_embeddings); }
static enum MHD_Result h_rerank(srv_server *s, struct MHD_Connection *c, conn_ctx *cc) { return start_job(s, c, cc, srv_parse_rerank); }
static enum MHD_Result h_tokenize(srv_server *s, struct MHD_Connection *c, conn_ctx *cc) { return answer_body(s, c, cc, srv_tokenize); }
static enum MHD_Result h_detokenize(srv_server *s, struct MHD_Connection *c, conn_ctx *cc) { return answer_body(s, c, cc, srv_detokenize); }

/* ---- routes ---------------------------------------------------------------------- */

typedef struct route {
    const char *method, *path;
    enum MHD_Result (*handler)(srv_server *s, struct MHD_Connection *c, conn_ctx *cc);
    int needs_auth;   /* the API key, when the server has one (401) */
    int needs_ready;  /* 503 while loading or draining; the body's limits checked (413) */
} route;

/* Every route the server answers. A path not here is 404; a path here with
 * another method is 405 with Allow listing the path's methods. The checks run
 * in this order: path, key (of any route on the path), method, readiness, body. */
static const route ROUTES[] = {
    {"GET", "/health", h_health, 0, 0},
    {"GET", "/metrics", h_metrics, 0, 0},
    {"GET", "/v1/models", h_models, 1, 1},
    {"POST", "/v1/chat/completions", h_chat, 1, 1},
    {"POST", "/v1/completions", h_completions, 1, 1},
    {"POST", "/tokenize", h_tokenize, 1, 1},
    {"POST", "/detokenize", h_detokenize, 1, 1},
    {"POST", "/v1/embeddings", h_embeddings, 1, 1},
    {"POST", "/v1/rerank", h_rerank, 1, 1},
    {"POST", "/rerank", h_rerank, 1, 1},
};

/* 405: the path's methods in Allow and in the message. */
static enum MHD_Result not_allowed(struct MHD_Connection *c, const char *allow, const char *path)
{
    srv_err e;
    srv_err_set(&e, 405, "invalid_request_error", NULL, NULL, "use %s %s", allow, path);
    srv_buf b = {0};
    srv_err_json(&e, &b);
    if (b.oom) return respond_json(c, 405, &b); /* answers 500 */
    struct MHD_Response *r = MHD_create_response_from_buffer(b.len, b.data, MHD_RESPMEM_MUST_COPY);
    free(b.data);
    if (!r) return MHD_NO;
    MHD_add_response_header(r, "Content-Type", "application/json");
    MHD_add_response_header(r, "Allow", allow);
    enum MHD_Result ok = MHD_queue_response(c, 405, r);
    MHD_destroy_response(r);
    return ok;
}

static enum MHD_Result dispatch(srv_server *s, struct MHD_Connection *c, conn_ctx *cc, const char *url, const char *method)
{
    const route *rt = NULL;
    int on_path = 0, auth = 0;
    char allow[64] = "";
    for (size_t i = 0; i < sizeof ROUTES / sizeof *ROUTES; i++) {
        const route *r = &ROUTES[i];
        if (strcmp(url, r->path)) continue;
        size_t n = strlen(allow);
        snprintf(allow + n, sizeof allow - n, "%s%s", on_path ? ", " : "", r->method);
        on_path = 1;
        auth |= r->needs_auth;
        if (!strcmp(method, r->method)) rt = r;
    }
    if (!on_path) {
        char msg[160];
        snprintf(msg, sizeof msg, "no route %.100s", url);
        return fail(c, 404, "invalid_request_error", "not_found", msg);
    }
    if (auth && !authorized(s, c))
        return fail(c, 401, "invalid_request_error", "invalid_api_key", "a missing or wrong API key (Authorization: Bearer KEY)");
    if (!rt) return not_allowed(c, allow, url);
    if (rt->needs_ready) {
        enum MHD_Result out;
        if (!ready(s, c, &out)) return out;
        if (cc->too_big) {
            char msg[96];
            snprintf(msg, sizeof msg, "the request body is larger than %zu bytes", s->max_body);
            return fail(c, 413, "invalid_request_error", "body_too_large", msg);
        }
        if (cc->body.oom) return fail(c, 500, "server_error", NULL, "out of memory");
    }
    return rt->handler(s, c, cc);
}

static enum MHD_Result handle(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                              const char *version, const char *upload, size_t *upload_size, void **con_cls)
{
    (void)version;
    srv_server *s = cls;
    conn_ctx *cc = *con_cls;
    if (!cc) { /* headers are in; the body (if any) comes next */
        cc = calloc(1, sizeof *cc);
        if (!cc) return MHD_NO;
        *con_cls = cc;
        const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Length");
        if (cl && strtoull(cl, NULL, 10) > s->max_body) cc->too_big = 1;
        return MHD_YES;
    }
    if (*upload_size) {
        if (!cc->too_big && cc->body.len + *upload_size > s->max_body) cc->too_big = 1;
        if (!cc->too_big) srv_buf_put(&cc->body, upload, *upload_size);
        *upload_size = 0;
        return MHD_YES;
    }
    if (cc->job) { /* resumed: the engine finished a non-stream job */
        srv_job *j = cc->job;
        pthread_mutex_lock(&j->mu);
        if (!srv_job_ended(j->res.state)) { /* a spurious wake */
            j->st.suspended = 1;
            MHD_suspend_connection(c);
            pthread_mutex_unlock(&j->mu);
            return MHD_YES;
        }
        pthread_mutex_unlock(&j->mu);
        return answer_job(c, j);
    }
    return dispatch(s, c, cc, url, method);
}

static void completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode toe)
{
    (void)c;
    (void)toe;
    srv_server *s = cls;
    conn_ctx *cc = *con_cls;
    if (!cc) return;
    if (cc->job) {
        srv_job *j = cc->job;
        pthread_mutex_lock(&j->mu);
        j->st.conn = NULL;
        j->st.fd = -1;
        j->st.suspended = 0;
        if (!srv_job_ended(j->res.state)) j->st.cancelled = 1;
        pthread_mutex_unlock(&j->mu);
        srv_job_unref(j);
        __atomic_sub_fetch(&s->in_flight, 1, __ATOMIC_SEQ_CST);
    }
    free(cc->body.data);
    free(cc);
    *con_cls = NULL;
}

/* ---- life cycle ------------------------------------------------------------------ */

q3_status srv_server_start(const srv_server_opts *o, srv_server **out)
{
    *out = NULL;
    const char *host = o->host ? o->host : "127.0.0.1";
    if (o->port < 0 || o->port > 65535) return q3_fail(Q3_ERR_INVALID, "port %d is outside 0..65535", o->port);
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE | AI_NUMERICSERV}, *ai;
    char port[16];
    snprintf(port, sizeof port, "%d", o->port);
    int gai = getaddrinfo(host, port, &hints, &ai);
    if (gai) return q3_fail(Q3_ERR_INVALID, "cannot resolve the address '%s': %s", host, gai_strerror(gai));
    srv_server *s = calloc(1, sizeof *s);
    if (!s) { freeaddrinfo(ai); return q3_fail(Q3_ERR_NOMEM, "out of memory"); }
    srv_metrics_init(&s->metrics);
    s->max_body = o->max_body ? o->max_body : (size_t)8 << 20;
    s->api_key = o->api_key ? strdup(o->api_key) : NULL;
    s->started = (long long)time(NULL);
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_EPOLL_LINUX_ONLY | MHD_ALLOW_SUSPEND_RESUME;
    if (ai->ai_family == AF_INET6) flags |= MHD_USE_IPv6;
    s->d = MHD_start_daemon(flags, 0, NULL, NULL, handle, s,
                            MHD_OPTION_SOCK_ADDR, ai->ai_addr,
                            MHD_OPTION_THREAD_POOL_SIZE, (unsigned)(o->http_threads > 0 ? o->http_threads : 4),
                            MHD_OPTION_CONNECTION_LIMIT, (unsigned)(o->max_connections > 0 ? o->max_connections : 256),
                            MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)(o->timeout_s > 0 ? o->timeout_s : 60),
                            MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)(o->max_header ? o->max_header : 32768),
                            MHD_OPTION_NOTIFY_COMPLETED, completed, s,
                            MHD_OPTION_END);
    freeaddrinfo(ai);
    if (!s->d) {
        srv_server_free(s);
        return q3_fail(Q3_ERR_IO, "cannot listen on %s:%d (in use, or not an address of this machine)", host, o->port);
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(s->d, MHD_DAEMON_INFO_BIND_PORT);
    s->port = di ? di->port : o->port;
    return *out = s, Q3_OK;
}

int srv_server_port(const srv_server *s) { return s->port; }
srv_metrics *srv_server_metrics(srv_server *s) { return &s->metrics; }

void srv_server_ready(srv_server *s, const q3_tokenizer *tok, const char *model_name, int n_ctx, int vocab, srv_engine *eng)
{
    s->api.tok = tok;
    s->api.model_name = model_name;
    s->api.n_ctx = n_ctx;
    s->api.vocab = vocab;
    s->eng = eng;
    __atomic_store_n(&s->ready, 1, __ATOMIC_RELEASE);
}

void srv_server_set_task(srv_server *s, q3_task task, int hidden)
{
    s->api.task = task;
    s->api.hidden = hidden;
}

void srv_server_refuse(srv_server *s) { __atomic_store_n(&s->draining, 1, __ATOMIC_RELEASE); }

int srv_server_drain(srv_server *s, double timeout_s)
{
    __atomic_store_n(&s->draining, 1, __ATOMIC_RELEASE);
    double t0 = q3_now();
    for (;;) {
        int left = __atomic_load_n(&s->in_flight, __ATOMIC_SEQ_CST) + (s->eng ? srv_engine_busy(s->eng) : 0);
        if (!left || q3_now() - t0 > timeout_s) return left;
        usleep(20000);
    }
}

void srv_server_free(srv_server *s)
{
    if (!s) return;
    srv_engine_free(s->eng); /* wakes every waiting connection with its answer */
    s->eng = NULL;
    if (s->d) MHD_stop_daemon(s->d);
    srv_metrics_destroy(&s->metrics);
    free(s->api_key);
    free(s);
}
