#include "model/safetensors.h"

#include <cjson/cJSON.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "util/error.h"
#include "util/json_check.h"

static int dtype_from_st(const char *s)
{
    if (!strcmp(s, "F32")) return Q3_F32;
    if (!strcmp(s, "F16")) return Q3_F16;
    if (!strcmp(s, "BF16")) return Q3_BF16;
    return -1;
}

typedef struct span { size_t begin, end; int idx; } span;

static int cmp_span(const void *a, const void *b)
{
    const span *x = a, *y = b;
    return x->begin < y->begin ? -1 : x->begin > y->begin;
}

static _Thread_local const q3_tensor *by_name_base;

static int cmp_name(const void *a, const void *b)
{
    const span *x = a, *y = b;
    return strcmp(by_name_base[x->idx].name, by_name_base[y->idx].name);
}

/* Parses one header entry into t; data_len is the size of the data section. */
static q3_status parse_entry(const char *path, const cJSON *e, const uint8_t *data, size_t data_len,
                             q3_tensor *t, span *sp)
{
    const char *name = e->string;
    if (strlen(name) >= sizeof t->name)
        return q3_fail(Q3_ERR_FORMAT, "%s: tensor name \"%.40s...\" is too long", path, name);
    strcpy(t->name, name);
    if (!cJSON_IsObject(e)) return q3_fail(Q3_ERR_FORMAT, "%s: tensor \"%s\": entry is not an object", path, name);
    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(e, "dtype");
    const cJSON *sh = cJSON_GetObjectItemCaseSensitive(e, "shape");
    const cJSON *off = cJSON_GetObjectItemCaseSensitive(e, "data_offsets");
    if (!cJSON_IsString(dt) || !cJSON_IsArray(sh) || !cJSON_IsArray(off))
        return q3_fail(Q3_ERR_FORMAT, "%s: tensor \"%s\": needs string \"dtype\", array \"shape\" and array \"data_offsets\"",
                       path, name);
    int d = dtype_from_st(dt->valuestring);
    if (d < 0)
        return q3_fail(Q3_ERR_UNSUPPORTED, "%s: tensor \"%s\": dtype \"%.16s\" is not supported (F32, F16, BF16)",
                       path, name, dt->valuestring);
    t->dtype = (q3_dtype)d;
    int nd = cJSON_GetArraySize(sh);
    if (nd > Q3_MAX_DIMS)
        return q3_fail(Q3_ERR_FORMAT, "%s: tensor \"%s\": %d dimensions (at most %d)", path, name, nd, Q3_MAX_DIMS);
    t->ndim = nd;
    size_t numel = 1;
    for (int i = 0; i < nd; i++) {
        const cJSON *x = cJSON_GetArrayItem(sh, i);
        if (!cJSON_IsNumber(x) || x->valuedouble < 0 || x->valuedouble > 9.0e15 ||
            x->valuedouble != (double)(int64_t)x->valuedouble)
            return q3_fail(Q3_ERR_FORMAT, "%s: tensor \"%s\": shape[%d] is not a non-negative integer", path, name, i);
        t->shape[i] = (int64_t)x->valuedouble;
        if (t->shape[i] && numel > SIZE_MAX / (size_t)t->shape[i])
            return q3_fail(Q3_ERR_FORMAT, "%s: tensor \"%s\": shape overflows", path, name);
        numel *= (size_t)t->shape[i];
    }
    size_t esz = q3_dtype_block_bytes(t->dtype);
    if (numel > SIZE_MAX / esz) return q3_fail(Q3_ERR_FORMAT, "%s: tensor \"%s\": size overflows", path, name);
    if (cJSON_GetArraySize(off) != 2)
        return q3_fail(Q3_ERR_FORMAT, "%s: tensor \"%s\": data_offsets must be [begin, end]", path, name);
    double b = cJSON_GetArrayItem(off, 0)->valuedouble, en = cJSON_GetArrayItem(off, 1)->valuedouble;
    /* 0 <= b <= en < 2^64 first: casting a larger double (1e30, 1e999 = inf) is undefined. */
    if (!cJSON_IsNumber(cJSON_GetArrayItem(off, 0)) || !cJSON_IsNumber(cJSON_GetArrayItem(off, 1)) || !(b >= 0) ||
        !(en >= b) || !(en < 0x1p64) || b != (double)(uint64_t)b || en != (double)(uint64_t)en)
        return q3_fail(Q3_ERR_FORMAT, "%s: tensor \"%s\": data_offsets are not increasing non-negative integers",
                       path, name);
    if (en > (double)data_len)
        return q3_fail(Q3_ERR_FORMAT, "%s: tensor \"%s\": data_offsets [%.0f, %.0f] lie outside the %zu data bytes "
                       "(file truncated?)", path, name, b, en, data_len);
    sp->begin = (size_t)b;
    sp->end = (size_t)en;
    if (sp->end - sp->begin != numel * esz)
        return q3_fail(Q3_ERR_FORMAT, "%s: tensor \"%s\": %zu data bytes do not match dtype %s x shape (%zu bytes)",
                       path, name, sp->end - sp->begin, q3_dtype_name(t->dtype), numel * esz);
    t->data = data + sp->begin;
    t->nbytes = sp->end - sp->begin;
    return Q3_OK;
}

