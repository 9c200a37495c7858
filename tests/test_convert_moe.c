/* Mixture-of-experts models through q3 convert and q3 synth: moe-tiny's folder
 * converted to F32 is the golden GGUF twin tensor for tensor and gives the
 * folder's logits; BF16/F16/Q8_0/Q4_0 conversions load and follow the golden
 * logits; llama-quantize's per-tensor types for qwen3moe (the expert stacks, the
 * F32 router, the 8-expert rules) on Qwen3-30B-A3B's shapes; synth's MoE folder
 * and its streamed GGUF load and run, and the streamed GGUF of a type is the
 * folder converted to that type, byte for byte; bad input fails clearly. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "golden.h"
#include "model/gguf.h"
#include "model/model.h"
#include "q3.h"
#include "temps.h"
#include "test.h"
#include "tools/convert.h"
#include "tools/synth.h"
#include "tools/synth_run.h"
#include "util/file.h"

#define GOLDEN TEST_DATA "/golden"
#define MOE GOLDEN "/moe-tiny"
#define UNIT "ref"

static char tmpdir[512];

static const char *tmp_path(const char *name)
{
    static char buf[8][512];
    static int next;
    char *p = buf[next++ % 8];
    snprintf(p, sizeof buf[0], "%s/%s", tmpdir, name);
    return p;
}

/* Logits [n][V] of tokens, one prefill with every row's logits. */
static float *run(q3_model *m, const int32_t *tokens, int n)
{
    size_t V = (size_t)q3_model_vocab_size(m);
    q3_session_opts o = {.n_ctx = 512, .chunk = n, .backend = UNIT};
    q3_session *s;
    if (q3_session_new(m, &o, &s)) {
        fprintf(stderr, "session: %s\n", q3_last_error());
        return NULL;
    }
    float *out = malloc((size_t)n * V * sizeof(float));
    if (q3_session_prefill(s, tokens, (size_t)n, out, 1)) {
        fprintf(stderr, "run: %s\n", q3_last_error());
        free(out);
        out = NULL;
    }
    q3_session_free(s);
    return out;
}

static float max_diff(const float *a, const float *b, size_t n)
{
    float worst = 0;
    for (size_t i = 0; i < n; i++) {
        float d = fabsf(a[i] - b[i]);
        if (!(d <= worst)) worst = d;
    }
    return worst;
}

/* ---- moe-tiny's folder to GGUF ------------------------------------------- */

static void test_f32_is_the_golden_twin(void)
{
    const char *out = tmp_path("moe-tiny.gguf");
    q3_convert_opts o = {.type = Q3_F32, .no_tokenizer = 1};
    q3_status st = q3_convert(MOE, out, &o);
    CHECK(st == Q3_OK, "convert moe-tiny to f32: %s", q3_last_error());
    if (st) return;
    q3_gguf *ours, *gold;
    CHECK(q3_gguf_open(out, &ours) == Q3_OK, "open ours: %s", q3_last_error());
    CHECK(q3_gguf_open(MOE "/model-f32.gguf", &gold) == Q3_OK, "open golden: %s", q3_last_error());
    const char *arch = NULL;
    uint32_t v = 0;
    CHECK(q3_gguf_get_str(ours, "general.architecture", &arch) == Q3_OK && !strcmp(arch, "qwen3moe"), "qwen3moe");
    CHECK(q3_gguf_get_u32(ours, "qwen3moe.expert_count", &v) == Q3_OK && v == 8, "expert_count %u", v);
    CHECK(q3_gguf_get_u32(ours, "qwen3moe.expert_used_count", &v) == Q3_OK && v == 2, "expert_used_count %u", v);
    CHECK(q3_gguf_get_u32(ours, "qwen3moe.expert_feed_forward_length", &v) == Q3_OK && v == 96, "expert ffn %u", v);
    CHECK(q3_gguf_get_u32(ours, "qwen3moe.block_count", &v) == Q3_OK && v == 3, "block_count %u", v);
    size_t n = q3_gguf_tensor_count(gold), same = 0;
    CHECK(q3_gguf_tensor_count(ours) == n, "%zu tensors, golden %zu", q3_gguf_tensor_count(ours), n);
    for (size_t i = 0; i < n; i++) {
        const q3_tensor *g = q3_gguf_tensor_at(gold, i), *t = q3_gguf_find_tensor(ours, g->name);
        int ok = t && t->dtype == g->dtype && t->ndim == g->ndim &&
                 !memcmp(t->shape, g->shape, (size_t)g->ndim * sizeof g->shape[0]) && t->nbytes == g->nbytes &&
                 !memcmp(t->data, g->data, g->nbytes);
        CHECK(ok, "tensor %s differs from the golden twin's", g->name);
        same += ok;
    }
    printf("moe-tiny f32: %zu of %zu tensors equal the golden GGUF's (names, shapes, types, bytes)\n", same, n);
    q3_gguf_close(ours);
    q3_gguf_close(gold);

    q3_model *folder, *conv;
    golden_case c;
    CHECK(golden_load(MOE, "len64.numpy", &c) == 0, "len64.numpy");
    if (q3_model_open(MOE, &folder)) return;
    if (q3_model_open(out, &conv)) {
        CHECK(0, "open converted: %s", q3_last_error());
        q3_model_close(folder);
        return;
    }
    float *a = run(folder, c.tokens, c.n_tokens), *b = run(conv, c.tokens, c.n_tokens);
    float d = a && b ? max_diff(a, b, (size_t)c.n_tokens * (size_t)c.vocab) : INFINITY;
    CHECK(d <= 1e-6f, "converted F32 logits differ from the folder's by %g", d);
    printf("moe-tiny f32: logits of the converted file vs the folder: max |diff| %g\n", d);
    free(a);
    free(b);
    golden_free(&c);
    q3_model_close(conv);
    q3_model_close(folder);
    unlink(out);
}

