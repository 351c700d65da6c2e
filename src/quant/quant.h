/* quant.h - MLX affine quantization: formats, kernels, dequantization.
 *
 * A quantized matrix W [rows, cols] is stored as MLX writes it:
 *   w      U32 [rows, cols*bits/32]  each row a little-endian bit stream,
 *                                    element k at bits [k*bits, (k+1)*bits)
 *   scales [rows, cols/group_size]   f16, bf16 or f32
 *   biases [rows, cols/group_size]   same dtype
 *   W[r][c] = scales[r][c/gs] * q[r][c] + biases[r][c/gs]
 *
 * Kernels (scalar reference + SIMD variants picked at run time):
 *   qmatvec  y = W x          one token (decode)
 *   qmatmul  Y = X W^T        T tokens (prefill)
 *   embed    one dequantized row (embedding lookup)
 * Because W·x over a group = s * sum(q*x) + b * sum(x), kernels take the
 * per-group sums of x (mx_group_sums, part of every variant's prepared x) so
 * the bias term costs one FMA per group instead of one per weight. */
#ifndef MX_QUANT_H
#define MX_QUANT_H

#include <stddef.h>
#include <stdint.h>

#include "format/safetensors.h"
#include "util/err.h"

/* ---- formats ---------------------------------------------------------- */

/* One row per supported bit width: the single description of the formats. */
typedef struct mx_qtraits {
    int bits;
    int values_per_word;   /* 32/bits rounded down; 0 when values straddle words */
    int straddles;         /* 1 for 3, 5, 6 bits */
    uint32_t mask;
} mx_qtraits;

/* NULL when `bits` is not supported (supported: 2, 3, 4, 5, 6, 8). */
const mx_qtraits *mx_qtraits_for(int bits);
/* 1 when group_size is supported (32, 64, 128). */
int mx_group_size_ok(int group_size);
/* 1 when scale/bias dtype is supported (F16, BF16, F32). */
int mx_scale_dtype_ok(mx_dtype t);

typedef struct mx_qmat {
    const uint8_t *w;        /* rows * row_bytes packed bytes */
    const void *scales;      /* rows * (cols / group_size) */
    const void *biases;      /* same */
    int64_t rows, cols;      /* out features, in features (unpacked) */
    int bits, group_size;
    mx_dtype sdtype;         /* dtype of scales and biases */
    const uint8_t *rp;       /* the same matrix repacked (below), or NULL: an extra
                                copy the VNNI kernels read instead of w/scales/biases,
                                which stay valid for every other reader */
} mx_qmat;

static inline int64_t mx_qmat_row_bytes(const mx_qmat *m) { return m->cols * m->bits / 8; }
static inline int64_t mx_qmat_groups(const mx_qmat *m) { return m->cols / m->group_size; }
/* Bytes of weights + scales + biases (what a matvec streams). */
size_t mx_qmat_bytes(const mx_qmat *m);

/* Builds a qmat view from three tensors (weight, scales, biases).  `bits` and
 * `group_size` come from the config; when bits <= 0 they are inferred from the
 * shapes (bits = 32*w.shape[-1] / (scales.shape[-1]*gs)); when both are known
 * they must agree.  Leading dimensions (stacked experts) are allowed: the view
 * covers matrix `index` of the stack (use 0 for 2-D).  Errors name `name`. */
int mx_qmat_from_tensors(const mx_tensor *w, const mx_tensor *scales,
                         const mx_tensor *biases, int bits, int group_size,
                         int64_t index, const char *name, mx_qmat *out, mx_err *e);

