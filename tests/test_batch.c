/* Many sequences at once (q3_ctx_step), against each sequence run alone.
 *
 * A sequence's logits must be bit for bit the same whether it runs alone or
 * in a batch of any size, beside any other sequences, in any slot, with its
 * prefix blocks shared or not, prefilled in other chunk sizes, on every unit.
 * The golden models' token sequences are the workload: each job prefills the
 * first part of a case and decodes the rest; jobs come and go in a random
 * order, so slots are reused and blocks interleave in the pool.
 * Also: fork, truncate, the prefix cache, and bad steps that must leave every
 * sequence untouched. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "golden.h"
#include "tools/convert.h"
#include "q3.h"
#include "run/generate.h"
#include "sample/sampler.h"
#include "text/tokenizer.h"
#include "test.h"

static uint64_t rng = 0x2545f4914f6cdd1dull;
static uint32_t rnd(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng >> 32);
}

typedef struct job {
    const golden_case *c;
    int split;      /* prefill tokens [0, split), decode the rest */
    float *logits;  /* [n_tokens][vocab]: rows split-1 .. n_tokens-1 filled */
    int seq, done;  /* tokens whose K/V are in the sequence */
    int reused;     /* positions taken from the prefix cache */
} job;

static int split_of(const golden_case *c)
{
    int k = c->decode_from > 0 ? c->decode_from : (c->n_tokens + 1) / 2;
    return k < 1 ? 1 : k;
}

/* Runs jobs through one context: at most max_seqs at once, each step the
 * decode rows of every decoding job and one prefill chunk of the oldest
 * prefilling job. With reuse, a job first takes what the prefix cache has. */
static int run_jobs(q3_ctx *ctx, job *jobs, int n_jobs, int vocab, int reuse)
{
    int max = q3_ctx_max_seqs(ctx), chunk = q3_ctx_chunk(ctx), next = 0, active = 0, ok = 1;
    job **act = calloc((size_t)max, sizeof *act);
    q3_decode_row *rows = calloc((size_t)max, sizeof *rows);
    job **row_job = calloc((size_t)max, sizeof *row_job);
    while (ok && (next < n_jobs || active > 0)) {
        /* admit new jobs into free slots */
        while (next < n_jobs && active < max) {
            job *j = &jobs[next++];
            if (q3_seq_new(ctx, &j->seq)) {
                fprintf(stderr, "seq_new: %s\n", q3_last_error());
                ok = 0;
                break;
            }
            j->done = 0;
            j->reused = reuse ? q3_seq_reuse_prefix(ctx, j->seq, j->c->tokens, (size_t)j->split) : 0;
            j->done = j->reused;
            act[active++] = j;
        }
        q3_step st = {.decode = rows, .prefill_seq = -1};
        job *pj = NULL;
        for (int a = 0; a < active; a++) {
            job *j = act[a];
            if (j->done >= j->split) {
                rows[st.n_decode] = (q3_decode_row){.seq = j->seq, .token = j->c->tokens[j->done],
                                                    .logits = j->logits + (size_t)j->done * vocab};
                row_job[st.n_decode++] = j;
            } else if (!pj) {
                pj = j;
            }
        }
        int n_pre = 0;
        if (pj) {
            n_pre = pj->split - pj->done < chunk ? pj->split - pj->done : chunk;
            st.prefill_seq = pj->seq;
            st.prefill_tokens = pj->c->tokens + pj->done;
            st.n_prefill = n_pre;
            if (pj->done + n_pre == pj->split) st.prefill_logits = pj->logits + (size_t)(pj->split - 1) * vocab;
        }
        if (q3_ctx_step(ctx, &st)) {
            fprintf(stderr, "step: %s\n", q3_last_error());
            ok = 0;
            break;
        }
        for (int r = 0; r < st.n_decode; r++) row_job[r]->done++;
        if (pj) pj->done += n_pre;
        /* finished jobs leave; their full blocks stay cached */
        for (int a = 0; a < active;) {
            job *j = act[a];
            if (j->done + 1 >= j->c->n_tokens && j->done >= j->split) {
                q3_seq_drop(ctx, j->seq);
                act[a] = act[--active];
            } else {
                a++;
            }
        }
    }
    free(act);
    free(rows);
    free(row_job);
    return ok;
}

/* Rows split-1 .. n_tokens-2 are what a job produces (the last token's logits
 * are never needed: it is only decoded as input if n_tokens > split). */
static int rows_differ(const job *a, const job *b, int vocab)
{
    int n = 0;
    for (int t = a->split - 1; t < a->c->n_tokens - 1; t++)
        n += memcmp(a->logits + (size_t)t * vocab, b->logits + (size_t)t * vocab, (size_t)vocab * sizeof(float)) != 0;
    return n;
}

/* model: a golden folder; file: the model in it to open (NULL: the folder itself);
 * slots: sequences at once in the batched run (few cases: fewer slots, so that
 * later jobs find their case's prefix cached) */
