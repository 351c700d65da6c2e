/* dist_driver.c - expert parallelism against one process, run by
 * test_dist.sh under mpirun (-np 2, -np 3).
 *
 * Rank 0 loads each fixture twice: through mx_model_load (spread over the
 * ranks: the distributed loader) and through mx_model_load_ex (everything
 * here).  Both run the reference prompt, greedy decoding through the KV
 * cache and a batched decode step of two sequences; every logit must be
 * the same bits, the prompt's last logits within 1e-3 of the reference
 * and the greedy ids the reference's (the margin rule of
 * test_model_fixtures).  With the fused path on and off.  The other ranks
 * serve rank 0 (mx_dist_worker).
 *
 * usage: dist_driver FIXTURES_DIR NAME... */
#include "test.h"
#include "fixture_cmp.h"

#include <stdint.h>

#include "dist/dist.h"
#include "model/model.h"
#include "moe/moe.h"

/* Whether a and b hold the same bits; names the first difference. */
static int same(const float *a, const float *b, size_t n, const char *what, const char *name, int fused)
{
    for (size_t i = 0; i < n; i++)
        if (memcmp(&a[i], &b[i], sizeof *a)) {
            fprintf(stderr, "%s fused=%d: %s differ at %zu: %.9g (ranks) vs %.9g (one process)\n", name,
                    fused, what, i, a[i], b[i]);
            return 0;
        }
    return 1;
}

