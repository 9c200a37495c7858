/* A named, typed view of weight data that lives in a mapped file. */
#ifndef Q3_MODEL_TENSOR_H
#define Q3_MODEL_TENSOR_H

#include <stddef.h>
#include <stdint.h>
#include "model/dtype.h"

#define Q3_MAX_DIMS 4

typedef struct q3_tensor {
    char name[128];             /* as in the file, e.g. "model.layers.3.self_attn.q_proj.weight" */
    q3_dtype dtype;
    int ndim;
    int64_t shape[Q3_MAX_DIMS]; /* row-major, shape[0] outermost: a Linear is [out][in] */
    const void *data;           /* points into a read-only mapping; never freed */
    size_t nbytes;
} q3_tensor;

/* Number of elements (product of the shape). */
static inline size_t q3_tensor_numel(const q3_tensor *t)
{
    size_t n = 1;
    for (int i = 0; i < t->ndim; i++) n *= (size_t)t->shape[i];
    return n;
}

#endif