static void batch_model_slots(const char *model, const char *file, const char *unit, const char *kv, int slots)
{
    char dir[256], path[320];
    snprintf(dir, sizeof dir, TEST_DATA "/golden/%s", model);
    snprintf(path, sizeof path, "%s%s%s", dir, file ? "/" : "", file ? file : "");
    q3_model *m;
    if (q3_model_open(path, &m)) {
        CHECK(0, "open %s: %s", path, q3_last_error());
        return;
    }
    static char names[64][128];
    int n_names = golden_list(dir, names, 64);
    golden_case cases[32];
    int n_cases = 0;
    for (int i = 0; i < n_names && n_cases < 32; i++) {
        if (strstr(names[i], ".numpy")) continue;
        if (golden_load(dir, names[i], &cases[n_cases])) continue;
        if (cases[n_cases].n_tokens < 2) {
            golden_free(&cases[n_cases]);
            continue;
        }
        n_cases++;
    }
    CHECK(n_cases >= 3, "%s: %d cases with 2+ tokens", dir, n_cases);
    int vocab = q3_model_vocab_size(m);

    /* every case twice (the second may reuse the first's prefix), in a random order */
    enum { COPIES = 2 };
    int n_jobs = n_cases * COPIES;
    job *alone = calloc((size_t)n_jobs, sizeof *alone), *batch = calloc((size_t)n_jobs, sizeof *batch);
    for (int i = 0; i < n_jobs; i++) {
        const golden_case *c = &cases[i % n_cases];
        alone[i] = (job){.c = c, .split = split_of(c)};
        alone[i].logits = calloc((size_t)c->n_tokens * vocab, sizeof(float));
    }
    for (int i = n_jobs - 1; i > 0; i--) {
        int k = (int)(rnd() % (uint32_t)(i + 1));
        job t = alone[i];
        alone[i] = alone[k];
        alone[k] = t;
    }
    for (int i = 0; i < n_jobs; i++) {
        batch[i] = alone[i];
        batch[i].logits = calloc((size_t)alone[i].c->n_tokens * vocab, sizeof(float));
    }

    /* alone: one sequence at a time, chunks of 128, a fresh context each */
    for (int i = 0; i < n_jobs; i++) {
        q3_ctx_opts o = {.n_ctx = 512, .chunk = 128, .max_seqs = 1, .backend = unit, .kv_dtype = kv};
        q3_ctx *ctx;
        CHECK(q3_ctx_new(m, &o, &ctx) == Q3_OK, "ctx: %s", q3_last_error());
        if (!ctx) break;
        CHECK(run_jobs(ctx, &alone[i], 1, vocab, 0), "%s/%s: alone run", model, alone[i].c->name);
        q3_ctx_free(ctx);
    }

    /* batched: up to `slots` (5) at once, chunks of 16 (others' prefill chunks share their steps), prefix reuse on */
    q3_ctx_opts o = {.n_ctx = 512, .chunk = 16, .max_seqs = slots, .backend = unit, .kv_dtype = kv};
    q3_ctx *ctx;
    CHECK(q3_ctx_new(m, &o, &ctx) == Q3_OK, "ctx: %s", q3_last_error());
    if (ctx) {
        CHECK(run_jobs(ctx, batch, n_jobs, vocab, 1), "%s: batched run", model);
        int differ = 0, reused = 0;
        for (int i = 0; i < n_jobs; i++) {
            int d = rows_differ(&alone[i], &batch[i], vocab);
            if (d) fprintf(stderr, "  %s %s/%s (job %d, reused %d): %d rows differ\n", unit, model, batch[i].c->name, i,
                           batch[i].reused, d);
            differ += d != 0;
            reused += batch[i].reused;
        }
        CHECK(differ == 0, "[%s %s kv %s] %d of %d jobs differ batched vs alone", model, unit, kv ? kv : "default",
              differ, n_jobs);
        CHECK(reused > 0, "[%s %s] the prefix cache served no position", model, unit);
        int used, cached, total;
        q3_ctx_kv_usage(ctx, &used, &cached, &total, NULL);
        CHECK(used == 0 && cached > 0 && cached <= total, "pool after all jobs: %d used, %d cached, %d in all", used,
              cached, total);
        q3_ctx_free(ctx);
    }
    for (int i = 0; i < n_jobs; i++) {
        free(alone[i].logits);
        free(batch[i].logits);
    }
    free(alone);
    free(batch);
    for (int i = 0; i < n_cases; i++) golden_free(&cases[i]);
    q3_model_close(m);
}

static void batch_model(const char *model, const char *file, const char *unit, const char *kv)
{
    batch_model_slots(model, file, unit, kv, 5);
}

/* Fork and truncate: a sequence forked mid-way and both continued with the
 * case's tokens give the same logits as the case alone; so does one
 * truncated back and re-decoded. */
