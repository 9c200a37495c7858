/* q3 synth: writes a Qwen3 checkpoint folder with deterministic random
 * weights (Qwen3-0.6B's shapes by default). */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli/args.h"
#include "cli/cli.h"
#include "tools/defaults.h"
#include "cli/opts.h"
#include "tools/synth.h"
#include "q3.h"

static double seconds_now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

int cmd_synth(int argc, char **argv)
{
    const char *out_dir = NULL, *preset = "0.6b", *config_path = NULL, *tokenizer_dir = NULL;
    const char *dtype_name = NULL;
    long long seed = 0;
    int no_tokenizer = 0;
    const cli_opt tab[] = {
        CLI_OPT("output", 'o', CLI_STR, &out_dir, "DIR", "output folder (created if missing; files in it are replaced)",
                .flags = CLI_REQUIRED),
        CLI_OPT("seed", 's', CLI_LLONG, &seed, "N", "weights depend only on the seed, dtype and config (default 0)",
                .lo = 0, .hi = (double)LLONG_MAX),
        CLI_OPT("dtype", 0, CLI_STR, &dtype_name, "T", "bf16 or f32 (default bf16, or f32 if --config says float32)"),
        CLI_OPT("preset", 0, CLI_STR, &preset, "NAME", "0.6b: Qwen3-0.6B's shapes (default); tiny: a 2-layer test model"),
        CLI_OPT("config", 0, CLI_FILE, &config_path, "FILE", "take the shapes from a Qwen3 config.json instead of a preset"),
        CLI_OPT("tokenizer", 0, CLI_FILE, &tokenizer_dir, "DIR",
                "copy DIR/tokenizer.json and tokenizer_config.json alongside (default: the\n"
                "built-in Qwen3 tokenizer when its vocabulary fits the model's, so that\n"
                "q3 run -m DIR works)"),
        CLI_OPT("no-tokenizer", 0, CLI_FLAG, &no_tokenizer, NULL, "write no tokenizer"),
        {0},
    };
    cli_spec spec = {"synth", "q3 synth -o DIR [--seed N] [--dtype bf16|f32] [--preset 0.6b|tiny] [--config FILE]",
                     "Writes DIR/config.json and DIR/model.safetensors with random weights scaled like\n"
                     "a trained model's (matrices N(0, 0.02), norms 1 + 0.05 N(0, 1)).\n",
                     tab, 0, NULL};
    int rc = cli_parse(&spec, argc, argv, NULL);
    if (rc) return rc == CLI_HELP_SHOWN ? 0 : rc;
    if (no_tokenizer && tokenizer_dir) return cli_usage_error("synth", "--no-tokenizer and --tokenizer contradict");

    q3_config cfg;
    q3_status st = config_path ? q3_config_load(config_path, &cfg) : q3_synth_preset(preset, &cfg);
    if (st) return (!config_path ? cli_usage_error : cli_error)("synth", "%s", q3_last_error());

    q3_dtype dtype = Q3_BF16;
    if (dtype_name) {
        int t = q3_dtype_from_name(dtype_name);
        if (t != Q3_BF16 && t != Q3_F32)
            return cli_usage_error("synth", "--dtype must be bf16 or f32, not \"%s\"", dtype_name);
        dtype = (q3_dtype)t;
    } else if (config_path && !strcmp(cfg.torch_dtype, "float32")) {
        dtype = Q3_F32;
    }

    if (!tokenizer_dir && !no_tokenizer && (tokenizer_dir = q3_default_tokenizer_dir())) {
        /* the built-in tokenizer only where its ids fit the model's vocabulary */
        char p[PATH_MAX];
        snprintf(p, sizeof p, "%s/tokenizer.json", tokenizer_dir);
        q3_tokenizer *tok;
        if (q3_tokenizer_load(p, &tok)) tokenizer_dir = NULL;
        else {
            if (q3_tokenizer_vocab_size(tok) > cfg.vocab_size) tokenizer_dir = NULL;
            q3_tokenizer_free(tok);
        }
    }
    double t0 = seconds_now();
    st = q3_synth_write(out_dir, seed, dtype, &cfg, tokenizer_dir);
    if (st) return cli_error("synth", "%s", q3_last_error());
    double elapsed = seconds_now() - t0;

    uint64_t params = q3_synth_param_count(&cfg);
    double mb = (double)params * (double)q3_dtype_block_bytes(dtype) / 1e6;
    printf("wrote %s: %d layers, hidden %d, vocab %d, %.2f M params, %s, %.1f MB in %.2f s (%.0f MB/s)\n",
           out_dir, cfg.n_layers, cfg.dim, cfg.vocab_size, (double)params / 1e6,
           q3_dtype_name(dtype), mb, elapsed, elapsed > 0 ? mb / elapsed : 0.0);
    return 0;
}
