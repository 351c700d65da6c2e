/* safetensors.c - strict safetensors parsing and memory-mapped tensor sets.
 *
 * File layout: u64 little-endian header length N, N bytes of JSON, then the
 * data buffer.  The JSON maps tensor names to {dtype, shape, data_offsets}
 * (offsets relative to the start of the data buffer) plus an optional
 * "__metadata__" string map.  Everything in the header is untrusted: each
 * check below turns a malformed file into an error naming the file and the
 * tensor instead of an out-of-bounds read later in a kernel. */
#include "format/safetensors.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include "util/file.h"

/* ---- dtypes ------------------------------------------------------------ */

/* Dtypes the safetensors spec defines that we do not handle: reported as
 * unsupported rather than malformed. */
static const char *const dtype_other[] = {
    "F64", "I16", "U16", "U64", "F8_E4M3", "F8_E5M2", "F8_E8M0", "F6_E2M3",
    "F6_E3M2", "F4", "C64",
};


int64_t mx_tensor_numel(const mx_tensor *t)
{
    /* Shapes were validated on load (product fits in int64), so this cannot
     * overflow for tensors coming from a set. */
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++)
        n *= t->shape[i];
    return n;
}

/* ---- header parsing ---------------------------------------------------- */

/* A JSON number that is a non-negative integer exactly representable as a
 * double (cJSON keeps every number as a double, so 2^53 is the ceiling). */
static int json_uint(const cJSON *v, uint64_t *out)
{
    if (!cJSON_IsNumber(v))
        return -1;
    double d = v->valuedouble;
    if (!(d >= 0.0) || d > 9007199254740992.0 || d != floor(d))
        return -1;
    *out = (uint64_t)d;
    return 0;
}

static uint64_t read_le64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

/* Where each tensor's bytes lie, for the overlap check. */
typedef struct span {
    uint64_t begin, end;
    size_t idx;
} span;

static int span_cmp(const void *a, const void *b)
{
    const span *x = a, *y = b;
    if (x->begin != y->begin)
        return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end)
        return x->end < y->end ? -1 : 1;
    return 0;
}

static int name_ptr_cmp(const void *a, const void *b)
{
    const mx_tensor *const *x = a, *const *y = b;
    return strcmp((*x)->name, (*y)->name);
}

static int check_metadata(const cJSON *m, const char *file, mx_err *e)
{
    if (!cJSON_IsObject(m))
        return mx_fail(e, MX_EFORMAT, "%s: __metadata__ is not an object", file);
    for (const cJSON *kv = m->child; kv; kv = kv->next) {
        if (!cJSON_IsString(kv))
            return mx_fail(e, MX_EFORMAT, "%s: __metadata__ value '%s' is not a string",
                           file, kv->string ? kv->string : "?");
    }
    return MX_OK;
}

static int parse_dtype(const cJSON *v, const char *file, const char *tn, mx_dtype *t,
                       mx_err *e)
{
    if (!cJSON_IsString(v))
        return mx_fail(e, MX_EFORMAT, "%s: tensor '%s': dtype missing or not a string",
                       file, tn);
    if (mx_dtype_parse(v->valuestring, t) == 0)
        return MX_OK;
    for (size_t i = 0; i < sizeof dtype_other / sizeof dtype_other[0]; i++)
        if (strcmp(v->valuestring, dtype_other[i]) == 0)
            return mx_fail(e, MX_EUNSUPPORTED, "%s: tensor '%s': dtype %s is not supported",
                           file, tn, v->valuestring);
    return mx_fail(e, MX_EFORMAT, "%s: tensor '%s': unknown dtype '%.32s'", file, tn,
                   v->valuestring);
}

/* Shape: array of at most MX_MAX_DIMS non-negative integers whose product
 * (times the dtype size) fits; *nbytes gets that product in bytes. */