static void fork_truncate(const char *unit)
{
    q3_model *m;
    if (q3_model_open(TEST_DATA "/golden/small", &m)) {
        CHECK(0, "open small: %s", q3_last_error());
        return;
    }
    golden_case c;
    CHECK(golden_load(TEST_DATA "/golden/small", "len64", &c) == 0, "len64");
    int V = q3_model_vocab_size(m), n = c.n_tokens;
    float *want = malloc((size_t)n * V * sizeof(float)), *got = malloc((size_t)V * sizeof(float));
    q3_ctx_opts o = {.n_ctx = 128, .chunk = 64, .max_seqs = 3, .backend = unit};
    q3_ctx *ctx;
    CHECK(q3_ctx_new(m, &o, &ctx) == Q3_OK, "ctx: %s", q3_last_error());
    int a, b, d;
    q3_seq_new(ctx, &a);
    for (int t = 0; t < n; t++) { /* one token at a time: want[t] = logits after tokens[0..t] */
        q3_decode_row row = {.seq = a, .token = c.tokens[t], .logits = want + (size_t)t * V};
        q3_step s = {.decode = &row, .n_decode = 1, .prefill_seq = -1};
        CHECK(q3_ctx_step(ctx, &s) == Q3_OK, "step: %s", q3_last_error());
    }
    /* truncate to 21 (inside a full, registered block), re-decode 21..n */
    CHECK(q3_seq_truncate(ctx, a, 21) == Q3_OK, "truncate: %s", q3_last_error());
    CHECK(q3_seq_pos(ctx, a) == 21, "pos after truncate %d", q3_seq_pos(ctx, a));
    int bad = 0;
    for (int t = 21; t < n; t++) {
        q3_decode_row row = {.seq = a, .token = c.tokens[t], .logits = got};
        q3_step s = {.decode = &row, .n_decode = 1, .prefill_seq = -1};
        CHECK(q3_ctx_step(ctx, &s) == Q3_OK, "step: %s", q3_last_error());
        bad += memcmp(got, want + (size_t)t * V, (size_t)V * sizeof(float)) != 0;
    }
    CHECK(bad == 0, "[%s] truncate and re-decode: %d rows differ", unit, bad);
    /* fork at 40 (a partial block is copied, two full ones shared) and continue both side by side */
    CHECK(q3_seq_truncate(ctx, a, 40) == Q3_OK, "truncate: %s", q3_last_error());
    CHECK(q3_seq_fork(ctx, a, &b) == Q3_OK && q3_seq_pos(ctx, b) == 40, "fork: %s", q3_last_error());
    CHECK(q3_seq_fork(ctx, b, &d) == Q3_OK, "fork of a fork: %s", q3_last_error());
    CHECK(q3_seq_truncate(ctx, d, 17) == Q3_OK, "truncate the fork: %s", q3_last_error());
    float *two = malloc((size_t)3 * V * sizeof(float));
    bad = 0;
    for (int t = 40; t < n; t++) {
        q3_decode_row rows[3] = {{.seq = b, .token = c.tokens[t], .logits = two},
                                 {.seq = a, .token = c.tokens[t], .logits = two + V},
                                 {.seq = d, .token = c.tokens[t - 23], .logits = two + 2 * (size_t)V}};
        q3_step s = {.decode = rows, .n_decode = 3, .prefill_seq = -1};
        CHECK(q3_ctx_step(ctx, &s) == Q3_OK, "step: %s", q3_last_error());
        bad += memcmp(two, want + (size_t)t * V, (size_t)V * sizeof(float)) != 0;
        bad += memcmp(two + V, want + (size_t)t * V, (size_t)V * sizeof(float)) != 0;
        bad += memcmp(two + 2 * (size_t)V, want + (size_t)(t - 23) * V, (size_t)V * sizeof(float)) != 0;
    }
    CHECK(bad == 0, "[%s] forks decoded side by side: %d rows differ", unit, bad);
    free(two);
    free(want);
    free(got);
    q3_ctx_free(ctx);
    golden_free(&c);
    q3_model_close(m);
}

/* Bad steps: each fails with a status and a message, and the sequences in
 * the step are untouched (their next good step gives the logits they would
 * have had). */
