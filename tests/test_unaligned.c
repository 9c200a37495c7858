/* Unaligned tensor data decodes bit for bit like aligned data (issue 25).
 *
 * safetensors does not align tensor data: a real file's tensors start
 * wherever the header ends (Hugging Face pads the header to 8 bytes), e.g.
 * at 56 mod 64, so every 64-byte row load of the kernels straddles two cache
 * lines. The golden small BF16 model is rewritten here with its header
 * padded so that the data starts at 0, 8, 24 and 56 mod 64 (the twins hold
 * the same bytes, only shifted in the file), and a prefill plus decode on the
 * cpu unit, with each ISA this CPU has, must give logits bit-identical to the
 * aligned twin's. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "q3.h"
#include "temps.h"
#include "test.h"

#define SRC "tests/data/golden/small-bf16"
enum { N_PROMPT = 5, N_DECODE = 4 };

static unsigned char *read_all(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *p = malloc(len > 0 ? (size_t)len : 1);
    if (p && fread(p, 1, (size_t)len, f) != (size_t)len) {
        free(p);
        p = NULL;
    }
    fclose(f);
    *n = (size_t)len;
    return p;
}

static int write_all(const char *path, const void *p, size_t n)
{
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    int ok = fwrite(p, 1, n, f) == n;
    return fclose(f) == 0 && ok ? 0 : -1;
}

/* A twin of the model folder whose data starts at `mod` mod 64: the header's
 * JSON padded with spaces. Returns the folder, or NULL. */
static const char *make_twin(const unsigned char *st, size_t st_len, const unsigned char *cfg, size_t cfg_len, int mod)
{
    uint64_t hlen = 0;
    for (int i = 0; i < 8; i++) hlen |= (uint64_t)st[i] << (8 * i);
    uint64_t pad = (uint64_t)((mod - (int)((8 + hlen) % 64) + 128) % 64), nh = hlen + pad;
    size_t out_len = st_len + pad;
    unsigned char *out = malloc(out_len);
    if (!out) return NULL;
    for (int i = 0; i < 8; i++) out[i] = (unsigned char)(nh >> (8 * i));
    memcpy(out + 8, st + 8, hlen);
    memset(out + 8 + hlen, ' ', pad);
    memcpy(out + 8 + nh, st + 8 + hlen, st_len - 8 - hlen);
    char name[32], path[1024];
    snprintf(name, sizeof name, "twin%d", mod);
    const char *dir = test_tmp(name); /* one of test_tmp's rotating buffers: 4 twins fit */
    int bad = mkdir(dir, 0755) != 0;
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    bad = bad || write_all(path, out, out_len);
    snprintf(path, sizeof path, "%s/config.json", dir);
    bad = bad || write_all(path, cfg, cfg_len);
    free(out);
    CHECK((8 + nh) % 64 == (uint64_t)mod, "twin %d: data starts at %llu mod 64", mod,
          (unsigned long long)((8 + nh) % 64));
    return bad ? NULL : dir;
}

/* Logits of N_PROMPT prefill rows (the last one) and N_DECODE decode steps. */
static float *run(const char *dir, int *vocab)
{
    q3_model *m;
    if (q3_model_open(dir, &m)) {
        fprintf(stderr, "%s: %s\n", dir, q3_last_error());
        return NULL;
    }
    int V = *vocab = q3_model_vocab_size(m);
    q3_session_opts o = {.n_ctx = 64, .chunk = 8, .backend = "cpu"};
    q3_session *s;
    float *out = malloc((size_t)(1 + N_DECODE) * V * sizeof(float));
    if (!out || q3_session_new(m, &o, &s)) {
        fprintf(stderr, "session: %s\n", q3_last_error());
        free(out);
        q3_model_close(m);
        return NULL;
    }
    const int32_t prompt[N_PROMPT] = {1, 17, 301, 4000, 42}, next[N_DECODE] = {7, 99, 2048, 3};
    q3_status st = q3_session_prefill(s, prompt, N_PROMPT, out, 0);
    for (int t = 0; !st && t < N_DECODE; t++) st = q3_session_decode(s, next[t], out + (size_t)(1 + t) * V);
    if (st) {
        fprintf(stderr, "run: %s\n", q3_last_error());
        free(out);
        out = NULL;
    }
    q3_session_free(s);
    q3_model_close(m);
    return out;
}

int main(void)
{
    size_t st_len, cfg_len;
    unsigned char *st = read_all(SRC "/model.safetensors", &st_len), *cfg = read_all(SRC "/config.json", &cfg_len);
    CHECK(st && cfg && st_len > 8, "cannot read %s", SRC);
    if (!st || !cfg || st_len <= 8) TEST_DONE();
    const int mods[] = {0, 8, 24, 56};
    const char *dirs[4];
    for (int i = 0; i < 4; i++) {
        dirs[i] = make_twin(st, st_len, cfg, cfg_len, mods[i]);
        CHECK(dirs[i] != NULL, "cannot write the twin at %d mod 64", mods[i]);
    }
    /* each ISA the unit can run here: the default (AVX-512 where present) and AVX2 */
    const char *isas[] = {NULL, "avx2"};
    for (int k = 0; k < 2; k++) {
        if (isas[k]) setenv("Q3_CPU_ISA", isas[k], 1);
        else unsetenv("Q3_CPU_ISA");
        int V = 0;
        float *ref = dirs[0] ? run(dirs[0], &V) : NULL;
        CHECK(ref != NULL, "the aligned twin did not run (%s)", isas[k] ? isas[k] : "default ISA");
        for (int i = 1; ref && i < 4; i++) {
            int V2 = 0;
            float *got = dirs[i] ? run(dirs[i], &V2) : NULL;
            CHECK(got && V2 == V, "the twin at %d mod 64 did not run", mods[i]);
            if (got && V2 == V) {
                size_t n = (size_t)(1 + N_DECODE) * V, diff = 0;
                for (size_t j = 0; j < n; j++) diff += memcmp(&got[j], &ref[j], sizeof(float)) != 0;
                CHECK(diff == 0, "%s ISA: data at %d mod 64: %zu of %zu logits differ from the aligned twin's",
                      isas[k] ? isas[k] : "default", mods[i], diff, n);
            }
            free(got);
        }
        free(ref);
    }
    unsetenv("Q3_CPU_ISA");
    free(st);
    free(cfg);
    TEST_DONE();
}
