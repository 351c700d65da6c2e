/* device.c - choosing the device a model runs on (cuda.h); built with and
 * without the CUDA backend. */
#include <stdlib.h>
#include <string.h>

#include "cuda/cuda.h"

int mx_device_select(mx_model *m, const char *name, mx_err *e)
{
    if (!name)
        name = getenv("MLXCEL_DEVICE");
    if (!name || !*name || !strcmp(name, "cpu"))
        return MX_OK;
    if (!strcmp(name, "cuda") && m->remote)   /* its experts are on other ranks (src/dist) */
        return mx_fail(e, MX_EUNSUPPORTED, "--device cuda runs the whole model on one GPU: not with "
                                           "expert parallelism over MPI (mpirun)");
    if (!strcmp(name, "cuda"))
        return mx_cuda_attach(m, e);
    return mx_fail(e, MX_EINVAL, "unknown device '%s' (--device / MLXCEL_DEVICE: cpu or cuda)", name);
}

const char *mx_device_name(const mx_model *m)
{
    return m->backend ? m->backend->name : "cpu";
}