static void bad_steps(void)
{
    q3_model *m;
    if (q3_model_open(TEST_DATA "/golden/tiny", &m)) {
        CHECK(0, "open tiny: %s", q3_last_error());
        return;
    }
    int V = q3_model_vocab_size(m);
    /* 3 sequences; a pool of 5 blocks; a context of 40 */
    q3_ctx_opts o = {.n_ctx = 40, .chunk = 8, .max_seqs = 3, .kv_tokens = 5 * 16, .backend = "cpu"};
    q3_ctx *ctx;
    CHECK(q3_ctx_new(m, &o, &ctx) == Q3_OK, "ctx: %s", q3_last_error());
    if (!ctx) {
        q3_model_close(m);
        return;
    }
    int a, b, c;
    q3_seq_new(ctx, &a);
    q3_seq_new(ctx, &b);
    q3_seq_new(ctx, &c);
    int32_t toks[40];
    for (int i = 0; i < 40; i++) toks[i] = (int32_t)((i * 37 + 5) % V);
    q3_step pre = {.prefill_seq = a, .prefill_tokens = toks, .n_prefill = 8};
    CHECK(q3_ctx_step(ctx, &pre) == Q3_OK, "prefill a: %s", q3_last_error());
    pre.prefill_seq = b;
    CHECK(q3_ctx_step(ctx, &pre) == Q3_OK, "prefill b: %s", q3_last_error());
    /* the reference: a and b decode toks[8] */
    float *want = malloc(2 * (size_t)V * sizeof(float)), *got = malloc(2 * (size_t)V * sizeof(float));
    int fork;
    CHECK(q3_seq_fork(ctx, a, &fork) != Q3_OK, "a 4th sequence refused (max_seqs 3)");
    CHECK_CONTAINS(q3_last_error(), "in use");

    q3_decode_row rows[3] = {{.seq = a, .token = toks[8], .logits = got}, {.seq = b, .token = toks[8], .logits = got + V}};
    struct {
        const char *what, *msg;
        q3_decode_row third;
        int n;
        q3_status want;
    } bad[] = {
        {"a sequence twice", "twice", {.seq = a, .token = 1}, 3, Q3_ERR_INVALID},
        {"a sequence that does not exist", "does not exist", {.seq = 7, .token = 1}, 3, Q3_ERR_INVALID},
        {"a dropped sequence", "does not exist", {.seq = 2, .token = 1}, 3, Q3_ERR_INVALID},
        {"a token outside the vocabulary", "outside the vocabulary", {.seq = c, .token = V}, 3, Q3_ERR_INVALID},
        {"a negative token", "outside the vocabulary", {.seq = c, .token = -1}, 3, Q3_ERR_INVALID},
        {"more rows than sequences", "at most 3", {.seq = c, .token = 1}, 4, Q3_ERR_INVALID},
    };
    q3_seq_drop(ctx, c); /* seq 2 (c) is now dropped for the third case; re-added below */
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        q3_decode_row r4[4] = {rows[0], rows[1], bad[i].third, bad[i].third};
        q3_step s = {.decode = r4, .n_decode = bad[i].n, .prefill_seq = -1};
        if (i == 3) q3_seq_new(ctx, &c); /* back for the token cases */
        q3_status st = q3_ctx_step(ctx, &s);
        CHECK(st == bad[i].want, "%s: status %s", bad[i].what, q3_status_name(st));
        CHECK_CONTAINS(q3_last_error(), bad[i].msg);
        CHECK(q3_seq_pos(ctx, a) == 8 && q3_seq_pos(ctx, b) == 8, "%s: positions moved (%d, %d)", bad[i].what,
              q3_seq_pos(ctx, a), q3_seq_pos(ctx, b));
    }
    /* a prefill naming a decoding sequence; a prefill over the chunk size */
    q3_step both = {.decode = rows, .n_decode = 2, .prefill_seq = a, .prefill_tokens = toks, .n_prefill = 1};
    CHECK(q3_ctx_step(ctx, &both) == Q3_ERR_INVALID, "prefill of a decoding sequence refused");
    CHECK_CONTAINS(q3_last_error(), "twice");
    q3_step big = {.prefill_seq = c, .prefill_tokens = toks, .n_prefill = 9};
    CHECK(q3_ctx_step(ctx, &big) == Q3_ERR_INVALID, "a prefill larger than the chunk refused");
    /* a sequence that would pass its context */
    pre.prefill_seq = c;
    for (int i = 0; i < 5; i++) {
        pre.prefill_tokens = toks + 8 * i;
        CHECK(q3_ctx_step(ctx, &pre) == Q3_OK, "prefill c: %s", q3_last_error());
    }
    q3_decode_row crow = {.seq = c, .token = 1};
    q3_step over = {.decode = &crow, .n_decode = 1, .prefill_seq = -1};
    CHECK(q3_ctx_step(ctx, &over) == Q3_ERR_CONTEXT, "a sequence past its context refused");
    CHECK_CONTAINS(q3_last_error(), "do not fit");
    /* a, b: 1 block each; c: 3 (40 tokens): the pool of 5 is full */
    int used, cached, total;
    q3_ctx_kv_usage(ctx, &used, &cached, &total, NULL);
    CHECK(used == 5 && total == 5, "pool: %d used of %d", used, total);
    /* b's prefill to 16 fits its block; to 24 needs a new one: refused, with a beside it untouched */
    pre.prefill_seq = b;
    pre.prefill_tokens = toks + 8;
    CHECK(q3_ctx_step(ctx, &pre) == Q3_OK, "b to 16: %s", q3_last_error());
    q3_decode_row arow = {.seq = a, .token = toks[8], .logits = NULL};
    q3_step full = {.decode = &arow, .n_decode = 1, .prefill_seq = b, .prefill_tokens = toks + 16, .n_prefill = 8};
    CHECK(q3_ctx_step(ctx, &full) == Q3_ERR_KV_FULL, "a full pool refused: %s", q3_last_error());
    CHECK_CONTAINS(q3_last_error(), "KV pool is full");
    CHECK(q3_seq_pos(ctx, a) == 8 && q3_seq_pos(ctx, b) == 16, "positions after the full pool (%d, %d)",
          q3_seq_pos(ctx, a), q3_seq_pos(ctx, b));
    q3_ctx_kv_usage(ctx, &used, &cached, &total, NULL);
    CHECK(used == 5, "the refused step took no block: %d used", used);
    /* b back to 8 (truncate), c dropped: its two full blocks stay cached, its partial one is free */
    CHECK(q3_seq_truncate(ctx, b, 8) == Q3_OK, "truncate b: %s", q3_last_error());
    q3_seq_drop(ctx, c);
    q3_ctx_kv_usage(ctx, &used, &cached, &total, NULL);
    CHECK(used == 2 && cached == 2, "after the drop: %d used, %d cached", used, cached);
    /* the good step after all the refusals: a and b decode toks[8] as if nothing happened */
    q3_step good = {.decode = rows, .n_decode = 2, .prefill_seq = -1};
    CHECK(q3_ctx_step(ctx, &good) == Q3_OK, "good step: %s", q3_last_error());
    memcpy(want, got, 2 * (size_t)V * sizeof(float));
    q3_ctx_free(ctx);

    /* the same two sequences in a fresh context, nothing else */
    CHECK(q3_ctx_new(m, &o, &ctx) == Q3_OK, "ctx: %s", q3_last_error());
    q3_seq_new(ctx, &a);
    q3_seq_new(ctx, &b);
    pre.prefill_tokens = toks;
    pre.prefill_seq = a;
    q3_ctx_step(ctx, &pre);
    pre.prefill_seq = b;
    q3_ctx_step(ctx, &pre);
    rows[0].seq = a;
    rows[1].seq = b;
    CHECK(q3_ctx_step(ctx, &good) == Q3_OK, "clean step: %s", q3_last_error());
    CHECK(!memcmp(want, got, 2 * (size_t)V * sizeof(float)), "logits after the refused steps differ from a clean run");
    q3_ctx_free(ctx);
    free(want);
    free(got);
    q3_model_close(m);
}

