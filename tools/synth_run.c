/* q3 synth's work: writes a Qwen3 checkpoint folder with deterministic random
 * weights (Qwen3-0.6B's shapes by default; dense or mixture-of-experts presets),
 * or with a --type that model as a GGUF streamed from the generator, and says
 * what it wrote. */
#include "tools/synth_run.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "model/config.h"
#include "tools/convert.h"
#include "tools/defaults.h"
#include "tools/synth.h"
#include "util/error.h"

static double seconds_now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* ", 128 experts (8 per token)" for a mixture of experts, else "". */
static const char *experts_text(const q3_config *c)
{
    static char buf[64];
    if (!q3_config_is_moe(c)) return "";
    snprintf(buf, sizeof buf, ", %d experts (%d per token)", c->n_experts, c->n_experts_used);
    return buf;
}

typedef struct progress {
    double t0, last;
} progress;

/* A line on stderr every few seconds while a large GGUF is written. */
static int on_progress(void *user, size_t done, size_t total, uint64_t bytes_done, uint64_t bytes_total)
{
    progress *p = user;
    double t = seconds_now();
    if (done == total || t - p->last < 5.0) return 0;
    p->last = t;
    fprintf(stderr, "q3 synth: [%zu/%zu tensors] %.1f / %.1f MB  %.0f%%  %.1f s\n", done, total,
            (double)bytes_done / 1e6, (double)bytes_total / 1e6,
            bytes_total ? 100.0 * (double)bytes_done / (double)bytes_total : 100.0, t - p->t0);
    return 0;
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
    if (o->layers < 0) {
        *usage = 1;
        return q3_fail(Q3_ERR_INVALID, "--layers must be at least 1, not %d", o->layers);
    }
    if (o->layers > 0) cfg.n_layers = o->layers;
    q3_convert_opts co = {0};
    if (o->type_name && (q3_convert_parse_type(o->type_name, &co.type, &co.kmix) || !q3_traits(co.type)->from_f32)) {
        *usage = 1;
        return q3_fail(Q3_ERR_INVALID,
                       "--type must be f32, f16, bf16, q8_0, q4_0, q4_k_m, q4_k_s, q5_k_m, q5_k_s or q6_k (q4_k, "
                       "q5_k), not \"%s\"", o->type_name);
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

    int builtin_too_big = 0; /* the built-in tokenizer was left out: its ids do not fit this vocabulary */
    if (!tokenizer_dir && !no_tokenizer && (tokenizer_dir = q3_default_tokenizer_dir())) {
        /* the built-in tokenizer only where its ids fit the model's vocabulary */
        char p[PATH_MAX];
        snprintf(p, sizeof p, "%s/tokenizer.json", tokenizer_dir);
        q3_tokenizer *tok;
        if (q3_tokenizer_load(p, &tok)) tokenizer_dir = NULL;
        else {
            if (q3_tokenizer_vocab_size(tok) > cfg.vocab_size) tokenizer_dir = NULL, builtin_too_big = 1;
            q3_tokenizer_free(tok);
        }
    }
    if (!tokenizer_dir && !no_tokenizer && !o->quiet)
        fprintf(stderr, "q3 synth: no tokenizer goes with this model (%s): q3 run and q3 chat need one; run it by token "
                        "ids instead (q3 logits -m %s --tokens 1,2,3; q3 bench -m %s), or take a preset with Qwen3's "
                        "vocabulary (0.6b)\n",
                builtin_too_big ? "the built-in Qwen3 tokenizer's ids do not fit its vocabulary" : "the built-in one is not fetched: make deps",
                out_dir, out_dir);
    double t0 = seconds_now();
    if (o->type_name) {
        co.name = o->name;
        co.tokenizer_dir = tokenizer_dir;
        progress p = {.t0 = t0, .last = t0};
        if (!o->quiet) {
            co.progress = on_progress;
            co.user = &p;
        }
        if ((st = q3_synth_write_gguf(out_dir, (uint64_t)seed, dtype, &cfg, &co))) return st;
        double elapsed = seconds_now() - t0;
        struct stat sb;
        double mb = stat(out_dir, &sb) ? 0.0 : (double)sb.st_size / 1e6;
        printf("wrote %s: %d layers, hidden %d, vocab %d%s, %.2f M params, %s from %s values, %.1f MB in %.2f s "
               "(%.0f MB/s)\n",
               out_dir, cfg.n_layers, cfg.dim, cfg.vocab_size, experts_text(&cfg),
               (double)q3_synth_param_count(&cfg) / 1e6, q3_convert_type_name(co.type, co.kmix),
               q3_dtype_name(dtype), mb, elapsed, elapsed > 0 ? mb / elapsed : 0.0);
        return Q3_OK;
    }
    st = q3_synth_write(out_dir, seed, dtype, &cfg, tokenizer_dir);
    if (st) return st;
    double elapsed = seconds_now() - t0;

    uint64_t params = q3_synth_param_count(&cfg);
    double mb = (double)params * (double)q3_dtype_block_bytes(dtype) / 1e6;
    printf("wrote %s: %d layers, hidden %d, vocab %d%s, %.2f M params, %s, %.1f MB in %.2f s (%.0f MB/s)\n",
           out_dir, cfg.n_layers, cfg.dim, cfg.vocab_size, experts_text(&cfg), (double)params / 1e6,
           q3_dtype_name(dtype), mb, elapsed, elapsed > 0 ? mb / elapsed : 0.0);
    return Q3_OK;
}
