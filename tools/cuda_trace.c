/* cuda_trace.c - a kernel and runtime-call timeline of any CUDA program,
 * from NVIDIA's CUPTI activity API, for finding where a decode step's
 * time goes (docs/cuda.md).  Kernels inside CUDA graphs are recorded one
 * by one, with their real start and end.
 *
 *   gcc -shared -fPIC -O2 -I$CUDA/include tools/cuda_trace.c -o cuda_trace.so \
 *       -L$CUDA/lib64 -lcupti -Wl,-rpath,$CUDA/lib64
 *   CUDA_INJECTION64_PATH=$PWD/cuda_trace.so TRACE_OUT=trace.csv \
 *       build-cuda/mlxcel bench -m M --device cuda -p 100 -n 24 -r 1 --bw-mb 0
 *   python3 tools/cuda_trace_step.py trace.csv
 *
 * TRACE_OUT (default cuda_trace.csv) gets one line per record:
 *   K,start,end,gridX,gridY,gridZ,blockX,graphNodeId,name   a kernel
 *   M,start,end,copyKind,bytes,0,0,graphNodeId,memcpy      a copy
 *   R,start,end,threadId,0,0,0,0,name                      a runtime call
 * times in ns of the GPU's clock (CUPTI puts the host's calls on it).
 * The tracing itself slows a step by a few percent. */
#include <cupti.h>
#include <stdio.h>
#include <stdlib.h>

static FILE *out;

static void CUPTIAPI buffer_requested(uint8_t **buf, size_t *size, size_t *max_records)
{
    *size = (size_t)16 << 20;
    *buf = aligned_alloc(8, *size);
    *max_records = 0;
}

static void CUPTIAPI buffer_completed(CUcontext ctx, uint32_t stream, uint8_t *buf, size_t size, size_t valid)
{
    (void)ctx, (void)stream, (void)size;
    CUpti_Activity *r = NULL;
    while (cuptiActivityGetNextRecord(buf, valid, &r) == CUPTI_SUCCESS) {
        if (r->kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) {
            const CUpti_ActivityKernel10 *k = (const CUpti_ActivityKernel10 *)r;
            fprintf(out, "K,%llu,%llu,%d,%d,%d,%d,%llu,%s\n", (unsigned long long)k->start,
                    (unsigned long long)k->end, k->gridX, k->gridY, k->gridZ, k->blockX,
                    (unsigned long long)k->graphNodeId, k->name);
        } else if (r->kind == CUPTI_ACTIVITY_KIND_MEMCPY) {
            const CUpti_ActivityMemcpy6 *m = (const CUpti_ActivityMemcpy6 *)r;
            fprintf(out, "M,%llu,%llu,%d,%llu,0,0,%llu,memcpy\n", (unsigned long long)m->start,
                    (unsigned long long)m->end, m->copyKind, (unsigned long long)m->bytes,
                    (unsigned long long)m->graphNodeId);
        } else if (r->kind == CUPTI_ACTIVITY_KIND_RUNTIME) {
            const CUpti_ActivityAPI *a = (const CUpti_ActivityAPI *)r;
            const char *name = NULL;
            cuptiGetCallbackName(CUPTI_CB_DOMAIN_RUNTIME_API, a->cbid, &name);
            fprintf(out, "R,%llu,%llu,%u,0,0,0,0,%s\n", (unsigned long long)a->start, (unsigned long long)a->end,
                    a->threadId, name ? name : "?");
        }
    }
    free(buf);
}

static void finish(void)
{
    cuptiActivityFlushAll(1);
    fclose(out);
}

/* called by the CUDA driver at initialisation (CUDA_INJECTION64_PATH) */
int InitializeInjection(void);
int InitializeInjection(void)
{
    const char *path = getenv("TRACE_OUT");
    out = fopen(path ? path : "cuda_trace.csv", "w");
    if (!out) {
        perror("cuda_trace: TRACE_OUT");
        return 0;
    }
    if (cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed) != CUPTI_SUCCESS ||
        cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) != CUPTI_SUCCESS ||
        cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMCPY) != CUPTI_SUCCESS ||
        cuptiActivityEnable(CUPTI_ACTIVITY_KIND_RUNTIME) != CUPTI_SUCCESS) {
        fprintf(stderr, "cuda_trace: CUPTI would not start\n");
        return 0;
    }
    atexit(finish);
    return 1;
}
