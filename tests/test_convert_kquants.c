/* q3 convert's K-quant files against llama-quantize's (no importance matrix),
 * with llama-quantize's own output recorded under tests/data/kquants (how:
 * tests/data/kquants/README.md):
 *   - blocks: edge-case rows (zeros, constants, one-sided, tiny, huge, ties)
 *     quantized by q3's Q4_K, Q5_K and Q6_K quantizers equal llama-quantize's
 *     bytes (edge-*.bin);
 *   - whole files: every tensor of the golden `small` model converted by q3 to
 *     Q4_K_M, Q5_K_M and Q6_K has llama-quantize's type and bytes (a 64-bit
 *     FNV-1a hash of each, small-hashes.txt);
 *   - the mixes: for Qwen3 configs of 1 to 64 layers, tied and untied, and rows
 *     that are not whole super-blocks, q3_convert_pick_type gives the type
 *     llama-quantize gives every tensor in Q4_K_M, Q4_K_S, Q5_K_M, Q5_K_S and
 *     Q6_K (mix.txt, from its --dry-run).
 *
 * Two modes make the inputs for llama-quantize (tests/data/kquants/make.sh):
 *   test_convert_kquants --edge-input OUT.gguf     the edge rows in a tiny F32 Qwen3
 *   test_convert_kquants --take ROWS IN.gguf TENSOR OUT.bin   the first ROWS rows' bytes
 *   test_convert_kquants --hashes TYPE IN.gguf     "TYPE name dtype hash" per 2-D tensor
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tools/convert.h"
#include "model/gguf.h"
#include "model/layout.h"
#include "model/model.h"
#include "model/quantize.h"
#include "tools/synth.h"
#include "q3.h"
#include "temps.h"
#include "test.h"

#define KQ TEST_DATA "/kquants"
#define SMALL TEST_DATA "/golden/small"

static char tmpdir[512];

static const char *tmp_path(const char *name)
{
    static char buf[4][300];
    static int k;
    char *p = buf[k++ % 4];
    snprintf(p, sizeof buf[0], "%s/%s", tmpdir, name);
    return p;
}

/* Removes a folder q3_synth_write made (config.json and model.safetensors). */
static void remove_synth(const char *dir)
{
    char p[400];
    snprintf(p, sizeof p, "%s/config.json", dir);
    unlink(p);
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    unlink(p);
    rmdir(dir);
}

/* ==== the edge-case rows ======================================================================== */

/* Only exactly rounded float operations (no libm), so the rows are the same
 * on every machine. */
static uint32_t rng_state;

static uint32_t next_u32(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 17;
    rng_state ^= rng_state << 5;
    return rng_state;
}

static float uniform(void) { return (float)(next_u32() >> 8) * (1.0f / 16777216.0f); }

/* Irwin-Hall: a bell of variance 1/3 on [-2, 2]. */
static float bell(void) { return uniform() + uniform() + uniform() + uniform() - 2.0f; }

enum { EDGE_ROWS = 8, EDGE_COLS = 256 };

/* Eight rows of one super-block each, each a case a quantizer can get wrong. */
static void edge_rows(float *x)
{
    rng_state = 0x2545F491u;
    for (int r = 0; r < EDGE_ROWS; r++) {
        float *v = x + r * EDGE_COLS;
        for (int i = 0; i < EDGE_COLS; i++) {
            int j = i / 32; /* the Q4_K/Q5_K sub-block; Q6_K's are its halves */
            float g = bell();
            switch (r) {
            case 0: v[i] = 0.02f * g; break;                                   /* weights as trained */
            case 1: v[i] = 0.02f * g * (i % 37 == 3 ? 12.0f : 1.0f); break;   /* with outliers */
            case 2: v[i] = 0.5f + 0.1f * g; break;                             /* all positive */
            case 3: v[i] = -0.5f + 0.1f * g; break;                            /* all negative */
            case 4:                                                            /* one kind per sub-block */
                v[i] = j == 0   ? 0.0f
                       : j == 1 ? 0.3f
                       : j == 2 ? -0.7f
                       : j == 3 ? (i % 32 == 5 ? 0.9f : 0.0f)
                       : j == 4 ? 1e-3f * g
                       : j == 5 ? (float)(i % 16) * 0.125f - 1.0f
                       : j == 6 ? (i % 2 ? 1.0f : -1.0f)
                                : 0.02f * g;
                break;
            case 5: v[i] = 1e-7f * g; break;                                   /* scales below f16's range */
            case 6: v[i] = 300.0f * g + (i % 3 ? 0.0f : 1000.0f); break;       /* large */
            default: v[i] = (float)(i % 64) * 0.0625f - 2.0f; break;           /* a grid: rounding ties */
            }
        }
    }
}

