/* GGUF: the golden files' metadata and tensors against their safetensors twins,
 * the quantizers against llama.cpp's bytes, writer round trips, and hostile
 * files (truncated, mutated, absurd counts) that must fail cleanly. */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "model/gguf.h"
#include "tools/gguf_write.h"
#include "model/quantize.h"
#include "model/safetensors.h"
#include "text/tokenizer_gguf.h"
#include "util/error.h"
#include "util/file.h"
#include "test.h"
#include "temps.h"

#define GOLDEN TEST_DATA "/golden"

static char tmpdir[512];

/* A path inside this run's temporary folder. */
static const char *tmp_path(const char *name)
{
    static char buf[4][256];
    static int next;
    char *p = buf[next++ % 4];
    snprintf(p, sizeof buf[0], "%s/%s", tmpdir, name);
    return p;
}

static int write_file(const char *path, const void *p, size_t n)
{
    FILE *f = fopen(path, "wb");
    if (!f) return 0;
    int ok = fwrite(p, 1, n, f) == n;
    return fclose(f) == 0 && ok;
}

static uint8_t *slurp(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *p = malloc((size_t)len + 1);
    *n = fread(p, 1, (size_t)len, f);
    fclose(f);
    return p;
}

/* ==== golden files: metadata ====================================================== */

typedef struct golden_cfg {
    const char *gguf, *safetensors, *name;
    uint32_t layers, dim, ffn, heads, kv_heads, head_dim, vocab;
    uint32_t file_type; /* general.file_type: 0 F32, 32 BF16, 7 Q8_0, 2 Q4_0 */
    int tied;
} golden_cfg;

static const golden_cfg goldens[] = {
    {GOLDEN "/tiny/model-f32.gguf", GOLDEN "/tiny/model.safetensors", "tiny", 2, 64, 192, 4, 2, 32, 1024, 0, 1},
    {GOLDEN "/small-bf16/model-bf16.gguf", GOLDEN "/small-bf16/model.safetensors", "small-bf16", 4, 256, 768, 8, 2, 64,
     4096, 32, 0},
    {GOLDEN "/small-q8_0/model-q8_0.gguf", GOLDEN "/small/model.safetensors", "small", 4, 256, 768, 8, 2, 64, 4096, 7, 0},
    {GOLDEN "/small-q4_0/model-q4_0.gguf", GOLDEN "/small/model.safetensors", "small", 4, 256, 768, 8, 2, 64, 4096, 2, 0},
};

static void check_u32(const q3_gguf *g, const char *key, uint32_t want)
{
    uint32_t v = 0;
    q3_status st = q3_gguf_get_u32(g, key, &v);
    CHECK(st == Q3_OK && v == want, "%s: %s = %u (want %u): %s", q3_gguf_path(g), key, v, want, q3_last_error());
}

static void test_golden_metadata(const golden_cfg *c)
{
    q3_gguf *g;
    q3_status st = q3_gguf_open(c->gguf, &g);
    CHECK(st == Q3_OK, "open %s: %s", c->gguf, q3_last_error());
    if (st) return;
    CHECK(q3_gguf_version(g) == 3, "version %u", q3_gguf_version(g));
    CHECK(q3_gguf_alignment(g) == 32 && q3_gguf_data_offset(g) % 32 == 0, "alignment");

    const char *s = NULL;
    CHECK(q3_gguf_get_str(g, "general.architecture", &s) == Q3_OK && !strcmp(s, "qwen3"), "architecture");
    CHECK(q3_gguf_get_str(g, "general.name", &s) == Q3_OK && !strcmp(s, c->name), "name %s", s ? s : "");
    check_u32(g, "qwen3.block_count", c->layers);
    check_u32(g, "qwen3.embedding_length", c->dim);
    check_u32(g, "qwen3.feed_forward_length", c->ffn);
    check_u32(g, "qwen3.attention.head_count", c->heads);
    check_u32(g, "qwen3.attention.head_count_kv", c->kv_heads);
    check_u32(g, "qwen3.attention.key_length", c->head_dim);
    check_u32(g, "qwen3.attention.value_length", c->head_dim);
    check_u32(g, "qwen3.context_length", 40960);
    check_u32(g, "general.file_type", c->file_type);
    check_u32(g, "general.quantization_version", 2);
    check_u32(g, "tokenizer.ggml.bos_token_id", c->vocab - 3);
    check_u32(g, "tokenizer.ggml.eos_token_id", c->vocab - 1);
    check_u32(g, "tokenizer.ggml.padding_token_id", c->vocab - 3);
    float f = 0;
    CHECK(q3_gguf_get_f32(g, "qwen3.rope.freq_base", &f) == Q3_OK && f == 1e6f, "freq_base %g", f);
    CHECK(q3_gguf_get_f32(g, "qwen3.attention.layer_norm_rms_epsilon", &f) == Q3_OK && f == 1e-6f, "eps %g", f);
    bool b = true;
    CHECK(q3_gguf_get_bool(g, "tokenizer.ggml.add_bos_token", &b) == Q3_OK && !b, "add_bos_token");
    CHECK(q3_gguf_get_str(g, "tokenizer.ggml.model", &s) == Q3_OK && !strcmp(s, "gpt2"), "tokenizer model");
    CHECK(q3_gguf_get_str(g, "tokenizer.ggml.pre", &s) == Q3_OK && !strcmp(s, "qwen2"), "tokenizer pre");

    /* tokenizer arrays */
    const q3_gguf_value *tokens = NULL, *types = NULL, *merges = NULL;
    CHECK(q3_gguf_get_arr(g, "tokenizer.ggml.tokens", Q3_GGUF_STRING, &tokens) == Q3_OK &&
              tokens->as.arr.count == c->vocab, "tokens: %s", q3_last_error());
    CHECK(q3_gguf_get_arr(g, "tokenizer.ggml.token_type", Q3_GGUF_I32, &types) == Q3_OK &&
              types->as.arr.count == c->vocab, "token_type: %s", q3_last_error());
    CHECK(q3_gguf_get_arr(g, "tokenizer.ggml.merges", Q3_GGUF_STRING, &merges) == Q3_OK &&
              merges->as.arr.count > 0, "merges: %s", q3_last_error());
    if (tokens && types && merges) {
        size_t len = 0;
        const char *last = q3_gguf_arr_str(tokens, c->vocab - 1, &len);
        CHECK(last && !strcmp(last, "<|im_end|>") && len == 10, "last token %s", last ? last : "(null)");
        CHECK(q3_gguf_arr_str(tokens, c->vocab, NULL) == NULL, "out of range token");
        CHECK(q3_gguf_arr_i64(types, 0) == 1, "token_type[0] = %" PRId64, q3_gguf_arr_i64(types, 0));
        CHECK(q3_gguf_arr_i64(types, c->vocab - 1) == 3, "control token type");
        const char *m0 = q3_gguf_arr_str(merges, 0, NULL);
        CHECK(m0 && !strcmp(m0, "\xc4\xa0 \xc4\xa0"), "first merge %s", m0 ? m0 : "(null)");
    }

    /* getters' failures name the file and the key */
    uint32_t u = 7;
    CHECK(q3_gguf_get_u32(g, "no.such.key", &u) == Q3_ERR_FORMAT && u == 7, "missing key");
    CHECK_CONTAINS(q3_last_error(), "'no.such.key' is missing");
    CHECK_CONTAINS(q3_last_error(), c->gguf);
    CHECK(q3_gguf_get_u32(g, "general.architecture", &u) == Q3_ERR_FORMAT, "string as u32");
    CHECK_CONTAINS(q3_last_error(), "is string, expected an integer");
    CHECK(q3_gguf_get_arr(g, "tokenizer.ggml.tokens", Q3_GGUF_I32, &tokens) == Q3_ERR_FORMAT, "wrong element type");
    CHECK_CONTAINS(q3_last_error(), "array of string, expected an array of i32");
    int32_t i32 = 0;
    uint64_t u64 = 0;
    CHECK(q3_gguf_get_i32(g, "qwen3.block_count", &i32) == Q3_OK && i32 == (int32_t)c->layers, "u32 as i32");
    CHECK(q3_gguf_get_u64(g, "qwen3.block_count", &u64) == Q3_OK && u64 == c->layers, "u32 as u64");

    /* iteration finds every key exactly where find does */
    for (size_t i = 0; i < q3_gguf_kv_count(g); i++)
        CHECK(q3_gguf_find(g, q3_gguf_kv_key(g, i)) == q3_gguf_kv_value(g, i), "kv %zu", i);
    size_t n_t = q3_gguf_tensor_count(g);
    CHECK(n_t == 3 + 11 * (size_t)c->layers - (size_t)c->tied, "%zu tensors", n_t);
    for (size_t i = 0; i < n_t; i++) {
        const q3_tensor *t = q3_gguf_tensor_at(g, i);
        CHECK(q3_gguf_find_tensor(g, t->name) == t, "tensor %s", t->name);
        CHECK((uintptr_t)t->data % 32 == 0, "tensor %s data aligned", t->name);
    }
    CHECK(q3_gguf_find_tensor(g, "blk.99.attn_q.weight") == NULL, "absent tensor");
    q3_gguf_close(g);
}

