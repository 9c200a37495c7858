/* OpenAI request bodies (chat, completions, tokenize, detokenize) into jobs
 * and answers, and the models list (see request.h). */
#include "request.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>


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


/* ---- field helpers -------------------------------------------------------- */

static int is_known(const char *k, const char *const *known)
{
    for (int i = 0; known[i]; i++)
        if (!strcmp(k, known[i])) return 1;
    return 0;
}

static int check_fields(const cJSON *root, const char *const *known, srv_err *e)
{
    for (const cJSON *it = root->child; it; it = it->next)
        if (!is_known(it->string, known))
            return bad(e, it->string, "unknown field '%s' (q3 serve refuses what it would otherwise ignore)", it->string);
    return 0;
}

/* Fields clients commonly send that do not change the answer: accepted and
 * ignored, as vLLM and llama-server do (the README's Serving section lists them). OpenAI SDKs:
 * metadata, store, service_tier, prediction (a latency hint), reasoning_effort
 * (Qwen3's thinking is chat_template_kwargs.enable_thinking); llama.cpp
 * clients: cache_prompt (checked as a bool: q3 reuses cached prefixes always)
 * and id_slot (q3 picks the sequence). */
#define SRV_IGNORED_FIELDS "metadata", "store", "service_tier", "prediction", "reasoning_effort", "cache_prompt", "id_slot"
/* Fields beyond OpenAI's that q3 implements: n_predict (max_tokens), ignore_eos,
 * repeat_penalty (repetition_penalty), repeat_last_n (the penalties' window),
 * modalities (["text"] only). */
#define SRV_EXTRA_FIELDS "n_predict", "ignore_eos", "repeat_penalty", "repeat_last_n", "modalities"
/* llama.cpp's samplers q3 does not have, as llama.cpp clients (its web UI among
 * them) send them at every request: each accepted at the value that switches it
 * off (the answer is then the same), refused with 400 at any other. The
 * parameters that only tune a switched-off sampler are accepted with it;
 * timings_per_token and return_progress ask for extra response fields q3 does
 * not send (the answer is the same). See check_llama_samplers. */
#define SRV_LLAMA_SAMPLER_FIELDS                                                                                 \
    "dynatemp_range", "dynatemp_exponent", "typical_p", "xtc_probability", "xtc_threshold", "dry_multiplier",  \
        "dry_base", "dry_allowed_length", "dry_penalty_last_n", "dry_sequence_breakers", "mirostat",            \
        "mirostat_tau", "mirostat_eta", "timings_per_token", "return_progress"

/* A request body's top level: its endpoint's fields, plus the ones above. */
static int check_body_fields(const cJSON *root, const char *const *known, srv_err *e)
{
    static const char *const compat[] = {SRV_IGNORED_FIELDS, SRV_EXTRA_FIELDS, SRV_LLAMA_SAMPLER_FIELDS, NULL};
    for (const cJSON *it = root->child; it; it = it->next)
        if (!is_known(it->string, known) && !is_known(it->string, compat))
            return bad(e, it->string, "unknown field '%s' (q3 serve refuses what it would otherwise ignore)", it->string);
    return 0;
}

/* A number field in [lo, hi]; absent or null leaves *out. */
static int get_num(const cJSON *root, const char *name, double lo, double hi, double *out, srv_err *e)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, name);
    if (!v || cJSON_IsNull(v)) return 0;
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble)) return bad(e, name, "'%s' must be a number", name);
    if (v->valuedouble < lo || v->valuedouble > hi) return bad(e, name, "'%s' is %g, must be in [%g, %g]", name, v->valuedouble, lo, hi);
    *out = v->valuedouble;
    return 0;
}

static int get_int(const cJSON *root, const char *name, double lo, double hi, long long *out, srv_err *e)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, name);
    if (!v || cJSON_IsNull(v)) return 0;
    if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble)) return bad(e, name, "'%s' must be an integer", name);
    if (v->valuedouble < lo || v->valuedouble > hi) return bad(e, name, "'%s' is %g, must be in [%.0f, %.0f]", name, v->valuedouble, lo, hi);
    *out = (long long)v->valuedouble;
    return 0;
}

static int get_bool(const cJSON *root, const char *name, int *out, srv_err *e)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, name);
    if (!v || cJSON_IsNull(v)) return 0;
    if (!cJSON_IsBool(v)) return bad(e, name, "'%s' must be true or false", name);
    *out = cJSON_IsTrue(v);
    return 0;
}

/* A number field that must hold its switched-off value (see SRV_LLAMA_SAMPLER_FIELDS). */
static int get_off(const cJSON *root, const char *name, double off, const char *what, srv_err *e)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, name);
    if (!v || cJSON_IsNull(v)) return 0;
    if (!cJSON_IsNumber(v)) return bad(e, name, "'%s' must be a number", name);
    if (v->valuedouble != off)
        return bad(e, name, "'%s' is %g: q3 has no %s sampler, so only %g (off) is accepted", name, v->valuedouble, what, off);
    return 0;
}

/* llama.cpp's samplers q3 lacks: off, or a 400 naming the field; their tuning
 * parameters typed but not used. */
static int check_llama_samplers(const cJSON *root, srv_err *e)
{
    if (get_off(root, "dynatemp_range", 0, "dynamic temperature", e) || get_off(root, "typical_p", 1, "locally typical", e) ||
        get_off(root, "xtc_probability", 0, "XTC", e) || get_off(root, "dry_multiplier", 0, "DRY", e) ||
        get_off(root, "mirostat", 0, "Mirostat", e))
        return e->status;
    static const char *const tuning[] = {"dynatemp_exponent", "xtc_threshold", "dry_base", "dry_allowed_length",
                                         "dry_penalty_last_n", "mirostat_tau", "mirostat_eta", NULL};
    double x;
    for (int i = 0; tuning[i]; i++)
        if (get_num(root, tuning[i], -1e9, 1e9, &x, e)) return e->status;
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, "dry_sequence_breakers");
    if (v && !cJSON_IsNull(v) && !cJSON_IsArray(v)) return bad(e, "dry_sequence_breakers", "'dry_sequence_breakers' must be a list of strings");
    for (const cJSON *b = cJSON_IsArray(v) ? v->child : NULL; b; b = b->next)
        if (!cJSON_IsString(b)) return bad(e, "dry_sequence_breakers", "'dry_sequence_breakers' must be a list of strings");
    int flag;
    if (get_bool(root, "timings_per_token", &flag, e) || get_bool(root, "return_progress", &flag, e)) return e->status;
    return 0;
}

static uint64_t seed_counter;

