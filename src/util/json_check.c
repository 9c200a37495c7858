#include "util/json_check.h"

#include <stdlib.h>
#include <string.h>

static int by_name(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* An object's repeated key, or NULL. */
static const char *object_duplicate(const cJSON *obj)
{
    size_t n = 0;
    for (const cJSON *c = obj->child; c; c = c->next) n++;
    if (n < 2) return NULL;
    const char **names = n > 8 ? malloc(n * sizeof *names) : NULL;
    if (!names) { /* small objects (or no memory for the sort): pairwise */
        for (const cJSON *a = obj->child; a; a = a->next)
            for (const cJSON *b = a->next; b; b = b->next)
                if (a->string && b->string && !strcmp(a->string, b->string)) return a->string;
        return NULL;
    }
    size_t k = 0;
    for (const cJSON *c = obj->child; c; c = c->next) names[k++] = c->string ? c->string : "";
    qsort(names, n, sizeof *names, by_name);
    const char *dup = NULL;
    for (size_t i = 1; i < n && !dup; i++)
        if (!strcmp(names[i - 1], names[i])) dup = names[i];
    free(names);
    return dup;
}

/* Recursion is bounded by cJSON's nesting limit (CJSON_NESTING_LIMIT, 1000). */
const char *q3_json_duplicate_key(const cJSON *node)
{
    if (!node) return NULL;
    if (cJSON_IsObject(node)) {
        const char *dup = object_duplicate(node);
        if (dup) return dup;
    }
    if (cJSON_IsObject(node) || cJSON_IsArray(node))
        for (const cJSON *c = node->child; c; c = c->next) {
            const char *dup = q3_json_duplicate_key(c);
            if (dup) return dup;
        }
    return NULL;
}