static int parse_shape(const cJSON *v, const char *file, const char *tn, mx_tensor *t,
                       uint64_t *nbytes, mx_err *e)
{
    if (!cJSON_IsArray(v))
        return mx_fail(e, MX_EFORMAT, "%s: tensor '%s': shape missing or not an array",
                       file, tn);
    int nd = cJSON_GetArraySize(v);
    if (nd > MX_MAX_DIMS)
        return mx_fail(e, MX_EFORMAT, "%s: tensor '%s': %d dimensions (at most %d)", file,
                       tn, nd, MX_MAX_DIMS);
    uint64_t numel = 1;
    int i = 0;
    for (const cJSON *d = v->child; d; d = d->next, i++) {
        uint64_t dim;
        if (json_uint(d, &dim) != 0)
            return mx_fail(e, MX_EFORMAT,
                           "%s: tensor '%s': shape[%d] is not a non-negative integer", file,
                           tn, i);
        t->shape[i] = (int64_t)dim;
        if (__builtin_mul_overflow(numel, dim, &numel) || numel > (uint64_t)INT64_MAX)
            return mx_fail(e, MX_EFORMAT, "%s: tensor '%s': element count overflows", file,
                           tn);
    }
    t->ndim = nd;
    if (__builtin_mul_overflow(numel, (uint64_t)mx_dtype_size(t->dtype), nbytes))
        return mx_fail(e, MX_EFORMAT, "%s: tensor '%s': byte size overflows", file, tn);
    return MX_OK;
}

static int parse_offsets(const cJSON *v, const char *file, const char *tn, uint64_t dlen,
                         span *sp, mx_err *e)
{
    if (!cJSON_IsArray(v) || cJSON_GetArraySize(v) != 2)
        return mx_fail(e, MX_EFORMAT,
                       "%s: tensor '%s': data_offsets missing or not a [begin, end] pair",
                       file, tn);
    if (json_uint(v->child, &sp->begin) != 0 || json_uint(v->child->next, &sp->end) != 0)
        return mx_fail(e, MX_EFORMAT,
                       "%s: tensor '%s': data_offsets are not non-negative integers", file,
                       tn);
    if (sp->begin > sp->end)
        return mx_fail(e, MX_EFORMAT, "%s: tensor '%s': data_offsets [%llu, %llu] begin > end",
                       file, tn, (unsigned long long)sp->begin,
                       (unsigned long long)sp->end);
    if (sp->end > dlen)
        return mx_fail(e, MX_EFORMAT,
                       "%s: tensor '%s': data_offsets [%llu, %llu] outside data (%llu bytes)",
                       file, tn, (unsigned long long)sp->begin,
                       (unsigned long long)sp->end, (unsigned long long)dlen);
    return MX_OK;
}

static int parse_tensor(const cJSON *item, const char *file, const uint8_t *data,
                        uint64_t data_off, uint64_t dlen, mx_tensor *t, span *sp, mx_err *e)
{
    const char *tn = item->string;
    if (!cJSON_IsObject(item))
        return mx_fail(e, MX_EFORMAT, "%s: tensor '%s': entry is not an object", file, tn);
    if (!*tn)
        return mx_fail(e, MX_EFORMAT, "%s: tensor with an empty name", file);
    int rc = parse_dtype(cJSON_GetObjectItemCaseSensitive(item, "dtype"), file, tn,
                         &t->dtype, e);
    uint64_t nbytes = 0;
    if (!rc)
        rc = parse_shape(cJSON_GetObjectItemCaseSensitive(item, "shape"), file, tn, t,
                         &nbytes, e);
    if (!rc)
        rc = parse_offsets(cJSON_GetObjectItemCaseSensitive(item, "data_offsets"), file,
                           tn, dlen, sp, e);
    if (rc)
        return rc;
    if (sp->end - sp->begin != nbytes)
        return mx_fail(e, MX_EFORMAT,
                       "%s: tensor '%s': %s shape needs %llu bytes but data_offsets "
                       "[%llu, %llu] hold %llu",
                       file, tn, mx_dtype_name(t->dtype), (unsigned long long)nbytes,
                       (unsigned long long)sp->begin, (unsigned long long)sp->end,
                       (unsigned long long)(sp->end - sp->begin));
    t->name = strdup(tn);
    if (!t->name)
        return mx_fail(e, MX_ENOMEM, "%s: out of memory", file);
    t->data = data ? data + sp->begin : NULL;
    t->nbytes = (size_t)nbytes;
    t->file = file;
    t->offset = data_off + sp->begin;
    return MX_OK;
}

