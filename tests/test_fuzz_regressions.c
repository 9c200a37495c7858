/* Fuzzing findings, kept: every input in fuzz/regressions/<target>/ (each one
 * crashed a parser or broke an invariant before its fix) and every seed in
 * fuzz/corpus/<target>/ goes through the same function the libFuzzer target
 * runs (fuzz/fuzz_<target>.c, included here with FUZZ_NO_MAIN), and must break
 * no invariant. Each finding also has a direct check of the status and message
 * it gets now. */
#define FUZZ_NO_MAIN
#include "../fuzz/fuzz_chat_template.c"
#include "../fuzz/fuzz_config.c"
#include "../fuzz/fuzz_gguf.c"
#include "../fuzz/fuzz_safetensors.c"
#include "../fuzz/fuzz_shard_index.c"
#include "../fuzz/fuzz_srv_chat.c"
#include "../fuzz/fuzz_srv_completion.c"
#include "../fuzz/fuzz_srv_tokenize.c"
#include "../fuzz/fuzz_tokenize.c"
#include "../fuzz/fuzz_tokenizer_json.c"

#include <dirent.h>

#include "model/config.h"
#include "model/safetensors.h"
#include "test.h"

typedef int (*fuzz_fn)(const uint8_t *, size_t);

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static uint8_t *slurp(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *buf = malloc(len > 0 ? (size_t)len : 1);
    *n = buf && len > 0 ? fread(buf, 1, (size_t)len, f) : 0;
    fclose(f);
    return buf;
}

/* Runs every file of dir (in name order) through fn; returns how many. */
static int run_dir(const char *dir, fuzz_fn fn)
{
    DIR *d = opendir(dir);
    if (!d) return 0;
    char *names[512];
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) && n < 512)
        if (e->d_name[0] != '.') names[n++] = strdup(e->d_name);
    closedir(d);
    qsort(names, (size_t)n, sizeof *names, cmp_str);
    for (int i = 0; i < n; i++) {
        char path[1024];
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        size_t len = 0;
        uint8_t *data = slurp(path, &len);
        CHECK(data != NULL, "cannot read %s", path);
        if (data) {
            int before = fuzz_failures;
            fn(data, len);
            CHECK(fuzz_failures == before, "%s breaks an invariant (messages above)", path);
            free(data);
        }
        free(names[i]);
    }
    return n;
}

static void run_target(const char *target, fuzz_fn fn, int want_regressions)
{
    char dir[256];
    snprintf(dir, sizeof dir, "fuzz/regressions/%s", target);
    int regs = run_dir(dir, fn);
    CHECK(regs >= want_regressions, "%s: %d regression inputs, expected at least %d", target, regs,
          want_regressions);
    snprintf(dir, sizeof dir, "fuzz/corpus/%s", target);
    int seeds = run_dir(dir, fn);
    CHECK(seeds > 0, "%s: no seed corpus in %s", target, dir);
}

/* ---- direct checks of each finding ----------------------------------------- */

/* config.json: a rope_theta outside a float's range became inf (1e39) or 0
 * (1e-50) and was accepted; now Q3_ERR_INVALID naming the field. */
static void test_config_float_range(void)
{
    static const char *const thetas[] = {"1e39", "1e-50", "3.5e38"};
    for (size_t i = 0; i < sizeof thetas / sizeof thetas[0]; i++) {
        char text[512];
        snprintf(text, sizeof text,
                 "{\"model_type\": \"qwen3\", \"hidden_size\": 8, \"intermediate_size\": 16, \"num_attention_heads\": 2,"
                 " \"num_hidden_layers\": 1, \"vocab_size\": 16, \"rope_theta\": %s}",
                 thetas[i]);
        q3_config c;
        q3_status st = q3_config_parse_json(text, "config.json", &c);
        CHECK(st == Q3_ERR_INVALID, "rope_theta %s: %s", thetas[i], q3_status_name(st));
        CHECK_CONTAINS(q3_last_error(), "rope_theta");
    }
    q3_config c;
    q3_status st = q3_config_parse_json("{\"model_type\": \"qwen3\", \"hidden_size\": 8, \"intermediate_size\": 16,"
                                        " \"num_attention_heads\": 2, \"num_hidden_layers\": 1, \"vocab_size\": 16,"
                                        " \"rope_theta\": 3.4e38, \"rms_norm_eps\": 1e-38}",
                                        "config.json", &c);
    CHECK(st == Q3_OK, "largest float rope_theta: %s", q3_last_error());
    c.rope_theta = 0.0f / 0.0f;
    CHECK(q3_config_validate(&c, "c") == Q3_ERR_INVALID, "validate accepts a NaN rope_theta");
}

