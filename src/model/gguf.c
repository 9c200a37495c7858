/* GGUF reader: maps a file and validates it field by field (see gguf.h).
 *
 * Every read goes through a cursor that knows how many bytes remain, so no
 * field is ever read past the end of the mapping. Counts and lengths are
 * checked against the remaining bytes before anything is allocated: an array
 * of n strings needs at least 8n bytes of file, so its index can never be
 * larger than a small multiple of the file itself.
 *
 * Error messages are built inside out: a helper says what is wrong ("string
 * length 4611686018427387904 exceeds the 12 bytes left"), its caller prefixes
 * where ("metadata pair 3 'general.name'"), and q3_gguf_open prefixes the path. */
#include "model/gguf.h"

#include <assert.h>
#include <float.h>
#include <inttypes.h>
#include <math.h>
#include <stdalign.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/error.h"
#include "util/file.h"

/* ==== type tables ========================================================== */

static const char *const value_type_names[Q3_GGUF_TYPE_COUNT] = {
    [Q3_GGUF_U8] = "u8",     [Q3_GGUF_I8] = "i8",         [Q3_GGUF_U16] = "u16",
    [Q3_GGUF_I16] = "i16",   [Q3_GGUF_U32] = "u32",       [Q3_GGUF_I32] = "i32",
    [Q3_GGUF_F32] = "f32",   [Q3_GGUF_BOOL] = "bool",     [Q3_GGUF_STRING] = "string",
    [Q3_GGUF_ARRAY] = "array", [Q3_GGUF_U64] = "u64",     [Q3_GGUF_I64] = "i64",
    [Q3_GGUF_F64] = "f64",
};

const char *q3_gguf_type_name(q3_gguf_type t)
{
    return (unsigned)t < Q3_GGUF_TYPE_COUNT ? value_type_names[t] : "?";
}

/* Bytes of a fixed-size value type; 0 for string and array. */
static size_t value_type_size(q3_gguf_type t)
{
    switch (t) {
    case Q3_GGUF_U8: case Q3_GGUF_I8: case Q3_GGUF_BOOL: return 1;
    case Q3_GGUF_U16: case Q3_GGUF_I16: return 2;
    case Q3_GGUF_U32: case Q3_GGUF_I32: case Q3_GGUF_F32: return 4;
    case Q3_GGUF_U64: case Q3_GGUF_I64: case Q3_GGUF_F64: return 8;
    default: return 0;
    }
}

/* Names of the ggml tensor types, for messages; gaps are codes ggml retired. */
static const char *const ggml_type_names[] = {
    [0] = "F32",      [1] = "F16",      [2] = "Q4_0",     [3] = "Q4_1",    [6] = "Q5_0",
    [7] = "Q5_1",     [8] = "Q8_0",     [9] = "Q8_1",     [10] = "Q2_K",   [11] = "Q3_K",
    [12] = "Q4_K",    [13] = "Q5_K",    [14] = "Q6_K",    [15] = "Q8_K",   [16] = "IQ2_XXS",
    [17] = "IQ2_XS",  [18] = "IQ3_XXS", [19] = "IQ1_S",   [20] = "IQ4_NL", [21] = "IQ3_S",
    [22] = "IQ2_S",   [23] = "IQ4_XS",  [24] = "I8",      [25] = "I16",    [26] = "I32",
    [27] = "I64",     [28] = "F64",     [29] = "IQ1_M",   [30] = "BF16",   [34] = "TQ1_0",
    [35] = "TQ2_0",   [39] = "MXFP4",
};

const char *q3_ggml_type_name(uint32_t ggml_type)
{
    if (ggml_type >= sizeof ggml_type_names / sizeof ggml_type_names[0]) return NULL;
    return ggml_type_names[ggml_type];
}

/* The q3 dtype of a ggml type (the traits row that names it), or -1 if q3
 * has no kernels for it. */
static int dtype_from_ggml(uint32_t ggml_type)
{
    for (int t = 0; t < Q3_DTYPE_COUNT; t++)
        if (q3_traits((q3_dtype)t)->ggml_type == ggml_type) return t;
    return -1;
}

uint32_t q3_ggml_type_from_dtype(q3_dtype t)
{
    if ((unsigned)t < Q3_DTYPE_COUNT) return q3_traits(t)->ggml_type;
    assert(!"dtype without a ggml type");
    return UINT32_MAX;
}

/* ==== little-endian decoding ================================================= */

static uint16_t load_le16(const uint8_t *p) { return (uint16_t)(p[0] | p[1] << 8); }

static uint32_t load_le32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t load_le64(const uint8_t *p)
{
    return (uint64_t)load_le32(p) | (uint64_t)load_le32(p + 4) << 32;
}

/* ==== arena: owns every string and item array of the metadata =============== */

typedef struct arena_chunk {
    struct arena_chunk *next;
    size_t used, cap;
    alignas(max_align_t) unsigned char mem[];
} arena_chunk;

enum { ARENA_CHUNK = 1 << 16 };

/* Returns n bytes aligned for any value, or NULL when out of memory. Large
 * requests get a chunk of their own so that little space is wasted. */
