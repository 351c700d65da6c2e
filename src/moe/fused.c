/* fused.c - the fused single-token MoE kernel.
 *
 * For one token x and its experts j (the k routed ones, plus optionally a
 * shared expert or a dense MLP with its own weight), out = sum_j w_j *
 * down_j(silu(gate_j x) * up_j x), in two phases split over the threads:
 *   phase 1  the gate and up rows of all experts, concatenated (sum of their
 *            widths), split evenly; each thread computes g = gate row . x and
 *            u = up row . x for its rows and writes h_j[r] = silu(g) * u
 *            (the epilogue, no second pass).
 *   barrier
 *   phase 2  the d_model output rows split evenly; each thread computes, for
 *            its rows, sum_j w_j * (down_j row . h_j): the router weight is
 *            folded in and no reduction is needed.
 * Every weight byte is read once and both phases keep every thread busy
 * whatever k is.  The phases are separate functions so that the decode step
 * (model/decode.c) runs them inside its own parallel region, beside the
 * shared expert; mx_moe_fused runs them in a region of its own.  Each thread
 * prepares x (once per group size) and each h_j itself: a shared copy would
 * cost one more barrier, which stalls when a core is busy elsewhere. */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moe/moe.h"
#include "util/parallel.h"
#include "util/scratch.h"

const char *mx_moe_fused_declines(const mx_experts *ex)
{
    static _Thread_local char why[128];
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

/* ---- the plan and its two phases --------------------------------------- */

static size_t al64(size_t n) { return (n + 63) & ~(size_t)63; }

void mx_moe_plan_init(mx_moe_plan *p, const mx_experts *ex, const mx_route *r)
{
    p->n = 0;
    p->off[0] = 0;
    p->d_model = ex->d_model;
    for (int j = 0; j < r->k; j++)
        mx_moe_plan_add(p, &ex->gate[r->idx[j]], &ex->up[r->idx[j]], &ex->down[r->idx[j]], r->w[j]);
}

void mx_moe_plan_add(mx_moe_plan *p, const mx_linear *gate, const mx_linear *up,
                     const mx_linear *down, float w)
{
    const int j = p->n++;
    p->gate[j] = gate;
    p->up[j] = up;
    p->down[j] = down;
    p->w[j] = w;
    p->off[j + 1] = p->off[j] + gate->rows;
    p->d_model = down->rows;
}

void mx_moe_phase1(const mx_moe_plan *p, mx_vec *x, float *h, float *u, int64_t lo, int64_t hi)
{
    for (int j = 0; j < p->n && lo < hi; j++) {
        const int64_t a = p->off[j], b = p->off[j + 1];
        if (hi <= a || lo >= b)
            continue;
        const int64_t r0 = (lo > a ? lo : a) - a, r1 = (hi < b ? hi : b) - a;
        /* rows of expert j, written at h + a + r */
        mx_linear_rows(p->gate[j], x, h + a, r0, r1);
        mx_linear_rows(p->up[j], x, u + a, r0, r1);
        for (int64_t i = a + r0; i < a + r1; i++)
            h[i] = mx_silu(h[i]) * u[i];
    }
}

size_t mx_moe_phase2_bytes(const mx_moe_plan *p)
{
    size_t n = al64((size_t)p->d_model * sizeof(float));
    for (int j = 0; j < p->n; j++)
        n += al64(mx_vec_bytes(p->off[j + 1] - p->off[j]));
    return n;
}

void mx_moe_phase2_init(const mx_moe_plan *p, const float *h, void *scratch, mx_moe_hvecs *hv)
{
    unsigned char *buf = scratch;
    hv->row = (float *)(void *)buf;
    buf += al64((size_t)p->d_model * sizeof(float));
    for (int j = 0; j < p->n; j++) {
        const int64_t ff = p->off[j + 1] - p->off[j];
        mx_vec_init(&hv->h[j], h + p->off[j], ff, buf);
        buf += al64(mx_vec_bytes(ff));
    }
}

void mx_moe_phase2(const mx_moe_plan *p, mx_moe_hvecs *hv, float *out, int64_t lo, int64_t hi)
{
    if (lo >= hi)
        return;
    memset(out + lo, 0, sizeof *out * (size_t)(hi - lo));
    for (int j = 0; j < p->n; j++) {
        /* each h_j is prepared on this thread's first use of it */
        mx_linear_rows(p->down[j], &hv->h[j], hv->row, lo, hi);
        const float w = p->w[j];
        for (int64_t i = lo; i < hi; i++)
            out[i] += w * hv->row[i];
    }
}

/* ---- the standalone kernel (its own parallel region) -------------------- */

/* Scratch reused across calls: h and u (sum of widths each), then per
 * thread a prepared x and the phase-2 buffers. */
static mx_scratch g_scratch = MX_SCRATCH_INIT;

void mx_moe_fused(const mx_experts *ex, const mx_route *r, const float *x, float *out)
{
    mx_moe_plan p;
    mx_moe_plan_init(&p, ex, r);
    const int nth = mx_threads();
    const size_t hb = al64((size_t)p.off[p.n] * sizeof(float));
    const size_t per_thread = al64(mx_vec_bytes(ex->d_model)) + al64(mx_moe_phase2_bytes(&p));
    size_t cap = 0;
    unsigned char *buf = mx_scratch_take(&g_scratch, 2 * hb + per_thread * (size_t)nth, &cap);
    if (!buf) {
        /* Out of memory for scratch: the gather path reports its own errors. */
        mx_moe_gather(ex, r, x, 1, out, NULL);
        return;
    }
    float *h = (float *)(void *)buf, *u = (float *)(void *)(buf + hb);
#pragma omp parallel num_threads(nth)
    {
        const int ith = omp_get_thread_num(), nt = omp_get_num_threads();
        unsigned char *mine = buf + 2 * hb + per_thread * (size_t)ith;
        mx_vec xv;
        mx_vec_init(&xv, x, ex->d_model, mine);
        long lo, hi;
        mx_split((long)p.off[p.n], ith, nt, &lo, &hi);
        mx_moe_phase1(&p, &xv, h, u, lo, hi);
#pragma omp barrier
        mx_moe_hvecs hv;
        mx_moe_phase2_init(&p, h, mine + al64(mx_vec_bytes(ex->d_model)), &hv);
        mx_split((long)p.d_model, ith, nt, &lo, &hi);
        mx_moe_phase2(&p, &hv, out, lo, hi);
    }
    mx_scratch_give(&g_scratch, buf, cap);
}