/* ==== golden files: tensors against the safetensors twins ============================ */

/* The Hugging Face name of a llama.cpp tensor name, into out. */
static void hf_name(const char *gguf_name, char *out, size_t n)
{
    static const char *const map[][2] = {
        {"attn_norm", "input_layernorm"},        {"attn_q_norm", "self_attn.q_norm"},
        {"attn_k_norm", "self_attn.k_norm"},     {"attn_q", "self_attn.q_proj"},
        {"attn_k", "self_attn.k_proj"},          {"attn_v", "self_attn.v_proj"},
        {"attn_output", "self_attn.o_proj"},     {"ffn_norm", "post_attention_layernorm"},
        {"ffn_gate", "mlp.gate_proj"},           {"ffn_up", "mlp.up_proj"},
        {"ffn_down", "mlp.down_proj"},
    };
    int layer, used = 0;
    char part[64];
    if (!strcmp(gguf_name, "token_embd.weight")) snprintf(out, n, "model.embed_tokens.weight");
    else if (!strcmp(gguf_name, "output_norm.weight")) snprintf(out, n, "model.norm.weight");
    else if (!strcmp(gguf_name, "output.weight")) snprintf(out, n, "lm_head.weight");
    else if (sscanf(gguf_name, "blk.%d.%63[a-z_].weight%n", &layer, part, &used) == 2 && gguf_name[used] == 0) {
        snprintf(out, n, "?");
        for (size_t i = 0; i < sizeof map / sizeof map[0]; i++)
            if (!strcmp(part, map[i][0])) snprintf(out, n, "model.layers.%d.%s.weight", layer, map[i][1]);
    } else
        snprintf(out, n, "?");
}

static double rel_error(const float *a, const float *ref, size_t n)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        num += ((double)a[i] - ref[i]) * ((double)a[i] - ref[i]);
        den += (double)ref[i] * ref[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

/* Compares every tensor of the GGUF with its twin: same shape; bytes equal
 * when the dtypes are equal, values equal when float types differ (BF16 norms
 * are stored as F32 by llama.cpp); quantized ones requantized bit for bit and
 * dequantized within tolerance. */
static void test_golden_tensors(const golden_cfg *c)
{
    q3_gguf *g;
    q3_safetensors st;
    if (q3_gguf_open(c->gguf, &g) != Q3_OK) return; /* reported by the metadata test */
    if (q3_safetensors_open(c->safetensors, &st) != Q3_OK) {
        CHECK(0, "open %s: %s", c->safetensors, q3_last_error());
        q3_gguf_close(g);
        return;
    }
    CHECK((size_t)st.n_tensors == q3_gguf_tensor_count(g), "%s: %d safetensors vs %zu gguf tensors", c->gguf,
          st.n_tensors, q3_gguf_tensor_count(g));
    int quantized = 0, requant_exact = 0;
    double worst_rel = 0;
    for (size_t i = 0; i < q3_gguf_tensor_count(g); i++) {
        const q3_tensor *t = q3_gguf_tensor_at(g, i);
        char name[160];
        hf_name(t->name, name, sizeof name);
        const q3_tensor *r = q3_safetensors_find(&st, name);
        CHECK(r != NULL, "%s: no twin '%s' for '%s'", c->gguf, name, t->name);
        if (!r) continue;
        CHECK(t->ndim == r->ndim && !memcmp(t->shape, r->shape, (size_t)t->ndim * sizeof t->shape[0]),
              "%s: shape", t->name);
        if (t->ndim != r->ndim || memcmp(t->shape, r->shape, (size_t)t->ndim * sizeof t->shape[0])) continue;
        size_t n = q3_tensor_numel(t);
        if (t->dtype == r->dtype) {
            CHECK(t->nbytes == r->nbytes && !memcmp(t->data, r->data, t->nbytes), "%s: bytes differ", t->name);
            continue;
        }
        float *a = malloc(n * sizeof *a), *ref = malloc(n * sizeof *ref);
        q3_row_to_f32(t->dtype, t->data, a, n);
        q3_row_to_f32(r->dtype, r->data, ref, n);
        if (t->dtype == Q3_Q8_0 || t->dtype == Q3_Q4_0) {
            quantized++;
            double rel = rel_error(a, ref, n);
            if (rel > worst_rel) worst_rel = rel;
            CHECK(rel < (t->dtype == Q3_Q8_0 ? 0.01 : 0.12), "%s: relative error %.4f", t->name, rel);
            /* q3's quantizer makes the same bytes from the F32 twin */
            void *mine = malloc(t->nbytes);
            CHECK(q3_quantize(t->dtype, ref, mine, n) == Q3_OK, "quantize");
            int same = !memcmp(mine, t->data, t->nbytes);
            requant_exact += same;
            CHECK(same, "%s: q3_quantize %s differs from llama.cpp's bytes", t->name, q3_dtype_name(t->dtype));
            free(mine);
        } else {
            CHECK(!memcmp(a, ref, n * sizeof *a), "%s: %s vs %s values differ", t->name, q3_dtype_name(t->dtype),
                  q3_dtype_name(r->dtype));
        }
        free(a);
        free(ref);
    }
    if (quantized)
        printf("%s: %d quantized tensors, %d requantized bit-exactly, worst relative error %.4f\n", c->gguf,
               quantized, requant_exact, worst_rel);
    q3_safetensors_close(&st);
    q3_gguf_close(g);
}

/* ==== quantizers ============================================================================ */

static uint32_t rng_state = 12345;

static float rand_normal(void)
{
    double u1 = 0, u2 = 0;
    while (u1 <= 0) {
        rng_state = rng_state * 1664525u + 1013904223u;
        u1 = (rng_state >> 8) / 16777216.0;
    }
    rng_state = rng_state * 1664525u + 1013904223u;
    u2 = (rng_state >> 8) / 16777216.0;
    return (float)(sqrt(-2 * log(u1)) * cos(6.283185307179586 * u2));
}

static void test_quantizers(void)
{
    uint8_t blk[34];
    float x[32], y[32];

    /* Q8_0: amax 127 makes d = 1; halves round away from zero */
    for (int j = 0; j < 32; j++) x[j] = 0;
    x[0] = 127;
    x[1] = 2.5f;
    x[2] = -2.5f;
    x[3] = -127;
    q3_quantize_q8_0(x, blk, 32);
    CHECK(blk[0] == 0x00 && blk[1] == 0x3c, "q8_0 d = 1.0 (f16 0x3c00): %02x%02x", blk[1], blk[0]);
    CHECK((int8_t)blk[2] == 127 && (int8_t)blk[3] == 3 && (int8_t)blk[4] == -3 && (int8_t)blk[5] == -127,
          "q8_0 values %d %d %d %d", (int8_t)blk[2], (int8_t)blk[3], (int8_t)blk[4], (int8_t)blk[5]);

    /* all zeros: d = 0 and q = 0 (Q8_0) or 8 (Q4_0) */
    for (int j = 0; j < 32; j++) x[j] = 0;
    q3_quantize_q8_0(x, blk, 32);
    int zero = blk[0] == 0 && blk[1] == 0;
    for (int j = 0; j < 32; j++) zero &= blk[2 + j] == 0;
    CHECK(zero, "q8_0 zero block");
    q3_quantize_q4_0(x, blk, 32);
    zero = q3_f16_to_f32((uint16_t)(blk[0] | blk[1] << 8)) == 0.0f; /* -0: d = 0 / -8, as llama.cpp */
    for (int j = 0; j < 16; j++) zero &= blk[2 + j] == 0x88;
    CHECK(zero, "q4_0 zero block");

    /* Q4_0: x = j - 16, max = -16 (largest magnitude, sign kept), d = 2, id = 0.5 */
    for (int j = 0; j < 32; j++) x[j] = (float)(j - 16);
    q3_quantize_q4_0(x, blk, 32);
    CHECK(q3_f16_to_f32((uint16_t)(blk[0] | blk[1] << 8)) == 2.0f, "q4_0 d = 2");
    /* j=0: -8+8.5 -> 0; j=15: -0.5+8.5 -> 8; j=16: 8.5 -> 8; j=31: 7.5+8.5 = 16 -> clamped 15 */
    CHECK((blk[2] & 15) == 0 && (blk[2] >> 4) == 8 && (blk[17] & 15) == 8 && (blk[17] >> 4) == 15,
          "q4_0 nibbles %02x %02x", blk[2], blk[17]);
    /* ties in magnitude: the first wins, so d = 3 / -8 < 0 */
    for (int j = 0; j < 32; j++) x[j] = 0;
    x[0] = 3;
    x[1] = -3;
    q3_quantize_q4_0(x, blk, 32);
    CHECK(q3_f16_to_f32((uint16_t)(blk[0] | blk[1] << 8)) == -0.375f, "q4_0 first max wins");
    q3_row_to_f32(Q3_Q4_0, blk, y, 32);
    /* -3 maps to 16.5, clamped to 15: the side opposite the max loses a step */
    CHECK(y[0] == 3.0f && y[1] == -2.625f && y[2] == 0.0f, "q4_0 values back %g %g %g", y[0], y[1], y[2]);

    /* round trips on Gaussian data: bounded error per element, small relative error */
    enum { N = 32 * 256 };
    float *src = malloc(N * sizeof *src), *back = malloc(N * sizeof *back);
    uint8_t *q = malloc(N / 32 * 34);
    for (int i = 0; i < N; i++) src[i] = rand_normal() * (i % 97 == 0 ? 5.0f : 1.0f);
    q3_quantize_q8_0(src, q, N);
    q3_row_to_f32(Q3_Q8_0, q, back, N);
    double rel8 = rel_error(back, src, N), worst8 = 0;
    for (int b = 0; b < N / 32; b++) {
        float amax = 0;
        for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(src[b * 32 + j]));
        for (int j = 0; j < 32; j++) {
            double err = fabs(back[b * 32 + j] - src[b * 32 + j]) / (amax / 127.0);
            if (err > worst8) worst8 = err;
        }
    }
    CHECK(rel8 < 0.01 && worst8 < 0.57, "q8_0 round trip: relative %.5f, worst %.3f steps", rel8, worst8);
    q3_quantize_q4_0(src, q, N);
    q3_row_to_f32(Q3_Q4_0, q, back, N);
    double rel4 = rel_error(back, src, N), worst4 = 0;
    for (int b = 0; b < N / 32; b++) {
        float amax = 0;
        for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(src[b * 32 + j]));
        for (int j = 0; j < 32; j++) {
            double err = fabs(back[b * 32 + j] - src[b * 32 + j]) / (amax / 8.0);
            if (err > worst4) worst4 = err;
        }
    }
    /* a step is amax/8; values on the far side of the max's sign clamp at 7 steps, losing up to one step */
    CHECK(rel4 < 0.15 && worst4 < 1.01, "q4_0 round trip: relative %.5f, worst %.3f steps", rel4, worst4);
    printf("quantizer round trips: q8_0 relative %.5f, q4_0 relative %.5f\n", rel8, rel4);

    /* the generic entry point */
    CHECK(q3_quantize(Q3_Q8_0, src, q, 33) == Q3_ERR_INVALID, "33 values");
    CHECK_CONTAINS(q3_last_error(), "multiple of the q8_0 block size 32");
    uint16_t h[4];
    CHECK(q3_quantize(Q3_BF16, src, h, 4) == Q3_OK && h[1] == q3_f32_to_bf16(src[1]), "bf16 via quantize");
    float nan_block[32] = {NAN, 1.0f};
    q3_quantize_q8_0(nan_block, blk, 32); /* must not trap; the value is unspecified */
    q3_quantize_q4_0(nan_block, blk, 32);
    free(src);
    free(back);
    free(q);
}

