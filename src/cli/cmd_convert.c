/* q3 convert: a model folder (or a GGUF) to a GGUF file llama.cpp loads, with
 * the weights in F32, F16, BF16, Q8_0, Q4_0 or one of llama-quantize's K-quant
 * mixes (Q4_K_M, Q4_K_S, Q5_K_M, Q5_K_S, Q6_K). */
#include <errno.h>
#include <sys/stat.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/opts.h"
#include "q3.h"
#include "tools/convert_run.h"
#include "tools/files.h"

int cmd_convert(int argc, char **argv)
{
    const char *model = NULL, *out = NULL, *type_name = NULL;
    q3_convert_opts o = {0};
    int quiet = 0;
    const char *model_opt = NULL;
    const cli_opt tab[] = {
        CLI_OPT("model", 'm', CLI_FILE, &model_opt, "PATH", "the model (or give it as the first argument)"),
        CLI_OPT("output", 'o', CLI_STR, &out, "OUT.gguf",
                "output file (written under a unique temporary name, renamed when complete)", .flags = CLI_REQUIRED),
        CLI_OPT("type", 0, CLI_STR, &type_name, "T",
                "f32, f16, bf16, q8_0 or q4_0: type of the 2-D weights; norms stay F32,\n"
                "and with q8_0/q4_0 a matrix whose rows are not whole 32-value blocks\n"
                "stays F16 (default: the model's own type when it is f32, f16 or bf16);\n"
                "q4_k_m, q4_k_s, q5_k_m, q5_k_s, q6_k (q4_k, q5_k: the _m mixes):\n"
                "llama-quantize's mix of that name without an importance matrix, tensor\n"
                "for tensor and byte for byte (Q6_K output, Q6_K attn_v/ffn_down in some\n"
                "layers, ...); quantize from the F32/F16/BF16 weights llama-quantize reads"),
        CLI_OPT("outtype", 0, CLI_STR, &type_name, "T", NULL, .flags = CLI_HIDDEN),
        CLI_OPT("tokenizer", 0, CLI_FILE, &o.tokenizer_dir, "DIR",
                "take tokenizer.json / tokenizer_config.json from DIR\n"
                "(default: the model folder, or the source GGUF's tokenizer)"),
        CLI_OPT("name", 0, CLI_STR, &o.name, "NAME", "general.name (default: the model's folder or file name)"),
        CLI_OPT("no-tokenizer", 0, CLI_FLAG, &o.no_tokenizer, NULL, "write no vocabulary (tokenizer.ggml.model \"none\")"),
        CLI_OPT("quiet", 'q', CLI_FLAG, &quiet, NULL, "no progress on stderr"),
        {0},
    };
    cli_spec spec = {"convert", "q3 convert -m MODEL -o OUT.gguf [--type f32|f16|bf16|q8_0|q4_0|q4_k_m|q5_k_m|q6_k|...] [options]\nq3 convert MODEL -o OUT.gguf [options]",
                     "Writes a GGUF (architecture qwen3, or qwen3moe for a mixture of experts; llama.cpp's\n"
                     "tensor names and metadata, the experts stacked into 3-D tensors, the router F32) from\n"
                     "MODEL, a Hugging Face folder (config.json, safetensors, tokenizer.json) or a .gguf.\n",
                     tab, 1, NULL};
    int n_pos = 0;
    int rc = cli_parse(&spec, argc, argv, &n_pos);
    if (rc) return rc == CLI_HELP_SHOWN ? 0 : rc;
    if (n_pos && model_opt) return cli_usage_error("convert", "the model given twice ('%s' and -m '%s')", argv[1], model_opt);
    if (n_pos) {
        struct stat sb;
        if (stat(argv[1], &sb)) return cli_usage_error("convert", "%.200s: %s", argv[1], errno == ENOENT ? "no such file or folder" : strerror(errno));
        model = argv[1];
    } else {
        model = model_opt;
    }
    if (!model) return cli_usage_error("convert", "missing -m/--model PATH");
    if (o.no_tokenizer && o.tokenizer_dir) return cli_usage_error("convert", "--no-tokenizer and --tokenizer contradict");

    if (q3_tool_output_check(out)) return cli_error("convert", "-o: %s", q3_last_error());
    int usage = 0;
    if (q3_convert_run(model, out, type_name, &o, quiet, &usage))
        return (usage ? cli_usage_error : cli_error)("convert", "%s", q3_last_error());
    return 0;
}
