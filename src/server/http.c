/* HTTP with GNU libmicrohttpd: the route table, the checks made on a
 * request's headers before its body, limits and deadlines (a reaper thread
 * ends connections that trickle), API keys, the admin listener, and the
 * suspend/resume plumbing between connections and the engine. The only file
 * of src/server that includes microhttpd.h. */
#include "server.h"

#include <arpa/inet.h>
#include <cjson/cJSON.h>
#include <microhttpd.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "embed_api.h"
#include "render.h"
#include "request.h"


/* Where a connection is, for the deadlines: reading a request's headers (or
 * waiting for the next request of a kept-alive connection), reading its body,
 * or answering (no deadline: a generation takes as long as it takes). */
typedef enum conn_phase { PHASE_HEADERS, PHASE_BODY, PHASE_ANSWER } conn_phase;

/* One open connection, from accept to close (MHD's socket context). */
typedef struct conn_watch {
    struct conn_watch *prev, *next;
    int fd;                /* a dup of the socket: shutdown() through it ends the connection, and the number stays ours */
    conn_phase phase;
    double since;          /* q3_now() when the phase began */
    int cut;               /* the reaper shut it down */
    int nul_in_url;        /* the URL held %00 (kept undecoded by unescape()) */
    int admin;             /* on the admin listener */
    srv_server *s;
    unsigned status;       /* of the answer queued last, for the access log */
} conn_watch;

/* A listener as its connection callbacks see it (set before the daemon starts). */
typedef struct listener {
    struct srv_server *s;
    int admin;             /* the admin listener: /health and /metrics only */
} listener;

struct srv_server {
    struct MHD_Daemon *d, *admin;
    listener main_l, admin_l;
    int port, admin_port;
    char *api_key;
    size_t max_body;
    double header_timeout, body_timeout;
    srv_metrics metrics;
    srv_api api;
    srv_engine *eng;
    char *cors_origin;     /* NULL: no CORS */
    int access_log, n_parallel;
    long long started;
    int ready, draining;   /* read with atomics */
    int in_flight;         /* connections holding a job */
    /* the deadlines: every open connection, and the thread that ends the late ones */
    pthread_mutex_t watch_mu;
    pthread_cond_t watch_cv;
    conn_watch *watched;
    int reaper_stop, reaper_started;
    pthread_t reaper;
};

typedef struct route route;

typedef struct conn_ctx {
    const route *rt;       /* the route the headers asked for (checked before any body byte is read) */
    int answered;          /* a response was queued on the headers alone */
    srv_buf body;
    srv_job *job;
    char method[8];  /* for the access log */
    char *path;      /* the request's path (malloc'd; NULL when out of memory) */
    double t0;
} conn_ctx;

/* A connection's socket context (MHD_OPTION_NOTIFY_CONNECTION, notify_conn):
 * its deadlines' state, its server, the status of the answer queued last (for
 * the access log). NULL when it could not be allocated. */
static conn_watch *watch_of(struct MHD_Connection *c)
{
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    return ci ? ci->socket_context : NULL;
}

/* Every answer goes out here: the CORS header when the server has an origin,
 * the status kept for the access log. */
static enum MHD_Result queue(struct MHD_Connection *c, unsigned status, struct MHD_Response *r)
{
    conn_watch *cs = watch_of(c);
    if (cs) {
        cs->status = status;
        if (cs->s->cors_origin) MHD_add_response_header(r, "Access-Control-Allow-Origin", cs->s->cors_origin);
    }
    return MHD_queue_response(c, status, r);
}

/* ---- answers ---------------------------------------------------------------- */

/* An answer; hdr/val: one more header (NULL: none). */
static enum MHD_Result respond_h(struct MHD_Connection *c, unsigned status, const char *type, const char *body, size_t len,
                                 const char *hdr, const char *val)
{
    struct MHD_Response *r = MHD_create_response_from_buffer(len, (void *)body, MHD_RESPMEM_MUST_COPY);
    if (!r) return MHD_NO;
    MHD_add_response_header(r, "Content-Type", type);
    if (hdr) MHD_add_response_header(r, hdr, val);
    enum MHD_Result ok = queue(c, status, r);
    MHD_destroy_response(r);
    return ok;
}

