/* Mixture of experts above the kernels: the router's choice (MOE_ROUTE) and
 * the slot sum (MOE_SUM) as graph.h defines them, on every unit; and a MoE
 * model's determinism contract end to end:
 *  - ties go to the lower expert index, the chosen are largest first, the
 *    weights are the softmax share of each chosen expert (divided by their
 *    sum with norm_topk_prob), each rounded once from double; a logit that
 *    is not finite fails the run with Q3_ERR_INVALID;
 *  - MOE_SUM adds the slots in slot order;
 *  - a row of a B-row decode step is bit for bit the same sequence decoded
 *    alone (the experts' rows grouped by expert must not change a value);
 *  - decode equals prefill bit for bit on the cpu unit (F32 K/V), as it does
 *    for the dense models;
 *  - many sequences through one context (q3_gen) equal each alone;
 *  - q3 run on the GGUF and q3 serve's /v1/completions (2+ requests at once,
 *    prefix cache) give a single session's greedy tokens. */
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_features.h"
#include "golden.h"
#include "plan/plan.h"
#include "q3.h"
#include "run/context.h"
#include "serve_util.h"
#include "temps.h"
#include "test.h"

#define MOE_TINY TEST_DATA "/golden/moe-tiny"
#define MOE_GGUF MOE_TINY "/model-f32.gguf"

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static uint32_t rnd(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng >> 32);
}
static float frand(float lo, float hi) { return lo + (hi - lo) * (float)(rnd() >> 8) * (1.0f / 16777216.0f); }

static q3_unit *units[2]; /* ref, cpu (NULL when absent) */

/* ---- MOE_ROUTE and MOE_SUM: one-op graphs ----------------------------------------------- */

enum { R_LOGITS, R_IDS, R_W, R_N };

/* Runs MOE_ROUTE over rows x n logits choosing k, on unit u; ids and w get
 * [rows][k]. Returns the run's status. */
static q3_status route(q3_unit *u, const float *logits, int rows, int n, int k, bool norm, float *ids, float *w)
{
    q3_config cfg = {.n_layers = 1, .dim = 64, .ffn_dim = 96, .n_heads = 4, .n_kv_heads = 2, .head_dim = 16,
                     .vocab_size = 100, .max_seq_len = 64, .rms_eps = 1e-6f, .rope_theta = 1e6f,
                     .n_experts = n, .n_experts_used = k, .expert_ffn_dim = 8, .norm_topk_prob = norm};
    q3_value v[R_N] = {{.name = "router", .rows = rows, .cols = n},
                       {.name = "expert_ids", .rows = rows, .cols = k},
                       {.name = "expert_weights", .rows = rows, .cols = k}};
    q3_op op = {.kind = Q3_OP_MOE_ROUTE, .name = "blk.0.ffn_route", .layer = 0, .out = R_IDS, .out2 = R_W,
                .in = {R_LOGITS, -1, -1}};
    q3_graph g = {.kind = Q3_GRAPH_DECODE, .cfg = &cfg, .rows = rows, .ops = &op, .n_ops = 1, .values = v, .n_values = R_N};
    CHECK(u->b->refuses(u->b, &g, &op) == NULL, "%s admits MOE_ROUTE", u->b->name);
    float *lg = malloc((size_t)rows * n * sizeof *lg);
    memcpy(lg, logits, (size_t)rows * n * sizeof *lg);
    float *buf[R_N] = {lg, ids, w};
    int32_t pos[64] = {0};
    q3_exec e = {.g = &g, .buf = buf, .n_real = rows, .pos = pos};
    q3_status st = u->b->run(u->impl, &e, &op);
    CHECK(!memcmp(lg, logits, (size_t)rows * n * sizeof *lg), "%s: MOE_ROUTE left its logits alone", u->b->name);
    free(lg);
    return st;
}

/* What graph.h says the weights are: softmax over all n in double, the
 * chosen ones' shares (over their sum with norm), rounded once. */
static void want_weights(const float *l, int n, const int *chosen, int k, bool norm, float *w)
{
    double max = l[0], all = 0, sum = 0, p[64];
    for (int e = 1; e < n; e++) max = l[e] > max ? l[e] : max;
    for (int e = 0; e < n; e++) all += exp((double)l[e] - max);
    for (int j = 0; j < k; j++) sum += p[j] = exp((double)l[chosen[j]] - max) / all;
    for (int j = 0; j < k; j++) w[j] = (float)(norm ? p[j] / sum : p[j]);
}

