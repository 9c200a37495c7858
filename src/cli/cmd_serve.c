/* q3 serve: the OpenAI-compatible HTTP server. Listens first (GET /health
 * answers 503 while the model loads), then loads, then serves until SIGTERM
 * or SIGINT, which drain: new requests get 503, requests in flight finish,
 * and the process exits 0. */
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "model/model.h"
#include "server/server.h"
#include "text/chat_template.h"
#include "text/tokenizer_gguf.h"
#include "util/file.h"

static const char *usage =
    "usage: q3 serve -m MODEL [options]\n"
    "  -m, --model PATH       a Hugging Face folder (or .gguf)\n"
    "  --tokenizer PATH       tokenizer.json (or its folder) when the model has none\n"
    "  --name NAME            the model's name in the API (default: the folder or file name)\n"
    "  --host ADDR            address to listen on (default 127.0.0.1; 0.0.0.0 for every interface)\n"
    "  --port N               port (default 8080; 0: any free port, printed)\n"
    "  --parallel N           sequences generated at once (default 4)\n"
    "  --ctx N                positions per sequence (default: min(model, 4096))\n"
    "  --kv-size TOKENS       KV cache for all sequences together (default: parallel x ctx)\n"
    "  --chunk N              prefill chunk (default 128)\n"
    "  -t, --threads N        compute threads (default: one per physical core)\n"
    "  --backend UNIT         compute unit (default: the best present)\n"
    "  --kv f32|f16|bf16      KV cache type\n"
    "  --api-key KEY          require Authorization: Bearer KEY on /v1/* and /tokenize (default: $Q3_API_KEY)\n"
    "  --max-queue N          requests waiting at most; more get 429 (default 256)\n"
    "  --max-body BYTES       largest request body (default 8388608)\n"
    "  --max-connections N    open connections at most (default 256)\n"
    "  --timeout S            idle connections close after S seconds (default 60)\n"
    "  --drain-timeout S      on SIGTERM, wait at most S seconds for requests in flight (default 30)\n";

static int num_arg(const char *opt, const char *v, long long lo, long long hi, long long *out)
{
    char *end;
    long long x = strtoll(v, &end, 10);
    if (end == v || *end || x < lo || x > hi)
        return cli_error("serve", "option '%s' needs an integer in [%lld, %lld], got '%s'", opt, lo, hi, v);
    *out = x;
    return 0;
}

static int open_tokenizer(const char *model_path, const char *tok_path, q3_model *m, q3_tokenizer **tok)
{
    char p[PATH_MAX];
    if (tok_path) {
        if (q3_is_dir(tok_path)) { snprintf(p, sizeof p, "%s/tokenizer.json", tok_path); tok_path = p; }
    } else if (q3_is_dir(model_path)) {
        snprintf(p, sizeof p, "%s/tokenizer.json", model_path);
        tok_path = p;
    } else {
        if (!m->gguf || q3_tokenizer_load_gguf(m->gguf, tok))
            return cli_error("serve", "%s (pass --tokenizer PATH)", q3_last_error());
        return 0;
    }
    if (q3_tokenizer_load(tok_path, tok)) return cli_error("serve", "%s", q3_last_error());
    return 0;
}

/* The chat endpoint renders Qwen3's template: refuse a model whose template is another. */
static int check_template(const char *model_path, q3_model *m)
{
    if (!q3_is_dir(model_path)) {
        q3_gguf_tokenizer_info info;
        if (m->gguf && !q3_gguf_tokenizer_info_read(m->gguf, &info) && info.chat_template &&
            info.template_kind != Q3_CHAT_TEMPLATE_QWEN3)
            return cli_error("serve", "%s: its chat template is not one q3 knows", model_path);
        return 0;
    }
    char a[PATH_MAX], b[PATH_MAX];
    snprintf(a, sizeof a, "%s/tokenizer_config.json", model_path);
    snprintf(b, sizeof b, "%s/chat_template.jinja", model_path);
    if (!q3_file_exists(a) && !q3_file_exists(b)) return 0;
    q3_chat_template_kind kind;
    if (q3_chat_template_load(model_path, &kind)) return cli_error("serve", "%s", q3_last_error());
    return 0;
}

