/* q3 bench and q3 probe end to end on a small golden model: the JSON of each
 * validates against its schema in docs/, the numbers are sane, the chart is
 * an SVG with its bars, and split-phase runs work. One run measures the
 * machine's limits (about 4 s: 512 MiB read twice, four peaks) and checks the
 * table against the CPU's features; every other run passes --no-limits. */
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "backend/backend.h"
#include "golden.h"
#include "schema.h"
#include "temps.h"
#include "test.h"


/* Runs a q3 command line, returns stdout (caller frees) and the exit status. */
static char *run(const char *args, int *status)
{
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "%s %s 2>/dev/null", q3_bin(), args);
    FILE *f = popen(cmd, "r");
    size_t cap = 1 << 16, n = 0;
    char *out = malloc(cap);
    size_t got;
    while ((got = fread(out + n, 1, cap - n - 1, f)) > 0) {
        n += got;
        if (n + 1 == cap) out = realloc(out, cap *= 2);
    }
    out[n] = 0;
    *status = pclose(f);
    return out;
}

static cJSON *load_schema(const char *path)
{
    char *t = golden_slurp(path, NULL);
    cJSON *s = t ? cJSON_Parse(t) : NULL;
    free(t);
    return s;
}

/* bench's machine table: measured with the threads the units ran with, a
 * positive read bandwidth, and a peak exactly for the instructions this CPU
 * has (FP32 FMA with AVX2; BF16 and INT8 dot products with AVX-512; AMX tiles
 * with AMX), 0 for the others. */
static void check_limits(const cJSON *doc)
{
    const cJSON *m = cJSON_GetObjectItem(doc, "machine");
    CHECK(cJSON_IsObject(m), "bench --json without --no-limits has a machine table");
    if (!cJSON_IsObject(m)) return;
    const cJSON *threads = cJSON_GetObjectItem(cJSON_GetObjectItem(doc, "settings"), "threads");
    CHECK(threads && cJSON_GetObjectItem(m, "threads") && cJSON_GetObjectItem(m, "threads")->valueint == threads->valueint,
          "limits measured on the units' threads");
    static const struct { const char *field, *isa; } t[] = {
        {"read_gb_s_1thread", NULL}, {"read_gb_s", NULL},          {"fp32_fma_gflop_s", "avx2"},
        {"bf16_dot_gflop_s", "avx512"}, {"int8_dot_gop_s", "avx512"}, {"amx_bf16_gflop_s", "amx"},
    };
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) {
        const cJSON *v = cJSON_GetObjectItem(m, t[i].field);
        CHECK(cJSON_IsNumber(v), "machine.%s present", t[i].field);
        if (!cJSON_IsNumber(v)) continue;
        int has = !t[i].isa || test_machine_has_isa(t[i].isa);
        if (has) CHECK(v->valuedouble > 0, "machine.%s is %g on a CPU with %s", t[i].field, v->valuedouble, t[i].isa ? t[i].isa : "memory");
        else CHECK(v->valuedouble == 0, "machine.%s is %g on a CPU without %s", t[i].field, v->valuedouble, t[i].isa);
    }
    const cJSON *r1 = cJSON_GetObjectItem(m, "read_gb_s_1thread"), *rn = cJSON_GetObjectItem(m, "read_gb_s");
    if (cJSON_IsNumber(r1) && cJSON_IsNumber(rn))
        CHECK(r1->valuedouble < 1e4 && rn->valuedouble < 1e4, "read bandwidth below 10 TB/s: %g, %g", r1->valuedouble,
              rn->valuedouble);
}

static double num(const cJSON *o, const char *a, const char *b)
{
    const cJSON *x = cJSON_GetObjectItem(o, a);
    if (b) x = cJSON_GetObjectItem(x, b);
    return cJSON_IsNumber(x) ? x->valuedouble : -1;
}

