/* q3 convert's work: a model folder (or a GGUF) to a GGUF file llama.cpp loads, with
 * the weights in F32, F16, BF16, Q8_0, Q4_0 or one of llama-quantize's K-quant
 * mixes (Q4_K_M, Q4_K_S, Q5_K_M, Q5_K_S, Q6_K). */
#include <errno.h>
#include <stdio.h>
#include <sys/stat.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "tools/convert_run.h"

#include "model/model.h"
#include "util/error.h"

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

q3_status q3_convert_run(const char *model, const char *out, const char *type_name, q3_convert_opts *o_, int quiet,
                         int *usage)
{
    q3_convert_opts o = *o_;
    *usage = 0;
    q3_model *m;
    q3_status st = q3_model_open(model, &m);
    if (st) return st;
    if (type_name) {
        if (q3_convert_parse_type(type_name, &o.type, &o.kmix) || !q3_traits(o.type)->from_f32) {
            q3_model_close(m);
            *usage = 1;
            return q3_fail(Q3_ERR_INVALID,
                           "--type must be f32, f16, bf16, q8_0, q4_0, q4_k_m, q4_k_s, q5_k_m, q5_k_s or "
                           "q6_k (q4_k, q5_k), not \"%s\"", type_name);
        }
    } else {
        o.type = m->w.layers[0].wq->dtype; /* lossless: the model's own type */
    }
    progress p = {.t0 = now_s(), .tty = isatty(STDERR_FILENO)};
    p.last = p.t0;
    if (!quiet) {
        o.progress = on_progress;
        o.user = &p;
    }
    st = q3_convert_model(m, out, &o);
    if (st) {
        q3_model_close(m);
        return st;
    }
    FILE *f = fopen(out, "rb");
    long size = 0;
    if (f && !fseek(f, 0, SEEK_END)) size = ftell(f);
    if (f) fclose(f);
    printf("wrote %s: %d layers, vocab %d, weights %s, %.1f MB in %.2f s\n", out, m->cfg.n_layers,
           m->cfg.vocab_size, q3_convert_type_name(o.type, o.kmix), (double)size / 1e6, now_s() - p.t0);
    q3_model_close(m);
    return Q3_OK;
}
