/* POST /v1/embeddings and POST /v1/rerank (see embed_api.h). */
#include "embed_api.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>


static int bad(srv_err *e, const char *param, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int bad(srv_err *e, const char *param, const char *fmt, ...)
{
    char msg[384];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return srv_err_set(e, 400, "invalid_request_error", NULL, param, "%s", msg);
}

static int oom(srv_err *e) { return srv_err_set(e, 500, "server_error", NULL, NULL, "out of memory"); }

static const char *task_words(q3_task t)
{
    return t == Q3_TASK_EMBED ? "an embedding model" : t == Q3_TASK_RERANK ? "a reranker" : "a chat model";
}

/* The body as a JSON object whose fields are all known; NULL with e set. */
static cJSON *parse_body(const srv_api *a, const char *body, size_t len, const char *const *known, srv_err *e)
{
    cJSON *root = srv_parse_body(a, body, len, e);
    if (!root) return NULL;
    for (const cJSON *it = root->child; it; it = it->next) {
        int ok = 0;
        for (int i = 0; known[i] && !ok; i++) ok = !strcmp(it->string, known[i]);
        if (!ok) {
            bad(e, it->string, "unknown field '%s' (q3 serve refuses what it would otherwise ignore)", it->string);
            cJSON_Delete(root);
            return NULL;
        }
    }
    const cJSON *m = cJSON_GetObjectItemCaseSensitive(root, "model");
    if (m && !cJSON_IsNull(m) && !cJSON_IsString(m)) {
        bad(e, "model", "'model' must be a string");
        cJSON_Delete(root);
        return NULL;
    }
    return root;
}

/* An integer field in [lo, hi] (absent or null: *out unchanged). */
static int get_int(const cJSON *root, const char *name, long long lo, long long hi, long long *out, srv_err *e)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, name);
    if (!v || cJSON_IsNull(v)) return 0;
    if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble))
        return bad(e, name, "'%s' must be an integer", name);
    if (v->valuedouble < (double)lo || v->valuedouble > (double)hi)
        return bad(e, name, "'%s' is %g, must be in [%lld, %lld]", name, v->valuedouble, lo, hi);
    *out = (long long)v->valuedouble;
    return 0;
}

static srv_embed_req *new_req(int n)
{
    srv_embed_req *r = calloc(1, sizeof *r);
    if (!r) return NULL;
    r->n = n;
    r->ids = calloc((size_t)n, sizeof *r->ids);
    r->lens = calloc((size_t)n, sizeof *r->lens);
    if (!r->ids || !r->lens) {
        srv_embed_free(r);
        return NULL;
    }
    return r;
}

int srv_check_generate(const srv_api *a, srv_err *e)
{
    if (a->task == Q3_TASK_GENERATE) return 0;
    return srv_err_set(e, 400, "invalid_request_error", "model_not_supported", NULL,
                       "this server runs %s: use %s (q3 serve with a chat model serves completions)", task_words(a->task),
                       a->task == Q3_TASK_EMBED ? "POST /v1/embeddings" : "POST /v1/rerank");
}

/* ---- POST /v1/embeddings ---------------------------------------------------------------------- */

/* A token-id list input: every item an integer id in the vocabulary. */
static int token_list(const srv_api *a, const cJSON *arr, int index, int32_t **ids, size_t *n, srv_err *e)
{
    int cnt = cJSON_GetArraySize(arr);
    if (cnt == 0) return bad(e, "input", "input[%d] is an empty list of token ids", index);
    *ids = malloc((size_t)cnt * sizeof **ids);
    if (!*ids) return oom(e);
    int k = 0;
    for (const cJSON *t = arr->child; t; t = t->next, k++) {
        if (!cJSON_IsNumber(t) || t->valuedouble != floor(t->valuedouble))
            return bad(e, "input", "input[%d][%d] must be a token id (an integer)", index, k);
        if (t->valuedouble < 0 || t->valuedouble >= a->vocab)
            return bad(e, "input", "input[%d][%d] is %g: outside the vocabulary [0, %d)", index, k, t->valuedouble, a->vocab);
        (*ids)[k] = (int32_t)t->valuedouble;
    }
    *n = (size_t)cnt;
    return 0;
}

