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
    int max_connections;    /* 0: 256 */
    size_t max_body;        /* bytes of a request body (0: 8 MiB) */
    size_t max_header;      /* bytes of a request's headers, per connection (0: 32 KiB) */
    int timeout_s;          /* an idle connection is closed after this (0: 60) */
    int http_threads;       /* 0: 4 */
} srv_server_opts;

/* Binds and starts answering (503 on everything but /health and /metrics). */
q3_status srv_server_start(const srv_server_opts *o, srv_server **out);
int srv_server_port(const srv_server *s);
/* The server's metrics (the engine records into them). */
srv_metrics *srv_server_metrics(srv_server *s);
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
/* Refuses new requests (503), waits until every request in flight is answered
 * or timeout_s passes. Returns the requests still in flight (0: drained). */
int srv_server_drain(srv_server *s, double timeout_s);
/* Stops the engine (unfinished requests get 503) and the HTTP daemon; frees. */
void srv_server_free(srv_server *s);

#endif