static enum MHD_Result respond(struct MHD_Connection *c, unsigned status, const char *type, const char *body, size_t len)
{
    return respond_h(c, status, type, body, len, NULL, NULL);
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

/* 429: the queue is full; Retry-After tells clients and routers when to come back. */
static enum MHD_Result too_many(srv_server *s, struct MHD_Connection *c)
{
    srv_metrics_rejected(&s->metrics);
    srv_err e;
    srv_err_set(&e, 429, "rate_limit_exceeded", "queue_full", NULL, "the server's queue is full; try again later");
    srv_buf b = {0};
    srv_err_json(&e, &b);
    if (b.oom) return respond_json(c, 429, &b); /* answers 500 */
    enum MHD_Result ok = respond_h(c, 429, "application/json", b.data, b.len, "Retry-After", "1");
    free(b.data);
    return ok;
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
    /* the scheme is case-insensitive (RFC 9110, 11.1), then one or more spaces */
    if (!h || strncasecmp(h, "Bearer", 6) || (h[6] != ' ' && h[6] != '\t')) return 0;
    const char *k = h + 6;
    while (*k == ' ' || *k == '\t') k++;
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
        return too_many(s, c);
    }
    cc->job = j;
    __atomic_add_fetch(&s->in_flight, 1, __ATOMIC_SEQ_CST);
    if (j->req.stream) {
        struct MHD_Response *r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, stream_read, j, stream_free);
        if (!r) return MHD_NO;
        srv_job_ref(j);
        MHD_add_response_header(r, "Content-Type", "text/event-stream");
        MHD_add_response_header(r, "Cache-Control", "no-cache");
        enum MHD_Result ok = queue(c, 200, r);
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
    static const char ok[] = "{\"status\":\"ok\"}"; /* llama-server's body */
    return respond(c, 200, "application/json", ok, sizeof ok - 1);
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

/* GET /v1/models/{id}: the served model, or 404 as OpenAI answers an unknown one. */
static enum MHD_Result h_model(srv_server *s, struct MHD_Connection *c, conn_ctx *cc)
{
    const char *id = cc->path ? cc->path + strlen("/v1/models/") : "";
    if (strcmp(id, s->api.model_name)) {
        srv_err e;
        srv_err_set(&e, 404, "invalid_request_error", "model_not_found", "model", "The model `%.60s` does not exist (this server runs `%.60s`).",
                    id, s->api.model_name);
        return respond_err(c, &e);
    }
    srv_buf b = {0};
    srv_model_json(&s->api, s->started, &b);
    return respond_json(c, 200, &b);
}

static enum MHD_Result h_props(srv_server *s, struct MHD_Connection *c, conn_ctx *cc);

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
static enum MHD_Result h_completion(srv_server *s, struct MHD_Connection *c, conn_ctx *cc)
{
    enum MHD_Result out;
    return refuse_task(s, c, &out) ? out : start_job(s, c, cc, srv_parse_llama_completion);
}
static enum MHD_Result h_tokenize(srv_server *s, struct MHD_Connection *c, conn_ctx *cc) { return answer_body(s, c, cc, srv_tokenize); }
static enum MHD_Result h_detokenize(srv_server *s, struct MHD_Connection *c, conn_ctx *cc) { return answer_body(s, c, cc, srv_detokenize); }

/* ---- routes ---------------------------------------------------------------------- */

struct route {
    const char *method, *path;
    enum MHD_Result (*handler)(srv_server *s, struct MHD_Connection *c, conn_ctx *cc);
    int needs_auth;   /* the API key, when the server has one (401) */
    int needs_ready;  /* 503 while loading or draining; the body's limits checked (413) */
};

/* Every route the server answers. A path not here is 404; a path here with
 * another method is 405 with Allow listing the path's methods; a path ending in
 * '*' takes every longer path that starts with the rest. The checks run on the
 * headers alone, before any byte of the body is read, in this order: path, key
 * (of any route on the path), method, readiness, declared length. */
static const route ROUTES[] = {
    {"GET", "/health", h_health, 0, 0},
    {"HEAD", "/health", h_health, 0, 0},
    {"GET", "/metrics", h_metrics, 0, 0},
    {"GET", "/v1/models", h_models, 1, 1},
    {"POST", "/v1/chat/completions", h_chat, 1, 1},
    {"POST", "/v1/completions", h_completions, 1, 1},
    {"POST", "/tokenize", h_tokenize, 1, 1},
    {"POST", "/detokenize", h_detokenize, 1, 1},
    /* what llama-server and OpenAI clients also ask for */
    {"GET", "/v1/models/*", h_model, 1, 1},
    {"GET", "/models", h_models, 1, 1},
    {"POST", "/chat/completions", h_chat, 1, 1},
    {"POST", "/completions", h_completions, 1, 1},
    {"POST", "/completion", h_completion, 1, 1},
    {"GET", "/props", h_props, 1, 1},
    {"POST", "/v1/embeddings", h_embeddings, 1, 1},
    {"POST", "/v1/rerank", h_rerank, 1, 1},
    {"POST", "/rerank", h_rerank, 1, 1},
};

/* The routes the admin listener (--admin-port) answers: nothing that parses a body or waits on the engine. */
static int admin_route(const route *r) { return r->handler == h_health || r->handler == h_metrics; }

static int path_matches(const char *url, const char *path)
{
    size_t n = strlen(path);
    if (n && path[n - 1] == '*') return !strncmp(url, path, n - 1) && url[n - 1];
    return !strcmp(url, path);
}

/* GET /props: llama-server's fields (default_generation_settings.n_ctx,
 * total_slots, chat_template, modalities, build_info) and what this server
 * answers: its routes, and the structured output it follows. */
static enum MHD_Result h_props(srv_server *s, struct MHD_Connection *c, conn_ctx *cc)
{
    cJSON *r = cJSON_CreateObject();
    cJSON_AddStringToObject(r, "model", s->api.model_name);
    cJSON_AddStringToObject(r, "model_alias", s->api.model_name);
    cJSON_AddNumberToObject(r, "n_ctx", s->api.n_ctx);
    cJSON_AddNumberToObject(cJSON_AddObjectToObject(r, "default_generation_settings"), "n_ctx", s->api.n_ctx);
    cJSON_AddNumberToObject(r, "total_slots", s->n_parallel);
    cJSON_AddStringToObject(r, "chat_template", "qwen3 (Qwen3's template, rendered by q3 in C)");
    cJSON *mod = cJSON_AddObjectToObject(r, "modalities");
    cJSON_AddBoolToObject(mod, "vision", 0);
    cJSON_AddBoolToObject(mod, "audio", 0);
    char build[64];
    snprintf(build, sizeof build, "q3 %s", q3_version());
    cJSON_AddStringToObject(r, "build_info", build);
    if (s->api.task == Q3_TASK_GENERATE) cJSON_AddItemToObject(r, "structured_output", srv_structured_output_json());
    cJSON *routes = cJSON_AddArrayToObject(r, "endpoints");
    for (size_t i = 0; i < sizeof ROUTES / sizeof *ROUTES; i++) {
        char line[96];
        snprintf(line, sizeof line, "%s %s", ROUTES[i].method, ROUTES[i].path);
        cJSON_AddItemToArray(routes, cJSON_CreateString(line));
    }
    srv_buf b = {0};
    srv_put_json(&b, r);
    cJSON_Delete(r);
    return respond_json(c, 200, &b);
}

/* 405: the path's methods in Allow and in the message. */
static enum MHD_Result not_allowed(struct MHD_Connection *c, const char *allow, const char *path)
{
    srv_err e;
    srv_err_set(&e, 405, "invalid_request_error", NULL, NULL, "use %s %s", allow, path);
    srv_buf b = {0};
    srv_err_json(&e, &b);
    if (b.oom) return respond_json(c, 405, &b); /* answers 500 */
    enum MHD_Result ok = respond_h(c, 405, "application/json", b.data, b.len, "Allow", allow);
    free(b.data);
    return ok;
}

/* 204 to a CORS preflight on a known path: its methods, the headers a client sends. */
static enum MHD_Result preflight(struct MHD_Connection *c, const char *allow)
{
    struct MHD_Response *r = MHD_create_response_from_buffer(0, (void *)"", MHD_RESPMEM_PERSISTENT);
    if (!r) return MHD_NO;
    char methods[80];
    snprintf(methods, sizeof methods, "%s, OPTIONS", allow);
    MHD_add_response_header(r, "Access-Control-Allow-Methods", methods);
    MHD_add_response_header(r, "Access-Control-Allow-Headers", "Authorization, Content-Type");
    MHD_add_response_header(r, "Access-Control-Max-Age", "86400");
    enum MHD_Result ok = queue(c, 204, r);
    MHD_destroy_response(r);
    return ok;
}

/* ---- connections: deadlines and framing checks ---------------------------------- */

static void watch_phase(srv_server *s, struct MHD_Connection *c, conn_phase p)
{
    conn_watch *w = watch_of(c);
    if (!w) return;
    pthread_mutex_lock(&s->watch_mu);
    w->phase = p;
    w->since = q3_now();
    pthread_mutex_unlock(&s->watch_mu);
}

/* MHD: a connection opened or closed (both listeners). */
static void notify_conn(void *cls, struct MHD_Connection *c, void **socket_context, enum MHD_ConnectionNotificationCode code)
{
    const listener *l = cls;
    srv_server *s = l->s;
    if (code == MHD_CONNECTION_NOTIFY_STARTED) {
        conn_watch *w = calloc(1, sizeof *w);
        if (!w) return; /* not watched: only MHD's idle timeout ends it */
        const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
        w->fd = ci ? dup(ci->connect_fd) : -1;
        w->admin = l->admin;
        w->s = s;
        w->phase = PHASE_HEADERS;
        w->since = q3_now();
        pthread_mutex_lock(&s->watch_mu);
        w->next = s->watched;
        if (s->watched) s->watched->prev = w;
        s->watched = w;
        pthread_mutex_unlock(&s->watch_mu);
        *socket_context = w;
    } else if (code == MHD_CONNECTION_NOTIFY_CLOSED) {
        conn_watch *w = *socket_context;
        if (!w) return;
        pthread_mutex_lock(&s->watch_mu);
        if (w->prev) w->prev->next = w->next;
        else s->watched = w->next;
        if (w->next) w->next->prev = w->prev;
        pthread_mutex_unlock(&s->watch_mu);
        if (w->fd >= 0) close(w->fd);
        free(w);
        *socket_context = NULL;
    }
}

/* The reaper: a connection still reading its headers header_timeout after it
 * began (or after its last answer), or its body body_timeout after its
 * headers, is shut down, however many bytes it trickles (MHD's own timeout
 * only measures idleness). */
static void *reaper_main(void *arg)
{
    srv_server *s = arg;
    pthread_mutex_lock(&s->watch_mu);
    while (!s->reaper_stop) {
        double now = q3_now();
        int open = 0;
        for (conn_watch *w = s->watched; w; w = w->next) {
            double limit = w->phase == PHASE_HEADERS ? s->header_timeout : w->phase == PHASE_BODY ? s->body_timeout : 0;
            if (limit > 0 && !w->cut && w->fd >= 0 && now - w->since > limit) {
                shutdown(w->fd, SHUT_RDWR);
                w->cut = 1;
            }
            open += !w->admin;
        }
        srv_metrics_connections(&s->metrics, open);
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 100 * 1000000L;
        if (ts.tv_nsec >= 1000000000L) { ts.tv_sec++; ts.tv_nsec -= 1000000000L; }
        pthread_cond_timedwait(&s->watch_cv, &s->watch_mu, &ts);
    }
    pthread_mutex_unlock(&s->watch_mu);
    return NULL;
}

static int hexval(char ch) { return ch >= '0' && ch <= '9' ? ch - '0' : (ch | 32) >= 'a' && (ch | 32) <= 'f' ? (ch | 32) - 'a' + 10 : -1; }

/* MHD's unescaper, in place, but %00 stays as it is and marks the connection:
 * a NUL would cut the path short ("/health%00/../x" read as "/health"). */
static size_t unescape(void *cls, struct MHD_Connection *c, char *str)
{
    (void)cls;
    char *w = str;
    for (const char *r = str; *r;) {
        int hi = r[0] == '%' ? hexval(r[1]) : -1, lo = hi >= 0 ? hexval(r[2]) : -1;
        if (hi < 0 || lo < 0) { *w++ = *r++; continue; }
        if (hi == 0 && lo == 0) {
            conn_watch *cw = watch_of(c);
            if (cw) cw->nul_in_url = 1;
            memmove(w, r, 3);
            w += 3;
        } else {
            *w++ = (char)(hi * 16 + lo);
        }
        r += 3;
    }
    *w = 0;
    return (size_t)(w - str);
}

typedef struct framing {
    int n_cl;            /* Content-Length headers */
    int cl_differ;       /* two of them disagree */
    int cl_bad;          /* one is not a decimal number */
    unsigned long long cl;
    const char *te;      /* Transfer-Encoding */
} framing;

static enum MHD_Result framing_header(void *cls, enum MHD_ValueKind kind, const char *key, const char *value)
{
    (void)kind;
    framing *f = cls;
    if (!strcasecmp(key, "Content-Length")) {
        const char *v = value ? value : "";
        char *end;
        unsigned long long n = strtoull(v, &end, 10);
        if (!*v || *end || *v == '-' || *v == '+') f->cl_bad = 1;
        if (f->n_cl++ && n != f->cl) f->cl_differ = 1;
        f->cl = n;
    } else if (!strcasecmp(key, "Transfer-Encoding")) {
        f->te = value ? value : "";
    }
    return MHD_YES;
}

/* Checks a request on its headers alone, before any body byte is read (and
 * before MHD answers `Expect: 100-continue`): framing, path, key, method,
 * readiness, declared length. 0 with cc->rt set, or 1 with the error answer
 * queued in *out (MHD then reads no body and closes the connection). */
static int check_headers(srv_server *s, struct MHD_Connection *c, conn_ctx *cc, const char *url, const char *method,
                         enum MHD_Result *out)
{
    conn_watch *w = watch_of(c);
    if (w && w->nul_in_url) {
        *out = fail(c, 400, "invalid_request_error", NULL, "the path holds a percent-encoded NUL (%00)");
        return 1;
    }
    framing f = {0};
    MHD_get_connection_values(c, MHD_HEADER_KIND, framing_header, &f);
    if (f.te && strcasecmp(f.te, "chunked")) {
        *out = fail(c, 501, "invalid_request_error", NULL, "Transfer-Encoding other than chunked is not supported");
        return 1;
    }
    if (f.cl_bad || f.cl_differ || (f.n_cl && f.te)) {
        *out = fail(c, 400, "invalid_request_error", NULL,
                    f.cl_bad ? "Content-Length is not a decimal number"
                    : f.cl_differ ? "two Content-Length headers disagree"
                                  : "both Content-Length and Transfer-Encoding (RFC 9112 6.3)");
        return 1;
    }
    int admin = w && w->admin;
    const route *rt = NULL;
    int on_path = 0, auth = 0;
    char allow[64] = "";
    for (size_t i = 0; i < sizeof ROUTES / sizeof *ROUTES; i++) {
        const route *r = &ROUTES[i];
        if (!path_matches(url, r->path) || (admin && !admin_route(r))) continue;
        size_t n = strlen(allow);
        snprintf(allow + n, sizeof allow - n, "%s%s", on_path ? ", " : "", r->method);
        on_path = 1;
        auth |= r->needs_auth;
        if (!strcmp(method, r->method)) rt = r;
    }
    if (!on_path) {
        srv_err e;
        srv_err_set(&e, 404, "invalid_request_error", "not_found", NULL, "no route %.100s", url);
        *out = respond_err(c, &e);
        return 1;
    }
    if (s->cors_origin && !strcmp(method, "OPTIONS")) { /* a browser's preflight: no credentials, no body */
        *out = preflight(c, allow);
        return 1;
    }
    if (auth && !authorized(s, c)) {
        *out = fail(c, 401, "invalid_request_error", "invalid_api_key", "a missing or wrong API key (Authorization: Bearer KEY)");
        return 1;
    }
    if (!rt) {
        *out = not_allowed(c, allow, url);
        return 1;
    }
    if (rt->needs_ready) {
        if (!ready(s, c, out)) return 1;
        if (f.n_cl && f.cl > s->max_body) {
            char msg[96];
            snprintf(msg, sizeof msg, "the request body is larger than %zu bytes", s->max_body);
            *out = fail(c, 413, "invalid_request_error", "body_too_large", msg);
            return 1;
        }
    }
    cc->rt = rt;
    return 0;
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
        snprintf(cc->method, sizeof cc->method, "%s", method);
        cc->path = strdup(url);
        cc->t0 = q3_now();
        conn_watch *cs = watch_of(c);
        if (cs) cs->status = 0;
        watch_phase(s, c, PHASE_BODY);
        enum MHD_Result out;
        if (check_headers(s, c, cc, url, method, &out)) {
            cc->answered = 1;
            return out;
        }
        return MHD_YES;
    }
    if (cc->answered) { *upload_size = 0; return MHD_YES; }
    if (*upload_size) {
        if (cc->body.len + *upload_size > s->max_body) return MHD_NO; /* a chunked body past the limit: closed */
        srv_buf_put(&cc->body, upload, *upload_size);
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
    watch_phase(s, c, PHASE_ANSWER);
    if (cc->rt->needs_ready) {
        enum MHD_Result out;
        if (!ready(s, c, &out)) return out;
        if (cc->body.oom) return fail(c, 500, "server_error", NULL, "out of memory");
    }
    return cc->rt->handler(s, c, cc);
}

/* One line a request on stderr (--log-format): method, path, status, tokens
 * (prompt + completion, for a generation) and milliseconds from the headers to
 * the last byte. A path is printed only up to a byte that needs escaping. */
static void access_log(srv_server *s, struct MHD_Connection *c, const conn_ctx *cc, enum MHD_RequestTerminationCode toe)
{
    if (s->access_log == SRV_LOG_NONE) return;
    conn_watch *cs = watch_of(c);
    unsigned status = cs ? cs->status : 0;
    int prompt = -1, completion = -1;
    if (cc->job) {
        pthread_mutex_lock(&cc->job->mu);
        prompt = cc->job->req.n_prompt;
        completion = cc->job->res.n_completion;
        pthread_mutex_unlock(&cc->job->mu);
    }
    char path[96];
    size_t n = 0;
    const char *p = cc->path ? cc->path : "";
    for (; n < sizeof path - 1 && p[n] && (unsigned char)p[n] > 0x20 && p[n] < 0x7f && p[n] != '"' && p[n] != '\\'; n++)
        path[n] = p[n];
    path[n] = 0;
    double ms = 1e3 * (q3_now() - cc->t0);
    const char *end = toe == MHD_REQUEST_TERMINATED_COMPLETED_OK ? "" : " (the client went away)";
    char line[320];
    char tokens[64] = "";
    if (prompt >= 0) snprintf(tokens, sizeof tokens, ",\"prompt_tokens\":%d,\"completion_tokens\":%d", prompt, completion);
    if (s->access_log == SRV_LOG_JSON)
        snprintf(line, sizeof line, "{\"method\":\"%s\",\"path\":\"%s\",\"status\":%u%s,\"ms\":%.1f,\"completed\":%s}\n",
                 cc->method, path, status, tokens, ms, *end ? "false" : "true");
    else if (prompt >= 0)
        snprintf(line, sizeof line, "q3 serve: %s %s %u %d+%d tokens %.1f ms%s\n", cc->method, path, status, prompt, completion, ms, end);
    else
        snprintf(line, sizeof line, "q3 serve: %s %s %u %.1f ms%s\n", cc->method, path, status, ms, end);
    fputs(line, stderr);
}

static void completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode toe)
{
    (void)toe;
    srv_server *s = cls;
    watch_phase(s, c, PHASE_HEADERS); /* a kept-alive connection waits for its next request */
    conn_ctx *cc = *con_cls;
    if (!cc) return;
    access_log(s, c, cc, toe);
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
    free(cc->path);
    free(cc);
    *con_cls = NULL;
}