static void *arena_alloc(arena_chunk **arena, size_t n)
{
    n = (n + alignof(max_align_t) - 1) & ~(alignof(max_align_t) - 1);
    arena_chunk *c = *arena;
    if (!c || c->cap - c->used < n) {
        size_t cap = n > ARENA_CHUNK / 4 ? n : ARENA_CHUNK;
        if (cap > SIZE_MAX - sizeof *c) return NULL;
        c = malloc(sizeof *c + cap);
        if (!c) return NULL;
        c->used = 0;
        c->cap = cap;
        if (cap == n && *arena) { /* keep filling the current small chunk */
            c->next = (*arena)->next;
            (*arena)->next = c;
        } else {
            c->next = *arena;
            *arena = c;
        }
    }
    void *p = c->mem + c->used;
    c->used += n;
    return p;
}

static void arena_free(arena_chunk *c)
{
    while (c) {
        arena_chunk *next = c->next;
        free(c);
        c = next;
    }
}

/* ==== name index: open addressing over keys or tensor names =================== */

typedef struct name_index {
    size_t *slots; /* [mask+1] entry index + 1; 0 = empty */
    size_t mask;
} name_index;

static uint64_t hash_name(const char *s, size_t len)
{
    uint64_t h = 0xcbf29ce484222325u; /* FNV-1a */
    for (size_t i = 0; i < len; i++) h = (h ^ (unsigned char)s[i]) * 0x100000001b3u;
    return h;
}

/* Room for n names at load factor <= 1/2. n is bounded by the file size. */
static q3_status index_init(name_index *ix, size_t n)
{
    size_t cap = 8;
    while (cap < 2 * n) cap *= 2;
    ix->slots = calloc(cap, sizeof *ix->slots);
    ix->mask = cap - 1;
    return ix->slots ? Q3_OK : q3_fail(Q3_ERR_NOMEM, "out of memory for a %zu-entry index", n);
}

/* Finds name; returns its entry index, or SIZE_MAX with *slot set to the empty
 * slot where it would go. name_of(ctx, i) gives entry i's name. */
static size_t index_lookup(const name_index *ix, const char *name, size_t len,
                           const char *(*name_of)(const void *, size_t), const void *ctx,
                           size_t *slot)
{
    size_t s = (size_t)hash_name(name, len) & ix->mask;
    for (;; s = (s + 1) & ix->mask) {
        size_t e = ix->slots[s];
        if (e == 0) break;
        const char *other = name_of(ctx, e - 1);
        if (strlen(other) == len && memcmp(other, name, len) == 0) return e - 1;
    }
    if (slot) *slot = s;
    return SIZE_MAX;
}

/* ==== the file object ========================================================= */

typedef struct gguf_kv {
    const char *key;    /* NUL-terminated, in the arena */
    q3_gguf_value value;
} gguf_kv;

struct q3_gguf {
    char *path;               /* owned copy, for messages */
    q3_mapping map;           /* the whole file, read-only */
    uint32_t version;
    size_t alignment;         /* general.alignment or the default */
    size_t data_offset;       /* start of the data section in the file */
    gguf_kv *kvs;             /* [n_kv] in file order */
    size_t n_kv;
    name_index kv_index;
    q3_tensor *tensors;       /* [n_tensors] in file order */
    uint64_t *tensor_offsets; /* [n_tensors] offsets within the data section */
    size_t n_tensors;
    name_index tensor_index;
    arena_chunk *arena;
};

static const char *kv_name(const void *g, size_t i) { return ((const q3_gguf *)g)->kvs[i].key; }
static const char *tensor_name(const void *g, size_t i) { return ((const q3_gguf *)g)->tensors[i].name; }

/* ==== cursor: bounded reads ==================================================== */

typedef struct cursor {
    const uint8_t *base;
    size_t size, pos;
    arena_chunk **arena;
    size_t meta_left; /* of Q3_GGUF_MAX_METADATA_BYTES, for arena copies */
} cursor;

static size_t remaining(const cursor *c) { return c->size - c->pos; }

/* Charges an arena copy of n bytes (rounded as arena_alloc rounds it) to the
 * metadata budget; 0 if it fits, -1 (nothing charged) if it does not. Callers
 * check n against the file first, so the rounding cannot overflow. */
static int charge_metadata(cursor *c, size_t n)
{
    size_t cost = (n + alignof(max_align_t) - 1) & ~(alignof(max_align_t) - 1);
    if (cost < n || cost > c->meta_left) return -1;
    c->meta_left -= cost;
    return 0;
}

/* Returns a pointer to the next n bytes and advances, or NULL with a message
 * naming what was being read. */
static const uint8_t *take(cursor *c, size_t n, const char *what)
{
    if (n > remaining(c)) {
        q3_fail(Q3_ERR_FORMAT, "truncated: %s at byte %zu needs %zu bytes, only %zu left",
                what, c->pos, n, remaining(c));
        return NULL;
    }
    const uint8_t *p = c->base + c->pos;
    c->pos += n;
    return p;
}

static q3_status read_u32(cursor *c, uint32_t *out, const char *what)
{
    const uint8_t *p = take(c, 4, what);
    if (!p) return Q3_ERR_FORMAT;
    *out = load_le32(p);
    return Q3_OK;
}

