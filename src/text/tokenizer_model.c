/* The tokenizer a model comes with: a Hugging Face folder's tokenizer.json,
 * or a GGUF's own (tokenizer.ggml.* metadata). */
#include <limits.h>
#include <stdio.h>

#include "model/model.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"
#include "text/tokenizer_gguf.h"
#include "util/error.h"
#include "util/file.h"

q3_status q3_tokenizer_for_model(const q3_model *m, q3_tokenizer **out)
{
    Q3_NOT_NULL(out);
    *out = NULL;
    Q3_NOT_NULL(m);
    if (m->gguf) return q3_tokenizer_load_gguf(m->gguf, out);
    char p[PATH_MAX];
    if (snprintf(p, sizeof p, "%s/tokenizer.json", m->path) >= (int)sizeof p)
        return q3_fail(Q3_ERR_INVALID, "%s: the path is too long", m->path);
    int present;
    q3_status st = q3_regular_or_absent(p, &present);
    if (st) return st;
    if (!present) return q3_fail(Q3_ERR_IO, "%s has no tokenizer.json", m->path);
    return q3_tokenizer_load(p, out);
}

q3_status q3_model_chat_template_check(const q3_model *m, int *present)
{
    Q3_NOT_NULL(present);
    *present = 0;
    Q3_NOT_NULL(m);
    if (m->gguf) { /* its tokenizer.chat_template */
        q3_gguf_tokenizer_info info;
        q3_status st = q3_gguf_tokenizer_info_read(m->gguf, &info);
        if (st) return st;
        if (!info.chat_template) return Q3_OK;
        *present = 1;
        if (info.template_kind != Q3_CHAT_TEMPLATE_QWEN3)
            return q3_fail(Q3_ERR_UNSUPPORTED, "%s: its chat template is not Qwen3's", m->path);
        return Q3_OK;
    }
    char p[PATH_MAX], j[PATH_MAX];
    snprintf(p, sizeof p, "%s/tokenizer_config.json", m->path);
    snprintf(j, sizeof j, "%s/chat_template.jinja", m->path);
    int has_config, has_jinja; /* a FIFO or a device there is an error, not "no template" */
    q3_status st = q3_regular_or_absent(p, &has_config);
    if (!st) st = q3_regular_or_absent(j, &has_jinja);
    if (st) return st;
    if (!has_config && !has_jinja) return Q3_OK;
    *present = 1;
    q3_chat_template_kind kind;
    return q3_chat_template_load(m->path, &kind);
}