/* Sampling, limits, stop and stream options common to both endpoints. */
static int parse_common(const srv_api *a, const cJSON *root, srv_job *j, int thinking, srv_err *e)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, "model");
    if (v && !cJSON_IsNull(v)) {
        if (!cJSON_IsString(v)) return bad(e, "model", "'model' must be a string");
        if (strcmp(v->valuestring, a->model_name))
            return srv_err_set(e, 404, "invalid_request_error", "model_not_found", "model",
                               "The model `%.100s` does not exist (this server runs `%.100s`).", v->valuestring, a->model_name);
    }
    q3_sampler_params sp = q3_sampler_defaults(thinking);
    sp.penalty_last_n = 0;
    double x;
    long long n;
    x = sp.temperature; if (get_num(root, "temperature", 0, 2, &x, e)) return e->status; sp.temperature = (float)x;
    x = sp.top_p; if (get_num(root, "top_p", 1e-9, 1, &x, e)) return e->status; sp.top_p = (float)x;
    n = sp.top_k; if (get_int(root, "top_k", -1, 1e9, &n, e)) return e->status; sp.top_k = n < 0 ? 0 : (int)n;
    x = sp.min_p; if (get_num(root, "min_p", 0, 1, &x, e)) return e->status; sp.min_p = (float)x;
    x = 1; if (get_num(root, "repetition_penalty", 1e-6, 10, &x, e)) return e->status;
    if (get_num(root, "repeat_penalty", 1e-6, 10, &x, e)) return e->status; /* llama.cpp's name */
    sp.repeat_penalty = (float)x;
    x = 0; if (get_num(root, "presence_penalty", -2, 2, &x, e)) return e->status; sp.presence_penalty = (float)x;
    x = 0; if (get_num(root, "frequency_penalty", -2, 2, &x, e)) return e->status; sp.frequency_penalty = (float)x;
    /* the penalties see the whole answer; the prompt too only with repetition_penalty (as llama.cpp's
       does), so presence and frequency alone count the output, as OpenAI's do */
    if (sp.repeat_penalty != 1.0f || sp.presence_penalty != 0 || sp.frequency_penalty != 0) sp.penalty_last_n = a->n_ctx;
    /* llama.cpp's repeat_last_n: the window the penalties see (0: none, -1: the whole context) */
    n = -2;
    if (get_int(root, "repeat_last_n", -1, a->n_ctx, &n, e)) return e->status;
    if (n != -2 && sp.penalty_last_n) sp.penalty_last_n = n == -1 ? a->n_ctx : (int)n;
    if (check_llama_samplers(root, e)) return e->status;
    j->req.no_prompt_penalty = sp.repeat_penalty == 1.0f;
    v = cJSON_GetObjectItemCaseSensitive(root, "seed");
    if (v && !cJSON_IsNull(v)) {
        if (get_int(root, "seed", -9.2e18, 9.2e18, &n, e)) return e->status;
        sp.seed = (uint64_t)n;
    } else {
        sp.seed = (uint64_t)time(NULL) * 0x9e3779b97f4a7c15ull + __atomic_add_fetch(&seed_counter, 1, __ATOMIC_RELAXED);
    }
    j->req.sp = sp;
    n = 1;
    if (get_int(root, "n", 1, 1, &n, e)) return bad(e, "n", "'n' must be 1 (q3 serve makes one choice per request)");
    long long mt = 0;
    if (get_int(root, "max_tokens", 1, 1e9, &mt, e)) return e->status;
    if (get_int(root, "max_completion_tokens", 1, 1e9, &mt, e)) return e->status;
    long long np = -1; /* llama.cpp's n_predict: max_tokens; -1 is "until the context ends" */
    if (get_int(root, "n_predict", -1, 1e9, &np, e)) return e->status;
    if (np == 0) return bad(e, "n_predict", "'n_predict' 0 (evaluate the prompt only) is not supported: give -1 or 1 and more");
    if (np > 0) mt = np;
    j->req.max_tokens = (int)mt;
    int flag = 0; /* cache_prompt: accepted; q3 reuses cached prefixes always, and the answer is the same either way */
    if (get_bool(root, "cache_prompt", &flag, e)) return e->status;
    v = cJSON_GetObjectItemCaseSensitive(root, "stop");
    if (cJSON_IsString(v)) {
        if (v->valuestring[0]) j->req.stop[j->req.n_stop++] = strdup(v->valuestring);
    } else if (cJSON_IsArray(v)) {
        if (cJSON_GetArraySize(v) > SRV_MAX_STOP) return bad(e, "stop", "at most %d stop strings", SRV_MAX_STOP);
        for (const cJSON *s = v->child; s; s = s->next) {
            if (!cJSON_IsString(s)) return bad(e, "stop", "'stop' must be a string or a list of strings");
            if (s->valuestring[0]) j->req.stop[j->req.n_stop++] = strdup(s->valuestring);
        }
    } else if (v && !cJSON_IsNull(v)) {
        return bad(e, "stop", "'stop' must be a string or a list of strings");
    }
    for (int i = 0; i < j->req.n_stop; i++)
        if (!j->req.stop[i]) return srv_err_set(e, 500, "server_error", NULL, NULL, "out of memory");
    if (get_bool(root, "stream", &j->req.stream, e)) return e->status;
    v = cJSON_GetObjectItemCaseSensitive(root, "stream_options");
    if (v && !cJSON_IsNull(v)) {
        if (!cJSON_IsObject(v)) return bad(e, "stream_options", "'stream_options' must be an object");
        if (!j->req.stream) return bad(e, "stream_options", "'stream_options' needs \"stream\": true");
        static const char *const so_known[] = {"include_usage", "continuous_usage_stats", NULL};
        if (check_fields(v, so_known, e)) return e->status;
        if (get_bool(v, "include_usage", &j->req.include_usage, e)) return e->status;
    }
    j->req.tok = a->tok;
    if (j->req.kind == SRV_CHAT) { /* logprobs: bool, top_logprobs: 0..20 */
        if (get_bool(root, "logprobs", &j->req.logprobs, e)) return e->status;
        long long top = 0;
        if (get_int(root, "top_logprobs", 0, SRV_MAX_TOP_LOGPROBS, &top, e)) return e->status;
        if (top > 0 && !j->req.logprobs) return bad(e, "top_logprobs", "'top_logprobs' needs \"logprobs\": true");
        j->req.top_logprobs = (int)top;
    } else { /* legacy completions: logprobs is the number of alternatives */
        long long top = -1;
        if (get_int(root, "logprobs", 0, SRV_MAX_TOP_LOGPROBS, &top, e)) return e->status;
        j->req.logprobs = top >= 0;
        j->req.top_logprobs = top > 0 ? (int)top : 0;
    }
    int ignore_eos = 0; /* llama.cpp's: the end-of-turn and end-of-text tokens are never sampled */
    if (get_bool(root, "ignore_eos", &ignore_eos, e)) return e->status;
    int32_t eog[2] = {q3_tokenizer_end_of_turn(a->tok), q3_tokenizer_end_of_text(a->tok)};
    v = cJSON_GetObjectItemCaseSensitive(root, "logit_bias");
    if (v && !cJSON_IsNull(v) && cJSON_IsArray(v)) { /* llama.cpp's form: [[id, bias], ...], bias false: never */
        int n = cJSON_GetArraySize(v);
        if (n > SRV_MAX_LOGIT_BIAS) return bad(e, "logit_bias", "at most %d entries in 'logit_bias'", SRV_MAX_LOGIT_BIAS);
        if (!(j->req.bias = malloc((size_t)(n + 2) * sizeof *j->req.bias)))
            return srv_err_set(e, 500, "server_error", NULL, NULL, "out of memory");
        int k = 0;
        for (const cJSON *b = v->child; b; b = b->next, k++) {
            const cJSON *id = cJSON_GetArrayItem(b, 0), *bias = cJSON_GetArrayItem(b, 1);
            if (!cJSON_IsArray(b) || cJSON_GetArraySize(b) != 2 || !cJSON_IsNumber(id) || id->valuedouble != floor(id->valuedouble) ||
                id->valuedouble < 0 || id->valuedouble >= a->vocab)
                return bad(e, "logit_bias", "logit_bias[%d] must be [token id (0..%d), bias]", k, a->vocab - 1);
            if (!cJSON_IsFalse(bias) && !(cJSON_IsNumber(bias) && bias->valuedouble >= -100 && bias->valuedouble <= 100))
                return bad(e, "logit_bias", "logit_bias[%d]'s bias must be a number in [-100, 100] or false", k);
            j->req.bias[j->req.n_bias++] =
                (srv_bias){.id = (int32_t)id->valuedouble, .bias = cJSON_IsFalse(bias) ? -INFINITY : (float)bias->valuedouble};
        }
    } else if (v && !cJSON_IsNull(v)) { /* {"token id": bias in [-100, 100]}, as OpenAI's */
        if (!cJSON_IsObject(v)) return bad(e, "logit_bias", "'logit_bias' must be an object of token ids to biases");
        int n = cJSON_GetArraySize(v);
        if (n > SRV_MAX_LOGIT_BIAS) return bad(e, "logit_bias", "at most %d entries in 'logit_bias'", SRV_MAX_LOGIT_BIAS);
        if (!(j->req.bias = malloc((size_t)(n + 2) * sizeof *j->req.bias)))
            return srv_err_set(e, 500, "server_error", NULL, NULL, "out of memory");
        for (const cJSON *b = v->child; b; b = b->next) {
            char *end;
            long id = strtol(b->string, &end, 10);
            if (!b->string[0] || *end || id < 0 || id >= a->vocab)
                return bad(e, "logit_bias", "logit_bias key '%.40s' is not a token id (0..%d)", b->string, a->vocab - 1);
            if (!cJSON_IsNumber(b) || !(b->valuedouble >= -100 && b->valuedouble <= 100))
                return bad(e, "logit_bias", "logit_bias[%.40s] must be a number in [-100, 100]", b->string);
            j->req.bias[j->req.n_bias++] = (srv_bias){.id = (int32_t)id, .bias = (float)b->valuedouble};
        }
    }
    if (ignore_eos) {
        if (!j->req.bias && !(j->req.bias = malloc(2 * sizeof *j->req.bias)))
            return srv_err_set(e, 500, "server_error", NULL, NULL, "out of memory");
        for (int k = 0; k < 2; k++)
            if (eog[k] >= 0 && eog[k] < a->vocab) j->req.bias[j->req.n_bias++] = (srv_bias){.id = eog[k], .bias = -INFINITY};
    }
    v = cJSON_GetObjectItemCaseSensitive(root, "user");
    if (v && !cJSON_IsNull(v) && !cJSON_IsString(v)) return bad(e, "user", "'user' must be a string");
    v = cJSON_GetObjectItemCaseSensitive(root, "modalities"); /* ["text"] is what q3 answers; audio would change it */
    for (const cJSON *m = cJSON_IsArray(v) ? v->child : NULL; m; m = m->next)
        if (!cJSON_IsString(m) || strcmp(m->valuestring, "text"))
            return bad(e, "modalities", "only the \"text\" modality is supported");
    if (v && !cJSON_IsNull(v) && !cJSON_IsArray(v)) return bad(e, "modalities", "'modalities' must be a list");
    return 0;
}