static void test_route(q3_unit *u)
{
    const char *un = u->b->name;
    float ids[64 * 8], w[64 * 8];
    /* ties: the lower index wins, and equal logits keep index order */
    {
        const float l[6] = {0.5f, 2, 2, 1, 2, -1};
        CHECK(route(u, l, 1, 6, 3, true, ids, w) == Q3_OK, "%s route: %s", un, q3_last_error());
        CHECK(ids[0] == 1 && ids[1] == 2 && ids[2] == 4, "[%s] ties to the lower index: %g %g %g", un, ids[0], ids[1], ids[2]);
        CHECK(w[0] == w[1] && w[1] == w[2], "[%s] tied experts get equal weights", un);
        const float eq[8] = {0};
        CHECK(route(u, eq, 1, 8, 4, false, ids, w) == Q3_OK, "%s route", un);
        CHECK(ids[0] == 0 && ids[1] == 1 && ids[2] == 2 && ids[3] == 3, "[%s] all equal: the first k", un);
        CHECK(w[0] == 0.125f && w[3] == 0.125f, "[%s] all equal, no renormalization: 1/8 each (%g)", un, w[0]);
        /* -0 and +0 are equal logits: a tie, not an order */
        const float z[3] = {-0.0f, 0.0f, -1};
        CHECK(route(u, z, 1, 3, 1, true, ids, w) == Q3_OK && ids[0] == 0 && w[0] == 1.0f, "[%s] -0 ties +0", un);
    }
    /* order and weights over random rows: the chosen are the k largest, largest first; each
       weight is its softmax share (renormalized with norm), rounded once */
    enum { ROWS = 64, N = 16 };
    float *l = malloc((size_t)ROWS * N * sizeof *l);
    for (int bits = 0; bits < 4; bits++) {
        bool norm = bits & 1;
        int k = bits & 2 ? 8 : 2;
        for (int i = 0; i < ROWS * N; i++) l[i] = frand(-4, 4);
        for (int i = 0; i < ROWS; i += 4) l[(size_t)i * N + 3] = l[(size_t)i * N + 9]; /* some ties */
        CHECK(route(u, l, ROWS, N, k, norm, ids, w) == Q3_OK, "%s route: %s", un, q3_last_error());
        int bad_order = 0, bad_w = 0, bad_sum = 0;
        for (int r = 0; r < ROWS; r++) {
            const float *x = l + (size_t)r * N;
            int chosen[8];
            for (int j = 0; j < k; j++) {
                int id = (int)ids[r * k + j];
                chosen[j] = id;
                if (ids[r * k + j] != (float)id || id < 0 || id >= N) { bad_order++; continue; }
                /* nothing unchosen beats it, nor ties it with a lower index */
                for (int e = 0; e < N; e++) {
                    int taken = 0;
                    for (int i = 0; i <= j; i++) taken |= (int)ids[r * k + i] == e;
                    if (!taken && (x[e] > x[id] || (x[e] == x[id] && e < id))) bad_order++;
                }
                if (j > 0 && x[chosen[j - 1]] < x[id]) bad_order++;
            }
            float want[8];
            want_weights(x, N, chosen, k, norm, want);
            bad_w += memcmp(want, w + r * k, (size_t)k * sizeof *w) != 0;
            double s = 0;
            for (int j = 0; j < k; j++) s += w[r * k + j];
            if (norm) bad_sum += fabs(s - 1) > k * 6e-8;
            else bad_sum += !(s < 1 && s > 0);
        }
        CHECK(bad_order == 0, "[%s] k %d: %d choices out of order", un, k, bad_order);
        CHECK(bad_w == 0, "[%s] k %d norm %d: %d rows' weights are not the rounded softmax share", un, k, norm, bad_w);
        CHECK(bad_sum == 0, "[%s] k %d norm %d: %d rows' weights do not sum as they should", un, k, norm, bad_sum);
    }
    /* k = n: a full ranking; k = 1 with norm: the weight is exactly 1 */
    for (int i = 0; i < N; i++) l[i] = (float)((i * 7) % N) - 3.5f;
    CHECK(route(u, l, 1, N, N, false, ids, w) == Q3_OK, "%s route", un);
    int sorted = 1;
    for (int j = 1; j < N; j++) sorted &= l[(int)ids[j - 1]] > l[(int)ids[j]];
    CHECK(sorted, "[%s] k = n ranks every expert", un);
    CHECK(route(u, l, 1, N, 1, true, ids, w) == Q3_OK && w[0] == 1.0f, "[%s] k 1 norm: weight %g", un, w[0]);
    /* far apart but finite: no overflow, the loser's share is 0 */
    const float far[3] = {-1e30f, 1e30f, 0};
    CHECK(route(u, far, 1, 3, 2, true, ids, w) == Q3_OK && ids[0] == 1 && ids[1] == 2 && w[0] == 1.0f && w[1] == 0.0f,
          "[%s] logits 1e30 apart: %g %g, %g %g", un, ids[0], ids[1], w[0], w[1]);
    /* a logit that is not finite fails the run, wherever it is, naming the op */
    const float bad[3] = {NAN, INFINITY, -INFINITY};
    for (int b = 0; b < 3; b++)
        for (int at = 0; at < N; at += 5) {
            for (int i = 0; i < 2 * N; i++) l[i] = frand(-1, 1);
            l[N + at] = bad[b]; /* row 1 */
            q3_status st = route(u, l, 2, N, 2, true, ids, w);
            CHECK(st == Q3_ERR_INVALID, "[%s] logit %g at %d: status %d", un, (double)bad[b], at, st);
            if (st) CHECK_CONTAINS(q3_last_error(), "blk.0.ffn_route");
        }
    free(l);
}

