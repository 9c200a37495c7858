/* q3 serve's /v1/embeddings and /v1/rerank (/rerank):
 *  - the official OpenAI Node client against /v1/embeddings (tests/openai/embed.test.mjs:
 *    float, base64, dimensions, batches, concurrency, bad input);
 *  - plain HTTP: every bad input the issue lists gets a 400 naming it; token-id inputs;
 *    truncate_prompt_tokens; an endpoint the model does not serve answers 400 saying why;
 *  - rerank: scores equal q3_rerank's on the same prompts (bit for bit through the JSON),
 *    sorted best first, top_n, documents as strings or {text}, return_documents.
 * The e2e model (real Qwen3 vocabulary) is served with --embeddings, then --rerank.
 * A missing node or client counts as a failure, never a skip. */
#include <cjson/cJSON.h>
#include <math.h>

#include "q3.h"
#include "serve_util.h"
#include "test.h"

#define MODEL TEST_DATA "/golden/e2e"

static cJSON *post(int port, const char *path, const char *body, int want_status)
{
    ts_resp r;
    if (ts_request(port, "POST", path, NULL, body, &r)) {
        CHECK(0, "POST %s: no answer", path);
        return NULL;
    }
    CHECK(r.status == want_status, "POST %s %s: status %d, want %d: %s", path, body, r.status, want_status, r.body);
    cJSON *j = cJSON_Parse(r.body);
    CHECK(j != NULL, "POST %s: the answer is not JSON: %s", path, r.body);
    ts_resp_free(&r);
    return j;
}

/* A 400 whose message contains `says`. */
static void bad(int port, const char *path, const char *body, const char *says)
{
    cJSON *j = post(port, path, body, 400);
    const cJSON *m = cJSON_GetObjectItem(cJSON_GetObjectItem(j, "error"), "message");
    CHECK(cJSON_IsString(m) && strstr(m->valuestring, says), "%s %s: the message does not say \"%s\"", path, body, says);
    cJSON_Delete(j);
}

static void node_client(int port, int hidden)
{
    char env[160];
    snprintf(env, sizeof env, "Q3_BASE_URL=http://127.0.0.1:%d/v1 Q3_API_KEY=none Q3_HIDDEN=%d", port, hidden);
    ts_node_test(env, "tests/openai/embed.test.mjs");
}