/* The prompt fits with room for at least one token, and max_tokens fits after
 * it in the KV pool; max_tokens defaults to what fits, and past the context it
 * is capped to the room after the prompt (as llama-server does; vLLM answers
 * 400 instead). param: the field that holds the prompt ("messages" or "prompt"). */
static int check_length(const srv_api *a, srv_job *j, const char *param, srv_err *e)
{
    if (j->req.n_prompt < 1) return bad(e, param, "the prompt is empty");
    if (j->req.n_prompt >= a->n_ctx)
        return srv_err_set(e, 400, "invalid_request_error", "context_length_exceeded", param,
                           "This model's maximum context length is %d tokens. However, your request has %d input "
                           "tokens. Please reduce the length of the input messages.", a->n_ctx, j->req.n_prompt);
    /* max_tokens past the context is capped to what fits, as llama-server does (the answer then ends with
       finish_reason "length" where the context does); vLLM answers 400 instead */
    int room = a->n_ctx - j->req.n_prompt;
    int kv_room = a->kv_tokens > 0 ? a->kv_tokens - j->req.n_prompt : room;
    if (kv_room < 1)
        return srv_err_set(e, 400, "invalid_request_error", "context_length_exceeded", param,
                           "The prompt's %d tokens need more KV cache than this server has (%d tokens, --kv-size).",
                           j->req.n_prompt, a->kv_tokens);
    if (j->req.max_tokens == 0) j->req.max_tokens = room < kv_room ? room : kv_room;
    else if (j->req.max_tokens > room) j->req.max_tokens = room;
    if (j->req.max_tokens > kv_room)
        return srv_err_set(e, 400, "invalid_request_error", "context_length_exceeded", "max_tokens",
                           "The prompt's %d tokens and max_tokens %d need more KV cache than this server has "
                           "(%d tokens, --kv-size).", j->req.n_prompt, j->req.max_tokens, a->kv_tokens);
    return 0;
}

void srv_api_limits(srv_api *a)
{
    size_t longest = 1;
    int32_t n = a->tok ? q3_tokenizer_vocab_size(a->tok) : 0;
    for (int32_t id = 0; id < n; id++) {
        const char *b;
        size_t len;
        if (!q3_tokenizer_piece(a->tok, id, &b, &len) && len > longest) longest = len;
    }
    a->max_text_bytes = longest * 3 * (size_t)(a->n_ctx > 0 ? a->n_ctx : 1);
    a->max_json_values = 4 * (size_t)(a->n_ctx > 0 ? a->n_ctx : 1) + SRV_MAX_LOGIT_BIAS + 4096;
}

/* Text of `bytes` bytes that cannot fit the context whatever its tokens: refused
 * before tokenizing (each token is at most the longest token's bytes). */
