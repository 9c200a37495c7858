/* Synthetic checkpoints: the safetensors header parsed back independently
 * (names, shapes, dtypes, contiguous offsets), config.json, determinism,
 * weight statistics, tokenizer copy, and failures. */
#include "test.h"
#include "temps.h"
#include "model/safetensors.h"
#include "tools/safetensors_write.h"
#include "tools/synth.h"
#include "util/file.h"

#include <cjson/cJSON.h>
#include <ftw.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <unistd.h>

static char root[512]; /* this run's temporary folder */

/* ---- helpers ------------------------------------------------------------ */

static const char *path_in(const char *sub, const char *name)
{
    static char buf[4][512];
    static int k;
    char *p = buf[k++ % 4];
    snprintf(p, 512, "%s/%s%s%s", root, sub, name ? "/" : "", name ? name : "");
    return p;
}

/* A small Qwen3: heads x head_dim (128) differs from hidden (64). */
static q3_config small_config(int tied)
{
    q3_config c;
    q3_synth_preset_tiny(&c);
    c.n_layers = 2;
    c.dim = 64;
    c.ffn_dim = 160;
    c.n_heads = 4;
    c.n_kv_heads = 2;
    c.head_dim = 32;
    c.vocab_size = 1000;
    c.tied_embeddings = tied;
    return c;
}

typedef struct expected { char name[96]; int ndim; int64_t shape[2]; int is_norm; } expected;

/* The names and shapes Hugging Face writes for c, in our file order. */
static int expected_tensors(const q3_config *c, expected *e)
{
    int n = 0;
    int64_t h = c->dim, q = (int64_t)c->n_heads * c->head_dim, kv = (int64_t)c->n_kv_heads * c->head_dim;
#define ADD(nm, nd, d0, d1, norm) \
    (snprintf(e[n].name, sizeof e[n].name, "%s", nm), e[n].ndim = nd, e[n].shape[0] = d0, \
     e[n].shape[1] = d1, e[n].is_norm = norm, n++)
    ADD("model.embed_tokens.weight", 2, c->vocab_size, h, 0);
    for (int l = 0; l < c->n_layers; l++) {
        char nm[96];
#define L(suffix, nd, d0, d1, norm) \
    (snprintf(nm, sizeof nm, "model.layers.%d.%s", l, suffix), ADD(nm, nd, d0, d1, norm))
        L("input_layernorm.weight", 1, h, 0, 1);
        L("self_attn.q_proj.weight", 2, q, h, 0);
        L("self_attn.k_proj.weight", 2, kv, h, 0);
        L("self_attn.v_proj.weight", 2, kv, h, 0);
        L("self_attn.o_proj.weight", 2, h, q, 0);
        L("self_attn.q_norm.weight", 1, c->head_dim, 0, 1);
        L("self_attn.k_norm.weight", 1, c->head_dim, 0, 1);
        L("post_attention_layernorm.weight", 1, h, 0, 1);
        L("mlp.gate_proj.weight", 2, c->ffn_dim, h, 0);
        L("mlp.up_proj.weight", 2, c->ffn_dim, h, 0);
        L("mlp.down_proj.weight", 2, h, c->ffn_dim, 0);
#undef L
    }
    ADD("model.norm.weight", 1, h, 0, 1);
    if (!c->tied_embeddings) ADD("lm_head.weight", 2, c->vocab_size, h, 0);
#undef ADD
    return n;
}

static int files_equal(const char *a, const char *b)
{
    char *x, *y;
    size_t nx, ny;
    if (q3_read_file(a, (size_t)1 << 30, &x, &nx)) return -1;
    if (q3_read_file(b, (size_t)1 << 30, &y, &ny)) { free(x); return -1; }
    int eq = nx == ny && memcmp(x, y, nx) == 0;
    free(x);
    free(y);
    return eq;
}

/* ---- the file, parsed back with cJSON ----------------------------------- */