/* ---- life cycle ------------------------------------------------------------------ */

/* A listener on host:port (port 0: any free one, *bound says which). */
static struct MHD_Daemon *listen_on(srv_server *s, listener *l, const char *host, int port, unsigned threads, unsigned max_conn,
                                    unsigned per_ip, unsigned timeout_s, size_t max_header, int *bound)
{
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE | AI_NUMERICSERV}, *ai;
    char ps[16];
    snprintf(ps, sizeof ps, "%d", port);
    int gai = getaddrinfo(host, ps, &hints, &ai);
    if (gai) {
        q3_fail(Q3_ERR_INVALID, "cannot resolve the address '%s': %s", host, gai_strerror(gai));
        return NULL;
    }
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_EPOLL_LINUX_ONLY | MHD_ALLOW_SUSPEND_RESUME;
    if (ai->ai_family == AF_INET6) flags |= MHD_USE_IPv6;
    struct MHD_Daemon *d = MHD_start_daemon(flags, 0, NULL, NULL, handle, s,
                                            MHD_OPTION_SOCK_ADDR, ai->ai_addr,
                                            MHD_OPTION_THREAD_POOL_SIZE, threads,
                                            MHD_OPTION_CONNECTION_LIMIT, max_conn,
                                            MHD_OPTION_PER_IP_CONNECTION_LIMIT, per_ip,
                                            MHD_OPTION_CONNECTION_TIMEOUT, timeout_s,
                                            MHD_OPTION_CONNECTION_MEMORY_LIMIT, max_header,
                                            MHD_OPTION_NOTIFY_COMPLETED, completed, s,
                                            MHD_OPTION_NOTIFY_CONNECTION, notify_conn, l,
                                            MHD_OPTION_UNESCAPE_CALLBACK, unescape, s,
                                            MHD_OPTION_END);
    freeaddrinfo(ai);
    if (!d) {
        q3_fail(Q3_ERR_IO, "cannot listen on %s:%d (in use, or not an address of this machine)", host, port);
        return NULL;
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT);
    *bound = di ? di->port : port;
    return d;
}

