/* Embeddings and reranker scores (q3_embed, q3_rerank), on every unit:
 *  - an embedding (unnormalized) times the LM head is the golden logits of
 *    the same prefix, within the golden sets' tolerance (tests/data/golden/README.md);
 *  - an input's vector is bit for bit the same alone or packed among others
 *    of different lengths, in any batch size;
 *  - normalization and Matryoshka cuts are what they say;
 *  - a reranker score is P(yes) / (P(yes) + P(no)) from the full logits of the
 *    same prompt (a session's prefill), and the prompts are the model card's;
 *  - bad inputs fail with a message and change nothing;
 *  - what a checkpoint is for (its markers: folder files, folder name, GGUF
 *    pooling_type) survives synth and convert, and a GGUF's classifier head
 *    (cls.output.weight, as llama.cpp's converter writes it) scores as the LM head's rows. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "backend/registry.h"
#include "golden.h"
#include "model/gguf.h"
#include "model/model.h"
#include "q3.h"
#include "temps.h"
#include "test.h"
#include "tools/convert.h"
#include "tools/gguf_write.h"
#include "tools/synth.h"

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static uint32_t rnd(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng >> 32);
}

static q3_ctx *new_ctx(q3_model *m, const char *unit)
{
    q3_ctx_opts o = q3_ctx_opts_default();
    o.backend = unit;
    o.n_ctx = 512;
    o.kv_dtype = "f32";
    q3_ctx *c = NULL;
    q3_status st = q3_ctx_new(m, &o, &c);
    CHECK(st == Q3_OK, "ctx on %s: %s", unit, q3_last_error());
    return c;
}

/* logits[v] = h . lm_head[v], in double */
static void head_logits(const q3_model *m, const float *h, float *logits)
{
    const q3_tensor *w = m->w.lm_head;
    int dim = m->cfg.dim;
    float *row = malloc((size_t)dim * sizeof *row);
    size_t rb = q3_dtype_row_bytes(w->dtype, (size_t)dim);
    for (int v = 0; v < m->cfg.vocab_size; v++) {
        q3_row_to_f32(w->dtype, (const char *)w->data + (size_t)v * rb, row, (size_t)dim);
        double s = 0;
        for (int i = 0; i < dim; i++) s += (double)h[i] * row[i];
        logits[v] = (float)s;
    }
    free(row);
}

/* ---- embedding x LM head == golden logits ----------------------------------------------- */

static void golden_embed(const char *model, const char *unit)
{
    char dir[256];
    snprintf(dir, sizeof dir, TEST_DATA "/golden/%s", model);
    q3_model *m;
    if (q3_model_open(dir, &m)) {
        CHECK(0, "open %s: %s", dir, q3_last_error());
        return;
    }
    q3_ctx *c = new_ctx(m, unit);
    CHECK(q3_model_task(m) == Q3_TASK_GENERATE, "%s is a generator", model);
    static char names[64][128];
    int n = golden_list(dir, names, 64), cases = 0;
    int dim = m->cfg.dim, vocab = m->cfg.vocab_size;
    float *logits = malloc((size_t)vocab * sizeof *logits);
    for (int i = 0; c && i < n; i++) {
        if (strstr(names[i], ".numpy") || strstr(names[i], "decode")) continue;
        golden_case g;
        if (golden_load(dir, names[i], &g)) {
            CHECK(0, "cannot load %s/%s", dir, names[i]);
            continue;
        }
        /* the first, a middle and the last stored row: each a prefix, all packed in one call */
        int pick[3] = {0, g.n_rows / 2, g.n_rows - 1}, np = g.n_rows >= 3 ? 3 : g.n_rows;
        const int32_t *in[3];
        size_t lens[3];
        for (int k = 0; k < np; k++) {
            in[k] = g.tokens;
            lens[k] = (size_t)g.rows[pick[k]] + 1;
        }
        float *emb = malloc((size_t)np * dim * sizeof *emb);
        q3_embed_opts o = q3_embed_opts_default();
        o.unnormalized = 1;
        q3_status st = q3_embed(c, in, lens, (size_t)np, &o, emb);
        CHECK(st == Q3_OK, "%s/%s [%s]: %s", model, names[i], unit, q3_last_error());
        for (int k = 0; !st && k < np; k++) {
            head_logits(m, emb + (size_t)k * dim, logits);
            const float *want = g.logits + (size_t)pick[k] * vocab;
            double worst = 0;
            int am = 0, wm = 0;
            for (int v = 0; v < vocab; v++) {
                double d = fabs((double)logits[v] - want[v]);
                if (d > worst) worst = d;
                if (logits[v] > logits[am]) am = v;
                if (want[v] > want[wm]) wm = v;
            }
            CHECK(worst <= 1e-4, "%s/%s [%s] row %d: max |embedding x head - golden| %.3g > 1e-4", model, names[i],
                  unit, g.rows[pick[k]], worst);
            CHECK(am == wm, "%s/%s [%s] row %d: argmax %d, golden %d", model, names[i], unit, g.rows[pick[k]], am, wm);
        }
        cases++;
        free(emb);
        golden_free(&g);
    }
    CHECK(cases >= 4, "%s: %d golden cases compared", model, cases);
    free(logits);
    q3_ctx_free(c);
    q3_model_close(m);
}

