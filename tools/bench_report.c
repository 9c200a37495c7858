/* q3 bench's report: the split-phase experiment's table on the machine at
 * hand (prefill ms per chunk and decode ms/token per compute unit, tok/s,
 * RTFx), the batched-decode table, the machine's limits, the SVG chart. */
#include "tools/bench_report.h"

#include <cjson/cJSON.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "backend/cpu/cpu_backend.h"
#include "backend/registry.h"
#include "model/model.h"
#include "tools/defaults.h"
#include "tools/limits.h"
#include "tools/load.h"
#include "util/error.h"
#include "util/file.h"
#include "util/outfile.h"

/* The experiment q3 grows out of (one laptop): prefill of a 128-token chunk
 * per unit, decode on the GPU. */
static const struct { const char *unit; double prefill_ms; } experiment_prefill[] = {
    {"CPU", 46.0}, {"neural accelerator", 12.5}, {"GPU", 9.3}};
static const double experiment_decode_tok_s = 27.0, experiment_rtfx = 1.80;

typedef struct run {
    char prefill_unit[16], decode_unit[16];
    q3_bench_result r;
    char *sample;
} run;

/* A decode tail worth a flag: p99 over p50 above this (issue 25). */
#define TAIL_RATIO 1.5

static cJSON *stats_json(const q3_stats *s)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "p50", s->p50);
    cJSON_AddNumberToObject(o, "p99", s->p99);
    cJSON_AddNumberToObject(o, "mean", s->mean);
    cJSON_AddNumberToObject(o, "sd", s->sd);
    cJSON_AddNumberToObject(o, "min", s->min);
    cJSON_AddNumberToObject(o, "max", s->max);
    cJSON_AddNumberToObject(o, "n", s->n);
    return o;
}

/* "machine load: ..." and, for a noisy run, why its numbers may not hold. */
static void print_load(const q3_load *l)
{
    if (l->others < 0) return;
    printf("machine load during the run: load average %.2f -> %.2f on %d CPUs; other processes took %.0f%% of the CPUs, "
           "steal %.1f%%%s\n", l->load1_begin, l->load1_end, l->n_cpus, 100 * l->others, 100 * l->steal,
           l->noisy ? "" : " (quiet)");
    if (l->noisy)
        printf("NOISY RUN: other work (%.0f%% of the CPUs%s) competed with the benchmark: the timings and any verdict "
               "above may not hold on a quiet machine; rerun when it is idle\n",
               100 * l->others, l->steal > Q3_LOAD_NOISY_STEAL ? ", or the hypervisor's steal" : "");
}

static cJSON *load_json(const q3_load *l)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "cpus", l->n_cpus);
    cJSON_AddNumberToObject(o, "load1_begin", l->load1_begin);
    cJSON_AddNumberToObject(o, "load1_end", l->load1_end);
    cJSON_AddNumberToObject(o, "others_fraction", l->others);
    cJSON_AddNumberToObject(o, "steal_fraction", l->steal);
    cJSON_AddBoolToObject(o, "noisy", l->noisy);
    return o;
}

/* Q3_OK if `name` is a compute unit present here; else a status saying why,
 * before anything of the results is printed. */
static q3_status check_unit(const char *name)
{
    const q3_backend *b = q3_backend_find(name);
    if (b && (!b->present || b->present(b))) return Q3_OK;
    char known[256] = "";
    for (int i = 0; q3_backends[i]; i++)
        snprintf(known + strlen(known), sizeof known - strlen(known), "%s%s", i ? ", " : "", q3_backends[i]->name);
    if (b) return q3_fail(Q3_ERR_INVALID, "compute unit '%s' is not present on this machine", name);
    return q3_fail(Q3_ERR_INVALID, "unknown compute unit '%.40s' (q3 has: %s, or 'all')", name, known);
}

/* Writes s as SVG text content: &, <, >, " and ' escaped. */
static void svg_text(FILE *f, const char *s)
{
    for (; *s; s++) {
        switch (*s) {
        case '&': fputs("&amp;", f); break;
        case '<': fputs("&lt;", f); break;
        case '>': fputs("&gt;", f); break;
        case '"': fputs("&quot;", f); break;
        case '\'': fputs("&apos;", f); break;
        default: fputc(*s, f);
        }
    }
}