/* Generators (q3_gen_step) of many sequences in one context: the real
 * vocabulary's e2e cases, greedy, four at a time with chunks of 8 (prefill
 * chunks of newcomers share steps with the others' decode rows): every case
 * gives the reference's ids, and the same text as q3_generate alone. */
typedef struct text_sink {
    char buf[4096];
    size_t len;
} text_sink;

static void sink(void *user, const q3_text_piece *p)
{
    text_sink *t = user;
    const char *text = p->text;
    size_t len = p->len;
    if (t->len + len < sizeof t->buf) {
        memcpy(t->buf + t->len, text, len);
        t->len += len;
    }
}

static void generators(void)
{
    const char *dir = TEST_DATA "/golden/e2e";
    q3_model *m;
    q3_tokenizer *tok;
    if (q3_model_open(dir, &m)) {
        CHECK(0, "open e2e: %s", q3_last_error());
        return;
    }
    if (q3_tokenizer_load(TEST_DATA "/golden/e2e/tokenizer.json", &tok)) {
        CHECK(0, "tokenizer: %s", q3_last_error());
        q3_model_close(m);
        return;
    }
    char *text = golden_slurp(TEST_DATA "/golden/e2e/cases.json", NULL);
    cJSON *cases = text ? cJSON_Parse(text) : NULL;
    free(text);
    int n = cJSON_GetArraySize(cases);
    CHECK(n >= 4, "e2e cases: %d", n);
    enum { MAXC = 16, SLOTS = 4 };
    if (n > MAXC) n = MAXC;
    int32_t prompt[MAXC][512], want[MAXC][64];
    int n_prompt[MAXC], n_want[MAXC];
    text_sink alone[MAXC], batched[MAXC];
    memset(alone, 0, sizeof alone);
    memset(batched, 0, sizeof batched);
    for (int i = 0; i < n; i++) {
        cJSON *c = cJSON_GetArrayItem(cases, i), *p = cJSON_GetObjectItem(c, "prompt_ids"), *g = cJSON_GetObjectItem(c, "generated_ids");
        n_prompt[i] = cJSON_GetArraySize(p) < 512 ? cJSON_GetArraySize(p) : 512;
        n_want[i] = cJSON_GetArraySize(g) < 64 ? cJSON_GetArraySize(g) : 64;
        for (int k = 0; k < n_prompt[i]; k++) prompt[i][k] = cJSON_GetArrayItem(p, k)->valueint;
        for (int k = 0; k < n_want[i]; k++) want[i][k] = cJSON_GetArrayItem(g, k)->valueint;
    }
    q3_sampler_params greedy = q3_sampler_defaults(0);
    greedy.temperature = 0;
    /* alone, through q3_generate */
    for (int i = 0; i < n; i++) {
        q3_session_opts so = {.n_ctx = 512, .backend = "cpu"};
        q3_session *s;
        q3_sampler *smp;
        CHECK(q3_session_new(m, &so, &s) == Q3_OK && q3_sampler_new(&greedy, q3_model_vocab_size(m), &smp) == Q3_OK,
              "session: %s", q3_last_error());
        q3_gen_opts o = {.max_tokens = n_want[i], .on_text = sink, .user = &alone[i]};
        q3_gen_result r;
        CHECK(q3_generate(s, smp, tok, prompt[i], (size_t)n_prompt[i], &o, &r) == Q3_OK, "generate: %s", q3_last_error());
        free(r.ids);
        q3_sampler_free(smp);
        q3_session_free(s);
    }
    /* batched: SLOTS generators at a time, a finished one's slot goes to the next case */
    q3_ctx_opts co = {.n_ctx = 512, .chunk = 8, .max_seqs = SLOTS, .backend = "cpu"};
    q3_ctx *ctx;
    CHECK(q3_ctx_new(m, &co, &ctx) == Q3_OK, "ctx: %s", q3_last_error());
    q3_gen *gens[SLOTS] = {0};
    q3_sampler *smps[SLOTS] = {0};
    int case_of[SLOTS], seq_of[SLOTS], next = 0, live = 0, wrong = 0, steps = 0, mixed = 0;
    for (;;) {
        for (int k = 0; k < SLOTS; k++) {
            if (gens[k] || next >= n) continue;
            int seq;
            q3_seq_new(ctx, &seq);
            q3_sampler_new(&greedy, q3_model_vocab_size(m), &smps[k]);
            q3_gen_opts o = {.max_tokens = n_want[next], .on_text = sink, .user = &batched[next]};
            CHECK(q3_gen_new(ctx, seq, smps[k], tok, &o, &gens[k]) == Q3_OK, "gen: %s", q3_last_error());
            CHECK(q3_gen_prompt(gens[k], prompt[next], (size_t)n_prompt[next]) == Q3_OK, "prompt: %s", q3_last_error());
            case_of[k] = next++;
            seq_of[k] = seq;
            live++;
        }
        if (!live) break;
        int decoding = 0, prefilling = 0;
        for (int k = 0; k < SLOTS; k++)
            if (gens[k] && !q3_gen_done(gens[k])) q3_gen_prefilling(gens[k]) ? prefilling++ : decoding++;
        mixed += decoding > 1 && prefilling > 0;
        q3_gen *active[SLOTS];
        int na = 0;
        for (int k = 0; k < SLOTS; k++)
            if (gens[k]) active[na++] = gens[k];
        if (q3_gen_step(active, na) != Q3_OK) {
            CHECK(0, "gen step: %s", q3_last_error());
            break;
        }
        steps++;
        for (int k = 0; k < SLOTS; k++) {
            if (!gens[k] || !q3_gen_done(gens[k])) continue;
            const q3_gen_result *r = q3_gen_result_get(gens[k]);
            int i = case_of[k];
            wrong += r->n_ids != n_want[i] || memcmp(r->ids, want[i], (size_t)n_want[i] * sizeof(int32_t)) != 0;
            q3_seq_drop(ctx, seq_of[k]);
            q3_gen_free(gens[k]);
            q3_sampler_free(smps[k]);
            gens[k] = NULL;
            smps[k] = NULL;
            live--;
        }
    }
    CHECK(wrong == 0, "%d of %d cases generated other ids than the reference when batched", wrong, n);
    CHECK(mixed > 0, "no step mixed decode rows with a prefill chunk (%d steps)", steps);
    int same_text = 0;
    for (int i = 0; i < n; i++) same_text += alone[i].len == batched[i].len && !memcmp(alone[i].buf, batched[i].buf, alone[i].len);
    CHECK(same_text == n, "text batched equals text alone for %d of %d cases", same_text, n);
    q3_ctx_free(ctx);
    cJSON_Delete(cases);
    q3_tokenizer_free(tok);
    q3_model_close(m);
}

