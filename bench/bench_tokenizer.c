/* Tokenizer speed: load time of tokenizer.json, and encode MB/s on ~1 MB of mixed text
 * (the golden corpus, repeated), next to the reference (HF tokenizers through Node,
 * bench/tokenizer/bench.js) run on the same text in the same run.
 *
 *   build/bench/bench_tokenizer [--tokenizer PATH] [--mb N] [--repeats R] [--no-ref]
 *
 * Run from the repository root. MB = 10^6 bytes of UTF-8 input. The reference needs
 * `cd bench/tokenizer && npm install` once (node_modules is not in git). */
#include <cjson/cJSON.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "text/tokenizer.h"
#include "util/file.h"

#define CORPUS "tests/data/tokenizer/golden_public.jsonl"
#define TEXT_FILE "build/bench/tokenizer_bench_text.txt"
#define REF_SCRIPT "bench/tokenizer/bench.js"
#define REF_PACKAGE "bench/tokenizer/node_modules/@anush008/tokenizers"

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* FNV-1a over the ids as little-endian uint32 (bench.js computes the same). */
static uint32_t ids_hash(const int32_t *ids, size_t n)
{
    uint32_t h = 0x811c9dc5u;
    for (size_t i = 0; i < n; i++)
        for (int k = 0; k < 4; k++) {
            h ^= ((uint32_t)ids[i] >> (8 * k)) & 0xff;
            h *= 0x01000193u;
        }
    return h;
}

/* The corpus lines (texts), each NUL-terminated; returns how many. */
static size_t read_corpus(char ***lines_out)
{
    char *buf;
    size_t len, n = 0;
    if (q3_read_file(CORPUS, 1 << 26, &buf, &len) != Q3_OK) {
        fprintf(stderr, "bench_tokenizer: %s\n", q3_last_error());
        exit(1);
    }
    char **lines = NULL;
    for (char *line = strtok(buf, "\n"); line; line = strtok(NULL, "\n")) {
        cJSON *row = cJSON_Parse(line);
        const cJSON *text = cJSON_GetObjectItemCaseSensitive(row, "text");
        if (cJSON_IsString(text) && text->valuestring[0]) {
            lines = realloc(lines, (n + 1) * sizeof *lines);
            lines[n++] = strdup(text->valuestring);
        }
        cJSON_Delete(row);
    }
    free(buf);
    *lines_out = lines;
    return n;
}

typedef struct ref_result {
    int ok;
    double load_ms, encode_ms_best, encode_ms_median, encode_ms_cold;
    size_t n_ids;
    uint32_t hash;
} ref_result;

static ref_result run_reference(const char *tokenizer, int repeats)
{
    ref_result r = {0};
    struct stat st;
    if (stat(REF_PACKAGE, &st) != 0) {
        printf("reference: %s is missing (cd bench/tokenizer && npm install)\n", REF_PACKAGE);
        return r;
    }
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "node %s '%s' %s %d", REF_SCRIPT, tokenizer, TEXT_FILE, repeats);
    FILE *p = popen(cmd, "r");
    if (!p) return r;
    char line[256];
    int got = 0;
    while (fgets(line, sizeof line, p)) {
        char key[64];
        double v;
        if (sscanf(line, "%63s %lf", key, &v) != 2) continue;
        if (!strcmp(key, "load_ms")) r.load_ms = v, got++;
        else if (!strcmp(key, "encode_ms_best")) r.encode_ms_best = v, got++;
        else if (!strcmp(key, "encode_ms_median")) r.encode_ms_median = v, got++;
        else if (!strcmp(key, "encode_ms_cold")) r.encode_ms_cold = v, got++;
        else if (!strcmp(key, "n_ids")) r.n_ids = (size_t)v, got++;
        else if (!strcmp(key, "ids_hash")) r.hash = (uint32_t)v, got++;
    }
    r.ok = pclose(p) == 0 && got == 6;
    if (!r.ok) printf("reference: `%s` failed\n", cmd);
    return r;
}