/* Each type loads, keeps the router F32 and the stacks in the type, and follows the
 * golden (numpy) logits: max |diff| <= tol, and the argmax equal at no fewer than
 * `agree` of the rows (random weights give nearly flat logits: small top-2 gaps). */
static void test_types_follow_golden(void)
{
    static const struct { q3_dtype t; float tol, agree; } types[] = {
        {Q3_BF16, 0.02f, 0.95f}, {Q3_F16, 0.005f, 0.95f}, {Q3_Q8_0, 0.05f, 0.9f}, {Q3_Q4_0, 0.6f, 0.5f},
    };
    golden_case c;
    CHECK(golden_load(MOE, "len64.numpy", &c) == 0, "len64.numpy");
    if (c.n_tokens == 0) return;
    size_t V = (size_t)c.vocab;
    for (size_t k = 0; k < sizeof types / sizeof types[0]; k++) {
        char name[64];
        snprintf(name, sizeof name, "moe-%s.gguf", q3_dtype_name(types[k].t));
        const char *out = tmp_path(name);
        q3_convert_opts o = {.type = types[k].t, .no_tokenizer = 1};
        q3_status st = q3_convert(MOE, out, &o);
        CHECK(st == Q3_OK, "convert to %s: %s", q3_dtype_name(types[k].t), q3_last_error());
        q3_model *m;
        if (st || (st = q3_model_open(out, &m))) {
            CHECK(0, "open %s: %s", out, q3_last_error());
            continue;
        }
        const q3_layer_weights *L = &m->w.layers[1];
        CHECK(L->router->dtype == Q3_F32 && L->exp_gate->dtype == types[k].t && L->exp_down->dtype == types[k].t &&
              L->wq->dtype == types[k].t && L->exp_down->mats && L->exp_down->mats[7]->dtype == types[k].t,
              "%s: router F32, stacks and matrices in the type", q3_dtype_name(types[k].t));
        float *got = run(m, c.tokens, c.n_tokens);
        float worst = 0;
        int same = 0;
        for (int i = 0; got && i < c.n_rows; i++) {
            const float *g = c.logits + (size_t)i * V, *q = got + (size_t)c.rows[i] * V;
            float d = max_diff(g, q, V);
            if (!(d <= worst)) worst = d;
            same += golden_argmax(g, (int)V) == golden_argmax(q, (int)V);
        }
        CHECK(got && worst <= types[k].tol, "%s: max |diff| from golden %g > %g", q3_dtype_name(types[k].t), worst,
              types[k].tol);
        CHECK(got && same >= types[k].agree * (float)c.n_rows, "%s: top-1 equal at only %d of %d rows",
              q3_dtype_name(types[k].t), same, c.n_rows);
        printf("moe-tiny %s: max |diff| from golden %.4f, top-1 equal at %d of %d rows\n", q3_dtype_name(types[k].t),
               worst, same, c.n_rows);
        free(got);
        q3_model_close(m);
        unlink(out);
    }
    golden_free(&c);
}