static q3_status read_u64(cursor *c, uint64_t *out, const char *what)
{
    const uint8_t *p = take(c, 8, what);
    if (!p) return Q3_ERR_FORMAT;
    *out = load_le64(p);
    return Q3_OK;
}

/* Reads a GGUF string (u64 length + bytes) of at most max_len bytes into a
 * NUL-terminated arena copy. what names the string in messages ("key"). */
static q3_status read_string(cursor *c, size_t max_len, const char *what, const char **out,
                             size_t *len_out)
{
    char what_len[64];
    snprintf(what_len, sizeof what_len, "%s length", what);
    uint64_t len;
    if (read_u64(c, &len, what_len)) return Q3_ERR_FORMAT;
    if (len > remaining(c))
        return q3_fail(Q3_ERR_FORMAT, "%s %" PRIu64 " at byte %zu exceeds the %zu bytes left", what_len,
                       len, c->pos - 8, remaining(c));
    if (len > max_len)
        return q3_fail(Q3_ERR_FORMAT, "%s %" PRIu64 " at byte %zu exceeds the limit of %zu bytes", what_len,
                       len, c->pos - 8, max_len);
    if (charge_metadata(c, (size_t)len + 1))
        return q3_fail(Q3_ERR_FORMAT, "%s %" PRIu64 " at byte %zu: the metadata would take more than the %zu bytes q3 allows",
                       what_len, len, c->pos - 8, (size_t)Q3_GGUF_MAX_METADATA_BYTES);
    char *s = arena_alloc(c->arena, (size_t)len + 1);
    if (!s) return q3_fail(Q3_ERR_NOMEM, "out of memory for a %" PRIu64 "-byte %s", len, what);
    memcpy(s, take(c, (size_t)len, what), (size_t)len);
    s[len] = 0;
    *out = s;
    if (len_out) *len_out = (size_t)len;
    return Q3_OK;
}

/* ==== metadata values =========================================================== */

/* Parses a value of the given type at the cursor into v. depth counts the
 * arrays around it, limited so that nesting cannot exhaust the stack. */
static q3_status parse_value(cursor *c, q3_gguf_type type, q3_gguf_value *v, int depth)
{
    v->type = type;
    size_t fixed = value_type_size(type);
    if (fixed) {
        const uint8_t *p = take(c, fixed, q3_gguf_type_name(type));
        if (!p) return Q3_ERR_FORMAT;
        switch (type) {
        case Q3_GGUF_U8: v->as.u = p[0]; break;
        case Q3_GGUF_BOOL: v->as.u = p[0] != 0; break;
        case Q3_GGUF_I8: v->as.i = (int8_t)p[0]; break;
        case Q3_GGUF_U16: v->as.u = load_le16(p); break;
        case Q3_GGUF_I16: v->as.i = (int16_t)load_le16(p); break;
        case Q3_GGUF_U32: v->as.u = load_le32(p); break;
        case Q3_GGUF_I32: v->as.i = (int32_t)load_le32(p); break;
        case Q3_GGUF_U64: v->as.u = load_le64(p); break;
        case Q3_GGUF_I64: v->as.i = (int64_t)load_le64(p); break;
        case Q3_GGUF_F32: {
            uint32_t u = load_le32(p);
            float f;
            memcpy(&f, &u, 4);
            v->as.f = f;
            break;
        }
        case Q3_GGUF_F64: {
            uint64_t u = load_le64(p);
            memcpy(&v->as.f, &u, 8);
            break;
        }
        default: break;
        }
        return Q3_OK;
    }
    if (type == Q3_GGUF_STRING)
        return read_string(c, SIZE_MAX, "string", &v->as.str.s, &v->as.str.len);
    if (type != Q3_GGUF_ARRAY) return q3_fail(Q3_ERR_FORMAT, "unknown value type %u", (unsigned)type);

    /* An array: u32 element type, u64 count, elements. */
    if (depth >= Q3_GGUF_MAX_ARRAY_DEPTH)
        return q3_fail(Q3_ERR_FORMAT, "arrays nested more than %d deep", Q3_GGUF_MAX_ARRAY_DEPTH);
    uint32_t elem;
    uint64_t count;
    if (read_u32(c, &elem, "array element type") || read_u64(c, &count, "array length"))
        return Q3_ERR_FORMAT;
    if (elem >= Q3_GGUF_TYPE_COUNT)
        return q3_fail(Q3_ERR_FORMAT, "array at byte %zu has unknown element type %" PRIu32,
                       c->pos - 12, elem);
    v->as.arr.type = (q3_gguf_type)elem;
    v->as.arr.raw = NULL;
    v->as.arr.items = NULL;
    /* Smallest encoding of one element: its fixed size, 8 for a string's
     * length, 12 for an array's type and count. */
    size_t elem_min = value_type_size((q3_gguf_type)elem);
    if (!elem_min) elem_min = elem == Q3_GGUF_STRING ? 8 : 12;
    if (count > remaining(c) / elem_min)
        return q3_fail(Q3_ERR_FORMAT,
                       "array of %" PRIu64 " %s at byte %zu cannot fit in the %zu bytes left",
                       count, q3_gguf_type_name((q3_gguf_type)elem), c->pos - 12, remaining(c));
    v->as.arr.count = (size_t)count;
    if (value_type_size((q3_gguf_type)elem)) {
        v->as.arr.raw = take(c, (size_t)count * elem_min, "array elements");
        return Q3_OK;
    }
    /* count * sizeof(value) cannot overflow: count <= file size / 8. */
    if (charge_metadata(c, (size_t)count * sizeof(q3_gguf_value)))
        return q3_fail(Q3_ERR_FORMAT,
                       "array of %" PRIu64 " %s at byte %zu: the metadata would take more than the %zu bytes q3 allows",
                       count, q3_gguf_type_name((q3_gguf_type)elem), c->pos - 12,
                       (size_t)Q3_GGUF_MAX_METADATA_BYTES);
    q3_gguf_value *items = arena_alloc(c->arena, (size_t)count * sizeof *items);
    if (!items && count)
        return q3_fail(Q3_ERR_NOMEM, "out of memory for an array of %" PRIu64 " values", count);
    for (size_t i = 0; i < (size_t)count; i++) {
        q3_status st = parse_value(c, (q3_gguf_type)elem, &items[i], depth + 1);
        if (st) /* name the element at the outer level only: deep paths add noise */
            return depth == 0 ? q3_fail_wrap(st, "array element %zu", i) : st;
    }
    v->as.arr.items = items;
    return Q3_OK;
}

