/* st_write.c - streaming safetensors writer.
 *
 * The header is computed up front from the declared tensors (offsets are
 * contiguous in declaration order), padded with spaces so the data starts on
 * an 8-byte boundary, and written first; the caller then streams each
 * tensor's bytes.  Output goes to a temporary file beside the target and is
 * renamed into place only after every declared byte was written, so a
 * failure never leaves a half-written checkpoint under the final name. */
#include "format/safetensors.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

struct mx_st_writer {
    char *path, *tmp;
    FILE *f;
    uint64_t total, written;
    int failed;
};

/* A growable string for the header. */
typedef struct sbuf {
    char *p;
    size_t n, cap;
    int oom;
} sbuf;

static void sb_put(sbuf *b, const char *s, size_t n)
{
    if (b->oom)
        return;
    if (b->n + n + 1 > b->cap) {
        size_t c = b->cap ? b->cap : 256;
        while (c < b->n + n + 1)
            c *= 2;
        char *q = realloc(b->p, c);
        if (!q) {
            b->oom = 1;
            return;
        }
        b->p = q;
        b->cap = c;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}

static void sb_str(sbuf *b, const char *s) { sb_put(b, s, strlen(s)); }

static void sb_u64(sbuf *b, uint64_t v)
{
    char t[24];
    int k = snprintf(t, sizeof t, "%llu", (unsigned long long)v);
    sb_put(b, t, (size_t)k);
}

/* JSON string literal; bytes >= 0x80 pass through (names are UTF-8). */
static void sb_json_str(sbuf *b, const char *s)
{
    sb_put(b, "\"", 1);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') {
            char t[2] = {'\\', (char)c};
            sb_put(b, t, 2);
        } else if (c < 0x20) {
            char t[8];
            snprintf(t, sizeof t, "\\u%04x", c);
            sb_put(b, t, 6);
        } else {
            sb_put(b, (const char *)&c, 1);
        }
    }
    sb_put(b, "\"", 1);
}

/* Validates one declaration and returns its size in bytes. */
static int decl_bytes(const mx_st_decl *d, const char *path, uint64_t *out, mx_err *e)
{
    if (!d->name || !*d->name)
        return mx_fail(e, MX_EINVAL, "%s: tensor declared without a name", path);
    if (strcmp(d->name, "__metadata__") == 0)
        return mx_fail(e, MX_EINVAL, "%s: '__metadata__' is not a valid tensor name", path);
    if ((unsigned)d->dtype >= MX_DTYPE_COUNT)
        return mx_fail(e, MX_EINVAL, "%s: tensor '%s': invalid dtype %d", path, d->name,
                       (int)d->dtype);
    if (d->ndim < 0 || d->ndim > MX_MAX_DIMS)
        return mx_fail(e, MX_EINVAL, "%s: tensor '%s': %d dimensions", path, d->name,
                       d->ndim);
    uint64_t n = mx_dtype_size(d->dtype);
    for (int i = 0; i < d->ndim; i++) {
        if (d->shape[i] < 0 || __builtin_mul_overflow(n, (uint64_t)d->shape[i], &n))
            return mx_fail(e, MX_EINVAL, "%s: tensor '%s': invalid shape", path, d->name);
    }
    *out = n;
    return MX_OK;
}

