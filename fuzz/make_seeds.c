/* Writes the binary seed files of fuzz/corpus/ (`make fuzz-seeds`): small valid
 * safetensors and GGUF files made with the project's writers, and a few
 * hand-built edge cases. Text seeds (JSON) are kept in the corpus as they are.
 *
 *     build-fuzz/make_seeds fuzz/corpus */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "fuzz_common.h"
#include "fuzz_model.h"
#include "model/gguf.h"
#include "tools/gguf_write.h"
#include "model/quantize.h"
#include "tools/safetensors_write.h"
#include "text/tokenizer_gguf.h"

static const char *root;

static const char *out_path(const char *target, const char *name)
{
    static char buf[2][512];
    static int next;
    char *p = buf[next++ & 1];
    snprintf(p, sizeof buf[0], "%s/%s", root, target);
    mkdir(p, 0755);
    snprintf(p, sizeof buf[0], "%s/%s/%s", root, target, name);
    return p;
}

static void die_if(q3_status st, const char *what)
{
    if (st) {
        fprintf(stderr, "make_seeds: %s: %s\n", what, q3_last_error());
        exit(1);
    }
}

/* A safetensors file from a header text and data bytes. */
static void raw_st(const char *name, const char *header, const void *data, size_t n)
{
    size_t h = strlen(header);
    uint8_t *buf = malloc(8 + h + n + 1);
    for (int i = 0; i < 8; i++) buf[i] = (uint8_t)((uint64_t)h >> (8 * i));
    memcpy(buf + 8, header, h);
    if (n) memcpy(buf + 8 + h, data, n);
    fuzz_write(out_path("safetensors", name), buf, 8 + h + n);
    free(buf);
}