/* ==== array element access ========================================================= */

static const uint8_t *arr_elem(const q3_gguf_value *arr, size_t i)
{
    assert(arr->type == Q3_GGUF_ARRAY && arr->as.arr.raw && i < arr->as.arr.count);
    return (const uint8_t *)arr->as.arr.raw + i * value_type_size(arr->as.arr.type);
}

uint64_t q3_gguf_arr_u64(const q3_gguf_value *arr, size_t i)
{
    const uint8_t *p = arr_elem(arr, i);
    switch (arr->as.arr.type) {
    case Q3_GGUF_U8: case Q3_GGUF_BOOL: return p[0];
    case Q3_GGUF_U16: return load_le16(p);
    case Q3_GGUF_U32: return load_le32(p);
    case Q3_GGUF_U64: return load_le64(p);
    default: return (uint64_t)q3_gguf_arr_i64(arr, i);
    }
}

int64_t q3_gguf_arr_i64(const q3_gguf_value *arr, size_t i)
{
    const uint8_t *p = arr_elem(arr, i);
    switch (arr->as.arr.type) {
    case Q3_GGUF_I8: return (int8_t)p[0];
    case Q3_GGUF_I16: return (int16_t)load_le16(p);
    case Q3_GGUF_I32: return (int32_t)load_le32(p);
    case Q3_GGUF_I64: return (int64_t)load_le64(p);
    case Q3_GGUF_F32: case Q3_GGUF_F64: {
        double d = q3_gguf_arr_f64(arr, i);
        return d >= -0x1p63 && d < 0x1p63 ? (int64_t)d : 0; /* out of range: 0, not UB */
    }
    default: return (int64_t)q3_gguf_arr_u64(arr, i);
    }
}

double q3_gguf_arr_f64(const q3_gguf_value *arr, size_t i)
{
    const uint8_t *p = arr_elem(arr, i);
    switch (arr->as.arr.type) {
    case Q3_GGUF_F32: {
        uint32_t u = load_le32(p);
        float f;
        memcpy(&f, &u, 4);
        return f;
    }
    case Q3_GGUF_F64: {
        uint64_t u = load_le64(p);
        double d;
        memcpy(&d, &u, 8);
        return d;
    }
    case Q3_GGUF_I8: case Q3_GGUF_I16: case Q3_GGUF_I32: case Q3_GGUF_I64:
        return (double)q3_gguf_arr_i64(arr, i);
    default:
        return (double)q3_gguf_arr_u64(arr, i);
    }
}

const char *q3_gguf_arr_str(const q3_gguf_value *arr, size_t i, size_t *len)
{
    if (!arr || arr->type != Q3_GGUF_ARRAY || arr->as.arr.type != Q3_GGUF_STRING ||
        i >= arr->as.arr.count)
        return NULL;
    const q3_gguf_value *v = &arr->as.arr.items[i];
    if (len) *len = v->as.str.len;
    return v->as.str.s;
}

const q3_gguf_value *q3_gguf_arr_arr(const q3_gguf_value *arr, size_t i)
{
    if (!arr || arr->type != Q3_GGUF_ARRAY || arr->as.arr.type != Q3_GGUF_ARRAY ||
        i >= arr->as.arr.count)
        return NULL;
    return &arr->as.arr.items[i];
}

/* ==== header sections ============================================================== */