q3_status q3_safetensors_open(const char *path, q3_safetensors *out)
{
    memset(out, 0, sizeof *out);
    q3_mapping map;
    q3_status st = q3_map_file(path, &map);
    if (st) return st;
    cJSON *root = NULL;
    q3_tensor *tensors = NULL;
    span *spans = NULL;
    int *by_name = NULL;
    int n = 0;
    if (map.size < 8) {
        st = q3_fail(Q3_ERR_FORMAT, "%s: file is %zu bytes, too short for a safetensors header", path, map.size);
        goto fail;
    }
    const uint8_t *p = map.data;
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = hlen << 8 | p[i];
    if (hlen > Q3_SAFETENSORS_MAX_HEADER) {
        st = q3_fail(Q3_ERR_FORMAT, "%s: header length %llu is absurdly large (limit %u bytes)", path,
                     (unsigned long long)hlen, Q3_SAFETENSORS_MAX_HEADER);
        goto fail;
    }
    if (hlen > map.size - 8) {
        st = q3_fail(Q3_ERR_FORMAT, "%s: header length %llu is larger than the file (%zu bytes): truncated?", path,
                     (unsigned long long)hlen, map.size);
        goto fail;
    }
    root = cJSON_ParseWithLength((const char *)p + 8, (size_t)hlen);
    if (!root || !cJSON_IsObject(root)) {
        st = q3_fail(Q3_ERR_FORMAT, "%s: header is not a valid JSON object", path);
        goto fail;
    }
    const uint8_t *data = p + 8 + hlen;
    size_t data_len = map.size - 8 - (size_t)hlen;
    int count = cJSON_GetArraySize(root);
    tensors = calloc((size_t)count + 1, sizeof *tensors);
    spans = calloc((size_t)count + 1, sizeof *spans);
    if (!tensors || !spans) {
        st = q3_fail(Q3_ERR_NOMEM, "%s: out of memory", path);
        goto fail;
    }
    const cJSON *e;
    cJSON_ArrayForEach(e, root) {
        if (!strcmp(e->string, "__metadata__")) continue;
        if ((st = parse_entry(path, e, data, data_len, &tensors[n], &spans[n]))) goto fail;
        spans[n].idx = n;
        n++;
    }
    /* duplicates: sort names (n log n: a hostile header may hold millions) */
    for (int i = 0; i < n; i++) spans[i].idx = i;
    by_name_base = tensors;
    qsort(spans, (size_t)n, sizeof *spans, cmp_name);
    for (int i = 1; i < n; i++)
        if (!strcmp(tensors[spans[i].idx].name, tensors[spans[i - 1].idx].name)) {
            st = q3_fail(Q3_ERR_FORMAT, "%s: tensor \"%s\" appears twice in the header", path,
                         tensors[spans[i].idx].name);
            goto fail;
        }
    const char *dup = q3_json_duplicate_key(root); /* in an entry, or __metadata__ twice */
    if (dup) {
        st = q3_fail(Q3_ERR_FORMAT, "%s: key \"%.60s\" appears twice in one object of the header", path, dup);
        goto fail;
    }
    by_name = malloc(((size_t)n + 1) * sizeof *by_name);
    if (!by_name) {
        st = q3_fail(Q3_ERR_NOMEM, "%s: out of memory", path);
        goto fail;
    }
    for (int i = 0; i < n; i++) by_name[i] = spans[i].idx;
    /* overlaps: in order of begin, each non-empty span must start at or after the
     * furthest end so far (an empty tensor in between owns no bytes and must not
     * hide an overlap of its neighbours) */
    qsort(spans, (size_t)n, sizeof *spans, cmp_span);
    size_t max_end = 0;
    int max_idx = -1;
    for (int i = 0; i < n; i++) {
        if (spans[i].end == spans[i].begin) continue;
        if (max_idx >= 0 && spans[i].begin < max_end) {
            st = q3_fail(Q3_ERR_FORMAT, "%s: tensors \"%s\" and \"%s\" overlap in the data section", path,
                         tensors[max_idx].name, tensors[spans[i].idx].name);
            goto fail;
        }
        if (spans[i].end > max_end) {
            max_end = spans[i].end;
            max_idx = spans[i].idx;
        }
    }
    cJSON_Delete(root);
    free(spans);
    out->path = strdup(path);
    out->map = map;
    out->tensors = tensors;
    out->by_name = by_name;
    out->n_tensors = n;
    return Q3_OK;
fail:
    cJSON_Delete(root);
    free(spans);
    free(by_name);
    free(tensors);
    q3_unmap_file(&map);
    return st;
}

void q3_safetensors_close(q3_safetensors *f)
{
    free(f->path);
    free(f->tensors);
    free(f->by_name);
    q3_unmap_file(&f->map);
    memset(f, 0, sizeof *f);
}

const q3_tensor *q3_safetensors_find(const q3_safetensors *f, const char *name)
{
    int lo = 0, hi = f->n_tensors; /* names are unique: at most one match */
    while (lo < hi) {
        int mid = lo + (hi - lo) / 2;
        const q3_tensor *t = &f->tensors[f->by_name[mid]];
        int c = strcmp(name, t->name);
        if (c == 0) return t;
        if (c < 0) hi = mid;
        else lo = mid + 1;
    }
    return NULL;
}
