/* kern.h - the CUDA kernels of the backend, as C functions that launch
 * them on a stream (kernels.cu).  Internal to src/cuda: backend.c is the
 * only caller.
 *
 * Weights stay in the MLX affine layout they have on disk (quant.h):
 * packed U32 rows, f16/bf16/f32 scales and biases per group.  Every
 * kernel works on 32-value chunks of a row: 32 values of `bits` bits are
 * exactly `bits` 32-bit words, and a chunk never straddles a group
 * (group sizes are 32, 64 or 128).  Activations are f32, and every dot
 * product is accumulated in f32 as s * sum(q x) + b * sum(x) per chunk,
 * the same identity the CPU kernels use. */
#ifndef MX_CUDA_KERN_H
#define MX_CUDA_KERN_H

#include <stdint.h>

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

enum { MXC_F32 = 0, MXC_F16 = 1, MXC_BF16 = 2 };

/* One weight matrix on the device: quantized (bits 2..8) or plain float
 * (bits 0, dt the weights' dtype). */
typedef struct mxc_mat {
    const void *w;               /* packed words (row r at r * cols * bits / 32) or float rows */
    const void *s, *b;           /* [rows][cols / gs] scales and biases (bits > 0) */
    const float *bias;           /* [rows] added to the output, or NULL */
    int64_t rows, cols;
    int bits, gs, dt;            /* dt: scales' dtype (bits > 0), else the weights' */
} mxc_mat;

/* What a step adds to the residual stream, per token t: the row D + t*d
 * (K = 0), or the weighted sum of the token's K slot rows,
 * sum_j W[t*K + j] Y[(t*K + j)*d + i] in slot order (the fused MoE's
 * second phase leaves each slot's down projection apart). */
typedef struct mxc_delta {
    const float *D;
    const float *Y, *W;
    int K;
} mxc_delta;

/* The input of a one-token streaming kernel when it is the norm of the
 * residual stream: each block stages norm(x + delta) itself (w, and b for
 * LayerNorm), so the norm costs no launch of its own; block 0 writes
 * x + delta to x_out (another buffer than x) when x_out is not NULL. */
typedef struct mxc_norm_in {
    const float *x;
    mxc_delta dl;
    int has;                     /* a delta to add */
    const float *w, *b;
    float eps;
    float *x_out;
} mxc_norm_in;

/* The largest number of tokens the matvec kernel takes in one call (more
 * go through the tile kernel). */
#define MXC_MV_MAXT 8
/* The widest attention head the kernels take (Gemma 4's full-attention
 * layers: 512; prompts past 256 take the split kernel, not the tiles). */
#define MXC_HD_MAX 512
/* Slots of one token's expert sum: routed experts plus extra MLPs. */
#define MXC_MAX_SLOTS 66
/* Positions of the KV cache one attention block covers: one-token steps
 * (more blocks for a short step), prompts (fewer partials for many
 * tokens). */
#define MXC_ATT_SPAN_DECODE 64
#define MXC_ATT_SPAN_PROMPT 256
/* Tokens and rows of one tile of the prefill kernel. */
#define MXC_TILE_T 32
#define MXC_TILE_R 64

/* Y_i[t * ldy_i + r] = (M_i x_t)[r] + bias for up to 4 matrices read in one
 * launch (their rows concatenated), T <= MXC_MV_MAXT tokens x_t = X + t*ldx. */
typedef struct mxc_mv {
    int n;
    mxc_mat m[4];
    float *y[4];
    int64_t ldy[4];
    /* one token's streaming kernel lets its successor launch right after
     * its wait (q/k/v: the attention's blocks are then resident beside
     * it and make their rotation and copy old K/V rows meanwhile) */
    int early;
} mxc_mv;
int mxc_matvec(cudaStream_t st, const mxc_mv *mv, const float *X, int64_t ldx, int T);

/* 1 when one token's matvec of ms[0..n) (one x) takes the streaming
 * kernel, which alone takes the options of mxc_matvec_stream. */
int mxc_stream_ok(const mxc_mat *ms, int n);

/* forward declaration: the routing a streaming matvec can end with */
struct mxc_route;