/* ---- the repacked layout ------------------------------------------------
 *
 * A copy of a 4-bit matrix laid out for the AVX-512 VNNI kernels, so that a
 * kernel reads one sequential stream per 32 rows, with no unpacking or
 * transposing at run time (the MLX layout needs both: its rows are bit
 * streams, and scales and biases sit in two arrays of their own).
 *   tiles of 32 rows (rows 32t .. 32t+31; the last tile's missing rows are
 *   zero: q = 0, scale = 0, bias = 0), tile t at t * tile_bytes;
 *   inside a tile, group g (columns [g*gs, (g+1)*gs)) at g * group_bytes:
 *     gs/4 k-steps of 64 bytes; k-step s covers columns c = g*gs + 4s ..+3:
 *       byte 4i+j (dword lane i < 16, byte j < 4) =
 *           q[row i][c+j] | q[row 16+i][c+j] << 4
 *       so `v & 15` holds rows 0-15 and `(v >> 4) & 15` rows 16-31, each
 *       lane four consecutive columns of one row: vpdpbusd operands as is;
 *     then the 32 rows' scales of group g, then their 32 biases, in the
 *     checkpoint's dtype (f16, bf16, f32; copied bit for bit).
 *   group_bytes = 16*gs + 64*sizeof(dtype) (a multiple of 64),
 *   tile_bytes = groups * group_bytes.
 * Only 4 bits has one (mx_qmat_repack_bytes is 0 for the other widths).
 * Bump MX_REPACK_VERSION whenever this layout changes (caches store it). */
#define MX_REPACK_VERSION 1
#define MX_REPACK_ROWS 32

/* Bytes of m's repacked form; 0 when its format has none (then every kernel
 * reads the MLX layout). */
size_t mx_qmat_repack_bytes(const mx_qmat *m);
/* Writes m's repacked form (mx_qmat_repack_bytes(m) bytes, dst 64-byte
 * aligned) from its MLX layout: deterministic, a pure function of the
 * matrix, thread-safe for different dst. */
void mx_qmat_repack(const mx_qmat *m, void *dst);
/* Element (r, c) read back from m->rp (reference, slow; tests). */
float mx_qmat_rp_get(const mx_qmat *m, int64_t r, int64_t c);

/* Value of element (r, c) (reference, slow). */
float mx_qmat_get(const mx_qmat *m, int64_t r, int64_t c);
/* Dequantizes row r into out[cols] (embedding lookup). */
void mx_qmat_row(const mx_qmat *m, int64_t r, float *out);

/* Per-group sums of x: out[g] = sum x[g*gs .. (g+1)*gs). */
void mx_group_sums(const float *x, int64_t cols, int group_size, float *out);

/* ---- kernels ---------------------------------------------------------- */

/* One implementation of the kernels.  All work on a row range so callers
 * (threaded wrappers, the fused MoE kernel) decide the split.
 *
 * A matvec input x is prepared ONCE (prep) and the prepared form is shared
 * by every matvec_rows call on matrices with the same cols and group_size,
 * whatever row ranges and threads they use: the float variants prepare the
 * group sums of x, the integer variant also quantizes x to int8 pairs. */
