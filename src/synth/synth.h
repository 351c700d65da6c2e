/* synth.h - synthetic MLX checkpoints with random weights (`mlxcel synth`).
 *
 * A preset names a published architecture (exact dimensions, in its
 * family's file: model/family_*.c); synth writes a checkpoint of that shape that loads like an mlx-community one: config.json
 * (with "quantization" and "quantization_config"), generation_config.json,
 * a byte-level BPE tokenizer.json covering every id, tokenizer_config.json
 * with a ChatML template, and the weights in safetensors shards named and
 * laid out the way mlx-lm saves them.
 *
 * The weights are defined directly in quantized form: the packed codes are
 * random bits, and each group's scale/bias is chosen so a row has roughly
 * N(0, gain/sqrt(fan_in)) spread (about a quarter of the scales negative).
 * Everything is a pure function of (seed, tensor name, row), so a tensor is
 * written in parallel row blocks without ever holding the model in memory,
 * and mx_synth_expected_row recomputes the intended float weights of any row
 * independently of the file, which makes a load -> dequantize round trip
 * checkable exactly. */
#ifndef MX_SYNTH_H
#define MX_SYNTH_H

#include <stddef.h>
#include <stdint.h>

#include "format/config.h"
#include "format/safetensors.h"
#include "model/family.h"
#include "util/err.h"

typedef enum mx_synth_layout {
    MX_SYNTH_LAYOUT_DEFAULT = 0,   /* the preset's usual layout */
    MX_SYNTH_PER_EXPERT,           /* one tensor per expert: {moe}.{per_expert}.{proj} */
    MX_SYNTH_STACKED,              /* {moe}.{stacked}.{proj} with a leading expert dim */
} mx_synth_layout;

/* The presets (the real models' shapes) live in the family table
 * (model/family.h: mx_preset, mx_preset_find); synth writes any of them. */

typedef struct mx_synth_opts {
    const char *preset;           /* preset name */
    int bits;                     /* default 4 */
    int group_size;               /* default 64 */
    int scale_dtype;              /* an mx_dtype, or -1: the preset's dtype */
    mx_synth_layout layout;
    uint64_t seed;                /* default 0 */
    uint64_t shard_bytes;         /* max bytes per shard; default 5 GB (5<<30) */
    int layers;                   /* 0: the preset's; else this many layers of its shape
                                     (a scaled-down variant that fits in memory) */
    int force;                    /* replace the checkpoint files in a non-empty dir */
    int progress;                 /* progress lines on stderr */
} mx_synth_opts;

void mx_synth_opts_default(mx_synth_opts *o);

/* What a tensor of the plan holds. */
typedef enum mx_synth_kind {
    MX_SYNTH_QWEIGHT,             /* packed codes, U32 [.., out, in*bits/32] */
    MX_SYNTH_QSCALES,             /* [.., out, in/gs] in the scale dtype */
    MX_SYNTH_QBIASES,             /* same */
    MX_SYNTH_NORM,                /* norm weight or scale near 1, model dtype */
    MX_SYNTH_LBIAS,               /* small values: a linear's or norm's bias (model dtype),
                                     a router's choice bias (F32) */
    MX_SYNTH_FMAT,                /* an unquantized matrix [rows, cols], model dtype */
} mx_synth_kind;

#define MX_SYNTH_NAME_MAX 128

/* One tensor of the checkpoint. */
typedef struct mx_synth_tensor {
    char name[MX_SYNTH_NAME_MAX];     /* "model.layers.0.self_attn.q_proj.weight" */
    char module[MX_SYNTH_NAME_MAX];   /* "model.layers.0.self_attn.q_proj" (quantized) */
    mx_synth_kind kind;
    mx_dtype dtype;
    int ndim;
    int64_t shape[3];
    /* quantized: stack count (1 for 2-D), out rows, in cols, format, gain;
     * float vectors: nmat = rows = 1, cols = length */
    int64_t nmat, rows, cols;
    int bits, group_size;
    float gain;                       /* row std = gain / sqrt(cols) */
    uint64_t nbytes;
    int shard;                        /* index into the shard list */
} mx_synth_tensor;

typedef struct mx_synth_plan {
    mx_synth_opts opts;               /* with defaults resolved */
    const mx_family *fam;
    const mx_preset *p;               /* the preset, with opts.layers applied (owned) */
    /* config.json as written (without the quantization block), parsed with
     * the family's aliases and defaults: the tensors follow it as the
     * loader reads it (owned) */
    mx_config *cfg;
    mx_dtype sdtype;                  /* scale dtype actually used */
    int router_bits, router_group;    /* routers (8-bit override) */
    mx_synth_tensor *t;               /* sorted by name, like mlx-lm */
    size_t n;
    uint64_t total_bytes;             /* tensor data, as the index total_size */
    int nshards;                      /* 1 => a single model.safetensors */
} mx_synth_plan;

/* Lists every tensor (name, dtype, shape, shard) for the options; cheap, no
 * I/O.  Validates bits/group size/scale dtype against the dimensions. */
int mx_synth_plan_build(const mx_synth_opts *o, mx_synth_plan *plan, mx_err *e);
void mx_synth_plan_free(mx_synth_plan *plan);
const mx_synth_tensor *mx_synth_plan_find(const mx_synth_plan *plan, const char *name);
/* File name of shard k ("model.safetensors" or "model-0000K-of-0000N..."),
 * into buf. */
void mx_synth_shard_name(const mx_synth_plan *plan, int k, char *buf, size_t cap);

/* Writes the checkpoint into dir (created if missing).  A non-empty dir is
 * refused unless o->force; with force, the files synth writes and any other
 * *.safetensors / index in dir are replaced (nothing else is touched). */
int mx_synth_write(const mx_synth_opts *o, const char *dir, mx_err *e);

/* The intended float values of one row.  For a quantized module, `name` is
 * the module path or its .weight/.scales/.biases tensor; `index` picks the
 * matrix of a stack (0 for 2-D); out gets `cols` floats
 * (scale * q + bias with the scale/bias rounded to the scale dtype, exactly
 * what dequantizing the stored tensors gives).  For an unquantized matrix,
 * the row after rounding to its dtype; for a norm or bias, index = row = 0
 * and out gets the vector (after rounding to its dtype). */
int mx_synth_expected_row(const mx_synth_plan *plan, const char *name, int64_t index,
                          int64_t row, float *out, mx_err *e);

/* config.json without its quantization block (a new cJSON object the
 * caller deletes, NULL when out of memory). */
struct cJSON *mx_synth_config_json(const mx_synth_plan *plan);

/* Files besides the weights (used by mx_synth_write; public for tests). */
int mx_synth_write_config(const mx_synth_plan *plan, const char *dir, mx_err *e);
int mx_synth_write_tokenizer(const mx_synth_plan *plan, const char *dir, mx_err *e);

#endif
