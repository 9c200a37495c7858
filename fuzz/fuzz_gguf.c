/* libFuzzer target: a GGUF file (q3_gguf_open, then q3_model_open for qwen3 files).
 *
 * When the reader accepts a file, the harness re-reads the header with its own
 * small walker and compares:
 *   - version, tensor count and metadata count are the header's;
 *   - keys in file order, each found by q3_gguf_find, with its type; strings are
 *     NUL-terminated copies of the file's bytes; number arrays point at the file's
 *     bytes; the typed getters agree with the stored type and value;
 *   - tensors in file order: name, shape (reversed ne), ggml type -> dtype,
 *     nbytes = dtype block bytes x blocks; the data offset a multiple of the
 *     alignment (a power of two), the data section start aligned, every tensor's
 *     bytes inside the file and equal to the file's bytes at data_offset + offset,
 *     and no two tensors sharing a byte.
 * A file with tokenizer.* metadata also goes through q3_tokenizer_load_gguf and
 * q3_gguf_tokenizer_info_read: a tokenizer that loads has a token for every
 * byte and decodes its ids consistently, special ids are tokens or -1.
 * A file whose general.architecture is "qwen3" is also opened as a model (a file
 * named .gguf in the scratch folder); a model that opens passes fuzz_check_model. */
#include <math.h>

#include "fuzz_common.h"
#include "fuzz_model.h"
#include "fuzz_tokenizer.h"
#include "model/gguf.h"
#include "text/tokenizer_gguf.h"

/* ---- an independent walker over the accepted file --------------------------- */

typedef struct gw {
    const uint8_t *p;
    size_t size, pos;
    int bad; /* ran past the end: the reader should not have accepted this */
} gw;

static const uint8_t *gw_take(gw *w, uint64_t n)
{
    if (w->bad || n > w->size - w->pos) {
        w->bad = 1;
        return NULL;
    }
    const uint8_t *q = w->p + w->pos;
    w->pos += (size_t)n;
    return q;
}

static uint64_t gw_u64(gw *w)
{
    const uint8_t *q = gw_take(w, 8);
    return q ? fuzz_le64(q) : 0;
}

static uint32_t gw_u32(gw *w)
{
    const uint8_t *q = gw_take(w, 4);
    return q ? fuzz_le32(q) : 0;
}

static size_t gw_fixed(uint32_t type)
{
    static const size_t sizes[] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
    return type < sizeof sizes / sizeof sizes[0] ? sizes[type] : 0;
}