/* ---- alone == packed, bit for bit; normalization; Matryoshka ---------------------------------- */

static void packing(const char *unit)
{
    q3_model *m;
    if (q3_model_open(TEST_DATA "/golden/small", &m)) {
        CHECK(0, "open small: %s", q3_last_error());
        return;
    }
    q3_ctx *c = new_ctx(m, unit);
    enum { N = 9 };
    int dim = m->cfg.dim, vocab = m->cfg.vocab_size;
    int32_t *in[N];
    size_t lens[N];
    const size_t len_of[N] = {1, 37, 5, 120, 2, 64, 17, 90, 33};
    for (int i = 0; i < N; i++) {
        lens[i] = len_of[i];
        in[i] = malloc(lens[i] * sizeof *in[i]);
        for (size_t t = 0; t < lens[i]; t++) in[i][t] = (int32_t)(rnd() % (uint32_t)vocab);
    }
    in[5][0] = in[3][0]; /* two inputs with a common start: no leak from one to the next either way */
    float *alone = malloc((size_t)N * dim * sizeof(float)), *packed = malloc((size_t)N * dim * sizeof(float));
    q3_embed_opts o = q3_embed_opts_default();
    o.unnormalized = 1;
    for (int i = 0; c && i < N; i++) {
        q3_status st = q3_embed(c, (const int32_t *const *)&in[i], &lens[i], 1, &o, alone + (size_t)i * dim);
        CHECK(st == Q3_OK, "alone %d [%s]: %s", i, unit, q3_last_error());
    }
    const int batches[] = {1024, 128, 40};
    for (size_t b = 0; c && b < sizeof batches / sizeof *batches; b++) {
        o.batch_tokens = batches[b];
        memset(packed, 0, (size_t)N * dim * sizeof(float));
        q3_status st = q3_embed(c, (const int32_t *const *)in, lens, N, &o, packed);
        CHECK(st == Q3_OK, "packed [%s]: %s", unit, q3_last_error());
        for (int i = 0; i < N; i++)
            CHECK(!memcmp(alone + (size_t)i * dim, packed + (size_t)i * dim, (size_t)dim * sizeof(float)),
                  "[%s] input %d (%zu tokens): packed in batches of %d differs from alone", unit, i, lens[i], batches[b]);
    }
    /* normalized, and the Matryoshka cut: the first d values, renormalized */
    if (c) {
        o = q3_embed_opts_default();
        o.dim = 32;
        float *cut = malloc((size_t)N * 32 * sizeof(float));
        CHECK(q3_embed(c, (const int32_t *const *)in, lens, N, &o, cut) == Q3_OK, "dim 32: %s", q3_last_error());
        o.dim = 0;
        CHECK(q3_embed(c, (const int32_t *const *)in, lens, N, &o, packed) == Q3_OK, "normalized: %s", q3_last_error());
        double worst_norm = 0, worst_cut = 0, worst_full = 0;
        for (int i = 0; i < N; i++) {
            const float *raw = alone + (size_t)i * dim;
            double ss = 0, ss32 = 0, n1 = 0, n2 = 0;
            for (int k = 0; k < dim; k++) ss += (double)raw[k] * raw[k];
            for (int k = 0; k < 32; k++) ss32 += (double)raw[k] * raw[k];
            for (int k = 0; k < dim; k++) {
                n1 += (double)packed[(size_t)i * dim + k] * packed[(size_t)i * dim + k];
                worst_full = fmax(worst_full, fabs(packed[(size_t)i * dim + k] - raw[k] / sqrt(ss)));
            }
            for (int k = 0; k < 32; k++) {
                n2 += (double)cut[i * 32 + k] * cut[i * 32 + k];
                worst_cut = fmax(worst_cut, fabs(cut[i * 32 + k] - raw[k] / sqrt(ss32)));
            }
            worst_norm = fmax(worst_norm, fmax(fabs(n1 - 1), fabs(n2 - 1)));
        }
        CHECK(worst_norm < 1e-5, "[%s] normalized vectors' norms off 1 by %.3g", unit, worst_norm);
        CHECK(worst_full < 1e-6, "[%s] normalized != raw / |raw| by %.3g", unit, worst_full);
        CHECK(worst_cut < 1e-6, "[%s] dim 32 != raw[0..32) / |raw[0..32)| by %.3g", unit, worst_cut);
        free(cut);
    }
    /* bad input: refused with a message, nothing written */
    if (c) {
        float sentinel = 12345.0f, out1[4096];
        out1[0] = sentinel;
        size_t zero = 0, too_long = 513;
        int32_t bad_tok[2] = {1, vocab};
        const int32_t *bad_in[1] = {bad_tok};
        size_t bad_len = 2;
        CHECK(q3_embed(c, (const int32_t *const *)in, &zero, 1, NULL, out1) == Q3_ERR_INVALID, "an empty input");
        CHECK_CONTAINS(q3_last_error(), "empty");
        CHECK(q3_embed(c, bad_in, &bad_len, 1, NULL, out1) == Q3_ERR_INVALID, "a token outside the vocabulary");
        CHECK_CONTAINS(q3_last_error(), "outside the vocabulary");
        int32_t *long_in = calloc(too_long, sizeof *long_in);
        const int32_t *li[1] = {long_in};
        CHECK(q3_embed(c, li, &too_long, 1, NULL, out1) == Q3_ERR_CONTEXT, "an input longer than the context");
        free(long_in);
        o = q3_embed_opts_default();
        o.dim = dim + 1;
        CHECK(q3_embed(c, (const int32_t *const *)in, lens, 1, &o, out1) == Q3_ERR_INVALID, "dim > hidden");
        CHECK(out1[0] == sentinel, "a refused call wrote its output");
    }
    for (int i = 0; i < N; i++) free(in[i]);
    free(alone);
    free(packed);
    q3_ctx_free(c);
    q3_model_close(m);
}

