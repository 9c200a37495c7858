/* The library refuses misuse (issue 27), through the public API only: the
 * NULL rule of q3.h (a NULL handle or out-pointer fails with Q3_ERR_INVALID,
 * frees and void calls ignore it, getters answer 0 / -1 / NULL), negative
 * counts and unknown flags refused, a generator whose sequence was dropped
 * (and its id reused) refused, out-of-vocabulary prompt ids refused up front,
 * two threads on one context detected, and a NaN logit refused by the sampler
 * and ending a generation with Q3_STOP_ERROR. Model: the e2e golden model. */
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "q3.h"
#include "test.h"

#define E2E TEST_DATA "/golden/e2e"

static q3_model *model;
static q3_tokenizer *tok;

#define REFUSED(call, what) CHECK((call) == Q3_ERR_INVALID && strstr(q3_last_error(), "NULL"), "%s: %s", what, q3_last_error())

static void null_rule(void)
{
    q3_ctx *c = (q3_ctx *)1;
    REFUSED(q3_ctx_new(NULL, NULL, &c), "q3_ctx_new(NULL model)");
    CHECK(c == NULL, "q3_ctx_new clears *out");
    REFUSED(q3_ctx_new(model, NULL, NULL), "q3_ctx_new(NULL out)");
    REFUSED(q3_ctx_step(NULL, &(q3_step){.prefill_seq = -1}), "q3_ctx_step(NULL ctx)");
    q3_ctx_opts co = q3_ctx_opts_default();
    co.n_ctx = 64;
    co.max_seqs = 2;
    CHECK(q3_ctx_new(model, &co, &c) == Q3_OK, "a context: %s", q3_last_error());
    REFUSED(q3_ctx_step(c, NULL), "q3_ctx_step(c, NULL)");
    REFUSED(q3_seq_new(c, NULL), "q3_seq_new(c, NULL)");
    REFUSED(q3_seq_new(NULL, &(int){0}), "q3_seq_new(NULL)");
    REFUSED(q3_seq_fork(c, 0, NULL), "q3_seq_fork(c, 0, NULL)");
    REFUSED(q3_seq_truncate(NULL, 0, 0), "q3_seq_truncate(NULL)");
    q3_seq_drop(NULL, 0);
    CHECK(q3_seq_pos(NULL, 0) == -1 && q3_ctx_n_ctx(NULL) == 0 && q3_ctx_max_seqs(NULL) == 0 && q3_ctx_chunk(NULL) == 0,
          "context getters of NULL");
    CHECK(q3_seq_reuse_prefix(NULL, 0, NULL, 4) == 0, "q3_seq_reuse_prefix(NULL)");
    int u = 7, ca = 7, t = 7, bt = 7;
    q3_ctx_kv_usage(NULL, &u, &ca, &t, &bt);
    CHECK(u == 0 && ca == 0 && t == 0 && bt == 0, "q3_ctx_kv_usage(NULL)");

    q3_sampler_params sp = q3_sampler_defaults(0);
    q3_sampler *smp;
    REFUSED(q3_sampler_new(NULL, 10, &smp), "q3_sampler_new(NULL params)");
    REFUSED(q3_sampler_new(&sp, 10, NULL), "q3_sampler_new(NULL out)");
    REFUSED(q3_sampler_params_check(NULL), "q3_sampler_params_check(NULL)");
    CHECK(q3_sampler_new(&sp, q3_model_vocab_size(model), &smp) == Q3_OK, "a sampler");
    CHECK(q3_sampler_sample(smp, NULL) == -1 && strstr(q3_last_error(), "NULL"), "q3_sampler_sample(s, NULL): %s", q3_last_error());
    CHECK(q3_sampler_sample(NULL, NULL) == -1, "q3_sampler_sample(NULL)");
    const int32_t *ids;
    const float *probs;
    CHECK(q3_sampler_candidates(smp, NULL, &ids, &probs) == 0 && ids == NULL, "q3_sampler_candidates(s, NULL)");
    q3_sampler_accept(NULL, 1);
    q3_sampler_reset(NULL);
    q3_sampler_apply_penalties(NULL, NULL);
    q3_sampler_free(NULL);

    q3_detokenizer *d = (q3_detokenizer *)1;
    REFUSED(q3_detokenizer_new(NULL, &d), "q3_detokenizer_new(NULL tokenizer)");
    CHECK(d == NULL, "q3_detokenizer_new clears *out");
    const char *text;
    size_t len;
    REFUSED(q3_detokenizer_push(NULL, 1, &text, &len), "q3_detokenizer_push(NULL)");
    REFUSED(q3_detokenizer_flush(NULL, &text, &len), "q3_detokenizer_flush(NULL)");
    int32_t *out_ids;
    size_t n_ids;
    REFUSED(q3_tokenizer_encode(NULL, "a", 1, 0, &out_ids, &n_ids), "q3_tokenizer_encode(NULL)");
    REFUSED(q3_tokenizer_encode(tok, NULL, 3, 0, &out_ids, &n_ids), "q3_tokenizer_encode(text NULL, len 3)");
    REFUSED(q3_tokenizer_encode(tok, "a", 1, 0, NULL, &n_ids), "q3_tokenizer_encode(NULL ids)");
    char *dec;
    REFUSED(q3_tokenizer_decode(NULL, (int32_t[]){1}, 1, &dec, &len), "q3_tokenizer_decode(NULL)");
    REFUSED(q3_tokenizer_piece(NULL, 1, &text, &len), "q3_tokenizer_piece(NULL)");
    CHECK(q3_tokenizer_vocab_size(NULL) == 0 && q3_tokenizer_token_id(NULL, "a", 1) == -1 && q3_tokenizer_is_special(NULL, 1) == 0,
          "tokenizer getters of NULL");
    REFUSED(q3_tokenizer_load(NULL, &(q3_tokenizer *){NULL}), "q3_tokenizer_load(NULL)");
    REFUSED(q3_model_open("x", NULL), "q3_model_open(path, NULL)");
    REFUSED(q3_chat_tokenize(NULL, NULL, 0, NULL, &out_ids, &n_ids), "q3_chat_tokenize(NULL)");
    REFUSED(q3_chat_tokenize_json(tok, NULL, 0, 0, &out_ids, &n_ids), "q3_chat_tokenize_json(json NULL)");
    int present;
    REFUSED(q3_model_chat_template_check(NULL, &present), "q3_model_chat_template_check(NULL)");
    CHECK(q3_model_vocab_size(NULL) == 0 && q3_model_max_context(NULL) == 0, "model getters of NULL");
    /* unknown flags */
    CHECK(q3_tokenizer_encode(tok, "a", 1, 1u << 7, &out_ids, &n_ids) == Q3_ERR_INVALID, "encode flags 0x80 refused");
    CHECK(q3_chat_tokenize_json(tok, "[]", 2, 1u << 5, &out_ids, &n_ids) == Q3_ERR_INVALID, "chat flags 0x20 refused");

    /* generators */
    int seq;
    CHECK(q3_seq_new(c, &seq) == Q3_OK, "a sequence");
    q3_gen *g = (q3_gen *)1;
    REFUSED(q3_gen_new(NULL, seq, smp, tok, NULL, &g), "q3_gen_new(NULL ctx)");
    REFUSED(q3_gen_new(c, seq, NULL, tok, NULL, &g), "q3_gen_new(NULL sampler)");
    REFUSED(q3_gen_new(c, seq, smp, tok, NULL, NULL), "q3_gen_new(NULL out)");
    q3_gen_opts o = q3_gen_opts_default();
    o.n_stop = 2;
    CHECK(q3_gen_new(c, seq, smp, tok, &o, &g) == Q3_ERR_INVALID && g == NULL, "stop NULL, n_stop 2: %s", q3_last_error());
    o = q3_gen_opts_default();
    o.n_stop = -1;
    CHECK(q3_gen_new(c, seq, smp, tok, &o, &g) == Q3_ERR_INVALID, "n_stop -1: %s", q3_last_error());
    o = q3_gen_opts_default();
    o.max_tokens = -5;
    CHECK(q3_gen_new(c, seq, smp, tok, &o, &g) == Q3_ERR_INVALID, "max_tokens -5: %s", q3_last_error());
    o = q3_gen_opts_default();
    o.split_channels = 7;
    CHECK(q3_gen_new(c, seq, smp, tok, &o, &g) == Q3_ERR_INVALID, "split_channels 7: %s", q3_last_error());
    REFUSED(q3_gen_step(NULL, 1), "q3_gen_step(NULL, 1)");
    REFUSED(q3_gen_step((q3_gen *[]){NULL}, 1), "q3_gen_step({NULL}, 1)");
    REFUSED(q3_gen_prompt(NULL, (int32_t[]){1}, 1), "q3_gen_prompt(NULL)");
    CHECK(q3_gen_done(NULL) == 1 && q3_gen_prefilling(NULL) == 0 && q3_gen_result_get(NULL) == NULL && q3_gen_seq(NULL) == -1 &&
          !strcmp(q3_gen_error(NULL), "") && q3_gen_logprobs(NULL, NULL) == NULL, "generator getters of NULL");
    q3_gen_cancel(NULL, Q3_STOP_CANCEL);
    q3_gen_free(NULL);
    q3_gen_result r;
    REFUSED(q3_generate(NULL, smp, tok, (int32_t[]){1}, 1, NULL, &r), "q3_generate(NULL session)");
    q3_sampler_free(smp);
    q3_ctx_free(c);
}

