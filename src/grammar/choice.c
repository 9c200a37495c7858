/* choice: the output is one of a list of strings (vLLM's guided_choice). */
#include <cjson/cJSON.h>
#include <string.h>

#include "grammar/frontends.h"
#include "util/error.h"

q3_status choice_compile(gb *b, const char *text, size_t len, int *root)
{
    cJSON *a = cJSON_ParseWithLength(text, len);
    if (!a || !cJSON_IsArray(a) || !cJSON_GetArraySize(a)) {
        cJSON_Delete(a);
        return q3_fail(Q3_ERR_INVALID, "a choice is a non-empty JSON array of strings");
    }
    int r = gb_rule(b, "root", NULL);
    const cJSON *s;
    cJSON_ArrayForEach(s, a) {
        if (!cJSON_IsString(s)) {
            cJSON_Delete(a);
            return q3_fail(Q3_ERR_INVALID, "a choice is a non-empty JSON array of strings");
        }
        gb_alt(b, r);
        gb_lit(b, r, s->valuestring, strlen(s->valuestring));
    }
    cJSON_Delete(a);
    *root = r;
    return gb_error(b) ? q3_fail(gb_error(b), "out of memory") : Q3_OK;
}
