/* The generation loop's hooks, through the public API only (q3.h): the
 * logits processor (a script that forces each next token), on_token,
 * channel splitting by token id with its edges and newline shaping, stop
 * strings across channels, logprob capture against the raw row, the
 * frequency penalty, q3_gen_prompt_from, option structs' size field, and
 * Q3_STOP_ERROR from a failing processor. Model: the e2e golden model
 * (random weights, the real Qwen3 tokenizer). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "q3.h"
#include "test.h"

#define E2E TEST_DATA "/golden/e2e"

static q3_model *model;
static q3_tokenizer *tok;

static int32_t id_of(const char *s) { return q3_tokenizer_token_id(tok, s, strlen(s)); }

/* ---- a script: the processor forces script[n_ids] ------------------------ */

typedef struct script {
    const int32_t *ids;
    int n;
    int calls, tokens;
    int fail_at;          /* on_logits fails at this call (-1: never) */
    float *raw;           /* a copy of the last row it saw, before forcing */
} script;

static q3_status force_next(void *user, q3_gen *g, float *logits, int n_vocab)
{
    script *s = user;
    int k = q3_gen_result_get(g)->n_ids;
    if (s->calls++ == s->fail_at) return Q3_ERR_INVALID;
    if (s->raw) memcpy(s->raw, logits, (size_t)n_vocab * sizeof *logits);
    int32_t want = k < s->n ? s->ids[k] : id_of("<|im_end|>");
    for (int i = 0; i < n_vocab; i++)
        if (i != want) logits[i] = -INFINITY;
    return Q3_OK;
}

static void count_token(void *user, q3_gen *g, int32_t id)
{
    script *s = user;
    s->tokens++;
}

/* ---- what on_text received: "[c:text]" per piece, edges as <open c> ------- */

typedef struct transcript {
    char buf[4096];
    size_t len;
    script *sc;
    int open;             /* a "[c:" is open (consecutive pieces of one channel merge) */
    q3_channel chan;
} transcript;

static void put(transcript *t, const char *s, size_t n)
{
    if (t->len + n < sizeof t->buf) {
        memcpy(t->buf + t->len, s, n);
        t->len += n;
        t->buf[t->len] = 0;
    }
}

static void record(void *user, const q3_text_piece *p)
{
    transcript *t = user;
    static const char *ch[] = {"C", "T", "X"};
    static const char *edge[] = {"", "open", "close", "cut"};
    char head[32];
    if (t->open && (p->edge != Q3_EDGE_NONE || p->channel != t->chan)) {
        put(t, "]", 1);
        t->open = 0;
    }
    if (p->edge != Q3_EDGE_NONE) {
        snprintf(head, sizeof head, "<%s %s>", edge[p->edge], ch[p->channel]);
        put(t, head, strlen(head));
        return;
    }
    if (!t->open) {
        snprintf(head, sizeof head, "[%s:", ch[p->channel]);
        put(t, head, strlen(head));
        t->open = 1;
        t->chan = p->channel;
    }
    put(t, p->text, p->len);
}

/* Closes the last piece. */
static void done(transcript *t)
{
    if (t->open) put(t, "]", 1);
    t->open = 0;
}

static void on_logits_and_token(void *user, q3_gen *g, int32_t id) { count_token(((transcript *)user)->sc, g, id); }
static q3_status logits_of(void *user, q3_gen *g, float *l, int n) { return force_next(((transcript *)user)->sc, g, l, n); }

/* Encodes text and appends its ids. */
static int add_text(int32_t *ids, int n, const char *text)
{
    int32_t *t;
    size_t k;
    if (q3_tokenizer_encode(tok, text, strlen(text), Q3_ENCODE_DEFAULT, &t, &k)) return n;
    memcpy(ids + n, t, k * sizeof *t);
    free(t);
    return n + (int)k;
}

