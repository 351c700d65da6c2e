/* plan.c - which rank holds which routed expert.
 *
 * The default plan balances weight bytes: rank 0 holds everything that is
 * not a routed expert (attention, embeddings, lm_head, shared experts,
 * dense MLPs) and so takes fewer experts.  Water-filling gives each rank a
 * budget of expert bytes; each MoE layer is then cut into contiguous runs
 * (rank 0 first) whose sizes follow the budgets, the rounding of one layer
 * carried into the next so no rank collects every rounding up.  Contiguous
 * runs keep each rank's share of a stacked expert tensor one span of the
 * file (one mapping per tensor, see mx_st_map).
 *
 * Needs no MPI: `mlxcel inspect --ranks N` prints a plan on one machine. */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "dist/dist.h"
#include "util/file.h"

void mx_dist_plan_free(mx_dist_plan *p)
{
    free(p->owner);
    free(p->bytes);
    memset(p, 0, sizeof *p);
}

/* Each rank's budget of expert bytes: the level L with base + b0 = L and
 * b_r = L for r > 0 when base is below the average, else nothing for rank
 * 0 and an even split of the rest. */
static void budgets(double base, double experts, int n, double *b)
{
    const double level = (base + experts) / n;
    for (int r = 0; r < n; r++)
        b[r] = n == 1 ? experts : base >= level ? (r ? experts / (n - 1) : 0.0) : (r ? level : level - base);
}

static void plan_balanced(const mx_model *m, mx_dist_plan *p, double base, double experts)
{
    const int N = p->n_ranks, E = p->n_experts;
    double *b = calloc((size_t)N, sizeof *b), *carry = calloc((size_t)N, sizeof *carry);
    int *c = calloc((size_t)N, sizeof *c);
    if (!b || !carry || !c)
        goto out;
    budgets(base, experts, N, b);
    for (int l = 0; l < p->n_layers; l++) {
        const mx_layer *L = &m->layers[l];
        if (!L->is_moe)
            continue;
        const double eb = L->moe.expert_bytes > 0 ? (double)L->moe.expert_bytes : 1.0;
        int given = 0;
        for (int r = 0; r < N; r++) {
            const double want = (experts > 0 ? b[r] / experts : 1.0 / N) * E * eb + carry[r];
            c[r] = want > 0 ? (int)floor(want / eb) : 0;
            given += c[r];
            carry[r] = want - c[r] * eb;
        }
        /* the experts the rounding left: to the ranks owed the most */
        while (given < E) {
            int best = 0;
            for (int r = 1; r < N; r++)
                if (carry[r] > carry[best])
                    best = r;
            c[best]++;
            carry[best] -= eb;
            given++;
        }
        while (given > E) {   /* cannot happen with floor, but never overfill */
            int worst = 0;
            for (int r = 1; r < N; r++)
                if (c[r] > 0 && (c[worst] == 0 || carry[r] < carry[worst]))
                    worst = r;
            c[worst]--;
            carry[worst] += eb;
            given--;
        }
        int e0 = 0;
        for (int r = 0; r < N; r++)
            for (int k = 0; k < c[r]; k++)
                p->owner[(size_t)l * E + e0++] = (int16_t)r;
    }
out:
    free(b), free(carry), free(c);
}

/* Reads one map line's ranks into row[E]. */
static int parse_row(const char *file, int line, char *s, int E, int N, int16_t *row, mx_err *e)
{
    for (int x = 0; x < E; x++) {
        while (isspace((unsigned char)*s))
            s++;
        char *end;
        errno = 0;
        long r = strtol(s, &end, 10);
        if (end == s)
            return mx_fail(e, MX_EFORMAT, "%s:%d: %d ranks for %d experts (one rank per expert)", file,
                           line, x, E);
        if (errno || r < 0 || r >= N)
            return mx_fail(e, MX_EFORMAT, "%s:%d: expert %d: rank %.*s is not in 0..%d", file, line, x,
                           (int)(end - s), s, N - 1);
        row[x] = (int16_t)r;
        s = end;
    }
    while (isspace((unsigned char)*s))
        s++;
    if (*s && *s != '#')
        return mx_fail(e, MX_EFORMAT, "%s:%d: more than %d ranks (one rank per expert)", file, line, E);
    return MX_OK;
}