/* q3 probe and q3 bench on a mixture-of-experts model (moe-tiny: 3 layers,
 * 8 experts, 2 a token): probe lists where matmul_id, moe_route and moe_sum
 * land and each unit's reason to refuse them; bench reports the active bytes
 * (less than the weights), streams them per decode token, and in --batch
 * counts the distinct experts a layer reads (k for one row, growing with B,
 * never more than min(E, B k)) beside E(1-(1-k/E)^B). */
static void moe(const cJSON *probe_schema, const cJSON *bench_schema, const cJSON *batch_schema)
{
    char err[600];
    int st;
    const char *on = q3_backend_cpu.present(&q3_backend_cpu) ? "cpu" : "ref";
    char *out = run("probe -m " TEST_DATA "/golden/moe-tiny --chunk 16 --json --no-profile --compute-units all", &st);
    cJSON *doc = cJSON_Parse(out);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0 && doc, "moe probe --json: %.200s", out);
    if (doc) {
        CHECK(schema_validate(probe_schema, doc, err, sizeof err) == 0, "moe probe schema: %s", err);
        const cJSON *g;
        int graphs = 0;
        cJSON_ArrayForEach(g, cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(doc, "policies"), 0), "graphs")) {
            graphs++;
            int found = 0;
            const cJSON *k;
            cJSON_ArrayForEach(k, cJSON_GetObjectItem(g, "by_kind")) {
                const char *kind = cJSON_GetObjectItem(k, "kind")->valuestring;
                int want = !strcmp(kind, "matmul_id") ? 9 : !strcmp(kind, "moe_route") || !strcmp(kind, "moe_sum") ? 3 : 0;
                if (!want) continue;
                found++;
                int ops = (int)num(k, "ops", NULL), placed = (int)num(k, "placement", on);
                const cJSON *why = cJSON_GetObjectItem(cJSON_GetObjectItem(k, "refusals"), "cuda");
                CHECK(ops == want && placed == want, "%s: %d ops, %d on %s (want %d)", kind, ops, placed, on, want);
                CHECK(cJSON_IsString(why) && !strcmp(why->valuestring, "device absent"), "%s: cuda's reason: %s", kind,
                      cJSON_IsString(why) ? why->valuestring : "(none)");
            }
            CHECK(found == 3, "the graph lists the three MoE kinds: %d", found);
        }
        CHECK(graphs == 2, "prefill and decode");
    }
    cJSON_Delete(doc);
    free(out);
    out = run("probe -m " TEST_DATA "/golden/moe-tiny --chunk 16 --compute-units cpu_and_gpu --no-profile", &st);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0 && strstr(out, "moe_route") && strstr(out, "moe_sum") &&
          strstr(out, "matmul_id") && strstr(out, "cuda refuses: device absent"), "moe probe text: %.600s", out);
    free(out);
    /* a profiled run of each graph on the reference unit */
    out = run("probe -m " TEST_DATA "/golden/moe-tiny --chunk 16 --json --compute-units ref", &st);
    doc = cJSON_Parse(out);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0 && doc, "moe probe profile: %.200s", out);
    const cJSON *g;
    int profiled = 0;
    cJSON_ArrayForEach(g, cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(doc, "policies"), 0), "graphs"))
        profiled += num(g, "profile", "ms_per_run") > 0 &&
                    cJSON_GetObjectItem(cJSON_GetObjectItem(cJSON_GetObjectItem(g, "profile"), "share_by_kind"), "matmul_id");
    CHECK(profiled == 2, "both MoE graphs profiled, matmul_id's share among them: %d", profiled);
    cJSON_Delete(doc);
    free(out);

    /* bench: the active bytes, streamed per decode token */
    char args[512];
    snprintf(args, sizeof args, "bench -m " TEST_DATA "/golden/moe-tiny --compute-units %s --chunk 8 --gen 4 --repeats 1 "
             "--no-limits --json", on);
    out = run(args, &st);
    doc = cJSON_Parse(out);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0 && doc, "moe bench --json: %.200s", out);
    if (doc) {
        CHECK(schema_validate(bench_schema, doc, err, sizeof err) == 0, "moe bench schema: %s", err);
        double w = num(doc, "model", "weight_bytes"), a = num(doc, "model", "active_bytes");
        CHECK(num(doc, "model", "n_experts") == 8 && num(doc, "model", "n_experts_used") == 2, "experts in the model table");
        /* moe-tiny: 3 layers of 8 experts of 3 F32 [96][128] matrices; a token reads 2 of them, and one embedding row */
        double expert = 3.0 * 96 * 128 * 4, row = 128 * 4;
        CHECK(a > 0 && fabs((w - a) - (3 * 6 * expert + 1023 * row)) < 0.5, "active bytes %.0f of %.0f", a, w);
        cJSON *r0 = cJSON_GetArrayItem(cJSON_GetObjectItem(doc, "runs"), 0);
        double dw = num(r0, "decode_weight_bytes", NULL), dk = num(r0, "decode_kv_bytes", NULL), db = num(r0, "decode_bytes", NULL);
        CHECK(dw == a && dk > 0 && fabs(db - (dw + dk)) < 1, "decode streams the active bytes and K/V: %g %g %g", dw, dk, db);
        cJSON_Delete(doc);
    }
    free(out);
    /* split-phase table */
    out = run("bench -m " TEST_DATA "/golden/moe-tiny --prefill-on ref --decode-on ref --chunk 8 --gen 3 --repeats 1 --no-limits", &st);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0 && strstr(out, "RTFx") && strstr(out, "mixture of experts, 2 of 8") &&
          strstr(out, "GB active"), "moe split-phase table: %.400s", out);
    free(out);

    /* --batch: the experts a step reads */
    snprintf(args, sizeof args, "bench -m " TEST_DATA "/golden/moe-tiny --compute-units %s --batch 1,2,4,16 --depth 9 --gen 4 "
             "--no-limits --json", on);
    out = run(args, &st);
    doc = cJSON_Parse(out);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0 && doc, "moe bench --batch: %.200s", out);
    if (doc) {
        CHECK(schema_validate(batch_schema, doc, err, sizeof err) == 0, "moe bench-batch schema: %s", err);
        const cJSON *bs = cJSON_GetObjectItem(doc, "batches");
        double m[4], e[4], w[4];
        int B[4] = {1, 2, 4, 16};
        for (int i = 0; i < 4; i++) {
            const cJSON *b = cJSON_GetArrayItem(bs, i);
            m[i] = num(b, "experts_measured", NULL), e[i] = num(b, "experts_expected", NULL), w[i] = num(b, "weight_bytes", NULL);
            double want = 8 * (1 - pow(1 - 2.0 / 8, B[i]));
            CHECK(fabs(e[i] - want) < 1e-9, "B %d: expected %g experts, formula %g", B[i], e[i], want);
            double most = 2.0 * B[i] < 8 ? 2.0 * B[i] : 8;
            CHECK(m[i] >= 2 && m[i] <= most, "B %d: %g distinct experts a layer, in [2, %g]", B[i], m[i], most);
        }
        CHECK(m[0] == 2, "one row reads its k experts: %g", m[0]);
        CHECK(m[3] > m[0], "16 rows read more experts than one: %g", m[3]);
        /* the bytes follow the counted union: one expert (3 layers' worth) per expert more */
        double expert = 3.0 * (3.0 * 96 * 128 * 4);
        for (int i = 1; i < 4; i++)
            CHECK(fabs((w[i] - w[0]) - (m[i] - m[0]) * expert) < 1, "B %d: %g bytes more for %g experts more", B[i], w[i] - w[0],
                  m[i] - m[0]);
        cJSON_Delete(doc);
    }
    free(out);
    /* a dense model has none of it */
    out = run("bench -m " TEST_DATA "/golden/tiny --batch 1,2 --depth 4 --gen 2 --no-limits --json", &st);
    doc = cJSON_Parse(out);
    CHECK(doc && !cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(doc, "batches"), 1), "experts_measured") &&
          !cJSON_GetObjectItem(doc, "n_experts"), "dense --batch: no expert counts");
    cJSON_Delete(doc);
    free(out);
}