/* ---- llama-quantize's types on Qwen3-30B-A3B's shapes ----------------------- */

static int more_bits(int i, int n) { return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2; }

static q3_dtype type_of(const q3_convert_entry *plan, size_t n, const char *name)
{
    for (size_t i = 0; i < n; i++)
        if (!strcmp(plan[i].name, name)) return plan[i].type;
    return Q3_DTYPE_COUNT;
}

static void test_kquant_rules(void)
{
    q3_config c;
    q3_synth_preset_qwen3_30b_a3b(&c);
    size_t n = q3_convert_plan_count(&c);
    CHECK(n == 3 + 12 * 48, "30B-A3B: %zu tensors", n);
    q3_convert_entry *plan = calloc(n, sizeof *plan);
    q3_convert_opts m = {.type = Q3_Q4_K, .kmix = Q3_KMIX_M}, s = {.type = Q3_Q4_K, .kmix = Q3_KMIX_S};
    CHECK(q3_convert_plan(&m, &c, plan) == Q3_OK, "plan q4_k_m: %s", q3_last_error());
    int six = 0, bad = 0;
    uint64_t bytes = 0;
    char nm[64];
    for (size_t i = 0; i < n; i++) {
        const q3_convert_entry *e = &plan[i];
        size_t cols = (size_t)e->shape[e->ndim - 1], rows = 1;
        for (int d = 0; d < e->ndim - 1; d++) rows *= (size_t)e->shape[d];
        bytes += rows * q3_dtype_row_bytes(e->type, cols);
    }
    for (int l = 0; l < 48; l++) {
        snprintf(nm, sizeof nm, "blk.%d.ffn_down_exps.weight", l);
        q3_dtype t = type_of(plan, n, nm);
        six += t == Q3_Q6_K;
        bad += t != (more_bits(l, 48) ? Q3_Q6_K : Q3_Q4_K);
        snprintf(nm, sizeof nm, "blk.%d.attn_v.weight", l);
        bad += type_of(plan, n, nm) != (more_bits(l, 48) ? Q3_Q6_K : Q3_Q4_K);
        static const char *const base[] = {"ffn_gate_exps", "ffn_up_exps", "attn_q", "attn_k", "attn_output"};
        for (size_t k = 0; k < 5; k++) {
            snprintf(nm, sizeof nm, "blk.%d.%s.weight", l, base[k]);
            bad += type_of(plan, n, nm) != Q3_Q4_K;
        }
        snprintf(nm, sizeof nm, "blk.%d.ffn_gate_inp.weight", l);
        bad += type_of(plan, n, nm) != Q3_F32;
        snprintf(nm, sizeof nm, "blk.%d.attn_norm.weight", l);
        bad += type_of(plan, n, nm) != Q3_F32;
    }
    CHECK(bad == 0, "q4_k_m: %d tensors of another type than llama-quantize's", bad);
    CHECK(six == 24, "q4_k_m: %d ffn_down_exps in Q6_K (layers 0-5, 8, 11, ..., 41, 42-47: 24)", six);
    CHECK(type_of(plan, n, "output.weight") == Q3_Q6_K && type_of(plan, n, "token_embd.weight") == Q3_Q4_K,
          "q4_k_m: output Q6_K, token_embd Q4_K");
    const q3_convert_entry *down = &plan[1 + 11];
    CHECK(!strcmp(down->name, "blk.0.ffn_down_exps.weight") && down->ndim == 3 && down->shape[0] == 128 &&
              down->shape[1] == 2048 && down->shape[2] == 768,
          "blk.0.ffn_down_exps is [128][2048][768]");
    printf("Qwen3-30B-A3B at q4_k_m: %.2f GB of tensor data (%d of 48 ffn_down_exps in Q6_K)\n", (double)bytes / 1e9,
           six);
    CHECK(bytes > 18.0e9 && bytes < 19.0e9, "q4_k_m: %.2f GB", (double)bytes / 1e9);

    CHECK(q3_convert_plan(&s, &c, plan) == Q3_OK, "plan q4_k_s");
    bad = 0;
    for (int l = 0; l < 48; l++) {
        snprintf(nm, sizeof nm, "blk.%d.ffn_down_exps.weight", l);
        bad += type_of(plan, n, nm) != (l < 6 ? Q3_Q5_K : Q3_Q4_K);
        snprintf(nm, sizeof nm, "blk.%d.attn_v.weight", l);
        bad += type_of(plan, n, nm) != (l < 4 ? Q3_Q5_K : Q3_Q4_K);
    }
    CHECK(bad == 0, "q4_k_s: %d tensors of another type", bad);

    /* exactly 8 experts: llama-quantize's Mixtral rules */
    c.n_experts = 8;
    CHECK(q3_convert_plan(&m, &c, plan) == Q3_OK, "plan q4_k_m, 8 experts");
    CHECK(type_of(plan, n, "blk.9.attn_v.weight") == Q3_Q8_0 && type_of(plan, n, "blk.9.attn_k.weight") == Q3_Q8_0 &&
              type_of(plan, n, "blk.9.attn_output.weight") == Q3_Q5_K &&
              type_of(plan, n, "blk.9.attn_q.weight") == Q3_Q4_K &&
              type_of(plan, n, "blk.8.ffn_down_exps.weight") == Q3_Q6_K,
          "8 experts, q4_k_m: attn_v/attn_k Q8_0, attn_output Q5_K");
    q3_convert_opts six_k = {.type = Q3_Q6_K}, q8 = {.type = Q3_Q8_0};
    CHECK(q3_convert_plan(&six_k, &c, plan) == Q3_OK && type_of(plan, n, "blk.0.attn_v.weight") == Q3_Q8_0 &&
              type_of(plan, n, "blk.0.attn_output.weight") == Q3_Q6_K,
          "8 experts, q6_k: attn_v Q8_0, attn_output Q6_K");
    CHECK(q3_convert_plan(&q8, &c, plan) == Q3_OK && type_of(plan, n, "blk.0.ffn_gate_inp.weight") == Q3_F32 &&
              type_of(plan, n, "blk.0.ffn_up_exps.weight") == Q3_Q8_0 && type_of(plan, n, "output.weight") == Q3_Q8_0,
          "q8_0 (pure, as llama.cpp's converter): the router F32, all else Q8_0");
    free(plan);
}