/* Reads the n_kv metadata pairs into g->kvs, rejecting duplicate keys. */
static q3_status parse_metadata(cursor *c, q3_gguf *g)
{
    for (size_t i = 0; i < g->n_kv; i++) {
        gguf_kv *kv = &g->kvs[i];
        size_t key_len;
        q3_status st = read_string(c, Q3_GGUF_MAX_KEY_LEN, "key", &kv->key, &key_len);
        if (st) return q3_fail_wrap(st, "metadata pair %zu of %zu", i, g->n_kv);
        if (key_len == 0 || memchr(kv->key, 0, key_len))
            return q3_fail(Q3_ERR_FORMAT, "metadata pair %zu of %zu: key is empty or holds a NUL byte",
                           i, g->n_kv);
        size_t slot;
        size_t prev = index_lookup(&g->kv_index, kv->key, key_len, kv_name, g, &slot);
        if (prev != SIZE_MAX)
            return q3_fail(Q3_ERR_FORMAT, "metadata key '%.200s' appears twice (pairs %zu and %zu)",
                           kv->key, prev, i);
        uint32_t type;
        if (read_u32(c, &type, "value type"))
            return q3_fail_wrap(Q3_ERR_FORMAT, "metadata key '%.200s'", kv->key);
        if (type >= Q3_GGUF_TYPE_COUNT)
            return q3_fail(Q3_ERR_FORMAT, "metadata key '%.200s': unknown value type %" PRIu32 " at byte %zu",
                           kv->key, type, c->pos - 4);
        st = parse_value(c, (q3_gguf_type)type, &kv->value, 0);
        if (st) return q3_fail_wrap(st, "metadata key '%.200s' (%s)", kv->key,
                                    q3_gguf_type_name((q3_gguf_type)type));
        g->kv_index.slots[slot] = i + 1; /* only now: kv_name(i) must stay valid for lookups */
    }
    return Q3_OK;
}

/* Reads one tensor info: name, dims (converted to row-major), type, offset.
 * Checks dims, sizes and block alignment of rows; not yet the data bounds. */
static q3_status parse_tensor_info(cursor *c, q3_gguf *g, size_t i)
{
    q3_tensor *t = &g->tensors[i];
    const char *name;
    size_t name_len;
    q3_status st = read_string(c, sizeof t->name - 1, "name", &name, &name_len);
    if (st) return st;
    if (memchr(name, 0, name_len)) return q3_fail(Q3_ERR_FORMAT, "name holds a NUL byte");
    memcpy(t->name, name, name_len + 1);

    uint32_t n_dims;
    if (read_u32(c, &n_dims, "n_dims")) return Q3_ERR_FORMAT;
    if (n_dims < 1 || n_dims > Q3_MAX_DIMS)
        return q3_fail(Q3_ERR_FORMAT, "'%s': %" PRIu32 " dimensions (1 to %d allowed)", t->name,
                       n_dims, Q3_MAX_DIMS);
    t->ndim = (int)n_dims;
    uint64_t ne[Q3_MAX_DIMS];
    size_t numel = 1;
    for (uint32_t d = 0; d < n_dims; d++) {
        if (read_u64(c, &ne[d], "dimension")) return Q3_ERR_FORMAT;
        if (ne[d] == 0 || ne[d] > INT64_MAX)
            return q3_fail(Q3_ERR_FORMAT, "'%s': dimension ne[%" PRIu32 "] = %" PRIu64 " is not positive",
                           t->name, d, ne[d]);
        if (ne[d] > SIZE_MAX / numel)
            return q3_fail(Q3_ERR_FORMAT, "'%s': element count overflows (ne[%" PRIu32 "] = %" PRIu64 ")",
                           t->name, d, ne[d]);
        numel *= (size_t)ne[d];
        t->shape[n_dims - 1 - d] = (int64_t)ne[d]; /* ne[0] is innermost */
    }

    uint32_t ggml_type;
    if (read_u32(c, &ggml_type, "type")) return Q3_ERR_FORMAT;
    int dt = dtype_from_ggml(ggml_type);
    if (dt < 0) {
        const char *tn = q3_ggml_type_name(ggml_type);
        if (!tn) return q3_fail(Q3_ERR_FORMAT, "'%s': unknown ggml type %" PRIu32, t->name, ggml_type);
        return q3_fail(Q3_ERR_UNSUPPORTED,
                       "'%s': ggml type %s (%" PRIu32 ") is not supported "
                       "(q3 runs F32, F16, BF16, Q8_0, Q4_0, Q4_K, Q5_K, Q6_K)",
                       t->name, tn, ggml_type);
    }
    t->dtype = (q3_dtype)dt;
    size_t block = q3_dtype_block_values(t->dtype), block_bytes = q3_dtype_block_bytes(t->dtype);
    if (ne[0] % block)
        return q3_fail(Q3_ERR_FORMAT, "'%s': row length %" PRIu64 " is not a multiple of the %s block size %zu",
                       t->name, ne[0], q3_dtype_name(t->dtype), block);
    if (numel / block > SIZE_MAX / block_bytes)
        return q3_fail(Q3_ERR_FORMAT, "'%s': byte size overflows", t->name);
    t->nbytes = numel / block * block_bytes;

    if (read_u64(c, &g->tensor_offsets[i], "offset")) return Q3_ERR_FORMAT;
    return Q3_OK;
}

/* Reads every tensor info, rejecting duplicate names. */
static q3_status parse_tensor_infos(cursor *c, q3_gguf *g)
{
    for (size_t i = 0; i < g->n_tensors; i++) {
        q3_status st = parse_tensor_info(c, g, i);
        if (st) return q3_fail_wrap(st, "tensor %zu of %zu", i, g->n_tensors);
        size_t slot;
        const char *name = g->tensors[i].name;
        size_t prev = index_lookup(&g->tensor_index, name, strlen(name), tensor_name, g, &slot);
        if (prev != SIZE_MAX)
            return q3_fail(Q3_ERR_FORMAT, "tensor name '%s' appears twice (tensors %zu and %zu)", name,
                           prev, i);
        g->tensor_index.slots[slot] = i + 1;
    }
    return Q3_OK;
}