/* Item 6 and 14: a dropped sequence's generator, and ids outside the vocabulary. */
static void dropped_and_ids(void)
{
    q3_ctx_opts co = q3_ctx_opts_default();
    co.n_ctx = 64;
    co.max_seqs = 2;
    q3_ctx *c;
    q3_sampler_params sp = q3_sampler_defaults(0);
    sp.temperature = 0;
    q3_sampler *smp;
    if (q3_ctx_new(model, &co, &c) || q3_sampler_new(&sp, q3_model_vocab_size(model), &smp)) {
        CHECK(0, "setup: %s", q3_last_error());
        return;
    }
    int a, b;
    q3_gen *g;
    int32_t prompt[] = {9707, 11, 1879};
    CHECK(q3_seq_new(c, &a) == Q3_OK && q3_gen_new(c, a, smp, NULL, NULL, &g) == Q3_OK, "a generator");
    int32_t bad[] = {9707, q3_model_vocab_size(model), 11};
    CHECK(q3_gen_prompt(g, bad, 3) == Q3_ERR_INVALID && strstr(q3_last_error(), "vocabulary"), "an id past the vocabulary refused: %s",
          q3_last_error());
    int32_t neg[] = {-1};
    CHECK(q3_gen_prompt(g, neg, 1) == Q3_ERR_INVALID, "a negative id refused");
    CHECK(q3_gen_prompt(g, prompt, 3) == Q3_OK && q3_gen_step(&g, 1) == Q3_OK && q3_gen_step(&g, 1) == Q3_OK, "two steps");
    q3_seq_drop(c, a);
    CHECK(q3_seq_new(c, &b) == Q3_OK && b == a, "the id is reused: %d %d", a, b);
    q3_status st = q3_gen_step(&g, 1);
    CHECK(st == Q3_ERR_INVALID && strstr(q3_last_error(), "dropped"), "the old generator is refused: %s", q3_last_error());
    CHECK(q3_seq_pos(c, b) == 0, "the new sequence is untouched: position %d", q3_seq_pos(c, b));
    CHECK(q3_gen_prompt(g, prompt, 3) == Q3_ERR_INVALID, "and cannot be given a new prompt");
    q3_gen_free(g);
    q3_sampler_free(smp);
    q3_ctx_free(c);
}

