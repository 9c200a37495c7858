/* The CUDA compute unit in builds without nvcc (and, for now, all builds: no
 * CUDA kernels exist yet). It is registered so that plans and the probe can
 * name it and say why nothing is placed there. */
#include "backend/backend.h"

static bool cuda_present(const q3_backend *b) { return false; }

static const char *cuda_refuses(const q3_backend *b, const q3_graph *g, const q3_op *op)
{
    return "device absent (q3 was built without CUDA kernels)";
}

static q3_status cuda_run(void *impl, const q3_exec *e, const q3_op *op)
{
    return Q3_ERR_UNSUPPORTED; /* never reached: the unit is absent, so nothing is placed on it */
}

q3_backend q3_backend_cuda = {
    .name = "cuda",
    .device = "NVIDIA GPU (CUDA)",
    .present = cuda_present,
    .refuses = cuda_refuses,
    .run = cuda_run,
    .kv_default = Q3_F16,
};
