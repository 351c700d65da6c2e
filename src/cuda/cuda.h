/* cuda.h - the device a model runs on: this CPU, or an NVIDIA GPU through
 * the CUDA backend (built with cmake -DMLXCEL_CUDA=ON; docs/cuda.md).
 *
 * The backend takes over mx_forward for a model (model.h, mx_backend):
 * the checkpoint's tensors are copied to GPU 0 once, in the MLX affine
 * layout as they are, each sequence's KV cache lives on the GPU, and a
 * call runs the whole forward pass there, returning the logits to the
 * host.  Sampling, the tokenizer and everything above the model stay on
 * the CPU, so generate, chat, serve, bench and perplexity run unchanged. */
#ifndef MX_CUDA_H
#define MX_CUDA_H

#include <stddef.h>

#include "model/model.h"
#include "util/err.h"

/* Puts m on the named device: NULL takes MLXCEL_DEVICE; NULL/""/"cpu"
 * leaves it on the CPU; "cuda" attaches the CUDA backend (GPU 0).  An
 * unknown name, a build without CUDA, no usable GPU or a model feature the
 * GPU path lacks is an error naming it. */
int mx_device_select(mx_model *m, const char *name, mx_err *e);
/* "cpu", or "cuda (<GPU name>)". */
const char *mx_device_name(const mx_model *m);

/* 1 when this build has the CUDA backend. */
int mx_cuda_built(void);
/* 1 when a GPU can be used (info gets its name), else 0 (info says why). */
int mx_cuda_probe(char *info, size_t cap);
/* Attaches the CUDA backend to m. */
int mx_cuda_attach(mx_model *m, mx_err *e);
/* Y [T][rows] = X [T][cols] W^T (+ bias) for one linear on the GPU, by
 * the kernels the forward pass uses (matvec for T <= 8, tiles above); for
 * tests. */
int mx_cuda_linear(const mx_linear *l, const float *X, int T, float *Y, mx_err *e);
/* The greedy step's argmax on the GPU (what mx_decode_greedy's steps end
 * with) of x[0 .. n) into *id; for tests. */
int mx_cuda_argmax(const float *x, int n, int32_t *id, mx_err *e);
/* How many MoE layers of one-token steps were launched with the router
 * inside phase 1's launch (MLXCEL_CUDA_MOE_ROUTER; a captured graph
 * counts once), in this process; for tests. */
long mx_cuda_routed_launches(void);
/* How many MoE layers of one-token steps were routed by o_proj's launch
 * (MLXCEL_CUDA_ROUTER_IN_O; a captured graph counts once); for tests. */
long mx_cuda_rp_launches(void);
/* How many one-token expert sums were launched with the routed experts'
 * matrices made from one stride (MLXCEL_CUDA_ESTRIDE: the checkpoint's
 * stacked tensors, no read of the matrix table on the step's chain; a
 * captured graph counts once), in this process; for tests. */
long mx_cuda_estride_launches(void);
/* 1 when the prompt tiles run on wgmma (the GPU runs this build's sm_90a
 * code and MLXCEL_CUDA_WGMMA was not 0 when the last model or linear was
 * set up), else 0; for tests. */
int mx_cuda_wgmma_active(void);
/* The GPU's copy bandwidth in GB/s (bytes read + written, median of reps
 * device-to-device copies of `bytes`), or < 0 when there is none. */
double mx_cuda_membw_probe(size_t bytes, int reps);

#endif