static int too_long(const srv_api *a, size_t bytes, const char *param, srv_err *e)
{
    if (!a->max_text_bytes || bytes <= a->max_text_bytes) return 0;
    return srv_err_set(e, 400, "invalid_request_error", "context_length_exceeded", param,
                       "This model's maximum context length is %d tokens. However, your request's %zu bytes of text "
                       "make more tokens than that. Please reduce the length of the input.", a->n_ctx, bytes);
}

/* One pass over a body's bytes before it is parsed: whether a JSON string in
 * it holds \u0000 (cJSON's strings end at a NUL, so such a string would be
 * cut short without a word, "abc\u0000def" read as "abc"; q3 refuses text with
 * NUL characters instead), and an upper bound on the number of JSON values
 * cJSON would make a node of (commas and opening brackets outside strings,
 * plus one). */
static void scan_body(const char *body, size_t len, int *nul_escape, size_t *values)
{
    int in_string = 0;
    size_t n = 1;
    *nul_escape = 0;
    for (size_t i = 0; i < len; i++) {
        char ch = body[i];
        if (!in_string) {
            in_string = ch == '"';
            n += ch == ',' || ch == '[' || ch == '{';
        } else if (ch == '"') {
            in_string = 0;
        } else if (ch == '\\' && i + 1 < len) {
            if (body[i + 1] == 'u' && len - i >= 6 && !memcmp(body + i + 2, "0000", 4)) *nul_escape = 1;
            i++; /* the escaped character */
        }
    }
    *values = n;
}

static int cmp_keys(const void *x, const void *y) { return strcmp(*(const char *const *)x, *(const char *const *)y); }

/* The first key that appears twice in one object of the tree (NULL: none).
 * cJSON keeps both and its lookups find the first: a request must not mean
 * one thing to q3 and another to a proxy that reads the last. */
static const char *dup_key(const cJSON *node)
{
    const char *found = NULL;
    if (cJSON_IsObject(node)) {
        int n = cJSON_GetArraySize(node), k = 0;
        const char **keys = n > 1 ? malloc((size_t)n * sizeof *keys) : NULL;
        for (const cJSON *c = node->child; keys && c; c = c->next) keys[k++] = c->string;
        if (keys) {
            qsort(keys, (size_t)k, sizeof *keys, cmp_keys);
            for (int i = 1; i < k && !found; i++)
                if (!strcmp(keys[i - 1], keys[i])) found = keys[i];
            free(keys);
        }
    }
    for (const cJSON *c = node->child; c && !found && (cJSON_IsObject(node) || cJSON_IsArray(node)); c = c->next)
        found = dup_key(c);
    return found;
}

cJSON *srv_parse_body(const srv_api *a, const char *body, size_t len, srv_err *e)
{
    int nul_escape;
    size_t values;
    scan_body(body, len, &nul_escape, &values);
    if (memchr(body, 0, len) || nul_escape) {
        bad(e, NULL, "a string in the body holds \\u0000 (a NUL character): q3 takes text without NUL characters");
        return NULL;
    }
    if (a->max_json_values && values > a->max_json_values) {
        bad(e, NULL, "the body holds more than %zu JSON values (numbers, strings, lists, objects; a context of %d tokens "
            "needs fewer)", a->max_json_values, a->n_ctx);
        return NULL;
    }
    cJSON *root = cJSON_ParseWithLength(body, len);
    if (!root) {
        bad(e, NULL, "the body is not valid JSON");
        return NULL;
    }
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        bad(e, NULL, "the body must be a JSON object");
        return NULL;
    }
    const char *dup = dup_key(root);
    if (dup) {
        bad(e, dup, "the key '%.60s' appears twice in one object", dup);
        cJSON_Delete(root);
        return NULL;
    }
    return root;
}

static void fill_ids(srv_job *j, const char *prefix)
{
    static unsigned long long counter;
    unsigned long long c = __atomic_add_fetch(&counter, 1, __ATOMIC_RELAXED);
    j->req.created = (long long)time(NULL);
    snprintf(j->req.id, sizeof j->req.id, "%s-%llx%08llx", prefix, (unsigned long long)j->req.created, c);
}

/* Whether a completion's prompt text[0..len) surely has more tokens than the
 * context holds, found without tokenizing all of it: a prefix is tokenized that
 * ends where a piece must end, at a newline before an ASCII letter (the
 * pre-tokenizer never joins the two, NFC never composes them, no added token
 * holds a newline), so its tokens are the first tokens of the whole text. With
 * a margin of 16 over the context. 0: not sure (tokenize it all). */
static int surely_too_long(const srv_api *a, const char *text, size_t len, size_t *n_prefix)
{
    size_t want = (size_t)a->n_ctx + 16, from = 8 * want;
    if (len < 2 * from) return 0;
    size_t cut = 0;
    for (size_t i = from; i + 1 < len && i < 2 * from && !cut; i++)
        if (text[i] == '\n' && (text[i + 1] | 32) >= 'a' && (text[i + 1] | 32) <= 'z') cut = i + 1;
    int32_t *ids = NULL;
    size_t n = 0;
    if (!cut || q3_tokenizer_encode(a->tok, text, cut, Q3_ENCODE_DEFAULT, &ids, &n)) return 0;
    free(ids);
    *n_prefix = n;
    return n >= want;
}

/* ---- chat ------------------------------------------------------------------ */

/* A message's content as one string: a string, or the text parts of a list
 * joined by "\n". NULL content stays NULL. Returns 0, or an error status. */
static int content_text(const cJSON *m, int idx, char **out, srv_err *e)
{
    *out = NULL;
    const cJSON *c = cJSON_GetObjectItemCaseSensitive(m, "content");
    if (!c || cJSON_IsNull(c)) return 0;
    if (cJSON_IsString(c)) {
        *out = strdup(c->valuestring);
        return *out ? 0 : srv_err_set(e, 500, "server_error", NULL, NULL, "out of memory");
    }
    if (!cJSON_IsArray(c)) return bad(e, "messages", "messages[%d].content must be a string or a list of text parts", idx);
    srv_buf b = {0};
    int k = 0;
    for (const cJSON *p = c->child; p; p = p->next, k++) {
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(p, "type"), *text = cJSON_GetObjectItemCaseSensitive(p, "text");
        if (!cJSON_IsObject(p) || !cJSON_IsString(type) || strcmp(type->valuestring, "text") || !cJSON_IsString(text)) {
            free(b.data);
            return bad(e, "messages", "messages[%d].content[%d]: only {\"type\": \"text\", \"text\": ...} parts are supported", idx, k);
        }
        if (k) srv_buf_puts(&b, "\n");
        srv_buf_puts(&b, text->valuestring);
    }
    if (b.oom) { free(b.data); return srv_err_set(e, 500, "server_error", NULL, NULL, "out of memory"); }
    *out = b.data ? b.data : strdup("");
    return 0;
}

/* Renders the conversation with Qwen3's template and tokenizes it with
 * q3_chat_tokenize_json: the markup's control tokens are tokens, the messages' text
 * is always plain text ("<|im_end|>" typed in a message stays text), in one
 * pass, so text without control-token strings gets the reference's ids. */