/* mxc_matvec of one token through the streaming kernel (mxc_stream_ok),
 * x plain or, with nin, the norm it stages; with route (softmax top-k of
 * one token, E <= MXC_ROUTE_FUSED_MAX), the launch's last block routes
 * from the outputs (cnt: a device int, zero, left zero). */
#define MXC_ROUTE_FUSED_MAX 256
int mxc_matvec_stream(cudaStream_t st, const mxc_mv *mv, const float *x, const mxc_norm_in *nin,
                      const struct mxc_route *route, int *cnt);

/* The tile (prefill) kernel.  An item is up to MXC_TILE_T rows of X
 * through matrix m0 of the table (dual: act(m0 x) * (m1 x), the gated
 * MLP's hidden value), rows of X and of Y named by in_list / out_list
 * from `off` (NULL lists: rows off, off + 1, ...). */
typedef struct mxc_item {
    int m0, m1, off, n;
} mxc_item;

/* Tokens of one item of the tensor-core tile kernel (mma): tiles of up to
 * 64 rows of X. */
#define MXC_MM_T 64

/* The tensor-core path's copy of X (mxc_tile.mma): each row x split
 * exactly enough for fp32 results into two f16 parts, x / dx ~= hi + lo
 * (dx a power of two per row, |x / dx| < 2^14, so hi + lo holds 22
 * significant bits of every value), the values of each 32-value chunk in
 * the order of the MMA fragments, and the chunk sums of x / dx.  Rows
 * are ld halves apart (ld >= the widest K). */
typedef struct mxc_mmx {
    void *hi, *lo;               /* [rows][ld] f16 */
    float *sum;                  /* [rows][ld / 32] */
    float *sum2;                 /* [rows][ld / 64]: sums of chunk pairs (the 64 values of a group of 64) */
    float *dx;                   /* [rows] */
    int64_t ld;
    float *part;                 /* split-K partial sums, part_cap floats */
    int64_t part_cap;
} mxc_mmx;
typedef struct mxc_tile {
    const mxc_mat *table;        /* device */
    const mxc_item *items;       /* device, n_items of them; NULL: the plain item below */
    int n_items;
    mxc_item plain;              /* when items is NULL: tokens [0, plain.n) in tiles */
    int64_t max_rows;            /* the most rows of any item's matrix */
    const int *in_list, *out_list;
    const float *X;
    int64_t ldx;
    float *Y;
    int64_t ldy;
    int dual, act;
    /* mma = 4 or 8: every matrix of the launch that wide with scales of
     * dtype mma_dt goes through the tensor cores (items of up to
     * MXC_MM_T rows), X split into mm first: prep_rows > 0, rows
     * [0, prep_rows) of X, prep_k values each; 0, each item's rows
     * (in_list) with its matrix's cols.  mma = 0: the fp32 tile kernel
     * (items of up to MXC_TILE_T rows). */
    int mma, mma_dt;
    mxc_mmx mm;
    int64_t prep_rows, prep_k;
    int64_t table_gs;            /* plain tiles: the matrix's group size (split-K in whole groups) */
    /* mma plain tiles of pn > 1 matrices of the same X in one launch
     * (q, k, v): matrix k > 0 is table[pm[k]] into py[k] (ldy pldy[k]);
     * matrix 0 is plain.m0 into Y; max_rows the most rows of any */
    int pn;
    int pn_split;                /* pn > 1: the matrices' groups are all table_gs, so K may be split (a router and a gate) */
    int pm[4];
    float *py[4];
    int64_t pldy[4];
    int splits;                  /* set by mxc_tile_run */
    int skip_prep;               /* mma: mm already holds X split (an earlier launch's prep) */
} mxc_tile;
int mxc_tile_run(cudaStream_t st, const mxc_tile *t);

/* x[t] = embed row tokens[t] times scale. */
/* epoch: a device int the launch adds one to (mxc_route's), or NULL */
int mxc_embed(cudaStream_t st, const mxc_mat *E, const int32_t *tokens, int T, float scale, float *x, int *epoch);

/* x[t] += delta[t] (delta may be NULL), xn[t] = norm(x[t]): RMSNorm with w,
 * or LayerNorm with w and b when b is not NULL.  T rows of d. */
