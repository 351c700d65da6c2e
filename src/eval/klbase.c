/* klbase.c - the base file of a perplexity run: the tokens it scored and,
 * per scored position, the NLL of the target and the distribution (full
 * f32 log-probs, or the top K with the mass of the rest).  Layout in
 * docs/quality.md; every field is little-endian whatever the host. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "eval/eval.h"
#include "util/half.h"

#define KLB_MAGIC "MXKLBASE"
#define KLB_VERSION 1u
#define KLB_HEADER 128

struct mx_klbase {
    FILE *f;
    char *path;
    int writing;
    mx_klbase_info info;
    long n_pos, done;            /* positions in the file, written/read so far */
    size_t rec_bytes;
    unsigned char *rec;          /* one encoded record */
    int32_t *tokens;             /* [n_chunks * ctx] */
    /* decoded record (reader) / top-k selection (writer) */
    float *lp;                   /* [vocab] (full) or [K] (top-k) */
    int32_t *ids;                /* [K] */
};

/* ---- little-endian encoding ---- */

static void put_u32(unsigned char *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}
static void put_u64(unsigned char *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}
static uint32_t get_u32(const unsigned char *p)
{
    uint32_t v = 0;
    for (int i = 0; i < 4; i++)
        v |= (uint32_t)p[i] << (8 * i);
    return v;
}
static uint64_t get_u64(const unsigned char *p)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v |= (uint64_t)p[i] << (8 * i);
    return v;
}
static void put_f64(unsigned char *p, double d)
{
    uint64_t u;
    memcpy(&u, &d, 8);
    put_u64(p, u);
}
static double get_f64(const unsigned char *p)
{
    uint64_t u = get_u64(p);
    double d;
    memcpy(&d, &u, 8);
    return d;
}

long mx_klbase_positions(const mx_klbase_info *info)
{
    return (long)info->n_chunks * (long)(info->ctx - 1 - info->first);
}

static size_t record_bytes(const mx_klbase_info *info)
{
    if (info->form == MX_KLBASE_FULL)
        return 8 + 4 * (size_t)info->vocab;
    return 16 + 8 * (size_t)info->top_k;
}

/* The fields a valid file (or a new one) must have; names the first bad one. */
static int check_info(const char *path, const mx_klbase_info *in, mx_err *e)
{
    if (in->form != MX_KLBASE_FULL && in->form != MX_KLBASE_TOPK)
        return mx_fail(e, MX_EFORMAT, "%s: unknown form %d (1 = full log-probs, 2 = top-k)", path, in->form);
    if (in->vocab < 2 || in->vocab > (1 << 24))
        return mx_fail(e, MX_EFORMAT, "%s: vocabulary size %d out of range", path, in->vocab);
    if (in->form == MX_KLBASE_FULL ? in->top_k != 0
                                   : in->top_k < 1 || in->top_k > MX_KLBASE_MAX_TOPK || in->top_k > in->vocab)
        return mx_fail(e, MX_EFORMAT, "%s: top-k %d does not fit the form and vocabulary %d (max %d)", path,
                       in->top_k, in->vocab, MX_KLBASE_MAX_TOPK);
    if (in->ctx < 4 || in->ctx > (1 << 24))
        return mx_fail(e, MX_EFORMAT, "%s: context %d out of range", path, in->ctx);
    if (in->first != in->ctx / 2)
        return mx_fail(e, MX_EFORMAT, "%s: scoring starts at %d, not ctx/2 = %d", path, in->first, in->ctx / 2);
    if (in->n_chunks < 1 || (int64_t)in->n_chunks * in->ctx > INT32_MAX)
        return mx_fail(e, MX_EFORMAT, "%s: chunk count %d out of range", path, in->n_chunks);
    return MX_OK;
}