/* Runs a forced script through one generator; the transcript and result. */
static q3_status run_script(const int32_t *ids, int n, q3_gen_opts o, transcript *t, q3_gen_result *res,
                            script *sc)
{
    q3_session *s;
    q3_session_opts so = q3_session_opts_default();
    so.n_ctx = 256;
    so.backend = "ref";
    if (q3_session_new(model, &so, &s)) return Q3_ERR_INVALID;
    q3_sampler_params sp = q3_sampler_defaults(0);
    q3_sampler *smp;
    q3_sampler_new(&sp, q3_model_vocab_size(model), &smp);
    memset(t, 0, sizeof *t);
    t->sc = sc;
    sc->ids = ids;
    sc->n = n;
    o.on_text = record;
    o.on_logits = logits_of;
    o.on_token = on_logits_and_token;
    o.user = t;
    int32_t prompt[3] = {id_of("<|im_start|>"), id_of("assistant"), id_of("\n")};
    q3_status st = q3_generate(s, smp, tok, prompt, 3, &o, res);
    done(t);
    q3_sampler_free(smp);
    q3_session_free(s);
    return st;
}

static void channels(void)
{
    int32_t ids[128];
    int n = 0;
    ids[n++] = id_of("<think>");
    n = add_text(ids, n, "\nplan it\n\n");
    ids[n++] = id_of("</think>");
    n = add_text(ids, n, "\n\nHello");
    ids[n++] = id_of("</think>"); /* out of place: text */
    ids[n++] = id_of("<tool_call>");
    n = add_text(ids, n, "{\"name\": \"f\"}");
    ids[n++] = id_of("</tool_call>");
    n = add_text(ids, n, " bye");
    CHECK(ids[0] >= 0 && ids[n - 1] >= 0, "markup ids exist in the tokenizer");

    script sc = {.fail_at = -1};
    transcript t;
    q3_gen_result r;
    q3_gen_opts o = q3_gen_opts_default();
    o.split_channels = 1;
    CHECK(run_script(ids, n, o, &t, &r, &sc) == Q3_OK, "generate: %s", q3_last_error());
    const char *want = "<open T>[T:plan it]<close T>[C:Hello</think>]<open X>[X:{\"name\": \"f\"}]<close X>[C: bye]";
    CHECK(!strcmp(t.buf, want), "split transcript:\n  got  %s\n  want %s", t.buf, want);
    CHECK(r.stop == Q3_STOP_END_OF_TURN, "ended by <|im_end|>: %s", q3_stop_reason_name(r.stop));
    CHECK(r.n_ids == n + 1 && !memcmp(r.ids, ids, (size_t)n * sizeof *ids), "the forced ids, in order (%d)", r.n_ids);
    CHECK(sc.tokens == r.n_ids, "on_token once per token (%d of %d)", sc.tokens, r.n_ids);
    CHECK(sc.calls == r.n_ids, "on_logits once per sampled position (%d)", sc.calls);
    free(r.ids);

    /* without the split: all content, markup as its text, nothing trimmed */
    script sc2 = {.fail_at = -1};
    o.split_channels = 0;
    CHECK(run_script(ids, n, o, &t, &r, &sc2) == Q3_OK, "generate unsplit");
    CHECK(!strcmp(t.buf, "[C:<think>\nplan it\n\n</think>\n\nHello</think><tool_call>{\"name\": \"f\"}</tool_call> bye]"),
          "unsplit text: %s", t.buf);
    CHECK(!strstr(t.buf, "<open"), "no edges without the split");
    free(r.ids);

    /* a generation ending inside a span cuts it; a stop string inside a span too */
    int m = 0;
    int32_t cut[32];
    cut[m++] = id_of("<tool_call>");
    m = add_text(cut, m, "{\"a\": 1}");
    script sc3 = {.fail_at = -1};
    o = q3_gen_opts_default();
    o.split_channels = 1;
    o.max_tokens = m;
    CHECK(run_script(cut, m, o, &t, &r, &sc3) == Q3_OK, "generate cut");
    CHECK(!strcmp(t.buf, "<open X>[X:{\"a\": 1}]<cut X>"), "cut by length: %s", t.buf);
    CHECK(r.stop == Q3_STOP_LENGTH, "length: %s", q3_stop_reason_name(r.stop));
    free(r.ids);
    const char *stops[] = {"\": 1"};
    o.max_tokens = 0;
    o.stop = stops;
    o.n_stop = 1;
    script sc4 = {.fail_at = -1};
    CHECK(run_script(cut, m, o, &t, &r, &sc4) == Q3_OK, "generate stop");
    CHECK(!strcmp(t.buf, "<open X>[X:{\"a]<cut X>"), "stop string inside a span: %s", t.buf);
    CHECK(r.stop == Q3_STOP_STRING, "stop string: %s", q3_stop_reason_name(r.stop));
    free(r.ids);

    /* a failing processor ends that generator with Q3_STOP_ERROR */
    script sc5 = {.fail_at = 2};
    o = q3_gen_opts_default();
    CHECK(run_script(ids, n, o, &t, &r, &sc5) == Q3_OK, "a failing processor does not fail the step");
    CHECK(r.stop == Q3_STOP_ERROR && r.n_ids == 2, "Q3_STOP_ERROR after 2 tokens (%s, %d)",
          q3_stop_reason_name(r.stop), r.n_ids);
    free(r.ids);
}