/* MOE_SUM over rows x k slots of cols: sums in slot order. */
static void test_sum(q3_unit *u)
{
    const char *un = u->b->name;
    enum { ROWS = 3, K = 3, COLS = 5 };
    q3_config cfg = {.n_layers = 1, .dim = 64, .ffn_dim = 96, .n_heads = 4, .n_kv_heads = 2, .head_dim = 16,
                     .vocab_size = 100, .max_seq_len = 64, .rms_eps = 1e-6f, .rope_theta = 1e6f};
    for (int k = 1; k <= K; k++) {
        q3_value v[2] = {{.name = "expert_down", .rows = ROWS, .cols = k * COLS}, {.name = "o", .rows = ROWS, .cols = COLS}};
        q3_op op = {.kind = Q3_OP_MOE_SUM, .name = "blk.0.ffn_moe_sum", .out = 1, .out2 = -1, .in = {0, -1, -1}};
        q3_graph g = {.kind = Q3_GRAPH_DECODE, .cfg = &cfg, .rows = ROWS, .ops = &op, .n_ops = 1, .values = v, .n_values = 2};
        CHECK(u->b->refuses(u->b, &g, &op) == NULL, "%s admits MOE_SUM", un);
        float x[ROWS * K * COLS], y[ROWS * COLS];
        for (int i = 0; i < ROWS * k * COLS; i++) x[i] = frand(-1, 1);
        /* row 0, column 0: 1e8 + 1 - 1e8 is 0 in order, 1 in any other */
        if (k == 3) x[0] = 1e8f, x[COLS] = 1, x[2 * COLS] = -1e8f;
        for (int i = 0; i < ROWS * COLS; i++) y[i] = -7;
        float *buf[2] = {x, y};
        int32_t pos[ROWS] = {0};
        q3_exec e = {.g = &g, .buf = buf, .n_real = ROWS - 1, .pos = pos};
        CHECK(u->b->run(u->impl, &e, &op) == Q3_OK, "%s MOE_SUM: %s", un, q3_last_error());
        int bad = 0;
        for (int r = 0; r < ROWS - 1; r++)
            for (int c = 0; c < COLS; c++) {
                float s = x[r * k * COLS + c];
                for (int j = 1; j < k; j++) s += x[r * k * COLS + j * COLS + c];
                bad += memcmp(&s, &y[r * COLS + c], sizeof s) != 0;
            }
        CHECK(bad == 0, "[%s] k %d: %d sums not in slot order", un, k, bad);
        if (k == 3) CHECK(y[0] == 0.0f, "[%s] 1e8 + 1 - 1e8 summed in order is 0, got %g", un, y[0]);
        int touched = 0;
        for (int c = 0; c < COLS; c++) touched += y[(ROWS - 1) * COLS + c] != -7;
        CHECK(touched == 0, "[%s] a row past n_real was written", un);
    }
}

/* The planner places the MoE ops like any other: on the first unit that
 * admits them; an absent unit says so. */
