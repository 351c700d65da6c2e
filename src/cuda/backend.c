/* backend.c - a model's forward pass on a CUDA GPU (cuda.h).
 *
 * At attach: every tensor of the checkpoint is copied to the GPU once, as
 * it is on disk (one allocation, each tensor 256-byte aligned), and each
 * host pointer of the model (a quantized matrix, a stacked expert's view,
 * a norm weight) is mapped to its device copy.  Every linear becomes an
 * mxc_mat in one table on the device; each layer's feed-forward is a run
 * of that table, 3 matrices (gate, up, down) per slot kind: the routed
 * experts 0..E-1, then the shared expert (or a dense layer's MLP).
 *
 * A call, on one stream, per layer (kern.h has the kernels):
 *   x += ffn; xn = norm(x)                                 addnorm
 *   q, k, v = xn W^T   (matvec for <= 8 tokens, else tiles)
 *   heads: clip, q/k norm, rope; k, v into the cache       qkv_post
 *   attention over the cache                               attend
 *   x += o(att); xn = norm(x)                              matvec/tile, addnorm
 *   router logits (+ shared gate), routes                  matvec, route
 *   one token:  fused phase 1 + phase 2  (or per slot: the gather path)
 *   prompt:     routes to the host, tokens grouped by expert, tiles of
 *               (expert, <= 32 tokens): gate/up, down, weighted sum
 * then the final norm and lm_head.  Routers other than softmax top-k
 * (sigmoid, sparsemixer) take the GPU's logits to the host, route there
 * with moe/router.c and send the routes back.
 *
 * A batched decode step (mx_forward_batch: n sequences, a token each) is
 * one call of n rows, as a prompt of n tokens would be, except that each
 * row's q/k/v heads and attention go to its own sequence's cache at its
 * own position (a launch per sequence: attend_seq), and the experts of a
 * small batch go token by token through the one-token kernels.
 *
 * One-token steps whose routes all stay on the GPU are captured in a CUDA
 * graph per sequence (and per fused/gather choice) and replayed: the
 * token and position go in through pinned memory, the logits come back
 * the same way (MLXCEL_CUDA_GRAPH=0 turns it off). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "cuda/cuda.h"
#include "cuda/kern.h"
#include "model/family.h"
#include "moe/moe.h"
#include "util/parallel.h"

/* ---- state ----------------------------------------------------------------------- */

typedef struct cu_range {
    const unsigned char *h;   /* host bytes */
    size_t n;
    unsigned char *d;         /* their device copy */
} cu_range;

typedef struct cu_layer {
    const float *an_w, *an_b, *fn_w, *fn_b;   /* device norms (b NULL: RMSNorm) */
    int qi, ki, vi, oi;                       /* matrices */
    const float *q_norm, *k_norm;
    int rope;
    int is_moe;
    int router_i, sgate_i;                    /* sgate_i: the shared expert's gate, or -1 */
    int table;                                /* the layer's first slot matrix */
    int E, n_extra, k, Kp;                    /* routed kinds, extra kinds, routed slots, all slots */
    int64_t dff, extra_ff[MX_MOE_MAX_EXTRA], ff_max;
    int all_quant;                            /* every expert matrix quantized */
    int gu_bits;                              /* the width of every gate/up matrix (same group size), or -1 */
    int s_bits, s_dt;                         /* every gate/up/down 4- or 8-bit with one scale dtype
                                                 (the streaming kernels, mxc_moe_stream), else s_bits 0 */
    int route_fused;                          /* one token's routes by the router matvec's last block */
    int gpu_route;                            /* softmax top-k on the GPU */
    const float *expert_scale;
    /* what some families add (all NULL / 1 / -1 where a layer has none) */
    int mixer;                                /* MX_MIXER_*: attention, DeltaNet, short convolution */
    int in_i, ba_i, mo_i;                     /* a recurrent mixer's in_proj (qkvz), in_proj_ba, out_proj */
    const float *conv_w, *conv_b;             /* its convolution */
    const float *A_log, *dt_bias, *dn_norm;   /* DeltaNet's decay, step bias, gated norm */
    const float *ao_w, *ao_b, *fo_w, *fo_b;   /* norms of the mixer's and the feed-forward's outputs */
    float scalar;                             /* the layer's output times this */
    /* a parallel layer (Gemma 4): the dense MLP's slots beside the
     * experts', norms of the MLP's output and of the experts' input and
     * output, the router's input weights (its scale / sqrt(d)) */
    struct cu_layer *dense;
    const float *mlo_w, *mlo_b, *mei_w, *mei_b, *meo_w, *meo_b, *rin_w;
    int plain;                                /* attention and an MoE or MLP alone: run_pass_fused's layer */
    int estride;                              /* the routed experts' matrices one stride apart (mxc_moe1's) */
    int64_t estr[3][3];                       /* the strides: gate, up, down x w, s, b (bytes) */
} cu_layer;

/* A call's device buffers, sized for cap tokens.  The decode set is made
 * once and never moves (graphs point into it); the prompt set grows. */
typedef struct cu_buf {
    int cap;
    float *x, *x2, *xn, *q, *k, *v, *qr, *att, *out, *ffn, *rl, *glog, *W, *H, *Y, *logits;
    float *xn2, *ffn2;           /* a parallel layer's second input and branch */
    float *mix_in, *mix_in2, *mix_conv, *mix_out;   /* a recurrent mixer's projections, convolution, output */
    int *P, *tok_list, *pair_list;
    mxc_item *items;
    int32_t *tok;
    int *pos;
    float *part;
    size_t part_cap;             /* floats */
    float *all_logits;           /* [cap][vocab] when a trace asks */
    int all_cap;
} cu_buf;

typedef struct cu_seq {
    float *k, *v;
    size_t *off;                 /* [n_layers] floats into k and v */
    int n_ctx;
    float *part;                 /* decode attention partials for the whole context */
    int n_split;
    float *state;                /* the recurrent layers' state (mx_seq's layout), or NULL */
    size_t *soff;                /* [n_layers + 1] floats into state */
    cudaGraphExec_t graph[2];    /* one-token step: gather, fused */
    cudaGraphExec_t ggraph[2];   /* a greedy step (cu_greedy): the same, then the argmax */
    cudaGraph_t src[2], gsrc[2]; /* what they were instantiated from (their attention nodes are updated) */
    mxc_att_fit fit[2], gfit[2]; /* their one-token attention launches, fitted to the position (mxc_att_fit_pos) */
} cu_seq;

/* The switches the kernels' module keeps for the process (kernel_switches,
 * switches_use) */
typedef struct kswitch {
    int idot, ring, att_pre, att_kv, att_comb1, att_early, wgmma, qkv_warp, cluster, cluster_moe, pdl, pdl_trigger,
        moe1_go, route_rank;
} kswitch;

static void switches_use(const kswitch *k);

typedef struct cu_ctx {
    mx_backend be;               /* what the model calls (name: "cuda (<GPU>)") */
    mx_model *m;
    char name[160];
    cudaStream_t st;
    /* a prompt's MoE layers: the routes come back on st_routes (waiting for
     * ev_routes) while st runs the extra MLPs' gate/up (moe_many) */
    cudaStream_t st_routes;
    cudaEvent_t ev_routes, ev_extras, ev_lists;   /* routes made (st); extras' lists, all lists up (st_routes) */
    int stage_flip;              /* which half of h_lists / h_items a layer fills */
    unsigned char *blob;         /* every tensor of the checkpoint */
    cu_range *ranges;            /* sorted by host address */
    size_t n_ranges;
    cu_range *extra;             /* host arrays copied one by one (norms, biases, ropes) */
    size_t n_extra, cap_extra;
    mxc_mat *mats;               /* host copy of the table */
    int n_mats, cap_mats;
    mxc_mat *d_mats;
    cu_layer *layers;
    const float *fn_w, *fn_b;    /* final norm */
    int embed_i, head_i;
    const float *inv_freq[MX_MAX_ROPES], *inv_long[MX_MAX_ROPES];
    int64_t q_rows_max, kvd_max, qdim_max, E_max, Kp_max, ff_max;
    int64_t mix_in_max, mix_in2_max, conv_max, mix_out_max;   /* the recurrent mixers' widest rows */
    int graphable;               /* every MoE layer routes on the GPU */
    int fuse_norms;              /* one-token steps: every norm staged by the streaming kernels that read it */
    int fuse_on;                 /* MLXCEL_CUDA_FUSE (the q/k/v heads inside the attention kernel) */
    int *att_cnt, *route_cnt;    /* zeroed counters of the kernels whose last block finishes the work */
    unsigned *att_gen;           /* [nh_max] zeroed: one token's attention launches a head (mxc_att's gen) */
    unsigned long long *y_tag;   /* [d] zeroed, with rp_flags: o_proj's rows tagged for phase 1 (MLXCEL_CUDA_Y_TAGGED) */
    int att_tagged;              /* MLXCEL_CUDA_ATT_TAGGED: the splits' partials tagged, no counter (mxc_att's gen) */
    int moe_router;              /* one token's router inside phase 1's launch (MLXCEL_CUDA_MOE_ROUTER) */
    int rp_on;                   /* one token's router folded into o_proj (MLXCEL_CUDA_ROUTER_IN_O) */
    int extras_first;            /* phase 1 of one token: the extra slots first (MLXCEL_CUDA_EXTRAS_FIRST) */
    int qkv_early;               /* q/k/v lets the attention launch right after its wait (MLXCEL_CUDA_QKV_EARLY) */
    int moe2_early;              /* phase 2 lets the next q/k/v launch right after its wait (MLXCEL_CUDA_MOE2_EARLY) */
    int h_all;                   /* phase 2 stages h with all its loads at once (MLXCEL_CUDA_H_ALL) */
    int att_span;                /* one token's attention, positions a split (MLXCEL_CUDA_ATT_SPAN: 64, 128 or 256; 0: as the context wants) */
    int shared_early;            /* phase 1 on o_proj's flags, not its launch's end (MLXCEL_CUDA_SHARED_EARLY) */
    int hflag_late;              /* measuring: o_proj's h_flag after its logits (MLXCEL_CUDA_HFLAG_LATE) */
    int estride;                 /* the routed experts' matrices made from one stride where they are one apart:
                                    bit 1 phase 2, bit 2 phase 1 (MLXCEL_CUDA_ESTRIDE, default 3) */
    kswitch ks;                  /* this model's, put in place at each call (switches_use) */
    int *rp_flags;               /* with rp_on: [0] the step's count (mxc_embed), then layer l's h_flag and
                                    r_flag (mxc_route; 64 bits, 8-byte aligned) at RP_FLAGS_AT(l) and 2 ints on */
    int rpack;                   /* MLXCEL_CUDA_RPACK: the routes inside r_flag where they fit (mxc_route's r_pack) */
    float *rp_part;              /* its scratch: [MXC_RP_MAX_BLOCKS][MXC_RP_MAX_ROWS] partials */
    double *rp_ss;               /* [MXC_RP_MAX_BLOCKS] */
    int *one_P;                  /* [1] = 0: a dense layer's one slot */
    float *one_W;                /* [1] = 1 */
    cu_buf dec, pre;
    int32_t *h_tok;              /* pinned [1] the decode step's token */
    int *h_pos;                  /* pinned [1] its position */
    float *h_logits;             /* pinned [vocab] */
    /* greedy steps on the GPU (cu_greedy): the argmax's scratch and the
     * ring of ids it writes (GREEDY_RING), copied back to pinned h_ids */
    mxc_argmax am;
    int32_t *h_ids;
    /* host scratch of the prompt path */
    float *h_rl, *h_glog, *h_W;
    int *h_P, *h_lists, *h_cnt;  /* h_P, h_lists, h_items: pinned (copied asynchronously) */
    mxc_item *h_items;
    int h_cap;
    /* the tensor-core tiles (MLXCEL_CUDA_MMA, on by default): X split into
     * mm, [mm_rows][mm_ld] */
    int mma_on;
    int att_tile;                /* MLXCEL_CUDA_ATT_TILE: prompt attention in query tiles */
    int att_blocks;              /* MLXCEL_CUDA_ATT_BLOCKS: one token's attention, blocks a head (0: about two an SM) */
    mxc_mmx mm;
    int64_t mm_rows;
} cu_ctx;

static int cu_fail(mx_err *e, cudaError_t ce, const char *what)
{
    return mx_fail(e, ce == cudaErrorMemoryAllocation ? MX_ENOMEM : MX_EIO, "cuda: %s: %s", what,
                   cudaGetErrorString(ce));
}