int mxc_addnorm(cudaStream_t st, float *x, const mxc_delta *delta, const float *w, const float *b, int T,
                int d, float eps, float *xn);

/* x[t] += delta[t], t < T. */
int mxc_add(cudaStream_t st, float *x, const mxc_delta *delta, int T, int d);

/* Programmatic dependent launch for every kernel after a step's first
 * (on unless MLXCEL_CUDA_PDL=0). */
void mxc_set_pdl(int on);

/* The streaming kernels and the one-token attention trigger their
 * successor's launch after their main work (on unless
 * MLXCEL_CUDA_PDL_TRIGGER=0; off: when their last block exits). */
void mxc_set_pdl_trigger(int on);
void mxc_set_moe1_go(int on);
void mxc_set_route_rank(int on);

/* Phase stamps of the one-token kernels, in a build with -DMXC_STAMPS
 * (kernels.cu): each block's start, wait, wait's return, trigger and exit
 * (%globaltimer ns; 0: not reached), up to three points of the kernel's
 * own and the clocks since its start.
 * kid: 1 + 16 R k_mvs of R rows a warp, 2 k_mvs_rp, 3 k_attend, 4
 * k_moe1s, 5 k_moe2s, 6 k_argmax, 7 k_embed. */
typedef struct mxc_stamp {
    uint32_t kid, blk, smid, nblk;
    uint64_t t[8];   /* start, wait, wait's return, trigger, exit; 5 .. 7 the kernel's own points */
    uint32_t c[4];
} mxc_stamp;

/* A ring of cap stamps (-1 in a build without MXC_STAMPS), and its
 * contents written to path (the count as a u64, then the stamps, oldest
 * first). */
int mxc_stamps_start(size_t cap);
int mxc_stamps_dump(const char *path);

/* A prompt's q/k/v heads a warp each (on unless MLXCEL_CUDA_QKV_WARP=0;
 * off: a block each, as one-token steps). */
void mxc_set_qkv_warp(int on);

/* One-token streaming kernels (4/8-bit) on integer dot products of the
 * weights with exact 24-bit digits of x (on unless MLXCEL_CUDA_IDOT=0;
 * off: the float kernels). */
void mxc_set_idot(int on);

/* The integer streaming kernels copy their weights into a ring in shared
 * memory by cp.async, several items in flight a warp (on unless
 * MLXCEL_CUDA_RING=0; off: each warp's next item in registers). */
void mxc_set_ring(int on);

/* One token's attention copies the K/V rows of its first split that
 * earlier steps wrote into shared memory before it waits for q/k/v (on
 * unless MLXCEL_CUDA_ATT_PRE=0). */
void mxc_set_att_pre(int on);
/* One token's attention: its kv head's raw rows asked for beside its q
 * head's (MLXCEL_CUDA_ATT_KV, on by default), up to 8 splits combined in
 * one round trip (MLXCEL_CUDA_ATT_COMB1, off: it shortens the combining
 * tail that covers o_proj's start), its successor launched once the heads
 * are made instead of after the splits (MLXCEL_CUDA_ATT_EARLY, off). */
void mxc_set_att_opts(int kv, int comb1, int early);

/* One token's q/k/v and lm_head (n), phase 1 (moe) stage their input
 * norm in clusters of 2 blocks (n, moe = 2), each block reading half of
 * the residual and sharing it through distributed shared memory
 * (MLXCEL_CUDA_CLUSTER, MLXCEL_CUDA_CLUSTER_MOE, 2 by default; 0: every
 * block reads it all). */
void mxc_set_cluster(int n, int moe);

/* The tensor-core tiles on wgmma where the GPU runs this build's sm_90a
 * code (probed once; MLXCEL_CUDA_WGMMA=0: the warp MMAs). */
void mxc_set_wgmma(int on);
int mxc_wgmma_active(void);

/* After the q, k, v projections of T tokens: each q head clipped, normed
 * and rotated into qr [T][nh][hd]; each kv head's k (the same) and v
 * (clipped, v_norm) into the cache at the token's position. */
