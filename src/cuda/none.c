/* none.c - the CUDA entry points of a build without the backend: each says
 * how to get one. */
#include <stdio.h>

#include "cuda/cuda.h"

long mx_cuda_routed_launches(void) { return 0; }
long mx_cuda_rp_launches(void) { return 0; }
long mx_cuda_estride_launches(void) { return 0; }
int mx_cuda_wgmma_active(void) { return 0; }

int mx_cuda_built(void) { return 0; }

int mx_cuda_probe(char *info, size_t cap)
{
    snprintf(info, cap, "this build has no CUDA backend (configure with cmake -DMLXCEL_CUDA=ON)");
    return 0;
}

int mx_cuda_attach(mx_model *m, mx_err *e)
{
    (void)m;
    return mx_fail(e, MX_EUNSUPPORTED,
                   "device cuda: this build has no CUDA backend (configure with cmake -DMLXCEL_CUDA=ON)");
}

int mx_cuda_linear(const mx_linear *l, const float *X, int T, float *Y, mx_err *e)
{
    (void)l, (void)X, (void)T, (void)Y;
    return mx_fail(e, MX_EUNSUPPORTED, "this build has no CUDA backend");
}

int mx_cuda_argmax(const float *x, int n, int32_t *id, mx_err *e)
{
    (void)x, (void)n, (void)id;
    return mx_fail(e, MX_EUNSUPPORTED, "this build has no CUDA backend");
}

double mx_cuda_membw_probe(size_t bytes, int reps)
{
    (void)bytes, (void)reps;
    return -1.0;
}