/* Compares value v (as the reader holds it) with the file's bytes at the walker. */
static void gw_value(gw *w, uint32_t type, const q3_gguf_value *v, int depth)
{
    FUZZ_CHECK((uint32_t)v->type == type, "value type %u, file says %u", (unsigned)v->type, type);
    FUZZ_CHECK(depth <= Q3_GGUF_MAX_ARRAY_DEPTH, "accepted arrays nested %d deep", depth);
    if (w->bad || (uint32_t)v->type != type) {
        w->bad = 1;
        return;
    }
    size_t fixed = gw_fixed(type);
    if (fixed) {
        const uint8_t *q = gw_take(w, fixed);
        if (!q) return;
        uint64_t raw = 0;
        for (size_t i = fixed; i-- > 0;) raw = raw << 8 | q[i];
        switch (type) {
        case Q3_GGUF_BOOL: FUZZ_CHECK(v->as.u == (q[0] != 0), "bool differs"); break;
        case Q3_GGUF_U8: case Q3_GGUF_U16: case Q3_GGUF_U32: case Q3_GGUF_U64:
            FUZZ_CHECK(v->as.u == raw, "unsigned value differs");
            break;
        case Q3_GGUF_I8: FUZZ_CHECK(v->as.i == (int8_t)raw, "i8 differs"); break;
        case Q3_GGUF_I16: FUZZ_CHECK(v->as.i == (int16_t)raw, "i16 differs"); break;
        case Q3_GGUF_I32: FUZZ_CHECK(v->as.i == (int32_t)raw, "i32 differs"); break;
        case Q3_GGUF_I64: FUZZ_CHECK(v->as.i == (int64_t)raw, "i64 differs"); break;
        case Q3_GGUF_F32: {
            float f;
            uint32_t u = (uint32_t)raw;
            memcpy(&f, &u, 4);
            FUZZ_CHECK(v->as.f == (double)f || (isnan(f) && isnan(v->as.f)), "f32 differs");
            break;
        }
        case Q3_GGUF_F64: {
            double d;
            memcpy(&d, &raw, 8);
            FUZZ_CHECK(v->as.f == d || (isnan(d) && isnan(v->as.f)), "f64 differs");
            break;
        }
        }
        return;
    }
    if (type == Q3_GGUF_STRING) {
        uint64_t len = gw_u64(w);
        const uint8_t *q = gw_take(w, len);
        if (!q) return;
        FUZZ_CHECK(v->as.str.len == len && v->as.str.s && v->as.str.s[len] == 0 && !memcmp(v->as.str.s, q, len),
                   "string differs from the file");
        return;
    }
    FUZZ_CHECK(type == Q3_GGUF_ARRAY, "accepted value type %u", type);
    if (type != Q3_GGUF_ARRAY) {
        w->bad = 1;
        return;
    }
    uint32_t et = gw_u32(w);
    uint64_t count = gw_u64(w);
    if (w->bad) return;
    FUZZ_CHECK((uint32_t)v->as.arr.type == et && v->as.arr.count == count, "array header differs");
    if ((uint32_t)v->as.arr.type != et || v->as.arr.count != count) {
        w->bad = 1;
        return;
    }
    size_t ef = gw_fixed(et);
    if (ef) {
        FUZZ_CHECK(count <= (w->size - w->pos) / ef, "accepted an array past the end");
        if (count > (w->size - w->pos) / ef) {
            w->bad = 1;
            return;
        }
        const uint8_t *q = gw_take(w, count * ef);
        FUZZ_CHECK(v->as.arr.raw != NULL && v->as.arr.items == NULL, "number array without raw elements");
        if (!v->as.arr.raw) return;
        FUZZ_CHECK(!memcmp(v->as.arr.raw, q, count * ef), "array elements differ from the file");
        for (size_t i = 0; i < count && i < 64; i++) {
            uint64_t u = q3_gguf_arr_u64(v, i);
            int64_t s = q3_gguf_arr_i64(v, i);
            double d = q3_gguf_arr_f64(v, i);
            if (et == Q3_GGUF_U8 || et == Q3_GGUF_U16 || et == Q3_GGUF_U32 || et == Q3_GGUF_U64 || et == Q3_GGUF_BOOL)
                FUZZ_CHECK(d == (double)u, "arr_f64 of an unsigned element differs");
            if (et == Q3_GGUF_I8 || et == Q3_GGUF_I16 || et == Q3_GGUF_I32 || et == Q3_GGUF_I64)
                FUZZ_CHECK(d == (double)s && u == (uint64_t)s, "signed element accessors disagree");
        }
        FUZZ_CHECK(q3_gguf_arr_str(v, 0, NULL) == NULL && q3_gguf_arr_arr(v, 0) == NULL,
                   "a number array answers as strings or arrays");
        return;
    }
    FUZZ_CHECK(count == 0 || v->as.arr.items != NULL, "array of %s without items", q3_gguf_type_name(et));
    if (count && !v->as.arr.items) {
        w->bad = 1;
        return;
    }
    for (size_t i = 0; i < count && !w->bad; i++) {
        gw_value(w, et, &v->as.arr.items[i], depth + 1);
        if (et == Q3_GGUF_STRING) {
            size_t len = 0;
            FUZZ_CHECK(q3_gguf_arr_str(v, i, &len) == v->as.arr.items[i].as.str.s &&
                           len == v->as.arr.items[i].as.str.len,
                       "arr_str differs");
        } else {
            FUZZ_CHECK(q3_gguf_arr_arr(v, i) == &v->as.arr.items[i], "arr_arr differs");
        }
    }
    FUZZ_CHECK(q3_gguf_arr_str(v, count, NULL) == NULL && q3_gguf_arr_arr(v, count) == NULL,
               "an index past the end answers");
}