int main(void)
{
    cJSON *bench_schema = load_schema("docs/bench.schema.json"), *probe_schema = load_schema("docs/probe.schema.json");
    CHECK(bench_schema && probe_schema, "schemas parse");
    if (!bench_schema || !probe_schema) TEST_DONE();
    char err[600];
    int st;

    /* bench on the reference unit, with a chart and the machine's limits */
    const char *svg_path = test_tmp("bench.svg");
    char args[512];
    snprintf(args, sizeof args,
             "bench -m " TEST_DATA "/golden/small --compute-units ref --chunk 16 --gen 6 --repeats 3 --json --svg %s",
             svg_path);
    char *out = run(args, &st);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "bench exit %d", st);
    cJSON *doc = cJSON_Parse(out);
    CHECK(doc != NULL, "bench --json parses: %.200s", out);
    if (doc) {
        CHECK(schema_validate(bench_schema, doc, err, sizeof err) == 0, "bench schema: %s", err);
        cJSON *r0 = cJSON_GetArrayItem(cJSON_GetObjectItem(doc, "runs"), 0);
        CHECK(r0 && !strcmp(cJSON_GetObjectItem(r0, "prefill_unit")->valuestring, "ref"), "unit ref");
        double p50 = cJSON_GetObjectItem(cJSON_GetObjectItem(r0, "prefill_ms"), "p50")->valuedouble;
        double p99 = cJSON_GetObjectItem(cJSON_GetObjectItem(r0, "prefill_ms"), "p99")->valuedouble;
        double tps = cJSON_GetObjectItem(r0, "decode_tok_s")->valuedouble;
        double rtfx = cJSON_GetObjectItem(r0, "rtfx")->valuedouble;
        CHECK(p50 > 0 && p99 >= p50, "prefill p50 %g p99 %g", p50, p99);
        /* decode: the verdict's rate is 1000 / the mean; the tail ratio and its flag */
        double dmean = num(r0, "decode_ms", "mean"), d50 = num(r0, "decode_ms", "p50"), d99 = num(r0, "decode_ms", "p99");
        CHECK(dmean > 0 && fabs(tps - 1000 / dmean) < 1e-9 * tps, "decode tok/s = 1000 / mean ms: %g %g", tps, dmean);
        CHECK(fabs(num(r0, "decode_p99_over_p50", NULL) - d99 / d50) < 1e-9 &&
              cJSON_IsBool(cJSON_GetObjectItem(r0, "decode_tail")) &&
              cJSON_IsTrue(cJSON_GetObjectItem(r0, "decode_tail")) == (d99 / d50 > 1.5), "decode tail %g / %g", d99, d50);
        CHECK(num(doc, "settings", "decode_depth") == 16, "decode depth: after the 16-token prompt: %g", num(doc, "settings", "decode_depth"));
        const cJSON *ld = cJSON_GetObjectItem(doc, "load");
        CHECK(num(doc, "load", "cpus") >= 1 && cJSON_IsBool(cJSON_GetObjectItem(ld, "noisy")) &&
              cJSON_IsTrue(cJSON_GetObjectItem(ld, "noisy")) == (num(doc, "load", "others_fraction") > 0.10 ||
                                                             num(doc, "load", "steal_fraction") > 0.05),
              "load: noisy as its figures say");
        CHECK(fabs(rtfx - tps / 15.0) < 1e-9 * (1 + rtfx), "RTFx = tok/s / drain");
        CHECK(cJSON_GetArraySize(cJSON_GetObjectItem(doc, "runs")) == 1, "one run");
        check_limits(doc);
        /* dense: a token reads every weight but the embedding's other rows (small: untied), K/V beside;
           the bound is those bytes over the measured read bandwidth */
        double w = num(doc, "model", "weight_bytes"), a = num(doc, "model", "active_bytes");
        CHECK(fabs((w - a) - 4095.0 * 256 * 4) < 0.5, "dense active bytes %.0f of %.0f: all but 4095 embedding rows", a, w);
        double db = num(r0, "decode_bytes", NULL), bw = num(doc, "machine", "read_gb_s");
        CHECK(num(r0, "decode_weight_bytes", NULL) == a && db > a, "dense decode bytes %g: the active %g and K/V", db, a);
        CHECK(bw > 0 && fabs(num(r0, "decode_bound_ms", NULL) - db / (bw * 1e6)) < 1e-9 * db, "decode bound = bytes / bandwidth");
        /* the checker itself can fail: a document missing a field is refused */
        cJSON_DeleteItemFromObject(r0, "rtfx");
        CHECK(schema_validate(bench_schema, doc, err, sizeof err) != 0, "schema refuses a run without rtfx");
        cJSON_Delete(doc);
    }
    free(out);
    char *svg = golden_slurp(svg_path, NULL);
    CHECK(svg && !strncmp(svg, "<svg", 4) && strstr(svg, "</svg>"), "chart is an SVG document");
    int bars = 0;
    for (const char *p = svg; p && (p = strstr(p, "<rect")); p++) bars++;
    CHECK(bars == 1 + 1 + 3 + 2, "background + 1 prefill bar + 3 experiment bars + 2 decode bars: %d", bars);
    free(svg);

    /* without the limits: no machine table */
    out = run("bench -m " TEST_DATA "/golden/tiny --compute-units ref --chunk 8 --gen 2 --repeats 1 --json --no-limits", &st);
    doc = cJSON_Parse(out);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0 && doc, "bench --no-limits --json: %.200s", out);
    if (doc) CHECK(!cJSON_GetObjectItem(doc, "machine"), "--no-limits: no machine table");
    cJSON_Delete(doc);
    free(out);

    /* split-phase: prefill on one unit, decode on another (ref both ways when alone) */
    out = run("bench -m " TEST_DATA "/golden/tiny --prefill-on ref --decode-on ref --chunk 8 --gen 4 --repeats 2 "
              "--no-limits", &st);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0 && strstr(out, "RTFx"), "split-phase table: %.300s", out);
    /* the table shows the number the verdict uses, the true depth, and says what '-' and the load mean */
    CHECK(strstr(out, "p50/mean/p99") && strstr(out, "tok/s mean") && strstr(out, "p99/p50") &&
          strstr(out, "from depth 8 (after the prompt)") && strstr(out, "it published no such figure") &&
          strstr(out, "machine load during the run"), "table labels: %.1500s", out);
    free(out);
    /* --batch --no-limits: no bound columns, no zeros that read as measured */
    out = run("bench -m " TEST_DATA "/golden/tiny --batch 1,2 --depth 4 --gen 2 --no-limits", &st);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0 && !strstr(out, "GB/s,") && !strstr(out, "reached") &&
          !strstr(out, "bound ms") && strstr(out, "not measured (--no-limits)"), "--batch --no-limits: %.800s", out);
    free(out);
    out = run("bench -m " TEST_DATA "/golden/tiny --compute-units nope --chunk 8 --gen 2 --repeats 1 --no-limits", &st);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 1, "unknown unit fails: %d", st);
    free(out);

    /* probe */
    out = run("probe -m " TEST_DATA "/golden/tiny --chunk 16 --json", &st);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "probe exit %d", st);
    doc = cJSON_Parse(out);
    CHECK(doc != NULL, "probe --json parses: %.200s", out);
    if (doc) {
        CHECK(schema_validate(probe_schema, doc, err, sizeof err) == 0, "probe schema: %s", err);
        const cJSON *pol;
        int seen_ref = 0;
        cJSON_ArrayForEach(pol, cJSON_GetObjectItem(doc, "policies")) {
            const cJSON *g;
            cJSON_ArrayForEach(g, cJSON_GetObjectItem(pol, "graphs")) {
                CHECK(cJSON_IsTrue(cJSON_GetObjectItem(g, "admitted")), "every policy admits every graph here");
                if (!strcmp(cJSON_GetObjectItem(pol, "policy")->valuestring, "ref")) {
                    int n_ops = cJSON_GetObjectItem(g, "n_ops")->valueint;
                    const cJSON *on_ref = cJSON_GetObjectItem(cJSON_GetObjectItem(g, "placement"), "ref");
                    CHECK(on_ref && on_ref->valueint == n_ops, "ref policy: all ops on ref");
                    CHECK(cJSON_GetObjectItem(g, "profile") != NULL, "profiled run present");
                    seen_ref++;
                }
            }
        }
        CHECK(seen_ref == 2, "ref policy has prefill and decode");
        cJSON_Delete(doc);
    }
    free(out);
    out = run("probe -m " TEST_DATA "/golden/tiny --compute-units all --no-profile", &st);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "probe text exit %d", st);
    CHECK(strstr(out, "cuda") && strstr(out, "device absent"), "absent CUDA unit named: %.400s", out);
    free(out);
    cJSON_Delete(bench_schema);
    cJSON_Delete(probe_schema);

    /* batched decode: one entry per batch size, the first is the reference for the speedups */
    cJSON *batch_schema = load_schema("docs/bench-batch.schema.json");
    CHECK(batch_schema != NULL, "bench-batch schema parses");
    out = run("bench -m " TEST_DATA "/golden/tiny --batch 1,3,4 --depth 20 --gen 3 --no-limits --json", &st);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "bench --batch exit %d", st);
    doc = cJSON_Parse(out);
    CHECK(doc != NULL, "bench --batch --json parses: %.200s", out);
    if (doc && batch_schema) {
        CHECK(schema_validate(batch_schema, doc, err, sizeof err) == 0, "bench-batch schema: %s", err);
        cJSON *bs = cJSON_GetObjectItem(doc, "batches");
        CHECK(cJSON_GetArraySize(bs) == 3, "three batch sizes");
        cJSON *b0 = cJSON_GetArrayItem(bs, 0), *b2 = cJSON_GetArrayItem(bs, 2);
        CHECK(b0 && b2 && cJSON_GetObjectItem(b2, "batch")->valueint == 4, "batch sizes in order");
        if (b0 && b2) {
            double kv0 = cJSON_GetObjectItem(b0, "kv_bytes")->valuedouble, kv2 = cJSON_GetObjectItem(b2, "kv_bytes")->valuedouble;
            CHECK(kv0 > 0 && fabs(kv2 - 4 * kv0) < 1e-6 * kv2, "KV bytes grow with the rows: %g, %g", kv0, kv2);
            CHECK(cJSON_GetObjectItem(b0, "weight_bytes")->valuedouble == cJSON_GetObjectItem(b2, "weight_bytes")->valuedouble,
                  "weights streamed once per step whatever B");
            CHECK(fabs(cJSON_GetObjectItem(b0, "speedup_vs_first")->valuedouble - 1) < 1e-9, "B=1 is the reference");
        }
        cJSON_DeleteItemFromObject(doc, "batches");
        CHECK(schema_validate(batch_schema, doc, err, sizeof err) != 0, "schema refuses a document without batches");
    }
    cJSON_Delete(doc);
    free(out);
    out = run("bench -m " TEST_DATA "/golden/tiny --batch 1,x --no-limits", &st);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) != 0, "--batch 1,x refused");
    free(out);
    out = run("bench -m " TEST_DATA "/golden/tiny --batch 300 --no-limits", &st);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) != 0, "--batch 300 refused");
    free(out);
    cJSON *b2 = load_schema("docs/bench.schema.json"), *p2 = load_schema("docs/probe.schema.json");
    if (b2 && p2 && batch_schema) moe(p2, b2, batch_schema);
    cJSON_Delete(b2);
    cJSON_Delete(p2);
    cJSON_Delete(batch_schema);
    TEST_DONE();
}
