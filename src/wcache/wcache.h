/* wcache.h - the weight cache: a repacked copy of a checkpoint's quantized
 * matrices (quant.h: mx_qmat_repack), written once in a cache folder and
 * mmap'ed read-only on later runs, so decode streams the repacked layout
 * without the user's checkpoint ever being modified (docs/cache.md).
 *
 * One file per checkpoint, in $MLXCEL_CACHE_DIR, else
 * $XDG_CACHE_HOME/mlxcel, else ~/.cache/mlxcel, named from a hash of the
 * checkpoint's canonical path:
 *
 *   header   magic, MX_REPACK_VERSION, the cache's own layout version, the
 *            checkpoint's path, its weight files (size, mtime in ns, inode,
 *            device), per matrix (offset, bytes, rows, cols, bits, group
 *            size, scale dtype, a hash of its first and last bytes), and a
 *            hash of the whole header
 *   payload  each matrix's repacked form at a page-aligned offset
 *
 * Any difference (a checkpoint file touched or replaced, another layout
 * version, a matrix of another shape, a truncated or damaged file) makes
 * the file stale: it is rebuilt, with one warning naming the file and why.
 * A build writes a temporary file in the cache folder and renames it into
 * place (under an flock, so concurrent processes build it once and never
 * see half a file).  A cache problem (no space, a folder that cannot be
 * written) is a warning: the run goes on with the checkpoint's own layout
 * (the zero-copy path). */
#ifndef MX_WCACHE_H
#define MX_WCACHE_H

#include <stddef.h>
#include <stdint.h>

#include "quant/quant.h"
#include "util/err.h"

/* The cache's own layout version (the header format); MX_REPACK_VERSION
 * (quant.h) versions the payload. */
#define MX_WCACHE_LAYOUT 1

/* What a model load does with repacked forms:
 *   off      the checkpoint's layout only (zero copy)
 *   auto     a valid cache file, else build it, then map it
 *   mem      repack into anonymous memory at every load (no file)
 *   rebuild  build the cache file even when a valid one exists */
typedef enum mx_repack_mode {
    MX_REPACK_OFF,
    MX_REPACK_AUTO,
    MX_REPACK_MEM,
    MX_REPACK_REBUILD,
} mx_repack_mode;

/* The mode of this process: mx_repack_mode_set's, else MLXCEL_REPACK (an
 * unknown value: a warning, and the default), else the default: auto when
 * the active kernels read the repacked form (AVX-512 VNNI) and the model
 * runs on the CPU, off otherwise. */
mx_repack_mode mx_repack_mode_get(void);
/* "off", "auto", "mem" or "rebuild"; 0, or -1 for another name (unchanged). */
int mx_repack_mode_set(const char *name);
const char *mx_repack_mode_name(mx_repack_mode m);

/* What became of the cache at a load (or a probe). */
typedef enum mx_wcache_state {
    MX_WCACHE_OFF,       /* mode off, or no matrix has a repacked form */
    MX_WCACHE_USED,      /* a valid file was mapped */
    MX_WCACHE_BUILT,     /* built by this process, then mapped */
    MX_WCACHE_MEM,       /* repacked into anonymous memory */
    MX_WCACHE_FAILED,    /* a cache problem (reason): running without it */
    MX_WCACHE_VALID,     /* probe: a valid file is there */
    MX_WCACHE_ABSENT,    /* probe: no file, or a stale one (reason) */
} mx_wcache_state;

typedef struct mx_wcache_info {
    mx_repack_mode mode;
    mx_wcache_state state;
    char path[1024];           /* the cache file ("" in off and mem modes) */
    uint64_t file_bytes;       /* its size (mem: the bytes allocated) */
    size_t n_mats;             /* matrices given a repacked form */
    double seconds;            /* the build or the mapping and checks */
    char reason[600];          /* why it was rebuilt or not used */
} mx_wcache_info;

/* The matrices of a checkpoint and where they come from.  The order of
 * mats must be the same at every load of the same checkpoint (the file's
 * matrix table follows it). */
typedef struct mx_wcache_src {
    const char *dir;                 /* the checkpoint folder */
    const char *const *files;        /* its weight files (the cache's key) */
    size_t n_files;
    mx_qmat *const *mats;
    size_t n_mats;
} mx_wcache_src;

typedef struct mx_wcache mx_wcache;

/* Gives mats their repacked forms (mx_qmat.rp) as the mode says, from a
 * valid cache file, a new one, or anonymous memory, then drops the
 * checkpoint pages those forms replace from this process (madvise: they
 * stay readable, only not resident), so RSS holds one copy of the
 * weights.  Cache problems are warnings on stderr and leave rp NULL: the
 * return is MX_OK with *out describing what happened; only running out of
 * memory fails.  Free *out after the last use of the matrices. */
int mx_wcache_attach(const mx_wcache_src *src, mx_repack_mode mode, mx_wcache **out, mx_err *e);
const mx_wcache_info *mx_wcache_get_info(const mx_wcache *c);
/* "off", "used", "built", "mem", "failed", "valid", "absent". */
const char *mx_wcache_state_name(mx_wcache_state s);
/* Unmaps or frees the repacked forms (NULL is fine). */
void mx_wcache_free(mx_wcache *c);

/* Whether a valid cache file exists for src, without building or mapping
 * it for use (state VALID or ABSENT, with the path and the reason). */
int mx_wcache_probe(const mx_wcache_src *src, mx_wcache_info *info, mx_err *e);

/* The cache folder ($MLXCEL_CACHE_DIR, $XDG_CACHE_HOME/mlxcel or
 * ~/.cache/mlxcel) into buf; MX_EINVAL when none can be named. */
int mx_wcache_dir(char *buf, size_t cap, mx_err *e);

#endif