static void test_plan(q3_model *m)
{
    q3_graph g;
    CHECK(q3_graph_build_decode(m, 4, &g) == Q3_OK, "decode graph: %s", q3_last_error());
    const q3_backend *list[3] = {&q3_backend_cuda, &q3_backend_cpu, &q3_backend_ref};
    q3_plan p;
    CHECK(q3_plan_graph(&g, list, 3, &p) == Q3_OK, "plan: %s", q3_last_error());
    int seen[Q3_OP_KIND_COUNT] = {0}, wrong = 0;
    int want = q3_backend_cpu.present(&q3_backend_cpu) ? 1 : 2;
    for (int i = 0; i < g.n_ops; i++) {
        q3_op_kind k = g.ops[i].kind;
        seen[k]++;
        if (k != Q3_OP_MOE_ROUTE && k != Q3_OP_MOE_SUM && k != Q3_OP_MATMUL_ID) continue;
        wrong += p.unit_of[i] != want;
        const char *why = p.refusal[(size_t)i * 3];
        if (!q3_backend_cuda.present(&q3_backend_cuda)) wrong += !why || strcmp(why, "device absent");
    }
    CHECK(wrong == 0, "MoE ops on %s, cuda's reason 'device absent': %d wrong", list[want]->name, wrong);
    int L = m->cfg.n_layers;
    CHECK(seen[Q3_OP_MOE_ROUTE] == L && seen[Q3_OP_MOE_SUM] == L && seen[Q3_OP_MATMUL_ID] == 3 * L,
          "one route, three indexed matmuls and one sum a layer: %d %d %d", seen[Q3_OP_MOE_ROUTE],
          seen[Q3_OP_MATMUL_ID], seen[Q3_OP_MOE_SUM]);
    q3_plan_free(&p);
    q3_graph_free(&g);
}

/* ---- a model's rows ---------------------------------------------------------------- */

/* Decode equals prefill: the logits of every position by one prefill of all
 * rows (chunks of `chunk`), and by decoding one token at a time, on unit
 * with F32 K/V. Returns the rows that differ in any bit. */
static int decode_vs_prefill(q3_model *m, const char *unit, const int32_t *toks, int n, int chunk)
{
    int V = q3_model_vocab_size(m);
    float *pre = malloc((size_t)n * V * sizeof *pre), *dec = malloc((size_t)n * V * sizeof *dec);
    q3_session_opts so = {.n_ctx = n + 4, .chunk = chunk, .backend = unit, .kv_dtype = "f32"};
    q3_session *s;
    int bad = -1;
    if (q3_session_new(m, &so, &s)) {
        CHECK(0, "session: %s", q3_last_error());
        goto out;
    }
    CHECK(q3_session_prefill(s, toks, (size_t)n, pre, 1) == Q3_OK, "prefill: %s", q3_last_error());
    q3_session_reset(s);
    for (int t = 0; t < n; t++) CHECK(q3_session_decode(s, toks[t], dec + (size_t)t * V) == Q3_OK, "decode: %s", q3_last_error());
    bad = 0;
    for (int t = 0; t < n; t++) bad += memcmp(pre + (size_t)t * V, dec + (size_t)t * V, (size_t)V * sizeof *pre) != 0;
    q3_session_free(s);
out:
    free(pre);
    free(dec);
    return bad;
}

static void test_decode_prefill(const char *model, int chunk)
{
    q3_model *m;
    if (q3_model_open(model, &m)) {
        CHECK(0, "open %s: %s", model, q3_last_error());
        return;
    }
    golden_case c;
    CHECK(golden_load(MOE_TINY, "len64", &c) == 0, "len64");
    int V = q3_model_vocab_size(m);
    for (int i = 0; i < c.n_tokens; i++) c.tokens[i] %= V;
    const char *isas[] = {NULL, "avx512", "avx2"};
    for (int i = 0; i < 3; i++) {
        if (isas[i] && !test_machine_has_isa(isas[i])) continue;
        if (isas[i]) setenv("Q3_CPU_ISA", isas[i], 1);
        int bad = decode_vs_prefill(m, "cpu", c.tokens, c.n_tokens, chunk);
        CHECK(bad == 0, "%s [cpu %s, chunk %d]: %d of %d rows differ between decode and prefill", model,
              isas[i] ? isas[i] : "default", chunk, bad, c.n_tokens);
        unsetenv("Q3_CPU_ISA");
    }
    int bad = decode_vs_prefill(m, "ref", c.tokens, 24, chunk);
    CHECK(bad == 0, "%s [ref]: %d of 24 rows differ between decode and prefill", model, bad);
    golden_free(&c);
    q3_model_close(m);
}