/* ---- the scheduler's two tools: a token budget per step, preemption ---- */

enum { E2E_MAX = 16 };
typedef struct e2e {
    q3_model *m;
    q3_tokenizer *tok;
    int n;
    int32_t prompt[E2E_MAX][512], want[E2E_MAX][64];
    int n_prompt[E2E_MAX], n_want[E2E_MAX];
} e2e;

/* The e2e model, its tokenizer and its cases' prompts and greedy ids. */
static int e2e_load(e2e *x)
{
    memset(x, 0, sizeof *x);
    if (q3_model_open(TEST_DATA "/golden/e2e", &x->m)) return -1;
    if (q3_tokenizer_load(TEST_DATA "/golden/e2e/tokenizer.json", &x->tok)) return -1;
    char *text = golden_slurp(TEST_DATA "/golden/e2e/cases.json", NULL);
    cJSON *cases = text ? cJSON_Parse(text) : NULL;
    free(text);
    x->n = cJSON_GetArraySize(cases) < E2E_MAX ? cJSON_GetArraySize(cases) : E2E_MAX;
    for (int i = 0; i < x->n; i++) {
        cJSON *c = cJSON_GetArrayItem(cases, i), *p = cJSON_GetObjectItem(c, "prompt_ids"), *g = cJSON_GetObjectItem(c, "generated_ids");
        x->n_prompt[i] = cJSON_GetArraySize(p) < 512 ? cJSON_GetArraySize(p) : 512;
        x->n_want[i] = cJSON_GetArraySize(g) < 64 ? cJSON_GetArraySize(g) : 64;
        for (int k = 0; k < x->n_prompt[i]; k++) x->prompt[i][k] = cJSON_GetArrayItem(p, k)->valueint;
        for (int k = 0; k < x->n_want[i]; k++) x->want[i][k] = cJSON_GetArrayItem(g, k)->valueint;
    }
    cJSON_Delete(cases);
    return x->n >= 6 ? 0 : -1;
}

static void e2e_free(e2e *x)
{
    q3_tokenizer_free(x->tok);
    q3_model_close(x->m);
}

/* A greedy generator of case i on a new sequence of ctx. */
static q3_gen *e2e_gen(const e2e *x, q3_ctx *ctx, int i, q3_sampler **smp, text_sink *text)
{
    int seq;
    q3_gen *g = NULL;
    q3_sampler_params greedy = q3_sampler_defaults(0);
    greedy.temperature = 0;
    q3_gen_opts o = {.max_tokens = x->n_want[i], .on_text = sink, .user = text};
    if (q3_seq_new(ctx, &seq) || q3_sampler_new(&greedy, q3_model_vocab_size(x->m), smp) ||
        q3_gen_new(ctx, seq, *smp, x->tok, &o, &g) || q3_gen_prompt(g, x->prompt[i], (size_t)x->n_prompt[i])) {
        CHECK(0, "generator for case %d: %s", i, q3_last_error());
        q3_gen_free(g);
        return NULL;
    }
    return g;
}

static int e2e_same(const e2e *x, const q3_gen *g, int i)
{
    const q3_gen_result *r = q3_gen_result_get(g);
    return r->n_ids == x->n_want[i] && !memcmp(r->ids, x->want[i], (size_t)x->n_want[i] * sizeof(int32_t));
}

/* A long prompt arriving while a sequence generates: with a budget of 16
 * tokens a step (or Q3_STEP_PACED: 16 prefill tokens beside one decode row),
 * its prefill is spread over many steps, the running stream gets a token
 * every step, and every sequence's ids are its reference's. A prompt
 * prefilled with no stream running takes whole chunks. */