/* Item 7: two threads on one context. */
typedef struct racer {
    q3_ctx *c;
    int seq;
    int refused;
    char msg[256];
    double until;
} racer;

static double now(void) { return q3_now(); }

static void *race_main(void *arg)
{
    racer *r = arg;
    int32_t toks[16];
    for (int i = 0; i < 16; i++) toks[i] = 100 + i + r->seq;
    while (now() < r->until && !r->refused) {
        q3_step s = {.prefill_seq = r->seq, .prefill_tokens = toks, .n_prefill = 16};
        q3_status st = q3_ctx_step(r->c, &s);
        if (st == Q3_ERR_INVALID) {
            r->refused = 1;
            snprintf(r->msg, sizeof r->msg, "%s", q3_last_error());
        } else if (st == Q3_OK) {
            q3_seq_truncate(r->c, r->seq, 0);
        }
    }
    return NULL;
}

static void two_threads(void)
{
    q3_ctx_opts co = q3_ctx_opts_default();
    co.n_ctx = 64;
    co.max_seqs = 2;
    co.chunk = 16;
    q3_ctx *c;
    if (q3_ctx_new(model, &co, &c)) {
        CHECK(0, "setup: %s", q3_last_error());
        return;
    }
    racer r[2] = {{.c = c}, {.c = c}};
    q3_seq_new(c, &r[0].seq);
    q3_seq_new(c, &r[1].seq);
    r[0].until = r[1].until = now() + 5;
    pthread_t th[2];
    for (int i = 0; i < 2; i++) pthread_create(&th[i], NULL, race_main, &r[i]);
    for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
    const char *msg = r[0].refused ? r[0].msg : r[1].msg;
    CHECK(r[0].refused || r[1].refused, "two threads stepping one context: one is refused");
    CHECK(strstr(msg, "another thread"), "the message says why: %s", msg);
    q3_seq_drop(c, r[0].seq);
    q3_seq_drop(c, r[1].seq);
    int used, cached, total, bt;
    q3_ctx_kv_usage(c, &used, &cached, &total, &bt);
    CHECK(used == 0, "the KV accounting holds: %d blocks used after both dropped", used);
    q3_ctx_free(c);
}

