/* libFuzzer target: model.safetensors.index.json (the shard list of a model).
 *
 * The scratch folder holds the micro config and real shards written once with
 * the project's safetensors writer: model-00001-of-00002.safetensors (embedding
 * and final norm), model-00002-of-00002.safetensors (layer 0), whole.safetensors
 * (everything), and notes.txt (not a safetensors file). The input is the index;
 * q3_model_open opens the folder. A model that opens must hold one mapped file
 * per distinct shard name in weight_map and pass fuzz_check_model. */
#include <cjson/cJSON.h>

#include "fuzz_common.h"
#include "fuzz_model.h"

#define SHARD_DIR "shard_index"

static void shard_setup(void)
{
    const char *cfg = FUZZ_MICRO_CONFIG;
    fuzz_write(fuzz_path(SHARD_DIR, "config.json"), cfg, strlen(cfg));
    q3_status st = fuzz_write_micro_st(fuzz_path(SHARD_DIR, "model-00001-of-00002.safetensors"), 0, 2, 0, Q3_F32);
    if (!st) st = fuzz_write_micro_st(fuzz_path(SHARD_DIR, "model-00002-of-00002.safetensors"), 2,
                                      FUZZ_MICRO_N - 2, 0, Q3_BF16);
    if (!st) st = fuzz_write_micro_st(fuzz_path(SHARD_DIR, "whole.safetensors"), 0, FUZZ_MICRO_N, 1, Q3_F16);
    if (st) {
        fprintf(stderr, "fuzz_shard_index: cannot write the shards: %s\n", q3_last_error());
        abort();
    }
    fuzz_write(fuzz_path(SHARD_DIR, "notes.txt"), "not a safetensors file\n", 23);
}

/* Distinct shard names in the index's weight_map, as the loader should see
 * them; -1 if the index is not one the loader can accept. */
static int shard_count(const char *text)
{
    cJSON *root = cJSON_Parse(text);
    const cJSON *map = cJSON_GetObjectItemCaseSensitive(root, "weight_map");
    int n = -1;
    if (cJSON_IsObject(map)) {
        n = 0;
        const cJSON *e, *f;
        cJSON_ArrayForEach(e, map) {
            if (!cJSON_IsString(e)) {
                n = -1;
                break;
            }
            int seen = 0;
            for (f = map->child; f != e && !seen; f = f->next) seen = !strcmp(f->valuestring, e->valuestring);
            n += !seen;
        }
    }
    cJSON_Delete(root);
    return n;
}

static int fuzz_shard_index(const uint8_t *data, size_t size)
{
    static int ready;
    if (!ready) {
        shard_setup();
        ready = 1;
    }
    fuzz_write(fuzz_path(SHARD_DIR, "model.safetensors.index.json"), data, size);
    q3_model *m = NULL;
    q3_status st = q3_model_open(fuzz_subdir(SHARD_DIR), &m);
    fuzz_note("q3_model_open", st);
    if (st != Q3_OK) {
        FUZZ_CHECK_FAILURE(st);
        FUZZ_CHECK(m == NULL, "a failed open returned a model");
        return 0;
    }
    char *text = fuzz_cstr(data, size);
    int want = shard_count(text);
    free(text);
    FUZZ_CHECK(want >= 1 && m->n_files == want, "opened %d files for %d distinct shard names", m->n_files, want);
    for (int i = 0; i < m->n_files; i++)
        FUZZ_CHECK(m->files[i].map.data != NULL && m->files[i].n_tensors > 0, "shard %d is empty", i);
    fuzz_check_model(m);
    q3_model_close(m);
    return 0;
}

#ifndef FUZZ_NO_MAIN
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) { return fuzz_shard_index(data, size); }
#endif