static void svg_bar(FILE *f, double y, const char *label, double value, double vmax, const char *color,
                    const char *unit_text)
{
    double w = vmax > 0 ? 420.0 * value / vmax : 0;
    fprintf(f, "<text x=\"240\" y=\"%.0f\" text-anchor=\"end\" font-size=\"12\">", y + 13);
    svg_text(f, label);
    fputs("</text>\n", f);
    fprintf(f, "<rect x=\"250\" y=\"%.0f\" width=\"%.1f\" height=\"18\" fill=\"%s\"/>\n", y, w, color);
    fprintf(f, "<text x=\"%.1f\" y=\"%.0f\" font-size=\"12\">%.1f %s</text>\n", 256 + w, y + 13, value, unit_text);
}

/* Two panels: prefill ms per chunk (lower is better) and decode tok/s with the drain line. */
static int write_svg(const char *path, const run *runs, int n, int chunk, double drain, const char *model)
{
    char *doc = NULL;
    size_t doc_len = 0;
    FILE *f = open_memstream(&doc, &doc_len); /* the file itself: complete or absent (util/outfile.h) */
    if (!f) return -1;
    int rows1 = n + 3, rows2 = n + 1;
    double h = 90 + 26.0 * rows1 + 60 + 26.0 * rows2 + 30;
    fprintf(f, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"780\" height=\"%.0f\" font-family=\"sans-serif\">\n", h);
    fprintf(f, "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n");
    fputs("<text x=\"10\" y=\"22\" font-size=\"15\" font-weight=\"bold\">q3 bench: ", f);
    svg_text(f, model);
    fputs("</text>\n", f);
    fprintf(f, "<text x=\"10\" y=\"52\" font-size=\"13\">Prefill: ms per %d-token chunk (lower is better)</text>\n", chunk);
    double vmax = 0;
    for (int i = 0; i < n; i++) vmax = runs[i].r.prefill_ms.p50 > vmax ? runs[i].r.prefill_ms.p50 : vmax;
    for (int i = 0; i < 3; i++) vmax = experiment_prefill[i].prefill_ms > vmax ? experiment_prefill[i].prefill_ms : vmax;
    double y = 64;
    for (int i = 0; i < n; i++, y += 26) {
        char label[64];
        snprintf(label, sizeof label, "q3 %s", runs[i].prefill_unit);
        svg_bar(f, y, label, runs[i].r.prefill_ms.p50, vmax, "#3b6ea5", "ms");
    }
    for (int i = 0; i < 3; i++, y += 26) {
        char label[64];
        snprintf(label, sizeof label, "laptop %s (128 tok)", experiment_prefill[i].unit);
        svg_bar(f, y, label, experiment_prefill[i].prefill_ms, vmax, "#b0b0b0", "ms");
    }
    y += 30;
    fprintf(f, "<text x=\"10\" y=\"%.0f\" font-size=\"13\">Decode: tokens/s (higher is better); red line: drain %.0f tok/s</text>\n",
            y, drain);
    y += 12;
    vmax = drain * 1.2;
    for (int i = 0; i < n; i++) vmax = runs[i].r.decode_tok_s > vmax ? runs[i].r.decode_tok_s : vmax;
    vmax = experiment_decode_tok_s > vmax ? experiment_decode_tok_s : vmax;
    double y0 = y;
    for (int i = 0; i < n; i++, y += 26) {
        char label[64];
        snprintf(label, sizeof label, "q3 %s", runs[i].decode_unit);
        svg_bar(f, y, label, runs[i].r.decode_tok_s, vmax, runs[i].r.decode_tok_s > drain ? "#2e8b57" : "#c0392b", "tok/s");
    }
    svg_bar(f, y, "laptop GPU", experiment_decode_tok_s, vmax, "#b0b0b0", "tok/s");
    y += 26;
    double xd = 250 + 420.0 * drain / vmax;
    fprintf(f, "<line x1=\"%.1f\" y1=\"%.0f\" x2=\"%.1f\" y2=\"%.0f\" stroke=\"red\" stroke-dasharray=\"4\"/>\n", xd, y0 - 4,
            xd, y);
    fprintf(f, "</svg>\n");
    int rc = fclose(f) != 0 ? -1 : q3_write_file_atomic(path, doc, doc_len) != Q3_OK ? -1 : 0;
    free(doc);
    return rc;
}