static void check_file(const char *what, const char *dir_name, const q3_config *c, q3_dtype dtype)
{
    char *file;
    size_t size;
    q3_status st = q3_read_file(path_in(dir_name, "model.safetensors"), (size_t)1 << 30, &file, &size);
    CHECK(st == Q3_OK, "%s: read: %s", what, q3_last_error());
    if (st) return;
    CHECK(size >= 8, "%s: file of %zu bytes", what, size);
    uint64_t hlen = 0;
    for (int i = 0; i < 8; i++) hlen |= (uint64_t)(uint8_t)file[i] << (8 * i);
    CHECK(hlen % 8 == 0 && 8 + hlen <= size, "%s: header length %llu", what, (unsigned long long)hlen);
    char *header = strndup(file + 8, (size_t)hlen);
    cJSON *json = cJSON_Parse(header);
    CHECK(json != NULL, "%s: header is not JSON", what);
    if (!json) { free(header); free(file); return; }
    const unsigned char *data = (const unsigned char *)file + 8 + hlen;
    uint64_t data_len = size - 8 - hlen;

    const cJSON *meta = cJSON_GetObjectItemCaseSensitive(json, "__metadata__");
    const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(meta, "format");
    CHECK(cJSON_IsString(fmt) && !strcmp(fmt->valuestring, "pt"), "%s: __metadata__.format", what);

    expected exp[64];
    int n_exp = expected_tensors(c, exp), k = 0;
    const char *dt_name = dtype == Q3_BF16 ? "BF16" : "F32";
    size_t esize = dtype == Q3_BF16 ? 2 : 4;
    uint64_t cursor = 0, params = 0;
    double msum = 0, msq = 0, nsum = 0, nsq = 0;
    size_t mcount = 0, ncount = 0;
    const cJSON *t;
    cJSON_ArrayForEach(t, json) {
        if (!strcmp(t->string, "__metadata__")) continue;
        if (k >= n_exp) { CHECK(0, "%s: unexpected tensor %s", what, t->string); k++; continue; }
        const expected *e = &exp[k++];
        CHECK(!strcmp(t->string, e->name), "%s: tensor %d is %s, expected %s", what, k - 1,
              t->string, e->name);
        const cJSON *dt = cJSON_GetObjectItemCaseSensitive(t, "dtype");
        const cJSON *shape = cJSON_GetObjectItemCaseSensitive(t, "shape");
        const cJSON *offs = cJSON_GetObjectItemCaseSensitive(t, "data_offsets");
        CHECK(cJSON_IsString(dt) && !strcmp(dt->valuestring, dt_name), "%s: %s dtype", what, e->name);
        CHECK(cJSON_GetArraySize(shape) == e->ndim, "%s: %s rank", what, e->name);
        uint64_t numel = 1;
        for (int d = 0; d < e->ndim && d < cJSON_GetArraySize(shape); d++) {
            double v = cJSON_GetArrayItem(shape, d)->valuedouble;
            CHECK(v == (double)e->shape[d], "%s: %s dim %d is %g, expected %lld", what, e->name, d, v,
                  (long long)e->shape[d]);
            numel *= (uint64_t)e->shape[d];
        }
        params += numel;
        CHECK(cJSON_GetArraySize(offs) == 2, "%s: %s data_offsets", what, e->name);
        if (cJSON_GetArraySize(offs) != 2) continue;
        uint64_t b = (uint64_t)cJSON_GetArrayItem(offs, 0)->valuedouble;
        uint64_t end = (uint64_t)cJSON_GetArrayItem(offs, 1)->valuedouble;
        CHECK(b == cursor, "%s: %s begins at %llu, previous ended at %llu", what, e->name,
              (unsigned long long)b, (unsigned long long)cursor);
        CHECK(end - b == numel * esize && end <= data_len, "%s: %s spans [%llu, %llu)", what, e->name,
              (unsigned long long)b, (unsigned long long)end);
        if (end > data_len || end < b) continue;
        cursor = end;
        /* Statistics of the values. */
        for (uint64_t i = 0; i < numel; i++) {
            float v;
            if (dtype == Q3_BF16) {
                uint16_t h;
                memcpy(&h, data + b + 2 * i, 2);
                v = q3_bf16_to_f32(h);
            } else {
                memcpy(&v, data + b + 4 * i, 4);
            }
            if (e->is_norm) { nsum += v; nsq += (double)v * v; ncount++; }
            else { msum += v; msq += (double)v * v; mcount++; }
        }
    }
    CHECK(k == n_exp, "%s: %d tensors, expected %d", what, k, n_exp);
    CHECK(cursor == data_len, "%s: data ends at %llu, file data is %llu bytes", what,
          (unsigned long long)cursor, (unsigned long long)data_len);
    CHECK(params == q3_synth_param_count(c), "%s: %llu params, q3_synth_param_count says %llu", what,
          (unsigned long long)params, (unsigned long long)q3_synth_param_count(c));
    CHECK(cJSON_GetObjectItemCaseSensitive(json, "lm_head.weight") == NULL || !c->tied_embeddings,
          "%s: lm_head.weight present in a tied model", what);

    double mmean = msum / mcount, mstd = sqrt(msq / mcount - mmean * mmean);
    double nmean = nsum / ncount, nstd = sqrt(nsq / ncount - nmean * nmean);
    CHECK(fabs(mmean) < 0.001, "%s: matrix mean %f", what, mmean);
    CHECK(fabs(mstd - Q3_SYNTH_MATRIX_STD) < 0.1 * Q3_SYNTH_MATRIX_STD, "%s: matrix std %f", what, mstd);
    CHECK(fabs(nmean - 1.0) < 0.01, "%s: norm mean %f", what, nmean);
    CHECK(fabs(nstd - Q3_SYNTH_NORM_STD) < 0.15 * Q3_SYNTH_NORM_STD, "%s: norm std %f", what, nstd);
    printf("%s: %llu params, matrix mean %.5f std %.5f, norm mean %.4f std %.4f\n", what,
           (unsigned long long)params, mmean, mstd, nmean, nstd);

    cJSON_Delete(json);
    free(header);
    free(file);
}

