/* The tokenizer a model comes with: a Hugging Face folder's tokenizer.json,
 * or a GGUF's own (tokenizer.ggml.* metadata). */
#include <limits.h>
#include <stdio.h>

#include "model/model.h"
#include "text/tokenizer.h"
#include "text/tokenizer_gguf.h"
#include "util/error.h"
#include "util/file.h"

q3_status q3_tokenizer_for_model(const q3_model *m, q3_tokenizer **out)
{
    *out = NULL;
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
