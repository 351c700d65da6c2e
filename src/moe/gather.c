/* gather.c - the general expert path for any number of tokens.
 *
 * A job's (token, expert) pairs are grouped by expert: one group per
 * selected routed expert with the tokens that chose it, and one group per
 * extra MLP (shared expert, dense MLP) with every token.  Each group's
 * weights are then streamed once for all of its tokens, and all groups of
 * the block run in five steps shared by the team:
 *   1  each group's tokens (gathered rows of x) prepared as a batch
 *   2  the gate and up rows of every group in chunks, handed out
 *      dynamically (groups differ in token count, so in work), with
 *      h = silu(g) * u for the chunk's rows
 *   3  each group's h prepared as a batch
 *   4  the down rows, the same way
 *   5  each token's output: its groups' rows weighted, in the job's order
 *      (routed experts as ranked, then the extras)
 * A batch of a few tokens runs the matvec kernel over each weight line once
 * for all of them; a large one the prefill (tile) kernel (quant/batch.c). */
#include <stdlib.h>
#include <string.h>

#include "moe/moe.h"
#include "util/parallel.h"

#define ROW_CHUNK 64   /* rows per work item at 16+ tokens: a multiple of the tile kernel's 32 */
#define TOK_CHUNK 8    /* tokens per preparation item */

typedef struct group {
    const mx_linear *gate, *up, *down;
    int64_t F;                /* its width */
    int64_t off, n;           /* its slots [off, off+n) */
    int64_t hoff;             /* its h and u rows start at hoff (n rows of F) */
    const float *X;           /* its x rows (ld = d_model) */
    mx_batch bx, bh;          /* its x rows and its h rows, prepared */
    int64_t chunk;            /* rows per work item */
    int64_t item_f, item_d;   /* its first gate/up item, its first down item */
} group;

struct mx_moe_gather_state {
    int rc;                   /* MX_OK, or the setup's failure (seen by all) */
    int ng;
    group *grp;
    int64_t *slot_of, *tbase; /* token t's slots: slot_of[tbase[t] .. tbase[t+1]) */
    float *wslot;             /* weight of each slot */
    float *g, *u;             /* each group's gate (then h) and up rows, at its hoff */
    float *y;                 /* [P][D] each slot's expert output */
    int64_t n_tok_items, n_f_items, n_d_items;
    int64_t *count, *first;   /* per routed expert */
    size_t cap_e, cap_g, cap_p, cap_w, cap_t;   /* capacities of the arrays above */
};

mx_moe_gather_state *mx_moe_gather_state_new(void) { return calloc(1, sizeof(mx_moe_gather_state)); }

void mx_moe_gather_state_free(mx_moe_gather_state *s)
{
    if (!s)
        return;
    free(s->grp), free(s->slot_of), free(s->tbase), free(s->wslot), free(s->count);
    free(s);
}

/* Grows *p to hold n elements of size sz (capacity in *cap). */
static int grow(void *pp, size_t *cap, size_t n, size_t sz)
{
    void **p = pp;
    if (n <= *cap)
        return 0;
    size_t c = n + n / 2 + 16;
    void *q = realloc(*p, c * sz);
    if (!q)
        return -1;
    *p = q;
    *cap = c;
    return 0;
}

/* Rows per work item for a group with n tokens: 64 rows is plenty of work
 * at 16 tokens; with fewer, longer row runs keep the weight streams long
 * enough for the hardware prefetcher (1024 rows for one token). */
static int64_t chunk_rows(int64_t n) { return ROW_CHUNK * (n >= 16 ? 1 : 16 / n); }

static int gs_of(const mx_linear *l) { return l->quantized ? l->q.group_size : 64; }

/* The setup, on one thread: groups, slots, buffers, batches.  Returns
 * MX_OK or MX_ENOMEM. */
