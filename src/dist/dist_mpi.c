/* dist_mpi.c - expert parallelism over MPI (dist.h): the ranks, the load of
 * each rank's share, the exchange of every MoE block, the other ranks' loop.
 *
 * Messages.  Rank 0 sends commands (TAG_CMD), each a fixed header followed
 * by its body; a rank answers on TAG_REPLY with a reply header (a status
 * and a message) followed by its data:
 *   LOAD     the checkpoint's path, its fingerprint and the plan   -> status
 *   VERDICT  whether every rank loaded its share (and who did not)
 *   JOB      a MoE block: layer, path, the tokens this rank has work for,
 *            each with the experts it runs, and their x rows       -> the
 *            (token, expert) outputs, unweighted, in message order
 *   STATS, RESET, UNLOAD, END
 *
 * One MoE block on rank 0 (remote_run, called by every thread of the
 * forward pass's team; the barriers are the team's):
 *   first    owners of each token's experts; rank 0's own share as a
 *            sub-job; one message per rank with work; sends posted and
 *            completed, receives posted                            barrier
 *   all      rank 0's share through the path chosen (+ the extras)  barrier
 *   first    the other ranks' outputs received                      barrier
 *   all      out[t] = sum of token t's slots in job order, split by element
 * MPI is called from the team's first thread alone (MPI_THREAD_SERIALIZED: the
 * server runs passes on a thread of its own, one at a time).  Waiting polls,
 * then yields, then naps: ranks of one host share its cores, and a rank that
 * spins takes the core another one computes on. */
#include <mpi.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <fcntl.h>

#include "dist/dist.h"
#include "dist/dist_int.h"
#include "quant/quant.h"
#include "util/clock.h"
#include "util/file.h"
#include "util/parallel.h"
#include "util/scratch.h"
#include "util/sysinfo.h"

enum { TAG_CMD = 11, TAG_REPLY = 12 };
enum { CMD_LOAD = 1, CMD_VERDICT, CMD_JOB, CMD_STATS, CMD_RESET, CMD_UNLOAD, CMD_END };

#define HDR_BYTES 128     /* the command header, padded: the body starts aligned */
#define REPLY_BYTES 576   /* the reply header, padded */
#define DIR_MAX 4096

/* The head of every command. */
typedef struct cmd_hdr {
    int32_t cmd;
    int32_t layer, path, act;   /* JOB; END: layer is the exit code */
    int64_t T, P, d;            /* JOB: tokens, (token, expert) slots, width */
    int32_t precision, pad;
    char kernel[32];            /* the kernel variant rank 0 runs */
} cmd_hdr;
_Static_assert(sizeof(cmd_hdr) <= HDR_BYTES, "command header");

/* The head of every reply. */
typedef struct reply_hdr {
    int32_t rc, pad;
    char msg[512];
} reply_hdr;
_Static_assert(sizeof(reply_hdr) <= REPLY_BYTES, "reply header");

/* LOAD's body (the plan's owner table follows). */
typedef struct load_body {
    char dir[DIR_MAX];
    uint64_t fingerprint;
    int32_t n_layers, n_experts;
} load_body;

/* ---- the process ---------------------------------------------------------- */

static struct {
    int mpi;                  /* MPI started here */
    int rank, size;
    const char *expert_map;
    int finalized;
    mx_dist_stats st;
    struct remote *attached;  /* rank 0: the model spread over the ranks now */
} g = {.size = 1};

int mx_dist_rank(void) { return g.rank; }
int mx_dist_size(void) { return g.size; }
const char *mx_dist_expert_map(void) { return g.expert_map; }

/* Whether an MPI launcher started this process (Open MPI, PMIx, MPICH's
 * PMI): MPI is not started otherwise, so a plain run needs no MPI at all. */
static int launched_by_mpi(void)
{
    static const char *const vars[] = {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_SIZE", "PMI_RANK"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++)
        if (getenv(vars[i]))
            return 1;
    return 0;
}

static int dist_load(const char *dir, mx_model **out, mx_err *e);
static void finalize_at_exit(void) { mx_dist_finalize(0); }

int mx_dist_init(int *argc, char ***argv, mx_err *e)
{
    int rc = mx_dist_take_options(argc, *argv, &g.expert_map, e);
    if (rc || !launched_by_mpi())
        return rc;
    int provided = 0;
    if (MPI_Init_thread(argc, argv, MPI_THREAD_SERIALIZED, &provided) != MPI_SUCCESS)
        return mx_fail(e, MX_EIO, "MPI_Init_thread failed");
    g.mpi = 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &g.rank);
    MPI_Comm_size(MPI_COMM_WORLD, &g.size);
    if (provided < MPI_THREAD_SERIALIZED && g.size > 1) {
        /* the server calls MPI from a thread other than main's */
        MPI_Finalize();
        g.mpi = 0;
        return mx_fail(e, MX_EUNSUPPORTED, "this MPI library gives thread level %d; expert parallelism "
                                           "needs MPI_THREAD_SERIALIZED (%d)", provided,
                       MPI_THREAD_SERIALIZED);
    }
    if (g.size > 1 && g.rank == 0) {
        mx_model_set_loader(dist_load);
        atexit(finalize_at_exit);
    }
    return MX_OK;
}