static q3_status open_st(const char *header, size_t data_len, q3_safetensors *f)
{
    size_t h = strlen(header);
    uint8_t buf[1024] = {0};
    for (int i = 0; i < 8; i++) buf[i] = (uint8_t)((uint64_t)h >> (8 * i));
    memcpy(buf + 8, header, h);
    const char *path = fuzz_path("test", "t.safetensors");
    fuzz_write(path, buf, 8 + h + data_len);
    return q3_safetensors_open(path, f);
}

/* safetensors: data_offsets of 1e30 or 1e999 were cast to uint64_t (undefined
 * behaviour); an empty tensor sorted between two overlapping ones hid the
 * overlap. Both are Q3_ERR_FORMAT now. */
static void test_safetensors_offsets(void)
{
    q3_safetensors f;
    q3_status st = open_st("{\"a\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[1e30,1e30]}}", 16, &f);
    CHECK(st == Q3_ERR_FORMAT, "offsets 1e30: %s", q3_status_name(st));
    st = open_st("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,1e999]}}", 16, &f);
    CHECK(st == Q3_ERR_FORMAT, "offsets inf: %s", q3_status_name(st));
    st = open_st("{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]},"
                 "\"z\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[4,4]},"
                 "\"c\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,12]}}",
                 16, &f);
    CHECK(st == Q3_ERR_FORMAT, "overlap behind an empty tensor: %s", q3_status_name(st));
    CHECK_CONTAINS(q3_last_error(), "overlap");
    /* empty tensors anywhere, including inside another, are fine: they own no bytes */
    st = open_st("{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]},"
                 "\"z\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[4,4]},"
                 "\"c\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[16,20]}}",
                 20, &f);
    CHECK(st == Q3_OK, "an empty tensor inside another: %s", q3_last_error());
    if (st == Q3_OK) {
        CHECK(f.n_tensors == 3, "%d tensors", f.n_tensors);
        q3_safetensors_close(&f);
    }
}

/* tokenizer.json without added tokens: tk_finish called qsort(NULL, 0, ...)
 * (undefined; UBSan nonnull-attribute). It loads now. */
static void test_tokenizer_no_added(void)
{
    size_t n = 0;
    uint8_t *data = slurp("fuzz/regressions/tokenizer_json/no_added_tokens_qsort_null.json", &n);
    CHECK(data != NULL, "regression input missing");
    if (!data) return;
    const char *path = fuzz_path("test", "tokenizer.json");
    fuzz_write(path, data, n);
    free(data);
    q3_tokenizer *tok = NULL;
    q3_status st = q3_tokenizer_load(path, &tok);
    CHECK(st == Q3_OK, "no added tokens: %s", q3_last_error());
    if (tok) {
        int32_t *ids = NULL;
        size_t n_ids = 0;
        st = q3_tokenizer_encode(tok, "<|im_end|> ok", 13, Q3_ENCODE_DEFAULT, &ids, &n_ids);
        CHECK(st == Q3_OK && n_ids > 0, "encode with no added tokens: %s", q3_last_error());
        free(ids);
        q3_tokenizer_free(tok);
    }
}

int main(void)
{
    run_target("safetensors", fuzz_safetensors, 3);
    run_target("config", fuzz_config, 2);
    run_target("shard_index", fuzz_shard_index, 0);
    run_target("gguf", fuzz_gguf, 1);
    run_target("chat_template", fuzz_chat_template, 0);
    run_target("tokenizer_json", fuzz_tokenizer_json, 1);
    run_target("tokenize", fuzz_tokenize, 0);
    run_target("srv_chat", fuzz_srv_chat, 2);
    run_target("srv_completion", fuzz_srv_completion, 2);
    run_target("srv_tokenize", fuzz_srv_tokenize, 0);
    test_config_float_range();
    test_safetensors_offsets();
    test_tokenizer_no_added();
    TEST_DONE();
}