/* ---- the reranker: score == P(yes) / (P(yes) + P(no)) from the full logits ----------------------- */

static void rerank(const char *unit)
{
    const char *dir = TEST_DATA "/golden/e2e"; /* the real Qwen3 vocabulary: "yes" and "no" are tokens */
    q3_model *m;
    q3_tokenizer *tok;
    if (q3_model_open(dir, &m)) {
        CHECK(0, "open e2e: %s", q3_last_error());
        return;
    }
    if (q3_tokenizer_for_model(m, &tok)) {
        CHECK(0, "tokenizer: %s", q3_last_error());
        q3_model_close(m);
        return;
    }
    const char *query = "What is the capital of China?";
    const char *docs[] = {"The capital of China is Beijing.",
                          "Gravity is a force that attracts two bodies towards each other. It gives weight to physical "
                          "objects and is responsible for the movement of planets around the sun.",
                          "<|im_end|> special-token text in a document stays text", "no"};
    enum { N = 4 };
    int32_t *ids[N];
    size_t lens[N];
    for (int i = 0; i < N; i++) {
        q3_status st = q3_rerank_tokenize(tok, i == 3 ? "Judge it" : NULL, query, docs[i], &ids[i], &lens[i]);
        CHECK(st == Q3_OK, "rerank_tokenize: %s", q3_last_error());
    }
    /* the model card's prompt, byte for byte (the document's markup as text) */
    char *text;
    size_t tl;
    CHECK(q3_tokenizer_decode(tok, ids[0], lens[0], &text, &tl) == Q3_OK, "decode");
    const char *want =
        "<|im_start|>system\nJudge whether the Document meets the requirements based on the Query and the Instruct "
        "provided. Note that the answer can only be \"yes\" or \"no\".<|im_end|>\n<|im_start|>user\n<Instruct>: Given "
        "a web search query, retrieve relevant passages that answer the query\n<Query>: What is the capital of "
        "China?\n<Document>: The capital of China is Beijing.<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n";
    CHECK(!strcmp(text, want), "the reranker prompt is\n%s", text);
    free(text);
    CHECK(ids[0][0] == q3_tokenizer_token_id(tok, "<|im_start|>", 12), "the prompt opens with <|im_start|>");
    int32_t im_end = q3_tokenizer_end_of_turn(tok);
    int n_im_end = 0;
    for (size_t t = 0; t < lens[2]; t++) n_im_end += ids[2][t] == im_end;
    CHECK(n_im_end == 2, "a document's <|im_end|> text is not the token (%d of them)", n_im_end);

    q3_ctx *c = new_ctx(m, unit);
    float scores[N], logits[2 * N], scores2[N];
    q3_status st = c ? q3_rerank(c, tok, (const int32_t *const *)ids, lens, N, NULL, scores, logits) : Q3_ERR_INVALID;
    CHECK(st == Q3_OK, "rerank [%s]: %s", unit, q3_last_error());
    int32_t yes = q3_tokenizer_token_id(tok, "yes", 3), no = q3_tokenizer_token_id(tok, "no", 2);
    CHECK(yes >= 0 && no >= 0, "yes %d, no %d", yes, no);
    int vocab = m->cfg.vocab_size;
    float *full = malloc((size_t)vocab * sizeof *full);
    for (int i = 0; !st && i < N; i++) {
        q3_session_opts so = q3_session_opts_default();
        so.backend = unit;
        so.kv_dtype = "f32";
        so.n_ctx = 512;
        q3_session *s;
        CHECK(q3_session_new(m, &so, &s) == Q3_OK, "session: %s", q3_last_error());
        CHECK(q3_session_prefill(s, ids[i], lens[i], full, 0) == Q3_OK, "prefill: %s", q3_last_error());
        q3_session_free(s);
        double p = 1.0 / (1.0 + exp((double)full[no] - (double)full[yes]));
        CHECK(fabs(logits[2 * i] - full[yes]) <= 1e-5 && fabs(logits[2 * i + 1] - full[no]) <= 1e-5,
              "[%s] doc %d: logits yes %.9g no %.9g; the full head's %.9g %.9g", unit, i, logits[2 * i],
              logits[2 * i + 1], full[yes], full[no]);
        CHECK(fabs(scores[i] - p) <= 1e-6, "[%s] doc %d: score %.9g, from the full logits %.9g", unit, i, scores[i], p);
        CHECK(scores[i] > 0 && scores[i] < 1, "[%s] score %g in (0, 1)", unit, scores[i]);
    }
    /* one at a time == all together, bit for bit */
    for (int i = 0; !st && i < N; i++) {
        CHECK(q3_rerank(c, tok, (const int32_t *const *)&ids[i], &lens[i], 1, NULL, &scores2[i], NULL) == Q3_OK,
              "rerank alone: %s", q3_last_error());
        CHECK(scores2[i] == scores[i], "[%s] doc %d: alone %.9g, packed %.9g", unit, i, scores2[i], scores[i]);
    }
    /* embeddings after a rerank (the graph keeps its score head): still the same vectors */
    if (c && !st) {
        int dim = m->cfg.dim;
        float *a = malloc((size_t)dim * sizeof *a), *b = malloc((size_t)dim * sizeof *b);
        int32_t *e;
        size_t en;
        CHECK(q3_embed_tokenize(tok, "Given a web search query, retrieve relevant passages", "capital of China?", 17,
                                &e, &en) == Q3_OK,
              "embed_tokenize: %s", q3_last_error());
        CHECK(q3_tokenizer_decode(tok, e, en, &text, &tl) == Q3_OK, "decode");
        CHECK(!strcmp(text, "Instruct: Given a web search query, retrieve relevant passages\nQuery:capital of "
                            "China?<|endoftext|>"),
              "embedding input %s", text);
        free(text);
        CHECK(e[en - 1] == q3_tokenizer_end_of_text(tok), "ends with <|endoftext|>");
        const int32_t *ein[1] = {e};
        CHECK(q3_embed(c, ein, &en, 1, NULL, a) == Q3_OK, "embed: %s", q3_last_error());
        q3_ctx *c2 = new_ctx(m, unit);
        CHECK(c2 && q3_embed(c2, ein, &en, 1, NULL, b) == Q3_OK, "embed (fresh context): %s", q3_last_error());
        CHECK(!memcmp(a, b, (size_t)dim * sizeof(float)), "[%s] an embedding after a rerank differs", unit);
        q3_ctx_free(c2);
        free(e);
        free(a);
        free(b);
    }
    free(full);
    for (int i = 0; i < N; i++) free(ids[i]);
    q3_ctx_free(c);
    q3_tokenizer_free(tok);
    q3_model_close(m);
}