/* Reads general.alignment if present: a u32 power of two. */
static q3_status read_alignment(q3_gguf *g)
{
    g->alignment = Q3_GGUF_DEFAULT_ALIGNMENT;
    const q3_gguf_value *v = q3_gguf_find(g, "general.alignment");
    if (!v) return Q3_OK;
    if (v->type != Q3_GGUF_U32)
        return q3_fail(Q3_ERR_FORMAT, "general.alignment is %s, not u32", q3_gguf_type_name(v->type));
    if (v->as.u == 0 || (v->as.u & (v->as.u - 1)))
        return q3_fail(Q3_ERR_FORMAT, "general.alignment %" PRIu64 " is not a power of two", v->as.u);
    g->alignment = (size_t)v->as.u;
    return Q3_OK;
}

typedef struct tensor_span {
    uint64_t begin, end;
    size_t idx;
} tensor_span;

static int cmp_span(const void *a, const void *b)
{
    const tensor_span *x = a, *y = b;
    return x->begin < y->begin ? -1 : x->begin > y->begin;
}

/* Places every tensor in the data section: offset aligned, bytes inside the
 * file, no two tensors overlapping. Sets each q3_tensor's data pointer. */
static q3_status place_tensors(q3_gguf *g)
{
    size_t data_size = g->data_offset <= g->map.size ? g->map.size - g->data_offset : 0;
    tensor_span *spans = malloc((g->n_tensors ? g->n_tensors : 1) * sizeof *spans);
    if (!spans) return q3_fail(Q3_ERR_NOMEM, "out of memory for %zu tensor spans", g->n_tensors);
    q3_status st = Q3_OK;
    for (size_t i = 0; i < g->n_tensors && !st; i++) {
        q3_tensor *t = &g->tensors[i];
        uint64_t off = g->tensor_offsets[i];
        if (off % g->alignment)
            st = q3_fail(Q3_ERR_FORMAT, "tensor '%s': offset %" PRIu64 " is not a multiple of the alignment %zu",
                         t->name, off, g->alignment);
        else if (off > data_size || t->nbytes > data_size - off)
            st = q3_fail(Q3_ERR_FORMAT,
                         "tensor '%s': data [%" PRIu64 ", +%zu) lies outside the %zu-byte data section "
                         "(file truncated?)", t->name, off, t->nbytes, data_size);
        else {
            t->data = (const uint8_t *)g->map.data + g->data_offset + off;
            spans[i] = (tensor_span){off, off + t->nbytes, i};
        }
    }
    if (!st && g->n_tensors > 1) {
        qsort(spans, g->n_tensors, sizeof *spans, cmp_span);
        for (size_t i = 1; i < g->n_tensors && !st; i++)
            if (spans[i].begin < spans[i - 1].end)
                st = q3_fail(Q3_ERR_FORMAT, "tensors '%s' and '%s' overlap in the data section",
                             g->tensors[spans[i - 1].idx].name, g->tensors[spans[i].idx].name);
    }
    free(spans);
    return st;
}

/* ==== open / close =================================================================== */

/* Smallest encodings: a KV is a key length (8), a type (4) and a 1-byte value;
 * a tensor info is a name length (8), n_dims (4), one dim (8), type (4), offset (8). */
enum { MIN_KV_BYTES = 13, MIN_TENSOR_INFO_BYTES = 32, HEADER_BYTES = 24 };

