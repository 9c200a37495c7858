/* q3 serve: an OpenAI-compatible HTTP server (GNU libmicrohttpd) in front of
 * the engine thread. The server listens as soon as it starts (GET /health
 * says 503 while the model loads) and serves once srv_server_ready hands it
 * the tokenizer and the engine. Every HTTP thread only parses, queues and
 * answers; the engine thread alone runs the model. */
#ifndef Q3_SERVER_SERVER_H
#define Q3_SERVER_SERVER_H

#include <stddef.h>

#include "q3.h"
#include "engine.h"
#include "metrics.h"
#include "q3.h"

typedef struct srv_server srv_server;

typedef struct srv_server_opts {
    const char *host;       /* address to bind (NULL: 127.0.0.1) */
    int port;               /* 0: any free port (srv_server_port says which) */
    const char *api_key;    /* NULL: no key needed */
    int max_connections;    /* open connections at most (0: 512); more wait in the kernel's backlog */
    int max_connections_per_ip; /* from one client address (0: 64); more are closed at once */
    size_t max_body;        /* bytes of a request body (0: 8 MiB) */
    size_t max_header;      /* bytes of a request's headers, per connection (0: 32 KiB) */
    int timeout_s;          /* an idle connection is closed after this (0: 60) */
    int header_timeout_s;   /* a request's headers (or a kept-alive connection's next request) must be in
                               within this, however they trickle (0: 10) */
    int body_timeout_s;     /* a request's body must be in within this after its headers (0: 30) */
    int http_threads;       /* 0: 4 */
    int admin_port;         /* -1: none; else a listener of its own (0: any free port) for /health and /metrics */
    const char *admin_host; /* its address (NULL: host) */
    const char *cors_origin; /* NULL: no CORS headers; else Access-Control-Allow-Origin (and OPTIONS preflights) */
    int access_log;         /* one line a request on stderr: SRV_LOG_NONE, SRV_LOG_TEXT or SRV_LOG_JSON */
    int n_parallel;         /* sequences at once, for GET /props */
} srv_server_opts;

enum { SRV_LOG_NONE, SRV_LOG_TEXT, SRV_LOG_JSON };

/* Binds and starts answering (503 on everything but /health and /metrics). */
q3_status srv_server_start(const srv_server_opts *o, srv_server **out);
int srv_server_port(const srv_server *s);
/* The admin listener's port (-1: none). */
int srv_server_admin_port(const srv_server *s);
/* The server's metrics (the engine records into them). */
srv_metrics *srv_server_metrics(srv_server *s);
/* The KV pool's size in tokens (a request's prompt plus max_tokens must fit
 * in it, and max_tokens defaults to what fits). Before srv_server_ready. */
void srv_server_kv_room(srv_server *s, int kv_tokens);
/* From now on requests reach eng (the server takes it: freed by srv_server_free).
 * tok and model_name must outlive the server. */
void srv_server_ready(srv_server *s, const q3_tokenizer *tok, const char *model_name, int n_ctx, int vocab,
                      srv_engine *eng);
/* What the model serves (before srv_server_ready): chat (GENERATE, the
 * default), /v1/embeddings (EMBED) or /v1/rerank (RERANK); the other
 * endpoints answer 400 saying why. hidden: the model's hidden size. */
void srv_server_set_task(srv_server *s, q3_task task, int hidden);
/* From now on new requests (and /health) get 503. */
void srv_server_refuse(srv_server *s);
/* Requests not yet answered (each counted once, queued, running or being sent). */
int srv_server_in_flight(srv_server *s);
/* Stops the engine (unfinished requests get 503) and the HTTP daemon; frees. */
void srv_server_free(srv_server *s);

#endif