/* Writes a 1-layer F32 Qwen3 GGUF (hidden 256, one head of 8: attn_q is 8 x 256)
 * whose blk.0.attn_q.weight holds the edge rows, for llama-quantize. */
static int write_edge_input(const char *out)
{
    q3_config c;
    q3_synth_preset_tiny(&c);
    c.n_layers = 1, c.dim = 256, c.ffn_dim = 256, c.n_heads = 1, c.n_kv_heads = 1, c.head_dim = 8;
    c.vocab_size = 256, c.tied_embeddings = true;
    snprintf(tmpdir, sizeof tmpdir, "%s", test_tmpdir());
    const char *dir = tmp_path("hf");
    q3_model *m = NULL;
    q3_status st = q3_synth_write(dir, 1, Q3_F32, &c, NULL);
    if (!st) st = q3_model_open(dir, &m);
    if (!st) {
        static float rows[EDGE_ROWS * EDGE_COLS];
        edge_rows(rows);
        q3_tensor t = *m->w.layers[0].wq;
        if (t.dtype != Q3_F32 || t.shape[0] != EDGE_ROWS || t.shape[1] != EDGE_COLS) {
            fprintf(stderr, "attn_q is not %d x %d F32\n", EDGE_ROWS, EDGE_COLS);
            return 1;
        }
        t.data = rows;
        m->w.layers[0].wq = &t;
        q3_convert_opts o = {.type = Q3_F32, .no_tokenizer = 1, .name = "kquant-edge"};
        st = q3_convert_model(m, out, &o);
        q3_model_close(m);
    }
    remove_synth(dir);
    rmdir(tmpdir);
    if (st) fprintf(stderr, "%s\n", q3_last_error());
    return st ? 1 : 0;
}

static int take_rows(int rows, const char *in, const char *name, const char *out)
{
    q3_gguf *g;
    if (q3_gguf_open(in, &g)) {
        fprintf(stderr, "%s\n", q3_last_error());
        return 1;
    }
    const q3_tensor *t = q3_gguf_find_tensor(g, name);
    int rc = 1;
    if (t && rows > 0 && rows <= t->shape[0]) {
        FILE *f = fopen(out, "wb");
        size_t n = (size_t)rows * q3_dtype_row_bytes(t->dtype, (size_t)t->shape[t->ndim - 1]);
        rc = !f || fwrite(t->data, 1, n, f) != n;
        if (f && fclose(f)) rc = 1;
        printf("%s: %d rows of %s (%s), %zu bytes\n", out, rows, name, q3_dtype_name(t->dtype), n);
    } else {
        fprintf(stderr, "%s: no tensor %s with %d rows\n", in, name, rows);
    }
    q3_gguf_close(g);
    return rc;
}

/* ==== hashes of whole tensors ===================================================================== */

