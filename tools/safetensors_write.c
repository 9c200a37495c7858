/* Writing one .safetensors file: declare tensors, write the header, fill the
 * data with positional writes, commit by rename. See safetensors_write.h. */
#include "tools/safetensors_write.h"
#include "util/error.h"
#include "util/outfile.h"
#include "util/strbuf.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct st_entry {
    char name[128];
    q3_dtype dtype;
    int ndim;
    int64_t shape[Q3_MAX_DIMS];
    uint64_t begin, end;       /* byte offsets relative to the data start */
    uint64_t written;          /* bytes written so far (updated atomically) */
} st_entry;

struct q3_st_writer {
    char *path;                /* final name */
    q3_outfile *out;           /* the temporary file, renamed to path on commit */
    st_entry *entries;         /* [n], in declaration (= data) order */
    int n, cap;
    uint64_t data_start;       /* 8 + padded header length; 0 before begin_data */
    uint64_t data_bytes;       /* sum of all tensors' bytes */
};

const char *q3_st_dtype_name(q3_dtype t)
{
    switch (t) {
    case Q3_F32: return "F32";
    case Q3_F16: return "F16";
    case Q3_BF16: return "BF16";
    default: return NULL;
    }
}

/* ---- lifetime ----------------------------------------------------------- */

static void writer_free(q3_st_writer *w)
{
    free(w->path);
    free(w->entries);
    free(w);
}

q3_status q3_st_writer_new(const char *path, q3_st_writer **out)
{
    *out = NULL;
    q3_st_writer *w = calloc(1, sizeof *w);
    if (!w) return q3_fail(Q3_ERR_NOMEM, "%s: out of memory", path);
    w->path = strdup(path);
    if (!w->path) {
        writer_free(w);
        return q3_fail(Q3_ERR_NOMEM, "%s: out of memory", path);
    }
    q3_status st = q3_outfile_open(path, &w->out);
    if (st) {
        writer_free(w);
        return st;
    }
    *out = w;
    return Q3_OK;
}

void q3_st_writer_abort(q3_st_writer *w)
{
    if (!w) return;
    q3_outfile_abort(w->out);
    writer_free(w);
}

/* ---- declaring tensors -------------------------------------------------- */

static int name_is_plain(const char *name)
{
    if (!*name) return 0;
    for (const unsigned char *p = (const unsigned char *)name; *p; p++)
        if (*p < 0x20 || *p > 0x7e || *p == '"' || *p == '\\') return 0;
    return 1;
}

q3_status q3_st_writer_add(q3_st_writer *w, const char *name, q3_dtype dtype, int ndim,
                           const int64_t *shape)
{
    if (w->data_start)
        return q3_fail(Q3_ERR_INVALID, "%s: tensor \"%s\" added after the header was written",
                       w->path, name);
    if (!q3_st_dtype_name(dtype))
        return q3_fail(Q3_ERR_UNSUPPORTED, "%s: tensor \"%s\": dtype %s cannot be written (F32, F16, BF16)",
                       w->path, name, q3_dtype_name(dtype));
    if (strlen(name) >= sizeof w->entries[0].name || !name_is_plain(name))
        return q3_fail(Q3_ERR_INVALID,
                       "%s: tensor name \"%s\" must be 1..127 printable ASCII bytes without quotes or backslashes",
                       w->path, name);
    if (ndim < 0 || ndim > Q3_MAX_DIMS)
        return q3_fail(Q3_ERR_INVALID, "%s: tensor \"%s\": %d dimensions (at most %d)", w->path,
                       name, ndim, Q3_MAX_DIMS);
    for (int i = 0; i < w->n; i++)
        if (!strcmp(w->entries[i].name, name))
            return q3_fail(Q3_ERR_INVALID, "%s: tensor \"%s\" declared twice", w->path, name);

    uint64_t bytes = q3_dtype_block_bytes(dtype);
    for (int d = 0; d < ndim; d++) {
        if (shape[d] <= 0 || (uint64_t)shape[d] > (UINT64_MAX >> 1) / bytes)
            return q3_fail(Q3_ERR_INVALID, "%s: tensor \"%s\": dimension %d is %" PRId64, w->path,
                           name, d, shape[d]);
        bytes *= (uint64_t)shape[d];
    }

    if (w->n == w->cap) {
        int cap = w->cap ? 2 * w->cap : 64;
        st_entry *e = realloc(w->entries, (size_t)cap * sizeof *e);
        if (!e) return q3_fail(Q3_ERR_NOMEM, "%s: out of memory", w->path);
        w->entries = e;
        w->cap = cap;
    }
    st_entry *e = &w->entries[w->n++];
    memset(e, 0, sizeof *e);
    snprintf(e->name, sizeof e->name, "%s", name);
    e->dtype = dtype;
    e->ndim = ndim;
    for (int d = 0; d < ndim; d++) e->shape[d] = shape[d];
    e->begin = w->data_bytes;
    e->end = w->data_bytes + bytes;
    w->data_bytes = e->end;
    return Q3_OK;
}