/* Parses the mapped file into g; messages are without the path. */
static q3_status parse(q3_gguf *g)
{
    cursor c = {.base = g->map.data, .size = g->map.size, .pos = 0, .arena = &g->arena,
                .meta_left = Q3_GGUF_MAX_METADATA_BYTES};
    if (g->map.size < HEADER_BYTES)
        return q3_fail(Q3_ERR_FORMAT, "file is %zu bytes, too small for a GGUF header (%d)", g->map.size,
                       HEADER_BYTES);
    const uint8_t *magic = take(&c, 4, "magic");
    if (memcmp(magic, "GGUF", 4) != 0)
        return q3_fail(Q3_ERR_FORMAT, "not a GGUF file (magic %02x %02x %02x %02x, expected \"GGUF\")",
                       magic[0], magic[1], magic[2], magic[3]);
    read_u32(&c, &g->version, "version");
    if (g->version != 2 && g->version != 3) {
        uint32_t swapped = __builtin_bswap32(g->version);
        return q3_fail(Q3_ERR_UNSUPPORTED, "GGUF version %" PRIu32 " is not supported (2 or 3)%s",
                       g->version, swapped == 2 || swapped == 3 ? "; the file looks big-endian" : "");
    }
    uint64_t n_tensors, n_kv;
    read_u64(&c, &n_tensors, "tensor count");
    read_u64(&c, &n_kv, "metadata count");
    /* Both counts must fit in what remains, before anything is allocated. */
    if (n_kv > remaining(&c) / MIN_KV_BYTES)
        return q3_fail(Q3_ERR_FORMAT, "metadata count %" PRIu64 " cannot fit in the %zu bytes after the header",
                       n_kv, remaining(&c));
    if (n_tensors > (remaining(&c) - (size_t)n_kv * MIN_KV_BYTES) / MIN_TENSOR_INFO_BYTES)
        return q3_fail(Q3_ERR_FORMAT, "tensor count %" PRIu64 " cannot fit in the %zu bytes after the header",
                       n_tensors, remaining(&c));
    /* Counts the file could hold may still be more than any model has: ~200
     * bytes of memory each would be several times a (sparse) file's size. */
    if (n_kv > Q3_GGUF_MAX_KV)
        return q3_fail(Q3_ERR_FORMAT, "metadata count %" PRIu64 " is more than the %u q3 reads", n_kv,
                       Q3_GGUF_MAX_KV);
    if (n_tensors > Q3_GGUF_MAX_TENSORS)
        return q3_fail(Q3_ERR_FORMAT, "tensor count %" PRIu64 " is more than the %u q3 reads", n_tensors,
                       Q3_GGUF_MAX_TENSORS);
    g->n_kv = (size_t)n_kv;
    g->n_tensors = (size_t)n_tensors;

    g->kvs = calloc(g->n_kv ? g->n_kv : 1, sizeof *g->kvs);
    if (!g->kvs) return q3_fail(Q3_ERR_NOMEM, "out of memory for %zu metadata pairs", g->n_kv);
    q3_status st = index_init(&g->kv_index, g->n_kv);
    if (st || (st = parse_metadata(&c, g))) return st;

    if (g->n_tensors > remaining(&c) / MIN_TENSOR_INFO_BYTES)
        return q3_fail(Q3_ERR_FORMAT, "tensor count %zu cannot fit in the %zu bytes after the metadata",
                       g->n_tensors, remaining(&c));
    g->tensors = calloc(g->n_tensors ? g->n_tensors : 1, sizeof *g->tensors);
    g->tensor_offsets = calloc(g->n_tensors ? g->n_tensors : 1, sizeof *g->tensor_offsets);
    if (!g->tensors || !g->tensor_offsets)
        return q3_fail(Q3_ERR_NOMEM, "out of memory for %zu tensors", g->n_tensors);
    if ((st = index_init(&g->tensor_index, g->n_tensors)) || (st = parse_tensor_infos(&c, g)))
        return st;

    if ((st = read_alignment(g))) return st;
    /* c.pos <= size and alignment <= 2^31, so this cannot overflow. */
    g->data_offset = (c.pos + g->alignment - 1) / g->alignment * g->alignment;
    return place_tensors(g);
}

q3_status q3_gguf_open(const char *path, q3_gguf **out)
{
    *out = NULL;
    q3_gguf *g = calloc(1, sizeof *g);
    if (!g) return q3_fail(Q3_ERR_NOMEM, "%s: out of memory", path);
    g->path = strdup(path);
    if (!g->path) {
        free(g);
        return q3_fail(Q3_ERR_NOMEM, "%s: out of memory", path);
    }
    q3_status st = q3_map_file(path, &g->map);
    if (st) {
        q3_gguf_close(g);
        return st; /* the message already names the file */
    }
    st = parse(g);
    if (st) {
        q3_fail_wrap(st, "%s", path);
        q3_gguf_close(g);
        return st;
    }
    *out = g;
    return Q3_OK;
}

void q3_gguf_close(q3_gguf *g)
{
    if (!g) return;
    q3_unmap_file(&g->map);
    free(g->kvs);
    free(g->kv_index.slots);
    free(g->tensors);
    free(g->tensor_offsets);
    free(g->tensor_index.slots);
    arena_free(g->arena);
    free(g->path);
    free(g);
}

/* ==== accessors ======================================================================= */

const char *q3_gguf_path(const q3_gguf *g) { return g->path; }
uint32_t q3_gguf_version(const q3_gguf *g) { return g->version; }
size_t q3_gguf_alignment(const q3_gguf *g) { return g->alignment; }
size_t q3_gguf_data_offset(const q3_gguf *g) { return g->data_offset; }

size_t q3_gguf_kv_count(const q3_gguf *g) { return g->n_kv; }

const char *q3_gguf_kv_key(const q3_gguf *g, size_t i)
{
    assert(i < g->n_kv);
    return g->kvs[i].key;
}

const q3_gguf_value *q3_gguf_kv_value(const q3_gguf *g, size_t i)
{
    assert(i < g->n_kv);
    return &g->kvs[i].value;
}

const q3_gguf_value *q3_gguf_find(const q3_gguf *g, const char *key)
{
    if (!g->kv_index.slots) return NULL;
    size_t i = index_lookup(&g->kv_index, key, strlen(key), kv_name, g, NULL);
    return i == SIZE_MAX ? NULL : &g->kvs[i].value;
}

size_t q3_gguf_tensor_count(const q3_gguf *g) { return g->n_tensors; }

const q3_tensor *q3_gguf_tensor_at(const q3_gguf *g, size_t i)
{
    assert(i < g->n_tensors);
    return &g->tensors[i];
}