static uint64_t fnv1a(const void *p, size_t n)
{
    const unsigned char *b = p;
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

static int print_hashes(const char *type, const char *in)
{
    q3_gguf *g;
    if (q3_gguf_open(in, &g)) {
        fprintf(stderr, "%s\n", q3_last_error());
        return 1;
    }
    for (size_t i = 0; i < q3_gguf_tensor_count(g); i++) {
        const q3_tensor *t = q3_gguf_tensor_at(g, i);
        if (t->ndim < 2) continue;
        printf("%s %s %s %016llx\n", type, t->name, q3_dtype_name(t->dtype), (unsigned long long)fnv1a(t->data, t->nbytes));
    }
    q3_gguf_close(g);
    return 0;
}

/* ==== tests ======================================================================================= */

static unsigned char *read_all(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    unsigned char *b = malloc(1 << 16);
    *len = b ? fread(b, 1, 1 << 16, f) : 0;
    fclose(f);
    return b;
}

/* q3's quantizers on the edge rows give llama-quantize's bytes. */
static void test_edge_blocks(void)
{
    static float x[EDGE_ROWS * EDGE_COLS];
    edge_rows(x);
    static const struct {
        q3_dtype t;
        const char *file;
    } cases[] = {{Q3_Q4_K, KQ "/edge-q4_k.bin"}, {Q3_Q5_K, KQ "/edge-q5_k.bin"}, {Q3_Q6_K, KQ "/edge-q6_k.bin"}};
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        size_t len = 0, row = q3_dtype_row_bytes(cases[k].t, EDGE_COLS);
        unsigned char *want = read_all(cases[k].file, &len);
        CHECK(want && len == EDGE_ROWS * row, "%s: %zu bytes, want %zu", cases[k].file, len, EDGE_ROWS * row);
        if (!want || len != EDGE_ROWS * row) {
            free(want);
            continue;
        }
        unsigned char got[EDGE_ROWS * 210];
        CHECK(q3_quantize(cases[k].t, x, got, EDGE_ROWS * EDGE_COLS) == Q3_OK, "quantize");
        for (int r = 0; r < EDGE_ROWS; r++) {
            size_t b = 0;
            while (b < row && got[r * row + b] == want[r * row + b]) b++;
            CHECK(b == row, "%s edge row %d: byte %zu of %zu is %02x, llama-quantize's %02x", q3_dtype_name(cases[k].t),
                  r, b, row, b < row ? got[r * row + b] : 0, b < row ? want[r * row + b] : 0);
        }
        /* the same rows quantized one at a time: a row's bytes depend on it alone */
        unsigned char one[210];
        q3_quantize(cases[k].t, x + 5 * EDGE_COLS, one, EDGE_COLS);
        CHECK(!memcmp(one, want + 5 * row, row), "%s: row 5 alone", q3_dtype_name(cases[k].t));
        free(want);
    }
    /* non-finite input (which llama-quantize refuses) quantizes as zeros there */
    float y[256];
    memcpy(y, x, sizeof y);
    unsigned char a[210], b[210];
    for (int k = 0; k < 3; k++) {
        q3_dtype t = k == 0 ? Q3_Q4_K : k == 1 ? Q3_Q5_K : Q3_Q6_K;
        y[7] = 0.0f, y[100] = 0.0f;
        q3_quantize(t, y, a, 256);
        y[7] = NAN, y[100] = -INFINITY;
        q3_quantize(t, y, b, 256);
        CHECK(!memcmp(a, b, q3_dtype_row_bytes(t, 256)), "%s: NaN and inf quantize as 0", q3_dtype_name(t));
    }
}

/* The golden `small` model (4 layers, hidden 256, ffn 768, untied, F32) through
 * q3 convert: every 2-D tensor has llama-quantize's type and bytes. */