/* The typed getters must agree with the stored value. */
static void gw_getters(const q3_gguf *g, const char *key, const q3_gguf_value *v)
{
    uint32_t u32;
    int32_t i32;
    uint64_t u64;
    float f;
    bool b;
    const char *s;
    const q3_gguf_value *a;
    int is_uint = v->type == Q3_GGUF_U8 || v->type == Q3_GGUF_U16 || v->type == Q3_GGUF_U32 || v->type == Q3_GGUF_U64;
    int is_sint = v->type == Q3_GGUF_I8 || v->type == Q3_GGUF_I16 || v->type == Q3_GGUF_I32 || v->type == Q3_GGUF_I64;
    if (q3_gguf_get_u32(g, key, &u32) == Q3_OK)
        FUZZ_CHECK((is_uint && v->as.u == u32) || (is_sint && v->as.i >= 0 && (uint64_t)v->as.i == u32),
                   "get_u32 of '%s' disagrees", key);
    if (q3_gguf_get_i32(g, key, &i32) == Q3_OK)
        FUZZ_CHECK((is_sint && v->as.i == i32) || (is_uint && v->as.u == (uint64_t)(int64_t)i32 && i32 >= 0),
                   "get_i32 of '%s' disagrees", key);
    if (q3_gguf_get_u64(g, key, &u64) == Q3_OK)
        FUZZ_CHECK((is_uint && v->as.u == u64) || (is_sint && v->as.i >= 0 && (uint64_t)v->as.i == u64),
                   "get_u64 of '%s' disagrees", key);
    if (q3_gguf_get_f32(g, key, &f) == Q3_OK)
        FUZZ_CHECK(v->type == Q3_GGUF_F32 || v->type == Q3_GGUF_F64, "get_f32 of '%s' on %s", key,
                   q3_gguf_type_name(v->type));
    if (q3_gguf_get_bool(g, key, &b) == Q3_OK)
        FUZZ_CHECK(v->type == Q3_GGUF_BOOL && b == (v->as.u != 0), "get_bool of '%s' disagrees", key);
    if (q3_gguf_get_str(g, key, &s) == Q3_OK)
        FUZZ_CHECK(v->type == Q3_GGUF_STRING && s == v->as.str.s, "get_str of '%s' disagrees", key);
    if (q3_gguf_get_arr(g, key, -1, &a) == Q3_OK)
        FUZZ_CHECK(v->type == Q3_GGUF_ARRAY && a == v, "get_arr of '%s' disagrees", key);
}

typedef struct gw_span {
    uint64_t begin, end;
} gw_span;

static int gw_cmp_span(const void *a, const void *b)
{
    const gw_span *x = a, *y = b;
    return x->begin < y->begin ? -1 : x->begin > y->begin;
}

static int gw_dtype(uint32_t ggml)
{
    switch (ggml) {
    case 0: return Q3_F32;
    case 1: return Q3_F16;
    case 30: return Q3_BF16;
    case 8: return Q3_Q8_0;
    case 2: return Q3_Q4_0;
    case 12: return Q3_Q4_K;
    case 13: return Q3_Q5_K;
    case 14: return Q3_Q6_K;
    default: return -1;
    }
}