/* B sequences at different depths decoded in one step: each row equals the
 * same sequence decoded alone (a context of one row), bit for bit, and the
 * step's rows chose more than one expert between them (so rows were grouped). */
static void test_rows_independent(const char *model, const char *unit, const char *kv)
{
    enum { B = 6, STEPS = 5 };
    q3_model *m;
    if (q3_model_open(model, &m)) {
        CHECK(0, "open %s: %s", model, q3_last_error());
        return;
    }
    int V = q3_model_vocab_size(m), L = m->cfg.n_layers;
    int32_t toks[B][40];
    int depth[B];
    for (int b = 0; b < B; b++) {
        depth[b] = 3 + 5 * b;
        for (int i = 0; i < 40; i++) toks[b][i] = (int32_t)(rnd() % (uint32_t)V);
    }
    float *alone = malloc((size_t)B * STEPS * V * sizeof(float)), *batch = malloc((size_t)B * STEPS * V * sizeof(float));
    for (int b = 0; b < B; b++) {
        q3_ctx_opts o = {.n_ctx = 64, .chunk = 8, .max_seqs = 1, .backend = unit, .kv_dtype = kv};
        q3_ctx *c;
        int seq;
        if (q3_ctx_new(m, &o, &c) || q3_seq_new(c, &seq)) {
            CHECK(0, "ctx: %s", q3_last_error());
            break;
        }
        for (int done = 0; done < depth[b]; done += 8) {
            q3_step s = {.prefill_seq = seq, .prefill_tokens = toks[b] + done, .n_prefill = depth[b] - done < 8 ? depth[b] - done : 8};
            CHECK(q3_ctx_step(c, &s) == Q3_OK, "prefill: %s", q3_last_error());
        }
        for (int t = 0; t < STEPS; t++) {
            q3_decode_row row = {.seq = seq, .token = toks[b][depth[b] + t], .logits = alone + ((size_t)b * STEPS + t) * V};
            q3_step s = {.decode = &row, .n_decode = 1, .prefill_seq = -1};
            CHECK(q3_ctx_step(c, &s) == Q3_OK, "decode: %s", q3_last_error());
        }
        q3_ctx_free(c);
    }
    q3_ctx_opts o = {.n_ctx = 64, .chunk = 16, .max_seqs = B, .backend = unit, .kv_dtype = kv};
    q3_ctx *c;
    int seq[B], union_max = 0;
    CHECK(q3_ctx_new(m, &o, &c) == Q3_OK, "ctx: %s", q3_last_error());
    if (c) {
        for (int b = 0; b < B; b++) {
            CHECK(q3_seq_new(c, &seq[b]) == Q3_OK, "seq");
            for (int done = 0; done < depth[b]; done += 16) {
                q3_step s = {.prefill_seq = seq[b], .prefill_tokens = toks[b] + done,
                             .n_prefill = depth[b] - done < 16 ? depth[b] - done : 16};
                CHECK(q3_ctx_step(c, &s) == Q3_OK, "prefill: %s", q3_last_error());
            }
        }
        int v_ids = -1;
        for (int v = 0; v < c->decode.n_values; v++)
            if (!strcmp(c->decode.values[v].name, "expert_ids")) v_ids = v;
        CHECK(v_ids >= 0, "the decode graph has expert ids");
        for (int t = 0; t < STEPS; t++) {
            q3_decode_row rows[B];
            for (int i = 0; i < B; i++) { /* a different row order every step */
                int b = (i + t) % B;
                rows[i] = (q3_decode_row){.seq = seq[b], .token = toks[b][depth[b] + t],
                                          .logits = batch + ((size_t)b * STEPS + t) * V};
            }
            q3_step s = {.decode = rows, .n_decode = t == STEPS - 1 ? B - 1 : B, .prefill_seq = -1};
            CHECK(q3_ctx_step(c, &s) == Q3_OK, "step: %s", q3_last_error());
            if (v_ids >= 0) { /* the last layer's choice of the step's rows */
                int used[256] = {0}, n_used = 0, k = m->cfg.n_experts_used;
                for (int r = 0; r < s.n_decode * k; r++) {
                    int e = (int)c->run_decode.buf[v_ids][r];
                    if (e >= 0 && e < 256 && !used[e]++) n_used++;
                }
                union_max = n_used > union_max ? n_used : union_max;
            }
        }
        q3_ctx_free(c);
    }
    (void)L;
    int bad = 0;
    for (int b = 0; b < B; b++)
        for (int t = 0; t < STEPS; t++) {
            if (t == STEPS - 1 && b == (B - 1 + t) % B) continue; /* left out of the last step */
            size_t at = ((size_t)b * STEPS + t) * V;
            bad += memcmp(alone + at, batch + at, (size_t)V * sizeof(float)) != 0;
        }
    CHECK(bad == 0, "%s [%s kv %s]: %d rows of a %d-row step differ from the sequence alone", model, unit, kv ? kv : "default",
          bad, B);
    CHECK(union_max > m->cfg.n_experts_used, "%s: a step's rows chose %d distinct experts (more than k = %d)", model,
          union_max, m->cfg.n_experts_used);
    free(alone);
    free(batch);
    q3_model_close(m);
}

