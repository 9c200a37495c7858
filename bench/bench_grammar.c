/* bench_grammar: token-mask and compile times of structured output over the
 * Qwen3 vocabulary, one thread.
 *
 *   build/bench/bench_grammar [TOKENIZER_JSON] [--suite DIR] [--repeats N]
 *                             [--model M [--threads T] [--decode-repeats N]]
 *
 * Schemas: a set of realistic API schemas (nested objects, arrays of objects,
 * enums, numbers with ranges, free strings, formats) each with an instance, and
 * the JSON Schema Test Suite's draft 4 schemas that q3 compiles, each with its
 * valid instances. For each instance a fresh matcher walks its tokens (as the
 * tokenizer splits the compact text), computing the mask before every token:
 * the masks a model's decode would ask for. Cold: without the grammar's
 * shared masks (mask_share.h), every state met for the first time; then the
 * realistic walks again with them: a first walk that fills the table (its
 * own line) and the walks after it (a server's repeated schema). Reports, over those masks,
 * p50 / p99 / max per token (the mask as a bit set by rank, what
 * q3_matcher_apply reads) and the cost of applying it to a row of logits;
 * compile p50 / p99 (schema -> first mask, the vocabulary's tables already
 * built); memory per compiled grammar; and the per-tokenizer tables' build
 * time and bytes.
 *
 * With --model M (a Qwen3 folder or GGUF with the Qwen3 vocabulary): decode
 * throughput constrained (a JSON Schema with two free strings, so the answers
 * run to max_tokens) against unconstrained, at B = 1 and B = 8 sequences, as
 * process CPU time per generated token (the machine is shared: wall time would
 * count other processes), --threads T (default 2). The two runs are open side
 * by side and take turns step by step (64 tokens a sequence, --decode-repeats
 * N pairs of runs, default 3): a slow spell of the machine meets both alike.
 * Printed: the ratio of the sums and the median of the per-step-pair ratios. */
#include <cjson/cJSON.h>
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "grammar/compiled.h"
#include "grammar/vocab.h"
#include "q3.h"

/* The thread's CPU time: the machine these numbers come from is shared, and
 * wall time would count the other processes' turns. */
static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

typedef struct vec {
    double *v;
    size_t n, cap;
} vec;

static void push(vec *a, double x)
{
    if (a->n == a->cap) {
        a->cap = a->cap ? 2 * a->cap : 1024;
        a->v = realloc(a->v, a->cap * sizeof *a->v);
    }
    a->v[a->n++] = x;
}

