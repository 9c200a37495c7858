/* q3 info -m MODEL: config, parameters, weight bytes by dtype, KV bytes per token. */
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"
#include "model/model.h"
#include "kv/kv_pool.h"

static void count_dtype(const q3_tensor *t, size_t *bytes, size_t *count)
{
    bytes[t->dtype] += t->nbytes;
    count[t->dtype]++;
}

int cmd_info(int argc, char **argv)
{
    const char *path = NULL;
    for (int i = 1; i < argc; i++) {
        if ((!strcmp(argv[i], "-m") || !strcmp(argv[i], "--model")) && i + 1 < argc)
            path = argv[++i];
        else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            printf("usage: q3 info -m MODEL\n");
            return 0;
        } else
            return cli_error("info", "unknown argument '%s' (usage: q3 info -m MODEL)", argv[i]);
    }
    if (!path) return cli_error("info", "no model given (usage: q3 info -m MODEL)");
    q3_model *m;
    if (q3_model_open(path, &m)) return cli_error("info", "%s", q3_last_error());
    const q3_config *c = &m->cfg;
    printf("model            %s\n", path);
    printf("layers           %d\n", c->n_layers);
    printf("hidden           %d\n", c->dim);
    printf("intermediate     %d\n", c->ffn_dim);
    printf("heads / kv heads %d / %d (head_dim %d)\n", c->n_heads, c->n_kv_heads, c->head_dim);
    printf("vocab            %d\n", c->vocab_size);
    printf("max context      %d\n", c->max_seq_len);
    printf("rope theta       %g\n", c->rope_theta);
    if (c->rope_scaling.type == Q3_ROPE_YARN)
        printf("rope scaling     yarn, factor %g, original context %d\n", (double)c->rope_scaling.factor,
               c->rope_scaling.orig_ctx);
    printf("rms eps          %g\n", c->rms_eps);
    printf("tied embeddings  %s\n", c->tied_embeddings ? "yes" : "no");
    printf("torch_dtype      %s\n", c->torch_dtype[0] ? c->torch_dtype : "(not given)");
    size_t params = q3_model_param_count(m), bytes = q3_model_weight_bytes(m);
    printf("parameters       %zu (%.3f B)\n", params, (double)params / 1e9);
    printf("weight bytes     %zu (%.3f GB)\n", bytes, (double)bytes / 1e9);
    size_t by[Q3_DTYPE_COUNT] = {0}, cnt[Q3_DTYPE_COUNT] = {0};
    count_dtype(m->w.embed, by, cnt);
    count_dtype(m->w.out_norm, by, cnt);
    if (m->w.lm_head != m->w.embed) count_dtype(m->w.lm_head, by, cnt);
    for (int l = 0; l < c->n_layers; l++) {
        const q3_tensor *const *t = (const q3_tensor *const *)&m->w.layers[l];
        for (size_t i = 0; i < sizeof(q3_layer_weights) / sizeof(void *); i++) count_dtype(t[i], by, cnt);
    }
    for (int d = 0; d < Q3_DTYPE_COUNT; d++)
        if (cnt[d]) printf("  %-6s         %zu tensors, %zu bytes\n", q3_dtype_name((q3_dtype)d), cnt[d], by[d]);
    printf("KV cache / token %zu bytes F32, %zu bytes F16/BF16\n", q3_kv_bytes_per_token(c, Q3_F32),
           q3_kv_bytes_per_token(c, Q3_F16));
    q3_model_close(m);
    return 0;
}