static int render_chat(const srv_api *a, const cJSON *messages, const cJSON *tools, int thinking, srv_job *j, srv_err *e)
{
    if (!cJSON_IsArray(messages) || cJSON_GetArraySize(messages) < 1) return bad(e, "messages", "'messages' must be a non-empty list");
    cJSON *conv = cJSON_CreateObject(), *msgs = cJSON_AddArrayToObject(conv, "messages");
    int rc = 0, idx = 0;
    size_t text_bytes = 0;
    char *json = NULL;
    for (const cJSON *m = messages->child; m; m = m->next, idx++) {
        if (!cJSON_IsObject(m)) { rc = bad(e, "messages", "messages[%d] must be an object", idx); goto done; }
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(m, "role");
        if (!cJSON_IsString(role)) { rc = bad(e, "messages", "messages[%d].role must be a string", idx); goto done; }
        const char *r = role->valuestring;
        int assistant = !strcmp(r, "assistant");
        if (!assistant && strcmp(r, "system") && strcmp(r, "developer") && strcmp(r, "user") && strcmp(r, "tool")) {
            rc = bad(e, "messages", "messages[%d].role is '%.40s': expected system, developer, user, assistant or tool", idx, r);
            goto done;
        }
        char *text;
        if ((rc = content_text(m, idx, &text, e))) goto done;
        if (!text && !assistant) { rc = bad(e, "messages", "messages[%d] (%s) has no content", idx, r); goto done; }
        text_bytes += text ? strlen(text) : 0;
        if ((rc = too_long(a, text_bytes, "messages", e))) { free(text); goto done; }
        cJSON *copy = cJSON_CreateObject();
        cJSON_AddItemToArray(msgs, copy);
        cJSON_AddStringToObject(copy, "role", !strcmp(r, "developer") ? "system" : r);
        cJSON_AddStringToObject(copy, "content", text ? text : ""); /* null beside tool_calls */
        free(text);
        if (assistant) {
            static const char *const keep[] = {"reasoning_content", "tool_calls", NULL};
            for (int k = 0; keep[k]; k++) {
                const cJSON *f = cJSON_GetObjectItemCaseSensitive(m, keep[k]);
                if (f && !cJSON_IsNull(f)) cJSON_AddItemToObject(copy, keep[k], cJSON_Duplicate(f, 1));
            }
        }
    }
    if (tools) cJSON_AddItemToObject(conv, "tools", cJSON_Duplicate(tools, 1));
    if (thinking >= 0) cJSON_AddBoolToObject(conv, "enable_thinking", thinking);
    cJSON_AddBoolToObject(conv, "add_generation_prompt", 1);
    int32_t *ids = NULL;
    size_t n = 0;
    if (!(json = cJSON_PrintUnformatted(conv))) {
        rc = srv_err_set(e, 500, "server_error", NULL, NULL, "out of memory");
        goto done;
    }
    if (q3_chat_tokenize_json(a->tok, json, strlen(json), 0, &ids, &n)) {
        rc = bad(e, "messages", "%s", q3_last_error());
        goto done;
    }
    j->req.prompt = ids;
    j->req.n_prompt = (int)n;
done:
    free(json);
    cJSON_Delete(conv);
    return rc;
}

/* ---- structured output ------------------------------------------------------ */

/* The constraint fields of the request's top level (llama-server's, vLLM's
 * older ones) and of vLLM's structured_outputs object, with what each holds. */
static const struct {
    const char *name;
    q3_grammar_kind kind;
} direct[] = {
    {"json_schema", Q3_GRAMMAR_JSON_SCHEMA}, {"grammar", Q3_GRAMMAR_GBNF},
    {"guided_json", Q3_GRAMMAR_JSON_SCHEMA}, {"guided_regex", Q3_GRAMMAR_REGEX},
    {"guided_choice", Q3_GRAMMAR_CHOICE},    {"guided_grammar", Q3_GRAMMAR_GBNF},
};
static const struct {
    const char *name;
    q3_grammar_kind kind;
} so_keys[] = {{"json", Q3_GRAMMAR_JSON_SCHEMA}, {"regex", Q3_GRAMMAR_REGEX}, {"choice", Q3_GRAMMAR_CHOICE},
               {"grammar", Q3_GRAMMAR_GBNF}, {"json_object", Q3_GRAMMAR_JSON}};

static const char *kind_name(q3_grammar_kind k)
{
    switch (k) {
    case Q3_GRAMMAR_JSON_SCHEMA: return "json_schema";
    case Q3_GRAMMAR_JSON: return "json_object";
    case Q3_GRAMMAR_GBNF: return "gbnf";
    case Q3_GRAMMAR_REGEX: return "regex";
    case Q3_GRAMMAR_CHOICE: return "choice";
    case Q3_GRAMMAR_TOOL_CALL: return "tool_call";
    }
    return "?";
}

static cJSON *string_list(const char *const *a)
{
    cJSON *l = cJSON_CreateArray();
    for (int i = 0; a && a[i]; i++) cJSON_AddItemToArray(l, cJSON_CreateString(a[i]));
    return l;
}

cJSON *srv_structured_output_json(void)
{
    cJSON *r = cJSON_CreateObject();
    cJSON *f = cJSON_AddObjectToObject(r, "request_fields");
    cJSON_AddStringToObject(f, "response_format.type=json_object", kind_name(Q3_GRAMMAR_JSON));
    cJSON_AddStringToObject(f, "response_format.type=json_schema", kind_name(Q3_GRAMMAR_JSON_SCHEMA));
    cJSON_AddStringToObject(f, "tool_choice=required", kind_name(Q3_GRAMMAR_TOOL_CALL));
    cJSON_AddStringToObject(f, "tool_choice.function.name", kind_name(Q3_GRAMMAR_TOOL_CALL));
    for (size_t i = 0; i < sizeof direct / sizeof *direct; i++)
        cJSON_AddStringToObject(f, direct[i].name, kind_name(direct[i].kind));
    for (size_t i = 0; i < sizeof so_keys / sizeof *so_keys; i++) {
        char k[64];
        snprintf(k, sizeof k, "structured_outputs.%s", so_keys[i].name);
        cJSON_AddStringToObject(f, k, kind_name(so_keys[i].kind));
    }
    cJSON_AddNumberToObject(r, "constraints_per_request", 1);
    cJSON *js = cJSON_AddObjectToObject(r, "json_schema");
    cJSON_AddItemToObject(js, "keywords", string_list(q3_json_schema_keywords(Q3_SCHEMA_SUPPORTED)));
    cJSON_AddItemToObject(js, "formats", string_list(q3_json_schema_keywords(Q3_SCHEMA_FORMATS)));
    cJSON_AddItemToObject(js, "refused", string_list(q3_json_schema_keywords(Q3_SCHEMA_REFUSED)));
    cJSON_AddStringToObject(r, "docs", "docs/structured-output.md");
    return r;
}