const q3_tensor *q3_gguf_find_tensor(const q3_gguf *g, const char *name)
{
    if (!g->tensor_index.slots) return NULL;
    size_t i = index_lookup(&g->tensor_index, name, strlen(name), tensor_name, g, NULL);
    return i == SIZE_MAX ? NULL : &g->tensors[i];
}

/* ==== typed getters ==================================================================== */

/* The value under key of one of the wanted types (a bit mask of 1 << type). */
static q3_status find_typed(const q3_gguf *g, const char *key, unsigned wanted, const char *expected,
                            const q3_gguf_value **out)
{
    const q3_gguf_value *v = q3_gguf_find(g, key);
    if (!v) return q3_fail(Q3_ERR_FORMAT, "%s: metadata key '%s' is missing", g->path, key);
    if (!(wanted & (1u << v->type)))
        return q3_fail(Q3_ERR_FORMAT, "%s: metadata key '%s' is %s, expected %s", g->path, key,
                       q3_gguf_type_name(v->type), expected);
    *out = v;
    return Q3_OK;
}

#define UNSIGNED_TYPES ((1u << Q3_GGUF_U8) | (1u << Q3_GGUF_U16) | (1u << Q3_GGUF_U32) | (1u << Q3_GGUF_U64))
#define SIGNED_TYPES ((1u << Q3_GGUF_I8) | (1u << Q3_GGUF_I16) | (1u << Q3_GGUF_I32) | (1u << Q3_GGUF_I64))
#define INT_TYPES (UNSIGNED_TYPES | SIGNED_TYPES)

/* Any integer value under key, range-checked into [lo, hi] (as int64 or uint64). */
static q3_status get_int(const q3_gguf *g, const char *key, int64_t lo, uint64_t hi, uint64_t *out)
{
    const q3_gguf_value *v;
    q3_status st = find_typed(g, key, INT_TYPES, "an integer", &v);
    if (st) return st;
    int negative = (SIGNED_TYPES & (1u << v->type)) && v->as.i < 0;
    if (negative ? v->as.i < lo : v->as.u > hi) {
        if (negative)
            return q3_fail(Q3_ERR_FORMAT, "%s: metadata key '%s' = %" PRId64 " is out of range", g->path,
                           key, v->as.i);
        return q3_fail(Q3_ERR_FORMAT, "%s: metadata key '%s' = %" PRIu64 " is out of range", g->path, key,
                       v->as.u);
    }
    *out = v->as.u; /* two's complement: the caller converts back */
    return Q3_OK;
}

q3_status q3_gguf_get_u32(const q3_gguf *g, const char *key, uint32_t *out)
{
    uint64_t u;
    q3_status st = get_int(g, key, 0, UINT32_MAX, &u);
    if (!st) *out = (uint32_t)u;
    return st;
}

q3_status q3_gguf_get_i32(const q3_gguf *g, const char *key, int32_t *out)
{
    uint64_t u;
    q3_status st = get_int(g, key, INT32_MIN, INT32_MAX, &u);
    if (!st) *out = (int32_t)(int64_t)u;
    return st;
}

q3_status q3_gguf_get_u64(const q3_gguf *g, const char *key, uint64_t *out)
{
    uint64_t u;
    q3_status st = get_int(g, key, 0, UINT64_MAX, &u);
    if (!st) *out = u;
    return st;
}

q3_status q3_gguf_get_f32(const q3_gguf *g, const char *key, float *out)
{
    const q3_gguf_value *v;
    q3_status st = find_typed(g, key, (1u << Q3_GGUF_F32) | (1u << Q3_GGUF_F64), "a float", &v);
    if (st) return st;
    /* Converting a finite double beyond FLT_MAX to float is undefined behaviour. */
    if (isfinite(v->as.f) && fabs(v->as.f) > FLT_MAX)
        return q3_fail(Q3_ERR_FORMAT, "%s: metadata key '%s' = %g is out of a float's range", g->path, key, v->as.f);
    *out = (float)v->as.f;
    return Q3_OK;
}

q3_status q3_gguf_get_bool(const q3_gguf *g, const char *key, bool *out)
{
    const q3_gguf_value *v;
    q3_status st = find_typed(g, key, 1u << Q3_GGUF_BOOL, "a bool", &v);
    if (!st) *out = v->as.u != 0;
    return st;
}

q3_status q3_gguf_get_str(const q3_gguf *g, const char *key, const char **out)
{
    const q3_gguf_value *v;
    q3_status st = find_typed(g, key, 1u << Q3_GGUF_STRING, "a string", &v);
    if (!st) *out = v->as.str.s;
    return st;
}

q3_status q3_gguf_get_arr(const q3_gguf *g, const char *key, int elem_type, const q3_gguf_value **out)
{
    const q3_gguf_value *v;
    q3_status st = find_typed(g, key, 1u << Q3_GGUF_ARRAY, "an array", &v);
    if (st) return st;
    if (elem_type >= 0 && v->as.arr.type != (q3_gguf_type)elem_type)
        return q3_fail(Q3_ERR_FORMAT, "%s: metadata key '%s' is an array of %s, expected an array of %s",
                       g->path, key, q3_gguf_type_name(v->as.arr.type),
                       q3_gguf_type_name((q3_gguf_type)elem_type));
    *out = v;
    return Q3_OK;
}
