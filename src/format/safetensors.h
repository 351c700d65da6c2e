/* safetensors.h - memory-mapped safetensors files, single or sharded.
 *
 * A file is mmap'ed read-only once; tensors are views into the mapping and
 * weight data is never copied.  The header is validated strictly (length
 * bound, JSON, dtype, shape, offsets inside the data, no overlap, elements x
 * dtype size == bytes with overflow checks, duplicate names) and every error
 * names the file and the tensor. */
#ifndef MX_SAFETENSORS_H
#define MX_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "util/dtype.h"
#include "util/err.h"

#define MX_MAX_DIMS 8

typedef struct mx_tensor {
    const char *name;        /* owned by the set */
    mx_dtype dtype;
    int ndim;
    int64_t shape[MX_MAX_DIMS];
    const void *data;        /* points into the mmap (a lazy set: see mx_st_map) */
    size_t nbytes;
    const char *file;        /* path of the shard holding it */
    uint64_t offset;         /* of its data in that file */
} mx_tensor;

int64_t mx_tensor_numel(const mx_tensor *t);

/* Largest header accepted (bytes).  Real checkpoints stay far below. */
#define MX_ST_MAX_HEADER (100u << 20)

/* Parses a safetensors image held in memory (header + data), for fuzzing and
 * for files.  `name` is used in messages.  On success *tensors is a malloc'ed
 * array of *n tensors whose data pointers point into buf and whose names are
 * malloc'ed; free with mx_st_free_tensors.  Each tensor's `file` is `name`
 * itself (not copied).  Data pointers may be unaligned. */
int mx_st_parse(const uint8_t *buf, size_t len, const char *name,
                mx_tensor **tensors, size_t *n, mx_err *e);
void mx_st_free_tensors(mx_tensor *tensors, size_t n);

/* A set of tensors from one or more mmap'ed files. */
typedef struct mx_st_set mx_st_set;

/* Opens one .safetensors file. */
int mx_st_open_file(const char *path, mx_st_set **out, mx_err *e);
/* Opens a checkpoint directory: model.safetensors.index.json (every shard it
 * names must exist; every tensor it maps must be in its shard) or else every
 * *.safetensors file in the directory except reference.safetensors. */
int mx_st_open_dir(const char *dir, mx_st_set **out, mx_err *e);
void mx_st_close(mx_st_set *s);

/* mx_st_open_dir reading the headers alone: no tensor's data is mapped
 * (data NULL) until mx_st_map maps it, so a process that needs a share of
 * a checkpoint holds only that share in its address space. */
int mx_st_open_dir_lazy(const char *dir, mx_st_set **out, mx_err *e);
/* Makes bytes [lo, hi) of t (a tensor of s) readable at t->data + lo: a
 * lazy set maps them (whole pages; a range already mapped is kept, and an
 * earlier mapping stays valid when a wider one replaces it), other sets
 * have them already.  t->data is only meaningful over the ranges mapped. */
int mx_st_map(mx_st_set *s, const mx_tensor *t, uint64_t lo, uint64_t hi, mx_err *e);
/* Path and size of file i of the set (i < mx_st_nfiles). */
const char *mx_st_file_path(const mx_st_set *s, size_t i);
uint64_t mx_st_file_size(const mx_st_set *s, size_t i);

const mx_tensor *mx_st_find(const mx_st_set *s, const char *name);
size_t mx_st_count(const mx_st_set *s);
const mx_tensor *mx_st_at(const mx_st_set *s, size_t i);
/* Total bytes of the files (on disk). */
uint64_t mx_st_file_bytes(const mx_st_set *s);
size_t mx_st_nfiles(const mx_st_set *s);

/* Writing (used by `mlxcel synth` and tests).  Streams tensors to disk: the
 * header is written first from the declared list, then data in order. */
typedef struct mx_st_writer mx_st_writer;
typedef struct mx_st_decl {
    const char *name;
    mx_dtype dtype;
    int ndim;
    int64_t shape[MX_MAX_DIMS];
} mx_st_decl;
int mx_st_writer_open(const char *path, const mx_st_decl *decls, size_t n,
                      mx_st_writer **out, mx_err *e);
/* Appends bytes of the current tensor (tensors are filled in declaration
 * order; a tensor may be written in several calls). */
int mx_st_writer_write(mx_st_writer *w, const void *data, size_t nbytes, mx_err *e);
/* Checks every declared byte was written, then closes. */
int mx_st_writer_close(mx_st_writer *w, mx_err *e);

#endif