/* The constraint fields every dialect spells its own way, one at most a request:
 * OpenAI's response_format (json_object, json_schema) and forced tool_choice,
 * llama-server's json_schema and grammar, vLLM's structured_outputs {json,
 * regex, choice, grammar} and the older guided_*. Compiles it (here, on the
 * HTTP thread, not the engine's) into j->req.grammar. tools: the request's
 * tools (chat), for a forced tool_choice. after_think: the model thinks first. */
static int parse_constraint(const srv_api *a, const cJSON *root, const cJSON *tools, int after_think, srv_job *j,
                            srv_err *e)
{
    q3_grammar_kind kind = Q3_GRAMMAR_JSON;
    const char *field = NULL;
    char *text = NULL; /* owned */
    int n = 0;
    const cJSON *v;
    v = cJSON_GetObjectItemCaseSensitive(root, "response_format");
    if (v && !cJSON_IsNull(v)) {
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(v, "type");
        if (!cJSON_IsObject(v) || !cJSON_IsString(t))
            return bad(e, "response_format", "response_format must be {\"type\": \"text\" | \"json_object\" | \"json_schema\", ...}");
        if (!strcmp(t->valuestring, "json_object")) {
            kind = Q3_GRAMMAR_JSON;
            field = "response_format";
            n++;
        } else if (!strcmp(t->valuestring, "json_schema")) {
            const cJSON *js = cJSON_GetObjectItemCaseSensitive(v, "json_schema");
            const cJSON *sc = cJSON_GetObjectItemCaseSensitive(js, "schema");
            if (!cJSON_IsObject(js) || !(cJSON_IsObject(sc) || cJSON_IsBool(sc)))
                return bad(e, "response_format", "response_format json_schema needs {\"json_schema\": {\"name\": ..., \"schema\": {...}}}");
            kind = Q3_GRAMMAR_JSON_SCHEMA;
            field = "response_format";
            text = cJSON_PrintUnformatted(sc);
            n++;
        } else if (strcmp(t->valuestring, "text")) {
            return bad(e, "response_format", "response_format type '%.40s' is not one of text, json_object, json_schema", t->valuestring);
        }
    }
    const cJSON *tc = cJSON_GetObjectItemCaseSensitive(root, "tool_choice");
    if (tools && tc && (cJSON_IsObject(tc) || (cJSON_IsString(tc) && !strcmp(tc->valuestring, "required")))) {
        cJSON *spec = cJSON_CreateObject();
        cJSON_AddItemToObject(spec, "tools", cJSON_Duplicate(tools, 1));
        if (cJSON_IsObject(tc)) {
            const cJSON *f = cJSON_GetObjectItemCaseSensitive(tc, "function");
            const cJSON *nm = cJSON_GetObjectItemCaseSensitive(f, "name");
            if (!cJSON_IsString(nm)) {
                cJSON_Delete(spec);
                free(text);
                return bad(e, "tool_choice", "tool_choice must be \"auto\", \"none\", \"required\" or {\"type\": \"function\", \"function\": {\"name\": ...}}");
            }
            cJSON_AddStringToObject(spec, "name", nm->valuestring);
        }
        free(text);
        text = cJSON_PrintUnformatted(spec);
        cJSON_Delete(spec);
        kind = Q3_GRAMMAR_TOOL_CALL;
        field = "tool_choice";
        n++;
    }
    const cJSON *so = cJSON_GetObjectItemCaseSensitive(root, "structured_outputs");
    if (so && !cJSON_IsNull(so) && !cJSON_IsObject(so)) {
        free(text);
        return bad(e, "structured_outputs", "structured_outputs must be an object: {json | regex | choice | grammar}");
    }
    for (int pass = 0; pass < 2; pass++) {
        int count = pass ? (int)(sizeof so_keys / sizeof so_keys[0]) : (int)(sizeof direct / sizeof direct[0]);
        for (int i = 0; i < count; i++) {
            const char *name = pass ? so_keys[i].name : direct[i].name;
            v = cJSON_GetObjectItemCaseSensitive(pass ? so : root, name);
            if (!v || cJSON_IsNull(v) || (pass && !so)) continue;
            if (pass && !strcmp(name, "json_object")) {
                if (!cJSON_IsTrue(v)) continue;
            }
            q3_grammar_kind k = pass ? so_keys[i].kind : direct[i].kind;
            char *t = NULL;
            if (k == Q3_GRAMMAR_JSON_SCHEMA && (cJSON_IsObject(v) || cJSON_IsBool(v))) t = cJSON_PrintUnformatted(v);
            else if (k == Q3_GRAMMAR_CHOICE && cJSON_IsArray(v)) t = cJSON_PrintUnformatted(v);
            else if (k == Q3_GRAMMAR_JSON) t = NULL;
            else if (cJSON_IsString(v) && k != Q3_GRAMMAR_CHOICE) t = strdup(v->valuestring);
            else {
                free(text);
                return bad(e, pass ? "structured_outputs" : name, "'%s%s%s' has the wrong type (a schema is an object, "
                           "a choice a list of strings, a regex or grammar a string)", pass ? "structured_outputs." : "",
                           name, "");
            }
            free(text);
            text = t;
            kind = k;
            field = pass ? "structured_outputs" : name;
            n++;
        }
    }
    if (n == 0) return 0;
    if (n > 1) {
        free(text);
        return bad(e, field, "give one constraint at most (response_format, a forced tool_choice, json_schema, grammar, "
                             "structured_outputs or guided_*): this request has %d", n);
    }
    q3_status st = q3_grammar_compile(a->tok, kind, text ? text : "", text ? strlen(text) : 0, &j->req.grammar);
    free(text);
    if (st == Q3_ERR_NOMEM) return srv_err_set(e, 500, "server_error", NULL, NULL, "out of memory");
    if (st) return bad(e, field, "%s", q3_last_error());
    j->req.grammar_flags = after_think ? Q3_MATCHER_AFTER_THINK : 0;
    return 0;
}