/* ==== writer round trips ======================================================================= */

static int progress_calls, cancel_at;
static uint64_t progress_last_done, progress_total;

static int on_progress(void *user, size_t done, size_t total, uint64_t bytes_done, uint64_t bytes_total)
{
    (void)user;
    progress_calls++;
    CHECK(done <= total && bytes_done <= bytes_total && bytes_done >= progress_last_done, "progress order");
    progress_last_done = bytes_done;
    progress_total = bytes_total;
    return cancel_at && (int)done == cancel_at;
}

static q3_status fill_ramp(void *user, void *dst, size_t nbytes)
{
    float *f = dst;
    for (size_t i = 0; i < nbytes / 4; i++) f[i] = (float)i * *(const float *)user;
    return Q3_OK;
}

static q3_status fill_fail(void *user, void *dst, size_t nbytes)
{
    (void)user, (void)dst, (void)nbytes;
    return q3_fail(Q3_ERR_IO, "source went away");
}

static void test_writer_round_trip(void)
{
    q3_gguf_writer *w;
    CHECK(q3_gguf_writer_new(&w) == Q3_OK, "writer");
    const char *strs[] = {"", "hello", "\xc4\xa0world", "<|im_end|>"};
    int32_t ints[] = {-1, 0, 1, INT32_MAX, INT32_MIN};
    float floats[] = {0.5f, -1e-6f, 3.25f};
    CHECK(q3_gguf_writer_add_str(w, "general.architecture", "qwen3") == Q3_OK, "str");
    CHECK(q3_gguf_writer_add_u32(w, "qwen3.block_count", 28) == Q3_OK, "u32");
    CHECK(q3_gguf_writer_add_i32(w, "test.i32", -42) == Q3_OK, "i32");
    CHECK(q3_gguf_writer_add_u64(w, "test.u64", UINT64_MAX - 1) == Q3_OK, "u64");
    CHECK(q3_gguf_writer_add_f32(w, "qwen3.rope.freq_base", 1e6f) == Q3_OK, "f32");
    CHECK(q3_gguf_writer_add_bool(w, "test.bool", true) == Q3_OK, "bool");
    CHECK(q3_gguf_writer_add_str_array(w, "test.strs", strs, 4) == Q3_OK, "str array");
    CHECK(q3_gguf_writer_add_i32_array(w, "test.ints", ints, 5) == Q3_OK, "i32 array");
    CHECK(q3_gguf_writer_add_f32_array(w, "test.floats", floats, 3) == Q3_OK, "f32 array");
    CHECK(q3_gguf_writer_add_f32_array(w, "test.empty", NULL, 0) == Q3_OK, "empty array");

    /* rejected additions leave the writer as it was */
    CHECK(q3_gguf_writer_add_u32(w, "test.i32", 1) == Q3_ERR_INVALID, "duplicate key");
    CHECK_CONTAINS(q3_last_error(), "'test.i32' added twice");
    CHECK(q3_gguf_writer_add_u32(w, "", 1) == Q3_ERR_INVALID, "empty key");
    CHECK(q3_gguf_writer_add_u32(w, "general.alignment", 64) == Q3_ERR_INVALID, "alignment is the writer's");

    /* one tensor of each dtype, plus one made by a fill function */
    enum { ROWS = 3, COLS = 64 };
    float src[ROWS * COLS];
    for (int i = 0; i < ROWS * COLS; i++) src[i] = rand_normal();
    static uint8_t f16[ROWS * COLS * 2], bf16[ROWS * COLS * 2], q8[ROWS * COLS / 32 * 34], q4[ROWS * COLS / 32 * 18];
    q3_quantize(Q3_F16, src, f16, ROWS * COLS);
    q3_quantize(Q3_BF16, src, bf16, ROWS * COLS);
    q3_quantize(Q3_Q8_0, src, q8, ROWS * COLS);
    q3_quantize(Q3_Q4_0, src, q4, ROWS * COLS);
    int64_t shape2[] = {ROWS, COLS}, shape1[] = {COLS}, shape3[] = {1, ROWS, COLS}, shape4[] = {1, 1, 3, 64};
    float scale = 0.25f;
    CHECK(q3_gguf_writer_add_tensor(w, "t.f32", Q3_F32, 2, shape2, src) == Q3_OK, "f32 tensor");
    CHECK(q3_gguf_writer_add_tensor(w, "t.f16", Q3_F16, 3, shape3, f16) == Q3_OK, "f16 tensor");
    CHECK(q3_gguf_writer_add_tensor(w, "t.bf16", Q3_BF16, 4, shape4, bf16) == Q3_OK, "bf16 tensor");
    CHECK(q3_gguf_writer_add_tensor(w, "t.q8_0", Q3_Q8_0, 2, shape2, q8) == Q3_OK, "q8_0 tensor");
    CHECK(q3_gguf_writer_add_tensor(w, "t.q4_0", Q3_Q4_0, 2, shape2, q4) == Q3_OK, "q4_0 tensor");
    CHECK(q3_gguf_writer_add_tensor(w, "t.vec", Q3_F32, 1, (int64_t[]){5}, src) == Q3_OK, "odd-sized tensor");
    CHECK(q3_gguf_writer_add_tensor_fn(w, "t.ramp", Q3_F32, 1, shape1, fill_ramp, &scale) == Q3_OK, "fill tensor");

    CHECK(q3_gguf_writer_add_tensor(w, "t.f32", Q3_F32, 1, shape1, src) == Q3_ERR_INVALID, "duplicate tensor");
    CHECK_CONTAINS(q3_last_error(), "'t.f32' added twice");
    CHECK(q3_gguf_writer_add_tensor(w, "t.bad", Q3_Q8_0, 2, (int64_t[]){2, 33}, q8) == Q3_ERR_INVALID, "row 33");
    CHECK_CONTAINS(q3_last_error(), "row length 33 is not a multiple of the q8_0 block size 32");
    CHECK(q3_gguf_writer_add_tensor(w, "t.bad", Q3_F32, 5, (int64_t[]){1, 1, 1, 1, 1}, src) == Q3_ERR_INVALID,
          "5 dims");
    CHECK(q3_gguf_writer_add_tensor(w, "t.bad", Q3_F32, 2, (int64_t[]){0, 4}, src) == Q3_ERR_INVALID, "dim 0");
    CHECK(q3_gguf_writer_add_tensor(w, "t.bad", Q3_F32, 2, (int64_t[]){INT64_MAX, INT64_MAX}, src) ==
              Q3_ERR_INVALID, "overflow");
    CHECK(q3_gguf_writer_add_tensor(w, "t.this-name-is-far-too-long-for-llama-cpp-to-read-0123456789abcdef",
                                    Q3_F32, 1, shape1, src) == Q3_ERR_INVALID, "long name");

    const char *path = tmp_path("round.gguf");
    progress_calls = 0;
    progress_last_done = 0;
    q3_status st = q3_gguf_writer_write(w, path, on_progress, NULL);
    CHECK(st == Q3_OK, "write: %s", q3_last_error());
    CHECK(progress_calls == 7 && progress_last_done == progress_total, "progress %d calls", progress_calls);
    CHECK(temps_beside(path) == 0, "temporary file renamed");

    q3_gguf *g;
    st = q3_gguf_open(path, &g);
    CHECK(st == Q3_OK, "read back: %s", q3_last_error());
    if (!st) {
        CHECK(q3_gguf_kv_count(g) == 11, "kv count %zu", q3_gguf_kv_count(g));
        CHECK(!strcmp(q3_gguf_kv_key(g, 0), "general.alignment") && q3_gguf_kv_value(g, 0)->as.u == 32,
              "alignment first");
        const char *s;
        uint32_t u32;
        int32_t i32;
        uint64_t u64;
        float f;
        bool b;
        CHECK(q3_gguf_get_str(g, "general.architecture", &s) == Q3_OK && !strcmp(s, "qwen3"), "str back");
        CHECK(q3_gguf_get_u32(g, "qwen3.block_count", &u32) == Q3_OK && u32 == 28, "u32 back");
        CHECK(q3_gguf_get_i32(g, "test.i32", &i32) == Q3_OK && i32 == -42, "i32 back");
        CHECK(q3_gguf_get_u32(g, "test.i32", &u32) == Q3_ERR_FORMAT, "-42 is not a u32");
        CHECK_CONTAINS(q3_last_error(), "= -42 is out of range");
        CHECK(q3_gguf_get_u64(g, "test.u64", &u64) == Q3_OK && u64 == UINT64_MAX - 1, "u64 back");
        CHECK(q3_gguf_get_u32(g, "test.u64", &u32) == Q3_ERR_FORMAT, "u64 too big for u32");
        CHECK(q3_gguf_get_f32(g, "qwen3.rope.freq_base", &f) == Q3_OK && f == 1e6f, "f32 back");
        CHECK(q3_gguf_get_bool(g, "test.bool", &b) == Q3_OK && b, "bool back");
        CHECK(q3_gguf_find(g, "test.bool")->type == Q3_GGUF_BOOL, "bool type");
        const q3_gguf_value *a;
        CHECK(q3_gguf_get_arr(g, "test.strs", Q3_GGUF_STRING, &a) == Q3_OK && a->as.arr.count == 4, "strs back");
        for (size_t i = 0; i < 4; i++) {
            size_t len;
            const char *e = q3_gguf_arr_str(a, i, &len);
            CHECK(e && !strcmp(e, strs[i]) && len == strlen(strs[i]), "strs[%zu]", i);
        }
        CHECK(q3_gguf_get_arr(g, "test.ints", Q3_GGUF_I32, &a) == Q3_OK && a->as.arr.count == 5, "ints back");
        for (size_t i = 0; i < 5; i++) CHECK(q3_gguf_arr_i64(a, i) == ints[i], "ints[%zu]", i);
        CHECK(q3_gguf_get_arr(g, "test.floats", Q3_GGUF_F32, &a) == Q3_OK && a->as.arr.count == 3, "floats back");
        for (size_t i = 0; i < 3; i++) CHECK(q3_gguf_arr_f64(a, i) == floats[i], "floats[%zu]", i);
        CHECK(q3_gguf_get_arr(g, "test.empty", -1, &a) == Q3_OK && a->as.arr.count == 0, "empty back");

        struct { const char *name; q3_dtype dt; int ndim; const int64_t *shape; const void *data; size_t nbytes; } want[] = {
            {"t.f32", Q3_F32, 2, shape2, src, sizeof src},      {"t.f16", Q3_F16, 3, shape3, f16, sizeof f16},
            {"t.bf16", Q3_BF16, 4, shape4, bf16, sizeof bf16},  {"t.q8_0", Q3_Q8_0, 2, shape2, q8, sizeof q8},
            {"t.q4_0", Q3_Q4_0, 2, shape2, q4, sizeof q4},      {"t.vec", Q3_F32, 1, (int64_t[]){5}, src, 20},
        };
        CHECK(q3_gguf_tensor_count(g) == 7, "tensor count %zu", q3_gguf_tensor_count(g));
        for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
            const q3_tensor *t = q3_gguf_find_tensor(g, want[i].name);
            CHECK(t && t == q3_gguf_tensor_at(g, i), "%s found in order", want[i].name);
            if (!t) continue;
            CHECK(t->dtype == want[i].dt && t->ndim == want[i].ndim &&
                      !memcmp(t->shape, want[i].shape, (size_t)t->ndim * sizeof t->shape[0]),
                  "%s dtype/shape", t->name);
            CHECK(t->nbytes == want[i].nbytes && !memcmp(t->data, want[i].data, t->nbytes), "%s bytes", t->name);
            CHECK((uintptr_t)t->data % 32 == 0, "%s aligned", t->name);
        }
        const q3_tensor *ramp = q3_gguf_find_tensor(g, "t.ramp");
        CHECK(ramp && ((const float *)ramp->data)[63] == 63 * 0.25f, "fill function's data");
        q3_gguf_close(g);
    }

    /* a cancelled or failing write leaves neither the file nor the temporary */
    const char *path2 = tmp_path("cancelled.gguf");
    cancel_at = 2;
    progress_last_done = 0;
    CHECK(q3_gguf_writer_write(w, path2, on_progress, NULL) == Q3_ERR_INVALID, "cancel");
    CHECK_CONTAINS(q3_last_error(), "cancelled after 2 of 7 tensors");
    cancel_at = 0;
    CHECK(!q3_file_exists(path2) && temps_beside(path2) == 0, "nothing left after cancel");
    CHECK(q3_gguf_writer_add_tensor_fn(w, "t.fails", Q3_F32, 1, shape1, fill_fail, NULL) == Q3_OK, "add");
    CHECK(q3_gguf_writer_write(w, path2, NULL, NULL) == Q3_ERR_IO, "fill failure");
    CHECK_CONTAINS(q3_last_error(), "making tensor 't.fails': source went away");
    CHECK(!q3_file_exists(path2) && temps_beside(path2) == 0, "nothing left after failure");
    CHECK(q3_gguf_writer_write(w, "/nonexistent-dir/x.gguf", NULL, NULL) == Q3_ERR_IO, "bad folder");
    CHECK_CONTAINS(q3_last_error(), "/nonexistent-dir/x.gguf: its folder /nonexistent-dir: no such folder");
    /* the final name is replaced whole: an old file under PATH stays until the rename */
    CHECK(write_file(path2, "old", 3), "old file");
    CHECK(q3_gguf_writer_write(w, path2, NULL, NULL) == Q3_ERR_IO, "failing write over an old file");
    size_t n_old = 0;
    uint8_t *old = slurp(path2, &n_old);
    CHECK(old && n_old == 3 && !memcmp(old, "old", 3), "old file untouched");
    free(old);
    q3_gguf_writer_free(w);
}

