/* A JSON Schema checker for the subset q3's schemas use: type, required,
 * properties, items, enum (strings), minimum, minItems, and $ref to
 * "#/$defs/NAME". Returns 0 if valid, else writes where and why into err. */
#ifndef Q3_TEST_SCHEMA_H
#define Q3_TEST_SCHEMA_H

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

static inline int schema_type_ok(const cJSON *v, const char *type)
{
    if (!strcmp(type, "object")) return cJSON_IsObject(v);
    if (!strcmp(type, "array")) return cJSON_IsArray(v);
    if (!strcmp(type, "string")) return cJSON_IsString(v);
    if (!strcmp(type, "boolean")) return cJSON_IsBool(v);
    if (!strcmp(type, "number")) return cJSON_IsNumber(v);
    if (!strcmp(type, "integer")) return cJSON_IsNumber(v) && v->valuedouble == floor(v->valuedouble);
    if (!strcmp(type, "null")) return cJSON_IsNull(v);
    return 0;
}

static inline int schema_check(const cJSON *root_schema, const cJSON *s, const cJSON *v, const char *path,
                               char *err, size_t errlen)
{
    const cJSON *ref = cJSON_GetObjectItem(s, "$ref");
    if (cJSON_IsString(ref) && !strncmp(ref->valuestring, "#/$defs/", 8)) {
        s = cJSON_GetObjectItem(cJSON_GetObjectItem(root_schema, "$defs"), ref->valuestring + 8);
        if (!s) { snprintf(err, errlen, "%s: unresolved $ref %s", path, ref->valuestring); return -1; }
    }
    const cJSON *type = cJSON_GetObjectItem(s, "type");
    if (cJSON_IsString(type) && !schema_type_ok(v, type->valuestring)) {
        snprintf(err, errlen, "%s: expected %s", path, type->valuestring);
        return -1;
    }
    const cJSON *en = cJSON_GetObjectItem(s, "enum");
    if (cJSON_IsArray(en)) {
        int found = 0;
        const cJSON *e;
        cJSON_ArrayForEach(e, en) found |= cJSON_IsString(e) && cJSON_IsString(v) && !strcmp(e->valuestring, v->valuestring);
        if (!found) { snprintf(err, errlen, "%s: value not in enum", path); return -1; }
    }
    const cJSON *mn = cJSON_GetObjectItem(s, "minimum");
    if (cJSON_IsNumber(mn) && cJSON_IsNumber(v) && !(v->valuedouble >= mn->valuedouble)) {
        snprintf(err, errlen, "%s: %g below minimum %g", path, v->valuedouble, mn->valuedouble);
        return -1;
    }
    const cJSON *mi = cJSON_GetObjectItem(s, "minItems");
    if (cJSON_IsNumber(mi) && cJSON_IsArray(v) && cJSON_GetArraySize(v) < mi->valueint) {
        snprintf(err, errlen, "%s: fewer than %d items", path, mi->valueint);
        return -1;
    }
    const cJSON *req = cJSON_GetObjectItem(s, "required");
    if (cJSON_IsArray(req) && cJSON_IsObject(v)) {
        const cJSON *r;
        cJSON_ArrayForEach(r, req) if (!cJSON_GetObjectItemCaseSensitive(v, r->valuestring)) {
            snprintf(err, errlen, "%s: missing required \"%s\"", path, r->valuestring);
            return -1;
        }
    }
    const cJSON *props = cJSON_GetObjectItem(s, "properties");
    if (cJSON_IsObject(props) && cJSON_IsObject(v)) {
        const cJSON *p;
        cJSON_ArrayForEach(p, props) {
            const cJSON *x = cJSON_GetObjectItemCaseSensitive(v, p->string);
            if (!x) continue;
            char sub[512];
            snprintf(sub, sizeof sub, "%s.%s", path, p->string);
            if (schema_check(root_schema, p, x, sub, err, errlen)) return -1;
        }
    }
    const cJSON *items = cJSON_GetObjectItem(s, "items");
    if (cJSON_IsObject(items) && cJSON_IsArray(v)) {
        int i = 0;
        const cJSON *x;
        cJSON_ArrayForEach(x, v) {
            char sub[512];
            snprintf(sub, sizeof sub, "%s[%d]", path, i++);
            if (schema_check(root_schema, items, x, sub, err, errlen)) return -1;
        }
    }
    return 0;
}

static inline int schema_validate(const cJSON *schema, const cJSON *doc, char *err, size_t errlen)
{
    err[0] = 0;
    return schema_check(schema, schema, doc, "$", err, errlen);
}

#endif
