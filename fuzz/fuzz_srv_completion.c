/* libFuzzer target: a POST /v1/completions body through srv_parse_completion
 * (a string prompt tokenized, or a list of token ids taken as they are).
 * Checks: fuzz/fuzz_srv.h; besides, an accepted list of ids is the prompt
 * unchanged. */
#include "fuzz_srv.h"

static int fuzz_srv_completion(const uint8_t *data, size_t size)
{
    srv_job *j = NULL;
    if (srv_fuzz_run(srv_parse_completion, SRV_COMPLETION, data, size, &j) || !j) return 0;
    cJSON *root = cJSON_ParseWithLength((const char *)data, size);
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(root, "prompt");
    if (cJSON_IsArray(p) && cJSON_IsNumber(p->child)) {
        int k = 0, same = cJSON_GetArraySize(p) == j->req.n_prompt;
        for (const cJSON *t = p->child; t && same; t = t->next, k++) same = t->valuedouble == (double)j->req.prompt[k];
        FUZZ_CHECK(same, "the job's prompt is not the request's ids");
    }
    cJSON_Delete(root);
    srv_job_unref(j);
    return 0;
}

#ifndef FUZZ_NO_MAIN
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) { return fuzz_srv_completion(data, size); }
#endif