static int setup(const mx_moe_job *j, mx_moe_gather_state *st, mx_arena *arena)
{
    const int64_t T = j->T, D = j->d_model;
    const int E = j->ex ? j->ex->n : 0;
    int64_t P = 0;   /* (token, group) slots */
    for (int64_t t = 0; j->ex && t < T; t++)
        P += j->routes[t].k;
    P += T * j->n_extra;
    const int max_groups = E + j->n_extra;
    if (grow(&st->count, &st->cap_e, 2 * (size_t)(E ? E : 1), sizeof *st->count) ||
        grow(&st->grp, &st->cap_g, (size_t)(max_groups ? max_groups : 1), sizeof *st->grp) ||
        grow(&st->slot_of, &st->cap_p, (size_t)(P ? P : 1), sizeof *st->slot_of) ||
        grow(&st->wslot, &st->cap_w, (size_t)(P ? P : 1), sizeof *st->wslot) ||
        grow(&st->tbase, &st->cap_t, (size_t)T + 1, sizeof *st->tbase))
        return MX_ENOMEM;
    int64_t *count = st->count, *first = st->count + (E ? E : 1);
    memset(count, 0, sizeof *count * (size_t)(E ? E : 1));
    for (int64_t t = 0; j->ex && t < T; t++)
        for (int i = 0; i < j->routes[t].k; i++)
            count[j->routes[t].idx[i]]++;

    /* groups: routed experts in expert order, then the extras */
    group *grp = st->grp;
    int ng = 0;
    int64_t off = 0, hoff = 0;
    for (int e = 0; e < E; e++) {
        if (!count[e])
            continue;
        grp[ng] = (group){.gate = &j->ex->gate[e], .up = &j->ex->up[e], .down = &j->ex->down[e],
                          .F = j->ex->d_ff, .off = off, .n = count[e], .hoff = hoff};
        first[e] = off;
        off += count[e];
        hoff += count[e] * j->ex->d_ff;
        ng++;
    }
    const int64_t routed_slots = off;
    for (int m = 0; m < j->n_extra; m++) {
        const mx_mlp *x = j->extra[m];
        grp[ng] = (group){.gate = &x->gate, .up = &x->up, .down = &x->down, .F = x->gate.rows,
                          .off = off, .n = T, .hoff = hoff, .X = j->x};
        off += T;
        hoff += T * x->gate.rows;
        ng++;
    }
    st->ng = ng;

    /* buffers: gathered x rows of the routed slots, g and u, y */
    size_t need = mx_align64((size_t)(routed_slots * D) * sizeof(float)) +
                  2 * mx_align64((size_t)hoff * sizeof(float)) +
                  mx_align64((size_t)(P * D) * sizeof(float));
    for (int i = 0; i < ng; i++)
        need += mx_align64(mx_batch_bytes(grp[i].n, D, gs_of(grp[i].gate))) +
                mx_align64(mx_batch_bytes(grp[i].n, grp[i].F, gs_of(grp[i].down)));
    if (mx_arena_reserve(arena, need))
        return MX_ENOMEM;
    float *xs = mx_arena_take(arena, (size_t)(routed_slots * D) * sizeof(float));
    st->g = mx_arena_take(arena, (size_t)hoff * sizeof(float));
    st->u = mx_arena_take(arena, (size_t)hoff * sizeof(float));
    st->y = mx_arena_take(arena, (size_t)(P * D) * sizeof(float));

    /* each token's slots in job order: its routed experts as ranked, then
     * the extras; the routed experts' x rows gathered in token order */
    memset(count, 0, sizeof *count * (size_t)(E ? E : 1));
    int64_t *tbase = st->tbase;
    tbase[0] = 0;
    for (int64_t t = 0; t < T; t++) {
        const int k = j->ex ? j->routes[t].k : 0;
        tbase[t + 1] = tbase[t] + k + j->n_extra;
        for (int i = 0; i < k; i++) {
            const int e = j->routes[t].idx[i];
            const int64_t s = first[e] + count[e]++;
            st->slot_of[tbase[t] + i] = s;
            st->wslot[s] = j->routes[t].w[i];
            memcpy(xs + s * D, j->x + t * D, sizeof *xs * (size_t)D);
        }
        for (int m = 0; m < j->n_extra; m++) {
            const int64_t s = grp[ng - j->n_extra + m].off + t;
            st->slot_of[tbase[t] + k + m] = s;
            st->wslot[s] = j->extra_w[m] ? j->extra_w[m][t] : 1.0f;
        }
    }
    /* batches and work items */
    st->n_tok_items = st->n_f_items = st->n_d_items = 0;
    for (int i = 0; i < ng; i++) {
        group *G = &grp[i];
        if (!G->X)
            G->X = xs + G->off * D;
        mx_batch_init(&G->bx, G->X, D, G->n, D, gs_of(G->gate),
                      mx_arena_take(arena, mx_batch_bytes(G->n, D, gs_of(G->gate))));
        mx_batch_init(&G->bh, st->g + G->hoff, G->F, G->n, G->F, gs_of(G->down),
                      mx_arena_take(arena, mx_batch_bytes(G->n, G->F, gs_of(G->down))));
        G->chunk = chunk_rows(G->n);
        G->item_f = st->n_f_items;
        G->item_d = st->n_d_items;
        st->n_tok_items += (G->n + TOK_CHUNK - 1) / TOK_CHUNK;
        st->n_f_items += (G->F + G->chunk - 1) / G->chunk;
        st->n_d_items += (D + G->chunk - 1) / G->chunk;
    }
    return MX_OK;
}

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