/* Names must be unique: cJSON keeps duplicate keys, so sort and compare. */
static int check_unique(mx_tensor *ts, size_t n, const char *file, mx_err *e)
{
    if (n < 2)
        return MX_OK;
    const mx_tensor **p = malloc(n * sizeof *p);
    if (!p)
        return mx_fail(e, MX_ENOMEM, "%s: out of memory", file);
    for (size_t i = 0; i < n; i++)
        p[i] = &ts[i];
    qsort(p, n, sizeof *p, name_ptr_cmp);
    int rc = MX_OK;
    for (size_t i = 1; i < n && !rc; i++)
        if (strcmp(p[i - 1]->name, p[i]->name) == 0)
            rc = mx_fail(e, MX_EFORMAT, "%s: tensor '%s' appears twice in the header", file,
                         p[i]->name);
    free(p);
    return rc;
}

/* No two non-empty tensors may share bytes (a crafted file could otherwise
 * alias weights).  Holes between tensors are tolerated. */
static int check_overlap(span *sp, size_t n, const mx_tensor *ts, const char *file,
                         mx_err *e)
{
    qsort(sp, n, sizeof *sp, span_cmp);
    const span *prev = NULL;
    for (size_t i = 0; i < n; i++) {
        if (sp[i].begin == sp[i].end)
            continue;
        if (prev && sp[i].begin < prev->end)
            return mx_fail(e, MX_EFORMAT,
                           "%s: tensor '%s': data_offsets [%llu, %llu] overlap tensor '%s' "
                           "[%llu, %llu]",
                           file, ts[sp[i].idx].name, (unsigned long long)sp[i].begin,
                           (unsigned long long)sp[i].end, ts[prev->idx].name,
                           (unsigned long long)prev->begin, (unsigned long long)prev->end);
        prev = &sp[i];
    }
    return MX_OK;
}

/* Parses the JSON header text; rejects trailing bytes other than the spaces
 * writers pad with. */
static int parse_header_json(const uint8_t *hdr, size_t hlen, const char *file,
                             cJSON **out, mx_err *e)
{
    /* A NUL-terminated copy keeps cJSON inside our buffer whatever it does. */
    char *js = malloc(hlen + 1);
    if (!js)
        return mx_fail(e, MX_ENOMEM, "%s: out of memory for a %zu-byte header", file, hlen);
    memcpy(js, hdr, hlen);
    js[hlen] = 0;
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(js, hlen, &end, 0);
    if (!root) {
        size_t at = end && end >= js && end <= js + hlen ? (size_t)(end - js) : 0;
        free(js);
        return mx_fail(e, MX_EFORMAT, "%s: header is not valid JSON (near byte %zu of %zu)",
                       file, at, hlen);
    }
    for (const char *p = end; p < js + hlen; p++) {
        if (*p != ' ' && *p != '\t' && *p != '\n' && *p != '\r') {
            size_t at = (size_t)(p - js);
            free(js);
            cJSON_Delete(root);
            return mx_fail(e, MX_EFORMAT, "%s: header has trailing bytes after the JSON "
                                          "(at byte %zu of %zu)", file, at, hlen);
        }
    }
    free(js);
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return mx_fail(e, MX_EFORMAT, "%s: header JSON is not an object", file);
    }
    *out = root;
    return MX_OK;
}

void mx_st_free_tensors(mx_tensor *tensors, size_t n)
{
    if (!tensors)
        return;
    for (size_t i = 0; i < n; i++)
        free((char *)tensors[i].name);
    free(tensors);
}

/* Parses a file of file_len bytes whose first len bytes (at least the
 * length and the header) are in buf: the data pointers point into buf when
 * it holds the whole file, else they are NULL (offsets are always set). */
static int parse_image(const uint8_t *buf, size_t len, uint64_t file_len, const char *name,
                       mx_tensor **tensors, size_t *n, mx_err *e);

int mx_st_parse(const uint8_t *buf, size_t len, const char *name, mx_tensor **tensors,
                size_t *n, mx_err *e)
{
    return parse_image(buf, len, len, name, tensors, n, e);
}