static int str_ptr_cmp(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static int check_unique_decls(const mx_st_decl *decls, size_t n, const char *path,
                              mx_err *e)
{
    if (n < 2)
        return MX_OK;
    const char **names = malloc(n * sizeof *names);
    if (!names)
        return mx_fail(e, MX_ENOMEM, "%s: out of memory", path);
    for (size_t i = 0; i < n; i++)
        names[i] = decls[i].name;
    qsort(names, n, sizeof *names, str_ptr_cmp);
    int rc = MX_OK;
    for (size_t i = 1; i < n && !rc; i++)
        if (strcmp(names[i - 1], names[i]) == 0)
            rc = mx_fail(e, MX_EINVAL, "%s: tensor '%s' declared twice", path, names[i]);
    free(names);
    return rc;
}

/* Builds the padded header: {"__metadata__":{...},"name":{dtype,shape,
 * data_offsets},...} followed by spaces up to a multiple of 8 bytes. */
static int build_header(const mx_st_decl *decls, size_t n, const char *path, sbuf *b,
                        uint64_t *total, mx_err *e)
{
    uint64_t off = 0;
    sb_str(b, "{\"__metadata__\":{\"format\":\"mlx\"}");
    for (size_t i = 0; i < n; i++) {
        const mx_st_decl *d = &decls[i];
        uint64_t nb = 0;
        int rc = decl_bytes(d, path, &nb, e);
        if (rc)
            return rc;
        if (__builtin_add_overflow(off, nb, &nb))
            return mx_fail(e, MX_EINVAL, "%s: total size overflows", path);
        sb_str(b, ",");
        sb_json_str(b, d->name);
        sb_str(b, ":{\"dtype\":\"");
        sb_str(b, mx_dtype_name(d->dtype));
        sb_str(b, "\",\"shape\":[");
        for (int k = 0; k < d->ndim; k++) {
            if (k)
                sb_str(b, ",");
            sb_u64(b, (uint64_t)d->shape[k]);
        }
        sb_str(b, "],\"data_offsets\":[");
        sb_u64(b, off);
        sb_str(b, ",");
        sb_u64(b, nb);
        sb_str(b, "]}");
        off = nb;
    }
    sb_str(b, "}");
    while (!b->oom && b->n % 8)
        sb_str(b, " ");
    if (b->oom)
        return mx_fail(e, MX_ENOMEM, "%s: out of memory for the header", path);
    if (b->n > MX_ST_MAX_HEADER)
        return mx_fail(e, MX_EINVAL, "%s: header of %zu bytes exceeds the limit", path, b->n);
    *total = off;
    return MX_OK;
}

static void writer_free(mx_st_writer *w)
{
    if (w->f)
        fclose(w->f);
    if (w->tmp)
        unlink(w->tmp);
    free(w->tmp);
    free(w->path);
    free(w);
}

int mx_st_writer_open(const char *path, const mx_st_decl *decls, size_t n,
                      mx_st_writer **out, mx_err *e)
{
    *out = NULL;
    int rc = check_unique_decls(decls, n, path, e);
    if (rc)
        return rc;
    sbuf hb = {0};
    uint64_t total = 0;
    rc = build_header(decls, n, path, &hb, &total, e);
    if (rc) {
        free(hb.p);
        return rc;
    }
    mx_st_writer *w = calloc(1, sizeof *w);
    size_t pl = strlen(path);
    if (w) {
        w->path = strdup(path);
        w->tmp = malloc(pl + 16);
    }
    if (!w || !w->path || !w->tmp) {
        free(hb.p);
        if (w) {
            free(w->path);
            free(w->tmp);
            free(w);
        }
        return mx_fail(e, MX_ENOMEM, "%s: out of memory", path);
    }
    snprintf(w->tmp, pl + 16, "%s.tmp.XXXXXX", path);
    int fd = mkstemp(w->tmp);
    if (fd < 0) {
        rc = mx_fail(e, MX_EIO, "%s: cannot create a temporary file: %s", path,
                     strerror(errno));
        free(w->tmp);
        w->tmp = NULL;   /* nothing to unlink */
        goto fail;
    }
    fchmod(fd, 0644);   /* mkstemp makes 0600; checkpoints are shared files */
    w->f = fdopen(fd, "wb");
    if (!w->f) {
        close(fd);
        rc = mx_fail(e, MX_EIO, "%s: fdopen failed: %s", path, strerror(errno));
        goto fail;
    }
    setvbuf(w->f, NULL, _IOFBF, 1 << 20);
    uint8_t len8[8];
    for (int i = 0; i < 8; i++)
        len8[i] = (uint8_t)((uint64_t)hb.n >> (8 * i));
    if (fwrite(len8, 1, 8, w->f) != 8 || fwrite(hb.p, 1, hb.n, w->f) != hb.n) {
        rc = mx_fail(e, MX_EIO, "%s: write failed: %s", path, strerror(errno));
        goto fail;
    }
    free(hb.p);
    w->total = total;
    *out = w;
    return MX_OK;
fail:
    free(hb.p);
    writer_free(w);
    return rc;
}

int mx_st_writer_write(mx_st_writer *w, const void *data, size_t nbytes, mx_err *e)
{
    if (!w)
        return mx_fail(e, MX_EINVAL, "safetensors writer: NULL writer");
    if (w->failed)
        return mx_fail(e, MX_EIO, "%s: writer already failed", w->path);
    if (nbytes > w->total - w->written) {
        w->failed = 1;
        return mx_fail(e, MX_EINVAL, "%s: %zu more bytes than the %llu declared", w->path,
                       nbytes - (size_t)(w->total - w->written),
                       (unsigned long long)w->total);
    }
    if (nbytes && fwrite(data, 1, nbytes, w->f) != nbytes) {
        w->failed = 1;
        return mx_fail(e, MX_EIO, "%s: write failed: %s", w->path, strerror(errno));
    }
    w->written += nbytes;
    return MX_OK;
}

int mx_st_writer_close(mx_st_writer *w, mx_err *e)
{
    if (!w)
        return MX_OK;
    int rc = MX_OK;
    if (w->failed)
        rc = mx_fail(e, MX_EIO, "%s: not written (an earlier write failed)", w->path);
    else if (w->written != w->total)
        rc = mx_fail(e, MX_EINVAL, "%s: only %llu of %llu declared data bytes were written",
                     w->path, (unsigned long long)w->written,
                     (unsigned long long)w->total);
    if (!rc) {
        FILE *f = w->f;
        w->f = NULL;
        int bad = fflush(f) != 0 || fsync(fileno(f)) != 0;
        bad |= fclose(f) != 0;
        if (bad)
            rc = mx_fail(e, MX_EIO, "%s: write failed: %s", w->path, strerror(errno));
        else if (rename(w->tmp, w->path) != 0)
            rc = mx_fail(e, MX_EIO, "%s: cannot rename %s into place: %s", w->path, w->tmp,
                         strerror(errno));
        else {
            free(w->tmp);
            w->tmp = NULL;   /* renamed: nothing to unlink */
        }
    }
    writer_free(w);
    return rc;
}