/* ---- markers: what a checkpoint is for ---------------------------------------------------------- */

static q3_task task_of(const char *path)
{
    q3_model *m;
    if (q3_model_open(path, &m)) {
        CHECK(0, "open %s: %s", path, q3_last_error());
        return (q3_task)-1;
    }
    q3_task t = q3_model_task(m);
    q3_model_close(m);
    return t;
}

static void markers(void)
{
    q3_config c;
    q3_synth_preset_tiny(&c);
    const int pools[] = {Q3_POOLING_NONE, Q3_POOLING_LAST, Q3_POOLING_RANK};
    const q3_task want[] = {Q3_TASK_GENERATE, Q3_TASK_EMBED, Q3_TASK_RERANK};
    for (int i = 0; i < 3; i++) {
        char dir[64], gguf[64];
        snprintf(dir, sizeof dir, "plain-%d", i);
        snprintf(gguf, sizeof gguf, "plain-%d.gguf", i);
        c.pooling = pools[i];
        CHECK(q3_synth_write(test_tmp(dir), 1, Q3_F32, &c, NULL) == Q3_OK, "synth: %s", q3_last_error());
        CHECK(task_of(test_tmp(dir)) == want[i], "folder with pooling %d: %s", pools[i], q3_task_name(task_of(test_tmp(dir))));
        q3_convert_opts o = {.type = Q3_F32, .no_tokenizer = 1};
        CHECK(q3_convert(test_tmp(dir), test_tmp(gguf), &o) == Q3_OK, "convert: %s", q3_last_error());
        CHECK(task_of(test_tmp(gguf)) == want[i], "GGUF with pooling %d: %s", pools[i], q3_task_name(task_of(test_tmp(gguf))));
        q3_gguf *g;
        if (q3_gguf_open(test_tmp(gguf), &g) == Q3_OK) {
            const char *t = NULL;
            int has = q3_gguf_get_str(g, "tokenizer.chat_template.rerank", &t) == Q3_OK;
            CHECK(has == (pools[i] == Q3_POOLING_RANK), "a rerank template only in a reranker's GGUF");
            CHECK(!has || (strstr(t, "<Query>: {query}\n<Document>: {document}<|im_end|>") &&
                           strstr(t, "<think>\n\n</think>\n\n")),
                  "the GGUF's rerank template: %s", t ? t : "");

            q3_gguf_close(g);
        }
    }
    /* no markers: the folder's name says it (Qwen's repositories ship none for the reranker) */
    c.pooling = Q3_POOLING_NONE;
    CHECK(q3_synth_write(test_tmp("my-Qwen3-Reranker-0.6B"), 1, Q3_F32, &c, NULL) == Q3_OK, "synth");
    CHECK(task_of(test_tmp("my-Qwen3-Reranker-0.6B")) == Q3_TASK_RERANK, "a folder named *reranker*");
    CHECK(q3_synth_write(test_tmp("Qwen3-Embedding-0.6B/"), 1, Q3_F32, &c, NULL) == Q3_OK, "synth");
    CHECK(task_of(test_tmp("Qwen3-Embedding-0.6B/")) == Q3_TASK_EMBED, "a folder named *embedding*");
    q3_config e, r;
    CHECK(q3_synth_preset("qwen3-embedding-0.6b", &e) == Q3_OK && e.pooling == Q3_POOLING_LAST && e.dim == 1024,
          "the qwen3-embedding-0.6b preset");
    CHECK(q3_synth_preset("qwen3-reranker-0.6b", &r) == Q3_OK && r.pooling == Q3_POOLING_RANK && r.n_layers == 28,
          "the qwen3-reranker-0.6b preset");
}

