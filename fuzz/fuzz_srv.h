/* Shared by fuzz_srv_chat and fuzz_srv_completion: the server's request
 * parsers (srv_parse_chat, srv_parse_completion) on arbitrary bodies, with the
 * real Qwen3 tokenizer (tests/data/golden/e2e/tokenizer.json, loaded once;
 * another file with Q3_FUZZ_TOKENIZER=PATH) and a small context (256
 * positions, so that both sides of the length checks are reachable).
 *
 * Checks, for every body:
 *   - a refusal is an HTTP status in 400..599 equal to e.status, with a type
 *     and a message, both message and param valid UTF-8 (they may echo the
 *     client's bytes), and srv_err_json renders it as the OpenAI envelope (JSON
 *     that cJSON reads back, the same message);
 *   - an accepted request is one a generation can start from: 1 <= n_prompt <
 *     n_ctx, every prompt id a token of the vocabulary, 1 <= max_tokens <=
 *     n_ctx - n_prompt, sampling parameters inside the documented ranges, stop
 *     strings non-empty (at most SRV_MAX_STOP), include_usage only with stream,
 *     top_logprobs in 0..20, an id with the endpoint's prefix;
 *   - a body with a NUL byte, or a JSON string holding \u0000, is refused
 *     (cJSON's strings end at a NUL: accepted, it would cut the text short);
 *   - parsing is a function of the body: a second parse of the same bytes
 *     gives the same status and message, or the same prompt ids, max_tokens,
 *     stops and sampling (the seed too, when the body gives one);
 *   - the job (and everything it holds) is freed by srv_job_unref (LeakSanitizer). */
#ifndef Q3_FUZZ_SRV_H
#define Q3_FUZZ_SRV_H

#include <cjson/cJSON.h>
#include <math.h>

#include "fuzz_common.h"
#include "server/request.h"

#define FUZZ_SRV_N_CTX 256

static q3_tokenizer *srv_fuzz_tok;

static void srv_fuzz_free(void) { q3_tokenizer_free(srv_fuzz_tok); }

static srv_api srv_fuzz_api(void)
{
    if (!srv_fuzz_tok) {
        const char *path = getenv("Q3_FUZZ_TOKENIZER");
        if (!path || !*path) path = "tests/data/golden/e2e/tokenizer.json";
        if (q3_tokenizer_load(path, &srv_fuzz_tok) != Q3_OK) {
            fprintf(stderr, "fuzz_srv: %s (run from the repository root)\n", q3_last_error());
            abort();
        }
        atexit(srv_fuzz_free);
    }
    srv_api a = {.tok = srv_fuzz_tok, .model_name = "qwen3", .n_ctx = FUZZ_SRV_N_CTX,
                 .vocab = q3_tokenizer_vocab_size(srv_fuzz_tok)};
    srv_api_limits(&a);
    return a;
}

#ifndef FUZZ_NO_MAIN
/* The tokenizer loaded before the first input: its load (seconds under ASan
 * on a busy machine) is not counted against that input's timeout. */
int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    srv_fuzz_api();
    return 0;
}
#endif

/* Whether s is valid UTF-8 (no overlongs, surrogates or values past U+10FFFF). */
static int srv_fuzz_utf8(const char *str)
{
    const unsigned char *s = (const unsigned char *)str;
    while (*s) {
        size_t n = s[0] < 0x80 ? 1 : s[0] >= 0xc2 && s[0] <= 0xdf ? 2 : s[0] >= 0xe0 && s[0] <= 0xef ? 3
                 : s[0] >= 0xf0 && s[0] <= 0xf4 ? 4 : 0;
        if (!n) return 0;
        for (size_t i = 1; i < n; i++)
            if ((s[i] & 0xc0) != 0x80) return 0;
        if ((s[0] == 0xe0 && s[1] < 0xa0) || (s[0] == 0xed && s[1] >= 0xa0) || (s[0] == 0xf0 && s[1] < 0x90) ||
            (s[0] == 0xf4 && s[1] >= 0x90))
            return 0;
        s += n;
    }
    return 1;
}

typedef int (*srv_fuzz_parse_fn)(const srv_api *, const char *, size_t, srv_job *, srv_err *);