static void safetensors_seeds(void)
{
    die_if(fuzz_write_micro_st(out_path("safetensors", "micro_f32.safetensors"), 0, FUZZ_MICRO_N, 0, Q3_F32),
           "micro_f32");
    die_if(fuzz_write_micro_st(out_path("safetensors", "micro_bf16_head.safetensors"), 0, FUZZ_MICRO_N, 1, Q3_BF16),
           "micro_bf16");

    /* two tiny tensors, F16 [2][3] and BF16 [4] */
    q3_st_writer *w;
    die_if(q3_st_writer_new(out_path("safetensors", "two_tensors.safetensors"), &w), "two_tensors");
    const int64_t s1[2] = {2, 3}, s2[1] = {4};
    die_if(q3_st_writer_add(w, "a", Q3_F16, 2, s1), "add a");
    die_if(q3_st_writer_add(w, "b", Q3_BF16, 1, s2), "add b");
    die_if(q3_st_writer_begin_data(w), "begin");
    const uint8_t bytes[12] = {0, 0x3c, 0, 0x40, 0, 0x42, 0, 0xbc, 0, 0, 0, 0x7c};
    die_if(q3_st_writer_write(w, 0, 0, bytes, 12), "write a");
    die_if(q3_st_writer_write(w, 1, 0, bytes, 8), "write b");
    die_if(q3_st_writer_commit(w), "commit");

    raw_st("empty_header.safetensors", "{}", NULL, 0);
    raw_st("metadata_only.safetensors", "{\"__metadata__\":{\"format\":\"pt\"}}", NULL, 0);
    const float four[1] = {1.5f};
    raw_st("scalar_and_empty.safetensors",
           "{\"s\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[0,4]},"
           "\"z\":{\"dtype\":\"F32\",\"shape\":[0,3],\"data_offsets\":[4,4]},"
           "\"y\":{\"dtype\":\"BF16\",\"shape\":[3,0],\"data_offsets\":[0,0]}}",
           four, 4);
    const uint8_t eight[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    raw_st("padded_header.safetensors", "{\"t\":{\"dtype\":\"F16\",\"shape\":[2,2],\"data_offsets\":[0,8]}}    ", eight,
           8);
}

/* The micro model as GGUF: qwen3 metadata, llama.cpp tensor names. */
static void micro_gguf(const char *name, q3_dtype dt, int untied)
{
    q3_gguf_writer *w;
    die_if(q3_gguf_writer_new(&w), "gguf writer");
    die_if(q3_gguf_writer_add_str(w, "general.architecture", "qwen3"), "arch");
    die_if(q3_gguf_writer_add_str(w, "general.name", "micro"), "name");
    die_if(q3_gguf_writer_add_u32(w, "general.file_type", dt == Q3_F32 ? 0 : 1), "file_type");
    die_if(q3_gguf_writer_add_u32(w, "qwen3.block_count", 1), "block_count");
    die_if(q3_gguf_writer_add_u32(w, "qwen3.context_length", 64), "context_length");
    die_if(q3_gguf_writer_add_u32(w, "qwen3.embedding_length", 8), "embedding_length");
    die_if(q3_gguf_writer_add_u32(w, "qwen3.feed_forward_length", 16), "ffn");
    die_if(q3_gguf_writer_add_u32(w, "qwen3.attention.head_count", 2), "heads");
    die_if(q3_gguf_writer_add_u32(w, "qwen3.attention.head_count_kv", 1), "kv heads");
    die_if(q3_gguf_writer_add_u32(w, "qwen3.attention.key_length", 4), "key_length");
    die_if(q3_gguf_writer_add_u32(w, "qwen3.attention.value_length", 4), "value_length");
    die_if(q3_gguf_writer_add_f32(w, "qwen3.rope.freq_base", 1e6f), "rope");
    die_if(q3_gguf_writer_add_f32(w, "qwen3.attention.layer_norm_rms_epsilon", 1e-6f), "eps");
    static uint8_t data[FUZZ_MICRO_N + 1][16 * 16 * 4];
    for (size_t i = 0; i < FUZZ_MICRO_N; i++) {
        float v[256];
        for (int k = 0; k < 256; k++) v[k] = (float)((k * 5 + (int)i) % 13 - 6) / 8.0f;
        q3_row_from_f32(dt, v, data[i], 256);
        die_if(q3_gguf_writer_add_tensor(w, fuzz_micro[i].gguf, dt, fuzz_micro[i].ndim, fuzz_micro[i].shape, data[i]),
               fuzz_micro[i].gguf);
    }
    if (untied) {
        const int64_t head[2] = {16, 8};
        die_if(q3_gguf_writer_add_tensor(w, "output.weight", dt, 2, head, data[0]), "output");
    }
    die_if(q3_gguf_writer_write(w, out_path("gguf", name), NULL, NULL), name);
    q3_gguf_writer_free(w);
}

/* A byte builder for GGUF files the writer does not make. */
typedef struct bb {
    uint8_t d[4096];
    size_t n;
} bb;

static void bb_raw(bb *b, const void *p, size_t n)
{
    memcpy(b->d + b->n, p, n);
    b->n += n;
}
static void bb_u32(bb *b, uint32_t v)
{
    for (int i = 0; i < 4; i++) b->d[b->n++] = (uint8_t)(v >> (8 * i));
}
static void bb_u64(bb *b, uint64_t v)
{
    for (int i = 0; i < 8; i++) b->d[b->n++] = (uint8_t)(v >> (8 * i));
}
static void bb_str(bb *b, const char *s, size_t n)
{
    bb_u64(b, n);
    bb_raw(b, s, n);
}
static void bb_key(bb *b, const char *k, uint32_t type)
{
    bb_str(b, k, strlen(k));
    bb_u32(b, type);
}

static void gguf_seeds(void)
{
    micro_gguf("micro_f32.gguf", Q3_F32, 0);
    micro_gguf("micro_f16_untied.gguf", Q3_F16, 1);

    /* metadata only (the writer's general.alignment plus one string) */
    q3_gguf_writer *w;
    die_if(q3_gguf_writer_new(&w), "writer");
    die_if(q3_gguf_writer_add_str(w, "general.architecture", "llama"), "arch");
    die_if(q3_gguf_writer_write(w, out_path("gguf", "minimal.gguf"), NULL, NULL), "minimal");
    q3_gguf_writer_free(w);

    /* quantized tensors and the writer's array types */
    die_if(q3_gguf_writer_new(&w), "writer");
    const char *strs[3] = {"a", "", "\xe4\xbd\xa0"};
    const int32_t ints[4] = {-1, 0, 1, 2147483647};
    const float flts[2] = {0.5f, -2.0f};
    die_if(q3_gguf_writer_add_str_array(w, "tokenizer.ggml.tokens", strs, 3), "tokens");
    die_if(q3_gguf_writer_add_i32_array(w, "tokenizer.ggml.token_type", ints, 4), "types");
    die_if(q3_gguf_writer_add_f32_array(w, "tokenizer.ggml.scores", flts, 2), "scores");
    die_if(q3_gguf_writer_add_bool(w, "b", true), "bool");
    die_if(q3_gguf_writer_add_u64(w, "u64", 1ull << 40), "u64");
    die_if(q3_gguf_writer_add_i32(w, "i32", -7), "i32");
    die_if(q3_gguf_writer_add_f32(w, "f32", 3.25f), "f32");
    static float src[64];
    for (int i = 0; i < 64; i++) src[i] = (float)(i - 32) / 16.0f;
    static uint8_t q8[2 * 34], q4[2 * 18];
    die_if(q3_quantize(Q3_Q8_0, src, q8, 64), "q8_0");
    die_if(q3_quantize(Q3_Q4_0, src, q4, 64), "q4_0");
    const int64_t sq8[2] = {2, 32}, sq4[1] = {64};
    die_if(q3_gguf_writer_add_tensor(w, "q8", Q3_Q8_0, 2, sq8, q8), "q8");
    die_if(q3_gguf_writer_add_tensor(w, "q4", Q3_Q4_0, 1, sq4, q4), "q4");
    static float ksrc[256];
    for (int i = 0; i < 256; i++) ksrc[i] = (float)((i * 37) % 101 - 50) / 25.0f;
    static uint8_t q4k[144], q6k[210];
    die_if(q3_quantize(Q3_Q4_K, ksrc, q4k, 256), "q4_k");
    die_if(q3_quantize(Q3_Q6_K, ksrc, q6k, 256), "q6_k");
    const int64_t sk[1] = {256};
    die_if(q3_gguf_writer_add_tensor(w, "q4k", Q3_Q4_K, 1, sk, q4k), "q4k");
    die_if(q3_gguf_writer_add_tensor(w, "q6k", Q3_Q6_K, 1, sk, q6k), "q6k");
    die_if(q3_gguf_writer_write(w, out_path("gguf", "quant_arrays.gguf"), NULL, NULL), "quant");
    q3_gguf_writer_free(w);

    /* every value type by hand, version 2, nested arrays, a NUL inside a string,
     * alignment 64, one BF16 tensor */
    bb b = {.n = 0};
    bb_raw(&b, "GGUF", 4);
    bb_u32(&b, 2);
    bb_u64(&b, 1);  /* tensors */
    bb_u64(&b, 16); /* pairs */
    bb_key(&b, "general.alignment", Q3_GGUF_U32), bb_u32(&b, 64);
    bb_key(&b, "u8", Q3_GGUF_U8), b.d[b.n++] = 200;
    bb_key(&b, "i8", Q3_GGUF_I8), b.d[b.n++] = 0x80;
    bb_key(&b, "u16", Q3_GGUF_U16), b.d[b.n++] = 0xff, b.d[b.n++] = 0xff;
    bb_key(&b, "i16", Q3_GGUF_I16), b.d[b.n++] = 0x00, b.d[b.n++] = 0x80;
    bb_key(&b, "i64", Q3_GGUF_I64), bb_u64(&b, (uint64_t)INT64_MIN);
    bb_key(&b, "u64", Q3_GGUF_U64), bb_u64(&b, UINT64_MAX);
    double f64 = -0.0;
    bb_key(&b, "f64", Q3_GGUF_F64), bb_raw(&b, &f64, 8);
    bb_key(&b, "bool", Q3_GGUF_BOOL), b.d[b.n++] = 2;
    bb_key(&b, "nul", Q3_GGUF_STRING), bb_str(&b, "a\0b", 3);
    bb_key(&b, "empty", Q3_GGUF_ARRAY), bb_u32(&b, Q3_GGUF_U8), bb_u64(&b, 0);
    bb_key(&b, "bools", Q3_GGUF_ARRAY), bb_u32(&b, Q3_GGUF_BOOL), bb_u64(&b, 3);
    b.d[b.n++] = 0, b.d[b.n++] = 1, b.d[b.n++] = 7;
    bb_key(&b, "i16s", Q3_GGUF_ARRAY), bb_u32(&b, Q3_GGUF_I16), bb_u64(&b, 2);
    bb_u32(&b, 0x8000ffff);
    bb_key(&b, "f64s", Q3_GGUF_ARRAY), bb_u32(&b, Q3_GGUF_F64), bb_u64(&b, 1), bb_raw(&b, &f64, 8);
    bb_key(&b, "nested", Q3_GGUF_ARRAY), bb_u32(&b, Q3_GGUF_ARRAY), bb_u64(&b, 2);
    bb_u32(&b, Q3_GGUF_STRING), bb_u64(&b, 2), bb_str(&b, "x", 1), bb_str(&b, "yz", 2);
    bb_u32(&b, Q3_GGUF_ARRAY), bb_u64(&b, 1), bb_u32(&b, Q3_GGUF_U32), bb_u64(&b, 1), bb_u32(&b, 9);
    bb_key(&b, "general.architecture", Q3_GGUF_STRING), bb_str(&b, "qwen3", 5);
    /* tensor: bf16 [3][2] at offset 0 */
    bb_str(&b, "t", 1);
    bb_u32(&b, 2), bb_u64(&b, 2), bb_u64(&b, 3), bb_u32(&b, 30), bb_u64(&b, 0);
    while (b.n % 64) b.d[b.n++] = 0;
    for (int i = 0; i < 12; i++) b.d[b.n++] = (uint8_t)(i * 17);
    fuzz_write(out_path("gguf", "all_types_v2.gguf"), b.d, b.n);

    /* header only: no pairs, no tensors */
    b.n = 0;
    bb_raw(&b, "GGUF", 4), bb_u32(&b, 3), bb_u64(&b, 0), bb_u64(&b, 0);
    fuzz_write(out_path("gguf", "empty.gguf"), b.d, b.n);
}

/* GPT-2's byte-level alphabet: byte b as the UTF-8 of its stand-in character. */
static void byte_level(int b, char out[4])
{
    int cp = b;
    if (!((b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff))) {
        int k = 0;
        for (int x = 0; x < b; x++)
            if (!((x >= 0x21 && x <= 0x7e) || (x >= 0xa1 && x <= 0xac) || (x >= 0xae && x <= 0xff))) k++;
        cp = 256 + k;
    }
    if (cp < 0x80) {
        out[0] = (char)cp, out[1] = 0;
    } else {
        out[0] = (char)(0xc0 | cp >> 6), out[1] = (char)(0x80 | (cp & 0x3f)), out[2] = 0;
    }
}

/* A small tokenizer in GGUF metadata, as llama.cpp writes Qwen's: 256 byte
 * tokens, a few merges, control, user-defined and unused tokens. */
static void tokenizer_gguf_seed(void)
{
    static char bytes[256][4];
    const char *tokens[270];
    int32_t types[270];
    int n = 0;
    for (int b = 0; b < 256; b++) {
        byte_level(b, bytes[b]);
        types[n] = Q3_TOKEN_TYPE_NORMAL;
        tokens[n++] = bytes[b];
    }
    const char *merged[] = {"\xc4\xa0t", "he", "\xc4\xa0the", "in", "\xc4\xa0\xc4\xa0"};
    const char *merges[] = {"\xc4\xa0 t", "h e", "\xc4\xa0t he", "i n", "\xc4\xa0 \xc4\xa0"};
    for (int i = 0; i < 5; i++) types[n] = Q3_TOKEN_TYPE_NORMAL, tokens[n++] = merged[i];
    types[n] = Q3_TOKEN_TYPE_CONTROL, tokens[n++] = "<|endoftext|>";
    types[n] = Q3_TOKEN_TYPE_CONTROL, tokens[n++] = "<|im_start|>";
    types[n] = Q3_TOKEN_TYPE_CONTROL, tokens[n++] = "<|im_end|>";
    types[n] = Q3_TOKEN_TYPE_USER_DEFINED, tokens[n++] = "<think>";
    types[n] = Q3_TOKEN_TYPE_USER_DEFINED, tokens[n++] = "</think>";
    types[n] = Q3_TOKEN_TYPE_UNUSED, tokens[n++] = "[PAD266]";
    q3_gguf_writer *w;
    die_if(q3_gguf_writer_new(&w), "writer");
    die_if(q3_gguf_writer_add_str(w, "general.architecture", "qwen3"), "arch");
    die_if(q3_gguf_writer_add_str(w, "tokenizer.ggml.model", "gpt2"), "model");
    die_if(q3_gguf_writer_add_str(w, "tokenizer.ggml.pre", "qwen2"), "pre");
    die_if(q3_gguf_writer_add_str_array(w, "tokenizer.ggml.tokens", tokens, (size_t)n), "tokens");
    die_if(q3_gguf_writer_add_i32_array(w, "tokenizer.ggml.token_type", types, (size_t)n), "types");
    die_if(q3_gguf_writer_add_str_array(w, "tokenizer.ggml.merges", merges, 5), "merges");
    die_if(q3_gguf_writer_add_u32(w, "tokenizer.ggml.eos_token_id", 263), "eos");
    die_if(q3_gguf_writer_add_u32(w, "tokenizer.ggml.padding_token_id", 261), "pad");
    die_if(q3_gguf_writer_add_bool(w, "tokenizer.ggml.add_bos_token", false), "add_bos");
    die_if(q3_gguf_writer_add_str(w, "tokenizer.chat_template", "{{ messages }}"), "template");
    die_if(q3_gguf_writer_write(w, out_path("gguf", "tokenizer_small.gguf"), NULL, NULL), "tokenizer gguf");
    q3_gguf_writer_free(w);
}

int main(int argc, char **argv)
{
    root = argc > 1 ? argv[1] : "fuzz/corpus";
    mkdir(root, 0755);
    safetensors_seeds();
    gguf_seeds();
    tokenizer_gguf_seed();
    printf("seeds written under %s\n", root);
    return 0;
}