int srv_parse_embeddings(const srv_api *a, const char *body, size_t len, srv_job *j, srv_err *e)
{
    static const char *const known[] = {"input", "model", "encoding_format", "dimensions", "user", "truncate_prompt_tokens", NULL};
    if (a->task != Q3_TASK_EMBED)
        return srv_err_set(e, 400, "invalid_request_error", "model_not_supported", NULL,
                           "this server runs %s: /v1/embeddings needs an embedding model (or q3 serve --embeddings)",
                           task_words(a->task));
    cJSON *root = parse_body(a, body, len, known, e);
    if (!root) return e->status;
    int rc = 0;
    long long dim = a->hidden, trunc = 0;
    const cJSON *input = cJSON_GetObjectItemCaseSensitive(root, "input");
    const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(root, "encoding_format");
    int base64 = 0;
    if (fmt && !cJSON_IsNull(fmt)) {
        if (cJSON_IsString(fmt) && !strcmp(fmt->valuestring, "base64")) base64 = 1;
        else if (!cJSON_IsString(fmt) || strcmp(fmt->valuestring, "float"))
            rc = bad(e, "encoding_format", "'encoding_format' must be \"float\" or \"base64\"");
    }
    if (!rc) rc = get_int(root, "dimensions", 1, a->hidden, &dim, e);
    if (!rc) rc = get_int(root, "truncate_prompt_tokens", 1, a->n_ctx, &trunc, e);
    const cJSON *u = cJSON_GetObjectItemCaseSensitive(root, "user");
    if (!rc && u && !cJSON_IsNull(u) && !cJSON_IsString(u)) rc = bad(e, "user", "'user' must be a string");
    /* the shapes OpenAI takes: a string, strings, a list of token ids, lists of token ids */
    int n = 0, one_token_list = 0;
    if (!rc) {
        if (!input || cJSON_IsNull(input)) rc = bad(e, "input", "'input' is required");
        else if (cJSON_IsString(input)) n = 1;
        else if (!cJSON_IsArray(input)) rc = bad(e, "input", "'input' must be a string, a list of strings or a list of token-id lists");
        else if ((n = cJSON_GetArraySize(input)) == 0) rc = bad(e, "input", "'input' is an empty list");
        else if (cJSON_IsNumber(input->child)) one_token_list = 1, n = 1;
        if (!rc && n > SRV_MAX_EMBED_INPUTS)
            rc = bad(e, "input", "%d inputs: at most %d in one request", n, SRV_MAX_EMBED_INPUTS);
    }
    srv_embed_req *r = rc ? NULL : new_req(n);
    if (!rc && !r) rc = oom(e);
    for (int i = 0; !rc && i < n; i++) {
        const cJSON *it = cJSON_IsString(input) || one_token_list ? input : cJSON_GetArrayItem(input, i);
        if (cJSON_IsArray(it)) {
            rc = token_list(a, it, i, &r->ids[i], &r->lens[i], e);
        } else if (!cJSON_IsString(it)) {
            rc = bad(e, "input", "input[%d] must be a string or a list of token ids", i);
        } else if (!*it->valuestring) {
            rc = bad(e, "input", "input[%d] is an empty string", i);
        } else if (q3_embed_tokenize(a->tok, NULL, it->valuestring, strlen(it->valuestring), &r->ids[i], &r->lens[i])) {
            rc = bad(e, "input", "input[%d]: %s", i, q3_last_error());
        }
        if (rc) break;
        if (trunc && r->lens[i] > (size_t)trunc) { /* keep the last tokens, as vLLM's truncate_prompt_tokens does */
            memmove(r->ids[i], r->ids[i] + (r->lens[i] - (size_t)trunc), (size_t)trunc * sizeof(int32_t));
            r->lens[i] = (size_t)trunc;
        }
        if (r->lens[i] > (size_t)a->n_ctx)
            rc = bad(e, "input", "input[%d] has %zu tokens; the context holds %d (truncate_prompt_tokens cuts it)", i,
                     r->lens[i], a->n_ctx);
        else r->n_tokens += (long long)r->lens[i];
    }
    cJSON_Delete(root);
    if (rc) {
        srv_embed_free(r);
        return rc;
    }
    r->dim = (int)dim;
    r->base64 = base64;
    j->req.kind = SRV_EMBED;
    j->req.embed = r;
    j->req.n_prompt = (int)(r->n_tokens < 0x7fffffff ? r->n_tokens : 0x7fffffff);
    return 0;
}

