/* q3 synth: writes a Qwen3 checkpoint folder with deterministic random
 * weights (Qwen3-0.6B's shapes by default; tools/synth_run.c does the work). */
#include <limits.h>

#include "cli/cli.h"
#include "cli/opts.h"
#include "q3.h"
#include "tools/files.h"
#include "tools/synth_run.h"

int cmd_synth(int argc, char **argv)
{
    const char *out_dir = NULL, *preset = "0.6b", *config_path = NULL, *tokenizer_dir = NULL;
    const char *dtype_name = NULL, *type_name = NULL, *name = NULL;
    long long seed = 0;
    int no_tokenizer = 0, layers = 0, quiet = 0;
    const cli_opt tab[] = {
        CLI_OPT("output", 'o', CLI_STR, &out_dir, "PATH",
                "output folder (created if missing; files in it are replaced),\n"
                "or with --type the GGUF file (renamed into place when complete)",
                .flags = CLI_REQUIRED),
        CLI_OPT("seed", 's', CLI_LLONG, &seed, "N", "weights depend only on the seed, dtype and config (default 0)",
                .lo = 0, .hi = (double)LLONG_MAX),
        CLI_OPT("dtype", 0, CLI_STR, &dtype_name, "T", "bf16 or f32 (default bf16, or f32 if --config says float32)"),
        CLI_OPT("preset", 0, CLI_STR, &preset, "NAME",
                "0.6b: Qwen3-0.6B's shapes (default); tiny: a 2-layer test model;\n"
                "qwen3-30b-a3b, qwen3-235b-a22b: those mixtures of experts' shapes;\n"
                "tiny-moe: a 2-layer mixture of experts for tests;\n"
                "qwen3-embedding-0.6b, qwen3-reranker-0.6b: 0.6B's shapes, marked\n"
                "as an embedding model / a reranker (docs/embeddings.md)"),
        CLI_OPT("arch", 0, CLI_STR, &preset, "NAME", "the same as --preset (e.g. --arch qwen3-30b-a3b)"),
        CLI_OPT("layers", 0, CLI_INT, &layers, "N", "only the first N layers of the preset or config", .lo = 1,
                .hi = 100000),
        CLI_OPT("type", 0, CLI_STR, &type_name, "T",
                "write a GGUF of this type (as q3 convert --type: f32, f16, bf16, q8_0, q4_0,\n"
                "q4_k_m, q4_k_s, q5_k_m, q5_k_s, q6_k) to -o, streamed from the generator:\n"
                "the bytes q3 convert --type T of the folder would write, without the\n"
                "folder, in memory bounded by the largest tensor (--dtype: the values'\n"
                "precision before conversion)"),
        CLI_OPT("name", 0, CLI_STR, &name, "NAME", "with --type: general.name (default: the file's base name)"),
        CLI_OPT("quiet", 'q', CLI_FLAG, &quiet, NULL, "with --type: no progress on stderr"),
        CLI_OPT("config", 0, CLI_FILE, &config_path, "FILE", "take the shapes from a Qwen3 config.json instead of a preset"),
        CLI_OPT("tokenizer", 0, CLI_FILE, &tokenizer_dir, "DIR",
                "copy DIR/tokenizer.json and tokenizer_config.json alongside, or with\n"
                "--type embed that tokenizer (default: the\n"
                "built-in Qwen3 tokenizer when its vocabulary fits the model's, so that\n"
                "q3 run -m DIR works)"),
        CLI_OPT("no-tokenizer", 0, CLI_FLAG, &no_tokenizer, NULL, "write no tokenizer"),
        {0},
    };
    cli_spec spec = {"synth", "q3 synth -o DIR [--seed N] [--dtype bf16|f32] [--preset NAME] [--config FILE] [--layers N]\n"
                              "q3 synth -o OUT.gguf --type T [--preset NAME] [--layers N] [options]",
                     "Writes DIR/config.json and DIR/model.safetensors with random weights scaled like\n"
                     "a trained model's (matrices N(0, 0.02), norms 1 + 0.05 N(0, 1), a MoE router\n"
                     "N(0, 1/hidden)); with --type, that model as a GGUF file instead.\n",
                     tab, 0, NULL};
    int rc = cli_parse(&spec, argc, argv, NULL);
    if (rc) return rc == CLI_HELP_SHOWN ? 0 : rc;
    if (no_tokenizer && tokenizer_dir) return cli_usage_error("synth", "--no-tokenizer and --tokenizer contradict");
    if (name && !type_name) return cli_usage_error("synth", "--name names a GGUF: give --type too");
    if (type_name && q3_tool_output_check(out_dir)) return cli_error("synth", "-o: %s", q3_last_error());
    q3_synth_run_opts o = {.out_dir = out_dir, .seed = seed, .dtype_name = dtype_name, .preset = preset,
                           .config_path = config_path, .tokenizer_dir = tokenizer_dir, .no_tokenizer = no_tokenizer,
                           .layers = layers, .type_name = type_name, .name = name, .quiet = quiet};
    int usage = 0;
    if (q3_synth_run(&o, &usage)) return (usage ? cli_usage_error : cli_error)("synth", "%s", q3_last_error());
    return 0;
}
