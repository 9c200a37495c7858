#include "backend/registry.h"

#include <stdlib.h>
#include <string.h>

#include "util/error.h"

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

q3_status q3_unit_open(const q3_backend *b, const q3_unit_opts *o, q3_unit **out)
{
    *out = NULL;
    if (b->present && !b->present(b))
        return q3_fail(Q3_ERR_UNSUPPORTED, "compute unit \"%s\" (%s): device absent", b->name, b->device);
    q3_unit_opts none = {0};
    if (!o) o = &none;
    if (o->n_threads < 0 || o->n_threads > 1024)
        return q3_fail(Q3_ERR_INVALID, "%d threads is out of range (0 = one per core, up to 1024)", o->n_threads);
    q3_unit *u = calloc(1, sizeof *u);
    if (!u) return q3_fail(Q3_ERR_NOMEM, "out of memory opening compute unit \"%s\"", b->name);
    u->b = b;
    if (b->open) {
        q3_status st = b->open(b, o, &u->impl);
        if (st) {
            free(u);
            return st;
        }
    }
    u->n_threads = b->threads ? b->threads(u->impl) : 1;
    *out = u;
    return Q3_OK;
}

void q3_unit_close(q3_unit *u)
{
    if (!u) return;
    if (u->b->close) u->b->close(u->impl);
    free(u);
}