typedef struct mxc_qkv {
    const float *q, *k, *v;      /* [T][q_rows], [T][kv_dim], [T][kv_dim] */
    int64_t q_rows;
    float *qr;
    float *kc, *vc;              /* the layer's cache: [nkv][n_ctx][hd] */
    int n_ctx;
    const int *pos;              /* [T] device */
    int T, nh, nkv, hd;
    int qk_norm;                 /* 0 none, 1 per head, 2 full width */
    const float *q_norm, *k_norm;
    float eps, clip;
    int v_norm;
    int q_gate;                  /* q rows per head [q | gate] (heads 2 hd apart: gated attention) */
    int rope_dims;
    const float *inv_freq, *inv_freq_long;
    float mscale, mscale_long;
    int orig_max;
} mxc_qkv;
int mxc_qkv_post(cudaStream_t st, const mxc_qkv *p);

/* Attention of T tokens over the cache: out [T][nh * hd].  part holds
 * T * nh * n_split * (hd + 2) floats, n_split = ceil(positions / span)
 * for the furthest position the call can reach (span <= 256). */
typedef struct mxc_att {
    const float *qr;
    const float *kc, *vc;
    int n_ctx;
    const int *pos;
    int T, nh, nkv, hd, window;
    float scale;
    float *part;
    int n_split, span;
    /* T = 1: the launch takes the shortest of span, 2 span, 4 span ... (at
     * most MXC_ATT_SPAN_PROMPT) whose splits in use are at most one a block
     * (span is then MXC_ATT_SPAN_DECODE, the partials sized for it): a long
     * context in fewer, longer splits, one a block (MLXCEL_CUDA_ATT_SPAN
     * unset or 0; a number fixes the span) */
    int span_auto;
    float *out;
    int *cnt;                    /* T = 1: [nh] zeroed ints; the last split of a head combines (no second launch) */
    /* T = 1: [nh] zeroed, each head's count of launches, or NULL; with it,
     * up to 8 splits each in a block of its own leave their partials as
     * tagged 64-bit words (part then holds twice the floats, zeroed) and
     * pos's block combines them without a counter (MLXCEL_CUDA_ATT_TAGGED) */
    unsigned *gen;
    int max_z;                   /* with cnt: at most this many blocks a head, each looping over splits (0: about two blocks an SM in all) */
    int fuse;                    /* T = 1: the blocks do qkv's work themselves (no mxc_qkv_post launch) */
    int pre;                     /* set by mxc_attend: one token's first split's old K/V rows copied before the wait */
    int kv, comb1, early;        /* set by mxc_attend (mxc_set_att_opts) */
    int tile;                    /* T > 1: query tiles over key tiles (one launch, part unused) */
    int hpos;                    /* T = 1 outside a graph: the position (blocks only for the splits in use); else -1 */
    struct mxc_att_fit *fit;     /* host: a step being captured records its one-token launch here */
    mxc_qkv qkv;
} mxc_att;
int mxc_attend(cudaStream_t st, const mxc_att *a);

/* One token's attention in a captured step: the graph replays at any
 * position, so its launch was captured with blocks for the sequence's
 * whole context, and blocks without a split to take still cost (the qwen1.5
 * synth at a context of 4 096 and 166 positions: 599 tok/s against 647
 * with a block for each split in use; docs/cuda.md).  While capturing,
 * mxc_attend records each such launch in a.fit (the node, its arguments,
 * its blocks a head); before each launch of the executable graph x at
 * position pos, mxc_att_fit_pos gives every recorded launch as many blocks
 * a head as pos has splits, up to the captured count, changing only the
 * nodes whose count changes (launches already queued keep theirs).  The
 * graph x was instantiated from must live as long as x. */
typedef struct mxc_att_fit {
    int n, cap;
    struct mxc_att_node *v;
} mxc_att_fit;
int mxc_att_fit_pos(cudaGraphExec_t x, mxc_att_fit *f, int pos);
void mxc_att_fit_free(mxc_att_fit *f);

/* Softmax top-k routing of T tokens from logits [T][E]: P [T][K'] gets the
 * experts (then the extra MLPs' slots E, E + 1, ...) and W [T][K'] their
 * weights (an extra slot's weight: sigmoid of its gate logit glog[t], or 1
 * when glog is NULL). */