int mx_moe_gather_team(const mx_moe_job *j, mx_moe_gather_state *st, mx_arena *arena,
                       mx_team *team, int ith, mx_err *e)
{
    const int64_t D = j->d_model;
    if (ith == 0) {
        st->rc = setup(j, st, arena);
        if (st->rc)
            mx_fail(e, st->rc, "moe gather: out of memory for %lld tokens", (long long)j->T);
    }
    mx_team_sync(team);
    if (st->rc)
        return st->rc;
    group *grp = st->grp;
    const int ng = st->ng;
    /* 1: prepare each group's x rows */
    for (int64_t it; (it = mx_team_next(team)) < st->n_tok_items;)
        prep_item(grp, it, 0);
    mx_team_sync(team);
    /* 2: gate and up rows, h = act(g) * u (h overwrites g) */
    for (int64_t it; (it = mx_team_next(team)) < st->n_f_items;) {
        const group *G = &grp[group_of(grp, ng, it, 0)];
        const int64_t F = G->F, r0 = (it - G->item_f) * G->chunk,
                      r1 = r0 + G->chunk < F ? r0 + G->chunk : F;
        float *gg = st->g + G->hoff, *uu = st->u + G->hoff;
        mx_linear_rows_batch(G->gate, &G->bx, gg, F, r0, r1);
        mx_linear_rows_batch(G->up, &G->bx, uu, F, r0, r1);
        for (int64_t t = 0; t < G->n; t++)
            for (int64_t r = r0; r < r1; r++)
                gg[t * F + r] = mx_glu(j->act, gg[t * F + r], uu[t * F + r]);
    }
    mx_team_sync(team);
    /* 3: prepare each group's h rows */
    for (int64_t it; (it = mx_team_next(team)) < st->n_tok_items;)
        prep_item(grp, it, 1);
    mx_team_sync(team);
    /* 4: down rows */
    for (int64_t it; (it = mx_team_next(team)) < st->n_d_items;) {
        const group *G = &grp[group_of(grp, ng, it, 1)];
        const int64_t r0 = (it - G->item_d) * G->chunk, r1 = r0 + G->chunk < D ? r0 + G->chunk : D;
        mx_linear_rows_batch(G->down, &G->bh, st->y + G->off * D, D, r0, r1);
    }
    mx_team_sync(team);
    /* 5: each token's weighted sum over its slots, in job order (or the
     * slots themselves, for a caller that sums them) */
    long t0, t1;
    mx_split((long)j->T, ith, atomic_load_explicit(&team->n, memory_order_relaxed), &t0, &t1);
    if (j->slots) {
        for (int64_t t = t0; t < t1; t++)
            for (int64_t i = st->tbase[t]; i < st->tbase[t + 1]; i++)
                memcpy(j->slots + i * D, st->y + st->slot_of[i] * D, sizeof(float) * (size_t)D);
        mx_team_sync(team);
        return MX_OK;
    }
    for (int64_t t = t0; t < t1; t++) {
        float *o = j->out + t * D;
        memset(o, 0, sizeof *o * (size_t)D);
        for (int64_t i = st->tbase[t]; i < st->tbase[t + 1]; i++) {
            const int64_t s = st->slot_of[i];
            const float w = st->wslot[s], *ys = st->y + s * D;
            for (int64_t d = 0; d < D; d++)
                o[d] += w * ys[d];
        }
    }
    mx_team_sync(team);
    return MX_OK;
}