static int plan_from_file(const mx_model *m, mx_dist_plan *p, const char *file, mx_err *e)
{
    const int E = p->n_experts;
    char *text;
    int rc = mx_read_file(file, &text, NULL, e);
    if (rc)
        return mx_err_prefix(e, "--expert-map");
    int16_t *star = NULL;
    unsigned char *seen = calloc((size_t)p->n_layers, 1);
    if (!seen) {
        free(text);
        return mx_fail(e, MX_ENOMEM, "out of memory");
    }
    int line = 0;
    for (char *s = text, *next; s && *s && !rc; s = next) {
        line++;
        next = strchr(s, '\n');
        if (next)
            *next++ = 0;
        while (isspace((unsigned char)*s))
            s++;
        if (!*s || *s == '#')
            continue;
        char *colon = strchr(s, ':');
        if (!colon) {
            rc = mx_fail(e, MX_EFORMAT, "%s:%d: expected 'LAYER: RANK ...' or '*: RANK ...'", file, line);
            break;
        }
        *colon = 0;
        int16_t *row;
        if (!strcmp(s, "*") || !strcmp(s, "* ")) {
            if (star) {
                rc = mx_fail(e, MX_EFORMAT, "%s:%d: a second '*' line", file, line);
                break;
            }
            star = malloc(sizeof *star * (size_t)(E > 0 ? E : 1));
            if (!star) {
                rc = mx_fail(e, MX_ENOMEM, "out of memory");
                break;
            }
            row = star;
        } else {
            char *end;
            long l = strtol(s, &end, 10);
            while (isspace((unsigned char)*end))
                end++;
            if (end == s || *end || l < 0 || l >= p->n_layers || !m->layers[l].is_moe) {
                rc = mx_fail(e, MX_EFORMAT, "%s:%d: '%s' is not a MoE layer of this model (layers 0..%d)",
                             file, line, s, p->n_layers - 1);
                break;
            }
            if (seen[l]++) {
                rc = mx_fail(e, MX_EFORMAT, "%s:%d: layer %ld listed twice", file, line, l);
                break;
            }
            row = p->owner + (size_t)l * E;
        }
        rc = parse_row(file, line, colon + 1, E, p->n_ranks, row, e);
    }
    for (int l = 0; l < p->n_layers && !rc; l++) {
        if (!m->layers[l].is_moe || seen[l])
            continue;
        if (!star)
            rc = mx_fail(e, MX_EFORMAT, "%s: MoE layer %d has no line (and there is no '*' line)", file, l);
        else
            memcpy(p->owner + (size_t)l * E, star, sizeof *star * (size_t)E);
    }
    free(star);
    free(seen);
    free(text);
    return rc;
}

int mx_dist_plan_make(const mx_model *m, int n_ranks, const char *map_file, mx_dist_plan *p,
                      mx_err *e)
{
    memset(p, 0, sizeof *p);
    if (n_ranks < 1 || n_ranks > 4096)
        return mx_fail(e, MX_EINVAL, "%d ranks: expected 1..4096", n_ranks);
    p->n_ranks = n_ranks;
    p->n_layers = m->n_layers;
    p->n_experts = m->n_experts;
    const size_t cells = (size_t)m->n_layers * (size_t)(m->n_experts > 0 ? m->n_experts : 1);
    p->owner = malloc(sizeof *p->owner * cells);
    p->bytes = calloc((size_t)n_ranks, sizeof *p->bytes);
    if (!p->owner || !p->bytes) {
        mx_dist_plan_free(p);
        return mx_fail(e, MX_ENOMEM, "out of memory");
    }
    for (size_t i = 0; i < cells; i++)
        p->owner[i] = -1;
    uint64_t experts = 0;
    for (int l = 0; l < m->n_layers; l++)
        if (m->layers[l].is_moe)
            experts += (uint64_t)m->n_experts * m->layers[l].moe.expert_bytes;
    const uint64_t all = mx_model_weight_bytes(m);
    p->base_bytes = all > experts ? all - experts : 0;
    int rc = MX_OK;
    if (map_file) {
        snprintf(p->source, sizeof p->source, "expert map %s", map_file);
        rc = plan_from_file(m, p, map_file, e);
    } else {
        snprintf(p->source, sizeof p->source, "balanced by bytes");
        plan_balanced(m, p, (double)p->base_bytes, (double)experts);
    }
    if (rc) {
        mx_dist_plan_free(p);
        return rc;
    }
    p->bytes[0] = p->base_bytes;
    for (int l = 0; l < m->n_layers; l++)
        for (int x = 0; m->layers[l].is_moe && x < m->n_experts; x++)
            p->bytes[p->owner[(size_t)l * m->n_experts + x]] += m->layers[l].moe.expert_bytes;
    return MX_OK;
}

