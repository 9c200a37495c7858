/* RoPE scaling (YaRN) and the config.json fields q3 refuses rather than ignore
 * (issue 11, item 7). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "temps.h"
#include "test.h"
#include "model/config.h"
#include "tools/convert.h"
#include "model/model.h"
#include "model/rope.h"
#include "model/safetensors.h"
#include "q3.h"

/* The YaRN frequencies of Qwen's model-card setting, written out: theta 1e6,
 * head_dim 128, factor 4, original context 32768, beta 32 / 1.
 *   corr(32) = 128 ln(32768 / (2 pi 32)) / (2 ln 1e6) = 23.60 -> low = 23
 *   corr(1)  = 128 ln(32768 / (2 pi))    / (2 ln 1e6) = 39.65 -> high = 40
 * pairs 0..23 keep theta^(-2i/128), pairs 40..63 are divided by 4, and in
 * between the ramp (i - 23) / 17 blends them; cos and sin scale by 0.1 ln 4 + 1. */
static void test_yarn_formula(void)
{
    q3_config c = {.head_dim = 128, .rope_theta = 1e6f};
    double scale;
    for (int i = 0; i < 64; i++) {
        double base = pow(1e6, -2.0 * i / 128);
        double f = q3_rope_freq(&c, i, &scale);
        CHECK(fabs(f - base) <= 1e-15 * base && scale == 1.0, "plain RoPE pair %d: %g vs %g", i, f, base);
    }
    c.rope_scaling = (q3_rope_scaling){.type = Q3_ROPE_YARN, .factor = 4, .orig_ctx = 32768, .beta_fast = 32,
                                       .beta_slow = 1, .truncate = 1};
    double lo = 128 * log(32768 / (2 * M_PI * 32)) / (2 * log(1e6)), hi = 128 * log(32768 / (2 * M_PI)) / (2 * log(1e6));
    CHECK(floor(lo) == 23 && ceil(hi) == 40, "correction range %g..%g", lo, hi);
    for (int i = 0; i < 64; i++) {
        double base = pow(1e6, -2.0 * i / 128);
        double ramp = i <= 23 ? 0 : i >= 40 ? 1 : (i - 23) / 17.0;
        double want = base * (1 - ramp) + base / 4 * ramp;
        double f = q3_rope_freq(&c, i, &scale);
        CHECK(fabs(f - want) <= 1e-12 * want, "YaRN pair %d: %.17g vs %.17g", i, f, want);
        CHECK(fabs(scale - (0.1 * log(4.0) + 1)) < 1e-15, "YaRN scale %.17g", scale);
    }
    /* the optional parameters: explicit attention_factor; mscale ratio; no truncation */
    c.rope_scaling.attn_factor = 0.5f;
    q3_rope_freq(&c, 0, &scale);
    CHECK(scale == 0.5, "attention_factor given: %g", scale);
    c.rope_scaling.attn_factor = 0;
    c.rope_scaling.mscale = 2;
    c.rope_scaling.mscale_all_dim = 1;
    q3_rope_freq(&c, 0, &scale);
    CHECK(fabs(scale - (0.2 * log(4.0) + 1) / (0.1 * log(4.0) + 1)) < 1e-12, "mscale ratio: %g", scale);
    c.rope_scaling.truncate = 0;
    double f30 = q3_rope_freq(&c, 30, &scale), base30 = pow(1e6, -60.0 / 128), r30 = (30 - lo) / (hi - lo);
    CHECK(fabs(f30 - (base30 * (1 - r30) + base30 / 4 * r30)) < 1e-12 * base30, "truncate false: %g", f30);
}

static const char *TINY = TEST_DATA "/golden/tiny";

static char dir[512];

/* A copy of the tiny model (its weights; its config.json's sizes) whose config
 * also holds `extra` (JSON members followed by a comma). */
static int make_model(const char *extra)
{
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "rm -rf %s && mkdir -p %s && cp %s/model.safetensors %s/", dir, dir, TINY, dir);
    if (system(cmd)) return -1;
    char path[640];
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *f = fopen(path, "w");
    if (!f) return -1;
    fprintf(f, "{%s \"architectures\": [\"Qwen3ForCausalLM\"], \"model_type\": \"qwen3\", \"head_dim\": 32, "
               "\"hidden_size\": 64, \"intermediate_size\": 192, \"max_position_embeddings\": 40960, "
               "\"num_attention_heads\": 4, \"num_hidden_layers\": 2, \"num_key_value_heads\": 2, "
               "\"rms_norm_eps\": 1e-06, \"rope_theta\": 1000000.0, \"tie_word_embeddings\": true, "
               "\"torch_dtype\": \"float32\", \"vocab_size\": 1024}\n",
            extra);
    return fclose(f);
}

