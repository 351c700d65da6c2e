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
 * region), so the hot path does not allocate. */
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

/* Scratch reused across calls: h (k*d_ff), u (k*d_ff), and per thread the
 * group sums of x and of each h_j plus a row buffer. */
static float *g_buf;
static size_t g_cap;

static float *scratch(size_t n)
{
    if (n > g_cap) {
        free(g_buf);
        g_buf = malloc(n * sizeof *g_buf);
        g_cap = g_buf ? n : 0;
    }
    return g_buf;
}

void mx_moe_fused(const mx_experts *ex, const mx_route *r, const float *x, float *out)
{
    const mx_qkernels *kern = mx_qkernels_active();
    const int k = r->k;
    const int64_t D = ex->d_model, F = ex->d_ff;
    const int nth = mx_threads();
    /* per-thread: xsum (D/32 floats covers any group size >= 32), hsum for
     * k experts (k*F/32), row buffer (D) */
    const size_t per_thread = (size_t)(D / 32 + k * (F / 32) + D + 64);
    float *buf = scratch((size_t)(2 * k * F) + per_thread * (size_t)nth);
    if (!buf) {
        /* Out of memory for scratch: fall back to the gather path, which
         * reports its own errors. */
        mx_moe_gather(ex, r, x, 1, out, NULL);
        return;
    }
    float *h = buf, *u = buf + k * F;

#pragma omp parallel num_threads(nth)
    {
        const int ith = omp_get_thread_num(), nt = omp_get_num_threads();
        float *mine = buf + 2 * k * F + per_thread * (size_t)ith;
        float *xsum = mine, *hsum = mine + D / 32, *row = hsum + k * (F / 32);

        /* ---- phase 1: gate and up rows of all k experts ---------------- */
        long lo, hi;
        mx_split((long)k * F, ith, nt, &lo, &hi);
        int xsum_gs = 0;
        for (int j = 0; j < k && lo < hi; j++) {
            int64_t a = j * F, b = a + F;
            if (hi <= a || lo >= b)
                continue;
            int64_t r0 = (lo > a ? lo : a) - a, r1 = (hi < b ? hi : b) - a;
            const mx_qmat *G = &ex->gate[r->idx[j]].q, *U = &ex->up[r->idx[j]].q;
            if (G->group_size != xsum_gs) {
                mx_group_sums(x, D, G->group_size, xsum);
                xsum_gs = G->group_size;
            }
            kern->matvec_rows(G, x, xsum, h + a + r0, r0, r1);
            if (U->group_size != xsum_gs) {
                mx_group_sums(x, D, U->group_size, xsum);
                xsum_gs = U->group_size;
            }
            kern->matvec_rows(U, x, xsum, u + a + r0, r0, r1);
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
                float *hs = hsum + j * (F / 32);
                mx_group_sums(h + j * F, F, Dn->group_size, hs);
                kern->matvec_rows(Dn, h + j * F, hs, row, lo, hi);
                const float w = r->w[j];
                for (long i = 0; i < hi - lo; i++)
                    o[i] += w * row[i];
            }
        }
    }
}