/* ---- waiting without a core ------------------------------------------------------ */

/* One round of a wait loop: the first polls spin, then yield the core, then
 * nap, longer as the wait goes on (a rank idle between requests of a
 * server should cost nothing; one between layers answers within ~20 us). */
static void pause_round(long round)
{
    if (round < 64)
        return;
    if (round < 512) {
        sched_yield();
        return;
    }
    struct timespec ts = {0, round < 20000 ? 20000 : 500000};
    nanosleep(&ts, NULL);
}

static void wait_all(int n, MPI_Request *rq)
{
    int done = 0;
    for (long round = 0;; round++) {
        MPI_Testall(n, rq, &done, MPI_STATUSES_IGNORE);
        if (done)
            return;
        pause_round(round);
    }
}

/* Receives the next message of `tag` from `src` into *buf (grown to fit);
 * returns its size in bytes. */
static int recv_grow(int src, int tag, unsigned char **buf, size_t *cap, size_t *len)
{
    MPI_Status s;
    int flag = 0, n = 0;
    for (long round = 0; !flag; round++) {
        MPI_Iprobe(src, tag, MPI_COMM_WORLD, &flag, &s);
        if (!flag)
            pause_round(round);
    }
    MPI_Get_count(&s, MPI_BYTE, &n);
    if ((size_t)n > *cap) {
        unsigned char *nb = realloc(*buf, (size_t)n);
        if (!nb)
            return MX_ENOMEM;
        *buf = nb;
        *cap = (size_t)n;
    }
    MPI_Recv(*buf, n, MPI_BYTE, s.MPI_SOURCE, tag, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    *len = (size_t)n;
    return MX_OK;
}

static void send_to(int dst, int tag, const void *buf, size_t n)
{
    MPI_Request rq;
    MPI_Isend(buf, (int)n, MPI_BYTE, dst, tag, MPI_COMM_WORLD, &rq);
    wait_all(1, &rq);
    g.st.sent += n;
}

static void send_cmd(int dst, int cmd, int32_t arg)
{
    unsigned char b[HDR_BYTES] = {0};
    cmd_hdr *h = (cmd_hdr *)(void *)b;
    h->cmd = cmd;
    h->layer = arg;
    send_to(dst, TAG_CMD, b, sizeof b);
}

static void reply(int rc, const char *msg, const void *data, size_t n, unsigned char *buf)
{
    /* buf: REPLY_BYTES free bytes right before data (or anywhere when n = 0) */
    reply_hdr *h = (reply_hdr *)(void *)buf;
    memset(h, 0, sizeof *h);
    h->rc = rc;
    snprintf(h->msg, sizeof h->msg, "%s", msg ? msg : "");
    if (n && (const unsigned char *)data != buf + REPLY_BYTES)
        memmove(buf + REPLY_BYTES, data, n);
    send_to(0, TAG_REPLY, buf, REPLY_BYTES + n);
}

/* ---- the checkpoint's fingerprint ------------------------------------------- */

static uint64_t fnv(uint64_t h, const void *p, size_t n)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++)
        h = (h ^ b[i]) * 1099511628211ull;
    return h;
}

/* config.json, every tensor's name, type, shape and place, every file's
 * name and size, and a few kilobytes of each file's data: what tells two
 * copies of a checkpoint apart (different files with the same layout too)
 * without reading the weights. */
static int fingerprint(const mx_model *m, uint64_t *out, mx_err *e)
{
    uint64_t h = 1469598103934665603ull;
    char path[DIR_MAX + 32];
    snprintf(path, sizeof path, "%s/config.json", m->dir);
    char *text;
    size_t len;
    int rc = mx_read_file(path, &text, &len, e);
    if (rc)
        return rc;
    h = fnv(h, text, len);
    free(text);
    for (size_t i = 0; i < mx_st_count(m->st); i++) {
        const mx_tensor *t = mx_st_at(m->st, i);
        const char *base = strrchr(t->file, '/');
        base = base ? base + 1 : t->file;
        h = fnv(h, t->name, strlen(t->name) + 1);
        h = fnv(h, base, strlen(base) + 1);
        h = fnv(h, &t->dtype, sizeof t->dtype);
        h = fnv(h, t->shape, sizeof t->shape[0] * (size_t)t->ndim);
        h = fnv(h, &t->offset, sizeof t->offset);
    }
    for (size_t i = 0; i < mx_st_nfiles(m->st); i++) {
        const char *p = mx_st_file_path(m->st, i), *base = strrchr(p, '/');
        const uint64_t size = mx_st_file_size(m->st, i);
        base = base ? base + 1 : p;
        h = fnv(h, base, strlen(base) + 1);
        h = fnv(h, &size, sizeof size);
        int fd = open(p, O_RDONLY | O_CLOEXEC);
        if (fd < 0)
            return mx_fail(e, MX_EIO, "%s: cannot open", p);
        unsigned char buf[4096];
        const uint64_t at[2] = {size / 2, size > sizeof buf ? size - sizeof buf : 0};
        for (int k = 0; k < 2; k++) {
            ssize_t r = pread(fd, buf, sizeof buf, (off_t)at[k]);
            if (r > 0)
                h = fnv(h, buf, (size_t)r);
        }
        close(fd);
    }
    *out = h;
    return MX_OK;
}