int srv_parse_chat(const srv_api *a, const char *body, size_t len, srv_job *j, srv_err *e)
{
    static const char *const known[] = {
        "model", "messages", "max_tokens", "max_completion_tokens", "temperature", "top_p", "top_k", "min_p",
        "presence_penalty", "frequency_penalty", "repetition_penalty", "seed", "stop", "stream", "stream_options",
        "chat_template_kwargs", "tools", "tool_choice", "parallel_tool_calls", "logprobs", "top_logprobs", "n",
        "user", "response_format", "logit_bias", "json_schema", "grammar", "structured_outputs", "guided_json",
        "guided_regex", "guided_choice", "guided_grammar", NULL};
    cJSON *root = srv_parse_body(a, body, len, e);
    if (!root) return e->status;
    int rc = check_body_fields(root, known, e);
    j->req.kind = SRV_CHAT;
    j->req.parse_reasoning = 1;
    int thinking = -1;
    const cJSON *kw = cJSON_GetObjectItemCaseSensitive(root, "chat_template_kwargs");
    if (!rc && kw && !cJSON_IsNull(kw)) {
        static const char *const kw_known[] = {"enable_thinking", NULL};
        if (!cJSON_IsObject(kw)) rc = bad(e, "chat_template_kwargs", "'chat_template_kwargs' must be an object");
        else if (!(rc = check_fields(kw, kw_known, e))) {
            int t = -1;
            rc = get_bool(kw, "enable_thinking", &t, e);
            thinking = t;
        }
    }
    const cJSON *tools = cJSON_GetObjectItemCaseSensitive(root, "tools");
    if (!rc && tools && !cJSON_IsNull(tools)) {
        if (!cJSON_IsArray(tools)) rc = bad(e, "tools", "'tools' must be a list");
        for (const cJSON *t = tools->child; !rc && t; t = t->next) {
            const cJSON *f = cJSON_GetObjectItemCaseSensitive(t, "function");
            const cJSON *nm = cJSON_GetObjectItemCaseSensitive(f, "name");
            if (!cJSON_IsObject(t) || !cJSON_IsObject(f) || !cJSON_IsString(nm))
                rc = bad(e, "tools", "each tool must be {\"type\": \"function\", \"function\": {\"name\": ...}}");
        }
        if (!rc && cJSON_GetArraySize(tools) == 0) tools = NULL;
    } else {
        tools = NULL;
    }
    const cJSON *tc = cJSON_GetObjectItemCaseSensitive(root, "tool_choice");
    if (!rc && tc && !cJSON_IsNull(tc)) {
        if (cJSON_IsString(tc) && !strcmp(tc->valuestring, "none")) tools = NULL;
        else if (cJSON_IsString(tc) && !strcmp(tc->valuestring, "required") && !tools)
            rc = bad(e, "tool_choice", "tool_choice \"required\" needs a non-empty 'tools' list");
        else if (cJSON_IsObject(tc) && !tools)
            rc = bad(e, "tool_choice", "a named tool_choice needs a non-empty 'tools' list");
        else if (!(cJSON_IsString(tc) && (!strcmp(tc->valuestring, "auto") || !strcmp(tc->valuestring, "required"))) &&
                 !cJSON_IsObject(tc))
            rc = bad(e, "tool_choice", "tool_choice must be \"auto\", \"none\", \"required\" or {\"type\": \"function\", \"function\": {\"name\": ...}}");
    }
    j->req.parse_tools = tools != NULL;
    if (!rc) rc = parse_constraint(a, root, tools, thinking != 0, j, e);
    if (!rc) rc = parse_common(a, root, j, thinking != 0, e);
    if (!rc) {
        const cJSON *msgs = cJSON_GetObjectItemCaseSensitive(root, "messages");
        if (!msgs) rc = bad(e, "messages", "'messages' is required");
        else rc = render_chat(a, msgs, tools, thinking, j, e);
    }
    if (!rc) rc = check_length(a, j, "messages", e);
    fill_ids(j, "chatcmpl");
    cJSON_Delete(root);
    return rc;
}

int srv_parse_completion(const srv_api *a, const char *body, size_t len, srv_job *j, srv_err *e)
{
    static const char *const known[] = {
        "model", "prompt", "max_tokens", "temperature", "top_p", "top_k", "min_p", "presence_penalty",
        "frequency_penalty", "repetition_penalty", "seed", "stop", "stream", "stream_options", "n", "user",
        "logprobs", "echo", "best_of", "suffix", "logit_bias", "response_format", "json_schema", "grammar",
        "structured_outputs", "guided_json", "guided_regex", "guided_choice", "guided_grammar", NULL};
    cJSON *root = srv_parse_body(a, body, len, e);
    if (!root) return e->status;
    j->req.kind = SRV_COMPLETION;
    int rc = check_body_fields(root, known, e);
    if (!rc) rc = parse_common(a, root, j, 0, e);
    if (!rc) rc = parse_constraint(a, root, NULL, 0, j, e);
    int echo = 0;
    long long best_of = 1;
    if (!rc && !(rc = get_bool(root, "echo", &echo, e)) && echo) rc = bad(e, "echo", "echo is not supported");
    if (!rc && !(rc = get_int(root, "best_of", 1, 1e9, &best_of, e)) && best_of != 1) rc = bad(e, "best_of", "best_of must be 1");
    const cJSON *sfx = cJSON_GetObjectItemCaseSensitive(root, "suffix");
    if (!rc && sfx && !cJSON_IsNull(sfx)) rc = bad(e, "suffix", "suffix is not supported");
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(root, "prompt");
    if (!rc) {
        if (cJSON_IsArray(p) && cJSON_GetArraySize(p) == 1 && cJSON_IsString(p->child)) p = p->child;
        if (cJSON_IsString(p)) {
            int32_t *ids = NULL;
            size_t n = 0;
            size_t len = strlen(p->valuestring), at_least = 0;
            if ((rc = too_long(a, len, "prompt", e))) {
            } else if (surely_too_long(a, p->valuestring, len, &at_least)) { /* tokenizing stops past the context */
                rc = srv_err_set(e, 400, "invalid_request_error", "context_length_exceeded", "prompt",
                                 "This model's maximum context length is %d tokens. However, your request has more than "
                                 "%zu input tokens. Please reduce the length of the input messages.", a->n_ctx, at_least);
            } else if (q3_tokenizer_encode(a->tok, p->valuestring, len, Q3_ENCODE_DEFAULT, &ids, &n)) {
                rc = bad(e, "prompt", "%s", q3_last_error());
            }
            j->req.prompt = ids;
            j->req.n_prompt = (int)n;
        } else if (cJSON_IsArray(p) && cJSON_GetArraySize(p) > 0 && cJSON_IsNumber(p->child)) {
            int n = cJSON_GetArraySize(p), k = 0;
            if (n > a->n_ctx) n = a->n_ctx; /* longer is refused below anyway */
            j->req.prompt = malloc((size_t)n * sizeof *j->req.prompt);
            if (!j->req.prompt) rc = srv_err_set(e, 500, "server_error", NULL, NULL, "out of memory");
            for (const cJSON *t = p->child; !rc && t; t = t->next, k++) {
                if (!cJSON_IsNumber(t) || t->valuedouble != floor(t->valuedouble) || t->valuedouble < 0 || t->valuedouble >= a->vocab)
                    rc = bad(e, "prompt", "prompt[%d] is not a token id in [0, %d)", k, a->vocab);
                else if (k < n) j->req.prompt[k] = (int32_t)t->valuedouble;
            }
            j->req.n_prompt = cJSON_GetArraySize(p);
        } else {
            rc = bad(e, "prompt", "'prompt' must be a string or a non-empty list of token ids");
        }
    }
    if (!rc) rc = check_length(a, j, "prompt", e);
    fill_ids(j, "cmpl");
    cJSON_Delete(root);
    return rc;
}

int srv_parse_llama_completion(const srv_api *a, const char *body, size_t len, srv_job *j, srv_err *e)
{
    int rc = srv_parse_completion(a, body, len, j, e);
    j->req.kind = SRV_LLAMA_COMPLETION;
    return rc;
}