/* Copies a golden GGUF through the writer (every metadata value it holds and
 * every tensor) and checks that the copy reads back the same. */
static void test_writer_copies_golden(void)
{
    q3_gguf *g, *h;
    if (q3_gguf_open(goldens[0].gguf, &g) != Q3_OK) return;
    q3_gguf_writer *w;
    q3_gguf_writer_new(&w);
    int ok = 1;
    for (size_t i = 0; i < q3_gguf_kv_count(g) && ok; i++) {
        const char *key = q3_gguf_kv_key(g, i);
        const q3_gguf_value *v = q3_gguf_kv_value(g, i);
        q3_status st = Q3_ERR_UNSUPPORTED;
        switch (v->type) {
        case Q3_GGUF_STRING: st = q3_gguf_writer_add_str(w, key, v->as.str.s); break;
        case Q3_GGUF_U32: st = q3_gguf_writer_add_u32(w, key, (uint32_t)v->as.u); break;
        case Q3_GGUF_F32: st = q3_gguf_writer_add_f32(w, key, (float)v->as.f); break;
        case Q3_GGUF_BOOL: st = q3_gguf_writer_add_bool(w, key, v->as.u != 0); break;
        case Q3_GGUF_ARRAY: {
            size_t n = v->as.arr.count;
            if (v->as.arr.type == Q3_GGUF_STRING) {
                const char **s = malloc(n * sizeof *s);
                for (size_t j = 0; j < n; j++) s[j] = q3_gguf_arr_str(v, j, NULL);
                st = q3_gguf_writer_add_str_array(w, key, s, n);
                free(s);
            } else if (v->as.arr.type == Q3_GGUF_I32) {
                int32_t *a = malloc(n * sizeof *a);
                for (size_t j = 0; j < n; j++) a[j] = (int32_t)q3_gguf_arr_i64(v, j);
                st = q3_gguf_writer_add_i32_array(w, key, a, n);
                free(a);
            }
            break;
        }
        default: break;
        }
        CHECK(st == Q3_OK, "copy '%s' (%s): %s", key, q3_gguf_type_name(v->type), q3_last_error());
        ok = st == Q3_OK;
    }
    for (size_t i = 0; i < q3_gguf_tensor_count(g) && ok; i++) {
        const q3_tensor *t = q3_gguf_tensor_at(g, i);
        ok = q3_gguf_writer_add_tensor(w, t->name, t->dtype, t->ndim, t->shape, t->data) == Q3_OK;
    }
    const char *path = tmp_path("tiny-copy.gguf");
    CHECK(ok && q3_gguf_writer_write(w, path, NULL, NULL) == Q3_OK, "write copy: %s", q3_last_error());
    q3_gguf_writer_free(w);
    if (ok && q3_gguf_open(path, &h) == Q3_OK) {
        CHECK(q3_gguf_kv_count(h) == q3_gguf_kv_count(g) + 1, "copy has general.alignment added");
        for (size_t i = 0; i < q3_gguf_kv_count(g); i++) {
            const q3_gguf_value *a = q3_gguf_kv_value(g, i), *b = q3_gguf_find(h, q3_gguf_kv_key(g, i));
            int same = b && a->type == b->type;
            if (same && a->type == Q3_GGUF_STRING)
                same = a->as.str.len == b->as.str.len && !memcmp(a->as.str.s, b->as.str.s, a->as.str.len);
            else if (same && a->type == Q3_GGUF_ARRAY) {
                same = a->as.arr.type == b->as.arr.type && a->as.arr.count == b->as.arr.count;
                for (size_t j = 0; same && j < a->as.arr.count; j++)
                    same = a->as.arr.type == Q3_GGUF_STRING
                               ? !strcmp(q3_gguf_arr_str(a, j, NULL), q3_gguf_arr_str(b, j, NULL))
                               : q3_gguf_arr_i64(a, j) == q3_gguf_arr_i64(b, j);
            } else if (same)
                same = a->type == Q3_GGUF_F32 ? a->as.f == b->as.f : a->as.u == b->as.u;
            CHECK(same, "copied '%s' differs", q3_gguf_kv_key(g, i));
        }
        CHECK(q3_gguf_tensor_count(h) == q3_gguf_tensor_count(g), "tensor count");
        for (size_t i = 0; i < q3_gguf_tensor_count(g); i++) {
            const q3_tensor *a = q3_gguf_tensor_at(g, i), *b = q3_gguf_find_tensor(h, a->name);
            CHECK(b && b->dtype == a->dtype && b->ndim == a->ndim && b->nbytes == a->nbytes &&
                      !memcmp(b->shape, a->shape, sizeof a->shape) && !memcmp(a->data, b->data, a->nbytes),
                  "copied tensor %s", a->name);
        }
        /* llama.cpp lays out the data section the same way: same offsets */
        CHECK(q3_gguf_data_offset(h) - q3_gguf_data_offset(g) < 64, "header sizes");
        q3_gguf_close(h);
    }
    q3_gguf_close(g);
}

