/* GGUF writer (see gguf_write.h).
 *
 * Metadata pairs are encoded into one byte buffer as they are added, so
 * writing is a copy; tensors are kept as descriptors (name, dtype, shape,
 * where the bytes come from) and their offsets are assigned at write time. */
#include "tools/gguf_write.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "model/gguf.h"
#include "util/error.h"
#include "util/outfile.h"

/* ==== growable byte buffer ================================================== */

typedef struct bytes {
    uint8_t *p;
    size_t len, cap;
    int oom; /* set by a failed append; later appends do nothing */
} bytes;

static void put(bytes *b, const void *src, size_t n)
{
    if (b->oom) return;
    if (n > SIZE_MAX - b->len) {
        b->oom = 1;
        return;
    }
    if (b->len + n > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n) cap = cap > SIZE_MAX / 2 ? b->len + n : cap * 2;
        uint8_t *p = realloc(b->p, cap);
        if (!p) {
            b->oom = 1;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    if (n) memcpy(b->p + b->len, src, n);
    b->len += n;
}

static void put_u32(bytes *b, uint32_t v)
{
    uint8_t le[4] = {(uint8_t)v, (uint8_t)(v >> 8), (uint8_t)(v >> 16), (uint8_t)(v >> 24)};
    put(b, le, 4);
}

static void put_u64(bytes *b, uint64_t v)
{
    put_u32(b, (uint32_t)v);
    put_u32(b, (uint32_t)(v >> 32));
}

static void put_f32(bytes *b, float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    put_u32(b, u);
}

/* A GGUF string: u64 length, then the bytes without a NUL. */
static void put_str(bytes *b, const char *s)
{
    size_t n = strlen(s);
    put_u64(b, n);
    put(b, s, n);
}

/* ==== the writer =============================================================== */

typedef struct wtensor {
    char name[Q3_GGUF_WRITE_MAX_NAME + 1];
    q3_dtype dtype;
    int ndim;
    int64_t shape[4];    /* row-major, shape[0] outermost */
    size_t nbytes;
    const void *data;    /* the bytes, or NULL when fill makes them */
    q3_gguf_fill_fn fill;
    void *user;
} wtensor;

struct q3_gguf_writer {
    bytes meta;          /* every pair encoded: key, u32 type, value */
    char **keys;         /* [n_kv] copies, for duplicate checks */
    size_t n_kv, cap_kv;
    wtensor *tensors;    /* [n_tensors] in the order added */
    size_t n_tensors, cap_tensors;
};

q3_status q3_gguf_writer_new(q3_gguf_writer **out)
{
    *out = calloc(1, sizeof **out);
    if (!*out) return q3_fail(Q3_ERR_NOMEM, "gguf writer: out of memory");
    q3_status st = q3_gguf_writer_add_u32(*out, "general.alignment", Q3_GGUF_WRITE_ALIGNMENT);
    if (st) {
        q3_gguf_writer_free(*out);
        *out = NULL;
    }
    return st;
}

void q3_gguf_writer_free(q3_gguf_writer *w)
{
    if (!w) return;
    for (size_t i = 0; i < w->n_kv; i++) free(w->keys[i]);
    free(w->keys);
    free(w->meta.p);
    free(w->tensors);
    free(w);
}

/* ==== metadata ==================================================================== */

/* Checks key and starts its pair (key and value type) in w->meta; *mark gets
 * the buffer length to roll back to if the value cannot be appended. */
static q3_status begin_pair(q3_gguf_writer *w, const char *key, q3_gguf_type type, size_t *mark)
{
    size_t len = key ? strlen(key) : 0;
    if (len == 0 || len > Q3_GGUF_MAX_KEY_LEN)
        return q3_fail(Q3_ERR_INVALID, "gguf writer: metadata key is empty or longer than %u bytes",
                       Q3_GGUF_MAX_KEY_LEN);
    for (size_t i = 0; i < w->n_kv; i++)
        if (!strcmp(w->keys[i], key))
            return q3_fail(Q3_ERR_INVALID, "gguf writer: metadata key '%s' added twice", key);
    *mark = w->meta.len;
    put_str(&w->meta, key);
    put_u32(&w->meta, (uint32_t)type);
    return Q3_OK;
}

/* Records the key once its value is in; rolls the pair back when an append failed. */
static q3_status end_pair(q3_gguf_writer *w, const char *key, size_t mark)
{
    char *copy = NULL;
    if (!w->meta.oom && w->n_kv == w->cap_kv) {
        size_t cap = w->cap_kv ? 2 * w->cap_kv : 16;
        char **keys = realloc(w->keys, cap * sizeof *keys);
        if (keys) {
            w->keys = keys;
            w->cap_kv = cap;
        }
    }
    if (w->meta.oom || w->n_kv == w->cap_kv || !(copy = strdup(key))) {
        w->meta.oom = 0;
        w->meta.len = mark;
        return q3_fail(Q3_ERR_NOMEM, "gguf writer: out of memory adding '%s'", key);
    }
    w->keys[w->n_kv++] = copy;
    return Q3_OK;
}

q3_status q3_gguf_writer_add_str(q3_gguf_writer *w, const char *key, const char *value)
{
    size_t mark;
    if (!value) return q3_fail(Q3_ERR_INVALID, "gguf writer: '%s': NULL string", key ? key : "");
    q3_status st = begin_pair(w, key, Q3_GGUF_STRING, &mark);
    if (st) return st;
    put_str(&w->meta, value);
    return end_pair(w, key, mark);
}

q3_status q3_gguf_writer_add_u32(q3_gguf_writer *w, const char *key, uint32_t value)
{
    size_t mark;
    q3_status st = begin_pair(w, key, Q3_GGUF_U32, &mark);
    if (st) return st;
    put_u32(&w->meta, value);
    return end_pair(w, key, mark);
}

q3_status q3_gguf_writer_add_i32(q3_gguf_writer *w, const char *key, int32_t value)
{
    size_t mark;
    q3_status st = begin_pair(w, key, Q3_GGUF_I32, &mark);
    if (st) return st;
    put_u32(&w->meta, (uint32_t)value);
    return end_pair(w, key, mark);
}

q3_status q3_gguf_writer_add_u64(q3_gguf_writer *w, const char *key, uint64_t value)
{
    size_t mark;
    q3_status st = begin_pair(w, key, Q3_GGUF_U64, &mark);
    if (st) return st;
    put_u64(&w->meta, value);
    return end_pair(w, key, mark);
}

q3_status q3_gguf_writer_add_f32(q3_gguf_writer *w, const char *key, float value)
{
    size_t mark;
    q3_status st = begin_pair(w, key, Q3_GGUF_F32, &mark);
    if (st) return st;
    put_f32(&w->meta, value);
    return end_pair(w, key, mark);
}

q3_status q3_gguf_writer_add_bool(q3_gguf_writer *w, const char *key, bool value)
{
    size_t mark;
    q3_status st = begin_pair(w, key, Q3_GGUF_BOOL, &mark);
    if (st) return st;
    uint8_t b = value ? 1 : 0;
    put(&w->meta, &b, 1);
    return end_pair(w, key, mark);
}

/* Starts an array pair: key, type ARRAY, element type, count. */
static q3_status begin_array(q3_gguf_writer *w, const char *key, q3_gguf_type elem, const void *values,
                             size_t n, size_t *mark)
{
    if (!values && n) return q3_fail(Q3_ERR_INVALID, "gguf writer: '%s': NULL array", key ? key : "");
    q3_status st = begin_pair(w, key, Q3_GGUF_ARRAY, mark);
    if (st) return st;
    put_u32(&w->meta, (uint32_t)elem);
    put_u64(&w->meta, n);
    return Q3_OK;
}

q3_status q3_gguf_writer_add_str_array(q3_gguf_writer *w, const char *key, const char *const *values,
                                       size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (values && !values[i])
            return q3_fail(Q3_ERR_INVALID, "gguf writer: '%s': string %zu is NULL", key ? key : "", i);
    size_t mark;
    q3_status st = begin_array(w, key, Q3_GGUF_STRING, values, n, &mark);
    if (st) return st;
    for (size_t i = 0; i < n; i++) put_str(&w->meta, values[i]);
    return end_pair(w, key, mark);
}

q3_status q3_gguf_writer_add_i32_array(q3_gguf_writer *w, const char *key, const int32_t *values,
                                       size_t n)
{
    size_t mark;
    q3_status st = begin_array(w, key, Q3_GGUF_I32, values, n, &mark);
    if (st) return st;
    for (size_t i = 0; i < n; i++) put_u32(&w->meta, (uint32_t)values[i]);
    return end_pair(w, key, mark);
}

q3_status q3_gguf_writer_add_f32_array(q3_gguf_writer *w, const char *key, const float *values,
                                       size_t n)
{
    size_t mark;
    q3_status st = begin_array(w, key, Q3_GGUF_F32, values, n, &mark);
    if (st) return st;
    for (size_t i = 0; i < n; i++) put_f32(&w->meta, values[i]);
    return end_pair(w, key, mark);
}

/* ==== tensors ======================================================================== */

/* Validates and appends a tensor descriptor (data or fill, one of them set). */
static q3_status add_tensor(q3_gguf_writer *w, const char *name, q3_dtype dtype, int ndim,
                            const int64_t *shape, const void *data, q3_gguf_fill_fn fill, void *user)
{
    size_t len = name ? strlen(name) : 0;
    if (len == 0 || len > Q3_GGUF_WRITE_MAX_NAME)
        return q3_fail(Q3_ERR_INVALID, "gguf writer: tensor name '%.80s' is empty or longer than %u bytes",
                       name ? name : "", Q3_GGUF_WRITE_MAX_NAME);
    if ((unsigned)dtype >= Q3_DTYPE_COUNT)
        return q3_fail(Q3_ERR_INVALID, "gguf writer: tensor '%s': unknown dtype %d", name, (int)dtype);
    if (ndim < 1 || ndim > 4 || !shape)
        return q3_fail(Q3_ERR_INVALID, "gguf writer: tensor '%s': %d dimensions (1 to 4 allowed)", name, ndim);
    if (!data && !fill)
        return q3_fail(Q3_ERR_INVALID, "gguf writer: tensor '%s': no data", name);
    for (size_t i = 0; i < w->n_tensors; i++)
        if (!strcmp(w->tensors[i].name, name))
            return q3_fail(Q3_ERR_INVALID, "gguf writer: tensor '%s' added twice", name);
    size_t numel = 1;
    for (int d = 0; d < ndim; d++) {
        if (shape[d] < 1)
            return q3_fail(Q3_ERR_INVALID, "gguf writer: tensor '%s': shape[%d] = %lld is not positive", name,
                           d, (long long)shape[d]);
        if ((uint64_t)shape[d] > SIZE_MAX / numel)
            return q3_fail(Q3_ERR_INVALID, "gguf writer: tensor '%s': element count overflows", name);
        numel *= (size_t)shape[d];
    }
    size_t block = q3_dtype_block_values(dtype), block_bytes = q3_dtype_block_bytes(dtype);
    if ((size_t)shape[ndim - 1] % block)
        return q3_fail(Q3_ERR_INVALID, "gguf writer: tensor '%s': row length %lld is not a multiple of the %s block size %zu",
                       name, (long long)shape[ndim - 1], q3_dtype_name(dtype), block);
    if (numel / block > (SIZE_MAX - Q3_GGUF_WRITE_ALIGNMENT) / block_bytes)
        return q3_fail(Q3_ERR_INVALID, "gguf writer: tensor '%s': byte size overflows", name);
    if (w->n_tensors == w->cap_tensors) {
        size_t cap = w->cap_tensors ? 2 * w->cap_tensors : 64;
        wtensor *t = realloc(w->tensors, cap * sizeof *t);
        if (!t) return q3_fail(Q3_ERR_NOMEM, "gguf writer: out of memory adding tensor '%s'", name);
        w->tensors = t;
        w->cap_tensors = cap;
    }
    wtensor *t = &w->tensors[w->n_tensors++];
    memset(t, 0, sizeof *t);
    memcpy(t->name, name, len + 1);
    t->dtype = dtype;
    t->ndim = ndim;
    memcpy(t->shape, shape, (size_t)ndim * sizeof *shape);
    t->nbytes = numel / block * block_bytes;
    t->data = data;
    t->fill = fill;
    t->user = user;
    return Q3_OK;
}

q3_status q3_gguf_writer_add_tensor(q3_gguf_writer *w, const char *name, q3_dtype dtype, int ndim,
                                    const int64_t *shape, const void *data)
{
    if (!data) return q3_fail(Q3_ERR_INVALID, "gguf writer: tensor '%s': NULL data", name ? name : "");
    return add_tensor(w, name, dtype, ndim, shape, data, NULL, NULL);
}

q3_status q3_gguf_writer_add_tensor_fn(q3_gguf_writer *w, const char *name, q3_dtype dtype, int ndim,
                                       const int64_t *shape, q3_gguf_fill_fn fill, void *user)
{
    if (!fill) return q3_fail(Q3_ERR_INVALID, "gguf writer: tensor '%s': NULL fill function", name ? name : "");
    return add_tensor(w, name, dtype, ndim, shape, NULL, fill, user);
}

/* ==== writing ============================================================================ */

static size_t align_up(size_t n) { return (n + Q3_GGUF_WRITE_ALIGNMENT - 1) / Q3_GGUF_WRITE_ALIGNMENT * Q3_GGUF_WRITE_ALIGNMENT; }

/* Encodes the header: magic, version, counts, metadata, tensor infos, then
 * zero padding up to the data section. Tensor offsets are assigned in order,
 * each aligned; *data_size gets the size of the data section. */
static q3_status encode_header(const q3_gguf_writer *w, bytes *h, uint64_t *data_size)
{
    put(h, "GGUF", 4);
    put_u32(h, 3);
    put_u64(h, w->n_tensors);
    put_u64(h, w->n_kv);
    put(h, w->meta.p, w->meta.len);
    uint64_t offset = 0;
    for (size_t i = 0; i < w->n_tensors; i++) {
        const wtensor *t = &w->tensors[i];
        put_str(h, t->name);
        put_u32(h, (uint32_t)t->ndim);
        for (int d = t->ndim - 1; d >= 0; d--) put_u64(h, (uint64_t)t->shape[d]); /* innermost first */
        put_u32(h, q3_ggml_type_from_dtype(t->dtype));
        put_u64(h, offset);
        if (align_up(t->nbytes) > UINT64_MAX - offset)
            return q3_fail(Q3_ERR_INVALID, "gguf writer: the data section overflows 64 bits");
        offset += align_up(t->nbytes);
    }
    static const uint8_t zeros[Q3_GGUF_WRITE_ALIGNMENT];
    put(h, zeros, align_up(h->len) - h->len);
    *data_size = offset;
    return h->oom ? q3_fail(Q3_ERR_NOMEM, "gguf writer: out of memory encoding the header") : Q3_OK;
}

/* Writes header and tensor data to f, in order; messages name the file. */
static q3_status write_body(q3_gguf_writer *w, q3_outfile *f, q3_gguf_progress_fn progress, void *user)
{
    const char *path = q3_outfile_path(f);
    bytes h = {0};
    uint64_t data_size = 0, done = 0;
    q3_status st = encode_header(w, &h, &data_size);
    if (!st) st = q3_outfile_write(f, h.p, h.len);
    free(h.p);
    static const uint8_t zeros[Q3_GGUF_WRITE_ALIGNMENT];
    for (size_t i = 0; i < w->n_tensors && !st; i++) {
        const wtensor *t = &w->tensors[i];
        void *buf = NULL;
        const void *src = t->data;
        if (t->fill) {
            buf = malloc(t->nbytes);
            if (!buf) {
                st = q3_fail(Q3_ERR_NOMEM, "%s: out of memory for tensor '%s' (%zu bytes)", path, t->name,
                             t->nbytes);
                break;
            }
            st = t->fill(t->user, buf, t->nbytes);
            if (st) {
                free(buf);
                q3_fail_wrap(st, "%s: making tensor '%s'", path, t->name);
                break;
            }
            src = buf;
        }
        size_t pad = align_up(t->nbytes) - t->nbytes;
        st = q3_outfile_write(f, src, t->nbytes);
        if (!st) st = q3_outfile_write(f, zeros, pad);
        if (st) q3_fail_wrap(st, "tensor '%s'", t->name);
        free(buf);
        done += t->nbytes + pad;
        if (!st && progress && progress(user, i + 1, w->n_tensors, done, data_size))
            st = q3_fail(Q3_ERR_INVALID, "%s: write cancelled after %zu of %zu tensors", path, i + 1,
                         w->n_tensors);
    }
    return st;
}

q3_status q3_gguf_writer_write(q3_gguf_writer *w, const char *path, q3_gguf_progress_fn progress,
                               void *user)
{
    q3_outfile *f;
    q3_status st = q3_outfile_open(path, &f);
    if (st) return st;
    st = write_body(w, f, progress, user);
    if (st) {
        q3_outfile_abort(f);
        return st;
    }
    return q3_outfile_commit(f);
}