/* ---- the header ----------------------------------------------------------- */

q3_status q3_st_writer_begin_data(q3_st_writer *w)
{
    if (w->data_start)
        return q3_fail(Q3_ERR_INVALID, "%s: header already written", w->path);

    /* 8 bytes of length first, then the JSON, padded with spaces to 8. */
    q3_strbuf b = {0};
    q3_strbuf_printf(&b, "%8s", "");
    q3_strbuf_printf(&b, "{\"__metadata__\":{\"format\":\"pt\"}");
    for (int i = 0; i < w->n; i++) {
        const st_entry *e = &w->entries[i];
        q3_strbuf_printf(&b, ",\"%s\":{\"dtype\":\"%s\",\"shape\":[", e->name, q3_st_dtype_name(e->dtype));
        for (int d = 0; d < e->ndim; d++) q3_strbuf_printf(&b, "%s%" PRId64, d ? "," : "", e->shape[d]);
        q3_strbuf_printf(&b, "],\"data_offsets\":[%" PRIu64 ",%" PRIu64 "]}", e->begin, e->end);
    }
    q3_strbuf_printf(&b, "}");
    while (!b.oom && b.len % 8) q3_strbuf_printf(&b, " ");
    if (b.oom) {
        free(b.data);
        return q3_fail(Q3_ERR_NOMEM, "%s: out of memory for the header", w->path);
    }
    uint64_t header_len = b.len - 8;
    for (int i = 0; i < 8; i++) b.data[i] = (char)(header_len >> (8 * i) & 0xff);

    q3_status st = q3_outfile_pwrite(w->out, b.data, b.len, 0);
    free(b.data);
    if (st) return st;
    w->data_start = 8 + header_len;
    return Q3_OK;
}

/* ---- data --------------------------------------------------------------- */

size_t q3_st_writer_tensor_bytes(const q3_st_writer *w, int i)
{
    return i >= 0 && i < w->n ? (size_t)(w->entries[i].end - w->entries[i].begin) : 0;
}

q3_status q3_st_writer_write(q3_st_writer *w, int i, size_t offset, const void *data, size_t n)
{
    if (!w->data_start)
        return q3_fail(Q3_ERR_INVALID, "%s: data written before the header", w->path);
    if (i < 0 || i >= w->n)
        return q3_fail(Q3_ERR_INVALID, "%s: no tensor %d (there are %d)", w->path, i, w->n);
    st_entry *e = &w->entries[i];
    uint64_t size = e->end - e->begin;
    if (offset > size || n > size - offset)
        return q3_fail(Q3_ERR_INVALID, "%s: tensor \"%s\": write of %zu bytes at %zu overruns its %" PRIu64 " bytes",
                       w->path, e->name, n, offset, size);
    q3_status st = q3_outfile_pwrite(w->out, data, n, w->data_start + e->begin + offset);
    if (st) return st;
    __atomic_add_fetch(&e->written, (uint64_t)n, __ATOMIC_RELAXED);
    return Q3_OK;
}

q3_status q3_st_writer_commit(q3_st_writer *w)
{
    q3_status st = Q3_OK;
    if (!w->data_start) st = q3_fail(Q3_ERR_INVALID, "%s: committed before the header was written", w->path);
    for (int i = 0; !st && i < w->n; i++) {
        const st_entry *e = &w->entries[i];
        if (e->written != e->end - e->begin)
            st = q3_fail(Q3_ERR_INVALID, "%s: tensor \"%s\" has %" PRIu64 " of its %" PRIu64 " bytes written",
                         w->path, e->name, e->written, e->end - e->begin);
    }
    if (st) {
        q3_st_writer_abort(w);
        return st;
    }
    st = q3_outfile_commit(w->out);
    writer_free(w);
    return st;
}