static void test_small_files(void)
{
    FILE *f = fopen(KQ "/small-hashes.txt", "r");
    CHECK(f != NULL, "%s", KQ "/small-hashes.txt");
    if (!f) return;
    static const char *const types[] = {"Q4_K_M", "Q5_K_M", "Q6_K"};
    q3_model *m = NULL;
    CHECK(q3_model_open(SMALL, &m) == Q3_OK, "open %s: %s", SMALL, q3_last_error());
    if (!m) {
        fclose(f);
        return;
    }
    for (size_t k = 0; k < 3; k++) {
        q3_convert_opts o = {.no_tokenizer = 1};
        CHECK(q3_convert_parse_type(types[k], &o.type, &o.kmix) == 0, "parse %s", types[k]);
        const char *out = tmp_path("small-kq.gguf");
        CHECK(q3_convert_model(m, out, &o) == Q3_OK, "convert small to %s: %s", types[k], q3_last_error());
        q3_gguf *g = NULL;
        CHECK(q3_gguf_open(out, &g) == Q3_OK, "open converted: %s", q3_last_error());
        if (!g) continue;
        uint32_t ft = 0;
        CHECK(q3_gguf_get_u32(g, "general.file_type", &ft) == Q3_OK && ft == q3_convert_file_type(o.type, o.kmix) &&
                  ft == (k == 0 ? 15u : k == 1 ? 17u : 18u),
              "%s: general.file_type %u", types[k], ft);
        char line[256], ty[32], name[128], dt[32];
        unsigned long long h;
        int n = 0, same = 0;
        rewind(f);
        while (fgets(line, sizeof line, f)) {
            if (sscanf(line, "%31s %127s %31s %llx", ty, name, dt, &h) != 4 || strcmp(ty, types[k])) continue;
            n++;
            const q3_tensor *t = q3_gguf_find_tensor(g, name);
            int ok = t && !strcmp(q3_dtype_name(t->dtype), dt) && fnv1a(t->data, t->nbytes) == h;
            same += ok;
            CHECK(ok, "%s %s: %s, llama-quantize %s (bytes %s)", types[k], name, t ? q3_dtype_name(t->dtype) : "missing", dt,
                  t && fnv1a(t->data, t->nbytes) == h ? "equal" : "differ");
        }
        /* 4 layers x 7 matrices + token_embd + output */
        CHECK(n == 30 && same == n, "%s: %d of %d tensors as llama-quantize's", types[k], same, n);
        q3_gguf_close(g);
        /* and q3 loads what it wrote */
        q3_model *back = NULL;
        CHECK(q3_model_open(out, &back) == Q3_OK, "open %s file: %s", types[k], q3_last_error());
        q3_model_close(back);
        unlink(out);
    }
    q3_model_close(m);
    fclose(f);
}

/* The one-letter type codes of mix.txt. */
static int code_of(q3_dtype t)
{
    switch (t) {
    case Q3_Q4_K: return '4';
    case Q3_Q5_K: return '5';
    case Q3_Q6_K: return '6';
    case Q3_Q8_0: return '8';
    case Q3_F16: return 'h';
    case Q3_F32: return 'f';
    default: return '?';
    }
}

/* Parses "key=value" from a mix.txt line. */
static const char *field(const char *line, const char *key, char *out, size_t n)
{
    char pat[40];
    snprintf(pat, sizeof pat, " %s=", key);
    const char *p = strstr(line, pat);
    if (!p) return NULL;
    p += strlen(pat);
    size_t k = strcspn(p, " \n");
    if (k >= n) k = n - 1;
    memcpy(out, p, k);
    out[k] = 0;
    return out;
}

static int ifield(const char *line, const char *key)
{
    char v[32];
    return field(line, key, v, sizeof v) ? atoi(v) : -1;
}

/* One tensor against its code: q3 picks that type, or refuses where llama-quantize
 * picks Q5_0 ('a') or Q5_1 ('b'). Returns 1 when they agree. */
static int check_pick(const q3_convert_opts *o, const q3_config *c, const char *name, const int64_t shape[2], int want)
{
    q3_dtype got = Q3_DTYPE_COUNT;
    q3_status st = q3_convert_pick_type(o, c, c->tied_embeddings, name, 2, shape, &got);
    if (want == 'a' || want == 'b')
        return st == Q3_ERR_UNSUPPORTED && strstr(q3_last_error(), name) &&
               strstr(q3_last_error(), want == 'a' ? "Q5_0" : "Q5_1");
    return st == Q3_OK && code_of(got) == want;
}