int cmd_serve(int argc, char **argv)
{
    const char *model_path = NULL, *tok_path = NULL, *name = NULL;
    srv_server_opts so = {.host = "127.0.0.1", .port = 8080, .api_key = getenv("Q3_API_KEY")};
    q3_ctx_opts co = {.max_seqs = 4};
    long long max_queue = 256, drain = 30, x;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) { fputs(usage, stdout); return 0; }
        if (!v) return cli_error("serve", "unknown option or missing value: '%s' (q3 serve --help)", a);
        i++;
        if (!strcmp(a, "-m") || !strcmp(a, "--model")) model_path = v;
        else if (!strcmp(a, "--tokenizer")) tok_path = v;
        else if (!strcmp(a, "--name")) name = v;
        else if (!strcmp(a, "--host")) so.host = v;
        else if (!strcmp(a, "--api-key")) so.api_key = v;
        else if (!strcmp(a, "--backend")) co.backend = v;
        else if (!strcmp(a, "--kv")) co.kv_dtype = v;
        else if (!strcmp(a, "--port")) { if (num_arg(a, v, 0, 65535, &x)) return 1; so.port = (int)x; }
        else if (!strcmp(a, "--parallel")) { if (num_arg(a, v, 1, 256, &x)) return 1; co.max_seqs = (int)x; }
        else if (!strcmp(a, "--ctx")) { if (num_arg(a, v, 1, 1 << 24, &x)) return 1; co.n_ctx = (int)x; }
        else if (!strcmp(a, "--kv-size")) { if (num_arg(a, v, 16, INT_MAX, &x)) return 1; co.kv_tokens = (int)x; }
        else if (!strcmp(a, "--chunk")) { if (num_arg(a, v, 1, 4096, &x)) return 1; co.chunk = (int)x; }
        else if (!strcmp(a, "-t") || !strcmp(a, "--threads")) { if (num_arg(a, v, 1, 1024, &x)) return 1; co.n_threads = (int)x; }
        else if (!strcmp(a, "--max-queue")) { if (num_arg(a, v, 1, 1 << 20, &max_queue)) return 1; }
        else if (!strcmp(a, "--max-body")) { if (num_arg(a, v, 1024, 1ll << 32, &x)) return 1; so.max_body = (size_t)x; }
        else if (!strcmp(a, "--max-connections")) { if (num_arg(a, v, 1, 1 << 16, &x)) return 1; so.max_connections = (int)x; }
        else if (!strcmp(a, "--timeout")) { if (num_arg(a, v, 1, 86400, &x)) return 1; so.timeout_s = (int)x; }
        else if (!strcmp(a, "--drain-timeout")) { if (num_arg(a, v, 0, 86400, &drain)) return 1; }
        else return cli_error("serve", "unknown option '%s' (q3 serve --help)", a);
    }
    if (!model_path) return cli_error("serve", "no model given (-m MODEL)");
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
    if (open_tokenizer(model_path, tok_path, m, &tok) || check_template(model_path, m)) goto done;
    if (q3_tokenizer_vocab_size(tok) > q3_model_vocab_size(m)) {
        cli_error("serve", "the tokenizer has %d tokens but the model's vocabulary is %d", q3_tokenizer_vocab_size(tok),
                  q3_model_vocab_size(m));
        goto done;
    }
    if (q3_ctx_new(m, &co, &ctx)) { cli_error("serve", "%s", q3_last_error()); goto done; }
    int n_ctx = q3_ctx_n_ctx(ctx), used, cached, total, bt;
    q3_ctx_kv_usage(ctx, &used, &cached, &total, &bt);
    srv_engine_opts eo = {.ctx = ctx, .tok = tok, .vocab = q3_model_vocab_size(m), .metrics = srv_server_metrics(srv),
                          .max_queue = (int)max_queue};
    if (srv_engine_start(&eo, &eng)) { cli_error("serve", "%s", q3_last_error()); goto done; }
    ctx = NULL; /* the engine owns it */
    srv_server_ready(srv, tok, model_name, n_ctx, q3_model_vocab_size(m), eng);
    eng = NULL; /* the server owns it */
    fprintf(stderr, "q3 serve: ready: model %s, %d sequences at once, context %d, KV cache %d blocks of %d tokens\n",
            model_name, co.max_seqs, n_ctx, total, bt);

    int sig = 0;
    sigwait(&sigs, &sig);
    srv_server_refuse(srv);
    fprintf(stderr, "q3 serve: %s: draining\n", sig == SIGTERM ? "SIGTERM" : "SIGINT");
    int left = srv_server_drain(srv, (double)drain);
    if (left) fprintf(stderr, "q3 serve: %d requests still in flight after %lld s: ending them\n", left, drain);
    rc = 0;
done:
    srv_server_free(srv);
    q3_ctx_free(ctx);
    q3_tokenizer_free(tok);
    q3_model_close(m);
    if (!rc) fprintf(stderr, "q3 serve: stopped\n");
    return rc;
}