typedef struct mxc_route {
    const float *logits;
    int T, E, k, norm_topk;
    const float *expert_scale;   /* [E] or NULL */
    int n_extra;
    const float *glog;           /* [T] the first extra slot's gate logits, or NULL */
    int *P;
    float *W;
    int *ready;                  /* the routed launch's last block sets it to 1 after the routes, or NULL */
    /* mxc_matvec_stream_rp: its last block sets *h_flag to *epoch as soon as
     * every block's rows of the residual are in, and *r_flag to *epoch once
     * the routes are (NULL: neither).  The step's count in *epoch (the
     * embedding's launch adds one) makes a flag of an earlier step stale
     * without anyone setting it back. */
    int *h_flag, *r_flag;
    const int *epoch;
    int h_late;                  /* measuring: *h_flag once the logits are made (MLXCEL_CUDA_HFLAG_LATE) */
    /* with h_flag: o_proj's rows also as tagged 64-bit words (the value,
     * and *epoch * tag_mul + tag_id in the high half), which phase 1
     * stages its norm from without waiting for h_flag (or NULL) */
    unsigned long long *y_tag;
    unsigned tag_mul, tag_id;
    /* r_flag (8-byte aligned) is a 64-bit word: the step's count in its
     * high half, the k <= 4 routed experts (E <= 255) a byte each in its
     * low half, written by one relaxed store, no fence: phase 1 learns
     * the routes in the load that sees the flag (MLXCEL_CUDA_RPACK) */
    int r_pack;
} mxc_route;
int mxc_route_softmax(cudaStream_t st, const mxc_route *r);

/* One token's router folded into the streaming matvec before it (o_proj):
 * y = M x is what the FFN's RMSNorm adds to the residual x_res, so the
 * router rows rv (the router, and the shared expert's gate) against
 * rmsnorm(x_res + y) are 1 / rms times their sums against w * (x_res + y),
 * which each block adds up over its own rows of y; the last block sums
 * the blocks' partials in block order, scales them, writes rv's outputs
 * and routes the token (rt; cnt: a device int, zero, left zero).  Every
 * block writes its rows of x_res + y to x_out.  -1 (nothing launched) where
 * it does not apply: then the router is a launch of its own. */
#define MXC_RP_MAX_ROWS 256
#define MXC_RP_MAX_BLOCKS 1024
typedef struct mxc_rpart {
    mxc_mv rv;                   /* the router's matrices (4 or 8 bits) and outputs */
    int E;                       /* rv's rows in all */
    int64_t rows;                /* y's rows (rv's columns) */
    const float *x;              /* the residual y is added to */
    const float *w;              /* the RMSNorm's weight */
    float eps;
    float *x_out;                /* x + y */
    float *part;                 /* [max_blocks][E] scratch */
    double *ss;                  /* [max_blocks] scratch */
    int max_blocks;
} mxc_rpart;
int mxc_matvec_stream_rp(cudaStream_t st, const mxc_mv *mv, const float *x, const mxc_rpart *rp,
                         const mxc_route *rt, int *cnt);

/* One token's expert sum, out = sum_j W[j] down_j(act(gate_j x) * up_j x)
 * over slots j in [lo, hi).  table holds 3 matrices (gate, up, down) per
 * slot kind, kind P[j]; off[j] is slot j's first row of h. */
