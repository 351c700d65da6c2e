/* fused.c - the fused single-token MoE kernel.
 *
 * For one token x and its k routed experts:
 *   phase 1  rows of gate_j and up_j for all k experts (k * d_ff rows of
 *            each) are split evenly over the threads; each thread computes
 *            g = gate row . x and u = up row . x for its rows and writes
 *            h_j[r] = silu(g) * u  (the epilogue, no second pass).
 *   barrier
 *   phase 2  the d_model output rows are split evenly over the threads; each
 *            thread computes, for its rows, sum_j w_j * (down_j row . h_j),
 *            so the router weight is folded in and no reduction is needed.
 * Every weight byte is read once, both phases keep every thread busy whatever
 * k is, and the buffers are reused across calls (grown outside the parallel
 * region), so the hot path does not allocate.  The kernel's prepared form of
 * x is built once per call before the threads start, and each h_j once per
 * thread in phase 2 (not once per row range; a shared copy would cost one
 * more barrier, which stalls when a core is busy elsewhere). */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moe/moe.h"
#include "util/parallel.h"

const char *mx_moe_fused_declines(const mx_experts *ex)
{
    static char why[128];
    for (int i = 0; i < ex->n; i++)
        if (!ex->gate[i].quantized || !ex->up[i].quantized || !ex->down[i].quantized)
            return "experts are not quantized";
    if (ex->d_ff > mx_moe_fused_max_dff()) {
        snprintf(why, sizeof why, "d_ff %lld exceeds MLXCEL_FUSED_MOE_MAX_DFF=%lld",
                 (long long)ex->d_ff, (long long)mx_moe_fused_max_dff());
        return why;
    }
    return NULL;
}

/* Scratch reused across calls (64-byte aligned): h (k*d_ff floats), u
 * (k*d_ff), the prepared x for each group size the gate/up matrices use, and
 * per thread a row buffer and the prepared h_j of each expert. */
static unsigned char *g_buf;
static size_t g_cap;

static size_t al64(size_t n) { return (n + 63) & ~(size_t)63; }

static unsigned char *scratch(size_t n)
{
    if (n > g_cap) {
        free(g_buf);
        g_buf = aligned_alloc(64, al64(n));
        g_cap = g_buf ? n : 0;
    }
    return g_buf;
}

/* Index of a supported group size (32, 64, 128). */
static int gs_index(int gs) { return gs == 32 ? 0 : gs == 64 ? 1 : 2; }

void mx_moe_fused(const mx_experts *ex, const mx_route *r, const float *x, float *out)
{
    const mx_qkernels *kern = mx_qkernels_active();
    const int k = r->k;
    const int64_t D = ex->d_model, F = ex->d_ff;
    const int nth = mx_threads();
    /* x is prepared once per group size used by the gate/up matrices,
     * however the rows are split over threads */
    size_t xoff[3] = { 0, 0, 0 }, n = al64((size_t)(2 * k * F) * sizeof(float));
    int need[3] = { 0, 0, 0 };
    for (int j = 0; j < k; j++) {
        need[gs_index(ex->gate[r->idx[j]].q.group_size)] = 1;
        need[gs_index(ex->up[r->idx[j]].q.group_size)] = 1;
    }
    for (int i = 0; i < 3; i++)
        if (need[i]) {
            xoff[i] = n;
            n += al64(kern->prep_bytes(D, 32 << i));
        }
    /* per thread: a row buffer, then room for one prepared h_j */
    const size_t rowb = al64((size_t)D * sizeof(float));
    size_t hb = 0;
    for (int j = 0; j < k; j++) {
        size_t b = al64(kern->prep_bytes(F, ex->down[r->idx[j]].q.group_size));
        hb = b > hb ? b : hb;
    }
    const size_t rowoff = n, per_thread = rowb + hb;
    unsigned char *buf = scratch(n + per_thread * (size_t)nth);
    if (!buf) {
        /* Out of memory for scratch: fall back to the gather path, which
         * reports its own errors. */
        mx_moe_gather(ex, r, x, 1, out, NULL);
        return;
    }
    float *h = (float *)(void *)buf, *u = h + k * F;
    for (int i = 0; i < 3; i++)
        if (need[i])
            kern->prep(x, D, 32 << i, buf + xoff[i]);

#pragma omp parallel num_threads(nth)
    {
        const int ith = omp_get_thread_num(), nt = omp_get_num_threads();
        unsigned char *mine = buf + rowoff + per_thread * (size_t)ith;
        float *row = (float *)(void *)mine;
        void *hp = mine + rowb;

        /* ---- phase 1: gate and up rows of all k experts ---------------- */
        long lo, hi;
        mx_split((long)k * F, ith, nt, &lo, &hi);
        for (int j = 0; j < k && lo < hi; j++) {
            int64_t a = j * F, b = a + F;
            if (hi <= a || lo >= b)
                continue;
            int64_t r0 = (lo > a ? lo : a) - a, r1 = (hi < b ? hi : b) - a;
            const mx_qmat *G = &ex->gate[r->idx[j]].q, *U = &ex->up[r->idx[j]].q;
            kern->matvec_rows(G, x, buf + xoff[gs_index(G->group_size)], h + a + r0, r0, r1);
            kern->matvec_rows(U, x, buf + xoff[gs_index(U->group_size)], u + a + r0, r0, r1);
            for (int64_t i = a + r0; i < a + r1; i++)
                h[i] = mx_silu(h[i]) * u[i];
        }
#pragma omp barrier
        /* ---- phase 2: down rows, router weight folded in --------------- */
        mx_split((long)D, ith, nt, &lo, &hi);
        if (lo < hi) {
            float *o = out + lo;
            memset(o, 0, sizeof *o * (size_t)(hi - lo));
            for (int j = 0; j < k; j++) {
                const mx_qmat *Dn = &ex->down[r->idx[j]].q;
                kern->prep(h + j * F, F, Dn->group_size, hp);
                kern->matvec_rows(Dn, h + j * F, hp, row, lo, hi);
                const float w = r->w[j];
                for (long i = 0; i < hi - lo; i++)
                    o[i] += w * row[i];
            }
        }
    }
}
