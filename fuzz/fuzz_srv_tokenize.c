/* libFuzzer target: one body through both token-counting endpoints, POST
 * /tokenize (srv_tokenize) and POST /detokenize (srv_detokenize), twice each.
 * Checks, besides fuzz/fuzz_srv.h's for a refusal (an HTTP status, a type, a
 * UTF-8 message, the OpenAI envelope):
 *   - an answer is JSON that cJSON reads back, and the same bytes both times;
 *   - /tokenize: "tokens" a list of "count" ids of the vocabulary,
 *     "max_model_len" the context;
 *   - /detokenize: "prompt" a string of valid UTF-8 (bytes that are not UTF-8
 *     become U+FFFD), from at most a context of tokens;
 *   - nothing accepted holds a NUL character (a NUL byte, or \u0000 in a string). */
#include "fuzz_srv.h"

typedef int (*srv_fuzz_answer_fn)(const srv_api *, const char *, size_t, srv_buf *, srv_err *);

/* Runs fn on body twice; returns the first answer (caller frees) or NULL for a refusal. */
static char *srv_fuzz_answer(const srv_api *a, srv_fuzz_answer_fn fn, const char *name, const char *body, size_t size)
{
    srv_buf out[2] = {{0}};
    srv_err e[2];
    int rc[2];
    for (int k = 0; k < 2; k++) {
        memset(&e[k], 0, sizeof e[k]);
        rc[k] = fn(a, body, size, &out[k], &e[k]);
        if (rc[k]) srv_fuzz_check_error(&e[k], rc[k]);
        else FUZZ_CHECK(e[k].status == 0 && out[k].data && !out[k].oom, "%s: accepted with e.status %d", name, e[k].status);
    }
    FUZZ_CHECK(rc[0] == rc[1], "%s: status %d, then %d", name, rc[0], rc[1]);
    if (rc[0] && rc[1]) FUZZ_CHECK(!strcmp(e[0].message, e[1].message), "%s: \"%s\", then \"%s\"", name, e[0].message, e[1].message);
    if (!rc[0] && !rc[1])
        FUZZ_CHECK(out[0].len == out[1].len && !memcmp(out[0].data, out[1].data, out[0].len), "%s: two different answers", name);
    if (!rc[0]) FUZZ_CHECK(!srv_fuzz_has_nul(body, size), "%s: accepted a body with a NUL character", name);
    fuzz_note(name, rc[0] ? Q3_ERR_INVALID : Q3_OK);
    free(out[1].data);
    if (rc[0]) free(out[0].data);
    return rc[0] ? NULL : out[0].data;
}

static int fuzz_srv_tokenize(const uint8_t *data, size_t size)
{
    srv_api a = srv_fuzz_api();
    char *body = malloc(size ? size : 1); /* no terminator: the parsers must not read past size */
    if (!body) abort();
    if (size) memcpy(body, data, size);

    char *t = srv_fuzz_answer(&a, srv_tokenize, "srv_tokenize", body, size);
    if (t) {
        cJSON *doc = cJSON_Parse(t);
        const cJSON *ids = cJSON_GetObjectItemCaseSensitive(doc, "tokens");
        const cJSON *count = cJSON_GetObjectItemCaseSensitive(doc, "count");
        const cJSON *mml = cJSON_GetObjectItemCaseSensitive(doc, "max_model_len");
        FUZZ_CHECK(cJSON_IsArray(ids) && cJSON_IsNumber(count) && cJSON_GetArraySize(ids) == count->valueint,
                   "/tokenize: not a list of 'count' tokens: %.200s", t);
        FUZZ_CHECK(cJSON_IsNumber(mml) && mml->valueint == a.n_ctx, "/tokenize: max_model_len");
        for (const cJSON *x = ids ? ids->child : NULL; x; x = x->next)
            FUZZ_CHECK(cJSON_IsNumber(x) && x->valueint >= 0 && x->valueint < a.vocab, "/tokenize: an id %g", x->valuedouble);
        cJSON_Delete(doc);
        free(t);
    }

    char *d = srv_fuzz_answer(&a, srv_detokenize, "srv_detokenize", body, size);
    if (d) {
        cJSON *doc = cJSON_Parse(d);
        const cJSON *text = cJSON_GetObjectItemCaseSensitive(doc, "prompt");
        FUZZ_CHECK(cJSON_IsString(text) && srv_fuzz_utf8(text->valuestring), "/detokenize: not a UTF-8 string: %.200s", d);
        cJSON *req = cJSON_ParseWithLength(body, size);
        FUZZ_CHECK(cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(req, "tokens")) <= a.n_ctx,
                   "/detokenize: more tokens than the context");
        cJSON_Delete(req);
        cJSON_Delete(doc);
        free(d);
    }
    free(body);
    return 0;
}

#ifndef FUZZ_NO_MAIN
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) { return fuzz_srv_tokenize(data, size); }
#endif