/* ---- run and serve on the GGUF ------------------------------------------------------- */

typedef struct text_sink {
    char buf[4096];
    size_t len;
} text_sink;

static void sink(void *user, const q3_text_piece *p)
{
    text_sink *t = user;
    if (t->len + p->len < sizeof t->buf) {
        memcpy(t->buf + t->len, p->text, p->len);
        t->len += p->len;
    }
}

/* A single session's greedy answer to prompt (at most n_max tokens, stopping
 * at the tokenizer's end tokens as q3_generate does): ids and the streamed
 * text (whole UTF-8, as the server sends it). */
static int greedy_alone(q3_model *m, q3_tokenizer *tok, const int32_t *prompt, size_t n, int n_max, int32_t *ids, char **text)
{
    q3_sampler_params greedy = q3_sampler_defaults(0);
    greedy.temperature = 0;
    q3_session_opts so = {.n_ctx = 256};
    q3_session *s;
    q3_sampler *smp;
    if (q3_session_new(m, &so, &s)) return -1;
    if (q3_sampler_new(&greedy, q3_model_vocab_size(m), &smp)) {
        q3_session_free(s);
        return -1;
    }
    text_sink t = {.len = 0};
    q3_gen_opts o = {.max_tokens = n_max, .on_text = sink, .user = &t};
    q3_gen_result r;
    int got = -1;
    if (!q3_generate(s, smp, tok, prompt, n, &o, &r)) {
        got = r.n_ids;
        memcpy(ids, r.ids, (size_t)r.n_ids * sizeof *ids);
        *text = strndup(t.buf, t.len);
        free(r.ids);
    }
    q3_sampler_free(smp);
    q3_session_free(s);
    return got;
}

/* Runs a shell command, returns its stdout (caller frees). */
static char *sh(const char *cmd, int *status)
{
    FILE *f = popen(cmd, "r");
    size_t cap = 1 << 14, n = 0, got;
    char *out = malloc(cap);
    while ((got = fread(out + n, 1, cap - n - 1, f)) > 0)
        if ((n += got) + 1 == cap) out = realloc(out, cap *= 2);
    out[n] = 0;
    *status = pclose(f);
    return out;
}

static int parse_ids(const char *s, int32_t *ids, int max)
{
    int n = 0;
    if (!s || *s != '[') return -1;
    for (s++; *s && *s != ']' && n < max;) {
        char *e;
        long v = strtol(s, &e, 10);
        if (e == s) return -1;
        ids[n++] = (int32_t)v;
        s = e;
        while (*s == ',' || *s == ' ') s++;
    }
    return n;
}

static const char *const prompts[] = {"hello world", "the quick brown fox jumps", "one two three four five six",
                                      "a b c d e f g"};
enum { N_PROMPTS = 4, MAX_NEW = 12 };

static void test_run_cli(q3_model *m, q3_tokenizer *tok)
{
    const char *build = getenv("BUILD") ? getenv("BUILD") : "build";
    for (int i = 0; i < 2; i++) {
        int32_t *p;
        size_t n;
        CHECK(q3_tokenizer_encode(tok, prompts[i], strlen(prompts[i]), 0, &p, &n) == Q3_OK && n > 0, "encode");
        int32_t want[MAX_NEW], got[64];
        char *text = NULL;
        int n_want = greedy_alone(m, tok, p, n, MAX_NEW, want, &text);
        CHECK(n_want > 0, "greedy alone: %s", q3_last_error());
        char cmd[1024];
        snprintf(cmd, sizeof cmd, "./%s/q3 run -m " MOE_GGUF " --raw -p '%s' -n %d --temp 0 --output-ids --no-perf -t 1 2>/dev/null | tail -1",
                 build, prompts[i], MAX_NEW);
        int st;
        char *out = sh(cmd, &st);
        int n_got = parse_ids(out, got, 64);
        CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "q3 run exit %d", st);
        CHECK(n_got == n_want && !memcmp(got, want, (size_t)n_want * sizeof *got), "q3 run '%s': %d ids (%s) vs %d alone",
              prompts[i], n_got, out, n_want);
        free(out);
        free(text);
        free(p);
    }
}

