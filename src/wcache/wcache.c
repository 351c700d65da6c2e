/* wcache.c - the weight cache (see wcache.h and docs/cache.md).
 *
 *   attach(auto)
 *     plan: which matrices have a repacked form, their page-aligned offsets,
 *           the header the file must have (checkpoint files' identity)
 *     open_valid(path) --ok--> map it, set rp
 *        | absent / stale (warning with the reason)
 *     flock(path.lock), open_valid again (another process may have built it)
 *     build: temp file, fallocate, repack in parallel into a shared mapping
 *            (progress on stderr), header last, fdatasync, rename
 *     open_valid(path) -> map it, set rp
 *     drop the checkpoint pages the repacked forms replace (madvise)
 *
 * Every failure on the way (no space, a folder that cannot be written) is
 * one warning and the run goes on without the cache. */
#include "wcache/wcache.h"
#include "quant/quant.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pwd.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <omp.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "util/clock.h"
#include "util/parallel.h"

#define WC_PAGE 4096u
#define WC_MAGIC "MLXCWCH"           /* 8 bytes with its NUL */
#define WC_FIXED 64u                 /* bytes of the fixed part of the header */
#define WC_SPOT 512u                 /* bytes hashed at each end of a payload */
/* A build of fewer bytes takes well under a second: no progress lines
 * (--stats and inspect still say the cache was built / used). */
#define WC_QUIET_BYTES (64ull << 20)

/* ---- the mode ---------------------------------------------------------- */

static const char *const g_mode_names[] = {"off", "auto", "mem", "rebuild"};
static int g_mode = -1;   /* -1: not set (the environment's, else off) */

static int mode_parse(const char *s)
{
    for (int i = 0; i < 4; i++)
        if (!strcmp(s, g_mode_names[i]))
            return i;
    return -1;
}

/* The default: auto where the repacked form pays (docs/kernels.md: the
 * VNNI kernels 1.2-2.5x faster on it, prefill and decode), off where
 * nothing would read it: kernels that take only the MLX layout, or a model
 * run on a GPU (MLXCEL_DEVICE, which --device sets), whose backend copies
 * the checkpoint's layout. */
static mx_repack_mode default_mode(void)
{
    const char *dev = getenv("MLXCEL_DEVICE");
    if (dev && *dev && strcmp(dev, "cpu") != 0)
        return MX_REPACK_OFF;
    const mx_qkernels *k = mx_qkernels_active();
    return k && k->reads_rp ? MX_REPACK_AUTO : MX_REPACK_OFF;
}

mx_repack_mode mx_repack_mode_get(void)
{
    if (g_mode >= 0)
        return (mx_repack_mode)g_mode;
    const char *env = getenv("MLXCEL_REPACK");
    if (!env || !*env)
        return default_mode();
    int m = mode_parse(env);
    if (m < 0) {
        mx_repack_mode d = default_mode();
        static int warned;
        if (!warned++)
            fprintf(stderr, "mlxcel: warning: MLXCEL_REPACK='%s' is not a mode (off, auto, mem, "
                            "rebuild): %s\n", env, mx_repack_mode_name(d));
        return d;
    }
    return (mx_repack_mode)m;
}

int mx_repack_mode_set(const char *name)
{
    int m = name ? mode_parse(name) : -1;
    if (m < 0)
        return -1;
    g_mode = m;
    return 0;
}

const char *mx_repack_mode_name(mx_repack_mode m)
{
    return (unsigned)m < 4 ? g_mode_names[m] : "?";
}

/* ---- small helpers ----------------------------------------------------- */

static uint64_t round_up(uint64_t n, uint64_t a) { return (n + a - 1) / a * a; }

__attribute__((format(printf, 3, 4))) static void set_reason(mx_wcache_info *info, int state,
                                                             const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(info->reason, sizeof info->reason, fmt, ap);
    va_end(ap);
    info->state = (mx_wcache_state)state;
}

/* One warning line, and the run goes on without the cache. */
static void give_up(mx_wcache_info *info)
{
    info->state = MX_WCACHE_FAILED;
    fprintf(stderr, "mlxcel: warning: weight cache: %s; running without it\n", info->reason);
}

int mx_wcache_dir(char *buf, size_t cap, mx_err *e)
{
    const char *d = getenv("MLXCEL_CACHE_DIR");
    int n;
    if (d && *d) {
        n = snprintf(buf, cap, "%s", d);
    } else if ((d = getenv("XDG_CACHE_HOME")) && *d == '/') {
        n = snprintf(buf, cap, "%s/mlxcel", d);
    } else {
        const char *home = getenv("HOME");
        if (!home || !*home) {
            const struct passwd *pw = getpwuid(getuid());
            home = pw ? pw->pw_dir : NULL;
        }
        if (!home || !*home)
            return mx_fail(e, MX_EINVAL, "no cache folder: set MLXCEL_CACHE_DIR (HOME is not set)");
        n = snprintf(buf, cap, "%s/.cache/mlxcel", home);
    }
    if (n < 0 || (size_t)n >= cap)
        return mx_fail(e, MX_EINVAL, "the cache folder's name is too long");
    return MX_OK;
}