/* A GGUF with cls.output.weight (the LM head's yes and no rows) scores what the folder does. */
static void classifier_head(void)
{
    const char *dir = TEST_DATA "/golden/e2e";
    q3_convert_opts o = {.type = Q3_F32};
    const char *plain = test_tmp("e2e.gguf"), *with_cls = test_tmp("e2e-cls.gguf");
    CHECK(q3_convert(dir, plain, &o) == Q3_OK, "convert e2e: %s", q3_last_error());
    q3_model *m = NULL, *mg = NULL, *mc = NULL;
    q3_tokenizer *tok = NULL;
    q3_gguf *g = NULL;
    if (q3_model_open(dir, &m) || q3_tokenizer_for_model(m, &tok) || q3_gguf_open(plain, &g)) {
        CHECK(0, "open: %s", q3_last_error());
        return;
    }
    /* the same file plus cls.output.weight = rows yes, no of the (tied) LM head */
    int32_t yes = q3_tokenizer_token_id(tok, "yes", 3), no = q3_tokenizer_token_id(tok, "no", 2);
    int dim = m->cfg.dim;
    float *cls = malloc(2 * (size_t)dim * sizeof *cls);
    q3_row_to_f32(m->w.lm_head->dtype, (const char *)m->w.lm_head->data + (size_t)yes * q3_dtype_row_bytes(m->w.lm_head->dtype, (size_t)dim), cls, (size_t)dim);
    q3_row_to_f32(m->w.lm_head->dtype, (const char *)m->w.lm_head->data + (size_t)no * q3_dtype_row_bytes(m->w.lm_head->dtype, (size_t)dim), cls + dim, (size_t)dim);
    q3_gguf_writer *w = NULL;
    q3_status st = q3_gguf_writer_new(&w);
    for (size_t i = 0; !st && i < q3_gguf_kv_count(g); i++)
        if (strcmp(q3_gguf_kv_key(g, i), "general.alignment")) /* the writer adds its own */
            st = q3_convert_copy_kv(w, q3_gguf_kv_key(g, i), q3_gguf_kv_value(g, i));
    for (size_t i = 0; !st && i < q3_gguf_tensor_count(g); i++) {
        const q3_tensor *t = q3_gguf_tensor_at(g, i);
        st = q3_gguf_writer_add_tensor(w, t->name, t->dtype, t->ndim, t->shape, t->data);
    }
    const int64_t shape[2] = {2, dim};
    if (!st) st = q3_gguf_writer_add_tensor(w, "cls.output.weight", Q3_F32, 2, shape, cls);
    if (!st) st = q3_gguf_writer_write(w, with_cls, NULL, NULL);
    CHECK(st == Q3_OK, "writing a GGUF with a classifier head: %s", q3_last_error());
    q3_gguf_writer_free(w);
    q3_gguf_close(g);
    CHECK(q3_model_open(plain, &mg) == Q3_OK && q3_model_open(with_cls, &mc) == Q3_OK, "open GGUFs: %s", q3_last_error());
    CHECK(mc && mc->w.cls_out != NULL && mg && mg->w.cls_out == NULL, "cls.output.weight is bound only where present");
    int32_t *ids;
    size_t n;
    CHECK(q3_rerank_tokenize(tok, NULL, "a query", "a document", &ids, &n) == Q3_OK, "tokenize");
    float s[3] = {-1, -2, -3}, l[6];
    q3_model *ms[3] = {m, mg, mc};
    for (int k = 0; k < 3 && mg && mc; k++) {
        q3_ctx_opts co = q3_ctx_opts_default();
        co.n_ctx = 256;
        co.backend = "ref";
        q3_ctx *c = NULL;
        const int32_t *in[1] = {ids};
        CHECK(q3_ctx_new(ms[k], &co, &c) == Q3_OK, "ctx");
        /* the classifier head needs no tokenizer */
        CHECK(c && q3_rerank(c, k == 2 ? NULL : tok, in, &n, 1, NULL, &s[k], &l[2 * k]) == Q3_OK, "rerank %d: %s", k,
              q3_last_error());
        q3_ctx_free(c);
    }
    CHECK(s[0] == s[1] && s[1] == s[2] && l[0] == l[4] && l[1] == l[5],
          "folder %.9g, GGUF %.9g, GGUF with cls.output %.9g: one score", s[0], s[1], s[2]);
    free(ids);
    free(cls);
    q3_model_close(mc);
    q3_model_close(mg);
    q3_tokenizer_free(tok);
    q3_model_close(m);
}