static mx_klbase *alloc_file(const char *path, const mx_klbase_info *info, mx_err *e)
{
    mx_klbase *f = calloc(1, sizeof *f);
    if (!f) {
        mx_fail(e, MX_ENOMEM, "%s: out of memory", path);
        return NULL;
    }
    f->info = *info;
    f->n_pos = mx_klbase_positions(info);
    f->rec_bytes = record_bytes(info);
    f->path = strdup(path);
    f->rec = malloc(f->rec_bytes);
    f->tokens = malloc(sizeof(int32_t) * (size_t)info->n_chunks * (size_t)info->ctx);
    size_t nlp = info->form == MX_KLBASE_FULL ? (size_t)info->vocab : (size_t)info->top_k;
    f->lp = malloc(sizeof(float) * nlp);
    f->ids = malloc(sizeof(int32_t) * (size_t)(info->top_k > 0 ? info->top_k : 1));
    if (!f->path || !f->rec || !f->tokens || !f->lp || !f->ids) {
        mx_fail(e, MX_ENOMEM, "%s: out of memory for records of %zu bytes", path, f->rec_bytes);
        mx_klbase_close(f, NULL);
        return NULL;
    }
    return f;
}

static int write_all(mx_klbase *f, const void *p, size_t n, mx_err *e)
{
    if (fwrite(p, 1, n, f->f) != n)
        return mx_fail(e, MX_EIO, "%s: write failed: %s", f->path, strerror(errno));
    return MX_OK;
}

/* ---- writer ---- */

int mx_klbase_create(const char *path, const mx_klbase_info *info, const int32_t *tokens,
                     mx_klbase **out, mx_err *e)
{
    *out = NULL;
    int rc = check_info(path, info, e);
    if (rc)
        return rc;
    mx_klbase *f = alloc_file(path, info, e);
    if (!f)
        return e ? e->code : MX_ENOMEM;
    f->writing = 1;
    f->f = fopen(path, "wb");
    if (!f->f) {
        rc = mx_fail(e, MX_EIO, "%s: cannot create: %s", path, strerror(errno));
        mx_klbase_close(f, NULL);
        return rc;
    }
    unsigned char h[KLB_HEADER] = {0};
    memcpy(h, KLB_MAGIC, 8);
    put_u32(h + 8, KLB_VERSION);
    put_u32(h + 12, (uint32_t)info->form);
    put_u32(h + 16, (uint32_t)info->top_k);
    put_u32(h + 20, (uint32_t)info->vocab);
    put_u32(h + 24, (uint32_t)info->ctx);
    put_u32(h + 28, (uint32_t)info->n_chunks);
    put_u32(h + 32, (uint32_t)info->first);
    put_u64(h + 40, (uint64_t)f->n_pos);
    put_u64(h + 48, info->params);
    memcpy(h + 56, info->model_type, strnlen(info->model_type, sizeof info->model_type));
    long n_tok = (long)info->n_chunks * info->ctx;
    memcpy(f->tokens, tokens, sizeof(int32_t) * (size_t)n_tok);
    rc = write_all(f, h, sizeof h, e);
    for (long i = 0; i < n_tok && !rc; i++) {
        unsigned char b[4];
        put_u32(b, (uint32_t)tokens[i]);
        rc = write_all(f, b, 4, e);
    }
    if (rc) {
        mx_klbase_close(f, NULL);
        return rc;
    }
    *out = f;
    return MX_OK;
}

int mx_klbase_append(mx_klbase *f, const float *lp, double nll, mx_err *e)
{
    if (!f->writing || f->done >= f->n_pos)
        return mx_fail(e, MX_EINVAL, "%s: all %ld positions are already written", f->path, f->n_pos);
    unsigned char *p = f->rec;
    put_f64(p, nll);
    if (f->info.form == MX_KLBASE_FULL) {
        for (int i = 0; i < f->info.vocab; i++)
            put_u32(p + 8 + 4 * (size_t)i, mx_f32_bits(lp[i]));
    } else {
        int k = f->info.top_k;
        mx_top_k(lp, f->info.vocab, k, f->ids);
        put_f64(p + 8, mx_tail_mass(lp, f->info.vocab, f->ids, k));
        for (int j = 0; j < k; j++) {
            put_u32(p + 16 + 4 * (size_t)j, (uint32_t)f->ids[j]);
            put_u32(p + 16 + 4 * (size_t)k + 4 * (size_t)j, mx_f32_bits(lp[f->ids[j]]));
        }
    }
    int rc = write_all(f, f->rec, f->rec_bytes, e);
    if (!rc)
        f->done++;
    return rc;
}