static int parse_image(const uint8_t *buf, size_t len, uint64_t file_len, const char *name,
                       mx_tensor **tensors, size_t *n, mx_err *e)
{
    const char *file = name ? name : "<safetensors>";
    *tensors = NULL;
    *n = 0;
    if (file_len < 8 || len < 8)
        return mx_fail(e, MX_EFORMAT, "%s: %llu bytes is too short for a safetensors file",
                       file, (unsigned long long)file_len);
    uint64_t hlen = read_le64(buf);
    if (hlen > MX_ST_MAX_HEADER)
        return mx_fail(e, MX_EFORMAT, "%s: header length %llu exceeds the limit of %u bytes",
                       file, (unsigned long long)hlen, (unsigned)MX_ST_MAX_HEADER);
    if (hlen > file_len - 8 || hlen > len - 8)
        return mx_fail(e, MX_EFORMAT,
                       "%s: header length %llu runs past the end of the file (%llu bytes)",
                       file, (unsigned long long)hlen, (unsigned long long)file_len);
    cJSON *root = NULL;
    int rc = parse_header_json(buf + 8, (size_t)hlen, file, &root, e);
    if (rc)
        return rc;

    const uint8_t *data = len == file_len ? buf + 8 + hlen : NULL;
    uint64_t dlen = file_len - 8 - hlen;
    size_t cap = (size_t)cJSON_GetArraySize(root);
    mx_tensor *ts = calloc(cap ? cap : 1, sizeof *ts);
    span *sp = calloc(cap ? cap : 1, sizeof *sp);
    size_t nt = 0;
    int seen_meta = 0;
    if (!ts || !sp) {
        rc = mx_fail(e, MX_ENOMEM, "%s: out of memory", file);
        goto out;
    }
    for (const cJSON *it = root->child; it && !rc; it = it->next) {
        if (!it->string) {
            rc = mx_fail(e, MX_EFORMAT, "%s: header entry without a name", file);
        } else if (strcmp(it->string, "__metadata__") == 0) {
            rc = seen_meta++ ? mx_fail(e, MX_EFORMAT, "%s: __metadata__ appears twice", file)
                             : check_metadata(it, file, e);
        } else {
            rc = parse_tensor(it, file, data, 8 + hlen, dlen, &ts[nt], &sp[nt], e);
            sp[nt].idx = nt;
            if (ts[nt].name)
                nt++;
        }
    }
    if (!rc)
        rc = check_unique(ts, nt, file, e);
    if (!rc)
        rc = check_overlap(sp, nt, ts, file, e);
out:
    cJSON_Delete(root);
    free(sp);
    if (rc) {
        mx_st_free_tensors(ts, nt);
        return rc;
    }
    /* t->file must outlive this call only when the caller keeps `name`
     * alive (mx_st_open_file does); for pure parsing it is informational. */
    *tensors = ts;
    *n = nt;
    return MX_OK;
}

/* ---- tensor sets over mmap'ed files ------------------------------------ */

typedef struct st_file {
    char *path;
    void *map;               /* the whole file (NULL in a lazy set) */
    size_t len;
    int fd;                  /* a lazy set keeps it open for mx_st_map; else -1 */
} st_file;

/* A lazy set's mapping of part of a file. */
typedef struct st_map {
    void *addr;
    size_t len;
} st_map;

struct mx_st_set {
    st_file *files;
    size_t nfiles;
    mx_tensor *tensors;      /* all tensors, sorted by name */
    size_t n;
    uint32_t *slots;         /* open-addressing hash: index + 1, 0 = empty */
    size_t nslots;           /* power of two, >= 2n */
    uint64_t bytes;
    int lazy;                /* headers only: tensors are mapped by mx_st_map */
    uint64_t *win;           /* lazy: [n][2] each tensor's mapped byte range */
    st_map *maps;            /* lazy: every mapping made, for mx_st_close */
    size_t nmaps, cap_maps;
};

static uint64_t hash_name(const char *s)
{
    uint64_t h = 1469598103934665603ull;   /* FNV-1a */
    for (; *s; s++)
        h = (h ^ (uint8_t)*s) * 1099511628211ull;
    return h;
}

static int tensor_name_cmp(const void *a, const void *b)
{
    return strcmp(((const mx_tensor *)a)->name, ((const mx_tensor *)b)->name);
}

