/* Constrained generation on the random-weight e2e model (Qwen3's vocabulary):
 * at temperature 1, many seeds, the output always parses and validates (checked
 * by hand-written rules, not by the grammar); a finished grammar ends the
 * sequence with an end-of-turn token; the thinking phase; and batch
 * invariance: a constrained sequence makes the same tokens alone and in a batch
 * with other constrained and unconstrained sequences. */
#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

#include "q3.h"
#include "test.h"

#define MODEL TEST_DATA "/golden/e2e"

static q3_model *model;
static q3_tokenizer *tok;

static const char *SCHEMA =
    "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"maxLength\":8},"
    "\"n\":{\"type\":\"integer\",\"minimum\":-5,\"maximum\":500},"
    "\"tags\":{\"type\":\"array\",\"items\":{\"enum\":[\"x\",\"y\",\"z\"]},\"maxItems\":3},"
    "\"ok\":{\"type\":\"boolean\"},\"when\":{\"type\":\"string\",\"format\":\"date\"}},"
    "\"required\":[\"name\",\"n\",\"tags\",\"ok\"],\"additionalProperties\":false}";

/* The schema above, checked by hand. */
static int valid(const char *text)
{
    cJSON *j = cJSON_Parse(text);
    int ok = cJSON_IsObject(j);
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(j, "name"), *n = cJSON_GetObjectItemCaseSensitive(j, "n"),
                *tags = cJSON_GetObjectItemCaseSensitive(j, "tags"), *b = cJSON_GetObjectItemCaseSensitive(j, "ok"),
                *when = cJSON_GetObjectItemCaseSensitive(j, "when");
    ok = ok && cJSON_IsString(name) && cJSON_IsNumber(n) && n->valuedouble >= -5 && n->valuedouble <= 500 &&
         n->valuedouble == (double)(long)n->valuedouble && cJSON_IsArray(tags) && cJSON_GetArraySize(tags) <= 3 &&
         cJSON_IsBool(b);
    if (ok) { /* maxLength counts code points */
        int cps = 0;
        for (const unsigned char *p = (const unsigned char *)name->valuestring; *p; p++) cps += (*p & 0xC0) != 0x80;
        ok = cps <= 8;
    }
    const cJSON *t;
    cJSON_ArrayForEach(t, tags) ok = ok && cJSON_IsString(t) && strlen(t->valuestring) == 1 && strchr("xyz", t->valuestring[0]);
    if (when) ok = ok && cJSON_IsString(when) && strlen(when->valuestring) == 10 && when->valuestring[4] == '-';
    int members = 0;
    for (const cJSON *c = j ? j->child : NULL; c; c = c->next) members++;
    ok = ok && members == 4 + (when != NULL);
    cJSON_Delete(j);
    return ok;
}

typedef struct run {
    q3_sampler *smp;
    q3_matcher *m;
    q3_gen *g;
    int seq;
} run;

static int start_logprobs; /* start() asks for log-probabilities (the mask then goes on after the raw row is read) */

static int start(q3_ctx *c, run *r, q3_grammar *G, unsigned flags, uint64_t seed, const char *prompt, int max_tokens)
{
    memset(r, 0, sizeof *r);
    q3_sampler_params sp = q3_sampler_defaults(0);
    sp.temperature = 1.0f;
    sp.top_k = 0;
    sp.top_p = 1.0f;
    sp.seed = seed;
    int32_t *ids = NULL;
    size_t n = 0;
    q3_chat_message msg = {"user", prompt};
    q3_chat_opts co = q3_chat_opts_default();
    co.enable_thinking = flags ? 1 : 0;
    if (q3_sampler_new(&sp, q3_model_vocab_size(model), &r->smp) || (G && q3_matcher_new(G, flags, &r->m)) ||
        q3_seq_new(c, &r->seq) || q3_chat_tokenize(tok, &msg, 1, &co, &ids, &n))
        return -1;
    q3_gen_opts o = q3_gen_opts_default();
    o.max_tokens = max_tokens;
    o.grammar = r->m;
    o.split_channels = 1;
    o.logprobs = start_logprobs;
    int rc = q3_gen_new(c, r->seq, r->smp, tok, &o, &r->g) || q3_gen_prompt(r->g, ids, n) ? -1 : 0;
    free(ids);
    return rc;
}