/* Rank r's experts of layer l as runs "a-b,c" into buf. */
static void runs_of(const mx_dist_plan *p, int l, int r, char *buf, size_t cap)
{
    const int16_t *o = p->owner + (size_t)l * p->n_experts;
    size_t n = 0;
    buf[0] = 0;
    for (int x = 0; x < p->n_experts && n < cap; x++) {
        if (o[x] != r || (x > 0 && o[x - 1] == r))
            continue;
        int y = x;
        while (y + 1 < p->n_experts && o[y + 1] == r)
            y++;
        n += (size_t)snprintf(buf + n, cap - n, y > x ? "%s%d-%d" : "%s%d", n ? "," : "", x, y);
    }
    if (!buf[0])
        snprintf(buf, cap, "none");
}

/* b as "12.3 MiB" or "4.56 GiB". */
static const char *size_str(uint64_t b, char *buf, size_t cap)
{
    if (b < (1ull << 30))
        snprintf(buf, cap, "%.1f MiB", (double)b / (1024.0 * 1024.0));
    else
        snprintf(buf, cap, "%.2f GiB", (double)b / (1024.0 * 1024.0 * 1024.0));
    return buf;
}

void mx_dist_plan_print(const mx_dist_plan *p, FILE *f)
{
    int moe = 0;
    for (int l = 0; l < p->n_layers; l++)
        moe += p->owner[(size_t)l * p->n_experts] >= 0 && p->n_experts > 0;
    fprintf(f, "expert parallelism over %d rank%s (%s), %d experts in each of %d MoE layers:\n",
            p->n_ranks, p->n_ranks == 1 ? "" : "s", p->source, p->n_experts, moe);
    char a[1024], b[1024], sz[32], sz2[32];
    for (int r = 0; r < p->n_ranks; r++) {
        fprintf(f, "  rank %d: %s of weights", r, size_str(p->bytes[r], sz, sizeof sz));
        if (r == 0)
            fprintf(f, " (%s besides routed experts: attention, embeddings, lm_head, "
                       "shared experts, dense MLPs)", size_str(p->base_bytes, sz2, sizeof sz2));
        fprintf(f, "\n");
        /* layers with the same runs, grouped */
        for (int l = 0; l < p->n_layers; l++) {
            if (p->n_experts <= 0 || p->owner[(size_t)l * p->n_experts] < 0)
                continue;
            runs_of(p, l, r, a, sizeof a);
            int first = 1, count = 0;
            for (int k = 0; k < l && first; k++)
                if (p->owner[(size_t)k * p->n_experts] >= 0) {
                    runs_of(p, k, r, b, sizeof b);
                    first = strcmp(a, b) != 0;
                }
            if (!first)
                continue;
            for (int k = l; k < p->n_layers; k++)
                if (p->owner[(size_t)k * p->n_experts] >= 0) {
                    runs_of(p, k, r, b, sizeof b);
                    count += !strcmp(a, b);
                }
            fprintf(f, "    %s%s in %d layer%s\n", strcmp(a, "none") ? "experts " : "no experts",
                    strcmp(a, "none") ? a : "", count, count == 1 ? "" : "s");
        }
    }
}