typedef struct mx_qkernels {
    const char *name;      /* "scalar", "avx2", "avx512", "avx512vnni", "neon"; the fast
                              precision's "scalar-fast", "avx512vnni-fast" */
    int fast;              /* x as one int8 level per group (--precision fast) */
    int reads_rp;          /* 1: takes the repacked form (mx_qmat.rp) when a matrix has one;
                              0: always reads the MLX layout (a repacked copy is wasted) */
    /* Bytes of the prepared form of an x of `cols` values (a multiple of
     * group_size). */
    size_t (*prep_bytes)(int64_t cols, int group_size);
    /* Writes the prepared form of x into buf (prep_bytes(cols, group_size)
     * bytes, aligned to at least 16; 64 is best). */
    void (*prep)(const float *x, int64_t cols, int group_size, void *buf);
    /* y[r - r0] = sum_c W[r][c] x[c] for r in [r0, r1).  xp is the buffer
     * that prep(x, m->cols, m->group_size, xp) filled. */
    void (*matvec_rows)(const mx_qmat *m, const float *x, const void *xp,
                        float *y, int64_t r0, int64_t r1);
    /* Optional (NULL: matvec_rows once per vector): the same for T vectors
     * x_t = X + t*ldx, each prepared by prep into xp + t*xstride:
     * Y[t*ldy + r - r0] = sum_c W[r][c] x_t[c] for r in [r0, r1).  Each
     * weight line is read once for all T (a batched decode step, an expert
     * picked by a few prompt tokens). */
    void (*matvec_rows_multi)(const mx_qmat *m, const float *X, int64_t ldx, const void *xp,
                              size_t xstride, int64_t T, float *Y, int64_t ldy, int64_t r0,
                              int64_t r1);
    /* Y[t*ldy + r] = sum_c W[r][c] X[t*ldx + c] for t < T, r in [r0, r1). */
    void (*matmul_rows)(const mx_qmat *m, const float *X, int64_t ldx, int64_t T,
                        float *Y, int64_t ldy, int64_t r0, int64_t r1);
    /* Optional (NULL when a variant has none): matmul_rows split in two so
     * the T activation rows are prepared once per call, by all threads
     * together, instead of once per row range.  mm_prep fills tokens
     * [t0, t1) of a buffer of mm_prep_bytes(T, ...) laid out for T tokens. */
    size_t (*mm_prep_bytes)(int64_t T, int64_t cols, int group_size);
    void (*mm_prep)(const float *X, int64_t ldx, int64_t T, int64_t t0, int64_t t1, int64_t cols,
                    int group_size, void *buf);
    void (*matmul_rows_prepped)(const mx_qmat *m, const void *xp, int64_t T, float *Y, int64_t ldy,
                                int64_t r0, int64_t r1);
} mx_qkernels;

/* The variant in use: best the CPU supports, or MLXCEL_KERNEL=scalar|avx2|
 * avx512|avx512vnni|neon when set (falls back to the best with a warning if unsupported),
 * taken in the chosen precision: under the fast precision the variant's fast
 * twin (avx512vnni -> avx512vnni-fast, scalar -> scalar-fast; the float
 * variants have none and stay exact). */
const mx_qkernels *mx_qkernels_active(void);

/* Precision of the integer kernels.  Exact (the default): x as three int8
 * levels per group, as close as float rounding; what the fixture tests
 * check.  Fast: one int8 level per group (as llama.cpp's Q8 activations)
 * with exact group sums for the bias term: a third of the integer work,
 * its quality measured (docs/quality.md).  MLXCEL_PRECISION=exact|fast sets
 * it, mx_precision_set overrides (the --precision flag). */
typedef enum mx_precision { MX_PRECISION_EXACT, MX_PRECISION_FAST } mx_precision;
mx_precision mx_precision_get(void);
/* "exact" or "fast"; returns 0, or -1 for another name (unchanged). */
int mx_precision_set(const char *name);
const char *mx_precision_name(mx_precision p);
/* A named variant, or NULL when unknown or the CPU cannot run it. */
const mx_qkernels *mx_qkernels_get(const char *name);
/* Forces a variant (tests); NULL restores the automatic choice.  Returns 0, or
 * -1 if the CPU cannot run it. */
int mx_qkernels_force(const char *name);
/* NULL-terminated list of all compiled-in variant names. */
const char *const *mx_qkernels_names(void);

/* Threaded wrappers over the active variant (OpenMP, mx_threads()). */
void mx_qmatvec(const mx_qmat *m, const float *x, float *y);
void mx_qmatmul(const mx_qmat *m, const float *X, int64_t T, float *Y);

/* ---- linear layers: quantized or plain float --------------------------- */

/* A linear layer y = W x (+ bias).  Routers and shared-expert gates may be
 * stored unquantized; this type hides the difference. */
typedef struct mx_linear {
    int quantized;
    mx_qmat q;               /* when quantized */
    const void *w;           /* when not: [rows, cols] in dtype wdtype */
    mx_dtype wdtype;         /* F32, F16 or BF16 */
    int64_t rows, cols;
    const float *bias;       /* optional [rows], f32 (owned by the model) */
} mx_linear;