/* ---- rank 0: loading and the exchange ------------------------------------------ */

typedef struct remote {
    mx_moe_remote iface;
    mx_model *m;
    mx_dist_plan plan;
    /* the block being run, written by the team's first thread */
    int rc;
    mx_err err;
    int n_work;                 /* ranks with work */
    int *work_rank;             /* [size] */
    mx_moe_job own;             /* rank 0's share (and the extras) */
    int64_t own_P;
    const float **src;          /* [slots] each slot's output, in job order */
    int64_t *tbase;             /* [T + 1] token t's slots in src */
    /* per rank [size]: its tokens and slots, a counter, its message and
     * reply (lengths, buffers, the message's k, expert and x arrays) */
    int64_t *Tw, *Pw, *cnt;
    size_t *msg_len, *reply_len;
    unsigned char **msg, **rbuf;
    int32_t **kw, **iw;
    float **xw;
    MPI_Request *rq;            /* [2 * size] */
    unsigned char *mark;        /* [n_experts] */
    mx_arena arena;
    double t0;
} remote;

/* The per-rank arrays of a remote; NULL when out of memory. */
static int remote_arrays(remote *r, int E)
{
    const size_t n = (size_t)g.size;
    r->work_rank = calloc(n, sizeof *r->work_rank);
    r->Tw = calloc(n, sizeof *r->Tw);
    r->Pw = calloc(n, sizeof *r->Pw);
    r->cnt = calloc(n, sizeof *r->cnt);
    r->msg_len = calloc(n, sizeof *r->msg_len);
    r->reply_len = calloc(n, sizeof *r->reply_len);
    r->msg = calloc(n, sizeof *r->msg);
    r->rbuf = calloc(n, sizeof *r->rbuf);
    r->kw = calloc(n, sizeof *r->kw);
    r->iw = calloc(n, sizeof *r->iw);
    r->xw = calloc(n, sizeof *r->xw);
    r->rq = calloc(2 * n, sizeof *r->rq);
    r->mark = calloc((size_t)(E > 0 ? E : 1), 1);
    return r->work_rank && r->Tw && r->Pw && r->cnt && r->msg_len && r->reply_len && r->msg && r->rbuf &&
                   r->kw && r->iw && r->xw && r->rq && r->mark
               ? MX_OK
               : MX_ENOMEM;
}

static void remote_free(remote *r)
{
    mx_dist_plan_free(&r->plan);
    mx_arena_free(&r->arena);
    free(r->work_rank), free(r->Tw), free(r->Pw), free(r->cnt), free(r->msg_len), free(r->reply_len);
    free(r->msg), free(r->rbuf), free(r->kw), free(r->iw), free(r->xw), free(r->rq), free(r->mark);
    if (g.attached == r)
        g.attached = NULL;
    free(r);
}

static int rank0_slice(void *ctx, const mx_model *m, unsigned char *owned, mx_err *e)
{
    remote *r = ctx;
    int rc = mx_dist_plan_make(m, g.size, g.expert_map, &r->plan, e);
    if (rc)
        return rc;
    const size_t cells = (size_t)m->n_layers * (size_t)m->n_experts;
    for (size_t i = 0; i < cells; i++)
        owned[i] = r->plan.owner[i] <= 0;
    return MX_OK;
}

static void remote_release(mx_moe_remote *iface)
{
    remote *r = (remote *)iface;
    for (int w = 1; w < g.size; w++)
        send_cmd(w, CMD_UNLOAD, 0);
    remote_free(r);
}

static int layer_of(const mx_model *m, const mx_experts *ex)
{
    for (int l = 0; l < m->n_layers; l++)
        if (&m->layers[l].moe.experts == ex)
            return l;
    return -1;
}

static void fill_kernel(cmd_hdr *h)
{
    snprintf(h->kernel, sizeof h->kernel, "%s", mx_qkernels_active()->name);
    h->precision = (int32_t)mx_precision_get();
}

/* The team's first thread's part before the experts run: who runs what,
 * rank 0's sub-job, the messages sent.  Returns MX_OK or fails into
 * r->err. */