static void srv_fuzz_check_error(const srv_err *e, int rc)
{
    FUZZ_CHECK(rc >= 400 && rc <= 599, "refused with status %d", rc);
    FUZZ_CHECK(e->status == rc, "status %d but e.status %d", rc, e->status);
    FUZZ_CHECK(e->type && e->type[0], "an error without a type");
    FUZZ_CHECK(e->message[0], "an error without a message");
    FUZZ_CHECK(memchr(e->param, 0, sizeof e->param) && memchr(e->message, 0, sizeof e->message), "unterminated");
    FUZZ_CHECK(srv_fuzz_utf8(e->message) && srv_fuzz_utf8(e->param), "an error that is not UTF-8: %.200s", e->message);
    srv_buf b = {0};
    srv_err_json(e, &b);
    FUZZ_CHECK(!b.oom && b.data, "srv_err_json gave nothing");
    cJSON *doc = b.data ? cJSON_ParseWithLength(b.data, b.len) : NULL;
    FUZZ_CHECK(doc != NULL, "srv_err_json is not JSON: %.200s", b.data ? b.data : "");
    const cJSON *err = cJSON_GetObjectItemCaseSensitive(doc, "error");
    const cJSON *msg = cJSON_GetObjectItemCaseSensitive(err, "message");
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(err, "type");
    FUZZ_CHECK(cJSON_IsString(msg) && !strcmp(msg->valuestring, e->message), "the envelope's message differs");
    FUZZ_CHECK(cJSON_IsString(type) && cJSON_HasObjectItem(err, "param") && cJSON_HasObjectItem(err, "code"),
               "the envelope lacks type, param or code");
    cJSON_Delete(doc);
    free(b.data);
}

static void srv_fuzz_check_job(const srv_api *a, const srv_job *job, srv_kind kind)
{
    const srv_request *j = &job->req;
    FUZZ_CHECK(j->kind == kind, "kind %d, expected %d", (int)j->kind, (int)kind);
    FUZZ_CHECK(j->prompt && j->n_prompt >= 1 && j->n_prompt < a->n_ctx, "accepted a prompt of %d tokens (n_ctx %d)",
               j->n_prompt, a->n_ctx);
    for (int i = 0; j->prompt && i < j->n_prompt; i++) {
        const char *tb;
        size_t tl;
        FUZZ_CHECK(j->prompt[i] >= 0 && j->prompt[i] < a->vocab && q3_tokenizer_piece(a->tok, j->prompt[i], &tb, &tl) == Q3_OK,
                   "prompt[%d] = %d is not a token", i, (int)j->prompt[i]);
    }
    FUZZ_CHECK(j->max_tokens >= 1 && j->max_tokens <= a->n_ctx - j->n_prompt, "max_tokens %d with %d prompt tokens",
               j->max_tokens, j->n_prompt);
    FUZZ_CHECK(j->n_stop >= 0 && j->n_stop <= SRV_MAX_STOP, "%d stop strings", j->n_stop);
    for (int i = 0; i < j->n_stop && i < SRV_MAX_STOP; i++)
        FUZZ_CHECK(j->stop[i] && j->stop[i][0], "stop[%d] is empty", i);
    const q3_sampler_params *sp = &j->sp;
    FUZZ_CHECK(sp->temperature >= 0 && sp->temperature <= 2, "temperature %g", sp->temperature);
    FUZZ_CHECK(sp->top_p > 0 && sp->top_p <= 1, "top_p %g", sp->top_p);
    FUZZ_CHECK(sp->min_p >= 0 && sp->min_p <= 1, "min_p %g", sp->min_p);
    FUZZ_CHECK(sp->top_k >= 0, "top_k %d", sp->top_k);
    FUZZ_CHECK(sp->repeat_penalty > 0 && sp->repeat_penalty <= 10, "repetition_penalty %g", sp->repeat_penalty);
    FUZZ_CHECK(fabsf(sp->presence_penalty) <= 2 && fabsf(sp->frequency_penalty) <= 2, "penalties %g %g",
               sp->presence_penalty, sp->frequency_penalty);
    FUZZ_CHECK((j->stream == 0 || j->stream == 1) && (!j->include_usage || j->stream), "stream %d include_usage %d",
               j->stream, j->include_usage);
    FUZZ_CHECK(j->top_logprobs >= 0 && j->top_logprobs <= SRV_MAX_TOP_LOGPROBS, "top_logprobs %d", j->top_logprobs);
    FUZZ_CHECK(j->top_logprobs == 0 || j->logprobs, "top_logprobs without logprobs");
    FUZZ_CHECK(j->tok == a->tok, "the job's tokenizer");
    const char *prefix = kind == SRV_CHAT ? "chatcmpl-" : "cmpl-";
    FUZZ_CHECK(!strncmp(j->id, prefix, strlen(prefix)), "id %s", j->id);
}