/* ---- reader ---- */

static int read_all(mx_klbase *f, void *p, size_t n, mx_err *e)
{
    if (fread(p, 1, n, f->f) != n)
        return mx_fail(e, MX_EIO, "%s: read failed%s%s", f->path, ferror(f->f) ? ": " : " (file shorter than its header says)",
                       ferror(f->f) ? strerror(errno) : "");
    return MX_OK;
}

int mx_klbase_open(const char *path, mx_klbase **out, mx_err *e)
{
    *out = NULL;
    FILE *fp = fopen(path, "rb");
    if (!fp)
        return mx_fail(e, MX_EIO, "%s: cannot open: %s", path, strerror(errno));
    unsigned char h[KLB_HEADER];
    struct stat st;
    if (fstat(fileno(fp), &st) != 0 || fread(h, 1, sizeof h, fp) != sizeof h || memcmp(h, KLB_MAGIC, 8)) {
        fclose(fp);
        return mx_fail(e, MX_EFORMAT, "%s: not a base file of mlxcel perplexity (no '" KLB_MAGIC "' header)",
                       path);
    }
    uint32_t ver = get_u32(h + 8);
    if (ver != KLB_VERSION) {
        fclose(fp);
        return mx_fail(e, MX_EUNSUPPORTED, "%s: base file version %u, this build reads version %u", path,
                       ver, KLB_VERSION);
    }
    mx_klbase_info in = {0};
    uint32_t raw[6];
    for (int i = 0; i < 6; i++)
        raw[i] = get_u32(h + 12 + 4 * i);
    for (int i = 0; i < 6; i++)
        if (raw[i] > (1u << 30)) {
            fclose(fp);
            return mx_fail(e, MX_EFORMAT, "%s: header field at byte %d out of range (%u)", path, 12 + 4 * i, raw[i]);
        }
    in.form = (int)raw[0], in.top_k = (int)raw[1], in.vocab = (int)raw[2];
    in.ctx = (int)raw[3], in.n_chunks = (int)raw[4], in.first = (int)raw[5];
    in.params = get_u64(h + 48);
    memcpy(in.model_type, h + 56, sizeof in.model_type - 1);
    int rc = check_info(path, &in, e);
    if (rc) {
        fclose(fp);
        return rc;
    }
    uint64_t n_pos = get_u64(h + 40);
    if (n_pos != (uint64_t)mx_klbase_positions(&in)) {
        fclose(fp);
        return mx_fail(e, MX_EFORMAT, "%s: %llu positions, but %d chunks of %d tokens score %ld", path,
                       (unsigned long long)n_pos, in.n_chunks, in.ctx, mx_klbase_positions(&in));
    }
    /* every field is bounded above, so this cannot overflow 64 bits */
    uint64_t want = KLB_HEADER + 4ull * (uint64_t)in.n_chunks * (uint64_t)in.ctx + n_pos * record_bytes(&in);
    if ((uint64_t)st.st_size != want) {
        fclose(fp);
        return mx_fail(e, MX_EFORMAT, "%s: %lld bytes, but its header describes %llu (truncated or not one run)",
                       path, (long long)st.st_size, (unsigned long long)want);
    }
    mx_klbase *f = alloc_file(path, &in, e);
    if (!f) {
        fclose(fp);
        return e ? e->code : MX_ENOMEM;
    }
    f->f = fp;
    long n_tok = (long)in.n_chunks * in.ctx;
    for (long i = 0; i < n_tok && !rc; i++) {
        unsigned char b[4];
        rc = read_all(f, b, 4, e);
        f->tokens[i] = (int32_t)get_u32(b);
        if (!rc && (f->tokens[i] < 0 || f->tokens[i] >= in.vocab))
            rc = mx_fail(e, MX_EFORMAT, "%s: token %ld has id %d, outside the vocabulary of %d", path, i,
                         f->tokens[i], in.vocab);
    }
    if (rc) {
        mx_klbase_close(f, NULL);
        return rc;
    }
    *out = f;
    return MX_OK;
}

