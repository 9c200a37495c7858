/* q3 synth's work: writes a Qwen3 checkpoint folder with deterministic random
 * weights (Qwen3-0.6B's shapes by default) and says what it wrote. */
#include "tools/synth_run.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "model/config.h"
#include "tools/defaults.h"
#include "tools/synth.h"
#include "util/error.h"

static double seconds_now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

q3_status q3_synth_run(const q3_synth_run_opts *o, int *usage)
{
    const char *out_dir = o->out_dir, *preset = o->preset ? o->preset : "0.6b", *config_path = o->config_path;
    const char *tokenizer_dir = o->tokenizer_dir, *dtype_name = o->dtype_name;
    long long seed = o->seed;
    int no_tokenizer = o->no_tokenizer;
    *usage = 0;
    q3_config cfg;
    q3_status st = config_path ? q3_config_load(config_path, &cfg) : q3_synth_preset(preset, &cfg);
    if (st) {
        *usage = !config_path;
        return st;
    }

    q3_dtype dtype = Q3_BF16;
    if (dtype_name) {
        int t = q3_dtype_from_name(dtype_name);
        if (t != Q3_BF16 && t != Q3_F32) {
            *usage = 1;
            return q3_fail(Q3_ERR_INVALID, "--dtype must be bf16 or f32, not \"%s\"", dtype_name);
        }
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
    if (st) return st;
    double elapsed = seconds_now() - t0;

    uint64_t params = q3_synth_param_count(&cfg);
    double mb = (double)params * (double)q3_dtype_block_bytes(dtype) / 1e6;
    printf("wrote %s: %d layers, hidden %d, vocab %d, %.2f M params, %s, %.1f MB in %.2f s (%.0f MB/s)\n",
           out_dir, cfg.n_layers, cfg.dim, cfg.vocab_size, (double)params / 1e6,
           q3_dtype_name(dtype), mb, elapsed, elapsed > 0 ? mb / elapsed : 0.0);
    return Q3_OK;
}