static void gguf_check_accepted(const q3_gguf *g, const uint8_t *data, size_t size)
{
    gw w = {.p = data, .size = size};
    const uint8_t *magic = gw_take(&w, 4);
    uint32_t version = gw_u32(&w);
    uint64_t n_tensors = gw_u64(&w), n_kv = gw_u64(&w);
    FUZZ_CHECK(!w.bad && !memcmp(magic, "GGUF", 4), "accepted a file without the GGUF header");
    if (w.bad) return;
    FUZZ_CHECK(q3_gguf_version(g) == version && (version == 2 || version == 3), "version %u", version);
    FUZZ_CHECK(q3_gguf_tensor_count(g) == n_tensors, "%zu tensors, header says %llu", q3_gguf_tensor_count(g),
               (unsigned long long)n_tensors);
    FUZZ_CHECK(q3_gguf_kv_count(g) == n_kv, "%zu pairs, header says %llu", q3_gguf_kv_count(g),
               (unsigned long long)n_kv);
    if (q3_gguf_tensor_count(g) != n_tensors || q3_gguf_kv_count(g) != n_kv) return;

    uint64_t alignment = Q3_GGUF_DEFAULT_ALIGNMENT;
    for (size_t i = 0; i < n_kv && !w.bad; i++) {
        uint64_t klen = gw_u64(&w);
        const uint8_t *k = gw_take(&w, klen);
        if (!k) break;
        const char *key = q3_gguf_kv_key(g, i);
        FUZZ_CHECK(strlen(key) == klen && !memcmp(key, k, klen), "key %zu differs from the file", i);
        const q3_gguf_value *v = q3_gguf_kv_value(g, i);
        FUZZ_CHECK(q3_gguf_find(g, key) == v, "find('%s') is not pair %zu", key, i);
        uint32_t type = gw_u32(&w);
        gw_value(&w, type, v, 0);
        gw_getters(g, key, v);
        if (!strcmp(key, "general.alignment") && v->type == Q3_GGUF_U32) alignment = v->as.u;
    }
    FUZZ_CHECK(!w.bad, "accepted metadata that runs past the end of the file");
    if (w.bad) return;
    FUZZ_CHECK(alignment && !(alignment & (alignment - 1)) && q3_gguf_alignment(g) == alignment,
               "alignment %zu (file: %llu)", q3_gguf_alignment(g), (unsigned long long)alignment);

    uint64_t *offsets = calloc(n_tensors + 1, sizeof *offsets);
    for (size_t i = 0; i < n_tensors && !w.bad; i++) {
        const q3_tensor *t = q3_gguf_tensor_at(g, i);
        uint64_t nlen = gw_u64(&w);
        const uint8_t *name = gw_take(&w, nlen);
        if (!name) break;
        FUZZ_CHECK(nlen < sizeof t->name && strlen(t->name) == nlen && !memcmp(t->name, name, nlen),
                   "tensor %zu: name differs", i);
        FUZZ_CHECK(q3_gguf_find_tensor(g, t->name) == t, "find_tensor('%s') is another", t->name);
        uint32_t nd = gw_u32(&w);
        FUZZ_CHECK(nd >= 1 && nd <= Q3_MAX_DIMS && t->ndim == (int)nd, "tensor %zu: %u dims", i, nd);
        if (w.bad || t->ndim != (int)nd || nd > Q3_MAX_DIMS) {
            w.bad = 1;
            break;
        }
        uint64_t numel = 1;
        for (uint32_t d = 0; d < nd; d++) {
            uint64_t ne = gw_u64(&w);
            FUZZ_CHECK(ne > 0 && (uint64_t)t->shape[nd - 1 - d] == ne, "tensor '%s': ne[%u] differs", t->name, d);
            FUZZ_CHECK(ne == 0 || numel <= UINT64_MAX / ne, "tensor '%s': element count overflows", t->name);
            numel *= ne;
        }
        int dt = gw_dtype(gw_u32(&w));
        FUZZ_CHECK(dt >= 0 && (int)t->dtype == dt, "tensor '%s': dtype differs", t->name);
        if (dt < 0) {
            w.bad = 1;
            break;
        }
        size_t bv = q3_dtype_block_values(t->dtype), bb = q3_dtype_block_bytes(t->dtype);
        FUZZ_CHECK((uint64_t)t->shape[nd - 1] % bv == 0, "tensor '%s': rows are not whole blocks", t->name);
        FUZZ_CHECK(numel / bv <= SIZE_MAX / bb && t->nbytes == numel / bv * bb, "tensor '%s': nbytes %zu",
                   t->name, t->nbytes);
        FUZZ_CHECK(numel == q3_tensor_numel(t), "tensor '%s': numel differs", t->name);
        offsets[i] = gw_u64(&w);
    }
    FUZZ_CHECK(!w.bad, "accepted tensor infos that run past the end of the file");
    if (w.bad) {
        free(offsets);
        return;
    }
    size_t data_offset = (w.pos + alignment - 1) / alignment * alignment;
    FUZZ_CHECK(q3_gguf_data_offset(g) == data_offset && data_offset % alignment == 0, "data offset %zu, expected %zu",
               q3_gguf_data_offset(g), data_offset);

    gw_span *spans = calloc(n_tensors + 1, sizeof *spans);
    size_t n_spans = 0;
    const uint8_t *base = NULL; /* mapping + data_offset, the same for every tensor */
    for (size_t i = 0; i < n_tensors; i++) {
        const q3_tensor *t = q3_gguf_tensor_at(g, i);
        uint64_t off = offsets[i];
        FUZZ_CHECK(off % alignment == 0, "tensor '%s': offset %llu not aligned", t->name, (unsigned long long)off);
        int inside = data_offset <= size && off <= size - data_offset && t->nbytes <= size - data_offset - off;
        FUZZ_CHECK(inside, "tensor '%s': [%llu, +%zu) outside the file", t->name, (unsigned long long)off, t->nbytes);
        if (!inside) continue;
        const uint8_t *b = (const uint8_t *)t->data - off;
        FUZZ_CHECK(!base || b == base, "tensor '%s': data pointer is not data section + offset", t->name);
        base = b;
        FUZZ_CHECK(((uintptr_t)t->data - (uintptr_t)base) % alignment == 0, "tensor '%s': data not aligned", t->name);
        FUZZ_CHECK(!memcmp(t->data, data + data_offset + off, t->nbytes), "tensor '%s': bytes differ from the file",
                   t->name);
        spans[n_spans++] = (gw_span){off, off + t->nbytes};
    }
    qsort(spans, n_spans, sizeof *spans, gw_cmp_span);
    for (size_t i = 1; i < n_spans; i++)
        FUZZ_CHECK(spans[i].begin >= spans[i - 1].end, "accepted overlapping tensors");
    free(spans);
    free(offsets);
}

