/* libFuzzer target: a .safetensors file.
 *
 * The input is the whole file. It goes through q3_safetensors_open and then, as
 * the model.safetensors of a folder with a micro Qwen3 config, through
 * q3_model_open. A file the reader accepts must describe itself consistently:
 *   - one tensor per header entry (bar __metadata__), with the entry's dtype and shape;
 *   - each tensor's bytes are [8 + header + begin, 8 + header + end) of the file,
 *     inside the mapping, and end - begin == dtype size x numel;
 *   - no two non-empty tensors share a byte;
 *   - q3_safetensors_find finds each tensor by its name.
 * A model that opens passes fuzz_check_model (shapes against the config, views
 * inside the mapped file). */
#include <cjson/cJSON.h>

#include "fuzz_common.h"
#include "fuzz_model.h"
#include "model/safetensors.h"

typedef struct st_span {
    uint64_t begin, end;
} st_span;

static int st_cmp_span(const void *a, const void *b)
{
    const st_span *x = a, *y = b;
    return x->begin < y->begin ? -1 : x->begin > y->begin;
}

static int st_dtype(const char *s)
{
    if (!strcmp(s, "F32")) return Q3_F32;
    if (!strcmp(s, "F16")) return Q3_F16;
    if (!strcmp(s, "BF16")) return Q3_BF16;
    return -1;
}

/* Re-reads the header of an accepted file and compares it with f. */
static void st_check_accepted(const q3_safetensors *f, const uint8_t *data, size_t size)
{
    FUZZ_CHECK(size >= 8 && f->map.size == size, "mapping of %zu bytes for a %zu-byte file", f->map.size, size);
    if (size < 8) return;
    uint64_t hlen = fuzz_le64(data);
    FUZZ_CHECK(hlen <= size - 8, "accepted a header length %llu past the end", (unsigned long long)hlen);
    if (hlen > size - 8) return;
    cJSON *h = cJSON_ParseWithLength((const char *)data + 8, (size_t)hlen);
    FUZZ_CHECK(cJSON_IsObject(h), "accepted a header that is not a JSON object");
    if (!cJSON_IsObject(h)) {
        cJSON_Delete(h);
        return;
    }
    int entries = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, h) entries += strcmp(e->string, "__metadata__") != 0;
    FUZZ_CHECK(f->n_tensors == entries, "%d tensors for %d header entries", f->n_tensors, entries);

    size_t data_start = 8 + (size_t)hlen, data_len = size - data_start;
    const uint8_t *base = f->map.data;
    st_span *spans = calloc((size_t)f->n_tensors + 1, sizeof *spans);
    int n_spans = 0;
    for (int i = 0; i < f->n_tensors; i++) {
        const q3_tensor *t = &f->tensors[i];
        FUZZ_CHECK(memchr(t->name, 0, sizeof t->name) != NULL, "tensor %d: name not terminated", i);
        FUZZ_CHECK(q3_safetensors_find(f, t->name) == t, "tensor \"%s\": find returns another", t->name);
        const cJSON *ent = cJSON_GetObjectItemCaseSensitive(h, t->name);
        FUZZ_CHECK(cJSON_IsObject(ent), "tensor \"%s\" has no header entry", t->name);
        if (!cJSON_IsObject(ent)) continue;
        const cJSON *dt = cJSON_GetObjectItemCaseSensitive(ent, "dtype");
        const cJSON *sh = cJSON_GetObjectItemCaseSensitive(ent, "shape");
        const cJSON *off = cJSON_GetObjectItemCaseSensitive(ent, "data_offsets");
        FUZZ_CHECK(cJSON_IsString(dt) && st_dtype(dt->valuestring) == (int)t->dtype, "tensor \"%s\": dtype differs",
                   t->name);
        FUZZ_CHECK(cJSON_IsArray(sh) && cJSON_GetArraySize(sh) == t->ndim && t->ndim <= Q3_MAX_DIMS,
                   "tensor \"%s\": ndim differs", t->name);
        size_t numel = 1;
        for (int d = 0; d < t->ndim && d < Q3_MAX_DIMS; d++) {
            const cJSON *x = cJSON_GetArrayItem(sh, d);
            FUZZ_CHECK(cJSON_IsNumber(x) && t->shape[d] >= 0 && x->valuedouble == (double)t->shape[d],
                       "tensor \"%s\": shape[%d] differs", t->name, d);
            FUZZ_CHECK(t->shape[d] == 0 || numel <= SIZE_MAX / (size_t)t->shape[d], "tensor \"%s\": numel overflows",
                       t->name);
            numel *= (size_t)t->shape[d];
        }
        FUZZ_CHECK(numel == q3_tensor_numel(t), "tensor \"%s\": numel differs", t->name);
        size_t esz = q3_dtype_block_bytes(t->dtype);
        FUZZ_CHECK(numel <= SIZE_MAX / esz && t->nbytes == numel * esz,
                   "tensor \"%s\": %zu bytes for dtype %s x %zu elements", t->name, t->nbytes,
                   q3_dtype_name(t->dtype), numel);
        FUZZ_CHECK(cJSON_IsArray(off) && cJSON_GetArraySize(off) == 2, "tensor \"%s\": data_offsets", t->name);
        double b = cJSON_GetArrayItem(off, 0)->valuedouble, en = cJSON_GetArrayItem(off, 1)->valuedouble;
        FUZZ_CHECK(b >= 0 && en >= b && en <= (double)data_len, "tensor \"%s\": offsets [%.0f, %.0f] outside %zu",
                   t->name, b, en, data_len);
        if (!(b >= 0 && en >= b && en <= (double)data_len)) continue;
        uint64_t bi = (uint64_t)b, ei = (uint64_t)en;
        FUZZ_CHECK((const uint8_t *)t->data == base + data_start + bi, "tensor \"%s\": data pointer is not the offset",
                   t->name);
        FUZZ_CHECK(ei - bi == t->nbytes, "tensor \"%s\": offsets span %llu bytes, nbytes %zu", t->name,
                   (unsigned long long)(ei - bi), t->nbytes);
        /* Touch every byte, and compare with the input (the mapping is the file). */
        FUZZ_CHECK(t->nbytes == 0 || !memcmp(t->data, data + data_start + bi, t->nbytes),
                   "tensor \"%s\": bytes differ from the file", t->name);
        if (t->nbytes) spans[n_spans++] = (st_span){bi, ei};
    }
    qsort(spans, (size_t)n_spans, sizeof *spans, st_cmp_span);
    uint64_t max_end = 0;
    for (int i = 0; i < n_spans; i++) {
        FUZZ_CHECK(i == 0 || spans[i].begin >= max_end, "accepted overlapping tensors: [%llu, %llu) starts before %llu",
                   (unsigned long long)spans[i].begin, (unsigned long long)spans[i].end,
                   (unsigned long long)max_end);
        if (spans[i].end > max_end) max_end = spans[i].end;
    }
    free(spans);
    cJSON_Delete(h);
}