void mx_st_close(mx_st_set *s)
{
    if (!s)
        return;
    mx_st_free_tensors(s->tensors, s->n);
    for (size_t i = 0; i < s->nfiles; i++) {
        if (s->files[i].map)
            munmap(s->files[i].map, s->files[i].len);
        if (s->files[i].fd >= 0)
            close(s->files[i].fd);
        free(s->files[i].path);
    }
    for (size_t i = 0; i < s->nmaps; i++)
        munmap(s->maps[i].addr, s->maps[i].len);
    free(s->maps);
    free(s->win);
    free(s->files);
    free(s->slots);
    free(s);
}

/* The length and header of a lazy set's file, read without mapping it. */
static int read_header(int fd, const char *path, size_t len, uint8_t **out, size_t *n, mx_err *e)
{
    uint8_t head[8];
    if (pread(fd, head, 8, 0) != 8)
        return mx_fail(e, MX_EIO, "%s: cannot read the header length: %s", path, strerror(errno));
    uint64_t hlen = read_le64(head);
    if (hlen > MX_ST_MAX_HEADER)
        return mx_fail(e, MX_EFORMAT, "%s: header length %llu exceeds the limit of %u bytes",
                       path, (unsigned long long)hlen, (unsigned)MX_ST_MAX_HEADER);
    if (hlen > len - 8)
        return mx_fail(e, MX_EFORMAT,
                       "%s: header length %llu runs past the end of the file (%zu bytes)",
                       path, (unsigned long long)hlen, len);
    uint8_t *buf = malloc(8 + (size_t)hlen);
    if (!buf)
        return mx_fail(e, MX_ENOMEM, "%s: out of memory for a %llu-byte header", path,
                       (unsigned long long)hlen);
    size_t got = 0;
    while (got < 8 + hlen) {
        ssize_t r = pread(fd, buf + got, 8 + (size_t)hlen - got, (off_t)got);
        if (r <= 0) {
            free(buf);
            return mx_fail(e, MX_EIO, "%s: cannot read the header: %s", path,
                           r < 0 ? strerror(errno) : "file shorter than its header");
        }
        got += (size_t)r;
    }
    *out = buf;
    *n = 8 + (size_t)hlen;
    return MX_OK;
}

/* Maps one file and appends its tensors to s (names stay owned by s). */
static int set_add_file(mx_st_set *s, const char *path, mx_err *e)
{
    st_file *nf = realloc(s->files, (s->nfiles + 1) * sizeof *nf);
    if (!nf)
        return mx_fail(e, MX_ENOMEM, "%s: out of memory", path);
    s->files = nf;
    st_file *f = &s->files[s->nfiles];
    memset(f, 0, sizeof *f);
    f->fd = -1;
    f->path = strdup(path);
    if (!f->path)
        return mx_fail(e, MX_ENOMEM, "%s: out of memory", path);
    s->nfiles++;   /* from here mx_st_close releases f */

    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return mx_fail(e, MX_EIO, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return mx_fail(e, MX_EIO, "%s: not a regular file", path);
    }
    if ((uint64_t)st.st_size < 8) {
        close(fd);
        return mx_fail(e, MX_EFORMAT, "%s: %lld bytes is too short for a safetensors file",
                       path, (long long)st.st_size);
    }
    f->len = (size_t)st.st_size;
    mx_tensor *ts;
    size_t n;
    int rc;
    if (s->lazy) {
        /* the header alone; tensors are mapped as they are needed */
        f->fd = fd;
        uint8_t *hdr = NULL;
        size_t hn = 0;
        if ((rc = read_header(fd, f->path, f->len, &hdr, &hn, e)))
            return rc;
        rc = parse_image(hdr, hn, f->len, f->path, &ts, &n, e);
        free(hdr);
    } else {
        /* MAP_PRIVATE + PROT_READ: weights are never copied and never written. */
        void *m = mmap(NULL, f->len, PROT_READ, MAP_PRIVATE, fd, 0);
        close(fd);
        if (m == MAP_FAILED)
            return mx_fail(e, MX_EIO, "%s: mmap of the whole file (%zu bytes) failed: %s", path,
                           f->len, strerror(errno));
        f->map = m;
        rc = mx_st_parse(m, f->len, f->path, &ts, &n, e);
    }
    s->bytes += f->len;
    if (rc)
        return rc;
    mx_tensor *all = realloc(s->tensors, (s->n + n + 1) * sizeof *all);
    if (!all) {
        mx_st_free_tensors(ts, n);
        return mx_fail(e, MX_ENOMEM, "%s: out of memory", path);
    }
    memcpy(all + s->n, ts, n * sizeof *ts);
    free(ts);   /* names moved into s->tensors */
    s->tensors = all;
    s->n += n;
    return MX_OK;
}