const mx_klbase_info *mx_klbase_get_info(const mx_klbase *f)
{
    return &f->info;
}

const int32_t *mx_klbase_tokens(const mx_klbase *f)
{
    return f->tokens;
}

int mx_klbase_check(const mx_klbase *f, int vocab, int ctx, int n_chunks, const int32_t *tokens,
                    mx_err *e)
{
    const mx_klbase_info *in = &f->info;
    if (in->vocab != vocab)
        return mx_fail(e, MX_EINVAL, "%s: made with a vocabulary of %d, this model has %d", f->path, in->vocab,
                       vocab);
    if (in->ctx != ctx)
        return mx_fail(e, MX_EINVAL, "%s: made with --ctx %d, this run uses --ctx %d", f->path, in->ctx, ctx);
    if (in->n_chunks != n_chunks)
        return mx_fail(e, MX_EINVAL, "%s: holds %d chunks, this run has %d (another text or --chunks)", f->path,
                       in->n_chunks, n_chunks);
    long n_tok = (long)n_chunks * ctx;
    for (long i = 0; i < n_tok; i++)
        if (f->tokens[i] != tokens[i])
            return mx_fail(e, MX_EINVAL,
                           "%s: token %ld differs (base id %d, this run id %d): another tokenizer or another text",
                           f->path, i, f->tokens[i], tokens[i]);
    return MX_OK;
}

int mx_klbase_read(mx_klbase *f, mx_klbase_rec *rec, mx_err *e)
{
    if (f->writing || f->done >= f->n_pos)
        return mx_fail(e, MX_EINVAL, "%s: all %ld positions are already read", f->path, f->n_pos);
    int rc = read_all(f, f->rec, f->rec_bytes, e);
    if (rc)
        return rc;
    const unsigned char *p = f->rec;
    memset(rec, 0, sizeof *rec);
    rec->nll = get_f64(p);
    if (f->info.form == MX_KLBASE_FULL) {
        for (int i = 0; i < f->info.vocab; i++)
            f->lp[i] = mx_bits_f32(get_u32(p + 8 + 4 * (size_t)i));
        rec->lp = f->lp;
        rec->top1 = mx_argmax(f->lp, f->info.vocab);
    } else {
        int k = f->info.top_k;
        rec->tail = get_f64(p + 8);
        for (int j = 0; j < k; j++) {
            f->ids[j] = (int32_t)get_u32(p + 16 + 4 * (size_t)j);
            f->lp[j] = mx_bits_f32(get_u32(p + 16 + 4 * (size_t)k + 4 * (size_t)j));
            if (f->ids[j] < 0 || f->ids[j] >= f->info.vocab)
                return mx_fail(e, MX_EFORMAT, "%s: position %ld lists id %d, outside the vocabulary", f->path,
                               f->done, f->ids[j]);
        }
        if (!(rec->tail >= 0 && rec->tail <= 1.5))
            return mx_fail(e, MX_EFORMAT, "%s: position %ld has a rest mass of %g", f->path, f->done, rec->tail);
        rec->ids = f->ids;
        rec->lp_top = f->lp;
        rec->top1 = f->ids[0];
    }
    f->done++;
    return MX_OK;
}

int mx_klbase_close(mx_klbase *f, mx_err *e)
{
    if (!f)
        return MX_OK;
    int rc = MX_OK;
    if (f->f) {
        int bad = f->writing && (ferror(f->f) || fflush(f->f) != 0);
        if (fclose(f->f) != 0 && f->writing)
            bad = 1;
        if (bad)
            rc = mx_fail(e, MX_EIO, "%s: write failed: %s", f->path, strerror(errno));
        else if (f->writing && f->done != f->n_pos)
            rc = mx_fail(e, MX_EINVAL, "%s: only %ld of %ld positions written", f->path, f->done, f->n_pos);
        /* an incomplete base file would only be refused later: remove it */
        if (rc && f->writing && f->path)
            remove(f->path);
    }
    free(f->path);
    free(f->rec);
    free(f->tokens);
    free(f->lp);
    free(f->ids);
    free(f);
    return rc;
}