static int cmpd(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double pct(vec *a, double p)
{
    if (!a->n) return NAN;
    qsort(a->v, a->n, sizeof *a->v, cmpd);
    size_t i = (size_t)(p * (double)(a->n - 1) + 0.5);
    return a->v[i];
}

static const struct {
    const char *name, *schema, *instance;
} realistic[] = {
    {"user profile",
     "{\"type\":\"object\",\"properties\":{\"id\":{\"type\":\"integer\",\"minimum\":1},\"name\":{\"type\":\"string\"},"
     "\"email\":{\"type\":\"string\",\"format\":\"email\"},\"age\":{\"type\":\"integer\",\"minimum\":0,\"maximum\":130},"
     "\"roles\":{\"type\":\"array\",\"items\":{\"enum\":[\"admin\",\"editor\",\"viewer\"]}},"
     "\"active\":{\"type\":\"boolean\"}},\"required\":[\"id\",\"name\",\"email\",\"roles\",\"active\"],\"additionalProperties\":false}",
     "{\"id\": 4821, \"name\": \"Ada Lovelace\", \"email\": \"ada@example.org\", \"age\": 36, \"roles\": [\"admin\", \"viewer\"], \"active\": true}"},
    {"order with line items",
     "{\"type\":\"object\",\"properties\":{\"order_id\":{\"type\":\"string\",\"format\":\"uuid\"},"
     "\"created\":{\"type\":\"string\",\"format\":\"date-time\"},\"items\":{\"type\":\"array\",\"minItems\":1,\"items\":"
     "{\"type\":\"object\",\"properties\":{\"sku\":{\"type\":\"string\",\"pattern\":\"^[A-Z]{3}-[0-9]{4}$\"},"
     "\"qty\":{\"type\":\"integer\",\"minimum\":1,\"maximum\":99},\"price\":{\"type\":\"number\",\"minimum\":0}},"
     "\"required\":[\"sku\",\"qty\",\"price\"],\"additionalProperties\":false}},\"note\":{\"type\":[\"string\",\"null\"]}},"
     "\"required\":[\"order_id\",\"created\",\"items\"],\"additionalProperties\":false}",
     "{\"order_id\": \"123e4567-e89b-12d3-a456-426614174000\", \"created\": \"2025-03-01T10:15:00Z\", \"items\": "
     "[{\"sku\": \"ABC-1234\", \"qty\": 2, \"price\": 19.99}, {\"sku\": \"XYZ-0001\", \"qty\": 1, \"price\": 5}], "
     "\"note\": \"Leave it at the door, please; the bell is broken.\"}"},
    {"sentiment extraction",
     "{\"type\":\"object\",\"properties\":{\"sentiment\":{\"enum\":[\"positive\",\"negative\",\"neutral\",\"mixed\"]},"
     "\"confidence\":{\"type\":\"number\",\"minimum\":0,\"maximum\":1},\"aspects\":{\"type\":\"array\",\"items\":"
     "{\"type\":\"object\",\"properties\":{\"aspect\":{\"type\":\"string\"},\"polarity\":{\"enum\":[\"+\",\"-\",\"0\"]}},"
     "\"required\":[\"aspect\",\"polarity\"],\"additionalProperties\":false},\"maxItems\":8},\"summary\":{\"type\":\"string\","
     "\"maxLength\":200}},\"required\":[\"sentiment\",\"confidence\",\"aspects\",\"summary\"],\"additionalProperties\":false}",
     "{\"sentiment\": \"mixed\", \"confidence\": 0.82, \"aspects\": [{\"aspect\": \"battery life\", \"polarity\": \"+\"}, "
     "{\"aspect\": \"screen glare outdoors\", \"polarity\": \"-\"}], \"summary\": \"Great battery, but the screen is hard "
     "to read in direct sunlight and the case feels cheap.\"}"},
    {"recursive tree (JSON Schema $ref)",
     "{\"$defs\":{\"node\":{\"type\":\"object\",\"properties\":{\"label\":{\"type\":\"string\"},\"weight\":{\"type\":\"integer\","
     "\"minimum\":-1000,\"maximum\":1000},\"children\":{\"type\":\"array\",\"items\":{\"$ref\":\"#/$defs/node\"}}},"
     "\"required\":[\"label\"],\"additionalProperties\":false}},\"$ref\":\"#/$defs/node\"}",
     "{\"label\": \"root\", \"weight\": 10, \"children\": [{\"label\": \"a\", \"children\": [{\"label\": \"a.1\", \"weight\": "
     "-7}]}, {\"label\": \"b\", \"weight\": 999, \"children\": []}]}"},
    {"function call arguments (search)",
     "{\"type\":\"object\",\"properties\":{\"query\":{\"type\":\"string\"},\"filters\":{\"type\":\"object\",\"properties\":"
     "{\"from\":{\"type\":\"string\",\"format\":\"date\"},\"to\":{\"type\":\"string\",\"format\":\"date\"},\"lang\":{\"enum\":"
     "[\"en\",\"de\",\"fr\",\"ja\"]}},\"additionalProperties\":false},\"limit\":{\"type\":\"integer\",\"minimum\":1,\"maximum\":50}},"
     "\"required\":[\"query\"],\"additionalProperties\":false}",
     "{\"query\": \"structured decoding token masks\", \"filters\": {\"from\": \"2024-01-01\", \"to\": \"2025-06-30\", \"lang\": "
     "\"en\"}, \"limit\": 20}"},
    {"any JSON (json_object)", NULL,
     "{\"anything\": [1, 2.5, \"three\", {\"four\": null}], \"nested\": {\"deep\": {\"deeper\": [true, false]}}}"},
};

static q3_tokenizer *tok;
static vec masks, applies, compiles, mem;
static int share_off; /* walk without the grammar's shared masks (every state met cold) */
static int n_schemas, n_instances;
static int timing_compiles = 1; /* 0 on repeats: the compile cache would answer */

static void walk(q3_grammar *G, const char *text, float *logits, int n_vocab)
{
    int32_t *ids = NULL;
    size_t n = 0;
    if (q3_tokenizer_encode(tok, text, strlen(text), Q3_ENCODE_DEFAULT, &ids, &n)) return;
    q3_matcher *m;
    if (q3_matcher_new(G, 0, &m)) {
        free(ids);
        return;
    }
    mask_share *share = G->share;
    if (share_off) G->share = NULL; /* one thread here: no matcher of G is elsewhere */
    for (size_t i = 0; i <= n; i++) {
        const uint64_t *mask;
        double t0 = now();
        if (matcher_rank_mask(m, &mask)) break;
        double t1 = now();
        push(&masks, t1 - t0);
        if (getenv("BENCH_GRAMMAR_SLOW") && t1 - t0 > atof(getenv("BENCH_GRAMMAR_SLOW")) * 1e-3)
        {
            size_t off = 0;
            for (size_t k = 0; k < i; k++) {
                const char *b;
                size_t l = 0;
                if (!q3_tokenizer_piece(tok, ids[k], &b, &l)) off += l;
            }
            fprintf(stderr, "slow mask %.2f ms at token %zu (after '%.*s') of %s\n", 1e3 * (t1 - t0), i, (int)off, text,
                    text);
        }
        double t2 = now();
        q3_matcher_apply(m, logits, n_vocab);
        push(&applies, now() - t2);
        if (i == n || q3_matcher_accept(m, ids[i])) break;
    }
    G->share = share;
    q3_matcher_free(m);
    free(ids);
    n_instances++;
}

/* Compile time: schema -> first mask, on a fresh grammar. */
static q3_grammar *timed_compile(q3_grammar_kind k, const char *text)
{
    q3_grammar *G = NULL;
    double t0 = now();
    if (q3_grammar_compile(tok, k, text, text ? strlen(text) : 0, &G)) return NULL;
    q3_matcher *m;
    const uint64_t *mask;
    if (!q3_matcher_new(G, 0, &m)) {
        matcher_rank_mask(m, &mask);
        if (timing_compiles) push(&compiles, now() - t0);
        q3_matcher_free(m);
    }
    if (timing_compiles) {
        push(&mem, (double)q3_grammar_bytes(G));
        n_schemas++;
    }
    return G;
}

static void suite(const char *dir, float *logits, int n_vocab)
{
    DIR *d = opendir(dir);
    if (!d) {
        fprintf(stderr, "bench_grammar: %s: no such folder (the suite is skipped)\n", dir);
        return;
    }
    struct dirent *e;
    while ((e = readdir(d))) {
        size_t l = strlen(e->d_name);
        if (l < 6 || strcmp(e->d_name + l - 5, ".json")) continue;
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        FILE *f = fopen(path, "rb");
        if (!f) continue;
        fseek(f, 0, SEEK_END);
        long n = ftell(f);
        fseek(f, 0, SEEK_SET);
        char *buf = malloc((size_t)n + 1);
        size_t got = fread(buf, 1, (size_t)n, f);
        buf[got] = 0;
        fclose(f);
        cJSON *groups = cJSON_Parse(buf);
        free(buf);
        const cJSON *g;
        cJSON_ArrayForEach(g, groups) {
            char *s = cJSON_PrintUnformatted(cJSON_GetObjectItemCaseSensitive(g, "schema"));
            q3_grammar *G = s ? timed_compile(Q3_GRAMMAR_JSON_SCHEMA, s) : NULL;
            free(s);
            if (!G) continue;
            const cJSON *t;
            cJSON_ArrayForEach(t, cJSON_GetObjectItemCaseSensitive(g, "tests")) {
                if (!cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(t, "valid"))) continue;
                char *inst = cJSON_PrintUnformatted(cJSON_GetObjectItemCaseSensitive(t, "data"));
                if (inst) walk(G, inst, logits, n_vocab);
                free(inst);
            }
            q3_grammar_free(G);
        }
        cJSON_Delete(groups);
    }
    closedir(d);
}