/* ---- q3 embed, q3 rerank ---------------------------------------------------------------------------- */

/* Runs a shell command; its stdout (malloc'd) and exit status. */
static char *run_cmd(const char *cmd, int *status)
{
    FILE *p = popen(cmd, "r");
    size_t cap = 1 << 16, len = 0;
    char *out = malloc(cap);
    size_t n;
    while (p && (n = fread(out + len, 1, cap - len - 1, p)) > 0)
        if ((len += n) + 1 >= cap) out = realloc(out, cap *= 2);
    out[len] = 0;
    int st = p ? pclose(p) : -1;
    *status = st >= 0 && WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    return out;
}

static void cli(void)
{
    const char *dir = TEST_DATA "/golden/e2e";
    const char *q3 = getenv("BUILD") ? getenv("BUILD") : "build";
    q3_model *m;
    q3_tokenizer *tok;
    if (q3_model_open(dir, &m) || q3_tokenizer_for_model(m, &tok)) {
        CHECK(0, "open: %s", q3_last_error());
        return;
    }
    q3_ctx_opts co = q3_ctx_opts_default();
    co.n_ctx = 256;
    q3_ctx *c = NULL;
    CHECK(q3_ctx_new(m, &co, &c) == Q3_OK, "ctx");
    /* embed: the library's vectors, through JSON (%.9g round-trips a float) */
    char cmd[1024];
    int status;
    snprintf(cmd, sizeof cmd, "%s/q3 embed -m %s -t 1 -p 'first text' -p 'second' --instruct 'Find it' --dim 16", q3, dir);
    char *out = run_cmd(cmd, &status);
    CHECK(status == 0, "q3 embed exits 0 (%d)", status);
    const char *texts[2] = {"first text", "second"};
    char *line = out;
    for (int i = 0; i < 2 && c; i++) {
        cJSON *j = cJSON_Parse(line);
        const cJSON *v = cJSON_GetObjectItem(j, "embedding");
        CHECK(cJSON_GetObjectItem(j, "index") && cJSON_GetObjectItem(j, "index")->valueint == i, "line %d: index", i);
        int32_t *ids;
        size_t n;
        float want[16];
        q3_embed_opts o = q3_embed_opts_default();
        o.dim = 16;
        CHECK(q3_embed_tokenize(tok, "Find it", texts[i], strlen(texts[i]), &ids, &n) == Q3_OK, "tokenize");
        const int32_t *in[1] = {ids};
        CHECK(q3_embed(c, in, &n, 1, &o, want) == Q3_OK, "embed");
        int same = cJSON_GetArraySize(v) == 16;
        for (int k = 0; same && k < 16; k++) same = (float)cJSON_GetArrayItem(v, k)->valuedouble == want[k];
        CHECK(same, "q3 embed line %d is the library's vector", i);
        free(ids);
        cJSON_Delete(j);
        char *nl = strchr(line, '\n');
        if (!nl) break;
        line = nl + 1;
    }
    free(out);
    /* raw float32 */
    snprintf(cmd, sizeof cmd, "%s/q3 embed -m %s -t 1 -p 'first text' --raw --no-normalize | wc -c", q3, dir);
    out = run_cmd(cmd, &status);
    CHECK(atoi(out) == 4 * q3_model_hidden_size(m), "--raw writes hidden floats: %s bytes", out);
    free(out);
    /* usage errors exit 2 */
    const char *usage[] = {"embed -m %s", "embed -m %s -p a --jsonl", "embed -m %s -p a --normalize --no-normalize",
                           "embed -m %s -p a --dim 0", "rerank -m %s --query q", "rerank -m %s --docs /dev/null"};
    for (size_t k = 0; k < sizeof usage / sizeof *usage; k++) {
        char sub[256];
        snprintf(sub, sizeof sub, usage[k], dir);
        snprintf(cmd, sizeof cmd, "%s/q3 %s 2>/dev/null", q3, sub);
        free(run_cmd(cmd, &status));
        CHECK(status == 2, "q3 %s: exit %d, want 2", sub, status);
    }
    snprintf(cmd, sizeof cmd, "%s/q3 embed -m %s -p a --dim 65 2>&1", q3, dir);
    out = run_cmd(cmd, &status);
    CHECK(status == 2 && strstr(out, "64 values"), "--dim beyond the hidden size: %d %s", status, out);
    free(out);
    /* rerank: best first, the library's scores */
    FILE *f = fopen(test_tmp("docs.txt"), "w");
    const char *docs[] = {"Beijing is the capital of China.", "Cats sleep a lot.", "yes"};
    for (int i = 0; f && i < 3; i++) fprintf(f, "%s\n\n", docs[i]);
    if (f) fclose(f);
    snprintf(cmd, sizeof cmd, "%s/q3 rerank -m %s -t 1 --query 'capital of China' --docs %s", q3, dir, test_tmp("docs.txt"));
    out = run_cmd(cmd, &status);
    CHECK(status == 0, "q3 rerank exits 0 (%d)", status);
    float want[3];
    int32_t *ids[3];
    size_t lens[3];
    for (int i = 0; i < 3; i++) CHECK(q3_rerank_tokenize(tok, NULL, "capital of China", docs[i], &ids[i], &lens[i]) == Q3_OK, "tok");
    CHECK(c && q3_rerank(c, tok, (const int32_t *const *)ids, lens, 3, NULL, want, NULL) == Q3_OK, "rerank");
    line = out;
    float prev = 2;
    int lines = 0;
    for (; *line; lines++) {
        cJSON *j = cJSON_Parse(line);
        int idx = cJSON_GetObjectItem(j, "index") ? cJSON_GetObjectItem(j, "index")->valueint : -1;
        const cJSON *sc = cJSON_GetObjectItem(j, "relevance_score"), *d = cJSON_GetObjectItem(j, "document");
        float s = sc ? (float)sc->valuedouble : -1;
        CHECK(idx >= 0 && idx < 3 && s == want[idx], "rerank line %d: document %d scores %.9g", lines, idx, s);
        CHECK(idx >= 0 && idx < 3 && cJSON_IsString(d) && !strcmp(d->valuestring, docs[idx]), "the document's text");
        CHECK(s <= prev, "best first");
        prev = s;
        cJSON_Delete(j);
        char *nl = strchr(line, '\n');
        if (!nl) break;
        line = nl + 1;
    }
    CHECK(lines == 3, "one line per document (blank lines skipped): %d", lines);
    free(out);
    for (int i = 0; i < 3; i++) free(ids[i]);
    q3_ctx_free(c);
    q3_tokenizer_free(tok);
    q3_model_close(m);
}

int main(void)
{
    cli();
    markers();
    classifier_head();
    for (int u = 0; q3_backends[u]; u++) {
        const q3_backend *b = q3_backends[u];
        if (b->present && !b->present(b)) {
            if (b == &q3_backend_cpu) SKIP_ISA("avx2", "embeddings on the cpu unit: the unit is absent");
            else SKIP("%s: embeddings on this unit: device absent (%s)", b->name, b->device);
            continue;
        }
        golden_embed("tiny", b->name);
        golden_embed("small", b->name);
        golden_embed("moe-tiny", b->name);
        packing(b->name);
        rerank(b->name);
    }
    TEST_DONE();
}
