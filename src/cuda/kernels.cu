/* kernels.cu - the CUDA kernels of the backend (kern.h says what each
 * computes).  Plain CUDA C: no templates beyond the bit width of a chunk,
 * no libraries.
 *
 * How the decode kernels spend the bandwidth: one warp per output row, its
 * lanes on consecutive 32-value chunks (a 4-bit chunk is one 16-byte
 * load, so a warp reads 512 contiguous bytes per step), 8 rows per block,
 * and as many blocks as rows / 8, so a matrix of a few thousand rows
 * already fills every SM.  The fused MoE kernels do the same over the
 * rows of all active experts at once: phase 1 the gate and up rows of
 * every slot (one warp computes both rows and writes act(g) * u), phase 2
 * the output rows with each slot's router weight folded in. */
#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <stdint.h>
#include <stdio.h>

#include <algorithm>
#include <type_traits>
#include <vector>

#include "cuda/kern.h"

#define WARPS 8
#define THREADS (WARPS * 32)

/* 0, or the launch's error code. */
static int launched(void) { return (int)cudaGetLastError(); }

/* ---- programmatic dependent launch --------------------------------------------
 *
 * Every kernel but the step's first is launched with programmatic stream
 * serialisation (Hopper): it may start while its predecessor finishes, and
 * waits (griddepcontrol.wait) before it touches anything an earlier kernel
 * writes or reads.  Every block of every kernel executes the wait before
 * it ends, so "kernel N finished" still implies "kernels < N finished".
 * The decode matvecs issue their first weight loads (model data nothing
 * writes) before the wait: they stream during the previous kernel's tail. */
static int g_pdl = 1;

extern "C" void mxc_set_pdl(int on) { g_pdl = on; }

/* prompts' q/k/v heads a warp each (k_qkv_w) unless MLXCEL_CUDA_QKV_WARP=0 */
static int g_qkv_warp = 1;

extern "C" void mxc_set_qkv_warp(int on) { g_qkv_warp = on; }

/* one-token streaming kernels on integer dot products (below) unless
 * MLXCEL_CUDA_IDOT=0 */
static int g_idot = 1;

extern "C" void mxc_set_idot(int on) { g_idot = on; }

/* the integer streaming kernels' weights through a ring in shared memory
 * (mv_ring) unless MLXCEL_CUDA_RING=0 */
static int g_ring = 1;

extern "C" void mxc_set_ring(int on) { g_ring = on; }

/* one token's attention copies its first split's K/V rows before its wait
 * unless MLXCEL_CUDA_ATT_PRE=0 */
static int g_att_pre = 1;
#define ATT_PRE_HD 128

extern "C" void mxc_set_att_pre(int on) { g_att_pre = on; }

/* one token's attention: the kv head's rows asked for beside the q
 * head's (kv), the combining of up to 8 splits in one round trip
 * (comb1), the successor's launch once the heads are made (early) */
static int g_att_kv = 1, g_att_comb1 = 0, g_att_early = 0;

extern "C" void mxc_set_att_opts(int kv, int comb1, int early)
{
    g_att_kv = kv, g_att_comb1 = comb1, g_att_early = early;
}

/* one token's q/k/v and lm_head (g_cluster), phase 1 (g_cluster_moe)
 * stage their input norm in clusters of 2 blocks, each reading half
 * (MLXCEL_CUDA_CLUSTER, MLXCEL_CUDA_CLUSTER_MOE; 0: every block reads the
 * whole residual).  Clusters of 4 and 8 were slower (docs/cuda.md). */
static int g_cluster = 0, g_cluster_moe = 0;

extern "C" void mxc_set_cluster(int n, int moe)
{
    g_cluster = n == 2 ? n : 0;
    g_cluster_moe = moe == 2 ? moe : 0;
}

/* ---- phase stamps (a measuring build: -DMXC_STAMPS) ----------------------------
 *
 * Thread 0 of each block of the one-token kernels notes when the block
 * started, when it reached its wait, when the wait returned, when it let
 * its successor launch and when it left (%globaltimer, ns; and %clock64
 * for the spans inside a block; STAMP_AT(5 .. 7): points of a kernel's
 * own), into a ring that mxc_stamps_dump writes
 * out (MLXCEL_CUDA_STAMPS=file; tools/cuda_stamps.py reads it).  A
 * kernel's time in a step then splits into the release of its wait after
 * its predecessor's last block left, its work and its tail (the last
 * block's chain).  The trace of whole kernels (tools/cuda_trace.c) cannot
 * tell those apart.  Without MXC_STAMPS none of it is compiled. */
#ifdef MXC_STAMPS
__device__ mxc_stamp *g_stamp;
__device__ unsigned long long g_stamp_n;
__device__ unsigned g_stamp_cap;

__device__ __forceinline__ uint64_t stamp_now(void)
{
    uint64_t t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

/* the block's stamps: [0 .. 7] times, [8 .. 15] clocks */
__device__ __forceinline__ uint64_t *stamp_sh(void)
{
    __shared__ uint64_t s[16];
    return s;
}

__device__ __forceinline__ void stamp_at(int i)
{
    if (threadIdx.x == 0) {
        uint64_t *s = stamp_sh();
        s[i] = stamp_now();
        s[8 + i] = (uint64_t)clock64();
    }
}

struct stamp_guard {
    int kid;
    __device__ explicit stamp_guard(int k) : kid(k)
    {
        if (threadIdx.x == 0) {
            uint64_t *s = stamp_sh();
            for (int i = 1; i < 8; i++)
                s[i] = s[8 + i] = 0;
        }
        stamp_at(0);
    }
    __device__ ~stamp_guard()
    {
        stamp_at(4);
        if (threadIdx.x || !g_stamp)
            return;
        const uint64_t *s = stamp_sh();
        const unsigned long long i = atomicAdd(&g_stamp_n, 1ull);
        mxc_stamp *r = g_stamp + i % g_stamp_cap;
        unsigned sm;
        asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
        r->kid = (uint32_t)kid;
        r->blk = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
        r->smid = sm;
        r->nblk = gridDim.x * gridDim.y * gridDim.z;
        for (int j = 0; j < 8; j++)
            r->t[j] = s[j];
        for (int j = 1; j < 5; j++)
            r->c[j - 1] = s[8 + j] ? (uint32_t)(s[8 + j] - s[8]) : 0u;
    }
};
#define STAMP(k) stamp_guard stamp_g_(k)
#define STAMP_AT(i) stamp_at(i)
#else
#define STAMP(k) ((void)0)
#define STAMP_AT(i) ((void)0)
#endif

extern "C" int mxc_stamps_start(size_t cap)
{
#ifdef MXC_STAMPS
    mxc_stamp *p = nullptr;
    unsigned c = (unsigned)cap;
    unsigned long long z = 0;
    if (cudaMalloc(&p, cap * sizeof *p) != cudaSuccess || cudaMemset(p, 0, cap * sizeof *p) != cudaSuccess ||
        cudaMemcpyToSymbol(g_stamp, &p, sizeof p) != cudaSuccess ||
        cudaMemcpyToSymbol(g_stamp_cap, &c, sizeof c) != cudaSuccess ||
        cudaMemcpyToSymbol(g_stamp_n, &z, sizeof z) != cudaSuccess)
        return -1;
    return 0;
#else
    (void)cap;
    return -1;   /* not a measuring build */
#endif
}

/* The ring, oldest first, into path: the count (u64), then the records. */
extern "C" int mxc_stamps_dump(const char *path)
{
#ifdef MXC_STAMPS
    mxc_stamp *p = nullptr;
    unsigned long long n = 0;
    unsigned cap = 0;
    if (cudaDeviceSynchronize() != cudaSuccess || cudaMemcpyFromSymbol(&p, g_stamp, sizeof p) != cudaSuccess ||
        cudaMemcpyFromSymbol(&n, g_stamp_n, sizeof n) != cudaSuccess ||
        cudaMemcpyFromSymbol(&cap, g_stamp_cap, sizeof cap) != cudaSuccess || !p || !cap)
        return -1;
    const unsigned long long k = n < cap ? n : cap, first = n < cap ? 0 : n % cap;
    std::vector<mxc_stamp> h(cap);
    if (cudaMemcpy(h.data(), p, cap * sizeof *p, cudaMemcpyDeviceToHost) != cudaSuccess)
        return -1;
    FILE *f = fopen(path, "wb");
    if (!f)
        return -1;
    int bad = fwrite(&k, sizeof k, 1, f) != 1;
    for (unsigned long long i = 0; i < k && !bad; i++)
        bad = fwrite(&h[(first + i) % cap], sizeof h[0], 1, f) != 1;
    bad |= fclose(f) != 0;
    return bad ? -1 : 0;
#else
    (void)path;
    return -1;
#endif
}

__device__ __forceinline__ void pdl_wait(void)
{
    STAMP_AT(1);
    asm volatile("griddepcontrol.wait;" ::: "memory");
    STAMP_AT(2);
}
#ifdef MXC_PDL_EARLY
__device__ __forceinline__ void pdl_go(void) { asm volatile("griddepcontrol.launch_dependents;" ::: "memory"); }
#else
__device__ __forceinline__ void pdl_go(void) {}
#endif
/* The streaming kernels and the one-token attention let their successor
 * launch once every block is past its main work (the successor's blocks
 * then become resident as these exit, and issue their first weight loads
 * before they wait) instead of after the last block has exited; not at
 * the top of the kernel, where the successor's blocks would take SM slots
 * from blocks of this grid not yet started.  Off: MLXCEL_CUDA_PDL_TRIGGER=0.
 * Either way a kernel starts only when every block of its predecessor is
 * past its wait: what the kernels two launches back wrote is complete, and
 * the code before a wait may read it (through L2: ld.cg, cp.async.cg).
 * (Phase 1 on o_proj's flags, k_moe1s with h_flag, runs on flags instead:
 * it lets phase 2 launch at its start and waits for o_proj's launch only at
 * its end.  Phase 2's blocks may then start beside it before o_proj's last
 * block has routed (the slots phase 1 leaves spare, moe1_spare), so with
 * the routes inside the flag's word they take their kinds from that word
 * or the launch's parameters, never from the routes' array; without it no
 * slot is left spare and they start only as phase 1's blocks leave.)
 * (Triggering right after the wait, with the streaming grids one block an
 * SM so that the successor's blocks copy their weights beside them, was
 * slower: docs/cuda.md.) */
__constant__ int c_pdl_trigger = 1;

extern "C" void mxc_set_pdl_trigger(int on)
{
    cudaMemcpyToSymbol(c_pdl_trigger, &on, sizeof on);
}

/* One token's phase 1 on o_proj's flags, with the routes inside the
 * flag's word, lets phase 2 launch at its start (its blocks then take the
 * slots phase 1 leaves spare and ask for their first weights beside it,
 * their experts from that word; MLXCEL_CUDA_MOE1_GO=0: at its end).
 * pdl_go is empty unless MXC_PDL_EARLY, so before session 23 phase 2
 * launched only once phase 1's blocks reached their end: 853.5-854.5
 * tok/s against 836.2-838.3 (docs/cuda.md, session 23). */
__constant__ int c_moe1_go = 1;

extern "C" void mxc_set_moe1_go(int on)
{
    cudaMemcpyToSymbol(c_moe1_go, &on, sizeof on);
}

__device__ __forceinline__ void pdl_trigger(void)
{
    STAMP_AT(3);
    if (c_pdl_trigger)
        asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
}

/* what a kernel does first when it has nothing to do before the wait */
__device__ __forceinline__ void pdl_enter(void)
{
    pdl_go();
    pdl_wait();
}

/* k<<<grid, block, smem, st>>>(args) in clusters of cl blocks along x
 * (cl > 1; grid.x a multiple of cl), with programmatic serialisation
 * unless pdl is 0 (a step's first kernel, after copies) or MLXCEL_CUDA_PDL=0. */
template <typename... P, typename... A>
static int launch_kc(void (*k)(P...), int cl, dim3 grid, dim3 block, size_t smem, cudaStream_t st, int pdl,
                     A... args)
{
    cudaLaunchAttribute at[2];
    int n = 0;
    if (cl > 1) {
        at[n].id = cudaLaunchAttributeClusterDimension;
        at[n].val.clusterDim.x = (unsigned)cl;
        at[n].val.clusterDim.y = 1;
        at[n++].val.clusterDim.z = 1;
    }
    if (pdl && g_pdl) {
        at[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        at[n++].val.programmaticStreamSerializationAllowed = 1;
    }
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = st;
    cfg.attrs = at;
    cfg.numAttrs = (unsigned)n;
    const cudaError_t ce = cudaLaunchKernelEx(&cfg, k, ((P)args)...);
    return ce != cudaSuccess ? (int)ce : launched();
}

/* launch_kc without clusters. */
template <typename... P, typename... A>
static int launch_k(void (*k)(P...), dim3 grid, dim3 block, size_t smem, cudaStream_t st, int pdl, A... args)
{
    return launch_kc(k, 1, grid, block, smem, st, pdl, args...);
}

/* ---- small device helpers ------------------------------------------------- */

__device__ __forceinline__ float ldf(const void *p, int dt, int64_t i)
{
    if (dt == MXC_F16)
        return __half2float(((const __half *)p)[i]);
    if (dt == MXC_BF16)
        return __bfloat162float(((const __nv_bfloat16 *)p)[i]);
    return ((const float *)p)[i];
}

__device__ __forceinline__ float warp_sum(float v)
{
#pragma unroll
    for (int o = 16; o; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v)
{
#pragma unroll
    for (int o = 16; o; o >>= 1)
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* Sum of v over the block (blockDim.x a multiple of 32, at most 1024);
 * every thread gets it. */
__device__ double block_sum(double v)
{
    __shared__ double part[32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
#pragma unroll
    for (int o = 16; o; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    __syncthreads();   /* part may still be read by a previous call */
    if (lane == 0)
        part[warp] = v;
    __syncthreads();
    double s = 0.0;
    for (int i = 0; i < nw; i++)
        s += part[i];
    return s;
}

__device__ float block_maxf(float v)
{
    __shared__ float part[32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0)
        part[warp] = v;
    __syncthreads();
    float m = -INFINITY;
    for (int i = 0; i < nw; i++)
        m = fmaxf(m, part[i]);
    return m;
}

/* act(g) * u, as moe.h's mx_glu: SiLU or GELU (tanh). */
__device__ __forceinline__ float glu(int act, float g, float u)
{
    if (act == 1) {
        const float k = 0.7978845608028654f;
        return 0.5f * g * (1.0f + tanhf(k * (g + 0.044715f * g * g * g))) * u;
    }
    return g / (1.0f + expf(-g)) * u;
}

/* ---- chunks of a row ----------------------------------------------------------- */

/* The BITS words of a 32-value chunk, with the widest aligned loads the
 * width allows (rows and chunks of 2, 4 and 8 bits are 8/16-byte aligned). */
template <int BITS>
__device__ __forceinline__ void load_words(const uint32_t *__restrict__ p, uint32_t *w)
{
    if constexpr (BITS == 4) {
        const uint4 v = __ldg((const uint4 *)p);
        w[0] = v.x, w[1] = v.y, w[2] = v.z, w[3] = v.w;
    } else if constexpr (BITS == 8) {
        const uint4 a = __ldg((const uint4 *)p), b = __ldg((const uint4 *)p + 1);
        w[0] = a.x, w[1] = a.y, w[2] = a.z, w[3] = a.w, w[4] = b.x, w[5] = b.y, w[6] = b.z, w[7] = b.w;
    } else if constexpr (BITS == 2) {
        const uint2 v = __ldg((const uint2 *)p);
        w[0] = v.x, w[1] = v.y;
    } else {
#pragma unroll
        for (int i = 0; i < BITS; i++)
            w[i] = __ldg(p + i);
    }
}

/* The 32 integers of a chunk: value i at bits [i*BITS, (i+1)*BITS) of the
 * little-endian stream (all indices compile-time constants). */
template <int BITS>
__device__ __forceinline__ void unpack32(const uint32_t *w, float *q)
{
#pragma unroll
    for (int i = 0; i < 32; i++) {
        const int bit = i * BITS, wi = bit >> 5, sh = bit & 31;
        uint32_t v = w[wi] >> sh;
        if (sh + BITS > 32)
            v |= w[wi + 1] << (32 - sh);
        q[i] = (float)(v & ((1u << BITS) - 1u));
    }
}

/* acc[t] += (chunk c of row r) . (chunk c of x_t) for t < T (NT at most). */
template <int BITS, int NT>
__device__ __forceinline__ void chunk_dot(const mxc_mat &m, int64_t r, int64_t c, const float *X,
                                          int64_t ldx, int T, float *acc)
{
    float q[32];
    float s = 1.0f, b = 0.0f;
    if constexpr (BITS == 0) {
        const int64_t base = r * m.cols + c * 32;
#pragma unroll
        for (int i = 0; i < 32; i++)
            q[i] = ldf(m.w, m.dt, base + i);
    } else {
        uint32_t w[BITS];
        load_words<BITS>((const uint32_t *)m.w + r * (m.cols * BITS / 32) + c * BITS, w);
        unpack32<BITS>(w, q);
        const int64_t gi = r * (m.cols / m.gs) + (c * 32) / m.gs;
        s = ldf(m.s, m.dt, gi);
        b = ldf(m.b, m.dt, gi);
    }
#pragma unroll
    for (int t = 0; t < NT; t++) {
        if (t >= T)
            break;
        const float4 *xp = (const float4 *)(X + t * ldx + c * 32);
        float sqx = 0.0f, sx = 0.0f;
#pragma unroll
        for (int i = 0; i < 8; i++) {
            const float4 v = xp[i];
            sqx += q[4 * i] * v.x + q[4 * i + 1] * v.y + q[4 * i + 2] * v.z + q[4 * i + 3] * v.w;
            sx += (v.x + v.y) + (v.z + v.w);
        }
        acc[t] += BITS == 0 ? sqx : s * sqx + b * sx;
    }
}

/* This lane's share of row r . x_t (lanes take chunks lane, lane + 32, ...). */
template <int BITS, int NT>
__device__ __forceinline__ void row_dot_b(const mxc_mat &m, int64_t r, const float *X, int64_t ldx,
                                          int T, float *acc, int lane)
{
    const int64_t nch = m.cols >> 5;
#pragma unroll 2
    for (int64_t c = lane; c < nch; c += 32)
        chunk_dot<BITS, NT>(m, r, c, X, ldx, T, acc);
}

template <int NT>
__device__ __forceinline__ void row_dot(const mxc_mat &m, int64_t r, const float *X, int64_t ldx,
                                        int T, float *acc, int lane)
{
    switch (m.bits) {
    case 2: row_dot_b<2, NT>(m, r, X, ldx, T, acc, lane); break;
    case 3: row_dot_b<3, NT>(m, r, X, ldx, T, acc, lane); break;
    case 4: row_dot_b<4, NT>(m, r, X, ldx, T, acc, lane); break;
    case 5: row_dot_b<5, NT>(m, r, X, ldx, T, acc, lane); break;
    case 6: row_dot_b<6, NT>(m, r, X, ldx, T, acc, lane); break;
    case 8: row_dot_b<8, NT>(m, r, X, ldx, T, acc, lane); break;
    default: row_dot_b<0, NT>(m, r, X, ldx, T, acc, lane); break;
    }
}

/* ---- one token, several rows per warp -------------------------------------------------
 *
 * A warp takes R consecutive rows: for each of its chunks it loads the 32
 * x values and their sum once and the R rows' words (all loads issued
 * before the arithmetic), so the x traffic and the sum are shared by R
 * rows and R loads are in flight per lane.  Integers become floats
 * without the (quarter-rate) converter: v < 2^23 in the mantissa of 2^23
 * is the float 2^23 + v exactly; for 2, 4 and 8 bits one byte permute
 * puts a value under that exponent. */

__device__ __forceinline__ float mag(uint32_t v) { return __int_as_float(0x4B000000u | v) - 8388608.0f; }

__device__ __forceinline__ float magb(uint32_t bytes, int b)
{
    return __int_as_float(__byte_perm(bytes, 0x4B000000u, 0x7440 + b)) - 8388608.0f;
}

/* sum_i q_i x_i over values [8Q, 8Q + 8) of a chunk of BITS words (x8
 * holds those 8 x values): the chunk is taken a quarter at a time so that
 * only 8 x values live in registers. */
template <int BITS, int Q>
__device__ __forceinline__ float dot8(const uint32_t *w, const float *x8)
{
    float s0 = 0.0f, s1 = 0.0f;
    if constexpr (BITS == 4) {
        const uint32_t lo = w[Q] & 0x0F0F0F0Fu, hi = (w[Q] >> 4) & 0x0F0F0F0Fu;
#pragma unroll
        for (int b = 0; b < 4; b++) {
            s0 += magb(lo, b) * x8[2 * b];
            s1 += magb(hi, b) * x8[2 * b + 1];
        }
    } else if constexpr (BITS == 8) {
#pragma unroll
        for (int k = 0; k < 2; k++) {
            s0 += magb(w[2 * Q + k], 0) * x8[4 * k] + magb(w[2 * Q + k], 2) * x8[4 * k + 2];
            s1 += magb(w[2 * Q + k], 1) * x8[4 * k + 1] + magb(w[2 * Q + k], 3) * x8[4 * k + 3];
        }
    } else if constexpr (BITS == 2) {
#pragma unroll
        for (int sh = 0; sh < 8; sh += 2) {
            const uint32_t v = (w[Q >> 1] >> sh) & 0x03030303u;
#pragma unroll
            for (int b2 = 0; b2 < 2; b2++)
                (b2 ? s1 : s0) += magb(v, 2 * (Q & 1) + b2) * x8[4 * b2 + sh / 2];
        }
    } else {
#pragma unroll
        for (int i = 8 * Q; i < 8 * Q + 8; i++) {
            const int bit = i * BITS, wi = bit >> 5, sh = bit & 31;
            uint32_t v = w[wi] >> sh;
            if (sh + BITS > 32)
                v |= w[wi + 1] << (32 - sh);
            (i & 1 ? s1 : s0) += mag(v & ((1u << BITS) - 1u)) * x8[i - 8 * Q];
        }
    }
    return s0 + s1;
}

/* The 8 x values of quarter Q of chunk c (and their sum added to sx). */
template <int Q>
__device__ __forceinline__ void load_x8(const float *x, int64_t c, float *x8, float &sx)
{
    const float4 a = ((const float4 *)(x + c * 32))[2 * Q], b = ((const float4 *)(x + c * 32))[2 * Q + 1];
    x8[0] = a.x, x8[1] = a.y, x8[2] = a.z, x8[3] = a.w, x8[4] = b.x, x8[5] = b.y, x8[6] = b.z, x8[7] = b.w;
    sx += ((a.x + a.y) + (a.z + a.w)) + ((b.x + b.y) + (b.z + b.w));
}

/* d[i] += row i's chunk . x for the R rows whose words are in w, and sx
 * the sum of the chunk's x. */
template <int BITS, int R>
__device__ __forceinline__ void chunk_rows(const uint32_t (*w)[BITS], const float *x, int64_t c, float *d, float &sx)
{
    float x8[8];
#define MXC_Q(Q)                                     \
    load_x8<Q>(x, c, x8, sx);                       \
    _Pragma("unroll") for (int i = 0; i < R; i++) d[i] += dot8<BITS, Q>(w[i], x8);
    MXC_Q(0) MXC_Q(1) MXC_Q(2) MXC_Q(3)
#undef MXC_Q
}

/* acc[i] += this lane's share of row r0 + i . x, i < R (rows past the end
 * of the matrix are computed on its last row and not used). */
template <int BITS, int R>
__device__ __forceinline__ void rows_dot_b(const mxc_mat &m, int64_t r0, const float *x, float *acc,
                                           int lane)
{
    const int64_t nch = m.cols >> 5, gpr = m.cols / (m.gs > 0 ? m.gs : 32);
#pragma unroll 2
    for (int64_t c = lane; c < nch; c += 32) {
        uint32_t w[R][BITS > 0 ? BITS : 1];
        float sc[R], bi[R];
        if constexpr (BITS > 0) {
#pragma unroll
            for (int i = 0; i < R; i++) {
                const int64_t r = min(r0 + i, m.rows - 1);
                load_words<BITS>((const uint32_t *)m.w + r * (m.cols * BITS / 32) + c * BITS, w[i]);
                const int64_t gi = r * gpr + (c * 32) / m.gs;
                sc[i] = ldf(m.s, m.dt, gi);
                bi[i] = ldf(m.b, m.dt, gi);
            }
        }
        if constexpr (BITS > 0) {
            float d[R], sx = 0.0f;
#pragma unroll
            for (int i = 0; i < R; i++)
                d[i] = 0.0f;
            chunk_rows<BITS, R>(w, x, c, d, sx);
#pragma unroll
            for (int i = 0; i < R; i++)
                acc[i] += sc[i] * d[i] + bi[i] * sx;
        } else {
#pragma unroll
            for (int i = 0; i < R; i++) {
                const int64_t base = min(r0 + i, m.rows - 1) * m.cols + c * 32;
                float d = 0.0f;
                for (int k = 0; k < 32; k++)
                    d += ldf(m.w, m.dt, base + k) * x[c * 32 + k];
                acc[i] += d;
            }
        }
    }
}

template <int R>
__device__ __forceinline__ void rows_dot(const mxc_mat &m, int64_t r0, const float *x, float *acc, int lane)
{
    switch (m.bits) {
    case 2: rows_dot_b<2, R>(m, r0, x, acc, lane); break;
    case 3: rows_dot_b<3, R>(m, r0, x, acc, lane); break;
    case 4: rows_dot_b<4, R>(m, r0, x, acc, lane); break;
    case 5: rows_dot_b<5, R>(m, r0, x, acc, lane); break;
    case 6: rows_dot_b<6, R>(m, r0, x, acc, lane); break;
    case 8: rows_dot_b<8, R>(m, r0, x, acc, lane); break;
    default: rows_dot_b<0, R>(m, r0, x, acc, lane); break;
    }
}

/* rows_dot for a bit width known at compile time (B >= 0), or read from
 * the matrix (B < 0): a kernel instantiated for one width keeps only that
 * width's registers. */
template <int B, int R>
__device__ __forceinline__ void rows_dot_sel(const mxc_mat &m, int64_t r0, const float *x, float *acc, int lane)
{
    if constexpr (B < 0)
        rows_dot<R>(m, r0, x, acc, lane);
    else
        rows_dot_b<B, R>(m, r0, x, acc, lane);
}

/* Rows r0, r0 + 1 of gate and of up against one x: four rows in flight. */
template <int BITS>
__device__ __forceinline__ void dual_rows_b(const mxc_mat &g, const mxc_mat &u, int64_t r0, const float *x,
                                            float *ag, float *au, int lane)
{
    const int64_t nch = g.cols >> 5, gpr = g.cols / g.gs;
#pragma unroll 2
    for (int64_t c = lane; c < nch; c += 32) {
        uint32_t w[4][BITS];
        float sc[4], bi[4];
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const mxc_mat &m = i < 2 ? g : u;
            const int64_t r = min(r0 + (i & 1), m.rows - 1);
            load_words<BITS>((const uint32_t *)m.w + r * (m.cols * BITS / 32) + c * BITS, w[i]);
            const int64_t gi = r * gpr + (c * 32) / m.gs;
            sc[i] = ldf(m.s, m.dt, gi);
            bi[i] = ldf(m.b, m.dt, gi);
        }
        float d[4] = {0.0f, 0.0f, 0.0f, 0.0f}, sx = 0.0f;
        chunk_rows<BITS, 4>(w, x, c, d, sx);
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const float v = sc[i] * d[i] + bi[i] * sx;
            if (i < 2)
                ag[i] += v;
            else
                au[i - 2] += v;
        }
    }
}

__device__ __forceinline__ void dual_rows(const mxc_mat &g, const mxc_mat &u, int64_t r0, const float *x,
                                          float *ag, float *au, int lane)
{
    if (g.bits != u.bits || g.gs != u.gs || g.bits == 0) {
        rows_dot<2>(g, r0, x, ag, lane);
        rows_dot<2>(u, r0, x, au, lane);
        return;
    }
    switch (g.bits) {
    case 2: dual_rows_b<2>(g, u, r0, x, ag, au, lane); break;
    case 3: dual_rows_b<3>(g, u, r0, x, ag, au, lane); break;
    case 4: dual_rows_b<4>(g, u, r0, x, ag, au, lane); break;
    case 5: dual_rows_b<5>(g, u, r0, x, ag, au, lane); break;
    case 6: dual_rows_b<6>(g, u, r0, x, ag, au, lane); break;
    default: dual_rows_b<8>(g, u, r0, x, ag, au, lane); break;
    }
}

/* One token: warp w of the launch takes R consecutive rows of the matrix
 * its group index falls in (R = 4 for the big matrices, fewer for small
 * ones so that every SM still gets warps). */
template <int R, int B>
__global__ void __launch_bounds__(THREADS, 2) k_matvec1(mxc_mv mv, const float *x, int64_t groups)
{
    pdl_enter();
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int64_t gid = (int64_t)blockIdx.x * WARPS + warp;
    if (gid >= groups)
        return;
    int i = 0;
    while (i < mv.n - 1 && gid >= (mv.m[i].rows + R - 1) / R)
        gid -= (mv.m[i++].rows + R - 1) / R;
    const mxc_mat m = mv.m[i];
    const int64_t r0 = gid * R;
    float acc[R];
#pragma unroll
    for (int k = 0; k < R; k++)
        acc[k] = 0.0f;
    rows_dot_sel<B, R>(m, r0, x, acc, lane);
#pragma unroll
    for (int k = 0; k < R; k++) {
        const float v = warp_sum(acc[k]);
        if (lane == 0 && r0 + k < m.rows)
            mv.y[i][r0 + k] = v + (m.bias ? m.bias[r0 + k] : 0.0f);
    }
}

template <int R>
static int launch_matvec1(cudaStream_t st, const mxc_mv *mv, const float *X)
{
    int64_t groups = 0;
    for (int i = 0; i < mv->n; i++)
        groups += (mv->m[i].rows + R - 1) / R;
    int bits = mv->m[0].bits;
    for (int i = 1; i < mv->n; i++)
        bits = mv->m[i].bits == bits ? bits : -1;
    const unsigned nb = (unsigned)((groups + WARPS - 1) / WARPS);
    if (bits == 4)
        return launch_k(k_matvec1<R, 4>, nb, THREADS, 0, st, 1, *mv, X, groups);
    else if (bits == 8)
        return launch_k(k_matvec1<R, 8>, nb, THREADS, 0, st, 1, *mv, X, groups);
    else
        return launch_k(k_matvec1<R, -1>, nb, THREADS, 0, st, 1, *mv, X, groups);
}

/* ---- matvec: T <= 8 tokens, up to 4 matrices in one launch ------------------ */

template <int NT>
__global__ void __launch_bounds__(THREADS) k_matvec(mxc_mv mv, const float *X, int64_t ldx, int T,
                                                   int64_t total)
{
    pdl_enter();
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int64_t r = (int64_t)blockIdx.x * WARPS + warp;
    if (r >= total)
        return;
    int i = 0;
    while (i < mv.n - 1 && r >= mv.m[i].rows)
        r -= mv.m[i++].rows;
    const mxc_mat m = mv.m[i];
    float acc[NT];
#pragma unroll
    for (int t = 0; t < NT; t++)
        acc[t] = 0.0f;
    row_dot<NT>(m, r, X, ldx, T, acc, lane);
    const float bias = m.bias ? m.bias[r] : 0.0f;
    float *y = mv.y[i];
    const int64_t ldy = mv.ldy[i];
#pragma unroll
    for (int t = 0; t < NT; t++) {
        const float v = warp_sum(acc[t]);
        if (lane == 0 && t < T)
            y[t * ldy + r] = v + bias;
    }
}

static int matvec_stream(cudaStream_t st, const mxc_mv *mv, const float *x, const mxc_norm_in *nin,
                         const mxc_route *rt, int *cnt);

static int matvec_tokens(cudaStream_t st, const mxc_mv *mv, const float *X, int64_t ldx, int T);

int mxc_matvec(cudaStream_t st, const mxc_mv *mv, const float *X, int64_t ldx, int T)
{
    int64_t total = 0;
    for (int i = 0; i < mv->n; i++)
        total += mv->m[i].rows;
    const unsigned blocks = (unsigned)((total + WARPS - 1) / WARPS);
    if (T == 1) {
        const int rc = matvec_stream(st, mv, X, nullptr, nullptr, nullptr);
        if (rc >= 0)
            return rc;
        if (total >= 16384)
            return launch_matvec1<4>(st, mv, X);
        if (total >= 4096)
            return launch_matvec1<2>(st, mv, X);
        return launch_matvec1<1>(st, mv, X);
    }
    const int rc = matvec_tokens(st, mv, X, ldx, T);
    if (rc >= 0)
        return rc;
    return launch_k(k_matvec<MXC_MV_MAXT>, blocks, THREADS, 0, st, 1, *mv, X, ldx, T, total);
}

/* ---- the tile kernel (prefill) ------------------------------------------------ */

/* Values [sub*8, sub*8 + 8) of chunk c of row r, dequantized. */
__device__ __forceinline__ void dequant8(const mxc_mat &M, int64_t r, int64_t c, int sub, float *v)
{
    if (M.bits == 0) {
        const int64_t base = r * M.cols + c * 32 + sub * 8;
#pragma unroll
        for (int i = 0; i < 8; i++)
            v[i] = ldf(M.w, M.dt, base + i);
        return;
    }
    const int bits = M.bits;
    const uint32_t *cw = (const uint32_t *)M.w + r * (M.cols * bits / 32) + c * bits;
    const int64_t gi = r * (M.cols / M.gs) + (c * 32) / M.gs;
    const float s = ldf(M.s, M.dt, gi), b = ldf(M.b, M.dt, gi);
    const uint32_t mask = (1u << bits) - 1u;
#pragma unroll
    for (int i = 0; i < 8; i++) {
        const int bit = (sub * 8 + i) * bits, wi = bit >> 5, sh = bit & 31;
        uint32_t x = __ldg(cw + wi) >> sh;
        if (sh + bits > 32)
            x |= __ldg(cw + wi + 1) << (32 - sh);
        v[i] = s * (float)(x & mask) + b;
    }
}

/* A 64-row x 32-token tile: each K step dequantizes 64 rows x 32 values
 * (two matrices in dual mode) and stages 32 tokens x 32 values in shared
 * memory; each thread owns 4 rows x 2 tokens of the output. */
__global__ void __launch_bounds__(256) k_tile(mxc_tile a)
{
    pdl_enter();
    __shared__ float Ws[2][MXC_TILE_R][33];
    __shared__ float Xs[MXC_TILE_T][33];
    mxc_item it;
    if (a.items) {
        it = a.items[blockIdx.y];
    } else {
        it = a.plain;
        it.off = blockIdx.y * MXC_TILE_T;
        it.n = min(MXC_TILE_T, a.plain.n - it.off);
    }
    const mxc_mat M0 = a.table[it.m0];
    const mxc_mat M1 = a.dual ? a.table[it.m1] : M0;
    const int64_t r0 = (int64_t)blockIdx.x * MXC_TILE_R;
    if (r0 >= M0.rows)
        return;
    const int tid = threadIdx.x, tx = tid & 15, ty = tid >> 4;
    float acc[2][4][2];
#pragma unroll
    for (int k = 0; k < 2; k++)
#pragma unroll
        for (int i = 0; i < 4; i++)
            acc[k][i][0] = acc[k][i][1] = 0.0f;
    const int lt = tid >> 3, xpart = (tid & 7) * 4;
    int64_t xrow = -1;
    if (lt < it.n)
        xrow = a.in_list ? a.in_list[it.off + lt] : it.off + lt;
    const int wr = tid >> 2, sub = tid & 3;
    const int64_t grow = r0 + wr;
    const int64_t nch = M0.cols >> 5;
    for (int64_t c = 0; c < nch; c++) {
        float4 xv = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (xrow >= 0)
            xv = *(const float4 *)(a.X + xrow * a.ldx + c * 32 + xpart);
        Xs[lt][xpart] = xv.x;
        Xs[lt][xpart + 1] = xv.y;
        Xs[lt][xpart + 2] = xv.z;
        Xs[lt][xpart + 3] = xv.w;
        for (int k = 0; k < (a.dual ? 2 : 1); k++) {
            float v[8];
            if (grow < M0.rows) {
                dequant8(k ? M1 : M0, grow, c, sub, v);
            } else {
#pragma unroll
                for (int i = 0; i < 8; i++)
                    v[i] = 0.0f;
            }
#pragma unroll
            for (int i = 0; i < 8; i++)
                Ws[k][wr][sub * 8 + i] = v[i];
        }
        __syncthreads();
        if (a.dual) {
#pragma unroll 8
            for (int kk = 0; kk < 32; kk++) {
                const float x0 = Xs[ty][kk], x1 = Xs[ty + 16][kk];
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    const float g = Ws[0][tx + 16 * i][kk], u = Ws[1][tx + 16 * i][kk];
                    acc[0][i][0] += g * x0;
                    acc[0][i][1] += g * x1;
                    acc[1][i][0] += u * x0;
                    acc[1][i][1] += u * x1;
                }
            }
        } else {
#pragma unroll 8
            for (int kk = 0; kk < 32; kk++) {
                const float x0 = Xs[ty][kk], x1 = Xs[ty + 16][kk];
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    const float w = Ws[0][tx + 16 * i][kk];
                    acc[0][i][0] += w * x0;
                    acc[0][i][1] += w * x1;
                }
            }
        }
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const int64_t r = r0 + tx + 16 * i;
        if (r >= M0.rows)
            continue;
        const float bias = !a.dual && M0.bias ? M0.bias[r] : 0.0f;
#pragma unroll
        for (int j = 0; j < 2; j++) {
            const int t = ty + 16 * j;
            if (t >= it.n)
                continue;
            const int64_t orow = a.out_list ? a.out_list[it.off + t] : it.off + t;
            a.Y[orow * a.ldy + r] = a.dual ? glu(a.act, acc[0][i][j], acc[1][i][j]) : acc[0][i][j] + bias;
        }
    }
}

/* ---- the tile kernel on tensor cores (prefill) ---------------------------------
 *
 * Exact to fp32 level without fp32 arithmetic in the inner loop: the
 * weights are small integers q (0..15, 0..255), exact in f16, and each row
 * of X is split into two f16 parts, x / dx = hi + lo (k_mm_prep; dx a
 * power of two, so the scaling is exact, and hi + lo keeps 22 significant
 * bits of every value).  mma.m16n8k16 (f16 in, f32 accumulate) then sums
 * q * hi + q * lo per weight group: each product is exact (8 x 11 bits),
 * only the f32 additions round, as in the CPU's float kernels.  At the end
 * of each group every accumulator is folded in as
 *     tot += s_g * acc + b_g * sum_g(x / dx),     y = dx * tot (+ bias),
 * the identity of the other kernels (s * sum(q x) + b * sum(x)).
 *
 * Layout.  The 16 bytes of a 4-bit chunk row hold value v at nibble v % 8
 * of word v / 8.  Lane (g, t) of a warp (g = lane / 4, t = lane % 4)
 * takes word t of its rows g and g + 8 and makes four f16 pairs of it
 * with one mask and OR each (nibble i and i + 4 under the exponent of
 * 1024, then 1024 subtracted): pairs i = 0..3 are the A fragments of the
 * chunk's two k16 steps (a pair of nibbles i, i + 4 for k slots 2t, 2t + 1
 * of step i / 2, the next pair for slots 2t + 8, 2t + 9).  8 bits: words
 * 2t and 2t + 1, bytes i of each paired by byte permutes.  The products
 * are summed in any order within a group, so X only has to be stored in
 * the matching order: k_mm_prep writes value v of a chunk at position
 * mm_pos(v), where ldmatrix hands each lane exactly its B fragments.
 *
 * Blocks of 4 warps take 64 rows (dual: 32 rows of both matrices) x 64
 * tokens, a warp 32 rows x 32 tokens (2 x 4 MMA tiles, two parts each),
 * or for tiles of up to 32 tokens 16 rows x 32 tokens (mm_mode); each
 * stage holds 2 chunks of weights and of both parts of X in shared memory,
 * copied by cp.async mm_ns - 1 stages ahead, each thread's share of the
 * copies worked out once before the K loop. */

#define MM_THREADS 128
#define MM_R 64
#define MM_KC 2
#ifndef MXC_MM_MINB
#define MXC_MM_MINB 3            /* resident blocks per SM the registers are sized for */
#endif
/* The wgmma tiles (k_mm<..., WG = true>): blocks of two warpgroups, 128
 * rows (each stage of X serves twice the rows of the warp-MMA tiles: the
 * copies of X, not the MMAs, bound those), four stages in flight, one
 * block an SM (the accumulators take 64 registers a thread). */
__host__ __device__ constexpr int mm_threads(bool wg) { return wg ? 256 : MM_THREADS; }
__host__ __device__ constexpr int mm_rows(bool wg) { return wg ? 128 : MM_R; }
#define MM_XP (MM_KC * 32 + 8)   /* halves per token row of a stage (16 bytes of padding: ldmatrix rows hit distinct banks) */

/* Where value v of a 32-value chunk goes in the prepared X. */
__device__ __forceinline__ int mm_pos(int v) { return (v & 3) * 8 + (v >> 3) * 2 + ((v >> 2) & 1); }

/* Rows of X split for the tensor cores: one block per row (plain: rows
 * [0, prep_rows); items: block (item, token)); the row's largest |x| by
 * the whole block, then each warp a chunk at a time, each lane one value
 * of it. */
__global__ void __launch_bounds__(128) k_mm_prep(mxc_tile a)
{
    pdl_enter();
    int64_t xrow, K;
    if (a.prep_rows > 0) {
        xrow = blockIdx.x;
        K = a.prep_k;
    } else {
        const mxc_item it = a.items[blockIdx.x];
        if ((int)blockIdx.y >= it.n)
            return;
        xrow = a.in_list[it.off + blockIdx.y];
        K = a.table[it.m0].cols;
    }
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const float *x = a.X + xrow * a.ldx;
    float amax = 0.0f;
    int bad = 0;
    for (int64_t k = threadIdx.x * 4; k < K; k += 512) {
        const float4 v = *(const float4 *)(x + k);
        amax = fmaxf(fmaxf(amax, fmaxf(fabsf(v.x), fabsf(v.y))), fmaxf(fabsf(v.z), fabsf(v.w)));
        bad |= !isfinite(v.x) | !isfinite(v.y) | !isfinite(v.z) | !isfinite(v.w);
    }
    bad = __syncthreads_or(bad);
    amax = block_maxf(amax);
    /* dx = 2^(e - 14) for amax = m 2^e, m in [0.5, 1): |x / dx| < 2^14 */
    int e = 0;
    frexpf(amax, &e);
    const float inv = amax > 0.0f ? ldexpf(1.0f, 14 - e) : 1.0f;
    if (threadIdx.x == 0)
        a.mm.dx[xrow] = bad ? NAN : amax > 0.0f ? ldexpf(1.0f, e - 14) : 1.0f;
    __half *hi = (__half *)a.mm.hi + xrow * a.mm.ld, *lo = (__half *)a.mm.lo + xrow * a.mm.ld;
    float *sum = a.mm.sum + xrow * (a.mm.ld >> 5), *sum2 = a.mm.sum2 + xrow * (a.mm.ld >> 6);
    const int pos = mm_pos(lane);
    /* chunk c's halves; its sum of x / dx */
    auto chunk = [&](int64_t c) {
        const float v = x[c * 32 + lane] * inv;
        const __half h = __float2half_rn(v);
        hi[c * 32 + pos] = h;
        lo[c * 32 + pos] = __float2half_rn(v - __half2float(h));
        return warp_sum(v);
    };
    /* a warp a pair of chunks at a time: the pair's sum too (what a group
     * of 64 folds in; s0 + s1 is the sum the tiles made from the chunk
     * sums, 0 + s0 + s1) */
#pragma unroll 2
    for (int64_t c2 = warp; c2 < (K >> 6); c2 += 4) {
        const float s0 = chunk(2 * c2), s1 = chunk(2 * c2 + 1);
        if (lane == 0) {
            sum[2 * c2] = s0;
            sum[2 * c2 + 1] = s1;
            sum2[c2] = s0 + s1;
        }
    }
    if (((K >> 5) & 1) && warp == ((K >> 6) & 3)) {   /* an odd chunk count's last */
        const float s = chunk((K >> 5) - 1);
        if (lane == 0)
            sum[(K >> 5) - 1] = s;
    }
}


__device__ __forceinline__ void ldsm_x4(const void *smem, uint32_t *r)
{
    const unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(s));
}

__device__ __forceinline__ void mma16816(float *d, const uint32_t *a, uint32_t b0, uint32_t b1)
{
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
                 "{%8, %9}, {%0, %1, %2, %3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* d = a b (no accumulator in: a group's first MMA, so the fold at the
 * group's end need not zero the accumulators). */
__device__ __forceinline__ void mma16816z(float *d, const uint32_t *a, uint32_t b0, uint32_t b1)
{
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%10, %10, %10, %10};"
        : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "f"(0.0f));
}