/* A vector x prepared for the matvec kernels, once per group size it meets
 * (on first use) and then shared by every matrix and row range that reads
 * it.  One mx_vec belongs to one thread at a time; buf holds
 * mx_vec_bytes(cols) bytes, 64-byte aligned. */
typedef struct mx_vec {
    const float *x;
    int64_t cols;
    unsigned char *buf;          /* three slots, group sizes 32, 64, 128 */
    size_t slot;                 /* bytes per slot */
    unsigned ready;              /* bit i: slot i prepared */
    const mx_qkernels *k;        /* the variant that prepares and reads it */
} mx_vec;

size_t mx_vec_bytes(int64_t cols);
void mx_vec_init(mx_vec *v, const float *x, int64_t cols, void *buf);
/* The prepared form for group size gs (32, 64 or 128), made on first use. */
const void *mx_vec_prep(mx_vec *v, int gs);

/* T vectors (X rows ldx apart, cols values each) prepared once for the
 * kernels of one group size, then read by any number of threads for any
 * row ranges (batch.c): each vector on its own for T <= MX_BATCH_SMALL (the
 * matvec kernel reads each weight line once for all of them), else as the
 * prefill kernel's block.  buf holds mx_batch_bytes bytes, 64-byte aligned;
 * the threads of a region prepare it together, split by token. */
#define MX_BATCH_SMALL 16
enum { MX_BATCH_VECTORS, MX_BATCH_BLOCK, MX_BATCH_RAW };
typedef struct mx_batch {
    const float *X;
    int64_t ldx, T, cols;
    int gs, mode;
    const mx_qkernels *k;
    unsigned char *buf;
    size_t vstride;              /* bytes per prepared vector (MX_BATCH_VECTORS) */
} mx_batch;

size_t mx_batch_bytes(int64_t T, int64_t cols, int gs);
void mx_batch_init(mx_batch *b, const float *X, int64_t ldx, int64_t T, int64_t cols, int gs,
                   void *buf);
/* Prepares vectors [t0, t1). */
void mx_batch_prep(mx_batch *b, int64_t t0, int64_t t1);
/* Y[t*ldy + r] = (W x_t)[r] for t < T, r in [r0, r1), on the calling
 * thread.  A matrix of another group size than the batch's still works
 * (each vector prepared per call: slow). */
void mx_qmat_rows_batch(const mx_qmat *m, const mx_batch *b, float *Y, int64_t ldy, int64_t r0,
                        int64_t r1);
/* The same for a linear layer (+ bias); float weights read X directly. */
void mx_linear_rows_batch(const mx_linear *l, const mx_batch *b, float *Y, int64_t ldy,
                          int64_t r0, int64_t r1);

/* y[r] = (W x)[r] + bias[r] for r in [r0, r1) only, on the calling thread
 * (the caller splits rows over its threads).  x->cols == l->cols. */
void mx_linear_rows(const mx_linear *l, mx_vec *x, float *y, int64_t r0, int64_t r1);

/* y[rows] = W x + bias.  Threaded. */
void mx_linear_matvec(const mx_linear *l, const float *x, float *y);
/* Y[T, rows] = X[T, cols] W^T + bias.  Threaded. */
void mx_linear_matmul(const mx_linear *l, const float *X, int64_t T, float *Y);
/* Bytes a matvec streams. */
size_t mx_linear_bytes(const mx_linear *l);

/* ---- quantizer (reference, used by synth and tests) -------------------- */

/* Quantizes float rows [rows, cols] the way MLX does (per group: the extreme
 * of larger magnitude maps to q=0 or q=max; scale may be negative) and writes
 * packed bytes (rows*cols*bits/8), scales and biases in sdtype. */
int mx_quantize(const float *w, int64_t rows, int64_t cols, int bits, int group_size,
                mx_dtype sdtype, uint8_t *packed, void *scales, void *biases, mx_err *e);

#endif