static void finish(q3_ctx *c, run *r)
{
    q3_gen_free(r->g);
    q3_matcher_free(r->m);
    q3_sampler_free(r->smp);
    q3_seq_drop(c, r->seq);
}

static void step_all(run *rs, int n)
{
    q3_gen *gens[8];
    for (int i = 0; i < n; i++) gens[i] = rs[i].g;
    for (int guard = 0; guard < 100000; guard++) {
        int live = 0;
        for (int i = 0; i < n; i++) live += !q3_gen_done(gens[i]);
        if (!live) return;
        if (q3_gen_step(gens, n)) {
            CHECK(0, "step: %s", q3_last_error());
            return;
        }
    }
}

/* The generated text (the end-of-turn token left out), malloc'd. */
static char *text_of(const q3_gen_result *res)
{
    int n = res->n_ids;
    if (n && (res->ids[n - 1] == q3_tokenizer_end_of_turn(tok) || res->ids[n - 1] == q3_tokenizer_end_of_text(tok))) n--;
    char *t = NULL;
    size_t len;
    q3_tokenizer_decode(tok, res->ids, (size_t)n, &t, &len);
    return t;
}

static void test_soundness(q3_grammar *G)
{
    q3_ctx_opts co = q3_ctx_opts_default();
    co.max_seqs = 1;
    co.n_ctx = 1024;
    q3_ctx *c;
    if (q3_ctx_new(model, &co, &c)) {
        CHECK(0, "ctx: %s", q3_last_error());
        return;
    }
    int complete = 0, seeds = 24;
    for (int seed = 1; seed <= seeds; seed++) {
        run r;
        if (start(c, &r, G, 0, (uint64_t)seed, "Give me a record.", 300)) {
            CHECK(0, "start: %s", q3_last_error());
            break;
        }
        step_all(&r, 1);
        const q3_gen_result *res = q3_gen_result_get(r.g);
        char *text = text_of(res);
        /* whatever stopped it, the text is a prefix of the language; ended by the turn, it is complete */
        q3_matcher *check;
        q3_matcher_new(G, 0, &check);
        size_t ok = 0;
        q3_status st = q3_matcher_accept_bytes(check, text, strlen(text), &ok);
        CHECK(st == Q3_OK, "seed %d: output rejected at byte %zu: %s", seed, ok, text);
        CHECK(res->stop == Q3_STOP_END_OF_TURN || res->stop == Q3_STOP_LENGTH, "seed %d: stop %s (%s)", seed,
              q3_stop_reason_name(res->stop), q3_gen_error(r.g));
        if (res->stop == Q3_STOP_END_OF_TURN) {
            complete++;
            CHECK(valid(text), "seed %d: output does not validate: %s", seed, text);
            CHECK(q3_matcher_state(check) != Q3_MATCH_OPEN, "seed %d: ended before the grammar was complete", seed);
        }
        q3_matcher_free(check);
        free(text);
        finish(c, &r);
    }
    printf("soundness: %d of %d seeds ended complete within 300 tokens, all valid\n", complete, seeds);
    CHECK(complete >= seeds / 2, "only %d of %d seeds ended", complete, seeds);
    q3_ctx_free(c);
}

static void test_thinking(q3_grammar *G)
{
    q3_ctx_opts co = q3_ctx_opts_default();
    co.n_ctx = 1024;
    q3_ctx *c;
    if (q3_ctx_new(model, &co, &c)) return;
    /* the random model rarely closes its thinking: the output may not end before </think> */
    run r;
    if (!start(c, &r, G, Q3_MATCHER_AFTER_THINK, 5, "Think first.", 40)) {
        step_all(&r, 1);
        const q3_gen_result *res = q3_gen_result_get(r.g);
        int32_t close = q3_tokenizer_token_id(tok, "</think>", 8);
        int closed = 0;
        for (int i = 0; i < res->n_ids; i++) closed |= res->ids[i] == close;
        CHECK(closed || res->stop == Q3_STOP_LENGTH, "ended (%s) without closing the thinking", q3_stop_reason_name(res->stop));
    }
    finish(c, &r);
    q3_ctx_free(c);
}