/* ---- tokenize / detokenize / models ----------------------------------------- */

int srv_tokenize(const srv_api *a, const char *body, size_t len, srv_buf *out, srv_err *e)
{
    static const char *const known[] = {"model", "prompt", "messages", "add_special_tokens", "add_generation_prompt",
                                        "chat_template_kwargs", "tools", "content", "add_special", NULL};
    cJSON *root = srv_parse_body(a, body, len, e);
    if (!root) return e->status;
    int rc = check_fields(root, known, e);
    srv_job *j = srv_job_new();
    if (!j) rc = srv_err_set(e, 500, "server_error", NULL, NULL, "out of memory");
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(root, "prompt"), *m = cJSON_GetObjectItemCaseSensitive(root, "messages");
    if (!p) p = cJSON_GetObjectItemCaseSensitive(root, "content"); /* llama.cpp's name for it */
    int add_special = 0; /* llama.cpp's: a BOS where the model wants one; Qwen3's tokenizer adds none, so no change */
    if (!rc) rc = get_bool(root, "add_special", &add_special, e);
    if (!rc) {
        if (cJSON_IsString(p)) {
            int32_t *ids = NULL;
            size_t n = 0;
            if ((rc = too_long(a, strlen(p->valuestring), "prompt", e))) {
            } else if (q3_tokenizer_encode(a->tok, p->valuestring, strlen(p->valuestring), Q3_ENCODE_DEFAULT, &ids, &n)) {
                rc = bad(e, "prompt", "%s", q3_last_error());
            }
            j->req.prompt = ids;
            j->req.n_prompt = (int)n;
        } else if (m) {
            int thinking = -1;
            const cJSON *kw = cJSON_GetObjectItemCaseSensitive(root, "chat_template_kwargs");
            const cJSON *et = cJSON_GetObjectItemCaseSensitive(kw, "enable_thinking");
            if (cJSON_IsBool(et)) thinking = cJSON_IsTrue(et);
            const cJSON *tools = cJSON_GetObjectItemCaseSensitive(root, "tools");
            rc = render_chat(a, m, cJSON_IsArray(tools) ? tools : NULL, thinking, j, e);
        } else {
            rc = bad(e, "prompt", "'prompt' (or 'content', a string) or 'messages' is required");
        }
    }
    if (!rc) { /* written straight into the buffer: a long prompt is no cJSON node per token */
        srv_buf_puts(out, "{\"tokens\":[");
        char num[16];
        for (int i = 0; i < j->req.n_prompt; i++) {
            int k = snprintf(num, sizeof num, i ? ",%d" : "%d", (int)j->req.prompt[i]);
            srv_buf_put(out, num, (size_t)k);
        }
        srv_buf_printf(out, "],\"count\":%d,\"max_model_len\":%d}", j->req.n_prompt, a->n_ctx);
    }
    if (j) srv_job_unref(j);
    cJSON_Delete(root);
    return rc;
}

int srv_detokenize(const srv_api *a, const char *body, size_t len, srv_buf *out, srv_err *e)
{
    static const char *const known[] = {"model", "tokens", NULL};
    cJSON *root = srv_parse_body(a, body, len, e);
    if (!root) return e->status;
    int rc = check_fields(root, known, e);
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(root, "tokens");
    if (!rc && !cJSON_IsArray(t)) rc = bad(e, "tokens", "'tokens' must be a list of token ids");
    int n = rc ? 0 : cJSON_GetArraySize(t), k = 0;
    if (!rc && n > a->n_ctx) /* more than a sequence of this server holds: its text is at most n_ctx times the longest token's bytes */
        rc = srv_err_set(e, 400, "invalid_request_error", "context_length_exceeded", "tokens",
                         "This model's maximum context length is %d tokens. However, 'tokens' holds %d tokens.", a->n_ctx, n);
    int32_t *ids = malloc((size_t)(n ? n : 1) * sizeof *ids);
    if (!rc && !ids) rc = srv_err_set(e, 500, "server_error", NULL, NULL, "out of memory");
    for (const cJSON *x = rc ? NULL : t->child; x && !rc; x = x->next, k++) {
        if (!cJSON_IsNumber(x) || x->valuedouble != floor(x->valuedouble) || x->valuedouble < 0 || x->valuedouble >= a->vocab ||
            q3_tokenizer_piece(a->tok, (int32_t)x->valuedouble, &(const char *){NULL}, &(size_t){0}))
            rc = bad(e, "tokens", "tokens[%d] is not a token id of this tokenizer", k);
        else ids[k] = (int32_t)x->valuedouble;
    }
    if (!rc) {
        char *text = NULL;
        size_t tl = 0;
        if (q3_tokenizer_decode(a->tok, ids, (size_t)n, &text, &tl)) {
            rc = bad(e, "tokens", "%s", q3_last_error());
        } else {
            /* lossy, as Hugging Face decodes: bytes that are not UTF-8 become U+FFFD */
            q3_detokenizer *d = NULL;
            srv_buf s = {0};
            const char *piece;
            size_t pl;
            if (q3_detokenizer_new(a->tok, &d)) s.oom = 1;
            for (int i = 0; d && i < n; i++)
                if (!q3_detokenizer_push(d, ids[i], &piece, &pl)) srv_buf_put(&s, piece, pl);
            if (d && !q3_detokenizer_flush(d, &piece, &pl)) srv_buf_put(&s, piece, pl);
            q3_detokenizer_free(d);
            if (s.oom) out->oom = 1;
            /* NUL bytes (token 188 is one) stay in the text; content: llama-server's name for it */
            srv_buf_puts(out, "{\"prompt\":");
            srv_json_string(out, s.data, s.len);
            srv_buf_puts(out, ",\"content\":");
            srv_json_string(out, s.data, s.len);
            srv_buf_puts(out, "}");
            free(s.data);
            free(text);
        }
    }
    free(ids);
    cJSON_Delete(root);
    return rc;
}

static cJSON *model_object(const srv_api *a, long long created)
{
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "id", a->model_name);
    cJSON_AddStringToObject(m, "object", "model");
    cJSON_AddNumberToObject(m, "created", (double)created);
    cJSON_AddStringToObject(m, "owned_by", "q3");
    cJSON_AddNumberToObject(m, "max_model_len", a->n_ctx);
    return m;
}

void srv_models_json(const srv_api *a, long long created, srv_buf *out)
{
    cJSON *r = cJSON_CreateObject();
    cJSON_AddStringToObject(r, "object", "list");
    cJSON_AddItemToArray(cJSON_AddArrayToObject(r, "data"), model_object(a, created));
    srv_put_json(out, r);
    cJSON_Delete(r);
}

void srv_model_json(const srv_api *a, long long created, srv_buf *out)
{
    cJSON *m = model_object(a, created);
    srv_put_json(out, m);
    cJSON_Delete(m);
}
