/* Reading golden cases (tests/data/golden/<model>/cases/<name>.json + .logits.f32). */
#ifndef Q3_TEST_GOLDEN_H
#define Q3_TEST_GOLDEN_H

#include <cjson/cJSON.h>
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct golden_case {
    char name[128];
    int32_t *tokens;
    int n_tokens;
    int decode_from; /* -1 if none */
    int *rows;
    int n_rows;
    int vocab;
    float *logits;   /* [n_rows][vocab] */
} golden_case;

static inline char *golden_slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)n + 1);
    if (fread(b, 1, (size_t)n, f) != (size_t)n) { free(b); fclose(f); return NULL; }
    b[n] = 0;
    fclose(f);
    if (len) *len = (size_t)n;
    return b;
}

static inline void golden_free(golden_case *c)
{
    free(c->tokens);
    free(c->rows);
    free(c->logits);
    memset(c, 0, sizeof *c);
}

/* Loads <dir>/cases/<name>.json and its logits; returns 0 on success. */
static inline int golden_load(const char *dir, const char *name, golden_case *c)
{
    memset(c, 0, sizeof *c);
    char p[512];
    snprintf(c->name, sizeof c->name, "%s", name);
    snprintf(p, sizeof p, "%s/cases/%s.json", dir, name);
    char *text = golden_slurp(p, NULL);
    if (!text) return -1;
    cJSON *j = cJSON_Parse(text);
    free(text);
    if (!j) return -1;
    cJSON *toks = cJSON_GetObjectItem(j, "tokens"), *rows = cJSON_GetObjectItem(j, "rows");
    cJSON *df = cJSON_GetObjectItem(j, "decode_from");
    c->n_tokens = cJSON_GetArraySize(toks);
    c->n_rows = cJSON_GetArraySize(rows);
    c->vocab = cJSON_GetObjectItem(j, "vocab")->valueint;
    c->decode_from = cJSON_IsNumber(df) ? df->valueint : -1;
    c->tokens = malloc((size_t)c->n_tokens * sizeof *c->tokens);
    c->rows = malloc((size_t)c->n_rows * sizeof *c->rows);
    for (int i = 0; i < c->n_tokens; i++) c->tokens[i] = cJSON_GetArrayItem(toks, i)->valueint;
    for (int i = 0; i < c->n_rows; i++) c->rows[i] = cJSON_GetArrayItem(rows, i)->valueint;
    cJSON_Delete(j);
    snprintf(p, sizeof p, "%s/cases/%s.logits.f32", dir, name);
    size_t len;
    c->logits = (float *)golden_slurp(p, &len);
    if (!c->logits || len != (size_t)c->n_rows * (size_t)c->vocab * 4) { golden_free(c); return -1; }
    return 0;
}

/* Lists case names in <dir>/cases (sorted); returns the count. */
static inline int golden_list(const char *dir, char names[][128], int max)
{
    char p[512];
    snprintf(p, sizeof p, "%s/cases", dir);
    DIR *d = opendir(p);
    if (!d) return 0;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) && n < max) {
        size_t l = strlen(e->d_name);
        if (l > 5 && !strcmp(e->d_name + l - 5, ".json")) {
            snprintf(names[n], 128, "%.*s", (int)(l - 5), e->d_name);
            n++;
        }
    }
    closedir(d);
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && strcmp(names[j - 1], names[j]) > 0; j--) {
            char t[128];
            memcpy(t, names[j], 128);
            memcpy(names[j], names[j - 1], 128);
            memcpy(names[j - 1], t, 128);
        }
    return n;
}

static inline int golden_argmax(const float *x, int n)
{
    int best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

/* Gap between the two largest values. */
static inline float golden_top2_gap(const float *x, int n)
{
    float a = -1e30f, b = -1e30f;
    for (int i = 0; i < n; i++) {
        if (x[i] > a) { b = a; a = x[i]; } else if (x[i] > b) b = x[i];
    }
    return a - b;
}

#endif