/* ---- POST /v1/rerank, /rerank ------------------------------------------------------------------ */

int srv_parse_rerank(const srv_api *a, const char *body, size_t len, srv_job *j, srv_err *e)
{
    static const char *const known[] = {"query", "documents", "texts", "top_n", "return_documents", "model", "instruction", NULL};
    if (a->task != Q3_TASK_RERANK)
        return srv_err_set(e, 400, "invalid_request_error", "model_not_supported", NULL,
                           "this server runs %s: /v1/rerank needs a reranker (or q3 serve --rerank)", task_words(a->task));
    cJSON *root = parse_body(a, body, len, known, e);
    if (!root) return e->status;
    int rc = 0, n = 0, ret_docs = 0;
    long long top_n = 0;
    const cJSON *q = cJSON_GetObjectItemCaseSensitive(root, "query");
    const cJSON *docs = cJSON_GetObjectItemCaseSensitive(root, "documents");
    if (!docs) docs = cJSON_GetObjectItemCaseSensitive(root, "texts"); /* TEI's and llama-server's other name */
    const cJSON *ins = cJSON_GetObjectItemCaseSensitive(root, "instruction");
    const cJSON *rd = cJSON_GetObjectItemCaseSensitive(root, "return_documents");
    if (!cJSON_IsString(q)) rc = bad(e, "query", "'query' is required and must be a string");
    else if (!*q->valuestring) rc = bad(e, "query", "'query' is an empty string");
    else if (!cJSON_IsArray(docs)) rc = bad(e, "documents", "'documents' is required: a list of strings or of {\"text\": ...}");
    else if ((n = cJSON_GetArraySize(docs)) == 0) rc = bad(e, "documents", "'documents' is an empty list");
    else if (n > SRV_MAX_EMBED_INPUTS) rc = bad(e, "documents", "%d documents: at most %d in one request", n, SRV_MAX_EMBED_INPUTS);
    if (!rc && ins && !cJSON_IsNull(ins) && !cJSON_IsString(ins)) rc = bad(e, "instruction", "'instruction' must be a string");
    if (!rc && rd && !cJSON_IsNull(rd)) {
        if (!cJSON_IsBool(rd)) rc = bad(e, "return_documents", "'return_documents' must be true or false");
        else ret_docs = cJSON_IsTrue(rd);
    }
    if (!rc) rc = get_int(root, "top_n", 1, 1LL << 30, &top_n, e);
    srv_embed_req *r = rc ? NULL : new_req(n);
    if (!rc && (!r || !(r->docs = calloc((size_t)n, sizeof *r->docs)))) rc = oom(e);
    const char *instruct = cJSON_IsString(ins) ? ins->valuestring : NULL;
    int i = 0;
    for (const cJSON *d = rc ? NULL : docs->child; d && !rc; d = d->next, i++) {
        const cJSON *t = cJSON_IsObject(d) ? cJSON_GetObjectItemCaseSensitive(d, "text") : d;
        if (!cJSON_IsString(t)) {
            rc = bad(e, "documents", "documents[%d] must be a string or an object with a \"text\" string", i);
            break;
        }
        if (!(r->docs[i] = strdup(t->valuestring))) rc = oom(e);
        else if (q3_rerank_tokenize(a->tok, instruct, q->valuestring, t->valuestring, &r->ids[i], &r->lens[i]))
            rc = bad(e, "documents", "documents[%d]: %s", i, q3_last_error());
        else if (r->lens[i] > (size_t)a->n_ctx)
            rc = bad(e, "documents", "documents[%d]: the query, the document and the template are %zu tokens; the context holds %d",
                     i, r->lens[i], a->n_ctx);
        else r->n_tokens += (long long)r->lens[i];
    }
    cJSON_Delete(root);
    if (rc) {
        srv_embed_free(r);
        return rc;
    }
    static unsigned long long counter;
    snprintf(j->req.id, sizeof j->req.id, "rerank-%llx", __atomic_add_fetch(&counter, 1, __ATOMIC_RELAXED));
    r->top_n = top_n && top_n < n ? (int)top_n : n;
    r->return_documents = ret_docs;
    j->req.kind = SRV_RERANK;
    j->req.embed = r;
    j->req.n_prompt = (int)(r->n_tokens < 0x7fffffff ? r->n_tokens : 0x7fffffff);
    return 0;
}

