/* What a checkpoint is for: a generator, an embedding model (last-token
 * pooling) or a reranker. Qwen3-Embedding and Qwen3-Reranker are
 * Qwen3ForCausalLM checkpoints like any other; only these markers tell them
 * apart:
 *   GGUF:   <arch>.pooling_type, as llama.cpp's converter writes it
 *           (3 = last: embedding, 4 = rank: reranker; others are generators);
 *   folder: 1_Pooling/config.json with "pooling_mode_lasttoken": true (the
 *           sentence-transformers files Qwen3-Embedding ships) -> embedding;
 *           config_sentence_transformers.json with "model_type": "CrossEncoder"
 *           -> reranker; otherwise the folder's own name: one containing
 *           "reranker" or "embedding" (any case), as Qwen's repositories are
 *           named (Qwen3-Reranker-0.6B ships no other marker). */
#include <cjson/cJSON.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "model/gguf.h"
#include "model/model.h"
#include "util/error.h"
#include "util/file.h"

/* The JSON file DIR/name parsed (NULL if absent or unreadable: a marker that is not there). */
static cJSON *read_json(const char *dir, const char *name)
{
    char p[PATH_MAX];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    if (!q3_file_exists(p)) return NULL;
    char *text = NULL;
    size_t len = 0;
    if (q3_read_file(p, 1 << 20, &text, &len)) {
        q3_clear_error();
        return NULL;
    }
    cJSON *j = cJSON_ParseWithLength(text, len);
    free(text);
    return j;
}

static int folder_pooling(const char *dir)
{
    int pooling = Q3_POOLING_NONE;
    cJSON *j = read_json(dir, "1_Pooling/config.json");
    if (j && cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(j, "pooling_mode_lasttoken"))) pooling = Q3_POOLING_LAST;
    cJSON_Delete(j);
    if (pooling) return pooling;
    j = read_json(dir, "config_sentence_transformers.json");
    const cJSON *mt = j ? cJSON_GetObjectItemCaseSensitive(j, "model_type") : NULL;
    if (cJSON_IsString(mt) && !strcmp(mt->valuestring, "CrossEncoder")) pooling = Q3_POOLING_RANK;
    cJSON_Delete(j);
    if (pooling) return pooling;
    /* the folder's own name (its last component, a trailing slash ignored) */
    size_t n = strlen(dir);
    while (n > 1 && dir[n - 1] == '/') n--;
    size_t b = n;
    while (b > 0 && dir[b - 1] != '/') b--;
    char base[256];
    snprintf(base, sizeof base, "%.*s", (int)(n - b < 255 ? n - b : 255), dir + b);
    if (strcasestr(base, "reranker")) return Q3_POOLING_RANK;
    if (strcasestr(base, "embedding")) return Q3_POOLING_LAST;
    return Q3_POOLING_NONE;
}

q3_status q3_model_find_pooling(q3_model *m)
{
    if (!m->gguf) {
        m->cfg.pooling = folder_pooling(m->path);
        return Q3_OK;
    }
    const char *arch = NULL;
    if (q3_gguf_get_str(m->gguf, "general.architecture", &arch)) return Q3_ERR_FORMAT; /* checked at load: not reached */
    char key[96];
    snprintf(key, sizeof key, "%s.pooling_type", arch);
    m->cfg.pooling = Q3_POOLING_NONE;
    if (!q3_gguf_find(m->gguf, key)) return Q3_OK;
    uint32_t t;
    q3_status st = q3_gguf_get_u32(m->gguf, key, &t);
    if (st) return st;
    m->cfg.pooling = t == Q3_POOLING_LAST || t == Q3_POOLING_RANK ? (int)t : Q3_POOLING_NONE;
    return Q3_OK;
}