/* ---- logprobs: the raw row's log-softmax, top alternatives sorted -------- */

static void logprobs(void)
{
    q3_ctx *c;
    q3_ctx_opts co = q3_ctx_opts_default();
    co.n_ctx = 128;
    co.max_seqs = 3;
    co.backend = "ref";
    CHECK(q3_ctx_new(model, &co, &c) == Q3_OK, "ctx: %s", q3_last_error());
    int seq;
    CHECK(q3_seq_new(c, &seq) == Q3_OK, "seq");
    q3_sampler_params sp = q3_sampler_defaults(0);
    sp.temperature = 0;
    q3_sampler *smp;
    q3_sampler_new(&sp, q3_model_vocab_size(model), &smp);
    int V = q3_model_vocab_size(model);
    float *raw = malloc((size_t)V * sizeof *raw);
    script sc = {.fail_at = -1, .raw = raw};
    int32_t forced[2] = {id_of("Hello"), id_of(" world")};
    sc.ids = forced;
    sc.n = 2;
    q3_gen_opts o = q3_gen_opts_default();
    o.logprobs = 1;
    o.top_logprobs = 5;
    o.on_logits = force_next;
    o.user = &sc;
    o.max_tokens = 1;
    q3_gen *g;
    CHECK(q3_gen_new(c, seq, smp, tok, &o, &g) == Q3_OK, "gen: %s", q3_last_error());
    int32_t prompt[2] = {id_of("<|im_start|>"), id_of("user")};
    CHECK(q3_gen_prompt(g, prompt, 2) == Q3_OK, "prompt");
    while (!q3_gen_done(g)) CHECK(q3_gen_step(&g, 1) == Q3_OK, "step");
    int n;
    const q3_token_logprob *lp = q3_gen_logprobs(g, &n);
    CHECK(n == 1 && lp, "one logprob entry (%d)", n);
    if (n == 1) {
        double max = raw[0], sum = 0;
        for (int i = 1; i < V; i++) if (raw[i] > max) max = raw[i];
        for (int i = 0; i < V; i++) sum += exp(raw[i] - max);
        double want = raw[forced[0]] - max - log(sum);
        CHECK(lp->id == forced[0], "the forced token's entry");
        CHECK(fabs(lp->logprob - want) < 1e-4, "logprob of the raw row (before the mask): %g vs %g",
              (double)lp->logprob, want);
        CHECK(lp->n_top == 5, "5 alternatives (%d)", lp->n_top);
        int sorted = 1;
        for (int k = 1; k < lp->n_top; k++) sorted &= lp->top_logprob[k] <= lp->top_logprob[k - 1];
        CHECK(sorted, "alternatives most likely first");
        int best = 0;
        for (int i = 1; i < V; i++) if (raw[i] > raw[best]) best = i;
        CHECK(lp->top_id[0] == best, "the first alternative is the raw argmax (%d vs %d)", lp->top_id[0], best);
    }
    q3_gen_free(g);

    /* q3_gen_prompt_from: a reused prefix is not prefilled again, and the
     * logits equal a whole prefill's */
    int seq2;
    q3_seq_drop(c, seq);
    CHECK(q3_seq_new(c, &seq2) == Q3_OK, "seq 2");
    int32_t p3[3] = {id_of("<|im_start|>"), id_of("user"), id_of("\n")};
    float *a = malloc((size_t)V * sizeof *a);
    q3_step st = {.prefill_seq = seq2, .prefill_tokens = p3, .n_prefill = 2};
    CHECK(q3_ctx_step(c, &st) == Q3_OK, "prefill 2");
    q3_gen_opts o2 = q3_gen_opts_default();
    o2.max_tokens = 1;
    o2.logprobs = 1;
    CHECK(q3_gen_new(c, seq2, smp, tok, &o2, &g) == Q3_OK, "gen 2");
    CHECK(q3_gen_prompt_from(g, p3, 3, 3) == Q3_ERR_INVALID, "skip must leave a token to prefill");
    CHECK(q3_gen_prompt_from(g, p3, 3, 2) == Q3_OK, "prompt_from: %s", q3_last_error());
    while (!q3_gen_done(g)) CHECK(q3_gen_step(&g, 1) == Q3_OK, "step 2");
    CHECK(q3_gen_result_get(g)->n_prompt == 3, "n_prompt counts the reused prefix");
    CHECK(q3_seq_pos(c, seq2) == 3, "3 positions after prefilling only the last (%d)", q3_seq_pos(c, seq2));
    const q3_token_logprob *l2 = q3_gen_logprobs(g, &n);
    float lp2 = n ? l2->logprob : 0;
    int32_t id2 = n ? l2->id : -1;
    q3_gen_free(g);
    int seq3;
    CHECK(q3_seq_new(c, &seq3) == Q3_OK, "seq 3");
    st = (q3_step){.prefill_seq = seq3, .prefill_tokens = p3, .n_prefill = 3, .prefill_logits = a};
    CHECK(q3_ctx_step(c, &st) == Q3_OK, "prefill 3");
    int best = 0;
    for (int i = 1; i < V; i++) if (a[i] > a[best]) best = i;
    CHECK(id2 == best, "greedy after a reused prefix = greedy after a whole prefill (%d vs %d)", id2, best);
    (void)lp2;
    free(a);
    free(raw);
    q3_sampler_free(smp);
    q3_ctx_free(c);
}

