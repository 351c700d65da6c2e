/* test_dist_plan.c - the expert ownership plan of expert parallelism
 * (src/dist/plan.c), on the fixtures, without MPI.
 *
 * The balanced plan: every routed expert of every MoE layer has exactly one
 * rank, each rank's experts are one contiguous run per layer in rank order,
 * the ranks' bytes add up to the checkpoint's, and no two ranks differ by
 * more than two experts' bytes (rank 0 counting everything besides
 * experts), unless rank 0's part besides experts alone exceeds the average,
 * when it gets no experts.  The expert map file: a valid map is taken as
 * written; malformed ones fail naming the file and line.  Loading a share:
 * a model bound with a slice holds data for its experts only. */
#include "test.h"

#include <stdint.h>

#include "dist/dist.h"
#include "model/model.h"

static const char *const fixtures[] = {
    "qwen2_moe_tiny_chat", "qwen2_moe_gqa_mixed", "qwen3_moe_tiny", "mixtral_tiny", "olmoe_tiny",
    "dots1_tiny", "phimoe_tiny", "qwen3_vl_moe_tiny", "minimax_tiny", "gemma4_tiny",
    "qwen3_next_tiny", "lfm2_moe_tiny",
};

static void check_balanced(const mx_model *m, const char *name, int N)
{
    mx_dist_plan p;
    mx_err e = {0};
    CHECK_OK(mx_dist_plan_make(m, N, NULL, &p, &e), &e);
    if (!p.owner)
        return;
    const int E = m->n_experts;
    uint64_t eb = 0, experts = 0, sum = 0;
    int ok_owner = 1, ok_runs = 1;
    for (int l = 0; l < m->n_layers; l++) {
        if (!m->layers[l].is_moe)
            continue;
        eb = m->layers[l].moe.expert_bytes > eb ? m->layers[l].moe.expert_bytes : eb;
        experts += (uint64_t)E * m->layers[l].moe.expert_bytes;
        for (int x = 0; x < E; x++) {
            const int o = p.owner[(size_t)l * E + x];
            ok_owner &= o >= 0 && o < N;
            ok_runs &= x == 0 || o >= p.owner[(size_t)l * E + x - 1];
        }
    }
    CHECKF(ok_owner, "%s N=%d: an expert without a rank", name, N);
    CHECKF(ok_runs, "%s N=%d: a rank's experts are not one run in rank order", name, N);
    for (int r = 0; r < N; r++)
        sum += p.bytes[r];
    CHECKF(sum == mx_model_weight_bytes(m), "%s N=%d: ranks hold %llu bytes, the checkpoint %llu", name, N,
           (unsigned long long)sum, (unsigned long long)mx_model_weight_bytes(m));
    const uint64_t base = p.base_bytes, level = (base + experts) / (uint64_t)N;
    int first = base > level ? 1 : 0;   /* rank 0 out of the comparison when it is over */
    uint64_t lo = UINT64_MAX, hi = 0;
    for (int r = first; r < N; r++) {
        lo = p.bytes[r] < lo ? p.bytes[r] : lo;
        hi = p.bytes[r] > hi ? p.bytes[r] : hi;
    }
    CHECKF(N == 1 || hi - lo <= 2 * eb, "%s N=%d: ranks hold %llu..%llu bytes, experts are %llu", name, N,
           (unsigned long long)lo, (unsigned long long)hi, (unsigned long long)eb);
    if (first)
        CHECKF(p.bytes[0] == base, "%s N=%d: rank 0 is over the average yet holds experts", name, N);
    mx_dist_plan_free(&p);
}

static void write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    if (f) {
        fputs(text, f);
        fclose(f);
    }
}