/* mkdir -p */
static int make_dirs(const char *path)
{
    char p[PATH_MAX];
    if (snprintf(p, sizeof p, "%s", path) >= (int)sizeof p) {
        errno = ENAMETOOLONG;
        return -1;
    }
    for (char *s = p + 1; *s; s++)
        if (*s == '/') {
            *s = 0;
            if (mkdir(p, 0755) != 0 && errno != EEXIST)
                return -1;
            *s = '/';
        }
    if (mkdir(p, 0755) != 0 && errno != EEXIST)
        return -1;
    struct stat st;
    if (stat(p, &st) != 0)
        return -1;
    if (!S_ISDIR(st.st_mode)) {
        errno = ENOTDIR;
        return -1;
    }
    return 0;
}

static int isalnum_ascii(char c)
{
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}

static const char *base_name(const char *p)
{
    const char *s = strrchr(p, '/');
    return s ? s + 1 : p;
}

/* ---- the header -------------------------------------------------------- */

/* A growing byte buffer the header is written into. */
typedef struct wbuf {
    unsigned char *p;
    size_t len, cap;
    int oom;
} wbuf;

static void put(wbuf *b, const void *v, size_t n)
{
    if (b->oom)
        return;
    if (b->len + n > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (cap < b->len + n)
            cap *= 2;
        unsigned char *p = realloc(b->p, cap);
        if (!p) {
            b->oom = 1;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->len, v, n);
    b->len += n;
}
static void put_u32(wbuf *b, uint32_t v) { put(b, &v, 4); }
static void put_u64(wbuf *b, uint64_t v) { put(b, &v, 8); }
static void put_str(wbuf *b, const char *s)
{
    static const unsigned char zero[8];
    size_t n = strlen(s);
    put_u32(b, (uint32_t)n);
    put_u32(b, 0);
    put(b, s, n);
    put(b, zero, round_up(n, 8) - n);
}

/* Reading it back, bounds-checked: a damaged header never reads past the
 * bytes it has. */
typedef struct rbuf {
    const unsigned char *p;
    size_t len, at;
    int bad;
} rbuf;

static const void *take(rbuf *r, size_t n)
{
    if (r->bad || n > r->len - r->at) {
        r->bad = 1;
        return NULL;
    }
    const void *v = r->p + r->at;
    r->at += n;
    return v;
}
static uint32_t get_u32(rbuf *r)
{
    uint32_t v = 0;
    const void *s = take(r, 4);
    if (s)
        memcpy(&v, s, 4);
    return v;
}
static uint64_t get_u64(rbuf *r)
{
    uint64_t v = 0;
    const void *s = take(r, 8);
    if (s)
        memcpy(&v, s, 8);
    return v;
}
/* A string of the header equals want. */
static int get_str_eq(rbuf *r, const char *want)
{
    uint32_t n = get_u32(r);
    get_u32(r);
    const char *s = take(r, round_up(n, 8));
    return s && n == strlen(want) && !memcmp(s, want, n);
}

/* Where a checkpoint file stands on disk: any change makes the cache stale. */
typedef struct file_id {
    uint64_t size, mtime_ns, ino, dev;
} file_id;

static int file_id_of(const char *path, file_id *id)
{
    struct stat st;
    if (stat(path, &st) != 0)
        return -1;
    id->size = (uint64_t)st.st_size;
    id->mtime_ns = (uint64_t)st.st_mtim.tv_sec * 1000000000u + (uint64_t)st.st_mtim.tv_nsec;
    id->ino = (uint64_t)st.st_ino;
    id->dev = (uint64_t)st.st_dev;
    return 0;
}

/* One matrix of the file. */
typedef struct wc_mat {
    uint32_t src;              /* index in the source's list */
    uint64_t off, bytes;       /* of its repacked form in the file */
    uint64_t spot;             /* hash of its first and last WC_SPOT bytes */
} wc_mat;

/* The plan of the file for a source: the header it must have. */
typedef struct wc_plan {
    char canon[PATH_MAX];      /* the checkpoint folder's canonical path */
    file_id *ids;              /* [n_files] */
    wc_mat *mats;
    size_t n;                  /* matrices with a repacked form */
    uint64_t header_bytes;     /* page-aligned start of the payload */
    uint64_t file_bytes;
    uint64_t payload_bytes;    /* sum of the repacked forms */
} wc_plan;

static void plan_free(wc_plan *p)
{
    free(p->ids);
    free(p->mats);
    memset(p, 0, sizeof *p);
}

/* The header of plan p (with its matrices' spot hashes as they are in p)
 * into b: fixed part, checkpoint path, files, matrices; the checksum at
 * byte 32 covers everything with itself zero. */
static void header_write(const mx_wcache_src *src, const wc_plan *p, wbuf *b)
{
    char magic[8] = WC_MAGIC;
    put(b, magic, 8);
    put_u32(b, MX_WCACHE_LAYOUT);
    put_u32(b, MX_REPACK_VERSION);
    put_u64(b, p->header_bytes);
    put_u64(b, p->file_bytes);
    put_u64(b, 0);                       /* checksum, set below */
    put_u64(b, 0);                       /* header length, set below */
    put_u32(b, (uint32_t)src->n_files);
    put_u32(b, (uint32_t)p->n);
    put_u64(b, 0);
    put_str(b, p->canon);
    for (size_t i = 0; i < src->n_files; i++) {
        put_str(b, base_name(src->files[i]));
        put_u64(b, p->ids[i].size);
        put_u64(b, p->ids[i].mtime_ns);
        put_u64(b, p->ids[i].ino);
        put_u64(b, p->ids[i].dev);
    }
    for (size_t i = 0; i < p->n; i++) {
        const mx_qmat *m = src->mats[p->mats[i].src];
        put_u32(b, p->mats[i].src);
        put_u32(b, (uint32_t)m->bits);
        put_u32(b, (uint32_t)m->group_size);
        put_u32(b, (uint32_t)m->sdtype);
        put_u64(b, (uint64_t)m->rows);
        put_u64(b, (uint64_t)m->cols);
        put_u64(b, p->mats[i].off);
        put_u64(b, p->mats[i].bytes);
        put_u64(b, p->mats[i].spot);
    }
    if (b->oom)
        return;
    uint64_t len = b->len;
    memcpy(b->p + 40, &len, 8);
    uint64_t sum = XXH3_64bits(b->p, b->len);
    memcpy(b->p + 32, &sum, 8);
}

/* Plans the file for src: the matrices with a repacked form, offsets, the
 * checkpoint's identity.  MX_ENOMEM, or MX_EIO with the reason in info. */
static int plan_make(const mx_wcache_src *src, wc_plan *p, mx_wcache_info *info, mx_err *e)
{
    memset(p, 0, sizeof *p);
    if (!realpath(src->dir, p->canon)) {
        set_reason(info, MX_WCACHE_FAILED, "%s: %s", src->dir, strerror(errno));
        return MX_EIO;
    }
    p->ids = calloc(src->n_files ? src->n_files : 1, sizeof *p->ids);
    p->mats = calloc(src->n_mats ? src->n_mats : 1, sizeof *p->mats);
    if (!p->ids || !p->mats)
        return mx_fail(e, MX_ENOMEM, "out of memory planning the weight cache");
    for (size_t i = 0; i < src->n_files; i++)
        if (file_id_of(src->files[i], &p->ids[i]) != 0) {
            set_reason(info, MX_WCACHE_FAILED, "%s: %s", src->files[i], strerror(errno));
            return MX_EIO;
        }
    for (size_t i = 0; i < src->n_mats; i++) {
        const mx_qmat *m = src->mats[i];
        size_t bytes = m->w ? mx_qmat_repack_bytes(m) : 0;
        if (bytes)
            p->mats[p->n++] = (wc_mat){.src = (uint32_t)i, .bytes = bytes};
    }
    /* the header's size does not depend on the offsets: write it once to
     * learn it, then lay the payloads out after it */
    wbuf b = {0};
    header_write(src, p, &b);
    free(b.p);
    if (b.oom)
        return mx_fail(e, MX_ENOMEM, "out of memory planning the weight cache");
    uint64_t at = p->header_bytes = round_up(b.len, WC_PAGE);
    for (size_t i = 0; i < p->n; i++) {
        p->mats[i].off = at;
        at = round_up(at + p->mats[i].bytes, WC_PAGE);
        p->payload_bytes += p->mats[i].bytes;
    }
    p->file_bytes = at;
    return MX_OK;
}

static uint64_t spot_hash(const unsigned char *d, uint64_t n, uint32_t index)
{
    uint64_t k = n < WC_SPOT ? n : WC_SPOT;
    return XXH3_64bits_withSeed(d + n - k, k, XXH3_64bits_withSeed(d, k, index));
}

/* The same hash of a payload in file fd, read with pread: touching it
 * through the mapping would map the pages around each end into the process
 * (fault-around), 1.7 GB of RSS for a 7.5 GB cache of 4500 matrices. */
static int spot_hash_fd(int fd, uint64_t off, uint64_t n, uint32_t index, uint64_t *out)
{
    unsigned char head[WC_SPOT], tail[WC_SPOT];
    const uint64_t k = n < WC_SPOT ? n : WC_SPOT;
    if (pread(fd, head, k, (off_t)off) != (ssize_t)k ||
        pread(fd, tail, k, (off_t)(off + n - k)) != (ssize_t)k)
        return -1;
    *out = XXH3_64bits_withSeed(tail, k, XXH3_64bits_withSeed(head, k, index));
    return 0;
}

/* Checks a mapped file of `len` bytes against plan p: 0 when it matches,
 * else 1 with the reason in info. */
static int header_check(const mx_wcache_src *src, const wc_plan *p, const unsigned char *base,
                        uint64_t len, int fd, mx_wcache_info *info)
{
#define STALE(...) return set_reason(info, MX_WCACHE_ABSENT, __VA_ARGS__), 1
    if (len < WC_FIXED || memcmp(base, WC_MAGIC, 8))
        STALE("not a weight cache file (%llu bytes)", (unsigned long long)len);
    rbuf r = {.p = base, .len = len};
    take(&r, 8);
    uint32_t layout = get_u32(&r), repack = get_u32(&r);
    if (layout != MX_WCACHE_LAYOUT || repack != MX_REPACK_VERSION)
        STALE("layout %u / repack version %u, this build writes %u / %u", layout, repack, MX_WCACHE_LAYOUT, (unsigned)MX_REPACK_VERSION);
    uint64_t hbytes = get_u64(&r), fbytes = get_u64(&r), sum = get_u64(&r), hlen = get_u64(&r);
    if (fbytes != len)
        STALE("%llu bytes, its header says %llu (truncated or grown)", (unsigned long long)len, (unsigned long long)fbytes);
    if (hlen < WC_FIXED || hlen > hbytes || hbytes > len)
        STALE("damaged header (length %llu)", (unsigned long long)hlen);
    {
        XXH3_state_t st;
        XXH3_64bits_reset(&st);
        const uint64_t zero = 0;
        XXH3_64bits_update(&st, base, 32);
        XXH3_64bits_update(&st, &zero, 8);
        XXH3_64bits_update(&st, base + 40, hlen - 40);
        if (XXH3_64bits_digest(&st) != sum)
            STALE("header checksum mismatch (damaged)");
    }
    r.len = hlen;
    uint32_t nf = get_u32(&r), nm = get_u32(&r);
    get_u64(&r);
    if (!get_str_eq(&r, p->canon))
        STALE("made for another checkpoint (same name hash)");
    if (nf != src->n_files)
        STALE("the checkpoint has %zu weight files, the cache was made from %u", src->n_files, nf);
    for (size_t i = 0; i < src->n_files; i++) {
        const char *f = src->files[i];
        if (!get_str_eq(&r, base_name(f)))
            STALE("checkpoint file %s is not the one the cache was made from", f);
        uint64_t size = get_u64(&r), mt = get_u64(&r), ino = get_u64(&r), dev = get_u64(&r);
        const file_id *id = &p->ids[i];
        if (size != id->size || mt != id->mtime_ns || ino != id->ino || dev != id->dev)
            STALE("checkpoint file %s changed (%s) since the cache was made", f,
                  size != id->size ? "size" : mt != id->mtime_ns ? "modification time" : "inode");
    }
    if (nm != p->n || hbytes != p->header_bytes || fbytes != p->file_bytes)
        STALE("holds %u matrices, the model has %zu to repack", nm, p->n);
    for (size_t i = 0; i < p->n; i++) {
        const wc_mat *w = &p->mats[i];
        const mx_qmat *m = src->mats[w->src];
        uint32_t s = get_u32(&r), bits = get_u32(&r), gs = get_u32(&r), dt = get_u32(&r);
        uint64_t rows = get_u64(&r), cols = get_u64(&r), off = get_u64(&r), bytes = get_u64(&r),
                 spot = get_u64(&r);
        if (r.bad)
            STALE("damaged header (matrix table)");
        if (s != w->src || bits != (uint32_t)m->bits || gs != (uint32_t)m->group_size ||
            dt != (uint32_t)m->sdtype || rows != (uint64_t)m->rows || cols != (uint64_t)m->cols ||
            off != w->off || bytes != w->bytes)
            STALE("matrix %zu is [%llu, %llu] %u-bit g%u in the cache, [%lld, %lld] %d-bit g%d in "
                  "the model", i, (unsigned long long)rows, (unsigned long long)cols, bits,
                  gs, (long long)m->rows, (long long)m->cols, m->bits, m->group_size);
        uint64_t h;
        if (spot_hash_fd(fd, off, bytes, (uint32_t)i, &h) != 0 || h != spot)
            STALE("the data of matrix %zu is damaged", i);
    }
    return 0;
#undef STALE
}

/* ---- the cache object -------------------------------------------------- */

struct mx_wcache {
    mx_wcache_info info;
    void *map;                 /* the file's read-only mapping, or the mem mode's memory */
    size_t map_len;
};

const mx_wcache_info *mx_wcache_get_info(const mx_wcache *c) { return &c->info; }

const char *mx_wcache_state_name(mx_wcache_state s)
{
    static const char *const names[] = {"off", "used", "built", "mem", "failed", "valid", "absent"};
    return (unsigned)s < sizeof names / sizeof names[0] ? names[s] : "?";
}

void mx_wcache_free(mx_wcache *c)
{
    if (!c)
        return;
    if (c->map)
        munmap(c->map, c->map_len);
    free(c);
}

/* The cache file's path for the plan into info->path, and its folder into
 * dir; MX_EIO with the reason when none. */
static int cache_path(const wc_plan *p, char *dir, size_t cap, mx_wcache_info *info)
{
    mx_err e = {0};
    if (mx_wcache_dir(dir, cap, &e)) {
        set_reason(info, MX_WCACHE_FAILED, "%s", e.msg);
        return MX_EIO;
    }
    /* a readable name: the checkpoint folder's, in safe characters */
    char name[65];
    const char *b = base_name(p->canon);
    size_t n = 0;
    for (; b[n] && n < sizeof name - 1; n++)
        name[n] = (isalnum_ascii(b[n]) || b[n] == '-' || b[n] == '_' || b[n] == '.') ? b[n] : '_';
    name[n] = 0;
    int k = snprintf(info->path, sizeof info->path, "%s/%s-%016llx.mlxw", dir, n ? name : "model",
                     (unsigned long long)XXH3_64bits(p->canon, strlen(p->canon)));
    if (k < 0 || (size_t)k >= sizeof info->path) {
        set_reason(info, MX_WCACHE_FAILED, "the cache folder's name is too long");
        return MX_EIO;
    }
    return MX_OK;
}

/* ---- dropping the checkpoint pages the cache replaces ------------------ */

typedef struct span {
    uintptr_t lo, hi;
} span;

static int span_cmp(const void *a, const void *b)
{
    const span *x = a, *y = b;
    return x->lo < y->lo ? -1 : x->lo > y->lo;
}

static size_t page_size(void)
{
    long p = sysconf(_SC_PAGESIZE);
    return p > 0 ? (size_t)p : WC_PAGE;
}

/* madvise(DONTNEED) the whole pages inside [lo, hi): they are file-backed
 * (the checkpoint's read-only mapping, or the cache file's shared one), so
 * they stay valid and come back from the page cache if read again. */
static void drop_span(uintptr_t lo, uintptr_t hi)
{
    const uintptr_t ps = page_size();
    lo = (lo + ps - 1) / ps * ps;
    hi = hi / ps * ps;
    if (hi > lo)
        madvise((void *)lo, hi - lo, MADV_DONTNEED);
}

static void qmat_spans(const mx_qmat *m, span out[3])
{
    const uintptr_t w = (uintptr_t)m->w, s = (uintptr_t)m->scales, b = (uintptr_t)m->biases;
    const size_t wb = (size_t)(m->rows * mx_qmat_row_bytes(m));
    const size_t sb = (size_t)(m->rows * mx_qmat_groups(m)) * mx_dtype_size(m->sdtype);
    out[0] = (span){w, w + wb};
    out[1] = (span){s, s + sb};
    out[2] = (span){b, b + sb};
}

/* Drops the checkpoint pages of every matrix of the plan, the ranges
 * merged first so pages that straddle two neighbouring matrices (experts
 * of one stack) go too. */
static void drop_sources(const mx_wcache_src *src, const wc_plan *p)
{
    span *s = malloc(sizeof *s * 3 * (p->n ? p->n : 1));
    if (!s)
        return;   /* only memory use is at stake */
    size_t n = 0;
    for (size_t i = 0; i < p->n; i++) {
        qmat_spans(src->mats[p->mats[i].src], s + n);
        n += 3;
    }
    qsort(s, n, sizeof *s, span_cmp);
    for (size_t i = 0; i < n;) {
        span cur = s[i++];
        while (i < n && s[i].lo <= cur.hi)
            cur.hi = s[i].hi > cur.hi ? s[i].hi : cur.hi, i++;
        drop_span(cur.lo, cur.hi);
    }
    free(s);
}

/* ---- repacking --------------------------------------------------------- */

/* Progress on stderr: on a terminal a line redrawn with percent, MiB/s and
 * ETA; otherwise only the lines at the start and the end. */
typedef struct progress {
    int tty;
    uint64_t total;
    atomic_ullong done;
    double t0, last;
} progress;

static void progress_start(progress *g, const wc_plan *p, const char *what)
{
    g->tty = isatty(STDERR_FILENO) && p->payload_bytes >= WC_QUIET_BYTES;
    g->total = p->payload_bytes;
    atomic_init(&g->done, 0);
    g->t0 = g->last = mx_now();
    if (p->payload_bytes >= WC_QUIET_BYTES)
        fprintf(stderr, "mlxcel: weight cache: repacking %zu matrices (%.0f MiB) into %s\n", p->n,
            (double)p->payload_bytes / 1048576.0, what);
}

/* Counts `bytes` done; the caller's thread redraws the line when `show`. */
static void progress_add(progress *g, uint64_t bytes, int show)
{
    const uint64_t d = atomic_fetch_add(&g->done, bytes) + bytes;
    const double now = mx_now(), mib = 1.0 / 1048576.0;
    if (!g->tty || !show || now - g->last < 0.25)
        return;
    g->last = now;
    const double rate = (double)d / (now - g->t0), left = (double)(g->total - d);
    fprintf(stderr, "\rmlxcel: weight cache: %3.0f%%  %.0f / %.0f MiB  %.0f MiB/s  ETA %.0f s   ",
            100.0 * (double)d / (double)g->total, (double)d * mib, (double)g->total * mib, rate * mib,
            rate > 0 ? left / rate : 0.0);
}

static void progress_end(const progress *g)
{
    if (g->tty)
        fprintf(stderr, "\r%78s\r", "");
}

/* Repacks matrix i of the plan into dst, sets its spot hash and drops the
 * checkpoint pages it was read from (they are not needed any more). */
static void repack_one(const mx_wcache_src *src, wc_plan *p, size_t i, unsigned char *dst)
{
    wc_mat *w = &p->mats[i];
    const mx_qmat *m = src->mats[w->src];
    mx_qmat_repack(m, dst);
    w->spot = spot_hash(dst, w->bytes, (uint32_t)i);
    span s[3];
    qmat_spans(m, s);
    for (int k = 0; k < 3; k++)
        drop_span(s[k].lo, s[k].hi);
}

/* The mem mode: every matrix of the plan into base + its offset, on all
 * threads. */
static void repack_all(const mx_wcache_src *src, wc_plan *p, unsigned char *base)
{
    progress g;
    progress_start(&g, p, "memory");
    const long n = (long)p->n;
#pragma omp parallel for schedule(dynamic, 1) num_threads(mx_threads())
    for (long i = 0; i < n; i++) {
        repack_one(src, p, (size_t)i, base + p->mats[i].off);
        progress_add(&g, p->mats[i].bytes, omp_get_thread_num() == 0);
    }
    progress_end(&g);
}

/* Bytes the payload is written in, a multiple of 2 MiB at 2 MiB-aligned
 * file offsets: written so (not through a shared mapping, whose faults
 * fill the page cache 4 KiB at a time), the page cache holds the file in
 * 2 MiB folios that a later run maps with one PMD each: on Linux 6.18 /
 * ext4, touching 1000 MiB of a mapped file took 0.007 s in 2 MiB folios
 * and 0.23 s in 4 KiB pages (docs/cache.md). */
#define WC_WINDOW (64u << 20)

/* The window: WC_WINDOW, or MLXCEL_CACHE_WINDOW bytes (a multiple of 4 KiB;
 * tests use small ones so matrices cross windows; the file is the same). */
static uint64_t window_bytes(void)
{
    long v = mx_env_long("MLXCEL_CACHE_WINDOW", 0);
    return v > 0 ? round_up((uint64_t)v, WC_PAGE) : WC_WINDOW;
}

static int write_all(int fd, const unsigned char *buf, uint64_t len, uint64_t off)
{
    while (len) {
        ssize_t k = pwrite(fd, buf, len, (off_t)off);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            return k < 0 ? errno : EIO;
        buf += k, len -= (uint64_t)k, off += (uint64_t)k;
    }
    return 0;
}

/* Writes the payload of plan p into fd window by window: the matrices
 * inside a window are repacked in parallel into a staging buffer, one that
 * crosses a window's end is repacked once into a side buffer and copied
 * piece by piece, padding is zero.  0, or an errno value. */
static int write_payload(const mx_wcache_src *src, wc_plan *p, int fd, progress *g)
{
    const uint64_t win = window_bytes();
    unsigned char *stage = aligned_alloc(WC_PAGE, win), *side = NULL;
    size_t side_cap = 0, first = 0;
    long side_idx = -1;
    int err = stage ? 0 : ENOMEM;
    for (uint64_t w0 = 0; !err && w0 < p->file_bytes; w0 += win) {
        const uint64_t w1 = w0 + win < p->file_bytes ? w0 + win : p->file_bytes;
        size_t hi = first;
        while (hi < p->n && p->mats[hi].off < w1)
            hi++;
        const long lo = (long)first, nhi = (long)hi;
#pragma omp parallel for schedule(dynamic, 1) num_threads(mx_threads())
        for (long i = lo; i < nhi; i++) {
            const wc_mat *w = &p->mats[i];
            if (w->off >= w0 && w->off + w->bytes <= w1) {
                repack_one(src, p, (size_t)i, stage + (w->off - w0));
                progress_add(g, w->bytes, omp_get_thread_num() == 0);
            }
        }
        uint64_t cursor = w0;   /* bytes of the window before it are filled */
        for (size_t i = first; i < hi && !err; i++) {
            const wc_mat *w = &p->mats[i];
            const uint64_t a = w->off > w0 ? w->off : w0, b = w->off + w->bytes < w1 ? w->off + w->bytes : w1;
            memset(stage + (cursor - w0), 0, a - cursor);
            cursor = b;
            if (w->off >= w0 && w->off + w->bytes <= w1)
                continue;
            if (side_idx != (long)i) {   /* a matrix across the window's edge */
                if (w->bytes > side_cap) {
                    free(side);
                    side_cap = (size_t)round_up(w->bytes, 64);
                    if (!(side = aligned_alloc(64, side_cap))) {
                        err = ENOMEM;
                        break;
                    }
                }
                repack_one(src, p, i, side);
                side_idx = (long)i;
                progress_add(g, w->bytes, 1);
            }
            memcpy(stage + (a - w0), side + (a - w->off), b - a);
        }
        if (err)
            break;
        memset(stage + (cursor - w0), 0, w1 - cursor);
        while (first < p->n && p->mats[first].off + p->mats[first].bytes <= w1)
            first++;
        err = write_all(fd, stage, w1 - w0, w0);
    }
    free(stage);
    free(side);
    return err;
}

/* 0 when dir's file system has room for `bytes` and still keeps some free
 * (1 GiB, or a twentieth of a small file system: a cache must not be what
 * fills a disk), else -1 with the reason in info. */
static int room_for(const char *dir, uint64_t bytes, mx_wcache_info *info)
{
    struct statvfs v;
    if (statvfs(dir, &v) != 0)
        return 0;   /* unknown: posix_fallocate will say */
    const uint64_t avail = (uint64_t)v.f_bavail * v.f_frsize, size = (uint64_t)v.f_blocks * v.f_frsize;
    const uint64_t keep = size / 20 < (1ull << 30) ? size / 20 : (1ull << 30);
    if (avail >= bytes + keep)
        return 0;
    set_reason(info, MX_WCACHE_FAILED, "not enough room in %s for the cache file: it needs %.0f MiB and "
               "%.0f MiB are kept free, %.0f MiB are free", dir, (double)bytes / 1048576.0,
               (double)keep / 1048576.0, (double)avail / 1048576.0);
    return -1;
}

/* Writes the cache file for plan p to info->path through a temporary file
 * in the same folder, renamed into place once complete and on disk.  0, or
 * -1 with the reason in info. */
static int build(const mx_wcache_src *src, wc_plan *p, const char *dir, mx_wcache_info *info)
{
    if (room_for(dir, p->file_bytes, info))
        return -1;
    char tmp[sizeof info->path + 16];
    snprintf(tmp, sizeof tmp, "%s.tmp.XXXXXX", info->path);
    int fd = mkstemp(tmp);
    if (fd < 0)
        return set_reason(info, MX_WCACHE_FAILED, "cannot write in %s: %s", dir, strerror(errno)), -1;
    const double t0 = mx_now();
    const char *fail = NULL;
    int err = 0;
    /* the space first: a full disk is an error here, not a short write later */
    if ((err = posix_fallocate(fd, 0, (off_t)p->file_bytes)))
        fail = "no room for the cache file";
    wbuf b = {0};
    if (!fail) {
        progress g;
        progress_start(&g, p, info->path);
        err = write_payload(src, p, fd, &g);
        progress_end(&g);
        if (err)
            fail = "writing the cache file failed";
    }
    if (!fail) {
        header_write(src, p, &b);   /* last: now with the spot hashes */
        if (b.oom)
            fail = "out of memory writing the header", err = ENOMEM;
        else if ((err = write_all(fd, b.p, b.len, 0)))
            fail = "writing the cache file failed";
    }
    free(b.p);
    if (!fail && (fchmod(fd, 0644) != 0 || fdatasync(fd) != 0))
        fail = "writing the cache file failed", err = errno;
    if (close(fd) != 0 && !fail)
        fail = "writing the cache file failed", err = errno;
    if (!fail && rename(tmp, info->path) != 0)
        fail = "renaming the cache file into place failed", err = errno;
    if (fail) {
        unlink(tmp);
        return set_reason(info, MX_WCACHE_FAILED, "%s in %s (%.0f MiB): %s", fail, dir,
                          (double)p->file_bytes / 1048576.0, strerror(err)),
               -1;
    }
    int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {   /* the rename itself on disk */
        fsync(dfd);
        close(dfd);
    }
    const double s = mx_now() - t0;
    if (p->file_bytes >= WC_QUIET_BYTES)
        fprintf(stderr, "mlxcel: weight cache: built %s (%.0f MiB) in %.1f s (%.0f MiB/s)\n", info->path,
            (double)p->file_bytes / 1048576.0, s, (double)p->file_bytes / 1048576.0 / (s > 0 ? s : 1));
    return 0;
}

/* Temporary files of a build that died: safe to remove while holding the
 * lock (a live builder holds it). */
static void remove_stale_temps(const char *dir, const char *path)
{
    char prefix[PATH_MAX + 8];
    snprintf(prefix, sizeof prefix, "%s.tmp.", base_name(path));
    DIR *d = opendir(dir);
    if (!d)
        return;
    for (struct dirent *de; (de = readdir(d));)
        if (!strncmp(de->d_name, prefix, strlen(prefix)))
            unlinkat(dirfd(d), de->d_name, 0);
    closedir(d);
}

/* ---- opening ----------------------------------------------------------- */

/* Maps info->path read-only and checks it against p: 0 valid (*map,
 * *len), 1 no such file, 2 stale or unreadable (info->reason). */
static int open_valid(const mx_wcache_src *src, const wc_plan *p, mx_wcache_info *info, void **map,
                      size_t *len)
{
    int fd = open(info->path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        if (errno == ENOENT)
            return set_reason(info, MX_WCACHE_ABSENT, "no cache file"), 1;
        return set_reason(info, MX_WCACHE_ABSENT, "cannot open it: %s", strerror(errno)), 2;
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size < (off_t)WC_FIXED) {
        close(fd);
        return set_reason(info, MX_WCACHE_ABSENT, "%lld bytes: truncated", (long long)st.st_size), 2;
    }
    void *m = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED) {
        close(fd);
        return set_reason(info, MX_WCACHE_ABSENT, "mmap failed: %s", strerror(errno)), 2;
    }
    const int stale = header_check(src, p, m, (uint64_t)st.st_size, fd, info);
    close(fd);
    if (stale) {
        munmap(m, (size_t)st.st_size);
        return 2;
    }
    /* 2 MiB folios when the page cache is filled from disk (the kernels
     * where file THP needs it asked; on others readahead does it anyway) */
    madvise(m, (size_t)st.st_size, MADV_HUGEPAGE);
    *map = m;
    *len = (size_t)st.st_size;
    info->file_bytes = (uint64_t)st.st_size;
    return 0;
}

