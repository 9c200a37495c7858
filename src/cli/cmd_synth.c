/* q3 synth: writes a Qwen3 checkpoint folder with deterministic random
 * weights (Qwen3-0.6B's shapes by default). */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli/args.h"
#include "cli/cli.h"
#include "model/synth.h"

static void synth_usage(FILE *f)
{
    fprintf(f,
            "usage: q3 synth -o DIR [--seed N] [--dtype bf16|f32] [--preset 0.6b|tiny]\n"
            "                [--config FILE.json] [--tokenizer DIR]\n"
            "\n"
            "Writes DIR/config.json and DIR/model.safetensors with random weights scaled like\n"
            "a trained model's (matrices N(0, 0.02), norms 1 + 0.05 N(0, 1)).\n"
            "\n"
            "  -o DIR            output folder (created if missing; files in it are replaced)\n"
            "  --seed N          weights depend only on the seed, dtype and config (default 0)\n"
            "  --dtype T         bf16 or f32 (default bf16, or f32 if --config says float32)\n"
            "  --preset NAME     0.6b: Qwen3-0.6B's shapes (default); tiny: a 2-layer test model\n"
            "  --config FILE     take the shapes from a Qwen3 config.json instead of a preset\n"
            "  --tokenizer DIR   copy DIR/tokenizer.json and tokenizer_config.json alongside\n");
}

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
    unsigned long long seed = 0;

    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            synth_usage(stdout);
            return 0;
        }
        if (i + 1 >= argc) {
            synth_usage(stderr);
            return cli_error("synth", "unknown option or missing value: %s", a);
        }
        const char *v = argv[++i];
        if (!strcmp(a, "-o") || !strcmp(a, "--output")) {
            out_dir = v;
        } else if (!strcmp(a, "--seed")) {
            long long n;
            if (cli_parse_int("synth", a, v, 0, LLONG_MAX, &n)) return 1;
            seed = (unsigned long long)n;
        } else if (!strcmp(a, "--dtype")) {
            dtype_name = v;
        } else if (!strcmp(a, "--preset")) {
            preset = v;
        } else if (!strcmp(a, "--config")) {
            config_path = v;
        } else if (!strcmp(a, "--tokenizer")) {
            tokenizer_dir = v;
        } else {
            synth_usage(stderr);
            return cli_error("synth", "unknown option: %s", a);
        }
    }
    if (!out_dir) {
        synth_usage(stderr);
        return cli_error("synth", "an output folder is required (-o DIR)");
    }

    q3_config cfg;
    q3_status st = config_path ? q3_config_load(config_path, &cfg) : q3_synth_preset(preset, &cfg);
    if (st) return cli_error("synth", "%s", q3_last_error());

    q3_dtype dtype = Q3_BF16;
    if (dtype_name) {
        int t = q3_dtype_from_name(dtype_name);
        if (t != Q3_BF16 && t != Q3_F32)
            return cli_error("synth", "--dtype must be bf16 or f32, not \"%s\"", dtype_name);
        dtype = (q3_dtype)t;
    } else if (config_path && !strcmp(cfg.torch_dtype, "float32")) {
        dtype = Q3_F32;
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
