/* fused.c - the fused single-token MoE kernel.
 *
 * For one token x and its experts j (the k routed ones, plus any shared
 * expert or dense MLP with its own weight), out = sum_j w_j *
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
 * whatever k is.  Each thread prepares x (once per group size, inside its
 * mx_vec) and each h_j itself: a shared copy would cost one more barrier,
 * which stalls when a core is busy elsewhere. */
#include <string.h>

#include "moe/moe.h"
#include "util/parallel.h"

const char *mx_moe_fused_takes(const mx_linear *gate, const mx_linear *up, const mx_linear *down)
{
    if (!gate->quantized || !up->quantized || !down->quantized)
        return "experts are not quantized";
    return NULL;
}

/* ---- the plan --------------------------------------------------------------- */

static void plan_add(mx_moe_plan *p, const mx_linear *gate, const mx_linear *up,
                     const mx_linear *down, float w)
{
    const int j = p->n++;
    p->gate[j] = gate;
    p->up[j] = up;
    p->down[j] = down;
    p->w[j] = w;
    p->off[j + 1] = p->off[j] + gate->rows;
}

void mx_moe_plan_of(mx_moe_plan *p, const mx_moe_job *j)
{
    p->n = 0;
    p->off[0] = 0;
    p->d_model = j->d_model;
    p->act = j->act;
    p->slots = j->slots;
    if (j->ex) {
        const mx_route *r = &j->routes[0];
        for (int i = 0; i < r->k; i++) {
            const int e = r->idx[i];
            plan_add(p, &j->ex->gate[e], &j->ex->up[e], &j->ex->down[e], r->w[i]);
        }
    }
    for (int m = 0; m < j->n_extra; m++)
        plan_add(p, &j->extra[m]->gate, &j->extra[m]->up, &j->extra[m]->down,
                 j->extra_w[m] ? j->extra_w[m][0] : 1.0f);
}

/* Each thread's part of the buffer: the phase-2 row buffer and one
 * prepared h per expert. */
static size_t thread_bytes(const mx_moe_plan *p)
{
    size_t n = mx_align64((size_t)p->d_model * sizeof(float));
    for (int j = 0; j < p->n; j++)
        n += mx_align64(mx_vec_bytes(p->off[j + 1] - p->off[j]));
    return n;
}

size_t mx_moe_fused_bytes(const mx_moe_plan *p, int nth)
{
    return 2 * mx_align64((size_t)p->off[p->n] * sizeof(float)) + (size_t)nth * thread_bytes(p);
}

size_t mx_moe_fused_bytes_max(int64_t d_model, int k, int64_t d_ff, const int64_t *extra_ff,
                              int n_extra, int nth)
{
    int64_t h = (int64_t)k * d_ff;
    size_t per = mx_align64((size_t)d_model * sizeof(float)) +
                 (size_t)k * mx_align64(mx_vec_bytes(d_ff > 0 ? d_ff : 1));
    for (int m = 0; m < n_extra; m++) {
        h += extra_ff[m];
        per += mx_align64(mx_vec_bytes(extra_ff[m]));
    }
    return 2 * mx_align64((size_t)h * sizeof(float)) + (size_t)nth * per;
}

/* ---- the two phases --------------------------------------------------------- */

/* Phase 1 for rows [lo, hi) of the experts' gate/up rows stacked. */
static void phase1(const mx_moe_plan *p, mx_vec *x, float *h, float *u, int64_t lo, int64_t hi)
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
            h[i] = mx_glu(p->act, h[i], u[i]);
    }
}

/* Phase 2 for output rows [lo, hi): out[r] = sum_j w_j down_j . h_j, each
 * h_j prepared (into hv[j]) on this thread's first use of it; or, when the
 * plan has slots, each expert's rows unweighted into its slot. */
static void phase2(const mx_moe_plan *p, mx_vec *hv, float *row, float *out, int64_t lo, int64_t hi)
{
    if (lo >= hi)
        return;
    if (p->slots) {
        for (int j = 0; j < p->n; j++)
            mx_linear_rows(p->down[j], &hv[j], p->slots + (int64_t)j * p->d_model, lo, hi);
        return;
    }
    memset(out + lo, 0, sizeof *out * (size_t)(hi - lo));
    for (int j = 0; j < p->n; j++) {
        mx_linear_rows(p->down[j], &hv[j], row, lo, hi);
        const float w = p->w[j];
        for (int64_t i = lo; i < hi; i++)
            out[i] += w * row[i];
    }
}

void mx_moe_fused_team(const mx_moe_plan *p, mx_vec *x, void *buf, float *out, mx_team *team,
                       int ith)
{
    const int nth = atomic_load_explicit(&team->n, memory_order_relaxed);
    const size_t hb = mx_align64((size_t)p->off[p->n] * sizeof(float));
    unsigned char *base = buf;
    float *h = (float *)(void *)base, *u = (float *)(void *)(base + hb);
    /* this thread's block: the row buffer, then each h_j's prepared form */
    unsigned char *mine = base + 2 * hb + (size_t)ith * thread_bytes(p);
    float *row = (float *)(void *)mine;
    mine += mx_align64((size_t)p->d_model * sizeof(float));
    mx_vec hv[MX_MAX_TOPK + MX_MOE_MAX_EXTRA];

    long lo, hi;
    mx_split((long)p->off[p->n], ith, nth, &lo, &hi);
    phase1(p, x, h, u, lo, hi);
    mx_team_sync(team);
    for (int j = 0; j < p->n; j++) {
        const int64_t ff = p->off[j + 1] - p->off[j];
        mx_vec_init(&hv[j], h + p->off[j], ff, mine);
        mine += mx_align64(mx_vec_bytes(ff));
    }
    mx_split((long)p->d_model, ith, nth, &lo, &hi);
    phase2(p, hv, row, out, lo, hi);
    mx_team_sync(team);
}