/* Logits of tokens 0..n-1 (all rows) of the model at path on unit `unit`; NULL on failure. */
static float *logits_of(const char *path, const char *unit, int n, q3_config *cfg)
{
    q3_model *m = NULL;
    if (q3_model_open(path, &m)) {
        fprintf(stderr, "%s: %s\n", path, q3_last_error());
        return NULL;
    }
    if (cfg) *cfg = m->cfg;
    q3_session_opts so = {.n_ctx = 64, .chunk = 16, .backend = unit, .kv_dtype = "f32"};
    q3_session *s = NULL;
    int32_t toks[64];
    for (int i = 0; i < n; i++) toks[i] = (i * 37 + 5) % 1024;
    float *lg = malloc((size_t)n * 1024 * sizeof *lg);
    if (!lg || q3_session_new(m, &so, &s) || q3_session_prefill(s, toks, (size_t)n, lg, 1)) {
        fprintf(stderr, "%s: %s\n", path, q3_last_error());
        free(lg);
        lg = NULL;
    }
    q3_session_free(s);
    q3_model_close(m);
    return lg;
}

static double max_diff(const float *a, const float *b, size_t n)
{
    double d = 0;
    for (size_t i = 0; i < n; i++) d = fmax(d, fabs((double)a[i] - b[i]));
    return d;
}

/* YaRN reaches the forward pass on every unit and through both loaders. */
static void test_yarn_model(void)
{
    enum { N = 40 };
    q3_config cfg;
    float *plain = logits_of(TINY, "ref", N, NULL);
    CHECK(make_model("\"rope_scaling\": {\"rope_type\": \"yarn\", \"factor\": 4.0, "
                     "\"original_max_position_embeddings\": 64},") == 0, "copy");
    float *yr = logits_of(dir, "ref", N, &cfg);
    float *yc = logits_of(dir, "cpu", N, NULL);
    CHECK(cfg.rope_scaling.type == Q3_ROPE_YARN && cfg.rope_scaling.factor == 4 && cfg.rope_scaling.orig_ctx == 64,
          "config read: type %d factor %g orig %d", cfg.rope_scaling.type, (double)cfg.rope_scaling.factor,
          cfg.rope_scaling.orig_ctx);
    if (plain && yr && yc) {
        double d_plain = max_diff(plain, yr, (size_t)N * 1024), d_units = max_diff(yr, yc, (size_t)N * 1024);
        CHECK(d_plain > 1e-2, "YaRN changes the logits: max |diff| %g", d_plain);
        CHECK(d_units < 1e-4, "ref and cpu agree under YaRN: %g", d_units);
        /* position 0 is not rotated: row 0 differs only by the cos scale on q and k */
        CHECK(max_diff(plain, yr, 1024) < d_plain, "row 0 moves least");
    }
    /* through GGUF: convert writes qwen3.rope.scaling.*, the GGUF loader reads them */
    char gguf[128];
    snprintf(gguf, sizeof gguf, "%s.gguf", dir);
    q3_convert_opts co = {.type = Q3_F32, .no_tokenizer = 1};
    CHECK(q3_convert(dir, gguf, &co) == Q3_OK, "convert: %s", q3_last_error());
    float *yg = logits_of(gguf, "ref", N, &cfg);
    CHECK(cfg.rope_scaling.type == Q3_ROPE_YARN && cfg.rope_scaling.factor == 4 && cfg.rope_scaling.orig_ctx == 64,
          "GGUF config read: type %d factor %g orig %d", cfg.rope_scaling.type, (double)cfg.rope_scaling.factor,
          cfg.rope_scaling.orig_ctx);
    if (yr && yg) CHECK(max_diff(yr, yg, (size_t)N * 1024) < 1e-6, "GGUF = safetensors under YaRN");
    remove(gguf);
    /* "default" and null are plain RoPE */
    CHECK(make_model("\"rope_parameters\": {\"rope_type\": \"default\", \"rope_theta\": 1000000.0},") == 0, "copy");
    float *dflt = logits_of(dir, "ref", N, NULL);
    if (plain && dflt) CHECK(max_diff(plain, dflt, (size_t)N * 1024) == 0, "rope_type default = plain");
    free(plain);
    free(yr);
    free(yc);
    free(yg);
    free(dflt);
}

