/* gather.c - the general expert path for any number of tokens.
 *
 * (token, expert) pairs are grouped by expert, so each selected expert's
 * weights are streamed once per call for all of its tokens, and all experts
 * of the block run in one parallel region, in five steps:
 *   1  each expert's tokens (gathered rows of x) prepared as a batch
 *   2  the gate and up rows of every selected expert in chunks, handed out
 *      dynamically (experts differ in token count, so in work), with
 *      h = silu(g) * u for the chunk's rows
 *   3  each expert's h prepared as a batch
 *   4  the down rows, the same way
 *   5  each token's output: its experts' rows weighted by the router
 * A batch of a few tokens runs the matvec kernel over each weight line once
 * for all of them; a large one the prefill (tile) kernel (quant/batch.c). */
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "moe/moe.h"
#include "util/parallel.h"
#include "util/scratch.h"

#define ROW_CHUNK 64   /* rows per work item at 16+ tokens: a multiple of the tile kernel's 32 */
#define TOK_CHUNK 8    /* tokens per preparation item */

static size_t al64(size_t n) { return (n + 63) & ~(size_t)63; }

/* Scratch reused across calls: the sizes repeat from layer to layer, and
 * fresh large allocations would fault in their pages every time. */
static mx_scratch g_scratch = MX_SCRATCH_INIT;

typedef struct group {
    int e;               /* expert */
    int64_t off, n;      /* its slots [off, off+n) */
    mx_batch bx, bh;     /* its x rows and its h rows, prepared */
    int64_t chunk;       /* rows per work item */
    int64_t item_f, item_d;   /* its first gate/up item, its first down item */
} group;

/* Rows per work item for an expert with n tokens: 64 rows is plenty of work
 * at 16 tokens; with fewer, longer row runs keep the weight streams long
 * enough for the hardware prefetcher (1024 rows for one token). */
static int64_t chunk_rows(int64_t n) { return ROW_CHUNK * (n >= 16 ? 1 : 16 / n); }

/* Prepares the batch (x rows when h == 0, else h rows) of token-chunk item
 * `it`: items run over the groups' tokens, TOK_CHUNK at a time. */
static void prep_item(group *grp, int64_t it, int h)
{
    int i = 0;
    while (it >= (grp[i].n + TOK_CHUNK - 1) / TOK_CHUNK)
        it -= (grp[i].n + TOK_CHUNK - 1) / TOK_CHUNK, i++;
    const int64_t t0 = it * TOK_CHUNK, t1 = t0 + TOK_CHUNK < grp[i].n ? t0 + TOK_CHUNK : grp[i].n;
    mx_batch_prep(h ? &grp[i].bh : &grp[i].bx, t0, t1);
}

/* The group whose items [first, next group's first) hold item it. */
static int group_of(const group *grp, int ng, int64_t it, int down)
{
    int lo = 0, hi = ng - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if ((down ? grp[mid].item_d : grp[mid].item_f) <= it)
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo;
}

