/* q3 compare: what quantizing the weights (or the KV cache) costs in accuracy.
 * For each type the model is quantized (through a temporary GGUF), and token
 * sequences are run through both it and the model as given; the report has the
 * KL divergence of the next-token distribution and the top-1 agreement. With
 * --kv, the model as given runs with each KV cache type against a reference
 * KV cache type instead (tools/compare.c does the work). */
#include "cli/cli.h"
#include "cli/opts.h"
#include "q3.h"
#include "tools/compare.h"

#define DEFAULT_CASES Q3_COMPARE_DEFAULT_CASES

int cmd_compare(int argc, char **argv)
{
    const char *model = NULL, *types_arg = "q8_0,q4_0", *cases = NULL, *backend = NULL, *kv_arg = NULL,
               *kv_ref_arg = "f16";
    const cli_opt tab[] = {
        CLI_OPT("model", 'm', CLI_FILE, &model, "PATH", "the model to compare against", .flags = CLI_REQUIRED),
        CLI_OPT("types", 0, CLI_STR, &types_arg, "LIST", "comma-separated: f16, bf16, q8_0, q4_0 (default q8_0,q4_0)"),
        CLI_OPT("type", 0, CLI_STR, &types_arg, "LIST", NULL, .flags = CLI_HIDDEN),
        CLI_OPT("cases", 0, CLI_FILE, &cases, "DIR",
                "token sequences: the \"tokens\" of every DIR/*.json (duplicates run once);\n"
                "default MODEL/cases if present, else the golden cases of the q3 source\n"
                "tree the binary was built in (" DEFAULT_CASES " beside build/)"),
        CLI_OPT("backend", 0, CLI_STR, &backend, "UNIT",
                "compute unit (default ref: the scalar reference; cpu with --kv)"),
        CLI_OPT("kv", 0, CLI_STR, &kv_arg, "LIST",
                "compare KV cache types instead (f32, f16, bf16, q8_0): MODEL as given with\n"
                "each, against MODEL with a --kv-ref cache; the size column is then KV bytes\n"
                "per token"),
        CLI_OPT("kv-ref", 0, CLI_STR, &kv_ref_arg, "TYPE", "the reference KV cache type of --kv (default f16)"),
        {0},
    };
    cli_spec spec = {"compare", "q3 compare -m MODEL [--types q8_0,q4_0 | --kv q8_0 [--kv-ref f16]] [--cases DIR] [--backend UNIT]",
                     "Quantizes MODEL to each type and runs token sequences through the quantized model\n"
                     "and MODEL as given, then prints per type: the mean and max KL divergence of the\n"
                     "next-token distribution from MODEL's (nats), top-1 agreement, the largest logit\n"
                     "difference and the weights' size.\n",
                     tab, 0, NULL};
    int prc = cli_parse(&spec, argc, argv, NULL);
    if (prc) return prc == CLI_HELP_SHOWN ? 0 : prc;
    q3_compare_opts o = {.model = model, .types = types_arg, .cases = cases, .backend = backend, .kv = kv_arg,
                         .kv_ref = kv_ref_arg};
    int usage = 0;
    if (q3_compare_run(&o, &usage)) return (usage ? cli_usage_error : cli_error)("compare", "%s", q3_last_error());
    return 0;
}