/* ---- option structs ------------------------------------------------------ */

static void options(void)
{
    q3_ctx_opts co = q3_ctx_opts_default();
    CHECK(co.size == sizeof co && co.n_ctx == 0 && !co.backend, "q3_ctx_opts_default");
    q3_gen_opts go = q3_gen_opts_default();
    CHECK(go.size == sizeof go && go.max_tokens == 0 && !go.on_logits, "q3_gen_opts_default");
    q3_chat_opts cho = q3_chat_opts_default();
    CHECK(cho.size == sizeof cho && cho.add_generation_prompt == 1 && cho.enable_thinking == -1,
          "q3_chat_opts_default");
    q3_sampler_params sp = q3_sampler_defaults(0);
    CHECK(sp.size == sizeof sp && sp.frequency_penalty == 0, "q3_sampler_defaults sets size");
    /* a struct from a newer header (larger) is refused, naming it */
    co.size = sizeof co + 8;
    co.backend = "ref";
    q3_ctx *c = NULL;
    CHECK(q3_ctx_new(model, &co, &c) == Q3_ERR_INVALID && !c, "a larger q3_ctx_opts refused");
    CHECK_CONTAINS(q3_last_error(), "newer q3.h");
    q3_session_opts so = {.size = 1};
    q3_session *s = NULL;
    CHECK(q3_session_new(model, &so, &s) == Q3_ERR_INVALID && !s, "a size smaller than size_t refused");
    sp.size = sizeof sp + 4;
    CHECK(q3_sampler_params_check(&sp) == Q3_ERR_INVALID, "a larger q3_sampler_params refused");
    /* size 0 (zero-initialized by hand) still works */
    q3_ctx_opts z = {.n_ctx = 32, .backend = "ref"};
    CHECK(q3_ctx_new(model, &z, &c) == Q3_OK, "size 0 accepted: %s", q3_last_error());
    q3_ctx_free(c);
    go.top_logprobs = Q3_MAX_TOP_LOGPROBS + 1;
    q3_gen *g = NULL;
    CHECK(q3_ctx_new(model, &z, &c) == Q3_OK, "ctx");
    int seq;
    q3_seq_new(c, &seq);
    q3_sampler *smp;
    sp.size = sizeof sp;
    q3_sampler_new(&sp, q3_model_vocab_size(model), &smp);
    CHECK(q3_gen_new(c, seq, smp, tok, &go, &g) == Q3_ERR_INVALID && !g, "top_logprobs > 20 refused");
    q3_sampler_free(smp);
    q3_ctx_free(c);
    CHECK(!strcmp(q3_status_name(Q3_ERR_KV_FULL), "KV pool full"), "Q3_ERR_KV_FULL has a name");
    const char *b;
    size_t n;
    CHECK(q3_tokenizer_piece(tok, id_of("<|im_end|>"), &b, &n) == Q3_OK && n == 10 && !memcmp(b, "<|im_end|>", 10),
          "q3_tokenizer_piece of a special token");
    CHECK(q3_tokenizer_piece(tok, -1, &b, &n) == Q3_ERR_INVALID, "q3_tokenizer_piece refuses -1");
    double t0 = q3_now(), t1 = q3_now();
    CHECK(t0 > 0 && t1 >= t0, "q3_now is monotonic");
}