/* ==== hostile files ============================================================================ */

typedef struct buf {
    uint8_t p[4096];
    size_t n;
} buf;

static void b_raw(buf *b, const void *p, size_t n)
{
    if (b->n + n > sizeof b->p) abort();
    memcpy(b->p + b->n, p, n);
    b->n += n;
}
static void b_u32(buf *b, uint32_t v) { b_raw(b, &v, 4); } /* little-endian host */
static void b_u64(buf *b, uint64_t v) { b_raw(b, &v, 8); }
static void b_str_len(buf *b, const char *s, uint64_t len)
{
    b_u64(b, len);
    b_raw(b, s, strlen(s));
}
static void b_str(buf *b, const char *s) { b_str_len(b, s, strlen(s)); }

/* A small valid file, and the fields a case may spoil. Tensors "a" (F32
 * [2][32] at 0) and "b" (F32 [32] at 256) over a 384-byte data section. */
typedef struct spec {
    const char *magic;
    uint32_t version;
    uint64_t n_tensors, n_kv;      /* as written in the header */
    uint64_t arch_len;             /* written length of the "qwen3" value */
    uint32_t arch_type;            /* value type of general.architecture */
    uint32_t align_type, alignment;
    int depth;                     /* nesting of test.nested (1: array of strings) */
    uint32_t elem_type;            /* innermost element type of test.nested */
    uint64_t elem_count;           /* innermost count written (2 real) */
    uint64_t key_len;              /* written length of the key "test.nested" */
    int dup_key;
    const char *name_a, *name_b;
    uint64_t name_len;             /* written length of tensor a's name */
    uint32_t n_dims;
    uint64_t ne[8];
    uint32_t ggml_type;
    uint64_t offset_a, offset_b;
    size_t data_bytes;
} spec;

static spec base_spec(void)
{
    return (spec){
        .magic = "GGUF", .version = 3, .n_tensors = 2, .n_kv = 3, .arch_len = 5, .arch_type = Q3_GGUF_STRING,
        .align_type = Q3_GGUF_U32, .alignment = 32, .depth = 1, .elem_type = Q3_GGUF_STRING, .elem_count = 2,
        .key_len = 11, .name_a = "a", .name_b = "b", .name_len = 1, .n_dims = 2, .ne = {32, 2},
        .ggml_type = Q3_GGML_F32, .offset_a = 0, .offset_b = 256, .data_bytes = 384,
    };
}