static double cpu_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* One decode run of B sequences (constrained by G or not), stepped from outside so that two runs can
 * take turns step by step. */
typedef struct {
    q3_ctx *c;
    q3_sampler *smp[8];
    q3_matcher *m[8];
    q3_gen *g[8];
    int B;
} drun;

static void drun_close(drun *d)
{
    for (int b = 0; b < d->B; b++) {
        q3_gen_free(d->g[b]);
        q3_matcher_free(d->m[b]);
        q3_sampler_free(d->smp[b]);
    }
    q3_ctx_free(d->c);
    memset(d, 0, sizeof *d);
}

/* B sequences with the same chat prompt, prefilled (untimed). 0 on success. */
static int drun_open(drun *d, q3_model *model, int B, q3_grammar *G, int threads, int max_tokens)
{
    memset(d, 0, sizeof *d);
    q3_ctx_opts co = q3_ctx_opts_default();
    co.max_seqs = B;
    co.n_ctx = 512;
    co.n_threads = threads;
    if (q3_ctx_new(model, &co, &d->c)) return -1;
    d->B = B;
    int32_t *ids = NULL;
    size_t n = 0;
    q3_chat_message msg = {"user", "Write a short note."};
    q3_chat_opts cho = q3_chat_opts_default();
    cho.enable_thinking = 0;
    if (q3_chat_tokenize(tok, &msg, 1, &cho, &ids, &n)) return -1;
    for (int b = 0; b < B; b++) {
        q3_sampler_params sp = q3_sampler_defaults(0);
        sp.seed = (uint64_t)b + 1;
        int seq;
        q3_gen_opts o = q3_gen_opts_default();
        o.max_tokens = max_tokens;
        if ((G && q3_matcher_new(G, 0, &d->m[b])) || (o.grammar = d->m[b],
            q3_sampler_new(&sp, q3_model_vocab_size(model), &d->smp[b]) || q3_seq_new(d->c, &seq) ||
            q3_gen_new(d->c, seq, d->smp[b], tok, &o, &d->g[b]) || q3_gen_prompt(d->g[b], ids, n))) {
            free(ids);
            return -1;
        }
    }
    free(ids);
    for (int busy = 1; busy;) {
        busy = 0;
        for (int b = 0; b < B; b++) busy |= q3_gen_prefilling(d->g[b]);
        if (busy && q3_gen_step(d->g, B)) return -1;
    }
    return 0;
}

