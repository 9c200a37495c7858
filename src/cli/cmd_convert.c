/* q3 convert: a model folder (or a GGUF) to a GGUF file llama.cpp loads, with
 * the weights in F32, F16, BF16, Q8_0 or Q4_0. */
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli/cli.h"
#include "model/convert.h"
#include "util/outfile.h"

static void convert_usage(FILE *f)
{
    fprintf(f,
            "usage: q3 convert MODEL -o OUT.gguf [--type f32|f16|bf16|q8_0|q4_0] [--tokenizer DIR]\n"
            "                  [--name NAME] [--no-tokenizer] [--quiet]\n"
            "\n"
            "Writes a GGUF (architecture qwen3, llama.cpp's tensor names and metadata) from MODEL,\n"
            "a Hugging Face folder (config.json, safetensors, tokenizer.json) or a .gguf.\n"
            "\n"
            "  -o OUT.gguf       output file (written under a unique temporary name, renamed when complete)\n"
            "  --type T          type of the 2-D weights; norms stay F32, and with q8_0/q4_0 a\n"
            "                    matrix whose rows are not whole 32-value blocks stays F16\n"
            "                    (default: the model's own type when it is f32, f16 or bf16)\n"
            "  --tokenizer DIR   take tokenizer.json / tokenizer_config.json from DIR\n"
            "                    (default: the model folder, or the source GGUF's tokenizer)\n"
            "  --name NAME       general.name (default: the model's folder or file name)\n"
            "  --no-tokenizer    write no vocabulary (tokenizer.ggml.model \"none\")\n"
            "  --quiet           no progress on stderr\n");
}

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

typedef struct progress {
    double t0, last;
    int tty, shown;
} progress;

/* Progress on stderr: a line rewritten in place on a terminal, else a line every few seconds. */
static int on_progress(void *user, size_t done, size_t total, uint64_t bytes_done, uint64_t bytes_total)
{
    progress *p = user;
    double t = now_s();
    int last = done == total;
    if (!last && t - p->last < (p->tty ? 0.2 : 5.0)) return 0;
    if (last && !p->shown && t - p->t0 < 1.0) return 0; /* quick conversions stay quiet */
    p->last = t;
    p->shown = 1;
    fprintf(stderr, "%s[%zu/%zu tensors] %.1f / %.1f MB  %.0f%%  %.1f s%s", p->tty ? "\r" : "", done, total,
            (double)bytes_done / 1e6, (double)bytes_total / 1e6,
            bytes_total ? 100.0 * (double)bytes_done / (double)bytes_total : 100.0, t - p->t0,
            p->tty && !last ? "" : "\n");
    return 0;
}

int cmd_convert(int argc, char **argv)
{
    const char *model = NULL, *out = NULL, *type_name = NULL;
    q3_convert_opts o = {0};
    int quiet = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            convert_usage(stdout);
            return 0;
        }
        if (!strcmp(a, "--no-tokenizer")) { o.no_tokenizer = 1; continue; }
        if (!strcmp(a, "--quiet") || !strcmp(a, "-q")) { quiet = 1; continue; }
        if (a[0] != '-') {
            if (model) return cli_error("convert", "more than one model given ('%s' and '%s')", model, a);
            model = a;
            continue;
        }
        if (i + 1 >= argc) {
            convert_usage(stderr);
            return cli_error("convert", "unknown option or missing value: %s", a);
        }
        const char *v = argv[++i];
        if (!strcmp(a, "-o") || !strcmp(a, "--output")) out = v;
        else if (!strcmp(a, "--type") || !strcmp(a, "--outtype")) type_name = v;
        else if (!strcmp(a, "--tokenizer")) o.tokenizer_dir = v;
        else if (!strcmp(a, "--name")) o.name = v;
        else if (!strcmp(a, "-m") || !strcmp(a, "--model")) model = v;
        else {
            convert_usage(stderr);
            return cli_error("convert", "unknown option: %s", a);
        }
    }
    if (!model || !out) {
        convert_usage(stderr);
        return cli_error("convert", "a model and an output file (-o OUT.gguf) are required");
    }
    if (o.no_tokenizer && o.tokenizer_dir) return cli_error("convert", "--no-tokenizer and --tokenizer contradict");

    if (q3_outfile_check(out)) return cli_error("convert", "-o: %s", q3_last_error());
    q3_model *m;
    if (q3_model_open(model, &m)) return cli_error("convert", "%s", q3_last_error());
    if (type_name) {
        int t = q3_dtype_from_name(type_name);
        if (t < 0) {
            q3_model_close(m);
            return cli_error("convert", "--type must be f32, f16, bf16, q8_0 or q4_0, not \"%s\"", type_name);
        }
        o.type = (q3_dtype)t;
    } else {
        o.type = m->w.layers[0].wq->dtype; /* lossless: the model's own type */
    }
    progress p = {.t0 = now_s(), .tty = isatty(STDERR_FILENO)};
    p.last = p.t0;
    if (!quiet) {
        o.progress = on_progress;
        o.user = &p;
    }
    q3_status st = q3_convert_model(m, out, &o);
    if (st) {
        q3_model_close(m);
        return cli_error("convert", "%s", q3_last_error());
    }
    FILE *f = fopen(out, "rb");
    long size = 0;
    if (f && !fseek(f, 0, SEEK_END)) size = ftell(f);
    if (f) fclose(f);
    printf("wrote %s: %d layers, vocab %d, weights %s, %.1f MB in %.2f s\n", out, m->cfg.n_layers,
           m->cfg.vocab_size, q3_dtype_name(o.type), (double)size / 1e6, now_s() - p.t0);
    q3_model_close(m);
    return 0;
}