static int exchange_out(remote *r, const mx_moe_job *job, mx_moe_path path)
{
    const mx_model *m = r->m;
    const int N = g.size, E = m->n_experts, l = layer_of(m, job->ex);
    const int64_t T = job->T, d = job->d_model;
    if (l < 0)
        return mx_fail(&r->err, MX_EINVAL, "expert parallelism: a job whose experts are not the model's");
    const int16_t *own = r->plan.owner + (size_t)l * E;
    const uint64_t eb = m->layers[l].moe.expert_bytes;
    int64_t *Tw = r->Tw, *Pw = r->Pw, *cnt = r->cnt, slots = 0;
    memset(Tw, 0, sizeof *Tw * (size_t)N);
    memset(Pw, 0, sizeof *Pw * (size_t)N);
    /* count: each rank's tokens (a token once per rank) and slots */
    for (int64_t t = 0; t < T; t++) {
        const mx_route *rt = &job->routes[t];
        for (int i = 0; i < rt->k; i++) {
            const int o = own[rt->idx[i]];
            Tw[o] += cnt[o]++ == 0;
            Pw[o]++;
        }
        for (int i = 0; i < rt->k; i++)
            cnt[own[rt->idx[i]]] = 0;
        slots += rt->k + job->n_extra;
    }
    r->own_P = Pw[0] + T * job->n_extra;
    /* sizes: rank 0's routes and slots, the slot table, each message */
    size_t need = mx_align64(sizeof(mx_route) * (size_t)T) +
                  mx_align64(sizeof(float) * (size_t)(r->own_P * d)) +
                  mx_align64(sizeof(float *) * (size_t)slots) + mx_align64(sizeof(int64_t) * (size_t)(T + 1));
    for (int w = 1; w < N; w++)
        if (Pw[w])
            need += mx_align64(HDR_BYTES + mx_align64(sizeof(int32_t) * (size_t)(Tw[w] + Pw[w])) +
                               sizeof(float) * (size_t)(Tw[w] * d)) +
                    mx_align64(REPLY_BYTES + sizeof(float) * (size_t)(Pw[w] * d));
    if (mx_arena_reserve(&r->arena, need))
        return mx_fail(&r->err, MX_ENOMEM, "expert parallelism: out of memory for %lld tokens", (long long)T);
    mx_route *or = mx_arena_take(&r->arena, sizeof(mx_route) * (size_t)T);
    float *oslots = mx_arena_take(&r->arena, sizeof(float) * (size_t)(r->own_P * d));
    r->src = mx_arena_take(&r->arena, sizeof(float *) * (size_t)slots);
    r->tbase = mx_arena_take(&r->arena, sizeof(int64_t) * (size_t)(T + 1));
    r->n_work = 0;
    for (int w = 1; w < N; w++) {
        if (!Pw[w])
            continue;
        const size_t ints = mx_align64(sizeof(int32_t) * (size_t)(Tw[w] + Pw[w]));
        r->msg_len[w] = HDR_BYTES + ints + sizeof(float) * (size_t)(Tw[w] * d);
        r->reply_len[w] = REPLY_BYTES + sizeof(float) * (size_t)(Pw[w] * d);
        r->msg[w] = mx_arena_take(&r->arena, r->msg_len[w]);
        r->rbuf[w] = mx_arena_take(&r->arena, r->reply_len[w]);
        cmd_hdr *h = (cmd_hdr *)(void *)r->msg[w];
        memset(h, 0, HDR_BYTES);
        *h = (cmd_hdr){.cmd = CMD_JOB, .layer = l, .path = path, .act = job->act, .T = Tw[w],
                       .P = Pw[w], .d = d};
        fill_kernel(h);
        r->kw[w] = (int32_t *)(void *)(r->msg[w] + HDR_BYTES);
        r->iw[w] = r->kw[w] + Tw[w];
        r->xw[w] = (float *)(void *)(r->msg[w] + HDR_BYTES + ints);
        Tw[w] = Pw[w] = 0;   /* now the fill positions */
        r->work_rank[r->n_work++] = w;
    }
    /* fill: each token's slots in the order rank 0 sums them, and where
     * each one's output will be */
    memset(r->mark, 0, (size_t)E);
    int64_t p0 = 0, s = 0;
    for (int64_t t = 0; t < T; t++) {
        const mx_route *rt = &job->routes[t];
        r->tbase[t] = s;
        or[t].k = 0;
        for (int i = 0; i < rt->k; i++) {
            const int x = rt->idx[i], o = own[x];
            if (o == 0) {
                or[t].idx[or[t].k] = x;
                or[t].w[or[t].k++] = rt->w[i];
                r->src[s + i] = oslots + (p0++) * d;
                if (!r->mark[x]++)
                    g.st.expert_bytes += eb;
                continue;
            }
            if (cnt[o]++ == 0) {   /* token t's first expert on rank o: its x row */
                memcpy(r->xw[o] + Tw[o] * d, job->x + t * d, sizeof(float) * (size_t)d);
                Tw[o]++;
            }
            r->kw[o][Tw[o] - 1] = (int32_t)cnt[o];
            r->iw[o][Pw[o]] = x;
            r->src[s + i] = (const float *)(const void *)(r->rbuf[o] + REPLY_BYTES) + Pw[o] * d;
            Pw[o]++;
        }
        for (int i = 0; i < rt->k; i++)
            cnt[own[rt->idx[i]]] = 0;
        for (int x = 0; x < job->n_extra; x++)
            r->src[s + rt->k + x] = oslots + (p0++) * d;
        s += rt->k + job->n_extra;
    }
    r->tbase[T] = s;
    r->own = (mx_moe_job){.ex = job->ex, .routes = or, .n_extra = job->n_extra, .act = job->act,
                          .x = job->x, .T = T, .d_model = d, .slots = oslots};
    for (int x = 0; x < job->n_extra; x++) {
        r->own.extra[x] = job->extra[x];
        r->own.extra_w[x] = job->extra_w[x];
    }
    /* receives posted, then the sends, completed before rank 0 computes so
     * the other ranks start at once */
    for (int i = 0; i < r->n_work; i++) {
        const int w = r->work_rank[i];
        MPI_Irecv(r->rbuf[w], (int)r->reply_len[w], MPI_BYTE, w, TAG_REPLY, MPI_COMM_WORLD, &r->rq[i]);
        MPI_Isend(r->msg[w], (int)r->msg_len[w], MPI_BYTE, w, TAG_CMD, MPI_COMM_WORLD,
                  &r->rq[r->n_work + i]);
        g.st.sent += r->msg_len[w];
        g.st.received += r->reply_len[w];
    }
    wait_all(r->n_work, r->rq + r->n_work);
    return MX_OK;
}