q3_status srv_server_start(const srv_server_opts *o, srv_server **out)
{
    *out = NULL;
    const char *host = o->host ? o->host : "127.0.0.1";
    if (o->port < 0 || o->port > 65535) return q3_fail(Q3_ERR_INVALID, "port %d is outside 0..65535", o->port);
    if (o->admin_port < -1 || o->admin_port > 65535) return q3_fail(Q3_ERR_INVALID, "admin port %d is outside 0..65535", o->admin_port);
    srv_server *s = calloc(1, sizeof *s);
    if (!s) return q3_fail(Q3_ERR_NOMEM, "out of memory");
    srv_metrics_init(&s->metrics);
    pthread_mutex_init(&s->watch_mu, NULL);
    pthread_cond_init(&s->watch_cv, NULL);
    s->max_body = o->max_body ? o->max_body : (size_t)8 << 20;
    s->header_timeout = o->header_timeout_s > 0 ? o->header_timeout_s : 10;
    s->body_timeout = o->body_timeout_s > 0 ? o->body_timeout_s : 30;
    s->api_key = o->api_key ? strdup(o->api_key) : NULL;
    s->started = (long long)time(NULL);
    s->cors_origin = o->cors_origin ? strdup(o->cors_origin) : NULL;
    s->access_log = o->access_log;
    s->n_parallel = o->n_parallel;
    s->admin_port = -1;
    if (pthread_create(&s->reaper, NULL, reaper_main, s)) {
        srv_server_free(s);
        return q3_fail(Q3_ERR_NOMEM, "cannot start a thread");
    }
    s->reaper_started = 1;
    unsigned max_conn = (unsigned)(o->max_connections > 0 ? o->max_connections : 512);
    unsigned per_ip = (unsigned)(o->max_connections_per_ip > 0 ? o->max_connections_per_ip : 64);
    size_t max_header = o->max_header ? o->max_header : 32768;
    unsigned timeout = (unsigned)(o->timeout_s > 0 ? o->timeout_s : 60);
    s->main_l = (listener){.s = s};
    s->admin_l = (listener){.s = s, .admin = 1};
    s->d = listen_on(s, &s->main_l, host, o->port, (unsigned)(o->http_threads > 0 ? o->http_threads : 4), max_conn, per_ip, timeout,
                     max_header, &s->port);
    if (s->d && o->admin_port >= 0) /* its own thread and connections: nothing on the main listener reaches it */
        s->admin = listen_on(s, &s->admin_l, o->admin_host ? o->admin_host : host, o->admin_port, 1, 64, 0, timeout, 8192, &s->admin_port);
    if (!s->d || (o->admin_port >= 0 && !s->admin)) {
        char msg[512];
        snprintf(msg, sizeof msg, "%s", q3_last_error());
        srv_server_free(s);
        return q3_fail(Q3_ERR_IO, "%s", msg);
    }
    return *out = s, Q3_OK;
}