/* One decode step of every live sequence: its process CPU and wall seconds; returns the tokens it
 * made (the sequences live before it), 0 when none is live or the step failed. */
static int drun_step(drun *d, double *cpu, double *wall)
{
    int live = 0;
    for (int b = 0; b < d->B; b++) live += !q3_gen_done(d->g[b]);
    if (!live) return 0;
    double c0 = cpu_now(), w0 = q3_now();
    if (q3_gen_step(d->g, d->B)) return 0;
    *cpu = cpu_now() - c0;
    *wall = q3_now() - w0;
    return live;
}

int main(int argc, char **argv)
{
    const char *tok_path = "tests/data/golden/e2e/tokenizer.json", *suite_dir = "tests/data/json-schema-test-suite/draft4";
    int repeats = 3, threads = 2, decode_repeats = 3;
    const char *model_path = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--suite") && i + 1 < argc) suite_dir = argv[++i];
        else if (!strcmp(argv[i], "--model") && i + 1 < argc) model_path = argv[++i];
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc) threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--repeats") && i + 1 < argc) repeats = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--decode-repeats") && i + 1 < argc) decode_repeats = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            printf("usage: bench_grammar [TOKENIZER_JSON] [--suite DIR] [--repeats N]\n"
                   "                     [--model M [--threads T] [--decode-repeats N]]\n"
                   "Token-mask p50/p99/max over the realistic schemas (walked N times, default 3) and the\n"
                   "JSON Schema Test Suite's draft 4 schemas (DIR, default %s), compile time, memory;\n"
                   "with --model, decode CPU time constrained vs not at B = 1 and 8 (T threads, default 2),\n"
                   "the two runs taking turns step by step, N pairs of runs (default 3).\n",
                   suite_dir);
            return 0;
        } else if (argv[i][0] == '-') {
            fprintf(stderr, "bench_grammar: unknown option %s (--help)\n", argv[i]);
            return 2;
        } else tok_path = argv[i];
    }
    if (q3_tokenizer_load(tok_path, &tok)) {
        fprintf(stderr, "bench_grammar: %s\n", q3_last_error());
        return 1;
    }
    int n_vocab = q3_tokenizer_vocab_size(tok);
    const gvocab *v;
    double t0 = now();
    if (gvocab_get(tok, n_vocab, q3_tokenizer_end_of_turn(tok), q3_tokenizer_end_of_text(tok), &v)) return 1;
    double t_tables = now() - t0;
    float *logits = calloc((size_t)n_vocab, sizeof *logits);
    /* cold: every walk without shared masks; then shared: a first walk that
       fills the grammar's table (not counted) and the walks after it */
    vec real = {0}, warm = {0}, first = {0};
    for (int pass = 0; pass < 2; pass++)
        for (int r = 0; r < repeats + pass; r++) {
            timing_compiles = pass == 0 && r == 0;
            share_off = pass == 0;
            for (size_t i = 0; i < sizeof realistic / sizeof realistic[0]; i++) {
                q3_grammar *G = timed_compile(realistic[i].schema ? Q3_GRAMMAR_JSON_SCHEMA : Q3_GRAMMAR_JSON, realistic[i].schema);
                if (!G) {
                    fprintf(stderr, "bench_grammar: %s: %s\n", realistic[i].name, q3_last_error());
                    return 1;
                }
                size_t before = masks.n;
                walk(G, realistic[i].instance, logits, n_vocab);
                for (size_t k = before; k < masks.n; k++) push(pass == 0 ? &real : r == 0 ? &first : &warm, masks.v[k]);
                if (pass == 1) masks.n = before; /* "all" stays the cold walks */
                q3_grammar_free(G);
            }
        }
    timing_compiles = 1;
    share_off = 1;
    suite(suite_dir, logits, n_vocab);
    share_off = 0;
    printf("bench_grammar: %d tokens in the vocabulary, %d in the trie (%d nodes); one thread\n", n_vocab,
           v->n_trie_ranks, v->n_nodes);
    printf("per-tokenizer tables: built in %.1f ms, %.1f MB (once per process)\n", 1e3 * t_tables, (double)v->bytes_held / 1e6);
    printf("%-44s %10s %10s %10s %10s\n", "", "p50", "p99", "max", "count");
    printf("%-44s %8.1f us %8.1f us %8.1f us %10zu\n", "mask per token, realistic schemas, cold", 1e6 * pct(&real, 0.5),
           1e6 * pct(&real, 0.99), 1e6 * pct(&real, 1.0), real.n);
    printf("%-44s %8.1f us %8.1f us %8.1f us %10zu\n", "  the same, first use, keeping shared masks", 1e6 * pct(&first, 0.5),
           1e6 * pct(&first, 0.99), 1e6 * pct(&first, 1.0), first.n);
    printf("%-44s %8.1f us %8.1f us %8.1f us %10zu\n", "  the same, schema met before (shared masks)", 1e6 * pct(&warm, 0.5),
           1e6 * pct(&warm, 0.99), 1e6 * pct(&warm, 1.0), warm.n);
    printf("%-44s %8.1f us %8.1f us %8.1f us %10zu\n", "mask per token, all (realistic + suite), cold", 1e6 * pct(&masks, 0.5),
           1e6 * pct(&masks, 0.99), 1e6 * pct(&masks, 1.0), masks.n);
    printf("%-44s %8.1f us %8.1f us %8.1f us %10zu\n", "applying a mask to a logits row", 1e6 * pct(&applies, 0.5),
           1e6 * pct(&applies, 0.99), 1e6 * pct(&applies, 1.0), applies.n);
    printf("%-44s %8.3f ms %8.3f ms %8.3f ms %10zu\n", "compile (schema -> first mask)", 1e3 * pct(&compiles, 0.5),
           1e3 * pct(&compiles, 0.99), 1e3 * pct(&compiles, 1.0), compiles.n);
    printf("%-44s %8.1f KB %8.1f KB %8.1f KB %10zu\n", "memory per compiled grammar", pct(&mem, 0.5) / 1e3,
           pct(&mem, 0.99) / 1e3, pct(&mem, 1.0) / 1e3, mem.n);
    printf("(%d schemas compiled, %d instances walked)\n", n_schemas, n_instances);
    if (model_path) {
        q3_model *model;
        if (q3_model_open(model_path, &model)) {
            fprintf(stderr, "bench_grammar: %s\n", q3_last_error());
            return 1;
        }
        const char *schema = "{\"type\":\"object\",\"properties\":{\"title\":{\"type\":\"string\"},\"body\":"
                             "{\"type\":\"string\"}},\"required\":[\"title\",\"body\"],\"additionalProperties\":false}";
        q3_grammar *G;
        if (q3_grammar_compile(tok, Q3_GRAMMAR_JSON_SCHEMA, schema, strlen(schema), &G)) return 1;
        printf("decode, %s, %d threads: CPU ms per generated token (wall ms), constrained vs not\n", model_path, threads);
        int bs[2] = {1, 8};
        for (int k = 0; k < 2; k++) {
            /* an unconstrained and a constrained run side by side, taking turns step by step (who goes
             * first alternating), so that the machine's load meets both alike; per pair of steps the
             * CPU seconds per token of each, and over all pairs the sums */
            vec ratio = {0};
            double cu = 0, cc = 0, wu = 0, wc = 0;
            long tu = 0, tc = 0;
            for (int r = 0; r < decode_repeats; r++) {
                drun du, dc;
                memset(&dc, 0, sizeof dc);
                if (drun_open(&du, model, bs[k], NULL, threads, 64) || drun_open(&dc, model, bs[k], G, threads, 64)) {
                    fprintf(stderr, "bench_grammar: %s\n", q3_last_error());
                    drun_close(&du);
                    drun_close(&dc);
                    return 1;
                }
                for (int i = 0;; i++) {
                    double c1, w1, c2, w2;
                    int n1, n2;
                    if (i % 2 == 0) n1 = drun_step(&du, &c1, &w1), n2 = n1 ? drun_step(&dc, &c2, &w2) : 0;
                    else n2 = drun_step(&dc, &c2, &w2), n1 = n2 ? drun_step(&du, &c1, &w1) : 0;
                    if (!n1 || !n2) break;
                    push(&ratio, (c1 / n1) / (c2 / n2));
                    cu += c1, wu += w1, tu += n1;
                    cc += c2, wc += w2, tc += n2;
                }
                drun_close(&du);
                drun_close(&dc);
            }
            printf("  B=%d: unconstrained %.2f ms (%.2f), constrained %.2f ms (%.2f): throughput ratio %.3f, "
                   "per step pair p50 %.3f (%zu pairs in %d runs; wall ratio %.3f)\n",
                   bs[k], 1e3 * cu / (double)tu, 1e3 * wu / (double)tu, 1e3 * cc / (double)tc, 1e3 * wc / (double)tc,
                   (cu / (double)tu) / (cc / (double)tc), pct(&ratio, 0.5), ratio.n, decode_repeats,
                   (wu / (double)tu) / (wc / (double)tc));
            free(ratio.v);
        }
        q3_grammar_free(G);
        q3_model_close(model);
    }
    free(logits);
    q3_tokenizer_free(tok);
    return 0;
}