/* The team's first thread's part after: the other ranks' outputs. */
static int exchange_in(remote *r)
{
    wait_all(r->n_work, r->rq);
    for (int i = 0; i < r->n_work; i++) {
        const reply_hdr *h = (const reply_hdr *)(const void *)r->rbuf[r->work_rank[i]];
        if (h->rc)
            return mx_fail(&r->err, h->rc, "rank %d: %s", r->work_rank[i], h->msg);
    }
    return MX_OK;
}

/* out[t] = the sum of token t's slots in job order (routed experts as the
 * route ranks them, then the extras), each times its weight: the very
 * operations the paths do, so the very bits.  Elements split over the team. */
static void sum_slots(const remote *r, const mx_moe_job *job, int ith, int nth)
{
    const int64_t d = job->d_model;
    long lo, hi;
    mx_split((long)(job->T * d), ith, nth, &lo, &hi);
    for (int64_t t = lo / d; t * d < hi; t++) {
        const int64_t a = (lo > t * d ? lo : t * d) - t * d, b = (hi < (t + 1) * d ? hi : (t + 1) * d) - t * d;
        float *o = job->out + t * d;
        memset(o + a, 0, sizeof *o * (size_t)(b - a));
        const int k = job->routes[t].k;
        for (int64_t s = r->tbase[t]; s < r->tbase[t + 1]; s++) {
            const int j = (int)(s - r->tbase[t]);
            const float w = j < k ? job->routes[t].w[j]
                                  : job->extra_w[j - k] ? job->extra_w[j - k][t] : 1.0f;
            const float *y = r->src[s];
            for (int64_t i = a; i < b; i++)
                o[i] += w * y[i];
        }
    }
}

static int remote_run(mx_moe_remote *iface, const mx_moe_job *job, mx_moe_path path, mx_vec *x,
                      void *fused_buf, mx_team *team, int ith, mx_err *e)
{
    remote *r = (remote *)iface;
    mx_model *m = r->m;
    const int nth = atomic_load_explicit(&team->n, memory_order_relaxed);
    double t1 = 0;
    if (ith == 0) {   /* MPI from the team's first thread alone */
        r->t0 = mx_now();
        r->rc = exchange_out(r, job, path);
        t1 = mx_now();
        g.st.t_comm += t1 - r->t0;
        g.st.jobs++;
    }
    mx_team_sync(team);
    int rc = r->rc;
    if (!rc && r->own_P > 0) {
        if (path == MX_MOE_FUSED) {
            mx_moe_plan plan;
            mx_moe_plan_of(&plan, &r->own);
            mx_moe_fused_team(&plan, x, fused_buf, NULL, team, ith);
        } else {
            rc = mx_moe_gather_team(&r->own, m->gather, &m->moe_arena, team, ith, e);
        }
    }
    if (ith == 0) {
        const double t2 = mx_now();
        g.st.t_compute += t2 - t1;
        if (!r->rc && !rc)
            r->rc = exchange_in(r);
        g.st.t_comm += mx_now() - t2;
    }
    mx_team_sync(team);
    if (r->rc || rc) {
        if (r->rc && ith == 0)
            *e = r->err;
        return r->rc ? r->rc : rc;
    }
    sum_slots(r, job, ith, nth);
    mx_team_sync(team);
    return MX_OK;
}

static int slice_reply(int w, unsigned char **buf, size_t *cap, int *rc, char *msg, size_t cap_msg)
{
    size_t len;
    if (recv_grow(w, TAG_REPLY, buf, cap, &len) || len < sizeof(reply_hdr))
        return MX_ENOMEM;
    const reply_hdr *h = (const reply_hdr *)(void *)*buf;
    *rc = h->rc;
    size_t n = strnlen(h->msg, sizeof h->msg);
    n = n < cap_msg ? n : cap_msg - 1;
    memcpy(msg, h->msg, n);
    msg[n] = 0;
    return MX_OK;
}

/* The verdict on a load to every other rank: rc nonzero and why make each
 * one print why (so the job's every rank names the one at fault). */
static void verdict_to_all(int rc, const char *why)
{
    unsigned char c[HDR_BYTES + REPLY_BYTES] = {0};
    ((cmd_hdr *)(void *)c)->cmd = CMD_VERDICT;
    reply_hdr *vh = (reply_hdr *)(void *)(c + HDR_BYTES);
    vh->rc = rc;
    snprintf(vh->msg, sizeof vh->msg, "%s", why);
    for (int w = 1; w < g.size; w++)
        send_to(w, TAG_CMD, c, sizeof c);
}

/* Rank 0's mx_model_load: its own share, then every other rank's (the
 * same path, fingerprint and plan), and the verdict to all. */