/* Sorts the tensors by name, rejects names repeated across shards and builds
 * the lookup table. */
static int set_finish(mx_st_set *s, mx_err *e)
{
    if (s->n > UINT32_MAX / 4)
        return mx_fail(e, MX_EFORMAT, "%s: too many tensors (%zu)", s->files[0].path, s->n);
    if (s->n > 1)
        qsort(s->tensors, s->n, sizeof *s->tensors, tensor_name_cmp);
    for (size_t i = 1; i < s->n; i++)
        if (strcmp(s->tensors[i - 1].name, s->tensors[i].name) == 0)
            return mx_fail(e, MX_EFORMAT, "tensor '%s' is in both %s and %s",
                           s->tensors[i].name, s->tensors[i - 1].file, s->tensors[i].file);
    size_t ns = 16;
    while (ns < 2 * s->n)
        ns *= 2;
    s->slots = calloc(ns, sizeof *s->slots);
    if (s->lazy)
        s->win = calloc(2 * (s->n ? s->n : 1), sizeof *s->win);
    if (!s->slots || (s->lazy && !s->win))
        return mx_fail(e, MX_ENOMEM, "out of memory for %zu tensors", s->n);
    s->nslots = ns;
    for (size_t i = 0; i < s->n; i++) {
        size_t h = (size_t)hash_name(s->tensors[i].name) & (ns - 1);
        while (s->slots[h])
            h = (h + 1) & (ns - 1);
        s->slots[h] = (uint32_t)(i + 1);
    }
    return MX_OK;
}

int mx_st_open_file(const char *path, mx_st_set **out, mx_err *e)
{
    *out = NULL;
    mx_st_set *s = calloc(1, sizeof *s);
    if (!s)
        return mx_fail(e, MX_ENOMEM, "%s: out of memory", path);
    int rc = set_add_file(s, path, e);
    if (!rc)
        rc = set_finish(s, e);
    if (rc) {
        mx_st_close(s);
        return rc;
    }
    *out = s;
    return MX_OK;
}

static char *path_join(const char *dir, const char *name)
{
    size_t a = strlen(dir), b = strlen(name);
    char *p = malloc(a + b + 2);
    if (!p)
        return NULL;
    memcpy(p, dir, a);
    size_t k = a;
    if (a && dir[a - 1] != '/')
        p[k++] = '/';
    memcpy(p + k, name, b + 1);
    return p;
}