typedef struct mxc_moe1 {
    const mxc_mat *table;
    const int *P;
    const float *W;
    int off[MXC_MAX_SLOTS + 1];
    int lo, hi;
    const float *x;
    float *h;
    float *out;
    int64_t d;
    int act;
    int accumulate;              /* phase 2 adds to out instead of overwriting it */
    int bits;                    /* every slot's gate and up have this width and group size (-1: mixed) */
    float *Y;                    /* mxc_moe_stream: slot j's output at Y + j * d */
    mxc_norm_in nin;             /* mxc_moe_stream with has_nin: x is this norm */
    int has_nin;
    int blk[MXC_MAX_SLOTS + 1];  /* mxc_moe_stream's own: the blocks of each slot in phase 2 */
    /* mxc_moe_stream_routed: slots [lo, n_routed) wait for *ready (the
     * routes, P), slot j >= n_routed is kind kind0 + j - n_routed; phase 2
     * sets *ready back to 0 */
    int *ready;
    int n_routed, kind0;
    /* mxc_moe_stream_tokens: slots [0, hi) are kp a token, token t's x at
     * x + t * d (0: one token) */
    int kp;
    /* mxc_moe_stream of one token through the ring: slots [n_routed, hi)
     * are kinds kind0 + j - n_routed, known before the routes, so phase 1
     * walks their rows first and asks for its first weights before it
     * waits for the kernel that routes */
    int extras_first;
    /* phase 2 of the streaming kernels lets its successor launch right
     * after its wait (the next q/k/v's blocks beside it) */
    int early;
    /* phase 2 of the streaming kernels stages a slot's h (up to 3 rounds
     * of its block) with every round's loads issued at once
     * (MLXCEL_CUDA_H_ALL, on by default) */
    int h_all;
    /* one token after mxc_matvec_stream_rp (its rt's h_flag, r_flag,
     * epoch), extras_first too: phase 1 walks the extra slots' rows once
     * *h_flag is this step's (o_proj's rows are in) instead of when o_proj's
     * launch has ended, and a warp waits for *r_flag at its first routed row */
    const int *h_flag, *r_flag, *epoch;
    int r_pack;                  /* r_flag holds the routes (mxc_route's r_pack) */
    /* with h_flag: the norm's delta (nin.dl.D) from o_proj's tagged words
     * (mxc_route's y_tag, tag_mul, tag_id), each value once it carries
     * the step's tag, not after *h_flag (or NULL) */
    const unsigned long long *y_tag;
    unsigned tag_mul, tag_id;
    /* The routed experts' matrices one stride apart (the checkpoints'
     * stacked switch_mlp tensors): expert e's matrix t (0 gate, 1 up, 2
     * down) is e0[t] with its w, s and b moved e * estr[t][0 .. 2] bytes,
     * so that a kernel with the routes in hand makes them from its
     * parameters instead of reading the table (a round trip through L2 on
     * the step's chain); xd[x], extra slot x's down matrix (x < n_xd) */
    int estride, n_xd;
    mxc_mat e0[3];
    int64_t estr[3][3];
    mxc_mat xd[2];
} mxc_moe1;
/* Phase 1: h rows of every slot (gate and up rows of all of them in one
 * launch); phase 2: out rows, the weights folded in. */
int mxc_moe_phase1(cudaStream_t st, const mxc_moe1 *p);
int mxc_moe_phase2(cudaStream_t st, const mxc_moe1 *p);

/* Both phases through the streaming kernels (every gate, up and down
 * matrix of the slots p->bits = 4 or 8 wide with scales of dtype dt):
 * h as phase 1, then slot j's down projection of h_j into p->Y + j * d,
 * unweighted (an mxc_delta of the slots sums them with W). */
int mxc_moe_stream(cudaStream_t st, const mxc_moe1 *p, int dt);

/* mxc_moe_stream for the tokens of a batched step in one launch of each
 * phase (p->kp slots a token, lo 0, the integer kernels, x plain rows, the
 * tokens' digits in 100 KB); -1 (nothing launched) when it does not
 * apply. */
int mxc_moe_stream_tokens(cudaStream_t st, const mxc_moe1 *p, int dt);

/* mxc_moe_stream with the router in phase 1's launch: its first blocks
 * run the router matvec rmv (mxc_matvec_stream's, x the norm rnin) and
 * the last of them routes (rt, cnt; rt->ready = p->ready) while the
 * other blocks go through the extra slots' rows (they need no route),
 * then the routed slots' once *p->ready is set; then phase 2 as
 * mxc_moe_stream's.  The integer kernels only (MLXCEL_CUDA_IDOT), router
 * and experts with one scale dtype; -1 (nothing launched) when it does
 * not apply. */
int mxc_moe_stream_routed(cudaStream_t st, const mxc_moe1 *p, int dt, const mxc_mv *rmv, const mxc_norm_in *rnin,
                          const mxc_route *rt, int *cnt);

/* out[t][i] = sum_j W[t][j] Y[t * K + j][i], t < T, i < d. */
int mxc_combine(cudaStream_t st, const float *Y, const float *W, int T, int K, int64_t d, float *out);

/* logits[i] = tanh(logits[i] / cap) * cap. */
int mxc_softcap(cudaStream_t st, float *logits, int64_t n, float cap);