static int fuzz_safetensors(const uint8_t *data, size_t size)
{
    static int ready;
    if (!ready) {
        const char *cfg = FUZZ_MICRO_CONFIG;
        fuzz_write(fuzz_path("safetensors", "config.json"), cfg, strlen(cfg));
        ready = 1;
    }
    const char *file = fuzz_path("safetensors", "model.safetensors");
    fuzz_write(file, data, size);

    q3_safetensors f;
    q3_status st = q3_safetensors_open(file, &f);
    fuzz_note("q3_safetensors_open", st);
    if (st == Q3_OK) {
        st_check_accepted(&f, data, size);
        q3_safetensors_close(&f);
    } else {
        FUZZ_CHECK_FAILURE(st);
        FUZZ_CHECK(f.tensors == NULL && f.n_tensors == 0 && f.map.data == NULL, "a failed open left state behind");
    }

    q3_model *m = NULL;
    st = q3_model_open(fuzz_subdir("safetensors"), &m);
    fuzz_note("q3_model_open", st);
    if (st == Q3_OK) {
        fuzz_check_model(m);
        q3_model_close(m);
    } else {
        FUZZ_CHECK_FAILURE(st);
        FUZZ_CHECK(m == NULL, "a failed model open returned a model");
    }
    return 0;
}

#ifndef FUZZ_NO_MAIN
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) { return fuzz_safetensors(data, size); }
#endif