static void build(const spec *s, buf *b)
{
    b->n = 0;
    b_raw(b, s->magic, 4);
    b_u32(b, s->version);
    b_u64(b, s->n_tensors);
    b_u64(b, s->n_kv + (s->dup_key ? 1 : 0));
    b_str(b, "general.architecture");
    b_u32(b, s->arch_type);
    if (s->arch_type == Q3_GGUF_STRING) b_str_len(b, "qwen3", s->arch_len);
    b_str(b, "general.alignment");
    b_u32(b, s->align_type);
    b_u32(b, s->alignment);
    b_str_len(b, "test.nested", s->key_len);
    b_u32(b, Q3_GGUF_ARRAY);
    for (int d = 1; d < s->depth; d++) { /* each outer array holds one array */
        b_u32(b, Q3_GGUF_ARRAY);
        b_u64(b, 1);
    }
    b_u32(b, s->elem_type);
    b_u64(b, s->elem_count);
    if (s->elem_type == Q3_GGUF_STRING) {
        b_str(b, "x");
        b_str(b, "yz");
    } else if (s->elem_type == Q3_GGUF_U16) {
        b_u32(b, 0);
    }
    if (s->dup_key) {
        b_str(b, "general.architecture");
        b_u32(b, Q3_GGUF_U8);
        b_raw(b, "\1", 1);
    }
    /* tensor a */
    b_str_len(b, s->name_a, s->name_len);
    b_u32(b, s->n_dims);
    for (uint32_t d = 0; d < s->n_dims && d < 8; d++) b_u64(b, s->ne[d]); /* at most 8 written */
    b_u32(b, s->ggml_type);
    b_u64(b, s->offset_a);
    /* tensor b */
    b_str(b, s->name_b);
    b_u32(b, 1);
    b_u64(b, 32);
    b_u32(b, Q3_GGML_F32);
    b_u64(b, s->offset_b);
    size_t align = s->alignment && !(s->alignment & (s->alignment - 1)) ? s->alignment : 32;
    while (b->n % align) b_raw(b, "", 1);
    for (size_t i = 0; i < s->data_bytes; i++) b_raw(b, "\x3f", 1);
}

static int n_hostile;

/* Writes s, opens it, and expects failure with want_st and a message that
 * names the file and contains want. */
static void expect_fail_bytes(const void *p, size_t n, q3_status want_st, const char *want, const char *label)
{
    char name[64];
    snprintf(name, sizeof name, "hostile-%d.gguf", n_hostile++);
    const char *path = tmp_path(name);
    CHECK(write_file(path, p, n), "write %s", path);
    q3_gguf *g = (q3_gguf *)1;
    q3_status st = q3_gguf_open(path, &g);
    CHECK(st == want_st && g == NULL, "%s: status %s (want %s): %s", label, q3_status_name(st),
          q3_status_name(want_st), q3_last_error());
    if (st == Q3_OK) q3_gguf_close(g);
    if (getenv("Q3_TEST_VERBOSE")) printf("  %-32s %s\n", label, q3_last_error());
    CHECK_CONTAINS(q3_last_error(), path);
    CHECK_CONTAINS(q3_last_error(), want);
    unlink(path);
}

static void expect_fail(const spec *s, q3_status want_st, const char *want, const char *label)
{
    static buf b;
    build(s, &b);
    expect_fail_bytes(b.p, b.n, want_st, want, label);
}

/* As expect_fail, with the file extended by a hole to `size` bytes: a sparse
 * file whose counts and lengths fit in it, so that only q3's own limits can
 * refuse them (before allocating what they claim). */
static void expect_fail_sparse(const spec *s, uint64_t size, const char *want, const char *label)
{
    static buf b;
    build(s, &b);
    const char *path = tmp_path("sparse.gguf");
    CHECK(write_file(path, b.p, b.n) && truncate(path, (off_t)size) == 0, "write %s: %s", path, strerror(errno));
    q3_gguf *g = (q3_gguf *)1;
    q3_status st = q3_gguf_open(path, &g);
    CHECK(st == Q3_ERR_FORMAT && g == NULL, "%s: status %s: %s", label, q3_status_name(st), q3_last_error());
    if (st == Q3_OK) q3_gguf_close(g);
    CHECK_CONTAINS(q3_last_error(), path);
    CHECK_CONTAINS(q3_last_error(), want);
    unlink(path);
}

/* Sizes the file could hold but no model needs: refused by q3's limits. */
static void test_hostile_limits(void)
{
    spec c = base_spec();
    c.arch_len = 1ull << 31; /* a 2 GiB string, in a 2 GiB file */
    expect_fail_sparse(&c, (1ull << 31) + 4096,
                       "'general.architecture' (string): string length 2147483648 at byte 56: the metadata "
                       "would take more than the 1073741824 bytes q3 allows",
                       "2 GiB string");
    c = base_spec(), c.elem_count = 1ull << 27; /* 2^27 empty strings: 4+ GiB of values */
    expect_fail_sparse(&c, (1ull << 30) + 4096,
                       "'test.nested' (array): array of 134217728 string at byte 125: the metadata would take "
                       "more than the 1073741824 bytes q3 allows",
                       "2^27 strings");
    c = base_spec(), c.n_tensors = Q3_GGUF_MAX_TENSORS + 1;
    expect_fail_sparse(&c, 40u << 20, "tensor count 1048577 is more than the 1048576 q3 reads", "2^20+1 tensors");
    c = base_spec(), c.n_kv = Q3_GGUF_MAX_KV + 1;
    expect_fail_sparse(&c, 40u << 20, "metadata count 1048577 is more than the 1048576 q3 reads", "2^20+1 pairs");

    /* an f64 beyond float's range read as f32 fails (the cast would be undefined) */
    static buf b;
    b.n = 0;
    b_raw(&b, "GGUF", 4);
    b_u32(&b, 3);
    b_u64(&b, 0);
    b_u64(&b, 3);
    double big = 1e300, ok = 1e6, inf = INFINITY;
    b_str(&b, "big"), b_u32(&b, Q3_GGUF_F64), b_raw(&b, &big, 8);
    b_str(&b, "ok"), b_u32(&b, Q3_GGUF_F64), b_raw(&b, &ok, 8);
    b_str(&b, "inf"), b_u32(&b, Q3_GGUF_F64), b_raw(&b, &inf, 8);
    const char *path = tmp_path("f64.gguf");
    q3_gguf *g = NULL;
    CHECK(write_file(path, b.p, b.n) && q3_gguf_open(path, &g) == Q3_OK, "f64 file: %s", q3_last_error());
    if (g) {
        float f = 7;
        CHECK(q3_gguf_get_f32(g, "big", &f) == Q3_ERR_FORMAT && f == 7, "1e300 as f32");
        CHECK_CONTAINS(q3_last_error(), "metadata key 'big' = 1e+300 is out of a float's range");
        CHECK(q3_gguf_get_f32(g, "ok", &f) == Q3_OK && f == 1e6f, "1e6 as f32");
        CHECK(q3_gguf_get_f32(g, "inf", &f) == Q3_OK && isinf(f), "inf as f32 (callers check ranges)");
        q3_gguf_close(g);
    }

    /* A tokenizer with 2^20 (empty) tokens: refused by count, before its arrays. */
    b.n = 0;
    b_raw(&b, "GGUF", 4);
    b_u32(&b, 3);
    b_u64(&b, 0);
    b_u64(&b, 4);
    b_str(&b, "tokenizer.ggml.model"), b_u32(&b, Q3_GGUF_STRING), b_str(&b, "gpt2");
    b_str(&b, "tokenizer.ggml.pre"), b_u32(&b, Q3_GGUF_STRING), b_str(&b, "qwen2");
    b_str(&b, "tokenizer.ggml.merges"), b_u32(&b, Q3_GGUF_ARRAY), b_u32(&b, Q3_GGUF_STRING), b_u64(&b, 0);
    b_str(&b, "tokenizer.ggml.tokens"), b_u32(&b, Q3_GGUF_ARRAY), b_u32(&b, Q3_GGUF_STRING), b_u64(&b, 1u << 20);
    path = tmp_path("many-tokens.gguf");
    CHECK(write_file(path, b.p, b.n) && truncate(path, (off_t)(b.n + (8u << 20) + 64)) == 0, "write %s", path);
    g = NULL;
    CHECK(q3_gguf_open(path, &g) == Q3_OK, "2^20 tokens open as metadata: %s", q3_last_error());
    if (g) {
        q3_tokenizer *tk = (q3_tokenizer *)1;
        CHECK(q3_tokenizer_load_gguf(g, &tk) == Q3_ERR_FORMAT && !tk, "2^20 tokens");
        CHECK_CONTAINS(q3_last_error(), "tokenizer.ggml.tokens has 1048576 entries, more than the 1048575 q3 reads");
        q3_gguf_close(g);
    }
    unlink(path);
}

