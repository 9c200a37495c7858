/* q3 bench: the split-phase experiment's table on the machine at hand —
 * prefill ms per chunk and decode ms/token per compute unit, tok/s, RTFx
 * (tools/bench_report.c measures and prints). */
#include <stdio.h>
#include <stdlib.h>

#include "cli/args.h"
#include "cli/cli.h"
#include "cli/opts.h"
#include "q3.h"
#include "tools/bench_report.h"
#include "tools/defaults.h"

int cmd_bench(int argc, char **argv)
{
    const char *model = NULL, *units_arg = NULL, *svg = NULL, *prefill_on = NULL, *decode_on = NULL;
    q3_bench_opts o = {.chunk = 128, .gen = 64, .repeats = 5};
    double drain = 15;
    int json = 0, limits = 1, no_limits = 0;
    const char *batch_arg = NULL;
    int threads = 0;
    const cli_opt tab[] = {
        CLI_OPT("model", 'm', CLI_FILE, &model, "PATH",
                "the model (default: a synthetic Qwen3-0.6B with random BF16 weights,\n"
                "built once into the cache folder: $Q3_MODELS, else $Q3_CACHE_DIR, else\n"
                "$XDG_CACHE_HOME/q3, else ~/.cache/q3)"),
        CLI_OPT("threads", 't', CLI_INT, &threads, "N",
                "CPU threads of every unit opened (default: one per physical core, or $Q3_THREADS)", .lo = 1, .hi = 256),
        CLI_OPT("compute-units", 0, CLI_STR, &units_arg, "LIST",
                "units to measure, e.g. cpu,ref, or all (default: every present unit but\n"
                "the scalar reference)"),
        CLI_OPT("backend", 0, CLI_STR, &units_arg, "LIST", NULL, .flags = CLI_HIDDEN),
        CLI_OPT("chunk", 0, CLI_INT, &o.chunk, "N", "prefill chunk in tokens (default 128)", .lo = 1, .hi = 4096),
        CLI_OPT("gen", 0, CLI_INT, &o.gen, "N", "decode tokens timed (default 64)", .lo = 1, .hi = 100000),
        CLI_OPT("repeats", 0, CLI_INT, &o.repeats, "N", "prefill runs timed (default 5)", .lo = 1, .hi = 10000),
        CLI_OPT("prompt", 0, CLI_INT, &o.prompt_len, "N", "time prefill of an N-token prompt, in chunks (default: one chunk)",
                .lo = 0, .hi = CLI_MAX_CTX),
        CLI_OPT("depth", 0, CLI_INT, &o.depth, "N", "time decode with N tokens already cached (default: the prompt)",
                .lo = 0, .hi = CLI_MAX_CTX),
        CLI_OPT("drain", 0, CLI_DOUBLE, &drain, "R",
                "the drain rate in tok/s that RTFx divides by (default 15: brisk speech)", .lo = 1e-3, .hi = 1e6),
        CLI_OPT("kv", 0, CLI_STR, &o.kv_dtype, "TYPE", "KV cache type: f32, f16, bf16 or q8_0"),
        CLI_OPT("prefill-on", 0, CLI_STR, &prefill_on, "UNIT", "split-phase: prefill on this unit ..."),
        CLI_OPT("decode-on", 0, CLI_STR, &decode_on, "UNIT", "... and decode on this one"),
        CLI_OPT("batch", 0, CLI_STR, &batch_arg, "LIST",
                "batched decode instead, e.g. 1,2,4,8: for each B, B sequences at --depth\n"
                "(default 512) decoded together, one row each per step: aggregate tok/s,\n"
                "ms per step, bytes a step reads and the bound they give at the measured\n"
                "bandwidth (or the arithmetic peak, whichever is slower); a mixture-of-experts\n"
                "model: the distinct experts a layer read per step, counted and expected"),
        CLI_OPT("json", 0, CLI_FLAG, &json, NULL, "one JSON object (docs/bench.schema.json)"),
        CLI_OPT("svg", 0, CLI_STR, &svg, "FILE", "also draw the table as a bar chart"),
        CLI_OPT("no-limits", 0, CLI_FLAG, &no_limits, NULL,
                "skip measuring the machine's read bandwidth and arithmetic peaks\n"
                "(faster; no 'fraction of the limit' lines)"),
        {0},
    };
    cli_spec spec = {"bench", "q3 bench [-m MODEL] [-t N] [--compute-units U1,U2|all] [options]",
                     "The split-phase experiment's table on this machine, per compute unit:\n"
                     "  prefill ms/chunk   one prefill run of --chunk tokens (p50 / p99)\n"
                     "  prompt tok/s       prefill tokens per second\n"
                     "  decode ms/tok      one decode step, from --depth or right after the prompt\n"
                     "                     (p50 / mean / p99)\n"
                     "  p99/p50            the decode tail; '!' above 1.5\n"
                     "  tok/s mean         decode tokens per second, 1000 / the mean ms: the sustained\n"
                     "                     rate the verdict uses\n"
                     "  RTFx               real-time factor: decode tok/s / the drain rate (--drain, 15\n"
                     "                     tok/s: brisk speech); PASS when above 1, i.e. the model\n"
                     "                     writes faster than a listener drains the text\n"
                     "  experiment         the row q3 is measured against: the split-phase experiment\n"
                     "                     on one laptop (prefill of 128 tokens on its CPU, neural\n"
                     "                     accelerator and GPU; decode on its GPU); '-' where it\n"
                     "                     published no figure\n"
                     "Then the machine's load while the runs were timed, and NOISY RUN when other\n"
                     "processes took more than 10% of the CPUs (or 5% was stolen).\n",
                     tab, 0, NULL};
    int rc = cli_parse(&spec, argc, argv, NULL);
    if (rc) return rc == CLI_HELP_SHOWN ? 0 : rc;
    limits = !no_limits;
    if (threads) { /* every unit this command opens, and the limit measurements, take it */
        char t[16];
        snprintf(t, sizeof t, "%d", threads);
        setenv("Q3_THREADS", t, 1);
    }
    if (!!prefill_on != !!decode_on) return cli_usage_error("bench", "--prefill-on and --decode-on go together");
    if (batch_arg) {
        int batches[32], nb = 0;
        const char *p = batch_arg;
        while (*p && nb < 32) {
            char *end;
            long b = strtol(p, &end, 10);
            if (end == p || b < 1 || b > 256 || (*end && *end != ','))
                return cli_usage_error("bench", "--batch takes a list of sizes 1..256 such as 1,2,4,8 (got '%s')", batch_arg);
            batches[nb++] = (int)b;
            p = *end ? end + 1 : end;
        }
        if (o.depth == 0) o.depth = 512;
        if (o.depth > 1000000) return cli_usage_error("bench", "--depth must be at most 1000000");
        if (!model && q3_default_model("bench", &model)) return cli_error("bench", "%s", q3_last_error());
        q3_bench_report_opts ro = {.model = model, .units = units_arg, .decode_on = decode_on, .json = json,
                                   .limits = limits, .batches = batches, .n_batches = nb, .bench = o};
        if (q3_bench_report(&ro)) return cli_error("bench", "%s", q3_last_error());
        return 0;
    }
    if (!model && q3_default_model("bench", &model)) return cli_error("bench", "%s", q3_last_error());
    q3_bench_report_opts ro = {.model = model, .units = units_arg, .prefill_on = prefill_on, .decode_on = decode_on,
                               .svg = svg, .drain = drain, .json = json, .limits = limits, .bench = o};
    if (q3_bench_report(&ro)) return cli_error("bench", "%s", q3_last_error());
    return 0;
}