/* Points the matrices at their repacked forms in base (offsets of p). */
static void set_forms(const mx_wcache_src *src, const wc_plan *p, const unsigned char *base)
{
    for (size_t i = 0; i < p->n; i++)
        src->mats[p->mats[i].src]->rp = base + p->mats[i].off;
}

/* 1 when folder dir (which may not exist yet) would be inside canon: its
 * nearest existing ancestor, resolved, is canon or below it. */
static int dir_inside(const char *dir, const char *canon)
{
    char d[PATH_MAX], real[PATH_MAX];
    snprintf(d, sizeof d, "%s", dir);
    for (;;) {
        if (realpath(d, real)) {
            size_t n = strlen(canon);
            return !strncmp(real, canon, n) && (real[n] == 0 || real[n] == '/');
        }
        char *s = strrchr(d, '/');
        if (!s || s == d)
            return 0;
        *s = 0;
    }
}

/* The file modes (auto, rebuild). */
static void attach_file(mx_wcache *c, const mx_wcache_src *src, wc_plan *p, mx_repack_mode mode)
{
    mx_wcache_info *info = &c->info;
    char dir[PATH_MAX], stale[sizeof info->reason] = "";
    if (cache_path(p, dir, sizeof dir, info))
        return give_up(info);
    int r = 1;
    if (mode == MX_REPACK_AUTO && (r = open_valid(src, p, info, &c->map, &c->map_len)) == 0) {
        info->state = MX_WCACHE_USED;
        return;
    }
    if (r == 2)
        snprintf(stale, sizeof stale, "%s", info->reason);
    if (dir_inside(dir, p->canon)) {
        set_reason(info, MX_WCACHE_FAILED, "the cache folder %s is inside the checkpoint %s, which is "
                   "never written (set MLXCEL_CACHE_DIR)", dir, p->canon);
        return give_up(info);
    }
    if (make_dirs(dir) != 0) {
        set_reason(info, MX_WCACHE_FAILED, "cannot create the cache folder %s: %s", dir, strerror(errno));
        return give_up(info);
    }
    char lockp[sizeof info->path + 8];
    snprintf(lockp, sizeof lockp, "%s.lock", info->path);
    int lk = open(lockp, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (lk < 0) {
        set_reason(info, MX_WCACHE_FAILED, "cannot write in %s: %s", dir, strerror(errno));
        return give_up(info);
    }
    if (flock(lk, LOCK_EX | LOCK_NB) != 0) {
        fprintf(stderr, "mlxcel: weight cache: waiting for another process building %s\n", info->path);
        if (flock(lk, LOCK_EX) != 0) {
            set_reason(info, MX_WCACHE_FAILED, "cannot lock %s: %s", lockp, strerror(errno));
            close(lk);
            return give_up(info);
        }
        /* it may have built the file this process wants */
        if (mode == MX_REPACK_AUTO && (r = open_valid(src, p, info, &c->map, &c->map_len)) == 0) {
            info->state = MX_WCACHE_USED;
            close(lk);
            return;
        }
        if (r == 2)
            snprintf(stale, sizeof stale, "%s", info->reason);
    }
    if (stale[0]) {
        fprintf(stderr, "mlxcel: warning: weight cache %s is stale (%s): rebuilding it\n", info->path,
                stale);
        /* its space back before the new one takes as much (a process that
         * has it mapped keeps its copy until it unmaps it) */
        unlink(info->path);
    }
    remove_stale_temps(dir, info->path);
    if (build(src, p, dir, info) == 0) {
        r = open_valid(src, p, info, &c->map, &c->map_len);
        if (r == 0)
            info->state = MX_WCACHE_BUILT;
        else
            set_reason(info, MX_WCACHE_FAILED, "the cache file just built does not check: %.400s",
                       info->reason);
    }
    close(lk);   /* releases the lock */
    if (info->state != MX_WCACHE_BUILT)
        give_up(info);
}

/* The mem mode: the repacked forms in anonymous memory, made at every load. */
static void attach_mem(mx_wcache *c, const mx_wcache_src *src, wc_plan *p)
{
    void *m = mmap(NULL, p->file_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) {
        set_reason(&c->info, MX_WCACHE_FAILED, "no memory for %.0f MiB of repacked weights: %s",
                   (double)p->file_bytes / 1048576.0, strerror(errno));
        return give_up(&c->info);
    }
    madvise(m, p->file_bytes, MADV_HUGEPAGE);   /* 2 MiB pages: fewer TLB misses while streaming */
    repack_all(src, p, m);
    mprotect(m, p->file_bytes, PROT_READ);
    c->map = m;
    c->map_len = p->file_bytes;
    c->info.file_bytes = p->file_bytes;
    c->info.state = MX_WCACHE_MEM;
}

int mx_wcache_attach(const mx_wcache_src *src, mx_repack_mode mode, mx_wcache **out, mx_err *e)
{
    *out = NULL;
    mx_wcache *c = calloc(1, sizeof *c);
    if (!c)
        return mx_fail(e, MX_ENOMEM, "out of memory");
    c->info.mode = mode;
    c->info.state = MX_WCACHE_OFF;
    if (mode == MX_REPACK_OFF || src->n_mats == 0) {
        *out = c;
        return MX_OK;
    }
    const double t0 = mx_now();
    wc_plan p;
    int rc = plan_make(src, &p, &c->info, e);
    if (rc == MX_ENOMEM) {
        plan_free(&p);
        free(c);
        return rc;
    }
    if (rc) {
        give_up(&c->info);
    } else if (!p.n) {
        set_reason(&c->info, MX_WCACHE_OFF, "no matrix of this model has a repacked form");
    } else {
        if (mode == MX_REPACK_MEM)
            attach_mem(c, src, &p);
        else
            attach_file(c, src, &p, mode);
        if (c->map) {
            set_forms(src, &p, c->map);
            drop_sources(src, &p);
            c->info.n_mats = p.n;
        }
    }
    c->info.seconds = mx_now() - t0;
    plan_free(&p);
    *out = c;
    return MX_OK;
}

int mx_wcache_probe(const mx_wcache_src *src, mx_wcache_info *info, mx_err *e)
{
    memset(info, 0, sizeof *info);
    info->mode = mx_repack_mode_get();
    wc_plan p;
    int rc = plan_make(src, &p, info, e);
    if (rc == MX_ENOMEM) {
        plan_free(&p);
        return rc;
    }
    char dir[PATH_MAX];
    void *map = NULL;
    size_t len = 0;
    if (rc || cache_path(&p, dir, sizeof dir, info)) {
        info->state = MX_WCACHE_ABSENT;
    } else if (!p.n) {
        set_reason(info, MX_WCACHE_OFF, "no matrix of this model has a repacked form");
    } else if (open_valid(src, &p, info, &map, &len) == 0) {
        info->state = MX_WCACHE_VALID;
        info->n_mats = p.n;
        munmap(map, len);
    }
    plan_free(&p);
    return MX_OK;
}
