/* q3 serve: the OpenAI-compatible HTTP server. Listens first (GET /health
 * answers 503 while the model loads), then loads, then serves until SIGTERM
 * or SIGINT, which drain: new requests get 503, requests in flight finish,
 * and the process exits 0. */
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "cli/cli.h"
#include "cli/gen_common.h"
#include "cli/opts.h"
#include "q3.h"
#include "server/server.h"

/* The model's own tokenizer, or --tokenizer (a tokenizer.json or its folder). */
int cmd_serve(int argc, char **argv)
{
    const char *model_path = NULL, *tok_path = NULL, *name = NULL, *log_format = "text", *step_arg = "256";
    srv_server_opts so = {.host = "127.0.0.1", .port = 8080, .api_key = getenv("Q3_API_KEY")};
    q3_ctx_opts co = {.max_seqs = 4};
    int port = 8080, max_body = 8 << 20, max_conn = 0, per_ip = 64, timeout = 60, drain = 30, max_queue = 256;
    int header_timeout = 10, body_timeout = 30, admin_port = -1;
    int force_embed = 0, force_rerank = 0;
    cli_llama llama = {0};
    cli_opt tab[40 + CLI_LLAMA_N_OPTS] = {
        CLI_OPT("model", 'm', CLI_FILE, &model_path, "PATH", "a Hugging Face folder (or .gguf)", .flags = CLI_REQUIRED),
        CLI_OPT("tokenizer", 0, CLI_FILE, &tok_path, "PATH", "tokenizer.json (or its folder) when the model has none"),
        CLI_OPT("name", 0, CLI_STR, &name, "NAME", "the model's name in the API (default: the folder or file name);\n"
                "--alias too (llama-server's name)"),
        CLI_OPT("alias", 'a', CLI_STR, &name, "NAME", NULL, .flags = CLI_HIDDEN),
        CLI_OPT("host", 0, CLI_STR, &so.host, "ADDR", "address to listen on (default 127.0.0.1; 0.0.0.0 for every interface)"),
        CLI_OPT("port", 0, CLI_INT, &port, "N", "port (default 8080; 0: any free port, printed)", .lo = 0, .hi = 65535),
        CLI_OPT("parallel", 0, CLI_INT, &co.max_seqs, "N", "sequences generated at once (default 4)", .lo = 1, .hi = 256, .dash = "np"),
        CLI_OPT("ctx-size", 'c', CLI_INT, &co.n_ctx, "N", "positions per sequence (default: min(model, 4096)); --ctx too", .lo = 1,
                .hi = 1 << 24),
        CLI_OPT("ctx", 0, CLI_INT, &co.n_ctx, "N", NULL, .lo = 1, .hi = 1 << 24, .flags = CLI_HIDDEN),
        CLI_OPT("kv-size", 0, CLI_INT, &co.kv_tokens, "TOKENS", "KV cache for all sequences together (default: parallel x ctx)",
                .lo = 16, .hi = 1 << 28),
        CLI_OPT("chunk", 0, CLI_INT, &co.chunk, "N", "prefill chunk (default 128)", .lo = 1, .hi = 4096),
        CLI_OPT("step-tokens", 0, CLI_STR, &step_arg, "N|paced",
                "tokens one engine step runs at most: every decode row, then a prefill chunk with the rest, so an\n"
                "arriving prompt is spread over steps; the chunk is at most --chunk (default 256: the decode rows and a\n"
                "whole chunk; vLLM's max_num_batched_tokens); paced: the chunk takes 3 tokens for every 2 decode rows\n"
                "(at least 16), so the streams' inter-token latency stays near even"),
        CLI_OPT("threads", 't', CLI_INT, &co.n_threads, "N", "compute threads (default: one per physical core, or $Q3_THREADS)",
                .lo = 1, .hi = 1024),
        CLI_OPT("backend", 0, CLI_STR, &co.backend, "UNIT", "compute unit (default: the best present)"),
        CLI_OPT("kv", 0, CLI_STR, &co.kv_dtype, "TYPE", "KV cache type: f32, f16, bf16 or q8_0"),
        CLI_OPT("api-key", 0, CLI_STR, &so.api_key, "KEY", "require Authorization: Bearer KEY on /v1/* and /tokenize (default: $Q3_API_KEY)"),
        CLI_OPT("max-queue", 0, CLI_INT, &max_queue, "N", "requests waiting at most; more get 429 (default 256)", .lo = 1, .hi = 1 << 20),
        CLI_OPT("max-body", 0, CLI_INT, &max_body, "BYTES", "largest request body (default 8388608)", .lo = 1024, .hi = 1 << 30),
        CLI_OPT("max-connections", 0, CLI_INT, &max_conn, "N",
                "open connections at most (default: max-queue + parallel + 64, so a full queue answers 429)", .lo = 1, .hi = 1 << 16),
        CLI_OPT("max-connections-per-ip", 0, CLI_INT, &per_ip, "N", "open connections from one client address (default 64)",
                .lo = 1, .hi = 1 << 16),
        CLI_OPT("timeout", 0, CLI_INT, &timeout, "S", "idle connections close after S seconds (default 60)", .lo = 1, .hi = 86400),
        CLI_OPT("header-timeout", 0, CLI_INT, &header_timeout, "S",
                "a request's headers must arrive within S seconds, however slowly they trickle (default 10)", .lo = 1, .hi = 86400),
        CLI_OPT("body-timeout", 0, CLI_INT, &body_timeout, "S", "a request's body must arrive within S seconds of its headers (default 30)",
                .lo = 1, .hi = 86400),
        CLI_OPT("admin-port", 0, CLI_INT, &admin_port, "N",
                "also serve /health and /metrics on this port, on a listener of their own (0: any free port, printed)", .lo = 0,
                .hi = 65535),
        CLI_OPT("cors", 0, CLI_STR, &so.cors_origin, "ORIGIN",
                "let browser pages from ORIGIN ('*': any) call the API: Access-Control-Allow-Origin\n"
                "on every answer, OPTIONS preflights answered (default: no CORS headers)"),
        CLI_OPT("log-format", 0, CLI_STR, &log_format, "FMT",
                "the access log, one line a request on stderr: text (default), json or none"),
        CLI_OPT("embeddings", 0, CLI_FLAG, &force_embed, NULL,
                "serve /v1/embeddings with this model whatever its markers say\n"
                "(default: from the model, see docs/embeddings.md)"),
        CLI_OPT("rerank", 0, CLI_FLAG, &force_rerank, NULL, "serve /v1/rerank and /rerank with this model (the same)"),
        CLI_OPT("drain-timeout", 0, CLI_INT, &drain, "S", "on SIGTERM, wait at most S seconds for requests in flight (default 30)",
                .lo = 0, .hi = 86400),
    };
    int n_tab = 0;
    while (tab[n_tab].name) n_tab++;
    cli_llama_add_opts(&llama, &co.chunk, tab + n_tab);
    cli_spec spec = {"serve", "q3 serve -m MODEL [options]",
                     "An OpenAI-compatible HTTP server with continuous batching: /v1/chat/completions, /v1/completions,\n"
                     "/v1/models, /tokenize, /detokenize, /health, /metrics; llama-server's /completion, /props and\n"
                     "the routes without /v1; /v1/embeddings or /v1/rerank (/rerank) with an embedding model or a\n"
                     "reranker. SIGTERM or SIGINT drain and exit 0.\n",
                     tab, 0, NULL};
    int prc = cli_parse(&spec, argc, argv, NULL);
    if (prc) return prc == CLI_HELP_SHOWN ? 0 : prc;
    if ((prc = cli_llama_apply(&spec, &llama, &co.kv_dtype))) return prc;
    if (!strcmp(log_format, "text")) so.access_log = SRV_LOG_TEXT;
    else if (!strcmp(log_format, "json")) so.access_log = SRV_LOG_JSON;
    else if (!strcmp(log_format, "none")) so.access_log = SRV_LOG_NONE;
    else return cli_usage_error("serve", "--log-format is text, json or none, not '%.40s'", log_format);
    if (so.cors_origin && !*so.cors_origin) return cli_usage_error("serve", "--cors needs an origin ('*' for any)");
    int step_tokens = Q3_STEP_PACED;
    if (strcmp(step_arg, "paced")) {
        char *end;
        long n = strtol(step_arg, &end, 10);
        if (end == step_arg || *end || n < 1 || n > 1 << 20)
            return cli_usage_error("serve", "--step-tokens is a count of tokens (1 to 1048576) or paced, not '%.40s'", step_arg);
        step_tokens = (int)n;
    }
    so.n_parallel = co.max_seqs;
    if (force_embed && force_rerank) return cli_usage_error("serve", "--embeddings and --rerank exclude each other");
    so.port = port;
    so.max_body = (size_t)max_body;
    /* above the queue: a full queue answers 429 instead of leaving clients in the kernel's backlog */
    so.max_connections = max_conn ? max_conn : max_queue + co.max_seqs + 64;
    so.max_connections_per_ip = per_ip;
    so.timeout_s = timeout;
    so.header_timeout_s = header_timeout;
    so.body_timeout_s = body_timeout;
    so.admin_port = admin_port;
    if (so.max_connections <= max_queue + co.max_seqs)
        fprintf(stderr, "q3 serve: warning: --max-connections %d is not above --max-queue %d + --parallel %d: a full "
                "server leaves clients waiting instead of answering 429\n", so.max_connections, max_queue, co.max_seqs);
    { /* every connection is a descriptor (two while its deadlines are watched) */
        struct rlimit rl;
        rlim_t need = (rlim_t)so.max_connections * 2 + 64 + 64 * 2;
        if (!getrlimit(RLIMIT_NOFILE, &rl) && rl.rlim_cur < need) {
            rl.rlim_cur = rl.rlim_max == RLIM_INFINITY || rl.rlim_max > need ? need : rl.rlim_max;
            setrlimit(RLIMIT_NOFILE, &rl);
            if (rl.rlim_cur < need)
                fprintf(stderr, "q3 serve: warning: %llu open files allowed (ulimit -n); --max-connections %d needs %llu\n",
                        (unsigned long long)rl.rlim_cur, so.max_connections, (unsigned long long)need);
        }
    }
    if (so.api_key && !*so.api_key) so.api_key = NULL;

    /* signals are taken by sigwait below, never by a handler in some thread */
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGTERM);
    sigaddset(&sigs, SIGINT);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    signal(SIGPIPE, SIG_IGN);

    srv_server *srv;
    if (srv_server_start(&so, &srv)) return cli_error("serve", "%s", q3_last_error());
    if (srv_server_admin_port(srv) >= 0)
        fprintf(stderr, "q3 serve: listening on http://%s:%d (loading %s); /health and /metrics also on http://%s:%d\n", so.host,
                srv_server_port(srv), model_path, so.host, srv_server_admin_port(srv));
    else
        fprintf(stderr, "q3 serve: listening on http://%s:%d (loading %s)\n", so.host, srv_server_port(srv), model_path);

    int rc = 1;
    q3_model *m = NULL;
    q3_tokenizer *tok = NULL;
    q3_ctx *ctx = NULL;
    srv_engine *eng = NULL;
    char model_name[256];
    if (name) {
        snprintf(model_name, sizeof model_name, "%s", name);
    } else {
        char tmp[PATH_MAX];
        snprintf(tmp, sizeof tmp, "%s", model_path);
        size_t l = strlen(tmp);
        while (l > 1 && tmp[l - 1] == '/') tmp[--l] = 0;
        const char *base = strrchr(tmp, '/');
        snprintf(model_name, sizeof model_name, "%s", base ? base + 1 : tmp);
    }
    if (q3_model_open(model_path, &m)) { cli_error("serve", "%s", q3_last_error()); goto done; }
    if (co.n_ctx > q3_model_max_context(m)) {
        rc = cli_usage_error("serve", "-c/--ctx-size %d is more than this model's context (%d)", co.n_ctx, q3_model_max_context(m));
        goto done;
    }
    if (cli_open_tokenizer("serve", tok_path, m, &tok)) goto done;
    q3_task task = force_embed ? Q3_TASK_EMBED : force_rerank ? Q3_TASK_RERANK : q3_model_task(m);
    int present; /* the chat endpoint renders Qwen3's template: refuse a model whose template is another */
    if (task == Q3_TASK_GENERATE && q3_model_chat_template_check(m, &present)) { cli_error("serve", "%s", q3_last_error()); goto done; }
    if (q3_tokenizer_vocab_size(tok) > q3_model_vocab_size(m)) {
        cli_error("serve", "the tokenizer has %d tokens but the model's vocabulary is %d", q3_tokenizer_vocab_size(tok),
                  q3_model_vocab_size(m));
        goto done;
    }
    if (q3_ctx_new(m, &co, &ctx)) { cli_error("serve", "%s", q3_last_error()); goto done; }
    int n_ctx = q3_ctx_n_ctx(ctx), used, cached, total, bt;
    q3_ctx_kv_usage(ctx, &used, &cached, &total, &bt);
    if (total * bt < n_ctx)
        fprintf(stderr, "q3 serve: warning: the KV cache (%d tokens) is smaller than the context (%d): a request's prompt and "
                "max_tokens must fit in %d tokens (max_tokens defaults to what fits)\n", total * bt, n_ctx, total * bt);
    srv_server_kv_room(srv, total * bt);
    srv_engine_opts eo = {.ctx = ctx, .tok = tok, .vocab = q3_model_vocab_size(m), .hidden = q3_model_hidden_size(m),
                          .metrics = srv_server_metrics(srv),
                          .max_queue = (int)max_queue, .step_tokens = step_tokens};
    if (srv_engine_start(&eo, &eng)) { cli_error("serve", "cannot start the engine thread (out of memory or threads)"); goto done; }
    ctx = NULL; /* the engine owns it */
    srv_server_set_task(srv, task, q3_model_hidden_size(m));
    srv_server_ready(srv, tok, model_name, n_ctx, q3_model_vocab_size(m), eng);
    eng = NULL; /* the server owns it */
    fprintf(stderr, "q3 serve: ready: model %s (%s), %d sequence%s at once, context %d, KV cache %d blocks of %d tokens\n",
            model_name, task == Q3_TASK_EMBED ? "/v1/embeddings" : task == Q3_TASK_RERANK ? "/v1/rerank" : "chat",
            co.max_seqs, co.max_seqs == 1 ? "" : "s", n_ctx, total, bt);

    int sig = 0;
    sigwait(&sigs, &sig);
    srv_server_refuse(srv);
    fprintf(stderr, "q3 serve: %s: draining (a second signal stops at once)\n", sig == SIGTERM ? "SIGTERM" : "SIGINT");
    /* until every request is answered, the drain timeout passes, or a second signal comes */
    double t0 = q3_now();
    int left = srv_server_in_flight(srv), again = 0;
    while (left && q3_now() - t0 < drain) {
        struct timespec ts = {0, 20 * 1000000L};
        if (sigtimedwait(&sigs, NULL, &ts) > 0) { again = 1; break; }
        left = srv_server_in_flight(srv);
    }
    if (left)
        fprintf(stderr, "q3 serve: %d requests still in flight %s: ending them\n", left,
                again ? "at a second signal" : "after the drain timeout");
    rc = 0;
done:
    srv_server_free(srv);
    q3_ctx_free(ctx);
    q3_tokenizer_free(tok);
    q3_model_close(m);
    if (!rc) fprintf(stderr, "q3 serve: stopped\n");
    return rc;
}
