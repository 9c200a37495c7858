/* q3 compare's work: what quantizing the weights (or the KV cache) costs in accuracy.
 * For each type the model is quantized (through a temporary GGUF), and token
 * sequences are run through both it and the model as given; the report has the
 * KL divergence of the next-token distribution and the top-1 agreement. With
 * --kv, the model as given runs with each KV cache type against a reference
 * KV cache type instead. */
#include <cjson/cJSON.h>
#include <dirent.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "tools/compare.h"
#include "tools/convert.h"
#include "util/error.h"
#include "util/file.h"

#define DEFAULT_CASES Q3_COMPARE_DEFAULT_CASES
#define MAX_TYPES 8

typedef struct seqs {
    int32_t **ids;
    size_t *lens;
    size_t n, cap;
} seqs;

static void seqs_free(seqs *s)
{
    for (size_t i = 0; i < s->n; i++) free(s->ids[i]);
    free(s->ids);
    free(s->lens);
}

static int same_seq(const seqs *s, const int32_t *ids, size_t n)
{
    for (size_t i = 0; i < s->n; i++)
        if (s->lens[i] == n && !memcmp(s->ids[i], ids, n * sizeof *ids)) return 1;
    return 0;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* Reads the "tokens" of every .json file in dir, sorted by file name, without duplicates. */
static q3_status read_cases(const char *dir, int vocab, seqs *s)
{
    DIR *d = opendir(dir);
    if (!d) return q3_fail(Q3_ERR_IO, "%s: cannot open the cases folder", dir);
    char *names[4096];
    size_t n_names = 0;
    struct dirent *e;
    while ((e = readdir(d)) && n_names < 4096) {
        size_t l = strlen(e->d_name);
        char *name = l > 5 && !strcmp(e->d_name + l - 5, ".json") ? strdup(e->d_name) : NULL;
        if (name) names[n_names++] = name;
    }
    closedir(d);
    qsort(names, n_names, sizeof names[0], cmp_str);
    q3_status rc = Q3_OK;
    for (size_t k = 0; k < n_names && !rc; k++) {
        char p[PATH_MAX];
        snprintf(p, sizeof p, "%s/%s", dir, names[k]);
        char *text;
        if ((rc = q3_read_file(p, 64u << 20, &text, NULL))) break;
        cJSON *j = cJSON_Parse(text);
        free(text);
        const cJSON *toks = cJSON_GetObjectItemCaseSensitive(j, "tokens"), *t;
        if (!cJSON_IsArray(toks)) {
            cJSON_Delete(j);
            continue; /* not a case file */
        }
        size_t n = (size_t)cJSON_GetArraySize(toks), i = 0;
        int32_t *ids = malloc((n ? n : 1) * sizeof *ids);
        if (!ids) {
            cJSON_Delete(j);
            rc = q3_fail(Q3_ERR_NOMEM, "out of memory reading %s", p);
            break;
        }
        cJSON_ArrayForEach(t, toks) {
            if (!cJSON_IsNumber(t) || t->valuedouble < 0 || t->valuedouble >= vocab) {
                rc = q3_fail(Q3_ERR_FORMAT, "%s: tokens[%zu] is not an id below the model's vocabulary (%d)", p, i,
                             vocab);
                break;
            }
            ids[i++] = t->valueint;
        }
        cJSON_Delete(j);
        if (rc || !n || same_seq(s, ids, n)) {
            free(ids);
            continue;
        }
        if (s->n == s->cap) {
            size_t cap = s->cap ? 2 * s->cap : 16;
            int32_t **ids_grown = realloc(s->ids, cap * sizeof *s->ids);
            if (ids_grown) s->ids = ids_grown;
            size_t *lens_grown = ids_grown ? realloc(s->lens, cap * sizeof *s->lens) : NULL;
            if (lens_grown) s->lens = lens_grown;
            if (!ids_grown || !lens_grown) {
                free(ids);
                rc = q3_fail(Q3_ERR_NOMEM, "out of memory reading %s", dir);
                break;
            }
            s->cap = cap;
        }
        s->ids[s->n] = ids;
        s->lens[s->n++] = n;
    }
    for (size_t k = 0; k < n_names; k++) free(names[k]);
    if (!rc && !s->n) rc = q3_fail(Q3_ERR_FORMAT, "%s: no *.json file with \"tokens\"", dir);
    return rc;
}

q3_status q3_compare_run(const q3_compare_opts *o, int *usage)
{
    const char *model = o->model, *types_arg = o->types ? o->types : "q8_0,q4_0", *cases = o->cases;
    const char *backend = o->backend, *kv_arg = o->kv, *kv_ref_arg = o->kv_ref ? o->kv_ref : "f16";
    *usage = 1; /* until the options are checked */
    /* the ref unit's prefill reads a chunk's own K/V unrounded: KV types are compared on cpu */
    if (!backend) backend = kv_arg ? "cpu" : "ref";
    int kv_ref = q3_dtype_from_name(kv_ref_arg);
    if (kv_ref < 0 || kv_ref > Q3_Q8_0)
        return q3_fail(Q3_ERR_INVALID, "--kv-ref: \"%s\" is not one of f32, f16, bf16, q8_0", kv_ref_arg);
    q3_dtype types[MAX_TYPES];
    size_t n_types = 0;
    char list[256];
    snprintf(list, sizeof list, "%s", kv_arg ? kv_arg : types_arg);
    for (char *save, *t = strtok_r(list, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        int d = q3_dtype_from_name(t);
        if (kv_arg && (d < 0 || d > Q3_Q8_0))
            return q3_fail(Q3_ERR_INVALID, "--kv: \"%s\" is not one of f32, f16, bf16, q8_0", t);
        if (!kv_arg && (d < 0 || d == Q3_F32))
            return q3_fail(Q3_ERR_INVALID, "--types: \"%s\" is not one of f16, bf16, q8_0, q4_0", t);
        if (n_types == MAX_TYPES) return q3_fail(Q3_ERR_INVALID, "--types: at most %d types", MAX_TYPES);
        types[n_types++] = (q3_dtype)d;
    }
    if (!n_types) return q3_fail(Q3_ERR_INVALID, "%s is empty", kv_arg ? "--kv" : "--types");
    *usage = 0;

    char cases_dir[PATH_MAX];
    if (cases) snprintf(cases_dir, sizeof cases_dir, "%s", cases);
    else {
        snprintf(cases_dir, sizeof cases_dir, "%s/cases", model);
        if (!q3_is_dir(cases_dir)) { /* beside the binary (build/q3 -> the source tree), never the cwd */
            char exe[PATH_MAX];
            ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
            char *slash = n > 0 ? (exe[n] = 0, strrchr(exe, '/')) : NULL;
            if (slash) *slash = 0;
            snprintf(cases_dir, sizeof cases_dir, "%s/../%s", slash ? exe : ".", DEFAULT_CASES);
            if (!q3_is_dir(cases_dir))
                return q3_fail(Q3_ERR_IO, "no token sequences: pass --cases DIR (MODEL/cases and %s are absent)",
                               cases_dir);
        }
    }

    q3_model *m;
    q3_status rc = q3_model_open(model, &m);
    if (rc) return rc;
    seqs s = {0};
    rc = read_cases(cases_dir, m->cfg.vocab_size, &s);
    if (rc) {
        q3_model_close(m);
        seqs_free(&s);
        return rc;
    }
    size_t positions = 0;
    for (size_t i = 0; i < s.n; i++) positions += s.lens[i];
    printf("model %s: %d layers, hidden %d, vocab %d, weights %s (%.1f MB)\n", model, m->cfg.n_layers, m->cfg.dim,
           m->cfg.vocab_size, q3_dtype_name(m->w.layers[0].wq->dtype), (double)q3_model_weight_bytes(m) / 1e6);
    printf("%zu sequences from %s, %zu positions, unit %s", s.n, cases_dir, positions, backend);
    if (kv_arg) printf(", KV cache types against the %s cache", q3_dtype_name((q3_dtype)kv_ref));
    printf("\n\n");

    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    q3_quant_report rep[MAX_TYPES];
    q3_status st = kv_arg ? q3_convert_compare_kv(m, (q3_dtype)kv_ref, types, n_types, (const int32_t *const *)s.ids,
                                                  s.lens, s.n, backend, rep)
                          : q3_convert_compare(m, types, n_types, (const int32_t *const *)s.ids, s.lens, s.n, backend, rep);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    if (st) {
        rc = st;
    } else {
        printf("%-6s %10s %12s %12s %12s %14s\n", kv_arg ? "KV" : "type", kv_arg ? "KB/token" : "weights MB",
               "KL mean", "KL max", "top-1 agree", "max |dlogit|");
        for (size_t k = 0; k < n_types; k++)
            printf("%-6s %10.1f %12.3e %12.3e %11.2f%% %14.4f\n", q3_dtype_name(rep[k].type),
                   (double)rep[k].weight_bytes / (kv_arg ? 1e3 : 1e6), rep[k].kl_mean, rep[k].kl_max,
                   100.0 * rep[k].top1_agree, rep[k].max_abs_logit);
        double secs = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9;
        if (kv_arg)
            printf("\n(KL in nats, of the next-token distribution with each KV cache type from the one with the %s "
                   "cache; %.1f s)\n",
                   q3_dtype_name((q3_dtype)kv_ref), secs);
        else
            printf("\n(KL in nats, of the %s model's next-token distribution from MODEL's; %.1f s)\n", "quantized", secs);
    }
    seqs_free(&s);
    q3_model_close(m);
    return rc;
}