/* The tokenizer in the metadata, if any. */
static void gguf_check_tokenizer(const q3_gguf *g)
{
    q3_gguf_tokenizer_info info;
    q3_status st = q3_gguf_tokenizer_info_read(g, &info);
    const q3_gguf_value *tokens = q3_gguf_find(g, "tokenizer.ggml.tokens");
    size_t n_tokens = tokens && tokens->type == Q3_GGUF_ARRAY ? tokens->as.arr.count : 0;
    if (st == Q3_OK) {
        const int32_t ids[4] = {info.bos_id, info.eos_id, info.pad_id, info.eot_id};
        for (int i = 0; i < 4; i++)
            FUZZ_CHECK(ids[i] == -1 || (ids[i] >= 0 && (size_t)ids[i] < n_tokens), "special id %d of %zu tokens",
                       (int)ids[i], n_tokens);
        if (info.chat_template) (void)strlen(info.chat_template);
    } else {
        FUZZ_CHECK_FAILURE(st);
    }
    if (!q3_gguf_find(g, "tokenizer.ggml.model")) return;
    q3_tokenizer *tok = NULL;
    st = q3_tokenizer_load_gguf(g, &tok);
    fuzz_note("q3_tokenizer_load_gguf", st);
    if (st != Q3_OK) {
        FUZZ_CHECK_FAILURE(st);
        FUZZ_CHECK(tok == NULL, "a failed load returned a tokenizer");
        return;
    }
    int32_t n = q3_tokenizer_vocab_size(tok);
    FUZZ_CHECK(n >= 256 && (size_t)n <= n_tokens, "vocabulary of %d ids from %zu tokens", (int)n, n_tokens);
    for (int b = 0; b < 256; b++) {
        char c = (char)b;
        FUZZ_CHECK(q3_tokenizer_token_id(tok, &c, 1) >= 0, "no token for byte 0x%02x", b);
    }
    int32_t *ids = malloc(sizeof *ids * (size_t)(n > 0 ? n : 1));
    size_t k = 0, len = 0;
    for (int32_t id = 0; id < n; id++) ids[k++] = id;
    free(fuzz_check_decode(tok, ids, k, &len));
    free(ids);
    static const char text[] = "<|im_start|>user\nhello the world 12 \xc3\xa9<|im_end|>";
    q3_tokens t = {0};
    st = q3_tokenizer_encode_append(tok, text, sizeof text - 1, 0, &t);
    if (st == Q3_OK) {
        free(fuzz_check_decode(tok, t.ids, t.n, &len));
    } else {
        FUZZ_CHECK_FAILURE(st);
    }
    q3_tokens_free(&t);
    q3_tokenizer_free(tok);
}

static int fuzz_gguf(const uint8_t *data, size_t size)
{
    const char *file = fuzz_path("gguf", "m.gguf");
    fuzz_write(file, data, size);
    q3_gguf *g = NULL;
    q3_status st = q3_gguf_open(file, &g);
    fuzz_note("q3_gguf_open", st);
    if (st != Q3_OK) {
        FUZZ_CHECK_FAILURE(st);
        FUZZ_CHECK(g == NULL, "a failed open returned a handle");
        return 0;
    }
    gguf_check_accepted(g, data, size);
    gguf_check_tokenizer(g);
    const char *arch = NULL;
    int qwen3 = q3_gguf_get_str(g, "general.architecture", &arch) == Q3_OK && !strcmp(arch, "qwen3");
    q3_gguf_close(g);
    if (!qwen3) return 0;

    q3_model *m = NULL;
    st = q3_model_open(file, &m);
    fuzz_note("q3_model_open", st);
    if (st != Q3_OK) {
        FUZZ_CHECK_FAILURE(st);
        return 0;
    }
    fuzz_check_model(m);
    q3_model_close(m);
    return 0;
}

#ifndef FUZZ_NO_MAIN
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) { return fuzz_gguf(data, size); }
#endif