/* ---- the run (engine thread) ---------------------------------------------------------------------- */

int srv_embed_run(q3_ctx *ctx, const q3_tokenizer *tok, int hidden, srv_job *const *jobs, int n, char *msg, size_t cap)
{
    int total[2] = {0, 0}; /* embed, rerank */
    for (int k = 0; k < n; k++) total[jobs[k]->req.kind == SRV_RERANK] += jobs[k]->req.embed->n;
    for (int kind = 0; kind < 2; kind++) {
        int cnt = total[kind];
        if (!cnt) continue;
        const int32_t **ids = malloc((size_t)cnt * sizeof *ids);
        size_t *lens = malloc((size_t)cnt * sizeof *lens);
        float *out = malloc((size_t)cnt * (kind ? 1 : (size_t)hidden) * sizeof *out);
        int at = 0, rc = 0;
        if (!ids || !lens || !out) rc = -1, snprintf(msg, cap, "out of memory");
        for (int k = 0; !rc && k < n; k++) {
            srv_embed_req *r = jobs[k]->req.embed;
            if ((jobs[k]->req.kind == SRV_RERANK) != kind) continue;
            if (!(r->out = malloc((size_t)r->n * (kind ? 1 : (size_t)r->dim) * sizeof *r->out))) {
                rc = -1, snprintf(msg, cap, "out of memory");
                break;
            }
            for (int i = 0; i < r->n; i++, at++) {
                ids[at] = r->ids[i];
                lens[at] = r->lens[i];
            }
        }
        /* one packed batch for all: raw vectors, cut and normalized per request below */
        q3_embed_opts o = q3_embed_opts_default();
        o.unnormalized = 1;
        q3_status st = rc ? Q3_OK
                          : kind ? q3_rerank(ctx, tok, ids, lens, (size_t)cnt, NULL, out, NULL)
                                 : q3_embed(ctx, ids, lens, (size_t)cnt, &o, out);
        if (!rc && st) rc = -1, snprintf(msg, cap, "%s", q3_last_error());
        at = 0;
        for (int k = 0; !rc && k < n; k++) {
            srv_embed_req *r = jobs[k]->req.embed;
            if ((jobs[k]->req.kind == SRV_RERANK) != kind) continue;
            for (int i = 0; i < r->n; i++, at++) {
                if (kind) {
                    r->out[i] = out[at];
                } else {
                    float *v = r->out + (size_t)i * r->dim;
                    memcpy(v, out + (size_t)at * hidden, (size_t)r->dim * sizeof *v);
                    q3_embed_normalize(v, r->dim);
                }
            }
        }
        free(ids);
        free(lens);
        free(out);
        if (rc) return rc;
    }
    return 0;
}

/* ---- answers ------------------------------------------------------------------------------------- */