/* q3 chat on the GGUF (its template falls back to Qwen3's): two turns, the
 * first the text q3 run gives the same message. */
static void test_chat_cli(void)
{
    const char *build = getenv("BUILD") ? getenv("BUILD") : "build";
    char cmd[1024];
    int st, st2;
    snprintf(cmd, sizeof cmd, "printf 'hello\\nagain\\n' | ./%s/q3 chat -m " MOE_GGUF " -n 6 --temp 0 -t 1 2>/dev/null", build);
    char *chat = sh(cmd, &st);
    snprintf(cmd, sizeof cmd, "./%s/q3 run -m " MOE_GGUF " -p hello -n 6 --temp 0 -t 1 --no-perf 2>/dev/null", build);
    char *run = sh(cmd, &st2);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0 && WIFEXITED(st2) && WEXITSTATUS(st2) == 0, "chat %d, run %d", st, st2);
    char *nl = strchr(chat, '\n');
    size_t rl = strlen(run);
    while (rl && run[rl - 1] == '\n') run[--rl] = 0;
    CHECK(nl && nl > chat && (size_t)(nl - chat) == rl && !strncmp(chat, run, rl), "chat's first answer is run's: '%s' vs '%s'",
          chat, run);
    CHECK(nl && strchr(nl + 1, '\n'), "chat answered the second turn: '%s'", chat);
    free(chat);
    free(run);
}

/* One /v1/completions answer: its text and completion tokens. */
typedef struct answer {
    const char *body;
    char *text;
    int tokens, cached, status;
} answer;

static int srv_port;

static void *client(void *arg)
{
    answer *a = arg;
    ts_resp r;
    if (ts_request(srv_port, "POST", "/v1/completions", NULL, a->body, &r)) return NULL;
    a->status = r.status;
    cJSON *j = cJSON_Parse(r.body);
    const cJSON *t = cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(j, "choices"), 0), "text");
    if (cJSON_IsString(t)) a->text = strdup(t->valuestring);
    const cJSON *u = cJSON_GetObjectItem(j, "usage");
    a->tokens = cJSON_GetObjectItem(u, "completion_tokens") ? cJSON_GetObjectItem(u, "completion_tokens")->valueint : -1;
    const cJSON *d = cJSON_GetObjectItem(cJSON_GetObjectItem(u, "prompt_tokens_details"), "cached_tokens");
    a->cached = d ? d->valueint : 0;
    cJSON_Delete(j);
    ts_resp_free(&r);
    return NULL;
}