static void test_hostile(void)
{
    static buf b;
    spec s = base_spec();
    build(&s, &b);
    const char *path = tmp_path("valid.gguf");
    CHECK(write_file(path, b.p, b.n), "write");
    q3_gguf *g;
    q3_status st = q3_gguf_open(path, &g);
    CHECK(st == Q3_OK, "the base hostile file is valid: %s", q3_last_error());
    if (!st) {
        const q3_gguf_value *nested = q3_gguf_find(g, "test.nested");
        CHECK(nested && nested->type == Q3_GGUF_ARRAY && !strcmp(q3_gguf_arr_str(nested, 1, NULL), "yz"), "nested");
        const q3_tensor *a = q3_gguf_find_tensor(g, "a");
        CHECK(a && a->ndim == 2 && a->shape[0] == 2 && a->shape[1] == 32 && a->nbytes == 256, "tensor a");
        q3_gguf_close(g);
    }
    /* nested arrays of strings, 3 deep, read back */
    s.depth = 3;
    build(&s, &b);
    CHECK(write_file(path, b.p, b.n), "write");
    st = q3_gguf_open(path, &g);
    CHECK(st == Q3_OK, "nested 3 deep: %s", q3_last_error());
    if (!st) {
        const q3_gguf_value *v = q3_gguf_find(g, "test.nested");
        const q3_gguf_value *in = q3_gguf_arr_arr(q3_gguf_arr_arr(v, 0), 0);
        CHECK(in && in->as.arr.count == 2 && !strcmp(q3_gguf_arr_str(in, 0, NULL), "x"), "nested element");
        CHECK(q3_gguf_arr_arr(v, 1) == NULL && q3_gguf_arr_str(v, 0, NULL) == NULL, "nested misuse");
        q3_gguf_close(g);
    }

    /* truncated at every byte */
    s = base_spec();
    build(&s, &b);
    int all_fail = 1;
    for (size_t cut = 0; cut < b.n; cut++) {
        CHECK(write_file(path, b.p, cut), "write");
        g = NULL;
        st = q3_gguf_open(path, &g);
        if (st == Q3_OK || g || !strstr(q3_last_error(), path)) {
            all_fail = 0;
            CHECK(0, "truncated at %zu of %zu: %s", cut, b.n, q3_last_error());
            q3_gguf_close(g);
        }
    }
    CHECK(all_fail, "every truncation fails");
    CHECK(write_file(path, b.p, 40), "write");
    CHECK(q3_gguf_open(path, &g) == Q3_ERR_FORMAT, "cut early: the counts cannot fit");
    CHECK_CONTAINS(q3_last_error(), "metadata count 3 cannot fit in the 16 bytes after the header");
    CHECK(write_file(path, b.p, 150), "write");
    CHECK(q3_gguf_open(path, &g) == Q3_ERR_FORMAT, "cut in an array: its count cannot fit");
    CHECK_CONTAINS(q3_last_error(), "'test.nested' (array): array of 2 string at byte 125 cannot fit in the 13 bytes left");
    CHECK(write_file(path, b.p, 153), "write");
    CHECK(q3_gguf_open(path, &g) == Q3_ERR_FORMAT, "cut in a string's length");
    CHECK_CONTAINS(q3_last_error(), "'test.nested' (array): array element 1: truncated: string length at byte 146 needs 8 bytes, only 7 left");
    CHECK(write_file(path, b.p, b.n - 1), "write");
    CHECK(q3_gguf_open(path, &g) == Q3_ERR_FORMAT, "cut in the data");
    CHECK_CONTAINS(q3_last_error(), "tensor 'b'");
    CHECK_CONTAINS(q3_last_error(), "(file truncated?)");

    spec c;
    expect_fail_bytes("", 0, Q3_ERR_FORMAT, "too small", "empty file");
    expect_fail_bytes("GGUF\3\0\0\0", 8, Q3_ERR_FORMAT, "too small", "8 bytes");
    c = base_spec(), c.magic = "GGML";
    expect_fail(&c, Q3_ERR_FORMAT, "not a GGUF file", "magic");
    c = base_spec(), c.version = 99;
    expect_fail(&c, Q3_ERR_UNSUPPORTED, "version 99 is not supported", "version 99");
    c = base_spec(), c.version = 1;
    expect_fail(&c, Q3_ERR_UNSUPPORTED, "version 1 is not supported", "version 1");
    c = base_spec(), c.version = 3u << 24;
    expect_fail(&c, Q3_ERR_UNSUPPORTED, "big-endian", "byte-swapped version");
    c = base_spec(), c.version = 2;
    build(&c, &b);
    CHECK(write_file(path, b.p, b.n) && q3_gguf_open(path, &g) == Q3_OK, "version 2 reads: %s", q3_last_error());
    q3_gguf_close(g);

    c = base_spec(), c.n_tensors = 1ull << 60;
    expect_fail(&c, Q3_ERR_FORMAT, "tensor count 1152921504606846976 cannot fit", "tensor count 2^60");
    c = base_spec(), c.n_tensors = UINT64_MAX;
    expect_fail(&c, Q3_ERR_FORMAT, "tensor count", "tensor count 2^64-1");
    c = base_spec(), c.n_kv = 1ull << 62;
    expect_fail(&c, Q3_ERR_FORMAT, "metadata count 4611686018427387904 cannot fit", "kv count 2^62");
    c = base_spec(), c.n_kv = 30;
    expect_fail(&c, Q3_ERR_FORMAT, "metadata", "kv count a bit too big");
    c = base_spec(), c.n_tensors = 3;
    expect_fail(&c, Q3_ERR_FORMAT, "tensor 2 of 3", "one tensor more than written");
    c = base_spec(), c.arch_len = 1ull << 62;
    expect_fail(&c, Q3_ERR_FORMAT, "(string): string length 4611686018427387904 at byte 56 exceeds the", "string length 2^62");
    c = base_spec(), c.arch_len = UINT64_MAX;
    expect_fail(&c, Q3_ERR_FORMAT, "general.architecture", "string length 2^64-1");
    c = base_spec(), c.key_len = 1ull << 40;
    expect_fail(&c, Q3_ERR_FORMAT, "metadata pair 2 of 3: key length 1099511627776", "key length 2^40");
    c = base_spec(), c.arch_type = 13;
    expect_fail(&c, Q3_ERR_FORMAT, "unknown value type 13", "value type 13");
    c = base_spec(), c.arch_type = 0xffffffffu;
    expect_fail(&c, Q3_ERR_FORMAT, "unknown value type 4294967295", "value type 2^32-1");
    c = base_spec(), c.dup_key = 1;
    expect_fail(&c, Q3_ERR_FORMAT, "'general.architecture' appears twice", "duplicate key");
    c = base_spec(), c.elem_count = 1ull << 61;
    expect_fail(&c, Q3_ERR_FORMAT, "array of 2305843009213693952 string", "array length 2^61");
    c = base_spec(), c.elem_type = Q3_GGUF_U16, c.elem_count = UINT64_MAX / 2 + 1;
    expect_fail(&c, Q3_ERR_FORMAT, "cannot fit", "u16 array whose byte size overflows");
    c = base_spec(), c.elem_type = 77;
    expect_fail(&c, Q3_ERR_FORMAT, "unknown element type 77", "array element type 77");
    c = base_spec(), c.depth = Q3_GGUF_MAX_ARRAY_DEPTH + 1;
    expect_fail(&c, Q3_ERR_FORMAT, "array element 0: arrays nested more than 8 deep", "deep nesting");
    c = base_spec(), c.align_type = Q3_GGUF_I32;
    expect_fail(&c, Q3_ERR_FORMAT, "general.alignment is i32, not u32", "alignment type");
    c = base_spec(), c.alignment = 48;
    expect_fail(&c, Q3_ERR_FORMAT, "alignment 48 is not a power of two", "alignment 48");
    c = base_spec(), c.alignment = 0;
    expect_fail(&c, Q3_ERR_FORMAT, "is not a power of two", "alignment 0");

    c = base_spec(), c.name_len = 1ull << 62;
    expect_fail(&c, Q3_ERR_FORMAT, "tensor 0 of 2: name length 4611686018427387904", "name length 2^62");
    c = base_spec(), c.name_a = "this-tensor-name-is-longer-than-the-127-bytes-a-q3_tensor-can-hold-which-"
                                 "is-already-twice-what-llama.cpp-accepts-so-reject-it-------------------",
    c.name_len = strlen(c.name_a);
    expect_fail(&c, Q3_ERR_FORMAT, "name length 144 at byte 156 exceeds the limit of 127 bytes", "name too long");
    c = base_spec(), c.name_b = "a";
    expect_fail(&c, Q3_ERR_FORMAT, "tensor name 'a' appears twice", "duplicate tensor");
    c = base_spec(), c.n_dims = 7;
    for (int d = 2; d < 7; d++) c.ne[d] = 1;
    expect_fail(&c, Q3_ERR_FORMAT, "'a': 7 dimensions (1 to 4 allowed)", "n_dims 7");
    c = base_spec(), c.n_dims = 0;
    expect_fail(&c, Q3_ERR_FORMAT, "0 dimensions", "n_dims 0");
    c = base_spec(), c.n_dims = 0xffffffffu;
    expect_fail(&c, Q3_ERR_FORMAT, "4294967295 dimensions", "n_dims 2^32-1");
    c = base_spec(), c.ne[1] = 0;
    expect_fail(&c, Q3_ERR_FORMAT, "ne[1] = 0 is not positive", "dim 0");
    c = base_spec(), c.ne[1] = 1ull << 63;
    expect_fail(&c, Q3_ERR_FORMAT, "ne[1] = 9223372036854775808 is not positive", "dim 2^63");
    c = base_spec(), c.ne[0] = 1ull << 40, c.ne[1] = 1ull << 40;
    expect_fail(&c, Q3_ERR_FORMAT, "element count overflows", "dims overflowing size_t");
    c = base_spec(), c.ne[0] = 1ull << 32, c.ne[1] = 1ull << 30;
    expect_fail(&c, Q3_ERR_FORMAT, "byte size overflows", "bytes overflowing size_t");
    c = base_spec(), c.ne[1] = 1ull << 40;
    expect_fail(&c, Q3_ERR_FORMAT, "lies outside the 384-byte data section", "huge tensor");
    c = base_spec(), c.ggml_type = 99;
    expect_fail(&c, Q3_ERR_FORMAT, "'a': unknown ggml type 99", "ggml type 99");
    c = base_spec(), c.ggml_type = 4;
    expect_fail(&c, Q3_ERR_FORMAT, "unknown ggml type 4", "retired ggml type 4");
    c = base_spec(), c.ggml_type = 11; /* Q3_K: a K-quant q3 does not run */
    expect_fail(&c, Q3_ERR_UNSUPPORTED, "'a': ggml type Q3_K (11) is not supported", "Q3_K");
    c = base_spec(), c.ggml_type = 10;
    expect_fail(&c, Q3_ERR_UNSUPPORTED, "ggml type Q2_K (10)", "Q2_K");
    c = base_spec(), c.ggml_type = Q3_GGML_Q4_K; /* rows of 32 are not 256-value super-blocks */
    expect_fail(&c, Q3_ERR_FORMAT, "'a': row length 32 is not a multiple of the q4_k block size 256", "Q4_K row 32");
    c = base_spec(), c.ggml_type = Q3_GGML_Q6_K;
    expect_fail(&c, Q3_ERR_FORMAT, "row length 32 is not a multiple of the q6_k block size 256", "Q6_K row 32");
    c = base_spec(), c.ggml_type = Q3_GGML_Q8_0, c.ne[0] = 33;
    expect_fail(&c, Q3_ERR_FORMAT, "'a': row length 33 is not a multiple of the q8_0 block size 32", "row 33");
    c = base_spec(), c.ggml_type = Q3_GGML_Q4_0, c.ne[0] = 16;
    expect_fail(&c, Q3_ERR_FORMAT, "row length 16 is not a multiple of the q4_0 block size 32", "row 16");
    c = base_spec(), c.offset_a = 1 << 20;
    expect_fail(&c, Q3_ERR_FORMAT, "tensor 'a': data [1048576, +256) lies outside", "offset outside");
    c = base_spec(), c.offset_a = UINT64_MAX - 31;
    expect_fail(&c, Q3_ERR_FORMAT, "lies outside", "offset near 2^64");
    c = base_spec(), c.offset_b = 4;
    expect_fail(&c, Q3_ERR_FORMAT, "tensor 'b': offset 4 is not a multiple of the alignment 32", "misaligned");
    c = base_spec(), c.offset_b = 224;
    expect_fail(&c, Q3_ERR_FORMAT, "tensors 'a' and 'b' overlap", "overlap");
    c = base_spec(), c.data_bytes = 300;
    expect_fail(&c, Q3_ERR_FORMAT, "tensor 'b': data [256, +128) lies outside the 300-byte data section",
                "short data");
    CHECK(q3_gguf_open(tmp_path("no-such-file.gguf"), &g) == Q3_ERR_IO && g == NULL, "missing file");
    CHECK_CONTAINS(q3_last_error(), "no-such-file.gguf");
    CHECK(q3_gguf_open(tmpdir, &g) == Q3_ERR_IO, "a folder");
    unlink(path);
}