int mx_moe_gather(const mx_experts *ex, const mx_route *routes, const float *x, int64_t T,
                  float *out, mx_err *e)
{
    const int64_t D = ex->d_model, F = ex->d_ff;
    int64_t P = 0;                       /* (token, expert) slots */
    for (int64_t t = 0; t < T; t++)
        P += routes[t].k;
    if (P == 0) {
        memset(out, 0, sizeof *out * (size_t)(T * D));
        return MX_OK;
    }
    /* per expert: token count, first slot, group; per slot: a token's j-th
     * expert -> slot, the slot's router weight; per token: its first in
     * slot_of (tbase) */
    const size_t nE = (size_t)ex->n;
    int64_t *count = calloc(2 * nE, sizeof *count), *first = count + nE;
    group *grp = malloc(sizeof *grp * nE);
    int64_t *slot_of = malloc(sizeof *slot_of * (size_t)(P + T + 1)), *tbase = slot_of + P;
    float *wslot = malloc(sizeof *wslot * (size_t)P);
    unsigned char *buf = NULL;
    size_t cap = 0;
    if (!count || !grp || !slot_of || !wslot)
        goto oom;
    for (int64_t t = 0; t < T; t++)
        for (int j = 0; j < routes[t].k; j++)
            count[routes[t].idx[j]]++;
    /* groups in expert order; slots grouped by expert */
    int ng = 0;
    int64_t off = 0;
    for (int i = 0; i < ex->n; i++)
        if (count[i]) {
            grp[ng] = (group){.e = i, .off = off, .n = count[i]};
            first[i] = off;
            off += count[i];
            ng++;
        }
    /* scratch: xs [P][D], g, u [P][F], y [P][D], then the batches */
    const int gsx = ex->gate[grp[0].e].quantized ? ex->gate[grp[0].e].q.group_size : 64;
    const int gsh = ex->down[grp[0].e].quantized ? ex->down[grp[0].e].q.group_size : 64;
    size_t need = al64((size_t)(P * D) * sizeof(float)) * 2 + al64((size_t)(P * F) * sizeof(float)) * 2;
    for (int i = 0; i < ng; i++)
        need += al64(mx_batch_bytes(grp[i].n, D, gsx)) + al64(mx_batch_bytes(grp[i].n, F, gsh));
    buf = mx_scratch_take(&g_scratch, need, &cap);
    if (!buf)
        goto oom;
    float *xs = (float *)(void *)buf;
    float *g = (float *)(void *)(buf + al64((size_t)(P * D) * sizeof(float)));
    float *u = g + al64((size_t)(P * F) * sizeof(float)) / sizeof(float);
    float *y = u + al64((size_t)(P * F) * sizeof(float)) / sizeof(float);
    unsigned char *bp = (unsigned char *)(y + al64((size_t)(P * D) * sizeof(float)) / sizeof(float));
    /* each expert's tokens in token order */
    memset(count, 0, sizeof *count * (size_t)ex->n);
    tbase[0] = 0;
    for (int64_t t = 0; t < T; t++) {
        tbase[t + 1] = tbase[t] + routes[t].k;
        for (int j = 0; j < routes[t].k; j++) {
            const int ei = routes[t].idx[j];
            const int64_t s = first[ei] + count[ei]++;
            slot_of[tbase[t] + j] = s;
            wslot[s] = routes[t].w[j];
            memcpy(xs + s * D, x + t * D, sizeof *xs * (size_t)D);
        }
    }
    for (int i = 0; i < ng; i++) {
        mx_batch_init(&grp[i].bx, xs + grp[i].off * D, D, grp[i].n, D, gsx, bp);
        bp += al64(mx_batch_bytes(grp[i].n, D, gsx));
        mx_batch_init(&grp[i].bh, g + grp[i].off * F, F, grp[i].n, F, gsh, bp);
        bp += al64(mx_batch_bytes(grp[i].n, F, gsh));
    }
    /* work items: (group, token chunk) and (group, row chunk) */
    int64_t n_tok_items = 0;
    for (int i = 0; i < ng; i++)
        n_tok_items += (grp[i].n + TOK_CHUNK - 1) / TOK_CHUNK;
    int64_t n_f_items = 0, n_d_items = 0;
    for (int i = 0; i < ng; i++) {
        grp[i].chunk = chunk_rows(grp[i].n);
        grp[i].item_f = n_f_items;
        grp[i].item_d = n_d_items;
        n_f_items += (F + grp[i].chunk - 1) / grp[i].chunk;
        n_d_items += (D + grp[i].chunk - 1) / grp[i].chunk;
    }
    const int nth = mx_threads();

#pragma omp parallel num_threads(nth)
    {
        /* 1: prepare each expert's x rows */
#pragma omp for schedule(dynamic, 1)
        for (int64_t it = 0; it < n_tok_items; it++)
            prep_item(grp, it, 0);
        /* 2: gate and up rows, h = silu(g) * u */
#pragma omp for schedule(dynamic, 1)
        for (int64_t it = 0; it < n_f_items; it++) {
            const group *G = &grp[group_of(grp, ng, it, 0)];
            const int64_t r0 = (it - G->item_f) * G->chunk, r1 = r0 + G->chunk < F ? r0 + G->chunk : F;
            float *gg = g + G->off * F, *uu = u + G->off * F;
            mx_linear_rows_batch(&ex->gate[G->e], &G->bx, gg, F, r0, r1);
            mx_linear_rows_batch(&ex->up[G->e], &G->bx, uu, F, r0, r1);
            for (int64_t t = 0; t < G->n; t++)
                for (int64_t r = r0; r < r1; r++)
                    gg[t * F + r] = mx_silu(gg[t * F + r]) * uu[t * F + r];
        }
        /* 3: prepare each expert's h rows */
#pragma omp for schedule(dynamic, 1)
        for (int64_t it = 0; it < n_tok_items; it++)
            prep_item(grp, it, 1);
        /* 4: down rows */
#pragma omp for schedule(dynamic, 1)
        for (int64_t it = 0; it < n_d_items; it++) {
            const group *G = &grp[group_of(grp, ng, it, 1)];
            const int64_t r0 = (it - G->item_d) * G->chunk, r1 = r0 + G->chunk < D ? r0 + G->chunk : D;
            mx_linear_rows_batch(&ex->down[G->e], &G->bh, y + G->off * D, D, r0, r1);
        }
        /* 5: each token's weighted sum over its experts, in route order */
#pragma omp for schedule(static)
        for (int64_t t = 0; t < T; t++) {
            float *o = out + t * D;
            memset(o, 0, sizeof *o * (size_t)D);
            for (int j = 0; j < routes[t].k; j++) {
                const int64_t s = slot_of[tbase[t] + j];
                const float w = wslot[s], *ys = y + s * D;
                for (int64_t d = 0; d < D; d++)
                    o[d] += w * ys[d];
            }
        }
    }
    mx_scratch_give(&g_scratch, buf, cap);
    free(count), free(grp), free(slot_of), free(wslot);
    return MX_OK;
oom:
    free(count), free(grp), free(slot_of), free(wslot);
    return mx_fail(e, MX_ENOMEM, "moe gather: out of memory for %lld tokens", (long long)T);
}