/* ---- wgmma (Hopper's warpgroup MMA, sm_90a only) -------------------------
 * k_mm<..., WG = true>: the block's four warps are one warpgroup, and each
 * k16 step of the 64-row stage is one asynchronous wgmma over all the
 * tile's tokens at once (m64nNk16, N = 16..64): A, the unpacked weights,
 * from registers in mma.sync's fragment layout (the same unpacking as the
 * warp MMAs), B, X's parts, from shared memory in the no-swizzle
 * "core matrix" layout (8 tokens x 8 values, 128 contiguous bytes; the
 * next 8 values 1024 bytes on, the next 8 tokens 128).  The instruction
 * stream per MMA shrinks from about 9 warp instructions to a fraction of
 * one, and the unpacking of the next chunk overlaps the tensor cores. */
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define MXC_WG_ARCH 1
#else
#define MXC_WG_ARCH 0
#endif

__device__ int d_wgmma_built;

/* what this build's device code has: 1 where the kernels were compiled
 * for sm_90a (the GPU runs that machine code), 0 where it runs the PTX */
__global__ void k_wgmma_probe(void) { d_wgmma_built = MXC_WG_ARCH; }

__device__ __forceinline__ void wg_fence(void)
{
#if MXC_WG_ARCH
    asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#endif
}

__device__ __forceinline__ void wg_commit(void)
{
#if MXC_WG_ARCH
    asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
#endif
}

__device__ __forceinline__ void wg_wait0(void)
{
#if MXC_WG_ARCH
    asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
#endif
}

/* shared memory written by the generic proxy (cp.async, st.shared) made
 * visible to wgmma's reads (the async proxy) */
__device__ __forceinline__ void fence_async_shared(void)
{
#if MXC_WG_ARCH
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
#endif
}

/* B's descriptor, K-major with the 128-byte swizzle: each token's 64
 * values of a stage part one 128-byte row (its 16-byte pieces stored at
 * piece ^ (token & 7)), 8 token rows an atom of 1024 bytes (the stride),
 * the atoms 1024-aligned; a k16 step starts 32 bytes into the row (the
 * leading offset is unused in this layout) */
__device__ __forceinline__ uint64_t wg_desc(unsigned saddr)
{
    return (uint64_t)((saddr & 0x3FFFF) >> 4) | ((uint64_t)1 << 16) | ((uint64_t)(1024 >> 4) << 32) | ((uint64_t)1 << 62);
}

/* wg_desc from its low word (that of wg_desc(a) is ((a & 0x3FFFF) >> 4) |
 * 1 << 16, and an offset of 16 k bytes adds k to it: the shared window
 * is under 256 KiB, so nothing carries out of the address field) */
__device__ __forceinline__ uint64_t wg_desc_lo(uint32_t lo)
{
    return ((uint64_t)((1024 >> 4) | (1u << 30)) << 32) | lo;
}

/* the compiler must not move reads of d above a wait, nor reuse a's
 * registers before it: tie them to this point */
__device__ __forceinline__ void wg_hold(float (&d)[8][4])
{
#pragma unroll
    for (int j = 0; j < 8; j++)
#pragma unroll
        for (int i = 0; i < 4; i++)
            asm volatile("" : "+f"(d[j][i])::"memory");
}

__device__ __forceinline__ void wg_hold(uint32_t (&a)[2][4])
{
#pragma unroll
    for (int j = 0; j < 2; j++)
#pragma unroll
        for (int i = 0; i < 4; i++)
            asm volatile("" : "+r"(a[j][i])::"memory");
}

/* d (+)= A B, m64nNk16, f32 += f16 x f16; acc 0: d = A B */
template <int N>
__device__ __forceinline__ void wg_mma(float (&d)[8][4], const uint32_t *a, uint64_t desc, int acc);

template <> __device__ __forceinline__ void wg_mma<16>(float (&d)[8][4], const uint32_t *a, uint64_t desc, int acc)
{
#if MXC_WG_ARCH
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %13, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n16k16.f32.f16.f16 {%0,%1,%2,%3,%4,%5,%6,%7}, {%8,%9,%10,%11}, %12, p, 1, 1, 0;\n}\n"
                 : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(acc));
#else
    __trap();
#endif
}

template <> __device__ __forceinline__ void wg_mma<32>(float (&d)[8][4], const uint32_t *a, uint64_t desc, int acc)
{
#if MXC_WG_ARCH
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %21, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n32k16.f32.f16.f16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15}, {%16,%17,%18,%19}, %20, p, 1, 1, 0;\n}\n"
                 : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(acc));
#else
    __trap();
#endif
}

template <> __device__ __forceinline__ void wg_mma<48>(float (&d)[8][4], const uint32_t *a, uint64_t desc, int acc)
{
#if MXC_WG_ARCH
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %29, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n48k16.f32.f16.f16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23}, {%24,%25,%26,%27}, %28, p, 1, 1, 0;\n}\n"
                 : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(acc));
#else
    __trap();
#endif
}

template <> __device__ __forceinline__ void wg_mma<64>(float (&d)[8][4], const uint32_t *a, uint64_t desc, int acc)
{
#if MXC_WG_ARCH
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, {%32,%33,%34,%35}, %36, p, 1, 1, 0;\n}\n"
                 : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(acc));
#else
    __trap();
#endif
}

/* f16 pair i of a chunk row's words (see above): values i and i + 4 of the
 * lane's 8. */
/* (x & MASK) | 0x64006400 in one instruction (the compiler makes two). */
template <uint32_t MASK>
__device__ __forceinline__ uint32_t mm_and_exp(uint32_t x)
{
    uint32_t v;
    asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(v) : "r"(x), "n"(MASK), "n"(0x64006400));
    return v;
}

template <int BITS, int I>
__device__ __forceinline__ uint32_t mm_pair(const uint32_t *w)
{
    const __half2 k1024 = __half2half2(__ushort_as_half((unsigned short)0x6400));
    uint32_t v;
    if constexpr (BITS == 4) {
        /* odd pairs keep the nibble where it is (16 q under the exponent)
         * and scale it back with an FMA: no shift for pairs 1 and 3 */
        const uint32_t x = I < 2 ? w[0] : w[0] >> 8;
        if constexpr (I & 1) {
            v = mm_and_exp<0x00F000F0u>(x);
            const __half2 h = __hfma2(*(const __half2 *)&v, __half2half2(__ushort_as_half((unsigned short)0x2C00)),
                                      __half2half2(__ushort_as_half((unsigned short)0xD400)));
            return *(const uint32_t *)&h;
        }
        v = mm_and_exp<0x000F000Fu>(x);
    } else {
        const uint32_t t = __byte_perm(w[0], w[1], I < 2 ? 0x5140 : 0x7362);
        v = __byte_perm(t, 0x64646464u, (I & 1) ? 0x4342 : 0x4140);
    }
    const __half2 h = __hsub2(*(const __half2 *)&v, k1024);
    return *(const uint32_t *)&h;
}

template <int DT>
__device__ __forceinline__ float ldf_t(const void *p, int64_t i)
{
    if constexpr (DT == MXC_F16)
        return __half2float(((const __half *)p)[i]);
    else if constexpr (DT == MXC_BF16)
        return __bfloat162float(((const __nv_bfloat16 *)p)[i]);
    else
        return ((const float *)p)[i];
}

/* A scale or bias as its raw bits (f16/bf16: 16 bits), so that a load can
 * be issued a group ahead of its use without a conversion in between. */
template <int DT>
__device__ __forceinline__ uint32_t ldraw_t(const void *p, int64_t i)
{
    if constexpr (DT == MXC_F32)
        return __ldg((const unsigned int *)p + i);
    else
        return __ldg((const unsigned short *)p + i);
}

template <int DT>
__device__ __forceinline__ float rawf_t(uint32_t v)
{
    if constexpr (DT == MXC_F16)
        return __half2float(__ushort_as_half((unsigned short)v));
    else if constexpr (DT == MXC_BF16)
        return __uint_as_float(v << 16);
    else
        return __uint_as_float(v);
}

/* Stages of the K loop in flight (cp.async): 3 for 4 bits; 8-bit stages
 * are larger and three would leave room for 2 blocks an SM instead of 3. */
__host__ __device__ constexpr int mm_ns(int bits) { return bits == 8 ? 2 : 3; }

/* Words per weight row of a stage (padded: the 8 rows of an A fragment
 * load hit distinct banks). */
__host__ __device__ constexpr int mm_wst(int bits) { return MM_KC * bits + (bits == 4 ? 4 : 8); }

/* Bytes of both parts of X in a stage: token rows padded for ldmatrix, or
 * wgmma's core matrices (unpadded). */
__host__ __device__ constexpr int mm_xb(bool wg)
{
    return wg ? 2 * MXC_MM_T * MM_KC * 32 * 2 : 2 * MXC_MM_T * MM_XP * 2;
}

/* Bytes of one stage: both parts of X, the chunk sums, the weights (wgmma:
 * a multiple of 1024, where its 128-byte swizzle repeats). */
__host__ __device__ constexpr int mm_stage(int bits, bool wg)
{
    return wg ? (mm_xb(wg) + MXC_MM_T * MM_KC * 4 + mm_rows(wg) * mm_wst(bits) * 4 + 1023) / 1024 * 1024
              : mm_xb(wg) + MXC_MM_T * MM_KC * 4 + MM_R * mm_wst(bits) * 4;
}

/* Stages in flight. */
#ifndef MXC_MM_NS_WG
#define MXC_MM_NS_WG 4
#endif
__host__ __device__ constexpr int mm_nstage(int bits, bool wg) { return wg ? MXC_MM_NS_WG : mm_ns(bits); }

__device__ __forceinline__ void cp_async16s(unsigned s, const void *gmem)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(s), "l"(gmem) : "memory");
}

/* n bytes of 16 read (0 or 16), the rest zeros: a row past the tile's
 * tokens costs no read and no branch. */
__device__ __forceinline__ void cp_async16z(unsigned s, const void *gmem, unsigned n)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(s), "l"(gmem), "r"(n) : "memory");
}

__device__ __forceinline__ void cp_async4z(unsigned s, const void *gmem, unsigned n)
{
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"(s), "l"(gmem), "r"(n) : "memory");
}

/* One chunk (two k16 steps) of a warp's MT x NT MMA tiles (16 rows x 8
 * tokens each), both parts of X.  Wp: the lane's first weight word of the
 * chunk, Xp: its ldmatrix row of the first token tile, Sp: the chunk sums
 * of its first token.  The MMAs go out in an order where consecutive ones
 * update different accumulators (a dependent pair back to back stalls the
 * warp for the MMA's latency); Z: the group's first chunk, whose first MMA
 * starts from zero. */
template <int BITS, int MT, int NT, bool Z>
__device__ __forceinline__ void mm_chunk(float (&acc)[8][4], float (&sx)[8][2], const uint32_t *Wp,
                                         const __half *Xp, const float *Sp)
{
    constexpr int WST = mm_wst(BITS);
    uint32_t w[MT][2][BITS == 4 ? 1 : 2];
#pragma unroll
    for (int m = 0; m < MT; m++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const uint32_t *p = Wp + (m * 16 + 8 * h) * WST;
            if constexpr (BITS == 4) {
                w[m][h][0] = p[0];
            } else {
                const uint2 v = *(const uint2 *)p;
                w[m][h][0] = v.x, w[m][h][1] = v.y;
            }
        }
    /* the group's running sums of x / dx of this lane's tokens (2 t4, 2 t4 + 1
     * of each token tile: adjacent in the stage) */
#pragma unroll
    for (int n = 0; n < NT; n++) {
        const float2 v = *(const float2 *)(Sp + n * 8);
        sx[n][0] += v.x, sx[n][1] += v.y;
    }
    uint32_t af[2][MT][4];
#pragma unroll
    for (int m = 0; m < MT; m++) {
        af[0][m][0] = mm_pair<BITS, 0>(w[m][0]);
        af[0][m][1] = mm_pair<BITS, 0>(w[m][1]);
        af[0][m][2] = mm_pair<BITS, 1>(w[m][0]);
        af[0][m][3] = mm_pair<BITS, 1>(w[m][1]);
        af[1][m][0] = mm_pair<BITS, 2>(w[m][0]);
        af[1][m][1] = mm_pair<BITS, 2>(w[m][1]);
        af[1][m][2] = mm_pair<BITS, 3>(w[m][0]);
        af[1][m][3] = mm_pair<BITS, 3>(w[m][1]);
    }
#pragma unroll
    for (int part = 0; part < 2; part++) {
        uint32_t b[NT][4];
#pragma unroll
        for (int n = 0; n < NT; n++)
            ldsm_x4(Xp + (part * MXC_MM_T + n * 8) * MM_XP, b[n]);
#pragma unroll
        for (int ks = 0; ks < 2; ks++)
#pragma unroll
            for (int n = 0; n < NT; n++)
#pragma unroll
                for (int m = 0; m < MT; m++) {
                    if (Z && part == 0 && ks == 0)
                        mma16816z(acc[m * 4 + n], af[0][m], b[n][0], b[n][1]);
                    else
                        mma16816(acc[m * 4 + n], af[ks][m], b[n][2 * ks], b[n][2 * ks + 1]);
                }
    }
}

/* The end of a group: tot += s_g * acc + b_g * sum_g(x / dx), as two FMAs. */
template <int MT, int NT>
__device__ __forceinline__ void mm_fold(float (&tot)[8][4], const float (&acc)[8][4], float (&sx)[8][2],
                                        const float (&sc)[2][2], const float (&bb)[2][2])
{
#pragma unroll
    for (int n = 0; n < NT; n++) {
#pragma unroll
        for (int m = 0; m < MT; m++)
#pragma unroll
            for (int i = 0; i < 4; i++)
                tot[m * 4 + n][i] = fmaf(bb[m][i >> 1], sx[n][i & 1], fmaf(sc[m][i >> 1], acc[m * 4 + n][i], tot[m * 4 + n][i]));
        sx[n][0] = sx[n][1] = 0.0f;
    }
}

/* One chunk (two k16 steps, both parts of X) of a warpgroup's 64 rows
 * and N tokens (k_mm<..., WG = true>): the lane's weights of rows g and
 * g + 8 of its warp's 16 unpacked into af as for mm_chunk, then four
 * wgmmas, committed as one group; the caller waits.  Wp: the lane's first
 * weight word of the chunk, dlo: wg_desc's low word of the chunk's X
 * (part 0) in shared memory,
 * Sp: the chunk sums of the lane's first token; Z: the group's first
 * chunk (its first wgmma starts from zero). */
template <int BITS, int N, bool SUMS = true>
__device__ __forceinline__ void mw_chunk(float (&acc)[8][4], float (&sx)[8][2], uint32_t (&af)[2][4],
                                         const uint32_t *Wp, uint32_t dlo, const float *Sp, bool Z)
{
    constexpr int WST = mm_wst(BITS);
    uint32_t w[2][BITS == 4 ? 1 : 2];
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const uint32_t *p = Wp + 8 * h * WST;
        if constexpr (BITS == 4) {
            w[h][0] = p[0];
        } else {
            const uint2 v = *(const uint2 *)p;
            w[h][0] = v.x, w[h][1] = v.y;
        }
    }
#pragma unroll
    for (int n = 0; n < (SUMS ? N / 8 : 0); n++) {
        const float2 v = *(const float2 *)(Sp + n * 8);
        sx[n][0] += v.x, sx[n][1] += v.y;
    }
    af[0][0] = mm_pair<BITS, 0>(w[0]);
    af[0][1] = mm_pair<BITS, 0>(w[1]);
    af[0][2] = mm_pair<BITS, 1>(w[0]);
    af[0][3] = mm_pair<BITS, 1>(w[1]);
    af[1][0] = mm_pair<BITS, 2>(w[0]);
    af[1][1] = mm_pair<BITS, 2>(w[1]);
    af[1][2] = mm_pair<BITS, 3>(w[0]);
    af[1][3] = mm_pair<BITS, 3>(w[1]);
    wg_fence();
#pragma unroll
    for (int part = 0; part < 2; part++)
#pragma unroll
        for (int ks = 0; ks < 2; ks++)
            wg_mma<N>(acc, af[ks], wg_desc_lo(dlo + (part * (MXC_MM_T * MM_KC * 32 * 2) + ks * 32) / 16),
                      !(Z && part == 0 && ks == 0));
    wg_commit();
}

/* Warp layouts (WG = false; WG = true: 8 warps, warp w rows 16 w .. + 16 of
 * the block's 128, every token, each warpgroup's 64 rows one wgmma a k16
 * step, mode = wgmma's N).  A tile of more than 32 tokens: warp (wr, wt) = (warp & 1,
 * warp >> 1) takes rows 32 wr .. + 32 of the block's 64 (dual: wr picks
 * gate or up) and tokens 32 wt .. + 32, MT = 2.  A tile of 32 tokens or
 * fewer (about half of a prompt's expert tiles): the warps split the rows
 * instead, warp w rows 16 w .. + 16, every token, MT = 1, so no warp is
 * left without tokens.  Accumulator tile m * 4 + n: rows m, tokens n.
 * NT: the warp's token tiles of 8 that hold tokens, rounded up to 2 or 4;
 * mode 10 MT + NT, 0: none. */
__device__ __forceinline__ int mm_mode(int mt, int ntv) { return ntv == 0 ? 0 : 10 * mt + ((ntv + 1) & ~1); }