static void test_mix(void)
{
    FILE *f = fopen(KQ "/mix.txt", "r");
    CHECK(f != NULL, "%s", KQ "/mix.txt");
    if (!f) return;
    char line[1024];
    int n_lines = 0, n_tensors = 0, bad = 0, seen_fallback = 0, seen_f16 = 0, max_layers = 0;
    q3_config c = {0};
    while (fgets(line, sizeof line, f)) {
        if (line[0] == '#' || line[0] == '\n') continue;
        if (!strncmp(line, "config ", 7)) {
            memset(&c, 0, sizeof c);
            c.n_layers = ifield(line, "layers"), c.dim = ifield(line, "dim"), c.ffn_dim = ifield(line, "ffn");
            c.n_heads = ifield(line, "heads"), c.n_kv_heads = ifield(line, "kv"), c.head_dim = ifield(line, "head_dim");
            c.vocab_size = ifield(line, "vocab"), c.tied_embeddings = ifield(line, "tied") == 1;
            if (c.n_layers > max_layers) max_layers = c.n_layers;
            continue;
        }
        char ftype[16];
        q3_convert_opts o = {0};
        if (c.n_layers <= 0 || sscanf(line, "%15s", ftype) != 1 || q3_convert_parse_type(ftype, &o.type, &o.kmix)) {
            CHECK(0, "mix.txt: bad line %s", line);
            continue;
        }
        n_lines++;
        char v[128];
        int64_t shape[3];
        /* token_embd and output */
        q3_layout_shape(&q3_embed_layout, &c, shape);
        if (field(line, "token_embd", v, sizeof v)) {
            n_tensors++;
            if (!check_pick(&o, &c, q3_embed_layout.gguf, shape, v[0])) {
                if (bad++ < 10) CHECK(0, "%s token_embd: llama-quantize %c", line, v[0]);
            }
        }
        if (!c.tied_embeddings && field(line, "output", v, sizeof v)) {
            n_tensors++;
            if (!check_pick(&o, &c, q3_lm_head_layout.gguf, shape, v[0])) {
                if (bad++ < 10) CHECK(0, "%s output: llama-quantize %c", line, v[0]);
            }
        }
        for (size_t i = 0; i < Q3_LAYER_TENSORS; i++) {
            const q3_tensor_layout *t = &q3_layer_layout[i];
            if (q3_layout_shape(t, &c, shape) < 2) continue;
            if (!field(line, t->gguf, v, sizeof v)) {
                CHECK(0, "mix.txt: no %s in %s", t->gguf, line);
                continue;
            }
            size_t len = strlen(v);
            for (int l = 0; l < c.n_layers; l++) {
                int want = len == 1 ? v[0] : (size_t)l < len ? v[l] : 0;
                char name[64];
                q3_layer_tensor_name(l, i, 1, name, sizeof name);
                n_tensors++;
                seen_fallback += want == 'a' || want == 'b' || want == '8';
                seen_f16 += want == 'h';
                if (!check_pick(&o, &c, name, shape, want) && bad++ < 10)
                    CHECK(0, "%s: %s llama-quantize %c", ftype, name, want ? want : '?');
            }
        }
    }
    fclose(f);
    if (getenv("Q3_TEST_VERBOSE"))
        printf("mix: %d configs x types, %d tensors, %d disagree\n", n_lines, n_tensors, bad);
    CHECK(bad == 0, "%d of %d tensors typed unlike llama-quantize", bad, n_tensors);
    CHECK(n_lines >= 50 && max_layers >= 64 && seen_fallback > 0 && seen_f16 > 0,
          "mix.txt covers %d lines, up to %d layers, fallbacks %d, f16 %d", n_lines, max_layers, seen_fallback, seen_f16);
}

static void test_names(void)
{
    q3_dtype t;
    q3_kmix k;
    CHECK(!q3_convert_parse_type("q4_k_m", &t, &k) && t == Q3_Q4_K && k == Q3_KMIX_M, "q4_k_m");
    CHECK(!q3_convert_parse_type("Q4_K_S", &t, &k) && t == Q3_Q4_K && k == Q3_KMIX_S, "Q4_K_S");
    CHECK(!q3_convert_parse_type("q4_k", &t, &k) && t == Q3_Q4_K && k == Q3_KMIX_M, "q4_k is q4_k_m");
    CHECK(!q3_convert_parse_type("q5_k", &t, &k) && t == Q3_Q5_K && k == Q3_KMIX_M, "q5_k is q5_k_m");
    CHECK(!q3_convert_parse_type("q5_k_s", &t, &k) && t == Q3_Q5_K && k == Q3_KMIX_S, "q5_k_s");
    CHECK(!q3_convert_parse_type("q6_k", &t, &k) && t == Q3_Q6_K, "q6_k");
    CHECK(!q3_convert_parse_type("bf16", &t, &k) && t == Q3_BF16, "bf16");
    CHECK(q3_convert_parse_type("q4_k_l", &t, &k) == -1 && q3_convert_parse_type("q6_k_m", &t, &k) == -1, "unknown");
    CHECK(!strcmp(q3_convert_type_name(Q3_Q5_K, Q3_KMIX_S), "q5_k_s") &&
              !strcmp(q3_convert_type_name(Q3_Q4_K, Q3_KMIX_M), "q4_k_m") &&
              !strcmp(q3_convert_type_name(Q3_Q6_K, Q3_KMIX_S), "q6_k") &&
              !strcmp(q3_convert_type_name(Q3_Q8_0, Q3_KMIX_M), "q8_0"),
          "names");
    CHECK(q3_convert_file_type(Q3_Q4_K, Q3_KMIX_S) == 14 && q3_convert_file_type(Q3_Q4_K, Q3_KMIX_M) == 15 &&
              q3_convert_file_type(Q3_Q5_K, Q3_KMIX_S) == 16 && q3_convert_file_type(Q3_Q5_K, Q3_KMIX_M) == 17 &&
              q3_convert_file_type(Q3_Q6_K, Q3_KMIX_M) == 18,
          "llama_ftype codes");
}