static void embeddings(q3_model *m, q3_tokenizer *tok)
{
    test_server srv = {0};
    const char *args[] = {"-m", MODEL, "--embeddings", "-t", "1", "--ctx", "64", "--name", "e2e", NULL};
    CHECK(ts_start(&srv, args) == 0 && ts_wait_line(&srv, "ready") == 0, "server --embeddings started");
    if (!srv.port) return;
    int port = srv.port, hidden = q3_model_hidden_size(m);
    node_client(port, hidden);

    /* token ids: the text's ids (with <|endoftext|>) give the text's embedding */
    int32_t *ids;
    size_t n;
    CHECK(q3_embed_tokenize(tok, NULL, "token ids", 9, &ids, &n) == Q3_OK, "tokenize");
    char body[4096];
    int o = snprintf(body, sizeof body, "{\"input\":[[");
    for (size_t i = 0; i < n; i++) o += snprintf(body + o, sizeof body - (size_t)o, i ? ",%d" : "%d", ids[i]);
    snprintf(body + o, sizeof body - (size_t)o, "]]}");
    cJSON *a = post(port, "/v1/embeddings", body, 200), *b = post(port, "/v1/embeddings", "{\"input\":\"token ids\"}", 200);
    const cJSON *va = cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(a, "data"), 0), "embedding");
    const cJSON *vb = cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(b, "data"), 0), "embedding");
    CHECK(cJSON_GetArraySize(va) == hidden && cJSON_Compare(va, vb, 1), "token-id input == text input");
    CHECK(cJSON_GetObjectItem(cJSON_GetObjectItem(a, "usage"), "prompt_tokens")->valueint == (int)n, "usage counts the ids");
    /* the same vector as the library's */
    float *lib = malloc((size_t)hidden * sizeof *lib);
    q3_ctx *ctx = NULL;
    q3_ctx_opts co = q3_ctx_opts_default();
    co.n_ctx = 64;
    co.n_threads = 1;
    CHECK(q3_ctx_new(m, &co, &ctx) == Q3_OK, "ctx");
    const int32_t *in[1] = {ids};
    CHECK(ctx && q3_embed(ctx, in, &n, 1, NULL, lib) == Q3_OK, "q3_embed: %s", q3_last_error());
    int same = cJSON_GetArraySize(vb) == hidden;
    for (int k = 0; same && k < hidden; k++) {
        char *num = cJSON_PrintUnformatted(cJSON_GetArrayItem(vb, k));
        same = num && strtof(num, NULL) == lib[k];
        free(num);
    }
    CHECK(same, "the server's embedding is the library's, bit for bit");
    q3_ctx_free(ctx);
    free(lib);
    free(ids);
    cJSON_Delete(a);
    cJSON_Delete(b);

    /* truncate_prompt_tokens keeps the last tokens; without it a long input is a 400 */
    char longtext[2048] = "{\"input\":\"";
    for (int i = 0; i < 100; i++) strcat(longtext, "word ");
    strcat(longtext, "\"");
    char req[2200];
    snprintf(req, sizeof req, "%s}", longtext);
    bad(port, "/v1/embeddings", req, "the context holds 64");
    snprintf(req, sizeof req, "%s,\"truncate_prompt_tokens\":16}", longtext);
    cJSON *t = post(port, "/v1/embeddings", req, 200);
    CHECK(cJSON_GetObjectItem(cJSON_GetObjectItem(t, "usage"), "prompt_tokens")->valueint == 16, "truncated to 16 tokens");
    cJSON_Delete(t);

    /* bad input */
    bad(port, "/v1/embeddings", "{\"input\":[]}", "empty list");
    bad(port, "/v1/embeddings", "{\"input\":\"\"}", "empty string");
    bad(port, "/v1/embeddings", "{\"input\":[\"ok\",\"\"]}", "input[1] is an empty string");
    bad(port, "/v1/embeddings", "{\"input\":[\"ok\",7]}", "input[1] must be a string");
    bad(port, "/v1/embeddings", "{\"input\":[\"ok\",{\"text\":\"x\"}]}", "input[1] must be a string");
    bad(port, "/v1/embeddings", "{\"input\":[[1,2],[3,-1]]}", "input[1][1] is -1: outside the vocabulary");
    bad(port, "/v1/embeddings", "{\"input\":[5,151936]}", "outside the vocabulary [0, 151936)");
    bad(port, "/v1/embeddings", "{\"input\":[[]]}", "empty list of token ids");
    bad(port, "/v1/embeddings", "{\"input\":\"x\",\"dimensions\":0}", "'dimensions'");
    bad(port, "/v1/embeddings", "{\"input\":\"x\",\"encoding_format\":\"hex\"}", "encoding_format");
    bad(port, "/v1/embeddings", "{\"input\":\"x\",\"pooling\":\"mean\"}", "unknown field 'pooling'");
    bad(port, "/v1/embeddings", "{}", "'input' is required");
    bad(port, "/v1/embeddings", "[1]", "JSON object");
    char *many = malloc(2049 * 4 + 32);
    strcpy(many, "{\"input\":[");
    for (int i = 0; i < 2049; i++) strcat(many, i ? ",\"a\"" : "\"a\"");
    strcat(many, "]}");
    bad(port, "/v1/embeddings", many, "at most 2048");
    free(many);
    /* the other endpoints say what this server serves */
    bad(port, "/v1/rerank", "{\"query\":\"q\",\"documents\":[\"d\"]}", "needs a reranker");
    bad(port, "/v1/chat/completions", "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}", "POST /v1/embeddings");
    cJSON *ok = post(port, "/v1/embeddings", "{\"input\":\"still fine\"}", 200);
    CHECK(cJSON_GetArraySize(cJSON_GetObjectItem(ok, "data")) == 1, "the server still answers after bad requests");
    cJSON_Delete(ok);
    CHECK(ts_stop(&srv) == 0, "server exits 0 on SIGTERM");
}