static int str_ptr_cmp(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Opens every shard the index names, then checks each mapped tensor is in
 * the shard the index says. */
static int open_indexed(mx_st_set *s, const char *dir, const char *index, mx_err *e)
{
    char *text;
    int rc = mx_read_file(index, &text, NULL, e);
    if (rc)
        return rc;
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithOpts(text, &end, 1);
    if (!root) {
        rc = mx_fail(e, MX_EFORMAT, "%s: invalid JSON near byte %zu", index,
                     end ? (size_t)(end - text) : 0);
        free(text);
        return rc;
    }
    free(text);
    const cJSON *wm = cJSON_GetObjectItemCaseSensitive(root, "weight_map");
    char **shards = NULL;
    size_t nsh = 0;
    if (!cJSON_IsObject(root) || !cJSON_IsObject(wm) || !wm->child) {
        rc = mx_fail(e, MX_EFORMAT, "%s: weight_map is missing, empty or not an object", index);
        goto out;
    }
    size_t nmap = (size_t)cJSON_GetArraySize(wm);
    shards = calloc(nmap, sizeof *shards);
    if (!shards) {
        rc = mx_fail(e, MX_ENOMEM, "%s: out of memory", index);
        goto out;
    }
    for (const cJSON *it = wm->child; it; it = it->next) {
        if (!cJSON_IsString(it) || !it->string) {
            rc = mx_fail(e, MX_EFORMAT, "%s: weight_map entry '%s' is not a string", index,
                         it->string ? it->string : "?");
            goto out;
        }
        const char *sh = it->valuestring;
        /* Shards are plain file names beside the index; anything else could
         * point outside the checkpoint. */
        if (!*sh || strchr(sh, '/') || strcmp(sh, ".") == 0 || strcmp(sh, "..") == 0) {
            rc = mx_fail(e, MX_EFORMAT, "%s: tensor '%s': shard name '%s' is not a file name",
                         index, it->string, sh);
            goto out;
        }
        shards[nsh++] = it->valuestring;
    }
    qsort(shards, nsh, sizeof *shards, str_ptr_cmp);
    size_t nd = 0;
    for (size_t i = 0; i < nsh; i++)
        if (nd == 0 || strcmp(shards[nd - 1], shards[i]) != 0)
            shards[nd++] = shards[i];
    for (size_t i = 0; i < nd && !rc; i++) {
        char *p = path_join(dir, shards[i]);
        if (!p) {
            rc = mx_fail(e, MX_ENOMEM, "%s: out of memory", index);
            break;
        }
        if (access(p, F_OK) != 0)
            rc = mx_fail(e, MX_EIO, "%s: shard '%s' named by the index is missing: %s", index,
                         shards[i], strerror(errno));
        else
            rc = set_add_file(s, p, e);
        free(p);
    }
    if (!rc)
        rc = set_finish(s, e);
    for (const cJSON *it = wm->child; it && !rc; it = it->next) {
        const mx_tensor *t = mx_st_find(s, it->string);
        const char *base = t ? strrchr(t->file, '/') : NULL;
        base = base ? base + 1 : (t ? t->file : NULL);
        if (!t)
            rc = mx_fail(e, MX_EFORMAT, "%s: tensor '%s' is not in its shard %s/%s", index,
                         it->string, dir, it->valuestring);
        else if (strcmp(base, it->valuestring) != 0)
            rc = mx_fail(e, MX_EFORMAT, "%s: tensor '%s' is mapped to %s but found in %s",
                         index, it->string, it->valuestring, t->file);
    }
out:
    free(shards);
    cJSON_Delete(root);
    return rc;
}

static int has_suffix(const char *s, const char *suf)
{
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && strcmp(s + a - b, suf) == 0;
}

/* No index: every *.safetensors except the reference outputs, sorted. */
static int open_glob(mx_st_set *s, const char *dir, mx_err *e)
{
    DIR *d = opendir(dir);
    if (!d)
        return mx_fail(e, MX_EIO, "%s: cannot open directory: %s", dir, strerror(errno));
    char **names = NULL;
    size_t n = 0, cap = 0;
    int rc = MX_OK;
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        if (de->d_name[0] == '.' || !has_suffix(de->d_name, ".safetensors") ||
            strcmp(de->d_name, "reference.safetensors") == 0)
            continue;
        if (n == cap) {
            cap = cap ? 2 * cap : 8;
            char **nn = realloc(names, cap * sizeof *nn);
            if (!nn) {
                rc = mx_fail(e, MX_ENOMEM, "%s: out of memory", dir);
                break;
            }
            names = nn;
        }
        if (!(names[n] = strdup(de->d_name))) {
            rc = mx_fail(e, MX_ENOMEM, "%s: out of memory", dir);
            break;
        }
        n++;
    }
    closedir(d);
    if (!rc && n == 0)
        rc = mx_fail(e, MX_EIO, "%s: no *.safetensors files and no "
                                "model.safetensors.index.json", dir);
    if (!rc)
        qsort(names, n, sizeof *names, str_ptr_cmp);
    for (size_t i = 0; i < n && !rc; i++) {
        char *p = path_join(dir, names[i]);
        rc = p ? set_add_file(s, p, e) : mx_fail(e, MX_ENOMEM, "%s: out of memory", dir);
        free(p);
    }
    if (!rc)
        rc = set_finish(s, e);
    for (size_t i = 0; i < n; i++)
        free(names[i]);
    free(names);
    return rc;
}

static int open_dir(const char *dir, int lazy, mx_st_set **out, mx_err *e);

int mx_st_open_dir(const char *dir, mx_st_set **out, mx_err *e) { return open_dir(dir, 0, out, e); }

int mx_st_open_dir_lazy(const char *dir, mx_st_set **out, mx_err *e)
{
    return open_dir(dir, 1, out, e);
}