static void check_config_json(const char *what, const char *dir_name, const q3_config *c, q3_dtype dtype)
{
    char *text;
    q3_status st = q3_read_file(path_in(dir_name, "config.json"), 1 << 20, &text, NULL);
    CHECK(st == Q3_OK, "%s: config.json: %s", what, q3_last_error());
    if (st) return;
    cJSON *j = cJSON_Parse(text);
    CHECK(j != NULL, "%s: config.json is not JSON", what);
    const cJSON *arch = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(j, "architectures"), 0);
    CHECK(cJSON_IsString(arch) && !strcmp(arch->valuestring, "Qwen3ForCausalLM"), "%s: architectures", what);
    const cJSON *mt = cJSON_GetObjectItemCaseSensitive(j, "model_type");
    CHECK(cJSON_IsString(mt) && !strcmp(mt->valuestring, "qwen3"), "%s: model_type", what);
    const cJSON *td = cJSON_GetObjectItemCaseSensitive(j, "torch_dtype");
    CHECK(cJSON_IsString(td) && !strcmp(td->valuestring, dtype == Q3_BF16 ? "bfloat16" : "float32"),
          "%s: torch_dtype", what);
    const cJSON *tie = cJSON_GetObjectItemCaseSensitive(j, "tie_word_embeddings");
    CHECK(cJSON_IsBool(tie) && cJSON_IsTrue(tie) == c->tied_embeddings, "%s: tie_word_embeddings", what);
    struct { const char *key; double want; } nums[] = {
        {"hidden_size", c->dim}, {"intermediate_size", c->ffn_dim},
        {"num_hidden_layers", c->n_layers}, {"num_attention_heads", c->n_heads},
        {"num_key_value_heads", c->n_kv_heads}, {"head_dim", c->head_dim},
        {"vocab_size", c->vocab_size}, {"max_position_embeddings", c->max_seq_len},
        {"rms_norm_eps", c->rms_eps}, {"rope_theta", c->rope_theta},
    };
    for (size_t i = 0; i < sizeof nums / sizeof nums[0]; i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, nums[i].key);
        CHECK(cJSON_IsNumber(v) && (float)v->valuedouble == (float)nums[i].want, "%s: %s", what, nums[i].key);
    }
    const cJSON *bos = cJSON_GetObjectItemCaseSensitive(j, "bos_token_id");
    const cJSON *eos = cJSON_GetObjectItemCaseSensitive(j, "eos_token_id");
    CHECK(cJSON_IsNumber(bos) && cJSON_IsNumber(eos) && eos->valueint < c->vocab_size &&
          bos->valueint < c->vocab_size, "%s: bos/eos ids", what);
    cJSON_Delete(j);
    free(text);

    /* And the engine's own parser reads it back to the same config. */
    q3_config back;
    st = q3_config_load(path_in(dir_name, "config.json"), &back);
    CHECK(st == Q3_OK, "%s: q3_config_load: %s", what, q3_last_error());
    CHECK(back.n_layers == c->n_layers && back.dim == c->dim && back.ffn_dim == c->ffn_dim &&
          back.n_heads == c->n_heads && back.n_kv_heads == c->n_kv_heads &&
          back.head_dim == c->head_dim && back.vocab_size == c->vocab_size &&
          back.rms_eps == c->rms_eps && back.rope_theta == c->rope_theta &&
          back.tied_embeddings == c->tied_embeddings, "%s: config round trip", what);
}