static int dist_load(const char *dir, mx_model **out, mx_err *e)
{
    *out = NULL;
    if (g.attached)
        return mx_fail(e, MX_EINVAL, "%s: expert parallelism runs one model at a time (%s is loaded)",
                       dir, g.attached->m->dir);
    if (strlen(dir) >= DIR_MAX)
        return mx_fail(e, MX_EINVAL, "%s: path too long", dir);
    remote *r = calloc(1, sizeof *r);
    if (!r)
        return mx_fail(e, MX_ENOMEM, "out of memory");
    mx_model_load_opts o = {.slice = rank0_slice, .ctx = r, .lazy = 1};
    mx_model *m = NULL;
    uint64_t fp = 0;
    int rc = mx_model_load_ex(dir, &o, &m, e);
    if (!rc)
        rc = fingerprint(m, &fp, e);
    if (!rc && remote_arrays(r, m->n_experts))
        rc = mx_fail(e, MX_ENOMEM, "out of memory");
    if (rc) {
        mx_model_free(m);
        remote_free(r);
        mx_err_prefix(e, "rank 0 of %d could not load its share of the model", g.size);
        verdict_to_all(rc, e ? e->msg : "");
        return rc;
    }
    /* every other rank loads its share */
    const size_t cells = (size_t)m->n_layers * (size_t)m->n_experts;
    const size_t n = HDR_BYTES + sizeof(load_body) + sizeof(int16_t) * cells;
    unsigned char *msg = calloc(1, n);
    if (!msg) {
        mx_model_free(m);
        remote_free(r);
        return mx_fail(e, MX_ENOMEM, "out of memory");
    }
    cmd_hdr *h = (cmd_hdr *)(void *)msg;
    h->cmd = CMD_LOAD;
    fill_kernel(h);
    load_body *b = (load_body *)(void *)(msg + HDR_BYTES);
    snprintf(b->dir, sizeof b->dir, "%s", dir);
    b->fingerprint = fp;
    b->n_layers = m->n_layers;
    b->n_experts = m->n_experts;
    memcpy(msg + HDR_BYTES + sizeof(load_body), r->plan.owner, sizeof(int16_t) * cells);
    for (int w = 1; w < g.size; w++)
        send_to(w, TAG_CMD, msg, n);
    free(msg);
    /* their answers, and the verdict to all: the first failure, named */
    unsigned char *buf = NULL;
    size_t cap = 0;
    char why[512] = "", one[400];
    int bad = 0;
    for (int w = 1; w < g.size; w++) {
        int wrc = MX_OK;
        if (slice_reply(w, &buf, &cap, &wrc, one, sizeof one))
            wrc = MX_ENOMEM, snprintf(one, sizeof one, "out of memory for its answer");
        if (wrc && !bad) {
            bad = wrc;
            snprintf(why, sizeof why, "rank %d of %d could not load its share of the experts: %s", w,
                     g.size, one);
        }
    }
    free(buf);
    verdict_to_all(bad, why);
    r->iface = (mx_moe_remote){.run = remote_run, .release = remote_release};
    r->m = m;
    m->remote = &r->iface;
    g.attached = r;
    if (bad) {
        mx_model_free(m);   /* releases r: the ranks drop their shares */
        return mx_fail(e, bad, "%s", why);
    }
    *out = m;
    return MX_OK;
}

/* ---- the other ranks ----------------------------------------------------------- */

typedef struct worker {
    mx_model *m;
    const int16_t *owner;      /* the plan, while loading */
    int n_layers, n_experts;
    unsigned char *in, *out;   /* the command; the reply */
    size_t cap_in, cap_out;
    mx_arena arena;            /* the fused path's buffers */
} worker;

static int worker_slice(void *ctx, const mx_model *m, unsigned char *owned, mx_err *e)
{
    const worker *w = ctx;
    if (m->n_layers != w->n_layers || m->n_experts != w->n_experts)
        return mx_fail(e, MX_EFORMAT, "%s has %d layers of %d experts, rank 0's checkpoint %d of %d", m->dir,
                       m->n_layers, m->n_experts, w->n_layers, w->n_experts);
    const size_t cells = (size_t)m->n_layers * (size_t)m->n_experts;
    for (size_t i = 0; i < cells; i++)
        owned[i] = w->owner[i] == g.rank;
    return MX_OK;
}

/* The kernel variant and precision rank 0 runs, here too: the same bits. */
static int same_kernels(const cmd_hdr *h, mx_err *e)
{
    if (mx_precision_get() != (mx_precision)h->precision)
        mx_precision_set(mx_precision_name((mx_precision)h->precision));
    if (strcmp(mx_qkernels_active()->name, h->kernel) && mx_qkernels_force(h->kernel))
        return mx_fail(e, MX_EUNSUPPORTED, "this CPU cannot run the kernel variant %s that rank 0 runs",
                       h->kernel);
    return MX_OK;
}