/* ---- synth ------------------------------------------------------------------ */

static int files_equal(const char *a, const char *b)
{
    char *x, *y;
    size_t nx, ny;
    if (q3_read_file(a, (size_t)1 << 30, &x, &nx)) return -1;
    if (q3_read_file(b, (size_t)1 << 30, &y, &ny)) {
        free(x);
        return -1;
    }
    int eq = nx == ny && memcmp(x, y, nx) == 0;
    free(x);
    free(y);
    return eq;
}

static void test_synth_moe(void)
{
    q3_config c;
    q3_synth_preset_tiny_moe(&c);
    c.n_experts = 8; /* the Mixtral rules too */
    c.n_experts_used = 2;
    const char *dir = tmp_path("tm");
    q3_status st = q3_synth_write(dir, 5, Q3_BF16, &c, NULL);
    CHECK(st == Q3_OK, "synth tiny-moe folder: %s", q3_last_error());
    if (st) return;
    q3_config back;
    char p[600];
    snprintf(p, sizeof p, "%s/config.json", dir);
    CHECK(q3_config_load(p, &back) == Q3_OK && back.n_experts == 8 && back.n_experts_used == 2 &&
              back.expert_ffn_dim == 256 && back.norm_topk_prob && back.ffn_dim == c.ffn_dim,
          "config.json reads back as the MoE config");

    static const struct { const char *name; q3_dtype t; q3_kmix mix; } types[] = {
        {"q8_0", Q3_Q8_0, Q3_KMIX_M}, {"q4_k_m", Q3_Q4_K, Q3_KMIX_M}, {"bf16", Q3_BF16, Q3_KMIX_M}};
    for (size_t k = 0; k < sizeof types / sizeof types[0]; k++) {
        char a[64], b[64];
        snprintf(a, sizeof a, "tm-%s-streamed.gguf", types[k].name);
        snprintf(b, sizeof b, "tm-%s-converted.gguf", types[k].name);
        const char *pa = tmp_path(a), *pb = tmp_path(b);
        q3_convert_opts o = {.type = types[k].t, .kmix = types[k].mix, .name = "tm", .no_tokenizer = 1};
        CHECK((st = q3_synth_write_gguf(pa, 5, Q3_BF16, &c, &o)) == Q3_OK, "synth --type %s: %s", types[k].name,
              q3_last_error());
        CHECK((st = q3_convert(dir, pb, &o)) == Q3_OK, "convert --type %s: %s", types[k].name, q3_last_error());
        CHECK(files_equal(pa, pb) == 1, "synth --type %s equals synth + convert, byte for byte", types[k].name);
        unlink(pb);
        if (types[k].t == Q3_Q4_K) {
            q3_gguf *g;
            if (q3_gguf_open(pa, &g) == Q3_OK) {
                const q3_tensor *v = q3_gguf_find_tensor(g, "blk.0.attn_v.weight"),
                                *ao = q3_gguf_find_tensor(g, "blk.0.attn_output.weight"),
                                *d0 = q3_gguf_find_tensor(g, "blk.0.ffn_down_exps.weight"),
                                *d1 = q3_gguf_find_tensor(g, "blk.1.ffn_down_exps.weight"),
                                *r = q3_gguf_find_tensor(g, "blk.1.ffn_gate_inp.weight");
                CHECK(v && ao && d0 && d1 && r && v->dtype == Q3_Q8_0 && ao->dtype == Q3_Q5_K &&
                          d0->dtype == Q3_Q4_K && d1->dtype == Q3_Q6_K && r->dtype == Q3_F32 && d1->ndim == 3,
                      "the q4_k_m file's types");
                q3_gguf_close(g);
            }
        }
        if (types[k].t != Q3_Q8_0) unlink(pa);
    }

    /* the folder and its streamed Q8_0 GGUF load and run, and agree */
    q3_model *folder = NULL, *q8 = NULL;
    CHECK(q3_model_open(dir, &folder) == Q3_OK, "open the folder: %s", q3_last_error());
    CHECK(q3_model_open(tmp_path("tm-q8_0-streamed.gguf"), &q8) == Q3_OK, "open the q8_0 GGUF: %s", q3_last_error());
    if (folder && q8) {
        int32_t toks[24];
        for (int i = 0; i < 24; i++) toks[i] = (i * 397 + 11) % c.vocab_size;
        float *a = run(folder, toks, 24), *b = run(q8, toks, 24);
        size_t V = (size_t)c.vocab_size;
        int same = 0;
        float worst = a && b ? max_diff(a, b, 24 * V) : INFINITY;
        for (int t = 0; a && b && t < 24; t++) same += golden_argmax(a + t * V, (int)V) == golden_argmax(b + t * V, (int)V);
        CHECK(a && b && worst < 0.5f && same >= 18, "q8_0 vs folder: max |diff| %g, top-1 equal at %d of 24 rows",
              worst, same);
        printf("tiny-moe q8_0 (streamed) vs its bf16 folder: max |diff| %.4f, top-1 equal at %d of 24 rows\n", worst,
               same);
        free(a);
        free(b);
    }
    q3_model_close(folder);
    q3_model_close(q8);
    unlink(tmp_path("tm-q8_0-streamed.gguf"));
}