#define CK(call)                                       \
    do {                                               \
        cudaError_t ce_ = (call);                      \
        if (ce_ != cudaSuccess)                        \
            return cu_fail(e, ce_, #call);             \
    } while (0)
/* a kernel launcher of kern.h */
#define KL(call)                                                   \
    do {                                                           \
        int kl_ = (call);                                          \
        if (kl_ != 0)                                              \
            return cu_fail(e, (cudaError_t)kl_, #call);            \
    } while (0)

/* Copies between host and device in stream order, then waits. */
static cudaError_t d2h(cudaStream_t st, void *dst, const void *src, size_t n)
{
    cudaError_t ce = cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToHost, st);
    return ce == cudaSuccess ? cudaStreamSynchronize(st) : ce;
}

static cudaError_t h2d(cudaStream_t st, void *dst, const void *src, size_t n)
{
    cudaError_t ce = cudaMemcpyAsync(dst, src, n, cudaMemcpyHostToDevice, st);
    return ce == cudaSuccess ? cudaStreamSynchronize(st) : ce;
}

/* ---- host pointers to device pointers -------------------------------------------- */

static int cmp_range(const void *a, const void *b)
{
    const cu_range *x = a, *y = b;
    return x->h < y->h ? -1 : x->h > y->h;
}

/* Copies every tensor of the checkpoint to the GPU. */
static int upload_tensors(cu_ctx *c, mx_err *e)
{
    const mx_st_set *st = c->m->st;
    const size_t n = mx_st_count(st);
    c->ranges = calloc(n ? n : 1, sizeof *c->ranges);
    if (!c->ranges)
        return mx_fail(e, MX_ENOMEM, "out of memory");
    size_t total = 0;
    for (size_t i = 0; i < n; i++) {
        const mx_tensor *t = mx_st_at(st, i);
        c->ranges[i].h = t->data;
        c->ranges[i].n = t->nbytes;
        total += (t->nbytes + 255) & ~(size_t)255;
    }
    c->n_ranges = n;
    qsort(c->ranges, n, sizeof *c->ranges, cmp_range);
    cudaError_t ce = cudaMalloc((void **)&c->blob, total ? total : 256);
    if (ce != cudaSuccess)
        return mx_fail(e, MX_ENOMEM, "cuda: %.1f GiB of weights do not fit on the GPU: %s",
                       (double)total / 1073741824.0, cudaGetErrorString(ce));
    size_t off = 0;
    for (size_t i = 0; i < n; i++) {
        c->ranges[i].d = c->blob + off;
        CK(cudaMemcpy(c->ranges[i].d, c->ranges[i].h, c->ranges[i].n, cudaMemcpyHostToDevice));
        off += (c->ranges[i].n + 255) & ~(size_t)255;
    }
    return MX_OK;
}

/* The device copy of host bytes [h, h + n): inside an uploaded tensor, or
 * copied now (arrays the loader made: norms, biases, rope frequencies). */
/* n bytes at src copied into a device allocation of their own, recorded
 * in c->extra under the host address key (dev_of finds it by that; NULL:
 * never found) and freed with the model's arrays. */
static unsigned char *copy_extra(cu_ctx *c, const unsigned char *key, const void *src, size_t n, mx_err *e)
{
    if (c->n_extra == c->cap_extra) {
        size_t cap = c->cap_extra ? 2 * c->cap_extra : 64;
        cu_range *x = realloc(c->extra, cap * sizeof *x);
        if (!x) {
            mx_fail(e, MX_ENOMEM, "out of memory");
            return NULL;
        }
        c->extra = x;
        c->cap_extra = cap;
    }
    unsigned char *d = NULL;
    cudaError_t ce = cudaMalloc((void **)&d, n);
    if (ce == cudaSuccess)
        ce = cudaMemcpy(d, src, n, cudaMemcpyHostToDevice);
    if (ce != cudaSuccess) {
        cudaFree(d);
        cu_fail(e, ce, "copying a model array to the GPU");
        return NULL;
    }
    c->extra[c->n_extra++] = (cu_range){key, n, d};
    return d;
}

static const void *dev_of(cu_ctx *c, const void *hp, size_t n, mx_err *e)
{
    if (!hp)
        return NULL;
    const unsigned char *h = hp;
    size_t lo = 0, hi = c->n_ranges;
    while (lo < hi) {   /* the last range starting at or before h */
        const size_t mid = (lo + hi) / 2;
        if (c->ranges[mid].h <= h)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo > 0) {
        const cu_range *r = &c->ranges[lo - 1];
        if (h + n <= r->h + r->n)
            return r->d + (h - r->h);
    }
    for (size_t i = 0; i < c->n_extra; i++)
        if (c->extra[i].h == h && c->extra[i].n >= n)
            return c->extra[i].d;
    return copy_extra(c, h, h, n, e);
}

static const float *dev_f32(cu_ctx *c, const float *h, size_t n, mx_err *e)
{
    return dev_of(c, h, n * sizeof(float), e);
}

static int dt_of(mx_dtype t) { return t == MX_F16 ? MXC_F16 : t == MX_BF16 ? MXC_BF16 : MXC_F32; }

/* Adds a linear to the table; *idx gets its index.  what names it in errors. */
static int add_mat(cu_ctx *c, const mx_linear *l, const char *what, int *idx, mx_err *e)
{
    mxc_mat mm = {0};
    mm.rows = l->rows;
    mm.cols = l->cols;
    if (l->cols % 32)
        return mx_fail(e, MX_EUNSUPPORTED, "cuda: %s has %lld columns, not a multiple of 32", what,
                       (long long)l->cols);
    if (l->quantized) {
        const mx_qmat *q = &l->q;
        mm.bits = q->bits;
        mm.gs = q->group_size;
        mm.dt = dt_of(q->sdtype);
        const size_t ng = (size_t)q->rows * (size_t)(q->cols / q->group_size);
        const size_t ssz = q->sdtype == MX_F32 ? 4 : 2;
        mm.w = dev_of(c, q->w, (size_t)q->rows * (size_t)mx_qmat_row_bytes(q), e);
        mm.s = dev_of(c, q->scales, ng * ssz, e);
        mm.b = dev_of(c, q->biases, ng * ssz, e);
        if (!mm.w || !mm.s || !mm.b)
            return e->code ? e->code : mx_fail(e, MX_EIO, "cuda: %s: weights not found on the GPU", what);
    } else {
        mm.bits = 0;
        mm.dt = dt_of(l->wdtype);
        mm.w = dev_of(c, l->w, (size_t)l->rows * (size_t)l->cols * (l->wdtype == MX_F32 ? 4 : 2), e);
        if (!mm.w)
            return e->code ? e->code : mx_fail(e, MX_EIO, "cuda: %s: weights not found on the GPU", what);
    }
    if (l->bias && !(mm.bias = dev_f32(c, l->bias, (size_t)l->rows, e)))
        return e->code;
    if (c->n_mats == c->cap_mats) {
        int cap = c->cap_mats ? 2 * c->cap_mats : 256;
        mxc_mat *x = realloc(c->mats, sizeof *x * (size_t)cap);
        if (!x)
            return mx_fail(e, MX_ENOMEM, "out of memory");
        c->mats = x;
        c->cap_mats = cap;
    }
    c->mats[c->n_mats] = mm;
    *idx = c->n_mats++;
    return MX_OK;
}

static int add_mlp(cu_ctx *c, const mx_linear *g, const mx_linear *u, const mx_linear *d, const char *what,
                   mx_err *e)
{
    int i;
    if (g->bias || u->bias || d->bias)
        return mx_fail(e, MX_EUNSUPPORTED, "cuda: %s: expert or MLP biases are not supported on the GPU", what);
    int rc = add_mat(c, g, what, &i, e);
    if (!rc)
        rc = add_mat(c, u, what, &i, e);
    if (!rc)
        rc = add_mat(c, d, what, &i, e);
    return rc;
}

static int mlp_quantized(const mx_mlp *p)
{
    return p->gate.quantized && p->up.quantized && p->down.quantized;
}

/* ---- attach: what the GPU path takes ------------------------------------------------ */

/* NULL when layer l runs on the GPU, else the feature that does not. */
static const char *unsupported(const mx_model *m, int l)
{
    const mx_layer *L = &m->layers[l];
    if (L->mixer == MX_MIXER_DELTANET) {
        const mx_deltanet *dn = &L->dn;
        if (dn->K < 1 || dn->K > MXC_CONV_MAXK)
            return "a convolution of more than 8 taps";
        if (dn->nk <= 0 || dn->nv % dn->nk || dn->dv > 1024 || dn->dk > 1024)
            return "DeltaNet heads wider than 1024 or value heads not a multiple of key heads";
    } else if (L->mixer == MX_MIXER_SHORTCONV) {
        if (L->sc.L < 1 || L->sc.L > MXC_CONV_MAXK)
            return "a convolution of more than 8 taps";
    } else {
        if (L->attn.head_dim > MXC_HD_MAX || L->attn.head_dim % 4)
            return "a head size above 512 or not a multiple of 4";
        if (L->attn.n_heads % L->attn.n_kv)
            return "query heads not a multiple of kv heads";
        if (L->attn.out_gate && m->fam->qk_norm == MX_QK_NORM_FULL)
            return "gated attention output with full-width q/k norms";
    }
    if (L->parallel && !L->is_moe)
        return "a parallel layer without experts";
    if (L->is_moe && L->moe.experts.n > 4096)
        return "more than 4096 experts";
    if (L->is_moe && L->moe.shared_gated && L->moe.shared_gate.rows != 1)
        return "a shared-expert gate of more than one row";
    return NULL;
}

/* The geometry of a feed-forward's slots once its matrices are in the
 * table from cl->table on: all slots, the phase-1 width, the streaming
 * kernels' width, the widest slot. */
static void slot_geometry(cu_ctx *c, cu_layer *cl)
{
    cl->Kp = cl->k + cl->n_extra;
    /* one bit width and group size for every gate and up matrix: the
     * phase-1 kernel compiled for that width */
    cl->gu_bits = c->mats[cl->table].bits;
    for (int i = cl->table; i < c->n_mats && i < cl->table + 3 * (cl->E + cl->n_extra); i++)
        if (i % 3 != (cl->table + 2) % 3 &&
            (c->mats[i].bits != cl->gu_bits || c->mats[i].gs != c->mats[cl->table].gs))
            cl->gu_bits = -1;
    if (cl->gu_bits <= 0)
        cl->gu_bits = -1;
    const mxc_mat *sm0 = &c->mats[cl->table];
    cl->s_bits = sm0->bits == 4 || sm0->bits == 8 ? sm0->bits : 0;
    cl->s_dt = sm0->dt;
    for (int i = cl->table; i < cl->table + 3 * (cl->E + cl->n_extra); i++)
        if (c->mats[i].bits != cl->s_bits || c->mats[i].dt != cl->s_dt)
            cl->s_bits = 0;
    cl->ff_max = cl->dff;
    for (int x = 0; x < cl->n_extra; x++)
        cl->ff_max = cl->extra_ff[x] > cl->ff_max ? cl->extra_ff[x] : cl->ff_max;
    c->Kp_max = cl->Kp > c->Kp_max ? cl->Kp : c->Kp_max;
    c->ff_max = cl->ff_max > c->ff_max ? cl->ff_max : c->ff_max;
    /* the routed experts one stride apart (slices of the checkpoint's
     * stacked tensors): mxc_moe1's e0 and estr then stand for the table */
    cl->estride = cl->E >= 2;
    for (int t = 0; t < 3 && cl->estride; t++) {
        const mxc_mat *m0 = &c->mats[cl->table + t], *m1 = &c->mats[cl->table + 3 + t];
        if (!m0->bits) {
            cl->estride = 0;
            break;
        }
        cl->estr[t][0] = (const char *)m1->w - (const char *)m0->w;
        cl->estr[t][1] = (const char *)m1->s - (const char *)m0->s;
        cl->estr[t][2] = (const char *)m1->b - (const char *)m0->b;
        for (int x = 1; x < cl->E && cl->estride; x++) {
            const mxc_mat *mx = &c->mats[cl->table + 3 * x + t];
            cl->estride = mx->w == (const char *)m0->w + x * cl->estr[t][0] &&
                          mx->s == (const char *)m0->s + x * cl->estr[t][1] &&
                          mx->b == (const char *)m0->b + x * cl->estr[t][2] && !mx->bias && mx->rows == m0->rows &&
                          mx->cols == m0->cols && mx->bits == m0->bits && mx->gs == m0->gs && mx->dt == m0->dt;
        }
    }
}

/* A dense MLP as the one slot of cl (a dense layer, or a parallel layer's
 * dense branch). */
static int setup_mlp(cu_ctx *c, cu_layer *cl, const mx_mlp *mlp, const char *what, mx_err *e)
{
    cl->table = c->n_mats;
    int rc = add_mlp(c, &mlp->gate, &mlp->up, &mlp->down, what, e);
    if (rc)
        return rc;
    cl->E = 0;
    cl->n_extra = 1;
    cl->k = 0;
    cl->extra_ff[0] = mlp->gate.rows;
    cl->all_quant = mlp_quantized(mlp);
    slot_geometry(c, cl);
    return MX_OK;
}

/* A norm's weights (and bias) on the GPU; w NULL when the norm is none. */
static void dev_norm(cu_ctx *c, const mx_norm *n, const float **w, const float **b, mx_err *e)
{
    const size_t d = (size_t)c->m->d;
    *w = n->w ? dev_f32(c, n->w, d, e) : NULL;
    *b = n->b ? dev_f32(c, n->b, d, e) : NULL;
}

/* n floats made on the host (not a model array) copied to the GPU; freed
 * with the model's arrays. */
static const float *dev_new(cu_ctx *c, const float *h, size_t n, mx_err *e)
{
    return (const float *)copy_extra(c, NULL, h, n * sizeof(float), e);
}

/* Layer l's mixer: attention's matrices and norms, or a recurrent
 * mixer's. */
static int setup_mixer(cu_ctx *c, int l, mx_err *e)
{
    const mx_model *m = c->m;
    const mx_layer *L = &m->layers[l];
    cu_layer *cl = &c->layers[l];
    char what[96];
    int rc;
    cl->mixer = L->mixer;
    cl->qi = cl->ki = cl->vi = cl->oi = -1;
    if (L->mixer == MX_MIXER_SHORTCONV) {
        const mx_shortconv *sc = &L->sc;
        snprintf(what, sizeof what, "layer %d short convolution", l);
        if ((rc = add_mat(c, &sc->in, what, &cl->in_i, e)) || (rc = add_mat(c, &sc->out, what, &cl->mo_i, e)))
            return rc;
        cl->conv_w = dev_f32(c, sc->conv_w, (size_t)m->d * (size_t)sc->L, e);
        cl->conv_b = sc->conv_b ? dev_f32(c, sc->conv_b, (size_t)m->d, e) : NULL;
        c->mix_in_max = sc->in.rows > c->mix_in_max ? sc->in.rows : c->mix_in_max;
        c->mix_out_max = m->d > c->mix_out_max ? m->d : c->mix_out_max;
        return e->code;
    }
    if (L->mixer == MX_MIXER_DELTANET) {
        const mx_deltanet *dn = &L->dn;
        snprintf(what, sizeof what, "layer %d DeltaNet", l);
        if ((rc = add_mat(c, &dn->qkvz, what, &cl->in_i, e)) || (rc = add_mat(c, &dn->ba, what, &cl->ba_i, e)) ||
            (rc = add_mat(c, &dn->out, what, &cl->mo_i, e)))
            return rc;
        cl->conv_w = dev_f32(c, dn->conv_w, (size_t)dn->conv_dim * (size_t)dn->K, e);
        cl->A_log = dev_f32(c, dn->A_log, (size_t)dn->nv, e);
        cl->dt_bias = dev_f32(c, dn->dt_bias, (size_t)dn->nv, e);
        cl->dn_norm = dev_f32(c, dn->norm_w, (size_t)dn->dv, e);
        const int64_t vd = (int64_t)dn->nv * dn->dv;
        c->mix_in_max = dn->qkvz.rows > c->mix_in_max ? dn->qkvz.rows : c->mix_in_max;
        c->mix_in2_max = dn->ba.rows > c->mix_in2_max ? dn->ba.rows : c->mix_in2_max;
        c->conv_max = dn->conv_dim > c->conv_max ? dn->conv_dim : c->conv_max;
        c->mix_out_max = vd > c->mix_out_max ? vd : c->mix_out_max;
        return e->code;
    }
    const mx_attn *a = &L->attn;
    snprintf(what, sizeof what, "layer %d attention", l);
    if ((rc = add_mat(c, &a->q, what, &cl->qi, e)) || (rc = add_mat(c, &a->k, what, &cl->ki, e)) ||
        (!a->k_eq_v && (rc = add_mat(c, &a->v, what, &cl->vi, e))) || (rc = add_mat(c, &a->o, what, &cl->oi, e)))
        return rc;
    const size_t nq = m->fam->qk_norm == MX_QK_NORM_FULL ? (size_t)a->q_dim : (size_t)a->head_dim;
    const size_t nk = m->fam->qk_norm == MX_QK_NORM_FULL ? (size_t)a->kv_dim : (size_t)a->head_dim;
    cl->q_norm = a->q_norm ? dev_f32(c, a->q_norm, nq, e) : NULL;
    cl->k_norm = a->k_norm ? dev_f32(c, a->k_norm, nk, e) : NULL;
    if (e->code)
        return e->code;
    if (m->fam->qk_norm != MX_QK_NORM_NONE && (!cl->q_norm || !cl->k_norm))
        return mx_fail(e, MX_EUNSUPPORTED, "cuda: layer %d: q/k norm weights missing", l);
    cl->rope = a->rope;
    c->q_rows_max = a->q.rows > c->q_rows_max ? a->q.rows : c->q_rows_max;
    c->kvd_max = a->kv_dim > c->kvd_max ? a->kv_dim : c->kvd_max;
    c->qdim_max = a->q_dim > c->qdim_max ? a->q_dim : c->qdim_max;
    return MX_OK;
}

static int setup_layer(cu_ctx *c, int l, mx_err *e)
{
    const mx_model *m = c->m;
    const mx_layer *L = &m->layers[l];
    cu_layer *cl = &c->layers[l];
    char what[96];
    int rc;
    if ((rc = setup_mixer(c, l, e)))
        return rc;
    dev_norm(c, &L->attn_norm, &cl->an_w, &cl->an_b, e);
    dev_norm(c, &L->ffn_norm, &cl->fn_w, &cl->fn_b, e);
    dev_norm(c, &L->attn_out_norm, &cl->ao_w, &cl->ao_b, e);
    dev_norm(c, &L->ffn_out_norm, &cl->fo_w, &cl->fo_b, e);
    if (e->code)
        return e->code;
    cl->scalar = L->scalar;
    cl->plain = L->mixer == MX_MIXER_ATTENTION && !L->attn.k_eq_v && !L->attn.out_gate && !cl->ao_w &&
                !cl->fo_w && L->scalar == 1.0f && !L->parallel;

    cl->is_moe = L->is_moe;
    cl->sgate_i = -1;
    cl->table = c->n_mats;
    if (!L->is_moe) {
        snprintf(what, sizeof what, "layer %d MLP", l);
        return setup_mlp(c, cl, &L->mlp, what, e);
    }
    const mx_moe_block *b = &L->moe;
    const mx_experts *ex = &b->experts;
    for (int x = 0; x < ex->n; x++) {
        snprintf(what, sizeof what, "layer %d expert %d", l, x);
        if ((rc = add_mlp(c, &ex->gate[x], &ex->up[x], &ex->down[x], what, e)))
            return rc;
    }
    cl->E = ex->n;
    cl->dff = ex->d_ff;
    cl->n_extra = 0;
    cl->all_quant = 1;
    for (int x = 0; x < ex->n; x++)
        cl->all_quant &= ex->gate[x].quantized && ex->up[x].quantized && ex->down[x].quantized;
    if (b->has_shared) {
        snprintf(what, sizeof what, "layer %d shared expert", l);
        if ((rc = add_mlp(c, &b->shared.gate, &b->shared.up, &b->shared.down, what, e)))
            return rc;
        cl->extra_ff[cl->n_extra++] = b->shared.gate.rows;
        cl->all_quant &= mlp_quantized(&b->shared);
    }
    snprintf(what, sizeof what, "layer %d router", l);
    if ((rc = add_mat(c, &b->router, what, &cl->router_i, e)))
        return rc;
    if (b->shared_gated && (rc = add_mat(c, &b->shared_gate, what, &cl->sgate_i, e)))
        return rc;
    cl->k = b->rule.k < MX_MAX_TOPK ? b->rule.k : MX_MAX_TOPK;
    cl->k = cl->k < ex->n ? cl->k : ex->n;
    cl->gpu_route = b->rule.kind == MX_ROUTER_SOFTMAX_TOPK;
    if (b->rule.expert_scale && !(cl->expert_scale = dev_f32(c, b->rule.expert_scale, (size_t)ex->n, e)))
        return e->code;
    c->E_max = cl->E > c->E_max ? cl->E : c->E_max;
    if (!cl->gpu_route)
        c->graphable = 0;
    slot_geometry(c, cl);
    if (cl->gpu_route && cl->E <= MXC_ROUTE_FUSED_MAX && mx_env_flag("MLXCEL_CUDA_FUSE", 1)) {
        const mxc_mat rs[2] = {c->mats[cl->router_i], cl->sgate_i >= 0 ? c->mats[cl->sgate_i] : c->mats[cl->router_i]};
        cl->route_fused = mxc_stream_ok(rs, cl->sgate_i >= 0 ? 2 : 1);
    }
    if (!L->parallel)
        return MX_OK;
    /* Gemma 4: the dense MLP beside the experts, its own slots */
    if (!(cl->dense = calloc(1, sizeof *cl->dense)))
        return mx_fail(e, MX_ENOMEM, "out of memory");
    snprintf(what, sizeof what, "layer %d MLP", l);
    if ((rc = setup_mlp(c, cl->dense, &L->mlp, what, e)))
        return rc;
    dev_norm(c, &L->mlp_out_norm, &cl->mlo_w, &cl->mlo_b, e);
    dev_norm(c, &L->moe_in_norm, &cl->mei_w, &cl->mei_b, e);
    dev_norm(c, &L->moe_out_norm, &cl->meo_w, &cl->meo_b, e);
    if (e->code)
        return e->code;
    if (!cl->mlo_w || !cl->mei_w || !cl->meo_w)
        return mx_fail(e, MX_EUNSUPPORTED, "cuda: layer %d: a parallel layer's norms are missing", l);
    /* rmsnorm(x) * scale / sqrt(d): an RMSNorm whose weight is scale / sqrt(d) */
    float *w = malloc(sizeof(float) * (size_t)m->d);
    if (!w)
        return mx_fail(e, MX_ENOMEM, "out of memory");
    const float k = 1.0f / sqrtf((float)m->d);
    for (int i = 0; i < m->d; i++)
        w[i] = b->router_in_scale ? b->router_in_scale[i] * k : k;
    cl->rin_w = dev_new(c, w, (size_t)m->d, e);
    free(w);
    return cl->rin_w ? MX_OK : e->code;
}

/* ---- buffers ---------------------------------------------------------------------- */

static void buf_free(cu_buf *b)
{
    void *p[] = {b->x, b->x2, b->xn, b->q, b->k, b->v, b->qr, b->att, b->out, b->ffn, b->rl, b->glog, b->W,
                 b->H, b->Y, b->logits, b->P, b->tok_list, b->pair_list, b->items, b->tok, b->pos,
                 b->part, b->all_logits, b->xn2, b->ffn2, b->mix_in, b->mix_in2, b->mix_conv, b->mix_out};
    for (size_t i = 0; i < sizeof p / sizeof p[0]; i++)
        cudaFree(p[i]);
    memset(b, 0, sizeof *b);
}

static cudaError_t dalloc(void *pp, size_t bytes)
{
    return cudaMalloc((void **)pp, bytes ? bytes : 16);
}

/* Sizes b for T tokens (reallocating only to grow). */
/* Items (tiles of one expert's pairs) a prompt of T tokens can have, for
 * each of the gate/up and down lists: a half of b->items holds gate/up at
 * [0, cap), down at [cap, 2 cap). */
static int64_t item_cap(const cu_ctx *c, int T)
{
    return (int64_t)T * (c->Kp_max ? c->Kp_max : 1) + (c->E_max ? c->E_max : 1) + MX_MOE_MAX_EXTRA + 1;
}

static int buf_reserve(cu_ctx *c, cu_buf *b, int T, mx_err *e)
{
    if (b->cap >= T)
        return MX_OK;
    const mx_model *m = c->m;
    cudaDeviceSynchronize();   /* nothing may still use the old buffers */
    buf_free(b);
    const size_t t = (size_t)T, f = sizeof(float), d = (size_t)m->d, Kp = (size_t)(c->Kp_max ? c->Kp_max : 1);
    CK(dalloc(&b->x, t * d * f));
    CK(dalloc(&b->x2, t * d * f));
    CK(dalloc(&b->xn, t * d * f));
    CK(dalloc(&b->q, t * (size_t)c->q_rows_max * f));
    CK(dalloc(&b->k, t * (size_t)c->kvd_max * f));
    CK(dalloc(&b->v, t * (size_t)c->kvd_max * f));
    CK(dalloc(&b->qr, t * (size_t)c->qdim_max * f));
    CK(dalloc(&b->att, t * (size_t)c->qdim_max * f));
    CK(dalloc(&b->out, t * d * f));
    CK(dalloc(&b->ffn, t * d * f));
    CK(dalloc(&b->rl, t * (size_t)(c->E_max ? c->E_max : 1) * f));
    CK(dalloc(&b->glog, t * f));
    CK(dalloc(&b->W, t * Kp * f));
    CK(dalloc(&b->P, t * Kp * sizeof(int)));
    CK(dalloc(&b->H, t * Kp * (size_t)c->ff_max * f));
    CK(dalloc(&b->Y, t * Kp * d * f));
    CK(dalloc(&b->logits, (size_t)m->vocab * f));
    /* two halves of the lists and items (moe_many: a layer's copies may
     * land while the layer before still reads the other half) */
    CK(dalloc(&b->tok_list, 2 * t * Kp * sizeof(int)));
    CK(dalloc(&b->pair_list, 2 * t * Kp * sizeof(int)));
    CK(dalloc(&b->items, 2 * (size_t)item_cap(c, T) * 2 * sizeof(mxc_item)));
    CK(dalloc(&b->tok, t * sizeof(int32_t)));
    CK(dalloc(&b->pos, t * sizeof(int)));
    CK(dalloc(&b->xn2, t * d * f));
    CK(dalloc(&b->ffn2, t * d * f));
    CK(dalloc(&b->mix_in, t * (size_t)c->mix_in_max * f));
    CK(dalloc(&b->mix_in2, t * (size_t)c->mix_in2_max * f));
    CK(dalloc(&b->mix_conv, t * (size_t)c->conv_max * f));
    CK(dalloc(&b->mix_out, t * (size_t)c->mix_out_max * f));
    b->cap = T;
    return MX_OK;
}

static int part_reserve(cu_buf *b, size_t floats, mx_err *e)
{
    if (b->part_cap >= floats)
        return MX_OK;
    cudaDeviceSynchronize();
    cudaFree(b->part);
    b->part = NULL;
    b->part_cap = 0;
    CK(dalloc(&b->part, floats * sizeof(float)));
    b->part_cap = floats;
    return MX_OK;
}

/* Host scratch of the prompt path for T tokens. */
static void host_free(cu_ctx *c)
{
    free(c->h_rl), free(c->h_glog), free(c->h_W), free(c->h_cnt);
    cudaFreeHost(c->h_P), cudaFreeHost(c->h_lists), cudaFreeHost(c->h_items);
    c->h_rl = c->h_glog = c->h_W = NULL;
    c->h_cnt = c->h_P = c->h_lists = NULL;
    c->h_items = NULL;
}

static int host_reserve(cu_ctx *c, int T, mx_err *e)
{
    if (c->h_cap >= T)
        return MX_OK;
    const size_t t = (size_t)T, Kp = (size_t)(c->Kp_max ? c->Kp_max : 1), E = (size_t)(c->E_max ? c->E_max : 1);
    cudaStreamSynchronize(c->st);   /* no copy may still read the old pinned buffers */
    cudaStreamSynchronize(c->st_routes);
    host_free(c);
    c->h_rl = malloc(t * E * sizeof(float));
    c->h_glog = malloc(t * sizeof(float));
    c->h_W = malloc(t * Kp * sizeof(float));
    c->h_cnt = malloc((E + MX_MOE_MAX_EXTRA + 2) * sizeof(int));
    /* two halves of the lists and items: a layer fills one while the
     * previous layer's copies may still read the other */
    if (!c->h_rl || !c->h_glog || !c->h_W || !c->h_cnt ||
        cudaMallocHost((void **)&c->h_P, t * Kp * sizeof(int)) != cudaSuccess ||
        cudaMallocHost((void **)&c->h_lists, 2 * 2 * t * Kp * sizeof(int)) != cudaSuccess ||
        cudaMallocHost((void **)&c->h_items, 2 * (size_t)item_cap(c, T) * 2 * sizeof(mxc_item)) != cudaSuccess) {
        host_free(c);
        c->h_cap = 0;
        return mx_fail(e, MX_ENOMEM, "out of memory (the prompt's routing buffers for %d tokens)", T);
    }
    c->h_cap = T;
    return MX_OK;
}

/* ---- sequences ---------------------------------------------------------------------- */

static void seq_state_free(cu_seq *q)
{
    if (!q)
        return;
    for (int i = 0; i < 2; i++) {
        if (q->graph[i])
            cudaGraphExecDestroy(q->graph[i]);
        if (q->ggraph[i])
            cudaGraphExecDestroy(q->ggraph[i]);
        if (q->src[i])
            cudaGraphDestroy(q->src[i]);
        if (q->gsrc[i])
            cudaGraphDestroy(q->gsrc[i]);
        mxc_att_fit_free(&q->fit[i]);
        mxc_att_fit_free(&q->gfit[i]);
    }
    cudaFree(q->k);
    cudaFree(q->v);
    cudaFree(q->part);
    cudaFree(q->state);
    free(q->soff);
    free(q->off);
    free(q);
}

static void cu_seq_free(void *ctx, mx_seq *s)
{
    (void)ctx;
    cudaDeviceSynchronize();
    seq_state_free(s->dev);
    s->dev = NULL;
}

/* The sequence's KV cache on the GPU, made on its first call. */
static cu_seq *seq_state(cu_ctx *c, mx_seq *s, mx_err *e)
{
    if (s->dev)
        return s->dev;
    const mx_model *m = c->m;
    cu_seq *q = calloc(1, sizeof *q);
    if (!q || !(q->off = malloc(sizeof *q->off * (size_t)m->n_layers)) ||
        !(q->soff = malloc(sizeof *q->soff * (size_t)(m->n_layers + 1)))) {
        if (q)
            free(q->off);
        free(q);
        mx_fail(e, MX_ENOMEM, "out of memory");
        return NULL;
    }
    memcpy(q->soff, s->state_off, sizeof *q->soff * (size_t)(m->n_layers + 1));
    size_t n = 0;
    int nh_max = 1, hd_max = 1;
    for (int l = 0; l < m->n_layers; l++) {
        const mx_attn *a = &m->layers[l].attn;
        q->off[l] = n;
        if (m->layers[l].mixer != MX_MIXER_ATTENTION)
            continue;
        n += (size_t)a->n_kv * (size_t)s->n_ctx * (size_t)a->head_dim;
        nh_max = a->n_heads > nh_max ? a->n_heads : nh_max;
        hd_max = a->head_dim > hd_max ? a->head_dim : hd_max;
    }
    q->n_ctx = s->n_ctx;
    q->n_split = (s->n_ctx + MXC_ATT_SPAN_DECODE - 1) / MXC_ATT_SPAN_DECODE;
    cudaError_t ce = dalloc(&q->k, n * sizeof(float));
    if (ce == cudaSuccess)
        ce = dalloc(&q->v, n * sizeof(float));
    if (ce == cudaSuccess)
        ce = dalloc(&q->part, (size_t)nh_max * (size_t)q->n_split * (size_t)(hd_max + 2) * sizeof(uint64_t));
    if (ce == cudaSuccess)   /* tagged partials (mxc_att's gen): no tag of a launch is 0 */
        ce = cudaMemset(q->part, 0, (size_t)nh_max * (size_t)q->n_split * (size_t)(hd_max + 2) * sizeof(uint64_t));
    const size_t ns = q->soff[m->n_layers];
    if (ce == cudaSuccess && ns) {   /* zeroed again whenever a call starts at position 0 */
        ce = dalloc(&q->state, ns * sizeof(float));
        if (ce == cudaSuccess)
            ce = cudaMemset(q->state, 0, ns * sizeof(float));
    }
    if (ce != cudaSuccess) {
        seq_state_free(q);
        mx_fail(e, MX_ENOMEM, "cuda: no room on the GPU for a KV cache of %d tokens (%.1f MiB): %s", s->n_ctx,
                2.0 * (double)n * sizeof(float) / 1048576.0, cudaGetErrorString(ce));
        return NULL;
    }
    s->dev = q;
    return q;
}

/* ---- the pass ---------------------------------------------------------------------- */

/* What one call enqueues. */
typedef struct call {
    cu_ctx *c;
    cu_seq *q;
    cu_buf *b;
    int T;
    int last_pos;                /* the furthest position of the call */
    int fused;                   /* MLXCEL_FUSED_MOE */
    int graph;                   /* being captured: nothing may wait for the GPU */
    mxc_att_fit *fit;            /* being captured: where the one-token attention launches are recorded */
    const mx_forward_trace *tr;
    /* a batched decode step: token t is the next token of sequence seqs[t]
     * (its own cache and position); NULL: the T tokens are q's */
    cu_seq *const *seqs;
    const int *pos_of;           /* [T] with seqs: each token's position */
    /* run_pass_fused: the layer's FFN norm input, for o_proj to route
     * (mxc_matvec_stream_rp); pre_routed: it did, ffn launches no router */
    const mxc_norm_in *rp_fn;
    int pre_routed;
    int *rp_h;                   /* that o_proj's h_flag (its r_flag next), or NULL: phase 1 may wait on them */
} call;

static int attend_seq(call *k, int l, cu_seq *sq, int t0, int T, int last_pos, mx_err *e);

/* Floats of split-K partial sums (16 MiB): a router of 256 rows x 1024
 * tokens split 16 ways. */
#define MM_PART_CAP ((int64_t)4 << 20)

static void mm_free(cu_ctx *c)
{
    cudaFree(c->mm.hi);
    cudaFree(c->mm.lo);
    cudaFree(c->mm.sum);
    cudaFree(c->mm.dx);
    cudaFree(c->mm.part);
    memset(&c->mm, 0, sizeof c->mm);
    c->mm_rows = 0;
}

/* Sends tile t through the tensor cores when every matrix of it is `bits`
 * (4 or 8) wide with scales of dtype dt and MLXCEL_CUDA_MMA is not 0:
 * room for `rows` rows of X of up to ld values in the split copy (grown,
 * never shrunk; prompts are never captured, so waiting here is allowed).
 * Returns 1 when t takes that path, 0 when not, < 0 with e set. */
static int mm_use(cu_ctx *c, mxc_tile *t, int bits, int dt, int64_t rows, int64_t ld, mx_err *e)
{
    t->mma = 0;
    if (!c->mma_on || (bits != 4 && bits != 8))
        return 0;
    /* k_mm indexes the split X in 32 bits (halves): a larger one (some
     * hundreds of thousands of rows) goes through the fp32 tile kernel */
    if (rows * (ld > c->mm.ld ? ld : c->mm.ld) > (int64_t)UINT32_MAX)
        return 0;
    if (rows > c->mm_rows || ld > c->mm.ld) {
        const int64_t nr = rows > c->mm_rows ? rows : c->mm_rows, nl = ld > c->mm.ld ? ld : c->mm.ld;
        cudaStreamSynchronize(c->st);
        mm_free(c);
        cudaError_t ce = dalloc(&c->mm.hi, (size_t)(nr * nl) * 2);
        if (ce == cudaSuccess)
            ce = dalloc(&c->mm.lo, (size_t)(nr * nl) * 2);
        if (ce == cudaSuccess)
            ce = dalloc(&c->mm.sum, (size_t)(nr * (nl / 32) + nr * (nl / 64)) * sizeof(float));
        if (ce == cudaSuccess)
            ce = dalloc(&c->mm.dx, (size_t)nr * sizeof(float));
        if (ce == cudaSuccess)   /* split-K partials of a small matrix (a router) */
            ce = dalloc(&c->mm.part, (size_t)MM_PART_CAP * sizeof(float));
        if (ce != cudaSuccess) {
            mm_free(c);
            cu_fail(e, ce, "cudaMalloc");
            return -1;
        }
        c->mm_rows = nr;
        c->mm.ld = nl;
        c->mm.sum2 = c->mm.sum + nr * (nl / 32);   /* the pair sums after the chunk sums, one allocation */
        c->mm.part_cap = MM_PART_CAP;
    }
    t->mma = bits;
    t->mma_dt = dt;
    t->mm = c->mm;
    return 1;
}

/* Y[t * ldy] = M x_t for the call's T rows of X (ldx apart). */
static int linear(call *k, int mi, const float *X, int64_t ldx, float *Y, int64_t ldy, int T, mx_err *e)
{
    cu_ctx *c = k->c;
    if (T <= MXC_MV_MAXT) {
        mxc_mv mv = {.n = 1, .m = {c->mats[mi]}, .y = {Y}, .ldy = {ldy}};
        KL(mxc_matvec(c->st, &mv, X, ldx, T));
        return MX_OK;
    }
    mxc_tile t = {.table = c->d_mats, .plain = {mi, mi, 0, T}, .max_rows = c->mats[mi].rows,
                  .X = X, .ldx = ldx, .Y = Y, .ldy = ldy, .prep_rows = T, .prep_k = c->mats[mi].cols,
                  .table_gs = c->mats[mi].gs};
    if (mm_use(c, &t, c->mats[mi].bits, c->mats[mi].dt, T, c->mats[mi].cols, e) < 0)
        return e->code;
    KL(mxc_tile_run(c->st, &t));
    return MX_OK;
}

/* 1 when a prompt's router and shared-expert gate can share a tensor-core
 * launch: both 4- or 8-bit with one scale dtype and one group size. */
static int router_gate_one_launch(const cu_ctx *c, const cu_layer *cl)
{
    if (!c->mma_on || cl->sgate_i < 0 || cl->router_i < 0)
        return 0;
    const mxc_mat *r = &c->mats[cl->router_i], *g = &c->mats[cl->sgate_i];
    return (r->bits == 4 || r->bits == 8) && g->bits == r->bits && g->dt == r->dt && g->gs == r->gs &&
           g->cols == r->cols;
}

/* 1 when a prompt's q, k and v projections go through the tensor cores
 * in one launch: all three 4- or 8-bit with one scale dtype. */
static int qkv_one_launch(const cu_ctx *c, const cu_layer *cl)
{
    const mxc_mat *q = &c->mats[cl->qi], *k = &c->mats[cl->ki], *v = &c->mats[cl->vi >= 0 ? cl->vi : cl->ki];
    return c->mma_on && (q->bits == 4 || q->bits == 8) && k->bits == q->bits && v->bits == q->bits &&
           k->dt == q->dt && v->dt == q->dt;
}

/* Layer l's router matvec of one token: the router's rows, then the
 * shared expert's gate row. */
static mxc_mv router_mv(const cu_ctx *c, const cu_layer *cl, const cu_buf *b)
{
    mxc_mv mv = {.n = 1, .m = {c->mats[cl->router_i]}, .y = {b->rl}, .ldy = {cl->E}};
    if (cl->sgate_i >= 0) {
        mv.n = 2;
        mv.m[1] = c->mats[cl->sgate_i];
        mv.y[1] = b->glog;
        mv.ldy[1] = 1;
    }
    return mv;
}

/* Layer l's h_flag in rp_flags (its r_flag 2 ints on: 64 bits, 8-byte
 * aligned); RP_FLAGS_AT(n_layers) ints in all. */
#define RP_FLAGS_AT(l) (2 + 4 * (l))

/* Layer cl's routes fit in its r_flag: k <= 4 experts of at most 255
 * kinds, a byte each (mxc_route's r_pack). */
static int rpack_ok(const cu_ctx *c, const cu_layer *cl)
{
    return c->rpack && cl->k <= 4 && cl->E <= 255;
}

/* Layer l's softmax top-k routing of the call's T tokens (on the GPU). */
static mxc_route route_of(const call *k, int l)
{
    const cu_ctx *c = k->c;
    const cu_layer *cl = &c->layers[l];
    const cu_buf *b = k->b;
    return (mxc_route){.logits = b->rl, .T = k->T, .E = cl->E, .k = cl->k,
                       .norm_topk = c->m->layers[l].moe.rule.norm_topk, .expert_scale = cl->expert_scale,
                       .n_extra = cl->n_extra, .glog = cl->sgate_i >= 0 ? b->glog : NULL, .P = b->P, .W = b->W};
}

static long g_rp_launches;

long mx_cuda_rp_launches(void) { return g_rp_launches; }

/* o_proj of one token with layer l's router folded in
 * (mxc_matvec_stream_rp): 1 when launched, 0 when it does not apply. */
static int oproj_routed(call *k, int l, mx_err *e)
{
    cu_ctx *c = k->c;
    const cu_layer *cl = &c->layers[l];
    const mxc_norm_in *fn = k->rp_fn;
    cu_buf *b = k->b;
    if (!c->rp_on || !fn || k->T != 1 || k->seqs || k->tr || !cl->is_moe || !cl->route_fused || c->moe_router ||
        fn->b || cl->rin_w || fn->dl.D != b->out || !fn->has || fn->dl.K)
        return 0;
    const mxc_mv rv = router_mv(c, cl, b);
    mxc_rpart rp = {.rv = rv, .x = fn->x, .w = fn->w, .eps = fn->eps, .x_out = fn->x_out, .part = c->rp_part,
                    .ss = c->rp_ss, .max_blocks = MXC_RP_MAX_BLOCKS};
    for (int i = 0; i < rv.n; i++)
        rp.E += (int)rv.m[i].rows;
    const mxc_mv mv = {.n = 1, .m = {c->mats[cl->oi]}, .y = {b->out}, .ldy = {c->m->d}};
    rp.rows = mv.m[0].rows;
    mxc_route r = route_of(k, l);
    int *fl = c->rp_flags && c->shared_early ? c->rp_flags + RP_FLAGS_AT(l) : NULL;
    if (fl) {   /* phase 1 need not wait for this launch to end */
        r.h_flag = fl;
        r.r_flag = fl + 2;
        r.epoch = c->rp_flags;
        r.h_late = c->hflag_late;
        if (c->y_tag) {   /* phase 1 stages its norm from o_proj's tagged rows */
            r.y_tag = c->y_tag;
            r.tag_mul = (unsigned)c->m->n_layers;
            r.tag_id = (unsigned)l;
        }
        r.r_pack = rpack_ok(c, cl);
    }
    const int rc = mxc_matvec_stream_rp(c->st, &mv, b->att, &rp, &r, c->route_cnt);
    if (rc < 0)
        return 0;
    if (rc) {
        cu_fail(e, (cudaError_t)rc, "mxc_matvec_stream_rp");
        return -1;
    }
    k->pre_routed = 1;
    k->rp_h = fl;
    g_rp_launches++;
    return 1;
}

/* The attention block of layer l; nin (one token, fused norms): the q/k/v
 * matvec stages the attention norm itself. */
static int attention(call *k, int l, const mxc_norm_in *nin, mx_err *e)
{
    cu_ctx *c = k->c;
    const mx_model *m = c->m;
    const mx_attn *a = &m->layers[l].attn;
    const cu_layer *cl = &c->layers[l];
    cu_buf *b = k->b;
    const int T = k->T, d = m->d;
    const int nm = cl->vi >= 0 ? 3 : 2;   /* k = v layers: no v projection */
    if (T <= MXC_MV_MAXT) {
        mxc_mv mv = {.n = nm, .m = {c->mats[cl->qi], c->mats[cl->ki], c->mats[cl->vi >= 0 ? cl->vi : cl->ki]},
                     .y = {b->q, b->k, b->v}, .ldy = {a->q.rows, a->kv_dim, a->kv_dim},
                     .early = T == 1 && c->qkv_early};
        if (nin)
            KL(mxc_matvec_stream(c->st, &mv, NULL, nin, NULL, NULL));
        else
            KL(mxc_matvec(c->st, &mv, b->xn, d, T));
    } else if (qkv_one_launch(c, cl)) {   /* q, k, v through the tensor cores in one launch */
        const mxc_mat *mq = &c->mats[cl->qi];
        int64_t mr = mq->rows;
        mr = c->mats[cl->ki].rows > mr ? c->mats[cl->ki].rows : mr;
        if (cl->vi >= 0)
            mr = c->mats[cl->vi].rows > mr ? c->mats[cl->vi].rows : mr;
        mxc_tile t = {.table = c->d_mats, .plain = {cl->qi, cl->qi, 0, T}, .max_rows = mr, .X = b->xn, .ldx = d,
                      .Y = b->q, .ldy = a->q.rows, .prep_rows = T, .prep_k = d, .table_gs = mq->gs, .pn = nm,
                      .pm = {cl->qi, cl->ki, cl->vi}, .py = {b->q, b->k, b->v},
                      .pldy = {a->q.rows, a->kv_dim, a->kv_dim}};
        if (mm_use(c, &t, mq->bits, mq->dt, T, d, e) < 0)
            return e->code;
        KL(mxc_tile_run(c->st, &t));
    } else {
        int rc;
        if ((rc = linear(k, cl->qi, b->xn, d, b->q, a->q.rows, T, e)) ||
            (rc = linear(k, cl->ki, b->xn, d, b->k, a->kv_dim, T, e)) ||
            (cl->vi >= 0 && (rc = linear(k, cl->vi, b->xn, d, b->v, a->kv_dim, T, e))))
            return rc;
    }
    int rc;
    if (!k->seqs) {
        rc = attend_seq(k, l, k->q, 0, T, k->last_pos, e);
    } else {   /* a batched step: each token's heads and attention over its own sequence's cache */
        rc = MX_OK;
        for (int t = 0; t < T && !rc; t++)
            rc = attend_seq(k, l, k->seqs[t], t, 1, k->pos_of[t], e);
    }
    if (rc)
        return rc;
    if (a->out_gate)
        KL(mxc_out_gate(c->st, b->att, b->q, a->q.rows, T, a->n_heads, a->head_dim));
    if ((rc = oproj_routed(k, l, e)))
        return rc < 0 ? e->code : MX_OK;
    return linear(k, cl->oi, b->att, a->q_dim, b->out, d, T, e);
}

/* The q/k/v heads (norms, RoPE, k and v into q's cache) and the attention
 * of rows t0 .. t0 + T - 1 of the call's q/k/v over sequence q's cache;
 * last_pos is the furthest position of those rows. */
static int attend_seq(call *k, int l, cu_seq *sq, int t0, int T, int last_pos, mx_err *e)
{
    cu_ctx *c = k->c;
    const mx_model *m = c->m;
    const mx_attn *a = &m->layers[l].attn;
    const cu_layer *cl = &c->layers[l];
    cu_buf *b = k->b;
    const size_t r = (size_t)t0;
    const mx_rope *ro = &m->ropes[cl->rope];
    float *kc = sq->k + sq->off[l], *vc = sq->v + sq->off[l];
    mxc_qkv p = {.q = b->q + r * (size_t)a->q.rows, .k = b->k + r * (size_t)a->kv_dim,
                 .v = (a->k_eq_v ? b->k : b->v) + r * (size_t)a->kv_dim, .q_rows = a->q.rows, .q_gate = a->out_gate, .qr = b->qr + r * (size_t)a->q_dim,
                 .kc = kc, .vc = vc, .n_ctx = sq->n_ctx, .pos = b->pos + r, .T = T, .nh = a->n_heads, .nkv = a->n_kv,
                 .hd = a->head_dim, .qk_norm = m->fam->qk_norm == MX_QK_NORM_HEAD ? 1
                                               : m->fam->qk_norm == MX_QK_NORM_FULL ? 2 : 0,
                 .q_norm = cl->q_norm, .k_norm = cl->k_norm, .eps = m->eps,
                 .clip = m->cfg.clip_qkv > 0 ? (float)m->cfg.clip_qkv : 0.0f, .v_norm = a->v_norm,
                 .rope_dims = ro->dims, .inv_freq = c->inv_freq[cl->rope], .inv_freq_long = c->inv_long[cl->rope],
                 .mscale = ro->mscale, .mscale_long = ro->mscale_long, .orig_max = ro->orig_max};
    if (T > 1 || !c->fuse_on)
        KL(mxc_qkv_post(c->st, &p));
    mxc_att at = {.qr = p.qr, .kc = kc, .vc = vc, .n_ctx = sq->n_ctx, .pos = p.pos, .T = T,
                  .nh = a->n_heads, .nkv = a->n_kv, .hd = a->head_dim, .window = a->window,
                  .scale = a->scale, .out = b->att + r * (size_t)a->q_dim, .hpos = -1};
    if (T == 1) {   /* the sequence's partials cover its whole context (graphs replay at any position) */
        at.part = sq->part;
        at.cnt = c->att_cnt;
        at.gen = c->att_tagged ? c->att_gen : NULL;
        at.fuse = c->fuse_on;
        at.max_z = c->att_blocks;
        at.qkv = p;
        at.span = c->att_span ? c->att_span : MXC_ATT_SPAN_DECODE;
        at.span_auto = !c->att_span;
        at.n_split = k->graph ? sq->n_split : (last_pos + at.span) / at.span;
        at.hpos = k->graph ? -1 : last_pos;
        at.fit = k->graph ? k->fit : NULL;
    } else {
        at.tile = c->att_tile;
        at.span = MXC_ATT_SPAN_PROMPT;
        at.n_split = (last_pos + at.span) / at.span;
        int rc = part_reserve(b, (size_t)T * (size_t)a->n_heads * (size_t)at.n_split * (size_t)(a->head_dim + 2), e);
        if (rc)
            return rc;
        at.part = b->part;
    }
    KL(mxc_attend(c->st, &at));
    return MX_OK;
}

/* ---- the recurrent mixers ------------------------------------------------------------ */

/* Run i of the call's rows: rows t0 .. t0 + n - 1 continue one sequence
 * (all T rows of q, or in a batched step row i of seqs[i]). */
static cu_seq *run_of(const call *k, int i, int *t0, int *n)
{
    if (!k->seqs) {
        *t0 = 0;
        *n = k->T;
        return k->q;
    }
    *t0 = i;
    *n = 1;
    return k->seqs[i];
}

/* LFM2's short convolution of layer l: b->out = out_proj(C * conv(B * x))
 * of the normed stream b->xn (model/forward.c's shortconv_block). */
static int shortconv(call *k, int l, mx_err *e)
{
    cu_ctx *c = k->c;
    const mx_model *m = c->m;
    const mx_shortconv *sc = &m->layers[l].sc;
    const cu_layer *cl = &c->layers[l];
    cu_buf *b = k->b;
    const int d = m->d;
    const int64_t rows = sc->in.rows;
    int rc = linear(k, cl->in_i, b->xn, d, b->mix_in, rows, k->T, e);
    if (rc)
        return rc;
    for (int i = 0; i < (k->seqs ? k->T : 1); i++) {
        int t0, n;
        cu_seq *q = run_of(k, i, &t0, &n);
        mxc_conv p = {.mode = MXC_CONV_LFM2, .n = n, .C = d, .K = sc->L, .in = b->mix_in + (size_t)t0 * rows,
                      .ld_in = rows, .out = b->mix_out + (size_t)t0 * d, .ld_out = d,
                      .win = q->state + q->soff[l], .w = cl->conv_w, .b = cl->conv_b};
        KL(mxc_conv_causal(c->st, &p));
    }
    return linear(k, cl->mo_i, b->mix_out, d, b->out, d, k->T, e);
}

/* Qwen3-Next's gated DeltaNet of layer l: b->out of the normed stream
 * b->xn (model/forward.c's deltanet_block; the delta rule token by token
 * here, also for a prompt). */
static int deltanet(call *k, int l, mx_err *e)
{
    cu_ctx *c = k->c;
    const mx_model *m = c->m;
    const mx_deltanet *dn = &m->layers[l].dn;
    const cu_layer *cl = &c->layers[l];
    cu_buf *b = k->b;
    const int d = m->d;
    const int64_t qr = dn->qkvz.rows, br = dn->ba.rows, vd = (int64_t)dn->nv * dn->dv;
    int rc = linear(k, cl->in_i, b->xn, d, b->mix_in, qr, k->T, e);
    if (!rc)
        rc = linear(k, cl->ba_i, b->xn, d, b->mix_in2, br, k->T, e);
    if (rc)
        return rc;
    for (int i = 0; i < (k->seqs ? k->T : 1); i++) {
        int t0, n;
        cu_seq *q = run_of(k, i, &t0, &n);
        float *st = q->state + q->soff[l];
        mxc_conv p = {.mode = MXC_CONV_DELTANET, .n = n, .C = dn->conv_dim, .K = dn->K,
                      .in = b->mix_in + (size_t)t0 * qr, .ld_in = qr,
                      .out = b->mix_conv + (size_t)t0 * dn->conv_dim, .ld_out = dn->conv_dim, .win = st,
                      .w = cl->conv_w, .nk = dn->nk, .dk = dn->dk, .dv = dn->dv, .r = dn->nv / dn->nk};
        KL(mxc_conv_causal(c->st, &p));
        mxc_dn r = {.n = n, .nk = dn->nk, .nv = dn->nv, .dk = dn->dk, .dv = dn->dv, .conv = p.out,
                    .qkvz = p.in, .ba = b->mix_in2 + (size_t)t0 * br, .conv_dim = dn->conv_dim, .qkvz_rows = qr,
                    .ba_rows = br, .S = st + (size_t)dn->conv_dim * (size_t)(dn->K - 1),
                    .out = b->mix_out + (size_t)t0 * vd, .A_log = cl->A_log, .dt_bias = cl->dt_bias,
                    .norm_w = cl->dn_norm, .eps = m->eps};
        KL(mxc_delta_rule(c->st, &r));
    }
    return linear(k, cl->mo_i, b->mix_out, vd, b->out, d, k->T, e);
}

/* The mixer of layer l: b->out of the normed stream b->xn; nin as
 * attention's. */
static int mixer(call *k, int l, const mxc_norm_in *nin, mx_err *e)
{
    switch (k->c->layers[l].mixer) {
    case MX_MIXER_SHORTCONV: return shortconv(k, l, e);
    case MX_MIXER_DELTANET: return deltanet(k, l, e);
    default: return attention(k, l, nin, e);
    }
}

/* The dispatch rule of moe/dispatch.c for a layer's one-token steps: the
 * fused path when it is on, every expert matrix is quantized and none is
 * wider than MLXCEL_FUSED_MOE_MAX_DFF. */
static int takes_fused(const cu_layer *cl, int fused_on)
{
    return fused_on && cl->all_quant && cl->ff_max <= mx_moe_fused_max_dff();
}

/* Slot offsets of one token's rows of h: routed slots dff wide, then the
 * extras. */
static void slot_offsets(const cu_layer *cl, int *off)
{
    off[0] = 0;
    for (int j = 0; j < cl->Kp; j++)
        off[j + 1] = off[j] + (int)(j < cl->k ? cl->dff : cl->extra_ff[j - cl->k]);
}

/* The routes of T tokens from the router logits on the host (routers the
 * GPU does not run), sent back as P and W. */
static int host_routes(call *k, int l, mx_err *e)
{
    cu_ctx *c = k->c;
    const mx_moe_block *mb = &c->m->layers[l].moe;
    const cu_layer *cl = &c->layers[l];
    cu_buf *b = k->b;
    const int T = k->T;
    int rc = host_reserve(c, T, e);
    if (rc)
        return rc;
    CK(d2h(c->st, c->h_rl, b->rl, sizeof(float) * (size_t)T * (size_t)cl->E));
    if (cl->sgate_i >= 0)
        CK(d2h(c->st, c->h_glog, b->glog, sizeof(float) * (size_t)T));
    for (int t = 0; t < T; t++) {
        mx_route r;
        mx_moe_route(&mb->rule, c->h_rl + (size_t)t * (size_t)cl->E, cl->E, &r);
        for (int j = 0; j < cl->Kp; j++) {
            const size_t i = (size_t)t * (size_t)cl->Kp + (size_t)j;
            if (j < cl->k) {
                c->h_P[i] = r.idx[j];
                c->h_W[i] = r.w[j];
            } else {
                c->h_P[i] = cl->E + (j - cl->k);
                c->h_W[i] = j == cl->k && cl->sgate_i >= 0 ? 1.0f / (1.0f + expf(-c->h_glog[t])) : 1.0f;
            }
        }
    }
    CK(h2d(c->st, b->P, c->h_P, sizeof(int) * (size_t)T * (size_t)cl->Kp));
    CK(h2d(c->st, b->W, c->h_W, sizeof(float) * (size_t)T * (size_t)cl->Kp));
    return MX_OK;
}

static long g_routed_launches, g_estride_launches;

long mx_cuda_routed_launches(void) { return g_routed_launches; }

long mx_cuda_estride_launches(void) { return g_estride_launches; }

int mx_cuda_wgmma_active(void) { return mxc_wgmma_active(); }

/* The expert sum of the call's token t (routes P, W: [T][Kp]): both fused
 * phases over all slots, or (gather) one expert at a time; *dl says where
 * the sums of all T tokens are (each slot's row apart, or b->ffn).  With
 * rmv (one token, fused, the streaming kernels): the router matvec rmv of
 * the norm rnin routing by rt too, in phase 1's launch where it can. */
static int moe_one(call *k, const cu_layer *cl, int t, const int *P, const float *W, int fused,
                   const mxc_norm_in *nin, const mxc_mv *rmv, const mxc_route *rt, const mxc_norm_in *rnin,
                   mxc_delta *dl, mx_err *e)
{
    cu_ctx *c = k->c;
    cu_buf *b = k->b;
    const int64_t d = c->m->d, Kp = cl->Kp, r = t;
    mxc_moe1 p = {.table = c->d_mats + cl->table, .P = P + r * Kp, .W = W + r * Kp, .lo = 0, .hi = cl->Kp,
                  .x = b->xn + r * d, .h = b->H + r * Kp * cl->ff_max, .out = b->ffn + r * d, .d = d,
                  .act = c->m->act == MX_ACT_GELU_TANH, .early = c->moe2_early, .h_all = c->h_all};
    slot_offsets(cl, p.off);
    if (cl->estride && c->estride) {   /* the routed experts' matrices from their parameters */
        p.estride = c->estride;
        g_estride_launches++;
        for (int t = 0; t < 3; t++) {
            p.e0[t] = c->mats[cl->table + t];
            for (int q = 0; q < 3; q++)
                p.estr[t][q] = cl->estr[t][q];
        }
    }
    if (c->estride)
        for (int x = 0; x < cl->n_extra && x < 2; x++, p.n_xd++)
            p.xd[x] = c->mats[cl->table + 3 * (cl->E + x) + 2];
    if (cl->s_bits) {
        p.bits = cl->s_bits;
        p.Y = b->Y + r * Kp * d;
        if (nin) {   /* phase 1 stages the norm itself */
            p.nin = *nin;
            p.has_nin = 1;
        }
        if (fused) {
            int rc = -1;
            if (rmv) {   /* the router in phase 1's launch, else a launch of its own first */
                p.ready = c->route_cnt + 1;
                p.n_routed = cl->k;
                p.kind0 = cl->E;
                if ((rc = mxc_moe_stream_routed(c->st, &p, cl->s_dt, rmv, rnin, rt, c->route_cnt)) < 0) {
                    p.ready = NULL;
                    KL(mxc_matvec_stream(c->st, rmv, NULL, rnin, rt, c->route_cnt));
                }
            }
            if (rc < 0) {
                if (c->extras_first && cl->n_extra > 0 && cl->k > 0 && P != c->one_P) {
                    /* the shared experts' rows first, asked for before
                     * phase 1 waits for the routes */
                    p.extras_first = 1;
                    p.n_routed = cl->k;
                    p.kind0 = cl->E;
                    if (k->rp_h && t == 0) {   /* o_proj raises them (oproj_routed) */
                        p.h_flag = k->rp_h;
                        p.r_flag = k->rp_h + 2;
                        p.r_pack = rpack_ok(c, cl);
                        p.epoch = c->rp_flags;
                        if (c->y_tag) {
                            p.y_tag = c->y_tag;
                            p.tag_mul = (unsigned)c->m->n_layers;
                            p.tag_id = (unsigned)(cl - c->layers);
                        }
                    }
                }
                KL(mxc_moe_stream(c->st, &p, cl->s_dt));
            } else {
                KL(rc);
                g_routed_launches++;
            }
        } else {
            for (int j = 0; j < cl->Kp; j++) {
                p.lo = j;
                p.hi = j + 1;
                KL(mxc_moe_stream(c->st, &p, cl->s_dt));
                p.nin.x_out = NULL;   /* the first slot's launch wrote it */
            }
        }
        *dl = (mxc_delta){.Y = b->Y, .W = W, .K = cl->Kp};
        return MX_OK;
    }
    *dl = (mxc_delta){.D = b->ffn};
    p.bits = cl->gu_bits;
    if (fused) {
        KL(mxc_moe_phase1(c->st, &p));
        KL(mxc_moe_phase2(c->st, &p));
        return MX_OK;
    }
    for (int j = 0; j < cl->Kp; j++) {
        p.lo = j;
        p.hi = j + 1;
        p.accumulate = j > 0;
        KL(mxc_moe_phase1(c->st, &p));
        KL(mxc_moe_phase2(c->st, &p));
    }
    return MX_OK;
}

/* The fused expert sums of all T tokens of a batched step in one launch
 * of each phase (mxc_moe_stream_tokens: T x Kp slots, token-major, so
 * that *dl is the one-token layout repeated); the streaming kernels' layers
 * only.  0: done, 1: does not apply (nothing launched), -1: error (e).
 * On by default (MLXCEL_CUDA_BATCH_FUSE=0: a pair of launches per token):
 * batch 8 measured 610-622 tok/s against 563-575 (docs/cuda.md). */
static int moe_tokens(call *k, const cu_layer *cl, mxc_delta *dl, mx_err *e)
{
    cu_ctx *c = k->c;
    cu_buf *b = k->b;
    const int T = k->T, Kp = cl->Kp;
    if (!cl->s_bits || T * Kp > MXC_MAX_SLOTS)
        return 1;
    mxc_moe1 p = {.table = c->d_mats + cl->table, .P = b->P, .W = b->W, .lo = 0, .hi = T * Kp, .x = b->xn,
                  .h = b->H, .d = c->m->d, .act = c->m->act == MX_ACT_GELU_TANH, .bits = cl->s_bits, .Y = b->Y,
                  .kp = Kp};
    int one[MXC_MAX_SLOTS + 1];
    slot_offsets(cl, one);
    p.off[0] = 0;
    for (int t = 0; t < T; t++)
        for (int j = 0; j < Kp; j++)
            p.off[t * Kp + j + 1] = p.off[t * Kp + j] + (one[j + 1] - one[j]);
    const int rc = mxc_moe_stream_tokens(c->st, &p, cl->s_dt);
    if (rc < 0)
        return 1;
    if (rc) {
        cu_fail(e, (cudaError_t)rc, "mxc_moe_stream_tokens");
        return -1;
    }
    *dl = (mxc_delta){.Y = b->Y, .W = b->W, .K = Kp};
    return 0;
}

/* The largest batched decode step whose MoE layers take each token through
 * the one-token kernels (MLXCEL_CUDA_BATCH_MOE, default 16); larger ones
 * group the (token, expert) pairs by expert as a prompt does (moe_many).
 * The grouped tiles cost about as much at 8 tokens as at 128 (their work
 * is per tile of 64 pairs of one expert, mostly empty in small batches),
 * while the one-token kernels read each token's experts once per token:
 * on the qwen1.5 synth (H200) per token wins at 8 sequences (380 against
 * 285 tok/s), ties at 32 (561, 572) and loses at 64 (587, 731). */
static int batch_moe_max(void)
{
    const char *v = getenv("MLXCEL_CUDA_BATCH_MOE");
    return v && *v ? atoi(v) : 16;
}

/* T tokens' expert sums: (token, slot) pairs grouped by slot kind, tiles
 * of up to 32 pairs of one kind through gate/up and down, then each
 * token's weighted sum. */
/* Copies n bytes of pinned host memory to the device in stream order,
 * without waiting (the host half is not written again before a later
 * layer's wait has seen the copy done: moe_many). */
static cudaError_t h2d_async(cudaStream_t st, void *dst, const void *src, size_t n)
{
    return n ? cudaMemcpyAsync(dst, src, n, cudaMemcpyHostToDevice, st) : cudaSuccess;
}

/* Appends the items (tiles of at most `tile` pairs) of kinds [x0, x1),
 * whose pairs end at cnt[x] in the sorted lists (kind x0's start at
 * `start`), to gu / dn from index n; returns the new count. */
static int add_items(const cu_layer *cl, const int *cnt, int x0, int x1, int start, int tile, mxc_item *gu,
                     mxc_item *dn, int n)
{
    for (int x = x0; x < x1; x++) {
        for (int o = start; o < cnt[x]; o += tile) {
            const int m = cnt[x] - o < tile ? cnt[x] - o : tile, base = cl->table + 3 * x;
            gu[n] = (mxc_item){base, base + 1, o, m};
            dn[n] = (mxc_item){base + 2, base + 2, o, m};
            n++;
        }
        start = cnt[x];
    }
    return n;
}

/* The experts of T > 1 tokens: the (token, slot) pairs sorted by kind
 * (expert, then the extra MLPs), tiles of one kind's pairs for gate/up and
 * down, then the weighted sum.  The pairs of the extra MLPs (a shared
 * expert) are known before the routes are: every token's slots k .. Kp - 1,
 * after all routed pairs in the sorted lists.  So, with the routes made on
 * the GPU, their gate/up is launched first, and the routes come back on a
 * stream of their own while it runs: the host's round trip (the copy
 * back, the sort, the lists up) no longer leaves the GPU idle. */
static int moe_many(call *k, int l, mx_err *e)
{
    cu_ctx *c = k->c;
    const cu_layer *cl = &c->layers[l];
    cu_buf *b = k->b;
    const int T = k->T, Kp = cl->Kp, kinds = cl->E + cl->n_extra, npair = T * Kp;
    int rc = host_reserve(c, T, e);
    if (rc)
        return rc;
    const int64_t IC = item_cap(c, T);   /* a half of items: gate/up at [0, IC), down at [IC, 2 IC) */
    /* the halves (host and device) this layer fills: the layer before may
     * still read the others; the one before that is done with these (its
     * copies and kernels came before this layer's routes, which the last
     * layer's wait on st_routes saw) */
    const int half = c->stage_flip;
    c->stage_flip ^= 1;
    const size_t hpairs = (size_t)c->h_cap * (size_t)(c->Kp_max ? c->Kp_max : 1);   /* halves at fixed offsets */
    int *tok_list = c->h_lists + (size_t)half * 2 * hpairs, *pair_list = tok_list + npair;
    mxc_item *gu = c->h_items + (size_t)half * 2 * (size_t)item_cap(c, c->h_cap), *dn = gu + IC;
    const size_t dpairs = (size_t)b->cap * (size_t)(c->Kp_max ? c->Kp_max : 1);
    int *d_tok = b->tok_list + half * dpairs, *d_pair = b->pair_list + half * dpairs;
    mxc_item *d_items = b->items + (size_t)half * 2 * (size_t)item_cap(c, b->cap);
    cudaStream_t sr = c->st_routes;   /* every copy of the lists and routes, off the kernels' stream */
    const int mm = c->mma_on && cl->s_bits, tile = mm ? MXC_MM_T : MXC_TILE_T;
    const int d = c->m->d, nr = T * cl->k;   /* routed pairs: [0, nr) of the sorted lists */
    int *cnt = c->h_cnt;
    mxc_tile t1 = {.table = c->d_mats, .items = d_items, .max_rows = cl->ff_max, .in_list = d_tok,
                   .out_list = d_pair, .X = b->xn, .ldx = d, .Y = b->H, .ldy = cl->ff_max, .dual = 1,
                   .act = c->m->act == MX_ACT_GELU_TANH, .prep_rows = T, .prep_k = d};
    const int64_t ld = cl->ff_max > d ? cl->ff_max : d;
    int ne = 0;   /* the extra MLPs' items, first in b->items */
    const int extras_first = cl->gpu_route && cl->n_extra > 0;
    if (extras_first) {
        /* kind E + j's pairs: slot k + j of every token, in token order */
        for (int j = 0; j < cl->n_extra; j++) {
            for (int t = 0; t < T; t++) {
                tok_list[nr + j * T + t] = t;
                pair_list[nr + j * T + t] = t * Kp + cl->k + j;
            }
            cnt[cl->E + j] = nr + (j + 1) * T;
        }
        ne = add_items(cl, cnt, cl->E, kinds, nr, tile, gu, dn, 0);
        /* on st_routes, ahead of the routes: they run while the attention does */
        CK(h2d_async(sr, d_tok + nr, tok_list + nr, sizeof(int) * (size_t)(npair - nr)));
        CK(h2d_async(sr, d_pair + nr, pair_list + nr, sizeof(int) * (size_t)(npair - nr)));
        CK(h2d_async(sr, d_items, gu, sizeof(mxc_item) * (size_t)ne));
        CK(h2d_async(sr, d_items + IC, dn, sizeof(mxc_item) * (size_t)ne));
        CK(cudaEventRecord(c->ev_extras, sr));
    }
    if (cl->gpu_route) {   /* the routes on their way back */
        CK(cudaEventRecord(c->ev_routes, c->st));
        CK(cudaStreamWaitEvent(sr, c->ev_routes, 0));
        CK(cudaMemcpyAsync(c->h_P, b->P, sizeof(int) * (size_t)npair, cudaMemcpyDeviceToHost, sr));
    }
    if (extras_first) {
        CK(cudaStreamWaitEvent(c->st, c->ev_extras, 0));
        mxc_tile te = t1;
        te.n_items = ne;
        if (mm && mm_use(c, &te, cl->s_bits, cl->s_dt, npair > T ? npair : T, ld, e) < 0)
            return e->code;
        KL(mxc_tile_run(c->st, &te));   /* splits the T rows of X for the routed tiles too */
    }
    if (cl->gpu_route)
        CK(cudaStreamSynchronize(sr));
    /* counting sort of the pairs by kind (only the routed ones when the
     * extras' are in place) */
    const int sorted = extras_first ? nr : npair, x1 = extras_first ? cl->E : kinds;
    memset(cnt, 0, sizeof(int) * (size_t)(x1 + 1));
    for (int p = 0; p < npair; p++) {
        if (c->h_P[p] < 0 || c->h_P[p] >= kinds)   /* the routes of NaN logits, say */
            return mx_fail(e, MX_EIO, "cuda: layer %d: token %d was routed to expert %d of %d", l, p / Kp,
                           c->h_P[p], kinds);
        if (c->h_P[p] < x1)
            cnt[c->h_P[p] + 1]++;
    }
    for (int x = 0; x < x1; x++)
        cnt[x + 1] += cnt[x];
    if (cnt[x1] != sorted)   /* an extra slot routed elsewhere: the lists would overlap */
        return mx_fail(e, MX_EIO, "cuda: layer %d: %d routed pairs, expected %d", l, cnt[x1], sorted);
    for (int p = 0; p < npair; p++) {
        if (c->h_P[p] >= x1)
            continue;
        const int at = cnt[c->h_P[p]]++;
        tok_list[at] = p / Kp;
        pair_list[at] = p;
    }
    /* cnt[x] is now the end of kind x's pairs: the items of the sorted
     * kinds after the extras' (items of <= 32 pairs, 64 on the tensor cores) */
    const int n_items = add_items(cl, cnt, 0, x1, 0, tile, gu, dn, ne);
    int n_routed = n_items;   /* without extras first: where the extras' items start */
    for (int i = ne; i < n_items && !extras_first; i++)
        if (gu[i].m0 >= cl->table + 3 * cl->E) {
            n_routed = i;
            break;
        }
    CK(h2d_async(sr, d_tok, tok_list, sizeof(int) * (size_t)sorted));
    CK(h2d_async(sr, d_pair, pair_list, sizeof(int) * (size_t)sorted));
    CK(h2d_async(sr, d_items + ne, gu + ne, sizeof(mxc_item) * (size_t)(n_items - ne)));
    CK(h2d_async(sr, d_items + IC + ne, dn + ne, sizeof(mxc_item) * (size_t)(n_items - ne)));
    CK(cudaEventRecord(c->ev_lists, sr));
    CK(cudaStreamWaitEvent(c->st, c->ev_lists, 0));
    mxc_tile t2 = {.table = c->d_mats, .items = d_items + IC, .n_items = n_items, .max_rows = d,
                   .in_list = d_pair, .out_list = d_pair, .X = b->H, .ldx = cl->ff_max,
                   .Y = b->Y, .ldy = d};
    t1.items = d_items + ne;
    t1.n_items = n_items - ne;
    if (mm) {   /* gate/up: the T token rows split once; down: each item's pair rows */
        if (mm_use(c, &t1, cl->s_bits, cl->s_dt, npair > T ? npair : T, ld, e) < 0 ||
            mm_use(c, &t2, cl->s_bits, cl->s_dt, npair > T ? npair : T, ld, e) < 0)
            return e->code;
    }
    if (extras_first) {
        t1.max_rows = cl->dff;   /* the routed experts' rows (the extras' may be wider) */
        t1.skip_prep = mm;       /* the extras' launch split the rows */
        KL(mxc_tile_run(c->st, &t1));
    } else if (mm && cl->n_extra > 0 && n_routed > 0 && n_routed < n_items && cl->dff < cl->ff_max) {
        /* the routed experts' gate/up apart from the wider extra MLPs (a
         * shared expert 4x wider): a grid as wide as the widest would
         * launch mostly blocks past the routed experts' rows */
        mxc_tile ta = t1, tb = t1;
        ta.n_items = n_routed;
        ta.max_rows = cl->dff;
        tb.items = d_items + n_routed;
        tb.n_items = n_items - n_routed;
        tb.skip_prep = 1;   /* the same rows of X, split by ta */
        KL(mxc_tile_run(c->st, &ta));
        KL(mxc_tile_run(c->st, &tb));
    } else {
        KL(mxc_tile_run(c->st, &t1));
    }
    KL(mxc_tile_run(c->st, &t2));
    KL(mxc_combine(c->st, b->Y, b->W, T, Kp, d, b->ffn));
    return MX_OK;
}

/* A dense layer's MLP on T > 1 tokens: gate/up tiles, then down. */
static int mlp_many(call *k, const cu_layer *cl, mx_err *e)
{
    cu_ctx *c = k->c;
    cu_buf *b = k->b;
    const int d = c->m->d;
    const int64_t ff = cl->extra_ff[0];
    mxc_tile t1 = {.table = c->d_mats, .plain = {cl->table, cl->table + 1, 0, k->T}, .max_rows = ff,
                   .X = b->xn, .ldx = d, .Y = b->H, .ldy = ff, .dual = 1,
                   .act = c->m->act == MX_ACT_GELU_TANH, .prep_rows = k->T, .prep_k = d};
    mxc_tile t2 = {.table = c->d_mats, .plain = {cl->table + 2, cl->table + 2, 0, k->T}, .max_rows = d,
                   .X = b->H, .ldx = ff, .Y = b->ffn, .ldy = d, .prep_rows = k->T, .prep_k = ff,
                   .table_gs = c->mats[cl->table + 2].gs};
    const int64_t ld = ff > d ? ff : d;
    if (mm_use(c, &t1, cl->s_bits, cl->s_dt, k->T, ld, e) < 0 || mm_use(c, &t2, cl->s_bits, cl->s_dt, k->T, ld, e) < 0)
        return e->code;
    KL(mxc_tile_run(c->st, &t1));
    KL(mxc_tile_run(c->st, &t2));
    return MX_OK;
}

/* Layer l's feed-forward; its output is left where *dl says.  nin (one
 * token, fused norms): the router matvec (or a dense layer's phase 1)
 * stages the norm itself and writes the residual to nin->x_out. */
static int ffn(call *k, int l, const mxc_norm_in *nin, mxc_delta *dl, mx_err *e)
{
    cu_ctx *c = k->c;
    const mx_model *m = c->m;
    const cu_layer *cl = &c->layers[l];
    cu_buf *b = k->b;
    const int T = k->T, d = m->d;
    const float *rx = cl->rin_w ? b->xn2 : b->xn;   /* the router's input (Gemma 4: its own norm) */
    *dl = (mxc_delta){.D = b->ffn};
    if (!cl->is_moe) {
        if (T > 1)
            return mlp_many(k, cl, e);
        return moe_one(k, cl, 0, c->one_P, c->one_W, 1, nin, NULL, NULL, NULL, dl, e);
    }
    /* router logits and the shared expert's gate logit (and, fused, the
     * routes: the matvec's last block) */
    int routed = 0;
    mxc_route r = route_of(k, l);
    if (k->pre_routed) {   /* o_proj's last block routed (oproj_routed) and wrote the residual */
        k->pre_routed = 0;
        routed = 1;
    } else if (T == 1 && (nin || cl->route_fused)) {
        mxc_mv mv = router_mv(c, cl, b);
        routed = cl->route_fused;
        if (routed && nin && !k->seqs && c->moe_router && cl->s_bits && takes_fused(cl, k->fused) &&
            !(k->tr && k->tr->router_logits)) {
            /* the router's blocks in phase 1's launch (the norm staged by
             * both, the residual written by the router's) */
            if (!k->graph)
                mx_moe_count(MX_MOE_FUSED, 1);
            mxc_norm_in n2 = *nin;
            n2.x_out = NULL;
            return moe_one(k, cl, 0, b->P, b->W, 1, &n2, &mv, &r, nin, dl, e);
        }
        KL(mxc_matvec_stream(c->st, &mv, nin ? NULL : rx, nin, routed ? &r : NULL, c->route_cnt));
    } else if (T <= MXC_MV_MAXT) {
        mxc_mv mv = router_mv(c, cl, b);
        KL(mxc_matvec(c->st, &mv, rx, d, T));
    } else if (router_gate_one_launch(c, cl)) {
        /* the router and the shared expert's one-row gate in one launch on
         * the tensor cores (one split of X, K split for both), not two */
        const mxc_mat *mr = &c->mats[cl->router_i], *mg = &c->mats[cl->sgate_i];
        mxc_tile t = {.table = c->d_mats, .plain = {cl->router_i, cl->router_i, 0, T},
                      .max_rows = mr->rows > mg->rows ? mr->rows : mg->rows, .X = rx, .ldx = d, .Y = b->rl,
                      .ldy = cl->E, .prep_rows = T, .prep_k = d, .table_gs = mr->gs, .pn = 2, .pn_split = 1,
                      .pm = {cl->router_i, cl->sgate_i}, .py = {b->rl, b->glog}, .pldy = {cl->E, 1}};
        int u = mm_use(c, &t, mr->bits, mr->dt, T, d, e);
        if (u < 0)
            return e->code;
        if (u)
            KL(mxc_tile_run(c->st, &t));
        else if ((u = linear(k, cl->router_i, rx, d, b->rl, cl->E, T, e)) ||
                 (u = linear(k, cl->sgate_i, rx, d, b->glog, 1, T, e)))
            return u;
    } else {
        int rc = linear(k, cl->router_i, rx, d, b->rl, cl->E, T, e);
        if (!rc && cl->sgate_i >= 0)
            rc = linear(k, cl->sgate_i, rx, d, b->glog, 1, T, e);
        if (rc)
            return rc;
    }
    if (k->tr && k->tr->router_logits)
        CK(d2h(c->st, k->tr->router_logits + (size_t)l * (size_t)T * (size_t)m->n_experts, b->rl,
               sizeof(float) * (size_t)T * (size_t)cl->E));
    int rc;
    if (routed) {
        /* done by the router matvec */
    } else if (cl->gpu_route) {
        KL(mxc_route_softmax(c->st, &r));
    } else if ((rc = host_routes(k, l, e))) {
        return rc;
    }
    const int fused = takes_fused(cl, k->fused);
    if (T > 1 && k->seqs && T <= batch_moe_max()) {
        /* a small batched step: each token through the one-token kernels
         * (fused or gather), which read only its own experts */
        mx_moe_count(fused ? MX_MOE_FUSED : MX_MOE_GATHER, T);
        if (fused && mx_env_flag("MLXCEL_CUDA_BATCH_FUSE", 1) && (rc = moe_tokens(k, cl, dl, e)) <= 0)
            return rc < 0 ? e->code : MX_OK;   /* < 0: error, 0: done */
        for (int t = 0; t < T; t++)
            if ((rc = moe_one(k, cl, t, b->P, b->W, fused, NULL, NULL, NULL, NULL, dl, e)))
                return rc;
        return MX_OK;
    }
    if (T > 1) {
        mx_moe_count(MX_MOE_GATHER, 1);
        return moe_many(k, l, e);
    }
    if (!k->graph)   /* a captured step is counted when it runs (count_step) */
        mx_moe_count(fused ? MX_MOE_FUSED : MX_MOE_GATHER, 1);
    mxc_norm_in n2;
    if (nin) {   /* the router matvec wrote the residual */
        n2 = *nin;
        n2.x_out = NULL;
    }
    return moe_one(k, cl, 0, b->P, b->W, fused, nin ? &n2 : NULL, NULL, NULL, NULL, dl, e);
}

/* Gemma 4's parallel layer l (model/forward.c's ffn_parallel), b->xn the
 * stream x after the feed-forward norm: the dense MLP on it, the experts
 * on moe_in_norm(x), routed by rmsnorm(x) * scale / sqrt(d); b->ffn gets
 * mlp_out_norm(mlp) + moe_out_norm(experts) (*dl says so). */
static int ffn_parallel(call *k, int l, mxc_delta *dl, mx_err *e)
{
    cu_ctx *c = k->c;
    const mx_model *m = c->m;
    const cu_layer *cl = &c->layers[l];
    cu_buf *b = k->b;
    const int T = k->T, d = m->d;
    int rc;
    /* the dense branch, into ffn2 normed */
    mxc_delta dd = {.D = b->ffn};
    if (T > 1)
        rc = mlp_many(k, cl->dense, e);
    else
        rc = moe_one(k, cl->dense, 0, c->one_P, c->one_W, 1, NULL, NULL, NULL, NULL, &dd, e);
    if (rc)
        return rc;
    KL(mxc_delta_store(c->st, b->ffn2, &dd, T, d));
    KL(mxc_addnorm(c->st, b->ffn2, NULL, cl->mlo_w, cl->mlo_b, T, d, m->eps, b->ffn2));
    /* the router's input into xn2, the experts' into xn (the MLP is done with it) */
    KL(mxc_addnorm(c->st, b->x, NULL, cl->rin_w, NULL, T, d, m->eps, b->xn2));
    KL(mxc_addnorm(c->st, b->x, NULL, cl->mei_w, cl->mei_b, T, d, m->eps, b->xn));
    mxc_delta de;
    if ((rc = ffn(k, l, NULL, &de, e)))
        return rc;
    KL(mxc_delta_store(c->st, b->ffn, &de, T, d));
    KL(mxc_addnorm(c->st, b->ffn, NULL, cl->meo_w, cl->meo_b, T, d, m->eps, b->ffn));
    const mxc_delta mlp = {.D = b->ffn2};
    KL(mxc_add(c->st, b->ffn, &mlp, T, d));
    *dl = (mxc_delta){.D = b->ffn};
    return MX_OK;
}

/* After layer l's feed-forward, whose output *dl says where it is: when
 * the layer norms that output or scales its result, x += ffn_out_norm(dl)
 * and x *= scalar now, and *delta becomes NULL (nothing left to add);
 * else *delta = dl, added by the next norm. */
static int residual(call *k, int l, mxc_delta *dl, const mxc_delta **delta, mx_err *e)
{
    cu_ctx *c = k->c;
    const mx_model *m = c->m;
    const cu_layer *cl = &c->layers[l];
    cu_buf *b = k->b;
    const int T = k->T, d = m->d;
    *delta = dl;
    if (!cl->fo_w && cl->scalar == 1.0f)
        return MX_OK;
    if (cl->fo_w) {
        KL(mxc_delta_store(c->st, b->ffn, dl, T, d));
        KL(mxc_addnorm(c->st, b->ffn, NULL, cl->fo_w, cl->fo_b, T, d, m->eps, b->ffn));
        *dl = (mxc_delta){.D = b->ffn};
    }
    KL(mxc_add(c->st, b->x, dl, T, d));
    if (cl->scalar != 1.0f)
        KL(mxc_scale(c->st, b->x, (int64_t)T * d, cl->scalar));
    *delta = NULL;
    return MX_OK;
}

/* The trace's copy of rows [T][d] of x after layer `slot` (0: embeddings). */
static int trace_rows(call *k, const float *x, int slot, mx_err *e)
{
    const size_t n = (size_t)k->T * (size_t)k->c->m->d;
    CK(d2h(k->c->st, k->tr->hidden + (size_t)slot * n, x, n * sizeof(float)));
    return MX_OK;
}

/* run_pass of one token without a trace when every norm can be staged by
 * the streaming kernels that read it (c->fuse_norms): no norm launches.
 * The residual stream alternates between b->x and b->x2 (the kernel that
 * stages a norm of x + delta writes the sum to the other buffer while
 * every block still reads x), in the same order at every step, so a
 * captured graph replays it. */
static int run_pass_fused(call *k, mx_err *e)
{
    cu_ctx *c = k->c;
    const mx_model *m = c->m;
    cu_buf *b = k->b;
    int rc;
    float *xa = b->x, *xb = b->x2, *t;
    KL(mxc_embed(c->st, &c->mats[c->embed_i], b->tok, 1, m->embed_scale, xa, c->rp_flags));
    mxc_delta dl = {0};
    int has = 0;
    for (int l = 0; l < m->n_layers; l++) {
        const cu_layer *cl = &c->layers[l];
        const mxc_norm_in an = {.x = xa, .dl = dl, .has = has, .w = cl->an_w, .b = cl->an_b, .eps = m->eps,
                                .x_out = xb};
        t = xa, xa = xb, xb = t;
        const mxc_norm_in fn = {.x = xa, .dl = {.D = b->out}, .has = 1, .w = cl->fn_w, .b = cl->fn_b,
                                .eps = m->eps, .x_out = xb};
        k->rp_fn = &fn;   /* o_proj may route the token itself (oproj_routed) */
        k->pre_routed = 0;
        k->rp_h = NULL;
        rc = attention(k, l, &an, e);
        k->rp_fn = NULL;
        if (rc)
            return rc;
        rc = ffn(k, l, &fn, &dl, e);
        k->rp_h = NULL;
        if (rc)
            return rc;
        t = xa, xa = xb, xb = t;
        has = 1;
    }
    const mxc_norm_in fin = {.x = xa, .dl = dl, .has = has, .w = c->fn_w, .b = c->fn_b, .eps = m->eps};
    mxc_mv mv = {.n = 1, .m = {c->mats[c->head_i]}, .y = {b->logits}, .ldy = {m->vocab}};
    KL(mxc_matvec_stream(c->st, &mv, NULL, &fin, NULL, NULL));
    if (m->softcap > 0)
        KL(mxc_softcap(c->st, b->logits, m->vocab, m->softcap));
    return MX_OK;
}

/* Everything of one call after its tokens and positions are in b->tok and
 * b->pos; the last token's logits end in b->logits when want_last. */
static int run_pass(call *k, int want_last, mx_err *e)
{
    cu_ctx *c = k->c;
    const mx_model *m = c->m;
    cu_buf *b = k->b;
    const int T = k->T, d = m->d;
    const mx_forward_trace *tr = k->tr;
    int rc;
    if (T == 1 && !tr && want_last && c->fuse_norms)
        return run_pass_fused(k, e);
    KL(mxc_embed(c->st, &c->mats[c->embed_i], b->tok, T, m->embed_scale, b->x, NULL));
    if (tr && tr->hidden && (rc = trace_rows(k, b->x, 0, e)))
        return rc;
    mxc_delta dl = {0};
    const mxc_delta *delta = NULL, att_out = {.D = b->out};
    for (int l = 0; l < m->n_layers; l++) {
        const cu_layer *cl = &c->layers[l];
        KL(mxc_addnorm(c->st, b->x, delta, cl->an_w, cl->an_b, T, d, m->eps, b->xn));
        if ((rc = mixer(k, l, NULL, e)))
            return rc;
        if (cl->ao_w)   /* the mixer's output normed before the residual add */
            KL(mxc_addnorm(c->st, b->out, NULL, cl->ao_w, cl->ao_b, T, d, m->eps, b->out));
        KL(mxc_addnorm(c->st, b->x, &att_out, cl->fn_w, cl->fn_b, T, d, m->eps, b->xn));
        if ((rc = cl->dense ? ffn_parallel(k, l, &dl, e) : ffn(k, l, NULL, &dl, e)) ||
            (rc = residual(k, l, &dl, &delta, e)))
            return rc;
        if (tr && tr->hidden && l + 1 < m->n_layers) {
            if (delta)
                KL(mxc_add(c->st, b->x, &dl, T, d));
            delta = NULL;
            if ((rc = trace_rows(k, b->x, l + 1, e)))
                return rc;
        }
    }
    KL(mxc_addnorm(c->st, b->x, delta, c->fn_w, c->fn_b, T, d, m->eps, b->xn));
    if (tr && tr->hidden && (rc = trace_rows(k, b->xn, m->n_layers, e)))
        return rc;
    if (tr && tr->all_logits) {
        if (b->all_cap < T) {
            cudaFree(b->all_logits);
            b->all_logits = NULL;
            b->all_cap = 0;
            CK(dalloc(&b->all_logits, (size_t)T * (size_t)m->vocab * sizeof(float)));
            b->all_cap = T;
        }
        if ((rc = linear(k, c->head_i, b->xn, d, b->all_logits, m->vocab, T, e)))
            return rc;
        if (m->softcap > 0)
            KL(mxc_softcap(c->st, b->all_logits, (int64_t)T * m->vocab, m->softcap));
        CK(d2h(c->st, tr->all_logits, b->all_logits, sizeof(float) * (size_t)T * (size_t)m->vocab));
    }
    if (want_last) {
        if ((rc = linear(k, c->head_i, b->xn + (size_t)(T - 1) * (size_t)d, d, b->logits, m->vocab, 1, e)))
            return rc;
        if (m->softcap > 0)
            KL(mxc_softcap(c->st, b->logits, m->vocab, m->softcap));
    }
    return MX_OK;
}

/* Captures the one-token step of sequence q into a graph: token and
 * position from pinned memory, logits back to it.  greedy: the step of
 * cu_greedy instead, token and position where the previous step's argmax
 * left them on the GPU, the argmax last (into q->ggraph). */
static int capture_step(cu_ctx *c, cu_seq *q, int fused, int greedy, mx_err *e)
{
    const mx_model *m = c->m;
    cu_buf *b = &c->dec;
    mxc_att_fit *fit = greedy ? &q->gfit[fused] : &q->fit[fused];
    mxc_att_fit_free(fit);
    call k = {.c = c, .q = q, .b = b, .T = 1, .last_pos = q->n_ctx - 1, .fused = fused, .graph = 1, .fit = fit};
    cudaGraph_t g = NULL;
    CK(cudaStreamBeginCapture(c->st, cudaStreamCaptureModeThreadLocal));
    cudaError_t ce = cudaSuccess;
    if (!greedy)
        ce = cudaMemcpyAsync(b->tok, c->h_tok, sizeof(int32_t), cudaMemcpyHostToDevice, c->st);
    if (ce == cudaSuccess && !greedy)
        ce = cudaMemcpyAsync(b->pos, c->h_pos, sizeof(int), cudaMemcpyHostToDevice, c->st);
    int rc = ce == cudaSuccess ? run_pass(&k, 1, e) : cu_fail(e, ce, "cudaMemcpyAsync");
    if (!rc && greedy) {
        mxc_argmax a = c->am;
        a.x = b->logits;
        a.n = m->vocab;
        a.tok = b->tok;
        a.pos = b->pos;
        int kl = mxc_argmax_run(c->st, &a);
        if (kl)
            rc = cu_fail(e, (cudaError_t)kl, "mxc_argmax_run");
    } else if (!rc) {
        ce = cudaMemcpyAsync(c->h_logits, b->logits, sizeof(float) * (size_t)m->vocab, cudaMemcpyDeviceToHost, c->st);
        if (ce != cudaSuccess)
            rc = cu_fail(e, ce, "cudaMemcpyAsync");
    }
    ce = cudaStreamEndCapture(c->st, &g);
    if (!rc && ce != cudaSuccess)
        rc = cu_fail(e, ce, "cudaStreamEndCapture");
    if (!rc) {
        ce = cudaGraphInstantiate(greedy ? &q->ggraph[fused] : &q->graph[fused], g, 0);
        if (ce != cudaSuccess)
            rc = cu_fail(e, ce, "cudaGraphInstantiate");
    }
    /* the graph stays while its executable one does: mxc_att_fit_pos
     * names the attention nodes by it */
    if (!rc)
        *(greedy ? &q->gsrc[fused] : &q->src[fused]) = g;
    else if (g)
        cudaGraphDestroy(g);
    cudaGetLastError();
    return rc;
}

/* The dispatch counts of one one-token step (what run_pass counts). */
static void count_step(const cu_ctx *c, int fused)
{
    for (int l = 0; l < c->m->n_layers; l++) {
        const cu_layer *cl = &c->layers[l];
        if (cl->is_moe)
            mx_moe_count(takes_fused(cl, fused) ? MX_MOE_FUSED : MX_MOE_GATHER, 1);
    }
}

static int cu_forward(void *ctx, mx_seq *s, const int32_t *tokens, int n, float *logits,
                      const mx_forward_trace *trace, mx_err *e)
{
    cu_ctx *c = ctx;
    const mx_model *m = c->m;
    switches_use(&c->ks);
    cu_seq *q = seq_state(c, s, e);
    if (!q)
        return e->code;
    if (s->pos == 0 && q->state)   /* a sequence (re)started: its recurrent state from zero */
        CK(cudaMemsetAsync(q->state, 0, sizeof(float) * q->soff[m->n_layers], c->st));
    const int fused = mx_moe_fused_enabled() ? 1 : 0;
    if (n == 1 && !trace && logits && c->graphable && mx_env_flag("MLXCEL_CUDA_GRAPH", 1)) {
        *c->h_tok = tokens[0];
        *c->h_pos = s->pos;
        if (!q->graph[fused]) {
            int rc = capture_step(c, q, fused, 0, e);
            if (rc)
                return rc;
        }
        KL(mxc_att_fit_pos(q->graph[fused], &q->fit[fused], s->pos));
        CK(cudaGraphLaunch(q->graph[fused], c->st));
        CK(cudaStreamSynchronize(c->st));
        count_step(c, fused);
        memcpy(logits, c->h_logits, sizeof(float) * (size_t)m->vocab);
        return MX_OK;
    }
    cu_buf *b = n == 1 ? &c->dec : &c->pre;
    int rc = buf_reserve(c, b, n, e);
    if (rc)
        return rc;
    int *pos = malloc(sizeof(int) * (size_t)n);
    if (!pos)
        return mx_fail(e, MX_ENOMEM, "out of memory");
    for (int t = 0; t < n; t++)
        pos[t] = s->pos + t;
    cudaError_t ce = h2d(c->st, b->tok, tokens, sizeof(int32_t) * (size_t)n);
    if (ce == cudaSuccess)
        ce = h2d(c->st, b->pos, pos, sizeof(int) * (size_t)n);
    free(pos);
    if (ce != cudaSuccess)
        return cu_fail(e, ce, "cudaMemcpy");
    call k = {.c = c, .q = q, .b = b, .T = n, .last_pos = s->pos + n - 1, .fused = fused, .tr = trace};
    if ((rc = run_pass(&k, logits != NULL, e)))
        return rc;
    if (logits)
        CK(d2h(c->st, logits, b->logits, sizeof(float) * (size_t)m->vocab));
    CK(cudaStreamSynchronize(c->st));
    return MX_OK;
}

/* Greedy steps of one sequence (mx_backend.greedy): the captured step
 * with the argmax on the GPU after lm_head, whose winner is the next
 * step's token, so the host launches the steps back to back and copies the
 * ids back every GREEDY_RING steps and at the end: no logits copy, no
 * argmax on the host, and the GPU never waits for the host between steps.
 * -1 when it cannot (no CUDA graph for this model, MLXCEL_CUDA_GRAPH=0,
 * MLXCEL_CUDA_GREEDY=0): the caller steps through forward. */
#define GREEDY_RING 1024
static int cu_greedy(void *ctx, mx_seq *s, int32_t first, int n, int32_t *ids, mx_err *e)
{
    cu_ctx *c = ctx;
    if (!c->graphable || !mx_env_flag("MLXCEL_CUDA_GRAPH", 1) || !mx_env_flag("MLXCEL_CUDA_GREEDY", 1))
        return -1;
    switches_use(&c->ks);
    cu_seq *q = seq_state(c, s, e);
    if (!q)
        return e->code;
    if (!c->h_ids) {   /* the first greedy call: the argmax's scratch */
        mxc_argmax am = {.ring = GREEDY_RING};
        int32_t *h_ids = NULL;
        int nsm = 0;   /* a block an SM: a few values a thread */
        cudaError_t ce = cudaDeviceGetAttribute(&nsm, cudaDevAttrMultiProcessorCount, 0);
        am.blocks = nsm < 1 ? 1 : nsm > MXC_ARGMAX_BLOCKS ? MXC_ARGMAX_BLOCKS : nsm;
        if (ce == cudaSuccess)
            ce = dalloc(&am.pv, sizeof(float) * MXC_ARGMAX_BLOCKS);
        if (ce == cudaSuccess)
            ce = dalloc(&am.pi, sizeof(int) * MXC_ARGMAX_BLOCKS);
        if (ce == cudaSuccess)
            ce = dalloc(&am.cnt, 2 * sizeof(int));   /* the counter, then n_ids */
        if (ce == cudaSuccess)
            ce = cudaMemset(am.cnt, 0, 2 * sizeof(int));
        if (ce == cudaSuccess)
            ce = dalloc(&am.ids, sizeof(int32_t) * GREEDY_RING);
        if (ce == cudaSuccess)
            ce = cudaMallocHost((void **)&h_ids, sizeof(int32_t) * GREEDY_RING);
        if (ce != cudaSuccess) {
            cudaFree(am.pv), cudaFree(am.pi), cudaFree(am.cnt), cudaFree(am.ids);
            return cu_fail(e, ce, "greedy decoding's scratch");
        }
        am.n_ids = am.cnt + 1;
        c->am = am;
        c->h_ids = h_ids;
    }
    if (s->pos == 0 && q->state)
        CK(cudaMemsetAsync(q->state, 0, sizeof(float) * q->soff[c->m->n_layers], c->st));
    const int fused = mx_moe_fused_enabled() ? 1 : 0;
    if (!q->ggraph[fused]) {
        int rc = capture_step(c, q, fused, 1, e);
        if (rc)
            return rc;
    }
    *c->h_tok = first;
    *c->h_pos = s->pos;
    CK(cudaMemcpyAsync(c->dec.tok, c->h_tok, sizeof(int32_t), cudaMemcpyHostToDevice, c->st));
    CK(cudaMemcpyAsync(c->dec.pos, c->h_pos, sizeof(int), cudaMemcpyHostToDevice, c->st));
    CK(cudaMemsetAsync(c->am.n_ids, 0, sizeof(int), c->st));
    for (int i0 = 0; i0 < n; i0 += GREEDY_RING) {
        const int k = n - i0 < GREEDY_RING ? n - i0 : GREEDY_RING;
        for (int i = 0; i < k; i++) {
            KL(mxc_att_fit_pos(q->ggraph[fused], &q->gfit[fused], s->pos + i0 + i));
            CK(cudaGraphLaunch(q->ggraph[fused], c->st));
            count_step(c, fused);
        }
        CK(cudaMemcpyAsync(c->h_ids, c->am.ids, sizeof(int32_t) * (size_t)k, cudaMemcpyDeviceToHost, c->st));
        CK(cudaStreamSynchronize(c->st));
        memcpy(ids + i0, c->h_ids, sizeof(int32_t) * (size_t)k);
    }
    return MX_OK;
}

/* One decode step of n sequences as one call of n rows: every linear,
 * the routers and the experts (pairs grouped by expert, as for a prompt)
 * and lm_head take the n rows together; only the q/k/v heads and the
 * attention run per sequence, over its own cache at its own position. */
static int cu_forward_batch(void *ctx, mx_seq *const *seqs, const int32_t *tokens, int n, float *logits,
                            mx_err *e)
{
    cu_ctx *c = ctx;
    const mx_model *m = c->m;
    if (n == 1)
        return cu_forward(ctx, seqs[0], tokens, 1, logits, NULL, e);
    switches_use(&c->ks);
    cu_seq **qs = calloc((size_t)n, sizeof *qs);
    int *pos = malloc(sizeof *pos * (size_t)n);
    int rc = MX_OK, last = 0;
    if (!qs || !pos)
        rc = mx_fail(e, MX_ENOMEM, "out of memory");
    for (int i = 0; i < n && !rc; i++) {
        if (!(qs[i] = seq_state(c, seqs[i], e)))
            rc = e->code;
        else if (seqs[i]->pos == 0 && qs[i]->state &&
                 cudaMemsetAsync(qs[i]->state, 0, sizeof(float) * qs[i]->soff[m->n_layers], c->st) != cudaSuccess)
            rc = mx_fail(e, MX_EIO, "cuda: clearing a sequence's recurrent state failed");
        pos[i] = seqs[i]->pos;
        last = pos[i] > last ? pos[i] : last;
    }
    cu_buf *b = &c->pre;
    const size_t nv = (size_t)n * (size_t)m->vocab;
    if (!rc)
        rc = buf_reserve(c, b, n, e);
    if (!rc && b->all_cap < n) {
        cudaFree(b->all_logits);
        b->all_logits = NULL;
        b->all_cap = 0;
        cudaError_t ce = dalloc(&b->all_logits, nv * sizeof(float));
        if (ce != cudaSuccess)
            rc = cu_fail(e, ce, "cudaMalloc");
        else
            b->all_cap = n;
    }
    if (!rc) {
        cudaError_t ce = h2d(c->st, b->tok, tokens, sizeof(int32_t) * (size_t)n);
        if (ce == cudaSuccess)
            ce = h2d(c->st, b->pos, pos, sizeof(int) * (size_t)n);
        if (ce != cudaSuccess)
            rc = cu_fail(e, ce, "cudaMemcpy");
    }
    call k = {.c = c, .q = qs ? qs[0] : NULL, .b = b, .T = n, .last_pos = last,
              .fused = mx_moe_fused_enabled() ? 1 : 0, .seqs = qs, .pos_of = pos};
    if (!rc)
        rc = run_pass(&k, 0, e);   /* leaves the final norm of every row in b->xn */
    if (!rc)
        rc = linear(&k, c->head_i, b->xn, m->d, b->all_logits, m->vocab, n, e);
    if (!rc && m->softcap > 0) {
        int kl = mxc_softcap(c->st, b->all_logits, (int64_t)nv, m->softcap);
        if (kl)
            rc = cu_fail(e, (cudaError_t)kl, "mxc_softcap");
    }
    if (!rc) {
        cudaError_t ce = d2h(c->st, logits, b->all_logits, nv * sizeof(float));
        if (ce != cudaSuccess)
            rc = cu_fail(e, ce, "cudaMemcpy");
    }
    free(qs);
    free(pos);
    return rc;
}

static void cu_free(void *ctx)
{
    cu_ctx *c = ctx;
    if (!c)
        return;
    cudaDeviceSynchronize();
    {
        const char *sp = getenv("MLXCEL_CUDA_STAMPS");
        if (sp && *sp && mxc_stamps_dump(sp))
            fprintf(stderr, "mlxcel: MLXCEL_CUDA_STAMPS: could not write %s\n", sp);
    }
    buf_free(&c->dec);
    buf_free(&c->pre);
    mm_free(c);
    for (size_t i = 0; i < c->n_extra; i++)
        cudaFree(c->extra[i].d);
    free(c->extra);
    cudaFree(c->blob);
    cudaFree(c->d_mats);
    cudaFree(c->one_P);
    cudaFree(c->att_cnt);
    cudaFree(c->att_gen);
    cudaFree(c->route_cnt);
    cudaFree(c->rp_part);
    cudaFree(c->rp_ss);
    cudaFree(c->rp_flags);
    cudaFree(c->y_tag);
    cudaFree(c->one_W);
    cudaFreeHost(c->h_tok);
    cudaFreeHost(c->h_pos);
    cudaFreeHost(c->h_logits);
    cudaFreeHost(c->h_ids);
    cudaFree(c->am.pv);
    cudaFree(c->am.pi);
    cudaFree(c->am.cnt);
    cudaFree(c->am.ids);
    if (c->st)
        cudaStreamDestroy(c->st);
    if (c->st_routes)
        cudaStreamDestroy(c->st_routes);
    if (c->ev_routes)
        cudaEventDestroy(c->ev_routes);
    if (c->ev_extras)
        cudaEventDestroy(c->ev_extras);
    if (c->ev_lists)
        cudaEventDestroy(c->ev_lists);
    free(c->ranges);
    free(c->mats);
    for (int l = 0; c->layers && l < c->m->n_layers; l++)
        free(c->layers[l].dense);
    free(c->layers);
    host_free(c);
    free(c);
}

/* ---- public ------------------------------------------------------------------------ */

int mx_cuda_built(void) { return 1; }

int mx_cuda_probe(char *info, size_t cap)
{
    int n = 0;
    cudaError_t ce = cudaGetDeviceCount(&n);
    if (ce != cudaSuccess || n == 0) {
        snprintf(info, cap, "no CUDA GPU is usable (%s)",
                 ce != cudaSuccess ? cudaGetErrorString(ce) : "no device found");
        cudaGetLastError();
        return 0;
    }
    struct cudaDeviceProp p;
    if (cudaGetDeviceProperties(&p, 0) != cudaSuccess) {
        snprintf(info, cap, "GPU 0 does not answer");
        return 0;
    }
    snprintf(info, cap, "%s, compute capability %d.%d, %d SMs, %.1f GiB", p.name, p.major, p.minor,
             p.multiProcessorCount, (double)p.totalGlobalMem / 1073741824.0);
    return 1;
}

/* The kernels' switches read from the environment, where a model is
 * attached (each model keeps its own: cu_ctx's ks) and where a test's
 * linear runs. */
static kswitch kernel_switches(void)
{
    const char *v = getenv("MLXCEL_CUDA_CLUSTER"), *vm = getenv("MLXCEL_CUDA_CLUSTER_MOE");
    return (kswitch){.idot = mx_env_flag("MLXCEL_CUDA_IDOT", 1),
                     .ring = mx_env_flag("MLXCEL_CUDA_RING", 1),
                     .att_pre = mx_env_flag("MLXCEL_CUDA_ATT_PRE", 1),
                     .att_kv = mx_env_flag("MLXCEL_CUDA_ATT_KV", 1),
                     .att_comb1 = mx_env_flag("MLXCEL_CUDA_ATT_COMB1", 0),
                     .att_early = mx_env_flag("MLXCEL_CUDA_ATT_EARLY", 0),
                     .wgmma = mx_env_flag("MLXCEL_CUDA_WGMMA", 1),
                     .qkv_warp = mx_env_flag("MLXCEL_CUDA_QKV_WARP", 1),
                     .cluster = v ? atoi(v) : 2,
                     .cluster_moe = vm ? atoi(vm) : 2,
                     .pdl = mx_env_flag("MLXCEL_CUDA_PDL", 1),
                     .pdl_trigger = mx_env_flag("MLXCEL_CUDA_PDL_TRIGGER", 1),
                     .moe1_go = mx_env_flag("MLXCEL_CUDA_MOE1_GO", 1),
                     .route_rank = mx_env_flag("MLXCEL_CUDA_ROUTE_RANK", 1)};
}

/* The kernels' module holds one set of switches (host statics its
 * launches read, __constant__s its kernels read) for the process: before
 * each call a model's own are put there, where they differ from the last
 * ones put (two models attached with different switches: the tests'
 * pairs), after the device has finished what it was given. */
static void switches_use(const kswitch *k)
{
    static kswitch cur;
    static int have;
    if (have && !memcmp(&cur, k, sizeof cur))
        return;
    if (have)
        cudaDeviceSynchronize();
    mxc_set_idot(k->idot);
    mxc_set_ring(k->ring);
    mxc_set_att_pre(k->att_pre);
    mxc_set_att_opts(k->att_kv, k->att_comb1, k->att_early);
    mxc_set_wgmma(k->wgmma);
    mxc_set_qkv_warp(k->qkv_warp);
    mxc_set_cluster(k->cluster, k->cluster_moe);
    mxc_set_pdl(k->pdl);
    mxc_set_pdl_trigger(k->pdl_trigger);
    mxc_set_moe1_go(k->moe1_go);
    mxc_set_route_rank(k->route_rank);
    cur = *k;
    have = 1;
}

int mx_cuda_linear(const mx_linear *l, const float *X, int T, float *Y, mx_err *e)
{
    cu_ctx c = {.mma_on = mx_env_flag("MLXCEL_CUDA_MMA", 1)};
    float *dx = NULL, *dy = NULL;
    const kswitch ks = kernel_switches();
    switches_use(&ks);
    int idx, rc = add_mat(&c, l, "linear", &idx, e);
    const size_t nx = (size_t)T * (size_t)l->cols, ny = (size_t)T * (size_t)l->rows;
    cudaError_t ce = cudaSuccess;
    if (!rc) {
        ce = dalloc(&c.d_mats, sizeof(mxc_mat));
        if (ce == cudaSuccess)
            ce = cudaMemcpy(c.d_mats, c.mats, sizeof(mxc_mat), cudaMemcpyHostToDevice);
        if (ce == cudaSuccess)
            ce = dalloc(&dx, nx * sizeof(float));
        if (ce == cudaSuccess)
            ce = dalloc(&dy, ny * sizeof(float));
        if (ce == cudaSuccess)
            ce = cudaMemcpy(dx, X, nx * sizeof(float), cudaMemcpyHostToDevice);
        if (ce != cudaSuccess)
            rc = cu_fail(e, ce, "mx_cuda_linear");
    }
    if (!rc) {
        call k = {.c = &c, .T = T};
        rc = linear(&k, idx, dx, l->cols, dy, l->rows, T, e);
    }
    if (!rc && (ce = cudaMemcpy(Y, dy, ny * sizeof(float), cudaMemcpyDeviceToHost)) != cudaSuccess)
        rc = cu_fail(e, ce, "mx_cuda_linear");
    cudaFree(dx);
    cudaFree(dy);
    cudaFree(c.d_mats);
    mm_free(&c);
    for (size_t i = 0; i < c.n_extra; i++)
        cudaFree(c.extra[i].d);
    free(c.extra);
    free(c.mats);
    return rc;
}

int mx_cuda_argmax(const float *x, int n, int32_t *id, mx_err *e)
{
    if (n < 1)
        return mx_fail(e, MX_EINVAL, "argmax of %d values", n);
    mxc_argmax a = {.n = n, .blocks = 37, .ring = 4};   /* blocks: not a divisor of the test sizes */
    float *dx = NULL;
    int *scratch = NULL;   /* cnt, n_ids, tok, pos, ids[4], pi[blocks] */
    cudaError_t ce = dalloc(&dx, sizeof(float) * (size_t)n);
    if (ce == cudaSuccess)
        ce = dalloc(&a.pv, sizeof(float) * (size_t)a.blocks);
    if (ce == cudaSuccess)
        ce = dalloc(&scratch, sizeof(int) * (size_t)(8 + a.blocks));
    if (ce == cudaSuccess)
        ce = cudaMemset(scratch, 0, sizeof(int) * 8);
    if (ce == cudaSuccess)
        ce = cudaMemcpy(dx, x, sizeof(float) * (size_t)n, cudaMemcpyHostToDevice);
    int rc = MX_OK;
    if (ce == cudaSuccess) {
        a.x = dx;
        a.cnt = scratch, a.n_ids = scratch + 1, a.tok = scratch + 2, a.pos = scratch + 3, a.ids = scratch + 4;
        a.pi = scratch + 8;
        const int kl = mxc_argmax_run(0, &a);
        ce = kl ? (cudaError_t)kl : cudaDeviceSynchronize();
    }
    if (ce == cudaSuccess)
        ce = cudaMemcpy(id, scratch + 2, sizeof(int32_t), cudaMemcpyDeviceToHost);
    if (ce != cudaSuccess)
        rc = cu_fail(e, ce, "mx_cuda_argmax");
    cudaFree(dx);
    cudaFree(a.pv);
    cudaFree(scratch);
    return rc;
}

double mx_cuda_membw_probe(size_t bytes, int reps)
{
    return mxc_copy_bandwidth(bytes, reps);
}

int mx_cuda_attach(mx_model *m, mx_err *e)
{
    char info[256];
    if (!mx_cuda_probe(info, sizeof info))
        return mx_fail(e, MX_EUNSUPPORTED, "device cuda: %s", info);
    for (int l = 0; l < m->n_layers; l++) {
        const char *why = unsupported(m, l);
        if (why)
            return mx_fail(e, MX_EUNSUPPORTED, "device cuda: %s (model_type %s, layer %d) not supported on the GPU",
                           why, m->cfg.model_type, l);
    }
    if (m->d % 32)
        return mx_fail(e, MX_EUNSUPPORTED, "device cuda: hidden size %d is not a multiple of 32", m->d);
    cu_ctx *c = calloc(1, sizeof *c);
    if (!c)
        return mx_fail(e, MX_ENOMEM, "out of memory");
    c->m = m;
    c->graphable = 1;
    c->mma_on = mx_env_flag("MLXCEL_CUDA_MMA", 1);
    c->ks = kernel_switches();
    c->att_tile = mx_env_flag("MLXCEL_CUDA_ATT_TILE", 1);
    {
        const char *v = getenv("MLXCEL_CUDA_ATT_BLOCKS");
        c->att_blocks = v ? atoi(v) : 0;
        c->att_blocks = c->att_blocks < 0 ? 0 : c->att_blocks;
        /* a split's scores fit 256 (k_attend's sc); the graph's partials
         * are sized for splits of MXC_ATT_SPAN_DECODE, a bound for longer ones */
        v = getenv("MLXCEL_CUDA_ATT_SPAN");
        const int sp = v ? atoi(v) : 0;
        c->att_span = sp == 64 || sp == 128 || sp == 256 ? sp : 0;   /* 0: mxc_att's span_auto */
    }
    c->att_tagged = mx_env_flag("MLXCEL_CUDA_ATT_TAGGED", 1);
    c->moe_router = mx_env_flag("MLXCEL_CUDA_MOE_ROUTER", 0);
    c->rp_on = mx_env_flag("MLXCEL_CUDA_ROUTER_IN_O", 1);
    c->extras_first = mx_env_flag("MLXCEL_CUDA_EXTRAS_FIRST", 1);
    c->qkv_early = mx_env_flag("MLXCEL_CUDA_QKV_EARLY", 1);
    c->moe2_early = mx_env_flag("MLXCEL_CUDA_MOE2_EARLY", 1);
    c->h_all = mx_env_flag("MLXCEL_CUDA_H_ALL", 1);
    c->rpack = mx_env_flag("MLXCEL_CUDA_RPACK", 1);
    c->shared_early = mx_env_flag("MLXCEL_CUDA_SHARED_EARLY", 1);
    c->hflag_late = mx_env_flag("MLXCEL_CUDA_HFLAG_LATE", 0);
    {
        /* measuring: MLXCEL_CUDA_ESTRIDE_ONLY=1 phase 2 alone, =2 phase 1 alone */
        const char *v = getenv("MLXCEL_CUDA_ESTRIDE_ONLY");
        c->estride = mx_env_flag("MLXCEL_CUDA_ESTRIDE", 1) ? (v ? atoi(v) & 3 : 3) : 0;
    }
    snprintf(c->name, sizeof c->name, "cuda (%.140s)", info);
    int rc = MX_OK;
    cudaError_t ce = cudaSetDevice(0);
    if (ce == cudaSuccess)
        ce = cudaStreamCreate(&c->st);
    if (ce == cudaSuccess)
        ce = cudaStreamCreateWithFlags(&c->st_routes, cudaStreamNonBlocking);
    if (ce == cudaSuccess)
        ce = cudaEventCreateWithFlags(&c->ev_routes, cudaEventDisableTiming);
    if (ce == cudaSuccess)
        ce = cudaEventCreateWithFlags(&c->ev_extras, cudaEventDisableTiming);
    if (ce == cudaSuccess)
        ce = cudaEventCreateWithFlags(&c->ev_lists, cudaEventDisableTiming);
    if (ce == cudaSuccess)   /* (the __constant__s among them: after the device is set) */
        switches_use(&c->ks);
    if (ce != cudaSuccess) {
        rc = cu_fail(e, ce, "starting GPU 0");
        goto fail;
    }
    {   /* a measuring build's phase stamps (kern.h: mxc_stamp) */
        const char *sp = getenv("MLXCEL_CUDA_STAMPS");
        if (sp && *sp && mxc_stamps_start((size_t)1 << 21))
            fprintf(stderr, "mlxcel: MLXCEL_CUDA_STAMPS: this build has no stamps (-DMXC_STAMPS) or "
                            "their ring did not fit\n");
    }
    if ((rc = upload_tensors(c, e)))
        goto fail;
    if (!(c->layers = calloc((size_t)m->n_layers, sizeof *c->layers))) {
        rc = mx_fail(e, MX_ENOMEM, "out of memory");
        goto fail;
    }
    if ((rc = add_mat(c, &m->embed, "the embedding", &c->embed_i, e)) ||
        (rc = add_mat(c, &m->lm_head, "lm_head", &c->head_i, e)))
        goto fail;
    c->fn_w = dev_f32(c, m->final_norm.w, (size_t)m->d, e);
    c->fn_b = m->final_norm.b ? dev_f32(c, m->final_norm.b, (size_t)m->d, e) : NULL;
    for (int r = 0; r < m->n_ropes && !e->code; r++) {
        c->inv_freq[r] = dev_f32(c, m->ropes[r].inv_freq, (size_t)(m->ropes[r].dims / 2 > 0 ? m->ropes[r].dims / 2 : 1), e);
        if (m->ropes[r].inv_freq_long)
            c->inv_long[r] = dev_f32(c, m->ropes[r].inv_freq_long, (size_t)(m->ropes[r].dims / 2), e);
    }
    if (e->code) {
        rc = e->code;
        goto fail;
    }
    for (int l = 0; l < m->n_layers; l++)
        if ((rc = setup_layer(c, l, e)))
            goto fail;
    c->fuse_on = mx_env_flag("MLXCEL_CUDA_FUSE", 1);
    c->fuse_norms = c->fuse_on && mxc_stream_ok(&c->mats[c->head_i], 1);
    for (int l = 0; l < m->n_layers && c->fuse_norms; l++) {
        const cu_layer *cl = &c->layers[l];
        if (!cl->plain) {   /* what some families add runs in run_pass alone */
            c->fuse_norms = 0;
            break;
        }
        const mxc_mat qkv[3] = {c->mats[cl->qi], c->mats[cl->ki], c->mats[cl->vi]};
        c->fuse_norms = mxc_stream_ok(qkv, 3) && cl->s_bits && c->mats[cl->qi].cols == m->d;
        if (cl->is_moe) {
            const mxc_mat rs[2] = {c->mats[cl->router_i], cl->sgate_i >= 0 ? c->mats[cl->sgate_i] : c->mats[cl->router_i]};
            c->fuse_norms &= mxc_stream_ok(rs, cl->sgate_i >= 0 ? 2 : 1);
        }
    }
    ce = dalloc(&c->d_mats, sizeof(mxc_mat) * (size_t)c->n_mats);
    if (ce == cudaSuccess)
        ce = cudaMemcpy(c->d_mats, c->mats, sizeof(mxc_mat) * (size_t)c->n_mats, cudaMemcpyHostToDevice);
    const int zero = 0;
    const float one = 1.0f;
    int nh_max = 1;
    for (int l = 0; l < m->n_layers; l++)
        nh_max = m->layers[l].attn.n_heads > nh_max ? m->layers[l].attn.n_heads : nh_max;
    if (ce == cudaSuccess)
        ce = dalloc(&c->att_cnt, sizeof(int) * (size_t)nh_max);
    if (ce == cudaSuccess)
        ce = cudaMemset(c->att_cnt, 0, sizeof(int) * (size_t)nh_max);
    if (ce == cudaSuccess)
        ce = dalloc(&c->att_gen, sizeof(unsigned) * (size_t)nh_max);
    if (ce == cudaSuccess)
        ce = cudaMemset(c->att_gen, 0, sizeof(unsigned) * (size_t)nh_max);
    if (ce == cudaSuccess)
        ce = dalloc(&c->route_cnt, 2 * sizeof(int));   /* the counter, then the routes' flag */
    if (ce == cudaSuccess)
        ce = cudaMemset(c->route_cnt, 0, 2 * sizeof(int));
    if (ce == cudaSuccess && c->rp_on)
        ce = dalloc(&c->rp_part, sizeof(float) * MXC_RP_MAX_BLOCKS * MXC_RP_MAX_ROWS);
    if (ce == cudaSuccess && c->rp_on)
        ce = dalloc(&c->rp_ss, sizeof(double) * MXC_RP_MAX_BLOCKS);
    if (ce == cudaSuccess && c->rp_on)
        ce = dalloc(&c->rp_flags, sizeof(int) * (size_t)RP_FLAGS_AT(m->n_layers));
    if (ce == cudaSuccess && c->rp_on)
        ce = cudaMemset(c->rp_flags, 0, sizeof(int) * (size_t)RP_FLAGS_AT(m->n_layers));
    if (ce == cudaSuccess && c->rp_on && mx_env_flag("MLXCEL_CUDA_Y_TAGGED", 1)) {
        /* zeroed: every tag a step writes is at least its count (1 on) */
        ce = dalloc(&c->y_tag, sizeof(unsigned long long) * (size_t)m->d);
        if (ce == cudaSuccess)
            ce = cudaMemset(c->y_tag, 0, sizeof(unsigned long long) * (size_t)m->d);
    }
    if (ce == cudaSuccess)
        ce = dalloc(&c->one_P, sizeof(int));
    if (ce == cudaSuccess)
        ce = cudaMemcpy(c->one_P, &zero, sizeof(int), cudaMemcpyHostToDevice);
    if (ce == cudaSuccess)
        ce = dalloc(&c->one_W, sizeof(float));
    if (ce == cudaSuccess)
        ce = cudaMemcpy(c->one_W, &one, sizeof(float), cudaMemcpyHostToDevice);
    if (ce == cudaSuccess)
        ce = cudaMallocHost((void **)&c->h_tok, sizeof(int32_t));
    if (ce == cudaSuccess)
        ce = cudaMallocHost((void **)&c->h_pos, sizeof(int));
    if (ce == cudaSuccess)
        ce = cudaMallocHost((void **)&c->h_logits, sizeof(float) * (size_t)m->vocab);
    if (ce != cudaSuccess) {
        rc = cu_fail(e, ce, "allocating the model's tables");
        goto fail;
    }
    if ((rc = buf_reserve(c, &c->dec, 1, e)))
        goto fail;
    c->be = (mx_backend){.name = c->name, .forward = cu_forward, .greedy = cu_greedy, .seq_free = cu_seq_free, .free = cu_free,
                         .forward_batch = mx_env_flag("MLXCEL_CUDA_BATCH", 1) ? cu_forward_batch : NULL};
    mx_model_set_backend(m, &c->be, c);
    return MX_OK;
fail:
    cu_free(c);
    return rc;
}