/* Greedy text of a run, for a look at what the model makes (random weights: noise). */
static char *sample_text(const char *model_dir, int vocab, const int32_t *ids, int n)
{
    char p[PATH_MAX];
    const char *dir = model_dir;
    snprintf(p, sizeof p, "%s/tokenizer.json", dir);
    if (!q3_file_exists(p)) {
        dir = q3_default_tokenizer_dir();
        if (!dir) return NULL;
        snprintf(p, sizeof p, "%s/tokenizer.json", dir);
    }
    q3_tokenizer *tok;
    if (q3_tokenizer_load(p, &tok)) return NULL;
    char *text = NULL;
    size_t len;
    /* only a tokenizer made for this vocabulary says anything about these ids */
    int ok = abs(q3_tokenizer_vocab_size(tok) - vocab) < 1024;
    for (int i = 0; i < n; i++) ok &= ids[i] < q3_tokenizer_vocab_size(tok);
    if (!ok || q3_tokenizer_decode(tok, ids, (size_t)n, &text, &len)) text = NULL;
    q3_tokenizer_free(tok);
    return text;
}

/* q3 bench --batch: aggregate decode speed of B sequences decoded together. */
static q3_status bench_batch(const char *model, q3_bench_opts *o, const int *batches, int nb, int json, int limits,
                             const char *unit)
{
    q3_model *m;
    q3_status st = q3_model_open(model, &m);
    if (st) return st;
    o->prefill_unit = o->decode_unit = unit;
    if (o->gen == 64) o->gen = 16; /* the default --gen: 16 steps per batch size */
    q3_batch_result res[32];
    bool moe = q3_config_is_moe(&m->cfg);
    if (!json) fprintf(stderr, "  measuring batched decode at depth %d ...\n", o->depth);
    q3_load load;
    q3_load_begin(&load);
    if ((st = q3_bench_batch(m, o, batches, nb, res))) {
        q3_model_close(m);
        return st;
    }
    q3_load_end(&load);
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    double peak_rss = (double)ru.ru_maxrss * 1024.0;
    int nth = q3_cpu_default_threads();
    double bw = 0, peak = 0;
    const char *peak_name = "BF16 dot";
    q3_dtype wt = m->w.layers[0].wq->dtype;
    q3_limit_kind kind = Q3_LIMIT_DOT_BF16;
    if (wt == Q3_Q8_0 || wt == Q3_Q4_0) kind = Q3_LIMIT_DOT_INT8, peak_name = "INT8 dot";
    else if (wt == Q3_F32 || wt == Q3_F16) kind = Q3_LIMIT_FMA_F32, peak_name = "FP32 FMA";
    if (limits) {
        if (!json) fprintf(stderr, "  measuring the machine's limits ...\n");
        bw = q3_limit_read_gbs(nth, (size_t)512 << 20, 2);
        peak = q3_limit_peak(kind, nth, 0.2, NULL);
    }
    cJSON *root = NULL, *jr = NULL;
    if (json) {
        root = cJSON_CreateObject();
        cJSON_AddStringToObject(root, "schema", "q3.bench.batch/1");
        cJSON_AddStringToObject(root, "model", model);
        cJSON_AddNumberToObject(root, "depth", o->depth);
        cJSON_AddNumberToObject(root, "steps", o->gen);
        cJSON_AddNumberToObject(root, "threads", nth);
        if (limits) { /* not measured: absent, never a zero that reads as measured */
            cJSON_AddNumberToObject(root, "read_gb_s", bw);
            cJSON_AddNumberToObject(root, "peak_gflop_s", peak);
            cJSON_AddStringToObject(root, "peak_instruction", peak_name);
        }
        cJSON_AddNumberToObject(root, "peak_rss_bytes", peak_rss);
        cJSON_AddItemToObject(root, "load", load_json(&load));
        if (moe) {
            cJSON_AddNumberToObject(root, "n_experts", m->cfg.n_experts);
            cJSON_AddNumberToObject(root, "n_experts_used", m->cfg.n_experts_used);
        }
        jr = cJSON_AddArrayToObject(root, "batches");
    } else {
        printf("q3 bench --batch: %s, depth %d, %d steps per batch size, %d thread%s, cpu kernels %s", model, o->depth, o->gen,
               nth, nth == 1 ? "" : "s", q3_cpu_default_isa_name());
        if (limits) printf("; read %.1f GB/s, %s peak %.0f GFLOP/s (measured after)\n", bw, peak_name, peak);
        else printf("; machine limits not measured (--no-limits): no bound columns\n");
        if (moe)
            printf("mixture of experts: %d experts a layer, %d a token; a step reads the union of its rows' experts\n",
                   m->cfg.n_experts, m->cfg.n_experts_used);
        printf("\n%5s %10s %10s %10s %8s %11s %10s", "B", "tok/s", "vs B=1", "ms/step", "p99", "GB/step", "(KV GB)");
        if (limits) printf(" %9s %-10s %8s", "bound ms", "limit", "reached");
        if (moe) printf(" %17s", "experts/layer");
        printf("\n");
    }
    for (int i = 0; i < nb; i++) {
        const q3_batch_result *r = &res[i];
        double bytes = r->weight_bytes + r->kv_bytes;
        double bw_ms = bw > 0 ? bytes / (bw * 1e6) : 0, fl_ms = peak > 0 ? r->flops / (peak * 1e6) : 0;
        double bound = bw_ms > fl_ms ? bw_ms : fl_ms;
        const char *limit = bw_ms >= fl_ms ? "bandwidth" : "arithmetic";
        double speedup = r->tok_s / res[0].tok_s;
        if (json) {
            cJSON *x = cJSON_CreateObject();
            cJSON_AddNumberToObject(x, "batch", r->batch);
            cJSON_AddNumberToObject(x, "tok_s", r->tok_s);
            cJSON_AddNumberToObject(x, "speedup_vs_first", speedup);
            cJSON_AddItemToObject(x, "step_ms", stats_json(&r->step_ms));
            cJSON_AddNumberToObject(x, "weight_bytes", r->weight_bytes);
            cJSON_AddNumberToObject(x, "kv_bytes", r->kv_bytes);
            cJSON_AddNumberToObject(x, "flops", r->flops);
            if (limits) {
                cJSON_AddNumberToObject(x, "bound_ms", bound);
                cJSON_AddStringToObject(x, "limit", limit);
                cJSON_AddNumberToObject(x, "fraction_of_bound", bound / r->step_ms.mean);
            }
            if (moe) {
                cJSON_AddNumberToObject(x, "experts_measured", r->experts_measured);
                cJSON_AddNumberToObject(x, "experts_expected", r->experts_expected);
            }
            cJSON_AddItemToArray(jr, x);
        } else {
            printf("%5d %10.1f %9.2fx %10.2f %8.2f %11.3f %10.3f", r->batch, r->tok_s, speedup, r->step_ms.p50, r->step_ms.p99,
                   bytes / 1e9, r->kv_bytes / 1e9);
            if (limits) printf(" %9.2f %-10s %7.0f%%", bound, limit, 100 * bound / r->step_ms.mean);
            if (moe) printf(" %8.2f (%6.2f)", r->experts_measured, r->experts_expected);
            printf("\n");
        }
    }
    if (json) {
        char *text = cJSON_Print(root);
        printf("%s\n", text);
        free(text);
        cJSON_Delete(root);
    } else {
        printf("\n'tok/s': B / the mean step time; 'vs B=1': aggregate tok/s against the first batch size of the list, same run");
        if (limits) printf("; 'reached': the bound (bytes / read bandwidth, or FLOPs / peak) over the mean step time");
        printf(". Peak resident memory %.0f MB.\n", peak_rss / 1e6);
        print_load(&load);
        if (moe)
            printf("'experts/layer': distinct experts a layer read per step, counted from the router's choices of the timed "
                   "steps (random tokens), and in parentheses E(1-(1-k/E)^B), uniform routing; GB/step counts the counted "
                   "union.\n");
    }
    q3_model_close(m);
    return Q3_OK;
}

