/* cuda_chain.cu - what a chain of dependent kernels costs on this GPU,
 * against grid-wide barriers inside one resident kernel (built with
 * -DMLXCEL_CUDA=ON; docs/cuda.md uses its numbers).
 *
 * A one-token decode step is a chain of short kernels, each of which needs
 * all of its predecessor's output (about 6 a layer, 145 a step for the
 * qwen1.5 synth).  This measures the floor of such a chain with no work in
 * it, the grid shaped as the streaming kernels' (2 blocks of 256 threads
 * per SM):
 *   graph         N kernels captured in a CUDA graph, each waiting for the
 *                 previous one to finish;
 *   graph + PDL   the same with programmatic dependent launch (each
 *                 kernel's blocks start while its predecessor runs and wait
 *                 at griddepcontrol.wait; the predecessor triggers at its
 *                 end), as backend.c launches them;
 *   barriers      one kernel whose blocks (all resident) pass N grid-wide
 *                 barriers (an arrival counter and a generation flag), what
 *                 a persistent kernel per step would pay instead.
 * Each block also writes and reads a word per step, so that every step
 * depends on the previous one's writes as a real step does.
 *
 *   build-cuda/bench_cuda_chain [N] [reps]     (default 145 steps, 50 reps) */
#include <cuda_runtime.h>

#include <algorithm>
#include <stdio.h>
#include <stdlib.h>
#include <vector>

#define CK(x)                                                                                         \
    do {                                                                                              \
        cudaError_t e_ = (x);                                                                         \
        if (e_ != cudaSuccess) {                                                                      \
            fprintf(stderr, "bench_cuda_chain: %s: %s (line %d)\n", #x, cudaGetErrorString(e_), __LINE__); \
            exit(1);                                                                                  \
        }                                                                                             \
    } while (0)

/* One step: wait for the predecessor (PDL), read what block 0 of the
 * previous step wrote, write this step's word, let the successor launch. */
__global__ void k_step(int *words, int step)
{
    asm volatile("griddepcontrol.wait;" ::: "memory");
    if (threadIdx.x == 0) {
        const int prev = step > 0 ? *(volatile int *)&words[step - 1] : 0;
        if (blockIdx.x == 0)
            words[step] = prev + 1;
    }
    asm volatile("griddepcontrol.launch_dependents;");
}

/* All steps in one kernel: a grid-wide barrier between steps.  count
 * counts arrivals; the last block to arrive resets it and bumps gen. */
__device__ void grid_barrier(unsigned *count, volatile unsigned *gen, unsigned nblk)
{
    __syncthreads();
    if (threadIdx.x == 0) {
        const unsigned g = *gen;
        __threadfence();
        if (atomicAdd(count, 1u) == nblk - 1) {
            *count = 0;
            __threadfence();
            *gen = g + 1;
        } else {
            while (*gen == g)
                ;
        }
        __threadfence();
    }
    __syncthreads();
}

__global__ void k_persistent(int *words, int n, unsigned *count, unsigned *gen)
{
    for (int step = 0; step < n; step++) {
        if (threadIdx.x == 0) {
            const int prev = step > 0 ? *(volatile int *)&words[step - 1] : 0;
            if (blockIdx.x == 0)
                words[step] = prev + 1;
        }
        grid_barrier(count, gen, gridDim.x);
    }
}

/* Median milliseconds of reps calls of run() on st, after 3 to warm up. */
template <class F>
static double time_runs(cudaStream_t st, int reps, F run)
{
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    std::vector<double> t;
    for (int r = 0; r < reps + 3; r++) {
        CK(cudaEventRecord(a, st));
        run();
        CK(cudaEventRecord(b, st));
        CK(cudaEventSynchronize(b));
        float ms;
        CK(cudaEventElapsedTime(&ms, a, b));
        if (r >= 3)
            t.push_back(ms);
    }
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
}

/* Median milliseconds of reps replays of a graph of n k_step launches. */
static double time_graph(cudaStream_t st, int *words, int n, unsigned blocks, int pdl, int reps)
{
    cudaGraph_t g;
    cudaGraphExec_t ge;
    CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
    for (int i = 0; i < n; i++) {
        cudaLaunchAttribute at[1];
        at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        at[0].val.programmaticStreamSerializationAllowed = 1;
        cudaLaunchConfig_t cfg = {};
        cfg.gridDim = blocks;
        cfg.blockDim = 256;
        cfg.stream = st;
        cfg.attrs = at;
        cfg.numAttrs = pdl && i > 0 ? 1 : 0;
        CK(cudaLaunchKernelEx(&cfg, k_step, words, i));
    }
    CK(cudaStreamEndCapture(st, &g));
    CK(cudaGraphInstantiate(&ge, g, 0));
    const double ms = time_runs(st, reps, [&] { CK(cudaGraphLaunch(ge, st)); });
    int last = 0;
    CK(cudaMemcpy(&last, words + n - 1, sizeof last, cudaMemcpyDeviceToHost));
    if (last != n) {
        fprintf(stderr, "bench_cuda_chain: the chain computed %d, not %d\n", last, n);
        exit(1);
    }
    cudaGraphExecDestroy(ge);
    cudaGraphDestroy(g);
    return ms;
}

static double time_persistent(cudaStream_t st, int *words, int n, unsigned blocks, unsigned *sync, int reps)
{
    return time_runs(st, reps, [&] {
        k_persistent<<<blocks, 256, 0, st>>>(words, n, sync, sync + 1);
        CK(cudaGetLastError());
    });
}

int main(int argc, char **argv)
{
    const int n = argc > 1 ? atoi(argv[1]) : 145, reps = argc > 2 ? atoi(argv[2]) : 50;
    if (n < 1 || reps < 1) {
        fprintf(stderr, "usage: bench_cuda_chain [steps >= 1] [reps >= 1]\n");
        return 2;
    }
    cudaDeviceProp pr;
    CK(cudaGetDeviceProperties(&pr, 0));
    int per_sm = 0;
    CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, k_persistent, 256, 0));
    const unsigned blocks = (unsigned)(pr.multiProcessorCount * (per_sm < 2 ? per_sm : 2));
    int *words;
    unsigned *sync;
    cudaStream_t st;
    CK(cudaMalloc(&words, sizeof(int) * (size_t)n));
    CK(cudaMalloc(&sync, 2 * sizeof(unsigned)));
    CK(cudaMemset(sync, 0, 2 * sizeof(unsigned)));
    CK(cudaStreamCreate(&st));
    printf("%s, %d SMs; %d steps of %u blocks x 256 threads, median of %d\n", pr.name, pr.multiProcessorCount, n,
           blocks, reps);
    const double g0 = time_graph(st, words, n, blocks, 0, reps), g1 = time_graph(st, words, n, blocks, 1, reps);
    const double p = time_persistent(st, words, n, blocks, sync, reps);
    printf("graph            %8.1f us  %6.2f us a step\n", g0 * 1e3, g0 * 1e3 / n);
    printf("graph + PDL      %8.1f us  %6.2f us a step\n", g1 * 1e3, g1 * 1e3 / n);
    printf("barriers         %8.1f us  %6.2f us a step\n", p * 1e3, p * 1e3 / n);
    cudaFree(words);
    cudaFree(sync);
    cudaStreamDestroy(st);
    return 0;
}