static void test_batch_invariance(q3_grammar *G, q3_grammar *G2)
{
    q3_ctx_opts co = q3_ctx_opts_default();
    co.max_seqs = 4;
    co.n_ctx = 512;
    co.n_threads = 2; /* two threads: a batch's masks are computed and applied on them (masks_in_parallel) */
    q3_ctx *c;
    if (q3_ctx_new(model, &co, &c)) {
        CHECK(0, "ctx: %s", q3_last_error());
        return;
    }
    run alone;
    int32_t ids[256];
    int n_alone = 0;
    if (!start(c, &alone, G, 0, 77, "One record please.", 120)) {
        step_all(&alone, 1);
        const q3_gen_result *res = q3_gen_result_get(alone.g);
        n_alone = res->n_ids;
        memcpy(ids, res->ids, (size_t)n_alone * sizeof *ids);
    }
    finish(c, &alone);
    run rs[3];
    int ok = !start(c, &rs[0], G2, 0, 3, "Another thing.", 120) && !start(c, &rs[1], G, 0, 77, "One record please.", 120) &&
             !start(c, &rs[2], NULL, 0, 9, "Free text.", 60);
    CHECK(ok, "start: %s", q3_last_error());
    if (ok) {
        step_all(rs, 3);
        const q3_gen_result *res = q3_gen_result_get(rs[1].g);
        CHECK(res->n_ids == n_alone && !memcmp(res->ids, ids, (size_t)n_alone * sizeof *ids),
              "a constrained sequence made other tokens in a batch (%d vs %d alone)", res->n_ids, n_alone);
    }
    for (int i = 0; i < 3; i++) finish(c, &rs[i]);
    /* the same sequence twice beside another constrained one: with log-probabilities (its mask goes on
       after the raw row is read, in the step's serial part) and without (on the step's threads) */
    start_logprobs = 1;
    ok = !start(c, &rs[0], G, 0, 77, "One record please.", 120);
    start_logprobs = 0;
    ok = ok && !start(c, &rs[1], G2, 0, 3, "Another thing.", 120) && !start(c, &rs[2], G, 0, 77, "One record please.", 120);
    CHECK(ok, "start: %s", q3_last_error());
    if (ok) {
        step_all(rs, 3);
        for (int i = 0; i < 3; i += 2) {
            const q3_gen_result *res = q3_gen_result_get(rs[i].g);
            CHECK(res->n_ids == n_alone && !memcmp(res->ids, ids, (size_t)n_alone * sizeof *ids),
                  "a constrained sequence (log-probabilities %s) made other tokens in a batch (%d vs %d alone)",
                  i ? "off" : "on", res->n_ids, n_alone);
        }
    }
    for (int i = 0; i < 3; i++) finish(c, &rs[i]);
    q3_ctx_free(c);
}

int main(void)
{
    if (q3_model_open(MODEL, &model) || q3_tokenizer_load(MODEL "/tokenizer.json", &tok)) {
        CHECK(0, "model: %s", q3_last_error());
        TEST_DONE();
    }
    q3_grammar *G = NULL, *G2 = NULL;
    CHECK(q3_grammar_compile(tok, Q3_GRAMMAR_JSON_SCHEMA, SCHEMA, strlen(SCHEMA), &G) == Q3_OK, "%s", q3_last_error());
    const char *choice = "[\"alpha\", \"beta\", \"gamma delta\"]";
    CHECK(q3_grammar_compile(tok, Q3_GRAMMAR_CHOICE, choice, strlen(choice), &G2) == Q3_OK, "%s", q3_last_error());
    if (G && G2) {
        test_soundness(G);
        test_thinking(G);
        test_batch_invariance(G, G2);
    }
    q3_grammar_free(G);
    q3_grammar_free(G2);
    q3_tokenizer_free(tok);
    q3_model_close(model);
    TEST_DONE();
}