static int open_dir(const char *dir, int lazy, mx_st_set **out, mx_err *e)
{
    *out = NULL;
    mx_st_set *s = calloc(1, sizeof *s);
    if (s)
        s->lazy = lazy;
    char *index = path_join(dir, "model.safetensors.index.json");
    if (!s || !index) {
        free(s);
        free(index);
        return mx_fail(e, MX_ENOMEM, "%s: out of memory", dir);
    }
    int rc = access(index, F_OK) == 0 ? open_indexed(s, dir, index, e)
                                      : open_glob(s, dir, e);
    free(index);
    if (rc) {
        mx_st_close(s);
        return rc;
    }
    *out = s;
    return MX_OK;
}

const mx_tensor *mx_st_find(const mx_st_set *s, const char *name)
{
    if (!s || !name || !s->nslots)
        return NULL;
    size_t h = (size_t)hash_name(name) & (s->nslots - 1);
    for (uint32_t v; (v = s->slots[h]) != 0; h = (h + 1) & (s->nslots - 1))
        if (strcmp(s->tensors[v - 1].name, name) == 0)
            return &s->tensors[v - 1];
    return NULL;
}

size_t mx_st_count(const mx_st_set *s) { return s ? s->n : 0; }

const mx_tensor *mx_st_at(const mx_st_set *s, size_t i)
{
    return s && i < s->n ? &s->tensors[i] : NULL;
}

uint64_t mx_st_file_bytes(const mx_st_set *s) { return s ? s->bytes : 0; }

size_t mx_st_nfiles(const mx_st_set *s) { return s ? s->nfiles : 0; }

const char *mx_st_file_path(const mx_st_set *s, size_t i)
{
    return s && i < s->nfiles ? s->files[i].path : NULL;
}

uint64_t mx_st_file_size(const mx_st_set *s, size_t i)
{
    return s && i < s->nfiles ? s->files[i].len : 0;
}

int mx_st_map(mx_st_set *s, const mx_tensor *t, uint64_t lo, uint64_t hi, mx_err *e)
{
    if (!s->lazy || lo >= hi)
        return MX_OK;
    const size_t i = (size_t)(t - s->tensors);
    if (t < s->tensors || i >= s->n || hi > t->nbytes)
        return mx_fail(e, MX_EINVAL, "%s: bytes [%llu, %llu) of tensor '%s' are not in this set",
                       t->file, (unsigned long long)lo, (unsigned long long)hi, t->name);
    uint64_t *w = &s->win[2 * i];
    if (w[1] > w[0] && w[0] <= lo && hi <= w[1])
        return MX_OK;   /* mapped already */
    if (w[1] > w[0]) {   /* a wider range: the union, the old mapping kept */
        lo = lo < w[0] ? lo : w[0];
        hi = hi > w[1] ? hi : w[1];
    }
    const st_file *f = NULL;
    for (size_t k = 0; k < s->nfiles && !f; k++)
        if (s->files[k].path == t->file)
            f = &s->files[k];
    if (!f || f->fd < 0)
        return mx_fail(e, MX_EINVAL, "tensor '%s': its file is not open", t->name);
    const uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE), start = t->offset + lo;
    const uint64_t at = start / page * page, len = t->offset + hi - at;
    if (s->nmaps == s->cap_maps) {
        size_t cap = s->cap_maps ? 2 * s->cap_maps : 64;
        st_map *nm = realloc(s->maps, cap * sizeof *nm);
        if (!nm)
            return mx_fail(e, MX_ENOMEM, "%s: out of memory", t->file);
        s->maps = nm;
        s->cap_maps = cap;
    }
    void *m = mmap(NULL, (size_t)len, PROT_READ, MAP_PRIVATE, f->fd, (off_t)at);
    if (m == MAP_FAILED)
        return mx_fail(e, MX_EIO, "%s: mmap of tensor '%s' (%llu bytes) failed: %s", t->file, t->name,
                       (unsigned long long)len, strerror(errno));
    s->maps[s->nmaps++] = (st_map){m, (size_t)len};
    /* data + lo is the first byte mapped: data itself may lie before the
     * mapping (an address, never read) */
    ((mx_tensor *)t)->data = (const void *)((uintptr_t)m + (uintptr_t)(start - at) - (uintptr_t)lo);
    w[0] = lo;
    w[1] = hi;
    return MX_OK;
}