/* The map file, on a model with 16 experts in layers 0..2 (qwen3_moe_tiny). */
static void check_map(const mx_model *m, const char *tmp)
{
    char path[600];
    snprintf(path, sizeof path, "%s/map", tmp);
    mx_dist_plan p;
    mx_err e = {0};
    /* a valid map: layer 1 its own, the others by '*', comments anywhere */
    write_file(path, "# two ranks\n"
                     "*: 1 0 1 0 1 0 1 0 1 0 1 0 1 0 1 0\n"
                     "1: 0 0 0 0 0 0 0 0 1 1 1 1 1 1 1 1   # layer 1 split in halves\n");
    CHECK_OK(mx_dist_plan_make(m, 2, path, &p, &e), &e);
    if (p.owner) {
        CHECK(p.owner[0 * 16 + 0] == 1 && p.owner[0 * 16 + 1] == 0 && p.owner[2 * 16 + 15] == 0);
        CHECK(p.owner[1 * 16 + 7] == 0 && p.owner[1 * 16 + 8] == 1);
        CHECK(strstr(p.source, "expert map") != NULL);
        mx_dist_plan_free(&p);
    }
    static const char *const bad[][2] = {
        {"*: 0 1\n", "map:1: 2 ranks for 16 experts"},
        {"*: 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0\n", "map:1: more than 16 ranks"},
        {"*: 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 2\n", "map:1: expert 15: rank 2 is not in 0..1"},
        {"7: 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0\n", "map:1: '7' is not a MoE layer"},
        {"0: 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0\n", "map: MoE layer 1 has no line"},
        {"0: 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0\n0: 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1\n", "map:2: layer 0 listed twice"},
        {"zero 1 1\n", "map:1: expected 'LAYER: RANK ...'"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        write_file(path, bad[i][0]);
        CHECK_FAILS(mx_dist_plan_make(m, 2, path, &p, &e), &e);
        CHECKF(strstr(e.msg, bad[i][1]) != NULL, "map %zu: '%s' does not say '%s'", i, e.msg, bad[i][1]);
    }
    CHECK_FAILS(mx_dist_plan_make(m, 2, "/nonexistent/map", &p, &e), &e);
    CHECK(strstr(e.msg, "--expert-map") && strstr(e.msg, "/nonexistent/map"));
}

/* A slice: rank 1 of 2 binds its experts alone, mapping nothing else. */
static int slice_rank1(void *ctx, const mx_model *m, unsigned char *owned, mx_err *e)
{
    const mx_dist_plan *p = ctx;
    for (size_t i = 0; i < (size_t)m->n_layers * (size_t)m->n_experts; i++)
        owned[i] = p->owner[i] == 1;
    return MX_OK;
}

static void check_share(const char *dir, const mx_model *full)
{
    mx_dist_plan p;
    mx_err e = {0};
    CHECK_OK(mx_dist_plan_make(full, 2, NULL, &p, &e), &e);
    mx_model_load_opts o = {.slice = slice_rank1, .ctx = &p, .experts_only = 1, .lazy = 1};
    mx_model *m = NULL;
    CHECK_OK(mx_model_load_ex(dir, &o, &m, &e), &e);
    if (m && p.owner) {
        int ok = 1;
        for (int l = 0; l < m->n_layers; l++)
            for (int x = 0; m->layers[l].is_moe && x < m->n_experts; x++) {
                const int mine = p.owner[(size_t)l * m->n_experts + x] == 1;
                const mx_linear *g = &m->layers[l].moe.experts.gate[x];
                /* the shape always (the dispatch reads it); data only for its own */
                ok &= g->rows == full->layers[l].moe.experts.gate[x].rows;
                ok &= mine ? g->q.w == NULL ? 0 : !memcmp(g->q.w, full->layers[l].moe.experts.gate[x].q.w, 64)
                           : g->q.w == NULL;
                ok &= m->layers[l].moe.bound && m->layers[l].moe.bound[x] == mine;
            }
        CHECKF(ok, "%s: the share's experts", dir);
        CHECK(m->experts_only && m->embed.rows == 0 && m->layers[0].attn.q.rows == 0);
    }
    mx_model_free(m);
    mx_dist_plan_free(&p);
}

int main(void)
{
    const char *root = test_fixtures();
    if (!root)
        return TEST_SKIP;
    char dir[1024];
    for (size_t i = 0; i < sizeof fixtures / sizeof fixtures[0]; i++) {
        snprintf(dir, sizeof dir, "%s/%s", root, fixtures[i]);
        mx_err e = {0};
        mx_model *m = NULL;
        CHECK_OK(mx_model_load(dir, &m, &e), &e);
        if (!m)
            continue;
        for (int N = 1; N <= 5; N++)
            check_balanced(m, fixtures[i], N);
        if (!strcmp(fixtures[i], "qwen3_moe_tiny")) {
            char tmp[] = "/tmp/mlxcel-plan-XXXXXX";
            if (mkdtemp(tmp)) {
                check_map(m, tmp);
                char path[600];
                snprintf(path, sizeof path, "%s/map", tmp);
                remove(path);
                remove(tmp);
            }
        }
        if (!strcmp(fixtures[i], "qwen3_moe_tiny") || !strcmp(fixtures[i], "qwen2_moe_tiny_chat"))
            check_share(dir, m);   /* stacked experts; per-expert tensors */
        mx_model_free(m);
    }
    return test_summary();
}