/* Where llama-quantize would write Q5_0, q3 convert refuses and leaves nothing;
 * Q6_K's fallback (Q8_0) it writes. */
static void test_refusal(void)
{
    q3_config c;
    q3_synth_preset_tiny(&c);
    c.n_layers = 2, c.dim = 256, c.ffn_dim = 384, c.n_heads = 2, c.n_kv_heads = 1, c.head_dim = 128;
    c.vocab_size = 256, c.tied_embeddings = true;
    const char *dir = tmp_path("ffn384");
    q3_model *m = NULL;
    CHECK(q3_synth_write(dir, 3, Q3_F32, &c, NULL) == Q3_OK && q3_model_open(dir, &m) == Q3_OK, "synth: %s",
          q3_last_error());
    if (!m) return;
    const char *out = tmp_path("ffn384.gguf");
    q3_convert_opts o = {.type = Q3_Q4_K, .no_tokenizer = 1};
    CHECK(q3_convert_model(m, out, &o) == Q3_ERR_UNSUPPORTED, "q4_k_m refused");
    CHECK_CONTAINS(q3_last_error(), "blk.0.ffn_down.weight has rows of 384 values");
    CHECK_CONTAINS(q3_last_error(), "Q5_0");
    CHECK(access(out, F_OK) != 0, "nothing written");
    o.type = Q3_Q6_K;
    CHECK(q3_convert_model(m, out, &o) == Q3_OK, "q6_k: %s", q3_last_error());
    q3_model *q = NULL;
    CHECK(q3_model_open(out, &q) == Q3_OK, "open: %s", q3_last_error());
    if (q)
        CHECK(q->w.layers[0].w_down->dtype == Q3_Q8_0 && q->w.layers[1].wq->dtype == Q3_Q6_K &&
                  q->w.embed->dtype == Q3_Q6_K,
              "q6_k with ffn rows of 384: down %s", q3_dtype_name(q->w.layers[0].w_down->dtype));
    q3_model_close(q);
    q3_model_close(m);
    unlink(out);
    remove_synth(dir);
}

int main(int argc, char **argv)
{
    if (argc == 3 && !strcmp(argv[1], "--edge-input")) return write_edge_input(argv[2]);
    if (argc == 6 && !strcmp(argv[1], "--take")) return take_rows(atoi(argv[2]), argv[3], argv[4], argv[5]);
    if (argc == 4 && !strcmp(argv[1], "--hashes")) return print_hashes(argv[2], argv[3]);
    if (argc > 1) {
        fprintf(stderr, "usage: %s [--edge-input OUT.gguf | --take ROWS IN.gguf TENSOR OUT.bin | --hashes TYPE IN.gguf]\n",
                argv[0]);
        return 2;
    }
    snprintf(tmpdir, sizeof tmpdir, "%s", test_tmpdir());
    test_names();
    test_edge_blocks();
    test_mix();
    test_small_files();
    test_refusal();
    rmdir(tmpdir);
    TEST_DONE();
}
