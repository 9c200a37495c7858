/* Loading: every kind of bad input gets a failure status and a message that
 * names the file and the field or tensor; nothing crashes. Shards and tied /
 * untied heads load. Sessions refuse to run past their context. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "golden.h"
#include "model/model.h"
#include "model/safetensors.h"
#include "q3.h"
#include "temps.h"
#include "test.h"

#define TINY TEST_DATA "/golden/tiny"

static char tmp_root[512];

static void write_file(const char *path, const void *data, size_t n)
{
    FILE *f = fopen(path, "wb");
    fwrite(data, 1, n, f);
    fclose(f);
}

/* A fresh model folder under tmp_root with the given config text. */
static const char *make_dir(const char *name, const char *config_text)
{
    static char dir[512];
    snprintf(dir, sizeof dir, "%s/%s", tmp_root, name);
    mkdir(dir, 0755);
    if (config_text) {
        char p[600];
        snprintf(p, sizeof p, "%s/config.json", dir);
        write_file(p, config_text, strlen(config_text));
    }
    return dir;
}

static char *tiny_config, *tiny_st;
static size_t tiny_st_len;

/* Splits tiny's safetensors into header JSON and data. */
static cJSON *tiny_header(const uint8_t **data, size_t *data_len)
{
    uint64_t h = 0;
    for (int i = 7; i >= 0; i--) h = h << 8 | (uint8_t)tiny_st[i];
    *data = (const uint8_t *)tiny_st + 8 + h;
    *data_len = tiny_st_len - 8 - h;
    return cJSON_ParseWithLength(tiny_st + 8, h);
}

static void write_st(const char *path, const char *header, const uint8_t *data, size_t data_len, uint64_t claimed)
{
    FILE *f = fopen(path, "wb");
    uint64_t h = claimed ? claimed : strlen(header);
    uint8_t len[8];
    for (int i = 0; i < 8; i++) len[i] = (uint8_t)(h >> (8 * i));
    fwrite(len, 1, 8, f);
    fwrite(header, 1, strlen(header), f);
    if (data_len) fwrite(data, 1, data_len, f);
    fclose(f);
}

/* Opens dir expecting failure with status st and a message containing want. */
static void expect_fail(const char *what, const char *dir, q3_status st, const char *want)
{
    q3_model *m = NULL;
    q3_status got = q3_model_open(dir, &m);
    CHECK(got == st, "%s: status %s, expected %s (%s)", what, q3_status_name(got), q3_status_name(st),
          q3_last_error());
    CHECK(m == NULL, "%s: model handle set on failure", what);
    CHECK(strstr(q3_last_error(), want) != NULL, "%s: message \"%s\" lacks \"%s\"", what, q3_last_error(), want);
    if (m) q3_model_close(m);
}

/* A model folder with tiny's config and a safetensors made from a mutated header. */
static const char *st_case(const char *name, cJSON *hdr, const uint8_t *data, size_t data_len, uint64_t claimed)
{
    const char *dir = make_dir(name, tiny_config);
    char p[600];
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    char *text = cJSON_PrintUnformatted(hdr);
    write_st(p, text, data, data_len, claimed);
    free(text);
    return dir;
}