/* ---- tests -------------------------------------------------------------- */

static void test_small_bf16(void)
{
    q3_config c = small_config(1);
    q3_status st = q3_synth_write(path_in("a", NULL), 1, Q3_BF16, &c, NULL);
    CHECK(st == Q3_OK, "synth a: %s", q3_last_error());
    check_file("tied bf16", "a", &c, Q3_BF16);
    check_config_json("tied bf16", "a", &c, Q3_BF16);
    CHECK(temps_beside(path_in("a", "model.safetensors")) == 0, "no temporary file left");
    CHECK(!q3_file_exists(path_in("a", "tokenizer.json")), "no tokenizer without a tokenizer folder");

    /* Determinism: same seed, same bytes; another seed, other bytes. */
    st = q3_synth_write(path_in("b", NULL), 1, Q3_BF16, &c, NULL);
    CHECK(st == Q3_OK, "synth b: %s", q3_last_error());
    st = q3_synth_write(path_in("c", NULL), 2, Q3_BF16, &c, NULL);
    CHECK(st == Q3_OK, "synth c: %s", q3_last_error());
    CHECK(files_equal(path_in("a", "model.safetensors"), path_in("b", "model.safetensors")) == 1,
          "same seed gives the same weights");
    CHECK(files_equal(path_in("a", "config.json"), path_in("b", "config.json")) == 1,
          "same seed gives the same config.json");
    CHECK(files_equal(path_in("a", "model.safetensors"), path_in("c", "model.safetensors")) == 0,
          "another seed gives other weights");

    /* The engine's reader accepts it too. */
    q3_safetensors f;
    st = q3_safetensors_open(path_in("a", "model.safetensors"), &f);
    CHECK(st == Q3_OK, "q3_safetensors_open: %s", q3_last_error());
    if (!st) {
        CHECK(f.n_tensors == 2 + 11 * c.n_layers, "reader sees %d tensors", f.n_tensors);
        const q3_tensor *q = q3_safetensors_find(&f, "model.layers.1.self_attn.q_proj.weight");
        CHECK(q && q->dtype == Q3_BF16 && q->shape[0] == 128 && q->shape[1] == 64, "reader: q_proj");
        q3_safetensors_close(&f);
    }
}

static void test_small_f32_untied(void)
{
    /* A vocabulary of 20000 makes the embedding and lm_head span two of the
     * generator's 2^20-value blocks. */
    q3_config c = small_config(0);
    c.vocab_size = 20000;
    c.rope_theta = 10000.0f;
    c.rms_eps = 1e-5f;
    q3_status st = q3_synth_write(path_in("d", NULL), 7, Q3_F32, &c, NULL);
    CHECK(st == Q3_OK, "synth d: %s", q3_last_error());
    check_file("untied f32", "d", &c, Q3_F32);
    check_config_json("untied f32", "d", &c, Q3_F32);

    /* Blocks draw from different streams: the second block does not repeat
     * the first, and lm_head does not repeat the embedding. */
    q3_safetensors f;
    st = q3_safetensors_open(path_in("d", "model.safetensors"), &f);
    CHECK(st == Q3_OK, "q3_safetensors_open: %s", q3_last_error());
    if (!st) {
        const q3_tensor *emb = q3_safetensors_find(&f, "model.embed_tokens.weight");
        const q3_tensor *head = q3_safetensors_find(&f, "lm_head.weight");
        CHECK(emb && head && emb->nbytes == 20000u * 64 * 4 && head->nbytes == emb->nbytes,
              "embedding and lm_head sizes");
        if (emb && head) {
            const char *e = emb->data;
            CHECK(memcmp(e, e + ((size_t)1 << 20) * 4, 4096) != 0, "block 1 differs from block 0");
            CHECK(memcmp(e, head->data, 4096) != 0, "lm_head differs from the embedding");
        }
        q3_safetensors_close(&f);
    }
}