static const char B64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/* The bytes of v[0..n) (little-endian float32, as OpenAI's base64 is read) in base64. */
static void put_base64(srv_buf *b, const float *v, int n)
{
    const unsigned char *p = (const unsigned char *)v;
    size_t len = (size_t)n * sizeof(float), i = 0;
    char q[4];
    for (; i + 3 <= len; i += 3) {
        unsigned x = (unsigned)p[i] << 16 | (unsigned)p[i + 1] << 8 | p[i + 2];
        q[0] = B64[x >> 18], q[1] = B64[(x >> 12) & 63], q[2] = B64[(x >> 6) & 63], q[3] = B64[x & 63];
        srv_buf_put(b, q, 4);
    }
    if (len - i == 1) {
        unsigned x = (unsigned)p[i] << 16;
        q[0] = B64[x >> 18], q[1] = B64[(x >> 12) & 63], q[2] = '=', q[3] = '=';
        srv_buf_put(b, q, 4);
    } else if (len - i == 2) {
        unsigned x = (unsigned)p[i] << 16 | (unsigned)p[i + 1] << 8;
        q[0] = B64[x >> 18], q[1] = B64[(x >> 12) & 63], q[2] = B64[(x >> 6) & 63], q[3] = '=';
        srv_buf_put(b, q, 4);
    }
}

static void put_string(srv_buf *b, const char *s)
{
    cJSON *str = cJSON_CreateString(s);
    if (!str) {
        b->oom = 1;
        return;
    }
    srv_put_json(b, str);
    cJSON_Delete(str);
}

typedef struct ranked {
    int index;
    float score;
} ranked;

static int by_score(const void *x, const void *y)
{
    const ranked *a = x, *b = y;
    if (a->score != b->score) return a->score < b->score ? 1 : -1;
    return a->index - b->index;
}

void srv_embed_response_json(const srv_job *j, srv_buf *out)
{
    const srv_embed_req *r = j->req.embed;
    if (j->req.kind == SRV_EMBED) {
        srv_buf_puts(out, "{\"object\":\"list\",\"data\":[");
        for (int i = 0; i < r->n; i++) {
            const float *v = r->out + (size_t)i * r->dim;
            srv_buf_printf(out, "%s{\"object\":\"embedding\",\"index\":%d,\"embedding\":", i ? "," : "", i);
            if (r->base64) {
                srv_buf_puts(out, "\"");
                put_base64(out, v, r->dim);
                srv_buf_puts(out, "\"");
            } else {
                srv_buf_puts(out, "[");
                for (int k = 0; k < r->dim; k++) srv_buf_printf(out, k ? ",%.9g" : "%.9g", v[k]);
                srv_buf_puts(out, "]");
            }
            srv_buf_puts(out, "}");
        }
        srv_buf_puts(out, "],\"model\":");
    } else {
        ranked *order = malloc((size_t)r->n * sizeof *order);
        if (!order) {
            out->oom = 1;
            return;
        }
        for (int i = 0; i < r->n; i++) order[i] = (ranked){i, r->out[i]};
        qsort(order, (size_t)r->n, sizeof *order, by_score);
        srv_buf_printf(out, "{\"id\":\"%s\",\"object\":\"list\",\"results\":[", j->req.id);
        for (int k = 0; k < r->top_n; k++) {
            srv_buf_printf(out, "%s{\"index\":%d,\"relevance_score\":%.9g", k ? "," : "", order[k].index, order[k].score);
            if (r->return_documents) {
                srv_buf_puts(out, ",\"document\":{\"text\":");
                put_string(out, r->docs[order[k].index]);
                srv_buf_puts(out, "}");
            }
            srv_buf_puts(out, "}");
        }
        free(order);
        srv_buf_puts(out, "],\"model\":");
    }
    put_string(out, j->req.model_name ? j->req.model_name : "");
    srv_buf_printf(out, ",\"usage\":{\"prompt_tokens\":%lld,\"total_tokens\":%lld}}", r->n_tokens, r->n_tokens);
}