static void run_fixture(const char *root, const char *name, int fused)
{
    char dir[1024], refpath[1100];
    snprintf(dir, sizeof dir, "%s/%s", root, name);
    snprintf(refpath, sizeof refpath, "%s/reference.safetensors", dir);
    mx_err e = {0};
    mx_model *md = NULL, *ml = NULL;
    mx_st_set *r = NULL;
    mx_seq *sd = NULL, *sl = NULL, *pair_d[2] = {0}, *pair_l[2] = {0};
    CHECK_OK(mx_model_load(dir, &md, &e), &e);
    CHECK_OK(mx_model_load_ex(dir, NULL, &ml, &e), &e);
    CHECK_OK(mx_st_open_file(refpath, &r, &e), &e);
    if (!md || !ml || !r)
        goto out;
    CHECKF(mx_dist_size() == 1 || md->remote, "%s: the model is not spread over the ranks", name);
    mx_moe_set_fused(fused);
    const mx_tensor *tp = ref(r, "prompt_ids"), *tg = ref(r, "greedy_ids"), *tm = ref(r, "greedy_margin"),
                    *tlast = ref(r, "prefill_last_logits");
    if (!tp || !tg || !tm || !tlast)
        goto out;
    const int T = (int)tp->shape[0], V = md->vocab, N = (int)tg->shape[0];
    const int32_t *prompt = tp->data, *greedy = tg->data;
    const float *margin = tm->data;
    float *all_d = malloc(sizeof(float) * (size_t)T * V), *all_l = malloc(sizeof(float) * (size_t)T * V);
    float *ld = malloc(sizeof(float) * 2 * (size_t)V), *ll = malloc(sizeof(float) * 2 * (size_t)V);
    CHECK_OK(mx_seq_new(md, T + N + 4, &sd, &e), &e);
    CHECK_OK(mx_seq_new(ml, T + N + 4, &sl, &e), &e);
    if (!sd || !sl)
        goto free_bufs;
    mx_forward_trace trd = {.all_logits = all_d}, trl = {.all_logits = all_l};
    CHECK_OK(mx_forward(md, sd, prompt, T, ld, &trd, &e), &e);
    CHECK_OK(mx_forward(ml, sl, prompt, T, ll, &trl, &e), &e);
    CHECK(same(all_d, all_l, (size_t)T * V, "prompt logits", name, fused));
    double dl = 0;
    for (int i = 0; i < V; i++)
        dl = fmax(dl, fabs((double)ld[i] - ((const float *)tlast->data)[i]));
    CHECKF(dl < 1e-3, "%s fused=%d: last prompt logits differ from the reference by %g", name, fused, dl);
    /* greedy decoding through the cache */
    int steps = 0;
    for (int i = 0; i < N; i++) {
        if (i > 0) {
            CHECK_OK(mx_forward(md, sd, &greedy[i - 1], 1, ld, NULL, &e), &e);
            CHECK_OK(mx_forward(ml, sl, &greedy[i - 1], 1, ll, NULL, &e), &e);
            steps++;
            if (!same(ld, ll, (size_t)V, "decode logits", name, fused)) {
                CHECK(0);
                break;
            }
        }
        const int32_t got = argmax(ld, V);
        if (got != greedy[i]) {
            CHECKF(margin[i] < 1e-3, "%s fused=%d: greedy step %d: got %d, reference %d (margin %g)", name,
                   fused, i, got, greedy[i], margin[i]);
            break;
        }
        t_pass++;
    }
    /* a batched decode step: two sequences at different positions */
    for (int k = 0; k < 2; k++) {
        CHECK_OK(mx_seq_new(md, T + 4, &pair_d[k], &e), &e);
        CHECK_OK(mx_seq_new(ml, T + 4, &pair_l[k], &e), &e);
    }
    if (pair_d[0] && pair_d[1] && pair_l[0] && pair_l[1] && T > 1) {
        CHECK_OK(mx_forward(md, pair_d[0], prompt, T, NULL, NULL, &e), &e);
        CHECK_OK(mx_forward(md, pair_d[1], prompt, T - 1, NULL, NULL, &e), &e);
        CHECK_OK(mx_forward(ml, pair_l[0], prompt, T, NULL, NULL, &e), &e);
        CHECK_OK(mx_forward(ml, pair_l[1], prompt, T - 1, NULL, NULL, &e), &e);
        const int32_t tok[2] = {greedy[0], prompt[T - 1]};
        CHECK_OK(mx_forward_batch(md, pair_d, tok, 2, ld, &e), &e);
        CHECK_OK(mx_forward_batch(ml, pair_l, tok, 2, ll, &e), &e);
        CHECK(same(ld, ll, 2 * (size_t)V, "batched decode logits", name, fused));
    }
    fprintf(stderr, "%s fused=%d ranks=%d: %d prompt tokens, %d decode steps, same bits; reference diff %.2g\n",
            name, fused, mx_dist_size(), T, steps, dl);
free_bufs:
    free(all_d), free(all_l), free(ld), free(ll);
out:
    mx_moe_set_fused(-1);
    for (int k = 0; k < 2; k++)
        mx_seq_free(pair_d[k]), mx_seq_free(pair_l[k]);
    mx_seq_free(sd);
    mx_seq_free(sl);
    mx_st_close(r);
    mx_model_free(md);
    mx_model_free(ml);
}

int main(int argc, char **argv)
{
    mx_err e = {0};
    if (mx_dist_init(&argc, &argv, &e)) {
        fprintf(stderr, "dist_driver: %s\n", e.msg);
        return 2;
    }
    if (mx_dist_rank() > 0)
        return mx_dist_worker();
    if (argc < 3) {
        fprintf(stderr, "usage: dist_driver FIXTURES_DIR NAME...\n");
        mx_dist_finalize(2);
        return 2;
    }
    mx_dist_stats_reset();
    for (int i = 2; i < argc; i++)
        for (int fused = 1; fused >= 0; fused--)
            run_fixture(argv[1], argv[i], fused);
    /* every rank took part */
    mx_dist_stats st[64];
    if (mx_dist_size() <= 64 && !mx_dist_stats_get(st, &e))
        for (int k = 1; k < mx_dist_size(); k++)
            CHECKF(st[k].jobs > 0 && st[k].expert_bytes > 0, "rank %d ran no experts", k);
    const int rc = test_summary();
    mx_dist_finalize(rc);
    return rc;
}