/* One NaN logit: refused by the sampler, the generation ends with the reason. */
static q3_status poison(void *user, q3_gen *g, float *logits, int n_vocab)
{
    logits[n_vocab / 2] = NAN;
    return Q3_OK;
}

static void nan_logits(void)
{
    int V = q3_model_vocab_size(model);
    q3_sampler_params sp = q3_sampler_defaults(0);
    sp.top_k = 0;
    sp.top_p = 1;
    sp.temperature = 1;
    q3_sampler *smp;
    q3_sampler_new(&sp, V, &smp);
    float *row = calloc((size_t)V, sizeof *row);
    row[V / 3] = NAN;
    CHECK(q3_sampler_sample(smp, row) == -1 && strstr(q3_last_error(), "NaN"), "a NaN logit refused: %s", q3_last_error());
    const int32_t *ids;
    const float *probs;
    CHECK(q3_sampler_candidates(smp, row, &ids, &probs) == 0, "no candidates of a NaN row");
    row[V / 3] = INFINITY;
    CHECK(q3_sampler_sample(smp, row) == -1 && strstr(q3_last_error(), "+inf"), "a +inf logit refused: %s", q3_last_error());
    for (int i = 0; i < V; i++) row[i] = -INFINITY;
    CHECK(q3_sampler_sample(smp, row) == -1, "every logit -inf refused");
    row[5] = 0;
    CHECK(q3_sampler_sample(smp, row) == 5, "one allowed token is drawn");
    free(row);

    q3_ctx_opts co = q3_ctx_opts_default();
    co.n_ctx = 64;
    q3_ctx *c;
    int seq;
    q3_gen *g;
    q3_gen_opts o = q3_gen_opts_default();
    o.on_logits = poison;
    o.max_tokens = 4;
    if (q3_ctx_new(model, &co, &c) || q3_seq_new(c, &seq) || q3_gen_new(c, seq, smp, tok, &o, &g)) {
        CHECK(0, "setup: %s", q3_last_error());
        q3_sampler_free(smp);
        return;
    }
    q3_gen_prompt(g, (int32_t[]){9707, 11}, 2);
    while (!q3_gen_done(g))
        if (q3_gen_step(&g, 1)) break;
    CHECK(q3_gen_done(g) && q3_gen_result_get(g)->stop == Q3_STOP_ERROR && strstr(q3_gen_error(g), "NaN") &&
          q3_gen_result_get(g)->n_ids == 0, "a NaN row ends the generation: %s, %d tokens", q3_gen_error(g), q3_gen_result_get(g)->n_ids);
    q3_gen_free(g);
    q3_ctx_free(c);
    q3_sampler_free(smp);
}

int main(void)
{
    if (q3_model_open(E2E, &model) || q3_tokenizer_load(E2E, &tok)) {
        printf("cannot open %s: %s\n", E2E, q3_last_error());
        printf("0 passed, 1 failed\n");
        return 1;
    }
    null_rule();
    dropped_and_ids();
    two_threads();
    nan_logits();
    q3_tokenizer_free(tok);
    q3_model_close(model);
    TEST_DONE();
}