/* ---- frequency penalty: logit - (f * count + p), each distinct id once ----- */

static void frequency(void)
{
    float logits[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    q3_sampler_params p = q3_sampler_defaults(0);
    p.temperature = 0;
    p.frequency_penalty = 0.5f;
    p.presence_penalty = 0.25f;
    p.penalty_last_n = 8;
    q3_sampler *s;
    CHECK(q3_sampler_new(&p, 8, &s) == Q3_OK, "sampler");
    int32_t hist[] = {7, 7, 7, 3, 6};
    for (int i = 0; i < 5; i++) q3_sampler_accept(s, hist[i]);
    float row[8];
    memcpy(row, logits, sizeof row);
    q3_sampler_apply_penalties(s, row);
    CHECK(row[7] == 8 - (0.5f * 3 + 0.25f), "id 7 seen 3 times: %g", (double)row[7]);
    CHECK(row[3] == 4 - (0.5f + 0.25f) && row[6] == 7 - (0.5f + 0.25f), "ids seen once");
    CHECK(row[0] == 1 && row[5] == 6, "others untouched");
    /* the second call sees the same counts (the scratch was cleared) */
    memcpy(row, logits, sizeof row);
    q3_sampler_apply_penalties(s, row);
    CHECK(row[7] == 8 - (0.5f * 3 + 0.25f), "again: %g", (double)row[7]);
    CHECK(q3_sampler_sample(s, logits) == 6, "greedy: 8 - 1.75 and 7 - 0.75 tie at 6.25 over 6, the lower id wins");
    p.frequency_penalty = NAN;
    q3_sampler *bad = NULL;
    CHECK(q3_sampler_new(&p, 8, &bad) == Q3_ERR_INVALID && !bad, "NaN frequency_penalty refused");
    q3_sampler_free(s);
}

int main(void)
{
    if (q3_model_open(E2E, &model) || q3_tokenizer_load(E2E, &tok)) {
        printf("cannot open %s: %s\n", E2E, q3_last_error());
        printf("0 passed, 1 failed\n");
        return 1;
    }
    channels();
    logprobs();
    options();
    frequency();
    q3_tokenizer_free(tok);
    q3_model_close(model);
    TEST_DONE();
}