/* Fields that change the math and that q3 does not implement: refused, by name. */
static void test_config_refusals(void)
{
    static const struct { const char *extra, *named; } bad[] = {
        {"\"attention_bias\": true,", "attention_bias"},
        {"\"mlp_bias\": true,", "mlp_bias"},
        {"\"hidden_act\": \"gelu\",", "hidden_act"},
        {"\"use_sliding_window\": true,", "use_sliding_window"},
        {"\"partial_rotary_factor\": 0.5,", "partial_rotary_factor"},
        {"\"layer_types\": [\"full_attention\", \"sliding_attention\"],", "layer_types"},
        {"\"rope_scaling\": {\"rope_type\": \"linear\", \"factor\": 2.0},", "linear"},
        {"\"rope_scaling\": {\"type\": \"dynamic\", \"factor\": 2.0},", "dynamic"},
        {"\"rope_scaling\": {\"rope_type\": \"yarn\", \"factor\": 4.0, \"low_freq_factor\": 1},", "low_freq_factor"},
        {"\"rope_scaling\": {\"rope_type\": \"yarn\", \"factor\": 0.5},", "factor"},
        {"\"rope_scaling\": {\"rope_type\": \"yarn\"},", "factor"},
        {"\"rope_scaling\": {\"factor\": 4.0},", "rope_type"},
        {"\"hidden_size\": 64,", "\"hidden_size\" appears twice"},
        {"\"rope_scaling\": {\"rope_type\": \"yarn\", \"factor\": 4.0, \"factor\": 2.0},", "\"factor\" appears twice"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        CHECK(make_model(bad[i].extra) == 0, "copy");
        q3_model *m = NULL;
        q3_status st = q3_model_open(dir, &m);
        CHECK(st != Q3_OK && !m, "%s: accepted", bad[i].extra);
        if (st) CHECK(strstr(q3_last_error(), bad[i].named) != NULL, "%s: message \"%s\" names %s", bad[i].extra,
                      q3_last_error(), bad[i].named);
        q3_model_close(m);
    }
    /* accepted as they are: the values q3 implements */
    CHECK(make_model("\"attention_bias\": false, \"hidden_act\": \"silu\", \"use_sliding_window\": false, "
                     "\"rope_scaling\": {\"type\": \"yarn\", \"factor\": 2.0, \"beta_fast\": 16, \"beta_slow\": 2},") == 0,
          "copy");
    q3_model *m = NULL;
    CHECK(q3_model_open(dir, &m) == Q3_OK, "%s", q3_last_error());
    if (m) CHECK(m->cfg.rope_scaling.beta_fast == 16 && m->cfg.rope_scaling.beta_slow == 2 &&
                 m->cfg.rope_scaling.orig_ctx == 40960, "betas and default original context");
    q3_model_close(m);

    /* a safetensors header with a key twice inside an entry */
    const char hdr[] = "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4],\"dtype\":\"F16\"}}";
    char path[640];
    snprintf(path, sizeof path, "%s/dup.safetensors", dir);
    FILE *f = fopen(path, "wb");
    if (f) {
        unsigned long long n = sizeof hdr - 1;
        unsigned char len[8];
        for (int k = 0; k < 8; k++) len[k] = (unsigned char)(n >> (8 * k));
        fwrite(len, 1, 8, f);
        fwrite(hdr, 1, n, f);
        fwrite("\0\0\0\0", 1, 4, f);
        fclose(f);
    }
    q3_safetensors sf;
    q3_status st = q3_safetensors_open(path, &sf);
    CHECK(st == Q3_ERR_FORMAT && strstr(q3_last_error(), "\"dtype\" appears twice"), "safetensors: %s",
          st ? q3_last_error() : "accepted");
    if (st == Q3_OK) q3_safetensors_close(&sf);
}

int main(void)
{
    snprintf(dir, sizeof dir, "%s/model", test_tmpdir());
    test_yarn_formula();
    test_yarn_model();
    test_config_refusals();
    TEST_DONE();
}