int main(int argc, char **argv)
{
    const char *tokenizer = "tests/data/golden/e2e/tokenizer.json";
    double mb = 1.0;
    int repeats = 7, with_ref = 1;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--tokenizer") && i + 1 < argc) tokenizer = argv[++i];
        else if (!strcmp(argv[i], "--mb") && i + 1 < argc) mb = atof(argv[++i]);
        else if (!strcmp(argv[i], "--repeats") && i + 1 < argc) repeats = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--no-ref")) with_ref = 0;
        else {
            fprintf(stderr, "usage: %s [--tokenizer PATH] [--mb N] [--repeats R] [--no-ref]\n", argv[0]);
            return 2;
        }
    }
    if (repeats < 1) repeats = 1;

    /* ---- load ---- */
    enum { LOADS = 9 };
    double load[LOADS];
    q3_tokenizer *tok = NULL;
    for (int r = 0; r < LOADS; r++) {
        q3_tokenizer *t;
        double t0 = now_ms();
        if (q3_tokenizer_load(tokenizer, &t) != Q3_OK) {
            fprintf(stderr, "bench_tokenizer: %s\n", q3_last_error());
            return 1;
        }
        load[r] = now_ms() - t0;
        if (tok) q3_tokenizer_free(tok);
        tok = t;
    }
    qsort(load, LOADS, sizeof load[0], cmp_double);

    /* ---- the text: corpus lines joined by newlines, repeated up to the size ---- */
    char **lines;
    size_t n_lines = read_corpus(&lines);
    size_t target = (size_t)(mb * 1e6), len = 0, cap = target + 65536;
    char *text = malloc(cap);
    size_t n_calls_lines = 0;
    while (len < target) {
        for (size_t i = 0; i < n_lines && len < target; i++) {
            size_t l = strlen(lines[i]);
            if (len + l + 1 > cap) break;
            memcpy(text + len, lines[i], l);
            len += l;
            text[len++] = '\n';
            n_calls_lines++;
        }
    }
    mkdir("build", 0777);
    mkdir("build/bench", 0777);
    FILE *f = fopen(TEXT_FILE, "wb");
    if (!f || fwrite(text, 1, len, f) != len) {
        fprintf(stderr, "bench_tokenizer: cannot write %s\n", TEXT_FILE);
        return 1;
    }
    fclose(f);

    /* ---- encode the whole text in one call ---- */
    double *enc = malloc((size_t)repeats * sizeof *enc);
    q3_tokens ids = {0};
    double cold = 0;
    for (int r = -1; r < repeats; r++) { /* r = -1: the first call, with an empty piece cache */
        ids.n = 0;
        double t0 = now_ms();
        if (q3_tokenizer_encode_append(tok, text, len, 0, &ids) != Q3_OK) {
            fprintf(stderr, "bench_tokenizer: %s\n", q3_last_error());
            return 1;
        }
        if (r >= 0) enc[r] = now_ms() - t0;
        else cold = now_ms() - t0;
    }
    qsort(enc, (size_t)repeats, sizeof enc[0], cmp_double);
    uint32_t hash = ids_hash(ids.ids, ids.n);

    /* ---- encode line by line (many short calls: per-call overhead, no shared cache) ---- */
    double per_line = 1e30;
    for (int r = 0; r < 3; r++) {
        q3_tokens t = {0};
        double t0 = now_ms();
        size_t done = 0;
        for (size_t i = 0; done < n_calls_lines; i = (i + 1) % n_lines, done++)
            q3_tokenizer_encode_append(tok, lines[i], strlen(lines[i]), 0, &t);
        double dt = now_ms() - t0;
        if (dt < per_line) per_line = dt;
        q3_tokens_free(&t);
    }

    double mbs_best = len / 1e6 / (enc[0] / 1e3), mbs_median = len / 1e6 / (enc[repeats / 2] / 1e3);
    printf("q3 tokenizer (%s)\n", tokenizer);
    printf("  load             %7.1f ms best, %7.1f ms median of %d\n", load[0], load[LOADS / 2], LOADS);
    printf("  encode, 1 call   %7.2f MB/s best, %7.2f MB/s median of %d  (%zu bytes -> %zu ids, %.2f ms)\n",
           mbs_best, mbs_median, repeats, len, ids.n, enc[0]);
    printf("  encode, cold     %7.2f MB/s  (the first call after loading: empty piece cache)\n",
           len / 1e6 / (cold / 1e3));
    printf("  encode, per line %7.2f MB/s  (%zu calls)\n", len / 1e6 / (per_line / 1e3), n_calls_lines);

    if (with_ref) {
        ref_result ref = run_reference(tokenizer, repeats);
        if (ref.ok) {
            double ref_best = len / 1e6 / (ref.encode_ms_best / 1e3), ref_median = len / 1e6 / (ref.encode_ms_median / 1e3);
            printf("reference: HF tokenizers via @anush008/tokenizers (node)\n");
            printf("  load             %7.1f ms\n", ref.load_ms);
            printf("  encode, 1 call   %7.2f MB/s best, %7.2f MB/s median of %d  (%zu ids)\n", ref_best,
                   ref_median, repeats, ref.n_ids);
            printf("  encode, cold     %7.2f MB/s\n", len / 1e6 / (ref.encode_ms_cold / 1e3));
            printf("same ids as the reference: %s\n",
                   ref.n_ids == ids.n && ref.hash == hash ? "yes" : "NO (count or hash differs)");
            printf("speed-up: encode %.1fx (best) %.1fx (median) %.1fx (cold); load %.1fx\n", mbs_best / ref_best,
                   mbs_median / ref_median, ref.encode_ms_cold / cold, ref.load_ms / load[LOADS / 2]);
        }
    }

    q3_tokens_free(&ids);
    for (size_t i = 0; i < n_lines; i++) free(lines[i]);
    free(lines);
    free(text);
    free(enc);
    q3_tokenizer_free(tok);
    return 0;
}