template <int BITS, int DT, bool WG>
__global__ void __launch_bounds__(mm_threads(WG), WG ? 1 : MXC_MM_MINB) k_mm(mxc_tile a)
{
    constexpr int THR = mm_threads(WG), R = mm_rows(WG), HR = R / 2;   /* threads, rows a block, dual: gate rows */
    constexpr int WST = mm_wst(BITS);
    constexpr int PPR = MM_KC * BITS / 4;                    /* 16-byte pieces per weight row of a full stage */
    constexpr int WK = R * PPR / THR;                        /* of them per thread */
    constexpr int XB = mm_xb(WG);                            /* bytes of both parts of X in a stage */
    constexpr int STAGE = mm_stage(BITS, WG), NS = mm_nstage(BITS, WG);
    constexpr int NJ = MXC_MM_T * 8 / THR;                   /* X rows a thread copies (8 pieces a row) */
    static_assert(MM_KC == 2 && R * PPR % THR == 0 && NJ <= 4, "the staging assumes 8 pieces a token row");
    extern __shared__ float4 smem_f4[];
    __shared__ int64_t xrows[MXC_MM_T];
    __shared__ int64_t xoff[MXC_MM_T];   /* xrows * ld: the row's first half in mm.hi / mm.lo */
    __shared__ uint4 xtab[THR];          /* each thread's X sources (below) */
    pdl_enter();
    mxc_item it;
    float *Yo = a.Y;
    int64_t ldyo = a.ldy;
    int kmat = 0;   /* plain: the block's matrix of the pn */
    if (a.items) {
        it = a.items[blockIdx.y];
    } else {
        /* plain: token tile y % tiles of matrix y / tiles (pn matrices of one X) */
        const int tiles = (a.plain.n + MXC_MM_T - 1) / MXC_MM_T, k = (int)blockIdx.y / tiles;
        kmat = k;
        it = a.plain;
        it.off = ((int)blockIdx.y - k * tiles) * MXC_MM_T;
        it.n = min(MXC_MM_T, a.plain.n - it.off);
        if (k > 0) {
            it.m0 = it.m1 = a.pm[k];
            Yo = a.py[k];
            ldyo = a.pldy[k];
        }
    }
    const mxc_mat M0 = a.table[it.m0];
    const mxc_mat M1 = a.dual ? a.table[it.m1] : M0;
    const int RB = a.dual ? HR : R;
    const int64_t r0 = (int64_t)blockIdx.x * RB;
    if (r0 >= M0.rows || it.n <= 0)
        return;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
    if (tid < MXC_MM_T) {
        xrows[tid] = tid < it.n ? (a.in_list ? a.in_list[it.off + tid] : it.off + tid) : -1;
        xoff[tid] = xrows[tid] >= 0 ? xrows[tid] * a.mm.ld : -1;
    }
    const int mt = WG || it.n <= 32 ? 1 : 2;   /* WG: the 16-row layout, every token */
    const int wsr = mt == 1 ? warp * 16 : (warp & 1) * 32;   /* the warp's first row of the stage */
    const int tb = mt == 1 ? 0 : (warp >> 1) * 32;            /* its first token of the tile */
    /* the warp's matrix (dual: the stage's first HR rows gate, the rest up), by fields */
    const bool w1 = a.dual && wsr >= HR;
    const void *ws = w1 ? M1.s : M0.s, *wb = w1 ? M1.b : M0.b;
    const int64_t wrows = w1 ? M1.rows : M0.rows, wgs = w1 ? M1.gs : M0.gs;
    const int64_t wrow0 = a.dual ? r0 + (wsr & (HR - 1)) : r0 + wsr;   /* the warp's first row of its matrix */
    const int nch = (int)(M0.cols >> 5);
    const int64_t gpr = M0.cols / wgs;
    const int cpg = (int)(wgs >> 5);                     /* chunks per group (gate and up may differ) */
    const int64_t wpr = M0.cols * BITS / 32;             /* words per row */
    /* WG: the tile's tokens rounded up to 16, 32, 48 or 64 (wgmma's N) */
    const int mode = WG ? (it.n <= 16 ? 16 : it.n <= 32 ? 32 : it.n <= 48 ? 48 : 64)
                        : mm_mode(mt, min(4, max(0, (it.n - tb + 7) >> 3)));
    const int64_t lds = a.mm.ld >> 5;
    __syncthreads();
    /* split-K (a.splits > 1, plain single tiles): this block's chunks
     * [cbeg, cend), whole groups */
    const int ngr = nch / cpg, cps = (ngr + a.splits - 1) / a.splits * cpg;
    const int cbeg = (int)blockIdx.z * cps, cend = min(nch, cbeg + cps);

    /* This thread's share of every stage's copies, worked out once: WK
     * weight pieces, one 16-byte piece (pcx) of 4 token rows of both parts
     * of X, one chunk sum.  Sources at stage 0; stage s is s * MM_KC chunks
     * on.  Rows past the tile's tokens read nothing and fill zeros (their
     * results are never stored), so the copies need no branches. */
    const unsigned sraw = (unsigned)__cvta_generic_to_shared(smem_f4);
    const unsigned sbase = WG ? (sraw + 1023u) & ~1023u : sraw;   /* WG: the swizzle's atoms 1024-aligned */
    const unsigned char *sgen = (const unsigned char *)smem_f4 + (sbase - sraw);
    const unsigned char *wsrc[WK];
    int wpc[WK];
#pragma unroll
    for (int k = 0; k < WK; k++) {
        const int i = k * THR + tid, r = i / PPR, pc = i % PPR;
        const bool m1 = a.dual && r >= HR;
        const int64_t gr = min((a.dual ? r0 + (r & (HR - 1)) : r0 + r), (m1 ? M1.rows : M0.rows) - 1);
        wsrc[k] = (const unsigned char *)((const uint32_t *)(m1 ? M1.w : M0.w) + gr * wpr + (int64_t)cbeg * BITS + pc * 4);
        wpc[k] = pc;
    }
    /* the thread's 16-byte piece pcx (8 values) of token rows xr0 + THR / 8
     * j, j < NJ: 8 threads a token row's 8 pieces, one line read */
    const int pcx = tid & 7, xr0 = tid >> 3;
    /* the NJ rows' first halves in mm.hi and mm.lo (32 bits: a split X of
     * 2^32 halves would be 8 GiB), in shared memory (registers are short
     * here: held in registers they spilled, and the spill loads stalled
     * every stage); bit j of xmask: row j holds a token */
    uint32_t xmask = 0;
    {
        uint32_t o[4] = {0, 0, 0, 0};
#pragma unroll
        for (int j = 0; j < NJ; j++) {
            const int64_t xo = xoff[xr0 + THR / 8 * j];
            o[j] = (uint32_t)((xo >= 0 ? xo : xoff[0]) + (int64_t)cbeg * 32 + pcx * 8);
            xmask |= xo >= 0 ? 1u << j : 0u;
        }
        xtab[tid] = make_uint4(o[0], o[1], o[2], o[3]);
    }
    const __half *xhi = (const __half *)a.mm.hi, *xlo = (const __half *)a.mm.lo;
    const int64_t sr = tid < 2 * MXC_MM_T ? xrows[tid >> 1] : -1;
    const float *ssrc = a.mm.sum + (sr >= 0 ? sr : xrows[0]) * lds + cbeg + (tid & 1);
    const unsigned sn = sr >= 0 ? 4 : 0;
    /* WG with groups of 64 (two chunks: a stage is a group): the pair
     * sums instead, one a token (tid < MXC_MM_T), [token] in the stage */
    const bool pair = WG && M0.gs == 64 && M1.gs == 64;   /* block-wide (gate and up may differ) */
    const int64_t pr = tid < MXC_MM_T ? xrows[tid] : -1;
    const float *ssrc2 = a.mm.sum2 + (pr >= 0 ? pr : xrows[0]) * (a.mm.ld >> 6) + cbeg / 2;
    const unsigned sn2 = pr >= 0 ? 4 : 0;
    /* shared addresses in buffer 0: X row xr0 piece pcx (the next row of
     * the thread xjs on, the lo part xpo on), the chunk sum (token tid / 2,
     * chunk tid % 2), weight piece k */
    const unsigned xdst = WG ? sbase + xr0 * 128 + ((pcx ^ (xr0 & 7)) << 4) : sbase + (xr0 * MM_XP + pcx * 8) * 2;
    constexpr unsigned xjs = WG ? THR / 8 * 128 : THR / 8 * MM_XP * 2, xpo = XB / 2;
    const unsigned sdst = sbase + XB + ((tid & 1) * MXC_MM_T + (tid >> 1)) * 4;   /* sums: [chunk][token] */
    const unsigned wdst = sbase + XB + MXC_MM_T * MM_KC * 4;

    /* stage s of the K loop into buffer b (every call commits a group,
     * empty or not); FULL: a stage of MM_KC chunks (every stage but
     * perhaps the last), whose copies need no tests of the chunk count */
    auto load = [&](int s, int b, auto fullc, auto pairc) {
        constexpr bool FULL = decltype(fullc)::value, PAIR = decltype(pairc)::value;
        const unsigned bo = b * STAGE;
        const int kc = FULL ? MM_KC : min(MM_KC, cend - cbeg - s * MM_KC);
#pragma unroll
        for (int k = 0; k < WK; k++) {
            const int i = k * THR + tid;
            if (FULL || wpc[k] < kc * BITS / 4)
                cp_async16s(wdst + bo + ((i / PPR) * WST + wpc[k] * 4) * 4, wsrc[k] + s * (MM_KC * BITS * 4));
        }
        if (FULL || kc == MM_KC || pcx < 4) {
            const uint32_t so = (uint32_t)s * (MM_KC * 32);
            const uint4 xs = xtab[tid];
            const uint32_t xsrc[4] = {xs.x, xs.y, xs.z, xs.w};
#pragma unroll
            for (int j = 0; j < NJ; j++) {
                const uint32_t o = xsrc[j] + so, n = (xmask >> j & 1) * 16;
                cp_async16z(xdst + bo + j * xjs, xhi + o, n);
                cp_async16z(xdst + bo + j * xjs + xpo, xlo + o, n);
            }
        }
        if constexpr (PAIR) {
            if (tid < MXC_MM_T)
                cp_async4z(sbase + XB + tid * 4 + bo, ssrc2 + s, sn2);
        } else if ((FULL || (tid & 1) < kc) && tid < 2 * MXC_MM_T) {
            cp_async4z(sdst + bo, ssrc + s * MM_KC, sn);
        }
        asm volatile("cp.async.commit_group;" ::: "memory");
    };
    const int nfull = (cend - cbeg) / MM_KC;   /* stages of MM_KC chunks */
    auto load_stage = [&](int s, int b, auto pairc) {
        if (s < nfull)
            load(s, b, std::true_type(), pairc);
        else
            load(s, b, std::false_type(), pairc);
    };

    float acc[8][4], tot[8][4];
#pragma unroll
    for (int k = 0; k < 8; k++)
#pragma unroll
        for (int i = 0; i < 4; i++)
            acc[k][i] = tot[k][i] = 0.0f;

    const int ns = (cend - cbeg + MM_KC - 1) / MM_KC;
    int gc = 0, grp = cbeg / cpg;   /* chunks of the current group seen, its index */
    float sx[8][2];
#pragma unroll
    for (int n = 0; n < 8; n++)
        sx[n][0] = sx[n][1] = 0.0f;
    /* the scales and biases of the lane's rows for the current group,
     * loaded a group ahead (an L2 round trip per group otherwise stalls
     * every warp at every group's end) */
    uint32_t srow[2][2];   /* row * groups per row (fits: the scales of a matrix are fewer than 2^32) */
    uint32_t rs[2][2], rb[2][2];
#pragma unroll
    for (int m = 0; m < 2; m++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            srow[m][h] = (uint32_t)(min(wrow0 + m * 16 + g + 8 * h, wrows - 1) * gpr);
            rs[m][h] = ldraw_t<DT>(ws, srow[m][h] + grp);
            rb[m][h] = ldraw_t<DT>(wb, srow[m][h] + grp);
        }
    /* a group's end: fold it in (fold(sc, bb); WG: once its wgmmas are
     * done), the next group's scales and biases asked for */
    auto group_fold = [&](auto fold) {
        if constexpr (WG) {
            wg_wait0();
            wg_hold(acc);
        }
        float sc[2][2], bb[2][2];
        const uint32_t gn = grp + 1 < gpr ? grp + 1 : grp;
#pragma unroll
        for (int m = 0; m < 2; m++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                sc[m][h] = rawf_t<DT>(rs[m][h]);
                bb[m][h] = rawf_t<DT>(rb[m][h]);
                if (m < mt) {
                    rs[m][h] = ldraw_t<DT>(ws, srow[m][h] + gn);
                    rb[m][h] = ldraw_t<DT>(wb, srow[m][h] + gn);
                }
            }
        fold(sc, bb);
        gc = 0;
        grp++;
    };
    /* the end of a chunk */
    auto group_end = [&](auto fold) {
        if (++gc == cpg)
            group_fold(fold);
    };
    /* NS stages in flight: stage s + NS - 1 is loaded into the buffer
     * stage s - 1 used, once every warp is past the barrier at stage s */
    /* the top of stage s (in buffer buf): its copies landed and visible
     * to every warp, then stage s + NS - 1 asked for (into the buffer
     * stage s - 1 used) */
    auto stage_begin = [&](int s, int buf, auto pairc) {
        asm volatile("cp.async.wait_group %0;" ::"n"(NS - 2) : "memory");
        if constexpr (WG)
            fence_async_shared();   /* the copies, visible to wgmma's reads */
        __syncthreads();
        if (s + NS - 1 < ns)
            load_stage(s + NS - 1, buf == 0 ? NS - 1 : buf - 1, pairc);
        else
            asm volatile("cp.async.commit_group;" ::: "memory");
    };
    auto prologue = [&](auto pairc) {
#pragma unroll
        for (int p = 0; p < NS - 1; p++) {
            if (p < ns)
                load_stage(p, p, pairc);
            else
                asm volatile("cp.async.commit_group;" ::: "memory");
        }
    };
    if constexpr (WG) {
        /* the loop for one wgmma N (the tile's tokens rounded up), so that
         * nothing in it branches on the mode; the chunks' X descriptors
         * are one low word (dlo, at the stage's X) plus constants */
        const uint32_t d0 = ((sbase & 0x3FFFFu) >> 4) | (1u << 16);
        auto run = [&](auto nc, auto pairc) {
            constexpr int N = decltype(nc)::value;
            constexpr bool PAIR = decltype(pairc)::value;   /* a stage is a group: its sums from the pair sums */
            auto fold = [&](const float (&sc)[2][2], const float (&bb)[2][2]) { mm_fold<1, N / 8>(tot, acc, sx, sc, bb); };
            prologue(pairc);
            int buf = 0;
            for (int s = 0; s < ns; s++) {
                stage_begin(s, buf, pairc);
                const unsigned char *base = sgen + buf * STAGE;
                const float *Ss = (const float *)(base + XB);
                const uint32_t *Ws = (const uint32_t *)(base + XB + MXC_MM_T * MM_KC * 4);
                const int kc = min(MM_KC, cend - cbeg - s * MM_KC);
                const uint32_t dlo = d0 + (uint32_t)(buf * STAGE >> 4);
                /* the two chunks' fragments in separate registers, so that the
                 * second chunk's unpacking overlaps the first chunk's wgmmas;
                 * every wgmma reading this buffer is done before the next
                 * stage's barrier lets its copies overwrite it */
                uint32_t af[2][2][4];
#pragma unroll
                for (int cc = 0; cc < MM_KC; cc++) {
                    if (!PAIR && cc >= kc)
                        break;
                    const uint32_t *Wp = Ws + (wsr + g) * WST + cc * BITS + (BITS == 4 ? t4 : 2 * t4);
                    const float *Sp = Ss + cc * MXC_MM_T + 2 * t4;
                    mw_chunk<BITS, N, !PAIR>(acc, sx, af[cc], Wp, dlo + cc * 4 /* 64 bytes of each token row */, Sp,
                                             PAIR ? cc == 0 : gc == 0);
                    if constexpr (!PAIR)
                        group_end(fold);
                }
                if constexpr (PAIR) {
#pragma unroll
                    for (int n = 0; n < N / 8; n++) {
                        const float2 v = *(const float2 *)(Ss + n * 8 + 2 * t4);
                        sx[n][0] = v.x, sx[n][1] = v.y;
                    }
                    group_fold(fold);
                }
                wg_wait0();
                wg_hold(acc);
                wg_hold(af[0]);
                buf = buf + 1 == NS ? 0 : buf + 1;
            }
        };
        auto run_n = [&](auto pairc) {
            switch (mode) {
            case 16: run(std::integral_constant<int, 16>(), pairc); break;
            case 32: run(std::integral_constant<int, 32>(), pairc); break;
            case 48: run(std::integral_constant<int, 48>(), pairc); break;
            default: run(std::integral_constant<int, 64>(), pairc); break;
            }
        };
        if (pair)
            run_n(std::true_type());
        else
            run_n(std::false_type());
    } else {
        auto fold = [&](const float (&sc)[2][2], const float (&bb)[2][2]) {
            switch (mode) {
            case 12: mm_fold<1, 2>(tot, acc, sx, sc, bb); break;
            case 14: mm_fold<1, 4>(tot, acc, sx, sc, bb); break;
            case 22: mm_fold<2, 2>(tot, acc, sx, sc, bb); break;
            case 24: mm_fold<2, 4>(tot, acc, sx, sc, bb); break;
            }
        };
        prologue(std::false_type());
        int buf = 0;
        for (int s = 0; s < ns; s++) {
            stage_begin(s, buf, std::false_type());
            const unsigned char *base = sgen + buf * STAGE;
            const float *Ss = (const float *)(base + XB);
            const uint32_t *Ws = (const uint32_t *)(base + XB + MXC_MM_T * MM_KC * 4);
            const int kc = min(MM_KC, cend - cbeg - s * MM_KC);
            const __half *Xs = (const __half *)base;
            for (int cc = 0; cc < kc; cc++) {
                const uint32_t *Wp = Ws + (wsr + g) * WST + cc * BITS + (BITS == 4 ? t4 : 2 * t4);
                const __half *Xp = Xs + (tb + (lane & 7)) * MM_XP + cc * 32 + (lane >> 3) * 8;
                const float *Sp = Ss + cc * MXC_MM_T + tb + 2 * t4;
#define MM_CHUNK(c, MT, NT) \
    case c: \
        if (gc == 0) \
            mm_chunk<BITS, MT, NT, true>(acc, sx, Wp, Xp, Sp); \
        else \
            mm_chunk<BITS, MT, NT, false>(acc, sx, Wp, Xp, Sp); \
        break;
                switch (mode) {
                    MM_CHUNK(12, 1, 2) MM_CHUNK(14, 1, 4)
                    MM_CHUNK(22, 2, 2) MM_CHUNK(24, 2, 4)
                }
#undef MM_CHUNK
                group_end(fold);
            }
            buf = buf + 1 == NS ? 0 : buf + 1;
        }
    }
    asm volatile("cp.async.wait_all;" ::: "memory");
    /* y = dx * tot (+ bias); dual: gate rows (the stage's first HR) and up
     * rows meet in shared memory first, once every warp is done with the
     * stages.  The layout is a template argument here so that the
     * accumulators are indexed by constants (registers, not local memory). */
    float *G = (float *)smem_f4;   /* dual: [R rows][MXC_MM_T + 1] */
    /* split-K: partial sums [matrix][split][token][row], added in split order by k_mm_sum */
    float *P = a.mm.part + ((int64_t)kmat * a.splits + blockIdx.z) * a.plain.n * a.max_rows;
    auto out = [&](auto mtc) {
        constexpr int MT = decltype(mtc)::value;
#pragma unroll
        for (int m = 0; m < MT; m++)
#pragma unroll
            for (int n = 0; n < (WG ? 8 : 4); n++)
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    const int lt = tb + n * 8 + 2 * t4 + e;
                    const int64_t xr = xrows[lt];
                    const float dx = xr >= 0 ? a.mm.dx[xr] : 0.0f;
                    const int64_t o = xr >= 0 ? (a.out_list ? a.out_list[it.off + lt] : it.off + lt) : -1;
#pragma unroll
                    for (int h = 0; h < 2; h++) {
                        const float v = dx * tot[m * 4 + n][2 * h + e];
                        const int64_t r = wrow0 + m * 16 + g + 8 * h;
                        if (a.dual)
                            G[(wsr + m * 16 + g + 8 * h) * (MXC_MM_T + 1) + lt] = v;
                        else if (o >= 0 && r < M0.rows) {
                            if (a.splits > 1)
                                P[o * M0.rows + r] = v;
                            else
                                Yo[o * ldyo + r] = v + (M0.bias ? M0.bias[r] : 0.0f);
                        }
                    }
                }
    };
    if (a.dual)
        __syncthreads();
    if (mt == 1)
        out(std::integral_constant<int, 1>());
    else
        out(std::integral_constant<int, 2>());
    if (!a.dual)
        return;
    __syncthreads();
    for (int i = tid; i < HR * MXC_MM_T; i += THR) {
        const int r = i % HR, lt = i / HR;
        if (lt >= it.n || r0 + r >= M0.rows)
            continue;
        const int64_t o = a.out_list ? a.out_list[it.off + lt] : it.off + lt;
        a.Y[o * a.ldy + r0 + r] = glu(a.act, G[r * (MXC_MM_T + 1) + lt], G[(HR + r) * (MXC_MM_T + 1) + lt]);
    }
}

static size_t mm_smem(int bits, bool wg) { return (size_t)mm_nstage(bits, wg) * mm_stage(bits, wg) + (wg ? 1024 : 0); }

/* k_mm on wgmma (MLXCEL_CUDA_WGMMA, on by default) where the build has
 * sm_90a machine code and the GPU runs it: k_wgmma_probe, run once when
 * the switch is first set (at the backend's start, outside any graph
 * capture). */
static int g_wgmma = 0, g_wgmma_ok = -1;

extern "C" void mxc_set_wgmma(int on)
{
    if (on && g_wgmma_ok < 0) {
        int v = 0;
        k_wgmma_probe<<<1, 1>>>();
        if (cudaDeviceSynchronize() != cudaSuccess || cudaMemcpyFromSymbol(&v, d_wgmma_built, sizeof v) != cudaSuccess)
            v = 0;
        g_wgmma_ok = v;
    }
    g_wgmma = on && g_wgmma_ok == 1;
}

static bool use_wgmma(void) { return g_wgmma != 0; }

extern "C" int mxc_wgmma_active(void) { return g_wgmma != 0; }

static int sm_count(void);

/* Y[t][r] = sum over splits of the partials (in split order) + bias;
 * block row y: matrix y of the pn (k_mm's partials [matrix][split]
 * [token][row], each split plain.n x max_rows floats). */
__global__ void k_mm_sum(mxc_tile a)
{
    pdl_enter();
    const int k = (int)blockIdx.y;
    const mxc_mat M = a.table[k ? a.pm[k] : a.plain.m0];
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x, n = (int64_t)a.plain.n * M.rows;
    if (i >= n)
        return;
    const int64_t t = i / M.rows, r = i - t * M.rows, stride = (int64_t)a.plain.n * a.max_rows;
    const float *P = a.mm.part + (int64_t)k * a.splits * stride + i;
    float v = 0.0f;
    for (int z = 0; z < a.splits; z++)
        v += P[z * stride];
    (k ? a.py[k] : a.Y)[t * (k ? a.pldy[k] : a.ldy) + r] = v + (M.bias ? M.bias[r] : 0.0f);
}

template <int BITS, int DT, bool WG>
static int launch_mm(cudaStream_t st, const mxc_tile *t, unsigned ny)
{
    const size_t smem = mm_smem(BITS, WG);
    static int attr_set;
    if (!attr_set) {
        cudaFuncSetAttribute(k_mm<BITS, DT, WG>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
        attr_set = 1;
    }
    const int64_t rb = t->dual ? mm_rows(WG) / 2 : mm_rows(WG);
    const unsigned nx = (unsigned)((t->max_rows + rb - 1) / rb);
    /* a grid too small for the GPU (a router, a one-row gate): split K in
     * whole groups over up to 16 blocks per tile */
    mxc_tile u = *t;
    u.splits = 1;
    const int64_t pn = t->pn > 1 ? t->pn : 1;
    if (!t->items && !t->dual && (pn == 1 || t->pn_split) && t->mm.part && t->table_gs > 0) {
        const int64_t blocks = (int64_t)nx * ny, want = sm_count();
        if (blocks * 2 > want)   /* splitting o_proj's 256 blocks measured slower */
            goto run;
        const int64_t groups = t->prep_k / t->table_gs;
        int64_t sp = blocks < want ? (want + blocks - 1) / blocks : 1;
        sp = sp > 16 ? 16 : sp;
        sp = sp > groups ? groups : sp;
        while (sp > 1 && sp * pn * t->plain.n * t->max_rows > t->mm.part_cap)
            sp--;
        if (sp > 1) {
            /* whole groups per split */
            const int64_t gps = (groups + sp - 1) / sp;
            u.splits = (int)((groups + gps - 1) / gps);
        }
    }
run:;
    dim3 grid(nx, ny, (unsigned)u.splits);
    int rc = launch_k(k_mm<BITS, DT, WG>, grid, mm_threads(WG), smem, st, 1, u);
    if (rc || u.splits == 1)
        return rc;
    const int64_t n = (int64_t)t->plain.n * t->max_rows;
    return launch_k(k_mm_sum, dim3((unsigned)((n + 255) / 256), (unsigned)pn), 256, 0, st, 1, u);
}

static int mm_run(cudaStream_t st, const mxc_tile *t)
{
    const unsigned ny = (unsigned)(t->items ? t->n_items
                                            : (t->plain.n + MXC_MM_T - 1) / MXC_MM_T * (t->pn > 1 ? t->pn : 1));
    if (ny == 0)
        return 0;
    const dim3 np = t->prep_rows > 0 ? dim3((unsigned)t->prep_rows) : dim3((unsigned)t->n_items, MXC_MM_T);
    int rc = t->skip_prep ? 0 : launch_k(k_mm_prep, np, 128, 0, st, 1, *t);
    if (rc)
        return rc;
    const bool wg = use_wgmma();
#define MXC_MM(B, D) \
    if (t->mma == B && t->mma_dt == D) \
        return wg ? launch_mm<B, D, true>(st, t, ny) : launch_mm<B, D, false>(st, t, ny);
    MXC_MM(4, MXC_F16) MXC_MM(4, MXC_BF16) MXC_MM(4, MXC_F32)
    MXC_MM(8, MXC_F16) MXC_MM(8, MXC_BF16) MXC_MM(8, MXC_F32)
#undef MXC_MM
    return (int)cudaErrorInvalidValue;
}

int mxc_tile_run(cudaStream_t st, const mxc_tile *t)
{
    if (t->mma)
        return mm_run(st, t);
    const int ny = t->items ? t->n_items : (t->plain.n + MXC_TILE_T - 1) / MXC_TILE_T;
    if (ny <= 0)
        return 0;
    dim3 grid((unsigned)((t->max_rows + MXC_TILE_R - 1) / MXC_TILE_R), (unsigned)ny);
    return launch_k(k_tile, grid, 256, 0, st, 1, *t);
}

/* ---- embedding, norms, small elementwise steps ------------------------------- */

__global__ void k_embed(mxc_mat E, const int32_t *tokens, float scale, float *x, int *epoch)
{
    STAMP(7);
    pdl_enter();
    const int t = blockIdx.x;
    if (epoch && t == 0 && threadIdx.x == 0) {   /* a new step: every flag raised before is stale */
        const unsigned n = (unsigned)*epoch + 1u;
        *epoch = n ? (int)n : 1;   /* never 0, what a flag holds before its first step */
    }
    const int64_t r = tokens[t], d = E.cols;
    for (int64_t i = threadIdx.x; i < d; i += blockDim.x) {
        float v;
        if (E.bits == 0) {
            v = ldf(E.w, E.dt, r * d + i);
        } else {
            const uint32_t *row = (const uint32_t *)E.w + r * (d * E.bits / 32);
            const int64_t bit = i * E.bits;
            const int sh = (int)(bit & 31);
            uint32_t q = row[bit >> 5] >> sh;
            if (sh + E.bits > 32)
                q |= row[(bit >> 5) + 1] << (32 - sh);
            q &= (1u << E.bits) - 1u;
            const int64_t gi = r * (d / E.gs) + i / E.gs;
            v = ldf(E.s, E.dt, gi) * (float)q + ldf(E.b, E.dt, gi);
        }
        x[t * d + i] = scale != 1.0f ? v * scale : v;
    }
}

int mxc_embed(cudaStream_t st, const mxc_mat *E, const int32_t *tokens, int T, float scale, float *x, int *epoch)
{
    return launch_k(k_embed, T, 256, 0, st, 0, *E, tokens, scale, x, epoch);
}

/* One block per token.  Up to 8 values per thread stay in registers (every
 * load, the weights' too, issued before the first reduction), so a norm
 * costs one trip to memory; wider rows loop. */
#define NORM_V 8

/* Value i of token t's delta (mxc_delta): a plain row, or the weighted sum
 * of the token's K slot rows in slot order. */
__device__ __forceinline__ float delta_at(const mxc_delta &dl, int t, int64_t i, int64_t d)
{
    if (dl.K == 0)
        return dl.D[t * d + i];
    const float *W = dl.W + (int64_t)t * dl.K, *Y = dl.Y + (int64_t)t * dl.K * d + i;
    float s = 0.0f;
#pragma unroll 4
    for (int j = 0; j < dl.K; j++)
        s += W[j] * Y[j * d];
    return s;
}

__global__ void __launch_bounds__(512) k_addnorm(float *x, mxc_delta dl, int has, const float *w,
                                                 const float *b, int d, float eps, float *xn)
{
    pdl_enter();
    const int t = blockIdx.x, nt = blockDim.x;
    float *xr = x + (int64_t)t * d;
    const int dr = has;
    float *out = xn + (int64_t)t * d;
    if (d <= NORM_V * nt) {
        float v[NORM_V], wv[NORM_V], bv[NORM_V];
        double ss = 0.0, sum = 0.0;
#pragma unroll
        for (int k = 0; k < NORM_V; k++) {
            const int i = threadIdx.x + k * nt;
            v[k] = wv[k] = bv[k] = 0.0f;
            if (i < d) {
                v[k] = xr[i] + (dr ? delta_at(dl, t, i, d) : 0.0f);
                wv[k] = w[i];
                bv[k] = b ? b[i] : 0.0f;
            }
        }
#pragma unroll
        for (int k = 0; k < NORM_V; k++) {
            const int i = threadIdx.x + k * nt;
            if (i < d) {
                if (dr)
                    xr[i] = v[k];
                ss += (double)v[k] * v[k];
                sum += v[k];
            }
        }
        if (!b) {
            ss = block_sum(ss);
            const float r = 1.0f / sqrtf((float)(ss / (double)d) + eps);
#pragma unroll
            for (int k = 0; k < NORM_V; k++) {
                const int i = threadIdx.x + k * nt;
                if (i < d)
                    out[i] = wv[k] * (v[k] * r);
            }
            return;
        }
        const float mean = (float)(block_sum(sum) / (double)d);
        double var = 0.0;
#pragma unroll
        for (int k = 0; k < NORM_V; k++)
            if (threadIdx.x + k * nt < d)
                var += ((double)v[k] - mean) * ((double)v[k] - mean);
        const float r = 1.0f / sqrtf((float)(block_sum(var) / (double)d) + eps);
#pragma unroll
        for (int k = 0; k < NORM_V; k++) {
            const int i = threadIdx.x + k * nt;
            if (i < d)
                out[i] = wv[k] * ((v[k] - mean) * r) + bv[k];
        }
        return;
    }
    double ss = 0.0, sum = 0.0;
    for (int i = threadIdx.x; i < d; i += nt) {
        float v = xr[i];
        if (dr) {
            v += delta_at(dl, t, i, d);
            xr[i] = v;
        }
        ss += (double)v * v;
        sum += v;
    }
    if (!b) {
        ss = block_sum(ss);
        const float r = 1.0f / sqrtf((float)(ss / (double)d) + eps);
        for (int i = threadIdx.x; i < d; i += nt)
            out[i] = w[i] * (xr[i] * r);
        return;
    }
    sum = block_sum(sum);
    const float mean = (float)(sum / (double)d);
    double var = 0.0;
    for (int i = threadIdx.x; i < d; i += nt)
        var += ((double)xr[i] - mean) * ((double)xr[i] - mean);
    var = block_sum(var);
    const float r = 1.0f / sqrtf((float)(var / (double)d) + eps);
    for (int i = threadIdx.x; i < d; i += nt)
        out[i] = w[i] * ((xr[i] - mean) * r) + b[i];
}

int mxc_addnorm(cudaStream_t st, float *x, const mxc_delta *delta, const float *w, const float *b, int T,
                int d, float eps, float *xn)
{
    const mxc_delta none = {nullptr, nullptr, nullptr, 0};
    return launch_k(k_addnorm, T, d > 2048 ? 512 : d > 1024 ? 256 : 128, 0, st, 1, x, delta ? *delta : none,
                    delta ? 1 : 0, w, b, d, eps, xn);
}

__global__ void k_add(float *x, mxc_delta dl, int d, int64_t n)
{
    pdl_enter();
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        x[i] += delta_at(dl, (int)(i / d), i % d, d);
}

int mxc_add(cudaStream_t st, float *x, const mxc_delta *delta, int T, int d)
{
    const int64_t n = (int64_t)T * d;
    return launch_k(k_add, (unsigned)((n + 255) / 256), 256, 0, st, 1, x, *delta, d, n);
}

__global__ void k_softcap(float *x, int64_t n, float cap)
{
    pdl_enter();
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        x[i] = tanhf(x[i] / cap) * cap;
}

int mxc_softcap(cudaStream_t st, float *logits, int64_t n, float cap)
{
    return launch_k(k_softcap, (unsigned)((n + 255) / 256), 256, 0, st, 1, logits, n, cap);
}

/* ---- what some families add: block-output norms' inputs, layer scalars,
 * gated attention, the recurrent mixers ---------------------------------------- */

__global__ void k_delta_store(float *out, mxc_delta dl, int d, int64_t n)
{
    pdl_enter();
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        out[i] = delta_at(dl, (int)(i / d), i % d, d);
}

int mxc_delta_store(cudaStream_t st, float *out, const mxc_delta *delta, int T, int d)
{
    const int64_t n = (int64_t)T * d;
    return launch_k(k_delta_store, (unsigned)((n + 255) / 256), 256, 0, st, 1, out, *delta, d, n);
}

__global__ void k_scale(float *x, int64_t n, float s)
{
    pdl_enter();
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        x[i] *= s;
}

int mxc_scale(cudaStream_t st, float *x, int64_t n, float s)
{
    return launch_k(k_scale, (unsigned)((n + 255) / 256), 256, 0, st, 1, x, n, s);
}

__global__ void k_out_gate(float *att, const float *q, int64_t q_rows, int nh, int hd, int64_t n)
{
    pdl_enter();
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n)
        return;
    const int64_t qd = (int64_t)nh * hd, t = i / qd;
    const int h = (int)((i % qd) / hd), j = (int)(i % hd);
    const float g = q[t * q_rows + (int64_t)h * 2 * hd + hd + j];
    att[i] *= 1.0f / (1.0f + expf(-g));
}

int mxc_out_gate(cudaStream_t st, float *att, const float *q, int64_t q_rows, int T, int nh, int hd)
{
    const int64_t n = (int64_t)T * nh * hd;
    return launch_k(k_out_gate, (unsigned)((n + 255) / 256), 256, 0, st, 1, att, q, q_rows, nh, hd, n);
}

/* A thread per channel, the tokens in order (each output needs the
 * previous K - 1 inputs of its channel: the window, then the run's own),
 * the window in registers.  The sums in the CPU's order (bias, the window
 * oldest first, the new input). */
__global__ void k_conv(mxc_conv p)
{
    pdl_enter();
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= p.C)
        return;
    const int K = p.K;
    int64_t src;   /* the channel's input column */
    if (p.mode == MXC_CONV_LFM2) {
        src = c;
    } else {
        const int64_t kd = (int64_t)p.nk * p.dk, W = 2 * (int64_t)p.dk + 2 * (int64_t)p.r * p.dv;
        if (c < kd) {
            src = (c / p.dk) * W + c % p.dk;
        } else if (c < 2 * kd) {
            src = ((c - kd) / p.dk) * W + p.dk + (c - kd) % p.dk;
        } else {
            const int64_t vc = c - 2 * kd, h = vc / p.dv;
            src = (h / p.r) * W + 2 * p.dk + (h % p.r) * p.dv + vc % p.dv;
        }
    }
    float win[MXC_CONV_MAXK], w[MXC_CONV_MAXK];
#pragma unroll
    for (int j = 0; j < MXC_CONV_MAXK; j++) {
        win[j] = j < K - 1 ? p.win[(int64_t)c * (K - 1) + j] : 0.0f;
        w[j] = j < K - 1 ? p.w[(int64_t)c * K + j] : 0.0f;
    }
    const float bias = p.b ? p.b[c] : 0.0f, wl = p.w[(int64_t)c * K + K - 1];
    for (int t = 0; t < p.n; t++) {
        const float *row = p.in + (int64_t)t * p.ld_in;
        const float xi = p.mode == MXC_CONV_LFM2 ? row[c] * row[2 * (int64_t)p.C + c] : row[src];
        float acc = bias;
#pragma unroll
        for (int j = 0; j < MXC_CONV_MAXK - 1; j++)
            if (j < K - 1)
                acc += w[j] * win[j];
        acc += wl * xi;
#pragma unroll
        for (int j = 0; j < MXC_CONV_MAXK - 2; j++)
            if (j < K - 2)
                win[j] = win[j + 1];
        if (K > 1)
#pragma unroll
            for (int j = 0; j < MXC_CONV_MAXK - 1; j++)
                if (j == K - 2)
                    win[j] = xi;
        float y;
        if (p.mode == MXC_CONV_LFM2)
            y = acc * row[p.C + c];
        else
            y = acc / (1.0f + expf(-acc));
        p.out[(int64_t)t * p.ld_out + c] = y;
    }
#pragma unroll
    for (int j = 0; j < MXC_CONV_MAXK - 1; j++)
        if (j < K - 1)
            p.win[(int64_t)c * (K - 1) + j] = win[j];
}

int mxc_conv_causal(cudaStream_t st, const mxc_conv *p)
{
    if (p->K < 1 || p->K > MXC_CONV_MAXK)
        return (int)cudaErrorInvalidValue;
    return launch_k(k_conv, (unsigned)((p->C + 127) / 128), 128, 0, st, 1, *p);
}

/* A block per value head, the tokens in order; thread j keeps column j of
 * S (dk values, stored [a][j] so that a warp's loads are consecutive) and
 * the arithmetic is the CPU's mx_delta_recurrent's: S decayed and stored,
 * S^T k from the decayed S, then the update and S^T q in one pass. */
__global__ void k_delta_rule(mxc_dn p)
{
    pdl_enter();
    extern __shared__ float sm[];
    float *q = sm, *k = sm + p.dk;   /* [dk] each */
    const int h = blockIdx.x, r = p.nv / p.nk, hk = h / r, dk = p.dk, dv = p.dv;
    const int64_t kd = (int64_t)p.nk * dk, vd = (int64_t)p.nv * dv, W = 2 * (int64_t)dk + 2 * (int64_t)r * dv;
    float *S = p.S + (int64_t)h * dk * dv;
    const float A = expf(p.A_log[h]), qs = 1.0f / sqrtf((float)dk);
    for (int t = 0; t < p.n; t++) {
        const float *cv = p.conv + (int64_t)t * p.conv_dim;
        double sq = 0.0, sk = 0.0;
        for (int a = threadIdx.x; a < dk; a += blockDim.x) {
            const float qa = cv[(int64_t)hk * dk + a], ka = cv[kd + (int64_t)hk * dk + a];
            q[a] = qa;
            k[a] = ka;
            sq += (double)qa * qa;
            sk += (double)ka * ka;
        }
        sq = block_sum(sq);
        sk = block_sum(sk);
        const float rq = 1.0f / sqrtf((float)sq + 1e-6f), rk = 1.0f / sqrtf((float)sk + 1e-6f);
        __syncthreads();   /* every q[a], k[a] written before any is scaled by another thread */
        for (int a = threadIdx.x; a < dk; a += blockDim.x) {
            q[a] = (q[a] * rq) * qs;
            k[a] *= rk;
        }
        __syncthreads();
        const float *ba = p.ba + (int64_t)t * p.ba_rows + (int64_t)hk * 2 * r;
        const float beta = 1.0f / (1.0f + expf(-ba[h % r]));
        const float x = ba[r + h % r] + p.dt_bias[h];
        const float g = -A * (x > 20.0f ? x : log1pf(expf(x)));
        const float decay = expf(g);
        const float *v = cv + 2 * kd + (int64_t)h * dv;
        double so = 0.0;
        float o[4];   /* this thread's columns j = threadIdx.x + i * blockDim.x */
        for (int i = 0; i < 4; i++) {
            const int j = threadIdx.x + i * blockDim.x;
            o[i] = 0.0f;
            if (j >= dv)
                continue;
            float kv = 0.0f;
            for (int a = 0; a < dk; a++) {
                const float s = S[(int64_t)a * dv + j] * decay;
                S[(int64_t)a * dv + j] = s;
                kv += s * k[a];
            }
            const float delta = (v[j] - kv) * beta;
            float acc = 0.0f;
            for (int a = 0; a < dk; a++) {
                const float s = S[(int64_t)a * dv + j] + k[a] * delta;
                S[(int64_t)a * dv + j] = s;
                acc += s * q[a];
            }
            o[i] = acc;
            so += (double)acc * acc;
        }
        /* the gated RMSNorm: rmsnorm(o) * norm_w * silu(z) */
        so = block_sum(so);
        const float rr = 1.0f / sqrtf((float)(so / (double)dv) + p.eps);
        const float *z = p.qkvz + (int64_t)t * p.qkvz_rows + (int64_t)hk * W + 2 * (int64_t)dk +
                         (int64_t)r * dv + (int64_t)(h % r) * dv;
        float *out = p.out + (int64_t)t * vd + (int64_t)h * dv;
        for (int i = 0; i < 4; i++) {
            const int j = threadIdx.x + i * blockDim.x;
            if (j < dv)
                out[j] = p.norm_w[j] * (o[i] * rr) * (z[j] / (1.0f + expf(-z[j])));
        }
        __syncthreads();   /* q and k of this token read by every thread before the next's */
    }
}

int mxc_delta_rule(cudaStream_t st, const mxc_dn *p)
{
    int threads = ((p->dv > p->dk ? p->dv : p->dk) + 31) / 32 * 32;
    threads = threads < 128 ? 128 : threads;
    threads = threads > 256 ? 256 : threads;
    if (p->dv > 4 * threads || p->nv % p->nk)
        return (int)cudaErrorInvalidValue;
    return launch_k(k_delta_rule, (unsigned)p->nv, (unsigned)threads, sizeof(float) * 2 * (size_t)p->dk, st, 1,
                    *p);
}

/* ---- q/k/v heads: clip, norm, rope, into the cache ---------------------------- */

/* Head h of token t after the q, k, v projections: h < nh a q head (into
 * qdst when not NULL, else p.qr), else kv head h - nh (k and v into the
 * cache at the token's position).  hv: hd floats of shared memory; every
 * thread of the block calls it. */
/* One token's rotation (pos's cosines and sines times the scale, as
 * qkv_head computes them) into rot[0 .. rope_dims / 2): k_attend makes it
 * before it waits for q/k/v (pos and the frequencies are there before the
 * step), so the heads do not wait for the trigonometry.  Every thread
 * calls it; the caller's next barrier publishes it. */
__device__ __forceinline__ void rot_make(const mxc_qkv &p, int pos, float2 *rot)
{
    const int longf = p.inv_freq_long && pos + 1 > p.orig_max;
    const float *f = longf ? p.inv_freq_long : p.inv_freq;
    const float sc = longf ? p.mscale_long : p.mscale;
    for (int i = threadIdx.x; i < p.rope_dims / 2; i += blockDim.x) {
        const float ang = (float)pos * f[i];
        rot[i] = make_float2(cosf(ang) * sc, sinf(ang) * sc);
    }
}

/* rot: one token's (T = 1) rotation made by rot_make for position pos, or
 * NULL (then pos is read and the rotation computed here).  A kv head's
 * raw k and v rows from shared memory where kv_in is not NULL (k_attend
 * copied them there; not with full-width q/k norms, which read the whole
 * row), and its results also into kv_out[0 .. hd) (k) and
 * kv_out[kv_gap ..) (v) where kv_out is not NULL. */