/* The parts of two accepted jobs that the body alone decides. */
static void srv_fuzz_check_same(const srv_job *jx, const srv_job *jy, int seeded)
{
    const srv_request *x = &jx->req, *y = &jy->req;
    FUZZ_CHECK(x->n_prompt == y->n_prompt && !memcmp(x->prompt, y->prompt, (size_t)x->n_prompt * sizeof *x->prompt),
               "two parses of one body give different prompts");
    FUZZ_CHECK(x->max_tokens == y->max_tokens && x->n_stop == y->n_stop && x->stream == y->stream &&
                   x->include_usage == y->include_usage && x->logprobs == y->logprobs &&
                   x->top_logprobs == y->top_logprobs && x->parse_tools == y->parse_tools &&
                   x->parse_reasoning == y->parse_reasoning,
               "two parses of one body give different options");
    for (int i = 0; i < x->n_stop && i < SRV_MAX_STOP; i++)
        FUZZ_CHECK(!strcmp(x->stop[i], y->stop[i]), "stop[%d] differs", i);
    FUZZ_CHECK(x->sp.temperature == y->sp.temperature && x->sp.top_p == y->sp.top_p && x->sp.top_k == y->sp.top_k &&
                   x->sp.min_p == y->sp.min_p && x->sp.repeat_penalty == y->sp.repeat_penalty &&
                   x->sp.presence_penalty == y->sp.presence_penalty && x->sp.frequency_penalty == y->sp.frequency_penalty &&
                   x->sp.penalty_last_n == y->sp.penalty_last_n && (!seeded || x->sp.seed == y->sp.seed),
               "two parses of one body give different sampling");
}

/* Whether body[0..len) holds a NUL byte, or (read as JSON) a string with a
 * \u0000 escape; an escaped backslash before "u0000" is text. */
static int srv_fuzz_has_nul(const char *body, size_t len)
{
    if (memchr(body, 0, len)) return 1;
    int in_str = 0;
    for (size_t i = 0; i < len; i++) {
        if (!in_str) {
            in_str = body[i] == '"';
        } else if (body[i] == '"') {
            in_str = 0;
        } else if (body[i] == '\\' && i + 1 < len) {
            if (body[i + 1] == 'u' && i + 5 < len && !memcmp(body + i + 2, "0000", 4)) return 1;
            i++; /* the escaped character */
        }
    }
    return 0;
}

/* Whether the body is a JSON object with a non-null "seed" (else the seed is random). */
static int srv_fuzz_seeded(const char *body, size_t len)
{
    cJSON *root = cJSON_ParseWithLength(body, len);
    const cJSON *s = cJSON_GetObjectItemCaseSensitive(root, "seed");
    int seeded = s && !cJSON_IsNull(s);
    cJSON_Delete(root);
    return seeded;
}

/* Parses data with fn twice and checks both results; returns the first's
 * status, with the accepted job in *keep (caller unrefs) when keep is set. */
static int srv_fuzz_run(srv_fuzz_parse_fn fn, srv_kind kind, const uint8_t *data, size_t size, srv_job **keep)
{
    srv_api a = srv_fuzz_api();
    /* the HTTP layer hands over the body with its length; the parser must not
       read past it (ASan sees a copy with no terminator) */
    char *body = malloc(size ? size : 1);
    if (!body) abort();
    if (size) memcpy(body, data, size);
    srv_job *j[2];
    srv_err e[2];
    int rc[2];
    for (int k = 0; k < 2; k++) {
        j[k] = srv_job_new();
        if (!j[k]) abort();
        memset(&e[k], 0, sizeof e[k]);
        rc[k] = fn(&a, body, size, j[k], &e[k]);
        if (rc[k]) srv_fuzz_check_error(&e[k], rc[k]);
        else {
            FUZZ_CHECK(e[k].status == 0, "accepted with e.status %d", e[k].status);
            srv_fuzz_check_job(&a, j[k], kind);
        }
    }
    FUZZ_CHECK(rc[0] == rc[1], "two parses of one body: status %d, then %d", rc[0], rc[1]);
    if (!rc[0]) FUZZ_CHECK(!srv_fuzz_has_nul(body, size), "accepted a body with a NUL character");
    if (rc[0] && rc[1])
        FUZZ_CHECK(!strcmp(e[0].message, e[1].message) && !strcmp(e[0].param, e[1].param),
                   "two parses of one body: \"%s\", then \"%s\"", e[0].message, e[1].message);
    if (!rc[0] && !rc[1]) srv_fuzz_check_same(j[0], j[1], srv_fuzz_seeded(body, size));
    fuzz_note(kind == SRV_CHAT ? "srv_parse_chat" : "srv_parse_completion", rc[0] ? Q3_ERR_INVALID : Q3_OK);
    if (rc[0] && getenv("FUZZ_VERBOSE")) fprintf(stderr, "    %d %s\n", rc[0], e[0].message);
    free(body);
    srv_job_unref(j[1]);
    if (keep && !rc[0]) *keep = j[0];
    else srv_job_unref(j[0]);
    return rc[0];
}

#endif
