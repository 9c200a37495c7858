/* Reading one .safetensors file: an 8-byte header length, a JSON header, data. */
#ifndef Q3_MODEL_SAFETENSORS_H
#define Q3_MODEL_SAFETENSORS_H

#include "model/tensor.h"
#include "util/file.h"

typedef struct q3_safetensors {
    char *path;            /* owned copy, for messages */
    q3_mapping map;        /* the whole file, read-only */
    q3_tensor *tensors;    /* [n_tensors], views into map, in header order */
    int *by_name;          /* [n_tensors] indices into tensors, sorted by name */
    int n_tensors;
} q3_safetensors;

/* Maps and validates a file: header bounds, JSON, dtypes, shapes, and that
 * every tensor's bytes lie inside the file, match dtype x shape, and do not
 * overlap another's. On failure *out is left empty and the message names
 * the file and the tensor. */
q3_status q3_safetensors_open(const char *path, q3_safetensors *out);
void q3_safetensors_close(q3_safetensors *f);
/* The tensor called name, or NULL; a binary search (a header may hold millions). */
const q3_tensor *q3_safetensors_find(const q3_safetensors *f, const char *name);

/* Largest header accepted; real checkpoints use well under 1 MB. */
#define Q3_SAFETENSORS_MAX_HEADER (100u << 20)

#endif