__device__ __forceinline__ void qkv_head_body(const mxc_qkv &p, int t, int h, float *hv, float *qdst, int pos_in,
                                              const float2 *rot, const float *kv_in = nullptr,
                                              float *kv_out = nullptr, int kv_gap = 0)
{
    const int hd = p.hd;
    const int isq = h < p.nh, g = isq ? h : h - p.nh;
    const int64_t kvd = (int64_t)p.nkv * hd;
    const float *row = isq ? p.q + t * p.q_rows : p.k + t * kvd;
    const float *src = !isq && kv_in ? kv_in : row + (int64_t)g * (isq && p.q_gate ? 2 * hd : hd);
    const float c = p.clip;
    for (int i = threadIdx.x; i < hd; i += blockDim.x) {
        const float v = src[i];
        hv[i] = c > 0 ? fminf(fmaxf(v, -c), c) : v;
    }
    const float *nw = isq ? p.q_norm : p.k_norm;
    if (p.qk_norm == 1) {
        double ss = 0.0;
        for (int i = threadIdx.x; i < hd; i += blockDim.x)
            ss += (double)hv[i] * hv[i];
        ss = block_sum(ss);
        const float r = 1.0f / sqrtf((float)(ss / (double)hd) + p.eps);
        for (int i = threadIdx.x; i < hd; i += blockDim.x)
            hv[i] = nw[i] * (hv[i] * r);
    } else if (p.qk_norm == 2) {
        const int64_t width = isq ? (int64_t)p.nh * hd : kvd;
        double ss = 0.0;
        for (int64_t i = threadIdx.x; i < width; i += blockDim.x) {
            const float v = c > 0 ? fminf(fmaxf(row[i], -c), c) : row[i];
            ss += (double)v * v;
        }
        ss = block_sum(ss);
        const float r = 1.0f / sqrtf((float)(ss / (double)width) + p.eps);
        for (int i = threadIdx.x; i < hd; i += blockDim.x)
            hv[i] = nw[(int64_t)g * hd + i] * (hv[i] * r);
    }
    __syncthreads();
    const int pos = rot ? pos_in : p.pos[t], last = rot ? pos_in : p.pos[p.T - 1];
    const int longf = p.inv_freq_long && last + 1 > p.orig_max;
    const float *f = longf ? p.inv_freq_long : p.inv_freq;
    const float sc = longf ? p.mscale_long : p.mscale;
    const int half = p.rope_dims / 2;
    float *dst = isq ? (qdst ? qdst : p.qr + ((int64_t)t * p.nh + g) * hd)
                     : p.kc + ((int64_t)g * p.n_ctx + pos) * hd;
    for (int i = threadIdx.x; i < hd; i += blockDim.x) {
        float o = hv[i];
        if (i < half) {
            if (rot) {
                o = hv[i] * rot[i].x - hv[i + half] * rot[i].y;
            } else {
                const float ang = (float)pos * f[i];
                o = hv[i] * (cosf(ang) * sc) - hv[i + half] * (sinf(ang) * sc);
            }
        } else if (i < 2 * half) {
            if (rot) {
                o = hv[i] * rot[i - half].x + hv[i - half] * rot[i - half].y;
            } else {
                const float ang = (float)pos * f[i - half];
                o = hv[i] * (cosf(ang) * sc) + hv[i - half] * (sinf(ang) * sc);
            }
        }
        dst[i] = o;
        if (!isq && kv_out)
            kv_out[i] = o;
    }
    if (isq)
        return;
    /* v: clipped, optionally normed without a weight */
    const float *vs = kv_in ? kv_in + MXC_HD_MAX : p.v + t * kvd + (int64_t)g * hd;
    float *vd = p.vc + ((int64_t)g * p.n_ctx + pos) * hd;
    float r = 1.0f;
    if (p.v_norm) {
        double ss = 0.0;
        for (int i = threadIdx.x; i < hd; i += blockDim.x) {
            const float v = c > 0 ? fminf(fmaxf(vs[i], -c), c) : vs[i];
            ss += (double)v * v;
        }
        ss = block_sum(ss);
        r = 1.0f / sqrtf((float)(ss / (double)hd) + p.eps);
    }
    for (int i = threadIdx.x; i < hd; i += blockDim.x) {
        const float v = c > 0 ? fminf(fmaxf(vs[i], -c), c) : vs[i];
        vd[i] = p.v_norm ? v * r : v;
        if (kv_out)
            kv_out[kv_gap + i] = p.v_norm ? v * r : v;
    }
}

/* qkv_head_body as a call: the prompts' head kernel (k_qkv) */
__device__ __noinline__ void qkv_head(const mxc_qkv &p, int t, int h, float *hv, float *qdst, int pos_in = -1,
                                      const float2 *rot = nullptr)
{
    qkv_head_body(p, t, h, hv, qdst, pos_in, rot);
}

__global__ void k_qkv(mxc_qkv p)
{
    pdl_enter();
    extern __shared__ float hv[];   /* [hd] the head */
    qkv_head(p, blockIdx.x, blockIdx.y, hv, nullptr);
}