/* ---- failures ------------------------------------------------------------------ */

static void test_failures(void)
{
    q3_config c;
    CHECK(q3_synth_preset("qwen3-70b-a7b", &c) == Q3_ERR_INVALID, "unknown preset");
    CHECK_CONTAINS(q3_last_error(), "qwen3-30b-a3b");
    CHECK(q3_synth_preset("30b-a3b", &c) == Q3_OK && c.n_experts == 128, "alias 30b-a3b");
    CHECK(q3_synth_preset("qwen3-235b-a22b", &c) == Q3_OK && c.n_layers == 94 && c.dim == 4096 &&
              c.expert_ffn_dim == 1536 && c.n_heads == 64 && !c.tied_embeddings,
          "235B-A22B's shapes");
    /* Qwen3-30B-A3B has 30.5 B weights, 3.3 B of them active */
    q3_synth_preset_qwen3_30b_a3b(&c);
    uint64_t params = q3_synth_param_count(&c);
    CHECK(params > 30.4e9 && params < 30.6e9, "30B-A3B params %llu", (unsigned long long)params);

    int usage = 0;
    q3_synth_run_opts ro = {.out_dir = tmp_path("never"), .preset = "tiny-moe", .layers = -1};
    CHECK(q3_synth_run(&ro, &usage) == Q3_ERR_INVALID && usage, "--layers below 1 refused");
    CHECK_CONTAINS(q3_last_error(), "--layers");
    ro = (q3_synth_run_opts){.out_dir = tmp_path("never.gguf"), .preset = "tiny-moe", .type_name = "q3_k"};
    CHECK(q3_synth_run(&ro, &usage) == Q3_ERR_INVALID && usage, "unknown --type refused");
    CHECK_CONTAINS(q3_last_error(), "q4_k_m");
    ro = (q3_synth_run_opts){.out_dir = tmp_path("never"), .preset = "qwen3-7b"};
    CHECK(q3_synth_run(&ro, &usage) == Q3_ERR_INVALID && usage, "unknown preset refused");
    CHECK(!q3_file_exists(tmp_path("never")) && !q3_file_exists(tmp_path("never.gguf")), "nothing written");

    /* norm_topk_prob false: no GGUF (llama.cpp's qwen3moe always renormalizes) */
    q3_synth_preset_tiny_moe(&c);
    c.n_layers = 1;
    c.norm_topk_prob = false;
    q3_convert_opts o = {.type = Q3_Q8_0};
    CHECK(q3_synth_write_gguf(tmp_path("nt.gguf"), 1, Q3_BF16, &c, &o) == Q3_ERR_UNSUPPORTED, "synth: refused");
    CHECK_CONTAINS(q3_last_error(), "norm_topk_prob");
    const char *dir = tmp_path("nt");
    CHECK(q3_synth_write(dir, 1, Q3_BF16, &c, NULL) == Q3_OK, "the folder is fine: %s", q3_last_error());
    o.no_tokenizer = 1;
    CHECK(q3_convert(dir, tmp_path("nt.gguf"), &o) == Q3_ERR_UNSUPPORTED, "convert: refused");
    CHECK_CONTAINS(q3_last_error(), "norm_topk_prob");
    CHECK(!q3_file_exists(tmp_path("nt.gguf")) && temps_beside(tmp_path("nt.gguf")) == 0, "no file left");

    /* and the command line says so with a non-zero exit */
    char cmd[2048];
    const char *bin = getenv("Q3_BIN") ? getenv("Q3_BIN") : "./build/q3";
    snprintf(cmd, sizeof cmd, "%s synth --preset tiny-moe --layers 0 -o %s 2>/dev/null", bin, tmp_path("cli"));
    int rc = system(cmd);
    CHECK(rc != -1 && WIFEXITED(rc) && WEXITSTATUS(rc) != 0, "q3 synth --layers 0 fails");
    snprintf(cmd, sizeof cmd, "%s synth --preset qwen3-7b-a1b -o %s 2>&1 | grep -q 'unknown preset'", bin,
             tmp_path("cli"));
    CHECK(system(cmd) == 0, "q3 synth: unknown preset said");
    snprintf(cmd, sizeof cmd, "%s convert %s -o %s --no-tokenizer --type q8_0 2>&1 | grep -q norm_topk_prob", bin, dir,
             tmp_path("cli.gguf"));
    CHECK(system(cmd) == 0, "q3 convert: norm_topk_prob said");
    snprintf(cmd, sizeof cmd, "%s convert %s -o %s --no-tokenizer --type q8_0 >/dev/null 2>&1", bin, dir,
             tmp_path("cli.gguf"));
    rc = system(cmd);
    CHECK(rc != -1 && WIFEXITED(rc) && WEXITSTATUS(rc) != 0, "q3 convert of norm_topk_prob false fails");
    CHECK(!q3_file_exists(tmp_path("cli")) && !q3_file_exists(tmp_path("cli.gguf")), "the CLI wrote nothing");
}

int main(void)
{
    snprintf(tmpdir, sizeof tmpdir, "%s", test_tmpdir());
    test_kquant_rules();
    test_failures();
    test_f32_is_the_golden_twin();
    test_types_follow_golden();
    test_synth_moe();
    TEST_DONE();
}