static int worker_load(worker *w, size_t len, mx_err *e)
{
    mx_model_free(w->m);
    w->m = NULL;
    const cmd_hdr *h = (const cmd_hdr *)(void *)w->in;
    const load_body *b = (const load_body *)(void *)(w->in + HDR_BYTES);
    if (len < HDR_BYTES + sizeof *b)
        return mx_fail(e, MX_EFORMAT, "a short load message");
    w->n_layers = b->n_layers;
    w->n_experts = b->n_experts;
    if (len != HDR_BYTES + sizeof *b + sizeof(int16_t) * (size_t)b->n_layers * (size_t)b->n_experts)
        return mx_fail(e, MX_EFORMAT, "a load message of %zu bytes", len);
    w->owner = (const int16_t *)(const void *)(w->in + HDR_BYTES + sizeof *b);
    int rc = same_kernels(h, e);
    mx_model_load_opts o = {.slice = worker_slice, .ctx = w, .experts_only = 1, .lazy = 1};
    if (!rc)
        rc = mx_model_load_ex(b->dir, &o, &w->m, e);
    uint64_t fp = 0;
    if (!rc)
        rc = fingerprint(w->m, &fp, e);
    if (!rc && fp != b->fingerprint)
        rc = mx_fail(e, MX_EFORMAT, "%s is not the checkpoint rank 0 loaded (config.json, tensor headers, "
                     "file sizes or sampled bytes differ)", b->dir);
    w->owner = NULL;
    if (rc) {
        mx_model_free(w->m);
        w->m = NULL;
    }
    return rc;
}

/* One job's run on this rank's pool of threads (util/parallel.h), as a
 * single process runs the paths standalone (moe/dispatch.c). */
typedef struct worker_run {
    const mx_moe_job *job;
    mx_moe_plan plan;              /* fused */
    void *buf;
    unsigned char *xbuf;           /* fused: each thread's prepared x */
    size_t xb;
    mx_model *m;                   /* gather: its state and arena */
    mx_team team;
    int rc;                        /* gather: thread 0's code (every thread's) */
    mx_err *e;
} worker_run;

static void worker_fused_thread(void *arg, int ith, int nth)
{
    worker_run *r = arg;
    mx_team_join(&r->team, nth);
    mx_vec xv;
    mx_vec_init(&xv, r->job->x, r->job->d_model, r->xbuf + r->xb * (size_t)ith);
    mx_moe_fused_team(&r->plan, &xv, r->buf, NULL, &r->team, ith);
}

static void worker_gather_thread(void *arg, int ith, int nth)
{
    worker_run *r = arg;
    mx_team_join(&r->team, nth);
    const int rc = mx_moe_gather_team(r->job, r->m->gather, &r->m->moe_arena, &r->team, ith, r->e);
    if (ith == 0)
        r->rc = rc;
}

/* A JOB: this rank's experts of some tokens through the path rank 0 chose;
 * the reply carries each (token, expert) output in message order. */
static int worker_job(worker *w, size_t len, mx_err *e)
{
    const cmd_hdr *h = (const cmd_hdr *)(void *)w->in;
    const mx_model *m = w->m;
    if (!m)
        return mx_fail(e, MX_EINVAL, "no model loaded");
    const int64_t T = h->T, P = h->P, d = h->d;
    const size_t ints = mx_align64(sizeof(int32_t) * (size_t)(T + P));
    if (h->layer < 0 || h->layer >= m->n_layers || !m->layers[h->layer].is_moe || T < 1 || P < 1 ||
        d != m->d || len != HDR_BYTES + ints + sizeof(float) * (size_t)(T * d))
        return mx_fail(e, MX_EFORMAT, "a malformed job for layer %d", h->layer);
    int rc = same_kernels(h, e);
    if (rc)
        return rc;
    const mx_moe_block *b = &m->layers[h->layer].moe;
    const int32_t *k = (const int32_t *)(const void *)(w->in + HDR_BYTES), *idx = k + T;
    const float *x = (const float *)(const void *)(w->in + HDR_BYTES + ints);
    /* the reply buffer (its data is the job's slots) and the routes */
    const size_t need = REPLY_BYTES + sizeof(float) * (size_t)(P * d);
    if (need > w->cap_out) {
        unsigned char *nb = realloc(w->out, need);
        if (!nb)
            return mx_fail(e, MX_ENOMEM, "out of memory for %lld outputs", (long long)P);
        w->out = nb;
        w->cap_out = need;
    }
    mx_route *routes = malloc(sizeof *routes * (size_t)T);
    if (!routes)
        return mx_fail(e, MX_ENOMEM, "out of memory for %lld tokens", (long long)T);
    int64_t p = 0;
    for (int64_t t = 0; t < T && !rc; t++) {
        if (k[t] < 1 || k[t] > MX_MAX_TOPK || p + k[t] > P) {
            rc = mx_fail(e, MX_EFORMAT, "a malformed job for layer %d", h->layer);
            break;
        }
        routes[t].k = k[t];
        for (int i = 0; i < k[t]; i++, p++) {
            const int x = idx[p];
            if (x < 0 || x >= m->n_experts || (b->bound && !b->bound[x]))
                rc = mx_fail(e, MX_EINVAL, "layer %d: expert %d is not this rank's", h->layer, x);
            routes[t].idx[i] = x < 0 || x >= m->n_experts ? 0 : x;
            routes[t].w[i] = 1.0f;
        }
    }
    if (!rc && p != P)
        rc = mx_fail(e, MX_EFORMAT, "a malformed job for layer %d", h->layer);
    mx_moe_job job = {.ex = &b->experts, .routes = routes, .act = (mx_act)h->act, .x = x, .T = T,
                      .d_model = d, .slots = (float *)(void *)(w->out + REPLY_BYTES)};
    const int nth = mx_threads();
    if (!rc && h->path == MX_MOE_FUSED && T == 1) {
        mx_moe_plan plan;
        mx_moe_plan_of(&plan, &job);
        const size_t fb = mx_moe_fused_bytes(&plan, nth), xb = mx_align64(mx_vec_bytes(d));
        if (mx_arena_reserve(&w->arena, fb + (size_t)nth * xb)) {
            rc = mx_fail(e, MX_ENOMEM, "out of memory for the fused path");
        } else {
            worker_run run = {.job = &job, .plan = plan, .buf = mx_arena_take(&w->arena, fb),
                              .xbuf = mx_arena_take(&w->arena, (size_t)nth * xb), .xb = xb};
            mx_team_init(&run.team);
            mx_pool_run(nth, worker_fused_thread, &run);
        }
    } else if (!rc) {
        worker_run run = {.job = &job, .m = w->m, .e = e};
        mx_team_init(&run.team);
        mx_pool_run(nth, worker_gather_thread, &run);
        rc = run.rc;
    }
    free(routes);
    if (!rc) {
        memset(w->out, 0, sizeof(reply_hdr));
        for (int64_t t = 0, q = 0; t < T; t++)   /* each expert's bytes once per job */
            for (int i = 0; i < k[t]; i++, q++) {
                int first = 1;
                for (int64_t z = 0; z < q && first; z++)
                    first = idx[z] != idx[q];
                if (first)
                    g.st.expert_bytes += b->expert_bytes;
            }
        reply(MX_OK, NULL, w->out + REPLY_BYTES, sizeof(float) * (size_t)(P * d), w->out);
    }
    return rc;
}

