/* A named, typed view of weight data that lives in a mapped file. */
#ifndef Q3_MODEL_TENSOR_H
#define Q3_MODEL_TENSOR_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include "model/dtype.h"

#define Q3_MAX_DIMS 4

typedef struct q3_tensor {
    char name[128];             /* as in the file, e.g. "model.layers.3.self_attn.q_proj.weight" */
    q3_dtype dtype;
    int ndim;
    int64_t shape[Q3_MAX_DIMS]; /* row-major, shape[0] outermost: a Linear is [out][in] */
    const void *data;           /* points into a read-only mapping; never freed */
    size_t nbytes;
    /* A compute unit's own layout of this weight (the cpu unit's packed
       Q8_0/Q4_0 panels), made on first use and published once by
       compare-and-swap, so concurrent contexts share one copy; freed by
       q3_tensor_drop_packed (the model does it for its weights). */
    _Atomic(void *) packed;
    /* A stacked weight (ndim 3, [n_mat][rows][cols]: a mixture-of-experts
       layer's experts): its matrices as 2-D tensors of their own (views into
       data, or the file's separate tensors, each with its own packed copy).
       NULL for every other tensor. */
    const struct q3_tensor *const *mats;
} q3_tensor;

/* Frees t's packed copy, if any (t is otherwise unchanged). */
static inline void q3_tensor_drop_packed(const q3_tensor *t)
{
    free(atomic_exchange(&((q3_tensor *)t)->packed, NULL));
}

/* Number of elements (product of the shape). */
static inline size_t q3_tensor_numel(const q3_tensor *t)
{
    size_t n = 1;
    for (int i = 0; i < t->ndim; i++) n *= (size_t)t->shape[i];
    return n;
}

#endif