int srv_server_port(const srv_server *s) { return s->port; }
int srv_server_admin_port(const srv_server *s) { return s->admin_port; }
srv_metrics *srv_server_metrics(srv_server *s) { return &s->metrics; }

void srv_server_kv_room(srv_server *s, int kv_tokens) { s->api.kv_tokens = kv_tokens; }

void srv_server_ready(srv_server *s, const q3_tokenizer *tok, const char *model_name, int n_ctx, int vocab, srv_engine *eng)
{
    s->api.tok = tok;
    s->api.model_name = model_name;
    s->api.n_ctx = n_ctx;
    s->api.vocab = vocab;
    srv_api_limits(&s->api);
    s->eng = eng;
    __atomic_store_n(&s->ready, 1, __ATOMIC_RELEASE);
}

void srv_server_set_task(srv_server *s, q3_task task, int hidden)
{
    s->api.task = task;
    s->api.hidden = hidden;
}

void srv_server_refuse(srv_server *s) { __atomic_store_n(&s->draining, 1, __ATOMIC_RELEASE); }

int srv_server_in_flight(srv_server *s)
{
    /* a request holds its connection until answered; a job whose client left is dropped by the engine */
    int conns = __atomic_load_n(&s->in_flight, __ATOMIC_SEQ_CST), jobs = s->eng ? srv_engine_busy(s->eng) : 0;
    return conns > jobs ? conns : jobs;
}

void srv_server_free(srv_server *s)
{
    if (!s) return;
    srv_engine_free(s->eng); /* wakes every waiting connection with its answer */
    s->eng = NULL;
    if (s->d) MHD_stop_daemon(s->d);
    if (s->admin) MHD_stop_daemon(s->admin);
    if (s->reaper_started) {
        pthread_mutex_lock(&s->watch_mu);
        s->reaper_stop = 1;
        pthread_cond_signal(&s->watch_cv);
        pthread_mutex_unlock(&s->watch_mu);
        pthread_join(s->reaper, NULL);
    }
    pthread_mutex_destroy(&s->watch_mu);
    pthread_cond_destroy(&s->watch_cv);
    srv_metrics_destroy(&s->metrics);
    free(s->api_key);
    free(s->cors_origin);
    free(s);
}