/* The tiny golden file cut at many places and with bytes of its header
 * mutated: every open either succeeds or fails with a message; never crashes. */
static void test_hostile_golden(void)
{
    size_t n;
    uint8_t *orig = slurp(goldens[0].gguf, &n);
    CHECK(orig != NULL, "read %s", goldens[0].gguf);
    if (!orig) return;
    const char *path = tmp_path("mutated.gguf");
    size_t header = 28000; /* data section offset of the tiny file */
    int failures = 0, cuts = 0;
    for (size_t cut = 0; cut < n; cut += cut < 64 ? 1 : cut < header ? 97 : 65521) {
        write_file(path, orig, cut);
        q3_gguf *g = NULL;
        q3_status st = q3_gguf_open(path, &g);
        cuts++;
        failures += st != Q3_OK;
        CHECK(st != Q3_OK && g == NULL && strstr(q3_last_error(), path), "cut at %zu: %s", cut, q3_last_error());
        q3_gguf_close(g);
    }
    printf("tiny golden file cut at %d places: %d failed cleanly\n", cuts, failures);

    uint8_t *m = malloc(header);
    int opened = 0, rejected = 0;
    uint32_t r = 777;
    for (int iter = 0; iter < 400; iter++) {
        memcpy(m, orig, header);
        int flips = 1 + iter % 4;
        for (int k = 0; k < flips; k++) {
            r = r * 1103515245u + 12345u;
            size_t at = (r >> 4) % (iter % 2 ? 256 : header); /* half the time in the first 256 bytes */
            r = r * 1103515245u + 12345u;
            m[at] = iter % 3 == 0 ? (uint8_t)(r >> 16) : (uint8_t)(m[at] ^ (1u << (r >> 16) % 8));
        }
        /* the header only, followed by the original data */
        FILE *f = fopen(path, "wb");
        fwrite(m, 1, header, f);
        fwrite(orig + header, 1, n - header, f);
        fclose(f);
        q3_gguf *g = NULL;
        q3_status st = q3_gguf_open(path, &g);
        if (st == Q3_OK) {
            opened++;
            /* whatever was accepted is consistent: every tensor lies inside the file */
            for (size_t i = 0; i < q3_gguf_tensor_count(g); i++) {
                const q3_tensor *t = q3_gguf_tensor_at(g, i);
                CHECK(t->nbytes > 0 && q3_tensor_numel(t) > 0, "accepted tensor %s", t->name);
            }
            q3_gguf_close(g);
        } else {
            rejected++;
            CHECK(g == NULL && q3_last_error()[0], "mutation %d: no message", iter);
        }
    }
    printf("tiny golden header mutated 400 times: %d opened, %d rejected\n", opened, rejected);
    unlink(path);
    free(m);
    free(orig);
}

int main(void)
{
    snprintf(tmpdir, sizeof tmpdir, "%s", test_tmpdir());
    for (size_t i = 0; i < sizeof goldens / sizeof goldens[0]; i++) {
        test_golden_metadata(&goldens[i]);
        test_golden_tensors(&goldens[i]);
    }
    test_quantizers();
    test_writer_round_trip();
    test_writer_copies_golden();
    test_hostile();
    test_hostile_limits();
    test_hostile_golden();
    unlink(tmp_path("round.gguf"));
    unlink(tmp_path("cancelled.gguf"));
    unlink(tmp_path("tiny-copy.gguf"));
    rmdir(tmpdir);
    TEST_DONE();
}