/* ---- what some families add (model/forward.c has their CPU form) ---------------- */

/* out[t] = delta[t] (the sum an mxc_delta describes, made a plain row;
 * out may be delta->D), t < T. */
int mxc_delta_store(cudaStream_t st, float *out, const mxc_delta *delta, int T, int d);

/* x[i] *= s, i < n (a layer's scalar). */
int mxc_scale(cudaStream_t st, float *x, int64_t n, float s);

/* Qwen3-Next's gated attention: att[t][h * hd + i] *= sigmoid(the gate),
 * the gate being the second half of head h's q rows,
 * q[t * q_rows + h * 2 * hd + hd + i]. */
int mxc_out_gate(cudaStream_t st, float *att, const float *q, int64_t q_rows, int T, int nh, int hd);

/* The depthwise causal convolution of n tokens of one sequence over its
 * rolling window win ([C][K - 1], the previous inputs oldest first; left
 * holding the last K - 1), channel c's input and output by mode:
 *   MXC_CONV_LFM2: in rows [B | C | x] (C wide each): conv(B * x) + bias,
 *     times C, into out[t][c];
 *   MXC_CONV_DELTANET: in rows of in_proj_qkvz, grouped per key head
 *     [q dk | k dk | v r*dv | z r*dv]; channel c of [q | k | v] (all key
 *     heads' q first, then k, then the value heads' v), SiLU after. */
enum { MXC_CONV_LFM2 = 0, MXC_CONV_DELTANET = 1 };
#define MXC_CONV_MAXK 8
typedef struct mxc_conv {
    int mode, n, C, K;
    const float *in;
    int64_t ld_in;
    float *out;
    int64_t ld_out;
    float *win;
    const float *w, *b;          /* [C][K], [C] or NULL */
    int nk, dk, dv, r;           /* DeltaNet's heads (r = value heads per key head) */
} mxc_conv;
int mxc_conv_causal(cudaStream_t st, const mxc_conv *p);

/* The gated delta rule of n tokens of one sequence, a block per value
 * head h (key head h / r), token by token: q, k of conv (the convolved
 * [q | k | v] rows) L2-normalised, q / sqrt(dk); beta = sigmoid(b), g =
 * -exp(A_log) softplus(a + dt_bias) from the in_proj_ba row [b r | a r] of
 * the key head; S = S exp(g); S += k (beta (v - S^T k))^T; o = S^T q;
 * out = rmsnorm(o) * norm_w * silu(z) (z from the qkvz rows). */
typedef struct mxc_dn {
    int n, nk, nv, dk, dv;
    const float *conv, *qkvz, *ba;
    int64_t conv_dim, qkvz_rows, ba_rows;
    float *S;                    /* [nv][dk][dv] the sequence's state */
    float *out;                  /* [n][nv * dv] */
    const float *A_log, *dt_bias, *norm_w;
    float eps;
} mxc_dn;
int mxc_delta_rule(cudaStream_t st, const mxc_dn *p);

/* Greedy decoding: the index of the largest of x[0 .. n) as mx_argmax
 * gives it (first occurrence; NaN never wins; a NaN at 0 is never beaten)
 * becomes *tok, *pos grows by one, and the id goes to ids[*n_ids % ring]
 * (*n_ids then grows).  blocks (1 .. MXC_ARGMAX_BLOCKS) each reduce a
 * stride into pv, pi; the last one to finish reduces those (cnt: a zeroed
 * counter, left zeroed). */
#define MXC_ARGMAX_BLOCKS 256
typedef struct mxc_argmax {
    const float *x;
    int n, blocks;
    float *pv;                   /* [blocks] */
    int *pi, *cnt;               /* [blocks], [1] */
    int32_t *tok;
    int *pos;
    int32_t *ids;                /* [ring] */
    int *n_ids, ring;
} mxc_argmax;
int mxc_argmax_run(cudaStream_t st, const mxc_argmax *a);

/* A device-to-device copy of `bytes`, reps times: GB/s counting bytes read
 * and written (median), or < 0 on error. */
double mxc_copy_bandwidth(size_t bytes, int reps);

#ifdef __cplusplus
}
#endif

#endif