static void test_presets(void)
{
    q3_config c;
    CHECK(q3_synth_preset("0.6b", &c) == Q3_OK, "preset 0.6b");
    CHECK(c.n_layers == 28 && c.dim == 1024 && c.ffn_dim == 3072 && c.n_heads == 16 &&
          c.n_kv_heads == 8 && c.head_dim == 128 && c.vocab_size == 151936 &&
          c.rope_theta == 1e6f && c.rms_eps == 1e-6f && c.max_seq_len == 40960 && c.tied_embeddings,
          "the 0.6b preset is Qwen3-0.6B");
    /* Qwen3-0.6B has 596,049,920 weights (0.44 B without the embedding). */
    CHECK(q3_synth_param_count(&c) == 596049920ull, "0.6b params %llu",
          (unsigned long long)q3_synth_param_count(&c));
    CHECK(q3_synth_preset("tiny", &c) == Q3_OK && c.n_layers == 2 && c.dim == 64, "preset tiny");
    CHECK(q3_synth_preset("7b", &c) == Q3_ERR_INVALID, "unknown preset");
    CHECK_CONTAINS(q3_last_error(), "tiny");
}

static void test_tokenizer_copy(void)
{
    q3_config c;
    q3_synth_preset_tiny(&c);
    const char *tok = TEST_DATA "/golden/e2e";
    q3_status st = q3_synth_write(path_in("e", NULL), 3, Q3_BF16, &c, tok);
    CHECK(st == Q3_OK, "synth with tokenizer: %s", q3_last_error());
    CHECK(files_equal(TEST_DATA "/golden/e2e/tokenizer.json", path_in("e", "tokenizer.json")) == 1,
          "tokenizer.json copied");
    CHECK(files_equal(TEST_DATA "/golden/e2e/tokenizer_config.json",
                      path_in("e", "tokenizer_config.json")) == 1, "tokenizer_config.json copied");

    st = q3_synth_write(path_in("f", NULL), 3, Q3_BF16, &c, path_in("no-such-folder", NULL));
    CHECK(st == Q3_ERR_IO, "missing tokenizer folder: status %d", st);
    CHECK_CONTAINS(q3_last_error(), "tokenizer.json");
}

static void test_failures(void)
{
    q3_config c = small_config(1);
    CHECK(q3_synth_write(path_in("g", NULL), 1, Q3_F16, &c, NULL) == Q3_ERR_UNSUPPORTED, "f16 refused");
    CHECK_CONTAINS(q3_last_error(), "bf16 or f32");
    c.n_kv_heads = 3;
    CHECK(q3_synth_write(path_in("g", NULL), 1, Q3_BF16, &c, NULL) == Q3_ERR_INVALID, "bad heads refused");
    CHECK_CONTAINS(q3_last_error(), "num_key_value_heads");
    c = small_config(1);
    CHECK(q3_synth_write(path_in("a", "config.json/x"), 1, Q3_BF16, &c, NULL) == Q3_ERR_IO,
          "a folder under a file refused");

    /* The writer refuses incomplete files and leaves nothing behind. */
    q3_st_writer *w;
    int64_t shape[2] = {4, 4};
    const char *p = path_in("a", "partial.safetensors");
    CHECK(q3_st_writer_new(p, &w) == Q3_OK, "writer: %s", q3_last_error());
    CHECK(q3_st_writer_add(w, "x", Q3_F32, 2, shape) == Q3_OK, "add x");
    CHECK(q3_st_writer_add(w, "x", Q3_F32, 2, shape) == Q3_ERR_INVALID, "duplicate name refused");
    CHECK(q3_st_writer_add(w, "q\"", Q3_F32, 2, shape) == Q3_ERR_INVALID, "quote in name refused");
    CHECK(q3_st_writer_add(w, "y", Q3_Q8_0, 2, shape) == Q3_ERR_UNSUPPORTED, "q8_0 refused");
    CHECK(q3_st_writer_begin_data(w) == Q3_OK, "begin: %s", q3_last_error());
    float row[4] = {1, 2, 3, 4};
    CHECK(q3_st_writer_write(w, 0, 60, row, 16) == Q3_ERR_INVALID, "overrun refused");
    CHECK(q3_st_writer_write(w, 0, 16, row, 16) == Q3_OK, "write a row");
    CHECK(q3_st_writer_commit(w) == Q3_ERR_INVALID, "incomplete tensor refused at commit");
    CHECK_CONTAINS(q3_last_error(), "16 of its 64 bytes");
    CHECK(!q3_file_exists(p) && temps_beside(p) == 0,
          "nothing left behind");
}

static int remove_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    return remove(path);
}

int main(void)
{
    snprintf(root, sizeof root, "%s", test_tmpdir());
    test_presets();
    test_small_bf16();
    test_small_f32_untied();
    test_tokenizer_copy();
    test_failures();
    nftw(root, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
    TEST_DONE();
}