__device__ __forceinline__ double warp_sumd(double v)
{
#pragma unroll
    for (int o = 16; o; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* qkv_head for many tokens with a warp per (token, head) instead of a
 * block: value i of the head in lane i % 32, register i / 32, so a
 * rotation's partner (i +- rope_dims / 2, a multiple of 32) is in the same
 * lane.  The same arithmetic as qkv_head (the norms' sums in double); a
 * prompt has thousands of heads, and a block each spent most of its time
 * being scheduled. */
template <int NJ>
__global__ void __launch_bounds__(256) k_qkv_w(mxc_qkv p)
{
    pdl_enter();
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nhe = p.nh + p.nkv;
    const int64_t u = (int64_t)blockIdx.x * 8 + warp;
    if (u >= (int64_t)p.T * nhe)
        return;
    const int t = (int)(u / nhe), h = (int)(u - (int64_t)t * nhe), hd = p.hd;
    const int isq = h < p.nh, g = isq ? h : h - p.nh;
    const int64_t kvd = (int64_t)p.nkv * hd;
    const float *src = (isq ? p.q + t * p.q_rows : p.k + t * kvd) + (int64_t)g * (isq && p.q_gate ? 2 * hd : hd);
    const float c = p.clip;
    float hv[NJ];
#pragma unroll
    for (int j = 0; j < NJ; j++) {
        const float v = src[lane + 32 * j];
        hv[j] = c > 0 ? fminf(fmaxf(v, -c), c) : v;
    }
    if (p.qk_norm == 1) {
        const float *nw = isq ? p.q_norm : p.k_norm;
        double ss = 0.0;
#pragma unroll
        for (int j = 0; j < NJ; j++)
            ss += (double)hv[j] * hv[j];
        ss = warp_sumd(ss);
        const float r = 1.0f / sqrtf((float)(ss / (double)hd) + p.eps);
#pragma unroll
        for (int j = 0; j < NJ; j++)
            hv[j] = nw[lane + 32 * j] * (hv[j] * r);
    }
    const int pos = p.pos[t], last = p.pos[p.T - 1];
    const int longf = p.inv_freq_long && last + 1 > p.orig_max;
    const float *f = longf ? p.inv_freq_long : p.inv_freq;
    const float sc = longf ? p.mscale_long : p.mscale;
    const int half = p.rope_dims / 2, hj = half / 32;
    float *dst = isq ? p.qr + ((int64_t)t * p.nh + g) * hd : p.kc + ((int64_t)g * p.n_ctx + pos) * hd;
#pragma unroll
    for (int j = 0; j < NJ; j++) {
        const int i = lane + 32 * j;
        float o = hv[j];
        if (j < hj) {
            const float ang = (float)pos * f[i];
            float pr = 0.0f;
#pragma unroll
            for (int q = 0; q < NJ; q++)
                if (q == j + hj)
                    pr = hv[q];
            o = hv[j] * (cosf(ang) * sc) - pr * (sinf(ang) * sc);
        } else if (j < 2 * hj) {
            const float ang = (float)pos * f[i - half];
            float pr = 0.0f;
#pragma unroll
            for (int q = 0; q < NJ; q++)
                if (q == j - hj)
                    pr = hv[q];
            o = hv[j] * (cosf(ang) * sc) + pr * (sinf(ang) * sc);
        }
        dst[i] = o;
    }
    if (isq)
        return;
    const float *vs = p.v + t * kvd + (int64_t)g * hd;
    float *vd = p.vc + ((int64_t)g * p.n_ctx + pos) * hd;
    float vv[NJ];
    double ss = 0.0;
#pragma unroll
    for (int j = 0; j < NJ; j++) {
        const float v = vs[lane + 32 * j];
        vv[j] = c > 0 ? fminf(fmaxf(v, -c), c) : v;
        ss += (double)vv[j] * vv[j];
    }
    float r = 1.0f;
    if (p.v_norm) {
        ss = warp_sumd(ss);
        r = 1.0f / sqrtf((float)(ss / (double)hd) + p.eps);
    }
#pragma unroll
    for (int j = 0; j < NJ; j++)
        vd[lane + 32 * j] = p.v_norm ? vv[j] * r : vv[j];
}

int mxc_qkv_post(cudaStream_t st, const mxc_qkv *p)
{
    const int half = p->rope_dims / 2;
    if (p->T > 1 && p->hd % 32 == 0 && p->hd <= 256 && p->qk_norm != 2 && half % 32 == 0 && g_qkv_warp) {
        const unsigned nb = (unsigned)(((int64_t)p->T * (p->nh + p->nkv) + 7) / 8);
        switch (p->hd / 32) {
        case 1: return launch_k(k_qkv_w<1>, nb, 256, 0, st, 1, *p);
        case 2: return launch_k(k_qkv_w<2>, nb, 256, 0, st, 1, *p);
        case 3: return launch_k(k_qkv_w<3>, nb, 256, 0, st, 1, *p);
        case 4: return launch_k(k_qkv_w<4>, nb, 256, 0, st, 1, *p);
        case 5: return launch_k(k_qkv_w<5>, nb, 256, 0, st, 1, *p);
        case 6: return launch_k(k_qkv_w<6>, nb, 256, 0, st, 1, *p);
        case 7: return launch_k(k_qkv_w<7>, nb, 256, 0, st, 1, *p);
        default: return launch_k(k_qkv_w<8>, nb, 256, 0, st, 1, *p);
        }
    }
    dim3 grid((unsigned)p->T, (unsigned)(p->nh + p->nkv));
    return launch_k(k_qkv, grid, 128, sizeof(float) * (size_t)p->hd, st, 1, *p);
}

/* ---- attention: splits of the positions, then their combination ------------------- */

/* One (head, token, split): the scores of up to `span` positions (8
 * threads per position, each on a strided quarter of the float4s of the
 * head, so a warp reads 4 whole key rows at once), their softmax
 * numerators, then the weighted sum of the value rows (each thread one
 * float4 of the head over a share of the positions, loads unrolled).
 * The split's max, sum and unnormalised output go to part. */
/* The scores, softmax numerators and weighted values of positions [lo,
 * hi] for head h of token t, into part (k_attend). */
/* pre: rows lo .. lo + npre - 1 of K (then V, span rows later) already in
 * shared memory (k_attend copied them before its wait), or NULL. */
__device__ __forceinline__ void st_tagged(unsigned long long *p, float v, unsigned tag)
{
    const unsigned long long w = (unsigned long long)tag << 32 | __float_as_uint(v);
    asm volatile("st.relaxed.gpu.global.b64 [%0], %1;" ::"l"(p), "l"(w) : "memory");
}

__device__ __forceinline__ unsigned long long ld_tagged(const unsigned long long *p)
{
    unsigned long long v;
    asm volatile("ld.relaxed.gpu.global.b64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}

/* a[u] = the value of tagged word p[threadIdx.x + u nt] for those below
 * lim, once every one of them carries tag: all U loads asked for at
 * once, again until all are in (one round trip where they are). */
template <int U>
__device__ __forceinline__ void ld_tagged_wait(const unsigned long long *p, int nt, int lim, unsigned tag, float *a)
{
    unsigned long long w[U];
    bool ok;
    do {
#pragma unroll
        for (int u = 0; u < U; u++)
            if ((int)threadIdx.x + u * nt < lim)
                w[u] = ld_tagged(p + threadIdx.x + u * nt);
        ok = true;
#pragma unroll
        for (int u = 0; u < U; u++)
            if ((int)threadIdx.x + u * nt < lim)
                ok = ok && (unsigned)(w[u] >> 32) == tag;
    } while (!ok);
#pragma unroll
    for (int u = 0; u < U; u++)
        if ((int)threadIdx.x + u * nt < lim)
            a[u] = __uint_as_float((unsigned)w[u]);
}

/* ll: the partial as tagged words (mxc_att's gen: combine_tagged), not
 * floats at part. */
__device__ __forceinline__ void attend_split(const mxc_att &a, int h, int t, int lo, int hi, float *part,
                                             float4 *qs, float *sc, float *red, const float4 *pre = nullptr,
                                             int npre = 0, unsigned long long *ll = nullptr, unsigned tag = 0)
{
    const int hd = a.hd, tid = threadIdx.x, h4 = hd / 4;
    const int kvh = h / (a.nh / a.nkv), n = hi - lo + 1;
    if (!a.fuse) {   /* else the block made qs itself */
        const float4 *q4 = (const float4 *)(a.qr + ((int64_t)t * a.nh + h) * hd);
        for (int i = tid; i < h4; i += blockDim.x)
            qs[i] = q4[i];
    }
    __syncthreads();
    const float4 *K = (const float4 *)(a.kc + (int64_t)kvh * a.n_ctx * hd);
    const float4 *V = (const float4 *)(a.vc + (int64_t)kvh * a.n_ctx * hd);
    const int g = tid & 7, pp = tid >> 3;
    float mloc = -INFINITY;
#pragma unroll 2
    for (int j0 = 0; j0 < n; j0 += 32) {
        const int j = j0 + pp;
        float d = 0.0f;
        if (j < n) {
            const float4 *kj = j < npre ? pre + j * h4 : K + (int64_t)(lo + j) * h4;
#pragma unroll 4
            for (int i = g; i < h4; i += 8) {
                const float4 k4 = kj[i], qv = qs[i];
                d += qv.x * k4.x + qv.y * k4.y + qv.z * k4.z + qv.w * k4.w;
            }
        }
        d += __shfl_xor_sync(0xffffffffu, d, 4);
        d += __shfl_xor_sync(0xffffffffu, d, 2);
        d += __shfl_xor_sync(0xffffffffu, d, 1);
        if (j < n) {
            d *= a.scale;
            if (g == 0)
                sc[j] = d;
            mloc = fmaxf(mloc, d);
        }
    }
    const float m = block_maxf(mloc);
    float psum = 0.0f;
    for (int j = tid; j < n; j += blockDim.x) {
        const float e = expf(sc[j] - m);
        sc[j] = e;
        psum += e;
    }
    const float l = (float)block_sum((double)psum);   /* its barriers publish sc */
    const int parts = 256 / h4, d4 = tid % h4, prt = tid / h4;
    float4 o = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (prt < parts) {
#pragma unroll 8
        for (int j = prt; j < n; j += parts) {
            const float w = sc[j];
            const float4 v = j < npre ? pre[(MXC_ATT_SPAN_DECODE + j) * h4 + d4] : V[(int64_t)(lo + j) * h4 + d4];
            o.x += w * v.x, o.y += w * v.y, o.z += w * v.z, o.w += w * v.w;
        }
        float *r = red + prt * hd + 4 * d4;
        r[0] = o.x, r[1] = o.y, r[2] = o.z, r[3] = o.w;
    }
    __syncthreads();
    for (int i = tid; i < hd; i += blockDim.x) {
        float acc = 0.0f;
        for (int q = 0; q < parts; q++)
            acc += red[q * hd + i];
        if (ll)
            st_tagged(ll + i, acc, tag);
        else
            part[i] = acc;
    }
    if (tid == 0) {
        if (ll) {
            st_tagged(ll + hd, m, tag);
            st_tagged(ll + hd + 1, l, tag);
        } else {
            part[hd] = m, part[hd + 1] = l;
        }
    }
}

/* The combination of head h's splits s0 .. s1 (at most ATT_LL_MAX, each
 * another block's) from tagged partials: every value its own 64-bit word
 * with the launch's tag in its high half, stored relaxed, so a value seen
 * with the tag is the value (no fence before a counter, no counter, no
 * fence after it: the chain combine_last pays).  Thread i polls the
 * maxima, sums and value i of every split until all carry the tag, then
 * combines as combine_last does (the same bits). */
#define ATT_LL_MAX 8
__device__ __forceinline__ void combine_tagged(const mxc_att &a, int h, int t, int s0, int s1, unsigned tag)
{
    const int hd = a.hd, n = s1 - s0 + 1, st = hd + 2;
    const unsigned long long *base =
        (const unsigned long long *)a.part + (((int64_t)t * a.nh + h) * a.n_split + s0) * st;
    for (int i = threadIdx.x; i < hd; i += blockDim.x) {
        unsigned long long mv[ATT_LL_MAX], lv[ATT_LL_MAX], ov[ATT_LL_MAX];
        bool ok;
        do {
#pragma unroll
            for (int s = 0; s < ATT_LL_MAX; s++)
                if (s < n) {
                    mv[s] = ld_tagged(base + s * st + hd);
                    lv[s] = ld_tagged(base + s * st + hd + 1);
                    ov[s] = ld_tagged(base + s * st + i);
                }
            ok = true;
#pragma unroll
            for (int s = 0; s < ATT_LL_MAX; s++)
                if (s < n)
                    ok = ok && (unsigned)(mv[s] >> 32) == tag && (unsigned)(lv[s] >> 32) == tag &&
                         (unsigned)(ov[s] >> 32) == tag;
        } while (!ok);
        float M = -INFINITY;
#pragma unroll
        for (int s = 0; s < ATT_LL_MAX; s++)
            if (s < n)
                M = fmaxf(M, __uint_as_float((unsigned)mv[s]));
        float L = 0.0f, o = 0.0f;
#pragma unroll
        for (int s = 0; s < ATT_LL_MAX; s++) {
            if (s >= n)
                continue;
            const float m = __uint_as_float((unsigned)mv[s]);
            if (m == -INFINITY)
                continue;
            const float f = expf(m - M);
            L += __uint_as_float((unsigned)lv[s]) * f;
            o += __uint_as_float((unsigned)ov[s]) * f;
        }
        a.out[((int64_t)t * a.nh + h) * hd + i] = o / L;
    }
}

/* With a.cnt (one token): the last split block of head h to finish
 * combines the head's partials (what k_att_combine does), so decode needs
 * no second launch. */
__device__ __forceinline__ bool combine_last(const mxc_att &a, int h, int t, int s0, int s1, int nblk)
{
    __shared__ int last;
    const int hd = a.hd;
    const float *base = a.part + ((int64_t)t * a.nh + h) * a.n_split * (hd + 2);
    if (s0 == s1) {
        /* one split holds every position: its partial is the answer (the
         * combination below with one split gives these bits: o * 1 / (l * 1)),
         * no counter, no other block to wait for */
        __syncthreads();   /* the block's own stores of the partial */
        const float *ps = base + s0 * (hd + 2);
        const float l = ps[hd + 1];
        for (int i = threadIdx.x; i < hd; i += blockDim.x)
            a.out[((int64_t)t * a.nh + h) * hd + i] = ps[i] / l;
        return true;
    }
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0)
        last = atomicAdd(a.cnt + h, 1) == nblk - 1;
    __syncthreads();
    if (!last)
        return false;
    STAMP_AT(7);
    __threadfence();
    constexpr int NS = 8;
    if (a.comb1 && s1 - s0 < NS) {
        /* up to NS splits: every partial's max, sum and value asked for
         * at once (one round trip, not one for the maxima and another for
         * the rest); the same arithmetic in the same order as below */
        const float *ps = base + s0 * (hd + 2);
        const int n = s1 - s0 + 1;
        float mv[NS];
#pragma unroll
        for (int s = 0; s < NS; s++)
            mv[s] = s < n ? __ldcg(ps + s * (hd + 2) + hd) : -INFINITY;
        for (int i = threadIdx.x; i < hd; i += blockDim.x) {
            float lv[NS], ov[NS];
#pragma unroll
            for (int s = 0; s < NS; s++) {
                lv[s] = s < n ? __ldcg(ps + s * (hd + 2) + hd + 1) : 0.0f;
                ov[s] = s < n ? __ldcg(ps + s * (hd + 2) + i) : 0.0f;
            }
            float M = -INFINITY;
#pragma unroll
            for (int s = 0; s < NS; s++)
                M = s < n ? fmaxf(M, mv[s]) : M;
            float L = 0.0f, o = 0.0f;
#pragma unroll
            for (int s = 0; s < NS; s++) {
                if (s >= n || mv[s] == -INFINITY)
                    continue;
                const float f = expf(mv[s] - M);
                L += lv[s] * f;
                o += ov[s] * f;
            }
            a.out[((int64_t)t * a.nh + h) * hd + i] = o / L;
        }
        if (threadIdx.x == 0)
            a.cnt[h] = 0;
        return true;
    }
    float M = -INFINITY;
    for (int s = s0; s <= s1; s++)
        M = fmaxf(M, __ldcg(base + s * (hd + 2) + hd));
    for (int i = threadIdx.x; i < hd; i += blockDim.x) {
        float L = 0.0f, o = 0.0f;
        for (int s = s0; s <= s1; s++) {
            const float *ps = base + s * (hd + 2);
            const float m = __ldcg(ps + hd);
            if (m == -INFINITY)
                continue;
            const float f = expf(m - M);
            L += __ldcg(ps + hd + 1) * f;
            o += __ldcg(ps + i) * f;
        }
        a.out[((int64_t)t * a.nh + h) * hd + i] = o / L;
    }
    if (threadIdx.x == 0)
        a.cnt[h] = 0;
    return true;
}

template <bool FUSE>
__global__ void __launch_bounds__(256) k_attend(mxc_att a)
{
    STAMP(3);
    __shared__ float4 qs[MXC_HD_MAX / 4];
    __shared__ float sc[256];
    __shared__ float red[1024];
    extern __shared__ float4 kv_pre[];   /* a.pre: [2][MXC_ATT_SPAN_DECODE][hd / 4], K rows then V rows
                                            (the first of a split, which may be longer) */
    const int h = blockIdx.x, t = blockIdx.y, sp = blockIdx.z, hd = a.hd, tid = threadIdx.x;
    const int span = a.span;
    if (!a.cnt)
        pdl_enter();
    /* one token: the position is there before the step (its first copy, or
     * the previous step's argmax), so read before the wait */
    const int pos = a.cnt ? __ldcg(a.pos + t) : a.pos[t];
    const int start = a.window && pos - a.window + 1 > 0 ? pos - a.window + 1 : 0;
    if (a.cnt) {
        /* one token (the only rows FUSE comes with), fewer blocks than splits:
         * a captured step holds splits for its whole context (graphs
         * replay at any position), and blocks for all of them cost more
         * than their work at a short one (8192 blocks a layer at a context
         * of 32k).  Block z takes the splits z, z + Z, ... of those that
         * hold positions, [s0, s1]; a block with none leaves at once, and
         * the last of the others to finish combines.  With FUSE the block
         * makes its q head itself, and at pos's split also its kv head's k
         * and v (into the cache: blocks of the other q heads of the group
         * write the same values), so the heads need no launch of their own. */
        const int s0 = start / span, s1 = pos / span, Z = (int)gridDim.z;
        const int first = s0 + ((sp - s0) % Z + Z) % Z;
        if (first > s1) {
            pdl_wait();
            return;
        }
        /* each split its own block, at most ATT_LL_MAX: tagged partials,
         * pos's block (the last split, the last to start its scores: it
         * makes the kv head) combines them; the tag is the head's count
         * of launches (a.gen, there before the step: the block that
         * finished the last launch's head raised it), plus one, so that
         * partials of an earlier launch, and the zeroed buffer, never
         * carry it */
        const unsigned gen = a.gen ? __ldcg(a.gen + h) : 0u;
        const bool ll = a.gen && s1 > s0 && s1 - s0 + 1 <= Z && s1 - s0 + 1 <= ATT_LL_MAX;
        /* Before the wait, what earlier steps wrote: the first split's K
         * and V rows before pos (a.pre: into shared memory, through L2)
         * and the rotation of pos.  Row pos is this step's (after the
         * wait, from the cache: the block holding it writes it). */
        const int lo0 = max(first * span, start);
        const int npre = a.pre ? min(MXC_ATT_SPAN_DECODE, max(0, min(pos - 1, first * span + span - 1) - lo0 + 1)) : 0;
        if (npre) {
            const int h4 = hd / 4, kvh = h / (a.nh / a.nkv), n4 = npre * h4;
            const float4 *K = (const float4 *)(a.kc + ((int64_t)kvh * a.n_ctx + lo0) * hd);
            const float4 *V = (const float4 *)(a.vc + ((int64_t)kvh * a.n_ctx + lo0) * hd);
            const unsigned sk = (unsigned)__cvta_generic_to_shared(kv_pre);
            for (int i = tid; i < n4; i += blockDim.x) {
                cp_async16s(sk + 16u * (unsigned)i, K + i);
                cp_async16s(sk + 16u * (unsigned)(MXC_ATT_SPAN_DECODE * h4 + i), V + i);
            }
            asm volatile("cp.async.commit_group;" ::: "memory");
        }
        __shared__ float2 rot[MXC_HD_MAX / 2];
        if constexpr (FUSE)
            rot_make(a.qkv, pos, rot);
        pdl_wait();
        /* The block holding pos (its last split) makes its kv head's k and
         * v: their raw rows asked for now, beside the q head's below, not
         * one round trip after another; and with pos in its first split
         * right after the copied rows, the made row goes into the copy
         * too, so the split reads no row of this step from memory */
        /* (a block of one split only: red is free until that split's
         * weighted values, attend_split) */
        float *kvraw = red;
        const bool kvb = FUSE && a.kv && first == s1 && a.qkv.qk_norm != 2;
        const int kvh = h / (a.nh / a.nkv);
        const bool kvpre = kvb && npre && first == s1 && pos - lo0 == npre && npre < MXC_ATT_SPAN_DECODE;
        if (kvb) {
            const int h4 = hd / 4;
            const int64_t off = (int64_t)t * a.nkv * hd + (int64_t)kvh * hd;
            const unsigned sr = (unsigned)__cvta_generic_to_shared(kvraw);
            for (int i = tid; i < h4; i += blockDim.x) {
                cp_async16s(sr + 16u * (unsigned)i, a.qkv.k + off + 4 * i);
                cp_async16s(sr + 16u * (unsigned)(MXC_HD_MAX / 4 + i), a.qkv.v + off + 4 * i);
            }
            asm volatile("cp.async.commit_group;" ::: "memory");
        }
        if (npre && kvb)   /* the copied rows; the k and v rows still in flight */
            asm volatile("cp.async.wait_group %0;" ::"n"(1) : "memory");
        else if (npre)
            asm volatile("cp.async.wait_group 0;" ::: "memory");
        __syncthreads();   /* the rows and the rotation, to every thread */
        __shared__ float hv[MXC_HD_MAX];
        /* the heads inline, not qkv_head: a call's frame lives in local
         * memory, which these kernels reach only through L2 (microseconds
         * under the step's load: docs/cuda.md, session 17) */
        if constexpr (FUSE)
            qkv_head_body(a.qkv, t, h, hv, (float *)qs, pos, rot);
        if (kvb)
            asm volatile("cp.async.wait_group 0;" ::: "memory");
        STAMP_AT(5);
        if (a.early)
            pdl_trigger();
        for (int sj = first; sj <= s1; sj += Z) {
            if constexpr (FUSE) {
                if (pos >= sj * span && pos < sj * span + span) {
                    __syncthreads();   /* (and kvraw, to every thread) */
                    const int h4 = hd / 4;
                    qkv_head_body(a.qkv, t, a.nh + kvh, hv, nullptr, pos, rot, kvb ? kvraw : nullptr,
                                  kvpre ? (float *)(kv_pre + npre * h4) : nullptr, MXC_ATT_SPAN_DECODE * hd);
                }
            }
            const int64_t pi = (((int64_t)t * a.nh + h) * a.n_split + sj) * (hd + 2);
            attend_split(a, h, t, max(sj * span, start), min(pos, sj * span + span - 1), a.part + pi, qs, sc, red,
                         sj == first ? kv_pre : nullptr, sj == first ? npre + (kvpre ? 1 : 0) : 0,
                         ll ? (unsigned long long *)a.part + pi : nullptr, gen + 1);
            __syncthreads();   /* sc and red are the next split's */
        }
        STAMP_AT(6);
        pdl_trigger();
        bool fin;
        if (ll) {
            fin = first == s1;
            if (fin)
                combine_tagged(a, h, t, s0, s1, gen + 1);
        } else {
            fin = combine_last(a, h, t, s0, s1, min(Z, s1 - s0 + 1));
        }
        /* every other block of the head has read gen: it is the next
         * launch's (kernel boundaries order this store before its loads) */
        if (fin && a.gen && threadIdx.x == 0)
            a.gen[h] = gen + 1;
        return;
    }
    const int lo = max(sp * span, start), hi = min(pos, sp * span + span - 1);
    float *part = a.part + (((int64_t)t * a.nh + h) * a.n_split + sp) * (hd + 2);
    if (lo > hi) {
        for (int i = tid; i < hd; i += blockDim.x)
            part[i] = 0.0f;
        if (tid == 0)
            part[hd] = -INFINITY, part[hd + 1] = 0.0f;
    } else {   /* rows whose heads mxc_qkv_post made (a.fuse comes with a.cnt only) */
        attend_split(a, h, t, lo, hi, part, qs, sc, red);
    }
    pdl_trigger();
}

__global__ void k_att_combine(mxc_att a)
{
    pdl_enter();
    const int h = blockIdx.x, t = blockIdx.y, hd = a.hd;
    const float *base = a.part + ((int64_t)t * a.nh + h) * a.n_split * (hd + 2);
    float M = -INFINITY;
    for (int s = 0; s < a.n_split; s++)
        M = fmaxf(M, base[s * (hd + 2) + hd]);
    for (int i = threadIdx.x; i < hd; i += blockDim.x) {
        float L = 0.0f, o = 0.0f;
        for (int s = 0; s < a.n_split; s++) {
            const float *ps = base + s * (hd + 2);
            if (ps[hd] == -INFINITY)
                continue;
            const float f = expf(ps[hd] - M);
            L += ps[hd + 1] * f;
            o += ps[i] * f;
        }
        a.out[((int64_t)t * a.nh + h) * hd + i] = o / L;
    }
}

/* ---- prompt attention in tiles ------------------------------------------------------
 *
 * A block takes ATT_QT consecutive tokens of one head and walks the
 * positions their queries reach in tiles of ATT_KT keys (flash-attention
 * style, online softmax in fp32): each key and value row is read once per
 * query tile instead of once per query.  Thread (p, j) (p = tid / 16, j =
 * tid % 16) scores queries ATT_QPT p .. + ATT_QPT against keys j, j + 16,
 * j + 32, j + 48 of the tile and owns dims 4 (j + 16 i) .. of those
 * queries' outputs; the 16 threads of a query group are adjacent lanes, so
 * their running maxima and sums are shuffled among them.  Each key float4
 * read from shared memory serves ATT_QPT queries and each value float4
 * ATT_QPT outputs: 4 queries a thread and 128 threads measured 2 152 us
 * a 512-token pass of the qwen1.5 synth against 2 271 with 2 and 256
 * (docs/cuda.md). */
#define ATT_QT 32
#define ATT_KT 64
#define ATT_QPT 4
#define ATT_THREADS (ATT_QT / ATT_QPT * 16)

__global__ void __launch_bounds__(ATT_THREADS) k_attend_tile(mxc_att a)
{
    pdl_enter();
    extern __shared__ float4 smem_f4[];
    const int hd = a.hd, h4 = hd / 4, hp = h4 + 1;   /* float4s per row, padded */
    float4 *Qs = smem_f4, *Ks = Qs + ATT_QT * hp, *Vs = Ks + ATT_KT * hp;
    float *Ps = (float *)(Vs + ATT_KT * hp);         /* [ATT_QT][ATT_KT + 1] */
    const int h = blockIdx.x, t0 = blockIdx.y * ATT_QT, tid = threadIdx.x;
    const int pq = tid >> 4, j = tid & 15;
    const int kvh = h / (a.nh / a.nkv);
    bool valid[ATT_QPT];
    int pos[ATT_QPT], start[ATT_QPT];
#pragma unroll
    for (int u = 0; u < ATT_QPT; u++) {
        const int t = t0 + ATT_QPT * pq + u;
        valid[u] = t < a.T;
        pos[u] = valid[u] ? a.pos[t] : -1;
        start[u] = valid[u] && a.window && pos[u] - a.window + 1 > 0 ? pos[u] - a.window + 1 : 0;
    }
    /* the positions any query of the tile reaches */
    __shared__ int range[2];
    if (tid == 0) {
        int lo = INT_MAX, hi = -1;
        for (int i = 0; i < ATT_QT && t0 + i < a.T; i++) {
            const int p = a.pos[t0 + i];
            const int s0 = a.window && p - a.window + 1 > 0 ? p - a.window + 1 : 0;
            lo = min(lo, s0);
            hi = max(hi, p);
        }
        range[0] = lo, range[1] = hi;
    }
    for (int i = tid; i < ATT_QT * h4; i += ATT_THREADS) {
        const int qq = i / h4, d = i - qq * h4;
        Qs[qq * hp + d] = t0 + qq < a.T ? ((const float4 *)(a.qr + ((int64_t)(t0 + qq) * a.nh + h) * hd))[d]
                                        : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
    __syncthreads();
    const int lo = range[0], hi = range[1];
    const float4 *K = (const float4 *)(a.kc + (int64_t)kvh * a.n_ctx * hd);
    const float4 *V = (const float4 *)(a.vc + (int64_t)kvh * a.n_ctx * hd);
    float4 o[ATT_QPT][4];
#pragma unroll
    for (int u = 0; u < ATT_QPT; u++)
#pragma unroll
        for (int i = 0; i < 4; i++)
            o[u][i] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    float m[ATT_QPT], l[ATT_QPT];
#pragma unroll
    for (int u = 0; u < ATT_QPT; u++)
        m[u] = -INFINITY, l[u] = 0.0f;
    for (int k0 = lo - lo % ATT_KT; k0 <= hi; k0 += ATT_KT) {
        for (int i = tid; i < ATT_KT * h4; i += ATT_THREADS) {
            const int kk = i / h4, d = i - kk * h4;
            const int p = min(k0 + kk, hi);
            Ks[kk * hp + d] = K[(int64_t)p * h4 + d];
            Vs[kk * hp + d] = V[(int64_t)p * h4 + d];
        }
        __syncthreads();
        float s[ATT_QPT][4];
#pragma unroll
        for (int u = 0; u < ATT_QPT; u++)
#pragma unroll
            for (int c = 0; c < 4; c++)
                s[u][c] = 0.0f;
        const float4 *q0 = Qs + (ATT_QPT * pq) * hp;
        for (int i = 0; i < h4; i++) {
            float4 qv[ATT_QPT];
#pragma unroll
            for (int u = 0; u < ATT_QPT; u++)
                qv[u] = q0[u * hp + i];
#pragma unroll
            for (int c = 0; c < 4; c++) {
                const float4 kv = Ks[(j + 16 * c) * hp + i];
#pragma unroll
                for (int u = 0; u < ATT_QPT; u++)
                    s[u][c] += qv[u].x * kv.x + qv[u].y * kv.y + qv[u].z * kv.z + qv[u].w * kv.w;
            }
        }
        float corr[ATT_QPT];
#pragma unroll
        for (int u = 0; u < ATT_QPT; u++) {
            float tmax = -INFINITY;
#pragma unroll
            for (int c = 0; c < 4; c++) {
                const int p = k0 + j + 16 * c;
                s[u][c] = valid[u] && p >= start[u] && p <= pos[u] ? s[u][c] * a.scale : -INFINITY;
                tmax = fmaxf(tmax, s[u][c]);
            }
#pragma unroll
            for (int x = 1; x < 16; x <<= 1)
                tmax = fmaxf(tmax, __shfl_xor_sync(0xffffffffu, tmax, x));
            const float mn = fmaxf(m[u], tmax);
            corr[u] = mn == -INFINITY ? 1.0f : expf(m[u] - mn);
            float ps = 0.0f;
#pragma unroll
            for (int c = 0; c < 4; c++) {
                const float e = s[u][c] == -INFINITY ? 0.0f : expf(s[u][c] - mn);
                Ps[(ATT_QPT * pq + u) * (ATT_KT + 1) + j + 16 * c] = e;
                ps += e;
            }
#pragma unroll
            for (int x = 1; x < 16; x <<= 1)
                ps += __shfl_xor_sync(0xffffffffu, ps, x);
            l[u] = l[u] * corr[u] + ps;
            m[u] = mn;
        }
        __syncwarp();
#pragma unroll
        for (int i = 0; i < 4; i++) {
            if (j + 16 * i < h4) {
                float4 acc[ATT_QPT];
#pragma unroll
                for (int u = 0; u < ATT_QPT; u++) {
                    acc[u] = o[u][i];
                    acc[u].x *= corr[u], acc[u].y *= corr[u], acc[u].z *= corr[u], acc[u].w *= corr[u];
                }
                const float *p0 = Ps + (ATT_QPT * pq) * (ATT_KT + 1);
#pragma unroll 4
                for (int kk = 0; kk < ATT_KT; kk++) {
                    const float4 v = Vs[kk * hp + j + 16 * i];
#pragma unroll
                    for (int u = 0; u < ATT_QPT; u++) {
                        const float w = p0[u * (ATT_KT + 1) + kk];
                        acc[u].x += w * v.x, acc[u].y += w * v.y, acc[u].z += w * v.z, acc[u].w += w * v.w;
                    }
                }
#pragma unroll
                for (int u = 0; u < ATT_QPT; u++)
                    o[u][i] = acc[u];
            }
        }
        __syncthreads();
    }
#pragma unroll
    for (int u = 0; u < ATT_QPT; u++) {
        if (!valid[u])
            continue;
        float4 *out = (float4 *)(a.out + ((int64_t)(t0 + ATT_QPT * pq + u) * a.nh + h) * hd);
        const float inv = 1.0f / l[u];
#pragma unroll
        for (int i = 0; i < 4; i++)
            if (j + 16 * i < h4)
                out[j + 16 * i] = make_float4(o[u][i].x * inv, o[u][i].y * inv, o[u][i].z * inv, o[u][i].w * inv);
    }
}

static int attend_tiles(cudaStream_t st, const mxc_att *a)
{
    const int hp = a->hd / 4 + 1;
    const size_t smem = (size_t)(ATT_QT + 2 * ATT_KT) * hp * 16 + ATT_QT * (ATT_KT + 1) * 4;
    static int attr_set;
    if (!attr_set) {
        cudaFuncSetAttribute(k_attend_tile, cudaFuncAttributeMaxDynamicSharedMemorySize, 200 * 1024);
        attr_set = 1;
    }
    dim3 grid((unsigned)a->nh, (unsigned)((a->T + ATT_QT - 1) / ATT_QT));
    return launch_k(k_attend_tile, grid, ATT_THREADS, smem, st, 1, *a);
}

/* One token's blocks a head at position pos: one for each split that
 * holds positions (the window's first to pos's), at most cap. */
static int att_used(const mxc_att *a, int span, int pos)
{
    const int start = a->window && pos - a->window + 1 > 0 ? pos - a->window + 1 : 0;
    return pos / span - start / span + 1;
}

static int att_z(const mxc_att *a, int span, int cap, int pos)
{
    return max(1, min(cap, att_used(a, span, pos)));
}

/* One token's split length at position pos with cap blocks a head
 * (mxc_att's span_auto): the shortest that leaves a block one split.
 * With 16 blocks a head (qwen1.5 on an H200), decode tok/s at contexts of
 * 1 000 / 2 000 / 3 000 with splits of 64: 674 / 555 / 458, of 128: 669 /
 * 620 / 507, of 256: 603 / 574 / 546; at 100-164 positions 64 (two or
 * three blocks a head) 792 against 723 for 128 (docs/cuda.md). */
static int att_span_at(const mxc_att *a, int cap, int pos)
{
    int s = a->span;
    if (a->span_auto)
        while (2 * s <= MXC_ATT_SPAN_PROMPT && att_used(a, s, pos) > cap)
            s *= 2;
    return s;
}

struct mxc_att_node {
    cudaGraphNode_t node;
    mxc_att a;                   /* the launch's argument (a.fit cleared) */
    void *func;
    size_t smem;
    int cap, z;                  /* captured blocks a head, those of the executable graph now */
    int span;                    /* the executable graph's split length now (att_span_at) */
};

/* While capturing: the launch just made (the stream's only leaf) into a->fit. */
static int att_record(cudaStream_t st, const mxc_att *b, void *func, size_t smem, int cap)
{
    mxc_att_fit *f = b->fit;
    cudaStreamCaptureStatus cs;
    const cudaGraphNode_t *deps = NULL;
    size_t nd = 0;
#if CUDART_VERSION >= 13000
    cudaError_t ce = cudaStreamGetCaptureInfo(st, &cs, NULL, NULL, &deps, NULL, &nd);
#else
    cudaError_t ce = cudaStreamGetCaptureInfo_v2(st, &cs, NULL, NULL, &deps, &nd);
#endif
    if (ce != cudaSuccess)
        return (int)ce;
    if (cs != cudaStreamCaptureStatusActive || nd != 1)
        return (int)cudaErrorStreamCaptureInvalidated;
    if (f->n == f->cap) {
        const int nc = f->cap ? 2 * f->cap : 64;
        mxc_att_node *v = (mxc_att_node *)realloc(f->v, sizeof *v * (size_t)nc);
        if (!v)
            return (int)cudaErrorMemoryAllocation;
        f->v = v, f->cap = nc;
    }
    mxc_att_node *nd0 = &f->v[f->n++];
    nd0->node = deps[0];
    nd0->a = *b;
    nd0->a.fit = NULL;
    nd0->func = func;
    nd0->smem = smem;
    nd0->cap = nd0->z = cap;
    nd0->span = b->span;
    return 0;
}

int mxc_att_fit_pos(cudaGraphExec_t x, mxc_att_fit *f, int pos)
{
    for (int i = 0; i < f->n; i++) {
        mxc_att_node *v = &f->v[i];
        const int sp = att_span_at(&v->a, v->cap, pos), z = att_z(&v->a, sp, v->cap, pos);
        if (z == v->z && sp == v->span)
            continue;
        mxc_att b = v->a;
        b.span = sp;
        void *args[1] = {&b};
        cudaKernelNodeParams p = {};
        p.func = v->func;
        p.gridDim = dim3((unsigned)v->a.nh, (unsigned)v->a.T, (unsigned)z);
        p.blockDim = dim3(256);
        p.sharedMemBytes = (unsigned)v->smem;
        p.kernelParams = args;
        const cudaError_t ce = cudaGraphExecKernelNodeSetParams(x, v->node, &p);
        if (ce != cudaSuccess)
            return (int)ce;
        v->z = z;
        v->span = sp;
    }
    return 0;
}

void mxc_att_fit_free(mxc_att_fit *f)
{
    free(f->v);
    f->v = NULL;
    f->n = f->cap = 0;
}

int mxc_attend(cudaStream_t st, const mxc_att *a)
{
    if (a->tile && a->T > 1 && !a->cnt && a->hd % 4 == 0 && a->hd <= 256)
        return attend_tiles(st, a);
    /* one token (a->cnt): about two blocks an SM, each looping over its
     * share of the splits (k_attend); where the host knows the position,
     * no more than the splits in use */
    int nz = a->n_split;
    mxc_att b = *a;
    if (a->cnt) {
        const int want = a->max_z > 0 ? a->max_z : 2 * sm_count() / (a->nh * a->T);
        nz = min(nz, max(1, want));
        if (a->hpos >= 0) {
            b.span = att_span_at(a, nz, a->hpos);
            nz = att_z(a, b.span, nz, a->hpos);
        }
    }
    dim3 grid((unsigned)a->nh, (unsigned)a->T, (unsigned)nz);
    /* one token, heads up to ATT_PRE_HD: the first split's old rows copied
     * before the wait (k_attend) */
    b.pre = a->cnt && g_att_pre && a->hd <= ATT_PRE_HD && a->hd % 4 == 0;
    b.kv = g_att_kv, b.comb1 = g_att_comb1, b.early = g_att_early;
    const size_t smem = b.pre ? (size_t)2 * MXC_ATT_SPAN_DECODE * ATT_PRE_HD * sizeof(float) : 0;
    static int lifted;
    if (smem && !lifted) {
        cudaFuncSetAttribute(k_attend<true>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
        cudaFuncSetAttribute(k_attend<false>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
        lifted = 1;
    }
    const int rc = a->fuse ? launch_k(k_attend<true>, grid, 256, smem, st, 1, b)
                           : launch_k(k_attend<false>, grid, 256, smem, st, 1, b);
    if (!rc && a->cnt && a->fit)
        return att_record(st, &b, a->fuse ? (void *)k_attend<true> : (void *)k_attend<false>, smem, nz);
    if (rc || a->cnt)
        return rc;
    dim3 g2((unsigned)a->nh, (unsigned)a->T);
    return launch_k(k_att_combine, g2, a->hd < 128 ? 128 : 256, 0, st, 1, *a);
}

/* ---- routing ----------------------------------------------------------------------- */

/* One warp per token: softmax, then k rounds of argmax (ties to the lower
 * index, as torch.topk), as moe/router.c computes it. */
__global__ void k_route(mxc_route r)
{
    pdl_enter();
    __shared__ float p[4096];
    __shared__ unsigned char taken[4096];
    const int t = blockIdx.x, lane = threadIdx.x, E = r.E, K = r.k + r.n_extra;
    const float *lg = r.logits + (int64_t)t * E;
    float mx = -INFINITY;
    for (int i = lane; i < E; i += 32)
        mx = fmaxf(mx, lg[i]);
    mx = warp_max(mx);
    float sum = 0.0f;
    for (int i = lane; i < E; i += 32) {
        p[i] = expf(lg[i] - mx);
        taken[i] = 0;
        sum += p[i];
    }
    sum = warp_sum(sum);
    __syncwarp();
    int *P = r.P + (int64_t)t * K;
    float *W = r.W + (int64_t)t * K;
    float wsum = 0.0f;
    for (int j = 0; j < r.k; j++) {
        int best = -1;
        float bv = -INFINITY;
        for (int i = lane; i < E; i += 32)
            if (!taken[i] && (best < 0 || p[i] > bv))
                best = i, bv = p[i];
#pragma unroll
        for (int o = 16; o; o >>= 1) {
            const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
            const int oi = __shfl_xor_sync(0xffffffffu, best, o);
            if (oi >= 0 && (best < 0 || ov > bv || (ov == bv && oi < best)))
                best = oi, bv = ov;
        }
        if (lane == 0) {
            taken[best] = 1;
            P[j] = best;
            W[j] = p[best] / sum;
        }
        wsum += p[best] / sum;
        __syncwarp();
    }
    if (lane == 0) {
        for (int j = 0; j < r.k; j++) {
            if (r.norm_topk)
                W[j] /= wsum;
            if (r.expert_scale)
                W[j] *= r.expert_scale[P[j]];
        }
        for (int m = 0; m < r.n_extra; m++) {
            P[r.k + m] = E + m;
            W[r.k + m] = m == 0 && r.glog ? 1.0f / (1.0f + expf(-r.glog[t])) : 1.0f;
        }
    }
}

int mxc_route_softmax(cudaStream_t st, const mxc_route *r)
{
    return launch_k(k_route, r->T, 32, 0, st, 1, *r);
}

/* ---- the fused decode-MoE kernels -------------------------------------------------- */

/* The matrices of slots [lo, hi) (gate, up, down of kind P[j]) copied to
 * shared memory by the block's threads at once: one dependent load chain
 * per block instead of one per warp and slot. */
__device__ __forceinline__ void load_slots(const mxc_moe1 &p, mxc_mat *sm, int which0, int nwhich)
{
    const int ns = p.hi - p.lo;
    for (int i = threadIdx.x; i < ns * nwhich; i += blockDim.x) {
        const int j = p.lo + i / nwhich, w = which0 + i % nwhich;
        sm[i] = p.table[3 * p.P[j] + w];
    }
    __syncthreads();
}

template <int B>
__global__ void __launch_bounds__(THREADS, 2) k_moe1(mxc_moe1 p)
{
    pdl_enter();
    __shared__ mxc_mat sm[2 * MXC_MAX_SLOTS];
    load_slots(p, sm, 0, 2);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    /* two h rows per warp (slot widths are multiples of 32: both rows in one slot) */
    const int64_t gr = p.off[p.lo] + 2 * ((int64_t)blockIdx.x * WARPS + warp);
    if (gr >= p.off[p.hi])
        return;
    int j = p.lo;
    while (gr >= p.off[j + 1])
        j++;
    const mxc_mat g = sm[2 * (j - p.lo)], u = sm[2 * (j - p.lo) + 1];
    const int64_t r = gr - p.off[j];
    float ag[2] = {0.0f, 0.0f}, au[2] = {0.0f, 0.0f};
    if constexpr (B > 0)
        dual_rows_b<B>(g, u, r, p.x, ag, au, lane);
    else
        dual_rows(g, u, r, p.x, ag, au, lane);
#pragma unroll
    for (int i = 0; i < 2; i++) {
        const float a = warp_sum(ag[i]), b = warp_sum(au[i]);
        if (lane == 0)
            p.h[gr + i] = glu(p.act, a, b);
    }
}

/* One output row per warp, its lanes striding over the chunks of all
 * slots at once (h is the slots' rows end to end, so chunk q of the
 * concatenation is x = h + 32 q whatever slot it is in): every lane is
 * busy whatever the slots' widths, and each lane keeps
 * sum_j W[j] * (its chunks of down_j row . h_j); the warp reduces once. */
template <int BITS>
__device__ __forceinline__ float chunk_val(const mxc_mat &m, int64_t r, int64_t lc, const float *xc)
{
    if constexpr (BITS == 0) {
        float d = 0.0f;
        for (int k = 0; k < 32; k++)
            d += ldf(m.w, m.dt, r * m.cols + lc * 32 + k) * xc[k];
        return d;
    } else {
        uint32_t w[1][BITS];
        load_words<BITS>((const uint32_t *)m.w + r * (m.cols * BITS / 32) + lc * BITS, w[0]);
        const int64_t gi = r * (m.cols / m.gs) + (lc * 32) / m.gs;
        const float s = ldf(m.s, m.dt, gi), b = ldf(m.b, m.dt, gi);
        float d[1] = {0.0f}, sx = 0.0f;
        chunk_rows<BITS, 1>(w, xc, 0, d, sx);
        return s * d[0] + b * sx;
    }
}

__global__ void __launch_bounds__(128) k_moe2(mxc_moe1 p)
{
    pdl_enter();
    __shared__ mxc_mat sm[MXC_MAX_SLOTS];
    __shared__ int coff[MXC_MAX_SLOTS + 1];
    __shared__ float wts[MXC_MAX_SLOTS];
    for (int j = p.lo + threadIdx.x; j <= p.hi; j += blockDim.x) {
        coff[j - p.lo] = p.off[j] / 32;
        if (j < p.hi)
            wts[j - p.lo] = p.W[j];
    }
    load_slots(p, sm, 2, 1);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int64_t r = (int64_t)blockIdx.x * (blockDim.x >> 5) + warp;
    if (r >= p.d)
        return;
    const int ns = p.hi - p.lo, q0 = coff[0], q1 = coff[ns];
    float tot = 0.0f;
    int j = 0;
#pragma unroll 2
    for (int q = q0 + lane; q < q1; q += 32) {
        while (q >= coff[j + 1])
            j++;
        const mxc_mat &m = sm[j];
        const int64_t lc = q - coff[j];
        const float *xc = p.h + (int64_t)q * 32;
        float v;
        switch (m.bits) {
        case 2: v = chunk_val<2>(m, r, lc, xc); break;
        case 3: v = chunk_val<3>(m, r, lc, xc); break;
        case 4: v = chunk_val<4>(m, r, lc, xc); break;
        case 5: v = chunk_val<5>(m, r, lc, xc); break;
        case 6: v = chunk_val<6>(m, r, lc, xc); break;
        case 8: v = chunk_val<8>(m, r, lc, xc); break;
        default: v = chunk_val<0>(m, r, lc, xc); break;
        }
        tot += wts[j] * v;
    }
    tot = warp_sum(tot);
    if (lane == 0)
        p.out[r] = p.accumulate ? p.out[r] + tot : tot;
}

int mxc_moe_phase1(cudaStream_t st, const mxc_moe1 *p)
{
    const int64_t rows = p->off[p->hi] - p->off[p->lo];
    const unsigned nb = (unsigned)((rows / 2 + WARPS - 1) / WARPS);
    if (p->bits == 4)
        return launch_k(k_moe1<4>, nb, THREADS, 0, st, 1, *p);
    if (p->bits == 8)
        return launch_k(k_moe1<8>, nb, THREADS, 0, st, 1, *p);
    return launch_k(k_moe1<-1>, nb, THREADS, 0, st, 1, *p);
}

int mxc_moe_phase2(cudaStream_t st, const mxc_moe1 *p)
{
    return launch_k(k_moe2, (unsigned)((p->d + 3) / 4), 128, 0, st, 1, *p);
}

/* ---- streaming decode kernels (4- and 8-bit weights) ---------------------------------
 *
 * One token's matvecs, the fused MoE's two phases and lm_head, for the
 * common case: every matrix of the launch 4- or 8-bit with one scale
 * dtype (a kernel per width and dtype, so the inner loop has no
 * branches).  What they do differently from the kernels above:
 *   - x is staged once per block in shared memory, chunk c at c * XS
 *     floats (16-byte aligned; 8 lanes reading float4 i of 8 consecutive
 *     chunks hit distinct banks), with each chunk's sum beside it.  Read
 *     straight from global memory, the 32 lanes of a warp touch 32
 *     different 128-byte lines per float4 load: 32 L1 wavefronts each,
 *     which capped the old kernels far below DRAM bandwidth.
 *   - blocks stay resident (grid = what fits on the GPU) and each warp
 *     walks its row groups with the next step's weight loads issued
 *     before the current step's arithmetic, so loads are always in flight.
 *   - group indices come from shifts (gs is 32, 64 or 128), row offsets
 *     from one multiply: no 64-bit division in the loop.
 *   - the plain matvec issues its first weight loads before waiting for
 *     the previous kernel (programmatic dependent launch).
 * A warp owns R rows at a time ("a group"); its lanes take 32-value
 * chunks lane, lane + 32, ... of them ("steps" of the group). */
#define XS 36
/* the widest x a block stages (floats); wider rows take the kernels above */
#define MXC_STAGE_MAX 20480

/* x[0 .. 32 nch) into shared memory (chunk c at xs + c * XS), sums[c] the
 * sum of chunk c.  Every thread of the block calls it. */
__device__ __forceinline__ void stage_x(const float *__restrict__ x, int nch, float *xs, float *sums)
{
    for (int i = threadIdx.x; i < nch * 8; i += blockDim.x)
        *(float4 *)(xs + (i >> 3) * XS + (i & 7) * 4) = ((const float4 *)x)[i];
    __syncthreads();
    for (int c = threadIdx.x; c < nch; c += blockDim.x) {
        const float4 *p = (const float4 *)(xs + c * XS);
        float s = 0.0f;
#pragma unroll
        for (int q = 0; q < 4; q++) {
            const float4 a = p[2 * q], b = p[2 * q + 1];
            s += ((a.x + a.y) + (a.z + a.w)) + ((b.x + b.y) + (b.z + b.w));
        }
        sums[c] = s;
    }
    __syncthreads();
}

/* An RMSNorm's last step on the staged row, xs[i] = w[i] * (xs[i] * r), for
 * a thread's values i = threadIdx.x + u nt (u < 8, wv their weights): one
 * place for stage_norm and stage_norm_cl, so that both keep the same
 * arithmetic per value. */
__device__ __forceinline__ void norm_scale8(float *xs, const float wv[8], int d, int nt, float r)
{
#pragma unroll
    for (int u = 0; u < 8; u++) {
        const int i = threadIdx.x + u * nt;
        if (i < d) {
            float *v = xs + (i >> 5) * XS + (i & 31);
            *v = wv[u] * (*v * r);
        }
    }
}

/* stage_x of norm(x + delta) (mxc_norm_in): each block computes the norm
 * of the whole row itself (the same arithmetic as k_addnorm); block 0
 * writes x + delta to x_out.  sums NULL: no chunk sums. */
/* Inlined, so that the weight loads a kernel primes before it stay in
 * flight while it runs (as a call, two primed registers were spilled
 * around it and the call waited for their loads: docs/cuda.md). */
/* dtag (with tag): the delta dl.D as tagged words, each value read once it
 * carries tag (phase 1 on o_proj's rows: mxc_moe1's y_tag). */
__device__ __forceinline__ void stage_norm(const mxc_norm_in &n, int d, float *xs, float *sums,
                                           const unsigned long long *dtag = nullptr, unsigned tag = 0)
{
    double ss = 0.0, sum = 0.0;
    const bool wr = n.x_out && blockIdx.x == 0;
    const int nt = blockDim.x;
    float wv[8];   /* the norm's weights of the last round (all of them when d <= 8 nt) */
    /* 8 values a thread at a time, every load of a round issued before
     * the first is used (the slot rows' too): one trip to memory per
     * round instead of one per value and slot */
    for (int base = 0; base < d; base += 8 * nt) {
        float v[8], a[8];
#pragma unroll
        for (int u = 0; u < 8; u++) {
            const int i = base + threadIdx.x + u * nt;
            v[u] = i < d ? n.x[i] : 0.0f;
            wv[u] = i < d ? n.w[i] : 0.0f;
            a[u] = 0.0f;
        }
        if (n.has && n.dl.K == 0 && dtag) {
            ld_tagged_wait<8>(dtag + base, nt, d - base, tag, a);
        } else if (n.has && n.dl.K == 0) {
            /* through L2: phase 1 may stage it on o_proj's flag (mxc_moe1's
             * h_flag) while o_proj's launch still runs */
#pragma unroll
            for (int u = 0; u < 8; u++) {
                const int i = base + threadIdx.x + u * nt;
                if (i < d)
                    a[u] = __ldcg(n.dl.D + i);
            }
        } else if (n.has) {
#pragma unroll 4
            for (int j = 0; j < n.dl.K; j++) {
                const float w = n.dl.W[j];
                const float *Y = n.dl.Y + (int64_t)j * d;
#pragma unroll
                for (int u = 0; u < 8; u++) {
                    const int i = base + threadIdx.x + u * nt;
                    if (i < d)
                        a[u] += w * Y[i];
                }
            }
        }
#pragma unroll
        for (int u = 0; u < 8; u++) {
            const int i = base + threadIdx.x + u * nt;
            if (i < d) {
                if (n.has)
                    v[u] += a[u];
                xs[(i >> 5) * XS + (i & 31)] = v[u];
                if (wr)
                    n.x_out[i] = v[u];
                ss += (double)v[u] * v[u];
                sum += v[u];
            }
        }
    }
    STAMP_AT(6);   /* (k_mvs: q/k/v, lm_head) the loads in and used */
    if (!n.b && d <= 8 * nt) {
        ss = block_sum(ss);
        STAMP_AT(7);   /* (k_mvs, and phase 1, which has no point 7 of its own) the sum of squares */
        norm_scale8(xs, wv, d, nt, 1.0f / sqrtf((float)(ss / (double)d) + n.eps));
    } else if (!n.b) {
        ss = block_sum(ss);
        const float r = 1.0f / sqrtf((float)(ss / (double)d) + n.eps);
        for (int i = threadIdx.x; i < d; i += blockDim.x) {
            float *v = xs + (i >> 5) * XS + (i & 31);
            *v = n.w[i] * (*v * r);
        }
    } else {
        const float mean = (float)(block_sum(sum) / (double)d);
        double var = 0.0;
        for (int i = threadIdx.x; i < d; i += blockDim.x) {
            const double v = xs[(i >> 5) * XS + (i & 31)];
            var += (v - mean) * (v - mean);
        }
        const float r = 1.0f / sqrtf((float)(block_sum(var) / (double)d) + n.eps);
        for (int i = threadIdx.x; i < d; i += blockDim.x) {
            float *v = xs + (i >> 5) * XS + (i & 31);
            *v = n.w[i] * ((*v - mean) * r) + n.b[i];
        }
    }
    __syncthreads();
    if (!sums)   /* the caller makes digits and sums of its own (stage_digits) */
        return;
    const int nch = d >> 5;
    for (int c = threadIdx.x; c < nch; c += blockDim.x) {
        const float4 *p = (const float4 *)(xs + c * XS);
        float s = 0.0f;
#pragma unroll
        for (int q = 0; q < 4; q++) {
            const float4 a = p[2 * q], b = p[2 * q + 1];
            s += ((a.x + a.y) + (a.z + a.w)) + ((b.x + b.y) + (b.z + b.w));
        }
        sums[c] = s;
    }
    __syncthreads();
}

/* stage_norm's RMSNorm (no LayerNorm bias, d <= 8 x blockDim.x, d a
 * multiple of 32 CL) in a cluster of CL blocks: rank q reads only its
 * slice of the residual and the slot rows (x + delta, the reads every
 * block made in full: 56 KB a block for qwen1.5's q/k/v, all 264 blocks
 * through L2 at once) and stores the sums into every rank's xs through
 * distributed shared memory, with its part of the sum of squares; each
 * block then adds the CL parts in rank order (the same total in every
 * block) and scales its xs as stage_norm does.  Each block loads the
 * norm's weights itself, before the barrier.  The same arithmetic per
 * value; only the sum of squares is added in another (fixed) order. */
template <int CL>
__device__ __forceinline__ void stage_norm_cl(const mxc_norm_in &n, int d, float *xs,
                                              const unsigned long long *dtag = nullptr, unsigned tag = 0)
{
    namespace cg = cooperative_groups;
    constexpr int U = 8 / CL;   /* values of the slice a thread (d <= 8 nt) */
    __shared__ double css[CL];
    cg::cluster_group cl = cg::this_cluster();
    const int rank = (int)cl.block_rank(), nt = blockDim.x, S = d / CL, lo = rank * S;
    /* every block of the cluster has started before anyone writes its
     * shared memory: arrive now, wait just before the first remote store */
    asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
    float wv[8], v[U], a[U];
#pragma unroll
    for (int u = 0; u < 8; u++) {
        const int i = threadIdx.x + u * nt;
        wv[u] = i < d ? n.w[i] : 0.0f;
    }
#pragma unroll
    for (int u = 0; u < U; u++) {
        const int j = threadIdx.x + u * nt;
        v[u] = j < S ? n.x[lo + j] : 0.0f;
        a[u] = 0.0f;
    }
    if (n.has && n.dl.K == 0 && dtag) {
        ld_tagged_wait<U>(dtag + lo, nt, S, tag, a);
    } else if (n.has && n.dl.K == 0) {
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int j = threadIdx.x + u * nt;
            if (j < S)
                a[u] = __ldcg(n.dl.D + lo + j);
        }
    } else if (n.has) {
#pragma unroll 4
        for (int k = 0; k < n.dl.K; k++) {
            const float w = n.dl.W[k];
            const float *Y = n.dl.Y + (int64_t)k * d + lo;
#pragma unroll
            for (int u = 0; u < U; u++) {
                const int j = threadIdx.x + u * nt;
                if (j < S)
                    a[u] += w * Y[j];
            }
        }
    }
    float *rx[CL];
#pragma unroll
    for (int q = 0; q < CL; q++)
        rx[q] = cl.map_shared_rank(xs, q);
    const bool wr = n.x_out && blockIdx.x < CL;   /* the first cluster writes x + delta */
    double ss = 0.0;
    asm volatile("barrier.cluster.wait.aligned;" ::: "memory");
#pragma unroll
    for (int u = 0; u < U; u++) {
        const int j = threadIdx.x + u * nt;
        if (j < S) {
            const int i = lo + j;
            if (n.has)
                v[u] += a[u];
#pragma unroll
            for (int q = 0; q < CL; q++)
                rx[q][(i >> 5) * XS + (i & 31)] = v[u];
            if (wr)
                n.x_out[i] = v[u];
            ss += (double)v[u] * v[u];
        }
    }
    STAMP_AT(6);
    ss = block_sum(ss);
    if (threadIdx.x < CL)
        *cl.map_shared_rank(&css[rank], (int)threadIdx.x) = ss;
    /* every rank's values and parts in every rank's shared memory */
    asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");
    asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");
    STAMP_AT(7);
    double t = 0.0;
#pragma unroll
    for (int q = 0; q < CL; q++)
        t += css[q];
    norm_scale8(xs, wv, d, nt, 1.0f / sqrtf((float)(t / (double)d) + n.eps));
    __syncthreads();
}

/* The end of a routing: lane j < k holds choice j (expert myp, its
 * softmax weight myw; wsum the k weights' sum) and writes it, normalised
 * and scaled as the family says.  *packed: choices 0 .. 3 a byte
 * each (mxc_route's r_pack: k <= 4, E <= 255).  route_small and
 * route_rank end here, with route_extra. */
__device__ __forceinline__ void route_out(const mxc_route &r, int lane, int myp, float myw, float wsum,
                                          uint32_t *packed)
{
    if (lane < r.k) {
        if (r.norm_topk)
            myw /= wsum;
        if (r.expert_scale)
            myw *= r.expert_scale[myp];
        r.P[lane] = myp;
        r.W[lane] = myw;
    }
    if (packed)
        *packed = __reduce_or_sync(0xffffffffu, lane < r.k && lane < 4 ? (uint32_t)myp << (8 * lane) : 0u);
}

/* the always-on experts after the k routed ones (n_extra; the first
 * gated by the sigmoid of glog's logit gv) */
__device__ __forceinline__ void route_extra(const mxc_route &r, int lane, float gv)
{
    const int K = r.k + r.n_extra;
    for (int m = r.k + lane; m < K; m += 32) {
        r.P[m] = r.E + (m - r.k);
        r.W[m] = m == r.k && r.glog ? 1.0f / (1.0f + expf(-gv)) : 1.0f;
    }
}

/* k_route for one token by one warp, E <= MXC_ROUTE_FUSED_MAX (each lane
 * keeps its experts' numerators in registers): the same arithmetic and
 * ties.  Reads what other blocks of the launch wrote: through L2; or the
 * logits (and the gate logit) from lsm (and gsm), shared memory the
 * caller's block wrote.  Lane j keeps the j-th choice, so the weights are
 * finished and stored by the lanes at once: no store read back (each one a
 * round trip to L2 in a chain at the end of a launch that phase 1 waits
 * for).  Inline: as a call (its frame in local memory, which these
 * kernels, their shared memory at its largest, reach through L2) o_proj's
 * last block took 6-7 us to route under the step's load, 2-3 inline
 * (decode 675 -> 714 tok/s: docs/cuda.md, session 17). */
__device__ __forceinline__ void route_small(const mxc_route &r, int lane, const float *lsm = nullptr,
                                            const float *gsm = nullptr, uint32_t *packed = nullptr)
{
    constexpr int NP = MXC_ROUTE_FUSED_MAX / 32;
    const int E = r.E;
    float p[NP];
    float mx = -INFINITY;
    const float gv = !r.glog ? 0.0f : gsm ? *gsm : __ldcg(r.glog);
#pragma unroll
    for (int q = 0; q < NP; q++) {
        const int i = lane + 32 * q;
        p[q] = i >= E ? -INFINITY : lsm ? lsm[i] : __ldcg(r.logits + i);
        mx = fmaxf(mx, p[q]);
    }
    mx = warp_max(mx);
    float sum = 0.0f;
#pragma unroll
    for (int q = 0; q < NP; q++)
        if (lane + 32 * q < E) {
            p[q] = expf(p[q] - mx);
            sum += p[q];
        }
    sum = warp_sum(sum);
    unsigned taken = 0;
    float wsum = 0.0f, myw = 0.0f;
    int myp = 0;
    for (int j = 0; j < r.k; j++) {
        int best = -1;
        float bv = -INFINITY;
#pragma unroll
        for (int q = 0; q < NP; q++)
            if (lane + 32 * q < E && !((taken >> q) & 1u) && (best < 0 || p[q] > bv))
                best = lane + 32 * q, bv = p[q];
#pragma unroll
        for (int o = 16; o; o >>= 1) {
            const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
            const int oi = __shfl_xor_sync(0xffffffffu, best, o);
            if (oi >= 0 && (best < 0 || ov > bv || (ov == bv && oi < best)))
                best = oi, bv = ov;
        }
        if ((best & 31) == lane)
            taken |= 1u << (best >> 5);
        if (lane == (j & 31)) {
            myp = best;
            myw = bv / sum;
        }
        if (r.k > 32 && lane == 0) {
            r.P[j] = best;
            r.W[j] = bv / sum;
        }
        wsum += bv / sum;
    }
    if (r.k <= 32) {   /* lane j's choice still in its registers */
        route_out(r, lane, myp, myw, wsum, packed);
    } else if (lane == 0) {
        for (int j = 0; j < r.k; j++) {
            if (r.norm_topk)
                r.W[j] /= wsum;
            if (r.expert_scale)
                r.W[j] *= r.expert_scale[r.P[j]];
        }
    }
    route_extra(r, lane, gv);
}

/* route_small's routes for E <= RANK_E experts and k <= 8, by every
 * thread of the block (o_proj's last block, rp_finish;
 * MLXCEL_CUDA_ROUTE_RANK): warps 1 .. 7 take an expert a pair of
 * threads, each pair finding the largest logit (each thread over half of
 * them), its expert's softmax numerator and then its rank (how many
 * experts come before it: a larger numerator, or an equal one at a lower
 * index, as route_small compares them), while warp 0 adds the numerators
 * up in route_small's order; the experts of rank < k are route_small's
 * choices in its order, with its weights bit for bit.  Its chain is three
 * barriers and two short loops over the logits and numerators in shared
 * memory instead of route_small's k rounds of warp-wide arg-max shuffles
 * in one warp: o_proj's routing block took 3.4 us from its logits to its
 * exit while the SM's other blocks streamed (docs/cuda.md, session 23;
 * with a thread an expert, 128 experts, the loops were slower than
 * route_small).  *packed: warp 0's lanes.  0 where a numerator is NaN:
 * the block then routes by route_small (the caller's, so that its code is
 * there once). */
#define RANK_E ((THREADS - 32) / 2)
__device__ __forceinline__ bool route_rank(const mxc_route &r, const float *lsm, const float *gsm, uint32_t *packed)
{
    static_assert(MXC_ROUTE_FUSED_MAX >= RANK_E, "route_small's sum covers the ranks' experts");
    __shared__ float ps[RANK_E], s_sum, wr[8];
    __shared__ int pr[8];
    const int E = r.E, lane = threadIdx.x & 31, t = (int)threadIdx.x - 32, e = t >> 1;
    const bool own = t >= 0 && e < E && !(t & 1);
    float p = 0.0f;
    if (t >= 0) {
        float mx = -INFINITY;
        if (e < E) {
#pragma unroll 1
            for (int i = t & 1; i < E; i += 2)
                mx = fmaxf(mx, lsm[i]);
        }
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        if (e < E)
            p = expf(lsm[e] - mx);
        if (own)
            ps[e] = p;
    }
    if (__syncthreads_or(own && p != p))
        return false;
    int c = 0;
    if (t < 0) {   /* route_small's sum: lane L's numerators L, L + 32, ..., then the butterfly */
        float sum = 0.0f;
#pragma unroll 1
        for (int i = lane; i < E; i += 32)
            sum += ps[i];
        sum = warp_sum(sum);
        if (lane == 0)
            s_sum = sum;
    } else {
        if (e < E) {
#pragma unroll 1
            for (int i = t & 1; i < E; i += 2) {
                const float pi = ps[i];
                c += pi > p || (pi == p && i < e);
            }
        }
        c += __shfl_xor_sync(0xffffffffu, c, 1);
    }
    __syncthreads();
    if (own && c < r.k) {
        pr[c] = e;
        wr[c] = p / s_sum;
    }
    __syncthreads();
    if (t >= 0)
        return true;
    /* lane j < k: choice j, as route_small's lanes hold them */
    float wsum = 0.0f;
    for (int j = 0; j < r.k; j++)
        wsum += wr[j];
    const int myp = lane < r.k ? pr[lane] : 0;
    route_out(r, lane, myp, lane < r.k ? wr[lane] : 0.0f, wsum, packed);
    const float gv = !r.glog ? 0.0f : gsm ? *gsm : __ldcg(r.glog);
    route_extra(r, lane, gv);
    return true;
}

/* o_proj's last block routes by route_rank (MLXCEL_CUDA_ROUTE_RANK=0:
 * route_small) where its experts allow: k_mvs_rp's RK, chosen at the
 * launch, so that a kernel routing by route_small holds no code of
 * route_rank (a kernel's speed moves with code it does not run:
 * docs/cuda.md, sessions 19-24) */
static int g_route_rank = 1;

extern "C" void mxc_set_route_rank(int on) { g_route_rank = on; }

/* One step's data of R rows: each row's chunk words, scale and bias. */
template <int BITS, int R>
struct mv_stage {
    uint32_t w[R][BITS];
    /* scales and biases as raw bits (ldraw_t), turned into floats where
     * they are used: a conversion at the load would stall the warp on a
     * load issued an item ahead (the point of issuing it early) */
    uint32_t s[R], b[R];
};

/* Chunk c of row r of m into row slot i of a stage. */
template <int BITS, int DT, int R>
__device__ __forceinline__ void load_chunk(const mxc_mat &m, int64_t r, int c, mv_stage<BITS, R> &st, int i)
{
    const int64_t nchm = m.cols >> 5;
    const int gsh = __ffs(m.gs) - 6;
    load_words<BITS>((const uint32_t *)m.w + r * nchm * BITS + (int64_t)c * BITS, st.w[i]);
    const int64_t gi = r * (nchm >> gsh) + (c >> gsh);
    st.s[i] = ldraw_t<DT>(m.s, gi);
    st.b[i] = ldraw_t<DT>(m.b, gi);
}

/* acc[i] += row i's chunk . x chunk xc (sum sx) for the stage's R rows. */
template <int BITS, int DT, int R>
__device__ __forceinline__ void stage_dot(const mv_stage<BITS, R> &st, const float *xc, float sx, float *acc)
{
    float d[R], x8[8];
#pragma unroll
    for (int i = 0; i < R; i++)
        d[i] = 0.0f;
#define MXC_SQ(Q)                                                                         \
    {                                                                                     \
        const float4 a = ((const float4 *)xc)[2 * Q], b = ((const float4 *)xc)[2 * Q + 1]; \
        x8[0] = a.x, x8[1] = a.y, x8[2] = a.z, x8[3] = a.w;                               \
        x8[4] = b.x, x8[5] = b.y, x8[6] = b.z, x8[7] = b.w;                               \
        _Pragma("unroll") for (int i = 0; i < R; i++) d[i] += dot8<BITS, Q>(st.w[i], x8); \
    }
    MXC_SQ(0) MXC_SQ(1) MXC_SQ(2) MXC_SQ(3)
#undef MXC_SQ
#pragma unroll
    for (int i = 0; i < R; i++)
        acc[i] += rawf_t<DT>(st.s[i]) * d[i] + rawf_t<DT>(st.b[i]) * sx;
}

/* ---- integer dot products on exact digits of x ------------------------------------
 *
 * The float path above spends about 3.5 instructions per 4-bit weight
 * (byte permute, subtract, FMA), enough for the issue rate to limit the
 * long launches (lm_head: 93 us fp32, 69 us with the digits below, ncu on
 * an H200).  With MLXCEL_CUDA_IDOT (the default) each staged 32-value chunk
 * of x is turned into fixed point once per block: v = x / dx rounded to an
 * integer of 24 bits (dx the power of two that puts the chunk's largest
 * |x| just under 2^23: the precision fp32 gives that value), split into
 * three bytes v = 65536 d2 + 256 d1 + d0 (d0, d1 unsigned, d2 signed).
 * The weights' integers q (0..15, 0..255) are then dotted with each digit
 * by dp4a, four products an instruction, exactly (integer sums of at most
 * 32 products), and a chunk's dot is dx (65536 S2 + 256 S1 + S0): the only
 * roundings are the conversion of x to 24 bits and the two float
 * operations of the recombination, as the float kernels round each
 * partial sum.  4-bit: a word's low nibbles are values 0, 2, 4, 6 of its 8,
 * so the digits are stored in that order (a quarter's even values, then
 * its odd values), and the nibbles need only a mask and a shift.
 *
 * A chunk's stage: DS words, digit k in words 8k .. 8k + 7, then dx, the
 * chunk's sum of x (float), two words of padding: 112 bytes, so the 8
 * lanes of a 16-byte shared load read 8 consecutive chunks on distinct
 * banks. */
#define DS 28

/* Byte k (0..2) of a, b, c, d as one word, a's in the low byte. */
__device__ __forceinline__ uint32_t bytes_k(uint32_t a, uint32_t b, uint32_t c, uint32_t d, int k)
{
    if (k == 2)   /* [a2 b2 . .] and [c2 d2 . .], then their low halves */
        return __byte_perm(__byte_perm(a, b, 0x0062u), __byte_perm(c, d, 0x0062u), 0x5410u);
    /* [a0 b0 a1 b1] and [c0 d0 c1 d1], then bytes 0, 1 (k = 0) or 2, 3 (k = 1) of each */
    const uint32_t ab = __byte_perm(a, b, 0x5140u), cd = __byte_perm(c, d, 0x5140u);
    return __byte_perm(ab, cd, k == 0 ? 0x5410u : 0x7632u);
}

/* Quarter q of chunk c's digits (its 8 values x: 4 consecutive lanes
 * make a chunk) into dg, ok false for a thread past the last chunk (it
 * still takes part in the shuffles). */
template <int BITS>
__device__ __forceinline__ void digit_item(const float *x, bool ok, int c, int q, uint32_t *dg)
{
    uint32_t mb = 0;
#pragma unroll
    for (int u = 0; u < 8; u++)
        mb = max(mb, __float_as_uint(x[u]) & 0x7FFFFFFFu);
    mb = max(mb, __shfl_xor_sync(0xffffffffu, mb, 1));
    mb = max(mb, __shfl_xor_sync(0xffffffffu, mb, 2));
    float s = ((x[0] + x[1]) + (x[2] + x[3])) + ((x[4] + x[5]) + (x[6] + x[7]));
    s += __shfl_xor_sync(0xffffffffu, s, 1);
    s += __shfl_xor_sync(0xffffffffu, s, 2);
    /* m < 2^e with e = E - 126 (E the biased exponent of m): dx =
     * 2^(e - 23) puts |x / dx| under 2^23; chunks under 2^-102 share
     * the scale of 2^-102 (their few bits are far below fp32's
     * resolution of any larger partial sum) */
    const int E = (int)(mb >> 23);
    float dx, inv;
    if (E == 255) {
        dx = __uint_as_float(mb);
        inv = 0.0f;
    } else {
        const int Ec = E < 24 ? 24 : E;
        dx = __uint_as_float((uint32_t)(Ec - 22) << 23);
        inv = __uint_as_float((uint32_t)(276 - Ec) << 23);
    }
    uint32_t v[8];
#pragma unroll
    for (int u = 0; u < 8; u++)
        v[u] = (uint32_t)min(max(__float2int_rn(x[u] * inv), -(1 << 23)), (1 << 23) - 1);
    if (ok) {
        uint32_t *d = dg + c * DS + 2 * q;
#pragma unroll
        for (int k = 0; k < 3; k++) {
            uint2 w;
            if constexpr (BITS == 4) {   /* a quarter's even values, then its odd values */
                w.x = bytes_k(v[0], v[2], v[4], v[6], k);
                w.y = bytes_k(v[1], v[3], v[5], v[7], k);
            } else {
                w.x = bytes_k(v[0], v[1], v[2], v[3], k);
                w.y = bytes_k(v[4], v[5], v[6], v[7], k);
            }
            *(uint2 *)(d + 8 * k) = w;
        }
        if (q == 0) {
            dg[c * DS + 24] = __float_as_uint(dx);
            dg[c * DS + 25] = __float_as_uint(s);
        }
    }
}

/* The digits of x's chunks into dg.  Chunk c's values are src[c * stride
 * .. + 32) (x in global memory, stride 32, or staged by stage_norm,
 * stride XS); 4 consecutive threads take a chunk, 8 values each, so a
 * block of 256 converts 64 chunks at once (no serial chain per chunk).
 * The chunk's largest |x| is found on the bit patterns (NaN above inf
 * above every finite value), so a non-finite x gives a non-finite dx and
 * a non-finite result.  Every thread calls it. */
template <int BITS>
__device__ __forceinline__ void stage_digits(const float *src, int stride, int nch, uint32_t *dg)
{
    const int n = nch * 4;
    for (int base = 0; base < n; base += blockDim.x) {
        const int i = base + threadIdx.x, c = i >> 2, q = i & 3;
        const bool ok = i < n;
        float x[8];
        if (ok) {
            const float4 a = *(const float4 *)(src + (int64_t)c * stride + 8 * q);
            const float4 b = *(const float4 *)(src + (int64_t)c * stride + 8 * q + 4);
            x[0] = a.x, x[1] = a.y, x[2] = a.z, x[3] = a.w, x[4] = b.x, x[5] = b.y, x[6] = b.z, x[7] = b.w;
        } else {
#pragma unroll
            for (int u = 0; u < 8; u++)
                x[u] = 0.0f;
        }
        digit_item<BITS>(x, ok, c, q, dg);
    }
    __syncthreads();
}

/* stage_digits of a row in global memory (stride 32) of at most NR x
 * blockDim.x / 4 chunks, every round's loads issued before the first is
 * used: one trip to L2 instead of one a round (phase 2's h of a wide
 * shared expert: 5 632 values, three rounds). */
template <int BITS, int NR>
__device__ __forceinline__ void stage_digits_all(const float *src, int nch, uint32_t *dg)
{
    const int n = nch * 4;
    float4 a[NR], b[NR];
#pragma unroll
    for (int r = 0; r < NR; r++) {
        const int i = r * blockDim.x + threadIdx.x;
        if (i < n) {
            a[r] = *(const float4 *)(src + 8 * i);
            b[r] = *(const float4 *)(src + 8 * i + 4);
        } else {
            a[r] = b[r] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        }
    }
#pragma unroll
    for (int r = 0; r < NR; r++) {
        const int i = r * blockDim.x + threadIdx.x;
        const float x[8] = {a[r].x, a[r].y, a[r].z, a[r].w, b[r].x, b[r].y, b[r].z, b[r].w};
        digit_item<BITS>(x, i < n, i >> 2, i & 3, dg);
    }
    __syncthreads();
}

/* c + the dot of 4 unsigned bytes a with 4 unsigned (uu) or signed (us)
 * bytes b. */
__device__ __forceinline__ int dp4a_uu(uint32_t a, uint32_t b, int c)
{
    int d;
    asm("dp4a.u32.u32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
}
__device__ __forceinline__ int dp4a_us(uint32_t a, uint32_t b, int c)
{
    int d;
    asm("dp4a.u32.s32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
}

/* stage_dot on the digits of chunk dc (DS words). */
template <int BITS, int DT, int R>
__device__ __forceinline__ void stage_idot(const mv_stage<BITS, R> &st, const uint32_t *dc, float *acc)
{
    uint32_t D[3][8];
#pragma unroll
    for (int k = 0; k < 3; k++) {
        const uint4 a = ((const uint4 *)dc)[2 * k], b = ((const uint4 *)dc)[2 * k + 1];
        D[k][0] = a.x, D[k][1] = a.y, D[k][2] = a.z, D[k][3] = a.w;
        D[k][4] = b.x, D[k][5] = b.y, D[k][6] = b.z, D[k][7] = b.w;
    }
    const uint4 f = ((const uint4 *)dc)[6];
    const float dx = __uint_as_float(f.x), sx = __uint_as_float(f.y);
#pragma unroll
    for (int i = 0; i < R; i++) {
        int s0 = 0, s1 = 0, s2 = 0;
#pragma unroll
        for (int j = 0; j < 8; j++) {
            uint32_t w;
            if constexpr (BITS == 4)
                w = j & 1 ? (st.w[i][j >> 1] >> 4) & 0x0F0F0F0Fu : st.w[i][j >> 1] & 0x0F0F0F0Fu;
            else
                w = st.w[i][j];
            s0 = dp4a_uu(w, D[0][j], s0);
            s1 = dp4a_uu(w, D[1][j], s1);
            s2 = dp4a_us(w, D[2][j], s2);
        }
        const float t = fmaf((float)s2, 65536.0f, (float)(s1 * 256 + s0));
        acc[i] += rawf_t<DT>(st.s[i]) * (dx * t) + rawf_t<DT>(st.b[i]) * sx;
    }
}

/* R sums, each over the warp, into v[0 .. R) of every lane: a butterfly
 * in which each exchange also halves the rows a lane carries (lanes with
 * bit 16 set keep the upper half of the rows and send the lower, then bit
 * 8 within those, ...), then each row's sum broadcast from a lane that
 * holds it: R = 4 takes 6 exchanges and 4 broadcasts instead of 20
 * exchanges.  Every row's sum adds the same pairs in the same order as
 * warp_sum, own value first, so the bits are warp_sum's. */
template <int R>
__device__ __forceinline__ void warp_sum_rows(const float *acc, float *v, int lane)
{
    if constexpr (R == 1) {
        v[0] = warp_sum(acc[0]);
    } else {
        float a[R];
#pragma unroll
        for (int i = 0; i < R; i++)
            a[i] = acc[i];
        int bit = 16;
#pragma unroll
        for (int h = R / 2; h >= 1; h /= 2, bit >>= 1) {
            const bool up = lane & bit;
#pragma unroll
            for (int i = 0; i < h; i++) {
                const float keep = up ? a[i + h] : a[i], send = up ? a[i] : a[i + h];
                a[i] = keep + __shfl_xor_sync(0xffffffffu, send, bit);
            }
        }
        for (; bit >= 1; bit >>= 1)
            a[0] += __shfl_xor_sync(0xffffffffu, a[0], bit);
#pragma unroll
        for (int i = 0; i < R; i++) {   /* row i's lane: its bits from bit 16 down */
            int src = 0;
#pragma unroll
            for (int h = R / 2, b = 16; h >= 1; h /= 2, b >>= 1)
                src |= (i & h) ? b : 0;
            v[i] = __shfl_sync(0xffffffffu, a[0], src);
        }
    }
}

/* The end of a warp's group: its R sums reduced over the warp and stored
 * (src.store), the accumulators cleared for the next group. */
template <int R, class Src>
__device__ __forceinline__ void group_done(Src &src, int64_t g, float *acc, int lane)
{
    float v[R];
    warp_sum_rows<R>(acc, v, lane);
#pragma unroll
    for (int i = 0; i < R; i++)
        acc[i] = 0.0f;
    src.store(g, v, lane);
}

/* The walk of one warp over its items: groups g0, g0 + gstride, ... < G,
 * each of ceil(nch / 32) steps (lane takes chunk 32 k + lane of step k).
 * PD items' loads are in flight ahead of the one being summed: with few
 * items a warp (the small matvecs of a layer), one step's loads at a time
 * leave the memory idle between a warp's round trips.  Src: locate(g)
 * points the load cursor at group g, load(c, stage) loads chunk c of its
 * rows, store(g, v, lane) writes group g's R reduced rows. */
template <int BITS, int R, int PD, class Src>
struct mv_walk {
    mv_stage<BITS, R> st[PD];   /* st[0]: the next item to sum */
    int64_t lg, gstride, G;      /* the next item to load: group lg, step lk */
    int lk, kc, nch, lane;
    __device__ __forceinline__ mv_walk(int64_t g0, int64_t gs, int64_t g_end, int n, int ln)
        : lg(g0), gstride(gs), G(g_end), lk(0), kc((n + 31) >> 5), nch(n), lane(ln) {}
    __device__ __forceinline__ void load_next(Src &src, mv_stage<BITS, R> &dst)
    {
        if (lg >= G)
            return;
        if (lk == 0)
            src.locate(lg);
        if (lk * 32 + lane < nch)
            src.load(lk * 32 + lane, dst);
        if (++lk == kc) {
            lk = 0;
            lg += gstride;
        }
    }
    /* the first PD items' loads: weights only, before the kernel waits
     * for its predecessor */
    __device__ __forceinline__ void prime(Src &src)
    {
#pragma unroll
        for (int d = 0; d < PD; d++)
            load_next(src, st[d]);
    }
    template <int DT, bool IX>
    __device__ __forceinline__ void run(Src &src, int64_t g, const float *xs, const float *sums, const uint32_t *dg)
    {
        int k = 0;
        float acc[R];
#pragma unroll
        for (int i = 0; i < R; i++)
            acc[i] = 0.0f;
        /* the digits of the item's token (src.xoff: several tokens' x
         * staged, as phase 1 of a batched step's experts) */
        const uint32_t *dgi = g < G ? dg + src.xoff(g, nch) : dg;
        while (g < G) {
            mv_stage<BITS, R> nx;
            load_next(src, nx);
            const int c = k * 32 + lane;
            if (c < nch) {
                if constexpr (IX)
                    stage_idot<BITS, DT, R>(st[0], dgi + c * DS, acc);
                else
                    stage_dot<BITS, DT, R>(st[0], xs + c * XS, sums[c], acc);
            }
            if (++k == kc) {
                group_done<R>(src, g, acc, lane);
                k = 0;
                g += gstride;
                if (g < G)
                    dgi = dg + src.xoff(g, nch);
            }
#pragma unroll
            for (int d = 0; d + 1 < PD; d++)
                st[d] = st[d + 1];
            st[PD - 1] = nx;
        }
    }
    /* run for T <= NT tokens (a batched decode step's rows): each step's
     * weights dotted with every token's digits (token t's at dg + t * nch
     * * DS), token t's sums stored through src.store(g, v, lane, t). */
    template <int DT, int NT>
    __device__ __forceinline__ void run_tokens(Src &src, int64_t g, const uint32_t *dg, int T)
    {
        int k = 0;
        float acc[NT][R];
#pragma unroll
        for (int t = 0; t < NT; t++)
#pragma unroll
            for (int i = 0; i < R; i++)
                acc[t][i] = 0.0f;
        while (g < G) {
            mv_stage<BITS, R> nx;
            load_next(src, nx);
            const int c = k * 32 + lane;
            if (c < nch) {
#pragma unroll
                for (int t = 0; t < NT; t++)
                    if (t < T)
                        stage_idot<BITS, DT, R>(st[0], dg + ((int64_t)t * nch + c) * DS, acc[t]);
            }
            if (++k == kc) {
#pragma unroll
                for (int t = 0; t < NT; t++) {
                    if (t >= T)
                        break;
                    float v[R];
#pragma unroll
                    for (int i = 0; i < R; i++) {
                        v[i] = warp_sum(acc[t][i]);
                        acc[t][i] = 0.0f;
                    }
                    src.store(g, v, lane, t);
                }
                k = 0;
                g += gstride;
            }
#pragma unroll
            for (int d = 0; d + 1 < PD; d++)
                st[d] = st[d + 1];
            st[PD - 1] = nx;
        }
    }
};

/* ---- the weights through shared memory (mv_ring) ---------------------------------
 *
 * mv_walk keeps a warp's next items in registers: one or two in flight a
 * warp, about 2 KB, as many as the registers allow, and ncu had the
 * streaming kernels' DRAM at a quarter of its peak with the warps waiting on
 * the first use of a loaded word.  mv_ring copies the items by cp.async into
 * a ring of D slots a warp in shared memory instead: D - 1 items in flight
 * while one is summed (about 8-12 KB a warp), and the first D - 1 asked for
 * before the kernel waits for its predecessor.  Each lane reads back only
 * what it copied itself, so its own wait_group is all the synchronisation
 * there is: no barrier.  A 16-bit scale or bias comes as the aligned 4-byte
 * word that holds it (never outside the tensor blob: the word starts at or
 * after the blob's 256-aligned start), and which half it is goes into a word
 * of the slot the lane writes itself.  MLXCEL_CUDA_RING=0: mv_walk. */
#ifndef MXC_RING_BYTES
#define MXC_RING_BYTES 12288
#endif
template <int BITS, int R>
struct ring_geom {
    static constexpr int WB = BITS * 128;      /* a row's words in a slot: 16 bytes a lane per 4 bits */
    static constexpr int SB = R * WB;          /* the scales' words, a lane's 4 bytes apart */
    static constexpr int BB = SB + R * 128;    /* the biases' */
    static constexpr int HB = BB + R * 128;    /* the lane's halves word: bit i for row i */
    static constexpr int SLOT = HB + 128;
    static constexpr int D0 = MXC_RING_BYTES / SLOT;
    static constexpr int D = D0 < 2 ? 2 : D0 > 8 ? 8 : D0;
    static constexpr int WARP_BYTES = D * SLOT;
    static constexpr int BLOCK_BYTES = WARPS * WARP_BYTES;
};

/* The ring's bytes of a block, on the host (0 without the ring). */
template <int BITS, int R, bool RING>
__host__ __device__ constexpr size_t ring_bytes(void)
{
    if constexpr (RING)
        return (size_t)ring_geom<BITS, R>::BLOCK_BYTES;
    else
        return 0;
}

/* A load's destination: one slot of a lane's ring. */
template <int BITS, int R>
struct ring_slot {
    unsigned s;      /* the slot's shared-memory address */
    int lane;
    uint32_t half;   /* bit i: row i's scale and bias are the high half of their word */
};

__device__ __forceinline__ void cp_async4(unsigned s, const void *gmem)
{
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(s), "l"(gmem) : "memory");
}

/* A group's R rows located once (ring_rows, at the group's first
 * step): each row's words and the words of its first group's scale and
 * bias, so that a chunk's copies are a few adds.  Worked out from the
 * matrix at every chunk (as load_chunk does for mv_walk), the addresses
 * took a fifth to a third of the streaming kernels' instructions (ncu's
 * source counters, docs/cuda.md, session 27). */
template <int R>
struct ring_rows {
    /* row i's words; the scale and bias (elements, 16 or 32 bits) of its
     * first group */
    const char *w[R], *s[R], *b[R];
    int gsh;   /* log2 of the chunks a group (all R rows: one group size) */
};

/* Rows r0 .. r0 + n - 1 of m as rows i0 .. i0 + n - 1 of rr; with CLAMP a
 * row past the matrix's last is the last again (a group's rows past the
 * end are loaded and never stored, as in load_chunk's callers).  32-bit
 * row numbers and strides (a row index and a row's bytes fit), so that a
 * row is one wide multiply and the next ones an add each. */
template <int BITS, int DT, int R, bool CLAMP>
__device__ __forceinline__ void ring_rows_of(const mxc_mat &m, int64_t r0l, int i0, int n, ring_rows<R> &rr)
{
    const uint32_t r0 = (uint32_t)r0l, nchm = (uint32_t)m.cols >> 5;
    const int gsh = __ffs(m.gs) - 6;
    const uint32_t wrow = nchm * (BITS * 4), srow = (nchm >> gsh) * (DT == MXC_F32 ? 4 : 2);
    const char *w = (const char *)m.w + (uint64_t)r0 * wrow, *sp = (const char *)m.s + (uint64_t)r0 * srow,
               *bp = (const char *)m.b + (uint64_t)r0 * srow;
    const uint32_t last = CLAMP ? (uint32_t)m.rows - 1u - r0 : (uint32_t)R;
    rr.gsh = gsh;
#pragma unroll
    for (int i = 0; i < R; i++) {
        if (i < i0 || i >= i0 + n)
            continue;
        const uint32_t k = CLAMP ? min((uint32_t)(i - i0), last) : (uint32_t)(i - i0);
        rr.w[i] = w + k * wrow;
        rr.s[i] = sp + k * srow;
        rr.b[i] = bp + k * srow;
    }
}

/* Chunk c of the located rows into a ring slot: the copies are issued,
 * nothing waits.  A 16-bit scale or bias comes as the aligned word that
 * holds it, which half from the scale's address: the scales' and biases'
 * tensors start 256-byte aligned (backend.c) and a row's scale and bias
 * sit at the same index, so both halves agree. */
template <int BITS, int DT, int R>
__device__ __forceinline__ void ring_load(const ring_rows<R> &rr, int c, ring_slot<BITS, R> &st)
{
    using G = ring_geom<BITS, R>;
    const uint32_t wo = (uint32_t)c * (BITS * 4), so = ((uint32_t)c >> rr.gsh) * (DT == MXC_F32 ? 4 : 2);
#pragma unroll
    for (int i = 0; i < R; i++) {
#pragma unroll
        for (int p = 0; p < BITS / 4; p++)
            cp_async16s(st.s + i * G::WB + p * 512 + st.lane * 16, rr.w[i] + wo + 16 * p);
        const unsigned ss = st.s + G::SB + i * 128 + st.lane * 4, bs = st.s + G::BB + i * 128 + st.lane * 4;
        const uintptr_t sa = (uintptr_t)(rr.s[i] + so), ba = (uintptr_t)(rr.b[i] + so);
        if constexpr (DT == MXC_F32) {
            cp_async4(ss, (const void *)sa);
            cp_async4(bs, (const void *)ba);
        } else {
            cp_async4(ss, (const void *)(sa & ~(uintptr_t)3));
            cp_async4(bs, (const void *)(ba & ~(uintptr_t)3));
            st.half |= (((uint32_t)sa >> 1) & 1u) << i;
        }
    }
}

/* A slot back into registers, as load_chunk would have left them. */
template <int BITS, int DT, int R>
__device__ __forceinline__ void ring_read(const unsigned char *slot, int lane, mv_stage<BITS, R> &st)
{
    using G = ring_geom<BITS, R>;
    const uint32_t half = *(const uint32_t *)(slot + G::HB + lane * 4);
#pragma unroll
    for (int i = 0; i < R; i++) {
#pragma unroll
        for (int p = 0; p < BITS / 4; p++) {
            const uint4 v = *(const uint4 *)(slot + i * G::WB + p * 512 + lane * 16);
            st.w[i][4 * p] = v.x, st.w[i][4 * p + 1] = v.y, st.w[i][4 * p + 2] = v.z, st.w[i][4 * p + 3] = v.w;
        }
        if constexpr (DT != MXC_F32) {   /* the half of each word, read as such */
            const unsigned char *q = slot + lane * 4 + ((half >> i) & 1u) * 2;
            st.s[i] = *(const unsigned short *)(q + G::SB + i * 128);
            st.b[i] = *(const unsigned short *)(q + G::BB + i * 128);
        } else {
            st.s[i] = *(const uint32_t *)(slot + G::SB + i * 128 + lane * 4);
            st.b[i] = *(const uint32_t *)(slot + G::BB + i * 128 + lane * 4);
        }
    }
}

/* mv_walk's walk (the integer kernels) with the items through the ring:
 * ring points at this warp's WARP_BYTES of shared memory. */
template <int BITS, int R, class Src>
struct mv_ring {
    using G = ring_geom<BITS, R>;
    unsigned char *ring;
    unsigned sring;
    ring_rows<R> rr;           /* the rows of group lg */
    int64_t lg, gstride, Gn;   /* the next item to load: group lg, step lk */
    int lk, kc, nch, lane, head;
    __device__ __forceinline__ mv_ring(int64_t g0, int64_t gs, int64_t g_end, int n, int ln, unsigned char *r)
        : ring(r), sring((unsigned)__cvta_generic_to_shared(r)), lg(g0), gstride(gs), Gn(g_end), lk(0),
          kc((n + 31) >> 5), nch(n), lane(ln), head(0) {}
    /* one item's copies into slot head, as one commit group (empty past the end) */
    __device__ __forceinline__ void load_next(Src &src)
    {
        if (lg < Gn) {
            if (lk == 0) {
                src.locate(lg);
                src.fill(rr);
            }
            if (lk * 32 + lane < nch) {
                ring_slot<BITS, R> sl{sring + (unsigned)(head * G::SLOT), lane, 0u};
                ring_load<BITS, Src::dt, R>(rr, lk * 32 + lane, sl);
                *(uint32_t *)(ring + head * G::SLOT + G::HB + lane * 4) = sl.half;
            }
            if (++lk == kc) {
                lk = 0;
                lg += gstride;
            }
        }
        asm volatile("cp.async.commit_group;" ::: "memory");
        head = head + 1 == G::D ? 0 : head + 1;
    }
    /* the first D - 1 items' copies: weights only, before the kernel
     * waits for its predecessor */
    __device__ __forceinline__ void prime(Src &src)
    {
#pragma unroll
        for (int d = 0; d + 1 < G::D; d++)
            load_next(src);
    }
    /* the same in two parts: all but the last P (prime_pre) before the
     * wait, those P (prime_post) once the kernel has staged its input
     * (the ring's state after both is prime's) */
    template <int P>
    __device__ __forceinline__ void prime_pre(Src &src)
    {
#pragma unroll
        for (int d = P < G::D - 1 ? P : G::D - 1; d + 1 < G::D; d++)
            load_next(src);
    }
    template <int P>
    __device__ __forceinline__ void prime_post(Src &src)
    {
#pragma unroll
        for (int d = 0; d < (P < G::D - 1 ? P : G::D - 1); d++)
            load_next(src);
    }
    template <int DT, bool IX>
    __device__ __forceinline__ void run(Src &src, int64_t g, const float *, const float *, const uint32_t *dg)
    {
        static_assert(IX, "the ring feeds the integer kernels");
        int k = 0, tail = 0;
        float acc[R];
#pragma unroll
        for (int i = 0; i < R; i++)
            acc[i] = 0.0f;
        const uint32_t *dgi = g < Gn ? dg + src.xoff(g, nch) : dg;
        while (g < Gn) {
            load_next(src);
            asm volatile("cp.async.wait_group %0;" ::"n"(G::D - 1) : "memory");
            const int c = k * 32 + lane;
            if (c < nch) {
                mv_stage<BITS, R> st;
                ring_read<BITS, DT, R>(ring + tail * G::SLOT, lane, st);
                stage_idot<BITS, DT, R>(st, dgi + c * DS, acc);
            }
            if (++k == kc) {
                group_done<R>(src, g, acc, lane);
                k = 0;
                g += gstride;
                if (g < Gn)
                    dgi = dg + src.xoff(g, nch);
            }
            tail = tail + 1 == G::D ? 0 : tail + 1;
        }
        asm volatile("cp.async.wait_group 0;" ::: "memory");
    }
};

/* Up to 4 matrices against one x: groups of R consecutive rows of each. */
template <int BITS, int DT, int R>
struct mv_src {
    const mxc_mv &mv;
    int li;
    int64_t lr0;
    __device__ mv_src(const mxc_mv &m) : mv(m), li(0), lr0(0) {}
    __device__ __forceinline__ void where(int64_t g, int &i, int64_t &r0) const
    {
        i = 0;
        while (i < mv.n - 1 && g >= (mv.m[i].rows + R - 1) / R)
            g -= (mv.m[i++].rows + R - 1) / R;
        r0 = g * R;
    }
    static constexpr int dt = DT;
    __device__ __forceinline__ void locate(int64_t g) { where(g, li, lr0); }
    __device__ __forceinline__ int64_t xoff(int64_t, int) const { return 0; }   /* one x */
    __device__ __forceinline__ void fill(ring_rows<R> &rr) const
    {
        ring_rows_of<BITS, DT, R, true>(mv.m[li], lr0, 0, R, rr);
    }
    template <class ST>
    __device__ __forceinline__ void load(int c, ST &st)
    {
        const mxc_mat &m = mv.m[li];
#pragma unroll
        for (int i = 0; i < R; i++)
            load_chunk<BITS, DT, R>(m, min(lr0 + i, m.rows - 1), c, st, i);
    }
    /* token t's row (0: the only one) of group g */
    __device__ __forceinline__ void store(int64_t g, const float *v, int lane, int t = 0)
    {
        if (lane >= R)
            return;
        int oi;
        int64_t or0;
        where(g, oi, or0);
        const mxc_mat &m = mv.m[oi];
        float *y = mv.y[oi] + (int64_t)t * mv.ldy[oi];
#pragma unroll
        for (int i = 0; i < R; i++)
            if (lane == i && or0 + i < m.rows)
                y[or0 + i] = v[i] + (m.bias ? m.bias[or0 + i] : 0.0f);
    }
};

/* How many items' loads a warp keeps in flight: 2 where the registers
 * allow (the integer kernels; 4 rows of 4 bits, or 2 of 8, take 1: lm_head
 * spills with 2, and phase 1 measured the same with 1 and 2). */
#ifndef MXC_DEPTH2_MAX
#define MXC_DEPTH2_MAX 8
#endif
template <int BITS, int R, bool IX>
struct mv_depth {
    static constexpr int v = IX && R * BITS <= MXC_DEPTH2_MAX ? 2 : 1;
};

/* A flag between blocks of one launch: raised by a store-release, waited
 * for by relaxed loads and one fence after it is seen (a load-acquire in
 * the loop invalidates the SM's L1 at every try, which the other warps of
 * the SM pay for: ncu had it at 40 % of the stall samples). */
__device__ __forceinline__ void flag_set(int *f, int v)
{
    asm volatile("st.release.gpu.global.b32 [%0], %1;" ::"l"(f), "r"(v) : "memory");
}

__device__ __forceinline__ void flag_raise(int *f) { flag_set(f, 1); }

/* Until *f is v (a flag that holds the step's count: mxc_route's h_flag,
 * r_flag); the loads after it see what was written before the set. */
__device__ __forceinline__ void flag_wait_for(const int *f, int v)
{
    int u;
    for (;;) {
        asm volatile("ld.relaxed.gpu.global.b32 %0, [%1];" : "=r"(u) : "l"(f) : "memory");
        if (u == v)
            break;
        __nanosleep(64);
    }
    asm volatile("fence.acq_rel.gpu;" ::: "memory");
}

/* Step ep's routes, up to 4 experts a byte each, once the 64-bit word at
 * r_flag holds them (mxc_route's r_pack: the step's count in the high
 * half), as o_proj's last block stores it: relaxed loads, the word itself
 * is the data, so no fence. */
__device__ __forceinline__ uint32_t route_word_wait(const int *r_flag, int ep)
{
    unsigned long long v;
    for (;;) {
        asm volatile("ld.relaxed.gpu.global.b64 %0, [%1];" : "=l"(v) : "l"(r_flag) : "memory");
        if ((int)(v >> 32) == ep)
            break;
        __nanosleep(64);
    }
    return (uint32_t)v;
}

__device__ __forceinline__ void flag_wait(const int *f)
{
    int v;
    for (;;) {
        asm volatile("ld.relaxed.gpu.global.b32 %0, [%1];" : "=r"(v) : "l"(f) : "memory");
        if (v)
            break;
        __nanosleep(256);
    }
    asm volatile("fence.acq_rel.gpu;" ::: "memory");
}

/* A warp's walk: mv_ring (RING, over the warp's ring at r) or mv_walk. */
template <class W, bool RING>
__device__ __forceinline__ W make_walk(int64_t g0, int64_t gs, int64_t g_end, int n, int ln, unsigned char *r)
{
    if constexpr (RING)
        return W(g0, gs, g_end, n, ln, r);
    else
        return W(g0, gs, g_end, n, ln);
}

/* A streaming kernel's input staged in shared memory: x itself or the
 * norm nin of the residual stream (has_nin), as floats with chunk sums
 * (xs, sums) or as digits (dg, IX). */
template <int BITS, bool IX, int CL = 1>
__device__ __forceinline__ void stage_input(const float *x, const mxc_norm_in &nin, int has_nin, int nch, float *xs,
                                            float *sums, uint32_t *dg, const unsigned long long *dtag = nullptr,
                                            unsigned tag = 0)
{
    if constexpr (CL > 1) {   /* launched so only with nin, IX and an RMSNorm stage_norm_cl takes */
        stage_norm_cl<CL>(nin, nch * 32, xs, dtag, tag);
        stage_digits<BITS>(xs, XS, nch, dg);
        return;
    }
    if (IX && has_nin) {
        stage_norm(nin, nch * 32, xs, nullptr, dtag, tag);
        stage_digits<BITS>(xs, XS, nch, dg);
    } else if (IX) {
        stage_digits<BITS>(x, 32, nch, dg);
    } else if (has_nin) {
        stage_norm(nin, nch * 32, xs, sums, dtag, tag);
    } else {
        stage_x(x, nch, xs, sums);
    }
}

/* The streaming matvec as block blk of nblk: k_mvs, and the router blocks
 * of k_moe1r.  With cnt, the last of the nblk blocks to finish routes the
 * token (threadFenceReduction) and raises rt.ready when it is not NULL. */
template <int BITS, int DT, int R, bool IX, bool RING = false, int CL = 1>
__device__ __forceinline__ void mvs_blocks(const mxc_mv &mv, const float *x, int64_t G, int nch, const mxc_norm_in &nin,
                                           int has_nin, const mxc_route &rt, int *cnt, int blk, int nblk)
{
    __shared__ int last;
    extern __shared__ float4 smem_f4[];
    unsigned char *ring = (unsigned char *)smem_f4;   /* RING: the warps' rings first */
    uint32_t *dg = (uint32_t *)(ring + ring_bytes<BITS, R, RING>());
    float *xs = (float *)(dg + (IX ? nch * DS : 0)), *sums = xs + nch * XS;
    pdl_go();
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int64_t g = (int64_t)blk * WARPS + warp, gstride = (int64_t)nblk * WARPS;
    mv_src<BITS, DT, R> src(mv);
    using Walk = std::conditional_t<RING, mv_ring<BITS, R, mv_src<BITS, DT, R>>,
                                    mv_walk<BITS, R, mv_depth<BITS, R, IX>::v, mv_src<BITS, DT, R>>>;
    Walk walk = make_walk<Walk, RING>(g, gstride, G, nch, lane, ring + (RING ? warp * ring_bytes<BITS, R, RING>() / WARPS : 0));
    walk.prime(src);   /* weights only: nothing an earlier kernel writes */
    pdl_wait();
    if (mv.early)
        pdl_trigger();
    stage_input<BITS, IX, CL>(x, nin, has_nin, nch, xs, sums, dg);
    STAMP_AT(5);
    walk.template run<DT, IX>(src, g, xs, sums, dg);
    pdl_trigger();
    if (!cnt)
        return;
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0)
        last = atomicAdd(cnt, 1) == nblk - 1;
    __syncthreads();
    if (last) {
        __threadfence();
        if (warp == 0)
            route_small(rt, lane);
        if (threadIdx.x == 0)
            *cnt = 0;
        __syncthreads();
        if (rt.ready && threadIdx.x == 0) {   /* the routes for the expert blocks of the launch */
            __threadfence();
            flag_raise(rt.ready);
        }
    }
}

template <int BITS, int DT, int R, bool IX, bool RING = false, int CL = 1>
__global__ void __launch_bounds__(THREADS, 2) k_mvs(const __grid_constant__ mxc_mv mv, const float *x, int64_t G, int nch,
                                                   const __grid_constant__ mxc_norm_in nin, int has_nin,
                                                   const __grid_constant__ mxc_route rt, int *cnt)
{
    STAMP(1 + 16 * R);
    mvs_blocks<BITS, DT, R, IX, RING, CL>(mv, x, G, nch, nin, has_nin, rt, cnt, blockIdx.x, gridDim.x);
}

/* ---- one token's router folded into o_proj (mxc_rpart) ------------------------------
 *
 * The router of a one-token step reads rmsnorm(x + y), y the o_proj output
 * just made, and an RMSNorm is one scalar (1 / rms) times w * (x + y).  So
 * the router's logits are 1 / rms times sum_j W[e][j] w[j] (x[j] + y[j]),
 * a sum over the rows of y that o_proj's blocks each have part of: every
 * block adds up its own rows' terms (and their squares) once its rows are
 * stored, the launch's last block adds the blocks' partials in block order
 * (the same bits every run), scales them by 1 / rms and routes, as the
 * router launch's last block did.  That launch (61 rows on 8 SMs, each
 * staging the whole norm; about 11 us of a 61 us qwen1.5 layer) is gone. */

/* Router row e of rv: matrix *mi, its row *lr. */
__device__ __forceinline__ void rp_locate(const mxc_mv &rv, int e, int *mi, int64_t *lr)
{
    int i = 0;
    int64_t r = e;
    while (i < rv.n - 1 && r >= rv.m[i].rows)
        r -= rv.m[i++].rows;
    *mi = i;
    *lr = r;
}

/* A block's rows of y: WARPS x R consecutive ones, each warp one group of
 * R (the launch has a group for every warp: launch_mvs_rp), inside one
 * quantization group of the router's columns.  Thread e < E keeps router
 * row e's words of those columns (at most 8: 32 columns of 8 bits) and
 * their scale and bias, loaded before the walk (nothing an earlier kernel
 * writes), in registers across it. */
#define RP_WORDS 8
struct rp_row {
    uint32_t w[RP_WORDS];
    float s, b;
    float x, nw;   /* warp 0, lane c < WARPS x R: the residual and the norm's weight at row c */
    int ep;        /* thread 0 (warp 0 with rt.y_tag), with rt.h_flag: the step's count for the flags */
};

template <int R>
__device__ __forceinline__ void rp_load(const mxc_rpart &rp, const mxc_route &rt, rp_row &k)
{
    constexpr int span = WARPS * R;
    const int e = threadIdx.x;
    const int64_t c0 = (int64_t)blockIdx.x * span;
    /* the embedding's count (complete: launches back), here rather than
     * where the last block raises its flags: a round trip less there */
    k.ep = (e == 0 || (rt.y_tag && e < 32)) && rt.h_flag ? __ldcg(rt.epoch) : 0;
    /* x: q/k/v's block 0 wrote it two launches back (complete) */
    if (e < span && c0 + e < rp.rows) {
        k.x = __ldcg(rp.x + c0 + e);
        k.nw = __ldg(rp.w + c0 + e);
    }
    if (e >= rp.E)
        return;
    int mi;
    int64_t lr;
    rp_locate(rp.rv, e, &mi, &lr);
    const mxc_mat &m = rp.rv.m[mi];
    const int nw = span * m.bits / 32;
    const uint32_t *w = (const uint32_t *)m.w + (lr * m.cols + c0) * m.bits / 32;
#pragma unroll
    for (int i = 0; i < RP_WORDS; i++)
        k.w[i] = i < nw && c0 + (i + 1) * 32 / m.bits <= m.cols ? __ldg(w + i) : 0u;
    const int64_t gi = lr * (m.cols / m.gs) + c0 / m.gs;
    k.s = ldf(m.s, m.dt, gi);
    k.b = ldf(m.b, m.dt, gi);
}

/* The logits of rp's router rows into lg[0 .. E): the nblk blocks'
 * partials summed in block order, times 1 / rms (from their sums of
 * squares), plus the bias, also into rv's outputs.  Every thread of the
 * block calls it; part: THREADS floats of shared memory. */
__device__ __forceinline__ void rp_logits(const mxc_rpart &rp, int nblk, float *part, float *lg)
{
    constexpr int NB = 32;   /* partials a thread asks for at once (64, one round for 256 blocks,
                                was not faster: docs/cuda.md, session 17) */
    __shared__ float rnorm;
    const int E = rp.E, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    /* Q threads a router row, thread q of them the blocks q, q + Q, ...,
     * NB loads in flight at a time; then the Q sums in order */
    const int Q = THREADS / E >= WARPS ? WARPS : THREADS / E;
    if (threadIdx.x < E * Q) {
        const int e = threadIdx.x % E, q = threadIdx.x / E;
        float s = 0.0f;
        for (int b0 = q; b0 < nblk; b0 += NB * Q) {
            float v[NB];
#pragma unroll
            for (int u = 0; u < NB; u++) {
                const int b = b0 + u * Q;
                v[u] = b < nblk ? __ldcg(rp.part + (int64_t)b * E + e) : 0.0f;
            }
#pragma unroll
            for (int u = 0; u < NB; u++)
                s += v[u];
        }
        part[q * E + e] = s;
    }
    if (warp == 0) {
        double s = 0.0;
        for (int b0 = lane; b0 < nblk; b0 += 8 * 32) {
            double v[8];
#pragma unroll
            for (int u = 0; u < 8; u++)
                v[u] = b0 + 32 * u < nblk ? __ldcg(rp.ss + b0 + 32 * u) : 0.0;
#pragma unroll
            for (int u = 0; u < 8; u++)
                s += v[u];
        }
#pragma unroll
        for (int o = 16; o; o >>= 1)
            s += __shfl_xor_sync(0xffffffffu, s, o);
        if (lane == 0)
            rnorm = 1.0f / sqrtf((float)(s / (double)rp.rows) + rp.eps);
    }
    __syncthreads();
    if (threadIdx.x < E) {
        float s = 0.0f;
        for (int q = 0; q < Q; q++)
            s += part[q * E + threadIdx.x];
        int mi;
        int64_t lr;
        rp_locate(rp.rv, threadIdx.x, &mi, &lr);
        const float *bias = rp.rv.m[mi].bias;
        lg[threadIdx.x] = rnorm * s + (bias ? bias[lr] : 0.0f);
        rp.rv.y[mi][lr] = lg[threadIdx.x];   /* for nothing in this step (a trace, a test) */
    }
    __syncthreads();
}

/* After the walk: the block's partial of every router row (thread e) and
 * of the squares, then the launch's last block's logits and routes (rt, cnt as mvs_blocks'). */
template <int R, bool RK>
__device__ __forceinline__ void rp_finish(const mxc_mv &mv, const mxc_rpart &rp, const mxc_route &rt, int *cnt,
                                          const rp_row &k)
{
    constexpr int span = WARPS * R;   /* at most 32: one warp's lanes */
    __shared__ float gh[span];
    __shared__ float part[THREADS];
    __shared__ float lg[THREADS];   /* the logits, for route_small */
    __shared__ int last;
    const int E = rp.E, warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nblk = gridDim.x;
    const int64_t rows = mv.m[0].rows, c0 = (int64_t)blockIdx.x * span;
    __syncthreads();   /* every warp's rows of y stored */
    if (warp == 0) {
        double ss = 0.0;
        if (lane < span) {
            float v = 0.0f;
            if (c0 + lane < rows) {
                const float y = mv.y[0][c0 + lane], h = k.x + y;
                if (rt.y_tag)   /* phase 1 stages its norm from these, no flag */
                    st_tagged(rt.y_tag + c0 + lane, y, (unsigned)k.ep * rt.tag_mul + rt.tag_id);
                if (rp.x_out)
                    rp.x_out[c0 + lane] = h;
                ss = (double)h * h;
                v = k.nw * h;
            }
            gh[lane] = v;
        }
#pragma unroll
        for (int o = 16; o; o >>= 1)
            ss += __shfl_xor_sync(0xffffffffu, ss, o);
        if (lane == 0)
            rp.ss[blockIdx.x] = ss;
    }
    __syncthreads();
    if (threadIdx.x < E) {
        int mi;
        int64_t lr;
        rp_locate(rp.rv, threadIdx.x, &mi, &lr);
        float a = 0.0f;
        if (rp.rv.m[mi].bits == 8) {   /* constant word indices: k.w stays in registers */
#pragma unroll
            for (int c = 0; c < span; c++)
                a = fmaf(fmaf(k.s, (float)((k.w[c / 4] >> ((c % 4) * 8)) & 255u), k.b), gh[c], a);
        } else {
#pragma unroll
            for (int c = 0; c < span; c++)
                a = fmaf(fmaf(k.s, (float)((k.w[c / 8] >> ((c % 8) * 4)) & 15u), k.b), gh[c], a);
        }
        rp.part[(int64_t)blockIdx.x * E + threadIdx.x] = a;
    }
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0)
        last = atomicAdd(cnt, 1) == nblk - 1;
    __syncthreads();
    STAMP_AT(6);
    if (!last)
        return;
    __threadfence();
    /* every block's rows of the residual are in: phase 1 may stage its norm
     * (rt.h_late, measuring: once the logits are made) */
    const int ep = k.ep;   /* thread 0's, the one that raises the flags */
    if (rt.h_flag && !rt.h_late && threadIdx.x == 0)
        flag_set(rt.h_flag, ep);
    rp_logits(rp, nblk, part, lg);
    if (rt.h_flag && rt.h_late && threadIdx.x == 0)
        flag_set(rt.h_flag, ep);
    STAMP_AT(7);
    uint32_t pk = 0;
    const float *gl = rt.glog && rt.E < E ? lg + rt.E : nullptr;   /* the router's rows first, then the gate's */
    const bool ranked = RK && route_rank(rt, lg, gl, &pk);
    if (!ranked && warp == 0)
        route_small(rt, lane, lg, gl, &pk);
    if (threadIdx.x == 0)
        *cnt = 0;
    if (rt.r_flag && rt.r_pack) {
        /* the routes inside the flag: one relaxed 64-bit store, nothing
         * to order before it (phase 2 reads P and W after this launch) */
        if (threadIdx.x == 0) {
            const unsigned long long v = (unsigned long long)(unsigned)ep << 32 | pk;
            asm volatile("st.relaxed.gpu.global.b64 [%0], %1;" ::"l"(rt.r_flag), "l"(v) : "memory");
        }
    } else if (rt.r_flag) {   /* the routes (warp 0's stores) for phase 1's routed rows */
        __syncthreads();
        if (threadIdx.x == 0) {
            __threadfence();
            flag_set(rt.r_flag, ep);
        }
    }
}

template <int BITS, int DT, int R, bool RK>
__global__ void __launch_bounds__(THREADS, 2) k_mvs_rp(const __grid_constant__ mxc_mv mv, const float *x, int64_t G,
                                                      int nch, const __grid_constant__ mxc_rpart rp,
                                                      const __grid_constant__ mxc_route rt, int *cnt)
{
    STAMP(2);
    rp_row k;
    rp_load<R>(rp, rt, k);
    const mxc_norm_in no = {};
    mvs_blocks<BITS, DT, R, true, true>(mv, x, G, nch, no, 0, rt, nullptr, blockIdx.x, gridDim.x);
    rp_finish<R, RK>(mv, rp, rt, cnt, k);
}

/* mxc_matvec of 2 .. NT tokens (a batched decode step's rows) as k_mvs
 * walks one: the digits of every token's x staged once per block, each
 * row group's weights loaded once and dotted with all of them.  (The
 * float k_matvec read x from global memory for every chunk and token: 92
 * us a launch on average in a batch-8 step, against 12 for k_mvs.) */
template <int BITS, int DT, int R, int NT>
__global__ void __launch_bounds__(THREADS, 2) k_mvt(const __grid_constant__ mxc_mv mv, const float *X, int64_t ldx,
                                                   int T, int64_t G, int nch)
{
    extern __shared__ float4 smem_f4[];
    uint32_t *dg = (uint32_t *)smem_f4;
    pdl_go();
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int64_t g = (int64_t)blockIdx.x * WARPS + warp, gstride = (int64_t)gridDim.x * WARPS;
    mv_src<BITS, DT, R> src(mv);
    mv_walk<BITS, R, mv_depth<BITS, R, true>::v, mv_src<BITS, DT, R>> walk(g, gstride, G, nch, lane);
    walk.prime(src);   /* weights only: nothing an earlier kernel writes */
    pdl_wait();
    for (int t = 0; t < T; t++)
        stage_digits<BITS>(X + t * ldx, 32, nch, dg + (int64_t)t * nch * DS);
    walk.template run_tokens<DT, NT>(src, g, dg, T);
    pdl_trigger();
}

/* Phase 1: groups of two h rows of one slot (gate rows r, r + 1 then up
 * rows r, r + 1); h = act(g) * u. */
template <int BITS, int DT, bool MT = false, bool PK = false>
struct moe1_src {
    const mxc_moe1 &p;
    mxc_mat *sm;
    int lj;
    int64_t lr;
    int shift, G;   /* group g is group (g + shift) mod G of the slots' rows (extras_first) */
    int ep, rw;     /* p.r_flag: the step's count; rw: this warp's sm has no routed slot yet */
    __device__ moe1_src(mxc_mat *s, const mxc_moe1 &q, int sh = 0, int g = 0, int e = 0, bool w = false)
        : p(q), sm(s), lj(q.lo), lr(0), shift(sh), G(g), ep(e), rw(w) {}
    /* The routes, once o_proj's last block has them: the routed slots'
     * gate and up matrices into this warp's own sm (lane-parallel 8-byte
     * words; the other warps of the block may still be on extra slots). */
    __device__ __forceinline__ void routes(void)
    {
        static_assert(sizeof(mxc_mat) % 8 == 0, "a lane copies 8 bytes");
        constexpr int NW = (int)sizeof(mxc_mat) / 8;
        const int lane = threadIdx.x & 31, n = 2 * (p.n_routed - p.lo) * NW;
        if constexpr (PK) {   /* the routes in the flag's word (slots lo = 0 .. 3; p.r_pack) */
            static_assert(2 * 4 * NW <= 64, "a lane copies at most two words");
            /* with the experts one stride apart, each lane's words of
             * expert 0's matrices and their strides (parameters) are asked
             * for before the wait for the word: one round trip, not two */
            uint64_t bw[2] = {0, 0};
            int64_t bs[2] = {0, 0};
            if (p.estride & 2) {
#pragma unroll
                for (int u = 0; u < 2; u++) {
                    const int i = lane + 32 * u, m = i / NW, q = i % NW;
                    if (i < n) {
                        bw[u] = ((const uint64_t *)(p.e0 + m % 2))[q];
                        bs[u] = q < 3 ? p.estr[m % 2][q] : 0;
                    }
                }
            }
            uint32_t ids = 0;
            if (lane == 0) {
                ids = route_word_wait(p.r_flag, ep);
            }
            ids = __shfl_sync(0xffffffffu, ids, 0);
#pragma unroll
            for (int u = 0; u < 2; u++) {
                const int i = lane + 32 * u, m = i / NW, q = i % NW;
                if (i < n) {
                    const int id = (int)(ids >> (8 * (p.lo + m / 2))) & 255;
                    ((uint64_t *)(sm + m))[q] = (p.estride & 2) ? bw[u] + (uint64_t)(id * bs[u])
                                                          : ((const uint64_t *)(p.table + 3 * id + m % 2))[q];
                }
            }
        } else {
            if (lane == 0)
                flag_wait_for(p.r_flag, ep);
            __syncwarp();
            for (int i = lane; i < n; i += 32) {
                const int m = i / NW;
                ((uint64_t *)(sm + m))[i % NW] = ((const uint64_t *)(p.table + 3 * __ldcg(p.P + p.lo + m / 2) + m % 2))[i % NW];
            }
        }
        __syncwarp();
        rw = 0;
    }
    __device__ __forceinline__ int64_t at(int64_t g) const
    {
        const int gg = (int)g + shift;
        return gg >= G && shift ? gg - G : gg;
    }
    __device__ __forceinline__ void locate(int64_t g)
    {
        const int64_t lgr = p.off[p.lo] + 2 * at(g);
        if (lgr < p.off[lj])   /* wrapped round to the routed slots */
            lj = p.lo;
        while (lgr >= p.off[lj + 1])
            lj++;
        lr = lgr - p.off[lj];
        if (rw && lj < p.n_routed)
            routes();
    }
    /* the digits of group g's token: with MT (p.kp > 0), slot j is token
     * (j - lo) / kp's, whose x was staged t * nch * DS words in; a
     * compile-time 0 for one token, so that the one-token kernel is the
     * same code (the search costs it registers: 16 bytes of spills) */
    __device__ __forceinline__ int64_t xoff(int64_t g, int nch) const
    {
        if constexpr (!MT)
            return 0;
        const int64_t gr = p.off[p.lo] + 2 * g;
        int j = p.lo;
        while (gr >= p.off[j + 1])
            j++;
        return (int64_t)((j - p.lo) / p.kp) * nch * DS;
    }
    static constexpr int dt = DT;
    __device__ __forceinline__ void fill(ring_rows<4> &rr) const
    {
        const mxc_mat &gm = sm[2 * (lj - p.lo)], &um = sm[2 * (lj - p.lo) + 1];
        ring_rows_of<BITS, DT, 4, false>(gm, lr, 0, 2, rr);
        ring_rows_of<BITS, DT, 4, false>(um, lr, 2, 2, rr);
    }
    template <class ST>
    __device__ __forceinline__ void load(int c, ST &st)
    {
        const mxc_mat &gm = sm[2 * (lj - p.lo)], &um = sm[2 * (lj - p.lo) + 1];
        load_chunk<BITS, DT, 4>(gm, lr, c, st, 0);
        load_chunk<BITS, DT, 4>(gm, lr + 1, c, st, 1);
        load_chunk<BITS, DT, 4>(um, lr, c, st, 2);
        load_chunk<BITS, DT, 4>(um, lr + 1, c, st, 3);
    }
    __device__ __forceinline__ void store(int64_t g, const float *v, int lane)
    {
        /* lanes 0 and 1 together: one pass through glu, not two */
        const int64_t ogr = p.off[p.lo] + 2 * at(g);
        const float gv = lane ? v[1] : v[0], uv = lane ? v[3] : v[2];
        if (lane < 2)
            p.h[ogr + lane] = glu(p.act, gv, uv);
    }
};

/* Of phase 1's first ring items (asked for before it waits for o_proj's
 * rows), the last MXC_MOE1_POST are asked for once it has staged the FFN
 * norm instead, so that the staging's loads queue behind fewer of them:
 * 1 of 2 measured 835.5-836.2 tok/s against 830.5-831.2 with none
 * (docs/cuda.md, session 22; a runtime count instead cost every kernel
 * that took it more than it gained). */
#ifndef MXC_MOE1_POST
#define MXC_MOE1_POST 1
#endif
template <int BITS, int DT, bool IX, bool MT = false, bool RING = false, int CL = 1, bool PK = false>
__global__ void __launch_bounds__(THREADS, 2) k_moe1s(const __grid_constant__ mxc_moe1 p, int64_t G)
{
    STAMP(4);
    __shared__ mxc_mat sm[2 * MXC_MAX_SLOTS];
    extern __shared__ float4 smem_f4[];
    const int nch = (int)(p.d >> 5);
    unsigned char *ring = (unsigned char *)smem_f4;
    uint32_t *dg = (uint32_t *)(ring + ring_bytes<BITS, 4, RING>());
    float *xs = (float *)(dg + (IX ? nch * DS : 0)), *sums = xs + nch * XS;
    const bool pre = RING && !MT && p.extras_first;
    /* fl (pre with p.h_flag): no wait for o_proj's launch to end.  The
     * extra slots' rows once o_proj's rows are in (*h_flag), a warp's routed
     * ones once the routes are (*r_flag); each warp has its own copy of the
     * slots' matrices (the host makes sure WARPS of them fit in sm) */
    const bool fl = pre && p.h_flag;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, ns2 = 2 * (p.hi - p.lo);
    const int ep = fl ? __ldcg(p.epoch) : 0;   /* the embedding's, launches back: complete */
    int64_t shift = 0;
    if (pre) {   /* the extra slots' matrices: no route needed */
        const int nx = (p.hi - p.n_routed) * 2;
        for (int i = threadIdx.x; i < nx * (fl ? WARPS : 1); i += blockDim.x) {
            const int j = p.n_routed + i % nx / 2;
            sm[i / nx * ns2 + 2 * (j - p.lo) + i % 2] = p.table[3 * (p.kind0 + j - p.n_routed) + i % 2];
        }
        __syncthreads();
        shift = (p.off[p.n_routed] - p.off[p.lo]) / 2;
    } else {
        pdl_enter();
        load_slots(p, sm, 0, 2);
    }
    const int64_t g = (int64_t)blockIdx.x * WARPS + warp, gstride = (int64_t)gridDim.x * WARPS;
    using Src = moe1_src<BITS, DT, MT, PK>;
    Src src(sm + (fl ? warp * ns2 : 0), p, (int)shift, (int)G, ep, fl);
    using Walk = std::conditional_t<RING, mv_ring<BITS, 4, Src>, mv_walk<BITS, 4, mv_depth<BITS, 4, IX>::v, Src>>;
    Walk walk = make_walk<Walk, RING>(g, gstride, G, nch, lane, ring + (RING ? warp * ring_bytes<BITS, 4, RING>() / WARPS : 0));
    /* the first weights in flight while x is staged; with pre, before the
     * wait where the warp's first group is an extra slot's and holds all
     * the primed items (the next group may be a routed slot's) */
    bool early = !pre;
    if constexpr (RING)
        early = early || (g + shift < G && ring_geom<BITS, 4>::D - 1 <= ((nch + 31) >> 5));
    if (early) {
        if constexpr (RING)
            walk.template prime_pre<MXC_MOE1_POST>(src);
        else
            walk.prime(src);
    }
    if (fl) {
        if constexpr (PK) {   /* (phase 2 takes the routes from the flag's word, not the routes' array) */
            if (c_moe1_go)
                asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
        }
        if (threadIdx.x == 0 && !p.y_tag) {   /* (with y_tag each value comes with its tag) */
            STAMP_AT(1);
            flag_wait_for(p.h_flag, ep);
            STAMP_AT(2);
        }
        __syncthreads();
        STAMP_AT(5);
        if (!early)
            walk.prime(src);
    } else if (pre) {
        pdl_enter();
        for (int i = threadIdx.x; i < (p.n_routed - p.lo) * 2; i += blockDim.x) {
            const int j = p.lo + i / 2;
            sm[2 * (j - p.lo) + i % 2] = p.table[3 * p.P[j] + i % 2];
        }
        __syncthreads();
        STAMP_AT(5);
        if (!early)
            walk.prime(src);
    }
    if constexpr (IX && MT) {   /* a batched step's tokens, all of them (p.x rows d apart) */
        for (int t = 0; t < (p.hi - p.lo) / p.kp; t++)
            stage_digits<BITS>(p.x + t * p.d, 32, nch, dg + (int64_t)t * nch * DS);
    } else {
        const bool tg = fl && p.y_tag;
        stage_input<BITS, IX, CL>(p.x, p.nin, p.has_nin, nch, xs, sums, dg, tg ? p.y_tag : nullptr,
                                  tg ? (unsigned)ep * p.tag_mul + p.tag_id : 0u);
    }
    if constexpr (RING) {
        if (early)
            walk.template prime_post<MXC_MOE1_POST>(src);
    }
    STAMP_AT(6);
    walk.template run<DT, IX>(src, g, xs, sums, dg);
    if (fl)   /* phase 2 reads the routes before its wait: o_proj's launch over first */
        asm volatile("griddepcontrol.wait;" ::: "memory");
    pdl_trigger();
}

/* Phase 1 in k_moe1r: group g is group (g + shift) mod G of the slots'
 * rows, so that the extra slots' rows (no route needed) come first; a
 * warp waits for the routes (*p.ready) at its first group of a routed
 * slot.  Each warp copies the gate and up matrices of its current slot
 * to its own two entries of shared memory (wm): the routes come while
 * the block runs, so no block-wide copy as in k_moe1s, and held in
 * registers they spilled. */
template <int BITS, int DT>
struct moe1r_src {
    const mxc_moe1 &p;
    int64_t shift, G, lr;
    int lj, ready;
    mxc_mat *wm;
    __device__ moe1r_src(const mxc_moe1 &q, int64_t sh, int64_t g, mxc_mat *w)
        : p(q), shift(sh), G(g), lr(0), lj(-1), ready(0), wm(w) {}
    /* the slot and row of group g */
    __device__ __forceinline__ int slot(int64_t g, int64_t &r) const
    {
        int64_t gg = g + shift;
        gg -= gg >= G ? G : 0;
        const int64_t lgr = p.off[p.lo] + 2 * gg;
        int j = p.lo;
        while (lgr >= p.off[j + 1])
            j++;
        r = lgr - p.off[j];
        return j;
    }
    __device__ __forceinline__ int kind(int j)
    {
        if (j >= p.n_routed)
            return p.kind0 + j - p.n_routed;
        if (!ready) {
            flag_wait(p.ready);
            ready = 1;
        }
        return __ldcg(p.P + j);
    }
    __device__ __forceinline__ int64_t xoff(int64_t, int) const { return 0; }   /* one x */
    __device__ __forceinline__ void locate(int64_t g)
    {
        const int j = slot(g, lr);
        if (j != lj) {
            const int e = kind(j), lane = threadIdx.x & 31;
            static_assert(sizeof(mxc_mat) % 8 == 0 && sizeof(mxc_mat) <= 128, "a lane copies 8 bytes");
            constexpr int NW = (int)sizeof(mxc_mat) / 8;
            __syncwarp();
            if (lane < 2 * NW)
                ((uint64_t *)wm)[lane] = ((const uint64_t *)(p.table + 3 * e))[lane];
            __syncwarp();
            lj = j;
        }
    }
    __device__ __forceinline__ void load(int c, mv_stage<BITS, 4> &st)
    {
        load_chunk<BITS, DT, 4>(wm[0], lr, c, st, 0);
        load_chunk<BITS, DT, 4>(wm[0], lr + 1, c, st, 1);
        load_chunk<BITS, DT, 4>(wm[1], lr, c, st, 2);
        load_chunk<BITS, DT, 4>(wm[1], lr + 1, c, st, 3);
    }
    __device__ __forceinline__ void store(int64_t g, const float *v, int lane) const
    {
        int64_t gg = g + shift;
        gg -= gg >= G ? G : 0;
        const int64_t ogr = p.off[p.lo] + 2 * gg;
        if (lane == 0)
            p.h[ogr] = glu(p.act, v[0], v[2]);
        else if (lane == 1)
            p.h[ogr + 1] = glu(p.act, v[1], v[3]);
    }
};

/* k_moe1r's router blocks: a call of its own, so that the registers of
 * this path do not make the phase 1 walk's spill (inlined, they did) */
template <int RB, int DT>
__device__ __noinline__ void router_blocks(const mxc_mv &rmv, int64_t Gr, int nch, const mxc_norm_in &rnin,
                                           const mxc_route &rt, int *cnt, int nrb)
{
    mvs_blocks<RB, DT, 1, true>(rmv, nullptr, Gr, nch, rnin, 1, rt, cnt, blockIdx.x, nrb);
}

/* Phase 1 with the router (mxc_moe_stream_routed): blocks [0, nrb) are
 * the router's streaming matvec (mvs_blocks, RB-bit rows one a warp), the
 * others phase 1 over the slots' rows, the extra slots first (moe1r_src).
 * The grid is what fits on the GPU, so every block is resident once the
 * previous kernel has finished (it waits for it before it stages x): the
 * router blocks come first and never wait for the others. */
template <int BITS, int DT, int RB>
__device__ __forceinline__ void moe1r_blocks(const mxc_moe1 &p, int64_t G, int64_t shift, int nrb)
{
    const int nch = (int)(p.d >> 5);
    extern __shared__ float4 smem_f4[];
    __shared__ mxc_mat wm[WARPS][2];
    uint32_t *dg = (uint32_t *)smem_f4;
    float *xs = (float *)(dg + nch * DS);
    pdl_go();
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int64_t g = (int64_t)(blockIdx.x - nrb) * WARPS + warp, gstride = (int64_t)(gridDim.x - nrb) * WARPS;
    moe1r_src<BITS, DT> src(p, shift, G, wm[warp]);
    mv_walk<BITS, 4, mv_depth<BITS, 4, true>::v, moe1r_src<BITS, DT>> walk(g, gstride, G, nch, lane);
    pdl_wait();
    stage_norm(p.nin, nch * 32, xs, nullptr);
    stage_digits<BITS>(xs, XS, nch, dg);
    walk.prime(src);   /* after the staging: a routed slot's group waits for the routes */
    walk.template run<DT, true>(src, g, xs, nullptr, dg);
}

/* Phase 2: the blocks [blk[j], blk[j + 1]) take slot j's down rows
 * against h_j, into Y + j * d (the router weights are applied where the
 * slots are summed, mxc_delta). */
template <int BITS, int DT, int R>
struct moe2_src {
    const mxc_mat &m;
    float *y;
    int64_t rows, lr0;
    __device__ moe2_src(const mxc_mat &mm, float *yy, int64_t d) : m(mm), y(yy), rows(d), lr0(0) {}
    static constexpr int dt = DT;
    __device__ __forceinline__ void locate(int64_t g) { lr0 = g * R; }
    __device__ __forceinline__ int64_t xoff(int64_t, int) const { return 0; }   /* one slot's h */
    __device__ __forceinline__ void fill(ring_rows<R> &rr) const
    {
        ring_rows_of<BITS, DT, R, true>(m, lr0, 0, R, rr);
    }
    template <class ST>
    __device__ __forceinline__ void load(int c, ST &st)
    {
#pragma unroll
        for (int i = 0; i < R; i++)
            load_chunk<BITS, DT, R>(m, min(lr0 + i, rows - 1), c, st, i);
    }
    __device__ __forceinline__ void store(int64_t g, const float *v, int lane)
    {
        const int64_t or0 = g * R;
#pragma unroll
        for (int i = 0; i < R; i++)
            if (lane == i && or0 + i < rows)
                y[or0 + i] = v[i];
    }
};

template <int BITS, int DT, int R, bool IX, bool RING = false>
__global__ void __launch_bounds__(THREADS, 2) k_moe2s(const __grid_constant__ mxc_moe1 p)
{
    STAMP(5);
    __shared__ mxc_mat sm;
    extern __shared__ float4 smem_f4[];
    /* RING: the slot's down matrix and the first weights before the wait.
     * The routes are two launches back (the router, then phase 1; never
     * k_moe1r, whose phase 2 is not this variant): complete (pdl_trigger).
     * p.ready is k_moe1r's alone. */
    if constexpr (!RING) {
        pdl_enter();
        if (p.ready && blockIdx.x == 0 && threadIdx.x == 0)   /* phase 1 has finished with it */
            *p.ready = 0;
    }
    int j = p.lo;
    while ((int)blockIdx.x >= p.blk[j + 1])
        j++;
    const int nch = (p.off[j + 1] - p.off[j]) >> 5;
    unsigned char *ring = (unsigned char *)smem_f4;
    uint32_t *dg = (uint32_t *)(ring + ring_bytes<BITS, R, RING>());
    float *xs = (float *)(dg + (IX ? nch * DS : 0)), *sums = xs + nch * XS;
    if (threadIdx.x == 0) {
        if (RING && p.extras_first && j >= p.n_routed) {   /* an extra slot: its kind is known */
            const int x = j - p.n_routed;
            sm = x < p.n_xd ? p.xd[x] : p.table[3 * (p.kind0 + x) + 2];
        } else if (RING && p.r_pack && p.r_flag && j < 4) {
            /* the routes from the flag's word, as phase 1 takes them: this
             * launch may start beside phase 1 (MLXCEL_CUDA_MOE1_SPARE)
             * before o_proj's last block has routed.  With the experts
             * one stride apart, the matrix from the parameters (read
             * before the wait for the word: one round trip, not two) */
            const mxc_mat b = p.e0[2];
            const int64_t sw = p.estr[2][0], ss = p.estr[2][1], sb = p.estr[2][2];
            const int id = (int)((unsigned long long)route_word_wait(p.r_flag, __ldcg(p.epoch)) >> (8 * j)) & 255;
            if (p.estride & 1) {
                sm = b;
                sm.w = (const char *)b.w + id * sw;
                sm.s = (const char *)b.s + id * ss;
                sm.b = (const char *)b.b + id * sb;
            } else {
                sm = p.table[3 * id + 2];
            }
        } else {
            sm = p.table[3 * __ldcg(p.P + j) + 2];
        }
    }
    __syncthreads();
    STAMP_AT(5);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int64_t G = (p.d + R - 1) / R;
    const int64_t g = (int64_t)(blockIdx.x - p.blk[j]) * WARPS + warp;
    const int64_t gstride = (int64_t)(p.blk[j + 1] - p.blk[j]) * WARPS;
    moe2_src<BITS, DT, R> src(sm, p.Y + (int64_t)j * p.d, p.d);
    using Walk = std::conditional_t<RING, mv_ring<BITS, R, moe2_src<BITS, DT, R>>,
                                    mv_walk<BITS, R, mv_depth<BITS, R, IX>::v, moe2_src<BITS, DT, R>>>;
    Walk walk = make_walk<Walk, RING>(g, gstride, G, nch, lane, ring + (RING ? warp * ring_bytes<BITS, R, RING>() / WARPS : 0));
    walk.prime(src);   /* the first weights in flight while h is staged */
    if constexpr (RING) {
        pdl_wait();
        if (p.early)
            pdl_trigger();
    }
    if constexpr (IX) {
        if (nch * 4 <= 3 * THREADS && p.h_all)
            stage_digits_all<BITS, 3>(p.h + p.off[j], nch, dg);
        else
            stage_digits<BITS>(p.h + p.off[j], 32, nch, dg);
    } else {
        stage_x(p.h + p.off[j], nch, xs, sums);
    }
    STAMP_AT(6);
    walk.template run<DT, IX>(src, g, xs, sums, dg);
    pdl_trigger();
}

template <int BITS, int DT, int RB>
__global__ void __launch_bounds__(THREADS, 2) k_moe1r(const __grid_constant__ mxc_moe1 p, int64_t G, int64_t shift,
                                                     const __grid_constant__ mxc_mv rmv, int64_t Gr,
                                                     const __grid_constant__ mxc_norm_in rnin,
                                                     const __grid_constant__ mxc_route rt, int *cnt, int nrb)
{
    if ((int)blockIdx.x < nrb)
        router_blocks<RB, DT>(rmv, Gr, (int)(p.d >> 5), rnin, rt, cnt, nrb);
    else
        moe1r_blocks<BITS, DT, RB>(p, G, shift, nrb);
    pdl_trigger();
}

static int g_nsm;

static int sm_count(void)
{
    if (g_nsm <= 0) {
        int dev = 0;
        cudaGetDevice(&dev);
        if (cudaDeviceGetAttribute(&g_nsm, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess || g_nsm <= 0)
            g_nsm = 1;
    }
    return g_nsm;
}

/* Blocks of THREADS threads of kernel k that fit on one SM with smem
 * bytes of dynamic shared memory (remembered per kernel and size). */
static int resident(const void *k, size_t smem)
{
    static struct {
        const void *k;
        size_t smem;
        int n;
    } memo[64];
    static int n_memo;
    for (int i = 0; i < n_memo; i++)
        if (memo[i].k == k && memo[i].smem == smem)
            return memo[i].n;
    if (smem > 48 * 1024)
        cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    int n = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, k, THREADS, smem) != cudaSuccess || n < 1)
        n = 1;
    cudaGetLastError();
    if (n_memo < 64)
        memo[n_memo++] = {k, smem, n};
    return n;
}

/* Shared memory for a staged input of cols values: the digits (ix) and,
 * unless ix && !xs (an input the digits are made of straight from global
 * memory: phase 2's h), the floats and chunk sums. */
static size_t stage_bytes(int64_t cols, bool ix, bool xs = true)
{
    return (size_t)(cols >> 5) * ((ix && !xs ? 0 : XS + 1) + (ix ? DS : 0)) * sizeof(float);
}

/* The streaming kernel's width and scale dtype for matrices ms[0..n), or 0
 * when they do not all share one of 4 or 8 bits and one dtype. */
static int stream_bits(const mxc_mat *ms, int n)
{
    const int bits = ms[0].bits;
    if (bits != 4 && bits != 8)
        return 0;
    for (int i = 1; i < n; i++)
        if (ms[i].bits != bits || ms[i].dt != ms[0].dt)
            return 0;
    return bits;
}

/* Clusters of CL blocks resident at once for k with smem bytes, times CL
 * (0 when the GPU cannot place one). */
template <typename K>
static int cluster_fit(K k, int cl, size_t smem)
{
    static struct {
        const void *k;
        size_t smem;
        int n;
    } memo[32];
    static int n_memo;
    for (int i = 0; i < n_memo; i++)
        if (memo[i].k == (const void *)k && memo[i].smem == smem)
            return memo[i].n;
    if (smem > 48 * 1024)
        cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeClusterDimension;
    at[0].val.clusterDim.x = (unsigned)cl;
    at[0].val.clusterDim.y = 1;
    at[0].val.clusterDim.z = 1;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3((unsigned)cl * 64);
    cfg.blockDim = dim3(THREADS);
    cfg.dynamicSmemBytes = smem;
    cfg.attrs = at;
    cfg.numAttrs = 1;
    int n = 0;
    if (cudaOccupancyMaxActiveClusters(&n, k, &cfg) != cudaSuccess || n < 0)
        n = 0;
    cudaGetLastError();
    if (n_memo < 32)
        memo[n_memo++] = {(const void *)k, smem, n * cl};
    return n * cl;
}

/* k_mvs<..., CL> over what launch_mvs would give nb blocks: the blocks
 * rounded up to whole clusters, at most what is resident at once. */
template <int BITS, int DT, int R, int CL>
static int launch_mvs_cl(cudaStream_t st, const mxc_mv *mv, const float *x, const mxc_norm_in *nin, int64_t G,
                         size_t smem, int64_t want)
{
    const int64_t fit = cluster_fit(k_mvs<BITS, DT, R, true, true, CL>, CL, smem);
    if (fit < CL)
        return -1;
    int64_t nb = (want + CL - 1) / CL * CL;
    nb = nb < fit ? nb : fit;
    const mxc_route no_rt = {};
    return launch_kc(k_mvs<BITS, DT, R, true, true, CL>, CL, (unsigned)nb, THREADS, smem, st, 1, *mv, x, G,
                     (int)(mv->m[0].cols >> 5), *nin, 1, no_rt, (int *)nullptr);
}

template <int BITS, int DT, int R, bool IX, bool RING>
static int launch_mvs(cudaStream_t st, const mxc_mv *mv, const float *x, const mxc_norm_in *nin,
                      const mxc_route *rt, int *cnt)
{
    int64_t G = 0;
    for (int i = 0; i < mv->n; i++)
        G += (mv->m[i].rows + R - 1) / R;
    const size_t smem = ring_bytes<BITS, R, RING>() + stage_bytes(mv->m[0].cols, IX);
    const int64_t want = (G + WARPS - 1) / WARPS,
                  fit = (int64_t)resident((const void *)k_mvs<BITS, DT, R, IX, RING>, smem) * sm_count();
    const unsigned nb = (unsigned)(want < fit ? want : fit);
    if constexpr (IX && RING) {
        /* the input norm staged by clusters (MLXCEL_CUDA_CLUSTER) */
        const int64_t d = mv->m[0].cols;
        if (g_cluster > 1 && nin && !rt && !nin->b && d <= 8 * THREADS && d % (32 * g_cluster) == 0) {
            const int rc = launch_mvs_cl<BITS, DT, R, 2>(st, mv, x, nin, G, smem, want);
            if (rc != -1)
                return rc;
        }
    }
    const mxc_norm_in no_nin = {};
    const mxc_route no_rt = {};
    return launch_k(k_mvs<BITS, DT, R, IX, RING>, nb, THREADS, smem, st, 1, *mv, x, G, (int)(mv->m[0].cols >> 5),
                    nin ? *nin : no_nin, nin ? 1 : 0, rt ? *rt : no_rt, rt ? cnt : (int *)nullptr);
}

/* Row groups of R rows in a launch of mv. */
static int64_t mv_groups(const mxc_mv *mv, int R)
{
    int64_t G = 0;
    for (int i = 0; i < mv->n; i++)
        G += (mv->m[i].rows + R - 1) / R;
    return G;
}

/* Percent of the resident blocks a row count per warp must keep busy to
 * be taken: launch_mvs_r 66 (MLXCEL_CUDA_MVS_FILL), phase 2 75
 * (MLXCEL_CUDA_MOE2_FILL).  At 66 the q/k/v of a qwen1.5-moe-a2.7b layer
 * (1 536 groups of 4 rows) takes 4 rows a warp on 192 blocks, every warp's
 * one group copied before its wait, instead of 2 rows on 264 blocks where
 * half of the warps walk a second group after it: decode 669.4 -> 677.9
 * tok/s on an H200 (docs/cuda.md, session 17).  Phase 2 at 50 was slower
 * (661.7). */
static int fill_pct(const char *var, int def)
{
    const char *v = getenv(var);
    const int p = v && *v ? atoi(v) : def;
    return p > 0 && p <= 100 ? p : def;
}

static int mvs_fill(void)
{
    static int p;
    if (!p)
        p = fill_pct("MLXCEL_CUDA_MVS_FILL", 66);
    return p;
}

/* o_proj with the router (k_mvs_rp): the fewer its blocks, the fewer
 * partials its last block sums, the sooner phase 1 has the routes.  40 %
 * (2 rows a warp on 128 blocks for a 2048-row o_proj, where 75 % took 1 on
 * 256): 759 tok/s against 747, and 753 at 20 % (4 rows on 64): docs/cuda.md,
 * session 18; MLXCEL_CUDA_RP_FILL measures others. */
static int rp_fill(void)
{
    static int p;
    if (!p)
        p = fill_pct("MLXCEL_CUDA_RP_FILL", 40);
    return p;
}

/* Blocks phase 1 leaves out of what is resident at once
 * (MLXCEL_CUDA_MOE1_SPARE, default 4).  o_proj's last block still routes
 * when phase 1 starts: with every resident block in phase 1's grid, one
 * cluster waited for that block's slot and walked its rows after all the
 * others (stamps: it passed its wait 10 us after the first block).
 * Decode on an H200 (qwen1.5 synth): 808.6-809.6 tok/s with none spare,
 * 2: 817, 8: 826, 16: 827.3-827.8, 24: 828.6-830.1, 32: 814.7-816.7, 132:
 * 734 (docs/cuda.md, session 21); since phase 1 lets phase 2 launch at
 * its start (c_moe1_go), phase 2's first blocks take the spare slots
 * beside it: 16 858.6-859.7, 24 856.3-856.7, 32 848, 48 829 (session 23);
 * 0 869.2-869.9, 2 870.6-871.2, 4 873.3-873.6, 8 872.7-872.9 against 16
 * 870.9-871.1 (session 24, one run). */
static int moe1_spare(void)
{
    static int p = -1;
    if (p < 0) {
        const char *v = getenv("MLXCEL_CUDA_MOE1_SPARE");
        p = v && *v ? atoi(v) : 4;
        p = p < 0 || p > 1024 ? 4 : p;
    }
    return p;
}

static int moe2_fill(void)
{
    static int p;
    if (!p)
        p = fill_pct("MLXCEL_CUDA_MOE2_FILL", 75);
    return p;
}

/* launch_mvs with the most rows per warp (4, 2 or 1; 8-bit: 2 or 1) that
 * still gives two thirds of the resident blocks work (mvs_fill): a short matrix
 * (o_proj, a router) spreads over more warps instead of leaving SMs idle. */
template <int BITS, int DT, bool IX, bool RING = false>
static int launch_mvs_r(cudaStream_t st, const mxc_mv *mv, const float *x, const mxc_norm_in *nin,
                        const mxc_route *rt, int *cnt)
{
    constexpr int RMAX = BITS == 4 ? 4 : 2;
    const int64_t fit = (int64_t)resident((const void *)k_mvs<BITS, DT, RMAX, IX, RING>,
                                        ring_bytes<BITS, RMAX, RING>() + stage_bytes(mv->m[0].cols, IX)) *
                        sm_count();
    const int64_t enough = fit * mvs_fill() / 100;
    if constexpr (RMAX == 4) {
        if ((mv_groups(mv, 4) + WARPS - 1) / WARPS >= enough)
            return launch_mvs<BITS, DT, 4, IX, RING>(st, mv, x, nin, rt, cnt);
    }
    if ((mv_groups(mv, 2) + WARPS - 1) / WARPS >= enough)
        return launch_mvs<BITS, DT, 2, IX, RING>(st, mv, x, nin, rt, cnt);
    return launch_mvs<BITS, DT, 1, IX, RING>(st, mv, x, nin, rt, cnt);
}

/* k_mvs_rp with R rows a warp; -1 when the launch would have more blocks
 * than rp's scratch. */
template <int BITS, int DT, int R, bool RK>
static int launch_mvs_rp(cudaStream_t st, const mxc_mv *mv, const float *x, const mxc_rpart *rp,
                         const mxc_route *rt, int *cnt)
{
    const int64_t G = mv_groups(mv, R);
    const size_t smem = ring_bytes<BITS, R, true>() + stage_bytes(mv->m[0].cols, true);
    const int64_t nb = (G + WARPS - 1) / WARPS,
                  fit = (int64_t)resident((const void *)k_mvs_rp<BITS, DT, R, RK>, smem) * sm_count();
    /* a group for every warp, in one quantization group of the router */
    if (nb > fit || nb > rp->max_blocks)
        return -1;
    for (int i = 0; i < rp->rv.n; i++)
        if (rp->rv.m[i].gs % (WARPS * R) || WARPS * R * rp->rv.m[i].bits / 32 > RP_WORDS)
            return -1;
    return launch_k(k_mvs_rp<BITS, DT, R, RK>, (unsigned)nb, THREADS, smem, st, 1, *mv, x, G, (int)(mv->m[0].cols >> 5),
                    *rp, *rt, cnt);
}

/* launch_mvs_r's choice of rows a warp, for k_mvs_rp (with RK). */
template <int BITS, int DT, bool RK>
static int launch_mvs_rp_r(cudaStream_t st, const mxc_mv *mv, const float *x, const mxc_rpart *rp,
                           const mxc_route *rt, int *cnt)
{
    constexpr int RMAX = BITS == 4 ? 4 : 2;
    const size_t smem = ring_bytes<BITS, RMAX, true>() + stage_bytes(mv->m[0].cols, true);
    const int64_t enough = (int64_t)resident((const void *)k_mvs_rp<BITS, DT, RMAX, RK>, smem) * sm_count() * rp_fill() / 100;
    if constexpr (RMAX == 4) {
        if ((mv_groups(mv, 4) + WARPS - 1) / WARPS >= enough)
            return launch_mvs_rp<BITS, DT, 4, RK>(st, mv, x, rp, rt, cnt);
    }
    if ((mv_groups(mv, 2) + WARPS - 1) / WARPS >= enough)
        return launch_mvs_rp<BITS, DT, 2, RK>(st, mv, x, rp, rt, cnt);
    return launch_mvs_rp<BITS, DT, 1, RK>(st, mv, x, rp, rt, cnt);
}

int mxc_matvec_stream_rp(cudaStream_t st, const mxc_mv *mv, const float *x, const mxc_rpart *rp,
                         const mxc_route *rt, int *cnt)
{
    /* the integer kernels through the ring only (the default); one matrix
     * whose rows are the router's columns; routers of 4 or 8 bits */
    if (!g_idot || !g_ring || mv->n != 1 || !mxc_stream_ok(mv->m, 1) || ((uintptr_t)x & 15) ||
        rt->E > MXC_ROUTE_FUSED_MAX || rp->E < 1 || rp->E > MXC_RP_MAX_ROWS || rp->E > THREADS || rp->rv.n < 1 || rp->rv.n > 4)
        return -1;
    int E = 0;
    for (int i = 0; i < rp->rv.n; i++) {
        const mxc_mat *m = &rp->rv.m[i];
        if ((m->bits != 4 && m->bits != 8) || m->cols != mv->m[0].rows || m->gs < 32 || m->cols % m->gs)
            return -1;
        E += (int)m->rows;
    }
    if (E != rp->E || rp->rows != mv->m[0].rows)
        return -1;
    const int bits = mv->m[0].bits, dt = mv->m[0].dt;
    /* route_rank's reach: its shared arrays, warp 0's lanes */
    const bool rk = g_route_rank && rt->E <= RANK_E && rt->k >= 1 && rt->k <= 8 && rt->k <= rt->E;
#define MXC_MVRP(B, D) \
    if (bits == B && dt == D) \
        return rk ? launch_mvs_rp_r<B, D, true>(st, mv, x, rp, rt, cnt) : launch_mvs_rp_r<B, D, false>(st, mv, x, rp, rt, cnt);
    MXC_MVRP(4, MXC_F16) MXC_MVRP(4, MXC_BF16) MXC_MVRP(4, MXC_F32)
    MXC_MVRP(8, MXC_F16) MXC_MVRP(8, MXC_BF16) MXC_MVRP(8, MXC_F32)
#undef MXC_MVRP
    return -1;
}

int mxc_stream_ok(const mxc_mat *ms, int n)
{
    if (!stream_bits(ms, n) || ms[0].cols > MXC_STAGE_MAX)
        return 0;
    for (int i = 1; i < n; i++)
        if (ms[i].cols != ms[0].cols)
            return 0;
    return 1;
}

/* One token through the streaming kernel; -1 when it does not apply. */
static int matvec_stream(cudaStream_t st, const mxc_mv *mv, const float *x, const mxc_norm_in *nin,
                         const mxc_route *rt, int *cnt)
{
    const int bits = stream_bits(mv->m, mv->n);
    if (!bits || mv->m[0].cols > MXC_STAGE_MAX || (!nin && ((uintptr_t)x & 15)))
        return -1;
    const int dt = mv->m[0].dt;
#define MXC_MVS(B, D) \
    if (bits == B && dt == D) \
        return !g_idot ? launch_mvs_r<B, D, false>(st, mv, x, nin, rt, cnt)     \
               : g_ring ? launch_mvs_r<B, D, true, true>(st, mv, x, nin, rt, cnt) \
                        : launch_mvs_r<B, D, true>(st, mv, x, nin, rt, cnt);
    MXC_MVS(4, MXC_F16) MXC_MVS(4, MXC_BF16) MXC_MVS(4, MXC_F32)
    MXC_MVS(8, MXC_F16) MXC_MVS(8, MXC_BF16) MXC_MVS(8, MXC_F32)
#undef MXC_MVS
    return -1;
}

/* Phase 2's blocks [blk[j], blk[j + 1]) per slot, in proportion to each
 * slot's width, at most what a slot's ceil(d / R) row groups can use, for
 * about nb blocks in all; returns the total. */
static int share_blocks(mxc_moe1 *q, int64_t nb, int R)
{
    int64_t total = 0;
    for (int j = q->lo; j < q->hi; j++)
        total += q->off[j + 1] - q->off[j];
    const int64_t cap = ((q->d + R - 1) / R + WARPS - 1) / WARPS;
    q->blk[q->lo] = 0;
    for (int j = q->lo; j < q->hi; j++) {
        int64_t b = nb * (q->off[j + 1] - q->off[j]) / (total > 0 ? total : 1);
        b = b < 1 ? 1 : b > cap ? cap : b;
        q->blk[j + 1] = q->blk[j] + (int)b;
    }
    return q->blk[q->hi];
}

/* Phase 2 of the streaming kernels: the most rows per warp that keeps
 * three quarters of the resident blocks busy. */
template <int BITS, int DT, bool IX, bool RING = false>
static int launch_moe2_s(cudaStream_t st, const mxc_moe1 *p)
{
    mxc_moe1 q = *p;
    int64_t widest = 0;
    for (int j = q.lo; j < q.hi; j++)
        widest = q.off[j + 1] - q.off[j] > widest ? q.off[j + 1] - q.off[j] : widest;
    constexpr int RMAX = BITS == 4 ? 4 : 2;
    const size_t smem2 = ring_bytes<BITS, RMAX, RING>() + stage_bytes(widest, IX, !IX);
    const int64_t nb = (int64_t)resident((const void *)k_moe2s<BITS, DT, RMAX, IX, RING>, smem2) * sm_count();
    /* resident() on the variant launched too: it lifts that kernel's
     * shared-memory limit past 48 KB (a slot wider than about 6000 rows,
     * a wide dense MLP, staged more than that and its launch failed) */
    if constexpr (RMAX == 4) {
        if (share_blocks(&q, nb, 4) >= nb * moe2_fill() / 100)
            return launch_k(k_moe2s<BITS, DT, 4, IX, RING>, (unsigned)q.blk[q.hi], THREADS, smem2, st, 1, q);
    }
    /* (the blocks an SM of RMAX's variant share the slots out; the narrower
     * variants' rings differ in size, each launch lifts its own limit) */
    const size_t s2 = ring_bytes<BITS, 2, RING>() + stage_bytes(widest, IX, !IX);
    if (share_blocks(&q, nb, 2) >= nb * moe2_fill() / 100) {
        resident((const void *)k_moe2s<BITS, DT, 2, IX, RING>, s2);
        return launch_k(k_moe2s<BITS, DT, 2, IX, RING>, (unsigned)q.blk[q.hi], THREADS, s2, st, 1, q);
    }
    const size_t s1 = ring_bytes<BITS, 1, RING>() + stage_bytes(widest, IX, !IX);
    share_blocks(&q, nb, 1);
    resident((const void *)k_moe2s<BITS, DT, 1, IX, RING>, s1);
    return launch_k(k_moe2s<BITS, DT, 1, IX, RING>, (unsigned)q.blk[q.hi], THREADS, s1, st, 1, q);
}

template <int BITS, int DT, bool IX, bool RING = false>
static int launch_moe_s(cudaStream_t st, const mxc_moe1 *p)
{
    /* phase 1 over every slot's h rows */
    const int64_t G1 = (p->off[p->hi] - p->off[p->lo]) / 2;
    size_t smem1 = stage_bytes(p->d, IX);
    mxc_moe1 q = *p;
    if ((q.hi - q.lo) * WARPS > MXC_MAX_SLOTS)   /* no room for a copy of the slots' matrices a warp */
        q.h_flag = q.r_flag = nullptr;
    if (q.kp) {   /* every token's digits */
        const size_t all = (size_t)((q.hi - q.lo) / q.kp) * (size_t)(q.d >> 5) * DS * sizeof(uint32_t);
        smem1 = all > smem1 ? all : smem1;
    }
    int rc;
    if (IX && q.kp) {
        const int64_t want = (G1 + WARPS - 1) / WARPS,
                      fit = (int64_t)resident((const void *)k_moe1s<BITS, DT, IX, true>, smem1) * sm_count();
        rc = launch_k(k_moe1s<BITS, DT, IX, true>, (unsigned)(want < fit ? want : fit), THREADS, smem1, st, 1, q, G1);
    } else {
        smem1 += ring_bytes<BITS, 4, RING>();
        const int64_t want = (G1 + WARPS - 1) / WARPS,
                      fit = (int64_t)resident((const void *)k_moe1s<BITS, DT, IX, false, RING>, smem1) * sm_count();
        if constexpr (IX && RING) {
            /* the FFN norm staged by clusters of 2 (MLXCEL_CUDA_CLUSTER_MOE);
             * the routes in the flag's word (p.r_pack): kernels of their own,
             * so that the plain one keeps its registers */
            const bool cl2 = g_cluster_moe == 2 && q.has_nin && !q.nin.b && q.d <= 8 * THREADS && q.d % 64 == 0;
            const bool pk = q.r_pack && q.h_flag;
            if (cl2 || pk) {
                auto k = cl2 ? (pk ? k_moe1s<BITS, DT, IX, false, RING, 2, true> : k_moe1s<BITS, DT, IX, false, RING, 2>)
                             : k_moe1s<BITS, DT, IX, false, RING, 1, true>;
                const int c = cl2 ? 2 : 1;
                /* (resident and cluster_fit also lift k's shared-memory limit) */
                const int64_t cf = cl2 ? cluster_fit(k, 2, smem1) : (int64_t)resident((const void *)k, smem1) * sm_count();
                if (cf >= c) {
                    int64_t nb = (want + c - 1) / c * c;
                    /* (phase 2 may then start beside phase 1: safe where it takes the routes from the flag) */
                    const int spare = pk ? moe1_spare() : 0;
                    const int64_t top = cf - spare >= c ? (cf - spare) / c * c : c;
                    nb = nb < top ? nb : top;
                    rc = launch_kc(k, c, (unsigned)nb, THREADS, smem1, st, 1, q, G1);
                    return rc ? rc : launch_moe2_s<BITS, DT, IX, RING>(st, &q);
                }
            }
        }
        const int spare = q.r_pack && q.h_flag ? moe1_spare() : 0;
        const int64_t top = fit - spare >= 1 ? fit - spare : 1;
        rc = launch_k(k_moe1s<BITS, DT, IX, false, RING>, (unsigned)(want < top ? want : top), THREADS, smem1, st, 1,
                      q, G1);
    }
    return rc ? rc : launch_moe2_s<BITS, DT, IX, RING>(st, &q);
}

template <int BITS, int DT, int RB>
static int launch_moe_r(cudaStream_t st, const mxc_moe1 *p, const mxc_mv *rmv, const mxc_norm_in *rnin,
                        const mxc_route *rt, int *cnt)
{
    const int64_t G1 = (p->off[p->hi] - p->off[p->lo]) / 2;
    /* the extra slots (after the routed ones) first */
    const int64_t shift = (p->off[p->n_routed] - p->off[p->lo]) / 2;
    const int64_t Gr = mv_groups(rmv, 1);
    const int nrb = (int)((Gr + WARPS - 1) / WARPS);
    const size_t smem = stage_bytes(p->d, true);
    const int64_t fit = (int64_t)resident((const void *)k_moe1r<BITS, DT, RB>, smem) * sm_count();
    if (fit < nrb + 1)
        return -1;
    const int64_t want = nrb + (G1 + WARPS - 1) / WARPS;
    mxc_route r = *rt;
    r.ready = p->ready;
    const int rc = launch_k(k_moe1r<BITS, DT, RB>, (unsigned)(want < fit ? want : fit), THREADS, smem, st, 1, *p, G1,
                            shift >= G1 ? (int64_t)0 : shift, *rmv, Gr, *rnin, r, cnt, nrb);
    return rc ? rc : launch_moe2_s<BITS, DT, true>(st, p);
}

template <int BITS, int DT, int R>
static int launch_mvt(cudaStream_t st, const mxc_mv *mv, const float *X, int64_t ldx, int T, size_t smem)
{
    const int64_t G = mv_groups(mv, R), want = (G + WARPS - 1) / WARPS;
    const int64_t fit = (int64_t)resident((const void *)k_mvt<BITS, DT, R, MXC_MV_MAXT>, smem) * sm_count();
    return launch_k(k_mvt<BITS, DT, R, MXC_MV_MAXT>, (unsigned)(want < fit ? want : fit), THREADS, smem, st, 1, *mv,
                    X, ldx, T, G, (int)(mv->m[0].cols >> 5));
}

/* 2 .. MXC_MV_MAXT tokens through k_mvt (the integer kernels, every
 * matrix 4- or 8-bit with one scale dtype, x rows 16-byte aligned, the
 * tokens' digits in 100 KB); -1 when it does not apply.  Two rows a warp
 * for 4 bits where that keeps three quarters of the resident blocks busy,
 * else one. */
static int matvec_tokens(cudaStream_t st, const mxc_mv *mv, const float *X, int64_t ldx, int T)
{
    if (!g_idot || T < 2 || T > MXC_MV_MAXT || !mxc_stream_ok(mv->m, mv->n) || ((uintptr_t)X & 15) || (ldx & 3))
        return -1;
    const int bits = mv->m[0].bits, dt = mv->m[0].dt;
    const int nch = (int)(mv->m[0].cols >> 5);
    const size_t smem = (size_t)T * nch * DS * sizeof(uint32_t);
    if (smem > 100 * 1024)
        return -1;
    int two = 0;
    if (bits == 4) {
        const int64_t fit = (int64_t)resident((const void *)k_mvt<4, MXC_F16, 2, MXC_MV_MAXT>, smem) * sm_count();
        two = (mv_groups(mv, 2) + WARPS - 1) / WARPS >= fit * 3 / 4;
    }
#define MXC_MVT(B, D) \
    if (bits == B && dt == D) \
        return two ? launch_mvt<B, D, 2>(st, mv, X, ldx, T, smem) : launch_mvt<B, D, 1>(st, mv, X, ldx, T, smem);
    MXC_MVT(4, MXC_F16) MXC_MVT(4, MXC_BF16) MXC_MVT(4, MXC_F32)
    MXC_MVT(8, MXC_F16) MXC_MVT(8, MXC_BF16) MXC_MVT(8, MXC_F32)
#undef MXC_MVT
    return -1;
}

int mxc_matvec_stream(cudaStream_t st, const mxc_mv *mv, const float *x, const mxc_norm_in *nin,
                      const mxc_route *route, int *cnt)
{
    if (!mxc_stream_ok(mv->m, mv->n) || (route && route->E > MXC_ROUTE_FUSED_MAX))
        return (int)cudaErrorInvalidValue;
    const int rc = matvec_stream(st, mv, x, nin, route, cnt);
    return rc < 0 ? (int)cudaErrorInvalidValue : rc;
}

int mxc_moe_stream(cudaStream_t st, const mxc_moe1 *p, int dt)
{
    const int bits = p->bits;
    if (p->d > MXC_STAGE_MAX || p->off[p->hi] - p->off[p->lo] <= 0)
        return p->off[p->hi] - p->off[p->lo] <= 0 ? 0 : (int)cudaErrorInvalidValue;
    for (int j = p->lo; j < p->hi; j++)
        if (p->off[j + 1] - p->off[j] > MXC_STAGE_MAX)
            return (int)cudaErrorInvalidValue;
#define MXC_MOES(B, D) \
    if (bits == B && dt == D) \
        return !g_idot ? launch_moe_s<B, D, false>(st, p)           \
               : g_ring && !p->kp ? launch_moe_s<B, D, true, true>(st, p) \
                                  : launch_moe_s<B, D, true>(st, p);
    MXC_MOES(4, MXC_F16) MXC_MOES(4, MXC_BF16) MXC_MOES(4, MXC_F32)
    MXC_MOES(8, MXC_F16) MXC_MOES(8, MXC_BF16) MXC_MOES(8, MXC_F32)
#undef MXC_MOES
    return (int)cudaErrorInvalidValue;
}

int mxc_moe_stream_tokens(cudaStream_t st, const mxc_moe1 *p, int dt)
{
    const int n = p->kp > 0 ? (p->hi - p->lo) / p->kp : 0;
    if (!g_idot || n < 1 || p->lo != 0 || (p->hi - p->lo) % p->kp || p->has_nin || ((uintptr_t)p->x & 15) ||
        p->d % 4 || (size_t)n * (size_t)(p->d >> 5) * DS * sizeof(uint32_t) > 100 * 1024)
        return -1;
    return mxc_moe_stream(st, p, dt);
}

int mxc_moe_stream_routed(cudaStream_t st, const mxc_moe1 *p, int dt, const mxc_mv *rmv, const mxc_norm_in *rnin,
                          const mxc_route *rt, int *cnt)
{
    const int bits = p->bits, rb = stream_bits(rmv->m, rmv->n);
    if (!g_idot || !p->ready || !p->has_nin || rt->E > MXC_ROUTE_FUSED_MAX || !mxc_stream_ok(rmv->m, rmv->n) ||
        rmv->m[0].dt != dt || rmv->m[0].cols != p->d || p->d > MXC_STAGE_MAX || p->n_routed < p->lo ||
        p->n_routed > p->hi || p->off[p->hi] - p->off[p->lo] <= 0)
        return -1;
    for (int j = p->lo; j < p->hi; j++)
        if (p->off[j + 1] - p->off[j] > MXC_STAGE_MAX || (p->off[j + 1] - p->off[j]) % 2)
            return -1;
#define MXC_MOER(B, D, RB) \
    if (bits == B && dt == D && rb == RB) \
        return launch_moe_r<B, D, RB>(st, p, rmv, rnin, rt, cnt);
    MXC_MOER(4, MXC_F16, 4) MXC_MOER(4, MXC_BF16, 4) MXC_MOER(4, MXC_F32, 4)
    MXC_MOER(4, MXC_F16, 8) MXC_MOER(4, MXC_BF16, 8) MXC_MOER(4, MXC_F32, 8)
    MXC_MOER(8, MXC_F16, 8) MXC_MOER(8, MXC_BF16, 8) MXC_MOER(8, MXC_F32, 8)
#undef MXC_MOER
    return -1;
}

__global__ void k_combine(const float *Y, const float *W, int K, int64_t d, float *out)
{
    pdl_enter();
    const int t = blockIdx.y;
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= d)
        return;
    float s = 0.0f;
    for (int j = 0; j < K; j++)
        s += W[(int64_t)t * K + j] * Y[((int64_t)t * K + j) * d + i];
    out[(int64_t)t * d + i] = s;
}

int mxc_combine(cudaStream_t st, const float *Y, const float *W, int T, int K, int64_t d, float *out)
{
    dim3 grid((unsigned)((d + 255) / 256), (unsigned)T);
    return launch_k(k_combine, grid, 256, 0, st, 1, Y, W, K, d, out);
}

/* ---- bandwidth probe ------------------------------------------------------------------ */

double mxc_copy_bandwidth(size_t bytes, int reps)
{
    void *a = nullptr, *b = nullptr;
    cudaEvent_t e0 = nullptr, e1 = nullptr;
    double res = -1.0;
    std::vector<double> v;
    if (cudaMalloc(&a, bytes) != cudaSuccess || cudaMalloc(&b, bytes) != cudaSuccess ||
        cudaEventCreate(&e0) != cudaSuccess || cudaEventCreate(&e1) != cudaSuccess)
        goto out;
    cudaMemset(a, 1, bytes);
    cudaMemcpy(b, a, bytes, cudaMemcpyDeviceToDevice);   /* warm-up */
    for (int i = 0; i < reps; i++) {
        float ms = 0.0f;
        cudaEventRecord(e0);
        cudaMemcpy(b, a, bytes, cudaMemcpyDeviceToDevice);
        cudaEventRecord(e1);
        if (cudaEventSynchronize(e1) != cudaSuccess || cudaEventElapsedTime(&ms, e0, e1) != cudaSuccess)
            goto out;
        v.push_back(2.0 * (double)bytes / (ms * 1e-3) / 1e9);
    }
    std::sort(v.begin(), v.end());
    res = v.empty() ? -1.0 : v[v.size() / 2];
out:
    if (e0)
        cudaEventDestroy(e0);
    if (e1)
        cudaEventDestroy(e1);
    cudaFree(a);
    cudaFree(b);
    cudaGetLastError();
    return res;
}

/* ---- greedy decoding on the GPU -----------------------------------------------------
 *
 * mx_argmax's answer (the first index of the largest value; a NaN never
 * wins, and a NaN at index 0 is never beaten) as a grid: each block the
 * best (value, index) of its stride with NaN read as -inf and ties to the
 * lower index, then the last block to finish (threadFenceReduction) the
 * best of the blocks.  -inf as a key: when no value beats -inf the answer
 * is index 0 (its key is -inf whatever it holds), as mx_argmax's.  The
 * winner becomes the next step's token and position (a.tok, a.pos += 1)
 * and goes into the ring of ids the host copies back. */
__device__ __forceinline__ void am_take(float &bv, int &bi, float v, int i)
{
    if (v > bv || (v == bv && i < bi))
        bv = v, bi = i;
}

__device__ __forceinline__ void am_warp(float &bv, int &bi)
{
#pragma unroll
    for (int o = 16; o; o >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
        const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
        am_take(bv, bi, ov, oi);
    }
}

__global__ void __launch_bounds__(256) k_argmax(const __grid_constant__ mxc_argmax a)
{
    STAMP(6);
    __shared__ float sv[8];
    __shared__ int si[8], last;
    pdl_enter();
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    float bv = -INFINITY;
    int bi = INT_MAX;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < a.n; i += gridDim.x * blockDim.x) {
        const float v = __ldcg(a.x + i);
        am_take(bv, bi, v != v ? -INFINITY : v, i);
    }
    am_warp(bv, bi);
    if (lane == 0)
        sv[warp] = bv, si[warp] = bi;
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < (int)(blockDim.x >> 5); w++)
            am_take(bv, bi, sv[w], si[w]);
        a.pv[blockIdx.x] = bv;
        a.pi[blockIdx.x] = bi;
        __threadfence();
        last = atomicAdd(a.cnt, 1) == (int)gridDim.x - 1;
    }
    __syncthreads();
    if (!last || warp)
        return;
    __threadfence();
    bv = -INFINITY;
    bi = INT_MAX;
    for (int b = lane; b < (int)gridDim.x; b += 32)
        am_take(bv, bi, __ldcg(a.pv + b), __ldcg(a.pi + b));
    am_warp(bv, bi);
    if (lane == 0) {
        const float x0 = __ldcg(a.x);
        const int id = x0 != x0 || bi == INT_MAX ? 0 : bi;
        *a.tok = id;
        *a.pos += 1;
        const int k = *a.n_ids;
        a.ids[k % a.ring] = id;
        *a.n_ids = k + 1;
        *a.cnt = 0;
    }
}

int mxc_argmax_run(cudaStream_t st, const mxc_argmax *a)
{
    if (a->n < 1 || a->blocks < 1 || a->blocks > MXC_ARGMAX_BLOCKS || a->ring < 1)
        return (int)cudaErrorInvalidValue;
    return launch_k(k_argmax, (unsigned)a->blocks, 256, 0, st, 1, *a);
}