static void config_cases(void)
{
    struct { const char *name, *from, *to; q3_status st; const char *want; } cases[] = {
        {"cfg_layers0", "\"num_hidden_layers\": 2", "\"num_hidden_layers\": 0", Q3_ERR_INVALID, "num_hidden_layers"},
        {"cfg_neg", "\"hidden_size\": 64", "\"hidden_size\": -64", Q3_ERR_INVALID, "hidden_size"},
        {"cfg_heads", "\"num_key_value_heads\": 2", "\"num_key_value_heads\": 3", Q3_ERR_INVALID, "divisible"},
        {"cfg_missing", "\"intermediate_size\": 192,", "", Q3_ERR_FORMAT, "missing field \"intermediate_size\""},
        {"cfg_arch", "\"model_type\": \"qwen3\"", "\"model_type\": \"llama\"", Q3_ERR_UNSUPPORTED, "not Qwen3"},
        {"cfg_type", "\"vocab_size\": 1024", "\"vocab_size\": \"1024\"", Q3_ERR_FORMAT, "vocab_size"},
        {"cfg_frac", "\"head_dim\": 32", "\"head_dim\": 32.5", Q3_ERR_FORMAT, "head_dim"},
        {"cfg_json", "\"vocab_size\": 1024", "\"vocab_size\": 1024,,", Q3_ERR_FORMAT, "malformed JSON"},
        {"cfg_tie", "\"tie_word_embeddings\": true", "\"tie_word_embeddings\": \"yes\"", Q3_ERR_FORMAT, "tie_word"},
        {"cfg_eps", "\"rms_norm_eps\": 1e-06", "\"rms_norm_eps\": -1", Q3_ERR_INVALID, "rms_norm_eps"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *at = strstr(tiny_config, cases[i].from);
        CHECK(at != NULL, "%s: config lacks %s", cases[i].name, cases[i].from);
        if (!at) continue;
        char buf[4096];
        snprintf(buf, sizeof buf, "%.*s%s%s", (int)(at - tiny_config), tiny_config, cases[i].to,
                 at + strlen(cases[i].from));
        const char *dir = make_dir(cases[i].name, buf);
        char p[600];
        snprintf(p, sizeof p, "%s/model.safetensors", dir);
        write_file(p, tiny_st, tiny_st_len);
        expect_fail(cases[i].name, dir, cases[i].st, cases[i].want);
        CHECK(strstr(q3_last_error(), "config.json") != NULL, "%s: message names the file: %s", cases[i].name,
              q3_last_error());
    }
}

static void safetensors_cases(void)
{
    const uint8_t *data;
    size_t n;
    cJSON *h;
    char p[600];
    const char *dir;

    expect_fail("missing folder", "/nonexistent/q3/model", Q3_ERR_IO, "no such file or folder");
    dir = make_dir("no_config", NULL);
    expect_fail("no config", dir, Q3_ERR_IO, "no config.json");
    dir = make_dir("no_weights", tiny_config);
    expect_fail("no weights", dir, Q3_ERR_IO, "no model.safetensors");

    /* shorter than the length field */
    dir = make_dir("short", tiny_config);
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    write_file(p, "abc", 3);
    expect_fail("3-byte file", dir, Q3_ERR_FORMAT, "too short");

    /* truncated: the data section cut short */
    dir = make_dir("truncated", tiny_config);
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    write_file(p, tiny_st, tiny_st_len - 1000);
    expect_fail("truncated data", dir, Q3_ERR_FORMAT, "outside");
    /* truncated inside the header */
    write_file(p, tiny_st, 100);
    expect_fail("truncated header", dir, Q3_ERR_FORMAT, "larger than the file");

    h = tiny_header(&data, &n);
    dir = st_case("absurd_header", h, data, n, 1ull << 50);
    expect_fail("absurd header length", dir, Q3_ERR_FORMAT, "absurdly large");
    cJSON_Delete(h);

    dir = make_dir("bad_json", tiny_config);
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    write_st(p, "{\"a\": [1, 2", data, 64, 0);
    expect_fail("malformed header", dir, Q3_ERR_FORMAT, "not a valid JSON");

    /* offsets outside the data */
    h = tiny_header(&data, &n);
    cJSON *t = cJSON_GetObjectItem(h, "model.norm.weight");
    cJSON_ReplaceItemInObject(t, "data_offsets", cJSON_CreateIntArray((int[]){(int)n, (int)n + 256}, 2));
    dir = st_case("outside", h, data, n, 0);
    expect_fail("offsets outside", dir, Q3_ERR_FORMAT, "model.norm.weight");
    cJSON_Delete(h);

    /* overlapping: norm points at the first 256 bytes of another tensor */
    h = tiny_header(&data, &n);
    t = cJSON_GetObjectItem(h, "model.norm.weight");
    cJSON *other = cJSON_GetObjectItem(h, "model.layers.0.input_layernorm.weight");
    cJSON_ReplaceItemInObject(t, "data_offsets", cJSON_Duplicate(cJSON_GetObjectItem(other, "data_offsets"), 1));
    dir = st_case("overlap", h, data, n, 0);
    expect_fail("overlapping tensors", dir, Q3_ERR_FORMAT, "overlap");
    cJSON_Delete(h);

    /* byte count not matching dtype x shape */
    h = tiny_header(&data, &n);
    t = cJSON_GetObjectItem(h, "model.norm.weight");
    cJSON_ReplaceItemInObject(t, "shape", cJSON_CreateIntArray((int[]){65}, 1));
    dir = st_case("size_mismatch", h, data, n, 0);
    expect_fail("dtype x shape mismatch", dir, Q3_ERR_FORMAT, "do not match");
    cJSON_Delete(h);

    /* unknown dtype */
    h = tiny_header(&data, &n);
    t = cJSON_GetObjectItem(h, "model.norm.weight");
    cJSON_ReplaceItemInObject(t, "dtype", cJSON_CreateString("I64"));
    dir = st_case("dtype", h, data, n, 0);
    expect_fail("unknown dtype", dir, Q3_ERR_UNSUPPORTED, "\"I64\"");
    cJSON_Delete(h);

    /* missing tensor */
    h = tiny_header(&data, &n);
    cJSON_DeleteItemFromObject(h, "model.layers.1.mlp.up_proj.weight");
    dir = st_case("missing", h, data, n, 0);
    expect_fail("missing tensor", dir, Q3_ERR_FORMAT, "missing tensor \"model.layers.1.mlp.up_proj.weight\"");
    cJSON_Delete(h);

    /* wrong shape, same byte count: q_proj [128][64] given as [64][128] */
    h = tiny_header(&data, &n);
    t = cJSON_GetObjectItem(h, "model.layers.0.self_attn.q_proj.weight");
    cJSON_ReplaceItemInObject(t, "shape", cJSON_CreateIntArray((int[]){64, 128}, 2));
    dir = st_case("shape", h, data, n, 0);
    expect_fail("wrong shape", dir, Q3_ERR_FORMAT, "has shape [64, 128], expected [128, 64]");
    cJSON_Delete(h);

    /* negative shape and offsets */
    h = tiny_header(&data, &n);
    t = cJSON_GetObjectItem(h, "model.norm.weight");
    cJSON_ReplaceItemInObject(t, "shape", cJSON_CreateIntArray((int[]){-64}, 1));
    dir = st_case("negshape", h, data, n, 0);
    expect_fail("negative shape", dir, Q3_ERR_FORMAT, "shape[0]");
    cJSON_Delete(h);

    /* an untied config without lm_head */
    char cfg[4096];
    char *at = strstr(tiny_config, "\"tie_word_embeddings\": true");
    snprintf(cfg, sizeof cfg, "%.*s\"tie_word_embeddings\": false%s", (int)(at - tiny_config), tiny_config,
             at + strlen("\"tie_word_embeddings\": true"));
    dir = make_dir("untied_no_head", cfg);
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    write_file(p, tiny_st, tiny_st_len);
    expect_fail("untied without lm_head", dir, Q3_ERR_FORMAT, "lm_head.weight");
}

/* Splits tiny into two shards with an index; logits equal the single file's. */
/* Lookup by name is a binary search over the header's names: every one of
 * thousands of names (in no order) is found, and no other. */
static void lookup_cases(void)
{
    enum { N = 5000 };
    size_t cap = (size_t)N * 80 + 64, len = 0;
    char *hdr = malloc(cap);
    len += (size_t)snprintf(hdr + len, cap - len, "{");
    for (int k = 0; k < N; k++) {
        unsigned key = (unsigned)k * 2654435761u; /* names out of order */
        len += (size_t)snprintf(hdr + len, cap - len, "%s\"t%08x.%d\":{\"dtype\":\"F32\",\"shape\":[%d],"
                                "\"data_offsets\":[%d,%d]}", k ? "," : "", key, k, k == N - 1, 0, 4 * (k == N - 1));
    }
    snprintf(hdr + len, cap - len, "}");
    char p[600];
    snprintf(p, sizeof p, "%s/many.safetensors", tmp_root);
    write_st(p, hdr, (const uint8_t *)"\0\0\0\0", 4, 0);
    q3_safetensors f;
    CHECK(q3_safetensors_open(p, &f) == Q3_OK, "5000 tensors: %s", q3_last_error());
    if (f.tensors) {
        int found = 0;
        for (int k = 0; k < N; k++) {
            char name[64];
            snprintf(name, sizeof name, "t%08x.%d", (unsigned)k * 2654435761u, k);
            const q3_tensor *t = q3_safetensors_find(&f, name);
            found += t && !strcmp(t->name, name) && t == &f.tensors[k];
        }
        CHECK(found == N, "found %d of %d tensors by name", found, N);
        CHECK(!q3_safetensors_find(&f, "") && !q3_safetensors_find(&f, "t") && !q3_safetensors_find(&f, "u"),
              "names not in the file");
        q3_safetensors_close(&f);
    }
    free(hdr);
    unlink(p);
}

static void shard_cases(void)
{
    const uint8_t *data;
    size_t n;
    cJSON *h = tiny_header(&data, &n);
    const char *dir = make_dir("sharded", tiny_config);
    char dir_copy[512];
    snprintf(dir_copy, sizeof dir_copy, "%s", dir);
    cJSON *parts[2] = {cJSON_CreateObject(), cJSON_CreateObject()};
    cJSON *map = cJSON_CreateObject();
    size_t off[2] = {0, 0};
    uint8_t *bufs[2] = {malloc(n), malloc(n)};
    int i = 0;
    for (cJSON *e = h->child; e; e = e->next, i++) {
        if (!strcmp(e->string, "__metadata__")) continue;
        int s = i % 2;
        cJSON *o = cJSON_GetObjectItem(e, "data_offsets");
        size_t b = (size_t)cJSON_GetArrayItem(o, 0)->valuedouble, en = (size_t)cJSON_GetArrayItem(o, 1)->valuedouble;
        memcpy(bufs[s] + off[s], data + b, en - b);
        cJSON *copy = cJSON_Duplicate(e, 1);
        double offs[2] = {(double)off[s], (double)(off[s] + en - b)};
        cJSON_ReplaceItemInObject(copy, "data_offsets", cJSON_CreateDoubleArray(offs, 2));
        cJSON_AddItemToObject(parts[s], e->string, copy);
        cJSON_AddStringToObject(map, e->string, s ? "model-00002-of-00002.safetensors" : "model-00001-of-00002.safetensors");
        off[s] += en - b;
    }
    char p[700];
    for (int s = 0; s < 2; s++) {
        snprintf(p, sizeof p, "%s/model-0000%d-of-00002.safetensors", dir_copy, s + 1);
        char *text = cJSON_PrintUnformatted(parts[s]);
        write_st(p, text, bufs[s], off[s], 0);
        free(text);
        cJSON_Delete(parts[s]);
        free(bufs[s]);
    }
    /* the shard the index names first is opened first */
    char first_shard[64];
    snprintf(first_shard, sizeof first_shard, "%s", map->child->valuestring);
    cJSON *idx = cJSON_CreateObject();
    cJSON_AddItemToObject(idx, "weight_map", map);
    char *text = cJSON_Print(idx);
    snprintf(p, sizeof p, "%s/model.safetensors.index.json", dir_copy);
    write_file(p, text, strlen(text));
    free(text);

    q3_model *a = NULL, *b = NULL;
    CHECK(q3_model_open(dir_copy, &a) == Q3_OK, "sharded open: %s", q3_last_error());
    CHECK(q3_model_open(TINY, &b) == Q3_OK, "tiny open: %s", q3_last_error());
    if (a && b) {
        CHECK(a->n_files == 2, "two shards mapped, got %d", a->n_files);
        CHECK(a->n_files == 2 && strstr(a->files[0].path, first_shard), "shards in order of first mention: %s",
              a->files[0].path);
        int32_t toks[6] = {1, 5, 9, 100, 7, 1000};
        float *la = malloc(1024 * sizeof(float)), *lb = malloc(1024 * sizeof(float));
        q3_session *sa, *sb;
        q3_session_opts o = {.n_ctx = 64, .backend = "ref"};
        CHECK(!q3_session_new(a, &o, &sa) && !q3_session_new(b, &o, &sb), "sessions");
        q3_session_prefill(sa, toks, 6, la, 0);
        q3_session_prefill(sb, toks, 6, lb, 0);
        CHECK(!memcmp(la, lb, 1024 * sizeof(float)), "sharded logits equal single-file logits");
        q3_session_free(sa);
        q3_session_free(sb);
        free(la);
        free(lb);
    }
    q3_model_close(a);
    q3_model_close(b);

    /* an index pointing outside the folder, or at a missing shard */
    cJSON_ReplaceItemInObject(idx, "weight_map", cJSON_Parse("{\"model.norm.weight\": \"../evil.safetensors\"}"));
    text = cJSON_Print(idx);
    write_file(p, text, strlen(text));
    free(text);
    expect_fail("index escaping the folder", dir_copy, Q3_ERR_FORMAT, "not a plain file name");
    cJSON_ReplaceItemInObject(idx, "weight_map", cJSON_Parse("{\"model.norm.weight\": \"gone.safetensors\"}"));
    text = cJSON_Print(idx);
    write_file(p, text, strlen(text));
    free(text);
    expect_fail("index naming a missing shard", dir_copy, Q3_ERR_IO, "gone.safetensors");
    write_file(p, "{\"weight_map\": ", 15);
    expect_fail("malformed index", dir_copy, Q3_ERR_FORMAT, "index.json");

    /* more distinct shards than q3 opens: refused before any is opened */
    cJSON *many = cJSON_CreateObject();
    for (int k = 0; k < 4097; k++) {
        char key[32], val[48];
        snprintf(key, sizeof key, "t%d", k);
        snprintf(val, sizeof val, "s-%05d.safetensors", k);
        cJSON_AddStringToObject(many, key, val);
    }
    cJSON_ReplaceItemInObject(idx, "weight_map", many);
    text = cJSON_PrintUnformatted(idx);
    write_file(p, text, strlen(text));
    free(text);
    expect_fail("4097 shards", dir_copy, Q3_ERR_FORMAT, "weight_map names 4097 shard files, more than the 4096 q3 opens");
    /* a shard name longer than a path: a message, not a truncated path */
    char *long_name = malloc(5001);
    memset(long_name, 'x', 5000);
    long_name[5000] = 0;
    cJSON *one = cJSON_CreateObject();
    cJSON_AddStringToObject(one, "model.norm.weight", long_name);
    cJSON_ReplaceItemInObject(idx, "weight_map", one);
    text = cJSON_PrintUnformatted(idx);
    write_file(p, text, strlen(text));
    free(text);
    free(long_name);
    expect_fail("shard name too long", dir_copy, Q3_ERR_FORMAT, "is too long for a path");
    cJSON_ReplaceItemInObject(idx, "weight_map", cJSON_CreateObject());
    text = cJSON_PrintUnformatted(idx);
    write_file(p, text, strlen(text));
    free(text);
    expect_fail("empty weight_map", dir_copy, Q3_ERR_FORMAT, "weight_map is empty");
    cJSON_Delete(idx);
    cJSON_Delete(h);
}

static void session_cases(void)
{
    q3_model *m;
    CHECK(q3_model_open(TINY, &m) == Q3_OK, "open tiny: %s", q3_last_error());
    if (!m) return;
    q3_session *s;
    q3_session_opts o = {.n_ctx = 8, .chunk = 4, .backend = "ref"};
    CHECK(q3_session_new(m, &o, &s) == Q3_OK, "session: %s", q3_last_error());
    int32_t toks[10] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
    float logits[1024];
    CHECK(q3_session_prefill(s, toks, 9, logits, 0) == Q3_ERR_CONTEXT, "9 tokens in a context of 8");
    CHECK_CONTAINS(q3_last_error(), "do not fit");
    CHECK(q3_session_pos(s) == 0, "a refused prefill leaves the position");
    CHECK(q3_session_prefill(s, toks, 7, logits, 0) == Q3_OK, "7 tokens: %s", q3_last_error());
    CHECK(q3_session_decode(s, 3, logits) == Q3_OK, "the 8th token fits");
    CHECK(q3_session_decode(s, 3, logits) == Q3_ERR_CONTEXT, "the 9th does not");
    CHECK(q3_session_pos(s) == 8, "position stays at 8, got %d", q3_session_pos(s));
    q3_session_reset(s);
    CHECK(q3_session_decode(s, 1024, logits) == Q3_ERR_INVALID, "token outside the vocabulary");
    CHECK_CONTAINS(q3_last_error(), "outside the vocabulary");
    CHECK(q3_session_decode(s, -1, logits) == Q3_ERR_INVALID, "negative token");
    q3_session_free(s);
    o.n_ctx = 1 << 30;
    CHECK(q3_session_new(m, &o, &s) == Q3_ERR_INVALID, "context above the model's maximum");
    o = (q3_session_opts){.backend = "tpu"};
    CHECK(q3_session_new(m, &o, &s) == Q3_ERR_INVALID, "unknown unit");
    CHECK_CONTAINS(q3_last_error(), "unknown compute unit \"tpu\"");
    o = (q3_session_opts){.kv_dtype = "q9"};
    CHECK(q3_session_new(m, &o, &s) == Q3_ERR_INVALID, "unknown kv dtype");
    q3_model_close(m);
}

/* The CLI on bad input: a message and exit status 2 (a usage error) or 1 (a
 * runtime error), not a signal. */
static void cli_cases(void)
{
    struct { const char *cmd, *want; int code; } cases[] = {
        {"./build/q3 info -m /nonexistent 2>&1", "no such file", 2},
        {"./build/q3 info 2>&1", "missing -m/--model", 2},
        {"./build/q3 logits -m " TINY " --tokens 1,x -o /dev/null 2>&1", "not a token id at 'x'", 2},
        {"./build/q3 logits -m " TINY " --tokens 5000 -o \"$Q3_TEST_TMP\"/logits.f32 2>&1", "outside the vocabulary", 1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char cmd[700];
        snprintf(cmd, sizeof cmd, "%s", cases[i].cmd);
        if (strstr(cmd, "./build/q3") && getenv("BUILD")) {
            /* run the binary of this build (build/ or build-san/) */
            char alt[700];
            snprintf(alt, sizeof alt, "./%s/q3%s", getenv("BUILD"), strstr(cmd, "./build/q3") + 10);
            snprintf(cmd, sizeof cmd, "%s", alt);
        }
        FILE *f = popen(cmd, "r");
        char out[2048] = "";
        size_t got = fread(out, 1, sizeof out - 1, f);
        out[got] = 0;
        int st = pclose(f);
        CHECK(WIFEXITED(st) && WEXITSTATUS(st) == cases[i].code, "%s: exit %d", cmd, st);
        CHECK(strstr(out, cases[i].want) != NULL, "%s: output \"%s\" lacks \"%s\"", cmd, out, cases[i].want);
    }
}

int main(void)
{
    snprintf(tmp_root, sizeof tmp_root, "%s", test_tmpdir());
    tiny_config = golden_slurp(TINY "/config.json", NULL);
    tiny_st = golden_slurp(TINY "/model.safetensors", &tiny_st_len);
    CHECK(tiny_config && tiny_st, "golden tiny model present");
    if (!tiny_config || !tiny_st) TEST_DONE();
    config_cases();
    safetensors_cases();
    lookup_cases();
    shard_cases();
    session_cases();
    cli_cases();
    free(tiny_config);
    free(tiny_st);
    TEST_DONE();
}