int mx_dist_worker(void)
{
    worker w = {0};
    int code = 0, failed = 0;
    mx_err e = {0};
    for (;;) {
        size_t len = 0;
        const double t0 = mx_now();
        if (recv_grow(0, TAG_CMD, &w.in, &w.cap_in, &len) || len < HDR_BYTES) {
            fprintf(stderr, "mlxcel: rank %d: out of memory for a message from rank 0\n", g.rank);
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
        const double t1 = mx_now();
        g.st.t_idle += t1 - t0;
        g.st.received += len;
        const cmd_hdr *h = (const cmd_hdr *)(void *)w.in;
        unsigned char small[REPLY_BYTES + sizeof(mx_dist_stats)];
        int rc = MX_OK;
        mx_err_clear(&e);
        switch (h->cmd) {
        case CMD_LOAD:
            rc = worker_load(&w, len, &e);
            reply(rc, rc ? e.msg : NULL, NULL, 0, small);
            break;
        case CMD_VERDICT: {
            const reply_hdr *v = (const reply_hdr *)(const void *)(w.in + HDR_BYTES);
            if (v->rc) {
                fprintf(stderr, "mlxcel (rank %d): %s\n", g.rank, v->msg);
                failed = 1;
            }
            break;
        }
        case CMD_JOB:
            g.st.jobs++;
            rc = worker_job(&w, len, &e);
            if (rc)
                reply(rc, e.msg, NULL, 0, small);
            g.st.t_compute += mx_now() - t1;
            break;
        case CMD_STATS:
            g.st.peak_rss = (uint64_t)mx_peak_rss_bytes();
            memcpy(small + REPLY_BYTES, &g.st, sizeof g.st);
            reply(MX_OK, NULL, small + REPLY_BYTES, sizeof g.st, small);
            break;
        case CMD_RESET:
            memset(&g.st, 0, sizeof g.st);
            break;
        case CMD_UNLOAD:
            mx_model_free(w.m);
            w.m = NULL;
            break;
        case CMD_END:
            code = h->layer ? h->layer : failed;
            goto out;
        default:
            fprintf(stderr, "mlxcel: rank %d: unknown command %d from rank 0\n", g.rank, h->cmd);
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
    }
out:
    mx_model_free(w.m);
    free(w.in), free(w.out);
    mx_arena_free(&w.arena);
    MPI_Finalize();
    g.finalized = 1;
    return code;
}

void mx_dist_finalize(int exit_code)
{
    if (!g.mpi || g.finalized)
        return;
    g.finalized = 1;
    if (g.rank == 0)
        for (int w = 1; w < g.size; w++)
            send_cmd(w, CMD_END, exit_code);
    MPI_Finalize();
}

/* ---- statistics ------------------------------------------------------------------ */

int mx_dist_stats_get(mx_dist_stats *per_rank, mx_err *e)
{
    g.st.peak_rss = (uint64_t)mx_peak_rss_bytes();
    per_rank[0] = g.st;
    unsigned char *buf = NULL;
    size_t cap = 0, len = 0;
    for (int w = 1; w < g.size; w++) {
        send_cmd(w, CMD_STATS, 0);
        if (recv_grow(w, TAG_REPLY, &buf, &cap, &len) || len < REPLY_BYTES + sizeof(mx_dist_stats)) {
            free(buf);
            return mx_fail(e, MX_EIO, "rank %d: no statistics", w);
        }
        memcpy(&per_rank[w], buf + REPLY_BYTES, sizeof(mx_dist_stats));
    }
    free(buf);
    return MX_OK;
}

void mx_dist_stats_reset(void)
{
    memset(&g.st, 0, sizeof g.st);
    for (int w = 1; w < g.size; w++)
        send_cmd(w, CMD_RESET, 0);
}