static void test_serve(q3_model *m, q3_tokenizer *tok)
{
    /* prompts sharing a first KV block (16 tokens) for the prefix cache */
    enum { N = 6 };
    char prompt[N][256];
    int32_t *ids[N];
    size_t n_ids[N];
    char *want_text[N];
    int n_want[N];
    for (int i = 0; i < N; i++) {
        snprintf(prompt[i], sizeof prompt[i], "%s %s %s", "zero one two three four five six seven eight nine ten eleven twelve",
                 prompts[i % N_PROMPTS], i >= N_PROMPTS ? "again" : "");
        CHECK(q3_tokenizer_encode(tok, prompt[i], strlen(prompt[i]), 0, &ids[i], &n_ids[i]) == Q3_OK, "encode");
        int32_t w[MAX_NEW];
        n_want[i] = greedy_alone(m, tok, ids[i], n_ids[i], MAX_NEW, w, &want_text[i]);
        CHECK(n_want[i] > 0 && want_text[i], "greedy alone");
    }
    test_server srv;
    const char *args[] = {"-m", MOE_GGUF, "-t", "1", "--parallel", "3", "--ctx", "256", NULL};
    CHECK(ts_start(&srv, args) == 0, "server started");
    if (!srv.port) goto out;
    srv_port = srv.port;
    double t0 = ts_now();
    int st = 0;
    while (st != 200 && ts_now() - t0 < 30) {
        ts_resp r;
        if (!ts_request(srv_port, "GET", "/health", NULL, NULL, &r)) st = r.status, ts_resp_free(&r);
        if (st != 200) usleep(10000);
    }
    CHECK(st == 200, "/health: %d", st);
    /* the first alone (its blocks become the cache), then the rest at once: 5 requests on 3 slots */
    answer a[N] = {0};
    char body[N][1024];
    for (int i = 0; i < N; i++) {
        if (i % 2) { /* odd ones by token ids */
            size_t o = (size_t)snprintf(body[i], sizeof body[i], "{\"prompt\":[");
            for (size_t k = 0; k < n_ids[i] && o < sizeof body[i] - 64; k++)
                o += (size_t)snprintf(body[i] + o, sizeof body[i] - o, "%s%d", k ? "," : "", ids[i][k]);
            snprintf(body[i] + o, sizeof body[i] - o, "],\"max_tokens\":%d,\"temperature\":0}", MAX_NEW);
        } else {
            snprintf(body[i], sizeof body[i], "{\"prompt\":\"%s\",\"max_tokens\":%d,\"temperature\":0}", prompt[i], MAX_NEW);
        }
        a[i].body = body[i];
    }
    client(&a[0]);
    pthread_t th[N];
    for (int i = 1; i < N; i++) pthread_create(&th[i], NULL, client, &a[i]);
    for (int i = 1; i < N; i++) pthread_join(th[i], NULL);
    int cached = 0;
    for (int i = 0; i < N; i++) {
        CHECK(a[i].status == 200 && a[i].text, "request %d: status %d", i, a[i].status);
        CHECK(a[i].tokens == n_want[i], "request %d: %d tokens, alone %d", i, a[i].tokens, n_want[i]);
        CHECK(a[i].text && want_text[i] && !strcmp(a[i].text, want_text[i]), "request %d: '%s' vs alone '%s'", i,
              a[i].text ? a[i].text : "(none)", want_text[i] ? want_text[i] : "(none)");
        cached += i > 0 ? a[i].cached : 0;
        free(a[i].text);
    }
    CHECK(cached > 0, "the prefix cache served the later requests: %d tokens", cached);
    CHECK(ts_stop(&srv) == 0, "server stops cleanly");
out:
    for (int i = 0; i < N; i++) {
        free(ids[i]);
        free(want_text[i]);
    }
}

int main(void)
{
    CHECK(q3_unit_open(&q3_backend_ref, NULL, &units[0]) == Q3_OK, "open ref: %s", q3_last_error());
    if (q3_backend_cpu.present(&q3_backend_cpu))
        CHECK(q3_unit_open(&q3_backend_cpu, NULL, &units[1]) == Q3_OK, "open cpu: %s", q3_last_error());
    else
        SKIP_ISA("avx2", "the cpu unit is absent: its MoE ops and model runs");
    for (int u = 0; u < 2; u++)
        if (units[u]) {
            test_route(units[u]);
            test_sum(units[u]);
        }
    q3_model *m;
    if (q3_model_open(MOE_TINY, &m)) {
        CHECK(0, "open moe-tiny: %s", q3_last_error());
        TEST_DONE();
    }
    test_plan(m);
    q3_model_close(m);
    if (units[1]) {
        /* the dense models keep this contract; so must MoE */
        test_decode_prefill(TEST_DATA "/golden/tiny", 16);
        test_decode_prefill(MOE_TINY, 16);
        test_decode_prefill(MOE_GGUF, 64);
        test_decode_prefill(TEST_DATA "/golden/moe-small-bf16", 16);
        test_rows_independent(MOE_TINY, "cpu", NULL);
        test_rows_independent(MOE_TINY, "cpu", "f32");
        test_rows_independent(TEST_DATA "/golden/moe-small-bf16", "cpu", NULL);
    }
    test_rows_independent(MOE_TINY, "ref", "f32");
    q3_tokenizer *tok;
    if (q3_model_open(MOE_GGUF, &m) || q3_tokenizer_for_model(m, &tok)) {
        CHECK(0, "open the GGUF and its tokenizer: %s", q3_last_error());
    } else {
        test_run_cli(m, tok);
        test_chat_cli();
        test_serve(m, tok);
        q3_tokenizer_free(tok);
        q3_model_close(m);
    }
    for (int u = 0; u < 2; u++)
        if (units[u]) q3_unit_close(units[u]);
    TEST_DONE();
}