static void budget_steps(int budget)
{
    e2e x;
    if (e2e_load(&x)) {
        CHECK(0, "e2e: %s", q3_last_error());
        e2e_free(&x);
        return;
    }
    int longest = 0;
    for (int i = 1; i < x.n; i++)
        if (x.n_prompt[i] > x.n_prompt[longest]) longest = i;
    int run = longest == 0 ? 1 : 0;
    q3_ctx_opts co = {.n_ctx = 512, .chunk = 64, .max_seqs = 2, .backend = "cpu"};
    q3_ctx *ctx;
    CHECK(q3_ctx_new(x.m, &co, &ctx) == Q3_OK, "ctx: %s", q3_last_error());
    q3_sampler *sa = NULL, *sb = NULL;
    text_sink ta = {0}, tb = {0};
    q3_gen *a = e2e_gen(&x, ctx, run, &sa, &ta), *b = NULL;
    int steps_prefilling = 0, stalls = 0, alone = 0;
    while (a && q3_gen_prefilling(a)) { /* alone: no stream waits, so a whole chunk a step */
        if (q3_gen_step_budget(&a, 1, budget) != Q3_OK) {
            CHECK(0, "budgeted step: %s", q3_last_error());
            break;
        }
        alone++;
    }
    CHECK(alone == (x.n_prompt[run] + co.chunk - 1) / co.chunk,
          "a %d-token prompt alone prefilled in %d steps at a budget of %d, want whole chunks of %d", x.n_prompt[run],
          alone, budget, co.chunk);
    while (a && !q3_gen_done(a)) {
        if (!b && q3_gen_result_get(a)->n_ids == 3) b = e2e_gen(&x, ctx, longest, &sb, &tb);
        q3_gen *gens[2] = {a, b};
        int before = q3_gen_result_get(a)->n_ids, pre = b && q3_gen_prefilling(b), generating = !q3_gen_prefilling(a);
        if (q3_gen_step_budget(gens, b ? 2 : 1, budget) != Q3_OK) {
            CHECK(0, "budgeted step: %s", q3_last_error());
            break;
        }
        steps_prefilling += pre;
        stalls += generating && !q3_gen_done(a) && q3_gen_result_get(a)->n_ids != before + 1;
    }
    while (b && !q3_gen_done(b))
        if (q3_gen_step_budget(&b, 1, budget) != Q3_OK) {
            CHECK(0, "budgeted step: %s", q3_last_error());
            break;
        }
    int per = budget == Q3_STEP_PACED ? Q3_STEP_PACED_MIN : budget - 1; /* prefill tokens beside one decode row */
    int spread = (x.n_prompt[longest] + per - 1) / per;
    CHECK(b && steps_prefilling >= spread && steps_prefilling <= spread + 1,
          "a %d-token prompt prefilled in %d steps, want %d at a budget of %d", x.n_prompt[longest], steps_prefilling,
          spread, budget);
    CHECK(stalls == 0, "the running stream missed a token in %d steps", stalls);
    CHECK(a && e2e_same(&x, a, run), "the running stream's ids changed when a long prompt arrived");
    CHECK(b && e2e_same(&x, b, longest), "the long prompt's ids differ from its reference when prefilled in budgeted chunks");
    CHECK(q3_gen_step_budget(&a, 1, -2) == Q3_ERR_INVALID, "a negative budget other than Q3_STEP_PACED is refused");
    q3_gen_free(a);
    q3_gen_free(b);
    q3_sampler_free(sa);
    q3_sampler_free(sb);
    q3_ctx_free(ctx);
    e2e_free(&x);
}

/* Every case through 4 slots of a pool too small for all of them at once:
 * a step the pool cannot hold preempts the youngest sequence (as the server
 * does), which sits out two steps and comes back; on top, sequences are
 * preempted at fixed steps (mid-prompt and mid-answer). Every case's ids
 * are its reference's; preemption happened both ways. */