q3_status q3_bench_report(q3_bench_report_opts *ro)
{
    const char *model = ro->model, *units_arg = ro->units, *svg = ro->svg;
    const char *prefill_on = ro->prefill_on, *decode_on = ro->decode_on;
    q3_bench_opts o = ro->bench;
    double drain = ro->drain;
    int json = ro->json, limits = ro->limits;
    if (ro->n_batches)
        return bench_batch(model, &o, ro->batches, ro->n_batches, json, limits, units_arg ? units_arg : decode_on);

    /* the unit pairs to measure */
    run runs[16];
    int n_runs = 0;
    if (prefill_on) {
        q3_status st = check_unit(prefill_on);
        if (st || (st = check_unit(decode_on))) return st;
        snprintf(runs[0].prefill_unit, 16, "%s", prefill_on);
        snprintf(runs[0].decode_unit, 16, "%s", decode_on);
        n_runs = 1;
    } else if (units_arg && strcmp(units_arg, "all")) {
        char list[256];
        snprintf(list, sizeof list, "%s", units_arg);
        for (char *t = strtok(list, ","); t && n_runs < 16; t = strtok(NULL, ",")) {
            q3_status st = check_unit(t);
            if (st) return st;
            snprintf(runs[n_runs].prefill_unit, 16, "%s", t);
            snprintf(runs[n_runs].decode_unit, 16, "%s", t);
            n_runs++;
        }
    } else {
        int all = units_arg != NULL;
        for (int i = 0; q3_backends[i] && n_runs < 16; i++) {
            const q3_backend *b = q3_backends[i];
            if ((b->present && !b->present(b)) || (b == &q3_backend_ref && !all)) continue;
            snprintf(runs[n_runs].prefill_unit, 16, "%s", b->name);
            snprintf(runs[n_runs].decode_unit, 16, "%s", b->name);
            n_runs++;
        }
        if (n_runs == 0) { /* only the reference unit is built in */
            snprintf(runs[0].prefill_unit, 16, "ref");
            snprintf(runs[0].decode_unit, 16, "ref");
            n_runs = 1;
        }
    }

    /* time to first token: open the model, prefill 16 tokens, pick the first */
    double t_open = q3_now();
    q3_model *m;
    q3_status rc = q3_model_open(model, &m);
    if (rc) return rc;
    double ttft_ms = -1;
    {
        q3_session *s;
        q3_session_opts so = {.n_ctx = 64, .chunk = o.chunk, .prefill_backend = runs[0].prefill_unit,
                              .decode_backend = runs[0].decode_unit, .kv_dtype = o.kv_dtype};
        int32_t first[16];
        for (int i = 0; i < 16; i++) first[i] = (int32_t)((i * 7919 + 13) % m->cfg.vocab_size);
        float *lg = malloc((size_t)m->cfg.vocab_size * sizeof *lg);
        if (lg && !q3_session_new(m, &so, &s)) {
            if (!q3_session_prefill(s, first, 16, lg, 0)) ttft_ms = 1e3 * (q3_now() - t_open);
            q3_session_free(s);
        }
        free(lg);
    }
    size_t wbytes = q3_model_weight_bytes(m), params = q3_model_param_count(m);
    size_t abytes = q3_model_active_bytes(m), aparams = q3_model_active_params(m);
    bool moe = q3_config_is_moe(&m->cfg);
    if (!json) {
        printf("q3 bench: %s (%.2f B params, %.2f GB of weights", model, (double)params / 1e9, (double)wbytes / 1e9);
        if (moe)
            printf("; mixture of experts, %d of %d a layer: %.2f B params, %.2f GB active per token", m->cfg.n_experts_used,
                   m->cfg.n_experts, (double)aparams / 1e9, (double)abytes / 1e9);
        int prompt = o.prompt_len > 0 ? o.prompt_len : o.chunk, depth = o.depth > prompt ? o.depth : prompt;
        printf("), chunk %d, prompt %d; decode of %d tokens from depth %d (%s), drain %.0f tok/s; %d thread%s, cpu kernels %s\n",
               o.chunk, prompt, o.gen, depth, o.depth > prompt ? "--depth" : "after the prompt", drain,
               q3_cpu_default_threads(), q3_cpu_default_threads() == 1 ? "" : "s", q3_cpu_default_isa_name());
    }
    q3_load load;
    q3_load_begin(&load);
    for (int i = 0; i < n_runs; i++) {
        o.prefill_unit = runs[i].prefill_unit;
        o.decode_unit = runs[i].decode_unit;
        if (!json) fprintf(stderr, "  measuring %s -> %s ...\n", o.prefill_unit, o.decode_unit);
        if ((rc = q3_bench_run(m, &o, &runs[i].r))) { /* no table of what was not measured */
            q3_fail_wrap(rc, "%s -> %s", o.prefill_unit, o.decode_unit);
            for (int k = 0; k < i; k++) {
                free(runs[k].r.generated);
                free(runs[k].sample);
            }
            q3_model_close(m);
            return rc;
        }
        runs[i].sample = sample_text(model, m->cfg.vocab_size, runs[i].r.generated, runs[i].r.n_generated);
    }
    q3_load_end(&load); /* the runs alone: the limit benchmarks below load the machine on purpose */
    /* peak memory of the runs, before the limit benchmarks allocate their buffer */
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    double peak_rss = (double)ru.ru_maxrss * 1024.0;
    /* the machine's limits, measured in the same run */
    int nth = q3_cpu_default_threads(); /* what the units ran with */
    double bw1 = 0, bw = 0, peak[Q3_LIMIT_KIND_COUNT] = {0};
    if (limits) {
        if (!json) fprintf(stderr, "  measuring the machine's limits ...\n");
        bw1 = q3_limit_read_gbs(1, (size_t)512 << 20, 2);
        bw = q3_limit_read_gbs(nth, (size_t)512 << 20, 2);
        for (int k = 0; k < Q3_LIMIT_KIND_COUNT; k++) {
            const char *isa;
            peak[k] = q3_limit_peak((q3_limit_kind)k, nth, 0.2, &isa);
        }
    }
    /* the prefill peak to compare with: AMX where the CPU has it (the cpu unit then uses it), else the BF16 dot */
    double prefill_peak = peak[Q3_LIMIT_AMX_BF16] > 0 ? peak[Q3_LIMIT_AMX_BF16] : peak[Q3_LIMIT_DOT_BF16];
    const char *prefill_peak_name = peak[Q3_LIMIT_AMX_BF16] > 0 ? "AMX BF16" : "BF16 dot";
    if (!json) {
        printf("\n%-13s %-26s %12s %-26s %7s %10s %12s\n", "unit", "prefill ms/chunk p50/p99", "prompt tok/s",
               "decode ms/tok p50/mean/p99", "p99/p50", "tok/s mean", "RTFx");
        int tails = 0;
        for (int i = 0; i < n_runs; i++) {
            const q3_bench_result *r = &runs[i].r;
            char unit[40], pre[40], dec[48];
            if (strcmp(runs[i].prefill_unit, runs[i].decode_unit))
                snprintf(unit, sizeof unit, "%s->%s", runs[i].prefill_unit, runs[i].decode_unit);
            else
                snprintf(unit, sizeof unit, "%s", runs[i].prefill_unit);
            snprintf(pre, sizeof pre, "%.1f / %.1f", r->prefill_ms.p50 / r->n_chunks, r->prefill_ms.p99 / r->n_chunks);
            snprintf(dec, sizeof dec, "%.2f / %.2f / %.2f", r->decode_ms.p50, r->decode_ms.mean, r->decode_ms.p99);
            double rtfx = r->decode_tok_s / drain, ratio = r->decode_ms.p50 > 0 ? r->decode_ms.p99 / r->decode_ms.p50 : 0;
            char tail[16];
            snprintf(tail, sizeof tail, "%.2f%s", ratio, ratio > TAIL_RATIO ? "!" : "");
            tails += ratio > TAIL_RATIO;
            printf("%-13s %-26s %12.1f %-26s %7s %10.2f %7.2f %s\n", unit, pre, r->prompt_tok_s, dec, tail, r->decode_tok_s,
                   rtfx, rtfx > 1 ? "PASS" : "FAIL");
        }
        printf("%-13s %-26s %12s %-26s %7s %10.2f %7.2f (laptop GPU)\n", "experiment", "46.0 CPU/12.5 ANE/9.3 GPU", "-",
               "-", "-", experiment_decode_tok_s, experiment_rtfx);
        printf("\n'tok/s mean': 1000 / the mean decode ms/token, the sustained rate; RTFx = it / the drain rate, PASS above 1.\n"
               "'p99/p50': the decode tail; '!' above %.1f (a few tokens far slower than the median).\n"
               "'experiment': the published split-phase run on one laptop (prefill ms per 128-token chunk on its\n"
               "CPU, neural accelerator and GPU; decode %.0f tok/s on its GPU); '-': it published no such figure.\n",
               TAIL_RATIO, experiment_decode_tok_s);
        if (tails)
            printf("TAIL: %d unit%s decoded with p99 over %.1fx p50: the mean (and RTFx) is below what the median suggests.\n",
                   tails, tails == 1 ? "" : "s", TAIL_RATIO);
        print_load(&load);
        for (int i = 0; i < n_runs; i++) {
            const q3_bench_result *r = &runs[i].r;
            printf("\n%s: prefill of %d tokens (%d chunks): %.1f GFLOP/s (%.1f GFLOP, spread %.1f-%.1f ms over %d runs), "
                   "K/V hand-off %.2f ms per chunk\n",
                   runs[i].prefill_unit, r->prompt_len, r->n_chunks, r->prefill_flops / (r->prefill_ms.p50 * 1e6),
                   r->prefill_flops / 1e9, r->prefill_ms.min, r->prefill_ms.max, r->prefill_ms.n, r->handoff_ms);
            printf("%s: decode streams %.3f GB per token (weights %.3f GB%s, K/V %.3f GB) = %.1f GB/s (mean; spread "
                   "%.2f-%.2f ms over %d tokens)\n",
                   runs[i].decode_unit, r->decode_bytes / 1e9, r->active_bytes / 1e9, moe ? " active" : "",
                   r->kv_bytes / 1e9, r->decode_bytes / (r->decode_ms.mean * 1e6), r->decode_ms.min, r->decode_ms.max,
                   r->decode_ms.n);
            if (runs[i].sample) printf("%s: sample (greedy, random weights): %.200s\n", runs[i].decode_unit, runs[i].sample);
        }
        if (limits) {
            char amx[32] = "none";
            if (peak[Q3_LIMIT_AMX_BF16] > 0) snprintf(amx, sizeof amx, "%.0f", peak[Q3_LIMIT_AMX_BF16]);
            printf("\nmachine (measured now, %d thread%s): read %.1f GB/s (1 thread %.1f); peak FP32 FMA %.0f, BF16 dot "
                   "%.0f, AMX BF16 %s GFLOP/s, INT8 dot %.0f GOP/s\n",
                   nth, nth == 1 ? "" : "s", bw, bw1, peak[Q3_LIMIT_FMA_F32], peak[Q3_LIMIT_DOT_BF16], amx,
                   peak[Q3_LIMIT_DOT_INT8]);
            for (int i = 0; i < n_runs; i++) {
                const q3_bench_result *r = &runs[i].r;
                double bound_ms = r->decode_bytes / (bw * 1e6);
                printf("%s: decode (mean) at %.0f%% of the measured read bandwidth; prefill at %.0f%% of the %s peak\n",
                       runs[i].decode_unit, 100 * r->decode_bytes / (r->decode_ms.mean * 1e6) / bw,
                       100 * r->prefill_flops / (r->prefill_ms.p50 * 1e6) / prefill_peak, prefill_peak_name);
                printf("%s: decode bound %.3f ms/token = %.1f tok/s (%s + K/V bytes / read bandwidth); measured "
                       "mean %.3f ms\n", runs[i].decode_unit, bound_ms, 1e3 / bound_ms, moe ? "active weight" : "weight",
                       r->decode_ms.mean);
            }
        }
        printf("\nopen + first token of a 16-token prompt: %.1f ms; peak resident memory %.0f MB "
               "(weights %.0f MB, mmapped)\n", ttft_ms, peak_rss / 1e6, (double)wbytes / 1e6);
    } else {
        cJSON *root = cJSON_CreateObject();
        cJSON_AddStringToObject(root, "schema", "q3.bench/1");
        cJSON *jm = cJSON_AddObjectToObject(root, "model");
        cJSON_AddStringToObject(jm, "path", model);
        cJSON_AddNumberToObject(jm, "params", (double)params);
        cJSON_AddNumberToObject(jm, "weight_bytes", (double)wbytes);
        cJSON_AddNumberToObject(jm, "active_params", (double)aparams);
        cJSON_AddNumberToObject(jm, "active_bytes", (double)abytes);
        if (moe) {
            cJSON_AddNumberToObject(jm, "n_experts", m->cfg.n_experts);
            cJSON_AddNumberToObject(jm, "n_experts_used", m->cfg.n_experts_used);
        }
        cJSON *jc = cJSON_AddObjectToObject(root, "settings");
        cJSON_AddNumberToObject(jc, "chunk", o.chunk);
        cJSON_AddNumberToObject(jc, "gen", o.gen);
        cJSON_AddNumberToObject(jc, "repeats", o.repeats);
        cJSON_AddNumberToObject(jc, "drain_tok_s", drain);
        cJSON_AddNumberToObject(jc, "prompt_len", o.prompt_len > 0 ? o.prompt_len : o.chunk);
        cJSON_AddNumberToObject(jc, "depth", o.depth);
        int prompt = o.prompt_len > 0 ? o.prompt_len : o.chunk;
        cJSON_AddNumberToObject(jc, "decode_depth", o.depth > prompt ? o.depth : prompt);
        cJSON_AddNumberToObject(jc, "threads", q3_cpu_default_threads());
        cJSON_AddStringToObject(jc, "cpu_kernels", q3_cpu_default_isa_name());
        cJSON_AddNumberToObject(root, "ttft_ms", ttft_ms);
        cJSON_AddNumberToObject(root, "peak_rss_bytes", peak_rss);
        cJSON_AddItemToObject(root, "load", load_json(&load));
        if (limits) {
            cJSON *mc = cJSON_AddObjectToObject(root, "machine");
            cJSON_AddNumberToObject(mc, "threads", nth);
            cJSON_AddNumberToObject(mc, "read_gb_s_1thread", bw1);
            cJSON_AddNumberToObject(mc, "read_gb_s", bw);
            cJSON_AddNumberToObject(mc, "fp32_fma_gflop_s", peak[Q3_LIMIT_FMA_F32]);
            cJSON_AddNumberToObject(mc, "bf16_dot_gflop_s", peak[Q3_LIMIT_DOT_BF16]);
            cJSON_AddNumberToObject(mc, "amx_bf16_gflop_s", peak[Q3_LIMIT_AMX_BF16] > 0 ? peak[Q3_LIMIT_AMX_BF16] : 0);
            cJSON_AddNumberToObject(mc, "int8_dot_gop_s", peak[Q3_LIMIT_DOT_INT8]);
        }
        cJSON *jr = cJSON_AddArrayToObject(root, "runs");
        for (int i = 0; i < n_runs; i++) {
            const q3_bench_result *r = &runs[i].r;
            cJSON *x = cJSON_CreateObject();
            cJSON_AddStringToObject(x, "prefill_unit", runs[i].prefill_unit);
            cJSON_AddStringToObject(x, "decode_unit", runs[i].decode_unit);
            q3_stats per_chunk = r->prefill_ms;
            per_chunk.p50 /= r->n_chunks, per_chunk.p99 /= r->n_chunks, per_chunk.mean /= r->n_chunks;
            per_chunk.min /= r->n_chunks, per_chunk.max /= r->n_chunks, per_chunk.sd /= r->n_chunks;
            cJSON_AddItemToObject(x, "prefill_ms", stats_json(&per_chunk));
            cJSON_AddNumberToObject(x, "prompt_tok_s", r->prompt_tok_s);
            cJSON_AddItemToObject(x, "decode_ms", stats_json(&r->decode_ms));
            cJSON_AddNumberToObject(x, "decode_tok_s", r->decode_tok_s);
            double ratio = r->decode_ms.p50 > 0 ? r->decode_ms.p99 / r->decode_ms.p50 : 0;
            cJSON_AddNumberToObject(x, "decode_p99_over_p50", ratio);
            cJSON_AddBoolToObject(x, "decode_tail", ratio > TAIL_RATIO);
            cJSON_AddNumberToObject(x, "rtfx", r->decode_tok_s / drain);
            cJSON_AddBoolToObject(x, "realtime", r->decode_tok_s > drain);
            cJSON_AddNumberToObject(x, "handoff_ms", r->handoff_ms);
            cJSON_AddNumberToObject(x, "prefill_gflop_s", r->prefill_flops / (r->prefill_ms.p50 * 1e6));
            cJSON_AddNumberToObject(x, "decode_gb_s", r->decode_bytes / (r->decode_ms.mean * 1e6));
            cJSON_AddNumberToObject(x, "decode_bytes", r->decode_bytes);
            cJSON_AddNumberToObject(x, "decode_weight_bytes", r->active_bytes);
            cJSON_AddNumberToObject(x, "decode_kv_bytes", r->kv_bytes);
            if (limits && bw > 0 && prefill_peak > 0) {
                cJSON_AddNumberToObject(x, "decode_bound_ms", r->decode_bytes / (bw * 1e6));
                cJSON_AddNumberToObject(x, "decode_fraction_of_bandwidth", r->decode_bytes / (r->decode_ms.mean * 1e6) / bw);
                cJSON_AddNumberToObject(x, "prefill_fraction_of_peak",
                                        r->prefill_flops / (r->prefill_ms.p50 * 1e6) / prefill_peak);
            }
            if (runs[i].sample) cJSON_AddStringToObject(x, "sample_text", runs[i].sample);
            cJSON_AddItemToArray(jr, x);
        }
        cJSON *je = cJSON_AddObjectToObject(root, "experiment");
        cJSON *jp = cJSON_AddObjectToObject(je, "prefill_ms_per_128");
        for (int i = 0; i < 3; i++) cJSON_AddNumberToObject(jp, experiment_prefill[i].unit, experiment_prefill[i].prefill_ms);
        cJSON_AddNumberToObject(je, "decode_tok_s_gpu", experiment_decode_tok_s);
        cJSON_AddNumberToObject(je, "rtfx_gpu", experiment_rtfx);
        char *text = cJSON_Print(root);
        printf("%s\n", text);
        free(text);
        cJSON_Delete(root);
    }
    if (svg && n_runs > 0) {
        if (write_svg(svg, runs, n_runs, o.chunk, drain, model))
            rc = q3_fail_wrap(Q3_ERR_IO, "%s: cannot write the chart", svg);
        else if (!json)
            printf("\nchart: %s\n", svg);
    }
    for (int i = 0; i < n_runs; i++) {
        free(runs[i].r.generated);
        free(runs[i].sample);
    }
    q3_model_close(m);
    return rc;
}