static void rerank(q3_model *m, q3_tokenizer *tok)
{
    test_server srv = {0};
    const char *args[] = {"-m", MODEL, "--rerank", "-t", "1", "--ctx", "256", "--name", "e2e", NULL};
    CHECK(ts_start(&srv, args) == 0 && ts_wait_line(&srv, "ready") == 0, "server --rerank started");
    if (!srv.port) return;
    int port = srv.port;
    const char *query = "What is the capital of China?";
    const char *docs[] = {"The capital of China is Beijing.", "Gravity is a force.", "Paris is in France.", "yes"};
    enum { N = 4 };
    /* the library's scores of the same prompts */
    float want[N];
    int32_t *ids[N];
    size_t lens[N];
    for (int i = 0; i < N; i++) CHECK(q3_rerank_tokenize(tok, NULL, query, docs[i], &ids[i], &lens[i]) == Q3_OK, "tokenize");
    q3_ctx *ctx = NULL;
    q3_ctx_opts co = q3_ctx_opts_default();
    co.n_ctx = 256;
    co.n_threads = 1;
    CHECK(q3_ctx_new(m, &co, &ctx) == Q3_OK, "ctx");
    CHECK(ctx && q3_rerank(ctx, tok, (const int32_t *const *)ids, lens, N, NULL, want, NULL) == Q3_OK, "q3_rerank: %s",
          q3_last_error());
    q3_ctx_free(ctx);
    long long tokens = 0;
    for (int i = 0; i < N; i++) tokens += (long long)lens[i], free(ids[i]);

    const char *bodies[] = {
        "{\"model\":\"e2e\",\"query\":\"What is the capital of China?\",\"documents\":[\"The capital of China is Beijing.\","
        "\"Gravity is a force.\",\"Paris is in France.\",\"yes\"]}",
        "{\"query\":\"What is the capital of China?\",\"documents\":[{\"text\":\"The capital of China is Beijing.\"},"
        "{\"text\":\"Gravity is a force.\"},\"Paris is in France.\",{\"text\":\"yes\"}],\"top_n\":2,\"return_documents\":true}",
    };
    const char *paths[] = {"/v1/rerank", "/rerank"};
    for (int b = 0; b < 2; b++) {
        cJSON *j = post(port, paths[b], bodies[b], 200);
        const cJSON *res = cJSON_GetObjectItem(j, "results");
        int n = cJSON_GetArraySize(res);
        CHECK(n == (b ? 2 : N), "%s: %d results", paths[b], n);
        float prev = 2;
        for (int k = 0; k < n; k++) {
            const cJSON *r = cJSON_GetArrayItem(res, k);
            int idx = cJSON_GetObjectItem(r, "index")->valueint;
            char *num = cJSON_PrintUnformatted(cJSON_GetObjectItem(r, "relevance_score"));
            float s = strtof(num, NULL);
            free(num);
            CHECK(idx >= 0 && idx < N && s == want[idx], "%s: document %d scores %.9g, the library %.9g", paths[b], idx, s,
                  idx >= 0 && idx < N ? want[idx] : -1);
            CHECK(s <= prev, "%s: results sorted best first", paths[b]);
            prev = s;
            const cJSON *d = cJSON_GetObjectItem(r, "document");
            if (b) CHECK(idx >= 0 && idx < N && d && !strcmp(cJSON_GetObjectItem(d, "text")->valuestring, docs[idx]),
                         "return_documents gives the document's text");
            else CHECK(!d, "no document unless return_documents");
        }
        CHECK(cJSON_GetObjectItem(cJSON_GetObjectItem(j, "usage"), "prompt_tokens")->valuedouble == (double)tokens,
              "usage: the prompts' tokens");
        cJSON_Delete(j);
    }
    bad(port, "/v1/rerank", "{\"query\":\"q\",\"documents\":[]}", "empty list");
    bad(port, "/v1/rerank", "{\"query\":\"\",\"documents\":[\"d\"]}", "'query' is an empty string");
    bad(port, "/v1/rerank", "{\"documents\":[\"d\"]}", "'query' is required");
    bad(port, "/v1/rerank", "{\"query\":\"q\",\"documents\":[\"d\",3]}", "documents[1] must be a string");
    bad(port, "/v1/rerank", "{\"query\":\"q\",\"documents\":[\"d\"],\"top_n\":0}", "'top_n'");
    bad(port, "/v1/embeddings", "{\"input\":\"x\"}", "needs an embedding model");
    CHECK(ts_stop(&srv) == 0, "server exits 0 on SIGTERM");
}

int main(void)
{
    q3_model *m = NULL;
    q3_tokenizer *tok = NULL;
    if (q3_model_open(MODEL, &m) || q3_tokenizer_for_model(m, &tok)) {
        CHECK(0, "open %s: %s", MODEL, q3_last_error());
        TEST_DONE();
    }
    embeddings(m, tok);
    rerank(m, tok);
    q3_tokenizer_free(tok);
    q3_model_close(m);
    TEST_DONE();
}
