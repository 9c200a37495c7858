/* Opening a model from a GGUF file: the reader lands with the GGUF issue. */
#include "model/model.h"
#include "util/error.h"

q3_status q3_model_open_gguf(const char *path, q3_model *m)
{
    (void)m;
    return q3_fail(Q3_ERR_UNSUPPORTED, "%s: GGUF models are not supported yet", path);
}