static void preemption(void)
{
    e2e x;
    if (e2e_load(&x)) {
        CHECK(0, "e2e: %s", q3_last_error());
        e2e_free(&x);
        return;
    }
    enum { SLOTS = 4 };
    q3_ctx_opts co = {.n_ctx = 512, .chunk = 32, .max_seqs = SLOTS, .kv_tokens = 480, .backend = "cpu"};
    q3_ctx *ctx;
    CHECK(q3_ctx_new(x.m, &co, &ctx) == Q3_OK, "ctx: %s", q3_last_error());
    q3_gen *gens[SLOTS] = {0};
    q3_sampler *smps[SLOTS] = {0};
    text_sink text[E2E_MAX];
    memset(text, 0, sizeof text);
    int case_of[SLOTS], order[SLOTS], paused[SLOTS] = {0}, next = 0, live = 0, wrong = 0, full = 0, forced = 0, steps = 0;
    while (ctx && steps < 5000) {
        for (int k = 0; k < SLOTS; k++) {
            if (gens[k] || next >= x.n) continue;
            case_of[k] = next;
            order[k] = next;
            gens[k] = e2e_gen(&x, ctx, next++, &smps[k], &text[case_of[k]]);
            live++;
        }
        if (!live) break;
        /* the youngest live one (mid-prompt or mid-answer), while another runs: a
           sequence preempted every 7 steps alone might never get its K/V back */
        if (steps % 7 == 3 && live > 1)
            for (int y = -1, k = 0; k <= SLOTS; k++) {
                if (k < SLOTS) {
                    if (gens[k] && !paused[k] && (y < 0 || order[k] > order[y])) y = k;
                } else if (y >= 0 && q3_gen_preempt(gens[y]) == Q3_OK) {
                    paused[y] = 2;
                    forced++;
                }
            }
        q3_gen *active[SLOTS];
        int slot_of[SLOTS], na = 0;
        for (int k = 0; k < SLOTS; k++)
            if (gens[k] && !paused[k]) {
                slot_of[na] = k;
                active[na++] = gens[k];
            }
        q3_status st = q3_gen_step_budget(active, na, 24);
        if (st == Q3_ERR_KV_FULL && na > 1) { /* the youngest steps aside */
            int y = 0;
            for (int i = 1; i < na; i++)
                if (order[slot_of[i]] > order[slot_of[y]]) y = i;
            CHECK(q3_gen_preempt(active[y]) == Q3_OK, "preempt: %s", q3_last_error());
            paused[slot_of[y]] = 2;
            full++;
            continue;
        }
        if (st) {
            CHECK(0, "step: %s", q3_last_error());
            break;
        }
        steps++;
        for (int k = 0; k < SLOTS; k++) {
            if (paused[k]) paused[k]--;
            if (!gens[k] || !q3_gen_done(gens[k])) continue;
            wrong += !e2e_same(&x, gens[k], case_of[k]);
            q3_seq_drop(ctx, q3_gen_seq(gens[k]));
            q3_gen_free(gens[k]);
            q3_sampler_free(smps[k]);
            gens[k] = NULL;
            smps[k] = NULL;
            live--;
        }
    }
    CHECK(next == x.n && live == 0, "%d of %d cases finished in %d steps", next - live, x.n, steps);
    CHECK(wrong == 0, "%d of %d cases generated other ids across preemption", wrong, x.n);
    CHECK(full > 0 && forced > 0, "preempted %d times for a full pool and %d times on purpose", full, forced);
    for (int k = 0; k < SLOTS; k++) {
        q3_gen_free(gens[k]);
        q3_sampler_free(smps[k]);
    }
    q3_ctx_free(ctx);
    e2e_free(&x);
}

/* q3_convert_compare_kv: a cache of the reference's own type costs nothing; Q8_0
 * costs a little (the golden small model, its len64 case). */
static void kv_compare(void)
{
    q3_model *m;
    if (q3_model_open(TEST_DATA "/golden/small", &m)) {
        CHECK(0, "open small: %s", q3_last_error());
        return;
    }
    golden_case c;
    CHECK(golden_load(TEST_DATA "/golden/small", "len64", &c) == 0, "len64");
    const int32_t *seqs[1] = {c.tokens};
    size_t lens[1] = {(size_t)c.n_tokens};
    q3_dtype kvt[2] = {Q3_F16, Q3_Q8_0};
    q3_quant_report rep[2];
    CHECK(q3_convert_compare_kv(m, Q3_F16, kvt, 2, seqs, lens, 1, "cpu", rep) == Q3_OK, "compare kv: %s",
          q3_last_error());
    CHECK(rep[0].n_positions == (size_t)c.n_tokens && rep[0].kl_max == 0 && rep[0].top1_agree == 1 &&
              rep[0].max_abs_logit == 0,
          "f16 against f16: KL max %g, top-1 %g", rep[0].kl_max, rep[0].top1_agree);
    CHECK(rep[1].kl_max > 0 && rep[1].kl_max < 1e-3 && rep[1].top1_agree >= 0.9 && rep[1].max_abs_logit < 0.1,
          "q8_0 against f16: KL max %g, top-1 %g, max |dlogit| %g", rep[1].kl_max, rep[1].top1_agree,
          rep[1].max_abs_logit);
    CHECK(rep[1].weight_bytes * 32 == rep[0].weight_bytes * 17, "KV bytes per token %zu (q8_0), %zu (f16)",
          rep[1].weight_bytes, rep[0].weight_bytes);
    golden_free(&c);
    q3_model_close(m);
}

int main(void)
{
    batch_model("tiny", NULL, "ref", "f32");
    batch_model("tiny", NULL, "cpu", NULL);
    batch_model("tiny", "model-f32.gguf", "cpu", "f32");
    batch_model("small", NULL, "cpu", NULL);
    batch_model("small-bf16", NULL, "cpu", NULL);
    batch_model("small-q8_0", "model-q8_0.gguf", "cpu", NULL);
    batch_model("small-q4_0", "model-q4_0.gguf", "cpu", "bf16");
    batch_model("small", NULL, "cpu", "q8_0");
    batch_model("small-q8_0", "model-q8_0.gguf", "cpu", "q8_0");
    /* mixture of experts: a step's rows grouped by expert, each still its own sequence alone */
    batch_model_slots("moe-tiny", NULL, "ref", "f32", 3);
    batch_model_slots("moe-tiny", NULL, "cpu", NULL, 3);
    batch_model_slots("moe-tiny", "model-f32.gguf", "cpu", "f32", 3);
    batch_model_slots("moe-small-bf16", NULL, "cpu", NULL, 3);
    batch_model_slots("moe-small-bf16", "model-bf16.gguf", "cpu", "q8_0", 3);
    fork_truncate("cpu");
    fork_truncate("ref");
    bad_steps();
    generators();
    budget_steps(16);
    budget_steps(Q3_STEP_PACED);
    preemption();
    kv_compare();
    TEST_DONE();
}
