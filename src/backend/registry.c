#include "backend/registry.h"

#include <string.h>

const q3_backend *const q3_backends[] = {
    &q3_backend_cuda,
    &q3_backend_cpu,
    &q3_backend_ref,
    NULL,
};

const q3_backend *q3_backend_find(const char *name)
{
    for (int i = 0; q3_backends[i]; i++)
        if (!strcmp(q3_backends[i]->name, name)) return q3_backends[i];
    return NULL;
}

const q3_backend *q3_backend_default(void)
{
    for (int i = 0; q3_backends[i]; i++)
        if (!q3_backends[i]->present || q3_backends[i]->present(q3_backends[i])) return q3_backends[i];
    return &q3_backend_ref;
}
